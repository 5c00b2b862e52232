//! `agent.shutdown = "drain"`: SIGTERM drains the node first, so its gang
//! is stopped and requeued (not lost, not charged a restart) before the
//! agent exits, and the node undrains itself when it starts again.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common::{one_at_a_time, sh_job, start_cluster, wait_for};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_stop_moves_its_gang_off_first_and_undrains_on_return() {
    let _serial = one_at_a_time();
    let root = tempfile::tempdir().expect("tempdir");
    let (mut nodes, token) = start_cluster(root.path(), &["n1", "n2"], |name| {
        let mut env = vec![("SHOAL_EXECUTOR__STOP_GRACE_S".to_string(), "5".to_string())];
        if name == "n2" {
            env.push(("SHOAL_AGENT__SHUTDOWN".into(), "drain".into()));
        }
        env
    })
    .await;
    let client = nodes[0].client(&token);
    // Two whole-node jobs: one on each node.
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(
            client
                .submit_job(&sh_job(1, 4, "sleep 600"))
                .await
                .expect("submit")
                .id,
        );
    }
    let on_n2 = wait_for("both jobs running", TIMEOUT, || {
        let client = client.clone();
        let ids = ids.clone();
        async move {
            let mut on_n2 = None;
            for id in ids {
                let job = client.job(id).await.ok()?;
                if job.state != "running" {
                    return None;
                }
                if job.nodes == ["n2"] {
                    on_n2 = Some(id);
                }
            }
            on_n2
        }
    })
    .await;

    assert!(
        nodes[1].terminate(TIMEOUT),
        "the agent did not stop after SIGTERM"
    );
    // By the time it exited its gang had stopped and was requeued: there is
    // nowhere else to run it (n1 is full), so it waits.
    let job = client.job(on_n2).await.expect("job");
    assert!(
        matches!(job.state.as_str(), "requeued" | "pending"),
        "{} ({}); n2's log ends:\n{}",
        job.state,
        job.reason,
        log_tail(&nodes[1].log(), 40)
    );
    assert_eq!(job.restarts, 0, "a drain is not a failure");
    let n2 = client
        .nodes()
        .await
        .expect("nodes")
        .into_iter()
        .find(|n| n.name == "n2")
        .expect("n2");
    assert!(n2.drained, "the node did not drain itself");

    // Back, it undrains itself and the job runs there again.
    nodes[1].restart();
    wait_for("the job back on n2", TIMEOUT, || {
        let client = client.clone();
        async move {
            let job = client.job(on_n2).await.ok()?;
            (job.state == "running" && job.nodes == ["n2"]).then_some(())
        }
    })
    .await;
    let n2 = client
        .nodes()
        .await
        .expect("nodes")
        .into_iter()
        .find(|n| n.name == "n2")
        .expect("n2");
    assert!(!n2.drained);
}

fn log_tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
