//! Job commands: submit, alloc, queue, show, cancel, signal, requeue,
//! hold (INTERFACE.md "Jobs"); their flags are in [`super::job_args`],
//! logs and events in [`super::logs`], tenants, quotas and users in
//! [`super::tenants`] (re-exported here, where callers found them).

use super::print_json;
use crate::cli::api;
use clap::Args;
use shoal_sdk::JobState;
use shoal_sdk::{Client, JobInfo, JobSubmitRequest};
use std::collections::BTreeMap;
use std::time::Duration;

pub use super::job_args::*;
pub use super::logs::*;
pub use super::tenants::*;

#[derive(Args, Debug)]
pub struct QueueArgs {
    #[arg(long, short = 'A')]
    pub tenant: Option<String>,
    /// pending, running, checkpointing, requeued, preempted, completed, failed,
    /// cancelled, timeout, node_fail, out_of_memory
    #[arg(long, short = 't')]
    pub state: Option<String>,
    /// Only this job
    #[arg(short = 'j', long = "job")]
    pub job: Option<u64>,
    /// Include finished jobs (default: only jobs that are waiting or hold GPUs)
    #[arg(long, short = 'a')]
    pub all: bool,
    /// The queue of this peer region (ids print as REGION:ID)
    #[arg(long, conflicts_with = "all_regions")]
    pub region: Option<String>,
    /// This region's queue and every reachable peer region's, merged
    #[arg(long)]
    pub all_regions: bool,
}

/// Most tasks one job array may have.
pub const MAX_ARRAY_TASKS: usize = 1000;

/// `--array`: the task indices, in order, and the most that may run at
/// once (`%N`).
pub fn parse_array(spec: &str) -> Result<(Vec<u32>, Option<usize>), String> {
    let bad = |why: &str| format!("invalid --array '{spec}': {why}");
    let (list, throttle) = match spec.split_once('%') {
        Some((l, t)) => {
            let t: usize = t.parse().map_err(|_| bad("%N must be a count"))?;
            if t == 0 {
                return Err(bad("%N must be positive"));
            }
            (l, Some(t))
        }
        None => (spec, None),
    };
    let mut indices = Vec::new();
    for item in list.split(',') {
        let (range, step) = match item.split_once(':') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .map_err(|_| bad("a step must be a count"))?,
            ),
            None => (item, 1),
        };
        if step == 0 {
            return Err(bad("a step must be positive"));
        }
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (a, b),
            None => (range, range),
        };
        let lo: u32 = lo.parse().map_err(|_| bad("use 0-15, 1,3,5 or 0-15:2"))?;
        let hi: u32 = hi.parse().map_err(|_| bad("use 0-15, 1,3,5 or 0-15:2"))?;
        if hi < lo {
            return Err(bad("a range must not run backwards"));
        }
        let mut i = lo;
        while i <= hi {
            if !indices.contains(&i) {
                indices.push(i);
            }
            if indices.len() > MAX_ARRAY_TASKS {
                return Err(bad(&format!("at most {MAX_ARRAY_TASKS} tasks")));
            }
            i = match i.checked_add(step) {
                Some(n) => n,
                None => break,
            };
        }
    }
    Ok((indices, throttle))
}

/// The submissions of a job array: one request per index, with Slurm's
/// array variables; with `%N`, task k waits for task k−N to end, so at
/// most N run at once. `first` is the id of the first task once known
/// (`SLURM_ARRAY_JOB_ID`; the first task's own is its job id).
fn array_task(
    base: &JobSubmitRequest,
    indices: &[u32],
    k: usize,
    throttle: Option<usize>,
    ids: &[u64],
) -> JobSubmitRequest {
    let mut req = base.clone();
    let min = indices.iter().min().copied().unwrap_or_default();
    let max = indices.iter().max().copied().unwrap_or_default();
    for (key, value) in [
        ("SLURM_ARRAY_TASK_ID", indices[k].to_string()),
        ("SLURM_ARRAY_TASK_COUNT", indices.len().to_string()),
        ("SLURM_ARRAY_TASK_MIN", min.to_string()),
        ("SLURM_ARRAY_TASK_MAX", max.to_string()),
    ] {
        req.env.insert(key.into(), value);
    }
    if let Some(first) = ids.first() {
        req.env
            .insert("SLURM_ARRAY_JOB_ID".into(), first.to_string());
    }
    if let Some(t) = throttle {
        if k >= t {
            let wait = format!("afterany:{}", ids[k - t]);
            req.dependency = Some(match req.dependency.take() {
                Some(d) if !d.is_empty() => format!("{d},{wait}"),
                _ => wait,
            });
        }
    }
    req
}

/// `--test-only`: where and when the job would start, printed as
/// `program` (`sbatch`: Slurm's line; `submit`: shoal's) or as JSON.
async fn test_only(
    client: &Client,
    req: &JobSubmitRequest,
    json: bool,
    program: &str,
) -> anyhow::Result<()> {
    let answer = client.test_job(req).await.map_err(api)?;
    if json {
        return print_json(&answer);
    }
    println!("{}", test_only_line(&answer, req, program));
    Ok(())
}

/// The one line `--test-only` prints.
pub fn test_only_line(
    answer: &shoal_sdk::JobTestOnlyResponse,
    req: &JobSubmitRequest,
    program: &str,
) -> String {
    let tasks = u64::from(req.nodes) * u64::from(req.tasks_per_node.unwrap_or(1).max(1));
    let when = answer
        .start_at
        .as_deref()
        .map(|t| t.trim_end_matches('Z').to_string());
    match (program, answer.start_in_s, when) {
        ("sbatch", Some(_), Some(when)) => format!(
            "sbatch: Job to start at {when} using {tasks} processors on nodes {} in partition {}",
            answer.nodelist, PARTITION
        ),
        (_, Some(0), _) => format!("would start now on {}", answer.nodelist),
        (_, Some(s), when) => format!(
            "would start in {} (at {}) on {}{}",
            format_elapsed(s),
            when.unwrap_or_default(),
            answer.nodelist,
            answer
                .reason
                .as_deref()
                .map_or(String::new(), |r| format!("; now: {r}")),
        ),
        (_, None, _) => format!(
            "{}would not start: {}",
            if program == "sbatch" { "sbatch: " } else { "" },
            answer
                .reason
                .as_deref()
                .unwrap_or("not even once the running jobs end")
        ),
    }
}

/// What `submit` does once the job is in.
#[derive(Clone, Copy, Debug, Default)]
pub struct AfterSubmit {
    /// Print "Submitted batch job N" like sbatch.
    pub banner: bool,
    /// Wait for the end and exit with the job's code (sbatch --wait).
    pub wait: bool,
    /// Stream the tasks' output until the end, then exit with the job's
    /// code (srun); `Some(true)`: label each line with its task's rank.
    pub attach: Option<bool>,
}

pub async fn submit(
    client: &Client,
    args: &JobArgs,
    json: bool,
    how: AfterSubmit,
) -> anyhow::Result<()> {
    let AfterSubmit {
        banner,
        wait,
        attach,
    } = how;
    if args.command.is_empty() {
        anyhow::bail!("a command is required: shoal submit [OPTIONS] -- CMD [ARGS...]");
    }
    let req = args
        .request(args.command.clone())
        .map_err(anyhow::Error::msg)?;
    if args.near.is_some() && client.region() != Some(shoal_sdk::AUTO_REGION) {
        anyhow::bail!("--near chooses among regions: it needs --region auto");
    }
    if args.test_only {
        let program = if banner { "sbatch" } else { "submit" };
        return test_only(client, &req, json, program).await;
    }
    if let Some(spec) = &args.array {
        return submit_array(client, &req, spec, json, how).await;
    }
    let resp = client.submit_job(&req).await.map_err(api)?;
    if let Some(label) = attach {
        // srun prints the job's output, not its id.
        return attach_to(client, resp.id, label).await;
    }
    let shown = shoal_sdk::RegionJobId {
        region: resp.region.clone(),
        id: resp.id,
    };
    if json {
        print_json(&resp)?;
    } else if banner {
        println!("Submitted batch job {shown}");
    } else {
        println!("{shown}");
    }
    // Waiting follows the job where it landed.
    let asked = client.region().filter(|r| *r != shoal_sdk::AUTO_REGION);
    let client = &client.in_region(resp.region.as_deref().or(asked));
    if !wait {
        return Ok(());
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // Like `sbatch --wait`: the job's exit code once it ends (1 when it
    // ended without one, e.g. cancelled before it started).
    loop {
        let job = client.job(resp.id).await.map_err(api)?;
        if job.state.is_final() {
            return job_exit(&job);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `sbatch --array`: every task or none (a refused task cancels the ones
/// already in); prints the first task's id, which names the array.
async fn submit_array(
    client: &Client,
    base: &JobSubmitRequest,
    spec: &str,
    json: bool,
    how: AfterSubmit,
) -> anyhow::Result<()> {
    let (indices, throttle) = parse_array(spec).map_err(anyhow::Error::msg)?;
    if how.attach.is_some() {
        anyhow::bail!("--array cannot be attached to (srun)");
    }
    let mut ids: Vec<u64> = Vec::new();
    for k in 0..indices.len() {
        let req = array_task(base, &indices, k, throttle, &ids);
        match client.submit_job(&req).await {
            Ok(resp) => ids.push(resp.id),
            Err(e) => {
                for id in &ids {
                    let _ = client.cancel_job(*id).await;
                }
                anyhow::bail!(
                    "array task {} was refused, so none was submitted: {e}",
                    indices[k]
                );
            }
        }
    }
    let first = ids.first().copied().unwrap_or_default();
    if json {
        print_json(&serde_json::json!({ "id": first, "ids": ids }))?;
    } else if how.banner {
        println!("Submitted batch job {first}");
    } else {
        println!("{first}");
    }
    if !how.wait {
        return Ok(());
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // Like `sbatch --wait` of an array: the highest exit code of its tasks.
    let mut worst = 0;
    for id in ids {
        loop {
            let job = client.job(id).await.map_err(api)?;
            if job.state.is_final() {
                if job_exit(&job).is_err() {
                    worst = worst.max(job.exit_code.filter(|c| *c != 0).unwrap_or(1));
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    match worst {
        0 => Ok(()),
        code => Err(ExitWith(code).into()),
    }
}

/// How a job's end becomes the exit of the command that waited for it.
fn job_exit(job: &JobInfo) -> anyhow::Result<()> {
    match job.exit_code {
        Some(0) if job.state == JobState::Completed => Ok(()),
        Some(code) if code != 0 => Err(ExitWith(code).into()),
        _ => Err(ExitWith(1).into()),
    }
}

/// One line of a node's log as srun shows it: the agent's own lines are
/// left out; a task's label is kept only with `--label`, and a node that
/// runs one task gets its rank as the label.
fn srun_line(line: &[u8], node_rank: u32, per_node: u32, label: bool) -> Option<Vec<u8>> {
    if line.starts_with(b"--- shoal: ") {
        return None;
    }
    if per_node > 1 {
        if label {
            return Some(line.to_vec());
        }
        let text = std::str::from_utf8(line).ok();
        let unlabelled = text
            .and_then(|t| t.split_once(": "))
            .filter(|(rank, _)| rank.parse::<u32>().is_ok())
            .map(|(_, rest)| rest.as_bytes().to_vec());
        return Some(unlabelled.unwrap_or_else(|| line.to_vec()));
    }
    if label {
        let mut out = format!("{node_rank}: ").into_bytes();
        out.extend_from_slice(line);
        return Some(out);
    }
    Some(line.to_vec())
}

/// `srun` outside a job: every node's output, line by line, until the job
/// ends; then its exit code.
async fn attach_to(client: &Client, id: u64, label: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut offsets: BTreeMap<u32, (Client, u64, Vec<u8>)> = BTreeMap::new();
    let mut nodes_by_name: BTreeMap<String, String> = BTreeMap::new();
    let mut last_pass = false;
    loop {
        let job = client.job(id).await.map_err(api)?;
        let ended = job.state.is_final();
        let per_node = job.tasks_per_node.max(1);
        for (rank, node) in job.nodes.iter().enumerate() {
            let rank = rank as u32;
            if offsets.contains_key(&rank) {
                continue;
            }
            if !nodes_by_name.contains_key(node) {
                for n in client.nodes().await.map_err(api)? {
                    nodes_by_name.insert(n.name.clone(), n.api_url.clone());
                }
            }
            if let Some(url) = nodes_by_name.get(node) {
                offsets.insert(rank, (client.at(url.clone()), 0, Vec::new()));
            }
        }
        for (rank, (node, offset, partial)) in offsets.iter_mut() {
            // A log not there yet (the rank is starting) is read next time.
            while let Ok(chunk) = node.job_log_chunk(id, *rank, *offset).await {
                if chunk.bytes.is_empty() {
                    break;
                }
                *offset = chunk.start + chunk.bytes.len() as u64;
                partial.extend_from_slice(&chunk.bytes);
                let Some(end) = partial.iter().rposition(|b| *b == b'\n') else {
                    continue;
                };
                let complete: Vec<u8> = partial.drain(..=end).collect();
                let mut out = std::io::stdout().lock();
                for line in complete.split_inclusive(|b| *b == b'\n') {
                    if let Some(shown) = srun_line(line, *rank, per_node, label) {
                        out.write_all(&shown)?;
                    }
                }
                out.flush()?;
            }
        }
        if last_pass {
            return job_exit(&job);
        }
        // One more read once the job has ended, for its last lines.
        last_pass = ended;
        if !ended {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `shoal alloc`: like salloc, holds a gang and runs a command here with its
/// environment; the allocation is released when the command ends.
pub async fn alloc(client: &Client, args: &JobArgs) -> anyhow::Result<()> {
    let req = args.request(Vec::new()).map_err(anyhow::Error::msg)?;
    if args.test_only {
        return test_only(client, &req, false, "alloc").await;
    }
    if args.hold {
        anyhow::bail!(
            "alloc: --hold would wait for ever; submit it held with `shoal submit --hold`"
        );
    }
    let id = client.submit_job(&req).await.map_err(api)?.id;
    eprintln!("shoal: pending job allocation {id}");
    let job = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                let _ = client.cancel_job(id).await;
                anyhow::bail!("interrupted; job allocation {id} cancelled");
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let job = client.job(id).await.map_err(api)?;
        match job.state {
            JobState::Running => break job,
            state if state.is_waiting() => continue,
            other => anyhow::bail!(
                "job allocation {id} ended before it started ({other}): {}",
                job.reason
            ),
        }
    };
    let nodes = client.nodes().await.map_err(api)?;
    let master = job
        .nodes
        .first()
        .and_then(|n| nodes.iter().find(|info| &info.name == n))
        .and_then(|info| info.addr.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "127.0.0.1".into());
    eprintln!(
        "shoal: granted job allocation {id} on {}",
        job.nodes.join(",")
    );
    let command = if args.command.is_empty() {
        vec![std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())]
    } else {
        args.command.clone()
    };
    let status = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("SHOAL_JOB_ID", id.to_string())
        .env("SLURM_JOB_ID", id.to_string())
        .env("SHOAL_EPOCH", job.epoch.unwrap_or_default().to_string())
        .env("SHOAL_NODES", job.nodes.join(","))
        .env("SLURM_JOB_NODELIST", job.nodes.join(","))
        .env("WORLD_SIZE", job.nodes.len().to_string())
        .env("MASTER_ADDR", master)
        .env("SHOAL_API", client.base_url())
        .status()
        .await;
    let _ = client.cancel_job(id).await;
    eprintln!("shoal: relinquishing job allocation {id}");
    let status = status.map_err(|e| anyhow::anyhow!("cannot run '{}': {e}", command[0]))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => Err(ExitWith(code).into()),
        None => Err(ExitWith(1).into()),
    }
}

pub async fn queue(client: &Client, args: &QueueArgs, json: bool) -> anyhow::Result<()> {
    let jobs = if args.all_regions {
        queue_all_regions(client, args).await?
    } else {
        let client = client.in_region(args.region.as_deref());
        let mut jobs = queue_of(&client, args).await?;
        crate::cli::federation::label(&mut jobs, args.region.as_deref());
        jobs
    };
    if json {
        return print_json(&jobs);
    }
    print!("{}", format_queue(&jobs));
    Ok(())
}

/// The jobs `args` select in the region `client` asks.
pub async fn queue_of(client: &Client, args: &QueueArgs) -> anyhow::Result<Vec<JobInfo>> {
    let jobs = match args.job {
        Some(id) => vec![client.job(id).await.map_err(api)?],
        None => {
            let mut jobs = client
                .jobs(args.tenant.as_deref(), args.state.as_deref())
                .await
                .map_err(api)?;
            if !args.all && args.state.is_none() {
                jobs.retain(|j| !j.state.is_final());
            }
            jobs
        }
    };
    Ok(jobs)
}

pub fn format_queue(jobs: &[JobInfo]) -> String {
    let mut out = format!(
        "{:<7}{:<16}{:<12}{:<14}{:>6}{:>6}{:>12}  {}\n",
        "JOBID", "NAME", "TENANT", "STATE", "NODES", "GPUS", "TIME_LIMIT", "NODELIST(REASON)"
    );
    for j in jobs {
        let holds_gpus = matches!(
            j.state,
            JobState::Running | JobState::Preempted | JobState::Checkpointing
        );
        let where_ = if holds_gpus || j.reason.is_empty() {
            j.nodes.join(",")
        } else {
            format!("({})", j.reason)
        };
        let id = match &j.region {
            Some(r) => format!("{r}:{}", j.id),
            None => j.id.to_string(),
        };
        out.push_str(&format!(
            "{:<7}{:<16}{:<12}{:<14}{:>6}{:>6}{:>12}  {}\n",
            id,
            truncate(&j.name, 15),
            truncate(&j.tenant, 11),
            j.state,
            j.nodes_requested,
            j.nodes_requested * j.gpus_per_node,
            format_limit(j.time_limit_s),
            where_
        ));
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n.saturating_sub(1)).chain(['…']).collect()
    }
}

fn format_limit(s: u64) -> String {
    if s >= 86_400 {
        format!(
            "{}-{:02}:{:02}:{:02}",
            s / 86_400,
            (s / 3600) % 24,
            (s / 60) % 60,
            s % 60
        )
    } else {
        format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
    }
}

pub async fn show(client: &Client, id: u64, json: bool) -> anyhow::Result<()> {
    let mut job = client.job(id).await.map_err(api)?;
    job.region = client.region().map(str::to_string);
    if json {
        return print_json(&job);
    }
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    println!(
        "id:          {}",
        shoal_sdk::RegionJobId {
            region: job.region.clone(),
            id: job.id
        }
    );
    println!("name:        {}", job.name);
    println!("tenant:      {}", job.tenant);
    println!("state:       {}", job.state);
    if !job.reason.is_empty() {
        println!("reason:      {}", job.reason);
    }
    println!(
        "request:     {} node(s) × {} GPU(s), time limit {}, priority {}{}",
        job.nodes_requested,
        job.gpus_per_node,
        format_limit(job.time_limit_s),
        job.priority,
        if job.preemptible {
            ""
        } else {
            ", not preemptible"
        }
    );
    if job.mem_bytes.is_some() || job.cpus_per_task.is_some() {
        println!(
            "per rank:    memory {}, CPUs {}",
            job.mem_bytes.map(format_mem).unwrap_or_else(|| "-".into()),
            job.cpus_per_task
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    for (rank, node) in job.nodes.iter().enumerate() {
        let gpus = job.gpus.get(node).cloned().unwrap_or_default();
        println!("rank {rank:<6} {node} GPUs {gpus:?}");
    }
    println!(
        "epoch:       {}",
        job.epoch
            .map(|e| e.to_string())
            .unwrap_or_else(|| "-".into())
    );
    println!(
        "restarts:    {} (preempted {} times)",
        job.restarts, job.preemptions
    );
    println!("submitted:   {}", job.submitted_at);
    println!("started:     {}", opt(&job.started_at));
    println!("ended:       {}", opt(&job.ended_at));
    if let Some(code) = job.exit_code {
        println!("exit code:   {code}");
    }
    if let Some(step) = job.last_ckpt_step {
        println!("checkpoint:  step {step}");
    }
    println!("command:     {}", job.command.join(" "));
    Ok(())
}

pub async fn cancel(client: &Client, ids: &[u64], json: bool) -> anyhow::Result<()> {
    let mut answers = Vec::new();
    for id in ids {
        answers.push(client.cancel_job(*id).await.map_err(api)?);
        if !json {
            println!("job {id} cancelled");
        }
    }
    if json {
        print_json(&answers)?;
    }
    Ok(())
}

/// `shoal cancel --signal SIG ID...`, `scancel --signal`.
pub async fn signal(client: &Client, ids: &[u64], sig: &str, json: bool) -> anyhow::Result<()> {
    let mut answers = Vec::new();
    for id in ids {
        answers.push(client.signal_job(*id, sig).await.map_err(api)?);
        if !json {
            println!("job {id} sent {sig}");
        }
    }
    if json {
        print_json(&answers)?;
    }
    Ok(())
}

/// `shoal requeue ID...`, `scontrol requeue`.
pub async fn requeue(client: &Client, ids: &[u64], json: bool) -> anyhow::Result<()> {
    let mut answers = Vec::new();
    for id in ids {
        answers.push(client.requeue_job(*id).await.map_err(api)?);
        if !json {
            println!("job {id} requeued");
        }
    }
    if json {
        print_json(&answers)?;
    }
    Ok(())
}

/// `shoal hold|release ID...`.
pub async fn hold(client: &Client, ids: &[u64], hold: bool, json: bool) -> anyhow::Result<()> {
    let mut answers = Vec::new();
    for id in ids {
        let answer = if hold {
            client.hold_job(*id).await
        } else {
            client.release_job(*id).await
        };
        answers.push(answer.map_err(api)?);
        if !json {
            println!("job {id} {}", if hold { "held" } else { "released" });
        }
    }
    if json {
        print_json(&answers)?;
    }
    Ok(())
}

/// `queue --all-regions`: this region's jobs, then every peer's that
/// answers; a peer that does not is named on stderr and left out, so one
/// lost region never hides the others' queues.
pub async fn queue_all_regions(client: &Client, args: &QueueArgs) -> anyhow::Result<Vec<JobInfo>> {
    let mut jobs = queue_of(client, args).await?;
    let regions = client.regions().await.map_err(api)?;
    for r in regions.iter().filter(|r| !r.local) {
        match queue_of(&client.in_region(Some(&r.name)), args).await {
            Ok(mut theirs) => {
                crate::cli::federation::label(&mut theirs, Some(&r.name));
                jobs.extend(theirs);
            }
            Err(e) => eprintln!("warning: region {} left out: {e:#}", r.name),
        }
    }
    Ok(jobs)
}

/// The one partition Slurm's tools show.
pub const PARTITION: &str = "shoal";

/// sacct's Elapsed and Timelimit: `HH:MM:SS`, `D-HH:MM:SS`.
pub fn format_elapsed(s: u64) -> String {
    let (d, h, m, sec) = (s / 86_400, (s / 3600) % 24, (s / 60) % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{sec:02}")
    } else {
        format!("{h:02}:{m:02}:{sec:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gres_forms_are_understood() {
        assert_eq!(parse_gres("gpu:8"), Ok((None, 8)));
        assert_eq!(parse_gres("accelerator:8"), Ok((None, 8)));
        assert_eq!(parse_gres("gpu:H100:4"), Ok((Some("H100".into()), 4)));
        assert_eq!(parse_gres("gres/gpu:2"), Ok((None, 2)));
        assert!(parse_gres("cpu:4").is_err());
        assert!(parse_gres("gpu:x").is_err());
    }

    fn layout_of(flags: &str) -> Result<NodeLayout, String> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            job: JobArgs,
        }
        use clap::Parser;
        let argv = std::iter::once("submit").chain(flags.split_whitespace());
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .job
            .layout()
    }

    fn layout(model: Option<&str>, gpus_per_node: u32, tasks_per_node: u32) -> NodeLayout {
        NodeLayout {
            gpu_model: model.map(str::to_string),
            gpus_per_node,
            tasks_per_node,
        }
    }

    #[test]
    fn tasks_and_gpus_lay_out_per_node() {
        assert_eq!(layout_of(""), Ok(layout(None, 1, 1)));
        assert_eq!(layout_of("-N 2 --gpus-per-node 4"), Ok(layout(None, 4, 1)));
        // One GPU per task unless told otherwise.
        assert_eq!(
            layout_of("-N 2 --ntasks-per-node 4"),
            Ok(layout(None, 4, 4))
        );
        assert_eq!(layout_of("-N 2 -n 4"), Ok(layout(None, 2, 2)));
        assert_eq!(
            layout_of("-N 2 -n 4 --gpus-per-task H100:2"),
            Ok(layout(Some("H100"), 4, 2))
        );
        assert_eq!(layout_of("-N 2 -G 8"), Ok(layout(None, 4, 1)));
        assert_eq!(
            layout_of("-N 2 --gpus a100:8 --ntasks-per-node 2"),
            Ok(layout(Some("a100"), 4, 2))
        );
        assert_eq!(
            layout_of("--gres gpu:H100:8 --ntasks-per-node 8"),
            Ok(layout(Some("H100"), 8, 8))
        );
        assert_eq!(
            layout_of("-N 2 -n 4 --ntasks-per-node 2"),
            Ok(layout(None, 2, 2))
        );
        for (bad, says) in [
            ("-N 2 -n 3", "--ntasks 3"),
            ("-N 2 -n 6 --ntasks-per-node 2", "--ntasks 6"),
            ("-N 3 -G 8", "--gpus 8"),
            ("--ntasks-per-node 0", "--ntasks-per-node"),
            ("-n 0", "--ntasks"),
            ("--gpus-per-task x", "--gpus-per-task"),
            ("--gpus :2", "--gpus"),
            ("--gpus-per-node 2 --gpus 4", "cannot be used with"),
            ("--gres gpu:2 --gpus-per-task 1", "cannot be used with"),
        ] {
            let err = layout_of(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn arrays_read_like_slurm_and_throttle_by_dependencies() {
        assert_eq!(parse_array("0-3"), Ok((vec![0, 1, 2, 3], None)));
        assert_eq!(parse_array("1,3,5%2"), Ok((vec![1, 3, 5], Some(2))));
        assert_eq!(parse_array("0-6:3,1"), Ok((vec![0, 3, 6, 1], None)));
        for bad in ["", "x", "3-1", "0-3%0", "0-3:0", "0-5000", "1%x"] {
            assert!(parse_array(bad).is_err(), "{bad}");
        }
        let base = JobSubmitRequest::shell(1, 1, "true");
        let indices = [4, 5, 6];
        let first = array_task(&base, &indices, 0, Some(2), &[]);
        assert_eq!(first.env["SLURM_ARRAY_TASK_ID"], "4");
        assert!(!first.env.contains_key("SLURM_ARRAY_JOB_ID"));
        assert_eq!(first.dependency, None);
        let third = array_task(&base, &indices, 2, Some(2), &[10, 11]);
        assert_eq!(third.env["SLURM_ARRAY_JOB_ID"], "10");
        assert_eq!(third.env["SLURM_ARRAY_TASK_COUNT"], "3");
        assert_eq!(third.dependency.as_deref(), Some("afterany:10"));
    }

    #[test]
    fn srun_shows_lines_like_slurm() {
        assert_eq!(srun_line(b"--- shoal: starting ---\n", 0, 1, true), None);
        assert_eq!(srun_line(b"hi\n", 1, 1, true), Some(b"1: hi\n".to_vec()));
        assert_eq!(srun_line(b"hi\n", 1, 1, false), Some(b"hi\n".to_vec()));
        assert_eq!(srun_line(b"3: hi\n", 1, 2, true), Some(b"3: hi\n".to_vec()));
        assert_eq!(srun_line(b"3: hi\n", 1, 2, false), Some(b"hi\n".to_vec()));
    }

    #[test]
    fn a_task_reads_its_own_lines_of_its_node_log() {
        let mut t = TaskLines::new(Some(3));
        assert_eq!(
            t.feed(b"--- shoal: job 1 starting ---\n2: a\n3: b\n3: c"),
            b"--- shoal: job 1 starting ---\nb\n"
        );
        assert_eq!(t.feed(b"d\n13: e\n"), b"cd\n");
        let mut whole = TaskLines::new(None);
        assert_eq!(whole.feed(b"2: a\npartial"), b"2: a\npartial");
    }

    #[test]
    fn tenant_args_understand_none() {
        let args = TenantArgs {
            name: "t".into(),
            max_gpus: Some("none".into()),
            gpu_hours: Some("12.5".into()),
            ..Default::default()
        };
        let req = args.request().expect("valid");
        assert_eq!(req.unset, vec!["max_gpus".to_string()]);
        assert_eq!(req.gpu_hours, Some(12.5));
        let bad = TenantArgs {
            max_gpus: Some("lots".into()),
            ..args
        };
        assert!(bad.request().is_err());
    }

    #[test]
    fn ledger_limit_flags_parse_sizes_negative_priorities_and_none() {
        let args = TenantArgs {
            name: "t".into(),
            max_pending_jobs: Some("5".into()),
            max_objects: Some("none".into()),
            max_manifest_bytes: Some("16MiB".into()),
            max_priority: Some("-3".into()),
            ..Default::default()
        };
        let req = args.request().expect("valid");
        assert_eq!(req.max_pending_jobs, Some(5));
        assert_eq!(req.max_objects, None);
        assert_eq!(req.unset, vec!["max_objects".to_string()]);
        assert_eq!(req.max_manifest_bytes, Some(16 << 20));
        assert_eq!(req.max_priority, Some(-3));
        for bad in [
            TenantArgs {
                max_pending_jobs: Some("-1".into()),
                ..Default::default()
            },
            TenantArgs {
                max_manifest_bytes: Some("lots".into()),
                ..Default::default()
            },
            TenantArgs {
                max_priority: Some("high".into()),
                ..Default::default()
            },
        ] {
            assert!(bad.request().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ledger_columns_mark_limits_set_for_the_tenant() {
        let limits = shoal_sdk::LedgerLimitsInfo {
            pending_jobs: 3,
            max_pending_jobs: 10,
            objects: 1,
            max_objects: 10_000,
            manifest_bytes: 1536,
            max_manifest_bytes: 64 << 20,
            max_priority: 1000,
            overridden: vec!["max_pending_jobs".into()],
        };
        assert_eq!(
            ledger_columns(Some(&limits)),
            ["3/10*", "1/10000", "1.5KiB/64MiB", "1000"]
        );
        assert_eq!(ledger_columns(None), ["-", "-", "-", "-"]);
    }
}
