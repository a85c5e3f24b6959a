//! Files for `COPY`, `ADD` and `WORKDIR` steps, staged on the host as they will sit in the
//! image (the staging folder stands for `/`), then merged into the step's root inside its
//! build sandbox (`sandcell_jail::build`), where the image's own symbolic links resolve
//! within the image, never on the host.
//!
//! Sources are paths or globs (`*`, `?`, `[…]`) relative to the build context; none may leave
//! it, symbolic links included. A folder's contents are copied (not the folder itself), a
//! file into a destination ending in `/` keeps its name, and `ADD` unpacks a local tar
//! archive (plain or gzip) into the destination.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::BuildError;
use crate::ignore::ContextIgnore;

/// Stages the sources of a `COPY`/`ADD` into `staging`, owned by host id `owner` (the build
/// range's id 0, so the step can read them).
pub fn stage_copy(
    context: &Path,
    sources: &[String],
    dest: &str,
    unpack: bool,
    staging: &Path,
    owner: u32,
) -> Result<(), BuildError> {
    let context = context.canonicalize().map_err(BuildError::io(format!(
        "open the build context {}",
        context.display()
    )))?;
    let ignore = ContextIgnore::read(&context)?;
    let picked = Picked {
        context: &context,
        ignore: &ignore,
    };
    let mut matched = Vec::new();
    for source in sources {
        let found = expand(&context, source)?;
        if found.is_empty() {
            return Err(BuildError::Invalid(format!(
                "'{source}' matches nothing in the build context"
            )));
        }
        let found: Vec<PathBuf> = found.into_iter().filter(|p| picked.wanted(p)).collect();
        if found.is_empty() {
            return Err(BuildError::Invalid(format!(
                "'{source}' matches nothing in the build context: .dockerignore leaves it out"
            )));
        }
        matched.extend(found);
    }
    let into_folder = dest.ends_with('/') || matched.len() > 1;
    let dest_rel = relative(dest)?;
    for path in matched {
        let meta =
            fs::metadata(&path).map_err(BuildError::io(format!("read {}", path.display())))?;
        if meta.is_dir() {
            let target = staging.join(&dest_rel);
            make_parents(staging, &target, owner)?;
            copy_tree(&path, &target, owner, &picked)?;
        } else if unpack && is_tar(&path) {
            let target = staging.join(&dest_rel);
            make_parents(staging, &target, owner)?;
            unpack_tar(&path, &target, owner)?;
        } else {
            let target = if into_folder {
                let name = path.file_name().ok_or_else(|| {
                    BuildError::Invalid(format!("'{}' has no file name", path.display()))
                })?;
                staging.join(&dest_rel).join(name)
            } else {
                staging.join(&dest_rel)
            };
            make_parents(staging, target.parent().unwrap_or(staging), owner)?;
            copy_entry(&path, &target, owner, &picked)?;
        }
    }
    Ok(())
}

/// What of the context a copy takes: all but what `.dockerignore` leaves out.
struct Picked<'a> {
    context: &'a Path,
    ignore: &'a ContextIgnore,
}

impl Picked<'_> {
    fn rel(&self, path: &Path) -> String {
        path.strip_prefix(self.context)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned()
    }

    /// Whether `path` is copied: not left out, or a folder left out that may hold something
    /// taken back (then its contents are picked one by one).
    fn wanted(&self, path: &Path) -> bool {
        let folder = path.is_dir() && !path.is_symlink();
        self.ignore.keeps(&self.rel(path), folder)
    }
}

/// Stages folder `path` (absolute), for a `WORKDIR` that may not exist yet.
pub fn stage_folder(path: &str, staging: &Path, owner: u32) -> Result<(), BuildError> {
    let target = staging.join(relative(path)?);
    make_parents(staging, &target, owner)
}

/// A digest of everything staged: names, kinds, modes, contents and link targets. It keys the
/// step's cache entry, so a changed file rebuilds from its step on.
pub fn digest(staging: &Path) -> Result<String, BuildError> {
    let mut h = Sha256::new();
    hash_tree(staging, Path::new(""), &mut h)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn hash_tree(root: &Path, rel: &Path, h: &mut Sha256) -> Result<(), BuildError> {
    let dir = root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(BuildError::io(format!("list {}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    for name in names {
        let rel = rel.join(&name);
        let path = root.join(&rel);
        let meta = fs::symlink_metadata(&path)
            .map_err(BuildError::io(format!("stat {}", path.display())))?;
        h.update(rel.as_os_str().as_encoded_bytes());
        h.update(format!("\0{:o}\0", meta.mode()).as_bytes());
        if meta.is_dir() {
            hash_tree(root, &rel, h)?;
        } else if meta.file_type().is_symlink() {
            let target =
                fs::read_link(&path).map_err(BuildError::io(format!("read {}", path.display())))?;
            h.update(target.as_os_str().as_encoded_bytes());
        } else {
            let mut file = fs::File::open(&path)
                .map_err(BuildError::io(format!("open {}", path.display())))?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = file
                    .read(&mut buf)
                    .map_err(BuildError::io(format!("read {}", path.display())))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
        }
        h.update(b"\n");
    }
    Ok(())
}

/// `path` (absolute in the image) as a relative path without `..` or `.`.
fn relative(path: &str) -> Result<PathBuf, BuildError> {
    let mut out = PathBuf::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Prefix(_) => {
                return Err(BuildError::Invalid(format!("'{path}' is not a Unix path")));
            }
        }
    }
    Ok(out)
}

/// The paths of the context that `source` names (a glob may name several), each checked to
/// stay inside the context once symbolic links are followed.
fn expand(context: &Path, source: &str) -> Result<Vec<PathBuf>, BuildError> {
    let mut current = vec![context.to_path_buf()];
    for c in Path::new(source).components() {
        let part = match c {
            Component::Normal(p) => p.to_string_lossy().into_owned(),
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(BuildError::Invalid(format!(
                    "'{source}' leaves the build context"
                )));
            }
        };
        let mut next = Vec::new();
        for base in &current {
            if !part.contains(['*', '?', '[']) {
                let p = base.join(&part);
                if fs::symlink_metadata(&p).is_ok() {
                    next.push(p);
                }
                continue;
            }
            let Ok(entries) = fs::read_dir(base) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| glob_match(&part, n))
                .collect();
            names.sort();
            next.extend(names.into_iter().map(|n| base.join(n)));
        }
        current = next;
    }
    let mut out = Vec::new();
    for path in current {
        let real = path
            .canonicalize()
            .map_err(BuildError::io(format!("resolve {}", path.display())))?;
        if !real.starts_with(context) {
            return Err(BuildError::Invalid(format!(
                "'{source}' leads outside the build context (to {})",
                real.display()
            )));
        }
        out.push(real);
    }
    Ok(out)
}

/// Shell-style matching of one name: `*`, `?` and `[…]` (with `!` or `^` to negate).
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|i| go(&p[1..], &n[i..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') => {
                let Some(end) = p.iter().skip(1).position(|c| *c == ']').map(|i| i + 1) else {
                    return n.first() == Some(&'[') && go(&p[1..], &n[1..]);
                };
                let Some(c) = n.first() else { return false };
                let mut set = &p[1..end];
                let negate = matches!(set.first(), Some('!') | Some('^'));
                if negate {
                    set = &set[1..];
                }
                let mut hit = false;
                let mut i = 0;
                while i < set.len() {
                    if i + 2 < set.len() && set[i + 1] == '-' {
                        hit |= set[i] <= *c && *c <= set[i + 2];
                        i += 3;
                    } else {
                        hit |= set[i] == *c;
                        i += 1;
                    }
                }
                hit != negate && go(&p[end + 1..], &n[1..])
            }
            Some(x) => n.first() == Some(x) && go(&p[1..], &n[1..]),
        }
    }
    go(&p, &n)
}

fn make_parents(staging: &Path, target: &Path, owner: u32) -> Result<(), BuildError> {
    let mut path = staging.to_path_buf();
    fs::create_dir_all(&path).map_err(BuildError::io(format!("create {}", path.display())))?;
    chown(&path, owner)?;
    let rel = target.strip_prefix(staging).unwrap_or(Path::new(""));
    for c in rel.components() {
        path.push(c);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(BuildError::Invalid(format!(
                    "{} is both a file and a folder among the copied paths",
                    path.display()
                )));
            }
            Err(_) => {
                fs::create_dir(&path)
                    .map_err(BuildError::io(format!("create {}", path.display())))?;
                fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
                    .map_err(BuildError::io(format!("chmod {}", path.display())))?;
                chown(&path, owner)?;
            }
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path, owner: u32, picked: &Picked<'_>) -> Result<(), BuildError> {
    let mut names: Vec<_> = fs::read_dir(from)
        .map_err(BuildError::io(format!("list {}", from.display())))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    for name in names {
        let path = from.join(&name);
        if picked.wanted(&path) {
            copy_entry(&path, &to.join(&name), owner, picked)?;
        }
    }
    Ok(())
}

/// Copies one entry (a folder with its contents; a link as a link), its mode kept.
fn copy_entry(from: &Path, to: &Path, owner: u32, picked: &Picked<'_>) -> Result<(), BuildError> {
    let meta =
        fs::symlink_metadata(from).map_err(BuildError::io(format!("stat {}", from.display())))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        if !to.is_dir() {
            fs::create_dir(to).map_err(BuildError::io(format!("create {}", to.display())))?;
        }
        fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(BuildError::io(format!("chmod {}", to.display())))?;
        chown(to, owner)?;
        copy_tree(from, to, owner, picked)
    } else if ft.is_symlink() {
        let target =
            fs::read_link(from).map_err(BuildError::io(format!("read {}", from.display())))?;
        let _ = fs::remove_file(to);
        std::os::unix::fs::symlink(&target, to)
            .map_err(BuildError::io(format!("link {}", to.display())))?;
        chown(to, owner)
    } else if ft.is_file() {
        let _ = fs::remove_file(to);
        fs::copy(from, to).map_err(BuildError::io(format!("copy {}", from.display())))?;
        fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(BuildError::io(format!("chmod {}", to.display())))?;
        chown(to, owner)
    } else {
        // Sockets, fifos and devices do not belong in an image.
        Ok(())
    }
}

fn chown(path: &Path, owner: u32) -> Result<(), BuildError> {
    std::os::unix::fs::lchown(path, Some(owner), Some(owner))
        .map_err(BuildError::io(format!("chown {}", path.display())))
}

fn is_tar(path: &Path) -> bool {
    let Ok(mut reader) = sandcell_image::import::reader(path) else {
        return false;
    };
    let mut header = [0u8; 512];
    reader.read_exact(&mut header).is_ok() && &header[257..262] == b"ustar"
}

fn unpack_tar(path: &Path, to: &Path, owner: u32) -> Result<(), BuildError> {
    let reader = sandcell_image::import::reader(path)
        .map_err(|e| BuildError::Invalid(format!("ADD {}: {e}", path.display())))?;
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(true);
    // tar-rs refuses entries that would land outside `to` (`..`, absolute paths, links).
    archive
        .unpack(to)
        .map_err(BuildError::io(format!("unpack {}", path.display())))?;
    chown_tree(to, owner)
}

/// Gives `path` and everything below it (links themselves, not followed) to host id `owner`.
pub(crate) fn chown_tree(path: &Path, owner: u32) -> Result<(), BuildError> {
    chown(path, owner)?;
    let meta =
        fs::symlink_metadata(path).map_err(BuildError::io(format!("stat {}", path.display())))?;
    if meta.is_dir() {
        for entry in
            fs::read_dir(path).map_err(BuildError::io(format!("list {}", path.display())))?
        {
            let entry = entry.map_err(BuildError::io(format!("list {}", path.display())))?;
            chown_tree(&entry.path(), owner)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> u32 {
        rustix::process::getuid().as_raw()
    }

    #[test]
    fn globs_match_like_a_shell() {
        assert!(glob_match("*.py", "app.py"));
        assert!(!glob_match("*.py", "app.pyc"));
        assert!(glob_match("a?c", "abc"));
        assert!(glob_match("[a-c]x", "bx"));
        assert!(!glob_match("[!a-c]x", "bx"));
    }

    #[test]
    fn sources_are_staged_as_copy_places_them_and_none_leaves_the_context() {
        let ctx = tempfile::tempdir().unwrap();
        fs::create_dir(ctx.path().join("src")).unwrap();
        fs::write(ctx.path().join("src/a.py"), "a").unwrap();
        fs::write(ctx.path().join("src/b.txt"), "b").unwrap();
        fs::write(ctx.path().join("req.txt"), "numpy").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ctx.path().join("escape")).unwrap();
        let staging = tempfile::tempdir().unwrap();
        let s = staging.path();

        stage_copy(ctx.path(), &["src".into()], "/app", false, s, me()).unwrap();
        assert_eq!(fs::read_to_string(s.join("app/a.py")).unwrap(), "a");
        stage_copy(ctx.path(), &["req.txt".into()], "/opt/", false, s, me()).unwrap();
        assert_eq!(fs::read_to_string(s.join("opt/req.txt")).unwrap(), "numpy");
        stage_copy(ctx.path(), &["src/*.py".into()], "/g/", false, s, me()).unwrap();
        assert!(s.join("g/a.py").exists() && !s.join("g/b.txt").exists());

        let before = digest(s).unwrap();
        assert_eq!(before, digest(s).unwrap());
        fs::write(s.join("app/a.py"), "changed").unwrap();
        assert_ne!(
            before,
            digest(s).unwrap(),
            "a changed file changes the digest"
        );

        for bad in ["escape", "../x", "nothing-*"] {
            let err = stage_copy(ctx.path(), &[bad.into()], "/x", false, s, me()).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("outside")
                    || text.contains("leaves")
                    || text.contains("matches nothing"),
                "{bad}: {text}"
            );
        }
    }

    #[test]
    fn dockerignore_leaves_files_out_of_every_copy() {
        let ctx = tempfile::tempdir().unwrap();
        let c = ctx.path();
        fs::create_dir_all(c.join("node_modules/pkg")).unwrap();
        fs::create_dir_all(c.join("data")).unwrap();
        fs::write(c.join("node_modules/pkg/index.js"), "x").unwrap();
        fs::write(c.join("app.py"), "a").unwrap();
        fs::write(c.join("debug.log"), "l").unwrap();
        fs::write(c.join("data/big.csv"), "b").unwrap();
        fs::write(c.join("data/keep.csv"), "k").unwrap();
        fs::write(
            c.join(".dockerignore"),
            "node_modules
*.log
data
!data/keep.csv
",
        )
        .unwrap();
        let staging = tempfile::tempdir().unwrap();
        let s = staging.path();
        stage_copy(c, &[".".into()], "/app/", false, s, me()).unwrap();
        assert!(s.join("app/app.py").exists() && s.join("app/.dockerignore").exists());
        assert!(!s.join("app/node_modules").exists());
        assert!(!s.join("app/debug.log").exists());
        assert!(s.join("app/data/keep.csv").exists() && !s.join("app/data/big.csv").exists());
        // Named outright, or by a glob: still left out.
        let err = stage_copy(c, &["debug.log".into()], "/x", false, s, me()).unwrap_err();
        assert!(err.to_string().contains(".dockerignore"), "{err}");
        let err = stage_copy(c, &["*.log".into()], "/x/", false, s, me()).unwrap_err();
        assert!(err.to_string().contains(".dockerignore"), "{err}");
        stage_copy(c, &["data/keep.csv".into()], "/k", false, s, me()).unwrap();
        assert_eq!(fs::read_to_string(s.join("k")).unwrap(), "k");
    }
}
