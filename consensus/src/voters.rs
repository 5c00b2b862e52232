//! Which members vote. Raft's fault tolerance comes from an odd number of
//! voters spread across failure domains: 3 voters survive one loss, 5 survive
//! two, and voters in distinct zones (then racks) survive a zone outage.
//! Everyone else receives the log but does not vote: as a learner, or
//! relayed by one of the ledger's replicas (the replicas module).
//!
//! This module is pure: the leader feeds it the members it knows and how
//! healthy they are, and gets the voter set it should converge to.

use crate::ids::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The protocol version from which members know
/// `Command::CreateVoterJoinToken`.
pub const SINCE_PROTOCOL: u16 = 4;

/// Which members may vote, and so hold the cluster CA's key. A join alone
/// never makes a node a voter: an operator says so when creating its join
/// token (`shoal token create --voter`), as `kubeadm join --control-plane`
/// or a Nomad server's configuration does. The record is the ledger's, not
/// the joiner's: a member cannot rewrite it (its own `UpdateMember` changes
/// only its spec), and it outlives the token, which is pruned a day after
/// it expires.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct VoterEligibility {
    /// Join tokens that admit voter-eligible nodes, by hash.
    pub voter_tokens: BTreeSet<String>,
    /// Members admitted with an ordinary token: learners for good. Kept as
    /// the exceptions so that the members of a ledger older than this
    /// record (every one of which could vote then) keep their eligibility.
    pub learners_only: BTreeSet<NodeId>,
}

impl VoterEligibility {
    pub fn eligible(&self, node: NodeId) -> bool {
        !self.learners_only.contains(&node)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VoterCandidate {
    pub id: NodeId,
    pub zone: Option<String>,
    pub rack: Option<String>,
    /// Reachable recently enough to be trusted with a vote.
    pub healthy: bool,
    pub is_voter: bool,
}

/// How many voters a cluster with `healthy` reachable members should have, or
/// `None` when the membership should be left alone (too few healthy members
/// to form a better configuration than the current one).
pub fn target_voter_count(healthy: usize, total: usize) -> Option<usize> {
    match healthy {
        h if h >= 5 => Some(5),
        h if h >= 3 => Some(3),
        _ if total <= 2 => Some(1),
        _ => None,
    }
}

/// (distinct zones, distinct racks) covered by a set.
fn coverage<'a>(set: impl Iterator<Item = &'a VoterCandidate>) -> (usize, usize) {
    let mut zones = BTreeSet::new();
    let mut racks = BTreeSet::new();
    for c in set {
        zones.insert(c.zone.clone());
        racks.insert((c.zone.clone(), c.rack.clone()));
    }
    (zones.len(), racks.len())
}

/// The voter set the cluster should converge to. The leader always stays a
/// voter (removing it would force an election for nothing). The current set is
/// kept when it is healthy, of the right size, and covers as many failure
/// domains as the best alternative, so that membership does not churn.
pub fn choose_voters(candidates: &[VoterCandidate], leader: NodeId) -> Option<BTreeSet<NodeId>> {
    let healthy: Vec<&VoterCandidate> = candidates
        .iter()
        .filter(|c| c.healthy || c.id == leader)
        .collect();
    let target = target_voter_count(healthy.len(), candidates.len())?.min(healthy.len());
    if target == 0 {
        return None;
    }

    let mut chosen: Vec<&VoterCandidate> = Vec::with_capacity(target);
    if let Some(l) = healthy.iter().find(|c| c.id == leader) {
        chosen.push(l);
    }
    while chosen.len() < target {
        let zones: BTreeSet<_> = chosen.iter().map(|c| c.zone.clone()).collect();
        let racks: BTreeSet<_> = chosen
            .iter()
            .map(|c| (c.zone.clone(), c.rack.clone()))
            .collect();
        let best = healthy
            .iter()
            .filter(|c| !chosen.iter().any(|x| x.id == c.id))
            .max_by_key(|c| {
                (
                    !zones.contains(&c.zone),
                    !racks.contains(&(c.zone.clone(), c.rack.clone())),
                    c.is_voter,
                    std::cmp::Reverse(c.id),
                )
            });
        match best {
            Some(b) => chosen.push(b),
            None => break,
        }
    }

    let current: Vec<&VoterCandidate> = candidates.iter().filter(|c| c.is_voter).collect();
    let current_ok = current.len() == target
        && current.iter().all(|c| c.healthy || c.id == leader)
        && current.iter().any(|c| c.id == leader)
        && coverage(current.iter().copied()) >= coverage(chosen.iter().copied());
    if current_ok {
        return Some(current.iter().map(|c| c.id).collect());
    }
    Some(chosen.iter().map(|c| c.id).collect())
}

/// Why removing a voter now would cost the cluster its quorum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumAtRisk {
    /// The voters that would remain.
    pub remaining: BTreeSet<NodeId>,
    /// Those of them the leader hears from.
    pub answering: BTreeSet<NodeId>,
}

impl std::fmt::Display for QuorumAtRisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let silent: Vec<NodeId> = self
            .remaining
            .difference(&self.answering)
            .copied()
            .collect();
        write!(
            f,
            "it would leave voters {:?}, of which {:?} do not answer the leader, without a majority",
            self.remaining, silent
        )
    }
}

/// Whether `removing` may leave now (etcd's strict reconfiguration check).
/// The leader takes a member that left out of the voters by one change of
/// membership, which commits only with a majority of the old voters and a
/// majority of the new ones: removing a voter while too few of the others
/// answer stops the ledger until the silent ones come back, and for good
/// if they never do (a machine lost with its disk). `answering` are the
/// voters the leader heard from recently, itself included. Removing a
/// member that does not vote, or a voter that does not answer, never
/// costs a quorum that is there: the silent voter counted for nothing,
/// and refusing it would only keep a lost machine's vote in the set
/// (chaos seeds 671 and 685: lost replacements piled up as voters while
/// their removal was refused, until too many of them were dead).
pub fn removal_keeps_a_quorum(
    voters: &BTreeSet<NodeId>,
    removing: NodeId,
    answering: &BTreeSet<NodeId>,
) -> Result<(), QuorumAtRisk> {
    if !voters.contains(&removing) || !answering.contains(&removing) {
        return Ok(());
    }
    let mut remaining = voters.clone();
    remaining.remove(&removing);
    let majority = |set: &BTreeSet<NodeId>| set.intersection(answering).count() * 2 > set.len();
    if majority(voters) && majority(&remaining) {
        return Ok(());
    }
    Err(QuorumAtRisk {
        answering: remaining.intersection(answering).copied().collect(),
        remaining,
    })
}

/// Whether the voters may change from `current` to `desired` now. Raft
/// moves through a joint configuration that commits only with a majority
/// of both sets, and openraft cannot abandon a joint change once it is
/// proposed: a change whose new majority is not answering the leader
/// stops the ledger until enough of the new voters come back, and for
/// good if they never do (chaos seed 2399 ended stuck in such a joint
/// configuration). `answering` are the members the leader heard from
/// recently, itself included.
pub fn change_keeps_a_quorum(
    current: &BTreeSet<NodeId>,
    desired: &BTreeSet<NodeId>,
    answering: &BTreeSet<NodeId>,
) -> Result<(), QuorumAtRisk> {
    let majority = |set: &BTreeSet<NodeId>| set.intersection(answering).count() * 2 > set.len();
    for set in [desired, current] {
        if !majority(set) {
            return Err(QuorumAtRisk {
                remaining: set.clone(),
                answering: set.intersection(answering).copied().collect(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cand(id: NodeId, zone: &str, healthy: bool, is_voter: bool) -> VoterCandidate {
        VoterCandidate {
            id,
            zone: Some(zone.into()),
            rack: None,
            healthy,
            is_voter,
        }
    }

    #[test]
    fn five_nodes_in_three_zones_get_five_voters_spanning_all_zones() {
        let c = vec![
            cand(1, "a", true, true),
            cand(2, "a", true, false),
            cand(3, "b", true, false),
            cand(4, "b", true, false),
            cand(5, "c", true, false),
        ];
        let v = choose_voters(&c, 1).expect("a set");
        assert_eq!(v.len(), 5);
    }

    #[test]
    fn four_healthy_of_five_shrink_to_three_voters_in_three_zones() {
        let c = vec![
            cand(1, "a", true, true),
            cand(2, "a", true, true),
            cand(3, "b", true, true),
            cand(4, "b", false, true),
            cand(5, "c", true, true),
        ];
        let v = choose_voters(&c, 1).expect("a set");
        assert_eq!(v.len(), 3);
        assert!(v.contains(&1) && v.contains(&3) && v.contains(&5), "{v:?}");
    }

    #[test]
    fn a_dead_voter_is_replaced_by_a_healthy_learner() {
        let c = vec![
            cand(1, "a", true, true),
            cand(2, "b", false, true),
            cand(3, "c", true, true),
            cand(4, "b", true, false),
        ];
        let v = choose_voters(&c, 1).expect("a set");
        assert_eq!(v, BTreeSet::from([1, 3, 4]));
    }

    #[test]
    fn three_members_with_one_dead_keep_their_voters() {
        let c = vec![
            cand(1, "a", true, true),
            cand(2, "b", false, true),
            cand(3, "c", true, true),
        ];
        assert_eq!(choose_voters(&c, 1), None);
    }

    #[test]
    fn a_healthy_diverse_set_does_not_churn() {
        let c = vec![
            cand(1, "a", true, true),
            cand(2, "b", true, true),
            cand(3, "c", true, true),
            cand(4, "a", true, false),
        ];
        assert_eq!(choose_voters(&c, 1), Some(BTreeSet::from([1, 2, 3])));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn voter_sets_are_odd_healthy_and_include_the_leader(
            members in prop::collection::vec((0u8..3, 0u8..3, any::<bool>(), any::<bool>()), 1..12),
            leader_pick in any::<prop::sample::Index>(),
        ) {
            let cands: Vec<VoterCandidate> = members.iter().enumerate().map(|(i, (z, r, h, v))| VoterCandidate {
                id: i as u64 + 1,
                zone: Some(format!("z{z}")),
                rack: Some(format!("r{r}")),
                healthy: *h,
                is_voter: *v,
            }).collect();
            let leader = cands[leader_pick.index(cands.len())].id;
            if let Some(v) = choose_voters(&cands, leader) {
                prop_assert!(v.len() % 2 == 1, "even voter count {:?}", v);
                prop_assert!(v.contains(&leader));
                for id in &v {
                    let c = cands.iter().find(|c| c.id == *id).expect("known id");
                    prop_assert!(c.healthy || c.id == leader);
                }
                // Zone coverage is as good as possible for the set size.
                let zones: BTreeSet<_> = cands.iter().filter(|c| c.healthy || c.id == leader).map(|c| c.zone.clone()).collect();
                let covered: BTreeSet<_> = v.iter().filter_map(|id| cands.iter().find(|c| c.id == *id)).map(|c| c.zone.clone()).collect();
                prop_assert_eq!(covered.len(), zones.len().min(v.len()));
            }
        }
    }

    fn ids(v: &[NodeId]) -> BTreeSet<NodeId> {
        v.iter().copied().collect()
    }

    #[test]
    fn a_voter_may_leave_only_while_the_others_keep_a_majority() {
        let voters = ids(&[1, 2, 3]);
        // All answer: any one may go.
        assert_eq!(removal_keeps_a_quorum(&voters, 2, &ids(&[1, 2, 3])), Ok(()));
        // A lost voter may be removed: the two left both answer.
        assert_eq!(removal_keeps_a_quorum(&voters, 1, &ids(&[2, 3])), Ok(()));
        // A live voter may not while another is silent: {1, 3} with 1
        // silent has no majority (chaos seed 511).
        let refused = removal_keeps_a_quorum(&voters, 2, &ids(&[2, 3])).expect_err("refused");
        assert_eq!(refused.remaining, ids(&[1, 3]));
        assert_eq!(refused.answering, ids(&[3]));
        assert!(refused.to_string().contains("[1]"), "{refused}");
        // A learner may always go.
        assert_eq!(removal_keeps_a_quorum(&voters, 7, &ids(&[3])), Ok(()));
        // Four voters, one silent, removing the silent one: three of three
        // answer, but the old set's 3 of 4 is a majority too.
        let four = ids(&[1, 2, 3, 4]);
        assert_eq!(removal_keeps_a_quorum(&four, 4, &ids(&[1, 2, 3])), Ok(()));
        // Four voters, two silent: a silent one may still go (it counted
        // for nothing), a live one may not.
        assert_eq!(removal_keeps_a_quorum(&four, 4, &ids(&[1, 2])), Ok(()));
        assert!(removal_keeps_a_quorum(&four, 2, &ids(&[1, 2])).is_err());
        // Five voters, three lost: every lost one may be removed.
        let five = ids(&[1, 2, 3, 4, 5]);
        for lost in [3, 4, 5] {
            assert_eq!(removal_keeps_a_quorum(&five, lost, &ids(&[1, 2])), Ok(()));
        }
    }

    proptest! {
        #[test]
        fn a_live_voter_leaves_only_if_both_configurations_keep_a_majority(
            voters in proptest::collection::btree_set(1u64..8, 1..6),
            answering in proptest::collection::btree_set(1u64..8, 0..8),
            removing in 1u64..9,
        ) {
            let allowed = removal_keeps_a_quorum(&voters, removing, &answering).is_ok();
            if !voters.contains(&removing) || !answering.contains(&removing) {
                prop_assert!(allowed);
            } else {
                let mut rest = voters.clone();
                rest.remove(&removing);
                let live_old = voters.intersection(&answering).count();
                let live_new = rest.intersection(&answering).count();
                prop_assert_eq!(
                    allowed,
                    live_old * 2 > voters.len() && live_new * 2 > rest.len()
                );
                // The last voter can never go: nothing would remain to vote.
                if rest.is_empty() {
                    prop_assert!(!allowed);
                }
            }
        }
    }

    #[test]
    fn a_change_needs_a_majority_of_both_sets_answering() {
        // Growing {1, 2} to five voters of which three are lost.
        let answering = ids(&[1, 2]);
        let refused = change_keeps_a_quorum(&ids(&[1, 2]), &ids(&[1, 2, 4, 5, 6]), &answering)
            .expect_err("refused");
        assert_eq!(refused.answering, ids(&[1, 2]));
        assert!(refused.to_string().contains("[4, 5, 6]"), "{refused}");
        // Growing to three of those who answer is fine.
        let answering = ids(&[1, 2, 6]);
        assert_eq!(
            change_keeps_a_quorum(&ids(&[1, 2]), &ids(&[1, 2, 6]), &answering),
            Ok(())
        );
        // Replacing a lost voter by one that answers, with the others up.
        assert_eq!(
            change_keeps_a_quorum(&ids(&[1, 2, 3]), &ids(&[1, 2, 4]), &ids(&[1, 2, 4])),
            Ok(())
        );
        // The old set without a majority cannot commit anything.
        assert!(
            change_keeps_a_quorum(&ids(&[1, 2, 3]), &ids(&[1, 4, 5]), &ids(&[1, 4, 5])).is_err()
        );
    }

    proptest! {
        #[test]
        fn an_allowed_change_commits_with_those_answering(
            current in proptest::collection::btree_set(1u64..8, 1..6),
            desired in proptest::collection::btree_set(1u64..8, 1..6),
            answering in proptest::collection::btree_set(1u64..8, 0..8),
        ) {
            let allowed = change_keeps_a_quorum(&current, &desired, &answering).is_ok();
            // The joint configuration commits exactly when a majority of
            // each set answers.
            let joint = [&current, &desired].iter().all(|set| {
                set.iter().filter(|id| answering.contains(id)).count() * 2 > set.len()
            });
            prop_assert_eq!(allowed, joint);
        }
    }
}
