//! Node routes: members and peers, removal, node and GPU drains, GPU faults, and the event log.

use super::*;

pub(super) async fn nodes(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<shoal_sdk::NodeInfo>>, ApiError> {
    let nodes = app.ledger().nodes().await?;
    let d = app.ledger().read()?;
    Ok(Json(scope::nodes(&d.ledger, &caller, nodes)))
}

pub(super) async fn peers(State(app): State<AppState>) -> Json<Vec<shoal_sdk::PeerView>> {
    Json(crate::views::peer_views(app.ledger(), app.peers()))
}

pub(super) async fn remove_node(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(node): Path<String>,
) -> Result<Json<WriteResponse>, ApiError> {
    let id = {
        let d = app.ledger().read()?;
        d.ledger
            .member_by_name_or_id(&node)
            .map(|m| m.id)
            .ok_or_else(|| bad_request(format!("no node named or numbered '{node}'")))?
    };
    let index = app
        .ledger()
        .remove_member(id, Some(caller.token.clone()))
        .await?;
    Ok(Json(WriteResponse { index }))
}

/// A chunk frame from this node's store, for `shoal ckpt restore`; the
/// client verifies it against the id.
/// The id of the member named or numbered `node`.
pub(super) fn member_id(app: &Arc<Node>, node: &str) -> Result<shoal_consensus::NodeId, ApiError> {
    let d = app.ledger().read()?;
    d.ledger
        .member_by_name_or_id(node)
        .map(|m| m.id)
        .ok_or_else(|| bad_request(format!("no node named or numbered '{node}'")))
}

pub(super) async fn set_drain(
    app: &Arc<Node>,
    caller: &Caller,
    node: &str,
    drain: bool,
) -> Result<Json<WriteResponse>, ApiError> {
    let id = member_id(app, node)?;
    let (_, index) = write_or_reject(app, caller, Command::SetDrain { id, drain }).await?;
    Ok(Json(WriteResponse { index }))
}

/// `shoal gpu drain NODE:IDX`: the GPU takes no work (its job moves) until
/// `shoal gpu undrain`, which also returns a GPU its node found faulty.
pub(super) async fn set_gpu_drain(
    app: &Arc<Node>,
    caller: &Caller,
    node: &str,
    gpu: u32,
    reason: Option<String>,
) -> Result<Json<WriteResponse>, ApiError> {
    let id = member_id(app, node)?;
    let fault = reason.map(|reason| shoal_consensus::ledger::GpuFaultReport {
        reason,
        detected: false,
    });
    let cmd = Command::SetGpuFault {
        node: id,
        gpu,
        fault,
    };
    let (_, index) = write_or_reject(app, caller, cmd).await?;
    Ok(Json(WriteResponse { index }))
}

#[derive(serde::Deserialize, Default)]
pub(super) struct GpuDrainBody {
    #[serde(default)]
    reason: Option<String>,
}

pub(super) async fn drain_gpu(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((node, gpu)): Path<(String, u32)>,
    Json(body): Json<GpuDrainBody>,
) -> Result<Json<WriteResponse>, ApiError> {
    let reason = body
        .reason
        .unwrap_or_else(|| "drained by an operator".into());
    set_gpu_drain(&app, &caller, &node, gpu, Some(reason)).await
}

pub(super) async fn undrain_gpu(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((node, gpu)): Path<(String, u32)>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_gpu_drain(&app, &caller, &node, gpu, None).await
}

pub(super) async fn drain_node(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(node): Path<String>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_drain(&app, &caller, &node, true).await
}

pub(super) async fn undrain_node(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(node): Path<String>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_drain(&app, &caller, &node, false).await
}

#[derive(serde::Deserialize)]
pub(super) struct EventQuery {
    #[serde(default)]
    after: u64,
}

pub(super) async fn list_events(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<EventQuery>,
) -> Result<Json<Vec<shoal_sdk::EventInfo>>, ApiError> {
    match app
        .ledger()
        .query(ProtoQuery::Events { after: q.after })
        .await?
    {
        ProtoResponse::Events(e) => {
            let d = app.ledger().read()?;
            Ok(Json(scope::events(&d.ledger, &caller, e)))
        }
        _ => Err(unexpected()),
    }
}

/// Makes a simulated GPU of this node misbehave (tests, demos, drills).
pub(super) async fn gpu_fault(
    State(app): State<AppState>,
    Json(req): Json<shoal_sdk::GpuFaultRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let fault = crate::gpu::sim::SimFault::parse(&req.fault).map_err(bad_request)?;
    let injector = app
        .gpus()
        .fault_injector()
        .ok_or_else(|| bad_request(format!("node {} has no simulated GPUs", app.name())))?;
    if !app.local().spec.gpus.iter().any(|g| g.index == req.gpu) {
        return Err(bad_request(format!(
            "node {} has no GPU {}",
            app.name(),
            req.gpu
        )));
    }
    injector.inject(req.gpu, fault);
    Ok(Json(
        serde_json::json!({"node": app.name(), "gpu": req.gpu, "fault": req.fault}),
    ))
}
