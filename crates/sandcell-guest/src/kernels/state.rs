//! Kernel state capture for snapshots: a context's variables dumped to a file and loaded
//! back, into a context made for it when a restored sandbox has none.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sandcell_protocol::code::{RestoreReport, StateReport};
use sandcell_protocol::{ErrorCode, GuestMessage, Language, WireError};
use serde_json::{Value, json};

use crate::shared::Shared;
use crate::sync::lock;

use super::process::ensure_kernel;
use super::table::{BusyGuard, Context, new_context};
use super::{kill_kernel, try_slot};

/// How long a kernel may take to write or read a state file (large values take seconds).
const STATE_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest context id a restore may create.
const MAX_CONTEXT_ID: usize = 128;

fn state_supported(language: Language) -> Result<(), WireError> {
    match language {
        Language::Python | Language::Node => Ok(()),
        other => Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("kernel state capture is available for python and node contexts, not {other}"),
        )),
    }
}

fn state_path(path: &str) -> Result<(), WireError> {
    if !path.starts_with('/') || path.contains('\0') || path.contains('\n') {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("state file path {path:?} must be an absolute path"),
        ));
    }
    Ok(())
}

/// A state request on an idle context: marked busy meanwhile (a run waits for no turn, it
/// is refused), with a timeout fit for large files.
async fn state_call(shared: &Arc<Shared>, ctx: &Context, req: Value) -> Result<Value, WireError> {
    let mut slot = try_slot(ctx).await?;
    ctx.busy.store(true, Ordering::SeqCst);
    let _busy = BusyGuard(&ctx.busy);
    ensure_kernel(shared, ctx, &mut slot).await?;
    let Some(kernel) = slot.kernel.as_mut() else {
        return Err(WireError::new(ErrorCode::Internal, "no kernel"));
    };
    kernel.call_within(req, STATE_TIMEOUT).await
}

/// `DumpKernelState`: the context's kernel writes its variables to `path`.
pub(crate) async fn dump_state(
    shared: &Arc<Shared>,
    context: &str,
    path: &str,
) -> Result<GuestMessage, WireError> {
    // Only a context that exists: naming a language's default context must not make one.
    let ctx = lock(&shared.kernels.contexts)
        .get(context)
        .cloned()
        .ok_or_else(|| {
            WireError::new(
                ErrorCode::NotFound,
                format!("no context '{context}' in this sandbox"),
            )
        })?;
    state_supported(ctx.language)?;
    state_path(path)?;
    let v = state_call(shared, &ctx, json!({"op": "dump_state", "path": path})).await?;
    let report: StateReport = serde_json::from_value(v).map_err(|e| {
        WireError::new(
            ErrorCode::Internal,
            format!("the kernel's state report is malformed: {e}"),
        )
    })?;
    Ok(GuestMessage::KernelStateSaved {
        saved: report.saved,
        skipped: report.skipped,
        bytes: report.bytes,
    })
}

/// `LoadKernelState`: restores a state file into the context, which is created (with this
/// id and language) and given a kernel when it has none: a sandbox restored from a snapshot
/// starts without its contexts.
pub(crate) async fn load_state(
    shared: &Arc<Shared>,
    context: &str,
    language: Language,
    path: &str,
) -> Result<GuestMessage, WireError> {
    state_supported(language)?;
    state_path(path)?;
    // Checked before a context is made for it; the agent reads as the kernel would.
    match std::fs::File::open(path).and_then(|f| f.metadata()) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("state file {path} is not a regular file"),
            ));
        }
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => ErrorCode::NotFound,
                std::io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
                _ => ErrorCode::Io,
            };
            return Err(WireError::new(
                code,
                format!("cannot read state file {path}: {e}"),
            ));
        }
    }
    let (ctx, made) = context_for_restore(shared, context, language)?;
    let v = match state_call(shared, &ctx, json!({"op": "load_state", "path": path})).await {
        Ok(v) => v,
        Err(e) => {
            // A context made for this restore alone does not outlive its failure.
            if made {
                lock(&shared.kernels.contexts).remove(&ctx.id);
                kill_kernel(&ctx, "the restore failed").await;
            }
            return Err(e);
        }
    };
    let report: RestoreReport = serde_json::from_value(v).map_err(|e| {
        WireError::new(
            ErrorCode::Internal,
            format!("the kernel's restore report is malformed: {e}"),
        )
    })?;
    Ok(GuestMessage::KernelStateLoaded {
        restored: report.restored,
        failed: report.failed,
    })
}

/// The context `id` of `language`, made (without a kernel yet) when it does not exist; and
/// whether it was made.
fn context_for_restore(
    shared: &Shared,
    id: &str,
    language: Language,
) -> Result<(Arc<Context>, bool), WireError> {
    let mut contexts = lock(&shared.kernels.contexts);
    if let Some(ctx) = contexts.get(id) {
        if ctx.language != language {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "context '{id}' runs {}, not {language}",
                    ctx.language.as_str()
                ),
            ));
        }
        return Ok((ctx.clone(), false));
    }
    let valid = !id.is_empty()
        && id.len() <= MAX_CONTEXT_ID
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("context id {id:?} is not valid (letters, digits, '-', '_', '.')"),
        ));
    }
    if let Some(default_of) = Language::ALL.into_iter().find(|l| l.as_str() == id)
        && default_of != language
    {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("context '{id}' is the default context of {default_of}, not {language}"),
        ));
    }
    // A later `CreateContext` numbers past a restored `python-3`.
    if let Some(n) = id
        .strip_prefix(language.as_str())
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|n| n.parse::<u64>().ok())
    {
        shared.kernels.created.fetch_max(n, Ordering::SeqCst);
    }
    let ctx = Arc::new(new_context(
        id.to_string(),
        language,
        lock(&shared.kernels.default_cwd).clone(),
        BTreeMap::new(),
    ));
    contexts.insert(ctx.id.clone(), ctx.clone());
    Ok((ctx, true))
}
