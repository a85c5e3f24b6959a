//! The arguments of `sandcell bench daemon`.

use clap::Args;

/// Arguments of `sandcell bench daemon`.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Round trips per scenario (exec `true` and `x = 1`, over HTTP and embedded).
    #[arg(long, default_value_t = 1000)]
    pub(super) runs: usize,
    /// Creations per create-to-first-result scenario (cold, from the pool, embedded).
    #[arg(long, default_value_t = 20)]
    pub(super) cold_runs: usize,
    /// Concurrent clients of the load test.
    #[arg(long, default_value_t = 64)]
    pub(super) clients: usize,
    /// Length of the load test in seconds.
    #[arg(long, default_value_t = 60)]
    pub(super) duration_secs: u64,
    /// Sandboxes the load test's clients share (round-robin).
    #[arg(long, default_value_t = 4)]
    pub(super) sandboxes: usize,
    /// Ready sandboxes in the daemon's python/small warm pool (0: no pool, and no pool
    /// scenario).
    #[arg(long, default_value_t = 2)]
    pub(super) pool: usize,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}
