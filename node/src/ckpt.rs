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

use crate::agent::Inner;
use crate::proto::{self, ChunkRequest, ErrorCode, Request, Response, WireError};
use shoal_consensus::workload::{Checkpoint, CkptPart};
use shoal_consensus::NodeId;
use shoal_sdk::MemberState;
use shoal_storage::chunk::{ChunkId, EncodedChunk};
use shoal_storage::manifest::{build_manifest, restore_manifest, Manifest};
use shoal_storage::placement::{place_replicas, NodeInfo};
use shoal_storage::replicate::{
    replicate_chained, restore_from_replicas_parallel, ChainPush, ChunkTransport, TransportError,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Peers that receive a copy of every checkpoint part.
pub const REPLICAS: usize = 3;
/// Durable copies on peers before a part is recorded.
pub const WRITE_QUORUM: usize = 2;
const CHUNK_RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a chunk call waits for this node's ledger to learn of a member
/// that joined a moment ago.
const MEMBER_CATCH_UP: Duration = Duration::from_secs(2);
/// Chunks fetched at once during a restore, spread over the holders.
pub const FETCH_THREADS: usize = 4;
/// Chunks travelling down replication chains at once: enough that every
/// hop of a three-node chain is busy while the others store.
pub const CHAIN_IN_FLIGHT: usize = 4;

/// Chunk push/fetch/has over quinn to other members.
pub struct QuicChunkTransport {
    inner: Arc<Inner>,
    handle: tokio::runtime::Handle,
}

impl QuicChunkTransport {
    pub fn new(inner: Arc<Inner>, handle: tokio::runtime::Handle) -> Self {
        QuicChunkTransport { inner, handle }
    }

    /// The RPC address of member `node` in this node's ledger. A node id
    /// this ledger has not issued yet belongs to a member that joined a
    /// moment ago (the target came from a newer view: the leader's
    /// placement, or the previous hop of a chain), so the lookup waits for
    /// this ledger to catch up, for up to `MEMBER_CATCH_UP`, waking on every
    /// apply. An id below `next_node_id` that is not a member was removed
    /// and fails at once.
    fn addr_of(&self, node: u64) -> Result<SocketAddr, TransportError> {
        let unreachable = |reason: String| TransportError::Unreachable { node, reason };
        let deadline = Instant::now() + MEMBER_CATCH_UP;
        let mut applied = self.inner.raft.metrics();
        loop {
            {
                let data = self
                    .inner
                    .read_ledger()
                    .map_err(|e| unreachable(e.message))?;
                if let Some(member) = data.ledger.members.get(&node) {
                    return member.spec.rpc_addr.parse().map_err(|_| {
                        unreachable(format!("invalid address '{}'", member.spec.rpc_addr))
                    });
                }
                if node < data.ledger.next_node_id {
                    return Err(unreachable("not a member".into()));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(unreachable(format!(
                    "no known address (this node's ledger has not learnt of it within {MEMBER_CATCH_UP:?})"
                )));
            }
            match self
                .handle
                .block_on(tokio::time::timeout(left, applied.changed()))
            {
                Ok(Ok(())) | Err(_) => {}
                Ok(Err(_)) => return Err(unreachable("this node is shutting down".into())),
            }
        }
    }

    /// One chunk RPC; `id` names the chunk in errors.
    fn call(&self, node: u64, id: ChunkId, req: ChunkRequest) -> Result<Response, TransportError> {
        self.call_within(node, id, req, CHUNK_RPC_TIMEOUT)
    }

    fn call_within(
        &self,
        node: u64,
        id: ChunkId,
        req: ChunkRequest,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        let reply = if node == self.inner.id {
            self.inner.serve_chunk(&self.handle, req)
        } else {
            let addr = self.addr_of(node)?;
            let body = proto::encode(&Request::Chunk(req));
            let bytes = self
                .handle
                .block_on(self.inner.rpc.call(addr, &body, timeout))
                .map_err(|e| TransportError::Unreachable {
                    node,
                    reason: e.to_string(),
                })?;
            proto::decode::<Response>(&bytes).unwrap_or_else(Response::Error)
        };
        match reply {
            Response::Error(e) if e.message.contains("full") => {
                Err(TransportError::StoreFull { node, id })
            }
            Response::Error(e)
                if e.message.contains("not found") || e.message.contains("missing") =>
            {
                Err(TransportError::NotFound { node, id })
            }
            Response::Error(e) => Err(TransportError::Rejected {
                node,
                id,
                reason: e.message,
            }),
            other => Ok(other),
        }
    }
}

fn unexpected(node: u64, id: ChunkId, answer: &Response) -> TransportError {
    TransportError::Rejected {
        node,
        id,
        reason: format!("unexpected answer {answer:?}"),
    }
}

impl ChunkTransport for QuicChunkTransport {
    fn push(&self, node: u64, chunk: &EncodedChunk) -> Result<(), TransportError> {
        let id = chunk.id();
        let req = ChunkRequest::Put {
            id,
            frame: chunk.bytes().to_vec(),
        };
        match self.call(node, id, req)? {
            Response::ChunkStored => Ok(()),
            other => Err(unexpected(node, id, &other)),
        }
    }

    fn fetch(&self, node: u64, id: &ChunkId) -> Result<EncodedChunk, TransportError> {
        match self.call(node, *id, ChunkRequest::Fetch { id: *id })? {
            Response::Chunk(frame) => {
                EncodedChunk::from_wire(*id, frame).map_err(|e| TransportError::Rejected {
                    node,
                    id: *id,
                    reason: e.to_string(),
                })
            }
            other => Err(unexpected(node, *id, &other)),
        }
    }

    /// Sends the frame to the first node of `chain` that answers, asking it
    /// to forward down the rest; a head that cannot be reached is reported
    /// and the next node becomes the head.
    fn push_chain(&self, chain: &[u64], chunk: &EncodedChunk) -> ChainPush {
        let id = chunk.id();
        let mut outcomes = Vec::with_capacity(chain.len());
        let mut source_sends = 0;
        for (head, &node) in chain.iter().enumerate() {
            let forward = chain[head + 1..].to_vec();
            // Each hop waits for the ones below it.
            let timeout = CHUNK_RPC_TIMEOUT * (forward.len() as u32 + 1);
            let req = ChunkRequest::PutChain {
                id,
                frame: chunk.bytes().to_vec(),
                forward,
            };
            source_sends += 1;
            match self.call_within(node, id, req, timeout) {
                Ok(Response::ChainStored(answers)) if answers.len() == chain.len() - head => {
                    outcomes.extend(answers);
                    return ChainPush {
                        outcomes,
                        source_sends,
                    };
                }
                Ok(other) => {
                    outcomes.push(Err(unexpected(node, id, &other)));
                    // It answered, so it was reachable but is not a chain
                    // member we understand: try the rest from here.
                }
                Err(error) => outcomes.push(Err(error)),
            }
        }
        ChainPush {
            outcomes,
            source_sends,
        }
    }

    fn has(&self, node: u64, ids: &[ChunkId]) -> Result<Vec<bool>, TransportError> {
        let Some(first) = ids.first().copied() else {
            return Ok(Vec::new());
        };
        match self.call(node, first, ChunkRequest::Has { ids: ids.to_vec() })? {
            Response::Has(v) if v.len() == ids.len() => Ok(v),
            other => Err(unexpected(node, first, &other)),
        }
    }
}

impl Inner {
    /// Serves a chunk request from a peer against the local store; blocking
    /// (a chained put forwards over the network with `handle`).
    pub fn serve_chunk(
        self: &Arc<Self>,
        handle: &tokio::runtime::Handle,
        req: ChunkRequest,
    ) -> Response {
        let store = &self.chunks;
        let result = match req {
            ChunkRequest::PutChain { id, frame, forward } => {
                return Response::ChainStored(self.serve_chain(handle, id, frame, &forward))
            }
            ChunkRequest::Put { id, frame } => EncodedChunk::from_wire(id, frame)
                .and_then(|chunk| store.put(&chunk))
                .map(|_| Response::ChunkStored),
            ChunkRequest::Fetch { id } => store
                .get_encoded(&id)
                .map(|c| Response::Chunk(c.into_bytes())),
            ChunkRequest::Has { ids } => ids
                .iter()
                .map(|id| store.contains(id))
                .collect::<Result<Vec<bool>, _>>()
                .map(Response::Has),
        };
        result
            .unwrap_or_else(|e| Response::Error(WireError::new(ErrorCode::Rejected, e.to_string())))
    }
}

impl Inner {
    /// Stores a chained chunk here while forwarding it down the rest of the
    /// chain, and answers every node's outcome, this node's first.
    fn serve_chain(
        self: &Arc<Self>,
        handle: &tokio::runtime::Handle,
        id: ChunkId,
        frame: Vec<u8>,
        forward: &[u64],
    ) -> Vec<Result<(), TransportError>> {
        let me = self.id;
        let chunk = match EncodedChunk::from_wire(id, frame) {
            Ok(chunk) => chunk,
            Err(e) => {
                // Corrupted on the way here: passing it on would only spread
                // it; the source learns every node below missed the chunk.
                let reason = format!("upstream copy was corrupt: {e}");
                return std::iter::once(Err(TransportError::Rejected {
                    node: me,
                    id,
                    reason: reason.clone(),
                }))
                .chain(forward.iter().map(|&node| {
                    Err(TransportError::Rejected {
                        node,
                        id,
                        reason: reason.clone(),
                    })
                }))
                .collect();
            }
        };
        let (mine, below) = std::thread::scope(|scope| {
            let downstream = (!forward.is_empty()).then(|| {
                let transport = QuicChunkTransport::new(self.clone(), handle.clone());
                let chunk = &chunk;
                scope.spawn(move || transport.push_chain(forward, chunk))
            });
            let mine = self.chunks.put(&chunk).map(|_| ()).map_err(|e| {
                if matches!(e, shoal_storage::StorageError::StoreFull { .. }) {
                    TransportError::StoreFull { node: me, id }
                } else {
                    TransportError::Rejected {
                        node: me,
                        id,
                        reason: e.to_string(),
                    }
                }
            });
            let below = match downstream.map(|h| h.join()) {
                None => Vec::new(),
                Some(Ok(pushed)) => pushed.outcomes,
                Some(Err(_)) => forward
                    .iter()
                    .map(|&node| {
                        Err(TransportError::Other {
                            node,
                            reason: "the forwarding thread panicked".into(),
                        })
                    })
                    .collect(),
            };
            (mine, below)
        });
        std::iter::once(mine).chain(below).collect()
    }
}

/// Peers for a part, spread over zones and racks, never this node.
fn choose_targets(inner: &Inner, key: &str) -> Vec<NodeId> {
    let Ok(data) = inner.read_ledger() else {
        return Vec::new();
    };
    let nodes: Vec<NodeInfo> = data
        .ledger
        .active_members()
        .filter(|m| m.id != inner.id)
        .map(|m| NodeInfo {
            id: m.id,
            zone: m.spec.labels.get("zone").cloned(),
            rack: m.spec.labels.get("rack").cloned(),
            alive: m.state == MemberState::Alive,
            free_bytes: None,
        })
        .collect();
    place_replicas(key.as_bytes(), &nodes, REPLICAS)
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
    transport: &QuicChunkTransport,
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

/// Stores and replicates one rank's part of a step; blocking. Returns the
/// part to record in the ledger.
pub fn replicate_part(
    inner: &Arc<Inner>,
    handle: tokio::runtime::Handle,
    job: u64,
    rank: u32,
    step: u64,
    dir: &Path,
) -> Result<CkptPart, String> {
    let (manifest, _) = build_manifest(dir, &inner.chunks)
        .map_err(|e| format!("cannot store checkpoint {}: {e}", dir.display()))?;
    let targets = choose_targets(inner, &format!("{job}/{step}/{rank}"));
    let mut holders = vec![inner.id];
    // A one-node cluster has nobody to copy to; the local copy is all there is.
    if !targets.is_empty() {
        let quorum = WRITE_QUORUM.min(targets.len());
        let transport = QuicChunkTransport::new(inner.clone(), handle);
        let pushed = push_chained(&manifest, &inner.chunks, &targets, &transport, quorum);
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
    inner: &Arc<Inner>,
    handle: tokio::runtime::Handle,
    checkpoint: &Checkpoint,
    ckpt_dir: &Path,
) -> Result<u64, String> {
    let target = ckpt_dir.join(checkpoint.step.to_string());
    std::fs::create_dir_all(&target)
        .map_err(|e| format!("cannot create {}: {e}", target.display()))?;
    let transport = QuicChunkTransport::new(inner.clone(), handle);
    let mut restored = 0;
    for (rank, part) in &checkpoint.parts {
        let manifest = Manifest::from_bytes(&part.manifest)
            .map_err(|e| format!("rank {rank}'s manifest is unreadable: {e}"))?;
        // Nearest first would be better; local copies are always tried first.
        let mut holders = part.holders.clone();
        holders.sort_by_key(|h| *h != inner.id);
        restore_from_replicas_parallel(
            &manifest,
            &holders,
            &transport,
            &inner.chunks,
            FETCH_THREADS,
        )
        .map_err(|e| {
            format!(
                "cannot fetch rank {rank}'s part of step {}: {e}",
                checkpoint.step
            )
        })?;
        let staging = ckpt_dir.join(format!(".restore-{}-{rank}", checkpoint.step));
        let _ = std::fs::remove_dir_all(&staging);
        let stats = restore_manifest(&manifest, &inner.chunks, &staging).map_err(|e| {
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
    use crate::local_cluster::LocalCluster;

    fn random_file(path: &Path, bytes: usize, mut state: u64) {
        let data: Vec<u8> = (0..bytes)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        std::fs::write(path, data).expect("write");
    }

    /// A target this node's ledger does not know is waited for only when it
    /// may have joined a moment ago (an id not issued here yet), and then
    /// for at most `MEMBER_CATCH_UP`; an id already issued to nobody (or to
    /// a removed member) fails at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_target_is_waited_for_only_if_it_may_have_just_joined() {
        let cluster = LocalCluster::start(1, |_, cfg| cfg.executor.enabled = false)
            .await
            .expect("cluster");
        let inner = cluster.agents[0].inner.clone();
        let own = inner.id;
        let future_id = inner.read_ledger().expect("ledger").ledger.next_node_id + 5;
        let handle = tokio::runtime::Handle::current();
        let (own_addr, removed, future) = tokio::task::spawn_blocking(move || {
            let transport = QuicChunkTransport::new(inner, handle);
            let own_addr = transport.addr_of(own);
            let started = Instant::now();
            let removed = transport.addr_of(0).map_err(|e| (e, started.elapsed()));
            let started = Instant::now();
            let future = transport
                .addr_of(future_id)
                .map_err(|e| (e, started.elapsed()));
            (own_addr, removed, future)
        })
        .await
        .expect("lookups");
        assert_eq!(own_addr.expect("own address"), cluster.agents[0].rpc_addr());
        let (err, took) = removed.expect_err("id 0 was never a member");
        assert!(err.to_string().contains("not a member"), "{err}");
        assert!(
            took < MEMBER_CATCH_UP,
            "failed after {took:?}, without waiting"
        );
        let (err, took) = future.expect_err("nobody has that id");
        assert!(err.to_string().contains("has not learnt"), "{err}");
        assert!(took >= MEMBER_CATCH_UP, "gave up after {took:?}");
        cluster.shutdown().await;
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
        let source = cluster.agents[0].inner.clone();
        let peers: Vec<Arc<Inner>> = cluster.agents[1..]
            .iter()
            .map(|a| a.inner.clone())
            .collect();
        let targets: Vec<NodeId> = peers.iter().map(|p| p.id).collect();
        let root = cluster.root().to_path_buf();
        let handle = tokio::runtime::Handle::current();

        let push = |name: &str, seed: u64| {
            let (source, targets, handle) = (source.clone(), targets.clone(), handle.clone());
            let dir = root.join(name);
            tokio::task::spawn_blocking(move || {
                std::fs::create_dir_all(&dir).expect("mkdir");
                random_file(&dir.join("weights.bin"), 9 << 20, seed);
                let (manifest, _) = build_manifest(&dir, &source.chunks).expect("manifest");
                let frame_bytes: u64 = manifest
                    .unique_chunks()
                    .iter()
                    .map(|c| {
                        source
                            .chunks
                            .get_encoded(&c.id)
                            .expect("local")
                            .stored_len()
                    })
                    .sum();
                let transport = QuicChunkTransport::new(source.clone(), handle);
                let pushed = push_chained(&manifest, &source.chunks, &targets, &transport, 2);
                (manifest, frame_bytes, pushed)
            })
        };

        let (manifest, frame_bytes, pushed) = push("a", 1).await.expect("push");
        assert!(manifest.unique_chunks().len() > 1);
        assert_eq!(pushed.complete, targets, "{:?}", pushed.failed);
        assert_eq!(pushed.bytes_sent, frame_bytes, "one copy left the source");
        for peer in &peers {
            for chunk in manifest.unique_chunks() {
                assert!(peer.chunks.contains(&chunk.id).expect("contains"));
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
                assert!(peer.chunks.contains(&chunk.id).expect("contains"));
            }
        }
        cluster.shutdown().await;
    }
}
