//! Builders and plan checks shared by the unit and property tests.

use std::collections::{BTreeMap, BTreeSet};

use super::*;

pub fn labels(region: &str, zone: &str, rack: &str) -> BTreeMap<String, String> {
    [("region", region), ("zone", zone), ("rack", rack)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn gpu(index: u32, model: &str) -> GpuView {
    GpuView {
        index,
        model: model.to_string(),
        allocated_to: None,
        numa_node: None,
        nvlink_peers: Vec::new(),
    }
}

pub fn node(id: NodeId, rack: &str, gpus: u32, model: &str) -> NodeView {
    NodeView {
        id,
        name: format!("node-{id}"),
        healthy: true,
        labels: labels("eu", "z1", rack),
        gpus: (0..gpus).map(|i| gpu(i, model)).collect(),
    }
}

pub fn tenant(name: &str, weight: f64) -> TenantView {
    TenantView {
        name: name.to_string(),
        parent: None,
        weight,
        max_gpus: None,
        gpu_hours_limit: None,
        gpu_hours_used: 0.0,
        gpus_in_use: 0,
        global_cap: None,
    }
}

pub fn gang(job: JobId, tenant: &str, nodes: u32, gpus_per_node: u32) -> GangRequest {
    GangRequest {
        job,
        tenant: tenant.to_string(),
        nodes,
        gpus_per_node,
        gpu_model: None,
        same: None,
        max_rtt_ms: None,
        required_labels: BTreeMap::new(),
        choice: Default::default(),
    }
}

pub fn pending(
    id: JobId,
    tenant: &str,
    nodes: u32,
    gpus_per_node: u32,
    time_limit_s: u64,
) -> (PendingJob, GangRequest) {
    (
        PendingJob {
            id,
            tenant: tenant.to_string(),
            priority: 0,
            submitted_seq: id,
            gpus: nodes * gpus_per_node,
            time_limit_s,
            preemptible: true,
            boost: 0,
        },
        gang(id, tenant, nodes, gpus_per_node),
    )
}

/// Marks `count` free GPUs of `node_id` as held by `job` and returns the job.
pub fn occupy(
    nodes: &mut [NodeView],
    node_id: NodeId,
    count: u32,
    job: JobId,
    tenant: &str,
    started_s: u64,
    time_limit_s: u64,
) -> RunningJob {
    let mut taken = 0;
    for node in nodes.iter_mut().filter(|n| n.id == node_id) {
        for gpu in node.gpus.iter_mut().filter(|g| g.allocated_to.is_none()) {
            if taken < count {
                gpu.allocated_to = Some(job);
                taken += 1;
            }
        }
    }
    assert_eq!(taken, count, "node {node_id} lacks {count} free GPUs");
    RunningJob {
        id: job,
        tenant: tenant.to_string(),
        gpus: count,
        nodes: vec![node_id],
        started_s,
        time_limit_s,
        preemptible: true,
        priority: 0,
        last_checkpoint_s: None,
    }
}

/// Writes a placement into the views, as the caller would after committing.
pub fn apply(nodes: &mut [NodeView], placement: &Placement) {
    for (node_id, indices) in &placement.nodes {
        for node in nodes.iter_mut().filter(|n| n.id == *node_id) {
            for gpu in node.gpus.iter_mut().filter(|g| indices.contains(&g.index)) {
                gpu.allocated_to = Some(placement.job);
            }
        }
    }
}

pub fn input(
    nodes: Vec<NodeView>,
    tenants: Vec<TenantView>,
    running: Vec<RunningJob>,
    pending: Vec<(PendingJob, GangRequest)>,
    policy: Policy,
) -> SchedInput {
    SchedInput {
        now_s: 0,
        nodes,
        tenants,
        running,
        pending,
        policy,
    }
}

/// Every promise a plan makes, checked against the input it came from.
pub fn check_plan(input: &SchedInput, plan: &SchedPlan) -> Result<(), String> {
    let requests: BTreeMap<JobId, &(PendingJob, GangRequest)> = input
        .pending
        .iter()
        .map(|entry| (entry.0.id, entry))
        .collect();
    let running: BTreeMap<JobId, &RunningJob> = input.running.iter().map(|r| (r.id, r)).collect();
    let victims: BTreeSet<JobId> = plan.preemptions.iter().map(|p| p.victim).collect();
    for preemption in &plan.preemptions {
        let victim = running
            .get(&preemption.victim)
            .ok_or(format!("preempted unknown job {}", preemption.victim))?;
        if !victim.preemptible {
            return Err(format!("preempted non-preemptible job {}", victim.id));
        }
        if input.policy != Policy::HdrfPreempt {
            return Err(format!("{:?} preempted job {}", input.policy, victim.id));
        }
    }

    let mut used: BTreeSet<(NodeId, u32)> = BTreeSet::new();
    let mut placed: BTreeSet<JobId> = BTreeSet::new();
    for placement in &plan.placements {
        let (job, request) = requests
            .get(&placement.job)
            .ok_or(format!("placed unknown job {}", placement.job))?;
        if !placed.insert(job.id) {
            return Err(format!("job {} placed twice", job.id));
        }
        if placement.nodes.len() != request.nodes as usize {
            return Err(format!(
                "job {} got {} nodes",
                job.id,
                placement.nodes.len()
            ));
        }
        let distinct: BTreeSet<NodeId> = placement.nodes.iter().map(|(n, _)| *n).collect();
        if distinct.len() != placement.nodes.len() {
            return Err(format!("job {} reuses a node", job.id));
        }
        let mut groups = BTreeSet::new();
        for (node_id, indices) in &placement.nodes {
            let node = input
                .nodes
                .iter()
                .find(|n| n.id == *node_id)
                .ok_or(format!("job {} on unknown node {node_id}", job.id))?;
            if !node.healthy {
                return Err(format!("job {} on unhealthy node {node_id}", job.id));
            }
            let distinct_gpus: BTreeSet<u32> = indices.iter().copied().collect();
            if distinct_gpus.len() != request.gpus_per_node as usize
                || indices.len() != distinct_gpus.len()
            {
                return Err(format!("job {} got {indices:?} on node {node_id}", job.id));
            }
            let mut models = BTreeSet::new();
            for index in indices {
                let gpu = node
                    .gpus
                    .iter()
                    .find(|g| g.index == *index)
                    .ok_or(format!("job {} on missing GPU {node_id}/{index}", job.id))?;
                if let Some(holder) = gpu.allocated_to {
                    if !victims.contains(&holder) {
                        return Err(format!("job {} on busy GPU {node_id}/{index}", job.id));
                    }
                }
                if request.gpu_model.as_ref().is_some_and(|m| *m != gpu.model) {
                    return Err(format!("job {} on wrong model", job.id));
                }
                models.insert(gpu.model.clone());
                if !used.insert((*node_id, *index)) {
                    return Err(format!("GPU {node_id}/{index} handed out twice"));
                }
            }
            if models.len() != 1 {
                return Err(format!("job {} mixes models on node {node_id}", job.id));
            }
            for (key, value) in &request.required_labels {
                if node.labels.get(key) != Some(value) {
                    return Err(format!(
                        "job {} on node {node_id} missing label {key}",
                        job.id
                    ));
                }
            }
            if let Some(tier) = request.same {
                let path = model::TopologyPath::of(&node.labels);
                groups.insert(path.group(tier).map(|g| format!("{g:?}")));
            }
        }
        if request.same.is_some()
            && request.nodes > 1
            && (groups.len() != 1 || groups.contains(&None))
        {
            return Err(format!(
                "job {} breaks its topology constraint: {groups:?}",
                job.id
            ));
        }
        if let Some(limit) = request.max_rtt_ms {
            if placement.diameter_ms > limit {
                return Err(format!("job {} exceeds max RTT", job.id));
            }
        }
    }

    for (job, _) in &input.pending {
        let reason = plan.pending_reasons.get(&job.id);
        match (placed.contains(&job.id), reason) {
            (true, Some(reason)) => {
                return Err(format!("placed job {} has reason {reason}", job.id))
            }
            (false, None) => return Err(format!("pending job {} has no reason", job.id)),
            (false, Some(reason)) if reason.trim().is_empty() => {
                return Err(format!("pending job {} has an empty reason", job.id))
            }
            _ => {}
        }
    }

    check_quotas(input, plan, &placed)?;

    if input.policy == Policy::Fifo {
        for (job, _) in &input.pending {
            if !placed.contains(&job.id) {
                let jumped = input.pending.iter().find(|(other, _)| {
                    placed.contains(&other.id)
                        && (other.submitted_seq, other.id) > (job.submitted_seq, job.id)
                });
                if let Some((other, _)) = jumped {
                    return Err(format!(
                        "fifo placed job {} ahead of pending job {}",
                        other.id, job.id
                    ));
                }
            }
        }
    }

    let expected_timeouts: BTreeSet<JobId> = input
        .running
        .iter()
        .filter(|r| input.now_s >= r.started_s + r.time_limit_s)
        .map(|r| r.id)
        .collect();
    if plan.timed_out.iter().copied().collect::<BTreeSet<_>>() != expected_timeouts {
        return Err("timed_out disagrees".to_string());
    }
    Ok(())
}

fn check_quotas(
    input: &SchedInput,
    plan: &SchedPlan,
    placed: &BTreeSet<JobId>,
) -> Result<(), String> {
    let parent_of: BTreeMap<&str, Option<&str>> = input
        .tenants
        .iter()
        .map(|t| (t.name.as_str(), t.parent.as_deref()))
        .collect();
    // Tests only build acyclic trees, so a plain walk terminates.
    let chain = |tenant: &str| -> Vec<String> {
        let mut chain = vec![tenant.to_string()];
        let mut cursor = parent_of.get(tenant).copied().flatten();
        while let Some(parent) = cursor {
            chain.push(parent.to_string());
            cursor = parent_of.get(parent).copied().flatten();
        }
        chain
    };
    let mut usage: BTreeMap<String, i64> = BTreeMap::new();
    let mut received: BTreeSet<String> = BTreeSet::new();
    for tenant in &input.tenants {
        for t in chain(&tenant.name) {
            *usage.entry(t).or_default() += i64::from(tenant.gpus_in_use);
        }
    }
    for (job, _) in input
        .pending
        .iter()
        .filter(|(job, _)| placed.contains(&job.id))
    {
        for t in chain(&job.tenant) {
            *usage.entry(t.clone()).or_default() += i64::from(job.gpus);
            received.insert(t);
        }
    }
    for preemption in &plan.preemptions {
        if let Some(victim) = input.running.iter().find(|r| r.id == preemption.victim) {
            for t in chain(&victim.tenant) {
                *usage.entry(t).or_default() -= i64::from(victim.gpus);
            }
        }
    }
    for tenant in &input.tenants {
        if let Some(max) = tenant.max_gpus {
            let used = usage.get(&tenant.name).copied().unwrap_or(0);
            if received.contains(&tenant.name) && used > i64::from(max) {
                return Err(format!(
                    "tenant {} at {used} GPUs exceeds max {max}",
                    tenant.name
                ));
            }
        }
    }
    Ok(())
}
