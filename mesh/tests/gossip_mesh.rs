//! End-to-end gossip tests over real QUIC on 127.0.0.1 (admission, validation,
//! RTT, shutdown). The latency test lives in `convergence.rs`, its own test
//! binary, so it never shares the CPU with these.

mod common;

use std::time::{Duration, Instant};

use common::*;
use shoal_mesh::gossip::{GossipError, GossipTopic, NonMemberPolicy, RejectReason, WIRE_VERSION};

const MESH_TIMEOUT: Duration = Duration::from_secs(60);
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_adverts_from_a_non_member_are_rejected() {
    // Members tolerate the intruder's connection so its messages reach validation.
    let members = start_nodes(6, |c| c.non_member_policy = NonMemberPolicy::Tolerate).await;
    form_mesh(&members, MESH_TIMEOUT).await;

    // Node 3's genuine advert, converged everywhere.
    publish(&members[3], &advert(3, 1, 2)).await;
    assert!(
        wait_until(DELIVERY_TIMEOUT, || members
            .iter()
            .enumerate()
            .all(|(i, n)| i == 3 || n.observed().view.seq(3) == Some(1)))
        .await
    );

    // The intruder has a valid identity but is in nobody's member map; it
    // believes the members are its peers and dials them all.
    let intruder = start_node(config(|_| {})).await;
    intruder
        .handle
        .set_members(member_map(&members))
        .await
        .expect("set_members");
    assert!(
        wait_until_async(MESH_TIMEOUT, || async {
            let s = intruder.handle.status().await.expect("status");
            s.connected_members == members.len() && s.capacity_topic_peers == members.len()
        })
        .await,
        "intruder did not connect to every member"
    );

    // Forged advert claiming node 3, and a genuine control advert from node 1
    // published at the same moment.
    publish(&intruder, &advert(3, 1_000, 999)).await;
    publish(&members[1], &advert(1, 1, 7)).await;

    let intruder_id = intruder.peer_id();
    let settled = wait_until(DELIVERY_TIMEOUT, || {
        members.iter().enumerate().all(|(i, n)| {
            let o = n.observed();
            let control_arrived = i == 1 || o.view.seq(1) == Some(1);
            let forged_rejected = o
                .rejected
                .iter()
                .any(|(from, r)| *from == intruder_id && *r == RejectReason::AuthorNotMember);
            control_arrived && forged_rejected
        })
    })
    .await;
    assert!(settled, "control advert or rejections missing");

    for (i, node) in members.iter().enumerate() {
        if i == 3 {
            continue;
        }
        let o = node.observed();
        let entry = o.view.entry(3).expect("node 3 advert");
        assert_eq!(entry.advert.seq, 1, "member {i} accepted a forged advert");
        assert_eq!(entry.from, members[3].peer_id());
        assert_eq!(o.view.gpus_free(3, "H100"), Some(2));
    }
    intruder.handle.shutdown().await.expect("shutdown");
    shutdown_all(&members).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_member_connections_are_closed_by_default() {
    let members = start_nodes(2, |_| {}).await;
    form_mesh(&members, MESH_TIMEOUT).await;
    let intruder = start_node(config(|_| {})).await;
    intruder
        .handle
        .set_members(member_map(&members))
        .await
        .expect("set_members");
    let intruder_id = intruder.peer_id();
    let closed = wait_until(MESH_TIMEOUT, || {
        let o = intruder.observed();
        members
            .iter()
            .all(|m| o.disconnected.contains(&m.peer_id()))
    })
    .await;
    assert!(closed, "members did not close the intruder's connections");
    for member in &members {
        assert!(
            !member.observed().connected.contains(&intruder_id),
            "a member reported the intruder as connected"
        );
    }
    intruder.handle.shutdown().await.expect("shutdown");
    shutdown_all(&members).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_payload_from_a_member_is_rejected() {
    let nodes = start_nodes(4, |_| {}).await;
    form_mesh(&nodes, MESH_TIMEOUT).await;
    let bad = nodes[2].peer_id();

    // Garbage body with a valid version byte, and a wrong version byte.
    let garbage = vec![
        WIRE_VERSION,
        0xFF,
        0xFF,
        0xFF,
        0xFF,
        0xFF,
        0xFF,
        0xFF,
        0xFF,
        0xFF,
        0xFF,
    ];
    nodes[2]
        .handle
        .publish_raw(GossipTopic::Capacity, garbage)
        .await
        .expect("publish garbage");
    let mut wrong_version = advert(2, 1, 1).encode().expect("encode");
    wrong_version[0] = WIRE_VERSION + 1;
    nodes[2]
        .handle
        .publish_raw(GossipTopic::Capacity, wrong_version)
        .await
        .expect("publish wrong version");
    // Control from a different member.
    publish(&nodes[0], &advert(0, 1, 3)).await;

    let seen = wait_until(DELIVERY_TIMEOUT, || {
        nodes.iter().enumerate().all(|(i, n)| {
            if i == 2 {
                return true;
            }
            let o = n.observed();
            let malformed = o
                .rejected
                .iter()
                .filter(|(from, r)| *from == bad && matches!(r, RejectReason::Malformed(_)))
                .count();
            (i == 0 || o.view.seq(0) == Some(1)) && malformed >= 2
        })
    })
    .await;
    assert!(
        seen,
        "expected two Malformed rejections and the control advert"
    );
    for (i, node) in nodes.iter().enumerate() {
        if i != 2 {
            assert!(
                node.observed().view.get(2).is_none(),
                "node {i} view changed"
            );
        }
    }
    shutdown_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_adverts_are_ignored_without_rejection() {
    let nodes = start_nodes(3, |_| {}).await;
    form_mesh(&nodes, MESH_TIMEOUT).await;
    // Gossip does not order messages, so first let seq 5 settle everywhere;
    // then seq 4 is stale wherever and whenever it arrives.
    publish(&nodes[0], &advert(0, 5, 1)).await;
    assert!(
        wait_until(DELIVERY_TIMEOUT, || nodes[1..].iter().all(|n| n
            .observed()
            .view
            .seq(0)
            == Some(5)))
        .await
    );
    publish(&nodes[0], &advert(0, 4, 9)).await;
    publish(&nodes[0], &advert(0, 6, 2)).await;
    assert!(
        wait_until(DELIVERY_TIMEOUT, || nodes[1..].iter().all(|n| n
            .observed()
            .view
            .seq(0)
            == Some(6)))
        .await
    );
    for node in &nodes[1..] {
        let o = node.observed();
        assert!(!o.arrivals.contains_key(&(0, 4)), "stale advert delivered");
        assert!(
            o.rejected.is_empty(),
            "stale advert was penalised: {:?}",
            o.rejected
        );
    }
    shutdown_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_and_ping_rtts_arrive() {
    let nodes = start_nodes(3, |c| c.ping_interval = Duration::from_millis(200)).await;
    form_mesh(&nodes, MESH_TIMEOUT).await;
    let publish_deadline = Instant::now() + DELIVERY_TIMEOUT;
    while let Err(e) = nodes[1].handle.publish_heartbeat(1, 1, 123).await {
        assert!(Instant::now() < publish_deadline, "heartbeat publish: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ok = wait_until(DELIVERY_TIMEOUT, || {
        nodes.iter().enumerate().all(|(i, n)| {
            let o = n.observed();
            let rtts_from_all =
                nodes
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .all(|(_, other)| {
                        o.rtts
                            .iter()
                            .any(|(p, rtt)| *p == other.peer_id() && *rtt < Duration::from_secs(5))
                    });
            let heartbeat = i == 1 || o.heartbeats.contains(&(nodes[1].peer_id(), 1, 1));
            rtts_from_all && heartbeat
        })
    })
    .await;
    assert!(ok, "missing RTT or heartbeat events");
    shutdown_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_the_task_and_peers_notice() {
    let nodes = start_nodes(2, |_| {}).await;
    form_mesh(&nodes, MESH_TIMEOUT).await;
    let clone = nodes[0].handle.clone();
    tokio::time::timeout(Duration::from_secs(10), nodes[0].handle.shutdown())
        .await
        .expect("shutdown finished in time")
        .expect("shutdown succeeded");
    assert!(matches!(clone.status().await, Err(GossipError::Stopped)));
    assert!(matches!(
        clone.publish_capacity(&advert(0, 1, 1)).await,
        Err(GossipError::Stopped)
    ));
    // A second shutdown is a no-op.
    clone.shutdown().await.expect("idempotent shutdown");
    let gone = nodes[0].peer_id();
    assert!(
        wait_until(DELIVERY_TIMEOUT, || nodes[1]
            .observed()
            .disconnected
            .contains(&gone))
        .await,
        "peer did not notice the shutdown"
    );
    nodes[1].handle.shutdown().await.expect("shutdown");
}
