//! Job and tenant commands: submit, alloc, queue, show, cancel, logs,
//! tenant, quota (INTERFACE.md "Jobs" and "Tenants and quotas").

use super::print_json;
use crate::cli::duration::parse_duration;
use clap::{Args, Subcommand};
use shoal_sdk::JobState;
use shoal_sdk::{Client, JobInfo, JobSubmitRequest, QuotaInfo, TenantInfo, TenantRequest};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Default time limit when `-t` is absent (Slurm sites usually set one per partition).
pub const DEFAULT_TIME_LIMIT: &str = "1h";

/// Raised to make the process exit with a specific code and no message
/// (`shoal alloc` exits with its command's status).
#[derive(Debug, thiserror::Error)]
#[error("exit {0}")]
pub struct ExitWith(pub i32);

#[derive(Args, Debug, Clone)]
pub struct JobArgs {
    /// Nodes in the gang [default: 1, or as many as --nodelist names]
    #[arg(short = 'N', long = "nodes")]
    pub nodes: Option<u32>,
    /// Run on exactly these nodes, a Slurm host list: n[1-3],gpu7
    #[arg(short = 'w', long, value_name = "HOSTLIST")]
    pub nodelist: Option<String>,
    /// Never run on these nodes, a Slurm host list
    #[arg(short = 'x', long, value_name = "HOSTLIST")]
    pub exclude: Option<String>,
    /// Take the nodes whole: only nodes with no GPU in use, and no other
    /// job on them while this one runs
    #[arg(long)]
    pub exclusive: bool,
    /// Submit held: the job waits until `scontrol release ID`
    #[arg(short = 'H', long)]
    pub hold: bool,
    /// Print where and when the job would start; submit nothing
    #[arg(long)]
    pub test_only: bool,
    /// GPUs on every node of the gang [default: one per task]
    #[arg(long, conflicts_with_all = ["gres", "gpus_per_task", "gpus"])]
    pub gpus_per_node: Option<u32>,
    /// gpu[:TYPE]:COUNT (also accelerator[:TYPE]:COUNT), per node
    #[arg(long, conflicts_with_all = ["gpus_per_task", "gpus"])]
    pub gres: Option<String>,
    /// [TYPE:]COUNT GPUs for each task
    #[arg(long, value_name = "[TYPE:]N", conflicts_with = "gpus")]
    pub gpus_per_task: Option<String>,
    /// [TYPE:]COUNT GPUs for the whole job, spread evenly over its nodes
    #[arg(short = 'G', long, value_name = "[TYPE:]N")]
    pub gpus: Option<String>,
    /// Processes on each node, each with its share of the node's GPUs and
    /// torchrun's environment for its own rank [default: 1]
    #[arg(long, value_name = "N")]
    pub ntasks_per_node: Option<u32>,
    /// Processes in all, spread evenly over the nodes
    #[arg(short = 'n', long, value_name = "N")]
    pub ntasks: Option<u32>,
    /// Start only after other jobs: afterok:ID[:ID...], afterany:ID,
    /// afternotok:ID, after:ID (started), singleton; comma-separated, all
    /// must hold
    #[arg(short = 'd', long, value_name = "LIST")]
    pub dependency: Option<String>,
    /// Send SIG to the ranks SECS (default 60) before the time limit:
    /// [B:]SIG[@SECS], e.g. USR1@300
    #[arg(long, value_name = "SIG@SECS")]
    pub signal: Option<String>,
    /// Time limit: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], 90s, 30m, 2h
    #[arg(short = 't', long = "time", default_value = DEFAULT_TIME_LIMIT)]
    pub time: String,
    /// Tenant (account) to charge [default: default]
    #[arg(long, short = 'A')]
    pub tenant: Option<String>,
    #[arg(long, short = 'J')]
    pub name: Option<String>,
    /// Higher runs first within the tenant, and may preempt lower priorities
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Never preempt this job
    #[arg(long)]
    pub no_preempt: bool,
    /// Send SIGUSR1 (a request to checkpoint) this often
    #[arg(long)]
    pub ckpt_interval: Option<String>,
    /// Checkpoint copies: each part on L peers of the job's region besides
    /// the writer (1-3, default 3), each committed step also in R other
    /// regions (0-1), so the job can resume there if its region is lost
    #[arg(long, value_name = "L[+R]")]
    pub ckpt_replicas: Option<String>,
    /// With `--region auto`: prefer the region holding this data
    /// (`mesh://REGION/path`; `mesh:/path` is this region's) among the
    /// regions where the gang fits as soon
    #[arg(long, value_name = "mesh://REGION/PATH")]
    pub near: Option<String>,
    /// Restarts allowed. Without this flag node loss restarts the job up
    /// to 3 times and a rank's own non-zero exit ends it `failed`; with
    /// N > 0 a rank's own failure restarts it too (N restarts in all)
    #[arg(long, value_name = "N")]
    pub max_restarts: Option<u32>,
    /// Restart the job when a rank fails on its own (non-zero exit, OOM
    /// kill), up to --max-restarts (default 3) restarts in all
    #[arg(long)]
    pub requeue: bool,
    /// Every node in the same rack, zone or region
    #[arg(long)]
    pub same: Option<String>,
    /// Largest round-trip time allowed between any two nodes of the gang
    #[arg(long)]
    pub max_rtt_ms: Option<u32>,
    /// KEY=VALUE every node must carry
    #[arg(long = "constraint")]
    pub constraints: Vec<String>,
    /// Extra environment for the job, KEY=VALUE
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// Working directory of the ranks [default: the current directory]
    #[arg(long)]
    pub chdir: Option<String>,
    /// Memory of each rank, like Slurm: a bare number is MiB, or 512K,
    /// 512M, 16G, 1T, 1048576B; enforced where the node has the cgroup
    /// memory controller
    #[arg(long)]
    pub mem: Option<String>,
    /// CPUs of each rank; enforced as a CPU quota where the node has the
    /// cgroup cpu controller
    #[arg(long, short = 'c')]
    pub cpus_per_task: Option<u32>,
    /// The command is a batch script: it runs once per node and starts the
    /// node's tasks itself with `srun` (sbatch's semantics)
    #[arg(long, hide = true)]
    pub batch: bool,
    /// A job array (sbatch --array): 0-15, 1,3,5, 0-15:2, with %N for at
    /// most N at once
    #[arg(long, hide = true)]
    pub array: Option<String>,
    /// The command (after --)
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `(model, count)` from `gpu:8`, `gpu:H100:8`, `accelerator:8`.
pub fn parse_gres(s: &str) -> Result<(Option<String>, u32), String> {
    let bad = || format!("invalid --gres '{s}': use gpu[:TYPE]:COUNT");
    let s = s.strip_prefix("gres/").unwrap_or(s);
    let parts: Vec<&str> = s.split(':').collect();
    let kind = parts.first().copied().unwrap_or_default();
    if kind != "gpu" && kind != "accelerator" {
        return Err(bad());
    }
    match parts.as_slice() {
        [_] => Ok((None, 1)),
        [_, count] => Ok((None, count.parse().map_err(|_| bad())?)),
        [_, model, count] => Ok((
            Some((*model).to_string()),
            count.parse().map_err(|_| bad())?,
        )),
        _ => Err(bad()),
    }
}

/// Bytes from a Slurm memory size: a bare number is MiB; the suffixes K, M,
/// G and T (optionally followed by `B` or `iB`, any case) are powers of
/// 1024; `B` alone is bytes.
pub fn parse_mem(s: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "invalid --mem '{s}': use a size such as 512M, 16G or 1048576B (a bare number is MiB)"
        )
    };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit = unit.to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .filter(|u| !u.is_empty())
        .or_else(|| unit.strip_suffix('B').filter(|u| !u.is_empty()))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 20,
        "B" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    let bytes = n.checked_mul(1u64 << shift).ok_or_else(bad)?;
    if bytes == 0 {
        return Err(format!(
            "invalid --mem '{s}': the memory of a rank must be positive"
        ));
    }
    Ok(bytes)
}

/// A byte count the way `--mem` takes it: the largest unit that divides it.
pub fn format_mem(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

fn parse_kv(s: &str, what: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{what} must be KEY=VALUE, not '{s}'")),
    }
}

/// `[TYPE:]COUNT`, as `-G/--gpus` and `--gpus-per-task` take it.
fn parse_typed_count(flag: &str, s: &str) -> Result<(Option<String>, u32), String> {
    let (model, count) = match s.rsplit_once(':') {
        Some((m, c)) if !m.is_empty() => (Some(m.to_string()), c),
        Some(_) => return Err(format!("invalid {flag} '{s}': use [TYPE:]COUNT")),
        None => (None, s),
    };
    let count = count
        .parse()
        .map_err(|_| format!("invalid {flag} '{s}': use [TYPE:]COUNT"))?;
    Ok((model, count))
}

/// How a job lays out on each node: its GPU model, GPUs per node and
/// tasks per node, from whichever of the GPU and task flags were given.
#[derive(Debug, PartialEq, Eq)]
pub struct NodeLayout {
    pub gpu_model: Option<String>,
    pub gpus_per_node: u32,
    pub tasks_per_node: u32,
}

impl JobArgs {
    /// `-N`, else the number of nodes `--nodelist` names, else 1.
    pub fn node_count(&self) -> Result<u32, String> {
        match (self.nodes, self.nodelist.as_deref()) {
            (Some(n), _) => Ok(n),
            (None, Some(list)) => {
                let names = crate::executor::tasks::expand_hostlist(list)
                    .map_err(|e| format!("--nodelist: {e}"))?;
                u32::try_from(names.len()).map_err(|_| "--nodelist names too many nodes".into())
            }
            (None, None) => Ok(1),
        }
    }

    pub fn layout(&self) -> Result<NodeLayout, String> {
        let nodes = self.node_count()?;
        if nodes == 0 {
            return Err("-N/--nodes must be positive".into());
        }
        let tasks_per_node = match (self.ntasks, self.ntasks_per_node) {
            (_, Some(0)) => return Err("--ntasks-per-node must be positive".into()),
            (Some(0), _) => return Err("--ntasks must be positive".into()),
            (Some(n), Some(per)) if u64::from(n) != u64::from(nodes) * u64::from(per) => {
                return Err(format!(
                    "--ntasks {n} is not {nodes} node(s) × --ntasks-per-node {per}"
                ))
            }
            (_, Some(per)) => per,
            (Some(n), None) if !n.is_multiple_of(nodes) => {
                return Err(format!(
                    "--ntasks {n} does not divide evenly over {nodes} node(s)"
                ))
            }
            (Some(n), None) => n / nodes,
            (None, None) => 1,
        };
        let (gpu_model, gpus_per_node) = if let Some(g) = &self.gres {
            parse_gres(g)?
        } else if let Some(n) = self.gpus_per_node {
            (None, n)
        } else if let Some(per_task) = &self.gpus_per_task {
            let (model, count) = parse_typed_count("--gpus-per-task", per_task)?;
            let per_node = count
                .checked_mul(tasks_per_node)
                .ok_or("--gpus-per-task × tasks per node is too large")?;
            (model, per_node)
        } else if let Some(total) = &self.gpus {
            let (model, count) = parse_typed_count("--gpus", total)?;
            if !count.is_multiple_of(nodes) {
                return Err(format!(
                    "--gpus {total} does not divide evenly over {nodes} node(s); use --gpus-per-node"
                ));
            }
            (model, count / nodes)
        } else {
            // One GPU per task, as torchrun's one process per GPU expects.
            (None, tasks_per_node)
        };
        Ok(NodeLayout {
            gpu_model,
            gpus_per_node,
            tasks_per_node,
        })
    }

    pub fn request(&self, command: Vec<String>) -> Result<JobSubmitRequest, String> {
        let NodeLayout {
            gpu_model,
            gpus_per_node,
            tasks_per_node,
        } = self.layout()?;
        let time_limit_s = parse_duration(&self.time)?.as_secs();
        let ckpt_interval_s = self
            .ckpt_interval
            .as_deref()
            .map(|s| parse_duration(s).map(|d| d.as_secs().max(1)))
            .transpose()?;
        let labels = self
            .constraints
            .iter()
            .map(|c| parse_kv(c, "--constraint"))
            .collect::<Result<BTreeMap<_, _>, _>>()?;
        let env = self
            .env
            .iter()
            .map(|c| parse_kv(c, "--env"))
            .collect::<Result<BTreeMap<_, _>, _>>()?;
        let workdir = match &self.chdir {
            Some(d) => Some(d.clone()),
            None => std::env::current_dir()
                .ok()
                .map(|d| d.display().to_string()),
        };
        Ok(JobSubmitRequest {
            name: self.name.clone().unwrap_or_default(),
            tenant: self.tenant.clone(),
            nodes: self.node_count()?,
            gpus_per_node,
            gpu_model,
            time_limit_s,
            priority: self.priority,
            preemptible: !self.no_preempt,
            command,
            env,
            workdir,
            ckpt_interval_s,
            max_restarts: self.max_restarts,
            requeue: self.requeue,
            same: self.same.clone(),
            max_rtt_ms: self.max_rtt_ms,
            labels,
            mem_bytes: self.mem.as_deref().map(parse_mem).transpose()?,
            cpus_per_task: match self.cpus_per_task {
                Some(0) => return Err("--cpus-per-task must be positive".into()),
                c => c,
            },
            tasks_per_node: (tasks_per_node > 1).then_some(tasks_per_node),
            batch: self.batch,
            dependency: self.dependency.clone(),
            signal: self.signal.clone(),
            nodelist: self.nodelist.clone(),
            exclude: self.exclude.clone(),
            exclusive: self.exclusive,
            hold: self.hold,
            ckpt_replicas: match &self.ckpt_replicas {
                Some(text) => {
                    crate::api::views::parse_ckpt_replicas(Some(text))?;
                    Some(text.clone())
                }
                None => None,
            },
            near: match &self.near {
                Some(url) => region_of_data(url)?,
                None => None,
            },
        })
    }
}

/// The region a `--near` URL names: `mesh://REGION/path` is REGION's,
/// `mesh:/path` this region's (`None`).
pub fn region_of_data(url: &str) -> Result<Option<String>, String> {
    let bad = || format!("--near wants mesh://REGION/PATH or mesh:/PATH, not '{url}'");
    if let Some(rest) = url.strip_prefix("mesh://") {
        let (region, path) = rest.split_once('/').ok_or_else(bad)?;
        let valid = !region.is_empty()
            && region
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid || path.is_empty() {
            return Err(bad());
        }
        return Ok(Some(region.to_string()));
    }
    match url.strip_prefix("mesh:/") {
        Some(path) if !path.is_empty() => Ok(None),
        _ => Err(bad()),
    }
}

#[derive(Args, Debug)]
pub struct QueueArgs {
    #[arg(long, short = 'A')]
    pub tenant: Option<String>,
    /// pending, running, checkpointing, requeued, preempted, completed, failed,
    /// cancelled, timeout, node_fail, out_of_memory
    #[arg(long, short = 't')]
    pub state: Option<String>,
    /// Only this job
    #[arg(short = 'j', long = "job")]
    pub job: Option<u64>,
    /// Include finished jobs (default: only jobs that are waiting or hold GPUs)
    #[arg(long, short = 'a')]
    pub all: bool,
    /// The queue of this peer region (ids print as REGION:ID)
    #[arg(long, conflicts_with = "all_regions")]
    pub region: Option<String>,
    /// This region's queue and every reachable peer region's, merged
    #[arg(long)]
    pub all_regions: bool,
}

#[derive(Subcommand, Debug)]
pub enum TenantCmd {
    /// Create a tenant (team, project) with optional limits
    Create(TenantArgs),
    /// Change a tenant's limits (`none` removes a limit, or restores the
    /// cluster default of a ledger limit)
    Set(TenantArgs),
    /// List tenants, their limits and their use of the ledger
    Ls,
    /// One tenant's limits and use of the ledger
    Show { name: String },
    /// Tenants capped across federated regions: the cap, its home region,
    /// and each region's share, GPUs in use and GPUs waited for
    Global,
    /// Make this region's own tenant NAME the one region REGION (its home)
    /// shares across regions: its limits and caps then come from REGION.
    /// A region adopts a shared tenant on its own only when it has no
    /// tenant of that name
    Adopt {
        name: String,
        /// The tenant's home region
        #[arg(long, value_name = "REGION")]
        from: String,
    },
}

#[derive(Args, Debug, Clone, Default)]
pub struct TenantArgs {
    pub name: String,
    #[arg(long)]
    pub parent: Option<String>,
    /// Most GPUs the tenant's subtree may hold at once, or `none`
    #[arg(long)]
    pub max_gpus: Option<String>,
    /// GPU-hour budget of the subtree, or `none`
    #[arg(long)]
    pub gpu_hours: Option<String>,
    /// Fair-share weight among siblings
    #[arg(long)]
    pub weight: Option<u32>,
    /// Jobs of this tenant a tenant token may keep waiting (pending or
    /// requeued), or `none` for the cluster default (1000)
    #[arg(long, value_name = "N")]
    pub max_pending_jobs: Option<String>,
    /// `mesh:/` objects a tenant token may give this tenant, or `none` for
    /// the cluster default (10000)
    #[arg(long, value_name = "N")]
    pub max_objects: Option<String>,
    /// Bytes of `mesh:/` manifests (ledger metadata, not the data) the
    /// tenant's objects may take together, e.g. 16MiB, or `none` for the
    /// cluster default (64MiB)
    #[arg(long, value_name = "SIZE")]
    pub max_manifest_bytes: Option<String>,
    /// Highest --priority a tenant token may give this tenant's jobs, or
    /// `none` for the cluster default (1000); admin tokens are not capped
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    pub max_priority: Option<String>,
    /// GPUs the tenant may hold in all federated regions together, or
    /// `none`; set in the tenant's home region (the other regions adopt
    /// the tenant from it and share the cap out by demand)
    #[arg(long, value_name = "N")]
    pub global_gpus: Option<String>,
    /// GPU-hours the tenant may commit in all federated regions together,
    /// or `none`; set in its home region, shared out by demand likewise
    #[arg(long, value_name = "H")]
    pub global_gpu_hours: Option<String>,
}

/// `none` as a limit to unset (`Ok(None)` after pushing `field` onto
/// `unset`), else the value parsed by `parse`.
fn limit_arg<T>(
    value: Option<&str>,
    field: &str,
    unset: &mut Vec<String>,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    match value {
        None => Ok(None),
        Some("none") => {
            unset.push(field.into());
            Ok(None)
        }
        Some(v) => parse(v).map(Some),
    }
}

impl TenantArgs {
    pub fn request(&self) -> Result<TenantRequest, String> {
        let mut req = TenantRequest {
            name: self.name.clone(),
            weight: self.weight,
            ..Default::default()
        };
        match self.parent.as_deref() {
            Some("none") => req.unset.push("parent".into()),
            other => req.parent = other.map(str::to_string),
        }
        match self.max_gpus.as_deref() {
            Some("none") => req.unset.push("max_gpus".into()),
            Some(n) => {
                req.max_gpus = Some(
                    n.parse()
                        .map_err(|_| format!("--max-gpus must be a count or none, not '{n}'"))?,
                )
            }
            None => {}
        }
        match self.gpu_hours.as_deref() {
            Some("none") => req.unset.push("gpu_hours".into()),
            Some(h) => {
                req.gpu_hours = Some(
                    h.parse()
                        .map_err(|_| format!("--gpu-hours must be a number or none, not '{h}'"))?,
                )
            }
            None => {}
        }
        let count = |flag: &'static str| {
            move |v: &str| {
                v.parse::<u32>()
                    .map_err(|_| format!("--{flag} must be a count or none, not '{v}'"))
            }
        };
        req.max_pending_jobs = limit_arg(
            self.max_pending_jobs.as_deref(),
            "max_pending_jobs",
            &mut req.unset,
            count("max-pending-jobs"),
        )?;
        req.global_gpus = limit_arg(
            self.global_gpus.as_deref(),
            "global_gpus",
            &mut req.unset,
            count("global-gpus"),
        )?;
        req.global_gpu_hours = limit_arg(
            self.global_gpu_hours.as_deref(),
            "global_gpu_hours",
            &mut req.unset,
            |v| {
                v.parse::<f64>()
                    .map_err(|_| format!("--global-gpu-hours must be a number or none, not '{v}'"))
            },
        )?;
        req.max_objects = limit_arg(
            self.max_objects.as_deref(),
            "max_objects",
            &mut req.unset,
            count("max-objects"),
        )?;
        req.max_manifest_bytes = limit_arg(
            self.max_manifest_bytes.as_deref(),
            "max_manifest_bytes",
            &mut req.unset,
            |v| {
                crate::bench::parse_size(v).map_err(|e| {
                    format!("--max-manifest-bytes must be a size (e.g. 16MiB) or none: {e}")
                })
            },
        )?;
        req.max_priority = limit_arg(
            self.max_priority.as_deref(),
            "max_priority",
            &mut req.unset,
            |v| {
                v.parse::<i32>()
                    .map_err(|_| format!("--max-priority must be an integer or none, not '{v}'"))
            },
        )?;
        Ok(req)
    }
}

fn api(e: shoal_sdk::ClientError) -> anyhow::Error {
    anyhow::anyhow!(e.to_string())
}

/// Most tasks one job array may have.
pub const MAX_ARRAY_TASKS: usize = 1000;

/// `--array`: the task indices, in order, and the most that may run at
/// once (`%N`).
pub fn parse_array(spec: &str) -> Result<(Vec<u32>, Option<usize>), String> {
    let bad = |why: &str| format!("invalid --array '{spec}': {why}");
    let (list, throttle) = match spec.split_once('%') {
        Some((l, t)) => {
            let t: usize = t.parse().map_err(|_| bad("%N must be a count"))?;
            if t == 0 {
                return Err(bad("%N must be positive"));
            }
            (l, Some(t))
        }
        None => (spec, None),
    };
    let mut indices = Vec::new();
    for item in list.split(',') {
        let (range, step) = match item.split_once(':') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .map_err(|_| bad("a step must be a count"))?,
            ),
            None => (item, 1),
        };
        if step == 0 {
            return Err(bad("a step must be positive"));
        }
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (a, b),
            None => (range, range),
        };
        let lo: u32 = lo.parse().map_err(|_| bad("use 0-15, 1,3,5 or 0-15:2"))?;
        let hi: u32 = hi.parse().map_err(|_| bad("use 0-15, 1,3,5 or 0-15:2"))?;
        if hi < lo {
            return Err(bad("a range must not run backwards"));
        }
        let mut i = lo;
        while i <= hi {
            if !indices.contains(&i) {
                indices.push(i);
            }
            if indices.len() > MAX_ARRAY_TASKS {
                return Err(bad(&format!("at most {MAX_ARRAY_TASKS} tasks")));
            }
            i = match i.checked_add(step) {
                Some(n) => n,
                None => break,
            };
        }
    }
    Ok((indices, throttle))
}

/// The submissions of a job array: one request per index, with Slurm's
/// array variables; with `%N`, task k waits for task k−N to end, so at
/// most N run at once. `first` is the id of the first task once known
/// (`SLURM_ARRAY_JOB_ID`; the first task's own is its job id).
fn array_task(
    base: &JobSubmitRequest,
    indices: &[u32],
    k: usize,
    throttle: Option<usize>,
    ids: &[u64],
) -> JobSubmitRequest {
    let mut req = base.clone();
    let min = indices.iter().min().copied().unwrap_or_default();
    let max = indices.iter().max().copied().unwrap_or_default();
    for (key, value) in [
        ("SLURM_ARRAY_TASK_ID", indices[k].to_string()),
        ("SLURM_ARRAY_TASK_COUNT", indices.len().to_string()),
        ("SLURM_ARRAY_TASK_MIN", min.to_string()),
        ("SLURM_ARRAY_TASK_MAX", max.to_string()),
    ] {
        req.env.insert(key.into(), value);
    }
    if let Some(first) = ids.first() {
        req.env
            .insert("SLURM_ARRAY_JOB_ID".into(), first.to_string());
    }
    if let Some(t) = throttle {
        if k >= t {
            let wait = format!("afterany:{}", ids[k - t]);
            req.dependency = Some(match req.dependency.take() {
                Some(d) if !d.is_empty() => format!("{d},{wait}"),
                _ => wait,
            });
        }
    }
    req
}

/// `--test-only`: where and when the job would start, printed as
/// `program` (`sbatch`: Slurm's line; `submit`: shoal's) or as JSON.
async fn test_only(
    client: &Client,
    req: &JobSubmitRequest,
    json: bool,
    program: &str,
) -> anyhow::Result<()> {
    let answer = client.test_job(req).await.map_err(api)?;
    if json {
        return print_json(&answer);
    }
    println!("{}", test_only_line(&answer, req, program));
    Ok(())
}

/// The one line `--test-only` prints.
pub fn test_only_line(
    answer: &shoal_sdk::JobTestOnlyResponse,
    req: &JobSubmitRequest,
    program: &str,
) -> String {
    let tasks = u64::from(req.nodes) * u64::from(req.tasks_per_node.unwrap_or(1).max(1));
    let when = answer
        .start_at
        .as_deref()
        .map(|t| t.trim_end_matches('Z').to_string());
    match (program, answer.start_in_s, when) {
        ("sbatch", Some(_), Some(when)) => format!(
            "sbatch: Job to start at {when} using {tasks} processors on nodes {} in partition {}",
            answer.nodelist, PARTITION
        ),
        (_, Some(0), _) => format!("would start now on {}", answer.nodelist),
        (_, Some(s), when) => format!(
            "would start in {} (at {}) on {}{}",
            format_elapsed(s),
            when.unwrap_or_default(),
            answer.nodelist,
            answer
                .reason
                .as_deref()
                .map_or(String::new(), |r| format!("; now: {r}")),
        ),
        (_, None, _) => format!(
            "{}would not start: {}",
            if program == "sbatch" { "sbatch: " } else { "" },
            answer
                .reason
                .as_deref()
                .unwrap_or("not even once the running jobs end")
        ),
    }
}

/// What `submit` does once the job is in.
#[derive(Clone, Copy, Debug, Default)]
pub struct AfterSubmit {
    /// Print "Submitted batch job N" like sbatch.
    pub banner: bool,
    /// Wait for the end and exit with the job's code (sbatch --wait).
    pub wait: bool,
    /// Stream the tasks' output until the end, then exit with the job's
    /// code (srun); `Some(true)`: label each line with its task's rank.
    pub attach: Option<bool>,
}

pub async fn submit(
    client: &Client,
    args: &JobArgs,
    json: bool,
    how: AfterSubmit,
) -> anyhow::Result<()> {
    let AfterSubmit {
        banner,
        wait,
        attach,
    } = how;
    if args.command.is_empty() {
        anyhow::bail!("a command is required: shoal submit [OPTIONS] -- CMD [ARGS...]");
    }
    let req = args
        .request(args.command.clone())
        .map_err(anyhow::Error::msg)?;
    if args.near.is_some() && client.region() != Some(shoal_sdk::AUTO_REGION) {
        anyhow::bail!("--near chooses among regions: it needs --region auto");
    }
    if args.test_only {
        let program = if banner { "sbatch" } else { "submit" };
        return test_only(client, &req, json, program).await;
    }
    if let Some(spec) = &args.array {
        return submit_array(client, &req, spec, json, how).await;
    }
    let resp = client.submit_job(&req).await.map_err(api)?;
    if let Some(label) = attach {
        // srun prints the job's output, not its id.
        return attach_to(client, resp.id, label).await;
    }
    let shown = shoal_sdk::RegionJobId {
        region: resp.region.clone(),
        id: resp.id,
    };
    if json {
        print_json(&resp)?;
    } else if banner {
        println!("Submitted batch job {shown}");
    } else {
        println!("{shown}");
    }
    // Waiting follows the job where it landed.
    let asked = client.region().filter(|r| *r != shoal_sdk::AUTO_REGION);
    let client = &client.in_region(resp.region.as_deref().or(asked));
    if !wait {
        return Ok(());
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // Like `sbatch --wait`: the job's exit code once it ends (1 when it
    // ended without one, e.g. cancelled before it started).
    loop {
        let job = client.job(resp.id).await.map_err(api)?;
        if job.state.is_final() {
            return job_exit(&job);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `sbatch --array`: every task or none (a refused task cancels the ones
/// already in); prints the first task's id, which names the array.
async fn submit_array(
    client: &Client,
    base: &JobSubmitRequest,
    spec: &str,
    json: bool,
    how: AfterSubmit,
) -> anyhow::Result<()> {
    let (indices, throttle) = parse_array(spec).map_err(anyhow::Error::msg)?;
    if how.attach.is_some() {
        anyhow::bail!("--array cannot be attached to (srun)");
    }
    let mut ids: Vec<u64> = Vec::new();
    for k in 0..indices.len() {
        let req = array_task(base, &indices, k, throttle, &ids);
        match client.submit_job(&req).await {
            Ok(resp) => ids.push(resp.id),
            Err(e) => {
                for id in &ids {
                    let _ = client.cancel_job(*id).await;
                }
                anyhow::bail!(
                    "array task {} was refused, so none was submitted: {e}",
                    indices[k]
                );
            }
        }
    }
    let first = ids.first().copied().unwrap_or_default();
    if json {
        print_json(&serde_json::json!({ "id": first, "ids": ids }))?;
    } else if how.banner {
        println!("Submitted batch job {first}");
    } else {
        println!("{first}");
    }
    if !how.wait {
        return Ok(());
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // Like `sbatch --wait` of an array: the highest exit code of its tasks.
    let mut worst = 0;
    for id in ids {
        loop {
            let job = client.job(id).await.map_err(api)?;
            if job.state.is_final() {
                if job_exit(&job).is_err() {
                    worst = worst.max(job.exit_code.filter(|c| *c != 0).unwrap_or(1));
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    match worst {
        0 => Ok(()),
        code => Err(ExitWith(code).into()),
    }
}

/// How a job's end becomes the exit of the command that waited for it.
fn job_exit(job: &JobInfo) -> anyhow::Result<()> {
    match job.exit_code {
        Some(0) if job.state == JobState::Completed => Ok(()),
        Some(code) if code != 0 => Err(ExitWith(code).into()),
        _ => Err(ExitWith(1).into()),
    }
}

/// One line of a node's log as srun shows it: the agent's own lines are
/// left out; a task's label is kept only with `--label`, and a node that
/// runs one task gets its rank as the label.
fn srun_line(line: &[u8], node_rank: u32, per_node: u32, label: bool) -> Option<Vec<u8>> {
    if line.starts_with(b"--- shoal: ") {
        return None;
    }
    if per_node > 1 {
        if label {
            return Some(line.to_vec());
        }
        let text = std::str::from_utf8(line).ok();
        let unlabelled = text
            .and_then(|t| t.split_once(": "))
            .filter(|(rank, _)| rank.parse::<u32>().is_ok())
            .map(|(_, rest)| rest.as_bytes().to_vec());
        return Some(unlabelled.unwrap_or_else(|| line.to_vec()));
    }
    if label {
        let mut out = format!("{node_rank}: ").into_bytes();
        out.extend_from_slice(line);
        return Some(out);
    }
    Some(line.to_vec())
}

/// `srun` outside a job: every node's output, line by line, until the job
/// ends; then its exit code.
async fn attach_to(client: &Client, id: u64, label: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut offsets: BTreeMap<u32, (Client, u64, Vec<u8>)> = BTreeMap::new();
    let mut nodes_by_name: BTreeMap<String, String> = BTreeMap::new();
    let mut last_pass = false;
    loop {
        let job = client.job(id).await.map_err(api)?;
        let ended = job.state.is_final();
        let per_node = job.tasks_per_node.max(1);
        for (rank, node) in job.nodes.iter().enumerate() {
            let rank = rank as u32;
            if offsets.contains_key(&rank) {
                continue;
            }
            if !nodes_by_name.contains_key(node) {
                for n in client.nodes().await.map_err(api)? {
                    nodes_by_name.insert(n.name.clone(), n.api_url.clone());
                }
            }
            if let Some(url) = nodes_by_name.get(node) {
                offsets.insert(rank, (client.at(url.clone()), 0, Vec::new()));
            }
        }
        for (rank, (node, offset, partial)) in offsets.iter_mut() {
            // A log not there yet (the rank is starting) is read next time.
            while let Ok(chunk) = node.job_log_chunk(id, *rank, *offset).await {
                if chunk.bytes.is_empty() {
                    break;
                }
                *offset = chunk.start + chunk.bytes.len() as u64;
                partial.extend_from_slice(&chunk.bytes);
                let Some(end) = partial.iter().rposition(|b| *b == b'\n') else {
                    continue;
                };
                let complete: Vec<u8> = partial.drain(..=end).collect();
                let mut out = std::io::stdout().lock();
                for line in complete.split_inclusive(|b| *b == b'\n') {
                    if let Some(shown) = srun_line(line, *rank, per_node, label) {
                        out.write_all(&shown)?;
                    }
                }
                out.flush()?;
            }
        }
        if last_pass {
            return job_exit(&job);
        }
        // One more read once the job has ended, for its last lines.
        last_pass = ended;
        if !ended {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `shoal alloc`: like salloc, holds a gang and runs a command here with its
/// environment; the allocation is released when the command ends.
pub async fn alloc(client: &Client, args: &JobArgs) -> anyhow::Result<()> {
    let req = args.request(Vec::new()).map_err(anyhow::Error::msg)?;
    if args.test_only {
        return test_only(client, &req, false, "alloc").await;
    }
    if args.hold {
        anyhow::bail!(
            "alloc: --hold would wait for ever; submit it held with `shoal submit --hold`"
        );
    }
    let id = client.submit_job(&req).await.map_err(api)?.id;
    eprintln!("shoal: pending job allocation {id}");
    let job = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                let _ = client.cancel_job(id).await;
                anyhow::bail!("interrupted; job allocation {id} cancelled");
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let job = client.job(id).await.map_err(api)?;
        match job.state {
            JobState::Running => break job,
            state if state.is_waiting() => continue,
            other => anyhow::bail!(
                "job allocation {id} ended before it started ({other}): {}",
                job.reason
            ),
        }
    };
    let nodes = client.nodes().await.map_err(api)?;
    let master = job
        .nodes
        .first()
        .and_then(|n| nodes.iter().find(|info| &info.name == n))
        .and_then(|info| info.addr.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "127.0.0.1".into());
    eprintln!(
        "shoal: granted job allocation {id} on {}",
        job.nodes.join(",")
    );
    let command = if args.command.is_empty() {
        vec![std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())]
    } else {
        args.command.clone()
    };
    let status = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("SHOAL_JOB_ID", id.to_string())
        .env("SLURM_JOB_ID", id.to_string())
        .env("SHOAL_EPOCH", job.epoch.unwrap_or_default().to_string())
        .env("SHOAL_NODES", job.nodes.join(","))
        .env("SLURM_JOB_NODELIST", job.nodes.join(","))
        .env("WORLD_SIZE", job.nodes.len().to_string())
        .env("MASTER_ADDR", master)
        .env("SHOAL_API", client.base_url())
        .status()
        .await;
    let _ = client.cancel_job(id).await;
    eprintln!("shoal: relinquishing job allocation {id}");
    let status = status.map_err(|e| anyhow::anyhow!("cannot run '{}': {e}", command[0]))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => Err(ExitWith(code).into()),
        None => Err(ExitWith(1).into()),
    }
}

pub async fn queue(client: &Client, args: &QueueArgs, json: bool) -> anyhow::Result<()> {
    let jobs = if args.all_regions {
        queue_all_regions(client, args).await?
    } else {
        let client = client.in_region(args.region.as_deref());
        let mut jobs = queue_of(&client, args).await?;
        crate::cli::federation::label(&mut jobs, args.region.as_deref());
        jobs
    };
    if json {
        return print_json(&jobs);
    }
    print!("{}", format_queue(&jobs));
    Ok(())
}

/// The jobs `args` select in the region `client` asks.
pub async fn queue_of(client: &Client, args: &QueueArgs) -> anyhow::Result<Vec<JobInfo>> {
    let jobs = match args.job {
        Some(id) => vec![client.job(id).await.map_err(api)?],
        None => {
            let mut jobs = client
                .jobs(args.tenant.as_deref(), args.state.as_deref())
                .await
                .map_err(api)?;
            if !args.all && args.state.is_none() {
                jobs.retain(|j| !j.state.is_final());
            }
            jobs
        }
    };
    Ok(jobs)
}

pub fn format_queue(jobs: &[JobInfo]) -> String {
    let mut out = format!(
        "{:<7}{:<16}{:<12}{:<14}{:>6}{:>6}{:>12}  {}\n",
        "JOBID", "NAME", "TENANT", "STATE", "NODES", "GPUS", "TIME_LIMIT", "NODELIST(REASON)"
    );
    for j in jobs {
        let holds_gpus = matches!(
            j.state,
            JobState::Running | JobState::Preempted | JobState::Checkpointing
        );
        let where_ = if holds_gpus || j.reason.is_empty() {
            j.nodes.join(",")
        } else {
            format!("({})", j.reason)
        };
        let id = match &j.region {
            Some(r) => format!("{r}:{}", j.id),
            None => j.id.to_string(),
        };
        out.push_str(&format!(
            "{:<7}{:<16}{:<12}{:<14}{:>6}{:>6}{:>12}  {}\n",
            id,
            truncate(&j.name, 15),
            truncate(&j.tenant, 11),
            j.state,
            j.nodes_requested,
            j.nodes_requested * j.gpus_per_node,
            format_limit(j.time_limit_s),
            where_
        ));
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n.saturating_sub(1)).chain(['…']).collect()
    }
}

fn format_limit(s: u64) -> String {
    if s >= 86_400 {
        format!(
            "{}-{:02}:{:02}:{:02}",
            s / 86_400,
            (s / 3600) % 24,
            (s / 60) % 60,
            s % 60
        )
    } else {
        format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
    }
}

pub async fn show(client: &Client, id: u64, json: bool) -> anyhow::Result<()> {
    let mut job = client.job(id).await.map_err(api)?;
    job.region = client.region().map(str::to_string);
    if json {
        return print_json(&job);
    }
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    println!(
        "id:          {}",
        shoal_sdk::RegionJobId {
            region: job.region.clone(),
            id: job.id
        }
    );
    println!("name:        {}", job.name);
    println!("tenant:      {}", job.tenant);
    println!("state:       {}", job.state);
    if !job.reason.is_empty() {
        println!("reason:      {}", job.reason);
    }
    println!(
        "request:     {} node(s) × {} GPU(s), time limit {}, priority {}{}",
        job.nodes_requested,
        job.gpus_per_node,
        format_limit(job.time_limit_s),
        job.priority,
        if job.preemptible {
            ""
        } else {
            ", not preemptible"
        }
    );
    if job.mem_bytes.is_some() || job.cpus_per_task.is_some() {
        println!(
            "per rank:    memory {}, CPUs {}",
            job.mem_bytes.map(format_mem).unwrap_or_else(|| "-".into()),
            job.cpus_per_task
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    for (rank, node) in job.nodes.iter().enumerate() {
        let gpus = job.gpus.get(node).cloned().unwrap_or_default();
        println!("rank {rank:<6} {node} GPUs {gpus:?}");
    }
    println!(
        "epoch:       {}",
        job.epoch
            .map(|e| e.to_string())
            .unwrap_or_else(|| "-".into())
    );
    println!(
        "restarts:    {} (preempted {} times)",
        job.restarts, job.preemptions
    );
    println!("submitted:   {}", job.submitted_at);
    println!("started:     {}", opt(&job.started_at));
    println!("ended:       {}", opt(&job.ended_at));
    if let Some(code) = job.exit_code {
        println!("exit code:   {code}");
    }
    if let Some(step) = job.last_ckpt_step {
        println!("checkpoint:  step {step}");
    }
    println!("command:     {}", job.command.join(" "));
    Ok(())
}

pub async fn cancel(client: &Client, ids: &[u64], json: bool) -> anyhow::Result<()> {
    let mut answers = Vec::new();
    for id in ids {
        answers.push(client.cancel_job(*id).await.map_err(api)?);
        if !json {
            println!("job {id} cancelled");
        }
    }
    if json {
        print_json(&answers)?;
    }
    Ok(())
}

/// `shoal cancel --signal SIG ID...`, `scancel --signal`.
pub async fn signal(client: &Client, ids: &[u64], sig: &str, json: bool) -> anyhow::Result<()> {
    let mut answers = Vec::new();
    for id in ids {
        answers.push(client.signal_job(*id, sig).await.map_err(api)?);
        if !json {
            println!("job {id} sent {sig}");
        }
    }
    if json {
        print_json(&answers)?;
    }
    Ok(())
}

/// `shoal requeue ID...`, `scontrol requeue`.
pub async fn requeue(client: &Client, ids: &[u64], json: bool) -> anyhow::Result<()> {
    let mut answers = Vec::new();
    for id in ids {
        answers.push(client.requeue_job(*id).await.map_err(api)?);
        if !json {
            println!("job {id} requeued");
        }
    }
    if json {
        print_json(&answers)?;
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum UserCmd {
    /// User names and their tenants
    Ls,
    /// Map a user name to a tenant (admin)
    Add {
        name: String,
        #[arg(long, short = 'A')]
        tenant: String,
    },
    /// Remove a user name (admin)
    Rm { name: String },
}

/// `shoal user ls|add|rm`, `sacctmgr list|add|delete user`.
pub async fn user(client: &Client, cmd: &UserCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        UserCmd::Ls => {
            let users = client.users().await.map_err(api)?;
            if json {
                return print_json(&users);
            }
            println!("{:<20} TENANT", "USER");
            for u in users {
                println!("{:<20} {}", u.name, u.tenant.unwrap_or_default());
            }
        }
        UserCmd::Add { name, tenant } => {
            let w = client.set_user(name, Some(tenant)).await.map_err(api)?;
            if json {
                return print_json(&w);
            }
            println!("user {name} is tenant {tenant}");
        }
        UserCmd::Rm { name } => {
            let w = client.set_user(name, None).await.map_err(api)?;
            if json {
                return print_json(&w);
            }
            println!("user {name} removed");
        }
    }
    Ok(())
}

/// Tenants that `names` (Slurm user names, `-u`) stand for: a mapped
/// user's tenant, else the name itself (a tenant).
pub fn tenants_of_users(names: &[String], users: &[shoal_sdk::UserInfo]) -> Vec<String> {
    names
        .iter()
        .map(|n| {
            users
                .iter()
                .find(|u| &u.name == n)
                .and_then(|u| u.tenant.clone())
                .unwrap_or_else(|| n.clone())
        })
        .collect()
}

/// `shoal hold|release ID...`.
pub async fn hold(client: &Client, ids: &[u64], hold: bool, json: bool) -> anyhow::Result<()> {
    let mut answers = Vec::new();
    for id in ids {
        let answer = if hold {
            client.hold_job(*id).await
        } else {
            client.release_job(*id).await
        };
        answers.push(answer.map_err(api)?);
        if !json {
            println!("job {id} {}", if hold { "held" } else { "released" });
        }
    }
    if json {
        print_json(&answers)?;
    }
    Ok(())
}

/// Prints a rank's log from `offset` to its current end (the API answers
/// 4 MiB at a time); returns the offset to go on from. After a rotation the
/// node answers from the new file's start.
async fn print_log_from(
    node: &Client,
    id: u64,
    rank: u32,
    at: LogAt,
    task: &mut TaskLines,
) -> anyhow::Result<LogAt> {
    use std::io::Write;
    let mut at = at;
    loop {
        let mut chunk = node.job_log_chunk(id, rank, at.offset).await.map_err(api)?;
        if at.rotations.is_some_and(|r| r != chunk.rotations) {
            // Rotated since the last read: the new file, from its start.
            writeln!(
                std::io::stdout(),
                "--- shoal: the log was rotated; from the start of the new file ---"
            )?;
            if chunk.start != 0 {
                chunk = node.job_log_chunk(id, rank, 0).await.map_err(api)?;
            }
        }
        std::io::stdout().write_all(&task.feed(&chunk.bytes))?;
        std::io::stdout().flush()?;
        at = LogAt {
            offset: chunk.start + chunk.bytes.len() as u64,
            rotations: Some(chunk.rotations),
        };
        if chunk.bytes.is_empty() {
            return Ok(at);
        }
    }
}

/// One task's lines out of its node's log, where a node runs several tasks
/// and labels their lines with their global rank (`3: ...`); the agent's
/// own `--- shoal: ...` lines are kept. A line cut between two reads waits
/// for its end.
#[derive(Debug, Default)]
struct TaskLines {
    /// `"3: "`; None: the whole log (one task per node).
    label: Option<String>,
    partial: Vec<u8>,
}

impl TaskLines {
    fn new(task: Option<u32>) -> TaskLines {
        TaskLines {
            label: task.map(|t| format!("{t}: ")),
            partial: Vec::new(),
        }
    }

    fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let Some(label) = &self.label else {
            return bytes.to_vec();
        };
        self.partial.extend_from_slice(bytes);
        let complete = match self.partial.iter().rposition(|b| *b == b'\n') {
            Some(end) => self.partial.drain(..=end).collect::<Vec<u8>>(),
            None => return Vec::new(),
        };
        let mut out = Vec::new();
        for line in complete.split_inclusive(|b| *b == b'\n') {
            if let Some(rest) = line.strip_prefix(label.as_bytes()) {
                out.extend_from_slice(rest);
            } else if line.starts_with(b"--- shoal: ") {
                out.extend_from_slice(line);
            }
        }
        out
    }
}

/// Where a reader of a rank's log is: its offset in the current file, and
/// the rotations it has seen (none before its first read).
#[derive(Clone, Copy, Debug, Default)]
struct LogAt {
    offset: u64,
    rotations: Option<u64>,
}

/// Prints a rank's log from the node that ran it; `follow` polls until the job ends.
pub async fn logs(client: &Client, id: u64, rank: u32, follow: bool) -> anyhow::Result<()> {
    let mut at = LogAt::default();
    let mut source: Option<Client> = None;
    let started = Instant::now();
    let mut task: Option<TaskLines> = None;
    loop {
        let job = client.job(id).await.map_err(api)?;
        // `rank` is a task's global rank; its node's log has its lines.
        let per_node = job.tasks_per_node.max(1);
        let node_rank = rank / per_node;
        let task = task.get_or_insert_with(|| TaskLines::new((per_node > 1).then_some(rank)));
        if u64::from(rank) >= u64::from(job.nodes_requested) * u64::from(per_node) {
            anyhow::bail!(
                "job {id} has no rank {rank}: it runs {} task(s) on {} node(s)",
                u64::from(job.nodes_requested) * u64::from(per_node),
                job.nodes_requested
            );
        }
        if source.is_none() && client.region().is_some() {
            // Another region's rank: the node asked forwards, and that
            // region fetches the log from the node that ran it.
            source = Some(client.clone());
        }
        if source.is_none() {
            if let Some(node) = job.nodes.get(node_rank as usize) {
                let nodes = client.nodes().await.map_err(api)?;
                if let Some(info) = nodes.iter().find(|n| &n.name == node) {
                    source = Some(client.at(info.api_url.clone()));
                }
            } else if !follow {
                anyhow::bail!("job {id} has not run a rank {rank} yet ({})", job.state);
            }
        }
        if let Some(node) = &source {
            at = print_log_from(node, id, node_rank, at, task).await?;
        }
        let ended = job.state.is_final();
        if !follow || (ended && started.elapsed() > Duration::from_millis(500)) {
            if ended && follow {
                // One last read for what was written before the exit.
                if let Some(node) = &source {
                    print_log_from(node, id, node_rank, at, task).await?;
                }
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `shoal events [-f]`: the event log, then (with -f) new events as they come.
pub async fn events(
    client: &Client,
    follow: bool,
    kind: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let mut after = 0;
    loop {
        let mut batch = client.events(after).await.map_err(api)?;
        if let Some(last) = batch.last() {
            after = last.id;
        }
        if let Some(kind) = kind {
            batch.retain(|e| e.kind == kind);
        }
        if json && !follow {
            return print_json(&batch);
        }
        for e in &batch {
            if json {
                println!("{}", serde_json::to_string(e)?);
            } else {
                let place = match (&e.node, e.gpu) {
                    (Some(n), Some(g)) => format!("{n}/gpu{g}"),
                    (Some(n), None) => n.clone(),
                    _ => "-".into(),
                };
                let job = e.job.map(|j| format!(" job {j}")).unwrap_or_default();
                let resource = e
                    .resource
                    .as_ref()
                    .map(|r| format!(" [{r}]"))
                    .unwrap_or_default();
                let repeats = match e.repeats {
                    0 => String::new(),
                    n => format!(" (and {n} more within a minute)"),
                };
                println!(
                    "{}  {:<8} {:<13} {:<12}{job}  {}{resource}{repeats}",
                    e.at, e.severity, e.kind, place, e.message
                );
            }
        }
        if !follow {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub async fn tenant(client: &Client, cmd: &TenantCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        TenantCmd::Create(args) => {
            let req = args.request().map_err(anyhow::Error::msg)?;
            let r = client.create_tenant(&req).await.map_err(api)?;
            if json {
                print_json(&r)
            } else {
                println!("tenant {} created", args.name);
                Ok(())
            }
        }
        TenantCmd::Set(args) => {
            let req = args.request().map_err(anyhow::Error::msg)?;
            let r = client.set_tenant(&req).await.map_err(api)?;
            if json {
                print_json(&r)
            } else {
                println!("tenant {} updated", args.name);
                Ok(())
            }
        }
        TenantCmd::Ls => {
            let tenants = client.tenants().await.map_err(api)?;
            if json {
                print_json(&tenants)
            } else {
                print!("{}", format_tenants(&tenants));
                Ok(())
            }
        }
        TenantCmd::Global => {
            let tenants = client.global_tenants().await.map_err(api)?;
            if json {
                print_json(&tenants)
            } else {
                print!("{}", format_global_tenants(&tenants));
                Ok(())
            }
        }
        TenantCmd::Adopt { name, from } => {
            let r = client.adopt_tenant(name, from).await.map_err(api)?;
            if json {
                print_json(&r)
            } else {
                println!("tenant {name} is now {name}@{from}: its limits and caps come from region {from}");
                Ok(())
            }
        }
        TenantCmd::Show { name } => {
            let tenants = client.tenants().await.map_err(api)?;
            let Some(tenant) = tenants.into_iter().find(|t| &t.name == name) else {
                anyhow::bail!("no tenant named '{name}'");
            };
            if json {
                print_json(&tenant)
            } else {
                print!("{}", format_tenant(&tenant));
                Ok(())
            }
        }
    }
}

fn format_global_tenants(tenants: &[shoal_sdk::GlobalTenantInfo]) -> String {
    let mut out = format!(
        "{:<16} {:<12} {:>6} {:>9}  {:<14} {:>6} {:>7} {:>7} {:>9} {:>9}\n",
        "TENANT",
        "HOME",
        "GPUS",
        "GPU_HOURS",
        "REGION",
        "SHARE",
        "IN_USE",
        "WAITING",
        "HRS_SHARE",
        "HRS_USED"
    );
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for t in tenants {
        for (i, r) in t.regions.iter().enumerate() {
            let (name, home, gpus, hours) = if i == 0 {
                (
                    t.tenant.clone(),
                    t.home.clone(),
                    or_dash(t.gpus.map(|g| g.to_string())),
                    or_dash(t.gpu_hours.map(|h| format!("{h:.1}"))),
                )
            } else {
                Default::default()
            };
            let region = match (r.local, r.reachable) {
                (true, _) => format!("{} (here)", r.region),
                (false, true) => r.region.clone(),
                (false, false) => format!("{} (!)", r.region),
            };
            out.push_str(&format!(
                "{name:<16} {home:<12} {gpus:>6} {hours:>9}  {region:<14} {:>6} {:>7} {:>7} {:>9} {:>9.1}\n",
                or_dash(r.share.map(|s| s.to_string())),
                r.in_use,
                r.demand,
                or_dash(r.gpu_hours_share.map(|h| format!("{h:.1}"))),
                r.gpu_hours_committed,
            ));
        }
    }
    out
}

/// `1.5MiB`, `64MiB`, `512B`.
fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            let value = n as f64 / size as f64;
            return if n.is_multiple_of(size) {
                format!("{}{unit}", n / size)
            } else {
                format!("{value:.1}{unit}")
            };
        }
    }
    format!("{n}B")
}

/// Use/limit of the tenant's pending jobs, objects and manifest bytes, and
/// its priority cap; a limit set for the tenant (not the cluster default)
/// is marked `*`.
fn ledger_columns(limits: Option<&shoal_sdk::LedgerLimitsInfo>) -> [String; 4] {
    let Some(l) = limits else {
        return ["-".into(), "-".into(), "-".into(), "-".into()];
    };
    let mark = |field: &str| {
        if l.overridden.iter().any(|o| o == field) {
            "*"
        } else {
            ""
        }
    };
    [
        format!(
            "{}/{}{}",
            l.pending_jobs,
            l.max_pending_jobs,
            mark("max_pending_jobs")
        ),
        format!("{}/{}{}", l.objects, l.max_objects, mark("max_objects")),
        format!(
            "{}/{}{}",
            human_bytes(l.manifest_bytes),
            human_bytes(l.max_manifest_bytes),
            mark("max_manifest_bytes")
        ),
        format!("{}{}", l.max_priority, mark("max_priority")),
    ]
}

const LEDGER_NOTE: &str =
    "WAITING, OBJECTS, MANIFESTS: the tenant's own use/limit; * set for the tenant, else the cluster default\n";

fn format_tenants(tenants: &[TenantInfo]) -> String {
    let mut out = format!(
        "{:<16}{:<16}{:>9}{:>12}{:>8}{:>12}{:>13}{:>18}{:>9}\n",
        "TENANT",
        "PARENT",
        "MAX_GPUS",
        "GPU_HOURS",
        "WEIGHT",
        "WAITING",
        "OBJECTS",
        "MANIFESTS",
        "MAX_PRIO"
    );
    for t in tenants {
        let [waiting, objects, manifests, priority] = ledger_columns(t.ledger_limits.as_ref());
        out.push_str(&format!(
            "{:<16}{:<16}{:>9}{:>12}{:>8}{waiting:>12}{objects:>13}{manifests:>18}{priority:>9}\n",
            t.name,
            t.parent.clone().unwrap_or_else(|| "-".into()),
            t.max_gpus
                .map(|m| m.to_string())
                .unwrap_or_else(|| "-".into()),
            t.gpu_hours_limit
                .map(|h| format!("{h:.1}"))
                .unwrap_or_else(|| "-".into()),
            t.weight
        ));
    }
    out.push_str(LEDGER_NOTE);
    out
}

fn format_tenant(t: &TenantInfo) -> String {
    let none = || "-".to_string();
    let mut out = format!(
        "tenant:       {}\nparent:       {}\nmax GPUs:     {}\nGPU-hours:    {}\nweight:       {}\ncreated:      {}\n",
        t.name,
        t.parent.clone().unwrap_or_else(none),
        t.max_gpus.map(|m| m.to_string()).unwrap_or_else(none),
        t.gpu_hours_limit
            .map(|h| format!("{h:.1}"))
            .unwrap_or_else(none),
        t.weight,
        t.created_at,
    );
    if let Some(l) = &t.ledger_limits {
        let source = |field: &str| {
            if l.overridden.iter().any(|o| o == field) {
                "set for this tenant"
            } else {
                "cluster default"
            }
        };
        out.push_str(&format!(
            "waiting jobs: {} of {} ({})\nobjects:      {} of {} ({})\nmanifests:    {} of {} ({})\nmax priority: {} ({})\n",
            l.pending_jobs,
            l.max_pending_jobs,
            source("max_pending_jobs"),
            l.objects,
            l.max_objects,
            source("max_objects"),
            human_bytes(l.manifest_bytes),
            human_bytes(l.max_manifest_bytes),
            source("max_manifest_bytes"),
            l.max_priority,
            source("max_priority"),
        ));
    }
    out
}

pub async fn quota(client: &Client, tenant: Option<&str>, json: bool) -> anyhow::Result<()> {
    let mut rows = client.quota().await.map_err(api)?;
    if let Some(t) = tenant {
        rows.retain(|r| r.tenant == t);
        if rows.is_empty() {
            anyhow::bail!("no tenant named '{t}'");
        }
    }
    if json {
        return print_json(&rows);
    }
    print!("{}", format_quota(&rows));
    Ok(())
}

fn format_quota(rows: &[QuotaInfo]) -> String {
    let mut out = format!(
        "{:<16}{:>10}{:>18}{:>10}{:>8}{:>9}{:>9}{:>9}{:>12}{:>13}{:>18}{:>9}\n",
        "TENANT",
        "GPUS",
        "GPU_HOURS",
        "REFUNDED",
        "SHARE",
        "WEIGHT",
        "RUNNING",
        "PENDING",
        "WAITING",
        "OBJECTS",
        "MANIFESTS",
        "MAX_PRIO"
    );
    for r in rows {
        let gpus = match r.max_gpus {
            Some(m) => format!("{}/{m}", r.gpus_in_use),
            None => r.gpus_in_use.to_string(),
        };
        let hours = match r.gpu_hours_limit {
            Some(l) => format!("{:.2}/{l:.0}", r.gpu_hours_used),
            None => format!("{:.2}", r.gpu_hours_used),
        };
        let [waiting, objects, manifests, priority] = ledger_columns(r.ledger_limits.as_ref());
        out.push_str(&format!(
            "{:<16}{:>10}{:>18}{:>10.2}{:>7.0}%{:>9}{:>9}{:>9}{waiting:>12}{objects:>13}{manifests:>18}{priority:>9}\n",
            r.tenant,
            gpus,
            hours,
            r.gpu_hours_refunded,
            r.share * 100.0,
            r.weight,
            r.running_jobs,
            r.pending_jobs
        ));
    }
    out.push_str("RUNNING, PENDING: the subtree's jobs; ");
    out.push_str(LEDGER_NOTE);
    out
}

/// `queue --all-regions`: this region's jobs, then every peer's that
/// answers; a peer that does not is named on stderr and left out, so one
/// lost region never hides the others' queues.
pub async fn queue_all_regions(client: &Client, args: &QueueArgs) -> anyhow::Result<Vec<JobInfo>> {
    let mut jobs = queue_of(client, args).await?;
    let regions = client.regions().await.map_err(api)?;
    for r in regions.iter().filter(|r| !r.local) {
        match queue_of(&client.in_region(Some(&r.name)), args).await {
            Ok(mut theirs) => {
                crate::cli::federation::label(&mut theirs, Some(&r.name));
                jobs.extend(theirs);
            }
            Err(e) => eprintln!("warning: region {} left out: {e:#}", r.name),
        }
    }
    Ok(jobs)
}

/// The one partition Slurm's tools show.
pub const PARTITION: &str = "shoal";

/// sacct's Elapsed and Timelimit: `HH:MM:SS`, `D-HH:MM:SS`.
pub fn format_elapsed(s: u64) -> String {
    let (d, h, m, sec) = (s / 86_400, (s / 3600) % 24, (s / 60) % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{sec:02}")
    } else {
        format!("{h:02}:{m:02}:{sec:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gres_forms_are_understood() {
        assert_eq!(parse_gres("gpu:8"), Ok((None, 8)));
        assert_eq!(parse_gres("accelerator:8"), Ok((None, 8)));
        assert_eq!(parse_gres("gpu:H100:4"), Ok((Some("H100".into()), 4)));
        assert_eq!(parse_gres("gres/gpu:2"), Ok((None, 2)));
        assert!(parse_gres("cpu:4").is_err());
        assert!(parse_gres("gpu:x").is_err());
    }

    fn layout_of(flags: &str) -> Result<NodeLayout, String> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            job: JobArgs,
        }
        use clap::Parser;
        let argv = std::iter::once("submit").chain(flags.split_whitespace());
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .job
            .layout()
    }

    fn layout(model: Option<&str>, gpus_per_node: u32, tasks_per_node: u32) -> NodeLayout {
        NodeLayout {
            gpu_model: model.map(str::to_string),
            gpus_per_node,
            tasks_per_node,
        }
    }

    #[test]
    fn tasks_and_gpus_lay_out_per_node() {
        assert_eq!(layout_of(""), Ok(layout(None, 1, 1)));
        assert_eq!(layout_of("-N 2 --gpus-per-node 4"), Ok(layout(None, 4, 1)));
        // One GPU per task unless told otherwise.
        assert_eq!(
            layout_of("-N 2 --ntasks-per-node 4"),
            Ok(layout(None, 4, 4))
        );
        assert_eq!(layout_of("-N 2 -n 4"), Ok(layout(None, 2, 2)));
        assert_eq!(
            layout_of("-N 2 -n 4 --gpus-per-task H100:2"),
            Ok(layout(Some("H100"), 4, 2))
        );
        assert_eq!(layout_of("-N 2 -G 8"), Ok(layout(None, 4, 1)));
        assert_eq!(
            layout_of("-N 2 --gpus a100:8 --ntasks-per-node 2"),
            Ok(layout(Some("a100"), 4, 2))
        );
        assert_eq!(
            layout_of("--gres gpu:H100:8 --ntasks-per-node 8"),
            Ok(layout(Some("H100"), 8, 8))
        );
        assert_eq!(
            layout_of("-N 2 -n 4 --ntasks-per-node 2"),
            Ok(layout(None, 2, 2))
        );
        for (bad, says) in [
            ("-N 2 -n 3", "--ntasks 3"),
            ("-N 2 -n 6 --ntasks-per-node 2", "--ntasks 6"),
            ("-N 3 -G 8", "--gpus 8"),
            ("--ntasks-per-node 0", "--ntasks-per-node"),
            ("-n 0", "--ntasks"),
            ("--gpus-per-task x", "--gpus-per-task"),
            ("--gpus :2", "--gpus"),
            ("--gpus-per-node 2 --gpus 4", "cannot be used with"),
            ("--gres gpu:2 --gpus-per-task 1", "cannot be used with"),
        ] {
            let err = layout_of(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn arrays_read_like_slurm_and_throttle_by_dependencies() {
        assert_eq!(parse_array("0-3"), Ok((vec![0, 1, 2, 3], None)));
        assert_eq!(parse_array("1,3,5%2"), Ok((vec![1, 3, 5], Some(2))));
        assert_eq!(parse_array("0-6:3,1"), Ok((vec![0, 3, 6, 1], None)));
        for bad in ["", "x", "3-1", "0-3%0", "0-3:0", "0-5000", "1%x"] {
            assert!(parse_array(bad).is_err(), "{bad}");
        }
        let base = JobSubmitRequest::shell(1, 1, "true");
        let indices = [4, 5, 6];
        let first = array_task(&base, &indices, 0, Some(2), &[]);
        assert_eq!(first.env["SLURM_ARRAY_TASK_ID"], "4");
        assert!(!first.env.contains_key("SLURM_ARRAY_JOB_ID"));
        assert_eq!(first.dependency, None);
        let third = array_task(&base, &indices, 2, Some(2), &[10, 11]);
        assert_eq!(third.env["SLURM_ARRAY_JOB_ID"], "10");
        assert_eq!(third.env["SLURM_ARRAY_TASK_COUNT"], "3");
        assert_eq!(third.dependency.as_deref(), Some("afterany:10"));
    }

    #[test]
    fn srun_shows_lines_like_slurm() {
        assert_eq!(srun_line(b"--- shoal: starting ---\n", 0, 1, true), None);
        assert_eq!(srun_line(b"hi\n", 1, 1, true), Some(b"1: hi\n".to_vec()));
        assert_eq!(srun_line(b"hi\n", 1, 1, false), Some(b"hi\n".to_vec()));
        assert_eq!(srun_line(b"3: hi\n", 1, 2, true), Some(b"3: hi\n".to_vec()));
        assert_eq!(srun_line(b"3: hi\n", 1, 2, false), Some(b"hi\n".to_vec()));
    }

    #[test]
    fn a_task_reads_its_own_lines_of_its_node_log() {
        let mut t = TaskLines::new(Some(3));
        assert_eq!(
            t.feed(b"--- shoal: job 1 starting ---\n2: a\n3: b\n3: c"),
            b"--- shoal: job 1 starting ---\nb\n"
        );
        assert_eq!(t.feed(b"d\n13: e\n"), b"cd\n");
        let mut whole = TaskLines::new(None);
        assert_eq!(whole.feed(b"2: a\npartial"), b"2: a\npartial");
    }

    #[test]
    fn memory_sizes_read_like_slurm() {
        assert_eq!(parse_mem("512"), Ok(512 << 20), "a bare number is MiB");
        assert_eq!(parse_mem("512M"), Ok(512 << 20));
        assert_eq!(parse_mem("16G"), Ok(16 << 30));
        assert_eq!(parse_mem("16g"), Ok(16 << 30));
        assert_eq!(parse_mem("16GB"), Ok(16 << 30));
        assert_eq!(parse_mem("16GiB"), Ok(16 << 30));
        assert_eq!(parse_mem("2T"), Ok(2 << 40));
        assert_eq!(parse_mem("64K"), Ok(64 << 10));
        assert_eq!(parse_mem("1048576B"), Ok(1 << 20));
        assert_eq!(parse_mem("1048576b"), Ok(1 << 20));
        for bad in [
            "",
            "G",
            "iB",
            "16iB",
            "0",
            "0G",
            "1.5G",
            "16X",
            "-1",
            "16 G",
            "99999999999999T",
        ] {
            assert!(parse_mem(bad).is_err(), "'{bad}' accepted");
        }
        assert_eq!(format_mem(16 << 30), "16G");
        assert_eq!(format_mem(1536 << 20), "1536M");
        assert_eq!(format_mem(1000), "1000B");
        for s in ["512M", "16G", "3T", "7K", "1000B"] {
            assert_eq!(format_mem(parse_mem(s).expect("valid")), s);
        }
    }

    #[test]
    fn tenant_args_understand_none() {
        let args = TenantArgs {
            name: "t".into(),
            max_gpus: Some("none".into()),
            gpu_hours: Some("12.5".into()),
            ..Default::default()
        };
        let req = args.request().expect("valid");
        assert_eq!(req.unset, vec!["max_gpus".to_string()]);
        assert_eq!(req.gpu_hours, Some(12.5));
        let bad = TenantArgs {
            max_gpus: Some("lots".into()),
            ..args
        };
        assert!(bad.request().is_err());
    }

    #[test]
    fn ledger_limit_flags_parse_sizes_negative_priorities_and_none() {
        let args = TenantArgs {
            name: "t".into(),
            max_pending_jobs: Some("5".into()),
            max_objects: Some("none".into()),
            max_manifest_bytes: Some("16MiB".into()),
            max_priority: Some("-3".into()),
            ..Default::default()
        };
        let req = args.request().expect("valid");
        assert_eq!(req.max_pending_jobs, Some(5));
        assert_eq!(req.max_objects, None);
        assert_eq!(req.unset, vec!["max_objects".to_string()]);
        assert_eq!(req.max_manifest_bytes, Some(16 << 20));
        assert_eq!(req.max_priority, Some(-3));
        for bad in [
            TenantArgs {
                max_pending_jobs: Some("-1".into()),
                ..Default::default()
            },
            TenantArgs {
                max_manifest_bytes: Some("lots".into()),
                ..Default::default()
            },
            TenantArgs {
                max_priority: Some("high".into()),
                ..Default::default()
            },
        ] {
            assert!(bad.request().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ledger_columns_mark_limits_set_for_the_tenant() {
        let limits = shoal_sdk::LedgerLimitsInfo {
            pending_jobs: 3,
            max_pending_jobs: 10,
            objects: 1,
            max_objects: 10_000,
            manifest_bytes: 1536,
            max_manifest_bytes: 64 << 20,
            max_priority: 1000,
            overridden: vec!["max_pending_jobs".into()],
        };
        assert_eq!(
            ledger_columns(Some(&limits)),
            ["3/10*", "1/10000", "1.5KiB/64MiB", "1000"]
        );
        assert_eq!(ledger_columns(None), ["-", "-", "-", "-"]);
    }
}
