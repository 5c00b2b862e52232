//! The QUIC transport settings of the RPC endpoint ([`crate::rpc`]):
//! what a connection may carry before and after its peer proves it is a
//! member, how long a quiet one stays open, and the largest packet.

use crate::rpc::MAX_FRAME;
use quinn::TransportConfig;
use std::sync::Arc;
use std::time::Duration;

/// What a client that has not shown a certificate may open at first: a few
/// streams and a small window. `rpc::serve_connection` raises both for members.
pub(crate) const FIRST_STREAMS: u32 = 4;
pub(crate) const FIRST_WINDOW: u32 = 4 << 20;
/// A member's streams and window, once its certificate is checked.
pub(crate) const MEMBER_STREAMS: u32 = 256;
pub(crate) const MEMBER_WINDOW: u32 = 4 * MAX_FRAME as u32;

/// The transport of connections this endpoint accepts: small until the
/// peer has proved it is a member.
pub(crate) fn server_transport_config() -> Arc<TransportConfig> {
    let mut t = base_transport();
    t.max_concurrent_bidi_streams(FIRST_STREAMS.into());
    t.receive_window(FIRST_WINDOW.into());
    Arc::new(t)
}

pub(crate) fn transport_config() -> Arc<TransportConfig> {
    Arc::new(base_transport())
}

/// How long a connection with nothing to carry stays open.
const IDLE: Duration = Duration::from_secs(30);

fn base_transport() -> TransportConfig {
    let mut t = TransportConfig::default();
    // No keep-alives: a connection in use (Raft heartbeats, lease
    // renewals every 200 ms) never goes quiet, and one that does (a relayed
    // member's to the leader, used only when its relay fails) should cost
    // nothing: it closes after IDLE and the next call dials again. Every
    // call has a timeout of its own, so a dead peer costs a call its
    // timeout, after which the connection is dropped (`settle`); a peer
    // that restarted answers the old connection with a stateless reset.
    // IDLE is longer than any long poll (`Request::FollowLog`, 5 s).
    t.keep_alive_interval(None);
    if let Ok(idle) = IDLE.try_into() {
        t.max_idle_timeout(Some(idle));
    }
    t.max_concurrent_bidi_streams(MEMBER_STREAMS.into());
    // Bound what one connection can make this node buffer: a few frames in
    // flight, not every stream's window at once.
    t.receive_window(MEMBER_WINDOW.into());
    // Let MTU discovery climb past Ethernet's 1500 bytes where the path
    // allows it (loopback, jumbo-frame fabrics): bulk chunk transfers are
    // bound by packets per second, not bytes. Probes that get no answer
    // simply leave the MTU where it was, so this is safe on any network.
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    t
}

/// The largest UDP payload a member sends or accepts. MTU discovery only
/// climbs as high as both the path and the peer's advertised limit allow,
/// and quinn's default limit (1472) kept bulk transfers at Ethernet-sized
/// packets even on loopback and jumbo-frame fabrics, where per-packet costs
/// (kernel send and receive, packet protection set-up) are much of a
/// checkpoint replica's CPU. The bound is what ten segments of one GSO send
/// (quinn sends up to ten) can carry within a UDP datagram's 64 KiB: above
/// it those sends fail with EMSGSIZE, the losses look like a black hole and
/// the MTU falls back to 1200.
pub(crate) const MAX_UDP_PAYLOAD: u16 = 6_500;

/// The endpoint of a member whose secret key is `key_pem`.
///
/// Its stateless-reset key and the key that signs its connection ids are
/// derived from that secret, so both stay the same when the member restarts
/// on the same address. A peer still holding a connection to the member's
/// previous process then gets, for the first packet it sends, a reset it
/// can verify (the new process recognises the old connection ids as its
/// own, and answers them with the tokens the old one handed out), drops the
/// connection and dials again. With quinn's random keys the packet was
/// dropped unanswered, and every call on the dead connection waited for its
/// own timeout: a survivor that forwarded writes to a restarted leader was
/// refused writes for up to 21 s after the next failover
/// (docs/BENCHMARKS.md, "Leader failure").
pub(crate) fn endpoint_config(key_pem: &str) -> quinn::EndpointConfig {
    let reset_secret = blake3::derive_key("shoal rpc stateless reset key v1", key_pem.as_bytes());
    let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &reset_secret);
    let cid_secret = blake3::derive_key("shoal rpc connection id key v1", key_pem.as_bytes());
    let mut cid_key = [0u8; 8];
    cid_key.copy_from_slice(&cid_secret[..8]);
    let cid_key = u64::from_le_bytes(cid_key);
    let mut config = quinn::EndpointConfig::new(Arc::new(reset_key));
    config.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    // Within quinn's accepted range (1200..=65527), so this cannot fail.
    let _ = config.max_udp_payload_size(MAX_UDP_PAYLOAD);
    config
}

#[cfg(test)]
mod tests {
    use crate::rpc::{PeerInfo, RpcEndpoint, RpcFuture, RpcHandler};
    use crate::tls::CaBundle;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;

    /// Answers every call with its body.
    struct Answer;
    impl RpcHandler for Answer {
        fn handle(&self, _peer: PeerInfo, body: Vec<u8>) -> RpcFuture {
            Box::pin(async move { body })
        }
    }

    fn localhost() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    /// A member killed without a word (no CONNECTION_CLOSE) and started
    /// again on its address answers its peers' old connections with a
    /// stateless reset they can verify, so a peer's next calls reach the new
    /// process at once instead of waiting out their timeouts on the dead
    /// connection (before, every call on it waited its full timeout).
    #[test]
    fn a_member_restarted_on_its_address_resets_the_connections_of_its_past() {
        let runtime = |what: &str| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("{what}'s runtime: {e}"))
        };
        let (rt, a_rt) = (runtime("b"), runtime("a"));
        let ca = CaBundle::generate("c").expect("ca");
        let a_creds = ca.issue("a", 1).expect("a");
        let b_creds = ca.issue("b", 2).expect("b");
        let b = rt
            .block_on(async { RpcEndpoint::serve(localhost(), &b_creds, Arc::new(Answer)) })
            .expect("b");
        let a = a_rt
            .block_on(async { RpcEndpoint::serve(localhost(), &a_creds, Arc::new(Answer)) })
            .expect("a");
        let addr = a.local_addr().expect("addr");
        rt.block_on(b.call(addr, b"1", Duration::from_secs(5)))
            .expect("a call before the crash");

        // Like kill -9: a's tasks stop without sending anything more.
        a_rt.shutdown_background();
        drop(a);
        // Its socket closes once its runtime's threads have dropped it.
        let bind_by = std::time::Instant::now() + Duration::from_secs(10);
        let _a_again = loop {
            match rt.block_on(async { RpcEndpoint::serve(addr, &a_creds, Arc::new(Answer)) }) {
                Ok(a) => break a,
                Err(e) if std::time::Instant::now() < bind_by => {
                    tracing::debug!(error = %e, "a's old socket is still open");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("a again, on its address: {e}"),
            }
        };

        let call_timeout = Duration::from_secs(10);
        let started = std::time::Instant::now();
        let answer = rt.block_on(async {
            for _ in 0..3 {
                if let Ok(answer) = b.call(addr, b"2", call_timeout).await {
                    return Some(answer);
                }
            }
            None
        });
        let took = started.elapsed();
        assert_eq!(answer.as_deref(), Some(&b"2"[..]), "after {took:?}");
        assert!(
            took < Duration::from_secs(3),
            "the restarted member was reached {took:?} after its restart (calls time out after {call_timeout:?})"
        );
    }
}
