//! openraft's network, over a transport the node crate provides. This crate
//! only defines the messages and what a transport must do with them.

use crate::types::{NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
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

    /// The largest encoded [`RaftRpc`] this transport carries. A larger
    /// AppendEntries is answered with `PayloadTooLarge`, so that openraft
    /// sends fewer entries per message instead of failing for ever.
    fn max_message_bytes(&self) -> u64 {
        u64::MAX
    }
}

/// How many of `entries` entries to send instead, when `size` encoded bytes
/// exceed `max`: `None` when it fits, or when a single entry does not (which
/// the proposer must prevent: nothing can split one entry).
pub fn entries_that_fit(size: u64, max: u64, entries: usize) -> Option<u64> {
    if size <= max || entries <= 1 {
        return None;
    }
    // Scale down by the overshoot, halving at least, one entry at least.
    let scaled = (entries as u128 * max as u128 / size as u128) as u64;
    Some(scaled.min(entries as u64 / 2).max(1))
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
        let max = self.transport.max_message_bytes();
        if max != u64::MAX {
            let entries = rpc.entries.len();
            let rpc = RaftRpc::AppendEntries(rpc);
            let size = bincode::serialized_size(&rpc).unwrap_or(u64::MAX);
            if let Some(hint) = entries_that_fit(size, max, entries) {
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(hint),
                ));
            }
            if size > max {
                return Err(RPCError::Network(NetworkError::new(
                    &TransportError::Failed(format!(
                        "a single log entry of {size} bytes exceeds the {max}-byte message limit"
                    )),
                )));
            }
            return match self.exchange(rpc, &option).await? {
                RaftRpcReply::AppendEntries(r) => r.map_err(|e| self.remote(e)),
                _ => Err(self.unexpected()),
            };
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Command, LedgerRequest};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};
    use proptest::prelude::*;

    /// Answers every AppendEntries with success; carries at most `max` bytes.
    struct Small {
        max: u64,
        sent: Arc<Mutex<Vec<usize>>>,
    }

    impl RaftTransport for Small {
        fn send(&self, _: NodeId, _: &str, rpc: RaftRpc, _: Duration) -> TransportFuture {
            let sent = self.sent.clone();
            Box::pin(async move {
                let RaftRpc::AppendEntries(r) = rpc else {
                    return Err(TransportError::Failed("only AppendEntries here".into()));
                };
                if let Ok(mut s) = sent.lock() {
                    s.push(r.entries.len());
                }
                Ok(RaftRpcReply::AppendEntries(Ok(
                    AppendEntriesResponse::Success,
                )))
            })
        }

        fn max_message_bytes(&self) -> u64 {
            self.max
        }
    }

    fn entries(n: u64, bytes: usize) -> Vec<Entry<TypeConfig>> {
        (1..=n)
            .map(|index| Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
                payload: EntryPayload::Normal(LedgerRequest {
                    now_ms: 0,
                    cmd: Command::PutAttr {
                        key: "k".into(),
                        value: "x".repeat(bytes),
                    },
                }),
            })
            .collect()
    }

    #[tokio::test]
    async fn too_many_entries_for_one_message_ask_openraft_for_fewer() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let mut conn = Connection {
            target: 2,
            addr: "127.0.0.1:1".into(),
            transport: Arc::new(Small {
                max: 10_000,
                sent: sent.clone(),
            }),
            contacts: ContactTracker::default(),
        };
        let request = |n| AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            entries: entries(n, 1000),
            leader_commit: None,
        };
        let option = || RPCOption::new(Duration::from_secs(1));
        match conn.append_entries(request(40), option()).await {
            Err(RPCError::PayloadTooLarge(too_large)) => {
                let hint = too_large.entries_hint();
                assert!((1..=9).contains(&hint), "hint {hint} does not fit 10 kB");
                conn.append_entries(request(hint), option())
                    .await
                    .expect("the hinted batch fits");
            }
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
        assert_eq!(
            sent.lock().map(|s| s.len()).unwrap_or(0),
            1,
            "only what fits is sent"
        );
    }

    #[test]
    fn what_fits_is_sent_whole() {
        assert_eq!(entries_that_fit(100, 100, 10), None);
        // One entry cannot be split: the proposer keeps entries small.
        assert_eq!(entries_that_fit(500, 100, 1), None);
        assert_eq!(entries_that_fit(1000, 100, 10), Some(1));
        assert_eq!(entries_that_fit(101, 100, 10), Some(5));
    }

    proptest! {
        #[test]
        fn the_hint_always_shrinks_the_batch(size in 1u64..1 << 40, max in 1u64..1 << 30, entries in 2usize..100_000) {
            if let Some(hint) = entries_that_fit(size, max, entries) {
                prop_assert!(size > max);
                prop_assert!(hint >= 1 && hint < entries as u64);
            }
        }
    }
}
