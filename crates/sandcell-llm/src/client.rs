//! The client: one model call with retries, over either protocol.

use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap};

use crate::anthropic::{self, AnthropicStream};
use crate::config::{LlmConfig, normalize_base_url};
use crate::error::{LlmError, LlmErrorKind, classify, parse_error_body, redact};
use crate::message::ChatRequest;
use crate::model::{ModelRef, ProviderKind};
use crate::openai::{self, OpenAiStream};
use crate::response::{ChatResponse, StreamAssembler, StreamDelta, Usage};
use crate::retry;
use crate::sse::SseParser;

/// The providers' client: one HTTP connection pool and the configuration. Cheap to share
/// behind an `Arc`; calls may run concurrently.
#[derive(Debug, Clone)]
pub struct Llm {
    pub(crate) http: reqwest::Client,
    pub(crate) config: LlmConfig,
}

/// A failed attempt and the wait the server asked for before the next.
pub(crate) struct Failure {
    pub(crate) error: LlmError,
    pub(crate) retry_after: Option<Duration>,
}

impl From<LlmError> for Failure {
    fn from(error: LlmError) -> Self {
        Self {
            error,
            retry_after: None,
        }
    }
}

/// A transport error with its causes (reqwest's own message is only the outermost).
pub(crate) fn transport(provider: ProviderKind, what: &str, e: &reqwest::Error) -> Failure {
    let mut message = format!("{provider} {what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    if e.is_timeout() {
        message.push_str(" (timed out)");
    }
    LlmError::new(LlmErrorKind::Transport, message).into()
}

/// The provider's id for the request, from the headers OpenAI (`x-request-id`) and
/// Anthropic (`request-id`) set.
pub(crate) fn header_request_id(headers: &HeaderMap) -> Option<String> {
    ["x-request-id", "request-id"]
        .iter()
        .filter_map(|h| headers.get(*h))
        .filter_map(|v| v.to_str().ok())
        .find(|v| !v.is_empty())
        .map(str::to_string)
}

impl Llm {
    /// A client over `config`. Fails only if the HTTP client cannot be built (TLS setup).
    pub fn new(config: LlmConfig) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout.min(Duration::from_secs(30)))
            .user_agent(concat!("sandcell-llm/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| LlmError::config(format!("cannot build the http client: {e}")))?;
        Ok(Self { http, config })
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &LlmConfig {
        &self.config
    }

    /// The cost in USD of `usage` on `model`; `None` when its price is unknown.
    pub fn cost(&self, model: &ModelRef, usage: &Usage) -> Option<f64> {
        self.config.prices.cost(model, usage)
    }

    /// One model call, with retries.
    ///
    /// Streams when `req.stream`: text and tool-call starts reach `on_delta` as they come.
    /// OpenAI streams ask for usage (`stream_options.include_usage`); tool-call fragments are
    /// assembled per index and their arguments parsed at the end (text that is not JSON
    /// becomes a `Value::String`); a usage chunk with empty or null `choices` is taken, and
    /// no usage at all gives an estimate marked `estimated`. Anthropic calls send
    /// `anthropic-version: 2023-06-01` and `x-api-key`, always `max_tokens`; input tokens
    /// come from `message_start`, output tokens from the last `message_delta`; tool input is
    /// parsed at `content_block_stop`; an `error` event mid-stream fails the attempt
    /// (`overloaded_error` is `Overloaded`, retried).
    ///
    /// Retries 408/409/429/5xx/529, transport errors and streams that drop before their end
    /// (the partial answer is discarded: `on_delta` gets `Retrying` first), waiting what the
    /// server's `retry-after`/`retry-after-ms` says (capped by `max_delay`), else exponential
    /// backoff with jitter. 400/401/403/404 fail at once with the provider's message.
    ///
    /// A missing key is a `Config` error naming its variable when the provider's base URL is
    /// the official one; a custom base URL (a local server) may take none, and none is sent.
    pub async fn chat(
        &self,
        provider: ProviderKind,
        req: &ChatRequest,
        on_delta: &mut (dyn FnMut(StreamDelta<'_>) + Send),
    ) -> Result<ChatResponse, LlmError> {
        let pc = self.config.provider(provider);
        let key = pc.api_key.as_deref().filter(|k| !k.is_empty());
        let official = pc.is_official(provider);
        if key.is_none() && official {
            return Err(LlmError::config(format!(
                "no API key for {provider}: set {}",
                pc.key_env
            )));
        }
        let base = normalize_base_url(&pc.base_url);
        let (url, body) = match provider {
            ProviderKind::OpenAi => (
                format!("{base}/chat/completions"),
                openai::request_body(req, official),
            ),
            ProviderKind::Anthropic => (
                format!("{base}/v1/messages"),
                anthropic::request_body(req).to_string().into_bytes(),
            ),
        };
        let started = Instant::now();
        let mut attempt: u32 = 1;
        loop {
            match self
                .attempt(provider, &url, &body, key, req, &mut *on_delta)
                .await
            {
                Ok(mut r) => {
                    r.attempts = attempt;
                    r.latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    return Ok(r);
                }
                Err(Failure {
                    mut error,
                    retry_after,
                }) => {
                    error.message = redact(error.message, key);
                    if error.retryable() && attempt <= self.config.retry.max_retries {
                        let wait = retry::delay(&self.config.retry, attempt, retry_after);
                        attempt += 1;
                        on_delta(StreamDelta::Retrying {
                            attempt,
                            delay_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                            reason: &error.message,
                        });
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    error.attempts = attempt;
                    return Err(error);
                }
            }
        }
    }

    async fn attempt(
        &self,
        provider: ProviderKind,
        url: &str,
        body: &[u8],
        key: Option<&str>,
        req: &ChatRequest,
        on_delta: &mut (dyn FnMut(StreamDelta<'_>) + Send),
    ) -> Result<ChatResponse, Failure> {
        let mut rb = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        match provider {
            ProviderKind::OpenAi => {
                if let Some(k) = key {
                    rb = rb.bearer_auth(k);
                }
            }
            ProviderKind::Anthropic => {
                rb = rb.header("anthropic-version", anthropic::API_VERSION);
                if let Some(k) = key {
                    rb = rb.header("x-api-key", k);
                }
            }
        }
        if req.stream {
            rb = rb.header(ACCEPT, "text/event-stream");
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| transport(provider, "request failed", &e))?;
        let request_id = header_request_id(resp.headers());
        let resp = failed_status(resp, &provider.to_string()).await?;
        // A server that ignores `stream` answers with one JSON body: take it as such.
        let is_json = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        let mut r = if req.stream && !is_json {
            match provider {
                ProviderKind::OpenAi => {
                    read_stream(resp, OpenAiStream::new(), provider, req, on_delta).await?
                }
                ProviderKind::Anthropic => {
                    read_stream(resp, AnthropicStream::new(), provider, req, on_delta).await?
                }
            }
        } else {
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| transport(provider, "answer dropped", &e))?;
            match provider {
                ProviderKind::OpenAi => openai::parse_response(&bytes, req)?,
                ProviderKind::Anthropic => anthropic::parse_response(&bytes, req)?,
            }
        };
        if request_id.is_some() {
            r.request_id = request_id;
        }
        Ok(r)
    }
}

/// Reads a stream of server-sent events through `asm` until the protocol's end marker or
/// the end of the body.
async fn read_stream<A: StreamAssembler + Send>(
    mut resp: reqwest::Response,
    mut asm: A,
    provider: ProviderKind,
    req: &ChatRequest,
    on_delta: &mut (dyn FnMut(StreamDelta<'_>) + Send),
) -> Result<ChatResponse, Failure> {
    let mut parser = SseParser::new();
    'read: loop {
        let chunk = resp
            .chunk()
            .await
            .map_err(|e| transport(provider, "stream dropped", &e))?;
        let Some(chunk) = chunk else { break };
        for ev in parser.push(&chunk) {
            asm.event(&ev, &mut *on_delta)?;
            if asm.is_done() {
                break 'read;
            }
        }
    }
    if !asm.is_done()
        && let Some(ev) = parser.finish()
    {
        asm.event(&ev, &mut *on_delta)?;
    }
    Ok(asm.finish(req)?)
}

/// An answer with an error status as a `Failure` (classified, with the provider's message
/// and its `retry-after`), or the answer itself; `who` names the provider (and the call).
pub(crate) async fn failed_status(
    resp: reqwest::Response,
    who: &str,
) -> Result<reqwest::Response, Failure> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let retry_after = retry::retry_after(resp.headers());
    // A body that cannot be read still leaves the status to classify by.
    let bytes = resp.bytes().await.unwrap_or_default();
    let (message, error_type) = parse_error_body(&bytes);
    let code = status.as_u16();
    let mut error = LlmError::new(
        classify(code, error_type.as_deref(), &message),
        format!("{who} returned {status}: {message}"),
    );
    error.status = Some(code);
    Err(Failure { error, retry_after })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    fn req() -> ChatRequest {
        ChatRequest {
            model: "gpt-4o-mini".into(),
            system: None,
            messages: vec![Message::user("hi")],
            tools: vec![],
            max_tokens: 16,
            temperature: None,
            stream: false,
        }
    }

    #[tokio::test]
    async fn missing_key_for_an_official_endpoint_names_the_variable() {
        let llm = Llm::new(LlmConfig::from_vars(|_| None)).unwrap();
        for (p, var) in [
            (ProviderKind::OpenAi, "OPENAI_API_KEY"),
            (ProviderKind::Anthropic, "ANTHROPIC_API_KEY"),
        ] {
            let e = llm.chat(p, &req(), &mut |_| {}).await.unwrap_err();
            assert_eq!(e.kind, LlmErrorKind::Config);
            assert_eq!(e.attempts, 0);
            assert!(e.message.contains(var), "{}", e.message);
        }
    }

    #[test]
    fn chat_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let llm = Llm::new(LlmConfig::default()).unwrap();
        let r = req();
        let mut cb = |_: StreamDelta<'_>| {};
        let fut = llm.chat(ProviderKind::OpenAi, &r, &mut cb);
        assert_send(&fut);
    }

    #[test]
    fn cost_uses_the_price_table() {
        let llm = Llm::new(LlmConfig::default()).unwrap();
        let m: ModelRef = "openai/gpt-4o-mini".parse().unwrap();
        let u = Usage {
            input_tokens: 1_000_000,
            output_tokens: 0,
            estimated: false,
        };
        assert_eq!(llm.cost(&m, &u), Some(0.15));
        let unknown: ModelRef = "openai/local".parse().unwrap();
        assert_eq!(llm.cost(&unknown, &u), None);
    }
}
