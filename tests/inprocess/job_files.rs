//! A node's job files stay bounded: a chatty rank's log is rotated by size
//! while a reader keeps following it, and a finished job's files go after
//! the retention period.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use shoal_node::agent::testkit::LocalCluster;
use shoal_sdk::JobSubmitRequest;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chatty_rank_log_is_rotated_and_a_finished_jobs_files_go() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(1, |_, cfg| {
        cfg.executor.log_max_bytes = 4096;
        cfg.executor.job_retention_s = 2;
    })
    .await
    .expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let admin = c.client(0);
    // 100-byte lines, numbered, until told to stop (a file appears).
    let stop = c.root().join("stop");
    let script = format!(
        "i=0; while [ ! -e {} ]; do i=$((i+1)); \
         printf 'line %06d %090d\\n' $i 0; sleep 0.005; done; echo last-line",
        stop.display()
    );
    let id = admin
        .submit_job(&JobSubmitRequest::shell(1, 1, &script))
        .await
        .expect("submit")
        .id;
    let jobs_dir = c.root().join("n1-jobs");
    let log = jobs_dir.join(id.to_string()).join("rank-0.log");
    // Follow it as `shoal logs -f` does while it is rotated under us.
    let mut at = 0u64;
    let mut rotations_seen = 0;
    let mut last_line = 0u64;
    let started = std::time::Instant::now();
    while rotations_seen < 3 {
        assert!(started.elapsed() < TIMEOUT, "the log was never rotated");
        let Ok(chunk) = admin.job_log_chunk(id, 0, at).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if chunk.rotations > rotations_seen {
            rotations_seen = chunk.rotations;
        }
        at = chunk.start + chunk.bytes.len() as u64;
        for line in String::from_utf8_lossy(&chunk.bytes).lines() {
            if let Some(n) = line.strip_prefix("line ").and_then(|l| l.get(..6)) {
                let n: u64 = n.parse().expect("a line number");
                assert!(
                    n > last_line || chunk.start == 0,
                    "line {n} after {last_line}"
                );
                last_line = n;
            }
        }
        let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        // One tick of output at most beyond the bound.
        assert!(
            size < 4096 + 200_000,
            "the log grew to {size} bytes unrotated"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        log.with_extension("log.1").exists(),
        "no previous part kept"
    );
    // Stop the job, let it finish.
    std::fs::write(&stop, b"").expect("stop file");
    common::wait_for("the job to complete", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let job = admin.job(id).await.ok()?;
            (job.state == "completed").then_some(())
        }
    })
    .await;
    // Two seconds after it ended its files are gone, and so is its log.
    let dir = jobs_dir.join(id.to_string());
    common::wait_for("the finished job's files removed", TIMEOUT, || {
        let gone = !dir.exists();
        async move { gone.then_some(()) }
    })
    .await;
    assert!(admin.job_log(id, 0, 0).await.is_err());
    c.shutdown().await;
}
