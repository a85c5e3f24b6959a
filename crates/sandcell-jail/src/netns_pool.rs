//! Network namespaces made ahead of time, so that creating a sandbox does not pay for one.
//!
//! A fresh network namespace costs ~0.45 ms of `clone` here (registering `lo`, its sysctls,
//! IPv6 address configuration), three quarters of creating all six namespaces. As root, a
//! launcher takes a spare one from the pool (`setns` costs ~0.02 ms) and, while its sandbox
//! runs, makes a new spare for the next sandbox.
//!
//! Each spare is a namespace with `lo` up, kept alive by a bind mount of its nsfs file at
//! `<dir>/ns-<unique>`, like `ip netns add` does. Taking one creates `<name>.taken` with
//! `O_EXCL` first, so two launchers never get the same namespace, and a namespace is used by
//! one sandbox only, ever: after the take its bind mount is removed. The namespaces belong to
//! the host's user namespace, so a sandbox cannot reconfigure its network (it could only do
//! so before dropping its capabilities anyway).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::CloneFlags;

use crate::error::JailError;
use crate::net;
use crate::spares::{abandoned, ensure_pool_dir, unique};

const PREFIX: &str = "ns-";
const TAKEN: &str = ".taken";

/// A directory of spare network namespaces.
#[derive(Debug, Clone)]
pub struct NetnsPool {
    dir: PathBuf,
}

/// A namespace taken from the pool: its descriptor, and its entry to remove.
#[derive(Debug)]
pub struct TakenNetns {
    /// The namespace (for `setns`).
    pub fd: OwnedFd,
    entry: PathBuf,
    marker: PathBuf,
}

impl NetnsPool {
    /// The pool in `dir` (created, mode 0700, on the first refill).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Takes a spare namespace, or `None` when there is none (or the pool is unusable).
    pub fn take(&self) -> Option<TakenNetns> {
        for entry in fs::read_dir(&self.dir).ok()?.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with(PREFIX) || name.ends_with(TAKEN) {
                continue;
            }
            let path = entry.path();
            let marker = marker_of(&path);
            if claim(&marker).is_err() {
                // Someone else took it.
                continue;
            }
            match File::open(&path) {
                Ok(f) if is_netns(&f) => {
                    return Some(TakenNetns {
                        fd: f.into(),
                        entry: path,
                        marker,
                    });
                }
                // Not a mounted namespace (a half-made entry): clear it.
                _ => remove_entry(&path, &marker),
            }
        }
        None
    }

    /// How many spares are ready (entries nobody took).
    pub fn spares(&self) -> usize {
        fs::read_dir(&self.dir).map_or(0, |list| {
            list.flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(PREFIX)
                        && !name.ends_with(TAKEN)
                        && !marker_of(&e.path()).exists()
                })
                .count()
        })
    }

    /// Adds spares until `target` exist. Switches the calling process into a new network
    /// namespace for each one it makes, so only a launcher whose sandbox runs already may call
    /// it. Errors leave the pool as it was (a launcher then simply creates its own).
    pub fn refill(&self, target: usize) -> Result<usize, JailError> {
        ensure_pool_dir(&self.dir)?;
        // Our namespace mounts must not propagate into other mount namespaces.
        crate::rootfs::skeleton::make_private_mount(&self.dir)?;
        let spares = self.sweep();
        let mut made = 0;
        for _ in spares..target {
            self.make_one()?;
            made += 1;
        }
        Ok(made)
    }

    /// Removes entries whose taker died before removing them; returns the spares left.
    fn sweep(&self) -> usize {
        let Ok(list) = fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut spares = 0;
        for entry in list.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(ns) = name.strip_suffix(TAKEN) {
                let taker = fs::read_to_string(entry.path())
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                if abandoned(&entry.path(), taker) {
                    remove_entry(&self.dir.join(ns), &entry.path());
                }
            } else if name.starts_with(PREFIX) && !marker_of(&entry.path()).exists() {
                spares += 1;
            }
        }
        spares
    }

    fn make_one(&self) -> Result<(), JailError> {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET)
            .map_err(|e| JailError::io("create a network namespace", e.into()))?;
        net::loopback_up()?;
        let path = self.dir.join(unique(PREFIX));
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| JailError::io(format!("create {}", path.display()), e))?;
        if let Err(e) = mount(
            // This thread's: only the calling thread moved into the new namespace.
            Some("/proc/thread-self/ns/net"),
            &path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ) {
            let _ = fs::remove_file(&path);
            return Err(JailError::io("keep a network namespace", e.into()));
        }
        Ok(())
    }
}

impl TakenNetns {
    /// Removes the namespace's pool entry (its bind mount and files); the namespace lives on
    /// as long as a process is in it.
    pub fn remove_entry(self) {
        remove_entry(&self.entry, &self.marker);
    }
}

fn marker_of(entry: &Path) -> PathBuf {
    let mut s = entry.as_os_str().to_owned();
    s.push(TAKEN);
    PathBuf::from(s)
}

/// Creates `marker` exclusively, holding our pid (for [`NetnsPool::sweep`]).
fn claim(marker: &Path) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(marker)?;
    write!(f, "{}", std::process::id())
}

fn remove_entry(entry: &Path, marker: &Path) {
    // EINVAL: not a mount point (anymore); the files go either way.
    let _ = umount2(entry, MntFlags::MNT_DETACH);
    let _ = fs::remove_file(entry);
    let _ = fs::remove_file(marker);
}

/// Whether `f` is a network namespace (not, say, a leftover empty file).
fn is_netns(f: &File) -> bool {
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the namespace type, or fails on
    // anything that is not a namespace file; the fd is valid for the call.
    let kind = unsafe { libc::ioctl(f.as_raw_fd(), NS_GET_NSTYPE) };
    kind == libc::CLONE_NEWNET
}
