//! Resume after a crash: a run on the daemon is killed (`kill -9` of the daemon) while its
//! step 2 model call waits on the scripted model; the daemon is started again on the same
//! home, takes the run up and asks that call again. Timed per restart:
//! - the restarted process's start to its `/healthz` answering (polled every millisecond);
//! - its start to the scripted model receiving the resumed request (its request log,
//!   checked every 0.2 ms), and so `/healthz` to that request (negative when the request
//!   came first: the daemon takes runs up before it listens);
//! - from the run's events: the `resumed` event to the next `llm_request` (millisecond
//!   timestamps, the daemon's own clock).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sandcell_api::runs::StartRun;
use serde_json::{Value, json};

use super::model::{MODEL, Model, code_call, slow, text};
use super::{Row, Section, median_ms, ts_diff_ms};
use crate::bench::daemon::server::Daemon;

/// How long the killed call would have waited (it never answers in time).
const SLOW_MS: u64 = 600_000;
/// How long a run, a request or a restart may take before the benchmark fails.
const TIMEOUT: Duration = Duration::from_secs(120);
/// The run's final answer.
const ANSWER: &str = "resumed and done";

/// The model's turns for `restarts` runs: step 1 runs code, step 2's call is the slow one
/// (the daemon dies in it), and the call asked again after the restart answers.
pub(super) fn turns(restarts: usize) -> Vec<Value> {
    (0..restarts)
        .flat_map(|_| {
            [
                code_call("x = 21"),
                slow(SLOW_MS, "never read: the daemon was killed"),
                text(ANSWER),
            ]
        })
        .collect()
}

/// Runs the scenario `restarts` times on `d`, whose model is `model`.
pub(super) async fn resume(
    d: &mut Daemon,
    model: &Model,
    restarts: usize,
) -> anyhow::Result<Section> {
    let mut log = model.requests()?;
    let mut to_health = Vec::new();
    let mut to_request = Vec::new();
    let mut health_to_request = Vec::new();
    let mut event_gaps = Vec::new();
    let mut restored = Vec::new();
    for _ in 0..restarts {
        let before = log.count()?;
        let run = d
            .api
            .start_run(&StartRun {
                task: "Set x to 21, then answer.".into(),
                model: Some(MODEL.into()),
                ..StartRun::default()
            })
            .await
            .context("start a run")?;
        // Step 1's call, then step 2's: the slow one, in flight once logged.
        log.wait_for(before + 2, TIMEOUT).await?;
        d.kill9()?;
        let seen = log.count()?;
        let watch = tokio::task::spawn_blocking(move || {
            let at = log.wait_beyond(seen, TIMEOUT);
            (log, at)
        });
        let restarted = d.restart().await?;
        let (back, at) = watch.await.context("the request watcher")?;
        log = back;
        let Some(at) = at? else {
            bail!("the restarted daemon sent no request within {TIMEOUT:?}");
        };
        to_health.push(restarted.up - restarted.spawned);
        to_request.push(at - restarted.spawned);
        health_to_request.push(if at >= restarted.up {
            (at - restarted.up).as_secs_f64() * 1e3
        } else {
            -(restarted.up - at).as_secs_f64() * 1e3
        });
        let info = wait_ended(d, &run.id).await?;
        if info.status != "succeeded" || info.answer.as_deref() != Some(ANSWER) {
            bail!(
                "the resumed run {} ended {} ({:?}) with {:?}",
                run.id,
                info.status,
                info.reason,
                info.answer
            );
        }
        let events = d.api.run_events(&run.id, 0).await?;
        let resumed_at = events
            .iter()
            .position(|e| e["type"] == "resumed")
            .with_context(|| format!("run {} has no resumed event", run.id))?;
        let resumed = &events[resumed_at];
        let request = events[resumed_at..]
            .iter()
            .find(|e| e["type"] == "llm_request")
            .with_context(|| format!("run {} asked nothing after resuming", run.id))?;
        if let Some(ms) = ts_diff_ms(resumed, request) {
            event_gaps.push(ms);
        }
        restored.push(resumed["restored_from"].clone());
    }
    let mut s = Section::new(
        "resume",
        "resume after kill -9 of the daemon during a model call",
    );
    s.row(Row::new(
        "restart_to_healthz",
        "restarted daemon's start -> /healthz answers",
        to_health,
    ));
    s.row(Row::new(
        "restart_to_request",
        "restarted daemon's start -> model receives the resumed request",
        to_request,
    ));
    let median = median_ms(&health_to_request);
    s.fact(
        "healthz_to_request_ms",
        json!({"median": median, "samples": health_to_request}),
    );
    s.fact(
        "healthz_to_request",
        Value::String(format!(
            "median {median:+.2} ms (negative: the request came before /healthz answered); target <= 1000 ms: {}",
            if median <= 1000.0 { "met" } else { "MISSED" }
        )),
    );
    s.fact(
        "resumed_event_to_llm_request_ms",
        json!({"median": median_ms(&event_gaps), "samples": event_gaps}),
    );
    s.fact("restored_from", Value::Array(restored));
    Ok(s)
}

/// Waits for run `id` to end; its record.
pub(super) async fn wait_ended(
    d: &Daemon,
    id: &str,
) -> anyhow::Result<sandcell_api::runs::RunInfo> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let info = d.api.run(id).await?;
        if info.status != "running" {
            return Ok(info);
        }
        if Instant::now() > deadline {
            bail!("run {id} did not end within {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
