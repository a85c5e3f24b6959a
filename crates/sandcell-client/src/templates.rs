//! Templates: start a build, follow its log, show and list builds and templates, delete one.

use reqwest::Method;
use sandcell_api::templates::{
    BuildInfo, BuildList, NumberedBuildEvent, StartBuild, TemplateInfo, TemplateList,
};

use crate::events::FromEvent;
use crate::sse::SseEvent;
use crate::{Client, ClientError, EventStream, query, segment};

/// A build's log event (`GET /v1/builds/{id}/logs`): its data is the numbered event.
impl FromEvent for NumberedBuildEvent {
    fn from_event(event: &SseEvent) -> Option<Result<Self, serde_json::Error>> {
        Some(serde_json::from_str(&event.data))
    }
}

impl Client {
    /// `POST /v1/templates`: the build as queued or running, or, with `req.wait`, as it ended.
    pub async fn start_build(&self, req: &StartBuild) -> Result<BuildInfo, ClientError> {
        self.call(Method::POST, "/v1/templates", Some(req)).await
    }

    /// `GET /v1/builds/{id}`.
    pub async fn build(&self, id: &str) -> Result<BuildInfo, ClientError> {
        let path = format!("/v1/builds/{}", segment(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `GET /v1/builds`.
    pub async fn builds(&self) -> Result<BuildList, ClientError> {
        self.call(Method::GET, "/v1/builds", None::<&()>).await
    }

    /// `POST /v1/builds/{id}/cancel`.
    pub async fn cancel_build(&self, id: &str) -> Result<BuildInfo, ClientError> {
        let path = format!("/v1/builds/{}/cancel", segment(id));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// Follows a build's log after event `after` (stored, then live, until `finished`).
    pub async fn follow_build(
        &self,
        id: &str,
        after: u64,
    ) -> Result<EventStream<NumberedBuildEvent>, ClientError> {
        let path = format!(
            "/v1/builds/{}/logs{}",
            segment(id),
            query(&[("after", after.to_string())])
        );
        let req = self
            .request(Method::GET, &path)
            .header("accept", "text/event-stream");
        Ok(EventStream::new(self.send(req).await?))
    }

    /// `GET /v1/templates`.
    pub async fn templates(&self) -> Result<TemplateList, ClientError> {
        self.call(Method::GET, "/v1/templates", None::<&()>).await
    }

    /// `GET /v1/templates/{name}`.
    pub async fn template(&self, name: &str) -> Result<TemplateInfo, ClientError> {
        let path = format!("/v1/templates/{}", segment(name));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `DELETE /v1/templates/{name}`.
    pub async fn delete_template(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/v1/templates/{}", segment(name));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }
}
