//! Exports: a file or folder copied out of a sandbox into the service's keeping
//! (`<home>/exports/<id>/data` for a file, `…/tree/` for a folder, `…/archive.tar` made on
//! the first download of a folder), listed, shown, deleted and downloaded, by their owner or
//! through a signed link.

use std::path::{Path, PathBuf};

use sandcell_api::SandboxId;
use sandcell_api::files::check_path;
use sandcell_api::rules::check_record_id;
use sandcell_api::time::rfc3339;
use sandcell_api::transfer::{CreateExport, ExportInfo, ExportList};
use sandcell_engine::Sandbox;
use sandcell_protocol::FileKind;
use sandcell_store::{ExportKind, ExportRecord};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::{MAX_DEPTH, MAX_FILES, io_error, too_large};
use crate::caller::new_record_id;
use crate::{Caller, Service, ServiceError, ServiceResult};

/// Who may read an export's content.
#[derive(Debug, Clone, Copy)]
pub enum ExportAccess<'a> {
    /// Its owner, with a key.
    Caller(&'a Caller),
    /// Whoever holds a link the service signed (`expires` in unix seconds).
    SignedLink {
        /// When the link expires.
        expires: i64,
        /// Its signature.
        signature: &'a str,
    },
}

/// An export's content, ready to stream.
#[derive(Debug)]
pub struct ExportContent {
    /// The bytes: a file's, or a folder's tar archive.
    pub file: tokio::fs::File,
    /// Their length.
    pub length: u64,
    /// `application/octet-stream`, or `application/x-tar` for a folder.
    pub content_type: &'static str,
    /// A name to save it under.
    pub filename: String,
}

fn check_export_id(id: &str) -> ServiceResult<()> {
    Ok(check_record_id(id, "ex", "an export")?)
}

fn unix_now() -> i64 {
    sandcell_engine::fleet::now_ms() / 1000
}

/// A name part no other request of this service is using at the same time.
fn unique_suffix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Copies a sandbox file to `dest` on the host within `budget` bytes (taken from it);
/// returns (size, sha256).
pub(crate) async fn copy_out(
    sandbox: &Sandbox,
    path: &str,
    dest: &Path,
    budget: &mut u64,
    cap: u64,
) -> ServiceResult<(u64, String)> {
    let mut download = sandbox.begin_download(path).await?;
    let mut file = tokio::fs::File::create(dest)
        .await
        .map_err(|e| io_error("create the export file", e))?;
    let mut hash = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = download.next_chunk().await {
        let chunk = chunk?;
        size += chunk.len() as u64;
        if size > *budget {
            return Err(too_large(cap));
        }
        hash.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| io_error("write the export file", e))?;
    }
    file.flush()
        .await
        .map_err(|e| io_error("write the export file", e))?;
    *budget -= size;
    Ok((size, format!("{:x}", hash.finalize())))
}

/// Copies a sandbox folder into `dest` (created); returns (files, bytes). Symlinks and
/// special files are skipped.
async fn copy_tree_out(
    sandbox: &Sandbox,
    root: &str,
    dest: &Path,
    cap: u64,
) -> ServiceResult<(u64, u64)> {
    let mut budget = cap;
    let mut files = 0u64;
    let mut stack = vec![(root.to_string(), dest.to_path_buf(), 0usize)];
    while let Some((dir, host_dir, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(ServiceError::invalid(format!(
                "{dir} is more than {MAX_DEPTH} folders deep"
            )));
        }
        tokio::fs::create_dir_all(&host_dir)
            .await
            .map_err(|e| io_error("create the export folder", e))?;
        for entry in sandbox.list_dir(&dir).await? {
            let host = host_dir.join(&entry.name);
            match entry.kind {
                FileKind::Dir => stack.push((entry.path, host, depth + 1)),
                FileKind::File => {
                    files += 1;
                    if files as usize > MAX_FILES {
                        return Err(ServiceError::invalid(format!(
                            "{root} holds more than {MAX_FILES} files"
                        )));
                    }
                    copy_out(sandbox, &entry.path, &host, &mut budget, cap).await?;
                }
                FileKind::Symlink | FileKind::Other => {}
            }
        }
    }
    Ok((files, cap - budget))
}

/// Builds a folder export's tar archive (`top/…`) at `archive`, through a temporary file of
/// its own: concurrent first downloads each build one, and the renames (atomic, same
/// content) leave one whole archive.
async fn build_archive(dir: &Path, top: String, archive: PathBuf) -> ServiceResult<()> {
    let tree = dir.join("tree");
    let tmp = dir.join(format!("archive.tar.{}.tmp", unique_suffix()));
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let built = (|| {
            let file = std::fs::File::create(&tmp)?;
            let mut builder = tar::Builder::new(std::io::BufWriter::new(file));
            builder.follow_symlinks(false);
            builder.append_dir_all(&top, &tree)?;
            builder
                .into_inner()?
                .into_inner()
                .map_err(|e| e.into_error())?;
            std::fs::rename(&tmp, &archive)
        })();
        if built.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        built
    })
    .await
    .map_err(|e| ServiceError::internal(format!("archive the export: {e}")))?
    .map_err(|e| io_error("archive the export", e))
}

impl Service {
    /// Where exports are kept.
    pub fn exports_dir(&self) -> PathBuf {
        self.config.home.join("exports")
    }

    /// What the API says about `e`, with a signed link valid from now (none when
    /// `exports.url_ttl_secs` is 0).
    pub fn export_info(&self, e: &ExportRecord) -> ExportInfo {
        let download_url = format!("/v1/exports/{}/content", e.id);
        let ttl = i64::try_from(self.config.exports.url_ttl_secs).unwrap_or(i64::MAX);
        let (signed_url, signed_url_expires_at) = if ttl > 0 {
            let expires = unix_now().saturating_add(ttl);
            let signature = self.signer.sign(&e.id, expires);
            (
                Some(format!(
                    "{download_url}?expires={expires}&signature={signature}"
                )),
                Some(rfc3339(expires.saturating_mul(1000))),
            )
        } else {
            (None, None)
        };
        ExportInfo {
            id: e.id.clone(),
            sandbox_id: e.sandbox_id.clone(),
            path: e.path.clone(),
            kind: e.kind.as_str().to_string(),
            size: e.size,
            sha256: e.sha256.clone(),
            created_at: rfc3339(e.created_at),
            download_url,
            signed_url,
            signed_url_expires_at,
        }
    }

    /// The caller's export `id` (another owner's is missing).
    pub(crate) fn own_export(&self, caller: &Caller, id: &str) -> ServiceResult<ExportRecord> {
        check_export_id(id)?;
        self.store
            .get_export(id)?
            .filter(|e| e.owner == caller.owner)
            .ok_or_else(|| ServiceError::not_found("export", id))
    }

    /// Copies a file or folder out of the caller's sandbox `id` into the service's keeping
    /// (at most `limits.max_upload_bytes` in all); nothing stays behind on failure.
    pub async fn create_export(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: CreateExport,
    ) -> ServiceResult<ExportInfo> {
        check_path(&req.path)?;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        let entry = sandbox.stat(&req.path).await?;
        let export_id = new_record_id("ex")?;
        let dir = self.exports_dir().join(&export_id);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| io_error("create the export folder", e))?;
        let cap = self.config.limits.max_upload_bytes;
        let copied = match entry.kind {
            FileKind::File => {
                let mut budget = cap;
                copy_out(&sandbox, &entry.path, &dir.join("data"), &mut budget, cap)
                    .await
                    .map(|(size, sha)| (ExportKind::File, size, Some(sha)))
            }
            FileKind::Dir => copy_tree_out(&sandbox, &entry.path, &dir.join("tree"), cap)
                .await
                .map(|(_, bytes)| (ExportKind::Dir, bytes, None)),
            _ => Err(ServiceError::invalid(format!(
                "{} is neither a file nor a folder",
                entry.path
            ))),
        };
        let (kind, size, sha256) = match copied {
            Ok(c) => c,
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&dir).await;
                return Err(e);
            }
        };
        let record = ExportRecord {
            id: export_id.clone(),
            owner: caller.owner.clone(),
            sandbox_id: id.to_string(),
            path: entry.path.clone(),
            kind,
            created_at: sandcell_engine::fleet::now_ms(),
            size: Some(size),
            sha256,
            stored_path: Some(dir.display().to_string()),
        };
        if let Err(e) = self.store.insert_export(&record) {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            return Err(e.into());
        }
        self.audit(
            caller,
            "export.create",
            Some(&export_id),
            serde_json::json!({"sandbox": id, "path": entry.path, "size": size}),
        );
        Ok(self.export_info(&record))
    }

    /// The caller's exports, oldest first (`sandbox` narrows to one sandbox's).
    pub fn list_exports(
        &self,
        caller: &Caller,
        sandbox: Option<&SandboxId>,
    ) -> ServiceResult<ExportList> {
        let exports = self
            .store
            .list_exports(Some(&caller.owner), sandbox.map(|s| s.as_str()))?;
        Ok(ExportList {
            exports: exports.iter().map(|e| self.export_info(e)).collect(),
        })
    }

    /// One of the caller's exports.
    pub fn get_export(&self, caller: &Caller, id: &str) -> ServiceResult<ExportInfo> {
        Ok(self.export_info(&self.own_export(caller, id)?))
    }

    /// Deletes one of the caller's exports and its stored copy.
    pub async fn delete_export(&self, caller: &Caller, id: &str) -> ServiceResult<()> {
        let export = self.own_export(caller, id)?;
        self.store.delete_export(&export.id)?;
        if let Some(dir) = &export.stored_path {
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
        self.audit(
            caller,
            "export.delete",
            Some(&export.id),
            serde_json::Value::Null,
        );
        Ok(())
    }

    /// An export's content: a file's bytes, or a folder as a tar archive (built on its first
    /// download). With its owner's key, or a signed link (an expired or altered one is
    /// permission denied).
    pub async fn export_content(
        &self,
        access: ExportAccess<'_>,
        id: &str,
    ) -> ServiceResult<ExportContent> {
        let export = match access {
            ExportAccess::SignedLink { expires, signature } => {
                check_export_id(id)?;
                self.signer
                    .verify(id, expires, signature, unix_now())
                    .map_err(|e| ServiceError::forbidden(e.to_string()))?;
                self.store
                    .get_export(id)?
                    .ok_or_else(|| ServiceError::not_found("export", id))?
            }
            ExportAccess::Caller(caller) => self.own_export(caller, id)?,
        };
        let dir = PathBuf::from(
            export
                .stored_path
                .clone()
                .ok_or_else(|| ServiceError::internal("the export has no stored copy"))?,
        );
        let name = Path::new(&export.path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "export".into());
        let (path, content_type, filename) = match export.kind {
            ExportKind::File => (dir.join("data"), "application/octet-stream", name),
            ExportKind::Dir => {
                let archive = dir.join("archive.tar");
                if !archive.exists() {
                    build_archive(&dir, name.clone(), archive.clone()).await?;
                }
                (archive, "application/x-tar", format!("{name}.tar"))
            }
        };
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| io_error("open the export", e))?;
        let length = file
            .metadata()
            .await
            .map_err(|e| io_error("stat the export", e))?
            .len();
        Ok(ExportContent {
            file,
            length,
            content_type,
            filename,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::ErrorKind;
    use crate::system::testing::{caller, service};

    /// Stores an export of `owner` as `create_export` leaves one: a file's `data`, or a
    /// folder's `tree/`.
    fn stored(s: &Service, owner: &str, sandbox: &str, path: &str, kind: ExportKind) -> String {
        let id = new_record_id("ex").unwrap();
        let dir = s.exports_dir().join(&id);
        match kind {
            ExportKind::File => {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join("data"), b"hello").unwrap();
            }
            ExportKind::Dir => {
                std::fs::create_dir_all(dir.join("tree/sub")).unwrap();
                std::fs::write(dir.join("tree/sub/a.txt"), b"a").unwrap();
            }
        }
        s.store
            .insert_export(&ExportRecord {
                id: id.clone(),
                owner: owner.into(),
                sandbox_id: sandbox.into(),
                path: path.into(),
                kind,
                created_at: 1,
                size: Some(5),
                sha256: None,
                stored_path: Some(dir.display().to_string()),
            })
            .unwrap();
        id
    }

    async fn read_all(mut c: ExportContent) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut out = Vec::new();
        c.file.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn exports_are_their_owners_and_signed_links_open_them() {
        let h = service(&[("exports.url_ttl_secs", "60")]);
        let s = &h.service;
        let (alice, bob) = (caller("alice", false), caller("bob", false));
        let file = stored(
            s,
            "alice",
            "sb-one",
            "/workspace/report.txt",
            ExportKind::File,
        );
        let _other = stored(s, "alice", "sb-two", "/workspace/b", ExportKind::File);

        let info = s.get_export(&alice, &file).unwrap();
        assert_eq!(info.download_url, format!("/v1/exports/{file}/content"));
        let signed = info.signed_url.clone().unwrap();
        assert!(info.signed_url_expires_at.is_some());
        assert_eq!(s.list_exports(&alice, None).unwrap().exports.len(), 2);
        assert_eq!(
            s.list_exports(&alice, Some(&crate::exec::testing::sid("sb-one")))
                .unwrap()
                .exports
                .len(),
            1
        );
        assert!(s.list_exports(&bob, None).unwrap().exports.is_empty());
        let kind = |r: ServiceResult<ExportInfo>| r.unwrap_err().kind;
        assert_eq!(kind(s.get_export(&bob, &file)), ErrorKind::NotFound);
        assert_eq!(
            kind(s.get_export(&alice, "ex-1")),
            ErrorKind::InvalidArgument
        );

        // The owner reads it; another owner cannot; the signed link can, until altered.
        let c = s
            .export_content(ExportAccess::Caller(&alice), &file)
            .await
            .unwrap();
        assert_eq!(
            (c.content_type, c.filename.as_str(), c.length),
            ("application/octet-stream", "report.txt", 5)
        );
        assert_eq!(read_all(c).await, b"hello");
        let e = s
            .export_content(ExportAccess::Caller(&bob), &file)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        let query = signed.split_once('?').unwrap().1;
        let pairs: Vec<(String, String)> = query
            .split('&')
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        let expires: i64 = pairs[0].1.parse().unwrap();
        let signature = pairs[1].1.clone();
        let link = ExportAccess::SignedLink {
            expires,
            signature: &signature,
        };
        assert_eq!(
            read_all(s.export_content(link, &file).await.unwrap()).await,
            b"hello"
        );
        let late = ExportAccess::SignedLink {
            expires: expires + 1,
            signature: &signature,
        };
        let e = s.export_content(late, &file).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);

        // Deleted: the record and the stored copy go; then it is missing.
        s.delete_export(&alice, &file).await.unwrap();
        assert!(!s.exports_dir().join(&file).exists());
        assert_eq!(kind(s.get_export(&alice, &file)), ErrorKind::NotFound);
        assert_eq!(
            s.delete_export(&alice, &file).await.unwrap_err().kind,
            ErrorKind::NotFound
        );
    }

    #[tokio::test]
    async fn a_folder_downloads_as_a_tar_under_its_name() {
        let h = service(&[("exports.url_ttl_secs", "0")]);
        let s = &h.service;
        let alice = caller("alice", false);
        let dir = stored(s, "alice", "sb-one", "/workspace/results", ExportKind::Dir);
        let info = s.get_export(&alice, &dir).unwrap();
        assert_eq!((info.signed_url, info.signed_url_expires_at), (None, None));
        let c = s
            .export_content(ExportAccess::Caller(&alice), &dir)
            .await
            .unwrap();
        assert_eq!(
            (c.content_type, c.filename.as_str()),
            ("application/x-tar", "results.tar")
        );
        let bytes = read_all(c).await;
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut found = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut body = String::new();
            entry.read_to_string(&mut body).unwrap();
            found.push((path, body));
        }
        assert!(
            found.contains(&("results/sub/a.txt".to_string(), "a".to_string())),
            "{found:?}"
        );
        // Built once, kept, and no temporary file left behind.
        let kept: Vec<_> = std::fs::read_dir(s.exports_dir().join(&dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(kept.contains(&"archive.tar".to_string()), "{kept:?}");
        assert!(!kept.iter().any(|n| n.ends_with(".tmp")), "{kept:?}");
    }
}
