//! Checkpoint durability on spawned agents: a lost holder is replaced, and a
//! corrupted replica is detected by the scrubber and repaired from a good
//! copy; restores never return corrupt data.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{shoal_bin, start_cluster, wait_for};
use shoal_sdk::{Client, JobSubmitRequest};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Chunk files of a node's store, relative to `<data>/chunks/objects`.
fn chunk_files(data_dir: &Path) -> Vec<PathBuf> {
    let objects = data_dir.join("chunks/objects");
    let mut out = Vec::new();
    for shard in std::fs::read_dir(&objects).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(shard.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(rel) = file.path().strip_prefix(&objects) {
                out.push(rel.to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_holders_are_replaced_and_corrupt_replicas_repaired() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (mut nodes, token) = start_cluster(root.path(), &["n1", "n2", "n3", "n4", "n5"], |_| {
        vec![("SHOAL_STORAGE__SCRUB_INTERVAL_S".into(), "2".into())]
    })
    .await;
    let client: Client = nodes[0].client(&token);

    // 3 MB of incompressible data in step 1, then the job idles.
    let script = "D=\"$SHOAL_CKPT_DIR/1\"; mkdir -p \"$D\" && \
                  head -c 3000000 /dev/urandom > \"$D/weights.bin\" && touch \"$D/.done\"; \
                  while true; do sleep 0.1; done";
    let req = JobSubmitRequest {
        name: "ckpt".into(),
        ..JobSubmitRequest::shell(1, 1, script)
    };
    let id = client.submit_job(&req).await.expect("submit").id;
    // The part is recorded once a write quorum holds it; a chain hop that
    // failed is topped up by the durability loop, so wait for all four.
    let committed = wait_for(
        "a committed checkpoint held by the source and three peers",
        TIMEOUT,
        || {
            let c = client.clone();
            async move {
                let list = c.checkpoints(id).await.ok()?;
                list.into_iter()
                    .find(|c| c.committed_at.is_some() && c.parts[0].holders.len() == 4)
            }
        },
    )
    .await;
    let holders = committed.parts[0].holders.clone();
    let source = holders[0];
    let names: BTreeMap<u64, String> = client
        .nodes()
        .await
        .expect("nodes")
        .into_iter()
        .map(|n| (n.id, n.name))
        .collect();
    let index_of = |id: u64| -> usize { names[&id][1..].parse::<usize>().expect("index") - 1 };

    // Kill a holder that is neither the source nor n1 (which answers the API).
    let victim = *holders
        .iter()
        .find(|h| **h != source && index_of(**h) != 0)
        .expect("a peer holder");
    nodes[index_of(victim)].kill9();
    let healed = wait_for("four live holders again", TIMEOUT, || {
        let c = client.clone();
        async move {
            let list = c.checkpoints(id).await.ok()?;
            let part = list
                .into_iter()
                .find(|c| c.step == 1)?
                .parts
                .into_iter()
                .next()?;
            // The dead node stays listed (it is down, not removed: it would
            // come back with its copy) beside four live holders.
            let live: Vec<u64> = part
                .holders
                .iter()
                .copied()
                .filter(|h| *h != victim)
                .collect();
            (live.len() == 4 && part.holders.contains(&victim)).then_some(live)
        }
    })
    .await;
    eprintln!("holders {holders:?} -> {healed:?} after node {victim} died");

    // Corrupt one chunk on a live peer holder; the scrubber must notice and
    // restore a good copy from another holder.
    let peer = *healed
        .iter()
        .find(|h| **h != source && index_of(**h) != 0 && **h != victim)
        .expect("a live peer holder");
    let peer_dir = nodes[index_of(peer)].data_dir.clone();
    let source_dir = nodes[index_of(source)].data_dir.clone();
    let rel = chunk_files(&peer_dir)
        .into_iter()
        .find(|rel| {
            std::fs::metadata(source_dir.join("chunks/objects").join(rel))
                .is_ok_and(|m| m.len() > 100_000)
        })
        .expect("a large chunk on both nodes");
    let good = std::fs::read(source_dir.join("chunks/objects").join(&rel)).expect("good copy");
    let bad_path = peer_dir.join("chunks/objects").join(&rel);
    let mut bad = good.clone();
    let middle = bad.len() / 2;
    bad[middle] ^= 0xff;
    std::fs::write(&bad_path, &bad).expect("corrupt");

    // A restore never returns the corrupt bytes.
    let to = root.path().join("restored");
    let out = Command::new(shoal_bin())
        .args(["ckpt", "restore", &id.to_string(), "--to"])
        .arg(&to)
        .env("SHOAL_API", nodes[0].api_url())
        .env("SHOAL_TOKEN", &token)
        .output()
        .expect("ckpt restore");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let source_node = &nodes[index_of(source)];
    let original = std::fs::read(
        root.path()
            .join(format!("{}-jobs", source_node.name))
            .join(format!("{id}/ckpt/1/weights.bin")),
    )
    .expect("original");
    assert_eq!(
        std::fs::read(to.join("weights.bin")).expect("restored"),
        original
    );

    wait_for(
        "the scrubber to repair the corrupt replica",
        TIMEOUT,
        || {
            let path = bad_path.clone();
            let good = good.clone();
            async move { (std::fs::read(&path).ok()? == good).then_some(()) }
        },
    )
    .await;
    client.cancel_job(id).await.expect("cancel");
}
