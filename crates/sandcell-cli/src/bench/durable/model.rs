//! The scripted model (`scripted-llm`, the test kit's server as a process) and its request
//! log, read as it grows: the log is how the benchmark sees when a request arrives (the
//! server writes each request's line as soon as it has read the body, before any delay the
//! script asks for). It uses no other module of `bench durable`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

/// The model runs name: the `openai` provider, pointed at the scripted server.
pub(super) const MODEL: &str = "openai/bench";

/// The scripted model server, stopped when dropped.
pub(super) struct Model {
    child: Child,
    /// Its OpenAI base URL (`agent.openai.base_url`).
    pub(super) base: String,
    log: PathBuf,
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Model {
    /// Starts `scripted-llm` answering `turns` in order, on a free loopback port, logging
    /// every request to a file in `dir`.
    pub(super) fn start(turns: &[Value], dir: &Path) -> anyhow::Result<Self> {
        let script = dir.join("model-script.json");
        std::fs::write(&script, Value::Array(turns.to_vec()).to_string())
            .context("write the model's script")?;
        let log = dir.join("model-requests.jsonl");
        let mut child = Command::new(super::super::host::scripted_llm_bin()?)
            .args(["--port", "0", "--script"])
            .arg(&script)
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("start scripted-llm")?;
        // It prints one line once it accepts connections, naming its port.
        let stdout = child.stdout.take().context("scripted-llm's stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("read scripted-llm's first line")?;
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("scripted-llm said {line:?}");
        };
        Ok(Self {
            base: format!("{url}/v1"),
            child,
            log,
        })
    }

    /// A reader of its request log from the start.
    pub(super) fn requests(&self) -> anyhow::Result<RequestLog> {
        let file = File::open(&self.log)
            .with_context(|| format!("open the model's log {}", self.log.display()))?;
        Ok(RequestLog { file, lines: 0 })
    }
}

/// The model's request log, read as it grows.
pub(super) struct RequestLog {
    file: File,
    lines: usize,
}

impl RequestLog {
    /// The requests the model has received so far.
    pub(super) fn count(&mut self) -> anyhow::Result<usize> {
        let mut new = Vec::new();
        self.file
            .read_to_end(&mut new)
            .context("read the model's request log")?;
        self.lines += new.iter().filter(|&&b| b == b'\n').count();
        Ok(self.lines)
    }

    /// Waits (blocking, checking every 0.2 ms) until more than `n` requests have arrived;
    /// when that was seen, or `None` after `timeout`.
    pub(super) fn wait_beyond(
        &mut self,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Option<Instant>> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.count()? > n {
                return Ok(Some(Instant::now()));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Waits (async, checking every 2 ms) until at least `n` requests have arrived.
    pub(super) async fn wait_for(&mut self, n: usize, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while self.count()? < n {
            if Instant::now() > deadline {
                bail!(
                    "the model received {} requests in {timeout:?}, not {n}",
                    self.lines
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }
}

/// A turn calling `execute_code` with `code`.
pub(super) fn code_call(code: &str) -> Value {
    json!({"tool_calls": [{"name": "execute_code", "arguments": {"code": code}}]})
}

/// A turn answering `text`.
pub(super) fn text(text: &str) -> Value {
    json!({"text": text})
}

/// A turn answering `text` after `delay_ms`.
pub(super) fn slow(delay_ms: u64, text: &str) -> Value {
    json!({"slow": {"delay_ms": delay_ms, "then": {"text": text}}})
}
