//! The ledger as the scheduler sees it, and the scheduler's answer as a
//! ledger command. Pure; the leader calls these around `sched::schedule`.

use std::collections::BTreeMap;

use shoal_sdk::MemberState;

use super::{Plan, PlannedPlacement, Workload};
use crate::escrow::RegionalShares;
use crate::ids::NodeId;
use crate::members::Member;
use crate::sched::{
    GangRequest, GpuView, JobId, NodeView, PendingJob, Policy, RunningJob, SchedInput, SchedPlan,
    TenantView,
};

/// A scheduling pass's input, built from one consistent read of the ledger.
pub struct SchedSnapshot {
    pub input: SchedInput,
}

/// Tenants with their current holdings; `gpu_hours_used` is what the budget
/// check counts (finished usage plus running jobs' worst case), so that the
/// scheduler and `apply` agree on admission.
fn part(shares: &RegionalShares, tenant: &str) -> crate::escrow::RegionalShare {
    shares.get(tenant).copied().unwrap_or_default()
}

fn min_cap<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A tenant with caps across regions counts this region's share of each
/// as one more cap.
pub fn tenant_views(workload: &Workload, shares: &RegionalShares) -> Vec<TenantView> {
    let held = workload.gpus_in_use();
    workload
        .tenants
        .values()
        .map(|tenant| TenantView {
            name: tenant.name.clone(),
            parent: tenant.limits.parent.clone(),
            weight: f64::from(tenant.limits.weight.max(1)),
            max_gpus: min_cap(
                tenant.limits.max_gpus,
                part(shares, &tenant.name).gpus.map(|(share, _)| share),
            ),
            global_cap: part(shares, &tenant.name)
                .gpus
                .filter(|(share, _)| tenant.limits.max_gpus.is_none_or(|max| *share < max))
                .map(|(_, global)| global),
            gpu_hours_limit: min_cap(
                tenant.limits.gpu_seconds_limit,
                part(shares, &tenant.name)
                    .gpu_seconds
                    .map(|(share, _)| share),
            )
            .map(|s| s as f64 / 3600.0),
            gpu_hours_used: workload.committed_gpu_seconds(&tenant.name) as f64 / 3600.0,
            gpus_in_use: held.get(tenant.name.as_str()).copied().unwrap_or(0),
        })
        .collect()
}

impl SchedSnapshot {
    /// The scheduler's view of `workload` on `members` (those that have
    /// not left), each tenant capped by this region's part of its caps
    /// across regions (`shares`).
    pub fn of<'a>(
        workload: &Workload,
        members: impl Iterator<Item = &'a Member>,
        shares: &RegionalShares,
        now_ms: u64,
        policy: Policy,
    ) -> Self {
        let mut owner = BTreeMap::new();
        // Nodes an exclusive job holds: all their GPUs count as its own, so
        // nothing else is placed there while it runs.
        let mut whole = BTreeMap::new();
        for (job, alloc) in workload.holding() {
            for (node, gpus) in &alloc.nodes {
                for gpu in gpus {
                    owner.insert((*node, *gpu), job.id);
                }
                if job.spec.choice.exclusive {
                    whole.insert(*node, job.id);
                }
            }
        }
        let nodes = members
            .map(|member| NodeView {
                id: member.id,
                name: member.spec.name.clone(),
                healthy: member.state == MemberState::Alive
                    && !workload.drained.contains(&member.id),
                labels: member.spec.labels.clone(),
                // A faulty or drained GPU is not there for the planner.
                gpus: member
                    .spec
                    .gpus
                    .iter()
                    .filter(|gpu| workload.gpu_fault(member.id, gpu.index).is_none())
                    .map(|gpu| GpuView {
                        index: gpu.index,
                        model: gpu.model.clone(),
                        allocated_to: owner
                            .get(&(member.id, gpu.index))
                            .or_else(|| whole.get(&member.id))
                            .copied(),
                        numa_node: gpu.numa_node,
                        nvlink_peers: gpu.nvlink_peers.clone(),
                    })
                    .collect(),
            })
            .collect();
        let running = workload
            .holding()
            .map(|(job, alloc)| RunningJob {
                id: job.id,
                tenant: job.spec.tenant.clone(),
                gpus: alloc.gpu_count(),
                nodes: alloc.nodes.iter().map(|(node, _)| *node).collect(),
                started_s: alloc.started_at_ms / 1000,
                time_limit_s: job.spec.time_limit_s,
                // A job already stopping cannot be preempted again.
                preemptible: job.spec.preemptible && alloc.stop.is_none(),
                priority: job.spec.priority,
                last_checkpoint_s: job.last_ckpt_at_ms.map(|ms| ms / 1000),
            })
            .collect();
        let pending = workload
            .jobs
            .values()
            .filter(|job| job.schedulable(&workload.jobs, now_ms))
            .map(|job| {
                (
                    PendingJob {
                        id: job.id,
                        tenant: job.spec.tenant.clone(),
                        priority: job.spec.priority,
                        submitted_seq: job.id,
                        gpus: job.spec.total_gpus(),
                        time_limit_s: job.spec.time_limit_s,
                        preemptible: job.spec.preemptible,
                        boost: i32::try_from(job.preemptions).unwrap_or(i32::MAX),
                    },
                    GangRequest {
                        job: job.id,
                        tenant: job.spec.tenant.clone(),
                        nodes: job.spec.nodes,
                        gpus_per_node: job.spec.gpus_per_node,
                        gpu_model: job.spec.gpu_model.clone(),
                        same: job.spec.same,
                        max_rtt_ms: job.spec.max_rtt_ms.map(f64::from),
                        required_labels: job.spec.required_labels.clone(),
                        choice: job.spec.choice.clone(),
                    },
                )
            })
            .collect();
        SchedSnapshot {
            input: SchedInput {
                now_s: now_ms / 1000,
                nodes,
                tenants: tenant_views(workload, shares),
                running,
                pending,
                policy,
            },
        }
    }

    /// The ledger command for a pass's plan; reasons that did not change
    /// are left out so an idle cluster does not grow the log.
    pub fn to_plan(&self, plan: &SchedPlan, workload: &Workload) -> Plan {
        Plan {
            preemptions: plan
                .preemptions
                .iter()
                .map(|p| (p.victim, p.for_job))
                .collect(),
            placements: plan
                .placements
                .iter()
                .map(|p| PlannedPlacement {
                    job: p.job,
                    nodes: p.nodes.clone(),
                    diameter_us: if p.diameter_ms.is_finite() {
                        (p.diameter_ms.max(0.0) * 1000.0) as u64
                    } else {
                        0
                    },
                })
                .collect(),
            timed_out: plan
                .timed_out
                .iter()
                .copied()
                .filter(|id| {
                    workload
                        .jobs
                        .get(id)
                        .and_then(|job| job.alloc.as_ref())
                        .is_some_and(|alloc| alloc.stop.is_none())
                })
                .collect(),
            reasons: plan
                .pending_reasons
                .iter()
                .filter(|(id, reason)| {
                    workload
                        .jobs
                        .get(id)
                        .is_some_and(|job| &job.reason != *reason)
                })
                .map(|(id, reason)| (*id, reason.clone()))
                .collect(),
        }
    }
}

/// The id a `--test-only` job goes by inside its trial pass: after every
/// real job in submit order.
pub const TRIAL_JOB: JobId = JobId::MAX;

/// Where and when a job would start (`--test-only`), decided on one read
/// of the ledger without committing anything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrialStart {
    /// Seconds from now: 0 when the next pass would start it; later, when
    /// the running jobs (and those that pass would start) hold their GPUs
    /// to their time limits and nothing else arrives. `None`: not before
    /// all of them end, or it waits for something else (`reason`).
    pub start_in_s: Option<u64>,
    /// Its nodes and GPUs then, in rank order.
    pub nodes: Vec<(NodeId, Vec<u32>)>,
    /// Why it would not start now: the scheduler's reason.
    pub reason: Option<String>,
}
