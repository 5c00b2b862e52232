//! The node agent: starts (bootstrap, join or restart), wires mesh RPC,
//! the Raft ledger and the HTTP API together, and routes requests that only
//! the leader may serve.

use crate::config::Config;
use crate::identity::{self, Identity, RuntimeInfo};
use crate::metrics::Metrics;
use crate::proto::{
    self, ErrorCode, JoinRequest, JoinResponse, Query, Request, Response, WireError,
};
use crate::transport::MeshTransport;
use openraft::error::{ChangeMembershipError, CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState, SnapshotPolicy};
use shoal_consensus::network::{ContactTracker, NetworkFactory, RaftRpc, RaftRpcReply};
use shoal_consensus::store::{open_db, LedgerHandle, LogStore, StateMachineStore};
use shoal_consensus::types::Raft;
use shoal_consensus::{Command, LedgerResponse, MemberSpec, NodeId};
use shoal_mesh::{CaBundle, NodeCredentials, PeerInfo, RpcEndpoint, RpcHandler};
use shoal_sdk::{MemberState, MemberSummary, NodeInfo, StatusResponse};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// How the agent starts.
#[derive(Clone, Debug)]
pub enum StartMode {
    /// Create a new cluster with this node as its first member.
    Bootstrap,
    /// Join the cluster that `addr` belongs to.
    Join { addr: SocketAddr, token: String },
    /// Restart from the identity in the data dir.
    Restart,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Join(String),
    #[error("{0}")]
    Raft(String),
}

pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How long a follower waits for an unknown API token to appear in its
/// ledger before refusing it (see `Inner::caller_eventually`).
const TOKEN_CATCH_UP: Duration = Duration::from_secs(2);

/// A running node.
#[derive(Clone)]
pub struct Agent {
    pub(crate) inner: Arc<Inner>,
    /// Set when this start bootstrapped a cluster.
    pub bootstrap: Option<BootstrapInfo>,
}

#[derive(Clone, Debug)]
pub struct BootstrapInfo {
    pub admin_token: String,
    pub join_token: String,
}

pub struct Inner {
    pub id: NodeId,
    pub name: String,
    pub cfg: Config,
    pub data_dir: PathBuf,
    pub raft: Raft,
    pub ledger: LedgerHandle,
    pub rpc: RpcEndpoint,
    pub contacts: ContactTracker,
    pub rpc_addr: SocketAddr,
    pub api_addr: SocketAddr,
    pub spec: MemberSpec,
    pub metrics: Metrics,
    /// Gossip-fed view of the other members (failure detector, coordinates, adverts).
    pub peers: crate::peers::SharedPeerView,
    pub gpu: std::sync::Mutex<GpuState>,
    /// Checkpoint chunks held by this node (its own and replicas for peers).
    pub chunks: Arc<shoal_storage::ChunkStore>,
    batcher: crate::batcher::Batcher,
    pub started: Instant,
    shutdown: watch::Sender<bool>,
}

pub struct GpuState {
    pub source: Option<Box<dyn crate::gpu::GpuSource>>,
    /// Present when the GPUs are simulated.
    pub faults: Option<crate::gpu::sim::FaultInjector>,
    pub latest: Vec<crate::gpu::GpuSample>,
}

struct NodeRpc {
    inner: OnceLock<Weak<Inner>>,
}

impl RpcHandler for NodeRpc {
    fn handle(&self, peer: PeerInfo, body: Vec<u8>) -> shoal_mesh::rpc::RpcFuture {
        let inner = self.inner.get().and_then(Weak::upgrade);
        Box::pin(async move {
            let Some(inner) = inner else {
                return proto::encode(&Response::Error(WireError::new(
                    ErrorCode::Unavailable,
                    "the node is still starting",
                )));
            };
            let resp = match proto::decode::<Request>(&body) {
                Ok(req) => inner.serve_rpc(peer, req).await,
                Err(e) => Response::Error(e),
            };
            proto::encode(&resp)
        })
    }
}

fn io(what: &str, e: impl std::fmt::Display) -> AgentError {
    AgentError::Io(format!("{what}: {e}"))
}

/// The address peers should use: explicit, else the bound one, else the
/// interface that routes towards the join address, else loopback.
fn advertise_ip(cfg: &Config, join: Option<SocketAddr>) -> IpAddr {
    if let Some(ip) = cfg.advertise {
        return ip;
    }
    if !cfg.rpc_addr.ip().is_unspecified() {
        return cfg.rpc_addr.ip();
    }
    if let Some(target) = join {
        // connect() on UDP only selects a route; nothing is sent.
        if let Ok(sock) = std::net::UdpSocket::bind(("0.0.0.0", 0)) {
            if sock.connect(target).is_ok() {
                if let Ok(local) = sock.local_addr() {
                    return local.ip();
                }
            }
        }
    }
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

impl Agent {
    pub async fn start(cfg: Config, mode: StartMode) -> Result<Agent, AgentError> {
        cfg.validate().map_err(AgentError::Config)?;
        let data_dir = cfg.data_dir();
        // Refuse a wrong start mode before touching anything.
        let existing = identity::load_identity(&data_dir).map_err(AgentError::Config)?;
        match (&mode, &existing) {
            (StartMode::Restart, None) => {
                return Err(AgentError::Config(format!(
                    "{} holds no node identity: pass --bootstrap to create a cluster or --join ADDR --join-token TOKEN to join one",
                    data_dir.display()
                )))
            }
            (StartMode::Bootstrap | StartMode::Join { .. }, Some(id)) => {
                return Err(AgentError::Config(format!(
                    "{} already holds node '{}' (id {}) of cluster {}: start without --bootstrap/--join to restart it, or use an empty --data-dir",
                    data_dir.display(),
                    id.name,
                    id.node_id,
                    id.cluster_id
                )))
            }
            _ => {}
        }
        identity::ensure_data_dir(&data_dir)
            .map_err(|e| io(&format!("cannot create data dir {}", data_dir.display()), e))?;
        let name = cfg.node_name();
        let gpu_source =
            crate::gpu::discover(cfg.sim_gpus.as_deref(), &name).map_err(AgentError::Config)?;
        let gpus = gpu_source
            .as_ref()
            .map(|g| g.inventory())
            .unwrap_or_default();

        let rpc_socket = std::net::UdpSocket::bind(cfg.rpc_addr)
            .map_err(|e| io(&format!("cannot bind the RPC address {}", cfg.rpc_addr), e))?;
        let rpc_port = rpc_socket
            .local_addr()
            .map_err(|e| io("rpc socket", e))?
            .port();
        let api_listener = tokio::net::TcpListener::bind(cfg.api_addr)
            .await
            .map_err(|e| io(&format!("cannot bind the API address {}", cfg.api_addr), e))?;
        let api_bound = api_listener.local_addr().map_err(|e| io("api socket", e))?;
        let join_addr = match &mode {
            StartMode::Join { addr, .. } => Some(*addr),
            _ => None,
        };
        let adv = advertise_ip(&cfg, join_addr);
        let rpc_addr = SocketAddr::new(adv, rpc_port);
        let api_addr = if api_bound.ip().is_unspecified() {
            SocketAddr::new(adv, api_bound.port())
        } else {
            api_bound
        };
        let gossip_key = identity::load_or_create_gossip_key(&data_dir).map_err(AgentError::Io)?;
        let (gossip, gossip_events) =
            shoal_mesh::gossip::Gossip::start(shoal_mesh::gossip::GossipConfig {
                // RTT samples feed Vivaldi; one a second per peer converges
                // coordinates within seconds at negligible cost.
                ping_interval: Duration::from_secs(1),
                ..shoal_mesh::gossip::GossipConfig::new(gossip_key.clone(), cfg.gossip_addr)
            })
            .await
            .map_err(|e| io(&format!("cannot start gossip on {}", cfg.gossip_addr), e))?;
        let gossip_port = gossip.listen_addr().port();
        let gossip_addr = match adv {
            IpAddr::V4(ip) => format!("/ip4/{ip}/udp/{gossip_port}/quic-v1"),
            IpAddr::V6(ip) => format!("/ip6/{ip}/udp/{gossip_port}/quic-v1"),
        };
        let spec = MemberSpec {
            name: name.clone(),
            rpc_addr: rpc_addr.to_string(),
            api_addr: api_addr.to_string(),
            labels: cfg.labels.clone(),
            gpus,
            gossip_peer_id: gossip_key.public().to_peer_id().to_string(),
            gossip_addr,
        };

        let (ident, new_cluster) = match (mode, existing) {
            (StartMode::Restart, Some(id)) => (id, None),
            (StartMode::Restart, None) | (_, Some(_)) => {
                return Err(AgentError::Config(
                    "start mode and data dir disagree".into(),
                ));
            }
            (StartMode::Bootstrap, None) => {
                let cluster_id = identity::new_cluster_id();
                let ca = CaBundle::generate(&cluster_id)
                    .map_err(|e| AgentError::Config(e.to_string()))?;
                let credentials = ca
                    .issue(&name, 1)
                    .map_err(|e| AgentError::Config(e.to_string()))?;
                (
                    Identity {
                        node_id: 1,
                        name: name.clone(),
                        cluster_id: cluster_id.clone(),
                        credentials,
                    },
                    Some((cluster_id, ca)),
                )
            }
            (StartMode::Join { addr, token }, None) => {
                let id = join_cluster(addr, &token, &spec).await?;
                identity::save_identity(&data_dir, &id).map_err(AgentError::Io)?;
                (id, None)
            }
        };

        let handler = Arc::new(NodeRpc {
            inner: OnceLock::new(),
        });
        let rpc = RpcEndpoint::serve_socket(rpc_socket, &ident.credentials, handler.clone())
            .map_err(|e| AgentError::Io(e.to_string()))?;
        let db = open_db(&data_dir.join(identity::RAFT_DB_FILE))
            .map_err(|e| io("cannot open the Raft database", e))?;
        let log = LogStore::new(db.clone()).map_err(|e| AgentError::Raft(e.to_string()))?;
        let sm = StateMachineStore::new(db).map_err(|e| AgentError::Raft(e.to_string()))?;
        let ledger = sm.handle();
        let chunks = shoal_storage::ChunkStore::open(
            data_dir.join("chunks"),
            shoal_storage::StoreConfig {
                capacity_bytes: (cfg.storage.capacity_bytes > 0)
                    .then_some(cfg.storage.capacity_bytes),
                ..shoal_storage::StoreConfig::default()
            },
        )
        .map_err(|e| io("opening the chunk store", e))?;
        let contacts = ContactTracker::default();
        let network = NetworkFactory::new(
            Arc::new(MeshTransport { rpc: rpc.clone() }),
            contacts.clone(),
        );
        let raft_cfg = openraft::Config {
            cluster_name: "shoal".into(),
            heartbeat_interval: cfg.raft.heartbeat_ms,
            election_timeout_min: cfg.raft.election_timeout_min_ms,
            election_timeout_max: cfg.raft.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.raft.snapshot_every),
            max_in_snapshot_log_to_keep: cfg.raft.logs_kept_after_snapshot,
            ..Default::default()
        }
        .validate()
        .map_err(|e| AgentError::Config(format!("raft settings: {e}")))?;
        let raft = Raft::new(ident.node_id, Arc::new(raft_cfg), network, log, sm)
            .await
            .map_err(|e| AgentError::Raft(e.to_string()))?;

        let (shutdown, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            id: ident.node_id,
            name: ident.name.clone(),
            cfg: cfg.clone(),
            data_dir: data_dir.clone(),
            raft: raft.clone(),
            ledger,
            rpc,
            contacts,
            rpc_addr,
            api_addr,
            spec: MemberSpec {
                name: ident.name.clone(),
                ..spec
            },
            peers: crate::peers::new_view(cfg.test_inject_rtt.clone()),
            chunks: Arc::new(chunks),
            gpu: std::sync::Mutex::new(GpuState {
                faults: gpu_source.as_ref().and_then(|g| g.fault_injector()),
                source: gpu_source,
                latest: Vec::new(),
            }),
            metrics: Metrics::new(ident.node_id, &ident.name),
            batcher: crate::batcher::Batcher::spawn(raft.clone(), ident.node_id),
            started: Instant::now(),
            shutdown,
        });
        let _ = handler.inner.set(Arc::downgrade(&inner));

        let bootstrap = match new_cluster {
            Some((cluster_id, ca)) => Some(inner.bootstrap_cluster(cluster_id, ca).await?),
            None => None,
        };
        if bootstrap.is_some() {
            identity::save_identity(&data_dir, &ident).map_err(AgentError::Io)?;
        }

        crate::api::spawn(inner.clone(), api_listener);
        crate::peers::spawn(
            Arc::downgrade(&inner),
            gossip,
            gossip_events,
            inner.peers.clone(),
            inner.shutdown.subscribe(),
        );
        tokio::spawn(crate::reconcile::run(
            Arc::downgrade(&inner),
            inner.shutdown.subscribe(),
        ));
        tokio::spawn(crate::scheduler::run(
            Arc::downgrade(&inner),
            inner.shutdown.subscribe(),
        ));
        if inner.cfg.executor.enabled {
            tokio::spawn(crate::executor::run(
                Arc::downgrade(&inner),
                inner.shutdown.subscribe(),
            ));
        }
        tokio::spawn(crate::anomaly::run(
            Arc::downgrade(&inner),
            inner.shutdown.subscribe(),
        ));
        if let Some(url) = inner.cfg.anomaly.webhook_url.clone() {
            tokio::spawn(crate::anomaly::webhook::run(
                Arc::downgrade(&inner),
                url,
                inner.shutdown.subscribe(),
            ));
        }
        tokio::spawn(crate::durability::run(
            Arc::downgrade(&inner),
            inner.shutdown.subscribe(),
        ));
        tokio::spawn(keep_member_record_current(
            Arc::downgrade(&inner),
            inner.shutdown.subscribe(),
        ));

        let runtime = RuntimeInfo {
            node_id: inner.id,
            name: inner.name.clone(),
            api_url: format!("http://{}", inner.api_addr),
            rpc_addr: inner.rpc_addr.to_string(),
            pid: std::process::id(),
        };
        if let Ok(bytes) = serde_json::to_vec_pretty(&runtime) {
            let _ = identity::write_private(&data_dir.join(identity::RUNTIME_FILE), &bytes, 0o600);
        }
        tracing::info!(node = inner.id, name = %inner.name, api = %inner.api_addr, rpc = %inner.rpc_addr, "node is up");
        Ok(Agent { inner, bootstrap })
    }

    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn api_url(&self) -> String {
        format!("http://{}", self.inner.api_addr)
    }

    pub fn rpc_addr(&self) -> SocketAddr {
        self.inner.rpc_addr
    }

    pub fn data_dir(&self) -> &std::path::Path {
        &self.inner.data_dir
    }

    pub fn current_leader(&self) -> Option<NodeId> {
        self.inner.raft.metrics().borrow().current_leader
    }

    /// This node's own gossip view of its peers (what `shoal mesh` shows).
    pub fn peer_views(&self) -> Vec<shoal_sdk::PeerView> {
        self.inner.peer_views()
    }

    /// This node's applied ledger (local, possibly behind the leader).
    pub fn ledger(&self) -> LedgerHandle {
        self.inner.ledger.clone()
    }

    /// The voter set as this node knows it.
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.inner
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// A write through the leader (forwarded when this node is not it).
    pub async fn write(&self, cmd: Command) -> Result<(LedgerResponse, u64), WireError> {
        self.inner.write(cmd).await
    }

    pub async fn status(&self) -> Result<StatusResponse, WireError> {
        self.inner.status().await
    }

    /// Leaves the cluster cleanly (removal through the leader).
    pub async fn leave(&self) -> Result<(), WireError> {
        self.inner.remove_member(self.inner.id).await.map(|_| ())
    }

    /// Stops the node: API, background loops, Raft and the RPC endpoint.
    pub async fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
        let _ = self.inner.raft.shutdown().await;
        self.inner.rpc.shutdown().await;
    }
}

/// How long a joining node keeps asking while the cluster has no leader.
const JOIN_RETRY_FOR: Duration = Duration::from_secs(60);

async fn join_cluster(
    addr: SocketAddr,
    token: &str,
    spec: &MemberSpec,
) -> Result<Identity, AgentError> {
    let parsed = identity::parse_join_token(token).map_err(AgentError::Join)?;
    let (key_pem, csr_pem) = shoal_mesh::tls::new_key_and_csr(&spec.name)
        .map_err(|e| AgentError::Join(e.to_string()))?;
    let req = Request::Join(JoinRequest {
        secret: parsed.secret.clone(),
        ca_pin: parsed.ca_pin.clone(),
        spec: spec.clone(),
        csr_pem,
    });
    // A leader change while the cluster admits us is transient: the node we
    // asked forwards to the leader and retries for a while, and so do we.
    // Admission is idempotent for the same name and gossip key.
    let deadline = Instant::now() + JOIN_RETRY_FOR;
    let reply = loop {
        let (reply, _ca) = shoal_mesh::rpc::call_as_joiner(
            addr,
            &parsed.ca_pin,
            &proto::encode(&req),
            Duration::from_secs(30),
        )
        .await
        .map_err(|e| AgentError::Join(format!("cannot join via {addr}: {e}")))?;
        match proto::decode::<Response>(&reply) {
            Ok(Response::Error(e))
                if matches!(e.code, ErrorCode::NotLeader | ErrorCode::Unavailable)
                    && Instant::now() < deadline =>
            {
                tracing::info!(error = %e.message, "the cluster could not admit us yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            _ => break reply,
        }
    };
    match proto::decode::<Response>(&reply).map_err(|e| AgentError::Join(e.to_string()))? {
        Response::Join(j) => {
            let got_pin = shoal_mesh::tls::pem_to_der(&j.ca_pem)
                .map(|d| shoal_mesh::tls::fingerprint_der(&d))
                .map_err(|e| AgentError::Join(e.to_string()))?;
            if got_pin != parsed.ca_pin {
                return Err(AgentError::Join(format!(
                    "{addr} answered with a CA that does not match the join token's pin"
                )));
            }
            tracing::info!(node = j.node_id, cluster = %j.cluster_id, "joined the cluster");
            Ok(Identity {
                node_id: j.node_id,
                name: spec.name.clone(),
                cluster_id: j.cluster_id,
                credentials: NodeCredentials {
                    key_pem,
                    cert_pem: j.cert_pem,
                    ca_pem: j.ca_pem,
                },
            })
        }
        Response::Error(e) => Err(AgentError::Join(format!(
            "{addr} refused the join: {}",
            e.message
        ))),
        _ => Err(AgentError::Join(format!(
            "{addr} answered the join with something unexpected"
        ))),
    }
}

/// On restart the node may come back with other addresses, labels or
/// accelerators; the ledger must describe it as it is now.
async fn keep_member_record_current(inner: Weak<Inner>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = shutdown.changed() => return,
        }
        let Some(inner) = inner.upgrade() else { return };
        let recorded = match inner.ledger.read() {
            Ok(d) => d.ledger.members.get(&inner.id).map(|m| m.spec.clone()),
            Err(_) => return,
        };
        let Some(recorded) = recorded else { continue };
        let strip = |s: &MemberSpec| {
            let mut s = s.clone();
            for g in &mut s.gpus {
                g.allocated_to = None;
            }
            s
        };
        if strip(&recorded) == strip(&inner.spec) {
            return;
        }
        let cmd = Command::UpdateMember {
            id: inner.id,
            spec: inner.spec.clone(),
        };
        match inner.write(cmd).await {
            Ok(_) => {
                tracing::info!(node = inner.id, "updated this node's record in the ledger");
                return;
            }
            Err(e) => tracing::debug!(error = %e, "could not update this node's record yet"),
        }
    }
}

fn raft_wire_error<E: std::fmt::Display>(e: RaftError<NodeId, E>) -> WireError {
    match e {
        RaftError::Fatal(f) => {
            WireError::new(ErrorCode::Unavailable, format!("raft has stopped: {f}"))
        }
        RaftError::APIError(e) => WireError::new(ErrorCode::Internal, e.to_string()),
    }
}

impl Inner {
    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.membership.request_timeout_ms)
    }

    pub fn leader(&self) -> Option<(NodeId, SocketAddr)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let id = m.current_leader?;
        let addr = m
            .membership_config
            .membership()
            .get_node(&id)?
            .addr
            .parse()
            .ok()?;
        Some((id, addr))
    }

    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.current_leader == Some(self.id) && m.state == ServerState::Leader
    }

    async fn bootstrap_cluster(
        self: &Arc<Self>,
        cluster_id: String,
        ca: CaBundle,
    ) -> Result<BootstrapInfo, AgentError> {
        let nodes = BTreeMap::from([(self.id, BasicNode::new(self.rpc_addr.to_string()))]);
        self.raft
            .initialize(nodes)
            .await
            .map_err(|e| AgentError::Raft(format!("cannot initialize the cluster: {e}")))?;
        self.raft
            .wait(Some(Duration::from_secs(10)))
            .current_leader(self.id, "bootstrap")
            .await
            .map_err(|e| AgentError::Raft(format!("this node did not become leader: {e}")))?;
        let (admin_token, admin_hash) = identity::new_api_token();
        let cmd = Command::Bootstrap {
            cluster_id,
            region: self.cfg.region.clone(),
            ca_cert_pem: ca.cert_pem.clone(),
            ca_key_pem: ca.key_pem.clone(),
            admin_token_hash: admin_hash,
            first_member: self.id,
            spec: self.spec.clone(),
        };
        match self.write(cmd).await {
            Ok((LedgerResponse::NodeId(_), _)) => {}
            Ok((other, _)) => {
                return Err(AgentError::Raft(format!("bootstrap refused: {other:?}")))
            }
            Err(e) => return Err(AgentError::Raft(format!("bootstrap write failed: {e}"))),
        }
        identity::write_private(
            &self.data_dir.join(identity::ADMIN_TOKEN_FILE),
            format!("{admin_token}\n").as_bytes(),
            0o600,
        )
        .map_err(|e| io("cannot write the admin token", e))?;
        let join_token = self
            .create_join_token(Duration::from_secs(self.cfg.join_token_ttl_s))
            .await
            .map_err(|e| AgentError::Raft(e.to_string()))?
            .0;
        Ok(BootstrapInfo {
            admin_token,
            join_token,
        })
    }

    pub async fn create_join_token(
        self: &Arc<Self>,
        ttl: Duration,
    ) -> Result<(String, u64), WireError> {
        let pin = {
            let d = self.read_ledger()?;
            let cluster = d.ledger.cluster.as_ref().ok_or_else(|| {
                WireError::new(
                    ErrorCode::Unavailable,
                    "the cluster is not bootstrapped yet",
                )
            })?;
            CaBundle {
                cert_pem: cluster.ca_cert_pem.clone(),
                key_pem: String::new(),
            }
            .fingerprint()
            .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?
        };
        let (token, hash) = identity::new_join_token(&pin);
        let expires_at_ms = wall_ms() + ttl.as_millis() as u64;
        self.write(Command::CreateJoinToken {
            hash,
            expires_at_ms,
        })
        .await?;
        Ok((token, expires_at_ms))
    }

    /// Members' gossip identities from the ledger (this node excluded).
    pub fn gossip_members(&self) -> Vec<(NodeId, crate::peers::PeerId, crate::peers::Multiaddr)> {
        let Ok(d) = self.ledger.read() else {
            return Vec::new();
        };
        d.ledger
            .active_members()
            .filter(|m| m.id != self.id)
            .filter_map(|m| {
                let peer = m.spec.gossip_peer_id.parse().ok()?;
                let addr = m.spec.gossip_addr.parse().ok()?;
                Some((m.id, peer, addr))
            })
            .collect()
    }

    /// This node's own view of every other member, from gossip.
    pub fn peer_views(&self) -> Vec<shoal_sdk::PeerView> {
        let members: Vec<(NodeId, String)> = match self.ledger.read() {
            Ok(d) => d
                .ledger
                .active_members()
                .filter(|m| m.id != self.id)
                .map(|m| (m.id, m.spec.name.clone()))
                .collect(),
            Err(_) => return Vec::new(),
        };
        let Ok(p) = self.peers.lock() else {
            return Vec::new();
        };
        let now = Instant::now();
        members
            .into_iter()
            .map(|(id, name)| {
                let advert = p.capacity.get(id);
                shoal_sdk::PeerView {
                    id,
                    name,
                    state: p
                        .state(id)
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_else(|| "unknown".into()),
                    last_heard_ms: p
                        .last_heard
                        .get(&id)
                        .map(|t| now.saturating_duration_since(*t).as_millis() as u64),
                    rtt_ms: p
                        .estimated_rtt(self.id, id, self.id)
                        .map(|d| d.as_secs_f64() * 1000.0),
                    gpus_free: advert.map(|a| a.gpus_free_by_model.values().sum()),
                    gpus_total: advert.map(|a| a.gpus_total),
                    load: advert.map(|a| a.load),
                }
            })
            .collect()
    }

    pub fn name_of(&self, node: NodeId) -> Option<String> {
        self.ledger
            .read()
            .ok()?
            .ledger
            .members
            .get(&node)
            .map(|m| m.spec.name.clone())
    }

    /// What this node offers right now, for its capacity advert.
    pub fn capacity_advert(&self) -> shoal_mesh::gossip::CapacityAdvert {
        let (gpus, owners) = self
            .ledger
            .read()
            .ok()
            .and_then(|d| {
                let gpus = d.ledger.members.get(&self.id)?.spec.gpus.clone();
                Some((gpus, crate::jobs_api::gpu_owners(&d.ledger)))
            })
            .unwrap_or_else(|| (self.spec.gpus.clone(), BTreeMap::new()));
        let mut free: BTreeMap<String, u32> = BTreeMap::new();
        for g in &gpus {
            let e = free.entry(g.model.clone()).or_default();
            if g.allocated_to.is_none() {
                *e += 1;
            }
        }
        let samples = self
            .gpu
            .lock()
            .map(|g| g.latest.clone())
            .unwrap_or_default();
        let load = if samples.is_empty() {
            0.0
        } else {
            samples.iter().map(|s| s.util_pct as f32).sum::<f32>() / (100.0 * samples.len() as f32)
        };
        shoal_mesh::gossip::CapacityAdvert {
            node_id: self.id,
            seq: 0,
            gpus_free_by_model: free,
            gpus_total: gpus.len() as u32,
            healthy: true,
            load,
            job_util: crate::anomaly::job_utilization(self.id, &samples, &owners),
            coordinate: None,
            sent_at_ms: 0,
        }
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub fn read_ledger(
        &self,
    ) -> Result<std::sync::RwLockReadGuard<'_, shoal_consensus::store::StateMachineData>, WireError>
    {
        self.ledger
            .read()
            .map_err(|_| WireError::new(ErrorCode::Internal, "ledger lock poisoned"))
    }

    /// Who holds `token`: `None` when the ledger does not know its hash.
    pub fn caller(&self, token: &str) -> Option<crate::api::Caller> {
        let hash = identity::hash_secret(token);
        let d = self.ledger.read().ok()?;
        d.ledger.api_tokens.get(&hash).map(|t| crate::api::Caller {
            name: t.name.clone(),
            tenant: t.tenant.clone(),
        })
    }

    /// [`Self::caller`], allowing for this node's ledger to lag: a token
    /// created a moment ago through another node may not be applied here
    /// yet, so a follower looks an unknown token up again as it catches up,
    /// for up to `TOKEN_CATCH_UP`. The leader's ledger is current.
    pub async fn caller_eventually(&self, token: &str) -> Option<crate::api::Caller> {
        let deadline = Instant::now() + TOKEN_CATCH_UP;
        loop {
            if let Some(caller) = self.caller(token) {
                return Some(caller);
            }
            let leader = self.raft.metrics().borrow().current_leader == Some(self.id);
            if leader || Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A new API token, admin or scoped to `tenant`; only its hash is kept.
    pub async fn create_api_token(
        self: &Arc<Self>,
        name: String,
        tenant: Option<String>,
    ) -> Result<(String, LedgerResponse), WireError> {
        let (token, hash) = identity::new_api_token();
        let (resp, _) = self
            .write(Command::CreateApiToken { hash, name, tenant })
            .await?;
        Ok((token, resp))
    }

    async fn serve_rpc(self: &Arc<Self>, peer: PeerInfo, req: Request) -> Response {
        let result = match req {
            Request::Join(j) if !peer.authenticated => self.route(Request::Join(j)).await,
            _ if !peer.authenticated => Err(WireError::new(
                ErrorCode::Unauthenticated,
                "this request needs a certificate signed by the cluster CA",
            )),
            Request::Raft(rpc) => Ok(Response::Raft(self.serve_raft(rpc).await)),
            Request::Chunk(req) => {
                let inner = self.clone();
                let handle = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || inner.serve_chunk(&handle, req))
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))
            }
            other => self.serve_as_leader(other).await,
        };
        result.unwrap_or_else(Response::Error)
    }

    async fn serve_raft(&self, rpc: RaftRpc) -> RaftRpcReply {
        match rpc {
            RaftRpc::AppendEntries(r) => {
                RaftRpcReply::AppendEntries(self.raft.append_entries(r).await)
            }
            RaftRpc::Vote(r) => RaftRpcReply::Vote(self.raft.vote(r).await),
            RaftRpc::InstallSnapshot(r) => {
                RaftRpcReply::InstallSnapshot(self.raft.install_snapshot(r).await)
            }
        }
    }

    /// Sends `req` to the leader (or serves it here when this node leads),
    /// retrying while there is no leader or the leader is unreachable, up to
    /// the request timeout.
    pub async fn route(self: &Arc<Self>, req: Request) -> Result<Response, WireError> {
        let deadline = Instant::now() + self.request_timeout();
        let body = proto::encode(&req);
        let mut local = Some(req);
        loop {
            let attempt = match self.leader() {
                Some((id, _)) if id == self.id => {
                    let req = match local.take() {
                        Some(r) => r,
                        None => proto::decode(&body)?,
                    };
                    self.serve_as_leader(req).await
                }
                Some((id, addr)) => self.call_leader(id, addr, &body, deadline).await,
                None => Err(WireError::new(
                    ErrorCode::NotLeader,
                    "no leader is elected right now",
                )),
            };
            match attempt {
                Err(e)
                    if matches!(e.code, ErrorCode::NotLeader | ErrorCode::Unavailable)
                        && Instant::now() < deadline =>
                {
                    tracing::debug!(error = %e, "retrying on the leader");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    /// One attempt on the leader `id`. Abandoned as soon as this node learns
    /// of another leader: a dead leader's connection would otherwise hold the
    /// request until QUIC's idle timeout.
    async fn call_leader(
        &self,
        id: NodeId,
        addr: SocketAddr,
        body: &[u8],
        deadline: Instant,
    ) -> Result<Response, WireError> {
        let mut metrics = self.raft.metrics();
        let leader_changed = async move {
            loop {
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                if metrics.borrow().current_leader != Some(id) {
                    return;
                }
            }
        };
        let budget = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        tokio::select! {
            r = self.rpc.call(addr, body, budget) => match r {
                Ok(reply) => match proto::decode::<Response>(&reply)? {
                    Response::Error(e) => Err(e),
                    ok => Ok(ok),
                },
                Err(e) => Err(WireError::new(ErrorCode::Unavailable, format!("leader {id} unreachable: {e}"))),
            },
            _ = leader_changed => Err(WireError::new(ErrorCode::NotLeader, format!("node {id} is no longer the leader"))),
        }
    }

    async fn serve_as_leader(self: &Arc<Self>, req: Request) -> Result<Response, WireError> {
        match req {
            Request::Write(cmd) => {
                let (response, index) = self.write_local(cmd).await?;
                Ok(Response::Write { response, index })
            }
            Request::Query(q) => self.query_local(q).await,
            Request::Join(j) => self.admit(j).await.map(Response::Join),
            Request::RemoveMember(id) => self.remove_local(id).await,
            Request::Raft(_) | Request::Chunk(_) => Err(WireError::new(
                ErrorCode::Invalid,
                "Raft and chunk RPCs are not routed",
            )),
        }
    }

    pub async fn write(self: &Arc<Self>, cmd: Command) -> Result<(LedgerResponse, u64), WireError> {
        match self.route(Request::Write(cmd)).await? {
            Response::Write { response, index } => Ok((response, index)),
            _ => Err(WireError::new(
                ErrorCode::Internal,
                "unexpected answer to a write",
            )),
        }
    }

    /// Proposes on this node, which must be the leader. The leader stamps the
    /// time (DESIGN invariant 7); concurrent writes share one log entry.
    pub async fn write_local(&self, cmd: Command) -> Result<(LedgerResponse, u64), WireError> {
        let started = Instant::now();
        let out = self.batcher.propose(cmd).await;
        if out.is_ok() {
            self.metrics.observe_proposal(started.elapsed());
        }
        out
    }

    async fn ensure_linearizable(&self) -> Result<(), WireError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))) => {
                Err(WireError::new(
                    ErrorCode::NotLeader,
                    format!("node {} is not the leader", self.id),
                ))
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(WireError::new(
                    ErrorCode::Unavailable,
                    format!("the leader cannot reach a quorum: {e}"),
                ))
            }
            Err(e) => Err(raft_wire_error(e)),
        }
    }

    pub async fn status(self: &Arc<Self>) -> Result<StatusResponse, WireError> {
        match self.route(Request::Query(Query::Status)).await? {
            Response::Status(s) => Ok(s),
            _ => Err(WireError::new(
                ErrorCode::Internal,
                "unexpected answer to a status query",
            )),
        }
    }

    pub async fn nodes(self: &Arc<Self>) -> Result<Vec<NodeInfo>, WireError> {
        match self.route(Request::Query(Query::Nodes)).await? {
            Response::Nodes(n) => Ok(n),
            _ => Err(WireError::new(
                ErrorCode::Internal,
                "unexpected answer to a nodes query",
            )),
        }
    }

    pub async fn attrs(
        self: &Arc<Self>,
        prefix: String,
    ) -> Result<BTreeMap<String, String>, WireError> {
        match self.route(Request::Query(Query::Attrs { prefix })).await? {
            Response::Attrs(a) => Ok(a),
            _ => Err(WireError::new(
                ErrorCode::Internal,
                "unexpected answer to an attribute query",
            )),
        }
    }

    /// A read of the ledger on the leader (linearizable).
    pub async fn query(self: &Arc<Self>, q: Query) -> Result<Response, WireError> {
        self.route(Request::Query(q)).await
    }

    async fn query_local(&self, q: Query) -> Result<Response, WireError> {
        self.ensure_linearizable().await?;
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let d = self.read_ledger()?;
        match q {
            Query::Status => {
                let (cluster_id, region) = d
                    .ledger
                    .cluster
                    .as_ref()
                    .map(|c| (c.cluster_id.clone(), c.region.clone()))
                    .unwrap_or_default();
                Ok(Response::Status(StatusResponse {
                    cluster_id,
                    region,
                    leader: metrics.current_leader,
                    term: metrics.current_term,
                    commit_index: metrics.last_applied.map(|l| l.index).unwrap_or(0),
                    voters: voters.iter().copied().collect(),
                    learners: membership.learner_ids().collect(),
                    members: d
                        .ledger
                        .active_members()
                        .map(|m| MemberSummary {
                            id: m.id,
                            name: m.spec.name.clone(),
                            state: m.state,
                        })
                        .collect(),
                    node_id: self.id,
                }))
            }
            Query::Attrs { prefix } => Ok(Response::Attrs(
                d.ledger
                    .attrs
                    .range(prefix.clone()..)
                    .take_while(|(k, _)| k.starts_with(&prefix))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )),
            Query::Jobs { tenant, state } => {
                crate::jobs_api::jobs(&d.ledger, tenant.as_deref(), state.as_deref())
                    .map(Response::Jobs)
                    .map_err(|m| WireError::new(ErrorCode::Invalid, m))
            }
            Query::Job(id) => match d.ledger.workload.jobs.get(&id) {
                Some(job) => Ok(Response::Jobs(vec![crate::jobs_api::job_info(
                    &d.ledger, job,
                )])),
                None => Err(WireError::new(ErrorCode::NotFound, format!("no job {id}"))),
            },
            Query::Checkpoints(id) => crate::jobs_api::checkpoints(&d.ledger, id)
                .map(Response::Checkpoints)
                .ok_or_else(|| WireError::new(ErrorCode::NotFound, format!("no job {id}"))),
            Query::Objects { path } => Ok(Response::Objects(crate::jobs_api::objects(
                &d.ledger, &path,
            ))),
            Query::Events { after } => {
                Ok(Response::Events(crate::jobs_api::events(&d.ledger, after)))
            }
            Query::Tenants => Ok(Response::Tenants(crate::jobs_api::tenants(&d.ledger))),
            Query::Quota => Ok(Response::Quota(crate::jobs_api::quota(
                &d.ledger,
                d.ledger.clock_ms.max(wall_ms()),
            ))),
            Query::Nodes => {
                let owners = crate::jobs_api::gpu_owners(&d.ledger);
                let now = Instant::now();
                let nodes = d
                    .ledger
                    .active_members()
                    .map(|m| {
                        let (last_seen_ms, gpu_util) = match self.peers.lock() {
                            Ok(p) if m.id != self.id => (
                                p.last_heard
                                    .get(&m.id)
                                    .map(|t| now.saturating_duration_since(*t).as_millis() as u64),
                                p.capacity.get(m.id).map(|a| a.load),
                            ),
                            _ => (Some(0), Some(self.capacity_advert().load)),
                        };
                        let gpus: Vec<_> = m
                            .spec
                            .gpus
                            .iter()
                            .map(|g| shoal_sdk::GpuInfo {
                                allocated_to: owners.get(&(m.id, g.index)).copied(),
                                ..g.clone()
                            })
                            .collect();
                        let gpus_total = gpus.len() as u32;
                        let gpus_free =
                            gpus.iter().filter(|g| g.allocated_to.is_none()).count() as u32;
                        NodeInfo {
                            id: m.id,
                            name: m.spec.name.clone(),
                            state: m.state,
                            addr: m.spec.rpc_addr.clone(),
                            api_addr: m.spec.api_addr.clone(),
                            labels: m.spec.labels.clone(),
                            gpus,
                            gpus_free,
                            gpus_total,
                            last_seen_ms,
                            voter: voters.contains(&m.id),
                            joined_at_ms: m.joined_at_ms,
                            gpu_util,
                            drained: d.ledger.workload.drained.contains(&m.id),
                        }
                    })
                    .collect();
                Ok(Response::Nodes(nodes))
            }
        }
    }

    /// Admits a joining node: checks its token and CA pin, records it in the
    /// ledger (which assigns its id) and signs its certificate. The leader's
    /// housekeeping loop then adds it to Raft as a learner and decides
    /// whether it votes: one place changes Raft membership, so joins never
    /// race with voter changes.
    async fn admit(&self, j: JoinRequest) -> Result<JoinResponse, WireError> {
        let (cluster, token_check) = {
            let d = self.read_ledger()?;
            (
                d.ledger.cluster.clone(),
                d.ledger
                    .join_token_valid(&identity::hash_secret(&j.secret), wall_ms()),
            )
        };
        let cluster = cluster.ok_or_else(|| {
            WireError::new(
                ErrorCode::Unavailable,
                "the cluster is not bootstrapped yet",
            )
        })?;
        let ca = CaBundle {
            cert_pem: cluster.ca_cert_pem.clone(),
            key_pem: cluster.ca_key_pem.clone(),
        };
        let pin = ca
            .fingerprint()
            .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
        if pin != j.ca_pin {
            return Err(WireError::new(
                ErrorCode::Forbidden,
                "the join token was issued by another cluster (CA pin mismatch)",
            ));
        }
        token_check.map_err(|m| WireError::new(ErrorCode::Forbidden, m))?;
        shoal_consensus::ledger::validate_name(&j.spec.name)
            .map_err(|m| WireError::new(ErrorCode::Invalid, m))?;
        j.spec.rpc_addr.parse::<SocketAddr>().map_err(|_| {
            WireError::new(
                ErrorCode::Invalid,
                format!("invalid RPC address '{}'", j.spec.rpc_addr),
            )
        })?;
        // Check the CSR before anything is committed, so a bad request leaves
        // no member behind.
        ca.sign_csr(&j.csr_pem, &j.spec.name, 0).map_err(|e| {
            WireError::new(
                ErrorCode::Invalid,
                format!("invalid certificate request: {e}"),
            )
        })?;
        // A join whose answer was lost (a leader change, a timeout) is retried
        // by the joiner or by the forwarding node; the gossip peer id comes
        // from the joiner's own fresh key, so the same name with the same peer
        // id is the same join, not a second node.
        let same_join = |d: &shoal_consensus::store::StateMachineData| -> Option<NodeId> {
            d.ledger
                .active_members()
                .find(|m| {
                    m.spec.name == j.spec.name
                        && !j.spec.gossip_peer_id.is_empty()
                        && m.spec.gossip_peer_id == j.spec.gossip_peer_id
                })
                .map(|m| m.id)
        };
        let retried = same_join(&*self.read_ledger()?);
        if let Some(id) = retried {
            let cert_pem = ca
                .sign_csr(&j.csr_pem, &j.spec.name, id)
                .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
            return Ok(JoinResponse {
                node_id: id,
                cluster_id: cluster.cluster_id,
                region: cluster.region,
                cert_pem,
                ca_pem: cluster.ca_cert_pem,
            });
        }
        let cmd = Command::AddMember {
            spec: j.spec.clone(),
            token_hash: identity::hash_secret(&j.secret),
        };
        let id = match self.write_local(cmd).await?.0 {
            LedgerResponse::NodeId(id) => id,
            // An earlier attempt of this very join may have committed first.
            LedgerResponse::Rejected(m) => match same_join(&*self.read_ledger()?) {
                Some(id) => id,
                None => return Err(WireError::new(ErrorCode::Rejected, m)),
            },
            _ => {
                return Err(WireError::new(
                    ErrorCode::Internal,
                    "the ledger assigned no node id",
                ))
            }
        };
        let cert_pem = ca
            .sign_csr(&j.csr_pem, &j.spec.name, id)
            .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
        tracing::info!(node = id, name = %j.spec.name, addr = %j.spec.rpc_addr, "admitted a new member");
        Ok(JoinResponse {
            node_id: id,
            cluster_id: cluster.cluster_id,
            region: cluster.region,
            cert_pem,
            ca_pem: cluster.ca_cert_pem,
        })
    }

    pub async fn remove_member(self: &Arc<Self>, id: NodeId) -> Result<u64, WireError> {
        match self.route(Request::RemoveMember(id)).await? {
            Response::Write { index, .. } => Ok(index),
            _ => Err(WireError::new(
                ErrorCode::Internal,
                "unexpected answer to a removal",
            )),
        }
    }

    /// `change_membership`, retried while another membership change (the
    /// housekeeping loop's) is still in flight.
    pub async fn change_membership(
        &self,
        changes: ChangeMembers<NodeId, BasicNode>,
        retain: bool,
    ) -> Result<(), WireError> {
        let deadline = Instant::now() + self.request_timeout();
        loop {
            match self.raft.change_membership(changes.clone(), retain).await {
                Ok(_) => return Ok(()),
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                    ChangeMembershipError::InProgress(_),
                ))) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                    return Err(WireError::new(
                        ErrorCode::NotLeader,
                        format!("node {} is not the leader", self.id),
                    ))
                }
                Err(e) => return Err(raft_wire_error(e)),
            }
        }
    }

    async fn remove_local(&self, id: NodeId) -> Result<Response, WireError> {
        if !self.is_leader() {
            return Err(WireError::new(ErrorCode::NotLeader, "not the leader"));
        }
        let known = self.read_ledger()?.ledger.members.get(&id).map(|m| m.state);
        match known {
            None => {
                return Err(WireError::new(
                    ErrorCode::Invalid,
                    format!("no member with id {id}"),
                ))
            }
            Some(MemberState::Left) => {
                return Err(WireError::new(
                    ErrorCode::Rejected,
                    format!("node {id} has already left"),
                ))
            }
            Some(_) => {}
        }
        if id == self.id {
            return Err(WireError::new(
                ErrorCode::Rejected,
                format!("node {id} is the current leader: stop it first (another node takes over), then remove it"),
            ));
        }
        // Only the ledger changes here: the leader's housekeeping loop takes
        // nodes that left out of the Raft membership, as it makes every other
        // membership change.
        let (response, index) = self
            .write_local(Command::SetMemberState {
                id,
                state: MemberState::Left,
            })
            .await?;
        tracing::info!(node = id, "removed a member from the cluster");
        Ok(Response::Write { response, index })
    }
}
