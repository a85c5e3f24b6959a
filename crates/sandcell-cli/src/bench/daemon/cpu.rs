//! Where the CPU went during the load test, from `/proc`. It uses no other module of
//! `bench daemon`.

/// Where the CPU went during the load test, in cores (1.0 = one core busy all the time).
pub(super) struct CpuShare {
    pub(super) daemon: f64,
    pub(super) client: f64,
    /// Inside the load test's sandboxes (their cgroups), when the host reports it.
    pub(super) sandboxes: Option<f64>,
    pub(super) machine: f64,
    pub(super) cores: usize,
}

/// CPU time so far (in clock ticks): the daemon's, this process's, the machine's.
pub(super) struct CpuTimes {
    daemon: u64,
    client: u64,
    busy: u64,
    total: u64,
}

impl CpuTimes {
    pub(super) fn read(daemon_pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let ticks: Vec<u64> = stat
            .lines()
            .next()?
            .strip_prefix("cpu ")?
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let total: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3)? + ticks.get(4)?;
        Some(Self {
            daemon: process_ticks(&format!("/proc/{daemon_pid}/stat"))?,
            client: process_ticks("/proc/self/stat")?,
            busy: total.saturating_sub(idle),
            total,
        })
    }

    /// The share of each since `self`, in cores.
    pub(super) fn share(&self, later: &Self) -> CpuShare {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // /proc/stat counts every core's ticks: one core's worth of time is total / cores.
        let per_core = (later.total.saturating_sub(self.total) as f64 / cores as f64).max(1.0);
        let cores_of = |a: u64, b: u64| b.saturating_sub(a) as f64 / per_core;
        CpuShare {
            daemon: cores_of(self.daemon, later.daemon),
            client: cores_of(self.client, later.client),
            sandboxes: None,
            machine: cores_of(self.busy, later.busy),
            cores,
        }
    }
}

/// utime + stime of a process (`/proc/<pid>/stat` fields 14 and 15).
fn process_ticks(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Field 3 (the state) is the first after the command name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}
