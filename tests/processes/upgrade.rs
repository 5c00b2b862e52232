//! A rolling upgrade on spawned agents: a cluster of protocol N has its
//! nodes replaced one by one by a release that speaks N and N+1 (simulated
//! with the test-only `SHOAL_TEST_PROTOCOL`), keeps committing writes
//! throughout, then takes a node that has dropped N and refuses one that
//! speaks only N+2 with a clear error.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use common::{sh_job, shoal_bin, wait_for, NodeProc};
use shoal_sdk::{Client, MemberState};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const N: u16 = shoal_mesh::protocol::PROTOCOL;
const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// `shoal status --json` through the CLI against `node`.
fn status_json(node: &NodeProc, token: &str) -> Option<serde_json::Value> {
    cli_json(node, token, &["status", "--json"])
}

fn cli_json(node: &NodeProc, token: &str, args: &[&str]) -> Option<serde_json::Value> {
    let mut c = Command::new(shoal_bin());
    c.env_remove("SHOAL_API")
        .env("SHOAL_TOKEN", token)
        .arg("--api")
        .arg(node.api_url())
        .args(args);
    if node.api_tls() {
        c.env("SHOAL_CA_FILE", node.ca_file());
    }
    let out = c.output().ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The `(version, protocol)` `shoal status --json` shows for `name`.
fn member_version(status: &serde_json::Value, name: &str) -> Option<(String, String)> {
    let m = status["members"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == name)?;
    Some((
        m["version"].as_str()?.to_string(),
        m["protocol"].as_str()?.to_string(),
    ))
}

/// When each acknowledged job was accepted, and its id.
type Acked = Arc<Mutex<Vec<(Instant, u64)>>>;

/// Submits jobs round-robin over `clients` until stopped; records when each
/// acknowledged one was accepted.
fn spawn_writer(
    clients: Vec<Client>,
    stop: Arc<AtomicBool>,
) -> (Acked, tokio::task::JoinHandle<()>) {
    let acked = Arc::new(Mutex::new(Vec::new()));
    let log = acked.clone();
    let task = tokio::spawn(async move {
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let c = &clients[i % clients.len()];
            i += 1;
            let submitted =
                tokio::time::timeout(Duration::from_secs(5), c.submit_job(&sh_job(1, 1, "true")))
                    .await;
            match submitted {
                Ok(Ok(r)) => {
                    if let Ok(mut v) = log.lock() {
                        v.push((Instant::now(), r.id));
                    }
                }
                Ok(Err(e)) => eprintln!("submit: {e}"),
                Err(_) => eprintln!("submit: no answer within 5 s"),
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
    (acked, task)
}

/// Waits until every node answers and the ledger, as each node reads it,
/// lists all of `nodes` alive. (The stricter `common::wait_converged` also
/// wants every gossip detector to hear every peer, a gossip matter, not
/// this test's: see `a_crashed_node_restarted_on_another_gossip_port_...`
/// in the in-process tests.)
async fn wait_alive(nodes: &[NodeProc], token: &str) {
    for n in nodes {
        let c = n.client(token);
        wait_for(
            &format!("{} to list every member alive", n.name),
            Duration::from_secs(60),
            || async {
                let listed = c.nodes().await.ok()?;
                (listed.len() == nodes.len()
                    && listed.iter().all(|m| m.state == MemberState::Alive))
                .then_some(())
            },
        )
        .await;
    }
}

fn acked_since(acked: &Mutex<Vec<(Instant, u64)>>, since: Instant) -> usize {
    acked
        .lock()
        .map(|v| v.iter().filter(|(at, _)| *at > since).count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_upgraded_node_by_node_and_refuses_a_node_without_a_common_version() {
    let _serial = common::one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (mut nodes, token) =
        common::start_cluster(root.path(), &["n1", "n2", "n3"], |_| Vec::new()).await;
    let old = format!("{}..{N}", shoal_mesh::protocol::MIN_PROTOCOL);
    let next = format!("{N}..{}", N + 1);
    let status = status_json(&nodes[0], &token).expect("status --json");
    for n in &nodes {
        assert_eq!(
            member_version(&status, &n.name),
            Some((RELEASE.to_string(), old.clone())),
            "{status}"
        );
    }
    assert_eq!(status["effective_protocol"], N);

    let clients: Vec<Client> = nodes.iter().map(|n| n.client(&token)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let (acked, writer) = spawn_writer(clients, stop.clone());
    wait_for("a first write", Duration::from_secs(30), || async {
        (acked_since(&acked, started) > 0).then_some(())
    })
    .await;

    // Replace the nodes one by one: kill, restart on the same data dir as
    // the next release.
    for i in 0..nodes.len() {
        let killed_at = Instant::now();
        nodes[i].kill9();
        // The cluster keeps committing while the node is away.
        wait_for(
            &format!("writes to commit while {} is down", nodes[i].name),
            Duration::from_secs(30),
            || async { (acked_since(&acked, killed_at) >= 2).then_some(()) },
        )
        .await;
        // An operator's stop, binary swap and start takes seconds: the
        // cluster has noticed the node is gone by then.
        let victim = nodes[i].name.clone();
        let survivor = nodes[(i + 1) % nodes.len()].client(&token);
        wait_for(
            &format!("the ledger to stop listing {victim} alive"),
            Duration::from_secs(30),
            || async {
                let listed = survivor.nodes().await.ok()?;
                listed
                    .iter()
                    .any(|m| m.name == victim && m.state != MemberState::Alive)
                    .then_some(())
            },
        )
        .await;
        nodes[i]
            .extra_env
            .push(("SHOAL_TEST_PROTOCOL".into(), next.clone()));
        nodes[i].restart();
        let other = (i + 1) % nodes.len();
        let name = nodes[i].name.clone();
        wait_for(
            &format!("{name} to rejoin and record protocol {next}"),
            Duration::from_secs(60),
            || {
                let (nodes, token, name, next) = (&nodes, &token, &name, &next);
                async move {
                    let s = status_json(&nodes[other], token)?;
                    (member_version(&s, name)? == (RELEASE.to_string(), next.clone())).then_some(())
                }
            },
        )
        .await;
        wait_alive(&nodes, &token).await;
        let back = Instant::now();
        wait_for(
            &format!("writes to commit after {name} came back"),
            Duration::from_secs(30),
            || async { (acked_since(&acked, back) >= 2).then_some(()) },
        )
        .await;
        let s = status_json(&nodes[i], &token).expect("status from the upgraded node");
        let want = if i + 1 == nodes.len() { N + 1 } else { N };
        assert_eq!(
            s["effective_protocol"], want,
            "the effective protocol rises only once every member speaks N+1: {s}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");

    // Every acknowledged write survived the upgrade, on every node.
    let ids: Vec<u64> = acked
        .lock()
        .map(|v| v.iter().map(|(_, id)| *id).collect())
        .unwrap_or_default();
    assert!(ids.len() >= 12, "too few writes committed: {}", ids.len());
    for n in &nodes {
        let c = n.client(&token);
        for id in &ids {
            wait_for(
                &format!("job {id} on {}", n.name),
                Duration::from_secs(20),
                || async { c.job(*id).await.ok() },
            )
            .await;
        }
    }
    let listed = cli_json(&nodes[1], &token, &["nodes", "--json"]).expect("nodes --json");
    for n in listed.as_array().expect("an array of nodes") {
        assert_eq!(n["version"], RELEASE, "{n}");
        assert_eq!(n["protocol"], next.as_str(), "{n}");
    }

    // A node that has dropped N joins the upgraded cluster.
    let join = nodes[0].create_join_token(2);
    let via = nodes[0].rpc_addr();
    let mut n4 = NodeProc::new(root.path(), "n4", &[]);
    n4.extra_env
        .push(("SHOAL_TEST_PROTOCOL".into(), format!("{}", N + 1)));
    n4.join(&via, &join);
    nodes.push(n4);
    wait_alive(&nodes, &token).await;
    let s = status_json(&nodes[3], &token).expect("status from n4");
    assert_eq!(
        member_version(&s, "n4"),
        Some((RELEASE.to_string(), format!("{}..{}", N + 1, N + 1))),
        "{s}"
    );

    // One that speaks only N+2 shares no version with anyone: refused
    // before a single request, with one error line naming both ranges.
    let n5 = NodeProc::new(root.path(), "n5", &[]);
    let mut agent = Command::new(shoal_bin());
    agent
        .arg("agent")
        .arg("--name")
        .arg("n5")
        .arg("--data-dir")
        .arg(&n5.data_dir)
        .arg("--api-addr")
        .arg(format!("127.0.0.1:{}", n5.api_port))
        .arg("--rpc-addr")
        .arg(format!("127.0.0.1:{}", n5.rpc_port))
        .arg("--gossip-addr")
        .arg("127.0.0.1:0")
        .arg("--sim-gpus")
        .arg("1xH100-80GB")
        .arg("--join")
        .arg(&via)
        .arg("--join-token-file")
        .arg(n5.write_join_token(&join))
        .env("SHOAL_TEST_PROTOCOL", format!("{}", N + 2))
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = agent.spawn().expect("spawn the joiner");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .expect("the refused joiner exits within 60 s")
    .expect("join")
    .expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the joiner must fail: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    let expected = format!(
        "peer at {via} speaks protocol {next}, this node {}..{}",
        N + 2,
        N + 2
    );
    assert!(lines[0].contains(&expected), "{stderr}");
    assert!(lines[0].contains("older release"), "{stderr}");
    // The member it asked said so in its log too, and it is no member.
    wait_for(
        "the contacted node to log the refusal",
        Duration::from_secs(10),
        || async {
            nodes[0]
                .log()
                .contains("refused an RPC connection")
                .then_some(())
        },
    )
    .await;
    let s = status_json(&nodes[1], &token).expect("status");
    assert!(member_version(&s, "n5").is_none(), "{s}");
    assert_eq!(s["members"].as_array().map(Vec::len), Some(4), "{s}");
}
