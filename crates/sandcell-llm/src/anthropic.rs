//! The Anthropic Messages protocol: the request body, the answer, and the stream.
//! Pure functions; the client sends and retries.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::error::{LlmError, LlmErrorKind, classify_stream_error};
use crate::message::{ChatRequest, Image, Part, Role, ToolCall};
use crate::response::{
    ChatResponse, FinishReason, StreamAssembler, StreamDelta, parse_arguments, usage_or_estimate,
};
use crate::sse::SseEvent;

/// The API version sent in `anthropic-version`.
pub(crate) const API_VERSION: &str = "2023-06-01";

/// The request body: `system` at the top, `max_tokens` always, consecutive messages of one
/// role merged (the protocol requires user and assistant to alternate), tool results first
/// in their user message (the protocol requires it), images inside the tool results.
pub(crate) fn request_body(req: &ChatRequest) -> Value {
    let mut messages: Vec<(Role, Vec<Value>)> = Vec::new();
    for m in &req.messages {
        let blocks: Vec<Value> = m.content.iter().filter_map(block).collect();
        match messages.last_mut() {
            Some((role, content)) if *role == m.role => content.extend(blocks),
            _ => messages.push((m.role, blocks)),
        }
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .filter(|(_, content)| !content.is_empty())
        .map(|(role, mut content)| {
            if role == Role::User {
                // Stable: results keep their order, other blocks keep theirs.
                content.sort_by_key(|b| b["type"] != "tool_result");
            }
            let role = match role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            json!({"role": role, "content": content})
        })
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("max_tokens".into(), json!(req.max_tokens));
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        body.insert("system".into(), json!(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), crate::openai::temperature(t));
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if req.stream {
        body.insert("stream".into(), json!(true));
    }
    Value::Object(body)
}

fn image_block(i: &Image) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": i.media_type, "data": i.data}})
}

/// One part as a content block; `None` for what the protocol rejects (empty text).
fn block(p: &Part) -> Option<Value> {
    match p {
        Part::Text(t) if t.is_empty() => None,
        Part::Text(t) => Some(json!({"type": "text", "text": t})),
        Part::Image(i) => Some(image_block(i)),
        Part::ToolCall(c) => {
            // `input` must be an object; arguments that were not JSON are kept visible.
            let input = match &c.arguments {
                Value::Object(_) => c.arguments.clone(),
                Value::Null => json!({}),
                other => json!({"raw_arguments": other}),
            };
            Some(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}))
        }
        Part::ToolResult(r) => {
            let content: Vec<Value> = r
                .content
                .iter()
                .filter_map(|p| match p {
                    Part::Text(t) if !t.is_empty() => Some(json!({"type": "text", "text": t})),
                    Part::Image(i) => Some(image_block(i)),
                    _ => None,
                })
                .collect();
            let mut b = Map::new();
            b.insert("type".into(), json!("tool_result"));
            b.insert("tool_use_id".into(), json!(r.call_id));
            if !content.is_empty() {
                b.insert("content".into(), Value::Array(content));
            }
            b.insert("is_error".into(), json!(r.is_error));
            Some(Value::Object(b))
        }
    }
}

/// Anthropic's stop reason.
pub(crate) fn finish_reason(s: Option<&str>, has_calls: bool) -> FinishReason {
    match s {
        Some("end_turn") | Some("stop_sequence") => FinishReason::Stop,
        Some("tool_use") => FinishReason::ToolCalls,
        Some("max_tokens") => FinishReason::Length,
        Some("refusal") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_string()),
        None if has_calls => FinishReason::ToolCalls,
        None => FinishReason::Stop,
    }
}

/// Input tokens from a `usage` object: cache reads and writes are prompt tokens too.
fn input_tokens(u: &Value) -> Option<u64> {
    let base = u.get("input_tokens").and_then(Value::as_u64)?;
    let cached: u64 = ["cache_creation_input_tokens", "cache_read_input_tokens"]
        .iter()
        .filter_map(|k| u.get(*k).and_then(Value::as_u64))
        .sum();
    Some(base + cached)
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn decode_error(what: &str, e: impl std::fmt::Display) -> LlmError {
    LlmError::new(
        LlmErrorKind::Decode,
        format!("anthropic answer is not understood: {what}: {e}"),
    )
}

/// An `{"type":"error","error":{"type","message"}}` body or stream event, as an error.
fn error_event(v: &Value) -> LlmError {
    let err = v.get("error").unwrap_or(&Value::Null);
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("unknown error");
    let ty = err.get("type").and_then(Value::as_str);
    LlmError::new(
        classify_stream_error(ty, message),
        format!("anthropic reported {}: {message}", ty.unwrap_or("an error")),
    )
}

/// A whole (non-streamed) answer.
pub(crate) fn parse_response(body: &[u8], req: &ChatRequest) -> Result<ChatResponse, LlmError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| decode_error("invalid JSON", e))?;
    if v.get("type").and_then(Value::as_str) == Some("error") {
        return Err(error_event(&v));
    }
    let content = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| decode_error("no content", "the answer has no content array"))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for b in content {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => tool_calls.push(ToolCall {
                id: str_field(b, "id").unwrap_or_default().to_string(),
                name: str_field(b, "name").unwrap_or_default().to_string(),
                arguments: b.get("input").cloned().unwrap_or_else(|| json!({})),
            }),
            // thinking and server-tool blocks are not part of the answer we hand back.
            _ => {}
        }
    }
    let finish = finish_reason(
        v.get("stop_reason").and_then(Value::as_str),
        !tool_calls.is_empty(),
    );
    let reported = v.get("usage").and_then(|u| {
        let output = u.get("output_tokens").and_then(Value::as_u64)?;
        Some((input_tokens(u).unwrap_or(0), output))
    });
    let usage = usage_or_estimate(reported, req, &text, &tool_calls);
    Ok(ChatResponse {
        text,
        tool_calls,
        finish,
        usage,
        model: str_field(&v, "model").unwrap_or(&req.model).to_string(),
        request_id: str_field(&v, "id").map(str::to_string),
        attempts: 0,
        latency_ms: 0,
    })
}

#[derive(Debug)]
struct ToolBlock {
    id: String,
    name: String,
    initial: Value,
    json: String,
    parsed: Option<Value>,
}

impl ToolBlock {
    fn parse(&self) -> Value {
        if self.json.trim().is_empty() {
            // No deltas: the input came whole in content_block_start (usually `{}`).
            if self.initial.is_object() {
                self.initial.clone()
            } else {
                json!({})
            }
        } else {
            parse_arguments(&self.json)
        }
    }
}

/// Assembles a streamed answer: `message_start` (id, model, input tokens), text and
/// `input_json_delta` fragments per block (tool input parsed at `content_block_stop`),
/// `message_delta` (stop reason; cumulative output tokens: the last one counts), `error`
/// events, and `message_stop` as the end.
#[derive(Debug, Default)]
pub(crate) struct AnthropicStream {
    id: Option<String>,
    model: Option<String>,
    text: String,
    tools: BTreeMap<u64, ToolBlock>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    stop_reason: Option<String>,
    done: bool,
}

impl AnthropicStream {
    pub(crate) fn new() -> Self {
        Self::default()
    }
}

impl StreamAssembler for AnthropicStream {
    fn event(
        &mut self,
        ev: &SseEvent,
        on_delta: &mut dyn FnMut(StreamDelta<'_>),
    ) -> Result<(), LlmError> {
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        let v: Value = serde_json::from_str(data).map_err(|e| decode_error("a stream event", e))?;
        // The data's `type` is authoritative; the `event:` line says the same.
        let ty = v.get("type").and_then(Value::as_str).unwrap_or(&ev.event);
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match ty {
            "message_start" => {
                let m = v.get("message").unwrap_or(&Value::Null);
                self.id = str_field(m, "id").map(str::to_string);
                self.model = str_field(m, "model").map(str::to_string);
                if let Some(u) = m.get("usage") {
                    self.input_tokens = input_tokens(u).or(self.input_tokens);
                    self.output_tokens = u
                        .get("output_tokens")
                        .and_then(Value::as_u64)
                        .or(self.output_tokens);
                }
            }
            "content_block_start" => {
                let b = v.get("content_block").unwrap_or(&Value::Null);
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(t) = b.get("text").and_then(Value::as_str)
                            && !t.is_empty()
                        {
                            self.text.push_str(t);
                            on_delta(StreamDelta::Text(t));
                        }
                    }
                    Some("tool_use") => {
                        let block = ToolBlock {
                            id: str_field(b, "id").unwrap_or_default().to_string(),
                            name: str_field(b, "name").unwrap_or_default().to_string(),
                            initial: b.get("input").cloned().unwrap_or(Value::Null),
                            json: String::new(),
                            parsed: None,
                        };
                        on_delta(StreamDelta::ToolCallStarted { name: &block.name });
                        self.tools.insert(index, block);
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let d = v.get("delta").unwrap_or(&Value::Null);
                match d.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        if let Some(t) = d.get("text").and_then(Value::as_str)
                            && !t.is_empty()
                        {
                            self.text.push_str(t);
                            on_delta(StreamDelta::Text(t));
                        }
                    }
                    Some("input_json_delta") => {
                        if let Some(block) = self.tools.get_mut(&index)
                            && let Some(j) = d.get("partial_json").and_then(Value::as_str)
                        {
                            block.json.push_str(j);
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(block) = self.tools.get_mut(&index) {
                    block.parsed = Some(block.parse());
                }
            }
            "message_delta" => {
                if let Some(s) = v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(s.to_string());
                }
                if let Some(u) = v.get("usage") {
                    // Cumulative: replace, never add.
                    if let Some(o) = u.get("output_tokens").and_then(Value::as_u64) {
                        self.output_tokens = Some(o);
                    }
                    if let Some(i) = input_tokens(u) {
                        self.input_tokens = Some(i);
                    }
                }
            }
            "message_stop" => self.done = true,
            "error" => return Err(error_event(&v)),
            // ping, and event types added later.
            _ => {}
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        if !self.done && self.stop_reason.is_none() {
            return Err(LlmError::new(
                LlmErrorKind::Transport,
                "anthropic stream ended before the answer was complete",
            ));
        }
        let tool_calls: Vec<ToolCall> = self
            .tools
            .into_values()
            .map(|b| {
                let arguments = b.parsed.clone().unwrap_or_else(|| b.parse());
                ToolCall {
                    id: b.id,
                    name: b.name,
                    arguments,
                }
            })
            .collect();
        let finish = finish_reason(self.stop_reason.as_deref(), !tool_calls.is_empty());
        let reported = match (self.input_tokens, self.output_tokens) {
            (None, None) => None,
            (i, o) => Some((i.unwrap_or(0), o.unwrap_or(0))),
        };
        let usage = usage_or_estimate(reported, req, &self.text, &tool_calls);
        Ok(ChatResponse {
            text: self.text,
            tool_calls,
            finish,
            usage,
            model: self.model.unwrap_or_else(|| req.model.clone()),
            request_id: self.id,
            attempts: 0,
            latency_ms: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, ToolResult, ToolSpec};
    use crate::response::Usage;
    use crate::sse::SseParser;

    fn png(data: &str) -> Image {
        Image {
            media_type: "image/png".into(),
            data: data.into(),
        }
    }

    fn req(messages: Vec<Message>) -> ChatRequest {
        ChatRequest {
            model: "claude-sonnet-4-5".into(),
            system: Some("be brief".into()),
            messages,
            tools: vec![ToolSpec {
                name: "run".into(),
                description: "runs code".into(),
                parameters: json!({"type": "object"}),
            }],
            max_tokens: 1024,
            temperature: None,
            stream: false,
        }
    }

    #[test]
    fn maps_system_tools_results_images_and_merges_roles() {
        let r = req(vec![
            Message::user("first"),
            Message {
                role: Role::User,
                content: vec![Part::Text("second".into()), Part::Image(png("U1"))],
            },
            Message {
                role: Role::Assistant,
                content: vec![
                    Part::Text("ok".into()),
                    Part::ToolCall(ToolCall {
                        id: "toolu_1".into(),
                        name: "run".into(),
                        arguments: json!({"code": "plot()"}),
                    }),
                ],
            },
            Message {
                role: Role::User,
                content: vec![Part::ToolResult(ToolResult {
                    call_id: "toolu_1".into(),
                    content: vec![Part::Text("done".into()), Part::Image(png("T1"))],
                    is_error: true,
                })],
            },
            Message::user("and now?"),
        ]);
        let body = request_body(&r);
        assert_eq!(body["model"], "claude-sonnet-4-5");
        assert_eq!(body["max_tokens"], 1024);
        assert_eq!(body["system"], "be brief");
        assert!(body.get("temperature").is_none());
        assert!(body.get("stream").is_none());
        assert_eq!(
            body["tools"],
            json!([{"name": "run", "description": "runs code", "input_schema": {"type": "object"}}])
        );
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3, "{m:#?}");
        assert_eq!(m[0]["role"], "user");
        assert_eq!(
            m[0]["content"],
            json!([
                {"type": "text", "text": "first"},
                {"type": "text", "text": "second"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "U1"}}
            ])
        );
        assert_eq!(m[1]["role"], "assistant");
        assert_eq!(
            m[1]["content"][1],
            json!({"type": "tool_use", "id": "toolu_1", "name": "run", "input": {"code": "plot()"}})
        );
        assert_eq!(m[2]["role"], "user");
        assert_eq!(
            m[2]["content"][0],
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true, "content": [
                {"type": "text", "text": "done"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "T1"}}
            ]})
        );
        assert_eq!(
            m[2]["content"][1],
            json!({"type": "text", "text": "and now?"})
        );
    }

    #[test]
    fn tool_results_go_first_in_a_merged_user_message() {
        let r = req(vec![
            Message {
                role: Role::Assistant,
                content: vec![Part::ToolCall(ToolCall {
                    id: "t".into(),
                    name: "run".into(),
                    arguments: Value::String("{bad".into()),
                })],
            },
            Message::user("note first"),
            Message {
                role: Role::User,
                content: vec![Part::ToolResult(ToolResult {
                    call_id: "t".into(),
                    content: vec![],
                    is_error: false,
                })],
            },
        ]);
        let body = request_body(&r);
        let m = body["messages"].as_array().unwrap();
        assert_eq!(
            m[0]["content"][0]["input"],
            json!({"raw_arguments": "{bad"})
        );
        assert_eq!(m[1]["content"][0]["type"], "tool_result");
        assert!(m[1]["content"][0].get("content").is_none());
        assert_eq!(m[1]["content"][1]["text"], "note first");
    }

    #[test]
    fn parses_a_whole_answer() {
        let body = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929",
            "content":[{"type":"text","text":"Let me run it."},
                       {"type":"tool_use","id":"toolu_1","name":"run","input":{"code":"1+1"}}],
            "stop_reason":"tool_use","stop_sequence":null,
            "usage":{"input_tokens":20,"cache_read_input_tokens":5,"output_tokens":9}}"#;
        let r = parse_response(body, &req(vec![])).unwrap();
        assert_eq!(r.text, "Let me run it.");
        assert_eq!(r.finish, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls[0].arguments, json!({"code": "1+1"}));
        assert_eq!(r.usage.input_tokens, 25);
        assert_eq!(r.usage.output_tokens, 9);
        assert!(!r.usage.estimated);
        assert_eq!(r.model, "claude-sonnet-4-5-20250929");
        assert_eq!(r.request_id.as_deref(), Some("msg_1"));
    }

    fn event(name: &str, data: Value) -> String {
        format!("event: {name}\ndata: {data}\n\n")
    }

    fn run_stream(body: &str, cut: usize) -> (Result<ChatResponse, LlmError>, Vec<String>) {
        let mut parser = SseParser::new();
        let mut asm = AnthropicStream::new();
        let mut seen = Vec::new();
        let mut on_delta = |d: StreamDelta<'_>| match d {
            StreamDelta::Text(t) => seen.push(format!("text:{t}")),
            StreamDelta::ToolCallStarted { name } => seen.push(format!("tool:{name}")),
            StreamDelta::Retrying { .. } => seen.push("retry".into()),
        };
        let bytes = body.as_bytes();
        let cut = cut.min(bytes.len());
        let mut events = parser.push(&bytes[..cut]);
        events.extend(parser.push(&bytes[cut..]));
        events.extend(parser.finish());
        for ev in &events {
            if let Err(e) = asm.event(ev, &mut on_delta) {
                return (Err(e), seen);
            }
        }
        (asm.finish(&req(vec![Message::user("go")])), seen)
    }

    fn tool_stream() -> String {
        [
            event(
                "message_start",
                json!({"type":"message_start","message":{"id":"msg_9","type":"message","role":"assistant",
                "model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,
                "usage":{"input_tokens":100,"output_tokens":1}}}),
            ),
            event(
                "content_block_start",
                json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
            ),
            event("ping", json!({"type":"ping"})),
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Running"}}),
            ),
            event(
                "content_block_stop",
                json!({"type":"content_block_stop","index":0}),
            ),
            event(
                "content_block_start",
                json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_9","name":"run","input":{}}}),
            ),
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}),
            ),
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"code\": \"pri"}}),
            ),
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"nt(1)\"}"}}),
            ),
            event(
                "content_block_stop",
                json!({"type":"content_block_stop","index":1}),
            ),
            event(
                "message_delta",
                json!({"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":10}}),
            ),
            event(
                "message_delta",
                json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}),
            ),
            event("message_stop", json!({"type":"message_stop"})),
        ]
        .concat()
    }

    #[test]
    fn assembles_text_tool_input_and_cumulative_usage() {
        let body = tool_stream();
        for cut in [0, 1, 50, 311, 700, body.len() / 2, body.len() - 2] {
            let (res, seen) = run_stream(&body, cut);
            let res = res.unwrap();
            assert_eq!(res.text, "Running");
            assert_eq!(res.finish, FinishReason::ToolCalls);
            assert_eq!(res.tool_calls.len(), 1);
            assert_eq!(res.tool_calls[0].id, "toolu_9");
            assert_eq!(res.tool_calls[0].arguments, json!({"code": "print(1)"}));
            // Output tokens are cumulative: the last value, not 1 + 10 + 42.
            assert_eq!(
                res.usage,
                Usage {
                    input_tokens: 100,
                    output_tokens: 42,
                    estimated: false
                }
            );
            assert_eq!(res.model, "claude-sonnet-4-5-20250929");
            assert_eq!(res.request_id.as_deref(), Some("msg_9"));
            assert_eq!(seen, ["text:Running", "tool:run"]);
        }
    }

    #[test]
    fn tool_without_input_deltas_takes_the_start_input() {
        let body = [
            event(
                "content_block_start",
                json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"now","input":{}}}),
            ),
            event(
                "content_block_stop",
                json!({"type":"content_block_stop","index":0}),
            ),
            event(
                "message_delta",
                json!({"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":3}}),
            ),
            event("message_stop", json!({"type":"message_stop"})),
        ]
        .concat();
        let res = run_stream(&body, 0).0.unwrap();
        assert_eq!(res.tool_calls[0].arguments, json!({}));
        assert_eq!(res.usage.output_tokens, 3);
    }

    #[test]
    fn mid_stream_overloaded_error_is_retryable() {
        let body = [
            event(
                "message_start",
                json!({"type":"message_start","message":{"id":"m","model":"x","usage":{"input_tokens":5,"output_tokens":1}}}),
            ),
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"par"}}),
            ),
            event(
                "error",
                json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
            ),
        ]
        .concat();
        let (res, seen) = run_stream(&body, 17);
        let e = res.unwrap_err();
        assert_eq!(e.kind, LlmErrorKind::Overloaded);
        assert!(e.retryable());
        assert!(e.message.contains("Overloaded"), "{}", e.message);
        assert_eq!(seen, ["text:par"]);
    }

    #[test]
    fn a_stream_without_its_end_is_a_transport_error() {
        let body = tool_stream();
        let cut_at = body.find("event: message_delta").unwrap();
        let (res, _) = run_stream(&body[..cut_at], 0);
        assert_eq!(res.unwrap_err().kind, LlmErrorKind::Transport);
    }

    #[test]
    fn no_usage_at_all_is_estimated() {
        let body = [
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"abcd"}}),
            ),
            event("message_stop", json!({"type":"message_stop"})),
        ]
        .concat();
        let res = run_stream(&body, 0).0.unwrap();
        assert!(res.usage.estimated);
        assert_eq!(res.usage.output_tokens, 1);
        assert_eq!(res.finish, FinishReason::Stop);
    }
}
