//! `shoal bench gossip`: N gossip nodes (libp2p gossipsub over QUIC) in this
//! process on loopback. Publishes capacity changes from random nodes and
//! reports the time for each to reach every other node, the stream bytes per
//! node and the CPU per node, idle and while publishing.

use crate::cli::bench::percentile;
use serde::Serialize;
use shoal_mesh::gossip::{
    CapacityAdvert, CapacityView, Gossip, GossipConfig, GossipEvent, GossipHandle, Keypair,
    TrafficStats,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct GossipBenchArgs {
    pub nodes: usize,
    pub publications: usize,
    pub interval: Duration,
    pub idle: Duration,
    pub settle: Duration,
}

/// Per-node traffic and CPU over one phase.
#[derive(Serialize, Debug, Clone)]
pub struct PhaseCost {
    pub phase: String,
    pub seconds: f64,
    pub bytes_out_per_s: f64,
    pub bytes_in_per_s: f64,
    pub cpu_core_pct: f64,
}

#[derive(Serialize, Debug)]
pub struct GossipReport {
    pub nodes: usize,
    pub mesh_formed_s: f64,
    pub publications: usize,
    pub delivered: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub phases: Vec<PhaseCost>,
    pub dropped_events: u64,
}

#[derive(Default)]
struct Observed {
    view: CapacityView,
    arrivals: HashMap<(u64, u64), Instant>,
}

struct Node {
    handle: GossipHandle,
    observed: Arc<Mutex<Observed>>,
}

struct Mark {
    at: Instant,
    cpu_s: f64,
    traffic: TrafficStats,
}

fn mark(nodes: &[Node]) -> Mark {
    Mark {
        at: Instant::now(),
        cpu_s: crate::procstat::read_self().map_or(0.0, |s| s.cpu_seconds),
        traffic: nodes.iter().fold(TrafficStats::default(), |acc, n| {
            let t = n.handle.traffic();
            TrafficStats {
                bytes_in: acc.bytes_in + t.bytes_in,
                bytes_out: acc.bytes_out + t.bytes_out,
            }
        }),
    }
}

fn cost(phase: &str, nodes: &[Node], from: &Mark) -> PhaseCost {
    let to = mark(nodes);
    let secs = to.at.duration_since(from.at).as_secs_f64().max(1e-9);
    let n = nodes.len().max(1) as f64;
    PhaseCost {
        phase: phase.to_string(),
        seconds: secs,
        bytes_out_per_s: to.traffic.bytes_out.saturating_sub(from.traffic.bytes_out) as f64
            / n
            / secs,
        bytes_in_per_s: to.traffic.bytes_in.saturating_sub(from.traffic.bytes_in) as f64 / n / secs,
        cpu_core_pct: (to.cpu_s - from.cpu_s).max(0.0) / n / secs * 100.0,
    }
}

fn advert(node_id: u64, seq: u64) -> CapacityAdvert {
    CapacityAdvert {
        node_id,
        seq,
        gpus_free_by_model: BTreeMap::from([
            ("H100-80GB".to_string(), (seq % 8) as u32),
            ("L40S".to_string(), (seq % 4) as u32),
        ]),
        gpus_total: 12,
        healthy: true,
        load: 0.4,
        job_util: BTreeMap::from([(7, 91.0)]),
        coordinate: Some(vec![0; 32]),
        sent_at_ms: 0,
    }
}

pub async fn run(args: &GossipBenchArgs) -> anyhow::Result<GossipReport> {
    if args.nodes < 2 {
        anyhow::bail!("--nodes must be at least 2");
    }
    if args.publications == 0 {
        anyhow::bail!("--publications must be positive");
    }
    let mut nodes = Vec::with_capacity(args.nodes);
    for _ in 0..args.nodes {
        let config = GossipConfig::new(Keypair::generate_ed25519(), "127.0.0.1:0".parse()?);
        let (handle, mut events) = Gossip::start(config).await?;
        let observed = Arc::new(Mutex::new(Observed::default()));
        let sink = observed.clone();
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let now = Instant::now();
                if let GossipEvent::Capacity { advert, .. } = &event {
                    let key = (advert.node_id, advert.seq);
                    let Ok(mut o) = sink.lock() else { return };
                    if o.view.apply_event(&event).changed() {
                        o.arrivals.entry(key).or_insert(now);
                    }
                }
            }
        });
        nodes.push(Node { handle, observed });
    }
    let members: BTreeMap<_, _> = nodes
        .iter()
        .map(|n| (n.handle.local_peer_id(), n.handle.listen_multiaddr()))
        .collect();
    for node in &nodes {
        node.handle.set_members(members.clone()).await?;
    }

    let others = args.nodes - 1;
    let started = Instant::now();
    loop {
        let mut ready = 0;
        for node in &nodes {
            let s = node.handle.status().await?;
            if s.connected_members == others
                && s.capacity_topic_peers == others
                && s.capacity_mesh_peers >= others.min(4)
            {
                ready += 1;
            }
        }
        if ready == nodes.len() {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            anyhow::bail!(
                "the mesh did not form in 120 s ({ready} of {} nodes ready)",
                nodes.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mesh_formed_s = started.elapsed().as_secs_f64();
    let mut phases = Vec::new();

    let from = mark(&nodes);
    tokio::time::sleep(args.settle).await;
    phases.push(cost("settling (mesh GRAFT/PRUNE)", &nodes, &from));
    let from = mark(&nodes);
    tokio::time::sleep(args.idle).await;
    phases.push(cost("idle (pings, gossipsub heartbeats)", &nodes, &from));

    let from = mark(&nodes);
    let mut seqs = vec![0u64; nodes.len()];
    let mut rng = super::data::Xorshift::new(0x2545_F491_4F6C_DD1D);
    let mut latencies = Vec::with_capacity(args.publications);
    for _ in 0..args.publications {
        let publisher = (rng.next_u64() % nodes.len() as u64) as usize;
        seqs[publisher] += 1;
        let key = (publisher as u64, seqs[publisher]);
        let sent = Instant::now();
        if let Err(e) = nodes[publisher]
            .handle
            .publish_capacity(&advert(key.0, key.1))
            .await
        {
            tracing::warn!(publisher, error = %e, "publish failed");
            continue;
        }
        let deadline = sent + Duration::from_secs(10);
        let last = loop {
            let arrivals: Option<Vec<Instant>> = nodes
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != publisher)
                .map(|(_, n)| {
                    n.observed
                        .lock()
                        .ok()
                        .and_then(|o| o.arrivals.get(&key).copied())
                })
                .collect();
            if let Some(arrivals) = arrivals {
                break arrivals.into_iter().max();
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        if let Some(last) = last {
            latencies.push(last.saturating_duration_since(sent).as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(args.interval).await;
    }
    phases.push(cost("publishing", &nodes, &from));
    latencies.sort_by(f64::total_cmp);
    let mut dropped_events = 0;
    for node in &nodes {
        dropped_events += node.handle.status().await?.dropped_events;
    }
    for node in &nodes {
        let _ = node.handle.shutdown().await;
    }
    Ok(GossipReport {
        nodes: args.nodes,
        mesh_formed_s,
        publications: args.publications,
        delivered: latencies.len(),
        p50_ms: percentile(&latencies, 0.5),
        p90_ms: percentile(&latencies, 0.9),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        phases,
        dropped_events,
    })
}

pub fn print(r: &GossipReport) {
    println!(
        "{} gossip nodes in one process on loopback (QUIC, signed gossipsub); mesh formed in {:.1} s",
        r.nodes, r.mesh_formed_s
    );
    println!(
        "capacity change reaching all {} other nodes: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} of {} delivered everywhere)",
        r.nodes - 1,
        r.p50_ms,
        r.p90_ms,
        r.p99_ms,
        r.max_ms,
        r.delivered,
        r.publications
    );
    println!(
        "{:<36} {:>8} {:>12} {:>12} {:>10}",
        "per node", "seconds", "out B/s", "in B/s", "CPU %core"
    );
    for p in &r.phases {
        println!(
            "{:<36} {:>8.1} {:>12.0} {:>12.0} {:>10.2}",
            p.phase, p.seconds, p.bytes_out_per_s, p.bytes_in_per_s, p.cpu_core_pct
        );
    }
    println!(
        "for comparison: memberlist/Serf LAN probe every 1 s with a 500 ms timeout; Nomad marks a node down after ~20 s"
    );
}
