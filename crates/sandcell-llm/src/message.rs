//! The provider-neutral conversation: what the agent sends and records in its trajectory.
//! Each protocol module maps these onto its own wire format.

use serde::{Deserialize, Serialize};

/// Who said a message. The system prompt is not a message: it is [`ChatRequest::system`],
/// since the protocols place it differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user, and tool results (both protocols send those on the user's side).
    User,
    /// The model.
    Assistant,
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// What it holds, in order.
    pub content: Vec<Part>,
}

impl Message {
    /// A user message of one text part.
    pub fn user(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: vec![Part::Text(text.into())],
        }
    }

    /// An assistant message of one text part.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self {
            role: Role::Assistant,
            content: vec![Part::Text(text.into())],
        }
    }
}

/// One piece of a message. On the wire (and in trajectories) it is internally tagged:
/// `{"type":"text","text":"…"}`, `{"type":"image","media_type","data"}`,
/// `{"type":"tool_call","id","name","arguments"}`,
/// `{"type":"tool_result","call_id","content","is_error"}`.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Text.
    Text(String),
    /// An image (user messages and tool results).
    Image(Image),
    /// A tool call the model made (assistant messages).
    ToolCall(ToolCall),
    /// The result of a tool call (user messages).
    ToolResult(ToolResult),
}

// serde's internal tagging cannot carry a bare string, so `Part` goes through these two
// mirrors, where text is a struct variant; the borrowed one spares cloning images to write.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum PartRef<'a> {
    Text { text: &'a str },
    Image(&'a Image),
    ToolCall(&'a ToolCall),
    ToolResult(&'a ToolResult),
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum PartOwned {
    Text { text: String },
    Image(Image),
    ToolCall(ToolCall),
    ToolResult(ToolResult),
}

impl Serialize for Part {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Part::Text(text) => PartRef::Text { text },
            Part::Image(i) => PartRef::Image(i),
            Part::ToolCall(c) => PartRef::ToolCall(c),
            Part::ToolResult(r) => PartRef::ToolResult(r),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match PartOwned::deserialize(deserializer)? {
            PartOwned::Text { text } => Part::Text(text),
            PartOwned::Image(i) => Part::Image(i),
            PartOwned::ToolCall(c) => Part::ToolCall(c),
            PartOwned::ToolResult(r) => Part::ToolResult(r),
        })
    }
}

/// An inline image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// Its MIME type, e.g. `image/png`.
    pub media_type: String,
    /// Its bytes in base64, without a `data:` prefix.
    pub data: String,
}

/// A call of a tool by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call; its result names it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON (a `Value::String` of the raw text when the model's arguments
    /// were not valid JSON, so the agent can tell the model).
    pub arguments: serde_json::Value,
}

/// The result of one tool call, sent back to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The [`ToolCall::id`] it answers.
    pub call_id: String,
    /// Text and images only (other parts are ignored).
    pub content: Vec<Part>,
    /// Whether the tool failed.
    pub is_error: bool,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// Its arguments as a JSON Schema object.
    pub parameters: serde_json::Value,
}

/// One model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model name as the provider knows it ([`crate::ModelRef::model`]).
    pub model: String,
    /// The system prompt.
    pub system: Option<String>,
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// The tools offered (none: the model answers in text).
    pub tools: Vec<ToolSpec>,
    /// The most output tokens (always sent: Anthropic requires it, and budgets reserve it).
    pub max_tokens: u32,
    /// Sampling temperature; the provider's default when `None`.
    pub temperature: Option<f32>,
    /// Stream the answer (deltas reach the caller as they come).
    pub stream: bool,
}

/// What an image is counted as in estimates: a rough middle of what providers charge for one
/// (their counts depend on the size, which we do not decode).
pub const IMAGE_TOKEN_ESTIMATE: u64 = 1000;

/// A rough token count of `text`: about four characters a token, rounded up.
pub fn estimate_tokens(text: &str) -> u64 {
    let chars = text.chars().count() as u64;
    chars.div_ceil(4)
}

impl ChatRequest {
    /// A rough count of the prompt's tokens (system, messages, tool specs), for reserving a
    /// budget before the call and for usage when the server reports none.
    pub fn estimated_input_tokens(&self) -> u64 {
        estimate_input_tokens(self.system.as_deref(), &self.messages, &self.tools)
    }
}

/// The estimate of [`ChatRequest::estimated_input_tokens`] for a request not built yet (no
/// copy of the conversation needed).
pub fn estimate_input_tokens(
    system: Option<&str>,
    messages: &[Message],
    tools: &[ToolSpec],
) -> u64 {
    let mut chars: u64 = 0;
    let mut images: u64 = 0;
    if let Some(s) = system {
        chars += s.chars().count() as u64;
    }
    for m in messages {
        count_parts(&m.content, &mut chars, &mut images);
    }
    for t in tools {
        chars += (t.name.chars().count() + t.description.chars().count()) as u64;
        chars += json_chars(&t.parameters);
    }
    chars.div_ceil(4) + images * IMAGE_TOKEN_ESTIMATE
}

/// The characters of `value`'s compact JSON, counted as it is written rather than in a
/// string made for it (the agent estimates every step, over every tool's schema).
fn json_chars(value: &serde_json::Value) -> u64 {
    /// Counts UTF-8 characters: every byte but continuation bytes starts one.
    struct Chars(u64);
    impl std::io::Write for Chars {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.iter().filter(|b| (**b & 0xC0) != 0x80).count() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Chars(0);
    // Writing a value into a counter cannot fail.
    let _ = serde_json::to_writer(&mut n, value);
    n.0
}

fn count_parts(parts: &[Part], chars: &mut u64, images: &mut u64) {
    for p in parts {
        match p {
            Part::Text(t) => *chars += t.chars().count() as u64,
            Part::Image(_) => *images += 1,
            Part::ToolCall(c) => {
                *chars += c.name.chars().count() as u64;
                *chars += json_chars(&c.arguments);
            }
            Part::ToolResult(r) => count_parts(&r.content, chars, images),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parts_serialize_with_a_type_tag() {
        let parts = vec![
            Part::Text("hi".into()),
            Part::Image(Image {
                media_type: "image/png".into(),
                data: "AAAA".into(),
            }),
            Part::ToolCall(ToolCall {
                id: "c1".into(),
                name: "run".into(),
                arguments: json!({"code": "1+1"}),
            }),
            Part::ToolResult(ToolResult {
                call_id: "c1".into(),
                content: vec![Part::Text("2".into())],
                is_error: false,
            }),
        ];
        let v = serde_json::to_value(&parts).unwrap();
        assert_eq!(v[0], json!({"type": "text", "text": "hi"}));
        assert_eq!(v[1]["type"], "image");
        assert_eq!(v[1]["media_type"], "image/png");
        assert_eq!(v[2]["type"], "tool_call");
        assert_eq!(v[2]["arguments"]["code"], "1+1");
        assert_eq!(v[3]["type"], "tool_result");
        assert_eq!(v[3]["content"][0], json!({"type": "text", "text": "2"}));
        let back: Vec<Part> = serde_json::from_value(v).unwrap();
        assert_eq!(back, parts);
    }

    #[test]
    fn json_chars_counts_as_the_json_text_would() {
        for v in [
            json!({"code": "print('é✓')", "n": [1, 2.5, null, true]}),
            json!("plain"),
            json!({"nested": {"emoji": "🦀", "quote": "\"", "ctl": "\n"}}),
        ] {
            assert_eq!(json_chars(&v), v.to_string().chars().count() as u64, "{v}");
        }
    }

    #[test]
    fn estimates_count_text_tools_and_images() {
        let req = ChatRequest {
            model: "m".into(),
            system: Some("abcd".into()),
            messages: vec![Message {
                role: Role::User,
                content: vec![
                    Part::Text("efgh".into()),
                    Part::Image(Image {
                        media_type: "image/png".into(),
                        data: "A".repeat(100_000),
                    }),
                ],
            }],
            tools: vec![],
            max_tokens: 10,
            temperature: None,
            stream: false,
        };
        assert_eq!(req.estimated_input_tokens(), 2 + IMAGE_TOKEN_ESTIMATE);
        assert_eq!(estimate_tokens("abcde"), 2);
        assert_eq!(estimate_tokens(""), 0);
    }
}
