//! What this node knows of its peer regions: their latest summaries, the
//! WAN round trip of the last request, and whether each still answers.
//! Pure (`now_ms` is passed in), kept in memory: every node pulls the
//! summaries itself, so any node answers `shoal regions` and places
//! `--region auto` jobs without asking another.

use shoal_sdk::{GpuModelCount, RegionInfo, RegionSummary};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Consecutive failed requests after which a region is unreachable even
/// if its last summary is still young: a region that refuses connections
/// is known lost at the next request, not after the whole window.
pub const FAILURES_TO_UNREACHABLE: u32 = 2;

/// One peer region as this node saw it.
#[derive(Clone, Debug, Default)]
pub struct PeerStatus {
    pub summary: Option<RegionSummary>,
    /// When (this node's clock) the region last answered.
    pub last_ok_ms: Option<u64>,
    pub rtt_ms: Option<f64>,
    pub failures_in_a_row: u32,
    pub last_error: Option<String>,
}

/// All peer regions, by name.
#[derive(Clone, Debug)]
pub struct RegionTracker {
    peers: BTreeMap<String, PeerStatus>,
    /// A region silent for longer than this is unreachable.
    unreachable_after_ms: u64,
}

/// The tracker as the node shares it between the worker and the API.
pub type SharedRegions = Arc<Mutex<RegionTracker>>;

impl RegionTracker {
    pub fn new(unreachable_after_ms: u64) -> Self {
        RegionTracker {
            peers: BTreeMap::new(),
            unreachable_after_ms,
        }
    }

    /// The region answered with `summary` after `rtt_ms`. An answer that
    /// reflects an older ledger than the summary already held (a slow
    /// response overtaken by a newer one, or a lagging node's) proves the
    /// region is alive but does not replace the newer summary. Returns
    /// whether `summary` is now the one held, so that nothing is learned
    /// from an overtaken one.
    pub fn record_summary(
        &mut self,
        region: &str,
        summary: RegionSummary,
        rtt_ms: f64,
        now_ms: u64,
    ) -> bool {
        let p = self.peers.entry(region.to_string()).or_default();
        let newer = p.summary.as_ref().is_none_or(|old| {
            (summary.ledger_index, summary.generated_at_ms)
                >= (old.ledger_index, old.generated_at_ms)
                || summary.cluster_id != old.cluster_id
        });
        if newer {
            p.summary = Some(summary);
        }
        p.last_ok_ms = Some(p.last_ok_ms.map_or(now_ms, |t| t.max(now_ms)));
        p.rtt_ms = Some(rtt_ms);
        p.failures_in_a_row = 0;
        p.last_error = None;
        newer
    }

    /// A request to the region failed (`error` says how).
    pub fn record_failure(&mut self, region: &str, error: String) {
        let p = self.peers.entry(region.to_string()).or_default();
        p.failures_in_a_row = p.failures_in_a_row.saturating_add(1);
        p.last_error = Some(error);
    }

    /// Forgets regions that are no longer peers.
    pub fn retain(&mut self, peers: &[String]) {
        self.peers.retain(|name, _| peers.contains(name));
    }

    pub fn status(&self, region: &str) -> Option<&PeerStatus> {
        self.peers.get(region)
    }

    /// Whether the region answered within the window and its latest
    /// requests did not keep failing.
    pub fn reachable(&self, region: &str, now_ms: u64) -> bool {
        self.peers.get(region).is_some_and(|p| {
            p.failures_in_a_row < FAILURES_TO_UNREACHABLE
                && p.last_ok_ms
                    .is_some_and(|t| now_ms.saturating_sub(t) <= self.unreachable_after_ms)
        })
    }

    /// API URLs to reach the region: its latest summary's, else `fallback`
    /// (what the ledger recorded at the join).
    pub fn urls(&self, region: &str, fallback: &[String]) -> Vec<String> {
        self.peers
            .get(region)
            .and_then(|p| p.summary.as_ref())
            .map(|s| s.api_urls.clone())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| fallback.to_vec())
    }

    /// The summaries held, with reachability and RTT, by region name.
    pub fn summaries(&self, now_ms: u64) -> Vec<(RegionSummary, bool, Option<f64>)> {
        self.peers
            .iter()
            .filter_map(|(name, p)| {
                p.summary
                    .clone()
                    .map(|s| (s, self.reachable(name, now_ms), p.rtt_ms))
            })
            .collect()
    }

    /// `shoal regions`' row for peer `region`.
    pub fn info(&self, region: &str, now_ms: u64) -> RegionInfo {
        let p = self.peers.get(region).cloned().unwrap_or_default();
        let mut row = match &p.summary {
            Some(s) => summary_row(s, false),
            None => RegionInfo {
                name: region.to_string(),
                local: false,
                reachable: false,
                rtt_ms: None,
                gpus_total: 0,
                gpus_free: 0,
                gpus: Vec::new(),
                pending: 0,
                running: 0,
                last_summary_at: None,
                last_summary_age_ms: None,
                version: None,
                error: None,
            },
        };
        row.name = region.to_string();
        row.reachable = self.reachable(region, now_ms);
        row.rtt_ms = p.rtt_ms;
        row.last_summary_age_ms = p.last_ok_ms.map(|t| now_ms.saturating_sub(t));
        row.error = match (&p.last_error, row.reachable) {
            (Some(e), _) => Some(e.clone()),
            (None, false) if p.last_ok_ms.is_none() => Some("no summary received yet".into()),
            (None, false) => Some(format!(
                "no summary for {} ms",
                row.last_summary_age_ms.unwrap_or_default()
            )),
            (None, true) => None,
        };
        row
    }
}

/// A region's row of `shoal regions` from its summary.
pub fn summary_row(s: &RegionSummary, local: bool) -> RegionInfo {
    RegionInfo {
        name: s.region.clone(),
        local,
        reachable: true,
        rtt_ms: None,
        gpus_total: s.gpus_total(),
        gpus_free: s.gpus_free(),
        gpus: s
            .gpus
            .iter()
            .map(|g| GpuModelCount {
                model: g.model.clone(),
                total: g.total,
                free: g.free,
            })
            .collect(),
        pending: s.pending_jobs,
        running: s.running_jobs,
        last_summary_at: Some(crate::clock::rfc3339(s.generated_at_ms)),
        last_summary_age_ms: Some(0),
        version: Some(s.version.clone()),
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn summary(index: u64, at: u64, free: u32) -> RegionSummary {
        RegionSummary {
            region: "eu".into(),
            cluster_id: "c".into(),
            version: "0".into(),
            generated_at_ms: at,
            ledger_index: index,
            gpus: vec![shoal_sdk::GpuModelCapacity {
                model: "H100".into(),
                total: 8,
                free,
                free_per_node: vec![free],
            }],
            pending_jobs: 0,
            pending_gpus: 0,
            running_jobs: 0,
            centroid: None,
            api_urls: vec!["http://127.0.0.1:1".into()],
            adopted: vec![],
            copied_live: vec![],
            trusted_ca_pem: String::new(),
            global_tenants: vec![],
        }
    }

    #[test]
    fn a_region_never_heard_is_unreachable() {
        let t = RegionTracker::new(5_000);
        assert!(!t.reachable("eu", 0));
        assert_eq!(
            t.info("eu", 0).error.as_deref(),
            Some("no summary received yet")
        );
    }

    #[test]
    fn silence_past_the_window_makes_a_region_unreachable() {
        let mut t = RegionTracker::new(5_000);
        t.record_summary("eu", summary(1, 1, 4), 3.0, 1_000);
        assert!(t.reachable("eu", 6_000));
        assert!(!t.reachable("eu", 6_001));
    }

    #[test]
    fn repeated_failures_make_a_region_unreachable_at_once() {
        let mut t = RegionTracker::new(60_000);
        t.record_summary("eu", summary(1, 1, 4), 3.0, 1_000);
        t.record_failure("eu", "connection refused".into());
        assert!(t.reachable("eu", 1_100), "one failure is not enough");
        t.record_failure("eu", "connection refused".into());
        assert!(!t.reachable("eu", 1_200));
        assert_eq!(
            t.info("eu", 1_200).error.as_deref(),
            Some("connection refused")
        );
        t.record_summary("eu", summary(2, 2, 4), 3.0, 1_300);
        assert!(
            t.reachable("eu", 1_300),
            "an answer makes it reachable again"
        );
    }

    #[test]
    fn urls_come_from_the_summary_else_the_ledger() {
        let mut t = RegionTracker::new(5_000);
        let fallback = vec!["https://10.0.0.1:7070".to_string()];
        assert_eq!(t.urls("eu", &fallback), fallback);
        t.record_summary("eu", summary(1, 1, 4), 3.0, 1);
        assert_eq!(
            t.urls("eu", &fallback),
            vec!["http://127.0.0.1:1".to_string()]
        );
    }

    #[test]
    fn an_overtaken_summary_is_not_kept_and_says_so() {
        let mut t = RegionTracker::new(5_000);
        assert!(t.record_summary("eu", summary(7, 70, 4), 3.0, 1));
        assert!(!t.record_summary("eu", summary(6, 90, 2), 3.0, 2));
        let kept = t.status("eu").and_then(|p| p.summary.clone());
        assert_eq!(kept.map(|s| s.ledger_index), Some(7));
        assert!(t.reachable("eu", 2), "the late answer still shows it alive");
        let mut rebuilt = summary(1, 1, 4);
        rebuilt.cluster_id = "another cluster".into();
        assert!(
            t.record_summary("eu", rebuilt, 3.0, 3),
            "a region bootstrapped again starts its indexes over"
        );
    }

    proptest! {
        /// Whatever order answers arrive in, the summary kept is the one of
        /// the newest ledger index, and the region is reachable right after
        /// any answer.
        #[test]
        fn the_newest_summary_wins_in_any_arrival_order(
            answers in prop::collection::vec((0u64..50, 0u64..1_000, 0u32..8), 1..20),
        ) {
            let mut t = RegionTracker::new(5_000);
            for (i, (index, at, free)) in answers.iter().enumerate() {
                let now = 10_000 + i as u64;
                t.record_summary("eu", summary(*index, *at, *free), 1.0, now);
                prop_assert!(t.reachable("eu", now));
            }
            let best = answers.iter().map(|(i, at, _)| (*i, *at)).max().expect("answers");
            let kept = t.status("eu").and_then(|p| p.summary.clone()).expect("a summary");
            prop_assert_eq!((kept.ledger_index, kept.generated_at_ms), best);
        }
    }
}
