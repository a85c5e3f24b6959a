//! Memories of a sandbox (`sandbox_id` given) or of the caller (`None`): add, search, list,
//! show, delete; infer jobs (facts extracted by the daemon's model): start, show, list, wait.

use reqwest::Method;
use std::time::{Duration, Instant};

use sandcell_api::memories::{
    AddMemory, InferJob, InferJobList, InferMemories, ListInferJobs, ListMemories, Memory,
    MemoryList, SearchMemories,
};

use crate::{Client, ClientError, query, segment};

/// The memories route of a scope: a sandbox's, or the caller's own.
fn base(sandbox_id: Option<&str>) -> String {
    match sandbox_id {
        Some(id) => format!("/v1/sandboxes/{}/memories", segment(id)),
        None => "/v1/memories".to_string(),
    }
}

impl Client {
    /// `POST /v1/sandboxes/{id}/memories`, or `POST /v1/memories` without a sandbox.
    pub async fn add_memory(
        &self,
        sandbox_id: Option<&str>,
        req: &AddMemory,
    ) -> Result<Memory, ClientError> {
        self.call(Method::POST, &base(sandbox_id), Some(req)).await
    }

    /// `GET …/memories/search`: the scope's memories matching the query's words, most
    /// relevant first.
    pub async fn search_memories(
        &self,
        sandbox_id: Option<&str>,
        req: &SearchMemories,
    ) -> Result<MemoryList, ClientError> {
        let mut pairs = vec![("q", req.query.to_string())];
        if let Some(n) = req.limit {
            pairs.push(("limit", n.to_string()));
        }
        if let Some(c) = &req.category {
            pairs.push(("category", c.to_string()));
        }
        let path = format!("{}/search{}", base(sandbox_id), query(&pairs));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `GET …/memories`: a page of the scope's memories, newest first.
    pub async fn memories(
        &self,
        sandbox_id: Option<&str>,
        req: &ListMemories,
    ) -> Result<MemoryList, ClientError> {
        let mut pairs = Vec::new();
        if let Some(n) = req.limit {
            pairs.push(("limit", n.to_string()));
        }
        if let Some(c) = &req.cursor {
            pairs.push(("cursor", c.clone()));
        }
        if let Some(c) = &req.category {
            pairs.push(("category", c.to_string()));
        }
        let path = format!("{}{}", base(sandbox_id), query(&pairs));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `GET …/memories/{memory_id}` (without a sandbox: any of the caller's memories).
    pub async fn memory(
        &self,
        sandbox_id: Option<&str>,
        memory_id: &str,
    ) -> Result<Memory, ClientError> {
        let path = format!("{}/{}", base(sandbox_id), segment(memory_id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `DELETE …/memories/{memory_id}` (without a sandbox: any of the caller's memories).
    pub async fn delete_memory(
        &self,
        sandbox_id: Option<&str>,
        memory_id: &str,
    ) -> Result<(), ClientError> {
        let path = format!("{}/{}", base(sandbox_id), segment(memory_id));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }
}

impl Client {
    /// `POST …/memories/infer`: starts extracting facts from a text with the daemon's model;
    /// the job, `queued`.
    pub async fn infer_memories(
        &self,
        sandbox_id: Option<&str>,
        req: &InferMemories,
    ) -> Result<InferJob, ClientError> {
        let path = format!("{}/infer", base(sandbox_id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `GET …/memories/infer/{job_id}` (without a sandbox: any of the caller's jobs).
    pub async fn infer_job(
        &self,
        sandbox_id: Option<&str>,
        job_id: &str,
    ) -> Result<InferJob, ClientError> {
        let path = format!("{}/infer/{}", base(sandbox_id), segment(job_id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `GET …/memories/infer`: a page of the scope's infer jobs, newest first.
    pub async fn infer_jobs(
        &self,
        sandbox_id: Option<&str>,
        req: &ListInferJobs,
    ) -> Result<InferJobList, ClientError> {
        let mut pairs = Vec::new();
        if let Some(n) = req.limit {
            pairs.push(("limit", n.to_string()));
        }
        if let Some(c) = &req.cursor {
            pairs.push(("cursor", c.clone()));
        }
        let path = format!("{}/infer{}", base(sandbox_id), query(&pairs));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// Polls an infer job until it has ended or `timeout` has passed; the job as it then is.
    pub async fn wait_infer_job(
        &self,
        sandbox_id: Option<&str>,
        job_id: &str,
        timeout: Duration,
    ) -> Result<InferJob, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            let job = self.infer_job(sandbox_id, job_id).await?;
            if job.status.is_done() || Instant::now() >= deadline {
                return Ok(job);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_have_their_routes() {
        assert_eq!(base(None), "/v1/memories");
        assert_eq!(base(Some("sb-1a2b")), "/v1/sandboxes/sb-1a2b/memories");
    }
}
