//! Chaos runs in CI: a small fixed set of seeds, each a seeded fault
//! schedule against a 3-node in-process cluster with a recorded workload,
//! judged by the history and ledger checkers. A failure names the seed;
//! `shoal bench chaos --seed S` replays it. The long runs are in
//! docs/BENCHMARKS.md; the checkers themselves are tested in the
//! `shoal-chaos` crate, and here against planted bugs, since a checker
//! that cannot fail proves nothing.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use shoal_chaos::schedule::FaultKind;
use shoal_node::cli::bench::chaos::run::{default_kinds, run_seed, RunOptions, SeedReport};
use shoal_node::faults::chaos_hooks::PlantedBug;
use std::collections::BTreeSet;
use std::time::Duration;

/// Seeds whose schedules, together, draw every kind an in-process cluster
/// injects (checked below, so a change to the generator cannot quietly
/// shrink what CI exercises).
const CI_SEEDS: [u64; 4] = [7, 18, 1, 3];
const CI_DURATION: Duration = Duration::from_secs(15);

/// Seeds (with their run length and fault kinds, which shape the
/// schedule) that once found a bug; docs/reliability.md says which.
/// An empty list of kinds: the default ones. Disk-full runs mount a
/// tmpfs per node, so they need root (CI is root).
const REGRESSIONS: [(u64, Duration, &[FaultKind]); 6] = [
    (11, Duration::from_secs(20), &[]),
    (103, Duration::from_secs(25), &[FaultKind::Pause]),
    (
        1,
        Duration::from_secs(20),
        &[FaultKind::Partition, FaultKind::Crash, FaultKind::DiskFull],
    ),
    (16, Duration::from_secs(20), &FaultKind::ALL),
    (102, Duration::from_secs(60), &FaultKind::ALL),
    (134, Duration::from_secs(60), &FaultKind::ALL),
];

fn describe(r: &SeedReport) -> String {
    format!(
        "seed {} failed (replay: {}):\nfaults:\n  {}\nviolations:\n  {}\nharness error: {:?}",
        r.seed,
        r.replay(),
        r.faults.join("\n  "),
        r.violations
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n  "),
        r.error
    )
}

#[test]
fn the_ci_seeds_draw_every_fault_kind() {
    let mut seen = BTreeSet::new();
    for seed in CI_SEEDS {
        let opts = RunOptions::new(seed, 3, CI_DURATION);
        seen.extend(shoal_chaos::schedule::count_by_kind(&opts.schedule()).into_keys());
    }
    let missing: Vec<FaultKind> = default_kinds().difference(&seen).copied().collect();
    assert!(missing.is_empty(), "no CI seed draws {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_seeds_of_faults_break_no_checked_property() {
    let _serial = common::one_at_a_time();
    let (mut steps_restored, mut objects_put) = (0, 0);
    for seed in CI_SEEDS {
        let report = run_seed(&RunOptions::new(seed, 3, CI_DURATION)).await;
        assert!(report.passed(), "{}", describe(&report));
        steps_restored += report.ops.checkpoints.steps_checked;
        objects_put += report.ops.objects.puts_acked;
        assert!(
            report.ops.writes_ok > 20 && report.ops.reads_ok > 20,
            "seed {seed}: too little work to judge: {:?}",
            report.ops
        );
        assert!(
            report.ops.jobs_submitted > 0 && report.ops.rank_beats > 0,
            "seed {seed}: no jobs ran: {:?}",
            report.ops
        );
    }
    // The restore and object checks judged something: a check that saw
    // nothing cannot fail.
    assert!(
        steps_restored > 0,
        "no committed checkpoint step was restored"
    );
    assert!(objects_put > 0, "no mesh:/ put was acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_that_once_found_a_bug_pass() {
    let _serial = common::one_at_a_time();
    for (seed, duration, only) in REGRESSIONS {
        let mut opts = RunOptions::new(seed, 3, duration);
        if !only.is_empty() {
            opts.kinds = only.iter().copied().collect();
        }
        let report = run_seed(&opts).await;
        assert!(report.passed(), "{}", describe(&report));
    }
}

/// Runs seeds from 1 with `bug` planted until one is caught; fails if none
/// of `max_seeds` is.
async fn caught_within(bug: PlantedBug, max_seeds: u64, property: &str) -> u64 {
    for seed in 1..=max_seeds {
        let mut opts = RunOptions::new(seed, 3, Duration::from_secs(10));
        opts.planted = [bug].into_iter().collect();
        let report = run_seed(&opts).await;
        assert!(report.error.is_none(), "{}", describe(&report));
        if report.violations.iter().any(|v| v.property == property) {
            return seed;
        }
    }
    panic!("{bug:?} was not caught as {property} in {max_seeds} seeds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_acknowledged_before_commit_is_caught() {
    let _serial = common::one_at_a_time();
    caught_within(PlantedBug::AckBeforeCommit, 3, "linearizable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placements_applied_without_revalidation_are_caught() {
    let _serial = common::one_at_a_time();
    caught_within(PlantedBug::SkipPlanValidation, 5, "gpu-held-twice").await;
}
