//! Invariants over small random traces, for every policy: capacity is never
//! exceeded, every job that can run finishes, FIFO starts jobs in submission
//! order, and work is conserved.

use proptest::prelude::*;
use shoal_consensus::sched::Policy;
use shoal_sim::{run, JobOutcome, SimConfig, SimReport, TraceJob};

const NODES: u32 = 4;
const GPUS_PER_NODE: u32 = 4;

fn job_strategy() -> impl Strategy<Value = (u64, u32, u64, u8, bool)> {
    (
        0u64..4_000,
        prop_oneof![4 => Just(1u32), 2 => Just(2), 2 => Just(4), 1 => Just(8), 1 => Just(3), 1 => Just(24)],
        1u64..3_000,
        0u8..3,
        any::<bool>(),
    )
}

fn trace_strategy() -> impl Strategy<Value = Vec<TraceJob>> {
    prop::collection::vec(job_strategy(), 1..30).prop_map(|rows| {
        let mut rows = rows;
        rows.sort_by_key(|row| row.0);
        rows.into_iter()
            .enumerate()
            .map(
                |(id, (submit_s, gpus, duration_s, tenant, tight_limit))| TraceJob {
                    id: id as u64,
                    tenant: format!("t{tenant}"),
                    submit_s,
                    gpus,
                    duration_s,
                    // Some jobs are killed by their limit, exercising time-outs.
                    time_limit_s: if tight_limit {
                        duration_s.div_ceil(2)
                    } else {
                        duration_s * 2
                    },
                    shape: None,
                    status: None,
                },
            )
            .collect()
    })
}

fn config(policy: Policy, seed: u64, failures: bool) -> SimConfig {
    SimConfig {
        seed,
        fail_mtbf_s: failures.then_some(6_000),
        ckpt_interval_s: failures.then_some(300),
        ..SimConfig::new(NODES, GPUS_PER_NODE, policy)
    }
}

/// Largest number of GPUs held at once, from the run segments alone.
fn peak_allocation(outcomes: &[JobOutcome]) -> u64 {
    let mut changes: Vec<(u64, i64)> = outcomes
        .iter()
        .flat_map(|o| &o.segments)
        .flat_map(|s| {
            [
                (s.start_s, i64::from(s.gpus)),
                (s.end_s, -i64::from(s.gpus)),
            ]
        })
        .collect();
    // Releases before acquisitions at the same instant.
    changes.sort_by_key(|&(time, delta)| (time, delta));
    let mut held = 0i64;
    let mut peak = 0i64;
    for (_, delta) in changes {
        held += delta;
        peak = peak.max(held);
    }
    peak as u64
}

fn check_common(trace: &[TraceJob], report: &SimReport) -> Result<(), TestCaseError> {
    let capacity = u64::from(NODES * GPUS_PER_NODE);
    prop_assert!(peak_allocation(&report.outcomes) <= capacity);
    prop_assert_eq!(report.unfinished, 0);
    prop_assert_eq!(report.bad_placements, 0);
    for (job, outcome) in trace.iter().zip(&report.outcomes) {
        let too_big = job.gpus.div_ceil(GPUS_PER_NODE) > NODES;
        prop_assert_eq!(outcome.rejected.is_some(), too_big, "job {}", job.id);
        if too_big {
            continue;
        }
        let finish = outcome.finish_s;
        prop_assert!(finish.is_some(), "job {} never finished", job.id);
        let start = outcome.first_start_s.unwrap_or(u64::MAX);
        prop_assert!(start >= job.submit_s);
        let ran: u64 = outcome.segments.iter().map(|s| s.end_s - s.start_s).sum();
        if outcome.timed_out {
            prop_assert!(job.time_limit_s < job.duration_s);
        } else {
            prop_assert!(
                ran >= job.duration_s,
                "job {} ran {ran} of {}",
                job.id,
                job.duration_s
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_for_every_policy(trace in trace_strategy(), seed in 0u64..1_000, failures in any::<bool>()) {
        for policy in [Policy::Fifo, Policy::Hdrf, Policy::HdrfPreempt] {
            let report = run(&trace, &config(policy, seed, failures));
            check_common(&trace, &report)?;
        }
    }

    #[test]
    fn fifo_never_starts_a_job_before_an_earlier_one(trace in trace_strategy(), seed in 0u64..1_000) {
        let report = run(&trace, &config(Policy::Fifo, seed, false));
        let started: Vec<(u64, u64)> = trace
            .iter()
            .zip(&report.outcomes)
            .filter_map(|(job, outcome)| Some((job.submit_s, outcome.first_start_s?)))
            .collect();
        for pair in started.windows(2) {
            prop_assert!(pair[0].1 <= pair[1].1, "later job started first: {:?}", pair);
        }
    }
}
