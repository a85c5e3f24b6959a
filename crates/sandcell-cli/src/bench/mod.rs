//! `sandcell bench`: its arguments, and which benchmark runs. The benchmarks live in the
//! submodules: `startup` and `kernel` (the embedded engine), `daemon` (the daemon over
//! HTTP), `agent` and `durable` (agent runs), `egress` (the egress proxy), `packages`
//! (packages installed at create, on the daemon); `stats` and `host` hold what they share
//! and use none of the others. No submodule uses this one.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use sandcell_engine::Engine;

mod agent;
mod daemon;
mod durable;
mod egress;
mod host;
mod kernel;
mod packages;
mod startup;
mod stats;
mod templates;

/// Arguments of `sandcell bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Debug, Subcommand)]
enum BenchWhat {
    /// Create a sandbox and run `true` / `python3 -c pass`, against plain exec and bubblewrap.
    Startup {
        /// Runs per scenario (at least 50 for the published figures).
        #[arg(long, default_value_t = 50)]
        runs: usize,
        /// Pause before each sample, in milliseconds: 0 measures back-to-back starts, 50
        /// measures starts that come apart (kernel state such as RCU has gone idle).
        #[arg(long, default_value_t = 0)]
        gap_ms: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Python kernel: `x = 1` round trips in a warm kernel, and create-sandbox to the first
    /// result, against a `python3 -c` process per call.
    Kernel {
        /// Warm round trips (at least 1000 for the published figures).
        #[arg(long, default_value_t = 1000)]
        runs: usize,
        /// Cold starts (a new sandbox each).
        #[arg(long, default_value_t = 30)]
        cold_runs: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The daemon over HTTP on loopback: exec and `x = 1` round trips (against the embedded
    /// engine), create-to-first-result cold and from a warm pool, many concurrent clients.
    Daemon(daemon::DaemonArgs),
    /// The agent runtime's own cost per step, against a minimal loop making the same model
    /// call to the same scripted model and running the same code (needs `scripted-llm`:
    /// cargo build --release -p sandcell-testkit --features llm --bin scripted-llm).
    Agent {
        /// Steps of each (at least 200 for the published figures).
        #[arg(long, default_value_t = 200)]
        steps: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Durable agent runs: a step snapshot of a kernel holding ~5 MB, a run resumed after
    /// `kill -9` of the daemon, a fork from step 2 to its first result (needs `scripted-llm`,
    /// as `agent` does).
    Durable(durable::DurableArgs),
    /// The egress proxy: small requests and 1 MB and 100 MB downloads through the guest's
    /// bridge and the proxy (a CONNECT tunnel and a plain-HTTP request), against the same
    /// requests made directly, on loopback.
    Egress {
        /// Samples of the small request (at least 100) and of the 1 MB download.
        #[arg(long, default_value_t = 100)]
        samples: usize,
        /// Samples of the 100 MB download.
        #[arg(long, default_value_t = 5)]
        big_samples: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Packages installed at create (issue 18): `{"pip": ["sandcell-fake"]}` from a fake
    /// index on loopback with an empty cache and from the cache, against a create without
    /// packages and the host's own `pip install --target` (needs `fake-registries`: cargo
    /// build --release -p sandcell-testkit --features registries --bin fake-registries).
    Packages {
        /// Samples of each.
        #[arg(long, default_value_t = 10)]
        samples: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Sandboxes from an image (issue 19): create + exec + destroy on an image's unpacked
    /// root against the same on the host's system, and the image's first unpacking.
    Templates {
        /// Samples of each (at least 50 for the published figures).
        #[arg(long, default_value_t = 50)]
        samples: usize,
        /// An image of the home's store (default: a busybox image made for the run).
        #[arg(long, value_name = "NAME")]
        image: Option<String>,
        /// Measure builds instead: this built-in template (e.g. python-data-analysis) built
        /// once without the layer cache, then `--samples` times fully cached, in the home's
        /// store.
        #[arg(long, value_name = "BUILTIN", conflicts_with = "pool")]
        build: Option<String>,
        /// Measure creates through a daemon instead: this template of the home's store
        /// (with a `[warm] strategy = "pool"`), cold and from its pool, beside a host-based
        /// python sandbox.
        #[arg(long, value_name = "TEMPLATE", conflicts_with = "image")]
        pool: Option<String>,
        /// The backend both rows run on (`process`, `gvisor`); with `--pool`, the host-based
        /// row runs on the template's own backend instead.
        #[arg(long, default_value = "process", conflicts_with_all = ["build", "pool"])]
        backend: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `sandcell bench`.
pub async fn bench(args: BenchArgs, engine: Engine) -> anyhow::Result<ExitCode> {
    match args.what {
        BenchWhat::Startup { runs, gap_ms, json } => {
            startup::startup(engine, runs, gap_ms, json).await
        }
        BenchWhat::Kernel {
            runs,
            cold_runs,
            json,
        } => kernel::kernel(engine, runs, cold_runs, json).await,
        BenchWhat::Daemon(args) => daemon::daemon(args, engine).await,
        BenchWhat::Agent { steps, json } => agent::agent(engine, steps, json).await,
        BenchWhat::Durable(args) => durable::durable(args, engine).await,
        BenchWhat::Egress {
            samples,
            big_samples,
            json,
        } => {
            drop(engine);
            egress::egress(samples, big_samples, json).await
        }
        BenchWhat::Packages { samples, json } => packages::packages(engine, samples, json).await,
        BenchWhat::Templates {
            samples,
            build: Some(builtin),
            json,
            ..
        } => {
            drop(engine);
            templates::builds(&builtin, samples, json).await
        }
        BenchWhat::Templates {
            samples,
            pool: Some(template),
            json,
            ..
        } => {
            drop(engine);
            templates::pools(&template, samples, json).await
        }
        BenchWhat::Templates {
            samples,
            image,
            json,
            backend,
            build: None,
            pool: None,
        } => {
            let backend = sandcell_engine::BackendKind::ALL
                .into_iter()
                .find(|k| k.as_str() == backend)
                .ok_or_else(|| anyhow::anyhow!("--backend '{backend}': process or gvisor"))?;
            templates::templates(engine, samples, image, backend, json).await
        }
    }
}
