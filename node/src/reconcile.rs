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

use crate::agent::Inner;
use openraft::{BasicNode, ChangeMembers, ServerState};
use shoal_consensus::voters::{choose_voters, VoterCandidate};
use shoal_consensus::{Command, NodeId};
use shoal_sdk::MemberState;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const TICK: Duration = Duration::from_millis(100);

/// Leader-local bookkeeping; rebuilt whenever this node becomes leader so a
/// new term never inherits a stale view.
struct LeaderView {
    term: u64,
    fed_until: HashMap<NodeId, Instant>,
    down_since: HashMap<NodeId, Instant>,
}

pub async fn run(inner: Weak<Inner>, mut shutdown: watch::Receiver<bool>) {
    let mut view: Option<LeaderView> = None;
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(inner) = inner.upgrade() else { return };
        let (is_leader, term) = {
            let m = inner.raft.metrics();
            let m = m.borrow();
            (
                m.state == ServerState::Leader && m.current_leader == Some(inner.id),
                m.current_term,
            )
        };
        if !is_leader {
            view = None;
            continue;
        }
        let now = Instant::now();
        let v = match &mut view {
            Some(v) if v.term == term => v,
            _ => view.insert(LeaderView {
                term,
                fed_until: HashMap::new(),
                down_since: HashMap::new(),
            }),
        };
        if let Err(e) = tick(&inner, v, now).await {
            tracing::debug!(error = %e, "leader housekeeping will retry");
        }
    }
}

/// What housekeeping needs of a member: id, state, RPC address, zone, rack.
type MemberRow = (NodeId, MemberState, String, Option<String>, Option<String>);

async fn tick(inner: &Arc<Inner>, v: &mut LeaderView, now: Instant) -> Result<(), String> {
    let members: Vec<MemberRow> = {
        let d = inner.ledger.read().map_err(|_| "ledger lock poisoned")?;
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
        let mut peers = inner.peers.lock().map_err(|_| "peer view lock poisoned")?;
        for (id, state, ..) in &members {
            if *id == inner.id {
                if *state != MemberState::Alive {
                    desired_states.push((*id, MemberState::Alive));
                }
                continue;
            }
            if let Some(t) = inner.contacts.last_contact(*id) {
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
        inner
            .write_local(Command::SetMemberState { id, state })
            .await
            .map_err(|e| e.to_string())?;
    }

    // 2. Every member is at least a learner, and nodes that left are gone.
    let membership = inner
        .raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .clone();
    let left: BTreeSet<NodeId> = {
        let d = inner.ledger.read().map_err(|_| "ledger lock poisoned")?;
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
            inner
                .change_membership(ChangeMembers::RemoveVoters(left.clone()), false)
                .await
                .map_err(|e| e.to_string())?;
        }
        inner
            .change_membership(ChangeMembers::RemoveNodes(left), false)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    for (id, _, addr, ..) in &members {
        if membership.get_node(id).is_none() {
            inner
                .raft
                .add_learner(*id, BasicNode::new(addr.clone()), false)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(());
        }
    }

    // 3. Voters.
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let replace_after = Duration::from_millis(inner.cfg.membership.voter_replace_after_ms);
    let candidates: Vec<VoterCandidate> = members
        .iter()
        .filter(|(id, ..)| membership.get_node(id).is_some())
        .map(|(id, state, _, zone, rack)| {
            let is_voter = voters.contains(id);
            let down_for = v
                .down_since
                .get(id)
                .map(|t| now.saturating_duration_since(*t));
            let healthy = if *id == inner.id {
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
    if let Some(desired) = choose_voters(&candidates, inner.id) {
        if desired != voters {
            tracing::info!(from = ?voters, to = ?desired, "changing the voter set");
            inner
                .change_membership(ChangeMembers::ReplaceAllVoters(desired), true)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}
