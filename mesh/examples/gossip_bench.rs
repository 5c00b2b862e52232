//! Starts N in-process gossip nodes on loopback, publishes capacity changes
//! from random nodes and reports propagation latency, stream bytes/s per node
//! and CPU time per node.
//!
//! `cargo run --release -j 1 --example gossip_bench -- --nodes 50 [--publications 100] [--interval-ms 100] [--idle-secs 10] [--settle-secs 10] [--heartbeat-ms 100]`

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shoal_mesh::gossip::Keypair;
use shoal_mesh::gossip::{
    CapacityAdvert, CapacityView, Gossip, GossipConfig, GossipEvent, GossipHandle, TrafficStats,
};

struct Args {
    nodes: usize,
    publications: usize,
    interval: Duration,
    idle: Duration,
    settle: Duration,
    heartbeat: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        nodes: 50,
        publications: 100,
        interval: Duration::from_millis(100),
        idle: Duration::from_secs(10),
        settle: Duration::from_secs(10),
        heartbeat: Duration::from_millis(100),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number: u64 = value.parse().map_err(|e| format!("{flag} {value}: {e}"))?;
        match flag.as_str() {
            "--nodes" => args.nodes = number as usize,
            "--publications" => args.publications = number as usize,
            "--interval-ms" => args.interval = Duration::from_millis(number),
            "--idle-secs" => args.idle = Duration::from_secs(number),
            "--settle-secs" => args.settle = Duration::from_secs(number),
            "--heartbeat-ms" => args.heartbeat = Duration::from_millis(number),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.nodes < 2 {
        return Err("--nodes must be at least 2".into());
    }
    Ok(args)
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

fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn total_traffic(nodes: &[Node]) -> TrafficStats {
    nodes.iter().fold(TrafficStats::default(), |acc, n| {
        let t = n.handle.traffic();
        TrafficStats {
            bytes_in: acc.bytes_in + t.bytes_in,
            bytes_out: acc.bytes_out + t.bytes_out,
        }
    })
}

struct Window {
    at: Instant,
    cpu: Duration,
    traffic: TrafficStats,
}

fn window(nodes: &[Node]) -> Window {
    Window {
        at: Instant::now(),
        cpu: cpu_time(),
        traffic: total_traffic(nodes),
    }
}

fn report(label: &str, nodes: &[Node], start: &Window) {
    let end = window(nodes);
    let secs = end.at.duration_since(start.at).as_secs_f64();
    let n = nodes.len() as f64;
    let out = (end.traffic.bytes_out - start.traffic.bytes_out) as f64;
    let inn = (end.traffic.bytes_in - start.traffic.bytes_in) as f64;
    let cpu = end.cpu.saturating_sub(start.cpu).as_secs_f64();
    println!(
        "{label}: {secs:.1} s, per node: out {:.0} B/s, in {:.0} B/s, CPU {:.2} ms/s ({:.2}% of a core)",
        out / n / secs,
        inn / n / secs,
        cpu / n / secs * 1000.0,
        cpu / n / secs * 100.0,
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn advert(node_id: u64, seq: u64) -> CapacityAdvert {
    CapacityAdvert {
        node_id,
        seq,
        gpus_free_by_model: BTreeMap::from([
            ("H100-80G".to_string(), (seq % 8) as u32),
            ("L40S".to_string(), (seq % 4) as u32),
        ]),
        gpus_total: 12,
        healthy: true,
        load: 0.4,
        job_util: BTreeMap::new(),
        coordinate: Some(vec![0; 32]),
        sent_at_ms: 0,
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let process_start = window(&[]);
    let mut nodes = Vec::with_capacity(args.nodes);
    for _ in 0..args.nodes {
        let mut config = GossipConfig::new(Keypair::generate_ed25519(), "127.0.0.1:0".parse()?);
        config.heartbeat = args.heartbeat;
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
    let mesh_started = Instant::now();
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
        if mesh_started.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "mesh not formed after 120 s ({ready}/{} ready)",
                nodes.len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "{} nodes, heartbeat {:?}: mesh formed in {:.2} s",
        args.nodes,
        args.heartbeat,
        mesh_started.elapsed().as_secs_f64()
    );
    report("startup+mesh formation", &nodes, &process_start);

    let settle_start = window(&nodes);
    tokio::time::sleep(args.settle).await;
    report("settling (mesh GRAFT/PRUNE churn)", &nodes, &settle_start);

    let idle_start = window(&nodes);
    tokio::time::sleep(args.idle).await;
    report("idle (ping, gossipsub heartbeats)", &nodes, &idle_start);

    let load_start = window(&nodes);
    let mut seqs = vec![0u64; nodes.len()];
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut latencies = Vec::with_capacity(args.publications);
    let mut publish_failures = 0usize;
    for _ in 0..args.publications {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let publisher = (rng % nodes.len() as u64) as usize;
        seqs[publisher] += 1;
        let key = (publisher as u64, seqs[publisher]);
        let started = Instant::now();
        if let Err(e) = nodes[publisher]
            .handle
            .publish_capacity(&advert(key.0, key.1))
            .await
        {
            eprintln!("publish from node {publisher} failed: {e}");
            publish_failures += 1;
            continue;
        }
        let deadline = started + Duration::from_secs(10);
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
        match last {
            Some(last) => latencies.push(last.saturating_duration_since(started)),
            None => eprintln!("advert {key:?} did not reach every node within 10 s"),
        }
        tokio::time::sleep(args.interval).await;
    }
    let publishing = load_start.at.elapsed().as_secs_f64();
    report(
        &format!(
            "publishing ({} adverts, {:.1}/s aggregate)",
            args.publications,
            args.publications as f64 / publishing
        ),
        &nodes,
        &load_start,
    );
    latencies.sort();
    println!(
        "time for a change to reach all {others} other nodes: n={} p50 {:?} p90 {:?} p99 {:?} max {:?} (failed publishes: {publish_failures}, undelivered: {})",
        latencies.len(),
        percentile(&latencies, 50.0),
        percentile(&latencies, 90.0),
        percentile(&latencies, 99.0),
        latencies.last().copied().unwrap_or_default(),
        args.publications - publish_failures - latencies.len(),
    );
    let dropped: u64 = {
        let mut total = 0;
        for node in &nodes {
            total += node.handle.status().await?.dropped_events;
        }
        total
    };
    println!("dropped events: {dropped}");
    for node in &nodes {
        node.handle.shutdown().await?;
    }
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("usage: gossip_bench [--nodes N] [--publications N] [--interval-ms MS] [--idle-secs S] [--settle-secs S] [--heartbeat-ms MS]: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(args)) {
        eprintln!("gossip_bench failed: {e}");
        std::process::exit(1);
    }
}
