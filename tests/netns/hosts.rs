//! Every user-facing path across separate hosts: three agents, each in its
//! own network namespace with its own address and installed the way the
//! defaults install it (everything bound to 0.0.0.0, no `--advertise`), and
//! the CLI on a fourth host that runs no agent. No loopback anywhere: the
//! agents find the address they publish, and the CLI reaches every node it
//! is sent to over HTTPS, checked against the cluster CA of its login.
//!
//! Needs root and `ip` (iproute2); fails with the missing one named otherwise.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common::{self, wait_for, NodeProc};
use crate::net::{missing_prerequisite, Net};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(90);

/// The CLI on the client host, with only what `shoal login` recorded.
struct ClientHost {
    ns: String,
    settings: PathBuf,
}

impl ClientHost {
    /// Runs the CLI there; a `--token T` in `args` goes in `SHOAL_TOKEN`,
    /// as users pass it (the CLI refuses a token in its arguments).
    fn run(&self, args: &[&str]) -> Output {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.ns])
            .arg(common::shoal_bin())
            .env_remove("SHOAL_API")
            .env_remove("SHOAL_TOKEN")
            .env_remove("SHOAL_CA_FILE")
            .env("SHOAL_CLI_CONFIG", &self.settings)
            .env(
                "SHOAL_DATA_DIR",
                self.settings.with_extension("no-node-here"),
            );
        common::args_with_token_in(&mut command, args, "SHOAL_TOKEN");
        command.output().expect("run shoal on the client host")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "shoal {args:?} on the client host: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let text = self.ok(args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("shoal {args:?}: {e}: {text}"))
    }

    /// `shoal logs JOB --rank R` until it holds `want`.
    async fn wait_log(&self, job: u64, rank: usize, want: &str) {
        let (job, rank) = (job.to_string(), rank.to_string());
        wait_for(
            &format!("job {job} rank {rank} to log {want:?}"),
            TIMEOUT,
            || {
                let out = self.run(&["logs", &job, "--rank", &rank]);
                let seen =
                    out.status.success() && String::from_utf8_lossy(&out.stdout).contains(want);
                async move { seen.then_some(()) }
            },
        )
        .await;
    }
}

fn job_json(client: &ClientHost, id: u64) -> serde_json::Value {
    client.json(&["show", &id.to_string(), "--json"])
}

fn gang_nodes(job: &serde_json::Value) -> Vec<String> {
    job["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn write_file(path: &Path, len: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(path, &data).expect("write");
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_installed_with_the_defaults_works_from_another_host() {
    let _serial = common::one_at_a_time();
    if let Some(reason) = missing_prerequisite() {
        panic!("this test cannot run here: {reason}");
    }
    let net = Net::new(4).unwrap_or_else(|e| panic!("cannot build network namespaces here: {e}"));
    let root_dir = tempfile::tempdir().expect("tempdir");
    let root = root_dir.path().to_path_buf();
    let mut nodes: Vec<NodeProc> = (1..=3)
        .map(|i| {
            let mut node = NodeProc::new(&root, &format!("n{i}"), &[]);
            node.host = net.addr(i);
            node.netns = Some(net.ns(i));
            node.bind_any = true;
            node
        })
        .collect();
    let token = common::form_cluster(&mut nodes);
    common::wait_converged(&nodes, &token).await;

    // The client host logs in, pinning the CA that `shoal status` shows.
    let client = ClientHost {
        ns: net.ns(4),
        settings: root.join("client-cli.toml"),
    };
    let fingerprint = nodes[0]
        .client(&token)
        .status()
        .await
        .expect("status")
        .ca_fingerprint;
    client.ok(&[
        "login",
        &nodes[0].api_url(),
        "--token",
        &token,
        "--ca-fingerprint",
        &fingerprint,
    ]);

    // Every member published its own host's address: no loopback, no
    // wildcard, and HTTPS for the API.
    let listed = client.json(&["nodes", "--json"]);
    let listed = listed.as_array().expect("nodes");
    assert_eq!(listed.len(), 3);
    for n in listed {
        let name = n["name"].as_str().expect("name");
        let i: usize = name[1..].parse().expect("index");
        let host = net.addr(i);
        assert!(
            n["addr"]
                .as_str()
                .expect("addr")
                .starts_with(&format!("{host}:")),
            "{n}"
        );
        assert_eq!(
            n["api_url"].as_str().expect("api_url"),
            format!("https://{host}:{}", nodes[i - 1].api_port),
            "{n}"
        );
    }
    let sd = client.json(&["prometheus-sd"]);
    let targets: Vec<&str> = sd[0]["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert_eq!(targets.len(), 3, "{sd}");
    let subnet = format!("{}.", net.subnet());
    assert!(targets.iter().all(|t| t.starts_with(&subnet)), "{sd}");
    assert_eq!(sd[0]["labels"]["__scheme__"], "https");

    // A two-host gang that checkpoints step 1 and then waits.
    let script = "mkdir -p $SHOAL_CKPT_DIR/1 && echo part-$RANK > $SHOAL_CKPT_DIR/1/rank-$RANK.state \
                  && touch $SHOAL_CKPT_DIR/1/.done && echo ready-$RANK-epoch-$SHOAL_EPOCH && sleep 600";
    let id: u64 = client
        .ok(&[
            "submit",
            "-N",
            "2",
            "--gpus-per-node",
            "1",
            "--max-restarts",
            "3",
            "--",
            "sh",
            "-c",
            script,
        ])
        .trim()
        .parse()
        .expect("a job id");
    let first = wait_for("the gang running", TIMEOUT, || {
        let job = job_json(&client, id);
        async move { (job["state"] == "running").then_some(job) }
    })
    .await;
    let placed = gang_nodes(&first);
    assert_eq!(placed.len(), 2);
    // Both ranks' output, each from its own host's API.
    for rank in 0..2 {
        client.wait_log(id, rank, &format!("ready-{rank}-")).await;
    }

    // The committed checkpoint comes back to the client host from the
    // holders' APIs.
    wait_for("checkpoint step 1 committed", TIMEOUT, || {
        let out = client.run(&["ckpt", "ls", &id.to_string(), "--json"]);
        let committed = out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()
                .and_then(|v| {
                    v.as_array().map(|a| {
                        a.iter()
                            .any(|c| c["step"] == 1 && c["committed_at"].is_string())
                    })
                })
                .unwrap_or(false);
        async move { committed.then_some(()) }
    })
    .await;
    let restored = root.join("restored");
    client.ok(&[
        "ckpt",
        "restore",
        &id.to_string(),
        "--to",
        &restored.display().to_string(),
    ]);
    for rank in 0..2 {
        let part = std::fs::read_to_string(restored.join(format!("rank-{rank}.state")))
            .unwrap_or_else(|e| panic!("rank {rank}'s part was not restored: {e}"));
        assert_eq!(part.trim(), format!("part-{rank}"));
    }

    // A replicated copy up from the client host and back down.
    let src = root.join("weights.bin");
    let data = write_file(&src, 5_000_000);
    let up = client.json(&[
        "cp",
        "--replica",
        "3",
        "--json",
        &src.display().to_string(),
        "mesh:/weights.bin",
    ]);
    assert_eq!(up["bytes"], 5_000_000);
    let stat = client.json(&["stat", "--json", "mesh:/weights.bin"]);
    assert_eq!(stat["replicas"].as_array().map(Vec::len), Some(3), "{stat}");
    let back = root.join("back.bin");
    client.ok(&["cp", "mesh:/weights.bin", &back.display().to_string()]);
    assert_eq!(std::fs::read(&back).expect("read back"), data);

    // A host of the gang dies (the agent killed, its link cut): the gang
    // comes back on the two other hosts, restored from the checkpoint.
    let victim_name = placed
        .iter()
        .find(|n| n.as_str() != "n1")
        .cloned()
        .unwrap_or_else(|| placed[0].clone());
    let victim: usize = victim_name[1..].parse().expect("index");
    nodes[victim - 1].kill9();
    net.set_link(victim, false);
    let moved = wait_for("the gang re-placed without the dead host", TIMEOUT, || {
        let out = client.run(&["show", &id.to_string(), "--json"]);
        let job: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
        let victim_name = victim_name.clone();
        let first_epoch = first["epoch"].as_u64();
        async move {
            let job = job?;
            let nodes = gang_nodes(&job);
            (job["state"] == "running"
                && job["epoch"].as_u64() > first_epoch
                && nodes.len() == 2
                && !nodes.contains(&victim_name))
            .then_some(job)
        }
    })
    .await;
    let epoch = moved["epoch"].as_u64().expect("epoch");
    for rank in 0..2 {
        client
            .wait_log(id, rank, &format!("ready-{rank}-epoch-{epoch}"))
            .await;
    }

    // The dead host is removed for good; the cluster carries on with two.
    client.ok(&["node", "remove", &victim_name]);
    wait_for("the removed host gone from the members", TIMEOUT, || {
        let status = client.json(&["status", "--json"]);
        let names: Vec<String> = status["members"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(|m| m["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let gone = names.len() == 2 && !names.contains(&victim_name);
        async move { gone.then_some(()) }
    })
    .await;
    client.ok(&["cancel", &id.to_string()]);
}
