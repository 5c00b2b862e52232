//! The ledger state machine. `apply` is a pure function of the state and the
//! command: no clock reads, no randomness, no I/O. Time enters as `now_ms`,
//! stamped by the leader when it proposes the command (DESIGN invariant 7), so
//! every replica computes the same result.

use serde::{Deserialize, Serialize};
use shoal_sdk::{GpuInfo, MemberState};
use std::collections::BTreeMap;

use crate::types::NodeId;
use crate::workload::{CkptPart, JobId, JobSpec, Plan, TenantLimits, TenantUpdate, Workload};

/// Cluster-wide facts fixed at bootstrap.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ClusterInfo {
    pub cluster_id: String,
    pub region: String,
    /// The certificate of the cluster CA that signs: joiners' and renewed
    /// certificates, and what new join tokens pin. During a rotation
    /// ([`crate::ca`]) the cluster trusts another CA too. Private keys are
    /// not in the ledger: only voters hold them, on disk, and hand them to
    /// each other over mTLS (see the node's `ca_custody`), so a learner's
    /// disk never has one.
    pub ca_cert_pem: String,
    pub created_at_ms: u64,
}

impl MemberSpec {
    /// The protocol versions the member speaks, `(min, max)`.
    pub fn protocol(&self) -> (u16, u16) {
        let min = self.protocol_min.max(1);
        (min, self.protocol_max.max(min))
    }

    /// The URL of the member's API.
    pub fn api_url(&self) -> String {
        let scheme = if self.api_tls { "https" } else { "http" };
        format!("{scheme}://{}", self.api_addr)
    }
}

/// [`Command::SetGpuFault`]'s fault; the ledger stamps the time.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GpuFaultReport {
    pub reason: String,
    pub detected: bool,
}

/// What a node tells the cluster about itself. `Default` is a base for
/// struct-update literals in tests.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberSpec {
    pub name: String,
    pub rpc_addr: String,
    pub api_addr: String,
    /// Whether the API at `api_addr` is HTTPS (with the node's cluster
    /// certificate); plain HTTP is served on loopback addresses only.
    pub api_tls: bool,
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<GpuInfo>,
    /// libp2p identity and QUIC multiaddr of the node's gossip endpoint;
    /// only messages signed by the peer ids recorded here are accepted.
    pub gossip_peer_id: String,
    pub gossip_addr: String,
    /// How the node fences its ranks' resources: `cgroup` (a cgroup v2
    /// per rank) or `none`.
    pub isolation: String,
    /// The cgroup controllers it enforces for ranks (`memory`, `cpu`,
    /// `pids`, and `devices` for the GPU device fence); empty under
    /// `cgroup`: accounting and kill only.
    pub isolation_controllers: Vec<String>,
    /// The release the node runs (its crate version).
    pub version: String,
    /// The protocol versions it speaks, both ends included (`shoal_mesh::
    /// protocol`); 0 means not recorded, read as version 1 (what every
    /// release before the range was recorded spoke).
    pub protocol_min: u16,
    pub protocol_max: u16,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    pub spec: MemberSpec,
    pub state: MemberState,
    pub joined_at_ms: u64,
    pub state_since_ms: u64,
}

pub use crate::tokens::{ApiToken, JoinToken};

/// A command with the leader's timestamp.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LedgerRequest {
    pub now_ms: u64,
    pub cmd: Command,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// First command of a cluster: its identity, CA, admin token and first member.
    Bootstrap {
        cluster_id: String,
        region: String,
        ca_cert_pem: String,
        admin_token_hash: String,
        first_member: NodeId,
        spec: MemberSpec,
    },
    /// Admits a node that proved a join token; the answer is its new id.
    AddMember {
        spec: MemberSpec,
        token_hash: String,
    },
    /// A member restarted with new addresses, labels or inventory.
    UpdateMember {
        id: NodeId,
        spec: MemberSpec,
    },
    SetMemberState {
        id: NodeId,
        state: MemberState,
    },
    /// A join token (the hash of its secret) good for `uses` joins until
    /// `expires_at_ms` ([`crate::tokens`]).
    CreateJoinToken {
        hash: String,
        expires_at_ms: u64,
        uses: u32,
    },
    /// `shoal token revoke ID`: joins with it are refused from now on.
    RevokeJoinToken {
        id: String,
    },
    CreateApiToken {
        hash: String,
        name: String,
        tenant: Option<String>,
        /// `None`: until revoked.
        expires_at_ms: Option<u64>,
    },
    /// `shoal token api revoke ID`: by public id or name.
    RevokeApiToken {
        id: String,
    },
    /// Gives the API token `name` a new secret (`hash`); the old secret
    /// stops working with this entry (`shoal token api rotate-admin`).
    RotateApiToken {
        name: String,
        hash: String,
    },
    /// A member saw the API token `id` used; sent at most once a minute per
    /// token by each member, never per request.
    TouchApiToken {
        id: String,
    },
    /// A small cluster attribute (operator annotations; the ledger benchmark's unit of write).
    PutAttr {
        key: String,
        value: String,
    },
    /// Creates a tenant (team, project) under an optional parent.
    CreateTenant {
        name: String,
        limits: TenantLimits,
    },
    UpdateTenant {
        name: String,
        update: TenantUpdate,
    },
    /// Admits a job as pending; the answer is its id.
    SubmitJob {
        spec: JobSpec,
    },
    CancelJob {
        job: JobId,
    },
    /// A scheduling pass's decisions, re-validated on apply; the entry's
    /// log index becomes the epoch of every allocation it creates.
    Schedule(Plan),
    /// A rank's process ended (reported by the agent that ran it).
    RankExited {
        job: JobId,
        epoch: u64,
        rank: u32,
        exit_code: i32,
        /// How it ended: exited, OOM-killed, or lost with its agent.
        end: crate::workload::RankEnd,
    },
    /// A rank's part of checkpoint `step` is stored locally and replicated;
    /// the step is committed once every rank of the epoch has recorded its part.
    CheckpointPart {
        job: JobId,
        epoch: u64,
        rank: u32,
        step: u64,
        part: CkptPart,
    },
    /// An anomaly or state change for the event log (de-duplicated in apply).
    RecordEvent(crate::events::EventSpec),
    /// `shoal cp` into `mesh:/`: the object's chunks are already on its holders.
    PutObject {
        object: crate::namespace::MeshObject,
        replace: bool,
    },
    RemoveObject {
        path: String,
    },
    SetObjectHolders {
        path: String,
        holders: Vec<NodeId>,
    },
    /// `shoal drain` / `shoal undrain`.
    SetDrain {
        id: NodeId,
        drain: bool,
    },
    /// A node reports a faulty GPU of its own (`detected`), or an operator
    /// drains one (`shoal gpu drain`) or returns it to service (`None`,
    /// `shoal gpu undrain`).
    SetGpuFault {
        node: NodeId,
        gpu: u32,
        fault: Option<GpuFaultReport>,
    },
    /// A holder re-replicated a committed part after holders were lost.
    SetCheckpointHolders {
        job: JobId,
        step: u64,
        rank: u32,
        holders: Vec<NodeId>,
    },
    /// The leader frees a stopping job whose ranks never reported back.
    ReleaseJob {
        job: JobId,
        epoch: u64,
    },
    /// Several commands proposed as one log entry. The leader batches
    /// concurrent writes so that one fsync and one replication round trip
    /// commit all of them; each command keeps its own answer.
    Batch(Vec<Command>),
    /// A command sent with a tenant-scoped API token: applied only if that
    /// tenant may (checked at commit, [`crate::access::authorize`]).
    AsTenant {
        tenant: String,
        cmd: Box<Command>,
    },
    /// A command a member node forwarded on its own authority (no user
    /// token): applied only if it is about that node
    /// ([`crate::node_access::authorize`]); a refusal is an audit event.
    AsNode {
        node: NodeId,
        cmd: Box<Command>,
    },
    /// `shoal ca rotate` (admin): the leader made a new CA and keeps its
    /// key; both CAs are trusted, the old one still signs ([`crate::ca`]).
    StartCaRotation {
        /// The CA that signs now (the entry is refused if it changed).
        old_cert_pem: String,
        old_fingerprint: String,
        new_cert_pem: String,
        new_fingerprint: String,
        /// The new CA's certificate signed by the old CA.
        cross_cert_pem: String,
    },
    /// The leader moves a rotation on from phase `from` once every member
    /// that has not left is ready (checked at commit).
    AdvanceCaRotation {
        from: crate::ca::CaPhase,
    },
    /// A member says which CAs it trusts and which one signed its own
    /// certificate (fingerprints); only about itself.
    ReportCredentials {
        node: NodeId,
        trusted: Vec<String>,
        cert_ca: String,
    },
    /// Holds a waiting job back from the scheduler, or releases it
    /// (`scontrol hold|release`).
    HoldJob {
        job: JobId,
        hold: bool,
    },
    /// Sends `signal` to every rank of a running job, which goes on
    /// running (`scancel --signal`).
    SignalJob {
        job: JobId,
        signal: i32,
    },
    /// Maps a user name to a tenant (`sacctmgr add user NAME
    /// account=TENANT`), or removes the name (`tenant: None`).
    SetUser {
        name: String,
        tenant: Option<String>,
    },
    /// The rendezvous port rank 0's agent found free on its node for this
    /// allocation (`MASTER_PORT` of every rank); the first one recorded stays.
    SetMasterPort {
        job: JobId,
        epoch: u64,
        port: u16,
    },
    /// Stops a running job and puts it back in the queue, from its latest
    /// checkpoint (`scontrol requeue`); not counted as a restart.
    RequeueJob {
        job: JobId,
    },
    /// A new time limit for a job that has not ended (`scontrol update
    /// JobId=N TimeLimit=T`); a tenant token may only lower it.
    SetTimeLimit {
        job: JobId,
        time_limit_s: u64,
    },
    /// `shoal federation join` (admin): records a peer region and the
    /// hash of the secret it presents here ([`crate::federation`]).
    AddPeerRegion {
        peer: crate::federation::PeerRegion,
    },
    /// `shoal federation leave` (admin), or the peer said it leaves.
    RemovePeerRegion {
        name: String,
    },
    /// The leader sends (`step: None`: starts sending) a job's committed
    /// step to `region`, which may take the job over from then on
    /// ([`crate::federation::copies`]).
    CheckpointCopied {
        job: JobId,
        step: Option<u64>,
        region: String,
    },
    /// A peer region's job and a committed step of it, copied onto this
    /// region's nodes.
    RecordForeignCheckpoint {
        origin: String,
        origin_job: JobId,
        spec: Box<crate::workload::JobSpec>,
        checkpoint: Box<crate::workload::Checkpoint>,
        origin_index: u64,
    },
    /// The copied job ended in its own region.
    ForgetForeignJob {
        origin: String,
        origin_job: JobId,
    },
    /// The copied job's region is lost: the job runs here from its copy,
    /// no earlier than `wait_ms` after this entry.
    AdoptForeignJob {
        origin: String,
        origin_job: JobId,
        wait_ms: u64,
    },
    /// `region` took `job` over as its `remote_job`: it ends here.
    JobMoved {
        job: JobId,
        region: String,
        remote_job: JobId,
    },
    /// A peer region's CA certificates, as its summary names them while it
    /// rotates its CA (proposed by the leader only: no node or token may).
    SetPeerCa {
        region: String,
        ca_cert_pem: String,
    },
    /// A routed write with its sender's id ([`crate::once`]): applied the
    /// first time, answered from the record when a retry repeats it. Only
    /// the leader wraps a command so (the origin is the member whose
    /// certificate carried it), and nothing is nested inside another.
    Once {
        id: crate::once::WriteId,
        cmd: Box<Command>,
    },
    /// `shoal tenant create|set NAME --global-gpus N|none --global-gpu-hours
    /// H|none` (admin, in the tenant's home region): caps the GPUs the
    /// tenant holds at once, and the GPU-seconds it commits, in all
    /// federated regions together. The region that sets one first is the
    /// tenant's home and holds each whole cap until it grants parts of it
    /// to the others ([`crate::federation::escrow`]). `None` leaves a cap
    /// as it is, `Some(None)` lifts it.
    SetGlobalCaps {
        tenant: String,
        gpus: Option<Option<u32>>,
        gpu_seconds: Option<Option<u64>>,
    },
    /// A peer region's tenant with caps across regions, as its home
    /// region's summary defines it (the leader only): created here or
    /// brought up to date; neither cap: the home lifted them.
    AdoptGlobalTenant {
        tenant: String,
        home: String,
        gpus: Option<u32>,
        gpu_seconds: Option<u64>,
        limits: crate::workload::TenantLimits,
    },
    /// The leader's round for a tenant with caps across regions: per cap,
    /// the grants of share it read in the peers' summaries and the grants
    /// it makes. The totals only grow; a round that would leave this
    /// region less share than the tenant holds (or has committed) here is
    /// refused.
    ShareRound {
        tenant: String,
        gpus: Option<crate::federation::global_tenants::RoundTotals>,
        gpu_seconds: Option<crate::federation::global_tenants::RoundTotals>,
    },
    /// A join token like `CreateJoinToken` whose nodes may become voters
    /// (`shoal token create --voter`; protocol
    /// [`crate::voters::SINCE_PROTOCOL`]).
    CreateVoterJoinToken {
        hash: String,
        expires_at_ms: u64,
        uses: u32,
    },
    /// `shoal tenant adopt NAME --from REGION` (admin): this region's own
    /// tenant `tenant` becomes the tenant region `home` shares across
    /// regions, as its summary defines it. The leader adopts on its own
    /// only a tenant this region does not have, or one it already holds
    /// under `home` (protocol
    /// [`crate::federation::global_tenants::CONSENT_SINCE_PROTOCOL`]).
    AdoptLocalTenant {
        tenant: String,
        home: String,
        gpus: Option<u32>,
        gpu_seconds: Option<u64>,
        limits: crate::workload::TenantLimits,
    },
    /// The leader replaces a peer region's secret that an older release
    /// kept in the ledger by its hash (protocol
    /// [`crate::federation::SEALED_SECRETS_SINCE_PROTOCOL`]).
    SealPeerSecret {
        region: String,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum LedgerResponse {
    Ok,
    NodeId(NodeId),
    JobId(JobId),
    /// What a `Schedule` did: jobs started and placements refused as stale.
    Scheduled {
        started: Vec<JobId>,
        refused: Vec<(JobId, String)>,
    },
    /// One answer per command of a `Batch`, in order.
    Batch(Vec<LedgerResponse>),
    /// The command was valid Raft input but the ledger refused it; the
    /// message is for a human.
    Rejected(String),
    /// The caller's token may not do this; the message is for a human.
    Denied(String),
    /// The command named another tenant's job; the message is the one a
    /// job that does not exist gets (see [`crate::access::Refusal::Hidden`]),
    /// and callers answer it exactly like a `Rejected` one.
    Hidden(String),
}

/// Decodes and checks a manifest's bytes (a `mesh:/` object's or a
/// checkpoint part's). The ledger keeps manifests opaque — their format
/// belongs to the storage crate, which this crate does not depend on — so
/// the node supplies the check. It is part of the state machine: every
/// replica must run the same one, as they run the same `apply`.
pub type ManifestCheck = fn(&[u8]) -> Result<(), String>;

/// The checks `apply` makes with code from outside this crate.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApplyChecks {
    /// `None` accepts any bytes (tests and the simulator, which make up
    /// their manifests).
    pub manifest: Option<ManifestCheck>,
    /// A planted bug, for showing that the chaos checker catches one:
    /// placements of a committed plan are applied without re-validating
    /// them against the state they land on. Only an in-process chaos run
    /// (`shoal bench chaos --plant skip-plan-validation`) sets it; no
    /// configuration file or API can.
    pub skip_plan_validation: bool,
}

/// Limits that keep the ledger (and therefore every snapshot) small.
pub const MAX_ATTR_KEY: usize = 256;
pub const MAX_ATTR_VALUE: usize = 4096;
pub const MAX_NAME: usize = 63;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    pub cluster: Option<ClusterInfo>,
    pub members: BTreeMap<NodeId, Member>,
    pub next_node_id: NodeId,
    pub join_tokens: BTreeMap<String, JoinToken>,
    pub api_tokens: BTreeMap<String, ApiToken>,
    pub attrs: BTreeMap<String, String>,
    pub workload: Workload,
    pub events: crate::events::EventLog,
    pub namespace: crate::namespace::Namespace,
    /// CA rotations and what each member trusts ([`crate::ca`]).
    pub ca: crate::ca::CaState,
    /// The largest leader timestamp applied; time never runs backwards in
    /// the ledger even if a new leader's clock is behind.
    pub clock_ms: u64,
    /// Peer regions ([`crate::federation`]).
    pub federation: crate::federation::FederationState,
    /// The answers of recent routed writes ([`crate::once`]).
    pub recent_writes: crate::once::RecentWrites,
    /// Tenants whose GPUs are capped across regions, and this region's
    /// part of each cap ([`crate::federation::escrow`]).
    pub global_caps: BTreeMap<String, crate::federation::escrow::GlobalCap>,
    /// Which members may vote ([`crate::voters::VoterEligibility`]).
    pub voter_eligibility: crate::voters::VoterEligibility,
    /// Jobs an admin token put on hold: a tenant may not release them
    /// (`scontrol hold` by an operator, as under Slurm). Last, with the
    /// field before it, so an older snapshot decodes with both empty
    /// appended.
    pub admin_holds: std::collections::BTreeSet<crate::workload::JobId>,
}

/// Checks a node name: DNS-label-like so it is safe in paths, labels and
/// metrics.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!(
            "node name must be 1-{MAX_NAME} characters, got {}",
            name.len()
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return Err(format!(
            "node name '{name}' may only contain letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

impl Ledger {
    pub fn new() -> Self {
        Ledger {
            next_node_id: 1,
            ..Default::default()
        }
    }

    /// Applies the command at log position `index`, accepting any manifest
    /// bytes. Deterministic: the result depends only on `self`, `index` and
    /// `req`.
    pub fn apply(&mut self, index: u64, req: &LedgerRequest) -> LedgerResponse {
        self.apply_with(index, req, &ApplyChecks::default())
    }

    /// [`Ledger::apply`], refusing what `checks` refuse.
    pub fn apply_with(
        &mut self,
        index: u64,
        req: &LedgerRequest,
        checks: &ApplyChecks,
    ) -> LedgerResponse {
        self.clock_ms = self.clock_ms.max(req.now_ms);
        self.apply_command(index, &req.cmd, checks)
    }

    fn apply_command(&mut self, index: u64, cmd: &Command, checks: &ApplyChecks) -> LedgerResponse {
        let now = self.clock_ms;
        match cmd {
            Command::Batch(cmds) => LedgerResponse::Batch(
                cmds.iter()
                    .map(|c| match c {
                        Command::Batch(_) => LedgerResponse::Rejected("batches do not nest".into()),
                        c => self.apply_command(index, c, checks),
                    })
                    .collect(),
            ),
            Command::Bootstrap {
                cluster_id,
                region,
                ca_cert_pem,
                admin_token_hash,
                first_member,
                spec,
            } => {
                if self.cluster.is_some() {
                    return LedgerResponse::Rejected("the cluster is already bootstrapped".into());
                }
                self.cluster = Some(ClusterInfo {
                    cluster_id: cluster_id.clone(),
                    region: region.clone(),
                    ca_cert_pem: ca_cert_pem.clone(),
                    created_at_ms: now,
                });
                self.api_tokens.insert(
                    admin_token_hash.clone(),
                    ApiToken::new(admin_token_hash, "admin".into(), None, None, now),
                );
                self.insert_member(*first_member, spec.clone(), now);
                self.next_node_id = self.next_node_id.max(first_member + 1);
                self.workload.ensure_default_tenant(now);
                LedgerResponse::NodeId(*first_member)
            }
            Command::AddMember { spec, token_hash } => {
                if self.cluster.is_none() {
                    return LedgerResponse::Rejected("the cluster is not bootstrapped yet".into());
                }
                if let Err(reason) = self.join_token_valid(token_hash, now) {
                    return LedgerResponse::Rejected(reason);
                }
                if let Err(e) = validate_name(&spec.name) {
                    return LedgerResponse::Rejected(e);
                }
                if let Some(m) = self
                    .members
                    .values()
                    .find(|m| m.spec.name == spec.name && m.state != MemberState::Left)
                {
                    return LedgerResponse::Rejected(format!(
                        "a node named '{}' is already a member (id {})",
                        spec.name, m.id
                    ));
                }
                if let Some(effective) = self.effective_protocol() {
                    let (min, max) = spec.protocol();
                    if !(min..=max).contains(&effective) {
                        return LedgerResponse::Rejected(format!(
                            "node '{}' speaks protocol {min}..{max}, but the cluster's \
                             effective protocol is {effective} (the newest version every \
                             member speaks) and the ledger may hold entries of it; run a \
                             release that speaks it",
                            spec.name
                        ));
                    }
                }
                let id = self.next_node_id;
                self.next_node_id += 1;
                self.insert_member(id, spec.clone(), now);
                self.consume_join_token(token_hash, id);
                if !self.voter_eligibility.voter_tokens.contains(token_hash) {
                    self.voter_eligibility.learners_only.insert(id);
                }
                LedgerResponse::NodeId(id)
            }
            Command::UpdateMember { id, spec } => match self.members.get_mut(id) {
                Some(m) if m.spec.name == spec.name => {
                    m.spec = spec.clone();
                    LedgerResponse::Ok
                }
                Some(m) => LedgerResponse::Rejected(format!(
                    "node {id} is named '{}', not '{}'",
                    m.spec.name, spec.name
                )),
                None => LedgerResponse::Rejected(format!("no member with id {id}")),
            },
            Command::SetMemberState { id, state } => match self.members.get_mut(id) {
                Some(m) if m.state == MemberState::Left => {
                    LedgerResponse::Rejected(format!("node {id} has left the cluster"))
                }
                Some(m) => {
                    if m.state != *state {
                        m.state = *state;
                        m.state_since_ms = now;
                        let member = m.clone();
                        self.workload.on_member_state(&member, &self.members, now);
                        if member.state == MemberState::Down {
                            self.events.record(
                                &crate::events::EventSpec {
                                    severity: crate::events::Severity::Critical,
                                    kind: "node_down".into(),
                                    node: Some(member.id),
                                    gpu: None,
                                    job: None,
                                    message: format!(
                                        "node {} stopped answering heartbeats",
                                        member.spec.name
                                    ),
                                    resource: None,
                                },
                                now,
                            );
                        }
                    }
                    LedgerResponse::Ok
                }
                None => LedgerResponse::Rejected(format!("no member with id {id}")),
            },
            Command::CreateJoinToken {
                hash,
                expires_at_ms,
                uses,
            } => answer(self.create_join_token(hash, *expires_at_ms, *uses, now)),
            Command::CreateVoterJoinToken {
                hash,
                expires_at_ms,
                uses,
            } => answer(
                self.create_join_token(hash, *expires_at_ms, *uses, now)
                    .map(|()| {
                        self.voter_eligibility.voter_tokens.insert(hash.clone());
                    }),
            ),
            Command::RevokeJoinToken { id } => answer(self.revoke_join_token(id)),
            Command::CreateApiToken {
                hash,
                name,
                tenant,
                expires_at_ms,
            } => answer(self.create_api_token(hash, name, tenant, *expires_at_ms, now)),
            Command::RevokeApiToken { id } => answer(self.revoke_api_token(id, now)),
            Command::RotateApiToken { name, hash } => {
                answer(self.rotate_api_token(name, hash, now))
            }
            Command::TouchApiToken { id } => answer(self.touch_api_token(id, now)),
            Command::AddPeerRegion { peer } => answer(self.add_peer_region(peer, now)),
            Command::RemovePeerRegion { name } => answer(self.remove_peer_region(name)),
            Command::SetGlobalCaps {
                tenant,
                gpus,
                gpu_seconds,
            } => answer(self.set_global_caps(tenant, *gpus, *gpu_seconds)),
            Command::AdoptGlobalTenant {
                tenant,
                home,
                gpus,
                gpu_seconds,
                limits,
            } => answer(self.adopt_global_tenant(
                tenant,
                home,
                (*gpus, *gpu_seconds),
                limits,
                false,
                now,
            )),
            Command::SealPeerSecret { region } => answer(self.seal_peer_secret(region)),
            Command::AdoptLocalTenant {
                tenant,
                home,
                gpus,
                gpu_seconds,
                limits,
            } => answer(self.adopt_global_tenant(
                tenant,
                home,
                (*gpus, *gpu_seconds),
                limits,
                true,
                now,
            )),
            Command::ShareRound {
                tenant,
                gpus,
                gpu_seconds,
            } => answer(self.share_round(tenant, gpus.as_ref(), gpu_seconds.as_ref())),
            Command::SetPeerCa {
                region,
                ca_cert_pem,
            } => answer(self.set_peer_ca(region, ca_cert_pem)),
            Command::CheckpointCopied { job, step, region } => {
                answer(self.checkpoint_copied(*job, *step, region))
            }
            Command::RecordForeignCheckpoint {
                origin,
                origin_job,
                spec,
                checkpoint,
                origin_index,
            } => answer(self.record_foreign_checkpoint(
                origin,
                *origin_job,
                spec,
                checkpoint,
                *origin_index,
                now,
            )),
            Command::ForgetForeignJob { origin, origin_job } => {
                answer(self.forget_foreign_job(origin, *origin_job))
            }
            Command::AdoptForeignJob {
                origin,
                origin_job,
                wait_ms,
            } => {
                match self.adopt_foreign_job(origin, *origin_job, now.saturating_add(*wait_ms), now)
                {
                    Ok(id) => LedgerResponse::JobId(id),
                    Err(e) => LedgerResponse::Rejected(e),
                }
            }
            Command::JobMoved {
                job,
                region,
                remote_job,
            } => answer(self.job_moved(*job, region, *remote_job, now)),
            Command::Once { id, cmd } => {
                if let Some(answer) = self.recent_writes.answer(id) {
                    return answer.clone();
                }
                if matches!(**cmd, Command::Once { .. }) {
                    return LedgerResponse::Rejected("write ids do not nest".into());
                }
                let answer = self.apply_command(index, cmd, checks);
                self.recent_writes.record(*id, answer.clone(), now);
                answer
            }
            Command::AsTenant { tenant, cmd } => {
                if matches!(
                    **cmd,
                    Command::AsTenant { .. }
                        | Command::AsNode { .. }
                        | Command::Batch(_)
                        | Command::Once { .. }
                ) {
                    return LedgerResponse::Rejected("tenant commands do not nest".into());
                }
                match crate::access::authorize(self, tenant, cmd) {
                    Ok(()) => {}
                    Err(crate::access::Refusal::Denied(reason)) => {
                        return LedgerResponse::Denied(reason)
                    }
                    Err(crate::access::Refusal::Hidden(reason)) => {
                        return LedgerResponse::Hidden(reason)
                    }
                }
                match (crate::limits::check(self, cmd), &**cmd) {
                    (Err(reason), _) => LedgerResponse::Rejected(reason),
                    (Ok(()), Command::HoldJob { job, hold }) => {
                        answer(self.set_hold(*job, *hold, false))
                    }
                    (Ok(()), _) => self.apply_command(index, cmd, checks),
                }
            }
            Command::AsNode { node, cmd } => {
                let refusal = if matches!(
                    **cmd,
                    Command::AsTenant { .. }
                        | Command::AsNode { .. }
                        | Command::Batch(_)
                        | Command::Once { .. }
                ) {
                    Some(format!("node {node} may not nest commands"))
                } else {
                    crate::node_access::authorize(self, *node, cmd).err()
                };
                match refusal {
                    None => self.apply_command(index, cmd, checks),
                    Some(reason) => {
                        self.events.record(
                            &crate::events::EventSpec {
                                severity: crate::events::Severity::Warning,
                                kind: crate::events::AUDIT.into(),
                                node: Some(*node),
                                gpu: None,
                                job: None,
                                resource: None,
                                message: format!("refused a command from a member: {reason}"),
                            },
                            now,
                        );
                        LedgerResponse::Denied(reason)
                    }
                }
            }
            Command::PutAttr { key, value } => {
                if key.is_empty() || key.len() > MAX_ATTR_KEY || value.len() > MAX_ATTR_VALUE {
                    return LedgerResponse::Rejected(format!(
                        "attribute keys are 1-{MAX_ATTR_KEY} bytes and values at most {MAX_ATTR_VALUE} bytes"
                    ));
                }
                self.attrs.insert(key.clone(), value.clone());
                LedgerResponse::Ok
            }
            Command::CreateTenant { name, limits } => {
                answer(self.workload.create_tenant(name, limits, now))
            }
            Command::UpdateTenant { name, update } => {
                answer(self.workload.update_tenant(name, update))
            }
            Command::SubmitJob { spec } => {
                if let Err(reason) = self.fits_global_caps(spec) {
                    return LedgerResponse::Rejected(reason);
                }
                match self.workload.submit(spec, &self.members, now) {
                    Ok(id) => LedgerResponse::JobId(id),
                    Err(reason) => LedgerResponse::Rejected(reason),
                }
            }
            Command::CancelJob { job } => answer(self.workload.cancel(*job, now)),
            Command::HoldJob { job, hold } => answer(self.set_hold(*job, *hold, true)),
            Command::SignalJob { job, signal } => answer(self.workload.signal(*job, *signal)),
            Command::RequeueJob { job } => answer(self.workload.requeue(*job, now)),
            Command::SetUser { name, tenant } => {
                answer(self.workload.set_user(name, tenant.as_deref()))
            }
            Command::SetMasterPort { job, epoch, port } => {
                answer(self.workload.set_master_port(*job, *epoch, *port))
            }
            Command::SetTimeLimit { job, time_limit_s } => {
                answer(self.workload.set_time_limit(*job, *time_limit_s, now))
            }
            Command::Schedule(plan) => {
                let validate = !checks.skip_plan_validation;
                let shares = self.regional_shares();
                let outcome =
                    self.workload
                        .apply_plan(plan, &self.members, index, now, validate, &shares);
                LedgerResponse::Scheduled {
                    started: outcome.started,
                    refused: outcome.refused,
                }
            }
            Command::RankExited {
                job,
                epoch,
                rank,
                exit_code,
                end,
            } => answer(self.workload.rank_exited(
                *job,
                *epoch,
                *rank,
                *exit_code,
                *end,
                &self.members,
                now,
            )),
            Command::CheckpointPart {
                job,
                epoch,
                rank,
                step,
                part,
            } => {
                if let Err(e) = checks.check_manifest(&part.manifest) {
                    return LedgerResponse::Rejected(format!(
                        "invalid manifest for checkpoint {step} of job {job}, rank {rank}: {e}"
                    ));
                }
                answer(
                    self.workload
                        .checkpoint_part(*job, *epoch, *rank, *step, part, now),
                )
            }
            Command::ReleaseJob { job, epoch } => {
                answer(self.workload.release(*job, *epoch, &self.members, now))
            }
            Command::PutObject { object, replace } => {
                if let Err(e) = checks.check_manifest(&object.manifest) {
                    return LedgerResponse::Rejected(format!(
                        "invalid manifest for mesh:{}: {e}",
                        object.path
                    ));
                }
                let mut object = object.clone();
                object.mtime_ms = now;
                answer(self.namespace.put(&object, *replace))
            }
            Command::RemoveObject { path } => answer(self.namespace.remove(path).map(|_| ())),
            Command::SetObjectHolders { path, holders } => {
                answer(self.namespace.set_holders(path, holders))
            }
            Command::RecordEvent(spec) => {
                self.events.record(spec, now);
                LedgerResponse::Ok
            }
            Command::SetDrain { id, drain } => {
                if !self.members.contains_key(id) {
                    return LedgerResponse::Rejected(format!("no member with id {id}"));
                }
                self.workload.set_drain(*id, *drain, now);
                LedgerResponse::Ok
            }
            Command::SetGpuFault { node, gpu, fault } => {
                let Some(member) = self.members.get(node) else {
                    return LedgerResponse::Rejected(format!("no member with id {node}"));
                };
                if !member.spec.gpus.iter().any(|g| g.index == *gpu) {
                    return LedgerResponse::Rejected(format!(
                        "{} has no GPU {gpu}",
                        member.spec.name
                    ));
                }
                if fault.as_ref().is_some_and(|f| f.reason.len() > 256) {
                    return LedgerResponse::Rejected(
                        "a GPU fault's reason is at most 256 bytes".into(),
                    );
                }
                let fault = fault.as_ref().map(|f| crate::workload::GpuFault {
                    reason: f.reason.clone(),
                    detected: f.detected,
                    since_ms: now,
                });
                self.workload.set_gpu_fault(*node, *gpu, fault, now);
                LedgerResponse::Ok
            }
            Command::SetCheckpointHolders {
                job,
                step,
                rank,
                holders,
            } => answer(
                self.workload
                    .set_checkpoint_holders(*job, *step, *rank, holders),
            ),
            Command::StartCaRotation { .. } => self.start_ca_rotation(cmd, now),
            Command::AdvanceCaRotation { from } => self.advance_ca_rotation(*from, now),
            Command::ReportCredentials {
                node,
                trusted,
                cert_ca,
            } => self.report_credentials(*node, trusted, cert_ca, now),
        }
    }

    /// `shoal hold|release`: an admin's hold is recorded, so that only an
    /// admin releases it; a tenant's hold its tenant may release.
    fn set_hold(
        &mut self,
        job: crate::workload::JobId,
        hold: bool,
        by_admin: bool,
    ) -> Result<(), String> {
        self.workload.hold(job, hold)?;
        if hold && by_admin {
            self.admin_holds.insert(job);
        } else if !hold {
            self.admin_holds.remove(&job);
        }
        let jobs = &self.workload.jobs;
        self.admin_holds
            .retain(|id| jobs.get(id).is_some_and(|j| j.held && !j.state.is_final()));
        Ok(())
    }

    /// The cluster's effective protocol: the newest version every member
    /// (that has not left) speaks, i.e. the lowest of their newest. A command
    /// format of protocol `v` may be proposed only once this is at least `v`:
    /// a member that does not speak it could not apply the entry. `None`
    /// without members.
    pub fn effective_protocol(&self) -> Option<u16> {
        self.members
            .values()
            .filter(|m| m.state != MemberState::Left)
            .map(|m| m.spec.protocol().1)
            .min()
    }

    pub(crate) fn insert_member(&mut self, id: NodeId, spec: MemberSpec, now: u64) {
        self.members.insert(
            id,
            Member {
                id,
                spec,
                state: MemberState::Alive,
                joined_at_ms: now,
                state_since_ms: now,
            },
        );
    }

    /// Members that have not left, in id order.
    pub fn active_members(&self) -> impl Iterator<Item = &Member> {
        self.members
            .values()
            .filter(|m| m.state != MemberState::Left)
    }

    pub fn member_by_name_or_id(&self, key: &str) -> Option<&Member> {
        if let Ok(id) = key.parse::<NodeId>() {
            if let Some(m) = self.members.get(&id) {
                return Some(m);
            }
        }
        self.members.values().find(|m| m.spec.name == key)
    }
}

impl ApplyChecks {
    fn check_manifest(&self, bytes: &[u8]) -> Result<(), String> {
        match self.manifest {
            Some(check) => check(bytes),
            None => Ok(()),
        }
    }
}

fn answer(result: Result<(), String>) -> LedgerResponse {
    match result {
        Ok(()) => LedgerResponse::Ok,
        Err(reason) => LedgerResponse::Rejected(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(name: &str) -> MemberSpec {
        MemberSpec {
            name: name.into(),
            rpc_addr: "127.0.0.1:7071".into(),
            api_addr: "127.0.0.1:7070".into(),
            labels: BTreeMap::new(),
            gpus: vec![],
            gossip_peer_id: String::new(),
            gossip_addr: String::new(),
            ..Default::default()
        }
    }

    fn bootstrapped() -> Ledger {
        let mut l = Ledger::new();
        let r = l.apply(
            1,
            &LedgerRequest {
                now_ms: 1000,
                cmd: Command::Bootstrap {
                    cluster_id: "c".into(),
                    region: "r".into(),
                    ca_cert_pem: "cert".into(),
                    admin_token_hash: "admin".into(),
                    first_member: 1,
                    spec: spec("n1"),
                },
            },
        );
        assert_eq!(r, LedgerResponse::NodeId(1));
        l
    }

    #[test]
    fn a_repeated_write_id_is_answered_from_the_record_and_applied_once() {
        let mut l = bootstrapped();
        let once = |origin: NodeId, nonce: u64, cmd: Command| Command::Once {
            id: crate::once::WriteId { origin, nonce },
            cmd: Box::new(cmd),
        };
        let at =
            |l: &mut Ledger, ms: u64, cmd: Command| l.apply(2, &LedgerRequest { now_ms: ms, cmd });
        let create = Command::CreateTenant {
            name: "vision".into(),
            limits: Default::default(),
        };
        assert_eq!(
            at(&mut l, 1100, once(1, 9, create.clone())),
            LedgerResponse::Ok
        );
        let created_at = l.workload.tenants["vision"].created_at_ms;
        // The retry of a write whose first attempt committed.
        assert_eq!(
            at(&mut l, 1200, once(1, 9, create.clone())),
            LedgerResponse::Ok
        );
        assert_eq!(l.workload.tenants["vision"].created_at_ms, created_at);
        // Another member's write with the same nonce is another write.
        let again = at(&mut l, 1300, once(2, 9, create.clone()));
        assert!(
            matches!(&again, LedgerResponse::Rejected(m) if m.contains("exists")),
            "{again:?}"
        );

        let object = crate::access::tests::object("/data", "default");
        let put = Command::PutObject {
            object,
            replace: false,
        };
        assert_eq!(at(&mut l, 1400, put), LedgerResponse::Ok);
        let remove = Command::RemoveObject {
            path: "/data".into(),
        };
        assert_eq!(
            at(&mut l, 1500, once(1, 10, remove.clone())),
            LedgerResponse::Ok
        );
        assert_eq!(
            at(&mut l, 1600, once(1, 10, remove.clone())),
            LedgerResponse::Ok,
            "a removal's retry is not answered 'does not exist'"
        );
        let unrouted = at(&mut l, 1700, remove);
        assert!(
            matches!(&unrouted, LedgerResponse::Rejected(m) if m.contains("does not exist")),
            "{unrouted:?}"
        );

        // Only the leader wraps a write: never inside another wrapper.
        let nested = at(
            &mut l,
            1800,
            once(
                1,
                11,
                once(
                    1,
                    12,
                    Command::PutAttr {
                        key: "k".into(),
                        value: "v".into(),
                    },
                ),
            ),
        );
        assert!(matches!(nested, LedgerResponse::Rejected(_)), "{nested:?}");
        let forged = at(
            &mut l,
            1900,
            Command::AsNode {
                node: 1,
                cmd: Box::new(once(
                    2,
                    13,
                    Command::PutAttr {
                        key: "k".into(),
                        value: "v".into(),
                    },
                )),
            },
        );
        assert!(matches!(forged, LedgerResponse::Denied(_)), "{forged:?}");
        assert!(!l.attrs.contains_key("k"));
    }

    #[test]
    fn the_effective_protocol_is_the_newest_every_member_speaks_and_a_joiner_must_speak_it() {
        let mut l = bootstrapped();
        assert_eq!(
            l.effective_protocol(),
            Some(1),
            "unrecorded ranges read as 1..1"
        );
        let at =
            |l: &mut Ledger, ms: u64, cmd: Command| l.apply(1, &LedgerRequest { now_ms: ms, cmd });
        at(
            &mut l,
            1100,
            Command::CreateJoinToken {
                hash: "t".into(),
                expires_at_ms: 50_000,
                uses: 10,
            },
        );
        let speaking = |name: &str, min: u16, max: u16| MemberSpec {
            protocol_min: min,
            protocol_max: max,
            version: "0.2.0".into(),
            ..spec(name)
        };
        let add = |spec: MemberSpec| Command::AddMember {
            spec,
            token_hash: "t".into(),
        };
        // Mid-upgrade: a node of the next release joins; nothing changes yet.
        assert_eq!(
            at(&mut l, 1200, add(speaking("n2", 1, 2))),
            LedgerResponse::NodeId(2)
        );
        assert_eq!(l.effective_protocol(), Some(1));
        // One that dropped version 1 must wait until every member speaks 2.
        let r = at(&mut l, 1300, add(speaking("n3", 2, 2)));
        assert!(
            matches!(&r, LedgerResponse::Rejected(m) if m.contains("speaks protocol 2..2") && m.contains("effective protocol is 1")),
            "{r:?}"
        );
        // The last old member is upgraded in place.
        let r = at(
            &mut l,
            1400,
            Command::UpdateMember {
                id: 1,
                spec: speaking("n1", 1, 2),
            },
        );
        assert_eq!(r, LedgerResponse::Ok);
        assert_eq!(l.effective_protocol(), Some(2));
        assert_eq!(l.members[&1].spec.version, "0.2.0");
        assert_eq!(
            at(&mut l, 1500, add(speaking("n3", 2, 2))),
            LedgerResponse::NodeId(3)
        );
        // Now an old release cannot join: the ledger may hold version 2 entries.
        let r = at(&mut l, 1600, add(speaking("n4", 1, 1)));
        assert!(matches!(r, LedgerResponse::Rejected(_)), "{r:?}");
    }

    #[test]
    fn join_requires_a_live_token_and_a_unique_name() {
        let mut l = bootstrapped();
        let add = |name: &str| Command::AddMember {
            spec: spec(name),
            token_hash: "t".into(),
        };
        let r = l.apply(
            1,
            &LedgerRequest {
                now_ms: 1100,
                cmd: add("n2"),
            },
        );
        assert_eq!(r, LedgerResponse::Rejected("unknown join token".into()));
        l.apply(
            1,
            &LedgerRequest {
                now_ms: 1200,
                cmd: Command::CreateJoinToken {
                    hash: "t".into(),
                    expires_at_ms: 5000,
                    uses: 5,
                },
            },
        );
        assert_eq!(
            l.apply(
                1,
                &LedgerRequest {
                    now_ms: 1300,
                    cmd: add("n2")
                }
            ),
            LedgerResponse::NodeId(2)
        );
        assert!(matches!(
            l.apply(
                1,
                &LedgerRequest {
                    now_ms: 1400,
                    cmd: add("n2")
                }
            ),
            LedgerResponse::Rejected(_)
        ));
        assert_eq!(
            l.apply(
                1,
                &LedgerRequest {
                    now_ms: 6000,
                    cmd: add("n3")
                }
            ),
            LedgerResponse::Rejected("the join token t has expired".into())
        );
    }

    #[test]
    fn a_batch_answers_each_command_and_refuses_nesting() {
        let mut l = bootstrapped();
        let put = |k: &str| Command::PutAttr {
            key: k.into(),
            value: "v".into(),
        };
        let r = l.apply(
            1,
            &LedgerRequest {
                now_ms: 2000,
                cmd: Command::Batch(vec![
                    put("a"),
                    put(""),
                    Command::Batch(vec![put("c")]),
                    put("b"),
                ]),
            },
        );
        match r {
            LedgerResponse::Batch(v) => {
                assert_eq!(v.len(), 4);
                assert_eq!(v[0], LedgerResponse::Ok);
                assert!(matches!(v[1], LedgerResponse::Rejected(_)));
                assert!(matches!(v[2], LedgerResponse::Rejected(_)));
                assert_eq!(v[3], LedgerResponse::Ok);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(l.attrs.len(), 2);
    }

    #[test]
    fn ledger_clock_never_runs_backwards() {
        let mut l = bootstrapped();
        l.apply(
            1,
            &LedgerRequest {
                now_ms: 500,
                cmd: Command::PutAttr {
                    key: "k".into(),
                    value: "v".into(),
                },
            },
        );
        assert_eq!(l.clock_ms, 1000);
    }

    fn arb_cmd() -> impl Strategy<Value = LedgerRequest> {
        let name = prop::sample::select(vec!["a", "b", "c", "bad name", ""]);
        let cmd = prop_oneof![
            (name.clone(), prop::sample::select(vec!["t1", "t2"])).prop_map(|(n, t)| {
                Command::AddMember {
                    spec: spec(n),
                    token_hash: t.into(),
                }
            }),
            (
                0u64..6,
                prop::sample::select(vec![
                    MemberState::Alive,
                    MemberState::Suspect,
                    MemberState::Down,
                    MemberState::Left
                ])
            )
                .prop_map(|(id, state)| Command::SetMemberState { id, state }),
            (
                prop::sample::select(vec!["t1", "t2"]),
                0u64..20_000,
                0u32..3
            )
                .prop_map(|(h, e, uses)| Command::CreateJoinToken {
                    hash: h.into(),
                    expires_at_ms: e,
                    uses,
                }),
            prop::sample::select(vec!["t1", "t2"])
                .prop_map(|id| Command::RevokeJoinToken { id: id.into() }),
            ("[a-z]{0,3}", "[a-z]{0,3}").prop_map(|(key, value)| Command::PutAttr { key, value }),
        ];
        let cmd = prop_oneof![
            4 => cmd.clone(),
            1 => prop::collection::vec(cmd, 0..4).prop_map(Command::Batch),
        ];
        (0u64..20_000, cmd).prop_map(|(now_ms, cmd)| LedgerRequest { now_ms, cmd })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Determinism (invariant 7): two replicas applying the same log end in
        /// the same state with the same answers; and names stay unique among
        /// active members; node ids are never reused; join tokens admit at
        /// most their uses.
        #[test]
        fn replicas_applying_the_same_log_agree(cmds in prop::collection::vec(arb_cmd(), 0..60)) {
            let mut a = bootstrapped();
            let mut b = bootstrapped();
            let mut seen_ids = std::collections::BTreeSet::from([1u64]);
            for c in &cmds {
                let ra = a.apply(1, c);
                let rb = b.apply(1, c);
                prop_assert_eq!(&ra, &rb);
                let answers = match ra {
                    LedgerResponse::Batch(v) => v,
                    other => vec![other],
                };
                for a in answers {
                    if let LedgerResponse::NodeId(id) = a {
                        prop_assert!(seen_ids.insert(id), "node id {} reused", id);
                    }
                }
                let mut names: Vec<_> = a.active_members().map(|m| m.spec.name.clone()).collect();
                let n = names.len();
                names.sort();
                names.dedup();
                prop_assert_eq!(names.len(), n);
                // A join token never admits more nodes than it has uses.
                for t in a.join_tokens.values() {
                    prop_assert_eq!(t.admitted.len() as u32 + t.uses_left, t.max_uses);
                }
            }
            prop_assert_eq!(a, b);
        }
    }
}
