//! Garbage on every listening port while the cluster works: random UDP
//! datagrams at the RPC (QUIC) and gossip ports, random bytes and silent
//! sockets at the HTTP API, random request bodies at the RPC port from a
//! client without a certificate and from one with a member's certificate,
//! hostile JSON at every write route of the API.
//! No acknowledged write may be lost and no node may be declared down.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use shoal_consensus::{Command, LedgerResponse};
use shoal_mesh::RpcEndpoint;
use shoal_node::agent::testkit::LocalCluster;
use shoal_node::cli::bench::data::Xorshift;
use shoal_sdk::MemberState;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TIMEOUT: Duration = Duration::from_secs(60);
const GARBAGE_FOR: Duration = Duration::from_secs(10);

fn bytes(rng: &mut Xorshift, max: usize) -> Vec<u8> {
    let len = 1 + (rng.next_u64() as usize % max);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// The UDP port of a gossip multiaddr such as `/ip4/127.0.0.1/udp/4001/quic-v1`.
fn gossip_port(multiaddr: &str) -> Option<u16> {
    let mut parts = multiaddr.split('/');
    parts.find(|p| *p == "udp")?;
    parts.next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_every_port_loses_no_write_and_downs_no_node() {
    let _serial = common::one_at_a_time();
    let c = LocalCluster::start(3, |_, _| {}).await.expect("cluster");
    c.wait_all_alive(TIMEOUT).await.expect("alive");

    let members = c.agents[0]
        .ledger()
        .read()
        .expect("ledger")
        .ledger
        .members
        .clone();
    let mut udp_targets: Vec<SocketAddr> = c.agents.iter().map(|a| a.rpc_addr()).collect();
    udp_targets.extend(
        members
            .values()
            .filter_map(|m| gossip_port(&m.spec.gossip_addr))
            .map(|port| SocketAddr::from(([127, 0, 0, 1], port))),
    );
    assert_eq!(udp_targets.len(), 6, "RPC and gossip ports of 3 nodes");
    let api_targets: Vec<SocketAddr> = members
        .values()
        .map(|m| m.spec.api_addr.parse().expect("api addr"))
        .collect();
    let rpc_targets: Vec<SocketAddr> = c.agents.iter().map(|a| a.rpc_addr()).collect();
    let ca = crate::node_trust::cluster_ca(&c);
    let pin = ca.fingerprint().expect("pin");
    let member = RpcEndpoint::serve(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        &ca.issue(c.agents[1].name(), c.agents[1].id())
            .expect("creds"),
        Arc::new(Silent),
    )
    .expect("endpoint");

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut noise = Vec::new();
    // UDP: datagrams of every size at QUIC and gossip.
    noise.push(tokio::spawn({
        let (stop, sent) = (stop.clone(), sent.clone());
        async move {
            let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
                .await
                .expect("udp");
            let mut rng = Xorshift::new(1);
            while !stop.load(Ordering::Relaxed) {
                for target in &udp_targets {
                    let _ = socket.send_to(&bytes(&mut rng, 1400), target).await;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }));
    // TCP: random bytes at the API, and sockets that never speak.
    noise.push(tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut rng = Xorshift::new(2);
            let mut silent = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for target in &api_targets {
                    if let Ok(mut s) = tokio::net::TcpStream::connect(target).await {
                        let _ = s.write_all(&bytes(&mut rng, 8192)).await;
                        let mut sink = [0u8; 1024];
                        let _ = tokio::time::timeout(Duration::from_millis(50), s.read(&mut sink))
                            .await;
                    }
                    if silent.len() < 60 {
                        if let Ok(s) = tokio::net::TcpStream::connect(target).await {
                            silent.push(s);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }));
    // RPC: random bodies, anonymous and with a member's certificate.
    noise.push(tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut rng = Xorshift::new(3);
            while !stop.load(Ordering::Relaxed) {
                for target in &rpc_targets {
                    let body = bytes(&mut rng, 16 * 1024);
                    let _ = shoal_mesh::rpc::call_as_joiner(
                        *target,
                        &pin,
                        &body,
                        Duration::from_millis(500),
                    )
                    .await;
                    let body = bytes(&mut rng, 64 * 1024);
                    let _ = member
                        .call(*target, &body, Duration::from_millis(500))
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }));

    // API: hostile JSON bodies (random bytes, wrong types, huge numbers,
    // deep nesting) at every write route, with an admin token.
    noise.push(tokio::spawn({
        let stop = stop.clone();
        let base = c.agents[2].api_url();
        let token = c.admin_token.clone();
        async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("http");
            let routes = [
                "/v1/jobs",
                "/v1/jobs/1/cancel",
                "/v1/tenants",
                "/v1/tenants/x",
                "/v1/objects",
                "/v1/objects/rm",
                "/v1/objects/import",
                "/v1/chunks/has",
                "/v1/tokens",
                "/v1/api-tokens",
                "/v1/attrs",
                "/v1/nodes/n9/drain",
            ];
            let mut rng = Xorshift::new(4);
            while !stop.load(Ordering::Relaxed) {
                for route in routes {
                    let body = hostile_json(&mut rng);
                    let _ = http
                        .post(format!("{base}{route}"))
                        .bearer_auth(&token)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }));

    // Meanwhile, writes through every node.
    let started = Instant::now();
    let mut acked = Vec::new();
    let mut i = 0u64;
    while started.elapsed() < GARBAGE_FOR {
        let agent = &c.agents[i as usize % c.agents.len()];
        let key = format!("under-fire/{i}");
        let cmd = Command::PutAttr {
            key: key.clone(),
            value: i.to_string(),
        };
        let write =
            tokio::time::timeout(Duration::from_secs(10), agent.write_as(&c.admin_token, cmd))
                .await;
        if let Ok(Ok((LedgerResponse::Ok, _))) = write {
            acked.push(key);
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in noise {
        let _ = task.await;
    }
    assert!(
        sent.load(Ordering::Relaxed) > 1000,
        "the garbage generator barely ran"
    );
    // Most writes go through under fire; a few may time out, none acked is lost.
    assert!(
        acked.len() as u64 * 10 >= i * 9,
        "only {} of {i} writes were acknowledged under garbage",
        acked.len()
    );
    c.wait_until("every acknowledged write on every node", TIMEOUT, |c| {
        let ok = c.agents.iter().all(|a| {
            let d = a.ledger();
            let d = d.read().expect("ledger");
            acked.iter().all(|k| d.ledger.attrs.contains_key(k))
        });
        async move { ok }
    })
    .await
    .expect("no acknowledged write lost");
    for a in &c.agents {
        let d = a.ledger();
        let d = d.read().expect("ledger");
        assert!(
            d.ledger
                .members
                .values()
                .all(|m| m.state == MemberState::Alive),
            "a node was declared down under garbage: {:?}",
            d.ledger
                .members
                .values()
                .map(|m| (m.id, m.state))
                .collect::<Vec<_>>()
        );
        assert!(
            d.ledger.events.after(0).all(|e| e.spec.kind != "node_down"),
            "a node_down event was recorded"
        );
    }
    c.shutdown().await;
}

/// A JSON-ish body: valid documents with hostile values, or broken ones.
fn hostile_json(rng: &mut Xorshift) -> Vec<u8> {
    let field = [
        "name",
        "tenant",
        "nodes",
        "gpus_per_node",
        "command",
        "path",
        "ids",
        "ttl_s",
        "key",
        "value",
        "weight",
        "max_gpus",
    ];
    let value = |rng: &mut Xorshift| -> String {
        match rng.next_u64() % 8 {
            0 => "-1".into(),
            1 => "18446744073709551616".into(),
            2 => "null".into(),
            3 => format!("\"{}\"", "x".repeat(rng.next_u64() as usize % 70_000)),
            4 => "[".repeat(200) + &"]".repeat(200),
            5 => "{\"a\":{\"b\":{}}}".into(),
            6 => "1e400".into(),
            _ => "\"../../etc/passwd\"".into(),
        }
    };
    match rng.next_u64() % 3 {
        0 => bytes(rng, 4096),
        _ => {
            let n = 1 + rng.next_u64() as usize % 6;
            let parts: Vec<String> = (0..n)
                .map(|_| {
                    let f = field[rng.next_u64() as usize % field.len()];
                    format!("\"{f}\":{}", value(rng))
                })
                .collect();
            format!("{{{}}}", parts.join(",")).into_bytes()
        }
    }
}

struct Silent;
impl shoal_mesh::RpcHandler for Silent {
    fn handle(&self, _: shoal_mesh::PeerInfo, _: Vec<u8>) -> shoal_mesh::rpc::RpcFuture {
        Box::pin(async { Vec::new() })
    }
}
