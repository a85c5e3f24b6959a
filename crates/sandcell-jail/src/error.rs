//! Errors from isolation setup.

use std::io;
use std::path::PathBuf;

/// Why an isolation step failed.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Syscall {
        /// What was being done, e.g. `"mount /proc"`.
        op: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A cgroup file could not be created, written or read.
    #[error("cgroup {path}: {message}")]
    Cgroup {
        /// The cgroup file or directory.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The seccomp filter could not be built or loaded.
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// The Landlock ruleset could not be built or applied.
    #[error("landlock: {0}")]
    Landlock(String),
    /// This host cannot do it (a controller or kernel feature is missing).
    #[error("{0}")]
    Unsupported(String),
    /// The launch configuration is invalid.
    #[error("invalid jail config: {0}")]
    Config(String),
}

impl JailError {
    /// Wraps the last OS error for `op`.
    pub fn last_os(op: impl Into<String>) -> Self {
        Self::Syscall {
            op: op.into(),
            source: io::Error::last_os_error(),
        }
    }

    /// Wraps an `io::Error` for `op`.
    pub fn io(op: impl Into<String>, source: io::Error) -> Self {
        Self::Syscall {
            op: op.into(),
            source,
        }
    }
}

impl From<nix::Error> for JailError {
    fn from(e: nix::Error) -> Self {
        Self::Syscall {
            op: "syscall".into(),
            source: io::Error::from(e),
        }
    }
}
