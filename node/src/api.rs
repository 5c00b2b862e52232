//! The HTTP/JSON API (axum). Everything under /v1 needs a bearer token whose
//! hash the ledger knows; /health and /metrics are open.

use crate::agent::Inner;
use crate::proto::{ErrorCode, WireError};
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openraft::ServerState;
use shoal_consensus::{Command, LedgerResponse};
use shoal_sdk::{
    ApiErrorBody, AttrPut, MemberState, TokenCreateRequest, TokenCreateResponse, WriteResponse,
};
use std::sync::Arc;
use std::time::Duration;

type AppState = Arc<Inner>;

/// Longest join-token lifetime accepted: long-lived join secrets are a risk.
const MAX_TOKEN_TTL_S: u64 = 30 * 24 * 3600;

pub struct ApiError(StatusCode, ApiErrorBody);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

impl From<WireError> for ApiError {
    fn from(e: WireError) -> Self {
        let (status, code) = match e.code {
            ErrorCode::NotLeader | ErrorCode::Unavailable => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            ErrorCode::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ErrorCode::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            ErrorCode::Invalid => (StatusCode::BAD_REQUEST, "invalid"),
            ErrorCode::Rejected => (StatusCode::CONFLICT, "rejected"),
            ErrorCode::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
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
        .route("/tokens", post(create_token))
        .route("/attrs", post(put_attr).get(get_attrs))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .nest("/v1", v1)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

pub fn spawn(inner: Arc<Inner>, listener: tokio::net::TcpListener) {
    let mut shutdown = inner.shutdown_signal();
    let app = router(inner);
    tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = shutdown.changed().await;
        });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "the HTTP API stopped");
        }
    });
}

async fn require_token(State(inner): State<AppState>, req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match token {
        Some(t) if inner.token_valid(t) => next.run(req).await,
        _ => ApiError(
            StatusCode::UNAUTHORIZED,
            ApiErrorBody {
                code: "unauthorized".into(),
                message:
                    "a valid API token is required (--token, SHOAL_TOKEN or <data-dir>/admin.token)"
                        .into(),
            },
        )
        .into_response(),
    }
}

async fn count_requests(State(inner): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    inner.metrics.count_request(&route, resp.status().as_u16());
    resp
}

async fn health(State(inner): State<AppState>) -> Json<serde_json::Value> {
    let leader = inner.raft.metrics().borrow().current_leader;
    Json(
        serde_json::json!({ "ok": true, "node_id": inner.id, "name": inner.name, "leader": leader }),
    )
}

async fn metrics(State(inner): State<AppState>) -> impl IntoResponse {
    {
        let m = inner.raft.metrics().borrow().clone();
        let mm = &inner.metrics;
        mm.raft_term.set(m.current_term as i64);
        mm.raft_is_leader
            .set(i64::from(m.state == ServerState::Leader));
        mm.raft_commit_index
            .set(m.last_applied.map(|l| l.index as i64).unwrap_or(0));
        mm.raft_last_log_index
            .set(m.last_log_index.map(|i| i as i64).unwrap_or(0));
        mm.raft_voters
            .set(m.membership_config.membership().voter_ids().count() as i64);
        if let Ok(d) = inner.ledger.read() {
            for state in [
                MemberState::Alive,
                MemberState::Suspect,
                MemberState::Down,
                MemberState::Left,
            ] {
                let n = d
                    .ledger
                    .members
                    .values()
                    .filter(|m| m.state == state)
                    .count();
                mm.members
                    .get_or_create(&vec![("state".into(), state.as_str().into())])
                    .set(n as i64);
            }
        }
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        inner.metrics.render(),
    )
}

async fn status(
    State(inner): State<AppState>,
) -> Result<Json<shoal_sdk::StatusResponse>, ApiError> {
    Ok(Json(inner.status().await?))
}

async fn nodes(State(inner): State<AppState>) -> Result<Json<Vec<shoal_sdk::NodeInfo>>, ApiError> {
    Ok(Json(inner.nodes().await?))
}

async fn peers(State(inner): State<AppState>) -> Json<Vec<shoal_sdk::PeerView>> {
    Json(inner.peer_views())
}

async fn create_token(
    State(inner): State<AppState>,
    Json(req): Json<TokenCreateRequest>,
) -> Result<Json<TokenCreateResponse>, ApiError> {
    let ttl = req.ttl_s.unwrap_or(inner.cfg.join_token_ttl_s);
    if ttl == 0 || ttl > MAX_TOKEN_TTL_S {
        return Err(bad_request(format!(
            "--ttl must be between 1s and {}d",
            MAX_TOKEN_TTL_S / 86400
        )));
    }
    let (token, expires_at_ms) = inner.create_join_token(Duration::from_secs(ttl)).await?;
    Ok(Json(TokenCreateResponse {
        token,
        expires_at_ms,
    }))
}

async fn put_attr(
    State(inner): State<AppState>,
    Json(req): Json<AttrPut>,
) -> Result<Json<WriteResponse>, ApiError> {
    let (resp, index) = inner
        .write(Command::PutAttr {
            key: req.key,
            value: req.value,
        })
        .await?;
    match resp {
        LedgerResponse::Rejected(m) => Err(bad_request(m)),
        _ => Ok(Json(WriteResponse { index })),
    }
}

async fn remove_node(
    State(inner): State<AppState>,
    Path(node): Path<String>,
) -> Result<Json<WriteResponse>, ApiError> {
    let id = {
        let d = inner.read_ledger()?;
        d.ledger
            .member_by_name_or_id(&node)
            .map(|m| m.id)
            .ok_or_else(|| bad_request(format!("no node named or numbered '{node}'")))?
    };
    let index = inner.remove_member(id).await?;
    Ok(Json(WriteResponse { index }))
}

#[derive(serde::Deserialize)]
struct AttrQuery {
    #[serde(default)]
    prefix: String,
}

async fn get_attrs(
    State(inner): State<AppState>,
    Query(q): Query<AttrQuery>,
) -> Result<Json<std::collections::BTreeMap<String, String>>, ApiError> {
    Ok(Json(inner.attrs(q.prefix).await?))
}
