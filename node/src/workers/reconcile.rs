//! The leader's housekeeping loop. Only the leader acts; every other node's
//! loop idles. Each tick it:
//!
//! 1. commits the member states (alive/suspect/down) of its own failure
//!    detector — fed by gossip heartbeats on every node, and on the leader
//!    also by Raft acknowledgements — so every node agrees;
//! 2. makes sure every ledger member is at least a Raft learner — or,
//!    once every member speaks `replicas::SINCE_PROTOCOL`, that a bounded
//!    set of members are (`shoal_consensus::replicas`), the others
//!    following the log from them;
//! 3. converges the voter set to the pure policy in `shoal_consensus::voters`
//!    (3 or 5 voters across failure domains, dead voters replaced after
//!    `membership.voter_replace_after_ms`).

use crate::ledger_client::LedgerClient;
use crate::peers::SharedPeerView;
use crate::worker::Worker;
use openraft::{BasicNode, ChangeMembers, ServerState};
use shoal_consensus::network::ContactTracker;
use shoal_consensus::replicas::{self, choose_learners, ReplicaCandidate};
use shoal_consensus::voters::{change_keeps_a_quorum, choose_voters, VoterCandidate};
use shoal_consensus::{Command, NodeId};
use shoal_sdk::MemberState;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_millis(100);

/// Leader-local bookkeeping; rebuilt whenever this node becomes leader so a
/// new term never inherits a stale view.
struct LeaderView {
    term: u64,
    fed_until: HashMap<NodeId, Instant>,
    down_since: HashMap<NodeId, Instant>,
}

/// The leader's housekeeping loop and its handles.
pub struct Housekeeping {
    ledger: LedgerClient,
    peers: SharedPeerView,
    contacts: ContactTracker,
    /// How long a voter may be down before it is replaced.
    replace_after: Duration,
    /// A member answers the leader when its last Raft reply is this recent.
    answer_within: Duration,
    view: Option<LeaderView>,
}

impl Housekeeping {
    pub fn new(
        ledger: LedgerClient,
        peers: SharedPeerView,
        contacts: ContactTracker,
        replace_after: Duration,
        answer_within: Duration,
    ) -> Self {
        Housekeeping {
            ledger,
            peers,
            contacts,
            replace_after,
            answer_within,
            view: None,
        }
    }
}

impl Worker for Housekeeping {
    fn period(&self) -> Duration {
        if self.ledger.is_leader() {
            TICK
        } else {
            crate::worker::OFF_LEADER_PERIOD
        }
    }

    fn wakeup(&self) -> crate::worker::Wakeup {
        crate::worker::Wakeup::on_leadership(self.ledger.raft())
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let me = self.ledger.me();
        let (is_leader, term) = {
            let m = self.ledger.raft_metrics();
            let m = m.borrow();
            (
                m.state == ServerState::Leader && m.current_leader == Some(me),
                m.current_term,
            )
        };
        if !is_leader {
            self.view = None;
            return ControlFlow::Continue(());
        }
        let now = Instant::now();
        let mut view = match self.view.take() {
            Some(v) if v.term == term => v,
            _ => LeaderView {
                term,
                fed_until: HashMap::new(),
                down_since: HashMap::new(),
            },
        };
        if let Err(e) = self.tick_as_leader(&mut view, now).await {
            tracing::debug!(error = %e, "leader housekeeping will retry");
        }
        self.view = Some(view);
        ControlFlow::Continue(())
    }
}

/// What housekeeping needs of a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRow {
    pub id: NodeId,
    pub state: MemberState,
    pub rpc_addr: String,
    pub zone: Option<String>,
    pub rack: Option<String>,
    /// Admitted with a voter join token (or a member from before such
    /// tokens): only these may vote.
    pub voter_eligible: bool,
}

/// The member states to commit: this node is alive (it is running this),
/// every other member is what this node's detector says (unchanged where
/// the detector does not judge it).
pub fn plan_liveness(
    members: &[MemberRow],
    me: NodeId,
    detected: impl Fn(NodeId) -> Option<MemberState>,
) -> Vec<(NodeId, MemberState)> {
    members
        .iter()
        .filter_map(|m| {
            // A member the detector does not judge (yet) keeps its state:
            // one in its grace after joining is alive from admission, and
            // one held down stays down until it is heard again — a leader
            // that has only just started judging revives no one.
            let want = if m.id == me {
                MemberState::Alive
            } else {
                detected(m.id)?
            };
            (want != m.state).then_some((m.id, want))
        })
        .collect()
}

/// The Raft membership as housekeeping sees it.
#[derive(Clone, Debug, Default)]
pub struct RaftMembers {
    pub voters: BTreeSet<NodeId>,
    /// Voters and learners.
    pub nodes: BTreeSet<NodeId>,
}

/// One membership change; housekeeping makes at most one per tick, so
/// changes never overlap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipStep {
    /// Members that left are still in Raft: drop them (as voters first).
    RemoveLeft {
        voters: BTreeSet<NodeId>,
        nodes: BTreeSet<NodeId>,
    },
    /// A member is not in Raft yet: add it as a learner.
    AddLearner { id: NodeId, rpc_addr: String },
    /// Converge the voters to the policy's choice.
    ReplaceVoters(BTreeSet<NodeId>),
    /// Learners beyond the bounded replicas: out of Raft, to follow the
    /// log from a replica.
    RemoveLearners(BTreeSet<NodeId>),
}

/// The next membership change, if any. `left` are the Raft nodes the ledger
/// says left; `down_for` how long each member has been down (on this
/// leader's watch); `answering` the members whose Raft replies reach this
/// leader now (itself included). A voter counts as healthy until it has
/// been down for `replace_after`; a learner only while alive and
/// answering. A new voter set is proposed only while a majority of both
/// it and the current set answers, since a joint configuration that
/// cannot commit cannot be taken back either. With `learner_target`
/// (every member speaks the relay's protocol), only that many members
/// beside the voters stay in Raft; without it, every member does.
#[allow(clippy::too_many_arguments)]
pub fn plan_membership(
    members: &[MemberRow],
    raft: &RaftMembers,
    left: &BTreeSet<NodeId>,
    down_for: impl Fn(NodeId) -> Option<Duration>,
    answering: &BTreeSet<NodeId>,
    replace_after: Duration,
    me: NodeId,
    learner_target: Option<usize>,
) -> Option<MembershipStep> {
    if !left.is_empty() {
        return Some(MembershipStep::RemoveLeft {
            voters: left.intersection(&raft.voters).copied().collect(),
            nodes: left.clone(),
        });
    }
    let learners = learner_target.map(|target| {
        let candidates: Vec<ReplicaCandidate> = members
            .iter()
            .map(|m| {
                let is_learner = raft.nodes.contains(&m.id) && !raft.voters.contains(&m.id);
                // A learner keeps its place until it is down (a moment of
                // silence churns no membership); a member takes one only
                // while alive.
                let healthy = if is_learner {
                    m.state != MemberState::Down
                } else {
                    m.state == MemberState::Alive
                };
                ReplicaCandidate {
                    id: m.id,
                    zone: m.zone.clone(),
                    healthy,
                    is_learner,
                    voter_eligible: m.voter_eligible,
                }
            })
            .collect();
        choose_learners(&candidates, &raft.voters, target)
    });
    let wanted_in_raft = |id: NodeId| learners.as_ref().is_none_or(|l| l.contains(&id));
    if let Some(m) = members
        .iter()
        .find(|m| !raft.nodes.contains(&m.id) && wanted_in_raft(m.id))
    {
        return Some(MembershipStep::AddLearner {
            id: m.id,
            rpc_addr: m.rpc_addr.clone(),
        });
    }
    // A node admitted with an ordinary join token never votes, so it never
    // holds the CA key either; a voter that may not vote is replaced.
    let candidates: Vec<VoterCandidate> = members
        .iter()
        .filter(|m| raft.nodes.contains(&m.id) && (m.voter_eligible || m.id == me))
        .map(|m| {
            let is_voter = raft.voters.contains(&m.id);
            let healthy = if m.id == me {
                true
            } else if is_voter {
                down_for(m.id).is_none_or(|d| d < replace_after)
            } else {
                m.state == MemberState::Alive && answering.contains(&m.id)
            };
            VoterCandidate {
                id: m.id,
                zone: m.zone.clone(),
                rack: m.rack.clone(),
                healthy,
                is_voter,
            }
        })
        .collect();
    if let Some(desired) = choose_voters(&candidates, me).filter(|d| *d != raft.voters) {
        if let Err(risk) = change_keeps_a_quorum(&raft.voters, &desired, answering) {
            tracing::debug!(from = ?raft.voters, to = ?desired, %risk, "voter change waits");
            return None;
        }
        return Some(MembershipStep::ReplaceVoters(desired));
    }
    let surplus: BTreeSet<NodeId> = raft
        .nodes
        .iter()
        .copied()
        .filter(|id| !raft.voters.contains(id) && *id != me && !wanted_in_raft(*id))
        .collect();
    (!surplus.is_empty()).then_some(MembershipStep::RemoveLearners(surplus))
}

/// A Raft member whose address in the membership is not the one its
/// ledger record publishes (it restarted on another address, or was
/// restored from a backup with a guess of it). Raft, forwarded requests and
/// CA custody reach members at the membership's address, so it follows the
/// member's own record, one member per tick.
pub fn stale_address(
    members: &[MemberRow],
    raft_addr: impl Fn(NodeId) -> Option<String>,
) -> Option<(NodeId, String)> {
    members.iter().find_map(|m| {
        let published: std::net::SocketAddr = m.rpc_addr.parse().ok()?;
        let current = raft_addr(m.id)?;
        (current != m.rpc_addr && !published.ip().is_unspecified())
            .then(|| (m.id, m.rpc_addr.clone()))
    })
}

impl Housekeeping {
    async fn tick_as_leader(&self, v: &mut LeaderView, now: Instant) -> Result<(), String> {
        let me = self.ledger.me();
        let members: Vec<MemberRow> = {
            let d = self.ledger.read().map_err(|e| e.message)?;
            d.ledger
                .active_members()
                .map(|m| MemberRow {
                    id: m.id,
                    state: m.state,
                    rpc_addr: m.spec.rpc_addr.clone(),
                    zone: m.spec.labels.get("zone").cloned(),
                    rack: m.spec.labels.get("rack").cloned(),
                    voter_eligible: d.ledger.voter_eligibility.eligible(m.id),
                })
                .collect()
        };

        // 1. Liveness, from this node's gossip-fed detector; the Raft acks the
        // leader sees count as signs of life too.
        let desired_states = {
            let mut peers = self.peers.lock().map_err(|_| "peer view lock poisoned")?;
            for m in members.iter().filter(|m| m.id != me) {
                if let Some(t) = self.contacts.last_contact(m.id) {
                    if v.fed_until.get(&m.id).is_none_or(|prev| t > *prev) {
                        peers.heard(m.id, t);
                        v.fed_until.insert(m.id, t);
                    }
                }
                if peers.state(m.id) == Some(MemberState::Down) {
                    v.down_since.entry(m.id).or_insert(now);
                } else {
                    v.down_since.remove(&m.id);
                }
            }
            plan_liveness(&members, me, |id| peers.state(id))
        };
        for (id, state) in desired_states {
            self.ledger
                .write_local(Command::SetMemberState { id, state })
                .await
                .map_err(|e| e.to_string())?;
        }

        // 2. Every member is at least a learner, nodes that left are gone,
        // and 3. the voters follow the policy.
        let membership = self
            .ledger
            .raft_metrics()
            .borrow()
            .membership_config
            .membership()
            .clone();
        let raft = RaftMembers {
            voters: membership.voter_ids().collect(),
            nodes: membership.nodes().map(|(id, _)| *id).collect(),
        };
        let left: BTreeSet<NodeId> = {
            let d = self.ledger.read().map_err(|e| e.message)?;
            raft.nodes
                .iter()
                .copied()
                .filter(|id| d.ledger.members.get(id).map(|m| m.state) == Some(MemberState::Left))
                .collect()
        };
        let down_for = |id: NodeId| {
            v.down_since
                .get(&id)
                .map(|t| now.saturating_duration_since(*t))
        };
        let answering: BTreeSet<NodeId> =
            raft.nodes
                .iter()
                .copied()
                .filter(|id| {
                    *id == me
                        || self.contacts.last_contact(*id).is_some_and(|at| {
                            now.saturating_duration_since(at) <= self.answer_within
                        })
                })
                .collect();
        let learner_target = self
            .ledger
            .effective_protocol()
            .filter(|p| *p >= replicas::SINCE_PROTOCOL)
            .map(|_| replicas::learner_target(members.len()));
        let step = plan_membership(
            &members,
            &raft,
            &left,
            down_for,
            &answering,
            self.replace_after,
            me,
            learner_target,
        );
        match step {
            None => {
                let addr_of = |id: NodeId| membership.get_node(&id).map(|n| n.addr.clone());
                if let Some((id, addr)) = stale_address(&members, addr_of) {
                    tracing::info!(node = id, addr = %addr, "updating a member's Raft address to the one it publishes");
                    let nodes = BTreeMap::from([(id, BasicNode::new(addr))]);
                    self.ledger
                        .change_membership(ChangeMembers::SetNodes(nodes), false)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            Some(MembershipStep::RemoveLeft { voters, nodes }) => {
                if !voters.is_empty() {
                    self.ledger
                        .change_membership(ChangeMembers::RemoveVoters(nodes.clone()), false)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                self.ledger
                    .change_membership(ChangeMembers::RemoveNodes(nodes), false)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Some(MembershipStep::AddLearner { id, rpc_addr }) => {
                self.ledger
                    .add_learner(id, rpc_addr)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Some(MembershipStep::RemoveLearners(nodes)) => {
                tracing::info!(learners = ?nodes, "leaving learners beyond the bounded replicas to follow the log from one");
                self.ledger
                    .change_membership(ChangeMembers::RemoveNodes(nodes), false)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Some(MembershipStep::ReplaceVoters(desired)) => {
                tracing::info!(from = ?raft.voters, to = ?desired, "changing the voter set");
                self.ledger
                    .change_membership(ChangeMembers::ReplaceAllVoters(desired), true)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(id: NodeId, state: MemberState, zone: &str) -> MemberRow {
        MemberRow {
            id,
            state,
            rpc_addr: format!("127.0.0.1:{}", 7000 + id),
            zone: Some(zone.into()),
            rack: None,
            voter_eligible: true,
        }
    }

    fn ids(v: &[NodeId]) -> BTreeSet<NodeId> {
        v.iter().copied().collect()
    }

    const AFTER: Duration = Duration::from_secs(30);

    #[test]
    fn liveness_follows_the_detector_and_the_leader_is_alive() {
        let members = [
            row(1, MemberState::Suspect, "a"),
            row(2, MemberState::Alive, "b"),
            row(3, MemberState::Alive, "c"),
            row(4, MemberState::Down, "a"),
        ];
        let detected = |id| match id {
            2 => Some(MemberState::Down),
            3 => Some(MemberState::Alive),
            _ => None,
        };
        assert_eq!(
            plan_liveness(&members, 1, detected),
            vec![(1, MemberState::Alive), (2, MemberState::Down)],
            "member 4, down and not judged, stays down"
        );
    }

    #[test]
    fn members_that_left_go_first_then_learners_then_voters() {
        let members = [
            row(1, MemberState::Alive, "a"),
            row(2, MemberState::Alive, "b"),
        ];
        let raft = RaftMembers {
            voters: ids(&[1, 3]),
            nodes: ids(&[1, 3]),
        };
        assert_eq!(
            plan_membership(
                &members,
                &raft,
                &ids(&[3]),
                |_| None,
                &ids(&[1, 2]),
                AFTER,
                1,
                None
            ),
            Some(MembershipStep::RemoveLeft {
                voters: ids(&[3]),
                nodes: ids(&[3])
            })
        );
        let raft = RaftMembers {
            voters: ids(&[1]),
            nodes: ids(&[1]),
        };
        assert_eq!(
            plan_membership(
                &members,
                &raft,
                &BTreeSet::new(),
                |_| None,
                &ids(&[1, 2]),
                AFTER,
                1,
                None
            ),
            Some(MembershipStep::AddLearner {
                id: 2,
                rpc_addr: "127.0.0.1:7002".into()
            })
        );
    }

    /// Audit finding 1: a node that joined with an ordinary token is a
    /// learner for good, even when a voter is lost and it is the only
    /// healthy node left to replace it.
    #[test]
    fn a_node_admitted_as_a_learner_is_never_promoted() {
        let mut members = [
            row(1, MemberState::Alive, "a"),
            row(2, MemberState::Down, "b"),
            row(3, MemberState::Alive, "c"),
            row(4, MemberState::Alive, "d"),
            row(5, MemberState::Alive, "e"),
        ];
        members[3].voter_eligible = false;
        members[4].voter_eligible = false;
        let raft = RaftMembers {
            voters: ids(&[1, 2, 3]),
            nodes: ids(&[1, 2, 3, 4, 5]),
        };
        let none = BTreeSet::new();
        let long = |id| (id == 2).then_some(AFTER);
        let answering = ids(&[1, 3, 4, 5]);
        let step = plan_membership(&members, &raft, &none, long, &answering, AFTER, 1, None);
        assert!(
            !matches!(&step, Some(MembershipStep::ReplaceVoters(v)) if v.contains(&4) || v.contains(&5)),
            "{step:?}"
        );
        // And a voter that may not vote is replaced by one that may.
        members[3].voter_eligible = true;
        members[2].voter_eligible = false;
        let raft = RaftMembers {
            voters: ids(&[1, 3, 4]),
            nodes: ids(&[1, 2, 3, 4, 5]),
        };
        members[1].state = MemberState::Alive;
        let all = ids(&[1, 2, 3, 4, 5]);
        let step = plan_membership(&members, &raft, &none, |_| None, &all, AFTER, 1, None);
        assert_eq!(step, Some(MembershipStep::ReplaceVoters(ids(&[1, 2, 4]))));
    }

    #[test]
    fn a_down_voter_is_replaced_only_after_the_wait() {
        let members = [
            row(1, MemberState::Alive, "a"),
            row(2, MemberState::Down, "b"),
            row(3, MemberState::Alive, "c"),
            row(4, MemberState::Alive, "d"),
        ];
        let raft = RaftMembers {
            voters: ids(&[1, 2, 3]),
            nodes: ids(&[1, 2, 3, 4]),
        };
        let none = BTreeSet::new();
        let soon = |id| (id == 2).then_some(AFTER / 2);
        assert_eq!(
            plan_membership(
                &members,
                &raft,
                &none,
                soon,
                &ids(&[1, 3, 4]),
                AFTER,
                1,
                None
            ),
            None
        );
        let long = |id| (id == 2).then_some(AFTER);
        assert_eq!(
            plan_membership(
                &members,
                &raft,
                &none,
                long,
                &ids(&[1, 3, 4]),
                AFTER,
                1,
                None
            ),
            Some(MembershipStep::ReplaceVoters(ids(&[1, 3, 4])))
        );
        // A learner the ledger calls alive but that does not answer the
        // leader's Raft is no candidate.
        assert_eq!(
            plan_membership(&members, &raft, &none, long, &ids(&[1, 3]), AFTER, 1, None),
            None
        );
    }

    /// Chaos seed 2399: two voters left, three learners that are
    /// successive occupants of one machine (each wiped in turn), the
    /// ledger still calling all of them alive. Only the newest answers;
    /// the voters grow to three with it, not to five with the lost ones.
    #[test]
    fn voters_grow_only_by_members_that_answer() {
        let members: Vec<MemberRow> = [1, 2, 4, 5, 6]
            .iter()
            .map(|id| row(*id, MemberState::Alive, "a"))
            .collect();
        let raft = RaftMembers {
            voters: ids(&[1, 2]),
            nodes: ids(&[1, 2, 4, 5, 6]),
        };
        let none = BTreeSet::new();
        assert_eq!(
            plan_membership(
                &members,
                &raft,
                &none,
                |_| None,
                &ids(&[1, 2, 6]),
                AFTER,
                1,
                None
            ),
            Some(MembershipStep::ReplaceVoters(ids(&[1, 2, 6])))
        );
        // Voters that lost their majority are not reshuffled: no new set
        // could commit.
        let raft = RaftMembers {
            voters: ids(&[1, 2, 4]),
            nodes: ids(&[1, 2, 4, 5, 6]),
        };
        let long = |id| (id == 2 || id == 4).then_some(AFTER);
        assert_eq!(
            plan_membership(
                &members,
                &raft,
                &none,
                long,
                &ids(&[1, 5, 6]),
                AFTER,
                1,
                None
            ),
            None
        );
    }

    #[test]
    fn a_member_that_moved_gets_its_published_raft_address() {
        let mut moved = row(2, MemberState::Alive, "b");
        moved.rpc_addr = "10.0.0.2:7071".into();
        let members = [row(1, MemberState::Alive, "a"), moved];
        let raft = |id: NodeId| Some(format!("127.0.0.1:{}", 7000 + id));
        assert_eq!(
            stale_address(&members, raft),
            Some((2, "10.0.0.2:7071".to_string()))
        );
        // Nothing to do when they agree, for members Raft does not have
        // yet, or for a record that is no address peers could use.
        let agree = [
            row(1, MemberState::Alive, "a"),
            row(2, MemberState::Alive, "b"),
        ];
        assert_eq!(stale_address(&agree, raft), None);
        assert_eq!(stale_address(&members, |_| None), None);
        let mut odd = row(2, MemberState::Alive, "b");
        odd.rpc_addr = "0.0.0.0:7071".into();
        assert_eq!(stale_address(&[odd.clone()], raft), None);
        odd.rpc_addr = "garbage".into();
        assert_eq!(stale_address(&[odd], raft), None);
    }

    /// Members 1..=n, down where `down` says, in zones cycling through
    /// `zones`.
    fn rows(n: NodeId, down: &BTreeSet<NodeId>, zones: &[u8]) -> Vec<MemberRow> {
        (1..=n)
            .map(|id| {
                let state = if down.contains(&id) {
                    MemberState::Down
                } else {
                    MemberState::Alive
                };
                row(id, state, &zones[id as usize % zones.len()].to_string())
            })
            .collect()
    }

    proptest! {
        /// Whatever the cluster: a step never drops the leader from the
        /// voters, never adds a member that left, and a healthy cluster
        /// whose voters the policy accepts is left alone.
        #[test]
        fn steps_keep_the_leader_and_settle(
            n in 1u64..8,
            down in proptest::collection::btree_set(2u64..8, 0..4),
            silent in proptest::collection::btree_set(2u64..8, 0..3),
            zones in proptest::collection::vec(0u8..3, 8),
        ) {
            let members = rows(n, &down, &zones);
            let all: BTreeSet<NodeId> = (1..=n).collect();
            let mut raft = RaftMembers { voters: ids(&[1]), nodes: all.clone() };
            let down_for = |id| down.contains(&id).then_some(AFTER * 2);
            // Down members never answer; some that look alive do not either.
            let answering: BTreeSet<NodeId> = all
                .iter()
                .copied()
                .filter(|id| !down.contains(id) && !silent.contains(id))
                .collect();
            // Converges in a few steps, each keeping the leader a voter and
            // each able to commit with the members that answer.
            let mut steps = 0;
            while let Some(step) = plan_membership(&members, &raft, &BTreeSet::new(), down_for, &answering, AFTER, 1, None) {
                match step {
                    MembershipStep::ReplaceVoters(v) => {
                        prop_assert!(v.contains(&1));
                        prop_assert!(v.iter().all(|id| all.contains(id)));
                        for set in [&raft.voters, &v] {
                            let live = set.intersection(&answering).count();
                            prop_assert!(live * 2 > set.len(), "{:?} -> {:?} with {:?}", raft.voters, v, answering);
                        }
                        raft.voters = v;
                    }
                    other => prop_assert!(false, "unexpected {other:?}"),
                }
                steps += 1;
                prop_assert!(steps < 5, "did not settle");
            }
        }

        /// Once the learners are bounded: whatever the pool, housekeeping
        /// settles on the voters plus `learner_target` healthy learners,
        /// never takes a voter out as a surplus learner, and adds a member
        /// that joins only when the replicas lack one.
        #[test]
        fn bounded_replicas_settle_on_the_voters_and_the_learner_target(
            n in 1u64..200,
            down in proptest::collection::btree_set(2u64..200, 0..20),
            zones in proptest::collection::vec(0u8..3, 200),
        ) {
            let members = rows(n, &down, &zones);
            let all: BTreeSet<NodeId> = (1..=n).collect();
            let answering: BTreeSet<NodeId> = all.iter().copied().filter(|id| !down.contains(id)).collect();
            let target = replicas::learner_target(members.len());
            let down_for = |id| down.contains(&id).then_some(AFTER * 2);
            let mut raft = RaftMembers { voters: ids(&[1]), nodes: all.clone() };
            let mut steps = 0;
            while let Some(step) = plan_membership(&members, &raft, &BTreeSet::new(), down_for, &answering, AFTER, 1, Some(target)) {
                match step {
                    MembershipStep::ReplaceVoters(v) => {
                        prop_assert!(v.contains(&1));
                        raft.voters = v;
                    }
                    MembershipStep::RemoveLearners(gone) => {
                        prop_assert!(gone.is_disjoint(&raft.voters), "voters {:?} removed as learners", raft.voters);
                        raft.nodes.retain(|id| !gone.contains(id));
                    }
                    MembershipStep::AddLearner { id, .. } => {
                        prop_assert!(!down.contains(&id));
                        raft.nodes.insert(id);
                    }
                    other => prop_assert!(false, "unexpected {other:?}"),
                }
                steps += 1;
                prop_assert!(steps < 10, "did not settle");
            }
            let learners: BTreeSet<NodeId> = raft.nodes.difference(&raft.voters).copied().collect();
            let healthy_others = answering.difference(&raft.voters).count();
            prop_assert_eq!(learners.len(), target.min(healthy_others));
            prop_assert!(learners.iter().all(|id| !down.contains(id)));
            // A newcomer is left to follow the log while the replicas are full.
            let mut grown = members.clone();
            grown.push(row(n + 1, MemberState::Alive, "a"));
            let grown_target = replicas::learner_target(grown.len());
            let mut answering = answering.clone();
            answering.insert(n + 1);
            let next = plan_membership(&grown, &raft, &BTreeSet::new(), down_for, &answering, AFTER, 1, Some(grown_target));
            let full = learners.len() >= grown_target;
            if full {
                let adds_newcomer = matches!(next, Some(MembershipStep::AddLearner { id, .. }) if id == n + 1);
                prop_assert!(!adds_newcomer, "a newcomer added to full replicas");
            }
        }
    }
}
