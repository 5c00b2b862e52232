//! The simulated cluster's state kept in a real [`Ledger`], driven by the
//! same commands the live cluster commits: `SubmitJob`, `Schedule(Plan)`,
//! `RankExited`, `SetMemberState`, `CancelJob`. Time enters the ledger as
//! the leader's timestamp of each request (`now_ms`), here the simulated
//! clock. No network, no Raft: one replica applying an ordered log.
//!
//! A pass is what the live leader does (`node/src/scheduler.rs`): build a
//! [`SchedSnapshot`] from the ledger, run the pure scheduler, turn its plan
//! into a `Schedule` command with [`SchedSnapshot::to_plan`] and apply it;
//! `apply` re-validates every placement. Agents are simulated as obeying at
//! once: when the ledger asks a job to stop (time limit, preemption), every
//! rank reports its exit in the same instant.
//!
//! Pure and deterministic: the ledger orders everything with B-trees.

use std::collections::BTreeMap;

use shoal_consensus::ledger::{Command, Ledger, LedgerRequest, LedgerResponse, MemberSpec};
use shoal_consensus::sched::{NodeView, Policy, SchedPlan, TopologyProximity};
use shoal_consensus::tokens::MAX_JOIN_USES;
use shoal_consensus::workload::{
    JobId, JobSpec, JobState, Plan, PlannedPlacement, SchedSnapshot, TenantLimits,
};
use shoal_consensus::NodeId;
use shoal_sdk::{GpuInfo, MemberState};

/// Join tokens of the simulated cluster: one per [`MAX_JOIN_USES`] joins,
/// never expiring.
fn join_token(position: usize) -> String {
    format!("sim-join-{}", (position - 1) / MAX_JOIN_USES as usize)
}

/// A job on the engine's nodes: (engine job index, [(engine node index,
/// GPU indices)] in rank order).
pub(crate) type EnginePlacement = (usize, Vec<(usize, Vec<u32>)>);

/// Ledger job ids and node ids, translated to the engine's indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CommittedPass {
    /// Jobs the ledger asked to stop at their time limit; their ranks have
    /// exited and the ledger has ended them.
    pub timed_out: Vec<usize>,
    /// Preemption victims; their ranks have exited and the ledger requeued
    /// them.
    pub preempted: Vec<usize>,
    /// Placements `apply` accepted, in plan order, on engine node indices.
    pub started: Vec<EnginePlacement>,
    /// Placements `apply` refused, with its reason.
    pub refused: Vec<(usize, String)>,
}

/// A scheduling pass's plan, in the engine's indices, before it is committed.
pub(crate) struct PlannedPass {
    snapshot: SchedSnapshot,
    plan: SchedPlan,
    /// The plan translated: job index for ledger ids, node index for ledger
    /// node ids. Ids the engine does not know are dropped (none should be).
    pub engine_plan: SchedPlan,
}

pub(crate) struct LedgerCluster {
    ledger: Ledger,
    /// Log index of the last applied command: the epoch of allocations.
    index: u64,
    node_ids: Vec<NodeId>,
    node_of: BTreeMap<NodeId, usize>,
    /// Ledger tenant per engine tenant index.
    tenant_names: Vec<String>,
    ledger_job: Vec<Option<JobId>>,
    job_of: BTreeMap<JobId, usize>,
    proximity: TopologyProximity,
}

/// Ledger tenant names must be simple identifiers, and trace tenants need
/// not be; zero-padded indices keep the tenants' name order.
fn ledger_tenant_name(index: usize) -> String {
    format!("sim-tenant-{index:06}")
}

fn ms(seconds: u64) -> u64 {
    seconds.saturating_mul(1000)
}

impl LedgerCluster {
    /// A bootstrapped ledger with one member per node (ids 1, 2, … in node
    /// order, so that id order is node order) and one tenant per trace tenant.
    pub fn new(nodes: &[NodeView], tenants: usize, jobs: usize) -> Result<Self, String> {
        let mut cluster = LedgerCluster {
            ledger: Ledger::new(),
            index: 0,
            node_ids: Vec::with_capacity(nodes.len()),
            node_of: BTreeMap::new(),
            tenant_names: (0..tenants).map(ledger_tenant_name).collect(),
            ledger_job: vec![None; jobs],
            job_of: BTreeMap::new(),
            proximity: TopologyProximity::new(&[]),
        };
        for (position, node) in nodes.iter().enumerate() {
            let spec = member_spec(node);
            let response = if position == 0 {
                cluster.apply(
                    0,
                    Command::Bootstrap {
                        cluster_id: "sim".into(),
                        region: "region-0".into(),
                        ca_cert_pem: String::new(),
                        admin_token_hash: "sim-admin".into(),
                        first_member: 1,
                        spec,
                    },
                )
            } else {
                if (position - 1) % MAX_JOIN_USES as usize == 0 {
                    cluster.expect_ok(
                        0,
                        Command::CreateJoinToken {
                            hash: join_token(position),
                            expires_at_ms: u64::MAX,
                            uses: MAX_JOIN_USES,
                        },
                    )?;
                }
                cluster.apply(
                    0,
                    Command::AddMember {
                        spec,
                        token_hash: join_token(position),
                    },
                )
            };
            match response {
                LedgerResponse::NodeId(id) => {
                    cluster.node_ids.push(id);
                    cluster.node_of.insert(id, position);
                }
                other => return Err(format!("node {} not admitted: {other:?}", node.name)),
            }
        }
        for name in cluster.tenant_names.clone() {
            cluster.expect_ok(
                0,
                Command::CreateTenant {
                    name,
                    limits: TenantLimits::default(),
                },
            )?;
        }
        // Proximity from the members' labels, keyed by ledger node ids.
        let snapshot = SchedSnapshot::new(&cluster.ledger, 0, Policy::Hdrf);
        cluster.proximity = TopologyProximity::new(&snapshot.input.nodes);
        Ok(cluster)
    }

    fn apply(&mut self, now_s: u64, cmd: Command) -> LedgerResponse {
        self.index += 1;
        self.ledger.apply(
            self.index,
            &LedgerRequest {
                now_ms: ms(now_s),
                cmd,
            },
        )
    }

    fn expect_ok(&mut self, now_s: u64, cmd: Command) -> Result<(), String> {
        match self.apply(now_s, cmd) {
            LedgerResponse::Ok => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }

    /// Submits engine job `job`; the ledger's refusal reason otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &mut self,
        now_s: u64,
        job: usize,
        tenant: usize,
        nodes: u32,
        gpus_per_node: u32,
        gpu_model: &str,
        time_limit_s: u64,
    ) -> Result<(), String> {
        let tenant = self
            .tenant_names
            .get(tenant)
            .cloned()
            .ok_or_else(|| format!("unknown tenant index {tenant}"))?;
        let spec = JobSpec {
            name: format!("sim-{job}"),
            tenant,
            nodes,
            gpus_per_node,
            gpu_model: Some(gpu_model.to_string()),
            time_limit_s,
            priority: 0,
            preemptible: true,
            command: Vec::new(),
            env: BTreeMap::new(),
            workdir: None,
            ckpt_interval_s: None,
            // The simulator decides when a job gives up, not the ledger.
            max_restarts: u32::MAX,
            same: None,
            max_rtt_ms: None,
            required_labels: BTreeMap::new(),
            ..Default::default()
        };
        match self.apply(now_s, Command::SubmitJob { spec }) {
            LedgerResponse::JobId(id) => {
                if let Some(slot) = self.ledger_job.get_mut(job) {
                    *slot = Some(id);
                }
                self.job_of.insert(id, job);
                Ok(())
            }
            LedgerResponse::Rejected(reason) => Err(reason),
            other => Err(format!("{other:?}")),
        }
    }

    /// What the live leader computes: snapshot of the ledger, one pass.
    pub fn plan(&self, now_s: u64, policy: Policy) -> PlannedPass {
        let snapshot = SchedSnapshot::new(&self.ledger, ms(now_s), policy);
        let plan = shoal_consensus::sched::schedule(&snapshot.input, &self.proximity);
        let engine_plan = self.to_engine(&plan);
        PlannedPass {
            snapshot,
            plan,
            engine_plan,
        }
    }

    fn to_engine(&self, plan: &SchedPlan) -> SchedPlan {
        let job = |id: &JobId| self.job_of.get(id).map(|&j| j as u64);
        SchedPlan {
            placements: plan
                .placements
                .iter()
                .filter_map(|placement| {
                    let mut placement = placement.clone();
                    placement.job = job(&placement.job)?;
                    for (node, _) in &mut placement.nodes {
                        *node = *self.node_of.get(node)? as u64;
                    }
                    Some(placement)
                })
                .collect(),
            preemptions: plan
                .preemptions
                .iter()
                .filter_map(|p| {
                    let mut p = p.clone();
                    p.victim = job(&p.victim)?;
                    p.for_job = job(&p.for_job)?;
                    Some(p)
                })
                .collect(),
            pending_reasons: plan
                .pending_reasons
                .iter()
                .filter_map(|(id, reason)| Some((job(id)?, reason.clone())))
                .collect(),
            timed_out: plan.timed_out.iter().filter_map(job).collect(),
        }
    }

    /// Commits a planned pass as one `Schedule` command, with the placements
    /// replaced by `placements` (engine job, engine nodes with GPU indices):
    /// the scheduler's own, or the FIFO baseline's random ones. Then every
    /// job the ledger asked to stop reports its ranks' exits.
    ///
    /// `with_stops` false commits only the placements (the FIFO baseline
    /// commits its random placements one by one after the stops).
    pub fn commit(
        &mut self,
        now_s: u64,
        planned: &PlannedPass,
        placements: &[EnginePlacement],
        with_stops: bool,
    ) -> CommittedPass {
        let mut plan: Plan = planned
            .snapshot
            .to_plan(&planned.plan, &self.ledger.workload);
        if !with_stops {
            plan.timed_out.clear();
            plan.preemptions.clear();
            plan.reasons.clear();
        }
        let diameters: BTreeMap<JobId, u64> = plan
            .placements
            .iter()
            .map(|p| (p.job, p.diameter_us))
            .collect();
        plan.placements = placements
            .iter()
            .filter_map(|(job, nodes)| {
                let id = self.ledger_job.get(*job).copied().flatten()?;
                let nodes = nodes
                    .iter()
                    .map(|(node, gpus)| Some((*self.node_ids.get(*node)?, gpus.clone())))
                    .collect::<Option<Vec<_>>>()?;
                Some(PlannedPlacement {
                    job: id,
                    nodes,
                    diameter_us: diameters.get(&id).copied().unwrap_or(0),
                })
            })
            .collect();
        let mut committed = CommittedPass::default();
        if plan.is_empty() {
            return committed;
        }
        let stops: Vec<JobId> = plan
            .timed_out
            .iter()
            .copied()
            .chain(plan.preemptions.iter().map(|&(victim, _)| victim))
            .collect();
        if let LedgerResponse::Scheduled { started, refused } =
            self.apply(now_s, Command::Schedule(plan))
        {
            for id in started {
                let Some(&job) = self.job_of.get(&id) else {
                    continue;
                };
                let nodes = self
                    .ledger
                    .workload
                    .jobs
                    .get(&id)
                    .and_then(|j| j.alloc.as_ref());
                let nodes = nodes.map_or_else(Vec::new, |alloc| {
                    alloc
                        .nodes
                        .iter()
                        .filter_map(|(node, gpus)| Some((*self.node_of.get(node)?, gpus.clone())))
                        .collect()
                });
                committed.started.push((job, nodes));
            }
            for (id, reason) in refused {
                if let Some(&job) = self.job_of.get(&id) {
                    committed.refused.push((job, reason));
                }
            }
        }
        for id in stops {
            let Some(&job) = self.job_of.get(&id) else {
                continue;
            };
            // `apply` may have refused the stop (a stale plan).
            if !self.stop_requested(id) {
                continue;
            }
            self.all_ranks_exit(now_s, id, 0);
            match self.ledger.workload.jobs.get(&id).map(|j| j.state) {
                Some(JobState::Requeued) => committed.preempted.push(job),
                Some(state) if state.is_final() => committed.timed_out.push(job),
                _ => {}
            }
        }
        committed
    }

    /// Whether the ledger has asked the job's ranks to stop.
    fn stop_requested(&self, id: JobId) -> bool {
        self.ledger
            .workload
            .jobs
            .get(&id)
            .and_then(|job| job.alloc.as_ref())
            .is_some_and(|alloc| alloc.stop.is_some())
    }

    /// Every rank of the job's current allocation reports `exit_code`.
    fn all_ranks_exit(&mut self, now_s: u64, id: JobId, exit_code: i32) {
        let Some((epoch, ranks)) = self
            .ledger
            .workload
            .jobs
            .get(&id)
            .and_then(|job| job.alloc.as_ref())
            .map(|alloc| (alloc.epoch, alloc.nodes.len()))
        else {
            return;
        };
        for rank in 0..u32::try_from(ranks).unwrap_or(u32::MAX) {
            self.apply(
                now_s,
                Command::RankExited {
                    job: id,
                    epoch,
                    rank,
                    exit_code,
                    end: shoal_consensus::workload::RankEnd::Exited,
                },
            );
        }
    }

    /// The job ran to completion: every rank exits with 0.
    pub fn complete(&mut self, now_s: u64, job: usize) {
        if let Some(id) = self.ledger_job.get(job).copied().flatten() {
            self.all_ranks_exit(now_s, id, 0);
        }
    }

    /// The engine gave up on a waiting job.
    pub fn cancel(&mut self, now_s: u64, job: usize) {
        if let Some(id) = self.ledger_job.get(job).copied().flatten() {
            self.apply(now_s, Command::CancelJob { job: id });
        }
    }

    /// A node stops answering (`Down`) or comes back (`Alive`). The ledger
    /// requeues the jobs of a lost node itself; returns them.
    pub fn set_node_state(&mut self, now_s: u64, node: usize, up: bool) -> Vec<usize> {
        let Some(&id) = self.node_ids.get(node) else {
            return Vec::new();
        };
        let hit: Vec<JobId> = if up {
            Vec::new()
        } else {
            self.ledger
                .workload
                .holding()
                .filter(|(_, alloc)| alloc.nodes.iter().any(|(n, _)| *n == id))
                .map(|(job, _)| job.id)
                .collect()
        };
        let state = if up {
            MemberState::Alive
        } else {
            MemberState::Down
        };
        self.apply(now_s, Command::SetMemberState { id, state });
        hit.iter()
            .filter_map(|id| self.job_of.get(id).copied())
            .collect()
    }

    /// Whether the ledger sees engine job `job` as holding GPUs.
    #[cfg(test)]
    pub fn is_running(&self, job: usize) -> bool {
        self.ledger_job
            .get(job)
            .copied()
            .flatten()
            .and_then(|id| self.ledger.workload.jobs.get(&id))
            .is_some_and(|j| j.alloc.is_some())
    }
}

fn member_spec(node: &NodeView) -> MemberSpec {
    MemberSpec {
        name: node.name.clone(),
        rpc_addr: String::new(),
        api_addr: String::new(),
        labels: node.labels.clone(),
        gpus: node
            .gpus
            .iter()
            .map(|gpu| GpuInfo {
                index: gpu.index,
                model: gpu.model.clone(),
                memory_mb: 0,
                uuid: format!("{}-gpu-{}", node.name, gpu.index),
                allocated_to: None,
                numa_node: gpu.numa_node,
                nvlink_peers: gpu.nvlink_peers.clone(),
                mig_enabled: false,
                health: String::new(),
                health_reason: None,
            })
            .collect(),
        gossip_peer_id: String::new(),
        gossip_addr: String::new(),
        ..Default::default()
    }
}
