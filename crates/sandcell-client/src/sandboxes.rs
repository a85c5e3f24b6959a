//! `/v1/sandboxes`, and what runs in one: exec, code, contexts, processes.

use reqwest::Method;
use sandcell_api::Seconds;
use sandcell_api::code::{
    CodeInput, CodeResult, CodeStreamEvent, ContextView, CreateContext, SetVariables,
    VariableNames, VariablesView,
};
use sandcell_api::exec::{ExecInput, ExecOutput, ExecStreamEvent};
use sandcell_api::git::{GitClone, GitCloneResult};
use sandcell_api::network::{EgressEventList, NetworkInfo, NetworkPolicy, SetNetwork};
use sandcell_api::processes::ProcessList;
use sandcell_api::sandboxes::{
    CreateSandbox, SandboxInfo, SandboxList, SecretInput, SecretList, SetSecrets, SetTimeout,
};

use crate::{Client, ClientError, EventStream, query, segment};

/// `GET /v1/sandboxes`: which sandboxes, one page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListSandboxes {
    /// Only these states (`all` for every state; none: the active ones).
    pub states: Vec<String>,
    /// Labels that must match.
    pub labels: Vec<(String, String)>,
    /// Metadata that must match.
    pub metadata: Vec<(String, String)>,
    /// At most this many (1 to 1000).
    pub limit: Option<u32>,
    /// The previous page's `next_cursor`.
    pub cursor: Option<String>,
}

impl ListSandboxes {
    fn query(&self) -> String {
        let mut pairs: Vec<(&str, String)> = Vec::new();
        pairs.extend(
            self.labels
                .iter()
                .map(|(k, v)| ("label", format!("{k}:{v}"))),
        );
        pairs.extend(
            self.metadata
                .iter()
                .map(|(k, v)| ("metadata", format!("{k}:{v}"))),
        );
        pairs.extend(self.states.iter().map(|s| ("state", s.clone())));
        pairs.extend(self.limit.map(|l| ("limit", l.to_string())));
        pairs.extend(self.cursor.clone().map(|c| ("cursor", c)));
        query(&pairs)
    }
}

fn sandbox_path(id: &str) -> String {
    format!("/v1/sandboxes/{}", segment(id))
}

impl Client {
    /// `POST /v1/sandboxes`: a new sandbox, or one restored from a snapshot.
    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<SandboxInfo, ClientError> {
        self.call(Method::POST, "/v1/sandboxes", Some(req)).await
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn sandbox(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        self.call(Method::GET, &sandbox_path(id), None::<&()>).await
    }

    /// `GET /v1/sandboxes`: one page.
    pub async fn list_sandboxes(&self, req: &ListSandboxes) -> Result<SandboxList, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/sandboxes{}", req.query()),
            None::<&()>,
        )
        .await
    }

    /// Every page of `GET /v1/sandboxes` (`req.cursor` is where it starts).
    pub async fn all_sandboxes(
        &self,
        req: &ListSandboxes,
    ) -> Result<Vec<SandboxInfo>, ClientError> {
        let mut req = req.clone();
        let mut items = Vec::new();
        loop {
            let page = self.list_sandboxes(&req).await?;
            items.extend(page.items);
            match page.next_cursor {
                Some(next) => req.cursor = Some(next),
                None => return Ok(items),
            }
        }
    }

    /// `DELETE /v1/sandboxes/{id}`: stopped, everything it held freed.
    pub async fn delete_sandbox(&self, id: &str) -> Result<(), ClientError> {
        self.call_empty(Method::DELETE, &sandbox_path(id), None::<&()>)
            .await
    }

    /// `POST /v1/sandboxes/{id}/timeout`: a new lifetime from now.
    pub async fn set_sandbox_timeout(
        &self,
        id: &str,
        timeout: Seconds,
    ) -> Result<SandboxInfo, ClientError> {
        let path = format!("{}/timeout", sandbox_path(id));
        self.call(
            Method::POST,
            &path,
            Some(&SetTimeout {
                timeout_secs: timeout,
            }),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/pause`.
    pub async fn pause_sandbox(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        let path = format!("{}/pause", sandbox_path(id));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/git/clone`.
    pub async fn git_clone(&self, id: &str, req: &GitClone) -> Result<GitCloneResult, ClientError> {
        let path = format!("{}/git/clone", sandbox_path(id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `GET /v1/sandboxes/{id}/network`.
    pub async fn sandbox_network(&self, id: &str) -> Result<NetworkInfo, ClientError> {
        let path = format!("{}/network", sandbox_path(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `PUT /v1/sandboxes/{id}/network`.
    pub async fn set_sandbox_network(
        &self,
        id: &str,
        network: &NetworkPolicy,
    ) -> Result<NetworkInfo, ClientError> {
        let path = format!("{}/network", sandbox_path(id));
        let body = SetNetwork {
            network: network.clone(),
        };
        self.call(Method::PUT, &path, Some(&body)).await
    }

    /// `GET /v1/sandboxes/{id}/secrets`: names, placeholders, hosts; never values.
    pub async fn sandbox_secrets(&self, id: &str) -> Result<SecretList, ClientError> {
        let path = format!("{}/secrets", sandbox_path(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `PUT /v1/sandboxes/{id}/secrets`: replaces its secrets.
    pub async fn set_sandbox_secrets(
        &self,
        id: &str,
        secrets: &[SecretInput],
    ) -> Result<SecretList, ClientError> {
        let path = format!("{}/secrets", sandbox_path(id));
        let body = SetSecrets {
            secrets: secrets.to_vec(),
        };
        self.call(Method::PUT, &path, Some(&body)).await
    }

    /// `GET /v1/sandboxes/{id}/network/events`: newest first, older than event `before`.
    pub async fn egress_events(
        &self,
        id: &str,
        before: Option<i64>,
        limit: Option<u32>,
    ) -> Result<EgressEventList, ClientError> {
        let mut pairs: Vec<(&str, String)> = Vec::new();
        if let Some(b) = before {
            pairs.push(("before", b.to_string()));
        }
        if let Some(l) = limit {
            pairs.push(("limit", l.to_string()));
        }
        let path = format!("{}/network/events{}", sandbox_path(id), query(&pairs));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/resume`.
    pub async fn resume_sandbox(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        let path = format!("{}/resume", sandbox_path(id));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/exec`: runs a command to its end.
    pub async fn exec(&self, id: &str, req: &ExecInput) -> Result<ExecOutput, ClientError> {
        let path = format!("{}/exec", sandbox_path(id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `POST /v1/sandboxes/{id}/exec/stream`: its output as it comes, then `exit`.
    pub async fn exec_stream(
        &self,
        id: &str,
        req: &ExecInput,
    ) -> Result<EventStream<ExecStreamEvent>, ClientError> {
        self.stream(&format!("{}/exec/stream", sandbox_path(id)), req)
            .await
    }

    /// `POST /v1/sandboxes/{id}/code`: runs code in a kernel to its end.
    pub async fn run_code(&self, id: &str, req: &CodeInput) -> Result<CodeResult, ClientError> {
        let path = format!("{}/code", sandbox_path(id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `POST /v1/sandboxes/{id}/code/stream`: its events as they come, then `done`.
    pub async fn run_code_stream(
        &self,
        id: &str,
        req: &CodeInput,
    ) -> Result<EventStream<CodeStreamEvent>, ClientError> {
        self.stream(&format!("{}/code/stream", sandbox_path(id)), req)
            .await
    }

    /// `GET /v1/sandboxes/{id}/contexts`.
    pub async fn contexts(&self, id: &str) -> Result<Vec<ContextView>, ClientError> {
        let path = format!("{}/contexts", sandbox_path(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/contexts`: a kernel of its own.
    pub async fn create_context(
        &self,
        id: &str,
        req: &CreateContext,
    ) -> Result<ContextView, ClientError> {
        let path = format!("{}/contexts", sandbox_path(id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `DELETE /v1/sandboxes/{id}/contexts/{context}`.
    pub async fn delete_context(&self, id: &str, context: &str) -> Result<(), ClientError> {
        let path = format!("{}/contexts/{}", sandbox_path(id), segment(context));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/contexts/{context}/interrupt`.
    pub async fn interrupt(&self, id: &str, context: &str) -> Result<(), ClientError> {
        let path = format!(
            "{}/contexts/{}/interrupt",
            sandbox_path(id),
            segment(context)
        );
        self.call_empty(Method::POST, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/contexts/{context}/restart`: a fresh kernel.
    pub async fn restart_context(
        &self,
        id: &str,
        context: &str,
    ) -> Result<ContextView, ClientError> {
        let path = format!("{}/contexts/{}/restart", sandbox_path(id), segment(context));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// `GET …/contexts/{context}/variables` (all of them without `names`).
    pub async fn variables(
        &self,
        id: &str,
        context: &str,
        names: Option<&[String]>,
    ) -> Result<VariablesView, ClientError> {
        let path = variables_path(id, context, names);
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `PUT …/contexts/{context}/variables`.
    pub async fn set_variables(
        &self,
        id: &str,
        context: &str,
        req: &SetVariables,
    ) -> Result<VariableNames, ClientError> {
        let path = variables_path(id, context, None);
        self.call(Method::PUT, &path, Some(req)).await
    }

    /// `DELETE …/contexts/{context}/variables` (all of them without `names`).
    pub async fn clear_variables(
        &self,
        id: &str,
        context: &str,
        names: Option<&[String]>,
    ) -> Result<VariableNames, ClientError> {
        let path = variables_path(id, context, names);
        self.call(Method::DELETE, &path, None::<&()>).await
    }

    /// `GET /v1/sandboxes/{id}/processes`.
    pub async fn processes(&self, id: &str) -> Result<ProcessList, ClientError> {
        let path = format!("{}/processes", sandbox_path(id));
        self.call(Method::GET, &path, None::<&()>).await
    }
}

fn variables_path(id: &str, context: &str, names: Option<&[String]>) -> String {
    let q = match names {
        Some(n) => query(&[("names", n.join(","))]),
        None => String::new(),
    };
    format!(
        "{}/contexts/{}/variables{q}",
        sandbox_path(id),
        segment(context)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_queries_say_what_the_server_reads() {
        assert_eq!(ListSandboxes::default().query(), "");
        let req = ListSandboxes {
            states: vec!["all".into()],
            labels: vec![("team".into(), "ml ops".into())],
            metadata: vec![("run".into(), "7".into())],
            limit: Some(10),
            cursor: Some("c1".into()),
        };
        assert_eq!(
            req.query(),
            "?label=team%3Aml+ops&metadata=run%3A7&state=all&limit=10&cursor=c1"
        );
        assert_eq!(
            variables_path("sb-1", "python", Some(&["a".into(), "b".into()])),
            "/v1/sandboxes/sb-1/contexts/python/variables?names=a%2Cb"
        );
    }
}
