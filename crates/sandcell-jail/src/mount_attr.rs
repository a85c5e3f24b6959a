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

/// `MOUNT_ATTR_IDMAP`.
const IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;

/// Mounts a copy of the tree at `source` on `target`, its ids shown through the mapping of
/// the user namespace `userns` (an idmapped mount: files stored with ids 0… appear as the
/// ids that namespace maps them to, without being copied or changed on disk).
pub fn bind_idmapped(source: &str, target: &str, userns: &std::fs::File) -> io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let invalid = |e: crate::JailError| io::Error::new(io::ErrorKind::InvalidInput, e.to_string());
    let src = c_path(source).map_err(invalid)?;
    let dst = c_path(target).map_err(invalid)?;
    // SAFETY: `src` is a valid NUL-terminated path that outlives the call; open_tree only
    // reads it and returns a new file descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    let attr = MountAttr {
        attr_set: IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: `tree` is an open detached mount, `empty` a valid empty C string and `attr` a
    // correctly laid out struct mount_attr whose size we pass; the kernel only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; `dst` is a valid NUL-terminated path that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
