//! One error type for every provider, classified into a closed set of kinds so callers decide
//! on the kind (retry, turn vision off, give up) rather than on a status or a message.

use serde::{Deserialize, Serialize};

/// What went wrong, as far as a caller needs to act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmErrorKind {
    /// Our own setup: no key, an unknown provider, a client that cannot be built.
    Config,
    /// 401 or 403: the key is wrong or lacks access.
    Auth,
    /// 400 or 422 (and other 4xx not listed here): the request itself is wrong.
    BadRequest,
    /// 404: usually an unknown model or a wrong base URL.
    NotFound,
    /// A 400 whose message is about images: the model takes no vision input, so the agent
    /// turns images off and tries again.
    ImagesRejected,
    /// 429.
    RateLimited,
    /// 529 or Anthropic's `overloaded_error`.
    Overloaded,
    /// 5xx, 408, 409.
    Server,
    /// The connection failed, timed out, or a stream dropped before its end.
    Transport,
    /// The answer could not be understood.
    Decode,
}

impl LlmErrorKind {
    /// The stable name used in trajectories and by front ends.
    pub fn wire_name(self) -> &'static str {
        match self {
            LlmErrorKind::Config => "config",
            LlmErrorKind::Auth => "auth",
            LlmErrorKind::BadRequest => "bad_request",
            LlmErrorKind::NotFound => "not_found",
            LlmErrorKind::ImagesRejected => "images_rejected",
            LlmErrorKind::RateLimited => "rate_limited",
            LlmErrorKind::Overloaded => "overloaded",
            LlmErrorKind::Server => "server",
            LlmErrorKind::Transport => "transport",
            LlmErrorKind::Decode => "decode",
        }
    }

    /// Whether trying the same request again later may succeed.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            LlmErrorKind::RateLimited
                | LlmErrorKind::Overloaded
                | LlmErrorKind::Server
                | LlmErrorKind::Transport
        )
    }

    /// The kind of an HTTP error status (before looking at the body).
    pub fn from_status(status: u16) -> Self {
        match status {
            401 | 403 => LlmErrorKind::Auth,
            404 => LlmErrorKind::NotFound,
            429 => LlmErrorKind::RateLimited,
            529 => LlmErrorKind::Overloaded,
            408 | 409 => LlmErrorKind::Server,
            500..=599 => LlmErrorKind::Server,
            _ => LlmErrorKind::BadRequest,
        }
    }
}

/// A failed model call. The message carries the provider's own error message, never the key.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct LlmError {
    /// The classification callers act on.
    pub kind: LlmErrorKind,
    /// The HTTP status, when the server answered with one.
    pub status: Option<u16>,
    /// What happened, with the provider's message.
    pub message: String,
    /// How many attempts were made (1 = no retry; 0 = failed before sending).
    pub attempts: u32,
}

impl LlmError {
    /// An error of `kind` with no status, before any attempt.
    pub fn new(kind: LlmErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            status: None,
            message: message.into(),
            attempts: 0,
        }
    }

    /// A setup error.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(LlmErrorKind::Config, message)
    }

    /// Whether trying again later may succeed (rate limits, overload, 5xx, transport).
    pub fn retryable(&self) -> bool {
        self.kind.retryable()
    }

    /// The kind's stable name ("auth", "rate_limited", …).
    pub fn wire_name(&self) -> &'static str {
        self.kind.wire_name()
    }
}

/// Whether a provider's message about a rejected request is about images (the model takes
/// no vision input or refused this image), worded as OpenAI, Anthropic and the usual
/// compatible servers word it.
pub(crate) fn mentions_images(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["image", "vision", "multimodal", "multi-modal"]
        .iter()
        .any(|w| m.contains(w))
}

/// Classifies an HTTP error answer: its status, the provider's error type if it sent one,
/// and its message.
pub(crate) fn classify(status: u16, error_type: Option<&str>, message: &str) -> LlmErrorKind {
    if error_type == Some("overloaded_error") {
        return LlmErrorKind::Overloaded;
    }
    let kind = LlmErrorKind::from_status(status);
    if kind == LlmErrorKind::BadRequest && matches!(status, 400 | 422) && mentions_images(message) {
        return LlmErrorKind::ImagesRejected;
    }
    kind
}

/// The kind of an error reported inside a stream (no status), from its `type`/`code`:
/// Anthropic's error types, and the OpenAI-style ones compatible servers send.
pub(crate) fn classify_stream_error(error_type: Option<&str>, message: &str) -> LlmErrorKind {
    match error_type.unwrap_or("") {
        "overloaded_error" => LlmErrorKind::Overloaded,
        "rate_limit_error" | "rate_limit_exceeded" | "rate_limit" => LlmErrorKind::RateLimited,
        "authentication_error" | "permission_error" => LlmErrorKind::Auth,
        "not_found_error" => LlmErrorKind::NotFound,
        "invalid_request_error" | "request_too_large" => {
            if mentions_images(message) {
                LlmErrorKind::ImagesRejected
            } else {
                LlmErrorKind::BadRequest
            }
        }
        // api_error, server_error, or nothing we know: the server failed mid-answer.
        _ => LlmErrorKind::Server,
    }
}

/// The provider's message and error type from an error body: `{"error":{"message","type"}}`
/// (OpenAI and Anthropic), else the shapes compatible servers use (`{"error":"…"}`,
/// `{"message":"…"}`, `{"detail":"…"}`), else the body's start.
pub(crate) fn parse_error_body(body: &[u8]) -> (String, Option<String>) {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(err) = v.get("error") {
            if let Some(s) = err.as_str() {
                return (s.to_string(), None);
            }
            let ty = err
                .get("type")
                .and_then(|t| t.as_str())
                .or_else(|| err.get("code").and_then(|t| t.as_str()))
                .map(str::to_string);
            if let Some(m) = err.get("message").and_then(|m| m.as_str()) {
                return (m.to_string(), ty);
            }
        }
        for field in ["message", "detail"] {
            if let Some(m) = v.get(field).and_then(|m| m.as_str()) {
                return (m.to_string(), None);
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut cut: String = text.chars().take(500).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    (cut, None)
}

/// Removes a key from a message in case a server echoed it back.
pub(crate) fn redact(message: String, key: Option<&str>) -> String {
    match key {
        // Very short keys (test values) would blank out ordinary words.
        Some(k) if k.len() >= 8 && message.contains(k) => message.replace(k, "***"),
        _ => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_kinds() {
        assert_eq!(LlmErrorKind::from_status(401), LlmErrorKind::Auth);
        assert_eq!(LlmErrorKind::from_status(403), LlmErrorKind::Auth);
        assert_eq!(LlmErrorKind::from_status(400), LlmErrorKind::BadRequest);
        assert_eq!(LlmErrorKind::from_status(422), LlmErrorKind::BadRequest);
        assert_eq!(LlmErrorKind::from_status(404), LlmErrorKind::NotFound);
        assert_eq!(LlmErrorKind::from_status(429), LlmErrorKind::RateLimited);
        assert_eq!(LlmErrorKind::from_status(529), LlmErrorKind::Overloaded);
        for s in [408, 409, 500, 502, 503, 504] {
            assert_eq!(LlmErrorKind::from_status(s), LlmErrorKind::Server, "{s}");
            assert!(LlmErrorKind::from_status(s).retryable());
        }
        for s in [400, 401, 403, 404, 422] {
            assert!(!LlmErrorKind::from_status(s).retryable(), "{s}");
        }
    }

    #[test]
    fn image_rejections_are_their_own_kind() {
        assert_eq!(
            classify(
                400,
                Some("invalid_request_error"),
                "Invalid content type. image_url is only supported by certain models."
            ),
            LlmErrorKind::ImagesRejected
        );
        assert_eq!(
            classify(400, None, "this model is not a multimodal model"),
            LlmErrorKind::ImagesRejected
        );
        assert_eq!(
            classify(400, None, "max_tokens: field required"),
            LlmErrorKind::BadRequest
        );
        // A 404 about images is still a 404.
        assert_eq!(
            classify(404, None, "image not found"),
            LlmErrorKind::NotFound
        );
        assert_eq!(
            classify(500, Some("overloaded_error"), "Overloaded"),
            LlmErrorKind::Overloaded
        );
    }

    #[test]
    fn error_bodies_give_the_provider_message() {
        let (m, t) = parse_error_body(
            br#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
        );
        assert_eq!(m, "invalid x-api-key");
        assert_eq!(t.as_deref(), Some("authentication_error"));
        let (m, t) = parse_error_body(
            br#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
        );
        assert_eq!(m, "Incorrect API key provided");
        assert_eq!(t.as_deref(), Some("invalid_request_error"));
        assert_eq!(parse_error_body(br#"{"detail":"nope"}"#).0, "nope");
        assert_eq!(parse_error_body(br#"{"error":"flat"}"#).0, "flat");
        assert_eq!(parse_error_body(b"  Bad Gateway\n").0, "Bad Gateway");
    }

    #[test]
    fn wire_names_are_snake_case_and_match_serde() {
        for k in [
            LlmErrorKind::Config,
            LlmErrorKind::Auth,
            LlmErrorKind::BadRequest,
            LlmErrorKind::NotFound,
            LlmErrorKind::ImagesRejected,
            LlmErrorKind::RateLimited,
            LlmErrorKind::Overloaded,
            LlmErrorKind::Server,
            LlmErrorKind::Transport,
            LlmErrorKind::Decode,
        ] {
            assert_eq!(
                serde_json::to_value(k).unwrap(),
                serde_json::Value::String(k.wire_name().into())
            );
        }
        let e = LlmError::new(LlmErrorKind::RateLimited, "slow down");
        assert_eq!(e.wire_name(), "rate_limited");
        assert!(e.retryable());
        assert_eq!(e.to_string(), "slow down");
    }

    #[test]
    fn redacts_an_echoed_key() {
        let m = redact(
            "bad key sk-secret-123456 given".into(),
            Some("sk-secret-123456"),
        );
        assert_eq!(m, "bad key *** given");
    }
}
