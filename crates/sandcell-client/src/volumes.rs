//! Named volumes: make, list, show, delete.

use reqwest::Method;
use sandcell_api::volumes::{CreateVolume, VolumeInfo, VolumeList};

use crate::{Client, ClientError, segment};

impl Client {
    /// `POST /v1/volumes`.
    pub async fn create_volume(&self, name: &str) -> Result<VolumeInfo, ClientError> {
        let req = CreateVolume {
            name: name.to_string(),
        };
        self.call(Method::POST, "/v1/volumes", Some(&req)).await
    }

    /// `GET /v1/volumes`.
    pub async fn volumes(&self) -> Result<VolumeList, ClientError> {
        self.call(Method::GET, "/v1/volumes", None::<&()>).await
    }

    /// `GET /v1/volumes/{volume}`.
    pub async fn volume(&self, name: &str) -> Result<VolumeInfo, ClientError> {
        let path = format!("/v1/volumes/{}", segment(name));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `DELETE /v1/volumes/{volume}`.
    pub async fn delete_volume(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/v1/volumes/{}", segment(name));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }
}
