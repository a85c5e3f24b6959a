//! Extractors whose rejections are the API's structured errors (axum's own answer in plain
//! text).

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::StatusCode;

use crate::error::ApiError;

/// A JSON body; a malformed one, a wrong type or an unknown field is a 400 naming it, a body
/// over the size cap a 413.
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// Path parameters; a bad one is a 400.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::BytesRejection(b) if b.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    "the request body is over the size limit (limits.max_request_bytes)",
                )
            }
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with 'Content-Type: application/json'",
            ),
            other => ApiError::invalid(format!("bad JSON body: {}", other.body_text())),
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::invalid(format!("bad path parameter: {}", r.body_text()))
    }
}

/// The pairs of a query string, in order (repeated keys kept).
pub fn query_pairs(raw: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    serde_urlencoded::from_str(raw.unwrap_or(""))
        .map_err(|e| ApiError::invalid(format!("bad query string: {e}")))
}
