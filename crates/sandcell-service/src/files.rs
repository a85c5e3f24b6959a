//! Files of a sandbox: list, stat, mkdir, rename, remove, and contents streamed both ways
//! (any size up to `limits.max_upload_bytes`).

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use sandcell_api::SandboxId;
use sandcell_api::files::{
    DEFAULT_DIR, FileInfo, FileList, MakeDir, Rename, check_mode, check_path,
};
use sandcell_engine::Download;
use sandcell_protocol::FileKind;

use crate::{Caller, ErrorKind, Service, ServiceError, ServiceResult};

/// A file's bytes, as the agent reads them.
pub type ByteStream = Pin<Box<dyn Stream<Item = ServiceResult<Vec<u8>>> + Send>>;

/// A file on its way out of a sandbox.
pub struct FileDownload {
    /// The file's last path component (for a download's file name).
    pub name: String,
    /// Its length at the time the download began, when it is a regular file (a link's own
    /// size is not its file's): a file that changes while it streams ends short, and the
    /// client sees a length mismatch rather than silently short data.
    pub length: Option<u64>,
    /// Its bytes.
    pub chunks: ByteStream,
}

impl std::fmt::Debug for FileDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDownload")
            .field("name", &self.name)
            .field("length", &self.length)
            .finish_non_exhaustive()
    }
}

/// Over the size limit of a file.
fn too_large(cap: u64) -> ServiceError {
    ServiceError::new(
        ErrorKind::BodyTooLarge,
        format!("files are limited to {cap} bytes (limits.max_upload_bytes)"),
    )
}

/// The chunks of a download after its first, as a stream.
pub(crate) fn download_stream(first: Option<ServiceResult<Vec<u8>>>, rest: Download) -> ByteStream {
    let rest = futures_util::stream::unfold(rest, |mut d| async move {
        let next = d.next_chunk().await?;
        Some((next.map_err(ServiceError::from), d))
    });
    Box::pin(futures_util::stream::iter(first).chain(rest))
}

impl Service {
    /// Lists a directory (default `/workspace`), sorted by name.
    pub async fn list_files(
        &self,
        caller: &Caller,
        id: &SandboxId,
        path: Option<&str>,
    ) -> ServiceResult<FileList> {
        let path = path.unwrap_or(DEFAULT_DIR);
        check_path(path)?;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        let entries = sandbox.list_dir(path).await?;
        Ok(FileList {
            entries: entries.into_iter().map(FileInfo::from).collect(),
        })
    }

    /// Describes one path (a final symlink is not followed).
    pub async fn stat_file(
        &self,
        caller: &Caller,
        id: &SandboxId,
        path: &str,
    ) -> ServiceResult<FileInfo> {
        check_path(path)?;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        Ok(sandbox.stat(path).await?.into())
    }

    /// Creates a directory and its parents.
    pub async fn make_dir(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: MakeDir,
    ) -> ServiceResult<FileInfo> {
        check_path(&req.path)?;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        Ok(sandbox.make_dir(&req.path).await?.into())
    }

    /// Moves a file or directory (the target must not exist).
    pub async fn rename_file(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: Rename,
    ) -> ServiceResult<FileInfo> {
        check_path(&req.from)?;
        check_path(&req.to)?;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        Ok(sandbox.rename(&req.from, &req.to).await?.into())
    }

    /// Removes a file, or a directory (`recursive` for a non-empty one).
    pub async fn remove_file(
        &self,
        caller: &Caller,
        id: &SandboxId,
        path: &str,
        recursive: bool,
    ) -> ServiceResult<()> {
        check_path(path)?;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        Ok(sandbox.remove(path, recursive).await?)
    }

    /// Starts reading a file out. The agent refuses what it will not read (a link leading
    /// out of the sandbox, a file gone since the stat) in its first answer: that is taken
    /// here, so a refusal is an error rather than a stream cut short.
    pub async fn download_file(
        &self,
        caller: &Caller,
        id: &SandboxId,
        path: &str,
    ) -> ServiceResult<FileDownload> {
        check_path(path)?;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        let entry = sandbox.stat(path).await?;
        if entry.is_dir {
            return Err(ServiceError::new(
                ErrorKind::IsADirectory,
                format!("{path} is a directory: list it, or export it as an archive"),
            ));
        }
        let cap = self.config.limits.max_upload_bytes;
        if entry.size > cap {
            return Err(too_large(cap));
        }
        let mut download = sandbox.begin_download(path).await?;
        let first = match download.next_chunk().await {
            Some(Err(e)) => return Err(e.into()),
            first => first.map(|c| c.map_err(ServiceError::from)),
        };
        Ok(FileDownload {
            length: (entry.kind == FileKind::File).then_some(entry.size),
            name: entry.name,
            chunks: download_stream(first, download),
        })
    }

    /// Writes a file from a stream of bytes, written to a temporary name and moved into place
    /// when complete (an interrupted upload leaves the old file as it was); parents are
    /// created. `append` adds to the file instead.
    pub async fn upload_file<S, B, E>(
        &self,
        caller: &Caller,
        id: &SandboxId,
        path: &str,
        mode: Option<u32>,
        append: bool,
        body: S,
    ) -> ServiceResult<FileInfo>
    where
        S: Stream<Item = Result<B, E>>,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        check_path(path)?;
        if let Some(mode) = mode {
            check_mode(mode)?;
        }
        let cap = self.config.limits.max_upload_bytes;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        let mut upload = sandbox.begin_upload(path, mode, append).await?;
        let mut body = std::pin::pin!(body);
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    upload.abort().await;
                    return Err(ServiceError::invalid(format!("the upload broke off: {e}")));
                }
            };
            let chunk = chunk.as_ref();
            if upload.written() + chunk.len() as u64 > cap {
                upload.abort().await;
                return Err(too_large(cap));
            }
            upload.write(chunk).await?;
        }
        let entry = upload.finish().await?;
        self.audit(
            caller,
            "file.upload",
            Some(id),
            serde_json::json!({"path": entry.path, "size": entry.size}),
        );
        Ok(entry.into())
    }
}
