//! Runs this node's ranks of the jobs the ledger placed here. Every node runs
//! the same loop: read the ledger, start ranks it does not run yet, signal
//! ranks that must stop, kill ranks whose epoch is no longer the job's
//! current one (fencing: a requeued job may already run elsewhere), and
//! report exits and completed checkpoints back to the ledger.
//!
//! One process per node and rank, in its own process group so that signals
//! reach the whole tree, and with a parent-death signal so that a crashed
//! agent does not leave ranks running that the ledger no longer accounts for.
//! Where the node has cgroup v2 (`cgroup.rs`), each rank also runs in a
//! cgroup of its own, with the job's memory and CPU limits, which is killed
//! whole when the rank stops and removed once empty before the exit is
//! reported, so no escaped child outlives its rank or keeps its GPUs.
//!
//! A rank is started at most once per epoch on a node: a marker file is
//! written before the launch, and an agent that restarts finds the marker of
//! a rank its predecessor ran (and took down with it) and reports that rank
//! lost instead of starting it again alone, so the gang restarts together
//! under a new epoch.
//!
//! The decisions live in `plan.rs`, sans-IO and unit-tested: whether this node
//! is self-fenced, which ranks to kill, stop, signal for a checkpoint or
//! launch, which exits to record without a launch, which checkpoint step to
//! hand to replication, and which waiting exits to report or forget. The loop
//! here gathers what the plan needs (the ledger's assignments, the launch
//! markers, the running ranks, the peer view, the clock), carries out the
//! actions in the order the plan gives them, and keeps the I/O: spawning
//! and signalling processes, restoring checkpoints, reaping, logs, metrics
//! and ledger writes.

pub mod account;
pub mod cgroup;
mod fence;
pub mod freshness;
pub mod gpu_fence;
mod lease;
mod plan;
mod spawn;
pub mod tasks;

pub use fence::{FenceGuard, RankFence, RankGroups};
pub use lease::{run_guard as run_lease_guard, GUARD_COMMAND as LEASE_GUARD_COMMAND};

use crate::node::metrics::Metrics;
use crate::node::peers::SharedPeerView;
use crate::node::{LedgerClient, LocalMember};
use crate::rpc::chunks::ChunkNet;
use crate::workers::anomaly::stall::StallWatch;
use crate::workers::anomaly::EventLog;
use crate::workers::Worker;
use freshness::LedgerFreshness;
use plan::{Action, KillWhy, NotLaunched};
use shoal_consensus::events::{EventSpec, Severity};
use shoal_consensus::workload::{Job, JobId, RankEnd, StopCause, SELF_FENCE_MS};
use shoal_consensus::{Command, LedgerResponse, NodeId};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_millis(100);
/// Base of the rendezvous port handed to rank 0 (torchrun's default is 29500).
const MASTER_PORT_BASE: u64 = 29_400;
/// The exit code reported for a rank that died with a previous run of this
/// agent (its parent-death signal is SIGKILL: 128 + 9).
pub const LOST_WITH_AGENT_EXIT: i32 = 137;
/// Wait before replicating a checkpoint step again after a failure.
const CKPT_RETRY: Duration = Duration::from_secs(2);

/// What this node was asked to run: one rank of one allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct RankKey {
    job: JobId,
    epoch: u64,
    rank: u32,
}

struct RunningRank {
    child: spawn::Process,
    /// Its lease guard, when it is a program of its own (the agent's
    /// child, reaped after the rank).
    guard: Option<spawn::Process>,
    term_sent: Option<Instant>,
    last_usr1: Instant,
    /// Sent the job's `--signal` already.
    warned: bool,
    /// How many of the allocation's `scancel --signal`s it has had (those
    /// asked for before it started are not sent).
    signals_sent: usize,
    ckpt_dir: PathBuf,
    /// The newest step handed to replication (recorded, or on its way).
    reported_step: Option<u64>,
    /// The newest step the ledger has (or refused for good).
    recorded_step: Option<u64>,
    /// After a failed replication, when to try again.
    retry_after: Option<Instant>,
    /// Replication of the last reported step, still running.
    replicating: Option<(u64, tokio::task::JoinHandle<bool>)>,
    stall: StallWatch,
    /// The rank's cgroup, where the node has cgroups.
    cgroup: Option<Arc<cgroup::RankCgroup>>,
    /// The job's limits this node does not enforce, as sentences.
    unenforced: Vec<String>,
}

impl RunningRank {
    /// How the fence guard kills it.
    fn fence(&self) -> Option<RankFence> {
        let pid = self
            .child
            .id()
            .and_then(|p| libc::pid_t::try_from(p).ok())?;
        Some(RankFence {
            group: pid,
            cgroup: self.cgroup.clone(),
        })
    }

    /// SIGKILL to the rank's whole cgroup, else its process group.
    fn kill(&self) {
        match self.fence() {
            Some(fence) => {
                fence.kill();
            }
            // Reaped already: only the cgroup may still hold something.
            None => {
                if let Some(cg) = &self.cgroup {
                    let _ = cg.kill();
                }
            }
        }
    }
}

/// The directory of a job's files on this node.
pub fn job_dir(jobs_dir: &Path, job: JobId) -> PathBuf {
    jobs_dir.join(job.to_string())
}

pub fn log_path(jobs_dir: &Path, job: JobId, rank: u32) -> PathBuf {
    job_dir(jobs_dir, job).join(format!("rank-{rank}.log"))
}

/// Where the rotations of the log at `log` are counted.
pub fn rotations_path(log: &Path) -> PathBuf {
    log.with_extension("log.rotations")
}

/// How often the log at `log` was rotated (0 when never).
pub fn log_rotations(log: &Path) -> u64 {
    std::fs::read_to_string(rotations_path(log))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Opens a rank's log for appending: readable by the agent alone (0600,
/// also when an earlier run left it with wider bits), never through a
/// symlink. Ranks write to it through the descriptor they inherit; users
/// read it through the API (`shoal logs`), which checks their tenant. Job
/// ids are sequential, so a world-readable log would be every local user's
/// to read.
fn open_rank_log(log: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(log)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// Exists once this node has launched `rank` of `epoch`.
fn launched_marker(jobs_dir: &Path, key: &RankKey) -> PathBuf {
    job_dir(jobs_dir, key.job).join(format!(".launched-e{}-r{}", key.epoch, key.rank))
}

/// Records, durably, that the rank is about to be launched.
fn mark_launched(jobs_dir: &Path, key: &RankKey) -> Result<(), String> {
    let path = launched_marker(jobs_dir, key);
    std::fs::File::create(&path)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("cannot create {}: {e}", path.display()))
}

/// What the executor works with: this node, its ledger and peers, the
/// chunk network for checkpoints, and its settings.
#[derive(Clone)]
pub struct RankHost {
    pub local: LocalMember,
    pub ledger: LedgerClient,
    pub peers: SharedPeerView,
    pub chunks: ChunkNet,
    pub metrics: Arc<Metrics>,
    pub events: EventLog,
    pub jobs_dir: PathBuf,
    /// SIGTERM → SIGKILL grace of a stopping rank.
    pub stop_grace: Duration,
    /// Silence after which a running rank counts as stalled.
    pub stall_after: Duration,
    /// Which Unix user each tenant's ranks run as.
    pub users: account::RankUsers,
    /// This agent's rank cgroups; None: no cgroups (isolation `none`).
    pub cgroups: Option<Arc<cgroup::RankCgroups>>,
    /// The cluster CA for ranks (`SHOAL_CA_FILE`) when the API is HTTPS.
    pub ca_file: Option<PathBuf>,
    /// This node's GPUs: a rank that fails is first checked for a GPU fault.
    pub gpus: crate::node::gpu::Gpus,
    /// The `shoal` binary that starts a rank's tasks (`exec-tasks`).
    pub task_launcher: PathBuf,
    /// Peer regions' leases on jobs they hold checkpoint copies of: such a
    /// job's ranks run only while every such region's lease holds.
    pub regions: crate::node::federation::lease::RegionLeases,
    /// `federation.region_lease_ms`.
    pub region_lease: Duration,
}

/// The executor loop: this node's running ranks and the exits it still has
/// to report.
pub struct Executor {
    host: RankHost,
    ranks: BTreeMap<RankKey, RunningRank>,
    /// Exits waiting until this node's ledger has them, so a rank is never
    /// started twice.
    exited: BTreeMap<RankKey, i32>,
    /// Of those, the ones the leader has applied.
    sent: BTreeSet<RankKey>,
    /// Of the exits, those that were not plain exits: OOM kills, ranks lost
    /// with a previous run of this agent.
    ends: BTreeMap<RankKey, RankEnd>,
    /// The running ranks' process groups and cgroups, shared with the
    /// [`FenceGuard`].
    groups: RankGroups,
    /// Jobs whose unenforceable limits were logged already.
    warned: BTreeSet<JobId>,
    /// Cgroups of exited ranks that did not empty in time; retried.
    draining: Vec<Arc<cgroup::RankCgroup>>,
    /// The lease every rank's guard watches ([`lease`]); `None` only if the
    /// kernel refused the shared page, which is logged.
    lease: Option<Arc<lease::FenceLease>>,
    /// The program that runs a rank's lease guard (this agent's `shoal`);
    /// `None`: the guard is forked from the agent ([`lease`]).
    guard_program: Option<PathBuf>,
    /// Guards of exited ranks, reaped once they notice.
    exited_guards: Vec<spawn::Process>,
    /// When this node's ledger was last known to be current.
    freshness: LedgerFreshness,
}

impl Executor {
    pub fn new(host: RankHost) -> Self {
        let guard_program = lease::guard_program(&host.task_launcher);
        if guard_program.is_none() {
            tracing::info!(
                launcher = %host.task_launcher.display(),
                "the launcher cannot run lease guards; each rank's guard is forked from the agent"
            );
        }
        Executor {
            guard_program,
            exited_guards: Vec::new(),
            host,
            ranks: BTreeMap::new(),
            exited: BTreeMap::new(),
            sent: BTreeSet::new(),
            ends: BTreeMap::new(),
            groups: RankGroups::default(),
            warned: BTreeSet::new(),
            draining: Vec::new(),
            lease: match lease::FenceLease::new(Duration::from_millis(SELF_FENCE_MS)) {
                Ok(l) => Some(Arc::new(l)),
                Err(e) => {
                    tracing::error!(error = %e, "cannot map the rank lease; ranks of a stopped agent will not be fenced");
                    None
                }
            },
            freshness: LedgerFreshness::default(),
        }
    }

    /// The guard that kills this executor's ranks once the node's ledger is
    /// no longer known to be current, on a task of its own; it also renews
    /// the lease the ranks' own guards watch.
    pub fn fence_guard(&self) -> FenceGuard {
        let host = self.host.clone();
        let lease = self.lease.clone();
        let freshness = self.freshness.clone();
        let ledger_host = self.host.clone();
        FenceGuard::new(
            self.groups.clone(),
            TICK,
            move || {
                let now = Instant::now();
                if let Some(lease) = &lease {
                    renew_lease(&host, &freshness, lease, now);
                }
                self_fenced(&host, &freshness, now)
            },
            move |key| still_allocated(&ledger_host, key),
        )
    }

    /// The ReadIndex reads that keep this node's ledger fresh; without
    /// them every rank is fenced.
    pub fn freshness_probe(&self) -> freshness::FreshnessProbe {
        freshness::FreshnessProbe::new(
            self.host.ledger.clone(),
            self.freshness.clone(),
            Duration::from_millis(SELF_FENCE_MS),
        )
    }
}

impl Worker for Executor {
    fn period(&self) -> Duration {
        TICK
    }

    /// New allocations launch, and stops are signalled, as soon as this
    /// node applies them; a rank's exit is reported as soon as it exits.
    fn wakeup(&self) -> crate::workers::Wakeup {
        crate::workers::Wakeup::on_apply(self.host.ledger.applied_watch()).and_child_exits()
    }

    async fn stop(&mut self) {
        for rank in self.ranks.values() {
            rank.kill();
        }
        let cgroups = self
            .ranks
            .values()
            .filter_map(|r| r.cgroup.clone())
            .chain(self.draining.drain(..));
        for cgroup in cgroups {
            if let Err(e) = cgroup.drain(Duration::from_secs(1)).await {
                tracing::warn!(error = %e, "a rank's cgroup is left for the next start of this agent");
            }
        }
        if let Some(cgroups) = &self.host.cgroups {
            cgroups.remove_if_empty();
        }
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let host = &self.host;
        let ranks = &mut self.ranks;
        let exited = &mut self.exited;
        let assigned = match assignments(host) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "executor could not read the ledger");
                return ControlFlow::Continue(());
            }
        };
        let now = Instant::now();
        let wall_ms = crate::node::clock::wall_ms();
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
        // `scancel --signal`: each new one to every rank here, in order.
        for (key, rank) in ranks.iter_mut() {
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
        let actions = plan::plan(&plan::Inputs {
            assigned: &asks,
            running: &running,
            exited: &waiting,
            fenced,
            grace: host.stop_grace,
            now,
        });
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
                    let guarding = self.lease.clone().map(|lease| lease::Guarding {
                        lease,
                        program: self.guard_program.clone(),
                    });
                    match prepare_and_launch(host, &key, a, guarding).await {
                        Ok(rank) => {
                            if let Some(fence) = rank.fence() {
                                self.groups.lock().insert(key.clone(), fence);
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
        // Checkpoints completed by running ranks: replicate in the background
        // so the job never waits beyond its own local write.
        for (key, rank) in ranks.iter_mut() {
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
        // Alive but silent: no new output and no new checkpoint.
        let stall_after = host.stall_after;
        let jobs_dir = &host.jobs_dir;
        for (key, rank) in ranks.iter_mut() {
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
        // Reap: ranks, and the guards of ranks gone, once they have noticed.
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
        // Report exits; keep retrying until the ledger has them or the
        // allocation is gone.
        let exits = plan::exit_reports(exited, &self.sent, &asks);
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
        self.draining.retain(|cg| match cg.try_remove() {
            Ok(gone) => !gone,
            Err(e) => {
                tracing::warn!(error = %e, "cannot remove an exited rank's cgroup");
                true
            }
        });
        self.warned
            .retain(|job| assigned.keys().any(|k| k.job == *job));
        ControlFlow::Continue(())
    }
}

fn report_stall(host: &RankHost, key: &RankKey, silent: Duration) {
    let spec = EventSpec {
        severity: Severity::Warning,
        kind: "job_stalled".into(),
        node: Some(host.local.id),
        gpu: None,
        job: Some(key.job),
        message: format!(
            "job {} rank {} on {}: no new output and no new checkpoint for {} s",
            key.job,
            key.rank,
            host.local.name,
            silent.as_secs()
        ),
        resource: None,
    };
    host.events.record(spec);
}

/// Whether this node's ledger was last known to be current longer than
/// `SELF_FENCE_MS` ago (the rule: [`freshness::fenced`]).
fn self_fenced(host: &RankHost, freshness: &LedgerFreshness, now: Instant) -> bool {
    freshness::fenced(
        !host.ledger.voters().is_empty(),
        freshness.fresh_at(),
        now,
        Duration::from_millis(SELF_FENCE_MS),
    )
}

/// Whether the peer regions holding copies of `job`'s checkpoints let its
/// ranks run here now ([`crate::node::federation::lease`]).
fn region_lease(host: &RankHost, job: u64, now: Instant) -> Result<(), String> {
    let Ok(d) = host.ledger.read() else {
        return Ok(());
    };
    host.regions
        .may_run(job, d.ledger.copy_regions(job), now, host.region_lease)
}

/// Whether this node's ledger still has `key` as one of this node's ranks
/// (a stopping allocation still is: its ranks get their grace period) and
/// the regions holding copies of the job still lease it here. An
/// unreadable ledger keeps the rank: the fence handles a node that knows
/// nothing.
fn still_allocated(host: &RankHost, key: &RankKey) -> bool {
    if let Err(why) = region_lease(host, key.job, Instant::now()) {
        tracing::warn!(job = key.job, rank = key.rank, %why, "no region lease for the job");
        return false;
    }
    let Ok(d) = host.ledger.read() else {
        return true;
    };
    d.ledger
        .workload
        .jobs
        .get(&key.job)
        .and_then(|job| job.alloc.as_ref())
        .is_some_and(|a| a.epoch == key.epoch && a.rank_of(host.local.id) == Some(key.rank))
}

/// Renews the ranks' lease until `SELF_FENCE_MS` after this node's ledger
/// was last known to be current (the rule of [`self_fenced`]).
fn renew_lease(
    host: &RankHost,
    freshness: &LedgerFreshness,
    lease: &lease::FenceLease,
    now: Instant,
) {
    let window = Duration::from_millis(SELF_FENCE_MS);
    let deadline = freshness::deadline(
        !host.ledger.voters().is_empty(),
        freshness.fresh_at(),
        now,
        window,
    );
    // No voters: nothing to be cut off from (a node before its first
    // ledger entry); the lease stays renewed.
    lease.renew_until(deadline.unwrap_or(now + window));
}

/// A rank of a job the ledger has placed on this node.
struct Assignment {
    spec: shoal_consensus::workload::JobSpec,
    gpus: Vec<u32>,
    world: Vec<NodeId>,
    stop: Option<StopCause>,
    reported_exit: bool,
    ckpt_interval: Option<Duration>,
    restore: Option<shoal_consensus::workload::Checkpoint>,
    /// Times the job was restarted so far (`TORCHELASTIC_RESTART_COUNT`).
    restarts: u32,
    /// The job's `--signal` and the ledger time (ms) to send it at.
    warn: Option<(i32, u64)>,
    /// `scancel --signal`s so far, in order.
    signals: Vec<i32>,
    /// The allocation's `MASTER_PORT`, once rank 0's agent chose it.
    master_port: Option<u16>,
}

impl Assignment {
    /// What the plan needs of it; `launch_marker`: a previous run of this
    /// agent launched the rank.
    fn ask(&self, launch_marker: bool, now: Instant, wall_ms: u64) -> plan::Assigned {
        plan::Assigned {
            stop: self.stop.is_some(),
            reported_exit: self.reported_exit,
            ckpt_interval: self.ckpt_interval,
            launch_marker,
            warn: self.warn.map(|(signal, at_ms)| {
                (
                    signal,
                    now + Duration::from_millis(at_ms.saturating_sub(wall_ms)),
                )
            }),
        }
    }
}

/// The ranks the ledger assigns to this node, in key order.
fn assignments(host: &RankHost) -> Result<BTreeMap<RankKey, Assignment>, String> {
    let data = host.ledger.read().map_err(|e| e.message)?;
    let workload = &data.ledger.workload;
    let mut out = BTreeMap::new();
    for (job, alloc) in workload.holding() {
        let Some(rank) = alloc.rank_of(host.local.id) else {
            continue;
        };
        out.insert(
            RankKey {
                job: job.id,
                epoch: alloc.epoch,
                rank,
            },
            assignment(
                job,
                alloc,
                rank,
                workload.latest_checkpoint(job.id).cloned(),
            ),
        );
    }
    Ok(out)
}

fn assignment(
    job: &Job,
    alloc: &shoal_consensus::workload::Allocation,
    rank: u32,
    restore: Option<shoal_consensus::workload::Checkpoint>,
) -> Assignment {
    Assignment {
        spec: job.spec.clone(),
        gpus: alloc.nodes[rank as usize].1.clone(),
        world: alloc.nodes.iter().map(|(n, _)| *n).collect(),
        stop: alloc.stop.map(|s| s.cause),
        reported_exit: alloc.exits.contains_key(&rank),
        ckpt_interval: job.spec.ckpt_interval_s.map(Duration::from_secs),
        restore,
        restarts: job.restarts,
        signals: alloc.signals.clone(),
        master_port: alloc.master_port,
        warn: job.spec.warn_signal.map(|w| {
            let limit_ms = job.spec.time_limit_s.saturating_mul(1000);
            let before_ms = u64::from(w.before_s) * 1000;
            let at = alloc
                .started_at_ms
                .saturating_add(limit_ms.saturating_sub(before_ms));
            (w.signal, at)
        }),
    }
}

/// Restores the checkpoint to resume from (every rank's part), then starts the rank.
async fn prepare_and_launch(
    host: &RankHost,
    key: &RankKey,
    a: &Assignment,
    lease: Option<lease::Guarding>,
) -> Result<RunningRank, String> {
    let tenant = {
        let data = host
            .ledger
            .read()
            .map_err(|e| format!("cannot read the ledger: {}", e.message))?;
        account::TenantKey {
            cluster: data
                .ledger
                .cluster
                .as_ref()
                .map(|c| c.cluster_id.clone())
                .unwrap_or_default(),
            tenant: a.spec.tenant.clone(),
            created_at_ms: data
                .ledger
                .workload
                .tenants
                .get(&a.spec.tenant)
                .map_or(0, |t| t.created_at_ms),
        }
    };
    // A new tenant's uid is written to a file under a lock: off the async
    // threads.
    let users = host.users.clone();
    let account = tokio::task::spawn_blocking(move || users.resolve(&tenant))
        .await
        .map_err(|e| format!("the uid lookup failed: {e}"))??;
    let dir = job_dir(&host.jobs_dir, key.job);
    prepare_job_dir(&host.jobs_dir, &dir, &account)?;
    if let Some(ckpt) = a.restore.clone() {
        let started = Instant::now();
        let worker = host.chunks.clone();
        let handle = tokio::runtime::Handle::current();
        let step = ckpt.step;
        let (dir, owner) = (dir.clone(), account.clone());
        let restored =
            tokio::task::spawn_blocking(move || restore_for(&worker, handle, &ckpt, &dir, &owner))
                .await
                .map_err(|e| format!("restore task failed: {e}"))??;
        tracing::info!(
            job = key.job,
            rank = key.rank,
            step,
            bytes = restored,
            ms = started.elapsed().as_millis() as u64,
            "checkpoint restored"
        );
    }
    launch(host, key, a, &account, lease)
}

/// Whether ranks of `account` run as another user than the agent.
fn switches(account: &account::Account) -> bool {
    // SAFETY: geteuid has no preconditions.
    account.uid != unsafe { libc::geteuid() }
}

/// The job's directory for `account`. When the rank runs as another user,
/// the job dir (its logs and launch markers) stays the agent's and only
/// `ckpt/` and `work/` (the rank's working directory) become the rank's,
/// 0700: the agent then never opens a path a job could have replaced with a
/// symlink. The jobs dir above only lets users pass.
fn prepare_job_dir(jobs_dir: &Path, dir: &Path, account: &account::Account) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |p: &Path, e: std::io::Error| format!("cannot prepare {}: {e}", p.display());
    let ckpt = dir.join("ckpt");
    if !switches(account) {
        return std::fs::create_dir_all(&ckpt).map_err(|e| fail(&ckpt, e));
    }
    std::fs::create_dir_all(dir).map_err(|e| fail(dir, e))?;
    for (path, mode) in [(jobs_dir, 0o711), (dir, 0o711)] {
        std::os::unix::fs::lchown(path, Some(0), Some(0)).map_err(|e| fail(path, e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| fail(path, e))?;
    }
    for sub in [ckpt, dir.join("work")] {
        match std::fs::symlink_metadata(&sub) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => std::fs::remove_file(&sub).map_err(|e| fail(&sub, e))?,
            Err(_) => {}
        }
        if !sub.exists() {
            std::fs::create_dir(&sub).map_err(|e| fail(&sub, e))?;
        }
        std::os::unix::fs::lchown(&sub, Some(account.uid), Some(account.gid))
            .map_err(|e| fail(&sub, e))?;
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail(&sub, e))?;
    }
    Ok(())
}

/// Restores `checkpoint` into the job's `ckpt/`; blocking. For a rank of
/// another user the union is built in a scratch dir only the agent can
/// touch, handed to the user there, and moved into place whole, replacing
/// whatever the job left at that step (never following it).
fn restore_for(
    net: &crate::rpc::chunks::ChunkNet,
    handle: tokio::runtime::Handle,
    checkpoint: &shoal_consensus::workload::Checkpoint,
    dir: &Path,
    account: &account::Account,
) -> Result<u64, String> {
    let ckpt_dir = dir.join("ckpt");
    if !switches(account) {
        return crate::ckpt::restore_checkpoint(net, handle, checkpoint, &ckpt_dir);
    }
    let scratch = dir.join(".restore");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir(&scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let bytes = crate::ckpt::restore_checkpoint(net, handle, checkpoint, &scratch)?;
    let step = checkpoint.step.to_string();
    let staged = scratch.join(&step);
    let mut pending = vec![staged.clone()];
    while let Some(path) = pending.pop() {
        std::os::unix::fs::lchown(&path, Some(account.uid), Some(account.gid))
            .map_err(|e| format!("cannot hand {} over: {e}", path.display()))?;
        if path.is_dir() && !path.is_symlink() {
            let entries = std::fs::read_dir(&path).map_err(|e| e.to_string())?;
            pending.extend(entries.flatten().map(|e| e.path()));
        }
    }
    let target = ckpt_dir.join(&step);
    match std::fs::symlink_metadata(&target) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&target),
        Ok(_) => std::fs::remove_file(&target),
        Err(_) => Ok(()),
    }
    .map_err(|e| format!("cannot replace {}: {e}", target.display()))?;
    std::fs::rename(&staged, &target)
        .map_err(|e| format!("cannot move the restore into {}: {e}", target.display()))?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(bytes)
}

/// Waits for the rank's replication in flight, if any. A step that failed
/// (a peer unreachable, the leader changing) is handed out again after
/// `CKPT_RETRY`, so a job that writes one checkpoint and then runs for
/// hours still gets it committed.
async fn settle_replication(rank: &mut RunningRank) {
    let Some((step, pending)) = rank.replicating.take() else {
        return;
    };
    if pending.await.unwrap_or(false) {
        rank.recorded_step = Some(step);
        rank.retry_after = None;
    } else {
        rank.reported_step = rank.recorded_step;
        rank.retry_after = Some(Instant::now() + CKPT_RETRY);
    }
}

/// Stores and replicates this rank's part of `step`, then records it in the
/// ledger. False when it should be tried again; a refusal by the ledger is
/// final (another epoch, an older step).
async fn record_checkpoint(host: &RankHost, key: &RankKey, step: u64, dir: PathBuf) -> bool {
    let started = Instant::now();
    let worker = host.chunks.clone();
    let handle = tokio::runtime::Handle::current();
    let (job, rank) = (key.job, key.rank);
    let copies = crate::ckpt::peer_copies(
        host.ledger
            .read()
            .ok()
            .and_then(|d| {
                d.ledger
                    .workload
                    .jobs
                    .get(&job)
                    .map(|j| j.spec.ckpt_peer_copies)
            })
            .unwrap_or_default(),
    );
    let part = tokio::task::spawn_blocking(move || {
        crate::ckpt::replicate_part(&worker, handle, job, rank, step, &dir, copies)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    let part = match part {
        Ok(part) => part,
        Err(e) => {
            host.metrics.count_checkpoint_part("failed");
            tracing::warn!(job, rank, step, error = %e, "checkpoint not replicated; will retry");
            return false;
        }
    };
    let holders = part.holders.clone();
    let bytes = part.bytes;
    let cmd = Command::CheckpointPart {
        job,
        epoch: key.epoch,
        rank,
        step,
        part,
    };
    match host.ledger.write(cmd).await {
        Ok((LedgerResponse::Rejected(reason), _)) => {
            host.metrics.count_checkpoint_part("rejected");
            tracing::info!(job, rank, step, %reason, "checkpoint part not recorded");
            true
        }
        Ok(_) => {
            host.metrics.count_checkpoint_part("recorded");
            host.metrics.ckpt_bytes.inc_by(bytes);
            host.metrics
                .ckpt_part_seconds
                .observe(started.elapsed().as_secs_f64());
            tracing::info!(
                job,
                rank,
                step,
                ?holders,
                ms = started.elapsed().as_millis() as u64,
                "checkpoint part replicated and recorded"
            );
            true
        }
        Err(e) => {
            host.metrics.count_checkpoint_part("failed");
            tracing::warn!(job, rank, step, error = %e.message, "checkpoint part not recorded; will retry");
            false
        }
    }
}

/// A rank this node launched before the agent restarted died with it (the
/// parent-death signal): say so in its log and the agent's.
fn report_lost(host: &RankHost, key: &RankKey) {
    use std::io::Write;
    tracing::warn!(
        job = key.job,
        epoch = key.epoch,
        rank = key.rank,
        "the rank died with this agent's previous run; reporting it lost so the gang restarts together"
    );
    host.metrics.count_rank_exit("lost");
    let log = log_path(&host.jobs_dir, key.job, key.rank);
    if let Ok(mut out) = std::fs::OpenOptions::new().append(true).open(&log) {
        let _ = writeln!(
            out,
            "--- shoal: job {} epoch {} rank {} lost: the agent on {} restarted ---",
            key.job, key.epoch, key.rank, host.local.name
        );
    }
}

/// A rank that died of its GPU (an ECC error, an XID) must not count as
/// the job's failure: the fault is in the ledger before the exit is, so the
/// gang is requeued elsewhere rather than charged a restart. The GPUs are
/// read afresh: the periodic sample may predate the fault.
async fn report_gpu_faults(host: &RankHost, gpus: &[u32]) {
    let busy: std::collections::BTreeSet<u32> = gpus.iter().copied().collect();
    let Some(samples) = host.gpus.sample(&busy) else {
        return;
    };
    let inventory: Vec<_> = host
        .local
        .spec
        .gpus
        .iter()
        .filter(|g| busy.contains(&g.index))
        .cloned()
        .collect();
    for (gpu, reason) in crate::workers::gpu_health::faults(&inventory, &samples) {
        let known = host
            .ledger
            .read()
            .map(|d| d.ledger.workload.gpu_fault(host.local.id, gpu).is_some())
            .unwrap_or(false);
        if known {
            continue;
        }
        let cmd = Command::SetGpuFault {
            node: host.local.id,
            gpu,
            fault: Some(shoal_consensus::ledger::GpuFaultReport {
                reason,
                detected: true,
            }),
        };
        if let Err(e) = host.ledger.write(cmd).await {
            tracing::debug!(gpu, error = %e.message, "could not report a GPU fault before a rank's exit");
        }
    }
}

/// How long each step of a launch took, logged at debug level
/// (`RUST_LOG=shoal_node::executor=debug`) for the launch profile.
#[derive(Default, Debug)]
struct LaunchTimes {
    /// The launch marker's fsync, on a thread of its own meanwhile.
    marker: Duration,
    /// The cgroup, its limits and its GPU fence.
    cgroup: Duration,
    /// From clone to the job's exec.
    spawn: Duration,
    /// Starting the lease guard.
    guard: Duration,
    total: Duration,
}

fn launch(
    host: &RankHost,
    key: &RankKey,
    a: &Assignment,
    account: &account::Account,
    lease: Option<lease::Guarding>,
) -> Result<RunningRank, String> {
    let started = Instant::now();
    let mut times = LaunchTimes::default();
    let jobs_dir = host.jobs_dir.clone();
    let dir = job_dir(&jobs_dir, key.job);
    let ckpt_dir = dir.join("ckpt");
    let log = log_path(&jobs_dir, key.job, key.rank);
    let mut out = open_rank_log(&log).map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    discard_uncommitted_steps(&ckpt_dir, a.restore.as_ref().map_or(0, |c| c.step));
    // The marker's fsync and the cgroup (with its BPF fence) are
    // independent: both at once, and both done before the rank starts.
    let (marked, fences) = std::thread::scope(|scope| {
        let marker = std::thread::Builder::new()
            .name("launch-marker".into())
            .spawn_scoped(scope, || {
                let t = Instant::now();
                mark_launched(&jobs_dir, key).map(|()| t.elapsed())
            });
        let t = Instant::now();
        let fences = rank_cgroup(host, key, &a.spec, &a.gpus);
        times.cgroup = t.elapsed();
        let marked = match marker {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|_| Err("the launch marker's thread panicked".to_string())),
            // No thread to spare: here, then.
            Err(_) => {
                let t = Instant::now();
                mark_launched(&jobs_dir, key).map(|()| t.elapsed())
            }
        };
        (marked, fences)
    });
    let mut fences = match (marked, fences) {
        (Ok(took), Ok(fences)) => {
            times.marker = took;
            fences
        }
        (Err(e), fences) => {
            if let Ok(Fences {
                cgroup: Some(cg), ..
            }) = fences
            {
                // Nothing ran in it.
                let _ = std::fs::remove_dir(cg.dir());
            }
            return Err(e);
        }
        (Ok(_), Err(e)) => return Err(e),
    };
    fences.lease = lease;
    let cgroup = fences.cgroup.clone();
    {
        use std::io::Write;
        let _ = writeln!(
            out,
            "--- shoal: job {} epoch {} rank {} starting on {} ---",
            key.job, key.epoch, key.rank, host.local.name
        );
        for note in &fences.unenforced {
            let _ = writeln!(
                out,
                "--- shoal: not enforced on {}: {note} ---",
                host.local.name
            );
        }
    }
    // An allocation only (`shoal alloc`): hold the GPUs with a process that
    // does nothing until it is stopped, so stop and fencing work the same
    // way for allocations as for jobs.
    let idle = ["sleep".to_string(), "infinity".to_string()];
    let fanned_out;
    let argv = if a.spec.command.is_empty() {
        &idle[..]
    } else if a.spec.tasks_per_node() > 1 && !a.spec.batch {
        // Several tasks: the launcher starts them inside this rank.
        fanned_out = task_launch(&host.task_launcher, &a.spec.command);
        &fanned_out[..]
    } else {
        &a.spec.command[..]
    };
    let launched = spawn(
        host,
        key,
        a,
        argv,
        (out, err),
        account,
        ckpt_dir,
        fences,
        &mut times,
    );
    if launched.is_err() {
        if let Some(cg) = cgroup {
            // Nothing ran in it.
            let _ = std::fs::remove_dir(cg.dir());
        }
    }
    times.total = started.elapsed();
    tracing::debug!(
        job = key.job,
        rank = key.rank,
        marker_us = times.marker.as_micros() as u64,
        cgroup_us = times.cgroup.as_micros() as u64,
        spawn_us = times.spawn.as_micros() as u64,
        guard_us = times.guard.as_micros() as u64,
        total_us = times.total.as_micros() as u64,
        "launch steps"
    );
    launched
}

/// The rank's cgroup and what it cannot enforce.
struct Fences {
    cgroup: Option<Arc<cgroup::RankCgroup>>,
    unenforced: Vec<String>,
    lease: Option<lease::Guarding>,
    /// Only the rank's GPUs' device nodes open ([`gpu_fence`]).
    gpus_fenced: bool,
}

/// Creates the rank's cgroup with the job's limits and its GPU fence,
/// where the node has cgroups; the limits it cannot enforce come back as
/// sentences (the lease is the caller's to add).
fn rank_cgroup(
    host: &RankHost,
    key: &RankKey,
    spec: &shoal_consensus::workload::JobSpec,
    gpus: &[u32],
) -> Result<Fences, String> {
    let limits = cgroup::Limits {
        mem_bytes: spec.mem_bytes,
        // Per task, and the rank's cgroup holds all its tasks.
        cpus: spec
            .cpus_per_task
            .map(|c| c.saturating_mul(spec.tasks_per_node())),
    };
    let Some(cgroups) = &host.cgroups else {
        let mut notes = Vec::new();
        if let Some(bytes) = limits.mem_bytes {
            notes.push(format!(
                "--mem {bytes} bytes: this node has no cgroups (isolation: none)"
            ));
        }
        if let Some(cpus) = limits.cpus {
            notes.push(format!(
                "--cpus-per-task {cpus}: this node has no cgroups (isolation: none)"
            ));
        }
        return Ok(Fences {
            cgroup: None,
            unenforced: notes,
            lease: None,
            gpus_fenced: false,
        });
    };
    let name = cgroup::rank_name(key.job, key.rank, key.epoch);
    let (cg, notes) = cgroups
        .create(&name, limits)
        .map_err(|e| format!("cannot create the rank's cgroup: {e}"))?;
    let fenced = cgroups.controllers().devices;
    if fenced {
        // Before anything runs in it: the rank never sees another GPU.
        let by_index = host.gpus.device_minors();
        let minors = gpus
            .iter()
            .filter_map(|g| by_index.get(g).copied())
            .collect();
        if let Err(e) = gpu_fence::attach(cg.dir(), &minors) {
            let _ = std::fs::remove_dir(cg.dir());
            return Err(format!("cannot fence the rank's GPUs: {e}"));
        }
    }
    Ok(Fences {
        cgroup: Some(Arc::new(cg)),
        unenforced: notes,
        lease: None,
        gpus_fenced: fenced,
    })
}

/// The environment a rank starts with, built from scratch: nothing of the
/// agent's (no token, no config) but the basics a program expects.
fn base_env(account: &account::Account) -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOME".into(), account.home.display().to_string()),
        ("USER".into(), account.name.clone()),
        ("LOGNAME".into(), account.name.clone()),
        ("LANG".into(), "C.UTF-8".into()),
    ]
}

/// The rank's environment: later entries win, as with `Command::envs`.
fn rank_env(entries: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, String> {
    entries.into_iter().collect()
}

/// Starts the rank ([`spawn`](mod@spawn): no copy of the agent's memory),
/// inside its cgroup from its first instruction, as its tenant's user,
/// leading its own session; then its lease guard.
#[allow(clippy::too_many_arguments)]
fn spawn(
    host: &RankHost,
    key: &RankKey,
    a: &Assignment,
    argv: &[String],
    (out, err): (std::fs::File, std::fs::File),
    account: &account::Account,
    ckpt_dir: PathBuf,
    fences: Fences,
    times: &mut LaunchTimes,
) -> Result<RunningRank, String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let (program, _) = argv
        .split_first()
        .ok_or_else(|| "the job has no command".to_string())?;
    let cannot = |e: std::io::Error| format!("cannot run '{program}': {e}");
    // The cgroup's directory, for clone3 to start the rank inside, and its
    // cgroup.procs for kernels without that (the child writes "0").
    let cgroup_fds = match &fences.cgroup {
        Some(cg) => Some(
            cg.open_dir()
                .and_then(|dir| Ok((dir, cg.open_procs()?)))
                .map_err(|e| format!("cannot enter the rank's cgroup: {e}"))?,
        ),
        None => None,
    };
    // SAFETY: geteuid has no preconditions.
    let switch = (account.uid != unsafe { libc::geteuid() }).then_some((account.uid, account.gid));
    let env = rank_env(
        base_env(account)
            .into_iter()
            .chain(gang_env(host, key, a, &ckpt_dir, fences.gpus_fenced))
            .chain(a.spec.env.iter().map(|(k, v)| (k.clone(), v.clone()))),
    );
    let cwd = match &a.spec.workdir {
        Some(dir) => Some(PathBuf::from(dir)),
        // Another user cannot be left in the agent's working directory.
        None if switch.is_some() => Some(job_dir(&host.jobs_dir, key.job).join("work")),
        None => None,
    };
    let null =
        std::fs::File::open("/dev/null").map_err(|e| format!("cannot open /dev/null: {e}"))?;
    let nul = |e: std::ffi::NulError| format!("cannot run '{program}': {e}");
    let plan = spawn::Spawn {
        candidates: spawn::candidates(program, env.get("PATH").map(String::as_str))
            .map_err(cannot)?,
        argv: argv
            .iter()
            .map(|arg| std::ffi::CString::new(arg.as_str()).map_err(nul))
            .collect::<Result<_, _>>()?,
        envp: spawn::environment(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(cannot)?,
        fds: vec![
            (null.as_raw_fd(), 0),
            (out.as_raw_fd(), 1),
            (err.as_raw_fd(), 2),
        ],
        cwd: cwd
            .map(|d| std::ffi::CString::new(d.as_os_str().as_bytes()).map_err(nul))
            .transpose()?,
        cgroup: cgroup_fds
            .as_ref()
            .map(|(dir, procs)| (dir.as_raw_fd(), procs.as_raw_fd())),
        credentials: switch,
        new_session: true,
        // Die with the agent: the ledger is the only record of what runs.
        parent_death_signal: Some(libc::SIGKILL),
        no_new_privs: true,
        // Another user's rank sees neither other tenants' processes nor
        // the agent's.
        private_proc: switch.is_some(),
    };
    let t = Instant::now();
    let child = plan.start().map_err(cannot)?;
    times.spawn = t.elapsed();
    drop(cgroup_fds);
    let t = Instant::now();
    let mut guard = None;
    if let (Some(guarding), Some(pid)) = (&fences.lease, child.id()) {
        let kill = fences.cgroup.as_ref().and_then(|cg| cg.open_kill());
        let group = pid as libc::pid_t;
        let started = match &guarding.program {
            Some(program) => guarding
                .lease
                .spawn_guard(program, group, kill.as_ref())
                .map(Some),
            None => guarding.lease.fork_guard(group, kill).map(|()| None),
        };
        match started {
            Ok(g) => guard = g,
            Err(e) => {
                tracing::error!(job = key.job, rank = key.rank, error = %e, "cannot start the rank's lease guard");
            }
        }
    }
    times.guard = t.elapsed();
    tracing::info!(
        job = key.job,
        epoch = key.epoch,
        rank = key.rank,
        pid = child.id(),
        cgroup = fences
            .cgroup
            .as_ref()
            .map(|c| c.dir().display().to_string()),
        "rank started"
    );
    Ok(RunningRank {
        child,
        guard,
        term_sent: None,
        last_usr1: Instant::now(),
        warned: false,
        signals_sent: a.signals.len(),
        ckpt_dir,
        reported_step: None,
        recorded_step: None,
        retry_after: None,
        replicating: None,
        stall: StallWatch::new(Instant::now()),
        cgroup: fences.cgroup,
        unenforced: fences.unenforced,
    })
}

/// `CUDA_VISIBLE_DEVICES` for the rank's GPUs: their node indices, or —
/// behind the device fence on real GPUs, where CUDA numbers only the GPUs
/// the rank can open, so a node index would name the wrong one or none —
/// their UUIDs, which name each GPU whatever CUDA's numbering.
fn visible_devices(gpus: &[u32], inventory: &[shoal_sdk::GpuInfo], by_uuid: bool) -> Vec<String> {
    gpus.iter()
        .map(|g| {
            inventory
                .iter()
                .find(|info| info.index == *g && !info.uuid.is_empty())
                .filter(|_| by_uuid)
                .map_or_else(|| g.to_string(), |info| info.uuid.clone())
        })
        .collect()
}

/// `shoal exec-tasks --label -- COMMAND`: the rank as its node's tasks.
fn task_launch(launcher: &Path, command: &[String]) -> Vec<String> {
    let mut argv = vec![
        launcher.display().to_string(),
        "exec-tasks".to_string(),
        "--label".to_string(),
        "--".to_string(),
    ];
    argv.extend(command.iter().cloned());
    argv
}

/// The torchrun- and Slurm-compatible environment of INTERFACE.md, for the
/// node's rank; with several tasks per node the launcher gives each task
/// its own ranks and GPUs (`tasks::NodeTasks::task_env`).
fn gang_env(
    host: &RankHost,
    key: &RankKey,
    a: &Assignment,
    ckpt_dir: &Path,
    gpus_fenced: bool,
) -> Vec<(String, String)> {
    let (master_addr, names) = host
        .ledger
        .read()
        .ok()
        .map(|d| {
            let member = |id: &NodeId| d.ledger.members.get(id);
            let master = a.world.first().and_then(member).and_then(|m| {
                m.spec
                    .rpc_addr
                    .parse::<std::net::SocketAddr>()
                    .ok()
                    .map(|s| s.ip().to_string())
            });
            let names: Vec<String> = a
                .world
                .iter()
                .map(|id| member(id).map_or_else(|| id.to_string(), |m| m.spec.name.clone()))
                .collect();
            (master, names)
        })
        .unwrap_or_default();
    let master_addr = master_addr.unwrap_or_else(|| "127.0.0.1".into());
    let gpus = visible_devices(
        &a.gpus,
        &host.local.spec.gpus,
        gpus_fenced && host.gpus.real(),
    );
    let nodes = a.world.len() as u32;
    let per_node = a.spec.tasks_per_node();
    let layout = tasks::NodeTasks {
        node_rank: key.rank,
        nodes,
        per_node,
        gpus: gpus.clone(),
    };
    let nodelist = tasks::compress_hostlist(&names);
    let submit_dir = a
        .spec
        .env
        .get("SLURM_SUBMIT_DIR")
        .cloned()
        .or_else(|| a.spec.workdir.clone())
        .unwrap_or_else(|| "/".into());
    let mut env: Vec<(String, String)> = vec![
        ("SHOAL_JOB_ID".into(), key.job.to_string()),
        ("SHOAL_EPOCH".into(), key.epoch.to_string()),
        ("NODE_RANK".into(), key.rank.to_string()),
        ("GROUP_RANK".into(), key.rank.to_string()),
        ("GROUP_WORLD_SIZE".into(), nodes.to_string()),
        ("ROLE_NAME".into(), "default".into()),
        ("MASTER_ADDR".into(), master_addr),
        (
            "MASTER_PORT".into(),
            a.master_port
                .unwrap_or_else(|| derived_master_port(key.epoch, 0))
                .to_string(),
        ),
        ("TORCHELASTIC_RUN_ID".into(), key.job.to_string()),
        ("TORCHELASTIC_RESTART_COUNT".into(), a.restarts.to_string()),
        (
            "TORCHELASTIC_MAX_RESTARTS".into(),
            a.spec.max_restarts.to_string(),
        ),
        ("SLURM_JOB_ID".into(), key.job.to_string()),
        ("SLURM_JOBID".into(), key.job.to_string()),
        ("SLURM_JOB_NAME".into(), a.spec.name.clone()),
        ("SLURM_JOB_PARTITION".into(), "shoal".into()),
        ("SLURM_NNODES".into(), nodes.to_string()),
        ("SLURM_JOB_NUM_NODES".into(), nodes.to_string()),
        ("SLURM_NODEID".into(), key.rank.to_string()),
        ("SLURM_JOB_NODELIST".into(), nodelist.clone()),
        ("SLURM_NODELIST".into(), nodelist),
        ("SLURMD_NODENAME".into(), host.local.name.clone()),
        ("SLURM_GPUS_ON_NODE".into(), gpus.len().to_string()),
        ("SLURM_SUBMIT_DIR".into(), submit_dir),
        ("SLURM_RESTART_COUNT".into(), a.restarts.to_string()),
        ("SHOAL_CKPT_DIR".into(), ckpt_dir.display().to_string()),
        ("SHOAL_API".into(), host.local.spec.api_url()),
        ("SHOAL_NODE".into(), host.local.name.clone()),
    ];
    // Task 0's ranks: what a one-task node runs as, and what the launcher
    // starts from.
    env.extend(layout.task_env(0));
    if per_node > 1 {
        // The launcher splits them per task.
        env.retain(|(k, _)| k != "CUDA_VISIBLE_DEVICES");
        env.push(("CUDA_VISIBLE_DEVICES".into(), gpus.join(",")));
    }
    if let Some(ca) = &host.ca_file {
        env.push(("SHOAL_CA_FILE".into(), ca.display().to_string()));
    }
    if let Some(ckpt) = &a.restore {
        env.push(("SHOAL_RESTORE_STEP".into(), ckpt.step.to_string()));
    }
    env
}

/// Removes the steps above `restored` that an earlier epoch of the job
/// left in this node's `ckpt/`: none was committed (the restore is the
/// latest committed step), and the new rank would otherwise report one as
/// its own part at once — possibly another rank's files, if this node ran
/// another rank of the job before (chaos seed 24: a committed step whose
/// rank-1 part held only rank 0's file).
fn discard_uncommitted_steps(ckpt_dir: &Path, restored: u64) {
    let Ok(entries) = std::fs::read_dir(ckpt_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|step| step > restored);
        if !stale {
            continue;
        }
        // remove_dir_all does not follow links the job may have planted.
        let path = entry.path();
        let removed = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(e) => Err(e),
        };
        if let Err(e) = removed {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove an uncommitted checkpoint step");
        }
    }
}

/// The highest step `N` with `<ckpt_dir>/N/.done`.
pub fn latest_done_step(ckpt_dir: &Path) -> Option<u64> {
    std::fs::read_dir(ckpt_dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let step = entry.file_name().to_str()?.parse::<u64>().ok()?;
            // The job owns this directory: a step that is a link, or whose
            // marker is one, is not a checkpoint (the capture would refuse
            // it anyway; this keeps it from being tried every tick).
            let real = |p: &Path| {
                std::fs::symlink_metadata(p)
                    .ok()
                    .filter(|m| !m.file_type().is_symlink())
            };
            real(&entry.path())?.is_dir().then_some(())?;
            real(&entry.path().join(".done")).map(|_| step)
        })
        .max()
}

fn signal(child: &spawn::Process, sig: libc::c_int) {
    if let Some(pid) = child.id() {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // The rank leads its own process group (setsid), so -pid reaches
            // everything it started. SAFETY: plain syscall on a pid we own.
            unsafe {
                libc::kill(-pid, sig);
            }
        }
    }
}

/// Candidates for an allocation's `MASTER_PORT`: from a port derived from
/// the epoch (so that concurrent allocations spread out), upwards,
/// wrapping within the 1000 ports above [`MASTER_PORT_BASE`].
fn derived_master_port(epoch: u64, attempt: u64) -> u16 {
    let offset = epoch.wrapping_add(attempt) % MASTER_PORT_RANGE;
    u16::try_from(MASTER_PORT_BASE + offset).unwrap_or(29_500)
}

/// Ports of the `MASTER_PORT` range.
const MASTER_PORT_RANGE: u64 = 1000;
/// Candidates tried before settling for the derived port anyway.
const MASTER_PORT_TRIES: u64 = 64;

/// The first candidate `is_free` says no one holds on this node; the
/// derived port when none is (the rank then reports the clash itself).
fn free_master_port(epoch: u64, is_free: impl Fn(u16) -> bool) -> u16 {
    (0..MASTER_PORT_TRIES)
        .map(|attempt| derived_master_port(epoch, attempt))
        .find(|port| is_free(*port))
        .unwrap_or_else(|| {
            tracing::warn!(
                epoch,
                "no free MASTER_PORT among {MASTER_PORT_TRIES} candidates"
            );
            derived_master_port(epoch, 0)
        })
}

/// Whether a TCP listener could bind `port` on every IPv4 address here
/// now (a dual-stack listener on `[::]` holds it too).
fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)).is_ok()
}

/// Shell convention: 128 + signal number for a rank killed by a signal.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}

#[cfg(test)]
mod tests {
    use super::{discard_uncommitted_steps, latest_done_step, visible_devices};

    #[test]
    fn a_new_epoch_discards_the_steps_no_epoch_committed() {
        let root = tempfile::tempdir().expect("tempdir");
        let ckpt = root.path().join("ckpt");
        let outside = root.path().join("outside");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(outside.join("keep"), b"x").expect("keep");
        for step in 1..=4 {
            let d = ckpt.join(step.to_string());
            std::fs::create_dir_all(&d).expect("step");
            std::fs::write(d.join(".done"), b"").expect("done");
        }
        std::fs::write(ckpt.join("5"), b"not a dir").expect("file");
        std::fs::create_dir_all(ckpt.join("notes")).expect("notes");
        std::os::unix::fs::symlink(&outside, ckpt.join("6")).expect("link");
        discard_uncommitted_steps(&ckpt, 2);
        let mut left: Vec<String> = std::fs::read_dir(&ckpt)
            .expect("ckpt")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["1", "2", "notes"]);
        assert!(
            outside.join("keep").exists(),
            "a link's target is left alone"
        );
        assert_eq!(latest_done_step(&ckpt), Some(2));
    }

    fn gpu(index: u32, uuid: &str) -> shoal_sdk::GpuInfo {
        shoal_sdk::GpuInfo {
            index,
            model: "H100-80GB".into(),
            memory_mb: 81_920,
            uuid: uuid.into(),
            allocated_to: None,
            numa_node: None,
            nvlink_peers: Vec::new(),
            mig_enabled: false,
            health: String::new(),
            health_reason: None,
        }
    }

    #[test]
    fn fenced_real_gpus_are_named_by_uuid_others_by_index() {
        let inventory = [
            gpu(0, "GPU-aa"),
            gpu(1, "GPU-bb"),
            gpu(2, ""),
            gpu(3, "GPU-dd"),
        ];
        assert_eq!(visible_devices(&[1, 3], &inventory, false), ["1", "3"]);
        assert_eq!(
            visible_devices(&[3, 1], &inventory, true),
            ["GPU-dd", "GPU-bb"]
        );
        // No UUID known (or not in the inventory): the index, never nothing.
        assert_eq!(visible_devices(&[2, 7], &inventory, true), ["2", "7"]);
    }
}

#[cfg(test)]
mod master_port_tests {
    use super::*;

    #[test]
    fn the_master_port_is_the_first_free_candidate() {
        let first = derived_master_port(7, 0);
        assert_eq!(first, 29_407);
        assert_eq!(free_master_port(7, |_| true), first);
        // Taken: the next one up, wrapping inside the range.
        assert_eq!(free_master_port(7, |p| p != first), 29_408);
        assert_eq!(derived_master_port(999, 1), 29_400);
        // Nothing free: the derived port, for the rank to report the clash.
        assert_eq!(free_master_port(7, |_| false), first);
    }

    #[test]
    fn a_port_held_by_a_listener_is_not_free() {
        let held = std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
            .expect("an ephemeral port");
        let port = held.local_addr().expect("addr").port();
        assert!(!port_is_free(port));
        drop(held);
        assert!(port_is_free(port));
    }
}
