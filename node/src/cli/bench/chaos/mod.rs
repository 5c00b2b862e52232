//! `shoal bench chaos`: seeded fault schedules against whole in-process
//! clusters, each judged by the history and ledger checkers of the
//! `shoal_chaos` crate. Prints per seed the faults, the operations and any
//! violation with the command that replays it. See docs/reliability.md.
//!
//! - [`cluster`]: the nodes, each on a runtime of its own (crash, pause, clock);
//! - [`disks`]: a file system per node, for disk-full faults;
//! - [`workload`]: the register and job clients, recording the history;
//! - [`observe`]: invariants and digests at every index every node applies;
//! - [`panics`]: panics of the nodes' threads;
//! - [`ports`]: ports leased so that concurrent runs never share one;
//! - [`restore_check`]: committed checkpoints restore byte for byte;
//! - [`objects`]: `mesh:/` puts and removes, and their check;
//! - [`run`]: one seed from start to verdict.

pub mod cluster;
pub mod disks;
pub mod objects;
pub mod observe;
pub mod panics;
pub mod ports;
pub mod restore_check;
pub mod run;
pub mod workload;

use self::run::{RunOptions, SeedReport};
use crate::faults::chaos_hooks::PlantedBug;
use serde::Serialize;
use shoal_chaos::schedule::FaultKind;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct ChaosArgs {
    pub seeds: Vec<u64>,
    pub nodes: usize,
    pub duration: Duration,
    pub kinds: BTreeSet<FaultKind>,
    pub planted: BTreeSet<PlantedBug>,
    pub verbose: bool,
}

#[derive(Serialize, Debug)]
pub struct ChaosSummary {
    pub seeds: usize,
    pub passed: usize,
    pub failed_seeds: Vec<u64>,
    pub harness_errors: Vec<u64>,
    pub faults: BTreeMap<FaultKind, u32>,
    pub register_ops: u64,
    pub jobs_submitted: u64,
    pub entries_applied: u64,
    /// Committed checkpoint steps restored byte for byte after healing.
    pub checkpoint_steps_restored: u64,
    pub wall_s: f64,
    pub reports: Vec<SeedReport>,
}

/// Parses `--kinds partition,crash,...` (`all` for every kind the
/// in-process cluster can inject).
pub fn parse_kinds(text: &str) -> Result<BTreeSet<FaultKind>, String> {
    if text == "all" {
        return Ok(run::default_kinds());
    }
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            FaultKind::parse(s).ok_or_else(|| {
                let known: Vec<&str> = FaultKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown fault kind '{s}' (known: {})", known.join(", "))
            })
        })
        .collect()
}

pub fn parse_planted(text: &str) -> Result<PlantedBug, String> {
    PlantedBug::parse(text).ok_or_else(|| {
        let known: Vec<&str> = PlantedBug::ALL.iter().map(|b| b.as_str()).collect();
        format!("unknown planted bug '{text}' (known: {})", known.join(", "))
    })
}

pub async fn run_seeds(args: &ChaosArgs, json: bool) -> ChaosSummary {
    let started = std::time::Instant::now();
    let mut reports = Vec::new();
    for &seed in &args.seeds {
        let mut opts = RunOptions::new(seed, args.nodes, args.duration);
        opts.kinds = args.kinds.clone();
        opts.planted = args.planted.clone();
        let report = run::run_seed(&opts).await;
        if !json {
            print_seed(&report, args.verbose);
        }
        reports.push(report);
    }
    let mut faults = BTreeMap::new();
    for r in &reports {
        for (k, n) in &r.fault_counts {
            *faults.entry(*k).or_insert(0) += n;
        }
    }
    ChaosSummary {
        seeds: reports.len(),
        passed: reports.iter().filter(|r| r.passed()).count(),
        failed_seeds: reports
            .iter()
            .filter(|r| !r.violations.is_empty())
            .map(|r| r.seed)
            .collect(),
        harness_errors: reports
            .iter()
            .filter(|r| r.error.is_some())
            .map(|r| r.seed)
            .collect(),
        faults,
        register_ops: reports
            .iter()
            .map(|r| {
                u64::from(
                    r.ops.writes_ok
                        + r.ops.writes_failed
                        + r.ops.writes_unknown
                        + r.ops.reads_ok
                        + r.ops.reads_failed,
                )
            })
            .sum(),
        jobs_submitted: reports
            .iter()
            .map(|r| u64::from(r.ops.jobs_submitted))
            .sum(),
        entries_applied: reports.iter().map(|r| r.ops.entries_applied).sum(),
        checkpoint_steps_restored: reports
            .iter()
            .map(|r| u64::from(r.ops.checkpoints.steps_checked))
            .sum(),
        wall_s: started.elapsed().as_secs_f64(),
        reports,
    }
}

fn print_seed(r: &SeedReport, verbose: bool) {
    let verdict = match (&r.error, r.violations.is_empty()) {
        (Some(_), _) => "ERROR",
        (None, true) => "ok",
        (None, false) => "VIOLATION",
    };
    let kinds: Vec<String> = r
        .fault_counts
        .iter()
        .map(|(k, n)| format!("{}×{n}", k.as_str()))
        .collect();
    println!(
        "seed {:>6}  {verdict:<9}  {:>5.1} s  faults {:>2} [{}]  writes {}/{}/{} (ok/failed/unknown)  reads {}  jobs {}  beats {}  entries {}  restored steps {}  objects {}/{}",
        r.seed,
        r.wall_ms as f64 / 1000.0,
        r.faults.len(),
        kinds.join(" "),
        r.ops.writes_ok,
        r.ops.writes_failed,
        r.ops.writes_unknown,
        r.ops.reads_ok,
        r.ops.jobs_submitted,
        r.ops.rank_beats,
        r.ops.entries_applied,
        r.ops.checkpoints.steps_checked,
        r.ops.objects.puts_acked + r.ops.objects.removes_acked,
        r.ops.objects.verified,
    );
    if verbose || !r.passed() {
        for f in &r.faults {
            println!("    {f}");
        }
    }
    for f in &r.skipped_faults {
        println!("    skipped (cluster not whole yet): {f}");
    }
    if let Some(e) = &r.error {
        println!("    harness error: {e}");
    }
    for v in &r.violations {
        println!("    {v}");
    }
    if !r.passed() {
        println!("    replay: {}", r.replay());
    }
}

pub fn print_summary(s: &ChaosSummary) {
    let faults: Vec<String> = s
        .faults
        .iter()
        .map(|(k, n)| format!("{} {n}", k.as_str()))
        .collect();
    println!(
        "\n{} seeds in {:.0} s: {} passed, {} with violations {:?}, {} harness errors {:?}",
        s.seeds,
        s.wall_s,
        s.passed,
        s.failed_seeds.len(),
        s.failed_seeds,
        s.harness_errors.len(),
        s.harness_errors
    );
    println!(
        "faults: {}; register operations {}; jobs submitted {}; entries applied (all nodes) {}; checkpoint steps restored {}",
        faults.join(", "),
        s.register_ops,
        s.jobs_submitted,
        s.entries_applied,
        s.checkpoint_steps_restored
    );
}

/// `--dry-run`: each seed's schedule, as the run would play it.
pub fn print_schedules(args: &ChaosArgs, json: bool) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for &seed in &args.seeds {
        let mut opts = RunOptions::new(seed, args.nodes, args.duration);
        opts.kinds = args.kinds.clone();
        let steps = opts.schedule();
        if json {
            all.push(serde_json::json!({ "seed": seed, "steps": steps }));
            continue;
        }
        let kinds: Vec<&str> = shoal_chaos::schedule::count_by_kind(&steps)
            .keys()
            .map(|k| k.as_str())
            .collect();
        println!("seed {seed}: {}", kinds.join(" "));
        for step in &steps {
            if let shoal_chaos::schedule::Action::Start { fault, .. } = &step.action {
                println!("    {:>6} ms {fault}", step.at_ms);
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(())
}
