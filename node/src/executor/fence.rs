//! Self-fencing that nothing else can hold up. The executor's tick also
//! fences, but a tick may wait — on a ledger write an isolated leader cannot
//! commit, on a restore, on a checkpoint's replication — for longer than the
//! cluster takes to start the gang elsewhere. [`FenceGuard`] runs on its own
//! task: once this node's ledger is no longer known to be current
//! ([`super::freshness`]) it kills every rank — its whole cgroup where it has one, else its process group —
//! whatever the tick is doing.

use super::cgroup::RankCgroup;
use crate::worker::Worker;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How to kill one running rank: its cgroup (every process it started,
/// whatever session or group they moved to), else its process group.
#[derive(Clone, Debug)]
pub struct RankFence {
    pub group: libc::pid_t,
    pub cgroup: Option<Arc<RankCgroup>>,
}

impl RankFence {
    /// SIGKILL to the rank: through `cgroup.kill` when the rank has a
    /// cgroup, through its process group when it has none or the cgroup
    /// write fails. True when a kill was sent.
    pub fn kill(&self) -> bool {
        if let Some(cgroup) = &self.cgroup {
            match cgroup.kill() {
                Ok(()) => return true,
                Err(e) => tracing::warn!(
                    cgroup = %cgroup.dir().display(),
                    error = %e,
                    "could not kill the rank's cgroup; killing its process group"
                ),
            }
        }
        // SAFETY: a plain syscall on a process group this executor started
        // and has not reaped (the map holds only those).
        unsafe { libc::kill(-self.group, libc::SIGKILL) == 0 }
    }
}

/// The running ranks of this node, by rank. A rank's entry is removed in
/// the same critical section that reaps its process, so the guard never
/// signals a group whose id the kernel may have reused.
#[derive(Clone, Default)]
pub struct RankGroups {
    groups: Arc<Mutex<BTreeMap<super::RankKey, RankFence>>>,
    /// Told of every rank added, so an idle guard starts watching at once.
    added: Arc<tokio::sync::Notify>,
}

impl RankGroups {
    /// The map, locked; a panic elsewhere leaves it usable.
    pub(super) fn lock(&self) -> MutexGuard<'_, BTreeMap<super::RankKey, RankFence>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A rank started: the guard watches it from now on.
    pub(super) fn add(&self, key: super::RankKey, fence: RankFence) {
        self.lock().insert(key, fence);
        self.added.notify_one();
    }
}

/// Kills every rank of this node while `fenced` says so, and any rank
/// whose allocation has moved on (`current` says no) as soon as this
/// node's ledger says so: the executor's tick would too, but it may be
/// waiting on something else for seconds while the cluster starts the new
/// epoch elsewhere after its fencing wait (chaos seed 103 of the pause
/// faults: 779 ms of two epochs at once).
pub struct FenceGuard {
    groups: RankGroups,
    fenced: Box<dyn Fn() -> bool + Send>,
    current: Box<dyn Fn(&super::RankKey) -> bool + Send>,
    period: Duration,
}

/// How often the guard ticks while no rank runs here: it has nothing to
/// kill, and the lease it renews is renewed again before every launch
/// ([`super::Executor`]), which also wakes it ([`RankGroups::add`]).
pub const IDLE_PERIOD: Duration = Duration::from_secs(1);

impl FenceGuard {
    pub(super) fn new(
        groups: RankGroups,
        period: Duration,
        fenced: impl Fn() -> bool + Send + 'static,
        current: impl Fn(&super::RankKey) -> bool + Send + 'static,
    ) -> Self {
        FenceGuard {
            groups,
            fenced: Box::new(fenced),
            current: Box::new(current),
            period,
        }
    }
}

impl Worker for FenceGuard {
    fn period(&self) -> Duration {
        if self.groups.lock().is_empty() {
            IDLE_PERIOD
        } else {
            self.period
        }
    }

    fn wakeup(&self) -> crate::worker::Wakeup {
        crate::worker::Wakeup::on_notify(self.groups.added.clone())
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let fenced = (self.fenced)();
        let groups = self.groups.lock();
        for (key, fence) in groups.iter() {
            let why = if fenced {
                "the ledger here is not known to be current; killed the rank"
            } else if !(self.current)(key) {
                "the allocation moved on; killed the rank"
            } else {
                continue;
            };
            if fence.kill() {
                tracing::warn!(job = key.job, epoch = key.epoch, rank = key.rank, "{why}");
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::RankKey;
    use std::os::unix::process::CommandExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    /// A process leading its own group, as ranks are started.
    fn group_leader() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .expect("sleep")
    }

    #[tokio::test]
    async fn a_fenced_node_kills_every_rank_group_and_only_then() {
        let groups = RankGroups::default();
        let mut child = group_leader();
        let key = RankKey {
            job: 1,
            epoch: 2,
            rank: 0,
        };
        groups.lock().insert(
            key,
            RankFence {
                group: child.id() as libc::pid_t,
                cgroup: None,
            },
        );
        let fenced = Arc::new(AtomicBool::new(false));
        let flag = fenced.clone();
        let mut guard = FenceGuard::new(
            groups.clone(),
            Duration::from_millis(10),
            move || flag.load(Ordering::SeqCst),
            |_| true,
        );
        let _ = guard.tick().await;
        assert!(
            child.try_wait().expect("wait").is_none(),
            "killed while in contact"
        );
        fenced.store(true, Ordering::SeqCst);
        let _ = guard.tick().await;
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    /// An idle guard sleeps a second between ticks, and the lease a new
    /// rank's guard reads is renewed right before its launch: the rank's
    /// start must wake the guard at once, not a second later.
    #[tokio::test]
    async fn an_idle_guard_is_woken_by_a_rank_start_not_its_idle_period() {
        let groups = RankGroups::default();
        let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = ticks.clone();
        let guard = FenceGuard::new(
            groups.clone(),
            Duration::from_millis(100),
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                false
            },
            |_| true,
        );
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        tokio::spawn(crate::worker::run(guard, shutdown));
        let tick_after = |seen: usize| {
            let ticks = ticks.clone();
            async move {
                let started = Instant::now();
                while ticks.load(Ordering::SeqCst) <= seen {
                    assert!(
                        started.elapsed() < IDLE_PERIOD * 3,
                        "the guard stopped ticking"
                    );
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                started.elapsed()
            }
        };
        // The first tick comes at once, the next a whole idle period later:
        // add the rank just after that one, a second before the next.
        tick_after(0).await;
        let idle_gap = tick_after(1).await;
        assert!(idle_gap >= IDLE_PERIOD / 2, "idle ticks {idle_gap:?} apart");

        let mut child = group_leader();
        groups.add(
            RankKey {
                job: 1,
                epoch: 1,
                rank: 0,
            },
            RankFence {
                group: child.id() as libc::pid_t,
                cgroup: None,
            },
        );
        let woken_after = tick_after(2).await;
        // From then on at its rank period.
        let busy_from = ticks.load(Ordering::SeqCst);
        tokio::time::sleep(IDLE_PERIOD).await;
        let busy = ticks.load(Ordering::SeqCst) - busy_from;
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            woken_after < IDLE_PERIOD / 2,
            "the rank's start woke the guard only after {woken_after:?}"
        );
        assert!(busy >= 5, "{busy} ticks in {IDLE_PERIOD:?} with a rank");
    }
}
