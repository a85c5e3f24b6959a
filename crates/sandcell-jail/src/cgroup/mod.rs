//! Sandbox cgroups: one cgroup per sandbox under a parent such as `sandcell`, on cgroup v1
//! (one directory per controller hierarchy) or cgroup v2 (one directory).
//!
//! The launcher creates the cgroup, applies the limits, joins it before cloning the sandbox
//! and removes it afterwards; the host re-opens it from [`SandboxCgroup::paths`] to read
//! counters and to kill everything. Only plain file I/O on cgroupfs is used.

pub mod spares;
mod v1;
mod v2;

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sandcell_protocol::{Feature, FeatureState};
use serde::{Deserialize, Serialize};

use crate::config::Limits;
use crate::error::JailError;

/// The parent directory [`detect`] probes for write access when it already exists.
const PROBE_PARENT: &str = "sandcell";
/// The CFS period used for cpu quotas, in microseconds (the kernel default).
const CPU_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts, in microseconds.
const CPU_MIN_QUOTA_US: u64 = 1_000;
/// How long [`SandboxCgroup::remove`] keeps retrying while dying tasks keep a cgroup busy.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long [`SandboxCgroup::kill_all`] keeps killing before it gives up.
const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a freeze may take before we kill without it (measured: 0.1–7 ms).
const FREEZE_TIMEOUT: Duration = Duration::from_millis(200);

/// Which cgroup interface a sandbox cgroup uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupVersion {
    /// Legacy hierarchies, one mount per controller (or group of controllers).
    V1,
    /// The unified hierarchy.
    V2,
}

/// What [`detect`] found under a cgroup root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupSupport {
    /// The usable cgroup version, if any.
    pub version: Option<CgroupVersion>,
    /// The root that was examined (normally `/sys/fs/cgroup`).
    pub root: PathBuf,
    /// Available controllers (v2: `cgroup.controllers`; v1: the ones Sandcell uses).
    pub controllers: Vec<String>,
    /// Whether a cgroup directory could be created (probed with mkdir + rmdir).
    pub writable: bool,
    /// Why `version` is `None` or `writable` is false.
    pub reason: Option<String>,
}

/// Resource counters of a sandbox cgroup; missing files read as 0 or `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Processes killed by the OOM killer for this cgroup.
    pub oom_kills: u64,
    /// Forks refused because `pids.max` was reached.
    pub pids_limit_hits: u64,
    /// Memory in use, in bytes.
    pub memory_bytes: Option<u64>,
    /// Highest memory use seen, in bytes.
    pub memory_peak_bytes: Option<u64>,
    /// CPU time used, in microseconds.
    pub cpu_usage_us: Option<u64>,
    /// Processes and threads in the cgroup.
    pub pids_current: Option<u64>,
}

/// One cgroup directory of a sandbox: the v2 directory, or one v1 hierarchy's directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Dir {
    path: PathBuf,
    /// The controllers this directory serves (v1) or has enabled (v2).
    controllers: Vec<String>,
    /// The hierarchy's mount point (v1) or the v2 root.
    hierarchy: PathBuf,
    /// The cgroup the creating process was in, where [`SandboxCgroup::leave`] sends
    /// processes back to; `None` for a re-opened cgroup.
    origin: Option<PathBuf>,
}

/// A sandbox's cgroup: one directory per v1 hierarchy, or one v2 directory.
#[derive(Debug, Serialize, Deserialize)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    paths: Vec<PathBuf>,
    dirs: Vec<Dir>,
    /// v2 controllers that could not be enabled, with the reason (for the report).
    #[serde(default)]
    missing: Vec<(String, String)>,
}

/// The cgroup layout found under a root, before probing for write access.
enum Layout {
    V1(Vec<v1::Hierarchy>),
    V2(Vec<String>),
}

/// Finds the cgroup version and controllers under `root` and probes (by creating and removing
/// a uniquely named directory) whether Sandcell could create cgroups there.
pub fn detect(root: &Path) -> CgroupSupport {
    let mut support = CgroupSupport {
        version: None,
        root: root.to_path_buf(),
        controllers: Vec::new(),
        writable: false,
        reason: None,
    };
    let (version, controllers, hierarchies) = match layout(root) {
        Ok(Layout::V2(controllers)) => (CgroupVersion::V2, controllers, vec![root.to_path_buf()]),
        Ok(Layout::V1(hs)) => {
            let controllers = hs
                .iter()
                .flat_map(|h| h.controllers.iter().cloned())
                .collect();
            (
                CgroupVersion::V1,
                controllers,
                hs.into_iter().map(|h| h.mount).collect(),
            )
        }
        Err(reason) => {
            support.reason = Some(reason);
            return support;
        }
    };
    support.version = Some(version);
    support.controllers = controllers;
    let name = version_name(version);
    for hierarchy in hierarchies {
        // Probe where sandbox cgroups would go when that parent exists (it may be delegated
        // to us while the hierarchy root is not); otherwise the root, where we would create it.
        let parent = hierarchy.join(PROBE_PARENT);
        let dir = if parent.is_dir() { parent } else { hierarchy };
        if let Err(e) = probe_mkdir(&dir) {
            support.reason = Some(format!(
                "cgroup {name} at {} but {} is not writable: {}",
                root.display(),
                dir.display(),
                describe(&e)
            ));
            return support;
        }
    }
    support.writable = true;
    support
}

/// Reads the number after `key` in a flat keyed file (`"key value"` per line).
pub fn parse_flat_keyed(contents: &str, key: &str) -> Option<u64> {
    contents.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next() != Some(key) {
            return None;
        }
        words.next()?.parse().ok()
    })
}

impl SandboxCgroup {
    /// Creates `<hierarchy>/<parent>/<id>` (parent like "sandcell", created when missing) and applies the limits; returns the lines for the isolation report.
    pub fn create(
        root: &Path,
        parent: &str,
        id: &str,
        limits: &Limits,
    ) -> Result<(Self, Vec<Feature>), JailError> {
        let cg = Self::make(root, parent, id, limits.cpu_millis.is_some())?;
        match cg.limit(limits) {
            Ok(features) => Ok((cg, features)),
            Err(e) => {
                rollback(&cg.dirs);
                Err(e)
            }
        }
    }

    /// Creates `<hierarchy>/<parent>/<id>` with the controllers enabled but no limits yet
    /// (see [`Self::limit`]); on v1, the cpu hierarchy only `with_cpu`.
    pub fn make(root: &Path, parent: &str, id: &str, with_cpu: bool) -> Result<Self, JailError> {
        let parent = parent_components(parent)?;
        check_id(id)?;
        let (version, dirs, missing) = match layout(root) {
            Ok(Layout::V1(hs)) => (
                CgroupVersion::V1,
                v1::make(&hs, &parent, id, with_cpu)?,
                Vec::new(),
            ),
            Ok(Layout::V2(controllers)) => {
                let (dir, missing) = v2::make(root, &controllers, &parent, id)?;
                (CgroupVersion::V2, vec![dir], missing)
            }
            Err(reason) => return Err(cg_err(root, reason)),
        };
        let paths = dirs.iter().map(|d| d.path.clone()).collect();
        Ok(Self {
            version,
            paths,
            dirs,
            missing,
        })
    }

    /// Applies the limits; returns the lines for the isolation report.
    pub fn limit(&self, limits: &Limits) -> Result<Vec<Feature>, JailError> {
        let mut features = match self.version {
            CgroupVersion::V1 => v1::apply(&self.dirs, limits)?,
            CgroupVersion::V2 => v2::apply(&self.dirs[0], &self.missing, limits)?,
        };
        features.insert(
            0,
            feature(
                "cgroups",
                FeatureState::Active,
                location(self.version, &self.dirs),
            ),
        );
        Ok(features)
    }

    /// Whether this cgroup has a directory serving `controller`.
    pub fn has_controller(&self, controller: &str) -> bool {
        self.dir_for(controller).is_some()
    }

    /// Renames the directories to `id` where the kernel allows it (v1 only); keeps the old
    /// names otherwise. For cgroups made ahead of time under another name.
    pub fn rename(&mut self, id: &str) {
        if self.version != CgroupVersion::V1 || check_id(id).is_err() {
            return;
        }
        for dir in &mut self.dirs {
            let Some(parent) = dir.path.parent() else {
                continue;
            };
            let to = parent.join(id);
            if fs::rename(&dir.path, &to).is_ok() {
                dir.path = to;
            }
        }
        self.paths = self.dirs.iter().map(|d| d.path.clone()).collect();
    }

    /// `--cgroup-root` arguments that make CRIU restore processes into this cgroup:
    /// `controllers:/path` per v1 hierarchy, `/path` on v2.
    pub fn criu_roots(&self) -> Vec<String> {
        self.dirs
            .iter()
            .filter_map(|d| {
                let rel = d.path.strip_prefix(&d.hierarchy).ok()?;
                let rel = format!("/{}", rel.display());
                Some(match self.version {
                    CgroupVersion::V1 => format!("{}:{rel}", d.controllers.join(",")),
                    CgroupVersion::V2 => rel,
                })
            })
            .collect()
    }

    /// This cgroup as JSON, for [`Self::from_record`] in another process.
    pub fn record(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// The cgroup another process described with [`Self::record`], checked without touching
    /// the filesystem: absolute paths, each strictly below its hierarchy (a hierarchy root
    /// here would make [`Self::kill_all`] kill a whole hierarchy's processes).
    pub fn from_record(record: serde_json::Value) -> Result<Self, JailError> {
        let mut cg: Self = serde_json::from_value(record)
            .map_err(|e| JailError::Config(format!("unreadable cgroup record: {e}")))?;
        if cg.dirs.is_empty() || cg.dirs.len() != cg.paths.len() {
            return Err(JailError::Config(
                "a cgroup record without directories".into(),
            ));
        }
        for (dir, path) in cg.dirs.iter_mut().zip(&cg.paths) {
            let below = dir.path.is_absolute()
                && dir.path != dir.hierarchy
                && dir.path.starts_with(&dir.hierarchy);
            if !below || *path != dir.path {
                return Err(cg_err(&dir.path, "not a cgroup below its hierarchy"));
            }
            // Where the recording process was is nothing to this one.
            dir.origin = None;
        }
        Ok(cg)
    }

    /// Re-opens an existing sandbox cgroup from the paths `paths()` returned (host side).
    pub fn open(paths: &[PathBuf]) -> Result<Self, JailError> {
        if paths.is_empty() {
            return Err(JailError::Config("no cgroup paths to open".into()));
        }
        for p in paths {
            if !p.is_absolute() {
                return Err(cg_err(p, "cgroup path is not absolute"));
            }
            if !p.is_dir() {
                return Err(cg_err(p, "no such cgroup directory"));
            }
            // A wrong path here would make kill_all() kill a whole hierarchy's processes.
            if is_hierarchy_root(p) {
                return Err(cg_err(
                    p,
                    "refusing a cgroup hierarchy root as a sandbox cgroup",
                ));
            }
        }
        // Every v1 cgroup has a `tasks` file; v2 has none.
        let v1_count = paths.iter().filter(|p| p.join("tasks").exists()).count();
        let (version, dirs) = if v1_count == paths.len() {
            let dirs = paths
                .iter()
                .map(|p| Dir {
                    path: p.clone(),
                    controllers: v1::controllers_in(p),
                    hierarchy: hierarchy_root(p),
                    origin: None,
                })
                .collect();
            (CgroupVersion::V1, dirs)
        } else if v1_count == 0 && paths.len() == 1 {
            let path = paths[0].clone();
            let controllers = read_words(&path.join("cgroup.controllers"));
            let hierarchy = hierarchy_root(&path);
            (
                CgroupVersion::V2,
                vec![Dir {
                    path,
                    controllers,
                    hierarchy,
                    origin: None,
                }],
            )
        } else {
            return Err(cg_err(
                &paths[0],
                format!(
                    "not one sandbox cgroup: {} v1 and {} other directories",
                    v1_count,
                    paths.len() - v1_count
                ),
            ));
        };
        Ok(Self {
            version,
            paths: paths.to_vec(),
            dirs,
            missing: Vec::new(),
        })
    }

    /// Which cgroup version this cgroup uses.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The cgroup directories (one per v1 hierarchy, or the v2 directory).
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Moves a process (and, for v1, writes cgroup.procs in each controller dir).
    pub fn join(&self, pid: u32) -> Result<(), JailError> {
        for dir in &self.dirs {
            move_pid(&dir.path, pid)?;
        }
        Ok(())
    }

    /// Moves a process out of this cgroup, back to the cgroup the creating process was in
    /// (or, for a re-opened cgroup, the hierarchy root); directories it is not in are skipped.
    pub fn leave(&self, pid: u32) -> Result<(), JailError> {
        for dir in &self.dirs {
            if !read_procs(&dir.path).contains(&pid) {
                continue;
            }
            let target = dir.origin.as_ref().unwrap_or(&dir.hierarchy);
            move_pid(target, pid)?;
        }
        Ok(())
    }

    /// Opens what a process needs to move *itself* into this cgroup later ([`join_self`]):
    /// v1 only. Opened by the (privileged) caller, the files carry its credentials, so a
    /// child that inherits them can use them from inside its own user namespace.
    /// `None` on v2 (use [`Self::join`]).
    pub fn self_join_files(&self) -> Option<Vec<fs::File>> {
        if self.version != CgroupVersion::V1 {
            return None;
        }
        self.dirs
            .iter()
            .map(|d| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(d.path.join("tasks"))
                    .ok()
            })
            .collect()
    }

    /// Current counters, best effort: missing files read as 0 or `None`.
    pub fn counters(&self) -> Counters {
        match self.version {
            CgroupVersion::V1 => v1::counters(self),
            CgroupVersion::V2 => v2::counters(self),
        }
    }

    /// Only what explains an exec's death and the memory in use (three file reads): the
    /// other fields are `None`.
    pub fn limit_counters(&self) -> Counters {
        let (oom_file, usage_file) = match self.version {
            CgroupVersion::V1 => ("memory.oom_control", "memory.usage_in_bytes"),
            CgroupVersion::V2 => ("memory.events", "memory.current"),
        };
        Counters {
            oom_kills: self.read_keyed("memory", oom_file, "oom_kill").unwrap_or(0),
            pids_limit_hits: self.read_keyed("pids", "pids.events", "max").unwrap_or(0),
            memory_bytes: self.read_value("memory", usage_file),
            ..Counters::default()
        }
    }

    /// Processes the OOM killer killed in this cgroup (one file read).
    pub fn oom_kills(&self) -> u64 {
        let file = match self.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        self.read_keyed("memory", file, "oom_kill").unwrap_or(0)
    }

    /// Forks refused because `pids.max` was reached (one file read).
    pub fn pids_limit_hits(&self) -> u64 {
        self.read_keyed("pids", "pids.events", "max").unwrap_or(0)
    }

    /// Pids of every process in the cgroup.
    pub fn pids(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self.dirs.iter().flat_map(|d| read_procs(&d.path)).collect();
        set.into_iter().collect()
    }

    /// SIGKILLs every process (v2: cgroup.kill when present; else freeze where possible and kill the listed pids until empty, bounded retries).
    ///
    /// The calling process is never killed or frozen: if it is inside, it first moves itself
    /// out with [`SandboxCgroup::leave`].
    pub fn kill_all(&self) -> Result<(), JailError> {
        self.leave(std::process::id())?;
        if self.version == CgroupVersion::V2 && v2::kill_switch(&self.dirs[0].path)? {
            return self.until_empty(Duration::from_millis(5), |_| {});
        }
        // Killed tasks leave the list within a few milliseconds; poll rather than wait long.
        self.until_empty(Duration::from_millis(2), |pids| {
            // Frozen tasks cannot fork a replacement between our reading the list and the
            // kill; SIGKILL stays pending and takes effect when they are thawed.
            let frozen = match self.version {
                CgroupVersion::V1 => v1::freeze(self),
                CgroupVersion::V2 => v2::freeze(&self.dirs[0].path),
            };
            for pid in pids {
                sigkill(*pid);
            }
            if frozen {
                match self.version {
                    CgroupVersion::V1 => v1::thaw(self),
                    CgroupVersion::V2 => v2::thaw(&self.dirs[0].path),
                }
            }
        })
    }

    /// Pauses every process: frozen, they use no CPU and keep their memory. Waits up to
    /// `limit` for the last task to stop; when that fails (a task in uninterruptible sleep)
    /// the cgroup is thawed again and the error says so.
    pub fn pause(&self, limit: Duration) -> Result<(), JailError> {
        let froze = match self.version {
            CgroupVersion::V1 => v1::freeze_within(self, limit),
            CgroupVersion::V2 => v2::freeze_within(&self.dirs[0].path, limit),
        };
        match froze {
            Some(true) => Ok(()),
            Some(false) => {
                self.resume();
                Err(JailError::Cgroup {
                    path: self.dirs[0].path.clone(),
                    message: format!(
                        "not every process stopped within {} ms (one in uninterruptible sleep?); left running",
                        limit.as_millis()
                    ),
                })
            }
            None => Err(JailError::Unsupported(match self.version {
                CgroupVersion::V1 => {
                    "the sandbox is in no freezer cgroup (no freezer hierarchy is mounted)".into()
                }
                CgroupVersion::V2 => {
                    "cgroup.freeze is missing (Linux 5.2 or newer freezes cgroups)".into()
                }
            })),
        }
    }

    /// Lets every process run again.
    pub fn resume(&self) {
        match self.version {
            CgroupVersion::V1 => v1::thaw(self),
            CgroupVersion::V2 => v2::thaw(&self.dirs[0].path),
        }
    }

    /// Whether the cgroup is frozen (`None` when it cannot be).
    pub fn paused(&self) -> Option<bool> {
        match self.version {
            CgroupVersion::V1 => v1::frozen(self),
            CgroupVersion::V2 => v2::frozen(&self.dirs[0].path),
        }
    }

    /// Removes the directories, retrying briefly (up to ~1 s) while dying tasks keep them busy.
    ///
    /// The calling process first moves itself out if it is inside.
    pub fn remove(&self) -> Result<(), JailError> {
        self.leave(std::process::id())?;
        let mut first = None;
        for dir in &self.dirs {
            if let Err(e) = remove_tree(&dir.path) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The directory serving `controller` (v2: the one directory).
    fn dir_for(&self, controller: &str) -> Option<&Path> {
        match self.version {
            CgroupVersion::V2 => self.dirs.first().map(|d| d.path.as_path()),
            CgroupVersion::V1 => self
                .dirs
                .iter()
                .find(|d| d.controllers.iter().any(|c| c == controller))
                .map(|d| d.path.as_path()),
        }
    }

    /// Reads a number from a controller's file.
    fn read_value(&self, controller: &str, file: &str) -> Option<u64> {
        read_u64(&self.dir_for(controller)?.join(file))
    }

    /// Reads `key` from a controller's flat keyed file.
    fn read_keyed(&self, controller: &str, file: &str, key: &str) -> Option<u64> {
        let text = fs::read_to_string(self.dir_for(controller)?.join(file)).ok()?;
        parse_flat_keyed(&text, key)
    }

    /// Runs `each_round` on the listed pids every `poll` until the cgroup is empty, giving
    /// up after [`KILL_TIMEOUT`].
    fn until_empty(
        &self,
        poll: Duration,
        mut each_round: impl FnMut(&[u32]),
    ) -> Result<(), JailError> {
        let deadline = Instant::now() + KILL_TIMEOUT;
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.still_populated(&pids));
            }
            each_round(&pids);
            sleep(poll);
        }
    }

    fn still_populated(&self, pids: &[u32]) -> JailError {
        cg_err(
            &self.paths[0],
            format!("processes still present after SIGKILL: {pids:?}"),
        )
    }
}

/// Finds the cgroup layout under `root`, or says why there is none.
fn layout(root: &Path) -> Result<Layout, String> {
    let controllers_file = root.join("cgroup.controllers");
    if controllers_file.exists() {
        let controllers = read_words(&controllers_file);
        if controllers.iter().any(|c| c == "memory" || c == "pids") {
            return Ok(Layout::V2(controllers));
        }
        // A v2 root without them: maybe they are bound to v1 hierarchies below.
        let hs = v1::discover(root);
        if hs.is_empty() {
            return Err(format!(
                "cgroup v2 at {} offers neither the memory nor the pids controller (cgroup.controllers: {:?})",
                root.display(),
                controllers.join(" ")
            ));
        }
        return Ok(Layout::V1(hs));
    }
    let hs = v1::discover(root);
    if hs
        .iter()
        .any(|h| h.controllers.iter().any(|c| v1::CORE.contains(&c.as_str())))
    {
        return Ok(Layout::V1(hs));
    }
    Err(format!(
        "no cgroup hierarchy at {}: no cgroup.controllers (v2) and no memory, pids or cpu hierarchy (v1)",
        root.display()
    ))
}

fn version_name(v: CgroupVersion) -> &'static str {
    match v {
        CgroupVersion::V1 => "v1",
        CgroupVersion::V2 => "v2",
    }
}

/// The `cgroups` report detail: `v1 at /sys/fs/cgroup/{memory,pids}/sandcell/<id>`.
fn location(version: CgroupVersion, dirs: &[Dir]) -> String {
    let name = version_name(version);
    if version == CgroupVersion::V2 || dirs.len() < 2 {
        let list: Vec<String> = dirs.iter().map(|d| d.path.display().to_string()).collect();
        let controllers = dirs
            .first()
            .map(|d| d.controllers.join(", "))
            .unwrap_or_default();
        return format!("{name} at {} ({controllers})", list.join(", "));
    }
    // v1 paths differ only in the hierarchy name when the mounts are siblings.
    let split: Vec<(PathBuf, String, PathBuf)> = dirs
        .iter()
        .filter_map(|d| {
            let rel = d.path.strip_prefix(&d.hierarchy).ok()?;
            let base = d.hierarchy.parent()?.to_path_buf();
            let name = d.hierarchy.file_name()?.to_string_lossy().into_owned();
            Some((base, name, rel.to_path_buf()))
        })
        .collect();
    let same = split.len() == dirs.len()
        && split
            .iter()
            .all(|(b, _, r)| *b == split[0].0 && *r == split[0].2);
    if same {
        let names: Vec<&str> = split.iter().map(|(_, h, _)| h.as_str()).collect();
        format!(
            "{name} at {}/{{{}}}/{}",
            split[0].0.display(),
            names.join(","),
            split[0].2.display()
        )
    } else {
        let list: Vec<String> = dirs.iter().map(|d| d.path.display().to_string()).collect();
        format!("{name} at {}", list.join(", "))
    }
}

/// Splits and checks a parent path such as `sandcell` or `a/b` (empty: the hierarchy root).
fn parent_components(parent: &str) -> Result<Vec<String>, JailError> {
    let mut out = Vec::new();
    for c in Path::new(parent.trim_matches('/')).components() {
        match c {
            Component::Normal(s) => out.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            _ => {
                return Err(JailError::Config(format!(
                    "cgroup parent {parent:?} must be a relative path without '..'"
                )));
            }
        }
    }
    Ok(out)
}

/// A sandbox id becomes one directory name.
fn check_id(id: &str) -> Result<(), JailError> {
    if id.is_empty() || id == "." || id == ".." || id.contains(['/', '\0', '\n']) {
        return Err(JailError::Config(format!("{id:?} cannot name a cgroup")));
    }
    Ok(())
}

fn feature(name: &str, state: FeatureState, detail: impl Into<String>) -> Feature {
    Feature {
        name: name.to_string(),
        state,
        detail: detail.into(),
    }
}

fn cg_err(path: &Path, message: impl Into<String>) -> JailError {
    JailError::Cgroup {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// An io error as lowercase text ("permission denied (os error 13)").
fn describe(e: &io::Error) -> String {
    let text = e.to_string();
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

/// Why a cgroup file could not be written.
enum WriteFailure {
    /// The interface file does not exist (controller or feature absent).
    Missing,
    /// It exists but the write failed.
    Failed(io::Error),
}

/// Writes `value` in one write. `create` is harmless on cgroupfs (the files already exist;
/// kernfs refuses new ones) and lets a plain directory tree stand in for one in tests.
fn try_write(path: &Path, value: &str) -> Result<(), WriteFailure> {
    let result = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()));
    match result {
        Ok(()) => Ok(()),
        // kernfs answers a create attempt with EACCES, so check what is really there.
        Err(_) if !path.exists() => Err(WriteFailure::Missing),
        Err(e) => Err(WriteFailure::Failed(e)),
    }
}

/// Writes `value` to a cgroup file that must exist.
fn write_file(path: &Path, value: &str) -> Result<(), JailError> {
    try_write(path, value).map_err(|f| write_error(path, value, f))
}

fn write_error(path: &Path, value: &str, failure: WriteFailure) -> JailError {
    match failure {
        WriteFailure::Missing => cg_err(path, "interface file is missing"),
        WriteFailure::Failed(e) => cg_err(path, format!("write {value:?}: {}", describe(&e))),
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read_words(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The pids in a cgroup directory's `cgroup.procs`.
fn read_procs(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn move_pid(dir: &Path, pid: u32) -> Result<(), JailError> {
    let procs = dir.join("cgroup.procs");
    try_write(&procs, &pid.to_string()).map_err(|f| match f {
        WriteFailure::Missing => cg_err(&procs, "interface file is missing"),
        WriteFailure::Failed(e) => {
            cg_err(&procs, format!("cannot move pid {pid}: {}", describe(&e)))
        }
    })
}

/// SIGKILLs one process; pids that could address a group or everything are never signalled.
fn sigkill(pid: u32) {
    let Ok(raw) = i32::try_from(pid) else { return };
    if raw <= 1 || pid == std::process::id() {
        return;
    }
    // ESRCH: it already died, which is the point.
    let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
}

/// The top of the hierarchy `dir` is in: the highest ancestor on the same filesystem.
fn hierarchy_root(dir: &Path) -> PathBuf {
    let Ok(dev) = fs::metadata(dir).map(|m| m.dev()) else {
        return dir.to_path_buf();
    };
    let mut top = dir;
    while let Some(parent) = top.parent() {
        match fs::metadata(parent) {
            Ok(m) if m.dev() == dev => top = parent,
            _ => break,
        }
    }
    top.to_path_buf()
}

/// Whether `dir` is a mount point (a hierarchy root) rather than a cgroup below one.
fn is_hierarchy_root(dir: &Path) -> bool {
    let (Ok(own), Some(parent)) = (fs::metadata(dir), dir.parent()) else {
        return true;
    };
    fs::metadata(parent).map_or(true, |p| p.dev() != own.dev())
}

/// Creates a cgroup directory; an existing one is an error, never silently shared.
fn mkdir_new(dir: &Path) -> Result<(), JailError> {
    fs::create_dir(dir).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            cg_err(
                dir,
                "already exists (another sandbox with this id, or a leftover)",
            )
        } else {
            cg_err(dir, format!("mkdir: {}", describe(&e)))
        }
    })
}

/// Creates a parent cgroup directory (and its parents) unless it exists.
fn mkdir_parent(dir: &Path) -> Result<(), JailError> {
    fs::create_dir_all(dir).map_err(|e| cg_err(dir, format!("mkdir: {}", describe(&e))))
}

/// Tries mkdir + rmdir of a uniquely named directory in `dir`.
fn probe_mkdir(dir: &Path) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let probe = dir.join(format!("sandcell-probe-{}-{n}", std::process::id()));
    fs::create_dir(&probe)?;
    fs::remove_dir(&probe)
}

/// Removes the directories made so far after a failed create.
fn rollback(dirs: &[Dir]) {
    for d in dirs {
        let _ = fs::remove_dir(&d.path);
    }
}

/// Removes a cgroup and any child cgroups, deepest first (a cgroup with children is busy).
fn remove_tree(dir: &Path) -> Result<(), JailError> {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path())?;
            }
        }
    }
    let deadline = Instant::now() + REMOVE_TIMEOUT;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // Tasks that were just killed still count until the kernel finishes exiting them.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(cg_err(dir, format!("rmdir: {}", describe(&e)))),
        }
    }
}

/// One cgroup mount from `/proc/self/mountinfo`.
struct CgroupMount {
    /// The cgroup path (in our cgroup namespace) that the mount shows at its top.
    root: String,
    mount_point: PathBuf,
    /// `cgroup` (v1) or `cgroup2`.
    fstype: String,
    /// Super options: for v1 these name the controllers.
    options: Vec<String>,
}

fn cgroup_mounts() -> Vec<CgroupMount> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(parse_mountinfo_line)
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .collect()
}

/// Parses `id parent dev root mount-point opts [optional…] - fstype source super-opts`.
fn parse_mountinfo_line(line: &str) -> Option<CgroupMount> {
    let (left, right) = line.split_once(" - ")?;
    let left: Vec<&str> = left.split(' ').collect();
    let mut right = right.split(' ');
    let fstype = right.next()?.to_string();
    let _source = right.next()?;
    let options = right
        .next()
        .unwrap_or("")
        .split(',')
        .map(str::to_string)
        .collect();
    Some(CgroupMount {
        root: unescape_mountinfo(left.get(3)?),
        mount_point: PathBuf::from(unescape_mountinfo(left.get(4)?)),
        fstype,
        options,
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The contents of `/proc/self/cgroup` (empty if unreadable).
fn own_cgroups() -> String {
    fs::read_to_string("/proc/self/cgroup").unwrap_or_default()
}

/// The cgroup directory the calling process is in on the hierarchy mounted at `mount`, whose
/// top shows the cgroup `mount_root`, told from `own` ([`own_cgroups`]). `controller` picks
/// the v1 line; `None` picks the v2 line.
fn own_cgroup_dir(
    own: &str,
    mount: &Path,
    mount_root: &str,
    controller: Option<&str>,
) -> Option<PathBuf> {
    let path = own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match controller {
            Some(c) => controllers.split(',').any(|x| x == c),
            None => id == "0" && controllers.is_empty(),
        };
        wanted.then_some(path)
    })?;
    let rel = Path::new(path).strip_prefix(mount_root).ok()?;
    let dir = mount.join(rel);
    dir.is_dir().then_some(dir)
}

/// The quota for `millis` thousandths of a CPU, raised to the kernel's minimum.
fn cpu_quota_us(millis: u64) -> (u64, bool) {
    let asked = millis.saturating_mul(CPU_PERIOD_US / 1000);
    (asked.max(CPU_MIN_QUOTA_US), asked < CPU_MIN_QUOTA_US)
}

/// `1500` → `"1.5"`.
fn cpus(millis: u64) -> String {
    let frac = format!("{:03}", millis % 1000);
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() {
        format!("{}", millis / 1000)
    } else {
        format!("{}.{frac}", millis / 1000)
    }
}

/// Moves the calling thread into the cgroups behind `files` (from
/// [`SandboxCgroup::self_join_files`]); call it while the process has one thread, so the whole
/// process moves. Writing "0" (the caller) to v1 `tasks` skips the kernel's global threadgroup
/// lock, whose writers wait for an RCU grace period (~6–10 ms on a slow VM); writing a pid to
/// `cgroup.procs` takes it.
pub fn join_self(files: Vec<fs::File>) -> Result<(), JailError> {
    use std::io::Write;
    for mut file in files {
        // A kernel refusing "0" still takes our pid (the slow, locked way).
        let moved = file
            .write_all(b"0")
            .or_else(|_| file.write_all(std::process::id().to_string().as_bytes()));
        moved.map_err(|e| JailError::Cgroup {
            path: PathBuf::from("tasks"),
            message: format!("move self into the sandbox cgroup: {}", describe(&e)),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_keyed() {
        let text = "oom 2\noom_kill 3\nmax 7\n";
        assert_eq!(parse_flat_keyed(text, "oom_kill"), Some(3));
        assert_eq!(parse_flat_keyed(text, "oom"), Some(2));
        assert_eq!(parse_flat_keyed(text, "missing"), None);
        assert_eq!(parse_flat_keyed("max max\n", "max"), None);
    }

    #[test]
    fn mountinfo_line() {
        let line =
            "32 31 0:29 / /sys/fs/cgroup/cpu\\040x rw,relatime - cgroup cgroup rw,cpu,cpuacct";
        let m = parse_mountinfo_line(line).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/sys/fs/cgroup/cpu x"));
        assert_eq!(m.root, "/");
        assert_eq!(m.fstype, "cgroup");
        assert!(m.options.iter().any(|o| o == "cpuacct"));
    }

    #[test]
    fn names() {
        assert!(parent_components("../x").is_err());
        assert_eq!(parent_components("/a/b/").unwrap(), vec!["a", "b"]);
        assert!(parent_components("").unwrap().is_empty());
        assert!(check_id("a/b").is_err());
        assert!(check_id("..").is_err());
        assert!(check_id("sb-1").is_ok());
    }

    #[test]
    fn cpu_numbers() {
        assert_eq!(cpu_quota_us(1500), (150_000, false));
        assert_eq!(cpu_quota_us(5), (1_000, true));
        assert_eq!(cpus(1500), "1.5");
        assert_eq!(cpus(2000), "2");
        assert_eq!(cpus(250), "0.25");
    }
}
