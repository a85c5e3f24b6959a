//! The host side of the guest protocol: many concurrent requests over one stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use sandcell_protocol::{
    Channel, DataChunk, Frame, FrameDecoder, GuestMessage, HostMessage, IsolationReport,
    PROTOCOL_VERSION, encode_data, encode_message, frame::MAX_CHUNK,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;

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

/// A connection to one guest agent.
pub struct GuestClient {
    writer: Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU32,
    reader: StdMutex<JoinHandle<()>>,
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
        stream: UnixStream,
        timeout: Duration,
    ) -> Result<(Self, Hello), EngineError> {
        let client = Self::start(stream);
        let call = client.send_hello().await?;
        let hello = Self::await_hello(call, timeout).await?;
        Ok((client, hello))
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
    pub fn start(stream: UnixStream) -> Self {
        Self::start_at(stream, 1)
    }

    /// As [`Self::start`], numbering requests from `first_id`: a client reattaching to an
    /// agent starts far from where the previous one was, so that late replies to that one's
    /// requests match none of its own.
    pub fn start_at(stream: UnixStream, first_id: u32) -> Self {
        let (read, write) = stream.into_split();
        let pending: Pending = Arc::default();
        let reader = tokio::spawn(read_loop(read, pending.clone(), 0));
        Self {
            writer: Mutex::new(write),
            pending,
            next_id: AtomicU32::new(first_id.max(1)),
            reader: StdMutex::new(reader),
        }
    }

    /// Before the agent's connection is replaced (its sandbox is checkpointed and restored in
    /// place): the end of the current stream no longer closes the client. Follow with
    /// [`Self::reconnect`] or [`Self::cancel_reconnect`].
    pub fn expect_reconnect(&self) {
        if let Ok(mut p) = self.pending.lock() {
            p.generation += 1;
        }
    }

    /// The connection was not replaced after all: its end closes the client again (now, if
    /// it has ended meanwhile).
    pub fn cancel_reconnect(&self) {
        let ended = self.reader.lock().map_or(true, |r| r.is_finished());
        if let Ok(mut p) = self.pending.lock() {
            if ended {
                let reason = "the guest agent closed the connection (during a checkpoint)";
                p.closed = Some(reason.into());
                for (_, tx) in p.routes.drain() {
                    let _ = tx.send(Reply::Closed(reason.into()));
                }
            } else {
                p.generation -= 1;
            }
        }
    }

    /// Continues on `stream`, a new connection to the same agent (whose memory was
    /// checkpointed and restored with it), after [`Self::expect_reconnect`]: requests in
    /// progress keep their ids and get the rest of their replies there. What the old stream
    /// still holds is read to its end.
    pub async fn reconnect(&self, stream: UnixStream) {
        let (read, write) = stream.into_split();
        let mut writer = self.writer.lock().await;
        let generation = match self.pending.lock() {
            Ok(p) => p.generation,
            Err(_) => return,
        };
        let reader = tokio::spawn(read_loop(read, self.pending.clone(), generation));
        *writer = write;
        if let Ok(mut slot) = self.reader.lock() {
            // The old reader ends by itself at its stream's end.
            *slot = reader;
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
        let mut w = self.writer.lock().await;
        w.write_all(bytes).await.map_err(|e| {
            EngineError::Connection(
                self.closed_reason()
                    .unwrap_or_else(|| format!("write to the agent: {e}")),
            )
        })
    }
}

async fn read_loop(mut read: tokio::net::unix::OwnedReadHalf, pending: Pending, generation: u64) {
    let mut decoder = FrameDecoder::default();
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
    };
    if let Ok(mut p) = pending.lock()
        && p.generation == generation
    {
        p.closed = Some(reason.clone());
        for (_, tx) in p.routes.drain() {
            let _ = tx.send(Reply::Closed(reason.clone()));
        }
    }
}

fn route(pending: &Pending, id: u32, reply: Reply) {
    if let Ok(p) = pending.lock()
        && let Some(tx) = p.routes.get(&id)
    {
        let _ = tx.send(reply);
    }
}
