//! `shoal install` and `shoal uninstall`: one command takes a machine from
//! nothing to a node under systemd (the binary, the unprivileged job user,
//! the data dir, /etc/shoal/node.toml with how the node first starts, the
//! hardened unit), and one takes it back, keeping the data unless `--purge`.
//! `--root DIR` does the same inside an image or a test's directory and
//! starts nothing.

use crate::config::Config;
use crate::identity::{self, write_private};
use clap::Args;
use serde::Serialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The unit `shoal install` writes (also `configs/shoal.service`).
pub const UNIT: &str = include_str!("../../../configs/shoal.service");
const BIN: &str = "usr/local/bin/shoal";
const CONFIG: &str = "etc/shoal/node.toml";
/// Where installs before the token moved to the data dir kept it (the
/// agent cannot delete it there: /etc is read-only to the unit).
const LEGACY_JOIN_TOKEN: &str = "etc/shoal/join.token";
/// The join token, in the data dir (0700, the agent's): the agent deletes
/// it once the node has joined ([`crate::identity::JOIN_TOKEN_FILE`]).
const JOIN_TOKEN: &str = crate::identity::JOIN_TOKEN_FILE;
const UNIT_PATH: &str = "etc/systemd/system/shoal.service";
const DEFAULT_DATA_DIR: &str = "/var/lib/shoal";

#[derive(Args, Debug)]
pub struct InstallArgs {
    /// Node settings to install as /etc/shoal/node.toml [default: the built-in defaults]
    #[arg(long)]
    config: Option<PathBuf>,
    /// The node creates a new cluster at its first start
    #[arg(long, conflicts_with_all = ["join", "join_token_file"])]
    bootstrap: bool,
    /// RPC address (IP:PORT) of a member to join at the first start
    #[arg(long, requires = "join_token_file")]
    join: Option<SocketAddr>,
    /// File holding the join token from `shoal token create`, readable by
    /// its owner only (copied 0600 into the data dir until its use)
    #[arg(long, requires = "join", value_name = "FILE")]
    join_token_file: Option<PathBuf>,
    /// Refused: a secret in the arguments is readable by every process on
    /// the machine (/proc/PID/cmdline)
    #[arg(long, hide = true)]
    join_token: Option<String>,
    /// Install into this directory instead of / (an image, a test); starts nothing
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// Write everything, but neither enable nor start the service
    #[arg(long)]
    no_start: bool,
}

#[derive(Args, Debug)]
pub struct UninstallArgs {
    /// Also delete the data dir and the jobs dir (the node's identity, its
    /// ledger copy and checkpoint replicas) and the job user
    #[arg(long)]
    purge: bool,
    #[arg(long, default_value = "/")]
    root: PathBuf,
}

#[derive(Serialize)]
struct Installed {
    binary: String,
    config: String,
    unit: String,
    data_dir: String,
    job_user: String,
    started: bool,
    next: Vec<String>,
}

fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

fn live(root: &Path) -> bool {
    root == Path::new("/")
}

fn require_root() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!("install and uninstall change the system: run them as root");
    }
    Ok(())
}

/// Whether systemd runs this machine (so `systemctl` can start units).
fn systemd_runs() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

fn systemctl(args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("systemctl")
        .args(args)
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run systemctl: {e}"))?;
    if !status.success() {
        anyhow::bail!("systemctl {} failed: {status}", args.join(" "));
    }
    Ok(())
}

/// The settings to install: the given file (checked like the agent checks
/// it) or the defaults, with `[first_start]` saying how the node begins.
fn node_toml(args: &InstallArgs) -> anyhow::Result<(String, PathBuf)> {
    let mut table: toml::Table = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            text.parse().map_err(|e: toml::de::Error| {
                anyhow::anyhow!("{}: {}", path.display(), e.message())
            })?
        }
        None => toml::Table::new(),
    };
    let data_dir = table
        .get("data_dir")
        .and_then(|v| v.as_str())
        .unwrap_or(DEFAULT_DATA_DIR)
        .to_string();
    table.insert("data_dir".into(), toml::Value::String(data_dir.clone()));
    let mut first = toml::Table::new();
    if args.bootstrap {
        first.insert("bootstrap".into(), toml::Value::Boolean(true));
    }
    if let Some(addr) = args.join {
        first.insert("join".into(), toml::Value::String(addr.to_string()));
        first.insert(
            "join_token_file".into(),
            toml::Value::String(Path::new(&data_dir).join(JOIN_TOKEN).display().to_string()),
        );
    }
    if !first.is_empty() {
        table.insert("first_start".into(), toml::Value::Table(first));
    }
    let text = format!(
        "# Written by `shoal install`. Every key, with its default: configs/node.example.toml.\n{}",
        toml::to_string(&table)?
    );
    // The agent will refuse what does not load; say so now, not at boot.
    let cfg: Config =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("the node settings: {}", e.message()))?;
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("the node settings: {e}"))?;
    Ok((text, PathBuf::from(data_dir)))
}

/// A directory install may own: absolute, no `..`, at least two levels
/// below `/` (`/var/lib/shoal`, never `/`, `/var` or `/data`).
fn ownable(dir: &Path) -> anyhow::Result<()> {
    use std::path::Component;
    let normal = dir
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    let sound = dir.is_absolute() && dir.components().all(|c| !matches!(c, Component::ParentDir));
    if !sound || normal < 2 {
        anyhow::bail!(
            "{} cannot be a node's directory: give an absolute path at least two levels deep (e.g. /var/lib/shoal)",
            dir.display()
        );
    }
    Ok(())
}

fn copy_binary(to: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let me =
        std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find this binary: {e}"))?;
    let tmp = to.with_extension("new");
    std::fs::copy(&me, &tmp)
        .map_err(|e| anyhow::anyhow!("cannot copy {} to {}: {e}", me.display(), tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    // A rename replaces a running binary without touching the old inode.
    std::fs::rename(&tmp, to)
        .map_err(|e| anyhow::anyhow!("cannot install {}: {e}", to.display()))?;
    Ok(())
}

fn create_dir(path: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(path)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))
}

pub fn install(args: &InstallArgs, json: bool) -> anyhow::Result<()> {
    require_root()?;
    let root = &args.root;
    let installed = under(root, CONFIG);
    let starting = args.bootstrap || args.join.is_some();
    // An upgrade keeps the node's settings as they are.
    let keep = !starting && args.config.is_none() && installed.exists();
    let (text, data_dir) = if keep {
        let text = std::fs::read_to_string(&installed)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", installed.display()))?;
        let cfg: Config = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {}", installed.display(), e.message()))?;
        let dir = cfg
            .data_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        (text, dir)
    } else {
        node_toml(args)?
    };
    ownable(&data_dir)?;
    let data_dir_in_root = under(root, &data_dir.display().to_string());
    let has_identity = identity::load_identity(&data_dir_in_root)
        .map_err(anyhow::Error::msg)?
        .is_some();
    if args.join_token.is_some() {
        anyhow::bail!(
            "--join-token puts the secret where every process on this machine can read it \
             (/proc/PID/cmdline); write it to a file only you can read (chmod 600) and pass \
             --join-token-file FILE"
        );
    }
    let token = args
        .join_token_file
        .as_deref()
        .map(|file| crate::cli::read_secret_file(file, "--join-token-file"))
        .transpose()?;
    // A join token from an earlier install that has not started yet is ours.
    let foreign = !has_identity
        && std::fs::read_dir(&data_dir_in_root)
            .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.file_name() != JOIN_TOKEN)));
    if foreign {
        anyhow::bail!(
            "{} is not empty and holds no node: give the node a directory of its own",
            data_dir_in_root.display()
        );
    }
    if !starting && !has_identity {
        anyhow::bail!(
            "say how this node starts: --bootstrap (a new cluster) or --join HOST:PORT --join-token-file FILE"
        );
    }
    if has_identity && starting {
        anyhow::bail!(
            "{} already holds a node identity: reinstall without --bootstrap/--join to upgrade it, or `shoal uninstall --purge` first",
            data_dir_in_root.display()
        );
    }
    // Everything is checked; now write, the binary first.
    for dir in ["usr/local/bin", "etc/shoal", "etc/systemd/system"] {
        create_dir(&under(root, dir))?;
    }
    copy_binary(&under(root, BIN))?;
    if let Some(parent) = data_dir_in_root.parent() {
        create_dir(parent)?;
    }
    identity::ensure_data_dir(&data_dir_in_root)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", data_dir_in_root.display()))?;
    if let Some(token) = &token {
        write_private(
            &data_dir_in_root.join(JOIN_TOKEN),
            token.trim().as_bytes(),
            0o600,
        )?;
    }
    if !keep {
        write_private(&installed, text.as_bytes(), 0o644)?;
    }
    write_private(&under(root, UNIT_PATH), UNIT.as_bytes(), 0o644)?;
    // Ranks run as a uid of their tenant's own, which the agent gives on
    // first use (no passwd entry): nothing to create here.
    let job_user = format!(
        "one uid per tenant from {} (in {})",
        crate::executor::account::TENANT_UID_FIRST,
        crate::executor::account::TENANT_UIDS_FILE
    );
    let mut next = Vec::new();
    let started = if live(root) && !args.no_start && systemd_runs() {
        systemctl(&["daemon-reload"])?;
        systemctl(&["enable", "--now", "shoal.service"])?;
        true
    } else {
        if live(root) {
            next.push("systemctl daemon-reload && systemctl enable --now shoal".to_string());
        }
        false
    };
    if started && args.bootstrap {
        next.push(format!(
            "SHOAL_TOKEN=$(cat {}/admin.token) shoal login https://<this host>:7070",
            data_dir.display()
        ));
    }
    let out = Installed {
        binary: under(root, BIN).display().to_string(),
        config: under(root, CONFIG).display().to_string(),
        unit: under(root, UNIT_PATH).display().to_string(),
        data_dir: data_dir_in_root.display().to_string(),
        job_user,
        started,
        next,
    };
    super::emit(json, &out, || {
        let mut t = format!(
            "installed {}\nsettings  {}\nunit      {}\ndata dir  {} (0700)\n",
            out.binary, out.config, out.unit, out.data_dir
        );
        if !out.job_user.is_empty() {
            t.push_str(&format!("job users {}\n", out.job_user));
        }
        t.push_str(if out.started {
            "shoal.service is enabled and running (journalctl -u shoal)\n"
        } else {
            "not started\n"
        });
        for n in &out.next {
            t.push_str(&format!("next: {n}\n"));
        }
        t
    })
}

/// Deletes a data dir only if it is a node's (it holds an identity) or
/// empty: a settings file naming some other directory deletes nothing.
fn purge_data_dir(dir: &Path, removed: &mut Vec<String>) -> anyhow::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let is_node = dir.join(identity::IDENTITY_FILE).exists();
    let empty = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    if !is_node && !empty {
        anyhow::bail!(
            "{} holds no node identity: not deleting it (remove it by hand if it is the node's)",
            dir.display()
        );
    }
    std::fs::remove_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", dir.display()))?;
    removed.push(dir.display().to_string());
    Ok(())
}

/// Deletes what the agent put in a jobs dir (numbered job directories and
/// the ranks' CA file), then the dir if that leaves it empty.
fn purge_jobs_dir(dir: &Path, removed: &mut Vec<String>) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ours = name == "cluster-ca.pem"
            || (!name.is_empty() && name.chars().all(|c| c.is_ascii_digit()));
        if !ours {
            continue;
        }
        let path = entry.path();
        let gone = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        gone.map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", path.display()))?;
    }
    if std::fs::remove_dir(dir).is_ok() {
        removed.push(dir.display().to_string());
    }
    Ok(())
}

pub fn uninstall(args: &UninstallArgs, json: bool) -> anyhow::Result<()> {
    require_root()?;
    let root = &args.root;
    // The installed settings say where the data is; settings that do not
    // load are an error, not a reason to guess.
    let mut cfg = match std::fs::read_to_string(under(root, CONFIG)) {
        Ok(text) => toml::from_str::<Config>(&text)
            .map_err(|e| anyhow::anyhow!("{}: {}", under(root, CONFIG).display(), e.message()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Config::default(),
        Err(e) => anyhow::bail!("cannot read {}: {e}", under(root, CONFIG).display()),
    };
    if cfg.data_dir.is_none() {
        cfg.data_dir = Some(PathBuf::from(DEFAULT_DATA_DIR));
    }
    let (data_dir, jobs_dir) = (cfg.data_dir(), cfg.jobs_dir());
    if args.purge {
        ownable(&data_dir)?;
        ownable(&jobs_dir)?;
    }
    if live(root) && systemd_runs() && under(root, UNIT_PATH).exists() {
        // Stopping stops the ranks with the unit (their grace, then SIGKILL).
        systemctl(&["disable", "--now", "shoal.service"])?;
    }
    let mut removed = Vec::new();
    // The settings go last: a purge that fails can be run again.
    let data = under(root, &data_dir.display().to_string());
    // A join token never used (the node never started) goes even when the
    // data dir stays.
    for p in [
        under(root, UNIT_PATH),
        under(root, BIN),
        under(root, LEGACY_JOIN_TOKEN),
        data.join(JOIN_TOKEN),
    ] {
        match std::fs::remove_file(&p) {
            Ok(()) => removed.push(p.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => anyhow::bail!("cannot remove {}: {e}", p.display()),
        }
    }
    if live(root) && systemd_runs() {
        let _ = systemctl(&["daemon-reload"]);
    }
    let mut kept = Vec::new();
    let jobs = under(root, &jobs_dir.display().to_string());
    for p in [&data, &jobs] {
        if p.exists() && !args.purge {
            kept.push(p.display().to_string());
        }
    }
    if args.purge {
        purge_data_dir(&data, &mut removed)?;
        purge_jobs_dir(&jobs, &mut removed)?;
    }
    let config = under(root, CONFIG);
    match std::fs::remove_file(&config) {
        Ok(()) => removed.push(config.display().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("cannot remove {}: {e}", config.display()),
    }
    let _ = std::fs::remove_dir(under(root, "etc/shoal"));
    let out = serde_json::json!({ "removed": removed, "kept": kept });
    super::emit(json, &out, || {
        let mut t = String::new();
        for r in &removed {
            t.push_str(&format!("removed {r}\n"));
        }
        for k in &kept {
            t.push_str(&format!("kept    {k} (--purge deletes it)\n"));
        }
        t
    })
}
