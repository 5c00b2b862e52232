//! `shoal sim`: a trace replayed through the scheduler, in process.

use super::*;

#[derive(Args, Debug)]
pub(super) struct SimArgs {
    /// A trace file, or a directory of trace files replayed together (one tenant per file)
    #[arg(long)]
    pub(super) trace: PathBuf,
    /// auto, philly, alibaba or simple (submit_time,gpus,duration,tenant,status)
    #[arg(long, default_value = "auto")]
    pub(super) format: String,
    /// One policy or a comma-separated list: fifo, hdrf, hdrf-preempt
    #[arg(long, default_value = "hdrf")]
    pub(super) policy: String,
    #[arg(long, default_value_t = 96)]
    pub(super) nodes: u32,
    #[arg(long, default_value_t = 8)]
    pub(super) gpus_per_node: u32,
    #[arg(long)]
    pub(super) racks: Option<u32>,
    #[arg(long)]
    pub(super) zones: Option<u32>,
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    /// Mean time between failures of one node, e.g. 24h (enables failure injection)
    #[arg(long)]
    pub(super) fail_mtbf: Option<String>,
    /// Checkpoint interval of every job, e.g. 30m
    #[arg(long)]
    pub(super) ckpt_interval: Option<String>,
    /// Replay only jobs submitted before this point of the trace, e.g. 30d or 720h
    #[arg(long)]
    pub(super) until: Option<String>,
    /// Write an SVG with utilization over time and the JCT CDF, policy against policy
    #[arg(long)]
    pub(super) plot: Option<PathBuf>,
    /// direct (the simulator applies plans itself) or ledger (jobs live in a
    /// real consensus ledger and every decision is a ledger command)
    #[arg(long)]
    pub(super) driver: Option<String>,
}

pub(super) fn run_sim(args: &SimArgs, json: bool) -> anyhow::Result<()> {
    use shoal_sim::run::{execute, summary_table, CliOptions};
    use shoal_sim::{Policy, SimConfig};
    let secs = |flag: &str, v: &Option<String>| -> anyhow::Result<Option<u64>> {
        v.as_deref()
            .map(|s| {
                shoal_sdk::units::parse_duration(s)
                    .map(|d| d.as_secs())
                    .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
            })
            .transpose()
    };
    let policies = args
        .policy
        .split(',')
        .map(|p| p.trim().parse())
        .collect::<Result<Vec<Policy>, _>>()?;
    if args.nodes == 0 || args.gpus_per_node == 0 {
        anyhow::bail!("--nodes and --gpus-per-node must be positive");
    }
    let mut config = SimConfig::new(args.nodes, args.gpus_per_node, policies[0]);
    if let Some(r) = args.racks {
        config.racks = r;
    }
    if let Some(z) = args.zones {
        config.zones = z;
    }
    config.seed = args.seed;
    config.fail_mtbf_s = secs("--fail-mtbf", &args.fail_mtbf)?;
    config.ckpt_interval_s = secs("--ckpt-interval", &args.ckpt_interval)?;
    if let Some(name) = &args.driver {
        config.driver = shoal_sim::parse_driver(name)
            .ok_or_else(|| anyhow::anyhow!("unknown driver '{name}': use direct or ledger"))?;
    }
    let options = CliOptions {
        trace: args.trace.clone(),
        format: args.format.parse().map_err(anyhow::Error::msg)?,
        policies,
        config,
        until_s: secs("--until", &args.until)?,
        json: None,
        svg: args.plot.clone(),
    };
    let (trace, reports) = execute(&options)?;
    if json {
        if reports.len() == 1 {
            print_json(&reports[0])
        } else {
            print_json(&reports)
        }
    } else {
        println!(
            "{} jobs replayed ({} skipped) on {} nodes x {} GPUs",
            trace.jobs.len(),
            trace.skipped.values().sum::<usize>(),
            args.nodes,
            args.gpus_per_node
        );
        print!("{}", summary_table(&reports));
        Ok(())
    }
}
