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

use crate::agent::Inner;
use crate::ckpt::{QuicChunkTransport, REPLICAS};
use shoal_consensus::{Command, NodeId};
use shoal_sdk::MemberState;
use shoal_storage::manifest::Manifest;
use shoal_storage::placement::{place_replicas, NodeInfo};
use shoal_storage::replicate::{replicate_manifest, restore_from_replicas};
use shoal_storage::ChunkId;
use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

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

pub async fn run(inner: Weak<Inner>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_scrub = Instant::now();
    let mut last_gc = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(inner) = inner.upgrade() else { return };
        let scrub_every = Duration::from_secs(inner.cfg.storage.scrub_interval_s.max(1));
        if last_scrub.elapsed() >= scrub_every {
            last_scrub = Instant::now();
            let store = inner.chunks.clone();
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
        if last_gc.elapsed() >= Duration::from_secs(inner.cfg.storage.gc_interval_s.max(1)) {
            last_gc = Instant::now();
            collect_garbage(&inner).await;
        }
        let (parts, alive) = match held_parts(&inner) {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "durability check skipped");
                continue;
            }
        };
        for part in parts {
            look_after(&inner, part, &alive).await;
        }
    }
}

/// Every chunk any manifest in the ledger references, on any node: a chunk
/// a node keeps beyond its own holdings is harmless, one deleted while
/// referenced is not.
fn referenced_chunks(inner: &Inner) -> Result<BTreeSet<ChunkId>, String> {
    let data = inner.read_ledger().map_err(|e| e.message)?;
    let manifests = data
        .ledger
        .workload
        .checkpoints
        .values()
        .flatten()
        .flat_map(|c| c.parts.values().map(|p| &p.manifest))
        .chain(data.ledger.namespace.objects.values().map(|o| &o.manifest));
    let mut live = BTreeSet::new();
    for bytes in manifests {
        let manifest = Manifest::from_bytes(bytes).map_err(|e| e.to_string())?;
        live.extend(manifest.unique_chunks().iter().map(|c| c.id));
    }
    Ok(live)
}

async fn collect_garbage(inner: &Arc<Inner>) {
    let live = match referenced_chunks(inner) {
        Ok(live) => live,
        // An unreadable manifest means we cannot know what is referenced.
        Err(e) => {
            tracing::warn!(error = %e, "chunk garbage collection skipped");
            return;
        }
    };
    let store = inner.chunks.clone();
    let grace = Duration::from_secs(inner.cfg.storage.gc_grace_s);
    match tokio::task::spawn_blocking(move || store.gc_older_than(&live, grace)).await {
        Ok(Ok(report)) if report.deleted > 0 => {
            inner.metrics.chunks_collected.inc_by(report.deleted);
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

fn held_parts(inner: &Inner) -> Result<(Vec<HeldPart>, BTreeSet<NodeId>), String> {
    let data = inner.read_ledger().map_err(|e| e.message)?;
    let alive: BTreeSet<NodeId> = data
        .ledger
        .active_members()
        .filter(|m| m.state == MemberState::Alive)
        .map(|m| m.id)
        .collect();
    let mut out = Vec::new();
    for (job, catalog) in &data.ledger.workload.checkpoints {
        for ckpt in catalog.iter().filter(|c| c.committed_at_ms.is_some()) {
            for (rank, part) in &ckpt.parts {
                if part.holders.contains(&inner.id) {
                    out.push(HeldPart {
                        owner: Owner::Checkpoint {
                            job: *job,
                            step: ckpt.step,
                            rank: *rank,
                        },
                        manifest: part.manifest.clone(),
                        holders: part.holders.clone(),
                        // The source copy plus REPLICAS peers, as written.
                        copies: REPLICAS + 1,
                    });
                }
            }
        }
    }
    for object in data.ledger.namespace.objects.values() {
        if object.holders.contains(&inner.id) {
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

async fn look_after(inner: &Arc<Inner>, part: HeldPart, alive: &BTreeSet<NodeId>) {
    let live: Vec<NodeId> = part
        .holders
        .iter()
        .copied()
        .filter(|h| alive.contains(h))
        .collect();
    let responsible = live.iter().min() == Some(&inner.id);
    let wanted = part.copies.min(alive.len());
    let worker = inner.clone();
    let handle = tokio::runtime::Handle::current();
    let owner = part.owner.clone();
    let key = match &owner {
        Owner::Checkpoint { job, step, rank } => format!("{job}/{step}/{rank}"),
        Owner::Object { path } => path.clone(),
    };
    let outcome = tokio::task::spawn_blocking(move || -> Result<Option<Vec<NodeId>>, String> {
        let manifest = Manifest::from_bytes(&part.manifest).map_err(|e| e.to_string())?;
        let transport = QuicChunkTransport::new(worker.clone(), handle);
        let others: Vec<NodeId> = live.iter().copied().filter(|h| *h != worker.id).collect();
        // Missing or quarantined chunks come back from the other holders.
        restore_from_replicas(&manifest, &others, &transport, &worker.chunks)
            .map_err(|e| format!("cannot complete the local copy: {e}"))?;
        if !responsible || live.len() >= wanted {
            return Ok(None);
        }
        let candidates: Vec<NodeInfo> = worker
            .read_ledger()
            .map_err(|e| e.message)?
            .ledger
            .active_members()
            .filter(|m| !live.contains(&m.id))
            .map(|m| NodeInfo {
                id: m.id,
                zone: m.spec.labels.get("zone").cloned(),
                rack: m.spec.labels.get("rack").cloned(),
                alive: m.state == MemberState::Alive,
                free_bytes: None,
            })
            .collect();
        let targets = place_replicas(key.as_bytes(), &candidates, wanted - live.len());
        if targets.is_empty() {
            return Ok(None);
        }
        let report = replicate_manifest(&manifest, &worker.chunks, &targets, &transport, 1)
            .map_err(|e| e.to_string())?;
        let mut holders = live.clone();
        holders.extend(report.complete_nodes());
        Ok(Some(holders))
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
            match inner.write(cmd).await {
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
