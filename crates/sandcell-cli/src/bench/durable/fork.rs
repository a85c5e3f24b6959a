//! Fork to first result: a finished run of three code steps (`keep_snapshots`, so each
//! step's snapshot stays) is forked from step 2 again and again; each sample is
//! `POST /v1/runs/{id}/fork` until the fork's first `tool_result` event reaches the client
//! over the run's event stream (SSE), the scripted model answering at once. The stream is
//! read two ways, interleaved: on the connection the POST used (kept alive, as a client
//! does), and on a new one. Its parts: the POST's answer (the sandbox restored from step
//! 2's snapshot, the fork started), and when the daemon committed each of the fork's events
//! (their `ts`, milliseconds). Beside it, the restore alone:
//! `POST /v1/runs/{id}/steps/2/sandbox`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sandcell_api::runs::{ForkRun, StartRun};
use serde_json::{Value, json};

use super::model::{MODEL, code_call, text};
use super::resume::wait_ended;
use super::{Row, Section, day_diff, median_ms, now_of_day, ts_diff_ms, ts_of_day};
use crate::bench::daemon::server::Daemon;

/// Code putting ~5 MB of state in the kernel (the step snapshot scenario's list).
pub(super) const BIG_STATE: &str = "data = [str(i) * 10 for i in range(96_000)]";

/// The model's turns: the original run (three code steps and an answer), then a warm-up
/// round and `samples` rounds of two forks (each one code step and an answer).
pub(super) fn turns(samples: usize, big: bool) -> Vec<Value> {
    let first = if big {
        format!("{BIG_STATE}\nx = 1")
    } else {
        "x = 1".into()
    };
    [
        code_call(&first),
        code_call("x = 2"),
        code_call("x = 3"),
        text("original done"),
    ]
    .into_iter()
    .chain((0..=samples * 2 + 1).flat_map(|_| [code_call("print('X', x)"), text("fork done")]))
    .collect()
}

/// One fork, followed to its end.
struct Forked {
    /// The POST answered.
    answered: Duration,
    /// The first `tool_result` was read from the stream.
    first_result: Duration,
    /// The fork's first event of each type, committed this long after the POST was sent
    /// (the daemon's clock, milliseconds).
    committed: BTreeMap<String, f64>,
    /// Its `llm_request` to its `tool_result`, by their times.
    model_to_result: Option<f64>,
}

/// Forks `original` from step 2 and follows the fork's events to its end, on `d.api`'s
/// connection (`new_connection`: on a client of its own).
async fn fork_once(d: &Daemon, original: &str, new_connection: bool) -> anyhow::Result<Forked> {
    let follower = if new_connection {
        d.new_client()?
    } else {
        d.api.clone()
    };
    let wall = now_of_day();
    let t = Instant::now();
    let fork = d
        .api
        .fork_run(
            original,
            &ForkRun {
                from_step: 2,
                task: Some("Print x.".into()),
                ..ForkRun::default()
            },
        )
        .await
        .context("fork the run")?;
    let answered = t.elapsed();
    let mut stream = follower.follow_run(&fork.id, 0).await?;
    let mut first_result = None;
    while let Some(e) = stream.next().await {
        let e = e?;
        match e["type"].as_str() {
            Some("tool_result") if first_result.is_none() => {
                first_result = Some(t.elapsed());
                let text = e["text"].as_str().unwrap_or_default();
                if !text.contains("X 2") {
                    bail!("the fork from step 2 printed {text:?}, not x = 2");
                }
            }
            Some("run_finished") => break,
            _ => {}
        }
    }
    let Some(first_result) = first_result else {
        bail!("the fork {} gave no tool result", fork.id);
    };
    let info = wait_ended(d, &fork.id).await?;
    if info.status != "succeeded" {
        bail!(
            "the fork {} ended {} ({:?})",
            fork.id,
            info.status,
            info.reason
        );
    }
    let events = d.api.run_events(&fork.id, 0).await?;
    let mut committed = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for e in &events {
        if let (Some(kind), Some(ts)) = (e["type"].as_str(), ts_of_day(e))
            && seen.insert(kind)
        {
            committed.insert(kind.to_string(), day_diff(wall, ts));
        }
    }
    let first = |kind: &str| events.iter().find(|e| e["type"] == kind);
    let model_to_result = match (first("llm_request"), first("tool_result")) {
        (Some(a), Some(b)) => ts_diff_ms(a, b),
        _ => None,
    };
    Ok(Forked {
        answered,
        first_result,
        committed,
        model_to_result,
    })
}

/// Makes the original run, then forks it `samples` times each way (after a warm-up round),
/// with a restore alone in each round.
pub(super) async fn fork(d: &Daemon, samples: usize, big: bool) -> anyhow::Result<Section> {
    let original = d
        .api
        .start_run(&StartRun {
            task: "Count to three.".into(),
            model: Some(MODEL.into()),
            wait: true,
            keep_snapshots: true,
            ..StartRun::default()
        })
        .await
        .context("the original run")?;
    if original.status != "succeeded" {
        bail!(
            "the original run ended {} ({:?})",
            original.status,
            original.reason
        );
    }
    let events = d.api.run_events(&original.id, 0).await?;
    let snapshots: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "step_committed")
        .map(|e| &e["snapshot"])
        .collect();
    if snapshots.len() != 3 || snapshots.iter().any(|s| !s["snapshot_id"].is_string()) {
        bail!("the original run's steps are not three with a snapshot each: {snapshots:?}");
    }
    let step2 = snapshots[1].clone();

    let mut kept_alive = Vec::new();
    let mut new_conn = Vec::new();
    let mut restores = Vec::new();
    for i in 0..=samples {
        let a = fork_once(d, &original.id, false).await?;
        let b = fork_once(d, &original.id, true).await?;
        let t = Instant::now();
        let made = d.api.step_sandbox(&original.id, 2).await?;
        let restore = t.elapsed();
        d.api.delete_sandbox(&made.sandbox_id).await?;
        // The first round warms what a first one meets (connections, page cache).
        if i > 0 {
            kept_alive.push(a);
            new_conn.push(b);
            restores.push(restore);
        }
    }

    let state = if big { "5 MB" } else { "small" };
    let mut s = Section::new(
        if big { "fork_5mb" } else { "fork" },
        if big {
            "fork from step 2 to first result, ~5 MB of kernel state"
        } else {
            "fork from step 2 to first result, small kernel state (x = 2)"
        },
    );
    let times = |v: &[Forked], f: fn(&Forked) -> Duration| v.iter().map(f).collect::<Vec<_>>();
    s.row(
        Row::new(
            "fork_to_first_result_new_connection",
            format!("POST fork -> first tool_result, SSE on a new connection, {state}"),
            times(&new_conn, |f| f.first_result),
        )
        .target(100.0),
    );
    s.row(
        Row::new(
            "fork_to_first_result_kept_alive",
            format!("POST fork -> first tool_result, SSE on the POST's connection, {state}"),
            times(&kept_alive, |f| f.first_result),
        )
        .target(100.0),
    );
    let both: Vec<Forked> = kept_alive.into_iter().chain(new_conn).collect();
    s.row(Row::new(
        "fork_post",
        "  of which: POST fork answered (restore + start; both ways)",
        times(&both, |f| f.answered),
    ));
    s.row(Row::new(
        "restore_step",
        "restore alone: POST /v1/runs/{id}/steps/2/sandbox",
        restores,
    ));
    let mut timeline: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for f in &both {
        for (k, v) in &f.committed {
            timeline.entry(k.as_str()).or_default().push(*v);
        }
    }
    s.fact(
        "events_committed_after_post_ms",
        Value::Object(
            timeline
                .iter()
                .map(|(k, v)| ((*k).to_string(), json!(median_ms(v))))
                .collect(),
        ),
    );
    let model_to_result: Vec<f64> = both.iter().filter_map(|f| f.model_to_result).collect();
    s.fact(
        "llm_request_to_tool_result_ms",
        json!(median_ms(&model_to_result)),
    );
    s.fact("step2_snapshot", step2);
    Ok(s)
}
