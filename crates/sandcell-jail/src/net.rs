//! Network setup inside the sandbox's own network namespace.

use crate::error::JailError;

/// Brings `lo` up in the current network namespace (a fresh namespace starts with it down).
pub fn loopback_up() -> Result<(), JailError> {
    // SAFETY: socket() takes no pointers; the returned fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(JailError::last_os("open a socket to configure lo"));
    }
    let result = set_up(fd);
    // SAFETY: fd is ours and not used after this.
    unsafe { libc::close(fd) };
    result
}

fn set_up(fd: libc::c_int) -> Result<(), JailError> {
    // SAFETY: ifreq is a plain C struct for which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags inside `req`, which lives for
    // the whole call and is the size the kernel expects.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(JailError::last_os("read the flags of lo"));
    }
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the initialized one.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(JailError::last_os("bring lo up"));
    }
    Ok(())
}
