//! Imports: files into a sandbox from an allowed host path (see [`super::policy`]), inline
//! text or base64, or one of the caller's exports.

use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use sandcell_api::SandboxId;
use sandcell_api::files::{check_mode, check_path};
use sandcell_api::transfer::{ImportRequest, ImportResult};
use sandcell_engine::Sandbox;
use sandcell_store::ExportKind;
use tokio::io::AsyncReadExt;

use super::{HostPathPolicy, MAX_DEPTH, MAX_FILES, io_error, too_large};
use crate::{Caller, Service, ServiceError, ServiceResult};

/// Where an import's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source<'a> {
    HostPath(&'a str),
    Text(&'a str),
    Base64(&'a str),
    Export(&'a str),
}

/// The one source a request names (none or several is an invalid argument).
fn source_of(req: &ImportRequest) -> ServiceResult<Source<'_>> {
    let given: Vec<Source<'_>> = [
        req.host_path.as_deref().map(Source::HostPath),
        req.text.as_deref().map(Source::Text),
        req.base64.as_deref().map(Source::Base64),
        req.export_id.as_deref().map(Source::Export),
    ]
    .into_iter()
    .flatten()
    .collect();
    match given[..] {
        [one] => Ok(one),
        _ => Err(ServiceError::invalid(
            "give exactly one of host_path, text, base64 and export_id",
        )),
    }
}

/// Joins a sandbox folder and a relative host path.
fn sandbox_join(dir: &str, rel: &Path) -> String {
    let mut out = dir.trim_end_matches('/').to_string();
    for c in rel.components() {
        if let Component::Normal(n) = c {
            out.push('/');
            out.push_str(&n.to_string_lossy());
        }
    }
    out
}

/// Uploads one host file within `budget` bytes (taken from it); returns its size.
pub(crate) async fn upload_host_file(
    sandbox: &Sandbox,
    host: &Path,
    dest: &str,
    mode: Option<u32>,
    budget: &mut u64,
    cap: u64,
) -> ServiceResult<u64> {
    let mut file = tokio::fs::File::open(host)
        .await
        .map_err(|e| io_error(&format!("open {}", host.display()), e))?;
    let mut upload = sandbox.begin_upload(dest, mode, false).await?;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| io_error(&format!("read {}", host.display()), e))?;
        if n == 0 {
            break;
        }
        if upload.written() + n as u64 > *budget {
            upload.abort().await;
            return Err(too_large(cap));
        }
        upload.write(&buf[..n]).await?;
    }
    let size = upload.written();
    upload.finish().await?;
    *budget -= size;
    Ok(size)
}

/// Uploads a host file or folder tree to `dest`; returns (files, bytes). Links are never
/// followed (one could lead outside the allowed folder); special files are skipped.
async fn upload_host_tree(
    sandbox: &Sandbox,
    root: &Path,
    dest: &str,
    mode: Option<u32>,
    cap: u64,
) -> ServiceResult<(u64, u64)> {
    let meta = tokio::fs::symlink_metadata(root)
        .await
        .map_err(|e| io_error(&format!("stat {}", root.display()), e))?;
    let mut budget = cap;
    if meta.is_file() {
        let size = upload_host_file(sandbox, root, dest, mode, &mut budget, cap).await?;
        return Ok((1, size));
    }
    if !meta.is_dir() {
        return Err(ServiceError::invalid(format!(
            "{} is neither a file nor a folder",
            root.display()
        )));
    }
    let mut files = 0u64;
    sandbox.make_dir(dest).await?;
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(ServiceError::invalid(format!(
                "{} is more than {MAX_DEPTH} folders deep",
                root.display()
            )));
        }
        let mut entries = tokio::fs::read_dir(&dir)
            .await
            .map_err(|e| io_error(&format!("list {}", dir.display()), e))?;
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|e| io_error(&format!("list {}", dir.display()), e))?
        {
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let target = sandbox_join(dest, rel);
            let kind = entry
                .file_type()
                .await
                .map_err(|e| io_error(&format!("stat {}", path.display()), e))?;
            if kind.is_dir() {
                sandbox.make_dir(&target).await?;
                stack.push((path, depth + 1));
            } else if kind.is_file() {
                files += 1;
                if files as usize > MAX_FILES {
                    return Err(ServiceError::invalid(format!(
                        "{} holds more than {MAX_FILES} files",
                        root.display()
                    )));
                }
                upload_host_file(sandbox, &path, &target, mode, &mut budget, cap).await?;
            }
        }
    }
    Ok((files, cap - budget))
}

impl Service {
    /// The host paths imports may read now (`import.allowed_paths`, resolved per call so a
    /// folder made after the start counts).
    pub fn host_path_policy(&self) -> HostPathPolicy {
        HostPathPolicy::new(&self.config.import.allowed_paths)
    }

    /// Puts files into the caller's sandbox `id` from exactly one source: an allowed host
    /// path, inline text or base64, or one of the caller's exports (at most
    /// `limits.max_upload_bytes` in all).
    pub async fn import(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: ImportRequest,
    ) -> ServiceResult<ImportResult> {
        check_path(&req.path)?;
        if let Some(mode) = req.mode {
            check_mode(mode)?;
        }
        let source = source_of(&req)?;
        let cap = self.config.limits.max_upload_bytes;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        let (files, bytes, audited) = match source {
            Source::Text(text) => {
                let entry = sandbox
                    .write_file(&req.path, text.as_bytes(), req.mode)
                    .await?;
                (1, entry.size, serde_json::json!("text"))
            }
            Source::Base64(b64) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| ServiceError::invalid(format!("base64 is not valid: {e}")))?;
                let entry = sandbox.write_file(&req.path, &bytes, req.mode).await?;
                (1, entry.size, serde_json::json!("base64"))
            }
            Source::HostPath(raw) => {
                let host = self.host_path_policy().resolve(raw)?;
                let (f, b) = upload_host_tree(&sandbox, &host, &req.path, req.mode, cap).await?;
                (
                    f,
                    b,
                    serde_json::json!({"host_path": host.display().to_string()}),
                )
            }
            Source::Export(export_id) => {
                let export = self.own_export(caller, export_id)?;
                let dir = PathBuf::from(
                    export
                        .stored_path
                        .clone()
                        .ok_or_else(|| ServiceError::internal("the export has no stored copy"))?,
                );
                let stored = match export.kind {
                    ExportKind::File => dir.join("data"),
                    ExportKind::Dir => dir.join("tree"),
                };
                let (f, b) = upload_host_tree(&sandbox, &stored, &req.path, req.mode, cap).await?;
                (f, b, serde_json::json!({"export_id": export.id}))
            }
        };
        // Answered as every file route answers a path: absolute, as the sandbox resolved it.
        let path = sandbox.stat(&req.path).await?.path;
        self.audit(
            caller,
            "import",
            Some(id),
            serde_json::json!({"path": path, "source": audited, "files": files, "bytes": bytes}),
        );
        Ok(ImportResult { path, files, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_names_exactly_one_source() {
        let req = |host: bool, text: bool, b64: bool, export: bool| ImportRequest {
            path: "/workspace/x".into(),
            host_path: host.then(|| "/data/x".into()),
            text: text.then(|| "hi".into()),
            base64: b64.then(|| "aGk=".into()),
            export_id: export.then(|| "ex-0123456789abcdef".into()),
            mode: None,
        };
        assert_eq!(
            source_of(&req(true, false, false, false)).unwrap(),
            Source::HostPath("/data/x")
        );
        assert_eq!(
            source_of(&req(false, true, false, false)).unwrap(),
            Source::Text("hi")
        );
        assert_eq!(
            source_of(&req(false, false, true, false)).unwrap(),
            Source::Base64("aGk=")
        );
        assert_eq!(
            source_of(&req(false, false, false, true)).unwrap(),
            Source::Export("ex-0123456789abcdef")
        );
        for bad in [
            req(false, false, false, false),
            req(true, true, false, false),
        ] {
            let e = source_of(&bad).unwrap_err();
            assert_eq!(e.kind, crate::ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn host_paths_join_under_the_target_folder() {
        assert_eq!(
            sandbox_join("/workspace/in/", Path::new("a/b.txt")),
            "/workspace/in/a/b.txt"
        );
        assert_eq!(sandbox_join("/w", Path::new("/x/../y")), "/w/x/y");
    }
}
