//! `mesh:/` routes: chunks (upload receipts, `has`) and objects (put, list, remove).

use super::*;

pub(super) fn parse_chunk_id(id: &str) -> Result<shoal_storage::chunk::ChunkId, ApiError> {
    id.parse()
        .map_err(|_| bad_request(format!("'{id}' is not a chunk id")))
}

/// Stores an uploaded chunk frame after verifying it against its id.
pub(super) async fn put_chunk(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = parse_chunk_id(&id)?;
    let store = app.chunks().store().clone();
    tokio::task::spawn_blocking(move || {
        shoal_storage::EncodedChunk::from_wire(id, body.to_vec()).and_then(|c| store.put(&c))
    })
    .await
    .map_err(|e| bad_request(e.to_string()))?
    .map_err(|e| {
        let full = matches!(e, shoal_storage::StorageError::StoreFull { .. });
        ApiError(
            if full {
                StatusCode::INSUFFICIENT_STORAGE
            } else {
                StatusCode::BAD_REQUEST
            },
            ApiErrorBody {
                code: if full { "full" } else { "invalid" }.into(),
                message: format!("node {}: {e}", app.name()),
            },
        )
    })?;
    // Stored and verified against its id: the tenant holds its content.
    if let Some(tenant) = &caller.tenant {
        app.chunks().note_upload(tenant, id);
    }
    Ok(Json(serde_json::json!({})))
}

/// A tenant's manifest may name a chunk none of its own objects or
/// checkpoints named before only if the tenant uploaded it to each holder
/// (`rpc::receipts`): naming a content hash proves nothing. Holders of an
/// older release, which keep no receipts, are not asked; when no holder can
/// be, such chunks are refused.
pub(crate) async fn check_uploaded(
    app: &Node,
    caller: &Caller,
    manifest: &shoal_storage::manifest::Manifest,
    holders: &[u64],
) -> Result<(), ApiError> {
    let Some(tenant) = &caller.tenant else {
        return Ok(());
    };
    let (claimed, asked) = {
        let data = app.ledger().read()?;
        let seen = scope::visible_chunks(&data.ledger, caller);
        let claimed: Vec<shoal_storage::chunk::ChunkId> = manifest
            .unique_chunks()
            .into_iter()
            .map(|c| c.id)
            .filter(|id| !seen.contains(id))
            .collect();
        let holders = if holders.is_empty() {
            vec![app.id()]
        } else {
            holders.to_vec()
        };
        let mut asked = Vec::new();
        for node in holders {
            match data.ledger.members.get(&node) {
                Some(m) if m.spec.protocol().1 >= UPLOAD_RECEIPTS_SINCE_PROTOCOL => {
                    asked.push((node, m.spec.name.clone()))
                }
                Some(_) => {}
                None => return Err(bad_request(format!("holder {node} is not a member"))),
            }
        }
        (claimed, asked)
    };
    if claimed.is_empty() {
        return Ok(());
    }
    if asked.is_empty() {
        return Err(forbidden(format!(
            "permission denied: no holder of this object keeps upload receipts (all run an older release), so none can show that tenant '{tenant}' sent the chunks its manifest names first; retry once they are upgraded"
        )));
    }
    let answers = futures::future::join_all(
        asked
            .iter()
            .map(|(node, _)| app.chunks().uploaded_to(*node, tenant, &claimed)),
    )
    .await;
    for ((_, name), answer) in asked.iter().zip(answers) {
        let uploaded = answer.map_err(|e| {
            ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                ApiErrorBody {
                    code: "unavailable".into(),
                    message: format!("cannot ask holder {name} about the uploads: {e}"),
                },
            )
        })?;
        if let Some((id, _)) = claimed.iter().zip(uploaded).find(|(_, up)| !up) {
            return Err(forbidden(format!(
                "permission denied: chunk {id} was not uploaded by tenant '{tenant}' to {name}; a manifest may name only chunks its tenant sent to each holder (shoal cp sends them)"
            )));
        }
    }
    Ok(())
}

/// The protocol from which holders keep upload receipts.
pub(super) const UPLOAD_RECEIPTS_SINCE_PROTOCOL: u16 = 5;

/// Which of the given chunks this node stores. A tenant learns it only of
/// chunks a manifest of its own names: chunk ids are the BLAKE3 of their
/// content, so an answer about anyone's chunk would tell whether any tenant
/// stores a given file. A chunk it is told is missing it uploads, which
/// proves it holds the content.
pub(super) async fn has_chunks(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(ids): Json<Vec<String>>,
) -> Result<Json<Vec<bool>>, ApiError> {
    let ids = ids
        .iter()
        .map(|id| parse_chunk_id(id))
        .collect::<Result<Vec<_>, _>>()?;
    let visible = match scope::scope(&caller) {
        None => None,
        Some(_) => Some(scope::visible_chunks(&app.ledger().read()?.ledger, &caller)),
    };
    let store = app.chunks().store();
    let out = ids
        .iter()
        .map(|id| {
            visible.as_ref().is_none_or(|v| v.contains(id)) && store.contains(id).unwrap_or(false)
        })
        .collect();
    Ok(Json(out))
}

pub(super) async fn put_object(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<shoal_sdk::ObjectPut>,
) -> Result<Json<WriteResponse>, ApiError> {
    let manifest =
        hex::decode(&req.manifest_hex).map_err(|_| bad_request("manifest_hex is not hex"))?;
    // The ledger keeps manifests opaque; one that does not decode would only
    // make every node's garbage collection and repair skip, so it is refused
    // here, before anything is stored.
    let parsed = shoal_storage::manifest::Manifest::from_bytes(&manifest)
        .map_err(|e| bad_request(format!("invalid manifest: {e}")))?;
    check_uploaded(&app, &caller, &parsed, &req.holders).await?;
    let object = shoal_consensus::namespace::MeshObject {
        path: req.path,
        is_dir: req.is_dir,
        manifest,
        bytes: req.bytes,
        files: req.files,
        holders: req.holders,
        replica: req.replica,
        tenant: req
            .tenant
            .or_else(|| caller.tenant.clone())
            .unwrap_or_else(|| shoal_consensus::workload::DEFAULT_TENANT.to_string()),
        mtime_ms: 0,
    };
    let (_, index) = write_as(
        &app,
        &caller,
        "POST /v1/objects",
        Command::PutObject {
            object,
            replace: req.replace,
        },
        String::new,
    )
    .await?;
    Ok(Json(WriteResponse { index }))
}

#[derive(serde::Deserialize)]
pub(super) struct ObjectQuery {
    #[serde(default)]
    path: String,
}

pub(super) async fn list_objects(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ObjectQuery>,
) -> Result<Json<Vec<shoal_sdk::ObjectInfo>>, ApiError> {
    let named = !q.path.trim_matches('/').is_empty();
    let objects = match app
        .ledger()
        .query(ProtoQuery::Objects { path: q.path })
        .await?
    {
        ProtoResponse::Objects(o) => o,
        _ => return Err(unexpected()),
    };
    let Some(scope) = &caller.tenant else {
        return Ok(Json(objects));
    };
    // A tenant token sees its own subtree's objects only: the manifest is
    // what names the chunks, so hiding it hides the data.
    let (mine, others): (Vec<_>, Vec<_>) = {
        let d = app.ledger().read()?;
        objects
            .into_iter()
            .partition(|o| shoal_consensus::access::covers(&d.ledger.workload, scope, &o.tenant))
    };
    match others.first() {
        Some(other) if named && mine.is_empty() => Err(forbidden(format!(
            "permission denied: mesh:{} belongs to another tenant, and this token is for tenant '{scope}'",
            other.path
        ))),
        _ => Ok(Json(mine)),
    }
}

#[derive(serde::Deserialize)]
pub(super) struct RemoveQuery {
    path: String,
}

pub(super) async fn remove_object(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<RemoveQuery>,
) -> Result<Json<WriteResponse>, ApiError> {
    let (_, index) = write_as(
        &app,
        &caller,
        "POST /v1/objects/rm",
        Command::RemoveObject { path: req.path },
        String::new,
    )
    .await?;
    Ok(Json(WriteResponse { index }))
}
