//! `/metrics` of a running node: dcgm-exporter series for every GPU with
//! the job holding it, Shoal's own series, valid OpenMetrics text; and
//! `shoal prometheus-sd` listing the node.

mod common;

use common::{shoal_bin, wait_for, NodeProc};
use shoal_sdk::JobSubmitRequest;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Every sample line is `name{labels} value`, and the text ends with one `# EOF`.
fn assert_well_formed(text: &str) {
    assert!(text.ends_with("# EOF\n"), "no trailing # EOF");
    assert_eq!(text.matches("# EOF").count(), 1, "more than one # EOF");
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line}"));
        assert!(value.parse::<f64>().is_ok(), "bad value in {line}");
        let name = series.split('{').next().unwrap_or_default();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_dcgm_series_per_gpu_and_shoal_series() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = NodeProc::new(root.path(), "m1", &[]);
    node.bootstrap();
    let token = node.admin_token();
    let client = node.client(&token);
    let id = client
        .submit_job(&JobSubmitRequest {
            name: "hold".into(),
            tenant: None,
            nodes: 1,
            gpus_per_node: 2,
            gpu_model: None,
            time_limit_s: 600,
            priority: 0,
            preemptible: true,
            command: vec!["sleep".into(), "60".into()],
            env: BTreeMap::new(),
            workdir: None,
            ckpt_interval_s: None,
            max_restarts: 0,
            same: None,
            max_rtt_ms: None,
            labels: BTreeMap::new(),
        })
        .await
        .expect("submit")
        .id;
    let job = wait_for("the job running", TIMEOUT, || {
        let c = client.clone();
        async move { c.job(id).await.ok().filter(|j| j.state == "running") }
    })
    .await;
    let held: Vec<u32> = job.gpus["m1"].clone();
    let text = wait_for("GPU samples in /metrics", TIMEOUT, || {
        let c = client.clone();
        async move {
            let text = c.metrics_text().await.ok()?;
            (text.matches("DCGM_FI_DEV_GPU_UTIL{").count() == 4).then_some(text)
        }
    })
    .await;
    assert_well_formed(&text);
    for name in [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_XID_ERRORS",
    ] {
        for gpu in 0..4u32 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name}{{gpu=\"{gpu}\"")))
                .unwrap_or_else(|| panic!("no {name} for GPU {gpu}"));
            assert!(line.contains("UUID=\"GPU-"), "{line}");
            assert!(line.contains("modelName=\"H100-80GB\""), "{line}");
            assert!(line.contains("Hostname=\"m1\""), "{line}");
            let job_label = if held.contains(&gpu) {
                format!("shoal_job=\"{id}\"")
            } else {
                "shoal_job=\"\"".to_string()
            };
            assert!(line.contains(&job_label), "{line}");
        }
    }
    for series in [
        "shoal_raft_term ",
        "shoal_jobs{state=\"running\"} 1",
        "shoal_gpus{state=\"allocated\"} 2",
        "shoal_tenant_gpus_in_use{tenant=\"default\"} 2",
        "shoal_checkpoint_parts_under_replicated 0",
        "shoal_scheduler_placements_total",
    ] {
        assert!(text.contains(series), "missing {series}");
    }
    if Command::new("promtool").arg("--version").output().is_ok() {
        let path = root.path().join("metrics.txt");
        std::fs::write(&path, &text).expect("write");
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("promtool check metrics < {}", path.display()))
            .output()
            .expect("promtool");
        // dcgm-exporter's own label names (modelName, UUID, Hostname) are
        // camelCase; dashboards depend on them, so that one lint is expected.
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // OpenMetrics writes `# HELP name` for a counter whose samples are
        // `name_total`; the text-format linter looks for `# HELP name_total`.
        let problems: Vec<&str> = report
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter(|l| {
                !(l.starts_with("DCGM_FI_")
                    && l.ends_with("label names should be written in 'snake_case' not 'camelCase'"))
            })
            .filter(|l| {
                !l.strip_suffix("_total no help text")
                    .is_some_and(|name| text.contains(&format!("# HELP {name} ")))
            })
            .collect();
        assert!(problems.is_empty(), "promtool: {problems:?}");
    } else {
        eprintln!("promtool not installed; checked the text format by hand only");
    }

    let out = Command::new(shoal_bin())
        .arg("prometheus-sd")
        .env("SHOAL_API", node.api_url())
        .env("SHOAL_TOKEN", &token)
        .output()
        .expect("prometheus-sd");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let addr = node.api_url().trim_start_matches("http://").to_string();
    assert_eq!(doc[0]["targets"], serde_json::json!([addr]));
    client.cancel_job(id).await.expect("cancel");
}

#[test]
fn prometheus_rules_check_and_pass_their_unit_tests() {
    if Command::new("promtool").arg("--version").output().is_err() {
        eprintln!("skipped: promtool is not installed (Debian package `prometheus`)");
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/prometheus");
    for args in [
        ["check", "rules", "shoal.rules.yml"],
        ["test", "rules", "shoal.rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool");
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_gpu_faults_become_one_event_each_within_a_second() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = NodeProc::new(root.path(), "e1", &[]);
    node.bootstrap();
    let token = node.admin_token();
    let client = node.client(&token);
    wait_for("the node to serve", TIMEOUT, || {
        let c = client.clone();
        async move { c.status().await.ok() }
    })
    .await;
    // Give the sampler a first sample to compare against.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let faults = [
        (2u32, "ecc-dbe", "gpu_ecc_dbe"),
        (1, "xid:79", "gpu_xid"),
        (3, "hot", "gpu_throttle"),
    ];
    for (gpu, fault, kind) in faults {
        let injected = std::time::Instant::now();
        client.gpu_fault(gpu, fault).await.expect("inject");
        let latency = wait_for(&format!("a {kind} event"), TIMEOUT, || {
            let c = client.clone();
            async move {
                let events = c.events(0).await.ok()?;
                events
                    .iter()
                    .any(|e| {
                        e.kind == kind && e.gpu == Some(gpu) && e.node.as_deref() == Some("e1")
                    })
                    .then(|| injected.elapsed())
            }
        })
        .await;
        eprintln!("{kind}: event committed {latency:.2?} after the injection");
        assert!(latency < Duration::from_secs(1), "{kind} took {latency:?}");
    }
    // Persistent faults are not reported again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let events = client.events(0).await.expect("events");
    for (gpu, _, kind) in faults {
        let n = events
            .iter()
            .filter(|e| e.kind == kind && e.gpu == Some(gpu))
            .count();
        assert_eq!(n, 1, "{kind} on GPU {gpu} reported {n} times: {events:?}");
    }
    let bad = Command::new(shoal_bin())
        .args(["debug", "gpu-fault", "--gpu", "9", "ecc-dbe"])
        .env("SHOAL_API", node.api_url())
        .env("SHOAL_TOKEN", &token)
        .output()
        .expect("cli");
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).starts_with("error: node e1 has no GPU 9"));
}
