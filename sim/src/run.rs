//! Command-line front end. The `shoal sim` subcommand fills in
//! [`CliOptions`] from its own flags and calls [`execute`] and
//! [`summary_table`]; [`parse_args`] reads the same options from a plain
//! argument list, for a front end without a flag parser of its own:
//!
//! ```text
//! replay --trace PATH [--format auto|philly|alibaba|simple]
//!        [--policy fifo,hdrf,hdrf-preempt] [--nodes 96] [--gpus-per-node 8]
//!        [--racks R] [--zones Z] [--seed 0] [--fail-mtbf SECONDS]
//!        [--ckpt-interval SECONDS] [--gpu-model H100] [--driver direct|ledger]
//!        [--until-s SECONDS] [--json OUT.json] [--svg OUT.svg]
//! ```
//!
//! `--until-s` keeps only jobs submitted before that time, to replay a window
//! of a trace that is too long to replay whole in the time available.

use std::path::PathBuf;
use std::str::FromStr;

use thiserror::Error;

use shoal_consensus::sched::{Policy, UnknownPolicy};

use crate::config::{parse_driver, SimConfig};
use crate::engine::run;
use crate::metrics::SimReport;
use crate::plot::{write_svg, PlotError};
use crate::trace::{load_trace, Trace, TraceError, TraceFormat};

/// Parsed command line.
#[derive(Clone, Debug, PartialEq)]
pub struct CliOptions {
    pub trace: PathBuf,
    pub format: TraceFormat,
    pub policies: Vec<Policy>,
    /// Template; `policy` is replaced per run.
    pub config: SimConfig,
    /// Keep only jobs submitted before this many seconds.
    pub until_s: Option<u64>,
    pub json: Option<PathBuf>,
    pub svg: Option<PathBuf>,
}

#[derive(Debug, Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn number<T: FromStr>(flag: &str, value: &str) -> Result<T, CliError> {
    value
        .parse()
        .map_err(|_| CliError::Usage(format!("{flag} expects a number, got `{value}`")))
}

/// Parses arguments (without the program name).
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<CliOptions, CliError> {
    let mut trace = None;
    let mut format = TraceFormat::Auto;
    let mut policies = vec![Policy::Fifo, Policy::Hdrf, Policy::HdrfPreempt];
    let mut config = SimConfig::new(96, 8, Policy::Fifo);
    let mut racks = None;
    let mut zones = None;
    let mut until_s = None;
    let mut json = None;
    let mut svg = None;
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| CliError::Usage(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--trace" => trace = Some(PathBuf::from(value()?)),
            "--format" => format = value()?.parse().map_err(CliError::Usage)?,
            "--policy" => {
                policies = value()?
                    .split(',')
                    .map(|name| {
                        name.trim()
                            .parse()
                            .map_err(|error: UnknownPolicy| CliError::Usage(error.to_string()))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--nodes" => config.nodes = number(&flag, &value()?)?,
            "--gpus-per-node" => config.gpus_per_node = number(&flag, &value()?)?,
            "--racks" => racks = Some(number(&flag, &value()?)?),
            "--zones" => zones = Some(number(&flag, &value()?)?),
            "--seed" => config.seed = number(&flag, &value()?)?,
            "--fail-mtbf" => config.fail_mtbf_s = Some(number(&flag, &value()?)?),
            "--ckpt-interval" => config.ckpt_interval_s = Some(number(&flag, &value()?)?),
            "--gpu-model" => config.gpu_model = value()?,
            "--driver" => {
                let name = value()?;
                config.driver = parse_driver(&name).ok_or_else(|| {
                    CliError::Usage(format!("unknown driver `{name}` (direct|ledger)"))
                })?
            }
            "--until-s" => until_s = Some(number(&flag, &value()?)?),
            "--json" => json = Some(PathBuf::from(value()?)),
            "--svg" => svg = Some(PathBuf::from(value()?)),
            other => return Err(CliError::Usage(format!("unknown argument `{other}`"))),
        }
    }
    let defaults = SimConfig::new(config.nodes, config.gpus_per_node, Policy::Fifo);
    config.racks = racks.unwrap_or(defaults.racks);
    config.zones = zones.unwrap_or(defaults.zones);
    if config.nodes == 0 || config.gpus_per_node == 0 {
        return Err(CliError::Usage(
            "--nodes and --gpus-per-node must be positive".to_string(),
        ));
    }
    Ok(CliOptions {
        trace: trace.ok_or_else(|| CliError::Usage("--trace PATH is required".to_string()))?,
        format,
        policies,
        config,
        until_s,
        json,
        svg,
    })
}

/// Loads the trace, replays it under each policy, writes the outputs.
pub fn execute(options: &CliOptions) -> Result<(Trace, Vec<SimReport>), CliError> {
    let mut trace = load_trace(&options.trace, options.format)?;
    if let Some(until) = options.until_s {
        trace.jobs.retain(|job| job.submit_s < until);
    }
    let reports: Vec<SimReport> = options
        .policies
        .iter()
        .map(|&policy| {
            let config = SimConfig {
                policy,
                ..options.config.clone()
            };
            run(&trace.jobs, &config)
        })
        .collect();
    if let Some(path) = &options.json {
        let text = serde_json::to_string_pretty(&reports).unwrap_or_default();
        std::fs::write(path, text).map_err(|source| CliError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    if let Some(path) = &options.svg {
        write_svg(path, &reports)?;
    }
    Ok((trace, reports))
}

/// The headline metrics as a fixed-width table.
pub fn summary_table(reports: &[SimReport]) -> String {
    let mut table = format!(
        "{:<13} {:>7} {:>11} {:>11} {:>12} {:>11} {:>11} {:>6} {:>8} {:>6} {:>7} {:>5}\n",
        "policy",
        "jobs",
        "avg_jct_h",
        "p50_jct_h",
        "p99_jct_h",
        "avg_queue_h",
        "makespan_d",
        "util",
        "util_arr",
        "jain",
        "preempt",
        "rej"
    );
    for r in reports {
        table.push_str(&format!(
            "{:<13} {:>7} {:>11.2} {:>11.2} {:>12.1} {:>11.2} {:>11.1} {:>6.3} {:>8.3} {:>6.3} {:>7} {:>5}\n",
            r.policy,
            r.jobs,
            r.avg_jct_s / 3600.0,
            r.p50_jct_s / 3600.0,
            r.p99_jct_s / 3600.0,
            r.avg_queue_s / 3600.0,
            r.makespan_s / 86_400.0,
            r.gpu_utilization,
            r.gpu_utilization_while_arriving,
            r.jain_fairness,
            r.preemptions,
            r.rejected
        ));
    }
    table
}
