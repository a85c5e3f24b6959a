//! A sandbox's carried folders (the engine's `snapshot::CARRIED_DIRS`, named by the caller)
//! into a tar archive on the host, read through
//! `/proc/<pid>/root` while the sandbox is frozen (the engine pauses it first). Restores go
//! the other way through the agent, as the sandbox's user.
//!
//! Why frozen: the host walks paths inside a root that the sandbox's processes could change.
//! With every one of them frozen, an entry found to be a directory or a regular file stays
//! one, so the host never follows a symlink planted inside: it reads links as links
//! (`lstat`, `readlink`).

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sandcell_engine::FilesCapture;

/// Entries deeper than this are not carried (a bound on a hostile tree).
const MAX_DEPTH: usize = 64;

/// Writes `dirs` (relative to `root`, e.g. `workspace`) into a tar archive on `out`.
pub(crate) fn capture(root: &Path, dirs: &[&str], out: impl Write) -> io::Result<FilesCapture> {
    let mut tar = tar::Builder::new(out);
    let mut captured = FilesCapture::default();
    for dir in dirs {
        let path = root.join(dir);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            // Absent (no kernel state), or not a real folder: nothing to carry there.
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        let top_dev = fs::symlink_metadata(&path)?.dev();
        walk(&mut tar, &path, Path::new(dir), 0, top_dev, &mut captured)?;
    }
    tar.into_inner()?.flush()?;
    Ok(captured)
}

fn header_for(meta: &fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(meta.mode() & 0o7777);
    h.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    h.set_size(size);
    h
}

fn walk(
    tar: &mut tar::Builder<impl Write>,
    path: &Path,
    name: &Path,
    depth: usize,
    top_dev: u64,
    captured: &mut FilesCapture,
) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    let kind = meta.file_type();
    // Another file system below a carried folder is a mount (a host folder or a volume): its
    // files are not the sandbox's to carry, and a restore mounts it again.
    if kind.is_dir() && meta.dev() != top_dev {
        captured.skipped.push(format!(
            "/{}: a mounted folder (mounted again on restore, not copied)",
            name.display()
        ));
        return Ok(());
    }
    if kind.is_dir() {
        let mut h = header_for(&meta, tar::EntryType::Directory, 0);
        tar.append_data(&mut h, name, io::empty())?;
        if depth >= MAX_DEPTH {
            captured.skipped.push(format!(
                "/{}: deeper than {MAX_DEPTH} folders",
                name.display()
            ));
            return Ok(());
        }
        let mut entries: Vec<_> = fs::read_dir(path)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(fs::DirEntry::file_name);
        for entry in entries {
            walk(
                tar,
                &entry.path(),
                &name.join(entry.file_name()),
                depth + 1,
                top_dev,
                captured,
            )?;
        }
    } else if kind.is_file() {
        let mut file = File::open(path)?;
        let mut h = header_for(&meta, tar::EntryType::Regular, meta.len());
        tar.append_data(&mut h, name, &mut file)?;
        captured.files += 1;
        captured.bytes += meta.len();
    } else if kind.is_symlink() {
        let target = fs::read_link(path)?;
        let mut h = header_for(&meta, tar::EntryType::Symlink, 0);
        tar.append_link(&mut h, name, &target)?;
    } else {
        captured.skipped.push(format!(
            "/{}: not a file, folder or link (a socket, pipe or device)",
            name.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcell_engine::snapshot::archived_dirs;
    use std::os::unix::fs::PermissionsExt;

    /// A fake sandbox root with the carried folders, and a writable one that is not.
    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for d in archived_dirs().into_iter().chain(["dev/shm"]) {
            fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        dir
    }

    #[test]
    fn files_folders_links_and_modes_are_captured_and_nothing_else() {
        let src = root();
        let ws = src.path().join("workspace");
        fs::create_dir_all(ws.join("a/b")).unwrap();
        fs::write(ws.join("a/b/data.bin"), vec![7u8; 100_000]).unwrap();
        fs::write(ws.join("run.sh"), "echo hi").unwrap();
        fs::set_permissions(ws.join("run.sh"), fs::Permissions::from_mode(0o750)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.join("link")).unwrap();
        fs::write(src.path().join("home/sandbox/.rc"), "x=1").unwrap();
        fs::create_dir_all(src.path().join("tmp/n/e")).unwrap();
        fs::write(src.path().join("tmp/n/e/data.csv"), "a,b\n").unwrap();
        fs::write(src.path().join("dev/shm/not-carried"), "").unwrap();
        std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();

        let mut archive = Vec::new();
        let c = capture(src.path(), &archived_dirs(), &mut archive).unwrap();
        assert_eq!((c.files, c.bytes), (4, 100_000 + 7 + 3 + 4));
        assert!(
            c.skipped.iter().any(|s| s.contains("sock")),
            "{:?}",
            c.skipped
        );

        let mut seen = Vec::new();
        let mut tar = tar::Archive::new(archive.as_slice());
        for entry in tar.entries().unwrap() {
            let e = entry.unwrap();
            let name = e.path().unwrap().display().to_string();
            let kind = e.header().entry_type();
            let mode = e.header().mode().unwrap() & 0o777;
            let link = e.link_name().unwrap().map(|l| l.display().to_string());
            seen.push((name, kind, mode, link));
        }
        let find = |n: &str| {
            seen.iter()
                .find(|s| s.0 == n)
                .unwrap_or_else(|| panic!("{n}: {seen:?}"))
        };
        assert_eq!(find("workspace/run.sh").2, 0o750);
        // The link is kept as a link: its target is not read.
        assert_eq!(find("workspace/link").1, tar::EntryType::Symlink);
        assert_eq!(find("workspace/link").3.as_deref(), Some("/etc/passwd"));
        assert_eq!(find("home/sandbox/.rc").1, tar::EntryType::Regular);
        assert_eq!(find("tmp/n/e/data.csv").1, tar::EntryType::Regular);
        assert_eq!(find("tmp").1, tar::EntryType::Directory);
        assert!(!seen.iter().any(|s| s.0.starts_with("dev")), "{seen:?}");
    }
}
