//! The HTTP/JSON API (axum). Everything under /v1 needs a bearer token whose
//! hash the ledger knows; /health and /metrics are open. A tenant-scoped
//! token reads only its own tenants' work (jobs, logs, checkpoints, events,
//! quotas, `mesh:/` objects and their chunks: [`scope`]) and the nodes
//! without other tenants' job ids, never the reads in [`ADMIN_READS`], and
//! may only make the writes in [`TENANT_WRITES`]. Every write travels to the
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
pub mod views;

use crate::node::auth::{self, Caller};
use crate::node::Node;
use crate::rpc::proto::{ErrorCode, Query as ProtoQuery, Response as ProtoResponse, WireError};
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

/// Longest join-token lifetime accepted: long-lived join secrets are a risk.
const MAX_TOKEN_TTL_S: u64 = 30 * 24 * 3600;

pub struct ApiError(StatusCode, ApiErrorBody);

/// Reads about the cluster itself, for admin tokens only.
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
                    !ADMIN_READS.contains(&(method, route))
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
        "now_ms": crate::node::clock::wall_ms(),
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

async fn nodes(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<shoal_sdk::NodeInfo>>, ApiError> {
    let nodes = app.ledger().nodes().await?;
    let d = app.ledger().read()?;
    Ok(Json(scope::nodes(&d.ledger, &caller, nodes)))
}

async fn peers(State(app): State<AppState>) -> Json<Vec<shoal_sdk::PeerView>> {
    Json(crate::api::views::peer_views(app.ledger(), app.peers()))
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
        .is_some_and(|h| h.planted(crate::node::chaos_hooks::PlantedBug::AckBeforeCommit))
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

async fn remove_node(
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

async fn submit_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(mut req): Json<JobSubmitRequest>,
) -> Result<Json<JobSubmitResponse>, ApiError> {
    if req.tenant.is_none() {
        req.tenant = caller.tenant.clone();
    }
    let mut spec = views::job_spec(&req).map_err(bad_request)?;
    {
        let data = app.ledger().read()?;
        spec.choice = views::node_choice(&data.ledger, &req).map_err(bad_request)?;
        if spec.ckpt_region_copies > 0 && data.ledger.global_tenant_id(&spec.tenant).is_none() {
            return Err(bad_request(format!(
                "--ckpt-replicas: another region keeps copies only of a tenant shared across \
                 regions, and tenant '{}' is local to this one (give it caps across regions in \
                 its home region: `shoal tenant set {} --global-gpus N`)",
                spec.tenant, spec.tenant
            )));
        }
    }
    match write_as(
        &app,
        &caller,
        "POST /v1/jobs",
        Command::SubmitJob { spec },
        String::new,
    )
    .await?
    .0
    {
        LedgerResponse::JobId(id) => Ok(Json(JobSubmitResponse {
            id,
            // A peer region forwarded it: its submitter prints REGION:ID.
            region: caller
                .peer_region
                .as_ref()
                .map(|_| crate::node::federation::local_region(&app)),
        })),
        _ => Err(unexpected()),
    }
}

/// `--test-only`: where and when the job would start, from this node's
/// replica of the ledger; nothing is written. A tenant token may ask only
/// about its own tenant's jobs, as it may only submit those.
async fn test_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(mut req): Json<JobSubmitRequest>,
) -> Result<Json<shoal_sdk::JobTestOnlyResponse>, ApiError> {
    if req.tenant.is_none() {
        req.tenant = caller.tenant.clone();
    }
    let mut spec = views::job_spec(&req).map_err(bad_request)?;
    let data = app.ledger().read()?;
    let ledger = &data.ledger;
    if let Some(scope) = scope::scope(&caller) {
        if !scope::sees_tenant(ledger, &caller, &spec.tenant) {
            return Err(forbidden(format!(
                "permission denied: a token of tenant '{scope}' cannot submit jobs for tenant '{}'",
                spec.tenant
            )));
        }
    }
    spec.choice = views::node_choice(ledger, &req).map_err(bad_request)?;
    let now_ms = crate::node::wall_ms();
    let trial = shoal_consensus::workload::trial_start(
        ledger,
        &spec,
        now_ms,
        app.config().scheduler.policy,
        None,
    )
    .map_err(|message| {
        ApiError(
            StatusCode::CONFLICT,
            ApiErrorBody {
                code: "rejected".into(),
                message,
            },
        )
    })?;
    Ok(Json(views::test_only(ledger, &trial, now_ms)))
}

/// `sacctmgr list user`: the names this caller's tenants stand behind.
async fn list_users(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<shoal_sdk::UserInfo>>, ApiError> {
    let data = app.ledger().read()?;
    let ledger = &data.ledger;
    Ok(Json(
        ledger
            .workload
            .users
            .iter()
            .filter(|(_, tenant)| scope::sees_tenant(ledger, &caller, tenant))
            .map(|(name, tenant)| shoal_sdk::UserInfo {
                name: name.clone(),
                tenant: Some(tenant.clone()),
            })
            .collect(),
    ))
}

/// `sacctmgr add|delete user` (admin: not a tenant write).
async fn set_user(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<shoal_sdk::UserInfo>,
) -> Result<Json<WriteResponse>, ApiError> {
    let (_, index) = write_or_reject(
        &app,
        &caller,
        Command::SetUser {
            name: req.name,
            tenant: req.tenant,
        },
    )
    .await?;
    Ok(Json(WriteResponse { index }))
}

#[derive(serde::Deserialize)]
struct JobQuery {
    tenant: Option<String>,
    state: Option<String>,
}

async fn list_jobs(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<JobQuery>,
) -> Result<Json<Vec<JobInfo>>, ApiError> {
    match app
        .ledger()
        .query(ProtoQuery::Jobs {
            tenant: q.tenant,
            state: q.state,
        })
        .await?
    {
        ProtoResponse::Jobs(jobs) => {
            let d = app.ledger().read()?;
            Ok(Json(scope::jobs(&d.ledger, &caller, jobs)))
        }
        _ => Err(unexpected()),
    }
}

/// The job `id`, if the caller may see it; another tenant's job answers
/// exactly as a job that does not exist, and the attempt (through `route`)
/// is an audit event.
async fn visible_job(
    app: &Arc<Node>,
    caller: &Caller,
    id: u64,
    route: &str,
) -> Result<JobInfo, ApiError> {
    let hidden = || ApiError::from(WireError::new(ErrorCode::NotFound, format!("no job {id}")));
    match app.ledger().query(ProtoQuery::Job(id)).await {
        Ok(ProtoResponse::Jobs(mut jobs)) if jobs.len() == 1 => {
            let job = jobs.remove(0);
            let sees = scope::sees_tenant(&app.ledger().read()?.ledger, caller, &job.tenant);
            if sees {
                Ok(job)
            } else {
                audit_hidden(
                    app,
                    caller,
                    route,
                    StatusCode::NOT_FOUND,
                    format!("job {id} of tenant '{}'", job.tenant),
                );
                Err(hidden())
            }
        }
        Ok(_) => Err(unexpected()),
        Err(e) if e.code == ErrorCode::NotFound => Err(hidden()),
        Err(e) => Err(e.into()),
    }
}

async fn show_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<JobInfo>, ApiError> {
    Ok(Json(
        visible_job(&app, &caller, id, "GET /v1/jobs/{id}").await?,
    ))
}

async fn cancel_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<WriteResponse>, ApiError> {
    job_write(
        &app,
        &caller,
        "POST /v1/jobs/{id}/cancel",
        id,
        Command::CancelJob { job: id },
    )
    .await
}

async fn signal_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
    Json(req): Json<shoal_sdk::JobSignalRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    let signal = shoal_consensus::workload::WarnSignal::parse(&req.signal)
        .map_err(|e| bad_request(e.replace("--signal", "signal")))?
        .signal;
    job_write(
        &app,
        &caller,
        "POST /v1/jobs/{id}/signal",
        id,
        Command::SignalJob { job: id, signal },
    )
    .await
}

async fn requeue_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<WriteResponse>, ApiError> {
    job_write(
        &app,
        &caller,
        "POST /v1/jobs/{id}/requeue",
        id,
        Command::RequeueJob { job: id },
    )
    .await
}

async fn set_time_limit(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
    Json(req): Json<shoal_sdk::JobTimeLimitRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    job_write(
        &app,
        &caller,
        "POST /v1/jobs/{id}/time-limit",
        id,
        Command::SetTimeLimit {
            job: id,
            time_limit_s: req.time_limit_s,
        },
    )
    .await
}

/// A write about job `id` in the caller's name, answered with its index;
/// another tenant's job is hidden (and audited) as [`write_as`] does.
async fn job_write(
    app: &AppState,
    caller: &Caller,
    route: &str,
    id: u64,
    cmd: Command,
) -> Result<Json<WriteResponse>, ApiError> {
    let (_, index) = write_as(app, caller, route, cmd, || job_resource(app, id)).await?;
    Ok(Json(WriteResponse { index }))
}

async fn hold_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_hold(app, caller, id, true).await
}

async fn release_job(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_hold(app, caller, id, false).await
}

async fn set_hold(
    app: AppState,
    caller: Caller,
    id: u64,
    hold: bool,
) -> Result<Json<WriteResponse>, ApiError> {
    let route = if hold {
        "POST /v1/jobs/{id}/hold"
    } else {
        "POST /v1/jobs/{id}/release"
    };
    job_write(&app, &caller, route, id, Command::HoldJob { job: id, hold }).await
}

#[derive(serde::Deserialize)]
struct LogQuery {
    #[serde(default)]
    rank: u32,
    /// Byte offset to read from, for `shoal logs -f`.
    #[serde(default)]
    offset: u64,
}

/// A rank's log: from this node's files, else relayed from the member that
/// ran the rank (the CLI asks that member directly).
async fn job_logs(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
    Query(q): Query<LogQuery>,
) -> Result<Response, ApiError> {
    use std::io::{Read, Seek, SeekFrom};
    if caller.tenant.is_some() {
        visible_job(&app, &caller, id, "GET /v1/jobs/{id}/logs").await?;
    }
    let path = crate::executor::log_path(&app.config().jobs_dir(), id, q.rank);
    if !path.exists() {
        // Ran on another member: this node fetches it from there, with the
        // caller's own credential (so that member scopes it the same way),
        // for a peer region, which reaches only some node of this one, and
        // for the dashboard, which talks to the node serving it.
        if let Some(resp) =
            crate::api::federation::rank_log(&app, &caller, id, q.rank, q.offset).await
        {
            return Ok(resp);
        }
    }
    let mut file = std::fs::File::open(&path).map_err(|_| {
        ApiError(
            StatusCode::NOT_FOUND,
            ApiErrorBody {
                code: "not_found".into(),
                message: format!("node {} has no log of job {id} rank {}", app.name(), q.rank),
            },
        )
    })?;
    let len = file
        .metadata()
        .map(|m| m.len())
        .map_err(|e| bad_request(format!("cannot read {}: {e}", path.display())))?;
    // Past the end: the log was rotated since the caller's last read, and
    // the current file starts again at 0 (`x-shoal-log-start` says so;
    // `x-shoal-log-rotations` counts rotations, for a caller whose offset
    // fits the new file too).
    let start = if q.offset > len { 0 } else { q.offset };
    let rotations = crate::executor::log_rotations(&path);
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(start))
        .and_then(|_| file.take(4 << 20).read_to_end(&mut bytes))
        .map_err(|e| bad_request(format!("cannot read {}: {e}", path.display())))?;
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_string(),
            ),
            (
                axum::http::header::HeaderName::from_static(shoal_sdk::LOG_START_HEADER),
                start.to_string(),
            ),
            (
                axum::http::header::HeaderName::from_static(shoal_sdk::LOG_ROTATIONS_HEADER),
                rotations.to_string(),
            ),
        ],
        bytes,
    )
        .into_response())
}

async fn create_tenant(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<TenantRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    let limits = views::tenant_limits(&req).map_err(bad_request)?;
    let global = views::global_caps_change(&req).map_err(bad_request)?;
    let global = (global != (None, None)).then_some(global);
    if global.is_some() {
        global_caps_spoken(&app)?;
    }
    let (_, mut index) = write_or_reject(
        &app,
        &caller,
        Command::CreateTenant {
            name: req.name.clone(),
            limits,
        },
    )
    .await?;
    if let Some(change) = global {
        index = set_global_caps(&app, &caller, req.name, change).await?;
    }
    Ok(Json(WriteResponse { index }))
}

/// Tenants capped across regions need every member to know the commands.
fn global_caps_spoken(app: &Node) -> Result<(), ApiError> {
    let spoken = app.ledger().read()?.ledger.effective_protocol();
    let since = shoal_consensus::federation::global_tenants::SINCE_PROTOCOL;
    if spoken.is_some_and(|p| p >= since) {
        return Ok(());
    }
    Err(WireError::new(
        ErrorCode::Rejected,
        format!(
            "caps across regions need every member at protocol {since} or newer (this cluster speaks {}): upgrade every node first",
            spoken.map_or("none".to_string(), |p| p.to_string())
        ),
    )
    .into())
}

async fn set_global_caps(
    app: &Arc<Node>,
    caller: &Caller,
    tenant: String,
    (gpus, gpu_seconds): views::GlobalCapsChange,
) -> Result<u64, ApiError> {
    let cmd = Command::SetGlobalCaps {
        tenant,
        gpus,
        gpu_seconds,
    };
    let (_, index) = write_or_reject(app, caller, cmd).await?;
    Ok(index)
}

async fn set_tenant(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Json(req): Json<TenantRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    let update = views::tenant_update(&req).map_err(bad_request)?;
    let global = views::global_caps_change(&req).map_err(bad_request)?;
    let global = (global != (None, None)).then_some(global);
    if global.is_some() {
        global_caps_spoken(&app)?;
    }
    let only_global =
        global.is_some() && update == shoal_consensus::workload::TenantUpdate::default();
    let mut index = 0;
    if !only_global {
        let cmd = Command::UpdateTenant {
            name: name.clone(),
            update,
        };
        index = write_or_reject(&app, &caller, cmd).await?.1;
    }
    if let Some(change) = global {
        index = set_global_caps(&app, &caller, name, change).await?;
    }
    Ok(Json(WriteResponse { index }))
}

/// `shoal tenant global`: the tenants capped across regions, this
/// region's share of each and the peers' from their latest summaries.
async fn list_global_tenants(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<shoal_sdk::GlobalTenantInfo>>, ApiError> {
    let now = crate::node::wall_ms();
    let tracker = app.federation().tracker();
    let summaries = tracker.summaries(now);
    let d = app.ledger().read()?;
    let ledger = &d.ledger;
    let me = ledger.region_name().to_string();
    let hours = |s: u64| s as f64 / 3600.0;
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    let row = |region: &str, r: &shoal_sdk::GlobalTenantReport, local: bool, reachable: bool| {
        shoal_sdk::GlobalTenantRegion {
            region: region.to_string(),
            share: r.gpus.as_ref().map(|a| clamp(a.share)),
            in_use: r.gpus.as_ref().map_or(0, |a| clamp(a.in_use)),
            demand: r.gpus.as_ref().map_or(0, |a| clamp(a.demand)),
            gpu_hours_share: r.gpu_seconds.as_ref().map(|a| hours(a.share)),
            gpu_hours_committed: r.gpu_seconds.as_ref().map_or(0.0, |a| hours(a.in_use)),
            local,
            reachable,
        }
    };
    let infos = ledger
        .global_reports()
        .into_iter()
        .filter(|r| scope::sees_tenant(ledger, &caller, &r.tenant))
        .map(|own| {
            let mut regions = vec![row(&me, &own, true, true)];
            for (summary, reachable, _) in &summaries {
                if let Some(r) = summary
                    .global_tenants
                    .iter()
                    .find(|r| r.tenant == own.tenant)
                {
                    regions.push(row(&summary.region, r, false, *reachable));
                }
            }
            shoal_sdk::GlobalTenantInfo {
                tenant: own.tenant.clone(),
                home: own.home.clone(),
                gpus: own.gpus.as_ref().map(|a| clamp(a.cap)),
                gpu_hours: own.gpu_seconds.as_ref().map(|a| hours(a.cap)),
                regions,
            }
        })
        .collect();
    Ok(Json(infos))
}

async fn list_tenants(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<TenantInfo>>, ApiError> {
    match app.ledger().query(ProtoQuery::Tenants).await? {
        ProtoResponse::Tenants(t) => {
            let d = app.ledger().read()?;
            Ok(Json(scope::tenants(&d.ledger, &caller, t)))
        }
        _ => Err(unexpected()),
    }
}

async fn quota(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<QuotaInfo>>, ApiError> {
    match app.ledger().query(ProtoQuery::Quota).await? {
        ProtoResponse::Quota(q) => {
            let d = app.ledger().read()?;
            Ok(Json(scope::quotas(&d.ledger, &caller, q)))
        }
        _ => Err(unexpected()),
    }
}

async fn list_checkpoints(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Result<Json<Vec<shoal_sdk::CheckpointInfo>>, ApiError> {
    if caller.tenant.is_some() {
        visible_job(&app, &caller, id, "GET /v1/jobs/{id}/checkpoints").await?;
    }
    match app.ledger().query(ProtoQuery::Checkpoints(id)).await? {
        ProtoResponse::Checkpoints(c) => Ok(Json(c)),
        _ => Err(unexpected()),
    }
}

/// A chunk frame from this node's store, for `shoal ckpt restore`; the
/// client verifies it against the id.
/// The id of the member named or numbered `node`.
fn member_id(app: &Arc<Node>, node: &str) -> Result<shoal_consensus::NodeId, ApiError> {
    let d = app.ledger().read()?;
    d.ledger
        .member_by_name_or_id(node)
        .map(|m| m.id)
        .ok_or_else(|| bad_request(format!("no node named or numbered '{node}'")))
}

async fn set_drain(
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
async fn set_gpu_drain(
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
struct GpuDrainBody {
    #[serde(default)]
    reason: Option<String>,
}

async fn drain_gpu(
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

async fn undrain_gpu(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((node, gpu)): Path<(String, u32)>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_gpu_drain(&app, &caller, &node, gpu, None).await
}

async fn drain_node(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(node): Path<String>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_drain(&app, &caller, &node, true).await
}

async fn undrain_node(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(node): Path<String>,
) -> Result<Json<WriteResponse>, ApiError> {
    set_drain(&app, &caller, &node, false).await
}

#[derive(serde::Deserialize)]
struct EventQuery {
    #[serde(default)]
    after: u64,
}

async fn list_events(
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
async fn gpu_fault(
    State(app): State<AppState>,
    Json(req): Json<shoal_sdk::GpuFaultRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let fault = crate::node::gpu::sim::SimFault::parse(&req.fault).map_err(bad_request)?;
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

fn parse_chunk_id(id: &str) -> Result<shoal_storage::chunk::ChunkId, ApiError> {
    id.parse()
        .map_err(|_| bad_request(format!("'{id}' is not a chunk id")))
}

/// Stores an uploaded chunk frame after verifying it against its id.
async fn put_chunk(
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
const UPLOAD_RECEIPTS_SINCE_PROTOCOL: u16 = 5;

/// Which of the given chunks this node stores. A tenant learns it only of
/// chunks a manifest of its own names: chunk ids are the BLAKE3 of their
/// content, so an answer about anyone's chunk would tell whether any tenant
/// stores a given file. A chunk it is told is missing it uploads, which
/// proves it holds the content.
async fn has_chunks(
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

async fn put_object(
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
struct ObjectQuery {
    #[serde(default)]
    path: String,
}

async fn list_objects(
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
struct RemoveQuery {
    path: String,
}

async fn remove_object(
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
