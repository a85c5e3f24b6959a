//! Pause and resume of a sandbox with a busy Python kernel, over HTTP and through the
//! embedded engine.

use std::time::Instant;

use anyhow::Context;
use sandcell_engine::Engine;

use super::requests::{python, python_sandbox, python_spec, x_equals_1};
use super::row::Row;
use super::server::Daemon;

/// Pause and resume of a sandbox on `backend` whose Python kernel holds state and whose
/// loop is busy, over HTTP and, given an `engine`, through the embedded engine (its default
/// backend); after each resume the kernel must answer.
pub(super) async fn pause_resume(
    d: &Daemon,
    engine: Option<&Engine>,
    backend: &str,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let env = [("SANDCELL_BENCH", "pause")];
    let id = d
        .create(&python_sandbox(&env, Some(backend), false))
        .await?;
    let sb = match engine {
        Some(engine) => Some(
            engine
                .create(python_spec(&env)?)
                .await
                .context("create an embedded sandbox")?,
        ),
        None => None,
    };
    // Something to freeze: a process that wakes up every millisecond.
    let busy = "import subprocess; subprocess.Popen(['sh', '-c', 'while :; do sleep 0.001; done'])";
    d.code_ok(&id, &python(busy)).await?;
    let mut rows = vec![
        Row::on(backend, "pause_http", "pause, HTTP"),
        Row::on(backend, "resume_http", "resume, HTTP"),
    ];
    if let Some(sb) = &sb {
        sb.run_code(x_equals_1(busy))
            .await
            .context("embedded busy loop")?;
        rows.extend([
            Row::on(backend, "pause_embedded", "pause, embedded engine"),
            Row::on(backend, "resume_embedded", "resume, embedded engine"),
        ]);
    }
    for i in 0..runs + 2 {
        let t = Instant::now();
        d.api.pause_sandbox(&id).await?;
        let pause_http = t.elapsed();
        let t = Instant::now();
        d.api.resume_sandbox(&id).await?;
        let resume_http = t.elapsed();
        d.code_ok(&id, &python("x = 1")).await?;
        let mut samples = vec![pause_http, resume_http];

        if let Some(sb) = &sb {
            let t = Instant::now();
            sb.pause().await.context("embedded pause")?;
            let pause_embedded = t.elapsed();
            let t = Instant::now();
            sb.resume().await.context("embedded resume")?;
            let resume_embedded = t.elapsed();
            sb.run_code(x_equals_1("x = 1"))
                .await
                .context("embedded x = 1 after resume")?;
            samples.extend([pause_embedded, resume_embedded]);
        }
        // The first two are warm-up.
        if i >= 2 {
            for (row, sample) in rows.iter_mut().zip(samples) {
                row.samples.push(sample);
            }
        }
    }
    if let Some(sb) = sb {
        sb.destroy().await.context("destroy the embedded sandbox")?;
    }
    d.delete(&id).await?;
    Ok(rows)
}
