//! A blocking test client for the guest agent.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sandcell_guest::{GuestConfig, GuestError, serve};
use sandcell_protocol::{
    Channel, ErrorCode, ExecExit, ExecRequest, Frame, FrameDecoder, GuestMessage, HostMessage,
    PROTOCOL_VERSION, WireError, encode_data, encode_message,
};
use tempfile::TempDir;

/// How long any single reply may take before the test fails instead of hanging.
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);

pub struct Agent {
    pub sock: UnixStream,
    decoder: FrameDecoder,
    backlog: VecDeque<Frame<GuestMessage>>,
    next_id: u32,
    done: mpsc::Receiver<Result<(), GuestError>>,
    pub dir: TempDir,
    /// The inode of the agent's end of the socket (`socket:[inode]` in /proc), when this
    /// client made the pair.
    pub guest_socket_inode: Option<u64>,
}

/// The result of one exec.
#[derive(Debug)]
pub struct ExecRun {
    pub pid: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// (channel, seq) of every chunk, in arrival order.
    pub chunks: Vec<(Channel, u64)>,
    pub exit: ExecExit,
}

impl ExecRun {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).to_string()
    }
}

/// What one attachment received, up to its exit.
#[derive(Debug)]
pub struct AttachRun {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// (channel, offset, bytes) of every `OutputLost`, in arrival order.
    pub lost: Vec<(Channel, u64, u64)>,
    /// Seq of every chunk, in arrival order.
    pub seqs: Vec<u64>,
    pub exit: ExecExit,
}

impl AttachRun {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).to_string()
    }
}

impl Agent {
    /// An agent with no handshake done yet.
    pub fn raw() -> Self {
        Self::raw_with(|_| {})
    }

    /// An agent with no handshake done yet, its config adjusted by `tweak`.
    pub fn raw_with(tweak: impl FnOnce(&mut GuestConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let roots: Vec<PathBuf> = ["workspace", "home", "tmp"]
            .iter()
            .map(|n| dir.path().join(n))
            .collect();
        for r in &roots {
            std::fs::create_dir(r).unwrap();
        }
        let mut config = GuestConfig {
            default_cwd: roots[0].clone(),
            file_roots: roots,
            pid1: false,
            ..GuestConfig::default()
        };
        tweak(&mut config);
        assert!(!config.pid1, "tests must never run the agent in pid1 mode");
        let (host, guest) = UnixStream::pair().unwrap();
        // Like the socket the agent inherits in a sandbox: not close-on-exec.
        rustix::io::fcntl_setfd(&guest, rustix::io::FdFlags::empty()).unwrap();
        let inode = rustix::fs::fstat(&guest).unwrap().st_ino;
        let (tx, done) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(serve(guest, config));
        });
        let mut agent = Self::connected(host, dir, done);
        agent.guest_socket_inode = Some(inode);
        agent
    }

    /// A client for an agent already serving the other end of `sock`; `done` reports when
    /// its `serve` returned.
    pub fn connected(
        sock: UnixStream,
        dir: TempDir,
        done: mpsc::Receiver<Result<(), GuestError>>,
    ) -> Self {
        sock.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        Self {
            sock,
            decoder: FrameDecoder::default(),
            backlog: VecDeque::new(),
            next_id: 1,
            done,
            dir,
            guest_socket_inode: None,
        }
    }

    /// An agent after a successful handshake.
    pub fn start() -> Self {
        let mut agent = Self::raw();
        agent.hello();
        agent
    }

    pub fn hello(&mut self) -> GuestMessage {
        let reply = self.call(HostMessage::Hello {
            protocol: PROTOCOL_VERSION,
            client: "test".into(),
        });
        assert!(
            matches!(reply, GuestMessage::HelloOk { .. }),
            "handshake failed: {reply:?}"
        );
        reply
    }

    pub fn workspace(&self) -> PathBuf {
        self.dir.path().join("workspace")
    }

    /// The absolute sandbox path of `rel` in the workspace.
    pub fn ws_path(&self, rel: &str) -> String {
        format!("{}/{rel}", self.workspace().display())
    }

    pub fn new_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub fn send(&mut self, id: u32, msg: &HostMessage) {
        self.sock.write_all(&encode_message(id, msg)).unwrap();
    }

    pub fn send_data(&mut self, id: u32, channel: Channel, seq: u64, bytes: &[u8]) {
        self.sock
            .write_all(&encode_data(id, channel, seq, bytes))
            .unwrap();
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).unwrap();
    }

    /// The next frame from the agent, whatever its id.
    fn read_frame(&mut self) -> Frame<GuestMessage> {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            if let Some(frame) = self.decoder.next_frame::<GuestMessage>() {
                return frame.expect("the agent sent a broken frame");
            }
            let n = match self.sock.read(&mut buf) {
                Ok(n) => n,
                // With SO_RCVTIMEO set, SIGCHLD (the agents' reapers) interrupts reads.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!("no reply from the agent in time: {e}"),
            };
            assert!(n > 0, "the agent closed the connection");
            self.decoder.feed(&buf[..n]);
        }
    }

    /// The next frame for request `id`; frames of other ids are kept for later.
    pub fn next_for(&mut self, id: u32) -> Frame<GuestMessage> {
        if let Some(i) = self.backlog.iter().position(|f| frame_id(f) == id) {
            return self.backlog.remove(i).unwrap();
        }
        loop {
            let frame = self.read_frame();
            if frame_id(&frame) == id {
                return frame;
            }
            self.backlog.push_back(frame);
        }
    }

    /// The next control message for `id` (data chunks are a test failure here).
    pub fn reply(&mut self, id: u32) -> GuestMessage {
        match self.next_for(id) {
            Frame::Message { msg, .. } => msg,
            Frame::Data { chunk, .. } => {
                panic!("expected a message, got a {:?} chunk", chunk.channel)
            }
        }
    }

    /// Sends a request on a fresh id and returns its (first) reply.
    pub fn call(&mut self, msg: HostMessage) -> GuestMessage {
        let id = self.new_id();
        self.send(id, &msg);
        self.reply(id)
    }

    /// Starts an exec; returns its id and pid.
    pub fn start_exec(&mut self, req: ExecRequest) -> (u32, i32) {
        let id = self.new_id();
        self.send(id, &HostMessage::Exec(req));
        match self.reply(id) {
            GuestMessage::ExecStarted { pid } => (id, pid),
            other => panic!("exec did not start: {other:?}"),
        }
    }

    /// Collects an exec's output until its exit.
    pub fn finish_exec(&mut self, id: u32, pid: i32) -> ExecRun {
        let mut run = ExecRun {
            pid,
            stdout: Vec::new(),
            stderr: Vec::new(),
            chunks: Vec::new(),
            exit: empty_exit(),
        };
        loop {
            match self.next_for(id) {
                Frame::Data { chunk, .. } => {
                    run.chunks.push((chunk.channel, chunk.seq));
                    match chunk.channel {
                        Channel::Stdout => run.stdout.extend_from_slice(&chunk.bytes),
                        Channel::Stderr => run.stderr.extend_from_slice(&chunk.bytes),
                        other => panic!("unexpected {other:?} chunk in an exec"),
                    }
                }
                Frame::Message {
                    msg: GuestMessage::ExecExited(exit),
                    ..
                } => {
                    run.exit = exit;
                    return run;
                }
                Frame::Message { msg, .. } => panic!("unexpected message in an exec: {msg:?}"),
            }
        }
    }

    /// Runs an exec to its end.
    pub fn exec(&mut self, req: ExecRequest) -> ExecRun {
        let (id, pid) = self.start_exec(req);
        self.finish_exec(id, pid)
    }

    /// Starts a background exec; returns its id and pid.
    pub fn spawn_bg(&mut self, mut req: ExecRequest) -> (u32, i32) {
        req.background = true;
        self.start_exec(req)
    }

    /// Attaches to `pid`; returns the attachment's id and its (stdout, stderr) start offsets.
    pub fn attach(&mut self, pid: i32, from: [Option<u64>; 2]) -> (u32, u64, u64) {
        let id = self.new_id();
        let msg = HostMessage::Attach {
            pid,
            stdout_from: from[0],
            stderr_from: from[1],
        };
        self.send(id, &msg);
        match self.reply(id) {
            GuestMessage::Attached {
                pid: p,
                stdout_offset,
                stderr_offset,
                ..
            } => {
                assert_eq!(p, pid, "attached to another pid");
                (id, stdout_offset, stderr_offset)
            }
            other => panic!("attach to {pid} failed: {other:?}"),
        }
    }

    /// Collects an attachment's output until its exit.
    pub fn follow(&mut self, id: u32) -> AttachRun {
        let mut run = AttachRun {
            stdout: Vec::new(),
            stderr: Vec::new(),
            lost: Vec::new(),
            seqs: Vec::new(),
            exit: empty_exit(),
        };
        loop {
            match self.next_for(id) {
                Frame::Data { chunk, .. } => {
                    run.seqs.push(chunk.seq);
                    match chunk.channel {
                        Channel::Stdout => run.stdout.extend_from_slice(&chunk.bytes),
                        Channel::Stderr => run.stderr.extend_from_slice(&chunk.bytes),
                        other => panic!("unexpected {other:?} chunk in an attachment"),
                    }
                }
                Frame::Message {
                    msg:
                        GuestMessage::OutputLost {
                            channel,
                            offset,
                            bytes,
                        },
                    ..
                } => run.lost.push((channel, offset, bytes)),
                Frame::Message {
                    msg: GuestMessage::ExecExited(exit),
                    ..
                } => {
                    run.exit = exit;
                    return run;
                }
                Frame::Message { msg, .. } => {
                    panic!("unexpected message in an attachment: {msg:?}")
                }
            }
        }
    }

    /// Attaches to `pid` from its oldest buffered bytes and follows it to its exit.
    pub fn attach_and_follow(&mut self, pid: i32) -> AttachRun {
        let (id, _, _) = self.attach(pid, [None, None]);
        self.follow(id)
    }

    /// Frames of request `id` received but not consumed yet (reads what has arrived first).
    pub fn pending_for(&mut self, id: u32, wait: Duration) -> usize {
        std::thread::sleep(wait);
        // A ping's answer comes after everything queued before it.
        let ping = self.new_id();
        self.send(ping, &HostMessage::Ping);
        assert_eq!(self.reply(ping), GuestMessage::Pong);
        self.backlog.iter().filter(|f| frame_id(f) == id).count()
    }

    /// Frames received but not consumed yet, plus undecoded bytes.
    pub fn stray(&self) -> usize {
        self.backlog.len() + self.decoder.buffered()
    }

    /// Closes the host side and waits for `serve` to return.
    pub fn close_and_wait(self, limit: Duration) -> Result<(), GuestError> {
        let Self { sock, done, .. } = self;
        drop(sock);
        done.recv_timeout(limit)
            .expect("serve did not return after the host closed the socket")
    }

    /// Waits for `serve` to return (after a Shutdown).
    pub fn wait_done(&self, limit: Duration) -> Result<(), GuestError> {
        self.done
            .recv_timeout(limit)
            .expect("serve did not return in time")
    }
}

fn empty_exit() -> ExecExit {
    ExecExit {
        exit_code: None,
        signal: None,
        core_dumped: false,
        timed_out: false,
        killed: false,
        stdout_bytes: 0,
        stderr_bytes: 0,
        stdout_truncated: false,
        stderr_truncated: false,
        duration_us: 0,
    }
}

fn frame_id(f: &Frame<GuestMessage>) -> u32 {
    match f {
        Frame::Message { id, .. } | Frame::Data { id, .. } => *id,
    }
}

/// The error inside a reply, or a test failure.
pub fn expect_error(msg: GuestMessage) -> WireError {
    match msg {
        GuestMessage::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Asserts an error of `code` and returns its message.
pub fn expect_code(msg: GuestMessage, code: ErrorCode) -> String {
    let e = expect_error(msg);
    assert_eq!(e.code, code, "wrong error code: {e:?}");
    e.message
}

/// Whether `pid` is a live (not zombie) process.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next())
                .unwrap_or("X");
            !matches!(state, "Z" | "X")
        }
        Err(_) => false,
    }
}

/// Waits until `pid` is no longer alive; false if it still is after `limit`.
pub fn wait_dead(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    !alive(pid)
}

/// The pids printed one per line.
pub fn pids_in(text: &str) -> Vec<i32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}
