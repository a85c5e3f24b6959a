//! Counts the bytes a connection carries, against the sandbox's budget.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Counts the bytes one direction takes from its source, into its own count and the
/// sandbox's total, against the sandbox's limit. [`Meter::wrap`] counts a stream's reads; a
/// relay that reads no buffer (`crate::splice`) asks it directly.
#[derive(Debug, Clone)]
pub(crate) struct Meter {
    pub count: Arc<AtomicU64>,
    pub total: Arc<AtomicU64>,
    pub limit: Option<u64>,
}

impl Meter {
    /// `inner`, its reads counted by this meter.
    pub(crate) fn wrap<S>(&self, inner: S) -> Metered<S> {
        Metered {
            inner,
            meter: self.clone(),
        }
    }

    /// Whether the sandbox's budget is spent.
    fn spent(&self) -> bool {
        self.limit
            .is_some_and(|limit| self.total.load(Ordering::Relaxed) >= limit)
    }

    /// How much of `want` may be taken now; the limit's error once the total reached it.
    pub(crate) fn allowance(&self, want: usize) -> io::Result<usize> {
        let Some(limit) = self.limit else {
            return Ok(want);
        };
        let total = self.total.load(Ordering::Relaxed);
        if total >= limit {
            return Err(io::Error::other(BYTE_LIMIT));
        }
        // Never past the limit in one take (a read through `Metered` can overshoot by a
        // buffer).
        Ok(usize::try_from(limit - total).map_or(want, |left| want.min(left)))
    }

    /// Counts `n` bytes taken.
    pub(crate) fn add(&self, n: usize) {
        let n = n as u64;
        self.count.fetch_add(n, Ordering::Relaxed);
        self.total.fetch_add(n, Ordering::Relaxed);
    }
}

/// A stream whose reads are counted by its [`Meter`], failing once the sandbox's total
/// passes its limit.
pub(crate) struct Metered<S> {
    pub inner: S,
    meter: Meter,
}

/// The error a connection ends with when the sandbox's byte budget is spent.
pub(crate) const BYTE_LIMIT: &str = "the sandbox's egress byte limit is reached";

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.meter.spent() {
            return Poll::Ready(Err(io::Error::other(BYTE_LIMIT)));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.meter.add(n);
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
