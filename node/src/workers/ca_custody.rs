//! Keeps the CA key where it belongs: every voter holds it (so whichever
//! voter leads can admit joiners and renew certificates), no learner does.
//! A voter without it fetches it from another voter over mTLS and checks it
//! against the ledger's CA certificate; a node that is no longer a voter
//! deletes it once another voter is known to hold it, so the key is never
//! lost with the last copy.

use super::Worker;
use crate::node::{ca_key, LedgerClient};
use crate::rpc::proto::{Request, Response};
use shoal_consensus::NodeId;
use shoal_mesh::CaBundle;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Duration;

pub struct CaCustody {
    pub ledger: LedgerClient,
    pub data_dir: PathBuf,
}

/// What a node should do about the CA key.
#[derive(Debug, PartialEq, Eq)]
pub enum Duty {
    Nothing,
    Fetch,
    Shed,
}

/// Pure: a voter must hold the key, anyone else must not.
pub fn duty(voter: bool, holds: bool) -> Duty {
    match (voter, holds) {
        (true, false) => Duty::Fetch,
        (false, true) => Duty::Shed,
        _ => Duty::Nothing,
    }
}

impl CaCustody {
    fn ca_cert(&self) -> Option<String> {
        let d = self.ledger.read().ok()?;
        d.ledger.cluster.as_ref().map(|c| c.ca_cert_pem.clone())
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

    async fn fetch(&self) {
        let Some(cert_pem) = self.ca_cert() else {
            return;
        };
        for voter in self.holders_to_ask() {
            let Ok(Response::CaKey(Some(key))) =
                self.ledger.call_member(voter, &Request::FetchCaKey).await
            else {
                continue;
            };
            let ca = CaBundle {
                cert_pem: cert_pem.clone(),
                key_pem: key.0,
            };
            if !ca.key_matches() {
                tracing::warn!(
                    from = voter,
                    "a voter handed over a key that is not the cluster CA's"
                );
                continue;
            }
            match ca_key::store(&self.data_dir, &ca.key_pem) {
                Ok(()) => {
                    tracing::info!(from = voter, "this voter now holds the CA key");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "cannot store the CA key"),
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
}

impl Worker for CaCustody {
    fn period(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let voter = self.ledger.voters().contains(&self.ledger.me());
        let holds = ca_key::load(&self.data_dir).is_some();
        match duty(voter, holds) {
            Duty::Fetch => self.fetch().await,
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
    fn voters_hold_the_key_and_nobody_else() {
        assert_eq!(duty(true, false), Duty::Fetch);
        assert_eq!(duty(true, true), Duty::Nothing);
        assert_eq!(duty(false, true), Duty::Shed);
        assert_eq!(duty(false, false), Duty::Nothing);
    }
}
