//! The ledger client every part of the node uses: reads of this node's
//! applied ledger, writes and linearizable queries routed to the leader
//! (served here when this node leads, with the batcher behind the writes),
//! and the Raft membership calls the leader's housekeeping makes.

use crate::faults::{Channel, FaultRouter, Verdict, RAFT_DROP_WAIT_MAX};
use crate::ledger_client::batcher::Batcher;
use crate::ledger_client::read_rounds::ReadRounds;
use crate::ledger_client::removal::RemovalNotice;
use crate::metrics::Metrics;
use crate::proto::{self, ErrorCode, Query, Request, Response, UserToken, WireError};
use futures::future::BoxFuture;
use openraft::error::{ChangeMembershipError, CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, RaftMetrics, ServerState};
use shoal_consensus::store::{LedgerHandle, LogStore, StateMachineData};
use shoal_consensus::types::Raft;
use shoal_consensus::{Command, LedgerResponse, NodeId};
use shoal_mesh::RpcEndpoint;
use shoal_sdk::{NodeInfo, StatusResponse};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, RwLockReadGuard, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What the leader serves: the node's RPC handler, installed once the node
/// is wired. A trait, so that routing does not depend on what it routes to.
// This build must speak the protocol that brought write ids.
const _: () = assert!(shoal_mesh::protocol::PROTOCOL >= shoal_consensus::once::SINCE_PROTOCOL);
const _: () = assert!(
    shoal_mesh::protocol::PROTOCOL >= shoal_consensus::workload::WHOLE_NODES_SINCE_PROTOCOL
);

pub trait LeaderService: Send + Sync + 'static {
    fn serve(&self, req: Request) -> BoxFuture<'_, Result<Response, WireError>>;
}

pub type RaftWatch = watch::Receiver<RaftMetrics<NodeId, BasicNode>>;

/// Changes of this node's applied index, for loops that act on what the
/// ledger says as soon as it says it. It watches Raft's data metrics, which
/// are published only when they change: the full metrics are published on
/// every turn of Raft's loop, its timer's ticks included (about four a
/// second on every node, idle or not), and each publication woke every
/// loop waiting for an entry (docs/BENCHMARKS.md, "Ninth run"). A leader's
/// quorum acknowledgements still change its data metrics often, and are
/// skipped here.
pub struct AppliedWatch {
    rx: watch::Receiver<openraft::metrics::RaftDataMetrics<NodeId>>,
    last: Option<openraft::LogId<NodeId>>,
}

impl AppliedWatch {
    /// Returns once an entry was applied since the last return; never, once
    /// Raft has shut down.
    pub async fn changed(&mut self) {
        loop {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            let applied = self.rx.borrow_and_update().last_applied;
            if applied != self.last {
                self.last = applied;
                return;
            }
        }
    }
}

/// How long a renewal through a relay may take before the node asks the
/// leader itself.
const RELAYED_RENEWAL_TIMEOUT: Duration = Duration::from_millis(600);

/// A cheap handle on this node's ledger and its route to the leader.
#[derive(Clone)]
pub struct LedgerClient {
    shared: Arc<Shared>,
}

struct Shared {
    me: NodeId,
    raft: Raft,
    state: LedgerHandle,
    /// A reader of this node's Raft log, for the members it relays to.
    log: LogStore,
    rpc: RpcEndpoint,
    batcher: Batcher,
    read_rounds: ReadRounds,
    metrics: Arc<Metrics>,
    request_timeout: Duration,
    leader_service: OnceLock<Weak<dyn LeaderService>>,
    /// This node is handing its leadership over: it proposes nothing more
    /// (an append would renew the voters' leader lease and keep the
    /// successor from being elected).
    stepping_down: std::sync::atomic::AtomicBool,
    /// Test only: judges the requests forwarded to the leader, so that a
    /// node cut off by a fault filter cannot reach the leader this way
    /// either (see [`crate::faults`]).
    faults: Option<FaultRouter>,
    /// Set when a peer refuses this node as removed.
    removal: RemovalNotice,
    /// See [`LedgerClient::renewed_index`].
    renewed_index: std::sync::atomic::AtomicU64,
    /// Woken whenever `renewed_index` rises.
    renewed_index_rose: tokio::sync::Notify,
    /// See [`LedgerClient::last_renewed`].
    last_renewed: std::sync::Mutex<Option<Instant>>,
    /// The replica this node follows the log from, when relayed: its
    /// renewals go there.
    relay: std::sync::Mutex<Option<(NodeId, SocketAddr)>>,
    /// On a replica: the renewals it passes on to the leader together.
    relayed_renewals: RelayedRenewals,
    /// See [`LedgerClient::effective_protocol`].
    protocol_memo: super::per_applied::PerApplied<Option<u16>>,
}

/// The members that renewed through this replica since its last call to
/// the leader, and the rounds those calls are shared in.
#[derive(Default)]
struct RelayedRenewals {
    members: Arc<std::sync::Mutex<BTreeSet<NodeId>>>,
    rounds: ReadRounds,
}

/// How the ledger client reaches the other members.
pub struct PeerLinks {
    pub rpc: RpcEndpoint,
    pub request_timeout: Duration,
    /// Test only: judges the calls to other members (see
    /// [`crate::faults`]).
    pub faults: Option<FaultRouter>,
    /// Shared with the Raft transport, which hears a refusal first.
    pub removal: RemovalNotice,
}

impl LedgerClient {
    pub fn new(
        me: NodeId,
        raft: Raft,
        state: LedgerHandle,
        log: LogStore,
        metrics: Arc<Metrics>,
        links: PeerLinks,
    ) -> Self {
        let PeerLinks {
            rpc,
            request_timeout,
            faults,
            removal,
        } = links;
        let batcher = Batcher::spawn(raft.clone(), me);
        tokio::spawn(super::raft_timer::tick_only_where_needed(raft.clone(), me));
        LedgerClient {
            shared: Arc::new(Shared {
                me,
                raft,
                state,
                log,
                rpc,
                batcher,
                read_rounds: ReadRounds::default(),
                metrics,
                request_timeout,
                leader_service: OnceLock::new(),
                stepping_down: std::sync::atomic::AtomicBool::new(false),
                faults,
                removal,
                renewed_index: std::sync::atomic::AtomicU64::new(0),
                renewed_index_rose: tokio::sync::Notify::new(),
                last_renewed: std::sync::Mutex::new(None),
                relay: std::sync::Mutex::new(None),
                relayed_renewals: RelayedRenewals::default(),
                protocol_memo: Default::default(),
            }),
        }
    }

    /// Installs what serves routed requests when this node is the leader.
    pub fn serve_leader_requests_with(&self, service: Weak<dyn LeaderService>) {
        let _ = self.shared.leader_service.set(service);
    }

    /// The node's metrics, for what the RPC service counts.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Bytes this node's RPC socket moved (Raft, routed writes, chunks:
    /// every member-to-member byte outside gossip).
    pub fn rpc_traffic(&self) -> shoal_mesh::rpc::RpcTraffic {
        self.shared.rpc.traffic()
    }

    pub fn me(&self) -> NodeId {
        self.shared.me
    }

    /// Whether (and why) this node was removed from the cluster.
    pub fn removal(&self) -> &RemovalNotice {
        &self.shared.removal
    }

    /// This node's applied ledger (possibly behind the leader's).
    pub fn read(&self) -> Result<RwLockReadGuard<'_, StateMachineData>, WireError> {
        self.shared
            .state
            .read()
            .map_err(|_| WireError::new(ErrorCode::Internal, "ledger lock poisoned"))
    }

    /// The protocol every member speaks (the ledger's
    /// `effective_protocol`), worked out once per applied entry: every
    /// renewal, relayed renewal and forwarded write asks, and the ledger's
    /// answer walks every member — a cost per call that grew with the pool.
    pub fn effective_protocol(&self) -> Option<u16> {
        let Ok(d) = self.read() else {
            return None;
        };
        self.shared
            .protocol_memo
            .get(d.last_applied, || d.ledger.effective_protocol())
    }

    /// Whether every member speaks `protocol` or later.
    pub fn all_speak(&self, protocol: u16) -> bool {
        self.effective_protocol().is_some_and(|p| p >= protocol)
    }

    pub fn handle(&self) -> LedgerHandle {
        self.shared.state.clone()
    }

    /// The Raft state as this node sees it; changes on every apply.
    pub fn raft_metrics(&self) -> RaftWatch {
        self.shared.raft.metrics()
    }

    /// Wakes on every change of this node's applied index.
    pub fn applied_watch(&self) -> AppliedWatch {
        let rx = self.shared.raft.data_metrics();
        let last = rx.borrow().last_applied;
        AppliedWatch { rx, last }
    }

    pub fn raft(&self) -> &Raft {
        &self.shared.raft
    }

    pub fn name_of(&self, node: NodeId) -> Option<String> {
        self.read()
            .ok()?
            .ledger
            .members
            .get(&node)
            .map(|m| m.spec.name.clone())
    }

    pub fn current_leader(&self) -> Option<NodeId> {
        self.shared.raft.metrics().borrow().current_leader
    }

    pub fn leader(&self) -> Option<(NodeId, SocketAddr)> {
        let m = self.shared.raft.metrics();
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
        let m = self.shared.raft.metrics();
        let m = m.borrow();
        m.current_leader == Some(self.shared.me) && m.state == ServerState::Leader
    }

    /// The voter set as this node knows it.
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.with_membership(|m| m.voter_ids().collect())
    }

    /// The Raft replicas (voters and learners) as this node knows them;
    /// every other member is relayed.
    pub fn replicas(&self) -> BTreeSet<NodeId> {
        self.with_membership(|m| m.nodes().map(|(id, _)| *id).collect())
    }

    /// `read` of this node's effective Raft membership.
    fn with_membership<T>(
        &self,
        read: impl FnOnce(&openraft::Membership<NodeId, BasicNode>) -> T,
    ) -> T {
        read(
            self.shared
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership(),
        )
    }

    /// Sends `req` to member `id` itself (not routed to the leader), at the
    /// RPC address the Raft membership has for it, or for a member outside
    /// the Raft replicas the one its ledger record publishes.
    pub async fn call_member(&self, id: NodeId, req: &Request) -> Result<Response, WireError> {
        let addr = self.member_addr(id)?;
        self.call_at(Some(id), addr, req, self.shared.request_timeout)
            .await
    }

    /// Where member `id` serves RPC, as this node knows it.
    pub fn member_addr(&self, id: NodeId) -> Result<SocketAddr, WireError> {
        let from_raft = self
            .shared
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone());
        let addr = match from_raft {
            Some(a) => a,
            None => self
                .read()?
                .ledger
                .members
                .get(&id)
                .map(|m| m.spec.rpc_addr.clone())
                .ok_or_else(|| {
                    WireError::new(ErrorCode::Invalid, format!("node {id} is not a member"))
                })?,
        };
        addr.parse().map_err(|_| {
            WireError::new(
                ErrorCode::Invalid,
                format!("node {id} has an invalid address '{addr}'"),
            )
        })
    }

    /// Sends `req` to the node at `addr` itself, member `id` when known (a
    /// fault filter judges the link, and a refusal as removed is noted).
    pub async fn call_at(
        &self,
        id: Option<NodeId>,
        addr: SocketAddr,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, WireError> {
        let who = id.map_or_else(|| addr.to_string(), |id| id.to_string());
        if let Some(id) = id {
            self.pass_faults(id, timeout, "node").await?;
        }
        let reply = self
            .shared
            .rpc
            .call(addr, &proto::encode(req), timeout)
            .await
            .map_err(|e| WireError::new(ErrorCode::Unavailable, format!("node {who}: {e}")))?;
        match proto::decode::<Response>(&reply)? {
            Response::Error(e) => {
                self.shared.removal.note_refusal(&who, &e);
                Err(e)
            }
            ok => Ok(ok),
        }
    }

    pub fn request_timeout(&self) -> Duration {
        self.shared.request_timeout
    }

    /// A reader of this node's Raft log.
    pub fn log_reader(&self) -> LogStore {
        self.shared.log.clone()
    }

    /// Sends `req` to the leader (or serves it here when this node leads),
    /// retrying while there is no leader or the leader is unreachable, up to
    /// the request timeout.
    pub async fn route(&self, req: Request) -> Result<Response, WireError> {
        let deadline = Instant::now() + self.shared.request_timeout;
        // An attempt may commit and still fail here (the leader changed or
        // the link broke while it was in flight); its retry carries the same
        // id, so the leader answers it from the record instead of applying
        // it twice.
        let ids_spoken = self.all_speak(shoal_consensus::once::SINCE_PROTOCOL);
        let req = match req {
            write @ (Request::Write(_) | Request::WriteAs { .. }) if ids_spoken => Request::Once {
                nonce: rand::random(),
                req: Box::new(write),
            },
            other => other,
        };
        let body = proto::encode(&req);
        let mut local = Some(req);
        loop {
            let attempt = match self.leader() {
                Some((id, _)) if id == self.shared.me => {
                    let req = match local.take() {
                        Some(r) => r,
                        None => proto::decode(&body)?,
                    };
                    // A leader cut off from its quorum does not know it yet
                    // and would hold the write until the partition heals.
                    let left = deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(100));
                    tokio::time::timeout(left, self.serve_here(req))
                        .await
                        .unwrap_or_else(|_| {
                            Err(WireError::new(
                                ErrorCode::Unavailable,
                                "this node leads but could not commit within the request timeout (no quorum?)",
                            ))
                        })
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

    async fn serve_here(&self, req: Request) -> Result<Response, WireError> {
        let service = self.shared.leader_service.get().and_then(Weak::upgrade);
        match service {
            Some(service) => service.serve(req).await,
            None => Err(WireError::new(
                ErrorCode::Unavailable,
                "the node is still starting",
            )),
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
        let mut metrics = self.shared.raft.metrics();
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
        self.pass_faults(id, budget, "leader").await?;
        tokio::select! {
            r = self.shared.rpc.call(addr, body, budget) => match r {
                Ok(reply) => match proto::decode::<Response>(&reply)? {
                    Response::Error(e) => {
                        self.shared.removal.note_refusal(id, &e);
                        Err(e)
                    }
                    ok => Ok(ok),
                },
                Err(e) => Err(WireError::new(ErrorCode::Unavailable, format!("leader {id} unreachable: {e}"))),
            },
            _ = leader_changed => Err(WireError::new(ErrorCode::NotLeader, format!("node {id} is no longer the leader"))),
        }
    }

    /// Test only: what the fault filters do to a call from this node to
    /// `to` (Raft's channel: a node cut off from its peers reaches them in
    /// no other way either). `role` names `to` in the error.
    async fn pass_faults(&self, to: NodeId, budget: Duration, role: &str) -> Result<(), WireError> {
        let Some(router) = &self.shared.faults else {
            return Ok(());
        };
        let unreachable = |why: &str| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("{role} {to} unreachable: {why}"),
            )
        };
        match router.verdict(Channel::Raft, self.shared.me, to) {
            Verdict::Deliver => Ok(()),
            Verdict::Delay(delay) => {
                tokio::time::sleep(delay.min(budget)).await;
                Ok(())
            }
            Verdict::Drop => {
                tokio::time::sleep(budget.min(RAFT_DROP_WAIT_MAX)).await;
                Err(unreachable("request dropped by a fault filter"))
            }
            Verdict::Cut => Err(unreachable("link cut by a fault filter")),
        }
    }

    /// A write through the leader (forwarded when this node is not it).
    pub async fn write(&self, cmd: Command) -> Result<(LedgerResponse, u64), WireError> {
        match self.route(Request::Write(cmd)).await? {
            Response::Write { response, index } => Ok((response, index)),
            _ => Err(unexpected("a write")),
        }
    }

    /// A user's write through the leader, which checks `token` and applies
    /// `cmd` as far as its holder may.
    pub async fn write_as(
        &self,
        token: &UserToken,
        cmd: Command,
    ) -> Result<(LedgerResponse, u64), WireError> {
        let req = Request::WriteAs {
            token: token.clone(),
            cmd,
        };
        match self.route(req).await? {
            Response::Write { response, index } => Ok((response, index)),
            _ => Err(unexpected("a write")),
        }
    }

    /// Proposes on this node, which must be the leader. The leader stamps the
    /// time (DESIGN invariant 7); concurrent writes share one log entry.
    pub async fn write_local(&self, cmd: Command) -> Result<(LedgerResponse, u64), WireError> {
        if self.is_stepping_down() {
            return Err(WireError::new(
                ErrorCode::NotLeader,
                format!(
                    "node {} is stopping and hands its leadership over; retry",
                    self.shared.me
                ),
            ));
        }
        let started = Instant::now();
        let out = self.shared.batcher.propose(cmd).await;
        if out.is_ok() {
            self.shared.metrics.observe_proposal(started.elapsed());
        }
        out
    }

    /// From now on this node proposes nothing: it is handing its leadership
    /// over on a graceful stop.
    pub fn stop_proposing(&self) {
        self.shared
            .stepping_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_stepping_down(&self) -> bool {
        self.shared
            .stepping_down
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Confirms with a quorum that this node still leads, so a read of its
    /// ledger that follows is linearizable; returns the read index (applied
    /// here by then).
    pub async fn ensure_linearizable(&self) -> Result<u64, WireError> {
        match self.shared.raft.ensure_linearizable().await {
            Ok(read) => Ok(read.map(|l| l.index).unwrap_or(0)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))) => {
                Err(WireError::new(
                    ErrorCode::NotLeader,
                    format!("node {} is not the leader", self.shared.me),
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

    /// On the leader: a read index confirmed by a ReadIndex round that
    /// started after this call, shared with the reads asked for meanwhile
    /// ([`ReadRounds`]).
    pub async fn shared_read_index(&self) -> Result<u64, WireError> {
        let client = self.clone();
        self.shared
            .read_rounds
            .read(move || {
                let client = client.clone();
                async move { client.ensure_linearizable().await }
            })
            .await
    }

    /// Renews this node's lease on the leader: a sign of life for the
    /// leader's failure detector, answered with the index this node must
    /// apply before its ledger counts as current. Towards a cluster of
    /// which some member does not speak protocol 7 yet, a status query
    /// (confirmed the same way, one round per query) instead.
    pub async fn renew(&self) -> Result<u64, WireError> {
        let renews = self.all_speak(proto::RENEW_SINCE_PROTOCOL);
        let read_index = if renews {
            match self.renew_through_relay().await {
                Some(read_index) => {
                    self.shared.metrics.count_lease_renewal("relay");
                    read_index
                }
                None => match self.route(Request::Renew).await? {
                    Response::Renewed { read_index } => {
                        self.shared.metrics.count_lease_renewal("leader");
                        read_index
                    }
                    _ => return Err(unexpected("a renewal")),
                },
            }
        } else {
            self.status().await?.commit_index
        };
        let before = self
            .shared
            .renewed_index
            .fetch_max(read_index, std::sync::atomic::Ordering::Relaxed);
        if read_index > before {
            self.shared.renewed_index_rose.notify_waiters();
        }
        *self
            .shared
            .last_renewed
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        Ok(read_index)
    }

    /// A renewal through the replica this node follows the log from, once
    /// every member speaks protocol 8; `None` when there is none or it did
    /// not answer (the renewal then goes straight to the leader).
    async fn renew_through_relay(&self) -> Option<u64> {
        let relay = *self.shared.relay.lock().unwrap_or_else(|p| p.into_inner());
        let (id, addr) = relay?;
        if !self.all_speak(shoal_consensus::replicas::SINCE_PROTOCOL) {
            return None;
        }
        // Short: the fence needs a renewal within its 2.5 s, and the
        // leader is still there to ask.
        match self
            .call_at(Some(id), addr, &Request::Renew, RELAYED_RENEWAL_TIMEOUT)
            .await
        {
            Ok(Response::Renewed { read_index }) => Some(read_index),
            _ => {
                // Straight to the leader until the log follower finds a
                // relay that answers again.
                self.set_relay(None);
                None
            }
        }
    }

    /// Records the replica this node follows the log from (`None`: none,
    /// or this node is a replica itself).
    pub fn set_relay(&self, relay: Option<(NodeId, SocketAddr)>) {
        *self.shared.relay.lock().unwrap_or_else(|p| p.into_inner()) = relay;
    }

    /// On a replica: renews `member`'s lease on the leader together with
    /// the other members that renew through this replica (one
    /// `Request::RenewFor` per round, rounds at most every
    /// [`read_rounds::ROUND_SPACING`](super::read_rounds::ROUND_SPACING)).
    /// The leader's read index answers every renewal of the round: its
    /// round starts after this replica's call, which starts after the
    /// member asked.
    pub async fn renew_for(&self, member: NodeId) -> Result<u64, WireError> {
        let pending = &self.shared.relayed_renewals;
        pending
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(member);
        let client = self.clone();
        let members = pending.members.clone();
        pending
            .rounds
            .read(move || {
                let client = client.clone();
                let members: Vec<NodeId> =
                    std::mem::take(&mut *members.lock().unwrap_or_else(|p| p.into_inner()))
                        .into_iter()
                        .collect();
                async move {
                    match client.route(Request::RenewFor { members }).await? {
                        Response::Renewed { read_index } => Ok(read_index),
                        _ => Err(unexpected("a relayed renewal")),
                    }
                }
            })
            .await
    }

    /// The highest read index a renewal of this node's lease was answered
    /// with: what the leader had committed not long ago, so a ledger that
    /// stays behind it is not being fed.
    pub fn renewed_index(&self) -> u64 {
        self.shared
            .renewed_index
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Returns once [`LedgerClient::renewed_index`] is above `index`: at
    /// once if it is, else when a renewal raises it there.
    pub async fn renewed_index_above(&self, index: u64) {
        loop {
            let rose = self.shared.renewed_index_rose.notified();
            tokio::pin!(rose);
            // Registered before the look, so a rise between the look and
            // the wait still wakes it.
            rose.as_mut().enable();
            if self.renewed_index() > index {
                return;
            }
            rose.await;
        }
    }

    /// When a renewal of this node's lease was last answered: a member
    /// that left would have been refused.
    pub fn last_renewed(&self) -> Option<Instant> {
        *self
            .shared
            .last_renewed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A read of the ledger on the leader (linearizable).
    pub async fn query(&self, q: Query) -> Result<Response, WireError> {
        self.route(Request::Query(q)).await
    }

    pub async fn status(&self) -> Result<StatusResponse, WireError> {
        match self.query(Query::Status).await? {
            Response::Status(s) => Ok(s),
            _ => Err(unexpected("a status query")),
        }
    }

    pub async fn nodes(&self) -> Result<Vec<NodeInfo>, WireError> {
        match self.query(Query::Nodes).await? {
            Response::Nodes(n) => Ok(n),
            _ => Err(unexpected("a nodes query")),
        }
    }

    pub async fn attrs(&self, prefix: String) -> Result<BTreeMap<String, String>, WireError> {
        match self.query(Query::Attrs { prefix }).await? {
            Response::Attrs(a) => Ok(a),
            _ => Err(unexpected("an attribute query")),
        }
    }

    /// Removes member `id`: by an admin's `token`, or (`None`) this node
    /// leaving on its own.
    pub async fn remove_member(
        &self,
        id: NodeId,
        token: Option<UserToken>,
    ) -> Result<u64, WireError> {
        match self.route(Request::RemoveMember { id, token }).await? {
            Response::Write { index, .. } => Ok(index),
            _ => Err(unexpected("a removal")),
        }
    }

    /// `change_membership`, retried while another membership change (the
    /// housekeeping loop's) is still in flight.
    pub async fn change_membership(
        &self,
        changes: ChangeMembers<NodeId, BasicNode>,
        retain: bool,
    ) -> Result<(), WireError> {
        let deadline = Instant::now() + self.shared.request_timeout;
        loop {
            match self
                .shared
                .raft
                .change_membership(changes.clone(), retain)
                .await
            {
                Ok(_) => return Ok(()),
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                    ChangeMembershipError::InProgress(_),
                ))) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                    return Err(WireError::new(
                        ErrorCode::NotLeader,
                        format!("node {} is not the leader", self.shared.me),
                    ))
                }
                Err(e) => return Err(raft_wire_error(e)),
            }
        }
    }

    /// Adds `id` to Raft as a learner (non-blocking: it catches up later).
    pub async fn add_learner(&self, id: NodeId, rpc_addr: String) -> Result<(), WireError> {
        self.shared
            .raft
            .add_learner(id, BasicNode::new(rpc_addr), false)
            .await
            .map(|_| ())
            .map_err(raft_wire_error)
    }
}

fn unexpected(what: &str) -> WireError {
    WireError::new(ErrorCode::Internal, format!("unexpected answer to {what}"))
}

pub fn raft_wire_error<E: std::fmt::Display>(e: RaftError<NodeId, E>) -> WireError {
    match e {
        RaftError::Fatal(f) => {
            WireError::new(ErrorCode::Unavailable, format!("raft has stopped: {f}"))
        }
        RaftError::APIError(e) => WireError::new(ErrorCode::Internal, e.to_string()),
    }
}
