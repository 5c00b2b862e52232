//! `/metrics` of a running node: dcgm-exporter series for every GPU with
//! the job holding it, Shoal's own series, valid OpenMetrics text; and
//! `shoal prometheus-sd` listing every node; anomaly events (GPU faults,
//! stragglers, stalls) and the webhook; the dashboard and alert rules.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{sh_job, shoal_bin, start_cluster, wait_for, NodeProc};
use shoal_sdk::JobSubmitRequest;
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

/// The dcgm-exporter series of one node: every GPU, its identity labels,
/// and the job holding it.
fn assert_dcgm_series(text: &str, node: &str, job: u64, held: &[u32]) {
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
                .unwrap_or_else(|| panic!("{node}: no {name} for GPU {gpu}"));
            assert!(line.contains("UUID=\"GPU-"), "{line}");
            assert!(line.contains("modelName=\"H100-80GB\""), "{line}");
            assert!(line.contains(&format!("Hostname=\"{node}\"")), "{line}");
            let job_label = if held.contains(&gpu) {
                format!("shoal_job=\"{job}\"")
            } else {
                "shoal_job=\"\"".to_string()
            };
            assert!(line.contains(&job_label), "{line}");
        }
    }
}

/// Without promtool the lint and the alert-rule tests cannot run, and say so
/// by failing.
fn require_promtool() {
    assert!(
        Command::new("promtool").arg("--version").output().is_ok(),
        "this test cannot run here: promtool is not installed (Debian package `prometheus`; .ci/run installs it)"
    );
}

/// `promtool check metrics`, apart from the two findings docs/metrics.md
/// explains.
fn assert_promtool_accepts(dir: &std::path::Path, text: &str) {
    require_promtool();
    let path = dir.join("metrics.txt");
    std::fs::write(&path, text).expect("write");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("promtool check metrics < {}", path.display()))
        .output()
        .expect("promtool");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let problems: Vec<&str> = report
        .lines()
        .filter(|l| !l.trim().is_empty())
        // dcgm-exporter's own label names (modelName, UUID, Hostname) are
        // camelCase; dashboards depend on them, so that one lint is expected.
        .filter(|l| {
            !(l.starts_with("DCGM_FI_")
                && l.ends_with("label names should be written in 'snake_case' not 'camelCase'"))
        })
        // OpenMetrics writes `# HELP name` for a counter whose samples are
        // `name_total`; the text-format linter looks for `# HELP name_total`.
        .filter(|l| {
            !l.strip_suffix("_total no help text")
                .is_some_and(|name| text.contains(&format!("# HELP {name} ")))
        })
        .collect();
    assert!(problems.is_empty(), "promtool: {problems:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_a_three_node_cluster_carry_dcgm_series_per_gpu_and_shoal_series() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (nodes, token) = start_cluster(root.path(), &["m1", "m2", "m3"], |_| {
        vec![("SHOAL_METRICS__TENANT_LABELS".into(), "true".into())]
    })
    .await;
    let client = nodes[0].client(&token);
    let id = client
        .submit_job(&JobSubmitRequest {
            name: "hold".into(),
            ..sh_job(2, 2, "sleep 60")
        })
        .await
        .expect("submit")
        .id;
    let job = wait_for("the job running", TIMEOUT, || {
        let c = client.clone();
        async move { c.job(id).await.ok().filter(|j| j.state == "running") }
    })
    .await;
    for node in &nodes {
        let c = node.client(&token);
        let held: Vec<u32> = job.gpus.get(&node.name).cloned().unwrap_or_default();
        let text = wait_for("GPU samples and the job in /metrics", TIMEOUT, || {
            let c = c.clone();
            async move {
                let text = c.metrics_text().await.ok()?;
                // Gossip peers are counted once heard from.
                (text.matches("DCGM_FI_DEV_GPU_UTIL{").count() == 4
                    && text.contains("shoal_jobs{state=\"running\"} 1")
                    && text.contains("shoal_fd_peers{state=\"alive\"} 2"))
                .then_some(text)
            }
        })
        .await;
        assert_well_formed(&text);
        assert_dcgm_series(&text, &node.name, id, &held);
        for series in [
            "shoal_raft_term ",
            "shoal_gpus{state=\"allocated\"} 4",
            "shoal_tenant_gpus_in_use{tenant=\"default\"} 4",
            "shoal_checkpoint_parts_under_replicated 0",
            "shoal_scheduler_placements_total",
            "shoal_members{state=\"alive\"} 3",
            "process_resident_memory_bytes ",
            "process_cpu_seconds_total ",
            "process_open_fds ",
            "shoal_fd_local_health ",
            "shoal_gossip_peers_heard ",
            "shoal_fd_peers{state=\"alive\"} 2",
        ] {
            assert!(text.contains(series), "{}: missing {series}", node.name);
        }
        assert_promtool_accepts(root.path(), &text);
        // Every series the dashboard and the alert rules use is one a node exports.
        let configs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        for file in ["grafana/shoal-dashboard.json", "prometheus/shoal.rules.yml"] {
            let config = std::fs::read_to_string(configs.join(file)).expect("config file");
            let names = series_names(&config);
            assert!(names.len() >= 8, "{file} names only {names:?}");
            for name in names {
                let base = ["_bucket", "_total", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(&name);
                assert!(
                    text.contains(&format!("# TYPE {base} ")),
                    "{file} uses {name}, which /metrics does not export"
                );
            }
        }
    }

    let out = Command::new(shoal_bin())
        .arg("prometheus-sd")
        .env("SHOAL_API", nodes[1].api_url())
        .env("SHOAL_TOKEN", &token)
        .output()
        .expect("prometheus-sd");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let mut targets: Vec<String> = doc[0]["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter_map(|t| t.as_str().map(str::to_string))
        .collect();
    targets.sort();
    let mut want: Vec<String> = nodes
        .iter()
        .map(|n| n.api_url().trim_start_matches("http://").to_string())
        .collect();
    want.sort();
    assert_eq!(targets, want);
    client.cancel_job(id).await.expect("cancel");
}

/// Metric names in PromQL expressions of a config file: identifiers with one
/// of the prefixes Shoal exports.
fn series_names(config: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut word = String::new();
    for c in config.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if ["DCGM_FI_", "shoal_", "process_"]
            .iter()
            .any(|p| word.starts_with(p))
            && word != "shoal_job"
        {
            names.insert(std::mem::take(&mut word));
        }
        word.clear();
    }
    names
}

#[test]
fn the_grafana_dashboard_is_valid_json_with_panels() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs/grafana/shoal-dashboard.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard")).expect("json");
    let panels = doc["panels"].as_array().expect("panels");
    let graphs: Vec<&serde_json::Value> = panels.iter().filter(|p| p["type"] != "row").collect();
    assert!(graphs.len() >= 20, "{} panels", graphs.len());
    let mut ids = std::collections::BTreeSet::new();
    for p in &graphs {
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "duplicate panel id"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()));
        }
    }
}

#[test]
fn prometheus_rules_check_and_pass_their_unit_tests() {
    require_promtool();
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

/// Each injected fault becomes one event, once. The bound is what a loaded
/// 2-core machine always meets; the typical latency (a sample tick and a
/// commit, well under a second) is printed and measured by `shoal bench
/// anomaly`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_gpu_faults_become_one_event_each_soon() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = NodeProc::new(root.path(), "e1", &[]);
    node.bootstrap();
    let token = node.admin_token();
    let client = node.client(&token);
    wait_for_first_samples(&client).await;
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
        assert!(latency < Duration::from_secs(5), "{kind} took {latency:?}");
    }
    // Persistent faults are not reported again: the detectors judge eight
    // more rounds of samples (2 s at the 250 ms period), then a repeat
    // would have been proposed.
    sample_rounds(&client, 8).await;
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

/// A fault shows as a change from the previous sample, so the sampler must
/// have taken one of every GPU (its series are on /metrics) before a fault
/// is injected: a first sample taken after would absorb it as the baseline.
async fn wait_for_first_samples(client: &shoal_sdk::Client) {
    wait_for("a first sample of every GPU", TIMEOUT, || {
        let c = client.clone();
        async move {
            let text = c.metrics_text().await.ok()?;
            (0..4u32)
                .all(|gpu| text.contains(&format!("DCGM_FI_DEV_GPU_TEMP{{gpu=\"{gpu}\"")))
                .then_some(())
        }
    })
    .await;
}

/// The GPU sample rounds this node reported so far.
async fn sample_rounds_so_far(client: &shoal_sdk::Client) -> Option<u64> {
    let text = client.metrics_text().await.ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("shoal_gpu_sample_rounds_total "))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits until the node's detectors judged `rounds` more rounds of samples.
async fn sample_rounds(client: &shoal_sdk::Client, rounds: u64) {
    let start = wait_for("the sample round counter", TIMEOUT, || {
        sample_rounds_so_far(client)
    })
    .await;
    wait_for(
        &format!("{rounds} more sample rounds"),
        TIMEOUT,
        || async move {
            sample_rounds_so_far(client)
                .await
                .filter(|n| *n >= start + rounds)
        },
    )
    .await;
}

/// The first event of `kind` in the log, waiting for it.
async fn first_event(client: &shoal_sdk::Client, kind: &str) -> shoal_sdk::EventInfo {
    wait_for(&format!("a {kind} event"), TIMEOUT, || async move {
        client
            .events(0)
            .await
            .ok()?
            .into_iter()
            .find(|e| e.kind == kind)
    })
    .await
}

/// A minimal webhook receiver: every POSTed JSON body, in arrival order.
async fn webhook_receiver() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
) {
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<serde_json::Value>| {
            let sink = sink.clone();
            async move {
                sink.lock().expect("lock").push(body);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_posted_to_the_webhook() {
    let _serial = common::one_at_a_time();
    let (url, got) = webhook_receiver().await;
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = NodeProc::new(root.path(), "w1", &[]);
    node.extra_env
        .push(("SHOAL_ANOMALY__WEBHOOK_URL".into(), url));
    node.bootstrap();
    let token = node.admin_token();
    let client = node.client(&token);
    wait_for("the node to lead", TIMEOUT, || {
        let c = client.clone();
        async move { c.status().await.ok().filter(|s| s.leader.is_some()) }
    })
    .await;
    wait_for_first_samples(&client).await;
    client.gpu_fault(0, "ecc-dbe").await.expect("inject");
    let posted = wait_for("the webhook POST", TIMEOUT, || {
        let got = got.clone();
        async move {
            let got = got.lock().ok()?;
            got.iter().find(|e| e["kind"] == "gpu_ecc_dbe").cloned()
        }
    })
    .await;
    assert_eq!(posted["node"], "w1");
    assert_eq!(posted["gpu"], 0);
    assert_eq!(posted["severity"], "critical");
    assert!(posted["id"].as_u64().is_some_and(|id| id > 0));
    // Delivery is at least once (a POST whose answer was lost is sent
    // again), so the same event may arrive twice, but no other ECC event.
    let ids: std::collections::BTreeSet<u64> = got
        .lock()
        .expect("lock")
        .iter()
        .filter(|e| e["kind"] == "gpu_ecc_dbe")
        .filter_map(|e| e["id"].as_u64())
        .collect();
    assert_eq!(ids.len(), 1, "ECC events posted: {ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_rank_is_reported_stalled_and_a_chatty_one_is_not() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = NodeProc::new(root.path(), "s1", &[]);
    node.extra_env
        .push(("SHOAL_ANOMALY__STALL_AFTER_S".into(), "4".into()));
    node.bootstrap();
    let token = node.admin_token();
    let client = node.client(&token);
    let silent = client
        .submit_job(&sh_job(1, 1, "echo starting; sleep 120"))
        .await
        .expect("submit")
        .id;
    let chatty = client
        .submit_job(&sh_job(1, 1, "while true; do echo step; sleep 0.3; done"))
        .await
        .expect("submit")
        .id;
    for id in [silent, chatty] {
        wait_for("the jobs running", TIMEOUT, || {
            let c = client.clone();
            async move { c.job(id).await.ok().filter(|j| j.state == "running") }
        })
        .await;
    }
    let running = std::time::Instant::now();
    let event = first_event(&client, "job_stalled").await;
    eprintln!(
        "stalled job reported {:.2?} after it was running: {}",
        running.elapsed(),
        event.message
    );
    assert_eq!(event.job, Some(silent));
    assert_eq!(event.node.as_deref(), Some("s1"));
    assert!(event.message.contains("rank 0"), "{}", event.message);
    // Give the chatty job the same window again: it must never be reported.
    // It writes a line every 0.3 s; sixteen more lines span more than the
    // 4 s window, however slowly a loaded machine runs it.
    let lines = |log: Vec<u8>| log.split(|b| *b == b'\n').count();
    let before = lines(client.job_log(chatty, 0, 0).await.expect("log"));
    wait_for("sixteen more lines of the chatty job", TIMEOUT, || {
        let c = client.clone();
        async move {
            let now = lines(c.job_log(chatty, 0, 0).await.ok()?);
            (now >= before + 16).then_some(())
        }
    })
    .await;
    let events = client.events(0).await.expect("events");
    let stalled: Vec<_> = events.iter().filter(|e| e.kind == "job_stalled").collect();
    assert_eq!(stalled.len(), 1, "{stalled:?}");
    for id in [silent, chatty] {
        client.cancel_job(id).await.expect("cancel");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggler_rank_is_named_soon_after_it_falls_behind() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let window_ms = 1000u64;
    let (nodes, token) = start_cluster(root.path(), &["g1", "g2"], |_| {
        vec![(
            "SHOAL_ANOMALY__STRAGGLER_WINDOW_MS".to_string(),
            window_ms.to_string(),
        )]
    })
    .await;
    let client = nodes[0].client(&token);
    let id = client
        .submit_job(&sh_job(2, 1, "sleep 120"))
        .await
        .expect("submit")
        .id;
    let job = wait_for("the gang running", TIMEOUT, || {
        let c = client.clone();
        async move { c.job(id).await.ok().filter(|j| j.state == "running") }
    })
    .await;
    // Rank 1's node and GPU, from the rank order of the allocation.
    let rank1 = job.nodes[1].clone();
    let gpu = job.gpus[&rank1][0];
    let rank1_client = nodes
        .iter()
        .find(|n| n.name == rank1)
        .expect("rank 1's node")
        .client(&token);
    // Both ranks' GPUs must be busy before a slow one can stand out.
    for n in &nodes {
        let c = n.client(&token);
        let name = n.name.clone();
        wait_for("the gang's GPUs busy", TIMEOUT, || {
            let c = c.clone();
            let name = name.clone();
            async move {
                let text = c.metrics_text().await.ok()?;
                text.lines()
                    .filter(|l| {
                        l.starts_with("DCGM_FI_DEV_GPU_UTIL{")
                            && l.contains(&format!("shoal_job=\"{id}\""))
                            && l.contains(&format!("Hostname=\"{name}\""))
                    })
                    .any(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) > Some(80.0))
                    .then_some(())
            }
        })
        .await;
    }
    let injected = std::time::Instant::now();
    rank1_client.gpu_fault(gpu, "slow").await.expect("inject");
    let event = first_event(&client, "job_straggler").await;
    let latency = injected.elapsed();
    eprintln!(
        "straggler reported {latency:.2?} after the injection (window {window_ms} ms): {}",
        event.message
    );
    assert_eq!(event.job, Some(id));
    assert_eq!(event.node.as_deref(), Some(rank1.as_str()));
    assert!(event.message.contains("rank 1 "), "{}", event.message);
    // The simulated GPU needs ~0.75 s to fall below half its siblings'
    // utilization; then the window; then a second or so to detect, gossip
    // and commit — the bound leaves room for a loaded 2-core machine.
    assert!(
        latency < Duration::from_millis(window_ms + 8000),
        "took {latency:?}"
    );
    let events = client.events(0).await.expect("events");
    assert_eq!(
        events.iter().filter(|e| e.kind == "job_straggler").count(),
        1,
        "{events:?}"
    );
    client.cancel_job(id).await.expect("cancel");
}
