//! File operations confined to the sandbox's file roots.
//!
//! A request path is checked lexically first (no `..`, absolute paths must lie in a root),
//! then everything below the root is resolved by the kernel with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)` from a descriptor of the root, so no symlink can lead outside it.
//! Operations on a final component (stat, remove, rename, mkdir) open its parent that way and
//! use the `*at` call on the bare name, never following a final symlink.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{
    AtFlags, CWD, Dir, FileType, Mode, OFlags, RenameFlags, ResolveFlags, Stat, fchmod, fstat,
    mkdirat, openat, openat2, readlinkat, renameat, renameat_with, statat, unlinkat,
};
use rustix::io::Errno;
use sandcell_protocol::{ErrorCode, FileEntry, FileKind, WireError};

/// Mode of files written without an explicit one.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Mode of directories the agent creates.
const DIR_MODE: u32 = 0o755;
/// Deepest directory tree a recursive remove descends into.
const MAX_REMOVE_DEPTH: usize = 1024;

/// One file root: the path the agent opens and the components a request path must start with.
#[derive(Debug, Clone)]
struct Root {
    path: PathBuf,
    display: String,
    comps: Vec<String>,
}

/// The directories the file API may touch.
#[derive(Debug, Clone)]
pub(crate) struct Roots {
    roots: Vec<Root>,
}

/// A request path checked against the roots: a root and the components below it.
#[derive(Debug, Clone)]
pub(crate) struct Confined {
    root: usize,
    rel: Vec<String>,
    /// The absolute path inside the sandbox, for replies and messages.
    pub display: String,
}

impl Confined {
    fn rel_path(&self) -> String {
        if self.rel.is_empty() {
            ".".to_string()
        } else {
            self.rel.join("/")
        }
    }

    fn parent_rel(&self) -> String {
        match self.rel.len() {
            0 | 1 => ".".to_string(),
            n => self.rel[..n - 1].join("/"),
        }
    }

    fn name(&self) -> Option<&str> {
        self.rel.last().map(String::as_str)
    }
}

impl Roots {
    /// Roots from configured paths; the first one is where relative paths resolve.
    pub fn new(paths: &[PathBuf]) -> Self {
        let roots = paths
            .iter()
            .map(|p| {
                let display = p.to_string_lossy().to_string();
                let comps = components(&display).map(str::to_string).collect();
                let display = if display.len() > 1 {
                    display.trim_end_matches('/').to_string()
                } else {
                    display
                };
                Root {
                    path: p.clone(),
                    display,
                    comps,
                }
            })
            .collect();
        Self { roots }
    }

    fn list(&self) -> String {
        self.roots
            .iter()
            .map(|r| r.display.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks `path` lexically and picks its root; nothing is touched on disk.
    pub fn resolve(&self, path: &str) -> Result<Confined, WireError> {
        if path.contains('\0') {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("path {path:?} contains a nul byte"),
            ));
        }
        let comps: Vec<&str> = components(path).collect();
        if comps.contains(&"..") {
            return Err(WireError::new(
                ErrorCode::PathOutsideSandbox,
                format!("path '{path}' contains '..'"),
            ));
        }
        let (root, skip) = if path.starts_with('/') {
            let best = self
                .roots
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    r.comps.len() <= comps.len() && r.comps.iter().zip(&comps).all(|(a, b)| a == b)
                })
                .max_by_key(|(_, r)| r.comps.len());
            match best {
                Some((i, r)) => (i, r.comps.len()),
                None => {
                    return Err(WireError::new(
                        ErrorCode::PathOutsideSandbox,
                        format!(
                            "'{path}' is outside the sandbox's file roots ({})",
                            self.list()
                        ),
                    ));
                }
            }
        } else if self.roots.is_empty() {
            return Err(WireError::new(
                ErrorCode::PathOutsideSandbox,
                format!("'{path}' cannot be resolved: the sandbox has no file roots"),
            ));
        } else {
            (0, 0)
        };
        let rel: Vec<String> = comps[skip..].iter().map(|c| c.to_string()).collect();
        let base = &self.roots[root].display;
        let display = if rel.is_empty() {
            base.clone()
        } else if base == "/" {
            format!("/{}", rel.join("/"))
        } else {
            format!("{base}/{}", rel.join("/"))
        };
        Ok(Confined { root, rel, display })
    }

    fn open_root(&self, c: &Confined) -> Result<OwnedFd, WireError> {
        let root = &self.roots[c.root];
        openat(
            CWD,
            &root.path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::NOENT => WireError::new(
                ErrorCode::NotFound,
                format!("file root '{}' does not exist", root.display),
            ),
            e => fs_error(e, "open", &root.display),
        })
    }

    fn root_name(&self, c: &Confined) -> String {
        let root = &self.roots[c.root];
        root.comps
            .last()
            .cloned()
            .unwrap_or_else(|| root.display.clone())
    }

    /// Describes a path without following a final symlink.
    pub fn stat(&self, c: &Confined) -> Result<FileEntry, WireError> {
        let root = self.open_root(c)?;
        let Some(name) = c.name() else {
            let st = fstat(&root).map_err(|e| fs_error(e, "stat", &c.display))?;
            return Ok(entry(self.root_name(c), c.display.clone(), &st, None));
        };
        let parent = open_dir(&root, &c.parent_rel(), &c.display)?;
        describe(&parent, name, c.display.clone())
    }

    /// Lists a directory (following symlinks only beneath the root), sorted by name.
    pub fn list_dir(&self, c: &Confined) -> Result<Vec<FileEntry>, WireError> {
        let root = self.open_root(c)?;
        let fd = beneath(
            &root,
            &c.rel_path(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .map_err(|e| resolve_error(e, "list", &c.display))?;
        let at = fd.try_clone().map_err(|e| {
            fs_error(
                Errno::from_io_error(&e).unwrap_or(Errno::IO),
                "list",
                &c.display,
            )
        })?;
        let mut dir = Dir::new(fd).map_err(|e| fs_error(e, "list", &c.display))?;
        let mut out = Vec::new();
        while let Some(item) = dir.read() {
            let item = item.map_err(|e| fs_error(e, "list", &c.display))?;
            let name = item.file_name().to_string_lossy().to_string();
            if name == "." || name == ".." {
                continue;
            }
            let path = join_display(&c.display, &name);
            match describe(&at, &name, path) {
                Ok(e) => out.push(e),
                // Removed between readdir and stat: it is simply no longer there.
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Creates a directory and its missing parents (`mkdir -p`).
    pub fn make_dir(&self, c: &Confined) -> Result<FileEntry, WireError> {
        let entry = match self.stat(c) {
            Ok(entry) => entry,
            Err(e) if e.code == ErrorCode::NotFound => {
                let root = self.open_root(c)?;
                make_parents(&root, &c.rel, &c.display)?;
                self.stat(c)?
            }
            Err(e) => return Err(e),
        };
        // A symlink to a directory beneath the root is as good as one (like `mkdir -p`).
        let dir_link = entry.kind == FileKind::Symlink
            && self
                .open_root(c)
                .is_ok_and(|root| open_dir(&root, &c.rel_path(), &c.display).is_ok());
        if !entry.is_dir && !dir_link {
            return Err(WireError::new(
                ErrorCode::AlreadyExists,
                format!("'{}' already exists and is not a directory", c.display),
            ));
        }
        Ok(entry)
    }

    /// Removes a file, symlink or directory (a non-empty one only with `recursive`).
    pub fn remove(&self, c: &Confined, recursive: bool) -> Result<(), WireError> {
        let Some(name) = c.name() else {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "'{}' is a file root of the sandbox and cannot be removed",
                    c.display
                ),
            ));
        };
        let root = self.open_root(c)?;
        let parent = open_dir(&root, &c.parent_rel(), &c.display)?;
        let st = statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| fs_error(e, "remove", &c.display))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return unlinkat(&parent, name, AtFlags::empty())
                .map_err(|e| fs_error(e, "remove", &c.display));
        }
        if recursive {
            remove_tree(&parent, name, &c.display, 0)
        } else {
            unlinkat(&parent, name, AtFlags::REMOVEDIR)
                .map_err(|e| fs_error(e, "remove", &c.display))
        }
    }

    /// Renames `from` to `to` (both confined) and describes the result.
    pub fn rename(&self, from: &Confined, to: &Confined) -> Result<FileEntry, WireError> {
        let (Some(from_name), Some(to_name)) = (from.name(), to.name()) else {
            let which = if from.rel.is_empty() { from } else { to };
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "'{}' is a file root of the sandbox and cannot be renamed",
                    which.display
                ),
            ));
        };
        let from_root = self.open_root(from)?;
        let to_root = self.open_root(to)?;
        let from_dir = open_dir(&from_root, &from.parent_rel(), &from.display)?;
        let to_dir = open_dir(&to_root, &to.parent_rel(), &to.display)?;
        let exists = || {
            WireError::new(
                ErrorCode::AlreadyExists,
                format!("'{}' exists already: remove it first", to.display),
            )
        };
        // Never replaces what is there (as the API promises): RENAME_NOREPLACE.
        match renameat_with(
            &from_dir,
            from_name,
            &to_dir,
            to_name,
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => {}
            Err(Errno::EXIST) => return Err(exists()),
            // The roots are separate mounts in a sandbox: move by copying, like mv(1).
            Err(Errno::XDEV) => {
                if statat(&to_dir, to_name, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                    return Err(exists());
                }
                let ends = Ends {
                    from: &from_dir,
                    from_name,
                    to: &to_dir,
                    to_name,
                };
                move_across(&ends, &from.display, &to.display, 0)?;
            }
            Err(Errno::NOENT) => return Err(fs_error(Errno::NOENT, "rename", &from.display)),
            Err(e) => return Err(fs_error(e, "rename onto", &to.display)),
        }
        describe(&to_dir, to_name, to.display.clone())
    }

    /// Opens a regular file for reading (following symlinks only beneath the root).
    pub fn open_read(&self, c: &Confined) -> Result<File, WireError> {
        let root = self.open_root(c)?;
        // O_NONBLOCK so a fifo planted in the sandbox cannot hang the agent in open().
        let fd = beneath(
            &root,
            &c.rel_path(),
            OFlags::RDONLY | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| resolve_error(e, "read", &c.display))?;
        let st = fstat(&fd).map_err(|e| fs_error(e, "read", &c.display))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Ok(File::from(fd)),
            FileType::Directory => Err(fs_error(Errno::ISDIR, "read", &c.display)),
            _ => Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("'{}' is not a regular file", c.display),
            )),
        }
    }

    /// Starts a write: creates missing parents and opens the target (append) or a temporary
    /// file beside it that replaces it atomically at the end.
    pub fn begin_write(
        &self,
        c: &Confined,
        mode: Option<u32>,
        append: bool,
    ) -> Result<WriteSession, WireError> {
        let Some(name) = c.name() else {
            return Err(fs_error(Errno::ISDIR, "write", &c.display));
        };
        let mode = Mode::from_bits_truncate(mode.unwrap_or(DEFAULT_FILE_MODE) & 0o7777);
        let root = self.open_root(c)?;
        let parent_rel = &c.rel[..c.rel.len() - 1];
        let dir = make_parents(&root, parent_rel, &c.display)?;
        if append {
            let fd = beneath(
                &root,
                &c.rel_path(),
                OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE,
                mode,
            )
            .map_err(|e| resolve_error(e, "write", &c.display))?;
            return Ok(WriteSession {
                file: File::from(fd),
                dir,
                name: name.to_string(),
                temp: None,
                display: c.display.clone(),
            });
        }
        match statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                return Err(fs_error(Errno::ISDIR, "write", &c.display));
            }
            _ => {}
        }
        let temp = temp_name();
        let fd = openat(
            &dir,
            temp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            mode,
        )
        .map_err(|e| fs_error(e, "write", &c.display))?;
        let session = WriteSession {
            file: File::from(fd),
            dir,
            name: name.to_string(),
            temp: Some(temp),
            display: c.display.clone(),
        };
        // The umask must not weaken the mode the host asked for.
        fchmod(session.file.as_fd(), mode).map_err(|e| fs_error(e, "write", &c.display))?;
        Ok(session)
    }
}

/// A file write in progress. Dropping it unfinished removes its temporary file.
#[derive(Debug)]
pub(crate) struct WriteSession {
    file: File,
    dir: OwnedFd,
    name: String,
    temp: Option<String>,
    display: String,
}

impl WriteSession {
    /// Appends bytes to the file being written.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.file
            .write_all(bytes)
            .map_err(|e| fs_error(io_errno(&e), "writing", &self.display))
    }

    /// Puts the file in place and describes it.
    pub fn finish(mut self) -> Result<FileEntry, WireError> {
        if let Some(temp) = self.temp.take()
            && let Err(e) = renameat(&self.dir, temp.as_str(), &self.dir, self.name.as_str())
        {
            let _ = unlinkat(&self.dir, temp.as_str(), AtFlags::empty());
            return Err(fs_error(e, "write", &self.display));
        }
        describe(&self.dir, &self.name, self.display.clone())
    }
}

impl Drop for WriteSession {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = unlinkat(&self.dir, temp.as_str(), AtFlags::empty());
        }
    }
}

/// Reads the next chunk of at most `max` bytes; an empty vector means end of file.
pub(crate) fn read_chunk(file: &mut File, max: usize, display: &str) -> Result<Vec<u8>, WireError> {
    let mut buf = vec![0u8; max];
    let mut filled = 0;
    while filled < max {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(fs_error(io_errno(&e), "read", display)),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

fn components(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty() && *c != ".")
}

fn join_display(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(".sandcell-write-{}-{n}-{nanos}.tmp", std::process::id())
}

/// Set once `openat2` answered `ENOSYS` (gVisor's kernel has none): lookups walk instead.
static NO_OPENAT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `openat2` beneath `root`: symlinks may be followed but never out of it.
fn beneath(root: &OwnedFd, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    if NO_OPENAT2.load(Ordering::Relaxed) {
        return walk_beneath(root, rel, flags, mode);
    }
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    let mut tries = 0;
    loop {
        match openat2(root, rel, flags | OFlags::CLOEXEC, mode, resolve) {
            // A concurrent rename made the kernel unsure the lookup stayed beneath: retry.
            Err(Errno::AGAIN) if tries < 16 => tries += 1,
            Err(Errno::INTR) => {}
            Err(Errno::NOSYS) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
                return walk_beneath(root, rel, flags, mode);
            }
            other => return other,
        }
    }
}

/// Symlinks one lookup may follow (as the kernel's limit).
const MAX_SYMLINKS: usize = 40;

/// What `openat2(RESOLVE_BENEATH)` does, one component at a time for kernels without it:
/// every component is opened with `O_NOFOLLOW`; a symlink met on the way is read and its
/// (relative) target spliced in, `..` may not climb above `root`, and an absolute target is
/// refused (`EXDEV`, as `openat2` says).
fn walk_beneath(root: &OwnedFd, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    // Directories walked so far (the last is where the next component is looked up).
    let mut stack: Vec<OwnedFd> = vec![openat(root, ".", dir_flags, Mode::empty())?];
    let mut todo: std::collections::VecDeque<String> = components(rel)
        .filter(|c| *c != ".")
        .map(str::to_string)
        .collect();
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        let here = stack.last().ok_or(Errno::XDEV)?;
        if name == "." {
            continue;
        }
        if name == ".." {
            if stack.len() == 1 {
                return Err(Errno::XDEV);
            }
            stack.pop();
            continue;
        }
        let last = todo.is_empty();
        let st = match statat(here, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(st),
            // Created by the final open.
            Err(Errno::NOENT) if last && flags.contains(OFlags::CREATE) => None,
            Err(e) => return Err(e),
        };
        let is_link = st.is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
        if is_link && !(last && flags.contains(OFlags::NOFOLLOW)) {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(Errno::LOOP);
            }
            let target = readlinkat(here, name.as_str(), Vec::new())?;
            let target = target.to_string_lossy().into_owned();
            if target.starts_with('/') {
                return Err(Errno::XDEV);
            }
            let parts: Vec<&str> = components(&target).collect();
            for c in parts.into_iter().rev() {
                todo.push_front(c.to_string());
            }
            continue;
        }
        if last {
            return openat(
                here,
                name.as_str(),
                flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                mode,
            );
        }
        let next = openat(here, name.as_str(), dir_flags, Mode::empty())?;
        stack.push(next);
    }
    // The path named a directory already walked (the root itself, or after `..`).
    let here = stack.last().ok_or(Errno::XDEV)?;
    openat(here, ".", flags | OFlags::CLOEXEC, mode)
}

fn open_dir(root: &OwnedFd, rel: &str, display: &str) -> Result<OwnedFd, WireError> {
    beneath(root, rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| resolve_error(e, "open", display))
}

/// Creates every missing directory of `rel` beneath `root`; returns the last one.
fn make_parents(root: &OwnedFd, rel: &[String], display: &str) -> Result<OwnedFd, WireError> {
    let flags = OFlags::PATH | OFlags::DIRECTORY;
    let full = if rel.is_empty() {
        ".".to_string()
    } else {
        rel.join("/")
    };
    match beneath(root, &full, flags, Mode::empty()) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(resolve_error(e, "create", display)),
    }
    let mut cur = beneath(root, ".", flags, Mode::empty())
        .map_err(|e| resolve_error(e, "create", display))?;
    for i in 0..rel.len() {
        let prefix = rel[..=i].join("/");
        match beneath(root, &prefix, flags, Mode::empty()) {
            Ok(fd) => cur = fd,
            Err(Errno::NOENT) => {
                match mkdirat(&cur, rel[i].as_str(), Mode::from_bits_truncate(DIR_MODE)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(fs_error(e, "create", display)),
                }
                cur = beneath(root, &prefix, flags, Mode::empty())
                    .map_err(|e| resolve_error(e, "create", display))?;
            }
            Err(e) => return Err(resolve_error(e, "create", display)),
        }
    }
    Ok(cur)
}

/// Describes `name` in `dir` without following it.
fn describe(dir: &OwnedFd, name: &str, path: String) -> Result<FileEntry, WireError> {
    let st =
        statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| fs_error(e, "stat", &path))?;
    let link = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
        readlinkat(dir, name, Vec::new())
            .ok()
            .map(|t| t.to_string_lossy().to_string())
    } else {
        None
    };
    Ok(entry(name.to_string(), path, &st, link))
}

fn entry(name: String, path: String, st: &Stat, link_target: Option<String>) -> FileEntry {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Dir,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    };
    FileEntry {
        name,
        path,
        size: u64::try_from(st.st_size).unwrap_or(0),
        kind,
        is_dir: kind == FileKind::Dir,
        mode: st.st_mode & 0o7777,
        mtime: st.st_mtime,
        link_target,
    }
}

fn remove_tree(parent: &OwnedFd, name: &str, display: &str, depth: usize) -> Result<(), WireError> {
    if depth > MAX_REMOVE_DEPTH {
        return Err(WireError::new(
            ErrorCode::Io,
            format!("cannot remove '{display}': the directory tree is nested too deeply"),
        ));
    }
    // O_NOFOLLOW: if the directory was swapped for a symlink meanwhile, fail rather than follow.
    let fd = openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fs_error(e, "remove", display))?;
    let at = fd
        .try_clone()
        .map_err(|e| fs_error(io_errno(&e), "remove", display))?;
    let mut dir = Dir::new(fd).map_err(|e| fs_error(e, "remove", display))?;
    let mut items = Vec::new();
    while let Some(item) = dir.read() {
        let item = item.map_err(|e| fs_error(e, "remove", display))?;
        let child = item.file_name().to_string_lossy().to_string();
        if child != "." && child != ".." {
            items.push((item.file_name().to_owned(), child, item.file_type()));
        }
    }
    for (raw, child, kind) in items {
        let shown = join_display(display, &child);
        let is_dir = match kind {
            FileType::Directory => true,
            FileType::Unknown => statat(&at, raw.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
                .unwrap_or(false),
            _ => false,
        };
        if is_dir {
            remove_tree(&at, &child, &shown, depth + 1)?;
        } else {
            match unlinkat(&at, raw.as_c_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(fs_error(e, "remove", &shown)),
            }
        }
    }
    unlinkat(parent, name, AtFlags::REMOVEDIR).map_err(|e| fs_error(e, "remove", display))
}

/// The two sides of a move: a name in a source directory and one in a target directory.
struct Ends<'a> {
    from: &'a OwnedFd,
    from_name: &'a str,
    to: &'a OwnedFd,
    to_name: &'a str,
}

/// Moves an entry to another file system: copies it (a directory recursively, keeping
/// modes and modification times, never following symlinks) and then removes the source.
/// Not atomic: a failure part way leaves the copy made so far beside an intact source.
fn move_across(
    ends: &Ends<'_>,
    from_shown: &str,
    to_shown: &str,
    depth: usize,
) -> Result<(), WireError> {
    if depth > MAX_REMOVE_DEPTH {
        return Err(WireError::new(
            ErrorCode::Io,
            format!("cannot move '{from_shown}': the directory tree is nested too deeply"),
        ));
    }
    let st = statat(ends.from, ends.from_name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| fs_error(e, "rename", from_shown))?;
    let mode = Mode::from_bits_truncate(st.st_mode & 0o7777);
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: st.st_atime,
            tv_nsec: i64::try_from(st.st_atime_nsec).unwrap_or(0),
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: i64::try_from(st.st_mtime_nsec).unwrap_or(0),
        },
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            let src = openat(
                ends.from,
                ends.from_name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| fs_error(e, "read", from_shown))?;
            let temp = temp_name();
            let dst = openat(
                ends.to,
                temp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                mode,
            )
            .map_err(|e| fs_error(e, "create", to_shown))?;
            let copied = (|| {
                let mut dst = File::from(dst);
                std::io::copy(&mut File::from(src), &mut dst)
                    .map_err(|e| fs_error(io_errno(&e), "writing", to_shown))?;
                fchmod(&dst, mode).map_err(|e| fs_error(e, "write", to_shown))?;
                let _ = rustix::fs::futimens(&dst, &times);
                renameat(ends.to, temp.as_str(), ends.to, ends.to_name)
                    .map_err(|e| fs_error(e, "rename onto", to_shown))
            })();
            if let Err(e) = copied {
                let _ = unlinkat(ends.to, temp.as_str(), AtFlags::empty());
                return Err(e);
            }
            unlinkat(ends.from, ends.from_name, AtFlags::empty())
                .map_err(|e| fs_error(e, "remove", from_shown))
        }
        FileType::Symlink => {
            let target = readlinkat(ends.from, ends.from_name, Vec::new())
                .map_err(|e| fs_error(e, "read", from_shown))?;
            let temp = temp_name();
            rustix::fs::symlinkat(target.as_c_str(), ends.to, temp.as_str())
                .map_err(|e| fs_error(e, "create", to_shown))?;
            if let Err(e) = renameat(ends.to, temp.as_str(), ends.to, ends.to_name) {
                let _ = unlinkat(ends.to, temp.as_str(), AtFlags::empty());
                return Err(fs_error(e, "rename onto", to_shown));
            }
            unlinkat(ends.from, ends.from_name, AtFlags::empty())
                .map_err(|e| fs_error(e, "remove", from_shown))
        }
        FileType::Directory => {
            mkdirat(ends.to, ends.to_name, Mode::from_bits_truncate(0o700))
                .map_err(|e| fs_error(e, "create", to_shown))?;
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let src = openat(ends.from, ends.from_name, flags, Mode::empty())
                .map_err(|e| fs_error(e, "read", from_shown))?;
            let dst = openat(ends.to, ends.to_name, flags, Mode::empty())
                .map_err(|e| fs_error(e, "create", to_shown))?;
            let src_at = src
                .try_clone()
                .map_err(|e| fs_error(io_errno(&e), "read", from_shown))?;
            let mut names = Vec::new();
            let mut dir = Dir::new(src).map_err(|e| fs_error(e, "read", from_shown))?;
            while let Some(item) = dir.read() {
                let item = item.map_err(|e| fs_error(e, "read", from_shown))?;
                let name = item.file_name().to_string_lossy().to_string();
                if name != "." && name != ".." {
                    names.push(name);
                }
            }
            for name in names {
                let child = Ends {
                    from: &src_at,
                    from_name: &name,
                    to: &dst,
                    to_name: &name,
                };
                let (f, t) = (
                    join_display(from_shown, &name),
                    join_display(to_shown, &name),
                );
                move_across(&child, &f, &t, depth + 1)?;
            }
            fchmod(&dst, mode).map_err(|e| fs_error(e, "write", to_shown))?;
            let _ = rustix::fs::futimens(&dst, &times);
            unlinkat(ends.from, ends.from_name, AtFlags::REMOVEDIR)
                .map_err(|e| fs_error(e, "remove", from_shown))
        }
        _ => Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!(
                "cannot move '{from_shown}' to another file system: it is not a file, directory or symlink"
            ),
        )),
    }
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

/// Maps an error of a lookup beneath a root: `EXDEV` means a symlink tried to leave it.
fn resolve_error(e: Errno, op: &str, path: &str) -> WireError {
    match e {
        Errno::XDEV => WireError::new(
            ErrorCode::PathOutsideSandbox,
            format!("'{path}' resolves through a symlink that leaves the sandbox"),
        ),
        e => fs_error(e, op, path),
    }
}

/// Maps an errno of a file operation on `path` to a wire error naming the path.
pub(crate) fn fs_error(e: Errno, op: &str, path: &str) -> WireError {
    let (code, message) = match e {
        Errno::NOENT => (ErrorCode::NotFound, format!("'{path}' does not exist")),
        Errno::EXIST => (ErrorCode::AlreadyExists, format!("'{path}' already exists")),
        Errno::NOTDIR => (
            ErrorCode::NotADirectory,
            format!("'{path}' or one of its parents is not a directory"),
        ),
        Errno::ISDIR => (ErrorCode::IsADirectory, format!("'{path}' is a directory")),
        Errno::NOTEMPTY => (
            ErrorCode::DirectoryNotEmpty,
            format!("directory '{path}' is not empty"),
        ),
        Errno::NOSPC | Errno::DQUOT => (
            ErrorCode::NoSpace,
            format!("no space left on device {op} '{path}'"),
        ),
        Errno::ACCESS | Errno::PERM => (
            ErrorCode::PermissionDenied,
            format!("permission denied: cannot {op} '{path}'"),
        ),
        Errno::ROFS => (
            ErrorCode::PermissionDenied,
            format!("cannot {op} '{path}': read-only file system"),
        ),
        Errno::NAMETOOLONG => (
            ErrorCode::InvalidArgument,
            format!("'{path}' has a name that is too long"),
        ),
        Errno::LOOP => (
            ErrorCode::Io,
            format!("cannot {op} '{path}': too many levels of symbolic links"),
        ),
        e => (
            ErrorCode::Io,
            format!("cannot {op} '{path}': {}", errno_text(e)),
        ),
    };
    WireError::new(code, message)
}

/// The lowercase description of an errno, without the "(os error N)" suffix.
pub(crate) fn errno_text(e: Errno) -> String {
    io_text(&std::io::Error::from(e))
}

/// The lowercase description of an I/O error, without the "(os error N)" suffix.
pub(crate) fn io_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots() -> Roots {
        Roots::new(&[
            PathBuf::from("/workspace"),
            PathBuf::from("/home/sandbox"),
            PathBuf::from("/tmp"),
        ])
    }

    #[test]
    fn the_walk_follows_links_beneath_the_root_and_never_out() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::create_dir_all(base.join("root/a/b")).unwrap();
        std::fs::write(base.join("root/a/b/f"), "in").unwrap();
        std::fs::write(base.join("secret"), "out").unwrap();
        std::os::unix::fs::symlink("a/b", base.join("root/inside")).unwrap();
        std::os::unix::fs::symlink("../../secret", base.join("root/a/up")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", base.join("root/abs")).unwrap();
        std::os::unix::fs::symlink("loop", base.join("root/loop")).unwrap();
        let root: OwnedFd = File::open(base.join("root")).unwrap().into();
        let read = |rel: &str| {
            walk_beneath(&root, rel, OFlags::RDONLY, Mode::empty()).map(|fd| {
                let mut s = String::new();
                File::from(fd).read_to_string(&mut s).unwrap();
                s
            })
        };
        assert_eq!(read("a/b/f").unwrap(), "in");
        assert_eq!(read("inside/f").unwrap(), "in");
        assert_eq!(read("a/../a/b/f").unwrap(), "in");
        assert_eq!(read("a/up").unwrap_err(), Errno::XDEV);
        assert_eq!(read("abs").unwrap_err(), Errno::XDEV);
        assert_eq!(read("../secret").unwrap_err(), Errno::XDEV);
        assert_eq!(read("loop").unwrap_err(), Errno::LOOP);
        assert_eq!(read("missing").unwrap_err(), Errno::NOENT);
        // A new file through a link to a folder beneath.
        let fd = walk_beneath(
            &root,
            "inside/new",
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        drop(fd);
        assert!(base.join("root/a/b/new").exists());
    }

    #[test]
    fn lexical_checks() {
        let r = roots();
        let c = r.resolve("a//./b/").unwrap();
        assert_eq!(c.display, "/workspace/a/b");
        assert_eq!(c.rel, vec!["a", "b"]);
        let c = r.resolve("/tmp/x").unwrap();
        assert_eq!((c.root, c.display.as_str()), (2, "/tmp/x"));
        assert_eq!(r.resolve("/workspace").unwrap().rel.len(), 0);
        let e = r.resolve("../../etc/passwd").unwrap_err();
        assert_eq!(e.code, ErrorCode::PathOutsideSandbox);
        assert_eq!(e.message, "path '../../etc/passwd' contains '..'");
        let e = r.resolve("/etc/passwd").unwrap_err();
        assert_eq!(
            e.message,
            "'/etc/passwd' is outside the sandbox's file roots (/workspace, /home/sandbox, /tmp)"
        );
        // A root's name as a mere prefix of another name is not inside it.
        assert!(r.resolve("/workspacex/a").is_err());
        assert_eq!(
            r.resolve("a\0b").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn errno_text_is_lowercase_without_suffix() {
        assert_eq!(errno_text(Errno::NOENT), "no such file or directory");
    }
}
