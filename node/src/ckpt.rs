//! Checkpoint replication and restore on top of `shoal-storage`.
//!
//! When a rank completes step N (`$SHOAL_CKPT_DIR/N/.done`), its agent
//! chunks the directory into the local chunk store, pushes the chunks to up
//! to three peers chosen by failure-domain-aware rendezvous hashing over the
//! live members, and records the rank's part (manifest and holders) in the
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
    replicate_manifest, restore_from_replicas_parallel, ChunkTransport, TransportError,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Peers that receive a copy of every checkpoint part.
pub const REPLICAS: usize = 3;
/// Durable copies on peers before a part is recorded.
pub const WRITE_QUORUM: usize = 2;
const CHUNK_RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// Chunks fetched at once during a restore, spread over the holders.
pub const FETCH_THREADS: usize = 4;

/// Chunk push/fetch/has over quinn to other members.
pub struct QuicChunkTransport {
    inner: Arc<Inner>,
    handle: tokio::runtime::Handle,
}

impl QuicChunkTransport {
    pub fn new(inner: Arc<Inner>, handle: tokio::runtime::Handle) -> Self {
        QuicChunkTransport { inner, handle }
    }

    fn addr_of(&self, node: u64) -> Result<SocketAddr, TransportError> {
        let unreachable = |reason: String| TransportError::Unreachable { node, reason };
        let data = self
            .inner
            .read_ledger()
            .map_err(|e| unreachable(e.message))?;
        data.ledger
            .members
            .get(&node)
            .and_then(|m| m.spec.rpc_addr.parse().ok())
            .ok_or_else(|| unreachable("no known address".into()))
    }

    /// One chunk RPC; `id` names the chunk in errors.
    fn call(&self, node: u64, id: ChunkId, req: ChunkRequest) -> Result<Response, TransportError> {
        let reply = if node == self.inner.id {
            self.inner.serve_chunk(req)
        } else {
            let addr = self.addr_of(node)?;
            let body = proto::encode(&Request::Chunk(req));
            let bytes = self
                .handle
                .block_on(self.inner.rpc.call(addr, &body, CHUNK_RPC_TIMEOUT))
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
    /// Serves a chunk request from a peer against the local store.
    pub fn serve_chunk(&self, req: ChunkRequest) -> Response {
        let store = &self.chunks;
        let result = match req {
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

/// What a parallel push achieved.
pub struct PushOutcome {
    pub complete: Vec<NodeId>,
    pub failed: Vec<(NodeId, String)>,
    pub bytes_sent: u64,
    /// When the `quorum`-th target finished (None: never).
    pub quorum_after: Option<std::time::Duration>,
}

/// Pushes `manifest`'s chunks to every target at once, one thread per
/// target, so the time to a quorum is the quorum-th fastest target rather
/// than the sum over targets. Blocking.
pub fn push_parallel(
    manifest: &Manifest,
    store: &shoal_storage::ChunkStore,
    targets: &[NodeId],
    transport: &QuicChunkTransport,
    quorum: usize,
) -> PushOutcome {
    let started = std::time::Instant::now();
    let finished = std::sync::Mutex::new(Vec::new());
    let results: Vec<(NodeId, Result<u64, String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .map(|&target| {
                let finished = &finished;
                scope.spawn(move || {
                    let result = replicate_manifest(manifest, store, &[target], transport, 1)
                        .map_err(|e| e.to_string())
                        .and_then(|report| {
                            if report.quorum_reached {
                                Ok(report.targets.iter().map(|t| t.bytes_pushed).sum())
                            } else {
                                Err(format!("{:?}", report.failed_nodes()))
                            }
                        });
                    if result.is_ok() {
                        if let Ok(mut done) = finished.lock() {
                            done.push(started.elapsed());
                        }
                    }
                    (target, result)
                })
            })
            .collect();
        handles
            .into_iter()
            .zip(targets)
            .map(|(h, &target)| {
                h.join()
                    .unwrap_or_else(|_| (target, Err("push thread panicked".to_string())))
            })
            .collect()
    });
    let mut times = finished.into_inner().unwrap_or_default();
    times.sort();
    let mut outcome = PushOutcome {
        complete: Vec::new(),
        failed: Vec::new(),
        bytes_sent: 0,
        quorum_after: quorum.checked_sub(1).and_then(|i| times.get(i).copied()),
    };
    for (target, result) in results {
        match result {
            Ok(bytes) => {
                outcome.complete.push(target);
                outcome.bytes_sent += bytes;
            }
            Err(e) => outcome.failed.push((target, e)),
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
        let pushed = push_parallel(&manifest, &inner.chunks, &targets, &transport, quorum);
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
