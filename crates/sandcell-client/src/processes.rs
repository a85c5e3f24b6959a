//! Background processes: start, follow, collect, stdin, resize, signal. (The terminal at
//! `/pty` is a WebSocket and not covered here.)

use reqwest::Method;
use sandcell_api::processes::{
    OutputFrom, ProcessOutput, ProcessStreamEvent, StartProcess, Started, TermSize,
};

use crate::{Body, Client, ClientError, EventStream, query, segment};

fn process_path(id: &str, pid: i32, route: &str) -> String {
    format!("/v1/sandboxes/{}/processes/{pid}{route}", segment(id))
}

fn from_query(from: OutputFrom) -> String {
    let mut pairs = Vec::new();
    pairs.extend(from.stdout_from.map(|o| ("stdout_from", o.to_string())));
    pairs.extend(from.stderr_from.map(|o| ("stderr_from", o.to_string())));
    query(&pairs)
}

impl Client {
    /// `POST /v1/sandboxes/{id}/processes`: a process in the background.
    pub async fn start_process(
        &self,
        id: &str,
        req: &StartProcess,
    ) -> Result<Started, ClientError> {
        let path = format!("/v1/sandboxes/{}/processes", segment(id));
        self.call(Method::POST, &path, Some(req)).await
    }

    /// `GET …/processes/{pid}/stream`: its output from the offsets asked, then `exit`.
    pub async fn follow_process(
        &self,
        id: &str,
        pid: i32,
        from: OutputFrom,
    ) -> Result<EventStream<ProcessStreamEvent>, ClientError> {
        let path = format!("{}{}", process_path(id, pid, "/stream"), from_query(from));
        let resp = self.send(self.request(Method::GET, &path)).await?;
        Ok(EventStream::new(resp))
    }

    /// `GET …/processes/{pid}/output`: waits for it to end; what it wrote.
    pub async fn process_output(
        &self,
        id: &str,
        pid: i32,
        from: OutputFrom,
    ) -> Result<ProcessOutput, ClientError> {
        let path = format!("{}{}", process_path(id, pid, "/output"), from_query(from));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `POST …/processes/{pid}/stdin`: writes `data` (and closes its stdin with `close`).
    pub async fn write_stdin(
        &self,
        id: &str,
        pid: i32,
        data: Vec<u8>,
        close: bool,
    ) -> Result<(), ClientError> {
        let q = if close { "?close=true" } else { "" };
        let path = format!("{}{q}", process_path(id, pid, "/stdin"));
        let req = self
            .request(Method::POST, &path)
            .header("content-type", "application/octet-stream")
            .body(Body::from(data));
        self.send(req).await.map(drop)
    }

    /// `POST …/processes/{pid}/resize`: its terminal's size.
    pub async fn resize_terminal(
        &self,
        id: &str,
        pid: i32,
        size: TermSize,
    ) -> Result<(), ClientError> {
        let path = process_path(id, pid, "/resize");
        self.call_empty(Method::POST, &path, Some(&size)).await
    }

    /// `DELETE …/processes/{pid}`: a signal (`TERM`, `KILL` by default, a number …), to its
    /// descendants too with `tree`.
    pub async fn signal_process(
        &self,
        id: &str,
        pid: i32,
        signal: Option<&str>,
        tree: bool,
    ) -> Result<(), ClientError> {
        let mut pairs = Vec::new();
        pairs.extend(signal.map(|s| ("signal", s.to_string())));
        if tree {
            pairs.push(("tree", "true".to_string()));
        }
        let path = format!("{}{}", process_path(id, pid, ""), query(&pairs));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }
}
