//! The start of a CA rotation, on the leader (`shoal ca rotate`): a new CA,
//! its key in this voter's custody before anything is committed (so a
//! committed rotation always has its key somewhere), and the
//! `StartCaRotation` entry with the admin's token. The phases after that
//! are driven by `workers::ca_rotation` and checked in the ledger
//! (`shoal_consensus::ca`).

use crate::ledger_client::client::LedgerClient;
use crate::proto::{ErrorCode, WireError};
use crate::trust::auth::{Caller, Signing};
use crate::trust::ca_key;
use shoal_consensus::{Command, LedgerResponse};
use shoal_mesh::CaBundle;

/// A rotation that started.
#[derive(Clone, Debug)]
pub struct Rotated {
    pub index: u64,
    pub old_fingerprint: String,
    pub new_fingerprint: String,
}

fn internal(e: impl std::fmt::Display) -> WireError {
    WireError::new(ErrorCode::Internal, e.to_string())
}

/// Starts a rotation to a new CA, for `caller` (an admin).
pub async fn start(
    ledger: &LedgerClient,
    caller: &Caller,
    signing: &Signing,
) -> Result<Rotated, WireError> {
    if !ledger.is_leader() {
        return Err(WireError::new(ErrorCode::NotLeader, "not the leader"));
    }
    if let Some(tenant) = &caller.tenant {
        return Err(WireError::new(
            ErrorCode::Forbidden,
            format!(
                "permission denied: rotating the cluster CA needs an admin token; token '{}' is for tenant '{tenant}'",
                caller.name
            ),
        ));
    }
    let (cluster, generation) = {
        let d = ledger.read()?;
        if let Some(r) = &d.ledger.ca.rotation {
            return Err(WireError::new(
                ErrorCode::Rejected,
                shoal_consensus::ca::in_progress(r),
            ));
        }
        let cluster = d.ledger.cluster.clone().ok_or_else(|| {
            WireError::new(
                ErrorCode::Unavailable,
                "the cluster is not bootstrapped yet",
            )
        })?;
        (cluster, d.ledger.ca.generation)
    };
    let current = ca_key::signing_ca(&signing.data_dir, &cluster.ca_cert_pem)?;
    let next = CaBundle::generate_next(&cluster.cluster_id, generation.saturating_add(1))
        .map_err(internal)?;
    let cross_cert_pem = current.cross_sign(&next).map_err(internal)?;
    let old_fingerprint = current.fingerprint().map_err(internal)?;
    let new_fingerprint = next.fingerprint().map_err(internal)?;
    ca_key::add(&signing.data_dir, &next.key_pem)
        .map_err(|e| internal(format!("cannot store the new CA key: {e}")))?;
    let cmd = caller.scoped(Command::StartCaRotation {
        old_cert_pem: cluster.ca_cert_pem.clone(),
        old_fingerprint: old_fingerprint.clone(),
        new_cert_pem: next.cert_pem.clone(),
        new_fingerprint: new_fingerprint.clone(),
        cross_cert_pem,
    });
    // A write whose outcome is unknown (an error) may still commit: its
    // key stays. A refusal is final: the key of a CA nobody will trust goes.
    let (answer, index) = ledger.write_local(cmd).await?;
    let refusal = match answer {
        LedgerResponse::Ok => {
            tracing::info!(
                old = %shoal_consensus::ca::short(&old_fingerprint),
                new = %shoal_consensus::ca::short(&new_fingerprint),
                "started a CA rotation: every node now learns to trust the new CA"
            );
            return Ok(Rotated {
                index,
                old_fingerprint,
                new_fingerprint,
            });
        }
        LedgerResponse::Denied(m) => WireError::new(ErrorCode::Forbidden, m),
        LedgerResponse::Rejected(m) => WireError::new(ErrorCode::Rejected, m),
        other => internal(format!("unexpected answer to a CA rotation: {other:?}")),
    };
    let unused = |key: &str| {
        CaBundle {
            cert_pem: next.cert_pem.clone(),
            key_pem: key.to_string(),
        }
        .key_matches()
    };
    if let Err(e) = ca_key::retain(&signing.data_dir, |k| !unused(k)) {
        tracing::warn!(error = %e, "cannot delete the key of a CA rotation that was refused");
    }
    Err(refusal)
}
