//! Shared helpers for the integration tests: spawned `shoal` processes on
//! loopback and condition polling with timeouts (never sleep-and-hope).

#![allow(dead_code)]

use shoal_sdk::{Client, JobSubmitRequest};
use std::future::Future;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub fn shoal_bin() -> &'static str {
    env!("CARGO_BIN_EXE_shoal")
}

/// A port number free for both TCP (a node's API) and UDP (its RPC) a
/// moment ago; a node uses it for both. A node
/// binds its ports some time after this (and again after a restart), so
/// they are taken from below the kernel's ephemeral range: no `bind(0)`
/// elsewhere — another agent's gossip socket, a QUIC client, a test's own
/// listener — can be handed one of them in between. Each test process
/// walks its own slice of the range, so two binaries running at once do
/// not walk the same ports either.
/// Adds `args` to `command`, but a `--token T` pair as `T` in the
/// environment variable `var`: users pass tokens that way (the CLI refuses
/// a token in its arguments).
pub fn args_with_token_in(command: &mut Command, args: &[&str], var: &str) {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match (*arg, rest.clone().next()) {
            ("--token", Some(token)) => {
                command.env(var, token);
                rest.next();
            }
            _ => {
                command.arg(arg);
            }
        }
    }
}

/// Runs the `shoal` CLI against `api` with `token`: (exit code, stdout,
/// stderr), both trimmed. A `--token T` in `args` (the other region's, for
/// `federation join`) goes in `SHOAL_PEER_TOKEN`: the CLI refuses a token
/// in its arguments.
pub fn cli(args: &[&str], api: &str, token: &str) -> (i32, String, String) {
    let mut command = Command::new(shoal_bin());
    command
        .env_remove("SHOAL_API")
        .env_remove("SHOAL_PEER_TOKEN")
        .env("SHOAL_TOKEN", token)
        .arg("--api")
        .arg(api);
    args_with_token_in(&mut command, args, "SHOAL_PEER_TOKEN");
    let out = command.output().expect("run shoal");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// [`cli`] that must succeed: its stdout.
pub fn cli_ok(args: &[&str], api: &str, token: &str) -> String {
    let (code, out, err) = cli(args, api, token);
    assert_eq!(code, 0, "shoal {args:?} failed: {err}");
    out
}

/// Creates tenant `name` through the admin `client` and returns a new API
/// token of that tenant (named `NAME-bot`).
pub async fn tenant_with_token(client: &Client, name: &str) -> String {
    client
        .create_tenant(&shoal_sdk::TenantRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .expect("tenant");
    client
        .create_api_token(&shoal_sdk::ApiTokenCreateRequest {
            name: Some(format!("{name}-bot")),
            tenant: Some(name.into()),
            ttl_s: None,
        })
        .await
        .expect("tenant token")
        .token
}

pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let floor: u32 = 20_000;
    let ceiling: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let span = ceiling.saturating_sub(floor).max(1);
    let slice = 500.min(span);
    let start = floor + (std::process::id() * slice) % span;
    for _ in 0..span {
        let port = floor + (start - floor + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        let tcp = TcpListener::bind(("127.0.0.1", port));
        let udp = UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free port between {floor} and {ceiling}");
}

/// Polls `check` every 50 ms until it returns Some, or panics after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts one cluster of spawned agents named `names` (the first
/// bootstraps, the others join through it, `env` adds variables per node)
/// and waits until it has converged ([`wait_converged`]). Returns the nodes
/// and the token.
pub async fn start_cluster(
    root: &Path,
    names: &[&str],
    env: impl Fn(&str) -> Vec<(String, String)>,
) -> (Vec<NodeProc>, String) {
    let mut nodes: Vec<NodeProc> = names
        .iter()
        .map(|name| {
            let mut n = NodeProc::new(root, name, &[]);
            n.extra_env = env(name);
            n
        })
        .collect();
    let token = form_cluster(&mut nodes);
    wait_converged(&nodes, &token).await;
    (nodes, token)
}

/// Bootstraps a cluster on the first of `nodes` and joins the others
/// through it; returns the admin token. The token the bootstrap prints is
/// single use, so more than one joiner share one made with `shoal token
/// create --uses N`. Nothing is waited for beyond each node's start: see
/// [`wait_converged`].
pub fn form_cluster(nodes: &mut [NodeProc]) -> String {
    let printed = nodes[0].bootstrap();
    let ca = nodes[0].ca_pem();
    for node in nodes.iter_mut() {
        node.cluster_ca = Some(ca.clone());
    }
    let joiners = nodes.len() - 1;
    let join = if joiners > 1 {
        nodes[0].create_join_token(joiners as u32)
    } else {
        printed
    };
    let via = nodes[0].rpc_addr();
    for node in nodes.iter_mut().skip(1) {
        node.join(&via, &join);
    }
    nodes[0].admin_token()
}

/// Waits until every node of `nodes` has, in its *own* state (its
/// `/metrics`, answered locally, not routed to the leader): every node an
/// alive member of its ledger and of its liveness view, and a capacity
/// advert heard from every other node. "The leader lists every member
/// alive" only proves admission — a follower may not have applied the last
/// join yet, and a member is alive in the ledger from its admission on,
/// before anyone has heard from it. A test that then acts through any node
/// relies on that node's own view.
pub async fn wait_converged(nodes: &[NodeProc], token: &str) {
    let want = nodes.len();
    let members = format!("shoal_members{{state=\"alive\"}} {want}\n");
    let peers = format!("shoal_fd_peers{{state=\"alive\"}} {}\n", want - 1);
    let heard = format!("shoal_gossip_peers_heard {}\n", want - 1);
    for n in nodes {
        let c = n.client(token);
        let (members, peers, heard) = (&members, &peers, &heard);
        wait_for(
            &format!(
                "{} to see every member alive in its own ledger and liveness view, and hear every advert",
                n.name
            ),
            Duration::from_secs(120),
            || {
                let c = c.clone();
                async move {
                    let text = c.metrics_text().await.ok()?;
                    let peers_ok = want == 1
                        || (text.contains(peers.as_str()) && text.contains(heard.as_str()));
                    (text.contains(members.as_str()) && peers_ok).then_some(())
                }
            },
        )
        .await;
    }
}

/// Runs the tests of one binary that start clusters one at a time: two
/// clusters of spawned agents side by side on two cores starve each other's
/// heartbeats, and a test then measures the neighbour, not itself. Tests
/// hold the guard across awaits on purpose.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that panicked while holding it poisoned nothing we keep.
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn sh_job(nodes: u32, gpus: u32, script: &str) -> JobSubmitRequest {
    JobSubmitRequest::shell(nodes, gpus, script)
}

/// One `shoal agent` process with fixed ports and data dir, so it can be
/// killed and restarted as the same node.
pub struct NodeProc {
    pub name: String,
    pub data_dir: PathBuf,
    pub api_port: u16,
    pub rpc_port: u16,
    pub labels: Vec<String>,
    pub extra_env: Vec<(String, String)>,
    /// Run ranks as the agent's own user (the default for tests).
    pub single_user: bool,
    /// `--sim-gpus`; None runs the node with real discovery (NVML).
    pub sim_gpus: Option<String>,
    /// Address the node binds and advertises (127.0.0.1 unless in a netns).
    pub host: String,
    /// Run inside this network namespace (`ip netns exec`).
    pub netns: Option<String>,
    /// Bind every address to 0.0.0.0 and let the agent find the address it
    /// publishes, as an install with the defaults does.
    pub bind_any: bool,
    /// The cluster CA (PEM) once known: a joiner's own identity names it
    /// only after its join, and clients are made before that.
    pub cluster_ca: Option<String>,
    child: Option<Child>,
}

impl NodeProc {
    pub fn new(root: &Path, name: &str, labels: &[&str]) -> Self {
        let port = free_port();
        NodeProc {
            name: name.to_string(),
            data_dir: root.join(name),
            api_port: port,
            rpc_port: port,
            labels: labels.iter().map(|s| s.to_string()).collect(),
            extra_env: Vec::new(),
            single_user: true,
            sim_gpus: Some("4xH100-80GB".into()),
            host: "127.0.0.1".into(),
            netns: None,
            bind_any: false,
            cluster_ca: None,
            child: None,
        }
    }

    /// The agent's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn rpc_addr(&self) -> String {
        format!("{}:{}", self.host, self.rpc_port)
    }

    /// Whether the agent serves its API over HTTPS: off loopback, or when
    /// the test asks for it (`SHOAL_API_TLS=on`).
    pub fn api_tls(&self) -> bool {
        let asked = self
            .extra_env
            .iter()
            .any(|(k, v)| k == "SHOAL_API_TLS" && v == "on");
        asked || !self.host.starts_with("127.")
    }

    pub fn api_url(&self) -> String {
        let scheme = if self.api_tls() { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.api_port)
    }

    /// The cluster CA (PEM): as told by [`form_cluster`], else as the
    /// node's identity names it.
    pub fn ca_pem(&self) -> String {
        if let Some(pem) = &self.cluster_ca {
            return pem.clone();
        }
        let text = std::fs::read_to_string(self.data_dir.join("identity.json"))
            .expect("the node's identity");
        let v: serde_json::Value = serde_json::from_str(&text).expect("identity JSON");
        v["credentials"]["ca_pem"]
            .as_str()
            .expect("a CA in the identity")
            .to_string()
    }

    /// The cluster CA in a file, for a CLI run with `SHOAL_CA_FILE`.
    pub fn ca_file(&self) -> PathBuf {
        let path = self.data_dir.with_extension("ca.pem");
        std::fs::write(&path, self.ca_pem()).expect("write the CA file");
        path
    }

    fn command(&self) -> Command {
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(shoal_bin());
                c
            }
            None => Command::new(shoal_bin()),
        };
        let bind = if self.bind_any {
            "0.0.0.0"
        } else {
            self.host.as_str()
        };
        c.arg("agent")
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--api-addr")
            .arg(format!("{bind}:{}", self.api_port))
            .arg("--rpc-addr")
            .arg(format!("{bind}:{}", self.rpc_port))
            .arg("--gossip-addr")
            .arg(format!("{bind}:0"));
        if let Some(spec) = &self.sim_gpus {
            c.arg("--sim-gpus").arg(spec);
        }
        for l in &self.labels {
            c.arg("--label").arg(l);
        }
        // Ranks run as the test's own user, root included, unless a test
        // asks for the production default (see `isolation`).
        if self.single_user {
            c.env("SHOAL_EXECUTOR__RUN_AS", "agent")
                .env("SHOAL_EXECUTOR__ALLOW_ROOT", "true");
        }
        for (k, v) in &self.extra_env {
            c.env(k, v);
        }
        // A test process that dies without unwinding (killed at a timeout,
        // aborted) must not leave agents behind to load the next tests.
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        c.env(
            "RUST_LOG",
            std::env::var("SHOAL_TEST_LOG").unwrap_or_else(|_| "warn,shoal_node=info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.data_dir.with_extension("out"))
                .expect("stdout file"),
        ))
        .stderr(Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.data_dir.with_extension("log"))
                .expect("log file"),
        ));
        c
    }

    /// Starts the first node of a cluster and returns the join token it printed.
    pub fn bootstrap(&mut self) -> String {
        let mut c = self.command();
        c.arg("--bootstrap");
        self.child = Some(c.spawn().expect("spawn shoal"));
        let out = self.data_dir.with_extension("out");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            if let Some(pos) = text.find("join token: ") {
                let rest = &text[pos + "join token: ".len()..];
                if let Some(end) = rest.find('\n') {
                    return rest[..end].trim().to_string();
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "bootstrap node {} printed no join token (see {})",
            self.name,
            self.data_dir.with_extension("log").display()
        );
    }

    /// `shoal token create --uses N` against this node's API with its
    /// admin token (from the data dir); the API is up once
    /// [`NodeProc::bootstrap`] has returned.
    pub fn create_join_token(&self, uses: u32) -> String {
        let out = Command::new(shoal_bin())
            .env_remove("SHOAL_API")
            .env_remove("SHOAL_TOKEN")
            .arg("--api")
            .arg(self.api_url())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["token", "create", "--voter", "--uses", &uses.to_string()])
            .output()
            .expect("run shoal token create");
        assert!(
            out.status.success(),
            "shoal token create --uses {uses} failed: {}\n{}'s log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.name,
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn join(&mut self, via: &str, token: &str) {
        let file = self.write_join_token(token);
        let mut c = self.command();
        c.arg("--join").arg(via).arg("--join-token-file").arg(file);
        self.child = Some(c.spawn().expect("spawn shoal"));
    }

    /// The join token in a file only its owner reads, as `--join-token-file`
    /// wants it (a token is never an argument).
    pub fn write_join_token(&self, token: &str) -> PathBuf {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.data_dir.with_extension("join-token");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .expect("write the join token file");
        std::io::Write::write_all(&mut f, token.as_bytes()).expect("write the join token");
        path
    }

    /// Restarts from the data dir (no --bootstrap/--join).
    pub fn restart(&mut self) {
        self.child = Some(self.command().spawn().expect("spawn shoal"));
    }

    /// The agent's exit status once it has exited on its own.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// SIGTERM, as `systemctl stop` sends; waits (at most `timeout`) for
    /// the agent to exit and says whether it did.
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
        false
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            self.remove_rank_cgroups();
        }
    }

    /// Kills and removes the rank cgroups the agent leaves when it dies
    /// without unwinding (its restart would; a test's agent never restarts
    /// once the test is over), so tests leave no cgroups behind.
    fn remove_rank_cgroups(&self) {
        let Ok(text) = std::fs::read_to_string(self.data_dir.join("agent.json")) else {
            return;
        };
        let Some(dir) = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["rank_cgroups"].as_str().map(PathBuf::from))
        else {
            return;
        };
        let ranks: Vec<PathBuf> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        for rank in ranks {
            let _ = std::fs::write(rank.join("cgroup.kill"), "1");
            let start = Instant::now();
            while std::fs::remove_dir(&rank).is_err() && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir(&dir);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default()
    }

    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("admin.token"))
            .expect("admin token")
            .trim()
            .to_string()
    }

    /// A client of this node's API; over HTTPS it trusts the cluster CA
    /// alone, as the CLI does.
    pub fn client(&self, token: &str) -> Client {
        let ca = self.api_tls().then(|| self.ca_pem());
        shoal_node::cli::login::client_trusting(self.api_url(), Some(token.to_string()), ca)
            .expect("an API client")
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill9();
    }
}
