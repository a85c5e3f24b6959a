//! Long-lived threads for blocking work (file operations, `/proc` scans, tree kills).
//!
//! Tree kills get a thread of their own so they never queue behind a slow file operation.
//! It is started as soon as the first sandbox process runs ([`Workers::start_killer`], while
//! that process starts up, off the start path), because creating a thread later can fail: the sandbox's pids
//! limit counts threads, and a fork bomb exhausts it exactly when a tree kill is needed
//! (tokio's blocking pool panics then). General workers start on demand (each costs start-up
//! time). When no thread can be started, a job runs on the calling thread instead.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::sync::lock;

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run blocking jobs.
pub(crate) struct Workers {
    general: Sender<Job>,
    queue: Arc<Mutex<Receiver<Job>>>,
    /// General workers waiting for a job.
    idle: Arc<AtomicUsize>,
    /// General workers started so far.
    started: AtomicUsize,
    max_general: usize,
    killer: Mutex<Option<Sender<Job>>>,
}

impl Workers {
    /// No threads yet: up to `max_general` general workers start as jobs need them.
    pub fn new(max_general: usize) -> Self {
        let (tx, rx) = channel::<Job>();
        Self {
            general: tx,
            queue: Arc::new(Mutex::new(rx)),
            idle: Arc::new(AtomicUsize::new(0)),
            started: AtomicUsize::new(0),
            max_general: max_general.max(1),
            killer: Mutex::new(None),
        }
    }

    /// Starts the kill thread unless it runs already; says whether it runs.
    pub fn start_killer(&self) -> bool {
        let mut killer = lock(&self.killer);
        if killer.is_some() {
            return true;
        }
        let (tx, rx) = channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("sandcell-killer".into())
            .spawn(move || serve_jobs(|| rx.recv().ok()));
        if spawned.is_ok() {
            *killer = Some(tx);
        }
        spawned.is_ok()
    }

    /// Runs `f` on a general worker; its result arrives on the receiver.
    pub fn run<T, F>(&self, f: F) -> oneshot::Receiver<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        if self.idle.load(Ordering::SeqCst) == 0 && !self.grow() && self.started() == 0 {
            // No worker and none can be started (the pids limit is exhausted): run it here.
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(f());
            return rx;
        }
        submit(&self.general, f)
    }

    /// Runs `f` on the kill thread (here, when it cannot be started); its result arrives on
    /// the receiver.
    pub fn kill<T, F>(&self, f: F) -> oneshot::Receiver<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let killer = if self.start_killer() {
            lock(&self.killer).clone()
        } else {
            None
        };
        match killer {
            Some(queue) => submit(&queue, f),
            None => {
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(f());
                rx
            }
        }
    }

    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Starts one more general worker unless the maximum is reached; says whether it did.
    fn grow(&self) -> bool {
        let n = self.started();
        if n >= self.max_general {
            return false;
        }
        let (queue, idle) = (self.queue.clone(), self.idle.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("sandcell-worker-{n}"))
            .spawn(move || {
                serve_jobs(|| {
                    idle.fetch_add(1, Ordering::SeqCst);
                    let job = lock(&queue).recv().ok();
                    idle.fetch_sub(1, Ordering::SeqCst);
                    job
                })
            });
        if spawned.is_ok() {
            self.started.fetch_add(1, Ordering::SeqCst);
        }
        spawned.is_ok()
    }
}

fn submit<T, F>(queue: &Sender<Job>, f: F) -> oneshot::Receiver<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    // A worker only goes away if the process is tearing down; then do the job here.
    if let Err(e) = queue.send(job) {
        (e.0)();
    }
    rx
}

fn serve_jobs(mut next: impl FnMut() -> Option<Job>) {
    while let Some(job) = next() {
        // A panicking job must not take the thread (and all later jobs) with it.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
    }
}
