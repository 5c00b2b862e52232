//! The leader's housekeeping loop. Only the leader acts; every other node's
//! loop idles. Each tick it:
//!
//! 1. commits the member states (alive/suspect/down) of its own failure
//!    detector — fed by gossip heartbeats on every node, and on the leader
//!    also by Raft acknowledgements — so every node agrees;
//! 2. makes sure every ledger member is at least a Raft learner;
//! 3. converges the voter set to the pure policy in `shoal_consensus::voters`
//!    (3 or 5 voters across failure domains, dead voters replaced after
//!    `membership.voter_replace_after_ms`).

use super::Worker;
use crate::node::peers::SharedPeerView;
use crate::node::LedgerClient;
use openraft::{ChangeMembers, ServerState};
use shoal_consensus::network::ContactTracker;
use shoal_consensus::voters::{choose_voters, VoterCandidate};
use shoal_consensus::{Command, NodeId};
use shoal_sdk::MemberState;
use std::collections::{BTreeSet, HashMap};
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
    view: Option<LeaderView>,
}

impl Housekeeping {
    pub fn new(
        ledger: LedgerClient,
        peers: SharedPeerView,
        contacts: ContactTracker,
        replace_after: Duration,
    ) -> Self {
        Housekeeping {
            ledger,
            peers,
            contacts,
            replace_after,
            view: None,
        }
    }
}

impl Worker for Housekeeping {
    fn period(&self) -> Duration {
        TICK
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

/// What housekeeping needs of a member: id, state, RPC address, zone, rack.
type MemberRow = (NodeId, MemberState, String, Option<String>, Option<String>);

impl Housekeeping {
    async fn tick_as_leader(&self, v: &mut LeaderView, now: Instant) -> Result<(), String> {
        let me = self.ledger.me();
        let members: Vec<MemberRow> = {
            let d = self.ledger.read().map_err(|e| e.message)?;
            d.ledger
                .active_members()
                .map(|m| {
                    (
                        m.id,
                        m.state,
                        m.spec.rpc_addr.clone(),
                        m.spec.labels.get("zone").cloned(),
                        m.spec.labels.get("rack").cloned(),
                    )
                })
                .collect()
        };

        // 1. Liveness, from this node's gossip-fed detector; the Raft acks the
        // leader sees count as signs of life too.
        let mut desired_states = Vec::new();
        {
            let mut peers = self.peers.lock().map_err(|_| "peer view lock poisoned")?;
            for (id, state, ..) in &members {
                if *id == me {
                    if *state != MemberState::Alive {
                        desired_states.push((*id, MemberState::Alive));
                    }
                    continue;
                }
                if let Some(t) = self.contacts.last_contact(*id) {
                    if v.fed_until.get(id).is_none_or(|prev| t > *prev) {
                        peers.heard(*id, t);
                        v.fed_until.insert(*id, t);
                    }
                }
                let want = peers.state(*id).unwrap_or(MemberState::Alive);
                if want == MemberState::Down {
                    v.down_since.entry(*id).or_insert(now);
                } else {
                    v.down_since.remove(id);
                }
                if want != *state {
                    desired_states.push((*id, want));
                }
            }
        }
        for (id, state) in desired_states {
            self.ledger
                .write_local(Command::SetMemberState { id, state })
                .await
                .map_err(|e| e.to_string())?;
        }

        // 2. Every member is at least a learner, and nodes that left are gone.
        let membership = self
            .ledger
            .raft_metrics()
            .borrow()
            .membership_config
            .membership()
            .clone();
        let left: BTreeSet<NodeId> = {
            let d = self.ledger.read().map_err(|e| e.message)?;
            membership
                .nodes()
                .map(|(id, _)| *id)
                .filter(|id| d.ledger.members.get(id).map(|m| m.state) == Some(MemberState::Left))
                .collect()
        };
        if !left.is_empty() {
            if left
                .iter()
                .any(|id| membership.voter_ids().any(|v| v == *id))
            {
                self.ledger
                    .change_membership(ChangeMembers::RemoveVoters(left.clone()), false)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            self.ledger
                .change_membership(ChangeMembers::RemoveNodes(left), false)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(());
        }
        for (id, _, addr, ..) in &members {
            if membership.get_node(id).is_none() {
                self.ledger
                    .add_learner(*id, addr.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(());
            }
        }

        // 3. Voters.
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let replace_after = self.replace_after;
        let candidates: Vec<VoterCandidate> = members
            .iter()
            .filter(|(id, ..)| membership.get_node(id).is_some())
            .map(|(id, state, _, zone, rack)| {
                let is_voter = voters.contains(id);
                let down_for = v
                    .down_since
                    .get(id)
                    .map(|t| now.saturating_duration_since(*t));
                let healthy = if *id == me {
                    true
                } else if is_voter {
                    down_for.is_none_or(|d| d < replace_after)
                } else {
                    *state == MemberState::Alive
                };
                VoterCandidate {
                    id: *id,
                    zone: zone.clone(),
                    rack: rack.clone(),
                    healthy,
                    is_voter,
                }
            })
            .collect();
        if let Some(desired) = choose_voters(&candidates, me) {
            if desired != voters {
                tracing::info!(from = ?voters, to = ?desired, "changing the voter set");
                self.ledger
                    .change_membership(ChangeMembers::ReplaceAllVoters(desired), true)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}
