//! Starting a rank: its job directory and restored checkpoint, its cgroup and fences, its environment (the gang's rendezvous, visible devices, `MASTER_PORT`), and the process itself.

use super::*;

/// Restores the checkpoint to resume from (every rank's part), then starts the rank.
pub(super) async fn prepare_and_launch(
    host: &RankHost,
    key: &RankKey,
    a: &Assignment,
    lease: Option<lease::Guarding>,
) -> Result<RunningRank, String> {
    let tenant = {
        let data = host
            .ledger
            .read()
            .map_err(|e| format!("cannot read the ledger: {}", e.message))?;
        account::TenantKey {
            cluster: data
                .ledger
                .cluster
                .as_ref()
                .map(|c| c.cluster_id.clone())
                .unwrap_or_default(),
            tenant: a.spec.tenant.clone(),
            created_at_ms: data
                .ledger
                .workload
                .tenants
                .get(&a.spec.tenant)
                .map_or(0, |t| t.created_at_ms),
        }
    };
    // A new tenant's uid is written to a file under a lock: off the async
    // threads.
    let users = host.users.clone();
    let account = tokio::task::spawn_blocking(move || users.resolve(&tenant))
        .await
        .map_err(|e| format!("the uid lookup failed: {e}"))??;
    let dir = job_dir(&host.jobs_dir, key.job);
    prepare_job_dir(&host.jobs_dir, &dir, &account)?;
    if let Some(ckpt) = a.restore.clone() {
        let started = Instant::now();
        let worker = host.chunks.clone();
        let handle = tokio::runtime::Handle::current();
        let step = ckpt.step;
        let (dir, owner) = (dir.clone(), account.clone());
        let restored =
            tokio::task::spawn_blocking(move || restore_for(&worker, handle, &ckpt, &dir, &owner))
                .await
                .map_err(|e| format!("restore task failed: {e}"))??;
        tracing::info!(
            job = key.job,
            rank = key.rank,
            step,
            bytes = restored,
            ms = started.elapsed().as_millis() as u64,
            "checkpoint restored"
        );
    }
    launch(host, key, a, &account, lease)
}

/// Whether ranks of `account` run as another user than the agent.
pub(super) fn switches(account: &account::Account) -> bool {
    // SAFETY: geteuid has no preconditions.
    account.uid != unsafe { libc::geteuid() }
}

/// The job's directory for `account`. When the rank runs as another user,
/// the job dir (its logs and launch markers) stays the agent's and only
/// `ckpt/` and `work/` (the rank's working directory) become the rank's,
/// 0700: the agent then never opens a path a job could have replaced with a
/// symlink. The jobs dir above only lets users pass.
pub(super) fn prepare_job_dir(
    jobs_dir: &Path,
    dir: &Path,
    account: &account::Account,
) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |p: &Path, e: std::io::Error| format!("cannot prepare {}: {e}", p.display());
    let ckpt = dir.join("ckpt");
    if !switches(account) {
        return std::fs::create_dir_all(&ckpt).map_err(|e| fail(&ckpt, e));
    }
    std::fs::create_dir_all(dir).map_err(|e| fail(dir, e))?;
    for (path, mode) in [(jobs_dir, 0o711), (dir, 0o711)] {
        std::os::unix::fs::lchown(path, Some(0), Some(0)).map_err(|e| fail(path, e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| fail(path, e))?;
    }
    for sub in [ckpt, dir.join("work")] {
        match std::fs::symlink_metadata(&sub) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => std::fs::remove_file(&sub).map_err(|e| fail(&sub, e))?,
            Err(_) => {}
        }
        if !sub.exists() {
            std::fs::create_dir(&sub).map_err(|e| fail(&sub, e))?;
        }
        std::os::unix::fs::lchown(&sub, Some(account.uid), Some(account.gid))
            .map_err(|e| fail(&sub, e))?;
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail(&sub, e))?;
    }
    Ok(())
}

/// Restores `checkpoint` into the job's `ckpt/`; blocking. For a rank of
/// another user the union is built in a scratch dir only the agent can
/// touch, handed to the user there, and moved into place whole, replacing
/// whatever the job left at that step (never following it).
pub(super) fn restore_for(
    net: &crate::rpc::chunks::ChunkNet,
    handle: tokio::runtime::Handle,
    checkpoint: &shoal_consensus::workload::Checkpoint,
    dir: &Path,
    account: &account::Account,
) -> Result<u64, String> {
    let ckpt_dir = dir.join("ckpt");
    if !switches(account) {
        return crate::ckpt::restore_checkpoint(net, handle, checkpoint, &ckpt_dir);
    }
    let scratch = dir.join(".restore");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir(&scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let bytes = crate::ckpt::restore_checkpoint(net, handle, checkpoint, &scratch)?;
    let step = checkpoint.step.to_string();
    let staged = scratch.join(&step);
    let mut pending = vec![staged.clone()];
    while let Some(path) = pending.pop() {
        std::os::unix::fs::lchown(&path, Some(account.uid), Some(account.gid))
            .map_err(|e| format!("cannot hand {} over: {e}", path.display()))?;
        if path.is_dir() && !path.is_symlink() {
            let entries = std::fs::read_dir(&path).map_err(|e| e.to_string())?;
            pending.extend(entries.flatten().map(|e| e.path()));
        }
    }
    let target = ckpt_dir.join(&step);
    match std::fs::symlink_metadata(&target) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&target),
        Ok(_) => std::fs::remove_file(&target),
        Err(_) => Ok(()),
    }
    .map_err(|e| format!("cannot replace {}: {e}", target.display()))?;
    std::fs::rename(&staged, &target)
        .map_err(|e| format!("cannot move the restore into {}: {e}", target.display()))?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(bytes)
}

/// How long each step of a launch took, logged at debug level
/// (`RUST_LOG=shoal_node::executor=debug`) for the launch profile.
#[derive(Default, Debug)]
pub(super) struct LaunchTimes {
    /// The launch marker's fsync, on a thread of its own meanwhile.
    marker: Duration,
    /// The cgroup, its limits and its GPU fence.
    cgroup: Duration,
    /// From clone to the job's exec.
    spawn: Duration,
    /// Starting the lease guard.
    guard: Duration,
    total: Duration,
}

pub(super) fn launch(
    host: &RankHost,
    key: &RankKey,
    a: &Assignment,
    account: &account::Account,
    lease: Option<lease::Guarding>,
) -> Result<RunningRank, String> {
    let started = Instant::now();
    let mut times = LaunchTimes::default();
    let jobs_dir = host.jobs_dir.clone();
    let dir = job_dir(&jobs_dir, key.job);
    let ckpt_dir = dir.join("ckpt");
    let log = log_path(&jobs_dir, key.job, key.rank);
    let mut out = open_rank_log(&log).map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    discard_uncommitted_steps(&ckpt_dir, a.restore.as_ref().map_or(0, |c| c.step));
    // The marker's fsync and the cgroup (with its BPF fence) are
    // independent: both at once, and both done before the rank starts.
    let (marked, fences) = std::thread::scope(|scope| {
        let marker = std::thread::Builder::new()
            .name("launch-marker".into())
            .spawn_scoped(scope, || {
                let t = Instant::now();
                mark_launched(&jobs_dir, key).map(|()| t.elapsed())
            });
        let t = Instant::now();
        let fences = rank_cgroup(host, key, &a.spec, &a.gpus);
        times.cgroup = t.elapsed();
        let marked = match marker {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|_| Err("the launch marker's thread panicked".to_string())),
            // No thread to spare: here, then.
            Err(_) => {
                let t = Instant::now();
                mark_launched(&jobs_dir, key).map(|()| t.elapsed())
            }
        };
        (marked, fences)
    });
    let mut fences = match (marked, fences) {
        (Ok(took), Ok(fences)) => {
            times.marker = took;
            fences
        }
        (Err(e), fences) => {
            if let Ok(Fences {
                cgroup: Some(cg), ..
            }) = fences
            {
                // Nothing ran in it.
                let _ = std::fs::remove_dir(cg.dir());
            }
            return Err(e);
        }
        (Ok(_), Err(e)) => return Err(e),
    };
    fences.lease = lease;
    let cgroup = fences.cgroup.clone();
    {
        use std::io::Write;
        let _ = writeln!(
            out,
            "--- shoal: job {} epoch {} rank {} starting on {} ---",
            key.job, key.epoch, key.rank, host.local.name
        );
        for note in &fences.unenforced {
            let _ = writeln!(
                out,
                "--- shoal: not enforced on {}: {note} ---",
                host.local.name
            );
        }
    }
    // An allocation only (`shoal alloc`): hold the GPUs with a process that
    // does nothing until it is stopped, so stop and fencing work the same
    // way for allocations as for jobs.
    let idle = ["sleep".to_string(), "infinity".to_string()];
    let fanned_out;
    let argv = if a.spec.command.is_empty() {
        &idle[..]
    } else if a.spec.tasks_per_node() > 1 && !a.spec.batch {
        // Several tasks: the launcher starts them inside this rank.
        fanned_out = task_launch(&host.task_launcher, &a.spec.command);
        &fanned_out[..]
    } else {
        &a.spec.command[..]
    };
    let launched = spawn(
        host,
        key,
        a,
        argv,
        (out, err),
        account,
        ckpt_dir,
        fences,
        &mut times,
    );
    if launched.is_err() {
        if let Some(cg) = cgroup {
            // Nothing ran in it.
            let _ = std::fs::remove_dir(cg.dir());
        }
    }
    times.total = started.elapsed();
    tracing::debug!(
        job = key.job,
        rank = key.rank,
        marker_us = times.marker.as_micros() as u64,
        cgroup_us = times.cgroup.as_micros() as u64,
        spawn_us = times.spawn.as_micros() as u64,
        guard_us = times.guard.as_micros() as u64,
        total_us = times.total.as_micros() as u64,
        "launch steps"
    );
    launched
}

/// The rank's cgroup and what it cannot enforce.
pub(super) struct Fences {
    cgroup: Option<Arc<cgroup::RankCgroup>>,
    unenforced: Vec<String>,
    lease: Option<lease::Guarding>,
    /// Only the rank's GPUs' device nodes open ([`gpu_fence`]).
    gpus_fenced: bool,
}

/// Creates the rank's cgroup with the job's limits and its GPU fence,
/// where the node has cgroups; the limits it cannot enforce come back as
/// sentences (the lease is the caller's to add).
pub(super) fn rank_cgroup(
    host: &RankHost,
    key: &RankKey,
    spec: &shoal_consensus::workload::JobSpec,
    gpus: &[u32],
) -> Result<Fences, String> {
    let limits = cgroup::Limits {
        mem_bytes: spec.mem_bytes,
        // Per task, and the rank's cgroup holds all its tasks.
        cpus: spec
            .cpus_per_task
            .map(|c| c.saturating_mul(spec.tasks_per_node())),
    };
    let Some(cgroups) = &host.cgroups else {
        let mut notes = Vec::new();
        if let Some(bytes) = limits.mem_bytes {
            notes.push(format!(
                "--mem {bytes} bytes: this node has no cgroups (isolation: none)"
            ));
        }
        if let Some(cpus) = limits.cpus {
            notes.push(format!(
                "--cpus-per-task {cpus}: this node has no cgroups (isolation: none)"
            ));
        }
        return Ok(Fences {
            cgroup: None,
            unenforced: notes,
            lease: None,
            gpus_fenced: false,
        });
    };
    let name = cgroup::rank_name(key.job, key.rank, key.epoch);
    let (cg, notes) = cgroups
        .create(&name, limits)
        .map_err(|e| format!("cannot create the rank's cgroup: {e}"))?;
    let fenced = cgroups.controllers().devices;
    if fenced {
        // Before anything runs in it: the rank never sees another GPU.
        let by_index = host.gpus.device_minors();
        let minors = gpus
            .iter()
            .filter_map(|g| by_index.get(g).copied())
            .collect();
        if let Err(e) = gpu_fence::attach(cg.dir(), &minors) {
            let _ = std::fs::remove_dir(cg.dir());
            return Err(format!("cannot fence the rank's GPUs: {e}"));
        }
    }
    Ok(Fences {
        cgroup: Some(Arc::new(cg)),
        unenforced: notes,
        lease: None,
        gpus_fenced: fenced,
    })
}

/// The environment a rank starts with, built from scratch: nothing of the
/// agent's (no token, no config) but the basics a program expects.
pub(super) fn base_env(account: &account::Account) -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOME".into(), account.home.display().to_string()),
        ("USER".into(), account.name.clone()),
        ("LOGNAME".into(), account.name.clone()),
        ("LANG".into(), "C.UTF-8".into()),
    ]
}

/// The rank's environment: later entries win, as with `Command::envs`.
pub(super) fn rank_env(
    entries: impl IntoIterator<Item = (String, String)>,
) -> BTreeMap<String, String> {
    entries.into_iter().collect()
}

/// Starts the rank ([`spawn`](mod@spawn): no copy of the agent's memory),
/// inside its cgroup from its first instruction, as its tenant's user,
/// leading its own session; then its lease guard.
#[allow(clippy::too_many_arguments)]
pub(super) fn spawn(
    host: &RankHost,
    key: &RankKey,
    a: &Assignment,
    argv: &[String],
    (out, err): (std::fs::File, std::fs::File),
    account: &account::Account,
    ckpt_dir: PathBuf,
    fences: Fences,
    times: &mut LaunchTimes,
) -> Result<RunningRank, String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let (program, _) = argv
        .split_first()
        .ok_or_else(|| "the job has no command".to_string())?;
    let cannot = |e: std::io::Error| format!("cannot run '{program}': {e}");
    // The cgroup's directory, for clone3 to start the rank inside, and its
    // cgroup.procs for kernels without that (the child writes "0").
    let cgroup_fds = match &fences.cgroup {
        Some(cg) => Some(
            cg.open_dir()
                .and_then(|dir| Ok((dir, cg.open_procs()?)))
                .map_err(|e| format!("cannot enter the rank's cgroup: {e}"))?,
        ),
        None => None,
    };
    // SAFETY: geteuid has no preconditions.
    let switch = (account.uid != unsafe { libc::geteuid() }).then_some((account.uid, account.gid));
    let env = rank_env(
        base_env(account)
            .into_iter()
            .chain(gang_env(host, key, a, &ckpt_dir, fences.gpus_fenced))
            .chain(a.spec.env.iter().map(|(k, v)| (k.clone(), v.clone()))),
    );
    let cwd = match &a.spec.workdir {
        Some(dir) => Some(PathBuf::from(dir)),
        // Another user cannot be left in the agent's working directory.
        None if switch.is_some() => Some(job_dir(&host.jobs_dir, key.job).join("work")),
        None => None,
    };
    let null =
        std::fs::File::open("/dev/null").map_err(|e| format!("cannot open /dev/null: {e}"))?;
    let nul = |e: std::ffi::NulError| format!("cannot run '{program}': {e}");
    let plan = spawn::Spawn {
        candidates: spawn::candidates(program, env.get("PATH").map(String::as_str))
            .map_err(cannot)?,
        argv: argv
            .iter()
            .map(|arg| std::ffi::CString::new(arg.as_str()).map_err(nul))
            .collect::<Result<_, _>>()?,
        envp: spawn::environment(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(cannot)?,
        fds: vec![
            (null.as_raw_fd(), 0),
            (out.as_raw_fd(), 1),
            (err.as_raw_fd(), 2),
        ],
        cwd: cwd
            .map(|d| std::ffi::CString::new(d.as_os_str().as_bytes()).map_err(nul))
            .transpose()?,
        cgroup: cgroup_fds
            .as_ref()
            .map(|(dir, procs)| (dir.as_raw_fd(), procs.as_raw_fd())),
        credentials: switch,
        new_session: true,
        // Die with the agent: the ledger is the only record of what runs.
        parent_death_signal: Some(libc::SIGKILL),
        no_new_privs: true,
        // Another user's rank sees neither other tenants' processes nor
        // the agent's.
        private_proc: switch.is_some(),
    };
    let t = Instant::now();
    let child = plan.start().map_err(cannot)?;
    times.spawn = t.elapsed();
    drop(cgroup_fds);
    let t = Instant::now();
    let mut guard = None;
    if let (Some(guarding), Some(pid)) = (&fences.lease, child.id()) {
        let kill = fences.cgroup.as_ref().and_then(|cg| cg.open_kill());
        let group = pid as libc::pid_t;
        let started = match &guarding.program {
            Some(program) => guarding
                .lease
                .spawn_guard(program, group, kill.as_ref())
                .map(Some),
            None => guarding.lease.fork_guard(group, kill).map(|()| None),
        };
        match started {
            Ok(g) => guard = g,
            Err(e) => {
                tracing::error!(job = key.job, rank = key.rank, error = %e, "cannot start the rank's lease guard");
            }
        }
    }
    times.guard = t.elapsed();
    tracing::info!(
        job = key.job,
        epoch = key.epoch,
        rank = key.rank,
        pid = child.id(),
        cgroup = fences
            .cgroup
            .as_ref()
            .map(|c| c.dir().display().to_string()),
        "rank started"
    );
    Ok(RunningRank {
        child,
        guard,
        term_sent: None,
        last_usr1: Instant::now(),
        warned: false,
        signals_sent: a.signals.len(),
        ckpt_dir,
        reported_step: None,
        recorded_step: None,
        retry_after: None,
        replicating: None,
        stall: StallWatch::new(Instant::now()),
        cgroup: fences.cgroup,
        unenforced: fences.unenforced,
    })
}

/// `CUDA_VISIBLE_DEVICES` for the rank's GPUs: their node indices, or —
/// behind the device fence on real GPUs, where CUDA numbers only the GPUs
/// the rank can open, so a node index would name the wrong one or none —
/// their UUIDs, which name each GPU whatever CUDA's numbering.
pub(super) fn visible_devices(
    gpus: &[u32],
    inventory: &[shoal_sdk::GpuInfo],
    by_uuid: bool,
) -> Vec<String> {
    gpus.iter()
        .map(|g| {
            inventory
                .iter()
                .find(|info| info.index == *g && !info.uuid.is_empty())
                .filter(|_| by_uuid)
                .map_or_else(|| g.to_string(), |info| info.uuid.clone())
        })
        .collect()
}

/// `shoal exec-tasks --label -- COMMAND`: the rank as its node's tasks.
pub(super) fn task_launch(launcher: &Path, command: &[String]) -> Vec<String> {
    let mut argv = vec![
        launcher.display().to_string(),
        "exec-tasks".to_string(),
        "--label".to_string(),
        "--".to_string(),
    ];
    argv.extend(command.iter().cloned());
    argv
}

/// The torchrun- and Slurm-compatible environment of INTERFACE.md, for the
/// node's rank; with several tasks per node the launcher gives each task
/// its own ranks and GPUs (`tasks::NodeTasks::task_env`).
pub(super) fn gang_env(
    host: &RankHost,
    key: &RankKey,
    a: &Assignment,
    ckpt_dir: &Path,
    gpus_fenced: bool,
) -> Vec<(String, String)> {
    let (master_addr, names) = host
        .ledger
        .read()
        .ok()
        .map(|d| {
            let member = |id: &NodeId| d.ledger.members.get(id);
            let master = a.world.first().and_then(member).and_then(|m| {
                m.spec
                    .rpc_addr
                    .parse::<std::net::SocketAddr>()
                    .ok()
                    .map(|s| s.ip().to_string())
            });
            let names: Vec<String> = a
                .world
                .iter()
                .map(|id| member(id).map_or_else(|| id.to_string(), |m| m.spec.name.clone()))
                .collect();
            (master, names)
        })
        .unwrap_or_default();
    let master_addr = master_addr.unwrap_or_else(|| "127.0.0.1".into());
    let gpus = visible_devices(
        &a.gpus,
        &host.local.spec.gpus,
        gpus_fenced && host.gpus.real(),
    );
    let nodes = a.world.len() as u32;
    let per_node = a.spec.tasks_per_node();
    let layout = tasks::NodeTasks {
        node_rank: key.rank,
        nodes,
        per_node,
        gpus: gpus.clone(),
    };
    let nodelist = crate::hostlist::compress_hostlist(&names);
    let submit_dir = a
        .spec
        .env
        .get("SLURM_SUBMIT_DIR")
        .cloned()
        .or_else(|| a.spec.workdir.clone())
        .unwrap_or_else(|| "/".into());
    let mut env: Vec<(String, String)> = vec![
        ("SHOAL_JOB_ID".into(), key.job.to_string()),
        ("SHOAL_EPOCH".into(), key.epoch.to_string()),
        ("NODE_RANK".into(), key.rank.to_string()),
        ("GROUP_RANK".into(), key.rank.to_string()),
        ("GROUP_WORLD_SIZE".into(), nodes.to_string()),
        ("ROLE_NAME".into(), "default".into()),
        ("MASTER_ADDR".into(), master_addr),
        (
            "MASTER_PORT".into(),
            a.master_port
                .unwrap_or_else(|| derived_master_port(key.epoch, 0))
                .to_string(),
        ),
        ("TORCHELASTIC_RUN_ID".into(), key.job.to_string()),
        ("TORCHELASTIC_RESTART_COUNT".into(), a.restarts.to_string()),
        (
            "TORCHELASTIC_MAX_RESTARTS".into(),
            a.spec.max_restarts.to_string(),
        ),
        ("SLURM_JOB_ID".into(), key.job.to_string()),
        ("SLURM_JOBID".into(), key.job.to_string()),
        ("SLURM_JOB_NAME".into(), a.spec.name.clone()),
        ("SLURM_JOB_PARTITION".into(), "shoal".into()),
        ("SLURM_NNODES".into(), nodes.to_string()),
        ("SLURM_JOB_NUM_NODES".into(), nodes.to_string()),
        ("SLURM_NODEID".into(), key.rank.to_string()),
        ("SLURM_JOB_NODELIST".into(), nodelist.clone()),
        ("SLURM_NODELIST".into(), nodelist),
        ("SLURMD_NODENAME".into(), host.local.name.clone()),
        ("SLURM_GPUS_ON_NODE".into(), gpus.len().to_string()),
        ("SLURM_SUBMIT_DIR".into(), submit_dir),
        ("SLURM_RESTART_COUNT".into(), a.restarts.to_string()),
        ("SHOAL_CKPT_DIR".into(), ckpt_dir.display().to_string()),
        ("SHOAL_API".into(), host.local.spec.api_url()),
        ("SHOAL_NODE".into(), host.local.name.clone()),
    ];
    // Task 0's ranks: what a one-task node runs as, and what the launcher
    // starts from.
    env.extend(layout.task_env(0));
    if per_node > 1 {
        // The launcher splits them per task.
        env.retain(|(k, _)| k != "CUDA_VISIBLE_DEVICES");
        env.push(("CUDA_VISIBLE_DEVICES".into(), gpus.join(",")));
    }
    if let Some(ca) = &host.ca_file {
        env.push(("SHOAL_CA_FILE".into(), ca.display().to_string()));
    }
    if let Some(ckpt) = &a.restore {
        env.push(("SHOAL_RESTORE_STEP".into(), ckpt.step.to_string()));
    }
    env
}

pub(super) fn signal(child: &spawn::Process, sig: libc::c_int) {
    if let Some(pid) = child.id() {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // The rank leads its own process group (setsid), so -pid reaches
            // everything it started. SAFETY: plain syscall on a pid we own.
            unsafe {
                libc::kill(-pid, sig);
            }
        }
    }
}

/// Candidates for an allocation's `MASTER_PORT`: from a port derived from
/// the epoch (so that concurrent allocations spread out), upwards,
/// wrapping within the 1000 ports above [`MASTER_PORT_BASE`].
pub(super) fn derived_master_port(epoch: u64, attempt: u64) -> u16 {
    let offset = epoch.wrapping_add(attempt) % MASTER_PORT_RANGE;
    u16::try_from(MASTER_PORT_BASE + offset).unwrap_or(29_500)
}

/// Ports of the `MASTER_PORT` range.
pub(super) const MASTER_PORT_RANGE: u64 = 1000;

/// Candidates tried before settling for the derived port anyway.
pub(super) const MASTER_PORT_TRIES: u64 = 64;

/// The first candidate `is_free` says no one holds on this node; the
/// derived port when none is (the rank then reports the clash itself).
pub(super) fn free_master_port(epoch: u64, is_free: impl Fn(u16) -> bool) -> u16 {
    (0..MASTER_PORT_TRIES)
        .map(|attempt| derived_master_port(epoch, attempt))
        .find(|port| is_free(*port))
        .unwrap_or_else(|| {
            tracing::warn!(
                epoch,
                "no free MASTER_PORT among {MASTER_PORT_TRIES} candidates"
            );
            derived_master_port(epoch, 0)
        })
}

/// Whether a TCP listener could bind `port` on every IPv4 address here
/// now (a dual-stack listener on `[::]` holds it too).
pub(super) fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)).is_ok()
}

/// Shell convention: 128 + signal number for a rank killed by a signal.
pub(super) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}
