//! Host folders and named volumes mounted into sandboxes, and the volumes themselves.
//!
//! A volume is a folder of the home, `<home>/volumes/<owner>/<name>/data`, its files owned by
//! the sandbox user's id ([`SANDBOX_UID`]) on the host: the `process` backend shows that id as
//! the sandbox user through an idmapped mount, and gVisor writes as it. Volumes belong to the
//! owner that made them; they outlive the sandboxes that mount them until deleted.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use sandcell_api::volumes::{MountInput, VolumeInfo, VolumeList, check_volume_name};
use sandcell_engine::SandboxMount;
use sandcell_image::Hashing;
use sandcell_protocol::SANDBOX_UID;

use crate::transfer::HostPathPolicy;
use crate::{Caller, ErrorKind, Service, ServiceError, ServiceResult};

/// A volume's record beside its files.
#[derive(serde::Serialize, serde::Deserialize)]
struct VolumeRecord {
    created_at_ms: i64,
}

impl Service {
    /// The folders mounts may come from (`mounts.allowed_paths`), resolved now.
    pub fn mount_policy(&self) -> HostPathPolicy {
        HostPathPolicy::named(
            &self.config.mounts.allowed_paths,
            "mounts.allowed_paths",
            "mounts from",
        )
    }

    /// Resolves a create's mounts: each host folder checked against the allow-list (symbolic
    /// links resolved), each volume made when it does not exist yet.
    pub fn resolve_mounts(
        &self,
        caller: &Caller,
        list: &[MountInput],
    ) -> ServiceResult<Vec<SandboxMount>> {
        resolve_mounts(&self.config.home, &caller.owner, list, |host| {
            self.mount_policy().resolve(host)
        })
    }

    /// The caller's volumes.
    pub fn volumes<'a>(&'a self, caller: &'a Caller) -> VolumeShelf<'a> {
        VolumeShelf {
            home: &self.config.home,
            owner: &caller.owner,
            mounting: Box::new(|source| self.fleet.sandboxes_mounting(source)),
        }
    }

    /// Makes volume `name` of the caller (an error when it exists).
    pub fn create_volume(&self, caller: &Caller, name: &str) -> ServiceResult<VolumeInfo> {
        self.volumes(caller).create(name)
    }

    /// The caller's volumes.
    pub fn list_volumes(&self, caller: &Caller) -> ServiceResult<VolumeList> {
        self.volumes(caller).list()
    }

    /// One of the caller's volumes.
    pub fn get_volume(&self, caller: &Caller, name: &str) -> ServiceResult<VolumeInfo> {
        self.volumes(caller).get(name)
    }

    /// Deletes one of the caller's volumes and its files; refused while a sandbox mounts it.
    pub fn delete_volume(&self, caller: &Caller, name: &str) -> ServiceResult<()> {
        self.volumes(caller).delete(name)
    }
}

/// Names the running sandboxes that mount a host folder.
type Mounting<'a> = Box<dyn Fn(&str) -> Vec<String> + 'a>;

/// One owner's volumes in a home.
pub struct VolumeShelf<'a> {
    home: &'a Path,
    owner: &'a str,
    mounting: Mounting<'a>,
}

impl<'a> VolumeShelf<'a> {
    /// `owner`'s volumes of `home`, as a process that runs no sandbox of its own sees them
    /// (the command line without a daemon).
    pub fn local(home: &'a Path, owner: &'a str) -> Self {
        Self {
            home,
            owner,
            mounting: Box::new(|_| Vec::new()),
        }
    }

    /// Makes volume `name` (an error when it exists).
    pub fn create(&self, name: &str) -> ServiceResult<VolumeInfo> {
        check_volume_name(name)?;
        if self.dir(name).exists() {
            return Err(ServiceError::new(
                ErrorKind::AlreadyExists,
                format!("volume '{name}' exists"),
            ));
        }
        ensure_volume(self.home, self.owner, name)?;
        self.get(name)
    }

    /// Every volume, by name.
    pub fn list(&self) -> ServiceResult<VolumeList> {
        let mut names: Vec<String> = match std::fs::read_dir(owner_volumes(self.home, self.owner)) {
            Ok(entries) => entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| check_volume_name(n).is_ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_error("read the volumes", e)),
        };
        names.sort();
        let volumes = names
            .iter()
            .map(|n| self.get(n))
            .collect::<ServiceResult<_>>()?;
        Ok(VolumeList { volumes })
    }

    /// Volume `name`.
    pub fn get(&self, name: &str) -> ServiceResult<VolumeInfo> {
        check_volume_name(name)?;
        let dir = self.dir(name);
        let record: VolumeRecord = match std::fs::read(dir.join("volume.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| ServiceError::internal(format!("volume '{name}' record: {e}")))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ServiceError::not_found("volume", name));
            }
            Err(e) => return Err(io_error("read a volume's record", e)),
        };
        let data = dir.join("data");
        Ok(VolumeInfo {
            name: name.to_string(),
            created_at: sandcell_api::time::rfc3339(record.created_at_ms),
            size_bytes: tree_bytes(&data),
            sandboxes: (self.mounting)(&data.display().to_string()),
        })
    }

    /// Deletes volume `name` and its files; refused while a sandbox mounts it.
    pub fn delete(&self, name: &str) -> ServiceResult<()> {
        let info = self.get(name)?;
        if !info.sandboxes.is_empty() {
            return Err(ServiceError::new(
                ErrorKind::InvalidState,
                format!(
                    "volume '{name}' is mounted by {}: delete them first",
                    info.sandboxes.join(", ")
                ),
            ));
        }
        std::fs::remove_dir_all(self.dir(name)).map_err(|e| io_error("delete the volume", e))
    }

    fn dir(&self, name: &str) -> PathBuf {
        owner_volumes(self.home, self.owner).join(name)
    }
}

/// Resolves mounts for `owner` of the home `home`: each host folder through `allow` (which
/// checks it and resolves its links), each volume made when it does not exist yet.
pub fn resolve_mounts(
    home: &Path,
    owner: &str,
    list: &[MountInput],
    allow: impl Fn(&str) -> ServiceResult<PathBuf>,
) -> ServiceResult<Vec<SandboxMount>> {
    MountInput::check_all(list)?;
    list.iter()
        .map(|m| {
            let (source, owner_uid, owner_gid, volume) = match (&m.host_path, &m.volume) {
                (Some(host), _) => {
                    let resolved = allow(host)?;
                    let meta = std::fs::metadata(&resolved)
                        .map_err(|e| ServiceError::invalid(format!("mount '{host}': {e}")))?;
                    if !meta.is_dir() {
                        return Err(ServiceError::invalid(format!(
                            "mount '{host}' is not a folder"
                        )));
                    }
                    use std::os::unix::fs::MetadataExt;
                    (resolved, meta.uid(), meta.gid(), None)
                }
                (None, Some(name)) => {
                    let dir = ensure_volume(home, owner, name)?;
                    (dir, SANDBOX_UID, SANDBOX_UID, Some(name.clone()))
                }
                (None, None) => {
                    return Err(ServiceError::invalid(format!(
                        "mount at '{}' names no source",
                        m.path
                    )));
                }
            };
            Ok(SandboxMount {
                source: source.display().to_string(),
                target: m.path.trim_end_matches('/').to_string(),
                mode: m.mode(),
                owner_uid,
                owner_gid,
                volume,
            })
        })
        .collect()
}

fn owner_volumes(home: &Path, owner: &str) -> PathBuf {
    // Owner names are letters, digits and `-_.@` (see `check_owner`): a safe folder name.
    home.join("volumes").join(owner)
}

/// Volume `name`'s data folder, made (with its record) when missing.
fn ensure_volume(home: &Path, owner: &str, name: &str) -> ServiceResult<PathBuf> {
    check_volume_name(name)?;
    let dir = owner_volumes(home, owner).join(name);
    let data = dir.join("data");
    if dir.join("volume.json").exists() {
        return Ok(data);
    }
    std::fs::create_dir_all(&data).map_err(|e| io_error("make the volume", e))?;
    give_to_sandbox_user(&data)?;
    let record = VolumeRecord {
        created_at_ms: sandcell_engine::fleet::now_ms(),
    };
    let text = serde_json::to_vec(&record).map_err(|e| ServiceError::internal(e.to_string()))?;
    std::fs::write(dir.join("volume.json"), text)
        .map_err(|e| io_error("write the volume's record", e))?;
    Ok(data)
}

/// A volume's copy kept in a snapshot ([`sandcell_api::snapshots::VolumeCarry::Copy`]): a
/// tar archive of its files in the snapshot's folder, checksummed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeCopy {
    /// The volume it was taken of.
    pub volume: String,
    /// Where the sandbox mounted it.
    pub path: String,
    /// The archive's name in the snapshot's folder.
    pub archive: String,
    /// Its SHA-256 (hex).
    pub sha256: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Writes a copy of the volume files `data` into the snapshot folder `dir`. The sandbox
/// mounting it should be paused. Links are kept as links, never followed.
pub(crate) fn copy_volume(
    data: &Path,
    dir: &Path,
    volume: &str,
    path: &str,
) -> ServiceResult<VolumeCopy> {
    let archive = format!("volume-{volume}.tar");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dir.join(&archive))
        .map_err(|e| io_error("write a volume's copy", e))?;
    let mut tar = tar::Builder::new(Hashing::new(std::io::BufWriter::new(file)));
    tar.follow_symlinks(false);
    tar.append_dir_all(".", data)
        .map_err(|e| io_error(&format!("copy volume '{volume}'"), e))?;
    let mut out = tar
        .into_inner()
        .map_err(|e| io_error("write a volume's copy", e))?;
    out.flush()
        .map_err(|e| io_error("write a volume's copy", e))?;
    let (sha256, bytes) = out.sum();
    Ok(VolumeCopy {
        volume: volume.to_string(),
        path: path.to_string(),
        archive,
        sha256,
        bytes,
    })
}

/// Makes a new volume of `owner` (`<name>-<6 hex>`) from `copy`, kept in the snapshot folder
/// `dir`, after checking the archive against its checksum. Returns its name and files.
pub(crate) fn volume_from_copy(
    home: &Path,
    owner: &str,
    copy: &VolumeCopy,
    dir: &Path,
) -> ServiceResult<(String, PathBuf)> {
    let archive = dir.join(&copy.archive);
    let damaged = |why: String| {
        ServiceError::new(
            ErrorKind::SnapshotCorrupt,
            format!("the copy of volume '{}': {why}", copy.volume),
        )
    };
    let mut hashing = Hashing::new(std::io::sink());
    let mut file = std::fs::File::open(&archive).map_err(|e| damaged(e.to_string()))?;
    std::io::copy(&mut file, &mut hashing).map_err(|e| damaged(e.to_string()))?;
    if hashing.sum() != (copy.sha256.clone(), copy.bytes) {
        return Err(damaged("it changed since the snapshot".into()));
    }
    let stem: String = copy.volume.chars().take(57).collect();
    let name = format!(
        "{stem}-{}",
        &crate::caller::hex(&crate::caller::random_bytes(3)?)
    );
    let data = ensure_volume(home, owner, &name)?;
    let unpacked = std::fs::File::open(&archive)
        .map_err(|e| damaged(e.to_string()))
        .and_then(|f| {
            let mut tar = tar::Archive::new(std::io::BufReader::new(f));
            tar.set_preserve_permissions(true);
            tar.set_preserve_ownerships(crate::is_root());
            // `unpack` keeps every entry inside `data` (no `..`, no writing through a link).
            tar.unpack(&data).map_err(|e| damaged(e.to_string()))
        });
    if let Err(e) = unpacked {
        let _ = std::fs::remove_dir_all(owner_volumes(home, owner).join(&name));
        return Err(e);
    }
    Ok((name, data))
}

/// Makes `dir` the sandbox user's. Only root may: otherwise (refused) it stays the service's
/// user's, which is who its sandboxes run as then.
fn give_to_sandbox_user(dir: &Path) -> ServiceResult<()> {
    match std::os::unix::fs::chown(dir, Some(SANDBOX_UID), Some(SANDBOX_UID)) {
        Err(e) if e.kind() != std::io::ErrorKind::PermissionDenied => {
            Err(io_error("give the volume to the sandbox user", e))
        }
        _ => Ok(()),
    }
}

fn io_error(what: &str, e: std::io::Error) -> ServiceError {
    ServiceError::internal(format!("{what}: {e}"))
}

/// The bytes of the files under `dir` (symbolic links not followed).
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}
