//! The cluster of a chaos run: in-process agents on 127.0.0.1 with real
//! QUIC, each on a tokio runtime of its own, so that one node can be
//! crashed (its runtime dropped), paused (its only worker thread blocked:
//! timers, I/O and Raft stop while its ranks keep running, as under SIGSTOP
//! of the agent) or given a wall clock of its own, while the others go on.
//!
//! Every node keeps the addresses its slot was given at the start, across
//! restarts and replacements, so clients of the run always know where its
//! API is.

use crate::agent::testkit::node_config;
use crate::agent::{Agent, StartMode};
use crate::clock;
use crate::config::Config;
use crate::faults::chaos_hooks::ChaosHooks;
use crate::faults::FaultRouter;
use crate::trust::auth;
use shoal_consensus::NodeId;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// How long a crashed node's runtime may take to finish its blocking work
/// (a redb commit, a chunk write) before it is dropped regardless.
const CRASH_GRACE: Duration = Duration::from_secs(10);

/// One attempt to start a node (a join waits for a leader) gives up after
/// this long, so that a start that hangs shows as a failed restore rather
/// than a run that never ends.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Joins a run's join token admits: every replacement joins again.
const JOIN_USES: u32 = 1_000;

/// A started node and the runtime it lives on.
struct Running {
    runtime: Runtime,
    agent: Agent,
}

/// One position of the cluster and whatever node holds it now.
pub struct Slot {
    /// The node's name now; a replacement gets a new one.
    pub name: String,
    generation: u32,
    cfg: Config,
    skew: Arc<AtomicI64>,
    running: Option<Running>,
    /// Dropping it resumes a paused node.
    pause: Option<std::sync::mpsc::Sender<()>>,
    /// The node id now, once it has started.
    pub id: Option<NodeId>,
}

impl Slot {
    pub fn api_url(&self) -> String {
        format!("http://{}", self.cfg.api_addr)
    }

    pub fn rpc_addr(&self) -> SocketAddr {
        self.cfg.rpc_addr
    }

    pub fn agent(&self) -> Option<&Agent> {
        self.running.as_ref().map(|r| &r.agent)
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    pub fn is_paused(&self) -> bool {
        self.pause.is_some()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.cfg.data_dir()
    }
}

pub struct ChaosCluster {
    pub slots: Vec<Slot>,
    pub router: FaultRouter,
    pub admin_token: String,
    join_token: String,
    /// Builds each node's hooks from its name.
    hooks: Arc<dyn Fn(&str) -> ChaosHooks + Send + Sync>,
    tweak: Arc<dyn Fn(&mut Config) + Send + Sync>,
    root: PathBuf,
    /// A file system per slot, for disk-full faults; `None`: all nodes
    /// share the run's.
    disks: Option<super::disks::Disks>,
    /// Nodes whose data dir is gone for good (wiped, or removed and
    /// replaced), shared with the run's observer.
    pub lost_disks: super::observe::LostDisks,
    /// The ports this cluster's slots may listen on.
    ports: super::ports::PortLease,
}

fn node_runtime(name: &str, skew: Arc<AtomicI64>) -> Result<Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(format!("{}{name}", super::panics::THREAD_PREFIX))
        .enable_all()
        .on_thread_start(move || clock::skew_this_thread(skew.clone()))
        .build()
        .map_err(|e| format!("cannot start a runtime for {name}: {e}"))
}

/// Starts an agent on a runtime of its own.
async fn start_on_own_runtime(
    cfg: Config,
    mode: StartMode,
    skew: Arc<AtomicI64>,
) -> Result<Running, String> {
    let name = cfg.name.clone().unwrap_or_default();
    let runtime = node_runtime(&name, skew)?;
    let mut start = runtime.spawn(Agent::start(cfg, mode));
    let why = match tokio::time::timeout(START_TIMEOUT, &mut start).await {
        Ok(Ok(Ok(agent))) => return Ok(Running { runtime, agent }),
        Ok(Ok(Err(e))) => e.to_string(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => {
            start.abort();
            format!("no answer in {START_TIMEOUT:?}")
        }
    };
    stop_runtime(runtime, None).await;
    Err(format!("{name} did not start: {why}"))
}

/// Drops a node without a goodbye: its tasks stop where they are.
async fn stop_runtime(runtime: Runtime, agent: Option<Agent>) {
    let _ = tokio::task::spawn_blocking(move || {
        {
            let _inside = runtime.enter();
            drop(agent);
        }
        runtime.shutdown_timeout(CRASH_GRACE);
    })
    .await;
}

impl ChaosCluster {
    /// Starts `n` nodes under `root`: the first bootstraps, the others
    /// join. With `own_disks`, each slot's node gets a file system of its
    /// own (root only), which [`ChaosCluster::fill_disk`] can fill.
    pub async fn start(
        root: &Path,
        n: usize,
        router: FaultRouter,
        hooks: Arc<dyn Fn(&str) -> ChaosHooks + Send + Sync>,
        tweak: Arc<dyn Fn(&mut Config) + Send + Sync>,
        own_disks: bool,
    ) -> Result<ChaosCluster, String> {
        let disks = match own_disks {
            true => Some(super::disks::Disks::mount(root, n)?),
            false => None,
        };
        let mut cluster = ChaosCluster {
            slots: Vec::new(),
            router,
            admin_token: String::new(),
            join_token: String::new(),
            hooks,
            tweak,
            root: root.to_path_buf(),
            disks,
            lost_disks: Default::default(),
            ports: Default::default(),
        };
        for i in 0..n {
            let name = format!("n{}", i + 1);
            let cfg = cluster.config_for(i, &name, None)?;
            cluster.slots.push(Slot {
                name,
                generation: 0,
                cfg,
                skew: Arc::new(AtomicI64::new(0)),
                running: None,
                pause: None,
                id: None,
            });
        }
        // A cluster that fails to form still owns runtimes; dropping a
        // runtime inside async code panics, so every started node is
        // crashed before the error goes up.
        if let Err(e) = cluster.form().await {
            cluster.shutdown().await;
            return Err(e);
        }
        Ok(cluster)
    }

    /// Bootstraps slot 0 and joins every other slot through it.
    async fn form(&mut self) -> Result<(), String> {
        let first = start_on_own_runtime(
            self.slots[0].cfg.clone(),
            StartMode::Bootstrap,
            self.slots[0].skew.clone(),
        )
        .await?;
        let boot = first.agent.bootstrap.clone();
        let ledger = first.agent.node().ledger().clone();
        self.slots[0].id = Some(first.agent.id());
        self.slots[0].running = Some(first);
        let boot = boot.ok_or("the bootstrap returned no tokens")?;
        let admin = auth::caller(&ledger, &boot.admin_token).ok_or("the admin token is unknown")?;
        self.join_token = auth::create_join_token(
            &ledger,
            &admin,
            Duration::from_secs(24 * 3600),
            JOIN_USES,
            true,
        )
        .await
        .map_err(|e| format!("cannot create a join token: {e}"))?
        .token;
        self.admin_token = boot.admin_token;
        for i in 1..self.slots.len() {
            self.join(i, Instant::now() + Duration::from_secs(60))
                .await?;
        }
        Ok(())
    }

    /// The config of `slot` under the node name `name`: the slot's ports
    /// (kept from `keep` when given), a data dir of this name.
    fn config_for(&self, slot: usize, name: &str, keep: Option<&Config>) -> Result<Config, String> {
        let mut cfg = node_config(&self.root, slot);
        cfg.name = Some(name.into());
        let disk = self
            .disks
            .as_ref()
            .and_then(|d| d.of(slot))
            .unwrap_or(&self.root);
        cfg.data_dir = Some(disk.join(name));
        match keep {
            Some(old) => {
                cfg.api_addr = old.api_addr;
                cfg.rpc_addr = old.rpc_addr;
                cfg.gossip_addr = old.gossip_addr;
            }
            None => {
                cfg.api_addr = SocketAddr::from(([127, 0, 0, 1], self.ports.port()?));
                cfg.rpc_addr = SocketAddr::from(([127, 0, 0, 1], self.ports.port()?));
                cfg.gossip_addr = SocketAddr::from(([127, 0, 0, 1], self.ports.port()?));
            }
        }
        cfg.test_faults = Some(self.router.clone());
        cfg.test_chaos = Some((self.hooks)(name));
        (self.tweak)(&mut cfg);
        Ok(cfg)
    }

    /// A running, unpaused slot other than `not`, to join through.
    fn contact(&self, not: usize) -> Option<SocketAddr> {
        self.slots
            .iter()
            .enumerate()
            .find(|(i, s)| *i != not && s.is_running() && !s.is_paused())
            .map(|(_, s)| s.rpc_addr())
    }

    /// Joins `slot`'s node (with an empty data dir) through any running
    /// node, retrying until `deadline`: a join needs a leader, which a
    /// partition may take away for a while.
    pub async fn join(&mut self, slot: usize, deadline: Instant) -> Result<(), String> {
        let mut last = String::from("no running node to join through");
        while Instant::now() < deadline {
            if let Some(addr) = self.contact(slot) {
                let s = &self.slots[slot];
                let _ = std::fs::remove_dir_all(s.data_dir());
                let mode = StartMode::Join {
                    addr,
                    token: self.join_token.clone(),
                };
                match start_on_own_runtime(s.cfg.clone(), mode, s.skew.clone()).await {
                    Ok(running) => {
                        let s = &mut self.slots[slot];
                        s.id = Some(running.agent.id());
                        s.running = Some(running);
                        return Ok(());
                    }
                    Err(e) => last = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(format!("slot {slot} could not join: {last}"))
    }

    /// One attempt to join `slot`'s node through any running node.
    pub async fn try_join(&mut self, slot: usize) -> Result<(), String> {
        let addr = self
            .contact(slot)
            .ok_or("no running node to join through")?;
        let s = &self.slots[slot];
        let _ = std::fs::remove_dir_all(s.data_dir());
        let mode = StartMode::Join {
            addr,
            token: self.join_token.clone(),
        };
        let running = start_on_own_runtime(s.cfg.clone(), mode, s.skew.clone()).await?;
        let s = &mut self.slots[slot];
        s.id = Some(running.agent.id());
        s.running = Some(running);
        Ok(())
    }

    /// One attempt to start `slot`'s node again from its data dir.
    pub async fn try_restart(&mut self, slot: usize) -> Result<(), String> {
        let s = &self.slots[slot];
        let running =
            start_on_own_runtime(s.cfg.clone(), StartMode::Restart, s.skew.clone()).await?;
        self.slots[slot].running = Some(running);
        Ok(())
    }

    /// Whether the cluster has its full strength: every slot's node runs,
    /// unpaused, and every node agrees on a voter set of the size the
    /// cluster aims for, made only of the slots' current nodes. Taking a
    /// node away from a cluster that is not whole could take a majority
    /// of the voters' data, which no design survives.
    pub fn is_whole(&self) -> bool {
        let current: std::collections::BTreeSet<NodeId> =
            self.slots.iter().filter_map(|s| s.id).collect();
        let want = shoal_consensus::voters::target_voter_count(self.slots.len(), self.slots.len());
        let mut agreed = None;
        for s in &self.slots {
            let Some(agent) = s.agent() else { return false };
            if s.is_paused() {
                return false;
            }
            let voters = agent.voters();
            if !voters.is_subset(&current) || Some(voters.len()) != want {
                return false;
            }
            match &agreed {
                None => agreed = Some(voters),
                Some(v) if *v != voters => return false,
                Some(_) => {}
            }
        }
        true
    }

    /// Stops `slot`'s node abruptly (a paused one is resumed first, so its
    /// runtime can stop).
    pub async fn crash(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        s.pause = None;
        if let Some(Running { runtime, agent }) = s.running.take() {
            super::panics::set_crashing(&s.name, true);
            stop_runtime(runtime, Some(agent)).await;
            super::panics::set_crashing(&s.name, false);
        }
    }

    /// Gives `slot` a new node name and an empty data dir (the machine was
    /// replaced); [`ChaosCluster::join`] starts it.
    pub fn replace(&mut self, slot: usize) -> Result<String, String> {
        let old = self.slots[slot].name.clone();
        if let Some(id) = self.slots[slot].id {
            self.lost_disks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(id);
        }
        let generation = self.slots[slot].generation + 1;
        let name = format!("n{}g{generation}", slot + 1);
        let cfg = self.config_for(slot, &name, Some(&self.slots[slot].cfg))?;
        let _ = std::fs::remove_dir_all(self.slots[slot].data_dir());
        let s = &mut self.slots[slot];
        s.name = name;
        s.generation = generation;
        s.cfg = cfg;
        s.id = None;
        Ok(old)
    }

    /// Freezes `slot`'s node: its one worker thread blocks until resumed.
    pub fn pause(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        let Some(running) = &s.running else { return };
        if s.pause.is_some() {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // The blocking receive holds the runtime's only worker.
        running.runtime.spawn(async move {
            let _ = rx.recv();
        });
        s.pause = Some(tx);
    }

    pub fn resume(&mut self, slot: usize) {
        self.slots[slot].pause = None;
    }

    /// Slots whose node runs but whose ledger stopped for good: the agent
    /// would exit (see [`Agent::ledger_stopped_for_good`]).
    pub fn stopped_ledgers(&self) -> Vec<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                !s.is_paused() && s.agent().is_some_and(|a| a.ledger_stopped().is_some())
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Slots whose running node heard that it was removed from the
    /// cluster: its agent exits (see [`Agent::removed_from_cluster`]).
    pub fn stopped_as_removed(&self) -> Vec<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_paused() && s.agent().is_some_and(|a| a.removed().is_some()))
            .map(|(i, _)| i)
            .collect()
    }

    /// Slots whose running node the others' ledgers record as removed: a
    /// `remove-voter` fault whose removal answered too late for the run to
    /// see it committed, or a node cut off while it was removed. The node
    /// must notice and stop on its own ([`Self::stopped_as_removed`]); one
    /// still here when the run settles is a violation.
    pub fn removed_but_running(&self) -> Vec<usize> {
        let left = |id: NodeId| {
            self.slots.iter().any(|other| {
                other.id != Some(id)
                    && other.agent().is_some_and(|a| {
                        a.ledger().read().is_ok_and(|d| {
                            d.ledger
                                .members
                                .get(&id)
                                .is_some_and(|m| m.state == shoal_sdk::MemberState::Left)
                        })
                    })
            })
        };
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_running() && !s.is_paused() && s.id.is_some_and(left))
            .map(|(i, _)| i)
            .collect()
    }

    /// Fills `slot`'s file system; false when the nodes have no disks of
    /// their own (the fault then does nothing).
    pub fn fill_disk(&self, slot: usize) -> bool {
        let Some(disks) = &self.disks else {
            return false;
        };
        match disks.fill(slot) {
            Ok(bytes) => {
                tracing::info!(slot, bytes, "chaos: disk filled");
                true
            }
            Err(e) => {
                tracing::warn!(slot, error = %e, "chaos: cannot fill the disk");
                false
            }
        }
    }

    /// Frees what [`ChaosCluster::fill_disk`] took.
    pub fn free_disk(&self, slot: usize) {
        if let Some(disks) = &self.disks {
            disks.free(slot);
        }
    }

    /// Moves `slot`'s wall clock by `offset_ms` from the real one.
    pub fn set_clock(&self, slot: usize, offset_ms: i64) {
        self.slots[slot].skew.store(offset_ms, Ordering::Relaxed);
    }

    pub fn client(&self, slot: usize) -> shoal_sdk::Client {
        shoal_sdk::Client::new(self.slots[slot].api_url(), Some(self.admin_token.clone()))
    }

    /// Stops every node.
    pub async fn shutdown(mut self) {
        for slot in 0..self.slots.len() {
            self.crash(slot).await;
        }
    }
}
