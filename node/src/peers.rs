//! This node's view of its peers, kept without asking anyone: the gossip
//! loop (`workers::gossip`) feeds it heartbeats, capacity adverts and RTT
//! samples; from them the node keeps
//!
//! - a failure detector (phi accrual + Lifeguard local health) per member,
//!   so every node — not only the leader — knows within seconds who is gone,
//!   and a newly elected leader already has a history to decide from;
//! - Vivaldi network coordinates (its own, and every member's from their
//!   adverts), so any node can estimate the RTT between any two members;
//! - the latest capacity advert of every member.
//!
//! The leader turns the detector's verdicts into ledger states (`reconcile`).

use shoal_consensus::NodeId;
use shoal_mesh::failure_detector::{FailureDetector, FailureDetectorConfig, PeerState, Transition};
use shoal_mesh::gossip::CapacityView;
use shoal_mesh::vivaldi::{estimate_rtt, Coordinate, VivaldiClient, VivaldiConfig};
use shoal_sdk::MemberState;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use shoal_mesh::gossip::{Multiaddr, PeerId};

/// How often a node says it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(200);
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
    fn new(
        now: Instant,
        suspicion_timeout: Duration,
        injected_rtt: BTreeMap<String, Duration>,
    ) -> Self {
        PeerView {
            detector: FailureDetector::new(
                FailureDetectorConfig {
                    heartbeat_interval: HEARTBEAT_EVERY,
                    suspicion_timeout,
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

    /// The member a gossip peer id belongs to.
    pub fn node_of(&self, peer: &PeerId) -> Option<NodeId> {
        self.node_of_peer.get(peer).copied()
    }

    /// Test-only extra RTT towards the member named `name`.
    pub fn injected_rtt_to(&self, name: &str) -> Duration {
        self.injected_rtt.get(name).copied().unwrap_or_default()
    }

    /// One tick of the detector's clock with the ledger's current members
    /// (this node excluded): new members get `JOIN_GRACE` before they are
    /// counted, removed ones are forgotten. Returns the state changes.
    pub fn tick(
        &mut self,
        members: &[(NodeId, PeerId)],
        expected_tick: Duration,
        now: Instant,
    ) -> Vec<Transition<NodeId>> {
        let expected = self.last_tick + expected_tick;
        self.detector.observe_own_tick(expected, now);
        self.last_tick = now;
        self.node_of_peer = members.iter().map(|(id, peer)| (*peer, *id)).collect();
        for (id, _) in members {
            if self.detector.state(id).is_none() {
                let since = *self.unheard_since.entry(*id).or_insert(now);
                if now.duration_since(since) >= JOIN_GRACE {
                    self.unheard_since.remove(id);
                    self.detector.add_peer(*id, since);
                }
            }
        }
        let known: Vec<NodeId> = self.detector.peers().map(|(k, _)| *k).collect();
        for k in known {
            if !members.iter().any(|(id, _)| *id == k) {
                self.detector.remove_peer(&k);
                self.capacity.remove(k);
                self.last_heard.remove(&k);
            }
        }
        self.unheard_since
            .retain(|id, _| members.iter().any(|(m, _)| m == id));
        self.detector.tick(now)
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

pub fn new_view(
    suspicion_timeout: Duration,
    injected_rtt: BTreeMap<String, Duration>,
) -> SharedPeerView {
    Arc::new(Mutex::new(PeerView::new(
        Instant::now(),
        suspicion_timeout,
        injected_rtt,
    )))
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
