//! Flow control of windowed file reads: a read may have only as many chunks out as the host
//! has granted, so a host that forwards them to a slow consumer never has to buffer a whole
//! large file. The reading worker thread waits here; the dispatcher grants and cancels.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a waiting read checks whether its connection is still there.
const RECHECK: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct Window {
    /// Chunks the read may send in all (the first window plus every credit).
    granted: u64,
    cancelled: bool,
}

/// The windows of the reads in flight, by request id.
#[derive(Debug, Default)]
pub(crate) struct ReadWindows {
    windows: Mutex<HashMap<u32, Window>>,
    changed: Condvar,
}

/// Why a read stopped waiting.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The chunk may go.
    Go,
    /// The host cancelled the read, or went away.
    Stop,
}

impl ReadWindows {
    fn lock(&self) -> MutexGuard<'_, HashMap<u32, Window>> {
        self.windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers read `id`, which may send `window` chunks before it is granted more.
    pub fn open(&self, id: u32, window: u32) {
        self.lock().insert(
            id,
            Window {
                granted: u64::from(window.max(1)),
                cancelled: false,
            },
        );
    }

    /// Lets read `id` send `chunks` more (nothing when it has ended).
    pub fn grant(&self, id: u32, chunks: u32) {
        if let Some(w) = self.lock().get_mut(&id) {
            w.granted = w.granted.saturating_add(u64::from(chunks));
            self.changed.notify_all();
        }
    }

    /// Stops read `id`; true when it was a windowed read in flight.
    pub fn cancel(&self, id: u32) -> bool {
        let found = self.lock().get_mut(&id).map(|w| w.cancelled = true);
        self.changed.notify_all();
        found.is_some()
    }

    /// Stops every read (their host went away).
    pub fn cancel_all(&self) {
        for w in self.lock().values_mut() {
            w.cancelled = true;
        }
        self.changed.notify_all();
    }

    /// Forgets read `id` (it ended).
    pub fn close(&self, id: u32) {
        self.lock().remove(&id);
    }

    /// Blocks until read `id` may send chunk number `seq` (from 0), it is cancelled, or
    /// `gone()` says nobody is left to read it. An unregistered read never waits.
    pub fn wait(&self, id: u32, seq: u64, gone: impl Fn() -> bool) -> Wait {
        let mut windows = self.lock();
        loop {
            match windows.get(&id) {
                None => return Wait::Go,
                Some(w) if w.cancelled => return Wait::Stop,
                Some(w) if seq < w.granted => return Wait::Go,
                Some(_) => {}
            }
            if gone() {
                return Wait::Stop;
            }
            windows = self
                .changed
                .wait_timeout(windows, RECHECK)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_read_sends_its_window_then_waits_for_credit() {
        let w = Arc::new(ReadWindows::default());
        w.open(7, 2);
        assert_eq!(w.wait(7, 0, || false), Wait::Go);
        assert_eq!(w.wait(7, 1, || false), Wait::Go);
        let waiter = {
            let w = w.clone();
            std::thread::spawn(move || w.wait(7, 2, || false))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "chunk 2 went before any credit");
        w.grant(7, 1);
        assert_eq!(waiter.join().unwrap(), Wait::Go);
    }

    #[test]
    fn cancel_and_a_gone_host_release_the_waiter() {
        let w = Arc::new(ReadWindows::default());
        w.open(1, 1);
        let waiter = {
            let w = w.clone();
            std::thread::spawn(move || w.wait(1, 5, || false))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(w.cancel(1));
        assert_eq!(waiter.join().unwrap(), Wait::Stop);

        w.open(2, 1);
        let started = Instant::now();
        assert_eq!(w.wait(2, 1, || true), Wait::Stop);
        assert!(started.elapsed() < RECHECK);

        w.open(3, 1);
        w.cancel_all();
        assert_eq!(w.wait(3, 1, || false), Wait::Stop);
        w.close(3);
        assert!(!w.cancel(3));
        // Unregistered (an unwindowed read) never waits.
        assert_eq!(w.wait(99, 1_000, || false), Wait::Go);
    }
}
