//! Exactly-once writes: the answers of recent writes, by the id their
//! sender gave them.
//!
//! A node retries a write on the leader it learns of next when it cannot
//! tell whether the first attempt committed (the leader changed or the link
//! broke while the request was in flight). Without an id the retry is
//! applied a second time: a job submitted twice, or a removal that commits
//! and whose retry is then answered "does not exist". So every routed write
//! carries an id (`Command::Once`) and the state machine keeps the
//! answer of each id it applied, as the Raft thesis (§6.3) has it: a repeat
//! is answered from the record and changes nothing.
//!
//! A retry can come only while its sender still waits, within one request
//! timeout (seconds), so records are kept for [`KEEP_MS`] of ledger time
//! and at most [`MAX_RECORDS`] of them, whichever is fewer. Ledger time is
//! the leaders' stamps, so every replica prunes the same records at the
//! same index.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

use crate::ids::NodeId;

/// The protocol version that brought write ids: a node wraps its writes in
/// them only once the cluster's effective protocol is at least this, so a
/// member of an older release never meets an entry it cannot apply.
pub const SINCE_PROTOCOL: u16 = 2;
/// How long an answer is kept, in ledger time: many request timeouts.
pub const KEEP_MS: u64 = 120_000;
/// The most answers kept, so that a burst of writes cannot grow the ledger
/// (and every snapshot) without bound: at 2,000 writes/s this still covers
/// 25 s, five request timeouts.
pub const MAX_RECORDS: usize = 50_000;

/// Who sent a write and the sender's id for it. The origin is the member
/// whose certificate carried the request (set by the leader, never by the
/// sender), so one member cannot answer or block another's writes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId {
    pub origin: NodeId,
    pub nonce: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Record<A> {
    at_ms: u64,
    answer: A,
}

/// The answers (`A`: the ledger's responses) of recent writes, oldest
/// first in `order`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RecentWrites<A> {
    answers: BTreeMap<WriteId, Record<A>>,
    order: VecDeque<WriteId>,
}

impl<A> Default for RecentWrites<A> {
    fn default() -> Self {
        RecentWrites {
            answers: BTreeMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<A> RecentWrites<A> {
    /// The answer `id` got when it was applied, if it is still kept.
    pub fn answer(&self, id: &WriteId) -> Option<&A> {
        self.answers.get(id).map(|r| &r.answer)
    }

    /// Keeps `answer` for `id`, applied at ledger time `now_ms` (which
    /// never runs backwards), and forgets what is too old or too many. An
    /// id already kept keeps its first answer.
    pub fn record(&mut self, id: WriteId, answer: A, now_ms: u64) {
        if let std::collections::btree_map::Entry::Vacant(slot) = self.answers.entry(id) {
            slot.insert(Record {
                at_ms: now_ms,
                answer,
            });
            self.order.push_back(id);
        }
        while let Some(oldest) = self.order.front() {
            let stale = self
                .answers
                .get(oldest)
                .is_none_or(|r| r.at_ms.saturating_add(KEEP_MS) < now_ms);
            if !stale && self.order.len() <= MAX_RECORDS {
                break;
            }
            if let Some(id) = self.order.pop_front() {
                self.answers.remove(&id);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::LedgerResponse;
    use proptest::prelude::*;

    fn id(origin: NodeId, nonce: u64) -> WriteId {
        WriteId { origin, nonce }
    }

    #[test]
    fn an_answer_is_kept_for_its_id_and_origin_only() {
        let mut r = RecentWrites::default();
        r.record(id(1, 7), LedgerResponse::JobId(42), 1_000);
        assert_eq!(r.answer(&id(1, 7)), Some(&LedgerResponse::JobId(42)));
        assert_eq!(r.answer(&id(2, 7)), None, "another member's nonce");
        assert_eq!(r.answer(&id(1, 8)), None);
    }

    #[test]
    fn answers_are_forgotten_after_the_keeping_time() {
        let mut r = RecentWrites::default();
        r.record(id(1, 1), LedgerResponse::Ok, 1_000);
        r.record(id(1, 2), LedgerResponse::Ok, 1_000 + KEEP_MS);
        assert!(r.answer(&id(1, 1)).is_some(), "exactly KEEP_MS old is kept");
        r.record(id(1, 3), LedgerResponse::Ok, 1_001 + KEEP_MS);
        assert!(r.answer(&id(1, 1)).is_none());
        assert!(r.answer(&id(1, 2)).is_some());
        assert_eq!(r.len(), 2);
    }

    proptest! {
        /// Used as the ledger uses it (a repeat is answered, only a new id
        /// is recorded), the records never exceed the cap, a just-recorded
        /// answer is there, nothing older than the keeping time is kept
        /// past the next record, and the two indexes agree.
        #[test]
        fn the_records_stay_bounded_and_consistent(
            writes in prop::collection::vec((0u64..4, 0u64..40, 0u64..50_000), 1..200),
        ) {
            let mut r = RecentWrites::default();
            let (mut now, mut recorded_at) = (0u64, 0u64);
            for (origin, nonce, step) in &writes {
                now += step;
                let write = id(*origin, *nonce);
                if let Some(answer) = r.answer(&write) {
                    prop_assert_eq!(answer, &LedgerResponse::NodeId(*nonce));
                    continue;
                }
                r.record(write, LedgerResponse::NodeId(*nonce), now);
                recorded_at = now;
                prop_assert!(r.len() <= MAX_RECORDS);
                prop_assert_eq!(r.order.len(), r.answers.len());
                prop_assert_eq!(r.answer(&write), Some(&LedgerResponse::NodeId(*nonce)));
            }
            for kept in r.answers.values() {
                prop_assert!(kept.at_ms.saturating_add(KEEP_MS) >= recorded_at);
            }
        }
    }
}
