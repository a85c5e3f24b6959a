//! Moving files between sandboxes and the host: exports (a file or folder copied out of a
//! sandbox and kept by the service, downloadable and importable into other sandboxes after
//! the first one is gone), imports (from an allowed host path, inline text or base64, or an
//! export), and the artifacts folder.

use std::path::{Component, Path, PathBuf};

use axum::Json;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sandcell_api::transfer::{
    ARTIFACTS_DIR, Artifact, ArtifactList, CreateExport, ExportInfo, ExportList, ImportRequest,
    ImportResult,
};
use sandcell_engine::Sandbox;
use sandcell_protocol::FileKind;
use sandcell_store::{ExportKind, ExportRecord};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::extract::{ApiJson, ApiPath, check_sandbox_id, query_pairs};
use super::types::rfc3339;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Deepest folder tree an export or import walks.
const MAX_DEPTH: usize = 64;
/// Most files one export or import moves.
const MAX_FILES: usize = 100_000;

/// What the API says about `e`, with a signed link valid from now.
fn export_info(s: &AppState, e: &ExportRecord) -> ExportInfo {
    let download_url = format!("/v1/exports/{}/content", e.id);
    let ttl = i64::try_from(s.config.exports.url_ttl_secs).unwrap_or(i64::MAX);
    let (signed_url, signed_url_expires_at) = if ttl > 0 {
        let expires = unix_now().saturating_add(ttl);
        let signature = s.signer.sign(&e.id, expires);
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

fn unix_now() -> i64 {
    sandcell_engine::fleet::now_ms() / 1000
}

fn exports_dir(s: &AppState) -> PathBuf {
    s.config.home.join("exports")
}

fn io_error(what: &str, e: std::io::Error) -> ApiError {
    ApiError::internal(format!("{what}: {e}"))
}

fn too_large(cap: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("transfers are limited to {cap} bytes (limits.max_upload_bytes)"),
    )
}

fn new_export_id() -> Result<String, ApiError> {
    super::extract::new_record_id("ex")
}

fn check_export_id(id: &str) -> Result<(), ApiError> {
    super::extract::check_record_id(id, "ex", "an export")
}

/// Copies a sandbox file to `dest` on the host; returns (size, sha256).
async fn copy_out(
    sandbox: &Sandbox,
    path: &str,
    dest: &Path,
    budget: &mut u64,
    cap: u64,
) -> ApiResult<(u64, String)> {
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
) -> ApiResult<(u64, u64)> {
    let mut budget = cap;
    let mut files = 0u64;
    let mut stack = vec![(root.to_string(), dest.to_path_buf(), 0usize)];
    while let Some((dir, host_dir, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(ApiError::invalid(format!(
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
                        return Err(ApiError::invalid(format!(
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

/// Copies a file or folder out of the sandbox into the service's keeping.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exports", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateExport,
    responses(
        (status = 201, body = ExportInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 413, description = "Over limits.max_upload_bytes", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_export(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<CreateExport>,
) -> ApiResult<(StatusCode, Json<ExportInfo>)> {
    check_sandbox_id(&id)?;
    super::files::check_path(&req.path)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let entry = sandbox.stat(&req.path).await?;
    let export_id = new_export_id()?;
    let dir = exports_dir(&s).join(&export_id);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| io_error("create the export folder", e))?;
    let cap = s.config.limits.max_upload_bytes;
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
        _ => Err(ApiError::invalid(format!(
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
        sandbox_id: id.clone(),
        path: entry.path.clone(),
        kind,
        created_at: sandcell_engine::fleet::now_ms(),
        size: Some(size),
        sha256,
        stored_path: Some(dir.display().to_string()),
    };
    if let Err(e) = s.store.insert_export(&record) {
        let _ = tokio::fs::remove_dir_all(&dir).await;
        return Err(e.into());
    }
    crate::audit(
        &s,
        &caller,
        "export.create",
        Some(&export_id),
        serde_json::json!({"sandbox": id, "path": entry.path, "size": size}),
    );
    Ok((StatusCode::CREATED, Json(export_info(&s, &record))))
}

/// The caller's export `id` (another owner's is missing).
fn own_export(s: &AppState, caller: &Caller, id: &str) -> ApiResult<ExportRecord> {
    check_export_id(id)?;
    s.store
        .get_export(id)?
        .filter(|e| e.owner == caller.owner)
        .ok_or_else(|| ApiError::not_found("export", id))
}

/// Lists your exports (`sandbox_id` narrows to one sandbox's).
#[utoipa::path(
    get, path = "/v1/exports", tag = "files",
    params(("sandbox_id" = Option<String>, Query, description = "Only this sandbox's")),
    responses(
        (status = 200, body = ExportList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_exports(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<ExportList>> {
    let mut sandbox = None;
    for (k, v) in query_pairs(raw.as_deref())? {
        match k.as_str() {
            "sandbox_id" => {
                check_sandbox_id(&v)?;
                sandbox = Some(v);
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (sandbox_id)"
                )));
            }
        }
    }
    let exports = s
        .store
        .list_exports(Some(&caller.owner), sandbox.as_deref())?;
    Ok(Json(ExportList {
        exports: exports.iter().map(|e| export_info(&s, e)).collect(),
    }))
}

/// One export.
#[utoipa::path(
    get, path = "/v1/exports/{export_id}", tag = "files",
    params(("export_id" = String, Path, description = "Export id")),
    responses(
        (status = 200, body = ExportInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_export(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(export_id): ApiPath<String>,
) -> ApiResult<Json<ExportInfo>> {
    Ok(Json(export_info(&s, &own_export(&s, &caller, &export_id)?)))
}

/// Deletes an export and its stored copy.
#[utoipa::path(
    delete, path = "/v1/exports/{export_id}", tag = "files",
    params(("export_id" = String, Path, description = "Export id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_export(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(export_id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let export = own_export(&s, &caller, &export_id)?;
    s.store.delete_export(&export.id)?;
    if let Some(dir) = &export.stored_path {
        let _ = tokio::fs::remove_dir_all(dir).await;
    }
    crate::audit(
        &s,
        &caller,
        "export.delete",
        Some(&export.id),
        serde_json::Value::Null,
    );
    Ok(StatusCode::NO_CONTENT)
}

/// Downloads an export: a file's bytes, or a folder as a tar archive. With the API key of
/// its owner, or without one through its `signed_url` (`expires` and `signature`).
#[utoipa::path(
    get, path = "/v1/exports/{export_id}/content", tag = "files",
    params(
        ("export_id" = String, Path, description = "Export id"),
        ("expires" = Option<i64>, Query, description = "Of a signed link: when it expires (unix seconds)"),
        ("signature" = Option<String>, Query, description = "Of a signed link: its signature"),
    ),
    responses(
        (status = 200, description = "The bytes (a folder: application/x-tar)", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "A signed link that expired or does not match", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []), ())
)]
pub async fn download_export(
    State(s): State<AppState>,
    caller: Result<Caller, ApiError>,
    ApiPath(export_id): ApiPath<String>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let export = match signed_link(query.as_deref())? {
        Some((expires, signature)) => {
            check_export_id(&export_id)?;
            s.signer
                .verify(&export_id, expires, &signature, unix_now())
                .map_err(|e| ApiError::forbidden(e.to_string()))?;
            s.store
                .get_export(&export_id)?
                .ok_or_else(|| ApiError::not_found("export", &export_id))?
        }
        None => own_export(&s, &caller?, &export_id)?,
    };
    let dir = PathBuf::from(
        export
            .stored_path
            .clone()
            .ok_or_else(|| ApiError::internal("the export has no stored copy"))?,
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
                let tree = dir.join("tree");
                // Its own temporary file: concurrent first downloads each build one, and the
                // renames (atomic, same content) leave one whole archive.
                let tmp = dir.join(format!("archive.tar.{}.tmp", unique_suffix()));
                let top = name.clone();
                let done = archive.clone();
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
                        std::fs::rename(&tmp, &done)
                    })();
                    if built.is_err() {
                        let _ = std::fs::remove_file(&tmp);
                    }
                    built
                })
                .await
                .map_err(|e| ApiError::internal(format!("archive the export: {e}")))?
                .map_err(|e| io_error("archive the export", e))?;
            }
            (archive, "application/x-tar", format!("{name}.tar"))
        }
    };
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| io_error("open the export", e))?;
    let len = file
        .metadata()
        .await
        .map_err(|e| io_error("stat the export", e))?
        .len();
    let mut resp = Body::from_stream(tokio_util::io::ReaderStream::new(file)).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"{}\"",
        filename.replace(['"', '\\', '\r', '\n'], "_")
    )) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

/// Where the allowed roots are, resolved (symlinks followed), once per request.
fn allowed_roots(s: &AppState) -> Vec<PathBuf> {
    s.config
        .import
        .allowed_paths
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect()
}

/// Resolves a host path and checks it lies inside an allowed root.
fn allowed_host_path(s: &AppState, raw: &str) -> ApiResult<PathBuf> {
    let denied = || {
        ApiError::forbidden(format!(
            "'{raw}' is not inside a host folder this service imports from (import.allowed_paths)"
        ))
        .with_details(serde_json::json!({"host_path": raw}))
    };
    let path = Path::new(raw);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(denied());
    }
    let roots = allowed_roots(s);
    if roots.is_empty() {
        return Err(ApiError::forbidden(
            "this service imports from no host folder (set import.allowed_paths)",
        ));
    }
    // Symlinks resolved first, so a link inside a root cannot point outside it.
    let resolved = std::fs::canonicalize(path).map_err(|_| {
        if roots.iter().any(|r| path.starts_with(r)) {
            ApiError::not_found("host path", raw)
        } else {
            denied()
        }
    })?;
    if roots.iter().any(|r| resolved.starts_with(r)) {
        Ok(resolved)
    } else {
        Err(denied())
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

/// Uploads one host file; returns its size.
async fn upload_host_file(
    sandbox: &Sandbox,
    host: &Path,
    dest: &str,
    mode: Option<u32>,
    budget: &mut u64,
    cap: u64,
) -> ApiResult<u64> {
    use tokio::io::AsyncReadExt;
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

/// Uploads a host file or folder tree to `dest`; returns (files, bytes).
async fn upload_host_tree(
    sandbox: &Sandbox,
    root: &Path,
    dest: &str,
    mode: Option<u32>,
    cap: u64,
) -> ApiResult<(u64, u64)> {
    let meta = tokio::fs::symlink_metadata(root)
        .await
        .map_err(|e| io_error(&format!("stat {}", root.display()), e))?;
    let mut budget = cap;
    if meta.is_file() {
        let size = upload_host_file(sandbox, root, dest, mode, &mut budget, cap).await?;
        return Ok((1, size));
    }
    if !meta.is_dir() {
        return Err(ApiError::invalid(format!(
            "{} is neither a file nor a folder",
            root.display()
        )));
    }
    let mut files = 0u64;
    sandbox.make_dir(dest).await?;
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(ApiError::invalid(format!(
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
            // Never followed: a link could lead outside the allowed folder.
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
                    return Err(ApiError::invalid(format!(
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

/// Puts files into the sandbox from an allowed host path, inline text or base64, or one
/// of your exports.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/import", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ImportRequest,
    responses(
        (status = 201, body = ImportResult),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The host path is outside import.allowed_paths", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 413, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn import(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ImportRequest>,
) -> ApiResult<(StatusCode, Json<ImportResult>)> {
    check_sandbox_id(&id)?;
    super::files::check_path(&req.path)?;
    if req.mode.is_some_and(|m| m > 0o7777) {
        return Err(ApiError::invalid(
            "mode must be permission bits (at most 0o7777)",
        ));
    }
    let sources = [
        req.host_path.is_some(),
        req.text.is_some(),
        req.base64.is_some(),
        req.export_id.is_some(),
    ];
    if sources.iter().filter(|b| **b).count() != 1 {
        return Err(ApiError::invalid(
            "give exactly one of host_path, text, base64 and export_id",
        ));
    }
    let cap = s.config.limits.max_upload_bytes;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let (files, bytes, source) = if let Some(text) = &req.text {
        let entry = sandbox
            .write_file(&req.path, text.as_bytes(), req.mode)
            .await?;
        (1, entry.size, serde_json::json!("text"))
    } else if let Some(b64) = &req.base64 {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| ApiError::invalid(format!("base64 is not valid: {e}")))?;
        let entry = sandbox.write_file(&req.path, &bytes, req.mode).await?;
        (1, entry.size, serde_json::json!("base64"))
    } else if let Some(raw) = &req.host_path {
        let host = allowed_host_path(&s, raw)?;
        let (f, b) = upload_host_tree(&sandbox, &host, &req.path, req.mode, cap).await?;
        (
            f,
            b,
            serde_json::json!({"host_path": host.display().to_string()}),
        )
    } else {
        let export_id = req.export_id.clone().unwrap_or_default();
        let export = own_export(&s, &caller, &export_id)?;
        let dir = PathBuf::from(
            export
                .stored_path
                .clone()
                .ok_or_else(|| ApiError::internal("the export has no stored copy"))?,
        );
        let stored = match export.kind {
            ExportKind::File => dir.join("data"),
            ExportKind::Dir => dir.join("tree"),
        };
        let (f, b) = upload_host_tree(&sandbox, &stored, &req.path, req.mode, cap).await?;
        (f, b, serde_json::json!({"export_id": export.id}))
    };
    // Answered as every file route answers a path: absolute, as the sandbox resolved it.
    let path = sandbox.stat(&req.path).await?.path;
    crate::audit(
        &s,
        &caller,
        "import",
        Some(&id),
        serde_json::json!({"path": path, "source": source, "files": files, "bytes": bytes}),
    );
    Ok((
        StatusCode::CREATED,
        Json(ImportResult { path, files, bytes }),
    ))
}

/// Lists the files code executions left in `/workspace/outputs` (plots saved, data
/// written), with their MIME types.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/artifacts", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = ArtifactList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn artifacts(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<ArtifactList>> {
    check_sandbox_id(&id)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let mut artifacts = Vec::new();
    let mut stack = vec![(ARTIFACTS_DIR.to_string(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let entries = match sandbox.list_dir(&dir).await {
            Ok(e) => e,
            // No outputs folder: no artifacts.
            Err(sandcell_engine::EngineError::Guest(w))
                if depth == 0 && w.code == sandcell_protocol::ErrorCode::NotFound =>
            {
                break;
            }
            Err(e) => return Err(e.into()),
        };
        for e in entries {
            match e.kind {
                FileKind::Dir if depth < MAX_DEPTH => stack.push((e.path, depth + 1)),
                FileKind::File => artifacts.push(Artifact {
                    mime: sandcell_protocol::mime_of_name(&e.name).to_string(),
                    path: e.path,
                    size: e.size,
                    mtime: e.mtime,
                }),
                _ => {}
            }
        }
    }
    artifacts.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Json(ArtifactList { artifacts }))
}

/// A name part no other request of this daemon is using at the same time.
fn unique_suffix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// The `expires` and `signature` of a signed link, when the query has them (both or none).
fn signed_link(query: Option<&str>) -> Result<Option<(i64, String)>, ApiError> {
    let (mut expires, mut signature) = (None, None);
    for (k, v) in super::extract::query_pairs(query)? {
        match k.as_str() {
            "expires" => {
                expires = Some(v.parse::<i64>().map_err(|_| {
                    ApiError::invalid(format!("'expires' must be unix seconds, got '{v}'"))
                })?);
            }
            "signature" => signature = Some(v),
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{k}' (this route takes: expires, signature)"
                )));
            }
        }
    }
    match (expires, signature) {
        (Some(e), Some(sig)) => Ok(Some((e, sig))),
        (None, None) => Ok(None),
        _ => Err(ApiError::invalid(
            "a signed link needs both 'expires' and 'signature'",
        )),
    }
}
