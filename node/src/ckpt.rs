//! Checkpoint replication and restore on top of `shoal-storage`.
//!
//! When a rank completes step N (`$SHOAL_CKPT_DIR/N/.done`), its agent
//! chunks the directory into the local chunk store, pushes the chunks to up
//! to three peers chosen by failure-domain-aware rendezvous hashing over the
//! live members — down a chain, so the source sends each chunk once and
//! every peer stores it and forwards it to the next — and records the rank's part (manifest and holders) in the
//! ledger once a write quorum of two peers (fewer in smaller clusters) holds
//! every chunk. The step is committed when every rank's part is recorded.
//!
//! On restart from step N every rank restores *all* parts of N (the union)
//! into its own `$SHOAL_CKPT_DIR/N/`, fetching missing chunks from the
//! holders and verifying every chunk against its hash.
//!
//! Chunks travel over the cluster's mutual-TLS quinn RPC (`Request::Chunk`).
//! `shoal-storage` is synchronous, so the transport runs on blocking threads
//! and drives the async RPC with the runtime handle.

use crate::rpc::chunks::{ChunkNet, NodeChunkTransport};
use shoal_consensus::workload::{Checkpoint, CkptPart};
use shoal_consensus::NodeId;
use shoal_sdk::MemberState;
use shoal_storage::manifest::{build_manifest, restore_manifest, Manifest};
use shoal_storage::placement::{place_replicas, NodeInfo};
use shoal_storage::replicate::{replicate_chained, restore_from_replicas_parallel};
use std::path::{Path, PathBuf};

/// Peers that receive a copy of every checkpoint part.
pub const REPLICAS: usize = 3;
/// Durable copies on peers before a part is recorded.
pub const WRITE_QUORUM: usize = 2;
/// Chunks fetched at once during a restore, spread over the holders.
pub const FETCH_THREADS: usize = 4;
/// Chunks travelling down replication chains at once: enough that every
/// hop of a three-node chain is busy while the others store.
pub const CHAIN_IN_FLIGHT: usize = 4;

/// A member as replica placement sees it: failure domains and liveness.
pub fn storage_node(m: &shoal_consensus::ledger::Member) -> NodeInfo {
    NodeInfo {
        id: m.id,
        zone: m.spec.labels.get("zone").cloned(),
        rack: m.spec.labels.get("rack").cloned(),
        alive: m.state == MemberState::Alive,
        free_bytes: None,
    }
}

/// Peers that receive a part of a job that asked for `peer_copies` (0: the
/// default, [`REPLICAS`]).
pub fn peer_copies(peer_copies: u32) -> usize {
    match peer_copies {
        0 => REPLICAS,
        n => (n as usize).min(REPLICAS),
    }
}

/// `count` peers for a part, spread over zones and racks, never this node.
pub fn choose_targets(net: &ChunkNet, key: &str, count: usize) -> Result<Vec<NodeId>, String> {
    let data = net
        .ledger()
        .read()
        .map_err(|e| format!("cannot read the ledger to place the copies: {}", e.message))?;
    let nodes: Vec<NodeInfo> = data
        .ledger
        .active_members()
        .filter(|m| m.id != net.ledger().me())
        .map(storage_node)
        .collect();
    let targets = place_replicas(key.as_bytes(), &nodes, count);
    check_targets(&targets, count, nodes.len())?;
    Ok(targets)
}

/// Only a node with no other member may keep a part to itself. With other
/// members and none of them alive (this node cut off, or the ledger's view
/// of liveness stale), a part recorded now would have one copy and be lost
/// with this node's disk; the step waits for a peer instead.
pub fn check_targets(
    targets: &[NodeId],
    wanted: usize,
    other_members: usize,
) -> Result<(), String> {
    if targets.is_empty() && wanted > 0 && other_members > 0 {
        return Err(format!(
            "no live peer to copy to: none of the {other_members} other members is alive"
        ));
    }
    Ok(())
}

/// What a replication push achieved.
pub struct PushOutcome {
    pub complete: Vec<NodeId>,
    pub failed: Vec<(NodeId, String)>,
    /// Frame bytes that left the source (one copy per chunk down a chain).
    pub bytes_sent: u64,
    /// When `quorum` targets held everything (None: never).
    pub quorum_after: Option<std::time::Duration>,
}

/// Pushes `manifest`'s chunks down a chain of the targets, several chunks in
/// flight at once. Every target of a chain receives each chunk at about the
/// same time, so the quorum and the full replica set complete together.
/// Blocking.
pub fn push_chained(
    manifest: &Manifest,
    store: &shoal_storage::ChunkStore,
    targets: &[NodeId],
    transport: &NodeChunkTransport,
    quorum: usize,
) -> PushOutcome {
    let started = std::time::Instant::now();
    let mut outcome = PushOutcome {
        complete: Vec::new(),
        failed: Vec::new(),
        bytes_sent: 0,
        quorum_after: None,
    };
    match replicate_chained(manifest, store, targets, transport, quorum, CHAIN_IN_FLIGHT) {
        Ok(report) => {
            if report.quorum_reached {
                outcome.quorum_after = Some(started.elapsed());
            }
            outcome.bytes_sent = report.source_bytes;
            outcome.complete = report.complete_nodes();
            outcome.failed = report
                .failed_nodes()
                .into_iter()
                .map(|(node, e)| (node, e.to_string()))
                .collect();
        }
        Err(e) => {
            outcome.failed = targets.iter().map(|&t| (t, e.to_string())).collect();
        }
    }
    outcome
}

/// Stores and replicates one rank's part of a step on `copies` peers;
/// blocking. Returns the part to record in the ledger.
pub fn replicate_part(
    net: &ChunkNet,
    handle: tokio::runtime::Handle,
    job: u64,
    rank: u32,
    step: u64,
    dir: &Path,
    copies: usize,
) -> Result<CkptPart, String> {
    let (manifest, _) = build_manifest(dir, net.store())
        .map_err(|e| format!("cannot store checkpoint {}: {e}", dir.display()))?;
    let targets = choose_targets(net, &format!("{job}/{step}/{rank}"), copies)
        .map_err(|e| format!("checkpoint step {step}: {e}"))?;
    replicate_manifest(net, handle, &manifest, &targets, step)
}

/// Pushes a stored manifest's chunks to `targets` and returns the part
/// with its holders (this node and every target that took it all), once
/// a write quorum holds it; blocking.
pub fn replicate_manifest(
    net: &ChunkNet,
    handle: tokio::runtime::Handle,
    manifest: &Manifest,
    targets: &[NodeId],
    step: u64,
) -> Result<CkptPart, String> {
    let mut holders = vec![net.ledger().me()];
    // A one-node cluster has nobody to copy to; the local copy is all there is.
    if !targets.is_empty() {
        let quorum = WRITE_QUORUM.min(targets.len());
        let transport = net.transport(handle);
        let pushed = push_chained(manifest, net.store(), targets, &transport, quorum);
        if pushed.complete.len() < quorum {
            return Err(format!(
                "checkpoint step {step} reached {} of {quorum} replicas: {:?}",
                pushed.complete.len(),
                pushed.failed
            ));
        }
        holders.extend(pushed.complete);
    }
    Ok(CkptPart {
        manifest: manifest.to_bytes().map_err(|e| e.to_string())?,
        bytes: manifest.total_bytes,
        holders,
    })
}

/// Makes `<ckpt_dir>/<step>/` hold the union of every rank's part; blocking.
/// Files already present are kept (a rank's own part survives locally).
pub fn restore_checkpoint(
    net: &ChunkNet,
    handle: tokio::runtime::Handle,
    checkpoint: &Checkpoint,
    ckpt_dir: &Path,
) -> Result<u64, String> {
    let target = ckpt_dir.join(checkpoint.step.to_string());
    std::fs::create_dir_all(&target)
        .map_err(|e| format!("cannot create {}: {e}", target.display()))?;
    let transport = net.transport(handle);
    let mut restored = 0;
    for (rank, part) in &checkpoint.parts {
        let manifest = Manifest::from_bytes(&part.manifest)
            .map_err(|e| format!("rank {rank}'s manifest is unreadable: {e}"))?;
        // Nearest first would be better; local copies are always tried first.
        let mut holders = part.holders.clone();
        holders.sort_by_key(|h| *h != net.ledger().me());
        restore_from_replicas_parallel(&manifest, &holders, &transport, net.store(), FETCH_THREADS)
            .map_err(|e| {
                format!(
                    "cannot fetch rank {rank}'s part of step {}: {e}",
                    checkpoint.step
                )
            })?;
        let staging = ckpt_dir.join(format!(".restore-{}-{rank}", checkpoint.step));
        let _ = std::fs::remove_dir_all(&staging);
        let stats = restore_manifest(&manifest, net.store(), &staging).map_err(|e| {
            format!(
                "cannot restore rank {rank}'s part of step {}: {e}",
                checkpoint.step
            )
        })?;
        merge_into(&staging, &target)?;
        let _ = std::fs::remove_dir_all(&staging);
        restored += stats.bytes_written;
    }
    Ok(restored)
}

/// Moves every file of `from` into `to`, keeping files that already exist.
pub fn merge_into(from: &Path, to: &Path) -> Result<(), String> {
    let entries =
        std::fs::read_dir(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let source: PathBuf = entry.path();
        let dest = to.join(entry.file_name());
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if is_dir {
            std::fs::create_dir_all(&dest)
                .map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
            merge_into(&source, &dest)?;
        } else if !dest.exists() {
            std::fs::rename(&source, &dest)
                .map_err(|e| format!("cannot move {} into place: {e}", dest.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::testkit::LocalCluster;
    use std::time::Duration;

    #[test]
    fn a_part_is_kept_alone_only_by_a_node_without_other_members() {
        assert!(check_targets(&[], 3, 0).is_ok(), "a one-node cluster");
        assert!(check_targets(&[], 0, 2).is_ok(), "no peer copies asked for");
        assert!(check_targets(&[2], 3, 2).is_ok(), "one live peer of two");
        let err = check_targets(&[], 3, 2).expect_err("two members, none alive");
        assert!(err.contains("no live peer"), "{err}");
    }

    fn random_file(path: &Path, bytes: usize, seed: u64) {
        let data = crate::cli::bench::data::Xorshift::new(seed).bytes(bytes);
        std::fs::write(path, data).expect("write");
    }

    /// Over real QUIC: every chunk reaches all three peers while only one
    /// copy leaves the source; with the chain's middle node stopped, the
    /// other two still complete a quorum and the source still sends once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chain_delivers_three_copies_for_one_sent() {
        let cluster = LocalCluster::start(4, |_, cfg| cfg.executor.enabled = false)
            .await
            .expect("cluster");
        cluster
            .wait_all_alive(Duration::from_secs(30))
            .await
            .expect("alive");
        let source = cluster.agents[0].node().chunks().clone();
        let peers: Vec<ChunkNet> = cluster.agents[1..]
            .iter()
            .map(|a| a.node().chunks().clone())
            .collect();
        let targets: Vec<NodeId> = peers.iter().map(|p| p.ledger().me()).collect();
        let root = cluster.root().to_path_buf();
        let handle = tokio::runtime::Handle::current();

        let push = |name: &str, seed: u64| {
            let (source, targets, handle) = (source.clone(), targets.clone(), handle.clone());
            let dir = root.join(name);
            tokio::task::spawn_blocking(move || {
                std::fs::create_dir_all(&dir).expect("mkdir");
                random_file(&dir.join("weights.bin"), 9 << 20, seed);
                let (manifest, _) = build_manifest(&dir, source.store()).expect("manifest");
                let frame_bytes: u64 = manifest
                    .unique_chunks()
                    .iter()
                    .map(|c| {
                        source
                            .store()
                            .get_encoded(&c.id)
                            .expect("local")
                            .stored_len()
                    })
                    .sum();
                let transport = source.transport(handle);
                let pushed = push_chained(&manifest, source.store(), &targets, &transport, 2);
                (manifest, frame_bytes, pushed)
            })
        };

        let (manifest, frame_bytes, pushed) = push("a", 1).await.expect("push");
        assert!(manifest.unique_chunks().len() > 1);
        assert_eq!(pushed.complete, targets, "{:?}", pushed.failed);
        assert_eq!(pushed.bytes_sent, frame_bytes, "one copy left the source");
        for peer in &peers {
            for chunk in manifest.unique_chunks() {
                assert!(peer.store().contains(&chunk.id).expect("contains"));
            }
        }

        cluster.agents[2].shutdown().await;
        let (manifest, frame_bytes, pushed) = push("b", 2).await.expect("push");
        assert_eq!(
            pushed.complete,
            [targets[0], targets[2]],
            "{:?}",
            pushed.failed
        );
        assert_eq!(pushed.failed.len(), 1);
        assert_eq!(pushed.failed[0].0, targets[1]);
        assert!(pushed.quorum_after.is_some());
        assert_eq!(
            pushed.bytes_sent, frame_bytes,
            "the head forwarded past the gap"
        );
        for peer in [&peers[0], &peers[2]] {
            for chunk in manifest.unique_chunks() {
                assert!(peer.store().contains(&chunk.id).expect("contains"));
            }
        }
        cluster.shutdown().await;
    }
}
