//! Connections to a port on the sandbox's loopback, for the host (previews of a server
//! running inside): the host's bytes are written to the connection, the server's come back
//! as `Stdout` chunks within the window the host grants (a slow browser never makes the host
//! buffer a whole download).
//!
//! Every open connection is in the agent's [`PortTable`], which the agent's switch
//! ([`crate::EgressSwitch`]) empties before a gVisor checkpoint: the agent's side of a
//! connection is a TCP socket in its readiness loop's epoll set, which this runsc cannot
//! save ("endpoint still has waiters upon save"; a failed save ends the sandbox). Each is
//! closed (the host sees its end, a browser's WebSocket closes), and new ones are refused
//! until the switch opens again (docs/gvisor.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sandcell_protocol::{Channel, ErrorCode, GuestMessage, WireError, encode_data};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use crate::egress::{Command, EgressSwitch};
use crate::poller::PolledFd;
use crate::shared::Shared;
use crate::sync::lock;

/// Bytes read from the server at a time.
const CHUNK: usize = 64 * 1024;

/// What the host sends a port connection.
#[derive(Debug)]
pub(crate) enum PortIn {
    /// Bytes for the server.
    Data(Vec<u8>),
    /// The host is done writing (the write half is shut down).
    Close,
}

/// One open port connection, as the dispatcher holds it.
#[derive(Debug)]
pub(crate) struct PortConn {
    to_server: mpsc::UnboundedSender<PortIn>,
    credit: Arc<Semaphore>,
}

impl PortConn {
    /// Queues bytes (or the end of them) for the server.
    pub fn send(&self, msg: PortIn) {
        let _ = self.to_server.send(msg);
    }

    /// Lets the server's side send `chunks` more.
    pub fn grant(&self, chunks: u32) {
        self.credit.add_permits(chunks as usize);
    }

    /// Ends both directions.
    pub fn abort(&self) {
        self.credit.close();
        let _ = self.to_server.send(PortIn::Close);
    }
}

/// The agent's open port connections (one table per agent, for all its host connections),
/// closed together when its switch closes.
#[derive(Debug)]
pub(crate) struct PortTable {
    /// Whether connections are refused now (read at each new one).
    switch: &'static EgressSwitch,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    conns: HashMap<u64, Live>,
}

/// What the table holds of one open connection.
#[derive(Debug)]
struct Live {
    /// Set to ask the connection's two tasks to end.
    stop: watch::Sender<bool>,
    /// Done (its sender dropped) once the connection's socket is closed.
    closed: oneshot::Receiver<()>,
}

/// A connection's socket, shared by its two tasks: closed, and out of the table, when both
/// have let it go.
#[derive(Debug)]
struct Held {
    // Dropped before `_closed` (fields drop in order): whoever waits on `closed` finds the
    // socket closed, out of the loop's epoll set.
    fd: PolledFd,
    _closed: oneshot::Sender<()>,
    table: Arc<PortTable>,
    key: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        lock(&self.table.open).conns.remove(&self.key);
    }
}

impl PortTable {
    /// A table whose connections `switch` closes and refuses; it serves the switch's commands
    /// on a task of the runtime it is called on, until that runtime ends.
    pub fn start(switch: &'static EgressSwitch) -> Arc<Self> {
        let table = Arc::new(Self {
            switch,
            open: Mutex::default(),
        });
        // Whether it starts closed is read from the switch at each connection.
        let (commands, _) = switch.attach();
        tokio::spawn(table.clone().serve(commands));
        table
    }

    /// Closes every connection when told to, answering once their sockets are closed.
    async fn serve(self: Arc<Self>, mut commands: mpsc::UnboundedReceiver<Command>) {
        while let Some(command) = commands.recv().await {
            match command {
                Command::Suspend(done) => {
                    self.close_all().await;
                    let _ = done.send(());
                }
                // New connections are let in by the switch's own state.
                Command::Resume(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Asks every open connection to end and waits until each socket is closed. The switch
    /// refuses new ones from before this is asked, so none is entered meanwhile.
    async fn close_all(&self) {
        let live: Vec<Live> = lock(&self.open).conns.drain().map(|(_, l)| l).collect();
        for l in &live {
            l.stop.send_replace(true);
        }
        for l in live {
            let _ = l.closed.await;
        }
    }

    /// Enters a connection's socket, unless the switch refuses connections now (the socket
    /// is then closed). Checked under the table's lock: a connection entered before the
    /// switch closed is in the table its closing empties.
    fn enter(self: &Arc<Self>, fd: PolledFd) -> Option<(Arc<Held>, watch::Receiver<bool>)> {
        let mut open = lock(&self.open);
        if self.switch.is_suspended() {
            drop(open);
            drop(fd);
            return None;
        }
        let key = open.next;
        open.next += 1;
        let (stop, stopped) = watch::channel(false);
        let (closed_tx, closed) = oneshot::channel();
        open.conns.insert(key, Live { stop, closed });
        let held = Held {
            fd,
            _closed: closed_tx,
            table: self.clone(),
            key,
        };
        Some((Arc::new(held), stopped))
    }
}

/// The refusal of a connection while the switch is closed (the sandbox is being
/// checkpointed): the host may try again once the snapshot is done.
fn refused(port: u16) -> WireError {
    WireError::new(
        ErrorCode::Unavailable,
        format!(
            "the sandbox is being snapshotted: port {port} cannot be connected to until the \
             snapshot is done; try again"
        ),
    )
}

/// Waits until the table asks the connection to end (never, should the table's side be
/// gone: that happens only once the connection's socket is closed).
async fn stop_asked(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|asked| *asked).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// How the server-to-host side of a connection ended.
enum Ended {
    /// The server ended it, or reading failed: the host is told how many bytes came.
    Done,
    /// The host aborted it: it wants nothing more.
    Aborted,
    /// Closed for a checkpoint.
    Closed,
}

/// Connects to `port` and answers `Ok` on `id`, or the error (`InvalidState` while
/// `table`'s switch refuses connections); the connection then runs on its own tasks until
/// either side ends it or the switch closes it.
pub(crate) async fn open(
    shared: &Arc<Shared>,
    table: &Arc<PortTable>,
    id: u32,
    port: u16,
    window: u32,
) -> Result<PortConn, WireError> {
    if table.switch.is_suspended() {
        return Err(refused(port));
    }
    // A blocking connect on a worker thread (loopback answers at once), then the agent's
    // own readiness loop: the connection comes and goes while the sandbox may be
    // checkpointed (see the poller module).
    let connected = tokio::task::spawn_blocking(move || {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
        let _ = stream.set_nodelay(true);
        Ok(std::os::fd::OwnedFd::from(stream))
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
    .and_then(PolledFd::new);
    let stream = connected.map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::ConnectionRefused {
            ErrorCode::NotFound
        } else {
            ErrorCode::Io
        };
        WireError::new(
            code,
            format!("nothing answers on port {port} inside the sandbox ({e})"),
        )
    })?;
    // Nothing awaited between watching the socket and entering it: the switch's closing
    // (on this thread) finds it in the table or has it refused here.
    let (from_server, stopped) = table.enter(stream).ok_or_else(|| refused(port))?;
    shared.out.msg(id, &GuestMessage::Ok).await;
    let to_server = from_server.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<PortIn>();
    let credit = Arc::new(Semaphore::new(window.max(1) as usize));
    let mut stop = stopped.clone();
    tokio::spawn(async move {
        let relay = async {
            while let Some(msg) = rx.recv().await {
                match msg {
                    PortIn::Data(bytes) => {
                        if to_server.fd.write_all(&bytes).await.is_err() {
                            break;
                        }
                    }
                    PortIn::Close => {
                        let _ = rustix::net::shutdown(&to_server.fd, rustix::net::Shutdown::Write);
                        break;
                    }
                }
            }
        };
        tokio::select! {
            () = relay => {}
            () = stop_asked(&mut stop) => {}
        }
    });
    let out = shared.clone();
    let window = credit.clone();
    let mut stop = stopped;
    tokio::spawn(async move {
        let mut total = 0u64;
        let ended = tokio::select! {
            ended = pump(&out, id, &from_server.fd, &window, &mut total) => ended,
            () = stop_asked(&mut stop) => Ended::Closed,
        };
        // The socket is let go first: a closing switch waits for it, not for the host.
        drop(from_server);
        match ended {
            Ended::Done => {
                out.out
                    .msg(id, &GuestMessage::ReadDone { size: total })
                    .await;
            }
            Ended::Aborted => {}
            Ended::Closed => {
                let why = format!(
                    "the connection to port {port} was closed for a snapshot of the sandbox \
                     (a checkpoint cannot hold it); connect again"
                );
                out.out
                    .error(id, WireError::new(ErrorCode::InvalidState, why))
                    .await;
            }
        }
    });
    Ok(PortConn {
        to_server: tx,
        credit,
    })
}

/// Sends what the server writes to the host as `Stdout` chunks, each within the host's
/// window, until the server ends or the host aborts; `total` counts the bytes sent.
async fn pump(
    shared: &Shared,
    id: u32,
    from: &PolledFd,
    window: &Semaphore,
    total: &mut u64,
) -> Ended {
    let mut seq = 0u64;
    let mut buf = vec![0u8; CHUNK];
    loop {
        // Closed by an abort: the host wants nothing more.
        let Ok(permit) = window.acquire().await else {
            return Ended::Aborted;
        };
        permit.forget();
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return Ended::Done,
            Ok(n) => {
                shared
                    .out
                    .frame(encode_data(id, Channel::Stdout, seq, &buf[..n]))
                    .await;
                seq += 1;
                *total += n as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use sandcell_protocol::{
        Frame, FrameDecoder, HostMessage, PROTOCOL_VERSION, encode_data, encode_message,
    };

    use super::*;
    use crate::GuestConfig;

    /// A server on loopback that answers each read with `echo: <what it read>` and reports
    /// on `ends` each connection whose other side was closed (a read of 0 bytes).
    fn echo_server() -> (u16, std::sync::mpsc::Receiver<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (tx, ends) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    loop {
                        match conn.read(&mut buf) {
                            Ok(0) => {
                                let _ = tx.send(());
                                return;
                            }
                            Ok(n) => {
                                let mut back = b"echo: ".to_vec();
                                back.extend_from_slice(&buf[..n]);
                                if conn.write_all(&back).is_err() {
                                    return;
                                }
                            }
                            Err(_) => return,
                        }
                    }
                });
            }
        });
        (port, ends)
    }

    /// The host's side of an agent served on a thread, driven with blocking calls.
    struct Host {
        sock: UnixStream,
        decoder: FrameDecoder,
        /// Frames that came while another id's were awaited.
        backlog: Vec<Frame<GuestMessage>>,
        _dir: tempfile::TempDir,
    }

    impl Host {
        /// An agent (greeted) whose switch is `switch`, with no egress.
        fn start(switch: &'static EgressSwitch) -> Self {
            let dir = tempfile::tempdir().expect("dir");
            let roots: Vec<std::path::PathBuf> = ["workspace", "home", "tmp"]
                .iter()
                .map(|n| dir.path().join(n))
                .collect();
            for r in &roots {
                std::fs::create_dir(r).expect("root");
            }
            let config = GuestConfig {
                default_cwd: roots[0].clone(),
                file_roots: roots,
                pid1: false,
                switch,
                ..GuestConfig::default()
            };
            let (sock, agent) = UnixStream::pair().expect("pair");
            std::thread::spawn(move || crate::serve(agent, config));
            sock.set_read_timeout(Some(Duration::from_secs(20)))
                .expect("timeout");
            let mut host = Self {
                sock,
                decoder: FrameDecoder::default(),
                backlog: Vec::new(),
                _dir: dir,
            };
            host.send(
                1,
                &HostMessage::Hello {
                    protocol: PROTOCOL_VERSION,
                    client: "test".into(),
                },
            );
            assert!(matches!(
                host.next(1),
                Frame::Message {
                    msg: GuestMessage::HelloOk { .. },
                    ..
                }
            ));
            host
        }

        fn send(&mut self, id: u32, msg: &HostMessage) {
            self.sock.write_all(&encode_message(id, msg)).expect("send");
        }

        /// The next frame for `id` (others are kept for later).
        fn next(&mut self, id: u32) -> Frame<GuestMessage> {
            let of = |frame: &Frame<GuestMessage>| match frame {
                Frame::Message { id, .. } | Frame::Data { id, .. } => *id,
            };
            if let Some(i) = self.backlog.iter().position(|f| of(f) == id) {
                return self.backlog.remove(i);
            }
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                while let Some(frame) = self.decoder.next_frame::<GuestMessage>() {
                    let frame = frame.expect("frame");
                    if of(&frame) == id {
                        return frame;
                    }
                    self.backlog.push(frame);
                }
                let n = loop {
                    match self.sock.read(&mut buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        other => break other.expect("an answer in time"),
                    }
                };
                assert!(n > 0, "the agent ended");
                self.decoder.feed(&buf[..n]);
            }
        }

        /// The next control message for `id`.
        fn message(&mut self, id: u32) -> GuestMessage {
            loop {
                if let Frame::Message { msg, .. } = self.next(id) {
                    return msg;
                }
            }
        }

        /// Connects to `port` under `id`: `Ok` or the agent's error.
        fn connect(&mut self, id: u32, port: u16) -> Result<(), WireError> {
            self.send(id, &HostMessage::ConnectPort { port, window: 16 });
            match self.message(id) {
                GuestMessage::Ok => Ok(()),
                GuestMessage::Error(e) => Err(e),
                other => panic!("unexpected answer {other:?}"),
            }
        }

        /// Writes `text` on connection `id` and returns what the server sent back.
        fn ask(&mut self, id: u32, seq: u64, text: &str) -> String {
            self.sock
                .write_all(&encode_data(id, Channel::Stdin, seq, text.as_bytes()))
                .expect("send");
            match self.next(id) {
                Frame::Data { chunk, .. } => String::from_utf8_lossy(&chunk.bytes).to_string(),
                Frame::Message { msg, .. } => panic!("no answer but {msg:?}"),
            }
        }
    }

    /// Runs the blocking `f` on a thread of its own, as the gVisor agent's control thread.
    fn control<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().expect("control thread")
    }

    #[test]
    fn a_suspend_closes_open_connections_and_refuses_new_ones_until_resumed() {
        let switch: &'static EgressSwitch = Box::leak(Box::new(EgressSwitch::new()));
        let (port, ends) = echo_server();
        let mut host = Host::start(switch);
        host.connect(2, port).expect("connected");
        assert_eq!(host.ask(2, 0, "hi"), "echo: hi");
        host.connect(3, port).expect("connected");
        assert_eq!(host.ask(3, 0, "there"), "echo: there");

        control(move || switch.suspend(Duration::from_secs(5))).expect("suspended");
        // Answered only once the agent's sockets are closed: the server has seen both end
        // (no descriptor of theirs is left open, nor in the loop's epoll set).
        for _ in 0..2 {
            ends.recv_timeout(Duration::from_secs(1))
                .expect("the server saw the connection end by the time suspend answered");
        }
        // The host is told each connection ended, and why.
        for id in [2, 3] {
            match host.message(id) {
                GuestMessage::Error(e) => {
                    assert_eq!(e.code, ErrorCode::InvalidState, "{e:?}");
                    assert!(e.message.contains("snapshot"), "{e:?}");
                }
                other => panic!("connection {id} ended with {other:?}"),
            }
        }
        // Refused while suspended, saying why.
        let e = host.connect(4, port).expect_err("refused while suspended");
        assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
        assert!(e.message.contains("snapshot"), "{e:?}");
        // Nothing open: closing again answers at once.
        control(move || switch.suspend(Duration::from_secs(5))).expect("suspended again");

        control(move || switch.resume(Duration::from_secs(5))).expect("resumed");
        host.connect(5, port).expect("connected after resume");
        assert_eq!(host.ask(5, 0, "again"), "echo: again");
        // The host's end still reaches the server, whose end comes back as usual.
        host.send(5, &HostMessage::StdinClose);
        ends.recv_timeout(Duration::from_secs(5))
            .expect("the server saw the host's end");
        assert!(matches!(host.message(5), GuestMessage::ReadDone { .. }));
        // Connection 2's id taken by a new request: the closed connection's entry goes.
        host.connect(2, port).expect("the id is free again");
        assert_eq!(host.ask(2, 0, "reused"), "echo: reused");
    }

    #[test]
    fn connections_are_closed_at_every_suspend_not_only_the_first() {
        let switch: &'static EgressSwitch = Box::leak(Box::new(EgressSwitch::new()));
        let (port, ends) = echo_server();
        let mut host = Host::start(switch);
        for round in 0..3u32 {
            let id = 10 + round;
            host.connect(id, port).expect("connected");
            assert_eq!(host.ask(id, 0, "x"), "echo: x");
            control(move || switch.suspend(Duration::from_secs(5))).expect("suspended");
            ends.recv_timeout(Duration::from_secs(1))
                .expect("closed by the time suspend answered");
            assert!(matches!(host.message(id), GuestMessage::Error(_)));
            control(move || switch.resume(Duration::from_secs(5))).expect("resumed");
        }
    }

    #[tokio::test]
    async fn closing_waits_until_each_socket_is_closed_and_refuses_meanwhile() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let switch: &'static EgressSwitch = Box::leak(Box::new(EgressSwitch::new()));
        let table = PortTable::start(switch);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let ours = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (mut theirs, _) = listener.accept().expect("accept");
        let fd = PolledFd::new(std::os::fd::OwnedFd::from(ours)).expect("watch");
        let (held, mut stopped) = table.enter(fd).expect("entered");
        // A connection slow to let its socket go once asked.
        let let_go = Arc::new(AtomicBool::new(false));
        let flag = let_go.clone();
        tokio::spawn(async move {
            stop_asked(&mut stopped).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            flag.store(true, Ordering::SeqCst);
            drop(held);
        });
        tokio::task::spawn_blocking(move || switch.suspend(Duration::from_secs(5)))
            .await
            .expect("thread")
            .expect("suspended");
        assert!(
            let_go.load(Ordering::SeqCst),
            "answered before the socket was closed"
        );
        theirs
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(theirs.read(&mut [0u8; 8]).expect("the end"), 0);
        assert!(lock(&table.open).conns.is_empty());
        // Entered while closed: refused, the socket closed at once.
        let ours = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (mut theirs, _) = listener.accept().expect("accept");
        let fd = PolledFd::new(std::os::fd::OwnedFd::from(ours)).expect("watch");
        assert!(table.enter(fd).is_none());
        theirs
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(theirs.read(&mut [0u8; 8]).expect("the end"), 0);
        tokio::task::spawn_blocking(move || switch.resume(Duration::from_secs(5)))
            .await
            .expect("thread")
            .expect("resumed");
        let ours = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let fd = PolledFd::new(std::os::fd::OwnedFd::from(ours)).expect("watch");
        let entered = table.enter(fd).expect("entered after resume");
        assert_eq!(lock(&table.open).conns.len(), 1);
        // Let go on its own (the connection ended): out of the table.
        drop(entered);
        assert!(lock(&table.open).conns.is_empty());
    }
}
