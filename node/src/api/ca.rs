//! `shoal ca status` and `shoal ca rotate` (admin only: the status is in
//! `ADMIN_READS`, the rotation is no tenant write). A rotation is started
//! by the leader, which makes the new CA and keeps its key; the status is
//! this node's ledger.

use super::{ApiError, AppState};
use crate::proto::{ErrorCode, Request, Response, WireError};
use crate::trust::auth::Caller;
use axum::extract::State;
use axum::{Extension, Json};
use shoal_consensus::Ledger;
use shoal_mesh::tls::fingerprint_pem;
use shoal_sdk::{CaRotateResponse, CaStatus, MemberCa};

pub(super) async fn status(State(app): State<AppState>) -> Result<Json<CaStatus>, ApiError> {
    let d = app.ledger().read()?;
    Ok(Json(ca_status(&d.ledger)))
}

pub(super) async fn rotate(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<CaRotateResponse>, ApiError> {
    let req = Request::RotateCa {
        token: caller.token.clone(),
    };
    match app.ledger().route(req).await? {
        Response::CaRotated {
            index,
            old_fingerprint,
            new_fingerprint,
        } => Ok(Json(CaRotateResponse {
            index,
            old_fingerprint,
            new_fingerprint,
        })),
        _ => Err(WireError::new(ErrorCode::Internal, "unexpected answer to a CA rotation").into()),
    }
}

/// The CA state of `ledger`, as `shoal ca status` shows it.
pub fn ca_status(ledger: &Ledger) -> CaStatus {
    let fp = |pem: &str| fingerprint_pem(pem).unwrap_or_default();
    let rotation = ledger.ca.rotation.as_ref();
    let members = ledger
        .active_members()
        .map(|m| {
            let report = ledger.ca.reports.get(&m.id);
            MemberCa {
                id: m.id,
                name: m.spec.name.clone(),
                state: m.state,
                cert_ca: report.map(|r| r.cert_ca.clone()).filter(|c| !c.is_empty()),
                trusts: report.map(|r| r.trusted.clone()).unwrap_or_default(),
                reported_at_ms: report.map(|r| r.at_ms),
            }
        })
        .collect();
    CaStatus {
        phase: rotation.map_or("stable", |r| r.phase.as_str()).to_string(),
        signing_fingerprint: ledger
            .cluster
            .as_ref()
            .map(|c| fp(&c.ca_cert_pem))
            .unwrap_or_default(),
        trusted: ledger.trusted_ca_pems().iter().map(|p| fp(p)).collect(),
        old_fingerprint: rotation.map(|r| r.old_fingerprint.clone()),
        new_fingerprint: rotation.map(|r| r.new_fingerprint.clone()),
        started_at_ms: rotation.map(|r| r.started_at_ms),
        phase_since_ms: rotation.map(|r| r.phase_since_ms),
        rotations: ledger.ca.generation,
        members,
        waiting_for: shoal_consensus::ca::waiting_for(&ledger.ca, &ledger.members)
            .unwrap_or_default()
            .into_iter()
            .map(|(_, why)| why)
            .collect(),
        trusted_pem: shoal_consensus::ca::join_pems(&ledger.trusted_ca_pems()),
    }
}
