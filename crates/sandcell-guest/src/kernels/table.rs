//! The context table: every context of the agent, its kernel slot and busy flag, and how a
//! request names one (an id, or a language's default context, made on first use).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sandcell_protocol::{ContextInfo, ErrorCode, Language, WireError};

use crate::sync::lock;

use super::artifacts::Outputs;
use super::kernel::Kernel;

/// What a context holds between requests.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) kernel: Option<Kernel>,
    /// Why the previous kernel died, until the next execution reports it.
    pub(super) died: Option<String>,
}

/// One context.
pub(super) struct Context {
    pub(super) id: String,
    pub(super) language: Language,
    pub(super) cwd: String,
    pub(super) env: BTreeMap<String, String>,
    pub(super) slot: tokio::sync::Mutex<Slot>,
    pub(super) busy: AtomicBool,
    /// The kernel's pid (0 without one), for signals that must not wait for the slot.
    pub(super) pid: AtomicI32,
    pub(super) execution_count: AtomicU64,
    /// Set when a restart or destroy kills the kernel under a running execution.
    pub(super) killing: Mutex<Option<&'static str>>,
}

impl Context {
    pub(super) fn info(&self) -> ContextInfo {
        let pid = self.pid.load(Ordering::SeqCst);
        ContextInfo {
            id: self.id.clone(),
            language: self.language,
            pid: (pid > 0).then_some(pid),
            execution_count: self.execution_count.load(Ordering::SeqCst),
            busy: self.busy.load(Ordering::SeqCst),
        }
    }

    /// Sends `signal` to the kernel and its process group.
    pub(super) fn signal(&self, signal: i32) -> bool {
        let pid = self.pid.load(Ordering::SeqCst);
        if pid <= 1 {
            return false;
        }
        let sig = nix::sys::signal::Signal::try_from(signal).ok();
        // The kernel leads its own group; its children (a shell's foreground command) are in it.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-pid), sig);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).is_ok()
    }
}

/// Marks a context busy for the life of a request.
pub(super) struct BusyGuard<'a>(pub(super) &'a AtomicBool);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// The contexts of the agent (they outlive connections).
pub(crate) struct Kernels {
    pub(super) contexts: Mutex<BTreeMap<String, Arc<Context>>>,
    pub(super) created: AtomicU64,
    /// Environment of every kernel (from `Prepare`); a context's own variables win.
    pub(super) env: Mutex<BTreeMap<String, String>>,
    /// Working directory of a context that does not name one (`GuestConfig::default_cwd`,
    /// or the template's, from `Prepare`).
    pub(super) default_cwd: Mutex<String>,
    /// What the last look at the outputs folder found.
    pub(super) outputs: Outputs,
}

impl Kernels {
    /// No contexts yet; those that name no working directory start in `default_cwd`.
    pub(crate) fn new(default_cwd: &Path) -> Self {
        Self {
            contexts: Mutex::default(),
            created: AtomicU64::default(),
            default_cwd: Mutex::new(default_cwd.to_string_lossy().into_owned()),
            env: Mutex::default(),
            outputs: Outputs::default(),
        }
    }

    /// The context `id`, or the default context of `language` (created on first use).
    pub(super) fn resolve(
        &self,
        id: Option<&str>,
        language: Option<Language>,
    ) -> Result<Arc<Context>, WireError> {
        let mut contexts = lock(&self.contexts);
        match (id, language) {
            (Some(id), lang) => {
                let ctx = match contexts.get(id) {
                    Some(c) => c.clone(),
                    None => match Language::parse(id).filter(|l| l.as_str() == id) {
                        // A default context may be named before its first use.
                        Some(l) => insert_default(&mut contexts, l, &lock(&self.default_cwd)),
                        None => {
                            return Err(WireError::new(
                                ErrorCode::NotFound,
                                format!("no context '{id}' in this sandbox"),
                            ));
                        }
                    },
                };
                if let Some(l) = lang.filter(|l| *l != ctx.language) {
                    return Err(WireError::new(
                        ErrorCode::InvalidArgument,
                        format!("context '{id}' runs {}, not {l}", ctx.language.as_str()),
                    ));
                }
                Ok(ctx)
            }
            (None, Some(l)) => Ok(match contexts.get(l.as_str()) {
                Some(c) => c.clone(),
                None => insert_default(&mut contexts, l, &lock(&self.default_cwd)),
            }),
            (None, None) => Err(WireError::new(
                ErrorCode::InvalidArgument,
                "name a context or a language",
            )),
        }
    }

    pub(super) fn existing(&self, id: &str) -> Result<Arc<Context>, WireError> {
        self.resolve(Some(id), None)
    }

    pub(super) fn all(&self) -> Vec<Arc<Context>> {
        lock(&self.contexts).values().cloned().collect()
    }
}

fn insert_default(
    contexts: &mut BTreeMap<String, Arc<Context>>,
    language: Language,
    cwd: &str,
) -> Arc<Context> {
    let ctx = Arc::new(new_context(
        language.as_str().to_string(),
        language,
        cwd.to_string(),
        BTreeMap::new(),
    ));
    contexts.insert(ctx.id.clone(), ctx.clone());
    ctx
}

pub(super) fn new_context(
    id: String,
    language: Language,
    cwd: String,
    env: BTreeMap<String, String>,
) -> Context {
    Context {
        id,
        language,
        cwd,
        env,
        slot: tokio::sync::Mutex::new(Slot::default()),
        busy: AtomicBool::new(false),
        pid: AtomicI32::new(0),
        execution_count: AtomicU64::new(0),
        killing: Mutex::new(None),
    }
}
