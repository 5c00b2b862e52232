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
}

impl Default for FederationTuning {
    fn default() -> Self {
        FederationTuning {
            summary_interval_ms: 2_000,
            request_timeout_ms: 5_000,
            unreachable_after_ms: 10_000,
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
        Ok(())
    }
}
