//! `shoal agent`: its flags, the join token (from a file or the environment, never an argument), the start mode, and the agent's life until a signal stops it.

use super::*;

#[derive(Args, Debug)]
pub(super) struct AgentArgs {
    /// TOML config file (see configs/node.example.toml) [env: SHOAL_CONFIG]
    #[arg(long)]
    pub(super) config: Option<PathBuf>,
    #[arg(long)]
    pub(super) name: Option<String>,
    /// API address, HTTPS unless loopback [default: 0.0.0.0:7070]
    #[arg(long)]
    pub(super) api_addr: Option<SocketAddr>,
    /// quinn/UDP address for Raft and data [default: 0.0.0.0:7071]
    #[arg(long)]
    pub(super) rpc_addr: Option<SocketAddr>,
    /// libp2p QUIC/UDP gossip address [default: 0.0.0.0:7072]
    #[arg(long)]
    pub(super) gossip_addr: Option<SocketAddr>,
    /// Address peers should use to reach this node
    #[arg(long)]
    pub(super) advertise: Option<IpAddr>,
    /// KEY=VALUE; zone=, rack=, region= are topology labels
    #[arg(long = "label")]
    pub(super) labels: Vec<String>,
    /// Simulated GPUs instead of NVML, e.g. 8xH100-80GB or 4xA100-40GB,2xL4
    #[arg(long)]
    pub(super) sim_gpus: Option<String>,
    /// Region name recorded at bootstrap (a region is one cluster) [default: default]
    #[arg(long)]
    pub(super) region: Option<String>,
    /// text or json
    #[arg(long)]
    pub(super) log_format: Option<String>,
    /// Create a new cluster with this node as its first member
    #[arg(long, conflicts_with_all = ["join", "join_token_file"])]
    pub(super) bootstrap: bool,
    /// RPC address (IP:PORT) of any member of the cluster to join, with the
    /// token from --join-token-file or $SHOAL_JOIN_TOKEN
    #[arg(long)]
    pub(super) join: Option<SocketAddr>,
    /// File holding the join token from `shoal token create`, readable by
    /// its owner only (chmod 600)
    #[arg(long, requires = "join", value_name = "FILE")]
    pub(super) join_token_file: Option<PathBuf>,
    /// Refused: a secret in the arguments is readable by every process on
    /// the machine (/proc/PID/cmdline)
    #[arg(long, hide = true)]
    pub(super) join_token: Option<String>,
    /// On SIGINT/SIGTERM, leave the cluster before exiting
    #[arg(long)]
    pub(super) leave: bool,
}

/// READY=1 for systemd once the ledger is reachable (a leader is known),
/// or after a minute without one, so that a whole cluster booting at once
/// (each node waiting for the others) is not killed as a failed start;
/// STATUS says which.
pub(super) async fn tell_systemd_when_ready(node: std::sync::Arc<crate::node::Node>) {
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
pub(super) fn scrub_join_token(file: &Path) {
    match crate::identity::scrub_file(file) {
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
pub(super) fn join_token_of(
    args: &AgentArgs,
    env: &BTreeMap<String, String>,
) -> anyhow::Result<String> {
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
pub(super) fn first_start_mode(cfg: &Config) -> anyhow::Result<StartMode> {
    let has_identity = crate::identity::load_identity(&cfg.data_dir())
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

pub(super) async fn run_agent(cli: &Cli, args: &AgentArgs) -> anyhow::Result<()> {
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
            return Err(
                crate::cli::jobs::ExitWith(crate::ledger_client::removal::EXIT_STATUS).into(),
            );
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
                .join(crate::identity::ADMIN_TOKEN_FILE)
                .display()
        );
        println!(
            "API {} (cluster CA {}); from another machine: SHOAL_TOKEN=$(cat {}) shoal login {}",
            agent.api_url(),
            boot.join_token.rsplit('.').next().unwrap_or_default(),
            agent
                .data_dir()
                .join(crate::identity::ADMIN_TOKEN_FILE)
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
            return Err(crate::cli::jobs::ExitWith(crate::ledger_client::removal::EXIT_STATUS).into());
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
    if cfg.agent.shutdown == crate::config::ShutdownMode::Drain {
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
        match crate::ledger_client::handover::hand_over(agent.node().ledger(), lease).await {
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
