//! Prometheus metrics in the text exposition format (`GET /metrics`): counters and histograms
//! kept in atomics, gauges computed when scraped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// A latency histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, le) in BUCKETS.iter().enumerate() {
            let n = self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {n}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// The service's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Sandboxes created.
    pub creates_ok: AtomicU64,
    /// Sandbox creations that failed.
    pub creates_failed: AtomicU64,
    /// Creations served from a warm pool.
    pub pool_hits: AtomicU64,
    /// Creations that had to start a sandbox.
    pub pool_misses: AtomicU64,
    /// Sandboxes stopped by the lifecycle rules.
    pub expired: AtomicU64,
    /// Exec round trips (collected execs), from request to result.
    pub exec_latency: Histogram,
    /// Code executions, from request to result.
    pub code_latency: Histogram,
    /// Creations, from request to a running sandbox.
    pub create_latency: Histogram,
    /// Error responses by code.
    errors: Mutex<BTreeMap<String, u64>>,
    /// Responses by status class.
    responses: Mutex<BTreeMap<u16, u64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// Counts an error response.
    pub fn error(&self, code: &str) {
        *lock(&self.errors).entry(code.to_string()).or_default() += 1;
    }

    /// Counts a response by its status.
    pub fn response(&self, status: u16) {
        *lock(&self.responses).entry(status).or_default() += 1;
    }

    /// The exposition text; `states` are the current sandbox counts by state, `pools` the
    /// ready sandboxes by pool.
    pub fn render(&self, states: &[(&str, u64)], pools: &[(String, u64)]) -> String {
        let mut out = String::new();
        let o = &mut out;
        let name = family(o, "sandcell_sandboxes", "gauge", "Sandboxes by state.");
        for (state, n) in states {
            let _ = writeln!(o, "{name}{{state=\"{state}\"}} {n}");
        }
        let name = family(
            o,
            "sandcell_sandbox_creates_total",
            "counter",
            "Sandbox creations by result.",
        );
        let _ = writeln!(
            o,
            "{name}{{result=\"ok\"}} {}",
            self.creates_ok.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            o,
            "{name}{{result=\"error\"}} {}",
            self.creates_failed.load(Ordering::Relaxed)
        );
        let name = family(
            o,
            "sandcell_pool_requests_total",
            "counter",
            "Creations served from a warm pool (hit) or started fresh (miss).",
        );
        let _ = writeln!(
            o,
            "{name}{{result=\"hit\"}} {}",
            self.pool_hits.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            o,
            "{name}{{result=\"miss\"}} {}",
            self.pool_misses.load(Ordering::Relaxed)
        );
        let name = family(
            o,
            "sandcell_pool_ready",
            "gauge",
            "Ready sandboxes waiting in each warm pool.",
        );
        for (pool, n) in pools {
            let _ = writeln!(o, "{name}{{pool=\"{}\"}} {n}", escape(pool));
        }
        let name = family(
            o,
            "sandcell_sandboxes_expired_total",
            "counter",
            "Sandboxes stopped for idleness or lifetime.",
        );
        let _ = writeln!(o, "{name} {}", self.expired.load(Ordering::Relaxed));
        let name = family(
            o,
            "sandcell_errors_total",
            "counter",
            "Error responses by error code.",
        );
        for (code, n) in lock(&self.errors).iter() {
            let _ = writeln!(o, "{name}{{code=\"{}\"}} {n}", escape(code));
        }
        let name = family(
            o,
            "sandcell_http_responses_total",
            "counter",
            "HTTP responses by status.",
        );
        for (status, n) in lock(&self.responses).iter() {
            let _ = writeln!(o, "{name}{{status=\"{status}\"}} {n}");
        }
        let name = family(
            o,
            "sandcell_operation_duration_seconds",
            "histogram",
            "Latency of execs, code executions and creations.",
        );
        self.exec_latency.render(o, name, "operation=\"exec\"");
        self.code_latency.render(o, name, "operation=\"code\"");
        self.create_latency.render(o, name, "operation=\"create\"");
        out
    }
}

/// Writes a family's HELP and TYPE lines; returns its name.
fn family<'a>(out: &mut String, name: &'a str, kind: &str, help: &str) -> &'a str {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    name
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_families_with_their_samples() {
        let m = Metrics::default();
        m.creates_ok.fetch_add(2, Ordering::Relaxed);
        m.exec_latency.observe(Duration::from_micros(300));
        m.exec_latency.observe(Duration::from_millis(20));
        m.error("not_found");
        m.response(404);
        let text = m.render(&[("running", 3), ("stopped", 1)], &[("small".into(), 2)]);
        assert!(
            text.contains(
                "# TYPE sandcell_sandboxes gauge\nsandcell_sandboxes{state=\"running\"} 3\n"
            ),
            "{text}"
        );
        assert!(text.contains("sandcell_sandbox_creates_total{result=\"ok\"} 2"));
        assert!(
            text.contains(
                "sandcell_operation_duration_seconds_bucket{operation=\"exec\",le=\"0.0005\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("sandcell_operation_duration_seconds_count{operation=\"exec\"} 2"));
        assert!(text.contains("sandcell_errors_total{code=\"not_found\"} 1"));
        assert!(text.contains("sandcell_pool_ready{pool=\"small\"} 2"));
        // Every sample line belongs to the family declared above it.
        let mut family = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split_whitespace().next().unwrap();
            } else if !line.starts_with('#') {
                assert!(line.starts_with(family), "{line} after {family}");
            }
        }
    }
}
