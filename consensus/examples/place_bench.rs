//! Placement latency on a large synthetic cluster.
//!
//! 4,096 nodes × 8 GPUs, racks of 32 nodes, 8 zones in 2 regions, each node
//! with a uniformly random 0..=8 GPUs already allocated (about half overall).
//! 10,000 requests for 32-node gangs with 1, 2, 4 or 8 GPUs per node, placed
//! against the same snapshot. Run with
//! `cargo run --release -j 1 --example place_bench`.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_consensus::sched::model::{GangRequest, GpuView, NodeView};
use shoal_consensus::sched::{place_gang, Proximity, TopologyProximity};

const NODES: u64 = 4096;
const GPUS_PER_NODE: u32 = 8;
const RACK_SIZE: u64 = 32;
const RACKS_PER_ZONE: u64 = 16;
const ZONES_PER_REGION: u64 = 4;
const GANG_NODES: u32 = 32;

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

fn cluster(rng: &mut ChaCha8Rng) -> Vec<NodeView> {
    (0..NODES)
        .map(|id| {
            let rack = id / RACK_SIZE;
            let zone = rack / RACKS_PER_ZONE;
            let region = zone / ZONES_PER_REGION;
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

fn coordinates(rng: &mut ChaCha8Rng) -> CoordinateProximity {
    let coords = (0..NODES)
        .map(|id| {
            let rack = id / RACK_SIZE;
            let zone = rack / RACKS_PER_ZONE;
            let region = zone / ZONES_PER_REGION;
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

/// 10,000 unless `PLACE_BENCH_REQUESTS` says otherwise (for quick runs).
fn requests() -> usize {
    std::env::var("PLACE_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn run(label: &str, nodes: &[NodeView], prox: &dyn Proximity, rng: &mut ChaCha8Rng) {
    let requests = requests();
    let mut latencies: Vec<Duration> = Vec::with_capacity(requests);
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
        };
        let begin = Instant::now();
        let outcome = place_gang(nodes, prox, &request);
        latencies.push(begin.elapsed());
        if let Ok(placement) = outcome {
            placed += 1;
            diameter_sum += placement.diameter_ms;
        }
    }
    let total = started.elapsed();
    let percentile = |samples: &mut Vec<Duration>, p: f64| {
        samples.sort_unstable();
        samples
            .get(((samples.len() as f64 * p) as usize).min(samples.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "{label}: {requests} decisions in {:.2?} wall = {:.0} decisions/s; wall p50 {:.3?}, p99 {:.3?}, max {:.3?}",
        total,
        requests as f64 / total.as_secs_f64(),
        percentile(&mut latencies, 0.50),
        percentile(&mut latencies, 0.99),
        percentile(&mut latencies, 1.0),
    );
    println!(
        "{label}: placed {placed}/{requests}, mean diameter {:.2} ms",
        diameter_sum / placed.max(1) as f64
    );
}

fn main() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let nodes = cluster(&mut rng);
    let busy: usize = nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .filter(|g| g.allocated_to.is_some())
        .count();
    println!(
        "cluster: {} nodes, {} GPUs, {:.0}% allocated; gangs of {GANG_NODES} nodes",
        nodes.len(),
        nodes.len() * GPUS_PER_NODE as usize,
        100.0 * busy as f64 / (nodes.len() * GPUS_PER_NODE as usize) as f64
    );
    let topology = TopologyProximity::new(&nodes);
    run("topology labels", &nodes, &topology, &mut rng);
    let vivaldi_like = coordinates(&mut rng);
    run("coordinates", &nodes, &vivaldi_like, &mut rng);
}
