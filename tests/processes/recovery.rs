//! Backups and disaster recovery on spawned agents: `shoal snapshot save`
//! from a follower and `snapshot restore` into a new one-node cluster,
//! damaged backups refused with nothing written, and `shoal recover
//! --force-new-cluster` on the last voter of a cluster that lost two of
//! three for good — each ending with the same jobs, tenants, objects and
//! tokens as before, and a new node joining.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{one_at_a_time, sh_job, shoal_bin, start_cluster, wait_for, NodeProc};
use shoal_sdk::{ApiTokenCreateRequest, Client, MemberState, TenantRequest, TokenCreateRequest};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

fn shoal(args: &[&str], api: &str, token: &str) -> Output {
    Command::new(shoal_bin())
        .args(args)
        .env("SHOAL_API", api)
        .env("SHOAL_TOKEN", token)
        .env_remove("SHOAL_DATA_DIR")
        .env_remove("SHOAL_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run shoal")
}

fn json_of(out: &Output, what: &str) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {:?}", out.stdout))
}

/// `shoal ARGS` with a terminal as its stdin, on which `answer` is typed.
fn shoal_at_a_terminal(args: &[&str], answer: &str) -> Output {
    use std::ffi::CStr;
    use std::io::Write;
    use std::os::fd::FromRawFd;
    // SAFETY: plain pty calls on descriptors this function owns; the name
    // ptsname returns is copied before any other pty call.
    let (master, slave) = unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(master >= 0, "posix_openpt failed");
        assert_eq!(libc::grantpt(master), 0, "grantpt");
        assert_eq!(libc::unlockpt(master), 0, "unlockpt");
        let name = CStr::from_ptr(libc::ptsname(master)).to_owned();
        let slave = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        assert!(slave >= 0, "open the pty's terminal");
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    };
    let mut master = master;
    master
        .write_all(format!("{answer}\n").as_bytes())
        .expect("type the answer");
    let out = Command::new(shoal_bin())
        .args(args)
        .env_remove("SHOAL_DATA_DIR")
        .env_remove("SHOAL_CONFIG")
        .stdin(Stdio::from(slave))
        .output()
        .expect("run shoal");
    drop(master);
    out
}

/// Exit 1 and one `error:` line on stderr that says `why`.
fn refused(out: &Output, why: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{why}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(why),
        "expected an error saying '{why}': {err}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout: {:?}", out.stdout);
}

/// The ledger as the tests compare it: jobs, tenants, `mesh:/` objects,
/// API tokens and attributes, without what a recovery may rightly change
/// (job states, holders, health, last use).
#[derive(Debug, PartialEq)]
struct Contents {
    jobs: Vec<String>,
    tenants: Vec<String>,
    objects: Vec<String>,
    api_tokens: Vec<String>,
    attrs: BTreeMap<String, String>,
}

async fn contents(c: &Client) -> Contents {
    let jobs = c.jobs(None, None).await.expect("jobs");
    let tenants = c.tenants().await.expect("tenants");
    let objects = c.objects("/").await.expect("objects");
    let tokens = c.api_tokens().await.expect("api tokens");
    Contents {
        jobs: jobs
            .iter()
            .map(|j| {
                format!(
                    "{} {} {} {}x{} {:?} {}",
                    j.id,
                    j.name,
                    j.tenant,
                    j.nodes_requested,
                    j.gpus_per_node,
                    j.command,
                    j.submitted_at
                )
            })
            .collect(),
        tenants: tenants
            .iter()
            .map(|t| format!("{} {:?} {:?}", t.name, t.parent, t.max_gpus))
            .collect(),
        objects: objects
            .iter()
            .filter(|o| !o.is_dir)
            .map(|o| format!("{} {} {} {}", o.path, o.bytes, o.tenant, o.manifest_hex))
            .collect(),
        api_tokens: tokens
            .iter()
            .map(|t| format!("{} {} {:?}", t.id, t.name, t.tenant))
            .collect(),
        attrs: c.attrs("").await.expect("attrs"),
    }
}

async fn wait_job(c: &Client, id: u64, what: &str, ok: impl Fn(&shoal_sdk::JobInfo) -> bool) {
    wait_for(&format!("job {id} {what}"), TIMEOUT, || async {
        let j = c.job(id).await.ok()?;
        ok(&j).then_some(())
    })
    .await;
}

/// Waits until `c`'s node says `leader` leads alone, and returns the status.
async fn wait_sole_voter(c: &Client, leader: u64) -> shoal_sdk::StatusResponse {
    wait_for(
        &format!("node {leader} to lead as the only voter"),
        TIMEOUT,
        || async {
            let s = c.status().await.ok()?;
            (s.leader == Some(leader) && s.voters == vec![leader]).then_some(s)
        },
    )
    .await
}

/// A node joins `via` with a new join token, and both see it alive.
async fn join_new_node(root: &Path, name: &str, via: &NodeProc, token: &str) -> NodeProc {
    let admin = via.client(token);
    let join = admin
        .create_join_token(&TokenCreateRequest {
            ttl_s: None,
            uses: Some(1),
            voter: true,
        })
        .await
        .expect("a new join token")
        .token;
    let mut n = NodeProc::new(root, name, &[]);
    n.join(&via.rpc_addr(), &join);
    let own = n.client(token);
    wait_for(&format!("{name} to join and be alive"), TIMEOUT, || async {
        let nodes = admin.nodes().await.ok()?;
        let alive = nodes
            .iter()
            .any(|m| m.name == name && m.state == MemberState::Alive);
        let s = own.status().await.ok()?;
        (alive && s.leader.is_some()).then_some(())
    })
    .await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_saved_from_a_follower_restores_into_a_new_cluster_with_the_same_ledger() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (mut nodes, token) = start_cluster(root.path(), &["n1", "n2"], |_| Vec::new()).await;
    let admin = nodes[0].client(&token);
    admin
        .create_tenant(&TenantRequest {
            name: "vision".into(),
            max_gpus: Some(6),
            ..Default::default()
        })
        .await
        .expect("tenant");
    let mut running = sh_job(1, 1, "sleep 600");
    running.tenant = Some("vision".into());
    running.max_restarts = Some(2);
    let running = admin.submit_job(&running).await.expect("submit").id;
    wait_job(&admin, running, "running", |j| j.state == "running").await;
    // Waits: it needs both nodes whole, and `running` holds a GPU of one.
    let waiting = admin
        .submit_job(&sh_job(2, 4, "true"))
        .await
        .expect("submit")
        .id;
    let file = root.path().join("weights.bin");
    std::fs::write(&file, vec![7u8; 100_000]).expect("write");
    let f = file.to_str().expect("utf8");
    let api0 = nodes[0].api_url();
    json_of(
        &shoal(
            &["--json", "cp", "--replica", "2", f, "mesh:/models/w.bin"],
            &api0,
            &token,
        ),
        "cp",
    );
    let tenant_token = admin
        .create_api_token(&ApiTokenCreateRequest {
            name: Some("vision-bot".into()),
            tenant: Some("vision".into()),
            ttl_s: None,
        })
        .await
        .expect("tenant token")
        .token;
    let acked = admin.put_attr("acked/last", "1").await.expect("ack").index;

    // From the follower, right after the acknowledged write: it is in.
    let snap = root.path().join("backups/ledger.snap");
    std::fs::create_dir_all(snap.parent().expect("dir")).expect("mkdir");
    let s = snap.to_str().expect("utf8");
    let api1 = nodes[1].api_url();
    refused(
        &shoal(&["snapshot", "save", s], &api1, &tenant_token),
        "admin token",
    );
    assert!(!snap.exists(), "a refused save writes nothing");
    let saved = json_of(
        &shoal(&["--json", "snapshot", "save", s], &api1, &token),
        "snapshot save",
    );
    let status = admin.status().await.expect("status");
    assert_eq!(saved["cluster_id"], status.cluster_id.as_str());
    assert!(
        saved["index"].as_u64().expect("index") >= acked,
        "the snapshot misses the write acknowledged at {acked}: {saved}"
    );
    let meta = std::fs::metadata(&snap).expect("saved file");
    assert_eq!(saved["bytes"].as_u64(), Some(meta.len()));
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(saved["checksum"]
        .as_str()
        .is_some_and(|c| c.starts_with("blake3:")));
    let leftovers: Vec<_> = std::fs::read_dir(snap.parent().expect("dir"))
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");
    let before = contents(&admin).await;
    assert!(before.attrs.contains_key("acked/last"));

    // The old cluster is gone.
    for n in nodes.iter_mut() {
        n.kill9();
    }

    // Damaged backups are refused, and nothing is written.
    let good = std::fs::read(&snap).expect("read");
    let body_at = good.len() - 64;
    let target = root.path().join("r1");
    let t = target.to_str().expect("utf8");
    let variants: Vec<(&str, Vec<u8>)> = vec![
        ("corrupt", {
            let mut b = good.clone();
            b[body_at] ^= 0x40;
            b
        }),
        ("truncated", good[..good.len() - 10].to_vec()),
        ("newer than this shoal reads", {
            let text = String::from_utf8_lossy(&good).replacen("\"format\":1", "\"format\":9", 1);
            let mut b = text.as_bytes().to_vec();
            b.truncate(good.len());
            b
        }),
        ("not a Shoal ledger snapshot", b"{\"hello\":1}\n".to_vec()),
    ];
    for (why, bytes) in variants {
        let bad = root.path().join("bad.snap");
        std::fs::write(&bad, &bytes).expect("write");
        let out = shoal(
            &[
                "snapshot",
                "restore",
                bad.to_str().expect("utf8"),
                "--data-dir",
                t,
            ],
            "http://127.0.0.1:9",
            "x",
        );
        refused(&out, why);
        assert!(!target.exists(), "{why}: nothing may be written");
    }
    let not_empty = nodes[0].data_dir.to_str().expect("utf8").to_string();
    refused(
        &shoal(
            &["snapshot", "restore", s, "--data-dir", &not_empty],
            "http://127.0.0.1:9",
            "x",
        ),
        "is not empty",
    );

    // Restored into a fresh dir, the agent starts a one-voter cluster. The
    // restore is told neither its addresses nor its ports: the defaults are
    // recorded, and the agent corrects them when it starts elsewhere.
    let mut restored = NodeProc::new(root.path(), "r1", &[]);
    assert_eq!(restored.data_dir, target);
    let report = json_of(
        &shoal(
            &[
                "--json",
                "snapshot",
                "restore",
                s,
                "--data-dir",
                t,
                "--name",
                "r1",
            ],
            "http://127.0.0.1:9",
            "x",
        ),
        "snapshot restore",
    );
    assert_eq!(report["cluster_id"], status.cluster_id.as_str());
    assert_eq!(report["removed"], serde_json::json!(["n1", "n2"]));
    assert_eq!(report["ca"], "new");
    assert_eq!(report["rpc_addr"], "127.0.0.1:7071");
    let id = report["node_id"].as_u64().expect("node id");
    assert!(id > 2, "a new node id, not an old member's: {id}");
    restored.restart();
    // The old admin token works: the ledger keeps its hash.
    let c = restored.client(&token);
    let s2 = wait_sole_voter(&c, id).await;
    assert_eq!(s2.cluster_id, status.cluster_id);
    // The members that are gone have left: only the new node is listed.
    let members: Vec<u64> = s2.members.iter().map(|m| m.id).collect();
    assert_eq!(members, vec![id], "{s2:?}");
    assert_eq!(contents(&c).await, before);
    // The gang of the lost node runs again, here, through the failover path.
    wait_job(&c, running, "to run again on the restored node", |j| {
        j.state == "running" && j.nodes == ["r1"] && j.restarts >= 1
    })
    .await;
    assert_eq!(c.job(waiting).await.expect("job").state, "pending");
    // The tenant's token still works, for its tenant only.
    let tenant = restored.client(&tenant_token);
    let seen = tenant.jobs(None, None).await.expect("tenant jobs");
    assert_eq!(seen.iter().map(|j| j.id).collect::<Vec<_>>(), vec![running]);

    let addr = restored.rpc_addr();
    wait_for("the node's record to follow the agent", TIMEOUT, || async {
        let nodes = c.nodes().await.ok()?;
        (nodes.len() == 1 && nodes[0].addr == addr).then_some(())
    })
    .await;

    // And the restored cluster grows again: the joiner reaches the leader
    // at the address the agent runs on, not the one the restore guessed.
    let _n3 = join_new_node(root.path(), "n3", &restored, &token).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_on_the_last_voter_keeps_every_committed_write() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (mut nodes, token) = start_cluster(root.path(), &["n1", "n2", "n3"], |_| Vec::new()).await;
    let admin = nodes[0].client(&token);
    let ids: BTreeMap<String, u64> = wait_for("three voters", TIMEOUT, || async {
        let s = admin.status().await.ok()?;
        (s.voters.len() == 3 && s.leader.is_some())
            .then(|| s.members.iter().map(|m| (m.name.clone(), m.id)).collect())
    })
    .await;
    let leader = admin
        .status()
        .await
        .expect("status")
        .leader
        .expect("leader");
    // The survivor is a follower: the leader is among the lost.
    let survivor = nodes
        .iter()
        .position(|n| ids[&n.name] != leader)
        .expect("a follower");
    let sid = ids[&nodes[survivor].name];
    let sc = nodes[survivor].client(&token);

    sc.create_tenant(&TenantRequest {
        name: "vision".into(),
        max_gpus: Some(12),
        ..Default::default()
    })
    .await
    .expect("tenant");
    let mut gang = sh_job(3, 1, "sleep 600");
    gang.tenant = Some("vision".into());
    gang.max_restarts = Some(3);
    let gang = sc.submit_job(&gang).await.expect("gang").id;
    let done = sc.submit_job(&sh_job(1, 1, "true")).await.expect("job").id;
    wait_job(&sc, gang, "running on all three", |j| {
        j.state == "running" && j.nodes.len() == 3
    })
    .await;
    // Waits: it needs two nodes whole, and the gang holds a GPU of each.
    let waiting = sc.submit_job(&sh_job(2, 4, "true")).await.expect("job").id;
    wait_job(&sc, done, "completed", |j| j.state == "completed").await;
    let file = root.path().join("w.bin");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&file, &payload).expect("write");
    let sapi = nodes[survivor].api_url();
    json_of(
        &shoal(
            &[
                "--json",
                "cp",
                "--replica",
                "3",
                file.to_str().expect("utf8"),
                "mesh:/models/w.bin",
            ],
            &sapi,
            &token,
        ),
        "cp",
    );
    sc.create_api_token(&ApiTokenCreateRequest {
        name: Some("vision-bot".into()),
        tenant: Some("vision".into()),
        ttl_s: None,
    })
    .await
    .expect("tenant token");
    let sdir = nodes[survivor].data_dir.clone();
    wait_for(
        "the survivor, a voter, to hold the CA key",
        TIMEOUT,
        || async { sdir.join("ca.key").exists().then_some(()) },
    )
    .await;
    // The last acknowledged write before the disaster.
    sc.put_attr("acked/last", "before the loss")
        .await
        .expect("acknowledged write");
    let before = contents(&sc).await;
    let before_status = sc.status().await.expect("status");

    // Two voters, the leader among them, are lost for good.
    for (i, n) in nodes.iter_mut().enumerate() {
        if i != survivor {
            n.kill9();
            std::fs::remove_dir_all(&n.data_dir).expect("remove a lost data dir");
        }
    }
    let d = sdir.to_str().expect("utf8");
    let recover = |extra: &[&str]| {
        let mut args = vec!["recover", "--force-new-cluster", "--data-dir", d];
        args.extend_from_slice(extra);
        shoal(&args, "http://127.0.0.1:9", "x")
    };
    refused(&recover(&["--yes"]), "is running on");
    nodes[survivor].kill9();
    refused(&recover(&[]), "pass --yes");
    let untouched = std::fs::read_dir(&sdir)
        .expect("ls")
        .flatten()
        .all(|e| !e.file_name().to_string_lossy().contains("pre-recover"));
    assert!(untouched, "a refused recovery changes nothing");

    // At a terminal it says what it will do and asks; only the cluster id
    // or "yes" goes on.
    let args = ["recover", "--force-new-cluster", "--data-dir", d, "--json"];
    let declined = shoal_at_a_terminal(&args, "no");
    let err = String::from_utf8_lossy(&declined.stderr);
    assert_eq!(declined.status.code(), Some(1), "{err}");
    // The error follows the prompt (the answer's echo went to the terminal).
    assert!(
        err.trim_end()
            .ends_with("error: not confirmed; nothing was changed"),
        "{err}"
    );
    let cluster_id = before_status.cluster_id.clone();
    assert!(
        err.contains(&format!("Type the cluster id ({cluster_id})")),
        "{err}"
    );
    for name in nodes
        .iter()
        .map(|n| &n.name)
        .filter(|n| **n != nodes[survivor].name)
    {
        assert!(
            err.contains(name.as_str()),
            "the warning names {name}: {err}"
        );
    }
    let untouched = std::fs::read_dir(&sdir)
        .expect("ls")
        .flatten()
        .all(|e| !e.file_name().to_string_lossy().contains("pre-recover"));
    assert!(untouched, "a declined recovery changes nothing");
    let report = json_of(&shoal_at_a_terminal(&args, &cluster_id), "recover");
    assert_eq!(report["node_id"].as_u64(), Some(sid));
    let mut lost: Vec<String> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != survivor)
        .map(|(_, n)| n.name.clone())
        .collect();
    lost.sort();
    assert_eq!(report["removed"], serde_json::json!(lost));
    assert_eq!(report["ca"], "kept");
    assert_eq!(report["requeued"], serde_json::json!([gang]));
    assert!(report["previous_db"]
        .as_str()
        .is_some_and(|p| Path::new(p).exists()));

    nodes[survivor].restart();
    let s = wait_sole_voter(&sc, sid).await;
    // The lost members have left: only the survivor is listed.
    let members: Vec<u64> = s.members.iter().map(|m| m.id).collect();
    assert_eq!(members, vec![sid], "{s:?}");
    assert_eq!(contents(&sc).await, before);
    assert_eq!(
        sc.attrs("acked/").await.expect("attrs").get("acked/last"),
        Some(&"before the loss".to_string())
    );
    // The gang lost two nodes: it waits for three again, never half-placed.
    wait_job(&sc, gang, "waiting to be placed again", |j| {
        matches!(j.state.as_str(), "pending" | "requeued") && j.restarts == 1
    })
    .await;
    assert_eq!(sc.job(waiting).await.expect("job").state, "pending");
    assert_eq!(sc.job(done).await.expect("job").state, "completed");
    // The object's bytes are still here, on the survivor's own replica.
    let out = root.path().join("w.out");
    json_of(
        &shoal(
            &[
                "--json",
                "cp",
                "mesh:/models/w.bin",
                out.to_str().expect("utf8"),
            ],
            &sapi,
            &token,
        ),
        "cp back",
    );
    assert_eq!(std::fs::read(&out).expect("read back"), payload);

    // A new node joins the recovered cluster.
    let _n4 = join_new_node(root.path(), "n4", &nodes[survivor], &token).await;
}
