//! Templates: builds from a Dockerfile and a context, their progress and logs, and the
//! images they make.

use serde::{Deserialize, Serialize};

/// A build's state: `queued` → `running` → `succeeded`, `failed` or `cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BuildState {
    /// Waiting for an earlier build to finish.
    Queued,
    /// Running step `step` of `steps`.
    Running,
    /// Done: the image is tagged.
    Succeeded,
    /// A step failed (its exit code and log say why), or the build could not be done.
    Failed,
    /// Cancelled before it finished.
    Cancelled,
}

impl BuildState {
    /// Whether the build is over.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// What happened to one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepReport {
    /// 1-based.
    pub index: u32,
    /// Its line in the Dockerfile.
    pub line: u32,
    /// The instruction as written.
    pub text: String,
    /// Its layer came from the cache.
    pub cached: bool,
    /// The command's exit code (`RUN`; none for a cached or file step).
    pub exit_code: Option<i32>,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// The layer it made (`sha256:…`).
    pub layer: Option<String>,
    /// The layer's size in bytes.
    pub size: u64,
}

/// One event of a build's log, in order: what `GET /v1/builds/{build_id}/logs` streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BuildEvent {
    /// An instruction ignored (with its line).
    Warning {
        /// Its line.
        line: u32,
        /// What was ignored and why.
        message: String,
    },
    /// The base was found, or made now (a Debian base's first use).
    Base {
        /// What `FROM` names.
        name: String,
        /// The base's manifest digest.
        digest: String,
        /// How long making it took, when it was made now.
        made_ms: Option<u64>,
    },
    /// A step begins.
    StepStarted {
        /// 1-based.
        index: u32,
        /// How many steps there are.
        total: u32,
        /// Its line in the Dockerfile.
        line: u32,
        /// The instruction as written.
        text: String,
    },
    /// Output of the running step.
    Output {
        /// The step.
        index: u32,
        /// `stdout` or `stderr`.
        stream: String,
        /// The text (lossy UTF-8).
        text: String,
    },
    /// A request of the running step through the build's egress proxy.
    Network {
        /// The step.
        index: u32,
        /// The host asked for.
        host: String,
        /// The port.
        port: u16,
        /// `allowed` or `denied`.
        outcome: String,
        /// Why it was denied, when it was.
        reason: Option<String>,
    },
    /// A step ended.
    StepFinished {
        /// What happened.
        step: StepReport,
    },
    /// A kernel was tried in the finished image.
    Smoke {
        /// `python`, `node`, `bash` or `r`.
        kernel: String,
        /// It started.
        ok: bool,
        /// Its version, or why it did not start.
        detail: String,
    },
    /// The build is over.
    Finished {
        /// `succeeded`, `failed` or `cancelled`.
        state: BuildState,
        /// Why it failed.
        error: Option<String>,
    },
}

/// A finished build's image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BuiltImage {
    /// The name it is tagged with (`name:tag`).
    pub reference: String,
    /// Its manifest digest.
    pub digest: String,
    /// Its layers, the base's included.
    pub layers: u32,
    /// The bytes of its layers.
    pub size: u64,
    /// The kernels that started in it.
    pub kernels: Vec<String>,
}

/// The largest build context, decoded (`POST /v1/templates`).
pub const MAX_CONTEXT_BYTES: usize = 256 * 1024 * 1024;

/// `POST /v1/templates`: build a template from a Dockerfile and a context.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StartBuild {
    /// The template's name (`name[:tag]`; `name` means `name:latest`).
    pub name: String,
    /// The Dockerfile's text (or give `spec` or `builtin`).
    #[serde(default)]
    pub dockerfile: String,
    /// A template file (TOML, docs/templates.md): its Dockerfile inline or a path in the
    /// context, build arguments, the defaults of its sandboxes, its warm strategy.
    #[serde(default)]
    pub spec: Option<String>,
    /// A built-in template to build (`python-data-analysis`, `cpp-algorithm`,
    /// `go-algorithm`, `node`, `web-tools`).
    #[serde(default)]
    pub builtin: Option<String>,
    /// The network of the template's sandboxes, over the template file's (`web-tools` needs
    /// it: the hosts its sandboxes may reach).
    #[serde(default)]
    pub sandbox_network: Option<crate::network::NetworkPolicy>,
    /// The build context: a tar archive (plain or gzip), base64-encoded; none: an empty
    /// context.
    #[serde(default)]
    pub context: Option<String>,
    /// `--build-arg`s.
    #[serde(default)]
    pub build_args: std::collections::BTreeMap<String, String>,
    /// Run every step, even those whose layer is cached.
    #[serde(default)]
    pub no_cache: bool,
    /// Hosts `RUN` steps may reach besides the machine's package registries.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// No network for `RUN` steps.
    #[serde(default)]
    pub offline: bool,
    /// Answer when the build has ended (200) instead of at once (202).
    #[serde(default)]
    pub wait: bool,
}

/// A build: `GET /v1/templates/builds/{build_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BuildInfo {
    /// Its id.
    pub id: String,
    /// The template it makes.
    pub name: String,
    /// Where it is.
    pub state: BuildState,
    /// The step running (1-based; 0 before the first).
    pub step: u32,
    /// How many steps the Dockerfile has (0 until it is planned).
    pub steps: u32,
    /// The steps that ended.
    pub step_reports: Vec<StepReport>,
    /// The failing step's exit code.
    pub exit_code: Option<i32>,
    /// Why it failed.
    pub error: Option<String>,
    /// What it made.
    pub image: Option<BuiltImage>,
    /// When it was asked for (RFC 3339).
    pub created_at: String,
    /// When it ended.
    pub finished_at: Option<String>,
}

/// `GET /v1/templates/builds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BuildList {
    /// Newest first.
    pub builds: Vec<BuildInfo>,
}

/// A template (an image of the daemon's store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateInfo {
    /// Its name (`name:tag`).
    pub name: String,
    /// Its manifest digest.
    pub digest: String,
    /// Its layers.
    pub layers: u32,
    /// The bytes of its layers.
    pub size: u64,
    /// The kernels its build found starting in it (none recorded for an imported image).
    pub kernels: Vec<String>,
    /// Its environment (`ENV`).
    pub env: Vec<String>,
    /// Its `WORKDIR`.
    pub workdir: Option<String>,
    /// Sandboxes running on it now.
    pub sandboxes: u32,
}

/// `GET /v1/templates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateList {
    /// By name.
    pub templates: Vec<TemplateInfo>,
}

/// A build's events: `GET /v1/templates/builds/{build_id}/logs?format=json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BuildLog {
    /// Each event with its number (`seq`, from 1).
    pub events: Vec<NumberedBuildEvent>,
}

/// A build event and its number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NumberedBuildEvent {
    /// Its number, from 1.
    pub seq: u64,
    /// The event.
    #[serde(flatten)]
    pub event: BuildEvent,
}
