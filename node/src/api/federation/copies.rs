//! Checkpoint copies from a peer region (`--ckpt-replicas L+R`): only
//! a peer's credential reaches these routes ([`super::COPIES`]), and only
//! for the copied job's tenant, one both regions share.

use super::*;

/// The peer region a copy comes from and the tenant it is for: who
/// [`admit_peer`] let through on a [`COPIES`] route, or a 403.
fn require_copier(caller: &Caller) -> Result<(String, String), Box<Response>> {
    match (&caller.peer_region, &caller.tenant) {
        (Some(region), Some(tenant)) => Ok((region.clone(), tenant.clone())),
        _ => Err(Box::new(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "only a peer region's credential sends checkpoint copies, for a tenant both regions share",
        ))),
    }
}

/// What a copy from `origin` for `tenant` may name that this node holds
/// without being sent it again: the chunks of the tenant's own objects and
/// checkpoints here, and of the copies `origin` sent for it before. Any
/// other chunk must come in the copy itself (its receipt then counts), as
/// a tenant's own upload must: a chunk id is the hash of its content, so
/// naming one proves nothing (`rpc::receipts`).
struct CopyRights {
    tenant: String,
    known: std::collections::HashSet<ChunkId>,
}

impl CopyRights {
    fn of(app: &Node, origin: &str, caller: &Caller, tenant: &str) -> Result<CopyRights, String> {
        let d = app.ledger().read().map_err(|e| e.message)?;
        let mut known = crate::api::scope::visible_chunks(&d.ledger, caller);
        let copies = d.ledger.federation.foreign.get(origin);
        for job in copies
            .into_iter()
            .flat_map(|jobs| jobs.values())
            .filter(|j| j.spec.tenant == tenant)
        {
            for part in job.checkpoint.parts.values() {
                if let Ok(m) = Manifest::from_bytes(&part.manifest) {
                    known.extend(m.unique_chunks().into_iter().map(|c| c.id));
                }
            }
        }
        Ok(CopyRights {
            tenant: tenant.to_string(),
            known,
        })
    }

    fn may_name(&self, app: &Node, id: &ChunkId) -> bool {
        self.known.contains(id)
            || app
                .chunks()
                .uploaded(&self.tenant, std::slice::from_ref(id))
                .first()
                .copied()
                .unwrap_or(false)
    }
}

/// `POST /v1/federation/copies/missing` (peer region, for a shared
/// tenant): which of the listed chunks the copy must send this node.
pub async fn copies_missing(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Json(list): Json<shoal_sdk::ChunkList>,
) -> Response {
    let (origin, tenant) = match require_copier(&caller) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let node = app.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let rights = CopyRights::of(&node, &origin, &caller, &tenant)?;
        fed::copy::missing_here(&node, &list, |id| rights.may_name(&node, id))
    })
    .await;
    match answer {
        Ok(Ok(missing)) => Json(missing).into_response(),
        Ok(Err(e)) => error(StatusCode::BAD_REQUEST, "invalid", e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    }
}

/// `PUT /v1/federation/copies/chunks/{id}` (peer region, for a shared
/// tenant): one chunk frame, verified against its id before it is stored,
/// and receipted to the tenant.
pub async fn copies_chunk(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let (_, tenant) = match require_copier(&caller) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let node = app.clone();
    match tokio::task::spawn_blocking(move || fed::copy::store_chunk(&node, &id, body.to_vec()))
        .await
    {
        Ok(Ok(id)) => {
            app.chunks().note_upload(&tenant, id);
            Json(serde_json::json!({})).into_response()
        }
        Ok(Err(e)) => error(StatusCode::BAD_REQUEST, "invalid", e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    }
}

/// `POST /v1/federation/copies` (peer region, for the job's tenant, one
/// both regions share): a job and a committed step whose chunks this node
/// holds, each sent in this copy or the tenant's already; copied to peers
/// of this region and recorded in its ledger.
pub async fn copies_record(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Json(request): Json<fed::copy::CopyRequest>,
) -> Response {
    let (origin, tenant) = match require_copier(&caller) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    if request.spec.tenant != tenant {
        return error(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "permission denied: region {origin} sent a copy for tenant '{tenant}' of a job of tenant '{}'",
                request.spec.tenant
            ),
        );
    }
    let node = app.clone();
    let handle = tokio::runtime::Handle::current();
    let from = origin.clone();
    let req = request.clone();
    let who = caller.clone();
    let checkpoint = match tokio::task::spawn_blocking(move || {
        let rights =
            CopyRights::of(&node, &from, &who, &tenant).map_err(fed::copy::CopyRefused::Failed)?;
        fed::copy::replicate_here(&node, handle, &from, &req, |id| rights.may_name(&node, id))
    })
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(fed::copy::CopyRefused::NotSent(why))) => {
            return error(StatusCode::FORBIDDEN, "forbidden", why)
        }
        Ok(Err(fed::copy::CopyRefused::Failed(why))) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why)
        }
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    };
    let cmd = Command::RecordForeignCheckpoint {
        origin,
        origin_job: request.origin_job,
        spec: Box::new(request.spec),
        checkpoint: Box::new(checkpoint),
        origin_index: request.origin_index,
    };
    match commit(&app, &caller, cmd).await {
        Ok(index) => Json(WriteResponse { index }).into_response(),
        Err(r) => r,
    }
}
