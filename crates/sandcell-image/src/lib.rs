//! Sandcell's images: what templates are built into and sandboxes start from.
//!
//! - [`store`]: an OCI image layout on disk (content-addressed blobs, tagged manifests) with
//!   a layer cache by build-step key and garbage collection of what nothing uses;
//! - [`bases`]: what a `FROM` names, found without a registry (`host`, the store,
//!   `debian:<suite>` made with mmdebstrap);
//! - [`import`]: images brought in from files (OCI layouts and archives, `docker save`
//!   archives, root filesystem tarballs), and an image's root filesystem written out;
//! - [`roots`]: images unpacked once for the sandboxes made from them;
//! - [`layer`]: a build step's changes (an overlay's upper folder, whiteouts included) as a
//!   layer tar, and layers applied in order onto a root folder.
#![forbid(unsafe_code)]

pub mod bases;
pub mod import;
pub mod layer;
pub mod roots;
pub mod store;

pub use bases::{Base, DebianOptions, Resolved, resolve};
pub use import::{Imported, flatten, import};
pub use layer::{IdRange, LayerStats, apply, write_diff};
pub use roots::{chain_id, unpacked_layers, unpacked_root};
pub use store::{Collected, Descriptor, Hashing, Image, Manifest, Store};

/// Why an image operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file system refused.
    #[error("{op}: {source}")]
    Io {
        /// What was being done, to which path.
        op: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A request or a layer that cannot be used as it is.
    #[error("{0}")]
    Invalid(String),
    /// No image has this name.
    #[error("no image named '{0}' (sandcell image ls; sandcell image import FILE --as NAME)")]
    Missing(String),
    /// The store holds something other than what it recorded.
    #[error("the image store is damaged: {0}")]
    Corrupt(String),
}
