//! Request/response RPC over quinn. One bidirectional stream per request:
//! the request is `[version byte][body]`, the response likewise, each side
//! finishing its send half. Bodies are opaque here: the node crate decides
//! what they mean (bincode-encoded messages), which keeps the transport
//! reusable and the protocol in one place.
//!
//! Each connection negotiates the protocol version with TLS ALPN
//! ([`crate::protocol`]): peers without a common version do not exchange a
//! single request, and the caller gets [`RpcError::Protocol`] naming both
//! ranges. The version a connection settled on is in [`PeerInfo::protocol`]
//! on the serving side and [`RpcEndpoint::negotiated`] on the calling side,
//! for message formats that differ between versions.

use crate::admission::{Admission, Holder, Limits};
use crate::protocol::{self, Mismatch, Negotiated, Range};
pub use crate::rpc_traffic::RpcTraffic;
use crate::rpc_traffic::{Counters, CountingSocket};
use crate::rpc_transport::{
    endpoint_config, server_transport_config, transport_config, MEMBER_STREAMS, MEMBER_WINDOW,
};
use crate::tls::{joiner_client_config_for, NodeCredentials, TlsError, CLUSTER_SERVER_NAME};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{ClientConfig, Connection, Endpoint, ServerConfig};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Version of the frame layout and of the message encoding inside it.
pub const WIRE_VERSION: u8 = 1;
/// Upper bound of any request or response; larger bodies travel in chunks.
pub const MAX_FRAME: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("cannot reach {addr}: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("request to {addr} failed: {reason}")]
    Io { addr: SocketAddr, reason: String },
    #[error("request to {addr} timed out after {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    #[error("{addr} speaks wire version {got}, this node speaks {WIRE_VERSION}")]
    Version { addr: SocketAddr, got: u8 },
    #[error("peer at {addr} {mismatch}")]
    Protocol {
        addr: SocketAddr,
        mismatch: Mismatch,
    },
    #[error(
        "{addr} is node {found:?}'s, not node {expected}'s: its certificate names another member"
    )]
    WrongPeer {
        addr: SocketAddr,
        expected: u64,
        found: Option<u64>,
    },
    #[error("TLS setup: {0}")]
    Tls(#[from] TlsError),
    #[error("cannot bind {addr}: {reason}")]
    Bind { addr: SocketAddr, reason: String },
}

/// Who sent a request. `authenticated` is true only when the peer presented a
/// certificate signed by the cluster CA; `member` is the member id that
/// certificate names (what the peer may do is the receiver's decision).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    pub remote: SocketAddr,
    pub authenticated: bool,
    pub member: Option<u64>,
    /// The protocol version the connection negotiated.
    pub protocol: u16,
}

pub type RpcFuture = Pin<Box<dyn Future<Output = Vec<u8>> + Send>>;

/// Serves requests. The answer is opaque bytes; errors are part of the
/// caller's message type.
pub trait RpcHandler: Send + Sync + 'static {
    fn handle(&self, peer: PeerInfo, body: Vec<u8>) -> RpcFuture;
}

/// A node's RPC endpoint: serves peers and calls them, reusing one connection
/// per peer address.
#[derive(Clone)]
pub struct RpcEndpoint {
    endpoint: Endpoint,
    /// Replaced when the node's certificate is renewed.
    client: Arc<std::sync::RwLock<ClientConfig>>,
    connections: Arc<Mutex<HashMap<SocketAddr, Connection>>>,
    /// The protocol versions this endpoint offers and accepts.
    speaks: Range,
    traffic: Arc<Counters>,
}

impl RpcEndpoint {
    /// Binds `addr` with the node's credentials and starts serving `handler`.
    pub fn serve(
        addr: SocketAddr,
        creds: &NodeCredentials,
        handler: Arc<dyn RpcHandler>,
    ) -> Result<Self, RpcError> {
        let socket = std::net::UdpSocket::bind(addr).map_err(|e| RpcError::Bind {
            addr,
            reason: e.to_string(),
        })?;
        Self::serve_socket(socket, creds, handler)
    }

    /// Like [`RpcEndpoint::serve`] on a socket bound earlier, so a node can
    /// learn its port before it has credentials (a joiner binds, joins, then
    /// serves).
    pub fn serve_socket(
        socket: std::net::UdpSocket,
        creds: &NodeCredentials,
        handler: Arc<dyn RpcHandler>,
    ) -> Result<Self, RpcError> {
        Self::serve_socket_speaking(socket, creds, handler, protocol::local())
    }

    /// Like [`RpcEndpoint::serve_socket`], speaking the protocol versions of
    /// `speaks` rather than this process's.
    pub fn serve_socket_speaking(
        socket: std::net::UdpSocket,
        creds: &NodeCredentials,
        handler: Arc<dyn RpcHandler>,
        speaks: Range,
    ) -> Result<Self, RpcError> {
        let addr = socket
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let server = member_server_config(creds, speaks)?;
        let runtime = quinn::default_runtime().ok_or_else(|| RpcError::Bind {
            addr,
            reason: "no async runtime".into(),
        })?;
        let bind_error = |e: std::io::Error| RpcError::Bind {
            addr,
            reason: e.to_string(),
        };
        let traffic = Arc::new(Counters::default());
        let socket = CountingSocket::wrap(
            runtime.wrap_udp_socket(socket).map_err(bind_error)?,
            traffic.clone(),
        );
        let endpoint = Endpoint::new_with_abstract_socket(
            endpoint_config(&creds.key_pem),
            Some(server),
            socket,
            runtime,
        )
        .map_err(bind_error)?;
        let client = member_client_config(creds, speaks)?;
        let this = RpcEndpoint {
            endpoint: endpoint.clone(),
            client: Arc::new(std::sync::RwLock::new(client)),
            connections: Arc::new(Mutex::new(HashMap::new())),
            speaks,
            traffic,
        };
        let admission = Arc::new(std::sync::Mutex::new(Admission::new(Limits::default())));
        tokio::spawn(accept_loop(endpoint, handler, admission, speaks));
        Ok(this)
    }

    /// Serves and dials with `creds` from now on (a renewed certificate, a
    /// new set of trusted CAs). Connections this endpoint dialled are not
    /// reused: the next call dials again and presents the new certificate
    /// (calls in flight finish on the connection they started on, which
    /// closes when they are done). Connections peers dialled keep the
    /// certificates they were made with until those peers do the same.
    pub async fn set_credentials(&self, creds: &NodeCredentials) -> Result<(), RpcError> {
        let server = member_server_config(creds, self.speaks)?;
        let client = member_client_config(creds, self.speaks)?;
        self.endpoint.set_server_config(Some(server));
        if let Ok(mut c) = self.client.write() {
            *c = client;
        }
        self.connections.lock().await.clear();
        Ok(())
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.endpoint.local_addr().ok()
    }

    /// Bytes this endpoint's socket moved since it was bound (every
    /// connection, handshakes and retransmissions included).
    pub fn traffic(&self) -> RpcTraffic {
        self.traffic.snapshot()
    }

    /// The protocol versions this endpoint speaks.
    pub fn speaks(&self) -> Range {
        self.speaks
    }

    /// The protocol version this endpoint's connection to `addr` negotiated
    /// (dialling it if there is none yet).
    pub async fn negotiated(&self, addr: SocketAddr) -> Result<u16, RpcError> {
        let conn = self.connection(addr).await?;
        match protocol::negotiated(&conn) {
            Some(Negotiated::Version(v)) => Ok(v),
            _ => Err(RpcError::Io {
                addr,
                reason: "the connection negotiated no protocol version".into(),
            }),
        }
    }

    async fn connection(&self, addr: SocketAddr) -> Result<Connection, RpcError> {
        let mut conns = self.connections.lock().await;
        if let Some(c) = conns.get(&addr) {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
            conns.remove(&addr);
        }
        drop(conns);
        let client = self
            .client
            .read()
            .map(|c| c.clone())
            .map_err(|_| RpcError::Tls(TlsError::Invalid("client config poisoned".into())))?;
        let conn = connect(&self.endpoint, client, addr, self.speaks).await?;
        self.connections.lock().await.insert(addr, conn.clone());
        Ok(conn)
    }

    /// Sends one request and waits for its answer, at most `timeout`.
    pub async fn call(
        &self,
        addr: SocketAddr,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, RpcError> {
        let result = tokio::time::timeout(timeout, async {
            let conn = self.connection(addr).await?;
            exchange(&conn, addr, body).await
        })
        .await;
        self.settle(addr, timeout, result).await
    }

    /// A call's outcome; after a failure the cached connection is dropped
    /// so the next call dials afresh.
    async fn settle(
        &self,
        addr: SocketAddr,
        timeout: Duration,
        result: Result<Result<Vec<u8>, RpcError>, tokio::time::error::Elapsed>,
    ) -> Result<Vec<u8>, RpcError> {
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(_) => Err(RpcError::Timeout {
                addr,
                after: timeout,
            }),
        };
        if outcome.is_err() {
            self.connections.lock().await.remove(&addr);
        }
        outcome
    }

    /// [`RpcEndpoint::call`] to the member `expected`: answered only if the
    /// certificate at `addr` names that member. Every node certificate is
    /// valid for the same server name, so an address alone proves nothing:
    /// a stale or wrong address (another voter's, this node's own) must not
    /// let someone else answer for a voter, as Raft would count it twice.
    pub async fn call_member(
        &self,
        addr: SocketAddr,
        expected: u64,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, RpcError> {
        let checked = tokio::time::timeout(timeout, self.connection(addr)).await;
        let conn = match checked {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(RpcError::Timeout {
                    addr,
                    after: timeout,
                })
            }
        };
        let found = conn
            .peer_identity()
            .and_then(|id| {
                id.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                    .ok()
            })
            .and_then(|chain| {
                chain
                    .first()
                    .and_then(|leaf| crate::tls::member_id_of(leaf.as_ref()))
            });
        if found != Some(expected) {
            self.connections.lock().await.remove(&addr);
            return Err(RpcError::WrongPeer {
                addr,
                expected,
                found,
            });
        }
        // On the connection just checked, not a fresh dial.
        let result = tokio::time::timeout(timeout, exchange(&conn, addr, body)).await;
        self.settle(addr, timeout, result).await
    }

    /// Closes every connection and the endpoint.
    pub async fn shutdown(&self) {
        self.connections.lock().await.clear();
        self.endpoint.close(0u32.into(), b"shutdown");
    }
}

fn member_server_config(creds: &NodeCredentials, speaks: Range) -> Result<ServerConfig, RpcError> {
    let quic_server = QuicServerConfig::try_from(creds.server_config_for(speaks)?)
        .map_err(|e| TlsError::Invalid(e.to_string()))?;
    let mut server = ServerConfig::with_crypto(Arc::new(quic_server));
    server.transport_config(server_transport_config());
    Ok(server)
}

fn member_client_config(creds: &NodeCredentials, speaks: Range) -> Result<ClientConfig, RpcError> {
    let quic = QuicClientConfig::try_from(creds.client_config_for(speaks)?)
        .map_err(|e| TlsError::Invalid(e.to_string()))?;
    let mut c = ClientConfig::new(Arc::new(quic));
    c.transport_config(transport_config());
    Ok(c)
}

/// TLS alert `no_application_protocol` as a QUIC transport error code: what
/// a server that shares no ALPN id with us (a release without
/// [`protocol::PROBE_ALPN`]) closes the handshake with.
const NO_APPLICATION_PROTOCOL: u64 = 0x100 | 120;

/// Dials `addr`; a peer without a protocol version in common is an
/// [`RpcError::Protocol`] naming its range when it said which.
async fn connect(
    endpoint: &Endpoint,
    config: ClientConfig,
    addr: SocketAddr,
    speaks: Range,
) -> Result<Connection, RpcError> {
    let connecting = endpoint
        .connect_with(config, addr, CLUSTER_SERVER_NAME)
        .map_err(|e| RpcError::Unreachable {
            addr,
            reason: e.to_string(),
        })?;
    let conn = match connecting.await {
        Ok(c) => c,
        Err(e) => {
            let code = match &e {
                quinn::ConnectionError::ConnectionClosed(c) => Some(u64::from(c.error_code)),
                quinn::ConnectionError::TransportError(t) => Some(u64::from(t.code)),
                _ => None,
            };
            if code == Some(NO_APPLICATION_PROTOCOL) {
                return Err(RpcError::Protocol {
                    addr,
                    mismatch: Mismatch {
                        peer: None,
                        local: speaks,
                    },
                });
            }
            return Err(RpcError::Unreachable {
                addr,
                reason: e.to_string(),
            });
        }
    };
    match protocol::negotiated(&conn) {
        Some(Negotiated::Version(v)) if speaks.contains(v) => Ok(conn),
        Some(Negotiated::Probe) => {
            let peer = ask_range(&conn, speaks).await;
            conn.close(CLOSE_PROTOCOL.into(), b"no common protocol version");
            Err(RpcError::Protocol {
                addr,
                mismatch: Mismatch {
                    peer,
                    local: speaks,
                },
            })
        }
        _ => {
            conn.close(CLOSE_PROTOCOL.into(), b"no common protocol version");
            Err(RpcError::Protocol {
                addr,
                mismatch: Mismatch {
                    peer: None,
                    local: speaks,
                },
            })
        }
    }
}

/// The range exchange on a connection that negotiated the probe: our range
/// out, the peer's back; `None` when the peer does not answer sensibly.
async fn ask_range(conn: &Connection, speaks: Range) -> Option<Range> {
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await.ok()?;
        send.write_all(&protocol::encode_range(speaks)).await.ok()?;
        send.finish().ok()?;
        let answer = recv.read_to_end(16).await.ok()?;
        protocol::decode_range(&answer)
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

/// The server side of the range exchange: reads the client's range, answers
/// with ours, logs the refusal (once per peer address and range).
async fn answer_range(conn: &Connection, remote: SocketAddr, speaks: Range) {
    let exchange = async {
        let (mut send, mut recv) = conn.accept_bi().await.ok()?;
        let theirs = recv.read_to_end(16).await.ok();
        send.write_all(&protocol::encode_range(speaks)).await.ok()?;
        let _ = send.finish();
        let _ = send.stopped().await;
        theirs
    };
    let theirs = tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
        .and_then(|b| protocol::decode_range(&b));
    static LOGGED: std::sync::Mutex<Vec<(SocketAddr, Option<Range>)>> =
        std::sync::Mutex::new(Vec::new());
    let first = LOGGED
        .lock()
        .map(|mut seen| {
            if seen.contains(&(remote, theirs)) {
                false
            } else {
                if seen.len() >= 1024 {
                    seen.clear();
                }
                seen.push((remote, theirs));
                true
            }
        })
        .unwrap_or(false);
    let mismatch = Mismatch {
        peer: theirs,
        local: speaks,
    };
    if first {
        tracing::warn!(%remote, "refused an RPC connection: peer at {remote} {mismatch}");
    } else {
        tracing::debug!(%remote, "refused an RPC connection: peer at {remote} {mismatch}");
    }
    conn.close(CLOSE_PROTOCOL.into(), b"no common protocol version");
}

async fn exchange(conn: &Connection, addr: SocketAddr, body: &[u8]) -> Result<Vec<u8>, RpcError> {
    let io = |e: &dyn std::fmt::Display| RpcError::Io {
        addr,
        reason: e.to_string(),
    };
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| io(&e))?;
    // Two writes rather than one joined copy: a body may be a 4 MiB chunk.
    send.write_all(&[WIRE_VERSION]).await.map_err(|e| io(&e))?;
    send.write_all(body).await.map_err(|e| io(&e))?;
    send.finish().map_err(|e| io(&e))?;
    let resp = recv.read_to_end(MAX_FRAME).await.map_err(|e| io(&e))?;
    match resp.split_first() {
        Some((&WIRE_VERSION, rest)) => Ok(rest.to_vec()),
        Some((&v, _)) => Err(RpcError::Version { addr, got: v }),
        None => Err(RpcError::Io {
            addr,
            reason: "empty response (peer closed the stream)".into(),
        }),
    }
}

/// QUIC application close code for a connection refused by [`Admission`].
const CLOSE_LIMITED: u32 = 0x5348;
/// QUIC application close code for a connection without a common protocol
/// version.
const CLOSE_PROTOCOL: u32 = 0x5350;

type SharedAdmission = Arc<std::sync::Mutex<Admission>>;

/// A connection slot, given back when the connection's task ends.
struct Slot {
    admission: SharedAdmission,
    holder: Holder,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut a) = self.admission.lock() {
            a.close(self.holder);
        }
    }
}

async fn accept_loop(
    endpoint: Endpoint,
    handler: Arc<dyn RpcHandler>,
    admission: SharedAdmission,
    speaks: Range,
) {
    while let Some(incoming) = endpoint.accept().await {
        let handler = handler.clone();
        let admission = admission.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "refused an RPC connection");
                    return;
                }
            };
            let version = match protocol::negotiated(&conn) {
                Some(Negotiated::Version(v)) if speaks.contains(v) => v,
                _ => {
                    // The handshake settled on the probe (or on nothing we
                    // know): answer with our range, serve nothing else. It
                    // holds an admission slot like any other connection.
                    let holder = Holder::Anonymous(remote.ip());
                    let opened = match admission.lock() {
                        Ok(mut a) => a.open(holder).is_ok(),
                        Err(_) => false,
                    };
                    if opened {
                        let _slot = Slot {
                            admission: admission.clone(),
                            holder,
                        };
                        answer_range(&conn, remote, speaks).await;
                    } else {
                        conn.close(CLOSE_LIMITED.into(), b"too many connections");
                    }
                    return;
                }
            };
            serve_connection(conn, remote, version, handler, admission).await;
        });
    }
}

async fn serve_connection(
    conn: Connection,
    remote: SocketAddr,
    version: u16,
    handler: Arc<dyn RpcHandler>,
    admission: SharedAdmission,
) {
    let chain = conn.peer_identity().and_then(|id| {
        id.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()
    });
    let leaf = chain.as_ref().and_then(|c| c.first());
    let peer = PeerInfo {
        remote,
        authenticated: leaf.is_some(),
        member: leaf.and_then(|cert| crate::tls::member_id_of(cert.as_ref())),
        protocol: version,
    };
    let holder = match (peer.authenticated, peer.member) {
        (true, member) => Holder::Member(member.unwrap_or(0)),
        (false, _) => Holder::Anonymous(remote.ip()),
    };
    let (limits, opened) = match admission.lock() {
        Ok(mut a) => (a.limits().clone(), a.open(holder)),
        Err(_) => return,
    };
    if let Err(why) = opened {
        tracing::debug!(%remote, "{why}");
        conn.close(CLOSE_LIMITED.into(), why.as_bytes());
        return;
    }
    let _slot = Slot {
        admission: admission.clone(),
        holder,
    };
    if !peer.authenticated {
        // One door, and a narrow one: the handler answers only the join
        // RPC; requests are read one at a time, small and quickly, and the
        // whole connection has a deadline.
        conn.set_max_concurrent_bi_streams(limits.anonymous_streams.into());
        let lifetime = limits.anonymous_read_timeout * 6;
        let served = tokio::time::timeout(
            lifetime,
            serve_anonymous(&conn, &peer, &handler, &admission, &limits),
        )
        .await;
        if served.is_err() {
            conn.close(
                CLOSE_LIMITED.into(),
                b"connection without a certificate held too long",
            );
        }
        return;
    }
    conn.set_max_concurrent_bi_streams(MEMBER_STREAMS.into());
    conn.set_receive_window(MEMBER_WINDOW.into());
    let read = StreamLimits {
        frame: MAX_FRAME,
        timeout: limits.member_read_timeout,
    };
    while let Ok((send, recv)) = conn.accept_bi().await {
        tokio::spawn(serve_stream(
            handler.clone(),
            peer.clone(),
            send,
            recv,
            read.clone(),
        ));
    }
}

async fn serve_anonymous(
    conn: &Connection,
    peer: &PeerInfo,
    handler: &Arc<dyn RpcHandler>,
    admission: &SharedAdmission,
    limits: &Limits,
) {
    let read = StreamLimits {
        frame: limits.anonymous_frame,
        timeout: limits.anonymous_read_timeout,
    };
    while let Ok((send, recv)) = conn.accept_bi().await {
        let allowed = admission
            .lock()
            .map(|mut a| a.anonymous_request(peer.remote.ip(), Instant::now()))
            .unwrap_or(false);
        if !allowed {
            conn.close(
                CLOSE_LIMITED.into(),
                b"too many requests without a certificate; slow down",
            );
            return;
        }
        serve_stream(handler.clone(), peer.clone(), send, recv, read.clone()).await;
    }
}

/// How much of a request the endpoint reads, and for how long.
#[derive(Clone, Debug)]
struct StreamLimits {
    frame: usize,
    timeout: Duration,
}

async fn serve_stream(
    handler: Arc<dyn RpcHandler>,
    peer: PeerInfo,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    limits: StreamLimits,
) {
    // `read_to_end` stops at the limit: a larger request is never buffered.
    let req = match tokio::time::timeout(limits.timeout, recv.read_to_end(limits.frame)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::debug!(remote = %peer.remote, error = %e, "dropped an unreadable request");
            let _ = send.reset(2u32.into());
            return;
        }
        Err(_) => {
            tracing::debug!(remote = %peer.remote, after = ?limits.timeout, "dropped a request that took too long to arrive");
            let _ = recv.stop(3u32.into());
            let _ = send.reset(3u32.into());
            return;
        }
    };
    let Some((&version, body)) = req.split_first() else {
        return;
    };
    if version != WIRE_VERSION {
        tracing::warn!(remote = %peer.remote, version, "peer speaks an unknown wire version; closing its stream");
        let _ = send.reset(1u32.into());
        return;
    }
    let resp = handler.handle(peer, body.to_vec()).await;
    let mut frame = Vec::with_capacity(resp.len() + 1);
    frame.push(WIRE_VERSION);
    frame.extend_from_slice(&resp);
    if send.write_all(&frame).await.is_ok() {
        let _ = send.finish();
        // Wait until the peer has read everything before the stream is dropped.
        let _ = send.stopped().await;
    }
}

/// A one-shot call from a node that is not a member yet (it has no
/// certificate). The server must prove it holds a certificate from the CA the
/// token pins. Returns the answer and the CA certificate (DER) it matched.
pub async fn call_as_joiner(
    addr: SocketAddr,
    ca_pin: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(Vec<u8>, Vec<u8>), RpcError> {
    call_as_joiner_from(None, addr, ca_pin, body, timeout).await
}

/// [`call_as_joiner`] from the local address `from` where one is given
/// (the one the joining node will serve on), so that the member asked sees
/// the joiner's own address, not whichever the system would pick, and
/// counts what it allows per source against that node.
pub async fn call_as_joiner_from(
    from: Option<std::net::IpAddr>,
    addr: SocketAddr,
    ca_pin: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(Vec<u8>, Vec<u8>), RpcError> {
    let bind = joiner_bind(from, addr);
    joiner_call(bind, addr, ca_pin, body, timeout, protocol::local()).await
}

/// The local address a joiner's call to `to` goes from: `from`, else any
/// address of `to`'s family.
fn joiner_bind(from: Option<std::net::IpAddr>, to: SocketAddr) -> SocketAddr {
    match from {
        Some(ip) => SocketAddr::new(ip, 0),
        None if to.is_ipv4() => SocketAddr::from(([0, 0, 0, 0], 0)),
        None => SocketAddr::from(([0u16; 8], 0)),
    }
}

async fn joiner_call(
    bind: SocketAddr,
    addr: SocketAddr,
    ca_pin: &str,
    body: &[u8],
    timeout: Duration,
    speaks: Range,
) -> Result<(Vec<u8>, Vec<u8>), RpcError> {
    let (tls, verifier) = joiner_client_config_for(ca_pin, speaks)?;
    let quic = QuicClientConfig::try_from(tls).map_err(|e| TlsError::Invalid(e.to_string()))?;
    let mut config = ClientConfig::new(Arc::new(quic));
    config.transport_config(transport_config());
    let endpoint = Endpoint::client(bind).map_err(|e| RpcError::Bind {
        addr: bind,
        reason: e.to_string(),
    })?;
    let result = tokio::time::timeout(timeout, async {
        let conn = connect(&endpoint, config, addr, speaks).await?;
        let resp = exchange(&conn, addr, body).await?;
        conn.close(0u32.into(), b"done");
        Ok::<_, RpcError>(resp)
    })
    .await
    .map_err(|_| RpcError::Timeout {
        addr,
        after: timeout,
    })??;
    endpoint.close(0u32.into(), b"done");
    let ca = verifier
        .matched_ca()
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default();
    Ok((result, ca))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc_transport::MAX_UDP_PAYLOAD;
    use crate::tls::CaBundle;

    /// A joiner's call (`b"v"`) offering the protocol versions of `speaks`.
    async fn call_as_joiner_speaking(
        addr: SocketAddr,
        ca_pin: &str,
        timeout: Duration,
        speaks: Range,
    ) -> Result<(Vec<u8>, Vec<u8>), RpcError> {
        joiner_call(joiner_bind(None, addr), addr, ca_pin, b"v", timeout, speaks).await
    }

    struct Echo;
    impl RpcHandler for Echo {
        fn handle(&self, peer: PeerInfo, body: Vec<u8>) -> RpcFuture {
            Box::pin(async move {
                let mut v = vec![
                    u8::from(peer.authenticated),
                    peer.member.and_then(|m| u8::try_from(m).ok()).unwrap_or(0),
                ];
                v.extend(body);
                v
            })
        }
    }

    fn localhost() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    /// Members 1 (`a`, echoing) and 2 (`b`) of one CA, and `a`'s address.
    fn two_members() -> (RpcEndpoint, RpcEndpoint, SocketAddr) {
        let ca = CaBundle::generate("c").expect("ca");
        let a = RpcEndpoint::serve(localhost(), &ca.issue("a", 1).expect("a"), Arc::new(Echo))
            .expect("a");
        let b = RpcEndpoint::serve(localhost(), &ca.issue("b", 2).expect("b"), Arc::new(Echo))
            .expect("b");
        let addr = a.local_addr().expect("addr");
        (a, b, addr)
    }

    #[tokio::test]
    async fn each_endpoint_counts_the_bytes_its_socket_moves() {
        let (a, b, addr) = two_members();
        let body = vec![7u8; 100_000];
        b.call(addr, &body, Duration::from_secs(5))
            .await
            .expect("call");
        let (ta, tb) = (a.traffic(), b.traffic());
        // The body went out of b and into a, and came back echoed.
        for t in [ta, tb] {
            assert!(t.bytes_in > 100_000 && t.bytes_out > 100_000, "{t:?}");
        }
        // Nothing is counted received that was not sent; a burst may lose
        // a few datagrams to a full receive buffer, which QUIC resends.
        for (sent, received) in [(tb.bytes_out, ta.bytes_in), (ta.bytes_out, tb.bytes_in)] {
            assert!(
                received <= sent && received * 10 >= sent * 9,
                "{ta:?} {tb:?}"
            );
        }
    }

    #[tokio::test]
    async fn members_talk_with_mutual_tls() {
        let (_a, b, addr) = two_members();
        let resp = b
            .call(addr, b"hi", Duration::from_secs(5))
            .await
            .expect("call");
        assert_eq!(resp, b"\x01\x02hi", "b is member 2");
    }

    /// Bulk frames between members travel in packets larger than
    /// Ethernet's where the path allows (loopback here), and never in GSO
    /// sends the kernel refuses: those would be lost, detected as a black
    /// hole, and drop the MTU to 1200.
    #[tokio::test]
    async fn members_send_bulk_frames_in_large_packets() {
        let (_a, b, addr) = two_members();
        let body = vec![7u8; 1 << 20];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let stats = loop {
            let resp = b
                .call(addr, &body, Duration::from_secs(10))
                .await
                .expect("call");
            assert_eq!(resp.len(), body.len() + 2);
            let stats = b.connection(addr).await.expect("connection").stats();
            if stats.path.current_mtu == MAX_UDP_PAYLOAD || tokio::time::Instant::now() > deadline {
                break stats;
            }
        };
        assert_eq!(
            stats.path.current_mtu, MAX_UDP_PAYLOAD,
            "MTU discovery should reach the members' limit on loopback: {:?}",
            stats.path
        );
        assert_eq!(stats.path.black_holes_detected, 0, "{:?}", stats.path);
    }

    #[tokio::test]
    async fn a_call_to_a_member_is_answered_only_by_that_member() {
        let (_a, b, addr) = two_members();
        let timeout = Duration::from_secs(5);
        let answer = b
            .call_member(addr, 1, b"hi", timeout)
            .await
            .expect("member 1");
        assert_eq!(answer, b"\x01\x02hi");
        // Node 3's address pointing at node 1: refused, not answered.
        match b.call_member(addr, 3, b"hi", timeout).await {
            Err(RpcError::WrongPeer {
                expected: 3,
                found: Some(1),
                ..
            }) => {}
            other => panic!("expected a wrong-peer refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_client_without_a_certificate_gets_small_frames_and_few_connections() {
        let ca = CaBundle::generate("c").expect("ca");
        let a = RpcEndpoint::serve(localhost(), &ca.issue("a", 1).expect("a"), Arc::new(Echo))
            .expect("a");
        let addr = a.local_addr().expect("addr");
        let pin = ca.fingerprint().expect("fp");
        let limits = Limits::default();
        let big = vec![7u8; limits.anonymous_frame + 1];
        assert!(
            call_as_joiner(addr, &pin, &big, Duration::from_secs(5))
                .await
                .is_err(),
            "a request above the anonymous frame limit must not be answered"
        );
        // A member may send far more.
        let b = RpcEndpoint::serve(localhost(), &ca.issue("b", 2).expect("b"), Arc::new(Echo))
            .expect("b");
        let answer = b
            .call(addr, &big, Duration::from_secs(5))
            .await
            .expect("member call");
        assert_eq!(answer.len(), big.len() + 2);
        // Connections without a certificate from one source are capped: hold
        // the cap's worth open, and the next one is refused.
        let mut held = Vec::new();
        for _ in 0..limits.anonymous_connections_per_source {
            let (tls, _) = crate::tls::joiner_client_config(&pin).expect("tls");
            let quic = QuicClientConfig::try_from(tls).expect("quic");
            let endpoint = Endpoint::client(localhost()).expect("client");
            let conn = connect(
                &endpoint,
                ClientConfig::new(Arc::new(quic)),
                addr,
                Range::BUILD,
            )
            .await
            .expect("connect");
            exchange(&conn, addr, b"hi").await.expect("answered");
            held.push((endpoint, conn));
        }
        assert!(
            call_as_joiner(addr, &pin, b"one more", Duration::from_secs(5))
                .await
                .is_err(),
            "the connection above the per-source cap must be refused"
        );
        drop(held);
    }

    #[tokio::test]
    async fn an_expired_member_certificate_is_refused() {
        let ca = CaBundle::generate("c").expect("ca");
        let a = RpcEndpoint::serve(localhost(), &ca.issue("a", 1).expect("a"), Arc::new(Echo))
            .expect("a");
        let now = time::OffsetDateTime::now_utc();
        crate::tls::TEST_VALIDITY.with(|v| {
            v.set(Some((
                now - time::Duration::hours(2),
                now - time::Duration::hours(1),
            )))
        });
        let expired = ca.issue("old", 2).expect("expired credentials");
        crate::tls::TEST_VALIDITY.with(|v| v.set(None));
        let old = RpcEndpoint::serve(localhost(), &expired, Arc::new(Echo)).expect("old");
        let addr = a.local_addr().expect("addr");
        assert!(
            old.call(addr, b"hi", Duration::from_secs(5)).await.is_err(),
            "an expired certificate must not get an answer"
        );
        let fresh = RpcEndpoint::serve(
            localhost(),
            &ca.issue("new", 3).expect("new"),
            Arc::new(Echo),
        )
        .expect("fresh");
        assert!(fresh
            .call(addr, b"hi", Duration::from_secs(5))
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn a_node_from_another_ca_is_refused() {
        let ca = CaBundle::generate("c").expect("ca");
        let other = CaBundle::generate("evil").expect("ca");
        let a = RpcEndpoint::serve(localhost(), &ca.issue("a", 1).expect("a"), Arc::new(Echo))
            .expect("a");
        let evil = RpcEndpoint::serve(
            localhost(),
            &other.issue("x", 9).expect("x"),
            Arc::new(Echo),
        )
        .expect("x");
        let addr = a.local_addr().expect("addr");
        let err = evil.call(addr, b"hi", Duration::from_secs(5)).await;
        assert!(err.is_err(), "a foreign certificate must not get an answer");
    }

    #[tokio::test]
    async fn joiner_is_unauthenticated_and_checks_the_pin() {
        let ca = CaBundle::generate("c").expect("ca");
        let a = RpcEndpoint::serve(localhost(), &ca.issue("a", 1).expect("a"), Arc::new(Echo))
            .expect("a");
        let addr = a.local_addr().expect("addr");
        let pin = ca.fingerprint().expect("fp");
        let (resp, ca_der) = call_as_joiner(addr, &pin, b"join", Duration::from_secs(5))
            .await
            .expect("join");
        assert_eq!(resp, b"\x00\x00join");
        assert_eq!(crate::tls::fingerprint_der(&ca_der), pin);
        let wrong = "0".repeat(64);
        assert!(
            call_as_joiner(addr, &wrong, b"join", Duration::from_secs(5))
                .await
                .is_err()
        );
    }

    /// Answers with the protocol version the connection negotiated.
    struct Version;
    impl RpcHandler for Version {
        fn handle(&self, peer: PeerInfo, _body: Vec<u8>) -> RpcFuture {
            Box::pin(async move { peer.protocol.to_be_bytes().to_vec() })
        }
    }

    fn speaking(ca: &CaBundle, id: u64, min: u16, max: u16) -> RpcEndpoint {
        let socket = std::net::UdpSocket::bind(localhost()).expect("bind");
        let creds = ca.issue(&format!("n{id}"), id).expect("creds");
        let range = Range::new(min, max).expect("range");
        RpcEndpoint::serve_socket_speaking(socket, &creds, Arc::new(Version), range).expect("serve")
    }

    #[tokio::test]
    async fn peers_settle_on_the_highest_protocol_version_both_speak() {
        let ca = CaBundle::generate("c").expect("ca");
        let a = speaking(&ca, 1, 1, 3);
        let b = speaking(&ca, 2, 2, 4);
        let old = speaking(&ca, 3, 1, 1);
        let t = Duration::from_secs(5);
        let a_addr = a.local_addr().expect("addr");
        let answer = b.call(a_addr, b"v", t).await.expect("b calls a");
        assert_eq!(answer, 3u16.to_be_bytes(), "the server saw version 3");
        assert_eq!(b.negotiated(a_addr).await.expect("negotiated"), 3);
        let answer = old.call(a_addr, b"v", t).await.expect("old calls a");
        assert_eq!(answer, 1u16.to_be_bytes());
        let old_addr = old.local_addr().expect("addr");
        assert_eq!(
            a.call(old_addr, b"v", t).await.expect("a calls old"),
            1u16.to_be_bytes()
        );
        // A joiner negotiates too.
        let pin = ca.fingerprint().expect("fp");
        let (answer, _) =
            call_as_joiner_speaking(a_addr, &pin, t, Range::new(2, 2).expect("range"))
                .await
                .expect("join call");
        assert_eq!(answer, 2u16.to_be_bytes());
    }

    #[tokio::test]
    async fn peers_without_a_common_version_are_refused_with_both_ranges() {
        let ca = CaBundle::generate("c").expect("ca");
        let old = speaking(&ca, 1, 1, 1);
        let new = speaking(&ca, 2, 2, 2);
        let t = Duration::from_secs(5);
        let old_addr = old.local_addr().expect("addr");
        let err = new
            .call(old_addr, b"v", t)
            .await
            .expect_err("no common version");
        let text = err.to_string();
        assert!(
            matches!(
                &err,
                RpcError::Protocol { mismatch, .. } if mismatch.peer == Some(Range { min: 1, max: 1 })
            ),
            "{err:?}"
        );
        assert!(
            text.contains(&format!(
                "peer at {old_addr} speaks protocol 1..1, this node 2..2"
            )),
            "{text}"
        );
        assert!(text.contains("older release"), "{text}");
        let new_addr = new.local_addr().expect("addr");
        let err = old
            .call(new_addr, b"v", t)
            .await
            .expect_err("no common version");
        assert!(
            err.to_string()
                .contains("speaks protocol 2..2, this node 1..1"),
            "{err}"
        );
        assert!(err.to_string().contains("newer release"), "{err}");
        // The same for a node asking to join.
        let pin = ca.fingerprint().expect("fp");
        let err = call_as_joiner_speaking(old_addr, &pin, t, Range::new(3, 3).expect("r"))
            .await
            .expect_err("a joiner without a common version");
        assert!(
            err.to_string()
                .contains("speaks protocol 1..1, this node 3..3"),
            "{err}"
        );
        // Both still serve peers they share a version with.
        let mid = speaking(&ca, 3, 1, 2);
        assert!(mid.call(old_addr, b"v", t).await.is_ok());
        assert!(mid.call(new_addr, b"v", t).await.is_ok());
    }

    #[tokio::test]
    async fn a_server_without_the_range_exchange_still_gives_a_clear_refusal() {
        // What a release that offered only `shoal/1` does.
        let ca = CaBundle::generate("c").expect("ca");
        let mut tls = ca
            .issue("old", 1)
            .expect("creds")
            .server_config()
            .expect("tls");
        tls.alpn_protocols = vec![crate::tls::ALPN.to_vec()];
        let quic = QuicServerConfig::try_from(tls).expect("quic");
        let server = Endpoint::server(ServerConfig::with_crypto(Arc::new(quic)), localhost())
            .expect("server");
        let addr = server.local_addr().expect("addr");
        let accepting = server.clone();
        tokio::spawn(async move {
            while let Some(incoming) = accepting.accept().await {
                let _ = incoming.await;
            }
        });
        let new = speaking(&ca, 2, 2, 2);
        let err = new
            .call(addr, b"v", Duration::from_secs(5))
            .await
            .expect_err("no common version");
        assert!(
            matches!(&err, RpcError::Protocol { mismatch, .. } if mismatch.peer.is_none()),
            "{err:?}"
        );
        assert!(err.to_string().contains("this node 2..2"), "{err}");
    }
}
