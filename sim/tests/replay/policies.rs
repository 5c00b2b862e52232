//! Policy comparisons and engine behaviour on small traces.
//!
//! Neither trace may be redistributed here (Philly: "We provide the trace as
//! is", no license; Alibaba 2023: no license file of its own), so the excerpt
//! is generated: a seeded sample written in the Philly (PCS) CSV schema,
//! three VC files, parsed by the real reader.

use shoal_consensus::sched::Policy;
use shoal_sim::{parse_traces, run, synthetic_trace_for, SimConfig, TraceFormat, TraceJob};

/// A Philly-schema sample: one CSV text per VC, as the PCS files look.
fn philly_schema_sample() -> Vec<(String, String)> {
    let jobs = synthetic_trace_for(300, 11, 96, 1.05);
    let vcs = ["0e4a51", "6214e9", "b436b2"];
    vcs.iter()
        .enumerate()
        .map(|(index, vc)| {
            let mut text =
                String::from("app_id,submit_time,service,num_jobs,sleep_time,model_name\n");
            let mut previous = 0u64;
            let mine = jobs
                .iter()
                .filter(|job| job.id as usize % vcs.len() == index);
            for (row, job) in mine.enumerate() {
                let service = job.duration_s * u64::from(job.gpus);
                text.push_str(&format!(
                    "{row},{}.0,{service}.0,{},{}.0,ResNet50\n",
                    job.submit_s,
                    job.gpus,
                    job.submit_s - previous
                ));
                previous = job.submit_s;
            }
            (format!("trace_{vc}.csv"), text)
        })
        .collect()
}

fn sample_trace() -> Vec<TraceJob> {
    let files = philly_schema_sample();
    let borrowed: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    parse_traces(&borrowed, TraceFormat::Auto)
        .expect("sample parses")
        .jobs
}

#[test]
fn hdrf_with_backfill_beats_fifo_on_average_jct() {
    let trace = sample_trace();
    assert_eq!(trace.len(), 300);
    let fifo = run(&trace, &SimConfig::new(12, 8, Policy::Fifo));
    let hdrf = run(&trace, &SimConfig::new(12, 8, Policy::Hdrf));
    assert_eq!(fifo.jobs, hdrf.jobs);
    assert!(
        hdrf.avg_jct_s < fifo.avg_jct_s,
        "hdrf {} s vs fifo {} s",
        hdrf.avg_jct_s,
        fifo.avg_jct_s
    );
    assert!(hdrf.avg_queue_s < fifo.avg_queue_s);
}

#[test]
fn jobs_larger_than_the_cluster_are_rejected_not_simulated() {
    let mut trace = synthetic_trace_for(20, 3, 32, 0.5);
    trace[5].gpus = 64;
    let report = run(&trace, &SimConfig::new(4, 8, Policy::Hdrf));
    assert_eq!(report.rejected, 1);
    assert_eq!(report.jobs, 19);
    assert!(report.outcomes[5]
        .rejected
        .as_deref()
        .is_some_and(|r| r.contains("8 nodes")));
}

#[test]
fn large_jobs_become_whole_node_gangs() {
    let trace = vec![TraceJob {
        id: 0,
        tenant: "a".into(),
        submit_s: 0,
        gpus: 12,
        duration_s: 100,
        time_limit_s: 200,
        shape: None,
        status: None,
    }];
    let report = run(&trace, &SimConfig::new(4, 8, Policy::Hdrf));
    // ceil(12 / 8) = 2 nodes × 8 GPUs.
    assert_eq!(report.outcomes[0].gpus, 16);
    assert_eq!(report.outcomes[0].finish_s, Some(100));
}

#[test]
fn the_scheduler_times_out_jobs_at_their_limit() {
    let trace = vec![TraceJob {
        id: 0,
        tenant: "a".into(),
        submit_s: 10,
        gpus: 1,
        duration_s: 1_000,
        time_limit_s: 300,
        shape: None,
        status: None,
    }];
    let report = run(&trace, &SimConfig::new(1, 8, Policy::Hdrf));
    assert!(report.outcomes[0].timed_out);
    assert_eq!(report.outcomes[0].finish_s, Some(310));
    assert_eq!(report.timed_out, 1);
}

#[test]
fn preemption_serves_a_starved_tenant() {
    // Tenant "hog" fills the cluster with long jobs; "late" arrives later.
    let mut trace: Vec<TraceJob> = (0..8)
        .map(|i| TraceJob {
            id: i,
            tenant: "hog".into(),
            submit_s: 0,
            gpus: 4,
            duration_s: 100_000,
            time_limit_s: 200_000,
            shape: None,
            status: None,
        })
        .collect();
    trace.push(TraceJob {
        id: 8,
        tenant: "late".into(),
        submit_s: 1_000,
        gpus: 4,
        duration_s: 100,
        time_limit_s: 200,
        shape: None,
        status: None,
    });
    let plain = run(&trace, &SimConfig::new(4, 4, Policy::Hdrf));
    let preempt = run(&trace, &SimConfig::new(4, 4, Policy::HdrfPreempt));
    assert_eq!(plain.preemptions, 0);
    assert!(preempt.preemptions >= 1);
    let late = |r: &shoal_sim::SimReport| r.outcomes[8].finish_s.unwrap_or(u64::MAX);
    assert_eq!(late(&preempt), 1_100);
    assert!(late(&plain) > 100_000);
    assert!(preempt.gpu_hours_lost_preemption > 0.0);
}

#[test]
fn checkpoints_reduce_work_lost_to_failures() {
    let trace = synthetic_trace_for(150, 5, 64, 0.9);
    let with_failures = |ckpt: Option<u64>| SimConfig {
        fail_mtbf_s: Some(3 * 86_400),
        ckpt_interval_s: ckpt,
        seed: 9,
        ..SimConfig::new(8, 8, Policy::Hdrf)
    };
    let none = run(&trace, &with_failures(None));
    let hourly = run(&trace, &with_failures(Some(3_600)));
    assert!(none.node_failures > 0 && none.failure_interruptions > 0);
    assert!(hourly.failure_interruptions > 0);
    assert_eq!(
        none.gpu_hours_lost_failures,
        none.gpu_hours_lost_failures_without_ckpt
    );
    assert!(hourly.gpu_hours_lost_failures < hourly.gpu_hours_lost_failures_without_ckpt);
    assert_eq!(none.unfinished + hourly.unfinished, 0);
}

#[test]
fn utilization_and_fairness_are_sane() {
    let trace = sample_trace();
    for policy in [Policy::Fifo, Policy::Hdrf, Policy::HdrfPreempt] {
        let report = run(&trace, &SimConfig::new(12, 8, policy));
        assert!(report.gpu_utilization > 0.0 && report.gpu_utilization <= 1.0);
        assert!(report.jain_fairness > 0.0 && report.jain_fairness <= 1.0 + 1e-9);
        assert!(report.utilization_series.iter().all(|p| p[1] <= 1.0 + 1e-9));
        assert_eq!(report.jct_cdf.len(), 100);
        assert_eq!(report.tenants.len(), 3);
    }
}

#[test]
fn svg_has_one_series_per_policy() {
    let trace = synthetic_trace_for(60, 2, 32, 0.9);
    let reports: Vec<shoal_sim::SimReport> = [Policy::Fifo, Policy::Hdrf]
        .into_iter()
        .map(|policy| run(&trace, &SimConfig::new(4, 8, policy)))
        .collect();
    let path = std::env::temp_dir().join(format!("sim-plot-{}.svg", std::process::id()));
    shoal_sim::write_svg(&path, &reports).expect("plot");
    let svg = std::fs::read_to_string(&path).expect("svg written");
    let _ = std::fs::remove_file(&path);
    assert!(svg.starts_with("<svg"));
    assert!(svg.contains("fifo") && svg.contains("hdrf"));
    assert!(svg.contains("GPU utilization over time") && svg.contains("Job completion time CDF"));
}
