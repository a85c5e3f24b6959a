//! Host folders mounted into a sandbox ([`HostMount`]): detached by the launcher on the host
//! (as root, so a folder only root may enter still mounts, its owner shown as the sandbox
//! user through an idmapped mount), then attached by the sandbox's first process below its
//! tmpfs mounts, before the pivot.

use std::os::fd::OwnedFd;

use nix::mount::MsFlags;

use crate::config::{HostMount, HostMountMode};
use crate::error::JailError;
use crate::mount_attr;

/// A host folder's mount, detached, waiting to be attached inside.
#[derive(Debug)]
pub struct DetachedMount {
    tree: OwnedFd,
    idmapped: bool,
}

/// The attributes a mount of `mode` gets: never set-uid or devices; read-only unless `rw`
/// (an overlay's lower layer is read-only too).
fn attrs(mode: HostMountMode) -> u64 {
    let base = mount_attr::NOSUID | mount_attr::NODEV;
    match mode {
        HostMountMode::ReadWrite => base,
        HostMountMode::ReadOnly | HostMountMode::Overlay => base | mount_attr::RDONLY,
    }
}

/// Detaches every mount's folder (host root only: the id mapping needs it). The sandbox user
/// maps to `outside_uid`/`outside_gid`; each folder's owner is shown as them. A file system
/// without idmapped mounts shows the host's ids instead.
pub fn detach_all(
    mounts: &[HostMount],
    outside_uid: u32,
    outside_gid: u32,
) -> Result<Vec<DetachedMount>, JailError> {
    mounts
        .iter()
        .map(|m| {
            let tree = clone(m)?;
            let userns = mount_attr::mapping_namespace(
                &format!("{} {outside_uid} 1\n", m.owner_uid),
                &format!("{} {outside_gid} 1\n", m.owner_gid),
            )?;
            match mount_attr::set_on_tree(&tree, attrs(m.mode), Some(&userns), false) {
                Ok(()) => Ok(DetachedMount {
                    tree,
                    idmapped: true,
                }),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    with_host_ids(tree, m)
                }
                Err(e) => Err(JailError::io(
                    format!("idmap the host folder {}", m.source),
                    e,
                )),
            }
        })
        .collect()
}

/// A detached copy of `m`'s folder.
fn clone(m: &HostMount) -> Result<OwnedFd, JailError> {
    mount_attr::clone_tree(&m.source, false)
        .map_err(|e| JailError::io(format!("open the host folder {}", m.source), e))
}

/// `m`'s detached `tree` protected per its mode, the host's ids shown.
fn with_host_ids(tree: OwnedFd, m: &HostMount) -> Result<DetachedMount, JailError> {
    mount_attr::set_on_tree(&tree, attrs(m.mode), None, false)
        .map_err(|e| JailError::io(format!("protect the host folder {}", m.source), e))?;
    Ok(DetachedMount {
        tree,
        idmapped: false,
    })
}

/// Attaches the mounts under the new root `root` (its tmpfs mounts in place), in order:
/// `detached` from [`detach_all`], or, when the launcher was not root (empty), each folder
/// opened here with the host's ids. Returns a line per mount for the isolation report.
pub fn attach_all(
    root: &str,
    mounts: &[HostMount],
    detached: Vec<DetachedMount>,
) -> Result<Vec<String>, JailError> {
    let mut detached = detached.into_iter();
    let mut lines = Vec::new();
    for m in mounts {
        let mount = match detached.next() {
            Some(d) => d,
            None => with_host_ids(clone(m)?, m)?,
        };
        let target = format!("{root}{}", m.target);
        std::fs::create_dir_all(&target)
            .map_err(|e| JailError::io(format!("make the mount point {}", m.target), e))?;
        match m.mode {
            HostMountMode::ReadOnly | HostMountMode::ReadWrite => {
                mount_attr::move_tree(&mount.tree, &target)
                    .map_err(|e| JailError::io(format!("mount {}", m.target), e))?;
            }
            HostMountMode::Overlay => overlay(&mount.tree, &target, &m.target)?,
        }
        lines.push(format!(
            "{} ({}{})",
            m.target,
            match m.mode {
                HostMountMode::ReadOnly => "read-only",
                HostMountMode::ReadWrite => "read-write",
                HostMountMode::Overlay => "read-only, writes to a scratch layer",
            },
            if mount.idmapped {
                ", its owner shown as the sandbox user"
            } else {
                ""
            }
        ));
    }
    Ok(lines)
}

/// The folder read-only at the bottom of an overlay on `target`, whose upper layer lies in
/// the tmpfs holding `target` (the layers' folders end up hidden under the overlay).
fn overlay(tree: &OwnedFd, target: &str, shown: &str) -> Result<(), JailError> {
    let [lower, upper, work] =
        [".lower", ".upper", ".work"].map(|name| format!("{target}/.sandcell-overlay{name}"));
    for dir in [&lower, &upper, &work] {
        std::fs::create_dir(dir)
            .map_err(|e| JailError::io(format!("make the overlay folders of {shown}"), e))?;
    }
    mount_attr::move_tree(tree, &lower)
        .map_err(|e| JailError::io(format!("mount the lower layer of {shown}"), e))?;
    let options = format!("lowerdir={lower},upperdir={upper},workdir={work}");
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    // `userxattr`: overlay's own attributes in the user namespace's `user.` space.
    super::do_mount(
        Some("overlay"),
        target,
        Some("overlay"),
        flags,
        Some(&format!("{options},userxattr")),
        &format!("mount the overlay on {shown}"),
    )
    .or_else(|_| {
        super::do_mount(
            Some("overlay"),
            target,
            Some("overlay"),
            flags,
            Some(&options),
            &format!("mount the overlay on {shown}"),
        )
    })
}
