use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use shoal_sdk::{GpuInfo, MemberState};

use super::*;
use crate::ledger::{trial_start, Command, Ledger, LedgerRequest, LedgerResponse, MemberSpec};
use crate::sched::{schedule, Policy, TopologyProximity};

fn gpus(count: u32, model: &str) -> Vec<GpuInfo> {
    (0..count)
        .map(|index| GpuInfo {
            index,
            model: model.into(),
            memory_mb: 81_920,
            uuid: format!("GPU-{index}"),
            allocated_to: None,
            numa_node: Some(index / 4),
            nvlink_peers: vec![],
            mig_enabled: false,
            health: String::new(),
            health_reason: None,
        })
        .collect()
}

fn member(name: &str, rack: &str, gpu_count: u32) -> MemberSpec {
    MemberSpec {
        name: name.into(),
        rpc_addr: "127.0.0.1:1".into(),
        api_addr: "127.0.0.1:2".into(),
        labels: [("rack".to_string(), rack.to_string())].into(),
        gpus: gpus(gpu_count, "H100"),
        gossip_peer_id: String::new(),
        gossip_addr: String::new(),
        protocol_max: WHOLE_NODES_SINCE_PROTOCOL,
        ..Default::default()
    }
}

/// A ledger with a log index counter, so tests read like a replica.
struct Replica {
    ledger: Ledger,
    index: u64,
    now_ms: u64,
}

impl Replica {
    fn new(nodes: &[(&str, &str, u32)]) -> Self {
        let mut replica = Replica {
            ledger: Ledger::new(),
            index: 0,
            now_ms: 1_000,
        };
        let (name, rack, count) = nodes[0];
        replica.apply(Command::Bootstrap {
            cluster_id: "c".into(),
            region: "r".into(),
            ca_cert_pem: String::new(),
            admin_token_hash: "a".into(),
            first_member: 1,
            spec: member(name, rack, count),
        });
        replica.apply(Command::CreateJoinToken {
            hash: "t".into(),
            expires_at_ms: u64::MAX,
            uses: crate::tokens::MAX_JOIN_USES,
        });
        for (name, rack, count) in &nodes[1..] {
            replica.apply(Command::AddMember {
                spec: member(name, rack, *count),
                token_hash: "t".into(),
            });
        }
        replica
    }

    fn apply(&mut self, cmd: Command) -> LedgerResponse {
        self.index += 1;
        self.ledger.apply(
            self.index,
            &LedgerRequest {
                now_ms: self.now_ms,
                cmd,
            },
        )
    }

    fn submit(&mut self, spec: JobSpec) -> JobId {
        match self.apply(Command::SubmitJob { spec }) {
            LedgerResponse::JobId(id) => id,
            other => panic!("submit refused: {other:?}"),
        }
    }

    fn plan(&self, policy: Policy) -> Plan {
        let snapshot = SchedSnapshot::new(&self.ledger, self.now_ms, policy);
        let prox = TopologyProximity::new(&snapshot.input.nodes);
        let plan = schedule(&snapshot.input, &prox);
        snapshot.to_plan(&plan, &self.ledger.workload)
    }

    fn pass(&mut self, policy: Policy) -> LedgerResponse {
        let plan = self.plan(policy);
        self.apply(Command::Schedule(plan))
    }

    fn job(&self, id: JobId) -> &Job {
        &self.ledger.workload.jobs[&id]
    }

    fn exit_all(&mut self, id: JobId, code: i32) {
        let alloc = self.job(id).alloc.clone().expect("job holds GPUs");
        for rank in 0..alloc.nodes.len() as u32 {
            let r = self.apply(Command::RankExited {
                job: id,
                epoch: alloc.epoch,
                rank,
                exit_code: code,
                end: crate::workload::RankEnd::Exited,
            });
            assert_eq!(r, LedgerResponse::Ok);
        }
    }
}

fn job(tenant: &str, nodes: u32, gpus_per_node: u32) -> JobSpec {
    JobSpec {
        name: "train".into(),
        tenant: tenant.into(),
        nodes,
        gpus_per_node,
        gpu_model: None,
        time_limit_s: 3600,
        priority: 0,
        preemptible: true,
        command: vec!["true".into()],
        env: BTreeMap::new(),
        workdir: None,
        ckpt_interval_s: None,
        max_restarts: 1,
        same: None,
        max_rtt_ms: None,
        required_labels: BTreeMap::new(),
        ..Default::default()
    }
}

fn limits(max_gpus: Option<u32>, hours: Option<u64>, weight: u32) -> TenantLimits {
    TenantLimits {
        parent: None,
        max_gpus,
        gpu_seconds_limit: hours.map(|h| h * 3600),
        weight,
        ..TenantLimits::default()
    }
}

#[test]
fn nothing_to_schedule_only_while_no_job_waits_or_holds_gpus() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let idle = |r: &Replica| {
        let nothing = r.ledger.workload.nothing_to_schedule();
        if nothing {
            assert!(
                r.plan(Policy::HdrfPreempt).is_empty(),
                "a skipped pass had work"
            );
        }
        nothing
    };
    assert!(idle(&r), "no jobs");
    let id = r.submit(job(DEFAULT_TENANT, 2, 4));
    assert!(!idle(&r), "a job waits");
    r.pass(Policy::HdrfPreempt);
    assert!(r.job(id).alloc.is_some());
    assert!(!idle(&r), "a job holds GPUs");
    r.now_ms += 60_000;
    r.exit_all(id, 0);
    assert_eq!(r.job(id).state, JobState::Completed);
    assert!(idle(&r), "only a finished job");
    // One past its time limit still has work for the pass: timing it out.
    let id = r.submit(job(DEFAULT_TENANT, 1, 8));
    r.pass(Policy::HdrfPreempt);
    r.now_ms += r.job(id).spec.time_limit_s * 1000 + 1;
    assert!(!idle(&r));
    assert!(!r.plan(Policy::HdrfPreempt).is_empty(), "the time-out");
}

#[test]
fn a_job_runs_completes_and_charges_its_tenant() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let id = r.submit(job(DEFAULT_TENANT, 2, 4));
    assert_eq!(r.job(id).state, JobState::Pending);
    let LedgerResponse::Scheduled { started, refused } = r.pass(Policy::HdrfPreempt) else {
        panic!("not a schedule answer")
    };
    assert_eq!((started, refused), (vec![id], vec![]));
    let alloc = r.job(id).alloc.clone().expect("allocated");
    assert_eq!(
        alloc.epoch, r.index,
        "the epoch is the log index of the plan"
    );
    assert_eq!(alloc.gpu_count(), 8);
    r.now_ms += 60_000;
    r.exit_all(id, 0);
    let finished = r.job(id);
    assert_eq!(finished.state, JobState::Completed);
    assert_eq!(finished.exit_code, Some(0));
    assert!(finished.alloc.is_none());
    let tenant = &r.ledger.workload.tenants[DEFAULT_TENANT];
    assert_eq!(tenant.used_gpu_ms(), 8 * 60_000);
}

#[test]
fn a_stale_plan_never_double_books() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    let a = r.submit(job(DEFAULT_TENANT, 1, 8));
    let b = r.submit(job(DEFAULT_TENANT, 1, 8));
    // Two leaders planned from the same snapshot: the old one thinks `a`
    // fits, the new one placed `b` on the same GPUs first.
    let snapshot = SchedSnapshot::new(&r.ledger, r.now_ms, Policy::Fifo);
    let prox = TopologyProximity::new(&snapshot.input.nodes);
    let old_leader_plan = snapshot.to_plan(&schedule(&snapshot.input, &prox), &r.ledger.workload);
    let mut new_leader_plan = old_leader_plan.clone();
    new_leader_plan.placements[0].job = b;
    r.apply(Command::Schedule(new_leader_plan));
    let LedgerResponse::Scheduled { started, refused } =
        r.apply(Command::Schedule(old_leader_plan))
    else {
        panic!("not a schedule answer")
    };
    assert!(started.is_empty());
    assert_eq!(refused.len(), 1);
    assert!(refused[0].1.contains("already allocated"), "{refused:?}");
    assert_eq!(r.job(a).state, JobState::Pending);
    assert!(r.job(a).reason.starts_with("placement refused"));
}

#[test]
fn reports_from_an_old_epoch_are_fenced_off() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r2", 8), ("n3", "r3", 8)]);
    let id = r.submit(job(DEFAULT_TENANT, 1, 8));
    r.pass(Policy::Hdrf);
    let first = r.job(id).alloc.clone().expect("allocated");
    let node = first.nodes[0].0;
    r.apply(Command::SetMemberState {
        id: node,
        state: MemberState::Down,
    });
    assert_eq!(r.job(id).state, JobState::Requeued);
    assert_eq!(r.job(id).restarts, 1);
    let down = r.ledger.events.events.back().expect("a node_down event");
    assert_eq!(
        (down.spec.kind.as_str(), down.spec.node),
        ("node_down", Some(node))
    );
    // Not before the fencing lease of the lost node has run out.
    r.pass(Policy::Hdrf);
    assert!(r.job(id).alloc.is_none());
    r.now_ms += REPLACE_AFTER_NODE_LOSS_MS;
    r.pass(Policy::Hdrf);
    let second = r.job(id).alloc.clone().expect("re-allocated");
    assert!(second.epoch > first.epoch);
    assert_ne!(second.nodes[0].0, node);
    let stale = r.apply(Command::RankExited {
        job: id,
        epoch: first.epoch,
        rank: 0,
        exit_code: 1,
        end: crate::workload::RankEnd::Exited,
    });
    assert!(matches!(stale, LedgerResponse::Rejected(m) if m.contains("stale epoch")));
    assert_eq!(r.job(id).state, JobState::Running);
}

#[test]
fn preemption_requeues_the_victim_and_refunds_lost_work() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    r.apply(Command::CreateTenant {
        name: "batch".into(),
        limits: limits(None, None, 1),
    });
    r.apply(Command::CreateTenant {
        name: "prod".into(),
        limits: limits(None, None, 1),
    });
    let victim = r.submit(job("batch", 1, 8));
    r.pass(Policy::HdrfPreempt);
    let epoch = r.job(victim).alloc.as_ref().expect("running").epoch;
    r.now_ms += 600_000;
    r.apply(Command::CheckpointPart {
        job: victim,
        epoch,
        rank: 0,
        step: 100,
        part: CkptPart {
            manifest: vec![],
            bytes: 10,
            holders: vec![1],
        },
    });
    r.now_ms += 300_000;
    let urgent = r.submit(job("prod", 1, 8));
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(victim).state, JobState::Preempted);
    assert!(r.job(urgent).reason.contains("preempted job"));
    // While the victim stops, no second victim is chosen and nothing starts.
    let LedgerResponse::Scheduled { started, .. } = r.pass(Policy::HdrfPreempt) else {
        panic!()
    };
    assert!(started.is_empty());
    r.now_ms += 5_000;
    r.exit_all(victim, 143);
    let requeued = r.job(victim);
    assert_eq!(requeued.state, JobState::Requeued);
    assert_eq!(requeued.preemptions, 1);
    assert_eq!(requeued.last_ckpt_step, Some(100));
    let tenant = &r.ledger.workload.tenants["batch"];
    // 8 GPUs × 300 s since the checkpoint, up to the preemption request.
    assert_eq!(tenant.refunded_gpu_ms, 8 * 300_000);
    assert_eq!(tenant.charged_gpu_ms, 8 * 905_000);
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(urgent).state, JobState::Running);
}

/// A victim asked to stop whose node is then lost is requeued at once, but
/// placed again only after the fencing wait: the lost node may never have
/// heard of the stop, and its ranks run until they are fenced (chaos seed
/// 103 of the pause faults ran both epochs for 328 ms).
#[test]
fn a_stopping_job_whose_node_is_lost_waits_for_the_fence_too() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r2", 8)]);
    r.apply(Command::CreateTenant {
        name: "batch".into(),
        limits: limits(None, None, 1),
    });
    r.apply(Command::CreateTenant {
        name: "prod".into(),
        limits: limits(None, None, 1),
    });
    let victim = r.submit(job("batch", 2, 8));
    r.pass(Policy::HdrfPreempt);
    let first = r.job(victim).alloc.clone().expect("running");
    r.now_ms += 60_000;
    r.submit(job("prod", 2, 8));
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(victim).state, JobState::Preempted, "asked to stop");
    let lost = first.nodes[0].0;
    r.apply(Command::SetMemberState {
        id: lost,
        state: MemberState::Down,
    });
    let requeued = r.job(victim);
    assert!(requeued.alloc.is_none(), "released with the lost node");
    assert_eq!(
        requeued.not_before_ms,
        Some(r.now_ms + REPLACE_AFTER_NODE_LOSS_MS),
        "{requeued:?}"
    );
}

/// The issue's case, through the ledger: a tenant whose cap an admin raised
/// submits `--priority 1000000` with its own token. It preempts a job of
/// its own (priority ranks a tenant's jobs), never another tenant's at its
/// fair share, and does not overtake a tenant below its share.
#[test]
fn a_tenant_priority_of_a_million_neither_preempts_nor_overtakes_another_tenant() {
    let mut r = Replica::new(&[("n1", "r1", 4), ("n2", "r1", 4)]);
    for name in ["greedy", "calm"] {
        r.apply(Command::CreateTenant {
            name: name.into(),
            limits: limits(None, None, 1),
        });
    }
    let as_tenant = |r: &mut Replica, spec: JobSpec| match r.apply(Command::AsTenant {
        tenant: spec.tenant.clone(),
        cmd: Box::new(Command::SubmitJob { spec }),
    }) {
        LedgerResponse::JobId(id) => id,
        other => panic!("submit refused: {other:?}"),
    };
    let mut loud = job("greedy", 1, 4);
    loud.priority = 1_000_000;
    let refused = r.apply(Command::AsTenant {
        tenant: "greedy".into(),
        cmd: Box::new(Command::SubmitJob { spec: loud.clone() }),
    });
    assert!(
        matches!(&refused, LedgerResponse::Rejected(m) if m.contains("--max-priority")),
        "{refused:?}"
    );
    r.apply(Command::UpdateTenant {
        name: "greedy".into(),
        update: TenantUpdate {
            max_priority: Some(Some(i32::MAX)),
            ..Default::default()
        },
    });
    let g1 = as_tenant(&mut r, job("greedy", 1, 4));
    let c1 = as_tenant(&mut r, job("calm", 1, 4));
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(g1).state, JobState::Running);
    assert_eq!(r.job(c1).state, JobState::Running);

    let g2 = as_tenant(&mut r, loud.clone());
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(c1).state, JobState::Running, "{:?}", r.job(c1));
    assert_eq!(r.job(c1).preemptions, 0);
    assert_eq!(r.job(g1).state, JobState::Preempted);
    r.now_ms += 1_000;
    r.exit_all(g1, 143);
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(g2).state, JobState::Running);

    // Calm's job ends; a loud job of greedy waits first, a plain one of calm
    // comes after it. Calm holds nothing, greedy half the cluster: calm's
    // job gets the free GPUs.
    r.now_ms += 1_000;
    r.exit_all(c1, 0);
    let g3 = as_tenant(&mut r, loud);
    r.now_ms += 1_000;
    let c2 = as_tenant(&mut r, job("calm", 1, 4));
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(c2).state, JobState::Running, "{:?}", r.job(c2));
    assert!(r.job(g3).state.is_waiting());
    assert_eq!(r.job(g2).state, JobState::Running);
}

#[test]
fn admission_refuses_what_can_never_run() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    r.apply(Command::CreateTenant {
        name: "vision".into(),
        limits: limits(Some(4), Some(10), 1),
    });
    let too_big = r.apply(Command::SubmitJob {
        spec: job("vision", 1, 8),
    });
    assert!(matches!(too_big, LedgerResponse::Rejected(m) if m.starts_with("quota: ")));
    let mut long = job("vision", 1, 4);
    long.time_limit_s = 3 * 3600;
    let over_budget = r.apply(Command::SubmitJob { spec: long });
    assert!(matches!(over_budget, LedgerResponse::Rejected(m) if m.starts_with("budget: ")));
    let unknown = r.apply(Command::SubmitJob {
        spec: job("nobody", 1, 1),
    });
    assert!(matches!(unknown, LedgerResponse::Rejected(m) if m.contains("no tenant")));
}

#[test]
fn memory_and_cpus_per_rank_must_be_positive_when_given() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    r.apply(Command::CreateTenant {
        name: "vision".into(),
        limits: limits(None, None, 1),
    });
    let mut no_mem = job("vision", 1, 1);
    no_mem.mem_bytes = Some(0);
    let refused = r.apply(Command::SubmitJob { spec: no_mem });
    assert!(
        matches!(&refused, LedgerResponse::Rejected(m) if m.contains("--mem") && m.contains("positive")),
        "{refused:?}"
    );
    let mut no_cpus = job("vision", 1, 1);
    no_cpus.cpus_per_task = Some(0);
    let refused = r.apply(Command::SubmitJob { spec: no_cpus });
    assert!(
        matches!(&refused, LedgerResponse::Rejected(m) if m.contains("--cpus-per-task")),
        "{refused:?}"
    );
    let mut sized = job("vision", 1, 1);
    sized.mem_bytes = Some(16 << 30);
    sized.cpus_per_task = Some(8);
    let id = r.submit(sized);
    assert_eq!(r.job(id).spec.mem_bytes, Some(16 << 30));
    assert_eq!(r.job(id).spec.cpus_per_task, Some(8));
}

#[test]
fn tasks_per_node_must_share_the_gpus_equally() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    r.apply(Command::CreateTenant {
        name: "vision".into(),
        limits: limits(None, None, 1),
    });
    let mut uneven = job("vision", 1, 4);
    uneven.tasks_per_node = 3;
    let refused = r.apply(Command::SubmitJob { spec: uneven });
    assert!(
        matches!(&refused, LedgerResponse::Rejected(m) if m.contains("--ntasks-per-node")),
        "{refused:?}"
    );
    let mut absurd = job("vision", 1, 4);
    absurd.tasks_per_node = 4096;
    let refused = r.apply(Command::SubmitJob { spec: absurd });
    assert!(
        matches!(&refused, LedgerResponse::Rejected(_)),
        "{refused:?}"
    );
    let mut even = job("vision", 1, 4);
    even.tasks_per_node = 2;
    let id = r.submit(even);
    assert_eq!(r.job(id).spec.tasks_per_node(), 2);
    // The default, 0, is one process per node.
    let id = r.submit(job("vision", 1, 1));
    assert_eq!(r.job(id).spec.tasks_per_node(), 1);
}

#[test]
fn tenant_trees_refuse_cycles() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    r.apply(Command::CreateTenant {
        name: "org".into(),
        limits: limits(None, None, 1),
    });
    let mut team = limits(None, None, 2);
    team.parent = Some("org".into());
    assert_eq!(
        r.apply(Command::CreateTenant {
            name: "team".into(),
            limits: team
        }),
        LedgerResponse::Ok
    );
    let cycle = r.apply(Command::UpdateTenant {
        name: "org".into(),
        update: TenantUpdate {
            parent: Some(Some("team".into())),
            ..Default::default()
        },
    });
    assert!(matches!(cycle, LedgerResponse::Rejected(m) if m.contains("cycle")));
}

#[test]
fn cancelling_a_running_job_waits_for_its_ranks() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    let id = r.submit(job(DEFAULT_TENANT, 1, 2));
    r.pass(Policy::Hdrf);
    r.apply(Command::CancelJob { job: id });
    assert_eq!(r.job(id).state, JobState::Running);
    let epoch = r
        .job(id)
        .alloc
        .as_ref()
        .map(|a| a.epoch)
        .unwrap_or_default();
    let early = r.apply(Command::ReleaseJob { job: id, epoch });
    assert!(matches!(early, LedgerResponse::Rejected(_)));
    r.now_ms += STOP_DEADLINE_MS;
    assert_eq!(
        r.apply(Command::ReleaseJob { job: id, epoch }),
        LedgerResponse::Ok
    );
    assert_eq!(r.job(id).state, JobState::Cancelled);
}

#[test]
fn the_time_limit_stops_a_job() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    let mut spec = job(DEFAULT_TENANT, 1, 2);
    spec.time_limit_s = 60;
    let id = r.submit(spec);
    r.pass(Policy::Hdrf);
    r.now_ms += 61_000;
    r.pass(Policy::Hdrf);
    assert!(r.job(id).reason.contains("time limit"));
    r.exit_all(id, 143);
    assert_eq!(r.job(id).state, JobState::Timeout);
    assert_eq!(r.job(id).reason, "time limit reached (0:01:00)");
    assert!(r.job(id).state.is_final());
}

#[test]
fn decay_halves_per_half_life() {
    let mut tenant = apply::new_tenant("t", TenantLimits::default(), 1_000);
    tenant.fair_usage_gpu_ms = 1_000;
    apply::decay_fair_usage(&mut tenant, FAIR_SHARE_HALF_LIFE_MS * 2 + 1_000 + 5);
    assert_eq!(tenant.fair_usage_gpu_ms, 250);
    assert_eq!(tenant.fair_usage_at_ms, FAIR_SHARE_HALF_LIFE_MS * 2 + 1_000);
}

/// A random cluster and job stream, driven through the ledger with the
/// scheduler in the loop and random exits, cancels, node failures and
/// recoveries.
#[derive(Clone, Debug)]
enum Event {
    Submit {
        tenant: usize,
        nodes: u32,
        gpus: u32,
        limit_s: u64,
        priority: i32,
    },
    Pass(Policy),
    ExitAll {
        pick: usize,
        code: i32,
    },
    Cancel {
        pick: usize,
    },
    NodeState {
        node: u64,
        down: bool,
    },
    Tick(u64),
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0usize..3, 1u32..4, 1u32..9, 60u64..7200, 0i32..3).prop_map(
            |(tenant, nodes, gpus, limit_s, priority)| Event::Submit {
                tenant,
                nodes,
                gpus,
                limit_s,
                priority
            }
        ),
        4 => prop::sample::select(vec![Policy::Fifo, Policy::Hdrf, Policy::HdrfPreempt])
            .prop_map(Event::Pass),
        2 => (0usize..50, prop::sample::select(vec![0, 1, 143]))
            .prop_map(|(pick, code)| Event::ExitAll { pick, code }),
        1 => (0usize..50).prop_map(|pick| Event::Cancel { pick }),
        1 => (1u64..7, any::<bool>()).prop_map(|(node, down)| Event::NodeState { node, down }),
        2 => (1u64..4000).prop_map(Event::Tick),
    ]
}

const TENANTS: [&str; 3] = ["a", "b", "c"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn ledger_scheduling_keeps_the_invariants(events in prop::collection::vec(arb_event(), 1..80)) {
        let mut r = Replica::new(&[
            ("n1", "r1", 8), ("n2", "r1", 8), ("n3", "r2", 8),
            ("n4", "r2", 4), ("n5", "r3", 8), ("n6", "r3", 2),
        ]);
        r.apply(Command::CreateTenant { name: "a".into(), limits: limits(Some(16), None, 1) });
        r.apply(Command::CreateTenant { name: "b".into(), limits: limits(None, Some(40), 2) });
        let mut c = limits(Some(8), None, 1);
        c.parent = Some("a".into());
        r.apply(Command::CreateTenant { name: "c".into(), limits: c });
        let mut twin = Replica { ledger: r.ledger.clone(), index: r.index, now_ms: r.now_ms };
        for event in events {
            let cmd_list: Vec<Command> = match event {
                Event::Submit { tenant, nodes, gpus, limit_s, priority } => {
                    let mut spec = job(TENANTS[tenant], nodes, gpus);
                    spec.time_limit_s = limit_s;
                    spec.priority = priority;
                    vec![Command::SubmitJob { spec }]
                }
                Event::Pass(policy) => vec![Command::Schedule(r.plan(policy))],
                Event::ExitAll { pick, code } => {
                    let holding: Vec<_> = r.ledger.workload.holding()
                        .map(|(job, alloc)| (job.id, alloc.clone())).collect();
                    match holding.get(pick % holding.len().max(1)) {
                        Some((id, alloc)) => (0..alloc.nodes.len() as u32)
                            .map(|rank| Command::RankExited { job: *id, epoch: alloc.epoch, rank, exit_code: code, end: crate::workload::RankEnd::Exited })
                            .collect(),
                        None => vec![],
                    }
                }
                Event::Cancel { pick } => {
                    let ids: Vec<JobId> = r.ledger.workload.jobs.keys().copied().collect();
                    ids.get(pick % ids.len().max(1)).map(|id| vec![Command::CancelJob { job: *id }]).unwrap_or_default()
                }
                Event::NodeState { node, down } => vec![Command::SetMemberState {
                    id: node,
                    state: if down { MemberState::Down } else { MemberState::Alive },
                }],
                Event::Tick(s) => { r.now_ms += s * 1000; twin.now_ms = r.now_ms; vec![] }
            };
            for cmd in cmd_list {
                let a = r.apply(cmd.clone());
                let b = twin.apply(cmd);
                prop_assert_eq!(a, b);
            }
            check_invariants(&r.ledger)?;
        }
        prop_assert_eq!(&r.ledger, &twin.ledger);
    }
}

fn check_invariants(ledger: &Ledger) -> Result<(), TestCaseError> {
    let workload = &ledger.workload;
    let mut booked = BTreeSet::new();
    for (job, alloc) in workload.holding() {
        // Gangs are whole.
        prop_assert_eq!(alloc.nodes.len(), job.spec.nodes as usize);
        for (node, gpus) in &alloc.nodes {
            prop_assert_eq!(gpus.len(), job.spec.gpus_per_node as usize);
            let member = &ledger.members[node];
            for gpu in gpus {
                prop_assert!(member.spec.gpus.iter().any(|g| g.index == *gpu));
                // No GPU double-booked.
                prop_assert!(
                    booked.insert((*node, *gpu)),
                    "GPU {}/{} double-booked",
                    node,
                    gpu
                );
            }
        }
        prop_assert!(!job.state.is_waiting() && !job.state.is_final());
    }
    // Tenant caps hold for every subtree.
    let held = workload.gpus_in_use();
    for (name, tenant) in &workload.tenants {
        if let Some(max) = tenant.limits.max_gpus {
            let in_use: u32 = workload
                .subtree(name)
                .iter()
                .map(|t| held.get(t).copied().unwrap_or(0))
                .sum();
            prop_assert!(in_use <= max, "{} holds {} > {}", name, in_use, max);
        }
        if let Some(limit) = tenant.limits.gpu_seconds_limit {
            let committed: u64 = workload
                .subtree(name)
                .iter()
                .map(|t| workload.committed_gpu_seconds(t))
                .sum();
            prop_assert!(
                committed <= limit,
                "{} committed {} > {}",
                name,
                committed,
                limit
            );
        }
    }
    // Every waiting job says why.
    for job in workload.jobs.values() {
        if job.state.is_waiting() {
            prop_assert!(
                !job.reason.is_empty(),
                "job {} waits without a reason",
                job.id
            );
        }
    }
    Ok(())
}

#[test]
fn a_checkpoint_commits_when_every_rank_has_its_part_and_old_ones_are_dropped() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let id = r.submit(job(DEFAULT_TENANT, 2, 1));
    r.pass(Policy::Hdrf);
    let epoch = r.job(id).alloc.as_ref().expect("running").epoch;
    let part = |holders: Vec<u64>| CkptPart {
        manifest: vec![1, 2, 3],
        bytes: 100,
        holders,
    };
    for step in 1..=5u64 {
        r.now_ms += 1_000;
        r.apply(Command::CheckpointPart {
            job: id,
            epoch,
            rank: 0,
            step,
            part: part(vec![1, 2]),
        });
        assert_eq!(r.job(id).last_ckpt_step, (step > 1).then(|| step - 1));
        r.apply(Command::CheckpointPart {
            job: id,
            epoch,
            rank: 1,
            step,
            part: part(vec![2, 1]),
        });
        assert_eq!(r.job(id).last_ckpt_step, Some(step));
    }
    let catalog = &r.ledger.workload.checkpoints[&id];
    let steps: Vec<u64> = catalog.iter().map(|c| c.step).collect();
    assert_eq!(steps, [3, 4, 5]);
    assert_eq!(catalog[2].replicas(), [1, 2]);
    assert_eq!(catalog[2].bytes(), 200);
    let stale = r.apply(Command::CheckpointPart {
        job: id,
        epoch: epoch - 1,
        rank: 0,
        step: 9,
        part: part(vec![1]),
    });
    assert!(matches!(stale, LedgerResponse::Rejected(m) if m.contains("stale epoch")));
    // Re-replication records new holders, deduplicated, for committed parts only.
    let moved = r.apply(Command::SetCheckpointHolders {
        job: id,
        step: 5,
        rank: 0,
        holders: vec![2, 2, 1],
    });
    assert_eq!(moved, LedgerResponse::Ok);
    assert_eq!(
        r.ledger.workload.checkpoints[&id][2].parts[&0].holders,
        [2, 1]
    );
    let missing = r.apply(Command::SetCheckpointHolders {
        job: id,
        step: 99,
        rank: 0,
        holders: vec![1],
    });
    assert!(matches!(missing, LedgerResponse::Rejected(_)));
}

#[test]
fn draining_a_node_moves_its_gangs_and_keeps_new_work_away() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let id = r.submit(job(DEFAULT_TENANT, 1, 8));
    r.pass(Policy::Hdrf);
    let node = r.job(id).alloc.as_ref().expect("running").nodes[0].0;
    r.apply(Command::SetDrain {
        id: node,
        drain: true,
    });
    assert!(r.job(id).reason.contains("draining"));
    r.exit_all(id, 0);
    assert_eq!(r.job(id).state, JobState::Requeued);
    assert_eq!(r.job(id).restarts, 0, "a drain is not a failure");
    r.pass(Policy::Hdrf);
    let moved = r.job(id).alloc.as_ref().expect("re-placed").nodes[0].0;
    assert_ne!(moved, node);
    let other = r.submit(job(DEFAULT_TENANT, 1, 1));
    r.pass(Policy::Hdrf);
    assert!(
        r.job(other).alloc.is_none(),
        "nothing lands on a drained node"
    );
    r.apply(Command::SetDrain {
        id: node,
        drain: false,
    });
    r.pass(Policy::Hdrf);
    assert_eq!(
        r.job(other).alloc.as_ref().expect("placed").nodes[0].0,
        node
    );
}

#[test]
fn a_faulty_gpu_moves_its_gang_and_takes_no_work_until_returned() {
    use crate::ledger::GpuFaultReport;
    let mut r = Replica::new(&[("n1", "r1", 2)]);
    let id = r.submit(job(DEFAULT_TENANT, 1, 1));
    r.pass(Policy::Hdrf);
    let (node, gpus) = r.job(id).alloc.as_ref().expect("running").nodes[0].clone();
    let bad = gpus[0];
    let fault = |reason: &str| {
        Some(GpuFaultReport {
            reason: reason.into(),
            detected: true,
        })
    };
    let missing = r.apply(Command::SetGpuFault {
        node,
        gpu: 9,
        fault: fault("XID 79"),
    });
    assert!(
        matches!(missing, LedgerResponse::Rejected(_)),
        "{missing:?}"
    );
    r.apply(Command::SetGpuFault {
        node,
        gpu: bad,
        fault: fault("XID 79: fell off the bus"),
    });
    assert!(r.job(id).reason.contains("GPU"), "{}", r.job(id).reason);
    // A repeated report keeps the first reason.
    r.apply(Command::SetGpuFault {
        node,
        gpu: bad,
        fault: fault("again"),
    });
    assert_eq!(
        r.ledger
            .workload
            .gpu_fault(node, bad)
            .map(|f| f.reason.as_str()),
        Some("XID 79: fell off the bus")
    );
    r.exit_all(id, 137);
    assert_eq!(r.job(id).state, JobState::Requeued);
    assert_eq!(
        r.job(id).restarts,
        0,
        "a broken GPU is not the job's failure"
    );
    r.pass(Policy::Hdrf);
    let moved = r.job(id).alloc.clone().expect("re-placed");
    assert!(
        !moved.nodes[0].1.contains(&bad),
        "placed on the faulty GPU again"
    );
    // The node's other GPU is taken: nothing is left for a second job.
    let other = r.submit(job(DEFAULT_TENANT, 1, 1));
    r.pass(Policy::Hdrf);
    assert!(r.job(other).alloc.is_none(), "work landed on a faulty GPU");
    r.apply(Command::SetGpuFault {
        node,
        gpu: bad,
        fault: None,
    });
    r.pass(Policy::Hdrf);
    assert_eq!(
        r.job(other).alloc.as_ref().expect("placed").nodes[0].1,
        vec![bad]
    );
}

#[test]
fn a_rank_that_crashed_on_a_failing_gpu_is_not_charged_a_restart() {
    use crate::ledger::GpuFaultReport;
    let mut r = Replica::new(&[("n1", "r1", 4), ("n2", "r1", 4)]);
    let mut spec = job(DEFAULT_TENANT, 2, 1);
    spec.max_restarts = 0;
    let id = r.submit(spec);
    r.pass(Policy::Hdrf);
    let alloc = r.job(id).alloc.clone().expect("placed");
    let (node, gpus) = alloc.nodes[1].clone();
    // The rank dies before its node has judged the GPU.
    r.apply(Command::RankExited {
        job: id,
        epoch: alloc.epoch,
        rank: 1,
        exit_code: 134,
        end: crate::workload::RankEnd::Exited,
    });
    r.apply(Command::SetGpuFault {
        node,
        gpu: gpus[0],
        fault: Some(GpuFaultReport {
            reason: "XID 79: fell off the bus".into(),
            detected: true,
        }),
    });
    r.apply(Command::RankExited {
        job: id,
        epoch: alloc.epoch,
        rank: 0,
        exit_code: 143,
        end: crate::workload::RankEnd::Exited,
    });
    assert_eq!(r.job(id).state, JobState::Requeued, "{}", r.job(id).reason);
    assert_eq!(r.job(id).restarts, 0);
}

#[test]
fn a_failed_rank_restarts_the_whole_gang_until_the_restarts_run_out() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let mut spec = job(DEFAULT_TENANT, 2, 4);
    spec.max_restarts = 1;
    spec.requeue = true;
    let id = r.submit(spec);
    r.pass(Policy::Hdrf);
    let first = r.job(id).alloc.clone().expect("placed");
    // Rank 1 fails; rank 0 is asked to stop and exits on SIGTERM.
    let fail = |r: &mut Replica, epoch: u64| {
        for (rank, code) in [(1, 137), (0, 143)] {
            let answer = r.apply(Command::RankExited {
                job: id,
                epoch,
                rank,
                exit_code: code,
                end: crate::workload::RankEnd::Exited,
            });
            assert_eq!(answer, LedgerResponse::Ok);
        }
    };
    fail(&mut r, first.epoch);
    assert_eq!(r.job(id).state, JobState::Requeued);
    assert_eq!(r.job(id).restarts, 1);
    assert_eq!(
        r.job(id).reason,
        "a rank exited with code 137; restart 1 of 1"
    );
    r.pass(Policy::Hdrf);
    let second = r.job(id).alloc.clone().expect("placed again");
    assert!(second.epoch > first.epoch, "a new epoch fences the old one");
    fail(&mut r, second.epoch);
    assert_eq!(r.job(id).state, JobState::Failed);
    assert_eq!(r.job(id).exit_code, Some(137));
}

/// A member named `name` with `count` GPUs of `model` and the given labels.
fn member_with(name: &str, count: u32, model: &str, labels: &[(&str, &str)]) -> MemberSpec {
    MemberSpec {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        gpus: gpus(count, model),
        ..member(name, "r1", count)
    }
}

/// A replica whose members are exactly `members` (the first bootstraps).
fn replica_of(members: Vec<MemberSpec>) -> Replica {
    let mut r = Replica::new(&[("seed", "r1", 0)]);
    r.ledger.members.clear();
    for spec in members {
        let id = r.ledger.members.len() as u64 + 1;
        r.ledger.members.insert(
            id,
            crate::ledger::Member {
                id,
                spec,
                state: MemberState::Alive,
                joined_at_ms: 0,
                state_since_ms: 0,
            },
        );
    }
    r
}

fn submit_answer(r: &mut Replica, spec: JobSpec) -> Result<JobId, String> {
    match r.apply(Command::SubmitJob { spec }) {
        LedgerResponse::JobId(id) => Ok(id),
        LedgerResponse::Rejected(reason) => Err(reason),
        other => panic!("unexpected answer {other:?}"),
    }
}

#[test]
fn a_request_no_member_could_ever_host_is_refused_with_the_reason() {
    let h100 = |name: &str| member_with(name, 8, "H100-80GB", &[("zone", "a")]);
    let mut r = replica_of(vec![
        h100("n1"),
        h100("n2"),
        member_with("n3", 4, "H100-80GB", &[]),
    ]);
    let nine = job(DEFAULT_TENANT, 1, 9);
    assert_eq!(
        submit_answer(&mut r, nine),
        Err("no node has 9 GPUs (largest: 8 × H100-80GB)".into())
    );
    let mut a100 = job(DEFAULT_TENANT, 1, 8);
    a100.gpu_model = Some("A100".into());
    assert_eq!(
        submit_answer(&mut r, a100),
        Err("no node has GPU model A100 (models: H100-80GB)".into())
    );
    let mut zone = job(DEFAULT_TENANT, 1, 1);
    zone.required_labels = [("zone".to_string(), "x".to_string())].into();
    assert_eq!(
        submit_answer(&mut r, zone),
        Err("no node carries label zone=x".into())
    );
    let mut labelled = job(DEFAULT_TENANT, 3, 8);
    labelled.required_labels = [("zone".to_string(), "a".to_string())].into();
    let refused = submit_answer(&mut r, labelled.clone()).expect_err("only 2 nodes in zone a");
    assert!(
        refused.contains("needs 3 nodes") && refused.contains("only 2"),
        "{refused}"
    );
    let mut big = job(DEFAULT_TENANT, 1, 6);
    big.required_labels = BTreeMap::new();
    big.nodes = 3;
    let refused = submit_answer(&mut r, big).expect_err("n3 has only 4 GPUs");
    assert!(
        refused.contains("only 2 of the cluster's 3 nodes"),
        "{refused}"
    );
    // What fits somewhere, busy or not, is admitted.
    labelled.nodes = 2;
    assert!(submit_answer(&mut r, labelled).is_ok());
    assert!(submit_answer(&mut r, job(DEFAULT_TENANT, 3, 4)).is_ok());
    let mut short = job(DEFAULT_TENANT, 2, 8);
    short.gpu_model = Some("h100".into());
    assert!(submit_answer(&mut r, short).is_ok());
}

#[test]
fn a_node_that_is_down_still_counts_at_submit_and_one_that_left_does_not() {
    let mut r = replica_of(vec![
        member_with("n1", 8, "H100-80GB", &[]),
        member_with("n2", 8, "H100-80GB", &[]),
    ]);
    r.ledger.members.get_mut(&2).expect("n2").state = MemberState::Down;
    assert!(submit_answer(&mut r, job(DEFAULT_TENANT, 2, 8)).is_ok());
    r.ledger.members.get_mut(&2).expect("n2").state = MemberState::Left;
    let refused = submit_answer(&mut r, job(DEFAULT_TENANT, 2, 8)).expect_err("one node left");
    assert!(
        refused.contains("only 1 of the cluster's 1 nodes"),
        "{refused}"
    );
}

#[test]
fn a_short_model_name_is_placed_on_the_matching_model() {
    let mut r = replica_of(vec![
        member_with("n1", 4, "A100-SXM4-80GB", &[]),
        member_with("n2", 4, "H100-SXM5-80GB", &[]),
    ]);
    for (wanted, model) in [("h100", "H100-SXM5-80GB"), ("a100-80gb", "A100-SXM4-80GB")] {
        let mut spec = job(DEFAULT_TENANT, 1, 4);
        spec.gpu_model = Some(wanted.into());
        let id = r.submit(spec);
        r.pass(Policy::Hdrf);
        let alloc = r.job(id).alloc.clone().expect("placed");
        let node = &r.ledger.members[&alloc.nodes[0].0];
        assert_eq!(node.spec.gpus[0].model, model, "{wanted}");
        r.exit_all(id, 0);
        assert_eq!(r.job(id).state, JobState::Completed);
    }
}

#[test]
fn a_ranks_own_failure_ends_the_job_without_a_restart_by_default() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let mut spec = job(DEFAULT_TENANT, 2, 4);
    spec.max_restarts = 3;
    let id = r.submit(spec);
    r.pass(Policy::Hdrf);
    let alloc = r.job(id).alloc.clone().expect("placed");
    for (rank, code) in [(0, 3), (1, 143)] {
        r.apply(Command::RankExited {
            job: id,
            epoch: alloc.epoch,
            rank,
            exit_code: code,
            end: crate::workload::RankEnd::Exited,
        });
    }
    let job = r.job(id);
    assert_eq!(job.state, JobState::Failed, "{}", job.reason);
    assert_eq!(job.exit_code, Some(3));
    assert_eq!(job.restarts, 0);
    assert_eq!(job.reason, "a rank exited with code 3");
    // Charged once.
    assert!(r.ledger.workload.tenants[DEFAULT_TENANT].charged_gpu_ms <= 8 * 1_000);
}

#[test]
fn node_loss_restarts_until_the_restarts_run_out_then_ends_node_fail() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r2", 8), ("n3", "r3", 8)]);
    let mut spec = job(DEFAULT_TENANT, 1, 8);
    spec.max_restarts = 1;
    let id = r.submit(spec);
    r.pass(Policy::Hdrf);
    let lose = |r: &mut Replica| {
        let node = r.job(id).alloc.as_ref().expect("placed").nodes[0].0;
        r.apply(Command::SetMemberState {
            id: node,
            state: MemberState::Down,
        });
    };
    lose(&mut r);
    assert_eq!(r.job(id).state, JobState::Requeued);
    r.now_ms += REPLACE_AFTER_NODE_LOSS_MS;
    r.pass(Policy::Hdrf);
    lose(&mut r);
    let lost = r.job(id);
    assert_eq!(lost.state, JobState::NodeFail, "{}", lost.reason);
    assert!(lost.state.is_final() && lost.ended_at_ms.is_some());
    assert!(lost.reason.contains("no restarts left"), "{}", lost.reason);

    // With no restart allowed, the first loss ends it.
    let mut spec = job_spec_no_restarts();
    spec.nodes = 1;
    let other = r.submit(spec);
    r.pass(Policy::Hdrf);
    let node = r.job(other).alloc.as_ref().expect("placed").nodes[0].0;
    r.apply(Command::SetMemberState {
        id: node,
        state: MemberState::Down,
    });
    assert_eq!(r.job(other).state, JobState::NodeFail);
}

fn job_spec_no_restarts() -> JobSpec {
    let mut spec = job(DEFAULT_TENANT, 1, 8);
    spec.max_restarts = 0;
    spec
}

#[test]
fn an_oom_killed_rank_ends_the_job_out_of_memory() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let id = r.submit(job(DEFAULT_TENANT, 2, 4));
    r.pass(Policy::Hdrf);
    let alloc = r.job(id).alloc.clone().expect("placed");
    for (rank, code, oom) in [(1, 137, true), (0, 143, false)] {
        r.apply(Command::RankExited {
            job: id,
            epoch: alloc.epoch,
            rank,
            exit_code: code,
            end: if oom {
                RankEnd::OomKilled
            } else {
                RankEnd::Exited
            },
        });
    }
    let ended = r.job(id);
    assert_eq!(ended.state, JobState::OutOfMemory, "{}", ended.reason);
    assert_eq!(ended.exit_code, Some(137));
    assert!(
        ended.reason.contains("OOM killer ended rank 1"),
        "{}",
        ended.reason
    );

    // A rank that still exited 0 did not die of it.
    let id = r.submit(job(DEFAULT_TENANT, 1, 4));
    r.pass(Policy::Hdrf);
    let alloc = r.job(id).alloc.clone().expect("placed");
    r.apply(Command::RankExited {
        job: id,
        epoch: alloc.epoch,
        rank: 0,
        exit_code: 0,
        end: RankEnd::OomKilled,
    });
    assert_eq!(r.job(id).state, JobState::Completed);
}

#[test]
fn job_states_round_trip_through_their_names() {
    for state in JobState::ALL {
        assert_eq!(JobState::parse(state.as_str()), Some(state));
    }
    assert_eq!(JobState::NodeFail.as_str(), "node_fail");
    assert_eq!(JobState::OutOfMemory.as_str(), "out_of_memory");
}

proptest! {
    /// The submit check admits a request exactly when enough current
    /// members each have enough GPUs of one matching model.
    #[test]
    fn submit_admits_exactly_what_some_members_could_host(
        nodes in proptest::collection::vec((0u32..9, 0usize..3, any::<bool>()), 1..6),
        want_nodes in 1u32..5,
        want_gpus in 1u32..10,
        want_model in proptest::option::of(0usize..4),
    ) {
        let models = ["H100-80GB", "A100-SXM4-80GB", "L4"];
        let asked = ["h100", "A100-80GB", "l4", "B200"];
        let members: Vec<MemberSpec> = nodes
            .iter()
            .enumerate()
            .map(|(i, (count, model, _))| member_with(&format!("n{i}"), *count, models[*model], &[]))
            .collect();
        let mut r = replica_of(members);
        for (i, (_, _, down)) in nodes.iter().enumerate() {
            if *down {
                r.ledger.members.get_mut(&(i as u64 + 1)).expect("member").state = MemberState::Down;
            }
        }
        let mut spec = job(DEFAULT_TENANT, want_nodes, want_gpus);
        spec.gpu_model = want_model.map(|m| asked[m].to_string());
        let hosts = nodes
            .iter()
            .filter(|(count, model, _)| {
                *count >= want_gpus
                    && spec
                        .gpu_model
                        .as_deref()
                        .is_none_or(|w| crate::sched::gpu_model_matches(w, models[*model]))
            })
            .count() as u32;
        let answer = submit_answer(&mut r, spec);
        prop_assert_eq!(answer.is_ok(), hosts >= want_nodes, "{:?}", answer);
    }
}

#[test]
fn a_rank_lost_with_its_agent_restarts_like_node_loss() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let mut spec = job(DEFAULT_TENANT, 2, 4);
    spec.max_restarts = 1;
    let id = r.submit(spec);
    let lose = |r: &mut Replica| {
        r.pass(Policy::Hdrf);
        let alloc = r.job(id).alloc.clone().expect("placed");
        for (rank, code, end) in [(1, 137, RankEnd::Lost), (0, 143, RankEnd::Exited)] {
            r.apply(Command::RankExited {
                job: id,
                epoch: alloc.epoch,
                rank,
                exit_code: code,
                end,
            });
        }
    };
    lose(&mut r);
    assert_eq!(r.job(id).state, JobState::Requeued, "{}", r.job(id).reason);
    assert_eq!(r.job(id).restarts, 1);
    lose(&mut r);
    assert_eq!(r.job(id).state, JobState::NodeFail, "{}", r.job(id).reason);
}

#[test]
fn dependencies_holds_and_singletons_keep_jobs_from_the_scheduler() {
    use crate::workload::{Dependency, DependencyKind};
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    r.apply(Command::CreateTenant {
        name: "vision".into(),
        limits: limits(None, None, 1),
    });
    r.apply(Command::CreateTenant {
        name: "nlp".into(),
        limits: limits(None, None, 1),
    });
    let first = r.submit(job("vision", 1, 1));
    let after = |kind, job| Dependency { kind, job };
    let mut ok = job("vision", 1, 1);
    ok.dependencies = vec![after(DependencyKind::AfterOk, first)];
    let on_ok = r.submit(ok);
    let mut not_ok = job("vision", 1, 1);
    not_ok.dependencies = vec![after(DependencyKind::AfterNotOk, first)];
    let on_fail = r.submit(not_ok);
    let mut started = job("vision", 1, 1);
    started.dependencies = vec![after(DependencyKind::After, first)];
    let on_start = r.submit(started);
    // Another tenant's job cannot be named, nor a job that does not exist.
    for missing in [first, 999] {
        let mut other = job("nlp", 1, 1);
        other.dependencies = vec![after(DependencyKind::AfterAny, missing)];
        let refused = r.apply(Command::SubmitJob { spec: other });
        assert!(
            matches!(&refused, LedgerResponse::Rejected(m) if m.contains(&format!("no job {missing}"))),
            "{refused:?}"
        );
    }
    r.pass(Policy::Fifo);
    assert!(r.job(first).alloc.is_some());
    assert!(r.job(on_ok).state.is_waiting());
    assert!(r
        .job(on_ok)
        .user_hold(&r.ledger.workload.jobs)
        .is_some_and(|w| w.contains(&format!("job {first} to complete"))));
    // `after` is met once the job started.
    r.pass(Policy::Fifo);
    assert!(r.job(on_start).alloc.is_some());
    r.exit_all(first, 0);
    r.pass(Policy::Fifo);
    assert!(r.job(on_ok).alloc.is_some(), "afterok runs after a success");
    let never = r.job(on_fail).user_hold(&r.ledger.workload.jobs);
    assert!(
        never
            .as_deref()
            .is_some_and(|w| w.starts_with("dependency never satisfied")),
        "{never:?}"
    );
    assert!(r.job(on_fail).alloc.is_none());

    // Hold and release.
    let held = r.submit(job("vision", 1, 1));
    assert_eq!(
        r.apply(Command::HoldJob {
            job: held,
            hold: true
        }),
        LedgerResponse::Ok
    );
    r.pass(Policy::Fifo);
    assert!(r.job(held).alloc.is_none() && r.job(held).held);
    assert!(matches!(
        r.apply(Command::HoldJob {
            job: first,
            hold: true
        }),
        LedgerResponse::Rejected(_)
    ));
    assert_eq!(
        r.apply(Command::HoldJob {
            job: held,
            hold: false
        }),
        LedgerResponse::Ok
    );
    r.pass(Policy::Fifo);
    assert!(r.job(held).alloc.is_some());

    // Singleton: one at a time per name and tenant, in submit order.
    let mut one = job("vision", 1, 1);
    one.name = "nightly".into();
    one.singleton = true;
    let a = r.submit(one.clone());
    let b = r.submit(one.clone());
    let mut other_tenant = one.clone();
    other_tenant.tenant = "nlp".into();
    let c = r.submit(other_tenant);
    r.pass(Policy::Fifo);
    r.pass(Policy::Fifo);
    assert!(r.job(a).alloc.is_some() && r.job(c).alloc.is_some());
    assert!(r.job(b).alloc.is_none());
    r.exit_all(a, 0);
    r.pass(Policy::Fifo);
    assert!(r.job(b).alloc.is_some());
}

#[test]
fn dependency_lists_read_like_slurm() {
    use crate::workload::{Dependency, DependencyKind};
    let (deps, singleton) =
        Dependency::parse_list("afterok:3:4,afterany:5,singleton").expect("parses");
    assert!(singleton);
    assert_eq!(
        deps,
        [
            Dependency {
                kind: DependencyKind::AfterOk,
                job: 3
            },
            Dependency {
                kind: DependencyKind::AfterOk,
                job: 4
            },
            Dependency {
                kind: DependencyKind::AfterAny,
                job: 5
            },
        ]
    );
    assert_eq!(
        Dependency::format_list(&deps, singleton),
        "afterok:3,afterok:4,afterany:5,singleton"
    );
    for bad in [
        "afterok",
        "afterok:x",
        "later:3",
        "afterok:3?afterany:4",
        "",
        "after:3+5",
    ] {
        assert!(Dependency::parse_list(bad).is_err(), "{bad}");
    }
}

#[test]
fn warn_signals_read_like_slurm() {
    use crate::workload::WarnSignal;
    let ws = |s: &str| WarnSignal::parse(s).map(|w| (w.signal, w.before_s));
    assert_eq!(ws("USR1@300"), Ok((10, 300)));
    assert_eq!(ws("B:SIGUSR2"), Ok((12, 60)));
    assert_eq!(ws("R:10@5"), Ok((10, 5)));
    assert_eq!(ws("term@0"), Ok((15, 0)));
    for bad in ["KILL", "9", "STOP@5", "USR1@x", "", "USR1@99999"] {
        assert!(WarnSignal::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(
        WarnSignal::parse("SIGUSR1@90").map(|w| w.display()),
        Ok("USR1@90".into())
    );
}

fn id_of(r: &Replica, name: &str) -> NodeId {
    r.ledger
        .members
        .values()
        .find(|m| m.spec.name == name)
        .map(|m| m.id)
        .unwrap_or_else(|| panic!("no member {name}"))
}

fn choice(only: Vec<NodeId>, exclude: Vec<NodeId>, exclusive: bool) -> NodeChoice {
    NodeChoice {
        only,
        exclude,
        exclusive,
    }
    .normalized()
}

fn placed_on(r: &Replica, id: JobId) -> Vec<NodeId> {
    r.job(id)
        .alloc
        .as_ref()
        .map(|a| a.nodes.iter().map(|(n, _)| *n).collect())
        .unwrap_or_default()
}

fn refusal(r: &mut Replica, spec: JobSpec) -> String {
    match r.apply(Command::SubmitJob { spec }) {
        LedgerResponse::Rejected(why) => why,
        other => panic!("accepted: {other:?}"),
    }
}

#[test]
fn a_nodelist_pins_the_gang_and_an_exclude_keeps_it_off() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8), ("n3", "r1", 8)]);
    let (n1, n2, n3) = (id_of(&r, "n1"), id_of(&r, "n2"), id_of(&r, "n3"));
    let pinned = r.submit(JobSpec {
        choice: choice(vec![n3, n2], vec![], false),
        ..job(DEFAULT_TENANT, 2, 1)
    });
    let away = r.submit(JobSpec {
        choice: choice(vec![], vec![n1, n2], false),
        ..job(DEFAULT_TENANT, 1, 1)
    });
    r.pass(Policy::Fifo);
    let mut on = placed_on(&r, pinned);
    on.sort_unstable();
    assert_eq!(on, vec![n2, n3]);
    assert_eq!(placed_on(&r, away), vec![n3]);
    // n2 cannot host 8 more GPUs: the job waits, with the reason.
    let full = r.submit(JobSpec {
        choice: choice(vec![n2], vec![], false),
        ..job(DEFAULT_TENANT, 1, 8)
    });
    r.pass(Policy::Fifo);
    assert_eq!(r.job(full).state, JobState::Pending);
    assert!(
        r.job(full).reason.contains("8 free GPUs of its --nodelist"),
        "{}",
        r.job(full).reason
    );
    // A forged plan that ignores the lists is refused on apply.
    let forged = r.submit(JobSpec {
        choice: choice(vec![], vec![n1], false),
        ..job(DEFAULT_TENANT, 1, 1)
    });
    let LedgerResponse::Scheduled { started, refused } = r.apply(Command::Schedule(Plan {
        placements: vec![PlannedPlacement {
            job: forged,
            nodes: vec![(n1, vec![7])],
            diameter_us: 0,
        }],
        ..Plan::default()
    })) else {
        panic!("not a schedule answer")
    };
    assert!(started.is_empty());
    assert!(refused[0].1.contains("n1 is in --exclude"), "{refused:?}");
    // Refused at submit: an unknown node, a count that disagrees, a node
    // both listed and excluded, nothing left outside the exclusions.
    let why = refusal(
        &mut r,
        JobSpec {
            choice: choice(vec![99], vec![], false),
            ..job(DEFAULT_TENANT, 1, 1)
        },
    );
    assert!(why.contains("node 99 is not a member"), "{why}");
    let why = refusal(
        &mut r,
        JobSpec {
            choice: choice(vec![n1, n2], vec![], false),
            ..job(DEFAULT_TENANT, 3, 1)
        },
    );
    assert!(
        why.contains("--nodelist names 2 node(s) but the job asks for 3"),
        "{why}"
    );
    let why = refusal(
        &mut r,
        JobSpec {
            choice: choice(vec![n1], vec![n1], false),
            ..job(DEFAULT_TENANT, 1, 1)
        },
    );
    assert!(why.contains("both in --nodelist and in --exclude"), "{why}");
    let why = refusal(
        &mut r,
        JobSpec {
            choice: choice(vec![], vec![n1, n2], false),
            ..job(DEFAULT_TENANT, 2, 1)
        },
    );
    assert!(why.contains("outside --exclude"), "{why}");
    let why = refusal(
        &mut r,
        JobSpec {
            choice: choice(vec![], vec![n1, n2, n3], false),
            ..job(DEFAULT_TENANT, 1, 1)
        },
    );
    assert!(
        why.contains("no node of the cluster is outside --exclude"),
        "{why}"
    );
    let why = refusal(
        &mut r,
        JobSpec {
            choice: NodeChoice {
                only: vec![n2, n1],
                ..NodeChoice::default()
            },
            ..job(DEFAULT_TENANT, 2, 1)
        },
    );
    assert!(why.contains("sorted"), "{why}");
}

#[test]
fn an_exclusive_job_takes_whole_nodes_and_keeps_them() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let (n1, n2) = (id_of(&r, "n1"), id_of(&r, "n2"));
    let small = r.submit(JobSpec {
        choice: choice(vec![n1], vec![], false),
        ..job(DEFAULT_TENANT, 1, 1)
    });
    r.pass(Policy::Fifo);
    assert_eq!(placed_on(&r, small), vec![n1]);
    // Packing would put it next to `small`; exclusive, it takes n2 whole.
    let whole = r.submit(JobSpec {
        choice: choice(vec![], vec![], true),
        ..job(DEFAULT_TENANT, 1, 1)
    });
    r.pass(Policy::Fifo);
    assert_eq!(placed_on(&r, whole), vec![n2]);
    // It holds (and its ranks see) every GPU of n2, as Slurm's --exclusive.
    assert_eq!(r.job(whole).alloc.as_ref().map(|a| a.gpu_count()), Some(8));
    // Nothing else lands on n2 while it runs, though 7 GPUs are idle there.
    let more = r.submit(job(DEFAULT_TENANT, 1, 4));
    let blocked = r.submit(job(DEFAULT_TENANT, 1, 4));
    let LedgerResponse::Scheduled { refused, .. } = r.pass(Policy::HdrfPreempt) else {
        panic!("not a schedule answer")
    };
    assert!(refused.is_empty(), "the scheduler planned it: {refused:?}");
    assert_eq!(placed_on(&r, more), vec![n1]);
    assert_eq!(r.job(blocked).state, JobState::Pending);
    // No whole node is left for a second exclusive job.
    let second = r.submit(JobSpec {
        choice: choice(vec![], vec![], true),
        ..job(DEFAULT_TENANT, 1, 1)
    });
    r.pass(Policy::Fifo);
    assert_eq!(r.job(second).state, JobState::Pending);
    // Forged plans that break either rule are refused on apply.
    for (id, node, gpu, why) in [
        (blocked, n2, 5, "held whole by an exclusive job"),
        (second, n1, 7, "partly in use"),
    ] {
        let LedgerResponse::Scheduled { started, refused } = r.apply(Command::Schedule(Plan {
            placements: vec![PlannedPlacement {
                job: id,
                nodes: vec![(node, (gpu..gpu + r.job(id).spec.gpus_per_node).collect())],
                diameter_us: 0,
            }],
            ..Plan::default()
        })) else {
            panic!("not a schedule answer")
        };
        assert!(started.is_empty(), "{started:?}");
        assert!(refused[0].1.contains(why), "{refused:?}");
    }
    // Once it ends, n2 is free for the next in line.
    r.exit_all(whole, 0);
    r.pass(Policy::Fifo);
    assert_eq!(placed_on(&r, blocked), vec![n2]);
}

#[test]
fn a_trial_says_where_and_when_and_commits_nothing() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let n2 = id_of(&r, "n2");
    let trial =
        |r: &Replica, spec: &JobSpec| trial_start(&r.ledger, spec, r.now_ms, Policy::Fifo, None);
    let fits = trial(&r, &job(DEFAULT_TENANT, 2, 8)).expect("valid");
    assert_eq!(fits.start_in_s, Some(0));
    assert_eq!(fits.nodes.len(), 2);
    let running = r.submit(JobSpec {
        time_limit_s: 600,
        choice: choice(vec![n2], vec![], false),
        ..job(DEFAULT_TENANT, 1, 8)
    });
    r.pass(Policy::Fifo);
    assert_eq!(placed_on(&r, running), vec![n2]);
    let jobs_before = r.ledger.workload.jobs.len();
    let later = trial(&r, &job(DEFAULT_TENANT, 2, 8)).expect("valid");
    assert_eq!(later.start_in_s, Some(600), "{later:?}");
    assert!(later.reason.is_some());
    let now = trial(&r, &job(DEFAULT_TENANT, 1, 8)).expect("valid");
    assert_eq!((now.start_in_s, now.nodes[0].0), (Some(0), id_of(&r, "n1")));
    let held = trial(
        &r,
        &JobSpec {
            submit_held: true,
            ..job(DEFAULT_TENANT, 1, 1)
        },
    )
    .expect("valid");
    assert_eq!(held.start_in_s, None);
    assert!(held.reason.expect("reason").contains("held"));
    // Refused as a submit is.
    let never = trial(&r, &job(DEFAULT_TENANT, 3, 8)).expect_err("3 nodes of 2");
    assert!(never.contains("only 2"), "{never}");
    assert_eq!(r.ledger.workload.jobs.len(), jobs_before);
}

#[test]
fn a_job_submitted_held_waits_for_release() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    let id = r.submit(JobSpec {
        submit_held: true,
        ..job(DEFAULT_TENANT, 1, 1)
    });
    r.pass(Policy::Fifo);
    assert_eq!(r.job(id).state, JobState::Pending);
    assert!(r.job(id).held);
    assert_eq!(
        r.apply(Command::HoldJob {
            job: id,
            hold: false
        }),
        LedgerResponse::Ok
    );
    r.pass(Policy::Fifo);
    assert_eq!(r.job(id).state, JobState::Running);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever mix of shared, exclusive, listed and excluded jobs arrives
    /// and ends, no node hosts an exclusive job next to another job, and
    /// every job sits inside its lists.
    #[test]
    fn node_choices_hold_through_any_schedule(
        jobs in proptest::collection::vec(
            (1u32..=2, 1u32..=4, proptest::bool::ANY, 0u8..4, 0u8..4),
            1..12,
        ),
        ends in proptest::collection::vec(0usize..12, 0..6),
    ) {
        let mut r = Replica::new(&[("n1", "r1", 4), ("n2", "r1", 4), ("n3", "r2", 4)]);
        let ids: Vec<NodeId> = ["n1", "n2", "n3"].iter().map(|n| id_of(&r, n)).collect();
        let mut submitted = Vec::new();
        for (k, (nodes, gpus, exclusive, only, exclude)) in jobs.iter().enumerate() {
            // only: 0 none, else a window of `nodes` nodes starting there.
            let only: Vec<NodeId> = match *only {
                0 => vec![],
                s => (0..*nodes as usize).map(|i| ids[(s as usize + i) % 3]).collect(),
            };
            let exclude: Vec<NodeId> = match *exclude {
                0 => vec![],
                e => vec![ids[e as usize - 1]],
            };
            let spec = JobSpec {
                choice: choice(only, exclude, *exclusive),
                ..job(DEFAULT_TENANT, *nodes, *gpus)
            };
            if let LedgerResponse::JobId(id) = r.apply(Command::SubmitJob { spec }) {
                submitted.push(id);
            }
            // The scheduler itself keeps the rules: apply refuses nothing.
            if let LedgerResponse::Scheduled { refused, .. } = r.pass(Policy::HdrfPreempt) {
                prop_assert!(refused.is_empty(), "{:?}", refused);
            }
            if let Some(&which) = ends.get(k) {
                if let Some(&id) = submitted.get(which) {
                    if r.job(id).alloc.is_some() {
                        r.exit_all(id, 0);
                    }
                }
            }
            let mut on_node: BTreeMap<NodeId, Vec<(JobId, bool)>> = BTreeMap::new();
            for (j, alloc) in r.ledger.workload.holding() {
                for (node, _) in &alloc.nodes {
                    prop_assert!(j.spec.choice.allows(*node), "job {} on {node}", j.id);
                    on_node.entry(*node).or_default().push((j.id, j.spec.choice.exclusive));
                }
            }
            for (node, held) in on_node {
                if held.iter().any(|(_, e)| *e) {
                    prop_assert_eq!(held.len(), 1, "node {} shared: {:?}", node, held);
                }
            }
        }
    }
}

#[test]
fn signals_requeues_and_time_limits_of_a_running_job() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    let id = r.submit(job(DEFAULT_TENANT, 1, 1));
    // Only a running job can be signalled or requeued.
    for cmd in [
        Command::SignalJob {
            job: id,
            signal: 10,
        },
        Command::RequeueJob { job: id },
    ] {
        let LedgerResponse::Rejected(why) = r.apply(cmd) else {
            panic!("a pending job was signalled or requeued")
        };
        assert!(why.contains("only a running job"), "{why}");
    }
    r.pass(Policy::Fifo);
    assert_eq!(
        r.apply(Command::SignalJob {
            job: id,
            signal: 10
        }),
        LedgerResponse::Ok
    );
    assert_eq!(
        r.apply(Command::SignalJob {
            job: id,
            signal: 15
        }),
        LedgerResponse::Ok
    );
    let LedgerResponse::Rejected(why) = r.apply(Command::SignalJob { job: id, signal: 9 }) else {
        panic!("SIGKILL accepted")
    };
    assert!(why.contains("cannot be sent"), "{why}");
    let alloc = r.job(id).alloc.clone().expect("running");
    assert_eq!(alloc.signals, vec![10, 15]);
    assert_eq!(
        r.job(id).state,
        JobState::Running,
        "a signal does not stop it"
    );
    // A shorter limit; the job keeps its GPUs until the pass sees it is over.
    assert_eq!(
        r.apply(Command::SetTimeLimit {
            job: id,
            time_limit_s: 30,
        }),
        LedgerResponse::Ok
    );
    assert_eq!(r.job(id).spec.time_limit_s, 30);
    let LedgerResponse::Rejected(why) = r.apply(Command::SetTimeLimit {
        job: id,
        time_limit_s: 0,
    }) else {
        panic!("a zero limit accepted")
    };
    assert!(why.contains("positive"), "{why}");
    // Requeued: stopped, back in the queue with a new epoch, no restart used.
    assert_eq!(r.apply(Command::RequeueJob { job: id }), LedgerResponse::Ok);
    r.exit_all(id, 143);
    assert_eq!(r.job(id).state, JobState::Requeued);
    assert_eq!(r.job(id).restarts, 0);
    r.pass(Policy::Fifo);
    let again = r.job(id).alloc.clone().expect("running again");
    assert!(again.epoch > alloc.epoch);
    assert!(again.signals.is_empty(), "signals belong to one allocation");
    r.now_ms += 31_000;
    r.pass(Policy::Fifo);
    assert!(
        r.job(id).reason.contains("time limit"),
        "{}",
        r.job(id).reason
    );
    r.exit_all(id, 143);
    assert_eq!(r.job(id).state, JobState::Timeout);
    let LedgerResponse::Rejected(why) = r.apply(Command::SetTimeLimit {
        job: id,
        time_limit_s: 60,
    }) else {
        panic!("an ended job's limit changed")
    };
    assert!(why.contains("already ended"), "{why}");
}

#[test]
fn a_longer_time_limit_must_fit_the_budget() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    r.apply(Command::CreateTenant {
        name: "vision".into(),
        limits: limits(None, Some(2), 1),
    });
    let id = r.submit(job("vision", 1, 1));
    let LedgerResponse::Rejected(why) = r.apply(Command::SetTimeLimit {
        job: id,
        time_limit_s: 3 * 3600,
    }) else {
        panic!("a limit past the budget accepted")
    };
    assert!(why.starts_with("budget: vision"), "{why}");
    assert_eq!(
        r.apply(Command::SetTimeLimit {
            job: id,
            time_limit_s: 3600 + 1800,
        }),
        LedgerResponse::Ok
    );
}

#[test]
fn the_first_master_port_recorded_stays() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    let id = r.submit(job(DEFAULT_TENANT, 1, 1));
    let set = |epoch, port| Command::SetMasterPort {
        job: id,
        epoch,
        port,
    };
    assert!(matches!(
        r.apply(set(1, 29_500)),
        LedgerResponse::Rejected(_)
    ));
    r.pass(Policy::Fifo);
    let epoch = r.job(id).alloc.as_ref().expect("running").epoch;
    assert!(matches!(
        r.apply(set(epoch + 1, 29_500)),
        LedgerResponse::Rejected(_)
    ));
    assert_eq!(r.apply(set(epoch, 29_501)), LedgerResponse::Ok);
    assert_eq!(r.apply(set(epoch, 29_501)), LedgerResponse::Ok);
    let LedgerResponse::Rejected(why) = r.apply(set(epoch, 29_502)) else {
        panic!("a second port replaced the first")
    };
    assert!(why.contains("has master port 29501 already"), "{why}");
    assert_eq!(
        r.job(id).alloc.as_ref().and_then(|a| a.master_port),
        Some(29_501)
    );
}

#[test]
fn users_map_to_tenants() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    let set = |name: &str, tenant: Option<&str>| Command::SetUser {
        name: name.into(),
        tenant: tenant.map(str::to_string),
    };
    assert_eq!(
        r.apply(set("alice", Some(DEFAULT_TENANT))),
        LedgerResponse::Ok
    );
    assert_eq!(
        r.ledger.workload.users.get("alice").map(String::as_str),
        Some(DEFAULT_TENANT)
    );
    for (cmd, why) in [
        (set("bob", Some("nope")), "no tenant (account) named 'nope'"),
        (set("a b", Some(DEFAULT_TENANT)), "invalid user name"),
        (set("", Some(DEFAULT_TENANT)), "invalid user name"),
        (set("carol", None), "no user named 'carol'"),
    ] {
        let LedgerResponse::Rejected(got) = r.apply(cmd) else {
            panic!("accepted: {why}")
        };
        assert!(got.contains(why), "{got}");
    }
    assert_eq!(r.apply(set("alice", None)), LedgerResponse::Ok);
    assert!(r.ledger.workload.users.is_empty());
}

/// A gang of two on n1 and n2 (the job's own failures not restarted), and
/// the epoch it runs under.
fn gang_of_two(r: &mut Replica) -> (JobId, u64) {
    let mut spec = job(DEFAULT_TENANT, 2, 4);
    spec.max_restarts = 3;
    spec.requeue = false;
    let id = r.submit(spec);
    r.pass(Policy::Hdrf);
    let alloc = r.job(id).alloc.clone().expect("placed");
    (id, alloc.epoch)
}

fn report(r: &mut Replica, id: JobId, epoch: u64, rank: u32, code: i32, end: RankEnd) {
    let answer = r.apply(Command::RankExited {
        job: id,
        epoch,
        rank,
        exit_code: code,
        end,
    });
    assert_eq!(answer, LedgerResponse::Ok);
}

fn set_state(r: &mut Replica, name: &str, state: MemberState) {
    let id = r
        .ledger
        .members
        .values()
        .find(|m| m.spec.name == name)
        .expect("member")
        .id;
    r.apply(Command::SetMemberState { id, state });
}

#[test]
fn a_survivor_failing_before_its_peers_node_is_declared_down_restarts_the_gang() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8), ("n3", "r1", 8)]);
    let (id, epoch) = gang_of_two(&mut r);
    let victim = r.job(id).alloc.as_ref().expect("placed").nodes[1].0;
    let victim_name = r.ledger.members[&victim].spec.name.clone();
    // The survivor's all-reduce fails 0.4 s after its peer's node died...
    r.now_ms += 400;
    report(&mut r, id, epoch, 0, 1, RankEnd::Exited);
    assert_eq!(r.job(id).state, JobState::Running, "{}", r.job(id).reason);
    // ...and the detector declares the node suspect, then down.
    r.now_ms += 1_000;
    set_state(&mut r, &victim_name, MemberState::Suspect);
    assert!(
        r.job(id).alloc.is_some(),
        "a suspect node does not end the gang"
    );
    r.now_ms += 1_000;
    set_state(&mut r, &victim_name, MemberState::Down);
    let job = r.job(id);
    assert_eq!(job.state, JobState::Requeued, "{}", job.reason);
    assert_eq!(job.restarts, 1);
    assert_eq!(
        job.exit_code, None,
        "the survivor's error is not the job's code"
    );
    assert_eq!(
        job.reason,
        format!("node {victim_name} went down; restart 1 of 3")
    );
    assert!(
        job.not_before_ms.is_some(),
        "waits for the lost ranks' fence"
    );
}

#[test]
fn a_survivor_failing_first_then_its_peer_lost_with_its_agent_restarts_the_gang() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let (id, epoch) = gang_of_two(&mut r);
    report(&mut r, id, epoch, 0, 1, RankEnd::Exited);
    // The node's agent came back at once (never suspected) and reports
    // that its rank died with the agent's previous run.
    report(&mut r, id, epoch, 1, 137, RankEnd::Lost);
    let job = r.job(id);
    assert_eq!(job.state, JobState::Requeued, "{}", job.reason);
    assert_eq!(job.restarts, 1);
    assert!(
        job.reason
            .starts_with("a rank was lost with its node's agent"),
        "{}",
        job.reason
    );
}

#[test]
fn a_failure_while_a_gang_node_is_suspect_is_the_nodes() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let (id, epoch) = gang_of_two(&mut r);
    let peer = r.job(id).alloc.as_ref().expect("placed").nodes[1].0;
    let peer_name = r.ledger.members[&peer].spec.name.clone();
    set_state(&mut r, &peer_name, MemberState::Suspect);
    report(&mut r, id, epoch, 0, 1, RankEnd::Exited);
    // The partition heals; the peer's agent stops its rank.
    r.now_ms += 2_000;
    set_state(&mut r, &peer_name, MemberState::Alive);
    report(&mut r, id, epoch, 1, 143, RankEnd::Exited);
    let job = r.job(id);
    assert_eq!(job.state, JobState::Requeued, "{}", job.reason);
    assert_eq!(
        job.reason,
        format!("node {peer_name} was unreachable around the failure; restart 1 of 3")
    );
}

#[test]
fn a_failure_with_every_node_healthy_is_the_jobs_own_even_long_after_a_blip() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let (id, epoch) = gang_of_two(&mut r);
    let peer = r.job(id).alloc.as_ref().expect("placed").nodes[1].0;
    let peer_name = r.ledger.members[&peer].spec.name.clone();
    set_state(&mut r, &peer_name, MemberState::Suspect);
    r.now_ms += 500;
    set_state(&mut r, &peer_name, MemberState::Alive);
    r.now_ms += blame::UNHEALTHY_LOOKBACK_MS + 1;
    report(&mut r, id, epoch, 1, 1, RankEnd::Exited);
    report(&mut r, id, epoch, 0, 143, RankEnd::Exited);
    let job = r.job(id);
    assert_eq!(job.state, JobState::Failed, "{}", job.reason);
    assert_eq!((job.restarts, job.exit_code), (0, Some(1)));
}

#[test]
fn a_stop_deadline_with_a_silent_but_alive_node_is_the_jobs_own_failure() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let (id, epoch) = gang_of_two(&mut r);
    report(&mut r, id, epoch, 0, 2, RankEnd::Exited);
    r.now_ms += STOP_DEADLINE_MS;
    assert_eq!(
        r.apply(Command::ReleaseJob { job: id, epoch }),
        LedgerResponse::Ok
    );
    let job = r.job(id);
    assert_eq!(job.state, JobState::Failed, "{}", job.reason);
    assert_eq!(job.exit_code, Some(2));
}

#[test]
fn a_node_failure_after_a_ranks_own_failure_with_no_restarts_left_ends_node_fail() {
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let mut spec = job(DEFAULT_TENANT, 2, 4);
    spec.max_restarts = 0;
    let id = r.submit(spec);
    r.pass(Policy::Hdrf);
    let alloc = r.job(id).alloc.clone().expect("placed");
    let victim_name = r.ledger.members[&alloc.nodes[1].0].spec.name.clone();
    report(&mut r, id, alloc.epoch, 0, 1, RankEnd::Exited);
    set_state(&mut r, &victim_name, MemberState::Down);
    let job = r.job(id);
    assert_eq!(job.state, JobState::NodeFail, "{}", job.reason);
}

/// Audit finding 4: a tenant lowered its job's limit to 1 s just before
/// the end, and was charged 1 s of a 72 s run (fair-share usage fell the
/// same way). The charge is the time run; a lowered limit only ends the
/// run.
#[test]
fn lowering_the_time_limit_at_the_end_never_lowers_the_charge() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    let honest = r.submit(job(DEFAULT_TENANT, 1, 2));
    let cheat = r.submit(job(DEFAULT_TENANT, 1, 2));
    r.pass(Policy::Fifo);
    r.now_ms += 72_000;
    let before = r.ledger.workload.tenants[DEFAULT_TENANT].charged_gpu_ms;
    assert_eq!(
        r.apply(Command::SetTimeLimit {
            job: cheat,
            time_limit_s: 1,
        }),
        LedgerResponse::Ok
    );
    assert_eq!(
        r.job(cheat).spec.time_limit_s,
        72,
        "a limit below the time run becomes the time run"
    );
    r.exit_all(cheat, 0);
    let tenant = &r.ledger.workload.tenants[DEFAULT_TENANT];
    assert_eq!(tenant.charged_gpu_ms - before, 2 * 72_000);
    let fair_after_cheat = tenant.fair_usage_gpu_ms;
    r.exit_all(honest, 0);
    let tenant = &r.ledger.workload.tenants[DEFAULT_TENANT];
    assert_eq!(tenant.charged_gpu_ms - before, 2 * 2 * 72_000);
    assert_eq!(
        tenant.fair_usage_gpu_ms - fair_after_cheat,
        fair_after_cheat,
        "the honest twin's fair-share usage equals the cheat's"
    );
}

#[test]
fn an_exclusive_job_is_charged_for_its_whole_nodes() {
    // The audit's attack: a tenant at 2/2 GPUs held an 8-GPU node whole
    // with a 2-GPU exclusive job, charged for 2, and preempted others.
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    r.apply(Command::CreateTenant {
        name: "small".into(),
        limits: limits(Some(2), None, 1),
    });
    r.apply(Command::CreateTenant {
        name: "big".into(),
        limits: limits(Some(8), None, 1),
    });
    let hog = r.submit(JobSpec {
        choice: choice(vec![], vec![], true),
        ..job("small", 1, 2)
    });
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(hog).state, JobState::Pending);
    assert!(
        r.job(hog).reason.contains("uses 0/2 GPUs, job needs 8"),
        "{}",
        r.job(hog).reason
    );
    // A forged plan is refused on apply the same way.
    let n1 = id_of(&r, "n1");
    let LedgerResponse::Scheduled { started, refused } = r.apply(Command::Schedule(Plan {
        placements: vec![PlannedPlacement {
            job: hog,
            nodes: vec![(n1, vec![0, 1])],
            diameter_us: 0,
        }],
        ..Plan::default()
    })) else {
        panic!("not a schedule answer")
    };
    assert!(started.is_empty(), "{started:?}");
    assert!(refused[0].1.contains("job needs 8"), "{refused:?}");
    // Within its quota it runs, and everything counts the whole node:
    // GPUs in use, the budget it commits and the GPU-seconds it is charged.
    let whole = r.submit(JobSpec {
        choice: choice(vec![], vec![], true),
        ..job("big", 1, 2)
    });
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(whole).state, JobState::Running);
    assert_eq!(r.ledger.workload.gpus_in_use().get("big"), Some(&8));
    assert_eq!(
        r.ledger.workload.committed_gpu_seconds("big"),
        8 * r.job(whole).spec.time_limit_s
    );
    let before = r.ledger.workload.tenants["big"].charged_gpu_ms;
    r.now_ms += 10_000;
    r.exit_all(whole, 0);
    assert_eq!(
        r.ledger.workload.tenants["big"].charged_gpu_ms - before,
        8 * 10_000
    );
}

#[test]
fn until_every_member_speaks_it_an_exclusive_job_holds_what_was_planned() {
    // A member of an older release applies the plan as it came; so must
    // every other replica, or their ledgers would part.
    let mut r = Replica::new(&[("n1", "r1", 8), ("n2", "r1", 8)]);
    let old = id_of(&r, "n2");
    r.ledger
        .members
        .get_mut(&old)
        .expect("n2")
        .spec
        .protocol_max = WHOLE_NODES_SINCE_PROTOCOL - 1;
    let whole = r.submit(JobSpec {
        choice: choice(vec![], vec![], true),
        ..job(DEFAULT_TENANT, 1, 2)
    });
    r.pass(Policy::Fifo);
    assert_eq!(r.job(whole).alloc.as_ref().map(|a| a.gpu_count()), Some(2));
}

#[test]
fn no_job_is_preempted_for_an_exclusive_gang_its_quota_then_refuses() {
    let mut r = Replica::new(&[("n1", "r1", 8)]);
    for (name, max) in [("big", None), ("small", Some(2))] {
        r.apply(Command::CreateTenant {
            name: name.into(),
            limits: limits(max, None, 1),
        });
    }
    let victim = r.submit(job("big", 1, 8));
    r.pass(Policy::HdrfPreempt);
    assert_eq!(r.job(victim).state, JobState::Running);
    // Below its fair share, small may preempt big: for 2 GPUs it could,
    // but held whole the node is 8, past its quota of 2.
    let whole = r.submit(JobSpec {
        choice: choice(vec![], vec![], true),
        ..job("small", 1, 2)
    });
    r.pass(Policy::HdrfPreempt);
    assert_eq!(
        r.job(victim).state,
        JobState::Running,
        "preempted for nothing"
    );
    assert!(r.job(whole).state.is_waiting());
}
