//! Federation in the ledger: the peer regions this region trusts.
//!
//! A region is one cluster. Federating two regions records, in each one's
//! ledger, the other's name, cluster CA, API addresses and two secrets: the
//! one this region presents when it calls the peer, and the hash of the one
//! the peer presents here (kept as an API token named `region-<peer>`, so
//! the usual token lookup finds it and `shoal token api ls` shows it). What
//! a peer's credential may do is decided by the API, not by the token: it
//! proves which region calls, and only the forwarding routes accept it.
//! Nothing of a peer's own ledger is replicated here; summaries and
//! forwarded commands travel over the API (docs/federation.md).
//!
//! [`placement`] and [`crate::escrow::shares`] are pure functions over region summaries.

pub mod copies;
pub mod global_tenants;
pub mod placement;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most peer regions one region records.
pub const MAX_PEERS: usize = 64;
/// Most API URLs recorded per peer.
pub const MAX_PEER_URLS: usize = 64;
/// Longest API URL recorded.
pub const MAX_URL: usize = 256;
/// Largest CA certificate (PEM) recorded.
pub const MAX_CA_PEM: usize = 16 * 1024;
/// Longest region name: a DNS label short enough that `region-<name>`
/// is a valid token name.
pub const MAX_REGION_NAME: usize = 48;

/// A peer region as this region knows it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PeerRegion {
    pub name: String,
    pub cluster_id: String,
    /// The peer's cluster CA: its API certificates must chain to it.
    pub ca_cert_pem: String,
    /// The peer's API URLs at the time of the join; the summaries it sends
    /// keep the nodes' in-memory list current.
    pub api_urls: Vec<String>,
    /// The hash of the secret this region presents to the peer
    /// ([`crate::tokens::hash_secret`]). The secret itself is in the data
    /// directory of this region's nodes, never in the ledger (so in no
    /// snapshot, backup or log entry): the node that made the join keeps
    /// it, and the others fetch it from a member and check it against this
    /// hash. A ledger of an older release held the secret itself here
    /// ([`is_clear_secret`]); its nodes keep it on disk and the leader
    /// seals it (`Command::SealPeerSecret`) once every member speaks
    /// [`SEALED_SECRETS_SINCE_PROTOCOL`]. The peer holds only its hash, and
    /// `federation leave` (or revoking `region-<us>` there) ends it.
    pub outbound_secret_hash: String,
    /// The hash of the secret the peer presents here (an API token).
    pub inbound_token_hash: String,
    pub joined_at_ms: u64,
}

impl PeerRegion {
    /// The name of the API token the peer's secret is kept as.
    pub fn token_name(&self) -> String {
        token_name(&self.name)
    }
}

/// The protocol from which a peer region's secret is kept out of the
/// ledger: a join records only its hash, and a secret an older release put
/// in the ledger is replaced by its hash.
pub const SEALED_SECRETS_SINCE_PROTOCOL: u16 = 6;

/// Whether `value`, a peer record's `outbound_secret_hash`, is a secret an
/// older release kept in the ledger in clear rather than its hash: secrets
/// are `sa1.` and hex, hashes hex only.
pub fn is_clear_secret(value: &str) -> bool {
    value.starts_with("sa1.")
}

/// The API token name of peer region `region`'s inbound secret.
pub fn token_name(region: &str) -> String {
    format!("region-{region}")
}

/// The peer regions of this region.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct FederationState {
    pub peers: BTreeMap<String, PeerRegion>,
    /// Copies of this region's jobs' checkpoints in peer regions: the
    /// newest step each region holds (0 while the first is on its way).
    pub copies_out: BTreeMap<crate::workload::JobId, BTreeMap<String, u64>>,
    /// Copies of peer regions' jobs held here, by region and job id there.
    pub foreign: BTreeMap<String, BTreeMap<crate::workload::JobId, copies::ForeignJob>>,
}

impl FederationState {
    /// The peer region whose inbound secret has hash `hash`.
    pub fn peer_by_token_hash(&self, hash: &str) -> Option<&PeerRegion> {
        self.peers.values().find(|p| p.inbound_token_hash == hash)
    }
}

/// Checks a region name: a DNS label, so it is safe in job ids
/// (`REGION:ID`), token names, URLs and metrics; never `auto`.
pub fn validate_region_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_REGION_NAME {
        return Err(format!(
            "region names are 1-{MAX_REGION_NAME} characters, got {}",
            name.len()
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        || name.starts_with('-')
    {
        return Err(format!(
            "region name '{name}' may only contain lowercase letters, digits and '-' (not first)"
        ));
    }
    if name == shoal_sdk::AUTO_REGION {
        return Err("'auto' is not a region name: `--region auto` lets Shoal choose".into());
    }
    Ok(())
}
