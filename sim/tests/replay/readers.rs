//! Trace readers against the real files (in `shared/traces/` beside the
//! repository; a test whose file is missing fails and names it) and against
//! malformed input.

use std::path::Path;

use shoal_sim::{load_trace, parse_traces, TraceError, TraceFormat};

const PHILLY_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/traces/philly-pcs-vc"
);
const ALIBABA_PODS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/traces/alibaba-gpu-2023/openb_pod_list_default.csv"
);

fn require(path: &str) {
    assert!(
        Path::new(path).exists(),
        "this test cannot run here: {path} is missing (the traces live in shared/ beside the repository)"
    );
}

#[test]
fn philly_directory_parses_with_one_tenant_per_vc() {
    require(PHILLY_DIR);
    for format in [TraceFormat::Auto, TraceFormat::Philly] {
        let trace = load_trace(Path::new(PHILLY_DIR), format).expect("philly parses");
        assert_eq!(trace.jobs.len(), 109_532);
        let mut tenants: Vec<&str> = trace.jobs.iter().map(|j| j.tenant.as_str()).collect();
        tenants.sort_unstable();
        tenants.dedup();
        assert_eq!(tenants.len(), 12);
        assert!(tenants.contains(&"6214e9"));
        assert_eq!(trace.jobs.iter().map(|j| j.gpus).max(), Some(48));
        assert!(trace
            .jobs
            .windows(2)
            .all(|w| w[0].submit_s <= w[1].submit_s));
        assert!(trace.jobs.iter().enumerate().all(|(i, j)| j.id == i as u64));
        assert!(trace
            .jobs
            .iter()
            .all(|j| j.duration_s >= 1 && j.time_limit_s >= j.duration_s));
    }
}

#[test]
fn alibaba_pod_list_parses_and_skips_what_cannot_run() {
    require(ALIBABA_PODS);
    let trace = load_trace(Path::new(ALIBABA_PODS), TraceFormat::Auto).expect("alibaba parses");
    let skipped: usize = trace.skipped.values().sum();
    assert_eq!(trace.jobs.len() + skipped, 8_152);
    assert_eq!(
        trace.skipped.get("cpu-only pod (num_gpu = 0)"),
        Some(&1_088)
    );
    assert!(trace.jobs.iter().all(|j| (1..=8).contains(&j.gpus)));
    let tenants: std::collections::BTreeSet<&str> =
        trace.jobs.iter().map(|j| j.tenant.as_str()).collect();
    assert!(tenants.contains("LS") && tenants.contains("BE"));
}

fn parse_error(name: &str, text: &str, format: TraceFormat) -> TraceError {
    parse_traces(&[(name, text)], format).expect_err("malformed input must fail")
}

#[test]
fn malformed_philly_line_is_named() {
    let text = "app_id,submit_time,service,num_jobs,sleep_time,model_name\n\
                0,0.0,100.0,1,0.0,m\n\
                1,5.0,lots,1,5.0,m\n";
    let error = parse_error("trace_abc.csv", text, TraceFormat::Auto);
    assert!(
        matches!(error, TraceError::Parse { line: 3, .. }),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("trace_abc.csv")
            && message.contains("line 3")
            && message.contains("service")
    );
}

#[test]
fn malformed_alibaba_line_is_named() {
    let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
                p0,1000,1024,1,500,,LS,Running,0,100,5\n\
                p1,1000,1024,-1,500,,LS,Running,0,100,5\n";
    let error = parse_error("pods.csv", text, TraceFormat::Alibaba);
    assert!(
        matches!(error, TraceError::Parse { line: 3, .. }),
        "{error}"
    );
    let backwards = "name,num_gpu,qos,creation_time,deletion_time,scheduled_time\np0,1,LS,0,5,10\n";
    let error = parse_error("pods.csv", backwards, TraceFormat::Auto);
    assert!(error.to_string().contains("line 2"), "{error}");
}

#[test]
fn alibaba_fractions_round_up_and_pending_pods_are_skipped() {
    let text = "name,num_gpu,gpu_milli,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
                p0,1,230,BE,Running,0,100,10\n\
                p1,0,0,LS,Running,0,100,10\n\
                p2,2,1000,LS,Pending,5,100,\n\
                p3,4,1000,LS,Failed,7,50,8\n";
    let trace = parse_traces(&[("pods.csv", text)], TraceFormat::Auto).expect("parses");
    assert_eq!(trace.jobs.len(), 2);
    assert_eq!(
        (
            trace.jobs[0].gpus,
            trace.jobs[0].duration_s,
            trace.jobs[0].tenant.as_str()
        ),
        (1, 90, "BE")
    );
    assert_eq!((trace.jobs[1].gpus, trace.jobs[1].duration_s), (4, 42));
    assert_eq!(trace.skipped.values().sum::<usize>(), 2);
}

#[test]
fn simple_format_with_totals_shapes_and_limits() {
    let totals = "submit_time,gpus,duration,tenant,status\n0,2,60,alice,COMPLETED\n30.4,1,10.6,\"bob, inc\",FAILED\n";
    let trace = parse_traces(&[("jobs.csv", totals)], TraceFormat::Auto).expect("parses");
    assert_eq!(trace.jobs.len(), 2);
    assert_eq!(trace.jobs[1].tenant, "bob, inc");
    assert_eq!((trace.jobs[1].submit_s, trace.jobs[1].duration_s), (30, 11));
    assert_eq!(trace.jobs[0].status.as_deref(), Some("COMPLETED"));

    let shapes =
        "submit_time,nodes,gpus_per_node,duration,tenant,status,time_limit\n0,2,4,100,a,ok,150\n";
    let trace = parse_traces(&[("jobs.csv", shapes)], TraceFormat::Simple).expect("parses");
    let job = &trace.jobs[0];
    assert_eq!((job.gpus, job.time_limit_s), (8, 150));
    assert_eq!(job.shape.map(|s| (s.nodes, s.gpus_per_node)), Some((2, 4)));
}

#[test]
fn malformed_simple_lines_are_named() {
    let cases = [
        (
            "submit_time,gpus,duration,tenant,status\n0,1,10,a,ok\n0,0,10,a,ok\n",
            3,
            "GPU",
        ),
        (
            "submit_time,gpus,duration,tenant,status\n-5,1,10,a,ok\n",
            2,
            "submit_time",
        ),
        (
            "submit_time,gpus,duration,tenant,status\n0,1,10\n",
            2,
            "tenant",
        ),
        (
            "submit_time,gpus,duration,tenant,status\n0,1,10,\"a,ok\n",
            2,
            "quoted",
        ),
    ];
    for (text, line, word) in cases {
        let error = parse_error("jobs.csv", text, TraceFormat::Auto);
        let message = error.to_string();
        assert!(
            matches!(error, TraceError::Parse { line: l, .. } if l == line)
                && message.contains(word),
            "{message}"
        );
    }
}

#[test]
fn unknown_headers_and_missing_columns_are_reported() {
    let error = parse_error("x.csv", "a,b,c\n1,2,3\n", TraceFormat::Auto);
    assert!(matches!(error, TraceError::UnknownFormat { .. }), "{error}");
    let error = parse_error(
        "x.csv",
        "submit_time,duration,tenant\n0,1,a\n",
        TraceFormat::Simple,
    );
    assert!(
        matches!(error, TraceError::MissingColumn { column: "gpus", .. }),
        "{error}"
    );
    let error = load_trace(Path::new("/nonexistent/trace.csv"), TraceFormat::Auto)
        .expect_err("missing file");
    assert!(error.to_string().contains("/nonexistent/trace.csv"));
}
