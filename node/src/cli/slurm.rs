//! Multi-call names: invoked as `salloc`, `sbatch`, `squeue`, `scancel`,
//! `sinfo`, `sacct`, `scontrol`, `sacctmgr` or `ai-cp`, the binary takes
//! that command's flags. `salloc`, `sbatch`, `sacctmgr` and `ai-cp` become
//! the matching `shoal` command line (argv in, argv out; sbatch reads its
//! script); the others are their own commands (`shoal slurm NAME -- ARGS`,
//! in `slurm_cmds`), which list jobs and nodes through the API and print
//! Slurm's layouts.

/// The names the binary answers to besides `shoal`.
pub const NAMES: [&str; 10] = [
    "salloc", "sbatch", "srun", "squeue", "scancel", "sinfo", "sacct", "scontrol", "sacctmgr",
    "ai-cp",
];

/// The names that run as their own command (`shoal slurm NAME -- ARGS`).
pub const NATIVE: [&str; 5] = ["squeue", "scancel", "sinfo", "sacct", "scontrol"];

pub struct Translation {
    pub argv: Vec<String>,
    pub warnings: Vec<String>,
}

/// Why a command line was not translated, and the exit code: 2 for bad
/// usage, 1 otherwise (an unreadable batch script).
#[derive(Debug)]
pub struct Refusal {
    pub message: String,
    pub code: i32,
}

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Refusal { message, code: 2 }
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

/// `program` is the basename the binary was invoked as; `args` excludes it.
pub fn translate(program: &str, args: &[String]) -> Result<Translation, Refusal> {
    let mut warnings = Vec::new();
    let argv = match program {
        "sbatch" => sbatch(args, &mut warnings)?,
        "salloc" => {
            let o = job_flags(program, args, &mut warnings)?;
            if o.wrap.is_some() {
                return Err("salloc: --wrap is an sbatch option".into());
            }
            let mut argv = vec!["shoal".to_string(), "alloc".to_string()];
            argv.extend(o.flags);
            if !o.command.is_empty() {
                argv.push("--".into());
                argv.extend(o.command);
            }
            argv
        }
        name if NATIVE.contains(&name) => {
            let mut argv = vec![
                "shoal".to_string(),
                "slurm".to_string(),
                name.to_string(),
                "--".to_string(),
            ];
            argv.extend(args.iter().cloned());
            argv
        }
        "sacctmgr" => sacctmgr(args)?,
        "ai-cp" => ai_cp(args)?,
        other => {
            return Err(format!("'{other}' is not a Slurm command this binary emulates").into())
        }
    };
    Ok(Translation { argv, warnings })
}

/// Slurm options that take a value, with the shoal flag they become (`None`:
/// accepted and ignored, with a warning: they change nothing a job could
/// notice on shoal, which has one partition and no mail or QOS).
const JOB_OPTIONS: &[(&str, Option<&str>, Option<&str>)] = &[
    // (long, short, shoal flag)
    ("nodes", Some("N"), Some("-N")),
    ("gres", None, Some("--gres")),
    ("gpus-per-node", None, Some("--gpus-per-node")),
    ("gpus-per-task", None, Some("--gpus-per-task")),
    ("gpus", Some("G"), Some("--gpus")),
    ("ntasks", Some("n"), Some("--ntasks")),
    ("ntasks-per-node", None, Some("--ntasks-per-node")),
    ("nodelist", Some("w"), Some("--nodelist")),
    ("exclude", Some("x"), Some("--exclude")),
    ("dependency", Some("d"), Some("--dependency")),
    ("array", Some("a"), Some("--array")),
    ("signal", None, Some("--signal")),
    ("time", Some("t"), Some("--time")),
    ("job-name", Some("J"), Some("--name")),
    ("account", Some("A"), Some("--tenant")),
    ("priority", None, Some("--priority")),
    ("chdir", Some("D"), Some("--chdir")),
    ("cpus-per-task", Some("c"), Some("--cpus-per-task")),
    ("mem", None, Some("--mem")),
    ("partition", Some("p"), None),
    ("qos", Some("q"), None),
    ("export", None, None),
    ("mail-type", None, None),
    ("mail-user", None, None),
    ("comment", None, None),
];

/// Flags without a value that are accepted with a warning.
const IGNORED_SWITCHES: &[&str] = &["quiet", "verbose"];

/// Flags without a value that become the shoal flag of the same name.
/// Anything not in the tables above is refused with one `error:` line
/// naming the option, never ignored.
const SWITCHES: &[&str] = &["exclusive", "hold", "test-only"];

/// What `job_flags` found besides the shoal flags.
#[derive(Debug, Default)]
struct JobOptions {
    flags: Vec<String>,
    command: Vec<String>,
    parsable: bool,
    wait: bool,
    name: Option<String>,
    output: Option<String>,
    error: Option<String>,
    append: bool,
    wrap: Option<String>,
    /// `--requeue` / `--no-requeue`.
    requeue: Option<bool>,
}

impl JobOptions {
    /// `later` (the command line) over `self` (the script's directives).
    fn then(mut self, later: JobOptions) -> JobOptions {
        self.flags.extend(later.flags);
        self.command = later.command;
        self.parsable |= later.parsable;
        self.wait |= later.wait;
        self.name = later.name.or(self.name);
        self.output = later.output.or(self.output);
        self.error = later.error.or(self.error);
        self.append |= later.append;
        self.wrap = later.wrap.or(self.wrap);
        self.requeue = later.requeue.or(self.requeue);
        self
    }
}

/// Whether the job option `name` (long when `long`) takes a value.
pub(crate) fn job_options_taking_values(name: &str, long: bool) -> bool {
    let long_name = match name {
        "o" if !long => "output",
        "e" if !long => "error",
        other => other,
    };
    matches!(long_name, "output" | "error" | "open-mode" | "wrap")
        || JOB_OPTIONS.iter().any(|(l, short, _)| {
            if long {
                name == *l
            } else {
                Some(name) == *short
            }
        })
}

/// The shoal flags of job options alone (no command among them).
pub(crate) fn job_options(
    program: &str,
    args: &[String],
    warnings: &mut Vec<String>,
) -> Result<Vec<String>, String> {
    let o = job_flags(program, args, warnings)?;
    if let Some(extra) = o.command.first() {
        return Err(format!("{program}: unexpected '{extra}'"));
    }
    Ok(o.flags)
}

/// Splits job options from the positional command.
fn job_flags(
    program: &str,
    args: &[String],
    warnings: &mut Vec<String>,
) -> Result<JobOptions, String> {
    let mut o = JobOptions::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            o.command = args[i + 1..].to_vec();
            return Ok(o);
        }
        if !arg.starts_with('-') || arg == "-" {
            o.command = args[i..].to_vec();
            return Ok(o);
        }
        let (name, inline) = split_option(arg);
        let shown = if arg.starts_with("--") {
            format!("--{name}")
        } else {
            format!("-{name}")
        };
        let long = match name.as_str() {
            "W" => "wait",
            "H" => "hold",
            "a" => "array",
            "o" => "output",
            "e" => "error",
            "n" => "ntasks",
            "G" => "gpus",
            "Q" => "quiet",
            "v" => "verbose",
            other => other,
        };
        match long {
            "parsable" if program == "sbatch" => {
                o.parsable = true;
                i += 1;
                continue;
            }
            "wait" if program == "sbatch" => {
                o.wait = true;
                i += 1;
                continue;
            }
            "requeue" | "no-requeue" if program == "sbatch" => {
                o.requeue = Some(long == "requeue");
                i += 1;
                continue;
            }
            s if SWITCHES.contains(&s) && inline.is_none() => {
                o.flags.push(format!("--{s}"));
                i += 1;
                continue;
            }
            s if IGNORED_SWITCHES.contains(&s) => {
                warnings.push(format!("{program}: ignoring --{s}"));
                i += 1;
                continue;
            }
            _ => {}
        }
        let known = long == "wrap"
            || (program == "sbatch" && matches!(long, "output" | "error" | "open-mode"))
            || JOB_OPTIONS
                .iter()
                .any(|(l, short, _)| long == *l || Some(name.as_str()) == *short);
        if !known {
            return Err(format!("{program}: unsupported option '{shown}'"));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                args.get(i)
                    .cloned()
                    .ok_or_else(|| format!("{program}: {shown} needs a value"))?
            }
        };
        i += 1;
        match long {
            "wrap" => {
                o.wrap = Some(value);
                continue;
            }
            "output" => {
                o.output = Some(value);
                continue;
            }
            "error" => {
                o.error = Some(value);
                continue;
            }
            "open-mode" => {
                o.append = match value.as_str() {
                    "append" => true,
                    "truncate" => false,
                    _ => return Err(format!("{program}: --open-mode is append or truncate")),
                };
                continue;
            }
            "export" => {
                for item in value.split(',').filter(|i| !i.is_empty()) {
                    match item.split_once('=') {
                        Some((k, _)) if !k.is_empty() => {
                            o.flags.push("--env".into());
                            o.flags.push(item.to_string());
                        }
                        _ if matches!(
                            item.to_ascii_uppercase().as_str(),
                            "ALL" | "NONE" | "NIL"
                        ) =>
                        {
                            warnings.push(format!(
                                "{program}: ignoring --export={item}: jobs start with a clean \
                                 environment (PATH, HOME, USER, the gang's variables)"
                            ));
                        }
                        // A name alone: that variable of the submitting environment.
                        _ => match std::env::var(item) {
                            Ok(v) => {
                                o.flags.push("--env".into());
                                o.flags.push(format!("{item}={v}"));
                            }
                            Err(_) => warnings.push(format!(
                                "{program}: --export: {item} is not set here; not passed on"
                            )),
                        },
                    }
                }
                continue;
            }
            _ => {}
        }
        let Some((long, _, shoal)) = JOB_OPTIONS
            .iter()
            .find(|(l, short, _)| long == *l || Some(name.as_str()) == *short)
        else {
            return Err(format!("{program}: unsupported option '{shown}'"));
        };
        match shoal {
            Some("--gpus-per-node") if value.contains(':') => {
                // --gpus-per-node=H100:8
                o.flags.push("--gres".into());
                o.flags.push(format!("gpu:{value}"));
            }
            Some("--name") => {
                o.name = Some(value.clone());
                o.flags.push("--name".into());
                o.flags.push(value);
            }
            Some(flag) => {
                o.flags.push((*flag).to_string());
                o.flags.push(value);
            }
            None => warnings.push(format!("{program}: ignoring --{long}={value}")),
        }
    }
    Ok(o)
}

/// `--name=value`, `--name value`, `-N4`, `-N 4`.
pub(crate) fn split_option(arg: &str) -> (String, Option<String>) {
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

/// Splits a line into words the way a POSIX shell would for a simple
/// command: blanks separate words; single quotes keep everything literally;
/// double quotes keep blanks and let a backslash escape `"`, `\`, `$` and
/// `` ` ``; a backslash outside quotes escapes the next character; a `#`
/// that starts a word (outside quotes) begins a comment up to the end.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '#' if !in_word => break,
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some('\n') => {}
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("unterminated double quote".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(c) = chars.next() {
                    word.push(c);
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// The words of a batch script's `#SBATCH` directives, with Slurm's rules:
/// directives (`#SBATCH` at the start of a line) are read until the first
/// line that is neither blank nor a comment; each is split like a shell line (quotes honoured, a `#` after a
/// blank starts a comment). Errors name the line.
pub fn directives(script: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    for (n, raw) in script.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        // Only at the very start of a line, as Slurm reads it; an indented
        // `#SBATCH` is a comment.
        if let Some(rest) = raw.strip_prefix("#SBATCH") {
            if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
                continue; // e.g. #SBATCHX: a comment
            }
            let split = split_words(rest).map_err(|e| format!("sbatch: line {}: {e}", n + 1))?;
            words.extend(split);
        } else if !line.starts_with('#') {
            break;
        }
    }
    Ok(words)
}

/// The interpreter named by a script's `#!` line (`/bin/sh` without one).
pub fn interpreter(script: &str) -> Vec<String> {
    script
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!"))
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|w| !w.is_empty())
        .unwrap_or_else(|| vec!["/bin/sh".to_string()])
}

/// The command that runs `content` (a copy of the script taken at submit)
/// as `script` with `args`: a shell interpreter takes it with `-c` (so `$0`
/// is the script's name and `$1`… its arguments); any other interpreter
/// gets it in a private temporary file that it is `exec`ed from, like
/// Slurm's copy of the script.
pub fn script_command(content: &str, script: &str, args: &[String]) -> Vec<String> {
    let interp = interpreter(content);
    let is_shell = |w: &str| {
        matches!(
            w.rsplit('/').next().unwrap_or(w),
            "sh" | "bash" | "dash" | "zsh" | "ksh" | "mksh" | "ash"
        )
    };
    let shell = match interp.as_slice() {
        [one, ..] if is_shell(one) => true,
        [env, two, ..] if env.ends_with("/env") && is_shell(two) => true,
        _ => false,
    };
    let mut argv = Vec::new();
    if shell {
        argv.extend(interp);
        argv.push("-c".into());
        argv.push(content.to_string());
        argv.push(script.to_string());
    } else {
        argv.extend([
            "/bin/sh".to_string(),
            "-c".to_string(),
            "f=$(mktemp \"${TMPDIR:-/tmp}/shoal-batch.XXXXXX\") && printf '%s' \"$0\" >\"$f\" \
             && chmod 700 \"$f\" && exec \"$f\" \"$@\""
                .to_string(),
            content.to_string(),
        ]);
    }
    argv.extend(args.iter().cloned());
    argv
}

/// A shell word for `pattern` (an sbatch `-o`/`-e` file name) with Slurm's
/// replacements: `%j`/`%J`/`%A` the job id, `%x` the job name, `%u` the
/// user, `%N` the node, `%n`/`%t` the node rank, `%%` a `%`.
pub fn output_path(pattern: &str, name: &str) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let mut out = String::new();
    let mut literal = String::new();
    let mut chars = pattern.chars();
    let flush = |literal: &mut String, out: &mut String| {
        if !literal.is_empty() {
            out.push_str(&quote(literal));
            literal.clear();
        }
    };
    while let Some(c) = chars.next() {
        if c != '%' {
            literal.push(c);
            continue;
        }
        let var = match chars.next() {
            Some('j' | 'J') => "\"$SHOAL_JOB_ID\"",
            Some('A') => "\"${SLURM_ARRAY_JOB_ID:-$SHOAL_JOB_ID}\"",
            Some('a') => "\"${SLURM_ARRAY_TASK_ID:-4294967294}\"",
            Some('u') => "\"$USER\"",
            Some('N') => "\"$SHOAL_NODE\"",
            Some('n' | 't') => "\"$NODE_RANK\"",
            Some('x') => {
                literal.push_str(name);
                continue;
            }
            Some(other) => {
                if other != '%' {
                    literal.push('%');
                }
                literal.push(other);
                continue;
            }
            None => {
                literal.push('%');
                continue;
            }
        };
        flush(&mut literal, &mut out);
        out.push_str(var);
    }
    flush(&mut literal, &mut out);
    if out.is_empty() {
        out.push_str("''");
    }
    out
}

/// Slurm's variables a batch script reads, from the gang's, unless the
/// node already sets them.
const SLURM_ENV: &str = "export SLURM_JOB_ID=\"${SLURM_JOB_ID:-$SHOAL_JOB_ID}\" \
SLURM_JOBID=\"${SLURM_JOBID:-$SHOAL_JOB_ID}\" \
SLURM_NNODES=\"${SLURM_NNODES:-$WORLD_SIZE}\" \
SLURM_JOB_NUM_NODES=\"${SLURM_JOB_NUM_NODES:-$WORLD_SIZE}\" \
SLURM_NTASKS=\"${SLURM_NTASKS:-$WORLD_SIZE}\" \
SLURM_NODEID=\"${SLURM_NODEID:-$NODE_RANK}\" \
SLURM_PROCID=\"${SLURM_PROCID:-$NODE_RANK}\" \
SLURM_LOCALID=\"${SLURM_LOCALID:-0}\"; \
if [ -n \"${SLURM_ARRAY_TASK_ID:-}\" ]; then \
export SLURM_ARRAY_JOB_ID=\"${SLURM_ARRAY_JOB_ID:-$SHOAL_JOB_ID}\"; fi";

/// `inner` under a small `/bin/sh` prelude: Slurm's variables, then its
/// stdout (and stderr) sent to the `-o`/`-e` files.
fn wrapped(
    inner: Vec<String>,
    output: Option<&str>,
    error: Option<&str>,
    append: bool,
    name: &str,
) -> Vec<String> {
    let op = if append { ">>" } else { ">" };
    let redirect = match (output, error) {
        (None, None) => String::new(),
        (Some(o), None) => format!("exec {op}{} 2>&1 && ", output_path(o, name)),
        (Some(o), Some(e)) if o == e => format!("exec {op}{} 2>&1 && ", output_path(o, name)),
        (Some(o), Some(e)) => format!(
            "exec {op}{} 2{op}{} && ",
            output_path(o, name),
            output_path(e, name)
        ),
        (None, Some(e)) => format!("exec 2{op}{} && ", output_path(e, name)),
    };
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        format!("{SLURM_ENV}; {redirect}exec \"$@\""),
        "sbatch".to_string(),
    ];
    argv.extend(inner);
    argv
}

/// Reads the batch script: the named file, else (no script named) stdin
/// when it is not a terminal.
fn read_script(path: Option<&str>) -> Result<String, Refusal> {
    match path {
        Some(p) => std::fs::read_to_string(p).map_err(|e| Refusal {
            message: format!("sbatch: cannot read batch script '{p}': {e}"),
            code: 1,
        }),
        None => {
            use std::io::{IsTerminal, Read};
            let mut text = String::new();
            if !std::io::stdin().is_terminal() {
                let _ = std::io::stdin().read_to_string(&mut text);
            }
            if text.trim().is_empty() {
                return Err("sbatch: a batch script (or --wrap) is required"
                    .to_string()
                    .into());
            }
            Ok(text)
        }
    }
}

fn sbatch(args: &[String], warnings: &mut Vec<String>) -> Result<Vec<String>, Refusal> {
    let cli = job_flags("sbatch", args, warnings)?;
    let (content, script, script_args) = match &cli.wrap {
        Some(wrap) => (
            format!("#!/bin/sh\n{wrap}\n"),
            "wrap".to_string(),
            Vec::new(),
        ),
        None => {
            let path = cli.command.first().map(String::as_str);
            let content = read_script(path)?;
            let name = path.unwrap_or("sbatch").to_string();
            (content, name, cli.command.iter().skip(1).cloned().collect())
        }
    };
    // #SBATCH lines in the script come first, so the command line overrides them.
    let words = directives(&content)?;
    let from_script = job_flags("sbatch", &words, warnings)?;
    if let Some(extra) = from_script.command.first() {
        return Err(format!("sbatch: unexpected '{extra}' in an #SBATCH line").into());
    }
    if from_script.wrap.is_some() {
        return Err("sbatch: --wrap cannot be an #SBATCH directive"
            .to_string()
            .into());
    }
    let command_line_command = cli.command.clone();
    let wrap = cli.wrap.is_some();
    let o = from_script.then(cli);
    if wrap && !command_line_command.is_empty() {
        return Err("sbatch: give a batch script or --wrap, not both"
            .to_string()
            .into());
    }
    let default_name = if wrap {
        "wrap".to_string()
    } else {
        std::path::Path::new(&script)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("sbatch")
            .to_string()
    };
    let name = o.name.clone().unwrap_or_else(|| default_name.clone());
    let mut argv = vec!["shoal".to_string(), "submit".to_string()];
    if o.name.is_none() {
        argv.extend(["--name".to_string(), default_name]);
    }
    // Slurm's fixed variables; an --export of the same name wins.
    let mut env = vec![
        format!("SLURM_JOB_NAME={name}"),
        format!("SLURM_JOB_PARTITION={}", crate::cli::slurm_cmds::PARTITION),
    ];
    if let Ok(dir) = std::env::current_dir() {
        env.push(format!("SLURM_SUBMIT_DIR={}", dir.display()));
    }
    for e in env {
        argv.extend(["--env".to_string(), e]);
    }
    argv.extend(o.flags.iter().cloned());
    // The script runs once per node; its `srun` starts the node's tasks.
    argv.push("--batch".into());
    if !o.parsable {
        argv.push("--banner".into());
    }
    if o.wait {
        argv.push("--wait".into());
    }
    // Slurm runs a batch script once: a script that fails is FAILED, not
    // run again. Without --requeue nothing restarts it; with it, shoal's
    // --requeue restarts it after a rank failure or a lost node (shoal's
    // default count).
    if o.requeue == Some(true) {
        argv.push("--requeue".into());
    } else {
        argv.extend(["--max-restarts".to_string(), "0".to_string()]);
    }
    argv.push("--".into());
    let inner = if wrap {
        vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            o.wrap.clone().unwrap_or_default(),
        ]
    } else {
        script_command(&content, &script, &script_args)
    };
    argv.extend(wrapped(
        inner,
        o.output.as_deref(),
        o.error.as_deref(),
        o.append,
        &name,
    ));
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
    if entity == "user" || entity == "users" {
        return sacctmgr_user(&verb, &words[2..], json);
    }
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

/// `sacctmgr list|show user`, `add|create user NAME account=TENANT`,
/// `delete|remove user NAME` as `shoal user ls|add|rm`.
fn sacctmgr_user(verb: &str, words: &[&str], json: bool) -> Result<Vec<String>, String> {
    let mut name = None;
    let mut account = None;
    for word in words {
        if word.eq_ignore_ascii_case("where") || word.eq_ignore_ascii_case("set") {
            continue;
        }
        match word.split_once('=') {
            Some((k, v)) => match k.to_ascii_lowercase().as_str() {
                "name" | "names" | "user" | "users" => name = Some(v.to_string()),
                "account" | "accounts" | "defaultaccount" => account = Some(v.to_string()),
                other => return Err(format!("sacctmgr: user '{other}' is not supported")),
            },
            None if name.is_none() => name = Some(word.to_string()),
            None => return Err(format!("sacctmgr: unexpected '{word}'")),
        }
    }
    let mut argv = vec!["shoal".to_string(), "user".to_string()];
    match verb {
        "show" | "list" => argv.push("ls".into()),
        "add" | "create" => {
            let name = name.ok_or("sacctmgr: add user needs a name")?;
            let account = account.ok_or("sacctmgr: add user needs account=TENANT")?;
            argv.extend(["add".to_string(), name, "--tenant".to_string(), account]);
        }
        "delete" | "remove" => {
            let name = name.ok_or("sacctmgr: delete user needs a name")?;
            argv.extend(["rm".to_string(), name]);
        }
        other => return Err(format!("sacctmgr: '{other} user' is not supported")),
    }
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
mod tests;
