//! Which members hold the ledger as Raft replicas, and which replica each
//! other member follows. A leader that ships every entry (and a heartbeat
//! every few hundred milliseconds) to every member pays for the size of
//! the pool: at thousands of nodes that is most of its core. So Raft's
//! membership is bounded: the voters plus a few learners, about one per
//! [`MEMBERS_PER_LEARNER`] members (Nomad keeps 3–5 servers for 10,000
//! clients; etcd's learners are for the same reason few). Every other
//! member is *relayed*: it pulls the committed log from a replica
//! ([`relay_order`]) into its own Raft log, so it still reads a whole
//! ledger of its own, applied in the same order, and the leader never
//! hears of it except through its lease renewals.
//!
//! This module is pure: the leader feeds it what it knows of the members
//! and gets the learners it should converge to.

use crate::ids::NodeId;
use std::collections::BTreeSet;

/// The protocol version from which members follow the log from a replica
/// (`Request::FollowLog`): the leader bounds the learners only once every
/// member speaks it, since a member left out of Raft by a leader it cannot
/// follow otherwise would hear nothing more.
pub const SINCE_PROTOCOL: u16 = 8;

/// The fewest learners a cluster keeps beside its voters once it bounds
/// them: two, so that a relayed member always has a replica that is not
/// the leader to follow, and one to fall back on.
pub const MIN_LEARNERS: usize = 2;

/// Members per learner beyond the minimum: each replica relays the log to
/// about this many members (a long poll each, answered once per entry).
pub const MEMBERS_PER_LEARNER: usize = 64;

/// How many learners a cluster of `members` keeps beside its voters.
pub fn learner_target(members: usize) -> usize {
    members.div_ceil(MEMBERS_PER_LEARNER).max(MIN_LEARNERS)
}

/// A member as the learner choice sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaCandidate {
    pub id: NodeId,
    pub zone: Option<String>,
    /// Alive, and (for a current learner) answering the leader.
    pub healthy: bool,
    /// A learner now.
    pub is_learner: bool,
    /// May vote: learners are where the voters are chosen from, so the
    /// eligible ones come first.
    pub voter_eligible: bool,
}

/// The learners to converge to: `target` of the healthy members that do
/// not vote. Current healthy learners stay (membership does not churn);
/// the places left go to voter-eligible members first, then to zones the
/// replicas do not cover yet, then to the lowest ids. When there are more
/// healthy learners than places, those the same order ranks last go.
pub fn choose_learners(
    candidates: &[ReplicaCandidate],
    voters: &BTreeSet<NodeId>,
    target: usize,
) -> BTreeSet<NodeId> {
    let mut zones: BTreeSet<Option<String>> = candidates
        .iter()
        .filter(|c| voters.contains(&c.id))
        .map(|c| c.zone.clone())
        .collect();
    let mut chosen: Vec<&ReplicaCandidate> = Vec::with_capacity(target);
    let pool: Vec<&ReplicaCandidate> = candidates
        .iter()
        .filter(|c| c.healthy && !voters.contains(&c.id))
        .collect();
    while chosen.len() < target {
        let best = pool
            .iter()
            .filter(|c| !chosen.iter().any(|x| x.id == c.id))
            .max_by_key(|c| {
                (
                    c.is_learner,
                    c.voter_eligible,
                    !zones.contains(&c.zone),
                    std::cmp::Reverse(c.id),
                )
            });
        match best {
            Some(b) => {
                zones.insert(b.zone.clone());
                chosen.push(b);
            }
            None => break,
        }
    }
    chosen.iter().map(|c| c.id).collect()
}

/// The replicas `me` asks for the log, best first: rendezvous hashing, so
/// that the relayed members spread evenly over the replicas and a replica
/// lost or added moves only its own share of them. The leader is asked
/// last (its time goes to the replicas), and `me` never.
pub fn relay_order(
    me: NodeId,
    replicas: impl IntoIterator<Item = NodeId>,
    leader: Option<NodeId>,
) -> Vec<NodeId> {
    let mut order: Vec<NodeId> = replicas.into_iter().filter(|id| *id != me).collect();
    order.sort_by_key(|id| (Some(*id) == leader, std::cmp::Reverse(mix(me, *id)), *id));
    order.dedup();
    order
}

/// A well-mixed 64-bit hash of the pair (splitmix64's finaliser): stable
/// across builds and machines, unlike the standard library's hasher.
fn mix(a: NodeId, b: NodeId) -> u64 {
    let mut z = a
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(b.rotate_left(32))
        .wrapping_add(0x632b_e59b_d9b4_e019);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn cand(id: NodeId, zone: &str, healthy: bool, is_learner: bool) -> ReplicaCandidate {
        ReplicaCandidate {
            id,
            zone: Some(zone.into()),
            healthy,
            is_learner,
            voter_eligible: true,
        }
    }

    #[test]
    fn the_target_grows_with_the_pool_one_learner_per_64_members() {
        assert_eq!(learner_target(1), 2);
        assert_eq!(learner_target(128), 2);
        assert_eq!(learner_target(129), 3);
        assert_eq!(learner_target(500), 8);
        assert_eq!(learner_target(5000), 79);
    }

    #[test]
    fn healthy_learners_stay_and_dead_ones_are_replaced_across_zones() {
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        let cands = [
            cand(1, "a", true, false),
            cand(2, "b", true, false),
            cand(3, "a", true, false),
            cand(4, "a", false, true),
            cand(5, "a", true, true),
            cand(6, "a", true, false),
            cand(7, "c", true, false),
        ];
        let chosen = choose_learners(&cands, &voters, 2);
        assert_eq!(chosen, [5, 7].into(), "4 is dead; 7 brings a new zone");
    }

    #[test]
    fn voter_eligible_members_come_before_new_zones() {
        let mut c = cand(9, "z", true, false);
        c.voter_eligible = false;
        let cands = [cand(1, "a", true, false), c, cand(4, "a", true, false)];
        assert_eq!(choose_learners(&cands, &[1].into(), 1), [4].into());
    }

    #[test]
    fn the_leader_is_asked_last_and_the_asker_never() {
        let order = relay_order(7, [1, 2, 3, 7], Some(2));
        assert_eq!(order.len(), 3);
        assert_eq!(order.last(), Some(&2));
        assert!(!order.contains(&7));
    }

    #[test]
    fn relayed_members_spread_evenly_over_the_replicas() {
        let replicas: Vec<NodeId> = (1..=8).collect();
        let mut load: BTreeMap<NodeId, usize> = BTreeMap::new();
        for me in 100..4100 {
            let first = relay_order(me, replicas.iter().copied(), Some(1))[0];
            *load.entry(first).or_default() += 1;
        }
        assert!(!load.contains_key(&1), "the leader relays to no one");
        // 4,000 members over 7 replicas: about 571 each.
        for (replica, n) in &load {
            assert!((450..700).contains(n), "replica {replica} relays to {n}");
        }
    }

    proptest! {
        #[test]
        fn learners_are_healthy_non_voters_and_as_many_as_fit(
            members in prop::collection::vec((0u8..4, any::<bool>(), any::<bool>(), any::<bool>()), 1..40),
            voters in prop::collection::btree_set(1u64..40, 0..6),
            target in 0usize..10,
        ) {
            let cands: Vec<ReplicaCandidate> = members.iter().enumerate().map(|(i, (z, h, l, e))| ReplicaCandidate {
                id: i as u64 + 1,
                zone: Some(format!("z{z}")),
                healthy: *h,
                is_learner: *l,
                voter_eligible: *e,
            }).collect();
            let chosen = choose_learners(&cands, &voters, target);
            let eligible = cands.iter().filter(|c| c.healthy && !voters.contains(&c.id)).count();
            prop_assert_eq!(chosen.len(), target.min(eligible));
            for id in &chosen {
                let c = cands.iter().find(|c| c.id == *id).expect("a candidate");
                prop_assert!(c.healthy && !voters.contains(id));
            }
            // No churn: a healthy learner is dropped only when the healthy
            // learners alone overfill the places.
            let healthy_learners = cands.iter().filter(|c| c.healthy && c.is_learner && !voters.contains(&c.id)).count();
            if healthy_learners <= target {
                for c in cands.iter().filter(|c| c.healthy && c.is_learner && !voters.contains(&c.id)) {
                    prop_assert!(chosen.contains(&c.id));
                }
            }
            // Choosing again from the outcome changes nothing.
            let again: Vec<ReplicaCandidate> = cands.iter().map(|c| ReplicaCandidate {
                is_learner: chosen.contains(&c.id),
                ..c.clone()
            }).collect();
            prop_assert_eq!(choose_learners(&again, &voters, target), chosen);
        }

        #[test]
        fn the_relay_order_is_every_other_replica_once(
            me in 1u64..50,
            replicas in prop::collection::btree_set(1u64..50, 0..12),
            leader in prop::option::of(1u64..50),
        ) {
            let order = relay_order(me, replicas.iter().copied(), leader);
            let expected: BTreeSet<NodeId> = replicas.iter().copied().filter(|id| *id != me).collect();
            prop_assert_eq!(order.len(), expected.len());
            prop_assert_eq!(order.iter().copied().collect::<BTreeSet<_>>(), expected);
            if let Some(l) = leader {
                if let Some(pos) = order.iter().position(|id| *id == l) {
                    prop_assert_eq!(pos, order.len() - 1);
                }
            }
        }
    }
}
