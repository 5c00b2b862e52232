//! Starting a process without copying the agent's address space.
//!
//! `fork` copies the page tables of the whole agent (gigabytes mapped,
//! thousands of threads' stacks, and in the benchmark four agents in one
//! process): ~15 ms a rank on a small VM. Rust's `Command` would use
//! `posix_spawn` (vfork semantics) only without `pre_exec` or a uid, and
//! a rank needs both. So ranks (and their lease guards) start here the
//! way `posix_spawn` starts a process: `clone(CLONE_VM | CLONE_VFORK)` on a
//! stack of its own. The child borrows the agent's memory until it execs
//! (the calling thread waits that long, every other thread runs on), and
//! makes only raw system calls meanwhile: it must not take a lock, touch
//! the allocator or change memory the agent uses.
//!
//! Where the kernel has `clone3` (Linux 5.7), the child is created directly
//! inside its cgroup (`CLONE_INTO_CGROUP`): no migration, which takes the
//! kernel's global cgroup lock and waits for an RCU grace period, and no
//! moment outside it. Elsewhere it writes "0" to the cgroup's
//! `cgroup.procs` first thing, as a forked rank did.
//!
//! What the child does, in order: resets every caught signal to its
//! default (the agent's handlers must not run on borrowed memory; all
//! signals stay blocked until just before exec), [enters the cgroup],
//! starts its own session (so it leads its process group), puts the given
//! descriptors in place, [enters a mount namespace of its own whose `/proc`
//! shows only the processes its user may inspect], drops its credentials (raw `setgroups`, `setgid`,
//! `setuid`: glibc's wrappers would signal the agent's threads), changes
//! into its working directory as that user, arms the parent-death signal
//! and `no_new_privs`, closes every other descriptor, unblocks signals and
//! execs the first candidate path that runs.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// `CLONE_INTO_CGROUP` (linux/sched.h); not in the libc crate.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
/// The child's stack: it only makes system calls on it.
const CHILD_STACK: usize = 64 * 1024;

/// Where the child failed, for the error message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
enum Step {
    Cgroup = 1,
    Session,
    Descriptors,
    Credentials,
    WorkingDir,
    ParentDeath,
    NoNewPrivs,
    Exec,
    PrivateProc,
}

impl Step {
    fn from_code(code: i32) -> &'static str {
        match code {
            1 => "enter the cgroup",
            2 => "start a session",
            3 => "set up its descriptors",
            4 => "drop its privileges",
            5 => "enter its working directory",
            6 => "arm the parent-death signal",
            7 => "set no_new_privs",
            9 => "mount a /proc of its own",
            _ => "exec",
        }
    }
}

/// What to start, and how.
#[derive(Default)]
pub struct Spawn {
    /// Paths to exec, in order (execvp's search, done by the caller): the
    /// first one that is not missing or refused runs.
    pub candidates: Vec<CString>,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    /// `(open descriptor in the agent, number in the child)`; every other
    /// descriptor is closed. Targets must be 0, 1, 2, … without gaps.
    pub fds: Vec<(RawFd, RawFd)>,
    /// Entered after the privilege drop, as the rank's user.
    pub cwd: Option<CString>,
    /// The cgroup directory (an open descriptor) and its `cgroup.procs`
    /// (open for writing, for kernels without `CLONE_INTO_CGROUP`).
    pub cgroup: Option<(RawFd, RawFd)>,
    /// `(uid, gid)` to switch to, supplementary groups cleared.
    pub credentials: Option<(libc::uid_t, libc::gid_t)>,
    pub new_session: bool,
    pub parent_death_signal: Option<libc::c_int>,
    pub no_new_privs: bool,
    /// A mount namespace of its own whose `/proc` (`hidepid=2`) lists only
    /// the processes its user may inspect: no other tenant's, and not the
    /// agent's, command lines. Needs a root agent; where the host refuses
    /// it (a container without `CAP_SYS_ADMIN`) ranks start without it
    /// and the agent says so once.
    pub private_proc: bool,
}

/// A child started by [`Spawn::start`]; killed (SIGKILL) and reaped in the
/// background if dropped before it was reaped, like `kill_on_drop`.
#[derive(Debug)]
pub struct Process {
    pid: libc::pid_t,
    status: Option<ExitStatus>,
}

impl Process {
    /// The pid, until it is reaped (as tokio's `Child::id`).
    pub fn id(&self) -> Option<u32> {
        if self.status.is_some() {
            return None;
        }
        u32::try_from(self.pid).ok()
    }

    /// Its exit, once it has exited; reaps it. The pid stays ours (a
    /// zombie) until this reaps it, so signals to it never reach another
    /// process.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let mut raw = 0;
        // SAFETY: waitpid on our own child, writing into a local.
        let rc = unsafe { libc::waitpid(self.pid, &mut raw, libc::WNOHANG) };
        match rc {
            0 => Ok(None),
            rc if rc == self.pid => {
                let status = ExitStatus::from_raw(raw);
                self.status = Some(status);
                Ok(Some(status))
            }
            _ => Err(io::Error::last_os_error()),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let pid = self.pid;
        // SAFETY: our own, not yet reaped child: the pid is still its.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        // Reaped off this thread: a process in uninterruptible sleep may
        // take its time to die.
        let reaped = std::thread::Builder::new()
            .name("reap".into())
            .spawn(move || {
                let mut raw = 0;
                // SAFETY: as above; blocks until it has exited.
                unsafe { libc::waitpid(pid, &mut raw, 0) };
            });
        if let Err(e) = reaped {
            tracing::warn!(pid, error = %e, "cannot reap a killed child; it stays a zombie");
        }
    }
}

/// What the child reads (prepared by the parent, which waits) and where it
/// leaves its error.
struct ChildPlan {
    candidates: Vec<*const libc::c_char>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    fds: Vec<(RawFd, RawFd)>,
    cwd: *const libc::c_char,
    /// `cgroup.procs` to write "0" to; -1: none, or entered by clone3.
    procs: RawFd,
    credentials: Option<(libc::uid_t, libc::gid_t)>,
    new_session: bool,
    parent_death_signal: libc::c_int,
    parent: libc::pid_t,
    no_new_privs: bool,
    private_proc: bool,
    /// errno of the failed step, 0 while none failed.
    errno: AtomicI32,
    step: AtomicI32,
}

/// clone3 is missing (an old kernel or seccomp policy): use clone.
static NO_CLONE3: AtomicBool = AtomicBool::new(false);
/// The host refused a rank a `/proc` of its own: start ranks without one.
static NO_PRIVATE_PROC: AtomicBool = AtomicBool::new(false);

/// `hidepid=invisible`: only Linux 5.8 and later take the name, and only
/// they give each mount a procfs of its own. An older kernel refuses it
/// (EINVAL), so ranks start without it, instead of the number turning
/// hidepid on for the whole host (before 4.x's per-namespace procfs) or
/// being ignored without a word (5.3 to 5.7).
const HIDDEN_PROC_OPTIONS: &[u8] = b"hidepid=invisible\0";

impl Spawn {
    /// Starts the process; returns once it has exec'd, or with the reason
    /// it could not.
    pub fn start(&self) -> io::Result<Process> {
        let private_proc = self.private_proc && !NO_PRIVATE_PROC.load(Ordering::Relaxed);
        match self.start_with(private_proc) {
            // The host refuses it for good (no privilege, an old kernel, a
            // seccomp filter); anything else (out of memory or
            // descriptors) fails this start only.
            Err((
                Some((Step::PrivateProc, libc::EPERM | libc::EINVAL | libc::ENOSYS | libc::EACCES)),
                e,
            )) => {
                NO_PRIVATE_PROC.store(true, Ordering::Relaxed);
                tracing::warn!(
                    error = %e,
                    "this host refuses ranks a /proc of their own (hidepid): they start without one and can list other users' processes and command lines"
                );
                self.start_with(false).map_err(|(_, e)| e)
            }
            started => started.map_err(|(_, e)| e),
        }
    }

    /// [`Self::start`], once; an error names the child's step that failed
    /// and its errno.
    fn start_with(&self, private_proc: bool) -> Result<Process, (Option<(Step, i32)>, io::Error)> {
        if self.candidates.is_empty() {
            return Err((
                None,
                io::Error::new(io::ErrorKind::NotFound, "no program to run"),
            ));
        }
        let null_terminated = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let mut plan = ChildPlan {
            candidates: self.candidates.iter().map(|s| s.as_ptr()).collect(),
            argv: null_terminated(&self.argv),
            envp: null_terminated(&self.envp),
            fds: self.fds.clone(),
            cwd: self.cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            procs: -1,
            credentials: self.credentials,
            new_session: self.new_session,
            parent_death_signal: self.parent_death_signal.unwrap_or(0),
            // SAFETY: getpid has no preconditions.
            parent: unsafe { libc::getpid() },
            no_new_privs: self.no_new_privs,
            private_proc,
            errno: AtomicI32::new(0),
            step: AtomicI32::new(0),
        };
        let mut stack = vec![0u8; CHILD_STACK];
        let pid = self
            .clone_child(&mut plan, &mut stack)
            .map_err(|e| (None, e))?;
        let errno = plan.errno.load(Ordering::Acquire);
        if errno != 0 {
            // It exited without exec: reap it, and say why.
            let mut raw = 0;
            // SAFETY: our own child, which has exited (vfork semantics).
            unsafe { libc::waitpid(pid, &mut raw, 0) };
            let e = io::Error::from_raw_os_error(errno);
            let step = plan.step.load(Ordering::Acquire);
            if step == Step::Exec as i32 {
                return Err((Some((Step::Exec, errno)), e));
            }
            let failed = (step == Step::PrivateProc as i32).then_some((Step::PrivateProc, errno));
            return Err((
                failed,
                io::Error::new(
                    e.kind(),
                    format!("the child could not {}: {e}", Step::from_code(step)),
                ),
            ));
        }
        Ok(Process { pid, status: None })
    }

    /// clone3 into the cgroup where possible, else clone; the child runs
    /// [`child_main`] on `stack` and this returns once it exec'd or exited.
    fn clone_child(&self, plan: &mut ChildPlan, stack: &mut [u8]) -> io::Result<libc::pid_t> {
        // The top of the stack, 16-byte aligned as the ABI wants it at a call.
        let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
        let base = stack.as_mut_ptr() as usize;
        // SAFETY: an all-zero sigset_t is a valid (empty) set.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: plain signal-mask calls on locals. Every signal is blocked
        // in this thread, and so in the child from its first instruction,
        // until the child has reset the agent's handlers.
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
        }
        let mut pid = -1;
        let mut error = None;
        if cfg!(target_arch = "x86_64") && !NO_CLONE3.load(Ordering::Relaxed) {
            let mut args = CloneArgs {
                flags: (libc::CLONE_VM | libc::CLONE_VFORK) as u64,
                exit_signal: libc::SIGCHLD as u64,
                stack: base as u64,
                stack_size: (top - base) as u64,
                ..CloneArgs::default()
            };
            if let Some((dir, _)) = self.cgroup {
                args.flags |= CLONE_INTO_CGROUP;
                args.cgroup = dir as u64;
            }
            // SAFETY: the child runs child_main on its own stack with the
            // plan, which outlives it (this thread waits: CLONE_VFORK).
            let rc = unsafe { clone3(&mut args, plan) };
            if rc >= 0 {
                pid = rc as libc::pid_t;
            } else {
                let e = io::Error::from_raw_os_error(-rc as i32);
                if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::E2BIG)) {
                    NO_CLONE3.store(true, Ordering::Relaxed);
                } else {
                    error = Some(e);
                }
            }
        }
        if pid < 0 && error.is_none() {
            plan.procs = self.cgroup.map_or(-1, |(_, procs)| procs);
            // SAFETY: as above; glibc's clone starts child_entry on the
            // given stack top.
            let rc = unsafe {
                libc::clone(
                    child_entry,
                    top as *mut libc::c_void,
                    libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                    (plan as *mut ChildPlan).cast(),
                )
            };
            if rc < 0 {
                error = Some(io::Error::last_os_error());
            } else {
                pid = rc;
            }
        }
        // SAFETY: restores this thread's mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
        match error {
            Some(e) => Err(e),
            None => Ok(pid),
        }
    }
}

/// `struct clone_args` up to `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// clone3, with the child calling `child_main(plan)` on the new stack:
/// glibc has no clone3 wrapper, and a raw `syscall()` would return into
/// a frame the new stack does not have. Returns the pid or -errno.
///
/// # Safety
/// `args` must describe a valid stack; `plan` must outlive the child's
/// use of it (CLONE_VFORK).
#[cfg(target_arch = "x86_64")]
unsafe fn clone3(args: &mut CloneArgs, plan: &mut ChildPlan) -> isize {
    let ret: isize;
    // The kernel preserves every register but rax, rcx and r11; the child
    // starts with rax = 0 and rsp at the top of its stack, where it calls
    // child_main (which never returns).
    // SAFETY: the caller's contract: a valid stack and a live plan.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 as isize => ret,
            in("rdi") args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") plan as *mut ChildPlan,
            in("r13") child_main as extern "C" fn(*mut libc::c_void) -> !,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    ret
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3(_args: &mut CloneArgs, _plan: &mut ChildPlan) -> isize {
    -(libc::ENOSYS as isize)
}

extern "C" fn child_entry(plan: *mut libc::c_void) -> libc::c_int {
    child_main(plan)
}

/// The kernel's `struct sigaction` (rt_sigaction, 8-byte mask).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// The child, between clone and exec: raw system calls only (see the
/// module docs), on its own stack, reading the parent's plan.
extern "C" fn child_main(plan: *mut libc::c_void) -> ! {
    // SAFETY: the parent passed a live ChildPlan and waits until this
    // execs or exits; everything below is a system call on memory the
    // plan or this stack owns.
    unsafe {
        let plan = &*(plan as *const ChildPlan);
        let fail = |step: Step| fail(plan, step);
        // The agent's handlers would run on the agent's memory: back to
        // the defaults (SIGPIPE too, which Rust ignores), ignored ones kept.
        for sig in 1..=64 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old = KernelSigaction {
                handler: 0,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            let got = libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                std::ptr::null::<KernelSigaction>(),
                &mut old as *mut KernelSigaction,
                8,
            );
            let ignored = old.handler == libc::SIG_IGN;
            if got == 0 && old.handler != libc::SIG_DFL && (!ignored || sig == libc::SIGPIPE) {
                let default = KernelSigaction {
                    handler: libc::SIG_DFL,
                    flags: 0,
                    restorer: 0,
                    mask: 0,
                };
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &default as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    8,
                );
            }
        }
        // Into the cgroup (when clone3 did not put it there) before
        // anything else, while still privileged.
        if plan.procs >= 0 && libc::write(plan.procs, b"0".as_ptr().cast(), 1) != 1 {
            fail(Step::Cgroup);
        }
        // Own session and process group: signals reach its children too,
        // and it has no terminal of the agent's.
        if plan.new_session && libc::setsid() < 0 {
            fail(Step::Session);
        }
        // Each source first out of the way of every target (above them,
        // close-on-exec), then onto its number, which clears close-on-exec.
        let targets = plan.fds.len() as libc::c_int;
        let mut moved = [0 as RawFd; 16];
        if plan.fds.len() > moved.len() {
            fail(Step::Descriptors);
        }
        for (i, (from, _)) in plan.fds.iter().enumerate() {
            let high = libc::fcntl(*from, libc::F_DUPFD_CLOEXEC, targets);
            if high < 0 {
                fail(Step::Descriptors);
            }
            moved[i] = high;
        }
        for (i, (_, to)) in plan.fds.iter().enumerate() {
            if libc::dup2(moved[i], *to) != *to {
                fail(Step::Descriptors);
            }
        }
        // While still privileged: a mount table of its own, host mounts
        // still propagating in, with a /proc that hides what its user may
        // not inspect (a new procfs instance takes its own options).
        if plan.private_proc
            && (libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    HIDDEN_PROC_OPTIONS.as_ptr().cast(),
                ) != 0)
        {
            fail(Step::PrivateProc);
        }
        if let Some((uid, gid)) = plan.credentials {
            // Groups first: once the uid changes they may not.
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, gid) != 0
                || libc::syscall(libc::SYS_setuid, uid) != 0
            {
                fail(Step::Credentials);
            }
        }
        // As the rank's user: it starts only where it may go.
        if !plan.cwd.is_null() && libc::chdir(plan.cwd) != 0 {
            fail(Step::WorkingDir);
        }
        // After the switch: a change of credentials clears it.
        if plan.parent_death_signal != 0 {
            if libc::prctl(libc::PR_SET_PDEATHSIG, plan.parent_death_signal) != 0 {
                fail(Step::ParentDeath);
            }
            // The agent died before the signal was armed: it never comes.
            if libc::getppid() != plan.parent {
                libc::_exit(127);
            }
        }
        // No setuid binary can give it more than it has.
        if plan.no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            fail(Step::NoNewPrivs);
        }
        // Nothing of the agent's lives on, close-on-exec or not (ENOSYS
        // before Linux 5.9: close-on-exec, which Rust sets, still holds).
        libc::syscall(
            libc::SYS_close_range,
            targets as libc::c_uint,
            libc::c_uint::MAX,
            0,
        );
        let empty: u64 = 0;
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            std::ptr::null_mut::<u64>(),
            8,
        );
        let mut first_error = 0;
        for path in &plan.candidates {
            libc::execve(*path, plan.argv.as_ptr(), plan.envp.as_ptr());
            let errno = *libc::__errno_location();
            // As execvp: a missing or refused candidate, try the next.
            if first_error == 0 || !matches!(errno, libc::ENOENT | libc::ENOTDIR) {
                first_error = errno;
            }
            if !matches!(errno, libc::ENOENT | libc::ENOTDIR | libc::EACCES) {
                break;
            }
        }
        *libc::__errno_location() = first_error;
        fail(Step::Exec)
    }
}

/// Leaves errno and the step that failed for the parent, and exits.
///
/// # Safety
/// Only in the child, with the parent's live plan.
unsafe fn fail(plan: &ChildPlan, step: Step) -> ! {
    // SAFETY: errno is this thread's; `_exit` is async-signal-safe.
    unsafe {
        let errno = *libc::__errno_location();
        plan.step.store(step as i32, Ordering::Release);
        let errno = if errno == 0 { libc::EINVAL } else { errno };
        plan.errno.store(errno, Ordering::Release);
        libc::_exit(127)
    }
}

/// The paths execvp would try for `program` with `path` (the child's
/// `PATH`): the program itself when it names a path.
pub fn candidates(program: &str, path: Option<&str>) -> io::Result<Vec<CString>> {
    let nul = |e: std::ffi::NulError| io::Error::new(io::ErrorKind::InvalidInput, e);
    if program.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "empty program name",
        ));
    }
    if program.contains('/') {
        return Ok(vec![CString::new(program).map_err(nul)?]);
    }
    let search = path.unwrap_or("/usr/local/bin:/usr/bin:/bin");
    search
        .split(':')
        .map(|dir| {
            let dir = if dir.is_empty() { "." } else { dir };
            CString::new(format!("{}/{program}", dir.trim_end_matches('/'))).map_err(nul)
        })
        .collect()
}

/// `KEY=VALUE` strings for the child's environment.
pub fn environment<'a>(
    vars: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> io::Result<Vec<CString>> {
    vars.into_iter()
        .map(|(k, v)| {
            CString::new(format!("{k}={v}"))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    fn c(s: &str) -> CString {
        CString::new(s).expect("no NUL")
    }

    fn wait(p: &mut Process) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = p.try_wait().expect("wait") {
                return s;
            }
            assert!(Instant::now() < deadline, "the child did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn shell(script: &str, out: &std::fs::File) -> Spawn {
        Spawn {
            candidates: candidates("sh", Some("/usr/bin:/bin")).expect("paths"),
            argv: vec![c("sh"), c("-c"), c(script)],
            envp: environment([("A", "1")]).expect("env"),
            fds: vec![
                (out.as_raw_fd(), 0),
                (out.as_raw_fd(), 1),
                (out.as_raw_fd(), 2),
            ],
            new_session: true,
            no_new_privs: true,
            ..Spawn::default()
        }
    }

    #[test]
    fn a_child_gets_its_environment_descriptors_and_own_session() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = dir.path().join("out");
        let out = std::fs::File::create(&log).expect("log");
        let script = "echo \"A=$A B=${B-unset}\"; cut -d' ' -f1,5,6 /proc/$$/stat; \
                      grep NoNewPrivs /proc/self/status; ls /proc/self/fd | wc -l";
        let mut child = shell(script, &out).start().expect("spawn");
        let pid = child.id().expect("pid");
        assert!(wait(&mut child).success());
        assert_eq!(child.id(), None, "a reaped child has no pid");
        let text = std::fs::read_to_string(&log).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "A=1 B=unset", "{text}");
        let ids: Vec<&str> = lines[1].split_whitespace().collect();
        let pid = pid.to_string();
        assert_eq!(
            ids,
            [pid.as_str(); 3],
            "leads its group and session: {text}"
        );
        assert!(lines[2].ends_with('1'), "{text}");
        // 0, 1, 2 and the one ls opens for the listing.
        assert_eq!(lines[3].trim(), "4", "only its own descriptors: {text}");
    }

    #[test]
    fn a_missing_program_fails_at_start_with_its_errno() {
        let spawn = Spawn {
            candidates: candidates("no-such-program-shoal", Some("/nonexistent:/usr/bin"))
                .expect("paths"),
            argv: vec![c("no-such-program-shoal")],
            ..Spawn::default()
        };
        let e = spawn.start().expect_err("must fail");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn the_path_is_searched_in_order_and_a_path_is_taken_as_is() {
        let found = candidates("sh", Some("/a:/b/:")).expect("paths");
        assert_eq!(found, [c("/a/sh"), c("/b/sh"), c("./sh")]);
        assert_eq!(candidates("./x", Some("/a")).expect("paths"), [c("./x")]);
    }

    #[test]
    fn a_dropped_child_is_killed() {
        let out = std::fs::File::create("/dev/null").expect("null");
        let child = shell("exec sleep 600", &out).start().expect("spawn");
        let pid = child.id().expect("pid") as libc::pid_t;
        drop(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        // SAFETY: kill with signal 0 only checks for the process.
        while unsafe { libc::kill(pid, 0) } == 0 {
            assert!(Instant::now() < deadline, "still alive");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn caught_signals_are_default_again_in_the_child() {
        // SIGUSR1 caught here (a handler that does nothing), SIGPIPE
        // ignored as Rust does: both default in the child.
        extern "C" fn nothing(_: libc::c_int) {}
        // SAFETY: installing a handler that does nothing.
        unsafe { libc::signal(libc::SIGUSR1, nothing as *const () as libc::sighandler_t) };
        let dir = tempfile::tempdir().expect("tmp");
        let log = dir.path().join("out");
        let out = std::fs::File::create(&log).expect("log");
        let mut child = shell("grep -E 'SigCgt|SigIgn|SigBlk' /proc/self/status", &out)
            .start()
            .expect("spawn");
        assert!(wait(&mut child).success());
        let text = std::fs::read_to_string(&log).expect("read");
        let mask = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
                .expect("mask")
        };
        let bit = |sig: libc::c_int| 1u64 << (sig - 1);
        assert_eq!(mask("SigBlk:"), 0, "{text}");
        assert_eq!(mask("SigIgn:") & bit(libc::SIGPIPE), 0, "{text}");
        // sh catches some signals itself; SIGUSR1 is not one of them.
        assert_eq!(mask("SigCgt:") & bit(libc::SIGUSR1), 0, "{text}");
    }

    /// Panics with the reason where the test cannot run.
    fn needs_root() {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "this test needs root: the child switches users");
    }

    #[test]
    fn as_root_the_child_starts_in_its_cgroup_as_the_user_it_was_given() {
        needs_root();
        let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
        let mount = crate::executor::cgroup::cgroup2_mount(&mounts)
            .expect("this test needs a cgroup v2 hierarchy");
        let name = format!("shoal-spawn-test-{}", std::process::id());
        let cg = mount.join(&name);
        if let Err(e) = std::fs::create_dir(&cg) {
            panic!("this test needs a writable cgroup v2 hierarchy: {e}");
        }
        let dir = std::fs::File::open(&cg).expect("cgroup dir");
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(cg.join("cgroup.procs"))
            .expect("procs");
        let tmp = tempfile::tempdir().expect("tmp");
        let log = tmp.path().join("out");
        let out = std::fs::File::create(&log).expect("log");
        let mut spawn = shell("cat /proc/self/cgroup; id -u; id -G; pwd", &out);
        spawn.cgroup = Some((dir.as_raw_fd(), procs.as_raw_fd()));
        spawn.credentials = Some((65534, 65534));
        spawn.cwd = Some(c("/"));
        spawn.parent_death_signal = Some(libc::SIGKILL);
        let mut child = spawn.start().expect("spawn");
        let status = wait(&mut child);
        let text = std::fs::read_to_string(&log).expect("read");
        let _ = std::fs::remove_dir(&cg);
        assert!(status.success(), "{text}");
        // The unified line only (a hybrid host lists v1 hierarchies too).
        assert!(text.lines().any(|l| l == format!("0::/{name}")), "{text}");
        let rest: Vec<&str> = text.lines().filter(|l| !l.contains(':')).collect();
        assert_eq!(rest, ["65534", "65534", "/"], "{text}");
    }

    #[test]
    fn another_users_child_with_a_proc_of_its_own_sees_only_its_users_processes() {
        needs_root();
        // A process of root's that lives through the test.
        let mut root_sleeper = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        let tmp = tempfile::tempdir().expect("tmp");
        let log = tmp.path().join("out");
        let out = std::fs::File::create(&log).expect("log");
        let script = format!(
            "test -e /proc/{root} && echo root=seen || echo root=hidden\n\
             cat /proc/{root}/cmdline >/dev/null 2>&1 && echo cmdline=read || echo cmdline=denied\n\
             test -e /proc/$$ && echo self=seen || echo self=hidden\n\
             test -e /proc/1 && echo init=seen || echo init=hidden\n",
            root = root_sleeper.id()
        );
        let mut spawn = shell(&script, &out);
        spawn.credentials = Some((65534, 65534));
        spawn.cwd = Some(c("/"));
        spawn.private_proc = true;
        let mut child = spawn.start().expect("spawn");
        let status = wait(&mut child);
        let _ = root_sleeper.kill();
        let _ = root_sleeper.wait();
        let text = std::fs::read_to_string(&log).expect("read");
        assert!(status.success(), "{text}");
        assert!(
            !NO_PRIVATE_PROC.load(Ordering::Relaxed),
            "this host refused the child a /proc of its own"
        );
        for want in ["root=hidden", "cmdline=denied", "self=seen", "init=hidden"] {
            assert!(text.lines().any(|l| l == want), "want {want}:\n{text}");
        }
        // The agent's own /proc is untouched.
        assert!(std::path::Path::new("/proc/1").exists());
    }

    #[test]
    fn a_working_dir_the_user_may_not_enter_fails_the_start() {
        needs_root();
        let tmp = tempfile::tempdir().expect("tmp");
        let closed = tmp.path().join("closed");
        std::fs::create_dir(&closed).expect("dir");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let out = std::fs::File::create("/dev/null").expect("null");
        let mut spawn = shell("true", &out);
        spawn.credentials = Some((65534, 65534));
        spawn.cwd = Some(CString::new(closed.display().to_string()).expect("path"));
        let e = spawn.start().expect_err("must fail");
        assert!(e.to_string().contains("working directory"), "{e}");
    }
}
