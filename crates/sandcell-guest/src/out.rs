//! The writer task: every frame for the host goes through its one queue, so frames never
//! interleave, and a new connection can take over the queue (`Rehome`, a re-attaching host).

use sandcell_protocol::{GuestMessage, WireError, encode_message};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot};

/// Frames queued for the writer before senders wait (backpressure on output and reads).
const OUT_QUEUE: usize = 64;
/// Bytes the writer gathers into one write.
const WRITE_BATCH: usize = 1024 * 1024;

enum Outgoing {
    Frame(Vec<u8>),
    /// A frame with a descriptor attached (to its first byte).
    FrameWithFd(Vec<u8>, std::os::fd::OwnedFd),
    Flush(oneshot::Sender<()>),
    /// The host connected again: write to this from now on.
    Attach(OwnedWriteHalf),
}

/// The sending side of the writer task.
#[derive(Clone)]
pub(crate) struct Out(mpsc::Sender<Outgoing>);

impl Out {
    /// Starts the writer task on `sock` and returns its queue.
    pub fn start(sock: OwnedWriteHalf) -> Self {
        let (tx, rx) = mpsc::channel(OUT_QUEUE);
        tokio::spawn(writer(sock, rx));
        Self(tx)
    }

    /// Queues an encoded frame (waits while the queue is full).
    pub async fn frame(&self, bytes: Vec<u8>) {
        // A closed queue means the host is gone; the frame has nowhere to go.
        let _ = self.0.send(Outgoing::Frame(bytes)).await;
    }

    /// Queues an encoded frame with a descriptor attached to its first byte.
    pub async fn frame_with_fd(&self, bytes: Vec<u8>, fd: std::os::fd::OwnedFd) {
        let _ = self.0.send(Outgoing::FrameWithFd(bytes, fd)).await;
    }

    /// Queues a control message.
    pub async fn msg(&self, id: u32, msg: &GuestMessage) {
        self.frame(encode_message(id, msg)).await;
    }

    /// Queues an error reply.
    pub async fn error(&self, id: u32, e: WireError) {
        self.msg(id, &GuestMessage::Error(e)).await;
    }

    /// True once the writer is gone (nothing queued goes anywhere).
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    /// Queues an encoded frame from a blocking thread; false once the writer is gone.
    pub fn blocking_frame(&self, bytes: Vec<u8>) -> bool {
        self.0.blocking_send(Outgoing::Frame(bytes)).is_ok()
    }

    /// Sends everything queued after this to a new connection (what was queued before it
    /// went to the old one, or nowhere).
    pub async fn attach(&self, sock: OwnedWriteHalf) {
        let _ = self.0.send(Outgoing::Attach(sock)).await;
    }

    /// Waits until everything queued so far has been written (or the host is gone).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.0.send(Outgoing::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// Writes all of `bytes` on `sock`, the first byte carrying `fd`.
async fn send_frame_with_fd(
    sock: &OwnedWriteHalf,
    bytes: &[u8],
    fd: &std::os::fd::OwnedFd,
) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let stream: &tokio::net::UnixStream = sock.as_ref();
    let mut sent = loop {
        stream.writable().await?;
        match stream.try_io(tokio::io::Interest::WRITABLE, || {
            sandcell_jail::fdpass::send_with_fd(stream.as_fd(), bytes, fd.as_fd())
        }) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    while sent < bytes.len() {
        stream.writable().await?;
        match stream.try_write(&bytes[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn writer(mut sock: OwnedWriteHalf, mut rx: mpsc::Receiver<Outgoing>) {
    let mut broken = false;
    let mut batch: Vec<u8> = Vec::new();
    let mut flushes = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(item) = next.take() {
            match item {
                Outgoing::Frame(bytes) if batch.is_empty() => batch = bytes,
                Outgoing::Frame(bytes) => batch.extend_from_slice(&bytes),
                Outgoing::Flush(tx) => flushes.push(tx),
                Outgoing::FrameWithFd(bytes, fd) => {
                    // Everything queued before it goes first, then it, by sendmsg.
                    if !broken && !batch.is_empty() && sock.write_all(&batch).await.is_err() {
                        broken = true;
                    }
                    batch.clear();
                    if !broken && send_frame_with_fd(&sock, &bytes, &fd).await.is_err() {
                        broken = true;
                    }
                }
                Outgoing::Attach(new) => {
                    // Output meant for the host that went away is dropped with it.
                    batch.clear();
                    sock = new;
                    broken = false;
                }
            }
            if batch.len() < WRITE_BATCH {
                next = rx.try_recv().ok();
            }
        }
        // Once the host stops reading for good, keep draining so senders never block.
        if !broken && !batch.is_empty() && sock.write_all(&batch).await.is_err() {
            broken = true;
        }
        batch.clear();
        for tx in flushes.drain(..) {
            let _ = tx.send(());
        }
    }
}
