//! Leadership hand-over on a graceful stop. openraft 0.9 has no leader
//! transfer, and a voter refuses to vote while the leader lease it granted
//! holds (`election_timeout_max` after the last append or heartbeat it
//! saw). Left alone, a stopped leader costs the lease plus a randomised
//! election timeout, and a split vote now and then. So a stopping leader:
//!
//! 1. stops proposing and stops its heartbeats (either would renew the
//!    voters' lease);
//! 2. waits until its most caught-up voter has its whole log, and the lease
//!    has run out;
//! 3. asks that voter to stand at once (`Request::ElectNow`, which only the
//!    leader may ask), and waits until another node leads.
//!
//! Writes are refused with "not the leader" from step 1 on, so clients retry
//! against the successor once it leads.

use crate::ledger_client::client::LedgerClient;
use crate::proto::{Request, Response};
use shoal_consensus::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Pure: the voter other than `me` whose replicated log reaches furthest
/// (ties: the lowest id); `None` when there is no other voter.
pub fn successor(
    me: NodeId,
    voters: &BTreeSet<NodeId>,
    matched: &BTreeMap<NodeId, Option<u64>>,
) -> Option<NodeId> {
    voters
        .iter()
        .copied()
        .filter(|v| *v != me)
        .max_by_key(|v| (matched.get(v).copied().flatten(), std::cmp::Reverse(*v)))
}

/// Hands this node's leadership to its most caught-up voter; `lease` is the
/// voters' leader lease (`raft.election_timeout_max_ms`). Returns the new
/// leader, or why there is none (this node then stops as it would have).
pub async fn hand_over(ledger: &LedgerClient, lease: Duration) -> Result<NodeId, String> {
    if !ledger.is_leader() {
        return Err("this node does not lead".into());
    }
    let me = ledger.me();
    let voters = ledger.voters();
    let raft = ledger.raft();
    ledger.stop_proposing();
    raft.runtime_config().heartbeat(false);
    let stopped = Instant::now();
    let matched = |raft: &shoal_consensus::types::Raft| -> BTreeMap<NodeId, Option<u64>> {
        raft.metrics()
            .borrow()
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .map(|(id, log)| (*id, log.map(|l| l.index)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let target = successor(me, &voters, &matched(raft)).ok_or("no other voter to lead")?;
    // The successor needs this node's whole log to win the votes.
    let last = raft.metrics().borrow().last_log_index;
    let deadline = stopped + lease;
    while matched(raft).get(&target).copied().flatten() < last && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The voters' lease on this leader runs from the last append or
    // heartbeat they saw, at most `lease` ago from here.
    tokio::time::sleep_until((stopped + lease + Duration::from_millis(30)).into()).await;
    match ledger.call_member(target, &Request::ElectNow).await {
        Ok(Response::Holds(true)) => {}
        Ok(Response::Error(e)) => return Err(format!("node {target} refused: {}", e.message)),
        Ok(_) => return Err(format!("node {target} gave an unexpected answer")),
        Err(e) => return Err(format!("node {target} did not answer: {}", e.message)),
    }
    let mut metrics = ledger.raft_metrics();
    let wait = tokio::time::timeout(lease * 4, async {
        loop {
            let leader = metrics.borrow().current_leader;
            if leader.is_some_and(|l| l != me) {
                return leader;
            }
            if metrics.changed().await.is_err() {
                return None;
            }
        }
    })
    .await;
    match wait {
        Ok(Some(leader)) => Ok(leader),
        _ => Err(format!("node {target} stood but no new leader was seen")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_most_caught_up_other_voter_succeeds() {
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        let matched: BTreeMap<NodeId, Option<u64>> =
            [(1, Some(10)), (2, Some(8)), (3, Some(9))].into();
        assert_eq!(successor(1, &voters, &matched), Some(3));
        assert_eq!(successor(1, &[1].into(), &matched), None);
        // Unknown progress counts as none; ties go to the lowest id.
        assert_eq!(successor(1, &voters, &BTreeMap::new()), Some(2));
    }

    proptest! {
        #[test]
        fn the_successor_is_another_voter_no_one_beats(
            voters in proptest::collection::btree_set(0u64..8, 0..6),
            me in 0u64..8,
            matched in proptest::collection::btree_map(0u64..8, proptest::option::of(0u64..20), 0..8),
        ) {
            match successor(me, &voters, &matched) {
                None => prop_assert!(voters.iter().all(|v| *v == me)),
                Some(s) => {
                    prop_assert!(s != me && voters.contains(&s));
                    let of = |v: &NodeId| matched.get(v).copied().flatten();
                    prop_assert!(voters.iter().filter(|v| **v != me).all(|v| of(v) <= of(&s)));
                }
            }
        }
    }
}
