//! `/v1/sandboxes/{id}/files…`: list, stat, mkdir, remove, rename, and file contents streamed
//! both ways (any size up to `limits.max_upload_bytes`).

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandcell_api::SandboxId;
use sandcell_api::files::{FileInfo, FileList, MakeDir, Rename};

use super::extract::{ApiJson, ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

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

fn required_path(q: FileQuery) -> Result<String, ApiError> {
    q.path
        .ok_or_else(|| ApiError::invalid("the 'path' query parameter is required"))
}

/// Lists a directory.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("path" = Option<String>, Query, description = "Directory (default /workspace)"),
    ),
    responses(
        (status = 200, body = FileList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The file's permissions inside the sandbox forbid it", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<FileList>> {
    let q = file_query(raw.as_deref(), &["path"])?;
    Ok(Json(
        s.service
            .list_files(&caller, &id, q.path.as_deref())
            .await?,
    ))
}

/// Removes a file, or a directory (`recursive=true` for a non-empty one).
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("path" = String, Query, description = "What to remove"),
        ("recursive" = Option<bool>, Query, description = "Remove a directory with its contents"),
    ),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The file's permissions inside the sandbox forbid it", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A non-empty directory without recursive", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn remove(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(raw): RawQuery,
) -> ApiResult<StatusCode> {
    let q = file_query(raw.as_deref(), &["path", "recursive"])?;
    let recursive = q.recursive;
    let path = required_path(q)?;
    s.service
        .remove_file(&caller, &id, &path, recursive)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Describes one path (a final symlink is not followed).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("path" = String, Query, description = "The path"),
    ),
    responses(
        (status = 200, body = FileInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The file's permissions inside the sandbox forbid it", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn stat(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<FileInfo>> {
    let q = file_query(raw.as_deref(), &["path"])?;
    let path = required_path(q)?;
    Ok(Json(s.service.stat_file(&caller, &id, &path).await?))
}

/// Creates a directory and its parents.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = MakeDir,
    responses(
        (status = 201, body = FileInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The file's permissions inside the sandbox forbid it", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn mkdir(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<MakeDir>,
) -> ApiResult<(StatusCode, Json<FileInfo>)> {
    let entry = s.service.make_dir(&caller, &id, req).await?;
    Ok((StatusCode::CREATED, Json(entry)))
}

/// Moves a file or directory.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/files/rename", tag = "files",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = Rename,
    responses(
        (status = 200, description = "The moved entry", body = FileInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The file's permissions inside the sandbox forbid it", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn rename(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<Rename>,
) -> ApiResult<Json<FileInfo>> {
    Ok(Json(s.service.rename_file(&caller, &id, req).await?))
}

/// Downloads a file, streamed.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/files/content", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("path" = String, Query, description = "The file"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The file's permissions inside the sandbox forbid it", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 413, description = "Over limits.max_upload_bytes", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn download(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let q = file_query(raw.as_deref(), &["path"])?;
    let path = required_path(q)?;
    let download = s.service.download_file(&caller, &id, &path).await?;
    let chunks = download.chunks.map(|next| {
        next.map(Bytes::from)
            .map_err(|e| std::io::Error::other(e.to_string()))
    });
    let mut resp = Body::from_stream(chunks).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(length) = download.length {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"{}\"",
        download.name.replace(['"', '\\', '\r', '\n'], "_")
    )) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

/// Uploads a file, streamed: the body's bytes become the file, written to a temporary name
/// and moved into place when complete (an interrupted upload leaves the old file as it was).
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/files/content", tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("path" = String, Query, description = "The file (parents are created)"),
        ("mode" = Option<String>, Query, description = "Octal permission bits, e.g. 755"),
        ("append" = Option<bool>, Query, description = "Append instead of replacing"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 201, description = "Written", body = FileInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The file's permissions inside the sandbox forbid it", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 413, description = "Over limits.max_upload_bytes", body = ErrorBody),
        (status = 507, description = "The sandbox's disk is full", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn upload(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(raw): RawQuery,
    body: Body,
) -> ApiResult<(StatusCode, Json<FileInfo>)> {
    let q = file_query(raw.as_deref(), &["path", "mode", "append"])?;
    let (mode, append) = (q.mode, q.append);
    let path = required_path(q)?;
    let entry = s
        .service
        .upload_file(&caller, &id, &path, mode, append, body.into_data_stream())
        .await?;
    Ok((StatusCode::CREATED, Json(entry)))
}
