//! A node's tasks: the processes one rank of a gang fans out to when a job
//! asks for more than one task per node (`--ntasks-per-node`), the way
//! torchrun's agent or slurmstepd starts one process per GPU.
//!
//! The agent launches the rank as `shoal exec-tasks -- CMD...` (and `srun`
//! inside a rank does the same): this launcher runs CMD once per task, each
//! with its global rank, its local rank and its equal share of the node's
//! GPUs, labels each line of their output with the task's global rank
//! (`3: ...`, like `srun --label`), and ends with the first failing task's
//! exit code after stopping the others (torchrun's rule: one failed worker
//! fails the node's group). It stays in the rank's process group and cgroup,
//! so the agent's signals, fencing and kills reach every task unchanged.
//!
//! The layout comes from the environment the agent gave the rank
//! (`GROUP_RANK`, `GROUP_WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
//! `CUDA_VISIBLE_DEVICES`); `task_env` is the pure part, unit-tested.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long the other tasks get between SIGTERM and SIGKILL once one failed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// One node's share of the gang, as the rank's environment describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeTasks {
    /// The node's rank in the gang (`GROUP_RANK`).
    pub node_rank: u32,
    /// Nodes in the gang (`GROUP_WORLD_SIZE`).
    pub nodes: u32,
    /// Tasks on each node (`LOCAL_WORLD_SIZE`).
    pub per_node: u32,
    /// The node's GPUs as `CUDA_VISIBLE_DEVICES` lists them.
    pub gpus: Vec<String>,
}

impl NodeTasks {
    /// From a rank's environment; `override_per_node` is `srun -n`'s share.
    pub fn from_env(
        env: &BTreeMap<String, String>,
        override_per_node: Option<u32>,
    ) -> Result<NodeTasks, String> {
        let number = |key: &str, default: Option<u32>| -> Result<u32, String> {
            match env.get(key) {
                Some(v) => v.parse().map_err(|_| format!("{key}={v} is not a number")),
                None => default.ok_or_else(|| {
                    format!("{key} is not set: tasks run inside a shoal job's rank")
                }),
            }
        };
        let node_rank = number("GROUP_RANK", None)?;
        let nodes = number("GROUP_WORLD_SIZE", None)?;
        let per_node = match override_per_node {
            Some(n) => n,
            None => number("LOCAL_WORLD_SIZE", Some(1))?,
        };
        if per_node == 0 || nodes == 0 || node_rank >= nodes {
            return Err(format!(
                "no task layout in {per_node} task(s) per node on {nodes} node(s) at node rank {node_rank}"
            ));
        }
        let gpus = env
            .get("CUDA_VISIBLE_DEVICES")
            .map(|v| {
                v.split(',')
                    .filter(|g| !g.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Ok(NodeTasks {
            node_rank,
            nodes,
            per_node,
            gpus,
        })
    }

    /// The global rank of local task `local`.
    pub fn global_rank(&self, local: u32) -> u32 {
        self.node_rank * self.per_node + local
    }

    /// Local task `local`'s GPUs: an equal, contiguous share of the node's,
    /// or all of them when they do not split evenly.
    pub fn gpus_of(&self, local: u32) -> Vec<String> {
        let n = self.per_node as usize;
        if self.gpus.is_empty() || !self.gpus.len().is_multiple_of(n) {
            return self.gpus.clone();
        }
        let share = self.gpus.len() / n;
        let start = local as usize * share;
        self.gpus[start..start + share].to_vec()
    }

    /// What differs in task `local`'s environment from the rank's.
    pub fn task_env(&self, local: u32) -> Vec<(String, String)> {
        let rank = self.global_rank(local).to_string();
        let world = (self.nodes * self.per_node).to_string();
        let local_s = local.to_string();
        let per_node = self.per_node.to_string();
        vec![
            ("RANK".into(), rank.clone()),
            ("ROLE_RANK".into(), rank.clone()),
            ("LOCAL_RANK".into(), local_s.clone()),
            ("WORLD_SIZE".into(), world.clone()),
            ("ROLE_WORLD_SIZE".into(), world.clone()),
            ("LOCAL_WORLD_SIZE".into(), per_node.clone()),
            ("SLURM_PROCID".into(), rank),
            ("SLURM_LOCALID".into(), local_s),
            ("SLURM_NTASKS".into(), world.clone()),
            ("SLURM_NPROCS".into(), world),
            ("SLURM_NTASKS_PER_NODE".into(), per_node),
            ("CUDA_VISIBLE_DEVICES".into(), self.gpus_of(local).join(",")),
        ]
    }
}

/// Output of one task's stream, line by line.
enum Line {
    Out(u32, Vec<u8>),
    Err(u32, Vec<u8>),
}

/// Does nothing: the launcher outlives the SIGTERM and SIGUSR1 the agent
/// sends to the rank's process group (its tasks, in the same group, get
/// them directly) and reports how the tasks ended. A handler, not SIG_IGN,
/// so tasks start with the default dispositions (a handler is reset at
/// exec, an ignore is not).
extern "C" fn ignore(_: libc::c_int) {}

pub fn survive_group_signals() {
    for sig in [libc::SIGTERM, libc::SIGUSR1, libc::SIGINT, libc::SIGUSR2] {
        // SAFETY: installs a handler that touches nothing.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore as *const () as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Shell convention: 128 + signal number for a task a signal ended.
fn code_of(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}

/// Runs `argv` once per task of `layout`; returns the exit code of the node's
/// group: 0 when every task succeeded, else the first failure's.
/// `label`: prefix every output line with the task's global rank. A
/// launcher calls `survive_group_signals` first.
pub fn run(layout: &NodeTasks, argv: &[String], label: bool) -> Result<i32, String> {
    use std::os::unix::process::CommandExt;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| "no command to run as tasks".to_string())?;
    let (lines, received) = mpsc::channel::<Line>();
    let mut children: Vec<(u32, Child)> = Vec::new();
    let mut pumps = Vec::new();
    for local in 0..layout.per_node {
        let rank = layout.global_rank(local);
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(layout.task_env(local))
            .stdin(Stdio::null());
        if label {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // A task never outlives its launcher.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut children);
                return Err(format!("cannot run '{program}' as task {rank}: {e}"));
            }
        };
        if let Some(out) = child.stdout.take() {
            let tx = lines.clone();
            pumps.push(std::thread::spawn(move || {
                pump(out, |l| Line::Out(rank, l), tx)
            }));
        }
        if let Some(err) = child.stderr.take() {
            let tx = lines.clone();
            pumps.push(std::thread::spawn(move || {
                pump(err, |l| Line::Err(rank, l), tx)
            }));
        }
        children.push((rank, child));
    }
    drop(lines);
    let printer = std::thread::spawn(move || {
        let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
        for line in received {
            let (sink, rank, bytes): (&mut dyn Write, u32, Vec<u8>) = match line {
                Line::Out(r, b) => (&mut out, r, b),
                Line::Err(r, b) => (&mut err, r, b),
            };
            let _ = write!(sink, "{rank}: ");
            let _ = sink.write_all(&bytes);
            let _ = sink.flush();
        }
    });
    let code = wait_all(&mut children);
    // Output still buffered is printed; a stream that something a task
    // left behind keeps open is not waited for (the rank's cgroup, where
    // the node has them, ends such leftovers when the rank exits).
    let deadline = Instant::now() + Duration::from_secs(2);
    while !pumps.iter().all(|p| p.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if pumps.iter().all(|p| p.is_finished()) {
        let _ = printer.join();
    }
    let _ = std::io::stdout().flush();
    Ok(code)
}

/// Copies lines of `stream` to the printer, each ending in a newline.
fn pump(stream: impl std::io::Read, wrap: impl Fn(Vec<u8>) -> Line, tx: mpsc::Sender<Line>) {
    let mut reader = std::io::BufReader::new(stream);
    loop {
        let mut buf = Vec::new();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if !buf.ends_with(b"\n") {
                    buf.push(b'\n');
                }
                if tx.send(wrap(buf)).is_err() {
                    return;
                }
            }
        }
    }
}

/// Waits for every task; once one fails the others are stopped.
fn wait_all(children: &mut Vec<(u32, Child)>) -> i32 {
    let mut first_failure: Option<i32> = None;
    let mut stopping_since: Option<Instant> = None;
    let mut killed = false;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait() {
                Ok(Some(status)) => {
                    let code = code_of(status);
                    if code != 0 && first_failure.is_none() {
                        first_failure = Some(code);
                    }
                    children.remove(i);
                }
                Ok(None) => i += 1,
                // Not ours to wait for any more: count it as gone.
                Err(_) => {
                    first_failure.get_or_insert(255);
                    children.remove(i);
                }
            }
        }
        if first_failure.is_some() && !children.is_empty() {
            match stopping_since {
                None => {
                    signal_all(children, libc::SIGTERM);
                    stopping_since = Some(Instant::now());
                }
                Some(t) if !killed && t.elapsed() >= STOP_GRACE => {
                    signal_all(children, libc::SIGKILL);
                    killed = true;
                }
                Some(_) => {}
            }
        }
        if !children.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    first_failure.unwrap_or(0)
}

fn signal_all(children: &[(u32, Child)], sig: libc::c_int) {
    for (_, child) in children {
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: plain syscall on a child we have not reaped (so its
            // id is not reused).
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }
}

fn stop_all(children: &mut Vec<(u32, Child)>) {
    signal_all(children, libc::SIGKILL);
    for (_, child) in children.iter_mut() {
        let _ = child.wait();
    }
    children.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(node_rank: u32, nodes: u32, per_node: u32, gpus: &[&str]) -> NodeTasks {
        NodeTasks {
            node_rank,
            nodes,
            per_node,
            gpus: gpus.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn env_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn tasks_take_global_ranks_and_equal_gpu_shares() {
        let l = layout(1, 2, 2, &["4", "5", "6", "7"]);
        let env: BTreeMap<_, _> = l.task_env(1).into_iter().collect();
        assert_eq!(env["RANK"], "3");
        assert_eq!(env["LOCAL_RANK"], "1");
        assert_eq!(env["WORLD_SIZE"], "4");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(env["SLURM_PROCID"], "3");
        assert_eq!(env["SLURM_LOCALID"], "1");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "6,7");
        assert_eq!(l.task_env(0)[0], ("RANK".into(), "2".into()));
        // Uneven: every task sees the node's GPUs.
        assert_eq!(layout(0, 1, 3, &["0", "1"]).gpus_of(2), ["0", "1"]);
        assert!(layout(0, 1, 2, &[]).gpus_of(1).is_empty());
    }

    #[test]
    fn the_layout_comes_from_the_rank_environment() {
        let env = env_of(&[
            ("GROUP_RANK", "1"),
            ("GROUP_WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
        ]);
        let l = NodeTasks::from_env(&env, None).expect("layout");
        assert_eq!(l, layout(1, 2, 4, &["0", "1", "2", "3"]));
        assert_eq!(
            NodeTasks::from_env(&env, Some(2))
                .expect("srun -n")
                .per_node,
            2
        );
        for bad in [
            env_of(&[("GROUP_WORLD_SIZE", "2")]),
            env_of(&[("GROUP_RANK", "2"), ("GROUP_WORLD_SIZE", "2")]),
            env_of(&[("GROUP_RANK", "x"), ("GROUP_WORLD_SIZE", "2")]),
        ] {
            assert!(NodeTasks::from_env(&bad, None).is_err(), "{bad:?}");
        }
        let zero = env_of(&[("GROUP_RANK", "0"), ("GROUP_WORLD_SIZE", "1")]);
        assert!(NodeTasks::from_env(&zero, Some(0)).is_err());
    }

    #[test]
    fn a_failing_task_stops_the_others_and_gives_its_code() {
        let l = layout(0, 1, 3, &[]);
        let script = "if [ \"$LOCAL_RANK\" = 1 ]; then exit 7; fi; sleep 30";
        let started = Instant::now();
        let code = run(&l, &["/bin/sh".into(), "-c".into(), script.into()], false).expect("runs");
        assert_eq!(code, 7);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the sleeping tasks were not stopped"
        );
        let ok = run(&l, &["/bin/sh".into(), "-c".into(), "exit 0".into()], true).expect("runs");
        assert_eq!(ok, 0);
        assert!(run(&l, &["/nonexistent/program".into()], false).is_err());
    }
}
