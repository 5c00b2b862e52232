//! What a member node may propose on its own (the NodeRestriction idea): a
//! command a node forwards to the leader without a user's token is applied
//! only if it is about that node — its own record, its own ranks' exits and
//! checkpoint parts, copies it holds, events it observed. Everything else
//! (tokens, tenants, jobs, other members) is a user's action and must carry
//! the user's token, which the leader verifies (see `Command::AsNode`).
//!
//! Pure, and decided in `apply` like [`crate::ledger::access`], so the check reads
//! the ledger as of the commit and every replica agrees.
//!
//! The leader itself proposes without this check: Raft trusts its leader
//! with the log, and the leader's own loops (scheduling, liveness,
//! membership) are the cluster's control plane.

use crate::ledger::{Command, Ledger, MemberSpec};
use crate::workload::Allocation;
use crate::NodeId;
use shoal_sdk::MemberState;

/// Which GPUs a node has: what draws jobs to it (their index, identity
/// and model), not what drifts as they are used or set up (allocation,
/// health, memory as ECC or MIG change it, NUMA and NVLink as reported).
fn inventory(gpus: &[shoal_sdk::GpuInfo]) -> Vec<(u32, &str, &str)> {
    gpus.iter()
        .map(|gpu| (gpu.index, gpu.uuid.as_str(), gpu.model.as_str()))
        .collect()
}

/// The protocol from which a member's own record keeps the GPUs and
/// addresses it was admitted with: a refusal decided at commit changes
/// what every replica applies, so all must speak it.
pub const ADMITTED_RECORD_SINCE_PROTOCOL: u16 = 5;

/// The GPUs and addresses `node` was admitted with stay: those of
/// `current`, the rest of `spec` (release, protocols, labels, gossip
/// identity, GPU details) is the node's own. `None`: `spec` changes none.
pub fn keep_admitted(current: &MemberSpec, spec: &MemberSpec) -> Option<MemberSpec> {
    let same = inventory(&current.gpus) == inventory(&spec.gpus) && same_hosts(current, spec);
    (!same).then(|| MemberSpec {
        gpus: current.gpus.clone(),
        rpc_addr: current.rpc_addr.clone(),
        api_addr: current.api_addr.clone(),
        ..spec.clone()
    })
}

/// Whether `spec` names the hosts `current` does for RPC and the API: a
/// node restarted on other ports (it listens on port 0) is the same node;
/// another host is not its to claim.
fn same_hosts(current: &MemberSpec, spec: &MemberSpec) -> bool {
    let host = |addr: &str| match addr.parse::<std::net::SocketAddr>() {
        Ok(addr) => addr.ip().to_string(),
        Err(_) => addr
            .rsplit_once(':')
            .map_or(addr, |(host, _)| host)
            .to_string(),
    };
    host(&current.rpc_addr) == host(&spec.rpc_addr)
        && host(&current.api_addr) == host(&spec.api_addr)
}

/// `Ok` when member `node` may have `cmd` applied on its own authority;
/// otherwise why not, worded for the operator reading the audit log.
pub fn authorize(ledger: &Ledger, node: NodeId, cmd: &Command) -> Result<(), String> {
    match ledger.members.get(&node) {
        None => return Err(format!("node {node} is not a member")),
        Some(m) if m.state == MemberState::Left => {
            return Err(format!("node {node} has left the cluster"))
        }
        Some(_) => {}
    }
    let refuse = |what: &str| Err(format!("node {node} may not {what}"));
    match cmd {
        Command::UpdateMember { id, spec } if *id == node => {
            let Some(current) = ledger.members.get(&node).map(|m| &m.spec) else {
                return refuse("change a record it does not have");
            };
            // Failure domains decide who votes (and so who holds the CA key):
            // a node cannot move itself into a zone of its choosing.
            if let Some(label) = FAILURE_DOMAINS
                .iter()
                .find(|k| current.labels.get(**k) != spec.labels.get(**k))
            {
                return refuse(&format!(
                    "change its own '{label}' label (remove the node and join it again to move it)"
                ));
            }
            // What it was admitted with: more GPUs draw other tenants' jobs,
            // another address draws other nodes' traffic. Its release,
            // protocols, gossip identity and other labels stay its own.
            let everyone_speaks_it = ledger
                .effective_protocol()
                .is_some_and(|p| p >= ADMITTED_RECORD_SINCE_PROTOCOL);
            if !everyone_speaks_it {
                return Ok(());
            }
            if inventory(&current.gpus) != inventory(&spec.gpus) {
                return refuse(
                    "change its own GPUs (remove the node and join it again with the new ones)",
                );
            }
            if !same_hosts(current, spec) {
                return refuse(
                    "move its own addresses to another host (remove the node and join it again there)",
                );
            }
            Ok(())
        }
        Command::UpdateMember { id, .. } => refuse(&format!("change member {id}")),
        Command::RankExited {
            job, epoch, rank, ..
        }
        | Command::CheckpointPart {
            job, epoch, rank, ..
        } => match allocation(ledger, *job, *epoch) {
            // A stale or finished allocation is refused by apply with its
            // usual message; there is nothing to protect.
            None => Ok(()),
            Some(alloc) if rank_node(alloc, *rank) == Some(node) => Ok(()),
            Some(_) => refuse(&format!(
                "report for rank {rank} of job {job}: it runs elsewhere"
            )),
        },
        // Only rank 0's node chooses the port its rank listens on.
        Command::SetMasterPort { job, epoch, .. } => match allocation(ledger, *job, *epoch) {
            None => Ok(()),
            Some(alloc) if rank_node(alloc, 0) == Some(node) => Ok(()),
            Some(_) => refuse(&format!(
                "choose the master port of job {job}: its rank 0 runs elsewhere"
            )),
        },
        Command::SetCheckpointHolders {
            job, step, rank, ..
        } => {
            let current = ledger
                .workload
                .checkpoints
                .get(job)
                .and_then(|catalog| catalog.iter().find(|c| c.step == *step))
                .and_then(|c| c.parts.get(rank))
                .map(|p| p.holders.as_slice())
                .unwrap_or_default();
            holder_change(node, current)
                .or_else(|why| refuse(&format!("set the holders of job {job} step {step}: {why}")))
        }
        Command::SetObjectHolders { path, .. } => {
            let current = crate::namespace::normalize(path)
                .ok()
                .and_then(|p| ledger.namespace.objects.get(&p))
                .map(|o| o.holders.as_slice())
                .unwrap_or_default();
            holder_change(node, current)
                .or_else(|why| refuse(&format!("set the holders of mesh:{path}: {why}")))
        }
        Command::RecordEvent(spec) => {
            let own = spec.node == Some(node);
            // A gang's ranks judge each other (stragglers): a node may
            // report on a job it runs a rank of, never forge an audit record.
            let gang = spec
                .job
                .and_then(|j| ledger.workload.jobs.get(&j))
                .and_then(|j| j.alloc.as_ref())
                .is_some_and(|a| a.nodes.iter().any(|(n, _)| *n == node));
            // Nor name another job, even in an event about itself: its
            // tenant would read it as the job's. A job it ran last counts
            // (a rank's end is reported after its allocation is gone).
            let ran_it = spec.job.is_none_or(|id| {
                ledger
                    .workload
                    .jobs
                    .get(&id)
                    .is_some_and(|j| gang || j.last_nodes.iter().any(|(n, _)| *n == node))
            });
            if spec.kind == crate::events::AUDIT && !own {
                refuse("record audit events about other nodes")
            } else if !ran_it {
                refuse("record events naming a job it runs no rank of")
            } else if own || gang {
                Ok(())
            } else {
                refuse("record events about other nodes")
            }
        }
        // What it trusts and which CA signed its certificate: its own only,
        // since a CA rotation moves on when every member has said so.
        Command::ReportCredentials { node: about, .. } if *about == node => Ok(()),
        Command::ReportCredentials { node: about, .. } => {
            refuse(&format!("report the credentials of node {about}"))
        }
        // When a token was last used: any member serves API requests, and
        // the report can only move that time forward.
        Command::TouchApiToken { .. } => Ok(()),
        // A node stopping gracefully drains itself, and returns when back.
        Command::SetDrain { id, .. } if *id == node => Ok(()),
        // A node reports its own faulty GPUs; returning one to service, or
        // draining one by hand, is an operator's call.
        Command::SetGpuFault {
            node: owner,
            fault: Some(report),
            ..
        } if *owner == node && report.detected => Ok(()),
        Command::SetGpuFault { node: owner, .. } if *owner == node => {
            refuse("drain or return its own GPUs to service: an operator does (shoal gpu undrain)")
        }
        Command::SetGpuFault { node: owner, .. } => {
            refuse(&format!("report on the GPUs of node {owner}"))
        }
        other => refuse(&format!(
            "{} on its own: user actions carry the user's token",
            describe(other)
        )),
    }
}

/// Labels that place a node in a failure domain.
const FAILURE_DOMAINS: [&str; 3] = ["region", "zone", "rack"];

fn allocation(ledger: &Ledger, job: u64, epoch: u64) -> Option<&Allocation> {
    ledger
        .workload
        .jobs
        .get(&job)
        .and_then(|j| j.alloc.as_ref())
        .filter(|a| a.epoch == epoch)
}

fn rank_node(alloc: &Allocation, rank: u32) -> Option<NodeId> {
    alloc.nodes.get(rank as usize).map(|(n, _)| *n)
}

/// A node that re-replicated data may name the new holder set only if it
/// holds a copy now (the repairer is always a current holder): a member
/// with no part in the data cannot rewrite where it lives.
fn holder_change(node: NodeId, current: &[NodeId]) -> Result<(), String> {
    if current.contains(&node) {
        Ok(())
    } else {
        Err("it holds no copy".into())
    }
}

fn describe(cmd: &Command) -> &'static str {
    match cmd {
        Command::Bootstrap { .. } => "bootstrap",
        Command::AddMember { .. } => "admit members",
        Command::SetMemberState { .. } => "change a node's state",
        Command::CreateJoinToken { .. }
        | Command::CreateVoterJoinToken { .. }
        | Command::CreateApiToken { .. } => "create tokens",
        Command::RevokeJoinToken { .. }
        | Command::RevokeApiToken { .. }
        | Command::RotateApiToken { .. } => "revoke or rotate tokens",
        Command::PutAttr { .. } => "set cluster attributes",
        Command::CreateTenant { .. }
        | Command::UpdateTenant { .. }
        | Command::SetGlobalCaps { .. } => "manage tenants",
        Command::AdoptGlobalTenant { .. } | Command::ShareRound { .. } => "move global caps",
        Command::SubmitJob { .. }
        | Command::CancelJob { .. }
        | Command::HoldJob { .. }
        | Command::SignalJob { .. }
        | Command::RequeueJob { .. }
        | Command::SetTimeLimit { .. } => "submit, hold, signal, requeue, change or cancel jobs",
        Command::Schedule(_) | Command::ReleaseJob { .. } => "schedule",
        Command::PutObject { .. } | Command::RemoveObject { .. } => "write mesh:/ objects",
        Command::SetDrain { .. } => "drain nodes",
        Command::SetGpuFault { .. } => "drain GPUs",
        Command::StartCaRotation { .. } | Command::AdvanceCaRotation { .. } => {
            "rotate the cluster CA"
        }
        Command::AsTenant { .. } | Command::AsNode { .. } | Command::Batch(_) => "nest commands",
        _ => "do this",
    }
}

#[cfg(test)]
mod tests {
    use super::{keep_admitted, ADMITTED_RECORD_SINCE_PROTOCOL};
    use crate::events::{EventSpec, Severity, AUDIT};
    use crate::ledger::{Command, Ledger, LedgerRequest, LedgerResponse, MemberSpec};
    use crate::sched::{schedule, Policy, TopologyProximity};
    use crate::workload::SchedSnapshot;
    use crate::workload::{JobSpec, TenantLimits};
    use shoal_sdk::{GpuInfo, MemberState};
    use std::collections::BTreeMap;

    fn member(name: &str) -> MemberSpec {
        MemberSpec {
            name: name.into(),
            rpc_addr: "127.0.0.1:1".into(),
            api_addr: "127.0.0.1:2".into(),
            labels: BTreeMap::new(),
            gpus: vec![GpuInfo {
                index: 0,
                model: "H100".into(),
                memory_mb: 81_920,
                uuid: format!("GPU-{name}"),
                allocated_to: None,
                numa_node: None,
                nvlink_peers: vec![],
                mig_enabled: false,
                health: String::new(),
                health_reason: None,
            }],
            protocol_max: ADMITTED_RECORD_SINCE_PROTOCOL,
            ..MemberSpec::default()
        }
    }

    struct Replica {
        ledger: Ledger,
        index: u64,
    }

    impl Replica {
        /// Members 1, 2 and 3, a tenant, and one running one-GPU job.
        fn with_a_running_job() -> (Self, u64) {
            let mut r = Replica {
                ledger: Ledger::new(),
                index: 0,
            };
            r.apply(Command::Bootstrap {
                cluster_id: "c".into(),
                region: "r".into(),
                ca_cert_pem: String::new(),
                admin_token_hash: "a".into(),
                first_member: 1,
                spec: member("n1"),
            });
            r.apply(Command::CreateJoinToken {
                hash: "t".into(),
                expires_at_ms: u64::MAX,
                uses: 2,
            });
            for name in ["n2", "n3"] {
                r.apply(Command::AddMember {
                    spec: member(name),
                    token_hash: "t".into(),
                });
            }
            r.apply(Command::CreateTenant {
                name: "lab".into(),
                limits: TenantLimits::default(),
            });
            let job = match r.apply(Command::SubmitJob {
                spec: JobSpec {
                    name: "train".into(),
                    tenant: "lab".into(),
                    nodes: 1,
                    gpus_per_node: 1,
                    gpu_model: None,
                    time_limit_s: 3600,
                    priority: 0,
                    preemptible: true,
                    command: vec!["true".into()],
                    max_restarts: 0,
                    ..JobSpec::default()
                },
            }) {
                LedgerResponse::JobId(id) => id,
                other => panic!("submit refused: {other:?}"),
            };
            let snapshot = SchedSnapshot::new(&r.ledger, r.index, Policy::Fifo);
            let prox = TopologyProximity::new(&snapshot.input.nodes);
            let plan = snapshot.to_plan(&schedule(&snapshot.input, &prox), &r.ledger.workload);
            r.apply(Command::Schedule(plan));
            (r, job)
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

        fn as_node(&mut self, node: u64, cmd: Command) -> LedgerResponse {
            self.apply(Command::AsNode {
                node,
                cmd: Box::new(cmd),
            })
        }

        /// The job's (epoch, node of rank 0) and a member that runs no rank.
        fn placement(&self, job: u64) -> (u64, u64, u64) {
            let alloc = self.ledger.workload.jobs[&job]
                .alloc
                .clone()
                .expect("the job runs");
            let runner = alloc.nodes[0].0;
            let bystander = (1..=3).find(|n| *n != runner).expect("three members");
            (alloc.epoch, runner, bystander)
        }

        fn audit_messages(&self) -> Vec<String> {
            self.ledger
                .events
                .after(0)
                .filter(|e| e.spec.kind == AUDIT)
                .map(|e| e.spec.message.clone())
                .collect()
        }
    }

    fn denied(r: &LedgerResponse) -> bool {
        matches!(r, LedgerResponse::Denied(_))
    }

    #[test]
    fn a_node_reports_only_its_own_ranks() {
        let (mut r, job) = Replica::with_a_running_job();
        let (epoch, runner, bystander) = r.placement(job);
        let exit = Command::RankExited {
            job,
            epoch,
            rank: 0,
            exit_code: 0,
            end: crate::workload::RankEnd::Exited,
        };
        let forged = r.as_node(bystander, exit.clone());
        assert!(denied(&forged), "{forged:?}");
        assert!(r.ledger.workload.jobs[&job]
            .alloc
            .as_ref()
            .expect("runs")
            .exits
            .is_empty());
        assert_eq!(r.as_node(runner, exit), LedgerResponse::Ok);
        let audit = r.audit_messages();
        assert!(
            audit
                .iter()
                .any(|m| m.contains(&format!("node {bystander}")) && m.contains("rank 0")),
            "{audit:?}"
        );
    }

    #[test]
    fn only_rank_0s_node_chooses_the_master_port() {
        let (mut r, job) = Replica::with_a_running_job();
        let (epoch, runner, bystander) = r.placement(job);
        let set = Command::SetMasterPort {
            job,
            epoch,
            port: 29_401,
        };
        let forged = r.as_node(bystander, set.clone());
        assert!(denied(&forged), "{forged:?}");
        let port = |r: &Replica| {
            r.ledger.workload.jobs[&job]
                .alloc
                .as_ref()
                .and_then(|a| a.master_port)
        };
        assert_eq!(port(&r), None);
        assert_eq!(r.as_node(runner, set), LedgerResponse::Ok);
        assert_eq!(port(&r), Some(29_401));
    }

    #[test]
    fn a_node_reports_its_own_faulty_gpus_and_clears_none() {
        use crate::ledger::GpuFaultReport;
        let (mut r, job) = Replica::with_a_running_job();
        let (_, runner, bystander) = r.placement(job);
        let report = |node, detected| Command::SetGpuFault {
            node,
            gpu: 0,
            fault: Some(GpuFaultReport {
                reason: "XID 79".into(),
                detected,
            }),
        };
        let forged = r.as_node(bystander, report(runner, true));
        assert!(denied(&forged), "{forged:?}");
        let by_hand = r.as_node(runner, report(runner, false));
        assert!(denied(&by_hand), "a node drained its own GPU: {by_hand:?}");
        assert_eq!(r.as_node(runner, report(runner, true)), LedgerResponse::Ok);
        assert!(r.ledger.workload.gpu_fault(runner, 0).is_some());
        let cleared = r.as_node(
            runner,
            Command::SetGpuFault {
                node: runner,
                gpu: 0,
                fault: None,
            },
        );
        assert!(denied(&cleared), "a node returned its own GPU: {cleared:?}");
        assert!(r.ledger.workload.gpu_fault(runner, 0).is_some());
    }

    #[test]
    fn a_node_changes_only_its_own_member_record() {
        let (mut r, _) = Replica::with_a_running_job();
        let mut spec = r.ledger.members[&2].spec.clone();
        spec.labels.insert("team".into(), "vision".into());
        spec.version = "9.9.9".into();
        let forged = r.as_node(
            3,
            Command::UpdateMember {
                id: 2,
                spec: spec.clone(),
            },
        );
        assert!(denied(&forged), "{forged:?}");
        assert!(!r.ledger.members[&2].spec.labels.contains_key("team"));
        assert_eq!(
            r.as_node(2, Command::UpdateMember { id: 2, spec }),
            LedgerResponse::Ok
        );
        assert_eq!(r.ledger.members[&2].spec.version, "9.9.9");
    }

    #[test]
    fn a_node_cannot_rewrite_the_gpus_or_addresses_it_was_admitted_with() {
        // Audit finding 7: a member rewrote its own GPUs and addresses.
        let (mut r, _) = Replica::with_a_running_job();
        let admitted = r.ledger.members[&2].spec.clone();
        let mut more_gpus = admitted.clone();
        more_gpus
            .gpus
            .extend(more_gpus.gpus.clone().into_iter().map(|mut g| {
                g.index += 100;
                g
            }));
        let mut other_model = admitted.clone();
        other_model.gpus[0].model = "B200".into();
        let mut moved = admitted.clone();
        moved.rpc_addr = "10.0.0.9:7000".into();
        let mut api_moved = admitted.clone();
        api_moved.api_addr = "10.0.0.9:2".into();
        for spec in [more_gpus, other_model, moved, api_moved] {
            let answer = r.as_node(2, Command::UpdateMember { id: 2, spec });
            assert!(denied(&answer), "{answer:?}");
        }
        assert_eq!(r.ledger.members[&2].spec, admitted);
        // What drifts as GPUs are used or set up is not the inventory.
        let mut in_use = admitted.clone();
        in_use.gpus[0].allocated_to = Some(42);
        in_use.gpus[0].health = "ok".into();
        in_use.gpus[0].memory_mb -= 1_024;
        in_use.gpus[0].mig_enabled = true;
        // Other ports on the same host: a restart on port 0.
        in_use.rpc_addr = "127.0.0.1:9001".into();
        in_use.api_addr = "127.0.0.1:9002".into();
        assert_eq!(
            r.as_node(
                2,
                Command::UpdateMember {
                    id: 2,
                    spec: in_use
                }
            ),
            LedgerResponse::Ok
        );
        // What the node sends instead after a refusal: its new release,
        // with what it was admitted with.
        let mut restarted = r.ledger.members[&2].spec.clone();
        restarted.rpc_addr = "10.0.0.9:7000".into();
        restarted.version = "9.9.9".into();
        let kept = keep_admitted(&r.ledger.members[&2].spec, &restarted).expect("a change");
        assert_eq!(kept.rpc_addr, "127.0.0.1:9001");
        assert_eq!(
            r.as_node(2, Command::UpdateMember { id: 2, spec: kept }),
            LedgerResponse::Ok
        );
        assert_eq!(r.ledger.members[&2].spec.version, "9.9.9");
    }

    #[test]
    fn until_every_member_speaks_it_a_node_may_rewrite_its_record() {
        // Replicas of an older release apply the change: so must this one.
        let (mut r, _) = Replica::with_a_running_job();
        r.ledger.members.get_mut(&3).expect("n3").spec.protocol_max =
            ADMITTED_RECORD_SINCE_PROTOCOL - 1;
        let mut moved = r.ledger.members[&2].spec.clone();
        moved.rpc_addr = "10.0.0.9:7000".into();
        assert_eq!(
            r.as_node(2, Command::UpdateMember { id: 2, spec: moved }),
            LedgerResponse::Ok
        );
    }

    #[test]
    fn a_node_cannot_move_itself_to_another_failure_domain() {
        let (mut r, _) = Replica::with_a_running_job();
        let mut spec = r.ledger.members[&2].spec.clone();
        spec.labels.insert("zone".into(), "elsewhere".into());
        let moved = r.as_node(2, Command::UpdateMember { id: 2, spec });
        assert!(denied(&moved), "{moved:?}");
        assert!(!r.ledger.members[&2].spec.labels.contains_key("zone"));
        let mut spec = r.ledger.members[&2].spec.clone();
        spec.labels.insert("team".into(), "vision".into());
        assert_eq!(
            r.as_node(2, Command::UpdateMember { id: 2, spec }),
            LedgerResponse::Ok,
            "other labels are the node's own"
        );
    }

    #[test]
    fn a_node_cannot_mint_user_or_admin_actions() {
        let (mut r, job) = Replica::with_a_running_job();
        let tokens = r.ledger.api_tokens.len();
        for cmd in [
            Command::CreateApiToken {
                hash: "h".into(),
                name: "mine".into(),
                tenant: None,
                expires_at_ms: None,
            },
            Command::CreateJoinToken {
                hash: "j".into(),
                expires_at_ms: u64::MAX,
                uses: 1,
            },
            Command::RevokeApiToken { id: "admin".into() },
            Command::RotateApiToken {
                name: "admin".into(),
                hash: "h2".into(),
            },
            Command::SetMemberState {
                id: 1,
                state: MemberState::Left,
            },
            Command::CancelJob { job },
            Command::PutAttr {
                key: "k".into(),
                value: "v".into(),
            },
            Command::AsTenant {
                tenant: "lab".into(),
                cmd: Box::new(Command::CancelJob { job }),
            },
            Command::Batch(vec![Command::CancelJob { job }]),
            // Caps across regions are the admin's and the leader's.
            Command::SetGlobalCaps {
                tenant: "lab".into(),
                gpus: Some(Some(1000)),
                gpu_seconds: None,
            },
            Command::AdoptGlobalTenant {
                tenant: "lab".into(),
                home: "eu-1".into(),
                gpus: Some(1000),
                gpu_seconds: None,
                limits: TenantLimits::default(),
            },
            Command::ShareRound {
                tenant: "lab".into(),
                gpus: None,
                gpu_seconds: None,
            },
        ] {
            let answer = r.as_node(2, cmd.clone());
            assert!(denied(&answer), "{cmd:?} -> {answer:?}");
        }
        assert_eq!(r.ledger.api_tokens.len(), tokens);
        assert!(!r.ledger.join_tokens.contains_key("j"));
        assert_eq!(r.ledger.members[&1].state, MemberState::Alive);
        assert!(r.ledger.workload.jobs[&job].alloc.is_some());
        assert!(r.ledger.global_caps.is_empty());
        // One audit record per distinct refusal: identical ones coalesce.
        assert!(r.audit_messages().len() >= 5, "{:?}", r.audit_messages());
    }

    #[test]
    fn a_node_that_left_may_do_nothing() {
        let (mut r, _) = Replica::with_a_running_job();
        r.apply(Command::SetMemberState {
            id: 3,
            state: MemberState::Left,
        });
        let answer = r.as_node(
            3,
            Command::UpdateMember {
                id: 3,
                spec: member("n3"),
            },
        );
        assert!(denied(&answer), "{answer:?}");
        assert!(denied(&r.as_node(
            9,
            Command::UpdateMember {
                id: 9,
                spec: member("x")
            }
        )));
    }

    #[test]
    fn events_are_a_nodes_own_or_about_a_gang_it_runs_in() {
        let (mut r, job) = Replica::with_a_running_job();
        let (_, runner, bystander) = r.placement(job);
        let event = |node: u64, kind: &str, job: Option<u64>| {
            Command::RecordEvent(EventSpec {
                severity: Severity::Warning,
                kind: kind.into(),
                node: Some(node),
                gpu: None,
                job,
                resource: None,
                message: "m".into(),
            })
        };
        assert_eq!(
            r.as_node(bystander, event(bystander, "gpu_xid", None)),
            LedgerResponse::Ok
        );
        // Audit finding 7: an event about itself that names another
        // tenant's job.
        assert!(denied(&r.as_node(
            bystander,
            event(bystander, "job_straggler", Some(job))
        )));
        assert!(denied(
            &r.as_node(bystander, event(runner, "node_down", None))
        ));
        assert!(denied(&r.as_node(bystander, event(runner, AUDIT, None))));
        assert!(denied(
            &r.as_node(bystander, event(runner, "job_straggler", Some(job)))
        ));
        assert_eq!(
            r.as_node(runner, event(bystander, "job_straggler", Some(job))),
            LedgerResponse::Ok
        );
    }

    #[test]
    fn a_node_reports_only_its_own_credentials() {
        let (mut r, _) = Replica::with_a_running_job();
        let report = |node: u64| Command::ReportCredentials {
            node,
            trusted: vec!["old".into(), "new".into()],
            cert_ca: "new".into(),
        };
        let forged = r.as_node(2, report(3));
        assert!(denied(&forged), "{forged:?}");
        assert!(!r.ledger.ca.reports.contains_key(&3));
        assert!(r
            .audit_messages()
            .iter()
            .any(|m| m.contains("node 2 may not report the credentials of node 3")));
        assert_eq!(r.as_node(3, report(3)), LedgerResponse::Ok);
        assert_eq!(r.ledger.ca.reports[&3].cert_ca, "new");
    }

    #[test]
    fn only_a_holder_rewrites_where_a_copy_lives() {
        assert!(super::holder_change(2, &[1, 2, 3]).is_ok());
        assert!(super::holder_change(4, &[1, 2, 3]).is_err());
        assert!(super::holder_change(5, &[]).is_err());
    }
}
