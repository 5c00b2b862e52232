//! This node's view of its peers, kept without asking anyone: the gossip
//! runtime (libp2p, `shoal_mesh::gossip`) delivers heartbeats, capacity
//! adverts and RTT samples; from them the node keeps
//!
//! - a failure detector (phi accrual + Lifeguard local health) per member,
//!   so every node — not only the leader — knows within seconds who is gone,
//!   and a newly elected leader already has a history to decide from;
//! - Vivaldi network coordinates (its own, and every member's from their
//!   adverts), so any node can estimate the RTT between any two members;
//! - the latest capacity advert of every member.
//!
//! The leader turns the detector's verdicts into ledger states (`reconcile`).

use crate::agent::{wall_ms, Inner};
use shoal_consensus::NodeId;
use shoal_mesh::failure_detector::{FailureDetector, FailureDetectorConfig, PeerState};
use shoal_mesh::gossip::{CapacityAdvert, CapacityView, GossipEvent, GossipHandle};
use shoal_mesh::vivaldi::{estimate_rtt, Coordinate, VivaldiClient, VivaldiConfig};
use shoal_sdk::MemberState;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

pub use shoal_mesh::gossip::{Multiaddr, PeerId};

/// How often a node says it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(200);
/// How often a node re-publishes its capacity when nothing changed.
const CAPACITY_EVERY: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(100);
/// Time a new member has to be heard from before the detector counts it.
const JOIN_GRACE: Duration = Duration::from_secs(10);

pub struct PeerView {
    pub detector: FailureDetector<NodeId>,
    pub vivaldi: VivaldiClient<NodeId>,
    pub capacity: CapacityView,
    pub last_heard: HashMap<NodeId, Instant>,
    /// Members not heard from yet, and since when they are members: a
    /// joining node gets `JOIN_GRACE` to bring its gossip up before the
    /// detector starts counting.
    unheard_since: HashMap<NodeId, Instant>,
    node_of_peer: BTreeMap<PeerId, NodeId>,
    /// Test-only extra RTT per peer, to emulate distance on one machine.
    injected_rtt: BTreeMap<String, Duration>,
    last_tick: Instant,
}

impl PeerView {
    fn new(now: Instant, injected_rtt: BTreeMap<String, Duration>) -> Self {
        PeerView {
            detector: FailureDetector::new(
                FailureDetectorConfig {
                    heartbeat_interval: HEARTBEAT_EVERY,
                    ..FailureDetectorConfig::default()
                },
                now,
            ),
            vivaldi: default_vivaldi(),
            capacity: CapacityView::new(),
            last_heard: HashMap::new(),
            unheard_since: HashMap::new(),
            node_of_peer: BTreeMap::new(),
            injected_rtt,
            last_tick: now,
        }
    }

    /// A sign of life from `node` (gossip message, or a Raft ack seen by the leader).
    pub fn heard(&mut self, node: NodeId, now: Instant) {
        if self.unheard_since.remove(&node).is_some() {
            self.detector.add_peer(node, now);
        }
        self.detector.heartbeat(&node, now);
        self.last_heard.insert(node, now);
    }

    /// The state this node's detector gives a member.
    pub fn state(&self, node: NodeId) -> Option<MemberState> {
        self.detector.state(&node).map(|s| match s {
            PeerState::Alive => MemberState::Alive,
            PeerState::Suspect => MemberState::Suspect,
            PeerState::Down => MemberState::Down,
        })
    }

    pub fn coordinate_of(&self, node: NodeId, me: NodeId) -> Option<Coordinate> {
        if node == me {
            return Some(self.vivaldi.coordinate().clone());
        }
        let bytes = self.capacity.get(node)?.coordinate.as_ref()?;
        bincode::deserialize(bytes).ok()
    }

    /// Estimated RTT between two members from their coordinates.
    pub fn estimated_rtt(&self, a: NodeId, b: NodeId, me: NodeId) -> Option<Duration> {
        Some(estimate_rtt(
            &self.coordinate_of(a, me)?,
            &self.coordinate_of(b, me)?,
        ))
    }
}

fn default_vivaldi() -> VivaldiClient<NodeId> {
    // Serf's defaults are valid by construction (a unit test of the vivaldi
    // module checks it), so a failure here is a programming error.
    VivaldiClient::new(VivaldiConfig::default()).expect("Vivaldi's default configuration is valid")
}

pub type SharedPeerView = Arc<Mutex<PeerView>>;

pub fn new_view(injected_rtt: BTreeMap<String, Duration>) -> SharedPeerView {
    Arc::new(Mutex::new(PeerView::new(Instant::now(), injected_rtt)))
}

/// Runs the node's side of the gossip: member sync, heartbeats, adverts,
/// event handling and the detector's clock.
pub fn spawn(
    inner: Weak<Inner>,
    handle: GossipHandle,
    events: mpsc::Receiver<GossipEvent>,
    view: SharedPeerView,
    shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(handle_events(
        inner.clone(),
        events,
        view.clone(),
        shutdown.clone(),
    ));
    tokio::spawn(publish_and_sync(inner, handle, view, shutdown));
}

async fn handle_events(
    inner: Weak<Inner>,
    mut events: mpsc::Receiver<GossipEvent>,
    view: SharedPeerView,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let event = tokio::select! {
            e = events.recv() => match e { Some(e) => e, None => return },
            _ = shutdown.changed() => return,
        };
        let Some(inner) = inner.upgrade() else { return };
        let now = Instant::now();
        let Ok(mut v) = view.lock() else { return };
        match event {
            GossipEvent::Heartbeat { from, node_id, .. } => {
                if v.node_of_peer.get(&from) == Some(&node_id) {
                    count_message(&inner, "heartbeat");
                    v.heard(node_id, now);
                }
            }
            GossipEvent::Capacity { from, advert } => {
                if v.node_of_peer.get(&from) == Some(&advert.node_id) {
                    count_message(&inner, "capacity");
                    let delay_ms = wall_ms().saturating_sub(advert.sent_at_ms);
                    inner
                        .metrics
                        .gossip_advert_delay
                        .observe(delay_ms as f64 / 1000.0);
                    let node = advert.node_id;
                    v.capacity.apply(from, advert);
                    v.heard(node, now);
                }
            }
            GossipEvent::Rtt { peer, rtt } => {
                let Some(&node) = v.node_of_peer.get(&peer) else {
                    continue;
                };
                let extra = inner
                    .name_of(node)
                    .and_then(|name| v.injected_rtt.get(&name).copied())
                    .unwrap_or_default();
                let Some(coord) = v.coordinate_of(node, u64::MAX) else {
                    continue;
                };
                if let Err(e) = v.vivaldi.update(&node, &coord, rtt + extra) {
                    tracing::debug!(node, error = %e, "ignored an RTT sample");
                }
            }
            GossipEvent::Rejected { from, reason } => {
                inner.metrics.gossip_rejected.inc();
                tracing::warn!(peer = %from, %reason, "rejected a gossip message");
            }
            GossipEvent::PeerConnected { .. } | GossipEvent::PeerDisconnected { .. } => {}
        }
    }
}

async fn publish_and_sync(
    inner: Weak<Inner>,
    handle: GossipHandle,
    view: SharedPeerView,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Receivers drop messages whose seq is not above the last one they saw
    // from a node, so sequence numbers must keep growing across restarts:
    // start from the wall clock in milliseconds (they advance by one per
    // message, far slower than the clock).
    let mut heartbeat_seq = wall_ms();
    let mut capacity_seq = wall_ms();
    let mut last_heartbeat = Instant::now() - HEARTBEAT_EVERY;
    let mut last_capacity: Option<(Instant, CapacityAdvert)> = None;
    let mut members_sent: BTreeMap<PeerId, Multiaddr> = BTreeMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => {
                let _ = handle.shutdown().await;
                return;
            }
        }
        let Some(inner) = inner.upgrade() else { return };
        let now = Instant::now();

        // Members from the ledger.
        let members = inner.gossip_members();
        if let Ok(mut v) = view.lock() {
            let expected = v.last_tick + TICK;
            v.detector.observe_own_tick(expected, now);
            v.last_tick = now;
            v.node_of_peer = members.iter().map(|(id, peer, _)| (*peer, *id)).collect();
            for (id, ..) in &members {
                if v.detector.state(id).is_none() {
                    let since = *v.unheard_since.entry(*id).or_insert(now);
                    if now.duration_since(since) >= JOIN_GRACE {
                        v.unheard_since.remove(id);
                        v.detector.add_peer(*id, since);
                    }
                }
            }
            let known: Vec<NodeId> = v.detector.peers().map(|(k, _)| *k).collect();
            for k in known {
                if !members.iter().any(|(id, ..)| *id == k) {
                    v.detector.remove_peer(&k);
                    v.capacity.remove(k);
                    v.last_heard.remove(&k);
                }
            }
            v.unheard_since
                .retain(|id, _| members.iter().any(|(m, ..)| m == id));
            for t in v.detector.tick(now) {
                let to = match t.to {
                    PeerState::Alive => "alive",
                    PeerState::Suspect => "suspect",
                    PeerState::Down => "down",
                };
                inner
                    .metrics
                    .fd_transitions
                    .get_or_create(&vec![("to".into(), to.into())])
                    .inc();
                tracing::info!(node = t.peer, from = ?t.from, to = ?t.to, "peer state changed (local view)");
            }
        }
        let traffic = handle.traffic();
        for (direction, total) in [("in", traffic.bytes_in), ("out", traffic.bytes_out)] {
            let counter = inner
                .metrics
                .gossip_bytes
                .get_or_create(&vec![("direction".into(), direction.into())]);
            let seen = counter.get();
            if total > seen {
                counter.inc_by(total - seen);
            }
        }
        let wanted: BTreeMap<PeerId, Multiaddr> =
            members.iter().map(|(_, p, a)| (*p, a.clone())).collect();
        if wanted != members_sent && handle.set_members(wanted.clone()).await.is_ok() {
            members_sent = wanted;
        }

        if now.duration_since(last_heartbeat) >= HEARTBEAT_EVERY {
            heartbeat_seq += 1;
            last_heartbeat = now;
            if let Err(e) = handle
                .publish_heartbeat(inner.id, heartbeat_seq, wall_ms())
                .await
            {
                tracing::trace!(error = %e, "heartbeat not published");
            }
        }

        let mut advert = inner.capacity_advert();
        if let Ok(v) = view.lock() {
            advert.coordinate = bincode::serialize(v.vivaldi.coordinate()).ok();
        }
        let due = match &last_capacity {
            None => true,
            Some((at, prev)) => {
                now.duration_since(*at) >= CAPACITY_EVERY
                    || prev.gpus_free_by_model != advert.gpus_free_by_model
                    || prev.healthy != advert.healthy
                    || job_util_moved(&prev.job_util, &advert.job_util)
            }
        };
        if due {
            capacity_seq += 1;
            advert.seq = capacity_seq;
            advert.sent_at_ms = wall_ms();
            if let Err(e) = handle.publish_capacity(&advert).await {
                tracing::trace!(error = %e, "capacity advert not published");
            }
            last_capacity = Some((now, advert));
        }
    }
}

fn count_message(inner: &Inner, topic: &str) {
    inner
        .metrics
        .gossip_messages
        .get_or_create(&vec![("topic".into(), topic.into())])
        .inc();
}

/// Utilization change (percentage points) of a job's GPUs that is worth an
/// advert before the periodic one: enough to show a straggler within a
/// sampling period, not so little that noise floods the topic.
const JOB_UTIL_STEP: f32 = 15.0;

fn job_util_moved(before: &BTreeMap<u64, f32>, now: &BTreeMap<u64, f32>) -> bool {
    before.len() != now.len()
        || now.iter().any(|(job, u)| {
            before
                .get(job)
                .is_none_or(|b| (b - u).abs() >= JOB_UTIL_STEP)
        })
}

/// Parses the test-only RTT injection, `NAME=MS,NAME=MS` (extra round-trip
/// time added to samples towards that peer).
pub fn parse_injected_rtt(spec: &str) -> Result<BTreeMap<String, Duration>, String> {
    let mut out = BTreeMap::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, ms) = part
            .split_once('=')
            .ok_or_else(|| format!("invalid RTT injection '{part}': expected NAME=MS"))?;
        let ms: f64 = ms
            .parse()
            .map_err(|_| format!("invalid RTT injection '{part}': {ms} is not a number"))?;
        if !(0.0..=10_000.0).contains(&ms) {
            return Err(format!("invalid RTT injection '{part}': 0-10000 ms"));
        }
        out.insert(name.to_string(), Duration::from_secs_f64(ms / 1000.0));
    }
    Ok(out)
}
