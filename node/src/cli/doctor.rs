//! `shoal doctor`: run on a node, checks what the node needs from its host
//! and its network and prints one line per check (`--json`: a list of
//! `{check, ok, detail}`); exits 1 when any check fails.
//!
//! It reads what the agent on the data dir published (`agent.json`) and,
//! where it may, the agent's own command line and environment, so that it
//! judges the configuration the agent really runs with.

use crate::config::{CgroupMode, Config};
use crate::executor::cgroup;
use crate::identity::{self, RuntimeInfo};
use crate::proto;
use clap::Args;
use serde::Serialize;
use shoal_sdk::{Client, NodeInfo, PeerView};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long one probe of one member may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Clock skew above this fails.
const MAX_SKEW_MS: i64 = 2_000;
/// A filesystem with less free than this, or than [`MIN_FREE_PCT`], fails.
const MIN_FREE_BYTES: u64 = 1 << 30;
const MIN_FREE_PCT: f64 = 5.0;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The node's TOML config [default: the running agent's --config, else SHOAL_CONFIG]
    #[arg(long)]
    config: Option<PathBuf>,
}

/// One check's outcome.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub check: String,
    pub ok: bool,
    pub detail: String,
}

impl Check {
    fn new(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Check {
        Check {
            check: name.into(),
            ok,
            detail: detail.into(),
        }
    }
}

/// The agent on the data dir, as far as it can be seen from here.
struct AgentProc {
    info: RuntimeInfo,
    alive: bool,
    /// Its effective uid (`/proc/PID/status`).
    uid: Option<u32>,
    /// Its command line and SHOAL_ environment, where readable.
    argv: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
}

fn read_agent(data_dir: &Path) -> Result<AgentProc, String> {
    let path = data_dir.join(identity::RUNTIME_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("no running agent published {} ({e})", path.display()))?;
    let info: RuntimeInfo =
        serde_json::from_str(&text).map_err(|e| format!("{} is not valid: {e}", path.display()))?;
    let proc_dir = PathBuf::from(format!("/proc/{}", info.pid));
    let alive = info.pid > 0 && {
        // SAFETY: kill with signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(info.pid as libc::pid_t, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    };
    let status = std::fs::read_to_string(proc_dir.join("status")).ok();
    let uid = status.as_deref().and_then(effective_uid);
    let argv = std::fs::read(proc_dir.join("cmdline"))
        .ok()
        .map(|b| nul_split(&b));
    let env = std::fs::read(proc_dir.join("environ")).ok().map(|b| {
        nul_split(&b)
            .into_iter()
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                k.starts_with("SHOAL_")
                    .then(|| (k.to_string(), v.to_string()))
            })
            .collect()
    });
    Ok(AgentProc {
        info,
        alive,
        uid,
        argv: argv.filter(|a| !a.is_empty()).filter(|_| alive),
        env: env.filter(|_| alive),
    })
}

fn nul_split(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The effective uid of a `/proc/PID/status` (`Uid: real effective ...`).
pub fn effective_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The value of `--flag VALUE` or `--flag=VALUE` in `argv`.
pub fn flag_value(argv: &[String], flag: &str) -> Option<String> {
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if a == flag {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            return Some(v.to_string());
        }
    }
    None
}

/// `shoal doctor`.
pub async fn run(
    args: &DoctorArgs,
    data_dir: &Path,
    token: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let agent = read_agent(data_dir);
    let agent_ok = agent.as_ref().ok();
    let argv = agent_ok.and_then(|a| a.argv.clone()).unwrap_or_default();
    let env = agent_ok
        .and_then(|a| a.env.clone())
        .unwrap_or_else(super::env_map);
    let config_file = args
        .config
        .clone()
        .or_else(|| flag_value(&argv, "--config").map(PathBuf::from))
        .or_else(|| env.get("SHOAL_CONFIG").map(PathBuf::from));
    let mut checks = Vec::new();
    let cfg = match Config::load(config_file.as_deref(), &env) {
        Ok(mut c) => {
            c.data_dir = Some(data_dir.to_path_buf());
            if let Some(s) = flag_value(&argv, "--sim-gpus") {
                c.sim_gpus = Some(s);
            }
            c
        }
        Err(e) => {
            checks.push(Check::new("config", false, e));
            Config {
                data_dir: Some(data_dir.to_path_buf()),
                ..Config::default()
            }
        }
    };

    checks.push(check_data_dir(data_dir, agent_ok.and_then(|a| a.uid)));
    let api = match &agent {
        Ok(a) => check_agent(a, data_dir, token).await,
        Err(e) => (Check::new("agent", false, e.clone()), None),
    };
    let (agent_check, api) = api;
    checks.push(agent_check);
    let mut nodes: Option<Vec<NodeInfo>> = None;
    if let Some(client) = &api {
        match member_views(client).await {
            Ok((members, peers)) => {
                let me = agent_ok.map(|a| a.info.node_id);
                let (reach, clock) = check_members(data_dir, &members, &peers, me).await;
                checks.extend(reach);
                checks.push(clock);
                nodes = Some(members);
            }
            Err(e) => checks.push(Check::new(
                "reach",
                false,
                format!("cannot list the members through the local agent: {e}"),
            )),
        }
    } else {
        checks.push(Check::new(
            "reach",
            false,
            "not checked: the local agent's API does not answer",
        ));
    }
    let me = agent_ok.and_then(|a| {
        nodes
            .as_ref()
            .and_then(|n| n.iter().find(|n| n.id == a.info.node_id).cloned())
    });
    checks.push(check_nvml(&cfg, me.as_ref()).await);
    checks.push(check_disk(&cfg.data_dir(), &cfg.jobs_dir()));
    checks.push(check_cgroups(&cfg, agent_ok, me.as_ref()));

    let failed = checks.iter().filter(|c| !c.ok).count();
    if json {
        super::print_json(&checks)?;
    } else {
        print!("{}", format_table(&checks));
    }
    if failed > 0 {
        eprintln!("{failed} of {} checks failed", checks.len());
        return Err(super::jobs::ExitWith(1).into());
    }
    eprintln!("all {} checks passed", checks.len());
    Ok(())
}

pub fn format_table(checks: &[Check]) -> String {
    let width = checks
        .iter()
        .map(|c| c.check.len())
        .max()
        .unwrap_or(0)
        .max(10);
    checks
        .iter()
        .map(|c| {
            format!(
                "{:<6}{:<width$} {}\n",
                if c.ok { "ok" } else { "FAIL" },
                c.check,
                c.detail,
            )
        })
        .collect()
}

// ---- data dir -------------------------------------------------------------

/// What is wrong with a data dir's entry of `mode` (permission bits): a
/// directory must be 0700, a file 0600 (or stricter).
pub fn mode_problem(mode: u32, is_dir: bool) -> Option<String> {
    let perm = mode & 0o7777;
    let (want, bad) = if is_dir {
        (0o700, perm != 0o700)
    } else {
        (0o600, perm & 0o177 != 0)
    };
    bad.then(|| format!("is {perm:04o}, must be {want:04o}"))
}

fn check_data_dir(dir: &Path, agent_uid: Option<u32>) -> Check {
    let name = "data-dir";
    let meta = match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => m,
        Ok(_) => return Check::new(name, false, format!("{} is not a directory", dir.display())),
        Err(e) => return Check::new(name, false, format!("{}: {e}", dir.display())),
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let owner_ok = meta.uid() == me || Some(meta.uid()) == agent_uid;
    let mut problems = Vec::new();
    if let Some(p) = mode_problem(meta.mode(), true) {
        problems.push(format!("{} {p}", dir.display()));
    }
    if !owner_ok {
        problems.push(format!(
            "{} is owned by uid {}, not by uid {}{}",
            dir.display(),
            meta.uid(),
            agent_uid.unwrap_or(me),
            if agent_uid.is_some() {
                " (the agent's)"
            } else {
                ""
            }
        ));
    }
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let mut offenders = Vec::new();
            for e in entries.flatten() {
                let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                    continue;
                };
                if m.file_type().is_symlink() {
                    continue;
                }
                // Files only: a directory below (chunks/) is shut off by
                // the data dir's own 0700.
                if !m.is_file() {
                    continue;
                }
                if let Some(p) = mode_problem(m.mode(), false) {
                    offenders.push(format!("{} {p}", e.file_name().to_string_lossy()));
                }
            }
            offenders.sort();
            problems.extend(offenders);
        }
        Err(e) => problems.push(format!("cannot list {}: {e}", dir.display())),
    }
    if problems.is_empty() {
        Check::new(
            name,
            true,
            format!(
                "{} is 0700, its files 0600, owner uid {}",
                dir.display(),
                meta.uid()
            ),
        )
    } else {
        Check::new(name, false, problems.join("; "))
    }
}

// ---- agent ----------------------------------------------------------------

async fn check_agent(
    agent: &AgentProc,
    data_dir: &Path,
    token: Option<&str>,
) -> (Check, Option<Client>) {
    let name = "agent";
    let url = &agent.info.api_url;
    if !agent.alive {
        return (
            Check::new(
                name,
                false,
                format!(
                    "agent.json names pid {}, which is not running",
                    agent.info.pid
                ),
            ),
            None,
        );
    }
    let client = match super::login::connect(&super::login::Requested {
        api: Some(url),
        token,
        data_dir,
    }) {
        Ok(c) => c,
        Err(e) => return (Check::new(name, false, format!("{e:#}")), None),
    };
    match tokio::time::timeout(PROBE_TIMEOUT, client.get_text("/health")).await {
        Ok(Ok(_)) => (
            Check::new(
                name,
                true,
                format!(
                    "{} (pid {}) answers /health at {url}",
                    agent.info.name, agent.info.pid
                ),
            ),
            Some(client),
        ),
        Ok(Err(e)) => (
            Check::new(
                name,
                false,
                format!("pid {} runs, but {url}/health: {e}", agent.info.pid),
            ),
            None,
        ),
        Err(_) => (
            Check::new(
                name,
                false,
                format!(
                    "pid {} runs, but {url}/health gave no answer in {} s",
                    agent.info.pid,
                    PROBE_TIMEOUT.as_secs()
                ),
            ),
            None,
        ),
    }
}

// ---- members: reachability and clock -------------------------------------

async fn member_views(client: &Client) -> anyhow::Result<(Vec<NodeInfo>, Vec<PeerView>)> {
    let nodes = tokio::time::timeout(PROBE_TIMEOUT * 2, client.nodes())
        .await
        .map_err(|_| anyhow::anyhow!("no answer in {} s", PROBE_TIMEOUT.as_secs() * 2))?
        .map_err(super::api)?;
    let peers = tokio::time::timeout(PROBE_TIMEOUT, client.peers())
        .await
        .map_err(|_| anyhow::anyhow!("no answer in {} s", PROBE_TIMEOUT.as_secs()))?
        .map_err(super::api)?;
    Ok((nodes, peers))
}

/// A member's API as seen from here.
struct ApiProbe {
    result: Result<(), String>,
    /// The member's clock minus ours, and the uncertainty, ms.
    skew: Option<(i64, i64)>,
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Parses an HTTP `Date` (IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`)
/// into ms since the epoch.
pub fn parse_http_date(s: &str) -> Option<i64> {
    let mut it = s.split_whitespace();
    let _weekday = it.next()?;
    let day: i64 = it.next()?.parse().ok()?;
    let month = match it.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = it.next()?.parse().ok()?;
    let mut hms = it.next()?.split(':').map(|p| p.parse::<i64>().ok());
    let (h, m, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if it.next()? != "GMT" || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400) + h * 3_600 + m * 60 + sec) * 1_000)
}

/// The remote clock minus ours (ms) and its uncertainty, from a remote
/// time `remote_ms` with `resolution_ms` read between `sent` and `got`.
pub fn skew_ms(remote_ms: i64, resolution_ms: i64, sent: i64, got: i64) -> (i64, i64) {
    let mid = sent + (got - sent) / 2;
    // A truncated time (a Date header) lies up to one resolution early.
    (
        remote_ms + resolution_ms / 2 - mid,
        (got - sent) / 2 + (resolution_ms + 1) / 2,
    )
}

pub fn skew_ok(skew_ms: i64) -> bool {
    skew_ms.abs() <= MAX_SKEW_MS
}

fn format_secs(ms: i64) -> String {
    format!(
        "{}{:.1} s",
        if ms < 0 { "-" } else { "+" },
        ms.abs() as f64 / 1000.0
    )
}

/// A measurement's uncertainty: ms below a second.
fn format_err(ms: i64) -> String {
    if ms < 1_000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

async fn probe_api(http: reqwest::Client, url: String) -> ApiProbe {
    let sent = wall_ms();
    let resp =
        match tokio::time::timeout(PROBE_TIMEOUT, http.get(format!("{url}/health")).send()).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                let mut why = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    why = format!("{why}: {s}");
                    src = s.source();
                }
                return ApiProbe {
                    result: Err(why),
                    skew: None,
                };
            }
            Err(_) => {
                return ApiProbe {
                    result: Err(format!("no answer in {} s", PROBE_TIMEOUT.as_secs())),
                    skew: None,
                }
            }
        };
    let got = wall_ms();
    let status = resp.status();
    let date = resp
        .headers()
        .get(reqwest::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_http_date);
    let body: Option<serde_json::Value> = tokio::time::timeout(PROBE_TIMEOUT, resp.json())
        .await
        .ok()
        .and_then(Result::ok);
    let now_ms = body
        .as_ref()
        .and_then(|b| b.get("now_ms"))
        .and_then(serde_json::Value::as_i64);
    let skew = match (now_ms, date) {
        (Some(ms), _) => Some(skew_ms(ms, 1, sent, got)),
        (None, Some(ms)) => Some(skew_ms(ms, 1_000, sent, got)),
        (None, None) => None,
    };
    let result = if status.is_success() {
        Ok(())
    } else {
        Err(format!("/health answered {status}"))
    };
    ApiProbe { result, skew }
}

/// Answers nothing: the endpoint the doctor dials from serves no one.
struct NoService;

impl shoal_mesh::rpc::RpcHandler for NoService {
    fn handle(
        &self,
        _peer: shoal_mesh::rpc::PeerInfo,
        _body: Vec<u8>,
    ) -> shoal_mesh::rpc::RpcFuture {
        Box::pin(async { Vec::new() })
    }
}

/// A mutual-TLS RPC endpoint with the node's own credentials, for a cheap
/// request to each member; why not, when identity.json cannot be read.
fn rpc_endpoint(data_dir: &Path, v6: bool) -> Result<shoal_mesh::rpc::RpcEndpoint, String> {
    let id = identity::load_identity(data_dir)?
        .ok_or_else(|| format!("no identity in {}", data_dir.display()))?;
    let bind: SocketAddr = if v6 {
        SocketAddr::from(([0u16; 8], 0))
    } else {
        SocketAddr::from(([0, 0, 0, 0], 0))
    };
    shoal_mesh::rpc::RpcEndpoint::serve(bind, &id.credentials, Arc::new(NoService))
        .map_err(|e| e.to_string())
}

async fn probe_rpc(
    rpc: Option<shoal_mesh::rpc::RpcEndpoint>,
    addr: String,
) -> Result<String, String> {
    let Some(rpc) = rpc else {
        return Err("no RPC endpoint".into());
    };
    let sock: SocketAddr = addr
        .parse()
        .map_err(|_| format!("'{addr}' is not IP:PORT"))?;
    let started = std::time::Instant::now();
    let body = proto::encode(&proto::Request::HoldsCaKey);
    let answer = rpc
        .call(sock, &body, PROBE_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    match proto::decode::<proto::Response>(&answer) {
        Ok(_) => Ok(format!(
            "mTLS {:.1} ms",
            started.elapsed().as_secs_f64() * 1000.0
        )),
        Err(e) => Err(format!("answered something unreadable: {e}")),
    }
}

async fn check_members(
    data_dir: &Path,
    members: &[NodeInfo],
    peers: &[PeerView],
    me: Option<u64>,
) -> (Vec<Check>, Check) {
    let ca_pem = identity::load_identity(data_dir)
        .ok()
        .flatten()
        .map(|id| id.credentials.ca_pem);
    let http = super::login::http_trusting(ca_pem).ok();
    let v6 = members.iter().any(|m| m.addr.starts_with('['));
    let rpc = rpc_endpoint(data_dir, v6);
    let rpc_why = rpc.as_ref().err().cloned();
    let rpc = rpc.ok();
    let probes = members.iter().map(|m| {
        let http = http.clone();
        let rpc = rpc.clone();
        let url = m.api_url.trim_end_matches('/').to_string();
        let addr = m.addr.clone();
        async move {
            let api = match http {
                Some(h) => probe_api(h, url).await,
                None => ApiProbe {
                    result: Err("cannot build an HTTPS client".into()),
                    skew: None,
                },
            };
            let rpc = match rpc {
                Some(r) => Some(probe_rpc(Some(r), addr).await),
                None => None,
            };
            (api, rpc)
        }
    });
    let results = futures::future::join_all(probes).await;
    if let Some(r) = &rpc {
        r.shutdown().await;
    }
    let mut reach = Vec::new();
    let mut skews = Vec::new();
    let mut clock_ok = true;
    for (m, (api, rpc_result)) in members.iter().zip(results) {
        let mut ok = true;
        let mut parts = Vec::new();
        match &api.result {
            Ok(()) => parts.push(format!("api {} ok", m.api_url)),
            Err(e) => {
                ok = false;
                parts.push(format!("api {}: {e}", m.api_url));
            }
        }
        match (rpc_result, &rpc_why) {
            (Some(Ok(how)), _) => parts.push(format!("rpc {} ok ({how})", m.addr)),
            (Some(Err(e)), _) => {
                ok = false;
                parts.push(format!("rpc {}: {e}", m.addr));
            }
            (None, why) => parts.push(format!(
                "rpc {} not probed ({})",
                m.addr,
                why.as_deref().unwrap_or("no credentials")
            )),
        }
        if Some(m.id) == me {
            parts.push("gossip: this node".into());
        } else {
            match peers.iter().find(|p| p.id == m.id) {
                Some(p) if p.state == "alive" => parts.push("gossip alive".into()),
                Some(p) => {
                    ok = false;
                    parts.push(format!("gossip {}", p.state));
                }
                None => {
                    ok = false;
                    parts.push("gossip: not in the local agent's peer view".into());
                }
            }
        }
        reach.push(Check::new(
            format!("reach:{}", m.name),
            ok,
            parts.join(", "),
        ));
        if Some(m.id) != me {
            if let Some((skew, err)) = api.skew {
                clock_ok &= skew_ok(skew);
                skews.push(format!(
                    "{} {} (±{})",
                    m.name,
                    format_secs(skew),
                    format_err(err)
                ));
            }
        }
    }
    let clock = if skews.is_empty() {
        Check::new(
            "clock",
            true,
            "no other member's clock could be read (see reach)",
        )
    } else {
        Check::new(
            "clock",
            clock_ok,
            format!(
                "skew to {} (max {} s)",
                skews.join(", "),
                MAX_SKEW_MS / 1000
            ),
        )
    };
    (reach, clock)
}

// ---- GPUs -----------------------------------------------------------------

async fn check_nvml(cfg: &Config, me: Option<&NodeInfo>) -> Check {
    let name = "nvml";
    if let Some(spec) = &cfg.sim_gpus {
        return Check::new(
            name,
            true,
            format!("simulated GPUs ({spec}): NVML not used"),
        );
    }
    let listed = me.map(|n| n.gpus_total);
    let opened = tokio::task::spawn_blocking(|| {
        crate::gpu::nvml::NvmlGpus::open().map(|g| {
            use crate::gpu::GpuSource;
            g.inventory().len()
        })
    })
    .await
    .unwrap_or_else(|e| Err(format!("NVML panicked: {e}")));
    judge_nvml(opened, listed)
}

/// NVML's outcome (`Ok(GPUs)` or why it does not load) against the GPUs
/// the ledger lists for this node (None: unknown).
pub fn judge_nvml(opened: Result<usize, String>, listed: Option<u32>) -> Check {
    let name = "nvml";
    match (opened, listed) {
        (Ok(n), Some(l)) if (n as u64) < u64::from(l) => Check::new(
            name,
            false,
            format!("NVML reports {n} GPUs, the ledger lists {l} for this node"),
        ),
        (Ok(n), _) => Check::new(name, true, format!("NVML loaded, {n} GPUs")),
        (Err(e), Some(l)) if l > 0 => Check::new(
            name,
            false,
            format!("NVML does not load ({e}), yet the ledger lists {l} GPUs for this node"),
        ),
        (Err(_), _) => Check::new(name, true, "no NVIDIA driver (0 GPUs offered)"),
    }
}

// ---- disk -----------------------------------------------------------------

/// Free and total bytes of the filesystem holding `path` (or its nearest
/// existing ancestor), and its device.
fn statvfs(path: &Path) -> Result<(u64, u64, u64, PathBuf), String> {
    let mut at = path.to_path_buf();
    while !at.exists() {
        match at.parent() {
            Some(p) => at = p.to_path_buf(),
            None => return Err(format!("{} does not exist", path.display())),
        }
    }
    let dev = std::fs::metadata(&at).map(|m| m.dev()).unwrap_or(0);
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{} has a NUL byte", at.display()))?;
    // SAFETY: statvfs fills the zeroed struct; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a struct statvfs fills.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "statvfs {}: {}",
            at.display(),
            std::io::Error::last_os_error()
        ));
    }
    let frsize = u64::from(st.f_frsize as u32).max(1);
    #[allow(clippy::useless_conversion)]
    let (avail, blocks) = (u64::from(st.f_bavail), u64::from(st.f_blocks));
    Ok((
        avail.saturating_mul(frsize),
        blocks.saturating_mul(frsize),
        dev,
        at,
    ))
}

/// Whether `free` of `total` bytes is enough: at least 1 GiB and 5 %.
pub fn free_ok(free: u64, total: u64) -> bool {
    let pct = if total == 0 {
        0.0
    } else {
        free as f64 * 100.0 / total as f64
    };
    free >= MIN_FREE_BYTES && pct >= MIN_FREE_PCT
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30))
}

fn check_disk(data_dir: &Path, jobs_dir: &Path) -> Check {
    let mut ok = true;
    let mut parts = Vec::new();
    let mut seen = Vec::new();
    for (what, dir) in [("data", data_dir), ("jobs", jobs_dir)] {
        match statvfs(dir) {
            Ok((free, total, dev, _)) if seen.contains(&dev) => {
                let _ = (free, total);
                parts.push(format!("{what} {} (same filesystem)", dir.display()));
            }
            Ok((free, total, dev, _)) => {
                seen.push(dev);
                let good = free_ok(free, total);
                ok &= good;
                let pct = if total == 0 {
                    0.0
                } else {
                    free as f64 * 100.0 / total as f64
                };
                parts.push(format!(
                    "{what} {} {} free of {} ({pct:.0}%){}",
                    dir.display(),
                    gib(free),
                    gib(total),
                    if good { "" } else { ": below 1 GiB or 5%" }
                ));
            }
            Err(e) => {
                ok = false;
                parts.push(format!("{what}: {e}"));
            }
        }
    }
    Check::new("disk", ok, parts.join("; "))
}

// ---- cgroups --------------------------------------------------------------

/// Why an agent with `own` cgroup (of `/proc/PID/cgroup`) could not have
/// rank cgroups, from the mounts alone (no side effects); None if it could.
fn cgroup_obstacle(proc_cgroup: Option<&str>, is_root: bool) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let Some(mount) = cgroup::cgroup2_mount(&mounts) else {
        return Some("no cgroup2 hierarchy is mounted".into());
    };
    let Some(own) = proc_cgroup.and_then(cgroup::own_cgroup) else {
        return Some("the agent's cgroup v2 is unknown".into());
    };
    let own_dir = mount.join(own.trim_start_matches('/'));
    let writable = {
        let c = std::ffi::CString::new(own_dir.as_os_str().as_encoded_bytes()).ok();
        // SAFETY: access only reads the path.
        c.is_some_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0)
    };
    if cgroup::placement(&mount, &own, is_root, writable).is_none() {
        return Some(format!("{} is not writable", own_dir.display()));
    }
    None
}

/// The verdict on a node's rank fences: `isolation` and `controllers` as
/// the ledger lists them.
pub fn judge_cgroups(
    mode: CgroupMode,
    executor: bool,
    isolation: &str,
    controllers: &[String],
    agent_root: bool,
    obstacle: Option<&str>,
) -> Check {
    let name = "cgroups";
    if !executor {
        return Check::new(name, true, "the executor is off: this node runs no ranks");
    }
    match isolation {
        "cgroup" if controllers.is_empty() => Check::new(
            name,
            true,
            "kill only: a cgroup per rank without memory, cpu or pids controllers",
        ),
        "cgroup" => Check::new(name, true, format!("cgroup ({})", controllers.join(","))),
        _ if mode == CgroupMode::Off => Check::new(
            name,
            true,
            "none (executor.cgroups = off): ranks are fenced by their process group only",
        ),
        _ if agent_root => Check::new(
            name,
            false,
            format!(
                "none: the agent runs as root with executor.cgroups = auto but found no writable cgroup2 ({})",
                obstacle.unwrap_or("see the agent's log")
            ),
        ),
        _ => Check::new(
            name,
            true,
            format!(
                "none: ranks are fenced by their process group only; run the agent as root or under systemd with Delegate=yes for cgroups{}",
                obstacle.map(|o| format!(" ({o})")).unwrap_or_default()
            ),
        ),
    }
}

fn check_cgroups(cfg: &Config, agent: Option<&AgentProc>, me: Option<&NodeInfo>) -> Check {
    let Some(agent) = agent.filter(|a| a.alive) else {
        return Check::new("cgroups", false, "not known: the agent is not running");
    };
    let proc_cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", agent.info.pid)).ok();
    let root = agent.uid == Some(0);
    let obstacle = cgroup_obstacle(proc_cgroup.as_deref(), root);
    let (isolation, controllers) = match me {
        Some(n) => (n.isolation.clone(), n.isolation_controllers.clone()),
        None if agent.info.rank_cgroups.is_some() => ("cgroup".to_string(), Vec::new()),
        None => ("none".to_string(), Vec::new()),
    };
    let mut c = judge_cgroups(
        cfg.executor.cgroups,
        cfg.executor.enabled,
        &isolation,
        &controllers,
        root,
        obstacle.as_deref(),
    );
    if let Some(dir) = &agent.info.rank_cgroups {
        c.detail = format!("{} in {dir}", c.detail);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_parse_to_epoch_ms() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777_000)
        );
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2028 23:59:59 GMT"),
            Some(1_835_481_599_000)
        );
        assert_eq!(parse_http_date("Sun, 06 Foo 1994 08:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 CET"), None);
        assert_eq!(parse_http_date(""), None);
    }

    #[test]
    fn skew_is_taken_at_the_midpoint_and_judged_against_two_seconds() {
        // A Date of second 100 read between 100.2 s and 100.4 s: the
        // remote clock read 100.0-101.0 s, taken as 100.5 s.
        let (skew, err) = skew_ms(100_000, 1_000, 100_200, 100_400);
        assert_eq!((skew, err), (200, 600));
        let (skew, _) = skew_ms(97_000, 1, 100_000, 100_000);
        assert_eq!(skew, -3_000);
        assert!(!skew_ok(skew));
        assert!(skew_ok(2_000) && skew_ok(-2_000) && !skew_ok(2_001));
        assert_eq!(format_secs(-300), "-0.3 s");
        assert_eq!(format_secs(1_250), "+1.2 s");
        assert_eq!(format_err(3), "3 ms");
        assert_eq!(format_err(1_000), "1.0 s");
    }

    #[test]
    fn data_dir_modes() {
        assert_eq!(mode_problem(0o40700, true), None);
        assert_eq!(
            mode_problem(0o40755, true).as_deref(),
            Some("is 0755, must be 0700")
        );
        assert_eq!(mode_problem(0o100600, false), None);
        assert_eq!(mode_problem(0o100400, false), None);
        assert_eq!(
            mode_problem(0o100644, false).as_deref(),
            Some("is 0644, must be 0600")
        );
        assert!(mode_problem(0o100700, false).is_some());
    }

    #[test]
    fn free_space_needs_a_gib_and_five_percent() {
        let gib = 1u64 << 30;
        assert!(free_ok(10 * gib, 100 * gib));
        assert!(!free_ok(4 * gib, 100 * gib), "4%");
        assert!(!free_ok(gib / 2, gib), "50% but under 1 GiB");
        assert!(free_ok(gib, 20 * gib), "exactly 1 GiB and 5%");
        assert!(!free_ok(0, 0));
    }

    #[test]
    fn nvml_verdicts() {
        assert!(judge_nvml(Err("no lib".into()), Some(0)).ok);
        assert!(judge_nvml(Err("no lib".into()), None).ok);
        let c = judge_nvml(Err("no lib".into()), Some(8));
        assert!(!c.ok && c.detail.contains("lists 8"), "{c:?}");
        assert!(judge_nvml(Ok(8), Some(8)).ok);
        assert!(!judge_nvml(Ok(7), Some(8)).ok);
    }

    #[test]
    fn cgroup_verdicts() {
        let all = vec!["memory".to_string(), "cpu".into(), "pids".into()];
        let c = judge_cgroups(CgroupMode::Auto, true, "cgroup", &all, true, None);
        assert!(c.ok && c.detail == "cgroup (memory,cpu,pids)", "{c:?}");
        assert!(
            judge_cgroups(CgroupMode::Auto, true, "cgroup", &[], false, None)
                .detail
                .starts_with("kill only")
        );
        assert!(!judge_cgroups(CgroupMode::Auto, true, "none", &[], true, Some("x")).ok);
        assert!(judge_cgroups(CgroupMode::Auto, true, "none", &[], false, None).ok);
        assert!(judge_cgroups(CgroupMode::Off, true, "none", &[], true, None).ok);
        assert!(judge_cgroups(CgroupMode::Auto, false, "none", &[], true, None).ok);
    }

    #[test]
    fn agent_facts_from_proc() {
        assert_eq!(
            effective_uid("Name:\tshoal\nUid:\t1000\t0\t0\t0\nGid:\t1\n"),
            Some(0)
        );
        assert_eq!(effective_uid("Name: x\n"), None);
        let argv: Vec<String> = [
            "shoal",
            "agent",
            "--sim-gpus",
            "4xH100",
            "--config=/e/n.toml",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(flag_value(&argv, "--sim-gpus").as_deref(), Some("4xH100"));
        assert_eq!(flag_value(&argv, "--config").as_deref(), Some("/e/n.toml"));
        assert_eq!(flag_value(&argv, "--name"), None);
    }

    #[test]
    fn the_table_has_one_line_per_check() {
        let t = format_table(&[
            Check::new("data-dir", true, "fine"),
            Check::new("reach:n2", false, "api down"),
        ]);
        assert_eq!(t, "ok    data-dir   fine\nFAIL  reach:n2   api down\n");
    }
}
