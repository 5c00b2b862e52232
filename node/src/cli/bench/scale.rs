//! `shoal bench scale`: a region of hollow nodes, to measure how the
//! cluster's costs grow with its size (as kubemark's hollow kubelets do for
//! Kubernetes).
//!
//! Every hollow node is a whole agent — join over mTLS, Raft, gossip,
//! liveness, the ledger client, the executor's loops, the API — with eight
//! simulated GPUs, in this process. What makes it hollow: no rank is ever
//! forked (the gangs are cancelled once placed), and its data directory may
//! sit on tmpfs. Each node runs on its own single-worker runtime whose
//! threads carry the node's name (`hn<i>`), so `/proc/self/task` tells what
//! each node, and the leader, spends.
//!
//! Phases: bootstrap and joins (time until every node is alive in every
//! ledger); idle (CPU, RSS, bytes per node and on the leader); gangs of
//! 8 nodes × 8 GPUs (submit → placed on the leader, → known on its nodes)
//! with sequential ledger writes beside them; kill 1 % of the nodes at once
//! (time until every survivor's ledger holds each as `down`). False downs —
//! a live node ever `down` in the leader's ledger — are counted throughout.

use super::percentile;
use crate::agent::{Agent, AgentError, StartMode};
use crate::config::Config;
use crate::node::Node;
use crate::trust::auth;
use serde::Serialize;
use shoal_consensus::workload::JobState;
use shoal_consensus::NodeId;
use shoal_sdk::MemberState;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct ScaleArgs {
    pub nodes: usize,
    /// Wait after the region formed, before measuring (new members'
    /// first adverts come faster).
    pub settle: Duration,
    /// How long the idle phase is measured.
    pub idle: Duration,
    pub gangs: usize,
    /// Joins in flight at once.
    pub join_parallel: usize,
    /// Where the nodes' data directories go (default: /dev/shm when it
    /// exists, else the system's temporary directory).
    pub data_dir: Option<PathBuf>,
    /// Once the region has formed, run the relayed members at a lower CPU
    /// priority than the leader and the replicas (see [`replicas_first`]).
    pub replicas_first: bool,
}

/// What one phase cost, per node and on the leader.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Cost {
    pub seconds: f64,
    /// Mean over the nodes other than the leader, % of one core.
    pub node_cpu_pct: f64,
    /// The busiest node other than the leader, % of one core.
    pub node_cpu_max_pct: f64,
    /// Mean over the Raft replicas other than the leader (voters and
    /// learners), and how many.
    pub replica_cpu_pct: f64,
    pub replicas: usize,
    /// Mean over the members that follow the log from a replica, and how
    /// many.
    pub relayed_cpu_pct: f64,
    pub relayed: usize,
    pub leader_cpu_pct: f64,
    /// RPC and gossip bytes per second, in and out together.
    pub node_bytes_per_s: f64,
    /// Of which gossip.
    pub node_gossip_bytes_per_s: f64,
    /// The same mean over the Raft replicas and over the relayed members.
    pub replica_bytes_per_s: f64,
    pub relayed_bytes_per_s: f64,
    pub leader_bytes_per_s: f64,
    pub leader_gossip_bytes_per_s: f64,
    /// Everything outside the nodes' threads (this harness), % of a core.
    pub harness_cpu_pct: f64,
    /// RPC requests served per second, by role (`leader`, `replica`: mean
    /// over the other replicas, `relayed`: mean over those) and request.
    pub served_per_s: BTreeMap<&'static str, BTreeMap<&'static str, f64>>,
}

#[derive(Serialize, Debug, Default)]
pub struct ScaleReport {
    pub nodes: usize,
    /// From the first join until every node is alive in every ledger.
    pub join_s: f64,
    /// The idle phase's headline figures (the same as in `idle`): % of a
    /// core and RPC + gossip bytes per second, for the leader and the mean
    /// node other than it.
    pub leader_cpu_pct: f64,
    pub leader_bytes_per_s: f64,
    pub node_cpu_pct: f64,
    pub node_bytes_per_s: f64,
    /// The relayed members' threads ran at [`RELAYED_NICE`] from the end of
    /// the joins on (how many threads), the leader and replicas at 0.
    pub relayed_threads_niced: usize,
    pub idle: Cost,
    /// Ledger entries committed per second while idle.
    pub idle_entries_per_s: f64,
    /// The process's resident memory divided by the node count.
    pub node_rss_mb: f64,
    pub gangs: usize,
    /// Submit → placed in the leader's ledger.
    pub gang_placed_p50_ms: f64,
    pub gang_placed_p99_ms: f64,
    /// Submit → placed in the ledger of every node of the gang (where a
    /// real node would start its ranks; hollow nodes fork none).
    pub gang_start_p50_ms: f64,
    pub gang_start_p99_ms: f64,
    pub writes: usize,
    pub ledger_write_p50_ms: f64,
    pub ledger_write_p99_ms: f64,
    pub killed: usize,
    /// Until every survivor's ledger holds every killed node `down`.
    pub down_detect_s: f64,
    pub false_downs: usize,
    /// The phase (`settle`, `idle`, `gangs`, `kill`) in which each live
    /// node was first seen `down`, counted per phase.
    pub false_downs_by_phase: BTreeMap<&'static str, usize>,
}

/// How a hollow node stops.
enum Stop {
    Graceful,
    /// As `kill -9` would: every task dropped where it stands, nothing
    /// sent on the way out.
    Kill,
}

struct Hollow {
    thread: String,
    id: NodeId,
    node: Arc<Node>,
    api_url: String,
    rpc_addr: SocketAddr,
    stop: mpsc::Sender<Stop>,
    join: Option<std::thread::JoinHandle<()>>,
}

struct Started {
    node: Arc<Node>,
    api_url: String,
    rpc_addr: SocketAddr,
    admin_token: Option<String>,
}

/// Starts a node on its own runtime, on threads named `thread`; returns
/// once it has joined (or failed to).
async fn launch(
    thread: String,
    cfg: Config,
    mode: StartMode,
) -> Result<(Hollow, Option<String>), AgentError> {
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<Stop>();
    let name = thread.clone();
    let join = std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .max_blocking_threads(8)
                .thread_name(name)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(AgentError::Io(format!("runtime: {e}"))));
                    return;
                }
            };
            let agent = match rt.block_on(Agent::start(cfg, mode)) {
                Ok(a) => a,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let started = Started {
                node: agent.node().clone(),
                api_url: agent.api_url(),
                rpc_addr: agent.rpc_addr(),
                admin_token: agent.bootstrap.as_ref().map(|b| b.admin_token.clone()),
            };
            if ready_tx.send(Ok(started)).is_err() {
                return;
            }
            match stop_rx.recv() {
                Ok(Stop::Kill) => rt.shutdown_background(),
                Ok(Stop::Graceful) | Err(_) => {
                    rt.block_on(agent.shutdown());
                    rt.shutdown_timeout(Duration::from_secs(5));
                }
            }
        })
        .map_err(|e| AgentError::Io(format!("thread: {e}")))?;
    let started = ready_rx
        .await
        .map_err(|_| AgentError::Io(format!("{thread} ended before it started")))??;
    let id = started.node.id();
    Ok((
        Hollow {
            thread,
            id,
            node: started.node,
            api_url: started.api_url,
            rpc_addr: started.rpc_addr,
            stop: stop_tx,
            join: Some(join),
        },
        started.admin_token,
    ))
}

/// A node the run did not stop — a phase failed and the run returns early
/// — is killed, so no hollow node outlives the run that started it.
impl Drop for Hollow {
    fn drop(&mut self) {
        self.stop(Stop::Kill);
    }
}

impl Hollow {
    fn stop(&mut self, how: Stop) {
        let _ = self.stop.send(how);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }

    /// RPC requests served so far, by request.
    fn served(&self) -> Vec<u64> {
        let m = self.node.metrics();
        crate::proto::Request::KINDS
            .iter()
            .map(|k| {
                m.rpc_requests
                    .get_or_create(&vec![("request".into(), (*k).into())])
                    .get()
            })
            .collect()
    }

    /// (RPC, gossip) bytes in and out together.
    fn bytes(&self) -> (u64, u64) {
        let rpc = self.node.ledger().rpc_traffic();
        let m = self.node.metrics();
        let gossip: u64 = ["in", "out"]
            .iter()
            .map(|d| {
                m.gossip_bytes
                    .get_or_create(&vec![("direction".into(), (*d).into())])
                    .get()
            })
            .sum();
        (rpc.bytes_in + rpc.bytes_out, gossip)
    }
}

fn hollow_config(root: &std::path::Path, i: usize) -> Config {
    let mut cfg = crate::agent::testkit::node_config(root, i);
    cfg.sim_gpus = Some("8xH100-80GB".into());
    // An address of its own on loopback (all of 127/8 is), as each machine
    // of a real region has: what a node accepts per source address (joins
    // without a certificate) is then per node, as it would be.
    let ip = std::net::Ipv4Addr::new(127, 1, ((i + 1) >> 8) as u8, ((i + 1) & 0xff) as u8);
    for addr in [&mut cfg.api_addr, &mut cfg.rpc_addr, &mut cfg.gossip_addr] {
        addr.set_ip(ip.into());
    }
    // Four zones, so the voters spread as in a real region.
    cfg.labels.insert("zone".into(), format!("z{}", i % 4));
    cfg
}

/// Samples of CPU and bytes, to difference over a phase.
struct Mark {
    at: Instant,
    cpu: std::collections::HashMap<String, f64>,
    bytes: Vec<(u64, u64)>,
    served: Vec<Vec<u64>>,
}

fn mark(nodes: &[Hollow]) -> Mark {
    Mark {
        at: Instant::now(),
        cpu: crate::procstat::cpu_seconds_by_thread_name(),
        bytes: nodes.iter().map(Hollow::bytes).collect(),
        served: nodes.iter().map(Hollow::served).collect(),
    }
}

fn cost(
    nodes: &[Hollow],
    leader: NodeId,
    replicas: &BTreeSet<NodeId>,
    from: &Mark,
    to: &Mark,
) -> Cost {
    let secs = to.at.duration_since(from.at).as_secs_f64().max(1e-9);
    let used = |name: &str| {
        to.cpu.get(name).copied().unwrap_or(0.0) - from.cpu.get(name).copied().unwrap_or(0.0)
    };
    let pct = |cpu_s: f64| cpu_s / secs * 100.0;
    let (mut cpu, mut bytes, mut gossip, mut max_cpu) =
        (Vec::new(), Vec::new(), Vec::new(), 0.0f64);
    let (mut leader_cpu, mut leader_bytes, mut leader_gossip) = (0.0, 0.0, 0.0);
    let (mut replica_cpu, mut relayed_cpu) = (Vec::new(), Vec::new());
    let (mut replica_bytes, mut relayed_bytes) = (Vec::new(), Vec::new());
    let mut served: BTreeMap<&'static str, (usize, Vec<f64>)> = BTreeMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let role = if n.id == leader {
            "leader"
        } else if replicas.contains(&n.id) {
            "replica"
        } else {
            "relayed"
        };
        let (count, sums) = served
            .entry(role)
            .or_insert_with(|| (0, vec![0.0; crate::proto::Request::KINDS.len()]));
        *count += 1;
        for (k, sum) in sums.iter_mut().enumerate() {
            *sum += to.served[i][k].saturating_sub(from.served[i][k]) as f64 / secs;
        }
        let c = pct(used(&n.thread));
        let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        let g = rate(from.bytes[i].1, to.bytes[i].1);
        let b = rate(from.bytes[i].0, to.bytes[i].0) + g;
        if n.id == leader {
            (leader_cpu, leader_bytes, leader_gossip) = (c, b, g);
        } else {
            if replicas.contains(&n.id) {
                replica_cpu.push(c);
                replica_bytes.push(b);
            } else {
                relayed_cpu.push(c);
                relayed_bytes.push(b);
            }
            cpu.push(c);
            bytes.push(b);
            gossip.push(g);
            max_cpu = max_cpu.max(c);
        }
    }
    let names: BTreeSet<&str> = nodes.iter().map(|n| n.thread.as_str()).collect();
    let harness: f64 = to
        .cpu
        .keys()
        .filter(|k| !names.contains(k.as_str()))
        .map(|k| used(k))
        .sum();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / (v.len().max(1) as f64);
    Cost {
        seconds: secs,
        node_cpu_pct: mean(&cpu),
        node_cpu_max_pct: max_cpu,
        replica_cpu_pct: mean(&replica_cpu),
        replicas: replica_cpu.len(),
        relayed_cpu_pct: mean(&relayed_cpu),
        relayed: relayed_cpu.len(),
        leader_cpu_pct: leader_cpu,
        node_bytes_per_s: mean(&bytes),
        node_gossip_bytes_per_s: mean(&gossip),
        replica_bytes_per_s: mean(&replica_bytes),
        relayed_bytes_per_s: mean(&relayed_bytes),
        leader_bytes_per_s: leader_bytes,
        leader_gossip_bytes_per_s: leader_gossip,
        harness_cpu_pct: pct(harness),
        served_per_s: served
            .into_iter()
            .map(|(role, (count, sums))| {
                let by_kind = crate::proto::Request::KINDS
                    .iter()
                    .zip(sums)
                    .filter(|(_, sum)| *sum > 0.0)
                    .map(|(k, sum)| (*k, sum / count as f64))
                    .collect();
                (role, by_kind)
            })
            .collect(),
    }
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
async fn wait_for(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> bool,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    loop {
        if check() {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > limit {
            anyhow::bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node's place in Raft as its own metrics say, for a failure's report.
fn describe_raft(node: &Node) -> String {
    let m = node.ledger().raft_metrics();
    let m = m.borrow();
    let membership = m.membership_config.membership();
    format!(
        "node {} applied {:?} leader {:?} vote {} voters {:?} learners {:?}",
        node.local().id,
        m.last_applied.map(|l| l.index),
        m.current_leader,
        m.vote,
        membership.voter_ids().collect::<Vec<_>>(),
        membership.learner_ids().collect::<Vec<_>>(),
    )
}

fn state_in(node: &Node, of: NodeId) -> Option<MemberState> {
    let d = node.ledger().read().ok()?;
    d.ledger.members.get(&of).map(|m| m.state)
}

fn all_alive_everywhere(nodes: &[Hollow]) -> bool {
    nodes.iter().all(|n| {
        n.node.ledger().read().is_ok_and(|d| {
            nodes.iter().all(|o| {
                d.ledger
                    .members
                    .get(&o.id)
                    .is_some_and(|m| m.state == MemberState::Alive)
            })
        })
    })
}

fn leader_of(nodes: &[Hollow]) -> Option<usize> {
    let id = nodes.first()?.node.ledger().current_leader()?;
    nodes.iter().position(|n| n.id == id)
}

pub async fn run(args: ScaleArgs) -> anyhow::Result<ScaleReport> {
    if args.nodes < 2 {
        anyhow::bail!("--nodes must be at least 2");
    }
    let base = args.data_dir.clone().unwrap_or_else(|| {
        let shm = PathBuf::from("/dev/shm");
        if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        }
    });
    let dir = tempfile::Builder::new()
        .prefix("shoal-scale-")
        .tempdir_in(&base)?;
    let mut report = ScaleReport {
        nodes: args.nodes,
        ..ScaleReport::default()
    };

    // Bootstrap, then joins `join_parallel` at a time.
    let (first, admin) = launch(
        "hn0".into(),
        hollow_config(dir.path(), 0),
        StartMode::Bootstrap,
    )
    .await?;
    let admin_token =
        admin.ok_or_else(|| anyhow::anyhow!("the bootstrap returned no admin token"))?;
    let ledger = first.node.ledger().clone();
    let caller = auth::caller(&ledger, &admin_token)
        .ok_or_else(|| anyhow::anyhow!("the admin token is unknown"))?;
    let join_token = auth::create_join_token(
        &ledger,
        &caller,
        Duration::from_secs(24 * 3600),
        u32::try_from(args.nodes)?,
        true,
    )
    .await
    .map_err(|e| anyhow::anyhow!("cannot create a join token: {e}"))?
    .token;
    let seed = first.rpc_addr;
    let mut nodes = vec![first];
    let joins_started = Instant::now();
    let mut next = 1;
    while next < args.nodes {
        let wave: Vec<usize> = (next..args.nodes.min(next + args.join_parallel.max(1))).collect();
        next += wave.len();
        let launches = wave.iter().map(|&i| {
            launch(
                format!("hn{i}"),
                hollow_config(dir.path(), i),
                StartMode::Join {
                    addr: seed,
                    token: join_token.clone(),
                },
            )
        });
        for joined in futures::future::join_all(launches).await {
            nodes.push(joined?.0);
        }
        eprintln!("scale: {} of {} nodes joined", nodes.len(), args.nodes);
    }
    let formed = wait_for(
        "every node alive in every ledger",
        Duration::from_secs(60 + args.nodes as u64),
        || all_alive_everywhere(&nodes),
    )
    .await;
    report.join_s = joins_started.elapsed().as_secs_f64();
    if let Err(e) = formed {
        shutdown(&mut nodes);
        return Err(e);
    }
    eprintln!(
        "scale: all {} nodes alive everywhere after {:.1} s",
        args.nodes, report.join_s
    );

    if args.replicas_first {
        match replicas_first(&nodes) {
            Ok(niced) => report.relayed_threads_niced = niced,
            Err(e) => {
                shutdown(&mut nodes);
                return Err(e);
            }
        }
    }

    // False downs, watched on the leader's ledger from here on.
    let killed: Arc<Mutex<BTreeSet<NodeId>>> = Arc::default();
    let false_downs: Arc<Mutex<BTreeMap<NodeId, &'static str>>> = Arc::default();
    let phase: Arc<Mutex<&'static str>> = Arc::new(Mutex::new("settle"));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let ledgers: Vec<Arc<Node>> = nodes.iter().map(|n| n.node.clone()).collect();
        let (killed, false_downs, watching, phase) = (
            killed.clone(),
            false_downs.clone(),
            watching.clone(),
            phase.clone(),
        );
        tokio::spawn(async move {
            while watching.load(Ordering::Relaxed) {
                let leader = ledgers.iter().find(|n| {
                    n.ledger().is_leader() && !killed.lock().is_ok_and(|k| k.contains(&n.id()))
                });
                if let Some(l) = leader {
                    if let Ok(d) = l.ledger().read() {
                        let killed = killed.lock().map(|k| k.clone()).unwrap_or_default();
                        for m in d.ledger.members.values() {
                            if m.state == MemberState::Down && !killed.contains(&m.id) {
                                let now = phase.lock().map(|p| *p).unwrap_or("?");
                                if let Ok(mut f) = false_downs.lock() {
                                    f.entry(m.id).or_insert(now);
                                }
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let enter = |name: &'static str| {
        if let Ok(mut p) = phase.lock() {
            *p = name;
        }
    };
    // Idle.
    tokio::time::sleep(args.settle).await;
    enter("idle");
    let leader = leader_of(&nodes).ok_or_else(|| anyhow::anyhow!("no leader"))?;
    let applied = |n: &Hollow| {
        n.node
            .ledger()
            .raft_metrics()
            .borrow()
            .last_applied
            .map(|l| l.index)
            .unwrap_or(0)
    };
    let entries_before = applied(&nodes[leader]);
    let before = mark(&nodes);
    tokio::time::sleep(args.idle).await;
    let after = mark(&nodes);
    report.idle_entries_per_s = (applied(&nodes[leader]) - entries_before) as f64
        / after.at.duration_since(before.at).as_secs_f64();
    let replicas = nodes[leader].node.ledger().replicas();
    report.idle = cost(&nodes, nodes[leader].id, &replicas, &before, &after);
    report.leader_cpu_pct = report.idle.leader_cpu_pct;
    report.leader_bytes_per_s = report.idle.leader_bytes_per_s;
    report.node_cpu_pct = report.idle.node_cpu_pct;
    report.node_bytes_per_s = report.idle.node_bytes_per_s;
    report.node_rss_mb = crate::procstat::read_self()
        .map(|p| p.resident_bytes as f64 / 1_048_576.0 / args.nodes as f64)
        .unwrap_or(0.0);
    // Kept even if a later phase fails on an overloaded machine.
    eprintln!(
        "scale: idle {}",
        serde_json::to_string(&report.idle).unwrap_or_default()
    );

    // Gangs, with sequential writes beside them.
    enter("gangs");
    let client = Arc::new(shoal_sdk::Client::new(
        nodes[leader].api_url.clone(),
        Some(admin_token.clone()),
    ));
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (client, writing) = (client.clone(), writing.clone());
        tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while writing.load(Ordering::Relaxed) {
                let t = Instant::now();
                if client
                    .put_attr(&format!("scale/{}", i % 64), "v")
                    .await
                    .is_ok()
                {
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            lat
        })
    };
    let gang_nodes = 8.min(args.nodes) as u32;
    let (mut placed, mut known) = (Vec::new(), Vec::new());
    let leader_node = nodes[leader].node.clone();
    let by_id: BTreeMap<NodeId, Arc<Node>> = nodes.iter().map(|n| (n.id, n.node.clone())).collect();
    for _ in 0..args.gangs {
        let request = shoal_sdk::JobSubmitRequest::shell(gang_nodes, 8, "exec sleep 600");
        let t0 = Instant::now();
        let job = client
            .submit_job(&request)
            .await
            .map_err(|e| anyhow::anyhow!("submit: {e}"))?
            .id;
        let mut on = Vec::new();
        wait_for("the gang placed", Duration::from_secs(30), || {
            leader_node
                .ledger()
                .read()
                .is_ok_and(|d| match d.ledger.workload.jobs.get(&job) {
                    Some(j) if j.state == JobState::Running => {
                        on = j
                            .alloc
                            .as_ref()
                            .map(|a| a.nodes.iter().map(|(id, _)| *id).collect())
                            .unwrap_or_default();
                        true
                    }
                    _ => false,
                })
        })
        .await?;
        placed.push(t0.elapsed().as_secs_f64() * 1e3);
        wait_for(
            "the gang known on its nodes",
            Duration::from_secs(30),
            || {
                on.iter().all(|id| {
                    by_id.get(id).is_some_and(|n| {
                        n.ledger().read().is_ok_and(|d| {
                            d.ledger
                                .workload
                                .jobs
                                .get(&job)
                                .is_some_and(|j| j.state == JobState::Running)
                        })
                    })
                })
            },
        )
        .await?;
        known.push(t0.elapsed().as_secs_f64() * 1e3);
        // On a saturated machine a forwarded write can time out after it
        // committed; ask again until it answers or the job is over.
        let cancel_from = Instant::now();
        while let Err(e) = client.cancel_job(job).await {
            let over = leader_node.ledger().read().is_ok_and(|d| {
                d.ledger
                    .workload
                    .jobs
                    .get(&job)
                    .is_some_and(|j| j.state.is_final())
            });
            if over {
                break;
            }
            if cancel_from.elapsed() > Duration::from_secs(30) {
                anyhow::bail!("cancel: {e}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        wait_for(
            "the gang's GPUs free again",
            Duration::from_secs(30),
            || {
                leader_node.ledger().read().is_ok_and(|d| {
                    d.ledger
                        .workload
                        .jobs
                        .get(&job)
                        .is_some_and(|j| j.state.is_final() && j.alloc.is_none())
                })
            },
        )
        .await?;
    }
    writing.store(false, Ordering::Relaxed);
    let mut writes = writer.await.unwrap_or_default();
    for v in [&mut placed, &mut known, &mut writes] {
        v.sort_by(f64::total_cmp);
    }
    report.gangs = args.gangs;
    report.gang_placed_p50_ms = percentile(&placed, 0.5);
    report.gang_placed_p99_ms = percentile(&placed, 0.99);
    report.gang_start_p50_ms = percentile(&known, 0.5);
    report.gang_start_p99_ms = percentile(&known, 0.99);
    report.writes = writes.len();
    report.ledger_write_p50_ms = percentile(&writes, 0.5);
    report.ledger_write_p99_ms = percentile(&writes, 0.99);

    // Kill 1 % at once (never the leader).
    enter("kill");
    let kill = (args.nodes / 100).max(1);
    let victims: Vec<usize> = {
        let leader_id = nodes[leader].id;
        let candidates: Vec<usize> = (0..nodes.len())
            .filter(|&i| nodes[i].id != leader_id)
            .collect();
        // Spread over the range rather than random: reproducible runs.
        (0..kill)
            .map(|k| candidates[(k * candidates.len()) / kill + candidates.len() / (2 * kill)])
            .collect()
    };
    let victim_ids: Vec<NodeId> = victims.iter().map(|&i| nodes[i].id).collect();
    if let Ok(mut k) = killed.lock() {
        k.extend(victim_ids.iter().copied());
    }
    let t0 = Instant::now();
    for &i in &victims {
        nodes[i].stop(Stop::Kill);
    }
    let survivors: Vec<Arc<Node>> = nodes
        .iter()
        .filter(|n| !victim_ids.contains(&n.id))
        .map(|n| n.node.clone())
        .collect();
    let everywhere = wait_for(
        "the killed nodes down everywhere",
        Duration::from_secs(60),
        || {
            survivors.iter().all(|s| {
                victim_ids
                    .iter()
                    .all(|v| state_in(s, *v) == Some(MemberState::Down))
            })
        },
    )
    .await;
    if let Err(e) = everywhere {
        let behind: Vec<String> = survivors
            .iter()
            .filter(|s| {
                victim_ids
                    .iter()
                    .any(|v| state_in(s, *v) != Some(MemberState::Down))
            })
            .map(|s| describe_raft(s))
            .collect();
        anyhow::bail!("{e}; survivors that do not see it: {}", behind.join("; "));
    }
    report.killed = kill;
    report.down_detect_s = t0.elapsed().as_secs_f64();

    watching.store(false, Ordering::Relaxed);
    let _ = watcher.await;
    if let Ok(f) = false_downs.lock() {
        report.false_downs = f.len();
        for phase in f.values() {
            *report.false_downs_by_phase.entry(phase).or_default() += 1;
        }
    }
    shutdown(&mut nodes);
    Ok(report)
}

/// The relayed members' CPU priority (nice) under `replicas_first`.
pub const RELAYED_NICE: i32 = 10;

/// Lowers the CPU priority of every relayed member's threads to
/// [`RELAYED_NICE`], leaving the leader and the Raft replicas at 0; returns
/// how many threads it lowered. Every hollow node shares this machine's
/// cores, so each ledger entry wakes every member at once and the leader
/// and the voters that must commit the next one wait behind them: at 100
/// nodes that, not the leader's work, made a gang's placement and a write
/// several times slower. A real region gives each member its own machine,
/// and kubemark likewise runs its control plane apart from the hollow
/// nodes. The members still get all the CPU the control plane leaves, so
/// their own costs are measured as before. A member made a replica later
/// (one replacing a killed replica) keeps the lower priority.
fn replicas_first(nodes: &[Hollow]) -> anyhow::Result<usize> {
    let leader = leader_of(nodes).ok_or_else(|| anyhow::anyhow!("no leader"))?;
    let replicas = nodes[leader].node.ledger().replicas();
    let threads = crate::procstat::thread_ids_by_name();
    let mut niced = 0;
    for n in nodes.iter().filter(|n| !replicas.contains(&n.id)) {
        for tid in threads.get(&n.thread).into_iter().flatten() {
            let Some(pid) = rustix::process::Pid::from_raw(*tid) else {
                continue;
            };
            match rustix::process::setpriority_process(Some(pid), RELAYED_NICE) {
                Ok(()) => niced += 1,
                // The thread ended meanwhile (a runtime's idle blocking thread).
                Err(rustix::io::Errno::SRCH) => {}
                Err(e) => anyhow::bail!("lowering the priority of {}: {e}", n.thread),
            }
        }
    }
    Ok(niced)
}

fn shutdown(nodes: &mut [Hollow]) {
    for n in nodes.iter_mut() {
        n.stop(Stop::Graceful);
    }
}

pub fn print(r: &ScaleReport) {
    println!("hollow nodes: {}", r.nodes);
    println!("  join of all nodes:         {:.1} s", r.join_s);
    let c = &r.idle;
    println!(
        "  idle, per node:            {:.2} % of a core (max {:.2} %), {:.0} B/s ({:.0} gossip), RSS {:.1} MB (process / nodes)",
        c.node_cpu_pct, c.node_cpu_max_pct, c.node_bytes_per_s, c.node_gossip_bytes_per_s, r.node_rss_mb
    );
    println!(
        "  idle, by role:             {} other replicas {:.2} % {:.0} B/s, {} relayed {:.2} % {:.0} B/s",
        c.replicas,
        c.replica_cpu_pct,
        c.replica_bytes_per_s,
        c.relayed,
        c.relayed_cpu_pct,
        c.relayed_bytes_per_s
    );
    println!(
        "  idle, leader:              {:.2} % of a core, {:.0} B/s ({:.0} gossip) (harness {:.1} %); {:.1} ledger entries/s",
        c.leader_cpu_pct, c.leader_bytes_per_s, c.leader_gossip_bytes_per_s, c.harness_cpu_pct, r.idle_entries_per_s
    );
    println!(
        "  gang {}: placed p50 {:.1} ms p99 {:.1} ms, known on its nodes p50 {:.1} ms p99 {:.1} ms",
        r.gangs,
        r.gang_placed_p50_ms,
        r.gang_placed_p99_ms,
        r.gang_start_p50_ms,
        r.gang_start_p99_ms
    );
    println!(
        "  ledger writes {}: p50 {:.1} ms p99 {:.1} ms",
        r.writes, r.ledger_write_p50_ms, r.ledger_write_p99_ms
    );
    println!(
        "  {} killed: down in every survivor's ledger after {:.2} s; false downs {} {:?}",
        r.killed, r.down_detect_s, r.false_downs, r.false_downs_by_phase
    );
}
