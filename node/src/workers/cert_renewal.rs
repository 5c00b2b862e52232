//! Keeps this node's credentials in line with the cluster's CAs:
//!
//! - **Trust.** The node accepts peers signed by every CA the ledger
//!   trusts (two during a CA rotation, [`shoal_consensus::ca`]): when that
//!   set changes, it installs it (RPC, API, the ranks' CA file) at once.
//! - **Renewal.** At two thirds of its certificate's lifetime, or at once
//!   when a CA other than the signing one signed it (a rotation switched
//!   CAs), the node makes a new key, has the leader sign it over the
//!   existing mTLS channel, stores it (0600) and serves (RPC and API) and
//!   dials with it from then on.
//! - **Report.** It tells the ledger what it trusts and which CA signed its
//!   certificate (`ReportCredentials`, about itself only), which is what a
//!   rotation waits for before each phase.
//!
//! A node whose certificate expires anyway (it was cut off for a third of
//! the lifetime) is refused by its peers and must rejoin.

use crate::credentials::CredentialsInForce;
use crate::identity::{self, Identity};
use crate::ledger_client::LedgerClient;
use crate::proto::{Request, Response};
use crate::worker::Worker;
use shoal_consensus::Command;
use shoal_mesh::tls::{fingerprint_pem, issuer_fingerprint, split_certs};
use shoal_mesh::NodeCredentials;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the node compares its credentials with the ledger: a CA
/// rotation waits for every node at each phase.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Bounds of the wait after a failed renewal or report.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

pub struct CertRenewal {
    ledger: LedgerClient,
    in_force: CredentialsInForce,
    data_dir: PathBuf,
    identity: Identity,
    /// The cluster CA file ranks read (`SHOAL_CA_FILE`), when there is one.
    rank_ca_file: Option<PathBuf>,
    renew_retry: Retry,
    report_retry: Retry,
    signer: SignerMemo,
}

/// The last answer of [`signer`] and what it was asked: checking a
/// signature every second on every node, for credentials that change
/// once in months, was a tenth of an idle node's CPU.
#[derive(Default)]
struct SignerMemo {
    asked: Option<(String, String, Option<String>)>,
    answer: Option<String>,
}

impl SignerMemo {
    fn signer(&mut self, cert_pem: &str, bundle: &str, skip: Option<&str>) -> Option<String> {
        let same = self
            .asked
            .as_ref()
            .is_some_and(|(c, b, s)| c == cert_pem && b == bundle && s.as_deref() == skip);
        if !same {
            self.answer = signer(cert_pem, bundle, skip);
            self.asked = Some((
                cert_pem.to_owned(),
                bundle.to_owned(),
                skip.map(str::to_owned),
            ));
        }
        self.answer.clone()
    }
}

/// Backoff after failures.
#[derive(Default)]
struct Retry {
    not_before: Option<Instant>,
    wait: Duration,
}

impl Retry {
    fn ready(&self) -> bool {
        self.not_before.is_none_or(|t| Instant::now() >= t)
    }

    fn failed(&mut self) {
        self.wait = (self.wait * 2).clamp(RETRY_MIN, RETRY_MAX);
        self.not_before = Some(Instant::now() + self.wait);
    }

    fn succeeded(&mut self) {
        *self = Retry::default();
    }
}

/// Whether a certificate valid from `not_before` to `not_after` (seconds
/// since the epoch) is due for renewal at `now`: two thirds of it are gone.
pub fn due(not_before: i64, not_after: i64, now: i64) -> bool {
    let span = (not_after - not_before).max(1);
    now >= not_before + span * 2 / 3
}

/// Why the node's certificate must be renewed now, if it must: its age, or
/// a signer (`cert_ca`, `None` when no trusted CA signed it) that is not the
/// CA that signs now.
pub fn renewal_reason(
    validity: (i64, i64),
    now: i64,
    cert_ca: Option<&str>,
    signing_ca: &str,
) -> Option<&'static str> {
    if cert_ca != Some(signing_ca) {
        Some("another CA signs certificates now")
    } else if due(validity.0, validity.1, now) {
        Some("two thirds of its lifetime are gone")
    } else {
        None
    }
}

/// Fingerprints of the certificates of a PEM bundle, sorted, without `skip`.
fn fingerprints(bundle: &str, skip: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = split_certs(bundle)
        .iter()
        .filter_map(|c| fingerprint_pem(c))
        .filter(|f| Some(f.as_str()) != skip)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Which CA of `bundle` (but `skip`) signed `cert_pem`: its fingerprint.
/// The cross-certificate is left out, since as a root it is the new CA
/// under another fingerprint.
fn signer(cert_pem: &str, bundle: &str, skip: Option<&str>) -> Option<String> {
    split_certs(bundle)
        .iter()
        .filter(|c| fingerprint_pem(c).as_deref() != skip)
        .find(|c| shoal_mesh::tls::issued_by(cert_pem, c))
        .and_then(|c| fingerprint_pem(c))
}

/// What the ledger says this node's credentials should be.
struct Wanted {
    /// The CA bundle every node trusts (with a rotation's cross-certificate).
    bundle: String,
    signing_fingerprint: String,
    cross_fingerprint: Option<String>,
    /// What the ledger last heard from this node.
    reported: Option<(Vec<String>, String)>,
}

impl CertRenewal {
    pub fn new(
        ledger: LedgerClient,
        in_force: CredentialsInForce,
        data_dir: PathBuf,
        identity: Identity,
        rank_ca_file: Option<PathBuf>,
    ) -> Self {
        CertRenewal {
            ledger,
            in_force,
            data_dir,
            identity,
            rank_ca_file,
            renew_retry: Retry::default(),
            report_retry: Retry::default(),
            signer: SignerMemo::default(),
        }
    }

    fn wanted(&self) -> Option<Wanted> {
        let d = self.ledger.read().ok()?;
        let cluster = d.ledger.cluster.as_ref()?;
        Some(Wanted {
            bundle: d.ledger.ca_bundle_pem(),
            signing_fingerprint: fingerprint_pem(&cluster.ca_cert_pem)?,
            cross_fingerprint: d
                .ledger
                .ca
                .rotation
                .as_ref()
                .and_then(|r| fingerprint_pem(&r.cross_cert_pem)),
            reported: d
                .ledger
                .ca
                .reports
                .get(&self.identity.node_id)
                .map(|r| (r.trusted.clone(), r.cert_ca.clone())),
        })
    }

    /// Puts `credentials` in force: on disk first (a crash after this
    /// restarts with them), then the RPC endpoint and the API.
    async fn put_in_force(&mut self, credentials: NodeCredentials) -> Result<(), String> {
        let updated = Identity {
            credentials: credentials.clone(),
            ..self.identity.clone()
        };
        identity::save_identity(&self.data_dir, &updated)?;
        self.in_force.install(&credentials).await?;
        self.identity = updated;
        Ok(())
    }

    async fn trust(&mut self, bundle: &str) -> Result<(), String> {
        let credentials = NodeCredentials {
            ca_pem: bundle.to_string(),
            ..self.identity.credentials.clone()
        };
        self.put_in_force(credentials).await?;
        if let Some(path) = &self.rank_ca_file {
            identity::write_private(path, bundle.as_bytes(), 0o644)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        Ok(())
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
        if issuer_fingerprint(&cert_pem, &self.identity.credentials.ca_pem).is_none() {
            return Err(
                "the leader signed the certificate with a CA this node does not trust yet".into(),
            );
        }
        let credentials = NodeCredentials {
            key_pem,
            cert_pem,
            ca_pem: self.identity.credentials.ca_pem.clone(),
        };
        self.put_in_force(credentials).await
    }

    async fn report(&mut self, trusted: Vec<String>, cert_ca: String) {
        let cmd = Command::ReportCredentials {
            node: self.identity.node_id,
            trusted,
            cert_ca,
        };
        match self.ledger.write(cmd).await {
            Ok((shoal_consensus::LedgerResponse::Ok, _)) => self.report_retry.succeeded(),
            Ok((other, _)) => {
                tracing::warn!(answer = ?other, "the ledger refused this node's credentials report");
                self.report_retry.failed();
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not report this node's credentials yet");
                self.report_retry.failed();
            }
        }
    }
}

impl Worker for CertRenewal {
    fn period(&self) -> Duration {
        CHECK_EVERY
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let Some(wanted) = self.wanted() else {
            return ControlFlow::Continue(());
        };
        // Trust what the cluster trusts.
        let cross = wanted.cross_fingerprint.as_deref();
        if fingerprints(&wanted.bundle, None)
            != fingerprints(&self.identity.credentials.ca_pem, None)
        {
            match self.trust(&wanted.bundle).await {
                Ok(()) => tracing::info!(
                    cas = ?fingerprints(&wanted.bundle, cross)
                        .iter()
                        .map(|f| shoal_consensus::ca::short(f).to_string())
                        .collect::<Vec<_>>(),
                    "this node now trusts the cluster CAs the ledger lists"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "could not install the cluster's CAs");
                    return ControlFlow::Continue(());
                }
            }
        }
        // Renew when due.
        let creds = &self.identity.credentials;
        let Some(validity) = shoal_mesh::tls::cert_validity(&creds.cert_pem) else {
            tracing::warn!("this node's certificate cannot be read; not renewing it");
            return ControlFlow::Break(());
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let cert_ca = self.signer.signer(&creds.cert_pem, &creds.ca_pem, cross);
        let reason = renewal_reason(
            validity,
            now,
            cert_ca.as_deref(),
            &wanted.signing_fingerprint,
        );
        if let Some(reason) = reason.filter(|_| self.renew_retry.ready()) {
            match self.renew().await {
                Ok(()) => {
                    self.renew_retry.succeeded();
                    tracing::info!(
                        expired_at = validity.1,
                        why = reason,
                        "renewed this node's certificate"
                    );
                }
                Err(e) => {
                    self.renew_retry.failed();
                    tracing::warn!(error = %e, why = reason, "could not renew this node's certificate yet");
                }
            }
        }
        // Tell the ledger, when it does not know.
        let creds = &self.identity.credentials;
        let trusted = fingerprints(&creds.ca_pem, cross);
        let cert_ca = self
            .signer
            .signer(&creds.cert_pem, &creds.ca_pem, cross)
            .unwrap_or_default();
        let current = (trusted, cert_ca);
        if wanted.reported.as_ref() != Some(&current) && self.report_retry.ready() {
            self.report(current.0, current.1).await;
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
    fn a_certificate_of_a_ca_that_no_longer_signs_is_renewed_at_once() {
        assert_eq!(renewal_reason((0, 300), 10, Some("new"), "new"), None);
        assert!(renewal_reason((0, 300), 10, Some("old"), "new").is_some());
        assert!(renewal_reason((0, 300), 10, None, "new").is_some());
        assert!(renewal_reason((0, 300), 250, Some("new"), "new").is_some());
    }

    #[test]
    fn retries_back_off_and_reset() {
        let mut r = Retry::default();
        assert!(r.ready());
        r.failed();
        assert!(!r.ready());
        assert_eq!(r.wait, RETRY_MIN);
        r.failed();
        assert_eq!(r.wait, RETRY_MIN * 2);
        for _ in 0..10 {
            r.failed();
        }
        assert_eq!(r.wait, RETRY_MAX);
        r.succeeded();
        assert!(r.ready());
    }

    #[test]
    fn fingerprints_of_a_bundle_leave_the_cross_certificate_out() {
        let old = shoal_mesh::CaBundle::generate("c").expect("ca");
        let new = shoal_mesh::CaBundle::generate_next("c", 1).expect("ca");
        let cross = old.cross_sign(&new).expect("cross");
        let bundle = format!("{}{}{}", new.cert_pem, old.cert_pem, cross);
        let cross_fp = fingerprint_pem(&cross).expect("fp");
        let mut expected = vec![
            old.fingerprint().expect("fp"),
            new.fingerprint().expect("fp"),
        ];
        expected.sort();
        assert_eq!(fingerprints(&bundle, Some(&cross_fp)), expected);
        assert_eq!(fingerprints(&bundle, None).len(), 3);
        let leaf = new.issue("n1", 1).expect("issue").cert_pem;
        let cross_first = format!("{}{}{}", cross, old.cert_pem, new.cert_pem);
        assert_eq!(
            signer(&leaf, &cross_first, Some(&cross_fp)),
            Some(new.fingerprint().expect("fp"))
        );
    }
}
