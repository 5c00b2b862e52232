//! A value worked out from the ledger once per applied entry.
//!
//! Some answers walk every member (the protocol they all speak, the gossip
//! layer's member list) and are asked on every lease renewal or every
//! second: a cost per call that grows with the pool. The ledger changes
//! only when an entry (or a snapshot) is applied, so the answer is kept
//! with the last applied log id it was worked out at, and worked out again
//! once that moves on.

use shoal_consensus::types::LogId;
use std::sync::Mutex;

#[derive(Debug)]
pub struct PerApplied<T> {
    kept: Mutex<Option<(Option<LogId>, T)>>,
}

impl<T> Default for PerApplied<T> {
    fn default() -> Self {
        PerApplied {
            kept: Mutex::new(None),
        }
    }
}

impl<T: Clone> PerApplied<T> {
    /// The value kept for `applied`, or `work_out()` kept from now on.
    /// `applied` must be read under the same ledger lock as what
    /// `work_out` reads, so the two cannot come from different entries.
    pub fn get(&self, applied: Option<LogId>, work_out: impl FnOnce() -> T) -> T {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        match &*kept {
            Some((at, value)) if *at == applied => value.clone(),
            _ => {
                let value = work_out();
                *kept = Some((applied, value.clone()));
                value
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;
    use std::cell::Cell;

    fn log_id(term: u64, index: u64) -> Option<LogId> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    #[test]
    fn worked_out_once_per_applied_entry_and_again_after_the_next() {
        let memo = PerApplied::default();
        let calls = Cell::new(0);
        let work = |v: u16| {
            calls.set(calls.get() + 1);
            v
        };
        assert_eq!(memo.get(None, || work(1)), 1);
        assert_eq!(memo.get(None, || work(2)), 1, "nothing applied since");
        assert_eq!(calls.get(), 1);
        assert_eq!(memo.get(log_id(1, 7), || work(3)), 3, "an entry applied");
        assert_eq!(memo.get(log_id(1, 7), || work(4)), 3);
        // A new leader's entry at an index seen before (a snapshot or a
        // truncated tail) is another entry.
        assert_eq!(memo.get(log_id(2, 7), || work(5)), 5);
        assert_eq!(calls.get(), 3);
    }
}
