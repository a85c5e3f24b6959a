//! `sandcell bench agent`: the agent runtime's own cost per step. Both sides talk to the same
//! scripted model (the test kit's `scripted-llm`, on loopback) and run the same code
//! (`pass`) in the same warm kernel, through the same service:
//! - the runtime: runs in tools mode, each step a model call, a tool call and the step's
//!   commit, timed between `step_committed` events as they happen;
//! - a minimal hand-written loop: the same streamed HTTP call, then `run_code`, nothing else.
//!
//! The difference is what the runtime adds per step: budgets, the trajectory written to the
//! store and the mirror, tool dispatch and message building. The runtime runs without step
//! snapshots for that, then again with the default policy (`on_mutation`: every step here,
//! since each runs code), to show what a step snapshot adds on top.

use std::process::{Child, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sandcell_agent::Runner;
use sandcell_agent::event::EventKind;
use sandcell_api::SandboxId;
use sandcell_api::code::CodeInput;
use sandcell_api::runs::{BudgetsInput, SnapshotPolicy, StartRun};
use sandcell_api::sandboxes::CreateSandbox;
use sandcell_engine::Engine;
use sandcell_service::Caller;
use serde_json::json;

use super::stats::quantile;

/// Steps per run (a run's iterations are capped at 50; the last answers).
const STEPS_PER_RUN: usize = 49;

/// The scripted model server, stopped when dropped.
struct ScriptedModel {
    child: Child,
    base: String,
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a scripted model answering `turns` in order, on a free loopback port.
fn start_model(
    turns: &serde_json::Value,
    dir: &std::path::Path,
    name: &str,
) -> anyhow::Result<ScriptedModel> {
    let script = dir.join(format!("{name}.json"));
    std::fs::write(&script, turns.to_string()).context("write the model's script")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("find a free port")?
        .port();
    let mut child = std::process::Command::new(super::host::scripted_llm_bin()?)
        .args(["--port", &port.to_string(), "--script"])
        .arg(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start scripted-llm")?;
    // It prints one line once it accepts connections.
    let stdout = child.stdout.take().context("scripted-llm's stdout")?;
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
        .context("read scripted-llm's first line")?;
    if !line.starts_with("listening on") {
        bail!("scripted-llm said {line:?}");
    }
    Ok(ScriptedModel {
        child,
        base: format!("http://127.0.0.1:{port}/v1"),
    })
}

fn code_turn() -> serde_json::Value {
    json!({"tool_calls": [{"name": "execute_code", "arguments": {"code": "pass"}}]})
}

/// Runs the benchmark.
pub async fn agent(engine: Engine, steps: usize, json_out: bool) -> anyhow::Result<ExitCode> {
    let runs = steps.div_ceil(STEPS_PER_RUN).max(1);
    let home = std::env::temp_dir().join(format!("sandcell-bench-agent-{}", std::process::id()));
    std::fs::create_dir_all(&home).with_context(|| format!("create {}", home.display()))?;
    let turns_per_run: Vec<serde_json::Value> = (0..STEPS_PER_RUN)
        .map(|_| code_turn())
        .chain([json!({"text": "done"})])
        .collect();
    // The runtime's runs twice: without step snapshots, then with them.
    let agent_turns: Vec<serde_json::Value> =
        (0..2 * runs).flat_map(|_| turns_per_run.clone()).collect();
    let loop_turns: Vec<serde_json::Value> =
        (0..runs * STEPS_PER_RUN).map(|_| code_turn()).collect();
    let agent_model = start_model(&json!(agent_turns), &home, "agent")?;
    let loop_model = start_model(&json!(loop_turns), &home, "loop")?;

    let (mut config, _) = sandcell_server::config::load(
        &home,
        None,
        &[],
        &[("agent.openai.base_url".into(), agent_model.base.clone())],
    )?;
    config.agent.max_iterations = 50;
    let embedded = sandcell_server::embedded(config, engine)
        .await
        .context("start the embedded service")?;
    let outcome = measure(&embedded, &loop_model.base, runs).await;
    embedded.shutdown().await;
    let _ = std::fs::remove_dir_all(&home);
    let Steps {
        runtime,
        snapshotted,
        minimal,
    } = outcome?;
    if std::env::var_os("SANDCELL_BENCH_STEPS").is_some() {
        // Every step's time, in order, to find where the slow ones fall.
        for (i, ((r, s), m)) in runtime.iter().zip(&snapshotted).zip(&minimal).enumerate() {
            eprintln!(
                "step {i:4}  runtime {:8.3} ms  with snapshots {:8.3} ms  minimal {:8.3} ms",
                r.as_secs_f64() * 1e3,
                s.as_secs_f64() * 1e3,
                m.as_secs_f64() * 1e3
            );
        }
    }

    let row = |name: &str, s: &[Duration]| json!({"name": name, "steps": s.len(), "median_ms": quantile(s, 0.5), "p99_ms": quantile(s, 0.99)});
    let overhead = quantile(&runtime, 0.5) - quantile(&minimal, 0.5);
    let overhead_p99 = quantile(&runtime, 0.99) - quantile(&minimal, 0.99);
    let snapshot_median = quantile(&snapshotted, 0.5) - quantile(&runtime, 0.5);
    if json_out {
        let out = json!({
            "runtime": row("agent runtime (tools mode)", &runtime),
            "runtime_snapshots": row("agent runtime, step snapshots on_mutation", &snapshotted),
            "minimal": row("minimal loop (HTTP call + run_code)", &minimal),
            "overhead_median_ms": overhead,
            "overhead_p99_ms": overhead_p99,
            "step_snapshot_median_ms": snapshot_median,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("agent step: a streamed model call on loopback + `pass` in a warm Python kernel");
        for (name, s) in [
            ("agent runtime (tools mode)", &runtime),
            ("  with step snapshots (on_mutation)", &snapshotted),
            ("minimal loop (same call + run_code)", &minimal),
        ] {
            println!(
                "  {name:<38} {:>4} steps  median {:>7.3} ms  p99 {:>7.3} ms",
                s.len(),
                quantile(s, 0.5),
                quantile(s, 0.99)
            );
        }
        println!(
            "  the runtime's own cost per step: median {overhead:+.3} ms, p99 {overhead_p99:+.3} ms"
        );
        println!("  a step snapshot adds: median {snapshot_median:+.3} ms");
    }
    Ok(ExitCode::SUCCESS)
}

/// Per-step durations of each side.
struct Steps {
    /// The runtime without step snapshots: its own cost.
    runtime: Vec<Duration>,
    /// The runtime with the default step snapshots.
    snapshotted: Vec<Duration>,
    /// The minimal loop.
    minimal: Vec<Duration>,
}

/// Per-step durations of the runtime and of the minimal loop, on one warm sandbox.
async fn measure(
    embedded: &sandcell_server::Embedded,
    loop_base: &str,
    runs: usize,
) -> anyhow::Result<Steps> {
    let caller = embedded
        .admin_caller()?
        .context("the embedded service's admin key")?;
    let service = embedded.service();
    let runner: Arc<Runner> = embedded.runner();
    let info = service
        .create_sandbox(
            &caller,
            CreateSandbox {
                template: Some("python".into()),
                ..CreateSandbox::default()
            },
        )
        .await?;
    let sandbox = SandboxId::parse(info.id)?;
    let pass = || CodeInput {
        code: sandcell_api::Code::new("pass").expect("a short snippet"),
        ..CodeInput::default()
    };
    // Warm the kernel.
    service.run_code(&caller, &sandbox, pass()).await?;

    // The runtime's own cost without step snapshots, then what the default policy adds: every
    // step here runs code, so `on_mutation` snapshots each one.
    let runtime = runtime_steps(&runner, &caller, &sandbox, runs, SnapshotPolicy::Off).await?;
    let snapshotted =
        runtime_steps(&runner, &caller, &sandbox, runs, SnapshotPolicy::OnMutation).await?;

    // The minimal loop: the requests a run's steps send (the conversation grows by a tool
    // call and its result each step, and starts again where a run would), then the code.
    let http = reqwest::Client::new();
    let tools: Vec<serde_json::Value> = sandcell_agent::tools::specs()
        .iter()
        .map(|t| {
            json!({
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            })
        })
        .collect();
    let mut minimal = Vec::new();
    let mut messages = Vec::new();
    for i in 0..runs * STEPS_PER_RUN {
        if i % STEPS_PER_RUN == 0 {
            messages = vec![json!({"role": "user", "content": "bench"})];
        }
        let t = Instant::now();
        let body = json!({
            "model": "bench",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": 4096,
            "messages": messages,
            "tools": tools,
        });
        let answer = http
            .post(format!("{loop_base}/chat/completions"))
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        if !answer.windows(6).any(|w| w == b"[DONE]") {
            bail!("the scripted model's stream did not end");
        }
        let out = service.run_code(&caller, &sandbox, pass()).await?;
        let id = format!("call_{i}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "execute_code", "arguments": "{\"code\":\"pass\"}"}}
        ]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": out.stdout}));
        minimal.push(t.elapsed());
    }
    Ok(Steps {
        runtime,
        snapshotted,
        minimal,
    })
}

/// Per-step durations of the runtime, `runs` runs of [`STEPS_PER_RUN`] steps under the
/// step-snapshot `policy`, timed between `step_committed` events as they happen.
async fn runtime_steps(
    runner: &Arc<Runner>,
    caller: &Caller,
    sandbox: &SandboxId,
    runs: usize,
    policy: SnapshotPolicy,
) -> anyhow::Result<Vec<Duration>> {
    let mut runtime = Vec::new();
    for _ in 0..runs {
        let started = runner
            .start(
                caller,
                StartRun {
                    task: "bench".into(),
                    model: Some("openai/bench".into()),
                    sandbox_id: Some(sandbox.clone()),
                    budgets: BudgetsInput {
                        max_iterations: Some(50),
                        ..BudgetsInput::default()
                    },
                    snapshots: Some(policy),
                    ..StartRun::default()
                },
            )
            .await?;
        let mut rx = runner
            .subscribe(caller, &started.id)?
            .context("the run ended before it could be followed")?;
        let mut last: Option<Instant> = None;
        while let Ok(e) = rx.recv().await {
            match e.kind {
                EventKind::LlmRequest { .. } if last.is_none() => last = Some(Instant::now()),
                EventKind::StepCommitted { .. } => {
                    let now = Instant::now();
                    if let Some(t) = last {
                        runtime.push(now - t);
                    }
                    last = Some(now);
                }
                EventKind::RunFinished { .. } => break,
                _ => {}
            }
        }
        let done = runner.wait(caller, &started.id).await?;
        if done.status != "succeeded" {
            bail!("a benchmark run ended {} ({:?})", done.status, done.reason);
        }
    }
    Ok(runtime)
}
