//! A scripted LLM server on loopback, for agent tests on machines that reach no model.
//!
//! [`ScriptedLlm`] speaks the public wire formats of OpenAI Chat Completions
//! (`POST /v1/chat/completions`) and Anthropic Messages (`POST /v1/messages`), plain and
//! streamed (server-sent events), answers each request with the next [`Turn`] of a
//! [`Script`], records what it received ([`Recorded`]) and injects faults ([`Fault`]). It
//! relies on nothing beyond those public protocols, so a client that works against it has
//! only been tested against what the real services promise.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use sandcell_testkit::llm::{Script, ScriptedCall, ScriptedLlm, Turn};
//!
//! let llm = ScriptedLlm::start(
//!     Script::new()
//!         .turn(Turn::ToolCalls(vec![ScriptedCall::new(
//!             "run_code",
//!             serde_json::json!({"code": "print(2 + 2)"}),
//!         )]))
//!         .turn(Turn::Text("it printed 4".into())),
//! )
//! .await?;
//! // point the client under test at llm.openai_base() or llm.anthropic_base() …
//! assert_eq!(llm.requests().len(), 0);
//! # Ok(())
//! # }
//! ```
//!
//! `POST /v1/embeddings` answers deterministic vectors (a hashed bag of words, with synonym
//! groups a test chooses: [`EmbeddingsScript`]), or a fault while one is set
//! ([`ScriptedLlm::set_embeddings_fault`]); embeddings requests take no turn of the script.
//!
//! Requests a real service would refuse (no `model`, Anthropic without `max_tokens`, an
//! OpenAI image outside a user message, tool calls left without results, results for calls
//! never made) get the protocol's 400 without consuming a turn, so client bugs show up here
//! rather than against the real service. Every request is recorded, refused or not.

mod agent;
mod embeddings;
mod recorded;
mod script_file;
mod server;
mod validate;
mod wire;

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

pub use agent::{NO_CODE_TOOL, NO_PYTHON_BLOCK, default_agent_turn};
pub use embeddings::{EmbeddingsScript, STOP_WORDS};
pub use recorded::{ImageSeen, Recorded};
pub use script_file::ScriptError;

/// Which public API a request came in on (and is answered in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// OpenAI Chat Completions, `POST /v1/chat/completions`.
    OpenAi,
    /// Anthropic Messages, `POST /v1/messages`.
    Anthropic,
}

/// What the server answers to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    /// A final text answer (`finish_reason: "stop"` / `stop_reason: "end_turn"`).
    Text(String),
    /// One or more parallel tool calls, no text.
    ToolCalls(Vec<ScriptedCall>),
    /// Text followed by tool calls in the same answer.
    TextAndToolCalls(String, Vec<ScriptedCall>),
    /// A failure, as the real service would show it.
    Fault(Fault),
}

impl Turn {
    /// A text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Turn::Text(text.into())
    }

    /// A single tool call.
    pub fn tool_call(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        Turn::ToolCalls(vec![ScriptedCall::new(name, arguments)])
    }
}

/// One tool call the server makes.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedCall {
    /// The tool's name, as offered by the client.
    pub name: String,
    /// Its arguments: sent as a JSON string (OpenAI) or as the `input` object (Anthropic).
    pub arguments: serde_json::Value,
}

impl ScriptedCall {
    /// A call of `name` with `arguments`.
    pub fn new(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        ScriptedCall {
            name: name.into(),
            arguments,
        }
    }
}

/// A failure injected in place of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// An HTTP error with the protocol's JSON error body (OpenAI
    /// `{"error":{"message","type","param","code"}}`, Anthropic
    /// `{"type":"error","error":{"type","message"}}`), the error type following the status
    /// as the real service names it; `retry_after` becomes the `retry-after` header.
    Status {
        /// The HTTP status.
        status: u16,
        /// The `retry-after` header's value, if any.
        retry_after: Option<String>,
        /// The error's message.
        message: String,
    },
    /// 401 with the protocol's authentication error body.
    Unauthorized,
    /// Streamed: a few events, then the connection closes without the terminator (`[DONE]`
    /// / `message_stop`); plain: the connection closes without any response.
    DropStream,
    /// Anthropic streamed: 200, then an `event: error` (`overloaded_error`) mid-stream;
    /// Anthropic plain: 529 `overloaded_error`; OpenAI: 503 `server_error`.
    Overloaded,
    /// Waits `delay_ms` before answering `then` (for cancellation and timeout tests).
    Slow {
        /// How long to wait before answering, in milliseconds.
        delay_ms: u64,
        /// The answer after the wait.
        then: Box<Turn>,
    },
}

impl Fault {
    /// A status error with `message` and no `retry-after`.
    pub fn status(status: u16, message: impl Into<String>) -> Self {
        Fault::Status {
            status,
            retry_after: None,
            message: message.into(),
        }
    }
}

/// The token usage the server reports for each answered request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Reported as `prompt_tokens` (OpenAI) / `input_tokens` (Anthropic).
    pub input_tokens: u64,
    /// Reported as `completion_tokens` (OpenAI) / `output_tokens` (Anthropic).
    pub output_tokens: u64,
}

impl Default for Usage {
    fn default() -> Self {
        Usage {
            input_tokens: 100,
            output_tokens: 10,
        }
    }
}

/// Decides a turn from the request when the queue is empty.
type Responder = Arc<dyn Fn(&Recorded) -> Turn + Send + Sync>;
/// Sees every request as it is recorded.
type Observer = Arc<dyn Fn(&Recorded) + Send + Sync>;

/// The text answered when the script has nothing left to say.
pub const NO_MORE_TURNS: &str = "scripted server: no more turns";

/// What the server answers: a queue of turns consumed one per request (whatever the
/// protocol), then a function deciding from the request, then [`NO_MORE_TURNS`] as text.
pub struct Script {
    turns: VecDeque<Turn>,
    usage: Usage,
    respond: Option<Responder>,
    observe: Option<Observer>,
    chunk_bytes: usize,
    embeddings: EmbeddingsScript,
}

impl fmt::Debug for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Script")
            .field("turns", &self.turns)
            .field("usage", &self.usage)
            .field("respond_with", &self.respond.is_some())
            .field("on_request", &self.observe.is_some())
            .field("chunk_bytes", &self.chunk_bytes)
            .field("embeddings", &self.embeddings)
            .finish()
    }
}

impl Default for Script {
    fn default() -> Self {
        Script::new()
    }
}

impl Script {
    /// An empty script: every request is answered with [`NO_MORE_TURNS`].
    pub fn new() -> Self {
        Script {
            turns: VecDeque::new(),
            usage: Usage::default(),
            respond: None,
            observe: None,
            chunk_bytes: 7,
            embeddings: EmbeddingsScript::default(),
        }
    }

    /// How `POST /v1/embeddings` answers (default: 64 dimensions, no synonyms, no fault).
    pub fn embeddings(mut self, e: EmbeddingsScript) -> Self {
        self.embeddings = e;
        self
    }

    /// The deterministic agent of [`default_agent_turn`] (the `scripted-llm` binary's
    /// default), so Rust tests and the SDK suites drive the same conversation.
    pub fn default_agent() -> Self {
        Script::new().respond_with(default_agent_turn)
    }

    /// Queues `t` after the turns already queued.
    pub fn turn(mut self, t: Turn) -> Self {
        self.turns.push_back(t);
        self
    }

    /// Queues every turn of `ts`.
    pub fn turns(mut self, ts: impl IntoIterator<Item = Turn>) -> Self {
        self.turns.extend(ts);
        self
    }

    /// The usage reported for every answered request (default 100 in, 10 out).
    pub fn usage(mut self, u: Usage) -> Self {
        self.usage = u;
        self
    }

    /// Decides the answer from the request once the queue is empty.
    pub fn respond_with(mut self, f: impl Fn(&Recorded) -> Turn + Send + Sync + 'static) -> Self {
        self.respond = Some(Arc::new(f));
        self
    }

    /// Called with every request as it is recorded (before it is answered or refused), e.g.
    /// to write a log as requests arrive.
    pub fn on_request(mut self, f: impl Fn(&Recorded) + Send + Sync + 'static) -> Self {
        self.observe = Some(Arc::new(f));
        self
    }

    /// Splits streamed text and tool-call arguments into pieces of at most this many bytes
    /// (default 7; never inside a UTF-8 character), so clients must reassemble them.
    pub fn chunk_bytes(mut self, n: usize) -> Self {
        self.chunk_bytes = n.max(1);
        self
    }
}

/// What the request handlers share.
struct Shared {
    turns: Mutex<VecDeque<Turn>>,
    requests: Mutex<Vec<Recorded>>,
    respond: Option<Responder>,
    observe: Option<Observer>,
    usage: Usage,
    chunk_bytes: usize,
    /// Numbers requests, for ids that differ between answers.
    seq: AtomicU64,
    /// How embeddings requests are answered (its fault may change while serving).
    embeddings: Mutex<EmbeddingsScript>,
}

/// Takes a lock even if a panicking test thread poisoned it: the data (a queue, a log) is
/// still consistent, and the server should keep answering.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn record(&self, rec: &Recorded) {
        lock(&self.requests).push(rec.clone());
        if let Some(observe) = &self.observe {
            observe(rec);
        }
    }

    fn next_turn(&self, rec: &Recorded) -> Turn {
        if let Some(t) = lock(&self.turns).pop_front() {
            return t;
        }
        match &self.respond {
            Some(f) => f(rec),
            None => Turn::Text(NO_MORE_TURNS.to_string()),
        }
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A running scripted server on 127.0.0.1; dropping it stops the server (no new
/// connections; idle ones are closed, answers under way finish).
pub struct ScriptedLlm {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl fmt::Debug for ScriptedLlm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedLlm")
            .field("addr", &self.addr)
            .finish()
    }
}

impl ScriptedLlm {
    /// Starts serving `script` on 127.0.0.1 at a free port.
    pub async fn start(script: Script) -> std::io::Result<Self> {
        Self::start_at(script, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts serving `script` at `addr` (port 0 picks a free one); for the `scripted-llm`
    /// binary, which is told its port.
    pub async fn start_at(script: Script, addr: SocketAddr) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            turns: Mutex::new(script.turns),
            requests: Mutex::new(Vec::new()),
            respond: script.respond,
            observe: script.observe,
            usage: script.usage,
            chunk_bytes: script.chunk_bytes,
            seq: AtomicU64::new(0),
            embeddings: Mutex::new(script.embeddings),
        });
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (shutdown, stop) = oneshot::channel();
        tokio::spawn(server::serve(listener, shared.clone(), stop));
        Ok(ScriptedLlm {
            addr,
            shared,
            shutdown: Some(shutdown),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The OpenAI base URL, `http://127.0.0.1:PORT/v1` (as `OPENAI_BASE_URL`).
    pub fn openai_base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The Anthropic base URL, `http://127.0.0.1:PORT` (as `ANTHROPIC_BASE_URL`).
    pub fn anthropic_base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, oldest first (refused ones included).
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.requests).clone()
    }

    /// Queues `t` after the turns still queued.
    pub fn push(&self, t: Turn) {
        lock(&self.shared.turns).push_back(t);
    }

    /// Makes every embeddings request fail with `fault` from now on (`None`: answer again).
    pub fn set_embeddings_fault(&self, fault: Option<Fault>) {
        lock(&self.shared.embeddings).fault = fault;
    }

    /// How many queued turns have not been answered yet.
    pub fn pending_turns(&self) -> usize {
        lock(&self.shared.turns).len()
    }
}

impl Drop for ScriptedLlm {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            // The server may already have ended (its runtime gone): nothing to stop then.
            let _ = tx.send(());
        }
    }
}

/// Splits `s` into pieces of at most `n` bytes, each ending on a character boundary (a
/// character wider than `n` makes a piece of its own).
pub(crate) fn pieces(s: &str, n: usize) -> Vec<&str> {
    let n = n.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < s.len() {
        let mut end = (start + n).min(s.len());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        if end == start {
            // One character wider than `n`: it goes whole.
            end = start + n;
            while !s.is_char_boundary(end) {
                end += 1;
            }
        }
        out.push(&s[start..end]);
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cut_on_char_boundaries_and_join_back() {
        let s = "héllo wörld ✓ done";
        for n in 1..10 {
            let p = pieces(s, n);
            assert_eq!(p.concat(), s);
            assert!(p.iter().all(|x| !x.is_empty()));
            assert!(
                p.iter().all(|x| x.len() <= n || x.chars().count() == 1),
                "{n}: {p:?}"
            );
        }
        assert_eq!(pieces("abcdefgh", 3), vec!["abc", "def", "gh"]);
        assert!(pieces("", 3).is_empty());
    }

    #[test]
    fn queue_then_function_then_fallback() {
        let rec = Recorded {
            protocol: Protocol::OpenAi,
            path: "/v1/chat/completions".into(),
            headers: Default::default(),
            body: serde_json::json!({}),
            stream: false,
        };
        let plain = Shared {
            turns: Mutex::new(VecDeque::from([Turn::text("a")])),
            requests: Mutex::new(Vec::new()),
            respond: None,
            observe: None,
            usage: Usage::default(),
            chunk_bytes: 7,
            seq: AtomicU64::new(0),
            embeddings: Mutex::new(EmbeddingsScript::default()),
        };
        assert_eq!(plain.next_turn(&rec), Turn::text("a"));
        assert_eq!(plain.next_turn(&rec), Turn::text(NO_MORE_TURNS));
        let decided = Shared {
            respond: Some(Arc::new(|r: &Recorded| Turn::text(r.path.clone()))),
            ..plain
        };
        lock(&decided.turns).push_back(Turn::text("b"));
        assert_eq!(decided.next_turn(&rec), Turn::text("b"));
        assert_eq!(decided.next_turn(&rec), Turn::text("/v1/chat/completions"));
    }
}
