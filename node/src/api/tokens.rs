//! Token routes beyond creation (admin only: the listings are in
//! `ADMIN_READS`, the writes are not tenant writes): `shoal token ls`,
//! `token revoke`, `token api ls|revoke|rotate-admin`, and the note of each
//! request's token for "last used". No listing ever shows a secret; the
//! ledger holds none.

use super::{bad_request, write_or_reject, ApiError, AppState};
use crate::identity;
use crate::node::Node;
use crate::trust::auth::{self, Caller};
use axum::extract::State;
use axum::{Extension, Json};
use shoal_consensus::{Command, LedgerResponse};
use shoal_sdk::{
    AdminTokenRotateResponse, ApiTokenInfo, JoinTokenInfo, TokenRevokeRequest, WriteResponse,
};
use std::sync::Arc;
use std::time::Duration;

/// Longest API-token lifetime accepted by `--ttl` (without it, a token
/// lives until revoked).
const MAX_API_TOKEN_TTL_S: u64 = 3650 * 86400;

/// The name of the API token `--bootstrap` creates and `rotate-admin` rotates.
pub const ADMIN_TOKEN_NAME: &str = "admin";

pub(super) fn api_token_ttl(ttl_s: Option<u64>) -> Result<Option<Duration>, ApiError> {
    match ttl_s {
        None => Ok(None),
        Some(s) if s == 0 || s > MAX_API_TOKEN_TTL_S => Err(bad_request(format!(
            "--ttl must be between 1s and {}d",
            MAX_API_TOKEN_TTL_S / 86400
        ))),
        Some(s) => Ok(Some(Duration::from_secs(s))),
    }
}

/// Notes that `caller`'s token was used now, and tells the ledger at most
/// once a minute per token (in the background, never holding the request).
pub(super) fn note_use(app: &Arc<Node>, caller: &Caller) {
    if !app.token_use().note(&caller.id, crate::clock::wall_ms()) {
        return;
    }
    let ledger = app.ledger().clone();
    let id = caller.id.clone();
    tokio::spawn(async move {
        if let Err(e) = ledger.write(Command::TouchApiToken { id }).await {
            tracing::debug!(error = %e.message, "could not report an API token's use");
        }
    });
}

/// Join tokens as this node's ledger has them, newest first.
pub(super) async fn list_join_tokens(
    State(app): State<AppState>,
) -> Result<Json<Vec<JoinTokenInfo>>, ApiError> {
    let d = app.ledger().read()?;
    let now = d.ledger.clock_ms.max(crate::clock::wall_ms());
    let mut rows: Vec<JoinTokenInfo> = d
        .ledger
        .join_tokens
        .iter()
        .map(|(hash, t)| JoinTokenInfo {
            id: t.id.clone(),
            uses_left: t.uses_left,
            max_uses: t.max_uses,
            created_at_ms: t.created_at_ms,
            expires_at_ms: t.expires_at_ms,
            state: t.state(now).as_str().into(),
            voter: d.ledger.voter_eligibility.voter_tokens.contains(hash),
        })
        .collect();
    rows.sort_by(|a, b| (b.created_at_ms, &b.id).cmp(&(a.created_at_ms, &a.id)));
    Ok(Json(rows))
}

pub(super) async fn revoke_join_token(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<TokenRevokeRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    let (_, index) =
        write_or_reject(&app, &caller, Command::RevokeJoinToken { id: req.id }).await?;
    Ok(Json(WriteResponse { index }))
}

/// API tokens as this node's ledger has them, with the latest use either
/// the ledger or this node knows of, oldest first.
pub(super) async fn list_api_tokens(
    State(app): State<AppState>,
) -> Result<Json<Vec<ApiTokenInfo>>, ApiError> {
    let d = app.ledger().read()?;
    let now = d.ledger.clock_ms.max(crate::clock::wall_ms());
    let mut rows: Vec<ApiTokenInfo> = d
        .ledger
        .api_tokens
        .values()
        .map(|t| ApiTokenInfo {
            id: t.id.clone(),
            name: t.name.clone(),
            tenant: t.tenant.clone(),
            created_at_ms: t.created_at_ms,
            expires_at_ms: t.expires_at_ms,
            last_used_ms: t.last_used_ms.max(app.token_use().last_seen(&t.id)),
            state: t.state(now).as_str().into(),
        })
        .collect();
    rows.sort_by(|a, b| (a.created_at_ms, &a.name).cmp(&(b.created_at_ms, &b.name)));
    Ok(Json(rows))
}

pub(super) async fn revoke_api_token(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<TokenRevokeRequest>,
) -> Result<Json<WriteResponse>, ApiError> {
    let (_, index) = write_or_reject(&app, &caller, Command::RevokeApiToken { id: req.id }).await?;
    Ok(Json(WriteResponse { index }))
}

/// Gives the bootstrap admin token a new secret. The node that answers
/// rewrites its own `<data-dir>/admin.token` (0600) when it has one (the
/// bootstrap node does), so the CLI on that machine keeps working; any
/// other copy of the old token is refused from now on.
pub(super) async fn rotate_admin_token(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<AdminTokenRotateResponse>, ApiError> {
    let (token, id, resp) = auth::rotate_api_token(app.ledger(), &caller, ADMIN_TOKEN_NAME).await?;
    match resp {
        LedgerResponse::Rejected(m) => return Err(bad_request(m)),
        LedgerResponse::Denied(m) => return Err(super::forbidden(m)),
        _ => {}
    }
    let path = app.data_dir().join(identity::ADMIN_TOKEN_FILE);
    let admin_token_file = if path.exists() {
        match identity::write_private(&path, format!("{token}\n").as_bytes(), 0o600) {
            Ok(()) => Some(path.display().to_string()),
            Err(e) => {
                // The new token is in the answer: the admin is not locked out.
                tracing::warn!(path = %path.display(), error = %e, "rotated the admin token but could not rewrite the file");
                None
            }
        }
    } else {
        None
    };
    Ok(Json(AdminTokenRotateResponse {
        token,
        name: ADMIN_TOKEN_NAME.into(),
        id,
        admin_token_file,
    }))
}
