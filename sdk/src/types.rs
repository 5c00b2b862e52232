//! API types. Field names are part of the interface contract: changing one
//! breaks scripts, so add fields rather than rename them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A member's state as the cluster agrees on it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    Alive,
    Suspect,
    Down,
    Left,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Down => "down",
            MemberState::Left => "left",
        }
    }
}

impl std::fmt::Display for MemberState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One accelerator as registered in the ledger.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub model: String,
    pub memory_mb: u64,
    pub uuid: String,
    /// The job holding this GPU, if any.
    pub allocated_to: Option<u64>,
    /// NUMA node of the GPU's PCIe root, when known.
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// Indices of GPUs on the same node reachable over NVLink.
    #[serde(default)]
    pub nvlink_peers: Vec<u32>,
    #[serde(default)]
    pub mig_enabled: bool,
}

/// `shoal status --json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct StatusResponse {
    pub cluster_id: String,
    pub region: String,
    pub leader: Option<u64>,
    pub term: u64,
    pub commit_index: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    pub members: Vec<MemberSummary>,
    /// The node that answered.
    pub node_id: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MemberSummary {
    pub id: u64,
    pub name: String,
    pub state: MemberState,
}

/// One row of `shoal nodes --json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NodeInfo {
    pub id: u64,
    pub name: String,
    pub state: MemberState,
    /// RPC address (quinn) peers use.
    pub addr: String,
    pub api_addr: String,
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<GpuInfo>,
    pub gpus_free: u32,
    pub gpus_total: u32,
    /// Milliseconds since the leader last heard from the node.
    pub last_seen_ms: Option<u64>,
    pub voter: bool,
    pub joined_at_ms: u64,
    /// Average GPU utilization (0-1) from the node's latest capacity advert.
    #[serde(default)]
    pub gpu_util: Option<f32>,
}

/// One row of `shoal mesh --json`: how the answering node sees a peer,
/// from gossip alone (no leader involved).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct PeerView {
    pub id: u64,
    pub name: String,
    /// The answering node's own failure detector: alive, suspect, down, or
    /// unknown (not heard from yet).
    pub state: String,
    /// Milliseconds since the last gossip message (or Raft ack) from it.
    pub last_heard_ms: Option<u64>,
    /// RTT estimated from Vivaldi coordinates.
    pub rtt_ms: Option<f64>,
    pub gpus_free: Option<u32>,
    pub gpus_total: Option<u32>,
    /// Average GPU utilization, 0-1, from the peer's capacity advert.
    pub load: Option<f32>,
}

/// `POST /v1/tokens` body.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct TokenCreateRequest {
    /// Lifetime in seconds; the server applies its default when absent.
    pub ttl_s: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct TokenCreateResponse {
    pub token: String,
    pub expires_at_ms: u64,
}

/// `POST /v1/attrs` body: a small cluster attribute (used by operators for
/// annotations and by `shoal bench ledger` as the unit of write).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct AttrPut {
    pub key: String,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct WriteResponse {
    /// Log index at which the write was committed.
    pub index: u64,
}

/// Error body of every non-2xx API answer.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ApiErrorBody {
    pub code: String,
    pub message: String,
}
