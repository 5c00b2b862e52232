//! POSTs every new event to an operator's webhook (an Alertmanager receiver,
//! a chat relay). The leader posts; every other node only keeps its cursor
//! at the newest event, so that a node that becomes leader carries on from
//! where it last looked: an event committed during a leader change may be
//! posted twice (receivers can use the event `id` to drop repeats), but is
//! not skipped.

use crate::ledger_client::LedgerClient;
use crate::worker::Worker;
use std::ops::ControlFlow;
use std::time::Duration;

const POLL_EVERY: Duration = Duration::from_millis(200);
const ATTEMPTS: u32 = 3;
const TIMEOUT: Duration = Duration::from_secs(5);

/// The webhook loop and its cursor.
pub struct Webhook {
    ledger: LedgerClient,
    client: reqwest::Client,
    url: String,
    cursor: Option<u64>,
}

impl Webhook {
    pub fn new(ledger: LedgerClient, url: String) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| format!("cannot build the webhook client: {e}"))?;
        Ok(Webhook {
            ledger,
            client,
            url,
            cursor: None,
        })
    }
}

impl Worker for Webhook {
    fn period(&self) -> Duration {
        POLL_EVERY
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let (newest, pending) = match self.ledger.read() {
            Ok(d) => {
                let newest = d.ledger.events.events.back().map(|e| e.id).unwrap_or(0);
                let pending = match self.cursor {
                    Some(after) if self.ledger.is_leader() => {
                        crate::views::events(&d.ledger, after)
                    }
                    _ => Vec::new(),
                };
                (newest, pending)
            }
            Err(_) => return ControlFlow::Continue(()),
        };
        // History from before this node started is not replayed.
        let Some(after) = self.cursor else {
            self.cursor = Some(newest);
            return ControlFlow::Continue(());
        };
        if pending.is_empty() {
            self.cursor = Some(after.max(newest));
            return ControlFlow::Continue(());
        }
        for event in pending {
            post(&self.client, &self.url, &event).await;
            self.cursor = Some(event.id);
        }
        ControlFlow::Continue(())
    }
}

async fn post(client: &reqwest::Client, url: &str, event: &shoal_sdk::EventInfo) {
    let mut delay = Duration::from_millis(200);
    for attempt in 1..=ATTEMPTS {
        match client.post(url).json(event).send().await {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => {
                tracing::warn!(url, attempt, status = %r.status(), event = event.id, "webhook refused an event")
            }
            Err(e) => {
                tracing::warn!(url, attempt, error = %e, event = event.id, "webhook unreachable")
            }
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    tracing::warn!(url, event = event.id, kind = %event.kind, "gave up posting an event to the webhook");
}
