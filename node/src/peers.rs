//! This node's view of its peers: the gossip loop (`workers::gossip`)
//! feeds it capacity adverts and RTT samples, and while this node leads,
//! the members' lease renewals and Raft answers. From them the node keeps
//!
//! - while it leads, a failure detector (phi accrual + Lifeguard local
//!   health) per member, fed by the renewals every member sends it several
//!   times a second; the leader turns its verdicts into ledger states
//!   (`reconcile`), from which every other node learns them. Only the
//!   leader judges, so no node hears from every other: a member's cost
//!   does not grow with the pool (heartbeats gossiped all to all did);
//! - Vivaldi network coordinates (its own, and every member's from their
//!   adverts), so any node can estimate the RTT between any two members;
//! - the latest capacity advert of every member.
//!
//! A newly elected leader starts its detector afresh: every member the
//! ledger holds alive or suspect as if just heard (its renewals arrive
//! within a renewal period), a member held down only once heard again —
//! so a leader change never revives a dead node, and a node that died with
//! the old leader is found a suspicion timeout later.

use shoal_consensus::NodeId;
use shoal_mesh::failure_detector::{FailureDetector, FailureDetectorConfig, PeerState, Transition};
use shoal_mesh::gossip::CapacityView;
use shoal_mesh::vivaldi::{estimate_rtt, Coordinate, VivaldiClient, VivaldiConfig};
use shoal_sdk::MemberState;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use shoal_mesh::gossip::{Multiaddr, PeerId};

/// How often a member renews its lease on the leader: the interval the
/// leader's detector expects between a live member's signs of life.
pub const RENEW_EVERY: Duration = Duration::from_millis(200);
/// How often a node re-publishes its capacity when nothing changed (a
/// change is published at once) in a pool of up to
/// `CAPACITY_EVERY / POOL_REFRESH_SPACING` members (see [`refresh_period`]),
/// and during a node's first few adverts in any pool, so that a new member
/// is known soon even if its first advert went out before its gossip
/// connections were up.
pub const CAPACITY_EVERY: Duration = Duration::from_secs(5);
/// On average, the whole pool publishes one unchanged advert per this
/// spacing. Every member receives every advert, so with a fixed period each
/// node's cost would grow with the pool; spreading the refreshes instead
/// keeps it flat (as Nomad spaces its clients' heartbeats by the region's
/// size). A refresh only repairs an advert lost while a member was cut off
/// (gossipsub itself repairs one lost in flight, within its 5 s history)
/// and moves a coordinate: liveness does not ride on it, and a change is
/// never held back. One every 2 s (it was two a second) cut an idle
/// relayed member's gossip bytes about 6× and its CPU about a third
/// (BENCHMARKS.md, "Seventh run").
pub const POOL_REFRESH_SPACING: Duration = Duration::from_secs(2);

/// The refresh period of each member's advert in a pool of `members`.
pub fn refresh_period(members: usize) -> Duration {
    let members = u32::try_from(members).unwrap_or(u32::MAX);
    CAPACITY_EVERY.max(POOL_REFRESH_SPACING.saturating_mul(members))
}

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
    /// This node leads, so its detector judges the members.
    judging: bool,
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
                    heartbeat_interval: RENEW_EVERY,
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
            judging: false,
        }
    }

    /// A sign of life from `node`: a gossip message, or, on the leader,
    /// a lease renewal or a Raft answer.
    pub fn heard(&mut self, node: NodeId, now: Instant) {
        self.last_heard.insert(node, now);
        if !self.judging {
            return;
        }
        if self.detector.state(&node).is_none() {
            self.unheard_since.remove(&node);
            self.detector.add_peer(node, now);
        }
        self.detector.heartbeat(&node, now);
    }

    /// Whether this node's detector judges the members (it leads).
    pub fn judging(&self) -> bool {
        self.judging
    }

    /// The state this node's detector gives a member (none where this
    /// node does not lead).
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
    /// (this node excluded) and their ledger states, `judging` while this
    /// node leads: new members get `JOIN_GRACE` before they are counted,
    /// removed ones are forgotten. Returns the state changes.
    pub fn tick(
        &mut self,
        members: &[(NodeId, PeerId, MemberState)],
        judging: bool,
        expected_tick: Duration,
        now: Instant,
    ) -> Vec<Transition<NodeId>> {
        let expected = self.last_tick + expected_tick;
        self.detector.observe_own_tick(expected, now);
        self.last_tick = now;
        self.node_of_peer = members.iter().map(|(id, peer, _)| (*peer, *id)).collect();
        if judging != self.judging {
            self.judging = judging;
            let known: Vec<NodeId> = self.detector.peers().map(|(k, _)| *k).collect();
            for k in known {
                self.detector.remove_peer(&k);
            }
            self.unheard_since.clear();
            if judging {
                for (id, _, state) in members {
                    if *state != MemberState::Down {
                        self.detector.add_peer(*id, now);
                    }
                }
            }
        }
        let member_ids: HashSet<NodeId> = members.iter().map(|(id, _, _)| *id).collect();
        if !judging {
            self.forget_removed(&member_ids);
            return Vec::new();
        }
        for (id, _, _) in members {
            if self.detector.state(id).is_none() {
                let since = *self.unheard_since.entry(*id).or_insert(now);
                if now.duration_since(since) >= JOIN_GRACE {
                    self.unheard_since.remove(id);
                    self.detector.add_peer(*id, since);
                }
            }
        }
        let gone: Vec<NodeId> = self
            .detector
            .peers()
            .map(|(k, _)| *k)
            .filter(|k| !member_ids.contains(k))
            .collect();
        for k in gone {
            self.detector.remove_peer(&k);
        }
        self.unheard_since.retain(|id, _| member_ids.contains(id));
        self.forget_removed(&member_ids);
        self.detector.tick(now)
    }

    /// Forgets the adverts and contact times of nodes no longer members.
    fn forget_removed(&mut self, members: &HashSet<NodeId>) {
        let gone: Vec<NodeId> = self
            .last_heard
            .keys()
            .copied()
            .filter(|k| !members.contains(k))
            .collect();
        for k in gone {
            self.capacity.remove(k);
            self.last_heard.remove(&k);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_leader_judges_and_a_new_leader_never_revives_a_dead_member() {
        let t0 = Instant::now();
        let mut v = PeerView::new(t0, Duration::from_secs(2), BTreeMap::new());
        let (alive, dead) = (PeerId::random(), PeerId::random());
        let members = [(2, alive, MemberState::Alive), (3, dead, MemberState::Down)];
        let tick = Duration::from_millis(100);
        let mut now = t0;
        // Not leading: heard or not, no verdicts.
        v.heard(2, now);
        assert!(v.tick(&members, false, tick, now).is_empty());
        assert_eq!((v.state(2), v.state(3)), (None, None));
        assert!(
            v.last_heard.contains_key(&2),
            "adverts still count as heard"
        );
        // Leading from now: the live member starts alive as if just heard,
        // the one the ledger holds down stays unjudged until heard.
        now += tick;
        v.tick(&members, true, tick, now);
        assert_eq!((v.state(2), v.state(3)), (Some(MemberState::Alive), None));
        // Member 2 renews; member 3 comes back and is heard.
        for _ in 0..50 {
            now += tick;
            v.heard(2, now);
            v.tick(&members, true, tick, now);
        }
        assert_eq!(v.state(2), Some(MemberState::Alive));
        assert_eq!(v.state(3), None);
        v.heard(3, now);
        assert_eq!(v.state(3), Some(MemberState::Alive));
        // Member 2 falls silent: down within seconds.
        let mut went_down = None;
        for i in 0..100 {
            now += tick;
            v.heard(3, now);
            if v.tick(&members, true, tick, now)
                .iter()
                .any(|t| t.peer == 2 && t.to == PeerState::Down)
            {
                went_down = Some(i);
                break;
            }
        }
        assert!(went_down.is_some_and(|i| i <= 60), "{went_down:?}");
        // Leadership lost: the detector forgets.
        now += tick;
        assert!(v.tick(&members, false, tick, now).is_empty());
        assert_eq!((v.state(2), v.state(3)), (None, None));
    }

    #[test]
    fn the_pool_refreshes_its_adverts_at_a_bounded_rate() {
        assert_eq!(refresh_period(1), CAPACITY_EVERY);
        assert_eq!(refresh_period(2), CAPACITY_EVERY);
        assert_eq!(refresh_period(3), Duration::from_secs(6));
        for members in [3, 11, 500, 5_000] {
            let pool_rate = members as f64 / refresh_period(members).as_secs_f64();
            assert!(
                pool_rate <= 1.0 / POOL_REFRESH_SPACING.as_secs_f64() + 1e-9,
                "{members}: {pool_rate}"
            );
        }
        assert_eq!(refresh_period(5_000), Duration::from_secs(10_000));
        assert!(refresh_period(usize::MAX) > Duration::from_secs(1 << 32));
    }
}
