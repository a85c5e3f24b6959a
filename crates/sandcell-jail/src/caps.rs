//! `no_new_privs`, capability dropping and the switch to the unprivileged sandbox user.
//!
//! The sandbox process sits in a user namespace where it holds every capability, and its uid
//! before the switch may be the overflow uid rather than 0, so `setresuid` does not clear the
//! capability sets on its own: they are cleared explicitly and then checked in
//! `/proc/self/status`.

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
    let status = read_status()?;
    let threads = status_field(&status, "Threads")?;
    if threads.trim() != "1" {
        return Err(JailError::Config(format!(
            "drop_privileges needs a single-threaded process, found {} threads",
            threads.trim()
        )));
    }

    thread::clear_ambient_capability_set()
        .map_err(|e| JailError::io("clear the ambient capability set", e.into()))?;
    for cap in 0..=last_cap() {
        thread::remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(1 << cap))
            .map_err(|e| {
                JailError::io(
                    format!("drop capability {cap} from the bounding set"),
                    e.into(),
                )
            })?;
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

    verify(uid, gid)?;
    Ok(Feature {
        name: "capabilities".into(),
        state: FeatureState::Active,
        detail: format!(
            "all dropped (bounding, ambient, effective, permitted, inheritable); \
             running as uid {uid} gid {gid}"
        ),
    })
}

/// The highest capability number the kernel knows.
fn last_cap() -> u32 {
    if let Ok(s) = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        && let Ok(n) = s.trim().parse::<u32>()
    {
        // Capability sets are 64-bit: nothing above 63 can exist.
        return n.min(63);
    }
    // Without /proc, probe: PR_CAPBSET_READ fails with EINVAL past the last capability.
    (0..64u32)
        .take_while(|&c| {
            thread::capability_is_in_bounding_set(CapabilitySet::from_bits_retain(1 << c)).is_ok()
        })
        .last()
        .unwrap_or(0)
}

/// Confirms from the kernel's own view that every set is empty and every id switched.
fn verify(uid: u32, gid: u32) -> Result<(), JailError> {
    let status = read_status()?;
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let value = status_field(&status, set)?;
        let bits = u64::from_str_radix(value.trim(), 16)
            .map_err(|_| verify_error(format!("unparsable {set} value {value:?}")))?;
        if bits != 0 {
            return Err(verify_error(format!(
                "{set} is {bits:#x} after dropping, expected 0"
            )));
        }
    }
    for (field, want) in [("Uid", uid), ("Gid", gid)] {
        let value = status_field(&status, field)?;
        // Real, effective, saved and filesystem ids must all have switched.
        if !value
            .split_whitespace()
            .all(|id| id.parse::<u32>() == Ok(want))
        {
            return Err(verify_error(format!(
                "{field} is {:?} after switching, expected {want}",
                value.trim()
            )));
        }
    }
    Ok(())
}

fn read_status() -> Result<String, JailError> {
    fs::read_to_string("/proc/self/status").map_err(|e| JailError::io("read /proc/self/status", e))
}

/// The value of one `Name:\tvalue` line of `/proc/self/status`.
fn status_field<'a>(status: &'a str, name: &str) -> Result<&'a str, JailError> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
        .ok_or_else(|| verify_error(format!("/proc/self/status has no {name} line")))
}

fn verify_error(message: String) -> JailError {
    JailError::io("verify dropped privileges", io::Error::other(message))
}
