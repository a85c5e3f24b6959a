//! Round trips in a warm sandbox: exec `true`, Python `x = 1`, `GET /healthz` and
//! `GET /v1/sandboxes/{id}` over HTTP, next to the same calls through the embedded engine.

use std::time::Instant;

use anyhow::{Context, bail};
use sandcell_api::exec::ExecInput;
use sandcell_engine::Engine;
use sandcell_protocol::ExecRequest;

use super::requests::{python, python_sandbox, python_spec, x_equals_1};
use super::row::Row;
use super::server::Daemon;

/// Exec `true` and `x = 1` in one warm sandbox over HTTP and in one through the embedded
/// engine, interleaved so that both see the same machine.
pub(super) async fn round_trips(
    d: &Daemon,
    engine: &Engine,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    // The env keeps this sandbox out of the warm pool (the pool stays full and idle).
    let env = [("SANDCELL_BENCH", "round-trips")];
    let id = d.create(&python_sandbox(&env, None, false)).await?;
    let sb = engine
        .create(python_spec(&env)?)
        .await
        .context("create an embedded sandbox")?;
    let exec_body = ExecInput {
        argv: Some(vec!["true".into()]),
        ..ExecInput::default()
    };
    let code_body = python("x = 1");
    let mut rows = vec![
        Row::new("exec_http", "exec `true`, HTTP"),
        Row::new("exec_embedded", "exec `true`, embedded engine"),
        Row::new("code_http", "python `x = 1`, HTTP"),
        Row::new("code_embedded", "python `x = 1`, embedded engine"),
        // Where the HTTP share goes: the floor (no key, no sandbox), then a key check and a
        // record read.
        Row::new("healthz_http", "GET /healthz, HTTP (no key, no sandbox)"),
        Row::new("get_http", "GET /v1/sandboxes/{id}, HTTP (key, record)"),
    ];
    let warmup = (runs / 10).clamp(10, 100);
    for i in 0..warmup + runs {
        let t = Instant::now();
        d.exec_ok(&id, &exec_body).await?;
        let exec_http = t.elapsed();

        let t = Instant::now();
        let out = sb
            .exec(ExecRequest::argv(["true"]))
            .await
            .context("embedded exec")?;
        let exec_embedded = t.elapsed();
        if !out.result.success() {
            bail!("embedded `true` failed: {}", out.result.message);
        }

        let t = Instant::now();
        d.code_ok(&id, &code_body).await?;
        let code_http = t.elapsed();

        let t = Instant::now();
        let run = sb
            .run_code(x_equals_1("x = 1"))
            .await
            .context("embedded x = 1")?;
        let code_embedded = t.elapsed();
        if !run.ok() {
            bail!("embedded x = 1 failed: {:?}", run.done);
        }

        let t = Instant::now();
        d.healthz().await?;
        let healthz = t.elapsed();

        let t = Instant::now();
        d.api.sandbox(&id).await?;
        let get = t.elapsed();

        if i >= warmup {
            let samples = [
                exec_http,
                exec_embedded,
                code_http,
                code_embedded,
                healthz,
                get,
            ];
            for (row, s) in rows.iter_mut().zip(samples) {
                row.samples.push(s);
            }
        }
    }
    sb.destroy().await.context("destroy the embedded sandbox")?;
    d.delete(&id).await?;
    Ok(rows)
}
