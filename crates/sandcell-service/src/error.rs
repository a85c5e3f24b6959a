//! The service's one error type: a closed set of kinds, a message for people and optional
//! details. Front ends map the kind (REST: `sandcell-server`'s `error.rs`, the only place that
//! knows HTTP statuses; MCP and the agent runtime: the kind's wire name).

use sandcell_engine::EngineError;
use sandcell_protocol::ErrorCode;

/// What kind of failure, closed: every front end can map each one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed or a field is invalid.
    InvalidArgument,
    /// A path leaves the sandbox's file roots.
    PathOutsideSandbox,
    /// A path that must be a directory is not.
    NotADirectory,
    /// A path that must not be a directory is one.
    IsADirectory,
    /// No such thing (for this caller: another owner's things are missing too).
    NotFound,
    /// No such process in the sandbox.
    NoSuchProcess,
    /// It exists already.
    AlreadyExists,
    /// A directory to remove has entries.
    DirectoryNotEmpty,
    /// Something still depends on it (a snapshot with forks).
    HasChildren,
    /// Not possible in the thing's present state.
    InvalidState,
    /// The sandbox ended (or was lost) while the request ran.
    SandboxGone,
    /// The sandbox's agent did not answer in time.
    Unresponsive,
    /// This backend or host cannot do that.
    Unsupported,
    /// A snapshot's stored files fail their checksum or cannot be read.
    SnapshotCorrupt,
    /// No valid credential.
    Unauthenticated,
    /// The credential may not do this.
    PermissionDenied,
    /// Out of disk space (in the sandbox or the service).
    NoSpace,
    /// A process could not be started.
    SpawnFailed,
    /// A cap or quota was reached.
    LimitExceeded,
    /// A request's body is over the size limit.
    BodyTooLarge,
    /// Not now, for a moment (the sandbox is being snapshotted): the same request may
    /// succeed shortly.
    Unavailable,
    /// A fault of the service.
    Internal,
}

impl ErrorKind {
    /// Every kind (for front ends that check their mapping is complete).
    pub const ALL: [ErrorKind; 22] = [
        Self::InvalidArgument,
        Self::PathOutsideSandbox,
        Self::NotADirectory,
        Self::IsADirectory,
        Self::NotFound,
        Self::NoSuchProcess,
        Self::AlreadyExists,
        Self::DirectoryNotEmpty,
        Self::HasChildren,
        Self::InvalidState,
        Self::SandboxGone,
        Self::Unresponsive,
        Self::Unsupported,
        Self::SnapshotCorrupt,
        Self::Unauthenticated,
        Self::PermissionDenied,
        Self::NoSpace,
        Self::SpawnFailed,
        Self::LimitExceeded,
        Self::BodyTooLarge,
        Self::Unavailable,
        Self::Internal,
    ];

    /// The stable, machine-readable name clients see (`code` in REST error bodies).
    pub fn wire_name(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::PathOutsideSandbox => "path_outside_sandbox",
            Self::NotADirectory => "not_a_directory",
            Self::IsADirectory => "is_a_directory",
            Self::NotFound => "not_found",
            Self::NoSuchProcess => "no_such_process",
            Self::AlreadyExists => "already_exists",
            Self::DirectoryNotEmpty => "directory_not_empty",
            Self::HasChildren => "has_children",
            Self::InvalidState => "invalid_state",
            Self::SandboxGone => "sandbox_gone",
            Self::Unresponsive => "unresponsive",
            Self::Unsupported => "unsupported",
            Self::SnapshotCorrupt => "snapshot_corrupt",
            Self::Unauthenticated => "unauthenticated",
            Self::PermissionDenied => "permission_denied",
            Self::NoSpace => "no_space",
            Self::SpawnFailed => "spawn_failed",
            Self::LimitExceeded => "limit_exceeded",
            Self::BodyTooLarge => "body_too_large",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }

    /// The kind of an error code shared with the guest agent.
    pub fn of_code(code: ErrorCode) -> Self {
        use ErrorCode as C;
        match code {
            C::InvalidArgument => Self::InvalidArgument,
            C::PathOutsideSandbox => Self::PathOutsideSandbox,
            C::NotADirectory => Self::NotADirectory,
            C::IsADirectory => Self::IsADirectory,
            C::NotFound => Self::NotFound,
            C::NoSuchProcess => Self::NoSuchProcess,
            C::AlreadyExists => Self::AlreadyExists,
            C::DirectoryNotEmpty => Self::DirectoryNotEmpty,
            C::InvalidState => Self::InvalidState,
            C::PermissionDenied => Self::PermissionDenied,
            C::NoSpace => Self::NoSpace,
            C::SpawnFailed => Self::SpawnFailed,
            C::LimitExceeded => Self::LimitExceeded,
            C::Unavailable => Self::Unavailable,
            C::BadFrame
            | C::FrameTooLarge
            | C::UnsupportedVersion
            | C::HandshakeRequired
            | C::Io
            | C::Internal => Self::Internal,
        }
    }
}

/// A failed operation.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ServiceError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What went wrong, for people.
    pub message: String,
    /// More about it, when there is more (e.g. the field at fault); `Null` when none.
    pub details: serde_json::Value,
}

/// What operations return.
pub type ServiceResult<T> = Result<T, ServiceError>;

impl ServiceError {
    /// An error of this kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            details: serde_json::Value::Null,
        }
    }

    /// Adds details.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = details;
        self
    }

    /// The request is malformed or a field is invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// No such thing (for this caller).
    pub fn not_found(what: &str, id: &str) -> Self {
        Self::new(ErrorKind::NotFound, format!("no {what} '{id}'"))
    }

    /// No valid credential.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthenticated, message)
    }

    /// The credential may not do this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }

    /// A fault of the service.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// The kind's wire name.
    pub fn code(&self) -> &'static str {
        self.kind.wire_name()
    }
}

impl From<EngineError> for ServiceError {
    fn from(e: EngineError) -> Self {
        let kind = match &e {
            EngineError::SandboxGone { .. } => ErrorKind::SandboxGone,
            EngineError::Unresponsive(_) => ErrorKind::Unresponsive,
            EngineError::Unsupported(_) => ErrorKind::Unsupported,
            other => ErrorKind::of_code(other.code()),
        };
        Self::new(kind, e.to_string())
    }
}

impl From<sandcell_store::StoreError> for ServiceError {
    fn from(e: sandcell_store::StoreError) -> Self {
        Self::internal(format!("the service's records: {e}"))
    }
}

impl From<sandcell_api::ValidationError> for ServiceError {
    fn from(e: sandcell_api::ValidationError) -> Self {
        Self::invalid(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_get_their_kinds() {
        let e: ServiceError = EngineError::NotFound {
            what: "sandbox",
            id: "sb-x".into(),
        }
        .into();
        assert_eq!(e.kind, ErrorKind::NotFound);
        let e: ServiceError = EngineError::LimitExceeded("too many".into()).into();
        assert_eq!(e.kind, ErrorKind::LimitExceeded);
        let e: ServiceError = EngineError::InvalidSpec("bad".into()).into();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let e: ServiceError = EngineError::SandboxGone {
            id: "sb-x".into(),
            reason: "stopped".into(),
        }
        .into();
        assert_eq!((e.kind, e.code()), (ErrorKind::SandboxGone, "sandbox_gone"));
    }

    #[test]
    fn wire_names_are_unique() {
        let names: std::collections::HashSet<_> =
            ErrorKind::ALL.iter().map(|k| k.wire_name()).collect();
        assert_eq!(names.len(), ErrorKind::ALL.len());
    }
}
