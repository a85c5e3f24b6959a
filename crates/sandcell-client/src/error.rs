//! The client's one error type.

/// The body of every error the API answers, and of a stream's `error` event:
/// `{code, message, details}`.
pub use sandcell_api::error::ErrorBody;

/// The body of a failed answer: the server's error object, or for anything else (a proxy's
/// page, an empty body) code `error` with the text as its message.
pub fn parse_error_body(bytes: &[u8]) -> ErrorBody {
    if let Ok(body) = serde_json::from_slice::<ErrorBody>(bytes) {
        return body;
    }
    let json = serde_json::from_slice::<serde_json::Value>(bytes).ok();
    let field = |name: &str| {
        json.as_ref()
            .and_then(|v| v.get(name))
            .and_then(|m| m.as_str())
            .map(str::to_string)
    };
    let message = field("message").unwrap_or_else(|| match &json {
        Some(v) => v.to_string(),
        None => String::from_utf8_lossy(bytes).into_owned(),
    });
    ErrorBody {
        code: field("code").unwrap_or_else(|| "error".to_string()),
        message,
        details: serde_json::Value::Null,
    }
}

/// What can go wrong talking to the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon answered with an error.
    #[error("{} ({status}): {}", body.code, body.message)]
    Api {
        /// The HTTP status.
        status: u16,
        /// What it said.
        body: ErrorBody,
    },
    /// A stream reported an error in its course (an `error` event of the service).
    #[error("{}: {}", .0.code, .0.message)]
    Stream(ErrorBody),
    /// No daemon or no key was found.
    #[error("{0}")]
    Discovery(String),
    /// The request did not get through, or its answer was cut (the reason is the
    /// source, shown by `{:#}` in anyhow or by walking `source()`).
    #[error("{what}")]
    Transport {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not the type the route answers.
    #[error("the daemon's answer to {route} is not what was expected: {message}")]
    Decode {
        /// The route.
        route: String,
        /// What did not fit.
        message: String,
    },
    /// A local file of an upload or download.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    /// The daemon's error body, when it answered one.
    pub fn body(&self) -> Option<&ErrorBody> {
        match self {
            Self::Api { body, .. } | Self::Stream(body) => Some(body),
            _ => None,
        }
    }

    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The error code of an error answer or event (`not_found`, …).
    pub fn code(&self) -> Option<&str> {
        self.body().map(|b| b.code.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_bodies_parse_with_and_without_details() {
        let b = parse_error_body(br#"{"code":"not_found","message":"no sandbox sb-1"}"#);
        assert_eq!(
            (b.code.as_str(), b.message.as_str(), &b.details),
            ("not_found", "no sandbox sb-1", &serde_json::Value::Null)
        );
        let b = parse_error_body(
            br#"{"code":"invalid_argument","message":"bad","details":{"field":"size"}}"#,
        );
        assert_eq!(b.details["field"], "size");
        let e = ClientError::Api {
            status: 404,
            body: parse_error_body(br#"{"code":"not_found","message":"no sandbox sb-1"}"#),
        };
        assert_eq!(e.to_string(), "not_found (404): no sandbox sb-1");
        assert_eq!((e.status(), e.code()), (Some(404), Some("not_found")));
    }

    #[test]
    fn other_bodies_become_code_error() {
        let b = parse_error_body(b"Bad Gateway");
        assert_eq!(
            (b.code.as_str(), b.message.as_str()),
            ("error", "Bad Gateway")
        );
        let b = parse_error_body(b"");
        assert_eq!((b.code.as_str(), b.message.as_str()), ("error", ""));
        // A JSON body without a message: the whole body is the message.
        let b = parse_error_body(br#"{"code":"busy"}"#);
        assert_eq!(
            (b.code.as_str(), b.message.as_str()),
            ("busy", r#"{"code":"busy"}"#)
        );
        let b = parse_error_body(b"[1,2]");
        assert_eq!((b.code.as_str(), b.message.as_str()), ("error", "[1,2]"));
    }
}
