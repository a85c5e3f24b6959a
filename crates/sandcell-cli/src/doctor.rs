//! `sandcell doctor`: what isolation this host supports, proven by starting a sandbox.

use std::process::ExitCode;

use clap::Args;
use sandcell_protocol::{ExecRequest, FeatureState, IsolationReport};
use serde_json::json;

/// Arguments of `sandcell doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `sandcell doctor`.
pub async fn doctor(args: DoctorArgs, engine: sandcell_engine::Engine) -> anyhow::Result<ExitCode> {
    let caps = engine.capabilities();
    // The probe says what should work; a real sandbox says what does.
    let live = match engine.create(Default::default()).await {
        Ok(sb) => {
            let id = sb.exec(ExecRequest::argv(["id", "-u"])).await;
            let _ = sb.destroy().await;
            match id {
                Ok(out) => Ok((
                    sb.isolation().clone(),
                    String::from_utf8_lossy(&out.stdout).trim().to_string(),
                    sb.timings(),
                )),
                Err(e) => Err(format!("sandbox started but exec failed: {e}")),
            }
        }
        Err(e) => Err(e.to_string()),
    };
    let hints = sandcell_jail::probe::tuning_hints(std::path::Path::new("/sys/fs/cgroup"));
    // What sandboxes share on this host (the root skeleton is repaired if need be).
    let runtime = IsolationReport {
        features: sandcell_backend_process::ProcessBackend::new(crate::cli::backend_config()?)
            .check_runtime(),
    };
    if args.json {
        let out = json!({
            "backends": caps,
            "sandbox": match &live {
                Ok((iso, uid, t)) => json!({"ok": true, "isolation": iso, "uid": uid, "timings": t}),
                Err(e) => json!({"ok": false, "error": e}),
            },
            "seccomp_denied": sandcell_jail::seccomp::denied_syscalls(),
            "runtime": runtime,
            "tuning_hints": hints,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for c in &caps {
            println!(
                "backend {}: {} · isolation {} · pause {} · snapshots {}",
                c.kind.as_str(),
                if c.available {
                    "available"
                } else {
                    "NOT available"
                },
                c.isolation_level,
                if c.supports_pause { "yes" } else { "no" },
                c.checkpoint_fidelity
            );
            println!("  host support:");
            print_report(&c.host);
        }
        match &live {
            Ok((iso, uid, t)) => {
                println!(
                    "test sandbox: started in {:.1} ms, runs as uid {uid}; isolation in force:",
                    t.create_ms
                );
                print_report(iso);
            }
            Err(e) => println!("test sandbox: FAILED: {e}"),
        }
        println!("shared by sandboxes on this host:");
        print_report(&runtime);
        for hint in &hints {
            println!("hint: {hint}");
        }
        println!(
            "seccomp denies: {}",
            sandcell_jail::seccomp::denied_syscalls().join(" ")
        );
    }
    Ok(if live.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_report(report: &IsolationReport) {
    for f in &report.features {
        let mark = match f.state {
            FeatureState::Active => "ok      ",
            FeatureState::Degraded => "degraded",
            FeatureState::Unavailable => "missing ",
            FeatureState::Disabled => "off     ",
        };
        println!("    {mark} {:<14} {}", f.name, f.detail);
    }
}
