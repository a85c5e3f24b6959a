//! The build itself: plan, base, steps (cached or run), smoke test of kernels, image.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use sandcell_api::network::NetworkPolicy;
use sandcell_api::templates::{BuildEvent, BuildState, BuiltImage, StepReport};
use sandcell_egress::{EgressEvent, EgressProxy, Outcome, SystemResolver};
use sandcell_image::bases::{Base, DebianOptions};
use sandcell_image::layer::IdRange;
use sandcell_image::store::LAYER_TAR;
use sandcell_image::{Descriptor, Store};
use sandcell_jail::Limits;
use sandcell_jail::build::{BuildStepConfig, CopyInto, ID_RANGE_SIZE};
use sandcell_template::{ImageConfig, Op, PlannedStep};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use crate::ids::IdLease;
use crate::{BuildError, registries, stage, step};

/// The label listing the kernels that started in a built image (`python,bash`).
pub const KERNELS_LABEL: &str = "org.sandcell.kernels";

/// Where a builder keeps things, and what its steps may use.
#[derive(Debug, Clone)]
pub struct BuilderConfig {
    /// The image store's folder.
    pub store: PathBuf,
    /// Scratch space of running builds (one folder each, removed when it ends) and the
    /// package-manager caches of `RUN --mount=type=cache`; on the store's file system.
    pub work_dir: PathBuf,
    /// The `sandcell` binary that runs steps (`__build-step`).
    pub helper: PathBuf,
    /// How `debian:<suite>` bases are made.
    pub debian: DebianOptions,
    /// The parent cgroup of build steps.
    pub cgroup_parent: String,
    /// Each step's limits.
    pub limits: Limits,
}

impl BuilderConfig {
    /// Defaults for a Sandcell home: the store in `<home>/images`, scratch in
    /// `<home>/builds`, steps limited to 4 GiB and 4096 processes.
    pub fn for_home(home: &Path, helper: PathBuf) -> Self {
        Self {
            store: home.join("images"),
            work_dir: home.join("builds"),
            helper,
            debian: DebianOptions::default(),
            cgroup_parent: "sandcell".into(),
            limits: Limits {
                memory_bytes: Some(4 << 30),
                pids: Some(4096),
                cpu_millis: None,
                nofile: 65_536,
                fsize_bytes: None,
            },
        }
    }
}

/// What to build.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    /// The name to tag (`name` means `name:latest`).
    pub name: String,
    /// The Dockerfile's text.
    pub dockerfile: String,
    /// The build context (the folder `COPY` reads).
    pub context: PathBuf,
    /// `--build-arg NAME=VALUE`.
    pub build_args: BTreeMap<String, String>,
    /// Run every step, even those whose layer is cached.
    pub no_cache: bool,
    /// Hosts `RUN` steps may reach besides the machine's package registries.
    pub allow_hosts: Vec<String>,
    /// No network at all for `RUN` steps (not even the registries).
    pub offline: bool,
    /// The template file's defaults for sandboxes of the template (recorded in the image;
    /// its claimed kernels must pass the smoke test).
    pub defaults: Option<TemplateDefaults>,
}

/// What a template file says about the sandboxes of its template.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TemplateDefaults {
    /// Their defaults.
    pub sandbox: sandcell_template::SandboxDefaults,
    /// How they are kept ready.
    pub warm: sandcell_template::WarmStrategy,
}

/// The label holding a template's [`TemplateDefaults`] as JSON.
pub const DEFAULTS_LABEL: &str = "org.sandcell.template";

/// Cancels a build: its running step is killed, and it ends `cancelled`.
#[derive(Debug, Clone)]
pub struct Cancel {
    tx: Arc<watch::Sender<bool>>,
    rx: watch::Receiver<bool>,
}

impl Default for Cancel {
    fn default() -> Self {
        let (tx, rx) = watch::channel(false);
        Self {
            tx: Arc::new(tx),
            rx,
        }
    }
}

impl Cancel {
    /// Cancels.
    pub fn cancel(&self) {
        let _ = self.tx.send(true);
    }

    /// Whether it was cancelled.
    pub fn is_cancelled(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once cancelled.
    pub async fn cancelled(&self) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(|c| *c).await;
    }
}

/// Builds templates into one image store.
#[derive(Debug, Clone)]
pub struct Builder {
    config: BuilderConfig,
}

static BUILDS: AtomicU64 = AtomicU64::new(0);

/// The build's scratch folder, removed when the build ends however it ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the steps so far left to build on.
struct Chain {
    /// The layers, the base's first.
    layers: Vec<Descriptor>,
    /// Their uncompressed digests.
    diff_ids: Vec<String>,
    /// The cache key's parent: the last layer, or the base's manifest.
    parent: String,
    /// Once a step ran: the unpacked root below it and the upper folders of the steps that
    /// ran, oldest first.
    lower_root: Option<PathBuf>,
    uppers: Vec<PathBuf>,
}

impl Builder {
    /// A builder.
    pub fn new(config: BuilderConfig) -> Self {
        Self { config }
    }

    /// Its configuration.
    pub fn config(&self) -> &BuilderConfig {
        &self.config
    }

    /// Runs `request` to its end, sending progress and output to `events` (a `Finished`
    /// event last).
    pub async fn build(
        &self,
        request: BuildRequest,
        events: UnboundedSender<BuildEvent>,
        cancel: Cancel,
    ) -> Result<BuiltImage, BuildError> {
        let result = self.run(request, &events, &cancel).await;
        let (state, error) = match &result {
            Ok(_) => (BuildState::Succeeded, None),
            Err(BuildError::Cancelled) => (BuildState::Cancelled, None),
            Err(e) => (BuildState::Failed, Some(e.to_string())),
        };
        let _ = events.send(BuildEvent::Finished { state, error });
        result
    }

    async fn run(
        &self,
        request: BuildRequest,
        events: &UnboundedSender<BuildEvent>,
        cancel: &Cancel,
    ) -> Result<BuiltImage, BuildError> {
        sandcell_template::check_reference(&request.name).map_err(BuildError::Invalid)?;
        let request = &request;
        let reference = if request.name.contains(':') {
            request.name.clone()
        } else {
            format!("{}:latest", request.name)
        };
        let parsed = sandcell_template::parse(&request.dockerfile)
            .map_err(|e| BuildError::Invalid(format!("Dockerfile {e}")))?;
        let plan = sandcell_template::plan(&parsed, &request.build_args)
            .map_err(|e| BuildError::Invalid(format!("Dockerfile {e}")))?;
        for w in &plan.warnings {
            let _ = events.send(BuildEvent::Warning {
                line: w.line as u32,
                message: w.message.clone(),
            });
        }
        if !request.context.is_dir() {
            return Err(BuildError::Invalid(format!(
                "the build context {} is not a folder",
                request.context.display()
            )));
        }

        let store = Store::open(&self.config.store)?;
        let base = {
            let store = store.clone();
            let name = plan.base.clone();
            let debian = self.config.debian.clone();
            blocking(move || Ok(sandcell_image::bases::resolve(&store, &name, &debian)?)).await?
        };
        let base_image = match base.base {
            Base::Host => {
                return Err(BuildError::Invalid(format!(
                    "Dockerfile line {}: FROM host cannot be built on (the host's system is not a layer); start from debian:<suite> or an imported image",
                    plan.base_line
                )));
            }
            Base::Image(image) => image,
        };
        let _ = events.send(BuildEvent::Base {
            name: plan.base.clone(),
            digest: base_image.manifest_digest.clone(),
            made_ms: base.made.map(|d| d.as_millis() as u64),
        });
        let base_config = base_image.config.get("config").cloned().unwrap_or_default();
        let base_env = env_of(&base_config);

        let lease = IdLease::take(&self.config.work_dir.join("ids"))?;
        let id_base = lease.base();
        let build_id = format!(
            "{}-{}",
            std::process::id(),
            BUILDS.fetch_add(1, Ordering::Relaxed)
        );
        let scratch = Scratch(self.config.work_dir.join("run").join(&build_id));
        std::fs::create_dir_all(&scratch.0)
            .map_err(BuildError::io(format!("create {}", scratch.0.display())))?;

        let current = Arc::new(AtomicU32::new(0));
        // Started by the first RUN step that is not cached: a fully cached rebuild reads no
        // registry configuration (`npm config` alone takes a second).
        let mut egress = EgressSlot {
            wanted: !request.offline && plan.steps.iter().any(|s| matches!(s.op, Op::Run { .. })),
            started: None,
            scratch: scratch.0.clone(),
            current: current.clone(),
        };

        let diff_ids = base_image
            .config
            .pointer("/rootfs/diff_ids")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_str().map(str::to_string))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let mut chain = Chain {
            layers: base_image.manifest.layers.clone(),
            diff_ids,
            parent: base_image.manifest_digest.clone(),
            lower_root: None,
            uppers: Vec::new(),
        };
        let total = plan.steps.len() as u32;
        let mut history = Vec::new();
        for (i, planned) in plan.steps.iter().enumerate() {
            if cancel.is_cancelled() {
                return Err(BuildError::Cancelled);
            }
            let index = i as u32 + 1;
            current.store(index, Ordering::SeqCst);
            let _ = events.send(BuildEvent::StepStarted {
                index,
                total,
                line: planned.line as u32,
                text: planned.text.clone(),
            });
            let started = Instant::now();
            let step_dir = scratch.0.join(format!("step-{index}"));
            let report = self
                .step(
                    &store,
                    request,
                    planned,
                    index,
                    &step_dir,
                    id_base,
                    &base_env,
                    &mut egress,
                    &mut chain,
                    events,
                    cancel,
                    started,
                )
                .await?;
            // The same for a cached step as for one that ran: a rebuild that changes nothing
            // makes the same image, digest and all.
            history.push(serde_json::json!({ "created_by": planned.text }));
            let _ = events.send(BuildEvent::StepFinished { step: report });
        }
        current.store(0, Ordering::SeqCst);
        drop(egress);

        // The finished root: what sandboxes of the image run on (unpacked now, once), and
        // where the kernels are tried.
        let root = {
            let store = store.clone();
            let layers = chain.layers.clone();
            blocking(move || Ok(sandcell_image::unpacked_layers(&store, &layers)?)).await?
        };
        let kernels = self
            .smoke(
                &store,
                &reference,
                &chain.layers,
                &root,
                &scratch.0,
                id_base,
                &plan.config,
                &base_env,
                events,
                cancel,
            )
            .await?;

        if let Some(defaults) = &request.defaults {
            let missing: Vec<&str> = defaults
                .sandbox
                .kernels
                .iter()
                .filter(|k| !kernels.contains(k))
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                return Err(BuildError::Invalid(format!(
                    "the template claims kernels that do not start in the image it built: {} (started: {})",
                    missing.join(", "),
                    if kernels.is_empty() {
                        "none".to_string()
                    } else {
                        kernels.join(", ")
                    }
                )));
            }
        }
        let mut config = image_config(
            &base_config,
            &plan.config,
            &chain.diff_ids,
            &kernels,
            history,
        );
        if let Some(defaults) = &request.defaults {
            let text = serde_json::to_string(defaults)
                .map_err(|e| BuildError::Invalid(format!("the template's defaults: {e}")))?;
            config["config"]["Labels"][DEFAULTS_LABEL] = text.into();
        }
        let size: u64 = chain.layers.iter().map(|l| l.size).sum();
        let layers = chain.layers.clone();
        let tagged = {
            let store = store.clone();
            let reference = reference.clone();
            blocking(move || Ok(store.tag(&reference, &layers, &config)?)).await?
        };
        drop(lease);
        Ok(BuiltImage {
            reference,
            digest: tagged.digest,
            layers: chain.layers.len() as u32,
            size,
            kernels,
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn step(
        &self,
        store: &Store,
        request: &BuildRequest,
        planned: &PlannedStep,
        index: u32,
        step_dir: &Path,
        id_base: u32,
        base_env: &[(String, String)],
        egress: &mut EgressSlot,
        chain: &mut Chain,
        events: &UnboundedSender<BuildEvent>,
        cancel: &Cancel,
        started: Instant,
    ) -> Result<StepReport, BuildError> {
        let staging = step_dir.join("staging");
        let (inputs, copy) = match &planned.op {
            Op::Run { .. } => (String::new(), None),
            Op::Copy {
                sources,
                dest,
                chown,
                chmod,
                unpack,
            } => {
                let mode = match chmod {
                    Some(m) => Some(u32::from_str_radix(m, 8).map_err(|_| {
                        BuildError::Invalid(format!(
                            "Dockerfile line {}: --chmod={m} is not an octal mode",
                            planned.line
                        ))
                    })?),
                    None => None,
                };
                let (context, sources, dest, unpack, staging2) = (
                    request.context.clone(),
                    sources.clone(),
                    dest.clone(),
                    *unpack,
                    staging.clone(),
                );
                let line = planned.line;
                let digest = blocking(move || {
                    stage::stage_copy(&context, &sources, &dest, unpack, &staging2, id_base)
                        .map_err(|e| match e {
                            BuildError::Invalid(m) => {
                                BuildError::Invalid(format!("Dockerfile line {line}: {m}"))
                            }
                            other => other,
                        })?;
                    stage::digest(&staging2)
                })
                .await?;
                let copy = CopyInto {
                    staging: path_string(&staging)?,
                    chown: chown.clone(),
                    chmod: mode,
                };
                (digest, Some(copy))
            }
            Op::Workdir { path } => {
                let (path, staging2) = (path.clone(), staging.clone());
                let digest = blocking(move || {
                    stage::stage_folder(&path, &staging2, id_base)?;
                    stage::digest(&staging2)
                })
                .await?;
                let copy = CopyInto {
                    staging: path_string(&staging)?,
                    chown: None,
                    chmod: None,
                };
                (digest, Some(copy))
            }
        };
        let key = sandcell_template::layer_key(&chain.parent, &planned.key(), &inputs);

        // The cache serves steps until one runs: a step after that has a new parent.
        if !request.no_cache
            && chain.lower_root.is_none()
            && let Some(layer) = store.cached_layer(&key)?
        {
            chain.parent = layer.digest.clone();
            chain.diff_ids.push(layer.digest.clone());
            chain.layers.push(layer.clone());
            return Ok(StepReport {
                index,
                line: planned.line as u32,
                text: planned.text.clone(),
                cached: true,
                exit_code: None,
                duration_ms: started.elapsed().as_millis() as u64,
                layer: Some(layer.digest),
                size: layer.size,
            });
        }

        let lower_root = match &chain.lower_root {
            Some(root) => root.clone(),
            None => {
                let store = store.clone();
                let layers = chain.layers.clone();
                let root =
                    blocking(move || Ok(sandcell_image::unpacked_layers(&store, &layers)?)).await?;
                chain.lower_root = Some(root.clone());
                root
            }
        };
        let dirs = StepDirs::make(step_dir, id_base)?;
        let (argv, caches) = match &planned.op {
            Op::Run { argv, cache } => {
                let mut mounts = Vec::new();
                for c in cache {
                    let host = self.cache_dir(&c.id, id_base)?;
                    mounts.push((path_string(&host)?, c.target.clone()));
                }
                (argv.clone(), mounts)
            }
            _ => (Vec::new(), Vec::new()),
        };
        let is_run = copy.is_none();
        let egress_socket = match egress {
            EgressSlot {
                wanted: true,
                started: None,
                scratch,
                current,
            } if is_run => {
                let started = self.start_egress(scratch, request, events, current.clone())?;
                egress.started.insert(started).socket.clone().into()
            }
            EgressSlot {
                started: Some(e), ..
            } if is_run => Some(e.socket.clone()),
            _ => None,
        };
        let config = BuildStepConfig {
            id: format!("build-{}-{index}", id_base),
            lower_root: path_string(&lower_root)?,
            layers: chain
                .uppers
                .iter()
                .map(|p| path_string(p))
                .collect::<Result<_, _>>()?,
            upper: path_string(&dirs.upper)?,
            work: path_string(&dirs.work)?,
            merged: path_string(&dirs.merged)?,
            lower_mount: path_string(&dirs.lower)?,
            id_base,
            argv,
            copy,
            env: merged_env(base_env, &planned.env),
            workdir: if is_run {
                planned.workdir.clone()
            } else {
                "/".into()
            },
            user: if is_run {
                planned.user.clone()
            } else {
                "0".into()
            },
            caches,
            ca_bundle: if is_run && egress_socket.is_some() {
                host_ca_bundle()
            } else {
                None
            },
            egress_socket: if is_run { egress_socket } else { None },
            limits: self.config.limits.clone(),
            cgroup_parent: self.config.cgroup_parent.clone(),
            status_file: path_string(&step_dir.join("status.json"))?,
        };
        let (status, _) =
            step::run(&self.config.helper, &config, index, Some(events), cancel).await?;
        if let Some(message) = status.setup_error {
            return Err(BuildError::Sandbox { index, message });
        }
        if status.exit_code != 0 {
            let _ = events.send(BuildEvent::StepFinished {
                step: StepReport {
                    index,
                    line: planned.line as u32,
                    text: planned.text.clone(),
                    cached: false,
                    exit_code: Some(status.exit_code),
                    duration_ms: started.elapsed().as_millis() as u64,
                    layer: None,
                    size: 0,
                },
            });
            return Err(BuildError::StepFailed {
                index,
                text: planned.text.clone(),
                exit_code: status.exit_code,
                oom_killed: status.oom_killed,
            });
        }

        let layer = {
            let store = store.clone();
            let upper = dirs.upper.clone();
            let ids = IdRange {
                base: id_base,
                size: ID_RANGE_SIZE,
            };
            blocking(move || {
                let (desc, _) = store.put_with(LAYER_TAR, |w| {
                    sandcell_image::layer::write_diff(&upper, w, Some(ids))
                })?;
                Ok(desc)
            })
            .await?
        };
        store.remember_layer(&key, &layer)?;
        chain.parent = layer.digest.clone();
        chain.diff_ids.push(layer.digest.clone());
        chain.layers.push(layer.clone());
        chain.uppers.push(dirs.upper);
        Ok(StepReport {
            index,
            line: planned.line as u32,
            text: planned.text.clone(),
            cached: false,
            exit_code: is_run.then_some(0),
            duration_ms: started.elapsed().as_millis() as u64,
            layer: Some(layer.digest),
            size: layer.size,
        })
    }

    /// Tries each kernel's interpreter in the finished root (a throwaway overlay, no
    /// network): the image may claim only the kernels that start. A rebuild that changed no
    /// layer keeps the answer of the image it replaces.
    #[allow(clippy::too_many_arguments)]
    async fn smoke(
        &self,
        store: &Store,
        reference: &str,
        layers: &[Descriptor],
        root: &Path,
        scratch: &Path,
        id_base: u32,
        image: &ImageConfig,
        base_env: &[(String, String)],
        events: &UnboundedSender<BuildEvent>,
        cancel: &Cancel,
    ) -> Result<Vec<String>, BuildError> {
        if let Some(previous) = store.image(reference)?
            && previous.manifest.layers == layers
            && let Some(label) = previous
                .config
                .pointer(&format!(
                    "/config/Labels/{}",
                    KERNELS_LABEL.replace('/', "~1")
                ))
                .and_then(|v| v.as_str())
        {
            let kernels: Vec<String> = label
                .split(',')
                .filter(|k| !k.is_empty())
                .map(str::to_string)
                .collect();
            for k in &kernels {
                let _ = events.send(BuildEvent::Smoke {
                    kernel: k.clone(),
                    ok: true,
                    detail: "unchanged since the last build".into(),
                });
            }
            return Ok(kernels);
        }
        let env: BTreeMap<String, String> = image.env.iter().cloned().collect();
        let mut kernels = Vec::new();
        for (kernel, argv) in KERNEL_PROBES {
            let dir = scratch.join(format!("smoke-{kernel}"));
            let dirs = StepDirs::make(&dir, id_base)?;
            let config = BuildStepConfig {
                id: format!("build-{id_base}-smoke-{kernel}"),
                lower_root: path_string(root)?,
                layers: Vec::new(),
                upper: path_string(&dirs.upper)?,
                work: path_string(&dirs.work)?,
                merged: path_string(&dirs.merged)?,
                lower_mount: path_string(&dirs.lower)?,
                id_base,
                argv: argv.iter().map(|a| a.to_string()).collect(),
                copy: None,
                env: merged_env(base_env, &env),
                workdir: "/".into(),
                user: "0".into(),
                caches: Vec::new(),
                egress_socket: None,
                ca_bundle: None,
                limits: self.config.limits.clone(),
                cgroup_parent: self.config.cgroup_parent.clone(),
                status_file: path_string(&dir.join("status.json"))?,
            };
            let (status, output) = step::run(&self.config.helper, &config, 0, None, cancel).await?;
            let ok = status.setup_error.is_none() && status.exit_code == 0;
            let first = output.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            let detail = match (&status.setup_error, ok) {
                (Some(e), _) => e.clone(),
                (None, true) => first.trim().to_string(),
                (None, false) => format!("{} (exit code {})", first.trim(), status.exit_code),
            };
            let _ = events.send(BuildEvent::Smoke {
                kernel: kernel.to_string(),
                ok,
                detail,
            });
            if ok {
                kernels.push(kernel.to_string());
            }
        }
        Ok(kernels)
    }

    /// The host folder of cache `id`, owned by the build range's root.
    fn cache_dir(&self, id: &str, id_base: u32) -> Result<PathBuf, BuildError> {
        let name: String = id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let dir = self.config.work_dir.join("caches").join(name);
        std::fs::create_dir_all(&dir)
            .map_err(BuildError::io(format!("create {}", dir.display())))?;
        // Each build has its own range: the cache follows the build that uses it.
        stage::chown_tree(&dir, id_base)?;
        Ok(dir)
    }

    fn start_egress(
        &self,
        scratch: &Path,
        request: &BuildRequest,
        events: &UnboundedSender<BuildEvent>,
        current: Arc<AtomicU32>,
    ) -> Result<Egress, BuildError> {
        let mut hosts = registries::configured_hosts();
        hosts.extend(request.allow_hosts.iter().cloned());
        let policy = if hosts.is_empty() {
            NetworkPolicy::Loopback
        } else {
            NetworkPolicy::allow(&hosts).map_err(BuildError::Invalid)?
        };
        let tx = events.clone();
        let sink: Arc<dyn Fn(EgressEvent) + Send + Sync> = Arc::new(move |e: EgressEvent| {
            let _ = tx.send(BuildEvent::Network {
                index: current.load(Ordering::SeqCst),
                host: e.host,
                port: e.port,
                outcome: match e.outcome {
                    Outcome::Allowed => "allowed".into(),
                    Outcome::Denied => "denied".into(),
                },
                reason: e.reason,
            });
        });
        let proxy = EgressProxy::new(
            policy,
            Arc::new(SystemResolver),
            sandcell_egress::Limits::default(),
            sink,
        );
        let socket = scratch.join("egress.sock");
        let listener = tokio::net::UnixListener::bind(&socket)
            .map_err(BuildError::io(format!("listen on {}", socket.display())))?;
        let task = tokio::spawn(proxy.serve_unix(listener));
        Ok(Egress {
            socket: path_string(&socket)?,
            task,
        })
    }
}

/// The build's egress proxy once a step needs it (`wanted`: the build is not offline and has
/// RUN steps).
struct EgressSlot {
    wanted: bool,
    started: Option<Egress>,
    scratch: PathBuf,
    current: Arc<AtomicU32>,
}

/// The build's egress proxy, stopped when dropped.
struct Egress {
    socket: String,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The host's CA bundle, if it has one where Debian and Fedora keep it.
fn host_ca_bundle() -> Option<String> {
    [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ]
    .into_iter()
    .find(|p| Path::new(p).is_file())
    .map(str::to_string)
}

/// The interpreters tried in a finished image, by kernel.
const KERNEL_PROBES: &[(&str, &[&str])] = &[
    (
        "python",
        &[
            "/usr/bin/python3",
            "-c",
            "import sys; print('Python', sys.version.split()[0])",
        ],
    ),
    ("node", &["/usr/bin/node", "--version"]),
    ("bash", &["/bin/bash", "-c", "echo bash $BASH_VERSION"]),
    ("r", &["/usr/bin/Rscript", "--version"]),
];

/// A step's folders: the overlay's upper (owned by the range's root, as the root of the image
/// is) and work folders, and the mount points the helper uses.
struct StepDirs {
    upper: PathBuf,
    work: PathBuf,
    merged: PathBuf,
    lower: PathBuf,
}

impl StepDirs {
    fn make(dir: &Path, id_base: u32) -> Result<Self, BuildError> {
        let dirs = Self {
            upper: dir.join("upper"),
            work: dir.join("work"),
            merged: dir.join("merged"),
            lower: dir.join("lower"),
        };
        for d in [&dirs.upper, &dirs.work, &dirs.merged, &dirs.lower] {
            std::fs::create_dir_all(d)
                .map_err(BuildError::io(format!("create {}", d.display())))?;
        }
        std::os::unix::fs::chown(&dirs.upper, Some(id_base), Some(id_base))
            .map_err(BuildError::io(format!("chown {}", dirs.upper.display())))?;
        Ok(dirs)
    }
}

fn path_string(path: &Path) -> Result<String, BuildError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| BuildError::Invalid(format!("{} is not UTF-8", path.display())))
}

/// `Env` of an OCI config (`["K=V", …]`).
fn env_of(config: &serde_json::Value) -> Vec<(String, String)> {
    config
        .get("Env")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|e| {
                    e.as_str()?
                        .split_once('=')
                        .map(|(k, v)| (k.into(), v.into()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The base's environment with the Dockerfile's on top.
fn merged_env(base: &[(String, String)], own: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = base
        .iter()
        .filter(|(k, _)| !own.contains_key(k))
        .cloned()
        .collect();
    env.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// The OCI image config: the base's, with what the Dockerfile set on top.
fn image_config(
    base: &serde_json::Value,
    own: &ImageConfig,
    diff_ids: &[String],
    kernels: &[String],
    history: Vec<serde_json::Value>,
) -> serde_json::Value {
    let own_env: BTreeMap<String, String> = own.env.iter().cloned().collect();
    let env: Vec<String> = merged_env(&env_of(base), &own_env)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut config = base.as_object().cloned().unwrap_or_default();
    config.insert("Env".into(), env.into());
    if let Some(w) = &own.workdir {
        config.insert("WorkingDir".into(), w.clone().into());
    }
    if let Some(u) = &own.user {
        config.insert("User".into(), u.clone().into());
    }
    if let Some(c) = &own.cmd {
        config.insert("Cmd".into(), c.clone().into());
    }
    if let Some(e) = &own.entrypoint {
        config.insert("Entrypoint".into(), e.clone().into());
    }
    let mut labels = config
        .get("Labels")
        .and_then(|l| l.as_object())
        .cloned()
        .unwrap_or_default();
    for (k, v) in &own.labels {
        labels.insert(k.clone(), v.clone().into());
    }
    labels.insert(KERNELS_LABEL.into(), kernels.join(",").into());
    config.insert("Labels".into(), labels.into());
    serde_json::json!({
        "architecture": sandcell_image::store::oci_architecture(),
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BuildError> + Send + 'static,
) -> Result<T, BuildError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BuildError::Invalid(format!("a build task failed: {e}")))?
}
