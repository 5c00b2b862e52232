//! Federation: the JSON types regions exchange and `shoal regions` prints.
//! A region is one Shoal cluster (its own Raft group, ledger and CA); peer
//! regions know each other's CA and API addresses and forward job commands
//! to each other over their HTTPS APIs (docs/federation.md).

use serde::{Deserialize, Serialize};

/// Request header: run this request in the named region (`auto`: the node
/// picks the region where the job fits soonest; only on submissions).
pub const REGION_HEADER: &str = "x-shoal-region";
/// Request header a peer region sets when it forwards a tenant-scoped
/// caller's request: the receiving region narrows the peer's credential to
/// this tenant, so a forwarded request never does more than the caller's
/// own token allowed in its home region. Every forwarded request names
/// one, and only a tenant both regions share (one with caps across
/// regions, under the same home region) is accepted: a peer's credential
/// never acts as an admin, nor as a same-named tenant local to a region.
pub const TENANT_HEADER: &str = "x-shoal-forwarded-tenant";
/// The `--region` value that lets the node choose.
pub const AUTO_REGION: &str = "auto";
/// The region of a cluster bootstrapped without `--region`.
pub const DEFAULT_REGION: &str = "default";

/// Accelerators of one model in a region.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GpuModelCapacity {
    pub model: String,
    pub total: u32,
    pub free: u32,
    /// Free GPUs of this model on each node that has any, largest first:
    /// what placement across regions needs to know whether a gang of N
    /// nodes × G GPUs fits now (bounded, see [`MAX_SUMMARY_NODES`]).
    #[serde(default)]
    pub free_per_node: Vec<u32>,
}

/// Most nodes listed per model in a summary: a summary stays a few KiB
/// however large the region.
pub const MAX_SUMMARY_NODES: usize = 1024;

/// What a region tells its peers about itself (`GET /v1/federation/summary`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RegionSummary {
    pub region: String,
    pub cluster_id: String,
    /// The release of the node that answered.
    pub version: String,
    /// When the answering node made it (its wall clock, ms since the epoch).
    pub generated_at_ms: u64,
    /// The ledger index the summary reflects: a peer keeps the newest.
    pub ledger_index: u64,
    pub gpus: Vec<GpuModelCapacity>,
    pub pending_jobs: u32,
    /// GPUs the pending jobs ask for in total.
    pub pending_gpus: u64,
    pub running_jobs: u32,
    /// Centroid of the region's nodes' Vivaldi coordinates (seconds;
    /// Euclidean part, then height), when any are known.
    pub centroid: Option<Vec<f64>>,
    /// API URLs of the region's alive members: where a peer sends
    /// forwarded commands next.
    pub api_urls: Vec<String>,
    /// Jobs of other regions this region has taken over from its copies
    /// of their checkpoints: their own region must stop them.
    #[serde(default)]
    pub adopted: Vec<AdoptedJob>,
    /// This region's jobs that keep checkpoint copies in other regions and
    /// have not ended: a copy of a job missing here is no longer needed.
    #[serde(default)]
    pub copied_live: Vec<u64>,
    /// The CA certificates (PEM) the region trusts: during its CA rotation
    /// both, so a peer learns the new CA while the old one still vouches
    /// for it.
    #[serde(default)]
    pub trusted_ca_pem: String,
    /// The tenants capped across regions, as this region holds their
    /// caps: its share of each, and the grants of share it has made and
    /// counted (docs/federation.md, "Tenants across regions").
    #[serde(default)]
    pub global_tenants: Vec<GlobalTenantReport>,
}

/// One tenant with caps across regions, in a region's summary.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct GlobalTenantReport {
    pub tenant: String,
    /// The region that defines the tenant and keeps its caps.
    pub home: String,
    /// GPUs held at once.
    #[serde(default)]
    pub gpus: Option<GlobalAccountReport>,
    /// GPU-seconds committed (the budget).
    #[serde(default)]
    pub gpu_seconds: Option<GlobalAccountReport>,
    /// The tenant's definition, when the summarising region is its home:
    /// the other regions create or update the tenant from it.
    #[serde(default)]
    pub definition: Option<GlobalTenantDefinition>,
}

/// One cap of a tenant across regions, as a region holds it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct GlobalAccountReport {
    /// The cap, all regions together.
    pub cap: u64,
    /// The summarising region's share of it.
    pub share: u64,
    /// What the tenant (with the tenants below it) holds or has committed
    /// there, and what its waiting jobs there ask for.
    pub in_use: u64,
    pub demand: u64,
    /// Share granted to each other region, in total ever.
    #[serde(default)]
    pub given: std::collections::BTreeMap<String, u64>,
    /// Share counted from each other region, in total ever.
    #[serde(default)]
    pub received: std::collections::BTreeMap<String, u64>,
}

/// A tenant's limits as its home region defines them (each applies in
/// every region on its own, as per-region limits).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct GlobalTenantDefinition {
    pub parent: Option<String>,
    pub max_gpus: Option<u32>,
    pub gpu_seconds_limit: Option<u64>,
    pub weight: u32,
    pub max_pending_jobs: Option<u32>,
    pub max_objects: Option<u32>,
    pub max_manifest_bytes: Option<u64>,
    pub max_priority: Option<i32>,
}

/// `shoal tenant global --json`: a tenant with caps across regions as this
/// region sees it, with each federated region's share from its latest
/// summary.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GlobalTenantInfo {
    pub tenant: String,
    pub home: String,
    /// The GPU cap, all regions together.
    pub gpus: Option<u32>,
    /// The GPU-hour budget, all regions together.
    pub gpu_hours: Option<f64>,
    /// This region first, then each peer region that reported the tenant.
    pub regions: Vec<GlobalTenantRegion>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GlobalTenantRegion {
    pub region: String,
    /// The region's share of the GPU cap, GPUs held there, GPUs waited for.
    pub share: Option<u32>,
    pub in_use: u32,
    pub demand: u32,
    /// The region's share of the budget, and GPU-hours committed there
    /// (finished use plus running jobs' time limits).
    pub gpu_hours_share: Option<f64>,
    pub gpu_hours_committed: f64,
    /// Whether the figures are this region's own (else a peer's summary).
    pub local: bool,
    /// Whether that peer answers now.
    pub reachable: bool,
}

/// A job a region took over from another region (`--ckpt-replicas L+R`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct AdoptedJob {
    /// The region the job came from, and its id there.
    pub origin: String,
    pub origin_job: u64,
    /// Its id in the region that took it.
    pub job: u64,
}

/// What `POST /v1/federation/copies/missing` asks and answers: chunk ids
/// (hex) of a checkpoint copy, and those the receiving node lacks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ChunkList {
    pub chunks: Vec<String>,
}

impl RegionSummary {
    pub fn gpus_total(&self) -> u32 {
        self.gpus.iter().map(|g| g.total).sum()
    }

    pub fn gpus_free(&self) -> u32 {
        self.gpus.iter().map(|g| g.free).sum()
    }
}

/// GPUs of one model in `shoal regions`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GpuModelCount {
    pub model: String,
    pub total: u32,
    pub free: u32,
}

/// One row of `shoal regions --json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RegionInfo {
    pub name: String,
    /// The region of the node that answered.
    pub local: bool,
    pub reachable: bool,
    /// Round trip of the last summary request (none for the local region).
    pub rtt_ms: Option<f64>,
    pub gpus_total: u32,
    pub gpus_free: u32,
    pub gpus: Vec<GpuModelCount>,
    /// Queue length: jobs waiting to be placed.
    pub pending: u32,
    pub running: u32,
    /// When the summary shown was made (RFC 3339), and how old it is.
    pub last_summary_at: Option<String>,
    pub last_summary_age_ms: Option<u64>,
    pub version: Option<String>,
    /// Why the region is unreachable (its last failed request).
    pub error: Option<String>,
}

/// What one region tells another about itself when they federate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PeerBundle {
    pub region: String,
    pub cluster_id: String,
    /// The region's cluster CA (PEM): its nodes' API certificates chain to it.
    pub ca_cert_pem: String,
    pub api_urls: Vec<String>,
}

/// `POST /v1/federation/join` (admin): federate this region with the one
/// at `url`, proving admin there with `token`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FederationJoinRequest {
    pub url: String,
    pub token: String,
    /// The peer's CA as the CLI learned it (pinned or first use); required
    /// for an https URL.
    pub ca_pem: Option<String>,
}

/// Answer to a join: the peer region's name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FederationJoinResponse {
    pub region: String,
    pub cluster_id: String,
}

/// `POST /v1/tenants/{name}/adopt` (`shoal tenant adopt NAME --from
/// REGION`, admin): this region's own tenant NAME becomes the tenant
/// REGION (its home) shares across regions.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TenantAdoptRequest {
    pub from: String,
}

/// `POST /v1/federation/peers` (admin of the receiving region): the joining
/// region's bundle and the secret the receiver uses to call it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PeerRegisterRequest {
    pub bundle: PeerBundle,
    pub secret: String,
}

/// The receiver's bundle and the secret the joiner uses to call it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PeerRegisterResponse {
    pub bundle: PeerBundle,
    pub secret: String,
}

/// Answer to `shoal federation leave`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FederationLeaveResponse {
    pub region: String,
    /// Whether the peer region was told (it drops this region too).
    pub peer_told: bool,
    pub index: u64,
}

/// A job id as commands accept it: `42` (the region asked, else the local
/// one) or `eu-1:42` (job 42 of region eu-1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionJobId {
    pub region: Option<String>,
    pub id: u64,
}

impl std::str::FromStr for RegionJobId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (region, id) = match s.rsplit_once(':') {
            Some((r, id)) if !r.is_empty() => (Some(r.to_string()), id),
            Some(_) => return Err(format!("'{s}' names no region before ':'")),
            None => (None, s),
        };
        let id = id
            .parse()
            .map_err(|_| format!("'{s}' is not a job id (N or REGION:N)"))?;
        Ok(RegionJobId { region, id })
    }
}

impl std::fmt::Display for RegionJobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.region {
            Some(r) => write!(f, "{r}:{}", self.id),
            None => write!(f, "{}", self.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_parse_with_and_without_region() {
        let plain: RegionJobId = "42".parse().expect("plain");
        assert_eq!(
            plain,
            RegionJobId {
                region: None,
                id: 42
            }
        );
        let remote: RegionJobId = "eu-1:42".parse().expect("remote");
        assert_eq!(remote.region.as_deref(), Some("eu-1"));
        assert_eq!(remote.to_string(), "eu-1:42");
        assert!(":42".parse::<RegionJobId>().is_err());
        assert!("eu-1:x".parse::<RegionJobId>().is_err());
        assert!("".parse::<RegionJobId>().is_err());
    }
}

/// `POST /v1/federation/regions/{region}/failover`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FailoverResponse {
    pub region: String,
    /// The jobs taken over, each with its new id here.
    pub adopted: Vec<AdoptedJob>,
    /// Jobs that could not be taken over, and why.
    pub refused: Vec<String>,
    /// They start no earlier than this long from now (the lost region's
    /// lease on them, and a margin).
    pub starts_after_ms: u64,
}
