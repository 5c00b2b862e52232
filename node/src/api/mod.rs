//! The HTTP/JSON API (axum). Everything under /v1 needs a bearer token whose
//! hash the ledger knows; /health and /metrics are open. A tenant-scoped
//! token reads only its own tenants' work (jobs, logs, checkpoints, events,
//! quotas, `mesh:/` objects and their chunks: [`scope`]) and the nodes
//! without other tenants' job ids: only the reads in [`TENANT_READS`] and
//! the writes in [`TENANT_WRITES`], so a new route is admin-only until it
//! is listed. Every write travels to the
//! leader with the caller's token; the leader resolves it again and wraps a
//! tenant's command in `Command::AsTenant`, which checks ownership at commit.
//! This node only relays: it cannot make a user's write say more than the
//! user's token allows.

pub mod ca;
pub mod dashboard;
pub mod federation;
pub mod import;
pub mod scope;
pub mod scrape;
pub mod serve;
pub mod snapshot;
pub mod stream;
pub mod telemetry;
pub mod tokens;

use crate::node::Node;
use crate::proto::{ErrorCode, Query as ProtoQuery, Response as ProtoResponse, WireError};
use crate::trust::auth::{self, Caller};
use crate::views;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use shoal_consensus::{Command, LedgerResponse};
use shoal_sdk::{
    ApiErrorBody, AttrPut, JobInfo, JobSubmitRequest, JobSubmitResponse, QuotaInfo, TenantInfo,
    TenantRequest, TokenCreateRequest, TokenCreateResponse, WriteResponse,
};
use shoal_sdk::{ApiTokenCreateRequest, ApiTokenCreateResponse};
use std::sync::Arc;
use std::time::Duration;

type AppState = Arc<Node>;

mod jobs;
use jobs::*;
mod tenants;
use tenants::*;
mod nodes;
use nodes::*;
mod objects;
use objects::*;

/// Longest join-token lifetime accepted: long-lived join secrets are a risk.
const MAX_TOKEN_TTL_S: u64 = 30 * 24 * 3600;

pub struct ApiError(StatusCode, ApiErrorBody);

/// The reads (GET routes) a tenant-scoped token may make: each answers
/// only the caller's own tenants' work ([`scope`]). Listed, as the writes
/// are, so that a new route is admin-only until someone decides otherwise;
/// `every_route_is_classified_once` makes that decision explicit.
const TENANT_READS: &[&str] = &[
    "/v1/status",
    "/v1/nodes",
    "/v1/peers",
    "/v1/jobs",
    "/v1/jobs/{id}",
    "/v1/jobs/{id}/logs",
    "/v1/jobs/{id}/checkpoints",
    "/v1/chunks/{id}",
    "/v1/objects",
    "/v1/tenants",
    "/v1/users",
    "/v1/global-tenants",
    "/v1/quota",
    "/v1/events",
    "/v1/telemetry",
    "/v1/stream",
    "/v1/federation/regions",
];

/// Reads about the cluster itself, for admin tokens only (the rest of the
/// GET routes; kept as a list so that every route is decided on).
#[cfg_attr(not(test), allow(dead_code))]
const ADMIN_READS: &[(&str, &str)] = &[
    ("GET", "/v1/attrs"),
    ("GET", "/v1/tokens"),
    ("GET", "/v1/api-tokens"),
    ("GET", "/v1/ca"),
    ("GET", "/v1/snapshot"),
    // Names every tenant shared across regions with its caps; peer
    // regions read it too (a peer's request names no tenant).
    ("GET", "/v1/federation/summary"),
];

/// The writes (method, route) a tenant-scoped token may make; every other
/// write needs an admin token. Listed, not derived, so that a new route is
/// admin-only until someone decides otherwise.
const TENANT_WRITES: &[(&str, &str)] = &[
    ("POST", "/v1/jobs"),
    ("POST", "/v1/jobs/test-only"),
    ("POST", "/v1/jobs/{id}/cancel"),
    ("POST", "/v1/jobs/{id}/hold"),
    ("POST", "/v1/jobs/{id}/signal"),
    ("POST", "/v1/jobs/{id}/requeue"),
    ("POST", "/v1/jobs/{id}/time-limit"),
    ("POST", "/v1/jobs/{id}/release"),
    ("PUT", "/v1/chunks/{id}"),
    ("POST", "/v1/chunks/has"),
    ("POST", "/v1/objects"),
    ("POST", "/v1/objects/import"),
    ("POST", "/v1/objects/rm"),
];

fn forbidden(msg: impl Into<String>) -> ApiError {
    ApiError(
        StatusCode::FORBIDDEN,
        ApiErrorBody {
            code: "forbidden".into(),
            message: msg.into(),
        },
    )
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

impl From<WireError> for ApiError {
    fn from(e: WireError) -> Self {
        let (status, code) = match e.code {
            // A removed node serves nothing the cluster commits.
            ErrorCode::NotLeader | ErrorCode::Unavailable | ErrorCode::Removed => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            ErrorCode::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ErrorCode::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            ErrorCode::Invalid => (StatusCode::BAD_REQUEST, "invalid"),
            ErrorCode::Rejected => (StatusCode::CONFLICT, "rejected"),
            ErrorCode::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            ErrorCode::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        };
        ApiError(
            status,
            ApiErrorBody {
                code: code.into(),
                message: e.message,
            },
        )
    }
}

fn bad_request(msg: impl Into<String>) -> ApiError {
    ApiError(
        StatusCode::BAD_REQUEST,
        ApiErrorBody {
            code: "invalid".into(),
            message: msg.into(),
        },
    )
}

pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/status", get(status))
        .route("/nodes", get(nodes))
        .route("/peers", get(peers))
        .route("/nodes/{node}/remove", post(remove_node))
        .route("/nodes/{node}/drain", post(drain_node))
        .route("/nodes/{node}/undrain", post(undrain_node))
        .route("/nodes/{node}/gpus/{gpu}/drain", post(drain_gpu))
        .route("/nodes/{node}/gpus/{gpu}/undrain", post(undrain_gpu))
        .route("/tokens", post(create_token).get(tokens::list_join_tokens))
        .route("/tokens/revoke", post(tokens::revoke_join_token))
        .route(
            "/api-tokens",
            post(create_api_token).get(tokens::list_api_tokens),
        )
        .route("/api-tokens/revoke", post(tokens::revoke_api_token))
        .route("/api-tokens/rotate-admin", post(tokens::rotate_admin_token))
        .route("/attrs", post(put_attr).get(get_attrs))
        .route("/ca", get(ca::status))
        .route("/ca/rotate", post(ca::rotate))
        .route("/jobs", post(submit_job).get(list_jobs))
        .route("/jobs/test-only", post(test_job))
        .route("/jobs/{id}", get(show_job))
        .route("/jobs/{id}/cancel", post(cancel_job))
        .route("/jobs/{id}/hold", post(hold_job))
        .route("/jobs/{id}/signal", post(signal_job))
        .route("/jobs/{id}/requeue", post(requeue_job))
        .route("/jobs/{id}/time-limit", post(set_time_limit))
        .route("/jobs/{id}/release", post(release_job))
        .route("/jobs/{id}/logs", get(job_logs))
        .route("/jobs/{id}/checkpoints", get(list_checkpoints))
        .route(
            "/chunks/{id}",
            get(import::get_chunk)
                .put(put_chunk)
                .layer(axum::extract::DefaultBodyLimit::max(32 << 20)),
        )
        .route("/chunks/has", post(has_chunks))
        .route("/objects", post(put_object).get(list_objects))
        .route("/objects/rm", post(remove_object))
        .route("/objects/import", post(import::import_object))
        .route("/tenants", post(create_tenant).get(list_tenants))
        .route("/users", post(set_user).get(list_users))
        .route("/tenants/{name}", post(set_tenant))
        .route(
            "/tenants/{name}/adopt",
            post(crate::api::federation::adopt_tenant),
        )
        .route("/global-tenants", get(list_global_tenants))
        .route("/quota", get(quota))
        .route("/events", get(list_events))
        .route("/snapshot", get(snapshot::get_snapshot))
        .route("/debug/gpu-fault", post(gpu_fault))
        .route("/telemetry", get(telemetry::get))
        .route(
            "/stream",
            get(stream::stream).layer(Extension(stream::StreamLimit::default())),
        )
        .merge(federation_routes())
        // Inside the token check: forwarding needs to know the caller.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::api::federation::forward,
        ))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .nest("/v1", v1)
        .merge(dashboard::routes())
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        // A client that stops sending its body mid-way does not hold a
        // handler (and a connection slot) for ever.
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            serve::BODY_READ_TIMEOUT,
        ))
        .with_state(state)
}

/// `shoal regions`, `shoal federation join|leave` and what peer regions
/// call ([`crate::api::federation`]).
fn federation_routes() -> Router<AppState> {
    use crate::api::federation as fed;
    Router::new()
        .route("/federation/summary", get(fed::summary))
        .route("/federation/regions", get(fed::regions))
        .route("/federation/join", post(fed::join))
        .route("/federation/peers", post(fed::register))
        .route("/federation/peers/leave", post(fed::peer_leaves))
        .route("/federation/regions/{region}/leave", post(fed::leave))
        .route("/federation/regions/{region}/failover", post(fed::failover))
        .route("/federation/copies/missing", post(fed::copies_missing))
        .route(
            "/federation/copies/chunks/{id}",
            axum::routing::put(fed::copies_chunk)
                .layer(axum::extract::DefaultBodyLimit::max(32 << 20)),
        )
        .route("/federation/copies", post(fed::copies_record))
}

/// Serves the API on `listener`, over HTTPS with `tls`.
pub fn spawn(
    app: Arc<Node>,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
) {
    let shutdown = app.shutdown_signal();
    let app = router(app);
    tokio::spawn(serve::serve(
        listener,
        app,
        tls,
        serve::ServeLimits::default(),
        shutdown,
    ));
}

async fn require_token(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let caller = match token {
        Some(t) => auth::caller_eventually(app.ledger(), t).await,
        None => Err(auth::TokenError::Unknown),
    };
    let caller = caller.map(|c| crate::api::federation::admit_peer(&app, c, &req));
    match caller {
        Ok(Err(refused)) => *refused,
        Ok(Ok(caller)) => {
            tokens::note_use(&app, &caller);
            if let Some(tenant) = &caller.tenant {
                let method = req.method().as_str();
                let route = req
                    .extensions()
                    .get::<MatchedPath>()
                    .map(|p| p.as_str())
                    .unwrap_or_default();
                let allowed = if method == "GET" {
                    TENANT_READS.contains(&route)
                } else {
                    TENANT_WRITES.contains(&(method, route))
                        || (caller.peer_region.is_some()
                            && crate::api::federation::COPIES.contains(&(method, route)))
                };
                if !allowed {
                    audit(&app, &caller, method, route, StatusCode::FORBIDDEN);
                    return forbidden(format!(
                        "permission denied: {method} {route} needs an admin token; \
                         token '{}' is for tenant '{tenant}'",
                        caller.name
                    ))
                    .into_response();
                }
            }
            let method = req.method().as_str().to_string();
            let route = req
                .extensions()
                .get::<MatchedPath>()
                .map(|p| p.as_str().to_string())
                .unwrap_or_default();
            let mut req = req;
            req.extensions_mut().insert(caller.clone());
            let resp = next.run(req).await;
            audit(&app, &caller, &method, &route, resp.status());
            resp
        }
        Err(refusal) => ApiError(
            StatusCode::UNAUTHORIZED,
            ApiErrorBody {
                code: "unauthorized".into(),
                message: match refusal {
                    auth::TokenError::Unknown => "a valid API token is required (SHOAL_TOKEN, --token-file or <data-dir>/admin.token)".into(),
                    auth::TokenError::Refused(why) => format!("{why}: ask an admin for a new one (shoal token api)"),
                },
            },
        )
        .into_response(),
    }
}

/// Records, as an `audit` event, every write an admin token made and every
/// request of a tenant token that was refused (a 403: another tenant's
/// object, an admin-only route). Requests naming another tenant's job,
/// answered as if it did not exist, are recorded by [`audit_hidden`]. The
/// token is named, never shown.
fn audit(app: &Arc<Node>, caller: &Caller, method: &str, route: &str, status: StatusCode) {
    let refused = caller.tenant.is_some() && status == StatusCode::FORBIDDEN;
    let admin_write = caller.tenant.is_none() && method != "GET" && status.is_success();
    if !(refused || admin_write) {
        return;
    }
    let outcome = if refused { "refused (403)" } else { "done" };
    record_audit(
        app,
        caller,
        refused,
        format!("{method} {route} {outcome}"),
        None,
    );
}

/// Records that a tenant token named another tenant's job (`resource`),
/// which was answered as if it did not exist (with `status`). The message
/// leaves the job out, so repeats on any job are counted on one event
/// (see `shoal_consensus::events`) and cannot flood the log.
fn audit_hidden(
    app: &Arc<Node>,
    caller: &Caller,
    route: &str,
    status: StatusCode,
    resource: String,
) {
    record_audit(
        app,
        caller,
        true,
        format!(
            "{route} refused: another tenant's job, answered as not found ({})",
            status.as_u16()
        ),
        Some(resource),
    );
}

/// `job N of tenant 'T'`, as this node's ledger knows it, for an audit record.
fn job_resource(app: &Node, id: u64) -> String {
    let owner = app.ledger().read().ok().and_then(|d| {
        d.ledger
            .workload
            .jobs
            .get(&id)
            .map(|j| j.spec.tenant.clone())
    });
    match owner {
        Some(tenant) => format!("job {id} of tenant '{tenant}'"),
        None => format!("job {id}"),
    }
}

fn record_audit(
    app: &Arc<Node>,
    caller: &Caller,
    refused: bool,
    what: String,
    resource: Option<String>,
) {
    let who = match &caller.tenant {
        Some(tenant) => format!("token '{}' of tenant '{tenant}'", caller.name),
        None => format!("admin token '{}'", caller.name),
    };
    let spec = shoal_consensus::events::EventSpec {
        severity: if refused {
            shoal_consensus::events::Severity::Warning
        } else {
            shoal_consensus::events::Severity::Info
        },
        kind: shoal_consensus::events::AUDIT.into(),
        node: Some(app.id()),
        gpu: None,
        // Never the job: events about a job are shown to its tenant.
        job: None,
        message: format!("{who}: {what}"),
        resource,
    };
    if refused {
        app.record_refusal(&caller.id, &who, spec);
    } else {
        app.record_audit(spec);
    }
}

async fn count_requests(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    app.metrics().count_request(&route, resp.status().as_u16());
    app.metrics().observe_request(&route, started.elapsed());
    resp
}

async fn health(State(app): State<AppState>) -> Json<serde_json::Value> {
    let leader = app.ledger().current_leader();
    Json(serde_json::json!({
        "ok": true,
        "node_id": app.id(),
        "name": app.name(),
        "leader": leader,
        // Wall-clock ms, for `shoal doctor`'s skew (finer than `Date`).
        "now_ms": crate::clock::wall_ms(),
    }))
}

async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    scrape::refresh(&app);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics().render(),
    )
}

async fn status(State(app): State<AppState>) -> Result<Json<shoal_sdk::StatusResponse>, ApiError> {
    Ok(Json(app.ledger().status().await?))
}

async fn create_token(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<TokenCreateRequest>,
) -> Result<Json<TokenCreateResponse>, ApiError> {
    let ttl = req.ttl_s.unwrap_or(app.config().join_token_ttl_s);
    if ttl == 0 || ttl > MAX_TOKEN_TTL_S {
        return Err(bad_request(format!(
            "--ttl must be between 1s and {}d",
            MAX_TOKEN_TTL_S / 86400
        )));
    }
    let uses = req.uses.unwrap_or(1);
    if uses == 0 || uses > shoal_consensus::tokens::MAX_JOIN_USES {
        return Err(bad_request(format!(
            "--uses must be between 1 and {}",
            shoal_consensus::tokens::MAX_JOIN_USES
        )));
    }
    let t = auth::create_join_token(
        app.ledger(),
        &caller,
        Duration::from_secs(ttl),
        uses,
        req.voter,
    )
    .await?;
    Ok(Json(TokenCreateResponse {
        token: t.token,
        expires_at_ms: t.expires_at_ms,
        id: t.id,
        uses,
    }))
}

async fn create_api_token(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<ApiTokenCreateRequest>,
) -> Result<Json<ApiTokenCreateResponse>, ApiError> {
    let name = req.name.unwrap_or_else(|| {
        format!(
            "{}-{:08x}",
            req.tenant.as_deref().unwrap_or("admin"),
            rand::random::<u32>()
        )
    });
    let ttl = tokens::api_token_ttl(req.ttl_s)?;
    let (token, id, expires_at_ms, resp) =
        auth::create_api_token(app.ledger(), &caller, name.clone(), req.tenant.clone(), ttl)
            .await?;
    match resp {
        LedgerResponse::Rejected(m) => Err(bad_request(m)),
        LedgerResponse::Denied(m) => Err(forbidden(m)),
        _ => Ok(Json(ApiTokenCreateResponse {
            token,
            name,
            tenant: req.tenant,
            id,
            expires_at_ms,
        })),
    }
}

async fn put_attr(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<AttrPut>,
) -> Result<Json<WriteResponse>, ApiError> {
    let cmd = Command::PutAttr {
        key: req.key,
        value: req.value,
    };
    if app
        .config()
        .test_chaos
        .as_ref()
        .is_some_and(|h| h.planted(crate::faults::chaos_hooks::PlantedBug::AckBeforeCommit))
    {
        // The planted bug: answer before the write has committed.
        let ledger = app.ledger().clone();
        tokio::spawn(async move { ledger.write_as(&caller.token, cmd).await });
        return Ok(Json(WriteResponse { index: 0 }));
    }
    let (resp, index) = app
        .ledger()
        .write_as(&caller.token, caller.relayed(cmd))
        .await?;
    match resp {
        LedgerResponse::Rejected(m) => Err(bad_request(m)),
        LedgerResponse::Denied(m) => Err(forbidden(m)),
        _ => Ok(Json(WriteResponse { index })),
    }
}

#[derive(serde::Deserialize)]
struct AttrQuery {
    #[serde(default)]
    prefix: String,
}

async fn get_attrs(
    State(app): State<AppState>,
    Query(q): Query<AttrQuery>,
) -> Result<Json<std::collections::BTreeMap<String, String>>, ApiError> {
    Ok(Json(app.ledger().attrs(q.prefix).await?))
}

/// The caller's write, checked by the leader against the caller's token; a
/// refusal is the caller's fault (HTTP 409 or 403 with the reason).
async fn write_or_reject(
    app: &Arc<Node>,
    caller: &Caller,
    cmd: Command,
) -> Result<(LedgerResponse, u64), ApiError> {
    let (resp, index) = app
        .ledger()
        .write_as(&caller.token, caller.relayed(cmd))
        .await?;
    answer_write(resp, index)
}

/// [`write_or_reject`] of a tenant-scoped route (the leader wraps a tenant
/// token's command in `AsTenant`). A command that named another tenant's
/// job is answered exactly as one naming a job that does not exist, and
/// audited with `resource` (the job, named by the handler).
async fn write_as(
    app: &Arc<Node>,
    caller: &Caller,
    route: &str,
    cmd: Command,
    resource: impl FnOnce() -> String,
) -> Result<(LedgerResponse, u64), ApiError> {
    let (resp, index) = app
        .ledger()
        .write_as(&caller.token, caller.relayed(cmd))
        .await?;
    if matches!(resp, LedgerResponse::Hidden(_)) {
        audit_hidden(app, caller, route, StatusCode::CONFLICT, resource());
    }
    answer_write(resp, index)
}

fn answer_write(resp: LedgerResponse, index: u64) -> Result<(LedgerResponse, u64), ApiError> {
    match resp {
        LedgerResponse::Rejected(m) | LedgerResponse::Hidden(m) => Err(ApiError(
            StatusCode::CONFLICT,
            ApiErrorBody {
                code: "rejected".into(),
                message: m,
            },
        )),
        LedgerResponse::Denied(m) => Err(forbidden(m)),
        other => Ok((other, index)),
    }
}

fn unexpected() -> ApiError {
    ApiError(
        StatusCode::INTERNAL_SERVER_ERROR,
        ApiErrorBody {
            code: "internal".into(),
            message: "unexpected answer from the ledger".into(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (method, route) the router declares under /v1, read from this
    /// file's source: `.route("PATH", get(..).post(..))`.
    fn declared_routes() -> Vec<(String, String)> {
        let source = include_str!("mod.rs");
        let code = &source[..source
            .find("#[cfg(test)]\nmod tests")
            .unwrap_or(source.len())];
        let mut out = Vec::new();
        let mut rest = code;
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            let Some(open) = rest.find('"') else { break };
            let Some(len) = rest[open + 1..].find('"') else {
                break;
            };
            let path = format!("/v1{}", &rest[open + 1..open + 1 + len]);
            let end = [".route(", ".merge(", ".route_layer(", "\n}"]
                .iter()
                .filter_map(|stop| rest.find(stop))
                .min()
                .unwrap_or(rest.len());
            let expr = &rest[..end];
            for method in ["get", "post", "put", "delete"] {
                let called = expr.match_indices(&format!("{method}(")).any(|(i, _)| {
                    !expr[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if called {
                    out.push((method.to_uppercase(), path.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn every_route_is_classified_once() {
        let routes = declared_routes();
        assert!(
            routes.len() > 50,
            "found only {} routes: {routes:?}",
            routes.len()
        );
        for (method, route) in &routes {
            if route == "/v1/health" || route == "/v1/metrics" {
                continue; // outside /v1, open to all
            }
            let key = (method.as_str(), route.as_str());
            if method == "GET" {
                let tenant = TENANT_READS.contains(&route.as_str());
                let admin = ADMIN_READS.contains(&key);
                assert!(
                    tenant != admin,
                    "GET {route} must be in exactly one of TENANT_READS and ADMIN_READS"
                );
            }
        }
        for route in TENANT_READS {
            assert!(
                routes.iter().any(|(m, r)| m == "GET" && r == route),
                "TENANT_READS names GET {route}, which the router does not declare"
            );
        }
        for (method, route) in TENANT_WRITES.iter().chain(crate::api::federation::COPIES) {
            assert!(
                routes.iter().any(|(m, r)| m == method && r == route),
                "{method} {route} is allowed but the router does not declare it"
            );
        }
    }
}
