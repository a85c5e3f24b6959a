//! What a model call returns, and what a streamed one reports while it runs.

use serde::{Deserialize, Serialize};

use crate::message::ToolCall;

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end (OpenAI `stop`; Anthropic `end_turn`, `stop_sequence`).
    Stop,
    /// It called tools (OpenAI `tool_calls`/`function_call`; Anthropic `tool_use`).
    ToolCalls,
    /// It reached `max_tokens`.
    Length,
    /// The provider filtered or refused the output (OpenAI `content_filter`; Anthropic
    /// `refusal`).
    ContentFilter,
    /// Anything else, as the provider named it.
    Other(String),
}

/// Tokens a call used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (Anthropic: including cache reads and writes).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// The server reported none: these are estimates (about four characters a token).
    pub estimated: bool,
}

/// A finished model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The text the model wrote (text blocks joined).
    pub text: String,
    /// The tools it called, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// Tokens used.
    pub usage: Usage,
    /// The model as the server named it, else the request's.
    pub model: String,
    /// The provider's id of the request (`x-request-id` / `request-id` header, else the
    /// body's id), for support tickets and the trajectory.
    pub request_id: Option<String>,
    /// How many attempts it took (1 = no retry).
    pub attempts: u32,
    /// Wall time of the whole call, retries and their waits included.
    pub latency_ms: u64,
}

/// What a call reports while it runs (to the `on_delta` callback of [`crate::Llm::chat`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StreamDelta<'a> {
    /// More text (streamed calls only).
    Text(&'a str),
    /// The model began a tool call (streamed calls only).
    ToolCallStarted {
        /// The tool's name.
        name: &'a str,
    },
    /// The attempt failed and another follows after `delay_ms`. Anything streamed so far in
    /// this call is discarded: the next attempt starts the answer over.
    Retrying {
        /// The number of the attempt about to be made (2 for the first retry).
        attempt: u32,
        /// How long the call waits first.
        delay_ms: u64,
        /// Why the last attempt failed.
        reason: &'a str,
    },
}

/// Tool arguments from the model's JSON text: empty means no arguments (`{}`); text that is
/// not JSON is kept as a `Value::String` of itself, so the agent can show the model its
/// mistake rather than lose it.
pub(crate) fn parse_arguments(raw: &str) -> serde_json::Value {
    if raw.trim().is_empty() {
        return serde_json::Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_string()))
}

/// The usage the server reported, or an estimate from the request and the answer (marked).
pub(crate) fn usage_or_estimate(
    reported: Option<(u64, u64)>,
    req: &crate::message::ChatRequest,
    text: &str,
    calls: &[ToolCall],
) -> Usage {
    match reported {
        Some((input_tokens, output_tokens)) => Usage {
            input_tokens,
            output_tokens,
            estimated: false,
        },
        None => {
            let mut out = crate::message::estimate_tokens(text);
            for c in calls {
                out += crate::message::estimate_tokens(&c.name);
                out += crate::message::estimate_tokens(&c.arguments.to_string());
            }
            Usage {
                input_tokens: req.estimated_input_tokens(),
                output_tokens: out,
                estimated: true,
            }
        }
    }
}

/// Turns one protocol's stream of events into a [`ChatResponse`], reporting text and tool
/// calls to the caller as they come.
pub(crate) trait StreamAssembler {
    /// Takes the next event.
    fn event(
        &mut self,
        ev: &crate::sse::SseEvent,
        on_delta: &mut dyn FnMut(StreamDelta<'_>),
    ) -> Result<(), crate::error::LlmError>;

    /// Whether the protocol's end marker came (nothing more need be read).
    fn is_done(&self) -> bool;

    /// The answer, or a `Transport` error when the stream ended before its end (so it is
    /// retried).
    fn finish(
        self,
        req: &crate::message::ChatRequest,
    ) -> Result<ChatResponse, crate::error::LlmError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_are_snake_case() {
        assert_eq!(
            serde_json::to_string(&FinishReason::ToolCalls).unwrap(),
            "\"tool_calls\""
        );
        assert_eq!(
            serde_json::to_string(&FinishReason::ContentFilter).unwrap(),
            "\"content_filter\""
        );
        let o = FinishReason::Other("pause_turn".into());
        let j = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<FinishReason>(&j).unwrap(), o);
    }

    #[test]
    fn arguments_parse_or_stay_raw() {
        assert_eq!(parse_arguments(r#"{"a":1}"#), serde_json::json!({"a": 1}));
        assert_eq!(parse_arguments("  "), serde_json::json!({}));
        assert_eq!(
            parse_arguments(r#"{"a":"#),
            serde_json::Value::String(r#"{"a":"#.into())
        );
    }
}
