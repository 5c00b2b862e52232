//! A GPU that fails is never handed out again: the simulated GPUs' fault
//! injection makes one GPU of a running gang report XID 79 (fell off the
//! bus); its node marks it unhealthy in the ledger, the job on it moves to
//! another node (not counted as a failure), later work avoids it, and only
//! an operator returns it (`shoal gpu undrain`). An operator's drain of a
//! GPU moves its job the same way.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use shoal_node::agent::testkit::LocalCluster;
use shoal_sdk::{Client, GpuInfo, JobInfo, JobSubmitRequest};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

async fn running(admin: &Client, id: u64, epoch_above: u64) -> JobInfo {
    common::wait_for(&format!("job {id} running"), TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let job = admin.job(id).await.ok()?;
            (job.state == "running" && job.epoch.unwrap_or(0) > epoch_above).then_some(job)
        }
    })
    .await
}

async fn gpu(admin: &Client, node: &str, index: u32) -> GpuInfo {
    admin
        .nodes()
        .await
        .expect("nodes")
        .into_iter()
        .find(|n| n.name == node)
        .and_then(|n| n.gpus.into_iter().find(|g| g.index == index))
        .expect("the GPU")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_gpu_moves_its_job_and_gets_no_work_until_an_operator_returns_it() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(2, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let admin = c.client(0);
    // One whole node's four GPUs.
    let id = admin
        .submit_job(&JobSubmitRequest::shell(1, 4, "sleep 600"))
        .await
        .expect("submit")
        .id;
    let first = running(&admin, id, 0).await;
    let node = first.nodes[0].clone();
    let i: usize = node[1..].parse::<usize>().expect("index") - 1;
    let bad = 2;
    c.client(i)
        .gpu_fault(bad, "xid:79")
        .await
        .expect("inject the fault");

    // The node marks the GPU unhealthy, saying why.
    let marked = common::wait_for("the GPU marked unhealthy", TIMEOUT, || {
        let admin = admin.clone();
        let node = node.clone();
        async move {
            let g = gpu(&admin, &node, bad).await;
            (g.health == "unhealthy").then_some(g)
        }
    })
    .await;
    let reason = marked.health_reason.unwrap_or_default();
    assert!(reason.contains("XID 79"), "{reason}");

    // The gang runs again on the other node: three healthy GPUs cannot
    // hold it. It is not counted as a failure of the job.
    let moved = running(&admin, id, first.epoch.unwrap_or(0)).await;
    assert_ne!(
        moved.nodes, first.nodes,
        "re-placed on the node with the bad GPU"
    );
    assert_eq!(moved.restarts, 0, "{moved:?}");
    assert!(gpu(&admin, &node, bad).await.allocated_to.is_none());

    // Work that fits only on that node gets its three good GPUs, never the bad one.
    let small = admin
        .submit_job(&JobSubmitRequest::shell(1, 3, "sleep 600"))
        .await
        .expect("submit")
        .id;
    running(&admin, small, 0).await;
    let nodes = admin.nodes().await.expect("nodes");
    let on_node = nodes.iter().find(|n| n.name == node).expect("node");
    assert_eq!(
        on_node.gpus_free, 0,
        "a free count that includes a broken GPU"
    );
    for g in &on_node.gpus {
        let want = if g.index == bad { None } else { Some(small) };
        assert_eq!(g.allocated_to, want, "GPU {}", g.index);
    }

    // Once the GPU is repaired (the fault cleared), an operator returns
    // it; an operator's drain of another GPU moves the job holding it.
    c.client(i).gpu_fault(bad, "clear").await.expect("repair");
    common::wait_for("the repaired GPU read healthy", TIMEOUT, || {
        let c = c.client(i);
        async move {
            let text = c.metrics_text().await.ok()?;
            let label = format!("gpu=\"{bad}\"");
            text.lines()
                .any(|l| {
                    l.starts_with("DCGM_FI_DEV_XID_ERRORS{")
                        && l.contains(&label)
                        && l.ends_with(" 0")
                })
                .then_some(())
        }
    })
    .await;
    admin
        .drain_gpu(&node, bad, false, None)
        .await
        .expect("undrain");
    assert_eq!(gpu(&admin, &node, bad).await.health, "ok");
    let held = on_node
        .gpus
        .iter()
        .find(|g| g.index != bad)
        .map(|g| g.index)
        .expect("a held GPU");
    let small_epoch = admin.job(small).await.expect("job").epoch.unwrap_or(0);
    admin
        .drain_gpu(&node, held, true, Some("fan replacement"))
        .await
        .expect("drain");
    let drained = gpu(&admin, &node, held).await;
    assert_eq!(drained.health, "drained");
    assert_eq!(drained.health_reason.as_deref(), Some("fan replacement"));
    let again = running(&admin, small, small_epoch).await;
    let nodes = admin.nodes().await.expect("nodes");
    let held_now: Vec<u32> = nodes
        .iter()
        .filter(|n| n.name == node)
        .flat_map(|n| n.gpus.iter())
        .filter(|g| g.allocated_to == Some(small))
        .map(|g| g.index)
        .collect();
    assert_eq!(again.nodes, vec![node.clone()]);
    assert!(!held_now.contains(&held), "{held_now:?}");
    assert!(
        held_now.contains(&bad),
        "the returned GPU takes work again: {held_now:?}"
    );

    // Draining and returning GPUs is an operator's: a tenant's token is refused.
    admin
        .create_tenant(&shoal_sdk::TenantRequest {
            name: "vision".into(),
            ..shoal_sdk::TenantRequest::default()
        })
        .await
        .expect("tenant");
    let token = admin
        .create_api_token(&shoal_sdk::ApiTokenCreateRequest {
            tenant: Some("vision".into()),
            ..shoal_sdk::ApiTokenCreateRequest::default()
        })
        .await
        .expect("token")
        .token;
    let tenant = shoal_sdk::Client::new(admin.base_url(), Some(token));
    for drain in [true, false] {
        match tenant.drain_gpu(&node, bad, drain, None).await {
            Err(shoal_sdk::ClientError::Api { status: 403, .. }) => {}
            other => panic!("a tenant drained a GPU: {other:?}"),
        }
    }
    assert_eq!(gpu(&admin, &node, bad).await.health, "ok");
    c.shutdown().await;
}
