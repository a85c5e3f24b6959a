//! Snapshots: a sandbox's carried folders (and, where kernels can, their state) written to
//! a folder on the host with checksums, and restored into a fresh sandbox.
//!
//! The sandbox is paused while its files are read, so the archive is one instant of it.
//! Every snapshot says its fidelity (`files` here; `language` once kernel state is carried;
//! `process` on backends that checkpoint whole processes) and what it did not carry.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use sandcell_protocol::code::{FailedVariable, SkippedVariable};
use sandcell_protocol::{GuestMessage, HostMessage, Language};

use crate::backend::Fidelity;
use crate::error::EngineError;
use crate::sandbox::{Sandbox, unexpected};

/// The folders of a sandbox a snapshot carries (absolute, inside it): every writable folder
/// it has, which are the file API's roots, since a restore writes through that API. Not
/// `/dev/shm`: its content is processes' shared memory, meaningless without the processes
/// (only a process checkpoint carries those, and it carries `/dev/shm` with them).
pub const CARRIED_DIRS: &[&str] = sandcell_protocol::FILE_ROOTS;

/// Where kernels write their state during a snapshot (relative to the sandbox's root); it
/// travels in the archive (inside the carried `/tmp`) and is removed after.
pub const STATE_DIR: &str = "tmp/.sandcell-state";

/// The carried folders relative to the sandbox's root, as archives name them (`tmp`).
/// Snapshots from before `/tmp` was carried hold [`STATE_DIR`] only there: it is under one.
pub fn archived_dirs() -> Vec<&'static str> {
    CARRIED_DIRS
        .iter()
        .map(|d| d.trim_start_matches('/'))
        .collect()
}

/// The archive of the carried folders, in a snapshot's folder.
pub const FILES_ARCHIVE: &str = "files.tar";

/// The archive of a process checkpoint (the backend's image folder), in a snapshot's folder.
pub const CHECKPOINT_ARCHIVE: &str = "checkpoint.tar";

/// The manifest's format; a different one is refused rather than misread.
pub const MANIFEST_FORMAT: u32 = 1;

/// What a capture of the carried folders took.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesCapture {
    /// Regular files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// What was not carried, and why.
    pub skipped: Vec<String>,
}

/// What a restore of the carried folders wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesRestore {
    /// Regular files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// What was not restored, and why.
    pub skipped: Vec<String>,
}

impl SnapshotManifest {
    /// Its fidelity as the enum (`None` for a name this engine does not know).
    pub fn fidelity_kind(&self) -> Option<Fidelity> {
        Fidelity::parse(&self.fidelity)
    }
}

/// What a snapshot holds, with checksums; kept beside it and in its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotManifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// `files`, `language` or `process` (see [`Self::fidelity_kind`]).
    pub fidelity: String,
    /// The archive's file name in the snapshot's folder.
    pub archive: String,
    /// SHA-256 of the archive (hex).
    pub sha256: String,
    /// Bytes of the archive.
    pub archive_bytes: u64,
    /// What the archive holds.
    pub files: FilesCapture,
    /// The kernels whose state it carries (language fidelity).
    #[serde(default)]
    pub kernels: Vec<KernelState>,
    /// What a snapshot of this fidelity never carries.
    pub not_carried: Vec<String>,
}

/// One kernel's state in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelState {
    /// Its context.
    pub context: String,
    /// Its language.
    pub language: Language,
    /// Its state file in the sandbox (under [`STATE_DIR`]).
    pub path: String,
    /// Variables carried.
    pub saved: Vec<String>,
    /// Variables left out, and why.
    pub skipped: Vec<SkippedVariable>,
}

/// One kernel brought back by a restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRestore {
    /// Its context.
    pub context: String,
    /// Its language.
    pub language: Language,
    /// Variables restored.
    pub restored: Vec<String>,
    /// Variables that could not be, and why.
    pub failed: Vec<FailedVariable>,
    /// Variables the snapshot had left out.
    pub skipped: Vec<SkippedVariable>,
}

/// What a restore brought back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreReport {
    /// The snapshot's fidelity.
    pub fidelity: String,
    /// The files written.
    pub files: FilesRestore,
    /// The kernels restored, variable by variable.
    pub kernels: Vec<KernelRestore>,
    /// What the snapshot did not carry.
    pub not_carried: Vec<String>,
}

/// What a snapshot without process checkpoints leaves behind.
fn fidelity_gaps(language: bool) -> Vec<String> {
    vec![
        if language {
            "processes: kernels come back from their variables (language fidelity: see each \
             kernel's skipped list); other processes are not restarted"
                .into()
        } else {
            "running processes and kernels: their memory is not carried (files fidelity); \
             code runs again in fresh kernels"
                .into()
        },
        format!(
            "everything outside {} (/dev/shm included: processes' shared memory)",
            CARRIED_DIRS.join(", ")
        ),
    ]
}

/// What a process checkpoint leaves behind.
fn checkpoint_gaps() -> Vec<String> {
    vec![
        "connections to the host: the agent is reached again on a new one; a download or \
         attachment in progress at the snapshot does not continue"
            .into(),
    ]
}

/// A writer that hashes and counts what passes through (and, with `early`, has it synced
/// as it goes).
struct Hashing<W> {
    inner: W,
    sha: Sha256,
    bytes: u64,
    early: Option<EarlySync>,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.bytes += n as u64;
        if let Some(early) = &self.early {
            early.request();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Syncs a file's data on a thread of its own while the file is still being written, so
/// that the sync that makes it durable finds most of it on the disk already: the disk's
/// work overlaps the archive's (on a virtual disk a sync costs about its bytes, whenever
/// they were written). A request made while one waits to start joins it.
struct EarlySync {
    requests: Option<mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
}

impl EarlySync {
    fn start(file: &std::fs::File) -> io::Result<Self> {
        let file = file.try_clone()?;
        let (requests, asked) = mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("snapshot-sync".into())
            .spawn(move || {
                for () in asked {
                    file.sync_data()?;
                }
                Ok(())
            })?;
        Ok(Self {
            requests: Some(requests),
            thread: Some(thread),
        })
    }

    /// Asks for a sync of what is written so far.
    fn request(&self) {
        if let Some(requests) = &self.requests {
            // Full: a sync is waiting to start, and takes this write with it. Gone: the
            // thread stopped on an error, which `finish` returns.
            let _ = requests.try_send(());
        }
    }

    /// Waits for the syncs asked for. An error of one is the file's: it is reported to one
    /// sync only (the file description is shared), so it must not be lost here.
    fn finish(mut self) -> io::Result<()> {
        drop(self.requests.take());
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| io::Error::other("the snapshot's sync thread panicked"))?,
            None => Ok(()),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 (hex) and length of a file.
fn digest_file(path: &Path) -> io::Result<(String, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sha.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hex(&sha.finalize()), total))
}

/// How long each part of [`Sandbox::snapshot_to_timed`] took. The archive is made durable
/// while the sandbox is resumed and its kernels' state files are removed: `sync` overlaps
/// `resume` and `cleanup`, and `sync_wait` is what was left of it to wait for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotTimings {
    /// The kernels writing their state (contexts listed, each kernel's dump).
    pub dump: Duration,
    /// Pausing the sandbox.
    pub pause: Duration,
    /// The carried folders read, archived and hashed: written, not yet durable.
    pub archive: Duration,
    /// Resuming the sandbox.
    pub resume: Duration,
    /// Removing the kernels' state files from the sandbox.
    pub cleanup: Duration,
    /// Making the archive durable: its data, its entry and its folder's entry.
    pub sync: Duration,
    /// The part of `sync` that `resume` and `cleanup` did not cover.
    pub sync_wait: Duration,
    /// The whole snapshot.
    pub total: Duration,
}

/// The archive's writes: whole buffers for the checksum and few system calls for the disk.
const WRITE_BUFFER: usize = 1 << 20;

/// An archive written, with its checksum.
struct Archived {
    files: FilesCapture,
    sha256: String,
    bytes: u64,
}

/// Writes the carried folders of the paused `sandbox` into a new archive at `path`, hashed
/// and synced as it is written; returns the file, written but not yet durable, and the
/// syncs still under way.
fn write_archive(
    sandbox: &Sandbox,
    path: &Path,
) -> Result<(std::fs::File, Archived, EarlySync), EngineError> {
    let io_err = |e| EngineError::io("write the snapshot archive", e);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| EngineError::io("create the snapshot archive", e))?;
    let early = EarlySync::start(&file).map_err(io_err)?;
    let mut out = io::BufWriter::with_capacity(
        WRITE_BUFFER,
        Hashing {
            inner: file,
            sha: Sha256::new(),
            bytes: 0,
            early: Some(early),
        },
    );
    let files = sandbox
        .backend_instance()
        .capture_files(&archived_dirs(), &mut out)?;
    let mut hashed = out.into_inner().map_err(|e| io_err(e.into_error()))?;
    let early = hashed
        .early
        .take()
        .expect("write_archive made its writer with an EarlySync");
    let archived = Archived {
        files,
        sha256: hex(&hashed.sha.finalize()),
        bytes: hashed.bytes,
    };
    Ok((hashed.inner, archived, early))
}

/// Makes a new file in `dir` durable: its data (and the size that reads it: fdatasync),
/// its entry in `dir`, and `dir`'s entry in its parent (a new file's data alone is not
/// found again after a crash without the entries that name it).
fn make_durable(file: &std::fs::File, dir: &Path) -> io::Result<()> {
    file.sync_data()?;
    std::fs::File::open(dir)?.sync_all()?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

impl Sandbox {
    /// Writes a snapshot of this sandbox into `dir` (which must exist and be empty): the
    /// kernels' state, then the carried folders as one archive read while the sandbox is
    /// paused (it runs again after, unless it was paused before, when it stays paused).
    /// The archive and its entry in `dir` (and `dir`'s in its parent) are on disk when this
    /// returns. Returns the manifest to keep with it.
    pub async fn snapshot_to(&self, dir: &Path) -> Result<SnapshotManifest, EngineError> {
        self.snapshot_to_timed(dir)
            .await
            .map(|(manifest, _)| manifest)
    }

    /// [`Self::snapshot_to`], with how long each of its parts took (for benchmarks).
    pub async fn snapshot_to_timed(
        &self,
        dir: &Path,
    ) -> Result<(SnapshotManifest, SnapshotTimings), EngineError> {
        let started = Instant::now();
        let mut t = SnapshotTimings::default();
        if self.backend_instance().checkpoints() {
            let manifest = self.checkpoint_to(dir).await?;
            t.total = started.elapsed();
            return Ok((manifest, t));
        }
        if !self.features().capture_files {
            return Err(EngineError::Unsupported(
                "this sandbox's backend cannot snapshot its files".into(),
            ));
        }
        let was_paused = self.is_paused();
        // A paused sandbox runs for the moment its kernels write their state, and is paused
        // again after.
        self.check_alive().await?;
        let mark = Instant::now();
        let (kernels, mut gaps) = self.dump_kernels().await?;
        t.dump = mark.elapsed();
        let mark = Instant::now();
        self.pause().await?;
        t.pause = mark.elapsed();
        let mark = Instant::now();
        let sandbox = self.clone();
        let path = dir.join(FILES_ARCHIVE);
        let written = tokio::task::spawn_blocking(move || write_archive(&sandbox, &path))
            .await
            .map_err(|e| EngineError::io("snapshot", io::Error::other(e)))
            .and_then(|r| r);
        t.archive = mark.elapsed();
        // The archive is read: the sandbox runs again while it is made durable.
        let (written, synced) = match written {
            Ok((file, archived, early)) => {
                let dir = dir.to_path_buf();
                let task = tokio::task::spawn_blocking(move || {
                    let mark = Instant::now();
                    early.finish()?;
                    make_durable(&file, &dir)?;
                    Ok::<_, io::Error>(mark.elapsed())
                });
                (Ok(archived), Some(task))
            }
            Err(e) => (Err(e), None),
        };
        let mark = Instant::now();
        // Running again whatever happened, unless it was paused before.
        let resumed = if was_paused {
            Ok(())
        } else {
            self.resume().await
        };
        t.resume = mark.elapsed();
        let mark = Instant::now();
        if !kernels.is_empty() {
            let _ = self.remove(&format!("/{STATE_DIR}"), true).await;
        }
        t.cleanup = mark.elapsed();
        let mark = Instant::now();
        // Durable before it is recorded: the caller records it once this returns.
        let synced = match synced {
            Some(task) => Some(
                task.await
                    .map_err(|e| EngineError::io("snapshot", io::Error::other(e)))?
                    .map_err(|e| EngineError::io("write the snapshot archive", e))?,
            ),
            None => None,
        };
        t.sync_wait = mark.elapsed();
        t.sync = synced.unwrap_or_default();
        resumed?;
        let Archived {
            files,
            sha256,
            bytes: archive_bytes,
        } = written?;
        let language = !kernels.is_empty();
        let mut not_carried = fidelity_gaps(language);
        not_carried.append(&mut gaps);
        t.total = started.elapsed();
        let manifest = SnapshotManifest {
            format: MANIFEST_FORMAT,
            fidelity: if language {
                Fidelity::Language
            } else {
                Fidelity::Files
            }
            .as_str()
            .into(),
            archive: FILES_ARCHIVE.into(),
            sha256,
            archive_bytes,
            files,
            kernels,
            not_carried,
        };
        Ok((manifest, t))
    }

    /// A process checkpoint of the whole sandbox (its backend's), archived with a checksum.
    async fn checkpoint_to(&self, dir: &Path) -> Result<SnapshotManifest, EngineError> {
        let was_paused = self.is_paused();
        self.check_alive().await?;
        let rehomes = self.features().checkpoint_rehomes;
        let image = dir.join("image");
        if rehomes {
            // The backend restores the sandbox in place: its old connection ends.
            self.client().expect_reconnect().await;
        }
        let checkpointed = match std::fs::create_dir(&image) {
            Ok(()) => self.backend_instance().checkpoint(&image).await,
            Err(e) => Err(EngineError::io("create the checkpoint folder", e)),
        };
        let archived = match &checkpointed {
            Ok(_) => {
                let (image, archive) = (image.clone(), dir.join(CHECKPOINT_ARCHIVE));
                tokio::task::spawn_blocking(move || archive_folder(&image, &archive).map(Some))
                    .await
                    .map_err(|e| EngineError::io("snapshot", io::Error::other(e)))
                    .and_then(|r| r)
            }
            Err(_) => Ok(None),
        };
        let removed = image.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(removed)).await;
        match checkpointed {
            Ok(Some(stream)) if rehomes => self.client().reconnect(stream).await,
            Ok(Some(_)) => {
                return Err(EngineError::Connection(
                    "the backend replaced the agent's connection, which it says it never does"
                        .into(),
                ));
            }
            // Checkpointed without touching the connection.
            Ok(None) => {
                if rehomes {
                    self.client().cancel_reconnect();
                }
            }
            Err(e) => {
                if rehomes {
                    self.client().cancel_reconnect();
                }
                return Err(e);
            }
        }
        if was_paused {
            self.pause().await?;
        }
        let Some((files, sha256, archive_bytes)) = archived? else {
            return Err(EngineError::io(
                "snapshot",
                io::Error::other("the checkpoint was not archived"),
            ));
        };
        Ok(SnapshotManifest {
            format: MANIFEST_FORMAT,
            fidelity: Fidelity::Process.as_str().into(),
            archive: CHECKPOINT_ARCHIVE.into(),
            sha256,
            archive_bytes,
            files,
            kernels: Vec::new(),
            not_carried: checkpoint_gaps(),
        })
    }

    /// Checks the snapshot in `dir` against its manifest (a changed or truncated archive is
    /// refused) and writes its files into this sandbox, which should be fresh.
    pub async fn restore_from(
        &self,
        dir: &Path,
        manifest: &SnapshotManifest,
    ) -> Result<RestoreReport, EngineError> {
        if manifest.fidelity == Fidelity::Process.as_str() {
            return Err(EngineError::InvalidRequest(
                "a process checkpoint is restored into a new sandbox (Engine::restore_checkpoint)"
                    .into(),
            ));
        }
        let path = verify(dir, manifest).await?;
        // Written through the agent, as the sandbox's user: what the archive says is
        // created inside, with the sandbox's own view of paths.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Item>(8);
        let reader = tokio::task::spawn_blocking(move || read_archive(&path, &tx));
        let mut restored = FilesRestore::default();
        let mut links = Vec::new();
        let mut upload: Option<crate::transfer::Upload> = None;
        while let Some(item) = rx.recv().await {
            match item {
                Item::Dir { path, mode } => {
                    self.make_dir(&path).await?;
                    if mode != 0o755 {
                        links.push(("chmod".to_string(), format!("{mode:o}"), path));
                    }
                }
                Item::FileStart { path, mode } => {
                    upload = Some(self.begin_upload(&path, Some(mode), false).await?);
                }
                Item::Chunk(bytes) => {
                    if let Some(u) = upload.as_mut() {
                        u.write(&bytes).await?;
                        restored.bytes += bytes.len() as u64;
                    }
                }
                Item::FileEnd => {
                    if let Some(u) = upload.take() {
                        u.finish().await?;
                        restored.files += 1;
                    }
                }
                Item::Link { path, target } => links.push(("ln".into(), target, path)),
                Item::Skipped(why) => restored.skipped.push(why),
            }
        }
        reader
            .await
            .map_err(|e| EngineError::io("read the snapshot", io::Error::other(e)))?
            .map_err(|e| EngineError::Corrupt(format!("its archive cannot be read: {e}")))?;
        // Links and folder modes in one command (the file protocol makes neither).
        if !links.is_empty() {
            let mut argv = vec![
                "/bin/sh".to_string(),
                "-c".into(),
                "while [ $# -gt 0 ]; do if [ \"$1\" = ln ]; then ln -s -- \"$2\" \"$3\"; \
                 else chmod \"$2\" -- \"$3\"; fi || exit 1; shift 3; done"
                    .into(),
                "sh".into(),
            ];
            for (op, a, b) in links {
                argv.extend([op, a, b]);
            }
            let out = self
                .exec(sandcell_protocol::ExecRequest::argv(argv))
                .await?;
            if !out.result.success() {
                restored.skipped.push(format!(
                    "links and folder modes: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        let mut kernels = Vec::new();
        for k in &manifest.kernels {
            let reply = self
                .simple_call(HostMessage::LoadKernelState {
                    context: k.context.clone(),
                    language: k.language,
                    path: k.path.clone(),
                })
                .await?;
            match reply {
                GuestMessage::KernelStateLoaded { restored, failed } => {
                    kernels.push(KernelRestore {
                        context: k.context.clone(),
                        language: k.language,
                        restored,
                        failed,
                        skipped: k.skipped.clone(),
                    });
                }
                other => return Err(unexpected(other)),
            }
        }
        if !manifest.kernels.is_empty() {
            let _ = self.remove(&format!("/{STATE_DIR}"), true).await;
        }
        Ok(RestoreReport {
            fidelity: manifest.fidelity.clone(),
            kernels,
            files: restored,
            not_carried: manifest.not_carried.clone(),
        })
    }
}

/// Checks the archive of the snapshot in `dir` against its manifest (a changed or truncated
/// archive is refused); returns its path.
pub(crate) async fn verify(
    dir: &Path,
    manifest: &SnapshotManifest,
) -> Result<std::path::PathBuf, EngineError> {
    if manifest.format != MANIFEST_FORMAT {
        return Err(EngineError::Corrupt(format!(
            "unknown snapshot format {} (this build reads {MANIFEST_FORMAT})",
            manifest.format
        )));
    }
    let path = dir.join(&manifest.archive);
    let (sha256, bytes) = {
        let p = path.clone();
        tokio::task::spawn_blocking(move || digest_file(&p))
            .await
            .map_err(|e| EngineError::io("check the snapshot", io::Error::other(e)))?
            .map_err(|e| EngineError::Corrupt(format!("its archive cannot be read: {e}")))?
    };
    if sha256 != manifest.sha256 || bytes != manifest.archive_bytes {
        return Err(EngineError::Corrupt(format!(
            "its archive does not match its checksum ({bytes} bytes, sha256 {sha256}; \
             recorded {} bytes, sha256 {})",
            manifest.archive_bytes, manifest.sha256
        )));
    }
    Ok(path)
}

/// Archives the flat folder `image` (a backend's checkpoint) into `out`, hashed and made
/// durable; returns what it holds, the SHA-256 and the archive's length.
fn archive_folder(
    image: &Path,
    archive: &Path,
) -> Result<(FilesCapture, String, u64), EngineError> {
    let io_err = |e| EngineError::io("write the checkpoint archive", e);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(archive)
        .map_err(io_err)?;
    let mut builder = tar::Builder::new(Hashing {
        inner: io::BufWriter::new(file),
        sha: Sha256::new(),
        bytes: 0,
        early: None,
    });
    let mut capture = FilesCapture::default();
    let mut entries: Vec<_> = std::fs::read_dir(image)
        .map_err(io_err)?
        .collect::<Result<_, _>>()
        .map_err(io_err)?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let meta = entry.metadata().map_err(io_err)?;
        if !meta.is_file() {
            capture.skipped.push(format!(
                "{}: not a regular file",
                entry.file_name().to_string_lossy()
            ));
            continue;
        }
        capture.files += 1;
        capture.bytes += meta.len();
        builder
            .append_path_with_name(entry.path(), entry.file_name())
            .map_err(io_err)?;
    }
    let mut out = builder.into_inner().map_err(io_err)?;
    out.flush().map_err(io_err)?;
    let sha256 = hex(&out.sha.finalize_reset());
    let bytes = out.bytes;
    let file = out.inner.into_inner().map_err(|e| io_err(e.into_error()))?;
    make_durable(&file, archive.parent().unwrap_or(Path::new("."))).map_err(io_err)?;
    Ok((capture, sha256, bytes))
}

/// Unpacks a checkpoint archive (verified) into the empty folder `into`.
pub(crate) fn unpack_checkpoint(archive: &Path, into: &Path) -> Result<(), EngineError> {
    let file = std::fs::File::open(archive)
        .map_err(|e| EngineError::Corrupt(format!("its archive cannot be read: {e}")))?;
    let mut tar = tar::Archive::new(io::BufReader::new(file));
    for entry in tar
        .entries()
        .map_err(|e| EngineError::Corrupt(format!("its archive cannot be read: {e}")))?
    {
        let mut entry =
            entry.map_err(|e| EngineError::Corrupt(format!("its archive cannot be read: {e}")))?;
        let name = entry
            .path()
            .map_err(|e| EngineError::Corrupt(format!("its archive cannot be read: {e}")))?
            .into_owned();
        // The archive is flat: one plain name per entry, nothing that could leave `into`.
        let mut parts = name.components();
        let (Some(std::path::Component::Normal(file_name)), None) = (parts.next(), parts.next())
        else {
            return Err(EngineError::Corrupt(format!(
                "unexpected entry {} in the checkpoint",
                name.display()
            )));
        };
        entry
            .unpack(into.join(file_name))
            .map_err(|e| EngineError::io("unpack the checkpoint", e))?;
    }
    Ok(())
}

impl Sandbox {
    /// After a process checkpoint came back: new random streams in the kernels (the restored
    /// memory holds its source's), and what each kernel holds.
    pub(crate) async fn after_checkpoint_restore(
        &self,
        manifest: &SnapshotManifest,
    ) -> Result<RestoreReport, EngineError> {
        let mut kernels = Vec::new();
        let mut not_carried = manifest.not_carried.clone();
        // A new identity: the checkpoint held the source's hostname.
        let rename = HostMessage::SetHostname {
            name: self.id().to_string(),
        };
        if let Err(e) = self.expect_ok(rename).await {
            not_carried.push(format!("hostname: it kept its source's ({e})"));
        }
        for c in self.list_contexts().await? {
            if c.pid.is_none() {
                continue;
            }
            let reseed = match c.language {
                Language::Python => Some(
                    "__import__('random').seed(__import__('os').urandom(32)); \
                     __import__('sys').modules.get('numpy') and \
                     __import__('numpy').random.seed(int.from_bytes(__import__('os').urandom(4), 'little'))",
                ),
                Language::Node => Some(
                    "{ const c = require('crypto'); \
                     Math.random = () => c.randomInt(0, 2 ** 48) / 2 ** 48; undefined }",
                ),
                _ => None,
            };
            if let Some(code) = reseed {
                let req = sandcell_protocol::code::RunCodeRequest {
                    context: Some(c.id.clone()),
                    language: None,
                    code: code.into(),
                    timeout_ms: Some(10_000),
                };
                match self.run_code(req).await {
                    Ok(run) if run.error.is_none() => {}
                    Ok(run) => not_carried.push(format!(
                        "{}: its random stream could not be reseeded ({})",
                        c.id,
                        run.error
                            .map(|e| format!("{}: {}", e.ename, e.evalue))
                            .unwrap_or_default()
                    )),
                    Err(e) => not_carried.push(format!(
                        "{}: its random stream could not be reseeded ({e})",
                        c.id
                    )),
                }
            }
            let restored = self
                .list_variables(&c.id)
                .await
                .map(|vars| vars.into_iter().map(|v| v.name).collect())
                .unwrap_or_default();
            kernels.push(KernelRestore {
                context: c.id,
                language: c.language,
                restored,
                failed: Vec::new(),
                skipped: Vec::new(),
            });
        }
        Ok(RestoreReport {
            fidelity: manifest.fidelity.clone(),
            files: FilesRestore {
                files: manifest.files.files,
                bytes: manifest.files.bytes,
                skipped: Vec::new(),
            },
            kernels,
            not_carried,
        })
    }
}

impl Sandbox {
    /// Has every running Python and Node kernel write its state under [`STATE_DIR`];
    /// returns them, and a note for each that could not.
    async fn dump_kernels(&self) -> Result<(Vec<KernelState>, Vec<String>), EngineError> {
        let mut kernels = Vec::new();
        let mut gaps = Vec::new();
        let contexts = self.list_contexts().await?;
        let live: Vec<_> = contexts
            .into_iter()
            .filter(|c| c.pid.is_some() && matches!(c.language, Language::Python | Language::Node))
            .collect();
        // Each kernel makes the folder its file goes in (as its own user).
        for c in live {
            let path = format!("/{STATE_DIR}/{}.state", c.id);
            let reply = self
                .simple_call(HostMessage::DumpKernelState {
                    context: c.id.clone(),
                    path: path.clone(),
                })
                .await;
            match reply {
                Ok(GuestMessage::KernelStateSaved { saved, skipped, .. }) => {
                    kernels.push(KernelState {
                        context: c.id,
                        language: c.language,
                        path,
                        saved,
                        skipped,
                    });
                }
                Ok(other) => return Err(unexpected(other)),
                Err(e) => gaps.push(format!("the {} kernel's state: {e}", c.id)),
            }
        }
        Ok((kernels, gaps))
    }
}

/// One step of a restore, read from the archive on a blocking thread.
enum Item {
    Dir { path: String, mode: u32 },
    FileStart { path: String, mode: u32 },
    Chunk(Vec<u8>),
    FileEnd,
    Link { path: String, target: String },
    Skipped(String),
}

/// Reads the archive's entries under the carried folders into `tx` (as absolute sandbox
/// paths); anything else is reported, not restored.
fn read_archive(path: &Path, tx: &tokio::sync::mpsc::Sender<Item>) -> io::Result<()> {
    let send = |item: Item| {
        tx.blocking_send(item)
            .map_err(|_| io::Error::other("the restore stopped"))
    };
    let carried = archived_dirs();
    let mut archive = tar::Archive::new(io::BufReader::new(std::fs::File::open(path)?));
    for entry in archive.entries()? {
        let mut entry = entry?;
        let name = entry.path()?.into_owned();
        let plain = name
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain || !carried.iter().any(|d| name.starts_with(d)) {
            send(Item::Skipped(format!(
                "{}: outside the carried folders",
                name.display()
            )))?;
            continue;
        }
        let path = format!("/{}", name.display());
        let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
        match entry.header().entry_type() {
            tar::EntryType::Directory => send(Item::Dir { path, mode })?,
            tar::EntryType::Regular => {
                send(Item::FileStart { path, mode })?;
                let mut buf = vec![0u8; 256 * 1024];
                loop {
                    let n = entry.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    send(Item::Chunk(buf[..n].to_vec()))?;
                }
                send(Item::FileEnd)?;
            }
            tar::EntryType::Symlink => {
                if let Some(target) = entry.link_name()? {
                    send(Item::Link {
                        path,
                        target: target.display().to_string(),
                    })?;
                }
            }
            other => send(Item::Skipped(format!(
                "{path}: an entry of type {other:?} is not restored"
            )))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, &[u8])]) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut tar = tar::Builder::new(file.reopen().unwrap());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            tar.append_data(&mut h, name, *data).unwrap();
        }
        tar.into_inner().unwrap();
        file
    }

    /// What a restore would do with each entry: the paths written, and what it skipped.
    fn read(file: &tempfile::NamedTempFile) -> (Vec<String>, Vec<String>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        read_archive(file.path(), &tx).unwrap();
        drop(tx);
        let (mut written, mut skipped) = (Vec::new(), Vec::new());
        while let Ok(item) = rx.try_recv() {
            match item {
                Item::FileStart { path, .. } => written.push(path),
                Item::Skipped(why) => skipped.push(why),
                _ => {}
            }
        }
        (written, skipped)
    }

    #[test]
    fn an_archive_synced_as_it_is_written_is_whole_and_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILES_ARCHIVE);
        let file = std::fs::File::create(&path).unwrap();
        let early = EarlySync::start(&file).unwrap();
        let mut out = io::BufWriter::with_capacity(
            WRITE_BUFFER,
            Hashing {
                inner: file,
                sha: Sha256::new(),
                bytes: 0,
                early: Some(early),
            },
        );
        let data: Vec<u8> = (0..3 * WRITE_BUFFER + 123)
            .map(|i| (i % 251) as u8)
            .collect();
        for chunk in data.chunks(8192) {
            out.write_all(chunk).unwrap();
        }
        let mut hashed = out.into_inner().map_err(|e| e.into_error()).unwrap();
        hashed.early.take().unwrap().finish().unwrap();
        make_durable(&hashed.inner, dir.path()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(
            digest_file(&path).unwrap(),
            (hex(&hashed.sha.finalize()), data.len() as u64)
        );
    }

    #[test]
    fn every_file_root_is_carried_and_nothing_else() {
        assert_eq!(archived_dirs(), ["workspace", "home/sandbox", "tmp"]);
        let file = archive(&[
            ("workspace/a", b"1"),
            ("home/sandbox/.rc", b"2"),
            ("tmp/n/e/data.bin", &[0, 159, 255]),
            ("etc/passwd", b"x"),
            ("tmpfoo/x", b"x"),
        ]);
        let (written, skipped) = read(&file);
        assert_eq!(
            written,
            ["/workspace/a", "/home/sandbox/.rc", "/tmp/n/e/data.bin"]
        );
        assert_eq!(skipped.len(), 2, "{skipped:?}");
    }

    #[test]
    fn a_snapshot_from_before_tmp_was_carried_still_restores() {
        // Such archives held the two folders and, under /tmp, only the kernels' state.
        let file = archive(&[
            ("workspace/a", b"1"),
            ("home/sandbox/.rc", b"2"),
            ("tmp/.sandcell-state/python.state", b"s"),
        ]);
        let (written, skipped) = read(&file);
        assert_eq!(
            written,
            [
                "/workspace/a",
                "/home/sandbox/.rc",
                "/tmp/.sandcell-state/python.state"
            ]
        );
        assert!(skipped.is_empty(), "{skipped:?}");
    }
}
