//! `shoal bench place`: gang placement speed, pure and end to end.
//!
//! 1. Pure decisions: `place_gang` for `--jobs` requests (32-node gangs of
//!    1, 2, 4 or 8 GPUs per node) against one snapshot of a synthetic
//!    cluster of `--nodes` nodes × 8 GPUs (racks of 32, 16 racks per zone,
//!    4 zones per region), each node with a random 0..=8 GPUs already busy.
//!    Once with label-derived distances and once with coordinates.
//! 2. One full scheduling pass (`schedule`, HDRF with backfill) over the same
//!    cluster with `--jobs` pending gangs of 1..=32 nodes.
//! 3. End to end: three in-process voters on loopback (QUIC, TLS, fsync),
//!    `--e2e-gangs` three-node gangs (one GPU per node) submitted through the
//!    HTTP API by 32 concurrent clients; the time from the first submission
//!    until the ledger shows all of them running.

use crate::agent::testkit::LocalCluster;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use shoal_consensus::sched::model::{GangRequest, GpuView, NodeView};
use shoal_consensus::sched::{
    place_gang, schedule, PendingJob, Placer, Policy, Proximity, SchedInput, TenantView,
    TopologyProximity,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const GPUS_PER_NODE: u32 = 8;
const RACK_SIZE: u64 = 32;
const RACKS_PER_ZONE: u64 = 16;
const ZONES_PER_REGION: u64 = 4;
const GANG_NODES: u32 = 32;

#[derive(Serialize, Debug)]
pub struct DecisionRow {
    pub distances: String,
    pub decisions: usize,
    pub placed: usize,
    pub decisions_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_diameter_ms: f64,
}

#[derive(Serialize, Debug)]
pub struct PassRow {
    pub pending: usize,
    pub placed: usize,
    pub pass_ms: f64,
}

#[derive(Serialize, Debug)]
pub struct EndToEndRow {
    pub voters: usize,
    pub gangs: usize,
    pub seconds: f64,
    pub placements_per_s: f64,
    pub submit_p99_ms: f64,
}

#[derive(Serialize, Debug)]
pub struct PlaceReport {
    pub nodes: u64,
    pub busy_fraction: f64,
    pub decisions: Vec<DecisionRow>,
    pub pass: PassRow,
    pub end_to_end: Option<EndToEndRow>,
}

/// Stand-in for Vivaldi: 2-D coordinates plus a per-node height, loosely
/// clustered by rack and zone so that the topology still shows through.
struct CoordinateProximity {
    coords: Vec<(f64, f64, f64)>,
}

impl Proximity for CoordinateProximity {
    fn rtt_ms(&self, a: u64, b: u64) -> Option<f64> {
        let (xa, ya, ha) = *self.coords.get(usize::try_from(a).ok()?)?;
        let (xb, yb, hb) = *self.coords.get(usize::try_from(b).ok()?)?;
        Some(((xa - xb).powi(2) + (ya - yb).powi(2)).sqrt() + ha + hb)
    }
}

fn location(id: u64) -> (u64, u64, u64) {
    let rack = id / RACK_SIZE;
    let zone = rack / RACKS_PER_ZONE;
    (rack, zone, zone / ZONES_PER_REGION)
}

fn cluster(nodes: u64, rng: &mut ChaCha8Rng) -> Vec<NodeView> {
    (0..nodes)
        .map(|id| {
            let (rack, zone, region) = location(id);
            let busy = rng.random_range(0..=GPUS_PER_NODE);
            NodeView {
                id,
                name: format!("node-{id}"),
                healthy: true,
                labels: [
                    ("region", format!("region-{region}")),
                    ("zone", format!("zone-{zone}")),
                    ("rack", format!("rack-{rack}")),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
                gpus: (0..GPUS_PER_NODE)
                    .map(|index| GpuView {
                        index,
                        model: "H100".to_string(),
                        allocated_to: (index < busy).then_some(1_000_000 + id),
                        numa_node: Some(index / 4),
                        nvlink_peers: (0..GPUS_PER_NODE).filter(|&p| p != index).collect(),
                    })
                    .collect(),
            }
        })
        .collect()
}

fn coordinates(nodes: u64, rng: &mut ChaCha8Rng) -> CoordinateProximity {
    let coords = (0..nodes)
        .map(|id| {
            let (rack, zone, region) = location(id);
            let x = region as f64 * 40.0
                + (zone % ZONES_PER_REGION) as f64 * 4.0
                + (rack % 4) as f64 * 0.3;
            let y = (rack % RACKS_PER_ZONE / 4) as f64 * 0.3;
            (
                x + rng.random_range(0.0..0.05),
                y + rng.random_range(0.0..0.05),
                rng.random_range(0.01..0.05),
            )
        })
        .collect();
    CoordinateProximity { coords }
}

fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    let ms: Vec<f64> = sorted.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    super::percentile(&ms, p)
}

/// `shared_index`: decide against one prebuilt index, as inside a
/// scheduling pass; otherwise every call builds it, as an isolated call does.
fn decisions(
    label: &str,
    nodes: &[NodeView],
    prox: &dyn Proximity,
    requests: usize,
    shared_index: bool,
    rng: &mut ChaCha8Rng,
) -> DecisionRow {
    let placer = Placer::new(nodes);
    let mut latencies = Vec::with_capacity(requests);
    let mut placed = 0usize;
    let mut diameter_sum = 0.0;
    let started = Instant::now();
    for job in 0..requests {
        let request = GangRequest {
            job: job as u64,
            tenant: "bench".to_string(),
            nodes: GANG_NODES,
            gpus_per_node: [1, 2, 4, 8][rng.random_range(0..4)],
            gpu_model: Some("H100".to_string()),
            same: None,
            max_rtt_ms: None,
            required_labels: Default::default(),
            choice: Default::default(),
        };
        let begin = Instant::now();
        let outcome = if shared_index {
            placer.place(prox, &request)
        } else {
            place_gang(nodes, prox, &request)
        };
        latencies.push(begin.elapsed());
        if let Ok(placement) = outcome {
            placed += 1;
            diameter_sum += placement.diameter_ms;
        }
    }
    let total = started.elapsed();
    latencies.sort_unstable();
    DecisionRow {
        distances: label.to_string(),
        decisions: requests,
        placed,
        decisions_per_s: requests as f64 / total.as_secs_f64().max(1e-9),
        p50_ms: percentile_ms(&latencies, 0.50),
        p99_ms: percentile_ms(&latencies, 0.99),
        max_ms: percentile_ms(&latencies, 1.0),
        mean_diameter_ms: diameter_sum / placed.max(1) as f64,
    }
}

fn full_pass(nodes: &[NodeView], jobs: usize, rng: &mut ChaCha8Rng) -> PassRow {
    let tenants: Vec<TenantView> = (0..4)
        .map(|t| TenantView {
            name: format!("t{t}"),
            parent: None,
            weight: f64::from(t + 1),
            max_gpus: None,
            gpu_hours_limit: None,
            gpu_hours_used: 0.0,
            gpus_in_use: 0,
            global_cap: None,
        })
        .collect();
    let pending = (0..jobs)
        .map(|i| {
            let tenant = format!("t{}", i % 4);
            let gang_nodes = rng.random_range(1..=GANG_NODES);
            let gpus_per_node = [1, 2, 4, 8][rng.random_range(0..4)];
            (
                PendingJob {
                    id: i as u64,
                    tenant: tenant.clone(),
                    priority: 0,
                    submitted_seq: i as u64,
                    gpus: gang_nodes * gpus_per_node,
                    time_limit_s: 3600,
                    preemptible: true,
                    boost: 0,
                },
                GangRequest {
                    job: i as u64,
                    tenant,
                    nodes: gang_nodes,
                    gpus_per_node,
                    gpu_model: None,
                    same: None,
                    max_rtt_ms: None,
                    required_labels: Default::default(),
                    choice: Default::default(),
                },
            )
        })
        .collect();
    let input = SchedInput {
        now_s: 0,
        nodes: nodes.to_vec(),
        tenants,
        running: Vec::new(),
        pending,
        policy: Policy::Hdrf,
    };
    let prox = TopologyProximity::new(&input.nodes);
    let started = Instant::now();
    let plan = schedule(&input, &prox);
    PassRow {
        pending: jobs,
        placed: plan.placements.len(),
        pass_ms: started.elapsed().as_secs_f64() * 1000.0,
    }
}

async fn end_to_end(gangs: usize) -> anyhow::Result<EndToEndRow> {
    // 8 × 64 = 512 simulated GPUs per node, so up to 512 three-node gangs
    // of one GPU each fit at once and the measurement is placement, not
    // queueing. (More would not join: a join request, which carries the
    // node's GPU inventory, must fit the 64 KiB allowed a client without
    // a certificate.)
    if gangs > 512 {
        anyhow::bail!(
            "--e2e-gangs must be at most 512 (the capacity of the three benchmark nodes)"
        );
    }
    let sim = ["64xH100-80GB"; 8].join(",");
    let cluster = LocalCluster::start(3, |_, cfg| {
        cfg.sim_gpus = Some(sim.clone());
        cfg.executor.enabled = false;
        cfg.scheduler.interval_ms = 20;
    })
    .await?;
    cluster
        .wait_until("three voters and a leader", Duration::from_secs(30), |c| {
            let ok = c.agreed_leader().is_some() && c.agents[0].voters().len() == 3;
            async move { ok }
        })
        .await
        .map_err(anyhow::Error::msg)?;
    let leader = cluster
        .agreed_leader()
        .and_then(|l| cluster.agents.iter().position(|a| a.id() == l.id()))
        .ok_or_else(|| anyhow::anyhow!("no leader"))?;
    let client = Arc::new(cluster.client(leader));
    let request = shoal_sdk::JobSubmitRequest {
        name: "bench".into(),
        tenant: None,
        nodes: 3,
        gpus_per_node: 1,
        gpu_model: None,
        time_limit_s: 3600,
        priority: 0,
        preemptible: true,
        command: Vec::new(),
        env: Default::default(),
        workdir: None,
        ckpt_interval_s: None,
        max_restarts: Some(0),
        requeue: false,
        same: None,
        max_rtt_ms: None,
        labels: Default::default(),
        mem_bytes: None,
        cpus_per_task: None,
        tasks_per_node: None,
        batch: false,
        dependency: None,
        signal: None,
        nodelist: None,
        exclude: None,
        exclusive: false,
        hold: false,
        ckpt_replicas: None,
        near: None,
    };
    let clients = 32;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = client.clone();
        let request = request.clone();
        let count = gangs / clients + usize::from(c < gangs % clients);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(count);
            for _ in 0..count {
                let t = Instant::now();
                client.submit_job(&request).await?;
                latencies.push(t.elapsed());
            }
            Ok::<_, shoal_sdk::ClientError>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await?.map_err(|e| anyhow::anyhow!(e.to_string()))?);
    }
    let agent = cluster.agents[leader].clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    let elapsed = loop {
        let running = agent
            .ledger()
            .read()
            .map(|d| d.ledger.workload.holding().count())
            .unwrap_or(0);
        if running >= gangs {
            break started.elapsed();
        }
        if Instant::now() > deadline {
            anyhow::bail!("only {running} of {gangs} gangs were placed within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    latencies.sort_unstable();
    cluster.shutdown().await;
    Ok(EndToEndRow {
        voters: 3,
        gangs,
        seconds: elapsed.as_secs_f64(),
        placements_per_s: gangs as f64 / elapsed.as_secs_f64().max(1e-9),
        submit_p99_ms: percentile_ms(&latencies, 0.99),
    })
}

pub async fn run(nodes: u64, jobs: usize, e2e_gangs: usize) -> anyhow::Result<PlaceReport> {
    if nodes < u64::from(GANG_NODES) {
        anyhow::bail!(
            "--nodes must be at least {GANG_NODES} (the benchmark places {GANG_NODES}-node gangs)"
        );
    }
    if jobs == 0 {
        anyhow::bail!("--jobs must be positive");
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let view = cluster(nodes, &mut rng);
    let busy = view
        .iter()
        .flat_map(|n| &n.gpus)
        .filter(|g| g.allocated_to.is_some())
        .count();
    let topology = TopologyProximity::new(&view);
    let coords = coordinates(nodes, &mut rng);
    let decisions = vec![
        decisions("topology labels", &view, &topology, jobs, false, &mut rng),
        decisions("coordinates", &view, &coords, jobs, false, &mut rng),
        decisions("labels, in a pass", &view, &topology, jobs, true, &mut rng),
        decisions("coords, in a pass", &view, &coords, jobs, true, &mut rng),
    ];
    let pass = full_pass(&view, jobs, &mut rng);
    let end_to_end = if e2e_gangs > 0 {
        Some(end_to_end(e2e_gangs).await?)
    } else {
        None
    };
    Ok(PlaceReport {
        nodes,
        busy_fraction: busy as f64 / (view.len() as f64 * f64::from(GPUS_PER_NODE)),
        decisions,
        pass,
        end_to_end,
    })
}

pub fn print(report: &PlaceReport) {
    println!(
        "cluster: {} nodes × {GPUS_PER_NODE} GPUs, {:.0}% busy; {GANG_NODES}-node gangs",
        report.nodes,
        report.busy_fraction * 100.0
    );
    println!(
        "{:<18}{:>10}{:>8}{:>14}{:>10}{:>10}{:>10}{:>14}",
        "distances",
        "decisions",
        "placed",
        "decisions/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "diameter ms"
    );
    for r in &report.decisions {
        println!(
            "{:<18}{:>10}{:>8}{:>14.0}{:>10.3}{:>10.3}{:>10.3}{:>14.2}",
            r.distances,
            r.decisions,
            r.placed,
            r.decisions_per_s,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.mean_diameter_ms
        );
    }
    println!(
        "one HDRF pass over {} pending gangs of 1-{GANG_NODES} nodes: {} placed in {:.1} ms",
        report.pass.pending, report.pass.placed, report.pass.pass_ms
    );
    if let Some(e) = &report.end_to_end {
        println!(
            "end to end, {} voters on loopback: {} three-node gangs submitted and placed in {:.2} s = {:.0} placements/s (submit p99 {:.1} ms)",
            e.voters, e.gangs, e.seconds, e.placements_per_s, e.submit_p99_ms
        );
    }
}
