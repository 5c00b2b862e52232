//! Cross-region checkpoint copies and region failover, on spawned agents:
//! two regions of two nodes each. A job in us-1 with `--ckpt-replicas
//! 1+1` checkpoints a running sum; once a step is copied to eu-1, every
//! agent of us-1 is killed -9. eu-1 takes the job over after
//! `region_failover_after_ms`, waits out us-1's lease and resumes it from
//! the copied step to the sum an uninterrupted run reaches. When us-1
//! comes back it learns the job moved, ends its own copy `cancelled`, and
//! never starts one of its ranks again.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{one_at_a_time, shoal_bin, start_cluster, wait_for};
use shoal_sdk::{JobInfo, RegionInfo};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

/// Steps the job runs; an uninterrupted run ends with the sum 1 + … + 16.
const STEPS: u64 = 16;
const FINAL_SUM: u64 = STEPS * (STEPS + 1) / 2;

/// Summaries every 300 ms; lost after 3 s; a lease of 2 s.
fn region_env(region: &str) -> Vec<(String, String)> {
    [
        ("SHOAL_REGION", region),
        ("SHOAL_FEDERATION__SUMMARY_INTERVAL_MS", "300"),
        ("SHOAL_FEDERATION__UNREACHABLE_AFTER_MS", "2000"),
        ("SHOAL_FEDERATION__REQUEST_TIMEOUT_MS", "2000"),
        ("SHOAL_FEDERATION__REGION_LEASE_MS", "2000"),
        ("SHOAL_FEDERATION__REGION_FAILOVER_AFTER_MS", "3000"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn shoal(args: &[&str], api: &str, token: &str) -> (i32, String, String) {
    let out = Command::new(shoal_bin())
        .env_remove("SHOAL_API")
        .env("SHOAL_TOKEN", token)
        .arg("--api")
        .arg(api)
        .args(args)
        .output()
        .expect("run shoal");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

fn ok(args: &[&str], api: &str, token: &str) -> String {
    let (code, out, err) = shoal(args, api, token);
    assert_eq!(code, 0, "shoal {args:?} failed: {err}");
    out
}

fn jobs(api: &str, token: &str) -> Vec<JobInfo> {
    serde_json::from_str(&ok(&["--json", "queue", "--all"], api, token)).expect("queue JSON")
}

fn show(api: &str, token: &str, job: &str) -> JobInfo {
    serde_json::from_str(&ok(&["--json", "show", job], api, token)).expect("show JSON")
}

/// Rank launch markers under `dir` written after `since`.
fn launches_since(dir: &Path, since: SystemTime) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if entry
                .file_name()
                .to_string_lossy()
                .starts_with(".launched-e")
                && entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t > since)
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fails today: the step reaches eu-1 and us-1 is killed, but eu-1 does not take the job over within 60 s (issue 19, being debugged)"]
async fn a_job_resumes_in_another_region_from_its_copy_and_never_runs_twice() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (mut us, us_token) =
        start_cluster(root.path(), &["us1", "us2"], |_| region_env("us-1")).await;
    let (eu, eu_token) = start_cluster(root.path(), &["eu1", "eu2"], |_| region_env("eu-1")).await;
    let (us_api, eu_api) = (us[0].api_url(), eu[0].api_url());
    ok(
        &["federation", "join", &eu_api, "--token", &eu_token],
        &us_api,
        &us_token,
    );
    wait_for("us-1 to hear eu-1", Duration::from_secs(60), || {
        let rows: Vec<RegionInfo> =
            serde_json::from_str(&ok(&["--json", "regions"], &us_api, &us_token)).expect("regions");
        let heard = rows.iter().any(|r| r.name == "eu-1" && r.reachable);
        async move { heard.then_some(()) }
    })
    .await;

    let script = format!(
        "S=${{SHOAL_RESTORE_STEP:-0}}; SUM=0; \
         if [ \"$S\" -gt 0 ]; then SUM=$(cat \"$SHOAL_CKPT_DIR/$S/sum\"); fi; \
         echo \"start from=$S\"; \
         while [ \"$S\" -lt {STEPS} ]; do S=$((S+1)); SUM=$((SUM+S)); sleep 0.4; \
           D=\"$SHOAL_CKPT_DIR/$S\"; mkdir -p \"$D\"; echo $SUM > \"$D/sum\"; \
           head -c 300000 /dev/urandom > \"$D/noise\"; touch \"$D/.done\"; done; \
         echo \"final sum=$SUM\""
    );
    // Bad values are refused at the CLI, with one error line.
    let (code, _, err) = shoal(
        &["submit", "--ckpt-replicas", "2+2", "--", "true"],
        &us_api,
        &us_token,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("--ckpt-replicas"),
        "{err}"
    );
    let id = ok(
        &[
            "submit",
            "--name",
            "travel",
            "-N",
            "1",
            "--gpus-per-node",
            "1",
            "--ckpt-replicas",
            "1+1",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &us_api,
        &us_token,
    );

    // A step reaches eu-1 and `ckpt ls` says so.
    let copied: u64 = wait_for("a step copied to eu-1", Duration::from_secs(60), || {
        let out = ok(&["--json", "ckpt", "ls", &id], &us_api, &us_token);
        let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("ckpt JSON");
        let step = rows
            .iter()
            .filter(|r| {
                r["regions"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|v| v == "eu-1"))
            })
            .filter_map(|r| r["step"].as_u64())
            .max();
        async move { step }
    })
    .await;
    assert!(
        copied < STEPS,
        "the job ended before the test could cut it off"
    );

    // us-1 is lost: every agent killed -9 (with its ranks).
    let lost_at = Instant::now();
    for node in us.iter_mut() {
        node.kill9();
    }
    let moved = wait_for("eu-1 to take the job over", Duration::from_secs(60), || {
        let found = jobs(&eu_api, &eu_token)
            .into_iter()
            .find(|j| j.name == "travel");
        async move { found }
    })
    .await;
    assert!(moved.reason.contains("us-1"), "{}", moved.reason);
    let eu_id = moved.id.to_string();
    let running_after = wait_for("the job running in eu-1", Duration::from_secs(60), || {
        let s = show(&eu_api, &eu_token, &eu_id).state;
        async move { (s == "running" || s == "completed").then(|| lost_at.elapsed()) }
    })
    .await;
    eprintln!("us-1 lost; job running in eu-1 after {running_after:?}");
    assert!(
        running_after >= Duration::from_millis(2000),
        "started before us-1's lease ran out: {running_after:?}"
    );
    wait_for(
        "the job to complete in eu-1",
        Duration::from_secs(60),
        || {
            let s = show(&eu_api, &eu_token, &eu_id).state;
            async move { (s == "completed").then_some(()) }
        },
    )
    .await;
    let log = ok(&["logs", &eu_id], &eu_api, &eu_token);
    let from: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("start from="))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no start line in {log}"));
    assert!(
        from >= copied,
        "resumed from step {from}, but {copied} was copied: {log}"
    );
    assert!(
        log.contains(&format!("final sum={FINAL_SUM}")),
        "the resumed run must end where an uninterrupted one does: {log}"
    );

    // us-1 comes back: it ends its copy of the job and never launches it.
    let back = SystemTime::now();
    for node in us.iter_mut() {
        node.restart();
    }
    wait_for("us-1 to end the moved job", Duration::from_secs(60), || {
        let (code, out, _) = shoal(&["--json", "show", &id], &us_api, &us_token);
        let info: Option<JobInfo> = (code == 0)
            .then(|| serde_json::from_str(&out).ok())
            .flatten();
        async move { info.filter(|j| j.state == "cancelled") }
    })
    .await
    .reason
    .contains("moved to region eu-1")
    .then_some(())
    .expect("the reason names the region");
    for node in &us {
        let relaunched = launches_since(&node.data_dir, back);
        assert!(
            relaunched.is_empty(),
            "us-1 started a rank of the moved job again: {relaunched:?}"
        );
    }
}
