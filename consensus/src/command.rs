//! The ledger's input and output: [`Command`], every change the
//! replicated log can carry, with the leader's timestamp
//! ([`LedgerRequest`]), and what applying one answers ([`LedgerResponse`]).
//! The variants' order is the log's encoding (bincode numbers them): a new
//! command goes last, and none is ever removed or reordered.

use crate::ids::NodeId;
use crate::members::{GpuFaultReport, MemberSpec};
use crate::workload::{CkptPart, JobId, JobSpec, Plan, TenantLimits, TenantUpdate};
use serde::{Deserialize, Serialize};
use shoal_sdk::MemberState;

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
    /// tenant may (checked at commit by the ledger's `access` guard).
    AsTenant {
        tenant: String,
        cmd: Box<Command>,
    },
    /// A command a member node forwarded on its own authority (no user
    /// token): applied only if it is about that node
    /// (the ledger's `node_access` guard); a refusal is an audit event.
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
    /// to the others ([`crate::escrow`]). `None` leaves a cap
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
    /// job that does not exist gets (see the ledger's `access::Refusal::Hidden`),
    /// and callers answer it exactly like a `Rejected` one.
    Hidden(String),
}
