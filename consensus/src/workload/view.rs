//! The ledger as the scheduler sees it, and the scheduler's answer as a
//! ledger command. Pure; the leader calls these around `sched::schedule`.

use std::collections::BTreeMap;

use shoal_sdk::MemberState;

use super::{Plan, PlannedPlacement, Workload};
use crate::ledger::Ledger;
use crate::sched::{
    GangRequest, GpuView, NodeView, PendingJob, Policy, RunningJob, SchedInput, SchedPlan,
    TenantView,
};

/// A scheduling pass's input, built from one consistent read of the ledger.
pub struct SchedSnapshot {
    pub input: SchedInput,
}

/// Tenants with their current holdings; `gpu_hours_used` is what the budget
/// check counts (finished usage plus running jobs' worst case), so that the
/// scheduler and `apply` agree on admission.
pub fn tenant_views(workload: &Workload) -> Vec<TenantView> {
    let held = workload.gpus_in_use();
    workload
        .tenants
        .values()
        .map(|tenant| TenantView {
            name: tenant.name.clone(),
            parent: tenant.limits.parent.clone(),
            weight: f64::from(tenant.limits.weight.max(1)),
            max_gpus: tenant.limits.max_gpus,
            gpu_hours_limit: tenant.limits.gpu_seconds_limit.map(|s| s as f64 / 3600.0),
            gpu_hours_used: workload.committed_gpu_seconds(&tenant.name) as f64 / 3600.0,
            gpus_in_use: held.get(tenant.name.as_str()).copied().unwrap_or(0),
        })
        .collect()
}

impl SchedSnapshot {
    pub fn new(ledger: &Ledger, now_ms: u64, policy: Policy) -> Self {
        let workload = &ledger.workload;
        let mut owner = BTreeMap::new();
        for (job, alloc) in workload.holding() {
            for (node, gpus) in &alloc.nodes {
                for gpu in gpus {
                    owner.insert((*node, *gpu), job.id);
                }
            }
        }
        let nodes = ledger
            .active_members()
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
                        allocated_to: owner.get(&(member.id, gpu.index)).copied(),
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
                    },
                )
            })
            .collect();
        SchedSnapshot {
            input: SchedInput {
                now_s: now_ms / 1000,
                nodes,
                tenants: tenant_views(workload),
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
