//! Keeps committed checkpoints durable. Every node, every few seconds, for
//! each committed checkpoint part it holds:
//!
//! - fetches any chunk it lacks from the other holders (a chunk the scrubber
//!   quarantined as corrupt is gone from the store, so this is also the
//!   repair path), verifying each against its hash;
//! - if it is the lowest-numbered live holder and fewer than
//!   [`crate::ckpt::REPLICAS`] live holders remain (a holder died or left),
//!   copies the part to new peers and records the new holder set.
//!
//! The scrubber re-hashes every stored chunk every `storage.scrub_interval_s`,
//! and every `storage.gc_interval_s` chunks that no checkpoint and no `mesh:`
//! object references any more (removed objects, checkpoints past retention,
//! abandoned uploads) are deleted once older than `storage.gc_grace_s`.

use crate::ckpt::{storage_node, REPLICAS};
use crate::config::StorageTuning;
use crate::metrics::Metrics;
use crate::rpc::chunks::ChunkNet;
use crate::worker::Worker;
use shoal_consensus::{Command, NodeId};
use shoal_sdk::MemberState;
use shoal_storage::manifest::Manifest;
use shoal_storage::placement::place_replicas;
use shoal_storage::replicate::{replicate_manifest, restore_from_replicas};
use shoal_storage::ChunkId;
use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_secs(2);

/// What a held manifest belongs to, and so how new holders are recorded.
#[derive(Clone, Debug)]
enum Owner {
    Checkpoint { job: u64, step: u64, rank: u32 },
    Object { path: String },
}

/// One manifest this node holds and should look after.
struct HeldPart {
    owner: Owner,
    manifest: Vec<u8>,
    holders: Vec<NodeId>,
    /// Live holders wanted.
    copies: usize,
}

/// What to do about one held part, decided from the ledger alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartPlan {
    /// The live holders, in the ledger's order.
    pub live: Vec<NodeId>,
    /// The other live holders, to fetch missing chunks from.
    pub fetch_from: Vec<NodeId>,
    /// New holders to add (this node is the lowest live holder and fewer
    /// than the wanted copies are alive); 0 when nothing is to be added.
    pub add_holders: usize,
    /// This node is the lowest live holder: it alone rewrites the list.
    pub responsible: bool,
}

/// The plan for a part held by `me` with `holders`, `copies` wanted, when
/// `alive` are the live members. Only the lowest-numbered live holder
/// re-replicates, so two holders never both add copies.
pub fn plan_part(
    me: NodeId,
    holders: &[NodeId],
    copies: usize,
    alive: &BTreeSet<NodeId>,
) -> PartPlan {
    let live: Vec<NodeId> = holders
        .iter()
        .copied()
        .filter(|h| alive.contains(h))
        .collect();
    let responsible = live.iter().min() == Some(&me);
    let wanted = copies.min(alive.len());
    PartPlan {
        fetch_from: live.iter().copied().filter(|h| *h != me).collect(),
        add_holders: if responsible {
            wanted.saturating_sub(live.len())
        } else {
            0
        },
        live,
        responsible,
    }
}

/// The holder list after a repair copied the part to `added` (`None`: it
/// stays as it is). Every earlier holder that is still a member stays
/// listed, down or not: a node that is only down comes back with its
/// copy, and an unlisted copy is garbage to the collector. A removed
/// member leaves the list, so the list counts the copies that may exist.
pub fn holders_after_repair(
    before: &[NodeId],
    members: &BTreeSet<NodeId>,
    added: &[NodeId],
) -> Option<Vec<NodeId>> {
    let mut holders: Vec<NodeId> = before
        .iter()
        .copied()
        .filter(|h| members.contains(h))
        .collect();
    if added.iter().all(|n| holders.contains(n)) && holders.len() == before.len() {
        return None;
    }
    for node in added {
        if !holders.contains(node) {
            holders.push(*node);
        }
    }
    Some(holders)
}

/// The durability loop and its handles.
pub struct Durability {
    chunks: ChunkNet,
    metrics: Arc<Metrics>,
    tuning: StorageTuning,
    last_scrub: Instant,
    last_gc: Instant,
}

impl Durability {
    pub fn new(chunks: ChunkNet, metrics: Arc<Metrics>, tuning: StorageTuning) -> Self {
        Durability {
            chunks,
            metrics,
            tuning,
            last_scrub: Instant::now(),
            last_gc: Instant::now(),
        }
    }
}

impl Worker for Durability {
    fn period(&self) -> Duration {
        TICK
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let scrub_every = Duration::from_secs(self.tuning.scrub_interval_s.max(1));
        if self.last_scrub.elapsed() >= scrub_every {
            self.last_scrub = Instant::now();
            let store = self.chunks.store().clone();
            match tokio::task::spawn_blocking(move || store.scrub()).await {
                Ok(Ok(report)) if !report.corrupt.is_empty() => tracing::warn!(
                    corrupt = report.corrupt.len(),
                    checked = report.checked,
                    "scrub quarantined corrupt chunks; fetching good copies from other holders"
                ),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "scrub failed"),
                Err(e) => tracing::warn!(error = %e, "scrub task failed"),
            }
        }
        if self.last_gc.elapsed() >= Duration::from_secs(self.tuning.gc_interval_s.max(1)) {
            self.last_gc = Instant::now();
            self.collect_garbage().await;
        }
        let (parts, alive) = match self.held_parts() {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "durability check skipped");
                return ControlFlow::Continue(());
            }
        };
        for part in parts {
            self.look_after(part, &alive).await;
        }
        ControlFlow::Continue(())
    }
}

impl Durability {
    /// Every chunk any manifest in the ledger references, on any node: a chunk
    /// a node keeps beyond its own holdings is harmless, one deleted while
    /// referenced is not.
    fn referenced_chunks(&self) -> Result<BTreeSet<ChunkId>, String> {
        let data = self.chunks.ledger().read().map_err(|e| e.message)?;
        let manifests = data
            .ledger
            .workload
            .checkpoints
            .values()
            .flatten()
            .flat_map(|c| c.parts.values().map(|p| &p.manifest))
            .chain(data.ledger.namespace.objects.values().map(|o| &o.manifest))
            // Copies of peer regions' checkpoints held here.
            .chain(
                data.ledger
                    .federation
                    .foreign
                    .values()
                    .flat_map(|jobs| jobs.values())
                    .flat_map(|j| j.checkpoint.parts.values().map(|p| &p.manifest)),
            );
        let mut live = BTreeSet::new();
        for bytes in manifests {
            let manifest = Manifest::from_bytes(bytes).map_err(|e| e.to_string())?;
            live.extend(manifest.unique_chunks().iter().map(|c| c.id));
        }
        Ok(live)
    }

    async fn collect_garbage(&self) {
        let live = match self.referenced_chunks() {
            Ok(live) => live,
            // An unreadable manifest means we cannot know what is referenced.
            Err(e) => {
                tracing::warn!(error = %e, "chunk garbage collection skipped");
                return;
            }
        };
        let store = self.chunks.store().clone();
        let grace = Duration::from_secs(self.tuning.gc_grace_s);
        match tokio::task::spawn_blocking(move || store.gc_older_than(&live, grace)).await {
            Ok(Ok(report)) if report.deleted > 0 => {
                self.metrics.chunks_collected.inc_by(report.deleted);
                tracing::info!(
                    deleted = report.deleted,
                    bytes = report.bytes_freed,
                    kept = report.kept,
                    "deleted chunks nothing references any more"
                )
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "chunk garbage collection failed"),
            Err(e) => tracing::warn!(error = %e, "chunk garbage collection task failed"),
        }
    }

    fn held_parts(&self) -> Result<(Vec<HeldPart>, BTreeSet<NodeId>), String> {
        let data = self.chunks.ledger().read().map_err(|e| e.message)?;
        let alive: BTreeSet<NodeId> = data
            .ledger
            .active_members()
            .filter(|m| m.state == MemberState::Alive)
            .map(|m| m.id)
            .collect();
        let mut out = Vec::new();
        for (job, catalog) in &data.ledger.workload.checkpoints {
            let peer_copies = data.ledger.workload.jobs.get(job).map_or(REPLICAS, |j| {
                crate::ckpt::peer_copies(j.spec.ckpt_peer_copies)
            });
            for ckpt in catalog.iter().filter(|c| c.committed_at_ms.is_some()) {
                for (rank, part) in &ckpt.parts {
                    if part.holders.contains(&self.chunks.ledger().me()) {
                        out.push(HeldPart {
                            owner: Owner::Checkpoint {
                                job: *job,
                                step: ckpt.step,
                                rank: *rank,
                            },
                            manifest: part.manifest.clone(),
                            holders: part.holders.clone(),
                            // The source copy plus the job's peers, as written.
                            copies: peer_copies + 1,
                        });
                    }
                }
            }
        }
        for object in data.ledger.namespace.objects.values() {
            if object.holders.contains(&self.chunks.ledger().me()) {
                out.push(HeldPart {
                    owner: Owner::Object {
                        path: object.path.clone(),
                    },
                    manifest: object.manifest.clone(),
                    holders: object.holders.clone(),
                    copies: object.replica as usize,
                });
            }
        }
        Ok((out, alive))
    }

    async fn look_after(&self, part: HeldPart, alive: &BTreeSet<NodeId>) {
        let me = self.chunks.ledger().me();
        let plan = plan_part(me, &part.holders, part.copies, alive);
        let net = self.chunks.clone();
        let handle = tokio::runtime::Handle::current();
        let owner = part.owner.clone();
        let key = match &owner {
            Owner::Checkpoint { job, step, rank } => format!("{job}/{step}/{rank}"),
            Owner::Object { path } => path.clone(),
        };
        let outcome =
            tokio::task::spawn_blocking(move || -> Result<Option<Vec<NodeId>>, String> {
                let manifest = Manifest::from_bytes(&part.manifest).map_err(|e| e.to_string())?;
                let transport = net.transport(handle);
                // Missing or quarantined chunks come back from the other holders.
                restore_from_replicas(&manifest, &plan.fetch_from, &transport, net.store())
                    .map_err(|e| format!("cannot complete the local copy: {e}"))?;
                // Nothing to add and every holder alive: nothing to rewrite
                // (the common case, without reading the ledger).
                let all_alive = plan.live.len() == part.holders.len();
                if !plan.responsible || (plan.add_holders == 0 && all_alive) {
                    return Ok(None);
                }
                let (candidates, members): (Vec<_>, BTreeSet<NodeId>) = {
                    let data = net.ledger().read().map_err(|e| e.message)?;
                    let active: Vec<_> = data.ledger.active_members().collect();
                    (
                        active
                            .iter()
                            // Members that are not alive are skipped by
                            // `place_replicas` (`storage_node` sets `alive`).
                            .filter(|m| !part.holders.contains(&m.id))
                            .map(|m| storage_node(m))
                            .collect(),
                        active.iter().map(|m| m.id).collect(),
                    )
                };
                // Every candidate in rendezvous order, so that a target that
                // fails (cut off, full, not yet serving) gives way to the
                // next one instead of being retried alone at every tick
                // while the part stays on too few nodes.
                let ranked = match plan.add_holders {
                    0 => Vec::new(),
                    _ => place_replicas(key.as_bytes(), &candidates, candidates.len()),
                };
                let mut added: Vec<NodeId> = Vec::new();
                let mut rest = &ranked[..];
                while added.len() < plan.add_holders && !rest.is_empty() {
                    let take = (plan.add_holders - added.len()).min(rest.len());
                    let (targets, later) = rest.split_at(take);
                    rest = later;
                    match replicate_manifest(&manifest, net.store(), targets, &transport, 1) {
                        Ok(report) => added.extend(report.complete_nodes()),
                        Err(e) => {
                            tracing::debug!(?targets, error = %e, "a repair target failed; trying the next")
                        }
                    }
                }
                Ok(holders_after_repair(&part.holders, &members, &added))
            })
            .await;
        match outcome {
            Ok(Ok(Some(holders))) => {
                let cmd = match owner.clone() {
                    Owner::Checkpoint { job, step, rank } => Command::SetCheckpointHolders {
                        job,
                        step,
                        rank,
                        holders: holders.clone(),
                    },
                    Owner::Object { path } => Command::SetObjectHolders {
                        path,
                        holders: holders.clone(),
                    },
                };
                match self.chunks.ledger().write(cmd).await {
                    Ok(_) => tracing::info!(?owner, ?holders, "re-replicated"),
                    Err(e) => {
                        tracing::warn!(?owner, error = %e.message, "could not record new holders")
                    }
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::warn!(?owner, error = %e, "not repaired"),
            Err(e) => tracing::warn!(?owner, error = %e, "repair task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn the_lowest_live_holder_replaces_dead_ones() {
        // Holders 2, 3, 5 of 4 wanted; 3 died: the lowest live holder adds two.
        let alive = set(&[1, 2, 4, 5, 6]);
        let plan = plan_part(2, &[2, 3, 5], 4, &alive);
        assert_eq!(plan.fetch_from, vec![5]);
        assert_eq!(plan.add_holders, 2);
        // Another live holder only completes its own copy.
        let plan = plan_part(5, &[2, 3, 5], 4, &alive);
        assert_eq!(plan.fetch_from, vec![2]);
        assert_eq!(plan.add_holders, 0);
    }

    #[test]
    fn a_repair_keeps_down_holders_listed_and_drops_removed_ones() {
        let members = set(&[1, 2, 3, 4]);
        // 2 is down, not removed: it stays listed beside the new copy on 4.
        assert_eq!(
            holders_after_repair(&[1, 2, 3], &members, &[4]),
            Some(vec![1, 2, 3, 4])
        );
        // A repair whose copies all failed changes nothing.
        assert_eq!(holders_after_repair(&[1, 2, 3], &members, &[]), None);
        assert_eq!(holders_after_repair(&[1, 2, 3], &members, &[3]), None);
        // 5 was removed: it leaves the list, with or without a new copy.
        assert_eq!(
            holders_after_repair(&[1, 5, 3], &members, &[]),
            Some(vec![1, 3])
        );
        assert_eq!(
            holders_after_repair(&[1, 5, 3], &members, &[4]),
            Some(vec![1, 3, 4])
        );
    }

    #[test]
    fn copies_are_capped_by_the_live_members() {
        let alive = set(&[1, 2]);
        assert_eq!(plan_part(1, &[1, 2], 4, &alive).add_holders, 0);
        assert_eq!(plan_part(1, &[1], 4, &alive).add_holders, 1);
    }

    proptest! {
        /// Whatever the holders and liveness: exactly one live holder (the
        /// lowest) may add holders, nobody fetches from itself or from a
        /// dead node, and the part never grows past the wanted copies.
        #[test]
        fn one_holder_adds_and_never_too_many(
            holders in proptest::collection::btree_set(1u64..12, 1..6),
            alive in proptest::collection::btree_set(1u64..12, 0..12),
            copies in 1usize..6,
        ) {
            let holders: Vec<NodeId> = holders.into_iter().collect();
            let adders: Vec<NodeId> = holders
                .iter()
                .copied()
                .filter(|h| alive.contains(h))
                .filter(|h| plan_part(*h, &holders, copies, &alive).add_holders > 0)
                .collect();
            prop_assert!(adders.len() <= 1);
            for &me in holders.iter().filter(|h| alive.contains(h)) {
                let plan = plan_part(me, &holders, copies, &alive);
                prop_assert!(!plan.fetch_from.contains(&me));
                prop_assert!(plan.fetch_from.iter().all(|h| alive.contains(h)));
                prop_assert_eq!(plan.live.len(), plan.fetch_from.len() + 1);
                let live = plan.live.len();
                prop_assert!(live + plan.add_holders <= copies.max(live));
                prop_assert!(live + plan.add_holders <= alive.len().max(live));
            }
        }
    }
}
