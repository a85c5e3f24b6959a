//! Receiving descriptors sent over a Unix socket (`SCM_RIGHTS`), for hosts that read a
//! launcher's messages.

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Reads up to `buf.len()` bytes from `socket` with `recvmsg`, keeping any descriptors sent
/// with them (close-on-exec). Returns the byte count (0 at the end) and the descriptors.
pub fn recv_with_fds(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let msg = recvmsg::<()>(
        std::os::fd::AsRawFd::as_raw_fd(&socket),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: SCM_RIGHTS just installed these descriptors in our table; nothing else
            // owns them.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    Ok((msg.bytes, fds))
}

/// Sends as much of `bytes` as the socket takes now with `fd` attached (to the first byte);
/// returns the count sent. Non-blocking sockets answer `WouldBlock` like `send`.
pub fn send_with_fd(socket: BorrowedFd<'_>, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    let fds = [fd.as_raw_fd()];
    let iov = [io::IoSlice::new(bytes)];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io::Error::from)
}

/// Makes `cmd`'s process start with `fd` open as descriptor `target` (and only there: the
/// original stays close-on-exec, so no other child inherits it).
pub fn pass_fd(cmd: &mut std::process::Command, fd: OwnedFd, target: RawFd) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let source = fd.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and calls only dup2 and fcntl,
    // which are async-signal-safe; `fd` is moved into the closure, so it stays open in the
    // parent until the Command (and the closure) is dropped, after the spawn.
    unsafe {
        cmd.pre_exec(move || {
            let _keep = &fd;
            if source == target {
                if libc::fcntl(target, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(source, target) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_descriptor_sent_with_bytes_arrives_with_them() {
        use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
        let (a, b) = UnixStream::pair().unwrap();
        let (passed, _keep) = UnixStream::pair().unwrap();
        let fds = [std::os::fd::AsRawFd::as_raw_fd(&passed)];
        let iov = [io::IoSlice::new(b"hi")];
        sendmsg::<()>(
            std::os::fd::AsRawFd::as_raw_fd(&a),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let mut buf = [0u8; 8];
        let (n, got) = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi");
        assert_eq!(got.len(), 1);
    }
}
