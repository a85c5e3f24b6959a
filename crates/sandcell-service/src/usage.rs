//! A sandbox's resource use: its cgroup's counters, and CPU percentages over the time since
//! the last reading.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandcell_api::SandboxId;
use sandcell_api::usage::SandboxUsage;

use crate::{Caller, Service, ServiceResult};

/// A CPU sample older than this is not used for the percentage (a fresh pair is taken).
pub const SAMPLE_MAX_AGE: Duration = Duration::from_secs(60);

/// The window of a fresh pair of samples.
const SAMPLE_WINDOW: Duration = Duration::from_millis(100);

/// The last CPU reading of each sandbox, so a percentage covers the time since the last call.
#[derive(Debug, Default)]
pub struct CpuSamples(Mutex<HashMap<String, (Instant, u64)>>);

impl CpuSamples {
    /// Records `now` as `id`'s last reading; returns the one before.
    pub fn swap(&self, id: &str, now: (Instant, u64)) -> Option<(Instant, u64)> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Keeps the map from growing with sandboxes long gone.
        if map.len() > 10_000 {
            map.retain(|_, (at, _)| at.elapsed() < SAMPLE_MAX_AGE);
        }
        map.insert(id.to_string(), now)
    }
}

/// Percent of one CPU used between two readings (microseconds of CPU time), to a tenth.
fn cpu_percent(start: (Instant, u64), end: (Instant, u64)) -> Option<f64> {
    let wall = end.0.duration_since(start.0).as_secs_f64();
    (wall > 0.0).then(|| {
        let used = end.1.saturating_sub(start.1) as f64 / 1e6;
        (used / wall * 1000.0).round() / 10.0
    })
}

impl Service {
    /// CPU, memory and process counts of the caller's sandbox `id` (from cgroups; `None`
    /// where the host has none). The CPU percentage covers the time since the previous call,
    /// or a fresh 100 ms when there is no recent one. A paused sandbox is read as it is.
    pub async fn sandbox_usage(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> ServiceResult<SandboxUsage> {
        let sandbox = self.fleet.sandbox_as_is(&caller.owner, id)?;
        let mut now = sandbox.usage();
        let mut percent = None;
        if let Some(cpu) = now.cpu_usage_us {
            let taken = Instant::now();
            let before = self
                .cpu_samples
                .swap(id, (taken, cpu))
                .filter(|(at, _)| at.elapsed() < SAMPLE_MAX_AGE && *at < taken);
            let (start, end) = match before {
                Some(before) => (before, (taken, cpu)),
                None => {
                    tokio::time::sleep(SAMPLE_WINDOW).await;
                    now = sandbox.usage();
                    let later = (Instant::now(), now.cpu_usage_us.unwrap_or(cpu));
                    self.cpu_samples.swap(id, later);
                    ((taken, cpu), later)
                }
            };
            percent = cpu_percent(start, end);
        }
        let limits = &sandbox.spec().limits;
        Ok(SandboxUsage {
            cpu_percent: percent,
            cpu_seconds: now.cpu_usage_us.map(|us| us as f64 / 1e6),
            cpu_limit: limits.cpus,
            memory_bytes: now.memory_bytes,
            memory_peak_bytes: now.memory_peak_bytes,
            memory_limit_bytes: limits.memory_bytes,
            pids: now.pids_current,
            pids_limit: limits.pids,
            oom_kills: now.oom_kills,
            pids_limit_hits: now.pids_limit_hits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_percent_is_of_one_cpu_to_a_tenth() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(cpu_percent((t0, 0), (t1, 3_000_000)), Some(150.0));
        assert_eq!(cpu_percent((t0, 5), (t1, 5)), Some(0.0));
        // A counter that went back (a new cgroup) counts as idle, no time as nothing.
        assert_eq!(cpu_percent((t0, 9), (t1, 1)), Some(0.0));
        assert_eq!(cpu_percent((t0, 0), (t0, 1)), None);
    }

    #[test]
    fn samples_return_the_reading_before() {
        let s = CpuSamples::default();
        let t = Instant::now();
        assert_eq!(s.swap("sb-a", (t, 1)), None);
        assert_eq!(s.swap("sb-a", (t, 2)), Some((t, 1)));
        assert_eq!(s.swap("sb-b", (t, 3)), None);
    }
}
