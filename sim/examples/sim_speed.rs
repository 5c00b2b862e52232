//! Replay speed on a synthetic trace:
//! `cargo run --release -j 1 -p shoal-sim --example sim_speed [-- JOBS NODES POLICY DRIVER]`
//! (default 100,000 jobs, 1,000 nodes of 8 GPUs, all three policies, the
//! direct driver; `ledger` for the other). Prints jobs per second and how
//! much of the wall time was spent inside the scheduler.

use std::time::Instant;

use shoal_sim::{parse_driver, run, synthetic_trace, Driver, Policy, SimConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let jobs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let nodes: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let policies: Vec<String> = args.get(2).map_or_else(
        || vec!["fifo".into(), "hdrf".into(), "hdrf-preempt".into()],
        |p| p.split(',').map(str::to_string).collect(),
    );
    let driver = args
        .get(3)
        .and_then(|name| parse_driver(name))
        .unwrap_or(Driver::Direct);
    let trace = synthetic_trace(jobs, 42);
    for name in policies {
        let policy: Policy = match name.parse() {
            Ok(policy) => policy,
            Err(error) => {
                eprintln!("{error}");
                continue;
            }
        };
        let config = SimConfig {
            driver,
            ..SimConfig::new(nodes, 8, policy)
        };
        let clock = Instant::now();
        let report = run(&trace, &config);
        let wall = clock.elapsed().as_secs_f64();
        println!(
            "{name:<13} {jobs} jobs on {nodes} nodes: {wall:.1} s wall, {:.0} jobs/s; {} passes, {:.1} s ({:.0}%) in schedule(), {:.2} ms/pass; util {:.3}, avg queue {:.0} s, avg jct {:.0} s",
            jobs as f64 / wall,
            report.scheduler_passes,
            report.scheduler_wall_s,
            100.0 * report.scheduler_wall_s / wall,
            1000.0 * report.scheduler_wall_s / report.scheduler_passes.max(1) as f64,
            report.gpu_utilization,
            report.avg_queue_s,
            report.avg_jct_s,
        );
    }
}
