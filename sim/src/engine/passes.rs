//! The engine's scheduling passes: when one can change anything, running
//! it (directly, or through the ledger as a cluster would), and applying
//! its plan to the simulated nodes.

use super::*;

impl<'t> Engine<'t> {
    /// Runs passes until nothing times out; true if any job started.
    pub(super) fn scheduling_passes(&mut self) -> bool {
        let mut started_any = false;
        for _ in 0..MAX_PASSES_PER_INSTANT {
            if !self.dirty || !self.pass_can_change_anything() {
                break;
            }
            self.dirty = false;
            if self.ledger.is_some() {
                // Ledger passes read the ledger's own snapshot.
                self.changed_pending.clear();
                let (started, stopped_any) = self.ledger_pass();
                started_any |= started;
                if !stopped_any {
                    break;
                }
                continue;
            }
            self.refresh_tenant_usage();
            let clock = Instant::now();
            let plan = match self.pass_input {
                PassInput::Cached => self.sched_cache.schedule_incremental(
                    &self.input,
                    &self.proximity,
                    NodeChanges::Only(&self.changed_nodes),
                    PendingChanges::Only(&self.changed_pending),
                ),
                PassInput::FullRead => schedule(&self.input, &self.proximity),
            };
            self.changed_pending.clear();
            for node in self.changed_nodes.drain(..) {
                self.node_changed[node] = false;
            }
            self.acct.scheduler_wall_s += clock.elapsed().as_secs_f64();
            self.acct.scheduler_passes += 1;
            let (started, timed_out) = self.apply(plan);
            started_any |= started;
            if !timed_out {
                break;
            }
        }
        self.dirty = false;
        started_any
    }

    pub(super) fn pass_can_change_anything(&self) -> bool {
        if self.jobs_at_limit() {
            return true;
        }
        let Some(&smallest_per_node) = self.pending_per_node_demand.keys().next() else {
            return false;
        };
        if self.cfg.policy == Policy::HdrfPreempt && !self.input.running.is_empty() {
            return true;
        }
        self.input
            .nodes
            .iter()
            .zip(&self.free_on_node)
            .any(|(node, &free)| node.healthy && free >= smallest_per_node)
    }

    pub(super) fn jobs_at_limit(&self) -> bool {
        self.running_at_limit > 0
    }

    pub(super) fn refresh_tenant_usage(&mut self) {
        for (view, held) in self.input.tenants.iter_mut().zip(&self.held_by_tenant) {
            view.gpus_in_use = u32::try_from(*held).unwrap_or(u32::MAX);
        }
        // Without checkpoints every `last_checkpoint_s` stays `None`, as
        // `start` wrote it; the walk over every running job is then wasted.
        let Some(period) = self.cfg.ckpt_interval_s.filter(|&c| c > 0) else {
            return;
        };
        let ckpt = Some(period);
        let now = self.now;
        for running in &mut self.input.running {
            running.last_checkpoint_s = ckpt.and_then(|period| {
                let elapsed = now.saturating_sub(running.started_s);
                let saved = elapsed / period * period;
                (saved > 0).then(|| running.started_s + saved)
            });
        }
    }

    /// Applies a plan; returns (any job started, any job timed out).
    pub(super) fn apply(&mut self, plan: SchedPlan) -> (bool, bool) {
        let mut timed_out_any = false;
        for id in &plan.timed_out {
            let job = *id as usize;
            if self
                .jobs
                .get(job)
                .is_some_and(|s| s.phase == Phase::Running)
            {
                self.end_run(job, true);
                timed_out_any = true;
            }
        }
        for preemption in &plan.preemptions {
            self.preempt(preemption.victim as usize);
        }
        for (id, reason) in &plan.pending_reasons {
            // A request the scheduler calls invalid would wait forever.
            let job = *id as usize;
            if reason.starts_with("invalid:")
                && self
                    .jobs
                    .get(job)
                    .is_some_and(|s| s.phase == Phase::Pending)
            {
                self.dequeue(job);
                self.jobs[job].phase = Phase::Rejected;
                self.jobs[job].outcome.rejected = Some(format!("scheduler: {reason}"));
                self.unfinished -= 1;
                if let Some(ledger) = &mut self.ledger {
                    ledger.cancel(self.now, job);
                }
            }
        }
        let mut started_any = false;
        for placement in &plan.placements {
            let job = placement.job as usize;
            if !self
                .jobs
                .get(job)
                .is_some_and(|s| s.phase == Phase::Pending)
            {
                self.acct.bad_placements += 1;
                continue;
            }
            let chosen = if self.cfg.policy == Policy::Fifo {
                self.random_nodes(job)
            } else {
                self.checked_nodes(job, &placement.nodes)
            };
            match chosen {
                Some(nodes) => {
                    self.start(job, nodes);
                    started_any = true;
                }
                // Keep strict order: nothing behind it may start now; the
                // next release reruns the pass.
                None if self.cfg.policy == Policy::Fifo => break,
                None => self.acct.bad_placements += 1,
            }
        }
        (started_any, timed_out_any)
    }

    /// One pass the way the live leader runs it, against the ledger; returns
    /// (any job started, any job stopped). Stopped jobs free GPUs that the
    /// ledger could not hand out in the same command, so the caller runs
    /// another pass.
    pub(super) fn ledger_pass(&mut self) -> (bool, bool) {
        let Some(mut ledger) = self.ledger.take() else {
            return (false, false);
        };
        let clock = Instant::now();
        let planned = ledger.plan(self.now, self.cfg.policy);
        self.acct.scheduler_wall_s += clock.elapsed().as_secs_f64();
        self.acct.scheduler_passes += 1;
        let placements = planned.engine_plan.placements.clone();
        let mut started_any = false;
        let stopped_any;
        if self.cfg.policy == Policy::Fifo {
            // Stops and reasons first; then each gang on random nodes, one
            // command each, so that a refusal keeps submission order.
            let committed = ledger.commit(self.now, &planned, &[], true);
            stopped_any = self
                .apply_committed(&mut ledger, &planned.engine_plan, committed)
                .1;
            for placement in &placements {
                let job = placement.job as usize;
                if !self.is_pending(job) {
                    self.acct.bad_placements += 1;
                    continue;
                }
                let Some(nodes) = self.random_nodes(job) else {
                    break;
                };
                let committed = ledger.commit(self.now, &planned, &[(job, nodes)], false);
                let refused = !committed.refused.is_empty() || committed.started.is_empty();
                // Nothing is being stopped here, so a refusal is a bug.
                self.acct.bad_placements += committed.refused.len() as u64;
                started_any |= self
                    .apply_committed(&mut ledger, &planned.engine_plan, committed)
                    .0;
                if refused {
                    break;
                }
            }
        } else {
            // GPUs the plan's victims still hold, here and in the ledger:
            // placements on them (the preemptor's, or a backfill the pass
            // put there) are refused by `apply` until the victims have
            // exited, exactly as the live leader's would be.
            let mut victim_gpus: Vec<(u64, u32)> = Vec::new();
            for preemption in &planned.engine_plan.preemptions {
                let run = self
                    .jobs
                    .get(preemption.victim as usize)
                    .and_then(|state| state.run.as_ref());
                for (node, gpus) in run.map_or(&[][..], |run| run.nodes.as_slice()) {
                    victim_gpus.extend(gpus.iter().map(|&gpu| (*node as u64, gpu)));
                }
            }
            let mut chosen = Vec::with_capacity(placements.len());
            let mut refusal_expected = Vec::new();
            for placement in &placements {
                let job = placement.job as usize;
                let on_victims = placement.nodes.iter().any(|(node, gpus)| {
                    gpus.iter().any(|&gpu| victim_gpus.contains(&(*node, gpu)))
                });
                let nodes = if !self.is_pending(job) {
                    None
                } else if on_victims {
                    refusal_expected.push(job);
                    placement
                        .nodes
                        .iter()
                        .map(|(node, gpus)| Some((usize::try_from(*node).ok()?, gpus.clone())))
                        .collect()
                } else {
                    self.checked_nodes(job, &placement.nodes)
                };
                match nodes {
                    Some(nodes) => chosen.push((job, nodes)),
                    None => self.acct.bad_placements += 1,
                }
            }
            let committed = ledger.commit(self.now, &planned, &chosen, true);
            let unexpected = committed
                .refused
                .iter()
                .filter(|(job, _)| !refusal_expected.contains(job))
                .count();
            self.acct.bad_placements += unexpected as u64;
            (started_any, stopped_any) =
                self.apply_committed(&mut ledger, &planned.engine_plan, committed);
        }
        self.ledger = Some(ledger);
        (started_any, stopped_any)
    }

    /// Mirrors a committed pass in the simulated cluster; returns (any job
    /// started, any job stopped).
    pub(super) fn apply_committed(
        &mut self,
        ledger: &mut LedgerCluster,
        plan: &SchedPlan,
        committed: CommittedPass,
    ) -> (bool, bool) {
        let stopped_any = !committed.timed_out.is_empty() || !committed.preempted.is_empty();
        for job in committed.timed_out {
            if self
                .jobs
                .get(job)
                .is_some_and(|s| s.phase == Phase::Running)
            {
                self.end_run(job, true);
            }
        }
        for job in committed.preempted {
            self.preempt(job);
        }
        for (id, reason) in &plan.pending_reasons {
            let job = *id as usize;
            if reason.starts_with("invalid:") && self.is_pending(job) {
                self.dequeue(job);
                self.jobs[job].phase = Phase::Rejected;
                self.jobs[job].outcome.rejected = Some(format!("scheduler: {reason}"));
                self.unfinished -= 1;
                ledger.cancel(self.now, job);
            }
        }
        self.acct.ledger_refused_placements += committed.refused.len() as u64;
        let mut started_any = false;
        for (job, nodes) in committed.started {
            if self.is_pending(job) {
                self.start(job, nodes);
                started_any = true;
            } else {
                self.acct.bad_placements += 1;
            }
        }
        (started_any, stopped_any)
    }

    pub(super) fn is_pending(&self, job: usize) -> bool {
        self.jobs
            .get(job)
            .is_some_and(|s| s.phase == Phase::Pending)
    }

    /// The scheduler's placement, verified against the simulated cluster.
    pub(super) fn checked_nodes(
        &self,
        job: usize,
        placed: &[(u64, Vec<u32>)],
    ) -> Option<Vec<(usize, Vec<u32>)>> {
        let shape = self.jobs[job].shape;
        if placed.len() != shape.nodes as usize {
            return None;
        }
        let mut nodes = Vec::with_capacity(placed.len());
        for (node_id, gpus) in placed {
            let index = usize::try_from(*node_id).ok()?;
            let node = self.input.nodes.get(index)?;
            if !node.healthy
                || gpus.len() != shape.gpus_per_node as usize
                || nodes.iter().any(|(n, _)| *n == index)
            {
                return None;
            }
            for gpu in gpus {
                let slot = node.gpus.get(usize::try_from(*gpu).ok()?)?;
                if slot.allocated_to.is_some() {
                    return None;
                }
            }
            nodes.push((index, gpus.clone()));
        }
        Some(nodes)
    }

    /// The FIFO baseline's placement: random nodes with enough free GPUs.
    pub(super) fn random_nodes(&mut self, job: usize) -> Option<Vec<(usize, Vec<u32>)>> {
        let shape = self.jobs[job].shape;
        let feasible: Vec<usize> = (0..self.input.nodes.len())
            .filter(|&n| self.input.nodes[n].healthy && self.free_on_node[n] >= shape.gpus_per_node)
            .collect();
        let wanted = shape.nodes as usize;
        if feasible.len() < wanted {
            return None;
        }
        let picks = sample(&mut self.placement_rng, feasible.len(), wanted);
        let need = shape.gpus_per_node as usize;
        Some(
            picks
                .into_iter()
                .map(|pick| {
                    let node = feasible[pick];
                    let gpus = self.input.nodes[node]
                        .gpus
                        .iter()
                        .filter(|gpu| gpu.allocated_to.is_none())
                        .take(need)
                        .map(|gpu| gpu.index)
                        .collect();
                    (node, gpus)
                })
                .collect(),
        )
    }
}
