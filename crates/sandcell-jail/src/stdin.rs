//! Taking a connection a process was started with on its stdin.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::error::JailError;

/// The Unix socket this process was given as stdin, as a close-on-exec stream of its own,
/// with `/dev/null` left on stdin: processes started after must not inherit the connection
/// (without close-on-exec every exec would hold it as fd 3 and could talk past its owner).
///
/// Call it before anything else owns or reads fd 0 (the gVisor guest entry does, first).
pub fn take_socket() -> Result<UnixStream, JailError> {
    let stdin = std::io::stdin().as_raw_fd();
    // SAFETY: fd 0 is open (the backend always passes the socket there) and nothing else in
    // this process owns it: the agent has not started; the duplicate is the stream's own fd.
    let dup = unsafe { libc::fcntl(stdin, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(JailError::last_os("take the host connection from stdin"));
    }
    // SAFETY: `dup` was just returned by fcntl(F_DUPFD_CLOEXEC) and is owned by nobody else.
    let socket = UnixStream::from(unsafe { OwnedFd::from_raw_fd(dup) });
    let null = std::fs::File::open("/dev/null").map_err(|e| JailError::io("open /dev/null", e))?;
    // SAFETY: both fds are open; dup2 only replaces fd 0, which nothing else uses now.
    if unsafe { libc::dup2(null.as_raw_fd(), stdin) } < 0 {
        return Err(JailError::last_os("replace stdin"));
    }
    Ok(socket)
}
