//! Two regions of spawned agents (us-1: one node, eu-1: two nodes, 4
//! simulated GPUs each): federation join (admin on both sides; a tenant
//! token is refused), `regions` converging, `submit --region auto` landing
//! where the capacity is, every job command forwarded with `REGION:ID` for
//! a tenant both regions share (an admin token acts in its own region
//! only), then eu-1 cut off: local work goes on, cross-region commands fail
//! fast naming the region, and the summaries mark it unreachable. And the
//! audit's attack: the peer's credential naming no tenant, or a tenant of
//! the same name that is local to each region, is refused.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{cli as shoal, cli_ok as ok, one_at_a_time, start_cluster, wait_for};
use shoal_sdk::{Client, JobInfo, RegionInfo, TenantRequest};
use std::time::{Duration, Instant};

/// Summaries every 300 ms; a region silent for 3 s is unreachable; one
/// cross-region request gets 2 s.
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

/// `shoal ARGS` against `api` with `token` as this region's credential.
fn regions(api: &str, token: &str) -> Vec<RegionInfo> {
    serde_json::from_str(&ok(&["--json", "regions"], api, token)).expect("regions JSON")
}

async fn wait_region(
    api: &str,
    token: &str,
    name: &str,
    what: &str,
    want: impl Fn(&RegionInfo) -> bool,
) {
    wait_for(what, Duration::from_secs(60), || {
        let rows = regions(api, token);
        let hit = rows.iter().any(|r| r.name == name && want(r));
        async move { hit.then_some(()) }
    })
    .await;
}

/// Makes `name` a tenant of region `home` shared across regions (a cap
/// of `gpus` GPUs in all regions together, far above what the test runs),
/// creating it unless it exists, and waits until each node of the other
/// region (`others`) has adopted it and read the home's summary naming it
/// (what such a node checks a forwarded request against), and the home has
/// read the other region's summary naming it (`--region auto` picks only
/// such regions). Returns a token of the tenant in the home region.
pub(crate) async fn share_tenant(
    home: &Client,
    home_region: &str,
    others: &[Client],
    name: &str,
    gpus: u32,
) -> String {
    let req = TenantRequest {
        name: name.into(),
        global_gpus: Some(gpus),
        ..Default::default()
    };
    let exists = home
        .tenants()
        .await
        .expect("tenants")
        .iter()
        .any(|t| t.name == name);
    if exists {
        home.set_tenant(&req).await.expect("tenant set");
    } else {
        home.create_tenant(&req).await.expect("tenant create");
    }
    let reported_by = |c: &Client, region: String| {
        let c = c.clone();
        let name = name.to_string();
        let home_region = home_region.to_string();
        async move {
            let tenants = c.global_tenants().await.ok()?;
            tenants
                .iter()
                .any(|t| {
                    t.tenant == name
                        && t.home == home_region
                        && t.regions.iter().any(|r| r.region == region && !r.local)
                })
                .then_some(())
        }
    };
    for c in others {
        wait_for(
            &format!("the other region to share tenant {name}"),
            Duration::from_secs(60),
            || reported_by(c, home_region.to_string()),
        )
        .await;
        wait_for(
            &format!("{home_region} to read that the other region holds {name}"),
            Duration::from_secs(60),
            || {
                let c = c.clone();
                let home = home.clone();
                let reported_by = &reported_by;
                async move {
                    let other = c.regions().await.ok()?.into_iter().find(|r| r.local)?.name;
                    reported_by(&home, other).await
                }
            },
        )
        .await;
    }
    home.create_api_token(&shoal_sdk::ApiTokenCreateRequest {
        name: Some(format!("{name}-shared")),
        tenant: Some(name.into()),
        ttl_s: None,
    })
    .await
    .expect("tenant token")
    .token
}

/// The secret a region presents to peer `peer`: held by each of the
/// region's nodes in its data directory (the others fetched it from the
/// node that made the join), and nowhere in the ledger (audit finding 5:
/// it was found in clear with `strings raft.redb` on a learner): a backup
/// holds only its hash, and no node's Raft store holds the secret.
async fn kept_secret(
    root: &std::path::Path,
    nodes: &[common::NodeProc],
    api: &str,
    token: &str,
    peer: &str,
) -> String {
    // `<data-dir>/federation/<peer>-<hash prefix>.secret`
    let file = |node: &common::NodeProc| -> Option<std::path::PathBuf> {
        std::fs::read_dir(node.data_dir.join("federation"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{peer}-")) && n.ends_with(".secret"))
            })
    };
    let mut secret = String::new();
    for node in nodes {
        let (path, held) = wait_for(
            &format!("{} to hold the secret for {peer}", node.name),
            Duration::from_secs(30),
            || {
                let found =
                    file(node).and_then(|p| std::fs::read_to_string(&p).ok().map(|held| (p, held)));
                async move { found }
            },
        )
        .await;
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).expect("stat").permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        if secret.is_empty() {
            secret = held.trim().to_string();
        }
        assert_eq!(held.trim(), secret, "{} holds another secret", node.name);
    }
    assert!(secret.starts_with("sa1."), "{secret}");
    let backup = root.join(format!("{}.ledger", nodes[0].name));
    ok(
        &["snapshot", "save", backup.to_str().expect("utf-8 path")],
        api,
        token,
    );
    let (_, saved) = shoal_node::backup::read_file(&backup).expect("the backup");
    assert_eq!(
        saved.ledger.federation.peers[peer].outbound_secret_hash,
        shoal_consensus::tokens::hash_secret(&secret)
    );
    assert!(
        !format!("{:?}", saved.ledger).contains(&secret),
        "the secret is in the ledger"
    );
    for node in nodes {
        let raft = std::fs::read(node.data_dir.join("raft.redb")).expect("raft.redb");
        assert!(
            !raft.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret is in {}'s raft.redb",
            node.name
        );
    }
    secret
}

fn show(api: &str, token: &str, job: &str) -> JobInfo {
    serde_json::from_str(&ok(&["--json", "show", job], api, token)).expect("show JSON")
}

async fn wait_job(api: &str, token: &str, job: &str, state: &str) {
    wait_for(
        &format!("job {job} {state}"),
        Duration::from_secs(60),
        || {
            let s = show(api, token, job).state;
            async move { (s == state).then_some(()) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_federate_forward_every_job_command_and_survive_a_lost_region() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (us, us_token) = start_cluster(root.path(), &["us1"], |_| region_env("us-1")).await;
    let (mut eu, eu_token) =
        start_cluster(root.path(), &["eu1", "eu2"], |_| region_env("eu-1")).await;
    let (us_api, eu_api) = (us[0].api_url(), eu[0].api_url());

    // A tenant token may neither join nor leave.
    let admin = us[0].client(&us_token);
    let tenant_token = common::tenant_with_token(&admin, "vision").await;
    let (code, _, err) = shoal(
        &["federation", "join", &eu_api, "--token", &eu_token],
        &us_api,
        &tenant_token,
    );
    assert_eq!(code, 1, "a tenant token must not join: {err}");
    assert!(err.starts_with("error: ") && err.contains("admin"), "{err}");
    let (code, _, err) = shoal(&["federation", "leave", "eu-1"], &us_api, &tenant_token);
    assert_eq!(code, 1, "a tenant token must not leave: {err}");
    // The checkpoint-copy routes answer a peer region's credential only:
    // an admin or tenant token is refused before the body is read.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("http client");
    for token in [&us_token, &tenant_token] {
        for (method, path) in [
            (reqwest::Method::POST, "/v1/federation/copies/missing"),
            (reqwest::Method::PUT, "/v1/federation/copies/chunks/00"),
            (reqwest::Method::POST, "/v1/federation/copies"),
        ] {
            let resp = http
                .request(method.clone(), format!("{us_api}{path}"))
                .bearer_auth(token)
                .body("{}")
                .send()
                .await
                .expect("request");
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap_or_default();
            assert_eq!(status, 403, "{method} {path}: {body}");
            assert!(body.contains("peer region"), "{body}");
        }
    }
    // Nor does a wrong token of the other region open it.
    let (code, _, err) = shoal(
        &["federation", "join", &eu_api, "--token", "sa1.not-a-token"],
        &us_api,
        &us_token,
    );
    assert_eq!(code, 1, "a bad peer token must be refused: {err}");
    assert!(err.contains("refused the join"), "{err}");

    // Admin on both sides: the regions federate and see each other.
    let joined = ok(
        &["federation", "join", &eu_api, "--token", &eu_token],
        &us_api,
        &us_token,
    );
    assert!(joined.contains("region eu-1"), "{joined}");
    let started = Instant::now();
    wait_region(
        &us_api,
        &us_token,
        "eu-1",
        "us-1 to see eu-1's 8 GPUs",
        |r| r.reachable && r.gpus_total == 8 && r.rtt_ms.is_some(),
    )
    .await;
    wait_region(
        &eu_api,
        &eu_token,
        "us-1",
        "eu-1 to see us-1's 4 GPUs",
        |r| r.reachable && r.gpus_total == 4,
    )
    .await;
    eprintln!("regions converged {:?} after the join", started.elapsed());
    let local = regions(&us_api, &us_token);
    assert!(
        local.iter().any(|r| r.name == "us-1" && r.local),
        "{local:?}"
    );

    // Work crosses regions on behalf of tenants both regions share: "lab"
    // and "vision", defined in us-1 and adopted by eu-1. An admin token
    // acts in its own region only.
    let eu_clients: Vec<Client> = eu.iter().map(|n| n.client(&eu_token)).collect();
    let lab_token = share_tenant(&admin, "us-1", &eu_clients, "lab", 64).await;
    share_tenant(&admin, "us-1", &eu_clients, "vision", 64).await;
    let eu_lab_token = eu_clients[0]
        .create_api_token(&shoal_sdk::ApiTokenCreateRequest {
            name: Some("lab-eu".into()),
            tenant: Some("lab".into()),
            ttl_s: None,
        })
        .await
        .expect("a token of lab in eu-1")
        .token;
    let (code, _, err) = shoal(&["queue", "--region", "eu-1"], &us_api, &us_token);
    assert_eq!(code, 1, "an admin token acted in another region: {err}");
    assert!(
        err.starts_with("error: permission denied") && err.contains("admin token"),
        "{err}"
    );

    // The credential us-1 holds for eu-1 (on its nodes' disks, not in
    // its ledger) forwards job commands for a shared tenant and reads the
    // summary there, and reaches no admin route. eu-1's for us-1 is kept
    // the same way, on both of its nodes.
    let peer_secret = kept_secret(root.path(), &us, &us_api, &us_token, "eu-1").await;
    kept_secret(root.path(), &eu, &eu_api, &eu_token, "us-1").await;
    let backup = root.path().join(format!("{}.ledger", us[0].name));
    let (_, saved) = shoal_node::backup::read_file(&backup).expect("the us-1 backup");
    let as_peer = |method: reqwest::Method, path: &str, tenant: Option<&str>| {
        let mut req = http
            .request(method, format!("{eu_api}{path}"))
            .bearer_auth(&peer_secret)
            .header("content-type", "application/json")
            .body("{}");
        if let Some(t) = tenant {
            req = req.header(shoal_sdk::TENANT_HEADER, t);
        }
        req.send()
    };
    let unscoped = as_peer(reqwest::Method::GET, "/v1/jobs", None)
        .await
        .expect("request");
    assert_eq!(
        unscoped.status().as_u16(),
        403,
        "the peer credential naming no tenant"
    );
    let listed = as_peer(reqwest::Method::GET, "/v1/jobs", Some("lab"))
        .await
        .expect("request");
    assert_eq!(
        listed.status().as_u16(),
        200,
        "the peer credential is valid"
    );
    for (method, path) in [
        (reqwest::Method::POST, "/v1/tokens"),
        (reqwest::Method::POST, "/v1/api-tokens/rotate-admin"),
        (reqwest::Method::POST, "/v1/nodes/eu2/remove"),
        (reqwest::Method::POST, "/v1/nodes/eu2/drain"),
        (reqwest::Method::POST, "/v1/tenants"),
        (reqwest::Method::POST, "/v1/users"),
        (reqwest::Method::POST, "/v1/attrs"),
        (reqwest::Method::POST, "/v1/ca/rotate"),
        (reqwest::Method::GET, "/v1/snapshot"),
        (reqwest::Method::POST, "/v1/federation/join"),
        (reqwest::Method::POST, "/v1/federation/regions/us-1/leave"),
        (
            reqwest::Method::POST,
            "/v1/federation/regions/us-1/failover",
        ),
        (reqwest::Method::POST, "/v1/objects"),
        (reqwest::Method::POST, "/v1/jobs/1/requeue"),
    ] {
        for tenant in [None, Some("lab")] {
            let resp = as_peer(method.clone(), path, tenant)
                .await
                .expect("request");
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap_or_default();
            assert_eq!(
                status, 403,
                "{method} {path} with a peer region's credential: {body}"
            );
            assert!(body.contains("may forward job commands"), "{body}");
        }
    }

    // Another region's objects: ls, stat and rm of mesh://eu-1/PATH are
    // forwarded; a copy to or from there is refused with how to reach it;
    // a tenant sees and removes only its own there too.
    let notes = root.path().join("notes.txt");
    std::fs::write(&notes, b"kept in eu-1").expect("write notes");
    let notes_s = notes.to_str().expect("utf-8 path");
    ok(
        &["cp", "--replica", "2", notes_s, "mesh:/notes"],
        &eu_api,
        &eu_lab_token,
    );
    let listed: Vec<serde_json::Value> =
        serde_json::from_str(&ok(&["ls", "--json", "mesh://eu-1/"], &us_api, &lab_token))
            .expect("ls JSON");
    assert!(listed.iter().any(|o| o["path"] == "/notes"), "{listed:?}");
    let stat: serde_json::Value = serde_json::from_str(&ok(
        &["stat", "--json", "mesh://eu-1/notes"],
        &us_api,
        &lab_token,
    ))
    .expect("stat JSON");
    assert_eq!(stat["bytes"], 12, "{stat}");
    copy_across_regions(
        root.path(),
        &us_api,
        &lab_token,
        &tenant_token,
        &eu_api,
        &eu_token,
    )
    .await;
    let seen: Vec<serde_json::Value> = serde_json::from_str(&ok(
        &["ls", "--json", "mesh://eu-1/"],
        &us_api,
        &tenant_token,
    ))
    .expect("ls JSON");
    assert!(
        seen.is_empty(),
        "a tenant sees another's object there: {seen:?}"
    );
    let (code, _, err) = shoal(&["rm", "mesh://eu-1/notes"], &us_api, &tenant_token);
    assert_eq!(code, 1, "a tenant removed another's object: {err}");
    ok(&["rm", "mesh://eu-1/notes"], &us_api, &lab_token);
    let left: Vec<serde_json::Value> =
        serde_json::from_str(&ok(&["ls", "--json", "mesh:/"], &eu_api, &eu_token))
            .expect("ls JSON");
    assert!(left.iter().all(|o| o["path"] != "/notes"), "{left:?}");

    // eu-1 rotates its CA: us-1 learns the new one from eu-1's summaries
    // while the old one still vouches for it, and reaches eu-1 after the
    // old one retired (a fresh TLS client: it is keyed by the CAs trusted).
    let eu_ca = |args: &[&str]| -> serde_json::Value {
        serde_json::from_str(&ok(args, &eu_api, &eu_token)).expect("ca JSON")
    };
    let rotated = eu_ca(&["ca", "rotate", "--json"]);
    let new_ca = rotated["new_fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_string();
    let eu_trusts = wait_for("eu-1's CA rotation done", Duration::from_secs(60), || {
        let s = eu_ca(&["ca", "status", "--json"]);
        let done = s["phase"] == "stable" && s["signing_fingerprint"] == new_ca.as_str();
        async move { done.then(|| s["trusted_pem"].as_str().unwrap_or_default().to_string()) }
    })
    .await;
    let before_ca = saved.ledger.federation.peers["eu-1"].ca_cert_pem.clone();
    assert_ne!(before_ca.trim_end(), eu_trusts.trim_end());
    wait_for(
        "us-1 to record eu-1's new CA",
        Duration::from_secs(30),
        || {
            ok(
                &["snapshot", "save", backup.to_str().expect("utf-8 path")],
                &us_api,
                &us_token,
            );
            let learned = shoal_node::backup::read_file(&backup)
                .map(|(_, l)| l.ledger.federation.peers["eu-1"].ca_cert_pem.clone())
                .unwrap_or_default();
            let hit = learned.trim_end() == eu_trusts.trim_end();
            async move { hit.then_some(()) }
        },
    )
    .await;
    let after: Vec<serde_json::Value> =
        serde_json::from_str(&ok(&["ls", "--json", "mesh://eu-1/"], &us_api, &lab_token))
            .expect("ls JSON");
    assert!(after.iter().all(|o| o["path"] != "/notes"), "{after:?}");
    wait_region(
        &us_api,
        &us_token,
        "eu-1",
        "eu-1 reachable after its rotation",
        |r| r.reachable && r.last_summary_age_ms.is_some_and(|a| a < 1_000),
    )
    .await;

    // --near: among regions where the job fits now, its data's region
    // wins over the submitter's.
    let near = ok(
        &[
            "submit",
            "--region",
            "auto",
            "--near",
            "mesh://eu-1/datasets/shard-0",
            "-N",
            "1",
            "--gpus-per-node",
            "1",
            "--",
            "true",
        ],
        &us_api,
        &lab_token,
    );
    assert!(
        near.starts_with("eu-1:"),
        "--near eu-1 must place there, got {near}"
    );
    wait_job(&us_api, &lab_token, &near, "completed").await;
    for (args, says) in [
        (
            vec!["submit", "--near", "mesh://eu-1/d", "--", "true"],
            "--region auto",
        ),
        (
            vec![
                "submit", "--region", "auto", "--near", "/data", "--", "true",
            ],
            "--near wants",
        ),
        (
            vec![
                "submit",
                "--region",
                "auto",
                "--near",
                "mesh://mars-1/d",
                "--",
                "true",
            ],
            "mars-1",
        ),
    ] {
        let (code, _, err) = shoal(&args, &us_api, &lab_token);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{args:?}: {err}"
        );
    }

    // auto with room here: the job stays here (a plain id).
    let here = ok(
        &[
            "submit",
            "--region",
            "auto",
            "-N",
            "1",
            "--gpus-per-node",
            "4",
            "--",
            "sleep",
            "600",
        ],
        &us_api,
        &lab_token,
    );
    let here_id: u64 = here
        .parse()
        .unwrap_or_else(|_| panic!("a plain local id, got {here}"));
    wait_job(&us_api, &lab_token, &here_id.to_string(), "running").await;
    // us-1 is full now: auto sends the next 4-GPU gang to eu-1.
    let there = ok(
        &[
            "submit",
            "--region",
            "auto",
            "-N",
            "1",
            "--gpus-per-node",
            "4",
            "--",
            "sh",
            "-c",
            "echo hello-from-eu; sleep 600",
        ],
        &us_api,
        &lab_token,
    );
    assert!(
        there.starts_with("eu-1:"),
        "auto must place in eu-1, got {there}"
    );
    wait_job(&us_api, &lab_token, &there, "running").await;
    let info = show(&us_api, &lab_token, &there);
    assert_eq!(info.region.as_deref(), Some("eu-1"));
    assert!(info.nodes[0].starts_with("eu"), "{info:?}");

    // Every job command, forwarded.
    let explicit = ok(
        &[
            "submit",
            "--region",
            "eu-1",
            "-N",
            "1",
            "--gpus-per-node",
            "1",
            "--",
            "true",
        ],
        &us_api,
        &lab_token,
    );
    assert!(explicit.starts_with("eu-1:"), "{explicit}");
    let queue: Vec<JobInfo> = serde_json::from_str(&ok(
        &["--json", "queue", "-a", "--region", "eu-1"],
        &us_api,
        &lab_token,
    ))
    .expect("queue JSON");
    let there_id: u64 = there["eu-1:".len()..].parse().expect("id");
    assert!(
        queue
            .iter()
            .any(|j| j.id == there_id && j.region.as_deref() == Some("eu-1")),
        "{queue:?}"
    );
    let merged: Vec<JobInfo> = serde_json::from_str(&ok(
        &["--json", "queue", "--all-regions"],
        &us_api,
        &lab_token,
    ))
    .expect("merged queue JSON");
    assert!(
        merged.iter().any(|j| j.id == here_id && j.region.is_none()),
        "{merged:?}"
    );
    assert!(
        merged
            .iter()
            .any(|j| j.id == there_id && j.region.as_deref() == Some("eu-1")),
        "{merged:?}"
    );
    wait_for("the forwarded log", Duration::from_secs(30), || {
        let (code, out, _) = shoal(&["logs", &there], &us_api, &lab_token);
        async move { (code == 0 && out.contains("hello-from-eu")).then_some(()) }
    })
    .await;
    ok(&["--json", "ckpt", "ls", &there], &us_api, &lab_token);
    ok(&["cancel", &there], &us_api, &lab_token);
    wait_job(&us_api, &lab_token, &there, "cancelled").await;
    // The tenant token's forwarded requests stay within its tenant.
    let (code, _, err) = shoal(&["show", &there], &us_api, &tenant_token);
    assert_eq!(
        code, 1,
        "another tenant's job must stay hidden across regions: {err}"
    );

    // eu-1 is lost: its agents die.
    for n in eu.iter_mut() {
        n.kill9();
    }
    let t0 = Instant::now();
    let (code, _, err) = shoal(&["show", &there], &us_api, &lab_token);
    let took = t0.elapsed();
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: region eu-1 did not answer"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(took < Duration::from_secs(10), "the failure took {took:?}");
    let (code, _, err) = shoal(
        &[
            "submit",
            "--region",
            "eu-1",
            "-N",
            "1",
            "--gpus-per-node",
            "1",
            "--",
            "true",
        ],
        &us_api,
        &lab_token,
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("region eu-1"), "{err}");
    let t0 = Instant::now();
    let (code, _, err) = shoal(&["cp", notes_s, "mesh://eu-1/late"], &us_api, &lab_token);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("region eu-1 did not answer"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    wait_region(
        &us_api,
        &us_token,
        "eu-1",
        "us-1 to mark eu-1 unreachable",
        |r| !r.reachable,
    )
    .await;
    // Local work goes on, `auto` included: it never picks the lost region.
    ok(&["cancel", &here_id.to_string()], &us_api, &us_token);
    wait_job(&us_api, &lab_token, &here_id.to_string(), "cancelled").await;
    let after = ok(
        &[
            "submit",
            "--region",
            "auto",
            "-N",
            "1",
            "--gpus-per-node",
            "2",
            "--",
            "true",
        ],
        &us_api,
        &lab_token,
    );
    let after_id: u64 = after
        .parse()
        .unwrap_or_else(|_| panic!("a local id, got {after}"));
    wait_job(&us_api, &lab_token, &after_id.to_string(), "completed").await;
    let (code, _, err) = shoal(&["--json", "queue", "--all-regions"], &us_api, &lab_token);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("region eu-1 left out"), "{err}");

    // Leaving a lost region still forgets it here.
    let left = ok(&["federation", "leave", "eu-1"], &us_api, &us_token);
    assert!(left.contains("left region eu-1"), "{left}");
    let rows = regions(&us_api, &us_token);
    assert_eq!(rows.len(), 1, "{rows:?}");
}

/// The audit's attack on federation: the credential a region presents to
/// its peer (in us-1's ledger, so in its backups) used without a tenant
/// acted as an admin of eu-1 (listed every tenant's jobs, cancelled them,
/// submitted at priority 2,000,000,000, removed objects), and a tenant
/// token of us-1 acted as eu-1's tenant of the same name. Now the
/// credential acts only for a tenant both regions share (one with caps
/// across regions, the same name under the same home region), and only on
/// the forwarding routes; a same-named local tenant is another tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_credential_acts_only_for_a_tenant_both_regions_share() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (us, us_token) = start_cluster(root.path(), &["us1"], |_| region_env("us-1")).await;
    let (eu, eu_token) = start_cluster(root.path(), &["eu1"], |_| region_env("eu-1")).await;
    let (us_api, eu_api) = (us[0].api_url(), eu[0].api_url());
    let (us_admin, eu_admin) = (us[0].client(&us_token), eu[0].client(&eu_token));
    ok(
        &["federation", "join", &eu_api, "--token", &eu_token],
        &us_api,
        &us_token,
    );
    // "lab" is shared (defined in us-1, adopted by eu-1); "vision" is a
    // local tenant of each region, one name for two tenants.
    let lab_token = share_tenant(
        &us_admin,
        "us-1",
        std::slice::from_ref(&eu_admin),
        "lab",
        64,
    )
    .await;
    let vision_token = common::tenant_with_token(&us_admin, "vision").await;
    eu_admin
        .create_tenant(&TenantRequest {
            name: "vision".into(),
            ..Default::default()
        })
        .await
        .expect("eu-1's own vision");
    // eu-1's work: one job each of lab, vision and the admin's default
    // tenant, and an object of the default tenant.
    let mut ids = std::collections::BTreeMap::new();
    for tenant in ["lab", "vision", "default"] {
        let mut job = common::sh_job(1, 1, "sleep 600");
        job.tenant = Some(tenant.into());
        let id = eu_admin.submit_job(&job).await.expect("submit").id;
        ids.insert(tenant, id);
    }
    let notes = root.path().join("notes.txt");
    std::fs::write(&notes, b"kept in eu-1").expect("write notes");
    ok(
        &[
            "cp",
            "--replica",
            "1",
            notes.to_str().expect("utf-8 path"),
            "mesh:/notes",
        ],
        &eu_api,
        &eu_token,
    );

    // The credential us-1 presents to eu-1, as whoever holds the data
    // directory of a us-1 node has it.
    let peer_secret = kept_secret(root.path(), &us, &us_api, &us_token, "eu-1").await;
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("http client");
    let as_peer = |method: reqwest::Method, path: String, tenant: Option<&str>, body: String| {
        let mut req = http
            .request(method, format!("{eu_api}{path}"))
            .bearer_auth(&peer_secret)
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = tenant {
            req = req.header(shoal_sdk::TENANT_HEADER, t);
        }
        async move {
            let resp = req.send().await.expect("request");
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap_or_default())
        }
    };
    let mut greedy = common::sh_job(1, 1, "true");
    greedy.priority = 2_000_000_000;
    let greedy = serde_json::to_string(&greedy).expect("job JSON");
    let attacks = || -> Vec<(reqwest::Method, String, String)> {
        let vision = ids["vision"];
        let default = ids["default"];
        vec![
            (reqwest::Method::GET, "/v1/jobs".into(), String::new()),
            (
                reqwest::Method::GET,
                format!("/v1/jobs/{vision}"),
                String::new(),
            ),
            (
                reqwest::Method::GET,
                format!("/v1/jobs/{vision}/logs"),
                String::new(),
            ),
            (
                reqwest::Method::POST,
                format!("/v1/jobs/{default}/cancel"),
                "{}".into(),
            ),
            (
                reqwest::Method::POST,
                format!("/v1/jobs/{vision}/cancel"),
                "{}".into(),
            ),
            (reqwest::Method::POST, "/v1/jobs".into(), greedy.clone()),
            (
                reqwest::Method::GET,
                "/v1/objects?path=/".into(),
                String::new(),
            ),
            (
                reqwest::Method::POST,
                "/v1/objects/rm".into(),
                r#"{"path":"/notes"}"#.into(),
            ),
        ]
    };

    // 1. The peer credential naming no tenant: refused on every forwarding
    // route, saying why.
    for (method, path, body) in attacks() {
        let (status, text) = as_peer(method.clone(), path.clone(), None, body).await;
        assert_eq!(
            status, 403,
            "{method} {path} as the peer with no tenant: {text}"
        );
        assert!(
            text.contains("only on behalf of a tenant both regions share"),
            "{text}"
        );
    }
    // 2. Naming eu-1's "vision", which is local to eu-1 (us-1's "vision" is
    // another tenant): refused too, whether us-1 sends it (a release
    // without the check, or the credential in other hands) ...
    for (method, path, body) in attacks() {
        let (status, text) = as_peer(method.clone(), path.clone(), Some("vision"), body).await;
        assert_eq!(
            status, 403,
            "{method} {path} as the peer for vision: {text}"
        );
        assert!(text.contains("not shared across regions"), "{text}");
    }
    // ... or us-1's own vision token asks us-1 to forward: us-1 refuses.
    for args in [
        vec!["queue", "-a", "--region", "eu-1"],
        vec!["show", &format!("eu-1:{}", ids["vision"])],
        vec!["cancel", &format!("eu-1:{}", ids["vision"])],
        vec!["ls", "mesh://eu-1/"],
    ] {
        let (code, _, err) = shoal(&args, &us_api, &vision_token);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: permission denied")
                && err.contains("tenant 'vision' is local to region us-1"),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // An admin of us-1 acts in us-1 only: `--region eu-1` is refused with
    // the reason, and `--region auto` keeps the job here.
    let (code, _, err) = shoal(&["queue", "--region", "eu-1"], &us_api, &us_token);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: permission denied") && err.contains("admin token"),
        "{err}"
    );
    let here = ok(
        &[
            "submit",
            "--region",
            "auto",
            "-N",
            "1",
            "--gpus-per-node",
            "1",
            "--",
            "true",
        ],
        &us_api,
        &us_token,
    );
    assert!(
        here.parse::<u64>().is_ok(),
        "an admin's auto job stays here: {here}"
    );
    // Nothing of eu-1 was touched.
    let jobs = eu_admin.jobs(None, None).await.expect("eu-1 jobs");
    assert_eq!(jobs.len(), 3, "no job was added: {jobs:?}");
    assert!(
        jobs.iter()
            .all(|j| j.state != "cancelled" && j.priority < 1_000_000),
        "{jobs:?}"
    );
    assert!(
        eu_admin
            .objects("/")
            .await
            .expect("objects")
            .iter()
            .any(|o| o.path == "/notes"),
        "the object was removed"
    );

    // 4. A checkpoint copy (what `--ckpt-replicas L+R` sends, and what
    // this region would run as the copy's tenant when it takes the job
    // over): refused for no tenant and for a tenant local to eu-1; for the
    // shared tenant, it may name only chunks it sends (eu-1's `/notes`,
    // of its default tenant, is not one), and a chunk eu-1 holds for
    // someone else is asked for, never answered as held.
    let notes_chunks = {
        let object = eu_admin.objects("/notes").await.expect("notes");
        let manifest_bytes = hex::decode(&object[0].manifest_hex).expect("hex");
        let manifest =
            shoal_storage::manifest::Manifest::from_bytes(&manifest_bytes).expect("manifest");
        let ids: Vec<String> = manifest
            .unique_chunks()
            .iter()
            .map(|c| c.id.to_string())
            .collect();
        (manifest_bytes, ids)
    };
    let listed = serde_json::json!({ "chunks": notes_chunks.1 }).to_string();
    for tenant in [None, Some("vision"), Some("default")] {
        let (status, text) = as_peer(
            reqwest::Method::POST,
            "/v1/federation/copies/missing".into(),
            tenant,
            listed.clone(),
        )
        .await;
        assert_eq!(status, 403, "a copy for {tenant:?}: {text}");
    }
    let (status, text) = as_peer(
        reqwest::Method::POST,
        "/v1/federation/copies/missing".into(),
        Some("lab"),
        listed.clone(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let missing: shoal_sdk::ChunkList = serde_json::from_str(&text).expect("chunk list");
    assert_eq!(
        missing.chunks, notes_chunks.1,
        "eu-1 told the peer it holds another tenant's chunk"
    );
    let forged = |tenant: &str| {
        let checkpoint = shoal_consensus::workload::Checkpoint {
            step: 1,
            epoch: 1,
            ranks: 1,
            parts: [(
                0,
                shoal_consensus::workload::CkptPart {
                    manifest: notes_chunks.0.clone(),
                    bytes: 12,
                    holders: vec![1],
                },
            )]
            .into(),
            committed_at_ms: Some(1),
            regions: Vec::new(),
        };
        let spec = shoal_consensus::workload::JobSpec {
            tenant: tenant.into(),
            ..Default::default()
        };
        serde_json::to_string(&shoal_node::regions::copy::CopyRequest {
            origin_job: 7,
            spec,
            checkpoint,
            origin_index: 1,
        })
        .expect("copy JSON")
    };
    for (named, job_of, why) in [
        ("lab", "lab", "was not sent in this copy"),
        ("lab", "default", "of a job of tenant 'default'"),
        ("default", "default", "not shared across regions"),
    ] {
        let (status, text) = as_peer(
            reqwest::Method::POST,
            "/v1/federation/copies".into(),
            Some(named),
            forged(job_of),
        )
        .await;
        assert_eq!(status, 403, "a copy of {job_of}'s job for {named}: {text}");
        assert!(text.contains(why), "{text}");
    }

    // 3. The shared tenant works across regions as before, within itself.
    let (status, text) = as_peer(
        reqwest::Method::GET,
        "/v1/jobs".into(),
        Some("lab"),
        String::new(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let listed: Vec<JobInfo> = serde_json::from_str(&text).expect("jobs JSON");
    assert!(
        listed.iter().all(|j| j.tenant == "lab") && listed.iter().any(|j| j.id == ids["lab"]),
        "{listed:?}"
    );
    let queue: Vec<JobInfo> = serde_json::from_str(&ok(
        &["--json", "queue", "-a", "--region", "eu-1"],
        &us_api,
        &lab_token,
    ))
    .expect("queue JSON");
    assert_eq!(
        queue.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids["lab"]],
        "{queue:?}"
    );
    let lab_job = format!("eu-1:{}", ids["lab"]);
    ok(&["cancel", &lab_job], &us_api, &lab_token);
    wait_job(&us_api, &lab_token, &lab_job, "cancelled").await;
    let (code, _, err) = shoal(
        &["cancel", &format!("eu-1:{}", ids["vision"])],
        &us_api,
        &lab_token,
    );
    assert_eq!(code, 1, "lab cancelled vision's job: {err}");
    let submitted = ok(
        &[
            "submit",
            "--region",
            "eu-1",
            "-N",
            "1",
            "--gpus-per-node",
            "1",
            "--",
            "true",
        ],
        &us_api,
        &lab_token,
    );
    assert!(submitted.starts_with("eu-1:"), "{submitted}");
    assert_eq!(show(&us_api, &lab_token, &submitted).tenant, "lab");
    // And the priority a lab token may not give is refused there too.
    let (code, _, err) = shoal(
        &[
            "submit",
            "--region",
            "eu-1",
            "--priority",
            "2000000000",
            "--",
            "true",
        ],
        &us_api,
        &lab_token,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("priority 2000000000 is above the cap of tenant 'lab'"),
        "{err}"
    );

    // 5. us-1 shares its "vision" now: eu-1's own "vision" stays eu-1's
    // (a name is no identity across regions) until an admin of eu-1 makes
    // it the shared one.
    let (code, _, err) = shoal(
        &["tenant", "adopt", "vision", "--from", "us-1"],
        &eu_api,
        &eu_token,
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("shares no tenant 'vision'"), "{err}");
    ok(
        &["tenant", "set", "vision", "--global-gpus", "4"],
        &us_api,
        &us_token,
    );
    // "marker", shared after vision, is adopted by eu-1 from a summary at
    // least as new as the one that first shared vision.
    share_tenant(
        &us_admin,
        "us-1",
        std::slice::from_ref(&eu_admin),
        "marker",
        4,
    )
    .await;
    let shared_here = |c: Client| async move {
        c.global_tenants()
            .await
            .expect("global tenants")
            .into_iter()
            .find(|t| t.tenant == "vision")
            .map(|t| t.home)
    };
    assert_eq!(
        shared_here(eu_admin.clone()).await,
        None,
        "eu-1's own vision was taken over by us-1's"
    );
    let (status, text) = as_peer(
        reqwest::Method::GET,
        "/v1/jobs".into(),
        Some("vision"),
        String::new(),
    )
    .await;
    assert_eq!(status, 403, "{text}");
    // A tenant token cannot consent; an admin of eu-1 can.
    let vision_here = eu_admin
        .create_api_token(&shoal_sdk::ApiTokenCreateRequest {
            name: Some("vision-eu".into()),
            tenant: Some("vision".into()),
            ttl_s: None,
        })
        .await
        .expect("a token of eu-1's vision")
        .token;
    let (code, _, err) = shoal(
        &["tenant", "adopt", "vision", "--from", "us-1"],
        &eu_api,
        &vision_here,
    );
    assert_eq!(code, 1, "a tenant token consented: {err}");
    let said = ok(
        &["tenant", "adopt", "vision", "--from", "us-1"],
        &eu_api,
        &eu_token,
    );
    assert!(said.contains("vision@us-1"), "{said}");
    assert_eq!(shared_here(eu_admin.clone()).await.as_deref(), Some("us-1"));
}

/// `shoal cp` to and from eu-1's objects, run against us-1: a download
/// reads every chunk through one node of eu-1; an upload sends each chunk
/// once to one node there, which copies it to `--replica` nodes of eu-1 and
/// records the object; a tenant reads none of another's data, not even a
/// chunk by id.
async fn copy_across_regions(
    root: &std::path::Path,
    us_api: &str,
    us_token: &str,
    tenant_token: &str,
    eu_api: &str,
    eu_token: &str,
) {
    let path = |name: &str| root.join(name).to_str().expect("utf-8 path").to_string();
    let back = path("back");
    ok(&["cp", "mesh://eu-1/notes", &back], us_api, us_token);
    assert_eq!(std::fs::read(&back).expect("read back"), b"kept in eu-1");
    let (code, _, err) = shoal(
        &["cp", "mesh://eu-1/notes", &path("stolen")],
        us_api,
        tenant_token,
    );
    assert_eq!(code, 1, "a tenant read another's object there: {err}");
    assert!(
        err.starts_with("error: permission denied")
            && !std::path::Path::new(&path("stolen")).exists(),
        "{err}"
    );
    let listed: Vec<shoal_sdk::ObjectInfo> = serde_json::from_str(&ok(
        &["ls", "--json", "mesh://eu-1/notes"],
        us_api,
        us_token,
    ))
    .expect("ls JSON");
    let notes = listed.first().expect("notes listed");
    let manifest = shoal_storage::manifest::Manifest::from_bytes(
        &hex::decode(&notes.manifest_hex).expect("hex"),
    )
    .expect("manifest");
    let chunk = manifest.unique_chunks()[0].id.to_string();
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("http client");
    for (token, want) in [(us_token, 200), (tenant_token, 404)] {
        let resp = http
            .get(format!("{us_api}/v1/chunks/{chunk}"))
            .query(&[("from", notes.replicas[0])])
            .header(shoal_sdk::REGION_HEADER, "eu-1")
            .bearer_auth(token)
            .send()
            .await
            .expect("chunk request");
        assert_eq!(resp.status().as_u16(), want, "{:?}", resp.text().await);
    }

    // 9 MiB of incompressible bytes: three chunks.
    let big = path("big.bin");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..9 * (1 << 20) + 17)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&big, &data).expect("write big.bin");
    let upload = |force: bool| -> serde_json::Value {
        let mut args = vec!["--json", "cp", "--replica", "2"];
        if force {
            args.push("--force");
        }
        args.extend([big.as_str(), "mesh://eu-1/data/big.bin"]);
        serde_json::from_str(&ok(&args, us_api, us_token)).expect("cp JSON")
    };
    let first = upload(false);
    let chunks = first["chunks"].as_u64().expect("chunks");
    assert!(chunks >= 3, "{first}");
    assert_eq!(
        first["chunks_sent"], chunks,
        "each chunk crosses once: {first}"
    );
    let sent = first["bytes_sent"].as_u64().expect("bytes_sent");
    assert!(
        sent >= data.len() as u64 && sent < data.len() as u64 + 4096,
        "one copy crosses the WAN, not one per replica: {first}"
    );
    // eu-1's own ledger lists two of its nodes, and its nodes serve it.
    let stat: serde_json::Value = serde_json::from_str(&ok(
        &["stat", "--json", "mesh:/data/big.bin"],
        eu_api,
        eu_token,
    ))
    .expect("stat JSON");
    let holders = stat["replicas"].as_array().expect("replicas").clone();
    assert_eq!(holders.len(), 2, "{stat}");
    assert_ne!(holders[0], holders[1], "{stat}");
    assert_eq!(stat["healthy"], true, "{stat}");
    let there = path("big-from-eu");
    ok(&["cp", "mesh:/data/big.bin", &there], eu_api, eu_token);
    assert!(
        std::fs::read(&there).expect("read") == data,
        "eu-1's copy differs"
    );
    let here = path("big-via-us");
    ok(&["cp", "mesh://eu-1/data/big.bin", &here], us_api, us_token);
    assert!(
        std::fs::read(&here).expect("read") == data,
        "the copy back differs"
    );
    // Unchanged data sends nothing again.
    let again = upload(true);
    assert_eq!(again["bytes_sent"], 0, "{again}");
    assert_eq!(again["deduplicated"], chunks, "{again}");
    // Errors, one line each, nothing recorded: more copies than eu-1 has
    // nodes; an existing destination; mesh to mesh across regions.
    for (args, says) in [
        (
            vec![
                "cp",
                "--replica",
                "3",
                big.as_str(),
                "mesh://eu-1/data/three",
            ],
            "only 2 live node(s) for --replica 3",
        ),
        (
            vec!["cp", big.as_str(), "mesh://eu-1/data/big.bin"],
            "already exists",
        ),
        (
            vec!["cp", "mesh://eu-1/data/big.bin", "mesh:/copy"],
            "through a local path",
        ),
    ] {
        let (code, _, err) = shoal(&args, us_api, us_token);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let (code, _, _) = shoal(&["stat", "mesh://eu-1/data/three"], us_api, us_token);
    assert_eq!(code, 1, "a refused copy recorded an object");
    ok(&["rm", "mesh://eu-1/data/big.bin"], us_api, us_token);
}
