//! `squeue`, `scancel`, `sinfo`, `sacct` and `scontrol` as their own
//! commands: each parses Slurm's flags into an options struct (pure), reads
//! jobs or nodes through the API, and prints Slurm's layouts (pure
//! formatting functions of `JobInfo`/`NodeInfo`, a time and the options).
//!
//! Mappings (docs/slurm.md): a Slurm user is a shoal tenant (`-u`/`-A` match
//! the job's tenant; `--me` the caller's tenant, `$SHOAL_TENANT`, else
//! `default`); there is one partition, `shoal`, and every `-p` names it.

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

fn api(e: shoal_sdk::ClientError) -> anyhow::Error {
    anyhow::anyhow!(e.to_string())
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

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Seconds since the epoch of `YYYY-MM-DD[THH:MM[:SS]]` (UTC; anything after
/// the seconds, a fraction or `Z`, is ignored).
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let (date, time) = match s.split_once(['T', ' ']) {
        Some((d, t)) => (d, t),
        None => (s, ""),
    };
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let time: String = time
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ':')
        .collect();
    let mut t = time.split(':').filter(|p| !p.is_empty());
    let hh = t.next().map_or(Some(0), |p| p.parse::<i64>().ok())?;
    let mm = t.next().map_or(Some(0), |p| p.parse::<i64>().ok())?;
    let ss = t.next().map_or(Some(0), |p| p.parse::<i64>().ok())?;
    Some(days_from_civil(y, m, day) * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// `YYYY-MM-DDTHH:MM:SS`, Slurm's way of printing a time (UTC here).
pub fn format_timestamp(s: i64) -> String {
    let (y, m, d) = civil_from_days(s.div_euclid(86_400));
    let r = s.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        r / 3600,
        (r / 60) % 60,
        r % 60
    )
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
    let hh: i64 = t.next()?.parse().ok()?;
    let mm: i64 = t.next()?.parse().ok()?;
    let ss: i64 = t.next().map_or(Some(0), |p| p.parse().ok())?;
    Some(midnight + hh * 3600 + mm * 60 + ss)
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

// ------------------------------------------------------------ squeue

#[derive(Debug, Default)]
pub struct SqueueOpts {
    pub users: Vec<String>,
    pub me: bool,
    pub accounts: Vec<String>,
    pub jobs: Vec<u64>,
    pub names: Vec<String>,
    /// Slurm compact codes; empty: the default (unfinished jobs).
    pub states: Vec<&'static str>,
    pub all_states: bool,
    pub format: Option<String>,
    pub noheader: bool,
    pub long: bool,
    pub json: bool,
}

pub const SQUEUE_DEFAULT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";
pub const SQUEUE_LONG: &str = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R";
const SQUEUE_FIELDS: &str = "iAjuaTtMlLDRrNbPQSVe";

pub fn parse_squeue(args: &[String]) -> Result<SqueueOpts, String> {
    let mut o = SqueueOpts::default();
    let mut r = Reader::new("squeue", args);
    while let Some((name, inline, shown)) = r.next_option()? {
        match name.as_str() {
            "u" | "user" => o.users.extend(list(&r.value(inline, &shown)?)),
            "me" => o.me = true,
            "A" | "account" => o.accounts.extend(list(&r.value(inline, &shown)?)),
            "j" | "jobs" | "job" => o.jobs.extend(ids("squeue", &r.value(inline, &shown)?)?),
            "n" | "name" => o.names.extend(list(&r.value(inline, &shown)?)),
            "t" | "states" | "state" => {
                for s in list(&r.value(inline, &shown)?) {
                    match state_code("squeue", &s)? {
                        Some(c) => o.states.push(c),
                        None => o.all_states = true,
                    }
                }
            }
            "o" | "format" => o.format = Some(r.value(inline, &shown)?),
            "p" | "partition" | "q" | "qos" => {
                r.value(inline, &shown)?; // one partition: every name is it
            }
            "h" | "noheader" => {
                o.noheader = true;
                r.switch(inline, &shown);
            }
            "l" | "long" => {
                o.long = true;
                r.switch(inline, &shown);
            }
            "a" | "all" | "v" | "verbose" => r.switch(inline, &shown),
            "json" => o.json = true,
            _ => return Err(r.unsupported(&shown)),
        }
    }
    if let Some(f) = &o.format {
        parse_format("squeue", f, SQUEUE_FIELDS)?;
    }
    Ok(o)
}

pub fn squeue_select(o: &SqueueOpts, mut jobs: Vec<JobInfo>, me: &str) -> Vec<JobInfo> {
    jobs.retain(|j| {
        let code = slurm_state(j).0;
        let state_ok = if o.all_states {
            true
        } else if !o.states.is_empty() {
            o.states.contains(&code)
        } else {
            // Listed jobs show whatever their state, like Slurm's while it
            // remembers them; otherwise what is waiting or running.
            !o.jobs.is_empty() || active(j)
        };
        state_ok
            && (o.jobs.is_empty() || o.jobs.contains(&j.id))
            && (o.users.is_empty() || o.users.contains(&j.tenant))
            && (o.accounts.is_empty() || o.accounts.contains(&j.tenant))
            && (o.names.is_empty() || o.names.contains(&j.name))
            && (!o.me || j.tenant == me)
    });
    jobs.sort_by_key(|j| j.id);
    jobs
}

fn squeue_header(kind: char) -> String {
    match kind {
        'i' | 'A' => "JOBID",
        'j' => "NAME",
        'u' => "USER",
        'a' => "ACCOUNT",
        'T' => "STATE",
        't' => "ST",
        'M' => "TIME",
        'l' => "TIME_LIMIT",
        'L' => "TIME_LEFT",
        'D' => "NODES",
        'R' => "NODELIST(REASON)",
        'r' => "REASON",
        'N' => "NODELIST",
        'b' => "TRES_PER_NODE",
        'P' => "PARTITION",
        'Q' => "PRIORITY",
        'S' => "START_TIME",
        'V' => "SUBMIT_TIME",
        'e' => "END_TIME",
        _ => "?",
    }
    .to_string()
}

fn squeue_field(j: &JobInfo, kind: char, now: i64) -> String {
    let pending_like = j.state.is_waiting();
    let reason = || {
        if pending_like && !j.reason.is_empty() {
            j.reason.clone()
        } else {
            "None".to_string()
        }
    };
    match kind {
        'i' | 'A' => j.id.to_string(),
        'j' => j.name.clone(),
        'u' | 'a' => j.tenant.clone(),
        'T' => slurm_state(j).1.to_string(),
        't' => slurm_state(j).0.to_string(),
        'M' => format_squeue_time(run_time(j, now)),
        'l' => format_squeue_time(j.time_limit_s),
        'L' => format_squeue_time(j.time_limit_s.saturating_sub(run_time(j, now))),
        'D' => j.nodes_requested.to_string(),
        'R' => {
            if pending_like || j.nodes.is_empty() {
                format!("({})", reason())
            } else {
                j.nodes.join(",")
            }
        }
        'r' => reason(),
        'N' => {
            if pending_like {
                String::new()
            } else {
                j.nodes.join(",")
            }
        }
        'b' => format!("gres/gpu:{}", j.gpus_per_node),
        'P' => PARTITION.to_string(),
        'Q' => j.priority.to_string(),
        'S' => opt_time(j.started_at.as_deref(), "N/A"),
        'V' => opt_time(Some(&j.submitted_at), "N/A"),
        'e' => opt_time(j.ended_at.as_deref(), "N/A"),
        _ => String::new(),
    }
}

pub fn squeue_text(
    o: &SqueueOpts,
    jobs: Vec<JobInfo>,
    me: &str,
    now: i64,
) -> anyhow::Result<String> {
    let fmt = o.format.clone().unwrap_or_else(|| {
        if o.long {
            SQUEUE_LONG.to_string()
        } else {
            SQUEUE_DEFAULT.to_string()
        }
    });
    let pieces = parse_format("squeue", &fmt, SQUEUE_FIELDS).map_err(anyhow::Error::msg)?;
    let jobs = squeue_select(o, jobs, me);
    let header: &dyn Fn(char) -> String = &squeue_header;
    Ok(render(
        &pieces,
        &jobs,
        (!o.noheader).then_some(header),
        &|j, k| squeue_field(j, k, now),
    ))
}

// ------------------------------------------------------------ scancel

#[derive(Debug, Default)]
pub struct ScancelOpts {
    pub jobs: Vec<u64>,
    pub users: Vec<String>,
    pub me: bool,
    pub accounts: Vec<String>,
    pub names: Vec<String>,
    pub states: Vec<&'static str>,
    pub quiet: bool,
    pub verbose: bool,
    /// `-s/--signal SIG`: signal the jobs' ranks instead of cancelling.
    pub signal: Option<String>,
}

impl ScancelOpts {
    fn filtered(&self) -> bool {
        self.me
            || !self.users.is_empty()
            || !self.accounts.is_empty()
            || !self.names.is_empty()
            || !self.states.is_empty()
    }
}

pub fn parse_scancel(args: &[String]) -> Result<ScancelOpts, String> {
    let mut o = ScancelOpts::default();
    let mut r = Reader::new("scancel", args);
    while let Some(item) = r.next() {
        let (name, inline, shown) = match item {
            Item::Opt(n, v, s) => (n, v, s),
            Item::Positional(p) => {
                o.jobs.extend(ids("scancel", &p)?);
                continue;
            }
        };
        match name.as_str() {
            "s" | "signal" => {
                let sig = r.value(inline, &shown)?;
                // Checked here so a bad name cancels nothing.
                shoal_consensus::workload::WarnSignal::parse(&sig)
                    .ok()
                    .filter(|_| !sig.contains('@'))
                    .ok_or_else(|| {
                        format!(
                            "scancel: invalid signal '{sig}' (use HUP, INT, QUIT, USR1, USR2, ALRM, TERM or CONT)"
                        )
                    })?;
                o.signal = Some(sig);
            }
            // A shoal batch script is a rank like any other: `-b` and `-f`
            // would name which of its processes to signal.
            "b" | "batch" | "f" | "full" => {
                return Err(format!(
                "scancel: {shown} is not supported (--signal reaches every process of every rank)"
            ))
            }
            "u" | "user" => o.users.extend(list(&r.value(inline, &shown)?)),
            "me" => o.me = true,
            "A" | "account" => o.accounts.extend(list(&r.value(inline, &shown)?)),
            "n" | "name" | "jobname" => o.names.extend(list(&r.value(inline, &shown)?)),
            "t" | "state" | "states" => {
                for s in list(&r.value(inline, &shown)?) {
                    if let Some(c) = state_code("scancel", &s)? {
                        o.states.push(c);
                    }
                }
            }
            "p" | "partition" => {
                r.value(inline, &shown)?;
            }
            "Q" | "quiet" => {
                o.quiet = true;
                r.switch(inline, &shown);
            }
            "v" | "verbose" => {
                o.verbose = true;
                r.switch(inline, &shown);
            }
            _ => return Err(r.unsupported(&shown)),
        }
    }
    if o.jobs.is_empty() && !o.filtered() {
        return Err("scancel: no job id given (or -u, --me, -n, -t, -A)".into());
    }
    Ok(o)
}

/// The jobs to cancel among `jobs`: unfinished, matching every filter, and
/// (when ids are given) listed.
pub fn scancel_select(o: &ScancelOpts, jobs: &[JobInfo], me: &str) -> Vec<u64> {
    let mut out: Vec<u64> = jobs
        .iter()
        .filter(|j| {
            active(j)
                && (o.jobs.is_empty() || o.jobs.contains(&j.id))
                && (o.users.is_empty() || o.users.contains(&j.tenant))
                && (o.accounts.is_empty() || o.accounts.contains(&j.tenant))
                && (o.names.is_empty() || o.names.contains(&j.name))
                && (o.states.is_empty() || o.states.contains(&slurm_state(j).0))
                && (!o.me || j.tenant == me)
        })
        .map(|j| j.id)
        .collect();
    out.sort_unstable();
    out
}

async fn scancel(client: &Client, args: &[String]) -> anyhow::Result<()> {
    let mut o = parse_scancel(args).map_err(|e| usage_error(&e))?;
    o.users = resolve_users(client, &o.users).await;
    let targets = if o.filtered() {
        let jobs = client.jobs(None, None).await.map_err(api)?;
        scancel_select(&o, &jobs, &my_tenant())
    } else {
        o.jobs.clone()
    };
    let mut failures = Vec::new();
    for id in targets {
        let done = match &o.signal {
            Some(sig) => client.signal_job(id, sig).await,
            None => client.cancel_job(id).await,
        };
        match done {
            Ok(_) if o.verbose => match &o.signal {
                Some(sig) => eprintln!("scancel: sent {sig} to job {id}"),
                None => eprintln!("scancel: cancelled job {id}"),
            },
            Ok(_) => {}
            Err(e) => failures.push(format!("job {id}: {e}")),
        }
    }
    match failures.len() {
        0 => Ok(()),
        1 => anyhow::bail!("scancel: {}", failures[0]),
        n => anyhow::bail!("scancel: {} (and {} more)", failures[0], n - 1),
    }
}

// ------------------------------------------------------------ sinfo

#[derive(Debug, Default)]
pub struct SinfoOpts {
    pub node_oriented: bool,
    pub long: bool,
    pub summarize: bool,
    pub format: Option<String>,
    pub noheader: bool,
    pub nodes: Vec<String>,
    pub json: bool,
}

const SINFO_FIELDS: &str = "PalDtTNGFERn";

pub fn parse_sinfo(args: &[String]) -> Result<SinfoOpts, String> {
    let mut o = SinfoOpts::default();
    let mut r = Reader::new("sinfo", args);
    while let Some((name, inline, shown)) = r.next_option()? {
        match name.as_str() {
            "N" | "Node" => {
                o.node_oriented = true;
                r.switch(inline, &shown);
            }
            "l" | "long" => {
                o.long = true;
                r.switch(inline, &shown);
            }
            "s" | "summarize" => {
                o.summarize = true;
                r.switch(inline, &shown);
            }
            "h" | "noheader" => {
                o.noheader = true;
                r.switch(inline, &shown);
            }
            "a" | "all" | "v" | "verbose" => r.switch(inline, &shown),
            "o" | "format" => o.format = Some(r.value(inline, &shown)?),
            "p" | "partition" => {
                r.value(inline, &shown)?; // one partition: every name is it
            }
            "n" | "nodes" => o.nodes.extend(list(&r.value(inline, &shown)?)),
            "json" => o.json = true,
            _ => return Err(r.unsupported(&shown)),
        }
    }
    if let Some(f) = &o.format {
        parse_format("sinfo", f, SINFO_FIELDS)?;
    }
    Ok(o)
}

/// A node's (compact, long) Slurm state: idle, mix, alloc from its GPUs;
/// drain (drng while jobs still hold GPUs), down; `*` when it is suspect
/// (not responding).
pub fn node_state(n: &NodeInfo) -> (String, String) {
    let used = n.gpus_total.saturating_sub(n.gpus_free);
    let (short, long) = match n.state {
        MemberState::Down | MemberState::Left => ("down", "DOWN"),
        _ if n.drained && used > 0 => ("drng", "DRAINING"),
        _ if n.drained => ("drain", "DRAINED"),
        _ if used == 0 => ("idle", "IDLE"),
        _ if n.gpus_free == 0 => ("alloc", "ALLOCATED"),
        _ => ("mix", "MIXED"),
    };
    let star = if n.state == MemberState::Suspect {
        "*"
    } else {
        ""
    };
    (format!("{short}{star}"), format!("{long}{star}"))
}

/// `gpu:MODEL:N[,gpu:MODEL2:M]`.
fn gres(n: &NodeInfo) -> String {
    let mut models: Vec<(String, u32)> = Vec::new();
    for g in &n.gpus {
        match models.iter_mut().find(|(m, _)| *m == g.model) {
            Some((_, c)) => *c += 1,
            None => models.push((g.model.clone(), 1)),
        }
    }
    if models.is_empty() {
        return "(null)".into();
    }
    models
        .iter()
        .map(|(m, c)| format!("gpu:{m}:{c}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// One line of sinfo: a group of nodes (one node with -N).
struct NodeGroup<'a> {
    nodes: Vec<&'a NodeInfo>,
}

fn sinfo_header(kind: char) -> String {
    match kind {
        'P' => "PARTITION",
        'a' => "AVAIL",
        'l' => "TIMELIMIT",
        'D' => "NODES",
        't' | 'T' => "STATE",
        'N' => "NODELIST",
        'n' => "HOSTNAMES",
        'G' => "GRES",
        'F' => "NODES(A/I/O/T)",
        'E' | 'R' => "REASON",
        _ => "?",
    }
    .to_string()
}

fn sinfo_field(g: &NodeGroup, kind: char) -> String {
    let first = g.nodes.first();
    match kind {
        'P' => format!("{PARTITION}*"),
        'a' => "up".into(),
        'l' => "infinite".into(),
        'D' => g.nodes.len().to_string(),
        't' => first.map(|n| node_state(n).0).unwrap_or_default(),
        'T' => first.map(|n| node_state(n).1).unwrap_or_default(),
        'N' | 'n' => g
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(","),
        'G' => {
            let mut all: Vec<String> = g.nodes.iter().map(|n| gres(n)).collect();
            all.dedup();
            all.join(",")
        }
        'F' => {
            let (mut a, mut i, mut o) = (0, 0, 0);
            for n in &g.nodes {
                match node_state(n).0.trim_end_matches('*') {
                    "alloc" | "mix" => a += 1,
                    "idle" => i += 1,
                    _ => o += 1,
                }
            }
            format!("{a}/{i}/{o}/{}", g.nodes.len())
        }
        'E' | 'R' => {
            let reasons: Vec<&str> = g
                .nodes
                .iter()
                .filter(|n| n.drained)
                .map(|_| "drained")
                .collect();
            if reasons.is_empty() {
                "none".into()
            } else {
                reasons[0].into()
            }
        }
        _ => String::new(),
    }
}

pub fn sinfo_text(o: &SinfoOpts, nodes: &[NodeInfo]) -> anyhow::Result<String> {
    let fmt = o.format.clone().unwrap_or_else(|| {
        match (o.node_oriented, o.long, o.summarize) {
            (_, _, true) => "%#P %.5a %.10l %.15F %N",
            (true, true, _) => "%#N %.6D %#P %.11T %.20G %E",
            (true, false, _) => "%#N %.6D %#P %6t",
            (false, true, _) => "%#P %.5a %.10l %.6D %.11T %N",
            (false, false, _) => "%#P %.5a %.10l %.6D %.6t %N",
        }
        .to_string()
    });
    let pieces = parse_format("sinfo", &fmt, SINFO_FIELDS).map_err(anyhow::Error::msg)?;
    let mut nodes: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| n.state != MemberState::Left)
        .filter(|n| o.nodes.is_empty() || o.nodes.contains(&n.name))
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let groups: Vec<NodeGroup> = if o.node_oriented {
        nodes
            .into_iter()
            .map(|n| NodeGroup { nodes: vec![n] })
            .collect()
    } else if o.summarize {
        vec![NodeGroup { nodes }]
    } else {
        // One line per state, in order of first appearance.
        let mut groups: Vec<(String, NodeGroup)> = Vec::new();
        for n in nodes {
            let s = node_state(n).1;
            match groups.iter_mut().find(|(k, _)| *k == s) {
                Some((_, g)) => g.nodes.push(n),
                None => groups.push((s, NodeGroup { nodes: vec![n] })),
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    };
    let header: &dyn Fn(char) -> String = &sinfo_header;
    Ok(render(
        &pieces,
        &groups,
        (!o.noheader).then_some(header),
        &sinfo_field,
    ))
}

// ------------------------------------------------------------ sacct

#[derive(Debug, Default)]
pub struct SacctOpts {
    pub jobs: Vec<u64>,
    pub users: Vec<String>,
    pub accounts: Vec<String>,
    pub states: Vec<&'static str>,
    pub start: Option<i64>,
    pub end: Option<i64>,
    /// (field name as Slurm spells it, width)
    pub fields: Vec<(&'static str, usize)>,
    pub parsable: Option<bool>, // Some(true): trailing '|' (-p); Some(false): -P
    pub noheader: bool,
    pub json: bool,
}

/// sacct's fields: the name as Slurm spells it and its default width.
const SACCT_FIELDS: &[(&str, usize)] = &[
    ("JobID", 12),
    ("JobIDRaw", 12),
    ("JobName", 10),
    ("Partition", 10),
    ("Account", 10),
    ("User", 9),
    ("AllocCPUS", 10),
    ("State", 10),
    ("ExitCode", 8),
    ("Elapsed", 10),
    ("ElapsedRaw", 10),
    ("AllocTRES", 10),
    ("ReqTRES", 10),
    ("AllocNodes", 10),
    ("NNodes", 8),
    ("NodeList", 15),
    ("Submit", 19),
    ("Start", 19),
    ("End", 19),
    ("Timelimit", 10),
    ("Priority", 10),
    ("Reason", 20),
    ("Restarts", 8),
];

const SACCT_DEFAULT: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";
const SACCT_BRIEF: &str = "JobID,State,ExitCode";
const SACCT_LONG: &str = "JobID,JobName,Partition,Account,User,AllocCPUS,State,ExitCode,\
Elapsed,AllocTRES,NodeList,Submit,Start,End,Timelimit";

fn sacct_fields(list: &str) -> Result<Vec<(&'static str, usize)>, String> {
    list.split(',')
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (name, width) = match f.split_once('%') {
                Some((n, w)) => (
                    n,
                    Some(
                        w.parse::<usize>()
                            .map_err(|_| format!("sacct: bad width in '{f}'"))?,
                    ),
                ),
                None => (f, None),
            };
            let (canon, default) = SACCT_FIELDS
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .ok_or_else(|| format!("sacct: unsupported field '{name}'"))?;
            Ok((*canon, width.unwrap_or(*default)))
        })
        .collect()
}

pub fn parse_sacct(args: &[String], now: i64) -> Result<SacctOpts, String> {
    let mut o = SacctOpts::default();
    let mut format = None;
    let mut r = Reader::new("sacct", args);
    let when = |v: &str| parse_when(v, now).ok_or_else(|| format!("sacct: invalid time '{v}'"));
    while let Some((name, inline, shown)) = r.next_option()? {
        match name.as_str() {
            "j" | "jobs" => o.jobs.extend(ids("sacct", &r.value(inline, &shown)?)?),
            "u" | "user" => o.users.extend(list(&r.value(inline, &shown)?)),
            "A" | "account" | "accounts" => o.accounts.extend(list(&r.value(inline, &shown)?)),
            "s" | "state" => {
                for s in list(&r.value(inline, &shown)?) {
                    if let Some(c) = state_code("sacct", &s)? {
                        o.states.push(c);
                    }
                }
            }
            "S" | "starttime" => o.start = Some(when(&r.value(inline, &shown)?)?),
            "E" | "endtime" => o.end = Some(when(&r.value(inline, &shown)?)?),
            "o" | "format" => format = Some(r.value(inline, &shown)?),
            "b" | "brief" => {
                format = Some(SACCT_BRIEF.into());
                r.switch(inline, &shown);
            }
            "l" | "long" => {
                format = Some(SACCT_LONG.into());
                r.switch(inline, &shown);
            }
            "P" | "parsable2" => {
                o.parsable = Some(false);
                r.switch(inline, &shown);
            }
            "p" | "parsable" => {
                o.parsable = Some(true);
                r.switch(inline, &shown);
            }
            "n" | "noheader" => {
                o.noheader = true;
                r.switch(inline, &shown);
            }
            // No job steps: every record is the allocation.
            "X" | "allocations" | "a" | "allusers" | "v" | "verbose" => r.switch(inline, &shown),
            "r" | "partition" => {
                r.value(inline, &shown)?;
            }
            "json" => o.json = true,
            _ => return Err(r.unsupported(&shown)),
        }
    }
    o.fields = sacct_fields(format.as_deref().unwrap_or(SACCT_DEFAULT))?;
    Ok(o)
}

/// The jobs sacct reports: listed ones (any time unless -S/-E say), else
/// those active between -S (default: midnight UTC today) and -E (now).
pub fn sacct_select(o: &SacctOpts, jobs: Vec<JobInfo>) -> Vec<JobInfo> {
    let now = now_s();
    sacct_select_at(o, jobs, now)
}

pub fn sacct_select_at(o: &SacctOpts, mut jobs: Vec<JobInfo>, now: i64) -> Vec<JobInfo> {
    let start = o.start.unwrap_or(if o.jobs.is_empty() {
        now - now.rem_euclid(86_400)
    } else {
        i64::MIN
    });
    let end = o.end.unwrap_or(i64::MAX);
    jobs.retain(|j| {
        let submitted = parse_timestamp(&j.submitted_at).unwrap_or(0);
        let ended = j.ended_at.as_deref().and_then(parse_timestamp);
        (o.jobs.is_empty() || o.jobs.contains(&j.id))
            && (o.users.is_empty() || o.users.contains(&j.tenant))
            && (o.accounts.is_empty() || o.accounts.contains(&j.tenant))
            && (o.states.is_empty() || o.states.contains(&slurm_state(j).0))
            && submitted <= end
            && ended.is_none_or(|e| e >= start)
    });
    jobs.sort_by_key(|j| j.id);
    jobs
}

fn tres(j: &JobInfo, nodes: u32) -> String {
    let gpus = nodes * j.gpus_per_node;
    let cpus = nodes * j.cpus_per_task.unwrap_or(1);
    let mut parts = vec![
        format!("billing={gpus}"),
        format!("cpu={cpus}"),
        format!("gres/gpu={gpus}"),
    ];
    if let Some(m) = j.mem_bytes {
        parts.push(format!(
            "mem={}",
            super::jobs::format_mem(m.saturating_mul(u64::from(nodes)))
        ));
    }
    parts.push(format!("node={nodes}"));
    parts.join(",")
}

fn sacct_field(j: &JobInfo, field: &str, now: i64) -> String {
    let started = j.started_at.is_some();
    match field {
        "JobID" | "JobIDRaw" => j.id.to_string(),
        "JobName" => j.name.clone(),
        "Partition" => PARTITION.into(),
        "Account" | "User" => j.tenant.clone(),
        "AllocCPUS" => (j.nodes_requested * j.cpus_per_task.unwrap_or(1)).to_string(),
        "State" => slurm_state(j).1.into(),
        "ExitCode" => format!("{}:0", j.exit_code.unwrap_or(0)),
        "Elapsed" => format_elapsed(run_time(j, now)),
        "ElapsedRaw" => run_time(j, now).to_string(),
        "AllocTRES" if started => tres(j, j.nodes.len().max(1) as u32),
        "AllocTRES" => String::new(),
        "ReqTRES" => tres(j, j.nodes_requested),
        "AllocNodes" | "NNodes" if started => j.nodes.len().to_string(),
        "AllocNodes" => "0".into(),
        "NNodes" => j.nodes_requested.to_string(),
        "NodeList" if started && !j.nodes.is_empty() => j.nodes.join(","),
        "NodeList" => "None assigned".into(),
        "Submit" => opt_time(Some(&j.submitted_at), "Unknown"),
        "Start" => opt_time(j.started_at.as_deref(), "Unknown"),
        "End" => opt_time(j.ended_at.as_deref(), "Unknown"),
        "Timelimit" => format_elapsed(j.time_limit_s),
        "Priority" => j.priority.to_string(),
        "Reason" if j.reason.is_empty() => "None".into(),
        "Reason" => j.reason.clone(),
        "Restarts" => j.restarts.to_string(),
        _ => String::new(),
    }
}

pub fn sacct_text(o: &SacctOpts, jobs: &[JobInfo], now: i64) -> String {
    let mut out = String::new();
    match o.parsable {
        Some(trailing) => {
            let end = if trailing { "|" } else { "" };
            let row = |cells: Vec<String>| format!("{}{end}\n", cells.join("|"));
            if !o.noheader {
                out.push_str(&row(o.fields.iter().map(|(n, _)| n.to_string()).collect()));
            }
            for j in jobs {
                out.push_str(&row(o
                    .fields
                    .iter()
                    .map(|(n, _)| sacct_field(j, n, now))
                    .collect()));
            }
        }
        None => {
            // Fixed width, a value too long ends in '+'; JobID left-justified.
            let cell = |v: &str, name: &str, w: usize| {
                let v = if v.chars().count() > w {
                    let mut s: String = v.chars().take(w.saturating_sub(1)).collect();
                    s.push('+');
                    s
                } else {
                    v.to_string()
                };
                if name.starts_with("JobID") {
                    format!("{v:<w$} ")
                } else {
                    format!("{v:>w$} ")
                }
            };
            let line = |cells: String| format!("{}\n", cells.trim_end());
            if !o.noheader {
                out.push_str(&line(
                    o.fields.iter().map(|(n, w)| cell(n, n, *w)).collect(),
                ));
                out.push_str(&line(
                    o.fields
                        .iter()
                        .map(|(_, w)| format!("{} ", "-".repeat(*w)))
                        .collect(),
                ));
            }
            for j in jobs {
                out.push_str(&line(
                    o.fields
                        .iter()
                        .map(|(n, w)| cell(&sacct_field(j, n, now), n, *w))
                        .collect(),
                ));
            }
        }
    }
    out
}

// ------------------------------------------------------------ scontrol

/// What `scontrol ARGS` asks for.
#[derive(Debug, PartialEq)]
pub enum Scontrol {
    ShowJob(Option<u64>),
    ShowNode(Option<String>),
    ShowPartition,
    /// `update NodeName=N[,M] State=DRAIN|RESUME`: drain or return nodes.
    DrainNodes(Vec<String>, bool),
    /// `hold|release ID[,ID...]`.
    Hold(Vec<u64>, bool),
    /// `requeue ID[,ID...]`.
    Requeue(Vec<u64>),
    /// `update JobId=ID TimeLimit=T`: seconds.
    TimeLimit(u64, u64),
}

pub fn parse_scontrol(args: &[String]) -> Result<(Scontrol, bool), String> {
    let mut oneliner = false;
    let mut words = Vec::new();
    for a in args {
        match a.as_str() {
            "-o" | "--oneliner" => oneliner = true,
            "-d" | "--details" | "-a" | "--all" | "-v" | "--verbose" | "-Q" | "--quiet" => {}
            s if s.starts_with('-') => return Err(format!("scontrol: unsupported option '{s}'")),
            s => words.push(s.to_string()),
        }
    }
    let verb = words.first().map(|w| w.to_ascii_lowercase());
    let what = words.get(1).map(|w| w.to_ascii_lowercase());
    let target = words.get(2).cloned();
    let cmd = match (verb.as_deref(), what.as_deref()) {
        (Some("show"), Some("job" | "jobs")) => Scontrol::ShowJob(
            target
                .map(|t| {
                    t.parse()
                        .map_err(|_| format!("scontrol: invalid job id '{t}'"))
                })
                .transpose()?,
        ),
        (Some("show"), Some("node" | "nodes")) => Scontrol::ShowNode(target),
        (Some("show"), Some("partition" | "partitions")) => Scontrol::ShowPartition,
        (Some("show"), Some(other)) => {
            return Err(format!("scontrol: 'show {other}' is not supported"))
        }
        (Some("show"), None) => return Err("scontrol: show what? (job, node, partition)".into()),
        (Some("update"), _) => scontrol_update(&words[1..])?,
        (Some(verb @ ("hold" | "release" | "uhold" | "requeue")), _) => {
            let ids = words[1..]
                .iter()
                .flat_map(|w| w.split(','))
                .filter(|w| !w.is_empty())
                .map(|w| {
                    w.parse()
                        .map_err(|_| format!("scontrol: invalid job id '{w}'"))
                })
                .collect::<Result<Vec<u64>, String>>()?;
            if ids.is_empty() {
                return Err(format!("scontrol: {verb} needs a job id"));
            }
            match verb {
                "requeue" => Scontrol::Requeue(ids),
                _ => Scontrol::Hold(ids, verb != "release"),
            }
        }
        (Some(verb), _) => return Err(format!("scontrol: '{verb}' is not supported")),
        (None, _) => return Err("scontrol: give a command (show job ID, show node NAME)".into()),
    };
    Ok((cmd, oneliner))
}

/// `update NodeName=… State=DRAIN|RESUME|UNDRAIN [Reason=…]`, the one
/// update the API can make.
fn scontrol_update(words: &[String]) -> Result<Scontrol, String> {
    let mut nodes = None;
    let mut state = None;
    let mut job = None;
    let mut time_limit = None;
    for w in words {
        let Some((k, v)) = w.split_once('=') else {
            return Err(format!("scontrol: update: '{w}' is not KEY=VALUE"));
        };
        match k.to_ascii_lowercase().as_str() {
            "nodename" | "node" | "nodes" => nodes = Some(list(v)),
            "state" => state = Some(v.to_ascii_uppercase()),
            "reason" => {}
            "jobid" | "job" => {
                job = Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("scontrol: invalid job id '{v}'"))?,
                )
            }
            "timelimit" => {
                let limit = crate::cli::duration::parse_duration(v)
                    .map_err(|e| format!("scontrol: TimeLimit: {e}"))?
                    .as_secs();
                if limit == 0 {
                    return Err("scontrol: TimeLimit must be positive".into());
                }
                time_limit = Some(limit);
            }
            other => return Err(format!("scontrol: update of '{other}' is not supported")),
        }
    }
    match (job, time_limit) {
        (Some(_), _) if nodes.is_some() || state.is_some() => {
            return Err("scontrol: update either JobId=... or NodeName=..., not both".into())
        }
        (Some(id), Some(limit)) => return Ok(Scontrol::TimeLimit(id, limit)),
        (Some(_), None) => {
            return Err("scontrol: update JobId=... supports TimeLimit=... only".into())
        }
        (None, Some(_)) => return Err("scontrol: TimeLimit=... needs JobId=...".into()),
        (None, None) => {}
    }
    let nodes = nodes
        .filter(|n| !n.is_empty())
        .ok_or("scontrol: update needs NodeName=... State=DRAIN|RESUME")?;
    let drain = match state.as_deref() {
        Some("DRAIN") => true,
        Some("RESUME" | "UNDRAIN") => false,
        Some(other) => {
            return Err(format!(
                "scontrol: State={other} is not supported (use DRAIN or RESUME)"
            ))
        }
        None => return Err("scontrol: update needs State=DRAIN|RESUME".into()),
    };
    Ok(Scontrol::DrainNodes(nodes, drain))
}

/// The command a job runs, for one line: a batch script's copy is shown as
/// its name and arguments.
fn display_command(cmd: &[String]) -> String {
    match cmd.iter().rposition(|w| w.contains('\n')) {
        Some(i) if i + 1 < cmd.len() => cmd[i + 1..].join(" "),
        Some(_) => "(batch script)".into(),
        None => cmd.join(" "),
    }
}

/// `scontrol show job`: Slurm's key=value layout, one record per job
/// (records separated by a blank line; `oneliner`: one line each).
pub fn scontrol_job(j: &JobInfo, now: i64, oneliner: bool) -> String {
    let (_, long) = slurm_state(j);
    let reason = if j.state.is_waiting() && !j.reason.is_empty() {
        j.reason.clone()
    } else {
        "None".into()
    };
    let nodelist = if j.nodes.is_empty() || j.state.is_waiting() {
        "(null)".to_string()
    } else {
        j.nodes.join(",")
    };
    let lines = [
        format!("JobId={} JobName={}", j.id, j.name),
        format!("UserId={0} Account={0} Priority={1}", j.tenant, j.priority),
        format!("JobState={long} Reason={reason}"),
        format!(
            "Requeue={} Restarts={} BatchFlag=1 ExitCode={}:0",
            u8::from(j.preemptible),
            j.restarts,
            j.exit_code.unwrap_or(0)
        ),
        format!(
            "RunTime={} TimeLimit={}",
            format_elapsed(run_time(j, now)),
            format_elapsed(j.time_limit_s)
        ),
        format!(
            "SubmitTime={} StartTime={} EndTime={}",
            opt_time(Some(&j.submitted_at), "Unknown"),
            opt_time(j.started_at.as_deref(), "Unknown"),
            opt_time(j.ended_at.as_deref(), "Unknown")
        ),
        format!("Partition={PARTITION}"),
        format!(
            "ReqNodeList={} ExcNodeList={} OverSubscribe={}",
            j.nodelist.as_deref().unwrap_or("(null)"),
            j.exclude.as_deref().unwrap_or("(null)"),
            if j.exclusive { "NO" } else { "OK" }
        ),
        format!("NodeList={nodelist}"),
        format!(
            "NumNodes={} NumTasks={} CPUs/Task={}",
            j.nodes_requested,
            j.nodes_requested,
            j.cpus_per_task.unwrap_or(1)
        ),
        format!("ReqTRES={}", tres(j, j.nodes_requested)),
        format!(
            "AllocTRES={}",
            if j.started_at.is_some() && !j.nodes.is_empty() {
                tres(j, j.nodes.len() as u32)
            } else {
                "(null)".into()
            }
        ),
        format!("TresPerNode=gres/gpu:{}", j.gpus_per_node),
        format!(
            "MinMemoryNode={}",
            j.mem_bytes
                .map(super::jobs::format_mem)
                .unwrap_or_else(|| "0".into())
        ),
        format!("Command={}", display_command(&j.command)),
    ];
    if oneliner {
        format!("{}\n", lines.join(" "))
    } else {
        let mut out = lines[0].clone();
        for l in &lines[1..] {
            out.push_str("\n   ");
            out.push_str(l);
        }
        out.push_str("\n\n");
        out
    }
}

/// `scontrol show node`.
pub fn scontrol_node(n: &NodeInfo, oneliner: bool) -> String {
    let used = n.gpus_total.saturating_sub(n.gpus_free);
    let (_, long) = node_state(n);
    let state = if n.drained {
        let base = if used > 0 { "MIXED" } else { "IDLE" };
        format!("{base}+DRAIN")
    } else {
        long
    };
    let host = n.api_addr.rsplit_once(':').map_or("", |(h, _)| h);
    let features = n
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let lines = [
        format!(
            "NodeName={} NodeAddr={} NodeHostName={} Version={}",
            n.name,
            host,
            n.name,
            if n.version.is_empty() {
                "(null)"
            } else {
                &n.version
            }
        ),
        format!("State={state}"),
        format!("Gres={} GresUsed=gpu:{used}", gres(n)),
        format!(
            "CfgTRES=gres/gpu={} AllocTRES=gres/gpu={used}",
            n.gpus_total
        ),
        format!(
            "ActiveFeatures={}",
            if features.is_empty() {
                "(null)".to_string()
            } else {
                features
            }
        ),
        format!("Partitions={PARTITION}"),
        format!("Reason={}", if n.drained { "drained" } else { "(null)" }),
    ];
    if oneliner {
        format!("{}\n", lines.join(" "))
    } else {
        let mut out = lines[0].clone();
        for l in &lines[1..] {
            out.push_str("\n   ");
            out.push_str(l);
        }
        out.push_str("\n\n");
        out
    }
}

async fn scontrol(client: &Client, args: &[String]) -> anyhow::Result<()> {
    let (cmd, oneliner) = parse_scontrol(args).map_err(|e| usage_error(&e))?;
    let now = now_s();
    match cmd {
        Scontrol::ShowJob(Some(id)) => {
            let job = client.job(id).await.map_err(api)?;
            print!("{}", scontrol_job(&job, now, oneliner));
        }
        Scontrol::ShowJob(None) => {
            let mut jobs = client.jobs(None, None).await.map_err(api)?;
            jobs.sort_by_key(|j| j.id);
            for j in &jobs {
                print!("{}", scontrol_job(j, now, oneliner));
            }
        }
        Scontrol::ShowNode(name) => {
            let nodes = client.nodes().await.map_err(api)?;
            let picked: Vec<&NodeInfo> = nodes
                .iter()
                .filter(|n| name.as_ref().is_none_or(|x| *x == n.name))
                .collect();
            if picked.is_empty() {
                anyhow::bail!("scontrol: node '{}' not found", name.unwrap_or_default());
            }
            for n in picked {
                print!("{}", scontrol_node(n, oneliner));
            }
        }
        Scontrol::DrainNodes(nodes, drain) => {
            for n in &nodes {
                client.drain_node(n, drain).await.map_err(api)?;
            }
        }
        Scontrol::Requeue(ids) => {
            for id in ids {
                client.requeue_job(id).await.map_err(api)?;
            }
        }
        Scontrol::TimeLimit(id, limit) => {
            client.set_time_limit(id, limit).await.map_err(api)?;
        }
        Scontrol::Hold(ids, hold) => {
            for id in ids {
                let done = if hold {
                    client.hold_job(id).await
                } else {
                    client.release_job(id).await
                };
                done.map_err(api)?;
            }
        }
        Scontrol::ShowPartition => {
            let nodes = client.nodes().await.map_err(api)?;
            let names: Vec<&str> = nodes
                .iter()
                .filter(|n| n.state != MemberState::Left)
                .map(|n| n.name.as_str())
                .collect();
            let gpus: u32 = nodes.iter().map(|n| n.gpus_total).sum();
            print!(
                "PartitionName={PARTITION}\n   Default=YES State=UP MaxTime=UNLIMITED\n   \
                 Nodes={}\n   TotalNodes={} TRES=gres/gpu={gpus}\n\n",
                names.join(","),
                names.len()
            );
        }
    }
    Ok(())
}

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
