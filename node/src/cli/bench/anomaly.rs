//! `shoal bench anomaly`: detection latency per anomaly type over many
//! injections on a two-node in-process mesh with eight simulated GPUs per
//! node, the cost of a `/metrics` scrape, and the GPU sampler's CPU cost.
//!
//! Faults are injected on GPUs held by a fresh job each round, so every
//! injection is a new (kind, node, GPU, job) and the event log's
//! de-duplication does not hide any of them.

use crate::agent::testkit::LocalCluster;
use crate::anomaly::detect;
use crate::cli::bench::percentile;
use crate::gpu::GpuSource;
use serde::Serialize;
use shoal_sdk::{Client, EventInfo, JobSubmitRequest};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const GPUS_PER_NODE: u32 = 8;
const STRAGGLER_WINDOW_MS: u64 = 1000;
const STALL_AFTER_S: u64 = 1;
const WAIT: Duration = Duration::from_secs(60);

#[derive(Serialize, Debug)]
pub struct LatencyRow {
    pub kind: String,
    pub injections: usize,
    /// Window the detector waits by design (straggler, stall), subtracted
    /// from `p50_ms`/`p99_ms`; the raw figures include it.
    pub window_ms: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub raw_p50_ms: f64,
    pub raw_p99_ms: f64,
}

#[derive(Serialize, Debug)]
pub struct AnomalyReport {
    pub latency: Vec<LatencyRow>,
    pub scrape_p50_ms: f64,
    pub scrape_p99_ms: f64,
    pub scrape_bytes: usize,
    pub scrape_series: usize,
    pub sampler_us_per_tick: f64,
    pub sampler_core_pct: f64,
    /// Whole agent (Raft heartbeats, gossip, sampler, executor and
    /// detector loops) with no job running: CPU per node over 10 s.
    pub idle_agent_core_pct: f64,
}

fn job(nodes: u32, gpus: u32, script: &str) -> JobSubmitRequest {
    JobSubmitRequest {
        name: "bench".into(),
        ..JobSubmitRequest::shell(nodes, gpus, script)
    }
}

async fn poll<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    while start.elapsed() < WAIT {
        if let Some(v) = check().await {
            return Ok(v);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("timed out after {WAIT:?} waiting for {what}")
}

async fn running(client: &Client, ids: &[u64]) -> anyhow::Result<Vec<shoal_sdk::JobInfo>> {
    let mut out = Vec::new();
    for &id in ids {
        out.push(
            poll("a job to run", || async move {
                client
                    .job(id)
                    .await
                    .ok()
                    .filter(|j| j.state == shoal_sdk::JobState::Running)
            })
            .await?,
        );
    }
    Ok(out)
}

/// Waits until the events in `want` (kind, node name, job) appear, and
/// returns the instant each was first seen.
async fn first_seen(
    client: &Client,
    after: u64,
    want: &BTreeSet<(String, String, u64)>,
) -> anyhow::Result<BTreeMap<(String, String, u64), Instant>> {
    let mut seen = BTreeMap::new();
    let start = Instant::now();
    while seen.len() < want.len() {
        if start.elapsed() > WAIT {
            anyhow::bail!("only {} of {} events appeared", seen.len(), want.len());
        }
        let events: Vec<EventInfo> = client.events(after).await.unwrap_or_default();
        let now = Instant::now();
        for e in events {
            let key = (
                e.kind.clone(),
                e.node.clone().unwrap_or_default(),
                e.job.unwrap_or(0),
            );
            if want.contains(&key) {
                seen.entry(key).or_insert(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(seen)
}

/// Cancels `ids` and waits until nothing runs, so the next round starts on
/// free GPUs.
async fn cancel_all(client: &Client, ids: &[u64]) -> anyhow::Result<()> {
    for &id in ids {
        client.cancel_job(id).await?;
    }
    poll("the jobs to end", || async move {
        let running = client.jobs(None, Some("running")).await.ok()?;
        running.is_empty().then_some(())
    })
    .await
}

fn agent_index(cluster: &LocalCluster, name: &str) -> anyhow::Result<usize> {
    cluster
        .agents
        .iter()
        .position(|a| a.name() == name)
        .ok_or_else(|| anyhow::anyhow!("no agent {name}"))
}

async fn last_event_id(client: &Client) -> u64 {
    client
        .events(0)
        .await
        .ok()
        .and_then(|e| e.last().map(|e| e.id))
        .unwrap_or(0)
}

fn row(kind: &str, window_ms: u64, raw: &mut [f64]) -> LatencyRow {
    raw.sort_by(f64::total_cmp);
    let w = window_ms as f64;
    LatencyRow {
        kind: kind.into(),
        injections: raw.len(),
        window_ms,
        p50_ms: percentile(raw, 0.5) - w,
        p99_ms: percentile(raw, 0.99) - w,
        max_ms: raw.last().copied().unwrap_or(0.0) - w,
        raw_p50_ms: percentile(raw, 0.5),
        raw_p99_ms: percentile(raw, 0.99),
    }
}

/// Waits until the sampler has seen a `clear`, so that the next injection
/// is a change it can detect rather than folded into the same sample.
async fn wait_cleared(client: &Client, node: &str) -> anyhow::Result<()> {
    poll("the faults cleared", || async move {
        let text = client.metrics_text().await.ok()?;
        text.lines()
            .filter(|l| {
                (l.starts_with("DCGM_FI_DEV_XID_ERRORS{")
                    || l.starts_with("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{"))
                    && l.contains(&format!("Hostname=\"{node}\""))
            })
            .all(|l| l.ends_with(" 0"))
            .then_some(())
    })
    .await
}

/// GPU faults: a round holds all eight GPUs of one node with a fresh job,
/// injects `fault` on each, and times each event.
async fn gpu_faults(
    cluster: &LocalCluster,
    fault: &str,
    kind: &str,
    rounds: usize,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<f64>> {
    let client = cluster.client(0);
    let mut latencies = Vec::new();
    for round in 0..rounds {
        progress(&format!("{kind}: round {}/{rounds}", round + 1));
        let id = client
            .submit_job(&job(1, GPUS_PER_NODE, "sleep 600"))
            .await?
            .id;
        let info = running(&client, &[id]).await?.remove(0);
        let node = info.nodes[0].clone();
        let there = cluster.client(agent_index(cluster, &node)?);
        let after = last_event_id(&client).await;
        let mut injected = BTreeMap::new();
        for gpu in 0..GPUS_PER_NODE {
            there.gpu_fault(gpu, fault).await?;
            injected.insert(gpu, Instant::now());
        }
        let want: BTreeSet<_> = [(kind.to_string(), node.clone(), id)].into();
        // One event per GPU: wait for them by GPU index.
        let start = Instant::now();
        let mut seen: BTreeMap<u32, Instant> = BTreeMap::new();
        while seen.len() < GPUS_PER_NODE as usize {
            if start.elapsed() > WAIT {
                anyhow::bail!("{kind}: only {} of {GPUS_PER_NODE} events", seen.len());
            }
            let now = Instant::now();
            for e in client.events(after).await.unwrap_or_default() {
                let key = (
                    e.kind.clone(),
                    e.node.clone().unwrap_or_default(),
                    e.job.unwrap_or(0),
                );
                if let (true, Some(gpu)) = (want.contains(&key), e.gpu) {
                    seen.entry(gpu).or_insert(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for (gpu, at) in seen {
            if let Some(t0) = injected.get(&gpu) {
                latencies.push(at.saturating_duration_since(*t0).as_secs_f64() * 1000.0);
            }
        }
        for gpu in 0..GPUS_PER_NODE {
            there.gpu_fault(gpu, "clear").await?;
        }
        wait_cleared(&there, &node).await?;
        cancel_all(&client, &[id]).await?;
    }
    Ok(latencies)
}

/// Stragglers: eight two-node gangs (one GPU per node) per round; once every
/// GPU is busy, rank 1 of each gang slows down.
async fn stragglers(
    cluster: &LocalCluster,
    rounds: usize,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<f64>> {
    let client = cluster.client(0);
    let mut latencies = Vec::new();
    for round in 0..rounds {
        progress(&format!("job_straggler: round {}/{rounds}", round + 1));
        let mut ids = Vec::new();
        for _ in 0..GPUS_PER_NODE {
            ids.push(client.submit_job(&job(2, 1, "sleep 600")).await?.id);
        }
        let jobs = running(&client, &ids).await?;
        for (i, a) in cluster.agents.iter().enumerate() {
            let c = cluster.client(i);
            let name = a.name().to_string();
            poll("every held GPU busy", || {
                let c = c.clone();
                let name = name.clone();
                async move {
                    let text = c.metrics_text().await.ok()?;
                    text.lines()
                        .filter(|l| {
                            l.starts_with("DCGM_FI_DEV_GPU_UTIL{")
                                && l.contains(&format!("Hostname=\"{name}\""))
                                && !l.contains("shoal_job=\"\"")
                        })
                        .all(|l| {
                            l.rsplit(' ')
                                .next()
                                .and_then(|v| v.parse::<f64>().ok())
                                .is_some_and(|u| u > 80.0)
                        })
                        .then_some(())
                }
            })
            .await?;
        }
        let after = last_event_id(&client).await;
        let mut injected = BTreeMap::new();
        let mut want = BTreeSet::new();
        for j in &jobs {
            let node = j.nodes[1].clone();
            let gpu = j.gpus[&node][0];
            cluster
                .client(agent_index(cluster, &node)?)
                .gpu_fault(gpu, "slow")
                .await?;
            let key = ("job_straggler".to_string(), node, j.id);
            injected.insert(key.clone(), Instant::now());
            want.insert(key);
        }
        for (key, at) in first_seen(&client, after, &want).await? {
            if let Some(t0) = injected.get(&key) {
                latencies.push(at.saturating_duration_since(*t0).as_secs_f64() * 1000.0);
            }
        }
        for (i, a) in cluster.agents.iter().enumerate() {
            for gpu in 0..GPUS_PER_NODE {
                cluster.client(i).gpu_fault(gpu, "clear").await?;
            }
            wait_cleared(&cluster.client(i), a.name()).await?;
        }
        cancel_all(&client, &ids).await?;
    }
    Ok(latencies)
}

/// Stalls: sixteen one-GPU jobs per round that print once and go silent;
/// latency from the job running (its last output) to the event.
async fn stalls(
    cluster: &LocalCluster,
    rounds: usize,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<f64>> {
    let client = cluster.client(0);
    let mut latencies = Vec::new();
    for round in 0..rounds {
        progress(&format!("job_stalled: round {}/{rounds}", round + 1));
        let after = last_event_id(&client).await;
        let mut ids = Vec::new();
        for _ in 0..2 * GPUS_PER_NODE {
            ids.push(
                client
                    .submit_job(&job(1, 1, "echo started; exec sleep 600"))
                    .await?
                    .id,
            );
        }
        // The output is written as the rank starts; its log's first bytes
        // are the last progress the detector sees.
        let mut started = BTreeMap::new();
        let mut want = BTreeSet::new();
        for j in running(&client, &ids).await? {
            let node = j.nodes[0].clone();
            let index = agent_index(cluster, &node)?;
            let log = crate::executor::log_path(
                &cluster.agents[index].node().config().jobs_dir(),
                j.id,
                0,
            );
            let at = poll("the rank's first output", || {
                let log = log.clone();
                async move {
                    std::fs::metadata(&log)
                        .ok()
                        .filter(|m| m.len() > 0)
                        .and_then(|m| m.modified().ok())
                }
            })
            .await?;
            let key = ("job_stalled".to_string(), node, j.id);
            started.insert(key.clone(), at);
            want.insert(key);
        }
        let seen = first_seen(&client, after, &want).await?;
        let now_wall = std::time::SystemTime::now();
        let now = Instant::now();
        for (key, at) in seen {
            if let Some(wrote) = started.get(&key) {
                // The log's mtime is wall-clock time: carry it over to Instant.
                let ago = now_wall.duration_since(*wrote).unwrap_or_default();
                let wrote_at = now.checked_sub(ago).unwrap_or(now);
                latencies.push(at.saturating_duration_since(wrote_at).as_secs_f64() * 1000.0);
            }
        }
        cancel_all(&client, &ids).await?;
    }
    Ok(latencies)
}

/// CPU time of one sampler tick on eight simulated GPUs: sample + compare.
fn sampler_cost() -> anyhow::Result<f64> {
    let inventory =
        crate::gpu::parse_sim_gpus("8xH100-80GB", "bench").map_err(anyhow::Error::msg)?;
    let indices: Vec<u32> = inventory.iter().map(|g| g.index).collect();
    let mut gpus = crate::gpu::sim::SimGpus::new(inventory, "bench");
    gpus.set_busy(&indices.iter().copied().collect());
    let holders = BTreeMap::new();
    let mut previous = gpus.sample();
    let ticks = 20_000;
    let cpu0 = crate::procstat::read_self().map(|s| s.cpu_seconds);
    let started = Instant::now();
    for _ in 0..ticks {
        let current = gpus.sample();
        std::hint::black_box(detect(1, "bench", &indices, &previous, &current, &holders));
        previous = current;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = match (cpu0, crate::procstat::read_self().map(|s| s.cpu_seconds)) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => wall,
    };
    Ok(cpu / ticks as f64 * 1e6)
}

pub async fn run(injections: usize) -> anyhow::Result<AnomalyReport> {
    if injections == 0 {
        anyhow::bail!("--injections must be positive");
    }
    let progress = |s: &str| eprintln!("  {s}");
    let sampler_us = sampler_cost()?;
    let cluster = LocalCluster::start(2, |_, cfg| {
        cfg.sim_gpus = Some(format!("{GPUS_PER_NODE}xH100-80GB"));
        cfg.anomaly.straggler_window_ms = STRAGGLER_WINDOW_MS;
        cfg.anomaly.stall_after_s = STALL_AFTER_S;
        cfg.executor.stop_grace_s = 2;
    })
    .await?;
    cluster
        .wait_all_alive(WAIT)
        .await
        .map_err(anyhow::Error::msg)?;
    progress("idle agent CPU (10 s)");
    let cpu0 = crate::procstat::read_self()
        .map(|s| s.cpu_seconds)
        .unwrap_or(0.0);
    let idle_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cpu1 = crate::procstat::read_self()
        .map(|s| s.cpu_seconds)
        .unwrap_or(0.0);
    let idle_agent_core_pct =
        (cpu1 - cpu0) / idle_from.elapsed().as_secs_f64() / cluster.agents.len() as f64 * 100.0;
    let gpu_rounds = injections.div_ceil(GPUS_PER_NODE as usize);
    let mut latency = Vec::new();
    for (fault, kind) in [
        ("ecc-dbe", "gpu_ecc_dbe"),
        ("xid:79", "gpu_xid"),
        ("hot", "gpu_throttle"),
    ] {
        let mut raw = gpu_faults(&cluster, fault, kind, gpu_rounds, &progress).await?;
        latency.push(row(kind, 0, &mut raw));
    }
    let mut raw = stragglers(&cluster, gpu_rounds, &progress).await?;
    latency.push(row("job_straggler", STRAGGLER_WINDOW_MS, &mut raw));
    let stall_rounds = injections.div_ceil(2 * GPUS_PER_NODE as usize);
    let mut raw = stalls(&cluster, stall_rounds, &progress).await?;
    latency.push(row("job_stalled", STALL_AFTER_S * 1000, &mut raw));

    // Scrape cost with every GPU of node 1 held by a job.
    progress("scrape");
    let client = cluster.client(0);
    let id = client
        .submit_job(&job(1, GPUS_PER_NODE, "sleep 600"))
        .await?
        .id;
    let info = running(&client, &[id]).await?.remove(0);
    let there = cluster.client(agent_index(&cluster, &info.nodes[0])?);
    let mut times = Vec::new();
    let mut text = String::new();
    for _ in 0..200 {
        let t = Instant::now();
        text = there.metrics_text().await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    client.cancel_job(id).await?;
    let report = AnomalyReport {
        latency,
        scrape_p50_ms: percentile(&times, 0.5),
        scrape_p99_ms: percentile(&times, 0.99),
        scrape_bytes: text.len(),
        scrape_series: text.lines().filter(|l| !l.starts_with('#')).count(),
        sampler_us_per_tick: sampler_us,
        sampler_core_pct: sampler_us / crate::anomaly::SAMPLE_EVERY.as_micros() as f64 * 100.0,
        idle_agent_core_pct,
    };
    cluster.shutdown().await;
    Ok(report)
}

pub fn print(r: &AnomalyReport) {
    println!("anomaly detection on 2 in-process nodes with {GPUS_PER_NODE} simulated GPUs each");
    println!(
        "{:<15} {:>10} {:>10} {:>9} {:>9} {:>9} {:>13}",
        "kind", "injections", "window ms", "p50 ms", "p99 ms", "max ms", "raw p99 ms"
    );
    for l in &r.latency {
        println!(
            "{:<15} {:>10} {:>10} {:>9.0} {:>9.0} {:>9.0} {:>13.0}",
            l.kind, l.injections, l.window_ms, l.p50_ms, l.p99_ms, l.max_ms, l.raw_p99_ms
        );
    }
    println!(
        "/metrics with {GPUS_PER_NODE} GPUs: {} bytes, {} samples, scrape p50 {:.2} ms, p99 {:.2} ms",
        r.scrape_bytes, r.scrape_series, r.scrape_p50_ms, r.scrape_p99_ms
    );
    println!(
        "GPU sampler (simulated, {GPUS_PER_NODE} GPUs): {:.1} µs CPU per 250 ms tick = {:.4}% of a core",
        r.sampler_us_per_tick, r.sampler_core_pct
    );
    println!(
        "whole agent, idle (Raft, gossip, sampler, detectors): {:.2}% of a core per node",
        r.idle_agent_core_pct
    );
}
