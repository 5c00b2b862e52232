//! The federation routes and the forwarding layer of the API.
//!
//! Who may do what: joining and leaving need an admin token of this region
//! (a tenant token is refused by the API's write list, a peer region's
//! credential by [`admit_peer`]). A peer region's credential proves which
//! region calls, not what it may do: it reaches only [`FORWARDABLE`],
//! [`COPIES`] and [`PEER_ONLY`] ([`peer_scope`]). On [`PEER_ONLY`] (this
//! region's summary, its own leave) it acts as the region itself; on
//! [`FORWARDABLE`] and [`COPIES`] it acts only for the tenant the request
//! names (a copy: the copied job's tenant), and only
//! when that tenant is one both regions hold as the same tenant shared
//! across regions ([`GlobalTenantId`]: the same name under the same home
//! region, read from this region's ledger and from the peer's own latest
//! summary, never from the request). The request is then narrowed to that
//! tenant, so the ledger checks ownership and limits at commit exactly as
//! for a tenant token of this region. A peer's credential naming no tenant,
//! or a tenant of this region that is local to it, is refused: a region
//! forwards only on behalf of a shared tenant, never as an admin.
//! On the forwarding side, [`forward`] refuses at once what the peer
//! would: an admin token's request, and a tenant local to this region.

use crate::node::auth::Caller;
use crate::node::federation as fed;
use crate::node::federation::link::{PeerRequest, PeerTarget};
use crate::node::identity;
use crate::node::Node;
use axum::body::Body;
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use shoal_consensus::federation::global_tenants::GlobalTenantId;
use shoal_consensus::federation::{placement, PeerRegion};
use shoal_consensus::{Command, LedgerResponse};
use shoal_sdk::{
    ApiErrorBody, FederationJoinRequest, FederationJoinResponse, FederationLeaveResponse,
    JobSubmitRequest, PeerBundle, PeerRegisterRequest, PeerRegisterResponse, RegionInfo,
    RegionSummary, WriteResponse, AUTO_REGION, REGION_HEADER, TENANT_HEADER,
};
use shoal_storage::chunk::ChunkId;
use shoal_storage::manifest::Manifest;
use std::sync::Arc;

/// The job commands `--region R` forwards to another region, and what
/// `ls`, `stat`, `rm` and `cp` of `mesh://R/PATH` need there: object reads
/// and removals, and a copy's chunks, which go to and come from one node of
/// R ([`crate::api::import`]).
pub const FORWARDABLE: &[(&str, &str)] = &[
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{id}"),
    ("POST", "/v1/jobs/{id}/cancel"),
    ("GET", "/v1/jobs/{id}/logs"),
    ("GET", "/v1/jobs/{id}/checkpoints"),
    ("GET", "/v1/objects"),
    ("POST", "/v1/objects/rm"),
    ("POST", "/v1/objects/import"),
    ("POST", "/v1/chunks/has"),
    ("PUT", "/v1/chunks/{id}"),
    ("GET", "/v1/chunks/{id}"),
];

/// What a peer region's credential reaches as the region itself.
const PEER_ONLY: &[(&str, &str)] = &[
    ("GET", "/v1/federation/summary"),
    ("POST", "/v1/federation/peers/leave"),
];

/// A checkpoint copy of one of the peer's jobs (`--ckpt-replicas L+R`):
/// only a peer region's credential reaches these (an admin or tenant token
/// is refused before the body is read), and, like [`FORWARDABLE`], only for
/// the job's tenant, one both regions share: a copy becomes a job of that
/// tenant here when this region takes it over.
pub const COPIES: &[(&str, &str)] = &[
    ("POST", "/v1/federation/copies/missing"),
    ("PUT", "/v1/federation/copies/chunks/{id}"),
    ("POST", "/v1/federation/copies"),
];

/// Largest forwarded request body: a job submission or a chunk list.
const MAX_FORWARDED_BODY: usize = 1 << 20;
/// Largest forwarded chunk frame, as the chunk route itself takes.
const MAX_FORWARDED_CHUNK: usize = 32 << 20;

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(ApiErrorBody {
            code: code.into(),
            message: message.into(),
        }),
    )
        .into_response()
}

fn route_of(req: &Request) -> (String, String) {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    (req.method().as_str().to_string(), route)
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The peer region whose credential `caller` holds, if any.
fn peer_of(app: &Node, caller: &Caller) -> Option<String> {
    let d = app.ledger().read().ok()?;
    crate::node::auth::peer_region(&d.ledger, caller)
}

/// How a peer region's credential is admitted on one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerScope {
    /// Region-to-region traffic ([`PEER_ONLY`]): the region as itself.
    Region,
    /// A request forwarded for this tenant, which both regions share: the
    /// request is narrowed to it.
    Tenant(String),
}

/// What a peer region's credential may do with one request, or why not
/// (a 403's message). Pure: `region` is the peer, `onward` whether the
/// request names yet another region, `tenant` the tenant it was forwarded
/// for ([`TENANT_HEADER`]), and `shared` says whether a tenant is one this
/// region shares with the peer ([`shared_tenant`]), or why not.
pub fn peer_scope(
    region: &str,
    method: &str,
    route: &str,
    onward: bool,
    tenant: Option<&str>,
    shared: impl FnOnce(&str) -> Result<(), String>,
) -> Result<PeerScope, String> {
    let key = (method, route);
    if !FORWARDABLE.contains(&key) && !PEER_ONLY.contains(&key) && !COPIES.contains(&key) {
        return Err(format!(
            "permission denied: region {region}'s credential may forward job commands and object reads, copies and removals, send checkpoint copies and read the summary, not {method} {route}"
        ));
    }
    if onward {
        return Err(format!(
            "region {region} forwarded a request for yet another region: requests are forwarded once"
        ));
    }
    if PEER_ONLY.contains(&key) {
        return Ok(PeerScope::Region);
    }
    let Some(tenant) = tenant else {
        return Err(format!(
            "permission denied: region {region} forwarded {method} {route} for no tenant: a region \
             forwards only on behalf of a tenant both regions share (one with caps across \
             regions), never as an admin"
        ));
    };
    shared(tenant).map_err(|why| {
        format!(
            "permission denied: region {region} forwarded {method} {route} for tenant '{tenant}': {why}"
        )
    })?;
    Ok(PeerScope::Tenant(tenant.to_string()))
}

/// Whether `tenant`, named by peer `region` on a forwarded request, is one
/// this region shares with it ([`shoal_consensus::Ledger::tenant_shared_with`]).
/// The peer's side comes from its latest summary, which this node pulled
/// over TLS from the peer's own nodes, never from the request.
fn shared_tenant(app: &Node, region: &str, tenant: &str) -> Result<GlobalTenantId, String> {
    let reports = app.federation().update(|t| {
        t.status(region)
            .and_then(|p| p.summary.as_ref())
            .map(|s| s.global_tenants.clone())
    });
    let d = app.ledger().read().map_err(|e| e.message)?;
    d.ledger
        .tenant_shared_with(region, tenant, reports.as_deref())
}

/// Marks a peer region's credential as such, keeps it to [`FORWARDABLE`]
/// and [`PEER_ONLY`], and narrows a forwarded request to the shared tenant
/// it names ([`peer_scope`]). Other callers pass as they are.
pub fn admit_peer(app: &Node, mut caller: Caller, req: &Request) -> Result<Caller, Box<Response>> {
    let (method, route) = route_of(req);
    let key = (method.as_str(), route.as_str());
    let Some(region) = peer_of(app, &caller) else {
        if COPIES.contains(&key) {
            return Err(Box::new(error(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "permission denied: only a peer region's credential reaches {method} {route}"
                ),
            )));
        }
        return Ok(caller);
    };
    let onward = header(req.headers(), REGION_HEADER).is_some_and(|r| r != fed::local_region(app));
    let tenant = header(req.headers(), TENANT_HEADER);
    let scope = peer_scope(&region, &method, &route, onward, tenant.as_deref(), |t| {
        shared_tenant(app, &region, t).map(|_| ())
    });
    match scope {
        Ok(PeerScope::Region) => caller.tenant = None,
        Ok(PeerScope::Tenant(t)) => caller.tenant = Some(t),
        Err(why) => {
            tracing::warn!(%region, %method, %route, "refused a peer region's request: {why}");
            return Err(Box::new(error(StatusCode::FORBIDDEN, "forbidden", why)));
        }
    }
    caller.peer_region = Some(region);
    Ok(caller)
}

/// The tenant a request of this region may be forwarded for: the caller's
/// tenant, when this region holds it as a tenant shared across regions
/// (`global_id` finds its id). An admin token names no tenant, and another
/// region accepts none of its requests; a tenant local to this region is
/// another tenant there, whatever its name. Pure; `local` is this region.
pub fn forwarded_for(
    local: &str,
    caller_tenant: Option<&str>,
    global_id: impl FnOnce(&str) -> Option<GlobalTenantId>,
) -> Result<GlobalTenantId, String> {
    let Some(tenant) = caller_tenant else {
        return Err(
            "permission denied: another region acts only on behalf of a tenant both regions \
             share, and an admin token names none: use a token of a tenant with caps across \
             regions (`shoal tenant create|set NAME --global-gpus N` in its home region)"
                .into(),
        );
    };
    global_id(tenant).ok_or_else(|| {
        format!(
            "permission denied: tenant '{tenant}' is local to region {local}: only a tenant \
             shared across regions (caps set in its home region with --global-gpus or \
             --global-gpu-hours, adopted by the others) acts in another region"
        )
    })
}

/// The forwarding layer: a request with [`REGION_HEADER`] naming another
/// region (or `auto` on a submission) is sent there, for the caller's
/// tenant when it is shared across regions ([`forwarded_for`]; else a 403
/// here, and `auto` stays here), and its answer passed back as it came;
/// everything else runs here.
pub async fn forward(State(app): State<Arc<Node>>, req: Request, next: Next) -> Response {
    let Some(asked) = header(req.headers(), REGION_HEADER) else {
        return next.run(req).await;
    };
    let caller = req.extensions().get::<Caller>().cloned();
    let local = fed::local_region(&app);
    if asked == local || caller.as_ref().is_none_or(|c| c.peer_region.is_some()) {
        return next.run(req).await;
    }
    let (method, route) = route_of(&req);
    if !FORWARDABLE.contains(&(method.as_str(), route.as_str())) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("--region applies to job commands (submit, queue, show, cancel, logs) and to ls, stat, rm and cp of mesh://REGION/PATH; {method} {route} runs in this region"),
        );
    }
    // Another region acts only for a tenant both regions share: refused
    // here at once rather than there. `auto` keeps such a request here.
    let caller_tenant = caller.as_ref().and_then(|c| c.tenant.clone());
    let shared = forwarded_for(&local, caller_tenant.as_deref(), |t| {
        app.ledger().read().ok()?.ledger.global_tenant_id(t)
    });
    if asked != AUTO_REGION {
        // A region that does not exist is the first thing to say.
        if let Err(why) = fed::peer_named(&app, &asked) {
            return error(StatusCode::NOT_FOUND, "not_found", why);
        }
        if let Err(why) = shared {
            return error(StatusCode::FORBIDDEN, "forbidden", why);
        }
    }
    let limit = if route == "/v1/chunks/{id}" {
        MAX_FORWARDED_CHUNK
    } else {
        MAX_FORWARDED_BODY
    };
    // A chunk frame travels as it came; everything else is JSON.
    let binary = header(req.headers(), "content-type")
        .is_some_and(|t| t.starts_with("application/octet-stream"));
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid",
                format!("cannot read the request: {e}"),
            )
        }
    };
    let region = if asked == AUTO_REGION {
        if (method.as_str(), route.as_str()) != ("POST", "/v1/jobs") {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid",
                "--region auto is for submissions; name the region of an existing job",
            );
        }
        let job: JobSubmitRequest = match serde_json::from_slice(&bytes) {
            Ok(j) => j,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid",
                    format!("not a job submission: {e}"),
                )
            }
        };
        match choose_region(&app, &job, shared.as_ref().ok()) {
            Ok(r) if r == local => {
                return next
                    .run(Request::from_parts(parts, Body::from(bytes)))
                    .await;
            }
            Ok(r) => r,
            Err(why) => return error(StatusCode::CONFLICT, "rejected", why),
        }
    } else {
        asked
    };
    let peer = match fed::peer_named(&app, &region) {
        Ok(p) => p,
        Err(why) => return error(StatusCode::NOT_FOUND, "not_found", why),
    };
    // This layer sits in the router nested at `/v1`, where the request's
    // URI has lost that prefix; the peer serves the same routes under it.
    let path = format!(
        "/v1{}",
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or_else(|| parts.uri.path())
    );
    let request = PeerRequest {
        method: parts.method.clone(),
        path: &path,
        body: (!bytes.is_empty()).then(|| bytes.to_vec()),
        tenant: caller.as_ref().and_then(|c| c.tenant.as_deref()),
        binary,
    };
    // An import answers once the peer has copied the object inside its
    // region.
    let timeout = fed::request_timeout(&app)
        + (route == "/v1/objects/import")
            .then(|| serde_json::from_slice::<shoal_sdk::ObjectImport>(&bytes).ok())
            .flatten()
            .map(|import| import.replication_allowance())
            .unwrap_or_default();
    let target = fed::target(&app, &peer);
    match app.federation().send(&target, &request, timeout).await {
        Ok(resp) => passthrough(resp),
        Err(e) => {
            app.federation()
                .update(|t| t.record_failure(&region, e.to_string()));
            error(
                StatusCode::GATEWAY_TIMEOUT,
                "region_unreachable",
                e.to_string(),
            )
        }
    }
}

fn passthrough(resp: fed::link::PeerResponse) -> Response {
    let mut out = Response::builder()
        .status(StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY));
    for (k, v) in &resp.headers {
        out = out.header(k, v);
    }
    out.body(Body::from(resp.body))
        .unwrap_or_else(|e| error(StatusCode::BAD_GATEWAY, "internal", e.to_string()))
}

/// `--region auto`: the region where the job fits soonest, the data's
/// region (`--near`) and then this one on a tie
/// ([`placement::choose_region`]). Only regions that hold the caller's
/// tenant as the same shared tenant (`tenant`: its id here, `None` for an
/// admin or a tenant local to this region) are candidates besides this one.
fn choose_region(
    app: &Node,
    job: &JobSubmitRequest,
    tenant: Option<&GlobalTenantId>,
) -> Result<String, String> {
    let local = fed::local_summary(app)?;
    let mut peers = app.federation().tracker().summaries(crate::node::wall_ms());
    if let Some(near) = &job.near {
        if *near != local.region && !peers.iter().any(|(s, _, _)| s.region == *near) {
            return Err(format!(
                "--near names region '{near}', which is neither this region nor a peer"
            ));
        }
    }
    peers.retain(|(s, _, _)| {
        tenant.is_some_and(|id| {
            s.global_tenants
                .iter()
                .any(|r| r.tenant == id.name && r.home == id.home)
        })
    });
    let holds_data = |region: &str| job.near.as_deref() == Some(region);
    let mut candidates = vec![placement::Candidate {
        summary: &local,
        local: true,
        reachable: true,
        rtt_ms: None,
        holds_data: holds_data(&local.region),
    }];
    candidates.extend(
        peers
            .iter()
            .map(|(s, reachable, rtt)| placement::Candidate {
                summary: s,
                local: false,
                reachable: *reachable,
                rtt_ms: *rtt,
                holds_data: holds_data(&s.region),
            }),
    );
    let gang = placement::GangDemand {
        nodes: job.nodes,
        gpus_per_node: job.gpus_per_node,
        model: job.gpu_model.clone(),
    };
    placement::choose_region(&gang, &candidates)
}

/// `GET /v1/federation/summary`: this region, for its peers. Served after
/// a ReadIndex read: a peer renews its region lease from this answer, so
/// it must show every takeover committed before it was asked
/// ([`fed::lease`]).
pub async fn summary(State(app): State<Arc<Node>>) -> Response {
    if let Err(e) = fresh_ledger(&app).await {
        return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e);
    }
    match fed::local_summary(&app) {
        Ok(s) => Json::<RegionSummary>(s).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e),
    }
}

/// `GET /v1/federation/regions` (`shoal regions`): this region, then its
/// peers as this node last heard them.
pub async fn regions(State(app): State<Arc<Node>>) -> Response {
    let local = match fed::local_summary(&app) {
        Ok(s) => s,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e),
    };
    let now = crate::node::wall_ms();
    let tracker = app.federation().tracker();
    let mut rows: Vec<RegionInfo> = vec![fed::view::summary_row(&local, true)];
    rows.extend(fed::peers(&app).iter().map(|p| tracker.info(&p.name, now)));
    Json(rows).into_response()
}

/// An admin of this region, not a tenant and not a peer region.
fn require_admin(caller: &Caller, what: &str) -> Result<(), Box<Response>> {
    if caller.tenant.is_some() || caller.peer_region.is_some() {
        return Err(Box::new(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("permission denied: {what} needs an admin token of this region"),
        )));
    }
    Ok(())
}

fn own_bundle(app: &Node) -> Result<PeerBundle, Box<Response>> {
    let d = app.ledger().read().map_err(|e| {
        Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.message,
        ))
    })?;
    let cluster = d.ledger.cluster.as_ref().ok_or_else(|| {
        Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the cluster is not bootstrapped yet",
        ))
    })?;
    Ok(PeerBundle {
        region: cluster.region.clone(),
        cluster_id: cluster.cluster_id.clone(),
        ca_cert_pem: cluster.ca_cert_pem.clone(),
        api_urls: d
            .ledger
            .active_members()
            .filter(|m| m.state == shoal_sdk::MemberState::Alive)
            .map(|m| m.spec.api_url())
            .take(shoal_consensus::federation::MAX_PEER_URLS)
            .collect(),
    })
}

/// Commits `cmd` with the caller's token; a refusal is answered as the
/// ledger phrased it.
async fn commit(app: &Node, caller: &Caller, cmd: Command) -> Result<u64, Response> {
    match app.ledger().write_as(&caller.token, cmd).await {
        Ok((LedgerResponse::Ok, index)) => Ok(index),
        Ok((LedgerResponse::Rejected(m) | LedgerResponse::Hidden(m), _)) => {
            Err(error(StatusCode::CONFLICT, "rejected", m))
        }
        Ok((LedgerResponse::Denied(m), _)) => Err(error(StatusCode::FORBIDDEN, "forbidden", m)),
        Ok(_) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "unexpected answer from the ledger",
        )),
        Err(e) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.message,
        )),
    }
}

/// Records the peer region of `bundle` in the ledger, with the secret this
/// region presents to it: the secret goes to this node's data directory
/// first and the ledger gets only its hash (the other members fetch it
/// from here, `fed::secrets`); while a member speaks an older protocol the
/// ledger keeps the secret itself, as those members read it from there.
/// Returns the peer's name.
async fn add_peer(
    app: &Node,
    caller: &Caller,
    bundle: &PeerBundle,
    outbound_secret: String,
    inbound_token_hash: String,
) -> Result<String, Response> {
    let since = shoal_consensus::federation::SEALED_SECRETS_SINCE_PROTOCOL;
    let sealed = match app.ledger().read() {
        Ok(d) => d.ledger.effective_protocol().is_some_and(|p| p >= since),
        Err(e) => {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.message,
            ))
        }
    };
    let kept = if sealed {
        // The name becomes a file name: checked before anything is written.
        shoal_consensus::federation::validate_region_name(&bundle.region)
            .map_err(|e| error(StatusCode::BAD_REQUEST, "invalid", e))?;
        fed::secrets::store(app.data_dir(), &bundle.region, &outbound_secret).map_err(|e| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("cannot keep the secret for region {}: {e}", bundle.region),
            )
        })?;
        identity::hash_secret(&outbound_secret)
    } else {
        outbound_secret
    };
    let peer = record(bundle, kept, inbound_token_hash);
    let name = peer.name.clone();
    commit(app, caller, Command::AddPeerRegion { peer }).await?;
    Ok(name)
}

fn record(
    bundle: &PeerBundle,
    outbound_secret_hash: String,
    inbound_token_hash: String,
) -> PeerRegion {
    PeerRegion {
        name: bundle.region.clone(),
        cluster_id: bundle.cluster_id.clone(),
        ca_cert_pem: bundle.ca_cert_pem.clone(),
        api_urls: bundle.api_urls.clone(),
        outbound_secret_hash,
        inbound_token_hash,
        joined_at_ms: 0,
    }
}

/// Pulls the new peer's summary at once, so `shoal regions` shows it
/// without waiting for the next round.
fn refresh_soon(app: &Arc<Node>, region: String) {
    let app = app.clone();
    tokio::spawn(async move {
        if let Ok(peer) = fed::peer_named(&app, &region) {
            let _ = fed::refresh_peer(&app, &peer).await;
        }
    });
}

/// `POST /v1/federation/join` (`SHOAL_PEER_TOKEN=T shoal federation join URL`):
/// registers this region with the one at `url` (admin there, proven by
/// `token`), then records it here.
pub async fn join(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<FederationJoinRequest>,
) -> Response {
    if let Err(r) = require_admin(&caller, "federation join") {
        return *r;
    }
    let url = req.url.trim_end_matches('/').to_string();
    if url.starts_with("https://") && req.ca_pem.is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("{url} is https: the join needs the CA it must chain to"),
        );
    }
    let bundle = match own_bundle(&app) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let (secret_for_peer, inbound_hash) = identity::new_api_token();
    let body = match serde_json::to_vec(&PeerRegisterRequest {
        bundle: bundle.clone(),
        secret: secret_for_peer,
    }) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    };
    let target = PeerTarget {
        region: format!("at {url}"),
        urls: vec![url.clone()],
        ca_pem: req.ca_pem.clone().unwrap_or_default(),
        secret: req.token.clone(),
        wan_delay: Default::default(),
    };
    let request = PeerRequest {
        method: reqwest::Method::POST,
        path: "/v1/federation/peers",
        body: Some(body),
        tenant: None,
        binary: false,
    };
    let resp = match app
        .federation()
        .send(&target, &request, fed::request_timeout(&app))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::GATEWAY_TIMEOUT,
                "region_unreachable",
                e.to_string(),
            )
        }
    };
    if resp.status != 200 {
        let why = serde_json::from_slice::<ApiErrorBody>(&resp.body)
            .map(|b| b.message)
            .unwrap_or_else(|_| format!("HTTP {}", resp.status));
        let status = if resp.status == 401 || resp.status == 403 {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::BAD_GATEWAY
        };
        return error(
            status,
            "rejected",
            format!("the region at {url} refused the join: {why}"),
        );
    }
    let answer: PeerRegisterResponse = match serde_json::from_slice(&resp.body) {
        Ok(a) => a,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                "internal",
                format!("{url} answered the join with no bundle: {e}"),
            )
        }
    };
    let name = match add_peer(&app, &caller, &answer.bundle, answer.secret, inbound_hash).await {
        Ok(name) => name,
        Err(r) => return r,
    };
    refresh_soon(&app, name.clone());
    Json(FederationJoinResponse {
        region: name,
        cluster_id: answer.bundle.cluster_id,
    })
    .into_response()
}

/// `POST /v1/federation/peers` (admin of this region): a joining region
/// registers itself; the answer is this region's bundle and the secret the
/// joiner presents from now on.
pub async fn register(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<PeerRegisterRequest>,
) -> Response {
    if let Err(r) = require_admin(&caller, "registering a peer region") {
        return *r;
    }
    let bundle = match own_bundle(&app) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let (secret, inbound_hash) = identity::new_api_token();
    let name = match add_peer(&app, &caller, &req.bundle, req.secret, inbound_hash).await {
        Ok(name) => name,
        Err(r) => return r,
    };
    refresh_soon(&app, name);
    Json(PeerRegisterResponse { bundle, secret }).into_response()
}

/// `POST /v1/federation/peers/leave`: the calling peer region leaves.
pub async fn peer_leaves(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let Some(region) = caller.peer_region.clone() else {
        return error(StatusCode::FORBIDDEN, "forbidden", "only a peer region's credential says it leaves; an admin runs `shoal federation leave REGION`");
    };
    match commit(&app, &caller, Command::RemovePeerRegion { name: region }).await {
        Ok(index) => Json(WriteResponse { index }).into_response(),
        Err(r) => r,
    }
}

/// `POST /v1/federation/regions/{region}/leave` (`shoal federation leave
/// REGION`, admin): tells the peer (bounded; an unreachable one is
/// forgotten anyway) and forgets it here.
pub async fn leave(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Path(region): Path<String>,
) -> Response {
    if let Err(r) = require_admin(&caller, "federation leave") {
        return *r;
    }
    let peer = match fed::peer_named(&app, &region) {
        Ok(p) => p,
        Err(why) => return error(StatusCode::NOT_FOUND, "not_found", why),
    };
    let request = PeerRequest {
        method: reqwest::Method::POST,
        path: "/v1/federation/peers/leave",
        body: Some(b"{}".to_vec()),
        tenant: None,
        binary: false,
    };
    let told = app
        .federation()
        .send(
            &fed::target(&app, &peer),
            &request,
            fed::request_timeout(&app),
        )
        .await
        .is_ok_and(|r| r.status == 200);
    match commit(
        &app,
        &caller,
        Command::RemovePeerRegion {
            name: region.clone(),
        },
    )
    .await
    {
        Ok(index) => Json(FederationLeaveResponse {
            region,
            peer_told: told,
            index,
        })
        .into_response(),
        Err(r) => r,
    }
}

/// A forwarded `logs` request for a rank this node did not run: fetched
/// from the member that ran it (a peer region reaches only some node of
/// this one). `None` when this node is that member or none is known.
pub async fn rank_log(
    app: &Node,
    caller: &Caller,
    id: u64,
    rank: u32,
    offset: u64,
) -> Option<Response> {
    let (url, ca_pem) = {
        let d = app.ledger().read().ok()?;
        let job = d.ledger.workload.jobs.get(&id)?;
        let info = crate::api::views::job_info(&d.ledger, job);
        let name = info.nodes.get(rank as usize)?;
        let member = d.ledger.member_by_name_or_id(name)?;
        if member.id == app.id() {
            return None;
        }
        (
            member.spec.api_url(),
            d.ledger.cluster.as_ref()?.ca_cert_pem.clone(),
        )
    };
    let target = PeerTarget {
        region: fed::local_region(app),
        urls: vec![url],
        ca_pem,
        secret: caller.token.0.clone(),
        wan_delay: Default::default(),
    };
    let path = format!("/v1/jobs/{id}/logs?rank={rank}&offset={offset}");
    let request = PeerRequest {
        method: reqwest::Method::GET,
        path: &path,
        body: None,
        tenant: caller.tenant.as_deref(),
        binary: false,
    };
    let resp = app
        .federation()
        .send(&target, &request, fed::request_timeout(app))
        .await
        .ok()?;
    Some(passthrough(resp))
}

/// Waits until this node has applied everything the leader had committed
/// when asked (a linearizable read), within the cross-region timeout.
async fn fresh_ledger(app: &Node) -> Result<(), String> {
    let limit = fed::request_timeout(app);
    let status = tokio::time::timeout(limit, app.ledger().status())
        .await
        .map_err(|_| "this node cannot reach its region's leader".to_string())?
        .map_err(|e| e.message)?;
    app.ledger()
        .raft()
        .wait(Some(limit))
        .applied_index_at_least(Some(status.commit_index), "a fresh ledger")
        .await
        .map(|_| ())
        .map_err(|e| format!("this node's ledger lags its region's leader: {e}"))
}

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
        let mut known = super::scope::visible_chunks(&d.ledger, caller);
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

/// `POST /v1/tenants/{name}/adopt` (`shoal tenant adopt NAME --from
/// REGION`, admin): this region's own tenant NAME becomes the one REGION
/// shares across regions, as REGION's latest summary defines it. The
/// leader adopts a shared tenant on its own only when this region has no
/// tenant of the name: a name is no identity across regions.
pub async fn adopt_tenant(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Json(req): Json<shoal_sdk::TenantAdoptRequest>,
) -> Response {
    if let Err(r) = require_admin(&caller, "tenant adopt") {
        return *r;
    }
    let home = req.from;
    if let Err(why) = fed::peer_named(&app, &home) {
        return error(StatusCode::NOT_FOUND, "not_found", why);
    }
    let report = app.federation().update(|t| {
        t.status(&home)
            .and_then(|p| p.summary.as_ref())
            .and_then(|s| s.global_tenants.iter().find(|r| r.tenant == name).cloned())
    });
    let Some(report) = report else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("region {home} shares no tenant '{name}' across regions (as its latest summary here says)"),
        );
    };
    if report.home != home {
        return error(
            StatusCode::CONFLICT,
            "rejected",
            format!(
                "tenant '{name}' of region {home} is {name}@{}: adopt it --from {}",
                report.home, report.home
            ),
        );
    }
    let planned = match app.ledger().read() {
        Ok(d) => {
            let since = shoal_consensus::federation::global_tenants::CONSENT_SINCE_PROTOCOL;
            if d.ledger.effective_protocol().is_none_or(|p| p < since) {
                return error(
                    StatusCode::CONFLICT,
                    "rejected",
                    format!("tenant adopt needs every member at protocol {since} or newer: upgrade every node first"),
                );
            }
            d.ledger.plan_consented_adoption(&report)
        }
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.message),
    };
    let cmd = match planned {
        Ok(cmd) => cmd,
        Err(why) => return error(StatusCode::CONFLICT, "rejected", why),
    };
    match commit(&app, &caller, cmd).await {
        Ok(index) => Json(WriteResponse { index }).into_response(),
        Err(r) => r,
    }
}

/// `POST /v1/federation/regions/{region}/failover` (`shoal federation
/// failover REGION`, admin): takes over now every job of REGION this region
/// holds a copy of, without waiting for `region_failover_after_ms`; each
/// still starts only after REGION's lease on it has run out.
pub async fn failover(
    State(app): State<Arc<Node>>,
    Extension(caller): Extension<Caller>,
    Path(region): Path<String>,
) -> Response {
    if let Err(r) = require_admin(&caller, "federation failover") {
        return *r;
    }
    if let Err(why) = fed::peer_named(&app, &region) {
        return error(StatusCode::NOT_FOUND, "not_found", why);
    }
    let pending: Vec<u64> = match app.ledger().read() {
        Ok(d) => d
            .ledger
            .federation
            .foreign
            .get(&region)
            .map(|jobs| {
                jobs.iter()
                    .filter(|(_, j)| j.adopted_as.is_none())
                    .map(|(id, _)| *id)
                    .collect()
            })
            .unwrap_or_default(),
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.message),
    };
    let wait_ms = app.config().federation.takeover_wait_ms();
    let mut adopted = Vec::new();
    let mut refused = Vec::new();
    for origin_job in pending {
        let cmd = Command::AdoptForeignJob {
            origin: region.clone(),
            origin_job,
            wait_ms,
        };
        match app.ledger().write_as(&caller.token, cmd).await {
            Ok((LedgerResponse::JobId(id), _)) => adopted.push(shoal_sdk::AdoptedJob {
                origin: region.clone(),
                origin_job,
                job: id,
            }),
            Ok((LedgerResponse::Rejected(why) | LedgerResponse::Denied(why), _)) => {
                refused.push(format!("{region}:{origin_job}: {why}"))
            }
            Ok((other, _)) => refused.push(format!("{region}:{origin_job}: {other:?}")),
            Err(e) => refused.push(format!("{region}:{origin_job}: {}", e.message)),
        }
    }
    Json(shoal_sdk::FailoverResponse {
        region,
        adopted,
        refused,
        starts_after_ms: wait_ms,
    })
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab() -> GlobalTenantId {
        GlobalTenantId {
            home: "us-1".into(),
            name: "lab".into(),
        }
    }

    /// `lab` is shared with the peer; anything else is not.
    fn only_lab(tenant: &str) -> Result<(), String> {
        (tenant == "lab")
            .then_some(())
            .ok_or_else(|| format!("tenant '{tenant}' is local"))
    }

    #[test]
    fn a_peer_credential_on_a_forwarding_route_acts_only_for_a_shared_tenant() {
        for (method, route) in FORWARDABLE {
            // No tenant named: the hole this closes (it acted as an admin).
            let why =
                peer_scope("us-1", method, route, false, None, only_lab).expect_err("no tenant");
            assert!(
                why.starts_with("permission denied: ")
                    && why.contains("only on behalf of a tenant"),
                "{why}"
            );
            // A tenant of this region that is not shared with the peer (a
            // same-named local tenant, say) is refused with the reason.
            let why = peer_scope("us-1", method, route, false, Some("vision"), only_lab)
                .expect_err("not shared");
            assert!(
                why.contains("for tenant 'vision'") && why.contains("is local"),
                "{why}"
            );
            assert_eq!(
                peer_scope("us-1", method, route, false, Some("lab"), only_lab),
                Ok(PeerScope::Tenant("lab".into()))
            );
            // Forwarded once only, whatever the tenant.
            assert!(
                peer_scope("us-1", method, route, true, Some("lab"), only_lab)
                    .is_err_and(|e| e.contains("forwarded once"))
            );
        }
    }

    #[test]
    fn region_to_region_routes_act_as_the_region_and_nothing_else_opens() {
        let never = |_: &str| -> Result<(), String> { panic!("no tenant is checked here") };
        for (method, route) in PEER_ONLY {
            // The summary, the peer's own leave and checkpoint copies need
            // no tenant, and a tenant named there is not taken up.
            assert_eq!(
                peer_scope("us-1", method, route, false, None, never),
                Ok(PeerScope::Region)
            );
            assert_eq!(
                peer_scope("us-1", method, route, false, Some("lab"), never),
                Ok(PeerScope::Region)
            );
        }
        for (method, route) in [
            ("POST", "/v1/tokens"),
            ("POST", "/v1/tenants"),
            ("POST", "/v1/objects"),
            ("POST", "/v1/jobs/{id}/requeue"),
            ("POST", "/v1/federation/join"),
            ("GET", "/v1/snapshot"),
        ] {
            for tenant in [None, Some("lab")] {
                let why = peer_scope("us-1", method, route, false, tenant, only_lab)
                    .expect_err("not a forwarding route");
                assert!(why.contains("may forward job commands"), "{why}");
            }
        }
    }

    #[test]
    fn only_a_shared_tenant_is_forwarded_to_another_region() {
        let ids = |t: &str| (t == "lab").then(lab);
        assert_eq!(forwarded_for("us-1", Some("lab"), ids), Ok(lab()));
        let why = forwarded_for("us-1", None, ids).expect_err("an admin token");
        assert!(
            why.starts_with("permission denied: ") && why.contains("admin token"),
            "{why}"
        );
        let why = forwarded_for("us-1", Some("vision"), ids).expect_err("a local tenant");
        assert!(
            why.contains("tenant 'vision' is local to region us-1"),
            "{why}"
        );
    }
}
