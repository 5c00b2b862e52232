//! `shoal bench submit`: what a user waits for. Four in-process nodes with
//! four simulated GPUs each, on loopback (QUIC, TLS, fsync), executors on.
//!
//! 1. Gang start: `--gangs` gangs of 2 nodes × 4 GPUs, submitted one at a
//!    time through the leader's HTTP API. Each gang's ranks write their own
//!    start time (wall clock, ns) to a file, so the phases are:
//!    - acknowledged: the submit's HTTP answer (the job is committed);
//!    - placed: the leader's ledger shows it running (a plan committed);
//!    - known everywhere: every node's ledger shows it running (its two
//!      nodes' executors can launch it);
//!    - started: the later of its two rank processes has started.
//!
//!    The gang is cancelled, and its GPUs are free again, before the next.
//! 2. Throughput: `--jobs` one-GPU jobs running `true`, submitted by 16
//!    concurrent clients; from the first submission until the leader's
//!    ledger shows every one completed (16 GPUs: the jobs come in waves).

use super::percentile;
use crate::agent::testkit::LocalCluster;
use serde::Serialize;
use shoal_consensus::workload::JobState;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

const NODES: usize = 4;
const CLIENTS: usize = 16;
const WAIT: Duration = Duration::from_secs(60);

#[derive(Serialize, Debug)]
pub struct Phase {
    pub phase: String,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub max_ms: f64,
}

#[derive(Serialize, Debug)]
pub struct SubmitReport {
    pub nodes: usize,
    pub gangs: usize,
    /// Each phase from the submit's start.
    pub gang_phases: Vec<Phase>,
    pub jobs: usize,
    pub jobs_seconds: f64,
    pub jobs_per_s: f64,
}

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

fn phase(name: &str, mut ms: Vec<f64>) -> Phase {
    ms.sort_by(f64::total_cmp);
    Phase {
        phase: name.into(),
        p50_ms: percentile(&ms, 0.5),
        p90_ms: percentile(&ms, 0.9),
        max_ms: ms.last().copied().unwrap_or(0.0),
    }
}

/// Polls `check` every millisecond until it answers, for at most [`WAIT`].
async fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            anyhow::bail!("{what}: not within {} s", WAIT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The start times the ranks of `job` wrote into `dir`, once all `ranks` have.
fn rank_starts(dir: &Path, job: u64, ranks: u32) -> Option<Vec<u128>> {
    (0..ranks)
        .map(|r| {
            let text = std::fs::read_to_string(dir.join(format!("start-{job}-{r}"))).ok()?;
            text.trim().parse().ok()
        })
        .collect()
}

pub async fn run(gangs: usize, jobs: usize) -> anyhow::Result<SubmitReport> {
    if gangs == 0 && jobs == 0 {
        anyhow::bail!("nothing to measure: --gangs and --jobs are both 0");
    }
    let cluster = LocalCluster::start(NODES, |_, _| {}).await?;
    cluster
        .wait_all_alive(Duration::from_secs(60))
        .await
        .map_err(anyhow::Error::msg)?;
    let leader = cluster
        .agreed_leader()
        .and_then(|l| cluster.agents.iter().position(|a| a.id() == l.id()))
        .ok_or_else(|| anyhow::anyhow!("no leader"))?;
    let ledger = cluster.agents[leader].ledger();
    let client = Arc::new(cluster.client(leader));
    let marks = tempfile::tempdir()?;

    let ledgers: Vec<_> = cluster.agents.iter().map(|a| a.ledger()).collect();
    let (mut acked, mut placed, mut everywhere, mut started) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..gangs {
        let script = format!(
            "date +%s%N > {}/start-$SHOAL_JOB_ID-$RANK; exec sleep 600",
            marks.path().display()
        );
        let request = shoal_sdk::JobSubmitRequest::shell(2, 4, &script);
        let t0 = Instant::now();
        let wall0 = wall_ns();
        let job = client
            .submit_job(&request)
            .await
            .map_err(|e| anyhow::anyhow!("submit: {e}"))?
            .id;
        acked.push(t0.elapsed().as_secs_f64() * 1e3);
        poll("the gang placed", || {
            let d = ledger.read().ok()?;
            (d.ledger.workload.jobs.get(&job)?.state == JobState::Running).then_some(())
        })
        .await?;
        placed.push(t0.elapsed().as_secs_f64() * 1e3);
        poll("the gang placed in every node's ledger", || {
            ledgers
                .iter()
                .all(|l| {
                    l.read().is_ok_and(|d| {
                        d.ledger
                            .workload
                            .jobs
                            .get(&job)
                            .is_some_and(|j| j.state == JobState::Running)
                    })
                })
                .then_some(())
        })
        .await?;
        everywhere.push(t0.elapsed().as_secs_f64() * 1e3);
        let starts = poll("both ranks started", || rank_starts(marks.path(), job, 2)).await?;
        let last = starts.into_iter().max().unwrap_or(wall0);
        started.push(last.saturating_sub(wall0) as f64 / 1e6);
        client
            .cancel_job(job)
            .await
            .map_err(|e| anyhow::anyhow!("cancel: {e}"))?;
        poll("the gang's GPUs free again", || {
            let d = ledger.read().ok()?;
            let j = d.ledger.workload.jobs.get(&job)?;
            (j.state.is_final() && j.alloc.is_none()).then_some(())
        })
        .await?;
    }

    let (jobs_seconds, jobs_per_s) = if jobs > 0 {
        let request = shoal_sdk::JobSubmitRequest {
            command: vec!["true".into()],
            ..shoal_sdk::JobSubmitRequest::shell(1, 1, "")
        };
        let before = ledger
            .read()
            .map(|d| d.ledger.workload.jobs.len())
            .unwrap_or(0);
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let (client, request) = (client.clone(), request.clone());
            let count = jobs / CLIENTS + usize::from(c < jobs % CLIENTS);
            tasks.push(tokio::spawn(async move {
                for _ in 0..count {
                    client.submit_job(&request).await?;
                }
                Ok::<_, shoal_sdk::ClientError>(())
            }));
        }
        for task in tasks {
            task.await?.map_err(|e| anyhow::anyhow!("submit: {e}"))?;
        }
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let done = ledger
                .read()
                .map(|d| {
                    d.ledger
                        .workload
                        .jobs
                        .values()
                        .skip(before)
                        .filter(|j| j.state == JobState::Completed)
                        .count()
                })
                .unwrap_or(0);
            if done >= jobs {
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!("only {done} of {jobs} jobs completed within 600 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let s = t0.elapsed().as_secs_f64();
        (s, jobs as f64 / s.max(1e-9))
    } else {
        (0.0, 0.0)
    };
    cluster.shutdown().await;
    Ok(SubmitReport {
        nodes: NODES,
        gangs,
        gang_phases: vec![
            phase("acknowledged", acked),
            phase("placed", placed),
            phase("known everywhere", everywhere),
            phase("ranks started", started),
        ],
        jobs,
        jobs_seconds,
        jobs_per_s,
    })
}

pub fn print(r: &SubmitReport) {
    println!(
        "{} nodes × 4 simulated GPUs; {} gangs of 2 × 4 GPUs, one at a time (ms from the submit):",
        r.nodes, r.gangs
    );
    println!("{:<18}{:>10}{:>10}{:>10}", "phase", "p50", "p90", "max");
    for p in &r.gang_phases {
        println!(
            "{:<18}{:>10.1}{:>10.1}{:>10.1}",
            p.phase, p.p50_ms, p.p90_ms, p.max_ms
        );
    }
    if r.jobs > 0 {
        println!(
            "{} one-GPU jobs (`true`) from {CLIENTS} clients: all completed in {:.2} s, {:.1} jobs/s",
            r.jobs, r.jobs_seconds, r.jobs_per_s
        );
    }
}
