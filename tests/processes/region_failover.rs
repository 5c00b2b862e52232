//! Cross-region checkpoint copies and region failover, on spawned agents:
//! two regions of two nodes each. A job in us-1 with `--ckpt-replicas
//! 1+1`, of a tenant both regions share (another region takes copies of
//! no other), checkpoints a running sum; once a step is copied to eu-1, every
//! agent of us-1 is killed -9. eu-1 takes the job over after
//! `region_failover_after_ms`, waits out us-1's lease and resumes it from
//! the copied step to the sum an uninterrupted run reaches. When us-1
//! comes back it learns the job moved, ends its own copy `cancelled`, and
//! never starts one of its ranks again. An operator's `shoal federation
//! failover us-1` moves the job while us-1 still answers, and the two runs
//! never overlap.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{cli as shoal, cli_ok as ok, one_at_a_time, start_cluster, wait_for};
use shoal_sdk::{JobInfo, RegionInfo};
use std::path::Path;
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

/// Two federated regions of two agents each, and a token of tenant
/// "travel", defined in us-1 with a cap of 4 GPUs across regions and
/// adopted by eu-1.
struct TwoRegions {
    us: Vec<common::NodeProc>,
    us_token: String,
    eu: Vec<common::NodeProc>,
    eu_token: String,
    travel_token: String,
}

impl TwoRegions {
    async fn start(root: &Path) -> TwoRegions {
        let (us, us_token) = start_cluster(root, &["us1", "us2"], |_| region_env("us-1")).await;
        let (eu, eu_token) = start_cluster(root, &["eu1", "eu2"], |_| region_env("eu-1")).await;
        let (us_api, eu_api) = (us[0].api_url(), eu[0].api_url());
        ok(
            &["federation", "join", &eu_api, "--token", &eu_token],
            &us_api,
            &us_token,
        );
        wait_for("us-1 to hear eu-1", Duration::from_secs(60), || {
            let rows: Vec<RegionInfo> =
                serde_json::from_str(&ok(&["--json", "regions"], &us_api, &us_token))
                    .expect("regions");
            let heard = rows.iter().any(|r| r.name == "eu-1" && r.reachable);
            async move { heard.then_some(()) }
        })
        .await;
        let (us_admin, eu_admin) = (us[0].client(&us_token), eu[0].client(&eu_token));
        let travel_token = crate::federation::share_tenant(
            &us_admin,
            "us-1",
            std::slice::from_ref(&eu_admin),
            "travel",
            4,
        )
        .await;
        TwoRegions {
            us,
            us_token,
            eu,
            eu_token,
            travel_token,
        }
    }

    /// Waits until eu-1's share of tenant travel's cap admits the job
    /// (one GPU): a region cut off from the home raises no share, so what
    /// eu-1 holds when us-1 is lost is what it can run.
    async fn wait_eu_share(&self) {
        let eu_admin = self.eu[0].client(&self.eu_token);
        wait_for("eu-1's share of travel", Duration::from_secs(60), || {
            let eu_admin = eu_admin.clone();
            async move {
                let tenants = eu_admin.global_tenants().await.ok()?;
                let travel = tenants.into_iter().find(|t| t.tenant == "travel")?;
                let here = travel.regions.into_iter().find(|r| r.local)?;
                (here.share.unwrap_or(0) >= 1).then_some(())
            }
        })
        .await;
    }

    fn us_api(&self) -> String {
        self.us[0].api_url()
    }

    fn eu_api(&self) -> String {
        self.eu[0].api_url()
    }

    /// Submits the running-sum job to us-1 with one copy in another
    /// region; every step it reaches is appended, with the wall clock in
    /// ms and the node's name, to `ticks`.
    fn submit_travel(&self, ticks: &Path) -> String {
        let script = format!(
            "S=${{SHOAL_RESTORE_STEP:-0}}; SUM=0; \
             if [ \"$S\" -gt 0 ]; then SUM=$(cat \"$SHOAL_CKPT_DIR/$S/sum\"); fi; \
             echo \"start from=$S\"; \
             while [ \"$S\" -lt {STEPS} ]; do S=$((S+1)); SUM=$((SUM+S)); sleep 0.4; \
               echo \"$(date +%s%3N) $SHOAL_NODE $S\" >> {ticks}; \
               D=\"$SHOAL_CKPT_DIR/$S\"; mkdir -p \"$D\"; echo $SUM > \"$D/sum\"; \
               head -c 300000 /dev/urandom > \"$D/noise\"; touch \"$D/.done\"; done; \
             echo \"final sum=$SUM\"",
            ticks = ticks.display()
        );
        ok(
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
            &self.us_api(),
            &self.travel_token,
        )
    }

    /// The latest step of `id` that `ckpt ls` in us-1 shows in eu-1.
    async fn wait_copied(&self, id: &str) -> u64 {
        let (api, token) = (self.us_api(), self.us_token.clone());
        let copied: u64 = wait_for("a step copied to eu-1", Duration::from_secs(60), || {
            let out = ok(&["--json", "ckpt", "ls", id], &api, &token);
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
        copied
    }

    /// Waits for the taken-over job in eu-1 to complete, and checks it
    /// resumed from a copied step and reached an uninterrupted run's sum.
    async fn wait_completed_in_eu(&self, eu_id: &str, copied: u64) {
        let (api, token) = (self.eu_api(), self.eu_token.clone());
        wait_for(
            "the job to complete in eu-1",
            Duration::from_secs(60),
            || {
                let s = show(&api, &token, eu_id).state;
                async move { (s == "completed").then_some(()) }
            },
        )
        .await;
        let log = ok(&["logs", eu_id], &api, &token);
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
    }

    /// Waits for us-1 to end its own copy of `id` as moved to eu-1.
    async fn wait_moved_in_us(&self, id: &str) {
        let (api, token) = (self.us_api(), self.us_token.clone());
        wait_for("us-1 to end the moved job", Duration::from_secs(60), || {
            let (code, out, _) = shoal(&["--json", "show", id], &api, &token);
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
    }
}

/// The steps each run reached, from the ticks file: (wall ms, node name)
/// per line.
fn ticks(path: &Path) -> Vec<(u64, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.to_string()))
        })
        .collect()
}

/// Every tick of the run in eu-1 comes after every tick of the run in
/// us-1: the two never ran at once.
fn assert_never_overlapped(path: &Path) {
    let all = ticks(path);
    let in_us = |node: &str| node.starts_with("us");
    let last_us = all.iter().filter(|(_, d)| in_us(d)).map(|(t, _)| *t).max();
    let first_eu = all.iter().filter(|(_, d)| !in_us(d)).map(|(t, _)| *t).min();
    let (Some(last_us), Some(first_eu)) = (last_us, first_eu) else {
        panic!("both regions must have run the job: {all:?}");
    };
    assert!(
        first_eu > last_us,
        "eu-1 ran a step at {first_eu} ms before us-1's last at {last_us} ms: {all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_resumes_in_another_region_from_its_copy_and_never_runs_twice() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let mut regions = TwoRegions::start(root.path()).await;
    let (us_api, us_token) = (regions.us_api(), regions.us_token.clone());
    let (eu_api, eu_token) = (regions.eu_api(), regions.eu_token.clone());

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
    // Another region keeps copies only of a shared tenant's jobs: the
    // admin's default tenant is local to us-1.
    let (code, _, err) = shoal(
        &["submit", "--ckpt-replicas", "1+1", "--", "true"],
        &us_api,
        &us_token,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: --ckpt-replicas")
            && err.contains("tenant 'default' is local")
            && err.lines().count() == 1,
        "{err}"
    );
    let tick_file = root.path().join("ticks");
    let id = regions.submit_travel(&tick_file);
    let copied = regions.wait_copied(&id).await;
    regions.wait_eu_share().await;

    // us-1 is lost: every agent killed -9 (with its ranks).
    let lost_at = Instant::now();
    for node in regions.us.iter_mut() {
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
    regions.wait_completed_in_eu(&eu_id, copied).await;
    assert_never_overlapped(&tick_file);

    // us-1 comes back: it ends its copy of the job and never launches it.
    let back = SystemTime::now();
    for node in regions.us.iter_mut() {
        node.restart();
    }
    regions.wait_moved_in_us(&id).await;
    for node in &regions.us {
        let relaunched = launches_since(&node.data_dir, back);
        assert!(
            relaunched.is_empty(),
            "us-1 started a rank of the moved job again: {relaunched:?}"
        );
    }
}

/// An operator moves a job out of a region that still answers: the origin
/// learns it from the next summary and kills its rank before the taking
/// region's wait ends, so the two runs never overlap. Only an admin token
/// may do it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_failover_moves_a_live_job_without_overlap() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let regions = TwoRegions::start(root.path()).await;
    let (eu_api, eu_token) = (regions.eu_api(), regions.eu_token.clone());
    let tick_file = root.path().join("ticks");
    let id = regions.submit_travel(&tick_file);
    let copied = regions.wait_copied(&id).await;

    // A tenant token of the holding region may not move work.
    let admin = regions.eu[0].client(&eu_token);
    let tenant_token = common::tenant_with_token(&admin, "vision").await;
    let (code, _, err) = shoal(&["federation", "failover", "us-1"], &eu_api, &tenant_token);
    assert_eq!(code, 1, "a tenant token must not fail a region over: {err}");
    assert!(err.starts_with("error: ") && err.contains("admin"), "{err}");
    let (code, _, err) = shoal(&["federation", "failover", "mars-1"], &eu_api, &eu_token);
    assert_eq!(code, 1, "an unknown region: {err}");
    assert!(
        err.starts_with("error: ") && err.contains("mars-1"),
        "{err}"
    );

    let out: serde_json::Value = serde_json::from_str(&ok(
        &["--json", "federation", "failover", "us-1"],
        &eu_api,
        &eu_token,
    ))
    .expect("failover JSON");
    let adopted = out["adopted"].as_array().expect("adopted list");
    assert_eq!(adopted.len(), 1, "{out}");
    assert_eq!(
        adopted[0]["origin_job"].as_u64().map(|j| j.to_string()),
        Some(id.clone()),
        "{out}"
    );
    let eu_id = adopted[0]["job"].as_u64().expect("job id").to_string();
    // Asked again, there is nothing left to take over.
    let again: serde_json::Value = serde_json::from_str(&ok(
        &["--json", "federation", "failover", "us-1"],
        &eu_api,
        &eu_token,
    ))
    .expect("failover JSON");
    assert_eq!(
        again["adopted"].as_array().map(Vec::len),
        Some(0),
        "{again}"
    );

    regions.wait_moved_in_us(&id).await;
    regions.wait_completed_in_eu(&eu_id, copied).await;
    assert_never_overlapped(&tick_file);
}
