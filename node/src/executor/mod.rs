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
mod tick;

mod launch;
use launch::*;
mod steps;
use steps::*;
mod reports;
use reports::*;

pub use fence::{FenceGuard, RankFence, RankGroups};
pub use lease::{run_guard as run_lease_guard, GUARD_COMMAND as LEASE_GUARD_COMMAND};

use crate::anomaly::stall::StallWatch;
use crate::anomaly::EventLog;
use crate::ledger_client::LedgerClient;
use crate::metrics::Metrics;
use crate::node::LocalMember;
use crate::peers::SharedPeerView;
use crate::rpc::chunks::ChunkNet;
use crate::worker::Worker;
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
/// The tick while nothing is assigned to this node and nothing of an
/// earlier rank is left to do: new allocations wake the loop when they are
/// applied ([`Worker::wakeup`]), so the tick is only a safety net then.
const IDLE_TICK: Duration = Duration::from_secs(1);
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
    pub gpus: crate::gpu::Gpus,
    /// The `shoal` binary that starts a rank's tasks (`exec-tasks`).
    pub task_launcher: PathBuf,
    /// Peer regions' leases on jobs they hold checkpoint copies of: such a
    /// job's ranks run only while every such region's lease holds.
    pub regions: crate::federation::lease::RegionLeases,
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
    /// The last tick found nothing assigned here and nothing left over.
    idle: bool,
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
            idle: false,
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
        if self.idle {
            IDLE_TICK
        } else {
            TICK
        }
    }

    /// New allocations launch, and stops are signalled, as soon as this
    /// node applies them; a rank's exit is reported as soon as it exits.
    fn wakeup(&self) -> crate::worker::Wakeup {
        crate::worker::Wakeup::on_apply(self.host.ledger.applied_watch()).and_child_exits()
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
        let Some(seen) = self.observe() else {
            self.idle = false;
            return ControlFlow::Continue(());
        };
        self.deliver_signals(&seen);
        let actions = self.decide(&seen);
        self.act(actions, &seen).await;
        self.hand_off_checkpoints(&seen).await;
        self.watch_for_stalls();
        self.reap(&seen).await;
        self.report_exits(&seen).await;
        self.tidy(&seen);
        self.idle = self.nothing_to_do(&seen);
        ControlFlow::Continue(())
    }
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
/// ranks run here now ([`crate::federation::lease`]).
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
