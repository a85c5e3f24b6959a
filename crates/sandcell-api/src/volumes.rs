//! Host folders and named volumes mounted into sandboxes (`mounts` at create), and the
//! volumes themselves (`/v1/volumes`).

use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// Most mounts one sandbox may have.
pub const MAX_MOUNTS: usize = 16;

/// The folders (writable, the sandbox's own) under which a mount may be placed: every backend
/// can make a mount point there without touching the read-only system.
pub const MOUNT_PARENTS: [&str; 3] = ["/workspace", "/home/sandbox", "/tmp"];

/// How a sandbox sees a mounted folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MountMode {
    /// Read-only (the default for host folders).
    Ro,
    /// Read and write: changes reach the host folder or the volume (the default for
    /// volumes).
    Rw,
    /// Read-only below, writable above: changes land in a scratch layer in the sandbox's own
    /// disk (counted against its `disk` limit) and go with it; the folder is never changed.
    Overlay,
}

impl MountMode {
    /// The name used on the wire and in `--mount`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ro => "ro",
            Self::Rw => "rw",
            Self::Overlay => "overlay",
        }
    }

    fn parse(text: &str) -> Result<Self, ValidationError> {
        match text {
            "ro" => Ok(Self::Ro),
            "rw" => Ok(Self::Rw),
            "overlay" => Ok(Self::Overlay),
            other => Err(ValidationError(format!(
                "mount mode '{other}' is not one of ro, rw, overlay"
            ))),
        }
    }
}

/// One folder mounted into a sandbox at create: a host folder or a named volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MountInput {
    /// A host folder (absolute) inside one of the service's `mounts.allowed_paths`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// A named volume (`POST /v1/volumes`; made on first use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// Where it appears inside: `/workspace` or a folder below `/workspace`, `/home/sandbox`
    /// or `/tmp`.
    pub path: String,
    /// `ro` (the default for host folders), `rw` (the default for volumes) or `overlay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MountMode>,
}

impl MountInput {
    /// The mode it asks for, or its kind's default.
    pub fn mode(&self) -> MountMode {
        self.mode.unwrap_or(if self.volume.is_some() {
            MountMode::Rw
        } else {
            MountMode::Ro
        })
    }

    /// Parses `--mount HOST:PATH[:ro|rw|overlay]`.
    pub fn parse_host(text: &str) -> Result<Self, ValidationError> {
        let (source, path, mode) = split_spec(text, "--mount HOST:PATH[:ro|rw|overlay]")?;
        Ok(Self {
            host_path: Some(source.to_string()),
            volume: None,
            path: path.to_string(),
            mode,
        })
    }

    /// Parses `--volume NAME:PATH[:ro|rw|overlay]`.
    pub fn parse_volume(text: &str) -> Result<Self, ValidationError> {
        let (source, path, mode) = split_spec(text, "--volume NAME:PATH[:ro|rw|overlay]")?;
        Ok(Self {
            host_path: None,
            volume: Some(source.to_string()),
            path: path.to_string(),
            mode,
        })
    }

    /// Checks one mount on its own: one source, a valid volume name, a target path that
    /// [`check_mount_path`] takes.
    pub fn check(&self) -> Result<(), ValidationError> {
        match (&self.host_path, &self.volume) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(ValidationError(format!(
                    "mount at '{}' must name exactly one of host_path and volume",
                    self.path
                )));
            }
            (Some(host), None) => {
                if !host.starts_with('/') || host.contains('\0') {
                    return Err(ValidationError(format!(
                        "mount host_path '{host}' must be an absolute path"
                    )));
                }
            }
            (None, Some(name)) => check_volume_name(name)?,
        }
        check_mount_path(&self.path)
    }

    /// Checks a sandbox's list: each mount, at most [`MAX_MOUNTS`], no path twice.
    pub fn check_all(list: &[MountInput]) -> Result<(), ValidationError> {
        if list.len() > MAX_MOUNTS {
            return Err(ValidationError(format!(
                "at most {MAX_MOUNTS} mounts, got {}",
                list.len()
            )));
        }
        for m in list {
            m.check()?;
        }
        check_targets(list.iter().map(|m| m.path.as_str()))
    }
}

/// Checks a sandbox's mount targets together: none twice, none inside another (its mount
/// point would be made in a folder the sandbox may have filled with links earlier: a volume).
pub fn check_targets<'a>(paths: impl Iterator<Item = &'a str>) -> Result<(), ValidationError> {
    let paths: Vec<&str> = paths.map(|p| p.trim_end_matches('/')).collect();
    for (i, a) in paths.iter().enumerate() {
        for b in &paths[i + 1..] {
            if a == b {
                return Err(ValidationError(format!("two mounts at '{a}'")));
            }
            let (outer, inner) = if a.len() < b.len() { (a, b) } else { (b, a) };
            if inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('/'))
            {
                return Err(ValidationError(format!(
                    "mount '{inner}' lies inside mount '{outer}': mount them side by side"
                )));
            }
        }
    }
    Ok(())
}

fn split_spec<'a>(
    text: &'a str,
    form: &str,
) -> Result<(&'a str, &'a str, Option<MountMode>), ValidationError> {
    let parts: Vec<&str> = text.split(':').collect();
    let bad = || ValidationError(format!("'{text}' is not {form}"));
    match parts.as_slice() {
        [source, path] if !source.is_empty() && !path.is_empty() => Ok((source, path, None)),
        [source, path, mode] if !source.is_empty() && !path.is_empty() => {
            Ok((source, path, Some(MountMode::parse(mode)?)))
        }
        _ => Err(bad()),
    }
}

/// Checks where a mount goes: absolute, without `.` or `..` or empty components, and
/// [`MOUNT_PARENTS`]`[0]` itself or a folder below one of [`MOUNT_PARENTS`].
pub fn check_mount_path(path: &str) -> Result<(), ValidationError> {
    let trimmed = path.trim_end_matches('/');
    let bad = |why: &str| Err(ValidationError(format!("mount path '{path}' {why}")));
    if !trimmed.starts_with('/') {
        return bad("must be absolute");
    }
    if trimmed.len() > 1024 || trimmed.contains(|c: char| c.is_control() || ",:".contains(c)) {
        return bad("is too long or holds a control character, ',' or ':'");
    }
    if trimmed[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return bad("must not hold empty, '.' or '..' components");
    }
    let below = |parent: &str| {
        trimmed
            .strip_prefix(parent)
            .is_some_and(|rest| rest.starts_with('/'))
    };
    if trimmed == MOUNT_PARENTS[0] || MOUNT_PARENTS.iter().any(|p| below(p)) {
        Ok(())
    } else {
        bad("must be /workspace or lie below /workspace, /home/sandbox or /tmp")
    }
}

/// Checks a volume's name: 1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter or
/// digit.
pub fn check_volume_name(name: &str) -> Result<(), ValidationError> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ValidationError(format!(
            "volume name '{name}' must be 1 to 64 of a-z, 0-9, '-', '_', '.', starting with a letter or digit"
        )))
    }
}

/// `POST /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// Its name (1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`).
    pub name: String,
}

/// A named volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeInfo {
    /// Its name.
    pub name: String,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// The bytes of its files.
    pub size_bytes: u64,
    /// The running sandboxes it is mounted in.
    pub sandboxes: Vec<String>,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeList {
    /// By name.
    pub volumes: Vec<VolumeInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_must_lie_in_the_sandboxes_own_folders() {
        for ok in [
            "/workspace",
            "/workspace/",
            "/workspace/data",
            "/home/sandbox/x",
            "/tmp/a/b",
        ] {
            check_mount_path(ok).unwrap();
        }
        for bad in [
            "workspace",
            "/",
            "/etc",
            "/usr/lib",
            "/tmp",
            "/home/sandbox",
            "/workspacex",
            "/workspace/../etc",
            "/workspace/./a",
            "/workspace//a",
        ] {
            assert!(check_mount_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_parse_into_mounts_with_their_default_modes() {
        let m = MountInput::parse_host("/srv/data:/workspace/data").unwrap();
        assert_eq!(m.host_path.as_deref(), Some("/srv/data"));
        assert_eq!(m.mode(), MountMode::Ro);
        let v = MountInput::parse_volume("cache:/home/sandbox/cache").unwrap();
        assert_eq!(v.mode(), MountMode::Rw);
        let o = MountInput::parse_host("/srv/repo:/workspace:overlay").unwrap();
        assert_eq!(o.mode(), MountMode::Overlay);
        assert!(MountInput::parse_host("/srv:/workspace:rx").is_err());
        assert!(MountInput::parse_host("/srv").is_err());
        assert!(
            MountInput::parse_volume("Bad Name:/workspace")
                .unwrap()
                .check()
                .is_err()
        );
    }

    #[test]
    fn a_list_refuses_two_mounts_at_one_path_and_mounts_without_one_source() {
        let a = MountInput::parse_host("/a:/workspace/x").unwrap();
        let b = MountInput::parse_volume("v:/workspace/x/").unwrap();
        assert!(MountInput::check_all(&[a.clone(), b]).is_err());
        let inner = MountInput::parse_volume("v:/workspace/x/y").unwrap();
        let e = MountInput::check_all(&[a.clone(), inner]).unwrap_err();
        assert!(e.0.contains("inside mount '/workspace/x'"), "{e}");
        let beside = MountInput::parse_volume("v:/workspace/xy").unwrap();
        MountInput::check_all(&[a.clone(), beside]).unwrap();
        let neither = MountInput {
            host_path: None,
            volume: None,
            path: "/workspace".into(),
            mode: None,
        };
        assert!(neither.check().is_err());
        MountInput::check_all(&[a]).unwrap();
    }
}
