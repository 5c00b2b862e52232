//! Same trace and seed ⇒ byte-identical JSON, under every policy, with the
//! random parts (failures, FIFO's random placement) switched on.

use shoal_consensus::sched::Policy;
use shoal_sim::{run, synthetic_trace_for, SimConfig};

fn config(policy: Policy, seed: u64) -> SimConfig {
    SimConfig {
        fail_mtbf_s: Some(20 * 86_400),
        ckpt_interval_s: Some(1_800),
        seed,
        ..SimConfig::new(12, 8, policy)
    }
}

#[test]
fn same_trace_and_seed_give_byte_identical_json() {
    let trace = synthetic_trace_for(150, 7, 96, 1.1);
    for policy in [Policy::Fifo, Policy::Hdrf, Policy::HdrfPreempt] {
        let first = run(&trace, &config(policy, 3)).to_json();
        let second = run(&trace, &config(policy, 3)).to_json();
        assert_eq!(first, second, "{policy:?} is not reproducible");
        assert!(first.contains("\"avg_jct_s\""));
    }
}

#[test]
fn the_seed_matters_where_randomness_is_used() {
    let trace = synthetic_trace_for(150, 7, 96, 1.1);
    let a = run(&trace, &config(Policy::Fifo, 1));
    let b = run(&trace, &config(Policy::Fifo, 2));
    assert_ne!(
        a.to_json(),
        b.to_json(),
        "seed has no effect on failures or placement"
    );
}

#[test]
fn report_has_the_documented_fields() {
    let trace = synthetic_trace_for(40, 1, 32, 0.5);
    let report = run(&trace, &SimConfig::new(4, 8, Policy::Hdrf));
    let value: serde_json::Value = serde_json::from_str(&report.to_json()).expect("report is JSON");
    for field in [
        "policy",
        "jobs",
        "avg_jct_s",
        "p50_jct_s",
        "p99_jct_s",
        "avg_queue_s",
        "makespan_s",
        "gpu_utilization",
        "jain_fairness",
        "preemptions",
        "rejected",
        "gpu_hours_lost_failures",
        "tenants",
        "utilization_series",
    ] {
        assert!(value.get(field).is_some(), "missing {field}");
    }
    assert_eq!(value["policy"], "hdrf");
}
