//! Drives a CA rotation on the leader, from the ledger's record alone: a
//! new leader carries on where the last one stopped. Each tick it asks
//! whether every member that has not left is ready for the next phase
//! (`shoal_consensus::ca::waiting_for`) and, when they are, proposes it;
//! `apply` checks the same rule again at commit.

use crate::ledger_client::LedgerClient;
use crate::trust::ca_key;
use crate::worker::Worker;
use shoal_consensus::ca::{short, CaPhase};
use shoal_consensus::{Command, LedgerResponse};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Duration;

pub struct CaRotationDriver {
    pub ledger: LedgerClient,
    pub data_dir: PathBuf,
    /// What the last tick waited for, so the log says it once.
    last_wait: Option<String>,
}

impl CaRotationDriver {
    pub fn new(ledger: LedgerClient, data_dir: PathBuf) -> Self {
        CaRotationDriver {
            ledger,
            data_dir,
            last_wait: None,
        }
    }

    /// The phase to leave now, or what the rotation waits for.
    fn next(&self) -> Option<Result<CaPhase, String>> {
        let d = self.ledger.read().ok()?;
        let r = d.ledger.ca.rotation.as_ref()?;
        let waiting =
            shoal_consensus::ca::waiting_for(&d.ledger.ca, &d.ledger.members).unwrap_or_default();
        if let Some((_, why)) = waiting.first() {
            return Some(Err(why.clone()));
        }
        // This leader signs with the new CA from the switch on.
        if r.phase == CaPhase::Trusting
            && ca_key::key_for(&self.data_dir, &r.new_cert_pem).is_none()
        {
            return Some(Err(format!(
                "the leader does not hold the key of the new CA {} yet",
                short(&r.new_fingerprint)
            )));
        }
        Some(Ok(r.phase))
    }
}

impl CaRotationDriver {
    /// Before the new CA signs, a majority of the voters (this leader among
    /// them) must hold its key: a leader lost for good right after the
    /// switch must not take the only copy of the signing key with it. By
    /// now every voter has reported that it trusts both CAs, so each one's
    /// ledger has the rotation and its "holds every trusted key" answer
    /// covers the new one.
    async fn new_key_held_by_a_majority(&self) -> Result<(), String> {
        use crate::proto::{Request, Response};
        let voters = self.ledger.voters();
        let me = self.ledger.me();
        let mut holders = usize::from(voters.contains(&me));
        for voter in voters.iter().filter(|v| **v != me) {
            if let Ok(Response::Holds(true)) =
                self.ledger.call_member(*voter, &Request::HoldsCaKey).await
            {
                holders += 1;
            }
        }
        if holders * 2 > voters.len() {
            Ok(())
        } else {
            Err(format!(
                "{holders} of {} voters hold the new CA's key; waiting for a majority",
                voters.len()
            ))
        }
    }
}

impl Worker for CaRotationDriver {
    fn period(&self) -> Duration {
        if self.ledger.is_leader() {
            Duration::from_millis(500)
        } else {
            crate::worker::OFF_LEADER_PERIOD
        }
    }

    fn wakeup(&self) -> crate::worker::Wakeup {
        crate::worker::Wakeup::on_leadership(self.ledger.raft())
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        if !self.ledger.is_leader() {
            self.last_wait = None;
            return ControlFlow::Continue(());
        }
        let from = match self.next() {
            None => {
                self.last_wait = None;
                return ControlFlow::Continue(());
            }
            Some(Err(why)) => {
                if self.last_wait.as_ref() != Some(&why) {
                    tracing::info!("the CA rotation waits: {why}");
                    self.last_wait = Some(why);
                }
                return ControlFlow::Continue(());
            }
            Some(Ok(from)) => from,
        };
        if from == CaPhase::Trusting {
            if let Err(why) = self.new_key_held_by_a_majority().await {
                if self.last_wait.as_ref() != Some(&why) {
                    tracing::info!("the CA rotation waits: {why}");
                    self.last_wait = Some(why);
                }
                return ControlFlow::Continue(());
            }
        }
        match self
            .ledger
            .write_local(Command::AdvanceCaRotation { from })
            .await
        {
            Ok((LedgerResponse::Ok, index)) => {
                let done = match from {
                    CaPhase::Trusting => "the new CA signs from now on; every node renews",
                    CaPhase::Reissuing => "the old CA is retired",
                };
                tracing::info!(index, "CA rotation: {done}");
            }
            Ok((other, _)) => tracing::debug!(answer = ?other, "the CA rotation did not advance"),
            Err(e) => tracing::debug!(error = %e, "could not advance the CA rotation yet"),
        }
        ControlFlow::Continue(())
    }
}
