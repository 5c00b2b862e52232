//! Multi-call names: invoked as `salloc`, `sbatch`, `squeue`, `scancel`,
//! `sinfo` or `sacctmgr`, the binary translates the common Slurm flags into
//! the matching `shoal` command line. Pure: argv in, argv out.

/// The names the binary answers to besides `shoal`.
pub const NAMES: [&str; 7] = [
    "salloc", "sbatch", "squeue", "scancel", "sinfo", "sacctmgr", "ai-cp",
];

/// Slurm options that take a value, with the shoal flag they become (`None`:
/// accepted and ignored, with a warning).
const JOB_OPTIONS: &[(&str, Option<&str>, Option<&str>)] = &[
    // (long, short, shoal flag)
    ("nodes", Some("N"), Some("-N")),
    ("gres", None, Some("--gres")),
    ("gpus-per-node", None, Some("--gpus-per-node")),
    ("time", Some("t"), Some("--time")),
    ("job-name", Some("J"), Some("--name")),
    ("account", Some("A"), Some("--tenant")),
    ("priority", None, Some("--priority")),
    ("chdir", Some("D"), Some("--chdir")),
    ("partition", Some("p"), None),
    ("qos", Some("q"), None),
    ("output", Some("o"), None),
    ("error", Some("e"), None),
    ("ntasks-per-node", None, None),
    ("cpus-per-task", Some("c"), Some("--cpus-per-task")),
    ("mem", None, Some("--mem")),
    ("export", None, None),
    ("mail-type", None, None),
    ("mail-user", None, None),
    ("signal", None, None),
];

/// Flags without a value that Slurm scripts commonly carry.
const JOB_SWITCHES: &[(&str, Option<&str>)] = &[
    ("exclusive", None),
    ("requeue", None),
    ("no-requeue", None),
    ("parsable", None),
];

pub struct Translation {
    pub argv: Vec<String>,
    pub warnings: Vec<String>,
}

/// `program` is the basename the binary was invoked as; `args` excludes it.
pub fn translate(program: &str, args: &[String]) -> Result<Translation, String> {
    let mut warnings = Vec::new();
    let argv = match program {
        "sbatch" => sbatch(args, &mut warnings)?,
        "salloc" => {
            let (mut flags, rest, _) = job_flags(program, args, &mut warnings)?;
            let mut argv = vec!["shoal".to_string(), "alloc".to_string()];
            argv.append(&mut flags);
            if !rest.is_empty() {
                argv.push("--".into());
                argv.extend(rest);
            }
            argv
        }
        "squeue" => squeue(args)?,
        "scancel" => {
            let ids: Vec<String> = args
                .iter()
                .filter(|a| !a.starts_with('-'))
                .flat_map(|a| a.split(',').map(str::to_string).collect::<Vec<_>>())
                .collect();
            if ids.is_empty() {
                return Err("scancel: no job id given".into());
            }
            let mut argv = vec!["shoal".to_string(), "cancel".to_string()];
            argv.extend(ids);
            argv
        }
        "sinfo" => {
            let mut argv = vec!["shoal".to_string(), "nodes".to_string()];
            if args.iter().any(|a| a == "--json") {
                argv.push("--json".into());
            }
            argv
        }
        "sacctmgr" => sacctmgr(args)?,
        "ai-cp" => ai_cp(args)?,
        other => {
            return Err(format!(
                "'{other}' is not a Slurm command this binary emulates"
            ))
        }
    };
    Ok(Translation { argv, warnings })
}

/// Splits job options from the positional command; returns shoal flags, the
/// command, and whether `--parsable` was given.
fn job_flags(
    program: &str,
    args: &[String],
    warnings: &mut Vec<String>,
) -> Result<(Vec<String>, Vec<String>, bool), String> {
    let mut flags = Vec::new();
    let mut parsable = false;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            return Ok((flags, args[i + 1..].to_vec(), parsable));
        }
        if !arg.starts_with('-') || arg == "-" {
            return Ok((flags, args[i..].to_vec(), parsable));
        }
        let (name, inline) = split_option(arg);
        if let Some((long, _)) = JOB_SWITCHES.iter().find(|(l, _)| *l == name) {
            if *long == "parsable" {
                parsable = true;
            } else {
                warnings.push(format!("{program}: ignoring --{long}"));
            }
            i += 1;
            continue;
        }
        if name == "wrap" {
            let value = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    args.get(i).cloned().ok_or("--wrap needs a command")?
                }
            };
            return Ok((flags, vec!["/bin/sh".into(), "-c".into(), value], parsable));
        }
        let option = JOB_OPTIONS
            .iter()
            .find(|(long, short, _)| name == *long || Some(name.as_str()) == *short);
        let Some((long, _, shoal)) = option else {
            return Err(format!("{program}: unsupported option '{arg}'"));
        };
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                args.get(i)
                    .cloned()
                    .ok_or_else(|| format!("{program}: --{long} needs a value"))?
            }
        };
        match shoal {
            Some("--gpus-per-node") if value.contains(':') => {
                // --gpus-per-node=H100:8
                flags.push("--gres".into());
                flags.push(format!("gpu:{value}"));
            }
            Some(flag) => {
                flags.push((*flag).to_string());
                flags.push(value);
            }
            None => warnings.push(format!("{program}: ignoring --{long}={value}")),
        }
        i += 1;
    }
    Ok((flags, Vec::new(), parsable))
}

/// `--name=value`, `--name value`, `-N4`, `-N 4`.
fn split_option(arg: &str) -> (String, Option<String>) {
    if let Some(long) = arg.strip_prefix("--") {
        return match long.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (long.to_string(), None),
        };
    }
    let short = &arg[1..];
    let mut chars = short.chars();
    match chars.next() {
        Some(c) => {
            let rest: String = chars.collect();
            let rest = rest.strip_prefix('=').map(str::to_string).unwrap_or(rest);
            (c.to_string(), (!rest.is_empty()).then_some(rest))
        }
        None => (String::new(), None),
    }
}

fn sbatch(args: &[String], warnings: &mut Vec<String>) -> Result<Vec<String>, String> {
    let (mut flags, command, parsable) = job_flags("sbatch", args, warnings)?;
    if command.is_empty() {
        return Err("sbatch: a batch script (or --wrap) is required".into());
    }
    // #SBATCH lines in the script come first, so the command line overrides them.
    let mut directives = Vec::new();
    if let Ok(text) = std::fs::read_to_string(&command[0]) {
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("#SBATCH") {
                directives.extend(rest.split_whitespace().map(str::to_string));
            } else if !line.is_empty() && !line.starts_with('#') {
                break;
            }
        }
    }
    let (mut script_flags, _, script_parsable) = job_flags("sbatch", &directives, warnings)?;
    let mut argv = vec!["shoal".to_string(), "submit".to_string()];
    argv.append(&mut script_flags);
    argv.append(&mut flags);
    if !(parsable || script_parsable) {
        argv.push("--banner".into());
    }
    argv.push("--".into());
    let script = &command[0];
    if std::path::Path::new(script).is_file() && !script.contains('/') {
        argv.push(format!("./{script}"));
    } else {
        argv.push(script.clone());
    }
    argv.extend(command[1..].iter().cloned());
    Ok(argv)
}

fn squeue(args: &[String]) -> Result<Vec<String>, String> {
    let mut argv = vec!["shoal".to_string(), "queue".to_string()];
    let mut i = 0;
    while i < args.len() {
        let (name, inline) = split_option(&args[i]);
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| format!("squeue: {} needs a value", args[i - 1]))
                }
            }
        };
        match name.as_str() {
            "j" | "jobs" => {
                let v = value()?;
                argv.push("-j".into());
                argv.push(v.split(',').next().unwrap_or_default().to_string());
            }
            "A" | "account" => {
                let v = value()?;
                argv.push("--tenant".into());
                argv.push(v);
            }
            "t" | "states" => {
                let v = value()?;
                argv.push("--state".into());
                argv.push(slurm_state(&v)?);
            }
            "u" | "user" | "p" | "partition" | "o" | "format" => {
                value()?;
            }
            "json" => argv.push("--json".into()),
            "a" | "all" | "h" | "noheader" | "l" | "long" => {}
            _ => return Err(format!("squeue: unsupported option '{}'", args[i])),
        }
        i += 1;
    }
    Ok(argv)
}

/// `ai-cp [--replica N | --replicaN] [-r] SRC... DST`, where paths under
/// `/shared/` are mesh paths.
fn ai_cp(args: &[String]) -> Result<Vec<String>, String> {
    let mut argv = vec!["shoal".to_string(), "cp".to_string()];
    let mut paths = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        match arg {
            "-r" | "-R" | "--recursive" => argv.push("-r".into()),
            "-f" | "--force" => argv.push("--force".into()),
            "--json" => argv.push("--json".into()),
            "--replica" => {
                i += 1;
                let n = args.get(i).ok_or("ai-cp: --replica needs a number")?;
                argv.extend(["--replica".to_string(), n.clone()]);
            }
            other if other.starts_with("--replica") => {
                let n = other
                    .trim_start_matches("--replica")
                    .trim_start_matches('=');
                n.parse::<u32>()
                    .map_err(|_| format!("ai-cp: bad replica count in '{other}'"))?;
                argv.extend(["--replica".to_string(), n.to_string()]);
            }
            other if other.starts_with('-') => {
                return Err(format!("ai-cp: unsupported option '{other}'"))
            }
            path => paths.push(match path.strip_prefix("/shared") {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                    format!("mesh:{}", if rest.is_empty() { "/" } else { rest })
                }
                _ => path.to_string(),
            }),
        }
        i += 1;
    }
    if paths.len() < 2 {
        return Err("ai-cp: give one or more sources and a destination".into());
    }
    argv.extend(paths);
    Ok(argv)
}

fn slurm_state(s: &str) -> Result<String, String> {
    let state = match s.to_ascii_uppercase().as_str() {
        "PD" | "PENDING" => "pending",
        "R" | "RUNNING" => "running",
        "CD" | "COMPLETED" => "completed",
        "F" | "FAILED" | "TO" | "TIMEOUT" | "NF" | "NODE_FAIL" => "failed",
        "CA" | "CANCELLED" => "cancelled",
        "PR" | "PREEMPTED" => "preempted",
        "RQ" | "REQUEUED" => "requeued",
        _ => return Err(format!("squeue: unknown state '{s}'")),
    };
    Ok(state.into())
}

fn sacctmgr(args: &[String]) -> Result<Vec<String>, String> {
    let words: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| {
            !matches!(
                *a,
                "-i" | "--immediate" | "-n" | "--noheader" | "-P" | "--parsable2"
            )
        })
        .collect();
    let json = words.contains(&"--json");
    let words: Vec<&str> = words.into_iter().filter(|w| *w != "--json").collect();
    let (verb, entity) = match (words.first(), words.get(1)) {
        (Some(v), Some(e)) => (v.to_ascii_lowercase(), e.to_ascii_lowercase()),
        _ => {
            return Err("sacctmgr: use 'sacctmgr create group NAME [GrpTRES=accelerator=N]'".into())
        }
    };
    let mut argv = vec!["shoal".to_string()];
    match verb.as_str() {
        "show" | "list" => {
            if entity.starts_with("assoc") {
                argv.push("quota".into());
            } else {
                argv.extend(["tenant".to_string(), "ls".to_string()]);
            }
            if json {
                argv.push("--json".into());
            }
            return Ok(argv);
        }
        "add" | "create" | "modify" | "update" => {}
        other => return Err(format!("sacctmgr: '{other}' is not supported")),
    }
    if !matches!(entity.as_str(), "account" | "group" | "tenant") {
        return Err(format!(
            "sacctmgr: '{entity}' is not supported (use account or group)"
        ));
    }
    let mut name = None;
    let mut flags = Vec::new();
    for word in &words[2..] {
        if word.eq_ignore_ascii_case("set") || word.eq_ignore_ascii_case("where") {
            continue;
        }
        let Some((key, value)) = word.split_once('=') else {
            if name.is_none() {
                name = Some(word.to_string());
                continue;
            }
            return Err(format!("sacctmgr: unexpected '{word}'"));
        };
        match key.to_ascii_lowercase().as_str() {
            "name" | "names" => name = Some(value.to_string()),
            "parent" => flags.extend(["--parent".to_string(), value.to_string()]),
            "fairshare" | "share" => flags.extend(["--weight".to_string(), value.to_string()]),
            "grptres" => {
                let n = gpu_tres(value)?;
                flags.extend(["--max-gpus".to_string(), n]);
            }
            "grptresmins" => {
                let n = gpu_tres(value)?;
                let hours = match n.as_str() {
                    "none" => n,
                    minutes => {
                        let m: f64 = minutes
                            .parse()
                            .map_err(|_| format!("sacctmgr: bad GrpTRESMins '{value}'"))?;
                        format!("{}", m / 60.0)
                    }
                };
                flags.extend(["--gpu-hours".to_string(), hours]);
            }
            other => return Err(format!("sacctmgr: '{other}' is not supported")),
        }
    }
    let name = name.ok_or("sacctmgr: a name is required")?;
    let action = if matches!(verb.as_str(), "add" | "create") {
        "create"
    } else {
        "set"
    };
    argv.extend(["tenant".to_string(), action.to_string(), name]);
    argv.extend(flags);
    if json {
        argv.push("--json".into());
    }
    Ok(argv)
}

/// The GPU count in a TRES list such as `cpu=10,gres/gpu=8` or
/// `accelerator=800`; `-1` means no limit.
fn gpu_tres(value: &str) -> Result<String, String> {
    for item in value.split(',') {
        if let Some((kind, n)) = item.split_once('=') {
            if matches!(
                kind,
                "gres/gpu" | "gpu" | "accelerator" | "gres/accelerator"
            ) {
                return Ok(if n == "-1" {
                    "none".into()
                } else {
                    n.to_string()
                });
            }
        }
    }
    Err(format!(
        "sacctmgr: no GPU count in '{value}' (use accelerator=N or gres/gpu=N)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(program: &str, args: &str) -> Vec<String> {
        let args: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        translate(program, &args).expect("translates").argv
    }

    #[test]
    fn salloc_with_gres_and_time() {
        assert_eq!(
            t("salloc", "-N 32 --gres=accelerator:8 -t 72:00:00"),
            [
                "shoal",
                "alloc",
                "-N",
                "32",
                "--gres",
                "accelerator:8",
                "--time",
                "72:00:00"
            ]
        );
        assert_eq!(
            t("salloc", "-N2 --gpus-per-node=H100:4 -A vision python x.py"),
            [
                "shoal",
                "alloc",
                "-N",
                "2",
                "--gres",
                "gpu:H100:4",
                "--tenant",
                "vision",
                "--",
                "python",
                "x.py"
            ]
        );
    }

    #[test]
    fn memory_and_cpus_per_task_pass_through() {
        assert_eq!(
            t("sbatch", "--mem=16G -c 4 --wrap true"),
            [
                "shoal",
                "submit",
                "--mem",
                "16G",
                "--cpus-per-task",
                "4",
                "--banner",
                "--",
                "/bin/sh",
                "-c",
                "true"
            ]
        );
        let args: Vec<String> = "--mem 512 --cpus-per-task=2 -- x"
            .split_whitespace()
            .map(String::from)
            .collect();
        let out = translate("salloc", &args).expect("translates");
        assert!(out.warnings.is_empty(), "{:?}", out.warnings);
        assert_eq!(
            out.argv,
            [
                "shoal",
                "alloc",
                "--mem",
                "512",
                "--cpus-per-task",
                "2",
                "--",
                "x"
            ]
        );
    }

    #[test]
    fn sbatch_reads_directives_and_prints_the_banner() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("job.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --time=10\necho hi\n",
        )
        .expect("write");
        let path = script.display().to_string();
        let argv = t("sbatch", &format!("-t 20 {path} a"));
        assert_eq!(
            argv,
            [
                "shoal", "submit", "-N", "2", "--time", "10", "--time", "20", "--banner", "--",
                &path, "a"
            ]
        );
        let parsable = t("sbatch", "--parsable --wrap=hostname");
        assert_eq!(
            parsable,
            ["shoal", "submit", "--", "/bin/sh", "-c", "hostname"]
        );
    }

    #[test]
    fn squeue_scancel_sinfo() {
        assert_eq!(t("squeue", "-j 42"), ["shoal", "queue", "-j", "42"]);
        assert_eq!(
            t("squeue", "-t PD -A vision --json"),
            ["shoal", "queue", "--state", "pending", "--tenant", "vision", "--json"]
        );
        assert_eq!(t("scancel", "4 5,6"), ["shoal", "cancel", "4", "5", "6"]);
        assert_eq!(t("sinfo", ""), ["shoal", "nodes"]);
    }

    #[test]
    fn sacctmgr_groups() {
        assert_eq!(
            t("sacctmgr", "create group vision"),
            ["shoal", "tenant", "create", "vision"]
        );
        assert_eq!(
            t(
                "sacctmgr",
                "modify group vision set GrpTRES=accelerator=800"
            ),
            ["shoal", "tenant", "set", "vision", "--max-gpus", "800"]
        );
        assert_eq!(
            t(
                "sacctmgr",
                "-i add account nlp parent=research fairshare=2 GrpTRESMins=gres/gpu=600"
            ),
            [
                "shoal",
                "tenant",
                "create",
                "nlp",
                "--parent",
                "research",
                "--weight",
                "2",
                "--gpu-hours",
                "10"
            ]
        );
        assert_eq!(t("sacctmgr", "show assoc"), ["shoal", "quota"]);
        assert!(translate("sacctmgr", &["delete".into(), "account".into()]).is_err());
    }

    #[test]
    fn ai_cp_maps_shared_paths_to_the_mesh() {
        assert_eq!(
            t("ai-cp", "--replica3 -r /important/data /shared/secure/"),
            [
                "shoal",
                "cp",
                "--replica",
                "3",
                "-r",
                "/important/data",
                "mesh:/secure/"
            ]
        );
        assert_eq!(
            t("ai-cp", "--replica 2 /shared/a.bin ./a.bin"),
            ["shoal", "cp", "--replica", "2", "mesh:/a.bin", "./a.bin"]
        );
    }

    #[test]
    fn unknown_options_are_refused() {
        assert!(translate("sbatch", &["--bogus".into(), "x.sh".into()]).is_err());
        let tr = translate("sbatch", &["-p".into(), "gpu".into(), "x.sh".into()]).expect("ok");
        assert_eq!(tr.warnings.len(), 1);
    }
}
