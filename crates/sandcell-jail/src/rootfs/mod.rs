//! The sandbox's root filesystem, assembled inside its own mount namespace.
//!
//! The host prepares a [`skeleton`] (a directory with the synthesized `/etc`, symlinks and
//! mount points); inside the sandbox's mount namespace:
//! 1. every mount is made private, so nothing propagates back to the host;
//! 2. the skeleton is bound onto itself, read-only: that bind becomes the new root;
//! 3. the host's system directories are bound read-only onto their mount points, a private
//!    `/proc` and the devices are mounted, and the size-limited writable tmpfs mounts;
//! 4. `pivot_root` into it and the old root (the host's) is detached.

pub mod mounts;
pub mod skeleton;

use std::ffi::CString;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use sandcell_protocol::{Feature, FeatureState, SANDBOX_UID};

use crate::config::JailConfig;
use crate::error::JailError;
use crate::mount_attr;

/// What the sandbox may read and execute (Landlock): its whole root. After the pivot that
/// holds only the skeleton, the read-only binds and the sandbox's own mounts; the rule keeps
/// anything outside it (the host's tree, should a mount ever expose it) out of reach.
pub const READABLE_TREES: &[&str] = &["/"];

/// Devices the sandbox may write (besides its tmpfs mounts): `/dev` holds only the harmless
/// devices, the private devpts and `/dev/shm`, and is itself read-only.
pub const WRITABLE_DEVICES: &[&str] = &["/dev"];

/// Host devices bound into the sandbox's `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Symlinks in the sandbox's `/dev`: (name, target).
pub(crate) const DEV_SYMLINKS: &[(&str, &str)] = &[
    ("ptmx", "pts/ptmx"),
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// `/etc` files up to this size are copied into the skeleton rather than bind-mounted.
const COPY_MAX: u64 = 256 * 1024;

/// Size of `/dev/shm` inside the sandbox (every backend's).
pub const SHM_BYTES: u64 = 64 * 1024 * 1024;

/// Builds the root filesystem and pivots into it. The caller is in fresh user and mount
/// namespaces with full capabilities there.
pub fn setup(
    config: &JailConfig,
    detached: Vec<mounts::DetachedMount>,
) -> Result<Vec<Feature>, JailError> {
    do_mount(
        None,
        "/",
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
        "make / private",
    )?;
    let root = config.root_skeleton.as_str();
    if !root.starts_with('/') || root == "/" {
        return Err(JailError::Config(format!(
            "the root skeleton '{root}' must be an absolute directory other than /"
        )));
    }
    if config.root_premounted {
        // One recursive bind takes the skeleton with its binds and devices; one call makes
        // the lot read-only (writes to device nodes do not need a writable mount).
        do_mount(
            Some(root),
            root,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
            "bind the root skeleton",
        )?;
        set_attrs(
            root,
            mount_attr::RDONLY | mount_attr::NOSUID,
            true,
            "the root",
        )?;
    } else {
        do_mount(
            Some(root),
            root,
            None,
            MsFlags::MS_BIND,
            None,
            "bind the root skeleton",
        )?;
        // The root itself is read-only: only the tmpfs mounts below are writable.
        let attrs = mount_attr::RDONLY | mount_attr::NOSUID | mount_attr::NODEV;
        set_attrs(root, attrs, false, "the root")?;
        let system_root = config.system_root.as_deref().unwrap_or("");
        for path in &config.ro_binds {
            let target = format!("{root}{path}");
            let source = format!("{}{path}", system_root.trim_end_matches('/'));
            do_mount(
                Some(source.as_str()),
                &target,
                None,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None,
                &format!("bind {path}"),
            )?;
            set_attrs(&target, mount_attr::RDONLY, true, path)?;
        }
        bind_devices(root)?;
    }
    mount_proc(root)?;
    mount_dev_filesystems(root)?;
    for t in &config.tmpfs {
        let opts = format!(
            "size={},mode={:o},uid={SANDBOX_UID},gid={SANDBOX_UID}",
            t.size_bytes.max(4096),
            t.mode
        );
        do_mount(
            Some("tmpfs"),
            &format!("{root}{}", t.path),
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(&opts),
            &format!("mount tmpfs on {}", t.path),
        )?;
    }
    let mounted = mounts::attach_all(root, &config.mounts, detached)?;
    if let Some(dir) = &config.guest_dir {
        let target = format!("{root}/.sandcell");
        do_mount(
            Some(dir),
            &target,
            None,
            MsFlags::MS_BIND,
            None,
            "bind the guest binary",
        )?;
        set_attrs(
            &target,
            mount_attr::RDONLY | mount_attr::NOSUID,
            false,
            "/.sandcell",
        )?;
    }
    if let Some(dir) = &config.egress_dir {
        let target = format!("{root}{}", sandcell_protocol::EGRESS_DIR);
        do_mount(
            Some(dir),
            &target,
            None,
            MsFlags::MS_BIND,
            None,
            "bind the egress folder",
        )?;
        // Read-only is enough: connecting to a socket writes nothing to its file system.
        set_attrs(
            &target,
            mount_attr::RDONLY | mount_attr::NOSUID | mount_attr::NODEV | mount_attr::NOEXEC,
            false,
            sandcell_protocol::EGRESS_DIR,
        )?;
    }
    std::env::set_current_dir(root).map_err(|e| JailError::io("chdir into the new root", e))?;
    pivot_root(".", ".")?;
    // The old root (the host's) is now stacked on "/": detach it and everything under it.
    umount2(".", MntFlags::MNT_DETACH)
        .map_err(|e| JailError::io("detach the old root", e.into()))?;
    std::env::set_current_dir("/").map_err(|e| JailError::io("chdir /", e))?;
    if let Some(first) = config.tmpfs.first() {
        let _ = std::env::set_current_dir(&first.path);
    }

    let writable: Vec<String> = config
        .tmpfs
        .iter()
        .map(|t| format!("{} ({} bytes)", t.path, t.size_bytes))
        .collect();
    let mut features = vec![Feature {
        name: "rootfs".into(),
        state: FeatureState::Active,
        detail: format!(
            "pivot_root into a read-only skeleton (synthesized /etc, no host secrets); read-only host binds: {}; private /proc; minimal /dev; writable: {}",
            if config.root_premounted {
                "the system directories (premounted in the skeleton)".to_string()
            } else {
                config.ro_binds.join(" ")
            },
            writable.join(", ")
        ),
    }];
    if !mounted.is_empty() {
        features.push(Feature {
            name: "mounts".into(),
            state: FeatureState::Active,
            detail: format!("host folders: {}", mounted.join("; ")),
        });
    }
    Ok(features)
}

/// Sets mount attributes on the mount at `target` (and every mount below it when
/// `recursive`). Kernels before 5.12 have no mount_setattr: the top mount is remounted
/// read-only instead, keeping the flags the kernel locked on it (a remount that dropped them
/// would be refused).
fn set_attrs(target: &str, attrs: u64, recursive: bool, what: &str) -> Result<(), JailError> {
    match mount_attr::set(target, attrs, recursive) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            let locked = locked_flags(target);
            do_mount(
                None,
                target,
                None,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | locked,
                None,
                &format!("remount {what} read-only"),
            )
        }
        Err(e) => Err(JailError::io(format!("make {what} read-only"), e)),
    }
}

fn locked_flags(path: &str) -> MsFlags {
    let Ok(st) = nix::sys::statvfs::statvfs(path) else {
        return MsFlags::empty();
    };
    use nix::sys::statvfs::FsFlags;
    let f = st.flags();
    let mut out = MsFlags::empty();
    for (from, to) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(from) {
            out |= to;
        }
    }
    out
}

/// A proc mount for the new pid namespace. It must happen while the host's /proc is still
/// visible (before the pivot), or the kernel refuses it inside a user namespace.
pub(crate) fn mount_proc(root: &str) -> Result<(), JailError> {
    let target = format!("{root}/proc");
    do_mount(
        Some("proc"),
        &target,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
        "mount /proc",
    )?;
    // Kernel tunables stay read-only even where the namespace would allow writes.
    let sys = format!("{target}/sys");
    do_mount(
        Some(&sys),
        &sys,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
        "bind /proc/sys",
    )?;
    set_attrs(&sys, mount_attr::RDONLY, true, "/proc/sys")
}

/// The host's harmless devices onto their mount points in the skeleton's `/dev` (which also
/// holds its symlinks).
fn bind_devices(root: &str) -> Result<(), JailError> {
    for name in DEVICES {
        let source = format!("/dev/{name}");
        match mount(
            Some(source.as_str()),
            format!("{root}/dev/{name}").as_str(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ) {
            Ok(()) => {}
            // A device this host lacks (its mount point may still be in the skeleton).
            Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(JailError::io(format!("bind /dev/{name}"), e.into())),
        }
    }
    Ok(())
}

/// A private devpts and a size-limited `/dev/shm`.
pub(crate) fn mount_dev_filesystems(root: &str) -> Result<(), JailError> {
    do_mount(
        Some("devpts"),
        &format!("{root}/dev/pts"),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
        "mount /dev/pts",
    )?;
    do_mount(
        Some("tmpfs"),
        &format!("{root}/dev/shm"),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(&format!("size={SHM_BYTES},mode=1777")),
        "mount /dev/shm",
    )
}

fn pivot_root(new_root: &str, put_old: &str) -> Result<(), JailError> {
    nix::unistd::pivot_root(new_root, put_old)
        .map_err(|e| JailError::io(format!("pivot_root {new_root} {put_old}"), e.into()))
}

pub(crate) fn do_mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
    what: &str,
) -> Result<(), JailError> {
    mount(source, target, fstype, flags, data).map_err(|e| JailError::io(what, e.into()))
}

/// Converts a path to a C string for raw syscalls.
pub(crate) fn c_path(path: &str) -> Result<CString, JailError> {
    CString::new(path).map_err(|_| JailError::Config(format!("path '{path}' contains a NUL byte")))
}
