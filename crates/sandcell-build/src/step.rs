//! Runs one build step through the helper (`sandcell __build-step`): its configuration on
//! stdin, its output streamed as events, its status read from the file it writes.

use std::path::Path;
use std::process::Stdio;

use sandcell_api::templates::BuildEvent;
use sandcell_jail::build::{BuildStepConfig, BuildStepStatus};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedSender;

use crate::{BuildError, Cancel};

/// Runs the step; output goes to `events` as step `index`'s (`None`: kept, returned).
pub(crate) async fn run(
    helper: &Path,
    config: &BuildStepConfig,
    index: u32,
    events: Option<&UnboundedSender<BuildEvent>>,
    cancel: &Cancel,
) -> Result<(BuildStepStatus, String), BuildError> {
    let mut child = tokio::process::Command::new(helper)
        .arg("__build-step")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(BuildError::io(format!("start {}", helper.display())))?;
    let input = serde_json::to_vec(config)
        .map_err(|e| BuildError::Invalid(format!("the step's configuration: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&input)
            .await
            .map_err(BuildError::io("give the build helper its step"))?;
    }
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out = pump(stdout, "stdout", index, events);
    let err = pump(stderr, "stderr", index, events);
    let waited = async {
        let (a, b, status) = tokio::join!(out, err, child.wait());
        (a + &b, status)
    };
    let (captured, status) = tokio::select! {
        done = waited => done,
        () = cancel.cancelled() => return Err(BuildError::Cancelled),
    };
    status.map_err(BuildError::io("wait for the build helper"))?;
    let text = std::fs::read(&config.status_file)
        .map_err(BuildError::io(format!("read {}", config.status_file)))?;
    let status = serde_json::from_slice(&text)
        .map_err(|e| BuildError::Invalid(format!("the build helper's status: {e}")))?;
    Ok((status, captured))
}

/// Forwards a stream as output events (or keeps it when there is nowhere to send it).
async fn pump(
    stream: Option<impl AsyncRead + Unpin>,
    name: &str,
    index: u32,
    events: Option<&UnboundedSender<BuildEvent>>,
) -> String {
    let Some(mut stream) = stream else {
        return String::new();
    };
    let mut kept = String::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        // Whole UTF-8 characters only: a character split across reads stays for the next.
        let cut = match std::str::from_utf8(&pending) {
            Ok(_) => pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => pending.len(),
        };
        let text = String::from_utf8_lossy(&pending[..cut]).into_owned();
        pending.drain(..cut);
        emit(events, index, name, text, &mut kept);
    }
    if !pending.is_empty() {
        let text = String::from_utf8_lossy(&pending).into_owned();
        emit(events, index, name, text, &mut kept);
    }
    kept
}

fn emit(
    events: Option<&UnboundedSender<BuildEvent>>,
    index: u32,
    stream: &str,
    text: String,
    kept: &mut String,
) {
    match events {
        Some(tx) => {
            let _ = tx.send(BuildEvent::Output {
                index,
                stream: stream.to_string(),
                text,
            });
        }
        None => kept.push_str(&text),
    }
}
