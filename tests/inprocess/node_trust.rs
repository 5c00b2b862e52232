//! A member's certificate proves who it is, never what it may do. A crafted
//! client holding a valid certificate of one member (issued by the cluster
//! CA for that member's id) tries what a compromised node would: propose
//! commands about other nodes, mint tokens, speak Raft in the leader's name,
//! remove another node, pass off a made-up user token. Every attempt is
//! refused and leaves an audit event; the member's own business still works.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use shoal_consensus::network::RaftRpc;
use shoal_consensus::{Command, LedgerResponse};
use shoal_mesh::rpc::RpcFuture;
use shoal_mesh::{CaBundle, PeerInfo, RpcEndpoint, RpcHandler};
use shoal_node::agent::testkit::LocalCluster;
use shoal_node::proto::{self, ErrorCode, Request, Response, UserToken};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

struct Silent;
impl RpcHandler for Silent {
    fn handle(&self, _: PeerInfo, _: Vec<u8>) -> RpcFuture {
        Box::pin(async { Vec::new() })
    }
}

/// The CA key, from a voter's disk (it is not in the ledger).
pub fn ca_key_of(c: &LocalCluster) -> String {
    c.agents
        .iter()
        .find_map(|a| shoal_node::trust::ca_key::load(a.data_dir()))
        .expect("a voter holds the CA key")
}

/// The leader every node agrees on, once there is one.
async fn agreed_leader(c: &LocalCluster) -> &shoal_node::agent::Agent {
    c.wait_until("a leader", TIMEOUT, |c| {
        let ok = c.agreed_leader().is_some();
        async move { ok }
    })
    .await
    .expect("a leader");
    c.agreed_leader().expect("leader")
}

/// The cluster CA with its key, as a voter holds it.
pub fn cluster_ca(c: &LocalCluster) -> CaBundle {
    let d = c.agents[0].ledger();
    let d = d.read().expect("ledger");
    let cluster = d.ledger.cluster.as_ref().expect("bootstrapped");
    CaBundle {
        cert_pem: cluster.ca_cert_pem.clone(),
        key_pem: ca_key_of(c),
    }
}

/// An RPC client with member `id`'s certificate, as that node would hold it.
fn impersonate(c: &LocalCluster, id: u64, name: &str) -> RpcEndpoint {
    let ca = cluster_ca(c);
    let creds = ca.issue(name, id).expect("credentials");
    RpcEndpoint::serve(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        &creds,
        Arc::new(Silent),
    )
    .expect("endpoint")
}

async fn call(client: &RpcEndpoint, to: SocketAddr, req: &Request) -> Response {
    let reply = client
        .call(to, &proto::encode(req), Duration::from_secs(10))
        .await
        .expect("an answer");
    proto::decode(&reply).expect("a response")
}

fn refused(r: &Response) -> bool {
    matches!(
        r,
        Response::Write {
            response: LedgerResponse::Denied(_),
            ..
        }
    ) || matches!(r, Response::Error(e) if e.code == ErrorCode::Forbidden)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_certificate_proves_identity_not_authority() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(3, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let leader = agreed_leader(&c).await;
    let leader_id = leader.id();
    let follower = c
        .agents
        .iter()
        .find(|a| a.id() != leader_id)
        .expect("a follower");
    let other = c
        .agents
        .iter()
        .find(|a| a.id() != leader_id && a.id() != follower.id())
        .expect("a second follower");
    let rogue = impersonate(&c, follower.id(), follower.name());
    let tokens_before = leader
        .ledger()
        .read()
        .expect("ledger")
        .ledger
        .api_tokens
        .len();

    // Commands about someone else, or a user's, with only a certificate.
    let other_spec = other.ledger().read().expect("ledger").ledger.members[&other.id()]
        .spec
        .clone();
    let mut hijacked = other_spec.clone();
    hijacked.rpc_addr = "203.0.113.7:7000".into();
    for cmd in [
        Command::UpdateMember {
            id: other.id(),
            spec: hijacked,
        },
        Command::CreateApiToken {
            hash: "0".repeat(64),
            name: "rogue".into(),
            tenant: None,
            expires_at_ms: None,
        },
        Command::SetDrain {
            id: other.id(),
            drain: true,
        },
    ] {
        let answer = call(&rogue, leader.rpc_addr(), &Request::Write(cmd.clone())).await;
        assert!(refused(&answer), "{cmd:?} was not refused: {answer:?}");
    }
    // Another node's removal without an admin token.
    let answer = call(
        &rogue,
        leader.rpc_addr(),
        &Request::RemoveMember {
            id: other.id(),
            token: None,
        },
    )
    .await;
    assert!(refused(&answer), "removal was not refused: {answer:?}");
    // A user token it made up.
    let answer = call(
        &rogue,
        leader.rpc_addr(),
        &Request::WriteAs {
            token: UserToken("made-up".into()),
            cmd: Command::PutAttr {
                key: "k".into(),
                value: "v".into(),
            },
        },
    )
    .await;
    assert!(
        matches!(&answer, Response::Error(e) if e.code == ErrorCode::Unauthenticated),
        "{answer:?}"
    );
    // AppendEntries in the leader's name, to the other follower.
    let term = leader.node().ledger().raft_metrics().borrow().current_term;
    let heartbeat = openraft::raft::AppendEntriesRequest {
        vote: openraft::Vote::new_committed(term + 1, leader_id),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let answer = call(
        &rogue,
        other.rpc_addr(),
        &Request::Raft(RaftRpc::AppendEntries(heartbeat)),
    )
    .await;
    assert!(
        refused(&answer),
        "a forged AppendEntries was not refused: {answer:?}"
    );

    // A renewal asked in the leader's name is signed for the asker alone.
    let (_, csr_pem) = shoal_mesh::tls::new_key_and_csr("anything").expect("csr");
    let answer = call(
        &rogue,
        leader.rpc_addr(),
        &Request::RenewCertificate {
            member: leader_id,
            csr_pem,
        },
    )
    .await;
    let Response::Certificate(cert_pem) = answer else {
        panic!("a member's renewal was not answered: {answer:?}");
    };
    let der = shoal_mesh::tls::pem_to_der(&cert_pem).expect("a certificate");
    assert_eq!(
        shoal_mesh::tls::member_id_of(&der),
        Some(follower.id()),
        "a renewal must name the member that asked, not the one it wrote"
    );

    // Nothing changed, and the refusals are in the audit log.
    let expected = [
        format!(
            "node {} may not change member {}",
            follower.id(),
            other.id()
        ),
        format!("node {} may not create tokens", follower.id()),
        format!("node {} may not drain nodes", follower.id()),
        format!("it may remove only itself, not node {}", other.id()),
        format!(
            "member {} sent a Raft message in the name of node {leader_id}",
            follower.id()
        ),
    ];
    c.wait_until("every refusal audited", TIMEOUT, |c| {
        let d = c.agents[0].ledger();
        let d = d.read().expect("ledger");
        let audit: Vec<&str> = d
            .ledger
            .events
            .after(0)
            .filter(|e| e.spec.kind == "audit")
            .map(|e| e.spec.message.as_str())
            .collect();
        let ok = expected
            .iter()
            .all(|m| audit.iter().any(|a| a.contains(m.as_str())));
        async move { ok }
    })
    .await
    .expect("audit events");
    {
        let d = leader.ledger();
        let d = d.read().expect("ledger");
        assert_eq!(d.ledger.api_tokens.len(), tokens_before);
        assert_eq!(d.ledger.members[&other.id()].spec, other_spec);
        assert!(d
            .ledger
            .members
            .values()
            .all(|m| !m.spec.rpc_addr.starts_with("203.")));
    }
    let drained = c.agents[0]
        .ledger()
        .read()
        .expect("ledger")
        .ledger
        .workload
        .drained
        .contains(&other.id());
    assert!(!drained, "the forged drain was applied");

    // The member's own business is still its own: its record, as itself.
    let own_spec = follower.ledger().read().expect("ledger").ledger.members[&follower.id()]
        .spec
        .clone();
    let answer = call(
        &rogue,
        leader.rpc_addr(),
        &Request::Write(Command::UpdateMember {
            id: follower.id(),
            spec: own_spec,
        }),
    )
    .await;
    assert!(
        matches!(
            answer,
            Response::Write {
                response: LedgerResponse::Ok,
                ..
            }
        ),
        "{answer:?}"
    );

    // A write sent again with the same id (a retry after an attempt whose
    // answer was lost) is answered as the first was and applied once; the
    // id is the member's own, so a forged inner id is refused.
    let create = Request::WriteAs {
        token: UserToken(c.admin_token.clone()),
        cmd: Command::CreateTenant {
            name: "once".into(),
            limits: Default::default(),
        },
    };
    let once = |nonce: u64, req: &Request| Request::Once {
        nonce,
        req: Box::new(proto::decode(&proto::encode(req)).expect("a copy")),
    };
    let written = |r: &Response| match r {
        Response::Write { response, .. } => response.clone(),
        other => panic!("not a write answer: {other:?}"),
    };
    let first = call(&rogue, leader.rpc_addr(), &once(77, &create)).await;
    assert_eq!(written(&first), LedgerResponse::Ok);
    let retry = call(&rogue, leader.rpc_addr(), &once(77, &create)).await;
    assert_eq!(
        written(&retry),
        LedgerResponse::Ok,
        "the retry is answered as the first attempt"
    );
    let another = call(&rogue, leader.rpc_addr(), &once(78, &create)).await;
    assert!(
        matches!(written(&another), LedgerResponse::Rejected(m) if m.contains("exists")),
        "{another:?}"
    );
    let forged = Request::Write(Command::Once {
        id: shoal_consensus::once::WriteId {
            origin: other.id(),
            nonce: 77,
        },
        cmd: Box::new(Command::PutAttr {
            key: "forged".into(),
            value: "v".into(),
        }),
    });
    let answer = call(&rogue, leader.rpc_addr(), &once(79, &forged)).await;
    assert!(
        refused(&answer),
        "a member chose a write id's origin: {answer:?}"
    );
    let forged_attr = leader
        .ledger()
        .read()
        .expect("ledger")
        .ledger
        .attrs
        .contains_key("forged");
    assert!(!forged_attr, "the forged write was applied");

    rogue.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_nodes_certificate_is_refused_within_seconds() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(3, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let leader = agreed_leader(&c).await;
    let leader_id = leader.id();
    let removed = c
        .agents
        .iter()
        .find(|a| a.id() != leader_id)
        .expect("a follower");
    // The certificate outlives the membership: valid for days, signed by the CA.
    let stolen = impersonate(&c, removed.id(), removed.name());
    let status = Request::Query(proto::Query::Status);
    assert!(
        matches!(
            call(&stolen, leader.rpc_addr(), &status).await,
            Response::Status(_)
        ),
        "a member's certificate is accepted before its removal"
    );
    let admin = shoal_sdk::Client::new(leader.api_url(), Some(c.admin_token.clone()));
    admin
        .remove_node(&removed.id().to_string())
        .await
        .expect("removed");
    let removed_at = std::time::Instant::now();
    let survivors: Vec<SocketAddr> = c
        .agents
        .iter()
        .filter(|a| a.id() != removed.id())
        .map(|a| a.rpc_addr())
        .collect();
    loop {
        let mut refused = 0;
        for addr in &survivors {
            if refused_as_left(&call(&stolen, *addr, &status).await) {
                refused += 1;
            }
        }
        if refused == survivors.len() {
            break;
        }
        assert!(
            removed_at.elapsed() < Duration::from_secs(5),
            "a removed node's certificate was still accepted after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The removed node itself notices: connected, it applies its own
    // removal (or is refused first by a peer that applied it sooner).
    c.wait_until("the removed node to notice", TIMEOUT, |_| {
        let heard = removed.removed().is_some();
        async move { heard }
    })
    .await
    .expect("a connected node notices its own removal");
    let why = removed.removed().unwrap_or_default();
    assert!(
        why.contains("ledger records") || why.contains("refused"),
        "{why}"
    );
    stolen.shutdown().await;
    c.shutdown().await;
}

fn refused_as_left(r: &Response) -> bool {
    matches!(r, Response::Error(e) if e.code == ErrorCode::Removed && e.message.contains("has left"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_lived_certificates_are_renewed_before_they_expire() {
    let _serial = common::one_at_a_time();
    const LIFETIME_S: u64 = 15;
    let c = LocalCluster::start(3, |_, cfg| cfg.cert_lifetime_s = LIFETIME_S)
        .await
        .expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let first_expiry = |a: &shoal_node::agent::Agent| {
        let ident = shoal_node::identity::load_identity(a.data_dir())
            .expect("identity")
            .expect("saved");
        shoal_mesh::tls::cert_validity(&ident.credentials.cert_pem)
            .expect("validity")
            .1
    };
    let original: Vec<i64> = c.agents.iter().map(first_expiry).collect();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64
    };
    assert!(
        original.iter().all(|e| *e <= now() + LIFETIME_S as i64 + 1),
        "certificates carry the configured lifetime: {original:?}"
    );
    // Past the first certificates' expiry, every node has a renewed one...
    let latest = *original.iter().max().expect("three nodes");
    c.wait_until(
        "every certificate renewed and the old ones expired",
        TIMEOUT,
        |c| {
            let renewed = c
                .agents
                .iter()
                .zip(&original)
                .all(|(a, first)| first_expiry(a) > *first);
            let ok = renewed && now() > latest + 1;
            async move { ok }
        },
    )
    .await
    .expect("renewed");
    // ...that a new client accepts (it verifies the node's certificate at
    // the handshake), and the cluster still commits through every node.
    let fresh = impersonate(&c, c.agents[1].id(), c.agents[1].name());
    for a in &c.agents {
        let answer = call(&fresh, a.rpc_addr(), &Request::Query(proto::Query::Status)).await;
        assert!(
            matches!(answer, Response::Status(_) | Response::Error(_)),
            "node {} did not answer over a new connection",
            a.id()
        );
    }
    for (i, a) in c.agents.iter().enumerate() {
        let cmd = Command::PutAttr {
            key: format!("after-renewal/{i}"),
            value: "1".into(),
        };
        let (answer, _) = a.write_as(&c.admin_token, cmd).await.expect("write");
        assert_eq!(answer, LedgerResponse::Ok);
    }
    c.wait_all_alive(TIMEOUT).await.expect("still alive");
    fresh.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voters_hold_the_ca_key_and_a_learners_disk_never_does() {
    let _serial = common::one_at_a_time();
    // Four nodes: three voters and a learner.
    let c = LocalCluster::start(4, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let holds =
        |a: &shoal_node::agent::Agent| shoal_node::trust::ca_key::load(a.data_dir()).is_some();
    c.wait_until(
        "three voters, each holding the CA key, and no one else",
        TIMEOUT,
        |c| {
            let ok = c.agreed_leader().is_some_and(|l| {
                let voters = l.voters();
                voters.len() == 3
                    && c.agents
                        .iter()
                        .all(|a| holds(a) == voters.contains(&a.id()))
            });
            async move { ok }
        },
    )
    .await
    .expect("custody converged");
    let key = ca_key_of(&c);
    // A line from the middle of the key's PEM: found in no learner's file.
    let needle = key
        .lines()
        .find(|l| l.len() > 40 && !l.starts_with("-----"))
        .expect("a base64 line")
        .to_string();
    let leader = c.agreed_leader().expect("leader");
    let voters = leader.voters();
    let learner = c
        .agents
        .iter()
        .find(|a| !voters.contains(&a.id()))
        .expect("a learner");
    for entry in walk(learner.data_dir()) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&needle),
            "the learner's {} contains the CA key",
            entry.display()
        );
    }
    // The ledger a learner replicates has no key in it at all.
    {
        let d = learner.ledger();
        let d = d.read().expect("ledger");
        let encoded = format!("{:?}", d.ledger.cluster);
        assert!(!encoded.contains(&needle));
    }
    // With the learner's own certificate: the key is not handed over, and
    // it may not campaign (nor lead) to get it another way.
    let rogue = impersonate(&c, learner.id(), learner.name());
    let fingerprint = cluster_ca(&c).fingerprint().expect("fingerprint");
    let answer = call(
        &rogue,
        leader.rpc_addr(),
        &Request::FetchCaKey { fingerprint },
    )
    .await;
    assert!(
        refused(&answer),
        "a learner got an answer to FetchCaKey: {answer:?}"
    );
    let term = leader.node().ledger().raft_metrics().borrow().current_term;
    let campaign = openraft::raft::VoteRequest {
        vote: openraft::Vote::new(term + 1, learner.id()),
        last_log_id: None,
    };
    for voter in c.agents.iter().filter(|a| voters.contains(&a.id())) {
        let answer = call(
            &rogue,
            voter.rpc_addr(),
            &Request::Raft(RaftRpc::Vote(campaign.clone())),
        )
        .await;
        assert!(
            matches!(&answer, Response::Error(e) if e.code == ErrorCode::Forbidden && e.message.contains("learner")),
            "a learner's vote request was served by node {}: {answer:?}",
            voter.id()
        );
    }
    rogue.shutdown().await;
    c.shutdown().await;
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Only the leader may ask a voter to stand for election at once (its
/// graceful hand-over): a follower's certificate asking is refused, and
/// leadership stays where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_may_ask_a_voter_to_stand() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(3, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let leader = agreed_leader(&c).await;
    let leader_id = leader.id();
    let followers: Vec<_> = c.agents.iter().filter(|a| a.id() != leader_id).collect();
    let rogue = impersonate(&c, followers[0].id(), followers[0].name());
    let answer = call(&rogue, followers[1].rpc_addr(), &Request::ElectNow).await;
    assert!(
        matches!(&answer, Response::Error(e) if e.code == ErrorCode::Forbidden),
        "a follower's ElectNow was served: {answer:?}"
    );
    let term = leader.node().ledger().raft_metrics().borrow().current_term;
    // A served ElectNow starts a campaign before it answers, so the term
    // would already have moved; a write the leader commits and the target
    // applies afterwards shows the leader still leads it.
    let admin = shoal_sdk::Client::new(leader.api_url(), Some(c.admin_token.clone()));
    let written = admin
        .put_attr("after-a-refused-elect-now", "1")
        .await
        .expect("a write through the leader");
    let target = followers[1];
    c.wait_until("the target to apply the write", TIMEOUT, |_| {
        let applied = target
            .node()
            .ledger()
            .raft_metrics()
            .borrow()
            .last_applied
            .is_some_and(|l| l.index >= written.index);
        async move { applied }
    })
    .await
    .expect("applied");
    let metrics = followers[1].node().ledger().raft_metrics().borrow().clone();
    assert_eq!(
        (metrics.current_leader, metrics.current_term),
        (Some(leader_id), term),
        "leadership moved after a refused ElectNow"
    );
}

/// A peer region's secret is handed over only to a current member of this
/// cluster: a certificate the cluster CA signed for an id it never admitted
/// gets nothing, and a member's certificate stops working for it once the
/// member is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_regions_secret_is_handed_only_to_current_members() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(3, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let leader = agreed_leader(&c).await;
    let leader_id = leader.id();
    let secret = "sa1.a-peer-regions-secret-for-this-test";
    let peer = shoal_consensus::federation::PeerRegion {
        name: "eu-9".into(),
        cluster_id: "c-peer".into(),
        ca_cert_pem: "-----BEGIN CERTIFICATE-----\npeer\n-----END CERTIFICATE-----\n".into(),
        api_urls: vec!["https://127.0.0.1:9".into()],
        outbound_secret_hash: shoal_consensus::tokens::hash_secret(secret),
        inbound_token_hash: shoal_consensus::tokens::hash_secret("sa1.the-peers-own"),
        joined_at_ms: 0,
    };
    // As a join does: the secret on the joining node's disk first, then
    // the record with its hash.
    shoal_node::federation::secrets::store(leader.data_dir(), &peer.name, secret)
        .expect("store the secret");
    let (answer, _) = leader
        .node()
        .ledger()
        .write_local(Command::AddPeerRegion { peer })
        .await
        .expect("the peer recorded");
    assert_eq!(answer, LedgerResponse::Ok);
    let ask = Request::FetchPeerSecret {
        region: "eu-9".into(),
    };
    let handed =
        |r: &Response| matches!(r, Response::PeerSecret(Some(UserToken(s))) if s == secret);

    let member = c
        .agents
        .iter()
        .find(|a| a.id() != leader_id)
        .expect("a follower");
    let as_member = impersonate(&c, member.id(), member.name());
    let answer = call(&as_member, leader.rpc_addr(), &ask).await;
    assert!(
        handed(&answer),
        "a member was not handed the secret: {answer:?}"
    );

    let stranger = impersonate(&c, 4242, "stranger");
    let answer = call(&stranger, leader.rpc_addr(), &ask).await;
    assert!(
        !handed(&answer),
        "an id the cluster never admitted got the secret"
    );

    let admin = shoal_sdk::Client::new(leader.api_url(), Some(c.admin_token.clone()));
    admin
        .remove_node(&member.id().to_string())
        .await
        .expect("removed");
    c.wait_until("the leader to apply the removal", TIMEOUT, |_| {
        let left = leader.node().ledger().read().is_ok_and(|d| {
            d.ledger
                .members
                .get(&member.id())
                .is_some_and(|m| m.state == shoal_sdk::MemberState::Left)
        });
        async move { left }
    })
    .await
    .expect("applied");
    let answer = call(&as_member, leader.rpc_addr(), &ask).await;
    assert!(
        !handed(&answer),
        "a removed member was still handed the secret"
    );
}

/// A member outside the Raft replicas (it follows the log from one) is
/// still only a member: its certificate does not let it campaign, claim
/// to lead or renew another member's lease, and the log it follows is handed to no one the cluster never
/// admitted, even with a certificate the CA signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_member_may_not_lead_and_a_stranger_gets_no_log() {
    let _serial = common::one_at_a_time();
    // Nine nodes: five voters, two learners, two relayed members.
    let c = LocalCluster::start(9, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let mut relayed_id = None;
    c.wait_until("bounded replicas", TIMEOUT, |c| {
        relayed_id = c.agreed_leader().and_then(|l| {
            let m = l.node().ledger().raft_metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            let in_raft: Vec<u64> = membership.nodes().map(|(id, _)| *id).collect();
            (membership.voter_ids().count() == 5 && in_raft.len() == 7)
                .then(|| c.agents.iter().find(|a| !in_raft.contains(&a.id())))
                .flatten()
                .map(|a| a.id())
        });
        let ok = relayed_id.is_some();
        async move { ok }
    })
    .await
    .expect("a relayed member");
    let relayed = c.agent(relayed_id.expect("id")).expect("agent");
    let leader = c.agreed_leader().expect("leader");
    let voters = leader.voters();
    let rogue = impersonate(&c, relayed.id(), relayed.name());
    let term = leader.node().ledger().raft_metrics().borrow().current_term;
    let campaign = openraft::raft::VoteRequest {
        vote: openraft::Vote::new(term + 1, relayed.id()),
        last_log_id: leader.node().ledger().raft_metrics().borrow().last_applied,
    };
    let mut claim = openraft::Vote::new(term + 1, relayed.id());
    claim.commit();
    let lead = openraft::raft::AppendEntriesRequest::<shoal_consensus::types::TypeConfig> {
        vote: claim,
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    for voter in c.agents.iter().filter(|a| voters.contains(&a.id())) {
        for req in [
            Request::Raft(RaftRpc::Vote(campaign.clone())),
            Request::Raft(RaftRpc::AppendEntries(lead.clone())),
        ] {
            let answer = call(&rogue, voter.rpc_addr(), &req).await;
            assert!(
                matches!(&answer, Response::Error(e) if e.code == ErrorCode::Forbidden && e.message.contains("not a voter")),
                "node {} served a relayed member's bid to lead: {answer:?}",
                voter.id()
            );
        }
    }
    // Nor may it vouch for another member's lease: only a replica the
    // leader chose passes renewals on.
    let vouch = Request::RenewFor {
        members: vec![leader.id()],
    };
    let answer = call(&rogue, leader.rpc_addr(), &vouch).await;
    assert!(
        matches!(&answer, Response::Error(e) if e.code == ErrorCode::Forbidden),
        "the leader took a relayed member's word for another's lease: {answer:?}"
    );
    rogue.shutdown().await;
    // Its own certificate does get it the log.
    let member = impersonate(&c, relayed.id(), relayed.name());
    let follow = Request::FollowLog {
        after: None,
        wait_ms: 0,
    };
    let answer = call(&member, leader.rpc_addr(), &follow).await;
    assert!(
        matches!(&answer, Response::LogEntries { entries, .. } if !entries.is_empty())
            || matches!(&answer, Response::LogSnapshot { .. }),
        "a member's log request: {answer:?}"
    );
    member.shutdown().await;
    // An id the CA signed but the cluster never admitted gets nothing.
    let stranger = impersonate(&c, 999, "stranger");
    for a in &c.agents {
        let answer = call(&stranger, a.rpc_addr(), &follow).await;
        assert!(
            matches!(&answer, Response::Error(e) if e.code == ErrorCode::Forbidden),
            "node {} handed its log to a stranger: {answer:?}",
            a.id()
        );
    }
    stranger.shutdown().await;
    c.shutdown().await;
}
