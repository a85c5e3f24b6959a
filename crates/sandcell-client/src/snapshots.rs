//! Snapshots: take, list, show, delete, fork; a sandbox's automatic snapshots.

use reqwest::Method;
use sandcell_api::snapshots::{
    AutoSnapshot, CreateSnapshot, ForkResult, ForkSnapshot, SnapshotInfo, SnapshotList,
};

use crate::{Client, ClientError, query, segment};

impl Client {
    /// `POST /v1/sandboxes/{id}/snapshots`.
    pub async fn create_snapshot(
        &self,
        sandbox_id: &str,
        req: &CreateSnapshot,
    ) -> Result<SnapshotInfo, ClientError> {
        let path = format!("/v1/sandboxes/{}/snapshots", segment(sandbox_id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `GET /v1/snapshots`, or only one sandbox's.
    pub async fn snapshots(&self, sandbox_id: Option<&str>) -> Result<SnapshotList, ClientError> {
        let q = match sandbox_id {
            Some(s) => query(&[("sandbox", s)]),
            None => String::new(),
        };
        self.call(Method::GET, &format!("/v1/snapshots{q}"), None::<&()>)
            .await
    }

    /// `GET /v1/snapshots/{id}`, with its lineage.
    pub async fn snapshot(&self, id: &str) -> Result<SnapshotInfo, ClientError> {
        let path = format!("/v1/snapshots/{}", segment(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `DELETE /v1/snapshots/{id}`.
    pub async fn delete_snapshot(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/snapshots/{}", segment(id));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }

    /// `POST /v1/snapshots/{id}/fork`: new sandboxes from it.
    pub async fn fork_snapshot(
        &self,
        id: &str,
        req: &ForkSnapshot,
    ) -> Result<ForkResult, ClientError> {
        let path = format!("/v1/snapshots/{}/fork", segment(id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `GET /v1/sandboxes/{id}/auto-snapshot`.
    pub async fn auto_snapshot(&self, sandbox_id: &str) -> Result<AutoSnapshot, ClientError> {
        let path = format!("/v1/sandboxes/{}/auto-snapshot", segment(sandbox_id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `PUT /v1/sandboxes/{id}/auto-snapshot`.
    pub async fn set_auto_snapshot(
        &self,
        sandbox_id: &str,
        req: &AutoSnapshot,
    ) -> Result<AutoSnapshot, ClientError> {
        let path = format!("/v1/sandboxes/{}/auto-snapshot", segment(sandbox_id));
        self.call(Method::PUT, &path, Some(req)).await
    }
}
