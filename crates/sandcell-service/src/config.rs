//! The service's settings: built-in defaults, then `config.toml`, then `SANDCELL_*`
//! environment variables, then command-line flags; each value remembers where it came from
//! (`sandcell config show`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where an effective value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Sandcell's built-in default.
    Default,
    /// The config file.
    File,
    /// A `SANDCELL_*` environment variable.
    Env,
    /// A command-line flag.
    Flag,
}

/// One setting: its dotted key, its meaning and its built-in default.
struct Key {
    name: &'static str,
    help: &'static str,
    default: fn(&Path) -> toml::Value,
}

fn int(v: i64) -> toml::Value {
    toml::Value::Integer(v)
}

fn string(v: impl Into<String>) -> toml::Value {
    toml::Value::String(v.into())
}

fn float(v: f64) -> toml::Value {
    toml::Value::Float(v)
}

/// The longest a signed download link may be valid (as for S3's presigned URLs).
pub const MAX_URL_TTL_SECS: u64 = 7 * 24 * 3600;

/// Every setting the service has, in the order `init` writes them.
const KEYS: &[Key] = &[
    Key {
        name: "listen",
        help: "TCP address of the REST API (loopback by default: put a TLS proxy in front to expose it)",
        default: |_| string("127.0.0.1:7070"),
    },
    Key {
        name: "unix_socket",
        help: "also serve on this UNIX socket path (empty: no socket)",
        default: |_| string(""),
    },
    Key {
        name: "database",
        help: "the SQLite file with every sandbox, key and export record",
        default: |home| string(home.join("sandcell.db").display().to_string()),
    },
    Key {
        name: "log_format",
        help: "\"text\" or \"json\" (one JSON object per line, with request ids)",
        default: |_| string("text"),
    },
    Key {
        name: "limits.max_sandboxes",
        help: "active sandboxes in all (0: no cap)",
        default: |_| int(100),
    },
    Key {
        name: "limits.max_per_owner",
        help: "active sandboxes per API key owner (0: no cap)",
        default: |_| int(20),
    },
    Key {
        name: "limits.idle_timeout_secs",
        help: "a sandbox unused this long is stopped (0: never)",
        default: |_| int(1800),
    },
    Key {
        name: "limits.lifetime_secs",
        help: "lifetime of a sandbox that asks for none (0: unlimited)",
        default: |_| int(7200),
    },
    Key {
        name: "limits.max_lifetime_secs",
        help: "the longest lifetime a sandbox may ask for (0: unlimited)",
        default: |_| int(86400),
    },
    Key {
        name: "limits.gc_interval_secs",
        help: "how often idle and expired sandboxes are looked for",
        default: |_| int(10),
    },
    Key {
        name: "limits.max_upload_bytes",
        help: "largest file upload or download",
        default: |_| int(2 << 30),
    },
    Key {
        name: "limits.max_request_bytes",
        help: "largest JSON request body",
        default: |_| int(16 << 20),
    },
    Key {
        name: "import.allowed_paths",
        help: "host directories whose files may be imported into sandboxes (comma-separated in the environment)",
        default: |_| toml::Value::Array(Vec::new()),
    },
    Key {
        name: "mounts.allowed_paths",
        help: "host directories that may be mounted into sandboxes, read-only unless a mount asks for rw (comma-separated in the environment)",
        default: |_| toml::Value::Array(Vec::new()),
    },
    Key {
        name: "network.upstream_ca_file",
        help: "a PEM file of more certificate authorities the egress proxy trusts for upstream servers when it terminates TLS for secrets (besides the system's; empty: none)",
        default: |_| string(""),
    },
    Key {
        name: "packages.pip_index_url",
        help: "the Python package index sandboxes' `packages.pip` install from (empty: pip's own default, as the host's pip names it)",
        default: |_| string(""),
    },
    Key {
        name: "packages.npm_registry",
        help: "the npm registry sandboxes' `packages.npm` install from (empty: the host's `npm config get registry`)",
        default: |_| string(""),
    },
    Key {
        name: "packages.r_repo",
        help: "the CRAN-style repository sandboxes' `packages.r` install from (empty: the host's R `repos` option)",
        default: |_| string(""),
    },
    Key {
        name: "packages.allow",
        help: "more hosts installs may reach besides the registries above (e.g. where an index keeps its files), as network allow rules",
        default: |_| toml::Value::Array(Vec::new()),
    },
    Key {
        name: "packages.ca_file",
        help: "a PEM file of certificate authorities installers in sandboxes trust (a mirror behind a private CA; empty: the system's)",
        default: |_| string(""),
    },
    Key {
        name: "packages.timeout_secs",
        help: "the longest a sandbox's package install may take",
        default: |_| int(600),
    },
    Key {
        name: "templates.debian_mirror",
        help: "the Debian mirror `FROM debian:<suite>` bases are made from with mmdebstrap (empty: the first Debian archive of the host's apt sources)",
        default: |_| string(""),
    },
    Key {
        name: "templates.gc_interval_secs",
        help: "how often the image store's blobs and unpacked roots no template uses are removed (the layer cache is kept; 0: never, `sandcell image prune` by hand)",
        default: |_| int(3600),
    },
    Key {
        name: "exports.url_ttl_secs",
        help: "how long an export's signed download link (no API key needed) stays valid (0: no signed links)",
        default: |_| int(3600),
    },
    Key {
        name: "pools.warm",
        help: "warm pools: \"template/size=count\" entries, e.g. [\"python/small=2\"]: that many ready sandboxes kept for creates that ask for exactly that template and size (no env or limits of their own); packages follow as installer:package words (\"python/small=2 pip:numpy pip:pandas npm:left-pad\"), installed while the sandboxes wait, for creates naming the same packages",
        default: |_| toml::Value::Array(Vec::new()),
    },
    Key {
        name: "metrics.public",
        help: "serve GET /metrics without an API key (for a scraper that cannot send one; the figures name no sandbox, but count every owner's)",
        default: |_| toml::Value::Boolean(false),
    },
    Key {
        name: "shutdown.sandboxes",
        help: "on SIGTERM/SIGINT: \"keep\" them running for the next start, or \"stop\" them",
        default: |_| string("keep"),
    },
    Key {
        name: "agent.model",
        help: "the model agent runs use when they name none: \"provider/model\", e.g. \"openai/gpt-4o-mini\" or \"anthropic/claude-sonnet-4-5\" (empty: runs must name one)",
        default: |_| string(""),
    },
    Key {
        name: "agent.mode",
        help: "\"tools\" (the model calls JSON tools) or \"repl\" (it writes code that may call the model again)",
        default: |_| string("tools"),
    },
    Key {
        name: "agent.stream",
        help: "stream model answers (server-sent events) rather than wait for each whole answer",
        default: |_| toml::Value::Boolean(true),
    },
    Key {
        name: "agent.max_iterations",
        help: "model calls with tools per run (at most 50)",
        default: |_| int(10),
    },
    Key {
        name: "agent.max_depth",
        help: "levels of sub-runs (at most 5)",
        default: |_| int(4),
    },
    Key {
        name: "agent.max_sub_calls",
        help: "sub-calls to a model per run tree",
        default: |_| int(12),
    },
    Key {
        name: "agent.token_budget",
        help: "input + output tokens per run tree (0: no limit)",
        default: |_| int(0),
    },
    Key {
        name: "agent.cost_limit_usd",
        help: "US dollars per run tree (at most 10)",
        default: |_| float(2.0),
    },
    Key {
        name: "agent.timeout_secs",
        help: "seconds a run may take in all (at most 600)",
        default: |_| int(300),
    },
    Key {
        name: "agent.cell_timeout_secs",
        help: "seconds one cell of the model's code may run (at most 600)",
        default: |_| int(30),
    },
    Key {
        name: "agent.max_output_tokens",
        help: "output tokens one model call may produce",
        default: |_| int(4096),
    },
    Key {
        name: "agent.openai.base_url",
        help: "OpenAI-compatible server, with /v1 (empty: $OPENAI_BASE_URL, else the official API); vLLM, Ollama, LM Studio, OpenRouter work too",
        default: |_| string(""),
    },
    Key {
        name: "agent.openai.key_env",
        help: "the environment variable holding the OpenAI-compatible server's key (the key itself never goes in this file)",
        default: |_| string("OPENAI_API_KEY"),
    },
    Key {
        name: "agent.anthropic.base_url",
        help: "Anthropic Messages server, without /v1 (empty: $ANTHROPIC_BASE_URL, else the official API)",
        default: |_| string(""),
    },
    Key {
        name: "agent.anthropic.key_env",
        help: "the environment variable holding the Anthropic key",
        default: |_| string("ANTHROPIC_API_KEY"),
    },
    Key {
        name: "agent.prices",
        help: "prices added to the built-in table: \"provider/model=input,output[,context_window]\" in US dollars per million tokens, e.g. [\"openai/my-model=0.5,1.5,128000\"] (a model with no price has its cost reported as unknown)",
        default: |_| toml::Value::Array(Vec::new()),
    },
    Key {
        name: "agent.step_snapshots",
        help: "when a run snapshots its sandbox at the end of a step: \"on_mutation\" (after steps that ran code, a command or an import), \"every_step\" or \"off\" (a run then cannot be resumed or forked with its sandbox's state)",
        default: |_| string("on_mutation"),
    },
    Key {
        name: "agent.prune_step_snapshots",
        help: "when a run ends, delete its step snapshots but the last one and those a fork or a sandbox was made from (false: keep them all)",
        default: |_| toml::Value::Boolean(true),
    },
    Key {
        name: "memory.embedding_model",
        help: "the embedding model of memories' hybrid search: \"openai/model\" (any OpenAI-compatible /embeddings endpoint, at agent.openai's base URL and key), e.g. \"openai/text-embedding-3-small\" (empty: full-text search only)",
        default: |_| string(""),
    },
    Key {
        name: "memory.min_similarity",
        help: "the least cosine similarity at which a memory counts as found by its embedding (0 to 1)",
        default: |_| float(0.3),
    },
    Key {
        name: "memory.infer_model",
        help: "the model that extracts facts from a text for `…/memories/infer`: \"provider/model\" (empty: agent.model)",
        default: |_| string(""),
    },
];

/// The effective settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Where Sandcell keeps its data.
    #[serde(skip)]
    pub home: PathBuf,
    /// TCP address.
    pub listen: String,
    /// UNIX socket path (empty: none).
    pub unix_socket: String,
    /// The SQLite file.
    pub database: PathBuf,
    /// `text` or `json`.
    pub log_format: String,
    /// Caps and timeouts.
    pub limits: LimitsConfig,
    /// What may be imported.
    pub import: ImportConfig,
    /// What may be mounted.
    pub mounts: MountsConfig,
    /// Export download links.
    pub exports: ExportsConfig,
    /// Warm pools.
    pub pools: PoolsConfig,
    /// Who may read `/metrics`.
    pub metrics: MetricsConfig,
    /// What a stop does.
    pub shutdown: ShutdownConfig,
    /// Agent runs: the default model, budgets and providers.
    pub agent: AgentConfig,
    /// Memories: embeddings and fact extraction.
    pub memory: MemoryConfig,
    /// Packages installed at create: where from.
    pub packages: PackagesConfig,
    /// Template builds.
    pub templates: TemplatesConfig,
    /// Sandboxes' egress.
    pub network: NetworkConfig,
}

/// Sandboxes' egress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkConfig {
    /// More CAs for upstreams of terminated TLS (empty: the system's only).
    pub upstream_ca_file: String,
}

impl NetworkConfig {
    /// [`Self::upstream_ca_file`] when set.
    pub fn upstream_ca(&self) -> Option<PathBuf> {
        (!self.upstream_ca_file.is_empty()).then(|| PathBuf::from(&self.upstream_ca_file))
    }
}

/// Where packages installed at create come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackagesConfig {
    /// The Python package index URL (empty: pip's default).
    pub pip_index_url: String,
    /// The npm registry URL (empty: the host's npm's).
    pub npm_registry: String,
    /// The R repository URL (empty: the host's R's).
    pub r_repo: String,
    /// More hosts installs may reach.
    pub allow: Vec<String>,
    /// CAs installers trust (empty: the system's).
    pub ca_file: String,
    /// Longest install.
    pub timeout_secs: u64,
}

/// Template builds' settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplatesConfig {
    /// The Debian mirror of `debian:<suite>` bases (empty: the host's).
    pub debian_mirror: String,
    /// Seconds between collections of the image store's garbage (0: never).
    pub gc_interval_secs: u64,
}

/// Memories' settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryConfig {
    /// The embedding model, `openai/…` (empty: full-text search only).
    pub embedding_model: String,
    /// The least cosine similarity of a match by embedding.
    pub min_similarity: f64,
    /// The model that extracts facts (empty: `agent.model`).
    pub infer_model: String,
}

impl MemoryConfig {
    /// The embedding model, when one is set (checked when the settings were loaded).
    pub fn embedding_model(&self) -> Option<sandcell_llm::ModelRef> {
        self.embedding_model.parse().ok()
    }

    /// The model infer jobs ask: `memory.infer_model`, else `agent.model`; none when
    /// neither is set.
    pub fn infer_model(&self, agent: &AgentConfig) -> Option<sandcell_llm::ModelRef> {
        [&self.infer_model, &agent.model]
            .into_iter()
            .find(|m| !m.is_empty())
            .and_then(|m| m.parse().ok())
    }
}

/// The providers' settings: the environment as the official clients read it, then the
/// `[agent]` settings over it (base URLs, which variables hold the keys, extra prices). The
/// agent's runs and the memories' models use the same.
pub fn llm_config(
    a: &AgentConfig,
    get: impl Fn(&str) -> Option<String>,
) -> sandcell_llm::LlmConfig {
    let provider = |p: &ProviderConfig| {
        Some(sandcell_llm::ProviderSettings {
            base_url: (!p.base_url.is_empty()).then(|| p.base_url.clone()),
            key_env: Some(p.key_env.clone()),
        })
    };
    let mut settings = sandcell_llm::LlmSettings {
        openai: provider(&a.openai),
        anthropic: provider(&a.anthropic),
        ..sandcell_llm::LlmSettings::default()
    };
    for entry in &a.prices {
        // Checked when the settings were loaded.
        if let Ok((model, input, output, window)) = parse_price(entry) {
            settings.prices.insert(
                model,
                sandcell_llm::Price {
                    input_per_mtok: input,
                    output_per_mtok: output,
                    context_window: window,
                },
            );
        }
    }
    sandcell_llm::LlmConfig::from_vars(&get).with_settings(&settings, &get)
}

/// Agent runs' settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentConfig {
    /// The default `provider/model` (empty: none).
    pub model: String,
    /// The default mode.
    pub mode: String,
    /// Stream model answers.
    pub stream: bool,
    /// Default model calls with tools per run.
    pub max_iterations: u64,
    /// Default levels of sub-runs.
    pub max_depth: u64,
    /// Default sub-calls per run tree.
    pub max_sub_calls: u64,
    /// Default tokens per run tree (0: no limit).
    pub token_budget: u64,
    /// Default dollars per run tree.
    pub cost_limit_usd: f64,
    /// Default seconds per run.
    pub timeout_secs: u64,
    /// Default seconds per cell.
    pub cell_timeout_secs: u64,
    /// Default output tokens per model call.
    pub max_output_tokens: u64,
    /// The OpenAI-compatible provider.
    pub openai: ProviderConfig,
    /// The Anthropic provider.
    pub anthropic: ProviderConfig,
    /// Extra prices: `provider/model=input,output[,context_window]`.
    pub prices: Vec<String>,
    /// When runs snapshot their sandbox: `on_mutation`, `every_step` or `off`.
    pub step_snapshots: String,
    /// Delete a run's step snapshots but the last (and those in use) when it ends.
    pub prune_step_snapshots: bool,
}

/// Where a provider is and which variable holds its key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderConfig {
    /// The base URL (empty: the environment's, else the official one).
    pub base_url: String,
    /// The variable with the key.
    pub key_env: String,
}

/// One `agent.prices` entry: (`provider/model`, input and output dollars per million
/// tokens, context window).
pub fn parse_price(entry: &str) -> Result<(String, f64, f64, Option<u32>), String> {
    let bad = || format!("'{entry}' is not provider/model=input,output[,context_window]");
    let (model, rest) = entry.split_once('=').ok_or_else(bad)?;
    let parts: Vec<&str> = rest.split(',').map(str::trim).collect();
    let number = |s: &str| {
        s.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(bad)
    };
    let (input, output, window) = match parts.as_slice() {
        [i, o] => (number(i)?, number(o)?, None),
        [i, o, w] => (
            number(i)?,
            number(o)?,
            Some(w.parse::<u32>().map_err(|_| bad())?),
        ),
        _ => return Err(bad()),
    };
    let model = model.trim();
    if model.is_empty() {
        return Err(bad());
    }
    Ok((model.to_string(), input, output, window))
}

/// Who may read `/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsConfig {
    /// Served without a key (default: a key is required, as for the API).
    pub public: bool,
}

/// Warm pools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolsConfig {
    /// `template/size=count` entries.
    pub warm: Vec<String>,
}

/// One warm pool setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPool {
    /// The template.
    pub template: String,
    /// The size name.
    pub size: String,
    /// Ready sandboxes to keep.
    pub count: usize,
    /// Packages installed in them while they wait.
    pub packages: sandcell_api::sandboxes::Packages,
}

impl WarmPool {
    /// Its name in metrics: `template/size`, then `+installer:package` for each package.
    pub fn name(&self) -> String {
        let mut name = format!("{}/{}", self.template, self.size);
        let p = &self.packages;
        for (installer, list) in [("pip", &p.pip), ("npm", &p.npm), ("r", &p.r)] {
            for package in list {
                name.push_str(&format!("+{installer}:{package}"));
            }
        }
        name
    }
}

/// Parses `template/size=count [installer:package…]` (size defaults to `small`, count to
/// 1; installers `pip`, `npm`, `r`, one package per word: pip's specifiers may hold commas).
pub fn parse_warm_pool(entry: &str) -> Result<WarmPool, String> {
    let mut words = entry.split_whitespace();
    let first = words.next().unwrap_or_default();
    let (name, count) = match first.split_once('=') {
        Some((n, c)) => {
            let count: usize = c
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| format!("'{entry}': the count must be a number from 1 to 64"))?;
            (n.trim(), count)
        }
        None => (first, 1),
    };
    let (template, size) = name.split_once('/').unwrap_or((name, "small"));
    if template.is_empty() || size.is_empty() {
        return Err(format!("'{entry}' is not template/size=count"));
    }
    let mut packages = sandcell_api::sandboxes::Packages::default();
    for word in words {
        let (list, package) = match word.split_once(':') {
            Some(("pip", p)) => (&mut packages.pip, p),
            Some(("npm", p)) => (&mut packages.npm, p),
            Some(("r", p)) => (&mut packages.r, p),
            _ => {
                return Err(format!(
                    "'{entry}': '{word}' is not installer:package (installers: pip, npm, r)"
                ));
            }
        };
        list.push(package.to_string());
    }
    packages.check().map_err(|e| format!("'{entry}': {e}"))?;
    Ok(WarmPool {
        template: template.to_string(),
        size: size.to_string(),
        count,
        packages,
    })
}

/// Caps and timeouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitsConfig {
    /// Active sandboxes in all.
    pub max_sandboxes: u64,
    /// Active sandboxes per owner.
    pub max_per_owner: u64,
    /// Idle timeout.
    pub idle_timeout_secs: u64,
    /// Default lifetime.
    pub lifetime_secs: u64,
    /// Longest lifetime.
    pub max_lifetime_secs: u64,
    /// GC period.
    pub gc_interval_secs: u64,
    /// Largest file transfer.
    pub max_upload_bytes: u64,
    /// Largest JSON body.
    pub max_request_bytes: u64,
}

/// What may be imported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportConfig {
    /// Host directories (absolute) whose files may be imported.
    pub allowed_paths: Vec<PathBuf>,
}

/// What may be mounted into sandboxes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MountsConfig {
    /// Host directories (absolute) that may be mounted, with what lies below them.
    pub allowed_paths: Vec<PathBuf>,
}

/// Export download links.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportsConfig {
    /// Seconds a signed download link stays valid (0: none are given out).
    pub url_ttl_secs: u64,
}

/// What a stop does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShutdownConfig {
    /// `keep` or `stop`.
    pub sandboxes: String,
}

/// One effective value and its origin, for `config show`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shown {
    /// Dotted key.
    pub key: String,
    /// The value, as TOML.
    pub value: String,
    /// Where it came from.
    pub source: Source,
}

/// A settings problem, named precisely.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{path} is not valid TOML: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A key nobody knows.
    #[error("unknown setting '{key}' in {origin}")]
    UnknownKey {
        /// The key.
        key: String,
        /// Where it was.
        origin: String,
    },
    /// A value of the wrong kind or out of range.
    #[error("setting '{key}' from {origin}: {message}")]
    BadValue {
        /// The key.
        key: String,
        /// Where it was.
        origin: String,
        /// What is wrong.
        message: String,
    },
}

// Where the home is by default is the client's business too: the rule lives with the API.
pub use sandcell_api::discovery::default_home;

/// Loads the settings: `file` (default `<home>/config.toml`, optional unless given),
/// `env` (pairs like `SANDCELL_LIMITS_MAX_SANDBOXES=5`), then `flags` (dotted key → value).
pub fn load(
    home: &Path,
    file: Option<&Path>,
    env: &[(String, String)],
    flags: &[(String, String)],
) -> Result<(Config, Vec<Shown>), ConfigError> {
    let mut values: BTreeMap<&'static str, (toml::Value, Source)> = KEYS
        .iter()
        .map(|k| (k.name, ((k.default)(home), Source::Default)))
        .collect();
    let path = file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.join("config.toml"));
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let table: toml::Table =
                text.parse()
                    .map_err(|e: toml::de::Error| ConfigError::Parse {
                        path: path.clone(),
                        message: e.message().to_string(),
                    })?;
            let origin = path.display().to_string();
            for (key, value) in flatten(&table, "") {
                let k = known(&key, &origin)?;
                let v = coerce(k, value, &origin)?;
                values.insert(k.name, (v, Source::File));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && file.is_none() => {}
        Err(source) => return Err(ConfigError::Read { path, source }),
    }
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("SANDCELL_") else {
            continue;
        };
        // Variables that are not settings (SANDCELL_HOME, SANDCELL_DEBUG, …) are skipped.
        let Some(k) = KEYS.iter().find(|k| env_name(k.name) == rest) else {
            continue;
        };
        let origin = format!("${name}");
        let v = coerce(k, from_text(k, raw), &origin)?;
        values.insert(k.name, (v, Source::Env));
    }
    for (name, raw) in flags {
        let k = known(name, "the command line")?;
        let v = coerce(k, from_text(k, raw), "the command line")?;
        values.insert(k.name, (v, Source::Flag));
    }
    let mut root = toml::Table::new();
    for (name, (value, _)) in &values {
        insert_dotted(&mut root, name, value.clone());
    }
    let mut config: Config =
        toml::Value::Table(root)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::BadValue {
                key: "(settings)".into(),
                origin: "the merged settings".into(),
                message: e.message().to_string(),
            })?;
    config.home = home.to_path_buf();
    validate(&config)?;
    let shown = values
        .into_iter()
        .map(|(key, (value, source))| Shown {
            key: key.to_string(),
            value: value.to_string(),
            source,
        })
        .collect();
    Ok((config, shown))
}

fn validate(c: &Config) -> Result<(), ConfigError> {
    let bad = |key: &str, message: String| ConfigError::BadValue {
        key: key.into(),
        origin: "the settings".into(),
        message,
    };
    if c.listen.parse::<std::net::SocketAddr>().is_err() {
        return Err(bad(
            "listen",
            format!("'{}' is not an address like 127.0.0.1:7070", c.listen),
        ));
    }
    if !["text", "json"].contains(&c.log_format.as_str()) {
        return Err(bad("log_format", "must be \"text\" or \"json\"".into()));
    }
    if !["keep", "stop"].contains(&c.shutdown.sandboxes.as_str()) {
        return Err(bad(
            "shutdown.sandboxes",
            "must be \"keep\" or \"stop\"".into(),
        ));
    }
    if c.exports.url_ttl_secs > MAX_URL_TTL_SECS {
        return Err(bad(
            "exports.url_ttl_secs",
            format!("must be at most {MAX_URL_TTL_SECS} (7 days)"),
        ));
    }
    if c.limits.gc_interval_secs == 0 {
        return Err(bad("limits.gc_interval_secs", "must be at least 1".into()));
    }
    for entry in &c.pools.warm {
        parse_warm_pool(entry).map_err(|m| bad("pools.warm", m))?;
    }
    let a = &c.agent;
    if !["tools", "repl"].contains(&a.mode.as_str()) {
        return Err(bad("agent.mode", "must be \"tools\" or \"repl\"".into()));
    }
    if !["on_mutation", "every_step", "off"].contains(&a.step_snapshots.as_str()) {
        return Err(bad(
            "agent.step_snapshots",
            "must be \"on_mutation\", \"every_step\" or \"off\"".into(),
        ));
    }
    for (key, value, max) in [
        ("agent.max_iterations", a.max_iterations, 50),
        ("agent.max_depth", a.max_depth, 5),
        ("agent.timeout_secs", a.timeout_secs, 600),
        ("agent.cell_timeout_secs", a.cell_timeout_secs, 600),
    ] {
        if value == 0 || value > max {
            return Err(bad(key, format!("must be 1 to {max}, got {value}")));
        }
    }
    if !(a.cost_limit_usd > 0.0 && a.cost_limit_usd <= 10.0) {
        return Err(bad(
            "agent.cost_limit_usd",
            format!("must be above 0 and at most 10, got {}", a.cost_limit_usd),
        ));
    }
    if a.max_output_tokens == 0 || a.max_output_tokens > u64::from(u32::MAX) {
        return Err(bad(
            "agent.max_output_tokens",
            "must be a positive 32-bit number".into(),
        ));
    }
    if !a.model.is_empty() && !a.model.contains('/') {
        return Err(bad(
            "agent.model",
            format!("'{}' is not provider/model", a.model),
        ));
    }
    for entry in &a.prices {
        parse_price(entry).map_err(|m| bad("agent.prices", m))?;
    }
    let m = &c.memory;
    if !m.embedding_model.is_empty() {
        let model: sandcell_llm::ModelRef = m
            .embedding_model
            .parse()
            .map_err(|e: sandcell_llm::LlmError| bad("memory.embedding_model", e.message))?;
        if model.provider != sandcell_llm::ProviderKind::OpenAi {
            return Err(bad(
                "memory.embedding_model",
                format!(
                    "'{model}': embeddings come from an OpenAI-compatible /embeddings endpoint; write openai/<model>"
                ),
            ));
        }
    }
    if !m.infer_model.is_empty() {
        m.infer_model
            .parse::<sandcell_llm::ModelRef>()
            .map_err(|e| bad("memory.infer_model", e.message))?;
    }
    if !(0.0..=1.0).contains(&m.min_similarity) {
        return Err(bad(
            "memory.min_similarity",
            format!("must be 0 to 1, got {}", m.min_similarity),
        ));
    }
    for rule in &c.packages.allow {
        rule.parse::<sandcell_api::network::HostRule>()
            .map_err(|e| bad("packages.allow", e))?;
    }
    for (key, url) in [
        ("packages.pip_index_url", &c.packages.pip_index_url),
        ("packages.npm_registry", &c.packages.npm_registry),
        ("packages.r_repo", &c.packages.r_repo),
    ] {
        if !url.is_empty() {
            sandcell_api::git::check_registry_url(url).map_err(|e| bad(key, e.0))?;
        }
    }
    if !c.network.upstream_ca_file.is_empty()
        && !Path::new(&c.network.upstream_ca_file).is_absolute()
    {
        return Err(bad(
            "network.upstream_ca_file",
            format!("'{}' is not an absolute path", c.network.upstream_ca_file),
        ));
    }
    if !c.packages.ca_file.is_empty() && !Path::new(&c.packages.ca_file).is_absolute() {
        return Err(bad(
            "packages.ca_file",
            format!("'{}' is not an absolute path", c.packages.ca_file),
        ));
    }
    if let Some(p) = c.mounts.allowed_paths.iter().find(|p| !p.is_absolute()) {
        return Err(bad(
            "mounts.allowed_paths",
            format!("'{}' is not an absolute path", p.display()),
        ));
    }
    if let Some(p) = c.import.allowed_paths.iter().find(|p| !p.is_absolute()) {
        return Err(bad(
            "import.allowed_paths",
            format!("'{}' is not an absolute path", p.display()),
        ));
    }
    Ok(())
}

/// `SANDCELL_` + the key in capitals with `.` as `_`.
fn env_name(key: &str) -> String {
    key.replace('.', "_").to_ascii_uppercase()
}

fn known(key: &str, origin: &str) -> Result<&'static Key, ConfigError> {
    KEYS.iter()
        .find(|k| k.name == key)
        .ok_or_else(|| ConfigError::UnknownKey {
            key: key.to_string(),
            origin: origin.to_string(),
        })
}

/// Text (environment, flags) as a value of the key's kind.
fn from_text(k: &Key, raw: &str) -> toml::Value {
    match (k.default)(Path::new("/")) {
        toml::Value::Integer(_) => raw
            .trim()
            .parse::<i64>()
            .map(toml::Value::Integer)
            .unwrap_or_else(|_| string(raw)),
        toml::Value::Float(_) => raw
            .trim()
            .parse::<f64>()
            .map(toml::Value::Float)
            .unwrap_or_else(|_| string(raw)),
        toml::Value::Boolean(_) => match raw.trim() {
            "true" => toml::Value::Boolean(true),
            "false" => toml::Value::Boolean(false),
            _ => string(raw),
        },
        toml::Value::Array(_) => toml::Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(string)
                .collect(),
        ),
        _ => string(raw),
    }
}

/// Checks that `value` has the kind of the key's default (and is not negative).
fn coerce(k: &Key, value: toml::Value, origin: &str) -> Result<toml::Value, ConfigError> {
    let default = (k.default)(Path::new("/"));
    let bad = |message: String| ConfigError::BadValue {
        key: k.name.to_string(),
        origin: origin.to_string(),
        message,
    };
    match (&default, &value) {
        (toml::Value::Integer(_), toml::Value::Integer(n)) if *n >= 0 => Ok(value),
        (toml::Value::Integer(_), _) => {
            Err(bad(format!("expected a whole number ≥ 0, got {value}")))
        }
        (toml::Value::Float(_), toml::Value::Float(f)) if *f >= 0.0 => Ok(value),
        // A whole number where a fraction may go: `cost_limit_usd = 3`.
        (toml::Value::Float(_), toml::Value::Integer(n)) if *n >= 0 => {
            Ok(toml::Value::Float(*n as f64))
        }
        (toml::Value::String(_), toml::Value::String(_))
        | (toml::Value::Boolean(_), toml::Value::Boolean(_)) => Ok(value),
        (toml::Value::Array(_), toml::Value::Array(items))
            if items.iter().all(|i| matches!(i, toml::Value::String(_))) =>
        {
            Ok(value)
        }
        (d, _) => Err(bad(format!("expected a {}, got {value}", d.type_str()))),
    }
}

fn flatten(table: &toml::Table, prefix: &str) -> Vec<(String, toml::Value)> {
    let mut out = Vec::new();
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => out.extend(flatten(t, &key)),
            other => out.push((key, other.clone())),
        }
    }
    out
}

fn insert_dotted(root: &mut toml::Table, key: &str, value: toml::Value) {
    match key.split_once('.') {
        Some((head, rest)) => {
            let entry = root
                .entry(head.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Table(t) = entry {
                insert_dotted(t, rest, value);
            }
        }
        None => {
            root.insert(key.to_string(), value);
        }
    }
}

/// A commented `config.toml` with every setting at its default (what `sandcell init` writes).
pub fn commented_defaults(home: &Path) -> String {
    let mut out = String::from(
        "# Sandcell settings. Every line shows the built-in default; uncomment to change.\n\
         # Environment variables override this file (SANDCELL_LISTEN, SANDCELL_LIMITS_MAX_SANDBOXES, …),\n\
         # and command-line flags override both. `sandcell config show` prints what is in force.\n",
    );
    let mut section = "";
    for k in KEYS {
        let (sec, name) = k.name.split_once('.').unwrap_or(("", k.name));
        if sec != section {
            out.push_str(&format!("\n[{sec}]\n"));
            section = sec;
        } else {
            out.push('\n');
        }
        out.push_str(&format!("# {}\n# {name} = {}\n", k.help, (k.default)(home)));
    }
    out
}

impl Config {
    /// The fleet's caps and defaults from these settings (0 meaning "none").
    pub fn fleet_limits(&self) -> sandcell_engine::fleet::FleetLimits {
        let opt = |v: u64| (v > 0).then_some(v);
        let ms = |secs: u64| opt(secs).map(|s| s.saturating_mul(1000));
        sandcell_engine::fleet::FleetLimits {
            max_sandboxes: opt(self.limits.max_sandboxes),
            max_per_owner: opt(self.limits.max_per_owner),
            default_idle_timeout_ms: ms(self.limits.idle_timeout_secs),
            default_lifetime_ms: ms(self.limits.lifetime_secs),
            max_lifetime_ms: ms(self.limits.max_lifetime_secs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn file_then_env_then_flags_win_and_each_value_says_where_from() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join("config.toml"),
            "listen = \"127.0.0.1:9000\"\n[limits]\nmax_sandboxes = 7\nmax_per_owner = 3\n",
        )
        .unwrap();
        let env = pairs(&[
            ("SANDCELL_LIMITS_MAX_PER_OWNER", "4"),
            ("SANDCELL_HOME", "/ignored"),
            ("SANDCELL_IMPORT_ALLOWED_PATHS", "/data, /srv"),
        ]);
        let flags = pairs(&[("listen", "127.0.0.1:9001")]);
        let (c, shown) = load(home.path(), None, &env, &flags).unwrap();
        assert_eq!(c.listen, "127.0.0.1:9001");
        assert_eq!(c.limits.max_sandboxes, 7);
        assert_eq!(c.limits.max_per_owner, 4);
        assert_eq!(
            c.import.allowed_paths,
            [PathBuf::from("/data"), PathBuf::from("/srv")]
        );
        assert_eq!(c.database, home.path().join("sandcell.db"));
        let src = |k: &str| shown.iter().find(|s| s.key == k).unwrap().source;
        assert_eq!(src("listen"), Source::Flag);
        assert_eq!(src("limits.max_sandboxes"), Source::File);
        assert_eq!(src("limits.max_per_owner"), Source::Env);
        assert_eq!(src("log_format"), Source::Default);
    }

    #[test]
    fn bad_settings_are_named() {
        let home = tempfile::tempdir().unwrap();
        let path = home.path().join("config.toml");
        std::fs::write(&path, "[limits]\nmax_sandbox = 7\n").unwrap();
        let e = load(home.path(), None, &[], &[]).unwrap_err().to_string();
        assert!(
            e.contains("limits.max_sandbox") && e.contains("unknown"),
            "{e}"
        );
        std::fs::write(&path, "listen = 7\n").unwrap();
        let e = load(home.path(), None, &[], &[]).unwrap_err().to_string();
        assert!(
            e.contains("listen") && e.contains("expected a string"),
            "{e}"
        );
        std::fs::write(&path, "[limits\n").unwrap();
        let e = load(home.path(), None, &[], &[]).unwrap_err().to_string();
        assert!(e.contains("not valid TOML"), "{e}");
        std::fs::remove_file(&path).unwrap();
        let env = pairs(&[("SANDCELL_LIMITS_MAX_SANDBOXES", "-3")]);
        let e = load(home.path(), None, &env, &[]).unwrap_err().to_string();
        assert!(e.contains("SANDCELL_LIMITS_MAX_SANDBOXES"), "{e}");
        let flags = pairs(&[("listen", "nowhere")]);
        assert!(load(home.path(), None, &[], &flags).is_err());
        let missing = home.path().join("nope.toml");
        assert!(load(home.path(), Some(&missing), &[], &[]).is_err());
    }

    #[test]
    fn agent_settings_take_fractions_prices_and_refuse_what_is_out_of_range() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join("config.toml"),
            "[agent]\nmodel = \"openai/gpt-4o-mini\"\ncost_limit_usd = 3\nprices = [\"openai/mine=0.5,1.5,128000\"]\n[agent.openai]\nbase_url = \"http://127.0.0.1:9/v1\"\n",
        )
        .unwrap();
        let env = pairs(&[("SANDCELL_AGENT_COST_LIMIT_USD", "2.5")]);
        let (c, _) = load(home.path(), None, &env, &[]).unwrap();
        assert_eq!(c.agent.model, "openai/gpt-4o-mini");
        assert_eq!(c.agent.cost_limit_usd, 2.5);
        assert_eq!(c.agent.openai.base_url, "http://127.0.0.1:9/v1");
        assert_eq!(c.agent.openai.key_env, "OPENAI_API_KEY");
        assert_eq!(
            parse_price(&c.agent.prices[0]).unwrap(),
            ("openai/mine".to_string(), 0.5, 1.5, Some(128_000))
        );
        // Memories: off by default; an embedding model must speak the OpenAI protocol.
        assert_eq!(c.memory.embedding_model(), None);
        assert_eq!(
            c.memory
                .infer_model(&c.agent)
                .map(|m| m.to_string())
                .as_deref(),
            Some("openai/gpt-4o-mini")
        );
        let (m, _) = load(
            home.path(),
            None,
            &[],
            &pairs(&[
                ("memory.embedding_model", "openai/text-embedding-3-small"),
                ("memory.infer_model", "anthropic/claude-haiku-4-5"),
                ("memory.min_similarity", "0.5"),
            ]),
        )
        .unwrap();
        assert_eq!(
            m.memory.embedding_model().map(|m| m.model).as_deref(),
            Some("text-embedding-3-small")
        );
        assert_eq!(
            m.memory
                .infer_model(&m.agent)
                .map(|m| m.to_string())
                .as_deref(),
            Some("anthropic/claude-haiku-4-5")
        );
        assert_eq!(m.memory.min_similarity, 0.5);
        for (key, value) in [
            ("memory.embedding_model", "anthropic/claude"),
            ("memory.embedding_model", "text-embedding-3-small"),
            ("memory.infer_model", "gpt-4o"),
            ("memory.min_similarity", "1.5"),
            ("agent.max_iterations", "51"),
            ("agent.cost_limit_usd", "10.5"),
            ("agent.mode", "chat"),
            ("agent.model", "gpt-4o"),
            ("agent.prices", "openai/x=1"),
        ] {
            let e = load(home.path(), None, &[], &pairs(&[(key, value)])).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn the_commented_defaults_load_as_the_defaults() {
        let home = tempfile::tempdir().unwrap();
        let text = commented_defaults(home.path());
        assert!(text.contains("# max_sandboxes = 100"), "{text}");
        // Uncommenting every line gives the same settings as no file.
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if rest.contains(" = ") => rest.to_string(),
                _ if l.starts_with('#') => String::new(),
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(home.path().join("config.toml"), uncommented).unwrap();
        let (from_file, _) = load(home.path(), None, &[], &[]).unwrap();
        std::fs::remove_file(home.path().join("config.toml")).unwrap();
        let (defaults, _) = load(home.path(), None, &[], &[]).unwrap();
        assert_eq!(from_file, defaults);
    }

    #[test]
    fn a_warm_pool_entry_may_name_packages_one_per_word() {
        let plain = parse_warm_pool("python/small=2").unwrap();
        assert_eq!((plain.count, plain.name()), (2, "python/small".to_string()));
        assert!(plain.packages.is_empty());

        let with =
            parse_warm_pool("python/nano=3 pip:requests>=2,<3 npm:left-pad pip:six").unwrap();
        assert_eq!(with.packages.pip, ["requests>=2,<3", "six"]);
        assert_eq!(with.packages.npm, ["left-pad"]);
        assert_eq!(
            with.name(),
            "python/nano+pip:requests>=2,<3+pip:six+npm:left-pad"
        );

        let e = parse_warm_pool("python/small=1 cargo:serde").unwrap_err();
        assert!(e.contains("'cargo:serde' is not installer:package"), "{e}");
        let e = parse_warm_pool("python/small=1 pip:-e.").unwrap_err();
        assert!(e.contains("pip"), "{e}");
    }
}
