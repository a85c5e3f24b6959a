//! The one place errors become HTTP responses: `{code, message, details}` with the status the
//! code calls for.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sandcell_engine::EngineError;
use sandcell_service::{ErrorKind, ServiceError};

pub use sandcell_api::error::ErrorBody;

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

/// The HTTP status of each kind of service error: the only place that knows it.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    use ErrorKind as K;
    match kind {
        K::InvalidArgument | K::PathOutsideSandbox | K::NotADirectory | K::IsADirectory => {
            StatusCode::BAD_REQUEST
        }
        K::Unauthenticated => StatusCode::UNAUTHORIZED,
        K::PermissionDenied => StatusCode::FORBIDDEN,
        K::NotFound | K::NoSuchProcess => StatusCode::NOT_FOUND,
        K::AlreadyExists
        | K::DirectoryNotEmpty
        | K::HasChildren
        | K::InvalidState
        | K::SandboxGone
        | K::Unsupported
        | K::SnapshotCorrupt => StatusCode::CONFLICT,
        K::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        K::SpawnFailed => StatusCode::UNPROCESSABLE_ENTITY,
        K::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
        K::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        K::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
        K::Unresponsive => StatusCode::GATEWAY_TIMEOUT,
        K::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        Self::new(status_of(e.kind), e.kind.wire_name(), e.message).with_details(e.details)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        ServiceError::from(e).into()
    }
}

impl From<sandcell_store::StoreError> for ApiError {
    fn from(e: sandcell_store::StoreError) -> Self {
        ServiceError::from(e).into()
    }
}

impl From<sandcell_api::ValidationError> for ApiError {
    fn from(e: sandcell_api::ValidationError) -> Self {
        ServiceError::from(e).into()
    }
}

/// The `Retry-After` of a 503 `unavailable`, in seconds: a snapshot's pause is well under it.
const UNAVAILABLE_RETRY_AFTER_SECS: &str = "1";

/// Marks an error response with its code, for the metrics and the request log.
#[derive(Debug, Clone)]
pub struct ErrorTag(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let tag = ErrorTag(self.body.code.clone());
        let status = self.status;
        let mut resp = (status, Json(self.body)).into_response();
        resp.extensions_mut().insert(tag);
        // `unavailable` lasts a moment (a snapshot): say when to ask again.
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(UNAVAILABLE_RETRY_AFTER_SECS),
            );
        }
        resp
    }
}

/// What handlers return.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_status_and_its_wire_name() {
        for kind in ErrorKind::ALL {
            let e: ApiError = ServiceError::new(kind, "x").into();
            assert_eq!(e.code(), kind.wire_name());
            assert!(e.status().is_client_error() || e.status().is_server_error());
        }
    }

    #[test]
    fn unavailable_is_a_503_saying_when_to_ask_again() {
        let resp = ApiError::from(ServiceError::new(ErrorKind::Unavailable, "snapshotting"))
            .into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            resp.headers()
                .get(axum::http::header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        let conflict =
            ApiError::from(ServiceError::new(ErrorKind::InvalidState, "x")).into_response();
        assert!(
            conflict
                .headers()
                .get(axum::http::header::RETRY_AFTER)
                .is_none()
        );
    }

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
