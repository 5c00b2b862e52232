//! Byte counting for every libp2p substream, wrapped around the QUIC muxer.
//!
//! Counts application-level stream bytes (gossipsub, identify, ping and
//! their framing), not QUIC/TLS/UDP overhead, which quinn does not expose per
//! connection through libp2p. Good enough to compare gossip settings and to
//! size the mesh's background traffic.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::io::{IoSlice, IoSliceMut};
use futures::{AsyncRead, AsyncWrite};
use libp2p::core::muxing::{StreamMuxer, StreamMuxerEvent};

/// Bytes moved through this node's libp2p streams since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficStats {
    /// Bytes read from remote peers.
    pub bytes_in: u64,
    /// Bytes written to remote peers.
    pub bytes_out: u64,
}

/// Shared counters; one per gossip instance.
#[derive(Debug, Default)]
pub(crate) struct TrafficCounters {
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

impl TrafficCounters {
    pub(crate) fn snapshot(&self) -> TrafficStats {
        TrafficStats {
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
        }
    }

    fn add_in(&self, n: usize) {
        self.bytes_in
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn add_out(&self, n: usize) {
        self.bytes_out
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// A [`StreamMuxer`] that hands out [`CountingStream`]s.
pub(crate) struct CountingMuxer<M> {
    inner: M,
    counters: Arc<TrafficCounters>,
}

impl<M> CountingMuxer<M> {
    pub(crate) fn new(inner: M, counters: Arc<TrafficCounters>) -> Self {
        Self { inner, counters }
    }
}

impl<M> StreamMuxer for CountingMuxer<M>
where
    M: StreamMuxer + Unpin,
    M::Substream: Unpin,
{
    type Substream = CountingStream<M::Substream>;
    type Error = M::Error;

    fn poll_inbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        let counters = self.counters.clone();
        Pin::new(&mut self.inner)
            .poll_inbound(cx)
            .map_ok(|inner| CountingStream { inner, counters })
    }

    fn poll_outbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        let counters = self.counters.clone();
        Pin::new(&mut self.inner)
            .poll_outbound(cx)
            .map_ok(|inner| CountingStream { inner, counters })
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<StreamMuxerEvent, Self::Error>> {
        Pin::new(&mut self.inner).poll(cx)
    }
}

/// A substream that adds its reads and writes to the shared counters.
pub(crate) struct CountingStream<S> {
    inner: S,
    counters: Arc<TrafficCounters>,
}

impl<S: AsyncRead + Unpin> AsyncRead for CountingStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            this.counters.add_in(n);
        }
        poll
    }

    fn poll_read_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_read_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = poll {
            this.counters.add_in(n);
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CountingStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            this.counters.add_out(n);
        }
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = poll {
            this.counters.add_out(n);
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}
