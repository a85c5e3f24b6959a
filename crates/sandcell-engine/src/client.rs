//! The host side of the guest protocol: many concurrent requests over one stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use sandcell_protocol::{
    Channel, DataChunk, ErrorCode, Frame, FrameDecoder, GuestMessage, HostMessage, IsolationReport,
    PROTOCOL_VERSION, SUPPORTED_VERSIONS, encode_data, encode_message, frame::MAX_CHUNK,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{Mutex, mpsc, watch};
use tokio::task::JoinHandle;

use crate::backend::GuestStream;
use crate::error::EngineError;

/// Something the guest sent for one request.
#[derive(Debug)]
pub enum Reply {
    /// A control message.
    Message(GuestMessage),
    /// A data chunk.
    Data(DataChunk),
    /// The connection ended; no more replies will come.
    Closed(String),
}

type Pending = Arc<StdMutex<PendingState>>;

#[derive(Default)]
struct PendingState {
    routes: HashMap<u32, mpsc::UnboundedSender<Reply>>,
    closed: Option<String>,
    /// Which stream is current (see [`GuestClient::reconnect`]): an older stream's end
    /// closes nothing.
    generation: u64,
}

/// What the agent said in its handshake.
#[derive(Debug, Clone)]
pub struct Hello {
    /// The agreed protocol version.
    pub protocol: u32,
    /// The agent's version.
    pub agent_version: String,
    /// Isolation the agent set up inside the sandbox.
    pub isolation: IsolationReport,
}

/// How long the agent restored in place gets to answer a ping on its new connection. Its
/// restore can take seconds on a loaded host (10 s was once too short with the whole test
/// suite running on two cores); past this the sandbox is reported gone, not waited on.
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a write waits for a connection being replaced (its sandbox is being
/// checkpointed) before it gives up.
const REPLACE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long the new connection's reader waits for the old one to end, to take over the
/// start of a frame the old stream cut off.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to one guest agent.
pub struct GuestClient {
    writer: Mutex<WriteHalf<GuestStream>>,
    pending: Pending,
    next_id: AtomicU32,
    /// The reader task; it returns the bytes of a frame its stream ended in the middle of.
    reader: StdMutex<JoinHandle<Vec<u8>>>,
    /// Closed (false) while the connection is being replaced: nothing may be written to a
    /// stream whose agent is being checkpointed (what it has not read is lost with it).
    open: watch::Sender<bool>,
}

impl Drop for GuestClient {
    fn drop(&mut self) {
        if let Ok(reader) = self.reader.lock() {
            reader.abort();
        }
    }
}

/// One in-flight request: its id and the replies routed to it.
pub struct Call {
    /// The request id.
    pub id: u32,
    rx: mpsc::UnboundedReceiver<Reply>,
    pending: Pending,
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Ok(mut p) = self.pending.lock() {
            p.routes.remove(&self.id);
        }
    }
}

impl Call {
    /// The next reply, or `Closed` once the connection is gone.
    pub async fn next(&mut self) -> Reply {
        self.rx
            .recv()
            .await
            .unwrap_or_else(|| Reply::Closed("connection closed".into()))
    }

    /// A reply that has already arrived, if any (never waits).
    pub fn try_next(&mut self) -> Option<Reply> {
        self.rx.try_recv().ok()
    }

    /// The next reply, or `None` if none comes within `limit` (no limit: waits).
    pub async fn next_within(&mut self, limit: Option<Duration>) -> Option<Reply> {
        match limit {
            Some(limit) => tokio::time::timeout(limit, self.next()).await.ok(),
            None => Some(self.next().await),
        }
    }

    /// The next control message, skipping nothing: data chunks are an error here.
    pub async fn message(&mut self) -> Result<GuestMessage, EngineError> {
        match self.next().await {
            Reply::Message(GuestMessage::Error(e)) => Err(EngineError::Guest(e)),
            Reply::Message(m) => Ok(m),
            Reply::Data(_) => Err(EngineError::Connection("unexpected data chunk".into())),
            Reply::Closed(reason) => Err(EngineError::Connection(reason)),
        }
    }
}

impl GuestClient {
    /// Starts reading from `stream` and performs the handshake within `timeout`.
    pub async fn connect(
        stream: GuestStream,
        timeout: Duration,
    ) -> Result<(Self, Hello), EngineError> {
        let client = Self::start(stream);
        let call = client.send_hello().await?;
        let hello = client.await_hello_or_older(call, timeout).await?;
        Ok((client, hello))
    }

    /// Waits for the answer to [`Self::send_hello`]; an agent that does not speak this
    /// build's version (one an older build started, reattached or restored) is greeted again
    /// with each older version this build speaks, newest first.
    pub async fn await_hello_or_older(
        &self,
        call: Call,
        timeout: Duration,
    ) -> Result<Hello, EngineError> {
        let mut answered = Self::await_hello(call, timeout).await;
        let older = SUPPORTED_VERSIONS
            .iter()
            .rev()
            .copied()
            .filter(|v| *v < PROTOCOL_VERSION);
        for version in older {
            match &answered {
                Err(EngineError::Guest(e)) if e.code == ErrorCode::UnsupportedVersion => {}
                _ => break,
            }
            let call = self
                .request(&HostMessage::Hello {
                    protocol: version,
                    client: "sandcell-engine".into(),
                })
                .await?;
            answered = Self::await_hello(call, timeout).await;
        }
        answered
    }

    /// Sends the handshake without waiting for its answer; requests sent after it are
    /// served once the agent has answered it (it reads in order).
    pub async fn send_hello(&self) -> Result<Call, EngineError> {
        self.request(&HostMessage::Hello {
            protocol: PROTOCOL_VERSION,
            client: "sandcell-engine".into(),
        })
        .await
    }

    /// Waits for the answer to [`Self::send_hello`].
    pub async fn await_hello(mut call: Call, timeout: Duration) -> Result<Hello, EngineError> {
        let reply = tokio::time::timeout(timeout, call.message())
            .await
            .map_err(|_| EngineError::Unresponsive(format!("no handshake within {timeout:?}")))??;
        match reply {
            GuestMessage::HelloOk {
                protocol,
                agent_version,
                isolation,
            } => Ok(Hello {
                protocol,
                agent_version,
                isolation,
            }),
            other => Err(EngineError::Connection(format!(
                "unexpected handshake reply {other:?}"
            ))),
        }
    }

    /// Starts the reader task without a handshake.
    pub fn start(stream: GuestStream) -> Self {
        Self::start_at(stream, 1)
    }

    /// As [`Self::start`], numbering requests from `first_id`: a client reattaching to an
    /// agent starts far from where the previous one was, so that late replies to that one's
    /// requests match none of its own.
    pub fn start_at(stream: GuestStream, first_id: u32) -> Self {
        let (read, write) = tokio::io::split(stream);
        let pending: Pending = Arc::default();
        let reader = tokio::spawn(read_loop(read, pending.clone(), 0, None));
        Self {
            writer: Mutex::new(write),
            pending,
            next_id: AtomicU32::new(first_id.max(1)),
            reader: StdMutex::new(reader),
            open: watch::Sender::new(true),
        }
    }

    /// Before the agent's connection is replaced (its sandbox is checkpointed and restored in
    /// place): the end of the current stream no longer closes the client, and writes wait
    /// (returns once a write in progress is done). Follow with [`Self::reconnect`] or
    /// [`Self::cancel_reconnect`].
    pub async fn expect_reconnect(&self) {
        if let Ok(mut p) = self.pending.lock() {
            p.generation += 1;
        }
        self.open.send_replace(false);
        // A write stuck on an agent that reads nothing must not hold the checkpoint up.
        let _ = tokio::time::timeout(RECONNECT_TIMEOUT, self.writer.lock()).await;
    }

    /// The connection was not replaced after all: its end closes the client again (now, if
    /// it has ended meanwhile), and writes go on.
    pub fn cancel_reconnect(&self) {
        let ended = self.reader.lock().map_or(true, |r| r.is_finished());
        if ended {
            self.fail_all("the guest agent closed the connection (during a checkpoint)");
        } else if let Ok(mut p) = self.pending.lock() {
            p.generation -= 1;
        }
        self.open.send_replace(true);
    }

    /// Continues on `stream`, a new connection to the same agent (whose memory was
    /// checkpointed and restored with it), after [`Self::expect_reconnect`]: requests in
    /// progress keep their ids and get the rest of their replies there. What the old stream
    /// still holds is read to its end; a frame it cut off is completed from the new one.
    ///
    /// The agent must then answer a ping within [`RECONNECT_TIMEOUT`]; if it does not, the
    /// client is closed with the reason, so that no request waits for it forever.
    pub async fn reconnect(&self, stream: GuestStream) {
        let (read, write) = tokio::io::split(stream);
        {
            let mut writer = self.writer.lock().await;
            let generation = match self.pending.lock() {
                Ok(p) => p.generation,
                Err(_) => return,
            };
            if let Ok(mut slot) = self.reader.lock() {
                let old = std::mem::replace(&mut *slot, tokio::spawn(async { Vec::new() }));
                *slot = tokio::spawn(read_loop(read, self.pending.clone(), generation, Some(old)));
            }
            *writer = write;
        }
        self.open.send_replace(true);
        let answered = tokio::time::timeout(RECONNECT_TIMEOUT, self.call(&HostMessage::Ping)).await;
        let why = match answered {
            Ok(Ok(GuestMessage::Pong)) => return,
            Ok(Ok(other)) => format!("it answered a ping with {other:?}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer to a ping within {RECONNECT_TIMEOUT:?}"),
        };
        self.fail_all(&format!(
            "the guest agent did not answer on its new connection after the sandbox was \
             checkpointed and restored in place: {why}"
        ));
    }

    /// Closes the client for `reason`: every request waiting gets it, new ones fail with it.
    fn fail_all(&self, reason: &str) {
        if let Ok(mut p) = self.pending.lock() {
            p.closed = Some(reason.into());
            for (_, tx) in p.routes.drain() {
                let _ = tx.send(Reply::Closed(reason.into()));
            }
        }
    }

    /// Whether the connection is gone, and why.
    pub fn closed_reason(&self) -> Option<String> {
        self.pending.lock().ok().and_then(|p| p.closed.clone())
    }

    /// Sends a new request and returns its replies.
    pub async fn request(&self, msg: &HostMessage) -> Result<Call, EngineError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed).max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut p = self
                .pending
                .lock()
                .map_err(|_| EngineError::Connection("state poisoned".into()))?;
            if let Some(reason) = &p.closed {
                return Err(EngineError::Connection(reason.clone()));
            }
            p.routes.insert(id, tx);
        }
        let call = Call {
            id,
            rx,
            pending: self.pending.clone(),
        };
        self.send(id, msg).await?;
        Ok(call)
    }

    /// Sends a message on an existing request id.
    pub async fn send(&self, id: u32, msg: &HostMessage) -> Result<(), EngineError> {
        self.write(&encode_message(id, msg)).await
    }

    /// Sends bytes on an existing request id, split into chunks; returns the next seq.
    pub async fn send_data(
        &self,
        id: u32,
        channel: Channel,
        mut seq: u64,
        bytes: &[u8],
    ) -> Result<u64, EngineError> {
        for chunk in bytes.chunks(MAX_CHUNK) {
            self.write(&encode_data(id, channel, seq, chunk)).await?;
            seq += 1;
        }
        Ok(seq)
    }

    /// Sends a request that has exactly one reply and returns it.
    pub async fn call(&self, msg: &HostMessage) -> Result<GuestMessage, EngineError> {
        let mut call = self.request(msg).await?;
        call.message().await
    }

    async fn write(&self, bytes: &[u8]) -> Result<(), EngineError> {
        let mut open = self.open.subscribe();
        loop {
            // While the connection is being replaced, wait for the new one.
            match tokio::time::timeout(REPLACE_TIMEOUT, open.wait_for(|o| *o)).await {
                Ok(Ok(_)) => {}
                _ => {
                    return Err(EngineError::Unresponsive(format!(
                        "the sandbox's checkpoint did not end within {REPLACE_TIMEOUT:?}"
                    )));
                }
            }
            let mut w = self.writer.lock().await;
            // Closed between the wait and the lock: wait again.
            if !*self.open.borrow() {
                continue;
            }
            return w.write_all(bytes).await.map_err(|e| {
                EngineError::Connection(
                    self.closed_reason()
                        .unwrap_or_else(|| format!("write to the agent: {e}")),
                )
            });
        }
    }
}

/// Reads frames from `read` and routes them until the stream ends; returns the bytes of a
/// frame the stream ended in the middle of. A reader that follows another (`before`, the
/// stream its agent was on until a checkpoint) starts with that one's unfinished frame:
/// the agent may have written a frame partly before the checkpoint and the rest after.
async fn read_loop(
    mut read: ReadHalf<GuestStream>,
    pending: Pending,
    generation: u64,
    before: Option<JoinHandle<Vec<u8>>>,
) -> Vec<u8> {
    let mut decoder = FrameDecoder::default();
    // The bytes the decoder holds (the start of a frame), kept to hand over at the end.
    let mut unfinished: Vec<u8> = Vec::new();
    if let Some(before) = before {
        // The old stream ends with its agent's checkpoint; if it has not ended in time, it
        // keeps routing what it reads itself.
        if let Ok(Ok(rest)) = tokio::time::timeout(HANDOVER_TIMEOUT, before).await
            && !rest.is_empty()
        {
            decoder.feed(&rest);
            unfinished = rest;
        }
    }
    // Filled without zeroing first: a zeroed 64 KiB buffer costs 16 page faults up front.
    let mut buf = Vec::with_capacity(64 * 1024);
    let reason = loop {
        buf.clear();
        match read.read_buf(&mut buf).await {
            Ok(0) => break "the guest agent closed the connection".to_string(),
            Ok(_) => decoder.feed(&buf),
            Err(e) => break format!("reading from the guest agent: {e}"),
        }
        let mut fatal = None;
        while let Some(frame) = decoder.next_frame::<GuestMessage>() {
            let (id, reply) = match frame {
                Ok(Frame::Message { id, msg }) => (id, Reply::Message(msg)),
                Ok(Frame::Data { id, chunk }) => (id, Reply::Data(chunk)),
                Err(e) if e.is_fatal() => {
                    fatal = Some(format!("the guest agent sent a broken frame: {e}"));
                    break;
                }
                // A single bad frame from the guest: drop it; its request will time out or
                // get an error from the agent.
                Err(_) => continue,
            };
            route(&pending, id, reply);
        }
        if let Some(reason) = fatal {
            break reason;
        }
        keep_unfinished(&mut unfinished, &buf, decoder.buffered());
    };
    if let Ok(mut p) = pending.lock()
        && p.generation == generation
    {
        p.closed = Some(reason.clone());
        for (_, tx) in p.routes.drain() {
            let _ = tx.send(Reply::Closed(reason.clone()));
        }
    }
    unfinished
}

/// Keeps in `unfinished` the last `held` bytes of everything fed so far (`read` last): what
/// the decoder holds. Copies only those bytes (at most one frame), not the stream.
fn keep_unfinished(unfinished: &mut Vec<u8>, read: &[u8], held: usize) {
    if held == 0 {
        unfinished.clear();
    } else if held <= read.len() {
        unfinished.clear();
        unfinished.extend_from_slice(&read[read.len() - held..]);
    } else {
        unfinished.extend_from_slice(read);
        let extra = unfinished.len().saturating_sub(held);
        unfinished.drain(..extra);
    }
}

fn route(pending: &Pending, id: u32, reply: Reply) {
    if let Ok(p) = pending.lock()
        && let Some(tx) = p.routes.get(&id)
    {
        let _ = tx.send(reply);
    }
}
