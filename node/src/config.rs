//! One validated `Config` per node, layered: built-in defaults, then a TOML
//! file, then `SHOAL_*` environment variables, then command-line flags.
//! Every key is documented in configs/node.example.toml.

use serde::{Deserialize, Serialize};
use shoal_consensus::sched::Policy;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Node name; defaults to the host name.
    pub name: Option<String>,
    /// Where the node keeps its identity, Raft log and chunks.
    pub data_dir: Option<PathBuf>,
    pub api_addr: SocketAddr,
    /// HTTPS for the API with this node's cluster certificate: `auto` (on
    /// unless the API listens on loopback only), `on`, or `off` (loopback
    /// addresses only: a token never crosses the network in clear).
    pub api_tls: ApiTls,
    pub rpc_addr: SocketAddr,
    pub gossip_addr: SocketAddr,
    /// Address peers should use to reach this node.
    pub advertise: Option<IpAddr>,
    /// Free-form labels; `region`, `zone` and `rack` are topology labels.
    pub labels: BTreeMap<String, String>,
    /// Simulated accelerators, e.g. `8xH100-80GB`; used instead of NVML.
    pub sim_gpus: Option<String>,
    /// Region name recorded at bootstrap.
    pub region: String,
    /// `text` or `json`.
    pub log_format: String,
    pub raft: RaftTuning,
    pub membership: MembershipTuning,
    pub scheduler: SchedulerTuning,
    pub executor: ExecutorTuning,
    pub storage: StorageTuning,
    pub anomaly: AnomalyTuning,
    pub metrics: MetricsTuning,
    pub dashboard: DashboardTuning,
    /// How a node whose data dir holds no identity yet starts without
    /// `--bootstrap`/`--join` (what `shoal install` writes); ignored from
    /// then on.
    pub first_start: FirstStart,
    pub agent: AgentTuning,
    pub federation: crate::federation::config::FederationTuning,
    /// Lifetime of a join token: the one printed at bootstrap, and
    /// `shoal token create` without `--ttl`.
    pub join_token_ttl_s: u64,
    /// Lifetime of the node certificates this node signs when it leads
    /// (joins and renewals); every node renews its own at two thirds of it.
    pub cert_lifetime_s: u64,
    /// Test only: extra round-trip time added to RTT samples towards the
    /// named peers (`name -> duration`), to emulate distance on one machine
    /// where the kernel has no netem. Set with `SHOAL_TEST_INJECT_RTT=n2=20,n3=40`.
    #[serde(skip)]
    pub test_inject_rtt: BTreeMap<String, std::time::Duration>,
    /// Test only: extra round-trip time added to every request towards
    /// the named peer regions (`region -> duration`), to emulate a WAN on
    /// one machine. Set with `SHOAL_TEST_INJECT_WAN=eu-1=50`.
    #[serde(skip)]
    pub test_inject_wan: BTreeMap<String, std::time::Duration>,
    /// Test only: the fault plan shared by the nodes of an in-process
    /// cluster ([`crate::faults`]). When set, the node's Raft and chunk
    /// transports and its forwarded ledger requests ask it for a verdict
    /// on every message they send, and its gossip loop ignores what the
    /// router says it may not hear. Not configurable from a file: only a
    /// harness in the same process can share a router.
    #[serde(skip)]
    pub test_faults: Option<crate::faults::FaultRouter>,
    /// Test only: what a chaos run hooks into this node (an observer of
    /// every applied entry, planted bugs). Like `test_faults`, only a
    /// harness in the same process can set it.
    #[serde(skip)]
    pub test_chaos: Option<crate::faults::chaos_hooks::ChaosHooks>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RaftTuning {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Take a snapshot after this many log entries.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot so that slightly lagging followers
    /// catch up from the log instead of a full snapshot.
    pub logs_kept_after_snapshot: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MembershipTuning {
    /// A voter that has been `down` this long is replaced by a healthy node.
    pub voter_replace_after_ms: u64,
    /// How long a forwarded write or read keeps retrying while there is no leader.
    pub request_timeout_ms: u64,
    /// How long a member stays `suspect` without a heartbeat before it is
    /// declared `down` (on a healthy observer; an overloaded one stretches
    /// it). Shorter finds dead nodes sooner; longer rides out pauses.
    pub suspicion_timeout_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerTuning {
    /// `fifo`, `hdrf` or `hdrf-preempt`; any other name fails when the
    /// configuration is read.
    #[serde(deserialize_with = "policy_by_name")]
    pub policy: Policy,
    /// Pause between scheduling passes on the leader.
    pub interval_ms: u64,
}

/// `scheduler.policy` by name; an unknown name fails the load with a message
/// that names the key, as `validate`'s checks do.
fn policy_by_name<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Policy, D::Error> {
    let name = String::deserialize(deserializer)?;
    name.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "scheduler.policy must be fifo, hdrf or hdrf-preempt, not '{name}'"
        ))
    })
}

impl Default for SchedulerTuning {
    fn default() -> Self {
        SchedulerTuning {
            policy: Policy::HdrfPreempt,
            interval_ms: 100,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StorageTuning {
    /// Re-hash every stored checkpoint chunk this often; corrupt ones are
    /// quarantined and fetched again from other holders.
    pub scrub_interval_s: u64,
    /// Most bytes of chunks this node stores (its own checkpoints and
    /// replicas for others); a full node refuses new chunks and writers
    /// choose another peer. 0 = no limit but the disk.
    pub capacity_bytes: u64,
    /// Delete chunks no checkpoint or `mesh:` object references any more,
    /// this often...
    pub gc_interval_s: u64,
    /// ...once they are older than this: chunks of uploads and checkpoint
    /// steps still being written are not referenced yet.
    pub gc_grace_s: u64,
}

impl Default for StorageTuning {
    fn default() -> Self {
        StorageTuning {
            scrub_interval_s: 3600,
            capacity_bytes: 0,
            gc_interval_s: 600,
            gc_grace_s: 3600,
        }
    }
}

/// What `/metrics`, which needs no token, may tell.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsTuning {
    /// Export series labelled with tenant names (per-tenant GPUs and
    /// budgets, pending jobs by tenant). Off: anyone who can reach the port
    /// would learn who uses the pool.
    pub tenant_labels: bool,
}

/// The live stream and the GPU telemetry relay behind the web dashboard
/// and `shoal top`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DashboardTuning {
    /// How often each `/v1/stream` feed looks for changes (ms).
    pub stream_tick_ms: u64,
    /// How long this node waits for another member's GPU samples before
    /// showing that member's GPUs as "no data" (ms).
    pub relay_timeout_ms: u64,
    /// How old the relayed GPU samples may get before they are asked for
    /// again (ms): however many pages are open, each member is asked at
    /// most once per this period.
    pub relay_max_age_ms: u64,
}

impl Default for DashboardTuning {
    fn default() -> Self {
        DashboardTuning {
            stream_tick_ms: 500,
            relay_timeout_ms: 1000,
            relay_max_age_ms: 2000,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AnomalyTuning {
    /// A rank whose GPUs stay below `straggler_below_pct` % of the median
    /// utilization of its gang siblings for this long is reported as a
    /// straggler (one event per episode).
    pub straggler_window_ms: u64,
    pub straggler_below_pct: u32,
    /// Below this median sibling utilization (%) the gang is not computing
    /// hard enough for a comparison to mean anything (start-up, I/O phases).
    pub straggler_min_sibling_util_pct: u32,
    /// A rank with no new output and no new checkpoint for this long is
    /// reported as stalled; 0 turns the check off.
    pub stall_after_s: u64,
    /// Every new event is POSTed as JSON (the `shoal events --json` object)
    /// to this http(s) URL by the leader.
    pub webhook_url: Option<String>,
}

impl Default for AnomalyTuning {
    fn default() -> Self {
        AnomalyTuning {
            straggler_window_ms: 10_000,
            straggler_below_pct: 50,
            straggler_min_sibling_util_pct: 50,
            stall_after_s: 600,
            webhook_url: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutorTuning {
    /// Run the ranks placed on this node. `false` only for nodes whose GPUs
    /// are managed by something else (and for the placement benchmark):
    /// jobs placed there hold their GPUs until cancelled.
    pub enabled: bool,
    /// Between SIGTERM and SIGKILL when a job is stopped.
    pub stop_grace_s: u64,
    /// Where job logs and checkpoint directories live, outside the data dir
    /// (which holds keys and tokens); default `<data-dir>-jobs`.
    pub jobs_dir: Option<PathBuf>,
    /// The Unix user ranks run as: a user name, or `agent` for the agent's
    /// own user (single-user machines). Default: `shoal-job` (created when
    /// missing) for an agent running as root, else the agent's own user.
    pub run_as: Option<String>,
    /// Per-tenant users, overriding `run_as` (`vision = "vision"`).
    pub users: BTreeMap<String, String>,
    /// Let a rank run as root (uid 0). Off: such a launch is refused.
    pub allow_root: bool,
    /// A cgroup v2 per rank (`auto`: where the agent can create them), or
    /// none (`off`): see docs/security.md.
    pub cgroups: CgroupMode,
    /// A running rank's log is rotated (to `rank-R.log.1`, replacing the
    /// previous one) once it grows past this; 0: never.
    pub log_max_bytes: u64,
    /// A finished job's files on this node (logs, its local checkpoint
    /// copies) are removed this long after it ended.
    pub job_retention_s: u64,
    /// The `shoal` binary that starts a rank's tasks when a job runs
    /// several per node (`shoal exec-tasks`); default: this agent's binary.
    pub task_launcher: Option<PathBuf>,
}

/// `[agent]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct AgentTuning {
    /// What SIGTERM does with this node's ranks.
    pub shutdown: ShutdownMode,
}

/// `agent.shutdown`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ShutdownMode {
    /// The ranks stop with the agent; their gangs restart when it is back
    /// (or elsewhere, once the node is down): a quick restart.
    #[default]
    Keep,
    /// The node drains itself first: its gangs checkpoint (SIGTERM), stop
    /// and are placed elsewhere; it undrains itself when it starts again.
    Drain,
}

/// `[first_start]`: bootstrap a cluster, or join one with a token kept in
/// a file (0600, spent by its first use).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct FirstStart {
    pub bootstrap: bool,
    /// RPC address of a member to join.
    pub join: Option<SocketAddr>,
    pub join_token_file: Option<PathBuf>,
}

/// `api_tls`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ApiTls {
    #[default]
    Auto,
    On,
    Off,
}

impl Config {
    /// Whether the API is served over TLS.
    pub fn api_uses_tls(&self) -> bool {
        match self.api_tls {
            ApiTls::On => true,
            ApiTls::Off => false,
            ApiTls::Auto => !self.api_addr.ip().is_loopback(),
        }
    }
}

/// `executor.cgroups`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    /// Per-rank cgroups where the agent can create them; none elsewhere,
    /// said once in the log.
    #[default]
    Auto,
    /// No cgroups: ranks are fenced by their process group only.
    Off,
}

impl Default for ExecutorTuning {
    fn default() -> Self {
        ExecutorTuning {
            enabled: true,
            stop_grace_s: 30,
            jobs_dir: None,
            run_as: None,
            users: BTreeMap::new(),
            allow_root: false,
            cgroups: CgroupMode::Auto,
            log_max_bytes: 256 << 20,
            job_retention_s: 7 * 24 * 3600,
            task_launcher: None,
        }
    }
}

impl Default for RaftTuning {
    fn default() -> Self {
        // openraft waits `leader lease (= max) + election timeout` after the
        // last heartbeat of a committed leader before it campaigns, so these
        // values give 1.4-1.8 s from a leader's death to an election: well
        // inside the 3 s target, yet far above the scheduling hiccups of a
        // loaded machine (heartbeats every 150 ms).
        RaftTuning {
            heartbeat_ms: 150,
            election_timeout_min_ms: 500,
            election_timeout_max_ms: 900,
            snapshot_every: 5000,
            logs_kept_after_snapshot: 1000,
        }
    }
}

impl Default for MembershipTuning {
    fn default() -> Self {
        MembershipTuning {
            voter_replace_after_ms: 30_000,
            request_timeout_ms: 8_000,
            suspicion_timeout_ms: 1_500,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: None,
            data_dir: None,
            api_addr: SocketAddr::from(([0, 0, 0, 0], 7070)),
            api_tls: ApiTls::Auto,
            rpc_addr: SocketAddr::from(([0, 0, 0, 0], 7071)),
            gossip_addr: SocketAddr::from(([0, 0, 0, 0], 7072)),
            advertise: None,
            labels: BTreeMap::new(),
            sim_gpus: None,
            region: "default".into(),
            log_format: "text".into(),
            raft: RaftTuning::default(),
            membership: MembershipTuning::default(),
            scheduler: SchedulerTuning::default(),
            executor: ExecutorTuning::default(),
            storage: StorageTuning::default(),
            anomaly: AnomalyTuning::default(),
            metrics: MetricsTuning::default(),
            dashboard: DashboardTuning::default(),
            first_start: FirstStart::default(),
            agent: AgentTuning::default(),
            federation: Default::default(),
            join_token_ttl_s: 3600,
            cert_lifetime_s: shoal_mesh::tls::DEFAULT_NODE_CERT_LIFETIME.as_secs(),
            test_inject_rtt: BTreeMap::new(),
            test_inject_wan: BTreeMap::new(),
            test_faults: None,
            test_chaos: None,
        }
    }
}

/// Environment variables that map to config keys. Nested keys use `__`
/// (`SHOAL_RAFT__HEARTBEAT_MS`). Variables the CLI uses (`SHOAL_API`,
/// `SHOAL_TOKEN`, `SHOAL_CONFIG`) are not config keys.
const ENV_KEYS: &[&str] = &[
    "name",
    "data_dir",
    "api_addr",
    "api_tls",
    "rpc_addr",
    "gossip_addr",
    "advertise",
    "sim_gpus",
    "region",
    "log_format",
    "join_token_ttl_s",
    "cert_lifetime_s",
    "raft.heartbeat_ms",
    "raft.election_timeout_min_ms",
    "raft.election_timeout_max_ms",
    "raft.snapshot_every",
    "raft.logs_kept_after_snapshot",
    "membership.voter_replace_after_ms",
    "membership.request_timeout_ms",
    "membership.suspicion_timeout_ms",
    "scheduler.policy",
    "scheduler.interval_ms",
    "executor.enabled",
    "executor.stop_grace_s",
    "executor.jobs_dir",
    "executor.run_as",
    "executor.allow_root",
    "executor.cgroups",
    "executor.log_max_bytes",
    "executor.job_retention_s",
    "executor.task_launcher",
    "storage.scrub_interval_s",
    "storage.capacity_bytes",
    "storage.gc_interval_s",
    "storage.gc_grace_s",
    "anomaly.straggler_window_ms",
    "anomaly.straggler_below_pct",
    "anomaly.straggler_min_sibling_util_pct",
    "anomaly.stall_after_s",
    "anomaly.webhook_url",
    "metrics.tenant_labels",
    "dashboard.stream_tick_ms",
    "dashboard.relay_timeout_ms",
    "dashboard.relay_max_age_ms",
    "agent.shutdown",
    "federation.summary_interval_ms",
    "federation.request_timeout_ms",
    "federation.unreachable_after_ms",
    "federation.region_lease_ms",
    "federation.region_failover_after_ms",
    "first_start.bootstrap",
    "first_start.join",
    "first_start.join_token_file",
];

/// The longest suspicion timeout a node accepts: stretched by the failure
/// detector's local health (up to `1 + max_local_health` times on an
/// overloaded observer), plus the time to suspect, it stays within the
/// ledger's stop deadline, during which a gang whose surviving rank failed
/// first waits for the verdict on its silent node
/// (`shoal_consensus::workload::blame`).
pub fn max_suspicion_timeout_ms() -> u64 {
    let stretch = 1 + u64::from(
        shoal_mesh::failure_detector::FailureDetectorConfig::default().max_local_health,
    );
    // A tenth of the deadline covers the phi climb to `suspect`.
    shoal_consensus::workload::STOP_DEADLINE_MS * 9 / 10 / stretch
}

/// The default data dir: `/var/lib/shoal` for root, else `$XDG_DATA_HOME/shoal`.
pub fn default_data_dir() -> PathBuf {
    let is_root = std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || std::env::var("HOME").map(|h| h == "/root").unwrap_or(false);
    if is_root {
        return PathBuf::from("/var/lib/shoal");
    }
    if let Ok(x) = std::env::var("XDG_DATA_HOME") {
        if !x.is_empty() {
            return PathBuf::from(x).join("shoal");
        }
    }
    match std::env::var("HOME") {
        Ok(h) => PathBuf::from(h).join(".local/share/shoal"),
        Err(_) => PathBuf::from("./shoal-data"),
    }
}

fn env_value(raw: &str) -> toml::Value {
    if let Ok(i) = raw.parse::<i64>() {
        return toml::Value::Integer(i);
    }
    match raw {
        "true" => toml::Value::Boolean(true),
        "false" => toml::Value::Boolean(false),
        _ => toml::Value::String(raw.to_string()),
    }
}

impl Config {
    /// Defaults, then `file` (if any), then `SHOAL_*` variables from `env`.
    pub fn load(file: Option<&Path>, env: &BTreeMap<String, String>) -> Result<Config, String> {
        let mut table = toml::Table::try_from(Config::default()).map_err(|e| e.to_string())?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
            let file_table: toml::Table = text
                .parse()
                .map_err(|e| format!("config file {} is not valid TOML: {e}", path.display()))?;
            merge(&mut table, file_table);
        }
        // A variable is read as the type its key has by default (so
        // `SHOAL_REGION=42` is the string "42"); a key whose default is
        // unset (an optional one) is read by its look, and as a string if
        // the configuration then does not take it.
        let mut by_look = Vec::new();
        for key in ENV_KEYS {
            let var = format!("SHOAL_{}", key.replace('.', "__").to_ascii_uppercase());
            if let Some(raw) = env.get(&var) {
                let (t, leaf) = leaf_table(&mut table, key)?;
                let value = match t.get(leaf) {
                    Some(toml::Value::String(_)) => toml::Value::String(raw.clone()),
                    Some(_) => env_value(raw),
                    None => {
                        by_look.push((*key, raw.clone()));
                        env_value(raw)
                    }
                };
                t.insert(leaf.to_string(), value);
            }
        }
        if let Some(labels) = env.get("SHOAL_LABELS") {
            let mut map = toml::Table::new();
            for kv in labels.split(',').filter(|s| !s.is_empty()) {
                let (k, v) = parse_label(kv)?;
                map.insert(k, toml::Value::String(v));
            }
            table.insert("labels".into(), toml::Value::Table(map));
        }
        let mut cfg: Config = match table.clone().try_into() {
            Ok(cfg) => cfg,
            Err(first) if !by_look.is_empty() => {
                let first: toml::de::Error = first;
                for (key, raw) in &by_look {
                    let (t, leaf) = leaf_table(&mut table, key)?;
                    t.insert(leaf.to_string(), toml::Value::String(raw.clone()));
                }
                table.try_into().map_err(|_: toml::de::Error| {
                    format!("invalid configuration: {}", first.message())
                })?
            }
            Err(e) => return Err(format!("invalid configuration: {}", e.message())),
        };
        if let Some(range) = env
            .get(shoal_mesh::protocol::TEST_ENV)
            .filter(|s| !s.trim().is_empty())
        {
            // Read by the mesh itself; checked here so that a bad value
            // stops the node instead of being ignored.
            shoal_mesh::protocol::parse_range(range)
                .map_err(|e| format!("{}: {e}", shoal_mesh::protocol::TEST_ENV))?;
        }
        if let Some(spec) = env.get("SHOAL_TEST_INJECT_RTT") {
            cfg.test_inject_rtt = crate::peers::parse_injected_rtt(spec)?;
        }
        if let Some(spec) = env.get("SHOAL_TEST_INJECT_WAN") {
            cfg.test_inject_wan = crate::peers::parse_injected_rtt(spec)
                .map_err(|e| format!("SHOAL_TEST_INJECT_WAN: {e}"))?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), String> {
        shoal_consensus::federation::validate_region_name(&self.region)
            .map_err(|e| format!("region: {e}"))?;
        self.federation.validate()?;
        if self.raft.election_timeout_min_ms <= self.raft.heartbeat_ms * 2 {
            return Err(format!(
                "raft.election_timeout_min_ms ({}) must exceed twice raft.heartbeat_ms ({})",
                self.raft.election_timeout_min_ms, self.raft.heartbeat_ms
            ));
        }
        if self.raft.election_timeout_max_ms <= self.raft.election_timeout_min_ms {
            return Err(
                "raft.election_timeout_max_ms must exceed raft.election_timeout_min_ms".into(),
            );
        }
        if !matches!(self.log_format.as_str(), "text" | "json") {
            return Err(format!(
                "log_format must be 'text' or 'json', not '{}'",
                self.log_format
            ));
        }
        if self.api_tls == ApiTls::Off && !self.api_addr.ip().is_loopback() {
            return Err(format!(
                "api_tls = \"off\" is allowed only on a loopback api_addr, not {}: bearer tokens would cross the network in clear",
                self.api_addr
            ));
        }
        let first = &self.first_start;
        if first.bootstrap && first.join.is_some() {
            return Err("first_start: bootstrap and join exclude each other".into());
        }
        if first.join.is_some() != first.join_token_file.is_some() {
            return Err("first_start: join and join_token_file go together".into());
        }
        if let Some(n) = &self.name {
            shoal_consensus::ledger::validate_name(n)?;
        }
        if self.scheduler.interval_ms == 0 {
            return Err("scheduler.interval_ms must be positive".into());
        }
        let longest = max_suspicion_timeout_ms();
        if !(200..=longest).contains(&self.membership.suspicion_timeout_ms) {
            return Err(format!(
                "membership.suspicion_timeout_ms must be between 200 and {longest}, not {}: \
                 a dead node must be declared down, even by an overloaded leader, before \
                 the ledger stops waiting to attribute a gang's failure ({} s)",
                self.membership.suspicion_timeout_ms,
                shoal_consensus::workload::STOP_DEADLINE_MS / 1000
            ));
        }
        let d = &self.dashboard;
        if !(10..=60_000).contains(&d.stream_tick_ms) {
            return Err(format!(
                "dashboard.stream_tick_ms must be between 10 and 60000, not {}",
                d.stream_tick_ms
            ));
        }
        if d.relay_timeout_ms == 0 || d.relay_max_age_ms == 0 {
            return Err("dashboard.relay_timeout_ms and relay_max_age_ms must be positive".into());
        }
        if !(10..=366 * 24 * 3600).contains(&self.cert_lifetime_s) {
            return Err(format!(
                "cert_lifetime_s must be between 10 s and a year, not {}",
                self.cert_lifetime_s
            ));
        }
        if !(1..=100).contains(&self.anomaly.straggler_below_pct) {
            return Err(format!(
                "anomaly.straggler_below_pct must be 1-100, not {}",
                self.anomaly.straggler_below_pct
            ));
        }
        if self.anomaly.straggler_min_sibling_util_pct > 100 {
            return Err("anomaly.straggler_min_sibling_util_pct must be 0-100".into());
        }
        if let Some(url) = &self.anomaly.webhook_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "anomaly.webhook_url must be an http:// or https:// URL, not '{url}'"
                ));
            }
        }
        Ok(())
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }

    pub fn jobs_dir(&self) -> PathBuf {
        self.executor.jobs_dir.clone().unwrap_or_else(|| {
            let data = self.data_dir();
            let mut name = data.file_name().unwrap_or_default().to_os_string();
            name.push("-jobs");
            data.with_file_name(name)
        })
    }

    pub fn node_name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        let host = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "node".into());
        host.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .take(63)
            .collect()
    }
}

/// The table holding the dotted `key`'s leaf, made on the way, and the
/// leaf's name.
fn leaf_table<'a, 'k>(
    table: &'a mut toml::Table,
    key: &'k str,
) -> Result<(&'a mut toml::Table, &'k str), String> {
    let (path, leaf) = key.rsplit_once('.').unwrap_or(("", key));
    let mut t = table;
    for p in path.split('.').filter(|p| !p.is_empty()) {
        t = match t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(Default::default()))
        {
            toml::Value::Table(inner) => inner,
            _ => return Err(format!("config key {p} is not a table")),
        };
    }
    Ok((t, leaf))
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// `KEY=VALUE` as given to `--label`.
pub fn parse_label(kv: &str) -> Result<(String, String), String> {
    match kv.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("invalid label '{kv}': expected KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    /// Every scalar key of the configuration can be set from the
    /// environment: a key missing from `ENV_KEYS` is silently ignored
    /// when set that way, which is how a test's tuning can go unseen.
    #[test]
    fn every_scalar_config_key_has_an_environment_variable() {
        fn leaves(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    toml::Value::Table(t) => leaves(&key, t, out),
                    toml::Value::Array(_) => {}
                    _ => out.push(key),
                }
            }
        }
        let table = toml::Table::try_from(super::Config::default()).expect("config as TOML");
        let mut keys = Vec::new();
        leaves("", &table, &mut keys);
        let missing: Vec<&String> = keys
            .iter()
            .filter(|k| !super::ENV_KEYS.contains(&k.as_str()))
            .collect();
        assert!(missing.is_empty(), "no SHOAL_* variable for {missing:?}");
    }

    use super::*;

    #[test]
    fn a_variable_is_read_as_the_type_of_its_key() {
        let load = |pairs: &[(&str, &str)]| {
            let env = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>();
            Config::load(None, &env)
        };
        let cfg = load(&[
            ("SHOAL_NAME", "42"),
            ("SHOAL_REGION", "7"),
            ("SHOAL_EXECUTOR__RUN_AS", "1000"),
            ("SHOAL_STORAGE__CAPACITY_BYTES", "4096"),
            ("SHOAL_EXECUTOR__ENABLED", "false"),
        ])
        .expect("valid");
        assert_eq!(cfg.name.as_deref(), Some("42"));
        assert_eq!(cfg.region, "7");
        assert_eq!(cfg.executor.run_as.as_deref(), Some("1000"));
        assert_eq!(cfg.storage.capacity_bytes, 4096);
        assert!(!cfg.executor.enabled);
        let err = load(&[("SHOAL_STORAGE__CAPACITY_BYTES", "lots")]).expect_err("not a number");
        assert!(err.contains("invalid configuration"), "{err}");
    }

    #[test]
    fn the_suspicion_timeout_is_bounded_by_the_ledgers_wait_for_a_gangs_verdict() {
        let default = Config::default().membership.suspicion_timeout_ms;
        assert!(default <= max_suspicion_timeout_ms());
        let env = |ms: u64| {
            BTreeMap::from([(
                "SHOAL_MEMBERSHIP__SUSPICION_TIMEOUT_MS".to_string(),
                ms.to_string(),
            )])
        };
        let cfg = Config::load(None, &env(6_000)).expect("6 s is allowed");
        assert_eq!(cfg.membership.suspicion_timeout_ms, 6_000);
        let err = Config::load(None, &env(max_suspicion_timeout_ms() + 1)).expect_err("too long");
        assert!(err.contains("membership.suspicion_timeout_ms"), "{err}");
    }

    proptest::proptest! {
        /// Any value in any `SHOAL_*` variable is taken or refused with a
        /// message; loading never panics.
        #[test]
        fn hostile_environment_values_never_panic(
            picks in proptest::collection::vec((0usize..ENV_KEYS.len(), ".{0,40}"), 1..8)
        ) {
            let env: BTreeMap<String, String> = picks
                .into_iter()
                .map(|(i, v)| (format!("SHOAL_{}", ENV_KEYS[i].replace('.', "__").to_ascii_uppercase()), v))
                .collect();
            if let Err(e) = Config::load(None, &env) {
                proptest::prop_assert!(!e.is_empty());
            }
        }

        /// Any text as the config file.
        #[test]
        fn hostile_config_files_never_panic(text in ".{0,400}") {
            let dir = tempfile::tempdir().expect("dir");
            let path = dir.path().join("node.toml");
            std::fs::write(&path, &text).expect("write");
            let _ = Config::load(Some(&path), &BTreeMap::new());
        }
    }

    #[test]
    fn layers_apply_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("node.toml");
        std::fs::write(
            &file,
            "name = \"from-file\"\nregion = \"eu\"\n[raft]\nheartbeat_ms = 100\n[labels]\nzone = \"a\"\n",
        )
        .expect("write");
        let env = BTreeMap::from([
            ("SHOAL_REGION".to_string(), "us".to_string()),
            (
                "SHOAL_RAFT__ELECTION_TIMEOUT_MIN_MS".to_string(),
                "700".to_string(),
            ),
            ("SHOAL_API".to_string(), "ignored".to_string()),
        ]);
        let c = Config::load(Some(&file), &env).expect("valid");
        assert_eq!(c.name.as_deref(), Some("from-file"));
        assert_eq!(c.region, "us");
        assert_eq!(c.raft.heartbeat_ms, 100);
        assert_eq!(c.raft.election_timeout_min_ms, 700);
        assert_eq!(c.labels.get("zone").map(String::as_str), Some("a"));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_clear_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "nmae = \"typo\"\n").expect("write");
        let err = Config::load(Some(&file), &BTreeMap::new()).expect_err("typo");
        assert!(err.contains("nmae"), "{err}");
        let env = BTreeMap::from([("SHOAL_RAFT__HEARTBEAT_MS".to_string(), "900".to_string())]);
        let err = Config::load(None, &env).expect_err("bad timing");
        assert!(err.contains("heartbeat"), "{err}");
    }

    #[test]
    fn the_scheduler_policy_is_checked_when_read() {
        let var =
            |v: &str| BTreeMap::from([("SHOAL_SCHEDULER__POLICY".to_string(), v.to_string())]);
        let c = Config::load(None, &var("fifo")).expect("valid");
        assert_eq!(c.scheduler.policy, Policy::Fifo);
        let err = Config::load(None, &var("lifo")).expect_err("unknown policy");
        assert_eq!(
            err,
            "invalid configuration: scheduler.policy must be fifo, hdrf or hdrf-preempt, not 'lifo'"
        );
    }

    #[test]
    fn the_api_is_https_off_loopback_and_never_clear_text_across_the_network() {
        let load = |vars: &[(&str, &str)]| {
            let vars = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Config::load(None, &vars)
        };
        assert!(load(&[]).expect("defaults").api_uses_tls());
        let local = load(&[("SHOAL_API_ADDR", "127.0.0.1:7070")]).expect("valid");
        assert!(!local.api_uses_tls());
        let forced = load(&[("SHOAL_API_TLS", "on")]).expect("valid");
        assert!(forced.api_uses_tls());
        let err = load(&[
            ("SHOAL_API_ADDR", "10.0.0.1:7070"),
            ("SHOAL_API_TLS", "off"),
        ])
        .expect_err("clear text off loopback");
        assert!(err.contains("api_tls"), "{err}");
    }

    #[test]
    fn cgroups_are_auto_unless_turned_off() {
        assert_eq!(
            Config::load(None, &BTreeMap::new())
                .expect("valid")
                .executor
                .cgroups,
            CgroupMode::Auto
        );
        let var =
            |v: &str| BTreeMap::from([("SHOAL_EXECUTOR__CGROUPS".to_string(), v.to_string())]);
        let c = Config::load(None, &var("off")).expect("valid");
        assert_eq!(c.executor.cgroups, CgroupMode::Off);
        let err = Config::load(None, &var("maybe")).expect_err("unknown mode");
        assert!(err.contains("maybe") || err.contains("cgroups"), "{err}");
    }

    #[test]
    fn the_example_config_documents_every_key() {
        let text = include_str!("../../configs/node.example.toml");
        let table: toml::Table = text.parse().expect("example parses");
        let _: Config = table.clone().try_into().expect("example is a valid config");
        let defaults = toml::Table::try_from(Config::default()).expect("serialize");
        for (k, v) in &defaults {
            assert!(
                text.contains(&format!("{k} =")) || text.contains(&format!("[{k}]")),
                "{k} undocumented"
            );
            if let toml::Value::Table(inner) = v {
                for ik in inner.keys() {
                    assert!(text.contains(&format!("{ik} =")), "{k}.{ik} undocumented");
                }
            }
        }
        for k in ["name", "data_dir", "advertise", "sim_gpus"] {
            assert!(text.contains(&format!("{k} =")), "{k} undocumented");
        }
    }
}
