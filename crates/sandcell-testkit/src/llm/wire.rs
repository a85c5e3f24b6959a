//! The answers as the public APIs shape them: JSON bodies, server-sent event streams and
//! error bodies of OpenAI Chat Completions and Anthropic Messages.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use serde_json::{Value, json};

use super::{Fault, ScriptedCall, Turn, Usage, pieces};

/// What one request gets back, before it becomes an HTTP response.
pub(crate) enum Rendered {
    /// A JSON body with this status (and `retry-after` when set).
    Json {
        status: u16,
        body: Value,
        retry_after: Option<String>,
    },
    /// 200 and a server-sent event stream.
    Stream(Vec<Step>),
    /// The connection closes without a response.
    Drop,
}

/// One step of a streamed answer.
pub(crate) enum Step {
    /// Bytes to send (one or more whole events).
    Data(Bytes),
    /// A pause, so what was sent is flushed before what follows (a drop, say).
    Pause(Duration),
    /// The connection breaks: no terminator, no end of the chunked body.
    Fail,
}

/// What the rendering of one answer needs to know about its request.
pub(crate) struct Ctx {
    /// The request's number, for ids.
    pub seq: u64,
    /// The `model` the request named, echoed as real services do.
    pub model: String,
    pub usage: Usage,
    pub chunk_bytes: usize,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
}

impl Ctx {
    /// The `x-request-id` / `request-id` header's value.
    pub fn request_id(&self) -> String {
        format!("req_scripted{}", self.seq)
    }
}

/// How long a dropped stream waits after its last event, so those events reach the client
/// before the connection breaks.
const DROP_PAUSE: Duration = Duration::from_millis(50);

/// The text a dropped or overloaded stream sends before it fails.
const PARTIAL: &str = "partial answer, never finished";

/// Text and tool calls of an answer.
struct Reply<'a> {
    text: Option<&'a str>,
    calls: &'a [ScriptedCall],
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn args_string(v: &Value) -> String {
    // Serializing a Value cannot fail (its map keys are strings).
    serde_json::to_string(v).unwrap_or_else(|_| "{}".to_string())
}

fn to_string(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn data_line(v: &Value) -> Step {
    Step::Data(Bytes::from(format!("data: {}\n\n", to_string(v))))
}

fn event(name: &str, v: &Value) -> Step {
    Step::Data(Bytes::from(format!(
        "event: {name}\ndata: {}\n\n",
        to_string(v)
    )))
}

/// Renders `turn` (delays already waited) in `protocol`'s shape.
pub(crate) fn render(protocol: super::Protocol, turn: &Turn, ctx: &Ctx) -> Rendered {
    let reply = match turn {
        Turn::Text(t) => Reply {
            text: Some(t),
            calls: &[],
        },
        Turn::ToolCalls(c) => Reply {
            text: None,
            calls: c,
        },
        Turn::TextAndToolCalls(t, c) => Reply {
            text: Some(t),
            calls: c,
        },
        Turn::Fault(Fault::Slow { then, .. }) => return render(protocol, then, ctx),
        Turn::Fault(f) => {
            return match protocol {
                super::Protocol::OpenAi => openai_fault(f, ctx),
                super::Protocol::Anthropic => anthropic_fault(f, ctx),
            };
        }
    };
    match (protocol, ctx.stream) {
        (super::Protocol::OpenAi, false) => Rendered::Json {
            status: 200,
            body: openai_completion(&reply, ctx),
            retry_after: None,
        },
        (super::Protocol::OpenAi, true) => Rendered::Stream(openai_stream(&reply, ctx)),
        (super::Protocol::Anthropic, false) => Rendered::Json {
            status: 200,
            body: anthropic_message(&reply, ctx),
            retry_after: None,
        },
        (super::Protocol::Anthropic, true) => Rendered::Stream(anthropic_stream(&reply, ctx)),
    }
}

// ---------------------------------------------------------------------------------------
// OpenAI Chat Completions

fn openai_call_id(ctx: &Ctx, i: usize) -> String {
    format!("call_scripted{}x{i}", ctx.seq)
}

fn openai_usage(u: Usage) -> Value {
    json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
    })
}

fn openai_finish(reply: &Reply<'_>) -> &'static str {
    if reply.calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn openai_completion(reply: &Reply<'_>, ctx: &Ctx) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": reply.text,
        "refusal": null,
    });
    if !reply.calls.is_empty() {
        let calls: Vec<Value> = reply
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "id": openai_call_id(ctx, i),
                    "type": "function",
                    "function": {"name": c.name, "arguments": args_string(&c.arguments)},
                })
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": format!("chatcmpl-scripted{}", ctx.seq),
        "object": "chat.completion",
        "created": now_secs(),
        "model": ctx.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": openai_finish(reply),
        }],
        "usage": openai_usage(ctx.usage),
    })
}

/// Builds `chat.completion.chunk` objects sharing one id and timestamp.
struct Chunks<'a> {
    ctx: &'a Ctx,
    id: String,
    created: u64,
}

impl Chunks<'_> {
    fn base(&self) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.ctx.model,
        })
    }

    fn choice(&self, delta: Value, finish: Option<&str>) -> Step {
        let mut c = self.base();
        c["choices"] =
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
        // With include_usage every chunk carries `usage`, null until the last one.
        if self.ctx.include_usage {
            c["usage"] = Value::Null;
        }
        data_line(&c)
    }

    fn usage(&self) -> Step {
        let mut c = self.base();
        c["choices"] = json!([]);
        c["usage"] = openai_usage(self.ctx.usage);
        data_line(&c)
    }
}

fn openai_chunks(ctx: &Ctx) -> Chunks<'_> {
    Chunks {
        ctx,
        id: format!("chatcmpl-scripted{}", ctx.seq),
        created: now_secs(),
    }
}

fn openai_stream(reply: &Reply<'_>, ctx: &Ctx) -> Vec<Step> {
    let ch = openai_chunks(ctx);
    let mut out = vec![ch.choice(
        json!({"role": "assistant", "content": reply.text.map(|_| ""), "refusal": null}),
        None,
    )];
    if let Some(text) = reply.text {
        for p in pieces(text, ctx.chunk_bytes) {
            out.push(ch.choice(json!({"content": p}), None));
        }
    }
    // Each call's fragments: the first names it (index, id, type, name), the rest carry
    // only pieces of `arguments`; parallel calls take turns, so fragments of different
    // calls interleave and only `index` tells them apart.
    let fragments: Vec<Vec<Value>> = reply
        .calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let args = args_string(&c.arguments);
            let mut f = vec![json!({"tool_calls": [{
                "index": i,
                "id": openai_call_id(ctx, i),
                "type": "function",
                "function": {"name": c.name, "arguments": ""},
            }]})];
            f.extend(
                pieces(&args, ctx.chunk_bytes)
                    .into_iter()
                    .map(|p| json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]})),
            );
            f
        })
        .collect();
    let rounds = fragments.iter().map(Vec::len).max().unwrap_or(0);
    for r in 0..rounds {
        for f in &fragments {
            if let Some(delta) = f.get(r) {
                out.push(ch.choice(delta.clone(), None));
            }
        }
    }
    out.push(ch.choice(json!({}), Some(openai_finish(reply))));
    if ctx.include_usage {
        out.push(ch.usage());
    }
    out.push(Step::Data(Bytes::from_static(b"data: [DONE]\n\n")));
    out
}

/// The `type` and `code` OpenAI gives an error of `status`.
fn openai_error_kind(status: u16) -> (&'static str, Option<&'static str>) {
    match status {
        401 => ("invalid_request_error", Some("invalid_api_key")),
        429 => ("requests", Some("rate_limit_exceeded")),
        500..=599 => ("server_error", None),
        _ => ("invalid_request_error", None),
    }
}

/// OpenAI's error body.
pub(crate) fn openai_error(status: u16, message: &str) -> Value {
    let (kind, code) = openai_error_kind(status);
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

fn openai_fault(f: &Fault, ctx: &Ctx) -> Rendered {
    match f {
        Fault::Status {
            status,
            retry_after,
            message,
        } => Rendered::Json {
            status: *status,
            body: openai_error(*status, message),
            retry_after: retry_after.clone(),
        },
        Fault::Unauthorized => Rendered::Json {
            status: 401,
            body: openai_error(
                401,
                "Incorrect API key provided. You can find your API key in your account settings.",
            ),
            retry_after: None,
        },
        Fault::Overloaded => Rendered::Json {
            status: 503,
            body: openai_error(503, "The server is overloaded or not ready yet."),
            retry_after: None,
        },
        Fault::DropStream if ctx.stream => {
            let ch = openai_chunks(ctx);
            let mut out = vec![ch.choice(
                json!({"role": "assistant", "content": "", "refusal": null}),
                None,
            )];
            for p in pieces(PARTIAL, ctx.chunk_bytes).into_iter().take(3) {
                out.push(ch.choice(json!({"content": p}), None));
            }
            out.extend([Step::Pause(DROP_PAUSE), Step::Fail]);
            Rendered::Stream(out)
        }
        Fault::DropStream => Rendered::Drop,
        Fault::Slow { then, .. } => render(super::Protocol::OpenAi, then, ctx),
    }
}

// ---------------------------------------------------------------------------------------
// Anthropic Messages

fn anthropic_tool_id(ctx: &Ctx, i: usize) -> String {
    format!("toolu_scripted{}x{i}", ctx.seq)
}

fn anthropic_stop(reply: &Reply<'_>) -> &'static str {
    if reply.calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

/// Whether the answer has a text block: always for a text answer, and before tool calls
/// when the text is not empty.
fn anthropic_text<'a>(reply: &Reply<'a>) -> Option<&'a str> {
    reply
        .text
        .filter(|t| reply.calls.is_empty() || !t.is_empty())
}

fn anthropic_message(reply: &Reply<'_>, ctx: &Ctx) -> Value {
    let mut content = Vec::new();
    if let Some(t) = anthropic_text(reply) {
        content.push(json!({"type": "text", "text": t}));
    }
    for (i, c) in reply.calls.iter().enumerate() {
        content.push(json!({
            "type": "tool_use",
            "id": anthropic_tool_id(ctx, i),
            "name": c.name,
            "input": c.arguments,
        }));
    }
    json!({
        "id": format!("msg_scripted{}", ctx.seq),
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": anthropic_stop(reply),
        "stop_sequence": null,
        "usage": {"input_tokens": ctx.usage.input_tokens, "output_tokens": ctx.usage.output_tokens},
    })
}

/// `message_start` (the message with no content yet, input tokens, 1 output token so far)
/// and a `ping`, as the real stream opens.
fn anthropic_open(ctx: &Ctx) -> Vec<Step> {
    let start = json!({
        "type": "message_start",
        "message": {
            "id": format!("msg_scripted{}", ctx.seq),
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {
                "input_tokens": ctx.usage.input_tokens,
                "output_tokens": ctx.usage.output_tokens.min(1),
            },
        },
    });
    vec![
        event("message_start", &start),
        event("ping", &json!({"type": "ping"})),
    ]
}

fn block_start(index: usize, block: Value) -> Step {
    event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": index, "content_block": block}),
    )
}

fn block_delta(index: usize, delta: Value) -> Step {
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

fn block_stop(index: usize) -> Step {
    event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": index}),
    )
}

fn anthropic_stream(reply: &Reply<'_>, ctx: &Ctx) -> Vec<Step> {
    let mut out = anthropic_open(ctx);
    let mut index = 0;
    if let Some(t) = anthropic_text(reply) {
        out.push(block_start(index, json!({"type": "text", "text": ""})));
        for p in pieces(t, ctx.chunk_bytes) {
            out.push(block_delta(index, json!({"type": "text_delta", "text": p})));
        }
        out.push(block_stop(index));
        index += 1;
    }
    for (i, c) in reply.calls.iter().enumerate() {
        out.push(block_start(
            index,
            json!({"type": "tool_use", "id": anthropic_tool_id(ctx, i), "name": c.name, "input": {}}),
        ));
        for p in pieces(&args_string(&c.arguments), ctx.chunk_bytes) {
            out.push(block_delta(
                index,
                json!({"type": "input_json_delta", "partial_json": p}),
            ));
        }
        out.push(block_stop(index));
        index += 1;
    }
    // `usage.output_tokens` here is the running total for the whole message, not an
    // increment over message_start's.
    out.push(event(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": anthropic_stop(reply), "stop_sequence": null},
            "usage": {"output_tokens": ctx.usage.output_tokens},
        }),
    ));
    out.push(event("message_stop", &json!({"type": "message_stop"})));
    out
}

/// The `error.type` Anthropic gives an error of `status`.
fn anthropic_error_kind(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Anthropic's error body.
pub(crate) fn anthropic_error(status: u16, message: &str, ctx: &Ctx) -> Value {
    json!({
        "type": "error",
        "error": {"type": anthropic_error_kind(status), "message": message},
        "request_id": ctx.request_id(),
    })
}

fn anthropic_fault(f: &Fault, ctx: &Ctx) -> Rendered {
    let partial = |out: &mut Vec<Step>| {
        out.push(block_start(0, json!({"type": "text", "text": ""})));
        for p in pieces(PARTIAL, ctx.chunk_bytes).into_iter().take(3) {
            out.push(block_delta(0, json!({"type": "text_delta", "text": p})));
        }
    };
    match f {
        Fault::Status {
            status,
            retry_after,
            message,
        } => Rendered::Json {
            status: *status,
            body: anthropic_error(*status, message, ctx),
            retry_after: retry_after.clone(),
        },
        Fault::Unauthorized => Rendered::Json {
            status: 401,
            body: anthropic_error(401, "invalid x-api-key", ctx),
            retry_after: None,
        },
        Fault::Overloaded if ctx.stream => {
            let mut out = anthropic_open(ctx);
            partial(&mut out);
            out.push(event(
                "error",
                &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ));
            Rendered::Stream(out)
        }
        Fault::Overloaded => Rendered::Json {
            status: 529,
            body: anthropic_error(529, "Overloaded", ctx),
            retry_after: None,
        },
        Fault::DropStream if ctx.stream => {
            let mut out = anthropic_open(ctx);
            partial(&mut out);
            out.extend([Step::Pause(DROP_PAUSE), Step::Fail]);
            Rendered::Stream(out)
        }
        Fault::DropStream => Rendered::Drop,
        Fault::Slow { then, .. } => render(super::Protocol::Anthropic, then, ctx),
    }
}
