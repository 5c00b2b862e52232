//! `sacct`: finished and running jobs, in Slurm's accounting fields.

use super::*;

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
pub(super) const SACCT_FIELDS: &[(&str, usize)] = &[
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

pub(super) const SACCT_DEFAULT: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";
pub(super) const SACCT_BRIEF: &str = "JobID,State,ExitCode";
pub(super) const SACCT_LONG: &str =
    "JobID,JobName,Partition,Account,User,AllocCPUS,State,ExitCode,\
Elapsed,AllocTRES,NodeList,Submit,Start,End,Timelimit";

pub(super) fn sacct_fields(list: &str) -> Result<Vec<(&'static str, usize)>, String> {
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

pub(super) fn tres(j: &JobInfo, nodes: u32) -> String {
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
            crate::cli::jobs::format_mem(m.saturating_mul(u64::from(nodes)))
        ));
    }
    parts.push(format!("node={nodes}"));
    parts.join(",")
}

pub(super) fn sacct_field(j: &JobInfo, field: &str, now: i64) -> String {
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
