//! Keeps the CA keys where they belong: every voter holds the key of every
//! CA the cluster trusts (so whichever voter leads can admit joiners, renew
//! certificates and carry a CA rotation through), no learner does, and
//! nobody keeps a retired CA's key. A voter without a key fetches it from
//! another voter over mTLS, naming the CA by fingerprint, and checks it
//! against the ledger's certificate; a node that is no longer a voter
//! deletes its keys once another voter is known to hold them all, so a key
//! is never lost with its last copy.

use crate::ledger_client::LedgerClient;
use crate::proto::{Request, Response};
use crate::trust::ca_key;
use crate::worker::Worker;
use shoal_consensus::NodeId;
use shoal_mesh::CaBundle;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub struct CaCustody {
    ledger: LedgerClient,
    data_dir: PathBuf,
    /// The voter set of the last full check, and when it ran: a wakeup
    /// that changed no voter is skipped.
    checked: Option<(Instant, std::collections::BTreeSet<NodeId>)>,
}

/// A full check at least this often, whatever changed.
const RECHECK: Duration = Duration::from_secs(1);

/// What a node should do about the CA keys.
#[derive(Debug, PartialEq, Eq)]
pub enum Duty {
    Nothing,
    Fetch,
    Shed,
}

/// Pure: a voter must hold the key of every trusted CA, anyone else none.
/// A node that stopped voting during a rotation keeps its keys until the
/// rotation is over: another voter's answer that it holds "every" key is
/// judged by that voter's ledger, which may not have the rotation yet.
pub fn duty(voter: bool, missing_any: bool, holds_any: bool, rotating: bool) -> Duty {
    match (voter, missing_any, holds_any) {
        (true, true, _) => Duty::Fetch,
        (false, _, true) if !rotating => Duty::Shed,
        _ => Duty::Nothing,
    }
}

/// What the ledger says about CA keys.
struct Wanted {
    /// Certificates of the CAs the cluster trusts.
    trusted: Vec<String>,
    /// Certificates of retired CAs (not trusted any more).
    retired: Vec<String>,
    rotating: bool,
}

fn matches(cert_pem: &str, key_pem: &str) -> bool {
    CaBundle {
        cert_pem: cert_pem.to_string(),
        key_pem: key_pem.to_string(),
    }
    .key_matches()
}

impl CaCustody {
    pub fn new(ledger: LedgerClient, data_dir: PathBuf) -> Self {
        CaCustody {
            ledger,
            data_dir,
            checked: None,
        }
    }

    fn wanted(&self) -> Option<Wanted> {
        let d = self.ledger.read().ok()?;
        let trusted = d.ledger.trusted_ca_pems();
        if trusted.is_empty() {
            return None;
        }
        let retired = d
            .ledger
            .ca
            .retired
            .iter()
            .filter(|c| !trusted.contains(c))
            .cloned()
            .collect();
        Some(Wanted {
            trusted,
            retired,
            rotating: d.ledger.ca.rotation.is_some(),
        })
    }

    fn other_voters(&self) -> Vec<NodeId> {
        let me = self.ledger.me();
        self.ledger
            .voters()
            .into_iter()
            .filter(|v| *v != me)
            .collect()
    }

    /// Voters first, then everyone else: a node demoted before it could
    /// shed its copy may be the last holder after a quick voter change.
    fn holders_to_ask(&self) -> Vec<NodeId> {
        let me = self.ledger.me();
        let mut ids = self.other_voters();
        let learners: Vec<NodeId> = self
            .ledger
            .raft_metrics()
            .borrow()
            .membership_config
            .membership()
            .learner_ids()
            .filter(|id| *id != me)
            .collect();
        ids.extend(learners);
        ids
    }

    /// Fetches the key of the CA whose certificate is `cert_pem`.
    async fn fetch(&self, cert_pem: &str) {
        let Some(fingerprint) = shoal_mesh::tls::fingerprint_pem(cert_pem) else {
            return;
        };
        let short = shoal_consensus::ca::short(&fingerprint).to_string();
        let req = Request::FetchCaKey {
            fingerprint: fingerprint.clone(),
        };
        for holder in self.holders_to_ask() {
            let Ok(Response::CaKey(Some(key))) = self.ledger.call_member(holder, &req).await else {
                continue;
            };
            if !matches(cert_pem, &key.0) {
                tracing::warn!(
                    from = holder,
                    ca = %short,
                    "a voter handed over a key that is not the CA's"
                );
                continue;
            }
            match ca_key::add(&self.data_dir, &key.0) {
                Ok(()) => {
                    tracing::info!(from = holder, ca = %short, "this voter now holds the key of the CA");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "cannot store a CA key"),
            }
        }
    }

    async fn shed(&self) {
        for voter in self.other_voters() {
            if let Ok(Response::Holds(true)) =
                self.ledger.call_member(voter, &Request::HoldsCaKey).await
            {
                match ca_key::remove(&self.data_dir) {
                    Ok(()) => tracing::info!(
                        holder = voter,
                        "no longer a voter: deleted this node's copy of the CA key"
                    ),
                    Err(e) => tracing::warn!(error = %e, "cannot delete the CA key"),
                }
                return;
            }
        }
    }

    /// Deletes the keys of retired CAs, on every node.
    fn drop_retired(&self, retired: &[String]) {
        if retired.is_empty() {
            return;
        }
        match ca_key::retain(&self.data_dir, |k| !retired.iter().any(|c| matches(c, k))) {
            Ok(0) => {}
            Ok(n) => tracing::info!(keys = n, "deleted the key of a retired cluster CA"),
            Err(e) => tracing::warn!(error = %e, "cannot delete the key of a retired CA"),
        }
    }
}

impl Worker for CaCustody {
    fn period(&self) -> Duration {
        RECHECK
    }

    /// A new voter fetches the keys as soon as it applies its promotion,
    /// not up to a period later: until it holds them, the voters that do
    /// are the only ones that can admit a node, and losing them then (the
    /// bootstrap node wiped just after two joins: chaos seed 16) leaves a
    /// cluster that can never admit anyone again.
    fn wakeup(&self) -> crate::worker::Wakeup {
        crate::worker::Wakeup::on_apply(self.ledger.applied_watch())
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        // Most wakeups are entries that change no voter: skipped before
        // the ledger's CA certificates are even read (a new CA is seen by
        // the periodic check).
        let now = Instant::now();
        let voters = self.ledger.voters();
        if let Some((at, last)) = &self.checked {
            if *last == voters && now.duration_since(*at) < RECHECK {
                return ControlFlow::Continue(());
            }
        }
        self.checked = Some((now, voters));
        let Some(wanted) = self.wanted() else {
            return ControlFlow::Continue(());
        };
        self.drop_retired(&wanted.retired);
        let voter = self.ledger.voters().contains(&self.ledger.me());
        let missing: Vec<&String> = wanted
            .trusted
            .iter()
            .filter(|c| ca_key::key_for(&self.data_dir, c).is_none())
            .collect();
        let holds_any = !ca_key::keys(&self.data_dir).is_empty();
        match duty(voter, !missing.is_empty(), holds_any, wanted.rotating) {
            Duty::Fetch => {
                for cert in missing {
                    self.fetch(cert).await;
                }
            }
            Duty::Shed => self.shed().await,
            Duty::Nothing => {}
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voters_hold_every_key_and_nobody_else() {
        assert_eq!(duty(true, true, false, false), Duty::Fetch);
        assert_eq!(
            duty(true, true, true, true),
            Duty::Fetch,
            "a rotation's new key"
        );
        assert_eq!(duty(true, false, true, false), Duty::Nothing);
        assert_eq!(duty(false, false, true, false), Duty::Shed);
        assert_eq!(duty(false, true, false, false), Duty::Nothing);
        assert_eq!(
            duty(false, false, true, true),
            Duty::Nothing,
            "a former voter keeps its keys until the rotation is over"
        );
    }
}
