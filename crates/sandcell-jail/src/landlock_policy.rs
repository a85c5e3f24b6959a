//! The Landlock filesystem policy: read/execute on system trees, read/write on the sandbox's
//! own writable places, nothing elsewhere; plus signal scoping.
//!
//! The policy targets Landlock ABI v7, the newest this runtime is tested against: a kernel with
//! an older ABI gets what it supports (reported as degraded), and rights that later ABIs add are
//! left unhandled until they are tested, as the landlock crate recommends.

use std::os::fd::AsFd;

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, PathFdError,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use sandcell_protocol::isolation::{Feature, FeatureState};

use crate::error::JailError;

/// The Landlock ABI the policy is written for.
const TARGET_ABI: ABI = ABI::V7;

/// Rights that make sense on a non-directory (the kernel refuses directory-only rights there).
fn file_rights() -> BitFlags<AccessFs> {
    AccessFs::from_file(TARGET_ABI)
}

/// The running kernel's Landlock ABI version, or `None` when Landlock is absent or disabled.
pub fn abi_version() -> Option<u32> {
    // The landlock crate keeps its own probe private, hence the raw call.
    // SAFETY: with a null attribute pointer, size 0 and LANDLOCK_CREATE_RULESET_VERSION the
    // kernel reads no memory and only returns the ABI version (or an error); no fd is created.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).ok().filter(|&v| v > 0)
}

/// `LANDLOCK_CREATE_RULESET_VERSION` from linux/landlock.h.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// Restricts the calling process (and its future children) to read/execute under `read_exec`
/// and full access under `read_write`; missing paths are skipped and listed in the detail.
pub fn restrict(read_exec: &[&str], read_write: &[&str]) -> Result<Feature, JailError> {
    let Some(kernel_abi) = abi_version() else {
        return Ok(Feature {
            name: "landlock".into(),
            state: FeatureState::Unavailable,
            detail: "kernel has no Landlock (or it is not enabled in the lsm= list)".into(),
        });
    };

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET_ABI))
        .map_err(|e| JailError::Landlock(format!("handle filesystem rights: {e}")))?
        // Signals may not leave the sandbox's domain (e.g. to kill the launcher or host
        // processes sharing our uid). Abstract unix sockets are already confined by the
        // private network namespace.
        .scope(Scope::Signal)
        .map_err(|e| JailError::Landlock(format!("scope signals: {e}")))?
        .create()
        .map_err(|e| JailError::Landlock(format!("create the ruleset: {e}")))?;

    let mut skipped = Vec::new();
    let mut read_only = Vec::new();
    let mut writable = Vec::new();
    let grants = [
        (read_exec, AccessFs::from_read(TARGET_ABI), &mut read_only),
        (read_write, AccessFs::from_all(TARGET_ABI), &mut writable),
    ];
    for (paths, rights, granted) in grants {
        for &path in paths {
            // O_PATH open: follows symlinks like the sandbox's own accesses will.
            let fd = match PathFd::new(path) {
                Ok(fd) => fd,
                Err(PathFdError::OpenCall { source, .. })
                    if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
                {
                    skipped.push(path);
                    continue;
                }
                Err(e) => return Err(JailError::Landlock(format!("open {path}: {e}"))),
            };
            let is_dir = rustix::fs::fstat(fd.as_fd())
                .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir())
                .map_err(|e| JailError::io(format!("stat {path}"), e.into()))?;
            let rights = if is_dir {
                rights
            } else {
                rights & file_rights()
            };
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, rights))
                .map_err(|e| JailError::Landlock(format!("allow {path}: {e}")))?;
            granted.push(path);
        }
    }

    let status = ruleset
        .restrict_self()
        .map_err(|e| JailError::Landlock(format!("restrict self: {e}")))?;
    let state = match status.ruleset {
        RulesetStatus::FullyEnforced => FeatureState::Active,
        RulesetStatus::PartiallyEnforced => FeatureState::Degraded,
        RulesetStatus::NotEnforced => FeatureState::Unavailable,
    };
    let mut detail = format!(
        "ABI v{kernel_abi}; read-only: {}; writable: {}",
        list(&read_only),
        list(&writable)
    );
    match state {
        FeatureState::Active => detail.push_str("; signals scoped to the sandbox"),
        FeatureState::Degraded => detail.push_str(&format!(
            "; partial: the kernel lacks some rights or signal scoping of ABI v{}",
            TARGET_ABI as u32
        )),
        _ => detail.push_str("; not enforced by the kernel"),
    }
    if !skipped.is_empty() {
        detail.push_str(&format!("; skipped (missing): {}", list(&skipped)));
    }
    Ok(Feature {
        name: "landlock".into(),
        state,
        detail,
    })
}

fn list(paths: &[&str]) -> String {
    if paths.is_empty() {
        "none".into()
    } else {
        paths.join(", ")
    }
}
