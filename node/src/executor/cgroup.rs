//! Per-rank resource fences on cgroup v2. Every rank runs in a cgroup of
//! its own, `<parent>/shoal-ranks/<agent>/job-<id>-rank-<r>-e<epoch>`,
//! which it enters between fork and exec — before the privilege drop and
//! before it can start anything — so the rank and every descendant,
//! double-forked or in a new session, are inside. Stopping a rank
//! (cancel, fence, time limit, the exit of its main process) kills the
//! whole cgroup (`cgroup.kill`, else SIGKILL to every member until none is
//! left), waits until it is empty and removes it: no escaped child keeps a
//! GPU.
//!
//! Where the agent puts `shoal-ranks` (the rule, in [`placement`]):
//! - its own cgroup is the root of the hierarchy: `shoal-ranks` goes there
//!   (the root of a container's cgroup namespace, which is not the host's
//!   root and holds the container's processes, is treated as delegated);
//! - its own cgroup is delegated to it (systemd `Delegate=yes`: marked
//!   `trusted.delegate`/`user.delegate` for a root agent, writable for
//!   another user): the agent first moves itself into `<own>/agent` — the
//!   no-internal-processes rule lets a cgroup hand controllers to its
//!   children only while it holds no process itself — and `shoal-ranks`
//!   goes into `<own>`;
//! - otherwise a root agent uses the root of the hierarchy, and any other
//!   agent has no cgroups (isolation `none`).
//!
//! `<agent>` keeps the ranks of agents sharing a host apart: an agent
//! clears leftovers of its own previous run at start, never another's.
//! The `memory`, `cpu` and `pids` controllers are enabled for the ranks
//! where the parent offers them; on a hybrid host (v1 controllers, a
//! `unified` cgroup2 mount with none of them) a rank cgroup still gives
//! CPU accounting and the kill, but no limits.
//!
//! The pure parsers are at the top; the I/O takes its base path as a
//! parameter, so it is tested on a plain directory without root.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup under the parent that holds every agent's ranks.
pub const RANKS_DIR: &str = "shoal-ranks";
/// The leaf a delegated agent moves itself into.
pub const AGENT_LEAF: &str = "agent";
/// The `cpu.max` period, microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;
/// Leftover and stopped rank cgroups are given this long to empty.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted (no cgroup2 line in /proc/self/mounts)")]
    NoHierarchy,
    #[error("cannot tell this process's cgroup v2 (no `0::` line in /proc/self/cgroup)")]
    NoOwnCgroup,
    #[error("no cgroup this agent may create ranks in: its cgroup {own} is not delegated to it and it is not root (run it as root, or under systemd with Delegate=yes)")]
    NotWritable { own: PathBuf },
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the rank cgroup {} still has processes {}s after it was killed", path.display(), waited.as_secs())]
    StillPopulated { path: PathBuf, waited: Duration },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
    let path = path.to_path_buf();
    move |source| CgroupError::Io {
        action,
        path,
        source,
    }
}

/// The controllers that limit a rank, as far as the node has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Controllers {
    pub memory: bool,
    pub cpu: bool,
    pub pids: bool,
    /// The GPU device fence ([`super::gpu_fence`]): a BPF program, not a
    /// controller file, so [`Controllers::parse`] never sets it.
    pub devices: bool,
}

impl Controllers {
    /// From `cgroup.controllers` or `cgroup.subtree_control` (names
    /// separated by white space, a `+` in front tolerated); others ignored.
    pub fn parse(text: &str) -> Controllers {
        let mut c = Controllers::default();
        for word in text.split_whitespace() {
            match word.trim_start_matches('+') {
                "memory" => c.memory = true,
                "cpu" => c.cpu = true,
                "pids" => c.pids = true,
                _ => {}
            }
        }
        c
    }

    /// The names, in a fixed order.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.memory, "memory"),
            (self.cpu, "cpu"),
            (self.pids, "pids"),
            (self.devices, "devices"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// What a node enforces for its ranks (`shoal nodes`: `isolation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolation {
    None,
    Cgroup(Controllers),
}

impl Isolation {
    /// `none` or `cgroup`.
    pub fn mode(&self) -> &'static str {
        match self {
            Isolation::None => "none",
            Isolation::Cgroup(_) => "cgroup",
        }
    }

    pub fn controllers(&self) -> Vec<String> {
        match self {
            Isolation::None => Vec::new(),
            Isolation::Cgroup(c) => c.names().into_iter().map(String::from).collect(),
        }
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Isolation::None => f.write_str("none"),
            Isolation::Cgroup(c) if c.names().is_empty() => f.write_str("cgroup (kill only)"),
            Isolation::Cgroup(c) => write!(f, "cgroup ({})", c.names().join(",")),
        }
    }
}

/// A mount point of `/proc/self/mounts`, with its octal escapes (`\040`
/// for a space) undone.
fn unescape_mount(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup2 mount of `/proc/self/mounts`: `/sys/fs/cgroup` when it is
/// one (a pure v2 host), else the first cgroup2 mount (a hybrid host's
/// `/sys/fs/cgroup/unified`).
pub fn cgroup2_mount(mounts: &str) -> Option<PathBuf> {
    let found: Vec<String> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _source = fields.next()?;
            let target = fields.next()?;
            (fields.next()? == "cgroup2").then(|| unescape_mount(target))
        })
        .collect();
    found
        .iter()
        .find(|m| m.as_str() == "/sys/fs/cgroup")
        .or_else(|| found.first())
        .map(PathBuf::from)
}

/// This process's cgroup v2 path from `/proc/self/cgroup` (the `0::` line).
pub fn own_cgroup(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
        .filter(|p| p.starts_with('/'))
}

/// `populated` of `cgroup.events`.
pub fn populated(events: &str) -> Option<bool> {
    events.lines().find_map(|l| match l.split_once(' ')? {
        ("populated", v) => Some(v.trim() == "1"),
        _ => None,
    })
}

/// `oom_kill` of `memory.events`.
pub fn oom_kill_count(memory_events: &str) -> Option<u64> {
    memory_events
        .lines()
        .find_map(|l| match l.split_once(' ')? {
            ("oom_kill", v) => v.trim().parse().ok(),
            _ => None,
        })
}

/// `usage_usec` of `cpu.stat`.
pub fn cpu_usage_usec(cpu_stat: &str) -> Option<u64> {
    cpu_stat.lines().find_map(|l| match l.split_once(' ')? {
        ("usage_usec", v) => v.trim().parse().ok(),
        _ => None,
    })
}

/// `cpu.max` for `cpus` CPUs: the quota per period, both microseconds.
pub fn cpu_max(cpus: u32) -> String {
    format!(
        "{} {CPU_PERIOD_US}",
        u64::from(cpus).saturating_mul(CPU_PERIOD_US)
    )
}

/// Where the agent keeps its ranks' cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The cgroup `shoal-ranks` is created in.
    pub parent: PathBuf,
    /// A leaf the agent moves itself into first (delegation).
    pub move_agent_to: Option<PathBuf>,
}

/// The rule of the module doc: `own` is the agent's cgroup path inside the
/// hierarchy mounted at `mount`; `delegated`, whether that cgroup is the
/// agent's to manage (for the root of a cgroup namespace: whether it is a
/// container's, which holds processes, not the host's real root, which is
/// exempt from the no-internal-processes rule).
pub fn placement(mount: &Path, own: &str, is_root: bool, delegated: bool) -> Option<Placement> {
    let relative = own.trim_start_matches('/');
    if relative.is_empty() {
        return Some(Placement {
            parent: mount.to_path_buf(),
            move_agent_to: delegated.then(|| mount.join(AGENT_LEAF)),
        });
    }
    let own_dir = mount.join(relative);
    if delegated {
        // A delegated agent restarted in place is already in its leaf.
        if own_dir.file_name().is_some_and(|n| n == AGENT_LEAF) {
            if let Some(parent) = own_dir.parent() {
                return Some(Placement {
                    parent: parent.to_path_buf(),
                    move_agent_to: None,
                });
            }
        }
        return Some(Placement {
            move_agent_to: Some(own_dir.join(AGENT_LEAF)),
            parent: own_dir,
        });
    }
    is_root.then(|| Placement {
        parent: mount.to_path_buf(),
        move_agent_to: None,
    })
}

/// This agent's name under `shoal-ranks`: its node name (file-name safe)
/// and a hash of its data dir, stable across restarts and distinct for two
/// agents on one host.
pub fn agent_key(name: &str, data_dir: &Path) -> String {
    let safe: String = name
        .chars()
        .take(48)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // FNV-1a: stable across releases, unlike std's hasher.
    let hash = data_dir
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
        });
    format!("{}-{hash:08x}", safe.trim_start_matches('.'))
}

/// A rank's cgroup name; the epoch makes every attempt of a rank distinct.
pub fn rank_name(job: u64, rank: u32, epoch: u64) -> String {
    format!("job-{job}-rank-{rank}-e{epoch}")
}

/// What a job asks of each rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub mem_bytes: Option<u64>,
    pub cpus: Option<u32>,
}

/// What a rank used, read before its cgroup is removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_usec: Option<u64>,
    pub mem_peak_bytes: Option<u64>,
    /// `oom_kill` of `memory.events`: processes of the rank the kernel's
    /// OOM killer ended (the cgroup is the rank's own, so any is the rank's).
    pub oom_kills: Option<u64>,
}

impl Usage {
    /// The OOM killer ended a process of the rank.
    pub fn oom_killed(&self) -> bool {
        self.oom_kills.is_some_and(|n| n > 0)
    }
}

fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(io_err("read", path))
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io_err("write", path))
}

fn make_dir(path: &Path) -> Result<bool, CgroupError> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_err("create", path)(e)),
    }
}

/// Hands `wanted` to the children of `dir` (`cgroup.subtree_control`), all
/// at once, else one by one; what the kernel refuses is left out.
fn enable(dir: &Path, wanted: Controllers) {
    let names = wanted.names();
    if names.is_empty() {
        return;
    }
    let file = dir.join("cgroup.subtree_control");
    let all: Vec<String> = names.iter().map(|n| format!("+{n}")).collect();
    if std::fs::write(&file, all.join(" ")).is_ok() {
        return;
    }
    for one in all {
        if let Err(e) = std::fs::write(&file, &one) {
            tracing::debug!(file = %file.display(), controller = %one, error = %e, "controller not enabled for the ranks");
        }
    }
}

/// The agent's part of the hierarchy: `<parent>/shoal-ranks/<agent>`.
#[derive(Debug)]
pub struct RankCgroups {
    parent: PathBuf,
    dir: PathBuf,
    controllers: Controllers,
}

impl RankCgroups {
    /// Finds this host's cgroup2 hierarchy and the agent's place in it
    /// ([`placement`]), and sets up its ranks' part ([`RankCgroups::under`]).
    pub fn detect(agent: &str) -> Result<RankCgroups, CgroupError> {
        let mounts = read(Path::new("/proc/self/mounts"))?;
        let mount = cgroup2_mount(&mounts).ok_or(CgroupError::NoHierarchy)?;
        let own =
            own_cgroup(&read(Path::new("/proc/self/cgroup"))?).ok_or(CgroupError::NoOwnCgroup)?;
        let own_dir = mount.join(own.trim_start_matches('/'));
        // SAFETY: geteuid has no preconditions.
        let is_root = unsafe { libc::geteuid() } == 0;
        let delegated = if own_dir == mount {
            // Only the host's real root cgroup has no `cgroup.type`.
            mount.join("cgroup.type").exists()
        } else {
            delegated(&own_dir, is_root)
        };
        let place = placement(&mount, &own, is_root, delegated).ok_or_else(|| {
            CgroupError::NotWritable {
                own: own_dir.clone(),
            }
        })?;
        if let Some(leaf) = &place.move_agent_to {
            make_dir(leaf)?;
            write(&leaf.join("cgroup.procs"), &std::process::id().to_string())?;
            tracing::info!(cgroup = %leaf.display(), "moved the agent into a leaf of its delegated cgroup");
        }
        let mut cgroups = RankCgroups::under(&place.parent, agent)?;
        match super::gpu_fence::probe(&cgroups.dir) {
            Ok(()) => cgroups.controllers.devices = true,
            Err(e) => tracing::warn!(
                error = %e,
                "cannot fence GPU device nodes here (no cgroup-device BPF): a rank can open every GPU its user may open"
            ),
        }
        Ok(cgroups)
    }

    /// Creates `<parent>/shoal-ranks/<agent>` (kept when present) and
    /// enables for the ranks what of memory, cpu and pids the parent offers.
    pub fn under(parent: &Path, agent: &str) -> Result<RankCgroups, CgroupError> {
        let offered = Controllers::parse(&read(&parent.join("cgroup.controllers"))?);
        let ranks = parent.join(RANKS_DIR);
        let dir = ranks.join(agent);
        let mut cgroups = RankCgroups {
            parent: parent.to_path_buf(),
            dir,
            controllers: offered,
        };
        cgroups.ensure()?;
        Ok(cgroups)
    }

    /// (Re)creates the agent's directory and enables the controllers down
    /// to it; records what its children get.
    fn ensure(&mut self) -> Result<(), CgroupError> {
        let ranks = self.parent.join(RANKS_DIR);
        enable(&self.parent, self.controllers);
        make_dir(&ranks)?;
        enable(&ranks, self.controllers);
        make_dir(&self.dir)?;
        enable(&self.dir, self.controllers);
        let given = read(&self.dir.join("cgroup.subtree_control"))
            .map(|t| Controllers::parse(&t))
            .unwrap_or_default();
        self.controllers = Controllers {
            memory: self.controllers.memory && given.memory,
            cpu: self.controllers.cpu && given.cpu,
            pids: self.controllers.pids && given.pids,
            devices: self.controllers.devices,
        };
        Ok(())
    }

    /// The controllers rank cgroups get.
    pub fn controllers(&self) -> Controllers {
        self.controllers
    }

    pub fn isolation(&self) -> Isolation {
        Isolation::Cgroup(self.controllers)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills and removes the rank cgroups a previous run of this agent
    /// left, and removes the empty directories of agents gone from this
    /// host (an agent whose directory disappears recreates it: see
    /// [`RankCgroups::create`]). Returns the leftovers cleared and the
    /// failures.
    pub async fn clear_leftovers(&self) -> (usize, Vec<CgroupError>) {
        let mut cleared = 0;
        let mut failed = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => return (0, vec![io_err("list", &self.dir)(e)]),
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let rank = RankCgroup { dir: entry.path() };
            match rank.drain(DRAIN_TIMEOUT).await {
                Ok(_) => cleared += 1,
                Err(e) => failed.push(e),
            }
        }
        if let Some(ranks) = self.dir.parent() {
            for entry in std::fs::read_dir(ranks).into_iter().flatten().flatten() {
                // Fails for any directory that has ranks (or processes).
                if entry.path() != self.dir && entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
        (cleared, failed)
    }

    /// Creates the cgroup `name` for a rank with `limits`. A limit the node
    /// cannot enforce (no such controller, or the kernel refused it) does
    /// not stop the rank: it comes back as a sentence in the list.
    pub fn create(
        &self,
        name: &str,
        limits: Limits,
    ) -> Result<(RankCgroup, Vec<String>), CgroupError> {
        let rank = RankCgroup {
            dir: self.dir.join(name),
        };
        let created = match std::fs::create_dir(&rank.dir) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            // The agent's directory was swept away: recreate it, once.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut again = RankCgroups {
                    parent: self.parent.clone(),
                    dir: self.dir.clone(),
                    controllers: self.controllers,
                };
                again.ensure()?;
                make_dir(&rank.dir)?
            }
            Err(e) => return Err(io_err("create", &rank.dir)(e)),
        };
        if !created {
            // A leftover of the same name: never share a cgroup with it.
            rank.kill().map_err(io_err("kill", &rank.dir))?;
            if rank.populated().unwrap_or(true) {
                return Err(CgroupError::StillPopulated {
                    path: rank.dir.clone(),
                    waited: Duration::ZERO,
                });
            }
            std::fs::remove_dir(&rank.dir).map_err(io_err("remove", &rank.dir))?;
            make_dir(&rank.dir)?;
        }
        let mut unenforced = Vec::new();
        if let Some(bytes) = limits.mem_bytes {
            if !self.controllers.memory {
                unenforced.push(format!(
                    "--mem {bytes} bytes: this node has no cgroup v2 memory controller"
                ));
            } else if let Err(e) = write(&rank.dir.join("memory.max"), &bytes.to_string()) {
                unenforced.push(format!("--mem {bytes} bytes: {e}"));
            } else {
                // An OOM kill takes the whole rank, not one of its processes.
                let _ = std::fs::write(rank.dir.join("memory.oom.group"), "1");
            }
        }
        if let Some(cpus) = limits.cpus {
            if !self.controllers.cpu {
                unenforced.push(format!(
                    "--cpus-per-task {cpus}: this node has no cgroup v2 cpu controller"
                ));
            } else if let Err(e) = write(&rank.dir.join("cpu.max"), &cpu_max(cpus)) {
                unenforced.push(format!("--cpus-per-task {cpus}: {e}"));
            }
        }
        Ok((rank, unenforced))
    }

    /// Removes the agent's directory once it holds no rank (at shutdown).
    pub fn remove_if_empty(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Whether the agent's own cgroup is its to manage: marked delegated by
/// systemd (root), or writable (another user, who can write only there
/// when it was delegated).
fn delegated(own_dir: &Path, is_root: bool) -> bool {
    if is_root {
        return ["trusted.delegate", "user.delegate"]
            .iter()
            .any(|attr| xattr(own_dir, attr).is_some_and(|v| v == b"1"));
    }
    let writable = |p: &Path| {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
    };
    writable(own_dir)
        && writable(&own_dir.join("cgroup.procs"))
        && writable(&own_dir.join("cgroup.subtree_control"))
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let n = std::ffi::CString::new(name).ok()?;
    let mut buf = [0u8; 16];
    // SAFETY: valid NUL-terminated strings and a buffer of the size given.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let len = usize::try_from(len).ok()?;
    Some(buf[..len.min(buf.len())].to_vec())
}

/// One rank's cgroup.
#[derive(Debug)]
pub struct RankCgroup {
    dir: PathBuf,
}

impl RankCgroup {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs`, opened for the rank to write "0" to between fork
    /// and exec (which moves the writer); close-on-exec.
    pub fn open_procs(&self) -> io::Result<OwnedFd> {
        let path = self.dir.join("cgroup.procs");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map(OwnedFd::from)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display())))
    }

    /// The cgroup's directory, opened for `clone3` to start the rank inside
    /// (`CLONE_INTO_CGROUP`); close-on-exec.
    pub fn open_dir(&self) -> io::Result<OwnedFd> {
        std::fs::File::open(&self.dir).map(OwnedFd::from)
    }

    /// `cgroup.kill`, opened for a rank's lease guard to write to later
    /// (`None` on a kernel without it).
    pub fn open_kill(&self) -> Option<std::os::fd::OwnedFd> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
            .ok()
            .map(std::os::fd::OwnedFd::from)
    }

    /// SIGKILL to every process inside: `cgroup.kill` (Linux 5.14), else
    /// one by one over `cgroup.procs` (call again until
    /// [`RankCgroup::populated`] is false: a process may fork meanwhile).
    pub fn kill(&self) -> io::Result<()> {
        use std::io::Write;
        // Never created: a kernel without cgroup.kill has no such file.
        let kill = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"));
        match kill {
            Ok(mut f) => return f.write_all(b"1"),
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            Err(_) if !self.dir.exists() => return Ok(()),
            Err(_) => {}
        }
        let procs = match std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for pid in procs
            .lines()
            .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
        {
            if pid > 0 {
                // SAFETY: a plain syscall; the pid is inside the rank's cgroup.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        Ok(())
    }

    /// Whether any process is still inside (`cgroup.events`, else
    /// `cgroup.procs`); a cgroup that is gone is empty.
    pub fn populated(&self) -> io::Result<bool> {
        match std::fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(text) => {
                if let Some(p) = populated(&text) {
                    return Ok(p);
                }
            }
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            Err(_) => {}
        }
        match std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            Ok(procs) => Ok(procs.lines().any(|l| !l.trim().is_empty())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// What the rank used (`cpu.stat`, `memory.peak`) and whether the OOM
    /// killer struck (`memory.events`), where present.
    pub fn usage(&self) -> Usage {
        let file = |name: &str| std::fs::read_to_string(self.dir.join(name)).ok();
        Usage {
            cpu_usec: file("cpu.stat").as_deref().and_then(cpu_usage_usec),
            mem_peak_bytes: file("memory.peak").and_then(|t| t.trim().parse().ok()),
            oom_kills: file("memory.events").as_deref().and_then(oom_kill_count),
        }
    }

    /// Kills everything inside and, once nothing is left, removes the
    /// cgroup: true when it is gone. Never blocks.
    pub fn try_remove(&self) -> Result<bool, CgroupError> {
        self.kill().map_err(io_err("kill", &self.dir))?;
        if self.populated().map_err(io_err("read", &self.dir))? {
            return Ok(false);
        }
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
            // Emptied and refilled in between (a fork racing the kill).
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
            Err(e) => Err(io_err("remove", &self.dir)(e)),
        }
    }

    /// Kills everything inside, waits until it is empty (at most
    /// `timeout`) and removes the cgroup; returns what the rank used.
    pub async fn drain(&self, timeout: Duration) -> Result<Usage, CgroupError> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(5);
        loop {
            // Read before the directory goes (and after the last process).
            let usage = self.usage();
            if self.try_remove()? {
                return Ok(usage);
            }
            if started.elapsed() >= timeout {
                return Err(CgroupError::StillPopulated {
                    path: self.dir.clone(),
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oom_kill_count_is_read_from_memory_events() {
        let events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(events), Some(1));
        assert_eq!(oom_kill_count("low 0\nmax 0\n"), None);
        let usage = Usage {
            oom_kills: Some(0),
            ..Usage::default()
        };
        assert!(!usage.oom_killed());
        assert!(Usage {
            oom_kills: Some(1),
            ..usage
        }
        .oom_killed());
    }

    #[test]
    fn the_cgroup2_mount_is_found_on_pure_and_hybrid_hosts() {
        let hybrid = "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n\
                      cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
                      cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure = "proc /proc proc rw 0 0\n\
                    cgroup2 /run/other\\040place cgroup2 rw 0 0\n\
                    cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec 0 0\n";
        assert_eq!(cgroup2_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        let odd = "cgroup2 /run/other\\040place cgroup2 rw 0 0\n";
        assert_eq!(cgroup2_mount(odd), Some(PathBuf::from("/run/other place")));
        let v1 = "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n";
        assert_eq!(cgroup2_mount(v1), None);
        assert_eq!(cgroup2_mount(""), None);
    }

    #[test]
    fn the_own_cgroup_is_the_unified_line() {
        let hybrid = "9:name=systemd:/\n4:memory:/process_api/11fb\n0::/\n";
        assert_eq!(own_cgroup(hybrid), Some("/".into()));
        let unit = "0::/system.slice/shoal.service\n";
        assert_eq!(own_cgroup(unit), Some("/system.slice/shoal.service".into()));
        assert_eq!(own_cgroup("4:memory:/x\n"), None);
        assert_eq!(own_cgroup("0::\n"), None);
    }

    #[test]
    fn controllers_events_and_cpu_stat_parse() {
        let c = Controllers::parse("cpuset cpu io memory hugetlb pids rdma misc\n");
        assert_eq!(
            c,
            Controllers {
                memory: true,
                cpu: true,
                pids: true,
                devices: false
            }
        );
        assert_eq!(c.names(), ["memory", "cpu", "pids"]);
        assert_eq!(
            Controllers::parse("+memory +pids"),
            Controllers {
                memory: true,
                cpu: false,
                pids: true,
                devices: false
            }
        );
        assert_eq!(Controllers::parse("hugetlb\n"), Controllers::default());
        assert_eq!(populated("populated 1\nfrozen 0\n"), Some(true));
        assert_eq!(populated("populated 0\nfrozen 0\n"), Some(false));
        assert_eq!(populated("frozen 0\n"), None);
        let stat = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n";
        assert_eq!(cpu_usage_usec(stat), Some(1_234_567));
        assert_eq!(cpu_usage_usec("nr_periods 0\n"), None);
        assert_eq!(cpu_max(2), "200000 100000");
        assert_eq!(cpu_max(1), "100000 100000");
    }

    #[test]
    fn isolation_reads_as_the_nodes_view_shows_it() {
        assert_eq!(Isolation::None.to_string(), "none");
        assert_eq!(
            Isolation::Cgroup(Controllers::default()).to_string(),
            "cgroup (kill only)"
        );
        let all = Controllers::parse("memory cpu pids");
        assert_eq!(
            Isolation::Cgroup(all).to_string(),
            "cgroup (memory,cpu,pids)"
        );
        assert_eq!(Isolation::Cgroup(all).mode(), "cgroup");
        assert_eq!(
            Isolation::Cgroup(all).controllers(),
            ["memory", "cpu", "pids"]
        );
        assert!(Isolation::None.controllers().is_empty());
    }

    #[test]
    fn the_agent_places_its_ranks_by_the_rule() {
        let mount = Path::new("/sys/fs/cgroup");
        let root = Placement {
            parent: mount.into(),
            move_agent_to: None,
        };
        // The root of the hierarchy.
        assert_eq!(placement(mount, "/", false, false), Some(root.clone()));
        // The root of a container's cgroup namespace holds its processes:
        // the agent leaves it for a leaf first.
        assert_eq!(
            placement(mount, "/", true, true),
            Some(Placement {
                parent: mount.into(),
                move_agent_to: Some(mount.join("agent")),
            })
        );
        // Delegated: the agent leaves its cgroup for a leaf first.
        let unit = "/system.slice/shoal.service";
        assert_eq!(
            placement(mount, unit, true, true),
            Some(Placement {
                parent: mount.join("system.slice/shoal.service"),
                move_agent_to: Some(mount.join("system.slice/shoal.service/agent")),
            })
        );
        assert_eq!(
            placement(mount, "/system.slice/shoal.service/agent", false, true),
            Some(Placement {
                parent: mount.join("system.slice/shoal.service"),
                move_agent_to: None,
            })
        );
        // Not delegated: root takes the root of the hierarchy, others nothing.
        assert_eq!(placement(mount, unit, true, false), Some(root));
        assert_eq!(placement(mount, unit, false, false), None);
    }

    #[test]
    fn agent_keys_are_stable_distinct_and_file_name_safe() {
        let a = agent_key("n1", Path::new("/tmp/a/n1"));
        assert_eq!(a, agent_key("n1", Path::new("/tmp/a/n1")));
        assert_ne!(a, agent_key("n1", Path::new("/tmp/b/n1")));
        assert!(a.starts_with("n1-"));
        let odd = agent_key("../we ird/", Path::new("/x"));
        assert!(!odd.contains('/') && !odd.starts_with('.'), "{odd}");
        assert_eq!(rank_name(7, 1, 42), "job-7-rank-1-e42");
    }

    /// A directory that looks like a cgroup v2 parent offering `controllers`.
    fn fake_parent(controllers: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cgroup.controllers"), controllers).expect("write");
        dir
    }

    #[test]
    fn limits_are_written_where_the_controllers_exist() {
        let parent = fake_parent("cpuset cpu io memory pids\n");
        let cgroups = RankCgroups::under(parent.path(), "n1-0000").expect("set up");
        assert_eq!(cgroups.controllers(), Controllers::parse("memory cpu pids"));
        assert_eq!(cgroups.isolation().to_string(), "cgroup (memory,cpu,pids)");
        let subtree = |p: &Path| std::fs::read_to_string(p.join("cgroup.subtree_control"));
        // Enabled at every level down to the agent's directory.
        for dir in [
            parent.path().to_path_buf(),
            parent.path().join(RANKS_DIR),
            parent.path().join(RANKS_DIR).join("n1-0000"),
        ] {
            assert_eq!(
                subtree(&dir).expect("subtree_control"),
                "+memory +cpu +pids"
            );
        }
        let limits = Limits {
            mem_bytes: Some(512 << 20),
            cpus: Some(2),
        };
        let (rank, unenforced) = cgroups.create(&rank_name(3, 0, 9), limits).expect("create");
        assert!(unenforced.is_empty(), "{unenforced:?}");
        assert_eq!(rank.dir(), cgroups.dir().join("job-3-rank-0-e9"));
        let file = |name: &str| std::fs::read_to_string(rank.dir().join(name)).expect(name);
        assert_eq!(file("memory.max"), "536870912");
        assert_eq!(file("cpu.max"), "200000 100000");
        assert_eq!(file("memory.oom.group"), "1");
        // No limit asked: none written.
        let (plain, unenforced) = cgroups.create("plain", Limits::default()).expect("create");
        assert!(unenforced.is_empty());
        assert!(!plain.dir().join("memory.max").exists());
        assert!(!plain.dir().join("cpu.max").exists());
    }

    #[test]
    fn limits_the_node_cannot_enforce_are_reported_not_fatal() {
        // A hybrid host: the unified hierarchy offers none of the controllers.
        let parent = fake_parent("hugetlb\n");
        let cgroups = RankCgroups::under(parent.path(), "n1-0000").expect("set up");
        assert_eq!(cgroups.isolation().to_string(), "cgroup (kill only)");
        let limits = Limits {
            mem_bytes: Some(1 << 30),
            cpus: Some(4),
        };
        let (rank, unenforced) = cgroups
            .create("r", limits)
            .expect("the rank still gets a cgroup");
        assert_eq!(unenforced.len(), 2, "{unenforced:?}");
        assert!(unenforced[0].contains("--mem") && unenforced[0].contains("memory controller"));
        assert!(unenforced[1].contains("--cpus-per-task 4"));
        assert!(!rank.dir().join("memory.max").exists());
    }

    #[tokio::test]
    async fn a_drained_empty_cgroup_is_removed_and_a_swept_agent_dir_comes_back() {
        let parent = fake_parent("memory\n");
        let cgroups = RankCgroups::under(parent.path(), "n1-0000").expect("set up");
        let (rank, _) = cgroups.create("r", Limits::default()).expect("create");
        // A plain directory has no cgroup.events or procs: empty.
        assert!(!rank.populated().expect("read"));
        let usage = rank.drain(Duration::from_secs(1)).await.expect("drained");
        assert_eq!(usage, Usage::default());
        assert!(!rank.dir().exists());
        // Draining what is gone already is no error.
        rank.drain(Duration::from_secs(1)).await.expect("gone");
        // Another agent swept the (empty) directory away: the next rank
        // recreates it.
        std::fs::remove_dir_all(cgroups.dir()).expect("sweep");
        let (again, _) = cgroups.create("r2", Limits::default()).expect("recreated");
        assert!(again.dir().is_dir());
        assert_eq!(
            std::fs::read_to_string(cgroups.dir().join("cgroup.subtree_control")).expect("read"),
            "+memory"
        );
    }

    #[tokio::test]
    async fn leftovers_of_the_previous_run_are_cleared_and_only_those() {
        let parent = fake_parent("memory cpu pids\n");
        let cgroups = RankCgroups::under(parent.path(), "n1-0000").expect("set up");
        let ranks = parent.path().join(RANKS_DIR);
        std::fs::create_dir(cgroups.dir().join("job-1-rank-0-e3")).expect("leftover");
        // Another agent of this host: gone (empty), and one with a rank.
        std::fs::create_dir(ranks.join("n2-1111")).expect("gone agent");
        std::fs::create_dir_all(ranks.join("n3-2222/job-2-rank-0-e5")).expect("busy agent");
        let (cleared, failed) = cgroups.clear_leftovers().await;
        assert_eq!((cleared, failed.len()), (1, 0), "{failed:?}");
        assert!(!cgroups.dir().join("job-1-rank-0-e3").exists());
        assert!(cgroups.dir().is_dir(), "its own directory stays");
        assert!(!ranks.join("n2-1111").exists());
        assert!(
            ranks.join("n3-2222/job-2-rank-0-e5").is_dir(),
            "another agent's rank was touched"
        );
    }
}
