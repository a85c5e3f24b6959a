//! `mount_setattr(2)`, which no safe wrapper we use exposes yet.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
    let tree = clone_tree(source, false)?;
    set_on_tree(&tree, 0, Some(userns), false)?;
    move_tree(&tree, target)
}

/// A detached copy of the mount tree at `source` (with the mounts below it when
/// `recursive`; `source` itself must not be a symbolic link), to be attached with
/// [`move_tree`], possibly from another mount namespace.
pub fn clone_tree(source: &str, recursive: bool) -> io::Result<OwnedFd> {
    let src = c_path(source).map_err(invalid)?;
    // A link put in place of the folder after it was checked is not followed.
    let flags = OPEN_TREE_CLONE
        | OPEN_TREE_CLOEXEC
        | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint
        | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: `src` is a valid NUL-terminated path that outlives the call; open_tree only
    // reads it and returns a new file descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, src.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Sets `attrs` on a detached tree from [`clone_tree`] (every mount of it when `recursive`),
/// and, with `userns`, shows its ids through that namespace's mapping.
pub fn set_on_tree(
    tree: &OwnedFd,
    attrs: u64,
    userns: Option<&std::fs::File>,
    recursive: bool,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: attrs | if userns.is_some() { IDMAP } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |f| f.as_raw_fd() as u64),
    };
    let flags = libc::AT_EMPTY_PATH as libc::c_uint | if recursive { AT_RECURSIVE } else { 0 };
    let empty = c"";
    // SAFETY: `tree` is an open detached mount, `empty` a valid empty C string and `attr` a
    // correctly laid out struct mount_attr whose size we pass; the kernel only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
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

/// Attaches a detached tree from [`clone_tree`] on `target`.
pub fn move_tree(tree: &OwnedFd, target: &str) -> io::Result<()> {
    let dst = c_path(target).map_err(invalid)?;
    let empty = c"";
    // SAFETY: `tree` is an open detached mount; `empty` and `dst` are valid NUL-terminated
    // strings that outlive the call, which only reads them.
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
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn invalid(e: crate::JailError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

/// Writes process `pid`'s id maps (`setgroups` allowed); `what` names it in errors.
pub(crate) fn write_id_maps(
    pid: nix::unistd::Pid,
    uid_map: &str,
    gid_map: &str,
    what: &str,
) -> Result<(), crate::JailError> {
    for (file, contents) in [
        ("uid_map", uid_map),
        ("setgroups", "allow"),
        ("gid_map", gid_map),
    ] {
        std::fs::write(format!("/proc/{pid}/{file}"), contents)
            .map_err(|e| crate::JailError::io(format!("write {file} of {what}"), e))?;
    }
    Ok(())
}

/// A user namespace whose id maps are `uid_map` and `gid_map` (lines of `inside outside
/// count`), for an
/// idmapped mount to take its mapping from: a child that makes it and waits, mapped by us,
/// then let go. Only root can write such maps.
pub fn mapping_namespace(uid_map: &str, gid_map: &str) -> Result<std::fs::File, crate::JailError> {
    use crate::JailError;
    use std::io::Read;
    let (wait_read, wait_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| JailError::io("make a pipe", e.into()))?;
    let child = crate::launch::raw_clone(libc::CLONE_NEWUSER)
        .map_err(|e| JailError::io("clone a namespace for the id mapping", e))?;
    let Some(child) = child else {
        drop(wait_write);
        let mut byte = [0u8; 1];
        let _ = std::fs::File::from(wait_read).read(&mut byte);
        // SAFETY: _exit ends this process at once, without running the parent's handlers.
        unsafe { libc::_exit(0) };
    };
    drop(wait_read);
    let opened = write_id_maps(child, uid_map, gid_map, "the mapping namespace").and_then(|()| {
        std::fs::File::open(format!("/proc/{child}/ns/user"))
            .map_err(|e| JailError::io("open the mapping namespace", e))
    });
    drop(wait_write);
    let _ = nix::sys::wait::waitpid(child, None);
    opened
}
