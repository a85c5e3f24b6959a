//! Templates that are images of the home's store (`<home>/images`, see
//! docs/templates.md): a create naming one gets a sandbox whose system is that image's root
//! filesystem, unpacked once on the host (`sandcell_image::unpacked_root`) and bound
//! read-only like the host's own system.

use std::path::{Path, PathBuf};

use sandcell_api::sandboxes::{CreateSandbox, template_kernels};
use sandcell_engine::SandboxSpec;

use crate::{ErrorKind, Service, ServiceError, ServiceResult};

impl Service {
    /// The engine spec `req` asks for: a built-in template as [`crate::sandboxes::spec_of`]
    /// makes it, or an image of the store as its system root.
    pub async fn spec_for(&self, req: &CreateSandbox) -> ServiceResult<SandboxSpec> {
        // A built-in template touches no file: only an image's unpacking leaves the thread.
        if image_template(req).is_none() {
            return crate::sandboxes::spec_of(req);
        }
        let home = self.config.home.clone();
        let req = req.clone();
        tokio::task::spawn_blocking(move || spec_with_images(&home, &req))
            .await
            .map_err(|e| ServiceError::internal(format!("unpacking the image: {e}")))?
    }
}

/// The engine spec `req` asks for, an image template of the store under `home` resolved to
/// its unpacked root (unpacked now when it is not yet: this blocks). Warm pools of image
/// templates get their spec here too, so that creates naming the image find them.
pub fn spec_with_images(home: &Path, req: &CreateSandbox) -> ServiceResult<SandboxSpec> {
    let Some(name) = image_template(req) else {
        return crate::sandboxes::spec_of(req);
    };
    let root = image_root(home, name)?;
    let mut plain = with_template_defaults(home, name, req)?;
    plain.template = None;
    let mut spec = crate::sandboxes::spec_of(&plain)?;
    // One name for the image however it was asked for (`name` is `name:latest`): a warm
    // pool's spec and a create's then match.
    spec.template = Some(reference_of(name));
    spec.system_root = Some(root.display().to_string());
    // The image's `ENV` (a build's, or an imported image's), under what the request sets.
    for (key, value) in image_env(home, name)? {
        spec.env.entry(key).or_insert(value);
    }
    spec.workdir = image_workdir(home, name)?;
    Ok(spec)
}

/// Where sandboxes of image `name` work: the template file's `[sandbox] workdir`, else the
/// image's `WORKDIR` (`None` for `/` or none: they work in `/workspace`).
pub fn image_workdir(home: &Path, name: &str) -> ServiceResult<Option<String>> {
    if let Some(dir) = template_defaults(home, name)?.and_then(|d| d.sandbox.workdir) {
        return Ok(Some(dir));
    }
    let store = sandcell_image::Store::open(home.join("images")).map_err(image_error)?;
    let Some(image) = store.lookup(name).map_err(image_error)? else {
        return Ok(None);
    };
    Ok(image.config["config"]["WorkingDir"]
        .as_str()
        .filter(|d| d.starts_with('/') && *d != "/")
        .map(str::to_string))
}

/// `req` with the defaults the template file of image `name` gave its sandboxes (network,
/// limits, environment, kernels started at create) under what `req` sets itself.
pub fn with_template_defaults(
    home: &Path,
    name: &str,
    req: &CreateSandbox,
) -> ServiceResult<CreateSandbox> {
    let mut req = req.clone();
    let Some(defaults) = template_defaults(home, name)? else {
        return Ok(req);
    };
    let sandbox = defaults.sandbox;
    let bad = |what: &str, e: serde_json::Error| {
        ServiceError::invalid(format!(
            "template '{name}' records a {what} that is not valid here: {e}"
        ))
    };
    if req.network.is_none()
        && let Some(network) = sandbox.network
    {
        req.network = Some(serde_json::from_value(network).map_err(|e| bad("network", e))?);
    }
    if req.limits.is_none()
        && let Some(limits) = sandbox.limits
    {
        req.limits = Some(serde_json::from_value(limits).map_err(|e| bad("limits", e))?);
    }
    for (key, value) in sandbox.env {
        req.env.entry(key).or_insert(value);
    }
    if req.kernels.is_empty() {
        req.kernels = serde_json::from_value(serde_json::json!(sandbox.kernels))
            .map_err(|e| bad("kernel list", e))?;
    }
    if req.backend.is_none() {
        req.backend = sandbox.backend;
    }
    Ok(req)
}

/// The defaults the template file of image `name` recorded, if it had one.
pub fn template_defaults(
    home: &Path,
    name: &str,
) -> ServiceResult<Option<sandcell_build::builder::TemplateDefaults>> {
    let store = sandcell_image::Store::open(home.join("images")).map_err(image_error)?;
    let Some(image) = store.lookup(name).map_err(image_error)? else {
        return Ok(None);
    };
    let Some(text) =
        image.config["config"]["Labels"][sandcell_build::builder::DEFAULTS_LABEL].as_str()
    else {
        return Ok(None);
    };
    serde_json::from_str(text).map(Some).map_err(|e| {
        ServiceError::invalid(format!("template '{name}' has unreadable defaults: {e}"))
    })
}

/// The environment image `name` of the store under `home` declares (`Env` of its config).
pub fn image_env(home: &Path, name: &str) -> ServiceResult<Vec<(String, String)>> {
    let store = sandcell_image::Store::open(home.join("images")).map_err(image_error)?;
    let Some(image) = store.lookup(name).map_err(image_error)? else {
        return Ok(Vec::new());
    };
    Ok(image
        .config
        .pointer("/config/Env")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|e| e.as_str()?.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default())
}

/// `name` as the store names it: with its tag, `latest` when it has none.
pub fn reference_of(name: &str) -> String {
    if name.contains(':') {
        name.to_string()
    } else {
        format!("{name}:latest")
    }
}

/// The warm pool the template file of image `name` asks for (`[warm] strategy = "pool"` or
/// `"snapshot"`): sandboxes as a create naming it gets them, each having run the warm-up
/// code in its first kernel (Python when it starts none); for `snapshot`, the first one only,
/// the others restored from its snapshot, kept in `<home>/pool-seeds/<name:tag>`. `None` for
/// any other strategy (`singleton` is handled by the create).
pub fn template_pool(
    home: &Path,
    name: &str,
) -> ServiceResult<Option<sandcell_engine::fleet::PoolSpec>> {
    let Some(defaults) = template_defaults(home, name)? else {
        return Ok(None);
    };
    let (size, warmup, seeded) = match defaults.warm {
        sandcell_template::WarmStrategy::Pool { size, warmup } => (size, warmup, false),
        sandcell_template::WarmStrategy::Snapshot { size, warmup } => (size, warmup, true),
        _ => return Ok(None),
    };
    let reference = reference_of(name);
    let req = CreateSandbox {
        template: Some(reference.clone()),
        ..Default::default()
    };
    let spec = spec_with_images(home, &req)?;
    let language = spec
        .warm_kernels
        .first()
        .copied()
        .unwrap_or(sandcell_protocol::Language::Python);
    let prepare = warmup.map(|code| {
        let run = move |sandbox: sandcell_engine::Sandbox| {
            let code = code.clone();
            Box::pin(async move {
                let ran = sandbox
                    .run(language, &code)
                    .await
                    .map_err(|e| e.to_string())?;
                match ran.error {
                    Some(e) => Err(format!("the warm-up failed: {}: {}", e.ename, e.evalue)),
                    None => Ok(serde_json::json!({"warmed": true})),
                }
            })
                as std::pin::Pin<
                    Box<dyn std::future::Future<Output = Result<serde_json::Value, String>> + Send>,
                >
        };
        sandcell_engine::fleet::PoolPrepare {
            key: warmup_key(&reference),
            run: std::sync::Arc::new(run),
        }
    });
    Ok(Some(sandcell_engine::fleet::PoolSpec {
        name: template_pool_name(&reference),
        spec,
        size: size as usize,
        prepare,
        seed: seeded.then(|| home.join("pool-seeds").join(&reference)),
    }))
}

/// The name of template `reference`'s warm pool (in metrics).
pub fn template_pool_name(reference: &str) -> String {
    format!("{reference}/template")
}

/// The warm pools of every template of the store under `home` that asks for one (a
/// template that cannot give one is skipped, saying why in the log).
pub fn template_pools(home: &Path) -> Vec<sandcell_engine::fleet::PoolSpec> {
    let Ok(store) = sandcell_image::Store::open(home.join("images")) else {
        return Vec::new();
    };
    let mut pools = Vec::new();
    for name in store.references().unwrap_or_default() {
        match template_pool(home, &name) {
            Ok(Some(pool)) => pools.push(pool),
            Ok(None) => {}
            Err(e) => tracing::warn!(template = %name, error = %e, "no warm pool for it"),
        }
    }
    pools
}

/// What a create of image template `reference` must name to take a sandbox its pool warmed
/// up (see [`template_pool`]).
pub fn warmup_key(reference: &str) -> String {
    format!("warmup:{reference}")
}

/// The template `req` names when it is not a built-in one (then an image of the store).
fn image_template(req: &CreateSandbox) -> Option<&str> {
    req.template
        .as_deref()
        .filter(|t| template_kernels(t).is_none())
}

/// The unpacked root of image `name` in the store of `home` (`sandcell run --template`
/// and creates alike); `not_found` when the store has no such image.
pub fn image_root(home: &Path, name: &str) -> ServiceResult<PathBuf> {
    sandcell_template::check_reference(name).map_err(ServiceError::invalid)?;
    let store = sandcell_image::Store::open(home.join("images")).map_err(image_error)?;
    sandcell_image::unpacked_root(&store, name).map_err(|e| match e {
        sandcell_image::ImageError::Missing(_) => ServiceError::new(
            ErrorKind::NotFound,
            format!(
                "no template '{name}': it is not built in (default, python, node, bash, r) and no image named '{name}' is in the store (sandcell image ls; sandcell image import FILE --as {name})"
            ),
        ),
        other => image_error(other),
    })
}

fn image_error(e: sandcell_image::ImageError) -> ServiceError {
    match e {
        sandcell_image::ImageError::Invalid(m) => ServiceError::invalid(m),
        other => ServiceError::new(ErrorKind::Internal, other.to_string()),
    }
}
