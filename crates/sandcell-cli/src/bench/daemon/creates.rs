//! Create-to-first-result: cold and from the warm pool over HTTP, cold through the embedded
//! engine, and a `python3 -c` process on the host.

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use sandcell_engine::Engine;

use super::requests::{python_sandbox, python_spec, x_equals_1};
use super::row::Row;
use super::server::Daemon;
use crate::bench::host::PYTHON;

/// Create-to-first-result (`1+1`): cold over HTTP, from the warm pool over HTTP, cold
/// through the embedded engine, and a `python3 -c` process on the host. Before each sample
/// the pool is full again, so no refill runs during a measurement. Returns the rows and how
/// many of the pool creations were pool hits.
pub(super) async fn creates(
    d: &Daemon,
    engine: &Engine,
    runs: usize,
    pool: usize,
) -> anyhow::Result<(Vec<Row>, Option<u64>)> {
    let cold_body = python_sandbox(&[("A", "1")], None, false);
    let pool_body = python_sandbox(&[], None, false);
    let spec = python_spec(&[("A", "1")])?;
    let mut cold = Row::new("create_cold_http", "create + first result, cold, HTTP");
    let mut pooled = Row::new("create_pool_http", "create + first result, warm pool, HTTP");
    let mut embedded = Row::new(
        "create_cold_embedded",
        "create + first result, cold, embedded engine",
    );
    let mut host = Row::new("python3_host", "python3 -c 'print(1+1)' on the host");
    let mut hits = 0;
    // The first round warms up and is not kept.
    for i in 0..=runs {
        let keep = i > 0;
        d.wait_pool_full(pool).await?;
        let t = Instant::now();
        let id = d.create(&cold_body).await?;
        d.first_result(&id).await?;
        let took = t.elapsed();
        d.delete(&id).await?;
        if keep {
            cold.samples.push(took);
        }

        if pool > 0 {
            d.wait_pool_full(pool).await?;
            let before = d
                .metric("sandcell_pool_requests_total{result=\"hit\"}")
                .await?;
            let t = Instant::now();
            let id = d.create(&pool_body).await?;
            d.first_result(&id).await?;
            let took = t.elapsed();
            let after = d
                .metric("sandcell_pool_requests_total{result=\"hit\"}")
                .await?;
            d.delete(&id).await?;
            if keep {
                pooled.samples.push(took);
                if after > before {
                    hits += 1;
                }
            }
        }

        d.wait_pool_full(pool).await?;
        let t = Instant::now();
        let sb = engine
            .create(spec.clone())
            .await
            .context("create an embedded sandbox")?;
        let run = sb
            .run_code(x_equals_1("1+1"))
            .await
            .context("embedded 1+1")?;
        let took = t.elapsed();
        sb.destroy().await.context("destroy the embedded sandbox")?;
        if run.result_text() != Some("2") {
            bail!("embedded 1+1 gave {:?}", run.result_text());
        }
        if keep {
            embedded.samples.push(took);
        }

        let t = Instant::now();
        let out = Command::new(PYTHON)
            .args(["-c", "print(1+1)"])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {PYTHON} on the host"))?;
        let took = t.elapsed();
        if !out.status.success() || out.stdout != b"2\n" {
            bail!("python3 -c 'print(1+1)' on the host failed: {}", out.status);
        }
        if keep {
            host.samples.push(took);
        }
    }
    let mut rows = vec![cold];
    if pool > 0 {
        rows.push(pooled);
    }
    rows.extend([embedded, host]);
    Ok((rows, (pool > 0).then_some(hits)))
}
