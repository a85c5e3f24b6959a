//! Connections to a port on the sandbox's loopback, for the host (previews of a server
//! running inside): the host's bytes are written to the connection, the server's come back
//! as `Stdout` chunks within the window the host grants (a slow browser never makes the host
//! buffer a whole download).

use std::sync::Arc;

use sandcell_protocol::{Channel, ErrorCode, GuestMessage, WireError, encode_data};
use tokio::sync::{Semaphore, mpsc};

use crate::poller::PolledFd;
use crate::shared::Shared;

/// Bytes read from the server at a time.
const CHUNK: usize = 64 * 1024;

/// What the host sends a port connection.
#[derive(Debug)]
pub(crate) enum PortIn {
    /// Bytes for the server.
    Data(Vec<u8>),
    /// The host is done writing (the write half is shut down).
    Close,
}

/// One open port connection, as the dispatcher holds it.
#[derive(Debug)]
pub(crate) struct PortConn {
    to_server: mpsc::UnboundedSender<PortIn>,
    credit: Arc<Semaphore>,
}

impl PortConn {
    /// Queues bytes (or the end of them) for the server.
    pub fn send(&self, msg: PortIn) {
        let _ = self.to_server.send(msg);
    }

    /// Lets the server's side send `chunks` more.
    pub fn grant(&self, chunks: u32) {
        self.credit.add_permits(chunks as usize);
    }

    /// Ends both directions.
    pub fn abort(&self) {
        self.credit.close();
        let _ = self.to_server.send(PortIn::Close);
    }
}

/// Connects to `port` and answers `Ok` on `id`, or the error; the connection then runs on
/// its own tasks until either side ends it.
pub(crate) async fn open(
    shared: &Arc<Shared>,
    id: u32,
    port: u16,
    window: u32,
) -> Result<PortConn, WireError> {
    // A blocking connect on a worker thread (loopback answers at once), then the agent's
    // own readiness loop: the connection comes and goes while the sandbox may be
    // checkpointed (see the poller module).
    let connected = tokio::task::spawn_blocking(move || {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
        let _ = stream.set_nodelay(true);
        Ok(std::os::fd::OwnedFd::from(stream))
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
    .and_then(PolledFd::new);
    let stream = connected.map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::ConnectionRefused {
            ErrorCode::NotFound
        } else {
            ErrorCode::Io
        };
        WireError::new(
            code,
            format!("nothing answers on port {port} inside the sandbox ({e})"),
        )
    })?;
    shared.out.msg(id, &GuestMessage::Ok).await;
    let from_server = Arc::new(stream);
    let to_server = from_server.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<PortIn>();
    let credit = Arc::new(Semaphore::new(window.max(1) as usize));
    tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            match msg {
                PortIn::Data(bytes) => {
                    if to_server.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                PortIn::Close => {
                    let _ = rustix::net::shutdown(&*to_server, rustix::net::Shutdown::Write);
                    break;
                }
            }
        }
    });
    let out = shared.clone();
    let window = credit.clone();
    tokio::spawn(async move {
        let (mut seq, mut total) = (0u64, 0u64);
        let mut buf = vec![0u8; CHUNK];
        loop {
            // Closed by an abort: the host wants nothing more.
            let Ok(permit) = window.acquire().await else {
                return;
            };
            permit.forget();
            match from_server.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.out
                        .frame(encode_data(id, Channel::Stdout, seq, &buf[..n]))
                        .await;
                    seq += 1;
                    total += n as u64;
                }
            }
        }
        out.out
            .msg(id, &GuestMessage::ReadDone { size: total })
            .await;
    });
    Ok(PortConn {
        to_server: tx,
        credit,
    })
}
