//! `shoal bench recovery`: the time from `kill -9` of a gang node to the gang
//! running again from its checkpoint, broken into its parts.
//!
//! Four in-process nodes on loopback with the executor on. A two-node gang
//! writes a checkpoint of `--ckpt-size` bytes (split over its ranks,
//! incompressible), which is replicated and committed; then one gang node is
//! stopped abruptly (its rank dies with it). The phases come from the ledger
//! and the new ranks' logs:
//!
//! - detection: kill → the member committed `down` (failure detector);
//! - fencing wait: down → the lost epoch's GPUs may be reused
//!   (`REPLACE_AFTER_NODE_LOSS_MS`, so a partitioned rank has stopped);
//! - re-placement: → the new allocation is committed (scheduler pass);
//! - restore: → every new rank launched (checkpoint fetched from the
//!   replicas, verified, written);
//! - restart: → every rank printed that it resumed (process start to the
//!   job's own first line).

use crate::agent::testkit::LocalCluster;
use serde::Serialize;
use shoal_sdk::{JobSubmitRequest, MemberState};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const POLL: Duration = Duration::from_millis(20);
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Serialize, Debug, Clone)]
pub struct RecoveryRun {
    pub detection_s: f64,
    pub fencing_wait_s: f64,
    pub replacement_s: f64,
    pub restore_s: f64,
    pub restart_s: f64,
    pub total_s: f64,
}

#[derive(Serialize, Debug)]
pub struct RecoveryReport {
    pub ckpt_bytes: u64,
    pub runs: Vec<RecoveryRun>,
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The job script: write one checkpoint of `bytes_per_rank`, mark it done,
/// then idle; a resumed run says so first.
fn script(bytes_per_rank: u64) -> String {
    format!(
        "if [ -n \"$SHOAL_RESTORE_STEP\" ]; then echo \"resumed from step $SHOAL_RESTORE_STEP\"; \
         exec sleep 3600; fi; \
         mkdir -p \"$SHOAL_CKPT_DIR/1\" && \
         head -c {bytes_per_rank} /dev/urandom > \"$SHOAL_CKPT_DIR/1/state-$RANK\" && \
         touch \"$SHOAL_CKPT_DIR/1/.done\"; exec sleep 3600"
    )
}

async fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            anyhow::bail!("timed out after {PHASE_TIMEOUT:?} waiting for {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Wall time (ms) when every rank's log of `epoch` first contains `needle`.
async fn all_logs_contain(
    cluster: &LocalCluster,
    job: u64,
    nodes: &[String],
    needle: impl Fn(usize) -> String,
    what: &str,
) -> anyhow::Result<u64> {
    let mut seen: Vec<Option<u64>> = vec![None; nodes.len()];
    until(what, || {
        for (rank, node) in nodes.iter().enumerate() {
            if seen[rank].is_some() {
                continue;
            }
            let path = crate::executor::log_path(
                &cluster.root().join(format!("{node}-jobs")),
                job,
                rank as u32,
            );
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if text.contains(&needle(rank)) {
                seen[rank] = Some(wall_ms());
            }
        }
        seen.iter()
            .copied()
            .collect::<Option<Vec<u64>>>()
            .and_then(|times| times.into_iter().max())
    })
    .await
}

async fn one_run(bytes: u64) -> anyhow::Result<RecoveryRun> {
    let cluster = LocalCluster::start(4, |_, cfg| {
        cfg.executor.stop_grace_s = 5;
    })
    .await?;
    let outcome = measure(&cluster, bytes).await;
    cluster.shutdown().await;
    outcome
}

async fn measure(cluster: &LocalCluster, bytes: u64) -> anyhow::Result<RecoveryRun> {
    cluster
        .wait_all_alive(Duration::from_secs(60))
        .await
        .map_err(anyhow::Error::msg)?;
    let client = cluster.client(0);
    let mut req = JobSubmitRequest::shell(2, 1, &script(bytes / 2));
    req.max_restarts = Some(3);
    req.time_limit_s = 3600;
    let id = client
        .submit_job(&req)
        .await
        .map_err(|e| anyhow::anyhow!("submit: {e}"))?
        .id;
    let observer = cluster.agents[0].node().ledger().clone();
    let ledger = |f: &dyn Fn(&shoal_consensus::Ledger) -> bool| {
        observer.read().map(|d| f(&d.ledger)).unwrap_or(false)
    };
    until("the checkpoint to be committed", || {
        ledger(&|l| l.workload.latest_checkpoint(id).is_some()).then_some(())
    })
    .await?;
    let (epoch, nodes) = {
        let d = observer.read().map_err(|e| anyhow::anyhow!(e.message))?;
        let alloc = d
            .ledger
            .workload
            .jobs
            .get(&id)
            .and_then(|j| j.alloc.clone())
            .ok_or_else(|| anyhow::anyhow!("job {id} holds no allocation"))?;
        (alloc.epoch, alloc.nodes)
    };
    // Stop a gang node other than the observer.
    let victim = nodes
        .iter()
        .map(|(n, _)| *n)
        .find(|n| *n != observer.me())
        .ok_or_else(|| anyhow::anyhow!("no gang node besides the observer"))?;
    let index = cluster
        .agents
        .iter()
        .position(|a| a.id() == victim)
        .ok_or_else(|| anyhow::anyhow!("node {victim} is not in the cluster"))?;
    let killed_ms = wall_ms();
    cluster.agents[index].shutdown().await;

    let down_ms = until("the node to be declared down", || {
        let d = observer.read().ok()?;
        let m = d.ledger.members.get(&victim)?;
        (m.state == MemberState::Down).then_some(m.state_since_ms)
    })
    .await?;
    let (new_epoch, placed_ms, not_before_ms, names) = until("the gang to be placed again", || {
        let d = observer.read().ok()?;
        let job = d.ledger.workload.jobs.get(&id)?;
        let alloc = job.alloc.as_ref().filter(|a| a.epoch > epoch)?;
        let names: Vec<String> = alloc
            .nodes
            .iter()
            .map(|(n, _)| d.ledger.members.get(n).map(|m| m.spec.name.clone()))
            .collect::<Option<_>>()?;
        Some((alloc.epoch, alloc.started_at_ms, down_ms, names))
    })
    .await?;
    let fenced_until_ms = not_before_ms + shoal_consensus::workload::REPLACE_AFTER_NODE_LOSS_MS;
    let launched_ms = all_logs_contain(
        cluster,
        id,
        &names,
        |rank| format!("--- shoal: job {id} epoch {new_epoch} rank {rank} starting"),
        "every new rank to start",
    )
    .await?;
    let resumed_ms = all_logs_contain(
        cluster,
        id,
        &names,
        |_| "resumed from step 1".to_string(),
        "every rank to resume",
    )
    .await?;
    let _ = client.cancel_job(id).await;
    let s = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1000.0;
    Ok(RecoveryRun {
        detection_s: s(killed_ms, down_ms),
        fencing_wait_s: s(down_ms, fenced_until_ms.min(placed_ms)),
        replacement_s: s(fenced_until_ms.min(placed_ms), placed_ms),
        restore_s: s(placed_ms, launched_ms),
        restart_s: s(launched_ms, resumed_ms),
        total_s: s(killed_ms, resumed_ms),
    })
}

pub async fn run(bytes: u64, runs: usize) -> anyhow::Result<RecoveryReport> {
    let mut report = RecoveryReport {
        ckpt_bytes: bytes,
        runs: Vec::new(),
    };
    for _ in 0..runs.max(1) {
        report.runs.push(one_run(bytes).await?);
    }
    Ok(report)
}

pub fn print(r: &RecoveryReport) {
    println!(
        "kill -9 of a gang node → running again, checkpoint {:.2} GiB, 4 nodes on loopback",
        r.ckpt_bytes as f64 / (1u64 << 30) as f64
    );
    println!(
        "{:>4} {:>10} {:>10} {:>13} {:>9} {:>9} {:>9}",
        "run", "detection", "fencing", "re-placement", "restore", "restart", "total"
    );
    for (i, run) in r.runs.iter().enumerate() {
        println!(
            "{:>4} {:>9.2}s {:>9.2}s {:>12.2}s {:>8.2}s {:>8.2}s {:>8.2}s",
            i + 1,
            run.detection_s,
            run.fencing_wait_s,
            run.replacement_s,
            run.restore_s,
            run.restart_s,
            run.total_s
        );
    }
}
