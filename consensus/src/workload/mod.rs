//! Tenants and jobs in the ledger: the part of the state machine the
//! scheduler reads and writes. Like the rest of the ledger, everything here
//! is a pure function of the state, the command, the leader's timestamp and
//! the log index; amounts are integers so every replica computes the same
//! bytes.
//!
//! # Lifecycle
//! `SubmitJob` admits a job as `pending` (or refuses it with a reason when it
//! can never run: unknown tenant, bigger than the tenant's GPU cap, more
//! GPU-hours than its budget). The leader runs the pure scheduler over a view
//! of this state and commits the plan as one `Schedule` command; `apply`
//! re-validates every placement against the state at that point of the log
//! (nodes alive, GPUs free, model and shape, quota) so a stale plan from a
//! deposed leader can never double-book. The log index of that command is the
//! allocation's epoch, the fencing token agents check before acting.
//!
//! A running job stops in one of two ways. Either every rank reports its
//! exit (`RankExited`), or the job is asked to stop (cancel, preemption, time
//! limit, a failed rank) and the ranks report their exits after SIGTERM; if
//! they never do, the leader may `ReleaseJob` once the stop deadline has
//! passed on the ledger clock. A node going down requeues its jobs at once
//! (up to `max_restarts`; after that the job ends `node_fail`): agents kill
//! processes whose epoch is no longer the job's current one, which is what
//! makes this safe. A rank's own failure ends the job `failed` (or
//! `out_of_memory` when the OOM killer ended it) unless the job asked for
//! restarts on failure (`JobSpec::requeue`); the time limit ends it
//! `timeout`. A rank that fails while a node of its gang is not known
//! alive and healthy (a survivor's collective erroring before the detector
//! declared its peer's node down) is node loss, not the job's failure:
//! [`blame`] decides which, once the evidence is in.

mod apply;
pub mod blame;
pub(crate) use apply::validate_spec;
mod view;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;
pub use crate::sched::model::JobId;
use crate::sched::{NodeChoice, TopologyTier};
pub use view::{tenant_views, SchedSnapshot, TrialStart, TRIAL_JOB};

/// The protocol version from which an exclusive job's placement holds every
/// GPU of its nodes (`shoal_mesh::protocol::PROTOCOL` 5).
pub const WHOLE_NODES_SINCE_PROTOCOL: u16 = 5;

/// The tenant every cluster starts with, used when a job names none.
pub const DEFAULT_TENANT: &str = "default";
/// Finished jobs kept for `queue`/`show`; older ones are forgotten in
/// submission order so the ledger (and every snapshot) stays bounded.
pub const MAX_FINISHED_JOBS: usize = 10_000;
/// How long stopping ranks get between SIGTERM and the leader's right to
/// release their GPUs anyway (when a node never reports back).
pub const STOP_DEADLINE_MS: u64 = 60_000;
/// After a node is declared down, its jobs wait this long before they are
/// placed again, counted from the entry that released them. An agent kills
/// its own ranks `SELF_FENCE_MS` after the start of its latest ReadIndex
/// read that it could apply (a read started after that entry committed
/// shows the release, and the release kills the ranks at once), so by the
/// time a replacement starts the old ranks are gone: a job never runs
/// twice at once, even across a partition or a pause. The difference of
/// the two covers the release's commit latency and the ranks' guards'
/// poll.
pub const REPLACE_AFTER_NODE_LOSS_MS: u64 = 3_000;
/// See [`REPLACE_AFTER_NODE_LOSS_MS`]; agents use it for self-fencing.
pub const SELF_FENCE_MS: u64 = 2_500;
/// Half-life of the fair-share usage figure shown by `shoal quota`.
pub const FAIR_SHARE_HALF_LIFE_MS: u64 = 7 * 24 * 3600 * 1000;
/// Committed checkpoints kept per job (older ones are dropped from the catalog).
pub const CKPT_RETAIN: usize = 3;
/// Largest manifest one checkpoint part may record in the ledger.
pub const MAX_MANIFEST_BYTES: usize = 1 << 20;
/// Longest command line (bytes over all arguments and environment) a job may carry.
pub const MAX_JOB_SPEC_BYTES: usize = 64 * 1024;
/// Nodes a job may name in `--nodelist` or in `--exclude`.
pub const MAX_NAMED_NODES: usize = 4096;
/// Most `scancel --signal`s one allocation records.
pub const MAX_JOB_SIGNALS: usize = 64;
/// Most user names `sacctmgr add user` may map to tenants.
pub const MAX_USERS: usize = 10_000;
/// Most jobs one job may depend on.
pub const MAX_DEPENDENCIES: usize = 64;

/// A tenant's limits. For `max_gpus` and `gpu_seconds_limit` `None` means
/// unlimited; for the ledger limits below it means the cluster default
/// (the ledger's `limits::Limits::DEFAULT`). The ledger limits bound what a
/// tenant token may do (`Command::AsTenant`, checked in `apply` by the
/// ledger's `limits` guard); each counts the tenant's own jobs and objects, not
/// its subtree's.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TenantLimits {
    pub parent: Option<String>,
    pub max_gpus: Option<u32>,
    pub gpu_seconds_limit: Option<u64>,
    /// Relative share among siblings, at least 1.
    pub weight: u32,
    /// Jobs waiting at once (pending or requeued).
    pub max_pending_jobs: Option<u32>,
    /// `mesh:/` objects.
    pub max_objects: Option<u32>,
    /// The tenant's `mesh:/` manifests together, in bytes.
    pub max_manifest_bytes: Option<u64>,
    /// Highest `--priority` a tenant token may give a job of this tenant.
    pub max_priority: Option<i32>,
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits {
            parent: None,
            max_gpus: None,
            gpu_seconds_limit: None,
            weight: 1,
            max_pending_jobs: None,
            max_objects: None,
            max_manifest_bytes: None,
            max_priority: None,
        }
    }
}

/// A partial update: `None` leaves a field as it is; `Some(None)` removes
/// a limit (unlimited, or back to the cluster default for the ledger limits).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantUpdate {
    pub parent: Option<Option<String>>,
    pub max_gpus: Option<Option<u32>>,
    pub gpu_seconds_limit: Option<Option<u64>>,
    pub weight: Option<u32>,
    pub max_pending_jobs: Option<Option<u32>>,
    pub max_objects: Option<Option<u32>>,
    pub max_manifest_bytes: Option<Option<u64>>,
    pub max_priority: Option<Option<i32>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    pub limits: TenantLimits,
    pub created_at_ms: u64,
    /// GPU-milliseconds of finished allocations of this tenant's own jobs,
    /// before refunds.
    pub charged_gpu_ms: u64,
    /// GPU-milliseconds credited back for work lost to preemption.
    pub refunded_gpu_ms: u64,
    /// Usage decayed with [`FAIR_SHARE_HALF_LIFE_MS`], halved once per whole
    /// half-life (integer, so replicas agree to the bit).
    pub fair_usage_gpu_ms: u64,
    pub fair_usage_at_ms: u64,
}

impl Tenant {
    /// Finished usage net of refunds.
    pub fn used_gpu_ms(&self) -> u64 {
        self.charged_gpu_ms.saturating_sub(self.refunded_gpu_ms)
    }
}

/// Job states of INTERFACE.md; the type lives in the sdk so that every
/// edge (API, CLI, dashboard) shares it. Its variant order is the ledger's
/// encoding.
pub use shoal_sdk::JobState;

/// What a user asked for. `Default` is a base for struct-update literals
/// (tests, the simulator), not a valid job: it has no node and no GPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSpec {
    pub name: String,
    pub tenant: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub gpu_model: Option<String>,
    pub time_limit_s: u64,
    pub priority: i32,
    pub preemptible: bool,
    /// Empty: an allocation only (`shoal alloc`); nothing is launched.
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub ckpt_interval_s: Option<u64>,
    /// Restarts allowed over the job's life. Node loss restarts the gang
    /// (from its latest checkpoint) while restarts are left; a rank's own
    /// non-zero exit does only when `requeue` is set.
    pub max_restarts: u32,
    /// A rank's own failure (non-zero exit, OOM kill) restarts the gang
    /// too, within `max_restarts` (`--requeue`, or `--max-restarts N` with
    /// N > 0). Without it such a failure ends the job.
    pub requeue: bool,
    pub same: Option<TopologyTier>,
    pub max_rtt_ms: Option<u32>,
    pub required_labels: BTreeMap<String, String>,
    /// Memory of each rank in bytes (`--mem`): the rank's cgroup
    /// `memory.max` where the node enforces it.
    pub mem_bytes: Option<u64>,
    /// CPUs of each rank (`--cpus-per-task`): the rank's cgroup `cpu.max`
    /// quota where the node enforces it.
    pub cpus_per_task: Option<u32>,
    /// Processes per node (`--ntasks-per-node`), each with an equal share
    /// of the node's GPUs and torchrun's environment for its global rank.
    /// 0 and 1 both mean one process per node, the node's rank itself.
    pub tasks_per_node: u32,
    /// The command is a batch script (`sbatch`): it runs once on every node
    /// and starts the node's tasks itself with `srun`, instead of the agent
    /// starting it once per task.
    pub batch: bool,
    /// Jobs this one waits for, all of them (`--dependency`).
    pub dependencies: Vec<Dependency>,
    /// At most one job of this name and tenant holds GPUs at a time, in
    /// submit order (`--dependency=singleton`).
    pub singleton: bool,
    /// A signal the ranks get once, this long before the time limit
    /// (`--signal SIG@SECS`), to checkpoint or wrap up.
    pub warn_signal: Option<WarnSignal>,
    /// Which nodes the job may use (`-w/--nodelist`, `-x/--exclude`) and
    /// whether it takes them whole (`--exclusive`). A nodelist names every
    /// node of the gang: its length is `nodes`.
    pub choice: NodeChoice,
    /// Submitted held (`sbatch -H/--hold`): it waits for `scontrol release`.
    pub submit_held: bool,
    /// Peers of the job's region that receive each checkpoint part
    /// (`--ckpt-replicas L+R`: L); 0 means the default of three.
    pub ckpt_peer_copies: u32,
    /// Copies of each committed step kept in another region
    /// (`--ckpt-replicas L+R`: R, at most [`MAX_REGION_COPIES`]): the job
    /// can then resume there when its own region is lost.
    pub ckpt_region_copies: u32,
}

/// Most peers of its region a checkpoint part is copied to.
pub const MAX_PEER_COPIES: u32 = 3;
/// Most regions besides its own that hold a copy of a job's checkpoints.
pub const MAX_REGION_COPIES: u32 = 1;

/// `--signal [B:|R:]SIG[@SECS]`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarnSignal {
    /// The signal's number.
    pub signal: i32,
    pub before_s: u32,
}

impl WarnSignal {
    /// The signals a job may ask for, by name and number (Linux numbering;
    /// never KILL or STOP, which a rank could not act on).
    pub(crate) const NAMES: [(&'static str, i32); 8] = [
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("USR1", 10),
        ("USR2", 12),
        ("ALRM", 14),
        ("TERM", 15),
        ("CONT", 18),
    ];

    /// Slurm's form: `USR1@300`, `B:SIGUSR2`, `10@60`; 60 s when `@` is
    /// absent. `B:` (the batch shell) and `R:` are accepted: a shoal
    /// batch script is a rank, so both reach every rank.
    pub fn parse(s: &str) -> Result<WarnSignal, String> {
        let bad = |why: &str| format!("invalid --signal '{s}': {why}");
        let body = s
            .strip_prefix("B:")
            .or_else(|| s.strip_prefix("R:"))
            .or_else(|| s.strip_prefix("RB:"))
            .unwrap_or(s);
        let (name, secs) = match body.split_once('@') {
            Some((n, t)) => (
                n,
                t.parse::<u32>()
                    .map_err(|_| bad("the time after @ is seconds"))?,
            ),
            None => (body, 60),
        };
        if secs > 65_535 {
            return Err(bad("at most 65535 seconds before the limit"));
        }
        let upper = name.to_ascii_uppercase();
        let upper = upper.strip_prefix("SIG").unwrap_or(&upper);
        let signal = match upper.parse::<i32>() {
            Ok(n) => Self::NAMES
                .iter()
                .find(|(_, num)| *num == n)
                .map(|(_, num)| *num),
            Err(_) => Self::NAMES
                .iter()
                .find(|(n, _)| *n == upper)
                .map(|(_, num)| *num),
        }
        .ok_or_else(|| bad("use HUP, INT, QUIT, USR1, USR2, ALRM, TERM or CONT"))?;
        Ok(WarnSignal {
            signal,
            before_s: secs,
        })
    }

    /// `USR1@300`.
    pub fn display(&self) -> String {
        let name = Self::NAMES
            .iter()
            .find(|(_, n)| *n == self.signal)
            .map_or_else(|| self.signal.to_string(), |(n, _)| (*n).to_string());
        format!("{name}@{}", self.before_s)
    }
}

/// What a dependency waits for in the job it names (Slurm's kinds).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DependencyKind {
    /// The job started (or ended).
    After,
    /// The job ended, however.
    AfterAny,
    /// The job completed successfully.
    AfterOk,
    /// The job ended other than successfully.
    AfterNotOk,
}

impl DependencyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DependencyKind::After => "after",
            DependencyKind::AfterAny => "afterany",
            DependencyKind::AfterOk => "afterok",
            DependencyKind::AfterNotOk => "afternotok",
        }
    }
}

/// `--dependency=KIND:JOB`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dependency {
    pub kind: DependencyKind,
    pub job: JobId,
}

/// Where a dependency stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DependencyState {
    Met,
    /// Not yet; the sentence says what it waits for.
    Waiting(String),
    /// It never can be: the job ended the other way.
    Never(String),
}

impl Dependency {
    /// Slurm's `--dependency` list: `KIND:ID[:ID...]` items and `singleton`,
    /// separated by commas (all must hold); returns the dependencies and
    /// whether the job is a singleton. `?` (any of them) is not supported.
    pub fn parse_list(s: &str) -> Result<(Vec<Dependency>, bool), String> {
        if s.contains('?') {
            return Err(format!(
                "--dependency={s}: '?' (any one of them) is not supported; use ',' (all)"
            ));
        }
        let mut deps = Vec::new();
        let mut singleton = false;
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if item == "singleton" {
                singleton = true;
                continue;
            }
            let mut parts = item.split(':');
            let kind = match parts.next().unwrap_or_default() {
                "after" => DependencyKind::After,
                "afterany" => DependencyKind::AfterAny,
                "afterok" => DependencyKind::AfterOk,
                "afternotok" => DependencyKind::AfterNotOk,
                other => {
                    return Err(format!(
                        "--dependency: '{other}' is not after, afterany, afterok, afternotok or singleton"
                    ))
                }
            };
            let mut any = false;
            for id in parts {
                // Slurm's `after:ID+MINUTES` delay is not supported.
                let job: JobId = id
                    .parse()
                    .map_err(|_| format!("--dependency: '{id}' in '{item}' is not a job id"))?;
                deps.push(Dependency { kind, job });
                any = true;
            }
            if !any {
                return Err(format!("--dependency: '{item}' names no job"));
            }
        }
        if deps.is_empty() && !singleton {
            return Err(format!("--dependency={s} names nothing"));
        }
        Ok((deps, singleton))
    }

    /// The list as Slurm writes it.
    pub fn format_list(deps: &[Dependency], singleton: bool) -> String {
        let mut items: Vec<String> = deps
            .iter()
            .map(|d| format!("{}:{}", d.kind.as_str(), d.job))
            .collect();
        if singleton {
            items.push("singleton".into());
        }
        items.join(",")
    }

    pub fn state(&self, jobs: &BTreeMap<JobId, Job>) -> DependencyState {
        let kind = self.kind.as_str();
        // Dropped from the bounded history: it ended long ago.
        let Some(job) = jobs.get(&self.job) else {
            return DependencyState::Met;
        };
        let ended = job.state.is_final();
        let ok = job.state == JobState::Completed;
        let met = match self.kind {
            DependencyKind::After => ended || job.started_at_ms.is_some(),
            DependencyKind::AfterAny => ended,
            DependencyKind::AfterOk => ended && ok,
            DependencyKind::AfterNotOk => ended && !ok,
        };
        if met {
            DependencyState::Met
        } else if ended {
            DependencyState::Never(format!(
                "dependency never satisfied: job {} ended {} ({kind})",
                job.id, job.state
            ))
        } else {
            let until = match self.kind {
                DependencyKind::After => "to start",
                DependencyKind::AfterAny => "to end",
                DependencyKind::AfterOk => "to complete",
                DependencyKind::AfterNotOk => "to fail",
            };
            DependencyState::Waiting(format!(
                "dependency: waiting for job {} {until} ({kind})",
                job.id
            ))
        }
    }
}

impl JobSpec {
    pub fn total_gpus(&self) -> u32 {
        self.nodes.saturating_mul(self.gpus_per_node)
    }

    /// Processes on each node of the gang (at least one).
    pub fn tasks_per_node(&self) -> u32 {
        self.tasks_per_node.max(1)
    }

    /// Worst case, used for budget admission.
    pub fn gpu_seconds_needed(&self) -> u64 {
        u64::from(self.total_gpus()).saturating_mul(self.time_limit_s)
    }
}

/// How a rank's process ended, as the agent that ran it saw it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RankEnd {
    /// It exited, or a signal ended it, with the reported code.
    #[default]
    Exited,
    /// The kernel's OOM killer ended it (its cgroup's `memory.events`
    /// `oom_kill` count rose while it ran).
    OomKilled,
    /// It died with a previous run of its node's agent: the node's fault,
    /// not the job's, so it restarts the gang like node loss.
    Lost,
}

/// Why a running job was asked to stop; decides the state it ends in.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    Cancelled,
    Preempted,
    TimeLimit,
    /// Another rank failed.
    RankFailed,
    /// A node of the gang is being drained: checkpoint, stop, run elsewhere.
    Drained,
    /// A GPU of the gang failed or was drained: run elsewhere.
    GpuFailed,
    /// A rank died with its node's agent: restart like node loss.
    NodeLost,
    /// `scontrol requeue`: back to the queue, not counted as a restart.
    Requeued,
}

/// Why a GPU takes no work: found faulty by its own node (an uncorrectable
/// ECC error, a fatal XID, gone from NVML, failed row remapping), or
/// drained by an operator. Only an operator returns it to service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GpuFault {
    pub reason: String,
    /// Found by the node rather than set by an operator.
    pub detected: bool,
    pub since_ms: u64,
}

/// Where and under which epoch a job runs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Log index of the command that created the allocation: the fencing token.
    pub epoch: u64,
    /// Rank order.
    pub nodes: Vec<(NodeId, Vec<u32>)>,
    pub started_at_ms: u64,
    /// Estimated gang diameter in microseconds.
    pub diameter_us: u64,
    /// Exit codes reported so far, by rank.
    pub exits: BTreeMap<u32, i32>,
    /// Ranks the kernel's OOM killer ended (their cgroup's `oom_kill`
    /// count rose while they ran).
    pub oom_killed: std::collections::BTreeSet<u32>,
    pub stop: Option<Stop>,
    /// Signals asked for with `scancel --signal`, in order; each agent
    /// sends its ranks the ones that arrive while they run.
    pub signals: Vec<i32>,
    /// `MASTER_PORT`: chosen free on rank 0's node by its agent; the ranks
    /// start once it is known.
    pub master_port: Option<u16>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop {
    pub cause: StopCause,
    pub requested_at_ms: u64,
}

impl Allocation {
    pub fn gpu_count(&self) -> u32 {
        self.nodes.iter().map(|(_, gpus)| gpus.len() as u32).sum()
    }

    pub fn rank_of(&self, node: NodeId) -> Option<u32> {
        self.nodes
            .iter()
            .position(|(n, _)| *n == node)
            .map(|r| r as u32)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub id: JobId,
    pub spec: JobSpec,
    pub state: JobState,
    /// Why a waiting job waits, or how a finished job ended.
    pub reason: String,
    pub submitted_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub ended_at_ms: Option<u64>,
    pub exit_code: Option<i32>,
    /// Restarts so far: after node loss, and after a rank's own failure
    /// when the job allows it (`JobSpec::requeue`).
    pub restarts: u32,
    /// Preemptions suffered; the requeued job's priority boost.
    pub preemptions: u32,
    /// Present while the job holds GPUs; the last one is kept in `last_nodes`.
    pub alloc: Option<Allocation>,
    pub last_nodes: Vec<(NodeId, Vec<u32>)>,
    pub last_epoch: Option<u64>,
    pub last_ckpt_step: Option<u64>,
    pub last_ckpt_at_ms: Option<u64>,
    /// Preempted jobs that must release their GPUs before this one is
    /// scheduled again (so that a pass does not pick fresh victims meanwhile).
    pub waiting_for: Vec<JobId>,
    /// Set on a preemption victim: it is not rescheduled while the job it
    /// made room for is still waiting, so the freed GPUs go to that job.
    pub yields_to: Option<JobId>,
    /// Not placed before this ledger time (the fencing wait after node loss).
    pub not_before_ms: Option<u64>,
    /// Held by its user or an admin (`scontrol hold`): not scheduled until
    /// released.
    pub held: bool,
}

impl Job {
    /// Waiting and free to be scheduled at `now_ms`.
    pub fn schedulable(&self, jobs: &BTreeMap<JobId, Job>, now_ms: u64) -> bool {
        self.state.is_waiting()
            && self.waiting_for.is_empty()
            && self.not_before_ms.is_none_or(|t| now_ms >= t)
            && self
                .yields_to
                .is_none_or(|other| !jobs.get(&other).is_some_and(|j| j.state.is_waiting()))
            && self.user_hold(jobs).is_none()
    }

    /// Why the job's user keeps it from the scheduler: a hold, a dependency
    /// not met, or an earlier job of its singleton name; None when nothing
    /// does.
    pub fn user_hold(&self, jobs: &BTreeMap<JobId, Job>) -> Option<String> {
        if self.held {
            return Some(format!(
                "held (release it with `scontrol release {}`)",
                self.id
            ));
        }
        for dep in &self.spec.dependencies {
            match dep.state(jobs) {
                DependencyState::Met => {}
                DependencyState::Waiting(why) | DependencyState::Never(why) => return Some(why),
            }
        }
        if self.spec.singleton {
            let same = |j: &&Job| {
                j.id != self.id
                    && j.spec.singleton
                    && j.spec.name == self.spec.name
                    && j.spec.tenant == self.spec.tenant
            };
            // One holding GPUs, or an earlier one still waiting, goes first.
            if let Some(other) = jobs
                .values()
                .filter(same)
                .find(|j| j.alloc.is_some() || (j.state.is_waiting() && j.id < self.id))
            {
                return Some(format!(
                    "singleton: job {} of the same name goes first",
                    other.id
                ));
            }
        }
        None
    }
}

/// One placement of a plan, as committed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PlannedPlacement {
    pub job: JobId,
    pub nodes: Vec<(NodeId, Vec<u32>)>,
    pub diameter_us: u64,
}

/// A scheduling pass's decisions, committed as one log entry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub preemptions: Vec<(JobId, JobId)>,
    pub placements: Vec<PlannedPlacement>,
    pub timed_out: Vec<JobId>,
    /// Only reasons that changed.
    pub reasons: BTreeMap<JobId, String>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.preemptions.is_empty()
            && self.placements.is_empty()
            && self.timed_out.is_empty()
            && self.reasons.is_empty()
    }
}

/// One rank's part of a checkpoint: its manifest (files → chunks) and the
/// nodes holding every chunk.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CkptPart {
    pub manifest: Vec<u8>,
    pub bytes: u64,
    pub holders: Vec<NodeId>,
}

/// A checkpoint step of a job: committed once every rank's part is
/// replicated (each part on a write quorum of holders).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub step: u64,
    pub epoch: u64,
    pub ranks: u32,
    pub parts: BTreeMap<u32, CkptPart>,
    pub committed_at_ms: Option<u64>,
    /// Other regions holding a copy of this step (`--ckpt-replicas L+R`).
    pub regions: Vec<String>,
}

impl Checkpoint {
    pub fn bytes(&self) -> u64 {
        self.parts.values().map(|p| p.bytes).sum()
    }

    /// Nodes holding every part.
    pub fn replicas(&self) -> Vec<NodeId> {
        let mut parts = self.parts.values();
        let Some(first) = parts.next() else {
            return Vec::new();
        };
        let mut common: Vec<NodeId> = first.holders.clone();
        for part in parts {
            common.retain(|n| part.holders.contains(n));
        }
        common.sort_unstable();
        common
    }
}

/// Jobs and tenants.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Workload {
    pub tenants: BTreeMap<String, Tenant>,
    pub jobs: BTreeMap<JobId, Job>,
    pub next_job_id: JobId,
    /// The checkpoint catalog, by job, in step order.
    pub checkpoints: BTreeMap<JobId, Vec<Checkpoint>>,
    /// Nodes that accept no new work (`shoal drain`).
    pub drained: std::collections::BTreeSet<NodeId>,
    /// GPUs that take no work, by node and GPU index.
    pub gpu_faults: BTreeMap<NodeId, BTreeMap<u32, GpuFault>>,
    /// Slurm user names and the tenant each stands for (`sacctmgr add user
    /// NAME account=TENANT`), so that `squeue -u NAME` finds its jobs.
    pub users: BTreeMap<String, String>,
}

impl Workload {
    /// Why `gpu` of `node` takes no work, if it does not.
    pub fn gpu_fault(&self, node: NodeId, gpu: u32) -> Option<&GpuFault> {
        self.gpu_faults.get(&node).and_then(|g| g.get(&gpu))
    }

    /// Whether a scheduling pass has nothing to decide: no job waits and
    /// none holds GPUs, so there is nothing to place, preempt, time out or
    /// release. The leader then skips its pass, which reads every member:
    /// ten times a second, a cost that grew with the pool while idle.
    pub fn nothing_to_schedule(&self) -> bool {
        self.jobs
            .values()
            .all(|job| job.state.is_final() && job.alloc.is_none())
    }

    /// Jobs holding GPUs, in id order.
    pub fn holding(&self) -> impl Iterator<Item = (&Job, &Allocation)> {
        self.jobs
            .values()
            .filter_map(|job| job.alloc.as_ref().map(|alloc| (job, alloc)))
    }

    /// GPUs held right now by each tenant's own jobs.
    pub fn gpus_in_use(&self) -> BTreeMap<&str, u32> {
        let mut held = BTreeMap::new();
        for (job, alloc) in self.holding() {
            *held.entry(job.spec.tenant.as_str()).or_default() += alloc.gpu_count();
        }
        held
    }

    /// GPU-milliseconds a tenant has consumed, counting running jobs up to `now_ms`.
    pub fn used_gpu_ms(&self, tenant: &str, now_ms: u64) -> u64 {
        let finished = self.tenants.get(tenant).map_or(0, Tenant::used_gpu_ms);
        let running: u64 = self
            .holding()
            .filter(|(job, _)| job.spec.tenant == tenant)
            .map(|(_, alloc)| {
                u64::from(alloc.gpu_count())
                    .saturating_mul(now_ms.saturating_sub(alloc.started_at_ms))
            })
            .sum();
        finished.saturating_add(running)
    }

    /// What the budget check counts: finished usage plus the worst case of
    /// every running job, so concurrent jobs cannot overrun a budget together.
    pub fn committed_gpu_seconds(&self, tenant: &str) -> u64 {
        let finished = self.tenants.get(tenant).map_or(0, Tenant::used_gpu_ms) / 1000;
        let running: u64 = self
            .holding()
            .filter(|(job, _)| job.spec.tenant == tenant)
            .map(|(job, alloc)| u64::from(alloc.gpu_count()).saturating_mul(job.spec.time_limit_s))
            .sum();
        finished.saturating_add(running)
    }

    /// A tenant and its ancestors, nearest first. Stops at a cycle or a missing parent.
    pub fn ancestry<'a>(&'a self, tenant: &'a str) -> Vec<&'a str> {
        let mut chain = Vec::new();
        let mut current = Some(tenant);
        while let Some(name) = current {
            if chain.contains(&name) || !self.tenants.contains_key(name) {
                break;
            }
            chain.push(name);
            current = self.tenants[name].limits.parent.as_deref();
        }
        chain
    }

    /// The latest committed checkpoint of a job.
    pub fn latest_checkpoint(&self, job: JobId) -> Option<&Checkpoint> {
        self.checkpoints
            .get(&job)?
            .iter()
            .rev()
            .find(|c| c.committed_at_ms.is_some())
    }

    /// Names of `tenant` and every tenant below it.
    pub fn subtree(&self, tenant: &str) -> Vec<&str> {
        self.tenants
            .keys()
            .filter(|name| self.ancestry(name).contains(&tenant))
            .map(String::as_str)
            .collect()
    }
}
