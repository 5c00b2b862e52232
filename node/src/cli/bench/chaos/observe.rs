//! Watches every entry every node applies: checks the ledger's invariants
//! at that index, and compares the ledger each node reached at that index
//! with what the first node to apply it reached (a digest of its
//! encoding: the ledger holds only ordered maps, so equal ledgers encode
//! equally). Two nodes that disagree at one index have diverged, however
//! they look later.

use shoal_chaos::Violation;
use shoal_consensus::store::ApplyObserver;
use shoal_consensus::Ledger;
use shoal_consensus::NodeId;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

/// Violations kept per run: past that, one more of the same kind says
/// nothing new and costs memory.
const MAX_VIOLATIONS: usize = 50;

/// Nodes whose data dir is gone for good, as the run loses them.
pub type LostDisks = Arc<Mutex<BTreeSet<NodeId>>>;

/// A checkpoint part: (job, step, rank).
pub type PartKey = (u64, u64, u32);

/// Losses of one checkpoint part. Repair rewrites the holder list (the
/// lost holders leave it, new copies join it), so neither the final list
/// nor any single one shows that a part listed on {A, B} lost A, was
/// listed on {B} alone while repair had not yet copied it, and then lost
/// B: counted per list, that is one loss at a time, and the part is gone.
#[derive(Default)]
struct PartLosses {
    /// Holders lost since the part last had two live holders listed.
    since_two_live: BTreeSet<NodeId>,
    worst: usize,
}

impl PartLosses {
    fn update(&mut self, holders: &BTreeSet<NodeId>, lost: &BTreeSet<NodeId>) {
        let lost_now: BTreeSet<NodeId> = holders.intersection(lost).copied().collect();
        if holders.len() - lost_now.len() >= 2 {
            self.since_two_live = lost_now;
        } else {
            self.since_two_live.extend(lost_now);
        }
        self.worst = self.worst.max(self.since_two_live.len());
    }
}

#[derive(Default)]
struct State {
    /// Per committed checkpoint part, the holders it lost since it last
    /// had two live copies listed, and the most of those at any index.
    parts: HashMap<PartKey, PartLosses>,
    /// The same per `mesh:/` object, by path (objects are repaired the
    /// same way, so the same pruning hides their losses).
    objects: HashMap<String, PartLosses>,
    /// The first digest seen at each index, and which node it came from.
    digests: HashMap<u64, (String, blake3::Hash)>,
    violations: Vec<Violation>,
    seen: BTreeSet<(String, String)>,
    applied: u64,
    highest: u64,
}

#[derive(Default)]
pub struct AppliedWatch {
    state: Mutex<State>,
    lost: LostDisks,
}

impl AppliedWatch {
    pub fn new() -> Arc<AppliedWatch> {
        Arc::new(AppliedWatch::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The set the cluster adds a node to when its disk is gone.
    pub fn lost_disks(&self) -> LostDisks {
        self.lost.clone()
    }

    /// The most holders of `part` lost at once, over the run.
    pub fn worst_holders_lost(&self, part: PartKey) -> usize {
        self.lock().parts.get(&part).map_or(0, |p| p.worst)
    }

    /// The most holders of object `path` lost at once, over the run.
    pub fn worst_object_holders_lost(&self, path: &str) -> usize {
        self.lock().objects.get(path).map_or(0, |p| p.worst)
    }

    /// The observer to install in node `node`.
    pub fn observer(self: &Arc<Self>, node: &str) -> ApplyObserver {
        let watch = self.clone();
        let node = node.to_string();
        Arc::new(move |index: u64, ledger: &Ledger| watch.applied(&node, index, ledger))
    }

    fn applied(&self, node: &str, index: u64, ledger: &Ledger) {
        let found = shoal_chaos::invariants::check_applied(index, ledger);
        let digest = match bincode::serialize(ledger) {
            Ok(bytes) => blake3::hash(&bytes),
            Err(_) => return,
        };
        let lost = self
            .lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut state = self.lock();
        if !lost.is_empty() {
            for (job, catalog) in &ledger.workload.checkpoints {
                for ckpt in catalog.iter().filter(|c| c.committed_at_ms.is_some()) {
                    for (rank, part) in &ckpt.parts {
                        let holders: BTreeSet<NodeId> = part.holders.iter().copied().collect();
                        state
                            .parts
                            .entry((*job, ckpt.step, *rank))
                            .or_default()
                            .update(&holders, &lost);
                    }
                }
            }
            for (path, object) in &ledger.namespace.objects {
                let holders: BTreeSet<NodeId> = object.holders.iter().copied().collect();
                match state.objects.get_mut(path) {
                    Some(losses) => losses.update(&holders, &lost),
                    None => {
                        let mut losses = PartLosses::default();
                        losses.update(&holders, &lost);
                        state.objects.insert(path.clone(), losses);
                    }
                }
            }
        }
        state.applied += 1;
        state.highest = state.highest.max(index);
        let diverged = match state.digests.get(&index) {
            Some((first, seen)) if *seen != digest => Some(Violation::new(
                "diverged",
                format!(
                    "node {node} reached a different ledger than node {first} at index {index}"
                ),
            )),
            Some(_) => None,
            None => {
                state.digests.insert(index, (node.to_string(), digest));
                None
            }
        };
        for v in found.into_iter().chain(diverged) {
            push(&mut state, v);
        }
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.lock().violations.clone()
    }

    /// Entries applied, summed over nodes, and the highest index seen.
    pub fn applied_counts(&self) -> (u64, u64) {
        let state = self.lock();
        (state.applied, state.highest)
    }
}

fn push(state: &mut State, v: Violation) {
    if state.violations.len() < MAX_VIOLATIONS
        && state.seen.insert((v.property.clone(), v.detail.clone()))
    {
        state.violations.push(v);
    }
}

#[cfg(test)]
mod tests {
    use super::PartLosses;
    use std::collections::BTreeSet;

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn losses_add_up_across_holder_lists_until_two_copies_are_live_again() {
        let mut part = PartLosses::default();
        part.update(&set(&[1, 2]), &set(&[]));
        part.update(&set(&[1, 2]), &set(&[1]));
        assert_eq!(part.worst, 1);
        // Repair dropped the lost holder before it could add a copy.
        part.update(&set(&[2]), &set(&[1]));
        assert_eq!(part.worst, 1);
        part.update(&set(&[2]), &set(&[1, 2]));
        assert_eq!(part.worst, 2, "both copies the part ever had are gone");
    }

    #[test]
    fn a_repaired_part_starts_counting_again() {
        let mut part = PartLosses::default();
        part.update(&set(&[1, 2]), &set(&[1]));
        part.update(&set(&[2, 3]), &set(&[1]));
        part.update(&set(&[2, 3]), &set(&[1, 2]));
        assert_eq!(part.worst, 1, "3 still holds it");
        part.update(&set(&[3]), &set(&[1, 2]));
        part.update(&set(&[3]), &set(&[1, 2, 3]));
        assert_eq!(part.worst, 2);
    }
}
