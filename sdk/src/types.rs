//! API types. Field names are part of the interface contract: changing one
//! breaks scripts, so add fields rather than rename them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A member's state as the cluster agrees on it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    Alive,
    Suspect,
    Down,
    Left,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Down => "down",
            MemberState::Left => "left",
        }
    }
}

impl std::fmt::Display for MemberState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One accelerator as registered in the ledger.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub model: String,
    pub memory_mb: u64,
    pub uuid: String,
    /// The job holding this GPU, if any.
    pub allocated_to: Option<u64>,
    /// NUMA node of the GPU's PCIe root, when known.
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// Indices of GPUs on the same node reachable over NVLink.
    #[serde(default)]
    pub nvlink_peers: Vec<u32>,
    #[serde(default)]
    pub mig_enabled: bool,
    /// `ok`, or `unhealthy` (found faulty by its node) or `drained` (by an
    /// operator): such a GPU takes no work. Filled in by `shoal nodes`.
    #[serde(default = "ok")]
    pub health: String,
    #[serde(default)]
    pub health_reason: Option<String>,
}

fn ok() -> String {
    "ok".into()
}

/// `shoal status --json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct StatusResponse {
    pub cluster_id: String,
    pub region: String,
    pub leader: Option<u64>,
    pub term: u64,
    pub commit_index: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    pub members: Vec<MemberSummary>,
    /// The node that answered.
    pub node_id: u64,
    /// Fingerprint (BLAKE3 of the DER, as join tokens pin it) of the
    /// cluster CA that signs certificates now.
    #[serde(default)]
    pub ca_fingerprint: String,
    /// The phase of a CA rotation in progress (`trusting`, `reissuing`).
    #[serde(default)]
    pub ca_rotation: Option<String>,
    /// The newest protocol version every member speaks: what new ledger
    /// command formats wait for (docs/operations.md, Upgrade).
    #[serde(default)]
    pub effective_protocol: Option<u16>,
}

/// `shoal ca status --json` (`GET /v1/ca`): the cluster CA, any rotation
/// in progress, and what each member trusts and holds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CaStatus {
    /// `stable` (one CA), or the phase of the rotation in progress:
    /// `trusting` (both CAs trusted, the old one signs) or `reissuing`
    /// (both trusted, the new one signs, nodes renew).
    pub phase: String,
    /// The CA that signs certificates now and that new join tokens pin.
    pub signing_fingerprint: String,
    /// The CAs every node trusts: one, or both during a rotation.
    pub trusted: Vec<String>,
    #[serde(default)]
    pub old_fingerprint: Option<String>,
    #[serde(default)]
    pub new_fingerprint: Option<String>,
    #[serde(default)]
    pub started_at_ms: Option<u64>,
    #[serde(default)]
    pub phase_since_ms: Option<u64>,
    /// Rotations started since the cluster was created.
    pub rotations: u32,
    pub members: Vec<MemberCa>,
    /// Why the rotation has not moved on yet, one line per member.
    #[serde(default)]
    pub waiting_for: Vec<String>,
    /// The trusted CA certificates (PEM), for clients that check the
    /// nodes' HTTPS API against the cluster CA.
    pub trusted_pem: String,
}

/// One member in [`CaStatus`], as it last reported.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MemberCa {
    pub id: u64,
    pub name: String,
    pub state: MemberState,
    /// Fingerprint of the CA that signed its certificate; `None` before it
    /// reported.
    #[serde(default)]
    pub cert_ca: Option<String>,
    /// Fingerprints of the CAs it accepts peers from.
    #[serde(default)]
    pub trusts: Vec<String>,
    #[serde(default)]
    pub reported_at_ms: Option<u64>,
}

/// `shoal ca rotate --json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CaRotateResponse {
    /// Log index of the entry that started the rotation.
    pub index: u64,
    pub old_fingerprint: String,
    pub new_fingerprint: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MemberSummary {
    pub id: u64,
    pub name: String,
    pub state: MemberState,
    /// The release the member runs, as it last recorded it.
    #[serde(default)]
    pub version: String,
    /// The protocol versions it speaks, `min..max`.
    #[serde(default)]
    pub protocol: String,
}

/// One row of `shoal nodes --json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NodeInfo {
    pub id: u64,
    pub name: String,
    pub state: MemberState,
    /// RPC address (quinn) peers use.
    pub addr: String,
    pub api_addr: String,
    /// `https://<api_addr>` (or `http://` on a loopback address): where
    /// clients reach the node's API.
    #[serde(default)]
    pub api_url: String,
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<GpuInfo>,
    pub gpus_free: u32,
    pub gpus_total: u32,
    /// Milliseconds since the leader last heard from the node.
    pub last_seen_ms: Option<u64>,
    pub voter: bool,
    pub joined_at_ms: u64,
    /// Average GPU utilization (0-1) from the node's latest capacity advert.
    #[serde(default)]
    pub gpu_util: Option<f32>,
    /// Drained (`shoal drain`): takes no new work.
    #[serde(default)]
    pub drained: bool,
    /// How the node fences its ranks' resources: `cgroup` (a cgroup v2 per
    /// rank, killed whole on cancel) or `none`.
    #[serde(default)]
    pub isolation: String,
    /// The cgroup controllers enforced for ranks (`memory`, `cpu`, `pids`);
    /// empty under `cgroup`: accounting and kill only.
    #[serde(default)]
    pub isolation_controllers: Vec<String>,
    /// The release the node runs, as it last recorded it.
    #[serde(default)]
    pub version: String,
    /// The protocol versions it speaks, `min..max`.
    #[serde(default)]
    pub protocol: String,
}

/// One row of `shoal mesh --json`: how the answering node sees a peer,
/// from gossip alone (no leader involved).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct PeerView {
    pub id: u64,
    pub name: String,
    /// The answering node's own failure detector: alive, suspect, down, or
    /// unknown (not heard from yet).
    pub state: String,
    /// Milliseconds since the last gossip message (or Raft ack) from it.
    pub last_heard_ms: Option<u64>,
    /// RTT estimated from Vivaldi coordinates.
    pub rtt_ms: Option<f64>,
    pub gpus_free: Option<u32>,
    pub gpus_total: Option<u32>,
    /// Average GPU utilization, 0-1, from the peer's capacity advert.
    pub load: Option<f32>,
}

/// `POST /v1/tokens` body (admin only): a new join token.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct TokenCreateRequest {
    /// Lifetime in seconds; the server applies its default
    /// (`join_token_ttl_s`, 1 h) when absent.
    pub ttl_s: Option<u64>,
    /// Joins it admits; 1 when absent.
    #[serde(default)]
    pub uses: Option<u32>,
    /// The nodes it admits may become voters (and hold the CA key);
    /// otherwise they stay learners for good.
    #[serde(default)]
    pub voter: bool,
}

/// The new join token: the secret is in `token` and nowhere else, ever.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct TokenCreateResponse {
    pub token: String,
    pub expires_at_ms: u64,
    /// Public id, for `shoal token ls` and `shoal token revoke`.
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub uses: u32,
}

/// One row of `shoal token ls --json` (`GET /v1/tokens`, admin only).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct JoinTokenInfo {
    pub id: String,
    pub uses_left: u32,
    pub max_uses: u32,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    /// `active`, `spent`, `expired` or `revoked`.
    pub state: String,
    /// Admits nodes that may become voters.
    #[serde(default)]
    pub voter: bool,
}

/// `POST /v1/tokens/revoke` and `POST /v1/api-tokens/revoke` body.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct TokenRevokeRequest {
    /// A join token's id; an API token's id or name.
    pub id: String,
}

/// `POST /v1/api-tokens` body (admin only): a new API token for scripts and
/// users. With a tenant it may only act for that tenant and those below it.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct ApiTokenCreateRequest {
    /// Unique; the server picks one when absent.
    pub name: Option<String>,
    /// `None`: an admin token.
    pub tenant: Option<String>,
    /// Lifetime in seconds; `None`: until revoked.
    #[serde(default)]
    pub ttl_s: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ApiTokenCreateResponse {
    pub token: String,
    pub name: String,
    pub tenant: Option<String>,
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub expires_at_ms: Option<u64>,
}

/// One row of `shoal token api ls --json` (`GET /v1/api-tokens`, admin only).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ApiTokenInfo {
    pub id: String,
    pub name: String,
    pub tenant: Option<String>,
    pub created_at_ms: u64,
    pub expires_at_ms: Option<u64>,
    /// The latest use any member reported (at most a minute behind) or
    /// the answering node saw itself; `None`: not used since it was made.
    pub last_used_ms: Option<u64>,
    /// `active` or `expired`.
    pub state: String,
}

/// `POST /v1/api-tokens/rotate-admin`: the bootstrap admin token's new
/// secret. The old one is refused from now on.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct AdminTokenRotateResponse {
    pub token: String,
    pub name: String,
    pub id: String,
    /// The answering node's `<data-dir>/admin.token`, rewritten (0600) with
    /// the new token; `None` when that node has no such file.
    pub admin_token_file: Option<String>,
}

/// `POST /v1/attrs` body: a small cluster attribute (used by operators for
/// annotations and by `shoal bench ledger` as the unit of write).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct AttrPut {
    pub key: String,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct WriteResponse {
    /// Log index at which the write was committed.
    pub index: u64,
}

/// Error body of every non-2xx API answer.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ApiErrorBody {
    pub code: String,
    pub message: String,
}

/// `POST /v1/jobs`: what `shoal submit` sends.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct JobSubmitRequest {
    #[serde(default)]
    pub name: String,
    /// Default tenant when absent.
    #[serde(default)]
    pub tenant: Option<String>,
    pub nodes: u32,
    pub gpus_per_node: u32,
    #[serde(default)]
    pub gpu_model: Option<String>,
    pub time_limit_s: u64,
    #[serde(default)]
    pub priority: i32,
    #[serde(default = "default_true")]
    pub preemptible: bool,
    /// Empty for an allocation only (`shoal alloc`).
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<String>,
    #[serde(default)]
    pub ckpt_interval_s: Option<u64>,
    /// Restarts allowed (`--max-restarts N`). Absent: node loss restarts
    /// the job up to [`DEFAULT_MAX_RESTARTS`] times and a rank's own
    /// failure ends it. Present: up to N restarts, and with N > 0 a rank's
    /// own failure restarts it too. See [`JobSubmitRequest::restart_policy`].
    #[serde(default)]
    pub max_restarts: Option<u32>,
    /// A rank's own failure (non-zero exit, OOM kill) restarts the job too,
    /// up to `max_restarts` (or [`DEFAULT_MAX_RESTARTS`]) (`--requeue`).
    #[serde(default)]
    pub requeue: bool,
    /// `rack`, `zone` or `region`.
    #[serde(default)]
    pub same: Option<String>,
    #[serde(default)]
    pub max_rtt_ms: Option<u32>,
    /// Node labels every node of the gang must carry.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Memory of each rank in bytes (`--mem`).
    #[serde(default)]
    pub mem_bytes: Option<u64>,
    /// CPUs of each rank (`--cpus-per-task`).
    #[serde(default)]
    pub cpus_per_task: Option<u32>,
    /// Processes per node (`--ntasks-per-node`), sharing the node's GPUs
    /// equally; absent: one per node.
    #[serde(default)]
    pub tasks_per_node: Option<u32>,
    /// The command is a batch script: once per node, starting its tasks
    /// with `srun` (`sbatch`).
    #[serde(default)]
    pub batch: bool,
    /// Slurm's `--dependency` list: `afterok:12:13,afterany:14,singleton`
    /// (kinds after, afterany, afterok, afternotok; all must hold).
    #[serde(default)]
    pub dependency: Option<String>,
    /// Slurm's `--signal [B:]SIG[@SECS]`: SIG to the ranks SECS (60)
    /// before the time limit.
    #[serde(default)]
    pub signal: Option<String>,
    /// Slurm host list (`n[1-3],gpu7`) of the nodes the job runs on, all of
    /// them (`-w/--nodelist`); their count is the job's node count.
    #[serde(default)]
    pub nodelist: Option<String>,
    /// Host list of nodes the job never runs on (`-x/--exclude`).
    #[serde(default)]
    pub exclude: Option<String>,
    /// Whole nodes: none shared with another job (`--exclusive`).
    #[serde(default)]
    pub exclusive: bool,
    /// Submitted held, until `scontrol release` (`sbatch -H/--hold`).
    #[serde(default)]
    pub hold: bool,
    /// `--ckpt-replicas L[+R]`: each checkpoint part on L peers of the
    /// job's region besides the writer (1-3, default 3), and each committed
    /// step copied to R other regions (0-1, default 0).
    #[serde(default)]
    pub ckpt_replicas: Option<String>,
    /// `--near mesh://REGION/path`: the region holding the job's data,
    /// preferred by `--region auto` among the regions where the gang fits
    /// as soon (`None`: no preference beyond the submitter's region).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near: Option<String>,
}

impl JobSubmitRequest {
    /// A job running `/bin/sh -c SCRIPT` on `nodes` nodes with
    /// `gpus_per_node` GPUs each, in the default tenant, preemptible, with a
    /// 10-minute limit and no restarts; adjust the rest with struct update
    /// syntax.
    pub fn shell(nodes: u32, gpus_per_node: u32, script: &str) -> Self {
        JobSubmitRequest {
            name: String::new(),
            tenant: None,
            nodes,
            gpus_per_node,
            gpu_model: None,
            time_limit_s: 600,
            priority: 0,
            preemptible: true,
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            env: BTreeMap::new(),
            workdir: None,
            ckpt_interval_s: None,
            max_restarts: Some(0),
            requeue: false,
            same: None,
            max_rtt_ms: None,
            labels: BTreeMap::new(),
            mem_bytes: None,
            cpus_per_task: None,
            tasks_per_node: None,
            batch: false,
            dependency: None,
            signal: None,
            nodelist: None,
            exclude: None,
            exclusive: false,
            hold: false,
            ckpt_replicas: None,
            near: None,
        }
    }
}

/// Restarts a job gets when its request names no `max_restarts`: node loss
/// restarts it this many times; a rank's own failure does not.
pub const DEFAULT_MAX_RESTARTS: u32 = 3;

impl JobSubmitRequest {
    /// `(max_restarts, requeue)` of the job: how many restarts it may have,
    /// and whether a rank's own failure uses them (node loss always does).
    ///
    /// | request                       | restarts              | on rank failure |
    /// |-------------------------------|-----------------------|-----------------|
    /// | neither                       | DEFAULT_MAX_RESTARTS  | no              |
    /// | `requeue`                     | DEFAULT_MAX_RESTARTS  | yes             |
    /// | `max_restarts: N` (N > 0)     | N                     | yes             |
    /// | `max_restarts: 0`             | 0                     | (nothing left)  |
    pub fn restart_policy(&self) -> (u32, bool) {
        match self.max_restarts {
            None => (DEFAULT_MAX_RESTARTS, self.requeue),
            Some(n) => (n, self.requeue || n > 0),
        }
    }
}

fn default_true() -> bool {
    true
}

/// Answer to a submission.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct JobSubmitResponse {
    pub id: u64,
    /// The region that took the job, when a peer region forwarded it there
    /// (`--region R|auto`); null for a job of the region asked. Never
    /// skipped when null: answers also travel between nodes in bincode,
    /// which has no field names to tell a missing field.
    #[serde(default)]
    pub region: Option<String>,
}

/// A Slurm user name and the tenant (account) it stands for
/// (`sacctmgr list user`); also `POST /v1/users`, where a null tenant
/// removes the name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct UserInfo {
    pub name: String,
    pub tenant: Option<String>,
}

/// `POST /v1/jobs/{id}/signal`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct JobSignalRequest {
    /// A name (`USR1`, `SIGUSR1`) or number: HUP, INT, QUIT, USR1, USR2,
    /// ALRM, TERM or CONT.
    pub signal: String,
}

/// `POST /v1/jobs/{id}/time-limit`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct JobTimeLimitRequest {
    pub time_limit_s: u64,
}

/// `POST /v1/jobs/test-only` (`shoal submit --test-only`, `sbatch
/// --test-only`): where and when a job would start; nothing is submitted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct JobTestOnlyResponse {
    /// Seconds from now: 0 when it would start at the next scheduling
    /// pass; later when the running jobs run to their time limits and
    /// nothing else arrives; null when no such time is known (it is held,
    /// waits for its dependencies, or does not fit even then).
    pub start_in_s: Option<u64>,
    /// That time, RFC 3339 UTC.
    pub start_at: Option<String>,
    /// Its nodes then, in rank order (empty when not known).
    pub nodes: Vec<String>,
    /// The same, as a compressed host list.
    pub nodelist: String,
    /// Why it would not start now.
    pub reason: Option<String>,
}

/// Job states of INTERFACE.md. The final ones say how a job ended:
/// `completed` (every rank exited 0), `failed` (a rank's own non-zero exit,
/// with its `exit_code`), `cancelled`, `timeout` (stopped at its time limit),
/// `node_fail` (a node of the gang was lost and no restart was left) and
/// `out_of_memory` (the kernel's OOM killer ended a rank). `preempted` is the
/// stopping state of a preemption victim, which is then `requeued`.
///
/// A client reads a state a newer server added as [`JobState::Unknown`]
/// rather than failing on the whole answer; the ledger never holds it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Running,
    Checkpointing,
    Requeued,
    Completed,
    Failed,
    Cancelled,
    Preempted,
    Timeout,
    NodeFail,
    OutOfMemory,
    /// A state this build does not know (from a newer server). Last: the
    /// variant order is the ledger's encoding.
    #[serde(other)]
    Unknown,
}

impl JobState {
    /// Every state, in declaration order.
    pub const ALL: [JobState; 11] = [
        JobState::Pending,
        JobState::Running,
        JobState::Checkpointing,
        JobState::Requeued,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Preempted,
        JobState::Timeout,
        JobState::NodeFail,
        JobState::OutOfMemory,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Checkpointing => "checkpointing",
            JobState::Requeued => "requeued",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Preempted => "preempted",
            JobState::Timeout => "timeout",
            JobState::NodeFail => "node_fail",
            JobState::OutOfMemory => "out_of_memory",
            JobState::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|state| state.as_str() == s)
    }

    /// Waiting for the scheduler.
    pub fn is_waiting(self) -> bool {
        matches!(self, JobState::Pending | JobState::Requeued)
    }

    /// Never changes again.
    pub fn is_final(self) -> bool {
        match self {
            JobState::Completed
            | JobState::Failed
            | JobState::Cancelled
            | JobState::Timeout
            | JobState::NodeFail
            | JobState::OutOfMemory => true,
            JobState::Pending
            | JobState::Running
            | JobState::Checkpointing
            | JobState::Requeued
            | JobState::Preempted
            | JobState::Unknown => false,
        }
    }

    /// Final, and not because every rank succeeded or a user cancelled it.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            JobState::Failed | JobState::Timeout | JobState::NodeFail | JobState::OutOfMemory
        )
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// `JobState` as its name, whatever the format (a bincode enum would be
/// its index).
mod job_state_as_text {
    use super::JobState;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(state: &JobState, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(state.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<JobState, D::Error> {
        let name = String::deserialize(d)?;
        Ok(JobState::from(name.as_str()))
    }
}

impl From<&str> for JobState {
    /// The state named `s`, or [`JobState::Unknown`].
    fn from(s: &str) -> Self {
        JobState::parse(s).unwrap_or(JobState::Unknown)
    }
}

impl PartialEq<&str> for JobState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for JobState {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<String> for JobState {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<JobState> for &str {
    fn eq(&self, other: &JobState) -> bool {
        *self == other.as_str()
    }
}

/// `shoal show --json` (and each element of `shoal queue --json`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct JobInfo {
    pub id: u64,
    pub name: String,
    pub tenant: String,
    /// As text in every encoding: nodes pass `JobInfo` to each other in
    /// bincode, and a release before `JobState` sent a string there.
    #[serde(with = "job_state_as_text")]
    pub state: JobState,
    /// Why a pending job waits, or how a finished one ended.
    pub reason: String,
    /// Node names in rank order (the current or last allocation).
    pub nodes: Vec<String>,
    /// GPU indices per node name.
    pub gpus: BTreeMap<String, Vec<u32>>,
    /// The current or last allocation's fencing epoch.
    pub epoch: Option<u64>,
    pub restarts: u32,
    /// Restarts the job may have (node loss, and a rank's own failure when
    /// `requeue`).
    #[serde(default)]
    pub max_restarts: u32,
    /// A rank's own failure restarts the job (`--requeue`, or
    /// `--max-restarts N` with N > 0).
    #[serde(default)]
    pub requeue: bool,
    pub preemptions: u32,
    pub priority: i32,
    pub nodes_requested: u32,
    pub gpus_per_node: u32,
    pub time_limit_s: u64,
    pub preemptible: bool,
    pub command: Vec<String>,
    /// RFC 3339, UTC.
    pub submitted_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub exit_code: Option<i32>,
    pub last_ckpt_step: Option<u64>,
    /// Memory of each rank in bytes (`--mem`), when asked for.
    #[serde(default)]
    pub mem_bytes: Option<u64>,
    /// CPUs of each rank (`--cpus-per-task`), when asked for.
    #[serde(default)]
    pub cpus_per_task: Option<u32>,
    /// Processes on each node of the gang (`--ntasks-per-node`).
    #[serde(default = "one_task")]
    pub tasks_per_node: u32,
    /// Its `--dependency` list, as Slurm writes it.
    #[serde(default)]
    pub dependency: Option<String>,
    /// Held back from the scheduler (`scontrol hold`).
    #[serde(default)]
    pub held: bool,
    /// Its `--signal`, as `USR1@300`.
    #[serde(default)]
    pub signal: Option<String>,
    /// The nodes it must run on (`--nodelist`), as a compressed host list.
    #[serde(default)]
    pub nodelist: Option<String>,
    /// The nodes it must not run on (`--exclude`), as a compressed host list.
    #[serde(default)]
    pub exclude: Option<String>,
    /// It takes its nodes whole (`--exclusive`).
    #[serde(default)]
    pub exclusive: bool,
    /// The region the job lives in, set by the CLI for jobs of another
    /// region (`--region R`, `queue --all-regions`); its id prints as
    /// `REGION:ID`. Never skipped when null (see `JobSubmitResponse`).
    #[serde(default)]
    pub region: Option<String>,
}

fn one_task() -> u32 {
    1
}

/// `POST /v1/tenants` (create) and `POST /v1/tenants/{name}` (set).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TenantRequest {
    pub name: String,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default)]
    pub max_gpus: Option<u32>,
    #[serde(default)]
    pub gpu_hours: Option<f64>,
    #[serde(default)]
    pub weight: Option<u32>,
    /// Ledger limits of the tenant's own work (what a tenant token may
    /// cause); unset, each is the cluster default.
    #[serde(default)]
    pub max_pending_jobs: Option<u32>,
    #[serde(default)]
    pub max_objects: Option<u32>,
    /// The tenant's `mesh:/` manifests together, in bytes.
    #[serde(default)]
    pub max_manifest_bytes: Option<u64>,
    /// Highest `--priority` a tenant token may give the tenant's jobs.
    #[serde(default)]
    pub max_priority: Option<i32>,
    /// GPUs the tenant may hold in all federated regions together; set in
    /// the tenant's home region, which the other regions adopt it from.
    #[serde(default)]
    pub global_gpus: Option<u32>,
    /// GPU-hours the tenant may commit in all federated regions together
    /// (its budget across regions); set in its home region likewise.
    #[serde(default)]
    pub global_gpu_hours: Option<f64>,
    /// Limits to remove on set: `max_gpus`, `gpu_hours`, `parent`,
    /// `global_gpus`, `global_gpu_hours` (then unlimited, or a root), or `max_pending_jobs`,
    /// `max_objects`, `max_manifest_bytes`, `max_priority` (then the
    /// cluster default).
    #[serde(default)]
    pub unset: Vec<String>,
}

/// A tenant's own use of the ledger and the limits on it, in `shoal tenant
/// ls --json` and `shoal quota --json`. The limits are those in force: the
/// cluster default unless `overridden` names them. They bound what tenant
/// tokens may add; an admin's writes are not counted against them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct LedgerLimitsInfo {
    /// Jobs of the tenant itself (not its subtree) pending or requeued.
    pub pending_jobs: u64,
    pub max_pending_jobs: u64,
    /// `mesh:/` objects the tenant owns.
    pub objects: u64,
    pub max_objects: u64,
    /// Bytes of those objects' manifests together.
    pub manifest_bytes: u64,
    pub max_manifest_bytes: u64,
    pub max_priority: i32,
    /// Which of the `max_*` above an admin set for this tenant.
    #[serde(default)]
    pub overridden: Vec<String>,
}

/// `shoal tenant ls --json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TenantInfo {
    pub name: String,
    pub parent: Option<String>,
    pub max_gpus: Option<u32>,
    pub gpu_hours_limit: Option<f64>,
    pub weight: u32,
    pub created_at: String,
    /// Absent from (null for) servers that predate ledger limits. Never
    /// skipped when serializing: the RPC encodes these types with bincode.
    #[serde(default)]
    pub ledger_limits: Option<LedgerLimitsInfo>,
}

/// `shoal quota --json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct QuotaInfo {
    pub tenant: String,
    /// Held by the tenant's whole subtree.
    pub gpus_in_use: u32,
    pub max_gpus: Option<u32>,
    /// Consumed by the subtree, net of refunds, running jobs up to now.
    pub gpu_hours_used: f64,
    pub gpu_hours_limit: Option<f64>,
    /// Fraction of the cluster's healthy GPUs the subtree holds.
    pub share: f64,
    pub weight: u32,
    /// Credited back for work lost to preemption.
    pub gpu_hours_refunded: f64,
    /// Usage with the fair-share half-life applied.
    pub fair_usage_gpu_hours: f64,
    pub running_jobs: u32,
    pub pending_jobs: u32,
    /// The tenant's own ledger use and limits; absent from servers that
    /// predate them.
    #[serde(default)]
    pub ledger_limits: Option<LedgerLimitsInfo>,
}

/// `shoal ckpt ls --json`: one committed (or in-progress) checkpoint step.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CheckpointInfo {
    pub step: u64,
    pub bytes: u64,
    /// Nodes holding every part of the step.
    pub replicas: Vec<u64>,
    /// RFC 3339; `None` while some rank's part is missing.
    pub committed_at: Option<String>,
    pub epoch: u64,
    pub parts: Vec<CheckpointPartInfo>,
    /// Other regions holding a copy of the step (`--ckpt-replicas L+R`).
    #[serde(default)]
    pub regions: Vec<String>,
}

/// One rank's part: its manifest (hex of the binary encoding) and holders.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CheckpointPartInfo {
    pub rank: u32,
    pub bytes: u64,
    pub holders: Vec<u64>,
    pub manifest_hex: String,
}

/// `shoal events --json`: one entry of the cluster's event log.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EventInfo {
    pub id: u64,
    /// RFC 3339, UTC.
    pub at: String,
    pub at_ms: u64,
    /// `info`, `warning` or `critical`.
    pub severity: String,
    /// e.g. `gpu_ecc_dbe`, `gpu_xid`, `gpu_throttle`, `gpu_lost`, `node_down`.
    pub kind: String,
    /// Node name.
    pub node: Option<String>,
    pub gpu: Option<u32>,
    pub job: Option<u64>,
    pub message: String,
    /// What else the event is about, e.g. the job a refused request named.
    #[serde(default)]
    pub resource: Option<String>,
    /// Repeats of the event within a minute of it, counted here instead of
    /// being recorded again.
    #[serde(default)]
    pub repeats: u64,
}

/// `POST /v1/debug/gpu-fault`: make a simulated GPU of the answering node misbehave.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GpuFaultRequest {
    pub gpu: u32,
    /// `ecc-dbe`, `xid:CODE`, `hot`, `slow` or `clear`.
    pub fault: String,
}

/// `shoal stat --json` / `shoal ls --json`: one object of the `mesh:/` namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ObjectInfo {
    pub path: String,
    pub is_dir: bool,
    pub bytes: u64,
    pub files: u64,
    /// Node ids listed as holding every chunk: a holder that is down stays
    /// listed until it is removed from the cluster.
    pub replicas: Vec<u64>,
    /// Copies asked for.
    pub replica: u32,
    /// At least `replica` of the holders are alive.
    pub healthy: bool,
    pub tenant: String,
    pub mtime: String,
    pub manifest_hex: String,
}

/// `POST /v1/objects`: records an object whose chunks are already on `holders`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ObjectPut {
    pub path: String,
    pub is_dir: bool,
    pub manifest_hex: String,
    pub bytes: u64,
    pub files: u64,
    pub holders: Vec<u64>,
    pub replica: u32,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub replace: bool,
}

/// `POST /v1/objects/import`: records an object whose chunks the receiving
/// node holds (sent to it just before with `PUT /v1/chunks/{id}`), after it
/// has copied them to `replica - 1` more nodes of its region. How `shoal
/// cp` writes into another region: the chunks cross the WAN once, to one
/// node there, which replicates them inside its region.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ObjectImport {
    pub path: String,
    pub is_dir: bool,
    pub manifest_hex: String,
    pub bytes: u64,
    pub files: u64,
    pub replica: u32,
    #[serde(default)]
    pub replace: bool,
    /// Record fewer than `replica` copies when too few nodes take one.
    #[serde(default)]
    pub allow_degraded: bool,
}

impl ObjectImport {
    /// How long the receiving node may take beyond an ordinary request:
    /// it copies the whole object inside its region before it answers, at
    /// 8 MiB/s at worst.
    pub fn replication_allowance(&self) -> std::time::Duration {
        let copies = u64::from(self.replica.saturating_sub(1)).max(1);
        std::time::Duration::from_secs(self.bytes.saturating_mul(copies) / (8 << 20))
    }
}

/// The answer to [`ObjectImport`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ObjectImported {
    /// The ledger index the object was recorded at.
    pub index: u64,
    /// The nodes that hold every chunk, the receiving node first.
    pub holders: Vec<u64>,
}

#[cfg(test)]
mod job_state_tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Before {
        state: String,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct After {
        #[serde(with = "job_state_as_text")]
        state: JobState,
    }

    /// Nodes of two releases pass `JobInfo` to each other in bincode: the
    /// state is the same bytes as the `String` it was.
    #[test]
    fn a_job_state_travels_as_the_text_it_was() {
        for state in JobState::ALL {
            let before = bincode::serialize(&Before {
                state: state.to_string(),
            })
            .expect("encode");
            let after = bincode::serialize(&After { state }).expect("encode");
            assert_eq!(before, after);
            let read: After = bincode::deserialize(&before).expect("decode");
            assert_eq!(read.state, state);
        }
        let newer = bincode::serialize(&Before {
            state: "hibernating".into(),
        })
        .expect("encode");
        let read: After = bincode::deserialize(&newer).expect("decode");
        assert_eq!(read.state, JobState::Unknown);
        let json: After = serde_json::from_str(r#"{"state":"node_fail"}"#).expect("json");
        assert_eq!(json.state, JobState::NodeFail);
    }
}
