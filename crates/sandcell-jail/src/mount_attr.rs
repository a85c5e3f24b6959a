//! `mount_setattr(2)`, which no safe wrapper we use exposes yet.

use std::io;

use crate::rootfs::c_path;

/// `MOUNT_ATTR_RDONLY`.
pub const RDONLY: u64 = 0x0000_0001;
/// `MOUNT_ATTR_NOSUID`.
pub const NOSUID: u64 = 0x0000_0002;
/// `MOUNT_ATTR_NODEV`.
pub const NODEV: u64 = 0x0000_0004;
/// `MOUNT_ATTR_NOEXEC`.
pub const NOEXEC: u64 = 0x0000_0008;

const AT_RECURSIVE: libc::c_uint = 0x8000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sets `attrs` (`RDONLY`, …) on the mount at `path`, and on every mount below it when
/// `recursive` (kernel 5.12+; ENOSYS before). Unlike a remount it leaves the other, possibly
/// locked, flags alone.
pub fn set(path: &str, attrs: u64, recursive: bool) -> io::Result<()> {
    let c = c_path(path).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated path and `attr` a correctly laid out struct
    // mount_attr whose size we pass; both outlive the call, which only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
