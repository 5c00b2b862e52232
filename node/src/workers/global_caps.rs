//! The leader's loop for tenants capped across regions
//! (docs/federation.md, "Tenants across regions"): it adopts the tenants
//! whose home is a peer region from that region's summary, and runs each
//! tenant's share round on the peers' latest reports, so a region with
//! waiting work gets share from the regions that leave theirs idle.
//!
//! Only reachable peers' summaries adopt or lift a tenant (an old summary
//! must not undo a newer definition); every peer's latest summary, however
//! old, takes part in the rounds, which a stale report can only delay.

use crate::clock::wall_ms;
use crate::node::Node;
use crate::worker::Worker;
use shoal_consensus::{Command, LedgerResponse};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

pub struct GlobalCaps {
    pub node: Arc<Node>,
    /// The (tenant, home) pairs this node has said it leaves to an admin
    /// (a local tenant of the shared name), so it says so once.
    pub told: std::collections::BTreeSet<(String, String)>,
}

impl GlobalCaps {
    pub fn new(node: Arc<Node>) -> GlobalCaps {
        GlobalCaps {
            node,
            told: Default::default(),
        }
    }
}

impl Worker for GlobalCaps {
    fn period(&self) -> Duration {
        Duration::from_millis(self.node.config().federation.summary_interval_ms)
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        if !self.node.ledger().is_leader() {
            return ControlFlow::Continue(());
        }
        let summaries = self.node.federation().tracker().summaries(wall_ms());
        let commands: Vec<Command> = match self.node.ledger().read() {
            Ok(d) => {
                let ledger = &d.ledger;
                let spoken = ledger.effective_protocol().is_some_and(|p| {
                    p >= shoal_consensus::federation::global_tenants::SINCE_PROTOCOL
                });
                if !spoken {
                    return ControlFlow::Continue(());
                }
                let mut out = Vec::new();
                for (summary, _, _) in summaries.iter().filter(|(_, reachable, _)| *reachable) {
                    out.extend(
                        summary
                            .global_tenants
                            .iter()
                            .filter_map(|r| ledger.plan_adoption(&summary.region, r)),
                    );
                    out.extend(ledger.plan_lifted(&summary.region, &summary.global_tenants));
                    // A tenant of this region's own with the shared name:
                    // a name is no identity across regions, so only an
                    // admin here may make it the shared one.
                    for r in &summary.global_tenants {
                        let namesake = r.home == summary.region
                            && ledger.local_namesake(&r.tenant, &summary.region);
                        if namesake && self.told.insert((r.tenant.clone(), r.home.clone())) {
                            tracing::warn!(
                                tenant = %r.tenant,
                                home = %r.home,
                                "region {} shares a tenant named like one of this region's own; it stays this region's own tenant unless an admin runs `shoal tenant adopt {} --from {}`",
                                r.home, r.tenant, r.home
                            );
                        }
                    }
                    // Two homes for one tenant: each caps it on its own, so
                    // together they may hold twice the cap. An operator's
                    // mistake this loop cannot settle; it says so.
                    for r in &summary.global_tenants {
                        let ours = ledger.global_caps.get(&r.tenant);
                        if let Some(ours) = ours.filter(|c| c.home != r.home) {
                            tracing::warn!(
                                tenant = %r.tenant,
                                here = %ours.home,
                                there = %r.home,
                                "a tenant has caps across regions set in two home regions; lift them in one (`shoal tenant set NAME --global-gpus none --global-gpu-hours none`)"
                            );
                        }
                    }
                }
                let reports: Vec<(String, &shoal_sdk::GlobalTenantReport)> = summaries
                    .iter()
                    .flat_map(|(s, _, _)| s.global_tenants.iter().map(|r| (s.region.clone(), r)))
                    .collect();
                for tenant in ledger.global_caps.keys() {
                    let theirs: Vec<(String, &shoal_sdk::GlobalTenantReport)> = reports
                        .iter()
                        .filter(|(_, r)| &r.tenant == tenant)
                        .cloned()
                        .collect();
                    out.extend(ledger.plan_share_round(tenant, &theirs));
                }
                out
            }
            Err(_) => return ControlFlow::Continue(()),
        };
        for cmd in commands {
            let what = match &cmd {
                Command::AdoptGlobalTenant { tenant, .. } => format!("adopting tenant '{tenant}'"),
                Command::ShareRound { tenant, .. } => format!("the share round of '{tenant}'"),
                _ => "a global cap".to_string(),
            };
            match self.node.ledger().write(cmd).await {
                Ok((LedgerResponse::Rejected(why), _)) => {
                    tracing::info!(%why, "{what} refused");
                }
                Ok(_) => tracing::debug!("{what} recorded"),
                Err(e) => {
                    tracing::debug!(error = %e.message, "{what} not recorded");
                    break;
                }
            }
        }
        ControlFlow::Continue(())
    }
}
