//! Federation across regions (docs/federation.md): a region is one cluster;
//! peer regions exchange trust bundles once (`shoal federation join`), then
//! every node pulls each peer's summary (the workers' summary pull loop),
//! answers `shoal regions`, forwards job commands with `--region R|auto`
//! and serves its own region's summary (the API's federation routes).
//!
//! This module is what a node does with its peer regions, given the whole
//! node: find them, call them, refresh their summaries, and copy
//! checkpoints to them ([`copy`]). The state it works on sits lower, in
//! [`crate::federation`]; the summary pull loop and the API's federation
//! routes live with the other loops and routes (`workers/federation.rs`,
//! `api/federation/`).

pub mod copy;

use crate::federation::link::{self, LinkError, PeerTarget};
use crate::federation::{secrets, summary};
use crate::node::Node;
use shoal_consensus::federation::PeerRegion;
use shoal_sdk::RegionSummary;
use std::time::Duration;

/// This node's region: the ledger's (fixed at bootstrap), else the
/// configured one before the ledger has it.
pub fn local_region(node: &Node) -> String {
    node.ledger()
        .read()
        .ok()
        .and_then(|d| d.ledger.cluster.as_ref().map(|c| c.region.clone()))
        .unwrap_or_else(|| node.config().region.clone())
}

/// The peer regions in this node's ledger.
pub fn peers(node: &Node) -> Vec<PeerRegion> {
    node.ledger()
        .read()
        .map(|d| d.ledger.federation.peers.values().cloned().collect())
        .unwrap_or_default()
}

/// How to reach `peer`: the addresses its latest summary named (else the
/// ones recorded at the join), its CA and this region's secret, from this
/// node's data directory ([`secrets`]; empty while it lacks it).
pub fn target(node: &Node, peer: &PeerRegion) -> PeerTarget {
    let urls = node.federation().tracker().urls(&peer.name, &peer.api_urls);
    PeerTarget {
        region: peer.name.clone(),
        urls,
        ca_pem: peer.ca_cert_pem.clone(),
        secret: secrets::load(node.data_dir(), peer).unwrap_or_default(),
        wan_delay: node
            .config()
            .test_inject_wan
            .get(&peer.name)
            .copied()
            .unwrap_or_default(),
    }
}

/// The peer region named `region`, or the error a caller should see.
pub fn peer_named(node: &Node, region: &str) -> Result<PeerRegion, String> {
    peers(node)
        .into_iter()
        .find(|p| p.name == region)
        .ok_or_else(|| {
            format!("no peer region named '{region}' (`shoal regions` lists this region's peers)")
        })
}

/// Records the CAs `peer` says it trusts when they differ from the ones
/// its answer was checked against: during the peer's CA rotation its
/// nodes' certificates chain to the old CA too, so the peer's new CA is
/// learned over a link the old one authenticated, and the link keeps
/// working after the old CA retires. The leader proposes it, once per
/// change (the others see it applied); a peer that stayed unreachable
/// through a whole rotation needs a new `federation join`.
async fn learn_peer_ca(node: &Node, peer: &PeerRegion, trusted_ca_pem: &str) {
    if trusted_ca_pem.trim_end().is_empty()
        || trusted_ca_pem.trim_end() == peer.ca_cert_pem.trim_end()
        || !node.ledger().is_leader()
    {
        return;
    }
    let cmd = shoal_consensus::Command::SetPeerCa {
        region: peer.name.clone(),
        ca_cert_pem: trusted_ca_pem.to_string(),
    };
    match node.ledger().write(cmd).await {
        Ok((shoal_consensus::LedgerResponse::Ok, _)) => {
            tracing::info!(region = %peer.name, "a peer region's CA certificates changed; recorded")
        }
        Ok((answer, _)) => {
            tracing::warn!(region = %peer.name, ?answer, "a peer region's new CA was not recorded")
        }
        Err(e) => {
            tracing::debug!(region = %peer.name, error = %e.message, "a peer region's new CA is not committed yet")
        }
    }
}

/// The longest one cross-region request may take.
pub fn request_timeout(node: &Node) -> Duration {
    Duration::from_millis(node.config().federation.request_timeout_ms)
}

/// This region's summary as this node's replica of the ledger has it.
pub fn local_summary(node: &Node) -> Result<RegionSummary, String> {
    let coordinates = match node.peers().lock() {
        Ok(view) => {
            let ids: Vec<_> = node
                .ledger()
                .read()
                .map(|d| d.ledger.active_members().map(|m| m.id).collect())
                .unwrap_or_default();
            ids.into_iter()
                .filter_map(|id| view.coordinate_of(id, node.id()))
                .map(|c| (c.vec, c.height))
                .collect()
        }
        Err(_) => Vec::new(),
    };
    let d = node.ledger().read().map_err(|e| e.message)?;
    let ctx = summary::SummaryContext {
        ledger_index: d.last_applied.map(|l| l.index).unwrap_or_default(),
        now_ms: crate::clock::wall_ms(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        coordinates,
    };
    Ok(summary::region_summary(&d.ledger, &ctx))
}

/// Asks `peer` for its summary and records the answer (or the failure) in
/// this node's tracker.
pub async fn refresh_peer(node: &Node, peer: &PeerRegion) -> Result<(), LinkError> {
    let target = target(node, peer);
    let req = link::PeerRequest {
        method: reqwest::Method::GET,
        path: "/v1/federation/summary",
        body: None,
        tenant: None,
        binary: false,
    };
    let asked = std::time::Instant::now();
    let outcome = node
        .federation()
        .send(&target, &req, request_timeout(node))
        .await
        .and_then(|resp| {
            let fail = |detail: String| LinkError::Setup {
                region: peer.name.clone(),
                detail,
            };
            if resp.status != 200 {
                return Err(fail(format!(
                    "{} answered HTTP {}: {}",
                    resp.url,
                    resp.status,
                    String::from_utf8_lossy(&resp.body)
                )));
            }
            let summary: RegionSummary = serde_json::from_slice(&resp.body)
                .map_err(|e| fail(format!("{} sent no summary: {e}", resp.url)))?;
            if summary.region != peer.name {
                return Err(fail(format!(
                    "{} answers for region '{}', not '{}'",
                    resp.url, summary.region, peer.name
                )));
            }
            Ok((summary, resp.rtt))
        });
    let now = crate::clock::wall_ms();
    match outcome {
        Ok((summary, rtt)) => {
            let trusted_ca_pem = summary.trusted_ca_pem.clone();
            let own = local_region(node);
            let taken = summary
                .adopted
                .iter()
                .filter(|a| a.origin == own)
                .map(|a| a.origin_job)
                .collect();
            node.federation().leases().renew(&peer.name, asked, taken);
            let newest = node
                .federation()
                .update(|t| t.record_summary(&peer.name, summary, rtt.as_secs_f64() * 1000.0, now));
            // A lagging node of the peer, or an answer overtaken by a newer
            // one, may still name the CAs trusted before a rotation ended;
            // recording them would widen trust again until the next pull.
            if newest {
                learn_peer_ca(node, peer, &trusted_ca_pem).await;
            }
            Ok(())
        }
        Err(e) => {
            node.federation()
                .update(|t| t.record_failure(&peer.name, e.to_string()));
            Err(e)
        }
    }
}
