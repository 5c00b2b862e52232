//! Tenants capped across regions, in the ledger: the home region's cap,
//! its definition adopted by the other regions, and the share rounds that
//! move parts of the cap between them ([`super::escrow`]).

use super::escrow::{GlobalCap, PeerShare, RegionalShare, RegionalShares};
use super::shares::RegionUse;
use crate::ledger::{Command, Ledger};
use crate::workload::{TenantLimits, TenantUpdate};
use shoal_sdk::{GlobalTenantDefinition, GlobalTenantReport};
use std::collections::BTreeMap;

/// The protocol version that brought global caps: the commands are
/// proposed only once every member speaks it.
pub const SINCE_PROTOCOL: u16 = 3;

/// Most tenants one region caps globally (each is in every summary).
pub const MAX_GLOBAL_TENANTS: usize = 256;

impl Ledger {
    /// This region's name ("" before bootstrap).
    pub fn region_name(&self) -> &str {
        self.cluster
            .as_ref()
            .map(|c| c.region.as_str())
            .unwrap_or("")
    }

    /// What each globally capped tenant may hold here.
    pub fn regional_shares(&self) -> RegionalShares {
        let me = self.region_name();
        self.global_caps
            .iter()
            .map(|(tenant, cap)| {
                let share = RegionalShare {
                    share: cap.share(me),
                    global: cap.gpus,
                };
                (tenant.clone(), share)
            })
            .collect()
    }

    pub(crate) fn set_global_gpus(
        &mut self,
        tenant: &str,
        gpus: Option<u32>,
    ) -> Result<(), String> {
        if !self.workload.tenants.contains_key(tenant) {
            return Err(format!("no tenant named '{tenant}'"));
        }
        let me = self.region_name().to_string();
        if let Some(cap) = self.global_caps.get(tenant) {
            if cap.home != me {
                return Err(format!(
                    "tenant '{tenant}' is defined in region '{}', which keeps its global cap: set it there",
                    cap.home
                ));
            }
        }
        match gpus {
            Some(gpus) => {
                if !self.global_caps.contains_key(tenant)
                    && self.global_caps.len() >= MAX_GLOBAL_TENANTS
                {
                    return Err(format!(
                        "at most {MAX_GLOBAL_TENANTS} tenants may have a global cap"
                    ));
                }
                let cap = self
                    .global_caps
                    .entry(tenant.to_string())
                    .or_insert_with(|| GlobalCap {
                        home: me,
                        ..Default::default()
                    });
                cap.gpus = gpus;
            }
            None => {
                self.global_caps.remove(tenant);
            }
        }
        Ok(())
    }

    pub(crate) fn adopt_global_tenant(
        &mut self,
        tenant: &str,
        home: &str,
        gpus: Option<u32>,
        limits: &TenantLimits,
        now_ms: u64,
    ) -> Result<(), String> {
        if !self.federation.peers.contains_key(home) {
            return Err(format!("no peer region named '{home}'"));
        }
        if let Some(cap) = self.global_caps.get(tenant) {
            if cap.home != home {
                return Err(format!(
                    "tenant '{tenant}' has its global cap from region '{}', not '{home}'",
                    cap.home
                ));
            }
        }
        let Some(gpus) = gpus else {
            self.global_caps.remove(tenant);
            return Ok(());
        };
        if !self.global_caps.contains_key(tenant) && self.global_caps.len() >= MAX_GLOBAL_TENANTS {
            return Err(format!(
                "at most {MAX_GLOBAL_TENANTS} tenants may have a global cap"
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
        cap.gpus = gpus;
        Ok(())
    }

    pub(crate) fn share_round(
        &mut self,
        tenant: &str,
        received: &BTreeMap<String, u64>,
        given: &BTreeMap<String, u64>,
    ) -> Result<(), String> {
        let me = self.region_name().to_string();
        let Some(cap) = self.global_caps.get(tenant) else {
            return Err(format!("tenant '{tenant}' has no global cap"));
        };
        let mut next = cap.clone();
        if let Some(region) = received
            .keys()
            .chain(given.keys())
            .find(|r| !self.federation.peers.contains_key(*r))
        {
            return Err(format!("no peer region named '{region}'"));
        }
        for (region, total) in received {
            let seen = next.received.entry(region.clone()).or_default();
            *seen = (*seen).max(*total);
        }
        for (region, total) in given {
            let out = next.given.entry(region.clone()).or_default();
            *out = (*out).max(*total);
        }
        // Grants only from what the tenant does not hold here: the round
        // was planned on this replica's state, which may have moved on.
        let held = self.subtree_gpus_in_use(tenant);
        let granted_more = next.given != cap.given;
        if granted_more && next.signed_share(&me) < i64::from(held) {
            return Err(format!(
                "tenant '{tenant}' holds {held} GPUs here; the round would leave a share of {}",
                next.signed_share(&me)
            ));
        }
        self.global_caps.insert(tenant.to_string(), next);
        Ok(())
    }

    /// A job that could never run under a global cap is refused at submit.
    pub(crate) fn fits_global_caps(&self, spec: &crate::workload::JobSpec) -> Result<(), String> {
        if !self.workload.tenants.contains_key(&spec.tenant) {
            return Ok(());
        }
        for name in self.workload.ancestry(&spec.tenant) {
            if let Some(cap) = self.global_caps.get(name) {
                if spec.total_gpus() > cap.gpus {
                    return Err(format!(
                        "quota: the job needs {} GPUs but {name} may use at most {} in all regions together",
                        spec.total_gpus(),
                        cap.gpus
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

    /// What `tenant` (with the tenants below it) holds here and what its
    /// waiting jobs here ask for.
    pub fn global_use(&self, tenant: &str) -> RegionUse {
        let subtree = self.workload.subtree(tenant);
        let demand: u64 = self
            .workload
            .jobs
            .values()
            .filter(|j| j.state.is_waiting() && !j.held)
            .filter(|j| subtree.contains(&j.spec.tenant.as_str()))
            .map(|j| u64::from(j.spec.total_gpus()))
            .sum();
        RegionUse {
            region: self.region_name().to_string(),
            in_use: self.subtree_gpus_in_use(tenant),
            demand: u32::try_from(demand).unwrap_or(u32::MAX),
        }
    }

    /// The next round for `tenant` from the peers' latest reports, or
    /// `None` when it changes nothing (or the tenant has no global cap).
    /// Only the peers this region federates with take part.
    pub fn plan_share_round(
        &self,
        tenant: &str,
        reports: &[(String, &GlobalTenantReport)],
    ) -> Option<Command> {
        let cap = self.global_caps.get(tenant)?;
        let me = self.region_name();
        let peers: Vec<PeerShare> = reports
            .iter()
            .filter(|(region, r)| {
                self.federation.peers.contains_key(region) && r.tenant == tenant && region != me
            })
            .map(|(region, r)| PeerShare {
                region: region.clone(),
                in_use: r.in_use,
                demand: r.demand,
                share: r.share,
                given_to_us: r.given.get(me).copied().unwrap_or(0),
                received_from_us: r.received.get(me).copied().unwrap_or(0),
            })
            .collect();
        let next = cap.round(me, &self.global_use(tenant), &peers);
        (next != *cap).then(|| Command::ShareRound {
            tenant: tenant.to_string(),
            received: next.received,
            given: next.given,
        })
    }

    /// This region's reports for its summary.
    pub fn global_reports(&self) -> Vec<GlobalTenantReport> {
        let me = self.region_name();
        self.global_caps
            .iter()
            .map(|(tenant, cap)| {
                let used = self.global_use(tenant);
                let definition = (cap.home == me)
                    .then(|| self.workload.tenants.get(tenant))
                    .flatten()
                    .map(|t| definition_of(&t.limits));
                GlobalTenantReport {
                    tenant: tenant.clone(),
                    home: cap.home.clone(),
                    gpus: cap.gpus,
                    share: cap.share(me),
                    in_use: used.in_use,
                    demand: used.demand,
                    given: cap.given.clone(),
                    received: cap.received.clone(),
                    definition,
                }
            })
            .collect()
    }

    /// What adopting `report` (from `region`, the tenant's home) would
    /// change here, as a command; `None` when nothing would.
    pub fn plan_adoption(&self, region: &str, report: &GlobalTenantReport) -> Option<Command> {
        if report.home != region || !self.federation.peers.contains_key(region) {
            return None;
        }
        let limits = limits_of(report.definition.as_ref()?);
        let same_cap = self
            .global_caps
            .get(&report.tenant)
            .is_some_and(|c| c.home == region && c.gpus == report.gpus);
        let same_limits = self
            .workload
            .tenants
            .get(&report.tenant)
            .is_some_and(|t| t.limits == limits);
        (!(same_cap && same_limits)).then(|| Command::AdoptGlobalTenant {
            tenant: report.tenant.clone(),
            home: region.to_string(),
            gpus: Some(report.gpus),
            limits,
        })
    }

    /// Tenants whose home is `region` that its summary no longer lists:
    /// the home lifted their cap.
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
                limits: self
                    .workload
                    .tenants
                    .get(tenant)
                    .map(|t| t.limits.clone())
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// A peer region left: its grants no longer count here.
    pub(crate) fn forget_region_grants(&mut self, region: &str) {
        for cap in self.global_caps.values_mut() {
            cap.forget(region);
        }
        // Tenants whose home left keep their definition, uncapped globally.
        self.global_caps.retain(|_, cap| cap.home != region);
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

#[cfg(test)]
mod tests {
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
                        outbound_secret: "out".into(),
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
            self.ledger.regional_shares()["lab"].share
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
        eu.ok(Command::SetGlobalGpus {
            tenant: "lab".into(),
            gpus: Some(8),
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
            received: BTreeMap::new(),
            given: [("us".to_string(), 4)].into(),
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
            received: BTreeMap::new(),
            given: [("us".to_string(), n)].into(),
        };
        eu.ok(grant(5));
        eu.ok(grant(2));
        assert_eq!(eu.share(), 3, "a smaller total is an old round");
        let stranger = Command::ShareRound {
            tenant: "lab".into(),
            received: [("ap".to_string(), 8)].into(),
            given: BTreeMap::new(),
        };
        assert!(matches!(eu.apply(stranger), LedgerResponse::Rejected(_)));
        assert_eq!(eu.share(), 3);
    }

    #[test]
    fn only_the_home_sets_the_cap_and_a_peer_that_leaves_takes_its_share() {
        let (mut eu, mut us) = two_regions();
        match us.apply(Command::SetGlobalGpus {
            tenant: "lab".into(),
            gpus: Some(100),
        }) {
            LedgerResponse::Rejected(why) => assert!(why.contains("set it there"), "{why}"),
            other => panic!("{other:?}"),
        }
        eu.ok(Command::ShareRound {
            tenant: "lab".into(),
            received: BTreeMap::new(),
            given: [("us".to_string(), 5)].into(),
        });
        assert_eq!(eu.share(), 3);
        eu.ok(Command::RemovePeerRegion { name: "us".into() });
        assert_eq!(eu.share(), 8);
        // The home left: us keeps the tenant, no longer capped globally.
        us.ok(Command::RemovePeerRegion { name: "eu".into() });
        assert!(us.ledger.global_caps.is_empty());
        assert!(us.ledger.workload.tenants.contains_key("lab"));
    }

    #[test]
    fn a_cap_the_home_lifts_is_lifted_in_the_other_regions() {
        let (mut eu, mut us) = two_regions();
        eu.ok(Command::SetGlobalGpus {
            tenant: "lab".into(),
            gpus: None,
        });
        let lifted = us.ledger.plan_lifted("eu", &eu.ledger.global_reports());
        assert_eq!(lifted.len(), 1);
        for cmd in lifted {
            us.ok(cmd);
        }
        assert!(us.ledger.global_caps.is_empty());
    }
}
