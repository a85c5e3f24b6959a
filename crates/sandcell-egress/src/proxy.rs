//! One sandbox's proxy: accepts a connection, tells HTTP from SOCKS5 by its first byte,
//! decides, connects, relays and records.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use sandcell_api::network::{NetworkPolicy, normalize_host};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::ca::Interception;
use crate::decide::{Denied, decide};
use crate::handover::{self, Opening};
use crate::meter::{BYTE_LIMIT, Meter};
use crate::resolve::Resolver;
use crate::secrets::Secrets;
use crate::splice::{self, End, Shared, Socket};
use crate::tls::{Hello, MAX_RECORD, client_hello};

/// How a connection asked to go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// An HTTP `CONNECT` tunnel.
    Connect,
    /// A plain-HTTP request in absolute form (one per connection).
    Http,
    /// A SOCKS5 `CONNECT`.
    Socks5,
}

impl Protocol {
    /// Its name in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Http => "http",
            Self::Socks5 => "socks5",
        }
    }
}

/// What the proxy decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It connected (the event comes when the connection ends, with its bytes).
    Allowed,
    /// It refused, or cut the connection (the reason says why).
    Denied,
}

/// One connection (or one plain-HTTP request), as the audit log and the API show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressEvent {
    /// How it asked.
    pub protocol: Protocol,
    /// The host it asked for (as given, lower case).
    pub host: String,
    /// The port.
    pub port: u16,
    /// Allowed or denied.
    pub outcome: Outcome,
    /// Why it was denied or cut.
    pub reason: Option<String>,
    /// The address it connected to.
    pub address: Option<SocketAddr>,
    /// The name its TLS ClientHello asked for.
    pub sni: Option<String>,
    /// Bytes from the sandbox.
    pub bytes_up: u64,
    /// Bytes to the sandbox.
    pub bytes_down: u64,
    /// How long it lasted.
    pub duration_ms: u64,
    /// The proxy read the tunnel's requests (terminating its TLS, if it carried TLS) rather
    /// than relaying its bytes: what it does when the sandbox has secrets.
    pub intercepted: bool,
    /// The secrets whose values the proxy put in this connection's requests, by name (never
    /// their values), sorted.
    pub secrets: Vec<String>,
}

/// What one sandbox's egress may use.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: u32,
    /// Bytes in both directions over the proxy's life (`None`: no limit).
    pub max_bytes: Option<u64>,
    /// To connect to an upstream address.
    pub connect_timeout: Duration,
    /// To read a request's head (or a SOCKS greeting, or a TLS ClientHello).
    pub head_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_bytes: None,
            connect_timeout: Duration::from_secs(10),
            head_timeout: Duration::from_secs(30),
        }
    }
}

/// Where events go.
pub type EventSink = Arc<dyn Fn(EgressEvent) + Send + Sync>;

/// The egress proxy of one sandbox.
pub struct EgressProxy {
    policy: RwLock<Arc<NetworkPolicy>>,
    resolver: Arc<dyn Resolver>,
    limits: Limits,
    open: AtomicU32,
    bytes: Arc<AtomicU64>,
    sink: EventSink,
    secrets: RwLock<Secrets>,
    interception: RwLock<Option<Interception>>,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("policy", &self.policy())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A connection slot, given back when dropped.
struct Slot<'a>(&'a AtomicU32);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection's first bytes, read as they are needed.
pub(crate) struct Inbound<S> {
    pub stream: S,
    pub buf: Vec<u8>,
}

impl<S: AsyncRead + Unpin> Inbound<S> {
    /// Reads until `buf` holds `n` bytes; `false` at the end of the stream.
    pub async fn fill(&mut self, n: usize) -> io::Result<bool> {
        let mut chunk = [0u8; 4096];
        while self.buf.len() < n {
            let got = self.stream.read(&mut chunk).await?;
            if got == 0 {
                return Ok(false);
            }
            self.buf.extend_from_slice(&chunk[..got]);
        }
        Ok(true)
    }

    /// Reads one more chunk; `false` at the end of the stream.
    pub async fn more(&mut self) -> io::Result<bool> {
        let n = self.buf.len() + 1;
        self.fill(n).await
    }
}

/// A decision that is about to be made, with what the event needs.
pub(crate) struct Asked {
    pub protocol: Protocol,
    pub host: String,
    pub port: u16,
    pub started: Instant,
}

impl EgressProxy {
    /// A proxy for one sandbox.
    pub fn new(
        policy: NetworkPolicy,
        resolver: Arc<dyn Resolver>,
        limits: Limits,
        sink: EventSink,
    ) -> Arc<Self> {
        Arc::new(Self {
            policy: RwLock::new(Arc::new(policy)),
            resolver,
            limits,
            open: AtomicU32::new(0),
            bytes: Arc::new(AtomicU64::new(0)),
            sink,
            secrets: RwLock::new(Secrets::default()),
            interception: RwLock::new(None),
        })
    }

    /// Changes the sandbox's secrets: the next request is checked against them. While there
    /// are any (and [`EgressProxy::set_interception`] gave the proxy a CA), `CONNECT`
    /// tunnels are read rather than relayed, so a placeholder is replaced for its hosts and
    /// refused on its way to any other; plain-HTTP requests are checked either way.
    pub fn set_secrets(&self, secrets: Secrets) {
        *self.secrets.write().unwrap_or_else(PoisonError::into_inner) = secrets;
    }

    /// The secrets now.
    pub fn secrets(&self) -> Secrets {
        self.secrets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Gives the proxy what it terminates TLS with (`None`: it terminates none, and tunnels
    /// stay blind whatever the secrets).
    pub fn set_interception(&self, interception: Option<Interception>) {
        *self
            .interception
            .write()
            .unwrap_or_else(PoisonError::into_inner) = interception;
    }

    /// What it terminates TLS with, if anything.
    pub fn interception(&self) -> Option<Interception> {
        self.interception
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records an event.
    pub(crate) fn emit(&self, event: EgressEvent) {
        (self.sink)(event);
    }

    /// The count of bytes carried, both directions, that [`Metered`] streams add to.
    pub(crate) fn byte_counter(&self) -> Arc<AtomicU64> {
        self.bytes.clone()
    }

    /// The policy now.
    pub fn policy(&self) -> Arc<NetworkPolicy> {
        self.policy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Changes the policy: the next connection (and the next plain-HTTP request) is
    /// decided under it; open tunnels stay.
    pub fn set_policy(&self, policy: NetworkPolicy) {
        *self.policy.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(policy);
    }

    /// Its limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Sends one plain-HTTP request (`head`, then its `body` read from `reader`) upstream
    /// and relays the answer to the sandbox until the server closes; records it.
    pub(crate) async fn relay_one<R, W>(
        &self,
        asked: Asked,
        mut reader: R,
        mut client_write: W,
        upstream: TcpStream,
        head: &[u8],
        body: crate::http::Body,
    ) -> io::Result<()>
    where
        R: tokio::io::AsyncBufRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let address = upstream.peer_addr().ok();
        // The sandbox's secrets: their values in place of their placeholders, or a refusal.
        let secrets = self.secrets();
        let (head, used) = if secrets.is_empty() {
            (head.to_vec(), Vec::new())
        } else {
            match crate::intercept::rewrite_plain(&secrets, head, &asked.host, asked.port) {
                Ok(rewritten) => rewritten,
                Err(reason) => {
                    self.denied(&asked, reason.clone(), address);
                    crate::intercept::answer(&mut client_write, "403 Forbidden", &reason).await;
                    return Ok(());
                }
            }
        };
        let head = head.as_slice();
        let down_meter = self.meter();
        let (up_read, mut up_write) = upstream.into_split();
        let mut down_read = down_meter.wrap(up_read);
        let up = async {
            up_write.write_all(head).await?;
            let sent = match body {
                crate::http::Body::None => 0,
                crate::http::Body::Length(n) => {
                    let copied = tokio::io::copy(&mut (&mut reader).take(n), &mut up_write).await?;
                    if copied != n {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the request body is shorter than its Content-Length",
                        ));
                    }
                    copied
                }
                crate::http::Body::Chunked => {
                    crate::http::copy_chunked(&mut reader, &mut up_write).await?
                }
            };
            up_write.flush().await?;
            Ok::<u64, io::Error>(head.len() as u64 + sent)
        };
        // The answer, as it comes to its end: with `splice(2)` when the sandbox's
        // connection is a socket (nothing is read from it here, so `client_write`, its
        // unbuffered write half, holds nothing), through a buffer otherwise.
        let spliced = splice::claim::<W>();
        let down = async {
            if let Some(socket) = &spliced {
                let client = socket.end();
                let r =
                    splice::relay(End::from(down_read.inner.as_ref()), client, &down_meter).await;
                let _ = client.shutdown_write();
                return r;
            }
            let r = copy(&mut down_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
            r
        };
        let (up, down) = tokio::join!(up, down);
        let bytes_up = up.as_ref().map_or(0, |n| *n);
        self.bytes.fetch_add(bytes_up, Ordering::Relaxed);
        let ending = match (up, down) {
            (Err(e), _) | (Ok(_), Err(e)) => Some(Ending::from(e)),
            _ => None,
        };
        (self.sink)(EgressEvent {
            protocol: asked.protocol,
            host: asked.host,
            port: asked.port,
            outcome: if matches!(ending, Some(Ending::Cut(_))) {
                Outcome::Denied
            } else {
                Outcome::Allowed
            },
            reason: ending.map(Ending::into_reason),
            address,
            sni: None,
            bytes_up,
            bytes_down: down_meter.count.load(Ordering::Relaxed),
            duration_ms: millis(asked.started.elapsed()),
            intercepted: false,
            secrets: used,
        });
        Ok(())
    }

    /// Bytes carried so far, both directions.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open_connections(&self) -> u32 {
        self.open.load(Ordering::SeqCst)
    }

    /// Serves every connection of `listener` (the sandbox's bridge) until it fails: a
    /// relayed client, or a client's socket handed over ([`crate::handover`]).
    pub async fn serve_unix(self: Arc<Self>, listener: tokio::net::UnixListener) -> io::Result<()> {
        loop {
            let (stream, _) = listener.accept().await?;
            let me = self.clone();
            tokio::spawn(async move { me.handle_bridged(stream).await });
        }
    }

    /// Serves one connection from the sandbox's bridge.
    async fn handle_bridged(self: Arc<Self>, stream: tokio::net::UnixStream) {
        let opening =
            tokio::time::timeout(self.limits.head_timeout, handover::opening(&stream)).await;
        match opening {
            Ok(Ok(Opening::Byte(first))) => self.handle_opened(stream, vec![first]).await,
            Ok(Ok(Opening::Socket(fd))) => {
                drop(stream);
                match handover::client_socket(fd) {
                    Ok(client) => self.handle_opened(client, Vec::new()).await,
                    Err(why) => {
                        tracing::warn!(%why, "the sandbox's bridge handed over a socket the proxy does not serve");
                    }
                }
            }
            Ok(Ok(Opening::End)) | Ok(Err(_)) | Err(_) => {}
        }
    }

    /// Serves one connection to its end. A [`tokio::net::UnixStream`] (the sandbox's bridge)
    /// or a [`TcpStream`] has its tunnels and plain-HTTP answers relayed with `splice(2)`
    /// ([`crate::splice`]); any other stream through a buffer.
    pub async fn handle<S>(self: Arc<Self>, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.handle_opened(stream, Vec::new()).await;
    }

    /// [`EgressProxy::handle`] for a stream whose first bytes, `read`, were read already.
    async fn handle_opened<S>(self: Arc<Self>, stream: S, read: Vec<u8>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match Socket::from_stream(stream) {
            Ok(socket) => {
                let socket = Arc::new(socket);
                splice::serving(socket.clone(), self.serve(Shared(socket), read)).await;
            }
            Err(stream) => self.serve(stream, read).await,
        }
    }

    /// [`EgressProxy::handle_opened`] for any stream.
    async fn serve<S>(self: Arc<Self>, stream: S, read: Vec<u8>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let mut inbound = Inbound { stream, buf: read };
        match tokio::time::timeout(self.limits.head_timeout, inbound.fill(1)).await {
            Ok(Ok(true)) => {}
            _ => return,
        }
        let socks = inbound.buf[0] == 0x05;
        if self.open.fetch_add(1, Ordering::SeqCst) >= self.limits.max_connections {
            self.open.fetch_sub(1, Ordering::SeqCst);
            let message = format!(
                "the sandbox has {} egress connections open, its limit",
                self.limits.max_connections
            );
            if socks {
                crate::socks::refuse_early(inbound, &message).await;
            } else {
                crate::http::refuse_early(inbound, &message).await;
            }
            return;
        }
        let _slot = Slot(&self.open);
        let result = if socks {
            crate::socks::serve(&self, inbound).await
        } else {
            crate::http::serve(&self, inbound).await
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "an egress connection ended with an error");
        }
    }

    /// Decides on `asked` under the policy now; a refusal is recorded here.
    pub(crate) async fn decide(&self, asked: &Asked) -> Result<Vec<SocketAddr>, Denied> {
        let policy = self.policy();
        let decided = decide(&policy, self.resolver.as_ref(), &asked.host, asked.port).await;
        if let Err(denied) = &decided {
            self.denied(asked, denied.0.clone(), None);
        }
        decided
    }

    /// Records a refusal.
    pub(crate) fn denied(&self, asked: &Asked, reason: String, address: Option<SocketAddr>) {
        (self.sink)(EgressEvent {
            protocol: asked.protocol,
            host: asked.host.clone(),
            port: asked.port,
            outcome: Outcome::Denied,
            reason: Some(reason),
            address,
            sni: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: millis(asked.started.elapsed()),
            intercepted: false,
            secrets: Vec::new(),
        });
    }

    /// Connects to the first of `addrs` that answers in time.
    pub(crate) async fn connect(&self, addrs: &[SocketAddr]) -> io::Result<TcpStream> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address to connect to");
        for addr in addrs {
            match tokio::time::timeout(self.limits.connect_timeout, TcpStream::connect(addr)).await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Ok(Err(e)) => last = e,
                Err(_) => {
                    last = io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("{addr} did not answer in {:?}", self.limits.connect_timeout),
                    );
                }
            }
        }
        Err(last)
    }

    /// Serves a tunnel: a `CONNECT` one is read (its TLS terminated) when the sandbox has
    /// secrets and the proxy has a CA ([`crate::intercept`]); any other is relayed as it is
    /// ([`EgressProxy::relay_tunnel`]).
    pub(crate) async fn tunnel<S>(
        &self,
        asked: Asked,
        inbound: Inbound<S>,
        upstream: TcpStream,
        check_sni: bool,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if check_sni
            && asked.protocol == Protocol::Connect
            && !self.secrets().is_empty()
            && let Some(interception) = self.interception()
        {
            return crate::intercept::connect(self, interception, asked, inbound, upstream).await;
        }
        self.relay_tunnel(asked, inbound, upstream, check_sni).await
    }

    /// Relays a tunnel between the sandbox (`inbound`, its unread bytes first) and
    /// `upstream` to its end, and records it. When `check_sni`, the sandbox's first record
    /// is read before anything goes upstream: a TLS ClientHello naming another host than
    /// the one asked for cuts the tunnel. The bytes after it move with `splice(2)` when the
    /// connection is a socket ([`crate::splice`]), through a buffer otherwise.
    pub(crate) async fn relay_tunnel<S>(
        &self,
        asked: Asked,
        inbound: Inbound<S>,
        upstream: TcpStream,
        check_sni: bool,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if let Some(socket) = splice::claim::<S>() {
            return self
                .splice_tunnel(asked, inbound, &socket, upstream, check_sni)
                .await;
        }
        let address = upstream.peer_addr().ok();
        let up_meter = self.meter();
        let down_meter = self.meter();
        let (up_read, mut up_write) = upstream.into_split();
        let mut down_read = down_meter.wrap(up_read);
        let (client_read, mut client_write) = tokio::io::split(inbound.stream);
        let mut first = Inbound {
            stream: client_read,
            buf: inbound.buf,
        };
        // Upstream to the sandbox from the start (a server may speak first); the sandbox's
        // bytes go up only once its first record was checked.
        let down = async {
            let r = copy(&mut down_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
            r.map(drop)
        };
        let up = async {
            let sni = if check_sni {
                self.first_record(&mut first, &asked.host).await?
            } else {
                None
            };
            let pending = std::mem::take(&mut first.buf);
            up_meter.add(pending.len());
            if let Err(e) = up_write.write_all(&pending).await {
                return Err((sni, Ending::from(e)));
            }
            let mut up_read = up_meter.wrap(first.stream);
            let r = copy(&mut up_read, &mut up_write).await;
            let _ = up_write.shutdown().await;
            match r {
                Ok(_) => Ok(sni),
                Err(e) => Err((sni, Ending::from(e))),
            }
        };
        let ended = run_tunnel(up, down).await;
        self.tunnel_ended(&asked, address, ended, &up_meter, &down_meter);
        Ok(())
    }

    /// [`EgressProxy::relay_tunnel`] for a connection that is a socket: the first record is
    /// read through `inbound` (the [`Shared`] handle on `socket`, no buffer of its own), the
    /// rest moves with `splice(2)` between `socket` and `upstream`.
    async fn splice_tunnel<S>(
        &self,
        asked: Asked,
        inbound: Inbound<S>,
        socket: &Socket,
        upstream: TcpStream,
        check_sni: bool,
    ) -> io::Result<()>
    where
        S: AsyncRead + Unpin,
    {
        let address = upstream.peer_addr().ok();
        let up_meter = self.meter();
        let down_meter = self.meter();
        let client = socket.end();
        let server = End::from(&upstream);
        // Upstream to the sandbox from the start, as in the generic relay.
        let down = async {
            let r = splice::relay(server, client, &down_meter).await;
            let _ = client.shutdown_write();
            r.map(drop)
        };
        let up = async {
            let mut first = inbound;
            let sni = if check_sni {
                self.first_record(&mut first, &asked.host).await?
            } else {
                None
            };
            let pending = std::mem::take(&mut first.buf);
            drop(first);
            up_meter.add(pending.len());
            if let Err(e) = splice::write_all(server, &pending).await {
                return Err((sni, Ending::from(e)));
            }
            let r = splice::relay(client, server, &up_meter).await;
            let _ = server.shutdown_write();
            match r {
                Ok(_) => Ok(sni),
                Err(e) => Err((sni, Ending::from(e))),
            }
        };
        let ended = run_tunnel(up, down).await;
        self.tunnel_ended(&asked, address, ended, &up_meter, &down_meter);
        Ok(())
    }

    /// A meter for one direction of a connection: its own count, the sandbox's total and
    /// limit.
    fn meter(&self) -> Meter {
        Meter {
            count: Arc::new(AtomicU64::new(0)),
            total: self.bytes.clone(),
            limit: self.limits.max_bytes,
        }
    }

    /// Reads the sandbox's first record into `first.buf` until it is a whole TLS
    /// ClientHello (or plainly not one); the name it asks for, or the cut when that is not
    /// `wanted`.
    async fn first_record<R>(
        &self,
        first: &mut Inbound<R>,
        wanted: &str,
    ) -> Result<Option<String>, (Option<String>, Ending)>
    where
        R: AsyncRead + Unpin,
    {
        loop {
            match client_hello(&first.buf) {
                Hello::Incomplete(n) if n <= MAX_RECORD + 5 => {
                    let filled = tokio::time::timeout(self.limits.head_timeout, first.fill(n))
                        .await
                        .map_err(|_| {
                            (
                                None,
                                Ending::Io("the TLS ClientHello did not come in time".into()),
                            )
                        })?
                        .map_err(|e| (None, Ending::from(e)))?;
                    if !filled {
                        return Ok(None);
                    }
                }
                Hello::ClientHello(Some(name)) => {
                    let name = normalize_host(&name);
                    if name != wanted {
                        let why = format!(
                            "the TLS ClientHello names '{name}', not '{wanted}' the tunnel was opened to"
                        );
                        return Err((Some(name), Ending::Cut(why)));
                    }
                    return Ok(Some(name));
                }
                _ => return Ok(None),
            }
        }
    }

    /// Records a tunnel that `ended` so.
    fn tunnel_ended(
        &self,
        asked: &Asked,
        address: Option<SocketAddr>,
        ended: (Option<String>, Option<Ending>),
        up: &Meter,
        down: &Meter,
    ) {
        let (sni, ending) = ended;
        let denied = matches!(ending, Some(Ending::Cut(_)));
        (self.sink)(EgressEvent {
            protocol: asked.protocol,
            host: asked.host.clone(),
            port: asked.port,
            outcome: if denied {
                Outcome::Denied
            } else {
                Outcome::Allowed
            },
            reason: ending.map(Ending::into_reason),
            address,
            sni,
            bytes_up: up.count.load(Ordering::Relaxed),
            bytes_down: down.count.load(Ordering::Relaxed),
            duration_ms: millis(asked.started.elapsed()),
            intercepted: false,
            secrets: Vec::new(),
        });
    }
}

/// Runs a tunnel's two directions to their ends: `up` (the sandbox's bytes, after its first
/// record; the name its ClientHello gave) and `down`. One side failing (a cut, the byte
/// limit) ends both; one side ending well waits for the other (a half-close). The name and
/// how it ended, if not by both sides closing.
async fn run_tunnel<U, D>(up: U, down: D) -> (Option<String>, Option<Ending>)
where
    U: Future<Output = Result<Option<String>, (Option<String>, Ending)>>,
    D: Future<Output = io::Result<()>>,
{
    tokio::pin!(up, down);
    let (up_result, down_result) = tokio::select! {
        u = &mut up => {
            if u.is_err() { (u, Ok(())) } else { (u, down.await) }
        }
        d = &mut down => {
            if d.is_err() { (Ok(None), d) } else { (up.await, d) }
        }
    };
    match (up_result, down_result) {
        (Err((sni, ending)), _) => (sni, Some(ending)),
        (Ok(sni), Err(e)) => (sni, Some(Ending::from(e))),
        (Ok(sni), Ok(())) => (sni, None),
    }
}

/// How a tunnel ended other than both sides closing.
enum Ending {
    /// The proxy cut it (a ClientHello for another host, the byte limit).
    Cut(String),
    /// A side failed (a reset, a timeout).
    Io(String),
}

impl From<io::Error> for Ending {
    fn from(e: io::Error) -> Self {
        let text = e.to_string();
        if text.contains(BYTE_LIMIT) {
            Self::Cut(BYTE_LIMIT.to_string())
        } else {
            Self::Io(text)
        }
    }
}

impl Ending {
    fn into_reason(self) -> String {
        match self {
            Self::Cut(r) | Self::Io(r) => r,
        }
    }
}

/// Bytes moved at a time through a connection (tokio's own copy moves 8 KiB: a download
/// then costs several times the system calls).
pub(crate) const COPY_BUF: usize = 256 * 1024;

/// Copies `r` to `w` to its end through a [`COPY_BUF`] buffer.
async fn copy<R, W>(r: &mut R, w: &mut W) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut reader = tokio::io::BufReader::with_capacity(COPY_BUF, r);
    tokio::io::copy_buf(&mut reader, w).await
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
