//! Checkpoint chunks over the cluster's mutual-TLS quinn RPC
//! (`Request::Chunk`): the client side ([`QuicChunkTransport`], the
//! `shoal-storage` transport the replication code drives) and the server
//! side ([`ChunkNet::serve`]), which stores chunks in this node's store and
//! forwards chained pushes down the rest of the chain.
//!
//! `shoal-storage` is synchronous, so the transport runs on blocking
//! threads and drives the async RPC with the runtime handle.
//!
//! Every transport [`ChunkNet::transport`] hands out is wrapped in a
//! [`FaultyChunkTransport`], which passes everything straight through unless
//! a test installed a fault router ([`crate::faults`]); the chained pushes
//! this node forwards use the same wrapped transport, so each forwarded hop
//! is judged by the node that sends it.

use crate::faults::{FaultRouter, FaultyChunkTransport};
use crate::ledger_client::LedgerClient;
use crate::proto::{self, ChunkRequest, ErrorCode, Request, Response, WireError};
use shoal_mesh::RpcEndpoint;
use shoal_storage::chunk::{ChunkId, EncodedChunk};
use shoal_storage::replicate::{ChainPush, ChunkTransport, TransportError};
use shoal_storage::ChunkStore;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The chunk transport of a node: QUIC underneath, the fault router (when a
/// test installed one) on top.
pub type NodeChunkTransport = FaultyChunkTransport<QuicChunkTransport>;

const CHUNK_RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a chunk call waits for this node's ledger to learn of a member
/// that joined a moment ago.
const MEMBER_CATCH_UP: Duration = Duration::from_secs(2);

/// This node's chunk store and its way to other members' stores.
#[derive(Clone)]
pub struct ChunkNet {
    ledger: LedgerClient,
    rpc: RpcEndpoint,
    store: Arc<ChunkStore>,
    faults: Option<FaultRouter>,
    receipts: Arc<std::sync::Mutex<super::receipts::UploadReceipts>>,
}

impl ChunkNet {
    /// `faults` is for tests: a router that judges every chunk message this
    /// node sends (None in production: no effect).
    pub fn new(
        ledger: LedgerClient,
        rpc: RpcEndpoint,
        store: Arc<ChunkStore>,
        faults: Option<FaultRouter>,
    ) -> Self {
        ChunkNet {
            ledger,
            rpc,
            store,
            faults,
            receipts: Arc::default(),
        }
    }

    /// `tenant` uploaded chunk `id` to this node through the API.
    pub fn note_upload(&self, tenant: &str, id: ChunkId) {
        if let Ok(mut receipts) = self.receipts.lock() {
            receipts.record(tenant, id, crate::clock::wall_ms());
        }
    }

    /// For each of `ids`, whether `tenant` uploaded it to this node lately.
    pub fn uploaded(&self, tenant: &str, ids: &[ChunkId]) -> Vec<bool> {
        match self.receipts.lock() {
            Ok(receipts) => receipts.uploaded(tenant, ids, crate::clock::wall_ms()),
            Err(_) => vec![false; ids.len()],
        }
    }

    /// For each of `ids`, whether `tenant` uploaded it to member `node`
    /// lately: asked over RPC unless `node` is this one.
    pub async fn uploaded_to(
        &self,
        node: u64,
        tenant: &str,
        ids: &[ChunkId],
    ) -> Result<Vec<bool>, String> {
        if node == self.ledger.me() {
            return Ok(self.uploaded(tenant, ids));
        }
        let Some(first) = ids.first().copied() else {
            return Ok(Vec::new());
        };
        let req = ChunkRequest::Uploaded {
            tenant: tenant.to_string(),
            ids: ids.to_vec(),
        };
        let transport = QuicChunkTransport::new(self.clone(), tokio::runtime::Handle::current());
        let count = ids.len();
        tokio::task::spawn_blocking(move || transport.call(node, first, req))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
            .and_then(|answer| match answer {
                Response::Has(v) if v.len() == count => Ok(v),
                other => Err(format!("unexpected answer {other:?}")),
            })
    }

    /// The chunks held by this node (its own and replicas for peers).
    pub fn store(&self) -> &Arc<ChunkStore> {
        &self.store
    }

    pub fn ledger(&self) -> &LedgerClient {
        &self.ledger
    }

    /// A transport to other members, for blocking code on `handle`'s runtime.
    pub fn transport(&self, handle: tokio::runtime::Handle) -> NodeChunkTransport {
        FaultyChunkTransport::wrap(
            self.ledger.me(),
            Arc::new(QuicChunkTransport::new(self.clone(), handle)),
            self.faults.clone(),
        )
    }
}

/// Chunk push/fetch/has over quinn to other members.
pub struct QuicChunkTransport {
    net: ChunkNet,
    handle: tokio::runtime::Handle,
}

impl QuicChunkTransport {
    pub fn new(net: ChunkNet, handle: tokio::runtime::Handle) -> Self {
        QuicChunkTransport { net, handle }
    }

    /// The RPC address of member `node` in this node's ledger. A node id
    /// this ledger has not issued yet belongs to a member that joined a
    /// moment ago (the target came from a newer view: the leader's
    /// placement, or the previous hop of a chain), so the lookup waits for
    /// this ledger to catch up, for up to `MEMBER_CATCH_UP`, waking on every
    /// apply. An id below `next_node_id` that is not a member was removed
    /// and fails at once.
    fn addr_of(&self, node: u64) -> Result<SocketAddr, TransportError> {
        let unreachable = |reason: String| TransportError::Unreachable { node, reason };
        let deadline = Instant::now() + MEMBER_CATCH_UP;
        let mut applied = self.net.ledger.raft_metrics();
        loop {
            {
                let data = self.net.ledger.read().map_err(|e| unreachable(e.message))?;
                if let Some(member) = data.ledger.members.get(&node) {
                    return member.spec.rpc_addr.parse().map_err(|_| {
                        unreachable(format!("invalid address '{}'", member.spec.rpc_addr))
                    });
                }
                if node < data.ledger.next_node_id {
                    return Err(unreachable("not a member".into()));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(unreachable(format!(
                    "no known address (this node's ledger has not learnt of it within {MEMBER_CATCH_UP:?})"
                )));
            }
            // The timer must be made inside the runtime: this runs on a
            // plain thread, where creating it would panic.
            let changed = self
                .handle
                .block_on(async { tokio::time::timeout(left, applied.changed()).await });
            match changed {
                Ok(Ok(())) | Err(_) => {}
                Ok(Err(_)) => return Err(unreachable("this node is shutting down".into())),
            }
        }
    }

    /// One chunk RPC; `id` names the chunk in errors.
    fn call(&self, node: u64, id: ChunkId, req: ChunkRequest) -> Result<Response, TransportError> {
        self.call_within(node, id, req, CHUNK_RPC_TIMEOUT)
    }

    fn call_within(
        &self,
        node: u64,
        id: ChunkId,
        req: ChunkRequest,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        if node == self.net.ledger.me() {
            return judge(node, id, self.net.serve(&self.handle, req));
        }
        let body = proto::encode(&Request::Chunk(req));
        self.send(node, id, &body, timeout)
    }

    /// A chained put, encoded straight from the stored frame.
    fn call_put_chain(
        &self,
        node: u64,
        chunk: &EncodedChunk,
        forward: Vec<u64>,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        let id = chunk.id();
        if node == self.net.ledger.me() {
            let req = ChunkRequest::PutChain {
                id,
                frame: chunk.bytes().to_vec(),
                forward,
            };
            return judge(node, id, self.net.serve(&self.handle, req));
        }
        let body = proto::encode_put_chain(&id, chunk.bytes(), &forward);
        self.send(node, id, &body, timeout)
    }

    fn send(
        &self,
        node: u64,
        id: ChunkId,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        let addr = self.addr_of(node)?;
        let bytes = self
            .handle
            .block_on(self.net.rpc.call(addr, body, timeout))
            .map_err(|e| TransportError::Unreachable {
                node,
                reason: e.to_string(),
            })?;
        judge(
            node,
            id,
            proto::decode::<Response>(&bytes).unwrap_or_else(Response::Error),
        )
    }
}

/// A chunk call's answer, its errors sorted into the transport's kinds.
fn judge(node: u64, id: ChunkId, reply: Response) -> Result<Response, TransportError> {
    match reply {
        Response::Error(e) if e.message.contains("full") => {
            Err(TransportError::StoreFull { node, id })
        }
        Response::Error(e) if e.message.contains("not found") || e.message.contains("missing") => {
            Err(TransportError::NotFound { node, id })
        }
        Response::Error(e) => Err(TransportError::Rejected {
            node,
            id,
            reason: e.message,
        }),
        other => Ok(other),
    }
}

fn unexpected(node: u64, id: ChunkId, answer: &Response) -> TransportError {
    TransportError::Rejected {
        node,
        id,
        reason: format!("unexpected answer {answer:?}"),
    }
}

impl ChunkTransport for QuicChunkTransport {
    fn push(&self, node: u64, chunk: &EncodedChunk) -> Result<(), TransportError> {
        let id = chunk.id();
        let req = ChunkRequest::Put {
            id,
            frame: chunk.bytes().to_vec(),
        };
        match self.call(node, id, req)? {
            Response::ChunkStored => Ok(()),
            other => Err(unexpected(node, id, &other)),
        }
    }

    fn fetch(&self, node: u64, id: &ChunkId) -> Result<EncodedChunk, TransportError> {
        match self.call(node, *id, ChunkRequest::Fetch { id: *id })? {
            Response::Chunk(frame) => {
                EncodedChunk::from_wire(*id, frame).map_err(|e| TransportError::Rejected {
                    node,
                    id: *id,
                    reason: e.to_string(),
                })
            }
            other => Err(unexpected(node, *id, &other)),
        }
    }

    /// Sends the frame to the first node of `chain` that answers, asking it
    /// to forward down the rest; a head that cannot be reached is reported
    /// and the next node becomes the head.
    fn push_chain(&self, chain: &[u64], chunk: &EncodedChunk) -> ChainPush {
        let id = chunk.id();
        let mut outcomes = Vec::with_capacity(chain.len());
        let mut source_sends = 0;
        for (head, &node) in chain.iter().enumerate() {
            let forward = chain[head + 1..].to_vec();
            // Each hop waits for the ones below it.
            let timeout = CHUNK_RPC_TIMEOUT * (forward.len() as u32 + 1);
            source_sends += 1;
            match self.call_put_chain(node, chunk, forward, timeout) {
                Ok(Response::ChainStored(answers)) if answers.len() == chain.len() - head => {
                    outcomes.extend(answers);
                    return ChainPush {
                        outcomes,
                        source_sends,
                    };
                }
                Ok(other) => {
                    outcomes.push(Err(unexpected(node, id, &other)));
                    // It answered, so it was reachable but is not a chain
                    // member we understand: try the rest from here.
                }
                Err(error) => outcomes.push(Err(error)),
            }
        }
        ChainPush {
            outcomes,
            source_sends,
        }
    }

    fn has(&self, node: u64, ids: &[ChunkId]) -> Result<Vec<bool>, TransportError> {
        let Some(first) = ids.first().copied() else {
            return Ok(Vec::new());
        };
        match self.call(node, first, ChunkRequest::Has { ids: ids.to_vec() })? {
            Response::Has(v) if v.len() == ids.len() => Ok(v),
            other => Err(unexpected(node, first, &other)),
        }
    }
}

impl ChunkNet {
    /// Serves a chunk request from a peer against the local store; blocking
    /// (a chained put forwards over the network with `handle`).
    pub fn serve(&self, handle: &tokio::runtime::Handle, req: ChunkRequest) -> Response {
        let store = &self.store;
        let result = match req {
            ChunkRequest::PutChain { id, frame, forward } => {
                return Response::ChainStored(self.serve_chain(handle, id, frame, &forward))
            }
            ChunkRequest::Put { id, frame } => EncodedChunk::from_wire(id, frame)
                .and_then(|chunk| store.put(&chunk))
                .map(|_| Response::ChunkStored),
            ChunkRequest::Fetch { id } => store
                .get_encoded(&id)
                .map(|c| Response::Chunk(c.into_bytes())),
            ChunkRequest::Has { ids } => ids
                .iter()
                .map(|id| store.contains(id))
                .collect::<Result<Vec<bool>, _>>()
                .map(Response::Has),
            ChunkRequest::Uploaded { tenant, ids } => {
                Ok(Response::Has(self.uploaded(&tenant, &ids)))
            }
        };
        result
            .unwrap_or_else(|e| Response::Error(WireError::new(ErrorCode::Rejected, e.to_string())))
    }
}

impl ChunkNet {
    /// Stores a chained chunk here while forwarding it down the rest of the
    /// chain, and answers every node's outcome, this node's first.
    fn serve_chain(
        &self,
        handle: &tokio::runtime::Handle,
        id: ChunkId,
        frame: Vec<u8>,
        forward: &[u64],
    ) -> Vec<Result<(), TransportError>> {
        let me = self.ledger.me();
        let chunk = match EncodedChunk::from_wire(id, frame) {
            Ok(chunk) => chunk,
            Err(e) => {
                // Corrupted on the way here: passing it on would only spread
                // it; the source learns every node below missed the chunk.
                let reason = format!("upstream copy was corrupt: {e}");
                return std::iter::once(Err(TransportError::Rejected {
                    node: me,
                    id,
                    reason: reason.clone(),
                }))
                .chain(forward.iter().map(|&node| {
                    Err(TransportError::Rejected {
                        node,
                        id,
                        reason: reason.clone(),
                    })
                }))
                .collect();
            }
        };
        let (mine, below) = std::thread::scope(|scope| {
            let downstream = (!forward.is_empty()).then(|| {
                let transport = self.transport(handle.clone());
                let chunk = &chunk;
                scope.spawn(move || transport.push_chain(forward, chunk))
            });
            let mine = self.store.put(&chunk).map(|_| ()).map_err(|e| {
                if matches!(e, shoal_storage::StorageError::StoreFull { .. }) {
                    TransportError::StoreFull { node: me, id }
                } else {
                    TransportError::Rejected {
                        node: me,
                        id,
                        reason: e.to_string(),
                    }
                }
            });
            let below = match downstream.map(|h| h.join()) {
                None => Vec::new(),
                Some(Ok(pushed)) => pushed.outcomes,
                Some(Err(_)) => forward
                    .iter()
                    .map(|&node| {
                        Err(TransportError::Other {
                            node,
                            reason: "the forwarding thread panicked".into(),
                        })
                    })
                    .collect(),
            };
            (mine, below)
        });
        std::iter::once(mine).chain(below).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::testkit::LocalCluster;

    /// A target this node's ledger does not know is waited for only when it
    /// may have joined a moment ago (an id not issued here yet), and then
    /// for at most `MEMBER_CATCH_UP`; an id already issued to nobody (or to
    /// a removed member) fails at once. Chaos seed 11 found the wait
    /// panicking on replication's plain threads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_target_is_waited_for_only_if_it_may_have_just_joined() {
        let cluster = LocalCluster::start(1, |_, cfg| cfg.executor.enabled = false)
            .await
            .expect("cluster");
        let net = cluster.agents[0].node().chunks().clone();
        let own = net.ledger().me();
        let future_id = net.ledger().read().expect("ledger").ledger.next_node_id + 5;
        let handle = tokio::runtime::Handle::current();
        let (own_addr, removed, future) = tokio::task::spawn_blocking(move || {
            let wrapped = net.transport(handle);
            let transport = wrapped.inner();
            let own_addr = transport.addr_of(own);
            let started = Instant::now();
            let removed = transport.addr_of(0).map_err(|e| (e, started.elapsed()));
            // From a plain thread, as replication's own threads call it:
            // outside the runtime, the wait's timer must still be made
            // inside it.
            let future = std::thread::scope(|s| {
                s.spawn(|| {
                    let started = Instant::now();
                    transport
                        .addr_of(future_id)
                        .map_err(|e| (e, started.elapsed()))
                })
                .join()
            })
            .expect("the lookup does not panic on a plain thread");
            (own_addr, removed, future)
        })
        .await
        .expect("lookups");
        assert_eq!(own_addr.expect("own address"), cluster.agents[0].rpc_addr());
        let (err, took) = removed.expect_err("id 0 was never a member");
        assert!(err.to_string().contains("not a member"), "{err}");
        assert!(
            took < MEMBER_CATCH_UP,
            "failed after {took:?}, without waiting"
        );
        let (err, took) = future.expect_err("nobody has that id");
        assert!(err.to_string().contains("has not learnt"), "{err}");
        assert!(took >= MEMBER_CATCH_UP, "gave up after {took:?}");
        cluster.shutdown().await;
    }
}
