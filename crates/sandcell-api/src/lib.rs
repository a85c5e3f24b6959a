//! The types of Sandcell's REST API: every request and response body, one module per
//! resource, and the rules on their values ([`rules`]), each written once and used by the
//! service, the engine and the typed client alike.
//!
//! With the `openapi` feature the types also derive their OpenAPI schemas (the server's
//! document); clients leave it off and link only serde.

#![forbid(unsafe_code)]

pub mod code;
pub mod discovery;
pub mod error;
pub mod exec;
pub mod files;
pub mod git;
pub mod keys;
pub mod memories;
pub mod network;
pub mod previews;
pub mod processes;
pub mod rules;
pub mod runs;
pub mod sandboxes;
pub mod snapshots;
pub mod system;
pub mod templates;
pub mod time;
pub mod transfer;
pub mod usage;
pub mod values;
pub mod volumes;

pub use rules::ValidationError;
pub use values::{Code, SandboxId, Seconds, Tags, Timeout};
