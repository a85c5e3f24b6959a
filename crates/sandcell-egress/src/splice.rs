//! Relays a connection's bytes with `splice(2)`: socket → pipe → socket, so they never
//! enter user space.
//!
//! Why: a tunnel's bulk copy through user space (read into a buffer, write it out) held the
//! whole egress path to about a third of a direct loopback connection's throughput
//! (docs/benchmarks.md, "Egress proxy"). With `splice` the kernel moves the socket's pages
//! into a pipe and from the pipe into the other socket; the proxy only asks.
//!
//! How:
//! - one pipe per direction (non-blocking, close-on-exec, raised to [`PIPE_SIZE`] when the
//!   host lets it);
//! - driven by tokio's readiness of the two sockets (`ready` then `try_io`). The pipe is
//!   filled only when empty and drained completely before the next fill, so an `EAGAIN`
//!   always means the socket (nothing to read, no room to write), never the pipe, and the
//!   socket's readiness is cleared only when it should be;
//! - every byte taken from the source is counted as [`crate::meter::Metered`] counts a
//!   read, and the sandbox's byte limit is checked before each take, as it is there;
//! - a kernel or a socket without `splice` (`EINVAL`, `ENOSYS`) falls back to a copy
//!   through user space for that direction, after handing on what the pipe held.
//!
//! Only real sockets can be spliced, so the proxy uses it only for a connection that came
//! as a [`UnixStream`] (the sandbox's bridge) or a [`TcpStream`] (a loopback proxy on the
//! host): [`EgressProxy::handle`](crate::EgressProxy::handle) gives the generic code a
//! [`Shared`] handle on the socket (no buffer of its own) and keeps the socket for the relay
//! in a task-local ([`claim`]). Every other stream (in-memory ones in tests, TLS
//! interception's) takes the generic copy.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use rustix::io::Errno;
use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::meter::Meter;

/// The size each pipe is asked for: 256 pages, enough for several of loopback's 64 KiB
/// segments per `splice`. Kept at the default when the host refuses (an unprivileged user
/// over `fs.pipe-max-size` or `fs.pipe-user-pages-soft`).
pub(crate) const PIPE_SIZE: usize = 1 << 20;

/// A pipe's size when even asking it fails (the kernel's default).
const DEFAULT_PIPE_SIZE: usize = 64 * 1024;

/// Bytes moved at a time by the copy through user space.
const COPY_BUF: usize = crate::proxy::COPY_BUF;

/// Bytes moved by `splice` so far in this process (tests check that a path used it).
#[cfg(test)]
pub(crate) static SPLICED: AtomicU64 = AtomicU64::new(0);

/// A connection the proxy serves, when it is a socket `splice` can move bytes from and to.
#[derive(Debug)]
pub(crate) enum Socket {
    /// The sandbox's bridge.
    Unix(UnixStream),
    /// A loopback proxy on the host.
    Tcp(TcpStream),
}

impl Socket {
    /// The socket `stream` is, if it is one; the stream back otherwise.
    pub(crate) fn from_stream<S: 'static>(stream: S) -> Result<Self, S> {
        let mut slot = Some(stream);
        if let Some(s) = take_as::<S, UnixStream>(&mut slot) {
            return Ok(Self::Unix(s));
        }
        if let Some(s) = take_as::<S, TcpStream>(&mut slot) {
            return Ok(Self::Tcp(s));
        }
        Err(slot.expect("a failed downcast leaves the stream in its slot"))
    }

    /// The socket to relay from or to.
    pub(crate) fn end(&self) -> End<'_> {
        match self {
            Self::Unix(s) => End::Unix(s),
            Self::Tcp(s) => End::Tcp(s),
        }
    }
}

/// Takes the stream out of `slot` if it is a `T`.
fn take_as<S: 'static, T: 'static>(slot: &mut Option<S>) -> Option<T> {
    (slot as &mut dyn std::any::Any)
        .downcast_mut::<Option<T>>()
        .and_then(Option::take)
}

/// One side of a relay: a socket registered with tokio's reactor.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End<'a> {
    /// A Unix stream socket.
    Unix(&'a UnixStream),
    /// A TCP socket.
    Tcp(&'a TcpStream),
}

impl End<'_> {
    /// Waits until tokio last saw the socket ready for `interest`.
    async fn ready(self, interest: Interest) -> io::Result<()> {
        match self {
            Self::Unix(s) => s.ready(interest).await.map(drop),
            Self::Tcp(s) => s.ready(interest).await.map(drop),
        }
    }

    /// Runs `f` (a system call on the socket) if it is ready for `interest`; an `EAGAIN`
    /// clears that readiness.
    fn try_io<R>(self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        match self {
            Self::Unix(s) => s.try_io(interest, f),
            Self::Tcp(s) => s.try_io(interest, f),
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Unix(s) => s.as_fd(),
            Self::Tcp(s) => s.as_fd(),
        }
    }

    /// Ends the socket's sending side (the peer reads its end), leaving its receiving side
    /// open: a tunnel's half-close.
    pub(crate) fn shutdown_write(self) -> io::Result<()> {
        rustix::net::shutdown(self.fd(), rustix::net::Shutdown::Write).map_err(io::Error::from)
    }

    fn poll_read_ready(self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Unix(s) => s.poll_read_ready(cx),
            Self::Tcp(s) => s.poll_read_ready(cx),
        }
    }

    fn poll_write_ready(self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Unix(s) => s.poll_write_ready(cx),
            Self::Tcp(s) => s.poll_write_ready(cx),
        }
    }

    fn try_read(self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Unix(s) => s.try_read(buf),
            Self::Tcp(s) => s.try_read(buf),
        }
    }

    fn try_write(self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Unix(s) => s.try_write(buf),
            Self::Tcp(s) => s.try_write(buf),
        }
    }
}

impl<'a> From<&'a TcpStream> for End<'a> {
    fn from(s: &'a TcpStream) -> Self {
        Self::Tcp(s)
    }
}

/// A handle on a [`Socket`] that reads and writes it as the tokio stream would, with no
/// buffer of its own: what the generic code (the request head, SOCKS, TLS interception)
/// reads and writes while the relay keeps the socket itself for `splice`.
#[derive(Debug, Clone)]
pub(crate) struct Shared(pub(crate) Arc<Socket>);

impl AsyncRead for Shared {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let end = self.0.end();
        loop {
            ready!(end.poll_read_ready(cx))?;
            match end.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for Shared {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let end = self.0.end();
        loop {
            ready!(end.poll_write_ready(cx))?;
            match end.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.0.end().shutdown_write())
    }
}

tokio::task_local! {
    /// The socket of the connection this task serves, while it is served through a
    /// [`Shared`] handle.
    static SOCKET: Arc<Socket>;
}

/// Runs `serve` (the connection's whole service, given a [`Shared`] handle on `socket`)
/// with `socket` where [`claim`] finds it.
pub(crate) async fn serving<F: Future>(socket: Arc<Socket>, serve: F) -> F::Output {
    SOCKET.scope(socket, serve).await
}

/// The socket of the connection being served, for a relay whose side is `S`: only when `S`
/// is the [`Shared`] handle (or its write half) the socket was given to the generic code
/// as, so no byte can sit in a buffer the relay would skip. `None`: relay through `S`.
pub(crate) fn claim<S: ?Sized + 'static>() -> Option<Arc<Socket>> {
    use std::any::TypeId;
    let id = TypeId::of::<S>();
    if id != TypeId::of::<Shared>() && id != TypeId::of::<tokio::io::WriteHalf<Shared>>() {
        return None;
    }
    SOCKET.try_with(Arc::clone).ok()
}

/// One direction's pipe.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// What it holds when full.
    size: usize,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        // A bigger pipe moves more per call; the default is fine when the host says no.
        let size = rustix::pipe::fcntl_setpipe_size(&write, PIPE_SIZE)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))
            .unwrap_or(DEFAULT_PIPE_SIZE);
        Ok(Self { read, write, size })
    }

    /// Reads the `n` bytes the pipe holds (to hand them on without `splice`).
    fn drain(&self, n: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match rustix::io::read(&self.read, &mut out[got..])? {
                0 => break,
                k => got += k,
            }
        }
        out.truncate(got);
        Ok(out)
    }
}

/// `splice` has no support for one of these descriptors (an old kernel, a socket type
/// without it): copy through user space instead.
fn unsupported(e: &io::Error) -> bool {
    matches!(
        Errno::from_io_error(e),
        Some(Errno::INVAL) | Some(Errno::NOSYS)
    )
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

const FLAGS: SpliceFlags = SpliceFlags::NONBLOCK.union(SpliceFlags::MOVE);

/// Moves `from`'s bytes to `to` until `from` ends (or fails, or the meter cuts it); the
/// bytes moved. Does not shut `to` down: the caller does, as it does after a copy.
///
/// `SPLICE_F_MORE` is not used: it would hold the last bytes of a burst back in `to`'s
/// send queue (TCP corks on it) until more came; the kernel already marks all but the
/// last page of one `splice` as "more".
pub(crate) async fn relay(from: End<'_>, to: End<'_>, meter: &Meter) -> io::Result<u64> {
    let pipe = match Pipe::new() {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(error = %e, "no pipe for a splice relay: copying through user space");
            return copy(from, to, meter, Vec::new()).await;
        }
    };
    let mut moved = 0u64;
    loop {
        // In: from the socket into the empty pipe. An EAGAIN here is the socket's.
        let taken = loop {
            from.ready(Interest::READABLE).await?;
            let want = meter.allowance(pipe.size)?;
            let spliced = from.try_io(Interest::READABLE, || {
                rustix::pipe::splice(from.fd(), None, &pipe.write, None, want, FLAGS)
                    .map_err(io::Error::from)
            });
            match spliced {
                Ok(n) => break n,
                Err(e) if would_block(&e) => {}
                Err(e) if unsupported(&e) => {
                    tracing::debug!(error = %e, "splice refused: copying through user space");
                    return Ok(moved + copy(from, to, meter, Vec::new()).await?);
                }
                Err(e) => return Err(e),
            }
        };
        if taken == 0 {
            return Ok(moved);
        }
        meter.add(taken);
        // Out: all of it into the other socket before the next take. An EAGAIN here is
        // the socket's too (the pipe holds bytes).
        let mut left = taken;
        while left > 0 {
            to.ready(Interest::WRITABLE).await?;
            let spliced = to.try_io(Interest::WRITABLE, || {
                rustix::pipe::splice(&pipe.read, None, to.fd(), None, left, FLAGS)
                    .map_err(io::Error::from)
            });
            match spliced {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the relay's pipe gave no bytes to send",
                    ));
                }
                Ok(n) => {
                    left -= n;
                    moved += n as u64;
                    #[cfg(test)]
                    SPLICED.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if would_block(&e) => {}
                Err(e) if unsupported(&e) => {
                    tracing::debug!(error = %e, "splice refused: copying through user space");
                    let held = pipe.drain(left)?;
                    return Ok(moved + copy(from, to, meter, held).await?);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Moves `from`'s bytes to `to` through user space until `from` ends, `held` (bytes already
/// taken and counted) first; the bytes written. The fallback of [`relay`].
pub(crate) async fn copy(
    from: End<'_>,
    to: End<'_>,
    meter: &Meter,
    held: Vec<u8>,
) -> io::Result<u64> {
    let mut moved = held.len() as u64;
    write_all(to, &held).await?;
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        from.ready(Interest::READABLE).await?;
        let want = meter.allowance(buf.len())?;
        let read = from.try_io(Interest::READABLE, || {
            rustix::io::read(from.fd(), &mut buf[..want]).map_err(io::Error::from)
        });
        let n = match read {
            Ok(0) => return Ok(moved),
            Ok(n) => n,
            Err(e) if would_block(&e) => continue,
            Err(e) => return Err(e),
        };
        meter.add(n);
        write_all(to, &buf[..n]).await?;
        moved += n as u64;
    }
}

/// Writes all of `bytes` to `to`.
pub(crate) async fn write_all(to: End<'_>, bytes: &[u8]) -> io::Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        to.ready(Interest::WRITABLE).await?;
        let wrote = to.try_io(Interest::WRITABLE, || {
            rustix::io::write(to.fd(), &bytes[done..]).map_err(io::Error::from)
        });
        match wrote {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the socket took no bytes",
                ));
            }
            Ok(n) => done += n,
            Err(e) if would_block(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::meter::BYTE_LIMIT;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// Tests that read [`SPLICED`] before and after run one at a time: another test's
    /// spliced bytes would count for them.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    fn meter(limit: Option<u64>) -> Meter {
        Meter {
            count: Arc::default(),
            total: Arc::default(),
            limit,
        }
    }

    /// A connected pair of TCP sockets on loopback.
    async fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.expect("connect"), b.expect("accept").0)
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn relay_splices_a_unix_socket_into_a_tcp_one_and_counts_what_it_takes() {
        let _one = ONE_AT_A_TIME.lock().await;
        const SIZE: usize = 3 << 20;
        let (mut sandbox, from) = UnixStream::pair().expect("pair");
        let (to, mut server) = tcp_pair().await;
        let m = meter(None);
        let before = SPLICED.load(Ordering::Relaxed);
        let data = bytes(SIZE);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            sandbox.write_all(&sent).await.expect("write");
            sandbox.shutdown().await.expect("end");
            sandbox
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.expect("read");
            got
        });
        let moved = relay(End::Unix(&from), End::Tcp(&to), &m)
            .await
            .expect("relay");
        End::Tcp(&to).shutdown_write().expect("shutdown");
        let _sandbox = writer.await.expect("writer");
        let got = reader.await.expect("reader");
        assert_eq!(moved, SIZE as u64);
        assert!(got == data, "the bytes came through changed");
        assert_eq!(m.count.load(Ordering::Relaxed), SIZE as u64);
        assert_eq!(m.total.load(Ordering::Relaxed), SIZE as u64);
        assert!(
            SPLICED.load(Ordering::Relaxed) - before >= SIZE as u64,
            "the bytes went through user space"
        );
    }

    #[tokio::test]
    async fn relay_stops_taking_at_the_limit_and_fails_with_it() {
        let (mut sandbox, from) = UnixStream::pair().expect("pair");
        let (to, mut server) = tcp_pair().await;
        let m = meter(Some(100_000));
        m.total.store(40_000, Ordering::Relaxed);
        let writer = tokio::spawn(async move {
            let _ = sandbox.write_all(&bytes(1 << 20)).await;
            sandbox
        });
        let err = relay(End::Unix(&from), End::Tcp(&to), &m)
            .await
            .expect_err("cut");
        assert!(err.to_string().contains(BYTE_LIMIT), "{err}");
        assert_eq!(m.count.load(Ordering::Relaxed), 60_000);
        assert_eq!(m.total.load(Ordering::Relaxed), 100_000);
        drop(to);
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.expect("read");
        assert_eq!(got.len(), 60_000, "what was taken is handed on");
        writer.abort();
    }

    #[tokio::test]
    async fn the_copy_through_user_space_hands_on_held_bytes_first() {
        let (to, mut server) = tcp_pair().await;
        let (mut sandbox, from) = UnixStream::pair().expect("pair");
        let m = meter(None);
        sandbox.write_all(b" and the rest").await.expect("write");
        sandbox.shutdown().await.expect("end");
        let moved = copy(End::Unix(&from), End::Tcp(&to), &m, b"held".to_vec())
            .await
            .expect("copy");
        drop(to);
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"held and the rest");
        assert_eq!(moved, 17);
        // The held bytes were counted when they were taken.
        assert_eq!(m.count.load(Ordering::Relaxed), 13);
    }

    #[test]
    fn only_a_missing_splice_falls_back() {
        assert!(unsupported(&io::Error::from(Errno::INVAL)));
        assert!(unsupported(&io::Error::from(Errno::NOSYS)));
        assert!(!unsupported(&io::Error::from(Errno::CONNRESET)));
        assert!(!unsupported(&io::Error::from(Errno::AGAIN)));
    }

    #[tokio::test]
    async fn a_socket_is_claimed_only_through_its_shared_handle_and_only_while_served() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let socket = Arc::new(Socket::from_stream(a).expect("a unix stream is a socket"));
        assert!(claim::<Shared>().is_none(), "no connection is served");
        serving(socket.clone(), async {
            assert!(claim::<Shared>().is_some());
            assert!(claim::<tokio::io::WriteHalf<Shared>>().is_some());
            // A stream that could hold bytes of its own is never bypassed.
            assert!(claim::<tokio::io::BufReader<Shared>>().is_none());
            assert!(claim::<UnixStream>().is_none());
        })
        .await;
        let (d, _) = tokio::io::duplex(16);
        assert!(
            Socket::from_stream(d).is_err(),
            "an in-memory stream is not"
        );
    }

    #[tokio::test]
    async fn the_shared_handle_reads_writes_and_half_closes_the_socket() {
        let (a, mut b) = UnixStream::pair().expect("pair");
        let mut shared = Shared(Arc::new(Socket::from_stream(a).expect("socket")));
        shared.write_all(b"out").await.expect("write");
        shared.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"out");
        b.write_all(b"in").await.expect("write");
        drop(b);
        let mut got = Vec::new();
        shared.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"in");
    }

    /// The proxy end to end: a tunnel and a plain-HTTP answer from a Unix socket go
    /// through `splice`.
    #[tokio::test]
    async fn the_proxy_splices_a_tunnel_and_a_plain_answer() {
        let _one = ONE_AT_A_TIME.lock().await;
        const SIZE: usize = 2 << 20;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let mut answer =
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n").into_bytes();
                    answer.extend_from_slice(&bytes(SIZE));
                    let _ = s.write_all(&answer).await;
                });
            }
        });
        let lo = "127.0.0.1".parse().expect("ip");
        let proxy = crate::EgressProxy::new(
            "allow:origin.test".parse().expect("policy"),
            Arc::new(crate::StaticResolver::new([(
                "origin.test".to_string(),
                vec![lo],
            )])),
            crate::Limits::default(),
            Arc::new(|_| {}),
        );
        for request in [
            format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
            format!("GET http://origin.test:{port}/ HTTP/1.1\r\n\r\n"),
        ] {
            let (mut c, served) = UnixStream::pair().expect("pair");
            tokio::spawn(proxy.clone().handle(served));
            let before = SPLICED.load(Ordering::Relaxed);
            c.write_all(request.as_bytes()).await.expect("write");
            let mut answer = Vec::new();
            if request.starts_with("CONNECT") {
                // The tunnel stays open until the sandbox ends its side: read its answer's
                // length, then end it.
                let want = "HTTP/1.1 200 Connection established\r\n\r\n".len()
                    + format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n").len()
                    + SIZE;
                answer.resize(want, 0);
                c.read_exact(&mut answer).await.expect("read");
                c.shutdown().await.expect("end");
            } else {
                c.read_to_end(&mut answer).await.expect("read");
            }
            assert!(
                answer.ends_with(&bytes(SIZE)),
                "{request}: the body came changed"
            );
            assert!(
                SPLICED.load(Ordering::Relaxed) - before >= SIZE as u64,
                "{request}: the answer went through user space"
            );
        }
    }
}
