//! The cluster's event log: anomalies and state changes worth a human's
//! attention, bounded, de-duplicated and rate-limited inside `apply` so a
//! flapping GPU cannot flood the ledger.
//!
//! A repeat within [`DEDUP_WINDOW_MS`] is not recorded again: it is counted
//! on the event it repeats ([`Event::repeats`]). Audit events are repeats
//! only when their message is the same; the message names the token, its
//! tenant, the route and the outcome, and the attempted resource (another
//! tenant's job, say) goes into [`EventSpec::resource`], which is not
//! compared. So a token refused a thousand times a minute, on a thousand
//! different job ids, is one event per route with a count, and cannot push
//! other events out of the bounded log.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use crate::ids::NodeId;

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
    /// What else the event is about, e.g. the job a refused request named
    /// (at most [`MAX_RESOURCE`] bytes). Not compared when de-duplicating:
    /// a repeat keeps the first one's.
    pub resource: Option<String>,
}

/// Longest [`EventSpec::resource`].
pub const MAX_RESOURCE: usize = 256;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub id: u64,
    pub at_ms: u64,
    pub spec: EventSpec,
    /// Repeats within the de-duplication window counted on this event
    /// instead of being recorded again.
    pub repeats: u64,
    /// When the last repeat came (`at_ms` when there was none).
    pub last_at_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct EventLog {
    pub events: VecDeque<Event>,
    pub next_id: u64,
}

impl EventLog {
    /// Records `spec` unless the same kind for the same node, GPU and job
    /// (for audit events: the same message) was recorded within
    /// [`DEDUP_WINDOW_MS`]; a repeat is counted on that event instead.
    /// Returns the new event's id.
    pub fn record(&mut self, spec: &EventSpec, now_ms: u64) -> Option<u64> {
        if spec.kind.is_empty()
            || spec.kind.len() > 64
            || spec.message.len() > 1024
            || spec
                .resource
                .as_ref()
                .is_some_and(|r| r.len() > MAX_RESOURCE)
        {
            return None;
        }
        // An audit record is about one kind of request: only the very same
        // message (token, route, outcome) is a repeat.
        let repeated = self.events.iter_mut().rev().find(|e| {
            e.spec.kind == spec.kind
                && e.spec.node == spec.node
                && e.spec.gpu == spec.gpu
                && e.spec.job == spec.job
                && (spec.kind != AUDIT || e.spec.message == spec.message)
                && now_ms.saturating_sub(e.at_ms) < DEDUP_WINDOW_MS
        });
        if let Some(event) = repeated {
            event.repeats = event.repeats.saturating_add(1);
            event.last_at_ms = event.last_at_ms.max(now_ms);
            return None;
        }
        let id = self.next_id.max(1);
        self.next_id = id + 1;
        self.events.push_back(Event {
            id,
            at_ms: now_ms,
            spec: spec.clone(),
            repeats: 0,
            last_at_ms: now_ms,
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
            resource: None,
        }
    }

    fn refused(token: &str, job: u64) -> EventSpec {
        EventSpec {
            severity: Severity::Warning,
            kind: AUDIT.into(),
            node: Some(1),
            gpu: None,
            job: None,
            message: format!("token '{token}' of tenant 't': GET /v1/jobs/{{id}} refused"),
            resource: Some(format!("job {job}")),
        }
    }

    #[test]
    fn a_token_hammering_refusals_cannot_push_other_events_out() {
        let mut log = EventLog::default();
        let first = log.record(&ecc(1, 0), 1_000).expect("recorded");
        let hammer = log.record(&refused("b", 0), 1_000).expect("recorded");
        for job in 1..(3 * MAX_EVENTS as u64) {
            assert_eq!(log.record(&refused("b", job), 1_000 + job % 50_000), None);
        }
        // Another token's refusal is its own event.
        assert!(log.record(&refused("c", 1), 2_000).is_some());
        assert_eq!(log.events.len(), 3);
        assert_eq!(log.events[0].id, first);
        let counted = &log.events[1];
        assert_eq!(counted.id, hammer);
        assert_eq!(counted.repeats, 3 * MAX_EVENTS as u64 - 1);
        assert_eq!(counted.spec.resource.as_deref(), Some("job 0"));
        // After the window the next refusal is a new event.
        assert!(log
            .record(&refused("b", 7), 1_000 + DEDUP_WINDOW_MS)
            .is_some());
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
