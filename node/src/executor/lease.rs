//! A dead man's switch for ranks. Self-fencing by the agent ([`super::fence`])
//! needs the agent to run: an agent that is stopped (SIGSTOP, a debugger, a
//! VM paused, a runtime stalled) kills nothing while its ranks run on, and
//! the cluster starts the job elsewhere once the node is declared down and
//! the fencing wait is over: the same job ran twice (chaos seed 103 of the
//! pause faults showed 3.3 s of overlap).
//!
//! So every rank gets a guard process that needs nothing of the agent but
//! one word of shared memory: the monotonic time until which the agent may
//! run ranks, which its fence task renews from the same rule as
//! self-fencing (the start of its latest completed ReadIndex read plus
//! [`SELF_FENCE_MS`](shoal_consensus::workload::SELF_FENCE_MS), see
//! [`super::freshness`]). Once the
//! time passes without renewal, the guard kills the rank's cgroup and
//! process group. A frozen agent can no longer renew, so its ranks die when
//! its contact would have lapsed, as a cut-off agent's do.
//!
//! The guard is a double fork of the agent: it runs only async-signal-safe
//! calls (clock_gettime, nanosleep, kill, write, close_range, _exit), so
//! forking a multi-threaded process is sound, and it is reparented to init,
//! so nothing has to reap it. It exits once the rank's process group is
//! gone.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a guard looks at the lease.
const GUARD_POLL: Duration = Duration::from_millis(100);

/// Milliseconds of CLOCK_MONOTONIC, the clock every process of the machine
/// shares.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1000)
        .saturating_add(ts.tv_nsec as u64 / 1_000_000)
}

/// The shared word: one page mapped shared and anonymous, inherited by
/// every guard forked after it was made.
pub struct FenceLease {
    word: *const AtomicU64,
    len: usize,
}

// SAFETY: the mapping lives as long as the lease and is only accessed
// through an atomic.
unsafe impl Send for FenceLease {}
unsafe impl Sync for FenceLease {}

impl FenceLease {
    /// A lease valid for `initially` from now.
    pub fn new(initially: Duration) -> std::io::Result<FenceLease> {
        let len = 4096;
        // SAFETY: a fresh anonymous mapping; checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let lease = FenceLease {
            word: ptr.cast::<AtomicU64>(),
            len,
        };
        lease.renew_until(Instant::now() + initially);
        Ok(lease)
    }

    fn word(&self) -> &AtomicU64 {
        // SAFETY: a page-aligned, zeroed mapping of at least 8 bytes.
        unsafe { &*self.word }
    }

    /// Ranks may run until `deadline`.
    pub fn renew_until(&self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        let at = monotonic_ms().saturating_add(left.as_millis() as u64);
        self.word().store(at, Ordering::Release);
    }

    /// Starts the guard of the rank leading process group `group`, which
    /// also writes "1" to `cgroup_kill` (the rank cgroup's `cgroup.kill`,
    /// when it has one) when the lease runs out.
    pub fn guard(&self, group: libc::pid_t, cgroup_kill: Option<OwnedFd>) -> std::io::Result<()> {
        let kill_fd = cgroup_kill.as_ref().map(|fd| fd.as_raw_fd()).unwrap_or(-1);
        let word = self.word;
        // SAFETY: between fork and _exit, the children only make
        // async-signal-safe calls and touch no memory but the stack and
        // the shared word.
        unsafe {
            let child = libc::fork();
            if child < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if child == 0 {
                // The middle child: fork the guard and leave at once, so
                // the guard is reparented and never needs reaping.
                if libc::fork() == 0 {
                    guard_loop(&*word, group, kill_fd);
                }
                libc::_exit(0);
            }
            let mut status = 0;
            libc::waitpid(child, &mut status, 0);
        }
        Ok(())
    }
}

impl Drop for FenceLease {
    fn drop(&mut self) {
        // SAFETY: the mapping this lease made; guards hold their own.
        unsafe { libc::munmap(self.word as *mut libc::c_void, self.len) };
    }
}

/// The guard: async-signal-safe calls only (see the module docs).
unsafe fn guard_loop(word: &AtomicU64, group: libc::pid_t, kill_fd: libc::c_int) -> ! {
    // Keep only the cgroup.kill descriptor (as fd 3): the agent's sockets
    // and database files must not live on in the guard.
    let first_closed = if kill_fd >= 0 && libc::dup2(kill_fd, 3) == 3 {
        4
    } else {
        3
    };
    libc::syscall(libc::SYS_close_range, first_closed, libc::c_uint::MAX, 0);
    let kill_fd = if first_closed == 4 { 3 } else { -1 };
    let nap = libc::timespec {
        tv_sec: 0,
        tv_nsec: GUARD_POLL.as_nanos() as libc::c_long,
    };
    loop {
        libc::nanosleep(&nap, std::ptr::null_mut());
        if libc::kill(-group, 0) != 0 && *libc::__errno_location() == libc::ESRCH {
            libc::_exit(0);
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        let now = (ts.tv_sec as u64) * 1000 + ts.tv_nsec as u64 / 1_000_000;
        if now > word.load(Ordering::Acquire) {
            if kill_fd >= 0 {
                libc::write(kill_fd, b"1".as_ptr().cast(), 1);
            }
            libc::kill(-group, libc::SIGKILL);
            libc::_exit(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    fn group_leader() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .expect("sleep")
    }

    #[test]
    fn a_lapsed_lease_kills_the_rank_and_a_renewed_one_does_not() {
        let lease = FenceLease::new(Duration::from_millis(600)).expect("lease");
        let mut kept = group_leader();
        let mut lapsed = group_leader();
        let kept_lease = FenceLease::new(Duration::from_secs(600)).expect("lease");
        kept_lease
            .guard(kept.id() as libc::pid_t, None)
            .expect("guard");
        lease
            .guard(lapsed.id() as libc::pid_t, None)
            .expect("guard");
        let started = Instant::now();
        let status = lapsed.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_secs(5),
            "killed after {took:?}"
        );
        assert!(
            kept.try_wait().expect("wait").is_none(),
            "a renewed lease killed its rank"
        );
        let _ = kept.kill();
        let _ = kept.wait();
    }
}
