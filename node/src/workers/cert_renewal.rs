//! Keeps this node's certificate fresh: at two thirds of its lifetime the
//! node makes a new key, has the leader sign it over the existing mTLS
//! channel, stores it (0600) and serves (RPC and API) and dials with it
//! from then on.
//! A node whose certificate expires anyway (it was cut off for a third of
//! the lifetime) is refused by its peers and must rejoin.

use super::Worker;
use crate::node::credentials::CredentialsInForce;
use crate::node::identity::{self, Identity};
use crate::node::LedgerClient;
use crate::rpc::proto::{Request, Response};
use shoal_mesh::NodeCredentials;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub struct CertRenewal {
    pub ledger: LedgerClient,
    pub in_force: CredentialsInForce,
    pub data_dir: PathBuf,
    pub identity: Identity,
    pub period: Duration,
}

/// Whether a certificate valid from `not_before` to `not_after` (seconds
/// since the epoch) is due for renewal at `now`: two thirds of it are gone.
pub fn due(not_before: i64, not_after: i64, now: i64) -> bool {
    let span = (not_after - not_before).max(1);
    now >= not_before + span * 2 / 3
}

impl CertRenewal {
    /// A period that checks often enough for the configured lifetime.
    pub fn period_for(lifetime: Duration) -> Duration {
        (lifetime / 30).clamp(Duration::from_millis(500), Duration::from_secs(60))
    }

    async fn renew(&mut self) -> Result<(), String> {
        let (key_pem, csr_pem) =
            shoal_mesh::tls::new_key_and_csr(&self.identity.name).map_err(|e| e.to_string())?;
        let req = Request::RenewCertificate {
            member: self.identity.node_id,
            csr_pem,
        };
        let cert_pem = match self.ledger.route(req).await.map_err(|e| e.message)? {
            Response::Certificate(pem) => pem,
            _ => return Err("unexpected answer to a renewal".into()),
        };
        let credentials = NodeCredentials {
            key_pem,
            cert_pem,
            ca_pem: self.identity.credentials.ca_pem.clone(),
        };
        // On disk first: a crash after this restarts with the new identity.
        let renewed = Identity {
            credentials: credentials.clone(),
            ..self.identity.clone()
        };
        identity::save_identity(&self.data_dir, &renewed)?;
        self.in_force.install(&credentials)?;
        self.identity = renewed;
        Ok(())
    }
}

impl Worker for CertRenewal {
    fn period(&self) -> Duration {
        self.period
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let Some((not_before, not_after)) =
            shoal_mesh::tls::cert_validity(&self.identity.credentials.cert_pem)
        else {
            tracing::warn!("this node's certificate cannot be read; not renewing it");
            return ControlFlow::Break(());
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        if !due(not_before, not_after, now) {
            return ControlFlow::Continue(());
        }
        match self.renew().await {
            Ok(()) => tracing::info!(expired_at = not_after, "renewed this node's certificate"),
            Err(e) => tracing::warn!(error = %e, "could not renew this node's certificate yet"),
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_at_two_thirds_of_the_lifetime() {
        assert!(!due(0, 300, 199));
        assert!(due(0, 300, 200));
        assert!(due(0, 300, 400), "an expired certificate is due too");
        assert!(due(10, 10, 10), "a zero span never divides by zero");
    }

    #[test]
    fn the_check_period_follows_the_lifetime() {
        assert_eq!(
            CertRenewal::period_for(Duration::from_secs(7 * 24 * 3600)),
            Duration::from_secs(60)
        );
        assert_eq!(
            CertRenewal::period_for(Duration::from_secs(30)),
            Duration::from_secs(1)
        );
    }
}
