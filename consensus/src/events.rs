//! The cluster's event log: anomalies and state changes worth a human's
//! attention, bounded, de-duplicated and rate-limited inside `apply` so a
//! flapping GPU cannot flood the ledger.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use crate::types::NodeId;

/// The kind of the events that record admin actions and refused requests.
pub const AUDIT: &str = "audit";

/// Events kept; older ones are dropped first.
pub const MAX_EVENTS: usize = 1000;
/// The same kind of event for the same node and GPU is recorded at most once
/// in this window.
pub const DEDUP_WINDOW_MS: u64 = 60_000;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// What a detector reports.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub severity: Severity,
    /// Stable machine-readable kind, e.g. `gpu_ecc_dbe`, `node_down`.
    pub kind: String,
    pub node: Option<NodeId>,
    pub gpu: Option<u32>,
    pub job: Option<u64>,
    pub message: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub id: u64,
    pub at_ms: u64,
    pub spec: EventSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct EventLog {
    pub events: VecDeque<Event>,
    pub next_id: u64,
}

impl EventLog {
    /// Records `spec` unless the same kind for the same node and GPU was
    /// recorded within [`DEDUP_WINDOW_MS`]. Returns the new event's id.
    pub fn record(&mut self, spec: &EventSpec, now_ms: u64) -> Option<u64> {
        if spec.kind.is_empty() || spec.kind.len() > 64 || spec.message.len() > 1024 {
            return None;
        }
        // An audit record is about one request: only the very same message
        // is a repeat.
        let duplicate = self.events.iter().rev().any(|e| {
            e.spec.kind == spec.kind
                && e.spec.node == spec.node
                && e.spec.gpu == spec.gpu
                && e.spec.job == spec.job
                && (spec.kind != AUDIT || e.spec.message == spec.message)
                && now_ms.saturating_sub(e.at_ms) < DEDUP_WINDOW_MS
        });
        if duplicate {
            return None;
        }
        let id = self.next_id.max(1);
        self.next_id = id + 1;
        self.events.push_back(Event {
            id,
            at_ms: now_ms,
            spec: spec.clone(),
        });
        while self.events.len() > MAX_EVENTS {
            self.events.pop_front();
        }
        Some(id)
    }

    /// Events with an id above `after`, oldest first.
    pub fn after(&self, after: u64) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.id > after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ecc(node: NodeId, gpu: u32) -> EventSpec {
        EventSpec {
            severity: Severity::Critical,
            kind: "gpu_ecc_dbe".into(),
            node: Some(node),
            gpu: Some(gpu),
            job: None,
            message: "double-bit ECC error".into(),
        }
    }

    #[test]
    fn duplicates_within_the_window_are_dropped_and_the_log_is_bounded() {
        let mut log = EventLog::default();
        assert_eq!(log.record(&ecc(1, 0), 1_000), Some(1));
        assert_eq!(log.record(&ecc(1, 0), 2_000), None);
        assert_eq!(log.record(&ecc(1, 1), 2_000), Some(2));
        assert_eq!(log.record(&ecc(1, 0), 1_000 + DEDUP_WINDOW_MS), Some(3));
        for i in 0..(MAX_EVENTS as u32 + 10) {
            log.record(&ecc(2, i), 100_000);
        }
        assert_eq!(log.events.len(), MAX_EVENTS);
        assert_eq!(log.after(log.next_id - 2).count(), 1);
    }
}
