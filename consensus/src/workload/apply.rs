//! State transitions of tenants and jobs. Called from `Ledger::apply` only.

use std::collections::{BTreeMap, BTreeSet};

use shoal_sdk::MemberState;

use super::blame::{attribute, Attribution, GangNode, NodeHealth};
use super::{
    Allocation, Checkpoint, CkptPart, GpuFault, Job, JobId, JobSpec, JobState, Plan,
    PlannedPlacement, RankEnd, Stop, StopCause, Tenant, TenantLimits, TenantUpdate, WarnSignal,
    Workload, CKPT_RETAIN, DEFAULT_TENANT, FAIR_SHARE_HALF_LIFE_MS, MAX_DEPENDENCIES,
    MAX_FINISHED_JOBS, MAX_JOB_SIGNALS, MAX_JOB_SPEC_BYTES, MAX_MANIFEST_BYTES, MAX_NAMED_NODES,
    MAX_USERS, REPLACE_AFTER_NODE_LOSS_MS, STOP_DEADLINE_MS,
};
use crate::escrow::RegionalShares;
use crate::ids::validate_name;
use crate::ids::NodeId;
use crate::members::Member;
use crate::sched::gpu_model_matches;

mod plan;
mod validate;

use validate::check_node_choice;
pub(crate) use validate::{check_feasible, validate_spec};

/// What a plan's application did, for the caller's answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PlanOutcome {
    pub started: Vec<JobId>,
    /// Placements refused because the plan was stale, with the reason.
    pub refused: Vec<(JobId, String)>,
}

impl Workload {
    pub(crate) fn ensure_default_tenant(&mut self, now_ms: u64) {
        if !self.tenants.contains_key(DEFAULT_TENANT) {
            self.tenants.insert(
                DEFAULT_TENANT.to_string(),
                new_tenant(DEFAULT_TENANT, TenantLimits::default(), now_ms),
            );
        }
        self.next_job_id = self.next_job_id.max(1);
    }

    pub(crate) fn create_tenant(
        &mut self,
        name: &str,
        limits: &TenantLimits,
        now_ms: u64,
    ) -> Result<(), String> {
        validate_name(name).map_err(|e| e.replacen("node name", "tenant name", 1))?;
        if self.tenants.contains_key(name) {
            return Err(format!("tenant '{name}' already exists"));
        }
        self.check_limits(name, limits)?;
        self.tenants
            .insert(name.to_string(), new_tenant(name, limits.clone(), now_ms));
        Ok(())
    }

    pub(crate) fn update_tenant(
        &mut self,
        name: &str,
        update: &TenantUpdate,
    ) -> Result<(), String> {
        let Some(tenant) = self.tenants.get(name) else {
            return Err(format!("no tenant named '{name}'"));
        };
        let mut limits = tenant.limits.clone();
        if let Some(parent) = &update.parent {
            limits.parent = parent.clone();
        }
        if let Some(max) = update.max_gpus {
            limits.max_gpus = max;
        }
        if let Some(limit) = update.gpu_seconds_limit {
            limits.gpu_seconds_limit = limit;
        }
        if let Some(weight) = update.weight {
            limits.weight = weight;
        }
        if let Some(max) = update.max_pending_jobs {
            limits.max_pending_jobs = max;
        }
        if let Some(max) = update.max_objects {
            limits.max_objects = max;
        }
        if let Some(max) = update.max_manifest_bytes {
            limits.max_manifest_bytes = max;
        }
        if let Some(max) = update.max_priority {
            limits.max_priority = max;
        }
        self.check_limits(name, &limits)?;
        if let Some(parent) = &limits.parent {
            if self.ancestry(parent).contains(&name) {
                return Err(format!(
                    "making '{parent}' the parent of '{name}' would create a cycle"
                ));
            }
        }
        if let Some(tenant) = self.tenants.get_mut(name) {
            tenant.limits = limits;
        }
        Ok(())
    }

    fn check_limits(&self, name: &str, limits: &TenantLimits) -> Result<(), String> {
        if limits.weight == 0 {
            return Err("a tenant's weight must be at least 1".into());
        }
        if let Some(parent) = &limits.parent {
            if parent == name {
                return Err(format!("tenant '{name}' cannot be its own parent"));
            }
            if !self.tenants.contains_key(parent) {
                return Err(format!("no parent tenant named '{parent}'"));
            }
        }
        Ok(())
    }

    pub(crate) fn submit(
        &mut self,
        spec: &JobSpec,
        members: &BTreeMap<NodeId, Member>,
        now_ms: u64,
    ) -> Result<JobId, String> {
        self.check_submit(spec, members)?;
        let id = self.next_job_id.max(1);
        self.next_job_id = id + 1;
        self.jobs.insert(
            id,
            Job {
                id,
                spec: spec.clone(),
                state: JobState::Pending,
                reason: "waiting for the scheduler".into(),
                held: spec.submit_held,
                submitted_at_ms: now_ms,
                started_at_ms: None,
                ended_at_ms: None,
                exit_code: None,
                restarts: 0,
                preemptions: 0,
                alloc: None,
                last_nodes: Vec::new(),
                last_epoch: None,
                last_ckpt_step: None,
                last_ckpt_at_ms: None,
                waiting_for: Vec::new(),
                yields_to: None,
                not_before_ms: None,
            },
        );
        self.forget_old_jobs();
        Ok(id)
    }

    /// Every check [`Workload::submit`] makes, changing nothing: whether
    /// the job would be accepted now (`--test-only`).
    pub fn check_submit(
        &self,
        spec: &JobSpec,
        members: &BTreeMap<NodeId, Member>,
    ) -> Result<(), String> {
        validate_spec(spec)?;
        if !self.tenants.contains_key(&spec.tenant) {
            return Err(format!(
                "no tenant named '{}' (create it with `shoal tenant create`)",
                spec.tenant
            ));
        }
        check_node_choice(spec, members)?;
        check_feasible(spec, members)?;
        if spec.dependencies.len() > MAX_DEPENDENCIES {
            return Err(format!(
                "a job may depend on at most {MAX_DEPENDENCIES} jobs, not {}",
                spec.dependencies.len()
            ));
        }
        for dep in &spec.dependencies {
            // A job of another tenant is "no job N" too: it is not theirs to see.
            if self
                .jobs
                .get(&dep.job)
                .is_none_or(|j| j.spec.tenant != spec.tenant)
            {
                return Err(format!(
                    "--dependency: no job {} of tenant '{}'",
                    dep.job, spec.tenant
                ));
            }
        }
        // A job that could never run is refused now rather than left pending forever.
        for name in self.ancestry(&spec.tenant) {
            let limits = &self.tenants[name].limits;
            if let Some(max) = limits.max_gpus {
                if spec.total_gpus() > max {
                    return Err(format!(
                        "quota: the job needs {} GPUs but {name} may use at most {max}",
                        spec.total_gpus()
                    ));
                }
            }
            if let Some(limit) = limits.gpu_seconds_limit {
                let used: u64 = self
                    .subtree(name)
                    .iter()
                    .map(|t| self.tenants[*t].used_gpu_ms() / 1000)
                    .sum();
                let left = limit.saturating_sub(used);
                if spec.gpu_seconds_needed() > left {
                    return Err(format!(
                        "budget: {name} has {:.1} of {:.1} GPU-hours left, the job may use {:.1} ({} GPUs for {})",
                        left as f64 / 3600.0,
                        limit as f64 / 3600.0,
                        spec.gpu_seconds_needed() as f64 / 3600.0,
                        spec.total_gpus(),
                        format_duration_s(spec.time_limit_s),
                    ));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn cancel(&mut self, id: JobId, now_ms: u64) -> Result<(), String> {
        let job = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| format!("no job {id}"))?;
        if job.state.is_final() {
            return Err(format!("job {id} has already ended ({})", job.state));
        }
        match job.alloc.as_mut() {
            None => {
                job.state = JobState::Cancelled;
                job.reason = "cancelled before it started".into();
                job.ended_at_ms = Some(now_ms);
                job.waiting_for.clear();
            }
            Some(alloc) => {
                // A stop already under way keeps its cause, except that a
                // preempted job that is cancelled must not come back.
                match &mut alloc.stop {
                    Some(stop) => stop.cause = StopCause::Cancelled,
                    None => {
                        alloc.stop = Some(Stop {
                            cause: StopCause::Cancelled,
                            requested_at_ms: now_ms,
                        })
                    }
                }
                job.reason = "cancelling: waiting for the ranks to exit".into();
            }
        }
        Ok(())
    }

    /// `scontrol hold` (a waiting job only) and `release`.
    pub(crate) fn hold(&mut self, id: JobId, hold: bool) -> Result<(), String> {
        let job = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| format!("no job {id}"))?;
        if hold && !job.state.is_waiting() {
            return Err(format!(
                "job {id} is {}: only a waiting job can be held",
                job.state
            ));
        }
        if !hold && !job.held {
            return Err(format!("job {id} is not held"));
        }
        job.held = hold;
        Ok(())
    }

    /// `scancel --signal`: every rank of the running job gets `signal`.
    pub(crate) fn signal(&mut self, id: JobId, signal: i32) -> Result<(), String> {
        if !WarnSignal::NAMES.iter().any(|(_, n)| *n == signal) {
            return Err(format!(
                "signal {signal} cannot be sent to a job: use HUP, INT, QUIT, USR1, USR2, ALRM, TERM or CONT"
            ));
        }
        let job = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| format!("no job {id}"))?;
        let state = job.state;
        let alloc = job
            .alloc
            .as_mut()
            .filter(|a| a.stop.is_none())
            .ok_or_else(|| format!("job {id} is {state}: only a running job can be signalled"))?;
        if alloc.signals.len() >= MAX_JOB_SIGNALS {
            return Err(format!(
                "job {id} has been sent {MAX_JOB_SIGNALS} signals already; no more are recorded"
            ));
        }
        alloc.signals.push(signal);
        Ok(())
    }

    /// `sacctmgr add user NAME account=TENANT` (`Some`) or `delete user`.
    pub(crate) fn set_user(&mut self, name: &str, tenant: Option<&str>) -> Result<(), String> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid {
            return Err(format!(
                "invalid user name '{name}': 1-64 letters, digits, '-', '_' or '.'"
            ));
        }
        match tenant {
            Some(tenant) => {
                if !self.tenants.contains_key(tenant) {
                    return Err(format!("no tenant (account) named '{tenant}'"));
                }
                if !self.users.contains_key(name) && self.users.len() >= MAX_USERS {
                    return Err(format!("at most {MAX_USERS} users may be mapped"));
                }
                self.users.insert(name.to_string(), tenant.to_string());
            }
            None => {
                self.users
                    .remove(name)
                    .ok_or_else(|| format!("no user named '{name}'"))?;
            }
        }
        Ok(())
    }

    /// Rank 0's agent found `port` free on its node for allocation `epoch`.
    pub(crate) fn set_master_port(
        &mut self,
        id: JobId,
        epoch: u64,
        port: u16,
    ) -> Result<(), String> {
        let alloc = self
            .jobs
            .get_mut(&id)
            .and_then(|job| job.alloc.as_mut())
            .filter(|a| a.epoch == epoch)
            .ok_or_else(|| format!("job {id} holds no allocation of epoch {epoch}"))?;
        match alloc.master_port {
            Some(have) if have != port => Err(format!(
                "job {id} epoch {epoch} has master port {have} already"
            )),
            _ => {
                alloc.master_port = Some(port);
                Ok(())
            }
        }
    }

    /// `scontrol requeue`: a running job stops and waits in the queue again.
    pub(crate) fn requeue(&mut self, id: JobId, now_ms: u64) -> Result<(), String> {
        let job = self.jobs.get(&id).ok_or_else(|| format!("no job {id}"))?;
        if job.alloc.as_ref().is_none_or(|a| a.stop.is_some()) {
            return Err(format!(
                "job {id} is {}: only a running job can be requeued",
                job.state
            ));
        }
        self.request_stop(id, StopCause::Requeued, now_ms);
        Ok(())
    }

    /// `scontrol update JobId=N TimeLimit=T` for a job that has not ended.
    /// A running job past its new limit is stopped by the next pass. A
    /// limit lowered below the time the job has already run becomes that
    /// time: it ends the run now, and it never lowers the charge (which is
    /// the time run, bounded by the limit so that the stop's grace is not
    /// the tenant's to pay).
    pub(crate) fn set_time_limit(
        &mut self,
        id: JobId,
        time_limit_s: u64,
        now_ms: u64,
    ) -> Result<(), String> {
        if time_limit_s == 0 {
            return Err("the time limit must be positive".into());
        }
        let job = self.jobs.get(&id).ok_or_else(|| format!("no job {id}"))?;
        if job.state.is_final() {
            return Err(format!("job {id} has already ended ({})", job.state));
        }
        let ran_s = job
            .alloc
            .as_ref()
            .map_or(0, |a| now_ms.saturating_sub(a.started_at_ms).div_ceil(1000));
        let time_limit_s = time_limit_s.max(ran_s);
        let mut spec = job.spec.clone();
        let extra = time_limit_s.saturating_sub(spec.time_limit_s);
        // More time commits more of the budget: it must still be there. A
        // running job's worst case is committed already; a waiting job's
        // is not yet.
        spec.time_limit_s = if job.alloc.is_some() {
            extra
        } else {
            time_limit_s
        };
        if extra > 0 {
            for name in self.ancestry(&job.spec.tenant) {
                if let Some(limit) = self.tenants[name].limits.gpu_seconds_limit {
                    let committed: u64 = self
                        .subtree(name)
                        .iter()
                        .map(|t| self.committed_gpu_seconds(t))
                        .sum();
                    if committed.saturating_add(spec.gpu_seconds_needed()) > limit {
                        return Err(format!(
                            "budget: {name} has {:.1} GPU-hours uncommitted; {} s more for job {id} needs {:.1}",
                            limit.saturating_sub(committed) as f64 / 3600.0,
                            extra,
                            spec.gpu_seconds_needed() as f64 / 3600.0
                        ));
                    }
                }
            }
        }
        if let Some(job) = self.jobs.get_mut(&id) {
            job.spec.time_limit_s = time_limit_s;
        }
        Ok(())
    }

    /// A rank's process ended, as `end` says. Reports from an older epoch
    /// are ignored (fencing).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rank_exited(
        &mut self,
        id: JobId,
        epoch: u64,
        rank: u32,
        exit_code: i32,
        end: RankEnd,
        members: &BTreeMap<NodeId, Member>,
        now_ms: u64,
    ) -> Result<(), String> {
        let job = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| format!("no job {id}"))?;
        let Some(alloc) = job.alloc.as_mut() else {
            return Err(format!("job {id} holds no allocation"));
        };
        if alloc.epoch != epoch {
            return Err(format!(
                "stale epoch {epoch} for job {id} (current {})",
                alloc.epoch
            ));
        }
        if rank as usize >= alloc.nodes.len() {
            return Err(format!("job {id} has no rank {rank}"));
        }
        let first_report = !alloc.exits.contains_key(&rank);
        alloc.exits.entry(rank).or_insert(exit_code);
        // An OOM kill counts when the rank died of it, not when some helper
        // process of a rank that still exited 0 was killed.
        if end == RankEnd::OomKilled && first_report && exit_code != 0 {
            alloc.oom_killed.insert(rank);
        }
        let all_exited = alloc.exits.len() == alloc.nodes.len();
        let failed = exit_code != 0;
        if end == RankEnd::Lost {
            // The node's fault, whatever the other ranks reported first:
            // a survivor's collective may have failed before this report.
            if let Some(stop) = alloc
                .stop
                .as_mut()
                .filter(|s| s.cause == StopCause::RankFailed)
            {
                stop.cause = StopCause::NodeLost;
                job.exit_code = None;
            }
        }
        if failed && alloc.stop.is_none() {
            if end == RankEnd::Lost {
                self.request_stop(id, StopCause::NodeLost, now_ms);
            } else {
                // The code that brought the gang down, not the others'
                // answers to SIGTERM.
                job.exit_code = Some(exit_code);
                self.request_stop(id, StopCause::RankFailed, now_ms);
            }
        }
        if all_exited {
            self.finish(id, members, now_ms);
        }
        Ok(())
    }

    /// A rank's part of checkpoint `step` is stored and replicated; the step
    /// is committed (and becomes the job's restore point) once every rank of
    /// the epoch has recorded its part. Parts from another epoch are refused.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn checkpoint_part(
        &mut self,
        id: JobId,
        epoch: u64,
        rank: u32,
        step: u64,
        part: &CkptPart,
        now_ms: u64,
    ) -> Result<(), String> {
        if part.manifest.len() > MAX_MANIFEST_BYTES {
            return Err(format!(
                "checkpoint manifest of {} bytes exceeds {MAX_MANIFEST_BYTES}",
                part.manifest.len()
            ));
        }
        let job = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| format!("no job {id}"))?;
        let ranks = match &job.alloc {
            Some(alloc) if alloc.epoch == epoch => alloc.nodes.len() as u32,
            _ => return Err(format!("stale epoch {epoch} for job {id}")),
        };
        if rank >= ranks {
            return Err(format!("job {id} has no rank {rank}"));
        }
        if job.last_ckpt_step.is_some_and(|last| step <= last) {
            return Ok(());
        }
        let catalog = self.checkpoints.entry(id).or_default();
        let position = match catalog.iter().position(|c| c.step == step) {
            Some(i) => i,
            None => {
                catalog.push(Checkpoint {
                    step,
                    epoch,
                    ranks,
                    parts: BTreeMap::new(),
                    committed_at_ms: None,
                    regions: Vec::new(),
                });
                catalog.sort_by_key(|c| c.step);
                catalog.iter().position(|c| c.step == step).unwrap_or(0)
            }
        };
        let entry = &mut catalog[position];
        if entry.epoch != epoch {
            // The same step written again after a restart: start over.
            entry.epoch = epoch;
            entry.ranks = ranks;
            entry.parts.clear();
        }
        entry.parts.insert(rank, part.clone());
        if entry.parts.len() as u32 == entry.ranks && entry.committed_at_ms.is_none() {
            entry.committed_at_ms = Some(now_ms);
            job.last_ckpt_step = Some(step);
            job.last_ckpt_at_ms = Some(now_ms);
            // Keep the last CKPT_RETAIN committed steps; drop older ones and
            // unfinished ones that can no longer become the latest.
            let committed: Vec<u64> = catalog
                .iter()
                .filter(|c| c.committed_at_ms.is_some())
                .map(|c| c.step)
                .collect();
            let oldest_kept = committed
                .len()
                .checked_sub(CKPT_RETAIN)
                .map(|i| committed[i])
                .unwrap_or(0);
            catalog.retain(|c| {
                c.step >= oldest_kept && (c.committed_at_ms.is_some() || c.step > step)
            });
        }
        Ok(())
    }

    /// New holders of a committed part, after re-replication. Holder sets are
    /// facts about storage, not about the running allocation, so no epoch.
    pub(crate) fn set_checkpoint_holders(
        &mut self,
        id: JobId,
        step: u64,
        rank: u32,
        holders: &[NodeId],
    ) -> Result<(), String> {
        let part = self
            .checkpoints
            .get_mut(&id)
            .and_then(|catalog| catalog.iter_mut().find(|c| c.step == step))
            .and_then(|c| c.parts.get_mut(&rank))
            .ok_or_else(|| format!("job {id} has no checkpoint part {step}/{rank}"))?;
        let mut unique: Vec<NodeId> = Vec::new();
        for h in holders {
            if !unique.contains(h) {
                unique.push(*h);
            }
        }
        if unique.is_empty() {
            return Err("a checkpoint part needs at least one holder".into());
        }
        part.holders = unique;
        Ok(())
    }

    /// The leader gives up waiting for a stopping job's ranks.
    pub(crate) fn release(
        &mut self,
        id: JobId,
        epoch: u64,
        members: &BTreeMap<NodeId, Member>,
        now_ms: u64,
    ) -> Result<(), String> {
        let job = self.jobs.get(&id).ok_or_else(|| format!("no job {id}"))?;
        let Some(alloc) = &job.alloc else {
            return Err(format!("job {id} holds no allocation"));
        };
        if alloc.epoch != epoch {
            return Err(format!("stale epoch {epoch} for job {id}"));
        }
        match alloc.stop {
            Some(stop) if now_ms >= stop.requested_at_ms.saturating_add(STOP_DEADLINE_MS) => {
                self.finish(id, members, now_ms);
                Ok(())
            }
            _ => Err(format!("job {id} is not past its stop deadline")),
        }
    }

    /// Members that went down lose their jobs at once: the job is requeued
    /// (or fails when out of restarts) and agents on surviving nodes kill
    /// its ranks because the epoch they run under is no longer current.
    pub(crate) fn node_lost(
        &mut self,
        node: NodeId,
        name: &str,
        members: &BTreeMap<NodeId, Member>,
        now_ms: u64,
    ) {
        let hit: Vec<JobId> = self
            .holding()
            .filter(|(_, alloc)| alloc.nodes.iter().any(|(n, _)| *n == node))
            .map(|(job, _)| job.id)
            .collect();
        for id in hit {
            let stopping_for = self.jobs[&id].alloc.as_ref().and_then(|a| a.stop);
            if stopping_for.is_some() {
                self.finish(id, members, now_ms);
                // The lost node's ranks may still run (it may never have
                // heard of the stop): a requeued job waits for them to be
                // fenced, as one that was running does.
                if let Some(job) = self.jobs.get_mut(&id) {
                    if job.state.is_waiting() {
                        job.not_before_ms = Some(now_ms.saturating_add(REPLACE_AFTER_NODE_LOSS_MS));
                    }
                }
                continue;
            }
            self.release_allocation(id, now_ms);
            if let Some(job) = self.jobs.get_mut(&id) {
                if restart_after_node_failure(job, &format!("node {name} went down"), now_ms) {
                    job.not_before_ms = Some(now_ms.saturating_add(REPLACE_AFTER_NODE_LOSS_MS));
                    job.reason.push_str(" once its ranks are fenced");
                }
            }
        }
    }

    /// The job was taken over by another region (it resumed there from a
    /// copy of its checkpoint): it ends here at once, `cancelled` with
    /// `reason`, and its GPUs are free; agents kill its ranks because
    /// their epoch is no longer current.
    pub(crate) fn moved_away(
        &mut self,
        id: JobId,
        reason: String,
        now_ms: u64,
    ) -> Result<(), String> {
        let job = self.jobs.get(&id).ok_or_else(|| format!("no job {id}"))?;
        if job.state.is_final() {
            return Ok(());
        }
        self.release_allocation(id, now_ms);
        if let Some(job) = self.jobs.get_mut(&id) {
            job.state = JobState::Cancelled;
            job.reason = reason;
            job.ended_at_ms = Some(now_ms);
            job.waiting_for.clear();
            job.not_before_ms = None;
        }
        for other in self.jobs.values_mut() {
            other.waiting_for.retain(|victim| *victim != id);
        }
        Ok(())
    }

    /// Every rank has exited (or the leader gave up on them): settle usage
    /// and decide the final or requeued state from the stop cause.
    fn finish(&mut self, id: JobId, members: &BTreeMap<NodeId, Member>, now_ms: u64) {
        let Some(alloc) = self.jobs.get(&id).and_then(|job| job.alloc.clone()) else {
            return;
        };
        // A rank's failure is the job's own only if every node of the gang
        // is known alive and healthy (see `blame`); otherwise the gang is
        // restarted as after node loss.
        let mut cause = alloc.stop.map(|s| s.cause);
        let mut node_fault = None;
        if let (Some(StopCause::RankFailed), Some(stop)) = (cause, alloc.stop) {
            if let Attribution::NodeFailure { node, fault } =
                attribute_failure(&alloc, stop, members, now_ms)
            {
                let name = members
                    .get(&node)
                    .map_or_else(|| node.to_string(), |m| m.spec.name.clone());
                cause = Some(StopCause::NodeLost);
                node_fault = Some(fault.describe(&name));
            }
        }
        let refund_ms = self.release_allocation(id, now_ms);
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let first_failure = match cause {
            Some(StopCause::RankFailed) => job.exit_code,
            _ => None,
        }
        .or_else(|| alloc.exits.values().copied().find(|code| *code != 0));
        match cause {
            None => {
                job.exit_code = Some(first_failure.unwrap_or(0));
                job.state = if first_failure.is_some() {
                    JobState::Failed
                } else {
                    JobState::Completed
                };
                job.reason = String::new();
                job.ended_at_ms = Some(now_ms);
            }
            Some(StopCause::Drained) => {
                job.state = JobState::Requeued;
                job.reason = "requeued: a node of the gang was drained".into();
            }
            Some(StopCause::Requeued) => {
                job.state = JobState::Requeued;
                job.reason = "requeued (scontrol requeue)".into();
            }
            Some(StopCause::GpuFailed) => {
                job.state = JobState::Requeued;
                job.reason = "requeued: a GPU of the gang failed or was drained".into();
            }
            Some(StopCause::RankFailed)
                if job.spec.requeue && job.restarts < job.spec.max_restarts =>
            {
                // Gang semantics: one member failed, all were stopped, and
                // the gang starts again together under a new epoch.
                job.restarts += 1;
                job.state = JobState::Requeued;
                job.reason = format!(
                    "{}; restart {} of {}",
                    failure_reason(&alloc, first_failure),
                    job.restarts,
                    job.spec.max_restarts
                );
                job.exit_code = None;
            }
            Some(StopCause::NodeLost) => {
                let what =
                    node_fault.unwrap_or_else(|| "a rank was lost with its node's agent".into());
                // A survivor's error is a consequence, not the job's code.
                job.exit_code = None;
                restart_after_node_failure(job, &what, now_ms);
            }
            Some(StopCause::Preempted) => {
                job.preemptions += 1;
                job.state = JobState::Requeued;
                job.reason = format!(
                    "requeued after preemption (boost +{}, refunded {:.2} GPU-hours)",
                    job.preemptions,
                    refund_ms as f64 / 3_600_000.0
                );
            }
            Some(cause) => {
                job.exit_code = first_failure.or(Some(0));
                job.ended_at_ms = Some(now_ms);
                (job.state, job.reason) = match cause {
                    StopCause::Cancelled => (JobState::Cancelled, "cancelled".to_string()),
                    StopCause::TimeLimit => (
                        JobState::Timeout,
                        format!(
                            "time limit reached ({})",
                            format_duration_s(job.spec.time_limit_s)
                        ),
                    ),
                    _ if !alloc.oom_killed.is_empty() => {
                        (JobState::OutOfMemory, failure_reason(&alloc, first_failure))
                    }
                    _ => (JobState::Failed, failure_reason(&alloc, first_failure)),
                };
            }
        }
        for other in self.jobs.values_mut() {
            other.waiting_for.retain(|victim| *victim != id);
        }
        self.forget_old_jobs();
    }

    /// Frees the job's GPUs and charges its tenant; a preempted job's tenant
    /// is refunded the work since its last checkpoint. Returns the refund.
    fn release_allocation(&mut self, id: JobId, now_ms: u64) -> u64 {
        let Some(job) = self.jobs.get_mut(&id) else {
            return 0;
        };
        let Some(alloc) = job.alloc.take() else {
            return 0;
        };
        let gpus = u64::from(alloc.gpu_count());
        // Time past the limit (the stop grace, a slow node) is not the
        // tenant's doing, and charging it would let a budget overrun.
        let elapsed = now_ms
            .saturating_sub(alloc.started_at_ms)
            .min(job.spec.time_limit_s.saturating_mul(1000));
        let used = gpus.saturating_mul(elapsed);
        let preempted = matches!(
            alloc.stop,
            Some(Stop {
                cause: StopCause::Preempted,
                ..
            })
        );
        // The refund covers work lost: from the later of this allocation's
        // start and the last checkpoint, to the preemption request.
        let refund = if preempted {
            let stop_at = alloc.stop.map_or(now_ms, |s| s.requested_at_ms);
            let safe_point = job
                .last_ckpt_at_ms
                .map_or(alloc.started_at_ms, |c| c.max(alloc.started_at_ms));
            gpus.saturating_mul(stop_at.saturating_sub(safe_point))
                .min(used)
        } else {
            0
        };
        let tenant_name = job.spec.tenant.clone();
        if let Some(tenant) = self.tenants.get_mut(&tenant_name) {
            tenant.charged_gpu_ms = tenant.charged_gpu_ms.saturating_add(used);
            tenant.refunded_gpu_ms = tenant.refunded_gpu_ms.saturating_add(refund);
            decay_fair_usage(tenant, now_ms);
            tenant.fair_usage_gpu_ms = tenant
                .fair_usage_gpu_ms
                .saturating_add(used.saturating_sub(refund));
        }
        refund
    }

    /// Keeps at most [`MAX_FINISHED_JOBS`] finished jobs, dropping the oldest.
    fn forget_old_jobs(&mut self) {
        let finished: Vec<JobId> = self
            .jobs
            .values()
            .filter(|job| job.state.is_final())
            .map(|job| job.id)
            .collect();
        if finished.len() > MAX_FINISHED_JOBS {
            for id in &finished[..finished.len() - MAX_FINISHED_JOBS] {
                self.jobs.remove(id);
                self.checkpoints.remove(id);
            }
        }
    }

    /// Drains a node (no new work; its gangs checkpoint, stop and are placed
    /// elsewhere) or returns it to service.
    pub(crate) fn set_drain(&mut self, node: NodeId, drain: bool, now_ms: u64) {
        if !drain {
            self.drained.remove(&node);
            return;
        }
        self.drained.insert(node);
        let hit: Vec<JobId> = self
            .holding()
            .filter(|(_, alloc)| alloc.nodes.iter().any(|(n, _)| *n == node))
            .map(|(job, _)| job.id)
            .collect();
        for id in hit {
            self.request_stop(id, StopCause::Drained, now_ms);
        }
    }

    /// Marks `gpu` of `node` as taking no work (its holder stops and runs
    /// elsewhere), or returns it to service.
    pub(crate) fn set_gpu_fault(
        &mut self,
        node: NodeId,
        gpu: u32,
        fault: Option<GpuFault>,
        now_ms: u64,
    ) {
        let Some(fault) = fault else {
            if let Some(gpus) = self.gpu_faults.get_mut(&node) {
                gpus.remove(&gpu);
                if gpus.is_empty() {
                    self.gpu_faults.remove(&node);
                }
            }
            return;
        };
        // The first reason stays: a detected fault is not hidden by a later
        // drain, nor a drain's reason by a repeated report.
        self.gpu_faults
            .entry(node)
            .or_default()
            .entry(gpu)
            .or_insert(fault);
        let hit: Vec<JobId> = self
            .holding()
            .filter(|(_, alloc)| {
                alloc
                    .nodes
                    .iter()
                    .any(|(n, gpus)| *n == node && gpus.contains(&gpu))
            })
            .map(|(job, _)| job.id)
            .collect();
        for id in hit {
            // A rank that crashed on the failing GPU may have stopped its
            // gang first: the cause is the GPU, not the job.
            if let Some(stop) = self
                .jobs
                .get_mut(&id)
                .and_then(|j| j.alloc.as_mut())
                .and_then(|a| a.stop.as_mut())
                .filter(|s| s.cause == StopCause::RankFailed)
            {
                stop.cause = StopCause::GpuFailed;
            }
            self.request_stop(id, StopCause::GpuFailed, now_ms);
        }
    }

    /// Node loss for every member that is (now) down.
    pub(crate) fn on_member_state(
        &mut self,
        member: &Member,
        members: &BTreeMap<NodeId, Member>,
        now_ms: u64,
    ) {
        if matches!(member.state, MemberState::Down | MemberState::Left) {
            self.node_lost(member.id, &member.spec.name, members, now_ms);
        }
    }
}

/// A node's failure ended the job's allocation (`what` says how): it is
/// requeued while it has restarts left, and ends `node_fail` after that.
/// Returns whether it restarts.
fn restart_after_node_failure(job: &mut Job, what: &str, now_ms: u64) -> bool {
    if job.restarts < job.spec.max_restarts {
        job.restarts += 1;
        job.state = JobState::Requeued;
        job.reason = format!(
            "{what}; restart {} of {}",
            job.restarts, job.spec.max_restarts
        );
        true
    } else {
        job.state = JobState::NodeFail;
        job.reason = format!(
            "{what} and the job has no restarts left (--max-restarts {})",
            job.spec.max_restarts
        );
        job.ended_at_ms = Some(now_ms);
        false
    }
}

/// The evidence about a gang stopping after its first rank failure, for
/// [`attribute`].
fn attribute_failure(
    alloc: &Allocation,
    stop: Stop,
    members: &BTreeMap<NodeId, Member>,
    now_ms: u64,
) -> Attribution {
    // The ledger's ranks are the gang's nodes, in order: each node's agent
    // reports the end of its share of the tasks as one.
    let gang: Vec<GangNode> = alloc
        .nodes
        .iter()
        .enumerate()
        .map(|(rank, (node, _))| GangNode {
            node: *node,
            reported: alloc.exits.contains_key(&(rank as u32)),
            lost_with_agent: false,
            health: members.get(node).map(|m| NodeHealth {
                state: m.state,
                since_ms: m.state_since_ms,
                joined_at_ms: m.joined_at_ms,
            }),
        })
        .collect();
    attribute(
        stop.requested_at_ms,
        &gang,
        now_ms,
        stop.requested_at_ms.saturating_add(STOP_DEADLINE_MS),
    )
}

pub(crate) fn new_tenant(name: &str, limits: TenantLimits, now_ms: u64) -> Tenant {
    Tenant {
        name: name.to_string(),
        limits,
        created_at_ms: now_ms,
        charged_gpu_ms: 0,
        refunded_gpu_ms: 0,
        fair_usage_gpu_ms: 0,
        fair_usage_at_ms: now_ms,
    }
}

/// Halves the fair-share usage once per whole half-life elapsed.
pub(crate) fn decay_fair_usage(tenant: &mut Tenant, now_ms: u64) {
    let periods = now_ms.saturating_sub(tenant.fair_usage_at_ms) / FAIR_SHARE_HALF_LIFE_MS;
    if periods > 0 {
        tenant.fair_usage_gpu_ms = tenant
            .fair_usage_gpu_ms
            .checked_shr(u32::try_from(periods).unwrap_or(u32::MAX))
            .unwrap_or(0);
        tenant.fair_usage_at_ms = tenant
            .fair_usage_at_ms
            .saturating_add(periods.saturating_mul(FAIR_SHARE_HALF_LIFE_MS));
    }
}

/// How the rank that brought a gang down ended, for the job's reason.
fn failure_reason(alloc: &Allocation, code: Option<i32>) -> String {
    match alloc.oom_killed.iter().next() {
        Some(rank) => format!("the OOM killer ended rank {rank} (out of memory)"),
        None => format!("a rank exited with code {}", code.unwrap_or_default()),
    }
}

fn format_duration_s(s: u64) -> String {
    format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}
