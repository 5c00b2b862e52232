//! Reads are scoped like writes: every API route asked with no token, an
//! admin token, tenant A's, tenant B's and the token of A's child tenant.
//! A tenant sees its own subtree's jobs, logs, checkpoints, events, quotas,
//! objects and chunks, and nothing of another tenant — not even an id or a
//! name in an error message. Asking for another tenant's job answers as if
//! it did not exist, and is an audit event; an admin's override of a
//! tenant's ledger limit is what the tenant's next command is held to.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use shoal_node::agent::testkit::LocalCluster;
use shoal_node::cli::cp::{cp, CpArgs};
use shoal_sdk::{ApiTokenCreateRequest, Client, JobSubmitRequest, TenantRequest};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

fn tenant(name: &str, parent: Option<&str>) -> TenantRequest {
    TenantRequest {
        name: name.into(),
        parent: parent.map(String::from),
        ..TenantRequest::default()
    }
}

async fn token_for(admin: &Client, tenant: &str) -> String {
    admin
        .create_api_token(&ApiTokenCreateRequest {
            name: Some(format!("{tenant}-token")),
            tenant: Some(tenant.into()),
            ..ApiTokenCreateRequest::default()
        })
        .await
        .expect("token")
        .token
}

/// A one-GPU job that prints its name and sleeps, submitted with `client`.
async fn job(client: &Client, tenant: &str, name: &str) -> u64 {
    let mut req = JobSubmitRequest::shell(1, 1, &format!("echo {name}; exec sleep 600"));
    req.name = name.into();
    req.tenant = Some(tenant.into());
    client.submit_job(&req).await.expect("submit").id
}

/// Status and body of `GET path` with `token`.
async fn get(base: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let http = reqwest::Client::new();
    let mut req = http.get(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_each_token_with_its_own_tenants_work_only() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(1, |_, _| {}).await.expect("cluster");
    let admin = c.client(0);
    let base = c.agents[0].api_url();
    for (name, parent) in [
        ("alpha", None),
        ("alpha-sub", Some("alpha")),
        ("beta", None),
    ] {
        admin
            .create_tenant(&tenant(name, parent))
            .await
            .expect("tenant");
    }
    // Caps across regions for both roots: each token sees its own only.
    for name in ["alpha", "beta"] {
        admin
            .set_tenant(&shoal_sdk::TenantRequest {
                name: name.into(),
                global_gpus: Some(1000),
                ..Default::default()
            })
            .await
            .expect("global cap");
    }
    let a = token_for(&admin, "alpha").await;
    let sub = token_for(&admin, "alpha-sub").await;
    let b = token_for(&admin, "beta").await;
    let as_a = Client::new(base.clone(), Some(a.clone()));
    let as_sub = Client::new(base.clone(), Some(sub.clone()));
    let as_b = Client::new(base.clone(), Some(b.clone()));
    let a_job = job(&as_a, "alpha", "secret-alpha-run").await;
    let sub_job = job(&as_sub, "alpha-sub", "alpha-sub-run").await;
    let b_job = job(&as_b, "beta", "beta-run").await;

    // Every job running (its log exists), an event about A's job, and an
    // object of A's whose chunk a token may or may not fetch.
    common::wait_for("every job running", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let jobs = admin.jobs(None, None).await.ok()?;
            if jobs.iter().filter(|j| j.state == "running").count() < 3 {
                return None;
            }
            // Running in the ledger is not yet launched by the executor.
            for id in [a_job, sub_job, b_job] {
                admin.job_log(id, 0, 0).await.ok()?;
            }
            Some(())
        }
    })
    .await;
    let a_gpu = admin
        .nodes()
        .await
        .expect("nodes")
        .iter()
        .flat_map(|n| n.gpus.iter())
        .find(|g| g.allocated_to == Some(a_job))
        .map(|g| g.index)
        .expect("A's GPU");
    admin.gpu_fault(a_gpu, "xid:79").await.expect("fault");
    common::wait_for("an event about A's job", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let events = admin.events(0).await.ok()?;
            events.iter().any(|e| e.job == Some(a_job)).then_some(())
        }
    })
    .await;
    let file = c.root().join("alpha-weights.bin");
    std::fs::write(&file, b"alpha's weights, not beta's").expect("write");
    let upload = CpArgs {
        replica: 1,
        recursive: false,
        force: false,
        allow_degraded: true,
        paths: vec![file.display().to_string(), "mesh:/alpha/weights.bin".into()],
    };
    cp(&as_a, &upload, true).await.expect("upload");
    let object = admin.objects("/alpha/weights.bin").await.expect("object");
    let manifest = shoal_storage::manifest::Manifest::from_bytes(
        &hex::decode(&object[0].manifest_hex).expect("hex"),
    )
    .expect("manifest");
    let chunk = manifest.unique_chunks()[0].id.to_string();

    // (route, admin, A, A's child, B); no token is always 401.
    let routes: Vec<(String, [u16; 4])> = vec![
        ("/v1/status".into(), [200, 200, 200, 200]),
        ("/v1/nodes".into(), [200, 200, 200, 200]),
        ("/v1/peers".into(), [200, 200, 200, 200]),
        ("/v1/jobs".into(), [200, 200, 200, 200]),
        (format!("/v1/jobs/{a_job}"), [200, 200, 404, 404]),
        (format!("/v1/jobs/{sub_job}"), [200, 200, 200, 404]),
        (format!("/v1/jobs/{b_job}"), [200, 404, 404, 200]),
        (format!("/v1/jobs/{a_job}/logs"), [200, 200, 404, 404]),
        (format!("/v1/jobs/{b_job}/logs"), [200, 404, 404, 200]),
        (
            format!("/v1/jobs/{a_job}/checkpoints"),
            [200, 200, 404, 404],
        ),
        ("/v1/jobs/999999".into(), [404, 404, 404, 404]),
        ("/v1/tenants".into(), [200, 200, 200, 200]),
        ("/v1/quota".into(), [200, 200, 200, 200]),
        ("/v1/global-tenants".into(), [200, 200, 200, 200]),
        ("/v1/events".into(), [200, 200, 200, 200]),
        ("/v1/attrs".into(), [200, 403, 403, 403]),
        ("/v1/tokens".into(), [200, 403, 403, 403]),
        ("/v1/api-tokens".into(), [200, 403, 403, 403]),
        // Audit finding 7: it names other tenants with their caps.
        ("/v1/federation/summary".into(), [200, 403, 403, 403]),
        ("/v1/objects?path=/".into(), [200, 200, 200, 200]),
        (format!("/v1/chunks/{chunk}"), [200, 200, 404, 404]),
    ];
    let tokens = [
        Some(admin_token(&c)),
        Some(a.clone()),
        Some(sub.clone()),
        Some(b.clone()),
    ];
    let mut bodies: Vec<Vec<String>> = vec![Vec::new(); 4];
    let mut wrong = Vec::new();
    for (path, expected) in &routes {
        let (status, _) = get(&base, path, None).await;
        if status != 401 {
            wrong.push(format!("{path} without a token: {status}"));
        }
        for (who, token) in tokens.iter().enumerate() {
            let (status, body) = get(&base, path, token.as_deref()).await;
            if status != expected[who] {
                wrong.push(format!(
                    "{path} as token {who}: {status} (want {}): {body}",
                    expected[who]
                ));
            }
            bodies[who].push(body);
        }
    }
    assert!(
        wrong.is_empty(),
        "unexpected answers:\n{}",
        wrong.join("\n")
    );

    // Nothing of A's reaches B, nothing of the parent or of B reaches the child.
    let leaks = |who: usize, marks: &[String]| -> Vec<String> {
        bodies[who]
            .iter()
            .zip(&routes)
            .filter_map(|(body, (path, _))| {
                marks
                    .iter()
                    .find(|m| body.contains(m.as_str()))
                    .map(|m| format!("{path} shows {m}"))
            })
            .collect()
    };
    let a_marks = [
        "secret-alpha-run".to_string(),
        "\"alpha\"".to_string(),
        "alpha-sub".to_string(),
        format!("\"allocated_to\":{a_job}"),
        format!("\"job\":{a_job}"),
        "/alpha/weights.bin".to_string(),
    ];
    let b_events = &bodies[3][routes
        .iter()
        .position(|(p, _)| p == "/v1/events")
        .expect("route")];
    assert_eq!(
        leaks(3, &a_marks),
        Vec::<String>::new(),
        "B sees A's work: {b_events}"
    );
    let not_for_child = [
        "secret-alpha-run".to_string(),
        format!("\"job\":{a_job}"),
        format!("\"job\":{b_job}"),
        "beta".to_string(),
        "/alpha/weights.bin".to_string(),
    ];
    assert_eq!(
        leaks(2, &not_for_child),
        Vec::<String>::new(),
        "the child sees too much"
    );
    // Audit finding 6: whether some tenant stores given content is no
    // one else's to learn (chunk ids are the BLAKE3 of their content).
    let ids = vec![chunk.clone()];
    assert_eq!(admin.has_chunks(&ids).await.expect("has"), vec![true]);
    assert_eq!(as_a.has_chunks(&ids).await.expect("has"), vec![true]);
    assert_eq!(as_b.has_chunks(&ids).await.expect("has"), vec![false]);
    // Audit finding 6: B names A's chunk in a manifest of its own without
    // ever sending it. Refused; the chunk stays A's alone.
    let forged = shoal_sdk::ObjectPut {
        path: "/beta/stolen.bin".into(),
        is_dir: false,
        manifest_hex: object[0].manifest_hex.clone(),
        bytes: object[0].bytes,
        files: object[0].files,
        holders: object[0].replicas.clone(),
        replica: 1,
        tenant: None,
        replace: false,
    };
    let refused = as_b
        .put_object(&forged)
        .await
        .expect_err("a chunk B never sent");
    assert!(
        refused
            .to_string()
            .contains("was not uploaded by tenant 'beta'"),
        "{refused}"
    );
    assert!(as_b.chunk(&chunk).await.is_err(), "B reads A's chunk");
    // With the content in hand, B sends it (told it is missing) and may
    // then name it: it proved it holds the content.
    let mine = c.root().join("beta-copy.bin");
    std::fs::write(&mine, b"alpha's weights, not beta's").expect("write");
    let upload = CpArgs {
        replica: 1,
        recursive: false,
        force: false,
        allow_degraded: true,
        paths: vec![mine.display().to_string(), "mesh:/beta/copy.bin".into()],
    };
    cp(&as_b, &upload, true).await.expect("B's own upload");
    assert_eq!(as_b.has_chunks(&ids).await.expect("has"), vec![true]);
    assert!(as_b.chunk(&chunk).await.is_ok(), "B reads what it sent");
    // A sees its own subtree; the admin sees everyone.
    let a_jobs = as_a.jobs(None, None).await.expect("jobs");
    let mut ids: Vec<u64> = a_jobs.iter().map(|j| j.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![a_job, sub_job]);
    assert_eq!(as_b.jobs(Some("alpha"), None).await.expect("jobs").len(), 0);
    assert!(as_a
        .events(0)
        .await
        .expect("events")
        .iter()
        .any(|e| e.job == Some(a_job)));
    assert_eq!(admin.jobs(None, None).await.expect("jobs").len(), 3);
    // Admin actions and refused requests are audit events, for admins only.
    // Cancelling another tenant's job answers like cancelling none.
    let refused = as_b
        .cancel_job(a_job)
        .await
        .expect_err("another tenant's job");
    let missing = as_b.cancel_job(999_999).await.expect_err("no such job");
    let answer = |e: &shoal_sdk::ClientError| match e {
        shoal_sdk::ClientError::Api {
            status,
            code,
            message,
        } => (*status, code.clone(), message.clone()),
        other => panic!("{other}"),
    };
    assert_eq!(
        answer(&refused),
        (409, "rejected".to_string(), format!("no job {a_job}"))
    );
    assert_eq!(
        answer(&missing),
        (409, "rejected".to_string(), "no job 999999".to_string())
    );
    let refused = as_b
        .create_tenant(&tenant("beta-sub", Some("beta")))
        .await
        .expect_err("admin only");
    assert!(
        refused.to_string().contains("needs an admin token"),
        "{refused}"
    );
    let audit = common::wait_for("the audit events", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let audit: Vec<String> = admin
                .events(0)
                .await
                .ok()?
                .into_iter()
                .filter(|e| e.kind == "audit")
                .map(|e| e.message)
                .collect();
            let want = [
                "token 'beta-token' of tenant 'beta': POST /v1/jobs/{id}/cancel refused: another tenant's job, answered as not found (409)",
                "token 'beta-token' of tenant 'beta': POST /v1/tenants refused (403)",
                "token 'beta-token' of tenant 'beta': GET /v1/jobs/{id} refused: another tenant's job, answered as not found (404)",
                "token 'alpha-sub-token' of tenant 'alpha-sub': GET /v1/jobs/{id}/logs refused: another tenant's job, answered as not found (404)",
            ];
            (want.iter().all(|w| audit.iter().any(|m| m == w))
                && audit.iter().any(|m| m.ends_with("POST /v1/tenants done")))
            .then_some(audit)
        }
    })
    .await;
    // The hidden job is named for the admin; a job that does not exist is
    // not an attempt on anyone's.
    let events = admin.events(0).await.expect("events");
    let cancel = events
        .iter()
        .find(|e| e.kind == "audit" && e.message.contains("/cancel refused"))
        .expect("the refused cancel");
    assert_eq!(
        cancel.resource.as_deref(),
        Some(format!("job {a_job} of tenant 'alpha'").as_str())
    );
    assert!(
        events
            .iter()
            .all(|e| !e.resource.as_deref().unwrap_or("").contains("999999")),
        "a missing job audited: {events:?}"
    );
    assert!(
        audit.iter().all(|m| !m.contains("sa1.")),
        "a secret in {audit:?}"
    );
    assert!(
        as_b.events(0)
            .await
            .expect("events")
            .iter()
            .all(|e| e.kind != "audit"),
        "a tenant sees audit events"
    );

    // /metrics needs no token, so it names no tenant unless asked to.
    let (status, metrics) = get(&base, "/metrics", None).await;
    assert_eq!(status, 200);
    assert!(metrics.contains("shoal_jobs{"), "{metrics}");
    assert!(
        !metrics.contains("tenant=\""),
        "tenant labels on /metrics:\n{metrics}"
    );

    // Hostile metadata is refused with one line naming the limit, and
    // nothing is stored.
    let bad = shoal_sdk::ObjectPut {
        path: "/alpha/bad".into(),
        is_dir: false,
        manifest_hex: "00".into(),
        bytes: 1,
        files: 1,
        holders: vec![1],
        replica: 1,
        tenant: None,
        replace: false,
    };
    let err = as_a
        .put_object(&bad)
        .await
        .expect_err("undecodable manifest");
    assert!(err.to_string().contains("invalid manifest"), "{err}");
    assert!(admin
        .objects("/alpha/bad")
        .await
        .map(|o| o.is_empty())
        .unwrap_or(true));
    let mut huge = JobSubmitRequest::shell(1, 1, "true");
    huge.env = (0..200).map(|i| (format!("K{i}"), "v".into())).collect();
    let err = as_a
        .submit_job(&huge)
        .await
        .expect_err("too many env entries");
    assert!(
        err.to_string()
            .contains("limit: the job has 200 env entries"),
        "{err}"
    );
    assert_eq!(admin.jobs(None, None).await.expect("jobs").len(), 3);

    // A token asking again and again, for any of another tenant's jobs, is
    // counted on one audit event per route (per minute), not recorded anew.
    let hidden_read = "token 'beta-token' of tenant 'beta': GET /v1/jobs/{id} refused: another tenant's job, answered as not found (404)";
    for _ in 0..20 {
        for id in [a_job, sub_job] {
            let (status, _) = get(&base, &format!("/v1/jobs/{id}"), Some(&b)).await;
            assert_eq!(status, 404);
        }
    }
    let hidden: Vec<shoal_sdk::EventInfo> =
        common::wait_for("the counted hidden reads", TIMEOUT, || {
            let admin = admin.clone();
            async move {
                let hidden: Vec<_> = admin
                    .events(0)
                    .await
                    .ok()?
                    .into_iter()
                    .filter(|e| e.message == hidden_read)
                    .collect();
                let seen: u64 = hidden.iter().map(|e| 1 + e.repeats).sum();
                (seen > 40).then_some(hidden)
            }
        })
        .await;
    // Two when a minute's window ended in between.
    assert!(hidden.len() <= 2, "{hidden:?}");

    // Audit finding 7: a tenant walking the admin routes recorded one event
    // per route and pushed the operators' records out of the 1,000-event
    // log. Now each caller has 16 distinct refusal records a minute on a
    // node (beta used 9 above), then one that says it was cut off.
    let http = reqwest::Client::new();
    let admin_routes = [
        ("POST", "/v1/nodes/1/remove"),
        ("POST", "/v1/nodes/1/drain"),
        ("POST", "/v1/nodes/1/undrain"),
        ("POST", "/v1/nodes/1/gpus/0/drain"),
        ("POST", "/v1/nodes/1/gpus/0/undrain"),
        ("POST", "/v1/tokens"),
        ("POST", "/v1/tokens/revoke"),
        ("POST", "/v1/api-tokens/revoke"),
        ("POST", "/v1/api-tokens/rotate-admin"),
        ("POST", "/v1/attrs"),
        ("POST", "/v1/ca/rotate"),
        ("POST", "/v1/users"),
        ("POST", "/v1/tenants/beta"),
        ("POST", "/v1/debug/gpu-fault"),
        ("GET", "/v1/attrs"),
        ("GET", "/v1/tokens"),
        ("GET", "/v1/api-tokens"),
        ("GET", "/v1/ca"),
        ("GET", "/v1/snapshot"),
        ("GET", "/v1/federation/summary"),
    ];
    for (method, path) in admin_routes {
        let req = match method {
            "GET" => http.get(format!("{base}{path}")),
            _ => http
                .post(format!("{base}{path}"))
                .json(&serde_json::json!({})),
        };
        let status = req.bearer_auth(&b).send().await.expect("request").status();
        assert_eq!(status.as_u16(), 403, "{method} {path}");
    }
    let beta_records = common::wait_for("beta's cut-off record", TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let records: Vec<String> = admin
                .events(0)
                .await
                .ok()?
                .into_iter()
                .filter(|e| e.kind == "audit" && e.message.starts_with("token 'beta-token'"))
                .map(|e| e.message)
                .collect();
            records
                .iter()
                .any(|m| m.contains("kinds of refused requests within a minute"))
                .then_some(records)
        }
    })
    .await;
    // Over 20 kinds of refusal in all; at most two windows' worth (16
    // distinct records and a cut-off each) are in the log.
    assert!(beta_records.len() <= 2 * 17, "{beta_records:#?}");
    let kept = admin.events(0).await.expect("events");
    assert!(
        kept.iter()
            .any(|e| e.kind == "audit" && e.message.ends_with("POST /v1/tenants done")),
        "the admin's records stay"
    );

    // An admin lowers alpha's pending-job limit and caps nothing more: the
    // next job past it is refused naming the limit and the use.
    let lower = TenantRequest {
        name: "alpha".into(),
        max_pending_jobs: Some(1),
        ..TenantRequest::default()
    };
    admin.set_tenant(&lower).await.expect("set alpha's limit");
    // The node's four GPUs on a node where three are held: it waits.
    let mut waits = JobSubmitRequest::shell(1, 4, "true");
    waits.tenant = Some("alpha".into());
    let waiting = as_a.submit_job(&waits).await.expect("first waiting job").id;
    let err = as_a
        .submit_job(&waits)
        .await
        .expect_err("past the pending-job limit");
    assert_eq!(
        err.to_string(),
        "limit: tenant 'alpha' has 1 jobs waiting (at most 1, --max-pending-jobs); cancel some or wait for them to start"
    );
    let mut loud = JobSubmitRequest::shell(1, 1, "true");
    loud.priority = 1_000_000;
    let err = as_a
        .submit_job(&loud)
        .await
        .expect_err("past the priority cap");
    assert_eq!(
        err.to_string(),
        "limit: priority 1000000 is above the cap of tenant 'alpha' (at most 1000, --max-priority)"
    );
    // The limits in force and the use, for the tenant and the admin alike.
    for client in [&admin, &as_a] {
        let tenants = client.tenants().await.expect("tenants");
        let alpha = tenants.iter().find(|t| t.name == "alpha").expect("alpha");
        let limits = alpha.ledger_limits.as_ref().expect("ledger limits");
        assert_eq!(
            (limits.pending_jobs, limits.max_pending_jobs),
            (1, 1),
            "{limits:?}"
        );
        assert_eq!(limits.overridden, vec!["max_pending_jobs".to_string()]);
        assert_eq!(limits.max_priority, 1000);
        assert_eq!(limits.objects, 1);
        let quota = client.quota().await.expect("quota");
        let alpha = quota.iter().find(|q| q.tenant == "alpha").expect("alpha");
        assert_eq!(
            alpha.ledger_limits.as_ref().map(|l| l.max_pending_jobs),
            Some(1)
        );
    }
    // Back to the default: room again.
    let reset = TenantRequest {
        name: "alpha".into(),
        unset: vec!["max_pending_jobs".into()],
        ..TenantRequest::default()
    };
    admin.set_tenant(&reset).await.expect("reset alpha's limit");
    let second = as_a.submit_job(&waits).await.expect("room again").id;
    for id in [waiting, second] {
        as_a.cancel_job(id).await.expect("cancel");
    }
    c.shutdown().await;
}

fn admin_token(c: &LocalCluster) -> String {
    c.admin_token.clone()
}
