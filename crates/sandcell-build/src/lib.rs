//! Template builds: a Dockerfile (the subset `sandcell-template` plans) run step by step into
//! layers of the image store.
//!
//! Each `RUN` runs in a build sandbox (`sandcell_jail::build`: uid 0 of a private id range,
//! an overlay over the base's unpacked root and the build's earlier steps, the network only
//! through an egress proxy that allows the registries); `COPY`, `ADD` and `WORKDIR` merge
//! files staged from the context in the same kind of sandbox. Each step's overlay upper
//! folder becomes a layer, cached under a key of its parent, the step and its inputs, so a
//! build that changes nothing reuses every layer and one that changes a copied file rebuilds
//! from that step. Progress and output are [`sandcell_api::templates::BuildEvent`]s.

#![forbid(unsafe_code)]

pub mod builder;
pub mod ids;
pub mod ignore;
pub mod registries;
pub mod source;
pub mod stage;
mod step;

pub use builder::{BuildRequest, Builder, BuilderConfig, Cancel};

use std::io;

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The Dockerfile, its plan or the context is wrong (the message names the line or path).
    #[error("{0}")]
    Invalid(String),
    /// A step's command failed.
    #[error("step {index} ({text}) failed with exit code {exit_code}{}", oom_note(*.oom_killed))]
    StepFailed {
        /// 1-based.
        index: u32,
        /// The instruction.
        text: String,
        /// Its exit code.
        exit_code: i32,
        /// The step ran out of memory.
        oom_killed: bool,
    },
    /// A build sandbox could not be made.
    #[error("step {index}: the build sandbox could not be made: {message}")]
    Sandbox {
        /// 1-based.
        index: u32,
        /// Why.
        message: String,
    },
    /// The image store failed.
    #[error(transparent)]
    Image(#[from] sandcell_image::ImageError),
    /// A file operation on the host failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Too many builds at once.
    #[error("{0}")]
    Busy(String),
    /// The build was cancelled.
    #[error("the build was cancelled")]
    Cancelled,
}

fn oom_note(oom: bool) -> &'static str {
    if oom { " (it ran out of memory)" } else { "" }
}

impl BuildError {
    /// Wraps an `io::Error` for `op` (for `map_err`).
    pub fn io(op: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let op = op.into();
        move |source| Self::Io { op, source }
    }
}
