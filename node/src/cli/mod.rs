//! The command-line interface: `shoal agent` runs a node; every other
//! command is a client of some node's HTTP API (INTERFACE.md).

pub mod bench;
pub mod ca;
pub mod ckpt;
pub mod cp;
pub mod demo;
pub mod dev;
pub mod doctor;
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
use crate::config::{default_data_dir, parse_label, Config};
use clap::{Args, Parser, Subcommand};
use shoal_sdk::{Client, NodeInfo, StatusResponse};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

mod run_agent;
use run_agent::*;
mod status;
use status::*;
mod sim_cmd;
use sim_cmd::*;

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
        cmd: crate::cli::bench::BenchCmd,
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
    if prints_and_exits(&cli.command) {
        die_quietly_on_closed_stdout();
    }
    let mut builder = if answers_in_one_exchange(&cli.command) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if matches!(cli.command, Cmd::Agent(_)) && std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(agent_runtime_threads());
    }
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

/// Threads of an agent's runtime: at most [`AGENT_RUNTIME_THREADS`]. The
/// runtime would otherwise start one per core, and a GPU server has a
/// hundred or more: each costs the agent memory (about 0.15 MB resident
/// each, measured with 16) and takes nothing from the ranks only while it
/// sleeps. The agent's work is control traffic and checkpoint copies, which
/// a few threads carry: on two cores, three replicas of 1 GiB take 0.7–1.05×
/// the time of three `cp`s (docs/BENCHMARKS.md).
fn agent_runtime_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(AGENT_RUNTIME_THREADS)
}

/// See [`agent_runtime_threads`]; `TOKIO_WORKER_THREADS` overrides it.
const AGENT_RUNTIME_THREADS: usize = 4;

/// Commands that print what they were asked for and exit, so that
/// `shoal queue | head -1` may close their output early. The others serve
/// (an agent, a dev cluster, a benchmark's nodes, the dashboard) or hold
/// an allocation, and must outlive a reader that goes away.
fn prints_and_exits(cmd: &Cmd) -> bool {
    !matches!(
        cmd,
        Cmd::Agent(_)
            | Cmd::Demo
            | Cmd::Dev { .. }
            | Cmd::Bench { .. }
            | Cmd::Top(_)
            | Cmd::Alloc(_)
    )
}

/// The Rust runtime ignores SIGPIPE, so writing to a closed pipe fails and
/// `println!` panics on it. A command whose reader has gone has nothing
/// left to do: it ends the way `cat` and `ls` do, from the signal, with
/// nothing on stderr.
fn die_quietly_on_closed_stdout() {
    // SAFETY: resets one signal's disposition to the default before any
    // thread is started; no handler is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
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
            let s = client(&cli)?.status().await.map_err(api)?;
            if cli.json {
                print_json(&s)
            } else {
                print!("{}", format_status(&s));
                Ok(())
            }
        }
        Cmd::Nodes => {
            let n = client(&cli)?.nodes().await.map_err(api)?;
            if cli.json {
                print_json(&n)
            } else {
                print!("{}", format_nodes(&n));
                Ok(())
            }
        }
        Cmd::Mesh => {
            let peers = client(&cli)?.peers().await.map_err(api)?;
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
            let r = client(&cli)?.remove_node(node).await.map_err(api)?;
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
                .map_err(api)?;
            emit(cli.json, &r, || {
                format!(
                    "GPU {gpu} of {node} {}\n",
                    if drain { "drained" } else { "back in service" }
                )
            })
        }
        Cmd::Drain { node } | Cmd::Undrain { node } => {
            let drain = matches!(cli.command, Cmd::Drain { .. });
            let r = client(&cli)?.drain_node(node, drain).await.map_err(api)?;
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
            let r = client(&cli)?.gpu_fault(*gpu, fault).await.map_err(api)?;
            if cli.json {
                print_json(&r)
            } else {
                println!("injected {fault} into GPU {gpu}");
                Ok(())
            }
        }
        Cmd::PrometheusSd { out } => {
            let c = client(&cli)?;
            let status = c.status().await.map_err(api)?;
            let nodes = c.nodes().await.map_err(api)?;
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
            if matches!(cmd, crate::cli::bench::BenchCmd::Chaos { .. }) {
                init_logging_quiet();
            } else {
                init_logging("text");
            }
            crate::cli::bench::run(cmd, cli.json).await
        }
    }
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
