//! Engine errors. Front ends map them to their wire formats through [`EngineError::code`].

use sandcell_protocol::{ErrorCode, WireError};

/// Why an engine call failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The sandbox spec is invalid.
    #[error("invalid sandbox spec: {0}")]
    InvalidSpec(String),
    /// A request's arguments are invalid.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// No backend of this kind was given to the engine.
    #[error("{0}")]
    BackendUnavailable(String),
    /// The sandbox could not be started.
    #[error("sandbox failed to start at stage '{stage}': {message}")]
    Launch {
        /// The setup step that failed.
        stage: String,
        /// What went wrong.
        message: String,
    },
    /// The guest agent answered with an error.
    #[error("{0}")]
    Guest(WireError),
    /// The connection to the guest agent broke or misbehaved.
    #[error("guest connection: {0}")]
    Connection(String),
    /// The sandbox is gone (destroyed, or its agent died).
    #[error("sandbox {id} is gone: {reason}")]
    SandboxGone {
        /// The sandbox id.
        id: String,
        /// Why it is gone.
        reason: String,
    },
    /// The agent did not answer in time.
    #[error("guest agent did not answer: {0}")]
    Unresponsive(String),
    /// No such sandbox (or one of another owner's, which is the same to the caller).
    #[error("no {what} '{id}'")]
    NotFound {
        /// What was looked for.
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// A snapshot on disk does not match its record (changed, truncated, unknown format).
    #[error("the snapshot is corrupt: {0}")]
    Corrupt(String),
    /// The backend or host cannot do this (for example pause without a cgroup freezer).
    #[error("{0}")]
    Unsupported(String),
    /// A cap was reached (sandboxes in all or per owner).
    #[error("{0}")]
    LimitExceeded(String),
    /// The service's records could not be read or written.
    #[error("the sandbox records could not be saved: {0}")]
    Persistence(String),
    /// A host-side I/O error.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl EngineError {
    /// The shared error class, for front ends.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidSpec(_) | Self::InvalidRequest(_) => ErrorCode::InvalidArgument,
            Self::BackendUnavailable(_) => ErrorCode::InvalidArgument,
            Self::Guest(e) => e.code,
            Self::SandboxGone { .. } => ErrorCode::InvalidState,
            Self::NotFound { .. } => ErrorCode::NotFound,
            Self::LimitExceeded(_) => ErrorCode::LimitExceeded,
            Self::Unsupported(_) => ErrorCode::InvalidState,
            Self::Corrupt(_) => ErrorCode::Internal,
            Self::Persistence(_) => ErrorCode::Internal,
            Self::Launch { .. } | Self::Connection(_) | Self::Unresponsive(_) | Self::Io { .. } => {
                ErrorCode::Internal
            }
        }
    }

    /// Wraps a host-side I/O error.
    pub fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            op: op.into(),
            source,
        }
    }
}
