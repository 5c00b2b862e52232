//! Bytes an RPC endpoint moves over UDP, counted at its socket so that
//! every connection (dialled or accepted, handshakes and retransmissions
//! included) is in the figure: what a node costs its network, not what its
//! messages weigh.

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// Bytes moved through a node's RPC socket since it was bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpcTraffic {
    pub bytes_in: u64,
    pub bytes_out: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> RpcTraffic {
        RpcTraffic {
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
        }
    }
}

/// A UDP socket that counts what passes through it.
pub(crate) struct CountingSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    counters: Arc<Counters>,
}

impl CountingSocket {
    pub(crate) fn wrap(inner: Arc<dyn AsyncUdpSocket>, counters: Arc<Counters>) -> Arc<Self> {
        Arc::new(CountingSocket { inner, counters })
    }
}

impl fmt::Debug for CountingSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountingSocket")
            .field("inner", &self.inner)
            .finish()
    }
}

impl AsyncUdpSocket for CountingSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)?;
        self.counters
            .bytes_out
            .fetch_add(transmit.contents.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let polled = self.inner.poll_recv(cx, bufs, meta);
        if let Poll::Ready(Ok(n)) = &polled {
            let bytes: usize = meta.iter().take(*n).map(|m| m.len).sum();
            self.counters
                .bytes_in
                .fetch_add(bytes as u64, Ordering::Relaxed);
        }
        polled
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
