//! Applying the scheduler's plan: each placement checked against the state
//! it lands on (free GPUs, nodes, quota, budgets, caps across regions),
//! then started; and stopping a job.

use super::*;

impl Workload {
    /// Applies a committed scheduling pass. `epoch` is the log index.
    /// `validate` is false only for a planted bug (the ledger's
    /// `ApplyChecks`).
    pub(crate) fn apply_plan(
        &mut self,
        plan: &Plan,
        members: &BTreeMap<NodeId, Member>,
        epoch: u64,
        now_ms: u64,
        validate: bool,
        shares: &RegionalShares,
    ) -> PlanOutcome {
        for id in &plan.timed_out {
            if let Some(alloc) = self.jobs.get_mut(id).and_then(|job| job.alloc.as_mut()) {
                if alloc.stop.is_none()
                    && now_ms
                        >= alloc
                            .started_at_ms
                            .saturating_add(self.jobs[id].spec.time_limit_s.saturating_mul(1000))
                {
                    self.request_stop(*id, StopCause::TimeLimit, now_ms);
                }
            }
        }
        for (victim, for_job) in &plan.preemptions {
            let victim_ok = self.jobs.get(victim).is_some_and(|job| {
                job.spec.preemptible && job.alloc.as_ref().is_some_and(|a| a.stop.is_none())
            });
            let for_ok = self
                .jobs
                .get(for_job)
                .is_some_and(|job| job.state.is_waiting());
            if victim_ok && for_ok {
                self.request_stop(*victim, StopCause::Preempted, now_ms);
                if let Some(job) = self.jobs.get_mut(victim) {
                    job.yields_to = Some(*for_job);
                }
                if let Some(job) = self.jobs.get_mut(for_job) {
                    job.waiting_for.push(*victim);
                    job.reason = format!("waiting for preempted job {victim} to release its GPUs");
                }
            }
        }
        let mut outcome = PlanOutcome::default();
        let mut busy = self.busy_gpus();
        // Per node with GPUs in use: whether an exclusive job holds it.
        let mut used = self.used_nodes();
        for placement in &plan.placements {
            let verdict = if validate {
                self.validate_placement(placement, members, &busy, &used, now_ms, shares)
            } else {
                Ok(())
            };
            match verdict {
                Ok(()) => {
                    let exclusive = self
                        .jobs
                        .get(&placement.job)
                        .is_some_and(|job| job.spec.choice.exclusive);
                    let held = self.held_gpus(placement, members);
                    for (node, gpus) in &held {
                        for gpu in gpus {
                            busy.insert((*node, *gpu));
                        }
                        *used.entry(*node).or_default() |= exclusive;
                    }
                    self.start(placement, held, epoch, now_ms);
                    outcome.started.push(placement.job);
                }
                Err(reason) => {
                    if let Some(job) = self.jobs.get_mut(&placement.job) {
                        if job.state.is_waiting() {
                            job.reason = format!("placement refused: {reason}");
                        }
                    }
                    outcome.refused.push((placement.job, reason));
                }
            }
        }
        for (id, reason) in &plan.reasons {
            if let Some(job) = self.jobs.get_mut(id) {
                if job.state.is_waiting() && job.waiting_for.is_empty() {
                    job.reason = reason.clone();
                }
            }
        }
        outcome
    }

    pub(super) fn busy_gpus(&self) -> BTreeSet<(NodeId, u32)> {
        self.holding()
            .flat_map(|(_, alloc)| {
                alloc
                    .nodes
                    .iter()
                    .flat_map(|(node, gpus)| gpus.iter().map(move |gpu| (*node, *gpu)))
            })
            .collect()
    }

    /// Nodes on which some job holds GPUs, each with whether one of those
    /// jobs took it whole (`--exclusive`).
    pub(super) fn used_nodes(&self) -> BTreeMap<NodeId, bool> {
        let mut used: BTreeMap<NodeId, bool> = BTreeMap::new();
        for (job, alloc) in self.holding() {
            for (node, _) in &alloc.nodes {
                *used.entry(*node).or_default() |= job.spec.choice.exclusive;
            }
        }
        used
    }

    pub(super) fn validate_placement(
        &self,
        placement: &PlannedPlacement,
        members: &BTreeMap<NodeId, Member>,
        busy: &BTreeSet<(NodeId, u32)>,
        used: &BTreeMap<NodeId, bool>,
        now_ms: u64,
        shares: &RegionalShares,
    ) -> Result<(), String> {
        let job = self
            .jobs
            .get(&placement.job)
            .ok_or_else(|| format!("no job {}", placement.job))?;
        if !job.state.is_waiting() {
            return Err(format!("job {} is {}, not waiting", job.id, job.state));
        }
        if !job.schedulable(&self.jobs, now_ms) {
            return Err(format!(
                "job {} waits for preempted jobs {:?} or yields to job {:?}",
                job.id, job.waiting_for, job.yields_to
            ));
        }
        let spec = &job.spec;
        if placement.nodes.len() != spec.nodes as usize {
            return Err(format!(
                "{} nodes planned, {} requested",
                placement.nodes.len(),
                spec.nodes
            ));
        }
        let mut seen_nodes = BTreeSet::new();
        for (node, gpus) in &placement.nodes {
            if !seen_nodes.insert(*node) {
                return Err(format!("node {node} planned twice"));
            }
            let member = members
                .get(node)
                .ok_or_else(|| format!("node {node} is not a member"))?;
            if member.state != MemberState::Alive {
                return Err(format!("node {} is {}", member.spec.name, member.state));
            }
            if self.drained.contains(node) {
                return Err(format!("node {} is drained", member.spec.name));
            }
            if !spec.choice.allows(*node) {
                let flag = if spec.choice.only.is_empty() {
                    "in --exclude"
                } else {
                    "not in --nodelist"
                };
                return Err(format!("node {} is {flag}", member.spec.name));
            }
            match used.get(node) {
                Some(true) => {
                    return Err(format!(
                        "node {} is held whole by an exclusive job",
                        member.spec.name
                    ))
                }
                Some(false) if spec.choice.exclusive => {
                    return Err(format!(
                        "node {} is partly in use; an exclusive job needs it whole",
                        member.spec.name
                    ))
                }
                _ => {}
            }
            if gpus.len() != spec.gpus_per_node as usize {
                return Err(format!(
                    "{} GPUs planned on {}, {} requested",
                    gpus.len(),
                    member.spec.name,
                    spec.gpus_per_node
                ));
            }
            let mut seen_gpus = BTreeSet::new();
            for gpu in gpus {
                if !seen_gpus.insert(*gpu) {
                    return Err(format!("GPU {gpu} of {} planned twice", member.spec.name));
                }
                let info = member
                    .spec
                    .gpus
                    .iter()
                    .find(|g| g.index == *gpu)
                    .ok_or_else(|| format!("{} has no GPU {gpu}", member.spec.name))?;
                if let Some(fault) = self.gpu_fault(*node, *gpu) {
                    return Err(format!(
                        "GPU {gpu} of {} takes no work: {}",
                        member.spec.name, fault.reason
                    ));
                }
                if let Some(model) = &spec.gpu_model {
                    if !gpu_model_matches(model, &info.model) {
                        return Err(format!(
                            "GPU {gpu} of {} is a {}, not a {model}",
                            member.spec.name, info.model
                        ));
                    }
                }
                if busy.contains(&(*node, *gpu)) {
                    return Err(format!(
                        "GPU {gpu} of {} is already allocated",
                        member.spec.name
                    ));
                }
            }
            for (key, value) in &spec.required_labels {
                if member.spec.labels.get(key) != Some(value) {
                    return Err(format!("{} lacks label {key}={value}", member.spec.name));
                }
            }
        }
        let held: u32 = self
            .held_gpus(placement, members)
            .iter()
            .map(|(_, gpus)| gpus.len() as u32)
            .sum();
        self.check_quota_for(spec, held, shares)
    }

    /// The GPUs a placement holds, in rank order: those planned and, for an
    /// exclusive job, every other GPU of its nodes that takes work. An
    /// exclusive job holds (its ranks see) and is charged for whole nodes,
    /// as Slurm's `--exclusive` allocates every GPU of its nodes: quota,
    /// budget and fair share count what a tenant keeps from the others.
    pub(super) fn held_gpus(
        &self,
        placement: &PlannedPlacement,
        members: &BTreeMap<NodeId, Member>,
    ) -> Vec<(NodeId, Vec<u32>)> {
        let exclusive = self
            .jobs
            .get(&placement.job)
            .is_some_and(|job| job.spec.choice.exclusive);
        // Members of an older release apply the plan as it came: every
        // replica must agree, so whole nodes wait until all speak it.
        let everyone_speaks_it = members
            .values()
            .filter(|m| m.state != MemberState::Left)
            .map(|m| m.spec.protocol().1)
            .min()
            .is_some_and(|p| p >= crate::workload::WHOLE_NODES_SINCE_PROTOCOL);
        if !exclusive || !everyone_speaks_it {
            return placement.nodes.clone();
        }
        placement
            .nodes
            .iter()
            .map(|(node, planned)| {
                let mut gpus = planned.clone();
                if let Some(member) = members.get(node) {
                    gpus.extend(member.spec.gpus.iter().map(|gpu| gpu.index).filter(|gpu| {
                        !planned.contains(gpu) && self.gpu_fault(*node, *gpu).is_none()
                    }));
                }
                (*node, gpus)
            })
            .collect()
    }

    /// The tenant and its ancestors must stay within their GPU caps and
    /// budgets once this job holds `gpus` GPUs (its spec's, or whole nodes).
    pub(super) fn check_quota_for(
        &self,
        spec: &JobSpec,
        gpus: u32,
        shares: &RegionalShares,
    ) -> Result<(), String> {
        let needed_seconds = u64::from(gpus).saturating_mul(spec.time_limit_s);
        if !self.tenants.contains_key(&spec.tenant) {
            return Err(format!("quota: unknown tenant {}", spec.tenant));
        }
        let held = self.gpus_in_use();
        for name in self.ancestry(&spec.tenant) {
            let subtree = self.subtree(name);
            let limits = &self.tenants[name].limits;
            let part = shares.get(name).copied().unwrap_or_default();
            if let Some((share, global)) = part.gpus {
                let in_use: u32 = subtree
                    .iter()
                    .map(|t| held.get(t).copied().unwrap_or(0))
                    .sum();
                if in_use.saturating_add(gpus) > share {
                    return Err(format!(
                        "quota: {name} uses {in_use} of the {share} GPUs of its global cap of {global} this region holds, job needs {}",
                        gpus
                    ));
                }
            }
            if let Some((share, global)) = part.gpu_seconds {
                let committed: u64 = subtree.iter().map(|t| self.committed_gpu_seconds(t)).sum();
                if committed.saturating_add(needed_seconds) > share {
                    return Err(format!(
                        "budget: {name} has committed {:.2} of the {:.2} GPU-hours of its global budget of {:.2} this region holds, job may use {:.2}",
                        committed as f64 / 3600.0,
                        share as f64 / 3600.0,
                        global as f64 / 3600.0,
                        needed_seconds as f64 / 3600.0
                    ));
                }
            }
            if let Some(max) = limits.max_gpus {
                let in_use: u32 = subtree
                    .iter()
                    .map(|t| held.get(t).copied().unwrap_or(0))
                    .sum();
                if in_use.saturating_add(gpus) > max {
                    return Err(format!(
                        "quota: {name} uses {in_use}/{max} GPUs, job needs {}",
                        gpus
                    ));
                }
            }
            if let Some(limit) = limits.gpu_seconds_limit {
                let committed: u64 = subtree.iter().map(|t| self.committed_gpu_seconds(t)).sum();
                if committed.saturating_add(needed_seconds) > limit {
                    return Err(format!(
                        "budget: {name} has {:.1} of {:.1} GPU-hours uncommitted, job may use {:.1}",
                        limit.saturating_sub(committed) as f64 / 3600.0,
                        limit as f64 / 3600.0,
                        needed_seconds as f64 / 3600.0
                    ));
                }
            }
        }
        Ok(())
    }

    pub(super) fn start(
        &mut self,
        placement: &PlannedPlacement,
        held: Vec<(NodeId, Vec<u32>)>,
        epoch: u64,
        now_ms: u64,
    ) {
        if let Some(job) = self.jobs.get_mut(&placement.job) {
            job.state = JobState::Running;
            job.reason = String::new();
            job.yields_to = None;
            job.not_before_ms = None;
            job.started_at_ms.get_or_insert(now_ms);
            job.last_nodes = held.clone();
            job.last_epoch = Some(epoch);
            job.alloc = Some(Allocation {
                epoch,
                nodes: held,
                started_at_ms: now_ms,
                diameter_us: placement.diameter_us,
                exits: BTreeMap::new(),
                oom_killed: BTreeSet::new(),
                stop: None,
                signals: Vec::new(),
                master_port: None,
            });
        }
    }

    pub(super) fn request_stop(&mut self, id: JobId, cause: StopCause, now_ms: u64) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let Some(alloc) = job.alloc.as_mut() else {
            return;
        };
        if alloc.stop.is_some() {
            return;
        }
        alloc.stop = Some(Stop {
            cause,
            requested_at_ms: now_ms,
        });
        match cause {
            StopCause::Preempted => {
                job.state = JobState::Preempted;
                job.reason = "preempted: waiting for the ranks to exit".into();
            }
            StopCause::TimeLimit => job.reason = "time limit reached: stopping".into(),
            StopCause::Cancelled => job.reason = "cancelling: waiting for the ranks to exit".into(),
            StopCause::RankFailed => job.reason = "a rank failed: stopping the others".into(),
            StopCause::Drained => {
                job.reason = "a node of the gang is draining: checkpointing and stopping".into()
            }
            StopCause::GpuFailed => {
                job.reason = "a GPU of the gang failed or was drained: stopping".into()
            }
            StopCause::NodeLost => {
                job.reason = "a rank was lost with its node's agent: stopping the others".into()
            }
            StopCause::Requeued => job.reason = "requeue asked: stopping the ranks".into(),
        }
    }
}
