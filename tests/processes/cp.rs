//! `shoal cp` on spawned agents: a tree in with --replica 3, three distinct
//! holders, a holder killed, the tree back out byte for byte, repair back to
//! three live holders, unchanged data not sent again, and the errors a user
//! hits leaving nothing behind.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{one_at_a_time, shoal_bin, start_cluster, wait_for};
use shoal_node::cli::bench::data::Xorshift;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

fn write_tree(root: &Path) {
    std::fs::create_dir_all(root.join("sub/deeper")).expect("mkdir");
    let mut rng = Xorshift::new(7);
    for (name, size) in [
        // 64 MiB in all, as the acceptance test asks.
        ("a.bin", 33_554_432usize),
        ("sub/b.bin", 33_553_432),
        ("sub/deeper/c.txt", 1_000),
    ] {
        std::fs::write(root.join(name), rng.bytes(size)).expect("write");
    }
}

fn same_tree(a: &Path, b: &Path) {
    for name in ["a.bin", "sub/b.bin", "sub/deeper/c.txt"] {
        assert_eq!(
            std::fs::read(a.join(name)).expect("a"),
            std::fs::read(b.join(name)).expect("b"),
            "{name} differs"
        );
    }
}

struct Cli {
    api: String,
    token: String,
}

impl Cli {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(shoal_bin())
            .args(args)
            .env("SHOAL_API", &self.api)
            .env("SHOAL_TOKEN", &self.token)
            .output()
            .expect("run shoal")
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    }

    fn fails(&self, args: &[&str], message: &str) {
        let out = self.run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(message),
            "{args:?}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_survives_a_lost_holder_and_comes_back_identical() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (mut nodes, token) =
        start_cluster(root.path(), &["n1", "n2", "n3", "n4"], |_| Vec::new()).await;
    let client = nodes[0].client(&token);
    let cli = Cli {
        api: nodes[0].api_url(),
        token: token.clone(),
    };
    let src = root.path().join("src");
    write_tree(&src);
    let src_s = src.display().to_string();

    let summary = cli.json(&["cp", "-r", "--replica", "3", "--json", &src_s, "mesh:/data"]);
    assert_eq!(summary["files"], 3);
    assert_eq!(summary["bytes"], 67_108_864);
    let stat = cli.json(&["stat", "--json", "mesh:/data"]);
    let replicas: Vec<u64> = serde_json::from_value(stat["replicas"].clone()).expect("replicas");
    assert_eq!(replicas.len(), 3, "three distinct holders: {replicas:?}");
    assert_eq!(stat["healthy"], true);
    // mesh://REGION/PATH: this region's name is the same object; another
    // region's is refused with one error line, not read as a path here.
    let region = client.status().await.expect("status").region;
    let named = cli.json(&["stat", "--json", &format!("mesh://{region}/data")]);
    assert_eq!(named["path"], "/data");
    cli.fails(
        &["cp", "-r", &src_s, "mesh://elsewhere-1/data"],
        "no peer region named 'elsewhere-1'",
    );
    cli.fails(
        &["ls", "mesh://elsewhere-1/"],
        "no peer region named 'elsewhere-1'",
    );

    // Unchanged data is not sent again.
    let again = cli.json(&["cp", "-r", "--force", "--json", &src_s, "mesh:/data"]);
    let sent = again["bytes_sent"].as_u64().expect("bytes_sent");
    assert!(sent * 100 <= 67_108_864, "re-copy sent {sent} bytes");

    // Lose a holder (not n1, which answers the CLI): the copy still comes
    // back identical, and repair restores three live holders.
    let victim = *replicas
        .iter()
        .find(|id| **id != 1)
        .expect("a holder other than n1");
    let names: std::collections::BTreeMap<u64, String> = client
        .nodes()
        .await
        .expect("nodes")
        .into_iter()
        .map(|n| (n.id, n.name))
        .collect();
    let idx: usize = names[&victim][1..].parse::<usize>().expect("index") - 1;
    nodes[idx].kill9();
    let out = root.path().join("out");
    let out_s = out.display().to_string();
    cli.json(&["cp", "-r", "--json", "mesh:/data", &out_s]);
    same_tree(&src, &out);
    wait_for("three live holders again", TIMEOUT, || {
        let c = client.clone();
        async move {
            let o = c.objects("/data").await.ok()?.into_iter().next()?;
            // The dead node stays listed (down, not removed) beside three
            // live holders.
            let live = o.replicas.iter().filter(|h| **h != victim).count();
            (live == 3 && o.healthy).then_some(())
        }
    })
    .await;

    // Errors, each one line, nothing half-written.
    cli.fails(
        &["cp", "/no/such/file", "mesh:/x"],
        "cannot read /no/such/file",
    );
    cli.fails(&["cp", &src_s, "mesh:/dir"], "is a directory (use -r)");
    cli.fails(
        &["cp", "-r", &src_s, "mesh:/data"],
        "already exists (use --force",
    );
    cli.fails(
        &["cp", "-r", "--replica", "9", &src_s, "mesh:/nine"],
        "--allow-degraded",
    );
    let file = src.join("a.bin").display().to_string();
    cli.json(&["cp", "--replica", "2", "--json", &file, "mesh:/a.bin"]);
    cli.fails(&["cp", "mesh:/a.bin", &file], "already exists (use --force");
    let listing = cli.json(&["ls", "--json", "mesh:/"]);
    let paths: Vec<String> = listing
        .as_array()
        .expect("array")
        .iter()
        .map(|o| o["path"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(paths, ["/a.bin", "/data"], "no partial objects");
    let out = cli.run(&["rm", "mesh:/data"]);
    assert!(out.status.success());
    cli.fails(&["stat", "mesh:/data"], "does not exist");
}

/// Chunk files a node's store holds.
fn stored_chunks(data_dir: &Path) -> usize {
    let objects = data_dir.join("chunks/objects");
    std::fs::read_dir(objects)
        .into_iter()
        .flatten()
        .flatten()
        .map(|shard| {
            std::fs::read_dir(shard.path())
                .map(|d| d.count())
                .unwrap_or(0)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_upload_leaves_nothing_and_resumes() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (nodes, token) = start_cluster(root.path(), &["n1", "n2", "n3"], |_| Vec::new()).await;
    // 64 MiB of incompressible data: 16 chunks per copy.
    let src = root.path().join("big.bin");
    let bytes = Xorshift::new(11).bytes(64 << 20);
    std::fs::write(&src, &bytes).expect("write");
    let src_s = src.display().to_string();
    let mut upload = Command::new(shoal_bin())
        .args(["cp", "--replica", "3", &src_s, "mesh:/big.bin"])
        .env("SHOAL_API", nodes[0].api_url())
        .env("SHOAL_TOKEN", &token)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("upload");
    let dirs: Vec<std::path::PathBuf> = nodes.iter().map(|n| n.data_dir.clone()).collect();
    wait_for("the first chunks to arrive", TIMEOUT, || {
        let dirs = dirs.clone();
        async move { dirs.iter().any(|d| stored_chunks(d) > 0).then_some(()) }
    })
    .await;
    let _ = upload.kill();
    let status = upload.wait().expect("wait");
    assert!(
        !status.success(),
        "the upload finished before it could be interrupted"
    );
    let cli = Cli {
        api: nodes[0].api_url(),
        token: token.clone(),
    };
    cli.fails(&["stat", "mesh:/big.bin"], "does not exist");
    let held_before: usize = dirs.iter().map(|d| stored_chunks(d)).sum();
    let summary = cli.json(&["cp", "--replica", "3", "--json", &src_s, "mesh:/big.bin"]);
    let sent = summary["chunks_sent"].as_u64().expect("chunks_sent") as usize;
    assert_eq!(
        sent + summary["deduplicated"].as_u64().expect("deduplicated") as usize,
        48
    );
    assert!(
        held_before > 0 && sent <= 48 - held_before,
        "resent {sent} chunks, {held_before} were already there"
    );
    let out = root.path().join("back.bin");
    cli.json(&["cp", "--json", "mesh:/big.bin", &out.display().to_string()]);
    assert_eq!(std::fs::read(&out).expect("back"), bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_nodes_are_passed_over_and_removed_objects_are_collected() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (nodes, token) = start_cluster(root.path(), &["n1", "n2", "n3", "n4"], |name| {
        let mut env = vec![
            ("SHOAL_STORAGE__GC_INTERVAL_S".to_string(), "1".to_string()),
            ("SHOAL_STORAGE__GC_GRACE_S".to_string(), "5".to_string()),
        ];
        if name == "n2" || name == "n3" {
            // A disk with room for almost nothing.
            env.push(("SHOAL_STORAGE__CAPACITY_BYTES".into(), "4096".into()));
        }
        env
    })
    .await;
    let client = nodes[0].client(&token);
    let cli = Cli {
        api: nodes[0].api_url(),
        token: token.clone(),
    };
    let file = root.path().join("weights.bin");
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    std::fs::write(&file, &data).expect("write");
    let file_s = file.display().to_string();

    // Two of four nodes are full: three copies cannot be written, and the
    // error says why; nothing is recorded.
    cli.fails(
        &["cp", "--replica", "3", &file_s, "mesh:/w.bin"],
        "only 2 of 3 copies of mesh:/w.bin were written",
    );
    let err = String::from_utf8_lossy(
        &cli.run(&["cp", "--replica", "3", &file_s, "mesh:/w.bin"])
            .stderr,
    )
    .to_string();
    assert!(err.contains("is full"), "{err}");
    assert_eq!(
        cli.json(&["ls", "--json", "mesh:/"]),
        serde_json::json!([]),
        "no partial object"
    );
    // Two copies go to the two nodes with room, whatever the ranking said.
    cli.json(&["cp", "--replica", "2", "--json", &file_s, "mesh:/w.bin"]);
    let stat = cli.json(&["stat", "--json", "mesh:/w.bin"]);
    let mut replicas: Vec<u64> =
        serde_json::from_value(stat["replicas"].clone()).expect("replicas");
    replicas.sort_unstable();
    let ids: std::collections::BTreeMap<String, u64> = client
        .nodes()
        .await
        .expect("nodes")
        .into_iter()
        .map(|n| (n.name, n.id))
        .collect();
    assert_eq!(replicas, [ids["n1"], ids["n4"]]);
    let back = root.path().join("back.bin");
    cli.json(&["cp", "--json", "mesh:/w.bin", &back.display().to_string()]);
    assert_eq!(std::fs::read(&back).expect("read"), data);

    // Once removed, its chunks are collected on every node (after the
    // grace period that protects uploads in flight).
    assert!(stored_chunks(&nodes[0].data_dir) > 0);
    assert!(cli.run(&["rm", "mesh:/w.bin"]).status.success());
    wait_for("the removed object's chunks deleted", TIMEOUT, || {
        let dirs: Vec<std::path::PathBuf> = nodes.iter().map(|n| n.data_dir.clone()).collect();
        async move { dirs.iter().all(|d| stored_chunks(d) == 0).then_some(()) }
    })
    .await;
}

/// Tenant-scoped API tokens: each tenant writes, reads and removes only its
/// own objects and jobs; every refusal is one `error:` line that names no
/// other tenant (`permission denied: …`, or `no job N` for another tenant's
/// job) and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_token_is_denied_other_tenants_objects_and_jobs() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (nodes, token) = start_cluster(root.path(), &["n1", "n2"], |_| Vec::new()).await;
    let admin = Cli {
        api: nodes[0].api_url(),
        token,
    };
    for tenant in ["a", "b"] {
        assert!(admin.run(&["tenant", "create", tenant]).status.success());
    }
    let token_for = |tenant: &str| {
        let t = admin.json(&["token", "api", "--tenant", tenant, "--json"]);
        assert_eq!(t["tenant"], tenant);
        Cli {
            api: nodes[0].api_url(),
            token: t["token"].as_str().expect("token").to_string(),
        }
    };
    let (a, b) = (token_for("a"), token_for("b"));
    admin.fails(
        &["token", "api", "--tenant", "nope"],
        "no tenant named 'nope'",
    );

    let file = root.path().join("w.bin");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, &data).expect("write");
    let file_s = file.display().to_string();
    let other = root.path().join("other.bin");
    std::fs::write(&other, b"not a's data").expect("write");
    let other_s = other.display().to_string();

    a.json(&["cp", "--replica", "2", "--json", &file_s, "mesh:/a/w.bin"]);
    let before = admin.json(&["stat", "--json", "mesh:/a/w.bin"]);
    assert_eq!(before["tenant"], "a", "owned by the token's tenant");

    // b may neither replace, read, copy nor remove a's object.
    b.fails(
        &["cp", "--force", "--replica", "2", &other_s, "mesh:/a/w.bin"],
        "permission denied: mesh:/a/w.bin belongs to another tenant",
    );
    let stolen = root.path().join("stolen.bin");
    b.fails(
        &["cp", "mesh:/a/w.bin", &stolen.display().to_string()],
        "permission denied: mesh:/a/w.bin belongs to another tenant",
    );
    assert!(!stolen.exists(), "nothing written on a refused read");
    b.fails(
        &["cp", "mesh:/a/w.bin", "mesh:/b/copy.bin"],
        "permission denied",
    );
    b.fails(
        &["rm", "mesh:/a/w.bin"],
        "permission denied: mesh:/a/w.bin belongs to another tenant",
    );
    assert_eq!(
        admin.json(&["stat", "--json", "mesh:/a/w.bin"]),
        before,
        "a's object is untouched"
    );
    let back = root.path().join("back.bin");
    a.json(&["cp", "--json", "mesh:/a/w.bin", &back.display().to_string()]);
    assert_eq!(std::fs::read(&back).expect("read"), data);
    // b's listing does not show a's objects.
    assert_eq!(b.json(&["ls", "--json", "mesh:/"]), serde_json::json!([]));

    // Jobs: b submits as itself by default, never for a; cluster changes
    // need an admin token.
    b.fails(
        &["submit", "--tenant", "a", "-N", "1", "--", "true"],
        "permission denied: a token of tenant 'b' cannot submit jobs for tenant 'a'",
    );
    let job = a.json(&[
        "submit", "--json", "-N", "1", "-t", "10m", "--", "sleep", "600",
    ]);
    let job_id = job["id"].as_u64().expect("job id").to_string();
    assert_eq!(admin.json(&["show", "--json", &job_id])["tenant"], "a");
    // Another tenant's job answers as a job that does not exist.
    b.fails(&["cancel", &job_id], &format!("error: no job {job_id}"));
    b.fails(&["drain", "n2"], "needs an admin token");
    b.fails(
        &["tenant", "set", "b", "--max-gpus", "100"],
        "needs an admin token",
    );
    b.fails(&["token", "create"], "needs an admin token");
    let queue = admin.json(&["queue", "--json"]);
    let jobs = queue.as_array().expect("array");
    assert_eq!(jobs.len(), 1, "only a's job: {queue}");
    assert_ne!(jobs[0]["state"], "cancelled", "{queue}");
    assert!(a.run(&["cancel", &job_id]).status.success());

    // b's own objects are b's to write and remove.
    b.json(&["cp", "--replica", "2", "--json", &other_s, "mesh:/b/x"]);
    assert_eq!(admin.json(&["stat", "--json", "mesh:/b/x"])["tenant"], "b");
    assert!(b.run(&["rm", "mesh:/b/x"]).status.success());
}
