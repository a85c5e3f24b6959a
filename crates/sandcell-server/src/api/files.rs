//! `/v1/sandboxes/{id}/files…`: list, stat, mkdir, remove, rename, and file contents streamed
//! both ways (any size up to `limits.max_upload_bytes`).

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandcell_api::files::{FileInfo, FileList, MakeDir, Rename};
use sandcell_protocol::FileKind;

use super::extract::{ApiJson, ApiPath, check_sandbox_id, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Longest path accepted (the kernel's PATH_MAX).
const MAX_PATH: usize = 4096;

/// The query of the file routes: `path`, and for some `recursive`, `mode`, `append`.
#[derive(Debug, Default)]
struct FileQuery {
    path: Option<String>,
    recursive: bool,
    mode: Option<u32>,
    append: bool,
}

fn flag(name: &str, v: &str) -> Result<bool, ApiError> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::invalid(format!(
            "'{name}' must be true or false, got '{v}'"
        ))),
    }
}

fn file_query(raw: Option<&str>, allowed: &[&str]) -> Result<FileQuery, ApiError> {
    let mut q = FileQuery::default();
    for (k, v) in query_pairs(raw)? {
        if !allowed.contains(&k.as_str()) {
            return Err(ApiError::invalid(format!(
                "unknown query parameter '{k}' (this route takes: {})",
                allowed.join(", ")
            )));
        }
        match k.as_str() {
            "path" => q.path = Some(v),
            "recursive" => q.recursive = flag("recursive", &v)?,
            "append" => q.append = flag("append", &v)?,
            "mode" => {
                let mode = u32::from_str_radix(v.trim_start_matches("0o"), 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| {
                        ApiError::invalid(format!(
                            "'mode' must be octal permission bits like 644 or 0o755, got '{v}'"
                        ))
                    })?;
                q.mode = Some(mode);
            }
            _ => {}
        }
    }
    Ok(q)
}

/// Checks a path's shape; whether it stays inside the sandbox's folders is the agent's call
/// (it resolves every component without following links out).
pub(crate) fn check_path(path: &str) -> Result<(), ApiError> {
    if path.is_empty() || path.len() > MAX_PATH || path.contains('\0') {
        return Err(ApiError::invalid(format!(
            "a path must be 1 to {MAX_PATH} bytes without NUL"
        )));
    }
    Ok(())
}

fn required_path(q: &FileQuery) -> Result<String, ApiError> {
    let path = q
        .path
        .clone()
        .ok_or_else(|| ApiError::invalid("the 'path' query parameter is required"))?;
    check_path(&path)?;
    Ok(path)
}

/// Lists a directory.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("path" = Option<String>, Query, description = "Directory (default /workspace)"),
    ),
    responses(
        (status = 200, body = FileList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<FileList>> {
    check_sandbox_id(&id)?;
    let q = file_query(raw.as_deref(), &["path"])?;
    let path = q.path.unwrap_or_else(|| "/workspace".into());
    check_path(&path)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let entries = sandbox.list_dir(&path).await?;
    Ok(Json(FileList {
        entries: entries.into_iter().map(FileInfo::from).collect(),
    }))
}

/// Removes a file, or a directory (`recursive=true` for a non-empty one).
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("path" = String, Query, description = "What to remove"),
        ("recursive" = Option<bool>, Query, description = "Remove a directory with its contents"),
    ),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A non-empty directory without recursive", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn remove(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<StatusCode> {
    check_sandbox_id(&id)?;
    let q = file_query(raw.as_deref(), &["path", "recursive"])?;
    let path = required_path(&q)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    sandbox.remove(&path, q.recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Describes one path (a final symlink is not followed).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("path" = String, Query, description = "The path"),
    ),
    responses(
        (status = 200, body = FileInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn stat(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<FileInfo>> {
    check_sandbox_id(&id)?;
    let q = file_query(raw.as_deref(), &["path"])?;
    let path = required_path(&q)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    Ok(Json(sandbox.stat(&path).await?.into()))
}

/// Creates a directory and its parents.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MakeDir,
    responses(
        (status = 201, body = FileInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn mkdir(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<MakeDir>,
) -> ApiResult<(StatusCode, Json<FileInfo>)> {
    check_sandbox_id(&id)?;
    check_path(&req.path)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let entry = sandbox.make_dir(&req.path).await?;
    Ok((StatusCode::CREATED, Json(entry.into())))
}

/// Moves a file or directory.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/rename", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = Rename,
    responses(
        (status = 200, description = "The moved entry", body = FileInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn rename(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<Rename>,
) -> ApiResult<Json<FileInfo>> {
    check_sandbox_id(&id)?;
    check_path(&req.from)?;
    check_path(&req.to)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    Ok(Json(sandbox.rename(&req.from, &req.to).await?.into()))
}

/// Downloads a file, streamed.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/content", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("path" = String, Query, description = "The file"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 413, description = "Over limits.max_upload_bytes", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn download(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    check_sandbox_id(&id)?;
    let q = file_query(raw.as_deref(), &["path"])?;
    let path = required_path(&q)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let entry = sandbox.stat(&path).await?;
    if entry.is_dir {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "is_a_directory",
            format!("{path} is a directory: list it, or export it as an archive"),
        ));
    }
    let cap = s.config.limits.max_upload_bytes;
    if entry.size > cap {
        return Err(too_large(cap));
    }
    let mut download = sandbox.begin_download(&path).await?;
    // The agent refuses what it will not read (a link leading out of the sandbox, a file gone
    // since the stat) in its first answer: taken before the 200 goes out, the refusal is an
    // error answer rather than a body cut short.
    let first = match download.next_chunk().await {
        Some(Err(e)) => return Err(e.into()),
        first => first,
    };
    let rest = futures_util::stream::unfold(download, |mut d| async move {
        let next = d.next_chunk().await?;
        Some((next, d))
    });
    let chunks = futures_util::stream::iter(first).chain(rest).map(|next| {
        next.map(Bytes::from)
            .map_err(|e| std::io::Error::other(e.to_string()))
    });
    let mut resp = Body::from_stream(chunks).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    // The size at stat time: a file that changes while it streams ends the body early, and
    // the client sees a length mismatch rather than silently short data. A link's own size is
    // not its file's, so a link's body goes without a length.
    if entry.kind == FileKind::File {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(entry.size));
    }
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"{}\"",
        entry.name.replace(['"', '\\', '\r', '\n'], "_")
    )) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

fn too_large(cap: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("files are limited to {cap} bytes (limits.max_upload_bytes)"),
    )
}

/// Uploads a file, streamed: the body's bytes become the file, written to a temporary name
/// and moved into place when complete (an interrupted upload leaves the old file as it was).
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/files/content", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("path" = String, Query, description = "The file (parents are created)"),
        ("mode" = Option<String>, Query, description = "Octal permission bits, e.g. 755"),
        ("append" = Option<bool>, Query, description = "Append instead of replacing"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 201, description = "Written", body = FileInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 413, description = "Over limits.max_upload_bytes", body = ErrorBody),
        (status = 507, description = "The sandbox's disk is full", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn upload(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    RawQuery(raw): RawQuery,
    body: Body,
) -> ApiResult<(StatusCode, Json<FileInfo>)> {
    check_sandbox_id(&id)?;
    let q = file_query(raw.as_deref(), &["path", "mode", "append"])?;
    let path = required_path(&q)?;
    let cap = s.config.limits.max_upload_bytes;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let mut upload = sandbox.begin_upload(&path, q.mode, q.append).await?;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                upload.abort().await;
                return Err(ApiError::invalid(format!("the upload broke off: {e}")));
            }
        };
        if upload.written() + chunk.len() as u64 > cap {
            upload.abort().await;
            return Err(too_large(cap));
        }
        upload.write(&chunk).await?;
    }
    let entry = upload.finish().await?;
    crate::audit(
        &s,
        &caller,
        "file.upload",
        Some(&id),
        serde_json::json!({"path": entry.path, "size": entry.size}),
    );
    Ok((StatusCode::CREATED, Json(entry.into())))
}
