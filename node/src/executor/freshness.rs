//! How fresh this node's ledger is: the basis of self-fencing and of the
//! ranks' lease.
//!
//! A node may run a rank only while it would learn in time that the
//! allocation moved on. Hearing the voters (gossip) is not that: a node
//! whose Raft stream lags — in back-off after a pause, or behind a lossy
//! link — hears everyone yet still applies a ledger in which its job has
//! not moved, while the cluster already starts the job elsewhere (chaos
//! seed 103 of the pause faults: two epochs at once for 585 ms).
//!
//! So freshness is a ReadIndex read, as a Raft lease read is: at `asked`
//! this node renews its lease on the leader (`Request::Renew`), which
//! answers with its commit index once it has confirmed its leadership with
//! a quorum (one round shared by the renewals that arrive together), and
//! the renewal is the leader's sign that this node lives. The node then
//! waits until it has applied that
//! index itself. Every entry committed before `asked` is then in this
//! node's ledger, so if its allocation had been released before `asked`,
//! the fence has already seen that. A node that cannot complete such a
//! read — cut off, paused, lagging, or asking a deposed leader — keeps
//! `asked` of its last successful one, and its ranks die `SELF_FENCE_MS`
//! after it, before the cluster's wait of `REPLACE_AFTER_NODE_LOSS_MS`
//! from the entry that released them is over.

use crate::ledger_client::client::LedgerClient;
use crate::worker::Worker;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a read is started. Reads overlap, so a slow one does not
/// hold back the next: freshness trails by one round trip, not by the
/// slowest one.
pub const PROBE_EVERY: Duration = crate::peers::RENEW_EVERY;
/// Reads in flight at most; a node that cannot reach its leader does not
/// pile them up.
const MAX_IN_FLIGHT: usize = 8;

/// The start of this node's latest completed ReadIndex read; `None` until
/// one completes.
#[derive(Clone, Default)]
pub struct LedgerFreshness {
    asked: Arc<Mutex<Option<Instant>>>,
}

impl LedgerFreshness {
    /// When the latest completed read was started.
    pub fn fresh_at(&self) -> Option<Instant> {
        *self.asked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A read started at `asked` completed (reads may complete out of order).
    pub fn confirm(&self, asked: Instant) {
        let mut at = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        if at.is_none_or(|t| t < asked) {
            *at = Some(asked);
        }
    }
}

/// Starts a ReadIndex read every [`PROBE_EVERY`], each bounded by `limit`.
pub struct FreshnessProbe {
    ledger: LedgerClient,
    freshness: LedgerFreshness,
    limit: Duration,
    in_flight: Arc<AtomicUsize>,
}

impl FreshnessProbe {
    pub fn new(ledger: LedgerClient, freshness: LedgerFreshness, limit: Duration) -> Self {
        FreshnessProbe {
            ledger,
            freshness,
            limit,
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Worker for FreshnessProbe {
    fn period(&self) -> Duration {
        PROBE_EVERY
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return ControlFlow::Continue(());
        }
        let ledger = self.ledger.clone();
        let freshness = self.freshness.clone();
        let in_flight = self.in_flight.clone();
        let limit = self.limit;
        tokio::spawn(async move {
            let asked = Instant::now();
            if tokio::time::timeout(limit, read_index(&ledger, limit))
                .await
                .is_ok_and(|done| done)
            {
                freshness.confirm(asked);
            }
            in_flight.fetch_sub(1, Ordering::AcqRel);
        });
        ControlFlow::Continue(())
    }
}

/// A lease renewal on the leader: its read index (its commit index,
/// confirmed with a quorum after the renewal arrived), applied here too.
async fn read_index(ledger: &LedgerClient, limit: Duration) -> bool {
    let Ok(read_index) = ledger.renew().await else {
        return false;
    };
    ledger
        .raft()
        .wait(Some(limit))
        .applied_index_at_least(Some(read_index), "a fresh ledger")
        .await
        .is_ok()
}

/// Self-fencing: whether this node's ledger was last known to be current
/// longer than `window` ago (never: fenced). A node with no voters known
/// (before its first ledger entry) has nothing to be cut off from.
pub fn fenced(has_voters: bool, fresh_at: Option<Instant>, now: Instant, window: Duration) -> bool {
    has_voters && fresh_at.is_none_or(|t| now.saturating_duration_since(t) > window)
}

/// The instant until which this node may run ranks: its freshness plus
/// `window`; `None` when there are no voters to be cut off from. Agrees
/// with [`fenced`]: fenced at `now` exactly when the deadline is before
/// `now`.
pub fn deadline(
    has_voters: bool,
    fresh_at: Option<Instant>,
    now: Instant,
    window: Duration,
) -> Option<Instant> {
    if !has_voters {
        return None;
    }
    Some(match fresh_at {
        Some(t) => t + window,
        // Never fresh: fenced already.
        None => now.checked_sub(Duration::from_millis(1)).unwrap_or(now),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WINDOW: Duration = Duration::from_millis(2500);

    #[test]
    fn a_node_without_voters_is_never_fenced() {
        let now = Instant::now();
        assert!(!fenced(false, None, now, WINDOW));
        assert_eq!(deadline(false, None, now, WINDOW), None);
    }

    #[test]
    fn a_node_never_fresh_is_fenced() {
        let now = Instant::now() + Duration::from_secs(10);
        assert!(fenced(true, None, now, WINDOW));
        assert!(deadline(true, None, now, WINDOW).is_some_and(|d| d < now));
    }

    #[test]
    fn freshness_only_moves_forward() {
        let f = LedgerFreshness::default();
        let t = Instant::now();
        f.confirm(t + Duration::from_millis(300));
        f.confirm(t + Duration::from_millis(100));
        assert_eq!(f.fresh_at(), Some(t + Duration::from_millis(300)));
    }

    proptest! {
        #[test]
        fn the_deadline_agrees_with_the_fencing_rule(ago_ms in 0u64..10_000, never in any::<bool>()) {
            let now = Instant::now() + Duration::from_secs(100);
            let fresh_at = (!never).then(|| now - Duration::from_millis(ago_ms));
            let d = deadline(true, fresh_at, now, WINDOW).expect("voters");
            prop_assert_eq!(fenced(true, fresh_at, now, WINDOW), d < now);
            prop_assert_eq!(fenced(true, fresh_at, now, WINDOW), never || ago_ms > WINDOW.as_millis() as u64);
        }
    }
}
