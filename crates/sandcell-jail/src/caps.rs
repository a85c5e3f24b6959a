//! `no_new_privs`, capability dropping and the switch to the unprivileged sandbox user.
//!
//! The sandbox process sits in a user namespace where it holds every capability, and its uid
//! before the switch may be the overflow uid rather than 0, so `setresuid` does not clear the
//! capability sets on its own: they are cleared explicitly and then read back from the kernel.

use std::fs;
use std::io;

use rustix::thread::{self, CapabilitySet, CapabilitySets, Gid, Uid};
use sandcell_protocol::isolation::{Feature, FeatureState};

use crate::error::JailError;

/// Sets `PR_SET_NO_NEW_PRIVS`, so that no later `execve` can gain privileges.
pub fn set_no_new_privs() -> Result<(), JailError> {
    thread::set_no_new_privs(true)
        .map_err(|e| JailError::io("prctl(PR_SET_NO_NEW_PRIVS)", e.into()))
}

/// Reports whether `no_new_privs` is set on the calling thread.
pub fn no_new_privs_feature() -> Feature {
    let (state, detail) = match thread::no_new_privs() {
        Ok(true) => (
            FeatureState::Active,
            "set: execve cannot grant privileges (setuid bits and file capabilities are ignored)"
                .to_string(),
        ),
        Ok(false) => (FeatureState::Unavailable, "not set".to_string()),
        Err(e) => (
            FeatureState::Unavailable,
            format!("prctl(PR_GET_NO_NEW_PRIVS) failed: {e}"),
        ),
    };
    Feature {
        name: "no_new_privs".into(),
        state,
        detail,
    }
}

/// Drops every capability and switches the calling process to `uid`/`gid` for good.
///
/// Must run single-threaded: the raw `setres[ug]id` system calls used here change only the
/// calling thread (glibc's wrappers would signal every thread, which we do not want this late).
/// Supplementary groups are left alone because `setgroups` is denied in the sandbox's user
/// namespace.
pub fn drop_privileges(uid: u32, gid: u32) -> Result<Feature, JailError> {
    if uid == u32::MAX || gid == u32::MAX {
        return Err(JailError::Config(format!(
            "cannot switch to uid {uid} gid {gid}: -1 is not an id"
        )));
    }
    let threads = thread_count()?;
    if threads != 1 {
        return Err(JailError::Config(format!(
            "drop_privileges needs a single-threaded process, found {threads} threads"
        )));
    }

    thread::clear_ambient_capability_set()
        .map_err(|e| JailError::io("clear the ambient capability set", e.into()))?;
    // Drop every capability the kernel knows: the bounding set refuses (EINVAL) past the
    // last one.
    let mut last = 0;
    for cap in 0..64u32 {
        match thread::remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(1 << cap))
        {
            Ok(()) => last = cap,
            Err(rustix::io::Errno::INVAL) if cap > 0 => break,
            Err(e) => {
                return Err(JailError::io(
                    format!("drop capability {cap} from the bounding set"),
                    e.into(),
                ));
            }
        }
    }
    // Group first: once the uid changes we may no longer hold CAP_SETGID.
    let g = Gid::from_raw_unchecked(gid);
    thread::set_thread_res_gid(g, g, g)
        .map_err(|e| JailError::io(format!("setresgid({gid})"), e.into()))?;
    let u = Uid::from_raw_unchecked(uid);
    thread::set_thread_res_uid(u, u, u)
        .map_err(|e| JailError::io(format!("setresuid({uid})"), e.into()))?;
    let none = CapabilitySet::empty();
    thread::set_capabilities(
        None,
        CapabilitySets {
            effective: none,
            permitted: none,
            inheritable: none,
        },
    )
    .map_err(|e| JailError::io("capset to empty sets", e.into()))?;

    verify(uid, gid, last)?;
    Ok(Feature {
        name: "capabilities".into(),
        state: FeatureState::Active,
        detail: format!(
            "all dropped (bounding, ambient, effective, permitted, inheritable); \
             running as uid {uid} gid {gid}"
        ),
    })
}

/// Confirms from the kernel's own view (system calls, not our bookkeeping) that every set
/// is empty and every id switched.
fn verify(uid: u32, gid: u32, last: u32) -> Result<(), JailError> {
    let sets =
        thread::capabilities(None).map_err(|e| verify_error(format!("capget failed: {e}")))?;
    for (name, set) in [
        ("effective", sets.effective),
        ("permitted", sets.permitted),
        ("inheritable", sets.inheritable),
    ] {
        if !set.is_empty() {
            return Err(verify_error(format!(
                "the {name} set is {:#x} after dropping, expected 0",
                set.bits()
            )));
        }
    }
    for cap in 0..=last {
        let c = CapabilitySet::from_bits_retain(1 << cap);
        if thread::capability_is_in_bounding_set(c).unwrap_or(true) {
            return Err(verify_error(format!(
                "capability {cap} is still in the bounding set"
            )));
        }
        if thread::capability_is_in_ambient_set(c).unwrap_or(false) {
            return Err(verify_error(format!(
                "capability {cap} is still in the ambient set"
            )));
        }
    }
    let (ru, eu, su) = (
        rustix::process::getuid().as_raw(),
        rustix::process::geteuid().as_raw(),
        nix::unistd::getresuid()
            .map(|r| r.saved.as_raw())
            .unwrap_or(u32::MAX),
    );
    let (rg, eg, sg) = (
        rustix::process::getgid().as_raw(),
        rustix::process::getegid().as_raw(),
        nix::unistd::getresgid()
            .map(|r| r.saved.as_raw())
            .unwrap_or(u32::MAX),
    );
    if [ru, eu, su] != [uid; 3] || [rg, eg, sg] != [gid; 3] {
        return Err(verify_error(format!(
            "ids are uid {ru}/{eu}/{su} gid {rg}/{eg}/{sg} after switching, expected {uid}/{gid}"
        )));
    }
    Ok(())
}

/// Threads of this process: procfs counts them in the link count of `/proc/self/task`
/// (2 + threads), one `stat` instead of formatting all of `/proc/self/status`.
pub(crate) fn thread_count() -> Result<u64, JailError> {
    use std::os::unix::fs::MetadataExt;
    let links = fs::metadata("/proc/self/task")
        .map_err(|e| JailError::io("stat /proc/self/task", e))?
        .nlink();
    Ok(links.saturating_sub(2))
}

fn verify_error(message: String) -> JailError {
    JailError::io("verify dropped privileges", io::Error::other(message))
}
