//! Raft messages over mesh RPC: the node's implementation of the consensus
//! crate's transport trait.

use crate::ledger_client::removal::RemovalNotice;
use crate::proto::{self, Request, Response};
use shoal_consensus::network::{RaftRpc, RaftTransport, TransportError, TransportFuture};
use shoal_consensus::NodeId;
use shoal_mesh::{RpcEndpoint, RpcError};
use std::net::SocketAddr;
use std::time::Duration;

pub struct MeshTransport {
    pub rpc: RpcEndpoint,
    /// A peer that refuses this node as removed says so on a Raft call
    /// first: a removed node's campaign reaches every voter.
    pub removal: RemovalNotice,
}

/// Room left in a frame for the request envelope around a Raft message.
const ENVELOPE_BYTES: u64 = 4096;

impl RaftTransport for MeshTransport {
    fn max_message_bytes(&self) -> u64 {
        shoal_mesh::rpc::MAX_FRAME as u64 - ENVELOPE_BYTES
    }

    fn send(&self, target: NodeId, addr: &str, rpc: RaftRpc, timeout: Duration) -> TransportFuture {
        let endpoint = self.rpc.clone();
        let removal = self.removal.clone();
        let addr = addr.to_string();
        Box::pin(async move {
            let sock: SocketAddr = addr.parse().map_err(|_| {
                TransportError::Unreachable(format!(
                    "node {target} has an invalid address '{addr}'"
                ))
            })?;
            let body = proto::encode(&Request::Raft(rpc));
            let reply = endpoint
                .call_member(sock, target, &body, timeout)
                .await
                .map_err(|e| match e {
                    RpcError::Unreachable { .. } => {
                        TransportError::Unreachable(format!("node {target}: {e}"))
                    }
                    other => TransportError::Failed(format!("node {target}: {other}")),
                })?;
            match proto::decode::<Response>(&reply) {
                Ok(Response::Raft(r)) => Ok(r),
                Ok(Response::Error(e)) => {
                    removal.note_refusal(target, &e);
                    Err(TransportError::Failed(format!(
                        "node {target}: {}",
                        e.message
                    )))
                }
                Ok(_) => Err(TransportError::Failed(format!(
                    "node {target} answered a Raft RPC with something else"
                ))),
                Err(e) => Err(TransportError::Failed(format!("node {target}: {e}"))),
            }
        })
    }
}
