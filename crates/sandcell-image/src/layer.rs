//! Layers: the changes of one build step as an OCI layer tar, and layers applied in order
//! onto a root folder.
//!
//! A step's changes are an overlay's upper folder. In it, a deleted file is a whiteout (a
//! character device 0:0) and a folder whose lower contents are hidden is opaque (the
//! `overlay.opaque` extended attribute, `trusted.` or `user.`). In a layer tar these become
//! `.wh.<name>` entries and a `.wh..wh..opq` entry in the folder, as the OCI image spec says.
//!
//! Applying a layer runs in two passes over it: first its whiteouts remove what lower layers
//! put there, then its entries are written (so the order of entries in a foreign layer does
//! not matter). Every path stays inside the root: `..`, absolute names and symbolic links
//! pointing out are refused rather than followed.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use crate::ImageError;

/// The prefix of a whiteout entry's name.
pub const WHITEOUT_PREFIX: &str = ".wh.";
/// The name of an opaque folder's marker entry.
pub const OPAQUE_MARKER: &str = ".wh..wh..opq";

/// How ids on disk map to the ids a layer records: a build runs as uid 0 of a private range,
/// so its files belong to `base + id` on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// The host id of id 0.
    pub base: u32,
    /// How many ids are mapped.
    pub size: u32,
}

impl IdRange {
    fn to_layer(self, id: u32) -> Result<u32, ImageError> {
        id.checked_sub(self.base)
            .filter(|i| *i < self.size)
            .ok_or_else(|| {
                ImageError::Invalid(format!(
                    "id {id} is outside the build's range {}..{}",
                    self.base,
                    u64::from(self.base) + u64::from(self.size)
                ))
            })
    }
}

/// What a layer holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Entries (files, folders, links).
    pub entries: u64,
    /// Bytes of file contents.
    pub bytes: u64,
    /// Whiteouts and opaque markers.
    pub whiteouts: u64,
}

fn io_err(op: &str, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
    let op = format!("{op} {}", path.display());
    move |source| ImageError::Io { op, source }
}

/// Writes the changes in overlay upper folder `upper` as a layer tar to `out`, ids mapped
/// back through `ids` (none: as they are).
pub fn write_diff(
    upper: &Path,
    out: &mut dyn Write,
    ids: Option<IdRange>,
) -> Result<LayerStats, ImageError> {
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Complete);
    builder.follow_symlinks(false);
    let mut stats = LayerStats::default();
    let mut hardlinks = std::collections::HashMap::new();
    walk(
        upper,
        Path::new(""),
        &mut builder,
        ids,
        &mut stats,
        &mut hardlinks,
    )?;
    builder
        .into_inner()
        .and_then(|w| w.flush())
        .map_err(io_err("finish the layer of", upper))?;
    Ok(stats)
}

fn walk(
    root: &Path,
    rel: &Path,
    builder: &mut tar::Builder<&mut dyn Write>,
    ids: Option<IdRange>,
    stats: &mut LayerStats,
    hardlinks: &mut std::collections::HashMap<(u64, u64), PathBuf>,
) -> Result<(), ImageError> {
    let dir = root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(io_err("list", &dir))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io_err("list", &dir))?;
    // Sorted: the same changes make the same bytes.
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let rel_path = rel.join(&name);
        let meta = fs::symlink_metadata(&path).map_err(io_err("stat", &path))?;
        let ft = meta.file_type();
        if ft.is_char_device() && meta.rdev() == 0 {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(0);
            header.set_mode(0o644);
            let wh = rel.join(format!("{WHITEOUT_PREFIX}{}", name.to_string_lossy()));
            builder
                .append_data(&mut header, &wh, io::empty())
                .map_err(io_err("write a whiteout for", &path))?;
            stats.whiteouts += 1;
            continue;
        }
        let mut header = tar::Header::new_gnu();
        header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
        if let Some(r) = ids {
            header.set_uid(u64::from(r.to_layer(meta.uid())?));
            header.set_gid(u64::from(r.to_layer(meta.gid())?));
        }
        stats.entries += 1;
        if ft.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            builder
                .append_data(&mut header, &rel_path, io::empty())
                .map_err(io_err("write", &path))?;
            if is_opaque(&path) {
                let mut marker = tar::Header::new_gnu();
                marker.set_entry_type(tar::EntryType::Regular);
                marker.set_size(0);
                marker.set_mode(0o644);
                builder
                    .append_data(&mut marker, rel_path.join(OPAQUE_MARKER), io::empty())
                    .map_err(io_err("write the opaque marker of", &path))?;
                stats.whiteouts += 1;
            }
            walk(root, &rel_path, builder, ids, stats, hardlinks)?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&path).map_err(io_err("read the link", &path))?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            builder
                .append_link(&mut header, &rel_path, &target)
                .map_err(io_err("write", &path))?;
        } else if ft.is_file() {
            // A second name of a file already written is a hard link to it.
            if meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(first) = hardlinks.get(&key) {
                    header.set_entry_type(tar::EntryType::Link);
                    header.set_size(0);
                    builder
                        .append_link(&mut header, &rel_path, first)
                        .map_err(io_err("write", &path))?;
                    continue;
                }
                hardlinks.insert(key, rel_path.clone());
            }
            let file = fs::File::open(&path).map_err(io_err("open", &path))?;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(meta.len());
            builder
                .append_data(&mut header, &rel_path, file)
                .map_err(io_err("write", &path))?;
            stats.bytes += meta.len();
        } else {
            // Sockets, fifos and devices other than whiteouts do not belong in an image.
            stats.entries -= 1;
        }
    }
    Ok(())
}

/// Whether overlay folder `path` is opaque (`trusted.overlay.opaque` or, in a user
/// namespace's overlay, `user.overlay.opaque` set to `y`).
fn is_opaque(path: &Path) -> bool {
    ["trusted.overlay.opaque", "user.overlay.opaque"]
        .iter()
        .any(|name| {
            let mut buf = [0u8; 4];
            matches!(rustix::fs::lgetxattr(path, *name, &mut buf), Ok(n) if buf.get(..n) == Some(b"y"))
        })
}

/// Applies the layer tar (plain or gzip) at `layer` onto `root` (lower layers already there).
pub fn apply(layer: &Path, root: &Path) -> Result<LayerStats, ImageError> {
    let mut stats = LayerStats::default();
    // Pass one: what this layer removes from the layers below.
    let mut archive = tar::Archive::new(crate::import::reader(layer)?);
    for entry in archive.entries().map_err(io_err("read", layer))? {
        let entry = entry.map_err(io_err("read", layer))?;
        let path = entry.path().map_err(io_err("read", layer))?.into_owned();
        let rel = clean(&path)?;
        let Some(name) = rel.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        if name == OPAQUE_MARKER {
            let dir = inside(root, parent)?;
            if let Ok(children) = fs::read_dir(&dir) {
                for child in children.flatten() {
                    remove(&child.path())?;
                }
            }
            stats.whiteouts += 1;
        } else if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            remove(&inside(root, &parent.join(hidden))?)?;
            stats.whiteouts += 1;
        }
    }
    // Pass two: what it adds or changes.
    let mut archive = tar::Archive::new(crate::import::reader(layer)?);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(rustix::process::geteuid().is_root());
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    for entry in archive.entries().map_err(io_err("read", layer))? {
        let mut entry = entry.map_err(io_err("read", layer))?;
        let path = entry.path().map_err(io_err("read", layer))?.into_owned();
        let rel = clean(&path)?;
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with(WHITEOUT_PREFIX) || rel.as_os_str().is_empty() {
            continue;
        }
        let dest = inside(root, &rel)?;
        let kind = entry.header().entry_type();
        // A different kind of thing replaces what was there (a folder stays a folder).
        if let Ok(old) = fs::symlink_metadata(&dest)
            && !(old.is_dir() && kind == tar::EntryType::Directory)
        {
            remove(&dest)?;
        }
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(io_err("create", parent))?;
        }
        if kind == tar::EntryType::Regular || kind == tar::EntryType::Continuous {
            stats.bytes += entry.header().size().unwrap_or(0);
        }
        // `unpack_in` checks again that nothing lands outside the root through a link.
        let placed = entry.unpack_in(root).map_err(io_err("unpack", &dest))?;
        if !placed {
            return Err(ImageError::Invalid(format!(
                "layer entry '{}' would land outside the root",
                path.display()
            )));
        }
        stats.entries += 1;
    }
    Ok(stats)
}

/// `path` as a relative path without `.`, refusing `..` and absolute names.
fn clean(path: &Path) -> Result<PathBuf, ImageError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(ImageError::Invalid(format!(
                    "layer entry '{}' climbs out of the root",
                    path.display()
                )));
            }
        }
    }
    Ok(out)
}

/// `root/rel`, refusing a path whose folders pass through a symbolic link (which could
/// point anywhere on the host).
fn inside(root: &Path, rel: &Path) -> Result<PathBuf, ImageError> {
    let mut at = root.to_path_buf();
    let mut parts = rel.components().peekable();
    while let Some(c) = parts.next() {
        at.push(c);
        if parts.peek().is_some()
            && fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink())
        {
            return Err(ImageError::Invalid(format!(
                "layer path '{}' goes through the symbolic link '{}'",
                rel.display(),
                at.display()
            )));
        }
    }
    Ok(at)
}

/// Removes a file, link or folder tree; missing is fine.
fn remove(path: &Path) -> Result<(), ImageError> {
    match fs::symlink_metadata(path) {
        Err(_) => Ok(()),
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(io_err("remove", path)),
        Ok(_) => fs::remove_file(path).map_err(io_err("remove", path)),
    }
}

/// Reads a whole layer to count it (for tests and inspection).
pub fn entries(layer: &mut dyn Read) -> Result<Vec<String>, ImageError> {
    let mut archive = tar::Archive::new(layer);
    let mut out = Vec::new();
    for entry in archive.entries().map_err(|source| ImageError::Io {
        op: "read a layer".into(),
        source,
    })? {
        let entry = entry.map_err(|source| ImageError::Io {
            op: "read a layer".into(),
            source,
        })?;
        out.push(
            entry
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        );
    }
    Ok(out)
}
