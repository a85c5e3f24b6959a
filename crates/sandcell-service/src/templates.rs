//! Templates: builds as jobs (queued → running step i/n → succeeded, failed or cancelled),
//! their events kept and followed live, and the templates of the home's image store (list,
//! show, delete unless sandboxes run on it). Builds run one at a time (each step is a
//! sandbox of its own; two builds at once would only halve each other's cores) through
//! `sandcell-build`, the same builder `sandcell template build` runs in its own process.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use futures_util::Stream;
use sandcell_api::templates::{
    BuildEvent, BuildInfo, BuildList, BuildLog, BuildState, MAX_CONTEXT_BYTES, NumberedBuildEvent,
    StartBuild, TemplateInfo, TemplateList,
};
use sandcell_build::builder::KERNELS_LABEL;
use sandcell_build::{BuildError, BuildRequest, Builder, BuilderConfig, Cancel};
use tokio::sync::{Semaphore, watch};

use crate::caller::Caller;
use crate::{ErrorKind, Service, ServiceError, ServiceResult};

/// Builds kept (the oldest finished ones go first), in memory and on disk.
const KEEP_BUILDS: usize = 100;

/// The daemon's builds.
pub struct Builds {
    builder: Builder,
    jobs: Mutex<Vec<Arc<Job>>>,
    one_at_a_time: Arc<Semaphore>,
    /// `<home>/builds`: each build's record and events (`<id>.json`), written when it is
    /// queued and when it ends, so that builds are found again after a restart.
    records: PathBuf,
}

/// A build as kept on disk.
#[derive(serde::Serialize, serde::Deserialize)]
struct BuildRecord {
    info: BuildInfo,
    events: Vec<NumberedBuildEvent>,
}

impl std::fmt::Debug for Builds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builds").finish_non_exhaustive()
    }
}

/// One build.
struct Job {
    info: Mutex<BuildInfo>,
    events: Mutex<Vec<NumberedBuildEvent>>,
    /// The number of events so far: followers wait on it.
    count: watch::Sender<u64>,
    cancel: Cancel,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Builds {
    /// Builds into the store of the settings' home, steps run by the `sandcell` binary
    /// `helper`.
    pub fn new(config: &crate::config::Config, helper: PathBuf) -> Self {
        let mut builder = BuilderConfig::for_home(&config.home, helper);
        if !config.templates.debian_mirror.is_empty() {
            builder.debian.mirror = Some(config.templates.debian_mirror.clone());
        }
        let records = config.home.join("builds");
        let jobs = load_builds(&records);
        Self {
            builder: Builder::new(builder),
            jobs: Mutex::new(jobs),
            one_at_a_time: Arc::new(Semaphore::new(1)),
            records,
        }
    }

    /// Adds `job`, dropping the oldest finished builds over [`KEEP_BUILDS`] (records too).
    fn add(&self, job: Arc<Job>) {
        let mut jobs = lock(&self.jobs);
        jobs.push(job);
        while jobs.len() > KEEP_BUILDS {
            let Some(old) = jobs.iter().position(|j| lock(&j.info).state.is_final()) else {
                break;
            };
            let gone = jobs.remove(old);
            let id = lock(&gone.info).id.clone();
            let _ = std::fs::remove_file(self.records.join(format!("{id}.json")));
        }
    }

    fn job(&self, id: &str) -> ServiceResult<Arc<Job>> {
        let well_formed = id
            .strip_prefix("bld-")
            .is_some_and(|h| h.len() == 12 && h.bytes().all(|b| b.is_ascii_hexdigit()));
        if !well_formed {
            return Err(ServiceError::invalid(format!(
                "'{id}' is not a build id (bld- and 12 hex digits)"
            )));
        }
        lock(&self.jobs)
            .iter()
            .find(|j| lock(&j.info).id == id)
            .cloned()
            .ok_or_else(|| ServiceError::new(ErrorKind::NotFound, format!("no build '{id}'")))
    }
}

/// Writes `job`'s record into `dir` (a failure is logged: the build goes on without it).
fn save_build(dir: &Path, job: &Job) {
    let record = BuildRecord {
        info: lock(&job.info).clone(),
        events: lock(&job.events).clone(),
    };
    let id = record.info.id.clone();
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        let text = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        let tmp = dir.join(format!(".{id}.json.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, dir.join(format!("{id}.json")))
    });
    if let Err(e) = written {
        tracing::warn!(build = %id, error = %e, "the build's record was not written");
    }
}

/// The builds recorded under `dir`, oldest first, the newest [`KEEP_BUILDS`] (older records
/// are removed). One the daemon stopped during ends as failed, saying so.
fn load_builds(dir: &Path) -> Vec<Arc<Job>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut records: Vec<(PathBuf, BuildRecord)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            let text = std::fs::read(&p).ok()?;
            match serde_json::from_slice::<BuildRecord>(&text) {
                Ok(r) => Some((p, r)),
                Err(e) => {
                    tracing::warn!(file = %p.display(), error = %e, "an unreadable build record is skipped");
                    None
                }
            }
        })
        .collect();
    records.sort_by(|a, b| a.1.info.created_at.cmp(&b.1.info.created_at));
    let over = records.len().saturating_sub(KEEP_BUILDS);
    for (path, _) in records.drain(..over) {
        let _ = std::fs::remove_file(path);
    }
    records
        .into_iter()
        .map(|(_, record)| {
            let seq = record.events.last().map_or(0, |e| e.seq);
            let (count, _) = watch::channel(seq);
            let job = Job {
                info: Mutex::new(record.info),
                events: Mutex::new(record.events),
                count,
                cancel: Cancel::default(),
            };
            if !lock(&job.info).state.is_final() {
                job.record(BuildEvent::Finished {
                    state: BuildState::Failed,
                    error: Some("the daemon stopped during this build".into()),
                });
                save_build(dir, &job);
            }
            Arc::new(job)
        })
        .collect()
}

impl Job {
    fn record(&self, event: BuildEvent) {
        {
            let mut info = lock(&self.info);
            match &event {
                BuildEvent::StepStarted { index, total, .. } => {
                    info.state = BuildState::Running;
                    info.step = *index;
                    info.steps = *total;
                }
                BuildEvent::StepFinished { step } => {
                    if step.exit_code.is_some_and(|c| c != 0) {
                        info.exit_code = step.exit_code;
                    }
                    info.step_reports.push(step.clone());
                }
                BuildEvent::Finished { state, error } => {
                    info.state = *state;
                    info.error = error.clone();
                    info.finished_at = Some(now());
                }
                _ => {}
            }
        }
        let seq = {
            let mut events = lock(&self.events);
            let seq = events.len() as u64 + 1;
            events.push(NumberedBuildEvent { seq, event });
            seq
        };
        self.count.send_replace(seq);
    }
}

fn now() -> String {
    sandcell_api::time::rfc3339(sandcell_engine::fleet::now_ms())
}

impl Service {
    /// Starts a build: checked at once (the name, the Dockerfile, the context), then queued
    /// behind the build running. With `wait`, answers when it has ended.
    pub async fn start_build(&self, caller: &Caller, req: StartBuild) -> ServiceResult<BuildInfo> {
        admin_only(caller, "build templates")?;
        sandcell_template::check_reference(&req.name).map_err(ServiceError::invalid)?;
        let forms = [
            !req.dockerfile.is_empty(),
            req.spec.is_some(),
            req.builtin.is_some(),
        ];
        if forms.iter().filter(|f| **f).count() != 1 {
            return Err(ServiceError::invalid(
                "give exactly one of dockerfile, spec (a template file) or builtin",
            ));
        }
        // A Dockerfile's mistakes are answered at once; a template file's once its context
        // is unpacked (its Dockerfile may be a file in it).
        if !req.dockerfile.is_empty() {
            let parsed = sandcell_template::parse(&req.dockerfile)
                .map_err(|e| ServiceError::invalid(format!("Dockerfile {e}")))?;
            sandcell_template::plan(&parsed, &req.build_args)
                .map_err(|e| ServiceError::invalid(format!("Dockerfile {e}")))?;
        }
        if let Some(name) = &req.builtin {
            sandcell_template::builtin::builtin(name)
                .map_err(|e| ServiceError::invalid(e.to_string()))?;
        }
        let context_bytes = match &req.context {
            Some(text) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text.trim())
                    .map_err(|e| ServiceError::invalid(format!("context is not base64: {e}")))?;
                if bytes.len() > MAX_CONTEXT_BYTES {
                    return Err(ServiceError::new(
                        ErrorKind::BodyTooLarge,
                        format!(
                            "the context is {} bytes, over the limit of {MAX_CONTEXT_BYTES}",
                            bytes.len()
                        ),
                    ));
                }
                bytes
            }
            None => Vec::new(),
        };
        let builds = &self.builds;
        let id = sandcell_engine::new_sandbox_id().replacen("sb-", "bld-", 1);
        let context = builds.builder.config().work_dir.join("contexts").join(&id);
        {
            let context = context.clone();
            tokio::task::spawn_blocking(move || unpack_context(&context_bytes, &context))
                .await
                .map_err(|e| ServiceError::internal(format!("unpacking the context: {e}")))??;
        }
        let (count, _) = watch::channel(0);
        let job = Arc::new(Job {
            info: Mutex::new(BuildInfo {
                id: id.clone(),
                name: req.name.clone(),
                state: BuildState::Queued,
                step: 0,
                steps: 0,
                step_reports: Vec::new(),
                exit_code: None,
                error: None,
                image: None,
                created_at: now(),
                finished_at: None,
            }),
            events: Mutex::new(Vec::new()),
            count,
            cancel: Cancel::default(),
        });
        builds.add(job.clone());
        save_build(&builds.records, &job);
        let sandbox_network = match &req.sandbox_network {
            Some(n) => Some(
                serde_json::to_value(n)
                    .map_err(|e| ServiceError::invalid(format!("sandbox_network: {e}")))?,
            ),
            None => None,
        };
        let source = if let Some(name) = &req.builtin {
            sandcell_build::source::from_builtin(name, &context, sandbox_network)
        } else if let Some(text) = &req.spec {
            sandcell_build::source::from_template_file(text, &context, sandbox_network)
        } else {
            Ok(sandcell_build::source::Source {
                dockerfile: req.dockerfile.clone(),
                ..Default::default()
            })
        };
        let source = match source {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&context);
                return Err(ServiceError::invalid(e.to_string()));
            }
        };
        let mut build_args = source.build_args;
        build_args.extend(req.build_args.clone());
        let request = BuildRequest {
            name: req.name.clone(),
            dockerfile: source.dockerfile,
            context: context.clone(),
            build_args,
            no_cache: req.no_cache,
            allow_hosts: req.allow_hosts.clone(),
            offline: req.offline,
            defaults: source.defaults,
        };
        let builder = builds.builder.clone();
        let gate = builds.one_at_a_time.clone();
        let runner = job.clone();
        let records = builds.records.clone();
        let home = self.config.home.clone();
        let fleet = self.fleet.clone();
        let task = tokio::spawn(async move {
            let permit = tokio::select! {
                p = gate.acquire_owned() => p.ok(),
                () = runner.cancel.cancelled() => None,
            };
            let result = match permit {
                Some(_permit) => {
                    lock(&runner.info).state = BuildState::Running;
                    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                    let cancel = runner.cancel.clone();
                    let build =
                        tokio::spawn(async move { builder.build(request, tx, cancel).await });
                    // The end is told once the image is recorded: whoever reads the build
                    // after `finished` finds it.
                    let mut finished = None;
                    while let Some(event) = rx.recv().await {
                        match event {
                            BuildEvent::Finished { .. } => finished = Some(event),
                            // Kept after each step, so a daemon that stops midway leaves
                            // the steps it got through.
                            BuildEvent::StepFinished { .. } => {
                                runner.record(event);
                                save_build(&records, &runner);
                            }
                            other => runner.record(other),
                        }
                    }
                    let result = build.await.unwrap_or_else(|e| {
                        Err(BuildError::Invalid(format!("the build task: {e}")))
                    });
                    if let Ok(image) = &result {
                        lock(&runner.info).image = Some(image.clone());
                        // Its warm pool (when its template file asks for one) now holds
                        // sandboxes of this image.
                        match crate::images::template_pool(&home, &image.reference) {
                            Ok(Some(pool)) => fleet.upsert_pool(pool).await,
                            Ok(None) => {}
                            Err(e) => tracing::warn!(error = %e, "the template's warm pool"),
                        }
                    }
                    runner.record(finished.unwrap_or_else(|| BuildEvent::Finished {
                        state: BuildState::Failed,
                        error: Some("the build ended without saying how".into()),
                    }));
                    save_build(&records, &runner);
                    result
                }
                None => {
                    runner.record(BuildEvent::Finished {
                        state: BuildState::Cancelled,
                        error: None,
                    });
                    save_build(&records, &runner);
                    Err(BuildError::Cancelled)
                }
            };
            drop(result);
            let _ = std::fs::remove_dir_all(&context);
        });
        if req.wait {
            let _ = task.await;
        }
        Ok(lock(&job.info).clone())
    }

    /// A build.
    pub fn build_info(&self, id: &str) -> ServiceResult<BuildInfo> {
        Ok(lock(&self.builds.job(id)?.info).clone())
    }

    /// The builds kept, newest first.
    pub fn list_builds(&self) -> BuildList {
        let mut builds: Vec<BuildInfo> = lock(&self.builds.jobs)
            .iter()
            .map(|j| lock(&j.info).clone())
            .collect();
        builds.reverse();
        BuildList { builds }
    }

    /// Cancels a build (its running step is killed); answers when it has ended.
    pub async fn cancel_build(&self, caller: &Caller, id: &str) -> ServiceResult<BuildInfo> {
        let job = self.builds.job(id)?;
        admin_only(caller, "cancel builds")?;
        if !lock(&job.info).state.is_final() {
            job.cancel.cancel();
            let mut rx = job.count.subscribe();
            let wait = async {
                while !lock(&job.info).state.is_final() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), wait).await;
        }
        Ok(lock(&job.info).clone())
    }

    /// A build's events after number `after`, at most `limit`.
    pub fn build_log(&self, id: &str, after: u64, limit: usize) -> ServiceResult<BuildLog> {
        let job = self.builds.job(id)?;
        let events = lock(&job.events)
            .iter()
            .filter(|e| e.seq > after)
            .take(limit)
            .cloned()
            .collect();
        Ok(BuildLog { events })
    }

    /// A build's events after number `after`, then the live ones until it ends.
    pub fn follow_build(
        &self,
        id: &str,
        after: u64,
    ) -> ServiceResult<impl Stream<Item = NumberedBuildEvent> + Send + 'static> {
        let job = self.builds.job(id)?;
        let rx = job.count.subscribe();
        Ok(futures_util::stream::unfold(
            (job, rx, after, false),
            |(job, mut rx, next, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let found = lock(&job.events).iter().find(|e| e.seq > next).cloned();
                    if let Some(event) = found {
                        let last = matches!(event.event, BuildEvent::Finished { .. });
                        let seq = event.seq;
                        return Some((event, (job, rx, seq, last)));
                    }
                    // A build that has ended has no more to send.
                    if lock(&job.info).state.is_final() {
                        return None;
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            },
        ))
    }

    /// The templates of the store (its images), by name.
    pub async fn list_templates(&self) -> ServiceResult<TemplateList> {
        let home = self.config.home.clone();
        let store = open_store(&home)?;
        let names = store.references().map_err(image_error)?;
        let mut templates = Vec::new();
        for name in names {
            if let Some(info) = self.template_info(&store, &name)? {
                templates.push(info);
            }
        }
        templates.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(TemplateList { templates })
    }

    /// One template.
    pub async fn get_template(&self, name: &str) -> ServiceResult<TemplateInfo> {
        sandcell_template::check_reference(name).map_err(ServiceError::invalid)?;
        let store = open_store(&self.config.home)?;
        self.template_info(&store, name)?
            .ok_or_else(|| not_found(name))
    }

    /// Deletes a template's name (its layers go at the next garbage collection); refused
    /// while sandboxes run on it.
    pub async fn delete_template(&self, caller: &Caller, name: &str) -> ServiceResult<()> {
        let info = self.get_template(name).await?;
        admin_only(caller, "delete templates")?;
        if info.sandboxes > 0 {
            return Err(ServiceError::new(
                ErrorKind::InvalidState,
                format!(
                    "template '{}' is used by {} running sandbox{}: delete them first",
                    info.name,
                    info.sandboxes,
                    if info.sandboxes == 1 { "" } else { "es" }
                ),
            ));
        }
        let store = open_store(&self.config.home)?;
        store.untag(&info.name).map_err(image_error)?;
        // Its warm pool goes with it (a refill would find no image).
        let pool = crate::images::template_pool_name(&info.name);
        if let Some(seed) = self.fleet.remove_pool(&pool).await {
            let _ = std::fs::remove_dir_all(seed);
        }
        Ok(())
    }

    fn template_info(
        &self,
        store: &sandcell_image::Store,
        name: &str,
    ) -> ServiceResult<Option<TemplateInfo>> {
        let Some(image) = store.lookup(name).map_err(image_error)? else {
            return Ok(None);
        };
        let root = store
            .root()
            .join("roots")
            .join(sandcell_image::chain_id(&image.manifest.layers));
        let sandboxes = self.fleet.sandboxes_on(&root.display().to_string());
        Ok(Some(template_info(&image, sandboxes)))
    }
}

/// What a template's listing shows of `image` (`sandboxes`: how many run on it), read from its
/// configuration; the daemon's and `sandcell template ls --local` alike.
pub fn template_info(image: &sandcell_image::Image, sandboxes: u32) -> TemplateInfo {
    let config = &image.config["config"];
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    TemplateInfo {
        name: image.reference.clone(),
        digest: image.manifest_digest.clone(),
        layers: image.manifest.layers.len() as u32,
        size: image.manifest.layers.iter().map(|l| l.size).sum(),
        kernels: config["Labels"][KERNELS_LABEL]
            .as_str()
            .map(|k| {
                k.split(',')
                    .filter(|k| !k.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        env: strings(&config["Env"]),
        workdir: config["WorkingDir"].as_str().map(str::to_string),
        sandboxes,
    }
}

/// Templates are the daemon's, shared by every owner: changing them takes an admin key.
fn admin_only(caller: &Caller, what: &str) -> ServiceResult<()> {
    if caller.admin {
        Ok(())
    } else {
        Err(ServiceError::new(
            ErrorKind::PermissionDenied,
            format!("only an admin key may {what}: templates are shared by every owner"),
        ))
    }
}

fn not_found(name: &str) -> ServiceError {
    ServiceError::new(
        ErrorKind::NotFound,
        format!("no template '{name}' (GET /v1/templates lists them)"),
    )
}

impl Service {
    /// Removes the image store's blobs and unpacked roots that no template uses (keeping the
    /// layer cache and the roots sandboxes run on), unless a build is running: then `None`,
    /// and the next round collects.
    pub async fn collect_image_garbage(&self) -> ServiceResult<Option<sandcell_image::Collected>> {
        let Ok(_no_build) = self.builds.one_at_a_time.clone().try_acquire_owned() else {
            return Ok(None);
        };
        let home = self.config.home.clone();
        tokio::task::spawn_blocking(move || {
            open_store(&home)?
                .collect_garbage(true)
                .map(Some)
                .map_err(image_error)
        })
        .await
        .map_err(|e| ServiceError::internal(format!("collecting the image store: {e}")))?
    }
}

fn open_store(home: &Path) -> ServiceResult<sandcell_image::Store> {
    sandcell_image::Store::open(home.join("images")).map_err(image_error)
}

fn image_error(e: sandcell_image::ImageError) -> ServiceError {
    match e {
        sandcell_image::ImageError::Invalid(m) => ServiceError::invalid(m),
        other => ServiceError::internal(other.to_string()),
    }
}

/// Unpacks a context archive (tar, plain or gzip) into `dir`; nothing lands outside it.
fn unpack_context(bytes: &[u8], dir: &Path) -> ServiceResult<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| ServiceError::internal(format!("create {}: {e}", dir.display())))?;
    if bytes.is_empty() {
        return Ok(());
    }
    let reader: Box<dyn std::io::Read> = if bytes.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(bytes))
    } else {
        Box::new(bytes)
    };
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.unpack(dir).map_err(|e| {
        let _ = std::fs::remove_dir_all(dir);
        ServiceError::invalid(format!("the context is not a tar archive: {e}"))
    })
}
