//! Transitions of tenants capped across regions: adoption, cap changes
//! and share rounds ([`crate::federation::global_tenants`] holds the
//! records and their rules).

use super::{Command, Ledger};
use crate::escrow::shares::RegionUse;
use crate::escrow::{Account, GlobalCap, PeerShare, RegionalShare, RegionalShares};
use crate::federation::global_tenants::*;
use crate::workload::{TenantLimits, TenantUpdate};
use shoal_sdk::{GlobalAccountReport, GlobalTenantDefinition, GlobalTenantReport};

impl Ledger {
    /// This region's name ("" before bootstrap).
    pub fn region_name(&self) -> &str {
        self.cluster
            .as_ref()
            .map(|c| c.region.as_str())
            .unwrap_or("")
    }

    /// The id regions know `tenant` by, when this region holds it as a
    /// tenant shared across regions (with caps set at its home, here or
    /// adopted from a peer); `None` for a tenant local to this region.
    pub fn global_tenant_id(&self, tenant: &str) -> Option<GlobalTenantId> {
        if !self.workload.tenants.contains_key(tenant) {
            return None;
        }
        self.global_caps.get(tenant).map(|cap| GlobalTenantId {
            home: cap.home.clone(),
            name: tenant.to_string(),
        })
    }

    /// Whether peer region `peer` may act here for the tenant it names
    /// `tenant` (a request it forwarded): this region holds `tenant` as a
    /// global tenant and the peer holds the same one, as `peer_reports`,
    /// the global tenants of the peer's own latest summary (`None` before
    /// one arrived), show: the same name under the same home. Returns the
    /// tenant's id, else why not, in one line.
    pub fn tenant_shared_with(
        &self,
        peer: &str,
        tenant: &str,
        peer_reports: Option<&[GlobalTenantReport]>,
    ) -> Result<GlobalTenantId, String> {
        if !self.federation.peers.contains_key(peer) {
            return Err(format!("'{peer}' is not a peer region of this one"));
        }
        let me = self.region_name();
        let Some(id) = self.global_tenant_id(tenant) else {
            return Err(format!(
                "tenant '{tenant}' of region {me} is not shared across regions (it has no caps \
                 across regions), so no tenant of region {peer} acts as it"
            ));
        };
        let Some(reports) = peer_reports else {
            return Err(format!(
                "region {me} has no summary of region {peer} yet, so it cannot tell whether \
                 {peer} holds tenant {id}: try again in a moment"
            ));
        };
        match reports.iter().find(|r| r.tenant == tenant) {
            Some(r) if r.home == id.home => Ok(id),
            Some(r) => Err(format!(
                "tenant '{tenant}' of region {peer} is {tenant}@{}, not {id} as in region {me}: \
                 another tenant of the same name",
                r.home
            )),
            None => Err(format!(
                "region {peer} does not hold tenant {id} (its '{tenant}', if any, is local to it)"
            )),
        }
    }

    /// What each tenant capped across regions may hold here.
    pub fn regional_shares(&self) -> RegionalShares {
        let me = self.region_name();
        self.global_caps
            .iter()
            .map(|(tenant, cap)| {
                let home = cap.home == me;
                let share = RegionalShare {
                    gpus: cap.gpus.as_ref().map(|a| {
                        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
                        (clamp(a.share(home)), clamp(a.cap))
                    }),
                    gpu_seconds: cap.gpu_seconds.as_ref().map(|a| (a.share(home), a.cap)),
                };
                (tenant.clone(), share)
            })
            .collect()
    }

    /// `SetGlobalCaps`: each `Some` sets (or with `Some(None)` lifts) one cap.
    pub(crate) fn set_global_caps(
        &mut self,
        tenant: &str,
        gpus: Option<Option<u32>>,
        gpu_seconds: Option<Option<u64>>,
    ) -> Result<(), String> {
        if !self.workload.tenants.contains_key(tenant) {
            return Err(format!("no tenant named '{tenant}'"));
        }
        let me = self.region_name().to_string();
        if let Some(cap) = self.global_caps.get(tenant) {
            if cap.home != me {
                return Err(format!(
                    "tenant '{tenant}' is defined in region '{}', which keeps its global caps: set them there",
                    cap.home
                ));
            }
        }
        if !self.global_caps.contains_key(tenant) && self.global_caps.len() >= MAX_GLOBAL_TENANTS {
            return Err(format!(
                "at most {MAX_GLOBAL_TENANTS} tenants may have caps across regions"
            ));
        }
        let cap = self
            .global_caps
            .entry(tenant.to_string())
            .or_insert_with(|| GlobalCap {
                home: me,
                ..Default::default()
            });
        if let Some(gpus) = gpus {
            set_cap(&mut cap.gpus, gpus.map(u64::from));
        }
        if let Some(seconds) = gpu_seconds {
            set_cap(&mut cap.gpu_seconds, seconds);
        }
        if cap.gpus.is_none() && cap.gpu_seconds.is_none() {
            self.global_caps.remove(tenant);
        }
        Ok(())
    }

    /// Whether `tenant` is a tenant of this region's own that region
    /// `home`'s tenant of the same name may not take over without an
    /// admin's consent (`Command::AdoptLocalTenant`): a name is no identity
    /// across regions.
    pub fn local_namesake(&self, tenant: &str, home: &str) -> bool {
        self.workload.tenants.contains_key(tenant)
            && self.global_caps.get(tenant).is_none_or(|c| c.home != home)
    }

    /// `consented`: an admin of this region asked for it
    /// (`Command::AdoptLocalTenant`), so a local tenant of the name may
    /// become the shared one; the leader's own adoptions may not.
    pub(crate) fn adopt_global_tenant(
        &mut self,
        tenant: &str,
        home: &str,
        (gpus, gpu_seconds): (Option<u32>, Option<u64>),
        limits: &TenantLimits,
        consented: bool,
        now_ms: u64,
    ) -> Result<(), String> {
        if !self.federation.peers.contains_key(home) {
            return Err(format!("no peer region named '{home}'"));
        }
        if consented && gpus.is_none() && gpu_seconds.is_none() {
            return Err(format!(
                "region {home} caps no tenant '{tenant}' across regions, so there is nothing to adopt"
            ));
        }
        let refuses_namesakes = self
            .effective_protocol()
            .is_some_and(|p| p >= CONSENT_SINCE_PROTOCOL);
        if !consented && refuses_namesakes && self.local_namesake(tenant, home) {
            return Err(format!(
                "tenant '{tenant}' of this region is its own, not {tenant}@{home}: an admin here \
                 makes it the shared one with `shoal tenant adopt {tenant} --from {home}`"
            ));
        }
        if let Some(cap) = self.global_caps.get(tenant) {
            if cap.home != home {
                return Err(format!(
                    "tenant '{tenant}' has its caps from region '{}', not '{home}'",
                    cap.home
                ));
            }
        }
        if gpus.is_none() && gpu_seconds.is_none() {
            self.global_caps.remove(tenant);
            return Ok(());
        }
        if !self.global_caps.contains_key(tenant) && self.global_caps.len() >= MAX_GLOBAL_TENANTS {
            return Err(format!(
                "at most {MAX_GLOBAL_TENANTS} tenants may have caps across regions"
            ));
        }
        if self.workload.tenants.contains_key(tenant) {
            self.workload.update_tenant(tenant, &replacing(limits))?;
        } else {
            self.workload.create_tenant(tenant, limits, now_ms)?;
        }
        let cap = self
            .global_caps
            .entry(tenant.to_string())
            .or_insert_with(|| GlobalCap {
                home: home.to_string(),
                ..Default::default()
            });
        set_cap(&mut cap.gpus, gpus.map(u64::from));
        set_cap(&mut cap.gpu_seconds, gpu_seconds);
        Ok(())
    }

    pub(crate) fn share_round(
        &mut self,
        tenant: &str,
        gpus: Option<&RoundTotals>,
        gpu_seconds: Option<&RoundTotals>,
    ) -> Result<(), String> {
        let me = self.region_name().to_string();
        let Some(cap) = self.global_caps.get(tenant) else {
            return Err(format!("tenant '{tenant}' has no caps across regions"));
        };
        let home = cap.home == me;
        if let Some(region) = [gpus, gpu_seconds]
            .into_iter()
            .flatten()
            .flat_map(|t| t.received.keys().chain(t.given.keys()))
            .find(|r| !self.federation.peers.contains_key(*r))
        {
            return Err(format!("no peer region named '{region}'"));
        }
        let mut next = cap.clone();
        let used = self.global_use(tenant);
        for (kind, totals, slot) in [
            (Kind::Gpus, gpus, &mut next.gpus),
            (Kind::GpuSeconds, gpu_seconds, &mut next.gpu_seconds),
        ] {
            let (Some(totals), Some(account)) = (totals, slot.as_mut()) else {
                continue;
            };
            let before = account.given.clone();
            account.merge(&totals.received, &totals.given);
            // Grants only from what the tenant does not hold here: the
            // round was planned on this replica's state, which may have
            // moved on since.
            let held = match kind {
                Kind::Gpus => used.0.in_use,
                Kind::GpuSeconds => used.1.in_use,
            };
            if account.given != before && account.signed_share(home) < i128::from(held) {
                return Err(format!(
                    "tenant '{tenant}' holds {held} {} here; the round would leave a share of {}",
                    unit(kind),
                    account.signed_share(home)
                ));
            }
        }
        self.global_caps.insert(tenant.to_string(), next);
        Ok(())
    }

    /// What `tenant` (with the tenants below it) uses here and what its
    /// waiting jobs here ask for: in GPUs held, and in GPU-seconds
    /// committed (finished use plus running jobs' time limits).
    pub fn global_use(&self, tenant: &str) -> (RegionUse, RegionUse) {
        let subtree = self.workload.subtree(tenant);
        let waiting: Vec<&crate::workload::Job> = self
            .workload
            .jobs
            .values()
            .filter(|j| j.state.is_waiting() && !j.held)
            .filter(|j| subtree.contains(&j.spec.tenant.as_str()))
            .collect();
        let region = self.region_name().to_string();
        let gpus = RegionUse {
            region: region.clone(),
            in_use: u64::from(self.subtree_gpus_in_use(tenant)),
            demand: waiting.iter().map(|j| u64::from(j.spec.total_gpus())).sum(),
        };
        let seconds = RegionUse {
            region,
            in_use: subtree
                .iter()
                .map(|t| self.workload.committed_gpu_seconds(t))
                .fold(0, u64::saturating_add),
            demand: waiting
                .iter()
                .map(|j| j.spec.gpu_seconds_needed())
                .fold(0, u64::saturating_add),
        };
        (gpus, seconds)
    }

    /// The next round for `tenant` from the peers' latest reports, or
    /// `None` when it changes nothing (or the tenant has no caps across
    /// regions). Only the peers this region federates with take part.
    pub fn plan_share_round(
        &self,
        tenant: &str,
        reports: &[(String, &GlobalTenantReport)],
    ) -> Option<Command> {
        let cap = self.global_caps.get(tenant)?;
        let me = self.region_name();
        let (gpu_use, seconds_use) = self.global_use(tenant);
        let round = |kind: Kind, mine: &RegionUse| -> Option<RoundTotals> {
            let account = account(cap, kind)?;
            let peers: Vec<PeerShare> = reports
                .iter()
                .filter(|(region, r)| {
                    self.federation.peers.contains_key(region) && r.tenant == tenant && region != me
                })
                .filter_map(|(region, r)| {
                    let a = report_of(r, kind)?;
                    Some(PeerShare {
                        region: region.clone(),
                        in_use: a.in_use,
                        demand: a.demand,
                        share: a.share,
                        given_to_us: a.given.get(me).copied().unwrap_or(0),
                        received_from_us: a.received.get(me).copied().unwrap_or(0),
                    })
                })
                .collect();
            let next = account.round(me, cap.home == me, mine, &peers);
            (next != *account).then_some(RoundTotals {
                received: next.received,
                given: next.given,
            })
        };
        let gpus = round(Kind::Gpus, &gpu_use);
        let gpu_seconds = round(Kind::GpuSeconds, &seconds_use);
        (gpus.is_some() || gpu_seconds.is_some()).then(|| Command::ShareRound {
            tenant: tenant.to_string(),
            gpus,
            gpu_seconds,
        })
    }

    /// This region's reports for its summary.
    pub fn global_reports(&self) -> Vec<GlobalTenantReport> {
        let me = self.region_name();
        self.global_caps
            .iter()
            .map(|(tenant, cap)| {
                let (gpu_use, seconds_use) = self.global_use(tenant);
                let home = cap.home == me;
                let report = |a: &Account, used: &RegionUse| GlobalAccountReport {
                    cap: a.cap,
                    share: a.share(home),
                    in_use: used.in_use,
                    demand: used.demand,
                    given: a.given.clone(),
                    received: a.received.clone(),
                };
                let definition = home
                    .then(|| self.workload.tenants.get(tenant))
                    .flatten()
                    .map(|t| definition_of(&t.limits));
                GlobalTenantReport {
                    tenant: tenant.clone(),
                    home: cap.home.clone(),
                    gpus: cap.gpus.as_ref().map(|a| report(a, &gpu_use)),
                    gpu_seconds: cap.gpu_seconds.as_ref().map(|a| report(a, &seconds_use)),
                    definition,
                }
            })
            .collect()
    }

    /// What adopting `report` (from `region`, the tenant's home) would
    /// change here, as a command; `None` when nothing would.
    /// A tenant of this region's own of the same name is left alone
    /// ([`Self::local_namesake`]).
    pub fn plan_adoption(&self, region: &str, report: &GlobalTenantReport) -> Option<Command> {
        if report.home != region
            || !self.federation.peers.contains_key(region)
            || self.local_namesake(&report.tenant, region)
        {
            return None;
        }
        let (gpus, gpu_seconds, limits) = adoption_terms(report)?;
        let same_caps = self.global_caps.get(&report.tenant).is_some_and(|c| {
            c.home == region
                && c.gpus.as_ref().map(|a| a.cap) == gpus.map(u64::from)
                && c.gpu_seconds.as_ref().map(|a| a.cap) == gpu_seconds
        });
        let same_limits = self
            .workload
            .tenants
            .get(&report.tenant)
            .is_some_and(|t| t.limits == limits);
        (!(same_caps && same_limits)).then(|| Command::AdoptGlobalTenant {
            tenant: report.tenant.clone(),
            home: region.to_string(),
            gpus,
            gpu_seconds,
            limits,
        })
    }

    /// The command by which an admin of this region makes its own tenant
    /// `report.tenant` the one `report`'s home shares across regions
    /// (`shoal tenant adopt NAME --from REGION`), or why it cannot.
    pub fn plan_consented_adoption(&self, report: &GlobalTenantReport) -> Result<Command, String> {
        let (tenant, home) = (&report.tenant, &report.home);
        if !self.federation.peers.contains_key(home) {
            return Err(format!("'{home}' is not a peer region of this one"));
        }
        if !self.local_namesake(tenant, home) {
            return Err(if self.workload.tenants.contains_key(tenant) {
                format!("tenant '{tenant}' is {tenant}@{home} here already")
            } else {
                format!(
                    "this region has no tenant '{tenant}': region {home}'s is adopted on its own, \
                     within a summary round"
                )
            });
        }
        let (gpus, gpu_seconds, limits) = adoption_terms(report).ok_or_else(|| {
            format!("region {home}'s summary does not define tenant '{tenant}' yet: try again in a moment")
        })?;
        Ok(Command::AdoptLocalTenant {
            tenant: tenant.clone(),
            home: home.clone(),
            gpus,
            gpu_seconds,
            limits,
        })
    }

    /// Tenants whose home is `region` that its summary no longer lists:
    /// the home lifted their caps.
    pub fn plan_lifted(&self, region: &str, reports: &[GlobalTenantReport]) -> Vec<Command> {
        if !self.federation.peers.contains_key(region) {
            return Vec::new();
        }
        self.global_caps
            .iter()
            .filter(|(tenant, cap)| {
                cap.home == region && !reports.iter().any(|r| &r.tenant == *tenant)
            })
            .map(|(tenant, _)| Command::AdoptGlobalTenant {
                tenant: tenant.clone(),
                home: region.to_string(),
                gpus: None,
                gpu_seconds: None,
                limits: self
                    .workload
                    .tenants
                    .get(tenant)
                    .map(|t| t.limits.clone())
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// A job that could never run under a cap across regions is refused at
    /// submit.
    pub(crate) fn fits_global_caps(&self, spec: &crate::workload::JobSpec) -> Result<(), String> {
        if !self.workload.tenants.contains_key(&spec.tenant) {
            return Ok(());
        }
        for name in self.workload.ancestry(&spec.tenant) {
            let Some(cap) = self.global_caps.get(name) else {
                continue;
            };
            if let Some(gpus) = &cap.gpus {
                if u64::from(spec.total_gpus()) > gpus.cap {
                    return Err(format!(
                        "quota: the job needs {} GPUs but {name} may use at most {} in all regions together",
                        spec.total_gpus(),
                        gpus.cap
                    ));
                }
            }
            if let Some(seconds) = &cap.gpu_seconds {
                if spec.gpu_seconds_needed() > seconds.cap {
                    return Err(format!(
                        "budget: the job may use {:.1} GPU-hours but {name} has a budget of {:.1} in all regions together",
                        spec.gpu_seconds_needed() as f64 / 3600.0,
                        seconds.cap as f64 / 3600.0
                    ));
                }
            }
        }
        Ok(())
    }

    /// GPUs held here by `tenant` and the tenants below it.
    pub fn subtree_gpus_in_use(&self, tenant: &str) -> u32 {
        let held = self.workload.gpus_in_use();
        self.workload
            .subtree(tenant)
            .iter()
            .map(|t| held.get(t).copied().unwrap_or(0))
            .sum()
    }

    /// A peer region left: its grants no longer count here.
    pub(crate) fn forget_region_grants(&mut self, region: &str) {
        for cap in self.global_caps.values_mut() {
            cap.forget(region);
        }
        // Tenants whose home left keep their definition, uncapped across
        // regions.
        self.global_caps.retain(|_, cap| cap.home != region);
    }
}

fn account(cap: &GlobalCap, kind: Kind) -> Option<&Account> {
    match kind {
        Kind::Gpus => cap.gpus.as_ref(),
        Kind::GpuSeconds => cap.gpu_seconds.as_ref(),
    }
}

fn report_of(r: &GlobalTenantReport, kind: Kind) -> Option<&GlobalAccountReport> {
    match kind {
        Kind::Gpus => r.gpus.as_ref(),
        Kind::GpuSeconds => r.gpu_seconds.as_ref(),
    }
}

fn unit(kind: Kind) -> &'static str {
    match kind {
        Kind::Gpus => "GPUs",
        Kind::GpuSeconds => "GPU-seconds",
    }
}

/// Sets an account's cap, keeping its grants; `None` removes it.
fn set_cap(slot: &mut Option<Account>, cap: Option<u64>) {
    match (slot.as_mut(), cap) {
        (_, None) => *slot = None,
        (Some(account), Some(cap)) => account.cap = cap,
        (None, Some(cap)) => *slot = Some(Account::new(cap)),
    }
}

/// An update that makes a tenant's limits exactly `limits`.
fn replacing(limits: &TenantLimits) -> TenantUpdate {
    TenantUpdate {
        parent: Some(limits.parent.clone()),
        max_gpus: Some(limits.max_gpus),
        gpu_seconds_limit: Some(limits.gpu_seconds_limit),
        weight: Some(limits.weight),
        max_pending_jobs: Some(limits.max_pending_jobs),
        max_objects: Some(limits.max_objects),
        max_manifest_bytes: Some(limits.max_manifest_bytes),
        max_priority: Some(limits.max_priority),
    }
}

fn definition_of(l: &TenantLimits) -> GlobalTenantDefinition {
    GlobalTenantDefinition {
        parent: l.parent.clone(),
        max_gpus: l.max_gpus,
        gpu_seconds_limit: l.gpu_seconds_limit,
        weight: l.weight,
        max_pending_jobs: l.max_pending_jobs,
        max_objects: l.max_objects,
        max_manifest_bytes: l.max_manifest_bytes,
        max_priority: l.max_priority,
    }
}

fn limits_of(d: &GlobalTenantDefinition) -> TenantLimits {
    TenantLimits {
        parent: d.parent.clone(),
        max_gpus: d.max_gpus,
        gpu_seconds_limit: d.gpu_seconds_limit,
        weight: d.weight.max(1),
        max_pending_jobs: d.max_pending_jobs,
        max_objects: d.max_objects,
        max_manifest_bytes: d.max_manifest_bytes,
        max_priority: d.max_priority,
    }
}

/// The caps and limits a tenant is adopted with, as its home's summary
/// defines it; `None` before the summary carries its definition.
fn adoption_terms(report: &GlobalTenantReport) -> Option<(Option<u32>, Option<u64>, TenantLimits)> {
    let limits = limits_of(report.definition.as_ref()?);
    let gpus = report
        .gpus
        .as_ref()
        .map(|a| u32::try_from(a.cap).unwrap_or(u32::MAX));
    let gpu_seconds = report.gpu_seconds.as_ref().map(|a| a.cap);
    Some((gpus, gpu_seconds, limits))
}

#[cfg(test)]
mod tests {
    use super::RoundTotals;
    use crate::federation::PeerRegion;
    use crate::ledger::{Command, Ledger, LedgerRequest, LedgerResponse, MemberSpec};
    use crate::sched::{schedule, Policy, TopologyProximity};
    use crate::workload::{JobSpec, JobState, SchedSnapshot, TenantLimits};
    use shoal_sdk::GpuInfo;
    use std::collections::BTreeMap;

    /// One region of one node with `gpus` GPUs, federated with `peers`,
    /// and tenant "lab".
    struct Region {
        ledger: Ledger,
        index: u64,
    }

    impl Region {
        fn new(name: &str, gpus: u32, peers: &[&str]) -> Region {
            let spec = MemberSpec {
                name: "n1".into(),
                gpus: (0..gpus)
                    .map(|i| GpuInfo {
                        index: i,
                        model: "H100".into(),
                        memory_mb: 81_920,
                        uuid: format!("GPU-{i}"),
                        allocated_to: None,
                        numa_node: None,
                        nvlink_peers: vec![],
                        mig_enabled: false,
                        health: String::new(),
                        health_reason: None,
                    })
                    .collect(),
                ..MemberSpec::default()
            };
            let mut r = Region {
                ledger: Ledger::new(),
                index: 0,
            };
            r.ok(Command::Bootstrap {
                cluster_id: format!("{name}-c"),
                region: name.into(),
                ca_cert_pem: String::new(),
                admin_token_hash: "a".into(),
                first_member: 1,
                spec,
            });
            for (i, peer) in peers.iter().enumerate() {
                r.ok(Command::AddPeerRegion {
                    peer: PeerRegion {
                        name: peer.to_string(),
                        cluster_id: format!("{peer}-c"),
                        ca_cert_pem: "-----BEGIN CERTIFICATE-----".into(),
                        api_urls: vec!["https://10.1.0.1:7070".into()],
                        outbound_secret_hash: "out".into(),
                        inbound_token_hash: format!("h{i}"),
                        joined_at_ms: 0,
                    },
                });
            }
            r
        }

        fn apply(&mut self, cmd: Command) -> LedgerResponse {
            self.index += 1;
            self.ledger.apply(
                self.index,
                &LedgerRequest {
                    now_ms: self.index,
                    cmd,
                },
            )
        }

        fn ok(&mut self, cmd: Command) {
            let r = self.apply(cmd);
            assert!(
                matches!(r, LedgerResponse::Ok | LedgerResponse::NodeId(_)),
                "{r:?}"
            );
        }

        fn submit(&mut self, gpus: u32) -> LedgerResponse {
            self.apply(Command::SubmitJob {
                spec: JobSpec {
                    name: "train".into(),
                    tenant: "lab".into(),
                    nodes: 1,
                    gpus_per_node: gpus,
                    time_limit_s: 3600,
                    command: vec!["true".into()],
                    ..JobSpec::default()
                },
            })
        }

        /// One scheduling pass, as the leader plans and proposes it.
        fn schedule(&mut self) {
            let snapshot = SchedSnapshot::new(&self.ledger, self.index, Policy::Fifo);
            let prox = TopologyProximity::new(&snapshot.input.nodes);
            let plan = snapshot.to_plan(&schedule(&snapshot.input, &prox), &self.ledger.workload);
            self.apply(Command::Schedule(plan));
        }

        fn running_gpus(&self) -> u32 {
            self.ledger.subtree_gpus_in_use("lab")
        }

        fn share(&self) -> u32 {
            self.ledger.regional_shares()["lab"]
                .gpus
                .expect("a GPU cap")
                .0
        }
    }

    /// Runs one share round in `r` on the other regions' current reports.
    fn round(r: &mut Region, others: &[&Region]) {
        let reports: Vec<_> = others
            .iter()
            .flat_map(|o| {
                let name = o.ledger.region_name().to_string();
                o.ledger
                    .global_reports()
                    .into_iter()
                    .map(move |rep| (name.clone(), rep))
            })
            .collect();
        let refs: Vec<(String, &shoal_sdk::GlobalTenantReport)> =
            reports.iter().map(|(n, rep)| (n.clone(), rep)).collect();
        if let Some(cmd) = r.ledger.plan_share_round("lab", &refs) {
            let answer = r.apply(cmd);
            assert_eq!(answer, LedgerResponse::Ok);
        }
    }

    /// Home "eu" defines lab with a global cap of 8; "us" adopts it.
    fn two_regions() -> (Region, Region) {
        let mut eu = Region::new("eu", 8, &["us"]);
        let mut us = Region::new("us", 8, &["eu"]);
        eu.ok(Command::CreateTenant {
            name: "lab".into(),
            limits: TenantLimits {
                weight: 3,
                ..TenantLimits::default()
            },
        });
        eu.ok(Command::SetGlobalCaps {
            tenant: "lab".into(),
            gpus: Some(Some(8)),
            gpu_seconds: None,
        });
        let report = eu.ledger.global_reports().remove(0);
        let adopt = us.ledger.plan_adoption("eu", &report).expect("adoption");
        us.ok(adopt);
        assert_eq!(us.ledger.workload.tenants["lab"].limits.weight, 3);
        assert!(
            us.ledger.plan_adoption("eu", &report).is_none(),
            "adopted once"
        );
        (eu, us)
    }

    #[test]
    fn the_cap_is_held_at_home_and_moves_to_where_jobs_wait() {
        let (mut eu, mut us) = two_regions();
        assert_eq!(eu.share(), 8);
        assert_eq!(us.share(), 0);
        // us waits for 6 GPUs: nothing runs there before eu grants.
        assert!(matches!(us.submit(6), LedgerResponse::JobId(_)));
        us.schedule();
        assert_eq!(us.running_gpus(), 0);
        round(&mut eu, &[&us]);
        assert_eq!(eu.share(), 1, "eu keeps half of the 2 nobody asks for");
        round(&mut us, &[&eu]);
        assert_eq!(us.share(), 7);
        us.schedule();
        assert_eq!(us.running_gpus(), 6);
        // eu may now run at most 1 GPU's worth, whatever it asks.
        assert!(matches!(eu.submit(2), LedgerResponse::JobId(_)));
        eu.schedule();
        assert_eq!(eu.running_gpus(), 0);
        let waiting = eu
            .ledger
            .workload
            .jobs
            .values()
            .find(|j| j.state == JobState::Pending)
            .expect("a waiting job");
        assert!(
            waiting.reason.contains("global cap of 8"),
            "{}",
            waiting.reason
        );
        assert!(eu.share() + us.share() <= 8);
    }

    #[test]
    fn a_gpu_hour_budget_is_split_by_grants_too() {
        let (mut eu, mut us) = two_regions();
        // Two GPU-hours in all regions together; the GPU cap stays 8.
        eu.ok(Command::SetGlobalCaps {
            tenant: "lab".into(),
            gpus: None,
            gpu_seconds: Some(Some(7200)),
        });
        let report = eu.ledger.global_reports().remove(0);
        let adopt = us.ledger.plan_adoption("eu", &report).expect("adoption");
        us.ok(adopt);
        // One-GPU jobs of an hour each: us waits for one, eu for two.
        assert!(matches!(us.submit(1), LedgerResponse::JobId(_)));
        us.schedule();
        assert_eq!(us.running_gpus(), 0, "no budget in us yet");
        round(&mut eu, &[&us]);
        round(&mut us, &[&eu]);
        us.schedule();
        assert_eq!(
            us.running_gpus(),
            1,
            "{:?} {:?}",
            us.ledger.regional_shares(),
            us.ledger
                .workload
                .jobs
                .values()
                .map(|j| j.reason.clone())
                .collect::<Vec<_>>()
        );
        // eu kept half the idle hour as headroom, less than a job needs;
        // once it waits for two, us grants back what it has not committed,
        // and eu runs one job of an hour, not two: the hour us committed
        // is gone from the budget.
        for _ in 0..2 {
            assert!(matches!(eu.submit(1), LedgerResponse::JobId(_)));
        }
        eu.schedule();
        assert_eq!(eu.running_gpus(), 0);
        round(&mut us, &[&eu]);
        round(&mut eu, &[&us]);
        eu.schedule();
        assert_eq!(eu.running_gpus(), 1);
        let shares = |r: &Region| {
            r.ledger.regional_shares()["lab"]
                .gpu_seconds
                .expect("budget")
        };
        assert!(shares(&eu).0 + shares(&us).0 <= 7200);
        let waiting = eu
            .ledger
            .workload
            .jobs
            .values()
            .find(|j| j.state == JobState::Pending)
            .expect("a waiting job");
        assert!(waiting.reason.starts_with("budget:"), "{}", waiting.reason);
        // A job of more than the whole budget is refused at submit.
        match eu.apply(Command::SubmitJob {
            spec: JobSpec {
                tenant: "lab".into(),
                nodes: 1,
                gpus_per_node: 3,
                time_limit_s: 3600,
                command: vec!["true".into()],
                ..JobSpec::default()
            },
        }) {
            LedgerResponse::Rejected(why) => assert!(why.contains("budget of 2.0"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_job_larger_than_the_global_cap_is_refused_at_submit() {
        let (mut eu, _) = two_regions();
        match eu.submit(9) {
            LedgerResponse::Rejected(why) => {
                assert!(why.contains("in all regions together"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_round_cannot_grant_away_what_the_tenant_holds() {
        let (mut eu, us) = two_regions();
        assert!(matches!(eu.submit(8), LedgerResponse::JobId(_)));
        eu.schedule();
        assert_eq!(eu.running_gpus(), 8);
        // A round planned before the job started, applied after it.
        let stale = Command::ShareRound {
            tenant: "lab".into(),
            gpus: Some(RoundTotals {
                received: BTreeMap::new(),
                given: [("us".to_string(), 4)].into(),
            }),
            gpu_seconds: None,
        };
        match eu.apply(stale) {
            LedgerResponse::Rejected(why) => assert!(why.contains("holds 8 GPUs"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(eu.share(), 8);
        let _ = us;
    }

    #[test]
    fn grants_only_grow_and_only_name_peer_regions() {
        let (mut eu, _) = two_regions();
        let grant = |n| Command::ShareRound {
            tenant: "lab".into(),
            gpus: Some(RoundTotals {
                received: BTreeMap::new(),
                given: [("us".to_string(), n)].into(),
            }),
            gpu_seconds: None,
        };
        eu.ok(grant(5));
        eu.ok(grant(2));
        assert_eq!(eu.share(), 3, "a smaller total is an old round");
        let stranger = Command::ShareRound {
            tenant: "lab".into(),
            gpus: Some(RoundTotals {
                received: [("ap".to_string(), 8)].into(),
                given: BTreeMap::new(),
            }),
            gpu_seconds: None,
        };
        assert!(matches!(eu.apply(stranger), LedgerResponse::Rejected(_)));
        assert_eq!(eu.share(), 3);
    }

    #[test]
    fn only_the_home_sets_the_cap_and_a_peer_that_leaves_takes_its_share() {
        let (mut eu, mut us) = two_regions();
        match us.apply(Command::SetGlobalCaps {
            tenant: "lab".into(),
            gpus: Some(Some(100)),
            gpu_seconds: None,
        }) {
            LedgerResponse::Rejected(why) => assert!(why.contains("set them there"), "{why}"),
            other => panic!("{other:?}"),
        }
        eu.ok(Command::ShareRound {
            tenant: "lab".into(),
            gpus: Some(RoundTotals {
                received: BTreeMap::new(),
                given: [("us".to_string(), 5)].into(),
            }),
            gpu_seconds: None,
        });
        assert_eq!(eu.share(), 3);
        eu.ok(Command::RemovePeerRegion { name: "us".into() });
        assert_eq!(eu.share(), 8);
        // The home left: us keeps the tenant, no longer capped globally.
        us.ok(Command::RemovePeerRegion { name: "eu".into() });
        assert!(us.ledger.global_caps.is_empty());
        assert!(us.ledger.workload.tenants.contains_key("lab"));
    }

    /// Every member of `r` at the protocol from which a local tenant is
    /// adopted only with an admin's consent.
    fn consent_spoken(r: &mut Region) {
        for m in r.ledger.members.values_mut() {
            m.spec.protocol_max = super::CONSENT_SINCE_PROTOCOL;
        }
    }

    #[test]
    fn a_local_tenant_of_a_shared_name_becomes_the_shared_one_only_by_an_admins_consent() {
        let mut eu = Region::new("eu", 8, &["us"]);
        let mut us = Region::new("us", 8, &["eu"]);
        consent_spoken(&mut us);
        // us has a "lab" of its own before eu shares its "lab".
        us.ok(Command::CreateTenant {
            name: "lab".into(),
            limits: TenantLimits::default(),
        });
        eu.ok(Command::CreateTenant {
            name: "lab".into(),
            limits: TenantLimits {
                weight: 3,
                ..TenantLimits::default()
            },
        });
        eu.ok(Command::SetGlobalCaps {
            tenant: "lab".into(),
            gpus: Some(Some(8)),
            gpu_seconds: None,
        });
        let report = eu.ledger.global_reports().remove(0);
        // The leader plans nothing, and a command planned before the local
        // tenant existed is refused at commit, naming the way to consent.
        assert!(us.ledger.plan_adoption("eu", &report).is_none());
        let leaders = Command::AdoptGlobalTenant {
            tenant: "lab".into(),
            home: "eu".into(),
            gpus: Some(8),
            gpu_seconds: None,
            limits: TenantLimits::default(),
        };
        let refused = us.apply(leaders.clone());
        assert!(
            matches!(&refused, LedgerResponse::Rejected(why)
                if why.contains("shoal tenant adopt lab --from eu")),
            "{refused:?}"
        );
        assert_eq!(us.ledger.global_tenant_id("lab"), None);
        assert!(us
            .ledger
            .tenant_shared_with("eu", "lab", Some(&eu.ledger.global_reports()))
            .is_err());
        // A tenant token may not consent.
        let consent = us
            .ledger
            .plan_consented_adoption(&report)
            .expect("a local namesake to adopt");
        let as_tenant = us.apply(Command::AsTenant {
            tenant: "lab".into(),
            cmd: Box::new(consent.clone()),
        });
        assert!(
            matches!(as_tenant, LedgerResponse::Denied(_)),
            "{as_tenant:?}"
        );
        // The admin's consent: us's lab is lab@eu from now on.
        us.ok(consent);
        assert_eq!(us.ledger.workload.tenants["lab"].limits.weight, 3);
        assert_eq!(
            us.ledger.global_tenant_id("lab").map(|id| id.to_string()),
            Some("lab@eu".to_string())
        );
        assert!(us.ledger.plan_adoption("eu", &report).is_none());
        assert!(us
            .ledger
            .plan_consented_adoption(&report)
            .is_err_and(|e| e.contains("already")));
        // A tenant us does not have needs no consent: created as eu's.
        let mut fresh = Region::new("us", 8, &["eu"]);
        consent_spoken(&mut fresh);
        let adopt = fresh.ledger.plan_adoption("eu", &report).expect("adopt");
        fresh.ok(adopt);
        assert!(fresh
            .ledger
            .plan_consented_adoption(&report)
            .is_err_and(|e| e.contains("already")));
        // Members of an older release merge as they did: every replica
        // must decide alike.
        let mut older = Region::new("us", 8, &["eu"]);
        older.ok(Command::CreateTenant {
            name: "lab".into(),
            limits: TenantLimits::default(),
        });
        older.ok(leaders);
        assert!(older.ledger.global_tenant_id("lab").is_some());
    }

    #[test]
    fn a_cap_the_home_lifts_is_lifted_in_the_other_regions() {
        let (mut eu, mut us) = two_regions();
        eu.ok(Command::SetGlobalCaps {
            tenant: "lab".into(),
            gpus: Some(None),
            gpu_seconds: None,
        });
        let lifted = us.ledger.plan_lifted("eu", &eu.ledger.global_reports());
        assert_eq!(lifted.len(), 1);
        for cmd in lifted {
            us.ok(cmd);
        }
        assert!(us.ledger.global_caps.is_empty());
    }

    #[test]
    fn a_peer_acts_only_for_a_tenant_both_regions_hold_under_one_global_id() {
        let (mut eu, mut us) = two_regions();
        let lab = super::GlobalTenantId {
            home: "eu".into(),
            name: "lab".into(),
        };
        assert_eq!(lab.to_string(), "lab@eu");
        // lab: defined in eu, adopted by us; each side's check reads the
        // other's own summary.
        let us_reports = us.ledger.global_reports();
        let eu_reports = eu.ledger.global_reports();
        assert_eq!(
            eu.ledger.tenant_shared_with("us", "lab", Some(&us_reports)),
            Ok(lab.clone())
        );
        assert_eq!(
            us.ledger.tenant_shared_with("eu", "lab", Some(&eu_reports)),
            Ok(lab.clone())
        );
        // Not a peer, or no summary of it yet.
        assert!(eu
            .ledger
            .tenant_shared_with("mars", "lab", Some(&us_reports))
            .is_err_and(|e| e.contains("not a peer")));
        assert!(eu
            .ledger
            .tenant_shared_with("us", "lab", None)
            .is_err_and(|e| e.contains("no summary")));

        // "vision" exists in both regions, local to each: same name,
        // two tenants.
        for r in [&mut eu, &mut us] {
            r.ok(Command::CreateTenant {
                name: "vision".into(),
                limits: TenantLimits::default(),
            });
        }
        let us_reports = us.ledger.global_reports();
        let why = eu
            .ledger
            .tenant_shared_with("us", "vision", Some(&us_reports))
            .expect_err("a local tenant is not shared");
        assert!(why.contains("not shared across regions"), "{why}");
        // Global in eu, but us's "vision" is still its own local one (not
        // adopted yet): refused on either side.
        eu.ok(Command::SetGlobalCaps {
            tenant: "vision".into(),
            gpus: Some(Some(4)),
            gpu_seconds: None,
        });
        let why = eu
            .ledger
            .tenant_shared_with("us", "vision", Some(&us_reports))
            .expect_err("the peer's vision is local");
        assert!(why.contains("does not hold tenant vision@eu"), "{why}");
        let eu_reports = eu.ledger.global_reports();
        assert!(us
            .ledger
            .tenant_shared_with("eu", "vision", Some(&eu_reports))
            .is_err_and(|e| e.contains("not shared")));
        // Caps set in both regions make two homes: two tenants again.
        us.ok(Command::SetGlobalCaps {
            tenant: "vision".into(),
            gpus: Some(Some(4)),
            gpu_seconds: None,
        });
        let us_reports = us.ledger.global_reports();
        let why = eu
            .ledger
            .tenant_shared_with("us", "vision", Some(&us_reports))
            .expect_err("two homes");
        assert!(why.contains("vision@us, not vision@eu"), "{why}");
        // A tenant that does not exist here is never shared.
        assert!(eu
            .ledger
            .tenant_shared_with("us", "nobody", Some(&us_reports))
            .is_err());
    }
}
