//! `shoal snapshot save|restore` and `shoal recover --force-new-cluster`:
//! backups of the ledger and disaster recovery (docs/operations.md).

use crate::agent::recovery::{self, RecoveryReport, RestoreOptions};
use crate::backup;
use crate::config::Config;
use clap::{Args, Subcommand};
use serde::Serialize;
use shoal_sdk::Client;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// Save a consistent backup of the ledger from any node (admin token)
    Save {
        /// File to write (atomically, mode 0600)
        file: PathBuf,
    },
    /// Restore a backup into a new, empty --data-dir as a new one-node
    /// cluster (offline; start it with `shoal agent --data-dir D`)
    Restore(RestoreArgs),
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The backup `shoal snapshot save` wrote
    file: PathBuf,
    /// TOML config of the node to be (name, addresses, certificate lifetime) [env: SHOAL_CONFIG]
    #[arg(long)]
    config: Option<PathBuf>,
    /// The new node's name [default: the host name]
    #[arg(long)]
    name: Option<String>,
    /// Its RPC address, as `shoal agent --rpc-addr` will be [default: 0.0.0.0:7071]
    #[arg(long)]
    rpc_addr: Option<SocketAddr>,
    /// Its HTTP API address, as `shoal agent --api-addr` will be [default: 127.0.0.1:7070]
    #[arg(long)]
    api_addr: Option<SocketAddr>,
    /// The address peers use to reach it, as `shoal agent --advertise` will be
    #[arg(long)]
    advertise: Option<IpAddr>,
    /// The cluster CA key, `ca.key` from a surviving voter's data dir, to
    /// keep the cluster's CA [default: make a new CA]
    #[arg(long)]
    ca_key: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct RecoverArgs {
    /// Make this stopped node the only member and voter of its cluster,
    /// from the ledger it holds (a majority of voters lost for good)
    #[arg(long, required = true)]
    force_new_cluster: bool,
    /// Do not ask for confirmation
    #[arg(long)]
    yes: bool,
    /// The cluster CA key from another voter's data dir, when this node
    /// holds none [default: its own ca.key, else a new CA]
    #[arg(long)]
    ca_key: Option<PathBuf>,
    /// TOML config of this node (certificate lifetime) [env: SHOAL_CONFIG]
    #[arg(long)]
    config: Option<PathBuf>,
}

fn load_config(file: Option<&Path>, env: &BTreeMap<String, String>) -> anyhow::Result<Config> {
    let file = file
        .map(Path::to_path_buf)
        .or_else(|| env.get("SHOAL_CONFIG").map(PathBuf::from));
    let cfg = Config::load(file.as_deref(), env).map_err(anyhow::Error::msg)?;
    cfg.validate().map_err(anyhow::Error::msg)?;
    Ok(cfg)
}

/// What `snapshot save --json` prints.
#[derive(Serialize)]
struct Saved {
    path: String,
    bytes: u64,
    index: u64,
    term: u64,
    cluster_id: String,
    checksum: String,
    created_at: String,
    node: String,
}

/// A file that remembers why a write failed (the client reports only that
/// the transfer stopped).
struct Sink {
    file: std::fs::File,
    error: Option<std::io::Error>,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf).inspect_err(|e| {
            self.error = Some(std::io::Error::new(e.kind(), e.to_string()));
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

pub async fn save(client: &Client, file: &Path, json: bool) -> anyhow::Result<()> {
    let name = file
        .file_name()
        .ok_or_else(|| anyhow::anyhow!("{} is not a file name", file.display()))?;
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = save_via(client, file, &tmp).await;
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let (header, bytes) = result?;
    let saved = Saved {
        path: file.display().to_string(),
        bytes,
        index: header.index,
        term: header.term,
        cluster_id: header.cluster_id.clone(),
        checksum: format!("blake3:{}", header.body_blake3),
        created_at: header.created_at.clone(),
        node: header.node.clone(),
    };
    super::emit(json, &saved, || {
        format!(
            "saved the ledger of cluster {} at index {} (term {}) from node {} to {}: {} bytes, blake3 {}\n",
            saved.cluster_id,
            saved.index,
            saved.term,
            saved.node,
            saved.path,
            saved.bytes,
            header.body_blake3
        )
    })
}

async fn save_via(
    client: &Client,
    file: &Path,
    tmp: &Path,
) -> anyhow::Result<(backup::Header, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", tmp.display()))?;
    let mut sink = Sink {
        file: f,
        error: None,
    };
    let fetched = client.snapshot_to(&mut sink).await;
    if let Some(e) = sink.error.take() {
        anyhow::bail!("cannot write {}: {e}", tmp.display());
    }
    let bytes = fetched.map_err(super::api)?;
    sink.file
        .sync_all()
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
    drop(sink);
    // What was written is what a restore will read: check all of it.
    let (header, _) = backup::read_file(tmp)
        .map_err(|e| anyhow::anyhow!("the node sent a snapshot that does not check out: {e}"))?;
    std::fs::rename(tmp, file)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
    if let Some(dir) = file.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok((header, bytes))
}

/// The RPC address peers will reach the agent at, as the agent works it
/// out when it bootstraps: --advertise, else the bound IP, else loopback.
fn advertised(rpc: SocketAddr, advertise: Option<IpAddr>) -> anyhow::Result<SocketAddr> {
    if rpc.port() == 0 {
        anyhow::bail!("--rpc-addr needs a fixed port: peers find the restored node there");
    }
    let ip = advertise.unwrap_or_else(|| {
        if rpc.ip().is_unspecified() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            rpc.ip()
        }
    });
    Ok(SocketAddr::new(ip, rpc.port()))
}

pub fn restore(
    args: &RestoreArgs,
    data_dir: &Path,
    env: &BTreeMap<String, String>,
    json: bool,
) -> anyhow::Result<()> {
    let mut cfg = load_config(args.config.as_deref(), env)?;
    if let Some(n) = &args.name {
        cfg.name = Some(n.clone());
    }
    if let Some(a) = args.rpc_addr {
        cfg.rpc_addr = a;
    }
    if let Some(a) = args.api_addr {
        cfg.api_addr = a;
    }
    if let Some(a) = args.advertise {
        cfg.advertise = Some(a);
    }
    let rpc_addr = advertised(cfg.rpc_addr, cfg.advertise)?;
    let api_addr = if cfg.api_addr.ip().is_unspecified() {
        SocketAddr::new(rpc_addr.ip(), cfg.api_addr.port())
    } else {
        cfg.api_addr
    };
    let report = recovery::restore(&RestoreOptions {
        file: args.file.clone(),
        data_dir: data_dir.to_path_buf(),
        name: cfg.node_name(),
        rpc_addr,
        api_addr,
        api_tls: cfg.api_uses_tls(),
        ca_key: args.ca_key.clone(),
        cert_lifetime: Duration::from_secs(cfg.cert_lifetime_s),
    })
    .map_err(anyhow::Error::msg)?;
    super::emit(json, &report, || {
        let mut out = summary("restored", &report);
        out.push_str(&format!(
            "start it with: shoal agent --data-dir {} --rpc-addr {}\n\
             the admin token of the backed-up cluster still works (the ledger keeps its hash)\n",
            report.data_dir, report.rpc_addr
        ));
        out
    })
}

fn summary(what: &str, r: &RecoveryReport) -> String {
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let ids = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>();
    let mut out = format!(
        "{what} cluster {} at index {} (term {}) into {}: node {} (id {}) is its only member and voter\n",
        r.cluster_id, r.index, r.term, r.data_dir, r.name, r.node_id
    );
    out.push_str(&format!(
        "kept {} jobs, {} tenants, {} mesh:/ objects, {} API tokens\n",
        r.jobs, r.tenants, r.objects, r.api_tokens
    ));
    out.push_str(&format!("members removed: {}\n", list(&r.removed)));
    out.push_str(&format!(
        "jobs requeued: {}; failed (no restarts left): {}\n",
        list(&ids(&r.requeued)),
        list(&ids(&r.failed))
    ));
    if r.join_tokens_revoked > 0 {
        out.push_str(&format!(
            "join tokens revoked: {} (make new ones with `shoal token create`)\n",
            r.join_tokens_revoked
        ));
    }
    if r.ca == "new" {
        out.push_str("cluster CA: new (no key of the old one was at hand); every other node joins with a new join token\n");
    } else {
        out.push_str("cluster CA: kept\n");
    }
    out
}

/// What a forced new cluster does, for the operator to confirm.
fn warning(plan: &recovery::RecoverPlan, data_dir: &Path) -> String {
    let others: Vec<String> = plan
        .others
        .iter()
        .map(|(id, name)| format!("{name} (id {id})"))
        .collect();
    let mut out = format!(
        "This makes node {} (id {}) the only member and voter of cluster {}, from the ledger in {} (index {}).\n",
        plan.identity.name,
        plan.identity.node_id,
        plan.cluster_id(),
        data_dir.display(),
        plan.index()
    );
    if !others.is_empty() {
        out.push_str(&format!(
            "Removed for good: {}. Their data dirs must never start again: they join anew with empty ones.\n",
            others.join(", ")
        ));
    }
    out.push_str(&format!(
        "Writes the lost voters acknowledged that never reached this node are lost; entries this node holds past the last commit it knew of are kept: {}.\n",
        plan.state.past_commit
    ));
    out
}

pub fn recover(
    args: &RecoverArgs,
    data_dir: &Path,
    env: &BTreeMap<String, String>,
    json: bool,
) -> anyhow::Result<()> {
    let cfg = load_config(args.config.as_deref(), env)?;
    let plan = recovery::inspect(data_dir).map_err(anyhow::Error::msg)?;
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            anyhow::bail!(
                "refusing to force a new cluster without confirmation: pass --yes (stdin is not a terminal); nothing was changed"
            );
        }
        eprint!("{}", warning(&plan, data_dir));
        eprint!(
            "Type the cluster id ({}) or 'yes' to go on: ",
            plan.cluster_id()
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin()
            .read_line(&mut answer)
            .map_err(|e| anyhow::anyhow!("cannot read the confirmation: {e}"))?;
        let answer = answer.trim();
        if answer != "yes" && answer != plan.cluster_id() {
            anyhow::bail!("not confirmed; nothing was changed");
        }
    }
    let report = recovery::force_new_cluster(
        plan,
        args.ca_key.as_deref(),
        Duration::from_secs(cfg.cert_lifetime_s),
    )
    .map_err(anyhow::Error::msg)?;
    super::emit(json, &report, || {
        let mut out = summary("recovered", &report);
        if let Some(p) = &report.previous_db {
            out.push_str(&format!("the previous database is kept at {p}\n"));
        }
        out.push_str(&format!(
            "start it with: shoal agent --data-dir {}; then join other nodes with `shoal token create`\n",
            report.data_dir
        ));
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restored_node_is_recorded_where_peers_reach_it() {
        let a = |s: &str| s.parse::<SocketAddr>().expect("addr");
        assert_eq!(
            advertised(a("0.0.0.0:7071"), None).expect("ok"),
            a("127.0.0.1:7071")
        );
        assert_eq!(
            advertised(a("10.1.2.3:7001"), None).expect("ok"),
            a("10.1.2.3:7001")
        );
        assert_eq!(
            advertised(a("0.0.0.0:7071"), Some("10.9.9.9".parse().expect("ip"))).expect("ok"),
            a("10.9.9.9:7071")
        );
        assert!(advertised(a("0.0.0.0:0"), None).is_err());
    }
}
