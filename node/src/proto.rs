//! The node-to-node protocol carried by mesh RPC: bincode-encoded
//! `Request`/`Response` (the mesh frame adds the version byte). Errors cross
//! the wire as a code and a message and come back typed.

use serde::{Deserialize, Serialize};
use shoal_consensus::network::{RaftRpc, RaftRpcReply};
use shoal_consensus::types::{Entry, LogId, SnapshotMeta, Vote};
use shoal_consensus::{Command, LedgerResponse, MemberSpec};
use shoal_sdk::{NodeInfo, StatusResponse};

/// The protocol version from which members renew a lease on the leader
/// (`Request::Renew`) rather than query its status.
pub const RENEW_SINCE_PROTOCOL: u16 = 7;

/// Bound on any decoded message (the frame limit is the same).
const MAX_MESSAGE: u64 = shoal_mesh::rpc::MAX_FRAME as u64;

#[derive(Serialize, Deserialize, Debug)]
pub enum Request {
    Raft(RaftRpc),
    /// From a node without a certificate yet.
    Join(JoinRequest),
    /// A node's own write forwarded to the leader, which stamps the time;
    /// the leader applies it only as far as the sending member may
    /// (`Command::AsNode`).
    Write(Command),
    /// A user's write: the leader resolves the token and applies what its
    /// holder may do. A node relays users' writes, it never vouches for them.
    WriteAs {
        token: UserToken,
        cmd: Command,
    },
    /// A linearizable read served by the leader.
    Query(Query),
    /// Remove a member from the cluster (leader only): by an admin's token,
    /// or by the member itself leaving.
    RemoveMember {
        id: u64,
        token: Option<UserToken>,
    },
    /// Checkpoint chunks, served by the receiving node's own store.
    Chunk(ChunkRequest),
    /// A member's new certificate for a fresh key (leader only). The member
    /// is the one whose certificate carried the request: the receiving
    /// node overwrites `member` with it, whatever the sender wrote.
    RenewCertificate {
        member: u64,
        csr_pem: String,
    },
    /// The key of the trusted CA with this certificate fingerprint, for a
    /// voter that lacks it (served by a holder, only to a current voter;
    /// during a CA rotation the cluster trusts two CAs).
    FetchCaKey {
        fingerprint: String,
    },
    /// Whether the receiving node holds the key of every CA the cluster
    /// trusts.
    HoldsCaKey,
    /// `shoal ca rotate` with an admin's token (leader only): a new CA, and
    /// the rotation to it starts.
    RotateCa {
        token: UserToken,
    },
    /// The receiving node's own GPUs' latest samples, for the dashboard's
    /// telemetry relay (served by the node asked, to any member).
    GpuTelemetry,
    /// A leader that is stopping asks a voter to stand for election at
    /// once (served by the node asked, only for the current leader).
    ElectNow,
    /// Whether the caller is still a member: `Holds(true)`, or refused with
    /// [`ErrorCode::Removed`]. A learner never campaigns, so one that was
    /// cut off while it was removed hears of it only by asking.
    StillMember,
    /// A `Write` or `WriteAs` with the sender's id for it, the same on every
    /// attempt: the leader applies it as `Command::Once` under the id of
    /// the member whose certificate carried it, so a retry of a write that
    /// did commit is answered as the first attempt was.
    Once {
        nonce: u64,
        req: Box<Request>,
    },
    /// The secret this region presents to peer region `region`, for a
    /// member that lacks it (served by the node asked, to any member; the
    /// asker checks it against the ledger's hash). Protocol 6.
    FetchPeerSecret {
        region: String,
    },
    /// A member renews its lease on the leader (leader only), several
    /// times a second: the leader counts it as a sign of life, and answers
    /// with a read index (its commit index, its leadership confirmed by a
    /// quorum after the request arrived) which the member applies before
    /// it counts its ledger current. Protocol 7; a member whose leader
    /// speaks less asks `Query::Status` instead. From protocol 8 a relayed
    /// member renews through the replica it follows the log from, which
    /// passes the renewals of a round on together (`RenewFor`).
    Renew,
    /// The committed log after `after` (the asker's applied entry), served
    /// by any member from what it has applied, to a member of its ledger:
    /// how a member outside the Raft replicas keeps its own ledger
    /// (`shoal_consensus::replicas`). Held up to `wait_ms` while there is
    /// nothing newer. Protocol 8.
    FollowLog {
        after: Option<LogId>,
        wait_ms: u32,
    },
    /// A Raft replica renews the leases of the members that renewed
    /// through it since its last such call (leader only, from a replica
    /// the leader's membership names): one call per round for all of
    /// them, answered as `Request::Renew` is. Protocol 8.
    RenewFor {
        members: Vec<u64>,
    },
}

impl Request {
    /// Every name [`Request::kind`] gives.
    pub const KINDS: [&'static str; 18] = [
        "raft",
        "join",
        "write",
        "write_as",
        "query",
        "remove_member",
        "chunk",
        "renew_certificate",
        "fetch_ca_key",
        "holds_ca_key",
        "rotate_ca",
        "gpu_telemetry",
        "elect_now",
        "still_member",
        "fetch_peer_secret",
        "renew",
        "follow_log",
        "renew_for",
    ];

    /// The request's name, as the `shoal_rpc_requests_total` metric labels it.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Raft(_) => "raft",
            Request::Join(_) => "join",
            Request::Write(_) => "write",
            Request::WriteAs { .. } => "write_as",
            Request::Query(_) => "query",
            Request::RemoveMember { .. } => "remove_member",
            Request::Chunk(_) => "chunk",
            Request::RenewCertificate { .. } => "renew_certificate",
            Request::FetchCaKey { .. } => "fetch_ca_key",
            Request::HoldsCaKey => "holds_ca_key",
            Request::RotateCa { .. } => "rotate_ca",
            Request::GpuTelemetry => "gpu_telemetry",
            Request::ElectNow => "elect_now",
            Request::StillMember => "still_member",
            Request::Once { req, .. } => req.kind(),
            Request::FetchPeerSecret { .. } => "fetch_peer_secret",
            Request::Renew => "renew",
            Request::FollowLog { .. } => "follow_log",
            Request::RenewFor { .. } => "renew_for",
        }
    }
}

/// A user's API token on its way to the leader. Only its holder and the
/// leader see it (the link is mutual TLS); it is never printed.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct UserToken(pub String);

impl std::fmt::Debug for UserToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserToken(<secret>)")
    }
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum ChunkRequest {
    /// Store a chunk frame; the receiver verifies it against the id.
    Put {
        id: shoal_storage::chunk::ChunkId,
        #[serde(with = "serde_bytes")]
        frame: Vec<u8>,
    },
    Fetch {
        id: shoal_storage::chunk::ChunkId,
    },
    Has {
        ids: Vec<shoal_storage::chunk::ChunkId>,
    },
    /// Store a chunk frame and pass it on down `forward` (chained
    /// replication: the source sends one copy, not one per replica).
    PutChain {
        id: shoal_storage::chunk::ChunkId,
        #[serde(with = "serde_bytes")]
        frame: Vec<u8>,
        forward: Vec<u64>,
    },
    /// Whether `tenant` uploaded each of `ids` to the receiving node lately
    /// (`rpc::receipts`); answered with `Response::Has`. Protocol 5.
    Uploaded {
        tenant: String,
        ids: Vec<shoal_storage::chunk::ChunkId>,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum Query {
    Status,
    Nodes,
    /// Cluster attributes whose key starts with the prefix.
    Attrs {
        prefix: String,
    },
    Jobs {
        tenant: Option<String>,
        state: Option<String>,
    },
    Job(u64),
    Checkpoints(u64),
    Events {
        after: u64,
    },
    Objects {
        path: String,
    },
    Tenants,
    Quota,
}

#[derive(Serialize, Deserialize, Debug)]
pub enum Response {
    Raft(RaftRpcReply),
    Join(JoinResponse),
    Write {
        response: LedgerResponse,
        index: u64,
    },
    Status(StatusResponse),
    Nodes(Vec<NodeInfo>),
    Attrs(std::collections::BTreeMap<String, String>),
    Jobs(Vec<shoal_sdk::JobInfo>),
    Tenants(Vec<shoal_sdk::TenantInfo>),
    Quota(Vec<shoal_sdk::QuotaInfo>),
    Checkpoints(Vec<shoal_sdk::CheckpointInfo>),
    Events(Vec<shoal_sdk::EventInfo>),
    Objects(Vec<shoal_sdk::ObjectInfo>),
    ChunkStored,
    Chunk(#[serde(with = "serde_bytes")] Vec<u8>),
    Has(Vec<bool>),
    /// A chain's outcome: the receiver's own first, then each node it
    /// forwarded to, in chain order.
    ChainStored(Vec<Result<(), shoal_storage::replicate::TransportError>>),
    Error(WireError),
    /// A renewed node certificate (PEM).
    Certificate(String),
    /// The CA key (PEM), `None` when the node does not hold it.
    CaKey(Option<UserToken>),
    Holds(bool),
    /// A CA rotation started at log `index`.
    CaRotated {
        index: u64,
        old_fingerprint: String,
        new_fingerprint: String,
    },
    /// A node's own GPU samples (no job: the asker reads holders from its
    /// ledger and scopes them to its caller).
    GpuTelemetry(Vec<GpuTelemetry>),
    /// A peer region's secret, `None` when the node does not hold it.
    PeerSecret(Option<UserToken>),
    /// The read index a renewal was answered with.
    Renewed {
        read_index: u64,
    },
    /// Committed entries following the asked one (none when nothing newer
    /// came within the wait), under the vote of the leader that committed
    /// them as far as the server knows.
    LogEntries {
        vote: Vote,
        entries: Vec<Entry>,
    },
    /// The server no longer holds the entries after the asked one: its
    /// latest snapshot instead.
    LogSnapshot {
        vote: Vote,
        meta: SnapshotMeta,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
}

#[derive(Serialize, Deserialize, Clone)]
pub struct JoinRequest {
    pub secret: String,
    pub ca_pin: String,
    pub spec: MemberSpec,
    pub csr_pem: String,
}

/// Never prints the join secret.
impl std::fmt::Debug for JoinRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinRequest")
            .field("secret", &"<secret>")
            .field("ca_pin", &self.ca_pin)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct JoinResponse {
    pub node_id: u64,
    pub cluster_id: String,
    pub region: String,
    pub cert_pem: String,
    pub ca_pem: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// This node is not the leader; the caller should retry on the leader.
    NotLeader,
    Unauthenticated,
    Forbidden,
    Invalid,
    Rejected,
    Unavailable,
    Internal,
    NotFound,
    /// The caller was removed from the cluster: its certificate is refused
    /// for good, and a node told so stops (see the node's removal notice).
    Removed,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: message.into(),
        }
    }
}

fn opts() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_MESSAGE)
}

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    use bincode::Options;
    // Only a message above the frame limit fails here (senders of large
    // data split it: chunks, the batcher's entry bound, PayloadTooLarge for
    // Raft). An empty body is answered by the peer as a decode error, never
    // a panic, and the failure is not silent.
    opts().serialize(v).unwrap_or_else(|e| {
        tracing::error!(error = %e, "a message could not be encoded; sending an empty body");
        Vec::new()
    })
}

/// Encodes `Request::Chunk(ChunkRequest::PutChain { id, frame, forward })`
/// from a borrowed frame: the bytes are written once, into the message,
/// instead of first into an owned request (a 4 MiB copy at every hop of a
/// replication chain). The wire form is the derived one, byte for byte
/// (`put_chain_encodes_as_the_owned_request`).
pub fn encode_put_chain(
    id: &shoal_storage::chunk::ChunkId,
    frame: &[u8],
    forward: &[u64],
) -> Vec<u8> {
    struct Fields<'a>(&'a shoal_storage::chunk::ChunkId, &'a [u8], &'a [u64]);
    impl Serialize for Fields<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeStructVariant;
            let mut v = s.serialize_struct_variant("ChunkRequest", 3, "PutChain", 3)?;
            v.serialize_field("id", self.0)?;
            v.serialize_field("frame", serde_bytes::Bytes::new(self.1))?;
            v.serialize_field("forward", self.2)?;
            v.end()
        }
    }
    struct ChunkVariant<'a>(Fields<'a>);
    impl Serialize for ChunkVariant<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_newtype_variant("Request", 6, "Chunk", &self.0)
        }
    }
    encode(&ChunkVariant(Fields(id, frame, forward)))
}

pub fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, WireError> {
    use bincode::Options;
    opts()
        .deserialize(b)
        .map_err(|e| WireError::new(ErrorCode::Invalid, format!("undecodable message: {e}")))
}

/// One GPU's latest sample. It also travels between nodes (bincode, in
/// [`Response::GpuTelemetry`]): no field may be skipped when serialized.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct GpuTelemetry {
    pub index: u32,
    pub util_pct: u32,
    pub temp_c: u32,
    pub power_w: f64,
    pub fb_used_mb: u64,
    pub fb_total_mb: u64,
    /// Active clock throttle reasons, e.g. `HW_THERMAL_SLOWDOWN`.
    #[serde(default)]
    pub throttle: Vec<String>,
    /// The job holding the GPU and its name, when the caller may see it;
    /// filled by the answering node from its ledger, never relayed.
    #[serde(default)]
    pub job: Option<u64>,
    #[serde(default)]
    pub job_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_chain_encodes_as_the_owned_request() {
        let id = shoal_storage::chunk::ChunkId::of(b"chunk");
        for (frame, forward) in [
            (vec![], vec![]),
            (vec![1u8, 2, 3], vec![7u64]),
            (
                (0..5000).map(|i| i as u8).collect::<Vec<u8>>(),
                vec![2, 3, 9],
            ),
        ] {
            let owned = encode(&Request::Chunk(ChunkRequest::PutChain {
                id,
                frame: frame.clone(),
                forward: forward.clone(),
            }));
            assert_eq!(encode_put_chain(&id, &frame, &forward), owned);
            match decode::<Request>(&owned) {
                Ok(Request::Chunk(ChunkRequest::PutChain {
                    id: back,
                    frame: f,
                    forward: w,
                })) => assert_eq!((back, f, w), (id, frame, forward)),
                other => panic!("decoded as {other:?}"),
            }
        }
    }

    #[test]
    fn relayed_gpu_samples_survive_bincode() {
        let gpus = vec![GpuTelemetry {
            index: 3,
            util_pct: 97,
            temp_c: 71,
            power_w: 612.5,
            fb_used_mb: 40_000,
            fb_total_mb: 81_559,
            throttle: vec!["HW_THERMAL_SLOWDOWN".into()],
            job: None,
            job_name: None,
        }];
        let b = encode(&Response::GpuTelemetry(gpus.clone()));
        match decode::<Response>(&b) {
            Ok(Response::GpuTelemetry(back)) => assert_eq!(back, gpus),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode::<Request>(&encode(&Request::GpuTelemetry)),
            Ok(Request::GpuTelemetry)
        ));
    }

    #[test]
    fn truncated_and_garbage_messages_are_errors() {
        let b = encode(&Request::Query(Query::Status));
        assert!(decode::<Request>(&b).is_ok());
        assert!(decode::<Request>(&b[..b.len() - 1]).is_err());
        assert!(decode::<Request>(&[0xff; 64]).is_err());
    }

    /// API types cross the RPC in bincode, which has no field names: an
    /// optional field left out when serializing would make every answer
    /// undecodable.
    #[test]
    fn answers_with_optional_fields_unset_round_trip() {
        let event = shoal_sdk::EventInfo {
            id: 1,
            at: "1970-01-01T00:00:00Z".into(),
            at_ms: 0,
            severity: "info".into(),
            kind: "audit".into(),
            node: None,
            gpu: None,
            job: None,
            message: "m".into(),
            resource: None,
            repeats: 0,
        };
        let tenant = shoal_sdk::TenantInfo {
            name: "t".into(),
            parent: None,
            max_gpus: None,
            gpu_hours_limit: None,
            weight: 1,
            created_at: String::new(),
            ledger_limits: None,
        };
        let answers = [
            Response::Events(vec![event]),
            Response::Tenants(vec![tenant]),
        ];
        for answer in answers {
            let back: Response = decode(&encode(&answer)).expect("decodes");
            assert_eq!(format!("{back:?}"), format!("{answer:?}"));
        }
    }

    proptest::proptest! {
        /// Arbitrary bytes on the RPC port decode to a request or are
        /// refused; never a panic, never an allocation past the bound.
        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)) {
            let _ = decode::<Request>(&bytes);
            let _ = decode::<Response>(&bytes);
        }

        /// Well-framed requests with their bytes corrupted, including
        /// length prefixes that claim gigabytes.
        #[test]
        fn corrupted_requests_are_refused_or_decoded(which in 0usize..4, flips in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..6)) {
            let requests = [
                Request::Query(Query::Jobs { tenant: Some("lab".into()), state: None }),
                Request::Write(Command::PutAttr { key: "k".into(), value: "v".repeat(100) }),
                Request::WriteAs { token: UserToken("t".repeat(40)), cmd: Command::CancelJob { job: 7 } },
                Request::Chunk(ChunkRequest::Has { ids: vec![] }),
            ];
            let mut bytes = encode(&requests[which]);
            for (at, value) in flips {
                let len = bytes.len();
                bytes[at % len] = value;
            }
            let _ = decode::<Request>(&bytes);
        }
    }
}
