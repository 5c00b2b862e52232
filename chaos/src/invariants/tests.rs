use std::collections::BTreeMap;

use shoal_consensus::workload::{
    JobSpec, JobState, Plan, PlannedPlacement, TenantLimits, TenantUpdate, DEFAULT_TENANT,
};
use shoal_consensus::{Command, LedgerRequest, LedgerResponse, MemberSpec};
use shoal_sdk::{GpuInfo, MemberState};

use super::*;

fn gpus(count: u32) -> Vec<GpuInfo> {
    (0..count)
        .map(|index| GpuInfo {
            index,
            model: "H100".into(),
            memory_mb: 81_920,
            uuid: format!("GPU-{index}"),
            allocated_to: None,
            numa_node: None,
            nvlink_peers: vec![],
            mig_enabled: false,
            health: String::new(),
            health_reason: None,
        })
        .collect()
}

fn member(name: &str, gpu_count: u32) -> MemberSpec {
    MemberSpec {
        name: name.into(),
        rpc_addr: "127.0.0.1:1".into(),
        api_addr: "127.0.0.1:2".into(),
        gpus: gpus(gpu_count),
        ..Default::default()
    }
}

fn spec(tenant: &str, nodes: u32, gpus_per_node: u32) -> JobSpec {
    JobSpec {
        name: "train".into(),
        tenant: tenant.into(),
        nodes,
        gpus_per_node,
        time_limit_s: 3600,
        command: vec!["true".into()],
        ..Default::default()
    }
}

/// A replica driven through `Ledger::apply`, checked after every entry
/// the way a chaos run checks every node.
struct Replica {
    ledger: Ledger,
    index: u64,
    now_ms: u64,
}

impl Replica {
    /// Nodes `n1`, `n2`, ... with ids 1, 2, ... and the given GPU counts.
    fn new(gpu_counts: &[u32]) -> Replica {
        let mut replica = Replica {
            ledger: Ledger::new(),
            index: 0,
            now_ms: 1_000,
        };
        replica.apply(Command::Bootstrap {
            cluster_id: "c".into(),
            region: "r".into(),
            ca_cert_pem: String::new(),
            admin_token_hash: "a".into(),
            first_member: 1,
            spec: member("n1", gpu_counts[0]),
        });
        replica.apply(Command::CreateJoinToken {
            hash: "t".into(),
            expires_at_ms: u64::MAX,
            uses: 100,
        });
        for (i, &count) in gpu_counts.iter().enumerate().skip(1) {
            let r = replica.apply(Command::AddMember {
                spec: member(&format!("n{}", i + 1), count),
                token_hash: "t".into(),
            });
            assert_eq!(r, LedgerResponse::NodeId(i as u64 + 1));
        }
        replica
    }

    /// Applies `cmd` and asserts that the state after it breaks nothing.
    fn apply(&mut self, cmd: Command) -> LedgerResponse {
        self.index += 1;
        self.now_ms += 1_000;
        let response = self.ledger.apply(
            self.index,
            &LedgerRequest {
                now_ms: self.now_ms,
                cmd,
            },
        );
        let violations = check_applied(self.index, &self.ledger);
        assert!(violations.is_empty(), "{violations:#?}");
        response
    }

    fn submit(&mut self, spec: JobSpec) -> JobId {
        match self.apply(Command::SubmitJob { spec }) {
            LedgerResponse::JobId(id) => id,
            other => panic!("submit refused: {other:?}"),
        }
    }

    /// Places `job` as given; returns whether apply accepted it.
    fn place(&mut self, job: JobId, nodes: &[(NodeId, &[u32])]) -> bool {
        let plan = Plan {
            placements: vec![PlannedPlacement {
                job,
                nodes: nodes.iter().map(|(n, g)| (*n, g.to_vec())).collect(),
                diameter_us: 0,
            }],
            ..Plan::default()
        };
        match self.apply(Command::Schedule(plan)) {
            LedgerResponse::Scheduled { started, .. } => started == [job],
            other => panic!("not a schedule answer: {other:?}"),
        }
    }

    fn tenant(&mut self, name: &str, limits: TenantLimits) {
        let r = self.apply(Command::CreateTenant {
            name: name.into(),
            limits,
        });
        assert_eq!(r, LedgerResponse::Ok);
    }

    fn job_mut(&mut self, id: JobId) -> &mut Job {
        self.ledger.workload.jobs.get_mut(&id).expect("job exists")
    }

    /// Gives `id` an allocation apply would never have made, created by
    /// the last entry.
    fn plant(&mut self, id: JobId, nodes: &[(NodeId, &[u32])]) {
        let epoch = self.index;
        let job = self.job_mut(id);
        job.state = JobState::Running;
        job.alloc = Some(Allocation {
            epoch,
            nodes: nodes.iter().map(|(n, g)| (*n, g.to_vec())).collect(),
            started_at_ms: 0,
            diameter_us: 0,
            exits: BTreeMap::new(),
            oom_killed: Default::default(),
            stop: None,
            signals: Vec::new(),
            master_port: None,
        });
    }

    fn violations(&self) -> Vec<Violation> {
        check_applied(self.index, &self.ledger)
    }
}

fn properties(violations: &[Violation]) -> Vec<&str> {
    violations.iter().map(|v| v.property.as_str()).collect()
}

fn capped(parent: Option<&str>, max_gpus: Option<u32>, gpu_hours: Option<u64>) -> TenantLimits {
    TenantLimits {
        parent: parent.map(String::from),
        max_gpus,
        gpu_seconds_limit: gpu_hours.map(|h| h * 3600),
        ..TenantLimits::default()
    }
}

#[test]
fn correct_placements_pass() {
    let mut r = Replica::new(&[4, 4]);
    let gang = r.submit(spec(DEFAULT_TENANT, 2, 2));
    assert!(r.place(gang, &[(1, &[0, 1]), (2, &[2, 3])]));
    let single = r.submit(spec(DEFAULT_TENANT, 1, 2));
    // Apply refuses the busy GPUs, then takes the free ones.
    assert!(!r.place(single, &[(1, &[1, 2])]));
    assert!(r.place(single, &[(1, &[2, 3])]));
    assert!(check_final(&r.ledger).is_empty());
}

#[test]
fn two_jobs_on_one_gpu_are_caught() {
    let mut r = Replica::new(&[4]);
    let a = r.submit(spec(DEFAULT_TENANT, 1, 2));
    let b = r.submit(spec(DEFAULT_TENANT, 1, 2));
    assert!(r.place(a, &[(1, &[0, 1])]));
    r.plant(b, &[(1, &[1, 2])]);
    let violations = r.violations();
    assert_eq!(properties(&violations), ["gpu-held-twice"]);
    let detail = &violations[0].detail;
    assert!(detail.contains("GPU 1 of node 1 (n1)"), "{detail}");
    assert!(detail.contains(&format!("job {a} and job {b}")), "{detail}");
}

#[test]
fn a_gang_missing_a_node_is_caught() {
    let mut r = Replica::new(&[4, 4]);
    let gang = r.submit(spec(DEFAULT_TENANT, 2, 2));
    assert!(r.place(gang, &[(1, &[0, 1]), (2, &[0, 1])]));
    if let Some(alloc) = r.job_mut(gang).alloc.as_mut() {
        alloc.nodes.truncate(1);
    }
    let violations = r.violations();
    assert_eq!(properties(&violations), ["gang-not-whole"]);
    assert!(violations[0]
        .detail
        .contains("holds 1 nodes, the job asks for 2"));
}

#[test]
fn a_gang_with_a_repeated_node_or_gpu_is_caught() {
    let mut r = Replica::new(&[4, 4]);
    let gang = r.submit(spec(DEFAULT_TENANT, 2, 2));
    r.plant(gang, &[(1, &[0, 1]), (1, &[2, 3])]);
    assert_eq!(properties(&r.violations()), ["gang-not-whole"]);
    r.plant(gang, &[(1, &[0, 0]), (2, &[0, 1])]);
    assert_eq!(properties(&r.violations()), ["gang-not-whole"]);
    r.plant(gang, &[(1, &[0, 1, 2]), (2, &[0, 1])]);
    assert_eq!(properties(&r.violations()), ["gang-not-whole"]);
}

#[test]
fn a_placement_on_a_gpu_the_node_lacks_is_caught() {
    let mut r = Replica::new(&[4]);
    let job = r.submit(spec(DEFAULT_TENANT, 1, 2));
    r.plant(job, &[(1, &[3, 4])]);
    let violations = r.violations();
    assert_eq!(properties(&violations), ["gpu-out-of-range"]);
    assert!(violations[0].detail.contains("GPU 4 of node 1 (n1)"));
}

#[test]
fn a_node_that_shrinks_under_a_running_job_is_not_a_violation() {
    // Apply checks GPUs exist at placement only; the node re-registering
    // with fewer GPUs does not stop what runs there.
    let mut r = Replica::new(&[4]);
    let job = r.submit(spec(DEFAULT_TENANT, 1, 2));
    assert!(r.place(job, &[(1, &[2, 3])]));
    let r2 = r.apply(Command::UpdateMember {
        id: 1,
        spec: member("n1", 2),
    });
    assert_eq!(r2, LedgerResponse::Ok);
}

#[test]
fn hierarchical_caps_hold_through_real_placements() {
    let mut r = Replica::new(&[8]);
    r.tenant("org", capped(None, Some(4), None));
    r.tenant("a", capped(Some("org"), None, None));
    r.tenant("b", capped(Some("org"), Some(3), None));
    let a = r.submit(spec("a", 1, 2));
    let b1 = r.submit(spec("b", 1, 2));
    let b2 = r.submit(spec("b", 1, 1));
    assert!(r.place(a, &[(1, &[0, 1])]));
    assert!(r.place(b1, &[(1, &[2, 3])]));
    // org is at 4 of 4 over its subtree, though b alone is under its cap.
    assert!(!r.place(b2, &[(1, &[4])]));
    // Lowering a cap stops nothing: over the cap is not a violation.
    let update = TenantUpdate {
        max_gpus: Some(Some(2)),
        ..TenantUpdate::default()
    };
    let r2 = r.apply(Command::UpdateTenant {
        name: "org".into(),
        update,
    });
    assert_eq!(r2, LedgerResponse::Ok);
}

#[test]
fn a_placement_over_a_parent_cap_is_caught() {
    let mut r = Replica::new(&[8]);
    r.tenant("org", capped(None, Some(4), None));
    r.tenant("a", capped(Some("org"), None, None));
    r.tenant("b", capped(Some("org"), None, None));
    let a = r.submit(spec("a", 1, 4));
    let b = r.submit(spec("b", 1, 2));
    assert!(r.place(a, &[(1, &[0, 1, 2, 3])]));
    r.plant(b, &[(1, &[4, 5])]);
    let violations = r.violations();
    assert_eq!(properties(&violations), ["tenant-cap-exceeded"]);
    let detail = &violations[0].detail;
    assert!(detail.contains("tenant org"), "{detail}");
    assert!(
        detail.contains("holding 6 GPUs, over its cap of 4"),
        "{detail}"
    );
}

#[test]
fn budgets_hold_through_real_placements() {
    let mut r = Replica::new(&[8]);
    // Two GPU-hours: two one-GPU jobs of an hour each, not three.
    r.tenant("lab", capped(None, None, Some(2)));
    let jobs: Vec<JobId> = (0..3).map(|_| r.submit(spec("lab", 1, 1))).collect();
    assert!(r.place(jobs[0], &[(1, &[0])]));
    assert!(r.place(jobs[1], &[(1, &[1])]));
    assert!(!r.place(jobs[2], &[(1, &[2])]));
}

#[test]
fn a_placement_over_budget_is_caught() {
    let mut r = Replica::new(&[8]);
    r.tenant("lab", capped(None, None, Some(1)));
    let a = r.submit(spec("lab", 1, 1));
    assert!(r.place(a, &[(1, &[0])]));
    // Submission admits it (nothing is finished yet); placement would not.
    let b = r.submit(spec("lab", 1, 1));
    r.plant(b, &[(1, &[1])]);
    let violations = r.violations();
    assert_eq!(properties(&violations), ["budget-exceeded"]);
    assert!(violations[0].detail.contains("7200 GPU-seconds"));
}

#[test]
fn quotas_are_judged_only_where_a_placement_happened() {
    let mut r = Replica::new(&[8]);
    r.tenant("lab", capped(None, Some(1), None));
    let a = r.submit(spec("lab", 1, 1));
    let b = r.submit(spec("lab", 1, 1));
    assert!(r.place(a, &[(1, &[0])]));
    r.plant(b, &[(1, &[1])]);
    assert_eq!(properties(&r.violations()), ["tenant-cap-exceeded"]);
    // The same state judged at a later entry that placed nothing.
    assert!(check_applied(r.index + 1, &r.ledger).is_empty());
}

#[test]
fn node_loss_requeues_and_stays_consistent() {
    let mut r = Replica::new(&[4, 4]);
    let mut gang = spec(DEFAULT_TENANT, 2, 4);
    gang.max_restarts = 1;
    let gang = r.submit(gang);
    assert!(r.place(gang, &[(1, &[0, 1, 2, 3]), (2, &[0, 1, 2, 3])]));
    r.apply(Command::SetMemberState {
        id: 2,
        state: MemberState::Down,
    });
    assert_eq!(r.ledger.workload.jobs[&gang].state, JobState::Requeued);
    assert!(check_final(&r.ledger).is_empty());
}

#[test]
fn a_waiting_job_without_a_reason_is_caught() {
    let mut r = Replica::new(&[4]);
    let id = r.submit(spec(DEFAULT_TENANT, 1, 1));
    assert!(check_final(&r.ledger).is_empty());
    r.job_mut(id).reason.clear();
    let violations = check_final(&r.ledger);
    assert_eq!(properties(&violations), ["pending-without-reason"]);
    assert!(violations[0]
        .detail
        .contains(&format!("job {id} is pending")));
}

#[test]
fn identical_ledgers_have_converged() {
    let r = Replica::new(&[4, 4]);
    let copy = r.ledger.clone();
    assert!(check_converged(&[]).is_empty());
    assert!(check_converged(&[(1, &r.ledger), (2, &copy), (3, &copy)]).is_empty());
}

#[test]
fn a_diverged_ledger_is_named_with_its_fields() {
    let mut r = Replica::new(&[4, 4]);
    let id = r.submit(spec(DEFAULT_TENANT, 1, 1));
    let same = r.ledger.clone();
    let mut odd = r.ledger.clone();
    odd.attrs.insert("x".into(), "1".into());
    if let Some(job) = odd.workload.jobs.get_mut(&id) {
        job.spec.priority += 1;
    }
    // The odd one out is reported against the majority, whatever the order.
    let violations = check_converged(&[(3, &odd), (1, &r.ledger), (2, &same)]);
    assert_eq!(properties(&violations), ["not-converged"]);
    let detail = &violations[0].detail;
    assert!(
        detail.starts_with("nodes [3] differ from nodes [1, 2]"),
        "{detail}"
    );
    assert!(detail.contains("attrs"), "{detail}");
    assert!(
        detail.contains(&format!("workload.jobs (jobs {id})")),
        "{detail}"
    );
    assert!(!detail.contains("members"), "{detail}");
}

#[test]
fn rank_logs_are_merged_per_rank() {
    let log = "\
beat 7 12 0 n1 1000
beat 7 12 1 n2 1005
beat 7 12 0 n1 2000
step 40 loss 0.1
beat 7 12 0 n1 1500
beat 7 x 0 n1 3000
beat 7 12 0 n1
beat 7 12 0 n1 3000 extra
beat 7 19 0 n3 9000
";
    let records = parse_rank_log(log);
    let record = |epoch, rank, node: &str, first_ms, last_ms| RankRecord {
        job: 7,
        epoch,
        rank,
        node: node.into(),
        first_ms,
        last_ms,
    };
    assert_eq!(
        records,
        [
            record(12, 0, "n1", 1000, 2000),
            record(12, 1, "n2", 1005, 1005),
            record(19, 0, "n3", 9000, 9000),
        ]
    );
}

fn rank(job: u64, epoch: u64, rank: u32, first_ms: u64, last_ms: u64) -> RankRecord {
    RankRecord {
        job,
        epoch,
        rank,
        node: format!("n{}", rank + 1),
        first_ms,
        last_ms,
    }
}

#[test]
fn successive_epochs_pass() {
    let records = [
        rank(1, 10, 0, 0, 5_000),
        rank(1, 10, 1, 10, 5_050),
        rank(1, 20, 0, 5_100, 9_000),
        rank(1, 20, 1, 5_200, 9_000),
        // Another job may run at the same time, of course.
        rank(2, 15, 0, 1_000, 8_000),
    ];
    assert!(check_epochs(&records, 0).is_empty());
}

#[test]
fn overlap_within_the_slack_passes() {
    let records = [rank(1, 10, 0, 0, 5_000), rank(1, 20, 0, 4_900, 9_000)];
    assert!(check_epochs(&records, 100).is_empty());
    assert_eq!(properties(&check_epochs(&records, 99)), ["epochs-overlap"]);
}

#[test]
fn overlapping_epochs_are_caught() {
    let records = [
        rank(1, 10, 0, 0, 5_000),
        rank(1, 10, 1, 0, 7_000),
        rank(1, 20, 0, 6_000, 9_000),
        rank(1, 20, 1, 6_500, 9_000),
    ];
    let violations = check_epochs(&records, 100);
    assert_eq!(properties(&violations), ["epochs-overlap"]);
    let detail = &violations[0].detail;
    assert!(
        detail.contains("epoch 10 rank 1 on n2 was seen at 7000 ms, after epoch 20 rank 0 on n1 started at 6000 ms"),
        "{detail}"
    );
}

#[test]
fn an_old_rank_beating_after_its_replacement_started_is_caught() {
    // The old rank went quiet (a partition), the new epoch started, and
    // then the old rank was heard again: it was never fenced.
    let log = "\
beat 4 10 0 n1 1000
beat 4 20 0 n2 5000
beat 4 20 0 n2 6000
beat 4 10 0 n1 6500
";
    let violations = check_epochs(&parse_rank_log(log), 500);
    assert_eq!(properties(&violations), ["epochs-overlap"]);
    assert!(violations[0]
        .detail
        .contains("job 4: epoch 10 rank 0 on n1 was seen at 6500 ms"));
}

#[test]
fn every_pair_of_overlapping_epochs_is_reported() {
    let records = [
        rank(1, 10, 0, 0, 10_000),
        rank(1, 20, 0, 2_000, 3_000),
        rank(1, 30, 0, 4_000, 5_000),
    ];
    assert_eq!(check_epochs(&records, 0).len(), 2);
}
