//! `sandcell bench durable`: what durability costs an agent run (step snapshots, resume
//! after a crash, fork), measured in one run:
//! - the step snapshot a run takes at the end of a step (`durable::snapshot_step`, which is
//!   `Service::take_snapshot`) of a Python sandbox whose kernel holds ~5 MB, on an embedded
//!   service in this process, beside what an agent would do itself (pickle + tar);
//! - the resume of a run after `kill -9` of a real daemon during a slow model call: from the
//!   restarted daemon's `/healthz` answering to the scripted model receiving the resumed
//!   request;
//! - a fork from step 2 of a finished run, to the fork's first `tool_result`.
//!
//! `step_snapshot`, `resume` and `fork` measure, each giving a [`Section`]; `model` runs the
//! scripted model; this module checks the arguments, runs them and prints the report. The
//! daemon is `bench daemon`'s (`daemon::server`). The submodules use this one only for
//! what they report with: [`Row`], [`Section`] and the helpers on event times.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use sandcell_engine::Engine;
use serde_json::{Map, Value, json};

use super::daemon::server::Daemon;
use super::stats::{mean, quantile};

mod fork;
mod model;
mod resume;
mod step_snapshot;

/// Arguments of `sandcell bench durable`.
#[derive(Debug, Args)]
pub struct DurableArgs {
    /// Samples of the step snapshot and of each fork scenario (at least 20 for the
    /// published figures).
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// Kill -9 / restart cycles of the resume scenario (default: 5, or --samples if fewer).
    #[arg(long)]
    restarts: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// One timed scenario.
pub(super) struct Row {
    key: &'static str,
    name: String,
    samples: Vec<Duration>,
    /// Its target median, in milliseconds.
    target_ms: Option<f64>,
}

impl Row {
    fn new(key: &'static str, name: impl Into<String>, samples: Vec<Duration>) -> Self {
        Self {
            key,
            name: name.into(),
            samples,
            target_ms: None,
        }
    }

    fn target(mut self, ms: f64) -> Self {
        self.target_ms = Some(ms);
        self
    }

    fn median(&self) -> f64 {
        quantile(&self.samples, 0.5)
    }

    fn json(&self) -> Value {
        let mut v = json!({
            "key": self.key, "scenario": self.name, "samples": self.samples.len(),
            "median_ms": self.median(), "p99_ms": quantile(&self.samples, 0.99),
            "mean_ms": mean(&self.samples),
        });
        if let Some(t) = self.target_ms {
            v["target_ms"] = json!(t);
            v["met"] = json!(self.median() <= t);
        }
        v
    }
}

/// What one scenario found: its timed rows and facts (sizes, what happened, derived
/// figures) that go with them.
pub(super) struct Section {
    key: &'static str,
    title: &'static str,
    rows: Vec<Row>,
    facts: Vec<(&'static str, Value)>,
}

impl Section {
    fn new(key: &'static str, title: &'static str) -> Self {
        Self {
            key,
            title,
            rows: Vec::new(),
            facts: Vec::new(),
        }
    }

    fn row(&mut self, row: Row) {
        self.rows.push(row);
    }

    fn fact(&mut self, key: &'static str, value: Value) {
        self.facts.push((key, value));
    }

    fn json(&self) -> Value {
        let mut o = Map::new();
        o.insert(
            "rows".into(),
            Value::Array(self.rows.iter().map(Row::json).collect()),
        );
        for (k, v) in &self.facts {
            o.insert((*k).into(), v.clone());
        }
        Value::Object(o)
    }

    fn print(&self) {
        println!("{}", self.title);
        for r in &self.rows {
            let target = match r.target_ms {
                Some(t) => format!(
                    "  target <= {t} ms: {}",
                    if r.median() <= t { "met" } else { "MISSED" }
                ),
                None => String::new(),
            };
            println!(
                "  {:<58} {:>3}  median {:>8.2} ms  p99 {:>8.2} ms{target}",
                r.name,
                r.samples.len(),
                r.median(),
                quantile(&r.samples, 0.99),
            );
        }
        for (k, v) in &self.facts {
            match v {
                Value::String(s) => println!("  {k}: {s}"),
                other => println!("  {k}: {other}"),
            }
        }
    }
}

/// Runs `sandcell bench durable`.
pub async fn durable(args: DurableArgs, engine: Engine) -> anyhow::Result<ExitCode> {
    if args.samples < 3 {
        bail!("--samples must be at least 3");
    }
    let restarts = args.restarts.unwrap_or(args.samples.min(5));
    if restarts == 0 {
        bail!("--restarts must be at least 1");
    }
    let dir = std::env::temp_dir().join(format!("sandcell-bench-durable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let out = measure(&args, restarts, engine, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let sections = out?;
    if args.json {
        let mut o = Map::new();
        for s in &sections {
            o.insert(s.key.into(), s.json());
        }
        println!("{}", serde_json::to_string_pretty(&Value::Object(o))?);
    } else {
        for s in &sections {
            s.print();
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn progress(what: &str) {
    eprintln!("bench durable: {what}");
}

/// The daemon's scenarios (resume, fork), then the step snapshot on an embedded service,
/// which takes the engine; the sections in the report's order.
async fn measure(
    args: &DurableArgs,
    restarts: usize,
    engine: Engine,
    dir: &std::path::Path,
) -> anyhow::Result<Vec<Section>> {
    let turns: Vec<Value> = resume::turns(restarts)
        .into_iter()
        .chain(fork::turns(args.samples, false))
        .chain(fork::turns(args.samples, true))
        .collect();
    let model = model::Model::start(&turns, dir)?;
    progress("starting `sandcell serve` on a temporary home");
    let mut daemon =
        Daemon::start_with(0, &[format!("agent.openai.base_url={}", model.base)]).await?;
    let on_daemon = async {
        progress(&format!(
            "resume: {restarts} runs, each killed (-9) during its step 2 model call, the daemon restarted"
        ));
        let resumed = resume::resume(&mut daemon, &model, restarts).await?;
        progress(&format!(
            "fork: {} forks from step 2 of a finished 3-step run, small kernel state, then 5 MB",
            args.samples
        ));
        let small = fork::fork(&daemon, args.samples, false).await?;
        let big = fork::fork(&daemon, args.samples, true).await?;
        anyhow::Ok((resumed, small, big))
    }
    .await;
    if on_daemon.is_err() {
        eprintln!("{}", daemon.log_tail(30));
    }
    progress("stopping the daemon (SIGTERM)");
    let stopped = daemon.stop(&engine).await;
    drop(daemon);
    let (resumed, small, big) = on_daemon?;
    stopped?;
    progress(&format!(
        "step snapshot: {} snapshots of a python sandbox holding ~5 MB, and {} of pickle + tar",
        args.samples, args.samples
    ));
    let snapshot = step_snapshot::step_snapshot(engine, args.samples, dir).await?;
    Ok(vec![snapshot, resumed, small, big])
}

const DAY_MS: i64 = 86_400_000;

/// An event's `ts` (RFC 3339 with milliseconds, UTC) as milliseconds since midnight.
fn ts_of_day(e: &Value) -> Option<i64> {
    let (_, time) = e["ts"].as_str()?.split_once('T')?;
    let (hms, millis) = time.strip_suffix('Z')?.split_once('.')?;
    let mut parts = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    Some(((h * 60 + m) * 60 + s) * 1000 + millis.parse::<i64>().ok()?)
}

/// `to - from` in milliseconds of the day, for times less than 12 hours apart.
fn day_diff(from: i64, to: i64) -> f64 {
    let diff = (to - from).rem_euclid(DAY_MS);
    (if diff > DAY_MS / 2 {
        diff - DAY_MS
    } else {
        diff
    }) as f64
}

/// Milliseconds between two events' `ts`, `to - from`.
fn ts_diff_ms(from: &Value, to: &Value) -> Option<f64> {
    Some(day_diff(ts_of_day(from)?, ts_of_day(to)?))
}

/// Now on the wall clock (which event times use), as milliseconds since midnight UTC.
fn now_of_day() -> i64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    i64::try_from(ms % 86_400_000).unwrap_or(0)
}

/// The median of signed millisecond figures; 0 without any.
fn median_ms(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_times_subtract() {
        let e = |ts: &str| json!({ "ts": ts });
        assert_eq!(
            ts_diff_ms(
                &e("2026-11-26T10:31:04.123Z"),
                &e("2026-11-26T10:31:05.001Z")
            ),
            Some(878.0)
        );
        assert_eq!(
            ts_diff_ms(
                &e("2026-11-26T10:31:05.001Z"),
                &e("2026-11-26T10:31:04.123Z")
            ),
            Some(-878.0)
        );
        // Across midnight.
        assert_eq!(
            ts_diff_ms(
                &e("2026-11-30T23:59:59.900Z"),
                &e("2026-12-01T00:00:00.100Z")
            ),
            Some(200.0)
        );
        assert_eq!(
            ts_diff_ms(&e("nonsense"), &e("2026-11-26T10:31:04.123Z")),
            None
        );
    }

    #[test]
    fn median_of_signed_values() {
        assert_eq!(median_ms(&[3.0, -1.0, 2.0]), 2.0);
        assert_eq!(median_ms(&[]), 0.0);
    }
}
