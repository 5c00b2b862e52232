//! The composition root: starts a node (bootstrap, join or restart), wires
//! mesh RPC, the Raft ledger, the chunk store and the HTTP API together into
//! a [`Node`], and spawns its loops.

mod advertise;
pub mod join;
pub mod notify;
pub mod recovery;
pub mod shutdown;
pub mod testkit;

use crate::anomaly::webhook::Webhook;
use crate::anomaly::{AnomalyWatch, EventLog};
use crate::config::{CgroupMode, Config};
use crate::credentials::CredentialsInForce;
use crate::executor::account::RankUsers;
use crate::executor::cgroup::{self, Isolation, RankCgroups};
use crate::executor::{Executor, RankHost};
use crate::faults;
use crate::faults::chaos_hooks::PlantedBug;
use crate::gpu::Gpus;
use crate::identity::{self, Identity, RuntimeInfo};
use crate::ledger_client::client::LeaderService;
use crate::ledger_client::LedgerClient;
use crate::metrics::Metrics;
use crate::node::LocalMember;
use crate::node::Node;
use crate::node::NodeParts;
use crate::proto::WireError;
use crate::rpc::chunks::ChunkNet;
use crate::rpc::raft_transport::MeshTransport;
use crate::rpc_handler::{NodeRpc, NodeService};
use crate::trust::auth;
use crate::worker;
use crate::workers;
use crate::workers::durability::Durability;
use crate::workers::gossip::GossipParts;
use crate::workers::member_record::MemberRecord;
use crate::workers::reconcile::Housekeeping;
use crate::workers::scheduler::Scheduler;
use advertise::advertise_ip;
use join::join_cluster;
use openraft::{BasicNode, SnapshotPolicy};
use shoal_consensus::ledger::ApplyChecks;
use shoal_consensus::network::{ContactTracker, NetworkFactory};
use shoal_consensus::store::{open_db, LedgerHandle, LogStore, StateMachineStore};
use shoal_consensus::types::Raft;
use shoal_consensus::{Command, LedgerResponse, MemberSpec, NodeId};
use shoal_mesh::{CaBundle, RpcEndpoint};
use shoal_sdk::StatusResponse;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// The data dir is a removed node's (see [`crate::ledger_client::removal`]).
    #[error("{0}")]
    Removed(String),
}

/// A running node.
#[derive(Clone)]
pub struct Agent {
    node: Arc<Node>,
    /// Serves peers' RPCs; held here so it lives as long as the node.
    _service: Arc<NodeService>,
    rpc: RpcEndpoint,
    /// Set when this start bootstrapped a cluster.
    pub bootstrap: Option<BootstrapInfo>,
}

/// The secrets a bootstrap prints once: the admin token (also in
/// `<data-dir>/admin.token`) and a single-use join token.
#[derive(Clone)]
pub struct BootstrapInfo {
    pub admin_token: String,
    pub join_token: String,
}

/// Never prints the secrets.
impl std::fmt::Debug for BootstrapInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BootstrapInfo(<secrets>)")
    }
}

fn io(what: &str, e: impl std::fmt::Display) -> AgentError {
    AgentError::Io(format!("{what}: {e}"))
}

/// The checks the ledger's `apply` makes with code from outside consensus:
/// a manifest (of a `mesh:/` object or a checkpoint part) must decode and
/// validate as `shoal_storage`'s, or it is refused and never stored. Every
/// node of a cluster applies the same checks, as it applies the same log.
pub fn apply_checks() -> ApplyChecks {
    ApplyChecks {
        manifest: Some(manifest_decodes),
        skip_plan_validation: false,
    }
}

fn manifest_decodes(bytes: &[u8]) -> Result<(), String> {
    shoal_storage::manifest::Manifest::from_bytes(bytes)
        .map(|_| ())
        .map_err(|e| e.to_string())
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
                    "{} holds no node identity: pass --bootstrap to create a cluster or --join ADDR --join-token-file FILE to join one",
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
        if let Some(why) = crate::ledger_client::removal::marked(&data_dir) {
            return Err(AgentError::Removed(crate::ledger_client::removal::refusal(
                &data_dir, &why,
            )));
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
                // RTT samples feed Vivaldi: one every 5 s from each of about
                // 16 gossip peers is three a second, enough to converge within
                // tens of seconds and to follow a path that changes.
                ..shoal_mesh::gossip::GossipConfig::new(gossip_key.clone(), cfg.gossip_addr)
            })
            .await
            .map_err(|e| io(&format!("cannot start gossip on {}", cfg.gossip_addr), e))?;
        let gossip_port = gossip.listen_addr().port();
        let gossip_addr = match adv {
            IpAddr::V4(ip) => format!("/ip4/{ip}/udp/{gossip_port}/quic-v1"),
            IpAddr::V6(ip) => format!("/ip6/{ip}/udp/{gossip_port}/quic-v1"),
        };
        let cgroups = rank_cgroups(&cfg, &name, &data_dir).await;
        let isolation = cgroups
            .as_ref()
            .map(|c| c.isolation())
            .unwrap_or(Isolation::None);
        let spec = MemberSpec {
            name: name.clone(),
            rpc_addr: rpc_addr.to_string(),
            api_addr: api_addr.to_string(),
            api_tls: cfg.api_uses_tls(),
            labels: cfg.labels.clone(),
            gpus,
            gossip_peer_id: gossip_key.public().to_peer_id().to_string(),
            gossip_addr,
            isolation: isolation.mode().to_string(),
            isolation_controllers: isolation.controllers(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            protocol_min: shoal_mesh::protocol::local().min,
            protocol_max: shoal_mesh::protocol::local().max,
        };

        let (ident, new_cluster) = match (mode, existing) {
            (StartMode::Restart, Some(id)) => (
                reissue_if_expired(&data_dir, id, Duration::from_secs(cfg.cert_lifetime_s))?,
                None,
            ),
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
                    .issue_for(&name, 1, Duration::from_secs(cfg.cert_lifetime_s))
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
                identity::save_join_seed(&data_dir, addr).map_err(AgentError::Io)?;
                identity::save_identity(&data_dir, &id).map_err(AgentError::Io)?;
                (id, None)
            }
        };

        let handler = Arc::new(NodeRpc::default());
        let rpc = RpcEndpoint::serve_socket(rpc_socket, &ident.credentials, handler.clone())
            .map_err(|e| AgentError::Io(e.to_string()))?;
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            protocol = %rpc.speaks(),
            "speaking protocol {}",
            rpc.speaks()
        );
        let db = open_db(&data_dir.join(identity::RAFT_DB_FILE))
            .map_err(|e| io("cannot open the Raft database", e))?;
        let metrics = Arc::new(Metrics::new(ident.node_id, &ident.name));
        let log = LogStore::new(db.clone())
            .map_err(|e| AgentError::Raft(e.to_string()))?
            .with_append_observer({
                let metrics = metrics.clone();
                Arc::new(move |took| metrics.observe_log_append(took))
            });
        let hooks = cfg.test_chaos.clone().unwrap_or_default();
        let sm = StateMachineStore::new(db)
            .map_err(|e| AgentError::Raft(e.to_string()))?
            .with_checks(ApplyChecks {
                skip_plan_validation: hooks.planted(PlantedBug::SkipPlanValidation),
                ..apply_checks()
            })
            .with_observer(hooks.observer.clone());
        let ledger_state = sm.handle();
        let chunk_store = shoal_storage::ChunkStore::open(
            data_dir.join("chunks"),
            shoal_storage::StoreConfig {
                capacity_bytes: (cfg.storage.capacity_bytes > 0)
                    .then_some(cfg.storage.capacity_bytes),
                ..shoal_storage::StoreConfig::default()
            },
        )
        .map_err(|e| io("opening the chunk store", e))?;
        let contacts = ContactTracker::default();
        let removal = crate::ledger_client::removal::RemovalNotice::default();
        // Below the contact tracker, so that a message a fault filter cuts
        // is no sign of life either.
        let raft_transport = faults::wrap_raft(
            ident.node_id,
            Arc::new(MeshTransport {
                rpc: rpc.clone(),
                removal: removal.clone(),
            }),
            cfg.test_faults.as_ref(),
        );
        let network = NetworkFactory::new(raft_transport, contacts.clone());
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
        let log_reader = log.clone();
        let raft = Raft::new(ident.node_id, Arc::new(raft_cfg), network, log, sm)
            .await
            .map_err(|e| AgentError::Raft(e.to_string()))?;

        let ledger = LedgerClient::new(
            ident.node_id,
            raft.clone(),
            ledger_state,
            log_reader,
            metrics.clone(),
            crate::ledger_client::client::PeerLinks {
                rpc: rpc.clone(),
                request_timeout: Duration::from_millis(cfg.membership.request_timeout_ms),
                faults: cfg.test_faults.clone(),
                removal,
            },
        );
        let chunks = ChunkNet::new(
            ledger.clone(),
            rpc.clone(),
            Arc::new(chunk_store),
            cfg.test_faults.clone(),
        );
        let peers = crate::peers::new_view(
            std::time::Duration::from_millis(cfg.membership.suspicion_timeout_ms),
            cfg.test_inject_rtt.clone(),
        );
        let gpus = Gpus::new(gpu_source);
        let local = LocalMember {
            id: ident.node_id,
            name: ident.name.clone(),
            rpc_addr,
            api_addr,
            spec: MemberSpec {
                name: ident.name.clone(),
                ..spec
            },
        };
        let service = Arc::new(NodeService::new(
            ledger.clone(),
            chunks.clone(),
            peers.clone(),
            gpus.clone(),
            crate::trust::auth::Signing {
                data_dir: data_dir.clone(),
                lifetime: Duration::from_secs(cfg.cert_lifetime_s),
            },
            crate::rpc_handler::VoterContacts {
                tracker: contacts.clone(),
                // Heartbeats go out every heartbeat_ms; two election
                // timeouts without an answer is a voter that is not there.
                within: Duration::from_millis(cfg.raft.election_timeout_min_ms.saturating_mul(2)),
            },
        ));
        let leader_service: Arc<dyn LeaderService> = service.clone();
        ledger.serve_leader_requests_with(Arc::downgrade(&leader_service));
        handler.install(&service);
        let node = Arc::new(Node::new(NodeParts {
            local,
            cfg: cfg.clone(),
            data_dir: data_dir.clone(),
            ledger,
            chunks,
            peers,
            gpus,
            metrics,
            contacts,
        }));

        let bootstrap = match new_cluster {
            Some((cluster_id, ca)) => Some(bootstrap_cluster(&node, cluster_id, ca).await?),
            None => None,
        };
        if bootstrap.is_some() {
            identity::save_identity(&data_dir, &ident).map_err(AgentError::Io)?;
        }

        let api_certificate = shoal_mesh::api_tls::ApiCertificate::new(&ident.credentials)
            .map_err(|e| AgentError::Config(format!("the API certificate: {e}")))?;
        let api_tls = if cfg.api_uses_tls() {
            let server = api_certificate
                .server_config()
                .map_err(|e| AgentError::Config(format!("the API's TLS settings: {e}")))?;
            Some(Arc::new(server))
        } else {
            None
        };
        crate::api::spawn(node.clone(), api_listener, api_tls);
        let in_force = CredentialsInForce::new(rpc.clone(), api_certificate);
        let rank_cgroups = cgroups.as_ref().map(|c| c.dir().display().to_string());
        let rank_ca_file = if cfg.api_uses_tls() && cfg.executor.enabled {
            Some(write_rank_ca_file(
                &cfg.jobs_dir(),
                &ident.credentials.ca_pem,
            )?)
        } else {
            None
        };
        spawn_workers(&node, gossip, gossip_events, cgroups, rank_ca_file.clone());
        worker::spawn(
            workers::ca_custody::CaCustody::new(node.ledger().clone(), data_dir.clone()),
            node.shutdown_signal(),
        );
        worker::spawn(
            workers::ca_rotation::CaRotationDriver::new(node.ledger().clone(), data_dir.clone()),
            node.shutdown_signal(),
        );
        worker::spawn(
            workers::cert_renewal::CertRenewal::new(
                node.ledger().clone(),
                in_force,
                data_dir.clone(),
                ident.clone(),
                rank_ca_file.clone(),
            ),
            node.shutdown_signal(),
        );

        let runtime = RuntimeInfo {
            node_id: node.id(),
            name: node.name().to_string(),
            api_url: node.local().spec.api_url(),
            rpc_addr: node.local().rpc_addr.to_string(),
            pid: std::process::id(),
            rank_cgroups,
        };
        if let Ok(bytes) = serde_json::to_vec_pretty(&runtime) {
            let _ = identity::write_private(&data_dir.join(identity::RUNTIME_FILE), &bytes, 0o600);
        }
        tracing::info!(node = node.id(), name = %node.name(), api = %node.local().api_addr, rpc = %node.local().rpc_addr, "node is up");
        Ok(Agent {
            node,
            _service: service,
            rpc,
            bootstrap,
        })
    }

    pub fn id(&self) -> NodeId {
        self.node.id()
    }

    pub fn name(&self) -> &str {
        self.node.name()
    }

    pub fn api_url(&self) -> String {
        self.node.local().spec.api_url()
    }

    pub fn rpc_addr(&self) -> SocketAddr {
        self.node.local().rpc_addr
    }

    pub fn data_dir(&self) -> &std::path::Path {
        self.node.data_dir()
    }

    /// The node's parts, for tests and benchmarks that drive them directly.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    pub fn current_leader(&self) -> Option<NodeId> {
        self.node.ledger().current_leader()
    }

    /// This node's own gossip view of its peers (what `shoal mesh` shows).
    pub fn peer_views(&self) -> Vec<shoal_sdk::PeerView> {
        crate::views::peer_views(self.node.ledger(), self.node.peers())
    }

    /// This node's applied ledger (local, possibly behind the leader).
    pub fn ledger(&self) -> LedgerHandle {
        self.node.ledger().handle()
    }

    /// The voter set as this node knows it.
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.node.ledger().voters()
    }

    /// Why this node's ledger stopped for good (a storage error — a full
    /// or failing disk — stops Raft on this node), if it did.
    pub fn ledger_stopped(&self) -> Option<String> {
        let metrics = self.node.ledger().raft_metrics();
        let why = metrics
            .borrow()
            .running_state
            .as_ref()
            .err()
            .map(|f| f.to_string());
        why
    }

    /// Why this node was removed from the cluster, once it heard.
    pub fn removed(&self) -> Option<String> {
        self.node.ledger().removal().get()
    }

    /// Waits until this node hears that it was removed from the cluster,
    /// marks its data dir so that it never starts again, and says why. The
    /// agent then exits: its id and certificate are refused for good, and
    /// its ranks belong to jobs the cluster has already moved.
    pub async fn removed_from_cluster(&self) -> String {
        let why = self.node.ledger().removal().wait().await;
        if let Err(e) = crate::ledger_client::removal::mark(self.data_dir(), &why) {
            tracing::error!(error = %e, "cannot mark the data dir as a removed node's");
        }
        why
    }

    /// Waits until this node's ledger stops for good, and says why. A node
    /// in that state can serve nothing the cluster commits, so the agent
    /// exits and its supervisor starts it again (systemd's
    /// `Restart=on-failure`): a node whose disk was full comes back once
    /// it has room, from what it had written.
    ///
    /// It waits on Raft's server metrics, published only when they change:
    /// its full metrics are published on every turn of its loop. A stop is
    /// published in the full metrics alone, and Raft's loop drops every
    /// sender as it ends, so the wait ends then too.
    pub async fn ledger_stopped_for_good(&self) -> String {
        let mut server = self.node.ledger().raft().server_metrics();
        loop {
            if let Some(why) = self.ledger_stopped() {
                return why;
            }
            if server.changed().await.is_err() {
                return self
                    .ledger_stopped()
                    .unwrap_or_else(|| "Raft has shut down".into());
            }
        }
    }

    /// This node's own write through the leader (forwarded when this node
    /// is not it; applied there only as far as this member may).
    pub async fn write(&self, cmd: Command) -> Result<(LedgerResponse, u64), WireError> {
        self.node.ledger().write(cmd).await
    }

    /// A user's write with API token `token`, relayed to the leader.
    pub async fn write_as(
        &self,
        token: &str,
        cmd: Command,
    ) -> Result<(LedgerResponse, u64), WireError> {
        let token = crate::proto::UserToken(token.to_string());
        self.node.ledger().write_as(&token, cmd).await
    }

    pub async fn status(&self) -> Result<StatusResponse, WireError> {
        self.node.ledger().status().await
    }

    /// Leaves the cluster cleanly (removal through the leader).
    pub async fn leave(&self) -> Result<(), WireError> {
        self.node
            .ledger()
            .remove_member(self.node.id(), None)
            .await
            .map(|_| ())
    }

    /// Stops the node: API, background loops, Raft and the RPC endpoint.
    pub async fn shutdown(&self) {
        self.node.signal_shutdown();
        let _ = self.node.ledger().raft().shutdown().await;
        self.rpc.shutdown().await;
    }
}

/// A node that was down past its certificate's expiry cannot renew over
/// mTLS (its peers refuse the expired certificate, and a whole cluster off
/// for that long has no valid certificate left). A holder of the CA key —
/// a voter — signs itself a fresh one, for the same id and name; any other
/// node must be removed and join again.
fn reissue_if_expired(
    data_dir: &std::path::Path,
    ident: Identity,
    lifetime: Duration,
) -> Result<Identity, AgentError> {
    let now = crate::clock::wall_ms() / 1000;
    let expired = shoal_mesh::tls::cert_validity(&ident.credentials.cert_pem)
        .is_none_or(|(_, not_after)| not_after <= now as i64 + 60);
    if !expired {
        return Ok(ident);
    }
    // The CA that signed the expired certificate if this node holds its
    // key (its peers trusted it last), else any CA it trusts and holds the
    // key of (mid-rotation).
    let trusted = shoal_mesh::tls::split_certs(&ident.credentials.ca_pem);
    let signer = trusted
        .iter()
        .position(|c| shoal_mesh::tls::issued_by(&ident.credentials.cert_pem, c));
    let ca = signer.into_iter().chain(0..trusted.len()).find_map(|i| {
        crate::trust::ca_key::key_for(data_dir, &trusted[i]).map(|key_pem| CaBundle {
            cert_pem: trusted[i].clone(),
            key_pem,
        })
    });
    let Some(ca) = ca else {
        if crate::trust::ca_key::load(data_dir).is_some() {
            return Err(AgentError::Config(
                "the CA key in the data dir does not match the cluster CA".into(),
            ));
        }
        tracing::error!(
            "this node's certificate has expired and it holds no CA key: remove it (shoal node remove) and join it again"
        );
        return Ok(ident);
    };
    let credentials = ca
        .issue_for(&ident.name, ident.node_id, lifetime)
        .map_err(|e| AgentError::Config(e.to_string()))?;
    let renewed = Identity {
        credentials: shoal_mesh::NodeCredentials {
            ca_pem: ident.credentials.ca_pem.clone(),
            ..credentials
        },
        ..ident
    };
    identity::save_identity(data_dir, &renewed).map_err(AgentError::Io)?;
    tracing::warn!("this node's certificate had expired; re-issued it with the CA key it holds");
    Ok(renewed)
}

/// Makes this node the first member of a new cluster: initialises Raft,
/// commits the cluster record and writes the first admin token.
async fn bootstrap_cluster(
    node: &Node,
    cluster_id: String,
    ca: CaBundle,
) -> Result<BootstrapInfo, AgentError> {
    let local = node.local();
    let ledger = node.ledger();
    let nodes = BTreeMap::from([(local.id, BasicNode::new(local.rpc_addr.to_string()))]);
    ledger
        .raft()
        .initialize(nodes)
        .await
        .map_err(|e| AgentError::Raft(format!("cannot initialize the cluster: {e}")))?;
    ledger
        .raft()
        .wait(Some(Duration::from_secs(10)))
        .current_leader(local.id, "bootstrap")
        .await
        .map_err(|e| AgentError::Raft(format!("this node did not become leader: {e}")))?;
    // The first voter holds the CA key; it never enters the ledger.
    crate::trust::ca_key::store(node.data_dir(), &ca.key_pem)
        .map_err(|e| io("cannot write the CA key", e))?;
    let (admin_token, admin_hash) = identity::new_api_token();
    let cmd = Command::Bootstrap {
        cluster_id,
        region: node.config().region.clone(),
        ca_cert_pem: ca.cert_pem.clone(),
        admin_token_hash: admin_hash,
        first_member: local.id,
        spec: local.spec.clone(),
    };
    match ledger.write(cmd).await {
        Ok((LedgerResponse::NodeId(_), _)) => {}
        Ok((other, _)) => return Err(AgentError::Raft(format!("bootstrap refused: {other:?}"))),
        Err(e) => return Err(AgentError::Raft(format!("bootstrap write failed: {e}"))),
    }
    identity::write_private(
        &node.data_dir().join(identity::ADMIN_TOKEN_FILE),
        format!("{admin_token}\n").as_bytes(),
        0o600,
    )
    .map_err(|e| io("cannot write the admin token", e))?;
    let admin = auth::caller(ledger, &admin_token)
        .ok_or_else(|| AgentError::Raft("the bootstrap admin token was not applied".into()))?;
    // Single use, like every join token unless asked otherwise: it is
    // printed, so it should not outlive the one join it is printed for. It
    // admits a voter: the second node is the start of the quorum.
    let ttl = Duration::from_secs(node.config().join_token_ttl_s);
    let join_token = auth::create_join_token(ledger, &admin, ttl, 1, true)
        .await
        .map_err(|e| AgentError::Raft(e.to_string()))?
        .token;
    Ok(BootstrapInfo {
        admin_token,
        join_token,
    })
}

/// This agent's rank cgroups (`executor.cgroups`), with the leftovers of
/// its previous run killed and removed; None, said once in the log, where
/// it cannot have them.
async fn rank_cgroups(
    cfg: &Config,
    name: &str,
    data_dir: &std::path::Path,
) -> Option<Arc<RankCgroups>> {
    if !cfg.executor.enabled {
        return None;
    }
    if cfg.executor.cgroups == CgroupMode::Off {
        tracing::info!("executor.cgroups = off: ranks run without cgroups (isolation: none); they are fenced by their process group only");
        return None;
    }
    let dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let cgroups = match RankCgroups::detect(&cgroup::agent_key(name, &dir)) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("cgroups are unavailable, so ranks start without resource fences (isolation: none): {e}");
            return None;
        }
    };
    let (cleared, failed) = cgroups.clear_leftovers().await;
    if cleared > 0 {
        tracing::info!(
            cleared,
            "killed and removed the rank cgroups this agent's previous run left"
        );
    }
    for e in failed {
        tracing::warn!(error = %e, "could not clear a rank cgroup this agent's previous run left");
    }
    tracing::info!(
        cgroup = %cgroups.dir().display(),
        isolation = %cgroups.isolation(),
        "every rank runs in a cgroup of its own"
    );
    Some(Arc::new(cgroups))
}

/// Starts the node's background loops, each with the handles it uses.
/// The cluster CA, readable by every rank (`SHOAL_CA_FILE`), so that a job
/// can check the node's HTTPS API like the CLI does. Public, but written
/// by the agent alone: the jobs dir is root's and only lets users pass.
fn write_rank_ca_file(jobs_dir: &std::path::Path, ca_pem: &str) -> Result<PathBuf, AgentError> {
    let path = jobs_dir.join("cluster-ca.pem");
    std::fs::create_dir_all(jobs_dir).map_err(|e| {
        io(
            &format!("cannot create the jobs dir {}", jobs_dir.display()),
            e,
        )
    })?;
    identity::write_private(&path, ca_pem.as_bytes(), 0o644)
        .map_err(|e| io(&format!("cannot write {}", path.display()), e))?;
    Ok(path)
}

fn spawn_workers(
    node: &Arc<Node>,
    gossip: shoal_mesh::gossip::GossipHandle,
    gossip_events: tokio::sync::mpsc::Receiver<shoal_mesh::gossip::GossipEvent>,
    cgroups: Option<Arc<RankCgroups>>,
    rank_ca_file: Option<PathBuf>,
) {
    let cfg = node.config();
    let local = node.local().clone();
    let ledger = node.ledger().clone();
    let events = EventLog::new(ledger.clone(), node.metrics().clone());
    workers::gossip::spawn(
        GossipParts {
            local: local.clone(),
            ledger: ledger.clone(),
            view: node.peers().clone(),
            metrics: node.metrics().clone(),
            gpus: node.gpus().clone(),
            faults: cfg.test_faults.clone(),
        },
        gossip,
        gossip_events,
        node.shutdown_signal(),
    );
    worker::spawn(
        crate::workers::federation::SummaryPull { node: node.clone() },
        node.shutdown_signal(),
    );
    worker::spawn(
        crate::workers::regions::RegionCopies::new(node.clone()),
        node.shutdown_signal(),
    );
    worker::spawn(
        crate::workers::regions::RegionTakeover { node: node.clone() },
        node.shutdown_signal(),
    );
    worker::spawn(
        crate::workers::global_caps::GlobalCaps::new(node.clone()),
        node.shutdown_signal(),
    );
    worker::spawn(
        crate::workers::peer_secrets::PeerSecrets::new(node.clone()),
        node.shutdown_signal(),
    );
    worker::spawn(
        crate::workers::log_follow::LogFollower::new(
            ledger.clone(),
            crate::identity::load_join_seed(node.data_dir()),
        ),
        node.shutdown_signal(),
    );
    worker::spawn(
        Housekeeping::new(
            ledger.clone(),
            node.peers().clone(),
            node.contacts().clone(),
            Duration::from_millis(cfg.membership.voter_replace_after_ms),
            Duration::from_millis(cfg.raft.election_timeout_min_ms.saturating_mul(2)),
        ),
        node.shutdown_signal(),
    );
    worker::spawn(
        Scheduler {
            ledger: ledger.clone(),
            peers: node.peers().clone(),
            metrics: node.metrics().clone(),
            policy: cfg.scheduler.policy,
            period: Duration::from_millis(cfg.scheduler.interval_ms.max(1)),
        },
        node.shutdown_signal(),
    );
    if cfg.executor.enabled {
        let executor = Executor::new(RankHost {
            local: local.clone(),
            ledger: ledger.clone(),
            peers: node.peers().clone(),
            chunks: node.chunks().clone(),
            metrics: node.metrics().clone(),
            events: events.clone(),
            jobs_dir: cfg.jobs_dir(),
            stop_grace: Duration::from_secs(cfg.executor.stop_grace_s),
            stall_after: Duration::from_secs(cfg.anomaly.stall_after_s),
            users: RankUsers {
                run_as: cfg.executor.run_as.clone(),
                users: cfg.executor.users.clone(),
                allow_root: cfg.executor.allow_root,
                known: Default::default(),
            },
            cgroups,
            ca_file: rank_ca_file,
            gpus: node.gpus().clone(),
            task_launcher: cfg
                .executor
                .task_launcher
                .clone()
                .or_else(|| std::env::current_exe().ok())
                .unwrap_or_else(|| PathBuf::from("shoal")),
            regions: node.federation().leases().clone(),
            region_lease: Duration::from_millis(cfg.federation.region_lease_ms),
        });
        worker::spawn(
            workers::job_files::JobFiles {
                me: local.id,
                ledger: ledger.clone(),
                jobs_dir: cfg.jobs_dir(),
                log_max_bytes: cfg.executor.log_max_bytes,
                retention: Duration::from_secs(cfg.executor.job_retention_s),
            },
            node.shutdown_signal(),
        );
        worker::spawn(executor.freshness_probe(), node.shutdown_signal());
        worker::spawn(executor.fence_guard(), node.shutdown_signal());
        worker::spawn(executor, node.shutdown_signal());
    } else {
        // No ranks to fence, but the renewals are also how the leader
        // knows this node lives.
        worker::spawn(
            crate::executor::freshness::FreshnessProbe::new(
                ledger.clone(),
                Default::default(),
                Duration::from_millis(shoal_consensus::workload::SELF_FENCE_MS),
            ),
            node.shutdown_signal(),
        );
    }
    worker::spawn(
        AnomalyWatch::new(
            local.clone(),
            ledger.clone(),
            node.peers().clone(),
            node.gpus().clone(),
            cfg.anomaly.clone(),
            events,
        ),
        node.shutdown_signal(),
    );
    if let Some(url) = cfg.anomaly.webhook_url.clone() {
        match Webhook::new(ledger.clone(), url) {
            Ok(webhook) => worker::spawn(webhook, node.shutdown_signal()),
            Err(e) => tracing::error!(error = %e, "events will not be posted"),
        }
    }
    worker::spawn(
        Durability::new(
            node.chunks().clone(),
            node.metrics().clone(),
            cfg.storage.clone(),
        ),
        node.shutdown_signal(),
    );
    worker::spawn(
        workers::gpu_health::GpuHealth {
            local: local.clone(),
            ledger: ledger.clone(),
            gpus: node.gpus().clone(),
        },
        node.shutdown_signal(),
    );
    worker::spawn(
        workers::own_removal::OwnRemoval::new(ledger.clone()),
        node.shutdown_signal(),
    );
    worker::spawn(MemberRecord { local, ledger }, node.shutdown_signal());
}
