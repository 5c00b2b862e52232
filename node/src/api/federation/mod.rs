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

use crate::federation::link::{PeerRequest, PeerTarget};
use crate::identity;
use crate::node::Node;
use crate::regions as fed;
use crate::trust::auth::Caller;
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
    crate::trust::auth::peer_region(&d.ledger, caller)
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

fn passthrough(resp: crate::federation::link::PeerResponse) -> Response {
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
    let mut peers = app
        .federation()
        .tracker()
        .summaries(crate::clock::wall_ms());
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

mod copies;
mod peers;

pub use copies::{copies_chunk, copies_missing, copies_record};
pub use peers::{
    adopt_tenant, failover, join, leave, peer_leaves, rank_log, regions, register, summary,
};

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
