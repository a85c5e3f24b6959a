//! End to end over HTTP: a tiny scripted server on 127.0.0.1 answers canned bodies in each
//! protocol's wire format; the client must send the right requests, read the answers,
//! retry what is retryable and stop on what is not.

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::routing::post;
use sandcell_llm::{
    ChatRequest, FinishReason, Llm, LlmConfig, LlmErrorKind, Message, ProviderKind, RetryPolicy,
    StreamDelta,
};
use serde_json::{Value, json};

/// One canned answer.
enum Reply {
    /// A status, extra headers and a JSON body.
    Json(u16, Vec<(&'static str, &'static str)>, Value),
    /// A 200 event stream of these chunks.
    Sse(Vec<String>),
    /// A 200 event stream of these chunks, then the connection fails mid-body.
    SseCut(Vec<String>),
}

/// What the server received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Value,
}

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    seen: Vec<Seen>,
}

type Shared = Arc<Mutex<Script>>;

async fn handle(State(s): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let reply = {
        let mut s = s.lock().unwrap();
        s.seen.push(Seen {
            path: uri.path().to_string(),
            headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        });
        s.replies.pop_front()
    };
    match reply {
        Some(Reply::Json(status, headers, body)) => {
            let mut r = Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json");
            for (k, v) in headers {
                r = r.header(k, v);
            }
            r.body(Body::from(body.to_string())).unwrap()
        }
        Some(Reply::Sse(chunks)) => {
            let stream = futures_util::stream::iter(
                chunks
                    .into_iter()
                    .map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
            );
            Response::builder()
                .header("content-type", "text/event-stream")
                .header("x-request-id", "req_stream")
                .body(Body::from_stream(stream))
                .unwrap()
        }
        Some(Reply::SseCut(chunks)) => {
            // The chunks go out, then (after the client has had time to read them) the
            // body fails, which makes the server abort the connection mid-body.
            let items: VecDeque<Bytes> = chunks.into_iter().map(Bytes::from).collect();
            let stream = futures_util::stream::unfold(items, |mut items| async move {
                match items.pop_front() {
                    Some(b) => Some((Ok(b), items)),
                    None => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Some((Err(std::io::Error::other("cut")), items))
                    }
                }
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(stream))
                .unwrap()
        }
        None => Response::builder()
            .status(500)
            .body(Body::from("script exhausted"))
            .unwrap(),
    }
}

const OPENAI_KEY: &str = "sk-test-openai-0123456789";
const ANTHROPIC_KEY: &str = "sk-ant-test-0123456789";

struct Harness {
    llm: Llm,
    script: Shared,
}

impl Harness {
    async fn start(replies: Vec<Reply>) -> Self {
        let script: Shared = Arc::new(Mutex::new(Script {
            replies: replies.into(),
            seen: Vec::new(),
        }));
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .route("/v1/messages", post(handle))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let vars = move |name: &str| match name {
            "OPENAI_API_KEY" => Some(OPENAI_KEY.to_string()),
            "OPENAI_BASE_URL" => Some(format!("http://{addr}/v1")),
            "ANTHROPIC_API_KEY" => Some(ANTHROPIC_KEY.to_string()),
            "ANTHROPIC_BASE_URL" => Some(format!("http://{addr}/")),
            _ => None,
        };
        let mut config = LlmConfig::from_vars(vars);
        config.retry = RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(20),
        };
        config.request_timeout = Duration::from_secs(20);
        Self {
            llm: Llm::new(config).unwrap(),
            script,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.script.lock().unwrap().seen.clone()
    }

    fn pending(&self) -> usize {
        self.script.lock().unwrap().replies.len()
    }
}

fn request(model: &str, stream: bool) -> ChatRequest {
    ChatRequest {
        model: model.into(),
        system: Some("You are terse.".into()),
        messages: vec![Message::user("Say hi")],
        tools: vec![],
        max_tokens: 64,
        temperature: None,
        stream,
    }
}

/// Records every delta as a string.
fn recorder(log: &mut Vec<String>) -> impl FnMut(StreamDelta<'_>) + Send + '_ {
    move |d| {
        log.push(match d {
            StreamDelta::Text(t) => format!("text:{t}"),
            StreamDelta::ToolCallStarted { name } => format!("tool:{name}"),
            StreamDelta::Retrying {
                attempt,
                delay_ms,
                reason,
            } => format!("retry:{attempt}:{delay_ms}:{reason}"),
        })
    }
}

fn header<'a>(s: &'a Seen, name: &str) -> Option<&'a str> {
    s.headers.get(name).and_then(|v| v.to_str().ok())
}

fn openai_ok(text: &str) -> Reply {
    Reply::Json(
        200,
        vec![("x-request-id", "req_openai_1")],
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
        }),
    )
}

fn openai_stream_chunks() -> Vec<String> {
    let lines = [
        json!({"id":"chatcmpl-2","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}),
        json!({"id":"chatcmpl-2","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"lo"}}]}),
        json!({"id":"chatcmpl-2","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"run","arguments":"{\"co"}}]}}]}),
        json!({"id":"chatcmpl-2","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"de\":\"1\"}"}}]}}]}),
        json!({"id":"chatcmpl-2","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        json!({"id":"chatcmpl-2","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":8}}),
    ];
    let mut out: Vec<String> = lines.iter().map(|l| format!("data: {l}\n\n")).collect();
    out.push("data: [DONE]\n\n".into());
    out
}

fn anthropic_stream_chunks(text: &str) -> Vec<String> {
    let ev = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    vec![
        ev(
            "message_start",
            json!({"type":"message_start","message":{"id":"msg_s","type":"message","role":"assistant",
            "model":"claude-sonnet-4-5-20250929","content":[],"usage":{"input_tokens":30,"output_tokens":1}}}),
        ),
        ev(
            "content_block_start",
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        ),
        ev(
            "content_block_delta",
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}}),
        ),
        ev(
            "content_block_stop",
            json!({"type":"content_block_stop","index":0}),
        ),
        ev(
            "message_delta",
            json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}),
        ),
        ev("message_stop", json!({"type":"message_stop"})),
    ]
}

#[tokio::test]
async fn openai_non_streamed() {
    let h = Harness::start(vec![openai_ok("hi")]).await;
    let mut log = Vec::new();
    let r = h
        .llm
        .chat(
            ProviderKind::OpenAi,
            &request("gpt-4o-mini", false),
            &mut recorder(&mut log),
        )
        .await
        .unwrap();
    assert_eq!(r.text, "hi");
    assert_eq!(r.finish, FinishReason::Stop);
    assert_eq!(r.usage.input_tokens, 11);
    assert_eq!(r.usage.output_tokens, 2);
    assert!(!r.usage.estimated);
    assert_eq!(r.model, "gpt-4o-mini-2024-07-18");
    assert_eq!(r.request_id.as_deref(), Some("req_openai_1"));
    assert_eq!(r.attempts, 1);
    assert!(log.is_empty(), "{log:?}");
    let seen = h.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(
        header(&seen[0], "authorization"),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    assert_eq!(header(&seen[0], "x-api-key"), None);
    assert_eq!(seen[0].body["model"], "gpt-4o-mini");
    assert_eq!(seen[0].body["max_tokens"], 64);
    assert_eq!(
        seen[0].body["messages"][0],
        json!({"role": "system", "content": "You are terse."})
    );
    assert!(seen[0].body.get("stream").is_none());
}

#[tokio::test]
async fn openai_streamed() {
    let h = Harness::start(vec![Reply::Sse(openai_stream_chunks())]).await;
    let mut log = Vec::new();
    let r = h
        .llm
        .chat(
            ProviderKind::OpenAi,
            &request("gpt-4o-mini", true),
            &mut recorder(&mut log),
        )
        .await
        .unwrap();
    assert_eq!(r.text, "Hello");
    assert_eq!(r.finish, FinishReason::ToolCalls);
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].id, "call_1");
    assert_eq!(r.tool_calls[0].arguments, json!({"code": "1"}));
    assert_eq!(r.usage.input_tokens, 20);
    assert_eq!(r.usage.output_tokens, 8);
    assert_eq!(r.request_id.as_deref(), Some("req_stream"));
    assert_eq!(r.attempts, 1);
    assert_eq!(log, ["text:Hel", "text:lo", "tool:run"]);
    let seen = h.seen();
    assert_eq!(seen[0].body["stream"], true);
    assert_eq!(seen[0].body["stream_options"]["include_usage"], true);
}

#[tokio::test]
async fn anthropic_non_streamed() {
    let h = Harness::start(vec![Reply::Json(
        200,
        vec![("request-id", "req_ant_1")],
        json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": "hi"},
                        {"type": "tool_use", "id": "toolu_1", "name": "run", "input": {"code": "2"}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 15, "output_tokens": 4}
        }),
    )])
    .await;
    let r = h
        .llm
        .chat(
            ProviderKind::Anthropic,
            &request("claude-sonnet-4-5", false),
            &mut |_| {},
        )
        .await
        .unwrap();
    assert_eq!(r.text, "hi");
    assert_eq!(r.finish, FinishReason::ToolCalls);
    assert_eq!(r.tool_calls[0].name, "run");
    assert_eq!(r.tool_calls[0].arguments, json!({"code": "2"}));
    assert_eq!(r.usage.input_tokens, 15);
    assert_eq!(r.request_id.as_deref(), Some("req_ant_1"));
    assert_eq!(r.attempts, 1);
    let seen = h.seen();
    assert_eq!(seen[0].path, "/v1/messages");
    assert_eq!(header(&seen[0], "x-api-key"), Some(ANTHROPIC_KEY));
    assert_eq!(header(&seen[0], "anthropic-version"), Some("2023-06-01"));
    assert_eq!(header(&seen[0], "authorization"), None);
    assert_eq!(seen[0].body["system"], "You are terse.");
    assert_eq!(seen[0].body["max_tokens"], 64);
    assert_eq!(
        seen[0].body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}])
    );
}

#[tokio::test]
async fn anthropic_streamed() {
    let h = Harness::start(vec![Reply::Sse(anthropic_stream_chunks("Hello there"))]).await;
    let mut log = Vec::new();
    let r = h
        .llm
        .chat(
            ProviderKind::Anthropic,
            &request("claude-sonnet-4-5", true),
            &mut recorder(&mut log),
        )
        .await
        .unwrap();
    assert_eq!(r.text, "Hello there");
    assert_eq!(r.finish, FinishReason::Stop);
    assert_eq!(r.usage.input_tokens, 30);
    assert_eq!(r.usage.output_tokens, 5);
    assert_eq!(r.model, "claude-sonnet-4-5-20250929");
    assert_eq!(log, ["text:Hello there"]);
    assert_eq!(h.seen()[0].body["stream"], true);
}

#[tokio::test]
async fn rate_limited_then_success() {
    let h = Harness::start(vec![
        Reply::Json(
            429,
            vec![("retry-after", "0")],
            json!({"error": {"message": "Rate limit reached for gpt-4o-mini", "type": "requests"}}),
        ),
        openai_ok("after wait"),
    ])
    .await;
    let mut log = Vec::new();
    let r = h
        .llm
        .chat(
            ProviderKind::OpenAi,
            &request("gpt-4o-mini", false),
            &mut recorder(&mut log),
        )
        .await
        .unwrap();
    assert_eq!(r.text, "after wait");
    assert_eq!(r.attempts, 2);
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0].starts_with("retry:2:0:") && log[0].contains("Rate limit reached"),
        "{log:?}"
    );
    assert_eq!(h.seen().len(), 2);
}

#[tokio::test]
async fn stream_cut_in_the_middle_then_success() {
    let mut first = openai_stream_chunks();
    first.truncate(2); // "Hel", "lo", then the connection fails
    let h = Harness::start(vec![
        Reply::SseCut(first),
        Reply::Sse(openai_stream_chunks()),
    ])
    .await;
    let mut log = Vec::new();
    let r = h
        .llm
        .chat(
            ProviderKind::OpenAi,
            &request("gpt-4o-mini", true),
            &mut recorder(&mut log),
        )
        .await
        .unwrap();
    assert_eq!(r.attempts, 2);
    // The partial answer was discarded: the text is the second attempt's alone.
    assert_eq!(r.text, "Hello");
    assert_eq!(r.tool_calls.len(), 1);
    let retry_at = log.iter().position(|l| l.starts_with("retry:2:")).unwrap();
    // The first attempt's partial text reached the caller before the cut.
    assert_eq!(&log[..retry_at], ["text:Hel", "text:lo"], "{log:?}");
    // The connection failed mid-body (not a clean early end).
    assert!(log[retry_at].contains("stream dropped"), "{log:?}");
    assert_eq!(
        &log[retry_at + 1..],
        ["text:Hel", "text:lo", "tool:run"],
        "{log:?}"
    );
    assert_eq!(h.seen().len(), 2);
}

#[tokio::test]
async fn stream_ending_early_without_error_is_retried() {
    // The body ends cleanly but before [DONE] or a finish reason.
    let mut first = openai_stream_chunks();
    first.truncate(3);
    let h = Harness::start(vec![Reply::Sse(first), Reply::Sse(openai_stream_chunks())]).await;
    let r = h
        .llm
        .chat(
            ProviderKind::OpenAi,
            &request("gpt-4o-mini", true),
            &mut |_| {},
        )
        .await
        .unwrap();
    assert_eq!(r.attempts, 2);
    assert_eq!(r.text, "Hello");
}

#[tokio::test]
async fn anthropic_overloaded_mid_stream_then_success() {
    let mut first = anthropic_stream_chunks("partial");
    first.truncate(3);
    first.push(format!(
        "event: error\ndata: {}\n\n",
        json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})
    ));
    let h = Harness::start(vec![
        Reply::Sse(first),
        Reply::Sse(anthropic_stream_chunks("whole")),
    ])
    .await;
    let mut log = Vec::new();
    let r = h
        .llm
        .chat(
            ProviderKind::Anthropic,
            &request("claude-sonnet-4-5", true),
            &mut recorder(&mut log),
        )
        .await
        .unwrap();
    assert_eq!(r.text, "whole");
    assert_eq!(r.attempts, 2);
    assert!(
        log.iter()
            .any(|l| l.starts_with("retry:2:") && l.contains("Overloaded")),
        "{log:?}"
    );
}

#[tokio::test]
async fn unauthorized_fails_at_once_with_the_provider_message() {
    let h = Harness::start(vec![
        Reply::Json(
            401,
            vec![],
            json!({"error": {"message": format!("Incorrect API key provided: {OPENAI_KEY}."),
                   "type": "invalid_request_error", "code": "invalid_api_key"}}),
        ),
        openai_ok("must not be reached"),
    ])
    .await;
    let mut log = Vec::new();
    let e = h
        .llm
        .chat(
            ProviderKind::OpenAi,
            &request("gpt-4o-mini", false),
            &mut recorder(&mut log),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, LlmErrorKind::Auth);
    assert_eq!(e.status, Some(401));
    assert_eq!(e.attempts, 1);
    assert!(!e.retryable());
    assert!(
        e.message.contains("Incorrect API key provided"),
        "{}",
        e.message
    );
    // Even echoed back by the server, the key is not in the error.
    assert!(!e.message.contains(OPENAI_KEY), "{}", e.message);
    assert!(!format!("{e:?}").contains(OPENAI_KEY));
    assert!(log.is_empty());
    assert_eq!(h.seen().len(), 1);
    assert_eq!(h.pending(), 1);
}

#[tokio::test]
async fn anthropic_auth_error_message_comes_from_the_body() {
    let h = Harness::start(vec![Reply::Json(
        401,
        vec![],
        json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
    )])
    .await;
    let e = h
        .llm
        .chat(
            ProviderKind::Anthropic,
            &request("claude-sonnet-4-5", false),
            &mut |_| {},
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, LlmErrorKind::Auth);
    assert_eq!(e.attempts, 1);
    assert!(e.message.contains("invalid x-api-key"), "{}", e.message);
}

#[tokio::test]
async fn images_rejected_is_its_own_kind_and_not_retried() {
    let h = Harness::start(vec![Reply::Json(
        400,
        vec![],
        json!({"error": {"message": "Invalid content type. image_url is only supported by certain models.",
               "type": "invalid_request_error"}}),
    )])
    .await;
    let e = h
        .llm
        .chat(
            ProviderKind::OpenAi,
            &request("gpt-3.5-turbo", false),
            &mut |_| {},
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, LlmErrorKind::ImagesRejected);
    assert_eq!(e.wire_name(), "images_rejected");
    assert_eq!(e.attempts, 1);
}

#[tokio::test]
async fn server_errors_are_retried_until_the_policy_gives_up() {
    let busy = || {
        Reply::Json(
            529,
            vec![],
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        )
    };
    let h = Harness::start(vec![busy(), busy(), busy(), busy(), busy()]).await;
    let mut log = Vec::new();
    let e = h
        .llm
        .chat(
            ProviderKind::Anthropic,
            &request("claude-sonnet-4-5", false),
            &mut recorder(&mut log),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, LlmErrorKind::Overloaded);
    assert_eq!(e.status, Some(529));
    // max_retries = 3: four attempts, three announced retries.
    assert_eq!(e.attempts, 4);
    assert_eq!(log.len(), 3, "{log:?}");
    assert_eq!(h.seen().len(), 4);
}

#[tokio::test]
async fn a_local_server_takes_no_key() {
    let h = Harness::start(vec![openai_ok("local")]).await;
    let mut config = h.llm.config().clone();
    config.openai.api_key = None;
    let llm = Llm::new(config).unwrap();
    let r = llm
        .chat(ProviderKind::OpenAi, &request("llama3", false), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(r.text, "local");
    assert_eq!(header(&h.seen()[0], "authorization"), None);
}

#[tokio::test]
async fn connection_refused_is_a_retried_transport_error() {
    // Bind then drop a listener: its port refuses connections.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut config = LlmConfig::from_vars(|_| None);
    config.openai.base_url = format!("http://127.0.0.1:{port}/v1");
    config.retry = RetryPolicy {
        max_retries: 1,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    };
    let llm = Llm::new(config).unwrap();
    let e = llm
        .chat(ProviderKind::OpenAi, &request("m", false), &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(e.kind, LlmErrorKind::Transport);
    assert_eq!(e.attempts, 2);
    assert_eq!(e.status, None);
}
