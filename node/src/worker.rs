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
    /// Time between the starts of two ticks; asked again after every
    /// tick, so a loop that has less to do in some roles (a leader-only
    /// task on a follower) can tick less often there.
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

/// How often a loop that works only on the leader ticks on a node that
/// does not lead: it has nothing to do there, and its leadership wakeup
/// ([`Wakeup::on_leadership`]) starts it at once when the node is elected
/// (and again when it is not), so this is only a safety net. Every tick is
/// a wake-up of an idle member.
pub const OFF_LEADER_PERIOD: Duration = Duration::from_secs(10);

/// The least time between two ticks a wakeup starts: a ledger applying
/// thousands of entries a second costs a loop at most this many ticks.
pub const WAKE_GAP: Duration = Duration::from_millis(2);

/// What wakes a loop between its periodic ticks.
#[derive(Default)]
pub struct Wakeup {
    applied: Option<AppliedWatch>,
    child_exits: Option<tokio::signal::unix::Signal>,
    leadership: Option<LeadershipWatch>,
    notified: Option<std::sync::Arc<tokio::sync::Notify>>,
}

/// Changes of this node's Raft role, leader or vote (not of its log).
type LeadershipWatch = watch::Receiver<
    openraft::metrics::RaftServerMetrics<shoal_consensus::NodeId, openraft::BasicNode>,
>;

impl Wakeup {
    /// Every entry this node applies.
    pub fn on_apply(applied: AppliedWatch) -> Wakeup {
        Wakeup {
            applied: Some(applied),
            ..Wakeup::default()
        }
    }

    /// Every change of who leads, or of this node's role: a loop that
    /// works only on the leader ticks slowly elsewhere and starts at once
    /// when its node is elected.
    pub fn on_leadership(raft: &shoal_consensus::types::Raft) -> Wakeup {
        Wakeup::default().and_leadership(raft)
    }

    /// [`Wakeup::on_leadership`] as well.
    pub fn and_leadership(mut self, raft: &shoal_consensus::types::Raft) -> Wakeup {
        let mut rx = raft.server_metrics();
        rx.borrow_and_update();
        self.leadership = Some(rx);
        self
    }

    /// Every `notify_one` of `notify` (one given while the loop works is
    /// kept for its next wait).
    pub fn on_notify(notify: std::sync::Arc<tokio::sync::Notify>) -> Wakeup {
        Wakeup {
            notified: Some(notify),
            ..Wakeup::default()
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
        let leadership = async {
            match &mut self.leadership {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        let notified = async {
            match &self.notified {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = applied => {}
            _ = exits => {}
            _ = leadership => {}
            _ = notified => {}
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
    let mut period = worker.period();
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut wake = worker.wakeup();
    let mut last = tokio::time::Instant::now();
    loop {
        let wanted = worker.period();
        if wanted != period {
            period = wanted;
            interval = tokio::time::interval_at(last + period, period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
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
