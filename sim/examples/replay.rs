//! `shoal sim` without the rest of the binary, for profiling the replay:
//! `cargo run --release -p shoal-sim --example replay -- --trace PATH [flags]`
//! takes the flags of [`shoal_sim::run::parse_args`] (`--until-s`, not
//! `--until`) and prints the summary table and the wall time per policy.

use std::time::Instant;

use shoal_sim::run::{execute, parse_args, summary_table, CliOptions};

fn main() {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(2);
        }
    };
    // One policy at a time, so that each gets its own wall time.
    for &policy in &options.policies {
        let single = CliOptions {
            policies: vec![policy],
            json: options
                .json
                .as_ref()
                .map(|path| path.with_extension(format!("{policy}.json"))),
            ..options.clone()
        };
        let clock = Instant::now();
        match execute(&single) {
            Ok((_, reports)) => {
                let wall = clock.elapsed().as_secs_f64();
                print!("{}", summary_table(&reports));
                for report in &reports {
                    println!(
                        "{policy}: {wall:.2} s wall, {} passes, {:.2} s in schedule()",
                        report.scheduler_passes, report.scheduler_wall_s
                    );
                }
            }
            Err(error) => {
                eprintln!("{error}");
                std::process::exit(1);
            }
        }
    }
}
