//! `GET /v1/system`: the service, its backends, and who is asking.

use sandcell_protocol::IsolationReport;
use serde::{Deserialize, Serialize};

/// The service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SystemInfo {
    /// Sandcell's version.
    pub version: String,
    /// Seconds since the service started.
    pub uptime_secs: u64,
    /// Sandboxes running now (all owners).
    pub running: u64,
    /// The backends and what each offers on this host.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub backends: Vec<BackendInfo>,
    /// The caller's identity.
    pub caller: CallerInfo,
}

/// What a backend can do on this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendInfo {
    /// Which backend (`process`, `gvisor`).
    pub kind: String,
    /// Whether it can run at all here.
    pub available: bool,
    /// Strength of the boundary (`none`, `container`, `user-space kernel`, `hardware vm`).
    pub isolation_level: String,
    /// Whether pausing keeps memory.
    pub supports_pause: bool,
    /// Best snapshot fidelity (`none`, `files`, `language`, `process`).
    pub checkpoint_fidelity: String,
    /// Feature by feature: what a sandbox would get on this host, and why not.
    pub host: IsolationReport,
}

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CallerInfo {
    /// The key's owner.
    pub owner: String,
    /// The key's id.
    pub key_id: String,
    /// Whether it is an admin key.
    pub admin: bool,
}
