//! The one place errors become HTTP responses: `{code, message, details}` with the status the
//! code calls for.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sandcell_engine::EngineError;
use sandcell_protocol::ErrorCode;
use serde::Serialize;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code (`not_found`, `invalid_argument`, …).
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// More about it, when there is more (e.g. the field at fault).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// An error on its way to the client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody {
                code: code.to_string(),
                message: message.into(),
                details: serde_json::Value::Null,
            },
        }
    }

    /// Adds details.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.body.details = details;
        self
    }

    /// 400: the request is malformed or a field is invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_argument", message)
    }

    /// 404: no such thing (for this caller).
    pub fn not_found(what: &str, id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no {what} '{id}'"),
        )
    }

    /// 401: no valid API key.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", message)
    }

    /// 403: the key may not do this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "permission_denied", message)
    }

    /// 500: a fault of the service.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The machine-readable code.
    pub fn code(&self) -> &str {
        &self.body.code
    }

    /// The body, for streams that report errors as events.
    pub fn body(&self) -> &ErrorBody {
        &self.body
    }
}

/// The HTTP status and wire name of a shared error code.
pub fn status_of(code: ErrorCode) -> (StatusCode, &'static str) {
    use ErrorCode as C;
    match code {
        C::InvalidArgument => (StatusCode::BAD_REQUEST, "invalid_argument"),
        C::PathOutsideSandbox => (StatusCode::BAD_REQUEST, "path_outside_sandbox"),
        C::NotADirectory => (StatusCode::BAD_REQUEST, "not_a_directory"),
        C::IsADirectory => (StatusCode::BAD_REQUEST, "is_a_directory"),
        C::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        C::NoSuchProcess => (StatusCode::NOT_FOUND, "no_such_process"),
        C::AlreadyExists => (StatusCode::CONFLICT, "already_exists"),
        C::DirectoryNotEmpty => (StatusCode::CONFLICT, "directory_not_empty"),
        C::InvalidState => (StatusCode::CONFLICT, "invalid_state"),
        C::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
        C::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
        C::SpawnFailed => (StatusCode::UNPROCESSABLE_ENTITY, "spawn_failed"),
        C::LimitExceeded => (StatusCode::TOO_MANY_REQUESTS, "limit_exceeded"),
        C::BadFrame
        | C::FrameTooLarge
        | C::UnsupportedVersion
        | C::HandshakeRequired
        | C::Io
        | C::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let code = match &e {
            EngineError::SandboxGone { .. } => {
                return Self::new(StatusCode::CONFLICT, "sandbox_gone", e.to_string());
            }
            EngineError::Unresponsive(_) => {
                return Self::new(StatusCode::GATEWAY_TIMEOUT, "unresponsive", e.to_string());
            }
            EngineError::Unsupported(_) => {
                return Self::new(StatusCode::CONFLICT, "unsupported", e.to_string());
            }
            other => other.code(),
        };
        let (status, name) = status_of(code);
        Self::new(status, name, e.to_string())
    }
}

impl From<sandcell_store::StoreError> for ApiError {
    fn from(e: sandcell_store::StoreError) -> Self {
        Self::internal(format!("the service's records: {e}"))
    }
}

/// Marks an error response with its code, for the metrics and the request log.
#[derive(Debug, Clone)]
pub struct ErrorTag(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let tag = ErrorTag(self.body.code.clone());
        let mut resp = (self.status, Json(self.body)).into_response();
        resp.extensions_mut().insert(tag);
        resp
    }
}

/// What handlers return.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_get_their_statuses() {
        let e: ApiError = EngineError::NotFound {
            what: "sandbox",
            id: "sb-x".into(),
        }
        .into();
        assert_eq!((e.status(), e.code()), (StatusCode::NOT_FOUND, "not_found"));
        let e: ApiError = EngineError::LimitExceeded("too many".into()).into();
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        let e: ApiError = EngineError::InvalidSpec("bad".into()).into();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let e: ApiError = EngineError::SandboxGone {
            id: "sb-x".into(),
            reason: "stopped".into(),
        }
        .into();
        assert_eq!(
            (e.status(), e.code()),
            (StatusCode::CONFLICT, "sandbox_gone")
        );
    }
}
