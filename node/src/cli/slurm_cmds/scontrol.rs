//! `scontrol show job|node`, `hold`, `release`, `requeue` and `update`.

use super::*;

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
pub(super) fn scontrol_update(words: &[String]) -> Result<Scontrol, String> {
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
                let limit = shoal_sdk::units::parse_duration(v)
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
pub(super) fn display_command(cmd: &[String]) -> String {
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
                .map(crate::cli::jobs::format_mem)
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

pub(super) async fn scontrol(client: &Client, args: &[String]) -> anyhow::Result<()> {
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
