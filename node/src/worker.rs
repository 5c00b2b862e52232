//! The loop every background task of the node runs in: a [`Worker`] ticks
//! on its period or when what it watches changes ([`Wakeup`]), until the
//! node shuts down.

use crate::ledger_client::client::AppliedWatch;
use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;
use tokio::sync::watch;

/// A periodic loop of the node.
pub trait Worker: Send + 'static {
    /// Time between the starts of two ticks.
    fn period(&self) -> Duration;

    /// One round of work; `Break` ends the loop.
    fn tick(&mut self) -> impl Future<Output = ControlFlow<()>> + Send;

    /// Wakes the loop between its periodic ticks: a loop that acts on the
    /// ledger ticks as soon as an entry is applied (bursts coalesce: at
    /// most one tick per [`WAKE_GAP`]), the period being only a safety net.
    fn wakeup(&self) -> Wakeup {
        Wakeup::default()
    }

    /// Runs once when the node shuts down.
    fn stop(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The least time between two ticks a wakeup starts: a ledger applying
/// thousands of entries a second costs a loop at most this many ticks.
pub const WAKE_GAP: Duration = Duration::from_millis(2);

/// What wakes a loop between its periodic ticks.
#[derive(Default)]
pub struct Wakeup {
    applied: Option<AppliedWatch>,
    child_exits: Option<tokio::signal::unix::Signal>,
}

impl Wakeup {
    /// Every entry this node applies.
    pub fn on_apply(applied: AppliedWatch) -> Wakeup {
        Wakeup {
            applied: Some(applied),
            child_exits: None,
        }
    }

    /// And every exit of a child process (SIGCHLD); without the signal
    /// handler (it cannot fail on Linux) only the ledger wakes the loop.
    pub fn and_child_exits(mut self) -> Wakeup {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
            Ok(s) => self.child_exits = Some(s),
            Err(e) => tracing::debug!(error = %e, "child exits do not wake the loop"),
        }
        self
    }

    async fn next(&mut self) {
        let applied = async {
            match &mut self.applied {
                Some(w) => w.changed().await,
                None => std::future::pending().await,
            }
        };
        let exits = async {
            match &mut self.child_exits {
                Some(s) => {
                    if s.recv().await.is_none() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = applied => {}
            _ = exits => {}
        }
    }
}

/// Waits for the next wakeup, no sooner than [`WAKE_GAP`] after `last`.
async fn woken(wake: &mut Wakeup, last: tokio::time::Instant) {
    wake.next().await;
    tokio::time::sleep_until(last + WAKE_GAP).await;
}

/// Runs `worker` until it breaks or the node shuts down (or is dropped).
pub async fn run<W: Worker>(mut worker: W, mut shutdown: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(worker.period());
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut wake = worker.wakeup();
    let mut last = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = woken(&mut wake, last) => {}
            _ = shutdown.changed() => {
                worker.stop().await;
                return;
            }
        }
        last = tokio::time::Instant::now();
        if worker.tick().await.is_break() {
            return;
        }
    }
}

/// [`run`] on its own task.
pub fn spawn<W: Worker>(worker: W, shutdown: watch::Receiver<bool>) {
    tokio::spawn(run(worker, shutdown));
}
