//! `shoal ca rotate` on a live cluster: a new CA is introduced, every
//! node's certificate is re-issued by it and the old CA is retired, while
//! a gang keeps running in the same epoch and writes keep committing. A
//! leader lost mid-rotation is replaced and the new leader carries on from
//! the ledger; a member that is down holds the rotation until it is
//! removed, and the old CA is never retired while a member still has one
//! of its certificates.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;
use crate::node_trust::cluster_ca;

use shoal_consensus::workload::JobState;
use shoal_consensus::NodeId;
use shoal_mesh::rpc::RpcFuture;
use shoal_mesh::tls::{fingerprint_pem, issued_by, split_certs};
use shoal_mesh::{CaBundle, NodeCredentials, PeerInfo, RpcEndpoint, RpcHandler};
use shoal_node::agent::testkit::{node_config, LocalCluster};
use shoal_node::agent::{Agent, StartMode};
use shoal_node::proto::{self, Request, Response};
use shoal_sdk::{ApiTokenCreateRequest, Client, ClientError, TenantRequest};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(90);

struct Silent;
impl RpcHandler for Silent {
    fn handle(&self, _: PeerInfo, _: Vec<u8>) -> RpcFuture {
        Box::pin(async { Vec::new() })
    }
}

/// The node's credentials as it saved them (what it serves and dials with).
fn credentials(a: &Agent) -> NodeCredentials {
    shoal_node::identity::load_identity(a.data_dir())
        .expect("identity")
        .expect("saved")
        .credentials
}

/// Fingerprints of the CA certificates a node trusts.
fn trusted(a: &Agent) -> Vec<String> {
    let mut fps: Vec<String> = split_certs(&credentials(a).ca_pem)
        .iter()
        .filter_map(|c| fingerprint_pem(c))
        .collect();
    fps.sort();
    fps
}

/// Whether node `a` is done: it trusts `ca` alone, its certificate is
/// `ca`'s, and its ledger has no rotation left.
fn rotated_to(a: &Agent, ca: &str, ca_fp: &str) -> bool {
    let creds = credentials(a);
    let ledger_done = a.ledger().read().is_ok_and(|d| {
        d.ledger.ca.rotation.is_none()
            && d.ledger
                .cluster
                .as_ref()
                .is_some_and(|c| c.ca_cert_pem == ca)
    });
    ledger_done && trusted(a) == vec![ca_fp.to_string()] && issued_by(&creds.cert_pem, ca)
}

/// A client endpoint presenting `creds`.
fn endpoint(creds: &NodeCredentials) -> RpcEndpoint {
    RpcEndpoint::serve(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        creds,
        Arc::new(Silent),
    )
    .expect("endpoint")
}

async fn status_via(client: &RpcEndpoint, to: SocketAddr) -> Result<Response, String> {
    let reply = client
        .call(
            to,
            &proto::encode(&Request::Query(proto::Query::Status)),
            Duration::from_secs(5),
        )
        .await
        .map_err(|e| e.to_string())?;
    proto::decode(&reply).map_err(|e| e.to_string())
}

/// The job's epoch and its ranks' (node, pid), once every rank runs.
fn gang(c: &LocalCluster, job: u64) -> Option<(u64, Vec<(NodeId, u32)>)> {
    let d = c.agents[0].ledger();
    let d = d.read().ok()?;
    let j = d.ledger.workload.jobs.get(&job)?;
    let alloc = j.alloc.as_ref().filter(|_| j.state == JobState::Running)?;
    let mut ranks = Vec::new();
    for (rank, (node, _)) in alloc.nodes.iter().enumerate() {
        let agent = c.agent(*node)?;
        let log = std::fs::read_to_string(shoal_node::executor::log_path(
            &agent.node().config().jobs_dir(),
            job,
            rank as u32,
        ))
        .unwrap_or_default();
        let pid = log.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["start", epoch, _, pid] if epoch.parse() == Ok(alloc.epoch) => pid.parse().ok(),
                _ => None,
            }
        })?;
        ranks.push((*node, pid));
    }
    Some((alloc.epoch, ranks))
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X" | "x"))
    })
}

/// The certificate of the CA with fingerprint `fp`, once `a`'s ledger
/// trusts it (it may lag behind the leader that started the rotation).
async fn new_ca_of(a: &Agent, fp: &str) -> String {
    common::wait_for("the new CA in the node's ledger", TIMEOUT, || {
        let pem = a.ledger().read().ok().and_then(|d| {
            d.ledger
                .trusted_ca_pems()
                .into_iter()
                .find(|p| fingerprint_pem(p).as_deref() == Some(fp))
        });
        async move { pem }
    })
    .await
}

fn events_of(a: &Agent, kind: &str) -> usize {
    a.ledger().read().map_or(0, |d| {
        d.ledger
            .events
            .after(0)
            .filter(|e| e.spec.kind == kind)
            .count()
    })
}

/// Writes an attribute through each node in turn until stopped; counts
/// what committed and what failed (with the last error).
struct Writer {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Writer {
    fn start(clients: Vec<Client>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let (s, o) = (stop.clone(), ok.clone());
        let task = tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                let client = &clients[n as usize % clients.len()];
                match client.put_attr(&format!("rotation/{n}"), "v").await {
                    Ok(_) => {
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.push(format!("write {n} via {}: {e}", client.base_url())),
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            failures
        });
        Writer { stop, ok, task }
    }

    fn committed(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.task.await.expect("writer");
        (self.ok.load(Ordering::Relaxed), failures)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_reissues_every_certificate_and_retires_the_old_ca_without_downtime() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(3, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let old_ca = cluster_ca(&c);
    let old_fp = old_ca.fingerprint().expect("fp");
    let admin = c.client(0);
    let before = admin.status().await.expect("status");
    assert_eq!(before.ca_fingerprint, old_fp, "shoal status shows the CA");

    // A gang of two ranks, running.
    let job = admin
        .submit_job(&common::sh_job(
            2,
            1,
            r#"echo "start $SHOAL_EPOCH $RANK $$"; exec sleep 3600"#,
        ))
        .await
        .expect("submit")
        .id;
    let (epoch, ranks) = common::wait_for("the gang running", TIMEOUT, || {
        let g = gang(&c, job).filter(|(_, r)| r.len() == 2 && r.iter().all(|(_, p)| running(*p)));
        async move { g }
    })
    .await;

    // Only an admin rotates the CA.
    admin
        .create_tenant(&TenantRequest {
            name: "lab".into(),
            ..TenantRequest::default()
        })
        .await
        .expect("tenant");
    let lab_token = admin
        .create_api_token(&ApiTokenCreateRequest {
            name: Some("lab-token".into()),
            tenant: Some("lab".into()),
            ..ApiTokenCreateRequest::default()
        })
        .await
        .expect("token")
        .token;
    let as_lab = Client::new(c.agents[1].api_url(), Some(lab_token));
    let refused = as_lab.rotate_ca().await;
    assert!(
        matches!(&refused, Err(ClientError::Api { status: 403, .. })),
        "a tenant token rotated the CA: {refused:?}"
    );

    let writer = Writer::start((0..3).map(|i| c.client(i)).collect());
    let started = Instant::now();
    let rotated = c.client(1).rotate_ca().await.expect("rotate");
    assert_eq!(rotated.old_fingerprint, old_fp);
    assert_ne!(rotated.new_fingerprint, old_fp);
    let new_fp = rotated.new_fingerprint.clone();
    // A second rotation while this one runs is refused, clearly.
    let again = c.client(2).rotate_ca().await;
    assert!(
        matches!(&again, Err(ClientError::Api { status: 409, message, .. }) if message.contains("already in progress")),
        "{again:?}"
    );

    // Every node ends up with a certificate of the new CA and trusts it alone.
    let new_ca_pem = new_ca_of(&c.agents[0], &new_fp).await;
    let took = c
        .wait_until("every node rotated to the new CA", TIMEOUT, |c| {
            let ok = c.agents.iter().all(|a| rotated_to(a, &new_ca_pem, &new_fp));
            async move { ok }
        })
        .await
        .expect("rotated");
    println!("rotation done in {took:.2?}");
    // Writes kept committing through the rotation, and after it.
    let during = writer.committed();
    c.wait_until("writes after the rotation", TIMEOUT, |_| {
        let ok = writer.committed() >= during + 3;
        async move { ok }
    })
    .await
    .expect("writes after");
    let (committed, failures) = writer.finish().await;
    assert!(
        failures.is_empty(),
        "writes failed during the rotation: {failures:?}"
    );
    assert!(
        committed as f64 >= started.elapsed().as_secs_f64() * 3.0,
        "only {committed} writes in {:.1?}",
        started.elapsed()
    );

    // The gang never noticed: same epoch, same processes.
    let (epoch_now, ranks_now) = gang(&c, job).expect("the job still runs");
    assert_eq!(epoch_now, epoch, "the job was restarted");
    assert_eq!(ranks_now, ranks);
    assert!(ranks.iter().all(|(_, pid)| running(*pid)));

    // The voters hold the new key and no longer the old one; every phase
    // is in the event log; status and `ca status` show the new CA.
    c.wait_until("voters hold the new key only", TIMEOUT, |c| {
        let voters = c.agents[0].voters();
        let ok = voters.len() == 3
            && c.agents
                .iter()
                .filter(|a| voters.contains(&a.id()))
                .all(|a| {
                    shoal_node::trust::ca_key::key_for(a.data_dir(), &new_ca_pem).is_some()
                        && shoal_node::trust::ca_key::key_for(a.data_dir(), &old_ca.cert_pem)
                            .is_none()
                });
        async move { ok }
    })
    .await
    .expect("custody");
    for kind in [
        shoal_consensus::ca::EVENT_TRUSTING,
        shoal_consensus::ca::EVENT_REISSUING,
        shoal_consensus::ca::EVENT_DONE,
    ] {
        assert_eq!(events_of(&c.agents[0], kind), 1, "{kind}");
    }
    let status = admin.status().await.expect("status");
    assert_eq!(status.ca_fingerprint, new_fp);
    assert_eq!(status.ca_rotation, None);
    let ca = admin.ca_status().await.expect("ca status");
    assert_eq!(ca.phase, "stable");
    assert_eq!(ca.trusted, vec![new_fp.clone()]);
    assert!(ca
        .members
        .iter()
        .all(|m| m.cert_ca.as_deref() == Some(new_fp.as_str())));

    // A peer with a certificate of the old CA is refused by every node; the
    // same request with a certificate of the new CA is served.
    let new_ca = CaBundle {
        cert_pem: new_ca_pem.clone(),
        key_pem: shoal_node::trust::ca_key::key_for(c.agents[0].data_dir(), &new_ca_pem)
            .or_else(|| {
                c.agents
                    .iter()
                    .find_map(|a| shoal_node::trust::ca_key::key_for(a.data_dir(), &new_ca_pem))
            })
            .expect("a voter holds the new key"),
    };
    let stale = endpoint(&NodeCredentials {
        ca_pem: new_ca_pem.clone(),
        ..old_ca
            .issue(c.agents[1].name(), c.agents[1].id())
            .expect("issue")
    });
    let fresh = endpoint(
        &new_ca
            .issue(c.agents[1].name(), c.agents[1].id())
            .expect("issue"),
    );
    for a in &c.agents {
        let answer = status_via(&stale, a.rpc_addr()).await;
        assert!(
            answer.is_err(),
            "node {} accepted a certificate of the retired CA: {answer:?}",
            a.id()
        );
        // Served (a follower answers that it does not lead: served all the same).
        let answer = status_via(&fresh, a.rpc_addr()).await;
        assert!(
            matches!(answer, Ok(Response::Status(_) | Response::Error(_))),
            "node {} refused a certificate of the new CA: {answer:?}",
            a.id()
        );
    }

    // A join token made before the rotation pins the retired CA: refused.
    // One made now admits a node, whose certificate is the new CA's.
    let refused_join = Agent::start(
        node_config(c.root(), 4),
        StartMode::Join {
            addr: c.agents[0].rpc_addr(),
            token: c.join_token.clone(),
        },
    )
    .await;
    assert!(
        matches!(&refused_join, Err(e) if e.to_string().contains("pin")),
        "a token pinning the retired CA: {:?}",
        refused_join.as_ref().err()
    );
    let token = admin
        .create_join_token(&shoal_sdk::TokenCreateRequest {
            ttl_s: Some(600),
            uses: Some(1),
            voter: true,
        })
        .await
        .expect("join token")
        .token;
    let joined = Agent::start(
        node_config(c.root(), 3),
        StartMode::Join {
            addr: c.agents[2].rpc_addr(),
            token,
        },
    )
    .await
    .expect("a node joins after the rotation");
    let joined_id = joined.id();
    c.wait_until("the new node alive and trusting the new CA", TIMEOUT, |c| {
        let alive = c.agents[0].ledger().read().is_ok_and(|d| {
            d.ledger
                .members
                .get(&joined_id)
                .is_some_and(|m| m.state == shoal_sdk::MemberState::Alive)
        });
        let ok = alive && rotated_to(&joined, &new_ca_pem, &new_fp);
        async move { ok }
    })
    .await
    .expect("joined");
    stale.shutdown().await;
    fresh.shutdown().await;
    joined.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_survives_the_loss_of_its_leader_and_waits_for_members_that_are_down() {
    let _serial = common::one_at_a_time();
    // Three voters and a learner.
    let c = LocalCluster::start(4, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");
    let leader_id = c
        .wait_until("three voters", TIMEOUT, |c| {
            let ok = c.agreed_leader().is_some_and(|l| l.voters().len() == 3);
            async move { ok }
        })
        .await
        .map(|_| c.agreed_leader().expect("leader").id())
        .expect("voters");
    let voters = c.agent(leader_id).expect("leader").voters();
    let learner = c
        .agents
        .iter()
        .find(|a| !voters.contains(&a.id()))
        .expect("a learner");
    let learner_id = learner.id();
    let survivors: Vec<&Agent> = c
        .agents
        .iter()
        .filter(|a| a.id() != leader_id && a.id() != learner_id)
        .collect();
    let admin = Client::new(survivors[0].api_url(), Some(c.admin_token.clone()));

    // The learner goes down, then the rotation starts: it cannot trust the
    // new CA, so the rotation waits in its first phase.
    learner.shutdown().await;
    let rotated = admin.rotate_ca().await.expect("rotate");
    let new_fp = rotated.new_fingerprint.clone();
    let new_ca_pem = new_ca_of(survivors[0], &new_fp).await;
    c.wait_until(
        "every running voter holding the new key and trusting both CAs",
        TIMEOUT,
        |c| {
            let ok = c.agents.iter().filter(|a| a.id() != learner_id).all(|a| {
                shoal_node::trust::ca_key::key_for(a.data_dir(), &new_ca_pem).is_some()
                    && trusted(a).len() == 3
            }) && c.agent(leader_id).is_some_and(|l| {
                l.ledger().read().is_ok_and(|d| {
                    c.agents.iter().filter(|a| a.id() != learner_id).all(|a| {
                        d.ledger
                            .ca
                            .reports
                            .get(&a.id())
                            .is_some_and(|r| r.trusted.contains(&new_fp))
                    })
                })
            });
            async move { ok }
        },
    )
    .await
    .expect("custody and trust");
    c.wait_until(
        "the rotation waiting for the learner alone",
        TIMEOUT,
        |_| {
            let admin = admin.clone();
            async move {
                admin.ca_status().await.is_ok_and(|s| {
                    s.waiting_for.len() == 1
                        && s.waiting_for[0].contains(&format!("node {learner_id} "))
                })
            }
        },
    )
    .await
    .expect("waiting for the learner");
    let ca = admin.ca_status().await.expect("ca status");
    assert_eq!(
        ca.phase, "trusting",
        "the new CA signs before every member trusts it"
    );

    // The leader is lost; another voter leads and carries the rotation on
    // once the learner is removed: it signs with the new CA, and every
    // running node renews.
    let leader = c.agent(leader_id).expect("leader");
    let old_leader_cert = credentials(leader).cert_pem;
    leader.shutdown().await;
    let new_leader = c
        .wait_until("a new leader", TIMEOUT, |_| {
            let ok = survivors.iter().all(|a| {
                a.current_leader()
                    .is_some_and(|l| l != leader_id && survivors.iter().any(|s| s.id() == l))
            });
            async move { ok }
        })
        .await
        .map(|_| survivors[0].current_leader().expect("leader"))
        .expect("new leader");
    println!("node {new_leader} took over from node {leader_id}");
    admin
        .remove_node(&learner_id.to_string())
        .await
        .expect("remove the learner");
    c.wait_until("the survivors renewed by the new CA", TIMEOUT, |_| {
        let ok = survivors
            .iter()
            .all(|a| issued_by(&credentials(a).cert_pem, &new_ca_pem));
        async move { ok }
    })
    .await
    .expect("renewed");
    // The lost leader still has a certificate of the old CA: the old CA
    // stays trusted, whatever time passes, until it is removed.
    c.wait_until(
        "the rotation waiting for the lost leader alone",
        TIMEOUT,
        |_| {
            let admin = admin.clone();
            async move {
                admin.ca_status().await.is_ok_and(|s| {
                    s.waiting_for.len() == 1
                        && s.waiting_for[0].contains(&format!("node {leader_id} "))
                        && s.waiting_for[0].contains("no certificate from the new CA")
                })
            }
        },
    )
    .await
    .expect("waiting for the lost leader");
    assert!(!issued_by(&old_leader_cert, &new_ca_pem));
    let s = admin.ca_status().await.expect("ca status");
    assert_eq!(s.phase, "reissuing", "the old CA was retired too early");
    assert_eq!(s.trusted.len(), 2);
    assert_eq!(s.signing_fingerprint, new_fp);

    admin
        .remove_node(&leader_id.to_string())
        .await
        .expect("remove the lost leader");
    c.wait_until("the rotation done on the survivors", TIMEOUT, |_| {
        let ok = survivors
            .iter()
            .all(|a| rotated_to(a, &new_ca_pem, &new_fp));
        async move { ok }
    })
    .await
    .expect("done");
    let written = admin
        .put_attr("after/rotation", "1")
        .await
        .expect("a write");
    assert!(written.index > 0);
    c.shutdown().await;
}
