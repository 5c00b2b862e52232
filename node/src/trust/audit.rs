//! The audit trail's writer. Every successful admin write is audited, and
//! one proposal per record made an admin write cost two ledger entries: the
//! record went in as a second proposal right behind its write, and a
//! client's next write queued behind that append (the leader keeps one
//! proposal in flight; see `batcher`). Records are gathered for a short
//! window and then proposed all at once, so the batcher commits a window's
//! records as one entry, whatever the rate of admin writes.
//!
//! A record is written after the answer it describes, as before: a node
//! that stops within the window loses that window's records, as it lost
//! the one write in flight before.
//!
//! A caller's refused requests are records too, and the event log keeps
//! the last 1,000 events: a tenant walking every route would push the
//! operators' records out. So each caller gets at most
//! [`DISTINCT_PER_MINUTE`] distinct refusal records a minute on a node (a
//! repeat of one is counted on it by the ledger, not recorded anew), then
//! one record saying it was cut off; the rest of that minute's refusals are
//! counted only in `shoal_api_requests_total`, as are repeats of one record
//! past [`REPEATS_PER_MINUTE`].

use crate::ledger_client::client::LedgerClient;
use shoal_consensus::events::EventSpec;
use shoal_consensus::Command;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How long the first record of a window waits for others.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Records proposed together at most (about 50 KB of entry).
const MAX_RECORDS: usize = 256;

/// Distinct refusal records one caller may add to the log a minute.
pub const DISTINCT_PER_MINUTE: usize = 16;
/// Repeats of one refusal record a caller may send the ledger a minute
/// (each is counted on its event); the rest are counted only in the
/// request metrics, so one caller's flood is not a flood of writes.
pub const REPEATS_PER_MINUTE: u32 = 64;
/// Records waiting for the writer at most (a ledger without a quorum
/// stops taking them): past that they are dropped, with a warning.
const MAX_QUEUED: usize = 4096;
/// The rate limiter's window.
const LIMIT_WINDOW: Duration = Duration::from_secs(60);
/// Callers tracked at most before finished windows are dropped.
const MAX_CALLERS: usize = 4096;

/// What to do with a caller's refusal record.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Record it (new this minute, or a repeat the ledger counts).
    Record,
    /// The caller's distinct records are used up: record that once.
    CutOff,
    /// Already cut off this minute: not recorded.
    Drop,
}

#[derive(Default)]
struct CallerWindow {
    started_ms: u64,
    /// Each distinct record of this window and how often it was sent.
    messages: Vec<(u64, u32)>,
    cut_off: bool,
}

/// Per-caller budget of distinct refusal records; pure (takes `now_ms`).
#[derive(Default)]
pub struct RefusalLimiter {
    callers: std::collections::HashMap<String, CallerWindow>,
}

impl RefusalLimiter {
    /// Whether `caller`'s refusal record `message` goes into the log.
    pub fn admit(&mut self, caller: &str, message: &str, now_ms: u64) -> Refusal {
        let window_ms = LIMIT_WINDOW.as_millis() as u64;
        if self.callers.len() >= MAX_CALLERS && !self.callers.contains_key(caller) {
            self.callers
                .retain(|_, w| now_ms.saturating_sub(w.started_ms) < window_ms);
        }
        let window = self.callers.entry(caller.to_string()).or_default();
        if now_ms.saturating_sub(window.started_ms) >= window_ms {
            *window = CallerWindow {
                started_ms: now_ms,
                ..CallerWindow::default()
            };
        }
        let key = u64::from_le_bytes(
            blake3::hash(message.as_bytes()).as_bytes()[..8]
                .try_into()
                .unwrap_or_default(),
        );
        if let Some((_, sent)) = window.messages.iter_mut().find(|(k, _)| *k == key) {
            *sent += 1;
            return if *sent <= REPEATS_PER_MINUTE {
                Refusal::Record
            } else {
                Refusal::Drop
            };
        }
        if window.messages.len() < DISTINCT_PER_MINUTE {
            window.messages.push((key, 1));
            return Refusal::Record;
        }
        if window.cut_off {
            Refusal::Drop
        } else {
            window.cut_off = true;
            Refusal::CutOff
        }
    }
}

/// Gathers this node's audit records; the writer starts with the first.
#[derive(Default)]
pub struct AuditLog {
    tx: OnceLock<mpsc::Sender<EventSpec>>,
    refusals: std::sync::Mutex<RefusalLimiter>,
}

impl AuditLog {
    /// Queues `spec` for the next window. Needs a Tokio runtime (the
    /// writer is spawned on first use); it stops when `shutdown` fires,
    /// after proposing what it holds.
    pub fn record(&self, ledger: &LedgerClient, shutdown: watch::Receiver<bool>, spec: EventSpec) {
        self.send(ledger, shutdown, spec);
    }

    /// Queues `spec`, a refusal of `caller`'s (a token id), within the
    /// caller's budget of distinct records ([`RefusalLimiter`]); `who`
    /// names the caller in the record that cuts it off.
    pub fn record_refusal(
        &self,
        ledger: &LedgerClient,
        shutdown: watch::Receiver<bool>,
        caller: &str,
        who: &str,
        mut spec: EventSpec,
    ) {
        let verdict = match self.refusals.lock() {
            Ok(mut limiter) => limiter.admit(caller, &spec.message, crate::clock::wall_ms()),
            Err(_) => Refusal::Record,
        };
        match verdict {
            Refusal::Record => {}
            Refusal::CutOff => {
                spec.message = format!(
                    "{who}: more than {DISTINCT_PER_MINUTE} kinds of refused requests within a minute; the rest of the minute's are counted only in shoal_api_requests_total"
                );
                spec.resource = None;
            }
            Refusal::Drop => return,
        }
        self.send(ledger, shutdown, spec);
    }

    fn send(&self, ledger: &LedgerClient, shutdown: watch::Receiver<bool>, spec: EventSpec) {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::channel(MAX_QUEUED);
            tokio::spawn(write_windows(ledger.clone(), rx, shutdown));
            tx
        });
        if tx.try_send(spec).is_err() {
            tracing::warn!("could not record an audit event: the node is stopping, or its ledger is this far behind");
        }
    }
}

async fn write_windows(
    ledger: LedgerClient,
    mut rx: mpsc::Receiver<EventSpec>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let first = tokio::select! {
            record = rx.recv() => match record {
                Some(r) => r,
                None => return,
            },
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let mut records = vec![first];
        let window = tokio::time::sleep(WINDOW);
        tokio::pin!(window);
        let mut stopping = false;
        while records.len() < MAX_RECORDS {
            tokio::select! {
                record = rx.recv() => match record {
                    Some(r) => records.push(r),
                    None => break,
                },
                _ = &mut window => break,
                _ = shutdown.wait_for(|stop| *stop) => {
                    stopping = true;
                    break;
                }
            }
        }
        let writes = records
            .into_iter()
            .map(|spec| ledger.write(Command::RecordEvent(spec)));
        for result in futures::future::join_all(writes).await {
            if let Err(e) = result {
                tracing::warn!(error = %e.message, "could not record an audit event");
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_gets_a_few_distinct_refusal_records_a_minute_then_one_cut_off() {
        let mut limiter = RefusalLimiter::default();
        let t0 = 1_000_000;
        for route in 0..DISTINCT_PER_MINUTE {
            assert_eq!(
                limiter.admit("b", &format!("GET /{route}"), t0),
                Refusal::Record
            );
        }
        // A repeat is still recorded (the ledger counts it on its event),
        // up to a bound.
        for _ in 1..REPEATS_PER_MINUTE {
            assert_eq!(limiter.admit("b", "GET /0", t0 + 1), Refusal::Record);
        }
        assert_eq!(limiter.admit("b", "GET /0", t0 + 1), Refusal::Drop);
        assert_eq!(limiter.admit("b", "GET /new", t0 + 2), Refusal::CutOff);
        for route in 0..100 {
            assert_eq!(
                limiter.admit("b", &format!("POST /{route}x"), t0 + 3),
                Refusal::Drop
            );
        }
        // Another caller has its own budget; the next minute a new one.
        assert_eq!(limiter.admit("a", "GET /new", t0 + 4), Refusal::Record);
        assert_eq!(
            limiter.admit("b", "GET /new", t0 + LIMIT_WINDOW.as_millis() as u64),
            Refusal::Record
        );
    }

    #[test]
    fn the_limiter_forgets_finished_windows_when_it_is_full() {
        let mut limiter = RefusalLimiter::default();
        for caller in 0..MAX_CALLERS {
            limiter.admit(&caller.to_string(), "m", 0);
        }
        limiter.admit("late", "m", LIMIT_WINDOW.as_millis() as u64);
        assert_eq!(limiter.callers.len(), 1);
    }
}
