//! Language kernels: one interpreter process per context, started and supervised here.
//!
//! A kernel speaks the protocol in `crates/sandcell-kernels/PROTOCOL.md` over two pipes
//! (requests in, events out); its fds 1 and 2 are pipes too, for output written below the
//! language (subprocesses, C code). One reader task per kernel merges the three into one
//! queue; the request being served consumes it. A context serves one request at a time;
//! interrupts are signals and need no turn.
//!
//! Here: the requests on contexts (create, list, interrupt, restart, destroy, is-complete).
//! [`table`] holds the contexts, [`kernel`] talks to a running kernel, [`process`] starts and
//! supervises one, [`run`] forwards an execution, [`artifacts`] finds the files it made,
//! [`variables`] and [`state`] serve the variables and snapshot requests. Only the table
//! (with what it holds: [`kernel`], [`artifacts`]) is reachable from [`crate::shared`]; the
//! request modules take the shared state, never the other way round.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sandcell_protocol::{Completeness, ErrorCode, GuestMessage, Language, WireError};
use serde_json::{Value, json};

mod artifacts;
mod events;
mod kernel;
mod process;
mod run;
mod state;
mod table;
mod variables;

pub(crate) use run::{HostNews, host_call_reply, host_gone, run_code};
pub(crate) use state::{dump_state, load_state};
pub(crate) use table::Kernels;
pub(crate) use variables::{clear_variables, get_variables, list_variables, set_variables};

use crate::shared::Shared;
use crate::sync::lock;

use self::process::{ensure_kernel, start_kernel};
use self::table::{Context, Slot, new_context};

/// Locks a context for one request, or says it is busy running code. (A kernel still
/// starting holds the lock too: that is waited for.)
async fn try_slot(ctx: &Context) -> Result<tokio::sync::MutexGuard<'_, Slot>, WireError> {
    if ctx.busy.load(Ordering::SeqCst) {
        return Err(WireError::new(
            ErrorCode::InvalidState,
            format!(
                "context '{}' is busy with another request; interrupt it or use another context",
                ctx.id
            ),
        ));
    }
    Ok(ctx.slot.lock().await)
}

/// `Prepare`: records the kernels' environment and default working directory, and starts
/// the requested kernels in the background.
pub(crate) fn prepare(
    shared: &Arc<Shared>,
    env: BTreeMap<String, String>,
    languages: Vec<Language>,
    cwd: Option<String>,
) -> Result<GuestMessage, WireError> {
    if let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("environment variable name {bad:?} is not valid"),
        ));
    }
    if let Some(c) = cwd {
        let dir = std::path::Path::new(&c);
        // A template's working directory in the sandbox's own (empty) folders is made.
        if dir.is_absolute()
            && !dir.exists()
            && shared.config.file_roots.iter().any(|r| dir.starts_with(r))
        {
            let _ = std::fs::create_dir_all(dir);
        }
        if !c.starts_with('/') || !dir.is_dir() {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("working directory '{c}' is not a directory in the sandbox"),
            ));
        }
        *lock(&shared.kernels.default_cwd) = c;
    }
    *lock(&shared.kernels.env) = env;
    for language in languages {
        let ctx = shared.kernels.resolve(None, Some(language))?;
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut slot = ctx.slot.lock().await;
            // A failure shows again, with its reason, on the first execution.
            let _ = ensure_kernel(&shared, &ctx, &mut slot).await;
        });
    }
    Ok(GuestMessage::Ok)
}

/// `CreateContext`: a new context with its kernel started.
pub(crate) async fn create_context(
    shared: &Arc<Shared>,
    language: Language,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
) -> Result<GuestMessage, WireError> {
    if let Some(c) = &cwd
        && !c.starts_with('/')
    {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("cwd '{c}' must be an absolute path"),
        ));
    }
    // Checked here: a spawn into a missing directory fails as if the interpreter were missing.
    if let Some(c) = &cwd
        && !std::path::Path::new(c).is_dir()
    {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("cwd '{c}' is not a directory in the sandbox"),
        ));
    }
    if let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("environment variable name {bad:?} is not valid"),
        ));
    }
    // A context restored from a snapshot may hold a number already (see `load_state`).
    let id = loop {
        let n = shared.kernels.created.fetch_add(1, Ordering::SeqCst) + 1;
        let id = format!("{}-{n}", language.as_str());
        if !lock(&shared.kernels.contexts).contains_key(&id) {
            break id;
        }
    };
    let cwd = cwd.unwrap_or_else(|| lock(&shared.kernels.default_cwd).clone());
    let ctx = Arc::new(new_context(id.clone(), language, cwd, env));
    {
        let mut slot = ctx.slot.lock().await;
        slot.kernel = Some(start_kernel(shared, &ctx).await?);
    }
    lock(&shared.kernels.contexts).insert(id, ctx.clone());
    Ok(GuestMessage::Context {
        context: ctx.info(),
    })
}

/// `ListContexts`.
pub(crate) fn list_contexts(shared: &Shared) -> GuestMessage {
    GuestMessage::Contexts {
        contexts: shared.kernels.all().iter().map(|c| c.info()).collect(),
    }
}

/// `Interrupt`: SIGINT to the context's kernel (a no-op when nothing runs).
pub(crate) fn interrupt(shared: &Shared, context: &str) -> Result<GuestMessage, WireError> {
    let ctx = shared.kernels.existing(context)?;
    if ctx.busy.load(Ordering::SeqCst) {
        ctx.signal(libc::SIGINT);
    }
    Ok(GuestMessage::Ok)
}

/// `RestartContext`: kills the kernel (ending a running execution) and starts a fresh one.
pub(crate) async fn restart(
    shared: &Arc<Shared>,
    context: &str,
) -> Result<GuestMessage, WireError> {
    let ctx = shared.kernels.existing(context)?;
    kill_kernel(&ctx, "the kernel was restarted on request").await;
    let mut slot = ctx.slot.lock().await;
    *lock(&ctx.killing) = None;
    slot.kernel = Some(start_kernel(shared, &ctx).await?);
    slot.died = None;
    Ok(GuestMessage::Context {
        context: ctx.info(),
    })
}

/// `DestroyContext`.
pub(crate) async fn destroy(
    shared: &Arc<Shared>,
    context: &str,
) -> Result<GuestMessage, WireError> {
    let ctx = shared.kernels.existing(context)?;
    lock(&shared.kernels.contexts).remove(&ctx.id);
    kill_kernel(&ctx, "the context was destroyed").await;
    Ok(GuestMessage::Ok)
}

/// Kills the context's kernel and waits until no request holds it.
async fn kill_kernel(ctx: &Context, reason: &'static str) {
    *lock(&ctx.killing) = Some(reason);
    ctx.signal(libc::SIGKILL);
    let mut slot = ctx.slot.lock().await;
    slot.kernel = None;
    slot.died = None;
    ctx.pid.store(0, Ordering::SeqCst);
    ctx.execution_count.store(0, Ordering::SeqCst);
}

/// Kills every kernel (the connection is ending).
pub(crate) fn kill_all(shared: &Shared) {
    for ctx in shared.kernels.all() {
        ctx.signal(libc::SIGKILL);
    }
}

/// Runs a non-execute kernel request on an idle context.
async fn kernel_call(shared: &Arc<Shared>, ctx: &Context, req: Value) -> Result<Value, WireError> {
    let mut slot = try_slot(ctx).await?;
    ensure_kernel(shared, ctx, &mut slot).await?;
    let Some(kernel) = slot.kernel.as_mut() else {
        return Err(WireError::new(ErrorCode::Internal, "no kernel"));
    };
    kernel.call(req).await
}

/// `IsComplete`.
pub(crate) async fn is_complete(
    shared: &Arc<Shared>,
    context: Option<&str>,
    language: Option<Language>,
    code: String,
) -> Result<GuestMessage, WireError> {
    let ctx = shared.kernels.resolve(context, language)?;
    let v = kernel_call(shared, &ctx, json!({"op": "is_complete", "code": code})).await?;
    let status = match v["status"].as_str() {
        Some("incomplete") => Completeness::Incomplete,
        Some("invalid") => Completeness::Invalid,
        _ => Completeness::Complete,
    };
    Ok(GuestMessage::Completeness {
        status,
        indent: v["indent"].as_str().map(str::to_string),
    })
}
