//! `shoal bench ckpt`: the cost of a replicated checkpoint.
//!
//! Four in-process nodes on loopback (QUIC, mTLS, fsync). A checkpoint
//! directory of `--size` bytes (incompressible, like trained weights, in
//! 256 MiB files) is written once; then, as the agent would after `.done`:
//! chunk it into the source node's store, push it to three peers (write
//! quorum two), and restore it on a fourth node from the replicas. The
//! baseline is the floor of keeping three copies on one disk: three plain
//! file copies with fsync. It is timed twice, just before the checkpoint
//! is chunked and just after it is restored, and the ratio is taken
//! against the mean: a virtual disk's write speed drifts by a factor of
//! three or more within minutes (its host's cache), and one baseline
//! taken at another moment than the write it is compared with measures
//! that drift, not Shoal.

use super::data::{timed_copies_with_fsync, write_files, DataSet};
use crate::agent::testkit::LocalCluster;
use serde::Serialize;
use shoal_storage::manifest::{build_manifest, restore_manifest};
use shoal_storage::replicate::restore_from_replicas_parallel;
use std::time::{Duration, Instant};

#[derive(Serialize, Debug)]
pub struct CkptReport {
    pub bytes: u64,
    /// What the job waits for: nothing beyond its own write (replication is
    /// asynchronous), reported as 0 with the local chunking time beside it.
    pub job_stall_s: f64,
    pub chunk_local_s: f64,
    pub replicate_3_s: f64,
    pub quorum_commit_s: f64,
    pub restore_s: f64,
    pub source_bytes_sent: u64,
    /// The mean of the two baseline runs.
    pub baseline_3_cp_s: f64,
    /// The baseline before the checkpoint and after its restore.
    pub baseline_runs_s: [f64; 2],
    pub ratio_replicate_vs_3_cp: f64,
}

pub async fn run(bytes: u64) -> anyhow::Result<CkptReport> {
    if bytes == 0 {
        anyhow::bail!("--size must be positive");
    }
    let cluster = LocalCluster::start(4, |_, cfg| {
        cfg.executor.enabled = false;
    })
    .await?;
    cluster
        .wait_all_alive(Duration::from_secs(30))
        .await
        .map_err(anyhow::Error::msg)?;
    let data = cluster.root().join("ckpt-data");
    write_files(
        &data,
        bytes,
        &DataSet {
            prefix: "shard",
            seed: 0x9E37_79B9_7F4A_7C15,
            compressible: false,
        },
    )?;
    std::fs::write(data.join(".done"), b"")?;

    let baseline_before = timed_copies_with_fsync(&data, &cluster.root().join("baseline"), 3)?;

    let source = cluster.agents[0].node().chunks().clone();
    let restorer = cluster.agents[3].node().chunks().clone();
    let targets: Vec<u64> = cluster.agents[1..3]
        .iter()
        .map(|a| a.id())
        .chain([cluster.agents[3].id()])
        .collect();
    let handle = tokio::runtime::Handle::current();
    let root = cluster.root().to_path_buf();
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<CkptReport> {
        let started = Instant::now();
        let (manifest, _) = build_manifest(&data, source.store())?;
        let chunk_local = started.elapsed().as_secs_f64();
        let transport = source.transport(handle.clone());
        // As the agent does: a chain through the three peers, quorum of two.
        let started = Instant::now();
        let pushed = crate::ckpt::push_chained(&manifest, source.store(), &targets, &transport, 2);
        let replicate_3 = started.elapsed().as_secs_f64();
        if !pushed.failed.is_empty() {
            anyhow::bail!("replication failed: {:?}", pushed.failed);
        }
        let quorum_s = pushed
            .quorum_after
            .map(|d| d.as_secs_f64())
            .unwrap_or(replicate_3);
        let sent = pushed.bytes_sent;
        // Restore on a node that holds nothing yet: wipe its copy first.
        let fresh = shoal_storage::ChunkStore::open(
            root.join("restore-store"),
            shoal_storage::StoreConfig::default(),
        )?;
        let restore_transport = restorer.transport(handle);
        let started = Instant::now();
        restore_from_replicas_parallel(
            &manifest,
            &targets,
            &restore_transport,
            &fresh,
            crate::ckpt::FETCH_THREADS,
        )?;
        restore_manifest(&manifest, &fresh, root.join("restored"))?;
        let restore_s = started.elapsed().as_secs_f64();
        let baseline_after = timed_copies_with_fsync(&data, &root.join("baseline"), 3)?;
        let baseline = (baseline_before + baseline_after) / 2.0;
        Ok(CkptReport {
            bytes: manifest.total_bytes,
            job_stall_s: 0.0,
            chunk_local_s: chunk_local,
            replicate_3_s: replicate_3,
            quorum_commit_s: quorum_s,
            restore_s,
            source_bytes_sent: sent,
            baseline_3_cp_s: baseline,
            baseline_runs_s: [baseline_before, baseline_after],
            ratio_replicate_vs_3_cp: (chunk_local + replicate_3) / baseline.max(1e-9),
        })
    })
    .await??;
    cluster.shutdown().await;
    Ok(report)
}

pub fn print(r: &CkptReport) {
    let gib = r.bytes as f64 / (1u64 << 30) as f64;
    let rate = |s: f64| {
        if s > 0.0 {
            r.bytes as f64 / s / 1e6
        } else {
            0.0
        }
    };
    println!("checkpoint of {gib:.2} GiB, 4 nodes on loopback (QUIC + mTLS, fsync)");
    println!(
        "  job-visible stall          {:>8.2} s (replication is asynchronous)",
        r.job_stall_s
    );
    println!(
        "  chunk into local store     {:>8.2} s ({:.0} MB/s)",
        r.chunk_local_s,
        rate(r.chunk_local_s)
    );
    println!(
        "  quorum (2 peers) durable   {:>8.2} s after chunking",
        r.quorum_commit_s
    );
    println!(
        "  3 peers durable            {:>8.2} s after chunking",
        r.replicate_3_s
    );
    println!(
        "  restore on another node    {:>8.2} s ({:.0} MB/s)",
        r.restore_s,
        rate(r.restore_s)
    );
    println!(
        "  bytes sent by the source   {:>8.2} GiB",
        r.source_bytes_sent as f64 / (1u64 << 30) as f64
    );
    println!(
        "  baseline: 3 × cp + fsync   {:>8.2} s (mean of {:.2} s before, {:.2} s after)",
        r.baseline_3_cp_s, r.baseline_runs_s[0], r.baseline_runs_s[1]
    );
    println!(
        "  (chunk + 3 replicas) / (3 × cp) = {:.2}",
        r.ratio_replicate_vs_3_cp
    );
}
