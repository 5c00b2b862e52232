//! Drawing one frame of `shoal top` from a [`Snapshot`]: pure (no I/O, no
//! clock), so tests render it to ratatui's `TestBackend` and read the text.

use super::model::{JobView, Snapshot};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table, Wrap};
use ratatui::Frame;
use shoal_sdk::JobState;
use shoal_sdk::{JobInfo, MemberState, NodeInfo};

/// Utilization colours, light to heavy; every cell also prints the number,
/// so nothing depends on telling colours apart.
fn util_style(pct: Option<f32>) -> Style {
    match pct {
        None => Style::default().fg(Color::DarkGray),
        Some(p) if p < 20.0 => Style::default().fg(Color::Blue),
        Some(p) if p < 60.0 => Style::default().fg(Color::Cyan),
        Some(p) if p < 80.0 => Style::default().fg(Color::Green),
        Some(_) => Style::default().fg(Color::Yellow),
    }
}

fn state_style(state: MemberState) -> Style {
    match state {
        MemberState::Alive => Style::default(),
        MemberState::Suspect => Style::default().fg(Color::Yellow),
        MemberState::Down | MemberState::Left => {
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
        }
    }
}

fn rfc3339_ms(s: &str) -> Option<u64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// `HH:MM:SS` (with `D-` past a day) the job has run, up to `now_ms`.
pub fn running_time(job: &JobInfo, now_ms: u64) -> String {
    let Some(start) = job.started_at.as_deref().and_then(rfc3339_ms) else {
        return "-".into();
    };
    let end = job
        .ended_at
        .as_deref()
        .and_then(rfc3339_ms)
        .unwrap_or(now_ms);
    let s = end.saturating_sub(start) / 1000;
    let (d, h, m, s) = (s / 86400, (s % 86400) / 3600, (s % 3600) / 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

pub fn render(f: &mut Frame, snap: &Snapshot) {
    let [title, body, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(Paragraph::new(title_line(snap)), title);
    match &snap.job {
        Some(view) => render_job(f, body, snap, view),
        None => render_cluster(f, body, snap),
    }
    let line = match &snap.problem {
        Some(p) => Line::from(Span::styled(
            format!("problem: {p}"),
            Style::default().fg(Color::Red),
        )),
        None => Line::from("q quit  g GPUs/nodes"),
    };
    f.render_widget(Paragraph::new(line), status);
}

fn title_line(snap: &Snapshot) -> Line<'static> {
    let total: u32 = snap.nodes.iter().map(|n| n.gpus_total).sum();
    let free: u32 = snap.nodes.iter().map(|n| n.gpus_free).sum();
    let alive = snap
        .nodes
        .iter()
        .filter(|n| n.state == MemberState::Alive)
        .count();
    let running = snap
        .jobs
        .iter()
        .filter(|j| j.state == JobState::Running)
        .count();
    let waiting = snap.jobs.iter().filter(|j| j.state.is_waiting()).count();
    Line::from(vec![
        Span::styled("shoal top", Style::default().add_modifier(Modifier::BOLD)),
        Span::raw(format!(
            "  {}  nodes {alive}/{} alive  GPUs {free}/{total} free  jobs {running} running, {waiting} waiting",
            snap.api,
            snap.nodes.len()
        )),
    ])
}

fn render_cluster(f: &mut Frame, area: Rect, snap: &Snapshot) {
    let listed = if snap.show_gpus {
        snap.nodes
            .iter()
            .map(|n| n.gpus.len().max(1))
            .sum::<usize>()
    } else {
        snap.nodes.len()
    };
    let rows = (listed as u16 + 3).min(area.height / 2).max(4);
    let [nodes, jobs, events] = Layout::vertical([
        Constraint::Length(rows),
        Constraint::Min(5),
        Constraint::Length((area.height / 4).max(4)),
    ])
    .areas(area);
    if snap.show_gpus {
        render_gpus(f, nodes, snap);
    } else {
        render_nodes(f, nodes, snap);
    }
    render_jobs(f, jobs, snap);
    render_events(f, events, snap, None);
}

/// One character per GPU: its utilization decile (0-9, `*` at 100%), `.`
/// free, `!` unhealthy or drained, `?` unknown.
fn gpu_cells(snap: &Snapshot, node: &NodeInfo) -> Line<'static> {
    let spans: Vec<Span<'static>> = node
        .gpus
        .iter()
        .map(|g| {
            let util = snap.gpu_util(node, g);
            let c = if g.health != "ok" {
                "!".to_string()
            } else if g.allocated_to.is_none() && node.gpus_free > 0 {
                ".".to_string()
            } else {
                match util {
                    Some(p) if p >= 99.5 => "*".to_string(),
                    Some(p) => format!("{}", (p / 10.0).floor() as u32),
                    None => "?".to_string(),
                }
            };
            Span::styled(c, util_style(util))
        })
        .collect();
    Line::from(spans)
}

fn render_nodes(f: &mut Frame, area: Rect, snap: &Snapshot) {
    let header = Row::new(["NODE", "STATE", "ZONE/RACK", "GPUS", "LOAD", "FREE"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    let rows = snap.nodes.iter().map(|n| {
        let state = if n.drained && n.state == MemberState::Alive {
            "drained".to_string()
        } else {
            n.state.as_str().to_string()
        };
        let place = format!(
            "{}/{}",
            n.labels.get("zone").map(String::as_str).unwrap_or("-"),
            n.labels.get("rack").map(String::as_str).unwrap_or("-")
        );
        Row::new(vec![
            Line::from(n.name.clone()),
            Line::from(Span::styled(state, state_style(n.state))),
            Line::from(place),
            gpu_cells(snap, n),
            Line::from(
                n.gpu_util
                    .map(|u| format!("{:.0}%", u * 100.0))
                    .unwrap_or_else(|| "-".into()),
            ),
            Line::from(format!("{}/{}", n.gpus_free, n.gpus_total)),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(14),
            Constraint::Length(8),
            Constraint::Length(14),
            Constraint::Min(10),
            Constraint::Length(5),
            Constraint::Length(6),
        ],
    )
    .header(header)
    .block(
        Block::default()
            .borders(Borders::ALL)
            .title(" Nodes (GPU: util decile 0-9, * full, . free, ! unhealthy; g: every GPU) "),
    );
    f.render_widget(table, area);
}

/// A GPU's sample as table cells: utilization, temperature, power,
/// memory; "no data" (and why) when its node's samples are missing.
fn sample_cells(
    snap: &Snapshot,
    node: &str,
    index: u32,
    fallback_util: Option<f32>,
) -> [Line<'static>; 4] {
    match snap.gpu_sample(node, index) {
        Some(s) => {
            let util = Some(s.util_pct as f32);
            let temp = Span::styled(
                format!("{} °C", s.temp_c),
                if s.temp_c >= 85 || !s.throttle.is_empty() {
                    Style::default().fg(Color::Red)
                } else {
                    Style::default()
                },
            );
            [
                Line::from(Span::styled(format!("{}%", s.util_pct), util_style(util))),
                Line::from(temp),
                Line::from(format!("{:.0} W", s.power_w)),
                Line::from(format!("{}/{} MiB", s.fb_used_mb, s.fb_total_mb)),
            ]
        }
        None => {
            let why = snap
                .node_telemetry(node)
                .and_then(|t| t.gpus_problem.clone())
                .unwrap_or_else(|| "no data".into());
            [
                Line::from(Span::styled(
                    fallback_util
                        .map(|u| format!("{u:.0}%"))
                        .unwrap_or_else(|| "-".into()),
                    util_style(fallback_util),
                )),
                Line::from("-"),
                Line::from("-"),
                Line::from(Span::styled(why, Style::default().fg(Color::DarkGray))),
            ]
        }
    }
}

/// The job holding a GPU, by name when the token may see it.
fn gpu_job(snap: &Snapshot, node: &str, g: &shoal_sdk::GpuInfo) -> String {
    match g.allocated_to {
        Some(id) => {
            let name = snap
                .gpu_sample(node, g.index)
                .filter(|s| s.job == Some(id))
                .and_then(|s| s.job_name.clone())
                .or_else(|| {
                    snap.jobs
                        .iter()
                        .find(|j| j.id == id)
                        .map(|j| j.name.clone())
                });
            match name {
                Some(n) => format!("{id} {n}"),
                None => id.to_string(),
            }
        }
        None if g.health != "ok" => format!("- ({})", g.health),
        None => "-".into(),
    }
}

/// Every GPU of every node: job, utilization, temperature, power, memory.
fn render_gpus(f: &mut Frame, area: Rect, snap: &Snapshot) {
    let header = Row::new(["NODE", "GPU", "JOB", "UTIL", "TEMP", "POWER", "MEMORY"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    let mut rows = Vec::new();
    for n in &snap.nodes {
        for g in &n.gpus {
            let [util, temp, power, mem] =
                sample_cells(snap, &n.name, g.index, snap.gpu_util(n, g));
            rows.push(Row::new(vec![
                Line::from(n.name.clone()),
                Line::from(g.index.to_string()),
                Line::from(gpu_job(snap, &n.name, g)),
                util,
                temp,
                power,
                mem,
            ]));
        }
    }
    let table = Table::new(
        rows,
        [
            Constraint::Length(14),
            Constraint::Length(4),
            Constraint::Length(16),
            Constraint::Length(5),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Min(14),
        ],
    )
    .header(header)
    .block(
        Block::default()
            .borders(Borders::ALL)
            .title(" GPUs (g: nodes) "),
    );
    f.render_widget(table, area);
}

fn render_jobs(f: &mut Frame, area: Rect, snap: &Snapshot) {
    let mut jobs: Vec<&JobInfo> = snap.jobs.iter().filter(|j| !j.state.is_final()).collect();
    // Running first, then waiting, newest first within each.
    jobs.sort_by_key(|j| (j.state != JobState::Running, std::cmp::Reverse(j.id)));
    let header = Row::new([
        "JOB",
        "TENANT",
        "NAME",
        "STATE",
        "SIZE",
        "TIME",
        "RESTARTS",
        "NODES / REASON",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    let rows = jobs.iter().map(|j| {
        let last = if matches!(j.state, JobState::Running | JobState::Checkpointing) {
            j.nodes.join(",")
        } else {
            j.reason.clone()
        };
        Row::new(vec![
            j.id.to_string(),
            j.tenant.clone(),
            j.name.clone(),
            j.state.to_string(),
            format!("{}x{}", j.nodes_requested, j.gpus_per_node),
            running_time(j, snap.now_ms),
            j.restarts.to_string(),
            last,
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(6),
            Constraint::Length(10),
            Constraint::Length(12),
            Constraint::Length(13),
            Constraint::Length(6),
            Constraint::Length(9),
            Constraint::Length(8),
            Constraint::Min(10),
        ],
    )
    .header(header)
    .block(
        Block::default()
            .borders(Borders::ALL)
            .title(format!(" Jobs ({} active) ", jobs.len())),
    );
    f.render_widget(table, area);
}

fn render_events(f: &mut Frame, area: Rect, snap: &Snapshot, job: Option<u64>) {
    let shown = area.height.saturating_sub(2) as usize;
    let lines: Vec<Line> = snap
        .events
        .iter()
        .rev()
        .filter(|e| job.is_none_or(|j| e.job == Some(j)))
        .take(shown)
        .map(|e| {
            let style = match e.severity.as_str() {
                "critical" => Style::default().fg(Color::Red),
                "warning" => Style::default().fg(Color::Yellow),
                _ => Style::default(),
            };
            let time = e.at.get(11..19).unwrap_or(&e.at).to_string();
            Line::from(vec![
                Span::raw(format!("{time} ")),
                Span::styled(format!("{:<8} ", e.severity), style),
                Span::raw(format!("{:<14} {}", e.kind, e.message)),
            ])
        })
        .collect();
    f.render_widget(
        Paragraph::new(lines).block(
            Block::default()
                .borders(Borders::ALL)
                .title(" Recent events "),
        ),
        area,
    );
}

fn render_job(f: &mut Frame, area: Rect, snap: &Snapshot, view: &JobView) {
    let j = &view.job;
    let gpu_rows: usize = j
        .nodes
        .iter()
        .map(|n| j.gpus.get(n).map_or(1, |g| g.len().max(1)))
        .sum();
    let ranks = (gpu_rows as u16 + 3).clamp(4, (area.height / 3).max(4));
    let [head, ranks_area, mid, log] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Length(ranks),
        Constraint::Length(6),
        Constraint::Min(4),
    ])
    .areas(area);
    let mut head_lines = vec![
        Line::from(vec![
            Span::styled(
                format!("job {} {} ", j.id, j.name),
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!(
                "tenant {}  state {}  epoch {}  restarts {}/{}  running {}",
                j.tenant,
                j.state,
                j.epoch.map(|e| e.to_string()).unwrap_or_else(|| "-".into()),
                j.restarts,
                j.max_restarts,
                running_time(j, snap.now_ms)
            )),
        ]),
        Line::from(j.command.join(" ")),
    ];
    if !j.reason.is_empty() {
        head_lines.push(Line::from(format!("reason: {}", j.reason)));
    }
    f.render_widget(Paragraph::new(head_lines).wrap(Wrap { trim: true }), head);

    let header = Row::new(["RANK", "NODE", "GPU", "UTIL", "TEMP", "POWER", "MEMORY"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    let mut rows = Vec::new();
    for (rank, node) in j.nodes.iter().enumerate() {
        let util = snap.job_util(node, j.id);
        let gpus = j.gpus.get(node).cloned().unwrap_or_default();
        if gpus.is_empty() {
            rows.push(Row::new(vec![
                Line::from(rank.to_string()),
                Line::from(node.clone()),
                Line::from("-"),
                Line::from(Span::styled(
                    util.map(|u| format!("{u:.0}%"))
                        .unwrap_or_else(|| "-".into()),
                    util_style(util),
                )),
            ]));
        }
        for (i, gpu) in gpus.iter().enumerate() {
            let [u, temp, power, mem] = sample_cells(snap, node, *gpu, util);
            let first = i == 0;
            rows.push(Row::new(vec![
                Line::from(if first {
                    rank.to_string()
                } else {
                    String::new()
                }),
                Line::from(if first { node.clone() } else { String::new() }),
                Line::from(gpu.to_string()),
                u,
                temp,
                power,
                mem,
            ]));
        }
    }
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(5),
                Constraint::Length(14),
                Constraint::Length(4),
                Constraint::Length(5),
                Constraint::Length(7),
                Constraint::Length(7),
                Constraint::Min(14),
            ],
        )
        .header(header)
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(" Ranks, per GPU "),
        ),
        ranks_area,
    );

    let [ckpt, events] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(mid);
    let names = |ids: &[u64]| {
        ids.iter()
            .map(|id| {
                snap.nodes
                    .iter()
                    .find(|n| n.id == *id)
                    .map(|n| n.name.clone())
                    .unwrap_or_else(|| id.to_string())
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let ckpt_lines: Vec<Line> = match view
        .checkpoints
        .iter()
        .filter(|c| c.committed_at.is_some())
        .max_by_key(|c| c.step)
    {
        Some(c) => vec![
            Line::from(format!("last checkpoint: step {}", c.step)),
            Line::from(format!("{} bytes, epoch {}", c.bytes, c.epoch)),
            Line::from(format!(
                "replicas ({}): {}",
                c.replicas.len(),
                names(&c.replicas)
            )),
        ],
        None => vec![Line::from("no committed checkpoint yet")],
    };
    f.render_widget(
        Paragraph::new(ckpt_lines)
            .wrap(Wrap { trim: true })
            .block(Block::default().borders(Borders::ALL).title(" Checkpoint ")),
        ckpt,
    );
    render_events(f, events, snap, Some(j.id));

    let shown = log.height.saturating_sub(2) as usize;
    let mut lines: Vec<Line> = view
        .log
        .iter()
        .skip(view.log.len().saturating_sub(shown))
        .map(|l| Line::from(l.clone()))
        .collect();
    if let Some(note) = &view.log_note {
        lines.insert(
            0,
            Line::from(Span::styled(
                note.clone(),
                Style::default().fg(Color::DarkGray),
            )),
        );
    }
    f.render_widget(
        Paragraph::new(lines).block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!(" Log, rank {} ", view.log_rank)),
        ),
        log,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::telemetry::{GpuTelemetry, NodeTelemetry, Telemetry};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use shoal_sdk::{CheckpointInfo, EventInfo, GpuInfo};
    use std::collections::BTreeMap;

    fn gpu(index: u32, job: Option<u64>) -> GpuInfo {
        GpuInfo {
            index,
            model: "H100-80GB".into(),
            memory_mb: 81920,
            uuid: format!("GPU-{index}"),
            allocated_to: job,
            numa_node: None,
            nvlink_peers: Vec::new(),
            mig_enabled: false,
            health: "ok".into(),
            health_reason: None,
        }
    }

    fn node(id: u64, name: &str, state: MemberState, jobs: &[Option<u64>]) -> NodeInfo {
        let gpus: Vec<GpuInfo> = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| gpu(i as u32, *j))
            .collect();
        NodeInfo {
            id,
            name: name.into(),
            state,
            addr: "127.0.0.1:7071".into(),
            api_addr: "127.0.0.1:7070".into(),
            api_url: "http://127.0.0.1:7070".into(),
            labels: BTreeMap::from([("rack".to_string(), "r1".to_string())]),
            gpus_free: jobs.iter().filter(|j| j.is_none()).count() as u32,
            gpus_total: gpus.len() as u32,
            gpus,
            last_seen_ms: Some(10),
            voter: true,
            joined_at_ms: 0,
            gpu_util: Some(0.5),
            drained: false,
            isolation: "none".into(),
            isolation_controllers: Vec::new(),
            version: String::new(),
            protocol: String::new(),
        }
    }

    fn job(id: u64, state: &str, nodes: &[&str], reason: &str) -> JobInfo {
        JobInfo {
            id,
            name: format!("train{id}"),
            tenant: "vision".into(),
            state: state.into(),
            reason: reason.into(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            gpus: nodes.iter().map(|n| (n.to_string(), vec![0, 1])).collect(),
            epoch: Some(17),
            restarts: 1,
            max_restarts: 3,
            requeue: false,
            preemptions: 0,
            priority: 0,
            nodes_requested: nodes.len().max(1) as u32,
            gpus_per_node: 2,
            time_limit_s: 3600,
            preemptible: true,
            command: vec!["python3".into(), "train.py".into()],
            submitted_at: "2026-12-01T10:00:00Z".into(),
            started_at: Some("2026-12-01T10:00:00Z".into()),
            ended_at: None,
            exit_code: None,
            last_ckpt_step: Some(40),
            mem_bytes: None,
            cpus_per_task: None,
            tasks_per_node: 1,
            dependency: None,
            held: false,
            signal: None,
            nodelist: None,
            exclude: None,
            exclusive: false,
            region: None,
        }
    }

    fn snapshot() -> Snapshot {
        let telemetry = Telemetry {
            node: "n1".into(),
            at_ms: 0,
            nodes: vec![
                NodeTelemetry {
                    id: 1,
                    name: "n1".into(),
                    job_util: BTreeMap::from([(7, 93.0)]),
                    ..Default::default()
                },
                NodeTelemetry {
                    id: 2,
                    name: "n2".into(),
                    job_util: BTreeMap::from([(7, 41.0)]),
                    ..Default::default()
                },
            ],
        };
        Snapshot {
            api: "http://127.0.0.1:7070".into(),
            nodes: vec![
                node(1, "n1", MemberState::Alive, &[Some(7), Some(7), None, None]),
                node(2, "n2", MemberState::Alive, &[Some(7), Some(7), None, None]),
                node(3, "n3", MemberState::Down, &[None, None, None, None]),
            ],
            jobs: vec![
                job(7, "running", &["n1", "n2"], ""),
                job(8, "pending", &[], "no 4 nodes with 2 free H100"),
                job(6, "completed", &["n3"], ""),
            ],
            events: vec![EventInfo {
                id: 1,
                at: "2026-12-01T10:59:00Z".into(),
                at_ms: 0,
                severity: "critical".into(),
                kind: "node_down".into(),
                node: Some("n3".into()),
                gpu: None,
                job: None,
                message: "n3 stopped answering".into(),
                resource: None,
                repeats: 0,
            }],
            telemetry: Some(telemetry),
            job: None,
            problem: None,
            now_ms: 1_796_119_200_000 + 125_000, // 2026-12-01T10:02:05Z
            show_gpus: false,
        }
    }

    /// n2's GPUs as the relay brought them; n3 did not answer.
    fn with_relayed_samples(mut snap: Snapshot) -> Snapshot {
        let t = snap.telemetry.as_mut().expect("telemetry");
        t.nodes[1].gpus = (0..4)
            .map(|i| GpuTelemetry {
                index: i,
                util_pct: if i < 2 { 41 } else { 0 },
                temp_c: 60 + i,
                power_w: 300.0 + f64::from(i),
                fb_used_mb: 1000 + u64::from(i),
                fb_total_mb: 81_559,
                throttle: Vec::new(),
                job: (i < 2).then_some(7),
                job_name: (i < 2).then(|| "train7".into()),
            })
            .collect();
        t.nodes[1].gpus_age_ms = Some(400);
        t.nodes.push(NodeTelemetry {
            id: 3,
            name: "n3".into(),
            gpus_problem: Some("no data: no answer within 1000 ms".into()),
            ..Default::default()
        });
        snap
    }

    fn text_of(snap: &Snapshot, w: u16, h: u16) -> String {
        let mut term = Terminal::new(TestBackend::new(w, h)).expect("test backend");
        term.draw(|f| render(f, snap)).expect("draw");
        let buf = term.backend().buffer().clone();
        let mut out = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                out.push_str(buf[(x, y)].symbol());
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn cluster_frame_shows_nodes_gpus_jobs_reasons_and_events() {
        let text = text_of(&snapshot(), 120, 30);
        assert!(text.contains("nodes 2/3 alive"), "{text}");
        assert!(text.contains("GPUs 8/12 free"), "{text}");
        // n1's two GPUs of job 7 at 93 %, two free.
        assert!(text.contains("99.."), "{text}");
        assert!(text.contains("44.."), "{text}");
        assert!(text.contains("down"), "{text}");
        assert!(text.contains("no 4 nodes with 2 free H100"), "{text}");
        assert!(text.contains("00:02:05"), "{text}");
        assert!(text.contains("n3 stopped answering"), "{text}");
        // Finished jobs are not in the queue.
        assert!(!text.contains("train6"), "{text}");
    }

    #[test]
    fn job_frame_shows_ranks_util_checkpoint_and_log() {
        let mut snap = snapshot();
        let job = snap.jobs[0].clone();
        snap.job = Some(JobView {
            job,
            checkpoints: vec![CheckpointInfo {
                step: 40,
                bytes: 1234,
                replicas: vec![1, 2, 3],
                committed_at: Some("2026-12-01T10:01:00Z".into()),
                epoch: 17,
                parts: Vec::new(),
                regions: Vec::new(),
            }],
            log_rank: 0,
            log: (0..50).map(|i| format!("step {i} loss 0.{i}")).collect(),
            log_note: None,
        });
        let text = text_of(&snap, 100, 32);
        assert!(text.contains("job 7 train7"), "{text}");
        assert!(text.contains("epoch 17"), "{text}");
        assert!(text.contains("restarts 1/3"), "{text}");
        assert!(text.contains("93%"), "{text}");
        assert!(text.contains("41%"), "{text}");
        assert!(text.contains("last checkpoint: step 40"), "{text}");
        assert!(text.contains("replicas (3): n1,n2,n3"), "{text}");
        // The tail: the newest line is shown, the oldest scrolled away.
        assert!(text.contains("step 49 loss 0.49"), "{text}");
        assert!(!text.contains("step 0 loss"), "{text}");
    }

    #[test]
    fn gpu_list_shows_every_nodes_temperature_power_memory_and_job() {
        let mut snap = with_relayed_samples(snapshot());
        snap.show_gpus = true;
        let text = text_of(&snap, 120, 40);
        assert!(text.contains("TEMP"), "{text}");
        // n2's GPU 1, relayed: job by name, its sample.
        assert!(text.contains("7 train7"), "{text}");
        assert!(text.contains("61 °C"), "{text}");
        assert!(text.contains("301 W"), "{text}");
        assert!(text.contains("1001/81559 MiB"), "{text}");
        // n3 did not answer: no data, and why.
        assert!(text.contains("no data: no answer"), "{text}");
    }

    #[test]
    fn job_frame_lists_each_ranks_gpus_with_their_samples() {
        let mut snap = with_relayed_samples(snapshot());
        let job = snap.jobs[0].clone();
        snap.job = Some(JobView {
            job,
            checkpoints: Vec::new(),
            log_rank: 0,
            log: Vec::new(),
            log_note: None,
        });
        let text = text_of(&snap, 100, 40);
        assert!(text.contains("Ranks, per GPU"), "{text}");
        assert!(text.contains("60 °C"), "{text}");
        assert!(text.contains("1001/81559 MiB"), "{text}");
        // n1 (rank 0) has no samples in this snapshot: its job's mean.
        assert!(text.contains("93%"), "{text}");
    }

    #[test]
    fn a_failed_refresh_is_said_in_the_status_line() {
        let mut snap = snapshot();
        snap.problem = Some("cannot reach http://127.0.0.1:7070".into());
        let text = text_of(&snap, 100, 24);
        assert!(text.contains("problem: cannot reach"), "{text}");
    }

    #[test]
    fn a_phone_sized_terminal_still_draws() {
        let text = text_of(&snapshot(), 40, 12);
        assert!(text.contains("shoal top"), "{text}");
    }
}
