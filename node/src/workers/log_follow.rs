//! A member outside the Raft replicas keeps its ledger by following the
//! committed log from a replica (`shoal_consensus::replicas`,
//! `ledger_client::relay`): one long poll after another, to the replica
//! its rendezvous order names first, passing over for a while one that
//! does not answer. A learner follows too, with a longer poll, in case the
//! leader dropped it from Raft while it was away (the leader then sends it
//! nothing more, not even its removal); a voter hears the leader itself.
//! A node whose ledger names no replica yet (it has only just joined)
//! asks the member it joined through.

use crate::ledger_client::relay::Followed;
use crate::ledger_client::LedgerClient;
use crate::worker::Worker;
use shoal_consensus::replicas::{relay_order, SINCE_PROTOCOL};
use shoal_consensus::NodeId;
use shoal_sdk::MemberState;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// How long a relayed member's question is held while nothing is newer:
/// its ledger still moves within one hop of the relay's, and an idle
/// member asks once per wait.
const RELAYED_WAIT: Duration = Duration::from_secs(2);
/// A learner's question, held longer: the leader feeds it, and this is
/// only the way back for one dropped from Raft while it was away.
const LEARNER_WAIT: Duration = Duration::from_secs(5);
/// How long a replica that did not answer is passed over.
const PASS_OVER: Duration = Duration::from_secs(5);
/// Pause after a failed question, or while there is no one to ask.
const RETRY: Duration = Duration::from_millis(200);
/// How long this node's ledger may stay behind what its lease renewals
/// say the leader committed, without moving, before it gives up on the
/// relay it asks (a dead relay's question would otherwise hang until its
/// timeout).
const STALL: Duration = Duration::from_millis(500);
/// How often a follower whose ledger is behind looks whether it still
/// moves; one that is not behind sleeps until a renewal says it is.
const STALL_CHECK: Duration = Duration::from_millis(250);
/// How often a voter looks again whether it still is one.
const VOTER_RECHECK: Duration = Duration::from_secs(1);

pub struct LogFollower {
    ledger: LedgerClient,
    seed: Option<SocketAddr>,
    passed_over: HashMap<NodeId, Instant>,
}

impl LogFollower {
    pub fn new(ledger: LedgerClient, seed: Option<SocketAddr>) -> Self {
        LogFollower {
            ledger,
            seed,
            passed_over: HashMap::new(),
        }
    }
}

/// This node's place in Raft, as its own log says.
#[derive(Debug, PartialEq, Eq)]
enum Role {
    Voter,
    Learner,
    Relayed,
}

impl Worker for LogFollower {
    fn period(&self) -> Duration {
        Duration::from_millis(10)
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let me = self.ledger.me();
        let (role, replicas, leader) = {
            let m = self.ledger.raft_metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            let role = if membership.voter_ids().any(|id| id == me) {
                Role::Voter
            } else if membership.learner_ids().any(|id| id == me) {
                Role::Learner
            } else {
                Role::Relayed
            };
            let replicas: Vec<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
            (role, replicas, m.current_leader)
        };
        if role == Role::Voter {
            self.ledger.set_relay(None);
            tokio::time::sleep(VOTER_RECHECK).await;
            return ControlFlow::Continue(());
        }
        let bounded = self.ledger.all_speak(SINCE_PROTOCOL);
        let down = match self.ledger.read() {
            Ok(d) => d
                .ledger
                .members
                .values()
                .filter(|m| m.state == MemberState::Down)
                .map(|m| m.id)
                .collect::<BTreeSet<NodeId>>(),
            Err(_) => BTreeSet::new(),
        };
        // Until every member speaks the relay's protocol, the leader keeps
        // every member a learner and feeds it itself.
        if role == Role::Learner && !bounded {
            tokio::time::sleep(VOTER_RECHECK).await;
            return ControlFlow::Continue(());
        }
        let wait = match role {
            Role::Learner => LEARNER_WAIT,
            _ => RELAYED_WAIT,
        };
        let now = Instant::now();
        self.passed_over.retain(|_, until| *until > now);
        let relay = relay_order(me, replicas, leader)
            .into_iter()
            .filter(|id| !down.contains(id) && !self.passed_over.contains_key(id))
            .find_map(|id| self.ledger.member_addr(id).ok().map(|a| (Some(id), a)))
            .or_else(|| self.seed.map(|a| (None, a)));
        let Some((relay, addr)) = relay else {
            tokio::time::sleep(RETRY).await;
            return ControlFlow::Continue(());
        };
        let followed = tokio::select! {
            r = self.ledger.follow(relay, addr, wait) => r,
            () = stalled(&self.ledger) => Err(crate::proto::WireError::new(
                crate::proto::ErrorCode::Unavailable,
                "the relay does not pass on what the leader committed",
            )),
        };
        // A relayed member renews its lease through the replica it
        // follows; a learner renews with the leader itself.
        let renew_via = |ok: bool| {
            (ok && role == Role::Relayed)
                .then_some(())
                .and(relay.map(|id| (id, addr)))
        };
        self.ledger.set_relay(renew_via(followed.is_ok()));
        match followed {
            Ok(Followed::Nothing) => {
                tracing::trace!(node = me, from = %addr, "nothing newer");
            }
            Ok(Followed::Entries(n)) => {
                tracing::trace!(node = me, from = %addr, entries = n, "followed");
            }
            Ok(Followed::Snapshot) => {
                tracing::info!(from = %addr, "installed the ledger snapshot a replica relayed");
            }
            Err(e) => {
                tracing::debug!(node = me, from = %addr, error = %e, "following the log failed; asking another replica");
                // From the failure, not the question: a dead relay's
                // connection attempt alone can take seconds.
                if let Some(id) = relay {
                    self.passed_over.insert(id, Instant::now() + PASS_OVER);
                }
                tokio::time::sleep(RETRY).await;
            }
        }
        ControlFlow::Continue(())
    }
}

/// Returns once this node's ledger has stayed behind the read index of its
/// lease renewals without moving for [`STALL`] (give or take
/// [`STALL_CHECK`]). While it is not behind, as at idle, this waits for
/// a renewal to say it is, and costs no wake-ups.
async fn stalled(ledger: &LedgerClient) {
    let applied = || {
        ledger
            .raft_metrics()
            .borrow()
            .last_applied
            .map_or(0, |l| l.index)
    };
    let mut watch = StallWatch::default();
    loop {
        if ledger.renewed_index() <= applied() {
            watch = StallWatch::default();
            ledger.renewed_index_above(applied()).await;
        }
        tokio::time::sleep(STALL_CHECK).await;
        if watch.stalled(Instant::now(), applied(), ledger.renewed_index()) {
            return;
        }
    }
}

/// Whether a follower's relay has stopped feeding it: its ledger is behind
/// what the leader committed and has not moved for [`STALL`]. Behind alone
/// is not enough: a member still applying the last batch while its next
/// question is out is being fed, and giving up on that relay throws away
/// the answer on its way and puts the same work on the next one. The watch
/// starts afresh with each question, so a relay slower than [`STALL`] to
/// answer at all is still given up.
#[derive(Debug, Default)]
struct StallWatch {
    /// Since when the ledger is behind at the applied index seen then.
    behind: Option<(Instant, u64)>,
}

impl StallWatch {
    fn stalled(&mut self, now: Instant, applied: u64, renewed: u64) -> bool {
        if renewed <= applied {
            self.behind = None;
            return false;
        }
        match self.behind {
            Some((since, at)) if at == applied => now.duration_since(since) >= STALL,
            _ => {
                self.behind = Some((now, applied));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_behind_and_still_is_stalled_one_behind_but_moving_is_not() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = StallWatch::default();
        assert!(!w.stalled(at(0), 10, 10), "current");
        assert!(!w.stalled(at(100), 10, 20));
        assert!(!w.stalled(at(400), 10, 20), "behind for less than STALL");
        assert!(w.stalled(at(600), 10, 25), "behind and still for STALL");

        let mut w = StallWatch::default();
        // Catching up: behind the whole time, but every look finds it moved.
        for (i, ms) in (0..20u64).map(|i| (i, i * 250)) {
            assert!(!w.stalled(at(ms), 10 + i, 100), "moving at {ms} ms");
        }
        // Then it stops moving.
        assert!(!w.stalled(at(5_000), 29, 100));
        assert!(w.stalled(at(5_500), 29, 100));
        // Caught up: forgotten.
        assert!(!w.stalled(at(5_750), 100, 100));
        assert!(!w.stalled(at(6_000), 100, 101));
        assert!(!w.stalled(at(6_250), 100, 101));
    }
}
