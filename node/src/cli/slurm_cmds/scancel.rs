//! `scancel`: jobs selected by id, name, user, state or partition, cancelled or signalled.

use super::*;

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

pub(super) async fn scancel(client: &Client, args: &[String]) -> anyhow::Result<()> {
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
