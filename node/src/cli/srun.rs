//! `srun`: inside a job's rank (a batch script's `srun python train.py`) it
//! starts this node's tasks (`shoal exec-tasks`); since a batch script runs
//! once on every node of the gang, the nodes' `srun`s together are Slurm's
//! one step of one process per task. Outside a job it submits one, streams
//! its output and ends with its exit code (`salloc … srun` in one).

use super::slurm::{job_options_taking_values, Refusal};
use std::collections::BTreeMap;

/// srun's own switches, without a value.
const SWITCHES: &[(&str, Option<&str>)] = &[
    ("label", Some("l")),
    ("unbuffered", Some("u")),
    ("kill-on-bad-exit", Some("K")),
    ("quiet", Some("Q")),
    ("verbose", Some("v")),
];

/// srun's own options with a value that change nothing here: accepted with a
/// warning.
const IGNORED: &[&str] = &["mpi", "cpu-bind", "cpu_bind", "distribution", "m"];

/// What `srun` was asked, split from the job options.
#[derive(Debug, Default, PartialEq)]
struct Srun {
    label: bool,
    /// Job options, for `shoal submit` (outside a job) or the step's layout.
    job: Vec<String>,
    command: Vec<String>,
}

fn split(args: &[String], warnings: &mut Vec<String>) -> Result<Srun, Refusal> {
    let mut out = Srun::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            out.command = args[i + 1..].to_vec();
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            out.command = args[i..].to_vec();
            break;
        }
        let long = arg.starts_with("--");
        let (name, inline) = super::slurm::split_option(arg);
        let is = |(l, s): &(&str, Option<&str>)| {
            if long {
                name == *l
            } else {
                Some(name.as_str()) == *s
            }
        };
        if let Some((switch, _)) = SWITCHES.iter().find(|o| is(o)) {
            if *switch == "label" {
                out.label = true;
            } else if !matches!(*switch, "kill-on-bad-exit" | "quiet") {
                warnings.push(format!("srun: ignoring --{switch}"));
            }
            i += 1;
            continue;
        }
        if IGNORED.contains(&name.as_str()) {
            let value = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    args.get(i).cloned().unwrap_or_default()
                }
            };
            warnings.push(format!(
                "srun: ignoring {arg}{}",
                if value.is_empty() {
                    String::new()
                } else {
                    format!(" {value}")
                }
            ));
            i += 1;
            continue;
        }
        // A job option: keep it, with its value when it takes one.
        out.job.push(arg.clone());
        if inline.is_none() && job_options_taking_values(&name, long) {
            i += 1;
            match args.get(i) {
                Some(v) => out.job.push(v.clone()),
                None => return Err(format!("srun: {arg} needs a value").into()),
            }
        }
        i += 1;
    }
    if out.command.is_empty() {
        return Err("srun: no command to run".into());
    }
    Ok(out)
}

/// Inside a rank: the options that shape the step on this node.
fn step_tasks(
    job: &[String],
    env: &BTreeMap<String, String>,
    warnings: &mut Vec<String>,
) -> Result<Option<u32>, Refusal> {
    let nodes: u32 = env
        .get("GROUP_WORLD_SIZE")
        .and_then(|v| v.parse().ok())
        .ok_or("srun: GROUP_WORLD_SIZE is not set in this job's environment")?;
    let mut per_node: Option<u32> = None;
    let mut i = 0;
    while i < job.len() {
        let (name, inline) = super::slurm::split_option(&job[i]);
        let value = match inline {
            Some(v) => Some(v),
            None if job_options_taking_values(&name, job[i].starts_with("--")) => {
                i += 1;
                job.get(i).cloned()
            }
            None => None,
        };
        i += 1;
        let number = |v: &Option<String>| -> Result<u32, Refusal> {
            v.as_deref()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("srun: --{name} needs a positive count").into())
        };
        match name.as_str() {
            "n" | "ntasks" => {
                let n = number(&value)?;
                if !n.is_multiple_of(nodes) {
                    return Err(format!(
                        "srun: --ntasks={n} does not divide evenly over the job's {nodes} node(s)"
                    )
                    .into());
                }
                per_node = Some(n / nodes);
            }
            "ntasks-per-node" => per_node = Some(number(&value)?),
            "N" | "nodes" => {
                let n = number(&value)?;
                if n != nodes {
                    return Err(format!(
                        "srun: --nodes={n}: a step runs on all of the job's {nodes} node(s)"
                    )
                    .into());
                }
            }
            other => warnings.push(format!(
                "srun: ignoring --{other} inside a job (the step runs in the job's allocation)"
            )),
        }
    }
    Ok(per_node)
}

/// `srun ARGS` as run here: with this process's environment.
pub fn translate_here(args: &[String]) -> Result<super::slurm::Translation, Refusal> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let mut warnings = Vec::new();
    let argv = translate(args, &env, &mut warnings)?;
    Ok(super::slurm::Translation { argv, warnings })
}

/// The `shoal` command line `srun ARGS` becomes, given the caller's
/// environment (`SHOAL_JOB_ID` and `GROUP_RANK` set: inside a rank).
pub fn translate(
    args: &[String],
    env: &BTreeMap<String, String>,
    warnings: &mut Vec<String>,
) -> Result<Vec<String>, Refusal> {
    let s = split(args, warnings)?;
    let inside = env.contains_key("SHOAL_JOB_ID") && env.contains_key("GROUP_RANK");
    let mut argv = vec!["shoal".to_string()];
    if inside {
        argv.push("exec-tasks".into());
        if s.label {
            argv.push("--label".into());
        }
        if let Some(n) = step_tasks(&s.job, env, warnings)? {
            argv.extend(["--ntasks-per-node".to_string(), n.to_string()]);
        }
    } else {
        let mut o = super::slurm::job_options("srun", &s.job, warnings)?;
        argv.push("submit".into());
        argv.append(&mut o);
        argv.push("--attach".into());
        if s.label {
            argv.push("--label".into());
        }
    }
    argv.push("--".into());
    argv.extend(s.command);
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn rank_env() -> BTreeMap<String, String> {
        [
            ("SHOAL_JOB_ID", "4"),
            ("GROUP_RANK", "1"),
            ("GROUP_WORLD_SIZE", "2"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn inside_a_rank_srun_starts_the_node_tasks() {
        let mut w = Vec::new();
        let argv = translate(
            &words("-l -n 4 --mpi=pmix python train.py --lr 1"),
            &rank_env(),
            &mut w,
        )
        .expect("translates");
        assert_eq!(
            argv,
            words("shoal exec-tasks --label --ntasks-per-node 2 -- python train.py --lr 1")
        );
        assert_eq!(w.len(), 1, "{w:?}");
        let argv = translate(&words("hostname"), &rank_env(), &mut w).expect("translates");
        assert_eq!(argv, words("shoal exec-tasks -- hostname"));
        for bad in ["-n 3 x", "-N 3 x", "-l", "--ntasks-per-node=0 x"] {
            assert!(
                translate(&words(bad), &rank_env(), &mut w).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn outside_a_job_srun_submits_and_attaches() {
        let mut w = Vec::new();
        let argv = translate(
            &words("-N 2 --ntasks-per-node=2 -t 5 -l hostname"),
            &BTreeMap::new(),
            &mut w,
        )
        .expect("translates");
        assert_eq!(
            argv,
            words("shoal submit -N 2 --ntasks-per-node 2 --time 5 --attach --label -- hostname")
        );
        assert!(translate(&words("--frob x"), &BTreeMap::new(), &mut w).is_err());
    }
}
