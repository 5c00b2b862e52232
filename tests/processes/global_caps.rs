//! A tenant capped across two regions of spawned agents (us-1 and eu-1,
//! one node of 4 simulated GPUs each; the cap, 4 GPUs, is half of them):
//! defined once in its home region, adopted by the other; its share moves
//! to where its jobs wait and back when they end there; the GPUs it holds
//! in both regions together never pass the cap, and while the regions
//! cannot hear each other neither side raises its share.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{cli_ok as ok, one_at_a_time, sh_job, start_cluster, wait_for};
use shoal_sdk::{Client, GlobalTenantRegion};
use std::time::{Duration, Instant};

const CAP: u32 = 4;
const TIMEOUT: Duration = Duration::from_secs(60);
/// A grant takes at least two summary rounds to move (the giver's round,
/// then the receiver's read of it), so two reads this close together see
/// shares that were in force at one instant or, at worst, a grant counted
/// by neither side.
const SUMMARY_MS: u64 = 300;
const SAME_INSTANT: Duration = Duration::from_millis(SUMMARY_MS);

fn region_env(region: &str) -> Vec<(String, String)> {
    [
        ("SHOAL_REGION", region),
        ("SHOAL_FEDERATION__SUMMARY_INTERVAL_MS", "300"),
        ("SHOAL_FEDERATION__UNREACHABLE_AFTER_MS", "3000"),
        ("SHOAL_FEDERATION__REQUEST_TIMEOUT_MS", "2000"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Tenant "lab" in the answering region, as that region holds it.
async fn here(client: &Client) -> Option<GlobalTenantRegion> {
    let tenants = client.global_tenants().await.ok()?;
    let lab = tenants.into_iter().find(|t| t.tenant == "lab")?;
    lab.regions.into_iter().find(|r| r.local)
}

/// Both regions' figures, read close enough together to count as one
/// instant (else `None`); asserts the cap on what they show.
async fn both(us: &Client, eu: &Client) -> Option<(GlobalTenantRegion, GlobalTenantRegion)> {
    let started = Instant::now();
    let u = here(us).await?;
    let e = here(eu).await?;
    if started.elapsed() >= SAME_INSTANT {
        return None;
    }
    assert!(
        u.share.unwrap_or(0) + e.share.unwrap_or(0) <= CAP,
        "shares {} + {} above the cap of {CAP}",
        u.share.unwrap_or(0),
        e.share.unwrap_or(0)
    );
    assert!(
        u.in_use + e.in_use <= CAP,
        "{} + {} GPUs held, above the cap of {CAP}",
        u.in_use,
        e.in_use
    );
    assert!(
        u.in_use <= u.share.unwrap_or(0) && e.in_use <= e.share.unwrap_or(0),
        "{u:?} {e:?}"
    );
    Some((u, e))
}

async fn wait_both(
    us: &Client,
    eu: &Client,
    what: &str,
    want: impl Fn(&GlobalTenantRegion, &GlobalTenantRegion) -> bool,
) {
    wait_for(what, TIMEOUT, || async {
        let (u, e) = both(us, eu).await?;
        want(&u, &e).then_some(())
    })
    .await;
}

async fn submit(client: &Client, count: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    for _ in 0..count {
        let mut job = sh_job(1, 1, "sleep 600");
        job.tenant = Some("lab".into());
        ids.push(client.submit_job(&job).await.expect("submit").id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_cap_follows_demand_across_regions_and_is_never_exceeded() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (us_nodes, us_token) = start_cluster(root.path(), &["us1"], |_| region_env("us-1")).await;
    let (mut eu_nodes, eu_token) =
        start_cluster(root.path(), &["eu1"], |_| region_env("eu-1")).await;
    let (us_api, eu_api) = (us_nodes[0].api_url(), eu_nodes[0].api_url());
    let us = us_nodes[0].client(&us_token);
    let eu = eu_nodes[0].client(&eu_token);
    ok(
        &["federation", "join", &eu_api, "--token", &eu_token],
        &us_api,
        &us_token,
    );

    // Defined once, in its home region; the other region adopts it.
    let created = ok(
        &[
            "tenant",
            "create",
            "lab",
            "--global-gpus",
            "4",
            "--weight",
            "3",
        ],
        &eu_api,
        &eu_token,
    );
    assert!(created.contains("lab"), "{created}");
    wait_for("us-1 to adopt lab from eu-1", TIMEOUT, || async {
        let tenants = us.global_tenants().await.ok()?;
        tenants
            .iter()
            .any(|t| t.tenant == "lab" && t.home == "eu-1" && t.gpus == Some(CAP))
            .then_some(())
    })
    .await;
    let adopted = us.tenants().await.expect("tenants");
    let lab = adopted
        .iter()
        .find(|t| t.name == "lab")
        .expect("lab in us-1");
    assert_eq!(lab.weight, 3, "the home's definition");
    // Only the home changes the cap.
    let (code, _, err) = common::cli(
        &["tenant", "set", "lab", "--global-gpus", "8"],
        &us_api,
        &us_token,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("eu-1") && err.contains("set them there"),
        "{err}"
    );

    // Jobs wait in us-1 only: the idle home grants it the whole cap.
    let us_jobs = submit(&us, 4).await;
    wait_both(&us, &eu, "us-1 to run 4 GPUs of lab", |u, _| {
        u.in_use == CAP
    })
    .await;

    // Then eu-1 has work too, but us-1 uses every GPU of the cap: eu-1's
    // jobs wait, saying why.
    let eu_jobs = submit(&eu, 2).await;
    wait_for("eu-1's jobs to say why they wait", TIMEOUT, || async {
        let job = eu.job(eu_jobs[0]).await.ok()?;
        (job.state == "pending" && job.reason.contains("global cap of 4")).then_some(job)
    })
    .await;
    both(&us, &eu).await;

    // Two of us-1's jobs end: their share goes to eu-1, where work waits.
    for id in &us_jobs[..2] {
        us.cancel_job(*id).await.expect("cancel");
    }
    wait_both(&us, &eu, "eu-1 to run 2 GPUs of lab", |u, e| {
        e.in_use == 2 && u.in_use == 2
    })
    .await;
    let table = ok(&["tenant", "global"], &us_api, &us_token);
    assert!(
        table.contains("lab") && table.contains("eu-1") && table.contains("us-1 (here)"),
        "{table}"
    );

    // eu-1 cut off (its agent stopped): us-1 frees a GPU and has more work
    // waiting, but does not raise its share past what it held at the cut.
    let (u_before, _) = loop {
        if let Some(pair) = both(&us, &eu).await {
            break pair;
        }
    };
    let eu_pid = eu_nodes[0].pid().expect("eu-1 agent pid") as i32;
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(eu_pid, libc::SIGSTOP);
    }
    us.cancel_job(us_jobs[2]).await.expect("cancel");
    submit(&us, 2).await;
    let cut_until = Instant::now() + Duration::from_millis(4 * 3000 / 2);
    let mut rows_seen = 0;
    while Instant::now() < cut_until {
        let u = here(&us).await.expect("us-1 answers while eu-1 is cut off");
        assert!(
            u.share.unwrap_or(0) <= u_before.share.unwrap_or(0)
                && u.in_use <= u_before.share.unwrap_or(0),
            "us-1 took share while it could not hear eu-1: {u:?}, before {u_before:?}"
        );
        rows_seen += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rows_seen > 10);
    let unreachable = us.global_tenants().await.expect("global tenants");
    assert!(
        unreachable[0]
            .regions
            .iter()
            .any(|r| r.region == "eu-1" && !r.reachable),
        "{unreachable:?}"
    );
    // SAFETY: as above.
    unsafe {
        libc::kill(eu_pid, libc::SIGCONT);
    }
    // Healed: us-1's waiting jobs run as far as the cap allows once the
    // regions hear each other again (eu-1's ranks may have been fenced
    // while its agent was stopped, freeing its share).
    wait_both(
        &us,
        &eu,
        "us-1's waiting jobs to get the cap's room",
        |u, e| u.demand == 0 || u.in_use + e.in_use == CAP,
    )
    .await;

    // A budget across regions is set at home and adopted the same way.
    ok(
        &["tenant", "set", "lab", "--global-gpu-hours", "100"],
        &eu_api,
        &eu_token,
    );
    wait_for("us-1 to adopt lab's budget", TIMEOUT, || async {
        let tenants = us.global_tenants().await.ok()?;
        let lab = tenants.into_iter().find(|t| t.tenant == "lab")?;
        let mine = lab.regions.iter().find(|r| r.local)?;
        (lab.gpu_hours == Some(100.0) && mine.gpu_hours_share.is_some_and(|h| h > 0.0))
            .then_some(())
    })
    .await;
    for n in eu_nodes.iter_mut() {
        n.kill9();
    }
}
