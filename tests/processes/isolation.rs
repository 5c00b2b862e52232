//! A tenant's job is hostile input. Under a root agent with the default
//! configuration its ranks run as an unprivileged user of the tenant's own
//! — mapped (`executor.users`) or a uid the agent gives it for good
//! — with an environment built from scratch and a `/proc` that lists only
//! its user's processes, so a job can read nothing of the agent (its data
//! dir, the admin token, its environment or command line), cannot signal
//! it, and cannot ptrace, signal, inspect or read the files of another
//! tenant's ranks. Needs root (the agent switches users); fails with that
//! reason otherwise.
//!
//! Where the host has a writable cgroup v2 hierarchy (root on every machine
//! these tests run on), every rank runs in a cgroup of its own, and a
//! cancel kills all of it: a child that ignores SIGTERM and escapes into a
//! session of its own dies with the rank.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{shoal_bin, wait_for, NodeProc};
use shoal_sdk::{JobSubmitRequest, TenantRequest};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);
const BETA_USER: &str = "shoal-test-beta";

fn uid_of(user: &str) -> u32 {
    let out = std::process::Command::new("id")
        .args(["-u", user])
        .output()
        .expect("id");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no user {user}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_job_reaches_nothing_of_the_agent_or_of_another_tenant() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root: the agent switches ranks to unprivileged users"
    );
    let _serial = common::one_at_a_time();
    let status = std::process::Command::new("useradd")
        .args(["--system", "--user-group", "--no-create-home", BETA_USER])
        .status()
        .expect("useradd");
    assert!(
        status.success() || status.code() == Some(9),
        "useradd: {status}"
    );
    let root = tempfile::tempdir().expect("tempdir");
    // Users may pass through the test's directory to their own job dirs.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let config = root.path().join("node.toml");
    std::fs::write(
        &config,
        format!("[executor]\nusers = {{ gamma = \"{BETA_USER}\" }}\n"),
    )
    .expect("config");
    let mut node = NodeProc::new(root.path(), "n1", &[]);
    node.single_user = false;
    node.extra_env
        .push(("SHOAL_CONFIG".into(), config.display().to_string()));
    node.bootstrap();
    let admin = node.client(&node.admin_token());
    for name in ["alpha", "beta", "gamma"] {
        admin
            .create_tenant(&TenantRequest {
                name: name.into(),
                ..TenantRequest::default()
            })
            .await
            .expect("tenant");
    }

    // Alpha's job keeps a secret in its checkpoint dir and its environment.
    let mut alpha = JobSubmitRequest::shell(
        1,
        1,
        "id -u; echo \"pid=$$\"; echo alpha-secret > \"$SHOAL_CKPT_DIR/secret\"; exec sleep 600",
    );
    alpha
        .env
        .insert("ALPHA_SECRET".into(), "alpha-env-secret".into());
    alpha.tenant = Some("alpha".into());
    let alpha = admin.submit_job(&alpha).await.expect("submit").id;
    let secret = root
        .path()
        .join("n1-jobs")
        .join(alpha.to_string())
        .join("ckpt/secret");
    wait_for("alpha's secret on disk", TIMEOUT, || {
        let secret = secret.clone();
        async move { secret.exists().then_some(()) }
    })
    .await;

    let alpha_pid: u32 = wait_for("alpha's pid in its log", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let log = admin.job_log(alpha, 0, 0).await.ok()?;
            String::from_utf8_lossy(&log)
                .lines()
                .find_map(|l| l.strip_prefix("pid=")?.trim().parse().ok())
        }
    })
    .await;

    // Beta's job tries everything it must not be able to do.
    let agent = node.pid().expect("agent pid");
    let data = node.data_dir.display().to_string();
    let probes = format!(
        "echo uid=$(id -u)\n\
         cat {data}/admin.token >/dev/null 2>&1 && echo token=read || echo token=denied\n\
         ls {data} >/dev/null 2>&1 && echo data=listed || echo data=denied\n\
         cat {secret} >/dev/null 2>&1 && echo other=read || echo other=denied\n\
         cat {alpha_log} >/dev/null 2>&1 && echo otherlog=read || echo otherlog=denied\n\
         cat /proc/{agent}/environ >/dev/null 2>&1 && echo environ=read || echo environ=denied\n\
         kill -0 {agent} 2>/dev/null && echo signal=sent || echo signal=denied\n\
         test -e /proc/{agent} && echo agentproc=seen || echo agentproc=hidden\n\
         cat /proc/{agent}/cmdline >/dev/null 2>&1 && echo agentcmdline=read || echo agentcmdline=denied\n\
         test -e /proc/{alpha_pid} && echo alphaproc=seen || echo alphaproc=hidden\n\
         grep -q alpha-env-secret /proc/{alpha_pid}/environ 2>/dev/null && echo alphaenv=read || echo alphaenv=denied\n\
         kill -0 {alpha_pid} 2>/dev/null && echo alphasignal=sent || echo alphasignal=denied\n\
         python3 -c 'import ctypes,sys; l=ctypes.CDLL(None); print(\"alphaptrace=attached\" if l.ptrace(16, int(sys.argv[1]), 0, 0) == 0 else \"alphaptrace=denied\")' {alpha_pid}\n\
         echo env=$(env | grep -c -e SHOAL_TOKEN -e SHOAL_CONFIG -e SHOAL_EXECUTOR)\n\
         ln -s /etc/passwd \"$SHOAL_CKPT_DIR/../rank-9.log\" 2>/dev/null && echo plant=done || echo plant=denied\n\
         touch \"$SHOAL_CKPT_DIR/mine\" && echo ckpt=writable || echo ckpt=denied\n\
         echo cwd=$(basename \"$PWD\")\n",
        secret = secret.display(),
        alpha_log = root
            .path()
            .join("n1-jobs")
            .join(alpha.to_string())
            .join("rank-0.log")
            .display()
    );
    let mut beta = JobSubmitRequest::shell(1, 1, &probes);
    beta.tenant = Some("beta".into());
    let beta = admin.submit_job(&beta).await.expect("submit").id;
    let log = wait_for("beta's probes to finish", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let job = admin.job(beta).await.ok()?;
            if !matches!(job.state.as_str(), "completed" | "failed") {
                return None;
            }
            let log = admin.job_log(beta, 0, 0).await.ok()?;
            Some(String::from_utf8_lossy(&log).into_owned())
        }
    })
    .await;
    // Alpha and beta have no user mapped: before each tenant had a user of
    // its own, both ran as one shared user and every probe below got in.
    let expected: [String; 16] = [
        "token=denied".into(),
        "data=denied".into(),
        "other=denied".into(),
        // Audit finding 3: another tenant's rank log (sequential ids, so
        // its path is easy to guess).
        "otherlog=denied".into(),
        "environ=denied".into(),
        "signal=denied".into(),
        // Audit finding 2: tenants on one node reached each other's ranks.
        // Its own /proc hides the agent and alpha's ranks; under another
        // uid their environment, signals and ptrace are refused as well.
        "agentproc=hidden".into(),
        "agentcmdline=denied".into(),
        "alphaproc=hidden".into(),
        "alphaenv=denied".into(),
        "alphasignal=denied".into(),
        "alphaptrace=denied".into(),
        "env=0".into(),
        // Logs and launch markers sit in a dir of the agent's: no job can
        // replace one with a link for the agent to write through.
        "plant=denied".into(),
        "ckpt=writable".into(),
        "cwd=work".into(),
    ];
    for line in &expected {
        assert!(
            log.lines().any(|l| l == line),
            "want '{line}' in beta's log:\n{log}"
        );
    }
    // Alpha and beta, with no user mapped, run as uids of their own, from
    // the tenants' range (no passwd entry, nothing under /etc written).
    let alpha_log =
        String::from_utf8_lossy(&admin.job_log(alpha, 0, 0).await.expect("log")).into_owned();
    let alpha_uid: u32 = alpha_log
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("alpha's uid first in its log:\n{alpha_log}"));
    let beta_uid: u32 = log
        .lines()
        .find_map(|l| l.strip_prefix("uid=")?.parse().ok())
        .unwrap_or_else(|| panic!("beta's uid in its log:\n{log}"));
    let first = 1_700_000_000;
    assert!(
        alpha_uid >= first && beta_uid >= first && alpha_uid != beta_uid,
        "alpha {alpha_uid}, beta {beta_uid}: not two tenant uids of their own"
    );
    let _ = admin.cancel_job(alpha).await;

    // A mapped tenant runs as the user it is mapped to.
    let mut gamma = JobSubmitRequest::shell(1, 1, "echo uid=$(id -u)");
    gamma.tenant = Some("gamma".into());
    let gamma = admin.submit_job(&gamma).await.expect("submit").id;
    let gamma_log = wait_for("gamma's job to finish", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let job = admin.job(gamma).await.ok()?;
            if !matches!(job.state.as_str(), "completed" | "failed") {
                return None;
            }
            let log = admin.job_log(gamma, 0, 0).await.ok()?;
            Some(String::from_utf8_lossy(&log).into_owned())
        }
    })
    .await;
    let want = format!("uid={}", uid_of(BETA_USER));
    assert!(
        gamma_log.lines().any(|l| l == want),
        "want '{want}' in gamma's log:\n{gamma_log}"
    );
}

/// The cgroup2 mount of this host (`/sys/fs/cgroup`, or a hybrid host's
/// `/sys/fs/cgroup/unified`).
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let found: Vec<&str> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| f[1])
        })
        .collect();
    found
        .iter()
        .find(|m| **m == "/sys/fs/cgroup")
        .or(found.first())
        .map(PathBuf::from)
}

/// The cgroup2 mount, after checking that this test runs as root and can
/// create cgroups there; panics with the reason otherwise.
fn root_with_cgroup2() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root: the agent creates a cgroup per rank"
    );
    let mount = cgroup2_mount()
        .expect("this test needs a cgroup v2 hierarchy (no cgroup2 mount in /proc/self/mounts)");
    // Tests of this binary run at once: each probe has a name of its own.
    static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = mount.join(format!("shoal-test-probe-{}-{n}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&probe) {
        panic!(
            "this test needs a writable cgroup v2 hierarchy: cannot create {}: {e}",
            probe.display()
        );
    }
    std::fs::remove_dir(&probe).expect("remove the probe cgroup");
    mount
}

/// `shoal nodes --json` through the node's API.
fn nodes_json(node: &NodeProc, token: &str) -> serde_json::Value {
    let out = std::process::Command::new(shoal_bin())
        .env("SHOAL_TOKEN", token)
        .args(["--api", &node.api_url(), "nodes", "--json"])
        .output()
        .expect("shoal nodes");
    assert!(out.status.success(), "shoal nodes: {out:?}");
    serde_json::from_slice(&out.stdout).expect("json")
}

/// The processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .collect()
}

/// The cgroup v2 directory of a process, from its `0::` line.
fn cgroup_of(mount: &std::path::Path, pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(path.trim().trim_start_matches('/')))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_kills_every_process_of_the_rank_even_an_escaped_one() {
    let mount = root_with_cgroup2();
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = NodeProc::new(root.path(), "n1", &[]);
    node.bootstrap();
    let token = node.admin_token();
    let admin = node.client(&token);

    // The node says how it fences ranks, in `shoal nodes --json`.
    let nodes = nodes_json(&node, &token);
    assert_eq!(
        nodes[0]["isolation"],
        "cgroup",
        "the agent runs without cgroups:\n{nodes}\nagent log:\n{}",
        node.log()
    );
    assert!(nodes[0]["isolation_controllers"].is_array(), "{nodes}");

    // A rank whose child ignores SIGTERM and double-forks into a session of
    // its own: out of the rank's process group, so only the cgroup holds it.
    // The marker is assembled by the shell, so only the escapee's command
    // line carries it whole.
    let unique = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let marker = format!("shoal-escapee-{unique}");
    let script = format!(
        "( trap '' TERM; m=shoal-esc; setsid sh -c \"trap '' TERM; while :; do sleep 1; done # ${{m}}apee-{unique}\" & ); \
         echo forked; sleep 1000"
    );
    let job = admin
        .submit_job(&JobSubmitRequest::shell(1, 1, &script))
        .await
        .expect("submit")
        .id;
    let escapee = wait_for("the escaped child to run", TIMEOUT, || {
        let marker = marker.clone();
        async move { processes_with(&marker).first().copied() }
    })
    .await;
    let rank_cgroup = cgroup_of(&mount, escapee).expect("the escapee's cgroup");
    let name = rank_cgroup
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    assert!(
        name.starts_with(&format!("job-{job}-rank-0-e")),
        "the escapee is not in its rank's cgroup but in {}",
        rank_cgroup.display()
    );
    assert!(rank_cgroup.is_dir());
    // SAFETY: getsid has no preconditions.
    let (sid, agent_sid) = unsafe {
        (
            libc::getsid(escapee as libc::pid_t),
            libc::getsid(node.pid().expect("agent") as libc::pid_t),
        )
    };
    assert_eq!(
        sid, escapee as libc::pid_t,
        "the child did not escape into its own session"
    );
    assert_ne!(sid, agent_sid);

    admin.cancel_job(job).await.expect("cancel");
    wait_for(
        "every process of the cancelled rank to be gone, its cgroup removed",
        TIMEOUT,
        || {
            let (marker, rank_cgroup) = (marker.clone(), rank_cgroup.clone());
            async move {
                (processes_with(&marker).is_empty() && !rank_cgroup.exists()).then_some(())
            }
        },
    )
    .await;
    wait_for("the job to end cancelled", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let j = admin.job(job).await.ok()?;
            (j.state == "cancelled").then_some(())
        }
    })
    .await;
}

/// Device nodes standing for a host's GPUs (`/dev/nvidiaN`, 195:N, and
/// `nvidiactl`, 195:255), world-readable as the driver makes them, in a
/// directory of `/dev` (which, unlike many temp dirs, allows device nodes);
/// removed on drop. With no NVIDIA driver an open that the fence lets
/// through fails with ENXIO, one it stops with EPERM.
struct FakeGpuNodes {
    dir: PathBuf,
}

impl FakeGpuNodes {
    fn new(gpus: u32) -> FakeGpuNodes {
        use std::os::unix::ffi::OsStrExt;
        let dir = PathBuf::from(format!("/dev/shoal-test-gpus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("create the device dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let nodes = (0..gpus)
            .map(|i| (format!("nvidia{i}"), i))
            .chain([("nvidiactl".to_string(), 255)]);
        for (name, minor) in nodes {
            let path = dir.join(name);
            let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
            // SAFETY: a valid NUL-terminated path; makedev has no preconditions.
            let rc = unsafe {
                libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(195, minor))
            };
            assert_eq!(
                rc,
                0,
                "mknod {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        }
        FakeGpuNodes { dir }
    }
}

impl Drop for FakeGpuNodes {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_opens_only_its_own_gpus_device_nodes() {
    root_with_cgroup2();
    let _serial = common::one_at_a_time();
    let nodes = FakeGpuNodes::new(4);
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = NodeProc::new(root.path(), "n1", &[]);
    node.bootstrap();
    let token = node.admin_token();
    let admin = node.client(&token);
    let listed = nodes_json(&node, &token);
    let controllers = listed[0]["isolation_controllers"].to_string();
    assert!(
        controllers.contains("\"devices\""),
        "the node does not fence GPU device nodes ({controllers}); agent log:\n{}",
        node.log()
    );

    // Two jobs of two GPUs each, running side by side: each tries every
    // GPU node of the host.
    let probe = root.path().join("try_gpus.py");
    std::fs::write(
        &probe,
        "import errno, os, sys\n\
         for name in sorted(os.listdir(sys.argv[1])):\n\
         \x20   try:\n\
         \x20       os.close(os.open(os.path.join(sys.argv[1], name), os.O_RDWR))\n\
         \x20       print(name, 'opened')\n\
         \x20   except OSError as e:\n\
         \x20       print(name, errno.errorcode.get(e.errno, e.errno))\n",
    )
    .expect("write the probe");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let script = format!(
        "echo visible=$CUDA_VISIBLE_DEVICES; python3 {} {}; echo done; sleep 600",
        probe.display(),
        nodes.dir.display()
    );
    let mut seen = Vec::new();
    let mut jobs = Vec::new();
    for _ in 0..2 {
        let job = admin
            .submit_job(&JobSubmitRequest::shell(1, 2, &script))
            .await
            .expect("submit")
            .id;
        jobs.push(job);
        let log = wait_for("the rank to try every GPU node", TIMEOUT, || {
            let admin = admin.clone();
            async move {
                let bytes = admin.job_log(job, 0, 0).await.ok()?;
                let text = String::from_utf8_lossy(&bytes).into_owned();
                text.contains("\ndone").then_some(text)
            }
        })
        .await;
        let visible: Vec<String> = log
            .lines()
            .find_map(|l| l.strip_prefix("visible="))
            .unwrap_or_default()
            .split(',')
            .map(str::to_string)
            .collect();
        assert_eq!(visible.len(), 2, "{log}");
        for gpu in 0..4 {
            let line = log
                .lines()
                .find(|l| l.starts_with(&format!("nvidia{gpu} ")))
                .unwrap_or_else(|| panic!("no line for nvidia{gpu}:\n{log}"));
            if visible.contains(&gpu.to_string()) {
                assert!(
                    !line.ends_with("EPERM") && !line.ends_with("EACCES"),
                    "its own GPU was fenced off: {line}\n{log}"
                );
            } else {
                assert!(
                    line.ends_with("EPERM"),
                    "another GPU's node was not fenced: {line}\n{log}"
                );
            }
        }
        let ctl = log
            .lines()
            .find(|l| l.starts_with("nvidiactl "))
            .unwrap_or_default();
        assert!(
            !ctl.ends_with("EPERM"),
            "the control node must stay open: {ctl}\n{log}"
        );
        seen.extend(visible);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4, "the two jobs shared a GPU: {seen:?}");
    for job in jobs {
        admin.cancel_job(job).await.expect("cancel");
    }
}

/// A frozen agent (SIGSTOP) renews no lease: each rank's guard, a program
/// of its own that needs nothing of the agent, kills the rank once the
/// lease lapses, as self-fencing would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_agents_rank_is_killed_by_its_guard_when_the_lease_lapses() {
    let _mount = root_with_cgroup2();
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = NodeProc::new(root.path(), "n1", &[]);
    node.bootstrap();
    let token = node.admin_token();
    let admin = node.client(&token);
    let marker = format!("shoal-frozen-{}", std::process::id());
    let script = format!("sleep 1000; echo {marker}");
    admin
        .submit_job(&JobSubmitRequest::shell(1, 1, &script))
        .await
        .expect("submit");
    let rank = wait_for("the rank to run", TIMEOUT, || {
        let marker = marker.clone();
        async move { processes_with(&marker).first().copied() }
    })
    .await;
    let agent = node.pid().expect("agent") as libc::pid_t;
    // Its guard: `shoal __lease-guard RANK`, a child of the agent.
    let guard = wait_for("the rank's guard to run", TIMEOUT, || async move {
        processes_with("__lease-guard").into_iter().find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.get(2) == Some(&rank.to_string().as_bytes())
        })
    })
    .await;
    let stat = std::fs::read_to_string(format!("/proc/{guard}/stat")).unwrap_or_default();
    let parent = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse::<libc::pid_t>().ok());
    assert_eq!(
        parent,
        Some(agent),
        "the guard is not the agent's child: {stat}"
    );

    // A live agent renews the lease: its guard leaves the rank alone
    // through several renewals of the word it watches (the first word of
    // its mapping of the lease's memfd: the monotonic millisecond the rank
    // may run until), read through /proc as root.
    let lease_word = move || -> Option<u64> {
        let maps = std::fs::read_to_string(format!("/proc/{guard}/maps")).ok()?;
        let range = maps
            .lines()
            .find(|l| l.contains("memfd:shoal-lease"))?
            .split_whitespace()
            .next()?
            .to_string();
        let bytes = std::fs::read(format!("/proc/{guard}/map_files/{range}")).ok()?;
        Some(u64::from_ne_bytes(bytes.get(..8)?.try_into().ok()?))
    };
    let mut renewals: Vec<u64> = Vec::new();
    wait_for("four renewals of the rank's lease", TIMEOUT, || {
        if let Some(word) = lease_word() {
            if renewals.last().is_none_or(|last| word > *last) {
                renewals.push(word);
            }
        }
        let done = renewals.len() > 4;
        async move { done.then_some(()) }
    })
    .await;
    assert_eq!(
        processes_with(&marker),
        [rank],
        "the rank died while its agent ran:\n{}",
        node.log()
    );

    // SAFETY: signals to the agent this test started.
    unsafe { libc::kill(agent, libc::SIGSTOP) };
    let frozen = std::time::Instant::now();
    let gone = wait_for("the frozen agent's rank to be killed", TIMEOUT, || {
        let marker = marker.clone();
        async move { processes_with(&marker).is_empty().then_some(()) }
    })
    .await;
    let took = frozen.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(agent, libc::SIGCONT) };
    let () = gone;
    eprintln!("the frozen agent's rank was killed after {took:?}");
    // The lease runs SELF_FENCE_MS (2.5 s) past the last ReadIndex read.
    assert!(
        took > Duration::from_millis(1500) && took < Duration::from_secs(15),
        "the rank was killed {took:?} after its agent froze"
    );
}
