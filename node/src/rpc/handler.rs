//! The node's side of mesh RPC: every request a peer sends (Raft messages,
//! chunks, forwarded writes and queries, joins) and, on the leader, the
//! requests other nodes route to it.

use super::chunks::ChunkNet;
use super::proto::{self, ErrorCode, JoinRequest, Request, Response, WireError};
use crate::api::views::{self, Seen};
use crate::node::gpu::Gpus;
use crate::node::peers::SharedPeerView;
use crate::node::{auth, client::LeaderService, LedgerClient};
use futures::future::BoxFuture;
use shoal_consensus::network::{RaftRpc, RaftRpcReply};
use shoal_consensus::{Command, NodeId};
use shoal_mesh::{PeerInfo, RpcHandler};
use shoal_sdk::MemberState;
use std::sync::{Arc, OnceLock, Weak};

/// What serves requests once the node is wired.
pub struct NodeService {
    ledger: LedgerClient,
    chunks: ChunkNet,
    peers: SharedPeerView,
    gpus: Gpus,
}

impl NodeService {
    pub fn new(ledger: LedgerClient, chunks: ChunkNet, peers: SharedPeerView, gpus: Gpus) -> Self {
        NodeService {
            ledger,
            chunks,
            peers,
            gpus,
        }
    }

    async fn serve_rpc(self: &Arc<Self>, peer: PeerInfo, req: Request) -> Response {
        let result = match req {
            Request::Join(j) if !peer.authenticated => self.ledger.route(Request::Join(j)).await,
            _ if !peer.authenticated => Err(WireError::new(
                ErrorCode::Unauthenticated,
                "this request needs a certificate signed by the cluster CA",
            )),
            Request::Raft(rpc) => Ok(Response::Raft(self.serve_raft(rpc).await)),
            Request::Chunk(req) => {
                let chunks = self.chunks.clone();
                let handle = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || chunks.serve(&handle, req))
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))
            }
            other => self.serve_as_leader(other).await,
        };
        result.unwrap_or_else(Response::Error)
    }

    async fn serve_raft(&self, rpc: RaftRpc) -> RaftRpcReply {
        let raft = self.ledger.raft();
        match rpc {
            RaftRpc::AppendEntries(r) => RaftRpcReply::AppendEntries(raft.append_entries(r).await),
            RaftRpc::Vote(r) => RaftRpcReply::Vote(raft.vote(r).await),
            RaftRpc::InstallSnapshot(r) => {
                RaftRpcReply::InstallSnapshot(raft.install_snapshot(r).await)
            }
        }
    }

    async fn serve_as_leader(&self, req: Request) -> Result<Response, WireError> {
        match req {
            Request::Write(cmd) => {
                let (response, index) = self.ledger.write_local(cmd).await?;
                Ok(Response::Write { response, index })
            }
            Request::Query(q) => {
                self.ledger.ensure_linearizable().await?;
                let raft = self.ledger.raft_metrics().borrow().clone();
                let seen = Seen {
                    me: self.ledger.me(),
                    peers: &self.peers,
                    own_load: self.gpus.load(),
                };
                let data = self.ledger.read()?;
                views::answer(q, &data, &raft, &seen)
            }
            Request::Join(j) => self.admit(j).await,
            Request::RemoveMember(id) => self.remove_local(id).await,
            Request::Raft(_) | Request::Chunk(_) => Err(WireError::new(
                ErrorCode::Invalid,
                "Raft and chunk RPCs are not routed",
            )),
        }
    }

    async fn admit(&self, j: JoinRequest) -> Result<Response, WireError> {
        auth::admit(&self.ledger, j).await.map(Response::Join)
    }

    async fn remove_local(&self, id: NodeId) -> Result<Response, WireError> {
        if !self.ledger.is_leader() {
            return Err(WireError::new(ErrorCode::NotLeader, "not the leader"));
        }
        let known = self.ledger.read()?.ledger.members.get(&id).map(|m| m.state);
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
        if id == self.ledger.me() {
            return Err(WireError::new(
                ErrorCode::Rejected,
                format!("node {id} is the current leader: stop it first (another node takes over), then remove it"),
            ));
        }
        // Only the ledger changes here: the leader's housekeeping loop takes
        // nodes that left out of the Raft membership, as it makes every other
        // membership change.
        let (response, index) = self
            .ledger
            .write_local(Command::SetMemberState {
                id,
                state: MemberState::Left,
            })
            .await?;
        tracing::info!(node = id, "removed a member from the cluster");
        Ok(Response::Write { response, index })
    }
}

impl LeaderService for NodeService {
    fn serve(&self, req: Request) -> BoxFuture<'_, Result<Response, WireError>> {
        Box::pin(self.serve_as_leader(req))
    }
}

/// The mesh RPC handler; answers "starting" until the service is installed.
#[derive(Default)]
pub struct NodeRpc {
    service: OnceLock<Weak<NodeService>>,
}

impl NodeRpc {
    pub fn install(&self, service: &Arc<NodeService>) {
        let _ = self.service.set(Arc::downgrade(service));
    }
}

impl RpcHandler for NodeRpc {
    fn handle(&self, peer: PeerInfo, body: Vec<u8>) -> shoal_mesh::rpc::RpcFuture {
        let service = self.service.get().and_then(Weak::upgrade);
        Box::pin(async move {
            let Some(service) = service else {
                return proto::encode(&Response::Error(WireError::new(
                    ErrorCode::Unavailable,
                    "the node is still starting",
                )));
            };
            let resp = match proto::decode::<Request>(&body) {
                Ok(req) => service.serve_rpc(peer, req).await,
                Err(e) => Response::Error(e),
            };
            proto::encode(&resp)
        })
    }
}
