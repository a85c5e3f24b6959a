//! Long-lived threads for blocking work (file operations, `/proc` scans, tree kills).
//!
//! They are started with the connection, before any sandbox process runs, because creating a
//! thread later can fail: the sandbox's pids limit counts threads, and a fork bomb exhausts it
//! exactly when a tree kill is needed (tokio's blocking pool panics then). Tree kills get a
//! thread of their own so they never queue behind a slow file operation.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::server::lock;

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run blocking jobs.
pub(crate) struct Workers {
    general: Sender<Job>,
    killer: Sender<Job>,
}

impl Workers {
    /// Starts `general` threads for ordinary jobs and one for kills.
    pub fn start(general: usize) -> std::io::Result<Self> {
        let (tx, rx) = channel::<Job>();
        let shared = Arc::new(Mutex::new(rx));
        for i in 0..general.max(1) {
            let rx = shared.clone();
            std::thread::Builder::new()
                .name(format!("sandcell-worker-{i}"))
                .spawn(move || serve_jobs(|| lock(&rx).recv().ok()))?;
        }
        let (killer, krx) = channel::<Job>();
        std::thread::Builder::new()
            .name("sandcell-killer".into())
            .spawn(move || serve_jobs(|| krx.recv().ok()))?;
        Ok(Self {
            general: tx,
            killer,
        })
    }

    /// Runs `f` on a general worker; its result arrives on the receiver.
    pub fn run<T, F>(&self, f: F) -> oneshot::Receiver<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        submit(&self.general, f)
    }

    /// Runs `f` on the kill thread; its result arrives on the receiver.
    pub fn kill<T, F>(&self, f: F) -> oneshot::Receiver<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        submit(&self.killer, f)
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
