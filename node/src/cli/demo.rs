//! `shoal demo`: the first thing to run. Four nodes on loopback with
//! simulated GPUs, a two-node gang running examples/train.py, one gang node
//! killed mid-run, and a timeline of what the cluster did about it.

use crate::agent::testkit::LocalCluster;
use crate::cli::api;
use shoal_sdk::JobState;
use shoal_sdk::JobSubmitRequest;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// The example job, embedded so the demo needs nothing but the binary (and python3).
const TRAIN_PY: &str = include_str!("../../../examples/train.py");
const STEPS: u32 = 150;

struct Timeline {
    started: Instant,
}

impl Timeline {
    fn event(&self, what: impl AsRef<str>) {
        println!(
            "{:>7.2}s  {}",
            self.started.elapsed().as_secs_f64(),
            what.as_ref()
        );
    }
}

pub async fn run() -> anyhow::Result<()> {
    let python_ok = tokio::process::Command::new("python3")
        .arg("--version")
        .output()
        .await
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !python_ok {
        anyhow::bail!("the demo job is a Python script and python3 was not found on PATH");
    }
    println!("Starting a 4-node Shoal mesh on 127.0.0.1 (2 racks, 4 simulated H100 per node)...");
    let cluster = LocalCluster::start(4, |i, cfg| {
        cfg.labels
            .insert("rack".into(), if i < 2 { "r1" } else { "r2" }.into());
        cfg.executor.stop_grace_s = 5;
    })
    .await?;
    let timeline = Timeline {
        started: Instant::now(),
    };
    let outcome = drive(&cluster, &timeline).await;
    cluster.shutdown().await;
    outcome
}

async fn drive(cluster: &LocalCluster, t: &Timeline) -> anyhow::Result<()> {
    let script = cluster.root().join("train.py");
    std::fs::write(&script, TRAIN_PY)?;
    let client = cluster.client(0);
    wait(Duration::from_secs(30), || async {
        let nodes = client.nodes().await.ok()?;
        (nodes.len() == 4
            && nodes
                .iter()
                .all(|n| n.state == shoal_sdk::MemberState::Alive))
        .then_some(())
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("the mesh did not come up within 30 s"))?;
    t.event("4 nodes alive and agreed on by the Raft ledger");

    let request = JobSubmitRequest {
        name: "train".into(),
        tenant: None,
        nodes: 2,
        gpus_per_node: 2,
        gpu_model: None,
        time_limit_s: 600,
        priority: 0,
        preemptible: true,
        command: vec![
            "python3".into(),
            script.display().to_string(),
            "--steps".into(),
            STEPS.to_string(),
            "--step-seconds".into(),
            "0.05".into(),
            "--ckpt-every".into(),
            "10".into(),
        ],
        env: Default::default(),
        workdir: None,
        ckpt_interval_s: None,
        // The defaults: node loss restarts the job, its own failures do not.
        max_restarts: None,
        requeue: false,
        same: Some("rack".into()),
        max_rtt_ms: None,
        labels: Default::default(),
        mem_bytes: None,
        cpus_per_task: None,
        tasks_per_node: None,
        batch: false,
        dependency: None,
        signal: None,
        nodelist: None,
        exclude: None,
        exclusive: false,
        hold: false,
        ckpt_replicas: None,
        near: None,
    };
    let id = client.submit_job(&request).await.map_err(api)?.id;
    t.event(format!(
        "submitted job {id}: 2 nodes × 2 GPUs in one rack, {STEPS} steps, checkpoint every 10"
    ));
    let first = wait(Duration::from_secs(30), || async {
        let job = client.job(id).await.ok()?;
        (job.state == JobState::Running).then_some(job)
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("job {id} was not placed within 30 s"))?;
    t.event(format!(
        "placed on {} (epoch {}), GPUs {:?}",
        first.nodes.join(" + "),
        first.epoch.unwrap_or_default(),
        first.gpus
    ));

    let mut seen_steps = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let committed = loop {
        let ckpts = client.checkpoints(id).await.map_err(api)?;
        for c in ckpts.iter().filter(|c| c.committed_at.is_some()) {
            if seen_steps.insert(c.step) {
                t.event(format!(
                    "checkpoint step {} committed: {} bytes, replicas on nodes {:?}",
                    c.step, c.bytes, c.replicas
                ));
            }
        }
        if seen_steps.len() >= 2 {
            break seen_steps.iter().max().copied().unwrap_or_default();
        }
        if Instant::now() > deadline {
            anyhow::bail!("no checkpoint was committed within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let victim_name = first
        .nodes
        .iter()
        .find(|n| n.as_str() != "n1")
        .cloned()
        .unwrap_or_else(|| first.nodes[0].clone());
    let victim = cluster
        .agents
        .iter()
        .position(|a| a.name() == victim_name)
        .ok_or_else(|| anyhow::anyhow!("unknown node {victim_name}"))?;
    let observer = if victim == 0 { 1 } else { 0 };
    let client = cluster.client(observer);
    let killed = Instant::now();
    cluster.agents[victim].shutdown().await;
    t.event(format!(
        "killed {victim_name} (its rank dies with it); latest committed step {committed}"
    ));

    wait(Duration::from_secs(30), || async {
        let nodes = client.nodes().await.ok()?;
        nodes
            .iter()
            .any(|n| n.name == victim_name && n.state == shoal_sdk::MemberState::Down)
            .then_some(())
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("{victim_name} was not declared down within 30 s"))?;
    t.event(format!(
        "{victim_name} declared down by the failure detector ({:.2}s after the kill)",
        killed.elapsed().as_secs_f64()
    ));

    let requeued = wait(Duration::from_secs(30), || async {
        let job = client.job(id).await.ok()?;
        (job.restarts > first.restarts).then_some(job)
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("job {id} was not requeued within 30 s"))?;
    t.event(format!(
        "job {id} {}: {} ({:.2}s after the kill)",
        requeued.state,
        requeued.reason,
        killed.elapsed().as_secs_f64()
    ));

    let second = wait(Duration::from_secs(30), || async {
        let job = client.job(id).await.ok()?;
        (job.state == JobState::Running
            && job.epoch > first.epoch
            && !job.nodes.contains(&victim_name))
        .then_some(job)
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("job {id} was not re-placed within 30 s"))?;
    let recovery = killed.elapsed();
    t.event(format!(
        "re-placed on {} (epoch {}), restoring step {} from the replicas",
        second.nodes.join(" + "),
        second.epoch.unwrap_or_default(),
        second.last_ckpt_step.unwrap_or_default()
    ));

    let done = wait(Duration::from_secs(120), || async {
        let job = client.job(id).await.ok()?;
        job.state.is_final().then_some(job)
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("job {id} did not finish within 120 s"))?;
    for (rank, node) in done.nodes.iter().enumerate() {
        let log = read_rank_log(cluster.root(), node, id, rank);
        if let Some(step) = last_value(&log, &format!("rank {rank} resumed from step ")) {
            t.event(format!("rank {rank} on {node} resumed from step {step}"));
        }
    }
    t.event(format!(
        "job {id} {} (exit code {}, restarts {}: the node's failure, not the job's)",
        done.state,
        done.exit_code.unwrap_or(-1),
        done.restarts
    ));
    let mut all_match = done.state == JobState::Completed;
    for (rank, node) in done.nodes.iter().enumerate() {
        let log = read_rank_log(cluster.root(), node, id, rank);
        let got = last_value(&log, &format!("rank {rank} checksum ")).unwrap_or_default();
        let want = uninterrupted_checksum(&script, rank).await?;
        let verdict = if got == want {
            "same as"
        } else {
            "DIFFERS from"
        };
        all_match &= got == want;
        t.event(format!(
            "rank {rank} checksum {got}: {verdict} an uninterrupted run"
        ));
    }
    println!();
    println!(
        "Recovery: running again {:.2} s after the node was killed, resumed from the last committed checkpoint.",
        recovery.as_secs_f64()
    );
    if !all_match {
        anyhow::bail!("the resumed job did not reproduce an uninterrupted run");
    }
    println!("Cleaning up.");
    Ok(())
}

fn read_rank_log(root: &Path, node: &str, job: u64, rank: usize) -> String {
    let path = crate::executor::log_path(&root.join(format!("{node}-jobs")), job, rank as u32);
    std::fs::read_to_string(path).unwrap_or_default()
}

fn last_value(log: &str, prefix: &str) -> Option<String> {
    log.lines()
        .rev()
        .filter_map(|l| l.strip_prefix(prefix))
        .next()
        .map(|s| s.trim().to_string())
}

async fn uninterrupted_checksum(script: &Path, rank: usize) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .args(["--steps", &STEPS.to_string(), "--step-seconds", "0"])
        .env("RANK", rank.to_string())
        .env("SHOAL_CKPT_DIR", dir.path().join("ckpt"))
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    last_value(&text, &format!("rank {rank} checksum "))
        .ok_or_else(|| anyhow::anyhow!("the reference run printed no checksum"))
}

/// Polls `check` every 100 ms until it answers or `timeout` passes.
async fn wait<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
