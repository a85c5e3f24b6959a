//! The connection: reads frames, enforces the handshake and request ids, dispatches, and
//! sends every reply through the writer queue ([`crate::out`]); the state the handlers share
//! is [`crate::shared`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandcell_protocol::frame::MAX_CHUNK;
use sandcell_protocol::{
    Channel, ErrorCode, Frame, FrameDecoder, FrameError, GuestMessage, HostMessage, ProcessInfo,
    SUPPORTED_VERSIONS, WireError, encode_data, encode_message,
};
use tokio::io::AsyncReadExt;
use tokio::net::unix::OwnedReadHalf;
use tokio::signal::unix::{SignalKind, signal};

use crate::files::{WriteSession, read_chunk};
use crate::out::Out;
use crate::process::{self, Proc, StdinMsg};
use crate::procs::{self, Tree};
use crate::reads::Wait;
use crate::reaper::Reaper;
use crate::shared::Shared;
use crate::sync::lock;
use crate::{GuestConfig, GuestError, attach, exec, kernels};

/// Bytes read from the socket at a time.
const READ_BUF: usize = 256 * 1024;
/// How long to wait for the last replies to be written when the connection ends.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);
/// How long to wait for killed children to be collected at the end.
const REAP_LIMIT: Duration = Duration::from_secs(1);

/// The agent's listening socket as a tokio listener (a duplicate: the config keeps its own).
fn reattach_listener(
    l: &std::os::unix::net::UnixListener,
) -> Result<tokio::net::UnixListener, GuestError> {
    let l = l.try_clone().map_err(GuestError::Socket)?;
    l.set_nonblocking(true).map_err(GuestError::Socket)?;
    tokio::net::UnixListener::from_std(l).map_err(GuestError::Socket)
}

/// Serves the host's connection (and, with a listener, every later one) to the end and
/// cleans up.
pub(crate) async fn run(
    stream: std::os::unix::net::UnixStream,
    config: GuestConfig,
) -> Result<(), GuestError> {
    let stream = tokio::net::UnixStream::from_std(stream).map_err(GuestError::Socket)?;
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    // Reaping every child and killing everything at the end are only safe as the real PID 1.
    let pid1 = config.pid1 && me == 1;
    let sigchld = signal(SignalKind::child()).map_err(GuestError::Reaper)?;
    let reaper = Arc::new(Reaper::new(pid1));
    tokio::spawn(reaper.clone().run(sigchld));
    let (read, write) = stream.into_split();
    let out = Out::start(write);
    let shared = Arc::new(Shared::new(config, me, pid1, reaper, out));
    if let Some(bridge) = &shared.config.egress {
        crate::egress::start(bridge, shared.config.switch).await;
    }
    // Outlives host connections, like the connections to ports it holds.
    let port_table = crate::ports::PortTable::start(shared.config.switch);
    let listener = match &shared.config.listener {
        Some(l) => Some(reattach_listener(l)?),
        None => None,
    };
    let mut read = read;
    // A connection made by `Rehome` continues the greeted one.
    let mut greeted = false;
    let result = loop {
        let mut conn = Conn {
            shared: shared.clone(),
            hello: std::mem::take(&mut greeted),
            writes: HashMap::new(),
            stdin_writes: HashMap::new(),
            ports: HashMap::new(),
            port_table: port_table.clone(),
        };
        let result = conn.serve(read).await;
        // The same host, on a new connection: everything in progress goes on.
        if let Ok(End::Rehome(new)) = result {
            greeted = conn.hello;
            let stream = new
                .set_nonblocking(true)
                .and_then(|()| tokio::net::UnixStream::from_std(new));
            match stream {
                Ok(stream) => {
                    let (r, w) = stream.into_split();
                    shared.out.attach(w).await;
                    read = r;
                    continue;
                }
                Err(e) => break Err(GuestError::Socket(e)),
            }
        }
        // Abandon unfinished writes (their temporary files are removed on drop).
        conn.writes.clear();
        // Nobody will answer the host calls of running executions (a host that comes back
        // knows nothing of them): they fail now rather than wait for good.
        kernels::host_gone(&shared);
        let Some(listener) = &listener else {
            break result;
        };
        // The host went away without asking us to end: everything stays as it is until a
        // host connects again (a restarted daemon re-attaching).
        match result {
            Ok(End::Eof) | Err(GuestError::Read(_)) => {}
            other => break other,
        }
        // Its attachments followed output for a host that is gone; the next one attaches
        // again from the offsets it wants.
        for (_, task) in lock(&shared.tables).attachments.drain() {
            task.abort();
        }
        // Nobody will grant its reads more chunks.
        shared.reads.cancel_all();
        match listener.accept().await {
            Ok((stream, _)) => {
                let (r, w) = stream.into_split();
                shared.out.attach(w).await;
                read = r;
            }
            Err(e) => break Err(GuestError::Socket(e)),
        }
    };
    kernels::kill_all(&shared);
    let tree = shared.everything();
    let reaper = shared.reaper.clone();
    let kill_all = shared.pid1;
    let _ = shared
        .workers
        .kill(move || {
            tree.signal(libc::SIGKILL);
            if kill_all && std::process::id() == 1 {
                // Whatever else lives in our pid namespace goes too (kill(-1) spares the caller).
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(-1),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            reaper.reap_all_blocking(REAP_LIMIT);
        })
        .await;
    let result = match result {
        Ok(End::Shutdown(id)) => {
            shared.out.msg(id, &GuestMessage::Ok).await;
            Ok(())
        }
        Ok(End::Eof) => Ok(()),
        // Handled in the loop above; never the loop's result.
        Ok(End::Rehome(_)) => Ok(()),
        Err(e) => Err(e),
    };
    let _ = tokio::time::timeout(FLUSH_LIMIT, shared.out.flush()).await;
    result
}

/// Sets the UTS namespace's name, unless it is that already (a CRIU restore renamed it in
/// the image; only a gVisor agent keeps the capability to rename its sandbox).
fn set_hostname(name: &str) -> Result<(), WireError> {
    if name.is_empty() || name.len() > 64 {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("a hostname is 1 to 64 bytes, not {}", name.len()),
        ));
    }
    if rustix::system::uname().nodename().to_bytes() == name.as_bytes() {
        return Ok(());
    }
    rustix::system::sethostname(name.as_bytes()).map_err(|e| {
        WireError::new(
            ErrorCode::PermissionDenied,
            format!("set the hostname to {name:?}: {e}"),
        )
    })
}

enum End {
    Eof,
    Shutdown(u32),
    /// Go on over this connection (see `HostMessage::Rehome`).
    Rehome(std::os::unix::net::UnixStream),
}

enum WriteState {
    Active(WriteSession),
    /// Failed already (and replied): its remaining chunks and `EndOfData` are swallowed.
    Failed,
}

/// A `ProcessStdin` request in progress.
enum StdinWrite {
    Active(Arc<Proc>),
    /// Failed already (and replied): its remaining chunks and its end are swallowed.
    Failed,
}

struct Conn {
    shared: Arc<Shared>,
    hello: bool,
    writes: HashMap<u32, WriteState>,
    stdin_writes: HashMap<u32, StdinWrite>,
    /// Open connections to ports inside the sandbox, by request id.
    ports: HashMap<u32, crate::ports::PortConn>,
    /// Every open connection to a port, closed for a checkpoint.
    port_table: Arc<crate::ports::PortTable>,
}

impl Conn {
    async fn serve(&mut self, mut read: OwnedReadHalf) -> Result<End, GuestError> {
        let mut decoder = FrameDecoder::default();
        let mut buf = vec![0u8; READ_BUF];
        loop {
            let n = match read.read(&mut buf).await {
                Ok(0) => return Ok(End::Eof),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(GuestError::Read(e)),
            };
            decoder.feed(&buf[..n]);
            while let Some(frame) = decoder.next_frame::<HostMessage>() {
                match frame {
                    Ok(Frame::Message { id, msg }) => {
                        if let Some(end) = self.message(id, msg).await {
                            return Ok(end);
                        }
                    }
                    Ok(Frame::Data { id, chunk }) => {
                        self.data(id, chunk.channel, chunk.bytes).await;
                    }
                    Err(e) => self.bad_frame(e).await?,
                }
            }
        }
    }

    /// Makes the new connection, sends the host its end, and ends this connection's loop.
    async fn rehome(&self, id: u32) -> Option<End> {
        let made = std::os::unix::net::UnixStream::pair().and_then(|(ours, theirs)| {
            let inode = rustix::fs::fstat(&ours)?.st_ino;
            Ok((ours, theirs, inode))
        });
        match made {
            Ok((ours, theirs, inode)) => {
                let frame = encode_message(id, &GuestMessage::Rehomed { inode });
                self.shared.out.frame_with_fd(frame, theirs.into()).await;
                self.shared.out.flush().await;
                Some(End::Rehome(ours))
            }
            Err(e) => {
                self.error(
                    id,
                    ErrorCode::Internal,
                    format!("make a new connection: {e}"),
                )
                .await;
                None
            }
        }
    }

    async fn reply(&self, id: u32, msg: GuestMessage) {
        self.shared.out.msg(id, &msg).await;
    }

    async fn error(&self, id: u32, code: ErrorCode, message: impl Into<String>) {
        self.shared
            .out
            .error(id, WireError::new(code, message))
            .await;
    }

    async fn bad_frame(&mut self, e: FrameError) -> Result<(), GuestError> {
        if e.is_fatal() {
            self.error(0, ErrorCode::BadFrame, e.to_string()).await;
            return Err(GuestError::Frame(e));
        }
        let id = e.request_id().unwrap_or(0);
        let code = match e {
            FrameError::TooLarge { .. } => ErrorCode::FrameTooLarge,
            _ => ErrorCode::BadFrame,
        };
        // A lost frame of a file upload would leave a hole in the file: fail the write.
        if let Some(WriteState::Active(_)) = self.writes.get(&id) {
            self.writes.insert(id, WriteState::Failed);
        }
        self.error(id, code, e.to_string()).await;
        Ok(())
    }

    fn in_flight(&self, id: u32) -> bool {
        if matches!(self.writes.get(&id), Some(WriteState::Active(_)))
            || matches!(self.stdin_writes.get(&id), Some(StdinWrite::Active(_)))
        {
            return true;
        }
        let t = lock(&self.shared.tables);
        t.execs.contains_key(&id) || t.busy.contains(&id) || t.attachments.contains_key(&id)
    }

    fn hello_reply(&mut self, protocol: u32) -> GuestMessage {
        if SUPPORTED_VERSIONS.contains(&protocol) {
            self.hello = true;
            self.shared
                .protocol
                .store(protocol, std::sync::atomic::Ordering::SeqCst);
            GuestMessage::HelloOk {
                protocol,
                agent_version: env!("CARGO_PKG_VERSION").to_string(),
                isolation: self.shared.config.isolation.clone(),
            }
        } else {
            let speaks: Vec<String> = SUPPORTED_VERSIONS.iter().map(u32::to_string).collect();
            GuestMessage::Error(WireError::new(
                ErrorCode::UnsupportedVersion,
                format!(
                    "protocol version {protocol} is not supported; this agent speaks {}",
                    speaks.join(", ")
                ),
            ))
        }
    }

    /// Handles one control message; `Some` ends the connection.
    async fn message(&mut self, id: u32, msg: HostMessage) -> Option<End> {
        if id == 0 {
            self.error(
                id,
                ErrorCode::InvalidArgument,
                "request id 0 is reserved for the connection",
            )
            .await;
            return None;
        }
        if !self.hello {
            let reply = match msg {
                HostMessage::Hello { protocol, .. } => self.hello_reply(protocol),
                _ => GuestMessage::Error(WireError::new(
                    ErrorCode::HandshakeRequired,
                    "send hello first",
                )),
            };
            self.reply(id, reply).await;
            return None;
        }
        if let Some(port) = self.ports.get(&id) {
            match msg {
                HostMessage::StdinClose | HostMessage::EndOfData => {
                    port.send(crate::ports::PortIn::Close);
                    return None;
                }
                HostMessage::AbortData => {
                    port.abort();
                    self.ports.remove(&id);
                    return None;
                }
                HostMessage::ReadCredit { chunks } => {
                    port.grant(chunks);
                    return None;
                }
                _ => {}
            }
            // Any other message starts a new request under this id, so the host is done
            // with the connection that had it. One closed for a checkpoint stays here until
            // then (the host's abort waits for the restore), and a sandbox forked from that
            // checkpoint starts with it: it must not take the new request's credit or end.
            port.abort();
            self.ports.remove(&id);
        }
        match msg {
            HostMessage::ConnectPort { port, window } => {
                match crate::ports::open(&self.shared, &self.port_table, id, port, window).await {
                    Ok(conn) => {
                        self.ports.insert(id, conn);
                    }
                    Err(e) => self.shared.out.error(id, e).await,
                }
                return None;
            }
            HostMessage::StdinClose if self.stdin_writes.contains_key(&id) => {
                self.end_stdin_write(id, true);
                return None;
            }
            HostMessage::StdinClose => {
                self.stdin(id, StdinMsg::Close);
                return None;
            }
            HostMessage::EndOfData if self.stdin_writes.contains_key(&id) => {
                self.end_stdin_write(id, false);
                return None;
            }
            HostMessage::EndOfData => {
                self.end_of_data(id).await;
                return None;
            }
            HostMessage::AbortData => {
                if !self.shared.reads.cancel(id) {
                    // Dropping the session removes its temporary file.
                    self.writes.remove(&id);
                }
                return None;
            }
            HostMessage::ReadCredit { chunks } => {
                self.shared.reads.grant(id, chunks);
                return None;
            }
            HostMessage::Detach => {
                // Nothing to answer when the attachment ended already (its exit was the end).
                if attach::detach(&self.shared, id) {
                    self.reply(id, GuestMessage::Detached).await;
                }
                return None;
            }
            HostMessage::HostCallReply { call, result } => {
                // No reply: one for an execution that has ended is dropped.
                kernels::host_call_reply(&self.shared, id, call, result);
                return None;
            }
            _ => {}
        }
        // A failed write holds its id only to swallow its leftovers; a new request frees it.
        if matches!(self.writes.get(&id), Some(WriteState::Failed)) {
            self.writes.remove(&id);
        }
        if matches!(self.stdin_writes.get(&id), Some(StdinWrite::Failed)) {
            self.stdin_writes.remove(&id);
        }
        if self.in_flight(id) {
            self.error(
                id,
                ErrorCode::InvalidState,
                format!("request id {id} is still in use by a request in progress"),
            )
            .await;
            return None;
        }
        match msg {
            HostMessage::Hello { protocol, .. } => {
                // A greeting on a greeted connection is a new host: a sandbox restored from
                // a checkpoint, on the connection the old one had. Its connections to ports
                // were the old host's, whose ends are not in this sandbox: closed, so that a
                // server inside does not wait on them.
                for (_, port) in self.ports.drain() {
                    port.abort();
                }
                let reply = self.hello_reply(protocol);
                self.reply(id, reply).await;
            }
            HostMessage::Ping => self.reply(id, GuestMessage::Pong).await,
            HostMessage::SetHostname { name } => {
                self.reply(id, reply_of(set_hostname(&name).map(|()| GuestMessage::Ok)))
                    .await;
            }
            HostMessage::Rehome => return self.rehome(id).await,
            HostMessage::Exec(req) => exec::start(&self.shared, id, req).await,
            HostMessage::Signal {
                exec_id,
                pid,
                signal,
                tree,
            } => self.signal(id, exec_id, pid, signal, tree).await,
            HostMessage::ListProcesses => {
                self.blocking(id, false, move |sh, _| GuestMessage::Processes {
                    processes: list_processes(sh),
                });
            }
            HostMessage::Attach {
                pid,
                stdout_from,
                stderr_from,
            } => {
                if let Err(e) =
                    attach::attach(&self.shared, id, pid, [stdout_from, stderr_from]).await
                {
                    self.shared.out.error(id, e).await;
                }
            }
            HostMessage::ProcessStdin { pid } => {
                match process::stdin_of(&self.shared.processes, pid) {
                    Ok(proc) => {
                        self.stdin_writes.insert(id, StdinWrite::Active(proc));
                    }
                    Err(e) => {
                        self.stdin_writes.insert(id, StdinWrite::Failed);
                        self.shared.out.error(id, e).await;
                    }
                }
            }
            HostMessage::ProcessStdinClose { pid } => {
                let reply = reply_of(process::close_stdin(&self.shared.processes, pid));
                self.reply(id, reply).await;
            }
            HostMessage::Resize { pid, rows, cols } => {
                let reply = reply_of(process::resize(&self.shared.processes, pid, rows, cols));
                self.reply(id, reply).await;
            }
            HostMessage::ReleaseProcess { pid } => {
                let reply = reply_of(
                    self.shared
                        .processes
                        .release(pid)
                        .map(|()| GuestMessage::Ok),
                );
                self.reply(id, reply).await;
            }
            HostMessage::WriteFile { path, mode, append } => {
                let started = self
                    .shared
                    .roots
                    .resolve(&path)
                    .and_then(|c| self.shared.roots.begin_write(&c, mode, append));
                match started {
                    Ok(session) => {
                        self.writes.insert(id, WriteState::Active(session));
                    }
                    Err(e) => {
                        self.writes.insert(id, WriteState::Failed);
                        self.shared.out.error(id, e).await;
                    }
                }
            }
            HostMessage::ReadFile { path, window } => {
                // Registered before the read starts, so an early AbortData finds it.
                if let Some(w) = window {
                    self.shared.reads.open(id, w);
                }
                let read = move |sh: &Shared, id| {
                    let reply = read_file(sh, id, &path);
                    sh.reads.close(id);
                    reply
                };
                if window.is_some() {
                    // It may wait for credit as long as its reader is slow: not on one of
                    // the few workers every other file operation needs.
                    self.on_own_thread(id, read);
                } else {
                    self.blocking(id, false, read);
                }
            }
            HostMessage::ListDir { path } => self.blocking(id, false, move |sh, _| {
                reply_of(
                    sh.roots
                        .resolve(&path)
                        .and_then(|c| sh.roots.list_dir(&c))
                        .map(|entries| GuestMessage::Listing { entries }),
                )
            }),
            HostMessage::Stat { path } => self.blocking(id, false, move |sh, _| {
                reply_of(
                    sh.roots
                        .resolve(&path)
                        .and_then(|c| sh.roots.stat(&c))
                        .map(|entry| GuestMessage::Entry { entry }),
                )
            }),
            HostMessage::MakeDir { path } => self.blocking(id, false, move |sh, _| {
                reply_of(
                    sh.roots
                        .resolve(&path)
                        .and_then(|c| sh.roots.make_dir(&c))
                        .map(|entry| GuestMessage::Entry { entry }),
                )
            }),
            HostMessage::Remove { path, recursive } => self.blocking(id, false, move |sh, _| {
                reply_of(
                    sh.roots
                        .resolve(&path)
                        .and_then(|c| sh.roots.remove(&c, recursive))
                        .map(|()| GuestMessage::Ok),
                )
            }),
            HostMessage::Rename { from, to } => self.blocking(id, false, move |sh, _| {
                let r = sh.roots.resolve(&from).and_then(|f| {
                    let t = sh.roots.resolve(&to)?;
                    sh.roots.rename(&f, &t)
                });
                reply_of(r.map(|entry| GuestMessage::Entry { entry }))
            }),
            HostMessage::Shutdown => return Some(End::Shutdown(id)),
            HostMessage::Prepare { env, kernels, cwd } => {
                let reply = reply_of(kernels::prepare(&self.shared, env, kernels, cwd));
                self.reply(id, reply).await;
            }
            HostMessage::RunCode(req) => {
                self.in_task(id, move |sh, id| async move {
                    kernels::run_code(sh, id, req).await;
                    None
                });
            }
            HostMessage::CreateContext { language, cwd, env } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(
                        kernels::create_context(&sh, language, cwd, env).await,
                    ))
                });
            }
            HostMessage::ListContexts => {
                self.reply(id, kernels::list_contexts(&self.shared)).await;
            }
            HostMessage::DestroyContext { context } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(kernels::destroy(&sh, &context).await))
                });
            }
            HostMessage::Interrupt { context } => {
                let reply = reply_of(kernels::interrupt(&self.shared, &context));
                self.reply(id, reply).await;
            }
            HostMessage::RestartContext { context } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(kernels::restart(&sh, &context).await))
                });
            }
            HostMessage::IsComplete {
                context,
                language,
                code,
            } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(
                        kernels::is_complete(&sh, context.as_deref(), language, code).await,
                    ))
                });
            }
            HostMessage::GetVariables { context, names } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(kernels::get_variables(&sh, &context, names).await))
                });
            }
            HostMessage::SetVariables { context, values } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(
                        kernels::set_variables(&sh, &context, values).await,
                    ))
                });
            }
            HostMessage::ClearVariables { context, names } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(
                        kernels::clear_variables(&sh, &context, names).await,
                    ))
                });
            }
            HostMessage::ListVariables { context } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(kernels::list_variables(&sh, &context).await))
                });
            }
            HostMessage::DumpKernelState { context, path } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(kernels::dump_state(&sh, &context, &path).await))
                });
            }
            HostMessage::LoadKernelState {
                context,
                language,
                path,
            } => {
                self.in_task(id, move |sh, _| async move {
                    Some(reply_of(
                        kernels::load_state(&sh, &context, language, &path).await,
                    ))
                });
            }
            // Handled above.
            HostMessage::ConnectPort { .. }
            | HostMessage::StdinClose
            | HostMessage::EndOfData
            | HostMessage::AbortData
            | HostMessage::ReadCredit { .. }
            | HostMessage::Detach
            | HostMessage::HostCallReply { .. } => {}
        }
        None
    }

    /// Serves a request in its own task (kernel requests wait on kernels, not on threads);
    /// `f`'s reply, when it returns one, is the request's final reply. The id stays in use
    /// until then.
    fn in_task<F, Fut>(&self, id: u32, f: F)
    where
        F: FnOnce(Arc<Shared>, u32) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Option<GuestMessage>> + Send + 'static,
    {
        let shared = self.shared.clone();
        lock(&shared.tables).busy.insert(id);
        tokio::spawn(async move {
            let reply = f(shared.clone(), id).await;
            lock(&shared.tables).busy.remove(&id);
            if let Some(reply) = reply {
                shared.out.msg(id, &reply).await;
            }
        });
    }

    /// Runs `f` on a worker thread (`kill` picks the kill thread); its result is the
    /// request's final reply. The id stays in use until just before that reply is queued.
    fn blocking<F>(&self, id: u32, kill: bool, f: F)
    where
        F: FnOnce(&Shared, u32) -> GuestMessage + Send + 'static,
    {
        let shared = self.shared.clone();
        lock(&shared.tables).busy.insert(id);
        let job = move || {
            let reply = f(&shared, id);
            lock(&shared.tables).busy.remove(&id);
            let _ = shared.out.blocking_frame(encode_message(id, &reply));
        };
        // The reply is sent by the job itself; nothing waits for the job's result.
        if kill {
            drop(self.shared.workers.kill(job));
        } else {
            drop(self.shared.workers.run(job));
        }
    }

    /// As [`Conn::blocking`], on a thread of its own (a general worker when no thread can
    /// be started: the pids limit counts threads).
    fn on_own_thread<F>(&self, id: u32, f: F)
    where
        F: FnOnce(&Shared, u32) -> GuestMessage + Send + 'static,
    {
        let shared = self.shared.clone();
        lock(&shared.tables).busy.insert(id);
        let job = move || {
            let reply = f(&shared, id);
            lock(&shared.tables).busy.remove(&id);
            let _ = shared.out.blocking_frame(encode_message(id, &reply));
        };
        let job = std::sync::Arc::new(Mutex::new(Some(job)));
        let mine = job.clone();
        let spawned = std::thread::Builder::new()
            .name("sandcell-read".into())
            .spawn(move || {
                if let Some(job) = lock(&mine).take() {
                    job();
                }
            });
        if spawned.is_err()
            && let Some(job) = lock(&job).take()
        {
            drop(self.shared.workers.run(job));
        }
    }

    async fn data(&mut self, id: u32, channel: Channel, bytes: Vec<u8>) {
        if !self.hello {
            self.error(id, ErrorCode::HandshakeRequired, "send hello first")
                .await;
            return;
        }
        if let (Channel::Stdin, Some(port)) = (channel, self.ports.get(&id)) {
            port.send(crate::ports::PortIn::Data(bytes));
            return;
        }
        match channel {
            Channel::Stdin if self.stdin_writes.contains_key(&id) => {
                self.stdin_write_data(id, bytes).await;
            }
            Channel::Stdin => self.stdin(id, StdinMsg::Data(bytes)),
            Channel::File => {
                let failed = match self.writes.get_mut(&id) {
                    Some(WriteState::Active(session)) => session.write(&bytes).err(),
                    // Chunks of a failed write, or of no write at all, are dropped.
                    _ => None,
                };
                if let Some(e) = failed {
                    // Dropping the session removes its temporary file.
                    self.writes.insert(id, WriteState::Failed);
                    self.shared.out.error(id, e).await;
                }
            }
            // Output channels only flow guest→host; a stray one is ignored.
            Channel::Stdout | Channel::Stderr => {}
        }
    }

    fn stdin(&self, id: u32, msg: StdinMsg) {
        let proc = match lock(&self.shared.tables).execs.get(&id) {
            Some(slot) => slot.proc.clone(),
            // The exec already ended (or never had stdin): late input is dropped.
            None => return,
        };
        process::send_stdin(&proc, msg);
    }

    async fn stdin_write_data(&mut self, id: u32, bytes: Vec<u8>) {
        let Some(StdinWrite::Active(proc)) = self.stdin_writes.get(&id) else {
            // Chunks of a failed write are dropped.
            return;
        };
        if !process::send_stdin(proc, StdinMsg::Data(bytes)) {
            let pid = proc.pid;
            self.stdin_writes.insert(id, StdinWrite::Failed);
            let e = WireError::new(
                ErrorCode::InvalidState,
                format!(
                    "the stdin of pid {pid} was closed (or it ended) before the input was written"
                ),
            );
            self.shared.out.error(id, e).await;
        }
    }

    /// `EndOfData` (or with `close`, `StdinClose`) of a `ProcessStdin` request: answers once
    /// its bytes are written.
    fn end_stdin_write(&mut self, id: u32, close: bool) {
        // Its error was already replied when it failed.
        if let Some(StdinWrite::Active(proc)) = self.stdin_writes.remove(&id) {
            self.in_task(id, move |_, _| async move {
                Some(reply_of(
                    process::flush_stdin(&proc, close)
                        .await
                        .map(|()| GuestMessage::Ok),
                ))
            });
        }
    }

    async fn end_of_data(&mut self, id: u32) {
        match self.writes.remove(&id) {
            Some(WriteState::Active(session)) => {
                let reply = reply_of(session.finish().map(|entry| GuestMessage::Entry { entry }));
                self.reply(id, reply).await;
            }
            // Its error was already replied.
            Some(WriteState::Failed) => {}
            None => {
                self.error(
                    id,
                    ErrorCode::InvalidState,
                    format!("no file write is in progress on request {id}"),
                )
                .await;
            }
        }
    }

    async fn signal(
        &mut self,
        id: u32,
        exec_id: Option<u32>,
        pid: Option<i32>,
        signal: i32,
        tree: bool,
    ) {
        if !(1..=64).contains(&signal) {
            return self
                .error(
                    id,
                    ErrorCode::InvalidArgument,
                    format!("signal {signal} is out of range (1 to 64)"),
                )
                .await;
        }
        let target = match (exec_id, pid) {
            (Some(e), None) => self.exec_target(e, signal, tree),
            (None, Some(p)) => self.pid_target(p, signal, tree),
            (Some(_), Some(_)) => Err(WireError::new(
                ErrorCode::InvalidArgument,
                "give either exec_id or pid, not both",
            )),
            (None, None) => Err(WireError::new(
                ErrorCode::InvalidArgument,
                "give exec_id or pid",
            )),
        };
        let target = match target {
            Ok(t) => t,
            Err(e) => return self.shared.out.error(id, e).await,
        };
        self.blocking(id, true, move |_, _| match target {
            Target::Tree(tree) => {
                tree.signal(signal);
                GuestMessage::Ok
            }
            Target::One(pid) => match procs::send(pid, signal) {
                Ok(()) => GuestMessage::Ok,
                Err(rustix::io::Errno::PERM) => GuestMessage::Error(WireError::new(
                    ErrorCode::PermissionDenied,
                    format!("not permitted to signal pid {pid}"),
                )),
                Err(_) => GuestMessage::Error(WireError::new(
                    ErrorCode::NoSuchProcess,
                    format!("no process with pid {pid} is running"),
                )),
            },
        });
    }

    fn exec_target(&self, exec_id: u32, signal: i32, tree: bool) -> Result<Target, WireError> {
        let tables = lock(&self.shared.tables);
        let Some(slot) = tables.execs.get(&exec_id) else {
            return Err(WireError::new(
                ErrorCode::NoSuchProcess,
                format!("no exec with id {exec_id} is running"),
            ));
        };
        let proc = &slot.proc;
        if tree {
            if signal == libc::SIGKILL {
                proc.state().killed = true;
            }
            return Ok(Target::Tree(self.shared.proc_tree(proc)));
        }
        if proc.state().reaped {
            return Err(WireError::new(
                ErrorCode::NoSuchProcess,
                format!("the process of exec {exec_id} has already exited"),
            ));
        }
        Ok(Target::One(proc.pid))
    }

    fn pid_target(&self, pid: i32, signal: i32, tree: bool) -> Result<Target, WireError> {
        if pid == self.shared.me {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("pid {pid} is the agent itself"),
            ));
        }
        let missing = || {
            WireError::new(
                ErrorCode::NoSuchProcess,
                format!("no process with pid {pid} in the sandbox"),
            )
        };
        if pid <= 1 {
            return Err(missing());
        }
        let Some(stat) = procs::read_stat(pid) else {
            return Err(missing());
        };
        // Outside a pid namespace only our own processes are in the sandbox.
        if !self.shared.pid1 && !self.shared.owns(pid) {
            return Err(missing());
        }
        if !tree {
            return Ok(Target::One(pid));
        }
        // A tracked process's tree also has the members its tag finds.
        let tag = self.shared.processes.live(pid).map(|proc| {
            if signal == libc::SIGKILL {
                proc.state().killed = true;
            }
            proc.tree
        });
        Ok(Target::Tree(Tree {
            roots: vec![pid],
            groups: vec![pid, stat.pgid],
            session: self.shared.session.clone(),
            tag,
            any_exec: false,
            me: self.shared.me,
            my_pgid: self.shared.my_pgid,
        }))
    }
}

enum Target {
    One(i32),
    Tree(Tree),
}

/// The process list: every process in `/proc` (but the agent), with the tracked ones
/// described by their entries, and the exited tracked ones kept (state `X`).
fn list_processes(sh: &Shared) -> Vec<ProcessInfo> {
    let tracked = sh.processes.all();
    let exec_ids: HashMap<i32, u32> = tracked
        .iter()
        .filter(|p| !p.state().reaped)
        .map(|p| (p.pid, p.exec_id))
        .collect();
    let mut list = procs::list(sh.me, &exec_ids, &sh.session);
    for proc in tracked {
        let reaped = proc.state().reaped;
        // A collected process's pid may belong to another process now: that one stays as
        // /proc shows it, and the entry is listed on its own.
        match list.iter_mut().find(|p| p.pid == proc.pid) {
            Some(live) if !reaped => *live = proc.info(Some(live.clone()), sh.me),
            _ => list.push(proc.info(None, sh.me)),
        }
    }
    list.sort_by_key(|p| p.pid);
    list
}

fn reply_of(r: Result<GuestMessage, WireError>) -> GuestMessage {
    r.unwrap_or_else(GuestMessage::Error)
}

/// Streams a file as `File` chunks, then returns `ReadDone` (or the error).
fn read_file(sh: &Shared, id: u32, path: &str) -> GuestMessage {
    let opened = sh.roots.resolve(path).and_then(|c| {
        let file = sh.roots.open_read(&c)?;
        Ok((c, file))
    });
    let (c, mut file) = match opened {
        Ok(x) => x,
        Err(e) => return GuestMessage::Error(e),
    };
    let mut seq = 0u64;
    let mut size = 0u64;
    loop {
        match read_chunk(&mut file, MAX_CHUNK, &c.display) {
            Ok(chunk) if chunk.is_empty() => return GuestMessage::ReadDone { size },
            Ok(chunk) => {
                if sh.reads.wait(id, seq, || sh.out.is_closed()) == Wait::Stop {
                    return GuestMessage::ReadDone { size };
                }
                size += chunk.len() as u64;
                if !sh
                    .out
                    .blocking_frame(encode_data(id, Channel::File, seq, &chunk))
                {
                    // The connection is gone: nobody is left to read the rest.
                    return GuestMessage::ReadDone { size };
                }
                seq += 1;
            }
            Err(e) => return GuestMessage::Error(e),
        }
    }
}
