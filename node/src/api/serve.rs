//! The API's accept loop: HTTP/1.1 with a cap on open connections and a
//! deadline for a request's headers (and, in the router, for its body), so a
//! client that opens sockets and sends nothing (or a byte a minute) cannot
//! take the API down for others. With TLS, the handshake counts against the
//! same deadline as the headers.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
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
    /// Time a client has to send a request's headers.
    pub header_read_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
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
        let service = TowerToHyperService::new(app.clone());
        let timeout = limits.header_read_timeout;
        let stop = shutdown.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
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
}
