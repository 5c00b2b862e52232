//! The flags of `submit`, `alloc` and `queue` (Slurm's names included),
//! and their parsers: time, memory, GRES, arrays.

use clap::Args;
pub use shoal_sdk::units::{format_mem, parse_duration, parse_mem};
use shoal_sdk::JobSubmitRequest;
use std::collections::BTreeMap;

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

pub(crate) fn parse_kv(s: &str, what: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{what} must be KEY=VALUE, not '{s}'")),
    }
}

/// `[TYPE:]COUNT`, as `-G/--gpus` and `--gpus-per-task` take it.
pub(crate) fn parse_typed_count(flag: &str, s: &str) -> Result<(Option<String>, u32), String> {
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
                let names = crate::hostlist::expand_hostlist(list)
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
                    crate::views::parse_ckpt_replicas(Some(text))?;
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
