//! One tick of the executor in phases: observe (one read of the ledger,
//! the ranks and their files), decide ([`plan::plan`], pure and tested on
//! its own), act (signal, kill, launch), then the follow-ups (hand off
//! checkpoints, watch for stalls, reap, report exits, tidy up).

use super::*;

/// What a tick decides from, read once at its start.
pub(super) struct Observed {
    /// The ledger's asks of every rank assigned to this node.
    assigned: BTreeMap<RankKey, Assignment>,
    /// The same, as the plan reads them (with the launch markers of earlier
    /// agent runs).
    asks: BTreeMap<RankKey, plan::Assigned>,
    /// The ranks running here, as the plan reads them.
    running: BTreeMap<RankKey, plan::Running>,
    /// Exits still to report.
    waiting: BTreeSet<RankKey>,
    /// This node's ledger is not known to be current: it stops its ranks.
    fenced: bool,
    now: Instant,
}

impl Executor {
    /// Reads the ledger, the ranks and their markers; `None` when the
    /// ledger cannot be read this tick.
    pub(super) fn observe(&self) -> Option<Observed> {
        let host = &self.host;
        let ranks = &self.ranks;
        let exited = &self.exited;
        let assigned = match assignments(host) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "executor could not read the ledger");
                return None;
            }
        };
        let now = Instant::now();
        let wall_ms = crate::clock::wall_ms();
        // What the plan decides from: the ledger's asks (and the launch
        // markers of earlier agent runs), the ranks running here, the exits
        // still to report.
        let asks: BTreeMap<RankKey, plan::Assigned> = assigned
            .iter()
            .map(|(key, a)| {
                let marker = launched_marker(&host.jobs_dir, key).exists();
                (key.clone(), a.ask(marker, now, wall_ms))
            })
            .collect();
        let running: BTreeMap<RankKey, plan::Running> = ranks
            .iter()
            .map(|(key, rank)| {
                let seen = plan::Running {
                    term_sent: rank.term_sent,
                    last_usr1: rank.last_usr1,
                    warned: rank.warned,
                };
                (key.clone(), seen)
            })
            .collect();
        let waiting: BTreeSet<RankKey> = exited.keys().cloned().collect();
        // Self-fencing: a node whose ledger is not known to be current may
        // not learn in time that its jobs moved, so it stops them itself
        // before the cluster may start them elsewhere.
        let fenced = self_fenced(host, &self.freshness, now);
        if fenced && !ranks.is_empty() {
            tracing::warn!(
                ranks = ranks.len(),
                "this node's ledger has not been known current for {} ms; killing its ranks",
                SELF_FENCE_MS
            );
        }
        Some(Observed {
            assigned,
            asks,
            running,
            waiting,
            fenced,
            now,
        })
    }

    /// Nothing is assigned to this node and nothing of an earlier rank is
    /// left to do: until the ledger changes, a tick would find nothing.
    pub(super) fn nothing_to_do(&self, seen: &Observed) -> bool {
        seen.assigned.is_empty()
            && self.ranks.is_empty()
            && self.exited.is_empty()
            && self.draining.is_empty()
            && self.exited_guards.is_empty()
    }

    /// `scancel --signal`: each new one to every rank here, in order.
    pub(super) fn deliver_signals(&mut self, seen: &Observed) {
        let assigned = &seen.assigned;
        for (key, rank) in self.ranks.iter_mut() {
            let Some(a) = assigned.get(key) else {
                continue;
            };
            for &sig in a.signals.iter().skip(rank.signals_sent) {
                tracing::info!(
                    job = key.job,
                    rank = key.rank,
                    signal = sig,
                    "signal asked for the job"
                );
                signal(&rank.child, sig);
            }
            rank.signals_sent = rank.signals_sent.max(a.signals.len());
        }
    }

    /// What to do about each rank: the pure plan.
    pub(super) fn decide(&self, seen: &Observed) -> Vec<Action> {
        plan::plan(&plan::Inputs {
            assigned: &seen.asks,
            running: &seen.running,
            exited: &seen.waiting,
            fenced: seen.fenced,
            grace: self.host.stop_grace,
            now: seen.now,
        })
    }

    /// Carries out the plan.
    pub(super) async fn act(&mut self, actions: Vec<Action>, seen: &Observed) {
        let host = &self.host;
        let ranks = &mut self.ranks;
        let exited = &mut self.exited;
        let assigned = &seen.assigned;
        for action in actions {
            match action {
                Action::Kill { key, why } => {
                    if why == KillWhy::Moved {
                        tracing::info!(
                            job = key.job,
                            epoch = key.epoch,
                            "the allocation moved on; killing the rank"
                        );
                    }
                    if let Some(rank) = ranks.get(&key) {
                        rank.kill();
                    }
                }
                Action::Term { key } => {
                    if let Some(rank) = ranks.get_mut(&key) {
                        let cause = assigned.get(&key).and_then(|a| a.stop);
                        tracing::info!(job = key.job, rank = key.rank, cause = ?cause, "stopping the rank (SIGTERM)");
                        signal(&rank.child, libc::SIGTERM);
                        rank.term_sent = Some(Instant::now());
                    }
                }
                Action::Usr1 { key } => {
                    if let Some(rank) = ranks.get_mut(&key) {
                        signal(&rank.child, libc::SIGUSR1);
                        rank.last_usr1 = Instant::now();
                    }
                }
                Action::Warn { key, signal: sig } => {
                    if let Some(rank) = ranks.get_mut(&key) {
                        tracing::info!(
                            job = key.job,
                            rank = key.rank,
                            signal = sig,
                            "the job's --signal before its time limit"
                        );
                        signal(&rank.child, sig);
                        rank.warned = true;
                    }
                }
                Action::Launch { key } => {
                    let Some(a) = assigned.get(&key) else {
                        continue;
                    };
                    if let Err(why) = region_lease(host, key.job, Instant::now()) {
                        tracing::debug!(job = key.job, %why, "not launching the rank yet");
                        continue;
                    }
                    // Every rank starts with the port rank 0's node found
                    // free; rank 0's agent chooses it, the others wait.
                    if a.master_port.is_none() {
                        if key.rank == 0 {
                            let port = free_master_port(key.epoch, port_is_free);
                            let cmd = Command::SetMasterPort {
                                job: key.job,
                                epoch: key.epoch,
                                port,
                            };
                            if let Err(e) = host.ledger.write(cmd).await {
                                tracing::debug!(job = key.job, error = %e.message, "could not record the master port yet");
                            }
                        }
                        continue;
                    }
                    // The guard may have slept a second while no rank
                    // ran: the lease the new rank's guard reads is renewed
                    // now.
                    if let Some(lease) = &self.lease {
                        renew_lease(host, &self.freshness, lease, Instant::now());
                    }
                    let guarding = self.lease.clone().map(|lease| lease::Guarding {
                        lease,
                        program: self.guard_program.clone(),
                    });
                    match prepare_and_launch(host, &key, a, guarding).await {
                        Ok(rank) => {
                            if let Some(fence) = rank.fence() {
                                self.groups.add(key.clone(), fence);
                            }
                            if !rank.unenforced.is_empty() && self.warned.insert(key.job) {
                                tracing::warn!(
                                    job = key.job,
                                    "the job asks for limits this node cannot enforce; its ranks run without them: {}",
                                    rank.unenforced.join("; ")
                                );
                            }
                            ranks.insert(key, rank);
                        }
                        Err(e) => {
                            tracing::warn!(job = key.job, rank = key.rank, error = %e, "could not start the rank");
                            host.metrics.count_rank_exit("launch_failed");
                            exited.insert(key, 127);
                        }
                    }
                }
                Action::ReportExit { key, why } => {
                    if why == NotLaunched::LostWithAgent {
                        report_lost(host, &key);
                        self.ends.insert(key.clone(), RankEnd::Lost);
                    }
                    exited.insert(key, why.code());
                }
            }
        }
    }

    /// Checkpoints completed by running ranks: replicated in the
    /// background, so the job never waits beyond its own local write.
    pub(super) async fn hand_off_checkpoints(&mut self, seen: &Observed) {
        let host = &self.host;
        let asks = &seen.asks;
        for (key, rank) in self.ranks.iter_mut() {
            if rank
                .replicating
                .as_ref()
                .is_some_and(|(_, h)| h.is_finished())
            {
                settle_replication(rank).await;
            }
            let Some(step) = plan::checkpoint_to_hand_off(
                latest_done_step(&rank.ckpt_dir),
                rank.reported_step,
                asks.contains_key(key),
                rank.replicating.is_some(),
                rank.retry_after,
                Instant::now(),
            ) else {
                continue;
            };
            rank.reported_step = Some(step);
            let host = host.clone();
            let key = key.clone();
            let dir = rank.ckpt_dir.join(step.to_string());
            rank.replicating = Some((
                step,
                tokio::spawn(async move { record_checkpoint(&host, &key, step, dir).await }),
            ));
        }
    }

    /// Alive but silent: no new output and no new checkpoint.
    pub(super) fn watch_for_stalls(&mut self) {
        let host = &self.host;
        let stall_after = host.stall_after;
        let jobs_dir = &host.jobs_dir;
        for (key, rank) in self.ranks.iter_mut() {
            if rank.term_sent.is_some() {
                continue;
            }
            let log_len = std::fs::metadata(log_path(jobs_dir, key.job, key.rank))
                .map(|m| m.len())
                .unwrap_or(0);
            if let Some(silent) =
                rank.stall
                    .observe(Instant::now(), log_len, rank.reported_step, stall_after)
            {
                report_stall(host, key, silent);
            }
        }
    }

    /// Reaps ranks that exited (and the guards of ranks gone, once they
    /// have noticed), records their last checkpoint and queues their exits.
    pub(super) async fn reap(&mut self, seen: &Observed) {
        let host = &self.host;
        let ranks = &mut self.ranks;
        let exited = &mut self.exited;
        let asks = &seen.asks;
        self.exited_guards
            .retain_mut(|guard| matches!(guard.try_wait(), Ok(None)));
        let mut done = Vec::new();
        {
            // Reaped and forgotten together: see `RankGroups`.
            let mut groups = self.groups.lock();
            for (key, rank) in ranks.iter_mut() {
                if let Ok(Some(status)) = rank.child.try_wait() {
                    groups.remove(key);
                    done.push((key.clone(), exit_code(status)));
                }
            }
        }
        for (key, code) in done {
            let outcome = if code == 0 { "success" } else { "failure" };
            host.metrics.count_rank_exit(outcome);
            let Some(mut rank) = ranks.remove(&key) else {
                continue;
            };
            // It watches the group until the last of it is gone.
            self.exited_guards.extend(rank.guard.take());
            // Whatever the main process left behind dies with it, before the
            // exit (and so its GPUs) is reported.
            let usage = match rank.cgroup.take() {
                Some(cg) => match cg.drain(cgroup::DRAIN_TIMEOUT).await {
                    Ok(usage) => usage,
                    Err(e) => {
                        tracing::warn!(job = key.job, rank = key.rank, error = %e, "the rank's processes are not all gone yet; still killing them");
                        let usage = cg.usage();
                        self.draining.push(cg);
                        usage
                    }
                },
                None => cgroup::Usage::default(),
            };
            tracing::info!(
                job = key.job,
                epoch = key.epoch,
                rank = key.rank,
                code,
                cpu_s = usage.cpu_usec.map(|u| u as f64 / 1e6),
                mem_peak_bytes = usage.mem_peak_bytes,
                oom_killed = usage.oom_killed(),
                "rank exited"
            );
            // A final checkpoint written during the grace period still counts,
            // and must be recorded before the exit releases the allocation.
            settle_replication(&mut rank).await;
            let after = plan::after_exit(
                asks.contains_key(&key),
                latest_done_step(&rank.ckpt_dir),
                rank.reported_step,
            );
            if let Some(step) = after.record_step {
                let dir = rank.ckpt_dir.join(step.to_string());
                record_checkpoint(host, &key, step, dir).await;
            }
            if after.queue_exit {
                if usage.oom_killed() {
                    self.ends.insert(key.clone(), RankEnd::OomKilled);
                } else if region_lease(host, key.job, Instant::now()).is_err() {
                    // Fenced for a peer region's lease: the region's
                    // fault, not the job's; it restarts like node loss.
                    self.ends.insert(key.clone(), RankEnd::Lost);
                }
                exited.insert(key, code);
            }
        }
    }

    /// Reports exits, retrying until the ledger has them or the allocation
    /// is gone.
    pub(super) async fn report_exits(&mut self, seen: &Observed) {
        let host = &self.host;
        let exited = &mut self.exited;
        let assigned = &seen.assigned;
        let asks = &seen.asks;
        let exits = plan::exit_reports(exited, &self.sent, asks);
        for (key, code) in &exits.report {
            if *code != 0 {
                if let Some(a) = assigned.get(key) {
                    report_gpu_faults(host, &a.gpus).await;
                }
            }
        }
        // All at once: the batcher commits concurrent writes as one entry,
        // so a wave of ends costs one round trip, not one per rank.
        let ends = &self.ends;
        let writes = exits.report.iter().map(|(key, code)| {
            let cmd = Command::RankExited {
                job: key.job,
                epoch: key.epoch,
                rank: key.rank,
                exit_code: *code,
                end: ends.get(key).copied().unwrap_or_default(),
            };
            async move { (key, host.ledger.write(cmd).await) }
        });
        for (key, written) in futures::future::join_all(writes).await {
            match written {
                Ok(_) => {
                    self.sent.insert(key.clone());
                }
                Err(e) => {
                    tracing::debug!(job = key.job, error = %e.message, "could not report a rank exit yet")
                }
            }
        }
        for key in exits.forget {
            exited.remove(&key);
            self.sent.remove(&key);
            self.ends.remove(&key);
        }
    }

    /// Forgets cgroups that are gone and warnings about jobs that left.
    pub(super) fn tidy(&mut self, seen: &Observed) {
        let assigned = &seen.assigned;
        self.draining.retain(|cg| match cg.try_remove() {
            Ok(gone) => !gone,
            Err(e) => {
                tracing::warn!(error = %e, "cannot remove an exited rank's cgroup");
                true
            }
        });
        self.warned
            .retain(|job| assigned.keys().any(|k| k.job == *job));
    }
}
