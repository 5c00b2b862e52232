//! Shared harness: N in-process gossip nodes on 127.0.0.1, each with a task
//! folding its events into an [`Observed`] record that tests poll.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shoal_mesh::gossip::Keypair;
use shoal_mesh::gossip::{
    CapacityAdvert, CapacityView, Gossip, GossipConfig, GossipEvent, GossipHandle, GossipStatus,
    RejectReason,
};
use shoal_mesh::gossip::{Multiaddr, PeerId};

/// Everything one node has observed so far.
#[derive(Default)]
pub struct Observed {
    pub view: CapacityView,
    /// (node_id, seq) -> when the advert first changed this node's view.
    pub arrivals: HashMap<(u64, u64), Instant>,
    pub heartbeats: Vec<(PeerId, u64, u64)>,
    pub rejected: Vec<(PeerId, RejectReason)>,
    pub rtts: Vec<(PeerId, Duration)>,
    pub connected: Vec<PeerId>,
    pub disconnected: Vec<PeerId>,
}

pub struct TestNode {
    pub handle: GossipHandle,
    pub observed: Arc<Mutex<Observed>>,
}

impl TestNode {
    pub fn observed(&self) -> MutexGuard<'_, Observed> {
        self.observed.lock().expect("observed lock")
    }

    pub fn peer_id(&self) -> PeerId {
        self.handle.local_peer_id()
    }
}

pub fn config(tweak: impl Fn(&mut GossipConfig)) -> GossipConfig {
    let mut config = GossipConfig::new(
        Keypair::generate_ed25519(),
        "127.0.0.1:0".parse().expect("loopback socket"),
    );
    tweak(&mut config);
    config
}

pub async fn start_node(config: GossipConfig) -> TestNode {
    let (handle, mut events) = Gossip::start(config).await.expect("gossip starts");
    let observed = Arc::new(Mutex::new(Observed::default()));
    let sink = observed.clone();
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let now = Instant::now();
            let mut o = sink.lock().expect("observed lock");
            match &event {
                GossipEvent::Capacity { advert, .. } => {
                    let key = (advert.node_id, advert.seq);
                    if o.view.apply_event(&event).changed() {
                        o.arrivals.entry(key).or_insert(now);
                    }
                }
                GossipEvent::Heartbeat {
                    from, node_id, seq, ..
                } => o.heartbeats.push((*from, *node_id, *seq)),
                GossipEvent::Rejected { from, reason } => o.rejected.push((*from, reason.clone())),
                GossipEvent::Rtt { peer, rtt } => o.rtts.push((*peer, *rtt)),
                GossipEvent::PeerConnected { peer } => o.connected.push(*peer),
                GossipEvent::PeerDisconnected { peer } => o.disconnected.push(*peer),
            }
        }
    });
    TestNode { handle, observed }
}

pub async fn start_nodes(n: usize, tweak: impl Fn(&mut GossipConfig)) -> Vec<TestNode> {
    let mut nodes = Vec::with_capacity(n);
    for _ in 0..n {
        nodes.push(start_node(config(&tweak)).await);
    }
    nodes
}

pub fn member_map(nodes: &[TestNode]) -> BTreeMap<PeerId, Multiaddr> {
    nodes
        .iter()
        .map(|n| (n.handle.local_peer_id(), n.handle.listen_multiaddr()))
        .collect()
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes.
pub async fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Async variant of [`wait_until`] for conditions that query the nodes.
pub async fn wait_until_async<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Hands every node the full member map and waits until every node is
/// connected to as many members as it dials (all others in a small group),
/// sees them subscribed to both topics and has a non-trivial gossipsub mesh.
pub async fn form_mesh(nodes: &[TestNode], timeout: Duration) {
    let members = member_map(nodes);
    for node in nodes {
        node.handle
            .set_members(members.clone())
            .await
            .expect("set_members");
    }
    let others = nodes.len() - 1;
    // gossipsub's mesh_n_low: below it a heartbeat grafts more peers.
    let min_mesh = others.min(3);
    let ready = wait_until_async(timeout, || async {
        for node in nodes {
            let s = node.handle.status().await.expect("status");
            if !mesh_ready(&s, others, min_mesh) {
                return false;
            }
        }
        true
    })
    .await;
    if !ready {
        let mut report = String::new();
        for (i, node) in nodes.iter().enumerate() {
            report.push_str(&format!("node {i}: {:?}\n", node.handle.status().await));
        }
        panic!("mesh did not form within {timeout:?}:\n{report}");
    }
}

fn mesh_ready(s: &GossipStatus, others: usize, min_mesh: usize) -> bool {
    // Each node dials `target_member_connections` (8) members and is dialled
    // by others, so in a larger group it need not reach every one itself.
    let wanted = others.min(shoal_mesh::gossip::DIALLED_MEMBERS);
    s.connected_members >= wanted
        && s.capacity_topic_peers == s.connected_members
        && s.heartbeat_topic_peers == s.connected_members
        && s.capacity_mesh_peers >= min_mesh
        && s.heartbeat_mesh_peers >= min_mesh
}

pub fn advert(node_id: u64, seq: u64, free: u32) -> CapacityAdvert {
    CapacityAdvert {
        node_id,
        seq,
        gpus_free_by_model: BTreeMap::from([("H100".to_string(), free)]),
        gpus_total: 8,
        healthy: true,
        load: 0.5,
        job_util: BTreeMap::new(),
        coordinate: Some(vec![0; 16]),
        sent_at_ms: 0,
    }
}

/// Publishes, retrying briefly if gossipsub has not yet learnt subscriptions.
pub async fn publish(node: &TestNode, advert: &CapacityAdvert) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match node.handle.publish_capacity(advert).await {
            Ok(()) => return,
            Err(e) if Instant::now() < deadline => {
                eprintln!("publish retry: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("publish failed: {e}"),
        }
    }
}

pub async fn shutdown_all(nodes: &[TestNode]) {
    for node in nodes {
        node.handle.shutdown().await.expect("clean shutdown");
    }
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
