//! `shoal top [--job ID]`: a terminal live view of the cluster (nodes and
//! GPUs, running and waiting jobs with reasons, recent events) or of one job
//! (ranks with GPU utilization, last checkpoint, log tail). This module is
//! the I/O loop — fetch, draw, read keys; [`frame`] draws a [`model::Snapshot`]
//! and is tested without a terminal or a network.

pub mod frame;
pub mod model;

use crate::api::telemetry::Telemetry;
use model::{JobView, Snapshot, LOG_LINES, RECENT_EVENTS};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use shoal_sdk::Client;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Follow one job: its ranks, their GPU utilization, last checkpoint and log tail
    #[arg(long)]
    pub job: Option<u64>,
    /// The rank whose log `--job` shows
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// List every GPU (job, utilization, temperature, power, memory)
    /// instead of one line per node; `g` switches while it runs
    #[arg(long)]
    pub gpus: bool,
    /// Refresh period, e.g. 1s, 500ms
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = if let Some(ms) = s.strip_suffix("ms") {
        ms.parse::<u64>().map(Duration::from_millis).ok()
    } else {
        s.strip_suffix('s')
            .unwrap_or(s)
            .parse::<f64>()
            .ok()
            .and_then(|v| Duration::try_from_secs_f64(v).ok())
    };
    match d {
        Some(d) if d >= Duration::from_millis(100) => Ok(d),
        _ => Err(format!("'{s}' is not a refresh period of at least 100ms")),
    }
}

/// Puts the terminal back however the loop ends (error or panic included).
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let _ = disable_raw_mode();
        let _ = execute!(std::io::stdout(), LeaveAlternateScreen);
    }
}

/// Where `--job` reads its log from, across refreshes.
#[derive(Default)]
struct LogTail {
    node: Option<String>,
    offset: u64,
    lines: Vec<String>,
    partial: String,
}

pub async fn run(client: &Client, args: &TopArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        anyhow::bail!("shoal top needs a terminal; use `shoal queue`, `shoal nodes` or `shoal events -f` in scripts");
    }
    enable_raw_mode()?;
    let _guard = TerminalGuard;
    execute!(std::io::stdout(), EnterAlternateScreen)?;
    let mut terminal =
        ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))?;
    let mut snap = Snapshot {
        api: client.base_url().to_string(),
        show_gpus: args.gpus,
        ..Snapshot::default()
    };
    let mut tail = LogTail::default();
    let mut after = 0;
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            refresh(client, args, &mut snap, &mut tail, &mut after).await;
            next = Instant::now() + args.interval;
            terminal.draw(|f| frame::render(f, &snap))?;
        }
        // Short polls keep the loop responsive to keys and resizes
        // without a thread of its own.
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        if event::poll(wait)? {
            match event::read()? {
                Event::Key(k) if k.kind == KeyEventKind::Press => {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                        return Ok(());
                    }
                    if k.code == KeyCode::Char('g') {
                        snap.show_gpus = !snap.show_gpus;
                        terminal.draw(|f| frame::render(f, &snap))?;
                    }
                }
                Event::Resize(..) => {
                    terminal.draw(|f| frame::render(f, &snap))?;
                }
                _ => {}
            }
        }
    }
}

/// One refresh: a failed read keeps the last good data and says why.
async fn refresh(
    client: &Client,
    args: &TopArgs,
    snap: &mut Snapshot,
    tail: &mut LogTail,
    after: &mut u64,
) {
    snap.now_ms = crate::clock::wall_ms();
    let mut problems = Vec::new();
    match client.nodes().await {
        Ok(n) => snap.nodes = n,
        Err(e) => problems.push(e.to_string()),
    }
    match client.jobs(None, None).await {
        Ok(j) => snap.jobs = j,
        Err(e) => problems.push(e.to_string()),
    }
    match client.events(*after).await {
        Ok(batch) => {
            if let Some(last) = batch.last() {
                *after = last.id;
            }
            snap.events.extend(batch);
            let extra = snap.events.len().saturating_sub(RECENT_EVENTS);
            snap.events.drain(..extra);
        }
        Err(e) => problems.push(e.to_string()),
    }
    match client.get::<Telemetry>("/v1/telemetry").await {
        Ok(t) => snap.telemetry = Some(t),
        Err(e) => problems.push(e.to_string()),
    }
    if let Some(id) = args.job {
        match job_view(client, id, args.rank, &snap.nodes, tail).await {
            Ok(v) => snap.job = Some(v),
            Err(e) => problems.push(e),
        }
    }
    snap.problem = (!problems.is_empty()).then(|| problems.join("; "));
}

async fn job_view(
    client: &Client,
    id: u64,
    rank: u32,
    nodes: &[shoal_sdk::NodeInfo],
    tail: &mut LogTail,
) -> Result<JobView, String> {
    let job = client.job(id).await.map_err(|e| e.to_string())?;
    let checkpoints = client.checkpoints(id).await.unwrap_or_default();
    // The rank's log is kept by the node that ran it (as for `shoal logs`).
    let at = job.nodes.get(rank as usize).cloned();
    if at != tail.node {
        *tail = LogTail {
            node: at.clone(),
            ..LogTail::default()
        };
    }
    let mut note = None;
    match at
        .as_ref()
        .and_then(|name| nodes.iter().find(|n| &n.name == name))
    {
        Some(node) => match client
            .at(node.api_url.clone())
            .job_log_chunk(id, rank, tail.offset)
            .await
        {
            Ok(chunk) => {
                if chunk.start < tail.offset {
                    // Rotated: the file starts again.
                    tail.lines.clear();
                    tail.partial.clear();
                }
                tail.offset = chunk.start + chunk.bytes.len() as u64;
                tail.partial
                    .push_str(&String::from_utf8_lossy(&chunk.bytes));
                if let Some(cut) = tail.partial.rfind('\n') {
                    let done: String = tail.partial.drain(..=cut).collect();
                    tail.lines.extend(done.lines().map(str::to_string));
                }
                let extra = tail.lines.len().saturating_sub(LOG_LINES);
                tail.lines.drain(..extra);
            }
            Err(e) => note = Some(format!("log of rank {rank}: {e}")),
        },
        None => note = Some(format!("rank {rank} has not run yet ({})", job.state)),
    }
    Ok(JobView {
        job,
        checkpoints,
        log_rank: rank,
        log: tail.lines.clone(),
        log_note: note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_periods_parse_and_tiny_ones_are_refused() {
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("2"), Ok(Duration::from_secs(2)));
        assert!(parse_interval("10ms").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
