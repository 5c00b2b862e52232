//! The API's accept loop: HTTP/1.1 with a cap on open connections, a
//! smaller cap per source address, and a deadline for a request's headers
//! (and, in the router, for its body), so a client that opens sockets and
//! sends nothing (or a byte a minute) cannot take the API down for others:
//! it holds at most its own share of the slots, and each of them for at
//! most the deadline. With TLS, the handshake counts against the same
//! deadline as the headers.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;

/// How long a request body may take between two of its parts.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Limits of the API server.
#[derive(Clone, Debug)]
pub struct ServeLimits {
    /// Connections open at once; the next one waits for a free slot.
    pub max_connections: usize,
    /// Connections open at once from one address; one more is closed at
    /// once rather than wait for a slot others need.
    pub max_per_source: usize,
    /// Time a client has to send a request's headers.
    pub header_read_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: 1024,
            // Every CLI call and script on one machine shares its address;
            // an eighth of the slots leaves room for seven more sources.
            max_per_source: 128,
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// Open connections by source address.
#[derive(Default)]
struct PerSource(Mutex<HashMap<IpAddr, usize>>);

/// One connection's place in [`PerSource`], given back when dropped.
struct SourceSlot {
    table: Arc<PerSource>,
    ip: IpAddr,
}

impl PerSource {
    fn take(table: &Arc<PerSource>, ip: IpAddr, cap: usize) -> Option<SourceSlot> {
        let mut open = table.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_default();
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            table: table.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.table.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown`
/// changes; then stops accepting and lets open connections finish their
/// current request.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    limits: ServeLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let tls = tls.map(TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_source = Arc::new(PerSource::default());
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shutdown.changed() => return,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off a moment
                    // rather than spin.
                    tracing::warn!(error = %e, "the API could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let Some(source_slot) = PerSource::take(&per_source, remote.ip(), limits.max_per_source)
        else {
            tracing::debug!(%remote, "closed a connection over the per-source limit");
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let timeout = limits.header_read_timeout;
        let stop = shutdown.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _source_slot = source_slot;
            match tls {
                None => serve_connection(stream, service, timeout, stop, remote).await,
                Some(acceptor) => {
                    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, service, timeout, stop, remote).await
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%remote, error = %e, "an API TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%remote, "an API TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

async fn serve_connection<S>(
    stream: S,
    service: TowerToHyperService<Router>,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
    remote: std::net::SocketAddr,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(%remote, error = %e, "an API connection ended with an error");
            }
        }
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn server(limits: ServeLimits) -> (std::net::SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = watch::channel(false);
        let app = Router::new().route("/", get(|| async { "ok" }));
        tokio::spawn(serve(listener, app, None, limits, rx));
        (addr, tx)
    }

    async fn get_root(addr: std::net::SocketAddr) -> std::io::Result<String> {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn a_client_that_never_sends_its_headers_is_cut_off() {
        let (addr, _stop) = server(ServeLimits {
            max_connections: 4,
            max_per_source: 4,
            header_read_timeout: Duration::from_millis(300),
        })
        .await;
        let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"GET / HT").await.expect("partial");
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), idle.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "the server kept a silent client past its deadline"
        );
        assert!(get_root(addr).await.expect("get").ends_with("ok"));
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_tls_handshake_is_cut_off() {
        let ca = shoal_mesh::CaBundle::generate("t").expect("ca");
        let cert = shoal_mesh::api_tls::ApiCertificate::new(&ca.issue("n1", 1).expect("issue"))
            .expect("cert");
        let tls = Arc::new(cert.server_config().expect("tls"));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (_stop, rx) = watch::channel(false);
        let app = Router::new().route("/", get(|| async { "ok" }));
        let limits = ServeLimits {
            max_connections: 1,
            max_per_source: 1,
            header_read_timeout: Duration::from_millis(300),
        };
        tokio::spawn(serve(listener, app, Some(tls), limits, rx));
        // It holds the only slot and says nothing; the deadline frees it.
        let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut buf = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "the server kept a silent TLS client past its deadline"
        );
        // Plain HTTP on a TLS port is no request either.
        let answer = get_root(addr).await.unwrap_or_default();
        assert!(!answer.contains("ok"), "{answer}");
    }

    #[tokio::test]
    async fn connections_above_the_cap_wait_for_a_free_slot() {
        let (addr, _stop) = server(ServeLimits {
            max_connections: 2,
            max_per_source: 2,
            header_read_timeout: Duration::from_secs(1),
        })
        .await;
        let a = tokio::net::TcpStream::connect(addr).await.expect("a");
        let b = tokio::net::TcpStream::connect(addr).await.expect("b");
        // Both slots are held by silent clients: a third request waits, and
        // is served once their header deadline frees a slot.
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(10), get_root(addr))
            .await
            .expect("served eventually")
            .expect("get");
        assert!(answer.ends_with("ok"));
        assert!(
            started.elapsed() >= Duration::from_millis(500),
            "served before a slot was free"
        );
        drop((a, b));
    }

    /// Audit finding 6: one source's slowloris (sockets that send a byte
    /// now and then) made 11 of 25 `/health` requests of others time out.
    /// It now holds at most its own share of the slots; another source is
    /// served at once.
    #[tokio::test]
    async fn one_source_cannot_take_the_slots_of_another() {
        let (addr, _stop) = server(ServeLimits {
            max_connections: 4,
            max_per_source: 2,
            header_read_timeout: Duration::from_secs(5),
        })
        .await;
        let mut slow = Vec::new();
        for _ in 0..8 {
            if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                let _ = s.write_all(b"GET / HT").await;
                slow.push(s);
            }
        }
        // Another address of the loopback range.
        let other = tokio::net::TcpSocket::new_v4().expect("socket");
        other
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("bind 127.0.0.2");
        let started = std::time::Instant::now();
        let mut s = other.connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("request");
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(4), s.read_to_string(&mut out))
            .await
            .expect("served before the slow client's deadline freed a slot")
            .expect("read");
        assert!(out.ends_with("ok"), "{out}");
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(slow);
    }
}
