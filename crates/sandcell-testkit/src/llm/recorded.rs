//! What the server received, and the readings of it a scripted decision or a test needs.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Protocol;

/// One request as received.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Recorded {
    /// The API it came in on.
    pub protocol: Protocol,
    /// The request path, e.g. `/v1/messages`.
    pub path: String,
    /// Every header, names lowercase (repeated headers joined by `, `), auth included so
    /// tests can check `authorization: Bearer …` and `x-api-key`.
    pub headers: BTreeMap<String, String>,
    /// The JSON body (a string holding the raw text when it was not JSON).
    pub body: Value,
    /// Whether the body asked for a stream (`"stream": true`).
    pub stream: bool,
}

/// An image the client sent, and where it sat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSeen {
    /// The role of the message holding it.
    pub role: String,
    /// The index of that message in `messages`.
    pub message_index: usize,
    /// Whether it sat inside an Anthropic `tool_result` block's content.
    pub in_tool_result: bool,
    /// The media type, from a `data:` URL (OpenAI) or a base64 source (Anthropic).
    pub media_type: Option<String>,
    /// The base64 data, when sent inline.
    pub data_base64: Option<String>,
    /// The URL, when sent by reference (not as a `data:` URL).
    pub url: Option<String>,
}

impl Recorded {
    /// The `messages` array (empty when absent).
    pub fn messages(&self) -> &[Value] {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Every text the client sent in messages (user, assistant and tool text, tool_result
    /// contents), oldest first, joined by newlines: what a scripted decision usually reads.
    pub fn transcript(&self) -> String {
        let mut out = Vec::new();
        for m in self.messages() {
            collect_text(m.get("content"), true, &mut out);
        }
        out.join("\n")
    }

    /// The names of the tools offered (`tools[].function.name` / `tools[].name`).
    pub fn tool_names(&self) -> Vec<String> {
        self.tools().into_iter().map(|(name, _)| name).collect()
    }

    /// The tools offered: name and JSON schema of the arguments (`function.parameters` /
    /// `input_schema`).
    pub fn tools(&self) -> Vec<(String, Value)> {
        let Some(tools) = self.body.get("tools").and_then(Value::as_array) else {
            return Vec::new();
        };
        tools
            .iter()
            .filter_map(|t| {
                let (name, schema) = match self.protocol {
                    Protocol::OpenAi => {
                        let f = t.get("function")?;
                        (f.get("name"), f.get("parameters"))
                    }
                    Protocol::Anthropic => (t.get("name"), t.get("input_schema")),
                };
                Some((
                    name?.as_str()?.to_string(),
                    schema.cloned().unwrap_or(Value::Null),
                ))
            })
            .collect()
    }

    /// The text of the last user message that has text of its own (tool results do not
    /// count), if any.
    pub fn last_user_text(&self) -> Option<String> {
        self.messages().iter().rev().find_map(|m| {
            if m.get("role").and_then(Value::as_str) != Some("user") {
                return None;
            }
            let mut out = Vec::new();
            collect_text(m.get("content"), false, &mut out);
            let text = out.join("\n");
            (!text.is_empty()).then_some(text)
        })
    }

    /// The text of the last tool result (an OpenAI `tool` message, an Anthropic
    /// `tool_result` block), if any.
    pub fn last_tool_result(&self) -> Option<String> {
        let mut last = None;
        for m in self.messages() {
            match self.protocol {
                Protocol::OpenAi => {
                    if m.get("role").and_then(Value::as_str) == Some("tool") {
                        let mut out = Vec::new();
                        collect_text(m.get("content"), false, &mut out);
                        last = Some(out.join("\n"));
                    }
                }
                Protocol::Anthropic => {
                    for b in blocks(m) {
                        if b.get("type").and_then(Value::as_str) == Some("tool_result") {
                            let mut out = Vec::new();
                            collect_text(b.get("content"), false, &mut out);
                            last = Some(out.join("\n"));
                        }
                    }
                }
            }
        }
        last
    }

    /// Every image sent, oldest first, with where it sat.
    pub fn images(&self) -> Vec<ImageSeen> {
        let mut out = Vec::new();
        for (i, m) in self.messages().iter().enumerate() {
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            for b in blocks(m) {
                match b.get("type").and_then(Value::as_str) {
                    Some("image_url") => {
                        let url = b
                            .get("image_url")
                            .and_then(|u| u.get("url").or(Some(u)))
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        out.push(openai_image(&role, i, url));
                    }
                    Some("image") => out.push(anthropic_image(&role, i, false, b)),
                    Some("tool_result") => {
                        if let Some(inner) = b.get("content").and_then(Value::as_array) {
                            for ib in inner {
                                if ib.get("type").and_then(Value::as_str) == Some("image") {
                                    out.push(anthropic_image(&role, i, true, ib));
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        out
    }

    /// A header's value (`name` lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// The content blocks (parts) of a message; none when its content is a string.
fn blocks(m: &Value) -> &[Value] {
    m.get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Appends the texts of a `content` (a string, or parts/blocks with `text`), and with
/// `with_tool_results` the contents of Anthropic `tool_result` blocks.
fn collect_text(content: Option<&Value>, with_tool_results: bool, out: &mut Vec<String>) {
    match content {
        Some(Value::String(s)) => out.push(s.clone()),
        Some(Value::Array(parts)) => {
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") | None => {
                        if let Some(t) = p.get("text").and_then(Value::as_str) {
                            out.push(t.to_string());
                        }
                    }
                    Some("tool_result") if with_tool_results => {
                        collect_text(p.get("content"), false, out);
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

fn openai_image(role: &str, message_index: usize, url: &str) -> ImageSeen {
    // data:<media type>;base64,<data>
    let inline = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(','));
    let (media_type, data_base64, url) = match inline {
        Some((meta, data)) => {
            let media = meta.split(';').next().unwrap_or("").to_string();
            (Some(media), Some(data.to_string()), None)
        }
        None => (None, None, Some(url.to_string())),
    };
    ImageSeen {
        role: role.to_string(),
        message_index,
        in_tool_result: false,
        media_type,
        data_base64,
        url,
    }
}

fn anthropic_image(role: &str, message_index: usize, in_tool_result: bool, b: &Value) -> ImageSeen {
    let source = b.get("source");
    let field = |k: &str| {
        source
            .and_then(|s| s.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    ImageSeen {
        role: role.to_string(),
        message_index,
        in_tool_result,
        media_type: field("media_type"),
        data_base64: field("data"),
        url: field("url"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rec(protocol: Protocol, body: Value) -> Recorded {
        Recorded {
            protocol,
            path: String::new(),
            headers: BTreeMap::new(),
            body,
            stream: false,
        }
    }

    #[test]
    fn openai_readings() {
        let r = rec(
            Protocol::OpenAi,
            json!({
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    ]},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "out 1"},
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
                ],
                "tools": [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
            }),
        );
        assert_eq!(r.transcript(), "be brief\nlook\nout 1");
        assert_eq!(r.tool_names(), vec!["run"]);
        assert_eq!(r.last_tool_result().as_deref(), Some("out 1"));
        assert_eq!(r.last_user_text().as_deref(), Some("look"));
        let imgs = r.images();
        assert_eq!(imgs.len(), 2);
        assert_eq!((imgs[0].role.as_str(), imgs[0].message_index), ("user", 1));
        assert_eq!(imgs[0].media_type.as_deref(), Some("image/png"));
        assert_eq!(imgs[0].data_base64.as_deref(), Some("AAAA"));
        assert_eq!(imgs[1].url.as_deref(), Some("https://x/y.png"));
        assert_eq!(imgs[1].message_index, 4);
    }

    #[test]
    fn anthropic_readings() {
        let r = rec(
            Protocol::Anthropic,
            json!({
                "messages": [
                    {"role": "user", "content": "run it"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "ok"},
                        {"type": "tool_use", "id": "toolu_1", "name": "run", "input": {}}
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                            {"type": "text", "text": "result text"},
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "BBBB"}}
                        ]}
                    ]}
                ],
                "tools": [{"name": "run", "input_schema": {"type": "object"}}]
            }),
        );
        assert_eq!(r.transcript(), "run it\nok\nresult text");
        assert_eq!(r.tool_names(), vec!["run"]);
        assert_eq!(r.last_tool_result().as_deref(), Some("result text"));
        assert_eq!(r.last_user_text().as_deref(), Some("run it"));
        let imgs = r.images();
        assert_eq!(imgs.len(), 1);
        assert!(imgs[0].in_tool_result);
        assert_eq!((imgs[0].role.as_str(), imgs[0].message_index), ("user", 2));
        assert_eq!(imgs[0].data_base64.as_deref(), Some("BBBB"));
    }
}
