//! Files of a sandbox, transfers (imports, exports, artifacts), keys, usage and the system.

use reqwest::Method;
use sandcell_api::files::{FileInfo, FileList, MakeDir, Rename};
use sandcell_api::keys::{CreateKey, KeyList, NewKey};
use sandcell_api::system::SystemInfo;
use sandcell_api::transfer::{
    ArtifactList, CreateExport, ExportInfo, ExportList, ImportRequest, ImportResult,
};
use sandcell_api::usage::SandboxUsage;

use crate::{Body, Client, ClientError, query, segment};

fn files_path(id: &str, route: &str, pairs: &[(&str, &str)]) -> String {
    format!("/v1/sandboxes/{}/files{route}{}", segment(id), query(pairs))
}

impl Client {
    /// `GET /v1/sandboxes/{id}/files?path=`: a directory's entries.
    pub async fn list_files(&self, id: &str, path: &str) -> Result<FileList, ClientError> {
        let path = files_path(id, "", &[("path", path)]);
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `GET /v1/sandboxes/{id}/files/stat?path=`.
    pub async fn stat_file(&self, id: &str, path: &str) -> Result<FileInfo, ClientError> {
        let path = files_path(id, "/stat", &[("path", path)]);
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `DELETE /v1/sandboxes/{id}/files?path=` (`recursive` for a non-empty directory).
    pub async fn remove_file(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<(), ClientError> {
        let recursive = if recursive { "true" } else { "false" };
        let path = files_path(id, "", &[("path", path), ("recursive", recursive)]);
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/files/mkdir`.
    pub async fn make_dir(&self, id: &str, req: &MakeDir) -> Result<FileInfo, ClientError> {
        let path = files_path(id, "/mkdir", &[]);
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `POST /v1/sandboxes/{id}/files/rename`.
    pub async fn rename_file(&self, id: &str, req: &Rename) -> Result<FileInfo, ClientError> {
        let path = files_path(id, "/rename", &[]);
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `PUT /v1/sandboxes/{id}/files/content?path=`: writes `body` (bytes, or a stream from
    /// [`Client::file_body`]) to a file.
    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        body: Body,
    ) -> Result<FileInfo, ClientError> {
        let path = files_path(id, "/content", &[("path", path)]);
        self.upload(Method::PUT, &path, body).await
    }

    /// `GET /v1/sandboxes/{id}/files/content?path=`: the file's bytes, chunk by chunk, to
    /// `sink`; the byte count.
    pub async fn read_file(
        &self,
        id: &str,
        path: &str,
        sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<u64, ClientError> {
        let path = files_path(id, "/content", &[("path", path)]);
        self.download(&path, sink).await
    }

    /// `POST /v1/sandboxes/{id}/import`.
    pub async fn import(&self, id: &str, req: &ImportRequest) -> Result<ImportResult, ClientError> {
        let path = format!("/v1/sandboxes/{}/import", segment(id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `GET /v1/sandboxes/{id}/artifacts`.
    pub async fn artifacts(&self, id: &str) -> Result<ArtifactList, ClientError> {
        let path = format!("/v1/sandboxes/{}/artifacts", segment(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/exports`.
    pub async fn create_export(
        &self,
        id: &str,
        req: &CreateExport,
    ) -> Result<ExportInfo, ClientError> {
        let path = format!("/v1/sandboxes/{}/exports", segment(id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `GET /v1/exports`.
    pub async fn exports(&self) -> Result<ExportList, ClientError> {
        self.call(Method::GET, "/v1/exports", None::<&()>).await
    }

    /// `GET /v1/exports/{id}`.
    pub async fn export(&self, export_id: &str) -> Result<ExportInfo, ClientError> {
        let path = format!("/v1/exports/{}", segment(export_id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `DELETE /v1/exports/{id}`.
    pub async fn delete_export(&self, export_id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/exports/{}", segment(export_id));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }

    /// `GET /v1/exports/{id}/content`: the bytes (a folder's as a tar), chunk by chunk.
    pub async fn download_export(
        &self,
        export_id: &str,
        sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<u64, ClientError> {
        let path = format!("/v1/exports/{}/content", segment(export_id));
        self.download(&path, sink).await
    }

    /// `GET /v1/sandboxes/{id}/metrics`: what it uses now.
    pub async fn sandbox_usage(&self, id: &str) -> Result<SandboxUsage, ClientError> {
        let path = format!("/v1/sandboxes/{}/metrics", segment(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `GET /v1/system`.
    pub async fn system(&self) -> Result<SystemInfo, ClientError> {
        self.call(Method::GET, "/v1/system", None::<&()>).await
    }

    /// `POST /v1/keys`.
    pub async fn create_key(&self, req: &CreateKey) -> Result<NewKey, ClientError> {
        self.call(Method::POST, "/v1/keys", Some(req)).await
    }

    /// `GET /v1/keys`.
    pub async fn keys(&self) -> Result<KeyList, ClientError> {
        self.call(Method::GET, "/v1/keys", None::<&()>).await
    }

    /// `DELETE /v1/keys/{id}`: revoked.
    pub async fn revoke_key(&self, key_id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/keys/{}", segment(key_id));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }

    /// `GET /metrics`: the Prometheus text.
    pub async fn metrics_text(&self) -> Result<String, ClientError> {
        let resp = self.send(self.request(Method::GET, "/metrics")).await?;
        resp.text().await.map_err(|source| ClientError::Transport {
            what: "read /metrics",
            source,
        })
    }
}
