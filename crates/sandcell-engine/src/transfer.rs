//! Files of any size in and out of a sandbox, a chunk at a time: an [`Upload`] is fed as its
//! bytes arrive (from an HTTP body, say) and an abandoned one leaves nothing behind; a
//! [`Download`] hands out the file's chunks as the agent reads them.

use sandcell_protocol::{Channel, FileEntry, GuestMessage, HostMessage};

use crate::client::{Call, Reply};
use crate::error::EngineError;
use crate::sandbox::{Sandbox, unexpected};

/// A file being written into a sandbox. Dropped or [`Upload::abort`]ed before
/// [`Upload::finish`], the partial file is removed and the target left as it was.
pub struct Upload {
    sandbox: Sandbox,
    call: Option<Call>,
    seq: u64,
    written: u64,
}

/// Chunks (of up to 256 KiB) a download lets the agent send ahead of its consumer: the
/// most a slow consumer makes the host hold per download (~4 MiB).
const READ_WINDOW: u32 = 16;

/// A file being read out of a sandbox, no faster than its chunks are taken: the agent sends
/// [`READ_WINDOW`] chunks ahead at most. Dropped before the end, the read stops in the
/// sandbox too.
pub struct Download {
    sandbox: Sandbox,
    call: Call,
    path: String,
    done: bool,
    /// Chunks taken since the agent was last granted more.
    taken_since_credit: u32,
}

impl Sandbox {
    /// Starts writing `path` (creating parent directories; replacing it atomically at
    /// [`Upload::finish`], or appending to it when `append`).
    pub async fn begin_upload(
        &self,
        path: &str,
        mode: Option<u32>,
        append: bool,
    ) -> Result<Upload, EngineError> {
        self.check_alive().await?;
        let call = self
            .client()
            .request(&HostMessage::WriteFile {
                path: path.to_string(),
                mode,
                append,
            })
            .await
            .map_err(|e| self.map_closed(e))?;
        Ok(Upload {
            sandbox: self.clone(),
            call: Some(call),
            seq: 0,
            written: 0,
        })
    }

    /// Starts reading `path`.
    pub async fn begin_download(&self, path: &str) -> Result<Download, EngineError> {
        self.check_alive().await?;
        let call = self
            .client()
            .request(&HostMessage::ReadFile {
                path: path.to_string(),
                window: Some(READ_WINDOW),
            })
            .await
            .map_err(|e| self.map_closed(e))?;
        Ok(Download {
            sandbox: self.clone(),
            call,
            path: path.to_string(),
            done: false,
            taken_since_credit: 0,
        })
    }
}

impl Upload {
    /// Sends the next bytes. Fails early when the agent already refused the write (a bad
    /// path, a full disk).
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), EngineError> {
        let Some(call) = self.call.as_mut() else {
            return Err(EngineError::InvalidRequest("the upload has ended".into()));
        };
        if let Some(reply) = call.try_next() {
            let err = match reply {
                Reply::Message(GuestMessage::Error(e)) => EngineError::Guest(e),
                Reply::Closed(reason) => self.sandbox.gone(reason),
                Reply::Message(m) => unexpected(m),
                Reply::Data(_) => EngineError::Connection("unexpected data chunk".into()),
            };
            // The agent has dropped the write already.
            self.call = None;
            return Err(err);
        }
        let id = call.id;
        self.seq = self
            .sandbox
            .client()
            .send_data(id, Channel::File, self.seq, bytes)
            .await
            .map_err(|e| self.sandbox.map_closed(e))?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Bytes sent so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Ends the data and returns the written file.
    pub async fn finish(mut self) -> Result<FileEntry, EngineError> {
        let Some(mut call) = self.call.take() else {
            return Err(EngineError::InvalidRequest("the upload has ended".into()));
        };
        let sandbox = self.sandbox.clone();
        sandbox
            .client()
            .send(call.id, &HostMessage::EndOfData)
            .await
            .map_err(|e| sandbox.map_closed(e))?;
        match sandbox.with_timeout(call.message()).await? {
            GuestMessage::Entry { entry } => Ok(entry),
            other => Err(unexpected(other)),
        }
    }

    /// Abandons the upload: the partial file is removed.
    pub async fn abort(mut self) {
        if let Some(call) = self.call.take() {
            let _ = self
                .sandbox
                .client()
                .send(call.id, &HostMessage::AbortData)
                .await;
        }
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        // Dropped mid-way (its HTTP request went away): tell the agent from a task, since
        // drop cannot wait.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let sandbox = self.sandbox.clone();
            rt.spawn(async move {
                let _ = sandbox
                    .client()
                    .send(call.id, &HostMessage::AbortData)
                    .await;
            });
        }
    }
}

impl Download {
    /// The next chunk, or `None` at the end of the file.
    pub async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, EngineError>> {
        if self.done {
            return None;
        }
        let reply = self
            .sandbox
            .with_timeout(async { Ok(self.call.next().await) })
            .await;
        let out = match reply {
            Ok(Reply::Data(chunk)) => {
                self.taken_since_credit += 1;
                // Granted in halves of the window, so the agent never waits on a round trip.
                if self.taken_since_credit >= READ_WINDOW / 2 {
                    let chunks = std::mem::take(&mut self.taken_since_credit);
                    let granted = self
                        .sandbox
                        .client()
                        .send(self.call.id, &HostMessage::ReadCredit { chunks })
                        .await;
                    if let Err(e) = granted {
                        self.done = true;
                        return Some(Err(self.sandbox.map_closed(e)));
                    }
                }
                return Some(Ok(chunk.bytes));
            }
            Ok(Reply::Message(GuestMessage::ReadDone { .. })) => None,
            Ok(Reply::Message(GuestMessage::Error(e))) => Some(Err(EngineError::Guest(e))),
            Ok(Reply::Message(other)) => Some(Err(unexpected(other))),
            Ok(Reply::Closed(reason)) => Some(Err(self.sandbox.gone(reason))),
            Err(EngineError::Unresponsive(_)) => Some(Err(EngineError::Unresponsive(format!(
                "reading {}",
                self.path
            )))),
            Err(e) => Some(Err(e)),
        };
        self.done = true;
        out
    }

    /// Reads the rest into memory.
    pub async fn read_to_end(mut self) -> Result<Vec<u8>, EngineError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.next_chunk().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }
}

impl Drop for Download {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Abandoned mid-way (its HTTP request went away): stop the read in the agent, from a
        // task since drop cannot wait.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let sandbox = self.sandbox.clone();
            let id = self.call.id;
            rt.spawn(async move {
                let _ = sandbox.client().send(id, &HostMessage::AbortData).await;
            });
        }
    }
}

/// Chunks a port connection's server may send ahead of the host's consumer.
const PORT_WINDOW: u32 = 16;

impl Sandbox {
    /// Connects to `port` on the sandbox's loopback (a server running inside) through its
    /// agent, never through the sandbox's network: the returned stream is that connection.
    /// Dropping it (or shutting down its write half) ends it.
    pub async fn connect_port(&self, port: u16) -> Result<tokio::io::DuplexStream, EngineError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.check_alive().await?;
        let mut call = self
            .client()
            .request(&HostMessage::ConnectPort {
                port,
                window: PORT_WINDOW,
            })
            .await
            .map_err(|e| self.map_closed(e))?;
        match call.message().await.map_err(|e| self.map_closed(e))? {
            GuestMessage::Ok => {}
            GuestMessage::Error(e) => return Err(EngineError::Guest(e)),
            other => return Err(unexpected(other)),
        }
        let id = call.id;
        let (ours, theirs) = tokio::io::duplex(256 * 1024);
        let (mut from_user, mut to_user) = tokio::io::split(theirs);
        let up = self.clone();
        tokio::spawn(async move {
            let mut seq = 0u64;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from_user.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = up.client().send(id, &HostMessage::StdinClose).await;
                        return;
                    }
                    Ok(n) => match up
                        .client()
                        .send_data(id, Channel::Stdin, seq, &buf[..n])
                        .await
                    {
                        Ok(next) => seq = next,
                        Err(_) => return,
                    },
                }
            }
        });
        let down = self.clone();
        tokio::spawn(async move {
            let mut taken = 0u32;
            // Anything but data (`ReadDone`, an error, the agent gone) ends it.
            while let Reply::Data(chunk) = call.next().await {
                if to_user.write_all(&chunk.bytes).await.is_err() {
                    break;
                }
                taken += 1;
                if taken >= PORT_WINDOW / 2 {
                    let chunks = std::mem::take(&mut taken);
                    let granted = down
                        .client()
                        .send(id, &HostMessage::ReadCredit { chunks })
                        .await;
                    if granted.is_err() {
                        break;
                    }
                }
            }
            let _ = to_user.shutdown().await;
            // Frees the agent's side whichever way it ended.
            let _ = down.client().send(id, &HostMessage::AbortData).await;
        });
        Ok(ours)
    }
}
