//! On restart the node may come back with another release, other labels or
//! protocols; the ledger must describe it as it is now. Its GPUs, its
//! addresses and its failure domain are what it was admitted with: the
//! ledger refuses a node's own change of those (`node_access`), and a node
//! that has other ones must be removed and join again.

use crate::ledger_client::LedgerClient;
use crate::node::LocalMember;
use crate::worker::Worker;
use shoal_consensus::{Command, MemberSpec};
use std::ops::ControlFlow;
use std::time::Duration;

/// Updates this node's member record once, when it differs from the node.
pub struct MemberRecord {
    pub local: LocalMember,
    pub ledger: LedgerClient,
}

/// The record without what the ledger itself changes (GPU allocations).
fn as_published(spec: &MemberSpec) -> MemberSpec {
    let mut spec = spec.clone();
    for g in &mut spec.gpus {
        g.allocated_to = None;
        g.health = String::new();
        g.health_reason = None;
    }
    spec
}

impl Worker for MemberRecord {
    fn period(&self) -> Duration {
        Duration::from_millis(500)
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let recorded = match self.ledger.read() {
            Ok(d) => d.ledger.members.get(&self.local.id).map(|m| m.spec.clone()),
            Err(_) => return ControlFlow::Break(()),
        };
        let Some(recorded) = recorded else {
            return ControlFlow::Continue(());
        };
        if as_published(&recorded) == as_published(&self.local.spec) {
            return ControlFlow::Break(());
        }
        let cmd = Command::UpdateMember {
            id: self.local.id,
            spec: self.local.spec.clone(),
        };
        match self.ledger.write(cmd).await {
            Ok((shoal_consensus::LedgerResponse::Denied(reason), _)) => {
                // Its GPUs or addresses are what it was admitted with; the
                // ledger keeps those until an operator re-admits it. The
                // rest (its release and protocols above all) still goes in.
                tracing::error!(
                    node = self.local.id,
                    %reason,
                    "this node's GPUs or addresses differ from those it was admitted with, which the ledger keeps: remove it (`shoal node remove`) and join it again"
                );
                match shoal_consensus::node_access::keep_admitted(&recorded, &self.local.spec) {
                    Some(spec) => {
                        self.local.spec = spec;
                        ControlFlow::Continue(())
                    }
                    None => ControlFlow::Break(()),
                }
            }
            Ok(_) => {
                tracing::info!(
                    node = self.local.id,
                    "updated this node's record in the ledger"
                );
                ControlFlow::Break(())
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not update this node's record yet");
                ControlFlow::Continue(())
            }
        }
    }
}
