//! Moving files between sandboxes and the host: exports (a file or folder copied out of a
//! sandbox and kept by the service, downloadable and importable into other sandboxes after
//! the first one is gone), imports (from an allowed host path, inline text or base64, or an
//! export), and the artifacts folder.
//!
//! Split along its seams: [`exports`] (the service's copies and their signed links),
//! [`import`] (host trees and exports into a sandbox), [`policy`] (which host paths may be
//! imported from) and [`artifacts`].

pub mod artifacts;
pub mod exports;
pub mod import;
pub mod policy;

use crate::{ErrorKind, ServiceError};

pub use exports::{ExportAccess, ExportContent};
pub use policy::HostPathPolicy;

/// Deepest folder tree an export or import walks.
pub const MAX_DEPTH: usize = 64;
/// Most files one export or import moves.
pub const MAX_FILES: usize = 100_000;

/// A host I/O failure of the service.
fn io_error(what: &str, e: std::io::Error) -> ServiceError {
    ServiceError::internal(format!("{what}: {e}"))
}

/// Over the size limit of one transfer.
fn too_large(cap: u64) -> ServiceError {
    ServiceError::new(
        ErrorKind::BodyTooLarge,
        format!("transfers are limited to {cap} bytes (limits.max_upload_bytes)"),
    )
}
