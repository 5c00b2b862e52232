//! The node's parts and the small handles it hands out. [`Node`] owns them
//! (its fields are private); each worker, the API and the RPC handler get
//! only the handles they use: the [`LedgerClient`] (reads, writes routed to
//! the leader, queries, membership calls), the [`SharedPeerView`],
//! the chunk network ([`crate::rpc::chunks::ChunkNet`]), the GPUs and the
//! metrics.

use crate::config::Config;
use crate::gpu::Gpus;
use crate::gpu_relay;
use crate::ledger_client::LedgerClient;
use crate::metrics::Metrics;
use crate::peers::SharedPeerView;
use crate::rpc::chunks::ChunkNet;
use crate::trust::{audit, auth};
use shoal_consensus::network::ContactTracker;
use shoal_consensus::{MemberSpec, NodeId};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// Who this node is: fixed for the life of the process.
#[derive(Clone, Debug)]
pub struct LocalMember {
    pub id: NodeId,
    pub name: String,
    pub rpc_addr: SocketAddr,
    pub api_addr: SocketAddr,
    /// What this node publishes about itself in the ledger.
    pub spec: MemberSpec,
}

/// A running node's parts.
pub struct Node {
    local: LocalMember,
    cfg: Config,
    data_dir: PathBuf,
    ledger: LedgerClient,
    chunks: ChunkNet,
    peers: SharedPeerView,
    gpus: Gpus,
    metrics: Arc<Metrics>,
    contacts: ContactTracker,
    token_use: auth::TokenUse,
    audit: audit::AuditLog,
    federation: crate::federation::link::Federation,
    gpu_relay: gpu_relay::Relay,
    started: Instant,
    shutdown: watch::Sender<bool>,
}

/// Everything [`Node::new`] is made of.
pub struct NodeParts {
    pub local: LocalMember,
    pub cfg: Config,
    pub data_dir: PathBuf,
    pub ledger: LedgerClient,
    pub chunks: ChunkNet,
    pub peers: SharedPeerView,
    pub gpus: Gpus,
    pub metrics: Arc<Metrics>,
    pub contacts: ContactTracker,
}

impl Node {
    pub fn new(parts: NodeParts) -> Self {
        let (shutdown, _) = watch::channel(false);
        let federation =
            crate::federation::link::Federation::new(parts.cfg.federation.unreachable_after_ms);
        Node {
            local: parts.local,
            cfg: parts.cfg,
            data_dir: parts.data_dir,
            ledger: parts.ledger,
            chunks: parts.chunks,
            peers: parts.peers,
            gpus: parts.gpus,
            metrics: parts.metrics,
            contacts: parts.contacts,
            token_use: auth::TokenUse::default(),
            audit: audit::AuditLog::default(),
            federation,
            gpu_relay: Default::default(),
            started: Instant::now(),
            shutdown,
        }
    }

    pub fn local(&self) -> &LocalMember {
        &self.local
    }

    pub fn id(&self) -> NodeId {
        self.local.id
    }

    pub fn name(&self) -> &str {
        &self.local.name
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn ledger(&self) -> &LedgerClient {
        &self.ledger
    }

    pub fn chunks(&self) -> &ChunkNet {
        &self.chunks
    }

    pub fn peers(&self) -> &SharedPeerView {
        &self.peers
    }

    /// The other members' GPU samples, for the dashboard and `shoal top`.
    pub fn gpu_relay(&self) -> &gpu_relay::Relay {
        &self.gpu_relay
    }

    pub fn gpus(&self) -> &Gpus {
        &self.gpus
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn contacts(&self) -> &ContactTracker {
        &self.contacts
    }

    /// When this node saw each API token used (`shoal token api ls`).
    pub fn token_use(&self) -> &auth::TokenUse {
        &self.token_use
    }

    /// Records an audit event in the ledger, in this node's next window of
    /// audit records ([`audit`]).
    pub fn record_audit(&self, spec: shoal_consensus::events::EventSpec) {
        self.audit
            .record(&self.ledger, self.shutdown_signal(), spec);
    }

    /// Records a refusal of `caller`'s (a token id) within its budget of
    /// distinct records (`audit::RefusalLimiter`).
    pub fn record_refusal(
        &self,
        caller: &str,
        who: &str,
        spec: shoal_consensus::events::EventSpec,
    ) {
        self.audit
            .record_refusal(&self.ledger, self.shutdown_signal(), caller, who, spec);
    }

    /// Peer regions as this node sees them, and its clients to them.
    pub fn federation(&self) -> &crate::federation::link::Federation {
        &self.federation
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// Fires when the node stops (or is dropped).
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Tells every loop to stop.
    pub fn signal_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }
}
