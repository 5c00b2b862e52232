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
        &["--api", "http://127.0.0.1:9", "status"],
        &[("SHOAL_TOKEN", "x")],
    );
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    assert_one_error_line(&stderr);
    assert!(stderr.contains("cannot reach"), "{stderr}");
}

/// `shoal sim --json | head -c 10`: a reader that goes away early ends
/// the command as it ends `cat`, by SIGPIPE, with no panic on stderr.
/// The pipe's read end is closed before the command starts, so its first
/// write is refused every time.
#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().expect("tmp");
    let trace = dir.path().join("trace.csv");
    std::fs::write(
        &trace,
        "submit_time,gpus,duration,tenant,status\n0,8,600,t0,Pass\n",
    )
    .expect("write trace");
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(shoal_bin())
        .args([
            "sim",
            "--trace",
            trace.to_str().expect("utf8"),
            "--nodes",
            "1",
        ])
        .args(["--gpus-per-node", "8", "--json"])
        .stdout(writer)
        .output()
        .expect("run shoal");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "{stderr}");
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

    let (code, stdout, _) = run(
        &["--api", &api, "nodes", "--json"],
        &[("SHOAL_TOKEN", &token)],
    );
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
    let (code, stdout, _) = run(&["--api", &api, "nodes"], &[("SHOAL_TOKEN", &token)]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("H100-80GB") && stdout.contains("4/4"),
        "{stdout}"
    );

    // The join token, alone on stdout.
    let (code, stdout, _) = run(
        &["--api", &api, "token", "create", "--ttl", "2h"],
        &[("SHOAL_TOKEN", &token)],
    );
    assert_eq!(code, 0);
    assert!(
        stdout.trim().starts_with("sj1.") && stdout.lines().count() == 1,
        "{stdout}"
    );
    let (code, _, stderr) = run(
        &["--api", &api, "token", "create", "--ttl", "soon"],
        &[("SHOAL_TOKEN", &token)],
    );
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);

    // Wrong token: 401 as one error line.
    let (code, _, stderr) = run(&["--api", &api, "status"], &[("SHOAL_TOKEN", "sa1.wrong")]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);

    // A token in the arguments is refused before anything is sent; one
    // from a file only its owner can read is taken, a wider one is not.
    let (code, _, stderr) = run(&["--api", &api, "--token", &token, "status"], &[]);
    assert_eq!(code, 2);
    assert_one_error_line(&stderr);
    assert!(stderr.contains("SHOAL_TOKEN"), "{stderr}");
    let file = root.path().join("token");
    std::fs::write(&file, format!("{token}\n")).expect("token file");
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let file_arg = file.display().to_string();
    let (code, _, stderr) = run(&["--api", &api, "--token-file", &file_arg, "status"], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert_one_error_line(&stderr);
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let (code, stdout, stderr) = run(
        &["--api", &api, "--token-file", &file_arg, "status", "--json"],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("members"), "{stdout}");

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

/// `shoal ca rotate|status`: JSON shapes, a second rotation refused as one
/// error line, and `shoal status` naming the CA that signs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_rotate_and_status_follow_the_interface() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tmp");
    let mut n1 = NodeProc::new(root.path(), "n1", &[]);
    n1.bootstrap();
    let token = n1.admin_token();
    let api = n1.api_url();
    wait_for("the API", Duration::from_secs(30), || async {
        n1.client(&token).status().await.ok()
    })
    .await;
    let shoal = |args: &[&str]| {
        let mut argv = vec!["--api", api.as_str()];
        argv.extend_from_slice(args);
        run(&argv, &[("SHOAL_TOKEN", token.as_str())])
    };
    let json = |args: &[&str]| {
        let (code, stdout, stderr) = shoal(args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        serde_json::from_str::<serde_json::Value>(&stdout).expect("one JSON document")
    };
    let before = json(&["ca", "status", "--json"]);
    assert_eq!(before["phase"], "stable");
    let old = before["signing_fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_string();
    assert_eq!(json(&["status", "--json"])["ca_fingerprint"], old.as_str());

    let rotated = json(&["ca", "rotate", "--json"]);
    assert_eq!(rotated["old_fingerprint"], old.as_str());
    let new = rotated["new_fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_string();
    assert_ne!(new, old);
    let (code, stdout, stderr) = shoal(&["ca", "rotate"]);
    assert_eq!(code, 1, "a second rotation was not refused: {stdout}");
    assert_one_error_line(&stderr);
    assert!(stderr.contains("already in progress"), "{stderr}");

    let done = wait_for("the rotation done", Duration::from_secs(60), || {
        let s = json(&["ca", "status", "--json"]);
        let done = s["phase"] == "stable" && s["signing_fingerprint"] == new.as_str();
        async move { done.then_some(s) }
    })
    .await;
    for key in ["trusted", "members", "rotations", "trusted_pem"] {
        assert!(
            done.get(key).is_some(),
            "ca status --json lacks {key}: {done}"
        );
    }
    assert_eq!(done["rotations"], 1);
    assert_eq!(done["members"][0]["cert_ca"], new.as_str());
    let (code, stdout, _) = shoal(&["ca", "status"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("phase    stable") && stdout.contains(&new),
        "{stdout}"
    );
    let (code, stdout, _) = shoal(&["status"]);
    assert_eq!(code, 0);
    assert!(stdout.contains(&format!("ca       {new}")), "{stdout}");
}

/// `shoal token create|ls|revoke` and `shoal token api [ls|revoke|rotate-admin]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_and_api_tokens_are_listed_revoked_and_rotated() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tmp");
    let mut n1 = NodeProc::new(root.path(), "n1", &[]);
    let printed = n1.bootstrap();
    let admin = n1.admin_token();
    let api = n1.api_url();
    let data_dir = n1.data_dir.to_str().expect("utf8").to_string();
    wait_for("the API", Duration::from_secs(30), || async {
        n1.client(&admin).status().await.ok()
    })
    .await;
    let shoal = |token: &str, args: &[&str]| {
        let mut all = vec!["--api", api.as_str()];
        all.extend_from_slice(args);
        run(&all, &[("SHOAL_TOKEN", token)])
    };
    let json = |out: &str| -> serde_json::Value {
        serde_json::from_str(out).unwrap_or_else(|e| panic!("one JSON document ({e}): {out}"))
    };

    // A join token for two nodes: its id, never its secret, in the listing.
    let (code, stdout, stderr) = shoal(&admin, &["token", "create", "--uses", "2", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let created = json(&stdout);
    let (id, secret) = (
        created["id"].as_str().expect("id").to_string(),
        created["token"].as_str().expect("token").to_string(),
    );
    assert_eq!(created["uses"], 2);
    let (code, stdout, stderr) = shoal(&admin, &["token", "ls", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let listed = json(&stdout);
    let rows = listed.as_array().expect("an array");
    // The bootstrap's own token is there too, single use.
    assert_eq!(rows.len(), 2, "{stdout}");
    let row = rows
        .iter()
        .find(|r| r["id"] == id.as_str())
        .expect("listed");
    for key in [
        "id",
        "uses_left",
        "max_uses",
        "created_at_ms",
        "expires_at_ms",
        "state",
    ] {
        assert!(
            row.get(key).is_some(),
            "token ls --json lacks {key}: {stdout}"
        );
    }
    assert_eq!(
        (row["uses_left"].as_u64(), row["max_uses"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(row["state"], "active");
    let hour = |r: &serde_json::Value| {
        r["expires_at_ms"].as_u64().expect("ms") - r["created_at_ms"].as_u64().expect("ms")
    };
    assert!(
        (3_590_000..=3_610_000).contains(&hour(row)),
        "default TTL is 1h: {row}"
    );
    let boot_row = rows
        .iter()
        .find(|r| r["id"] != id.as_str())
        .expect("bootstrap token");
    assert_eq!(boot_row["max_uses"], 1);
    for s in [&secret, &printed] {
        let part = s.split('.').nth(1).expect("secret part");
        assert!(!stdout.contains(part), "token ls shows a secret: {stdout}");
    }
    let (code, stdout, _) = shoal(&admin, &["token", "ls"]);
    assert_eq!(code, 0);
    assert!(stdout.contains(&id) && stdout.contains("2/2"), "{stdout}");

    // Revoked: listed as such; an unknown id is one error line.
    let (code, _, stderr) = shoal(&admin, &["token", "revoke", &id]);
    assert_eq!(code, 0, "{stderr}");
    let (_, stdout, _) = shoal(&admin, &["token", "ls", "--json"]);
    let row = json(&stdout)
        .as_array()
        .expect("array")
        .iter()
        .find(|r| r["id"] == id.as_str())
        .cloned()
        .expect("still listed");
    assert_eq!(row["state"], "revoked");
    let (code, _, stderr) = shoal(&admin, &["token", "revoke", "nosuchtoken"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);
    assert!(
        stderr.contains("no join token with id 'nosuchtoken'"),
        "{stderr}"
    );
    let (code, _, stderr) = shoal(&admin, &["token", "create", "--uses", "0"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);

    // API tokens: one with a lifetime, used once, listed with its last use.
    let (code, stdout, stderr) = shoal(
        &admin,
        &["token", "api", "--name", "ci", "--ttl", "2h", "--json"],
    );
    assert_eq!(code, 0, "{stderr}");
    let ci = json(&stdout);
    let ci_token = ci["token"].as_str().expect("token").to_string();
    assert!(ci["expires_at_ms"].as_u64().is_some(), "{stdout}");
    let (code, _, stderr) = shoal(&ci_token, &["status"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = shoal(&admin, &["token", "api", "ls", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let rows = json(&stdout);
    let row = rows
        .as_array()
        .expect("array")
        .iter()
        .find(|r| r["name"] == "ci")
        .cloned()
        .expect("ci listed");
    for key in [
        "id",
        "name",
        "tenant",
        "created_at_ms",
        "expires_at_ms",
        "last_used_ms",
        "state",
    ] {
        assert!(
            row.get(key).is_some(),
            "token api ls --json lacks {key}: {stdout}"
        );
    }
    assert!(row["last_used_ms"].as_u64().is_some(), "{row}");
    assert!(row["expires_at_ms"].as_u64().is_some(), "{row}");
    assert!(
        !stdout.contains(&ci_token[4..]),
        "token api ls shows a secret"
    );
    let (code, stdout, _) = shoal(&admin, &["token", "api", "ls"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("ci") && stdout.contains("admin"),
        "{stdout}"
    );

    // Expired: 401, saying so, once the node lists it as expired.
    let (code, stdout, stderr) = shoal(&admin, &["token", "api", "--name", "brief", "--ttl", "1s"]);
    assert_eq!(code, 0, "{stderr}");
    let brief = stdout.trim().to_string();
    wait_for(
        "the short-lived API token to expire",
        Duration::from_secs(10),
        || {
            let c = n1.client(&admin);
            async move {
                let rows = c.api_tokens().await.ok()?;
                rows.iter()
                    .any(|t| t.name == "brief" && t.state == "expired")
                    .then_some(())
            }
        },
    )
    .await;
    let (code, _, stderr) = shoal(&brief, &["status"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);
    assert!(
        stderr.contains("the API token 'brief' has expired"),
        "{stderr}"
    );

    // Revoked by name: 401 from now on.
    let (code, _, stderr) = shoal(&admin, &["token", "api", "revoke", "ci"]);
    assert_eq!(code, 0, "{stderr}");
    let status = n1
        .client(&ci_token)
        .status()
        .await
        .expect_err("a revoked token is refused");
    assert!(
        matches!(status, shoal_sdk::ClientError::Api { status: 401, .. }),
        "{status:?}"
    );
    // The last admin token cannot be revoked, only rotated.
    let (code, _, stderr) = shoal(&admin, &["token", "api", "revoke", "admin"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr);
    assert!(stderr.contains("last admin token"), "{stderr}");

    // Rotation: the new secret alone on stdout, admin.token rewritten
    // (0600), the old secret refused, the new one (from the file) accepted.
    let (code, stdout, stderr) = run(
        &[
            "--api",
            &api,
            "--data-dir",
            &data_dir,
            "token",
            "api",
            "rotate-admin",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let rotated = stdout.trim().to_string();
    assert!(
        rotated.starts_with("sa1.") && stdout.lines().count() == 1,
        "{stdout}"
    );
    assert_ne!(rotated, admin);
    assert_eq!(n1.admin_token(), rotated);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(n1.data_dir.join("admin.token"))
            .expect("admin.token")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let old = n1
        .client(&admin)
        .status()
        .await
        .expect_err("old admin refused");
    assert!(
        matches!(old, shoal_sdk::ClientError::Api { status: 401, .. }),
        "{old:?}"
    );
    let (code, _, stderr) = run(
        &["--api", &api, "--data-dir", &data_dir, "token", "ls"],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    // The node never logged a secret.
    let log = n1.log();
    for s in [&secret, &printed, &ci_token, &brief, &admin, &rotated] {
        let part = s.split('.').nth(1).expect("secret part");
        assert!(!log.contains(part), "the agent logged a secret");
    }
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
