//! POSTs every new event to an operator's webhook (an Alertmanager receiver,
//! a chat relay). The leader posts; every other node only keeps its cursor
//! at the newest event, so that a node that becomes leader carries on from
//! where it last looked: an event committed during a leader change may be
//! posted twice (receivers can use the event `id` to drop repeats), but is
//! not skipped.

use crate::agent::Inner;
use std::sync::Weak;
use std::time::Duration;
use tokio::sync::watch;

const POLL_EVERY: Duration = Duration::from_millis(200);
const ATTEMPTS: u32 = 3;
const TIMEOUT: Duration = Duration::from_secs(5);

pub async fn run(inner: Weak<Inner>, url: String, mut shutdown: watch::Receiver<bool>) {
    let client = match reqwest::Client::builder().timeout(TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook client; events will not be posted");
            return;
        }
    };
    let mut cursor: Option<u64> = None;
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(node) = inner.upgrade() else { return };
        let (newest, pending) = match node.read_ledger() {
            Ok(d) => {
                let newest = d.ledger.events.events.back().map(|e| e.id).unwrap_or(0);
                let pending = match cursor {
                    Some(after) if node.is_leader() => crate::jobs_api::events(&d.ledger, after),
                    _ => Vec::new(),
                };
                (newest, pending)
            }
            Err(_) => continue,
        };
        drop(node);
        // History from before this node started is not replayed.
        let Some(after) = cursor else {
            cursor = Some(newest);
            continue;
        };
        if pending.is_empty() {
            cursor = Some(after.max(newest));
            continue;
        }
        for event in pending {
            post(&client, &url, &event).await;
            cursor = Some(event.id);
        }
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
