//! A sandbox's resource use, from its cgroup.

use serde::{Deserialize, Serialize};

/// A sandbox's resource use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxUsage {
    /// CPU use since the previous call (or over the last 100 ms), in percent of one CPU
    /// (200 = two CPUs busy).
    pub cpu_percent: Option<f64>,
    /// CPU time used since the sandbox started, in seconds.
    pub cpu_seconds: Option<f64>,
    /// Its CPU limit.
    pub cpu_limit: Option<f64>,
    /// Memory in use, in bytes (page cache included).
    pub memory_bytes: Option<u64>,
    /// The highest memory use seen.
    pub memory_peak_bytes: Option<u64>,
    /// Its memory limit.
    pub memory_limit_bytes: Option<u64>,
    /// Processes and threads now.
    pub pids: Option<u64>,
    /// Its process limit.
    pub pids_limit: Option<u64>,
    /// Processes the OOM killer ended so far.
    pub oom_kills: Option<u64>,
    /// Forks refused by the process limit so far.
    pub pids_limit_hits: Option<u64>,
}
