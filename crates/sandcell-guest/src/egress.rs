//! The sandbox's end of its egress: `127.0.0.1:3128` (HTTP proxy) and `127.0.0.1:1080`
//! (SOCKS5) inside the sandbox's network namespace, each connection relayed to the host's
//! egress proxy through a Unix socket bound into the sandbox. The namespace keeps only `lo`:
//! nothing leaves but through the proxy, which decides (the `sandcell-egress` crate).
//!
//! The bridge can be closed and opened again ([`EgressSwitch`]), because the gVisor this
//! project runs on cannot checkpoint it open: `runsc checkpoint` panics on a TCP socket an
//! epoll instance watches ("endpoint still has waiters upon save") and on a connection to a
//! host Unix socket (its state encoder dereferences nil), and a failed save ends the
//! sandbox. The gVisor backend closes the bridge before each checkpoint and opens it again
//! in the restored sandbox (docs/gvisor.md). Its listeners and connections come and go
//! around checkpoints, so the agent's own readiness loop ([`crate::poller`]) watches them,
//! never tokio's reactor (a deleted interest brought back by a restore would be a stale
//! tokio token). The same switch closes the agent's preview connections ([`crate::ports`]),
//! TCP sockets in that loop's epoll set too.
//!
//! On the process backend the agent and the proxy share a kernel, so the bridge does not
//! relay at all: it hands each accepted socket to the proxy over the Unix socket
//! ([`EgressBridge::hand_over`]), and the proxy reads and writes the sandbox's TCP connection
//! itself (splicing it to the origin). Relaying cost two more copies of every byte through
//! user space and held a download to about a third of a direct connection's throughput
//! (docs/benchmarks.md, "Egress proxy"). gVisor's sockets live in its own network stack and
//! cannot be handed to the host; there the bridge relays.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{AddressFamily, Shutdown, SocketAddrUnix, SocketFlags, SocketType};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::poller::PolledFd;
use crate::sync::lock;

/// Bytes copied per read and write of a relayed connection: tokio's default 8 KiB costs a
/// download several times the system calls.
const COPY_SIZE: usize = 256 * 1024;

/// How long binding a port again is retried when it is taken (each try 20 ms apart).
const BIND_TRIES: u32 = 50;

/// How often a full backlog of the proxy's socket is tried again before the connection is
/// given up.
const CONNECT_TRIES: u32 = 50;

/// Where the bridge listens and where it relays to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressBridge {
    /// The host proxy's socket, as the sandbox sees it.
    pub socket: PathBuf,
    /// The loopback addresses to listen on (the HTTP and SOCKS5 proxy ports; the host
    /// proxy tells the two apart by the first byte).
    pub listen: Vec<SocketAddr>,
    /// Hand each accepted socket to the proxy ([`sandcell_protocol::EGRESS_HANDOVER`] with
    /// the socket attached) instead of relaying its bytes: only where the proxy shares the
    /// sandbox's kernel. A handover the socket refuses falls back to relaying.
    pub hand_over: bool,
}

impl EgressBridge {
    /// The usual ports, `127.0.0.1:3128` and `127.0.0.1:1080`, to `socket`.
    pub fn standard(socket: PathBuf) -> Self {
        Self {
            socket,
            listen: vec![
                SocketAddr::from(([127, 0, 0, 1], 3128)),
                SocketAddr::from(([127, 0, 0, 1], 1080)),
            ],
            hand_over: false,
        }
    }
}

/// The variables that send programs to the bridge, in both cases (curl reads only the
/// lower-case `http_proxy`, most others either). Raw TCP clients that speak SOCKS5 use
/// `ALL_PROXY`; Node's built-in `fetch` reads them only from Node 24, with
/// `NODE_USE_ENV_PROXY`.
pub(crate) fn proxy_env() -> Vec<(&'static str, &'static str)> {
    const HTTP: &str = sandcell_protocol::EGRESS_HTTP_PROXY;
    const SOCKS: &str = sandcell_protocol::EGRESS_SOCKS_PROXY;
    const LOCAL: &str = "localhost,127.0.0.1,::1";
    vec![
        ("HTTP_PROXY", HTTP),
        ("HTTPS_PROXY", HTTP),
        ("ALL_PROXY", SOCKS),
        ("NO_PROXY", LOCAL),
        ("http_proxy", HTTP),
        ("https_proxy", HTTP),
        ("all_proxy", SOCKS),
        ("no_proxy", LOCAL),
        ("NODE_USE_ENV_PROXY", "1"),
    ]
}

/// Why the switch could not close or open everything it drives.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// The egress bridge or the preview connections did not answer in time (their runtime
    /// is stuck).
    #[error("the agent's egress bridge and preview connections did not {what} within {limit:?}")]
    Timeout {
        /// `close` or `open`.
        what: &'static str,
        /// How long it was given.
        limit: Duration,
    },
}

/// What the switch asks of what it drives (a bridge, an agent's preview connections); the
/// sender is told when it is done.
#[derive(Debug)]
pub(crate) enum Command {
    /// Close the listeners and every connection.
    Suspend(std::sync::mpsc::SyncSender<()>),
    /// Listen (accept connections) again.
    Resume(std::sync::mpsc::SyncSender<()>),
}

/// Closes the TCP endpoints an agent's readiness loop watches (this runsc cannot checkpoint
/// them) and opens them again, from any thread that is not theirs (the gVisor agent's control
/// thread, around a checkpoint): the egress bridges, whose connections end and whose ports
/// stop listening, and the preview connections (`ConnectPort`), which end and are refused
/// until it opens again. A bridge started while they are closed starts closed.
#[derive(Debug, Default)]
pub struct EgressSwitch {
    state: Mutex<SwitchState>,
}

#[derive(Debug, Default)]
struct SwitchState {
    suspended: bool,
    /// The command queues of the bridges and of the agents' preview connections.
    members: Vec<mpsc::UnboundedSender<Command>>,
}

impl EgressSwitch {
    /// A switch no bridge listens to yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Closes every bridge's listeners and connections and every preview connection (each
    /// connection's client sees it end), and refuses new preview connections; returns when
    /// they are all closed. Blocking: call it off the agent's runtime.
    pub fn suspend(&self, limit: Duration) -> Result<(), SwitchError> {
        self.set(true, limit)
    }

    /// Opens every bridge's listeners again and lets preview connections be made; returns
    /// when the bridges listen. Blocking: call it off the agent's runtime.
    pub fn resume(&self, limit: Duration) -> Result<(), SwitchError> {
        self.set(false, limit)
    }

    /// Whether the bridges are closed now (or will start closed) and preview connections
    /// refused.
    pub fn is_suspended(&self) -> bool {
        lock(&self.state).suspended
    }

    fn set(&self, suspend: bool, limit: Duration) -> Result<(), SwitchError> {
        let deadline = Instant::now() + limit;
        let (done, answers) = std::sync::mpsc::sync_channel(16);
        let mut asked = 0usize;
        {
            let mut s = lock(&self.state);
            s.suspended = suspend;
            // A member whose runtime ended has nothing open.
            s.members.retain(|b| !b.is_closed());
            for member in &s.members {
                let command = if suspend {
                    Command::Suspend(done.clone())
                } else {
                    Command::Resume(done.clone())
                };
                if member.send(command).is_ok() {
                    asked += 1;
                }
            }
        }
        // Only the members hold senders now: when they are all gone, nothing is left to wait
        // for (a member dropped with its runtime closed everything it had).
        drop(done);
        for _ in 0..asked {
            let left = deadline.saturating_duration_since(Instant::now());
            match answers.recv_timeout(left) {
                Ok(()) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    return Err(SwitchError::Timeout {
                        what: if suspend { "close" } else { "open" },
                        limit,
                    });
                }
            }
        }
        Ok(())
    }

    /// A new member's command queue (a bridge's, an agent's preview connections'), and
    /// whether it starts closed.
    pub(crate) fn attach(&self) -> (mpsc::UnboundedReceiver<Command>, bool) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut s = lock(&self.state);
        // Every agent of a process attaches (tests run many): the ended ones go.
        s.members.retain(|m| !m.is_closed());
        s.members.push(tx);
        (rx, s.suspended)
    }
}

/// The switch of this process's agent (its bridge and preview connections), which its gVisor
/// entry point drives (one agent per process); the default of `GuestConfig::switch`.
pub fn egress_switch() -> &'static EgressSwitch {
    static SWITCH: OnceLock<EgressSwitch> = OnceLock::new();
    SWITCH.get_or_init(EgressSwitch::new)
}

/// Binds every address of `bridge` (unless `switch` has it closed) and relays their
/// connections until the agent ends, closing and opening as the switch says. A port that
/// cannot be bound is logged: egress then fails for the programs using it, and the rest of
/// the sandbox works.
pub(crate) async fn start(bridge: &EgressBridge, switch: &EgressSwitch) {
    let (commands, suspended) = switch.attach();
    let open = if suspended {
        None
    } else {
        Some(Open::bind(bridge).await)
    };
    tokio::spawn(serve(bridge.clone(), commands, open));
}

/// An open bridge: its accept loops and connections, all closed together.
struct Open {
    tasks: JoinSet<()>,
    accepted: mpsc::UnboundedReceiver<OwnedFd>,
}

impl Open {
    /// Binds every port of `bridge` and starts accepting on them.
    async fn bind(bridge: &EgressBridge) -> Self {
        let (tx, accepted) = mpsc::unbounded_channel();
        let mut tasks = JoinSet::new();
        for addr in &bridge.listen {
            match bind(*addr).await {
                Ok(listener) => {
                    tasks.spawn(accept_loop(listener, tx.clone()));
                }
                Err(e) => {
                    eprintln!("sandcell-guest: the egress bridge cannot listen on {addr}: {e}");
                }
            }
        }
        Self { tasks, accepted }
    }

    /// Closes the listeners and every connection; returns once their descriptors are
    /// closed (a task's descriptors close when it is dropped, which is before `join_next`
    /// reports it).
    async fn close(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        // Accepted, not yet relayed: closed with the receiver's queue.
        self.accepted.close();
        while self.accepted.try_recv().is_ok() {}
    }
}

/// Serves the bridge: relays what its listeners accept, closes and opens as told.
async fn serve(
    bridge: EgressBridge,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut open: Option<Open>,
) {
    loop {
        let Some(mut o) = open.take() else {
            // Closed: wait to be opened.
            match commands.recv().await {
                Some(Command::Suspend(done)) => {
                    let _ = done.send(());
                }
                Some(Command::Resume(done)) => {
                    open = Some(Open::bind(&bridge).await);
                    let _ = done.send(());
                }
                None => return,
            }
            continue;
        };
        let suspended = loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Suspend(done)) => break Some(done),
                    Some(Command::Resume(done)) => {
                        let _ = done.send(());
                    }
                    // Nobody can close it any more: it serves until the runtime ends.
                    None => break None,
                },
                Some(client) = o.accepted.recv() => {
                    o.tasks.spawn(serve_connection(client, bridge.socket.clone(), bridge.hand_over));
                }
                // Finished connections are collected (their results are nothing).
                Some(_) = o.tasks.join_next() => {}
            }
        };
        match suspended {
            Some(done) => {
                o.close().await;
                let _ = done.send(());
            }
            None => loop {
                tokio::select! {
                    Some(client) = o.accepted.recv() => {
                        o.tasks.spawn(serve_connection(client, bridge.socket.clone(), bridge.hand_over));
                    }
                    Some(_) = o.tasks.join_next() => {}
                    else => return,
                }
            },
        }
    }
}

/// A listening socket on `addr`, watched by the agent's loop. A port still held (a
/// connection of the closed bridge in its last state) is tried again for a moment.
async fn bind(addr: SocketAddr) -> io::Result<PolledFd> {
    let mut tries = 0;
    loop {
        // std sets SO_REUSEADDR and close-on-exec.
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => return PolledFd::new(OwnedFd::from(listener)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < BIND_TRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Hands every connection `listener` accepts to `accepted` until it is dropped.
async fn accept_loop(listener: PolledFd, accepted: mpsc::UnboundedSender<OwnedFd>) {
    loop {
        match listener.accept().await {
            Ok(client) => {
                if accepted.send(client).is_err() {
                    return;
                }
            }
            Err(e) => {
                // Out of descriptors, most likely: never spin on it.
                eprintln!("sandcell-guest: the egress bridge cannot accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A connection to the proxy's socket, made without blocking the runtime (a Unix socket
/// connects at once or finds the backlog full).
async fn connect_unix(path: &Path) -> io::Result<PolledFd> {
    let addr = SocketAddrUnix::new(path)?;
    let mut tries = 0;
    loop {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => return PolledFd::new(fd),
            Err(Errno::AGAIN) if tries < CONNECT_TRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Takes one accepted connection to the proxy's socket: hands the socket over when
/// `hand_over` says so and the socket takes it, else relays it until both sides are done.
/// The proxy gone (the sandbox's egress turned off) ends the connection at once.
async fn serve_connection(client: OwnedFd, socket: PathBuf, hand_over: bool) {
    let _ = rustix::net::sockopt::set_tcp_nodelay(&client, true);
    let Ok(upstream) = connect_unix(&socket).await else {
        return;
    };
    if hand_over {
        // One byte into an empty socket buffer is taken whole or not at all. Taken, the
        // proxy holds the connection and the agent's copies close here.
        match sandcell_jail::fdpass::send_with_fd(
            upstream.as_fd(),
            &[sandcell_protocol::EGRESS_HANDOVER],
            client.as_fd(),
        ) {
            Ok(1) => return,
            Ok(_) => {}
            Err(e) => {
                eprintln!(
                    "sandcell-guest: handing an egress connection over failed ({e}); relaying it"
                );
            }
        }
    }
    let Ok(client) = PolledFd::new(client) else {
        return;
    };
    let _ = relay(&client, &upstream).await;
}

/// Copies both ways between `a` and `b`, [`COPY_SIZE`] bytes at a time, until both ends
/// have ended (each end's end is passed on as a shutdown of the other's writing side) or
/// either fails.
async fn relay(a: &PolledFd, b: &PolledFd) -> io::Result<()> {
    async fn one_way(from: &PolledFd, to: &PolledFd) -> io::Result<()> {
        let mut buf = Vec::with_capacity(COPY_SIZE);
        loop {
            if from.read_into(&mut buf).await? == 0 {
                return Ok(rustix::net::shutdown(to, Shutdown::Write)?);
            }
            to.write_all(&buf).await?;
        }
    }
    tokio::try_join!(one_way(a, b), one_way(b, a)).map(|_| ())
}

/// Serves every connection of `listener` to `socket` as the agent's bridge does, handing
/// the sockets over with `hand_over` (public for the benchmark, which runs the bridge
/// without an agent).
pub async fn relay_listener(
    listener: tokio::net::TcpListener,
    socket: PathBuf,
    hand_over: bool,
) -> io::Result<()> {
    // Off tokio's reactor, onto the agent's loop, as in the agent.
    let listener = PolledFd::new(OwnedFd::from(listener.into_std()?))?;
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                connections.spawn(serve_connection(accepted?, socket.clone(), hand_over));
            }
            Some(_) = connections.join_next() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A proxy on a Unix socket in `dir` that answers `proxy saw: <first read>` and ends the
    /// connection, or with `hold`, keeps it open until the client ends it.
    fn fake_proxy(dir: &Path, hold: bool) -> PathBuf {
        let socket = dir.join("egress.sock");
        let proxy = tokio::net::UnixListener::bind(&socket).expect("bind");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = proxy.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    let n = s.read(&mut buf).await.expect("read");
                    s.write_all(b"proxy saw: ").await.expect("write");
                    s.write_all(&buf[..n]).await.expect("write");
                    if hold {
                        let _ = s.read(&mut buf).await;
                    }
                });
            }
        });
        socket
    }

    #[tokio::test]
    async fn a_connection_to_the_port_reaches_the_socket_and_back() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = fake_proxy(dir.path(), false);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(relay_listener(listener, socket, false));
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"CONNECT a:443").await.expect("write");
        let mut back = Vec::new();
        c.read_to_end(&mut back).await.expect("read");
        assert_eq!(back, b"proxy saw: CONNECT a:443");
    }

    #[tokio::test]
    async fn without_the_proxy_a_connection_ends_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(relay_listener(
            listener,
            PathBuf::from("/nonexistent/egress.sock"),
            true,
        ));
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut back = Vec::new();
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(5), c.read_to_end(&mut back))
                .await
                .expect("ended in time");
        assert!(read.is_ok() && back.is_empty());
    }

    #[tokio::test]
    async fn many_bytes_cross_both_ways_and_each_end_is_passed_on() {
        // An echoing proxy: what the client sends comes back whole, larger than one copy.
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("egress.sock");
        let proxy = tokio::net::UnixListener::bind(&socket).expect("bind");
        tokio::spawn(async move {
            let (s, _) = proxy.accept().await.expect("accept");
            let (mut r, mut w) = s.into_split();
            tokio::io::copy(&mut r, &mut w).await.expect("echo");
            w.shutdown().await.expect("end");
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(relay_listener(listener, socket, false));
        let c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut r, mut w) = c.into_split();
        let sent: Vec<u8> = (0..3 * COPY_SIZE + 17).map(|i| (i % 251) as u8).collect();
        let to_send = sent.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&to_send).await.expect("write");
            // The client's end reaches the proxy, whose end comes back.
            w.shutdown().await.expect("end");
        });
        let mut back = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), r.read_to_end(&mut back))
            .await
            .expect("in time")
            .expect("read");
        writer.await.expect("writer");
        assert_eq!(back.len(), sent.len());
        assert!(back == sent);
    }

    #[tokio::test]
    async fn a_handed_over_connection_is_the_clients_own_socket_in_the_proxys_hands() {
        // The proxy gets the handover byte with the client's socket attached, and nothing
        // else on its Unix connection; it answers on the socket, and the client hears it.
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("egress.sock");
        let proxy = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let held = std::thread::spawn(move || {
            let (s, _) = proxy.accept().expect("accept");
            let mut first = [0u8; 16];
            let (n, mut fds) =
                sandcell_jail::fdpass::recv_with_fds(s.as_fd(), &mut first).expect("recv");
            assert_eq!(&first[..n], &[sandcell_protocol::EGRESS_HANDOVER]);
            assert_eq!(fds.len(), 1, "one socket is attached");
            // The agent has let its end of the Unix connection go.
            let mut rest = Vec::new();
            std::io::Read::read_to_end(&mut &s, &mut rest).expect("read the rest");
            assert!(rest.is_empty());
            let mut client = std::net::TcpStream::from(fds.remove(0));
            client.set_nonblocking(false).expect("blocking");
            let mut asked = [0u8; 5];
            std::io::Read::read_exact(&mut client, &mut asked).expect("read");
            std::io::Write::write_all(&mut client, b"proxy holds: ").expect("write");
            std::io::Write::write_all(&mut client, &asked).expect("write");
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(relay_listener(listener, socket, true));
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"hello").await.expect("write");
        let mut back = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut back))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(back, b"proxy holds: hello");
        held.join().expect("proxy");
    }

    /// A loopback address with a free port (bound and let go).
    fn free_addr() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    }

    async fn ask(addr: SocketAddr) -> io::Result<Vec<u8>> {
        let mut c = tokio::net::TcpStream::connect(addr).await?;
        c.write_all(b"hi").await?;
        let mut back = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut back))
            .await
            .map_err(|_| io::Error::other("no answer"))??;
        back.truncate(n);
        Ok(back)
    }

    /// Runs `f` on a thread of its own (the switch blocks).
    async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        tokio::task::spawn_blocking(f).await.expect("thread")
    }

    #[tokio::test]
    async fn the_switch_closes_listeners_and_connections_and_opens_them_again() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = fake_proxy(dir.path(), true);
        let addr = free_addr();
        let bridge = EgressBridge {
            socket,
            listen: vec![addr],
            hand_over: false,
        };
        let switch: &'static EgressSwitch = Box::leak(Box::new(EgressSwitch::new()));
        start(&bridge, switch).await;
        assert_eq!(ask(addr).await.expect("open"), b"proxy saw: hi");
        // A connection held open by the proxy: closed with the bridge.
        let mut held = tokio::net::TcpStream::connect(addr).await.expect("connect");
        held.write_all(b"x").await.expect("write");
        let mut buf = [0u8; 64];
        let n = held.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"proxy saw: x");

        off_runtime(move || switch.suspend(Duration::from_secs(5)))
            .await
            .expect("suspended");
        assert!(switch.is_suspended());
        let ended = tokio::time::timeout(Duration::from_secs(5), held.read(&mut buf))
            .await
            .expect("the held connection ended");
        assert!(matches!(ended, Ok(0) | Err(_)), "{ended:?}");
        let refused = tokio::net::TcpStream::connect(addr).await;
        assert!(refused.is_err(), "the port still listens");
        // Asked twice, it answers twice.
        off_runtime(move || switch.suspend(Duration::from_secs(5)))
            .await
            .expect("suspended again");

        off_runtime(move || switch.resume(Duration::from_secs(5)))
            .await
            .expect("resumed");
        assert!(!switch.is_suspended());
        assert_eq!(ask(addr).await.expect("open again"), b"proxy saw: hi");
        // Again and again: nothing is left behind that would keep a port.
        for _ in 0..3 {
            off_runtime(move || switch.suspend(Duration::from_secs(5)))
                .await
                .expect("suspended");
            off_runtime(move || switch.resume(Duration::from_secs(5)))
                .await
                .expect("resumed");
            assert_eq!(ask(addr).await.expect("open"), b"proxy saw: hi");
        }
    }

    #[tokio::test]
    async fn a_bridge_started_while_closed_starts_closed() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = fake_proxy(dir.path(), false);
        let addr = free_addr();
        let switch: &'static EgressSwitch = Box::leak(Box::new(EgressSwitch::new()));
        off_runtime(move || switch.suspend(Duration::from_secs(5)))
            .await
            .expect("nothing to close");
        start(
            &EgressBridge {
                socket,
                listen: vec![addr],
                hand_over: false,
            },
            switch,
        )
        .await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
        off_runtime(move || switch.resume(Duration::from_secs(5)))
            .await
            .expect("resumed");
        assert_eq!(ask(addr).await.expect("open"), b"proxy saw: hi");
    }

    #[test]
    fn a_switch_with_no_runtime_answering_times_out_instead_of_hanging() {
        let switch = EgressSwitch::new();
        // A bridge whose runtime never serves its commands.
        let (_rx, _) = switch.attach();
        let err = switch
            .suspend(Duration::from_millis(50))
            .expect_err("no answer");
        assert!(err.to_string().contains("close"), "{err}");
        // One whose runtime is gone has nothing open.
        drop(_rx);
        switch
            .suspend(Duration::from_millis(50))
            .expect("nothing open");
    }
}
