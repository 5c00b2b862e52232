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
//! The word lives in a memfd, so the guard can be a program of its own:
//! `shoal __lease-guard GROUP` ([`run_guard`]), started like a rank
//! ([`super::spawn`], no copy of the agent's address space) with the memfd
//! as descriptor 3 and the rank cgroup's `cgroup.kill` as 4. It is the
//! agent's child, reaped by the executor. Where the agent's binary cannot
//! be that program (the agent runs inside a test binary; found once by
//! [`guard_program`]), the guard is a double fork of the agent instead,
//! as before: it runs only async-signal-safe calls (clock_gettime,
//! nanosleep, kill, write, close_range, _exit), so forking a
//! multi-threaded process is sound, and it is reparented to init, so
//! nothing has to reap it. Either guard exits once the rank's process
//! group is gone.

use super::spawn;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The hidden subcommand that runs a guard ([`run_guard`]).
pub const GUARD_COMMAND: &str = "__lease-guard";
/// What `shoal __lease-guard --probe` prints.
const PROBE_ANSWER: &str = "shoal lease guard";
/// The descriptors an exec'd guard finds its lease and `cgroup.kill` on.
const LEASE_FD: libc::c_int = 3;
const KILL_FD: libc::c_int = 4;

/// How often a guard looks at the lease.
const GUARD_POLL: Duration = Duration::from_millis(100);

/// What a rank's guard needs: the lease, and the program that runs it
/// (`None`: fork it).
#[derive(Clone)]
pub struct Guarding {
    pub lease: std::sync::Arc<FenceLease>,
    pub program: Option<PathBuf>,
}

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

/// The shared word: one page of a memfd mapped shared, inherited by every
/// guard forked after it was made and mapped by every exec'd one.
pub struct FenceLease {
    word: *const AtomicU64,
    len: usize,
    memfd: OwnedFd,
}

// SAFETY: the mapping lives as long as the lease and is only accessed
// through an atomic.
unsafe impl Send for FenceLease {}
// SAFETY: as for `Send`: every access to the shared word is atomic.
unsafe impl Sync for FenceLease {}

impl FenceLease {
    /// A lease valid for `initially` from now.
    pub fn new(initially: Duration) -> std::io::Result<FenceLease> {
        let len = 4096;
        // SAFETY: a valid name; the descriptor is checked and owned below.
        let fd = unsafe { libc::memfd_create(c"shoal-lease".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: just created, owned by nothing else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of the memfd; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                memfd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let lease = FenceLease {
            word: ptr.cast::<AtomicU64>(),
            len,
            memfd,
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

    /// Starts `program __lease-guard GROUP` as the guard of the rank
    /// leading process group `group`, which also writes "1" to
    /// `cgroup_kill` (the rank cgroup's `cgroup.kill`, when it has one)
    /// when the lease runs out. The caller reaps it.
    pub fn spawn_guard(
        &self,
        program: &Path,
        group: libc::pid_t,
        cgroup_kill: Option<&OwnedFd>,
    ) -> std::io::Result<spawn::Process> {
        use std::os::unix::ffi::OsStrExt;
        let nul = |e: std::ffi::NulError| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        let path = CString::new(program.as_os_str().as_bytes()).map_err(nul)?;
        let mut fds = vec![(0, 0), (1, 1), (2, 2), (self.memfd.as_raw_fd(), LEASE_FD)];
        if let Some(kill) = cgroup_kill {
            fds.push((kill.as_raw_fd(), KILL_FD));
        }
        spawn::Spawn {
            candidates: vec![path.clone()],
            argv: vec![
                path,
                CString::new(GUARD_COMMAND).map_err(nul)?,
                CString::new(group.to_string()).map_err(nul)?,
            ],
            fds,
            // Not in the agent's session: a ^C to the agent's terminal
            // must not take the guards.
            new_session: true,
            ..spawn::Spawn::default()
        }
        .start()
    }

    /// Starts the guard of the rank leading process group `group` as a
    /// double fork of the agent (see the module docs), which also writes
    /// "1" to `cgroup_kill` (the rank cgroup's `cgroup.kill`, when it has
    /// one) when the lease runs out.
    pub fn fork_guard(
        &self,
        group: libc::pid_t,
        cgroup_kill: Option<OwnedFd>,
    ) -> std::io::Result<()> {
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
                    forked_guard(&*word, group, kill_fd);
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

/// The forked guard: async-signal-safe calls only (see the module docs).
///
/// # Safety
/// Only in the forked child, with `word` mapped for its whole life.
unsafe fn forked_guard(word: &AtomicU64, group: libc::pid_t, kill_fd: libc::c_int) -> ! {
    // SAFETY: descriptor calls on the child's own table, then the guard's
    // loop under this function's contract.
    unsafe {
        // Keep only the cgroup.kill descriptor (as fd 3): the agent's
        // sockets and database files must not live on in the guard.
        let first_closed = if kill_fd >= 0 && libc::dup2(kill_fd, 3) == 3 {
            4
        } else {
            3
        };
        libc::syscall(libc::SYS_close_range, first_closed, libc::c_uint::MAX, 0);
        let kill_fd = if first_closed == 4 { 3 } else { -1 };
        watch(word, group, kill_fd)
    }
}

/// `shoal __lease-guard GROUP`: the exec'd guard, with the lease's memfd
/// on descriptor 3 and `cgroup.kill` (if any) on 4; never returns but
/// with the exit code (`--probe`: says it is one, for [`guard_program`]).
pub fn run_guard(args: &[String]) -> i32 {
    let Some(arg) = args.first() else {
        eprintln!("usage: shoal {GUARD_COMMAND} GROUP");
        return 2;
    };
    if arg == "--probe" {
        println!("{PROBE_ANSWER}");
        return 0;
    }
    let Ok(group) = arg.parse::<libc::pid_t>() else {
        eprintln!("shoal {GUARD_COMMAND}: not a process group: {arg}");
        return 2;
    };
    // SAFETY: maps the descriptor the agent gave us read-only; checked.
    let word = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            LEASE_FD,
            0,
        )
    };
    if word == libc::MAP_FAILED {
        eprintln!(
            "shoal {GUARD_COMMAND}: cannot map the lease (descriptor {LEASE_FD}): {}",
            std::io::Error::last_os_error()
        );
        return 1;
    }
    // SAFETY: closing our own copy; the mapping stays.
    unsafe { libc::close(LEASE_FD) };
    // SAFETY: F_GETFD only asks whether the descriptor is open.
    let kill_fd = if unsafe { libc::fcntl(KILL_FD, libc::F_GETFD) } >= 0 {
        KILL_FD
    } else {
        -1
    };
    // SAFETY: a page-aligned shared mapping of at least 8 bytes, which
    // the agent writes only through an atomic.
    unsafe { watch(&*word.cast::<AtomicU64>(), group, kill_fd) }
}

/// The agent's own binary as the guard program, if it is one (`shoal`,
/// not a test binary that embeds an agent); asked once per path.
pub fn guard_program(candidate: &Path) -> Option<PathBuf> {
    let out = std::process::Command::new(candidate)
        .args([GUARD_COMMAND, "--probe"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let said = String::from_utf8_lossy(&out.stdout);
    (out.status.success() && said.trim() == PROBE_ANSWER).then(|| candidate.to_path_buf())
}

/// The guard's loop: async-signal-safe calls only (see the module docs).
///
/// # Safety
/// `word` stays mapped while the guard lives; `kill_fd` is -1 or open.
unsafe fn watch(word: &AtomicU64, group: libc::pid_t, kill_fd: libc::c_int) -> ! {
    let nap = libc::timespec {
        tv_sec: 0,
        tv_nsec: GUARD_POLL.as_nanos() as libc::c_long,
    };
    // SAFETY: async-signal-safe calls on locals and the caller's
    // descriptors; errno is this thread's.
    unsafe { guard_loop(word, group, kill_fd, &nap) }
}

/// [`watch`]'s loop.
///
/// # Safety
/// As for [`watch`].
unsafe fn guard_loop(
    word: &AtomicU64,
    group: libc::pid_t,
    kill_fd: libc::c_int,
    nap: &libc::timespec,
) -> ! {
    // SAFETY: as for [`watch`].
    unsafe {
        loop {
            libc::nanosleep(nap, std::ptr::null_mut());
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
            .fork_guard(kept.id() as libc::pid_t, None)
            .expect("guard");
        lease
            .fork_guard(lapsed.id() as libc::pid_t, None)
            .expect("guard");
        let status = lapsed.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Judged against the lease's own deadline, not a stopwatch started
        // after the forks: on a loaded machine the forks themselves can
        // take a good part of the 600 ms (CI once saw the kill 498 ms
        // after such a stopwatch started).
        let deadline = lease.word().load(Ordering::Acquire);
        let now = monotonic_ms();
        assert!(
            now > deadline,
            "killed {} ms before the lease ran out",
            deadline - now
        );
        assert!(
            now - deadline < 5_000,
            "killed {} ms after the lease ran out",
            now - deadline
        );
        assert!(
            kept.try_wait().expect("wait").is_none(),
            "a renewed lease killed its rank"
        );
        let _ = kept.kill();
        let _ = kept.wait();
    }

    #[test]
    fn a_binary_that_is_not_shoal_is_not_taken_for_the_guard_program() {
        // This test binary: it would take the arguments for a test filter.
        let me = std::env::current_exe().expect("exe");
        assert_eq!(guard_program(&me), None);
        assert_eq!(guard_program(Path::new("/nonexistent/shoal")), None);
    }
}
