//! The scheduler's view of the ledger, and a trial pass for "when would
//! this job start" ([`crate::workload::view`] builds the view from the
//! workload).

use super::Ledger;
use crate::sched::{
    place_gang, schedule, GangRequest, JobId, PendingJob, Policy, Proximity, TopologyProximity,
};
use crate::workload::{SchedSnapshot, TrialStart, TRIAL_JOB};
use std::collections::BTreeMap;

impl SchedSnapshot {
    /// The scheduler's view of `ledger` at `now_ms`.
    pub fn new(ledger: &Ledger, now_ms: u64, policy: Policy) -> Self {
        Self::of(
            &ledger.workload,
            ledger.active_members(),
            &ledger.regional_shares(),
            now_ms,
            policy,
        )
    }
}

/// [`TrialStart`] of `spec`: refused as a submit would be (the same
/// checks), else one scheduling pass on the ledger with the job added
/// last; when it does not fit now, the running jobs' GPUs are freed at
/// their deadlines, earliest first, until it fits. Jobs still waiting
/// ahead of it are not counted (an estimate, as Slurm's is). Without
/// `prox`, distances are estimated from the nodes' topology labels.
pub fn trial_start(
    ledger: &Ledger,
    spec: &crate::workload::JobSpec,
    now_ms: u64,
    policy: Policy,
    prox: Option<&dyn Proximity>,
) -> Result<TrialStart, String> {
    ledger.workload.check_submit(spec, &ledger.members)?;
    if spec.submit_held {
        return Ok(TrialStart {
            reason: Some("held: it starts only after `scontrol release`".into()),
            ..TrialStart::default()
        });
    }
    if !spec.dependencies.is_empty() || spec.singleton {
        return Ok(TrialStart {
            reason: Some("it waits for its dependencies".into()),
            ..TrialStart::default()
        });
    }
    let mut snapshot = SchedSnapshot::new(ledger, now_ms, policy);
    let request = GangRequest {
        job: TRIAL_JOB,
        tenant: spec.tenant.clone(),
        nodes: spec.nodes,
        gpus_per_node: spec.gpus_per_node,
        gpu_model: spec.gpu_model.clone(),
        same: spec.same,
        max_rtt_ms: spec.max_rtt_ms.map(f64::from),
        required_labels: spec.required_labels.clone(),
        choice: spec.choice.clone(),
    };
    snapshot.input.pending.push((
        PendingJob {
            id: TRIAL_JOB,
            tenant: spec.tenant.clone(),
            priority: spec.priority,
            submitted_seq: TRIAL_JOB,
            gpus: spec.total_gpus(),
            time_limit_s: spec.time_limit_s,
            preemptible: spec.preemptible,
            boost: 0,
        },
        request.clone(),
    ));
    let labels;
    let prox = match prox {
        Some(prox) => prox,
        None => {
            labels = TopologyProximity::new(&snapshot.input.nodes);
            &labels
        }
    };
    let plan = schedule(&snapshot.input, prox);
    if let Some(placed) = plan.placements.iter().find(|p| p.job == TRIAL_JOB) {
        return Ok(TrialStart {
            start_in_s: Some(0),
            nodes: placed.nodes.clone(),
            reason: None,
        });
    }
    let reason = plan.pending_reasons.get(&TRIAL_JOB).cloned();
    let input = &snapshot.input;
    let now_s = input.now_s;
    // Who holds what until when: the running jobs, and what this pass
    // would start.
    let mut nodes = input.nodes.clone();
    let mut deadline: BTreeMap<JobId, u64> = input
        .running
        .iter()
        .map(|job| (job.id, job.deadline_s().max(now_s)))
        .collect();
    for placement in &plan.placements {
        let limit = input
            .pending
            .iter()
            .find(|(job, _)| job.id == placement.job)
            .map_or(0, |(job, _)| job.time_limit_s);
        deadline.insert(placement.job, now_s.saturating_add(limit));
        for (node, gpus) in &placement.nodes {
            for view in nodes.iter_mut().filter(|n| n.id == *node) {
                for gpu in view.gpus.iter_mut().filter(|g| gpus.contains(&g.index)) {
                    gpu.allocated_to = Some(placement.job);
                }
            }
        }
    }
    let mut times: Vec<u64> = deadline.values().copied().collect();
    times.sort_unstable();
    times.dedup();
    for time in times {
        for gpu in nodes.iter_mut().flat_map(|n| n.gpus.iter_mut()) {
            if gpu
                .allocated_to
                .is_some_and(|job| deadline.get(&job).is_some_and(|&end| end <= time))
            {
                gpu.allocated_to = None;
            }
        }
        if let Ok(placement) = place_gang(&nodes, prox, &request) {
            return Ok(TrialStart {
                start_in_s: Some(time.saturating_sub(now_s)),
                nodes: placement.nodes,
                reason,
            });
        }
    }
    Ok(TrialStart {
        start_in_s: None,
        nodes: Vec::new(),
        reason,
    })
}
