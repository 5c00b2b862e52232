//! `shoal logs` (a rank's log, followed with `-f`) and `shoal events`.

use super::print_json;
use crate::cli::api;
use shoal_sdk::Client;
use std::time::{Duration, Instant};

/// Prints a rank's log from `offset` to its current end (the API answers
/// 4 MiB at a time); returns the offset to go on from. After a rotation the
/// node answers from the new file's start.
pub(crate) async fn print_log_from(
    node: &Client,
    id: u64,
    rank: u32,
    at: LogAt,
    task: &mut TaskLines,
) -> anyhow::Result<LogAt> {
    use std::io::Write;
    let mut at = at;
    loop {
        let mut chunk = node.job_log_chunk(id, rank, at.offset).await.map_err(api)?;
        if at.rotations.is_some_and(|r| r != chunk.rotations) {
            // Rotated since the last read: the new file, from its start.
            writeln!(
                std::io::stdout(),
                "--- shoal: the log was rotated; from the start of the new file ---"
            )?;
            if chunk.start != 0 {
                chunk = node.job_log_chunk(id, rank, 0).await.map_err(api)?;
            }
        }
        std::io::stdout().write_all(&task.feed(&chunk.bytes))?;
        std::io::stdout().flush()?;
        at = LogAt {
            offset: chunk.start + chunk.bytes.len() as u64,
            rotations: Some(chunk.rotations),
        };
        if chunk.bytes.is_empty() {
            return Ok(at);
        }
    }
}

/// One task's lines out of its node's log, where a node runs several tasks
/// and labels their lines with their global rank (`3: ...`); the agent's
/// own `--- shoal: ...` lines are kept. A line cut between two reads waits
/// for its end.
#[derive(Debug, Default)]
pub(crate) struct TaskLines {
    /// `"3: "`; None: the whole log (one task per node).
    label: Option<String>,
    partial: Vec<u8>,
}

impl TaskLines {
    pub(crate) fn new(task: Option<u32>) -> TaskLines {
        TaskLines {
            label: task.map(|t| format!("{t}: ")),
            partial: Vec::new(),
        }
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let Some(label) = &self.label else {
            return bytes.to_vec();
        };
        self.partial.extend_from_slice(bytes);
        let complete = match self.partial.iter().rposition(|b| *b == b'\n') {
            Some(end) => self.partial.drain(..=end).collect::<Vec<u8>>(),
            None => return Vec::new(),
        };
        let mut out = Vec::new();
        for line in complete.split_inclusive(|b| *b == b'\n') {
            if let Some(rest) = line.strip_prefix(label.as_bytes()) {
                out.extend_from_slice(rest);
            } else if line.starts_with(b"--- shoal: ") {
                out.extend_from_slice(line);
            }
        }
        out
    }
}

/// Where a reader of a rank's log is: its offset in the current file, and
/// the rotations it has seen (none before its first read).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LogAt {
    offset: u64,
    rotations: Option<u64>,
}

/// Prints a rank's log from the node that ran it; `follow` polls until the job ends.
pub async fn logs(client: &Client, id: u64, rank: u32, follow: bool) -> anyhow::Result<()> {
    let mut at = LogAt::default();
    let mut source: Option<Client> = None;
    let started = Instant::now();
    let mut task: Option<TaskLines> = None;
    loop {
        let job = client.job(id).await.map_err(api)?;
        // `rank` is a task's global rank; its node's log has its lines.
        let per_node = job.tasks_per_node.max(1);
        let node_rank = rank / per_node;
        let task = task.get_or_insert_with(|| TaskLines::new((per_node > 1).then_some(rank)));
        if u64::from(rank) >= u64::from(job.nodes_requested) * u64::from(per_node) {
            anyhow::bail!(
                "job {id} has no rank {rank}: it runs {} task(s) on {} node(s)",
                u64::from(job.nodes_requested) * u64::from(per_node),
                job.nodes_requested
            );
        }
        if source.is_none() && client.region().is_some() {
            // Another region's rank: the node asked forwards, and that
            // region fetches the log from the node that ran it.
            source = Some(client.clone());
        }
        if source.is_none() {
            if let Some(node) = job.nodes.get(node_rank as usize) {
                let nodes = client.nodes().await.map_err(api)?;
                if let Some(info) = nodes.iter().find(|n| &n.name == node) {
                    source = Some(client.at(info.api_url.clone()));
                }
            } else if !follow {
                anyhow::bail!("job {id} has not run a rank {rank} yet ({})", job.state);
            }
        }
        if let Some(node) = &source {
            at = print_log_from(node, id, node_rank, at, task).await?;
        }
        let ended = job.state.is_final();
        if !follow || (ended && started.elapsed() > Duration::from_millis(500)) {
            if ended && follow {
                // One last read for what was written before the exit.
                if let Some(node) = &source {
                    print_log_from(node, id, node_rank, at, task).await?;
                }
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `shoal events [-f]`: the event log, then (with -f) new events as they come.
pub async fn events(
    client: &Client,
    follow: bool,
    kind: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let mut after = 0;
    loop {
        let mut batch = client.events(after).await.map_err(api)?;
        if let Some(last) = batch.last() {
            after = last.id;
        }
        if let Some(kind) = kind {
            batch.retain(|e| e.kind == kind);
        }
        if json && !follow {
            return print_json(&batch);
        }
        for e in &batch {
            if json {
                println!("{}", serde_json::to_string(e)?);
            } else {
                let place = match (&e.node, e.gpu) {
                    (Some(n), Some(g)) => format!("{n}/gpu{g}"),
                    (Some(n), None) => n.clone(),
                    _ => "-".into(),
                };
                let job = e.job.map(|j| format!(" job {j}")).unwrap_or_default();
                let resource = e
                    .resource
                    .as_ref()
                    .map(|r| format!(" [{r}]"))
                    .unwrap_or_default();
                let repeats = match e.repeats {
                    0 => String::new(),
                    n => format!(" (and {n} more within a minute)"),
                };
                println!(
                    "{}  {:<8} {:<13} {:<12}{job}  {}{resource}{repeats}",
                    e.at, e.severity, e.kind, place, e.message
                );
            }
        }
        if !follow {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
