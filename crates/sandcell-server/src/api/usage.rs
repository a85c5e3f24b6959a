//! `GET /v1/sandboxes/{id}/metrics`: what a sandbox uses now, from its cgroup.

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use sandcell_api::usage::SandboxUsage;

use super::extract::{ApiPath, check_sandbox_id};
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody};
use crate::state::AppState;

use sandcell_service::usage::SAMPLE_MAX_AGE;

/// The window of a fresh pair of samples.
const SAMPLE_WINDOW: Duration = Duration::from_millis(100);

/// CPU, memory and process counts of a sandbox (from cgroups; `null` where the host has
/// none).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = SandboxUsage),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn usage(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<SandboxUsage>> {
    check_sandbox_id(&id)?;
    let sandbox = s.fleet.sandbox_as_is(&caller.owner, &id)?;
    let mut now = sandbox.usage();
    let mut cpu_percent = None;
    if let Some(cpu) = now.cpu_usage_us {
        let taken = Instant::now();
        let before = s
            .cpu_samples
            .swap(&id, (taken, cpu))
            .filter(|(at, _)| at.elapsed() < SAMPLE_MAX_AGE && *at < taken);
        let (start, start_cpu, end, end_cpu) = match before {
            Some((at, c)) => (at, c, taken, cpu),
            None => {
                tokio::time::sleep(SAMPLE_WINDOW).await;
                now = sandbox.usage();
                let later = Instant::now();
                let c = now.cpu_usage_us.unwrap_or(cpu);
                s.cpu_samples.swap(&id, (later, c));
                (taken, cpu, later, c)
            }
        };
        let wall = end.duration_since(start).as_secs_f64();
        if wall > 0.0 {
            let used = end_cpu.saturating_sub(start_cpu) as f64 / 1e6;
            cpu_percent = Some((used / wall * 1000.0).round() / 10.0);
        }
    }
    let limits = &sandbox.spec().limits;
    Ok(Json(SandboxUsage {
        cpu_percent,
        cpu_seconds: now.cpu_usage_us.map(|us| us as f64 / 1e6),
        cpu_limit: limits.cpus,
        memory_bytes: now.memory_bytes,
        memory_peak_bytes: now.memory_peak_bytes,
        memory_limit_bytes: limits.memory_bytes,
        pids: now.pids_current,
        pids_limit: limits.pids,
        oom_kills: now.oom_kills,
        pids_limit_hits: now.pids_limit_hits,
    }))
}
