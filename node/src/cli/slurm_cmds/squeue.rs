//! `squeue`: the queue in Slurm's columns.

use super::*;

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
pub(super) const SQUEUE_FIELDS: &str = "iAjuaTtMlLDRrNbPQSVe";

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

pub(super) fn squeue_header(kind: char) -> String {
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

pub(super) fn squeue_field(j: &JobInfo, kind: char, now: i64) -> String {
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
