//! What a tenant-scoped API token may change. Pure: the decision reads only
//! the ledger, and `apply` makes it at commit time, so a check cannot race
//! with another write (an object replaced between a check at the API and the
//! commit would otherwise slip through).
//!
//! A token of tenant `T` acts for `T` and every tenant below it (a team lead's
//! token covers the team's projects): it may submit and cancel their jobs and
//! write or remove `mesh:/` objects they own. Everything that shapes the
//! cluster itself — members, drains, tenants and their limits, tokens,
//! attributes — needs an admin token (one without a tenant).

use crate::ledger::{Command, Ledger};
use crate::workload::Workload;

/// Whether `tenant` is `scope` or below it in the tenant tree.
pub fn covers(workload: &Workload, scope: &str, tenant: &str) -> bool {
    workload.ancestry(tenant).contains(&scope)
}

/// Why a tenant token may not have a command applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Refused, and the caller may know why (`permission denied: …`).
    Denied(String),
    /// The command names another tenant's job: answered exactly as if the
    /// job did not exist, so that ids do not leak, while the API records
    /// the attempt as an audit event.
    Hidden(String),
}

impl Refusal {
    pub fn message(&self) -> &str {
        match self {
            Refusal::Denied(m) | Refusal::Hidden(m) => m,
        }
    }
}

/// `Ok` when a token of tenant `scope` may have `cmd` applied; otherwise the
/// reason, worded for the user who ran the command. No refusal names
/// another tenant: a job of another tenant is "no job N", an object of
/// another tenant "belongs to another tenant" (paths are one namespace, so
/// that the path is taken cannot be hidden from a writer).
pub fn authorize(ledger: &Ledger, scope: &str, cmd: &Command) -> Result<(), Refusal> {
    let workload = &ledger.workload;
    if !workload.tenants.contains_key(scope) {
        return Err(Refusal::Denied(format!(
            "permission denied: the token's tenant '{scope}' no longer exists"
        )));
    }
    let denied = |path: &str| {
        Err(Refusal::Denied(format!(
            "permission denied: mesh:{path} belongs to another tenant, and this token is for tenant '{scope}'"
        )))
    };
    match cmd {
        Command::SubmitJob { spec } if covers(workload, scope, &spec.tenant) => Ok(()),
        Command::SubmitJob { spec } => Err(Refusal::Denied(format!(
            "permission denied: a token of tenant '{scope}' cannot submit jobs for tenant '{}'",
            spec.tenant
        ))),
        Command::SetTimeLimit { job, time_limit_s } => match workload.jobs.get(job) {
            None => Ok(()),
            Some(j) if !covers(workload, scope, &j.spec.tenant) => {
                Err(Refusal::Hidden(format!("no job {job}")))
            }
            // Slurm's rule: a user may lower a limit; raising it is an
            // operator's decision (it commits more of the budget).
            Some(j) if *time_limit_s > j.spec.time_limit_s => Err(Refusal::Denied(format!(
                "permission denied: only an admin token may raise a job's time limit (job {job} has {} s)",
                j.spec.time_limit_s
            ))),
            Some(_) => Ok(()),
        },
        Command::HoldJob { job, hold: false }
            if ledger.admin_holds.contains(job)
                && workload
                    .jobs
                    .get(job)
                    .is_some_and(|j| covers(workload, scope, &j.spec.tenant)) =>
        {
            Err(Refusal::Denied(format!(
                "permission denied: job {job} was held by an administrator; only an admin token may release it"
            )))
        }
        Command::CancelJob { job }
        | Command::HoldJob { job, .. }
        | Command::SignalJob { job, .. }
        | Command::RequeueJob { job } => match workload.jobs.get(job) {
            // Cancelling a job that does not exist fails in apply with its
            // usual message, which a hidden job's answer repeats.
            None => Ok(()),
            Some(j) if covers(workload, scope, &j.spec.tenant) => Ok(()),
            Some(_) => Err(Refusal::Hidden(format!("no job {job}"))),
        },
        Command::PutObject { object, .. } => {
            if !covers(workload, scope, &object.tenant) {
                return Err(Refusal::Denied(format!(
                    "permission denied: a token of tenant '{scope}' cannot write objects owned by tenant '{}'",
                    object.tenant
                )));
            }
            let path = crate::namespace::normalize(&object.path).map_err(Refusal::Denied)?;
            match ledger.namespace.objects.get(&path) {
                Some(existing) if !covers(workload, scope, &existing.tenant) => denied(&path),
                _ => Ok(()),
            }
        }
        Command::RemoveObject { path } => {
            let path = crate::namespace::normalize(path).map_err(Refusal::Denied)?;
            // Removing a directory removes everything below it: all of it
            // must be the caller's, or nothing is removed.
            let prefix = format!("{path}/");
            match ledger
                .namespace
                .objects
                .values()
                .filter(|o| o.path == path || o.path.starts_with(&prefix))
                .find(|o| !covers(workload, scope, &o.tenant))
            {
                Some(other) => denied(&other.path),
                None => Ok(()),
            }
        }
        other => Err(Refusal::Denied(format!(
            "permission denied: {} needs an admin token; this token is for tenant '{scope}'",
            describe(other)
        ))),
    }
}

/// The command as a user would name what they tried.
fn describe(cmd: &Command) -> &'static str {
    match cmd {
        Command::Bootstrap { .. } => "bootstrapping",
        Command::AddMember { .. } | Command::UpdateMember { .. } => "changing members",
        Command::SetMemberState { .. } => "changing a node's state",
        Command::CreateJoinToken { .. }
        | Command::CreateVoterJoinToken { .. }
        | Command::CreateApiToken { .. } => "creating tokens",
        Command::RevokeJoinToken { .. }
        | Command::RevokeApiToken { .. }
        | Command::RotateApiToken { .. }
        | Command::TouchApiToken { .. } => "managing tokens",
        Command::PutAttr { .. } => "setting cluster attributes",
        Command::CreateTenant { .. }
        | Command::UpdateTenant { .. }
        | Command::SetGlobalCaps { .. } => "managing tenants",
        Command::SetUser { .. } => "managing users",
        Command::SetDrain { .. } => "draining nodes",
        Command::SetGpuFault { .. } => "draining GPUs",
        Command::StartCaRotation { .. } | Command::AdvanceCaRotation { .. } => {
            "rotating the cluster CA"
        }
        Command::AsTenant { .. } | Command::Batch(_) => "nesting commands",
        Command::AddPeerRegion { .. }
        | Command::RemovePeerRegion { .. }
        | Command::CheckpointCopied { .. }
        | Command::RecordForeignCheckpoint { .. }
        | Command::ForgetForeignJob { .. }
        | Command::AdoptForeignJob { .. }
        | Command::JobMoved { .. }
        | Command::SetPeerCa { .. }
        | Command::AdoptGlobalTenant { .. }
        | Command::AdoptLocalTenant { .. }
        | Command::SealPeerSecret { .. }
        | Command::ShareRound { .. } => "federating regions",
        _ => "this operation",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ledger::{LedgerRequest, LedgerResponse, MemberSpec};
    use crate::namespace::MeshObject;
    use crate::workload::{JobSpec, TenantLimits};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn ledger_with_tenants() -> Ledger {
        let mut l = Ledger::new();
        let spec = MemberSpec {
            name: "n1".into(),
            rpc_addr: "127.0.0.1:1".into(),
            api_addr: "127.0.0.1:2".into(),
            labels: BTreeMap::new(),
            // One GPU: jobs of one GPU are feasible at submit.
            gpus: vec![shoal_sdk::GpuInfo {
                index: 0,
                model: "H100".into(),
                memory_mb: 81_920,
                uuid: "GPU-n1-0".into(),
                allocated_to: None,
                numa_node: None,
                nvlink_peers: vec![],
                mig_enabled: false,
                health: String::new(),
                health_reason: None,
            }],
            gossip_peer_id: String::new(),
            gossip_addr: String::new(),
            ..Default::default()
        };
        let apply = |l: &mut Ledger, cmd: Command| {
            let index = l.clock_ms + 1;
            let r = l.apply(index, &LedgerRequest { now_ms: index, cmd });
            assert!(!matches!(r, LedgerResponse::Rejected(_)), "{r:?}");
        };
        apply(
            &mut l,
            Command::Bootstrap {
                cluster_id: "c".into(),
                region: "r".into(),
                ca_cert_pem: String::new(),
                admin_token_hash: "admin".into(),
                first_member: 1,
                spec,
            },
        );
        for (name, parent) in [("a", None), ("a-sub", Some("a")), ("b", None)] {
            apply(
                &mut l,
                Command::CreateTenant {
                    name: name.into(),
                    limits: TenantLimits {
                        parent: parent.map(String::from),
                        ..TenantLimits::default()
                    },
                },
            );
        }
        l
    }

    /// A one-chunk object of `tenant` held by node 1 (also used by the
    /// ledger's tests).
    pub(crate) fn object(path: &str, tenant: &str) -> MeshObject {
        MeshObject {
            path: path.into(),
            is_dir: false,
            manifest: vec![1],
            bytes: 1,
            files: 1,
            holders: vec![1],
            replica: 1,
            tenant: tenant.into(),
            mtime_ms: 0,
        }
    }

    fn job(tenant: &str) -> JobSpec {
        JobSpec {
            name: "j".into(),
            tenant: tenant.into(),
            nodes: 1,
            gpus_per_node: 0,
            gpu_model: None,
            time_limit_s: 60,
            priority: 0,
            preemptible: true,
            command: vec![],
            env: BTreeMap::new(),
            workdir: None,
            ckpt_interval_s: None,
            max_restarts: 0,
            same: None,
            max_rtt_ms: None,
            required_labels: BTreeMap::new(),
            ..Default::default()
        }
    }

    #[test]
    fn a_tenant_token_covers_its_subtree_only() {
        let l = ledger_with_tenants();
        assert!(covers(&l.workload, "a", "a"));
        assert!(covers(&l.workload, "a", "a-sub"));
        assert!(!covers(&l.workload, "a-sub", "a"));
        assert!(!covers(&l.workload, "a", "b"));
        assert!(!covers(&l.workload, "a", "missing"));
    }

    #[test]
    fn jobs_and_objects_of_other_tenants_are_refused_without_naming_the_owner() {
        let mut l = ledger_with_tenants();
        l.namespace
            .put(&object("/b/data", "b"), false)
            .expect("put");
        assert!(authorize(&l, "a", &Command::SubmitJob { spec: job("a-sub") }).is_ok());
        let err = authorize(&l, "a", &Command::SubmitJob { spec: job("b") }).unwrap_err();
        assert!(
            err.message().contains("cannot submit jobs for tenant 'b'"),
            "{err:?}"
        );
        let err = authorize(
            &l,
            "a",
            &Command::PutObject {
                object: object("/b/data", "a"),
                replace: true,
            },
        )
        .unwrap_err();
        assert_eq!(
            err,
            Refusal::Denied(
                "permission denied: mesh:/b/data belongs to another tenant, and this token is for tenant 'a'"
                    .into()
            )
        );
        let err = authorize(&l, "a", &Command::RemoveObject { path: "/b".into() }).unwrap_err();
        assert!(
            err.message()
                .contains("mesh:/b/data belongs to another tenant"),
            "{err:?}"
        );
        let err = authorize(
            &l,
            "a",
            &Command::SetUser {
                name: "alice".into(),
                tenant: Some("a".into()),
            },
        )
        .unwrap_err();
        assert!(
            err.message()
                .contains("managing users needs an admin token"),
            "{err:?}"
        );
        let err = authorize(&l, "a", &Command::SetDrain { id: 1, drain: true }).unwrap_err();
        assert!(
            err.message()
                .contains("draining nodes needs an admin token"),
            "{err:?}"
        );
        // Nor may it lift or raise its own cap across regions.
        let err = authorize(
            &l,
            "a",
            &Command::SetGlobalCaps {
                tenant: "a".into(),
                gpus: Some(None),
                gpu_seconds: None,
            },
        )
        .unwrap_err();
        assert!(
            err.message()
                .contains("managing tenants needs an admin token"),
            "{err:?}"
        );
    }

    /// Checkpoint copies and takeovers are the regions' business: a tenant
    /// token can neither plant a copy (a job that would run as anyone's
    /// once taken over), adopt one, nor end a job as moved.
    #[test]
    fn a_tenant_token_may_not_copy_adopt_or_move_jobs_across_regions() {
        let mut l = ledger_with_tenants();
        let mut spec = job("a");
        spec.gpus_per_node = 1;
        let LedgerResponse::JobId(own) =
            as_tenant(&mut l, "a", Command::SubmitJob { spec: spec.clone() })
        else {
            panic!("a's job refused")
        };
        let before = l.clone();
        let checkpoint = crate::workload::Checkpoint {
            step: 3,
            epoch: 1,
            ranks: 1,
            parts: BTreeMap::new(),
            committed_at_ms: Some(1),
            regions: Vec::new(),
        };
        for cmd in [
            Command::CheckpointCopied {
                job: own,
                step: Some(3),
                region: "eu-1".into(),
            },
            Command::RecordForeignCheckpoint {
                origin: "eu-1".into(),
                origin_job: 7,
                spec: Box::new(spec.clone()),
                checkpoint: Box::new(checkpoint),
                origin_index: 1,
            },
            Command::ForgetForeignJob {
                origin: "eu-1".into(),
                origin_job: 7,
            },
            Command::AdoptForeignJob {
                origin: "eu-1".into(),
                origin_job: 7,
                wait_ms: 0,
            },
            Command::JobMoved {
                job: own,
                region: "eu-1".into(),
                remote_job: 9,
            },
            Command::SetPeerCa {
                region: "eu-1".into(),
                ca_cert_pem: "-----BEGIN CERTIFICATE-----".into(),
            },
            Command::AdoptGlobalTenant {
                tenant: "a".into(),
                home: "eu-1".into(),
                gpus: Some(1000),
                gpu_seconds: None,
                limits: TenantLimits::default(),
            },
            Command::ShareRound {
                tenant: "a".into(),
                gpus: Some(crate::federation::global_tenants::RoundTotals {
                    received: [("eu-1".to_string(), 1000)].into(),
                    given: BTreeMap::new(),
                }),
                gpu_seconds: None,
            },
        ] {
            match as_tenant(&mut l, "a", cmd) {
                LedgerResponse::Denied(why) => {
                    assert!(
                        why.contains("federating regions") && why.contains("admin"),
                        "{why}"
                    )
                }
                other => panic!("a tenant token was answered {other:?}"),
            }
        }
        assert_eq!(l.federation, before.federation);
        assert_eq!(l.workload.jobs, before.workload.jobs);
    }

    /// Audit finding 7: a tenant released a hold an admin had placed.
    #[test]
    fn a_tenant_cannot_release_an_admins_hold_but_its_own() {
        let mut l = ledger_with_tenants();
        let mut spec = job("a");
        spec.gpus_per_node = 1;
        let LedgerResponse::JobId(id) = as_tenant(&mut l, "a", Command::SubmitJob { spec }) else {
            panic!("a's job refused")
        };
        let admin = |l: &mut Ledger, hold: bool| {
            let index = l.clock_ms + 1;
            let cmd = Command::HoldJob { job: id, hold };
            l.apply(index, &LedgerRequest { now_ms: index, cmd })
        };
        let tenant =
            |l: &mut Ledger, hold: bool| as_tenant(l, "a", Command::HoldJob { job: id, hold });
        assert_eq!(admin(&mut l, true), LedgerResponse::Ok);
        match tenant(&mut l, false) {
            LedgerResponse::Denied(why) => assert!(why.contains("administrator"), "{why}"),
            other => panic!("the tenant released an admin's hold: {other:?}"),
        }
        assert!(l.workload.jobs[&id].held);
        assert_eq!(admin(&mut l, false), LedgerResponse::Ok);
        // The tenant's own hold is its own to release.
        assert_eq!(tenant(&mut l, true), LedgerResponse::Ok);
        assert_eq!(tenant(&mut l, false), LedgerResponse::Ok);
        assert!(!l.workload.jobs[&id].held);
        assert!(l.admin_holds.is_empty());
    }

    #[test]
    fn another_tenants_job_is_answered_as_one_that_does_not_exist() {
        let mut l = ledger_with_tenants();
        let mut spec = job("b");
        spec.gpus_per_node = 1;
        let LedgerResponse::JobId(b_job) = as_tenant(&mut l, "b", Command::SubmitJob { spec })
        else {
            panic!("b's job refused")
        };
        let missing = b_job + 100;
        // Holding is refused the same way, and holds nothing.
        let hold = Command::HoldJob {
            job: b_job,
            hold: true,
        };
        assert_eq!(
            as_tenant(&mut l, "a", hold),
            LedgerResponse::Hidden(format!("no job {b_job}"))
        );
        assert!(!l.workload.jobs[&b_job].held);
        // So are signals, requeues and new time limits, which change nothing.
        for cmd in [
            Command::SignalJob {
                job: b_job,
                signal: 10,
            },
            Command::RequeueJob { job: b_job },
            Command::SetTimeLimit {
                job: b_job,
                time_limit_s: 30,
            },
        ] {
            assert_eq!(
                as_tenant(&mut l, "a", cmd),
                LedgerResponse::Hidden(format!("no job {b_job}"))
            );
        }
        assert_eq!(l.workload.jobs[&b_job].spec.time_limit_s, 60);
        // Its owner may lower the limit but not raise it; an admin may.
        let raise = Command::SetTimeLimit {
            job: b_job,
            time_limit_s: 600,
        };
        let LedgerResponse::Denied(why) = as_tenant(&mut l, "b", raise.clone()) else {
            panic!("a tenant raised its own limit")
        };
        assert!(why.contains("only an admin token may raise"), "{why}");
        let lower = Command::SetTimeLimit {
            job: b_job,
            time_limit_s: 30,
        };
        assert_eq!(as_tenant(&mut l, "b", lower), LedgerResponse::Ok);
        let index = l.clock_ms + 1;
        l.apply(
            index,
            &LedgerRequest {
                now_ms: index,
                cmd: raise,
            },
        );
        assert_eq!(l.workload.jobs[&b_job].spec.time_limit_s, 600);
        let hidden = as_tenant(&mut l, "a", Command::CancelJob { job: b_job });
        let absent = as_tenant(&mut l, "a", Command::CancelJob { job: missing });
        assert_eq!(hidden, LedgerResponse::Hidden(format!("no job {b_job}")));
        assert_eq!(
            absent,
            LedgerResponse::Rejected(format!("no job {missing}"))
        );
        assert!(l.workload.jobs[&b_job].state.is_waiting());
        // The owner's own token still cancels it.
        assert_eq!(
            as_tenant(&mut l, "b", Command::CancelJob { job: b_job }),
            LedgerResponse::Ok
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put {
            path: usize,
            tenant: usize,
            replace: bool,
        },
        Remove {
            path: usize,
        },
    }

    const PATHS: [&str; 4] = ["/x", "/y", "/x/z", "/w/v"];
    const TENANTS: [&str; 3] = ["a", "a-sub", "b"];

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..PATHS.len(), 0..TENANTS.len(), any::<bool>()).prop_map(
                |(path, tenant, replace)| {
                    Op::Put {
                        path,
                        tenant,
                        replace,
                    }
                }
            ),
            (0..PATHS.len()).prop_map(|path| Op::Remove { path }),
        ]
    }

    proptest! {
        /// Whatever a token of tenant `b` sends, objects of other tenants are
        /// never changed or removed, while the admin's writes all go through
        /// the usual checks.
        #[test]
        fn a_tenant_token_never_touches_other_tenants_objects(
            ops in proptest::collection::vec((op(), any::<bool>()), 1..40)
        ) {
            let mut l = ledger_with_tenants();
            for (i, (op, as_b)) in ops.into_iter().enumerate() {
                let cmd = match op {
                    Op::Put { path, tenant, replace } => Command::PutObject {
                        object: object(PATHS[path], TENANTS[tenant]),
                        replace,
                    },
                    Op::Remove { path } => Command::RemoveObject { path: PATHS[path].into() },
                };
                let others = |l: &Ledger| -> Vec<MeshObject> {
                    l.namespace
                        .objects
                        .values()
                        .filter(|o| o.tenant != "b")
                        .cloned()
                        .collect()
                };
                let others_before = others(&l);
                let cmd = if as_b {
                    Command::AsTenant { tenant: "b".into(), cmd: Box::new(cmd) }
                } else {
                    cmd
                };
                let index = 100 + i as u64;
                l.apply(index, &LedgerRequest { now_ms: 10, cmd });
                if as_b {
                    prop_assert_eq!(others_before, others(&l));
                }
            }
        }
    }

    // --- how much a tenant token may use (crate::limits) ---

    fn as_tenant(l: &mut Ledger, tenant: &str, cmd: Command) -> LedgerResponse {
        let index = l.clock_ms + 1;
        let cmd = Command::AsTenant {
            tenant: tenant.into(),
            cmd: Box::new(cmd),
        };
        l.apply(index, &LedgerRequest { now_ms: index, cmd })
    }

    fn waiting(l: &Ledger, tenant: &str) -> usize {
        l.workload
            .jobs
            .values()
            .filter(|j| j.spec.tenant == tenant && j.state.is_waiting())
            .count()
    }

    #[test]
    fn a_tenant_token_is_held_to_the_waiting_jobs_limit_and_an_admin_is_not() {
        let mut l = ledger_with_tenants();
        let most = crate::ledger::limits::Limits::DEFAULT.waiting_jobs;
        let mut big = job("a");
        big.gpus_per_node = 1;
        for _ in 0..most {
            let r = as_tenant(&mut l, "a", Command::SubmitJob { spec: big.clone() });
            assert!(matches!(r, LedgerResponse::JobId(_)), "{r:?}");
        }
        assert_eq!(waiting(&l, "a"), most);
        match as_tenant(&mut l, "a", Command::SubmitJob { spec: big.clone() }) {
            LedgerResponse::Rejected(m) => assert_eq!(
                m,
                format!("limit: tenant 'a' has {most} jobs waiting (at most {most}, --max-pending-jobs); cancel some or wait for them to start")
            ),
            other => panic!("{other:?}"),
        }
        // Another tenant, and the admin, are not held back by a's use.
        let mut b = job("b");
        b.gpus_per_node = 1;
        assert!(matches!(
            as_tenant(&mut l, "b", Command::SubmitJob { spec: b }),
            LedgerResponse::JobId(_)
        ));
        let index = l.clock_ms + 1;
        let r = l.apply(
            index,
            &LedgerRequest {
                now_ms: index,
                cmd: Command::SubmitJob { spec: big },
            },
        );
        assert!(matches!(r, LedgerResponse::JobId(_)), "{r:?}");
    }

    #[test]
    fn oversized_specs_and_manifests_are_refused_and_never_stored() {
        let mut l = ledger_with_tenants();
        let mut spec = job("a");
        spec.command = vec!["x".repeat(65 << 10)];
        let r = as_tenant(&mut l, "a", Command::SubmitJob { spec });
        assert!(
            matches!(&r, LedgerResponse::Rejected(m) if m.starts_with("limit: the job spec is")),
            "{r:?}"
        );
        let mut spec = job("a");
        spec.required_labels = (0..200).map(|i| (format!("k{i}"), "v".into())).collect();
        let r = as_tenant(&mut l, "a", Command::SubmitJob { spec });
        assert!(
            matches!(&r, LedgerResponse::Rejected(m) if m.contains("200 required_labels entries")),
            "{r:?}"
        );
        let mut huge = object("/a/huge", "a");
        huge.manifest = vec![0; (4 << 20) + 1];
        let r = as_tenant(
            &mut l,
            "a",
            Command::PutObject {
                object: huge,
                replace: false,
            },
        );
        assert!(
            matches!(&r, LedgerResponse::Rejected(m) if m.contains("at most 4194304")),
            "{r:?}"
        );
        assert!(l.workload.jobs.is_empty());
        assert!(l.namespace.objects.is_empty());
    }
}
