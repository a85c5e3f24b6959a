//! Counts the bytes a connection carries, against the sandbox's budget.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose reads are counted: into this connection's count and the sandbox's total,
/// failing once the total passes `limit`.
pub(crate) struct Metered<S> {
    pub inner: S,
    pub count: Arc<AtomicU64>,
    pub total: Arc<AtomicU64>,
    pub limit: Option<u64>,
}

/// The error a connection ends with when the sandbox's byte budget is spent.
pub(crate) const BYTE_LIMIT: &str = "the sandbox's egress byte limit is reached";

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(limit) = self.limit
            && self.total.load(Ordering::Relaxed) >= limit
        {
            return Poll::Ready(Err(io::Error::other(BYTE_LIMIT)));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            self.count.fetch_add(n, Ordering::Relaxed);
            self.total.fetch_add(n, Ordering::Relaxed);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
