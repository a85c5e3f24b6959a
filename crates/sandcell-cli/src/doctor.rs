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
    #[command(flatten)]
    config: crate::daemon::ConfigArgs,
}

/// The agent runtime's providers as the settings and the environment make them: base URL,
/// which variable holds the key and whether it is set (never the key).
fn agent_report(args: &DoctorArgs) -> serde_json::Value {
    let config = match args.config.load(Vec::new()) {
        Ok((c, _)) => c,
        Err(e) => return json!({"error": format!("{e:#}")}),
    };
    let llm = sandcell_agent::settings::llm_config(&config.agent, |k| std::env::var(k).ok());
    let providers: Vec<serde_json::Value> = sandcell_llm::ProviderKind::ALL
        .iter()
        .map(|&kind| {
            let p = llm.provider(kind);
            json!({
                "provider": kind.name(),
                "base_url": p.base_url,
                "key_env": p.key_env,
                "key_set": p.api_key.is_some(),
                "official": p.is_official(kind),
            })
        })
        .collect();
    json!({
        "model": (!config.agent.model.is_empty()).then_some(config.agent.model.clone()),
        "providers": providers,
    })
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
            "agent": agent_report(&args),
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
        let agent = agent_report(&args);
        match agent["error"].as_str() {
            Some(e) => println!("agent: the settings do not load: {e}"),
            None => {
                println!(
                    "agent: default model {}",
                    agent["model"]
                        .as_str()
                        .unwrap_or("(none: pass --model provider/model)")
                );
                for p in agent["providers"].as_array().into_iter().flatten() {
                    let key = if p["key_set"] == true {
                        "key set"
                    } else if p["official"] == true {
                        "NO KEY"
                    } else {
                        "no key (fine for a local server)"
                    };
                    println!(
                        "  {:<9} {} · ${} · {key}",
                        p["provider"].as_str().unwrap_or_default(),
                        p["base_url"].as_str().unwrap_or_default(),
                        p["key_env"].as_str().unwrap_or_default(),
                    );
                }
            }
        }
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
