//! The node's background loops. Each is a [`Worker`]: state of its own and
//! a `tick`; [`spawn`] drives it on one shared skeleton (a fixed period,
//! missed ticks delayed rather than bunched, stop on the node's shutdown).

pub mod anomaly;
pub mod ca_custody;
pub mod ca_rotation;
pub mod cert_renewal;
pub mod durability;
pub mod federation;
pub mod gossip;
pub mod gpu_health;
pub mod job_files;
pub mod member_record;
pub mod reconcile;
pub mod scheduler;

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

    /// Runs once when the node shuts down.
    fn stop(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Runs `worker` until it breaks or the node shuts down (or is dropped).
pub async fn run<W: Worker>(mut worker: W, mut shutdown: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(worker.period());
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.changed() => {
                worker.stop().await;
                return;
            }
        }
        if worker.tick().await.is_break() {
            return;
        }
    }
}

/// [`run`] on its own task.
pub fn spawn<W: Worker>(worker: W, shutdown: watch::Receiver<bool>) {
    tokio::spawn(run(worker, shutdown));
}
