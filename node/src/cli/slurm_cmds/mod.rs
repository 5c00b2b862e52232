//! `squeue`, `scancel`, `sinfo`, `sacct` and `scontrol` as their own
//! commands: each parses Slurm's flags into an options struct (pure), reads
//! jobs or nodes through the API, and prints Slurm's layouts (pure
//! formatting functions of `JobInfo`/`NodeInfo`, a time and the options).
//!
//! Mappings (docs/slurm.md): a Slurm user is a shoal tenant (`-u`/`-A` match
//! the job's tenant; `--me` the caller's tenant, `$SHOAL_TENANT`, else
//! `default`); there is one partition, `shoal`, and every `-p` names it.

use crate::cli::api;
use shoal_sdk::JobState;
use shoal_sdk::{Client, JobInfo, MemberState, NodeInfo};
use std::collections::VecDeque;

pub use super::jobs::{format_elapsed, PARTITION};

/// The caller's tenant for `--me`.
fn my_tenant() -> String {
    std::env::var("SHOAL_TENANT")
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "default".into())
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub async fn run(client: &Client, name: &str, args: &[String]) -> anyhow::Result<()> {
    match name {
        "squeue" => {
            let mut o = parse_squeue(args).map_err(|e| usage_error(&e))?;
            o.users = resolve_users(client, &o.users).await;
            let jobs = client.jobs(None, None).await.map_err(api)?;
            if o.json {
                let jobs: Vec<JobInfo> = squeue_select(&o, jobs, &my_tenant());
                return super::print_json(&jobs);
            }
            print!("{}", squeue_text(&o, jobs, &my_tenant(), now_s())?);
            Ok(())
        }
        "scancel" => scancel(client, args).await,
        "sinfo" => {
            let o = parse_sinfo(args).map_err(|e| usage_error(&e))?;
            let nodes = client.nodes().await.map_err(api)?;
            if o.json {
                return super::print_json(&nodes);
            }
            print!("{}", sinfo_text(&o, &nodes)?);
            Ok(())
        }
        "sacct" => {
            let mut o = parse_sacct(args, now_s()).map_err(|e| usage_error(&e))?;
            o.users = resolve_users(client, &o.users).await;
            let jobs = client.jobs(None, None).await.map_err(api)?;
            let jobs = sacct_select(&o, jobs);
            if o.json {
                return super::print_json(&jobs);
            }
            print!("{}", sacct_text(&o, &jobs, now_s()));
            Ok(())
        }
        "scontrol" => scontrol(client, args).await,
        other => Err(usage_error(&format!(
            "'{other}' is not a Slurm command shoal runs (squeue, scancel, sinfo, sacct, scontrol)"
        ))),
    }
}

/// A usage error: printed as one `error:` line by the caller; exit 2.
/// `-u` names as tenants: a user mapped with `sacctmgr add user` stands
/// for its tenant; any other name is taken as a tenant (as before users
/// existed, and when the server cannot list them).
async fn resolve_users(client: &Client, names: &[String]) -> Vec<String> {
    if names.is_empty() {
        return Vec::new();
    }
    let users = client.users().await.unwrap_or_default();
    super::jobs::tenants_of_users(names, &users)
}

fn usage_error(msg: &str) -> anyhow::Error {
    eprintln!("error: {msg}");
    super::jobs::ExitWith(2).into()
}

// ---------------------------------------------------------------- options

/// Slurm-style option reading: `--long=V`, `--long V`, `-xV`, `-x V`, and
/// bundled switches (`-hl`).
struct Reader<'a> {
    prog: &'a str,
    args: VecDeque<String>,
    positional_only: bool,
}

enum Item {
    /// The option's name without dashes (one letter for short options),
    /// an inline value, and how it was written.
    Opt(String, Option<String>, String),
    Positional(String),
}

impl<'a> Reader<'a> {
    fn new(prog: &'a str, args: &[String]) -> Self {
        Reader {
            prog,
            args: args.iter().cloned().collect(),
            positional_only: false,
        }
    }

    /// The next option, for commands that take no positional argument.
    fn next_option(&mut self) -> Result<Option<(String, Option<String>, String)>, String> {
        match self.next() {
            None => Ok(None),
            Some(Item::Opt(name, inline, shown)) => Ok(Some((name, inline, shown))),
            Some(Item::Positional(p)) => Err(format!("{}: unexpected argument '{p}'", self.prog)),
        }
    }

    fn next(&mut self) -> Option<Item> {
        let arg = self.args.pop_front()?;
        if self.positional_only {
            return Some(Item::Positional(arg));
        }
        if arg == "--" {
            self.positional_only = true;
            return self.next();
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (n, v) = match long.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            };
            return Some(Item::Opt(n.clone(), v, format!("--{n}")));
        }
        if arg.len() > 1 && arg.starts_with('-') {
            let mut chars = arg[1..].chars();
            let c = chars.next().unwrap_or('-');
            let rest: String = chars.collect();
            let rest = rest.strip_prefix('=').map(str::to_string).unwrap_or(rest);
            return Some(Item::Opt(
                c.to_string(),
                (!rest.is_empty()).then_some(rest),
                format!("-{c}"),
            ));
        }
        Some(Item::Positional(arg))
    }

    /// The value of an option that takes one.
    fn value(&mut self, inline: Option<String>, shown: &str) -> Result<String, String> {
        match inline {
            Some(v) => Ok(v),
            None => self
                .args
                .pop_front()
                .ok_or_else(|| format!("{}: {shown} needs a value", self.prog)),
        }
    }

    /// A switch written bundled with others (`-hl`): the rest goes back.
    fn switch(&mut self, inline: Option<String>, shown: &str) {
        if let Some(rest) = inline {
            if shown.len() == 2 {
                self.args.push_front(format!("-{rest}"));
            }
        }
    }

    fn unsupported(&self, shown: &str) -> String {
        format!("{}: unsupported option '{shown}'", self.prog)
    }
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn ids(prog: &str, v: &str) -> Result<Vec<u64>, String> {
    list(v)
        .iter()
        .map(|s| {
            s.parse::<u64>()
                .map_err(|_| format!("{prog}: invalid job id '{s}'"))
        })
        .collect()
}

// ------------------------------------------------------------ job states

/// Slurm's (compact, long) state of a shoal job: shoal's end states
/// `timeout`, `node_fail` and `out_of_memory` are Slurm's TIMEOUT,
/// NODE_FAIL and OUT_OF_MEMORY. (A `failed` job recorded by an older
/// release is still read by its reason.)
pub fn slurm_state(job: &JobInfo) -> (&'static str, &'static str) {
    match job.state {
        JobState::Pending => ("PD", "PENDING"),
        JobState::Running => ("R", "RUNNING"),
        JobState::Checkpointing => ("CG", "COMPLETING"),
        JobState::Requeued => ("RQ", "REQUEUED"),
        JobState::Completed => ("CD", "COMPLETED"),
        JobState::Cancelled => ("CA", "CANCELLED"),
        JobState::Preempted => ("PR", "PREEMPTED"),
        JobState::Timeout => ("TO", "TIMEOUT"),
        JobState::NodeFail => ("NF", "NODE_FAIL"),
        JobState::OutOfMemory => ("OOM", "OUT_OF_MEMORY"),
        JobState::Failed if job.reason.starts_with("time limit") => ("TO", "TIMEOUT"),
        JobState::Failed if job.reason.contains("went down") => ("NF", "NODE_FAIL"),
        JobState::Failed | JobState::Unknown => ("F", "FAILED"),
    }
}

/// A state as `-t`/`--state` names it (`PD`, `pending`, `R,PD`...), as
/// Slurm's compact code; `all` is `None`.
fn state_code(prog: &str, s: &str) -> Result<Option<&'static str>, String> {
    const CODES: &[(&str, &str)] = &[
        ("PD", "PENDING"),
        ("R", "RUNNING"),
        ("CG", "COMPLETING"),
        ("RQ", "REQUEUED"),
        ("CD", "COMPLETED"),
        ("CA", "CANCELLED"),
        ("PR", "PREEMPTED"),
        ("TO", "TIMEOUT"),
        ("NF", "NODE_FAIL"),
        ("F", "FAILED"),
        ("OOM", "OUT_OF_MEMORY"),
    ];
    let up = s.to_ascii_uppercase();
    if up == "ALL" {
        return Ok(None);
    }
    CODES
        .iter()
        .find(|(c, l)| *c == up || *l == up)
        .map(|(c, _)| Some(*c))
        .ok_or_else(|| format!("{prog}: invalid job state '{s}'"))
}

/// Jobs that are not finished: what squeue shows and scancel acts on.
fn active(job: &JobInfo) -> bool {
    !job.state.is_final()
}

// ------------------------------------------------------------ time

/// Seconds since the epoch of `YYYY-MM-DD[THH:MM[:SS]]` (UTC; anything after
/// the seconds, a fraction or `Z`, is ignored). A day or time that does not
/// exist (`2024-02-31`, `25:00`) is none.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let (date, time) = match s.split_once(['T', ' ']) {
        Some((d, t)) => (d, t),
        None => (s, ""),
    };
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    if d.next().is_some() {
        return None;
    }
    let date = time::Date::from_calendar_date(
        i32::try_from(y).ok()?,
        time::Month::try_from(u8::try_from(m).ok()?).ok()?,
        u8::try_from(day).ok()?,
    )
    .ok()?;
    let time: String = time
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ':')
        .collect();
    let mut t = time.split(':').filter(|p| !p.is_empty());
    let hh = t.next().map_or(Some(0), |p| p.parse::<u8>().ok())?;
    let mm = t.next().map_or(Some(0), |p| p.parse::<u8>().ok())?;
    let ss = t.next().map_or(Some(0), |p| p.parse::<u8>().ok())?;
    let time = time::Time::from_hms(hh, mm, ss).ok()?;
    Some(
        time::PrimitiveDateTime::new(date, time)
            .assume_utc()
            .unix_timestamp(),
    )
}

/// `YYYY-MM-DDTHH:MM:SS`, Slurm's way of printing a time (UTC here).
pub fn format_timestamp(s: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(s) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        // Beyond the calendar `time` knows (±9999 years): Slurm's word.
        Err(_) => "Unknown".into(),
    }
}

/// A time as sacct's `-S`/`-E` take it: `YYYY-MM-DD[THH:MM[:SS]]`,
/// `HH:MM[:SS]` (today), `now`, `now-N[seconds|minutes|hours|days|weeks]`.
pub fn parse_when(s: &str, now: i64) -> Option<i64> {
    let l = s.to_ascii_lowercase();
    if l == "now" {
        return Some(now);
    }
    if let Some(rest) = l.strip_prefix("now-") {
        let split = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: i64 = rest[..split].parse().ok()?;
        let unit = match &rest[split..] {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 604_800,
            _ => return None,
        };
        return Some(now - n * unit);
    }
    if s.contains('-') {
        return parse_timestamp(s);
    }
    let midnight = now - now.rem_euclid(86_400);
    let mut t = s.split(':');
    let hh: u8 = t.next()?.parse().ok()?;
    let mm: u8 = t.next()?.parse().ok()?;
    let ss: u8 = t.next().map_or(Some(0), |p| p.parse().ok())?;
    if t.next().is_some() {
        return None;
    }
    let time = time::Time::from_hms(hh, mm, ss).ok()?;
    Some(
        midnight
            + i64::from(time.hour()) * 3600
            + i64::from(time.minute()) * 60
            + i64::from(time.second()),
    )
}

/// squeue's TIME and TIME_LIMIT: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`.
pub fn format_squeue_time(s: u64) -> String {
    let (d, h, m, sec) = (s / 86_400, (s / 3600) % 24, (s / 60) % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{sec:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{sec:02}")
    } else {
        format!("{m}:{sec:02}")
    }
}

/// Seconds the job has run: to its end, or to `now` while it runs.
fn run_time(job: &JobInfo, now: i64) -> u64 {
    let Some(start) = job.started_at.as_deref().and_then(parse_timestamp) else {
        return 0;
    };
    if active(job) && !matches!(job.state, JobState::Running | JobState::Checkpointing) {
        return 0; // requeued or pending again: not running now
    }
    let end = job
        .ended_at
        .as_deref()
        .and_then(parse_timestamp)
        .unwrap_or(now);
    end.saturating_sub(start).max(0) as u64
}

fn opt_time(t: Option<&str>, none: &str) -> String {
    t.and_then(parse_timestamp)
        .map(format_timestamp)
        .unwrap_or_else(|| none.to_string())
}

// ------------------------------------------------------------ formats

/// One piece of a `%`-format: literal text, or a field with its width
/// (`%.18i`: right-justified in 18; `%8j`: left-justified in 8; `%#P`: as
/// wide as the widest value).
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Field {
        right: bool,
        width: Option<usize>,
        auto: bool,
        kind: char,
    },
}

pub fn parse_format(prog: &str, fmt: &str, known: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            text.push('%');
            continue;
        }
        let mut right = false;
        let mut auto = false;
        if chars.peek() == Some(&'.') {
            right = true;
            chars.next();
        }
        if chars.peek() == Some(&'#') {
            auto = true;
            chars.next();
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let kind = chars
            .next()
            .ok_or_else(|| format!("{prog}: the format ends in the middle of a field"))?;
        if !known.contains(kind) {
            return Err(format!("{prog}: unsupported format field '%{kind}'"));
        }
        if !text.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut text)));
        }
        out.push(Piece::Field {
            right,
            width: digits.parse().ok(),
            auto,
            kind,
        });
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

fn fit(value: &str, width: Option<usize>, right: bool) -> String {
    match width {
        None => value.to_string(),
        Some(w) => {
            let v: String = value.chars().take(w).collect();
            if right {
                format!("{v:>w$}")
            } else {
                format!("{v:<w$}")
            }
        }
    }
}

/// Rows of `pieces`: `header` names each field kind, `value` gives a row's
/// field. Auto widths (`%#X`) fit the widest value.
fn render<T>(
    pieces: &[Piece],
    rows: &[T],
    header: Option<&dyn Fn(char) -> String>,
    value: &dyn Fn(&T, char) -> String,
) -> String {
    let widths: Vec<Option<usize>> = pieces
        .iter()
        .map(|p| match p {
            Piece::Field {
                auto: true, kind, ..
            } => {
                let h = header.map_or(0, |h| h(*kind).chars().count());
                Some(
                    rows.iter()
                        .map(|r| value(r, *kind).chars().count())
                        .max()
                        .unwrap_or(0)
                        .max(h),
                )
            }
            Piece::Field { width, .. } => *width,
            Piece::Text(_) => None,
        })
        .collect();
    let line = |field: &dyn Fn(char) -> String| {
        let mut s = String::new();
        for (p, w) in pieces.iter().zip(&widths) {
            match p {
                Piece::Text(t) => s.push_str(t),
                Piece::Field { right, kind, .. } => s.push_str(&fit(&field(*kind), *w, *right)),
            }
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = String::new();
    if let Some(h) = header {
        out.push_str(&line(h));
    }
    for r in rows {
        out.push_str(&line(&|k| value(r, k)));
    }
    out
}

mod sacct;
mod scancel;
mod scontrol;
mod sinfo;
mod squeue;

pub use sacct::*;
pub use scancel::*;
pub use scontrol::*;
pub use sinfo::*;
pub use squeue::*;

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_619_200; // 2025-12-01T20:00:00Z

    fn job(id: u64, name: &str, tenant: &str, state: &str) -> JobInfo {
        let running = state != "pending";
        JobInfo {
            region: None,
            id,
            name: name.into(),
            tenant: tenant.into(),
            state: state.into(),
            reason: if state == "pending" {
                "no 1 nodes with 2 free GPUs".into()
            } else {
                String::new()
            },
            nodes: if running { vec!["n1".into()] } else { vec![] },
            gpus: Default::default(),
            epoch: None,
            restarts: 0,
            max_restarts: 0,
            requeue: false,
            preemptions: 0,
            priority: 0,
            nodes_requested: 1,
            gpus_per_node: 2,
            time_limit_s: 3600,
            preemptible: true,
            command: vec![
                "/bin/sh".into(),
                "-c".into(),
                "#!/bin/sh\ntrue\n".into(),
                "job.sh".into(),
            ],
            submitted_at: "2025-12-01T19:58:00.123Z".into(),
            started_at: running.then(|| "2025-12-01T19:58:55Z".into()),
            ended_at: shoal_sdk::JobState::from(state)
                .is_final()
                .then(|| "2025-12-01T19:59:00Z".into()),
            exit_code: (state == "completed").then_some(0),
            last_ckpt_step: None,
            mem_bytes: None,
            cpus_per_task: None,
            tasks_per_node: 1,
            dependency: None,
            held: false,
            signal: None,
            nodelist: None,
            exclude: None,
            exclusive: false,
        }
    }

    fn node(name: &str, free: u32, drained: bool, state: &str) -> NodeInfo {
        serde_json::from_value(serde_json::json!({
            "id": 1, "name": name, "state": state, "addr": "127.0.0.1:7071",
            "api_addr": "127.0.0.1:7070", "labels": {"zone": "a"},
            "gpus": (0..4).map(|i| serde_json::json!({"index": i, "model": "H100",
                "memory_mb": 81920, "uuid": format!("GPU-{i}"), "allocated_to": null}))
                .collect::<Vec<_>>(),
            "gpus_free": free, "gpus_total": 4, "last_seen_ms": 5, "voter": true,
            "joined_at_ms": 0, "drained": drained
        }))
        .expect("node")
    }

    fn a(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn jobs() -> Vec<JobInfo> {
        vec![
            job(4, "b", "vision", "pending"),
            job(2, "train-long-name", "vision", "running"),
            job(3, "c", "nlp", "running"),
            job(5, "d", "default", "completed"),
        ]
    }

    #[test]
    fn times_round_trip() {
        assert_eq!(parse_timestamp("2025-12-01T20:00:00Z"), Some(NOW));
        assert_eq!(parse_timestamp("2025-12-01T20:00:00.5+00:00"), Some(NOW));
        assert_eq!(parse_timestamp("2025-12-01"), Some(NOW - 20 * 3600));
        assert_eq!(format_timestamp(NOW), "2025-12-01T20:00:00");
        assert_eq!(parse_when("now-2hours", NOW), Some(NOW - 7200));
        assert_eq!(parse_when("19:30", NOW), Some(NOW - 1800));
        assert_eq!(parse_when("bogus", NOW), None);
        // Days and times that do not exist are refused, leap days kept.
        assert_eq!(parse_timestamp("2024-02-31"), None);
        assert_eq!(parse_timestamp("2023-02-29"), None);
        assert!(parse_timestamp("2024-02-29").is_some());
        assert_eq!(parse_timestamp("2025-12-01T24:00"), None);
        assert_eq!(parse_timestamp("2025-13-01"), None);
        assert_eq!(parse_when("19:61", NOW), None);
        assert_eq!(parse_when("19:30:00:00", NOW), None);
        assert_eq!(
            parse_timestamp("1969-12-31T23:59:59"),
            Some(-1),
            "before the epoch"
        );
        assert_eq!(format_timestamp(-1), "1969-12-31T23:59:59");
        assert_eq!(format_squeue_time(65), "1:05");
        assert_eq!(format_squeue_time(3600), "1:00:00");
        assert_eq!(format_squeue_time(90_061), "1-01:01:01");
        assert_eq!(format_elapsed(65), "00:01:05");
    }

    #[test]
    fn formats_parse_with_widths() {
        assert_eq!(
            parse_format("squeue", "%.18i %8j%%", SQUEUE_FIELDS).expect("parses"),
            [
                Piece::Field {
                    right: true,
                    width: Some(18),
                    auto: false,
                    kind: 'i'
                },
                Piece::Text(" ".into()),
                Piece::Field {
                    right: false,
                    width: Some(8),
                    auto: false,
                    kind: 'j'
                },
                Piece::Text("%".into()),
            ]
        );
        let err = parse_format("squeue", "%Z", SQUEUE_FIELDS).expect_err("unknown");
        assert_eq!(err, "squeue: unsupported format field '%Z'");
    }

    #[test]
    fn squeue_default_layout_is_slurms() {
        let o = parse_squeue(&[]).expect("parses");
        let text = squeue_text(&o, jobs(), "default", NOW).expect("text");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
        );
        assert_eq!(
            lines[1],
            "                 2     shoal train-lo   vision  R       1:05      1 n1"
        );
        assert_eq!(
            lines[3],
            "                 4     shoal        b   vision PD       0:00      1 (no 1 nodes with 2 free GPUs)"
        );
        assert_eq!(lines.len(), 4, "{text}"); // the completed job is not shown
    }

    #[test]
    fn squeue_filters_and_formats() {
        let run = |args: &str| {
            let o = parse_squeue(&a(args)).expect("parses");
            squeue_text(&o, jobs(), "default", NOW).expect("text")
        };
        assert_eq!(
            run("-h -j 2,4 -o %i_%j_%t"),
            "2_train-long-name_R\n4_b_PD\n"
        );
        assert_eq!(run("-h -t PD,R -u nlp -o %i"), "3\n");
        assert_eq!(run("-h -t CD -o %i"), "5\n");
        assert_eq!(run("-h --me -t all -o %i"), "5\n");
        assert_eq!(
            run("--noheader -o %.4i|%T|%l|%b|%u -j 3"),
            "   3|RUNNING|1:00:00|gres/gpu:2|nlp\n"
        );
        assert_eq!(run("-o %i -j 5"), "JOBID\n5\n");
        assert!(run("-l").lines().next().expect("header").contains("STATE"));
        let err = parse_squeue(&a("--sort=i")).expect_err("refused");
        assert_eq!(err, "squeue: unsupported option '--sort'");
        assert!(parse_squeue(&a("-t XX")).is_err());
    }

    #[test]
    fn scancel_signals_or_cancels() {
        for args in [
            "--signal=USR1 3",
            "-s USR1 3",
            "-sSIGUSR1 3",
            "--signal 10 3",
        ] {
            let o = parse_scancel(&a(args)).expect(args);
            assert_eq!(
                (o.jobs.as_slice(), o.signal.is_some()),
                (&[3][..], true),
                "{args}"
            );
        }
        assert_eq!(parse_scancel(&a("3")).expect("cancel").signal, None);
        for args in ["--signal=KILL 3", "--signal=USR1@30 3", "-s 3", "--batch 3"] {
            let err = parse_scancel(&a(args)).expect_err(args);
            assert!(err.starts_with("scancel: "), "{err}");
            assert_eq!(err.lines().count(), 1);
        }
        assert!(parse_scancel(&[]).is_err());
        let o = parse_scancel(&a("-u vision")).expect("parses");
        assert_eq!(scancel_select(&o, &jobs(), "default"), [2, 4]);
        let o = parse_scancel(&a("-u vision -t PD")).expect("parses");
        assert_eq!(scancel_select(&o, &jobs(), "default"), [4]);
        let o = parse_scancel(&a("--me")).expect("parses");
        assert!(scancel_select(&o, &jobs(), "default").is_empty()); // 5 has ended
        let o = parse_scancel(&a("--name=c 2,3")).expect("parses");
        assert_eq!(scancel_select(&o, &jobs(), "default"), [3]);
        assert_eq!(parse_scancel(&a("2,3 7")).expect("ids").jobs, [2, 3, 7]);
    }

    #[test]
    fn sinfo_layouts() {
        let nodes = vec![
            node("n1", 4, false, "alive"),
            node("n2", 0, false, "alive"),
            node("n3", 2, false, "alive"),
            node("n4", 4, true, "alive"),
            node("n5", 4, false, "down"),
            node("n6", 4, false, "alive"),
        ];
        let run =
            |args: &str| sinfo_text(&parse_sinfo(&a(args)).expect("parses"), &nodes).expect("text");
        assert_eq!(
            run(""),
            "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n\
             shoal*       up   infinite      2   idle n1,n6\n\
             shoal*       up   infinite      1  alloc n2\n\
             shoal*       up   infinite      1    mix n3\n\
             shoal*       up   infinite      1  drain n4\n\
             shoal*       up   infinite      1   down n5\n"
        );
        let n = run("-N -h -p gpu");
        assert_eq!(n.lines().next(), Some("n1      1 shoal* idle"));
        assert_eq!(n.lines().count(), 6);
        assert!(run("-N -l").contains("gpu:H100:4"));
        assert_eq!(
            run("-s -h"),
            "shoal*    up   infinite         2/2/2/6 n1,n2,n3,n4,n5,n6\n"
        );
        assert_eq!(run("-h -o %N:%T -n n3"), "n3:MIXED\n");
        assert!(parse_sinfo(&a("-o %Z")).is_err());
    }

    #[test]
    fn shoal_end_states_have_their_slurm_names() {
        for (state, code) in [
            ("timeout", "TIMEOUT"),
            ("node_fail", "NODE_FAIL"),
            ("out_of_memory", "OUT_OF_MEMORY"),
            ("failed", "FAILED"),
            ("cancelled", "CANCELLED"),
        ] {
            assert_eq!(slurm_state(&job(1, "j", "t", state)).1, code, "{state}");
        }
        assert!(!active(&job(1, "j", "t", "out_of_memory")));
    }

    #[test]
    fn sacct_records() {
        let mut failed = job(6, "t", "nlp", "timeout");
        failed.reason = "time limit reached (0:10:00)".into();
        failed.exit_code = Some(143);
        let mut lost = job(7, "n", "nlp", "node_fail");
        lost.reason =
            "node n1 went down and the job has no restarts left (--max-restarts 0)".into();
        let mut all = jobs();
        all.extend([failed, lost]);
        let run = |args: &str| {
            let o = parse_sacct(&a(args), NOW).expect("parses");
            sacct_text(&o, &sacct_select_at(&o, all.clone(), NOW), NOW)
        };
        assert_eq!(
            run(
                "-j 5 --parsable2 --format=JobID,JobName,State,ExitCode,Elapsed,AllocTRES,NodeList"
            ),
            "JobID|JobName|State|ExitCode|Elapsed|AllocTRES|NodeList\n\
             5|d|COMPLETED|0:0|00:00:05|billing=2,cpu=1,gres/gpu=2,node=1|n1\n"
        );
        assert_eq!(
            run("-X -n -P -o jobid,state,exitcode -s TO,NF"),
            "6|TIMEOUT|143:0\n7|NODE_FAIL|0:0\n"
        );
        assert_eq!(run("-n -p -o JobID,NodeList -j 4"), "4|None assigned|\n");
        let table = run("-j 5");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode"
        );
        assert!(lines[1].starts_with("------------ ----------"));
        assert_eq!(
            lines[2],
            "5                     d      shoal    default          1  COMPLETED      0:0"
        );
        // -S/-E: a window; without -j, from midnight.
        assert_eq!(run("-n -P -o JobID -S now-1hours -E now -s CD"), "5\n");
        assert_eq!(run("-n -P -o JobID -S 2025-12-02"), "2\n3\n4\n");
        assert!(parse_sacct(&a("--format=Bogus"), NOW).is_err());
        assert!(parse_sacct(&a("-S yesterday-ish"), NOW).is_err());
    }

    #[test]
    fn scontrol_show_and_refusals() {
        assert_eq!(
            parse_scontrol(&a("show job 3")).expect("parses"),
            (Scontrol::ShowJob(Some(3)), false)
        );
        assert_eq!(
            parse_scontrol(&a("-o show node n1")).expect("parses"),
            (Scontrol::ShowNode(Some("n1".into())), true)
        );
        assert_eq!(
            parse_scontrol(&a("update NodeName=n1,n2 State=DRAIN Reason=disk")).expect("parses"),
            (
                Scontrol::DrainNodes(vec!["n1".into(), "n2".into()], true),
                false
            )
        );
        assert_eq!(
            parse_scontrol(&a("update nodename=n1 state=resume")).expect("parses"),
            (Scontrol::DrainNodes(vec!["n1".into()], false), false)
        );
        assert_eq!(
            parse_scontrol(&a("update JobId=3 TimeLimit=5")).expect("parses"),
            (Scontrol::TimeLimit(3, 300), false)
        );
        assert_eq!(
            parse_scontrol(&a("update jobid=3 timelimit=1-00:00:00")).expect("parses"),
            (Scontrol::TimeLimit(3, 86_400), false)
        );
        for bad in [
            "update JobId=3",
            "update JobId=3 Priority=5",
            "update JobId=x TimeLimit=5",
            "update JobId=3 TimeLimit=0",
            "update TimeLimit=5",
            "update JobId=3 NodeName=n1 State=DRAIN TimeLimit=5",
            "update NodeName=n1 State=DOWN",
            "update",
        ] {
            let err = parse_scontrol(&a(bad)).expect_err(bad);
            assert!(err.starts_with("scontrol: "), "{err}");
        }
        assert_eq!(
            parse_scontrol(&a("hold 3,4")).expect("hold"),
            (Scontrol::Hold(vec![3, 4], true), false)
        );
        assert_eq!(
            parse_scontrol(&a("release 3")).expect("release"),
            (Scontrol::Hold(vec![3], false), false)
        );
        assert!(parse_scontrol(&a("hold")).is_err());
        assert_eq!(
            parse_scontrol(&a("requeue 3,4")).expect("requeue"),
            (Scontrol::Requeue(vec![3, 4]), false)
        );
        let err = parse_scontrol(&a("suspend 3")).expect_err("suspend");
        assert_eq!(err, "scontrol: 'suspend' is not supported");
        let text = scontrol_job(&job(2, "train", "vision", "running"), NOW, false);
        assert!(
            text.starts_with("JobId=2 JobName=train\n   UserId=vision"),
            "{text}"
        );
        assert!(
            text.contains("\n   JobState=RUNNING Reason=None\n"),
            "{text}"
        );
        assert!(
            text.contains("RunTime=00:01:05 TimeLimit=01:00:00"),
            "{text}"
        );
        assert!(text.contains("NodeList=n1\n"), "{text}");
        assert!(text.contains("Command=job.sh\n"), "{text}");
        let one = scontrol_job(&job(4, "b", "vision", "pending"), NOW, true);
        assert_eq!(one.lines().count(), 1);
        assert!(one.contains("JobState=PENDING Reason=no 1 nodes"), "{one}");
        let n = scontrol_node(&node("n3", 2, true, "alive"), false);
        assert!(n.starts_with("NodeName=n3 NodeAddr=127.0.0.1"), "{n}");
        assert!(n.contains("\n   State=MIXED+DRAIN\n"), "{n}");
        assert!(n.contains("Gres=gpu:H100:4 GresUsed=gpu:2"), "{n}");
    }
}
