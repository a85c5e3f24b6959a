//! The sandbox's root filesystem, assembled inside its own mount namespace.
//!
//! Steps (bubblewrap's approach, done natively):
//! 1. make every mount private so nothing propagates back to the host;
//! 2. mount a staging tmpfs on `/tmp` and pivot into it, so the host's root sits at
//!    `/oldroot` and stays reachable as a source of binds without being hidden;
//! 3. build `/newroot`: a small tmpfs holding read-only binds of the host's system
//!    directories, a synthesized `/etc`, a private `/proc`, a minimal `/dev`, and the
//!    size-limited writable tmpfs mounts;
//! 4. remount `/newroot` read-only, pivot into it and detach everything else.

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use sandcell_protocol::{Feature, FeatureState, SANDBOX_UID};

use crate::config::JailConfig;
use crate::error::JailError;

/// Trees the sandbox may read and execute (Landlock); everything else is invisible anyway.
pub const READABLE_TREES: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/dev",
];

/// Device paths the sandbox may write besides its tmpfs mounts.
pub const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/pts",
    "/dev/shm",
    "/dev/ptmx",
];

const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

const STAGING: &str = "/tmp";
const OLDROOT: &str = "/oldroot";
const NEWROOT: &str = "/newroot";

/// `/etc` files up to this size are copied into the root rather than bind-mounted.
const COPY_MAX: u64 = 256 * 1024;

/// Size of `/dev/shm` inside the sandbox.
const SHM_BYTES: u64 = 64 * 1024 * 1024;

/// Builds the root filesystem and pivots into it. The caller is in fresh user and mount
/// namespaces with full capabilities there.
pub fn setup(config: &JailConfig) -> Result<Vec<Feature>, JailError> {
    do_mount(
        None,
        "/",
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
        "make / private",
    )?;
    do_mount(
        Some("tmpfs"),
        STAGING,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=1m,mode=0755"),
        "mount the staging tmpfs",
    )?;
    let staged_old = format!("{STAGING}{OLDROOT}");
    let staged_new = format!("{STAGING}{NEWROOT}");
    mkdir(&staged_old, 0o755)?;
    mkdir(&staged_new, 0o755)?;
    pivot_root(STAGING, &staged_old)?;
    std::env::set_current_dir("/").map_err(|e| JailError::io("chdir /", e))?;

    do_mount(
        Some("tmpfs"),
        NEWROOT,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=4m,mode=0755"),
        "mount the root tmpfs",
    )?;
    let mut bound = Vec::new();
    for path in &config.ro_binds {
        if bind_system_path(path)? {
            bound.push(path.as_str());
        }
    }
    write_etc(&config.etc_files)?;
    mount_proc()?;
    mount_dev()?;
    for t in &config.tmpfs {
        let target = inside(&t.path);
        mkdir_all(&target)?;
        let opts = format!(
            "size={},mode={:o},uid={SANDBOX_UID},gid={SANDBOX_UID}",
            t.size_bytes.max(4096),
            t.mode
        );
        do_mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(&opts),
            &format!("mount tmpfs on {}", t.path),
        )?;
    }
    // The root itself is read-only: only the tmpfs mounts above are writable.
    do_mount(
        None,
        NEWROOT,
        None,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=4m,mode=0755"),
        "remount the root read-only",
    )?;
    std::env::set_current_dir(NEWROOT).map_err(|e| JailError::io("chdir into the new root", e))?;
    pivot_root(".", ".")?;
    // The old root (staging tmpfs with the host's root under it) is now stacked on "/".
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
    Ok(vec![Feature {
        name: "rootfs".into(),
        state: FeatureState::Active,
        detail: format!(
            "pivot_root into a read-only tmpfs; read-only host binds: {}; synthesized /etc; private /proc; minimal /dev; writable: {}",
            bound.join(" "),
            writable.join(", ")
        ),
    }])
}

fn inside(path: &str) -> String {
    format!("{NEWROOT}{path}")
}

/// Mirrors one host path at the same place inside: symlinks are recreated, directories and
/// files are bound read-only. Returns false when the host has no such path.
fn bind_system_path(path: &str) -> Result<bool, JailError> {
    let source = format!("{OLDROOT}{path}");
    let target = inside(path);
    let meta = match fs::symlink_metadata(&source) {
        Ok(m) => m,
        Err(_) => return Ok(false),
    };
    if let Some(parent) = Path::new(&target).parent() {
        mkdir_all(&parent.to_string_lossy())?;
    }
    if meta.file_type().is_symlink() {
        let link =
            fs::read_link(&source).map_err(|e| JailError::io(format!("readlink {path}"), e))?;
        symlink(&link, &target).map_err(|e| JailError::io(format!("symlink {path}"), e))?;
        return Ok(true);
    }
    if meta.is_file() && meta.len() <= COPY_MAX && path.starts_with("/etc/") {
        // Small /etc files are copied: cheaper than a bind mount each, and the root is
        // remounted read-only afterwards anyway.
        fs::copy(&source, &target).map_err(|e| JailError::io(format!("copy {path}"), e))?;
        return Ok(true);
    }
    if meta.is_dir() {
        mkdir(&target, 0o755)?;
    } else {
        fs::write(&target, b"")
            .map_err(|e| JailError::io(format!("create mount point {path}"), e))?;
    }
    do_mount(
        Some(&source),
        &target,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
        &format!("bind {path}"),
    )?;
    make_read_only(&target, path)?;
    Ok(true)
}

/// Makes a bind mount (and every mount under it) read-only.
fn make_read_only(target: &str, what: &str) -> Result<(), JailError> {
    match crate::mount_attr::set_recursive_read_only(target) {
        Ok(()) => Ok(()),
        // Kernels before 5.12 have no mount_setattr: remount the top mount, keeping the flags
        // the kernel locked on it (a remount that dropped them would be refused).
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

fn write_etc(files: &[(String, String)]) -> Result<(), JailError> {
    let etc = inside("/etc");
    mkdir_all(&etc)?;
    for (name, contents) in files {
        if name.contains("..") || name.starts_with('/') {
            return Err(JailError::Config(format!(
                "etc file name '{name}' must be relative"
            )));
        }
        let path = PathBuf::from(&etc).join(name);
        if let Some(parent) = path.parent() {
            mkdir_all(&parent.to_string_lossy())?;
        }
        fs::write(&path, contents).map_err(|e| JailError::io(format!("write /etc/{name}"), e))?;
        let _ = fs::set_permissions(&path, fs::Permissions::from_mode(0o644));
    }
    Ok(())
}

/// A proc mount for the new pid namespace. It must happen while the host's /proc is still
/// visible (before the final pivot), or the kernel refuses it inside a user namespace.
fn mount_proc() -> Result<(), JailError> {
    let target = inside("/proc");
    mkdir(&target, 0o555)?;
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
    make_read_only(&sys, "/proc/sys")
}

fn mount_dev() -> Result<(), JailError> {
    let dev = inside("/dev");
    mkdir(&dev, 0o755)?;
    do_mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("size=64k,mode=0755"),
        "mount /dev",
    )?;
    for name in DEVICES {
        let source = format!("{OLDROOT}/dev/{name}");
        if fs::metadata(&source).is_err() {
            continue;
        }
        let target = format!("{dev}/{name}");
        fs::write(&target, b"").map_err(|e| JailError::io(format!("create /dev/{name}"), e))?;
        do_mount(
            Some(&source),
            &target,
            None,
            MsFlags::MS_BIND,
            None,
            &format!("bind /dev/{name}"),
        )?;
    }
    let pts = format!("{dev}/pts");
    mkdir(&pts, 0o755)?;
    do_mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
        "mount /dev/pts",
    )?;
    let shm = format!("{dev}/shm");
    mkdir(&shm, 0o1777)?;
    do_mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(&format!("size={SHM_BYTES},mode=1777")),
        "mount /dev/shm",
    )?;
    for (name, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, format!("{dev}/{name}"))
            .map_err(|e| JailError::io(format!("symlink /dev/{name}"), e))?;
    }
    Ok(())
}

fn pivot_root(new_root: &str, put_old: &str) -> Result<(), JailError> {
    nix::unistd::pivot_root(new_root, put_old)
        .map_err(|e| JailError::io(format!("pivot_root {new_root} {put_old}"), e.into()))
}

fn do_mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
    what: &str,
) -> Result<(), JailError> {
    mount(source, target, fstype, flags, data).map_err(|e| JailError::io(what, e.into()))
}

fn mkdir(path: &str, mode: u32) -> Result<(), JailError> {
    match fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(JailError::io(format!("mkdir {path}"), e)),
    }
    // The umask must not narrow modes like 1777.
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| JailError::io(format!("chmod {path}"), e))
}

fn mkdir_all(path: &str) -> Result<(), JailError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|e| JailError::io(format!("mkdir -p {path}"), e))
}

/// Converts a path to a C string for raw syscalls.
pub(crate) fn c_path(path: &str) -> Result<CString, JailError> {
    CString::new(path).map_err(|_| JailError::Config(format!("path '{path}' contains a NUL byte")))
}
