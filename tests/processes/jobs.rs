//! Jobs end to end on real `shoal agent` processes: gang placement by rack,
//! the rank environment, exit codes, cancel with SIGTERM, failover when a
//! node dies, preemption with checkpoint and refund, and the Slurm names.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{one_at_a_time, sh_job as request, shoal_bin, wait_converged, wait_for, NodeProc};
use shoal_sdk::{Client, JobInfo, TenantRequest};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

struct Cluster {
    nodes: Vec<NodeProc>,
    token: String,
    root: tempfile::TempDir,
}

impl Cluster {
    async fn start(racks: &[&str]) -> Cluster {
        Cluster::start_with(racks, &[]).await
    }

    /// A cluster whose agents also get `env` (`SHOAL_*` tuning).
    async fn start_with(racks: &[&str], env: &[(&str, &str)]) -> Cluster {
        let root = tempfile::tempdir().expect("tempdir");
        let mut nodes: Vec<NodeProc> = racks
            .iter()
            .enumerate()
            .map(|(i, rack)| {
                let label = format!("rack={rack}");
                let mut node = NodeProc::new(root.path(), &format!("n{}", i + 1), &[&label]);
                node.extra_env
                    .push(("SHOAL_EXECUTOR__STOP_GRACE_S".into(), "5".into()));
                for (k, v) in env {
                    node.extra_env.push((k.to_string(), v.to_string()));
                }
                node
            })
            .collect();
        let token = common::form_cluster(&mut nodes);
        wait_converged(&nodes, &token).await;
        Cluster { nodes, token, root }
    }

    fn client(&self, i: usize) -> Client {
        self.nodes[i].client(&self.token)
    }

    fn job_dir(&self, node: &str, job: u64) -> PathBuf {
        self.root
            .path()
            .join(format!("{node}-jobs"))
            .join(job.to_string())
    }
}

async fn wait_state(client: &Client, id: u64, state: &str) -> JobInfo {
    let want = state.to_string();
    wait_for(&format!("job {id} {state}"), TIMEOUT, || {
        let client = client.clone();
        let want = want.clone();
        async move {
            let job = client.job(id).await.ok()?;
            (job.state == want).then_some(job)
        }
    })
    .await
}

fn read_env(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangs_run_with_their_environment_and_survive_node_loss() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1", "r2", "r2"]).await;
    let client = cluster.client(0);

    // A 2-node gang that fits in one rack lands in that rack, and every rank
    // gets the torchrun environment.
    let mut req = request(2, 2, "env > \"$SHOAL_CKPT_DIR/../env-$RANK\"");
    req.same = Some("rack".into());
    let id = client.submit_job(&req).await.expect("submit").id;
    let job = wait_state(&client, id, "completed").await;
    assert_eq!(job.exit_code, Some(0));
    let mut nodes = job.nodes.clone();
    nodes.sort();
    assert_eq!(nodes, ["n2", "n3"], "the gang stays in rack r2");
    for (rank, node) in job.nodes.iter().enumerate() {
        let env = read_env(&cluster.job_dir(node, id).join(format!("env-{rank}")));
        assert_eq!(env["RANK"], rank.to_string());
        assert_eq!(env["NODE_RANK"], rank.to_string());
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["LOCAL_RANK"], "0");
        assert_eq!(env["SHOAL_JOB_ID"], id.to_string());
        assert_eq!(env["SHOAL_EPOCH"], job.epoch.expect("epoch").to_string());
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
        let gpus: Vec<String> = job.gpus[node].iter().map(u32::to_string).collect();
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], gpus.join(","));
        assert!(env.contains_key("MASTER_PORT") && env.contains_key("SHOAL_API"));
    }

    // A failing rank fails the job with its exit code.
    let id = client
        .submit_job(&request(1, 1, "exit 3"))
        .await
        .expect("submit")
        .id;
    let job = wait_state(&client, id, "failed").await;
    assert_eq!(job.exit_code, Some(3));

    // Cancel sends SIGTERM to the ranks and waits for them.
    let script = "trap 'echo term > \"$SHOAL_CKPT_DIR/../term\"; exit 0' TERM; \
                  touch \"$SHOAL_CKPT_DIR/../started\"; while true; do sleep 0.1; done";
    let id = client
        .submit_job(&request(1, 1, script))
        .await
        .expect("submit")
        .id;
    let job = wait_state(&client, id, "running").await;
    let started = cluster.job_dir(&job.nodes[0], id).join("started");
    wait_for("the rank is up", TIMEOUT, || {
        let started = started.clone();
        async move { started.exists().then_some(()) }
    })
    .await;
    client.cancel_job(id).await.expect("cancel");
    wait_state(&client, id, "cancelled").await;
    assert!(cluster.job_dir(&job.nodes[0], id).join("term").exists());

    // A node dies under a running job: the job restarts elsewhere under a
    // newer epoch.
    let mut req = request(1, 4, "while true; do sleep 0.1; done");
    req.max_restarts = Some(1);
    let id = client.submit_job(&req).await.expect("submit").id;
    let first = wait_state(&client, id, "running").await;
    let victim = first.nodes[0].clone();
    let idx: usize = victim[1..].parse::<usize>().expect("node index") - 1;
    let survivor = if idx == 0 { 1 } else { 0 };
    let mut cluster = cluster;
    cluster.nodes[idx].kill9();
    let client = cluster.client(survivor);
    let moved = wait_for("job restarted on another node", TIMEOUT, || {
        let client = client.clone();
        let victim = victim.clone();
        async move {
            let job = client.job(id).await.ok()?;
            (job.state == "running" && job.nodes[0] != victim).then_some(job)
        }
    })
    .await;
    assert_eq!(moved.restarts, 1);
    assert!(moved.epoch > first.epoch);
    client.cancel_job(id).await.expect("cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_checkpoints_requeues_and_refunds() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1"]).await;
    let client = cluster.client(0);
    for name in ["batch", "prod"] {
        client
            .create_tenant(&TenantRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .expect("tenant");
    }
    // The victim checkpoints step 1 at once, then works until SIGTERM.
    let script = "mkdir -p \"$SHOAL_CKPT_DIR/1\" && touch \"$SHOAL_CKPT_DIR/1/.done\"; \
                  trap 'echo term > \"$SHOAL_CKPT_DIR/../sigterm-$SHOAL_EPOCH\"; exit 0' TERM; \
                  while true; do sleep 0.1; done";
    let mut req = request(1, 4, script);
    req.tenant = Some("batch".into());
    let victim = client.submit_job(&req).await.expect("submit").id;
    wait_for("the victim's checkpoint is recorded", TIMEOUT, || {
        let client = client.clone();
        async move {
            let job = client.job(victim).await.ok()?;
            (job.last_ckpt_step == Some(1)).then_some(())
        }
    })
    .await;
    let first_epoch = client.job(victim).await.expect("job").epoch.expect("epoch");
    // Work done after the checkpoint is what preemption destroys.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut urgent = request(1, 4, "while true; do sleep 0.1; done");
    urgent.tenant = Some("prod".into());
    urgent.preemptible = false;
    let urgent = client.submit_job(&urgent).await.expect("submit").id;
    wait_state(&client, urgent, "running").await;

    let requeued = client.job(victim).await.expect("victim");
    assert_eq!(requeued.state, "requeued", "{requeued:?}");
    assert_eq!(requeued.preemptions, 1);
    assert_eq!(requeued.last_ckpt_step, Some(1));
    assert!(cluster
        .job_dir("n1", victim)
        .join(format!("sigterm-{first_epoch}"))
        .exists());
    let quota = client.quota().await.expect("quota");
    let batch = quota.iter().find(|q| q.tenant == "batch").expect("batch");
    // 4 GPUs × at least the 2 s slept since the checkpoint.
    assert!(
        batch.gpu_hours_refunded >= 4.0 * 2.0 / 3600.0,
        "refund {}",
        batch.gpu_hours_refunded
    );
    assert!(batch.gpu_hours_used < 4.0 * 60.0 / 3600.0);

    // When the urgent job ends, the victim resumes from its checkpoint.
    client.cancel_job(urgent).await.expect("cancel");
    wait_state(&client, victim, "running").await;
    client.cancel_job(victim).await.expect("cancel");
    wait_state(&client, victim, "cancelled").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_names_drive_the_cluster() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1"]).await;
    let bin = tempfile::tempdir().expect("tempdir");
    for name in ["sbatch", "salloc", "squeue", "scancel", "sacctmgr", "sinfo"] {
        std::os::unix::fs::symlink(shoal_bin(), bin.path().join(name)).expect("symlink");
    }
    let run = |name: &str, args: &[&str]| {
        let out = Command::new(bin.path().join(name))
            .args(args)
            .env("SHOAL_API", cluster.nodes[0].api_url())
            .env("SHOAL_TOKEN", &cluster.token)
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, _, err) = run("sacctmgr", &["-i", "create", "group", "vision"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = run(
        "sacctmgr",
        &["modify", "group", "vision", "set", "GrpTRES=accelerator=2"],
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = run(
        "sbatch",
        &[
            "-N",
            "1",
            "--gres=accelerator:2",
            "-A",
            "vision",
            "-t",
            "10:00",
            "--wrap",
            "sleep 30",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let id: u64 = out
        .trim()
        .strip_prefix("Submitted batch job ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("sbatch printed {out:?}"));
    // Over the tenant's GPU cap: refused with the reason.
    let (code, _, err) = run(
        "sbatch",
        &["--gres=accelerator:4", "-A", "vision", "--wrap", "true"],
    );
    assert_eq!(code, Some(1));
    assert!(err.starts_with("error: quota:"), "{err}");
    let client = cluster.client(0);
    wait_state(&client, id, "running").await;
    let (code, out, err) = run("squeue", &["-j", &id.to_string(), "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let jobs: Vec<JobInfo> = serde_json::from_str(&out).expect("squeue --json");
    assert_eq!(jobs[0].tenant, "vision");
    let (code, out, _) = run("sinfo", &[]);
    assert_eq!(code, Some(0));
    assert!(out.contains("n1"));
    let (code, _, err) = run("scancel", &[&id.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    wait_state(&client, id, "cancelled").await;
    // salloc holds a gang, runs the command here with its environment, exits
    // with the command's status and releases the allocation.
    let (code, out, err) = run(
        "salloc",
        &[
            "-N",
            "1",
            "--gres=accelerator:1",
            "-t",
            "5:00",
            "--",
            "sh",
            "-c",
            "echo $SHOAL_JOB_ID $SHOAL_NODES; exit 7",
        ],
    );
    assert_eq!(code, Some(7), "{err}");
    let mut fields = out.split_whitespace();
    let alloc_id: u64 = fields.next().and_then(|s| s.parse().ok()).expect("job id");
    assert_eq!(fields.next(), Some("n1"));
    assert!(
        err.contains(&format!("granted job allocation {alloc_id}")),
        "{err}"
    );
    wait_state(&client, alloc_id, "cancelled").await;
    let (code, _, err) = run("sbatch", &["--frobnicate", "x.sh"]);
    assert_eq!(code, Some(2));
    assert!(
        err.starts_with("error: sbatch: unsupported option"),
        "{err}"
    );
}

/// The example job is a Python script: without python3 these tests cannot
/// run, and say so by failing.
fn require_python3() {
    let works = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        works,
        "this test cannot run here: python3 is not installed (the example job is a Python script)"
    );
}

fn example_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/train.py")
        .canonicalize()
        .expect("examples/train.py")
        .display()
        .to_string()
}

/// The checksum an uninterrupted run of `rank` prints.
fn uninterrupted_checksum(rank: u32, steps: u32) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new("python3")
        .arg(example_script())
        .args(["--steps", &steps.to_string(), "--step-seconds", "0"])
        .env("RANK", rank.to_string())
        .env("SHOAL_CKPT_DIR", dir.path().join("ckpt"))
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("rank {rank} checksum ")))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no checksum in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_survives_kill_9_of_a_node_and_resumes_from_its_checkpoint() {
    let _serial = one_at_a_time();
    require_python3();
    // Long enough to still be running when a loaded machine commits step 20.
    let steps = 400;
    let mut cluster = Cluster::start(&["r1", "r1", "r2", "r2"]).await;
    let client = cluster.client(0);
    let mut req = request(2, 1, "");
    req.command = vec![
        "python3".into(),
        example_script(),
        "--steps".into(),
        steps.to_string(),
        "--step-seconds".into(),
        "0.05".into(),
        "--ckpt-every".into(),
        "10".into(),
    ];
    req.max_restarts = Some(2);
    let id = client.submit_job(&req).await.expect("submit").id;
    let before = wait_for("a committed checkpoint", TIMEOUT, || {
        let client = client.clone();
        async move {
            let job = client.job(id).await.ok()?;
            (job.state == "running" && job.last_ckpt_step.is_some_and(|s| s >= 20)).then_some(job)
        }
    })
    .await;
    let committed = before.last_ckpt_step.expect("step");
    let ckpts = client.checkpoints(id).await.expect("ckpt ls");
    let latest = ckpts
        .iter()
        .filter(|c| c.committed_at.is_some())
        .max_by_key(|c| c.step)
        .expect("committed");
    assert!(latest.replicas.len() >= 3, "replicas {:?}", latest.replicas);

    // Kill a gang node other than n1 when possible (n1 answers the API).
    let victim = before
        .nodes
        .iter()
        .find(|n| n.as_str() != "n1")
        .cloned()
        .unwrap_or_else(|| before.nodes[0].clone());
    let idx: usize = victim[1..].parse::<usize>().expect("index") - 1;
    let api = if idx == 0 { 1 } else { 0 };
    let killed_at = std::time::Instant::now();
    cluster.nodes[idx].kill9();
    let client = cluster.client(api);
    let after = wait_for("the gang running again elsewhere", TIMEOUT, || {
        let client = client.clone();
        let victim = victim.clone();
        async move {
            let job = client.job(id).await.ok()?;
            (job.state == "running" && job.epoch > before.epoch && !job.nodes.contains(&victim))
                .then_some(job)
        }
    })
    .await;
    let recovery = killed_at.elapsed();
    eprintln!("recovery: running again {recovery:.2?} after kill -9 of {victim}");
    assert!(
        recovery < Duration::from_secs(30),
        "recovery took {recovery:?}"
    );
    assert_eq!(after.restarts, 1);

    let done = wait_state(&client, id, "completed").await;
    // Every rank resumed from the committed step (or a later one) and ended
    // with the state of an uninterrupted run.
    for (rank, node) in done.nodes.iter().enumerate() {
        let log =
            std::fs::read_to_string(cluster.job_dir(node, id).join(format!("rank-{rank}.log")))
                .expect("rank log");
        let resumed: u64 = log
            .lines()
            .rev()
            .filter_map(|l| l.strip_prefix(&format!("rank {rank} resumed from step ")))
            .next()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("rank {rank} did not resume:\n{log}"));
        assert!(
            resumed >= committed,
            "resumed from {resumed}, committed {committed}"
        );
        let checksum = log
            .lines()
            .rev()
            .filter_map(|l| l.strip_prefix(&format!("rank {rank} checksum ")))
            .next()
            .unwrap_or_else(|| panic!("rank {rank} printed no checksum:\n{log}"));
        assert_eq!(checksum, uninterrupted_checksum(rank as u32, steps));
    }

    // The catalog can be restored anywhere, every rank's part included.
    let to = cluster.root.path().join("restored");
    let out = Command::new(shoal_bin())
        .args(["ckpt", "restore", &id.to_string(), "--to"])
        .arg(&to)
        .env("SHOAL_API", cluster.nodes[api].api_url())
        .env("SHOAL_TOKEN", &cluster.token)
        .output()
        .expect("ckpt restore");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(to.join("rank-0.state").exists() && to.join("rank-1.state").exists());
}

/// An agent that crashes and comes back before anyone notices must not start
/// its rank again alone under the old epoch (its partner still runs that
/// epoch's other rank): it reports the rank lost, and the whole gang
/// restarts under a new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_reports_its_rank_lost_instead_of_relaunching_it_alone() {
    let _serial = one_at_a_time();
    let mut cluster = Cluster::start(&["r1", "r1", "r2"]).await;
    let client = cluster.client(0);
    let mut req = request(2, 1, "sleep 600");
    req.max_restarts = Some(2);
    let id = client.submit_job(&req).await.expect("submit").id;
    let before = wait_state(&client, id, "running").await;
    let epoch = before.epoch.expect("a running job has an epoch");
    let victim = before
        .nodes
        .iter()
        .find(|n| n.as_str() != "n1")
        .cloned()
        .expect("a gang node other than n1");
    let rank = before
        .nodes
        .iter()
        .position(|n| *n == victim)
        .expect("victim's rank");
    let log_path = cluster
        .job_dir(&victim, id)
        .join(format!("rank-{rank}.log"));
    let started_line = format!("--- shoal: job {id} epoch {epoch} rank {rank} starting");
    wait_for("the victim's rank started", TIMEOUT, || {
        let started = std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains(&started_line);
        async move { started.then_some(()) }
    })
    .await;

    let idx: usize = victim[1..].parse::<usize>().expect("index") - 1;
    cluster.nodes[idx].kill9();
    cluster.nodes[idx].restart();
    let after = wait_for("the gang restarted under a new epoch", TIMEOUT, || {
        let client = client.clone();
        async move {
            let job = client.job(id).await.ok()?;
            (job.state == "running" && job.epoch > Some(epoch)).then_some(job)
        }
    })
    .await;
    assert_eq!(after.restarts, 1);
    let log = std::fs::read_to_string(&log_path).expect("rank log");
    assert_eq!(
        log.matches(&started_line).count(),
        1,
        "rank {rank} of epoch {epoch} started twice:\n{log}"
    );
    // Unless the restart was slow enough for the cluster to declare the
    // node down (and requeue the gang itself), the agent reported the loss.
    let declared_down = client
        .events(0)
        .await
        .expect("events")
        .iter()
        .any(|e| e.kind == "node_down" && e.node.as_deref() == Some(victim.as_str()));
    assert!(
        declared_down || log.contains(&format!("epoch {epoch} rank {rank} lost")),
        "{log}"
    );
    client.cancel_job(id).await.expect("cancel");
    wait_state(&client, id, "cancelled").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_node_checkpoints_on_sigterm_and_resumes_elsewhere() {
    let _serial = one_at_a_time();
    require_python3();
    let cluster = Cluster::start(&["r1", "r1", "r2"]).await;
    let client = cluster.client(0);
    let mut req = request(1, 1, "");
    req.command = vec![
        "python3".into(),
        example_script(),
        "--steps".into(),
        "400".into(),
        "--step-seconds".into(),
        "0.05".into(),
        "--ckpt-every".into(),
        "1000".into(),
    ];
    let id = client.submit_job(&req).await.expect("submit").id;
    let first = wait_state(&client, id, "running").await;
    let drained = first.nodes[0].clone();
    // Let it make progress that only a SIGTERM checkpoint can save.
    let log_path = cluster.job_dir(&drained, id).join("rank-0.log");
    wait_for("the job to step", TIMEOUT, || {
        let path = log_path.clone();
        async move {
            let ranks = std::fs::read_to_string(path.with_file_name("ranks.log")).ok()?;
            (ranks.lines().count() > 1 || std::fs::metadata(&path).ok()?.len() > 0).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    client.drain_node(&drained, true).await.expect("drain");
    let moved = wait_for("the job running on another node", TIMEOUT, || {
        let client = client.clone();
        let drained = drained.clone();
        async move {
            let job = client.job(id).await.ok()?;
            (job.state == "running" && !job.nodes.contains(&drained)).then_some(job)
        }
    })
    .await;
    assert_eq!(moved.restarts, 0, "a drain is not a failure");
    let old_log = std::fs::read_to_string(&log_path).expect("old log");
    let saved: u64 = old_log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("rank 0 stopping at step "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no SIGTERM checkpoint in:\n{old_log}"));
    let new_log_path = cluster.job_dir(&moved.nodes[0], id).join("rank-0.log");
    let resumed = wait_for("the resumed rank to report its step", TIMEOUT, || {
        let path = new_log_path.clone();
        async move {
            let log = std::fs::read_to_string(path).ok()?;
            log.lines()
                .rev()
                .find_map(|l| l.strip_prefix("rank 0 resumed from step "))
                .and_then(|s| s.trim().parse::<u64>().ok())
        }
    })
    .await;
    assert_eq!(resumed, saved, "resumed from the SIGTERM checkpoint");
    // Nothing new lands on the drained node.
    let nodes = client.nodes().await.expect("nodes");
    assert!(nodes.iter().any(|n| n.name == drained && n.drained));
    client.cancel_job(id).await.expect("cancel");
}

/// A realistic batch script (comments, quotes, inline comments, no execute
/// bit) through the Slurm names: sbatch, squeue, a refused scancel
/// --signal, scontrol, scancel, sacct; sbatch of a missing script; --wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_batch_script_round_trip() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1"]).await;
    let bin = tempfile::tempdir().expect("tempdir");
    for name in ["sbatch", "squeue", "scancel", "sacct", "scontrol", "sinfo"] {
        std::os::unix::fs::symlink(shoal_bin(), bin.path().join(name)).expect("symlink");
    }
    let work = tempfile::tempdir().expect("tempdir");
    let run = |name: &str, args: &[&str]| {
        let out = Command::new(bin.path().join(name))
            .args(args)
            .current_dir(work.path())
            .env("SHOAL_API", cluster.nodes[0].api_url())
            .env("SHOAL_TOKEN", &cluster.token)
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // Mode 0644: sbatch copies the script, it never executes the file.
    std::fs::write(
        work.path().join("train.sh"),
        r#"#!/bin/sh
# Train a model.
#SBATCH --job-name="my job"      # quoted, then an inline comment
#SBATCH -N 1   # one node
#SBATCH --gres=gpu:2
#SBATCH --time=10:00
#SBATCH --output=train-%j.out
#SBATCH --partition=gpu

echo "epoch 1 of $1 in job $SLURM_JOB_ID ($SLURM_JOB_NAME)"
sleep 60
#SBATCH --time=1   # after the first command: not a directive
"#,
    )
    .expect("script");
    let (code, out, err) = run("sbatch", &["train.sh", "run-a"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("ignoring --partition=gpu"), "{err}");
    let id: u64 = out
        .trim()
        .strip_prefix("Submitted batch job ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("sbatch printed {out:?}"));
    // Later edits do not reach the job.
    std::fs::write(work.path().join("train.sh"), "exit 9\n").expect("edit");
    let client = cluster.client(0);
    let job = wait_state(&client, id, "running").await;
    assert_eq!(job.name, "my job");
    assert_eq!(job.time_limit_s, 600);
    assert_eq!(job.gpus_per_node, 2);
    let log = work.path().join(format!("train-{id}.out"));
    wait_for("the -o file", TIMEOUT, || {
        let log = log.clone();
        async move {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|t| t.contains(&format!("epoch 1 of run-a in job {id} (my job)")))
        }
    })
    .await;

    let (code, out, err) = run("squeue", &["-h", "-o", "%i %j %t"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, format!("{id} my job R\n"));
    let (code, out, _) = run("squeue", &["-j", &format!("{id},999"), "-t", "PD,R"]);
    assert_eq!(code, Some(0));
    assert!(out.starts_with("             JOBID PARTITION"), "{out}");

    // A signal is not a cancel (the signal itself: the scancel test below).
    let (code, _, err) = run("scancel", &["--batch", "--signal=USR1", &id.to_string()]);
    assert_eq!(code, Some(2));
    assert!(
        err.starts_with("error: scancel: --batch is not supported"),
        "{err}"
    );
    let (code, _, err) = run("scancel", &["--signal=CONT", &id.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(client.job(id).await.expect("job").state, "running");

    let (code, out, err) = run("scontrol", &["show", "job", &id.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with(&format!("JobId={id} JobName=my job\n")),
        "{out}"
    );
    assert!(out.contains("JobState=RUNNING Reason=None"), "{out}");
    assert!(out.contains("NodeList=n1"), "{out}");
    let (code, out, err) = run("scontrol", &["show", "node", "n1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("State=MIXED"), "{out}");
    let (code, _, err) = run("scontrol", &["suspend", &id.to_string()]);
    assert_eq!(code, Some(2));
    assert_eq!(err.trim(), "error: scontrol: 'suspend' is not supported");
    let (code, _, err) = run("scontrol", &["hold", &id.to_string()]);
    assert_eq!(code, Some(1), "a running job cannot be held");
    assert!(err.contains("only a waiting job can be held"), "{err}");

    let (code, _, err) = run("scancel", &["-n", "my job"]);
    assert_eq!(code, Some(0), "{err}");
    wait_state(&client, id, "cancelled").await;
    let (code, out, err) = run("sacct", &["-j", &id.to_string(), "--parsable2"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!(
            "JobID|JobName|Partition|Account|AllocCPUS|State|ExitCode\n\
             {id}|my job|shoal|default|1|CANCELLED|{}:0\n",
            client.job(id).await.expect("job").exit_code.unwrap_or(0)
        )
    );

    // The one update the API can make: drain and return a node.
    let (code, _, err) = run(
        "scontrol",
        &["update", "NodeName=n1", "State=DRAIN", "Reason=disk"],
    );
    assert_eq!(code, Some(0), "{err}");
    let (_, out, _) = run("sinfo", &["-h", "-N", "-o", "%N %t"]);
    assert_eq!(out, "n1 drain\n");
    let (code, _, err) = run("scontrol", &["update", "NodeName=n1", "State=RESUME"]);
    assert_eq!(code, Some(0), "{err}");
    let (_, out, _) = run("sinfo", &["-h", "-N", "-o", "%N %t"]);
    assert_eq!(out, "n1 idle\n");

    // A missing script: an error, nothing submitted.
    let before = client.jobs(None, None).await.expect("jobs").len();
    let (code, out, err) = run("sbatch", &["nonexistent.sh"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.starts_with("error: sbatch: cannot read batch script 'nonexistent.sh'"),
        "{err}"
    );
    assert_eq!(client.jobs(None, None).await.expect("jobs").len(), before);

    // --wait: the job's exit code, and a failed script is not run again.
    let (code, out, err) = run(
        "sbatch",
        &["--wait", "--parsable", "-t", "1", "--wrap", "exit 3"],
    );
    assert_eq!(code, Some(3), "{out} {err}");
    let waited: u64 = out.trim().parse().expect("id");
    let job = client.job(waited).await.expect("job");
    assert_eq!((job.state.as_str(), job.restarts), ("failed", 0));
}

/// End states and submit-time refusals through the `shoal` CLI: a rank's
/// own failure is not restarted by default, `--max-restarts N` restarts
/// it N times, the time limit ends a job `timeout`, and a request no node
/// could ever satisfy is refused at submit with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_states_and_impossible_requests_through_the_cli() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1"]).await;
    let client = cluster.client(0);
    let submit = |args: &[&str]| {
        let out = Command::new(shoal_bin())
            .arg("submit")
            .args(args)
            .env("SHOAL_API", cluster.nodes[0].api_url())
            .env("SHOAL_TOKEN", &cluster.token)
            .output()
            .expect("run shoal submit");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )
    };
    let id_of = |(code, out, err): (Option<i32>, String, String)| -> u64 {
        assert_eq!(code, Some(0), "{err}");
        out.parse()
            .unwrap_or_else(|_| panic!("submit printed {out:?}"))
    };

    // Impossible requests: refused at once, with the reason.
    let (code, _, err) = submit(&["--gpus-per-node", "9", "--", "true"]);
    assert_eq!(code, Some(1));
    assert_eq!(err, "error: no node has 9 GPUs (largest: 4 × H100-80GB)");
    let (code, _, err) = submit(&["--gres", "gpu:A100:1", "--", "true"]);
    assert_eq!(code, Some(1));
    assert_eq!(err, "error: no node has GPU model A100 (models: H100-80GB)");
    let (code, _, err) = submit(&["-N", "2", "--", "true"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("needs 2 nodes"), "{err}");
    // A short model name in any case matches.
    let id = id_of(submit(&["--gres", "gpu:h100:2", "--", "true"]));
    wait_state(&client, id, "completed").await;

    // A rank exiting 3 fails the job at once: no restart, exit code 3.
    let runs = tempfile::tempdir().expect("tempdir");
    let script = |name: &str| format!("echo run >> {}; exit 3", runs.path().join(name).display());
    let count = |name: &str| {
        std::fs::read_to_string(runs.path().join(name))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let id = id_of(submit(&["--", "sh", "-c", &script("plain")]));
    let job = wait_state(&client, id, "failed").await;
    assert_eq!(job.exit_code, Some(3));
    assert_eq!((job.restarts, job.max_restarts, job.requeue), (0, 3, false));
    assert_eq!(count("plain"), 1);

    // With --max-restarts 2 it runs three times, then fails with its code.
    let id = id_of(submit(&[
        "--max-restarts",
        "2",
        "--",
        "sh",
        "-c",
        &script("twice"),
    ]));
    let job = wait_state(&client, id, "failed").await;
    assert_eq!(job.exit_code, Some(3));
    assert_eq!((job.restarts, job.max_restarts, job.requeue), (2, 2, true));
    assert_eq!(count("twice"), 3);

    // --requeue alone: the default limit, rank failures included.
    let id = id_of(submit(&["--requeue", "--", "sh", "-c", &script("requeue")]));
    let job = wait_state(&client, id, "failed").await;
    assert_eq!((job.restarts, job.max_restarts, job.requeue), (3, 3, true));
    assert_eq!(count("requeue"), 4);

    // Past its time limit a job ends `timeout`.
    let id = id_of(submit(&["-t", "2s", "--", "sleep", "600"]));
    let job = wait_state(&client, id, "timeout").await;
    assert!(job.reason.contains("time limit"), "{}", job.reason);
    let (code, out, err) = {
        let out = Command::new(shoal_bin())
            .args(["queue", "--state", "timeout", "--json"])
            .env("SHOAL_API", cluster.nodes[0].api_url())
            .env("SHOAL_TOKEN", &cluster.token)
            .output()
            .expect("run shoal queue");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    assert_eq!(code, Some(0), "{err}");
    let listed: Vec<JobInfo> = serde_json::from_str(&out).expect("queue --json");
    assert!(
        listed.iter().any(|j| j.id == id && j.state == "timeout"),
        "{out}"
    );
}

/// Tasks per node: `-N 2 --ntasks-per-node 2` starts four processes with
/// ranks 0–3, one GPU each and distinct `CUDA_VISIBLE_DEVICES`, and Slurm's
/// and torchrun's variables; `logs --rank R` shows task R's lines; one
/// failing task fails the job without a restart; a batch script's `srun`
/// starts the tasks of every node; `srun` outside a job runs one and
/// streams its labelled output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_per_node_get_their_own_ranks_gpus_and_logs() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1", "r1"]).await;
    let client = cluster.client(0);
    let bin = tempfile::tempdir().expect("tempdir");
    for name in ["sbatch", "srun"] {
        std::os::unix::fs::symlink(shoal_bin(), bin.path().join(name)).expect("symlink");
    }
    let work = tempfile::tempdir().expect("tempdir");
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    let run = |program: &Path, args: &[&str]| {
        let out = Command::new(program)
            .args(args)
            .current_dir(work.path())
            .env("SHOAL_API", cluster.nodes[0].api_url())
            .env("SHOAL_TOKEN", &cluster.token)
            .env("PATH", &path)
            .env_remove("SHOAL_JOB_ID")
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let shoal = shoal_bin();
    let script = "env > \"$SHOAL_CKPT_DIR/../env-$RANK\"; echo \"hello from $RANK\"";
    let (code, out, err) = run(
        Path::new(&shoal),
        &[
            "submit",
            "-N",
            "2",
            "--ntasks-per-node",
            "2",
            "-t",
            "2",
            "--",
            "/bin/sh",
            "-c",
            script,
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let id: u64 = out.trim().parse().expect("id");
    let job = wait_state(&client, id, "completed").await;
    assert_eq!((job.tasks_per_node, job.gpus_per_node), (2, 2));
    let mut seen_gpus = Vec::new();
    for rank in 0..4u32 {
        let node = &job.nodes[(rank / 2) as usize];
        let env = read_env(&cluster.job_dir(node, id).join(format!("env-{rank}")));
        assert_eq!(env["RANK"], rank.to_string());
        assert_eq!(env["LOCAL_RANK"], (rank % 2).to_string());
        assert_eq!(env["WORLD_SIZE"], "4");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(env["GROUP_RANK"], (rank / 2).to_string());
        assert_eq!(env["SLURM_PROCID"], rank.to_string());
        assert_eq!(env["SLURM_NTASKS"], "4");
        assert_eq!(env["SLURM_NNODES"], "2");
        assert_eq!(env["SLURM_JOB_NODELIST"], "n[1-2]");
        assert_eq!(env["SLURM_GPUS_ON_NODE"], "2");
        assert_eq!(env["TORCHELASTIC_RESTART_COUNT"], "0");
        let gpus = &env["CUDA_VISIBLE_DEVICES"];
        assert!(
            !gpus.contains(',') && job.gpus[node].iter().any(|g| g.to_string() == *gpus),
            "task {rank} sees GPUs {gpus} of {:?}",
            job.gpus[node]
        );
        seen_gpus.push(format!("{node}/{gpus}"));
    }
    seen_gpus.sort();
    seen_gpus.dedup();
    assert_eq!(seen_gpus.len(), 4, "every task has a GPU of its own");
    let (code, out, err) = run(Path::new(&shoal), &["logs", &id.to_string(), "--rank", "3"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("hello from 3\n"), "{out}");
    assert!(!out.contains("hello from 2"), "{out}");
    // Any node serves any rank's log, relayed from the node that ran it.
    let other = if job.nodes[1] == "n1" { 1 } else { 0 };
    let relayed = cluster
        .client(other)
        .job_log_chunk(id, 1, 0)
        .await
        .expect("a log relayed by a node that did not run the rank");
    let text = String::from_utf8_lossy(&relayed.bytes);
    assert!(text.contains("2: hello from 2\n"), "{text}");

    // One failing task: the others are stopped and the job fails with its
    // code, not restarted.
    let (code, out, err) = run(
        Path::new(&shoal),
        &[
            "submit",
            "-n",
            "2",
            "-t",
            "2",
            "--",
            "/bin/sh",
            "-c",
            "if [ \"$RANK\" = 1 ]; then exit 5; fi; sleep 120",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let id: u64 = out.trim().parse().expect("id");
    let job = wait_state(&client, id, "failed").await;
    assert_eq!((job.exit_code, job.restarts), (Some(5), 0));

    // A batch script runs once per node; its srun starts the node's tasks.
    std::fs::write(
        work.path().join("step.sh"),
        "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=2\n#SBATCH --export=PATH\n\
         #SBATCH -o step-%N.out\n\
         srun -l sh -c 'echo \"task $SLURM_PROCID of $SLURM_NTASKS on $SLURMD_NODENAME gpu $CUDA_VISIBLE_DEVICES\"'\n",
    )
    .expect("script");
    let (code, out, err) = run(
        &bin.path().join("sbatch"),
        &["--wait", "--parsable", "-t", "2", "step.sh"],
    );
    assert_eq!(code, Some(0), "{out} {err}");
    let mut lines: Vec<String> = ["n1", "n2"]
        .iter()
        .flat_map(|n| {
            std::fs::read_to_string(work.path().join(format!("step-{n}.out")))
                .unwrap_or_else(|e| panic!("step-{n}.out: {e}"))
                .lines()
                .map(|l| l.split(" gpu ").next().unwrap_or(l).to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    lines.sort();
    let want: Vec<String> = (0..4)
        .map(|r| format!("{r}: task {r} of 4 on n{}", r / 2 + 1))
        .collect();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(lines, want_sorted);

    // srun outside a job: submits, streams every task's output, exits
    // with the job's code. The failing task waits until every other one
    // has written its line (in a directory every rank's user may write):
    // its failure stops the gang, and a task that had not run yet by then
    // would never print.
    let marks = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        marks.path(),
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o1777),
    )
    .expect("chmod");
    let script = format!(
        "echo r$RANK; touch {dir}/r$RANK; \
         if [ \"$RANK\" = 3 ]; then i=0; \
           while [ $(ls {dir} | wc -l) -lt 4 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; \
           exit 4; fi",
        dir = marks.path().display()
    );
    let (code, out, err) = run(
        &bin.path().join("srun"),
        &[
            "-N",
            "2",
            "--ntasks-per-node=2",
            "-t",
            "2",
            "-l",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(code, Some(4), "{out} {err}");
    let mut got: Vec<&str> = out.lines().collect();
    got.sort();
    assert_eq!(got, ["0: r0", "1: r1", "2: r2", "3: r3"], "{err}");
}

/// Job arrays, dependencies, holds and warning signals through the Slurm
/// names: `sbatch --array=0-3%2` with `%A_%a` output files, `-d
/// afterok`/`afternotok` after a failing job, `scontrol hold` and
/// `release`, `--signal=B:USR1@55`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_arrays_dependencies_and_holds() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1"]).await;
    let client = cluster.client(0);
    let bin = tempfile::tempdir().expect("tempdir");
    for name in ["sbatch", "scontrol", "squeue"] {
        std::os::unix::fs::symlink(shoal_bin(), bin.path().join(name)).expect("symlink");
    }
    let work = tempfile::tempdir().expect("tempdir");
    let run = |name: &str, args: &[&str]| {
        let out = Command::new(bin.path().join(name))
            .args(args)
            .current_dir(work.path())
            .env("SHOAL_API", cluster.nodes[0].api_url())
            .env("SHOAL_TOKEN", &cluster.token)
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let sbatch_id = |args: &[&str]| {
        let mut all = vec!["--parsable", "-t", "1"];
        all.extend_from_slice(args);
        let (code, out, err) = run("sbatch", &all);
        assert_eq!(code, Some(0), "sbatch {args:?}: {err}");
        out.trim().parse::<u64>().expect("id")
    };

    // An array of four, at most two at once.
    let first = sbatch_id(&[
        "--array=0-3%2",
        "-o",
        "arr-%A_%a.out",
        "--wrap",
        "echo \"$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT\"",
    ]);
    let tasks: Vec<JobInfo> = client
        .jobs(None, None)
        .await
        .expect("jobs")
        .into_iter()
        .filter(|j| j.id >= first && j.id < first + 4)
        .collect();
    assert_eq!(tasks.len(), 4);
    assert_eq!(tasks[2].dependency, Some(format!("afterany:{first}")));
    for (i, task) in tasks.iter().enumerate() {
        wait_state(&client, task.id, "completed").await;
        let out = std::fs::read_to_string(work.path().join(format!("arr-{first}_{i}.out")))
            .expect("array output");
        assert_eq!(out, format!("{first} {i} of 4\n"));
    }

    // Dependencies on a job that fails.
    let failing = sbatch_id(&["--wrap", "sleep 5; exit 3"]);
    let on_ok = sbatch_id(&["-d", &format!("afterok:{failing}"), "--wrap", "true"]);
    let on_fail = sbatch_id(&[
        &format!("--dependency=afternotok:{failing}"),
        "--wrap",
        "true",
    ]);
    let waiting = client.job(on_ok).await.expect("job");
    assert_eq!(waiting.state, "pending");
    assert!(
        waiting
            .reason
            .contains(&format!("waiting for job {failing} to complete")),
        "{}",
        waiting.reason
    );
    wait_state(&client, failing, "failed").await;
    wait_state(&client, on_fail, "completed").await;
    let never = client.job(on_ok).await.expect("job");
    assert_eq!(never.state, "pending");
    assert!(
        never.reason.starts_with("dependency never satisfied"),
        "{}",
        never.reason
    );
    let (code, out, _) = run("squeue", &["-h", "-j", &on_ok.to_string(), "-o", "%t %R"]);
    assert_eq!(code, Some(0));
    assert!(out.starts_with("PD (dependency never satisfied"), "{out}");
    client.cancel_job(on_ok).await.expect("cancel");

    // A held job waits until released, even once its dependency is met.
    let blocker = sbatch_id(&["--wrap", "sleep 60"]);
    let held = sbatch_id(&["-d", &format!("afterany:{blocker}"), "--wrap", "true"]);
    let (code, _, err) = run("scontrol", &["hold", &held.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    client.cancel_job(blocker).await.expect("cancel");
    wait_state(&client, blocker, "cancelled").await;
    let job = client.job(held).await.expect("job");
    assert!(job.held && job.state == "pending", "{job:?}");
    assert!(job.reason.starts_with("held"), "{}", job.reason);
    let (code, _, err) = run("scontrol", &["release", &held.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    wait_state(&client, held, "completed").await;
    let (code, _, err) = run("scontrol", &["hold", &held.to_string()]);
    assert_eq!(code, Some(1), "a finished job cannot be held");
    assert!(err.contains("only a waiting job can be held"), "{err}");

    // --signal: the ranks get SIGUSR1 55 s before a 1-minute limit, and
    // this one ends cleanly on it.
    let warned = sbatch_id(&[
        "--signal=B:USR1@55",
        "--wrap",
        "trap 'echo got-usr1; exit 0' USR1; while true; do sleep 0.1; done",
    ]);
    let job = wait_state(&client, warned, "completed").await;
    assert_eq!(job.signal.as_deref(), Some("USR1@55"));
    let (code, out, _) = run("sbatch", &["--signal=KILL", "--wrap", "true"]);
    assert_eq!(code, Some(1), "{out}");
}

/// Slurm's command names as symlinks to the binary, run against one node
/// of a cluster from a working directory of their own.
struct SlurmTools {
    bin: tempfile::TempDir,
    work: tempfile::TempDir,
    api: String,
    token: String,
}

impl SlurmTools {
    fn new(cluster: &Cluster, names: &[&str]) -> SlurmTools {
        let bin = tempfile::tempdir().expect("tempdir");
        for name in names {
            std::os::unix::fs::symlink(shoal_bin(), bin.path().join(name)).expect("symlink");
        }
        SlurmTools {
            bin,
            work: tempfile::tempdir().expect("tempdir"),
            api: cluster.nodes[0].api_url(),
            token: cluster.token.clone(),
        }
    }

    /// (exit code, stdout, stderr) of `name args...` (`shoal` for the binary itself).
    fn run(&self, name: &str, args: &[&str]) -> (Option<i32>, String, String) {
        self.run_with(name, args, &[])
    }

    /// [`SlurmTools::run`] with more environment.
    fn run_with(
        &self,
        name: &str,
        args: &[&str],
        env: &[(&str, String)],
    ) -> (Option<i32>, String, String) {
        let program = match name {
            "shoal" => PathBuf::from(shoal_bin()),
            other => self.bin.path().join(other),
        };
        let out = Command::new(program)
            .args(args)
            .current_dir(self.work.path())
            .env("SHOAL_API", &self.api)
            .env("SHOAL_TOKEN", &self.token)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    /// The id `sbatch --parsable -t 1 args...` prints.
    fn sbatch(&self, args: &[&str]) -> u64 {
        let mut all = vec!["--parsable", "-t", "1"];
        all.extend_from_slice(args);
        let (code, out, err) = self.run("sbatch", &all);
        assert_eq!(code, Some(0), "sbatch {args:?}: {err}");
        out.trim().parse::<u64>().expect("id")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_nodelist_exclusive_test_only_and_hold() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1", "r1"]).await;
    let client = cluster.client(0);
    let tools = SlurmTools::new(&cluster, &["sbatch", "scontrol", "squeue"]);

    // -w pins the gang, -x keeps it off; a name no node has is refused.
    let pinned = tools.sbatch(&["-t", "5", "-w", "n2", "--wrap", "sleep 300"]);
    let job = wait_state(&client, pinned, "running").await;
    assert_eq!(job.nodes, vec!["n2".to_string()]);
    assert_eq!(job.nodelist.as_deref(), Some("n2"));
    let away = tools.sbatch(&[
        "-t",
        "5",
        "-x",
        "n[2]",
        "--gres=gpu:1",
        "--wrap",
        "sleep 300",
    ]);
    let job = wait_state(&client, away, "running").await;
    assert_eq!(job.nodes, vec!["n1".to_string()]);
    let (code, _, err) = tools.run("sbatch", &["-w", "n[1-3]", "--wrap", "true"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no node named 'n3'"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let (code, _, err) = tools.run("sbatch", &["-x", "n[1-2]", "--wrap", "true"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("outside --exclude"), "{err}");

    // --test-only: where and when; nothing is submitted.
    let before = client.jobs(None, None).await.expect("jobs").len();
    let (code, out, err) = tools.run(
        "shoal",
        &[
            "--json",
            "submit",
            "--test-only",
            "--gres",
            "gpu:3",
            "-w",
            "n1",
            "--",
            "true",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let trial: shoal_sdk::JobTestOnlyResponse = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (trial.start_in_s, trial.nodelist.as_str()),
        (Some(0), "n1"),
        "{trial:?}"
    );
    // Four GPUs on n1 only once `away` reaches its 5-minute limit.
    let (code, out, err) = tools.run(
        "sbatch",
        &["-w", "n1", "--gres=gpu:4", "--test-only", "--wrap", "true"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("sbatch: Job to start at ") && out.contains(" on nodes n1 in partition"),
        "{out}"
    );
    let (code, out, _) = tools.run(
        "shoal",
        &[
            "submit",
            "--test-only",
            "-w",
            "n1",
            "--gres=gpu:4",
            "--",
            "true",
        ],
    );
    assert_eq!(code, Some(0));
    assert!(out.starts_with("would start in "), "{out}");
    assert_eq!(client.jobs(None, None).await.expect("jobs").len(), before);

    // Both nodes are partly used: an exclusive job waits, and says why.
    let whole = tools.sbatch(&["--exclusive", "--wrap", "true"]);
    assert!(client.job(whole).await.expect("job").exclusive);
    wait_for("the exclusive job's reason", TIMEOUT, || {
        let client = client.clone();
        async move {
            let job = client.job(whole).await.ok()?;
            job.reason.contains("whole (--exclusive)").then_some(())
        }
    })
    .await;
    let (_, out, _) = tools.run("squeue", &["-h", "-j", &whole.to_string(), "-o", "%t %R"]);
    assert!(
        out.starts_with("PD (") && out.contains("--exclusive"),
        "{out}"
    );

    // A tenant token asks only about its own tenant's jobs.
    let token = common::tenant_with_token(&client, "vision").await;
    let vision = cluster.nodes[0].client(&token);
    let own = vision
        .test_job(&request(1, 1, "true"))
        .await
        .expect("own tenant");
    assert!(own.start_in_s.is_some(), "{own:?}");
    let other = vision
        .test_job(&shoal_sdk::JobSubmitRequest {
            tenant: Some("default".into()),
            ..request(1, 1, "true")
        })
        .await
        .expect_err("another tenant");
    assert!(other.to_string().contains("permission denied"), "{other}");

    // -H: submitted held, it runs only once released; the exclusive job
    // gets a whole node once the others end.
    let held = tools.sbatch(&["-H", "--wrap", "true"]);
    let job = client.job(held).await.expect("job");
    assert!(job.held && job.state == "pending", "{job:?}");
    for id in [pinned, away] {
        client.cancel_job(id).await.expect("cancel");
    }
    wait_state(&client, whole, "completed").await;
    assert_eq!(client.job(held).await.expect("job").state, "pending");
    let (code, _, err) = tools.run("scontrol", &["release", &held.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    wait_state(&client, held, "completed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_scancel_signal_requeue_and_time_limit() {
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1"]).await;
    let client = cluster.client(0);
    let tools = SlurmTools::new(
        &cluster,
        &["sbatch", "scancel", "scontrol", "squeue", "sacctmgr"],
    );
    let id = tools.sbatch(&[
        "-t",
        "5",
        "--wrap",
        "trap 'echo got-usr1 >> sig.txt' USR1; trap 'echo got-usr2 >> sig.txt' USR2; \
         touch ready; while true; do sleep 0.1; done",
    ]);
    let job = wait_state(&client, id, "running").await;
    let ready = tools.work.path().join("ready");
    wait_for("the script's trap", TIMEOUT, || {
        let ready = ready.clone();
        async move { ready.exists().then_some(()) }
    })
    .await;

    // A tenant token cannot touch another tenant's job: it is "no job N".
    let token = common::tenant_with_token(&client, "vision").await;
    let vision = cluster.nodes[0].client(&token);
    let refusals = [
        vision.signal_job(id, "USR1").await.map(|_| ()),
        vision.requeue_job(id).await.map(|_| ()),
        vision.set_time_limit(id, 60).await.map(|_| ()),
    ];
    for refused in refusals {
        let err = refused.expect_err("another tenant's job");
        assert!(err.to_string().contains(&format!("no job {id}")), "{err}");
    }

    // Users: an admin maps them; a tenant token sees its own, maps none.
    let (code, _, err) = tools.run(
        "sacctmgr",
        &["-i", "add", "user", "alice", "account=default"],
    );
    assert_eq!(code, Some(0), "{err}");
    client
        .set_user("vic", Some("vision"))
        .await
        .expect("admin maps vic");
    let err = vision
        .set_user("mallory", Some("vision"))
        .await
        .expect_err("a tenant token maps users");
    assert!(err.to_string().contains("permission denied"), "{err}");
    let seen: Vec<String> = vision
        .users()
        .await
        .expect("users")
        .into_iter()
        .map(|u| u.name)
        .collect();
    assert_eq!(seen, vec!["vic".to_string()]);
    let (code, out, err) = tools.run("squeue", &["-h", "-u", "alice", "-o", "%i %u"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, format!("{id} default\n"));
    let (_, out, _) = tools.run("squeue", &["-h", "-u", "vic", "-o", "%i"]);
    assert_eq!(out, "", "vic's tenant has no jobs");

    // scancel --signal: the ranks get it and the job goes on running.
    let (code, _, err) = tools.run("scancel", &["--signal=USR1", &id.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    let sig = tools.work.path().join("sig.txt");
    wait_for("SIGUSR1 in the script", TIMEOUT, || {
        let sig = sig.clone();
        async move {
            std::fs::read_to_string(&sig)
                .ok()
                .filter(|s| s.contains("got-usr1"))
        }
    })
    .await;
    assert_eq!(client.job(id).await.expect("job").state, "running");
    let (code, _, err) = tools.run("scancel", &["--signal=KILL", &id.to_string()]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let (code, _, err) = tools.run("shoal", &["cancel", "--signal", "USR2", &id.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    wait_for("SIGUSR2 in the script", TIMEOUT, || {
        let sig = sig.clone();
        async move {
            std::fs::read_to_string(&sig)
                .ok()
                .filter(|s| s.contains("got-usr2"))
        }
    })
    .await;
    assert_eq!(client.job(id).await.expect("job").state, "running");

    // scontrol update JobId=N TimeLimit=T.
    let (code, _, err) = tools.run(
        "scontrol",
        &["update", &format!("JobId={id}"), "TimeLimit=10"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(client.job(id).await.expect("job").time_limit_s, 600);

    // scontrol requeue: stopped, queued, running again under a new
    // epoch, no restart used.
    let (code, _, err) = tools.run("scontrol", &["requeue", &id.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    let again = wait_for("the requeued job running again", TIMEOUT, || {
        let client = client.clone();
        async move {
            let j = client.job(id).await.ok()?;
            (j.state == "running" && j.epoch != job.epoch).then_some(j)
        }
    })
    .await;
    assert_eq!(again.restarts, 0);
    client.cancel_job(id).await.expect("cancel");
    wait_state(&client, id, "cancelled").await;
}

/// The DDP example needs PyTorch with gloo for the ranks' `python3`
/// (`/usr/bin/python3` on the ranks' PATH): Debian's python3-torch, which
/// `.ci/run` installs. Without it the test fails with the reason.
fn require_torch() {
    let works = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import torch.distributed as d; assert d.is_gloo_available()",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        works,
        "this test cannot run here: /usr/bin/python3 has no PyTorch with gloo \
         (apt-get install python3-torch; .ci/run installs it)"
    );
}

fn ddp_request(steps: u32, step_seconds: &str) -> shoal_sdk::JobSubmitRequest {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repo root");
    let script = root.join("examples/ddp_train.py").display().to_string();
    let mut req = shoal_sdk::JobSubmitRequest {
        command: vec![
            "/usr/bin/python3".into(),
            script,
            "--steps".into(),
            steps.to_string(),
            "--ckpt-every".into(),
            "10".into(),
            "--step-seconds".into(),
            step_seconds.into(),
        ],
        tasks_per_node: Some(2),
        max_restarts: Some(2),
        ..request(2, 2, "")
    };
    req.env.insert(
        "PYTHONPATH".into(),
        root.join("sdk/python/src").display().to_string(),
    );
    req
}

/// `examples/ddp_train.sbatch` as a user runs it: `sbatch` from the submit
/// directory, `srun` in the script starting two tasks per node, the output
/// in `%x-%j.out` there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ddp_example_runs_as_a_slurm_batch_script_with_srun() {
    require_torch();
    let _serial = one_at_a_time();
    let cluster = Cluster::start(&["r1", "r1"]).await;
    let client = cluster.client(0);
    let tools = SlurmTools::new(&cluster, &["sbatch", "srun"]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repo root");
    std::os::unix::fs::symlink(root.join("examples"), tools.work.path().join("examples"))
        .expect("symlink");
    let env = [
        (
            "PATH",
            format!("{}:/usr/bin:/bin", tools.bin.path().display()),
        ),
        (
            "PYTHONPATH",
            root.join("sdk/python/src").display().to_string(),
        ),
    ];
    let (code, out, err) = tools.run_with(
        "sbatch",
        &["--wait", "--parsable", "examples/ddp_train.sbatch"],
        &env,
    );
    assert_eq!(code, Some(0), "sbatch: {out} {err}");
    let id: u64 = out.trim().parse().expect("id");
    let job = wait_state(&client, id, "completed").await;
    assert_eq!((job.nodes.len(), job.tasks_per_node), (2, 2), "{job:?}");
    let output = tools.work.path().join(format!("ddp-train-{id}.out"));
    let text =
        std::fs::read_to_string(&output).unwrap_or_else(|e| panic!("{}: {e}", output.display()));
    assert!(
        text.lines().any(|l| l.contains("final-digest ")),
        "no final digest in {}:\n{text}",
        output.display()
    );
}

/// The digest rank 0 printed at the end, and its log, read through `shoal logs`.
fn final_digest(cluster: &Cluster, client_node: usize, id: u64) -> (String, String) {
    let out = Command::new(shoal_bin())
        .args(["logs", &id.to_string(), "--rank", "0"])
        .env("SHOAL_API", cluster.nodes[client_node].api_url())
        .env("SHOAL_TOKEN", &cluster.token)
        .output()
        .expect("shoal logs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let digest = text
        .lines()
        .find_map(|l| l.strip_prefix("final-digest "))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no final digest in rank 0's log: {text}"));
    (digest, text)
}

/// examples/ddp_train.py, a PyTorch DDP job on CPU (gloo) with the default
/// restart policy (node loss restarts, its own failures do not): killed
/// with its node mid-run, its surviving ranks' next all-reduce fails and
/// their agents report a non-zero exit seconds before the node is declared
/// down. The failure is the node's, so the gang resumes from its latest
/// checkpoint on the other nodes and ends with parameters identical, bit
/// for bit, to an uninterrupted run's.
///
/// The order cannot come out the other way by luck: the detector here
/// waits 5 s before a suspect node is down, and the test checks that the
/// survivor's failure was in the ledger while the victim was still not
/// down. Then, on the same cluster, a job whose own code exits 1 with every
/// node healthy fails once, or restarts N times with `--max-restarts N`.
async fn a_ddp_job_whose_survivor_fails_first_resumes_after_its_node_dies(tasks_per_node: u32) {
    require_torch();
    let _serial = one_at_a_time();
    let mut cluster = Cluster::start_with(
        &["r1", "r1", "r1"],
        &[("SHOAL_MEMBERSHIP__SUSPICION_TIMEOUT_MS", "5000")],
    )
    .await;
    let client = cluster.client(0);
    let ddp = |step_seconds: &str| shoal_sdk::JobSubmitRequest {
        tasks_per_node: Some(tasks_per_node),
        max_restarts: None,
        requeue: false,
        ..ddp_request(40, step_seconds)
    };
    let id = client.submit_job(&ddp("0")).await.expect("submit").id;
    let done = wait_state(&client, id, "completed").await;
    assert_eq!(done.restarts, 0);
    let (reference, _) = final_digest(&cluster, 0, id);

    let id = client.submit_job(&ddp("0.3")).await.expect("submit").id;
    let first = wait_for("a committed checkpoint", TIMEOUT, || {
        let client = client.clone();
        async move {
            let job = client.job(id).await.ok()?;
            (job.state == "running" && job.last_ckpt_step.is_some_and(|s| s >= 10)).then_some(job)
        }
    })
    .await;
    assert!(!first.requeue, "the job's own failures must not restart it");
    // The agent of rank 1's node dies with its ranks.
    let victim = first.nodes[1].clone();
    let idx: usize = victim[1..].parse::<usize>().expect("node index") - 1;
    cluster.nodes[idx].kill9();
    let survivor = (0..3).find(|i| *i != idx).expect("a survivor");
    let client = cluster.client(survivor);
    wait_for(
        "the survivor's failure in the ledger before its peer's node is down",
        Duration::from_secs(15),
        || {
            let client = client.clone();
            let victim = victim.clone();
            async move {
                let job = client.job(id).await.ok()?;
                let nodes = client.nodes().await.ok()?;
                let down = nodes
                    .iter()
                    .any(|n| n.name == victim && n.state == shoal_sdk::MemberState::Down);
                assert!(
                    !down || job.reason.starts_with("a rank failed"),
                    "{victim} was declared down before a survivor's failure was seen: {job:?}"
                );
                job.reason.starts_with("a rank failed").then_some(())
            }
        },
    )
    .await;
    let resumed = wait_state(&client, id, "completed").await;
    assert_eq!(resumed.restarts, 1, "{resumed:?}");
    assert!(!resumed.nodes.contains(&victim), "{:?}", resumed.nodes);
    let (digest, log) = final_digest(&cluster, survivor, id);
    let from: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("resumed from step "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("the restarted run did not resume: {log}"));
    assert!(from >= 10, "resumed from step {from}");
    assert_eq!(digest, reference);

    // The job's own failure, every node healthy: failed once, or after N
    // restarts when asked.
    let own = "if [ \"$RANK\" = 1 ]; then exit 1; fi; sleep 1";
    let id = client
        .submit_job(&request(2, 1, own))
        .await
        .expect("submit")
        .id;
    let failed = wait_state(&client, id, "failed").await;
    assert_eq!(
        (failed.restarts, failed.exit_code),
        (0, Some(1)),
        "{failed:?}"
    );
    let asked = shoal_sdk::JobSubmitRequest {
        max_restarts: Some(2),
        ..request(2, 1, own)
    };
    let id = client.submit_job(&asked).await.expect("submit").id;
    let failed = wait_state(&client, id, "failed").await;
    assert_eq!(
        (failed.restarts, failed.exit_code),
        (2, Some(1)),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pytorch_ddp_job_killed_mid_run_resumes_with_identical_parameters() {
    a_ddp_job_whose_survivor_fails_first_resumes_after_its_node_dies(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pytorch_ddp_job_of_two_tasks_per_node_killed_mid_run_resumes_with_identical_parameters()
{
    a_ddp_job_whose_survivor_fails_first_resumes_after_its_node_dies(2).await;
}
