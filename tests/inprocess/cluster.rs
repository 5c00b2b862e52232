//! In-process multi-node clusters over real QUIC on 127.0.0.1: formation,
//! voter placement across failure domains, self-healing, and the security
//! boundary (certificates, join tokens, API tokens).

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use shoal_consensus::network::RaftRpc;
use shoal_node::agent::testkit::{node_config, LocalCluster};
use shoal_node::proto::{self, ErrorCode, Query, Request, Response};
use shoal_node::{Agent, StartMode};
use shoal_sdk::ClientError;
use std::collections::BTreeSet;
use std::time::Duration;

/// Waits until every node agrees on one leader and one voter set of
/// `voters`, and returns that leader (seen in the same check: asking again
/// later may catch an election in between).
async fn agreed(c: &LocalCluster, voters: usize) -> shoal_consensus::NodeId {
    let mut leader = None;
    c.wait_until(
        "agreement on leader and voter set",
        Duration::from_secs(60),
        |c| {
            leader = c.agreed_leader().map(|a| a.id());
            let ok = leader.is_some()
                && c.agents.iter().all(|a| a.voters().len() == voters)
                && c.agents
                    .iter()
                    .map(|a| a.voters())
                    .collect::<BTreeSet<_>>()
                    .len()
                    == 1;
            async move { ok }
        },
    )
    .await
    .expect("cluster agreement");
    leader.expect("an agreed leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_and_five_node_clusters_agree_on_leader_and_voters() {
    let _serial = common::one_at_a_time();
    for (n, voters) in [(3usize, 3usize), (5, 5)] {
        let c = LocalCluster::start(n, |_, _| {}).await.expect("cluster");
        agreed(&c, voters).await;
        // Every node's API reports the same leader and voters.
        let mut seen = BTreeSet::new();
        for i in 0..n {
            let s = c.client(i).status().await.expect("status");
            assert_eq!(s.members.len(), n);
            seen.insert((s.leader, s.voters.clone()));
        }
        assert_eq!(seen.len(), 1, "nodes disagree: {seen:?}");
        c.shutdown().await;
    }
}

/// Only the leader judges liveness, and a new leader starts judging
/// afresh: a node that died before the leader did must stay `down` in the
/// ledger through the change (it is judged again only once heard), while
/// the live ones stay alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_stays_down_when_the_leader_changes() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(5, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(Duration::from_secs(60))
        .await
        .expect("all alive");
    let leader = agreed(&c, 5).await;
    let victim = c
        .agents
        .iter()
        .position(|a| a.id() != leader)
        .expect("a follower");
    let victim_id = c.agents[victim].id();
    c.agents[victim].shutdown().await;
    let state_of = |a: &shoal_node::Agent, id| {
        a.ledger()
            .read()
            .ok()
            .and_then(|d| d.ledger.members.get(&id).map(|m| m.state))
    };
    c.wait_until("the victim down", Duration::from_secs(30), |c| {
        let ok = c
            .agents
            .iter()
            .filter(|a| a.id() != victim_id)
            .all(|a| state_of(a, victim_id) == Some(shoal_sdk::MemberState::Down));
        async move { ok }
    })
    .await
    .expect("victim down");
    let old = c
        .agents
        .iter()
        .position(|a| a.id() == leader)
        .expect("leader");
    c.agents[old].shutdown().await;
    let survivors: Vec<usize> = (0..5).filter(|i| *i != old && *i != victim).collect();
    // Watched throughout: a revival undone a moment later counts too.
    let mut revived = false;
    let mut watch_victim = |c: &LocalCluster| {
        revived |= survivors
            .iter()
            .any(|i| state_of(&c.agents[*i], victim_id) != Some(shoal_sdk::MemberState::Down));
    };
    c.wait_until("a new leader", Duration::from_secs(30), |c| {
        watch_victim(c);
        let ok = c.agents[survivors[0]]
            .current_leader()
            .is_some_and(|l| l != leader);
        async move { ok }
    })
    .await
    .expect("new leader");
    // Long enough for the new leader to judge every member, and to
    // declare the old one down.
    c.wait_until("the old leader down", Duration::from_secs(30), |c| {
        watch_victim(c);
        let ok = survivors
            .iter()
            .all(|i| state_of(&c.agents[*i], leader) == Some(shoal_sdk::MemberState::Down));
        async move { ok }
    })
    .await
    .expect("old leader down");
    assert!(
        !revived,
        "the dead node was alive again in a ledger meanwhile"
    );
    for i in &survivors {
        let a = &c.agents[*i];
        assert_eq!(
            state_of(a, victim_id),
            Some(shoal_sdk::MemberState::Down),
            "the dead node was revived in node {}'s ledger",
            a.id()
        );
        for j in &survivors {
            assert_eq!(
                state_of(a, c.agents[*j].id()),
                Some(shoal_sdk::MemberState::Alive)
            );
        }
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voters_span_zones_and_a_dead_voter_is_replaced_without_a_human() {
    let _serial = common::one_at_a_time();
    // Six nodes in three zones: five vote, one learns. Killing a voter must
    // bring a healthy learner in once `voter_replace_after` has passed.
    let zones = ["a", "a", "b", "b", "c", "c"];
    let c = LocalCluster::start(6, |i, cfg| {
        cfg.labels.insert("zone".into(), zones[i].into());
        cfg.membership.voter_replace_after_ms = 2_000;
    })
    .await
    .expect("cluster");
    let leader = agreed(&c, 5).await;
    let zone_of = |id: u64| zones[(id - 1) as usize];
    let voters = c.agents[0].voters();
    let spanned: BTreeSet<_> = voters.iter().map(|v| zone_of(*v)).collect();
    assert_eq!(
        spanned.len(),
        3,
        "voters {voters:?} must span all three zones"
    );

    let victim = *voters
        .iter()
        .find(|v| **v != leader)
        .expect("a non-leader voter");
    let victim_idx = c
        .agents
        .iter()
        .position(|a| a.id() == victim)
        .expect("victim");
    c.agents[victim_idx].shutdown().await;

    let healed = c
        .wait_until(
            "the dead voter to be replaced",
            Duration::from_secs(90),
            |c| {
                let ok = c.agents.iter().filter(|a| a.id() != victim).all(|a| {
                    let v = a.voters();
                    v.len() == 5 && !v.contains(&victim)
                });
                async move { ok }
            },
        )
        .await
        .expect("self-healing");
    println!("dead voter replaced {healed:?} after the kill (replace-after 2 s)");
    let survivor = (victim_idx + 1) % 6;
    let voters = c.agents[survivor].voters();
    let spanned: BTreeSet<_> = voters.iter().map(|v| zone_of(*v)).collect();
    assert_eq!(
        spanned.len(),
        3,
        "healed voters {voters:?} must still span all zones"
    );
    let nodes = c.client(survivor).nodes().await.expect("nodes");
    let dead = nodes
        .iter()
        .find(|n| n.id == victim)
        .expect("victim listed");
    assert_eq!(dead.state, shoal_sdk::MemberState::Down);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_calls_without_a_valid_token_get_401() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(1, |_, _| {}).await.expect("cluster");
    for token in [None, Some("sa1.nope".to_string())] {
        let client = shoal_sdk::Client::new(c.agents[0].api_url(), token);
        match client.status().await {
            Err(ClientError::Api { status, .. }) => assert_eq!(status, 401),
            other => panic!("expected 401, got {other:?}"),
        }
    }
    // Health and metrics stay open.
    let body = reqwest_get(&format!("{}/health", c.agents[0].api_url())).await;
    assert!(body.contains("\"ok\":true"), "{body}");
    let metrics = reqwest_get(&format!("{}/metrics", c.agents[0].api_url())).await;
    assert!(metrics.contains("shoal_raft_term"), "{metrics}");
    c.shutdown().await;
}

async fn reqwest_get(url: &str) -> String {
    // The SDK client is typed; a raw GET keeps this test honest about what
    // an unauthenticated scraper sees.
    let resp = shoal_sdk::Client::new(url.to_string(), None)
        .get::<serde_json::Value>("")
        .await;
    match resp {
        Ok(v) => v.to_string(),
        Err(ClientError::Decode { .. }) => raw_get(url).await,
        Err(e) => panic!("GET {url}: {e}"),
    }
}

async fn raw_get(url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("http url");
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .expect("path");
    let mut s = tokio::net::TcpStream::connect(host).await.expect("connect");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_expired_or_foreign_join_tokens_are_refused_clearly() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(1, |_, _| {}).await.expect("cluster");
    let via = c.agents[0].rpc_addr();
    let try_join = |i: usize, token: String| {
        let cfg = node_config(c.root(), i);
        async move { Agent::start(cfg, StartMode::Join { addr: via, token }).await }
    };

    // Right CA pin, unknown secret.
    let pin = c.join_token.rsplit('.').next().expect("pin").to_string();
    let forged = format!("sj1.{}.{pin}", "0".repeat(32));
    let err = try_join(1, forged)
        .await
        .err()
        .expect("forged token refused")
        .to_string();
    assert!(err.contains("unknown join token"), "{err}");

    // Malformed.
    let err = try_join(2, "hello".into())
        .await
        .err()
        .expect("malformed refused")
        .to_string();
    assert!(err.contains("malformed join token"), "{err}");

    // A token pinned to another CA: the joiner refuses to talk to the impostor.
    let other_pin = "ab".repeat(32);
    let err = try_join(3, format!("sj1.{}.{other_pin}", "1".repeat(32)))
        .await
        .err()
        .expect("pin mismatch refused")
        .to_string();
    assert!(err.contains("cannot join"), "{err}");

    // Expired: once the node itself lists it as expired.
    let admin = c.client(0);
    let expired = admin.create_token(Some(1)).await.expect("token");
    common::wait_for("the token to expire", Duration::from_secs(10), || {
        let admin = admin.clone();
        let id = expired.id.clone();
        async move {
            let tokens = admin.join_tokens().await.ok()?;
            tokens
                .iter()
                .any(|t| t.id == id && t.state == "expired")
                .then_some(())
        }
    })
    .await;
    let err = try_join(4, expired.token.clone())
        .await
        .err()
        .expect("expired refused")
        .to_string();
    assert!(
        err.contains(&format!("the join token {} has expired", expired.id)),
        "{err}"
    );

    // Nothing was admitted.
    assert_eq!(admin.nodes().await.expect("nodes").len(), 1);

    // A fresh token works, once: it is single use by default.
    let single = admin.create_token(None).await.expect("token");
    assert_eq!(single.uses, 1);
    let joined = try_join(5, single.token.clone())
        .await
        .expect("valid token joins");
    assert_eq!(admin.nodes().await.expect("nodes").len(), 2);
    let err = try_join(6, single.token.clone())
        .await
        .err()
        .expect("a spent token is refused")
        .to_string();
    assert!(
        err.contains(&format!(
            "the join token {} has been used up (1 of 1 uses)",
            single.id
        )),
        "{err}"
    );

    // Revoked.
    let revoked = admin.create_token(None).await.expect("token");
    admin.revoke_join_token(&revoked.id).await.expect("revoke");
    let err = try_join(7, revoked.token.clone())
        .await
        .err()
        .expect("a revoked token is refused")
        .to_string();
    assert!(
        err.contains(&format!("the join token {} was revoked", revoked.id)),
        "{err}"
    );
    assert_eq!(admin.nodes().await.expect("nodes").len(), 2);

    // The listing shows where each stands, and never a secret.
    let listed = admin.join_tokens().await.expect("ls");
    let state_of = |id: &str| {
        listed
            .iter()
            .find(|t| t.id == id)
            .map(|t| (t.state.clone(), t.uses_left, t.max_uses))
    };
    assert_eq!(state_of(&single.id), Some(("spent".into(), 0, 1)));
    assert_eq!(state_of(&revoked.id), Some(("revoked".into(), 1, 1)));
    assert_eq!(state_of(&expired.id).map(|s| s.0), Some("expired".into()));

    // Every refusal the leader judged is an audit event naming the token's
    // id, never its secret.
    let secret = |t: &str| t.split('.').nth(1).expect("secret").to_string();
    let secrets = [
        secret(&expired.token),
        secret(&single.token),
        secret(&revoked.token),
    ];
    let audit = common::wait_for(
        "the refused joins' audit events",
        Duration::from_secs(10),
        || {
            let admin = admin.clone();
            let wanted = [
                "unknown join token".to_string(),
                format!("the join token {} has expired", expired.id),
                format!("the join token {} has been used up", single.id),
                format!("the join token {} was revoked", revoked.id),
            ];
            async move {
                let audit: Vec<String> = admin
                    .events(0)
                    .await
                    .ok()?
                    .into_iter()
                    .filter(|e| e.kind == "audit" && e.message.contains("refused the join"))
                    .map(|e| e.message)
                    .collect();
                wanted
                    .iter()
                    .all(|w| audit.iter().any(|m| m.contains(w.as_str())))
                    .then_some(audit)
            }
        },
    )
    .await;
    for m in &audit {
        assert!(secrets.iter().all(|s| !m.contains(s.as_str())), "{m}");
    }
    joined.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_without_a_ca_signed_certificate_cannot_send_raft_rpcs_or_read_state() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(1, |_, _| {}).await.expect("cluster");
    let addr = c.agents[0].rpc_addr();
    let pin = c.join_token.rsplit('.').next().expect("pin").to_string();

    // No certificate at all: the TLS handshake passes (so that joins are
    // possible) but every request other than a join is refused.
    let vote = openraft::raft::VoteRequest::new(openraft::Vote::new(99, 42), None);
    for req in [
        Request::Raft(RaftRpc::Vote(vote)),
        Request::Query(Query::Status),
    ] {
        let (reply, _) = shoal_mesh::rpc::call_as_joiner(
            addr,
            &pin,
            &proto::encode(&req),
            Duration::from_secs(5),
        )
        .await
        .expect("exchange");
        match proto::decode::<Response>(&reply).expect("decodes") {
            Response::Error(e) => assert_eq!(e.code, ErrorCode::Unauthenticated),
            other => panic!("an unauthenticated peer got an answer: {other:?}"),
        }
    }

    // A certificate from another CA: the handshake itself fails.
    let foreign = shoal_mesh::CaBundle::generate("evil").expect("ca");
    let creds = foreign.issue("evil", 1).expect("creds");
    struct Silent;
    impl shoal_mesh::RpcHandler for Silent {
        fn handle(&self, _: shoal_mesh::PeerInfo, _: Vec<u8>) -> shoal_mesh::rpc::RpcFuture {
            Box::pin(async { Vec::new() })
        }
    }
    let evil = shoal_mesh::RpcEndpoint::serve(
        "127.0.0.1:0".parse().expect("addr"),
        &creds,
        std::sync::Arc::new(Silent),
    )
    .expect("endpoint");
    let req = proto::encode(&Request::Query(Query::Status));
    assert!(evil.call(addr, &req, Duration::from_secs(5)).await.is_err());

    // The term did not move: the forged vote had no effect.
    let s = c.client(0).status().await.expect("status");
    assert!(s.term < 99);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_joining_after_log_compaction_catch_up_from_a_snapshot_and_become_voters() {
    let _serial = common::one_at_a_time();
    // Snapshot every 20 entries and keep no log behind it, so the joiners
    // cannot be served from the log: they must install a snapshot over QUIC
    // while the membership changes that promote them are in flight.
    let tweak = |_: usize, cfg: &mut shoal_node::Config| {
        cfg.raft.snapshot_every = 20;
        cfg.raft.logs_kept_after_snapshot = 0;
    };
    let c = LocalCluster::start(1, tweak).await.expect("cluster");
    for i in 0..200 {
        c.client(0)
            .put_attr(&format!("pre/{i:03}"), "x")
            .await
            .expect("write");
    }
    let mut joined = Vec::new();
    for i in 1..3 {
        let mut cfg = node_config(c.root(), i);
        tweak(i, &mut cfg);
        let mode = StartMode::Join {
            addr: c.agents[0].rpc_addr(),
            token: c.join_token.clone(),
        };
        joined.push(Agent::start(cfg, mode).await.expect("join"));
    }
    let all: Vec<&Agent> = c.agents.iter().chain(joined.iter()).collect();
    let start = std::time::Instant::now();
    loop {
        let caught_up = all.iter().all(|a| {
            a.ledger()
                .read()
                .map(|d| {
                    d.ledger
                        .attrs
                        .keys()
                        .filter(|k| k.starts_with("pre/"))
                        .count()
                        == 200
                })
                .unwrap_or(false)
        });
        if caught_up && all.iter().all(|a| a.voters().len() == 3) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "joiners did not catch up from the snapshot"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for a in joined {
        a.shutdown().await;
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_leaves_membership_and_the_voters_reconverge() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(4, |_, _| {}).await.expect("cluster");
    let leader = agreed(&c, 3).await;
    let victim = c
        .agents
        .iter()
        .map(|a| a.id())
        .find(|id| *id != leader)
        .expect("follower");
    let li = c
        .agents
        .iter()
        .position(|a| a.id() == leader)
        .expect("leader idx");
    c.client(li)
        .remove_node(&victim.to_string())
        .await
        .expect("remove");
    c.wait_until(
        "the voters to reconverge without the removed node",
        Duration::from_secs(60),
        |c| {
            let ok = c.agents.iter().filter(|a| a.id() != victim).all(|a| {
                let v = a.voters();
                v.len() == 3 && !v.contains(&victim)
            });
            async move { ok }
        },
    )
    .await
    .expect("reconverge");
    let s = c.client(li).status().await.expect("status");
    assert!(
        s.members.iter().all(|m| m.id != victim),
        "removed node still listed: {s:?}"
    );
    assert!(!s.learners.contains(&victim));
    // Removing it twice, or removing the leader, is refused clearly.
    let err = c
        .client(li)
        .remove_node(&victim.to_string())
        .await
        .expect_err("twice");
    assert!(err.to_string().contains("already left"), "{err}");
    let err = c
        .client(li)
        .remove_node(&leader.to_string())
        .await
        .expect_err("leader");
    assert!(err.to_string().contains("leader"), "{err}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_latency_moves_vivaldi_estimates() {
    let _serial = common::one_at_a_time();
    // n4 is placed "40 ms away" from everyone (the kernel here has no netem):
    // every node adds 40 ms to its RTT samples across that link, in both
    // directions. n1's coordinate-based estimate to n4 must end up far above
    // its estimate to n2.
    let c = LocalCluster::start(4, |i, cfg| {
        let spec = if i == 3 { "n1=40,n2=40,n3=40" } else { "n4=40" };
        cfg.test_inject_rtt = shoal_node::peers::parse_injected_rtt(spec).expect("spec");
    })
    .await
    .expect("cluster");
    let (to_n2, to_n4) = {
        let start = std::time::Instant::now();
        loop {
            let v = c.agents[0].peer_views();
            let rtt = |name: &str| v.iter().find(|p| p.name == name).and_then(|p| p.rtt_ms);
            if let (Some(a), Some(b)) = (rtt("n2"), rtt("n4")) {
                if b > a + 20.0 {
                    break (a, b);
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "estimates never separated: {v:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    println!("n1's estimated RTT: to n2 {to_n2:.2} ms, to n4 {to_n4:.2} ms (40 ms injected)");
    c.shutdown().await;
}

/// The state `observer`'s own gossip view gives the member `id`.
fn gossip_state(observer: &Agent, id: shoal_consensus::NodeId) -> Option<String> {
    observer
        .peer_views()
        .into_iter()
        .find(|p| p.id == id)
        .map(|p| p.state)
}

/// The gossip address the ledger of `observer` records for `id`.
fn recorded_gossip_addr(observer: &Agent, id: shoal_consensus::NodeId) -> Option<String> {
    observer
        .ledger()
        .read()
        .ok()?
        .ledger
        .members
        .get(&id)
        .map(|m| m.spec.gossip_addr.clone())
}

/// Whether every node's own gossip view has every other node alive.
fn alive_in_every_gossip_view(c: &LocalCluster) -> bool {
    c.agents.iter().all(|a| {
        c.agents
            .iter()
            .filter(|b| b.id() != a.id())
            .all(|b| gossip_state(a, b.id()).as_deref() == Some("alive"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_node_restarted_on_another_gossip_port_is_alive_in_every_gossip_view_within_seconds(
) {
    let _serial = common::one_at_a_time();
    // The third node runs on a runtime of its own, so that it can crash:
    // dropping that runtime stops every task of the node where it stands,
    // and no QUIC close reaches its peers (as after `kill -9`, a power
    // loss, or an address that went away). Its peers keep the dead gossip
    // connection until QUIC's idle timeout. It comes back from its data
    // dir on a port it has never used (every node listens on port 0),
    // within that timeout, and every peer's own gossip view, not only the
    // ledger, must see it alive again within seconds.
    let mut c = LocalCluster::start(2, |_, _| {}).await.expect("cluster");
    let idx = 2;
    let crashable = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime for the node that crashes");
    let mode = StartMode::Join {
        addr: c.agents[0].rpc_addr(),
        token: c.join_token.clone(),
    };
    let first_life = crashable
        .spawn(Agent::start(node_config(c.root(), idx), mode))
        .await
        .expect("join task")
        .expect("join");
    let victim = first_life.id();
    c.agents.push(first_life);
    c.wait_all_alive(Duration::from_secs(60))
        .await
        .expect("alive");
    c.wait_until(
        "every node alive in every gossip view",
        Duration::from_secs(60),
        |c| {
            let ok = alive_in_every_gossip_view(c);
            async move { ok }
        },
    )
    .await
    .expect("gossip views");
    let old_addr = recorded_gossip_addr(&c.agents[0], victim).expect("recorded address");

    let crashed = c.agents.remove(idx);
    crashable.shutdown_background();
    drop(crashed);
    c.wait_until(
        "the crashed node down in every other gossip view",
        Duration::from_secs(30),
        |c| {
            let ok = c
                .agents
                .iter()
                .all(|a| gossip_state(a, victim).as_deref() == Some("down"));
            async move { ok }
        },
    )
    .await
    .expect("down");

    let restarted_at = std::time::Instant::now();
    let restarted = Agent::start(node_config(c.root(), idx), StartMode::Restart)
        .await
        .expect("restart");
    c.agents.push(restarted);
    c.wait_until(
        "the restarted node's new gossip address in every ledger",
        Duration::from_secs(30),
        |c| {
            let ok = c
                .agents
                .iter()
                .all(|a| recorded_gossip_addr(a, victim).is_some_and(|addr| addr != old_addr));
            async move { ok }
        },
    )
    .await
    .expect("new address recorded");
    c.wait_all_alive(Duration::from_secs(30))
        .await
        .expect("alive in every ledger");
    let in_ledger = restarted_at.elapsed();
    let seen = c
        .wait_until(
            "the restarted node alive in every gossip view, and every peer alive in its",
            Duration::from_secs(10),
            |c| {
                let ok = alive_in_every_gossip_view(c);
                async move { ok }
            },
        )
        .await;
    let views: Vec<_> = c.agents.iter().map(|a| (a.id(), a.peer_views())).collect();
    seen.unwrap_or_else(|e| panic!("{e}; gossip views: {views:?}"));
    println!(
        "node {victim} crashed and restarted off {old_addr}: alive in every ledger {in_ledger:?} \
         and in every gossip view {:?} after its restart",
        restarted_at.elapsed()
    );
    c.shutdown().await;
}
