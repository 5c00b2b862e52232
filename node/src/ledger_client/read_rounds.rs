//! ReadIndex reads on the leader, shared: every member confirms its ledger
//! is current several times a second (the fence's freshness), and each
//! confirmation would otherwise cost the leader a heartbeat round to its
//! voters. A round started after a read was asked for serves that read as
//! well as a round of its own would (Raft's ReadIndex: the read index is
//! the commit index at the round's start, leadership confirmed by a quorum
//! after it), so the reads that arrive while a round is in flight wait for
//! the next one together. Rounds start at most every [`ROUND_SPACING`], so
//! what the voters hear from the leader does not grow with the pool
//! either: a renewal waits at most that long for its round.

use crate::proto::{ErrorCode, WireError};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

type Waiter = oneshot::Sender<Result<u64, WireError>>;

/// The shortest time between the starts of two rounds: half the period
/// of a member's renewals ([`crate::peers::RENEW_EVERY`]), so a renewal
/// waits at most that long for its round, and the voters (and, on a
/// replica, the leader) hear at most ten rounds a second.
pub const ROUND_SPACING: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Pending {
    /// A round is in flight (its driver will start the next one).
    running: bool,
    /// Reads asked for since the round in flight started.
    next: Vec<Waiter>,
}

/// Shares ReadIndex rounds between the reads asked for at once.
#[derive(Clone, Default)]
pub struct ReadRounds {
    pending: Arc<Mutex<Pending>>,
}

impl ReadRounds {
    /// The index a read asked for now may be served at, from a round that
    /// starts after this call. `round` runs one confirmation and returns
    /// the read index.
    pub async fn read<F, Fut>(&self, round: F) -> Result<u64, WireError>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<u64, WireError>> + Send,
    {
        let (tx, rx) = oneshot::channel();
        let drive = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.next.push(tx);
            !std::mem::replace(&mut p.running, true)
        };
        if drive {
            let pending = self.pending.clone();
            tokio::spawn(async move {
                let mut last_start: Option<tokio::time::Instant> = None;
                loop {
                    if let Some(at) = last_start {
                        tokio::time::sleep_until(at + ROUND_SPACING).await;
                    }
                    let batch = {
                        let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
                        if p.next.is_empty() {
                            p.running = false;
                            return;
                        }
                        std::mem::take(&mut p.next)
                    };
                    last_start = Some(tokio::time::Instant::now());
                    let result = round().await;
                    for waiter in batch {
                        let _ = waiter.send(result.clone());
                    }
                }
            });
        }
        rx.await.unwrap_or_else(|_| {
            Err(WireError::new(
                ErrorCode::Unavailable,
                "the read round ended without an answer",
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[tokio::test]
    async fn reads_asked_together_share_rounds_and_each_waits_for_one_that_starts_after_it() {
        let rounds = ReadRounds::default();
        // Each round returns the number of rounds started before it: a
        // read served by round k was asked before round k started.
        let started = Arc::new(AtomicU64::new(0));
        let (gate_tx, gate_rx) = tokio::sync::watch::channel(0u64);
        let round = {
            let started = started.clone();
            move || {
                let started = started.clone();
                let mut gate = gate_rx.clone();
                async move {
                    let k = started.fetch_add(1, Ordering::SeqCst) + 1;
                    // Held until the test lets round k finish.
                    let _ = gate.wait_for(|open| *open >= k).await;
                    Ok(k)
                }
            }
        };
        let first = tokio::spawn({
            let (r, f) = (rounds.clone(), round.clone());
            async move { r.read(f).await }
        });
        // Round 1 is in flight once it has started.
        while started.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = (0..50)
            .map(|_| {
                let (r, f) = (rounds.clone(), round.clone());
                tokio::spawn(async move { r.read(f).await })
            })
            .collect();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        gate_tx.send_replace(2);
        assert_eq!(first.await.expect("join").expect("read"), 1);
        for r in later {
            // Asked while round 1 was in flight: served by round 2, never 1.
            assert_eq!(r.await.expect("join").expect("read"), 2);
        }
        assert_eq!(started.load(Ordering::SeqCst), 2, "51 reads, two rounds");
        // Idle again: the next read starts a round of its own.
        gate_tx.send_replace(3);
        let again = tokio::time::timeout(Duration::from_secs(5), rounds.read(round))
            .await
            .expect("not stuck");
        assert_eq!(again.expect("read"), 3);
    }
}
