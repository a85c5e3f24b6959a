//! The error body every route answers with.

use serde::{Deserialize, Serialize};

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// A stable, machine-readable code (`not_found`, `invalid_argument`, …).
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// More about it, when there is more (e.g. the field at fault).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub details: serde_json::Value,
}
