//! The load test: many concurrent clients doing exec on shared sandboxes for a while, and
//! what they saw (throughput, latencies, errors, where the CPU went).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::bail;
use sandcell_api::exec::ExecInput;
use sandcell_api::sandboxes::CreateSandbox;

use super::cpu::{CpuShare, CpuTimes};
use super::server::Daemon;

/// How many load-test errors are shown.
const SHOWN_ERRORS: usize = 5;

/// What the load test saw.
pub(super) struct Load {
    pub(super) clients: usize,
    pub(super) sandboxes: usize,
    pub(super) elapsed: Duration,
    pub(super) latencies: Vec<Duration>,
    pub(super) errors: u64,
    pub(super) first_errors: Vec<String>,
    pub(super) cpu: Option<CpuShare>,
}

impl Load {
    pub(super) fn throughput(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `clients` clients each doing exec `true` in a loop for `duration`, on `sandboxes` shared
/// sandboxes (client `i`'s `n`th request goes to sandbox `(i + n) % sandboxes`).
pub(super) async fn load(
    d: &Daemon,
    clients: usize,
    sandboxes: usize,
    duration: Duration,
) -> anyhow::Result<Load> {
    let mut ids = Vec::with_capacity(sandboxes);
    for _ in 0..sandboxes {
        let default = CreateSandbox {
            template: Some("default".into()),
            ..CreateSandbox::default()
        };
        ids.push(d.create(&default).await?);
    }
    let body = ExecInput {
        argv: Some(vec!["true".into()]),
        ..ExecInput::default()
    };
    let first_errors = Mutex::new(Vec::new());
    let client = |i: usize, until: Instant| {
        let (ids, body, first_errors) = (&ids, &body, &first_errors);
        async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut n = i;
            while Instant::now() < until {
                let t = Instant::now();
                let r = d.exec_ok(&ids[n % ids.len()], body).await;
                let took = t.elapsed();
                n += 1;
                match r {
                    Ok(()) => latencies.push(took),
                    Err(e) => {
                        errors += 1;
                        let mut shown = first_errors.lock().unwrap_or_else(|e| e.into_inner());
                        if shown.len() < SHOWN_ERRORS {
                            shown.push(format!("{e:#}"));
                        }
                    }
                }
            }
            (latencies, errors)
        }
    };
    // Warm-up: every client opens its connection and does a few requests.
    let warm_until = Instant::now() + duration.div_f64(20.0).min(Duration::from_secs(3));
    let warm = futures_util::future::join_all((0..clients).map(|i| client(i, warm_until))).await;
    let warm_errors: u64 = warm.iter().map(|(_, e)| e).sum();
    if warm_errors > 0 {
        bail!(
            "{warm_errors} errors while warming up the load test: {}",
            first_errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .join("; ")
        );
    }
    let sandboxes_before = d.cpu_seconds(&ids).await?;
    let cpu_before = CpuTimes::read(d.pid());
    let start = Instant::now();
    let until = start + duration;
    let results = futures_util::future::join_all((0..clients).map(|i| client(i, until))).await;
    let elapsed = start.elapsed();
    let cpu_after = CpuTimes::read(d.pid());
    let sandboxes_after = d.cpu_seconds(&ids).await?;
    let cpu = cpu_before.zip(cpu_after).map(|(a, b)| {
        let mut share = a.share(&b);
        share.sandboxes = sandboxes_before
            .zip(sandboxes_after)
            .map(|(a, b)| (b - a) / elapsed.as_secs_f64());
        share
    });
    for id in &ids {
        d.delete(id).await?;
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for (l, e) in results {
        latencies.extend(l);
        errors += e;
    }
    Ok(Load {
        clients,
        sandboxes,
        elapsed,
        latencies,
        errors,
        first_errors: first_errors.into_inner().unwrap_or_else(|e| e.into_inner()),
        cpu,
    })
}
