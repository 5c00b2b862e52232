//! Copying a committed checkpoint step to another region, and receiving
//! one (`--ckpt-replicas L+R`, docs/federation.md).
//!
//! The sending region's leader gathers the step's chunks into its own
//! store (from the parts' holders), then talks to one node of the other
//! region for the whole step: which chunks it lacks (a step shares most
//! chunks with the one before, so mostly only what changed crosses the
//! WAN), those chunks (each verified against its id on arrival), and
//! finally the job's spec and the step's manifests. That node copies each
//! part to peers of its own region, as a checkpoint part is replicated at
//! home, and records the job and step in its region's ledger.

use crate::federation::link::{PeerRequest, PeerTarget};
use crate::node::Node;
use serde::{Deserialize, Serialize};
use shoal_consensus::federation::PeerRegion;
use shoal_consensus::workload::{Checkpoint, JobSpec};
use shoal_sdk::ChunkList;
use shoal_storage::chunk::ChunkId;
use shoal_storage::manifest::Manifest;
use std::collections::BTreeSet;

/// Chunk uploads in flight to the other region at once.
const UPLOADS_IN_FLIGHT: usize = 4;
/// Most chunk ids one `missing` request may name.
pub const MAX_LISTED_CHUNKS: usize = 1 << 16;

/// `POST /v1/federation/copies`: a job and a committed step of it whose
/// chunks the receiving node now holds.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CopyRequest {
    pub origin_job: u64,
    pub spec: JobSpec,
    pub checkpoint: Checkpoint,
    /// The origin's ledger index when it sent the step.
    pub origin_index: u64,
}

/// What crossing the WAN cost for one step.
#[derive(Clone, Copy, Debug, Default)]
pub struct CopyReport {
    pub chunks: usize,
    pub chunks_sent: usize,
    /// Frame bytes of the chunks sent (what crossed the WAN, bar the
    /// manifests and HTTP).
    pub bytes_sent: u64,
}

fn manifests(checkpoint: &Checkpoint) -> Result<Vec<Manifest>, String> {
    checkpoint
        .parts
        .iter()
        .map(|(rank, part)| {
            Manifest::from_bytes(&part.manifest)
                .map_err(|e| format!("rank {rank}'s manifest is unreadable: {e}"))
        })
        .collect()
}

fn chunk_ids(manifests: &[Manifest]) -> BTreeSet<ChunkId> {
    manifests
        .iter()
        .flat_map(|m| m.unique_chunks().into_iter().map(|c| c.id))
        .collect()
}

/// Sends step `checkpoint` of `job` to `peer`, trying its nodes in turn.
pub async fn send_step(
    node: &Node,
    peer: &PeerRegion,
    job: u64,
    spec: &JobSpec,
    checkpoint: &Checkpoint,
    origin_index: u64,
) -> Result<CopyReport, String> {
    gather_chunks(node, checkpoint).await?;
    let target = crate::regions::target(node, peer);
    let mut last_error = format!("region {} has no known address", peer.name);
    for url in &target.urls {
        let one = PeerTarget {
            urls: vec![url.clone()],
            ..target.clone()
        };
        match send_to(node, &one, job, spec, checkpoint, origin_index).await {
            Ok(report) => return Ok(report),
            Err(e) => last_error = e,
        }
    }
    Err(last_error)
}

/// Fetches every chunk of the step this node lacks from the parts' holders.
async fn gather_chunks(node: &Node, checkpoint: &Checkpoint) -> Result<(), String> {
    let net = node.chunks().clone();
    let checkpoint = checkpoint.clone();
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let transport = net.transport(handle);
        for (rank, part) in &checkpoint.parts {
            let manifest = Manifest::from_bytes(&part.manifest)
                .map_err(|e| format!("rank {rank}'s manifest is unreadable: {e}"))?;
            let mut holders = part.holders.clone();
            holders.sort_by_key(|h| *h != net.ledger().me());
            shoal_storage::replicate::restore_from_replicas_parallel(
                &manifest,
                &holders,
                &transport,
                net.store(),
                crate::ckpt::FETCH_THREADS,
            )
            .map_err(|e| {
                format!(
                    "cannot gather rank {rank}'s part of step {}: {e}",
                    checkpoint.step
                )
            })?;
        }
        Ok(())
    })
    .await
    .map_err(|e| e.to_string())?
}

/// One request of a copy, made for the copied job's `tenant`: the other
/// region takes copies only for a tenant both regions share.
async fn call(
    node: &Node,
    target: &PeerTarget,
    tenant: &str,
    method: reqwest::Method,
    path: &str,
    body: Vec<u8>,
    binary: bool,
) -> Result<Vec<u8>, String> {
    let req = PeerRequest {
        method,
        path,
        body: Some(body),
        tenant: Some(tenant),
        binary,
    };
    let resp = node
        .federation()
        .send(target, &req, crate::regions::request_timeout(node))
        .await
        .map_err(|e| e.to_string())?;
    if resp.status != 200 {
        let why = serde_json::from_slice::<shoal_sdk::ApiErrorBody>(&resp.body)
            .map(|b| b.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&resp.body).into_owned());
        return Err(format!(
            "region {} ({}) refused {path}: HTTP {}: {why}",
            target.region, resp.url, resp.status
        ));
    }
    Ok(resp.body)
}

async fn send_to(
    node: &Node,
    target: &PeerTarget,
    job: u64,
    spec: &JobSpec,
    checkpoint: &Checkpoint,
    origin_index: u64,
) -> Result<CopyReport, String> {
    let ids = chunk_ids(&manifests(checkpoint)?);
    let list = ChunkList {
        chunks: ids.iter().map(ChunkId::to_hex).collect(),
    };
    let body = serde_json::to_vec(&list).map_err(|e| e.to_string())?;
    let answer = call(
        node,
        target,
        &spec.tenant,
        reqwest::Method::POST,
        "/v1/federation/copies/missing",
        body,
        false,
    )
    .await?;
    let missing: ChunkList = serde_json::from_slice(&answer)
        .map_err(|e| format!("region {} sent no chunk list: {e}", target.region))?;
    let mut report = CopyReport {
        chunks: ids.len(),
        ..Default::default()
    };
    let wanted: Vec<ChunkId> = missing
        .chunks
        .iter()
        .filter_map(|hex| ChunkId::from_hex(hex).ok())
        .filter(|id| ids.contains(id))
        .collect();
    use futures::StreamExt;
    let tenant = spec.tenant.as_str();
    let uploads = futures::stream::iter(wanted.into_iter().map(|id| async move {
        let store = node.chunks().store().clone();
        let frame = tokio::task::spawn_blocking(move || store.get_encoded(&id))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("chunk {id} is not here: {e}"))?;
        let bytes = frame.bytes().to_vec();
        let len = bytes.len() as u64;
        let path = format!("/v1/federation/copies/chunks/{}", id.to_hex());
        call(
            node,
            target,
            tenant,
            reqwest::Method::PUT,
            &path,
            bytes,
            true,
        )
        .await?;
        Ok::<u64, String>(len)
    }))
    .buffer_unordered(UPLOADS_IN_FLIGHT);
    futures::pin_mut!(uploads);
    while let Some(sent) = uploads.next().await {
        report.bytes_sent += sent?;
        report.chunks_sent += 1;
    }
    let request = CopyRequest {
        origin_job: job,
        spec: spec.clone(),
        checkpoint: checkpoint.clone(),
        origin_index,
    };
    let body = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    call(
        node,
        target,
        &spec.tenant,
        reqwest::Method::POST,
        "/v1/federation/copies",
        body,
        false,
    )
    .await?;
    Ok(report)
}

/// The chunk ids of `list` the copy must send: those this node's store
/// lacks, and those the copy may not name unsent (`may_name`: the tenant's
/// own, or sent for it before).
pub fn missing_here(
    node: &Node,
    list: &ChunkList,
    may_name: impl Fn(&ChunkId) -> bool,
) -> Result<ChunkList, String> {
    if list.chunks.len() > MAX_LISTED_CHUNKS {
        return Err(format!(
            "at most {MAX_LISTED_CHUNKS} chunks per request, not {}",
            list.chunks.len()
        ));
    }
    let mut missing = Vec::new();
    for hex in &list.chunks {
        let id = ChunkId::from_hex(hex).map_err(|e| format!("'{hex}' is no chunk id: {e}"))?;
        let stored = node
            .chunks()
            .store()
            .contains(&id)
            .map_err(|e| e.to_string())?;
        if !stored || !may_name(&id) {
            missing.push(hex.clone());
        }
    }
    Ok(ChunkList { chunks: missing })
}

/// Stores one chunk frame sent by a peer region, verified against `hex`.
pub fn store_chunk(node: &Node, hex: &str, frame: Vec<u8>) -> Result<ChunkId, String> {
    let id = ChunkId::from_hex(hex).map_err(|e| format!("'{hex}' is no chunk id: {e}"))?;
    let chunk = shoal_storage::chunk::EncodedChunk::from_wire(id, frame)
        .map_err(|e| format!("chunk {hex}: {e}"))?;
    node.chunks()
        .store()
        .put(&chunk)
        .map_err(|e| format!("chunk {hex}: {e}"))?;
    Ok(id)
}

/// Why a received step was not recorded.
#[derive(Debug)]
pub enum CopyRefused {
    /// It names a chunk the copy did not send and the tenant does not
    /// hold here.
    NotSent(String),
    /// Replicating it in this region failed.
    Failed(String),
}

/// Copies each part of a received step from this node to peers of this
/// region and returns the step with this region's holders; blocking. Every
/// chunk its manifests name must be here, and one the copy may name
/// (`may_name`, as for [`missing_here`]).
pub fn replicate_here(
    node: &Node,
    handle: tokio::runtime::Handle,
    origin: &str,
    request: &CopyRequest,
    may_name: impl Fn(&ChunkId) -> bool,
) -> Result<Checkpoint, CopyRefused> {
    use CopyRefused::{Failed, NotSent};
    let net = node.chunks();
    let mut checkpoint = request.checkpoint.clone();
    let copies = crate::ckpt::peer_copies(request.spec.ckpt_peer_copies);
    for (rank, part) in checkpoint.parts.iter_mut() {
        let manifest = Manifest::from_bytes(&part.manifest)
            .map_err(|e| Failed(format!("rank {rank}'s manifest is unreadable: {e}")))?;
        for chunk in manifest.unique_chunks() {
            let stored = net
                .store()
                .contains(&chunk.id)
                .map_err(|e| Failed(e.to_string()))?;
            if !stored || !may_name(&chunk.id) {
                return Err(NotSent(format!(
                    "permission denied: chunk {} of rank {rank}'s part was not sent in this copy, \
                     and tenant '{}' holds no such chunk here",
                    chunk.id, request.spec.tenant
                )));
            }
        }
        let key = format!(
            "{origin}/{}/{}/{rank}",
            request.origin_job, request.checkpoint.step
        );
        let targets = crate::ckpt::choose_targets(net, &key, copies).map_err(Failed)?;
        let here = crate::ckpt::replicate_manifest(
            net,
            handle.clone(),
            &manifest,
            &targets,
            checkpoint.step,
        )
        .map_err(Failed)?;
        part.holders = here.holders;
    }
    checkpoint.regions.clear();
    Ok(checkpoint)
}
