//! The agent's own readiness loop for the descriptors it opens and closes while it runs: a
//! process's pipes and terminal, a kernel's pipes, a connection to a port inside, the egress
//! bridge's listeners and connections.
//!
//! Why not tokio's reactor for these: the runsc this project runs on brings back, after a
//! restore, epoll interests that were deleted before the checkpoint (seen with `runsc
//! --strace`: an exec's pipes, `EPOLL_CTL_DEL`ed and closed long before, reported ready by the
//! first `epoll_wait` after the restore, with their old data). Tokio's reactor takes an
//! event's data for the address of its per-registration state, freed by then, and a
//! restored agent could deadlock on freed memory (docs/gvisor.md). Here an event's data is a
//! token that is never reused, looked up in a table: a token nobody holds any more is
//! ignored. The long-lived descriptors (the host connection, the signal pipe, listeners)
//! stay on tokio's reactor: nothing deletes their interests while a sandbox can be
//! checkpointed.
//!
//! The loop's epoll instance is itself one long-lived descriptor on tokio's reactor: when it
//! has events, a task on the runtime's thread takes them (`epoll_wait` with no timeout) and
//! wakes the tasks waiting for those descriptors; reads and writes happen on those tasks,
//! non-blocking. No other thread is involved (a wake-up across cores cost an exec ~0.6 ms
//! on these machines).

use std::collections::HashMap;
use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use rustix::buffer::spare_capacity;
use rustix::event::epoll;
use rustix::io::Errno;
use tokio::io::unix::AsyncFd;

/// Events taken from the kernel per `epoll_wait` (more wait for the next call).
const EVENTS_PER_WAIT: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the loop knows of one descriptor: how many times it was reported readable or
/// writable, and the task waiting for the next report.
#[derive(Debug, Default)]
struct Readiness {
    read_reports: u64,
    write_reports: u64,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

#[derive(Debug, Default)]
struct Slot {
    state: Mutex<Readiness>,
}

impl Slot {
    fn report(&self, flags: epoll::EventFlags) {
        let ended = epoll::EventFlags::HUP | epoll::EventFlags::ERR;
        let readable = flags.intersects(
            epoll::EventFlags::IN | epoll::EventFlags::PRI | epoll::EventFlags::RDHUP | ended,
        );
        let writable = flags.intersects(epoll::EventFlags::OUT | ended);
        let (reader, writer) = {
            let mut s = lock(&self.state);
            if readable {
                s.read_reports += 1;
            }
            if writable {
                s.write_reports += 1;
            }
            (
                readable.then(|| s.reader.take()).flatten(),
                writable.then(|| s.writer.take()).flatten(),
            )
        };
        for w in [reader, writer].into_iter().flatten() {
            w.wake();
        }
    }
}

/// The loop's epoll instance and the table of its tokens.
#[derive(Debug)]
struct Poller {
    epoll: AsyncFd<OwnedFd>,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    next_token: AtomicU64,
    /// False once the task that takes its events is gone (its runtime ended).
    serving: AtomicBool,
}

impl Poller {
    /// Takes the events there are now and reports them; `WouldBlock` when there were none.
    fn take_events(&self) -> io::Result<()> {
        let mut buf = [MaybeUninit::<epoll::Event>::uninit(); EVENTS_PER_WAIT];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let events = match epoll::wait(self.epoll.get_ref(), &mut buf, Some(&zero)) {
            Ok((events, _)) => events,
            Err(Errno::INTR) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if events.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        for event in events.iter() {
            // A copy: the kernel's struct is packed.
            let epoll::Event { flags, data } = *event;
            // A token nobody holds (a restored, deleted interest) finds nothing.
            let slot = lock(&self.slots).get(&data.u64()).cloned();
            if let Some(slot) = slot {
                slot.report(flags);
            }
        }
        Ok(())
    }

    /// Takes events whenever tokio says the epoll instance has some, until the runtime ends.
    async fn serve(self: Arc<Self>) {
        struct Serving(Arc<Poller>);
        impl Drop for Serving {
            fn drop(&mut self) {
                self.0.serving.store(false, Ordering::SeqCst);
            }
        }
        let serving = Serving(self);
        let poller = &serving.0;
        loop {
            let Ok(mut ready) = poller.epoll.readable().await else {
                return;
            };
            match ready.try_io(|_| poller.take_events()) {
                Ok(Ok(())) | Err(_) => {}
                Ok(Err(e)) => {
                    // Not expected of a valid epoll descriptor; never spin on it.
                    eprintln!("sandcell-guest: epoll_wait failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    }
}

thread_local! {
    /// This thread's loop (the agent's runtime has one thread).
    static POLLER: std::cell::RefCell<Option<Arc<Poller>>> = const { std::cell::RefCell::new(None) };
}

/// The loop of the runtime this is called on, started on first use (again when a runtime
/// that had one on this thread has ended). Call it on a runtime's thread.
fn poller() -> io::Result<Arc<Poller>> {
    POLLER.with(|cell| {
        let mut cell = cell.borrow_mut();
        if let Some(p) = cell.as_ref().filter(|p| p.serving.load(Ordering::SeqCst)) {
            return Ok(p.clone());
        }
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let poller = Arc::new(Poller {
            epoll: sandcell_jail::reactor::register(epoll, tokio::io::Interest::READABLE)?,
            slots: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            serving: AtomicBool::new(true),
        });
        tokio::spawn(poller.clone().serve());
        *cell = Some(poller.clone());
        Ok(poller)
    })
}

/// A non-blocking descriptor watched by the agent's loop, read and written from tasks.
/// One task may read and another write at the same time (a terminal's output and input).
#[derive(Debug)]
pub(crate) struct PolledFd {
    fd: OwnedFd,
    token: u64,
    slot: Arc<Slot>,
    poller: Arc<Poller>,
}

impl PolledFd {
    /// Makes `fd` non-blocking and watches it (call it on the runtime's thread).
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        let poller = poller()?;
        rustix::io::ioctl_fionbio(&fd, true)?;
        let token = poller.next_token.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot::default());
        lock(&poller.slots).insert(token, slot.clone());
        let interest = epoll::EventFlags::IN
            | epoll::EventFlags::OUT
            | epoll::EventFlags::RDHUP
            | epoll::EventFlags::ET;
        if let Err(e) = epoll::add(
            &poller.epoll,
            &fd,
            epoll::EventData::new_u64(token),
            interest,
        ) {
            lock(&poller.slots).remove(&token);
            return Err(e.into());
        }
        Ok(Self {
            fd,
            token,
            slot,
            poller,
        })
    }

    /// Waits until the loop has reported the descriptor readable (or writable) more times
    /// than `seen`: a report that came after the failed attempt counted in `seen`.
    async fn wait(&self, write: bool, seen: u64) {
        poll_fn(|cx| {
            let mut s = lock(&self.slot.state);
            let (reports, waiter) = if write {
                (s.write_reports, &mut s.writer)
            } else {
                (s.read_reports, &mut s.reader)
            };
            if reports != seen {
                return Poll::Ready(());
            }
            *waiter = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }

    fn reports(&self, write: bool) -> u64 {
        let s = lock(&self.slot.state);
        if write {
            s.write_reports
        } else {
            s.read_reports
        }
    }

    /// Runs `attempt` until it does not find the descriptor busy (`EAGAIN`), waiting for the
    /// loop's next report between attempts. Cancel-safe: nothing is done while waiting.
    async fn retry<T>(
        &self,
        write: bool,
        mut attempt: impl FnMut(BorrowedFd<'_>) -> rustix::io::Result<T>,
    ) -> io::Result<T> {
        loop {
            let seen = self.reports(write);
            match attempt(self.fd.as_fd()) {
                Ok(v) => return Ok(v),
                Err(Errno::AGAIN) => self.wait(write, seen).await,
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Replaces `buf`'s contents with what one read returns (at most its capacity; 0 at the
    /// end). The buffer is not zeroed first: a zeroed buffer per stream costs page faults.
    pub async fn read_into(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        buf.clear();
        if buf.capacity() == 0 {
            buf.reserve(64 * 1024);
        }
        self.retry(false, |fd| rustix::io::read(fd, spare_capacity(buf)))
            .await
    }

    /// One read into `buf`; 0 at the end.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.retry(false, |fd| rustix::io::read(fd, &mut *buf))
            .await
    }

    /// Accepts one connection of a listening socket (non-blocking, close-on-exec).
    pub async fn accept(&self) -> io::Result<OwnedFd> {
        self.retry(false, |fd| {
            rustix::net::accept_with(
                fd,
                rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
            )
        })
        .await
    }

    /// Writes all of `bytes`. Tried before waiting: a pipe or terminal has room almost
    /// always, and gVisor's kernel does not report a fresh terminal master writable until
    /// something changes.
    pub async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = self.retry(true, |fd| rustix::io::write(fd, bytes)).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            bytes = &bytes[n..];
        }
        Ok(())
    }
}

impl AsFd for PolledFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for PolledFd {
    fn drop(&mut self) {
        // Deleted before the token is forgotten and the descriptor closed: a report still
        // on its way finds no slot.
        let _ = epoll::delete(self.poller.epoll.get_ref(), &self.fd);
        lock(&self.poller.slots).remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (PolledFd, PolledFd) {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
        (
            PolledFd::new(r).expect("watch"),
            PolledFd::new(w).expect("watch"),
        )
    }

    #[tokio::test]
    async fn a_read_waits_for_the_writer_and_sees_the_end() {
        let (r, w) = pipe();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = Vec::with_capacity(16);
            loop {
                let n = r.read_into(&mut buf).await.expect("read");
                if n == 0 {
                    return got;
                }
                got.extend_from_slice(&buf);
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        w.write_all(b"hello ").await.expect("write");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        w.write_all(b"world").await.expect("write");
        drop(w);
        assert_eq!(reader.await.expect("reader"), b"hello world");
    }

    #[tokio::test]
    async fn a_full_pipe_write_waits_for_the_reader() {
        let (r, w) = pipe();
        // More than a pipe holds (64 KiB): the write must wait for reads to make room.
        let big = vec![7u8; 1024 * 1024];
        let writer = tokio::spawn(async move {
            w.write_all(&big).await.expect("write");
        });
        let mut total = 0;
        let mut buf = vec![0u8; 8192];
        while total < 1024 * 1024 {
            let n = r.read(&mut buf).await.expect("read");
            assert!(n > 0, "ended early at {total}");
            total += n;
        }
        writer.await.expect("writer");
        assert_eq!(total, 1024 * 1024);
    }

    #[tokio::test]
    async fn an_event_for_a_token_nobody_holds_is_ignored() {
        // What a restored, deleted interest looks like to the loop: ready, with a token that
        // is in no table.
        let p = poller().expect("loop");
        let (stale_r, stale_w) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
        let flags = epoll::EventFlags::IN | epoll::EventFlags::ET;
        epoll::add(
            &p.epoll,
            &stale_r,
            epoll::EventData::new_u64(u64::MAX),
            flags,
        )
        .expect("add");
        rustix::io::write(&stale_w, b"x").expect("write");
        // The loop goes on serving live descriptors.
        let (r, w) = pipe();
        w.write_all(b"ok").await.expect("write");
        let mut buf = Vec::with_capacity(16);
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), r.read_into(&mut buf))
            .await
            .expect("the loop answers")
            .expect("read");
        assert_eq!(&buf[..n], b"ok");
        epoll::delete(p.epoll.get_ref(), &stale_r).expect("delete");
        // Tokens are never handed out again.
        let (r2, _w2) = pipe();
        assert!(r2.token > r.token);
    }
}
