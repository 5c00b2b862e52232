//! A cluster of in-process agents on 127.0.0.1 with real QUIC, real TLS and
//! real fsyncs — for tests, benchmarks and demos. Each node gets its own
//! data dir under one temporary directory, removed on drop.
//!
//! [`LocalCluster::start_with_faults`] gives every node one shared
//! [`FaultRouter`], so that a test can partition the cluster, lose or delay
//! messages on its links, and heal it again, without root.

use crate::agent::{Agent, AgentError, StartMode};
use crate::config::Config;
use crate::faults::FaultRouter;
use crate::trust::auth;
use shoal_consensus::NodeId;
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Joins [`LocalCluster::join_token`] admits.
pub const LOCAL_CLUSTER_JOIN_USES: u32 = 64;

pub struct LocalCluster {
    pub agents: Vec<Agent>,
    pub admin_token: String,
    /// A join token for [`LOCAL_CLUSTER_JOIN_USES`] joins, which the
    /// cluster's own joins and a test's later ones share (the bootstrap's
    /// printed token is single use).
    pub join_token: String,
    faults: Option<FaultRouter>,
    dir: tempfile::TempDir,
}

/// Config of the i-th node (0-based) under `root`: loopback, ephemeral
/// ports, four simulated H100s. Ranks run as the user running the cluster
/// (root allowed): one process, one user, as on a laptop.
pub fn node_config(root: &std::path::Path, i: usize) -> Config {
    let name = format!("n{}", i + 1);
    let mut cfg = Config {
        name: Some(name.clone()),
        data_dir: Some(root.join(&name)),
        api_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        rpc_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        gossip_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        sim_gpus: Some("4xH100-80GB".into()),
        ..Config::default()
    };
    cfg.executor.run_as = Some(crate::executor::account::AGENT_USER.into());
    cfg.executor.allow_root = true;
    cfg
}

impl LocalCluster {
    /// Starts `n` nodes: the first bootstraps, the others join through it.
    /// `tweak` may adjust each node's config (labels, timings).
    pub async fn start(n: usize, tweak: impl Fn(usize, &mut Config)) -> Result<Self, AgentError> {
        Self::start_inner(n, None, tweak).await
    }

    /// Like [`LocalCluster::start`], with `router` installed in every node
    /// (`Config::test_faults`, set before `tweak` runs): filters added to it
    /// later reach the running nodes at once. Filters already on it apply
    /// from the first message on, so the cluster forms only if they let the
    /// joins' Raft traffic through.
    pub async fn start_with_faults(
        n: usize,
        router: FaultRouter,
        tweak: impl Fn(usize, &mut Config),
    ) -> Result<Self, AgentError> {
        Self::start_inner(n, Some(router), tweak).await
    }

    async fn start_inner(
        n: usize,
        faults: Option<FaultRouter>,
        tweak: impl Fn(usize, &mut Config),
    ) -> Result<Self, AgentError> {
        let tweak = |i: usize, cfg: &mut Config| {
            cfg.test_faults = faults.clone();
            tweak(i, cfg);
        };
        let dir = tempfile::Builder::new()
            .prefix("shoal-cluster-")
            .tempdir()
            .map_err(|e| AgentError::Io(format!("cannot create a temp dir: {e}")))?;
        let mut cfg = node_config(dir.path(), 0);
        tweak(0, &mut cfg);
        let first = Agent::start(cfg, StartMode::Bootstrap).await?;
        let boot = first
            .bootstrap
            .clone()
            .ok_or_else(|| AgentError::Raft("bootstrap returned no tokens".into()))?;
        let ledger = first.node().ledger().clone();
        let admin = auth::caller(&ledger, &boot.admin_token)
            .ok_or_else(|| AgentError::Raft("the admin token is unknown".into()))?;
        let join_token = auth::create_join_token(
            &ledger,
            &admin,
            Duration::from_secs(24 * 3600),
            LOCAL_CLUSTER_JOIN_USES,
            true,
        )
        .await
        .map_err(|e| AgentError::Raft(format!("cannot create a join token: {e}")))?
        .token;
        let mut agents = vec![first];
        for i in 1..n {
            let mut cfg = node_config(dir.path(), i);
            tweak(i, &mut cfg);
            let mode = StartMode::Join {
                addr: agents[0].rpc_addr(),
                token: join_token.clone(),
            };
            agents.push(Agent::start(cfg, mode).await?);
        }
        Ok(LocalCluster {
            agents,
            admin_token: boot.admin_token,
            join_token,
            faults,
            dir,
        })
    }

    /// Waits until every node's own ledger lists every node as an alive
    /// member, and node 0's API says so too. Node 0's answer alone says
    /// nothing of what a follower has applied: a test that then acts
    /// through a follower (pushes chunks from it, places from its view)
    /// relies on that follower's ledger.
    pub async fn wait_all_alive(&self, timeout: Duration) -> Result<Duration, String> {
        let want = self.agents.len();
        self.wait_until("every node alive in every ledger", timeout, |c| {
            let everywhere = c.agents.iter().all(|a| {
                a.ledger().read().is_ok_and(|d| {
                    c.agents.iter().all(|other| {
                        d.ledger
                            .members
                            .get(&other.id())
                            .is_some_and(|m| m.state == shoal_sdk::MemberState::Alive)
                    })
                })
            });
            let client = c.client(0);
            async move {
                everywhere
                    && client.nodes().await.is_ok_and(|n| {
                        n.len() == want
                            && n.iter().all(|m| m.state == shoal_sdk::MemberState::Alive)
                    })
            }
        })
        .await
    }

    /// The fault router every node shares, when started with one.
    pub fn faults(&self) -> Option<&FaultRouter> {
        self.faults.as_ref()
    }

    /// The agent with node id `id`.
    pub fn agent(&self, id: NodeId) -> Option<&Agent> {
        self.agents.iter().find(|a| a.id() == id)
    }

    pub fn root(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn client(&self, i: usize) -> shoal_sdk::Client {
        shoal_sdk::Client::new(self.agents[i].api_url(), Some(self.admin_token.clone()))
    }

    /// The agent every running node agrees is leader, if they agree.
    pub fn agreed_leader(&self) -> Option<&Agent> {
        let first = self.agents.first()?.current_leader()?;
        if self
            .agents
            .iter()
            .all(|a| a.current_leader() == Some(first))
        {
            self.agents.iter().find(|a| a.id() == first)
        } else {
            None
        }
    }

    /// Waits until `check` holds, polling every 50 ms, for at most `timeout`.
    pub async fn wait_until<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> Result<Duration, String>
    where
        F: FnMut(&Self) -> Fut,
        Fut: Future<Output = bool>,
    {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if check(self).await {
                return Ok(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("timed out after {timeout:?} waiting for {what}"))
    }

    pub async fn shutdown(self) {
        for a in &self.agents {
            a.shutdown().await;
        }
    }
}
