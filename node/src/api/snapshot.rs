//! `GET /v1/snapshot` (admin only): a consistent backup of the ledger, in
//! the file format of [`crate::backup`], from any node.
//!
//! Consistent means linearizable: the leader confirms its leadership with
//! a quorum and answers the index it has applied (a status query, which is
//! a ReadIndex read), and the answering node — leader or follower — waits
//! until its own ledger has applied that index before it copies it. So a
//! backup holds every write acknowledged before the request, whichever node
//! serves it.

use super::{forbidden, record_audit, ApiError, AppState};
use crate::backup;
use crate::proto::{ErrorCode, WireError};
use crate::trust::auth::Caller;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use std::time::Duration;

pub async fn get_snapshot(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    if let Some(tenant) = &caller.tenant {
        return Err(forbidden(format!(
            "permission denied: a ledger snapshot needs an admin token; token '{}' is for tenant '{tenant}'",
            caller.name
        )));
    }
    let ledger = app.ledger();
    let read_index = ledger.status().await?.commit_index;
    let wait = Duration::from_millis(app.config().membership.request_timeout_ms);
    ledger
        .raft()
        .wait(Some(wait))
        .applied_index_at_least(Some(read_index), "a consistent snapshot")
        .await
        .map_err(|e| {
            WireError::new(
                ErrorCode::Unavailable,
                format!(
                    "node {} has not applied the ledger up to index {read_index} yet: {e}",
                    app.name()
                ),
            )
        })?;
    let data = ledger.read()?.clone();
    let node = app.name().to_string();
    let now = crate::clock::wall_ms();
    let (head, bytes) = tokio::task::spawn_blocking(move || backup::encode(&data, &node, now))
        .await
        .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?
        .map_err(|e| WireError::new(ErrorCode::Unavailable, e))?;
    record_audit(
        &app,
        &caller,
        false,
        format!(
            "GET /v1/snapshot: a ledger snapshot at index {} ({} bytes)",
            head.index,
            bytes.len()
        ),
        None,
    );
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!(
                    "attachment; filename=\"shoal-{}-{}.snap\"",
                    head.cluster_id, head.index
                ),
            ),
        ],
        Body::from(bytes),
    )
        .into_response())
}
