//! A node whose disk fills up: its ledger stops on the failed write, the
//! agent exits non-zero (so that systemd's `Restart=on-failure` starts it
//! again), the other two keep committing, and once the disk has room the
//! restarted node catches up from what it had written. Root only: the
//! node's disk is a small tmpfs of its own.

// The serial guard is held across awaits on purpose (see `one_at_a_time`).
#![allow(clippy::await_holding_lock)]

use crate::common::{self, form_cluster, wait_converged, wait_for, NodeProc};
use shoal_node::cli::bench::chaos::disks::Disks;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_exits_and_catches_up_once_it_has_room() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    // The chaos runs' per-node disks: a small tmpfs, filled by a ballast.
    let disks = Disks::mount(root.path(), 1).unwrap_or_else(|e| panic!("{e}"));
    let disk = disks.of(0).expect("one disk").to_path_buf();
    let mut nodes: Vec<NodeProc> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| NodeProc::new(root.path(), n, &[]))
        .collect();
    nodes[2].data_dir = disk.join("n3");
    let token = form_cluster(&mut nodes);
    wait_converged(&nodes, &token).await;
    let client = nodes[0].client(&token);

    disks
        .fill(0)
        .unwrap_or_else(|e| panic!("cannot fill the disk: {e}"));
    // Writes keep committing on the two nodes with room; n3's next log
    // append fails, and its agent exits.
    let value = "x".repeat(2048);
    let mut written = 0u32;
    let status = wait_for("n3's agent to exit once its disk is full", TIMEOUT, || {
        let exited = nodes[2].exited();
        let client = client.clone();
        let value = value.clone();
        written += 1;
        let key = format!("full/{written:04}");
        async move {
            // A write may fail while the leader changes; the others
            // commit without n3.
            let _ = client.put_attr(&key, &value).await;
            exited
        }
    })
    .await;
    assert!(
        !status.success(),
        "an agent whose ledger stopped must exit non-zero: {status:?}"
    );
    for i in 0..20 {
        let key = format!("after/{i:02}");
        wait_for("the other two to commit without n3", TIMEOUT, || {
            let client = client.clone();
            let key = key.clone();
            async move { client.put_attr(&key, "while n3 is down").await.ok() }
        })
        .await;
    }

    // Room again: started as its supervisor would, n3 comes back from its
    // own data dir and catches up.
    disks.free(0);
    nodes[2].restart();
    wait_converged(&nodes, &token).await;
    let n3 = nodes[2].client(&token);
    wait_for("n3 to write through the ledger again", TIMEOUT, || {
        let n3 = n3.clone();
        async move { n3.put_attr("back/n3", "yes").await.ok() }
    })
    .await;
    for n in nodes.iter_mut() {
        n.kill9();
    }
}
