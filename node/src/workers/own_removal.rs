//! Notices that this node was removed from the cluster: in its own applied
//! ledger (it was connected when the others removed it), or by asking a
//! voter now and then (it was cut off then, and a learner never campaigns,
//! so no peer would tell it otherwise). A peer's refusal is recorded by the
//! ledger client that carried the call (see [`crate::ledger_client::removal`]).
//!
//! Every member renews its lease several times a second, and a node that
//! applied the removal refuses those renewals as it would the probe, so
//! the probe is only for a node whose renewals are not getting through:
//! asked by every member every few seconds, it was a load on each voter
//! that grew with the pool.

use crate::ledger_client::LedgerClient;
use crate::proto::Request;
use crate::worker::{Wakeup, Worker};
use shoal_sdk::MemberState;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// Time between two probes of a voter. A removed node's ranks were already
/// fenced by the cluster (its jobs moved under new epochs); the probe only
/// bounds how long the removed agent runs on.
pub const PROBE_EVERY: Duration = Duration::from_secs(5);

pub struct OwnRemoval {
    pub ledger: LedgerClient,
    last_probe: Option<Instant>,
    probes: usize,
}

impl OwnRemoval {
    pub fn new(ledger: LedgerClient) -> Self {
        OwnRemoval {
            ledger,
            last_probe: None,
            probes: 0,
        }
    }

    fn left_in_own_ledger(&self) -> Option<bool> {
        let me = self.ledger.me();
        let d = self.ledger.read().ok()?;
        Some(
            d.ledger
                .members
                .get(&me)
                .is_some_and(|m| m.state == MemberState::Left),
        )
    }

    /// Asks one voter (a different one each time) whether this node is
    /// still a member; only a refusal matters, and the client records it.
    async fn probe(&mut self) {
        let me = self.ledger.me();
        let voters: Vec<_> = self
            .ledger
            .voters()
            .into_iter()
            .filter(|v| *v != me)
            .collect();
        if voters.is_empty() {
            return;
        }
        let voter = voters[self.probes % voters.len()];
        self.probes += 1;
        if let Err(e) = self.ledger.call_member(voter, &Request::StillMember).await {
            tracing::debug!(voter, error = %e, "membership probe unanswered");
        }
    }
}

impl Worker for OwnRemoval {
    fn period(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn wakeup(&self) -> Wakeup {
        Wakeup::on_apply(self.ledger.applied_watch())
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        if self.left_in_own_ledger() == Some(true) {
            let me = self.ledger.me();
            self.ledger
                .removal()
                .record(format!("this node's ledger records node {me} as removed"));
        }
        if self.ledger.removal().get().is_some() {
            return ControlFlow::Break(());
        }
        let due = self.last_probe.is_none_or(|t| t.elapsed() >= PROBE_EVERY);
        let renewing = self
            .ledger
            .last_renewed()
            .is_some_and(|t| t.elapsed() < PROBE_EVERY);
        if due && !renewing && !self.ledger.is_leader() {
            self.last_probe = Some(Instant::now());
            self.probe().await;
        }
        ControlFlow::Continue(())
    }
}
