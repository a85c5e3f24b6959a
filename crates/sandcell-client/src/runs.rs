//! Agent runs: start, list, show, cancel, and their trajectories (read whole, or followed as
//! server-sent events).

use reqwest::Method;
use sandcell_api::runs::{
    CreateThread, ForkRun, RenameThread, RunInfo, RunList, StartRun, StepSandbox, ThreadInfo,
    ThreadList,
};
use serde::Deserialize;
use serde_json::Value;

use crate::{Client, ClientError, EventStream, query, segment};

/// Most events one `format=json` answer holds (the route's own cap).
const EVENTS_PAGE: usize = 1000;

/// The answer of `GET /v1/runs/{id}/events?format=json`.
#[derive(Debug, Deserialize)]
struct EventPage {
    events: Vec<Value>,
}

impl Client {
    /// `POST /v1/runs`: the run as it started (`running`), or, with `req.wait`, as it ended.
    pub async fn start_run(&self, req: &StartRun) -> Result<RunInfo, ClientError> {
        self.call(Method::POST, "/v1/runs", Some(req)).await
    }

    /// `GET /v1/runs/{id}`.
    pub async fn run(&self, id: &str) -> Result<RunInfo, ClientError> {
        let path = format!("/v1/runs/{}", segment(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `GET /v1/runs`: the newest runs, at most `limit` (the daemon's default when `None`).
    pub async fn runs(&self, limit: Option<u32>) -> Result<RunList, ClientError> {
        let q = match limit {
            Some(n) => query(&[("limit", n.to_string())]),
            None => String::new(),
        };
        self.call(Method::GET, &format!("/v1/runs{q}"), None::<&()>)
            .await
    }

    /// `POST /v1/runs/{id}/cancel`: answers once the run's end is recorded.
    pub async fn cancel_run(&self, id: &str) -> Result<RunInfo, ClientError> {
        let path = format!("/v1/runs/{}/cancel", segment(id));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// `POST /v1/threads`.
    pub async fn create_thread(&self, req: &CreateThread) -> Result<ThreadInfo, ClientError> {
        self.call(Method::POST, "/v1/threads", Some(req)).await
    }

    /// `GET /v1/threads`: the caller's threads, the most recently used first.
    pub async fn threads(&self) -> Result<ThreadList, ClientError> {
        self.call(Method::GET, "/v1/threads", None::<&()>).await
    }

    /// `GET /v1/threads/{id}`.
    pub async fn thread(&self, id: &str) -> Result<ThreadInfo, ClientError> {
        let path = format!("/v1/threads/{}", segment(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `PATCH /v1/threads/{id}`.
    pub async fn rename_thread(&self, id: &str, name: &str) -> Result<ThreadInfo, ClientError> {
        let path = format!("/v1/threads/{}", segment(id));
        let req = RenameThread {
            name: name.to_string(),
        };
        self.call(Method::PATCH, &path, Some(&req)).await
    }

    /// `DELETE /v1/threads/{id}`: the thread and its sandbox (its runs stay).
    pub async fn delete_thread(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/threads/{}", segment(id));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }

    /// `POST /v1/runs/{id}/fork`: a new run from one of the run's committed steps.
    pub async fn fork_run(&self, id: &str, req: &ForkRun) -> Result<RunInfo, ClientError> {
        let path = format!("/v1/runs/{}/fork", segment(id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `POST /v1/runs/{id}/steps/{step}/sandbox`: a new sandbox as the run's was at the end
    /// of that step.
    pub async fn step_sandbox(&self, id: &str, step: u32) -> Result<StepSandbox, ClientError> {
        let path = format!("/v1/runs/{}/steps/{step}/sandbox", segment(id));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// `POST /v1/runs/{id}/resume`: takes up a run a stopped process left unfinished.
    pub async fn resume_run(&self, id: &str) -> Result<RunInfo, ClientError> {
        let path = format!("/v1/runs/{}/resume", segment(id));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// The run's stored events numbered after `after` (0: all), oldest first, read page by
    /// page (`GET /v1/runs/{id}/events?format=json`); a run going on has more later.
    pub async fn run_events(&self, id: &str, after: u64) -> Result<Vec<Value>, ClientError> {
        let mut all = Vec::new();
        let mut after = after;
        loop {
            let path = format!(
                "/v1/runs/{}/events{}",
                segment(id),
                query(&[
                    ("format", "json".to_string()),
                    ("after", after.to_string()),
                    ("limit", EVENTS_PAGE.to_string()),
                ])
            );
            let page: EventPage = self.call(Method::GET, &path, None::<&()>).await?;
            let n = page.events.len();
            if let Some(last) = page.events.last().and_then(|e| e["seq"].as_u64()) {
                after = last;
            }
            all.extend(page.events);
            if n < EVENTS_PAGE {
                return Ok(all);
            }
        }
    }

    /// Follows the run's events numbered after `after` (`GET /v1/runs/{id}/events` as
    /// server-sent events): the stored ones, then the live ones as they happen; the stream
    /// ends after `run_finished`. Should it break, follow again from the last `seq` seen.
    pub async fn follow_run(
        &self,
        id: &str,
        after: u64,
    ) -> Result<EventStream<Value>, ClientError> {
        let path = format!(
            "/v1/runs/{}/events{}",
            segment(id),
            query(&[("after", after.to_string())])
        );
        let req = self
            .request(Method::GET, &path)
            .header("accept", "text/event-stream");
        Ok(EventStream::new(self.send(req).await?))
    }
}
