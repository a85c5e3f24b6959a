//! The OpenAI Chat Completions protocol: the request body, the answer, and the stream.
//! Pure functions; the client sends and retries.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::error::{LlmError, LlmErrorKind, classify_stream_error};
use crate::message::{ChatRequest, Image, Message, Part, Role, ToolResult};
use crate::response::{
    ChatResponse, FinishReason, StreamAssembler, StreamDelta, parse_arguments, usage_or_estimate,
};
use crate::sse::SseEvent;

/// The text that introduces tool-produced images: tool messages carry text only, so images
/// follow them in one user message.
pub(crate) const TOOL_IMAGES_INTRO: &str = "Images produced by the tool calls above:";

/// The request body, serialized. `official` is true for OpenAI's own endpoint, which takes
/// `max_completion_tokens` (its reasoning models reject `max_tokens`); compatible servers
/// get the widely accepted `max_tokens`.
///
/// Written straight from the request through borrowing wire types: building a
/// `serde_json::Value` of the whole conversation first cost a copy of every message on every
/// call (measured ~0.1 ms a call at 100 messages, most of what the agent spent building a
/// step's request).
pub(crate) fn request_body(req: &ChatRequest, official: bool) -> Vec<u8> {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        messages.push(WireMessage::plain(
            "system",
            Content::Text(Cow::Borrowed(system)),
        ));
    }
    let mut i = 0;
    while i < req.messages.len() {
        match req.messages[i].role {
            Role::Assistant => {
                messages.push(assistant_message(&req.messages[i]));
                i += 1;
            }
            Role::User => {
                // A run of user messages is one turn: all its tool results become tool
                // messages first (they must follow the assistant's calls directly), then
                // their images in one user message, then the user's own messages.
                let start = i;
                while i < req.messages.len() && req.messages[i].role == Role::User {
                    i += 1;
                }
                user_turn(&req.messages[start..i], &mut messages);
            }
        }
    }
    let max = Some(req.max_tokens);
    let body = Body {
        model: &req.model,
        messages,
        max_completion_tokens: max.filter(|_| official),
        max_tokens: max.filter(|_| !official),
        temperature: req.temperature.map(temperature),
        tools: req
            .tools
            .iter()
            .map(|t| WireTool {
                kind: "function",
                function: WireFunction {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                },
            })
            .collect(),
        stream: req.stream.then_some(true),
        stream_options: req.stream.then_some(StreamOptions {
            include_usage: true,
        }),
    };
    // The wire types hold strings and JSON values only: they always serialize.
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The body of a Chat Completions request.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// One message: `role` and `content` always, the rest where the role has them.
#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    content: Content<'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCall<'a>>,
}

impl<'a> WireMessage<'a> {
    fn plain(role: &'static str, content: Content<'a>) -> Self {
        Self {
            role,
            tool_call_id: None,
            content,
            tool_calls: Vec::new(),
        }
    }
}

/// A message's content: null (an assistant's turn of tool calls only), a string, or parts.
#[derive(Serialize)]
#[serde(untagged)]
enum Content<'a> {
    Null,
    Text(Cow<'a, str>),
    Parts(Vec<WirePart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WirePart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: DataUrl<'a> },
}

/// `{"url": "data:<type>;base64,<data>"}`, written without a copy of the image.
struct DataUrl<'a>(&'a Image);

impl Serialize for DataUrl<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(
            "url",
            &Collected(format_args!(
                "data:{};base64,{}",
                self.0.media_type, self.0.data
            )),
        )?;
        map.end()
    }
}

/// A call as the assistant message carries it.
#[derive(Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireCallFunction<'a>,
}

#[derive(Serialize)]
struct WireCallFunction<'a> {
    name: &'a str,
    arguments: Arguments<'a>,
}

/// A call's arguments as the protocol wants them: a string of JSON. Arguments that were not
/// JSON (kept as a string) are sent back as the model wrote them.
struct Arguments<'a>(&'a Value);

impl Serialize for Arguments<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::String(raw) => serializer.serialize_str(raw),
            // A value's Display is its compact JSON.
            v => serializer.collect_str(v),
        }
    }
}

/// Anything `Display` as one JSON string, formatted straight into the output.
struct Collected<T>(T);

impl<T: std::fmt::Display> Serialize for Collected<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

/// An f32 as the decimal it was written as (0.2, not 0.20000000298023224).
pub(crate) fn temperature(t: f32) -> Value {
    t.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

/// The texts of `parts` joined with `\n` (borrowed when there is one).
fn joined<'a>(parts: impl Iterator<Item = &'a str>, skip_empty: bool) -> Cow<'a, str> {
    let mut out = Cow::Borrowed("");
    for t in parts {
        if skip_empty && t.is_empty() {
            continue;
        }
        if out.is_empty() {
            // An empty text before this one adds nothing (as `push_str` onto empty did).
            out = Cow::Borrowed(t);
        } else {
            let s = out.to_mut();
            s.push('\n');
            s.push_str(t);
        }
    }
    out
}

fn assistant_message(m: &Message) -> WireMessage<'_> {
    // Texts are joined with newlines, an empty one adding none.
    let text = joined(
        m.content.iter().filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            _ => None,
        }),
        true,
    );
    // The protocol has no place for images or results in an assistant message.
    let calls: Vec<WireCall<'_>> = m
        .content
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall(c) => Some(WireCall {
                id: &c.id,
                kind: "function",
                function: WireCallFunction {
                    name: &c.name,
                    arguments: Arguments(&c.arguments),
                },
            }),
            _ => None,
        })
        .collect();
    let content = if !calls.is_empty() && text.is_empty() {
        Content::Null
    } else {
        Content::Text(text)
    };
    WireMessage {
        role: "assistant",
        tool_call_id: None,
        content,
        tool_calls: calls,
    }
}

fn user_turn<'a>(turn: &'a [Message], out: &mut Vec<WireMessage<'a>>) {
    let mut images = Vec::new();
    for m in turn {
        for p in &m.content {
            if let Part::ToolResult(r) = p {
                out.push(tool_message(r, &mut images));
            }
        }
    }
    if !images.is_empty() {
        let mut content = vec![WirePart::Text {
            text: TOOL_IMAGES_INTRO,
        }];
        content.extend(images.into_iter().map(|i| WirePart::ImageUrl {
            image_url: DataUrl(i),
        }));
        out.push(WireMessage::plain("user", Content::Parts(content)));
    }
    for m in turn {
        let parts: Vec<&Part> = m
            .content
            .iter()
            .filter(|p| matches!(p, Part::Text(_) | Part::Image(_)))
            .collect();
        match parts.as_slice() {
            [] => {}
            // A lone text as a plain string: the form every compatible server takes.
            [Part::Text(t)] => out.push(WireMessage::plain(
                "user",
                Content::Text(Cow::Borrowed(t.as_str())),
            )),
            parts => {
                let content: Vec<WirePart<'_>> = parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::Text(t) => Some(WirePart::Text { text: t }),
                        Part::Image(i) => Some(WirePart::ImageUrl {
                            image_url: DataUrl(i),
                        }),
                        _ => None,
                    })
                    .collect();
                out.push(WireMessage::plain("user", Content::Parts(content)));
            }
        }
    }
}

fn tool_message<'a>(r: &'a ToolResult, images: &mut Vec<&'a Image>) -> WireMessage<'a> {
    let mut had_images = false;
    for p in &r.content {
        if let Part::Image(i) = p {
            images.push(i);
            had_images = true;
        }
    }
    let mut text = joined(
        r.content.iter().filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            _ => None,
        }),
        false,
    );
    if text.is_empty() {
        text = Cow::Borrowed(if had_images {
            "(the output is the image below)"
        } else {
            "(no output)"
        });
    }
    // The protocol has no error flag on tool messages: say it in the text.
    let says_error = text
        .get(..5)
        .is_some_and(|head| head.eq_ignore_ascii_case("error"));
    if r.is_error && !says_error {
        text = Cow::Owned(format!("Error: {text}"));
    }
    WireMessage {
        role: "tool",
        tool_call_id: Some(&r.call_id),
        content: Content::Text(text),
        tool_calls: Vec::new(),
    }
}

/// OpenAI's finish reason; none given means the end of a turn (tool calls if it made any).
pub(crate) fn finish_reason(s: Option<&str>, has_calls: bool) -> FinishReason {
    match s {
        Some("stop") => FinishReason::Stop,
        Some("tool_calls") | Some("function_call") => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_string()),
        None if has_calls => FinishReason::ToolCalls,
        None => FinishReason::Stop,
    }
}

fn usage_of(v: &Value) -> Option<(u64, u64)> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    let input = u.get("prompt_tokens").and_then(Value::as_u64);
    let output = u.get("completion_tokens").and_then(Value::as_u64);
    if input.is_none() && output.is_none() {
        return None;
    }
    Some((input.unwrap_or(0), output.unwrap_or(0)))
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// An `{"error": {...}}` object in a 200 answer or a stream chunk, as an error.
fn body_error(v: &Value) -> Option<LlmError> {
    let err = v.get("error").filter(|e| !e.is_null())?;
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| err.as_str())
        .unwrap_or("unknown error")
        .to_string();
    let ty = err
        .get("type")
        .and_then(Value::as_str)
        .or_else(|| err.get("code").and_then(Value::as_str));
    Some(LlmError::new(
        classify_stream_error(ty, &message),
        format!("openai reported an error: {message}"),
    ))
}

fn decode_error(what: &str, e: impl std::fmt::Display) -> LlmError {
    LlmError::new(
        LlmErrorKind::Decode,
        format!("openai answer is not understood: {what}: {e}"),
    )
}

/// The text of a message's `content`: a string, null, or (some servers) an array of parts.
fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// A whole (non-streamed) answer.
pub(crate) fn parse_response(body: &[u8], req: &ChatRequest) -> Result<ChatResponse, LlmError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| decode_error("invalid JSON", e))?;
    if let Some(e) = body_error(&v) {
        return Err(e);
    }
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| decode_error("no choices", "the answer has no choice"))?;
    let message = choice.get("message").unwrap_or(&Value::Null);
    let text = content_text(message.get("content"));
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for (i, c) in calls.iter().enumerate() {
            let f = c.get("function").unwrap_or(&Value::Null);
            let arguments = match f.get("arguments") {
                Some(Value::String(raw)) => parse_arguments(raw),
                // Some servers send the arguments as an object already.
                Some(v) if v.is_object() => v.clone(),
                _ => json!({}),
            };
            tool_calls.push(crate::message::ToolCall {
                id: str_field(c, "id")
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("call_{i}")),
                name: str_field(f, "name").unwrap_or_default().to_string(),
                arguments,
            });
        }
    }
    let finish = finish_reason(
        choice.get("finish_reason").and_then(Value::as_str),
        !tool_calls.is_empty(),
    );
    let usage = usage_or_estimate(usage_of(&v), req, &text, &tool_calls);
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

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
    announced: bool,
}

/// Assembles a streamed answer: text deltas, tool-call fragments per `index` (only the
/// first carries `id` and `name`; `arguments` are concatenated and parsed at the end), and
/// the usage chunk (`choices` empty, null or absent) if the server sends one.
#[derive(Debug, Default)]
pub(crate) struct OpenAiStream {
    id: Option<String>,
    model: Option<String>,
    text: String,
    calls: BTreeMap<u64, PartialCall>,
    last_index: Option<u64>,
    finish: Option<String>,
    usage: Option<(u64, u64)>,
    done: bool,
}

impl OpenAiStream {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn tool_delta(&mut self, tc: &Value, on_delta: &mut dyn FnMut(StreamDelta<'_>)) {
        let id = str_field(tc, "id");
        // Servers that omit `index` send one call per fragment run: a new id starts a new
        // call, no id continues the last.
        let index = match tc.get("index").and_then(Value::as_u64) {
            Some(i) => i,
            None => match (id, self.last_index) {
                (Some(id), _) => self
                    .calls
                    .iter()
                    .find(|(_, c)| c.id == id)
                    .map(|(i, _)| *i)
                    .unwrap_or(self.calls.len() as u64),
                (None, Some(last)) => last,
                (None, None) => 0,
            },
        };
        self.last_index = Some(index);
        let call = self.calls.entry(index).or_default();
        if let Some(id) = id
            && call.id.is_empty()
        {
            call.id = id.to_string();
        }
        let f = tc.get("function").unwrap_or(&Value::Null);
        // Some servers repeat the name in every fragment: take it once, never concatenate.
        if let Some(name) = str_field(f, "name")
            && call.name.is_empty()
        {
            call.name = name.to_string();
        }
        match f.get("arguments") {
            Some(Value::String(a)) => call.arguments.push_str(a),
            Some(v) if v.is_object() => call.arguments.push_str(&v.to_string()),
            _ => {}
        }
        if !call.announced && !call.name.is_empty() {
            call.announced = true;
            on_delta(StreamDelta::ToolCallStarted { name: &call.name });
        }
    }
}

impl StreamAssembler for OpenAiStream {
    fn event(
        &mut self,
        ev: &SseEvent,
        on_delta: &mut dyn FnMut(StreamDelta<'_>),
    ) -> Result<(), LlmError> {
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let v: Value = serde_json::from_str(data).map_err(|e| decode_error("a stream chunk", e))?;
        if let Some(e) = body_error(&v) {
            return Err(e);
        }
        if self.id.is_none() {
            self.id = str_field(&v, "id").map(str::to_string);
        }
        if self.model.is_none() {
            self.model = str_field(&v, "model").map(str::to_string);
        }
        if let Some(u) = usage_of(&v) {
            self.usage = Some(u);
        }
        let Some(choices) = v.get("choices").and_then(Value::as_array) else {
            return Ok(());
        };
        for choice in choices {
            // One answer is asked for (n = 1); anything else is not ours.
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(t) = delta.get("content").and_then(Value::as_str)
                && !t.is_empty()
            {
                self.text.push_str(t);
                on_delta(StreamDelta::Text(t));
            }
            if let Some(tcs) = delta.get("tool_calls").and_then(Value::as_array) {
                for tc in tcs {
                    self.tool_delta(tc, on_delta);
                }
            }
            if let Some(f) = str_field(choice, "finish_reason") {
                self.finish = Some(f.to_string());
            }
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        // `[DONE]` ends a stream; a finish reason is enough for servers that never send it.
        if !self.done && self.finish.is_none() {
            return Err(LlmError::new(
                LlmErrorKind::Transport,
                "openai stream ended before the answer was complete",
            ));
        }
        let tool_calls: Vec<crate::message::ToolCall> = self
            .calls
            .into_iter()
            .map(|(i, c)| crate::message::ToolCall {
                id: if c.id.is_empty() {
                    format!("call_{i}")
                } else {
                    c.id
                },
                name: c.name,
                arguments: parse_arguments(&c.arguments),
            })
            .collect();
        let finish = finish_reason(self.finish.as_deref(), !tool_calls.is_empty());
        let usage = usage_or_estimate(self.usage, req, &self.text, &tool_calls);
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
    use crate::message::{ToolCall, ToolSpec};
    use crate::response::Usage;
    use crate::sse::SseParser;

    fn req(messages: Vec<Message>) -> ChatRequest {
        ChatRequest {
            model: "gpt-4o-mini".into(),
            system: Some("be brief".into()),
            messages,
            tools: vec![ToolSpec {
                name: "run".into(),
                description: "runs code".into(),
                parameters: json!({"type": "object", "properties": {"code": {"type": "string"}}}),
            }],
            max_tokens: 256,
            temperature: Some(0.2),
            stream: false,
        }
    }

    fn body_of(r: &ChatRequest, official: bool) -> Value {
        serde_json::from_slice(&request_body(r, official)).unwrap()
    }

    fn png(data: &str) -> Image {
        Image {
            media_type: "image/png".into(),
            data: data.into(),
        }
    }

    fn conversation() -> Vec<Message> {
        vec![
            Message {
                role: Role::User,
                content: vec![Part::Text("plot it".into()), Part::Image(png("U1"))],
            },
            Message {
                role: Role::Assistant,
                content: vec![
                    Part::ToolCall(ToolCall {
                        id: "call_a".into(),
                        name: "run".into(),
                        arguments: json!({"code": "plot()"}),
                    }),
                    Part::ToolCall(ToolCall {
                        id: "call_b".into(),
                        name: "run".into(),
                        arguments: json!({"code": "1/0"}),
                    }),
                ],
            },
            // One message per result, as an agent may write them.
            Message {
                role: Role::User,
                content: vec![Part::ToolResult(ToolResult {
                    call_id: "call_a".into(),
                    content: vec![Part::Text("done".into()), Part::Image(png("T1"))],
                    is_error: false,
                })],
            },
            Message {
                role: Role::User,
                content: vec![Part::ToolResult(ToolResult {
                    call_id: "call_b".into(),
                    content: vec![Part::Text("ZeroDivisionError".into())],
                    is_error: true,
                })],
            },
            Message::assistant("Here is the plot."),
            Message::user("thanks"),
        ]
    }

    #[test]
    fn maps_system_tools_calls_results_and_images() {
        let body = body_of(&req(conversation()), false);
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["max_tokens"], 256);
        assert!(body.get("max_completion_tokens").is_none());
        assert_eq!(body["temperature"], json!(0.2));
        assert!(body.get("stream").is_none());
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {"name": "run", "description": "runs code",
                "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}])
        );
        let m = body["messages"].as_array().unwrap();
        let roles: Vec<&str> = m.iter().map(|x| x["role"].as_str().unwrap()).collect();
        assert_eq!(
            roles,
            [
                "system",
                "user",
                "assistant",
                "tool",
                "tool",
                "user",
                "assistant",
                "user"
            ]
        );
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(
            m[1]["content"],
            json!([{"type": "text", "text": "plot it"},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,U1"}}])
        );
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(
            m[2]["tool_calls"][0],
            json!({"id": "call_a", "type": "function",
                   "function": {"name": "run", "arguments": "{\"code\":\"plot()\"}"}})
        );
        assert_eq!(m[2]["tool_calls"][1]["id"], "call_b");
        // Tool messages are text only.
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_a", "content": "done"})
        );
        assert_eq!(m[4]["tool_call_id"], "call_b");
        assert_eq!(m[4]["content"], "Error: ZeroDivisionError");
        // The tool's image follows all the tool messages, in one user message.
        assert_eq!(
            m[5]["content"],
            json!([{"type": "text", "text": TOOL_IMAGES_INTRO},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,T1"}}])
        );
        assert_eq!(
            m[6],
            json!({"role": "assistant", "content": "Here is the plot."})
        );
        assert_eq!(m[7], json!({"role": "user", "content": "thanks"}));
        // No image anywhere in a tool message.
        for t in m.iter().filter(|x| x["role"] == "tool") {
            assert!(t["content"].is_string());
        }
    }

    #[test]
    fn tool_texts_join_by_line_and_errors_are_said_once() {
        let result = |content: Vec<Part>, is_error: bool| {
            let r = req(vec![Message {
                role: Role::User,
                content: vec![Part::ToolResult(ToolResult {
                    call_id: "c".into(),
                    content,
                    is_error,
                })],
            }]);
            body_of(&r, false)["messages"][1]["content"].clone()
        };
        let text = |t: &str| Part::Text(t.into());
        assert_eq!(
            result(vec![text("a"), text(""), text("b")], false),
            "a\n\nb"
        );
        assert_eq!(result(vec![text(""), text("b")], false), "b");
        assert_eq!(result(vec![], false), "(no output)");
        assert_eq!(result(vec![text("ERROR: x")], true), "ERROR: x");
        assert_eq!(result(vec![text("é, no")], true), "Error: é, no");
        assert_eq!(
            result(vec![Part::Image(png("I"))], true),
            "Error: (the output is the image below)"
        );
    }

    #[test]
    fn official_endpoint_gets_max_completion_tokens_and_streams_ask_usage() {
        let mut r = req(vec![Message::user("hi")]);
        r.stream = true;
        r.system = None;
        r.tools.clear();
        r.temperature = None;
        let body = body_of(&r, true);
        assert_eq!(body["max_completion_tokens"], 256);
        assert!(body.get("max_tokens").is_none());
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert!(body.get("tools").is_none());
        assert!(body.get("temperature").is_none());
        assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
    }

    #[test]
    fn raw_arguments_are_sent_back_as_written() {
        let r = req(vec![Message {
            role: Role::Assistant,
            content: vec![
                Part::Text("let me".into()),
                Part::ToolCall(ToolCall {
                    id: "c".into(),
                    name: "run".into(),
                    arguments: Value::String("{not json".into()),
                }),
            ],
        }]);
        let body = body_of(&r, false);
        let m = &body["messages"][1];
        assert_eq!(m["content"], "let me");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{not json");
    }

    #[test]
    fn parses_a_whole_answer() {
        let body = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini-2024-07-18",
            "choices":[{"index":0,"message":{"role":"assistant","content":null,
              "tool_calls":[{"id":"call_1","type":"function","function":{"name":"run","arguments":"{\"code\":\"1+1\"}"}}]},
              "finish_reason":"tool_calls"}],
            "usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}"#;
        let r = parse_response(body, &req(vec![Message::user("hi")])).unwrap();
        assert_eq!(r.text, "");
        assert_eq!(r.finish, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].id, "call_1");
        assert_eq!(r.tool_calls[0].arguments, json!({"code": "1+1"}));
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 12,
                output_tokens: 7,
                estimated: false
            }
        );
        assert_eq!(r.model, "gpt-4o-mini-2024-07-18");
        assert_eq!(r.request_id.as_deref(), Some("chatcmpl-1"));

        let e = parse_response(b"<html>", &req(vec![])).unwrap_err();
        assert_eq!(e.kind, LlmErrorKind::Decode);
    }

    fn run_stream(
        chunks: &[&str],
        r: &ChatRequest,
    ) -> (Result<ChatResponse, LlmError>, Vec<String>) {
        let mut parser = SseParser::new();
        let mut asm = OpenAiStream::new();
        let mut seen = Vec::new();
        let mut on_delta = |d: StreamDelta<'_>| match d {
            StreamDelta::Text(t) => seen.push(format!("text:{t}")),
            StreamDelta::ToolCallStarted { name } => seen.push(format!("tool:{name}")),
            StreamDelta::Retrying { .. } => seen.push("retry".into()),
        };
        let mut events = Vec::new();
        for c in chunks {
            events.extend(parser.push(c.as_bytes()));
        }
        events.extend(parser.finish());
        for ev in &events {
            if let Err(e) = asm.event(ev, &mut on_delta) {
                return (Err(e), seen);
            }
        }
        (asm.finish(r), seen)
    }

    fn sse(lines: &[&str]) -> String {
        lines.iter().map(|l| format!("data: {l}\n\n")).collect()
    }

    #[test]
    fn assembles_parallel_tool_calls_interleaved_by_index() {
        let body = sse(&[
            r#"{"id":"c1","model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"Run"}}]}"#,
            r#"{"id":"c1","model":"gpt-4o","choices":[{"index":0,"delta":{"content":"ning."}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"run","arguments":""}}]}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"read","arguments":"{\"pa"}}]}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"co"}}]}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"th\":\"/x\"}"}}]}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"de\":\"1+"}}]}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1\"}"}}]}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":50,"completion_tokens":20,"total_tokens":70}}"#,
            "[DONE]",
        ]);
        let r = req(vec![Message::user("go")]);
        // Cut the bytes at several places, including inside tokens.
        let bytes = body.as_str();
        let cuts = [0, 13, 77, 200, 201, 333, 512, bytes.len() - 3];
        let mut chunks = Vec::new();
        let mut prev = 0;
        for c in cuts {
            let c = c.min(bytes.len());
            if c > prev && bytes.is_char_boundary(c) {
                chunks.push(&bytes[prev..c]);
                prev = c;
            }
        }
        chunks.push(&bytes[prev..]);
        let (res, seen) = run_stream(&chunks, &r);
        let res = res.unwrap();
        assert_eq!(res.text, "Running.");
        assert_eq!(res.finish, FinishReason::ToolCalls);
        assert_eq!(res.tool_calls.len(), 2);
        assert_eq!(res.tool_calls[0].id, "call_a");
        assert_eq!(res.tool_calls[0].name, "run");
        assert_eq!(res.tool_calls[0].arguments, json!({"code": "1+1"}));
        assert_eq!(res.tool_calls[1].id, "call_b");
        assert_eq!(res.tool_calls[1].name, "read");
        assert_eq!(res.tool_calls[1].arguments, json!({"path": "/x"}));
        assert_eq!(
            res.usage,
            Usage {
                input_tokens: 50,
                output_tokens: 20,
                estimated: false
            }
        );
        assert_eq!(res.model, "gpt-4o");
        assert_eq!(res.request_id.as_deref(), Some("c1"));
        assert_eq!(
            seen,
            ["text:Run", "text:ning.", "tool:run", "tool:read"].map(String::from)
        );
    }

    #[test]
    fn usage_chunk_with_null_choices_is_accepted() {
        let body = sse(&[
            r#"{"id":"c2","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}],"usage":null}"#,
            r#"{"id":"c2","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#,
            r#"{"id":"c2","choices":null,"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
            "[DONE]",
        ]);
        let (res, _) = run_stream(&[&body], &req(vec![Message::user("x")]));
        let res = res.unwrap();
        assert_eq!(res.finish, FinishReason::Stop);
        assert_eq!(res.usage.input_tokens, 3);
        assert_eq!(res.usage.output_tokens, 1);
        assert!(!res.usage.estimated);
        assert_eq!(res.model, "gpt-4o-mini", "no model sent: the request's");
    }

    #[test]
    fn no_usage_is_estimated_and_marked() {
        let body = sse(&[
            r#"{"choices":[{"index":0,"delta":{"content":"abcdefgh"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
            "[DONE]",
        ]);
        let r = req(vec![Message::user("x")]);
        let (res, _) = run_stream(&[&body], &r);
        let res = res.unwrap();
        assert_eq!(res.finish, FinishReason::Length);
        assert!(res.usage.estimated);
        assert_eq!(res.usage.output_tokens, 2);
        assert_eq!(res.usage.input_tokens, r.estimated_input_tokens());
        assert!(res.usage.input_tokens > 0);
    }

    #[test]
    fn unparseable_arguments_stay_raw() {
        let body = sse(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"x","function":{"name":"run","arguments":"{\"code\": 1+"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ]);
        let (res, _) = run_stream(&[&body], &req(vec![]));
        assert_eq!(
            res.unwrap().tool_calls[0].arguments,
            Value::String("{\"code\": 1+".into())
        );
    }

    #[test]
    fn a_stream_cut_before_its_end_is_a_transport_error() {
        let body = sse(&[r#"{"choices":[{"index":0,"delta":{"content":"par"}}]}"#]);
        let (res, seen) = run_stream(&[&body], &req(vec![]));
        let e = res.unwrap_err();
        assert_eq!(e.kind, LlmErrorKind::Transport);
        assert!(e.retryable());
        assert_eq!(seen, ["text:par"]);
    }

    #[test]
    fn an_error_chunk_fails_the_stream() {
        let body = sse(&[
            r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#,
            r#"{"error":{"message":"The server had an error","type":"server_error"}}"#,
        ]);
        let e = run_stream(&[&body], &req(vec![])).0.unwrap_err();
        assert_eq!(e.kind, LlmErrorKind::Server);
        assert!(e.message.contains("The server had an error"));
    }
}
