//! The command-line interface: `shoal agent` runs a node; every other
//! command is a client of some node's HTTP API (INTERFACE.md).

pub mod ca;
pub mod ckpt;
pub mod cp;
pub mod demo;
pub mod dev;
pub mod doctor;
pub mod duration;
pub mod federation;
pub mod install;
pub mod job_args;
pub mod jobs;
pub mod login;
pub mod logs;
pub mod recovery;
pub mod slurm;
pub mod slurm_cmds;
pub mod srun;
pub mod tenants;
pub mod tokens;
pub mod top;

use crate::agent::{Agent, StartMode};
use crate::cli::jobs::{ExitWith, JobArgs, QueueArgs, TenantCmd};
use crate::node::config::{default_data_dir, parse_label, Config};
use clap::{Args, Parser, Subcommand};
use shoal_sdk::{Client, ClientError, NodeInfo, StatusResponse};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(
    name = "shoal",
    version,
    about = "A peer-to-peer compute mesh for AI training",
    args_override_self = true
)]
pub struct Cli {
    /// API of the node to talk to [env: SHOAL_API] [default: the `shoal login` URL, else the local agent's, else http://127.0.0.1:7070]
    #[arg(long, global = true)]
    api: Option<String>,
    /// Refused: a token in the arguments is readable by every process on the
    /// machine. Use SHOAL_TOKEN or --token-file
    #[arg(long, global = true, hide = true)]
    token: Option<String>,
    /// API token from a file only you can read (chmod 600) [env: SHOAL_TOKEN] [default: the login's, else <data-dir>/admin.token]
    #[arg(long, global = true, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Node data dir [env: SHOAL_DATA_DIR]
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Print one JSON document instead of a table
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum GpuCmd {
    /// NODE:IDX takes no work; the job on it checkpoints, stops and runs elsewhere
    Drain {
        target: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// NODE:IDX takes work again
    Undrain { target: String },
}

/// `NODE:IDX` → (node, GPU index).
fn parse_gpu_target(target: &str) -> anyhow::Result<(&str, u32)> {
    let (node, idx) = target
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("'{target}' is not NODE:IDX (e.g. n1:3)"))?;
    let idx = idx
        .parse()
        .map_err(|_| anyhow::anyhow!("'{idx}' in '{target}' is not a GPU index"))?;
    if node.is_empty() {
        anyhow::bail!("'{target}' names no node");
    }
    Ok((node, idx))
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a node
    Agent(Box<AgentArgs>),
    /// Start here: a 4-node mesh on loopback runs a training job, loses a node, and recovers
    Demo,
    /// Run a one-node cluster with simulated GPUs in a temporary dir
    Dev {
        #[arg(long)]
        api_addr: Option<SocketAddr>,
        #[arg(long)]
        sim_gpus: Option<String>,
    },
    /// Join and API tokens
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// Install this binary as a node under systemd: job user, data dir, /etc/shoal/node.toml, unit
    Install(crate::cli::install::InstallArgs),
    /// Stop and remove what `install` put in place; the data stays unless --purge
    Uninstall(crate::cli::install::UninstallArgs),
    /// Record a cluster's API URL, token and CA for this user's later commands
    Login {
        /// The API of any node, e.g. https://10.0.0.5:7070
        url: String,
        /// Accept only a cluster CA with this fingerprint (`shoal status` on a node shows it)
        #[arg(long)]
        ca_fingerprint: Option<String>,
    },
    /// The cluster CA: `ca rotate` replaces it without downtime, `ca status` follows it
    Ca {
        #[command(subcommand)]
        cmd: crate::cli::ca::CaCmd,
    },
    /// Cluster status: leader, term, voters, members
    Status,
    /// Nodes with their GPUs and health
    Nodes,
    /// This node's own view of its peers (gossip): health, estimated RTT, capacity
    Mesh,
    /// Drain a node: its gangs checkpoint (SIGTERM), stop and run elsewhere; no new work lands there
    Drain { node: String },
    /// Return a drained node to service
    Undrain { node: String },
    /// Keep one GPU out of placement, or return it (also one its node found faulty)
    Gpu {
        #[command(subcommand)]
        cmd: GpuCmd,
    },
    /// The cluster's event log: GPU faults, node loss
    Events {
        /// Keep printing new events
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only events of this kind (e.g. audit, gpu_xid, node_down)
        #[arg(long)]
        kind: Option<String>,
    },
    /// Debugging aids
    Debug {
        #[command(subcommand)]
        cmd: DebugCmd,
    },
    /// Prometheus file_sd targets: every alive node's metrics address
    PrometheusSd {
        /// Write the JSON here atomically (for file_sd_configs) instead of stdout
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Node administration
    Node {
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// Submit a gang job; prints its id alone on stdout (REGION:ID when another region took it)
    Submit {
        #[command(flatten)]
        job: JobArgs,
        /// Submit in this peer region, or `auto`: where the gang fits soonest (this region on a tie)
        #[arg(long)]
        region: Option<String>,
        /// Print "Submitted batch job N" like sbatch
        #[arg(long, hide = true)]
        banner: bool,
        /// Wait until the job ends and exit with its exit code (sbatch --wait)
        #[arg(long, hide = true)]
        wait: bool,
        /// Stream every task's output until the job ends, then exit with
        /// its exit code (srun outside a job)
        #[arg(long, hide = true)]
        attach: bool,
        /// With --attach: prefix each line with its task's rank (srun --label)
        #[arg(long, hide = true, requires = "attach")]
        label: bool,
    },
    /// Runs CMD once per task of this rank, each with its own rank and GPUs:
    /// the agent's launcher for --ntasks-per-node, and `srun` inside a job
    #[command(hide = true)]
    ExecTasks {
        /// Prefix each output line with the task's global rank
        #[arg(long, short = 'l')]
        label: bool,
        /// Tasks on this node [default: the job's]
        #[arg(long)]
        ntasks_per_node: Option<u32>,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// The Slurm commands that are more than a translation (squeue,
    /// scancel, sinfo, sacct, scontrol): `shoal slurm NAME -- ARGS`
    #[command(hide = true)]
    Slurm {
        name: String,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Allocate a gang, run CMD here with its environment, release it when CMD ends
    Alloc(JobArgs),
    /// Jobs that are waiting or running (-a for finished ones too)
    Queue(QueueArgs),
    /// One job in detail (JOB is N, or REGION:N for another region's)
    Show {
        job: shoal_sdk::RegionJobId,
        /// The region of a plain N
        #[arg(long)]
        region: Option<String>,
    },
    /// Cancel jobs (N, or REGION:N for another region's)
    Cancel {
        #[arg(required = true)]
        jobs: Vec<shoal_sdk::RegionJobId>,
        /// The region of plain ids
        #[arg(long)]
        region: Option<String>,
        /// Send this signal to every rank instead (USR1, TERM, 10...); the
        /// jobs go on running
        #[arg(short = 's', long, value_name = "SIG")]
        signal: Option<String>,
    },
    /// Stop running jobs and queue them again, from their latest checkpoint
    Requeue {
        #[arg(required = true)]
        jobs: Vec<u64>,
    },
    /// Keep waiting jobs from the scheduler until released
    Hold {
        #[arg(required = true)]
        jobs: Vec<u64>,
    },
    /// Let held jobs be scheduled again
    Release {
        #[arg(required = true)]
        jobs: Vec<u64>,
    },
    /// A rank's output, from the node that ran it (JOB is N or REGION:N)
    Logs {
        job: shoal_sdk::RegionJobId,
        /// The region of a plain N
        #[arg(long)]
        region: Option<String>,
        #[arg(long, default_value_t = 0)]
        rank: u32,
        /// Keep printing until the job ends
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Regions: this one and its peers, with reachability, WAN RTT, GPUs, queue length
    Regions,
    /// Federate regions: `federation join URL` (the other region's token in SHOAL_PEER_TOKEN), `federation leave REGION`
    Federation {
        #[command(subcommand)]
        cmd: crate::cli::federation::FederationCmd,
    },
    /// Replicated copy: local ↔ mesh:/path ↔ mesh:/path
    Cp(crate::cli::cp::CpArgs),
    /// List mesh:/ objects
    Ls {
        #[arg(default_value = "mesh:/")]
        path: String,
    },
    /// One mesh:/ object: size, holders, health
    Stat { path: String },
    /// Remove a mesh:/ object (or everything below a path)
    Rm { path: String },
    /// Checkpoints of a job
    Ckpt {
        #[command(subcommand)]
        cmd: crate::cli::ckpt::CkptCmd,
    },
    /// Tenants (teams, projects) and their limits
    Tenant {
        #[command(subcommand)]
        cmd: TenantCmd,
    },
    /// Slurm user names and the tenant each stands for (`squeue -u NAME`)
    User {
        #[command(subcommand)]
        cmd: crate::cli::jobs::UserCmd,
    },
    /// GPU and GPU-hour usage against each tenant's limits
    Quota {
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Replay a GPU-cluster trace through the real scheduler (discrete-event simulation)
    Sim(SimArgs),
    /// Check this node: data dir, agent, reachability of every member, clock, NVML, disk, cgroups
    Doctor(crate::cli::doctor::DoctorArgs),
    /// Ledger backups: save one from any node, restore one into a new data dir
    Snapshot {
        #[command(subcommand)]
        cmd: crate::cli::recovery::SnapshotCmd,
    },
    /// Disaster recovery on a stopped node when a majority of voters is lost for good
    Recover(crate::cli::recovery::RecoverArgs),
    /// A live terminal view: nodes and GPUs, jobs with reasons, events (--job ID: one job)
    Top(crate::cli::top::TopArgs),
    /// Benchmarks (see docs/BENCHMARKS.md)
    Bench {
        #[command(subcommand)]
        cmd: crate::bench::BenchCmd,
    },
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Print a new join token, alone on stdout (shown this once)
    Create {
        /// Lifetime, e.g. 24h, 30m, 1-00:00:00 [default: 1h]
        #[arg(long)]
        ttl: Option<String>,
        /// Nodes it may admit [default: 1]
        #[arg(long)]
        uses: Option<u32>,
        /// The nodes it admits may become voters (and hold the CA key);
        /// without it they stay learners: they run jobs and follow the
        /// ledger but never vote
        #[arg(long)]
        voter: bool,
    },
    /// Join tokens: id, uses left, expiry, state (never the secret)
    Ls,
    /// Refuse every further join with this join token
    Revoke { id: String },
    /// Print a new API token for users and scripts, alone on stdout (admin
    /// only); `ls`, `revoke`, `rotate-admin` manage them
    Api(ApiTokenArgs),
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
struct ApiTokenArgs {
    #[command(subcommand)]
    cmd: Option<ApiTokenCmd>,
    /// Scope the token to this tenant and those below it: it may only
    /// submit and cancel their jobs and read, write and remove their
    /// mesh:/ objects
    #[arg(long)]
    tenant: Option<String>,
    /// Unique name of the token [default: TENANT-RANDOM]
    #[arg(long)]
    name: Option<String>,
    /// Lifetime, e.g. 30d, 12h [default: until revoked]
    #[arg(long)]
    ttl: Option<String>,
}

#[derive(Subcommand, Debug)]
enum ApiTokenCmd {
    /// API tokens: id, name, tenant, created, expires, last used (never the secret)
    Ls,
    /// Revoke an API token by id or name: it is refused (401) from now on
    Revoke { id: String },
    /// Give the bootstrap admin token a new secret, printed alone on stdout;
    /// the answering node rewrites its <data-dir>/admin.token
    RotateAdmin,
}

#[derive(Subcommand, Debug)]
enum DebugCmd {
    /// Make a simulated GPU of the --api node misbehave: ecc-dbe, xid:CODE, hot, slow, lost, clear
    GpuFault {
        #[arg(long)]
        gpu: u32,
        fault: String,
    },
}

#[derive(Subcommand, Debug)]
enum NodeCmd {
    /// Remove a node (by name or id) from the cluster
    Remove { node: String },
}

#[derive(Args, Debug)]
struct SimArgs {
    /// A trace file, or a directory of trace files replayed together (one tenant per file)
    #[arg(long)]
    trace: PathBuf,
    /// auto, philly, alibaba or simple (submit_time,gpus,duration,tenant,status)
    #[arg(long, default_value = "auto")]
    format: String,
    /// One policy or a comma-separated list: fifo, hdrf, hdrf-preempt
    #[arg(long, default_value = "hdrf")]
    policy: String,
    #[arg(long, default_value_t = 96)]
    nodes: u32,
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    #[arg(long)]
    racks: Option<u32>,
    #[arg(long)]
    zones: Option<u32>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Mean time between failures of one node, e.g. 24h (enables failure injection)
    #[arg(long)]
    fail_mtbf: Option<String>,
    /// Checkpoint interval of every job, e.g. 30m
    #[arg(long)]
    ckpt_interval: Option<String>,
    /// Replay only jobs submitted before this point of the trace, e.g. 30d or 720h
    #[arg(long)]
    until: Option<String>,
    /// Write an SVG with utilization over time and the JCT CDF, policy against policy
    #[arg(long)]
    plot: Option<PathBuf>,
    /// direct (the simulator applies plans itself) or ledger (jobs live in a
    /// real consensus ledger and every decision is a ledger command)
    #[arg(long)]
    driver: Option<String>,
}

#[derive(Args, Debug)]
struct AgentArgs {
    /// TOML config file (see configs/node.example.toml) [env: SHOAL_CONFIG]
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    /// API address, HTTPS unless loopback [default: 0.0.0.0:7070]
    #[arg(long)]
    api_addr: Option<SocketAddr>,
    /// quinn/UDP address for Raft and data [default: 0.0.0.0:7071]
    #[arg(long)]
    rpc_addr: Option<SocketAddr>,
    /// libp2p QUIC/UDP gossip address [default: 0.0.0.0:7072]
    #[arg(long)]
    gossip_addr: Option<SocketAddr>,
    /// Address peers should use to reach this node
    #[arg(long)]
    advertise: Option<IpAddr>,
    /// KEY=VALUE; zone=, rack=, region= are topology labels
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Simulated GPUs instead of NVML, e.g. 8xH100-80GB or 4xA100-40GB,2xL4
    #[arg(long)]
    sim_gpus: Option<String>,
    /// Region name recorded at bootstrap (a region is one cluster) [default: default]
    #[arg(long)]
    region: Option<String>,
    /// text or json
    #[arg(long)]
    log_format: Option<String>,
    /// Create a new cluster with this node as its first member
    #[arg(long, conflicts_with_all = ["join", "join_token_file"])]
    bootstrap: bool,
    /// RPC address (IP:PORT) of any member of the cluster to join, with the
    /// token from --join-token-file or $SHOAL_JOIN_TOKEN
    #[arg(long)]
    join: Option<SocketAddr>,
    /// File holding the join token from `shoal token create`, readable by
    /// its owner only (chmod 600)
    #[arg(long, requires = "join", value_name = "FILE")]
    join_token_file: Option<PathBuf>,
    /// Refused: a secret in the arguments is readable by every process on
    /// the machine (/proc/PID/cmdline)
    #[arg(long, hide = true)]
    join_token: Option<String>,
    /// On SIGINT/SIGTERM, leave the cluster before exiting
    #[arg(long)]
    leave: bool,
}

/// Parses arguments, runs the command, and returns the exit code. Errors are
/// printed as one `error:` line; usage errors exit 2, others 1.
pub fn main() -> i32 {
    let mut argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(crate::executor::LEASE_GUARD_COMMAND) {
        // A rank's lease guard, exec'd by the agent: nothing else to set up.
        return crate::executor::run_lease_guard(&argv[2..]);
    }
    let program = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("shoal")
        .to_string();
    if crate::cli::slurm::NAMES.contains(&program.as_str()) {
        let translated = if program == "srun" {
            crate::cli::srun::translate_here(&argv[1..])
        } else {
            crate::cli::slurm::translate(&program, &argv[1..])
        };
        match translated {
            Ok(t) => {
                for w in t.warnings {
                    eprintln!("{w}");
                }
                argv = t.argv;
            }
            Err(e) => {
                eprintln!("error: {}", e.message);
                return e.code;
            }
        }
    }
    let cli = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    if let Cmd::ExecTasks {
        label,
        ntasks_per_node,
        command,
    } = &cli.command
    {
        // Before any runtime: a plain process that waits for its tasks.
        return exec_tasks(*label, *ntasks_per_node, command);
    }
    let mut builder = if answers_in_one_exchange(&cli.command) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => 0,
        Err(e) if e.downcast_ref::<ExitWith>().is_some() => {
            e.downcast_ref::<ExitWith>().map_or(1, |x| x.0)
        }
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("error: {}", msg.lines().next().unwrap_or("unknown error"));
            1
        }
    }
}

/// Commands that send a request or two and print the answer. They run on
/// a single-threaded runtime: starting a worker thread per core is most of
/// what such a call costs beyond the process itself, and scripts call them
/// in loops (`shoal submit` 500 times: see docs/BENCHMARKS.md).
fn answers_in_one_exchange(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Submit {
            wait: false,
            attach: false,
            ..
        } | Cmd::Queue(_)
            | Cmd::Show { .. }
            | Cmd::Cancel { .. }
            | Cmd::Requeue { .. }
            | Cmd::Hold { .. }
            | Cmd::Release { .. }
            | Cmd::Status
            | Cmd::Nodes
    )
}

/// `shoal exec-tasks`: this rank's tasks, from the rank's environment.
fn exec_tasks(label: bool, per_node: Option<u32>, command: &[String]) -> i32 {
    use crate::executor::tasks;
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let layout = match tasks::NodeTasks::from_env(&env, per_node) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    tasks::survive_group_signals();
    match tasks::run(&layout, command, label) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn env_map() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("SHOAL_"))
        .collect()
}

fn data_dir(cli: &Cli) -> PathBuf {
    cli.data_dir
        .clone()
        .or_else(|| std::env::var_os("SHOAL_DATA_DIR").map(PathBuf::from))
        .unwrap_or_else(default_data_dir)
}

fn client(cli: &Cli) -> anyhow::Result<Client> {
    let dir = data_dir(cli);
    login::connect(&login::Requested {
        api: cli.api.as_deref(),
        token: cli.token.as_deref(),
        data_dir: &dir,
    })
}

/// An API error as the one `error:` line the CLI prints.
pub(crate) fn api(e: shoal_sdk::ClientError) -> anyhow::Error {
    anyhow::anyhow!(e.to_string())
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// `v` as JSON with `--json`, else the human text (printed as is).
fn emit<T: serde::Serialize>(
    json: bool,
    v: &T,
    text: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    if json {
        return print_json(v);
    }
    print!("{}", text());
    Ok(())
}

async fn run(mut cli: Cli) -> anyhow::Result<()> {
    if cli.token.is_some() {
        eprintln!(
            "error: --token puts the token where every process on this machine can read it \
             (/proc/PID/cmdline); set SHOAL_TOKEN (SHOAL_PEER_TOKEN for the other region's in \
             `federation join`), or write it to a file only you can read (chmod 600) and pass \
             --token-file FILE"
        );
        return Err(ExitWith(2).into());
    }
    if let Some(file) = cli.token_file.take() {
        cli.token = Some(read_secret_file(&file, "--token-file")?.trim().to_string());
    }
    match &cli.command {
        Cmd::Agent(args) => run_agent(&cli, args).await,
        Cmd::Demo => {
            init_logging_quiet();
            crate::cli::demo::run().await
        }
        Cmd::Dev { api_addr, sim_gpus } => {
            init_logging("text");
            crate::cli::dev::run(*api_addr, sim_gpus.clone()).await
        }
        Cmd::Token { cmd } => crate::cli::tokens::run(&client(&cli)?, cmd, cli.json).await,
        Cmd::Install(args) => crate::cli::install::install(args, cli.json),
        Cmd::Uninstall(args) => crate::cli::install::uninstall(args, cli.json),
        Cmd::Login {
            url,
            ca_fingerprint,
        } => {
            let token = cli
                .token
                .clone()
                .or_else(|| std::env::var("SHOAL_TOKEN").ok().filter(|t| !t.is_empty()));
            login::login(url, token, ca_fingerprint.as_deref(), cli.json).await
        }
        Cmd::Ca { cmd } => crate::cli::ca::run(&client(&cli)?, cmd, cli.json).await,
        Cmd::Status => {
            let s = client(&cli)?.status().await.map_err(api_err)?;
            if cli.json {
                print_json(&s)
            } else {
                print!("{}", format_status(&s));
                Ok(())
            }
        }
        Cmd::Nodes => {
            let n = client(&cli)?.nodes().await.map_err(api_err)?;
            if cli.json {
                print_json(&n)
            } else {
                print!("{}", format_nodes(&n));
                Ok(())
            }
        }
        Cmd::Mesh => {
            let peers = client(&cli)?.peers().await.map_err(api_err)?;
            if cli.json {
                print_json(&peers)
            } else {
                println!(
                    "{:<5}{:<16}{:<9}{:>10}{:>10}{:>11}{:>7}",
                    "ID", "NAME", "STATE", "HEARD", "RTT", "GPUS", "LOAD"
                );
                for p in &peers {
                    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
                    println!(
                        "{:<5}{:<16}{:<9}{:>10}{:>10}{:>11}{:>7}",
                        p.id,
                        p.name,
                        p.state,
                        opt(p.last_heard_ms.map(|ms| format!("{ms}ms"))),
                        opt(p.rtt_ms.map(|r| format!("{r:.2}ms"))),
                        opt(p
                            .gpus_free
                            .zip(p.gpus_total)
                            .map(|(f, t)| format!("{f}/{t}"))),
                        opt(p.load.map(|l| format!("{:.0}%", l * 100.0))),
                    );
                }
                Ok(())
            }
        }
        Cmd::Node {
            cmd: NodeCmd::Remove { node },
        } => {
            let r = client(&cli)?.remove_node(node).await.map_err(api_err)?;
            if cli.json {
                print_json(&r)
            } else {
                println!("node {node} removed");
                Ok(())
            }
        }
        Cmd::Gpu { cmd } => {
            let (target, drain, reason) = match cmd {
                GpuCmd::Drain { target, reason } => (target, true, reason.as_deref()),
                GpuCmd::Undrain { target } => (target, false, None),
            };
            let (node, gpu) = parse_gpu_target(target)?;
            let r = client(&cli)?
                .drain_gpu(node, gpu, drain, reason)
                .await
                .map_err(api_err)?;
            emit(cli.json, &r, || {
                format!(
                    "GPU {gpu} of {node} {}\n",
                    if drain { "drained" } else { "back in service" }
                )
            })
        }
        Cmd::Drain { node } | Cmd::Undrain { node } => {
            let drain = matches!(cli.command, Cmd::Drain { .. });
            let r = client(&cli)?
                .drain_node(node, drain)
                .await
                .map_err(api_err)?;
            if cli.json {
                print_json(&r)
            } else {
                println!(
                    "node {node} {}",
                    if drain { "drained" } else { "back in service" }
                );
                Ok(())
            }
        }
        Cmd::Events { follow, kind } => {
            crate::cli::jobs::events(&client(&cli)?, *follow, kind.as_deref(), cli.json).await
        }
        Cmd::Debug {
            cmd: DebugCmd::GpuFault { gpu, fault },
        } => {
            let r = client(&cli)?
                .gpu_fault(*gpu, fault)
                .await
                .map_err(api_err)?;
            if cli.json {
                print_json(&r)
            } else {
                println!("injected {fault} into GPU {gpu}");
                Ok(())
            }
        }
        Cmd::PrometheusSd { out } => {
            let c = client(&cli)?;
            let status = c.status().await.map_err(api_err)?;
            let nodes = c.nodes().await.map_err(api_err)?;
            // One target group per scheme: Prometheus scrapes a node's
            // HTTPS API with the cluster CA as its `tls_config.ca_file`.
            let mut by_scheme: BTreeMap<&str, Vec<String>> = BTreeMap::new();
            for n in nodes
                .iter()
                .filter(|n| n.state == shoal_sdk::MemberState::Alive)
            {
                let scheme = if n.api_url.starts_with("https://") {
                    "https"
                } else {
                    "http"
                };
                by_scheme
                    .entry(scheme)
                    .or_default()
                    .push(n.api_addr.clone());
            }
            if by_scheme.is_empty() {
                by_scheme.insert("http", Vec::new());
            }
            let doc: Vec<serde_json::Value> = by_scheme
                .into_iter()
                .map(|(scheme, targets)| {
                    serde_json::json!({
                        "targets": targets,
                        "labels": {
                            "shoal_cluster": status.cluster_id,
                            "__metrics_path__": "/metrics",
                            "__scheme__": scheme,
                        },
                    })
                })
                .collect();
            let text = serde_json::to_string_pretty(&doc)?;
            match out {
                None => {
                    println!("{text}");
                    Ok(())
                }
                Some(path) => {
                    let tmp = path.with_extension("tmp");
                    std::fs::write(&tmp, text.as_bytes())
                        .and_then(|_| std::fs::rename(&tmp, path))
                        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
                }
            }
        }
        Cmd::Submit {
            job,
            banner,
            wait,
            attach,
            label,
            region,
        } => {
            let how = crate::cli::jobs::AfterSubmit {
                banner: *banner,
                wait: *wait,
                attach: attach.then_some(*label),
            };
            let c = client(&cli)?.in_region(region.as_deref());
            crate::cli::jobs::submit(&c, job, cli.json, how).await
        }
        Cmd::Slurm { name, args } => crate::cli::slurm_cmds::run(&client(&cli)?, name, args).await,
        Cmd::ExecTasks { .. } => Err(anyhow::anyhow!("exec-tasks runs without a runtime")),
        Cmd::Alloc(job) => crate::cli::jobs::alloc(&client(&cli)?, job).await,
        Cmd::Queue(args) => crate::cli::jobs::queue(&client(&cli)?, args, cli.json).await,
        Cmd::Hold { jobs } => crate::cli::jobs::hold(&client(&cli)?, jobs, true, cli.json).await,
        Cmd::Release { jobs } => {
            crate::cli::jobs::hold(&client(&cli)?, jobs, false, cli.json).await
        }
        Cmd::Show { job, region } => {
            let (c, id) =
                crate::cli::federation::job_client(&client(&cli)?, job, region.as_deref());
            crate::cli::jobs::show(&c, id, cli.json).await
        }
        Cmd::Requeue { jobs } => crate::cli::jobs::requeue(&client(&cli)?, jobs, cli.json).await,
        Cmd::Cancel {
            jobs,
            region,
            signal,
        } => {
            let base = client(&cli)?;
            for job in jobs {
                let (c, id) = crate::cli::federation::job_client(&base, job, region.as_deref());
                match signal {
                    Some(sig) => crate::cli::jobs::signal(&c, &[id], sig, cli.json).await?,
                    None => crate::cli::jobs::cancel(&c, &[id], cli.json).await?,
                }
            }
            Ok(())
        }
        Cmd::Logs {
            job,
            region,
            rank,
            follow,
        } => {
            let (c, id) =
                crate::cli::federation::job_client(&client(&cli)?, job, region.as_deref());
            crate::cli::jobs::logs(&c, id, *rank, *follow).await
        }
        Cmd::Regions => crate::cli::federation::regions(&client(&cli)?, cli.json).await,
        Cmd::Federation { cmd } => {
            // `--token-file` holds the other region's admin token here;
            // this region's comes from SHOAL_TOKEN, the login or the data
            // dir.
            let dir = data_dir(&cli);
            let local = login::connect(&login::Requested {
                api: cli.api.as_deref(),
                token: None,
                data_dir: &dir,
            })?;
            // Else from SHOAL_PEER_TOKEN: never from the arguments, which
            // every local process can read.
            let peer_token = cli
                .token
                .clone()
                .or_else(|| std::env::var("SHOAL_PEER_TOKEN").ok())
                .filter(|t| !t.trim().is_empty());
            crate::cli::federation::run(&local, cmd, peer_token.as_deref(), cli.json).await
        }
        Cmd::Tenant { cmd } => crate::cli::jobs::tenant(&client(&cli)?, cmd, cli.json).await,
        Cmd::User { cmd } => crate::cli::jobs::user(&client(&cli)?, cmd, cli.json).await,
        Cmd::Cp(args) => crate::cli::cp::cp(&client(&cli)?, args, cli.json).await,
        Cmd::Ls { path } => crate::cli::cp::ls(&client(&cli)?, path, cli.json).await,
        Cmd::Stat { path } => crate::cli::cp::stat(&client(&cli)?, path, cli.json).await,
        Cmd::Rm { path } => crate::cli::cp::rm(&client(&cli)?, path).await,
        Cmd::Ckpt { cmd } => crate::cli::ckpt::run(&client(&cli)?, cmd, cli.json).await,
        Cmd::Quota { tenant } => {
            crate::cli::jobs::quota(&client(&cli)?, tenant.as_deref(), cli.json).await
        }
        Cmd::Snapshot {
            cmd: crate::cli::recovery::SnapshotCmd::Save { file },
        } => crate::cli::recovery::save(&client(&cli)?, file, cli.json).await,
        Cmd::Snapshot {
            cmd: crate::cli::recovery::SnapshotCmd::Restore(args),
        } => crate::cli::recovery::restore(args, &data_dir(&cli), &env_map(), cli.json),
        Cmd::Recover(args) => {
            crate::cli::recovery::recover(args, &data_dir(&cli), &env_map(), cli.json)
        }
        Cmd::Doctor(args) => {
            crate::cli::doctor::run(args, &data_dir(&cli), cli.token.as_deref(), cli.json).await
        }
        Cmd::Sim(args) => run_sim(args, cli.json),
        Cmd::Top(args) => crate::cli::top::run(&client(&cli)?, args).await,
        Cmd::Bench { cmd } => {
            // A chaos run's own report is the point; its nodes' logs of
            // the faults it injects would drown it.
            if matches!(cmd, crate::bench::BenchCmd::Chaos { .. }) {
                init_logging_quiet();
            } else {
                init_logging("text");
            }
            crate::bench::run(cmd, cli.json).await
        }
    }
}

fn api_err(e: ClientError) -> anyhow::Error {
    anyhow::anyhow!(e.to_string())
}

/// Warnings only, unless RUST_LOG says otherwise: for commands whose own
/// output is the point (the demo's timeline).
fn init_logging_quiet() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    // Thread names say which node a line is from: a chaos run's nodes
    // each run on threads named after their slot.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_thread_names(true)
        .try_init();
}

pub fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,openraft=error,shoal_node=info,shoal_consensus=info,shoal_mesh=info",
        )
    });
    use std::io::IsTerminal;
    // Colour only for a person at a terminal; journald (which sets
    // JOURNAL_STREAM) stamps each line itself.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let under_journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let _ = match (format == "json", under_journald) {
        (true, _) => builder.json().try_init(),
        (false, true) => builder.without_time().try_init(),
        (false, false) => builder.try_init(),
    };
}

/// READY=1 for systemd once the ledger is reachable (a leader is known),
/// or after a minute without one, so that a whole cluster booting at once
/// (each node waiting for the others) is not killed as a failed start;
/// STATUS says which.
async fn tell_systemd_when_ready(node: std::sync::Arc<crate::node::Node>) {
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(leader) = node.ledger().current_leader() {
            let name = node
                .ledger()
                .name_of(leader)
                .unwrap_or_else(|| leader.to_string());
            break format!("serving; leader {name}");
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            break "serving; no leader yet (waiting for a quorum of voters)".to_string();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    crate::agent::notify::notify(&format!("READY=1\nSTATUS={status}"));
}

/// Deletes the join token file `[first_start]` named, once the node holds
/// an identity: a spent token does not stay readable on disk. A file the
/// agent may not delete (an install before the token moved to the data
/// dir left it in read-only /etc) is named in a warning.
fn scrub_join_token(file: &Path) {
    match crate::node::identity::scrub_file(file) {
        Ok(true) => tracing::info!(file = %file.display(), "deleted the spent join token"),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            file = %file.display(),
            "cannot delete the spent join token ({e}); delete it by hand: it is no use any more"
        ),
    }
}

/// The join token for `--join`: from `--join-token-file`, else from
/// `SHOAL_JOIN_TOKEN`. Never from the arguments (see [`AgentArgs`]).
fn join_token_of(args: &AgentArgs, env: &BTreeMap<String, String>) -> anyhow::Result<String> {
    if let Some(file) = &args.join_token_file {
        return read_secret_file(file, "--join-token-file");
    }
    match env.get("SHOAL_JOIN_TOKEN").map(|t| t.trim()) {
        Some(token) if !token.is_empty() => Ok(token.to_string()),
        _ => {
            eprintln!(
                "error: --join needs the join token: --join-token-file FILE (chmod 600) or SHOAL_JOIN_TOKEN"
            );
            Err(ExitWith(2).into())
        }
    }
}

/// Reads a secret (a join token) from a file that only its owner may read:
/// one that others can read has already leaked, and is refused so that the
/// operator fixes its mode rather than learn of it from an audit.
pub(crate) fn read_secret_file(file: &Path, what: &str) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(file).map_err(|e| anyhow::anyhow!("{what} {}: {e}", file.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "{what} {} can be read by other users (mode {mode:04o}); chmod 600 it",
            file.display()
        );
    }
    let token = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("{what} {}: {e}", file.display()))?;
    let token = token.trim();
    if token.is_empty() {
        anyhow::bail!("{what} {} is empty", file.display());
    }
    Ok(token.to_string())
}

/// Without `--bootstrap`/`--join`: a restart from the data dir, or, while
/// it holds no identity, what `[first_start]` says.
fn first_start_mode(cfg: &Config) -> anyhow::Result<StartMode> {
    let has_identity = crate::node::identity::load_identity(&cfg.data_dir())
        .map_err(anyhow::Error::msg)?
        .is_some();
    let first = &cfg.first_start;
    Ok(match (&first.join, &first.join_token_file) {
        _ if has_identity => {
            // Spent at the first start; still here if the node stopped
            // between joining and deleting it.
            if let Some(file) = &first.join_token_file {
                scrub_join_token(file);
            }
            StartMode::Restart
        }
        (Some(addr), Some(file)) => StartMode::Join {
            addr: *addr,
            token: read_secret_file(file, "first_start.join_token_file")?,
        },
        _ if first.bootstrap => StartMode::Bootstrap,
        _ => StartMode::Restart,
    })
}

async fn run_agent(cli: &Cli, args: &AgentArgs) -> anyhow::Result<()> {
    if args.join_token.is_some() {
        eprintln!(
            "error: --join-token puts the secret where every process on this machine can read it \
             (/proc/PID/cmdline); write it to a file only you can read (chmod 600) and pass \
             --join-token-file FILE, or set SHOAL_JOIN_TOKEN"
        );
        return Err(ExitWith(2).into());
    }
    let env = env_map();
    let file = args
        .config
        .clone()
        .or_else(|| env.get("SHOAL_CONFIG").map(PathBuf::from));
    let mut cfg = Config::load(file.as_deref(), &env).map_err(anyhow::Error::msg)?;
    if let Some(d) = &cli.data_dir {
        cfg.data_dir = Some(d.clone());
    }
    if let Some(n) = &args.name {
        cfg.name = Some(n.clone());
    }
    if let Some(a) = args.api_addr {
        cfg.api_addr = a;
    }
    if let Some(a) = args.rpc_addr {
        cfg.rpc_addr = a;
    }
    if let Some(a) = args.gossip_addr {
        cfg.gossip_addr = a;
    }
    if let Some(a) = args.advertise {
        cfg.advertise = Some(a);
    }
    for kv in &args.labels {
        let (k, v) = parse_label(kv).map_err(anyhow::Error::msg)?;
        cfg.labels.insert(k, v);
    }
    if let Some(s) = &args.sim_gpus {
        cfg.sim_gpus = Some(s.clone());
    }
    if let Some(r) = &args.region {
        cfg.region = r.clone();
    }
    if let Some(f) = &args.log_format {
        cfg.log_format = f.clone();
    }
    cfg.validate().map_err(anyhow::Error::msg)?;
    init_logging(&cfg.log_format);

    let mode = match (&args.join, args.bootstrap) {
        (Some(addr), _) => StartMode::Join {
            addr: *addr,
            token: join_token_of(args, &env)?,
        },
        (None, true) => StartMode::Bootstrap,
        (None, false) => first_start_mode(&cfg)?,
    };
    let token_file = match (&mode, args.join.is_none()) {
        (StartMode::Join { .. }, true) => cfg.first_start.join_token_file.clone(),
        _ => None,
    };
    let agent = match Agent::start(cfg, mode).await {
        Ok(agent) => agent,
        Err(e @ crate::agent::AgentError::Removed(_)) => {
            eprintln!("error: {e}");
            return Err(crate::cli::jobs::ExitWith(crate::node::removal::EXIT_STATUS).into());
        }
        Err(e) => return Err(e.into()),
    };
    // Joined: the identity is saved, the token spent.
    if let Some(file) = &token_file {
        scrub_join_token(file);
    }
    if let Some(boot) = &agent.bootstrap {
        println!(
            "Cluster bootstrapped; this node is {} (id {}).",
            agent.name(),
            agent.id()
        );
        println!(
            "Admin token written to {}",
            agent
                .data_dir()
                .join(crate::node::identity::ADMIN_TOKEN_FILE)
                .display()
        );
        println!(
            "API {} (cluster CA {}); from another machine: SHOAL_TOKEN=$(cat {}) shoal login {}",
            agent.api_url(),
            boot.join_token.rsplit('.').next().unwrap_or_default(),
            agent
                .data_dir()
                .join(crate::node::identity::ADMIN_TOKEN_FILE)
                .display(),
            agent.api_url(),
        );
        if std::env::var_os("JOURNAL_STREAM").is_some() {
            // journald keeps stdout for good, readable by its groups: no
            // secret goes there.
            println!(
                "Join more nodes with a token from `shoal token create` (the bootstrap's own token is not logged under journald)."
            );
        } else {
            println!(
                "Join one more node, voter-eligible (single use, valid for {}; `shoal token create --uses N [--voter]` makes more):",
                crate::cli::tokens::format_ttl(agent.node().config().join_token_ttl_s)
            );
            println!("  join token: {}", boot.join_token);
            println!(
                "  (umask 077; cat > join.token)   # paste the token: never put it in a command's arguments"
            );
            println!(
                "  shoal agent --join {} --join-token-file join.token",
                agent.rpc_addr()
            );
        }
    }
    tokio::spawn(tell_systemd_when_ready(agent.node().clone()));
    {
        let node = agent.node().clone();
        tokio::spawn(async move { crate::agent::shutdown::undrain_after_restart(&node).await });
    }
    tokio::select! {
        _ = wait_for_signal() => {}
        why = agent.removed_from_cluster() => {
            tracing::error!(reason = %why, "this node was removed from the cluster; exiting for good");
            crate::agent::notify::notify("STOPPING=1");
            agent.shutdown().await;
            eprintln!("error: this node was removed from the cluster ({why}); its data dir never starts again: start with an empty --data-dir and --join to come back as a new member");
            return Err(crate::cli::jobs::ExitWith(crate::node::removal::EXIT_STATUS).into());
        }
        why = agent.ledger_stopped_for_good() => {
            tracing::error!(error = %why, "this node's ledger stopped; exiting so that its supervisor starts it again");
            crate::agent::notify::notify("STOPPING=1");
            agent.shutdown().await;
            anyhow::bail!("this node's ledger stopped: {why}");
        }
    }
    crate::agent::notify::notify("STOPPING=1");
    let cfg = agent.node().config();
    if cfg.agent.shutdown == crate::node::config::ShutdownMode::Drain {
        // The ranks' grace, and time for the gang to be told and to exit.
        let limit = std::time::Duration::from_secs(cfg.executor.stop_grace_s + 30);
        crate::agent::shutdown::drain_before_stop(agent.node(), limit).await;
    }
    if args.leave {
        match agent.leave().await {
            Ok(()) => tracing::info!("left the cluster"),
            Err(e) => tracing::error!(error = %e, "could not leave the cluster cleanly"),
        }
    }
    if agent.node().ledger().is_leader() {
        let lease = std::time::Duration::from_millis(cfg.raft.election_timeout_max_ms);
        let started = std::time::Instant::now();
        match crate::node::handover::hand_over(agent.node().ledger(), lease).await {
            Ok(leader) => tracing::info!(
                leader,
                ms = started.elapsed().as_millis() as u64,
                "handed the leadership over"
            ),
            Err(e) => tracing::warn!(error = %e, "stopping without handing the leadership over"),
        }
    }
    agent.shutdown().await;
    Ok(())
}

pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn format_status(s: &StatusResponse) -> String {
    let name_of = |id: u64| {
        s.members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.name.clone())
            .unwrap_or_else(|| "?".into())
    };
    let mut out = String::new();
    out.push_str(&format!(
        "cluster  {}  (region {})\n",
        s.cluster_id, s.region
    ));
    if !s.ca_fingerprint.is_empty() {
        out.push_str(&format!("ca       {}\n", s.ca_fingerprint));
    }
    match s.leader {
        Some(l) => out.push_str(&format!(
            "leader   {} ({})  term {}  commit {}\n",
            l,
            name_of(l),
            s.term,
            s.commit_index
        )),
        None => out.push_str("leader   none\n"),
    }
    if !s.ca_fingerprint.is_empty() {
        out.push_str(&format!("ca       {}", s.ca_fingerprint));
        match &s.ca_rotation {
            Some(phase) => out.push_str(&format!("  (rotation: {phase}; shoal ca status)\n")),
            None => out.push('\n'),
        }
    }
    out.push_str(&format!(
        "voters   {}\n",
        s.voters
            .iter()
            .map(|v| format!("{v} ({})", name_of(*v)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if let Some(p) = s.effective_protocol {
        out.push_str(&format!(
            "protocol {p}  (the newest version every member speaks)\n"
        ));
    }
    out.push_str(&format!(
        "{:<6}{:<20}{:<10}{:<9}{:<12}{}\n",
        "ID", "NAME", "STATE", "ROLE", "VERSION", "PROTOCOL"
    ));
    for m in &s.members {
        let role = if s.leader == Some(m.id) {
            "leader"
        } else if s.voters.contains(&m.id) {
            "voter"
        } else {
            "learner"
        };
        let dash = |v: &str| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.to_string()
            }
        };
        out.push_str(&format!(
            "{:<6}{:<20}{:<10}{:<9}{:<12}{}\n",
            m.id,
            m.name,
            m.state,
            role,
            dash(&m.version),
            dash(&m.protocol)
        ));
    }
    out
}

fn format_nodes(nodes: &[NodeInfo]) -> String {
    let mut out = format!(
        "{:<5}{:<16}{:<9}{:<23}{:<11}{:<14}{:<6}{:<10}{:<26}{}\n",
        "ID", "NAME", "STATE", "ADDR", "GPUS", "MODEL", "UTIL", "SEEN", "ISOLATION", "LABELS"
    );
    for n in nodes {
        let mut models: Vec<&str> = n.gpus.iter().map(|g| g.model.as_str()).collect();
        models.dedup();
        let labels = n
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let seen = match n.last_seen_ms {
            Some(ms) if ms < 1000 => format!("{ms}ms"),
            Some(ms) => format!("{:.1}s", ms as f64 / 1000.0),
            None => "-".into(),
        };
        out.push_str(&format!(
            "{:<5}{:<16}{:<9}{:<23}{:<11}{:<14}{:<6}{:<10}{:<26}{}\n",
            n.id,
            n.name,
            if n.drained {
                format!("{}*", n.state)
            } else {
                n.state.to_string()
            },
            n.addr,
            format!("{}/{}", n.gpus_free, n.gpus_total),
            if models.is_empty() {
                "-".to_string()
            } else {
                models.join("+")
            },
            n.gpu_util
                .filter(|_| n.gpus_total > 0)
                .map(|u| format!("{:.0}%", u * 100.0))
                .unwrap_or_else(|| "-".into()),
            seen,
            isolation_text(&n.isolation, &n.isolation_controllers),
            if labels.is_empty() {
                "-".to_string()
            } else {
                labels
            }
        ));
    }
    // GPUs that take no work, one line each, so nobody wonders why.
    for n in nodes {
        for g in n
            .gpus
            .iter()
            .filter(|g| g.health != "ok" && !g.health.is_empty())
        {
            out.push_str(&format!(
                "  GPU {}:{} {}: {}\n",
                n.name,
                g.index,
                g.health,
                g.health_reason.as_deref().unwrap_or("-")
            ));
        }
    }
    out
}

/// `none`, `cgroup (kill only)`, `cgroup (memory,cpu,pids)`; `-` for a node
/// that has not said (an older agent).
fn isolation_text(mode: &str, controllers: &[String]) -> String {
    match (mode, controllers) {
        ("", _) => "-".into(),
        ("cgroup", []) => "cgroup (kill only)".into(),
        ("cgroup", c) => format!("cgroup ({})", c.join(",")),
        (other, _) => other.to_string(),
    }
}

fn run_sim(args: &SimArgs, json: bool) -> anyhow::Result<()> {
    use shoal_sim::run::{execute, summary_table, CliOptions};
    use shoal_sim::{Policy, SimConfig};
    let secs = |flag: &str, v: &Option<String>| -> anyhow::Result<Option<u64>> {
        v.as_deref()
            .map(|s| {
                crate::cli::duration::parse_duration(s)
                    .map(|d| d.as_secs())
                    .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
            })
            .transpose()
    };
    let policies = args
        .policy
        .split(',')
        .map(|p| p.trim().parse())
        .collect::<Result<Vec<Policy>, _>>()?;
    if args.nodes == 0 || args.gpus_per_node == 0 {
        anyhow::bail!("--nodes and --gpus-per-node must be positive");
    }
    let mut config = SimConfig::new(args.nodes, args.gpus_per_node, policies[0]);
    if let Some(r) = args.racks {
        config.racks = r;
    }
    if let Some(z) = args.zones {
        config.zones = z;
    }
    config.seed = args.seed;
    config.fail_mtbf_s = secs("--fail-mtbf", &args.fail_mtbf)?;
    config.ckpt_interval_s = secs("--ckpt-interval", &args.ckpt_interval)?;
    if let Some(name) = &args.driver {
        config.driver = shoal_sim::parse_driver(name)
            .ok_or_else(|| anyhow::anyhow!("unknown driver '{name}': use direct or ledger"))?;
    }
    let options = CliOptions {
        trace: args.trace.clone(),
        format: args.format.parse().map_err(anyhow::Error::msg)?,
        policies,
        config,
        until_s: secs("--until", &args.until)?,
        json: None,
        svg: args.plot.clone(),
    };
    let (trace, reports) = execute(&options)?;
    if json {
        if reports.len() == 1 {
            print_json(&reports[0])
        } else {
            print_json(&reports)
        }
    } else {
        println!(
            "{} jobs replayed ({} skipped) on {} nodes x {} GPUs",
            trace.jobs.len(),
            trace.skipped.values().sum::<usize>(),
            args.nodes,
            args.gpus_per_node
        );
        print!("{}", summary_table(&reports));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_reads_as_the_agent_reports_it() {
        let c = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(isolation_text("none", &[]), "none");
        assert_eq!(isolation_text("cgroup", &[]), "cgroup (kill only)");
        assert_eq!(
            isolation_text("cgroup", &c(&["memory", "cpu", "pids"])),
            "cgroup (memory,cpu,pids)"
        );
        assert_eq!(isolation_text("", &[]), "-");
    }
}
