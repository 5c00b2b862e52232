//! Replication orchestration over an abstract, synchronous chunk transport.
//!
//! This crate never opens a socket. The node crate implements [`ChunkTransport`] over
//! QUIC and calls these functions from blocking tasks (`tokio::task::spawn_blocking`):
//! every method may block for a network round trip, so they must never run on an
//! async executor thread. Transfers here are sequential, chunk by chunk; a transport
//! that wants more in-flight data can pipeline internally (e.g. return from `push`
//! once the frame is queued and surface failures on the next call).
//!
//! Trust model: peers are untrusted for integrity. Every chunk received is verified
//! against its id before it is stored or used; a corrupt copy is reported and another
//! holder is tried.

use crate::chunk::{ChunkId, EncodedChunk};
use crate::error::{Result, StorageError};
use crate::manifest::Manifest;
use crate::store::ChunkStore;

/// Maximum ids sent in one [`ChunkTransport::has`] call, bounding request size.
pub const HAS_BATCH: usize = 4096;

/// Why a remote operation failed. `node` is always the peer that was addressed.
/// Serializable: a chain's forwarders report their downstream failures back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum TransportError {
    /// The peer could not be reached (down, timed out, connection reset).
    #[error("node {node} unreachable: {reason}")]
    Unreachable { node: u64, reason: String },
    /// The peer's store is full; place the data elsewhere.
    #[error("node {node} has no room for chunk {id}")]
    StoreFull { node: u64, id: ChunkId },
    /// The peer does not hold the chunk.
    #[error("node {node} does not hold chunk {id}")]
    NotFound { node: u64, id: ChunkId },
    /// The peer refused the chunk (e.g. it failed verification on arrival).
    #[error("node {node} rejected chunk {id}: {reason}")]
    Rejected {
        node: u64,
        id: ChunkId,
        reason: String,
    },
    /// Anything else (protocol violation, remote I/O error, ...).
    #[error("node {node}: {reason}")]
    Other { node: u64, reason: String },
}

/// Moves chunk frames between this node and peers. Implemented by the node crate over
/// QUIC; [`crate::memory_transport::MemoryTransport`] is an in-memory implementation
/// with fault injection for tests.
///
/// Methods are synchronous and may block on the network: call them (and the
/// orchestration functions in this module) from blocking tasks only.
pub trait ChunkTransport {
    /// Stores `chunk` on `node`. The receiver must verify the content against the id
    /// (e.g. via [`ChunkStore::put`]) and answer [`TransportError::Rejected`] if it
    /// does not match. Pushing a chunk the node already holds succeeds.
    fn push(&self, node: u64, chunk: &EncodedChunk) -> Result<(), TransportError>;

    /// Fetches chunk `id` from `node`, as the stored frame (build it with
    /// [`EncodedChunk::from_wire`]; callers verify it).
    fn fetch(&self, node: u64, id: &ChunkId) -> Result<EncodedChunk, TransportError>;

    /// For each id, whether `node` holds it. The answer must have `ids.len()` entries.
    fn has(&self, node: u64, ids: &[ChunkId]) -> Result<Vec<bool>, TransportError>;

    /// Stores `chunk` on every node of `chain`, in order. A transport that can
    /// forward sends the frame once, to the first node that answers, which
    /// stores it and passes it down the rest of the chain (HDFS-style), so the
    /// source's uplink carries one copy instead of `chain.len()`. Every node
    /// is attempted: a forwarder skips a node that fails and goes on with the
    /// next. The default sends to each node from here.
    fn push_chain(&self, chain: &[u64], chunk: &EncodedChunk) -> ChainPush {
        ChainPush {
            outcomes: chain.iter().map(|&node| self.push(node, chunk)).collect(),
            source_sends: chain.len() as u64,
        }
    }
}

/// What [`ChunkTransport::push_chain`] achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainPush {
    /// One outcome per node of the chain, in chain order.
    pub outcomes: Vec<Result<(), TransportError>>,
    /// Frames the source itself sent (1 when the chain's head answered).
    pub source_sends: u64,
}

/// Outcome of replicating to one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetReport {
    pub node: u64,
    /// True when the target holds every chunk of the manifest.
    pub complete: bool,
    /// Chunks the target already had (not sent).
    pub chunks_already_present: u64,
    /// Chunks sent to the target.
    pub chunks_pushed: u64,
    /// Frame bytes sent to the target.
    pub bytes_pushed: u64,
    /// First error that stopped replication to this target, if any.
    pub error: Option<TransportError>,
}

/// Result of [`replicate_manifest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationReport {
    /// Distinct chunks in the manifest.
    pub chunks_total: u64,
    /// The quorum that was asked for.
    pub write_quorum: usize,
    /// True when at least `write_quorum` targets hold every chunk.
    pub quorum_reached: bool,
    /// One entry per distinct target, in the order given.
    pub targets: Vec<TargetReport>,
    /// Frame bytes the source itself sent (less than the targets received
    /// when chunks travel down a chain).
    pub source_bytes: u64,
}

impl ReplicationReport {
    /// Targets that hold every chunk.
    pub fn complete_nodes(&self) -> Vec<u64> {
        self.targets
            .iter()
            .filter(|target| target.complete)
            .map(|target| target.node)
            .collect()
    }

    /// Targets that failed, with the error that stopped them.
    pub fn failed_nodes(&self) -> Vec<(u64, TransportError)> {
        self.targets
            .iter()
            .filter_map(|target| target.error.clone().map(|error| (target.node, error)))
            .collect()
    }

    /// Total chunks sent over the wire, all targets together.
    pub fn chunks_pushed(&self) -> u64 {
        self.targets.iter().map(|target| target.chunks_pushed).sum()
    }
}

/// Copies every chunk of `manifest` from `local_store` to each of `targets`.
///
/// Each target is first asked which chunks it already has ([`ChunkTransport::has`]),
/// so re-running after a partial failure sends only what is missing. Chunks are read
/// from disk once and pushed to every target that lacks them; a target that fails
/// (down, full, rejecting) is skipped for the rest of the run and reported. Success
/// means `quorum_reached`: at least `write_quorum` targets hold every chunk. The
/// manifest itself is not sent: it is small and travels on the caller's control path.
///
/// Errors (as opposed to a report with failed targets) mean the local side cannot
/// proceed: a chunk is missing or unreadable locally, or the arguments are invalid.
pub fn replicate_manifest<T: ChunkTransport + ?Sized>(
    manifest: &Manifest,
    local_store: &ChunkStore,
    targets: &[u64],
    transport: &T,
    write_quorum: usize,
) -> Result<ReplicationReport> {
    let ids: Vec<ChunkId> = manifest
        .unique_chunks()
        .iter()
        .map(|chunk| chunk.id)
        .collect();
    let (mut reports, missing) = survey(&ids, targets, transport, write_quorum)?;
    for (index, id) in ids.iter().enumerate() {
        let needy: Vec<usize> = (0..reports.len())
            .filter(|&t| reports[t].error.is_none() && missing[t][index])
            .collect();
        if needy.is_empty() {
            continue;
        }
        let encoded = local_store.get_encoded(id)?;
        for t in needy {
            let node = reports[t].node;
            match transport.push(node, &encoded) {
                Ok(()) => {
                    reports[t].chunks_pushed += 1;
                    reports[t].bytes_pushed += encoded.stored_len();
                }
                Err(error) => reports[t].error = Some(error),
            }
        }
    }
    let source_bytes = reports.iter().map(|r| r.bytes_pushed).sum();
    Ok(finish(ids.len(), write_quorum, reports, source_bytes))
}

/// Like [`replicate_manifest`], but each chunk travels down a chain of the
/// targets that lack it ([`ChunkTransport::push_chain`]), with `in_flight`
/// chunks on their way at once so the chain's hops overlap. Same contract:
/// only what is missing is sent, a failed target is dropped from later
/// chains and reported, success is `quorum_reached`.
pub fn replicate_chained<T: ChunkTransport + Sync + ?Sized>(
    manifest: &Manifest,
    local_store: &ChunkStore,
    targets: &[u64],
    transport: &T,
    write_quorum: usize,
    in_flight: usize,
) -> Result<ReplicationReport> {
    let ids: Vec<ChunkId> = manifest
        .unique_chunks()
        .iter()
        .map(|chunk| chunk.id)
        .collect();
    let (reports, missing) = survey(&ids, targets, transport, write_quorum)?;
    let state = std::sync::Mutex::new((reports, 0u64));
    let lock = || {
        state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    };
    let workers = in_flight.clamp(1, ids.len().max(1));
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let (ids, missing, lock) = (&ids, &missing, &lock);
                scope.spawn(move || -> Result<()> {
                    for index in (worker..ids.len()).step_by(workers) {
                        let chain: Vec<(usize, u64)> = {
                            let guard = lock();
                            guard
                                .0
                                .iter()
                                .enumerate()
                                .filter(|(t, r)| r.error.is_none() && missing[*t][index])
                                .map(|(t, r)| (t, r.node))
                                .collect()
                        };
                        if chain.is_empty() {
                            continue;
                        }
                        let encoded = local_store.get_encoded(&ids[index])?;
                        let nodes: Vec<u64> = chain.iter().map(|(_, node)| *node).collect();
                        let pushed = transport.push_chain(&nodes, &encoded);
                        let mut guard = lock();
                        guard.1 += pushed.source_sends * encoded.stored_len();
                        let mut outcomes = pushed.outcomes.into_iter();
                        for (t, node) in &chain {
                            let outcome = outcomes.next().unwrap_or_else(|| {
                                Err(TransportError::Other {
                                    node: *node,
                                    reason: "the chain gave no answer for this node".into(),
                                })
                            });
                            let report = &mut guard.0[*t];
                            match outcome {
                                Ok(()) => {
                                    report.chunks_pushed += 1;
                                    report.bytes_pushed += encoded.stored_len();
                                }
                                Err(error) => {
                                    report.error.get_or_insert(error);
                                }
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(StorageError::InvalidArgument(
                        "a replication thread panicked".into(),
                    ))
                })
            })
            .collect()
    });
    for result in results {
        result?;
    }
    let (reports, source_bytes) = state
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Ok(finish(ids.len(), write_quorum, reports, source_bytes))
}

fn finish(
    chunks_total: usize,
    write_quorum: usize,
    mut reports: Vec<TargetReport>,
    source_bytes: u64,
) -> ReplicationReport {
    for report in &mut reports {
        report.complete = report.error.is_none();
    }
    let complete = reports.iter().filter(|report| report.complete).count();
    ReplicationReport {
        chunks_total: chunks_total as u64,
        write_quorum,
        quorum_reached: complete >= write_quorum,
        targets: reports,
        source_bytes,
    }
}

/// Asks each distinct target which of `ids` it already holds. Returns one
/// report per target (with the error of a target that did not answer) and
/// `missing[t][c]`: target `t` lacks chunk `c`.
fn survey<T: ChunkTransport + ?Sized>(
    ids: &[ChunkId],
    targets: &[u64],
    transport: &T,
    write_quorum: usize,
) -> Result<(Vec<TargetReport>, Vec<Vec<bool>>)> {
    let mut distinct_targets: Vec<u64> = Vec::with_capacity(targets.len());
    for &node in targets {
        if !distinct_targets.contains(&node) {
            distinct_targets.push(node);
        }
    }
    if write_quorum == 0 || write_quorum > distinct_targets.len() {
        return Err(StorageError::InvalidArgument(format!(
            "write quorum {write_quorum} must be between 1 and the {} distinct targets",
            distinct_targets.len()
        )));
    }
    let mut reports: Vec<TargetReport> = Vec::with_capacity(distinct_targets.len());
    // missing[t][c]: target t lacks chunk c.
    let mut missing: Vec<Vec<bool>> = Vec::with_capacity(distinct_targets.len());
    for &node in &distinct_targets {
        let mut report = TargetReport {
            node,
            complete: false,
            chunks_already_present: 0,
            chunks_pushed: 0,
            bytes_pushed: 0,
            error: None,
        };
        let mut target_missing = Vec::with_capacity(ids.len());
        for batch in ids.chunks(HAS_BATCH) {
            match transport.has(node, batch) {
                Ok(answer) if answer.len() == batch.len() => {
                    target_missing.extend(answer.iter().map(|held| !held));
                }
                Ok(answer) => {
                    report.error = Some(TransportError::Other {
                        node,
                        reason: format!(
                            "has() answered {} entries for {} ids",
                            answer.len(),
                            batch.len()
                        ),
                    });
                    break;
                }
                Err(error) => {
                    report.error = Some(error);
                    break;
                }
            }
        }
        report.chunks_already_present = target_missing.iter().filter(|m| !**m).count() as u64;
        missing.push(target_missing);
        reports.push(report);
    }
    Ok((reports, missing))
}

/// Result of [`restore_from_replicas`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchReport {
    /// Distinct chunks in the manifest.
    pub chunks_total: u64,
    /// Chunks already in the local store (not fetched).
    pub already_local: u64,
    /// Chunks fetched, verified and stored.
    pub fetched: u64,
    /// Frame bytes of fetched chunks.
    pub bytes_fetched: u64,
    /// Copies that failed verification, as `(node, chunk)`; never stored or used.
    /// Callers should schedule repair of these copies.
    pub corrupt_copies: Vec<(u64, ChunkId)>,
    /// Transport failures that were recovered from by asking another holder.
    pub failed_attempts: Vec<(u64, ChunkId, TransportError)>,
}

/// Fetches every chunk of `manifest` missing from `local_store`, asking `holders` in
/// order and falling back to the next holder on error or corruption. A copy is stored
/// only after its content hashes to the requested id. Follow with
/// [`crate::manifest::restore_manifest`] to materialize the files.
///
/// Fails with [`StorageError::ChunkUnavailable`] (listing every attempt) if no holder
/// supplies a good copy of some chunk, and with the local error if the local store
/// cannot take a verified chunk (e.g. [`StorageError::StoreFull`]). Chunks fetched
/// before a failure stay in the local store, so a retry resumes where it stopped.
pub fn restore_from_replicas<T: ChunkTransport + ?Sized>(
    manifest: &Manifest,
    holders: &[u64],
    transport: &T,
    local_store: &ChunkStore,
) -> Result<FetchReport> {
    let chunks = manifest.unique_chunks();
    let mut report = FetchReport {
        chunks_total: chunks.len() as u64,
        ..FetchReport::default()
    };
    for chunk in chunks {
        fetch_chunk(chunk.id, holders, transport, local_store, &mut report)?;
    }
    Ok(report)
}

/// [`restore_from_replicas`] with `threads` fetchers working on disjoint
/// chunks at once, each starting with a different holder so the load spreads
/// over the replicas. Same guarantees: only verified chunks are stored; the
/// first chunk no holder can supply fails the whole call.
pub fn restore_from_replicas_parallel<T: ChunkTransport + Sync + ?Sized>(
    manifest: &Manifest,
    holders: &[u64],
    transport: &T,
    local_store: &ChunkStore,
    threads: usize,
) -> Result<FetchReport> {
    restore_from_nearest_replicas(
        manifest,
        holders,
        holders.len(),
        transport,
        local_store,
        threads,
    )
}

/// Like [`restore_from_replicas_parallel`], with `holders` ordered nearest
/// first: the fetch threads spread their first attempts over the `near`
/// nearest holders only, and fall back to the farther ones when those fail.
pub fn restore_from_nearest_replicas<T: ChunkTransport + Sync + ?Sized>(
    manifest: &Manifest,
    holders: &[u64],
    near: usize,
    transport: &T,
    local_store: &ChunkStore,
    threads: usize,
) -> Result<FetchReport> {
    let near = near.clamp(1, holders.len().max(1));
    let chunks = manifest.unique_chunks();
    let threads = threads.clamp(1, chunks.len().max(1));
    let results: Vec<Result<FetchReport>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|worker| {
                let chunks = &chunks;
                scope.spawn(move || {
                    let mut order = holders.to_vec();
                    if !order.is_empty() {
                        let spread = near.min(order.len());
                        order[..spread].rotate_left(worker % spread);
                    }
                    let mut report = FetchReport::default();
                    for chunk in chunks.iter().skip(worker).step_by(threads) {
                        fetch_chunk(chunk.id, &order, transport, local_store, &mut report)?;
                    }
                    Ok(report)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join().unwrap_or_else(|_| {
                    Err(StorageError::InvalidArgument(
                        "a fetch thread panicked".into(),
                    ))
                })
            })
            .collect()
    });
    let mut total = FetchReport {
        chunks_total: chunks.len() as u64,
        ..FetchReport::default()
    };
    for result in results {
        let part = result?;
        total.already_local += part.already_local;
        total.fetched += part.fetched;
        total.bytes_fetched += part.bytes_fetched;
        total.corrupt_copies.extend(part.corrupt_copies);
        total.failed_attempts.extend(part.failed_attempts);
    }
    Ok(total)
}

/// Makes `id` present in `local_store`, asking `holders` in order; see
/// [`restore_from_replicas`].
fn fetch_chunk<T: ChunkTransport + ?Sized>(
    id: ChunkId,
    holders: &[u64],
    transport: &T,
    local_store: &ChunkStore,
    report: &mut FetchReport,
) -> Result<()> {
    if local_store.contains(&id)? {
        report.already_local += 1;
        return Ok(());
    }
    let mut attempts: Vec<(u64, String)> = Vec::new();
    for &node in holders {
        let encoded = match transport.fetch(node, &id) {
            Ok(encoded) => encoded,
            Err(error) => {
                attempts.push((node, error.to_string()));
                report.failed_attempts.push((node, id, error));
                continue;
            }
        };
        if encoded.id() != id {
            attempts.push((node, format!("answered with chunk {}", encoded.id())));
            report.corrupt_copies.push((node, id));
            continue;
        }
        match local_store.put(&encoded) {
            Ok(_) => {
                report.fetched += 1;
                report.bytes_fetched += encoded.stored_len();
                return Ok(());
            }
            Err(error) if error.is_corruption() => {
                attempts.push((node, error.to_string()));
                report.corrupt_copies.push((node, id));
            }
            Err(error) => return Err(error),
        }
    }
    Err(StorageError::ChunkUnavailable { id, attempts })
}
