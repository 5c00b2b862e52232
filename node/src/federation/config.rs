//! `[federation]`: how often peer regions are asked for their summaries and
//! how long a cross-region request may take.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct FederationTuning {
    /// Every node pulls each peer region's summary this often.
    pub summary_interval_ms: u64,
    /// The longest one cross-region request (summary or forwarded command)
    /// may take, all of the peer's addresses tried included.
    pub request_timeout_ms: u64,
    /// A peer silent for longer than this is unreachable.
    pub unreachable_after_ms: u64,
    /// A region that holds a copy of one of this region's jobs must have
    /// answered a summary request asked for less than this long ago for
    /// the job's ranks to run here; the region places a job it takes over
    /// no earlier than this (plus a margin) after the takeover commits.
    pub region_lease_ms: u64,
    /// A peer region unreachable this long is lost: this region takes over
    /// the peer's jobs it holds checkpoint copies of.
    pub region_failover_after_ms: u64,
}

impl Default for FederationTuning {
    fn default() -> Self {
        FederationTuning {
            summary_interval_ms: 2_000,
            request_timeout_ms: 5_000,
            unreachable_after_ms: 10_000,
            region_lease_ms: 30_000,
            region_failover_after_ms: 60_000,
        }
    }
}

impl FederationTuning {
    pub fn validate(&self) -> Result<(), String> {
        if self.summary_interval_ms == 0 || self.request_timeout_ms == 0 {
            return Err(
                "federation.summary_interval_ms and request_timeout_ms must be positive".into(),
            );
        }
        if self.unreachable_after_ms < self.summary_interval_ms {
            return Err(format!(
                "federation.unreachable_after_ms ({}) must be at least summary_interval_ms ({})",
                self.unreachable_after_ms, self.summary_interval_ms
            ));
        }
        if self.region_lease_ms < self.summary_interval_ms.saturating_mul(2) {
            return Err(format!(
                "federation.region_lease_ms ({}) must be at least two summary intervals ({})",
                self.region_lease_ms,
                self.summary_interval_ms.saturating_mul(2)
            ));
        }
        if self.region_failover_after_ms < self.unreachable_after_ms {
            return Err(format!(
                "federation.region_failover_after_ms ({}) must be at least unreachable_after_ms ({})",
                self.region_failover_after_ms, self.unreachable_after_ms
            ));
        }
        Ok(())
    }

    /// How long after committing a takeover this region waits before
    /// placing the job: the origin's lease, the serving node's staleness
    /// bound and a margin for clock rates and the origin's fence tick.
    pub fn takeover_wait_ms(&self) -> u64 {
        self.region_lease_ms
            .saturating_add(shoal_consensus::workload::SELF_FENCE_MS)
            .saturating_add(1_000)
    }
}
