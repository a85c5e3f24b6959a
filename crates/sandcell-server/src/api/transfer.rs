//! Moving files between sandboxes and the host: exports (a file or folder copied out of a
//! sandbox and kept by the service, downloadable and importable into other sandboxes after
//! the first one is gone), imports (from an allowed host path, inline text or base64, or an
//! export), and the artifacts folder. The work is the service's (`sandcell_service::transfer`).

use axum::Json;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sandcell_api::SandboxId;
use sandcell_api::transfer::{
    ArtifactList, CreateExport, ExportInfo, ExportList, ImportRequest, ImportResult,
};
use sandcell_service::transfer::ExportAccess;

use super::extract::{ApiJson, ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Copies a file or folder out of the sandbox into the service's keeping.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exports", tag = "files",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
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
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<CreateExport>,
) -> ApiResult<(StatusCode, Json<ExportInfo>)> {
    let info = s.service.create_export(&caller, &id, req).await?;
    Ok((StatusCode::CREATED, Json(info)))
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
            "sandbox_id" => sandbox = Some(SandboxId::parse(v)?),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (sandbox_id)"
                )));
            }
        }
    }
    Ok(Json(s.service.list_exports(&caller, sandbox.as_ref())?))
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
    Ok(Json(s.service.get_export(&caller, &export_id)?))
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
    s.service.delete_export(&caller, &export_id).await?;
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
    let content = match signed_link(query.as_deref())? {
        Some((expires, signature)) => {
            let access = ExportAccess::SignedLink {
                expires,
                signature: &signature,
            };
            s.service.export_content(access, &export_id).await?
        }
        None => {
            let caller = caller?;
            let access = ExportAccess::Caller(&caller);
            s.service.export_content(access, &export_id).await?
        }
    };
    let mut resp =
        Body::from_stream(tokio_util::io::ReaderStream::new(content.file)).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content.content_type),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(content.length));
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"{}\"",
        content.filename.replace(['"', '\\', '\r', '\n'], "_")
    )) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

/// Puts files into the sandbox from an allowed host path, inline text or base64, or one
/// of your exports.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/import", tag = "files",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
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
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<ImportRequest>,
) -> ApiResult<(StatusCode, Json<ImportResult>)> {
    let done = s.service.import(&caller, &id, req).await?;
    Ok((StatusCode::CREATED, Json(done)))
}

/// Lists the files code executions left in `/workspace/outputs` (plots saved, data
/// written), with their MIME types.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/artifacts", tag = "files",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
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
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<ArtifactList>> {
    Ok(Json(s.service.list_artifacts(&caller, &id).await?))
}

/// The `expires` and `signature` of a signed link, when the query has them (both or none).
fn signed_link(query: Option<&str>) -> Result<Option<(i64, String)>, ApiError> {
    let (mut expires, mut signature) = (None, None);
    for (k, v) in query_pairs(query)? {
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
