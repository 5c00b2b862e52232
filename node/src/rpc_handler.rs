//! The node's side of mesh RPC: every request a peer sends (Raft messages,
//! chunks, forwarded writes and queries, joins) and, on the leader, the
//! requests other nodes route to it.

use crate::gpu::Gpus;
use crate::ledger_client::client::LeaderService;
use crate::ledger_client::LedgerClient;
use crate::peers::SharedPeerView;
use crate::proto::{self, ErrorCode, JoinRequest, Request, Response, UserToken, WireError};
use crate::rpc::chunks::ChunkNet;
use crate::trust::auth;
use crate::views::{self, Seen};
use futures::future::BoxFuture;
use shoal_consensus::events::{EventSpec, Severity};
use shoal_consensus::network::{RaftRpc, RaftRpcReply};
use shoal_consensus::once::WriteId;
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
    /// How this node signs certificates while it leads.
    signing: auth::Signing,
    /// Which voters answer this node's Raft RPCs, for the removal check.
    contacts: VoterContacts,
}

/// When each peer last answered this node's Raft RPCs, and how recent an
/// answer must be for its voter to count as present.
#[derive(Clone)]
pub struct VoterContacts {
    pub tracker: shoal_consensus::network::ContactTracker,
    pub within: std::time::Duration,
}

impl NodeService {
    pub fn new(
        ledger: LedgerClient,
        chunks: ChunkNet,
        peers: SharedPeerView,
        gpus: Gpus,
        signing: auth::Signing,
        contacts: VoterContacts,
    ) -> Self {
        NodeService {
            ledger,
            chunks,
            peers,
            gpus,
            signing,
            contacts,
        }
    }

    async fn serve_rpc(self: &Arc<Self>, peer: PeerInfo, req: Request) -> Response {
        self.ledger.metrics().count_rpc_request(req.kind());
        let member = match (peer.authenticated, peer.member) {
            (true, Some(member)) => member,
            _ => {
                let result = match req {
                    Request::Join(j) => self.ledger.route(Request::Join(j)).await,
                    _ => Err(WireError::new(
                        ErrorCode::Unauthenticated,
                        "this request needs a member certificate signed by the cluster CA",
                    )),
                };
                return result.unwrap_or_else(Response::Error);
            }
        };
        // A node leaving (or removed) still asks whether another holds the CA
        // key, so that it can delete its own copy: a yes or no, nothing more.
        if matches!(req, Request::HoldsCaKey) {
            return Response::Holds(self.holds_ca_key());
        }
        // A removed node's certificate is refused as soon as this node has
        // applied the removal, whatever its expiry says.
        if self.has_left(member) {
            let why = format!(
                "node {member} has left the cluster; its certificate is no longer accepted"
            );
            self.audit(format!("refused a request: {why}"));
            return Response::Error(WireError::new(ErrorCode::Removed, why));
        }
        let result = match req {
            Request::Raft(rpc) => match self.authorize_raft(member, &rpc) {
                Ok(()) => Ok(Response::Raft(self.serve_raft(rpc).await)),
                Err(e) => Err(e),
            },
            Request::FetchCaKey { fingerprint } => self.hand_over_ca_key(member, &fingerprint),
            Request::FetchPeerSecret { region } => Ok(self.hand_over_peer_secret(member, &region)),
            // A certificate for the caller itself, never for the id it wrote.
            Request::RenewCertificate { csr_pem, .. } => {
                self.serve_as_leader(Request::RenewCertificate { member, csr_pem })
                    .await
            }
            // What a member proposes on its own is applied only as far as it
            // is about that member (decided at commit).
            Request::Write(cmd) => {
                self.serve_as_leader(Request::Write(Command::AsNode {
                    node: member,
                    cmd: Box::new(cmd),
                }))
                .await
            }
            // The id's origin is the member that sent it, whatever it wrote.
            Request::Once { nonce, req } => match *req {
                Request::Write(cmd) => {
                    let cmd = Command::AsNode {
                        node: member,
                        cmd: Box::new(cmd),
                    };
                    self.serve_write(
                        Some(WriteId {
                            origin: member,
                            nonce,
                        }),
                        Request::Write(cmd),
                    )
                    .await
                }
                req @ Request::WriteAs { .. } => {
                    self.serve_write(
                        Some(WriteId {
                            origin: member,
                            nonce,
                        }),
                        req,
                    )
                    .await
                }
                _ => Err(WireError::new(
                    ErrorCode::Invalid,
                    "only writes carry a write id",
                )),
            },
            Request::RemoveMember { id, token: None } if id != member => {
                self.audit(format!(
                    "refused a request from member {member}: it may remove only itself, not node {id}"
                ));
                Err(WireError::new(
                    ErrorCode::Forbidden,
                    format!("member {member} may remove only itself; removing node {id} needs an admin token"),
                ))
            }
            Request::Chunk(req) => {
                let chunks = self.chunks.clone();
                let handle = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || chunks.serve(&handle, req))
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))
            }
            Request::GpuTelemetry => Ok(Response::GpuTelemetry(crate::gpu_relay::own_gpus(
                &self.gpus.latest(),
            ))),
            Request::ElectNow => self.elect_now(member).await,
            Request::StillMember => Ok(Response::Holds(true)),
            Request::Renew => self.renew_lease(member).await,
            Request::RenewFor { members } => self.renew_leases_for(member, members).await,
            Request::FollowLog { after, wait_ms } => {
                self.ledger
                    .serve_log(
                        member,
                        after,
                        std::time::Duration::from_millis(u64::from(wait_ms)),
                    )
                    .await
            }
            other => self.serve_as_leader(other).await,
        };
        result.unwrap_or_else(Response::Error)
    }

    /// A member's lease renewal: a sign of life for this leader's failure
    /// detector (the certificate names the member, whatever it wrote), then
    /// a read index from a round shared with the other renewals. On a Raft
    /// replica that is not the leader: passed on with the others of its
    /// round (`Request::RenewFor`), for the members it relays the log to.
    async fn renew_lease(&self, member: NodeId) -> Result<Response, WireError> {
        if !self.ledger.is_leader() {
            if self.is_replica(self.ledger.me()) && self.relays_renewals() {
                let read_index = self.ledger.renew_for(member).await?;
                return Ok(Response::Renewed { read_index });
            }
            return Err(WireError::new(ErrorCode::NotLeader, "not the leader"));
        }
        if let Ok(mut peers) = self.peers.lock() {
            peers.heard(member, std::time::Instant::now());
        }
        let read_index = self.ledger.shared_read_index().await?;
        Ok(Response::Renewed { read_index })
    }

    /// The leases of `members`, renewed through replica `relay`: signs of
    /// life for this leader's detector, taken only from a replica this
    /// leader's membership names (it chose them; any other member's word
    /// for others is refused), and only for members of the ledger that have
    /// not left.
    async fn renew_leases_for(
        &self,
        relay: NodeId,
        members: Vec<NodeId>,
    ) -> Result<Response, WireError> {
        if !self.ledger.is_leader() {
            return Err(WireError::new(ErrorCode::NotLeader, "not the leader"));
        }
        if !self.is_replica(relay) {
            let why =
                format!("member {relay} is not a Raft replica and may not renew others' leases");
            self.audit(format!("refused a request: {why}"));
            return Err(WireError::new(ErrorCode::Forbidden, why));
        }
        self.mark_heard(&members);
        let read_index = self.ledger.shared_read_index().await?;
        Ok(Response::Renewed { read_index })
    }

    /// Counts a renewal of each of `members` (of this ledger, not left) as
    /// a sign of life now.
    fn mark_heard(&self, members: &[NodeId]) {
        let known: Vec<NodeId> = match self.ledger.read() {
            Ok(d) => members
                .iter()
                .copied()
                .filter(|m| {
                    d.ledger
                        .members
                        .get(m)
                        .is_some_and(|r| r.state != MemberState::Left)
                })
                .collect(),
            Err(_) => return,
        };
        if let Ok(mut peers) = self.peers.lock() {
            let now = std::time::Instant::now();
            for m in known {
                peers.heard(m, now);
            }
        }
    }

    /// Whether this node's membership has `member` in Raft (a voter or a
    /// learner).
    fn is_replica(&self, member: NodeId) -> bool {
        self.ledger
            .raft_metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&member)
            .is_some()
    }

    /// Whether every member speaks the protocol of relayed renewals.
    fn relays_renewals(&self) -> bool {
        self.ledger
            .all_speak(shoal_consensus::replicas::SINCE_PROTOCOL)
    }

    /// A stopping leader hands its leadership over: this voter stands for
    /// election at once instead of after its own timeout. Only the leader
    /// this node follows may ask (a member's certificate says who it is,
    /// not that it leads); the election itself is judged by the voters as
    /// any other.
    async fn elect_now(&self, member: NodeId) -> Result<Response, WireError> {
        if self.ledger.current_leader() != Some(member) {
            let why = format!("member {member} asked for an election but is not the leader here");
            self.audit(format!("refused a request: {why}"));
            return Err(WireError::new(ErrorCode::Forbidden, why));
        }
        self.ledger.raft().trigger().elect().await.map_err(|e| {
            WireError::new(ErrorCode::Unavailable, format!("raft has stopped: {e}"))
        })?;
        tracing::info!(
            from = member,
            "standing for election: the leader is stopping"
        );
        Ok(Response::Holds(true))
    }

    /// A Raft message speaks for the node in its vote (the candidate, or the
    /// leader that sends entries and snapshots): only that node's own
    /// certificate may carry it, never a learner's (one that has left is
    /// refused before this).
    /// A member unknown to this node's ledger is let through: this node may
    /// lag behind the membership (a new leader it has not heard of yet), and
    /// only the cluster CA issues member certificates.
    fn authorize_raft(&self, member: NodeId, rpc: &RaftRpc) -> Result<(), WireError> {
        let claimed = match rpc {
            RaftRpc::AppendEntries(r) => r.vote.leader_id().voted_for(),
            RaftRpc::Vote(r) => r.vote.leader_id().voted_for(),
            RaftRpc::InstallSnapshot(r) => r.vote.leader_id().voted_for(),
        };
        let why = if claimed != Some(member) {
            format!(
                "member {member} sent a Raft message in the name of node {}",
                claimed.map_or_else(|| "?".to_string(), |c| c.to_string())
            )
        } else if !self.is_voter(member) && self.is_voter(self.ledger.me()) {
            // Only voters campaign and lead. A learner, or a member outside
            // Raft that follows the log from a replica, that claims to would
            // bypass every check on what members may propose. Only a voter
            // judges: a node that is no voter in its own view may hold a
            // stale one (a snapshot taken before the sender was promoted,
            // the first thing a joining node receives) and would refuse
            // its real leader for good; it decides nothing the cluster
            // commits, and follows whoever leads.
            format!(
                "member {member} is not a voter here (a learner or a relayed member) and may not campaign or lead"
            )
        } else {
            return Ok(());
        };
        self.audit(format!("refused a Raft message: {why}"));
        Err(WireError::new(ErrorCode::Forbidden, why))
    }

    /// Whether this node's membership has `member` as a voter. A member
    /// promoted in an entry this voter has not received yet is refused
    /// until it does: this voter then starts an election itself, and
    /// catches up from whichever voter it knows wins.
    fn is_voter(&self, member: NodeId) -> bool {
        self.ledger
            .raft_metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == member)
    }

    /// Whether this node's ledger says `member` was removed. A member it
    /// does not know yet is not refused: see [`Self::authorize_raft`].
    fn has_left(&self, member: NodeId) -> bool {
        self.ledger.read().is_ok_and(|d| {
            d.ledger
                .members
                .get(&member)
                .is_some_and(|m| m.state == MemberState::Left)
        })
    }

    /// Whether this node holds the key of every CA its ledger trusts.
    fn holds_ca_key(&self) -> bool {
        let trusted = match self.ledger.read() {
            Ok(d) => d.ledger.trusted_ca_pems(),
            Err(_) => return false,
        };
        !trusted.is_empty()
            && trusted
                .iter()
                .all(|cert| crate::trust::ca_key::key_for(&self.signing.data_dir, cert).is_some())
    }

    /// The key of the trusted CA with certificate `fingerprint`, to a
    /// current voter that was admitted as one only (a learner never gets
    /// one, whatever the Raft membership says).
    fn hand_over_ca_key(&self, member: NodeId, fingerprint: &str) -> Result<Response, WireError> {
        let eligible = self
            .ledger
            .read()
            .is_ok_and(|d| d.ledger.voter_eligibility.eligible(member));
        if !eligible || !self.ledger.voters().contains(&member) {
            let why = format!("node {member} asked for the CA key but is not a voter");
            self.audit(format!("refused a request: {why}"));
            return Err(WireError::new(ErrorCode::Forbidden, why));
        }
        let cert = self.ledger.read().ok().and_then(|d| {
            d.ledger.trusted_ca_pems().into_iter().find(|c| {
                shoal_mesh::tls::fingerprint_pem(c)
                    .is_some_and(|f| f.eq_ignore_ascii_case(fingerprint))
            })
        });
        let key = cert
            .and_then(|c| crate::trust::ca_key::key_for(&self.signing.data_dir, &c))
            .map(UserToken);
        if key.is_some() {
            tracing::info!(node = member, ca = %shoal_consensus::ca::short(fingerprint), "handed a CA key to a voter");
        }
        Ok(Response::CaKey(key))
    }

    /// The secret this region presents to peer `region`, for `member`, a
    /// current member (every member calls the peers; one that has left is
    /// refused before this), as the ledger's hash names it.
    fn hand_over_peer_secret(&self, member: NodeId, region: &str) -> Response {
        let peer = self.ledger.read().ok().and_then(|d| {
            // A node this one has not heard of yet asks again later.
            let current = d
                .ledger
                .members
                .get(&member)
                .is_some_and(|m| m.state != MemberState::Left);
            current
                .then(|| d.ledger.federation.peers.get(region).cloned())
                .flatten()
        });
        let secret = peer
            .and_then(|p| crate::federation::secrets::load(&self.signing.data_dir, &p))
            .map(UserToken);
        if secret.is_some() {
            tracing::info!(node = member, %region, "handed a peer region's secret to a member");
        }
        Response::PeerSecret(secret)
    }

    /// Records a refusal as an audit event, in the background.
    fn audit(&self, message: String) {
        tracing::warn!("{message}");
        let spec = EventSpec {
            severity: Severity::Warning,
            kind: shoal_consensus::events::AUDIT.into(),
            node: Some(self.ledger.me()),
            gpu: None,
            job: None,
            resource: None,
            message,
        };
        let ledger = self.ledger.clone();
        tokio::spawn(async move {
            let _ = ledger.write(Command::RecordEvent(spec)).await;
        });
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

    /// A write, applied once per id when it has one: `Write`'s command as
    /// it is, `WriteAs`'s as far as its token's holder may.
    async fn serve_write(&self, id: Option<WriteId>, req: Request) -> Result<Response, WireError> {
        let cmd = match req {
            Request::Write(cmd) => cmd,
            Request::WriteAs { token, cmd } => {
                let caller = self.user(&token)?;
                let region = self
                    .ledger
                    .read()
                    .ok()
                    .and_then(|d| auth::peer_region(&d.ledger, &caller));
                if let Some(region) = region {
                    let shared = |tenant: &str| {
                        self.ledger
                            .read()
                            .is_ok_and(|d| d.ledger.global_tenant_id(tenant).is_some())
                    };
                    if let Err(why) = auth::peer_may_propose(&region, &cmd, shared) {
                        self.audit(format!("refused a write: {why}"));
                        return Err(WireError::new(ErrorCode::Forbidden, why));
                    }
                }
                caller.scoped(cmd)
            }
            _ => return Err(WireError::new(ErrorCode::Invalid, "not a write")),
        };
        let cmd = match id {
            Some(id) => Command::Once {
                id,
                cmd: Box::new(cmd),
            },
            None => cmd,
        };
        let (response, index) = self.ledger.write_local(cmd).await?;
        Ok(Response::Write { response, index })
    }

    async fn serve_as_leader(&self, req: Request) -> Result<Response, WireError> {
        match req {
            req @ (Request::Write(_) | Request::WriteAs { .. }) => {
                self.serve_write(None, req).await
            }
            // This node's own write, routed to itself as the leader.
            Request::Once { nonce, req } => {
                let id = WriteId {
                    origin: self.ledger.me(),
                    nonce,
                };
                self.serve_write(Some(id), *req).await
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
            Request::RenewCertificate { member, csr_pem } => {
                if !self.ledger.is_leader() {
                    return Err(WireError::new(ErrorCode::NotLeader, "not the leader"));
                }
                auth::renew(&self.ledger, member, &csr_pem, &self.signing)
                    .map(Response::Certificate)
            }
            Request::RemoveMember { id, token } => {
                if let Some(token) = token {
                    let caller = self.user(&token)?;
                    self.refuse_peer(&caller, "remove a node")?;
                    if let Some(tenant) = caller.tenant {
                        return Err(WireError::new(
                            ErrorCode::Forbidden,
                            format!("permission denied: removing a node needs an admin token; token '{}' is for tenant '{tenant}'", caller.name),
                        ));
                    }
                }
                self.remove_local(id).await
            }
            Request::RotateCa { token } => {
                let caller = self.user(&token)?;
                self.refuse_peer(&caller, "rotate the cluster CA")?;
                let r =
                    crate::trust::ca_rotation::start(&self.ledger, &caller, &self.signing).await?;
                Ok(Response::CaRotated {
                    index: r.index,
                    old_fingerprint: r.old_fingerprint,
                    new_fingerprint: r.new_fingerprint,
                })
            }
            Request::FetchPeerSecret { .. } => Err(WireError::new(
                ErrorCode::Invalid,
                "a peer region's secret is served by the node asked, not routed",
            )),
            Request::HoldsCaKey | Request::FetchCaKey { .. } => Err(WireError::new(
                ErrorCode::Invalid,
                "CA key requests are served by the node asked, not routed",
            )),
            Request::GpuTelemetry => Err(WireError::new(
                ErrorCode::Invalid,
                "GPU samples are served by the node asked, not routed",
            )),
            Request::ElectNow => Err(WireError::new(
                ErrorCode::Invalid,
                "an election request is served by the node asked, not routed",
            )),
            Request::StillMember => Err(WireError::new(
                ErrorCode::Invalid,
                "a membership probe is served by the node asked, not routed",
            )),
            Request::FollowLog { .. } => Err(WireError::new(
                ErrorCode::Invalid,
                "the log is served by the node asked, not routed",
            )),
            // The leader's own renewal, routed to itself.
            Request::Renew => Ok(Response::Renewed {
                read_index: self.ledger.shared_read_index().await?,
            }),
            // A replica's batch, routed to itself after it became leader:
            // only this node's own route gets here (a member's is served
            // by `renew_leases_for`).
            Request::RenewFor { members } => {
                self.mark_heard(&members);
                Ok(Response::Renewed {
                    read_index: self.ledger.shared_read_index().await?,
                })
            }
            Request::Raft(_) | Request::Chunk(_) => Err(WireError::new(
                ErrorCode::Invalid,
                "Raft and chunk RPCs are not routed",
            )),
        }
    }

    /// The holder of a user's token, as the leader's (current) ledger knows it.
    /// A peer region's credential acts only through `WriteAs`, as far as
    /// [`auth::peer_may_propose`] lets it: never on the leader's other
    /// token-carrying requests.
    fn refuse_peer(&self, caller: &auth::Caller, what: &str) -> Result<(), WireError> {
        let region = self
            .ledger
            .read()
            .ok()
            .and_then(|d| auth::peer_region(&d.ledger, caller));
        match region {
            None => Ok(()),
            Some(region) => {
                let why = format!("permission denied: region {region}'s credential may not {what}");
                self.audit(format!("refused a request: {why}"));
                Err(WireError::new(ErrorCode::Forbidden, why))
            }
        }
    }

    fn user(&self, token: &UserToken) -> Result<auth::Caller, WireError> {
        auth::resolve(&self.ledger, &token.0).map_err(|e| {
            let message = match e {
                auth::TokenError::Unknown => "the API token is not known to the leader".into(),
                auth::TokenError::Refused(m) => m,
            };
            WireError::new(ErrorCode::Unauthenticated, message)
        })
    }

    async fn admit(&self, j: JoinRequest) -> Result<Response, WireError> {
        auth::admit(&self.ledger, j, &self.signing)
            .await
            .map(Response::Join)
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
        let me = self.ledger.me();
        let voters = self.ledger.voters();
        let answering: std::collections::BTreeSet<NodeId> = voters
            .iter()
            .copied()
            .filter(|v| {
                *v == me
                    || self
                        .contacts
                        .tracker
                        .last_contact(*v)
                        .is_some_and(|at| at.elapsed() <= self.contacts.within)
            })
            .collect();
        if let Err(risk) = shoal_consensus::voters::removal_keeps_a_quorum(&voters, id, &answering)
        {
            return Err(WireError::new(
                ErrorCode::Rejected,
                format!("node {id} cannot be removed now: {risk}; bring those voters back, or remove a lost one first"),
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
