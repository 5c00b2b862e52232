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

use crate::node::client::LedgerClient;
use shoal_consensus::events::EventSpec;
use shoal_consensus::Command;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How long the first record of a window waits for others.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Records proposed together at most (about 50 KB of entry).
const MAX_RECORDS: usize = 256;

/// Gathers this node's audit records; the writer starts with the first.
#[derive(Default)]
pub struct AuditLog {
    tx: OnceLock<mpsc::UnboundedSender<EventSpec>>,
}

impl AuditLog {
    /// Queues `spec` for the next window. Needs a Tokio runtime (the
    /// writer is spawned on first use); it stops when `shutdown` fires,
    /// after proposing what it holds.
    pub fn record(&self, ledger: &LedgerClient, shutdown: watch::Receiver<bool>, spec: EventSpec) {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(write_windows(ledger.clone(), rx, shutdown));
            tx
        });
        if tx.send(spec).is_err() {
            tracing::warn!("could not record an audit event: the node is stopping");
        }
    }
}

async fn write_windows(
    ledger: LedgerClient,
    mut rx: mpsc::UnboundedReceiver<EventSpec>,
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
