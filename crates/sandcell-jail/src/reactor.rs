//! Registering a descriptor with tokio's reactor, whose safe constructor is deprecated as
//! unsound (it cannot know the descriptor stays open): the one `unsafe` call lives here.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Registers `fd` (non-blocking) with the current tokio runtime for readiness as `interest`
/// says (call it on a runtime thread).
pub fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `AsyncFd` requires the descriptor to stay open and the same until it is dropped.
    // It owns the `OwnedFd`, which closes it only on drop, and `AsRawFd` of an `OwnedFd` always
    // returns that one descriptor; nothing else here gets to close or replace it.
    let registered = unsafe { AsyncFd::register_with_interest(fd, interest) };
    registered.map_err(io::Error::from)
}
