//! openraft's network, over a transport the node crate provides. This crate
//! only defines the messages and what a transport must do with them.

use crate::types::{NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A Raft RPC on the wire.
#[derive(Serialize, Deserialize, Debug)]
pub enum RaftRpc {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
}

/// The receiver's answer: its Raft's own result, errors included.
#[derive(Serialize, Deserialize, Debug)]
pub enum RaftRpcReply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
}

/// Why a message did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Could not connect: the peer is down or the address is wrong.
    #[error("{0}")]
    Unreachable(String),
    /// Connected, but the exchange failed or timed out.
    #[error("{0}")]
    Failed(String),
}

pub type TransportFuture =
    Pin<Box<dyn Future<Output = Result<RaftRpcReply, TransportError>> + Send>>;

/// Delivers Raft messages to a node's address. Implemented by the node crate
/// over mesh RPC (and by in-memory routers in tests).
pub trait RaftTransport: Send + Sync + 'static {
    fn send(&self, target: NodeId, addr: &str, rpc: RaftRpc, timeout: Duration) -> TransportFuture;
}

/// When each peer last answered a Raft RPC. On the leader this is a liveness
/// signal for every member (leaders heartbeat voters and learners alike).
#[derive(Clone, Default)]
pub struct ContactTracker {
    inner: Arc<Mutex<HashMap<NodeId, Instant>>>,
}

impl ContactTracker {
    pub fn record(&self, node: NodeId) {
        if let Ok(mut m) = self.inner.lock() {
            m.insert(node, Instant::now());
        }
    }

    pub fn last_contact(&self, node: NodeId) -> Option<Instant> {
        self.inner.lock().ok().and_then(|m| m.get(&node).copied())
    }
}

#[derive(Clone)]
pub struct NetworkFactory {
    transport: Arc<dyn RaftTransport>,
    contacts: ContactTracker,
}

impl NetworkFactory {
    pub fn new(transport: Arc<dyn RaftTransport>, contacts: ContactTracker) -> Self {
        NetworkFactory {
            transport,
            contacts,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        Connection {
            target,
            addr: node.addr.clone(),
            transport: self.transport.clone(),
            contacts: self.contacts.clone(),
        }
    }
}

pub struct Connection {
    target: NodeId,
    addr: String,
    transport: Arc<dyn RaftTransport>,
    contacts: ContactTracker,
}

impl Connection {
    async fn exchange<E: std::error::Error>(
        &self,
        rpc: RaftRpc,
        option: &RPCOption,
    ) -> Result<RaftRpcReply, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>> {
        match self
            .transport
            .send(self.target, &self.addr, rpc, option.hard_ttl())
            .await
        {
            Ok(reply) => {
                self.contacts.record(self.target);
                Ok(reply)
            }
            Err(TransportError::Unreachable(m)) => Err(RPCError::Unreachable(Unreachable::new(
                &TransportError::Unreachable(m),
            ))),
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }

    fn unexpected<E: std::error::Error>(
        &self,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        RPCError::Network(NetworkError::new(&TransportError::Failed(format!(
            "node {} answered a different RPC kind",
            self.target
        ))))
    }

    fn remote<E: std::error::Error>(
        &self,
        e: RaftError<NodeId, E>,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.exchange(RaftRpc::AppendEntries(rpc), &option).await? {
            RaftRpcReply::AppendEntries(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .exchange(RaftRpc::InstallSnapshot(rpc), &option)
            .await?
        {
            RaftRpcReply::InstallSnapshot(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.exchange(RaftRpc::Vote(rpc), &option).await? {
            RaftRpcReply::Vote(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.unexpected()),
        }
    }
}
