//! The CLI contract of INTERFACE.md: JSON shapes, one-line errors, exit codes.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{shoal_bin, wait_for, NodeProc};
use std::process::Command;
use std::time::Duration;

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(shoal_bin());
    c.args(args)
        .env_remove("SHOAL_API")
        .env_remove("SHOAL_TOKEN");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run shoal");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_error_line(stderr: &str) {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
}

#[test]
fn unreachable_api_is_one_error_line_and_exit_1() {
    let (code, stdout, stderr) = run(
        &["--api", "http://127.0.0.1:9", "--token", "x", "status"],
        &[],
    );
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    assert_one_error_line(&stderr);
    assert!(stderr.contains("cannot reach"), "{stderr}");
}

#[test]
fn bad_usage_exits_2() {
    let (code, _, stderr) = run(&["no-such-command"], &[]);
    assert_eq!(code, 2);
    assert!(stderr.starts_with("error:"), "{stderr}");
    let (code, _, _) = run(&["agent", "--join", "127.0.0.1:1"], &[]);
    assert_eq!(code, 2, "--join without --join-token is a usage error");
}

#[test]
fn agent_without_identity_or_mode_explains_what_to_do() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path().join("node");
    let (code, _, stderr) = run(
        &[
            "agent",
            "--data-dir",
            d.to_str().expect("utf8"),
            "--api-addr",
            "127.0.0.1:0",
            "--rpc-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);
    assert!(stderr.contains("--bootstrap"), "{stderr}");
}

#[test]
fn invalid_config_values_are_refused() {
    let (code, _, stderr) = run(
        &[
            "agent",
            "--bootstrap",
            "--sim-gpus",
            "lots",
            "--api-addr",
            "127.0.0.1:0",
            "--rpc-addr",
            "127.0.0.1:0",
            "--data-dir",
            "/tmp/shoal-never-created-x",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);
    assert!(stderr.contains("sim-gpus"), "{stderr}");
    let (code, _, stderr) = run(
        &["agent", "--bootstrap"],
        &[("SHOAL_RAFT__HEARTBEAT_MS", "5000")],
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("heartbeat"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_nodes_and_token_follow_the_interface() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tmp");
    let mut n1 = NodeProc::new(root.path(), "n1", &["zone=a", "rack=r1"]);
    n1.bootstrap();
    let token = n1.admin_token();
    let api = n1.api_url();
    let data_dir = n1.data_dir.to_str().expect("utf8").to_string();
    wait_for("the API", Duration::from_secs(30), || async {
        n1.client(&token).status().await.ok()
    })
    .await;

    // Token discovery from <data-dir>/admin.token.
    let (code, stdout, stderr) = run(
        &["--api", &api, "--data-dir", &data_dir, "status", "--json"],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    for key in [
        "cluster_id",
        "region",
        "leader",
        "term",
        "commit_index",
        "voters",
        "members",
    ] {
        assert!(v.get(key).is_some(), "status --json lacks {key}: {stdout}");
    }
    let m = &v["members"][0];
    for key in ["id", "name", "state"] {
        assert!(m.get(key).is_some(), "members[] lacks {key}");
    }

    let (code, stdout, _) = run(&["--api", &api, "--token", &token, "nodes", "--json"], &[]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    let n = &v[0];
    for key in [
        "id",
        "name",
        "state",
        "addr",
        "labels",
        "gpus",
        "gpus_free",
        "gpus_total",
        "last_seen_ms",
    ] {
        assert!(n.get(key).is_some(), "nodes --json lacks {key}: {stdout}");
    }
    assert_eq!(n["gpus_total"], 4);
    assert_eq!(n["labels"]["zone"], "a");
    for key in ["index", "model", "memory_mb", "uuid", "allocated_to"] {
        assert!(n["gpus"][0].get(key).is_some(), "gpus[] lacks {key}");
    }

    // Human tables.
    let (code, stdout, _) = run(&["--api", &api, "--token", &token, "nodes"], &[]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("H100-80GB") && stdout.contains("4/4"),
        "{stdout}"
    );

    // The join token, alone on stdout.
    let (code, stdout, _) = run(
        &[
            "--api", &api, "--token", &token, "token", "create", "--ttl", "2h",
        ],
        &[],
    );
    assert_eq!(code, 0);
    assert!(
        stdout.trim().starts_with("sj1.") && stdout.lines().count() == 1,
        "{stdout}"
    );
    let (code, _, stderr) = run(
        &[
            "--api", &api, "--token", &token, "token", "create", "--ttl", "soon",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);

    // Wrong token: 401 as one error line.
    let (code, _, stderr) = run(&["--api", &api, "--token", "sa1.wrong", "status"], &[]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);

    // Bootstrapping over an existing identity is refused, nothing changes.
    let (code, _, stderr) = run(
        &[
            "agent",
            "--bootstrap",
            "--data-dir",
            &data_dir,
            "--api-addr",
            "127.0.0.1:0",
            "--rpc-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("already holds node"), "{stderr}");
}

#[test]
fn sim_json_is_byte_identical_for_the_same_trace_and_seed() {
    let dir = tempfile::tempdir().expect("tmp");
    let trace = dir.path().join("trace.csv");
    let mut csv = String::from("submit_time,gpus,duration,tenant,status\n");
    for i in 0..60u64 {
        csv.push_str(&format!(
            "{},{},{},t{},Pass\n",
            i * 37,
            1 << (i % 4),
            600 + (i * 977) % 5000,
            i % 3
        ));
    }
    std::fs::write(&trace, csv).expect("write trace");
    let t = trace.to_str().expect("utf8");
    let args = [
        "sim",
        "--trace",
        t,
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--policy",
        "hdrf",
        "--seed",
        "7",
        "--json",
    ];
    let (c1, out1, err1) = run(&args, &[]);
    let (c2, out2, _) = run(&args, &[]);
    assert_eq!(c1, 0, "{err1}");
    assert_eq!(c2, 0);
    assert_eq!(
        out1, out2,
        "same trace and seed must give byte-identical JSON"
    );
    let v: serde_json::Value = serde_json::from_str(&out1).expect("one JSON document");
    for key in [
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
    ] {
        assert!(v.get(key).is_some(), "sim --json lacks {key}");
    }
    assert_eq!(v["jobs"], 60);
    let (code, _, stderr) = run(&["sim", "--trace", "/nonexistent/trace.csv"], &[]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);
}

/// Real discovery (no `--sim-gpus`): without an NVIDIA driver the agent
/// starts with zero GPUs and says so once; with one, it reports the GPUs
/// NVML found and never claims the driver is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_discovery_reports_the_gpus_nvml_finds_or_zero_once_without_a_driver() {
    let _serial = common::one_at_a_time();
    let has_driver = std::path::Path::new("/dev/nvidiactl").exists();
    let root = tempfile::tempdir().expect("tmp");
    let mut n1 = NodeProc::new(root.path(), "n1", &[]);
    n1.sim_gpus = None;
    n1.bootstrap();
    let token = n1.admin_token();
    let nodes = wait_for("the API", Duration::from_secs(30), || async {
        n1.client(&token).nodes().await.ok()
    })
    .await;
    let log = n1.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("no NVIDIA driver found"))
        .collect();
    if has_driver {
        assert!(
            nodes[0].gpus_total > 0,
            "this machine has an NVIDIA driver but the agent found no GPU:\n{log}"
        );
        assert!(lines.is_empty(), "{lines:?}");
        return;
    }
    assert_eq!(nodes[0].gpus_total, 0);
    assert_eq!(
        lines.len(),
        1,
        "expected one log line about the missing driver:\n{log}"
    );
    assert!(lines[0].contains("0 GPUs"), "{}", lines[0]);
}
