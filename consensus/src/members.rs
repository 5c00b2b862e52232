//! The cluster's members as the ledger records them: what each node tells
//! the cluster about itself and the state the cluster holds it in.

use serde::{Deserialize, Serialize};
use shoal_sdk::{GpuInfo, MemberState};
use std::collections::BTreeMap;

use crate::ids::NodeId;

/// Cluster-wide facts fixed at bootstrap.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ClusterInfo {
    pub cluster_id: String,
    pub region: String,
    /// The certificate of the cluster CA that signs: joiners' and renewed
    /// certificates, and what new join tokens pin. During a rotation
    /// (the `ca` module) the cluster trusts another CA too. Private keys are
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
