//! The root skeleton: a host directory holding everything of a sandbox's root that is not a
//! mount (the synthesized `/etc` files, copies of small host `/etc` files, symlinks such as
//! `/bin -> usr/bin`, and empty mount points), built once and bound read-only as the root of
//! every sandbox with the same layout.
//!
//! Building the root inside each sandbox (a tmpfs, a dozen file copies, symlinks and
//! mkdirs) cost ~0.6 ms of every start; one bind of a prepared directory costs ~0.03 ms.
//! As root, the host also mounts the skeleton's binds (`/usr`, …) and devices inside it, in
//! its own mount namespace and under a private mount, once: a sandbox then takes the whole
//! tree with one recursive bind and makes it read-only with one call, instead of two calls
//! per bind (~0.35 ms).
//! A skeleton is named after a hash of its layout and of the host files it copies (their
//! inode, size and times), so a changed host file or layout gets a new skeleton; it is built
//! in a temporary directory and renamed into place, so a skeleton that exists is complete.
//! Old skeletons are left in place: live sandboxes may still have them as their root.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::JailError;

use super::{COPY_MAX, DEV_SYMLINKS, DEVICES};

/// Bumped when the skeleton's format changes, so older skeletons are not reused.
const FORMAT: u64 = 1;
/// Leftover build directories older than this are removed.
const STALE_BUILD: Duration = Duration::from_secs(60);

/// What a sandbox root holds, as the host describes it.
#[derive(Debug, Clone, Copy)]
pub struct RootLayout<'a> {
    /// Where the system comes from: `/` (the host's own) or a template's root filesystem.
    pub system_root: &'a Path,
    /// Paths under `system_root` mirrored at the same place inside (see
    /// [`crate::JailConfig::ro_binds`]).
    pub system_paths: &'a [String],
    /// Files synthesized under `/etc`: (name relative to `/etc`, contents).
    pub etc_files: &'a [(String, String)],
    /// Absolute paths inside where writable tmpfs mounts go.
    pub tmpfs_paths: &'a [&'a str],
}

/// A prepared skeleton and the host paths to bind into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skeleton {
    /// The skeleton directory on the host.
    pub dir: PathBuf,
    /// Where the binds come from (`/`: the host's own system).
    pub system_root: PathBuf,
    /// Paths to bind read-only, from under `system_root` to the same place inside (their
    /// mount points exist in `dir`).
    pub binds: Vec<String>,
    /// The binds and the devices are mounted inside `dir` already, in this mount namespace.
    pub mounted: bool,
}

/// One entry of the skeleton, by path relative to its root.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir,
    Symlink(PathBuf),
    /// A copy of a host file, identified by its metadata.
    Copy {
        source: PathBuf,
        stamp: [i64; 7],
    },
    Text(String),
    /// An empty file: a mount point for a host file or device.
    MountFile,
}

/// Finds or builds the skeleton for `layout` under `cache_dir` (created when missing; it
/// must belong to this user and not be writable by others, since its contents become the
/// root of sandboxes). With `mount`, which needs root, its binds and devices are mounted in
/// it too (see the module's notes).
pub fn prepare(
    cache_dir: &Path,
    layout: &RootLayout<'_>,
    mount: bool,
) -> Result<Skeleton, JailError> {
    let (entries, binds) = plan(layout)?;
    let family = family(layout.system_root);
    let dir = cache_dir.join(format!("root-{family}-{:016x}", digest(&entries)));
    let skeleton = Skeleton {
        dir,
        system_root: layout.system_root.to_path_buf(),
        binds,
        mounted: mount,
    };
    if mount {
        // The usual case, in two system calls: built and mounted already. Only the first and
        // the last mount are checked (they are made in order); `sandcell doctor` checks all.
        let points = mount_points(&skeleton);
        if let (Some(first), Some(last)) = (points.first(), points.last())
            && is_mount_root(&first.0)
            && is_mount_root(&last.0)
        {
            return Ok(skeleton);
        }
    }
    if !skeleton.dir.is_dir() {
        ensure_private_dir(cache_dir)?;
        build(cache_dir, &skeleton.dir, &entries)?;
    }
    if mount {
        mount_in_place(cache_dir, &skeleton)?;
    }
    Ok(skeleton)
}

/// The part of a skeleton's name its system root decides (`host` for `/`): skeletons of one
/// family replace each other as the host changes; those of different families (the host and
/// each template) are mounted side by side.
fn family(system_root: &Path) -> String {
    if system_root == Path::new("/") {
        return "host".into();
    }
    let mut h = FNV_OFFSET;
    fnv_feed(&mut h, system_root.as_os_str().as_encoded_bytes());
    format!("{h:016x}")
}

/// FNV-1a's start.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Feeds `bytes` and a separator to FNV-1a hash `h`: stable across builds and runs.
fn fnv_feed(h: &mut u64, bytes: &[u8]) {
    for b in bytes.iter().chain(&[0xff]) {
        *h ^= u64::from(*b);
        *h = h.wrapping_mul(0x0100_0000_01b3);
    }
}

/// Mounts whatever of a mounted skeleton's binds and devices is missing (see
/// [`missing_mounts`]); [`prepare`] itself checks only the first and the last.
pub fn repair(cache_dir: &Path, skeleton: &Skeleton) -> Result<(), JailError> {
    mount_in_place(cache_dir, skeleton)
}

/// The mount points of a mounted skeleton that are not mounts (empty when all are).
pub fn missing_mounts(skeleton: &Skeleton) -> Vec<PathBuf> {
    mount_points(skeleton)
        .into_iter()
        .map(|(target, _, _)| target)
        .filter(|t| !is_mount_root(t))
        .collect()
}

/// The mount points inside `dir` that [`mount_in_place`] fills: (target, source, read-only).
fn mount_points(skeleton: &Skeleton) -> Vec<(PathBuf, String, bool)> {
    let dir = &skeleton.dir;
    let system = skeleton.binds.iter().map(|b| {
        let rel = b.trim_start_matches('/');
        let source = skeleton.system_root.join(rel).display().to_string();
        (dir.join(rel), source, true)
    });
    let devices = DEVICES
        .iter()
        .map(|d| (dir.join("dev").join(d), format!("/dev/{d}"), false));
    system.chain(devices).collect()
}

/// Mounts the binds and devices inside `dir` unless they all are already.
fn mount_in_place(cache_dir: &Path, skeleton: &Skeleton) -> Result<(), JailError> {
    let dir = skeleton.dir.as_path();
    let points = mount_points(skeleton);
    if points.iter().all(|(target, _, _)| is_mount_root(target)) {
        return Ok(());
    }
    // One process mounts; the others wait and find the work done.
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache_dir.join(".lock"))
        .map_err(|e| JailError::io("open the root skeleton lock", e))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| JailError::io("lock the root skeleton cache", e.into()))?;
    make_private_mount(cache_dir)?;
    for (target, source, read_only) in &points {
        if is_mount_root(target) {
            continue;
        }
        let what = |op: &str| format!("{op} {source} in the root skeleton");
        match nix::mount::mount(
            Some(source.as_str()),
            target,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND | nix::mount::MsFlags::MS_REC,
            None::<&str>,
        ) {
            Ok(()) => {}
            // A device this host lacks.
            Err(nix::errno::Errno::ENOENT) if !read_only => continue,
            Err(e) => return Err(JailError::io(what("bind"), e.into())),
        }
        if *read_only {
            let target = target.to_string_lossy();
            crate::mount_attr::set(
                &target,
                crate::mount_attr::RDONLY | crate::mount_attr::NOSUID,
                true,
            )
            .map_err(|e| JailError::io(what("make read-only"), e))?;
        }
    }
    unmount_other_skeletons(cache_dir, dir, &family(&skeleton.system_root));
    unmount_stale_skeletons(cache_dir);
    Ok(())
}

/// Detaches (and removes) the mounted skeletons of image roots that are gone (a deleted image,
/// a test's temporary store): their binds pin deleted folders, and every mount of the host's
/// namespace is copied into each new sandbox's, so thousands of them slow every start.
/// Running sandboxes keep their own copies.
pub fn unmount_stale_skeletons(cache_dir: &Path) {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = format!("{}/root-", cache_dir.display());
    // (the skeleton folder a mount point is in, the mount point, its source is deleted)
    let mounts: Vec<(&str, &str, bool)> = mountinfo
        .lines()
        .filter_map(|l| {
            let mut fields = l.split(' ');
            let root = fields.nth(3)?;
            let point = fields.next()?;
            let rest = point.strip_prefix(&prefix)?;
            let skeleton = &point[..prefix.len() + rest.find('/').unwrap_or(rest.len())];
            Some((skeleton, point, root.ends_with("//deleted")))
        })
        .collect();
    let stale: BTreeSet<&str> = mounts
        .iter()
        .filter(|(skeleton, _, deleted)| *deleted && !skeleton.contains("/root-host-"))
        .map(|(skeleton, _, _)| *skeleton)
        .collect();
    for skeleton in stale {
        let inside = format!("{skeleton}/");
        let mut points: Vec<&str> = mounts
            .iter()
            .map(|(_, point, _)| *point)
            .filter(|p| *p == skeleton || p.starts_with(&inside))
            .collect();
        // Deepest first.
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        let detached = points
            .iter()
            .all(|p| nix::mount::umount2(*p, nix::mount::MntFlags::MNT_DETACH).is_ok());
        // Its folder goes only once nothing is mounted in it (a device node bound from the
        // host must never be unlinked through it).
        if detached && !points.iter().any(|p| is_mount_root(Path::new(p))) {
            let _ = fs::remove_dir_all(skeleton);
        }
    }
}

/// Binds `dir` onto itself unless it is a mount already, and makes it private, so mounts made
/// below it never propagate to other mount namespaces.
pub(crate) fn make_private_mount(dir: &Path) -> Result<(), JailError> {
    use nix::mount::{MsFlags, mount};
    if !is_mount_root(dir) {
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| JailError::io(format!("bind {} onto itself", dir.display()), e.into()))?;
    }
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| JailError::io(format!("make {} a private mount", dir.display()), e.into()))
}

/// Detaches the mounts of older skeletons of the same family (their files stay: live
/// sandboxes may use them; sandboxes hold copies of the mounts, which this does not touch).
fn unmount_other_skeletons(cache_dir: &Path, keep: &Path, family: &str) {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = format!("{}/root-{family}-", cache_dir.display());
    let keep = format!("{}/", keep.display());
    let mut points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix) && !p.starts_with(&keep))
        .collect();
    // Deepest first.
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Whether `path` is the root of a mount (statx; false when unknown).
pub fn is_mount_root(path: &Path) -> bool {
    use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags};
    rustix::fs::statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::empty(),
    )
    .is_ok_and(|st| st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))
}

/// The skeleton's entries and the binds, from the host's current state.
fn plan(layout: &RootLayout<'_>) -> Result<(BTreeMap<String, Node>, Vec<String>), JailError> {
    let mut entries = BTreeMap::new();
    let mut binds = Vec::new();
    for path in layout.system_paths {
        let rel = relative(path)?;
        let source = layout.system_root.join(&rel);
        // An image's folders are the image's to say: one that is a symbolic link (`etc ->
        // /root`) would make a bind of `etc/ssl` reach outside it, so such a path is not
        // mirrored. The host's own root is trusted as it is.
        if layout.system_root != Path::new("/") && through_link(layout.system_root, &rel) {
            continue;
        }
        let meta = match fs::symlink_metadata(&source) {
            Ok(m) => m,
            // Missing on this host: not mirrored.
            Err(_) => continue,
        };
        let node = if meta.file_type().is_symlink() {
            let target = fs::read_link(&source)
                .map_err(|e| JailError::io(format!("readlink {}", source.display()), e))?;
            Node::Symlink(target)
        } else if meta.is_file() && meta.len() <= COPY_MAX && path.starts_with("/etc/") {
            // Small /etc files are copied: a bind mount each would cost more at every start.
            Node::Copy {
                source: source.clone(),
                stamp: [
                    meta.dev() as i64,
                    meta.ino() as i64,
                    meta.size() as i64,
                    meta.mtime(),
                    meta.mtime_nsec(),
                    meta.ctime(),
                    meta.ctime_nsec(),
                ],
            }
        } else {
            binds.push(path.clone());
            if meta.is_dir() {
                Node::Dir
            } else {
                Node::MountFile
            }
        };
        insert(&mut entries, rel, node);
    }
    for (name, contents) in layout.etc_files {
        if name.is_empty() || name.contains("..") || name.starts_with('/') {
            return Err(JailError::Config(format!(
                "etc file name '{name}' must be relative"
            )));
        }
        insert(
            &mut entries,
            format!("etc/{name}"),
            Node::Text(contents.clone()),
        );
    }
    insert(&mut entries, "proc".into(), Node::Dir);
    insert(&mut entries, "dev/pts".into(), Node::Dir);
    insert(&mut entries, "dev/shm".into(), Node::Dir);
    for name in DEVICES {
        insert(&mut entries, format!("dev/{name}"), Node::MountFile);
    }
    for (name, target) in DEV_SYMLINKS {
        insert(
            &mut entries,
            format!("dev/{name}"),
            Node::Symlink(PathBuf::from(target)),
        );
    }
    for path in layout.tmpfs_paths {
        insert(&mut entries, relative(path)?, Node::Dir);
    }
    Ok((entries, binds))
}

/// Whether a folder on the way from `root` to `root/rel` (not `rel` itself) is a symbolic
/// link.
fn through_link(root: &Path, rel: &str) -> bool {
    let mut at = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').collect();
    parts[..parts.len().saturating_sub(1)].iter().any(|part| {
        at.push(part);
        fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink())
    })
}

/// `path` without its leading `/`; it must be absolute and plain.
fn relative(path: &str) -> Result<String, JailError> {
    let rel = path.strip_prefix('/').unwrap_or("");
    let plain = !rel.is_empty()
        && rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if !plain {
        return Err(JailError::Config(format!(
            "sandbox path '{path}' must be absolute, without '.', '..' or empty components"
        )));
    }
    Ok(rel.to_string())
}

/// Adds `node` at `rel` and a directory for each of its ancestors. A later entry replaces
/// an earlier one at the same path (an explicit file wins over a mirrored one).
fn insert(entries: &mut BTreeMap<String, Node>, rel: String, node: Node) {
    let mut end = 0;
    while let Some(i) = rel[end..].find('/') {
        end += i;
        entries.entry(rel[..end].to_string()).or_insert(Node::Dir);
        end += 1;
    }
    entries.insert(rel, node);
}

/// FNV-1a over a canonical encoding of the entries: stable across builds and runs.
fn digest(entries: &BTreeMap<String, Node>) -> u64 {
    let mut h = FNV_OFFSET;
    let mut feed = |bytes: &[u8]| fnv_feed(&mut h, bytes);
    feed(&FORMAT.to_le_bytes());
    for (rel, node) in entries {
        feed(rel.as_bytes());
        match node {
            Node::Dir => feed(b"d"),
            Node::MountFile => feed(b"m"),
            Node::Symlink(t) => {
                feed(b"l");
                feed(t.as_os_str().as_encoded_bytes());
            }
            Node::Text(s) => {
                feed(b"t");
                feed(s.as_bytes());
            }
            Node::Copy { source, stamp } => {
                feed(b"c");
                feed(source.as_os_str().as_encoded_bytes());
                for v in stamp {
                    feed(&v.to_le_bytes());
                }
            }
        }
    }
    h
}

/// Creates `dir` (mode 0755) when missing and checks that it belongs to us and that nobody
/// else can write to it.
fn ensure_private_dir(dir: &Path) -> Result<(), JailError> {
    let op = |what: &str| format!("{what} the root skeleton cache {}", dir.display());
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) => return Err(JailError::io(op("create"), e)),
    }
    let meta = fs::metadata(dir).map_err(|e| JailError::io(op("stat"), e))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(JailError::Config(format!(
            "the root skeleton cache {} must belong to uid {me} and not be writable by others \
             (it has uid {} and mode {:o})",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Builds the skeleton in a temporary directory next to `dir` and renames it into place.
fn build(cache_dir: &Path, dir: &Path, entries: &BTreeMap<String, Node>) -> Result<(), JailError> {
    remove_stale_builds(cache_dir);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = cache_dir.join(format!(".build-{}-{nanos}", std::process::id()));
    let built = write_tree(&tmp, entries);
    let renamed = built.and_then(|()| {
        fs::rename(&tmp, dir).map_err(|e| JailError::io(format!("rename {}", tmp.display()), e))
    });
    match renamed {
        Ok(()) => Ok(()),
        // Another process built the same skeleton first: use theirs.
        Err(_) if dir.is_dir() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

fn write_tree(root: &Path, entries: &BTreeMap<String, Node>) -> Result<(), JailError> {
    make_dir(root)?;
    for (rel, node) in entries {
        let path = root.join(rel);
        let what = |op: &str| format!("{op} {} in the root skeleton", path.display());
        match node {
            Node::Dir => make_dir(&path)?,
            Node::Symlink(target) => {
                symlink(target, &path).map_err(|e| JailError::io(what("symlink"), e))?
            }
            Node::Copy { source, .. } => {
                fs::copy(source, &path).map_err(|e| JailError::io(what("copy"), e))?;
                set_mode(&path, 0o644)?;
            }
            Node::Text(contents) => {
                fs::write(&path, contents).map_err(|e| JailError::io(what("write"), e))?;
                set_mode(&path, 0o644)?;
            }
            Node::MountFile => {
                fs::write(&path, b"").map_err(|e| JailError::io(what("create"), e))?;
                set_mode(&path, 0o644)?;
            }
        }
    }
    Ok(())
}

fn make_dir(path: &Path) -> Result<(), JailError> {
    match fs::DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(JailError::io(format!("mkdir {}", path.display()), e)),
    }
    // Explicitly: the umask must not narrow it, or the sandbox user could not enter it.
    set_mode(path, 0o755)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), JailError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| JailError::io(format!("chmod {}", path.display()), e))
}

/// Removes build directories that crashed builders left behind.
fn remove_stale_builds(cache_dir: &Path) {
    let Ok(list) = fs::read_dir(cache_dir) else {
        return;
    };
    for entry in list.flatten() {
        let stale = entry.file_name().to_string_lossy().starts_with(".build-")
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_BUILD);
        if stale {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Host paths bound read-only into every sandbox when present: the system, plus the few
/// `/etc` entries programs need that hold no secrets.
pub const DEFAULT_SYSTEM_PATHS: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/mime.types",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/bash.bashrc",
    "/etc/profile",
    "/etc/inputrc",
    "/etc/python3",
    "/etc/python3.11",
    "/etc/matplotlibrc",
    "/etc/fonts",
    "/etc/R",
];

/// Top-level folders of an image that a sandbox never takes from it: its own kernel
/// filesystems, scratch and work folders, and `/etc` (taken entry by entry, see
/// [`image_system_paths`]).
const IMAGE_RESERVED: &[&str] = &["proc", "dev", "sys", "tmp", "run", "etc", "lost+found"];

/// `/etc` entries of an image a sandbox does not take: those it synthesizes (users, host
/// name, resolver) and password hashes.
const IMAGE_ETC_RESERVED: &[&str] = &["shadow", "gshadow", "shadow-", "gshadow-", "mtab"];

/// The paths a skeleton mirrors from `system_root` (`None`: the host's system, `defaults`
/// alone; an image: [`image_system_paths`]), as both backends build it.
pub fn system_paths_of<'a>(
    system_root: Option<&str>,
    defaults: &'a [String],
    etc_files: &[(String, String)],
    tmpfs_paths: &[&str],
) -> std::borrow::Cow<'a, [String]> {
    match system_root {
        Some(root) => std::borrow::Cow::Owned(image_system_paths(
            Path::new(root),
            defaults,
            etc_files,
            tmpfs_paths,
        )),
        None => std::borrow::Cow::Borrowed(defaults),
    }
}

/// What a sandbox on an image's root mirrors from it: `defaults`, every other top-level entry
/// of the image (`/app`, `/opt`, `/srv`, files a build put at the root, …) and every `/etc`
/// entry but the synthesized ones (`etc_files`), password hashes and the sandbox's own mount
/// points (`tmpfs_paths`).
fn image_system_paths(
    image_root: &Path,
    defaults: &[String],
    etc_files: &[(String, String)],
    tmpfs_paths: &[&str],
) -> Vec<String> {
    let mut paths: Vec<String> = defaults.to_vec();
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let owned = |path: &str| {
        tmpfs_paths
            .iter()
            .any(|t| *t == path || t.starts_with(&format!("{path}/")))
    };
    for name in names(image_root) {
        let path = format!("/{name}");
        if IMAGE_RESERVED.contains(&name.as_str()) || owned(&path) || paths.contains(&path) {
            continue;
        }
        paths.push(path);
    }
    // A link `/etc -> …` is not followed (see `through_link`).
    if !fs::symlink_metadata(image_root.join("etc")).is_ok_and(|m| m.is_dir()) {
        return paths;
    }
    for name in names(&image_root.join("etc")) {
        let path = format!("/etc/{name}");
        let synthesized = etc_files.iter().any(|(f, _)| f == &name);
        if synthesized || IMAGE_ETC_RESERVED.contains(&name.as_str()) || paths.contains(&path) {
            continue;
        }
        paths.push(path);
    }
    paths
}

/// The files synthesized under a sandbox's `/etc`: users, groups, host name, resolver.
pub fn sandbox_etc_files(hostname: &str) -> Vec<(String, String)> {
    let u = sandcell_protocol::SANDBOX_UID;
    vec![
        (
            "passwd".into(),
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{u}:{u}:sandbox:/home/sandbox:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        ("group".into(), format!("root:x:0:\nsandbox:x:{u}:\nnogroup:x:65534:\n")),
        ("hostname".into(), format!("{hostname}\n")),
        (
            "hosts".into(),
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"),
        ),
        // No network: point resolvers at loopback so lookups fail fast instead of hanging.
        ("resolv.conf".into(), "# sandcell: no outside network\nnameserver 127.0.0.1\n".into()),
        (
            "nsswitch.conf".into(),
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n".into(),
        ),
    ]
}

/// The folder for copies of `binary` under `parent`: `<parent>/<size>-<mtime>-<inode>`, one
/// per build.
///
/// A restored sandbox maps its agent's code from the file it ran from again (a checkpoint
/// holds only the memory the process changed), and CRIU refuses to dump a process whose
/// binary was replaced under it (a "ghost file"): so a copy is never replaced in place, and
/// each build gets a folder of its own.
pub fn binary_dir(parent: &Path, binary: &Path) -> io::Result<PathBuf> {
    let m = fs::metadata(binary)?;
    let mtime = m
        .modified()?
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    Ok(parent.join(format!("{:x}-{mtime:x}-{:x}", m.len(), m.ino())))
}

/// Copies `binary` to `dir/sandcell` (mode 0755, `dir` too, so the sandbox user can run it)
/// unless a copy of the same size, no older, is there. The copy is written beside and linked
/// into place only where nothing is yet, so that sandboxes starting at the same moment all
/// run the one file that stays (a copy replaced under a running sandbox is a file its
/// checkpoint cannot carry). For backends that bind the agent binary into sandboxes (in a
/// folder from [`binary_dir`]). Returns the copy's path.
pub fn install_binary(binary: &Path, dir: &Path) -> io::Result<PathBuf> {
    let fail = |what: &str, path: &Path, e: io::Error| {
        io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| fail("create", dir, e))?;
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o755));
    let target = dir.join("sandcell");
    let src = fs::metadata(binary).map_err(|e| fail("read", binary, e))?;
    let in_place = || {
        fs::metadata(&target).is_ok_and(|have| {
            have.len() == src.len() && have.modified().ok() >= src.modified().ok()
        })
    };
    if in_place() {
        return Ok(target);
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".sandcell.tmp{}-{n}", std::process::id()));
    fs::copy(binary, &tmp).map_err(|e| fail("copy", binary, e))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
        .map_err(|e| fail("chmod", &tmp, e))?;
    let placed = if in_place() {
        // Another process put this build there while we copied: that copy stays.
        Ok(())
    } else if target.exists() {
        // A different binary at the same place (a folder not from `binary_dir`).
        fs::rename(&tmp, &target)
    } else {
        match fs::hard_link(&tmp, &target) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    };
    let _ = fs::remove_file(&tmp);
    placed.map_err(|e| fail("install", &target, e))?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout<'a>(
        system: &'a [String],
        etc: &'a [(String, String)],
        tmpfs: &'a [&'a str],
    ) -> RootLayout<'a> {
        RootLayout {
            system_root: Path::new("/"),
            system_paths: system,
            etc_files: etc,
            tmpfs_paths: tmpfs,
        }
    }

    #[test]
    fn installs_at_the_same_moment_leave_one_copy_that_is_never_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let binary = tmp.path().join("sandcell-build");
        fs::write(&binary, vec![7u8; 4 << 20]).unwrap();
        let dir = binary_dir(&tmp.path().join("bin"), &binary).unwrap();
        let inodes: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let path = install_binary(&binary, &dir).unwrap();
                        fs::metadata(path).unwrap().ino()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let now = fs::metadata(dir.join("sandcell")).unwrap().ino();
        assert!(inodes.iter().all(|i| *i == now), "{inodes:?} then {now}");
        assert_eq!(
            fs::read_dir(&dir).unwrap().count(),
            1,
            "no copy left behind"
        );
        // Another build gets a folder of its own.
        fs::write(&binary, vec![8u8; 1 << 20]).unwrap();
        assert_ne!(binary_dir(&tmp.path().join("bin"), &binary).unwrap(), dir);
    }

    #[test]
    fn an_image_root_cannot_reach_outside_itself_through_a_linked_folder() {
        let image = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        fs::create_dir_all(image.path().join("usr/bin")).unwrap();
        fs::create_dir_all(outside.path().join("ssl")).unwrap();
        fs::write(outside.path().join("os-release"), "ID=host-secret\n").unwrap();
        // The image's /etc is a link to a folder of the host.
        symlink(outside.path(), image.path().join("etc")).unwrap();
        let system = vec![
            "/usr".to_string(),
            "/etc/ssl".to_string(),
            "/etc/os-release".to_string(),
        ];
        let s = prepare(
            &cache.path().join("c"),
            &RootLayout {
                system_root: image.path(),
                system_paths: &system,
                etc_files: &[],
                tmpfs_paths: &[],
            },
            false,
        )
        .unwrap();
        assert_eq!(
            s.binds,
            vec!["/usr".to_string()],
            "nothing through the link"
        );
        assert!(!s.dir.join("etc/os-release").exists());
        assert!(!s.dir.join("etc/ssl").exists());
        assert_eq!(s.system_root, image.path());
    }

    #[test]
    fn builds_mirrors_copies_and_mount_points() {
        let host = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let link = host.path().join("link");
        symlink("usr/bin", &link).unwrap();
        let system = vec![
            "/usr".to_string(),
            link.display().to_string(),
            "/does/not/exist".to_string(),
        ];
        let etc = vec![(
            "passwd".to_string(),
            "sandbox:x:65532:65532::/:/bin/sh\n".to_string(),
        )];
        let s = prepare(
            &cache.path().join("c"),
            &layout(&system, &etc, &["/workspace", "/home/sandbox"]),
            false,
        )
        .unwrap();
        assert_eq!(s.binds, vec!["/usr".to_string()]);
        let root = &s.dir;
        assert!(root.join("usr").is_dir());
        let mirrored = root.join(link.strip_prefix("/").unwrap());
        assert_eq!(fs::read_link(mirrored).unwrap(), PathBuf::from("usr/bin"));
        assert_eq!(
            fs::read_to_string(root.join("etc/passwd")).unwrap(),
            "sandbox:x:65532:65532::/:/bin/sh\n"
        );
        assert!(root.join("home/sandbox").is_dir() && root.join("workspace").is_dir());
        assert!(root.join("dev/null").is_file() && root.join("dev/pts").is_dir());
        assert_eq!(
            fs::read_link(root.join("dev/fd")).unwrap(),
            PathBuf::from("/proc/self/fd")
        );
        assert!(!root.join("does").exists());
        let mode = fs::metadata(root.join("home")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o755);
    }

    #[test]
    fn the_same_layout_reuses_a_skeleton_and_a_change_makes_a_new_one() {
        let cache = tempfile::tempdir().unwrap();
        let etc_a = vec![("hosts".to_string(), "127.0.0.1 a\n".to_string())];
        let etc_b = vec![("hosts".to_string(), "127.0.0.1 b\n".to_string())];
        let a1 = prepare(cache.path(), &layout(&[], &etc_a, &["/tmp"]), false).unwrap();
        let a2 = prepare(cache.path(), &layout(&[], &etc_a, &["/tmp"]), false).unwrap();
        let b = prepare(cache.path(), &layout(&[], &etc_b, &["/tmp"]), false).unwrap();
        assert_eq!(a1.dir, a2.dir);
        assert_ne!(a1.dir, b.dir);
        assert_eq!(
            fs::read_to_string(b.dir.join("etc/hosts")).unwrap(),
            "127.0.0.1 b\n"
        );
        // No build directories are left behind.
        let leftovers: Vec<_> = fs::read_dir(cache.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn small_etc_files_are_copied() {
        let cache = tempfile::tempdir().unwrap();
        let system = vec!["/etc/debian_version".to_string()];
        let s = prepare(cache.path(), &layout(&system, &[], &[]), false).unwrap();
        assert!(
            s.binds.is_empty(),
            "small /etc files are copied: {:?}",
            s.binds
        );
        assert_eq!(
            fs::read(s.dir.join("etc/debian_version")).unwrap(),
            fs::read("/etc/debian_version").unwrap()
        );
    }

    #[test]
    fn bad_paths_and_an_unsafe_cache_are_refused() {
        let cache = tempfile::tempdir().unwrap();
        for bad in ["relative", "/a/../b", "/a//b", "/"] {
            let r = prepare(cache.path(), &layout(&[], &[], &[bad]), false);
            assert!(r.is_err(), "{bad}");
        }
        let etc = vec![("../shadow".to_string(), String::new())];
        assert!(prepare(cache.path(), &layout(&[], &etc, &[]), false).is_err());
        let open = cache.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare(&open, &layout(&[], &[], &["/tmp"]), false).unwrap_err();
        assert!(
            err.to_string().contains("not be writable by others"),
            "{err}"
        );
    }
}
