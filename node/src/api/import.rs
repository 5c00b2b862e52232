//! Objects written through one node: `POST /v1/objects/import`, and chunk
//! reads relayed from another holder (`GET /v1/chunks/{id}?from=NODE`).
//!
//! This is how `shoal cp` reaches another region's `mesh://REGION/PATH`
//! (docs/cp.md): the caller's region forwards every request to one node of
//! REGION, so only that node is reached, with the caller's own region's
//! credential. An upload sends each missing chunk once over the WAN to that
//! node, which copies them down a chain to `replica - 1` more nodes of its
//! region, as a checkpoint part is replicated, and records the object last.
//! A download reads each chunk through that node, which serves it from its
//! own store or fetches it from the holder the caller names.

use super::{bad_request, write_as, ApiError, AppState};
use crate::trust::auth::Caller;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use shoal_consensus::Command;
use shoal_sdk::{ApiErrorBody, ObjectImport, ObjectImported};
use shoal_storage::chunk::ChunkId;
use shoal_storage::manifest::Manifest;
use shoal_storage::replicate::ChunkTransport;

fn conflict(message: String) -> ApiError {
    ApiError(
        StatusCode::CONFLICT,
        ApiErrorBody {
            code: "rejected".into(),
            message,
        },
    )
}

/// The chunks of `manifest` this node's store lacks.
fn missing_here(app: &AppState, manifest: &Manifest) -> Result<Vec<ChunkId>, ApiError> {
    let mut missing = Vec::new();
    for chunk in manifest.unique_chunks() {
        let held = app
            .chunks()
            .store()
            .contains(&chunk.id)
            .map_err(|e| bad_request(format!("cannot read the chunk store: {e}")))?;
        if !held {
            missing.push(chunk.id);
        }
    }
    Ok(missing)
}

/// Copies `manifest`'s chunks from this node to `replica - 1` more nodes of
/// this region; the holders, this node first. Blocking.
fn replicate(
    app: &AppState,
    handle: tokio::runtime::Handle,
    req: &ObjectImport,
    manifest: &Manifest,
) -> Result<Vec<u64>, ApiError> {
    let net = app.chunks();
    let wanted = req.replica as usize - 1;
    let targets = crate::ckpt::choose_targets(net, &req.path, wanted).map_err(conflict)?;
    if targets.len() < wanted && !req.allow_degraded {
        return Err(conflict(format!(
            "only {} live node(s) for --replica {} in this region (add --allow-degraded to write fewer copies)",
            targets.len() + 1,
            req.replica
        )));
    }
    let mut holders = vec![net.ledger().me()];
    if targets.is_empty() {
        return Ok(holders);
    }
    let transport = net.transport(handle);
    let pushed =
        crate::ckpt::push_chained(manifest, net.store(), &targets, &transport, targets.len());
    holders.extend(&pushed.complete);
    if holders.len() < req.replica as usize && !req.allow_degraded {
        let failures: Vec<String> = pushed
            .failed
            .iter()
            .map(|(node, why)| format!("node {node}: {why}"))
            .collect();
        return Err(conflict(format!(
            "only {} of {} copies of mesh:{} were written: {}",
            holders.len(),
            req.replica,
            req.path,
            failures.join("; ")
        )));
    }
    Ok(holders)
}

/// `POST /v1/objects/import`: records an object whose chunks this node
/// holds, after copying them to more nodes of its region. The ledger checks
/// the caller's tenant at commit, as for `POST /v1/objects`.
pub async fn import_object(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<ObjectImport>,
) -> Result<Json<ObjectImported>, ApiError> {
    if req.replica == 0 {
        return Err(bad_request("--replica must be at least 1"));
    }
    let raw = hex::decode(&req.manifest_hex).map_err(|_| bad_request("manifest_hex is not hex"))?;
    let manifest =
        Manifest::from_bytes(&raw).map_err(|e| bad_request(format!("invalid manifest: {e}")))?;
    // The chunks are this node's to copy only if the caller sent them here:
    // a store holds every tenant's chunks.
    super::check_uploaded(&app, &caller, &manifest, &[app.id()]).await?;
    let node = app.clone();
    let handle = tokio::runtime::Handle::current();
    let request = req.clone();
    let holders = tokio::task::spawn_blocking(move || {
        let missing = missing_here(&node, &manifest)?;
        if let Some(first) = missing.first() {
            return Err(conflict(format!(
                "node {} lacks {} of the {} chunks of mesh:{} (first {first}); send them to it first",
                node.name(),
                missing.len(),
                manifest.unique_chunks().len(),
                request.path
            )));
        }
        replicate(&node, handle, &request, &manifest)
    })
    .await
    .map_err(|e| bad_request(e.to_string()))??;
    let object = shoal_consensus::namespace::MeshObject {
        path: req.path,
        is_dir: req.is_dir,
        manifest: raw,
        bytes: req.bytes,
        files: req.files,
        holders: {
            let mut sorted = holders.clone();
            sorted.sort_unstable();
            sorted
        },
        replica: req.replica,
        tenant: caller
            .tenant
            .clone()
            .unwrap_or_else(|| shoal_consensus::workload::DEFAULT_TENANT.to_string()),
        mtime_ms: 0,
    };
    let (_, index) = write_as(
        &app,
        &caller,
        "POST /v1/objects/import",
        Command::PutObject {
            object,
            replace: req.replace,
        },
        String::new,
    )
    .await?;
    Ok(Json(ObjectImported { index, holders }))
}

#[derive(serde::Deserialize)]
pub struct ChunkQuery {
    /// A member of this region to fetch the chunk from when this node does
    /// not hold it.
    from: Option<u64>,
}

/// The frame of chunk `id` from this node's store or, with `?from=NODE`,
/// from that member when this node lacks it. The caller has been checked to
/// see the chunk. Blocking.
pub fn read_chunk(
    app: &AppState,
    handle: tokio::runtime::Handle,
    id: ChunkId,
    from: Option<u64>,
) -> Result<Vec<u8>, String> {
    let local = app.chunks().store().get_encoded(&id);
    match (local, from) {
        (Ok(frame), _) => Ok(frame.into_bytes()),
        (Err(e), None) => Err(e.to_string()),
        (Err(_), Some(holder)) if holder == app.chunks().ledger().me() => {
            Err("this node is the holder named, and lacks it".into())
        }
        (Err(_), Some(holder)) => {
            let is_member = app
                .ledger()
                .read()
                .map(|d| d.ledger.members.contains_key(&holder))
                .unwrap_or(false);
            if !is_member {
                return Err(format!("node {holder} is no member of this region"));
            }
            app.chunks()
                .transport(handle)
                .fetch(holder, &id)
                .map(|frame| frame.into_bytes())
                .map_err(|e| format!("fetching it from node {holder}: {e}"))
        }
    }
}

/// `GET /v1/chunks/{id}[?from=NODE]`: a chunk frame, to a caller that may
/// see it (one of its tenants' objects or checkpoints names it).
pub async fn get_chunk(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<ChunkQuery>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let id: ChunkId = id
        .parse()
        .map_err(|_| bad_request(format!("'{id}' is not a chunk id")))?;
    let not_here = |why: String| {
        ApiError(
            StatusCode::NOT_FOUND,
            ApiErrorBody {
                code: "not_found".into(),
                message: format!("node {} does not hold chunk {id}{why}", app.name()),
            },
        )
    };
    if !super::scope::sees_chunk(&app.ledger().read()?.ledger, &caller, &id) {
        // As for a chunk this node does not hold: no oracle for others' data.
        return Err(not_here(String::new()));
    }
    let node = app.clone();
    let handle = tokio::runtime::Handle::current();
    let frame = tokio::task::spawn_blocking(move || read_chunk(&node, handle, id, q.from))
        .await
        .map_err(|e| bad_request(e.to_string()))?
        .map_err(|e| not_here(format!(": {e}")))?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        frame,
    )
        .into_response())
}
