//! `sandcell bench templates`: what a sandbox whose system is an image costs against a
//! host-based one (issue 19), in one run, through the engine (create + `exec` + destroy,
//! interleaved sample by sample):
//! - "host": a sandbox on the host's own system;
//! - "image": a sandbox on an image's unpacked root (an image of the home's store named by
//!   `--image`, or else a busybox root filesystem made and imported into a temporary store
//!   here);
//! - once, untimed per sample: the image's first unpacking (what the first sandbox of a new
//!   image pays).
//!
//! The command is `/bin/sh -c true` in both, so each measures the sandbox, not the program.
//!
//! With `--build NAME`: a built-in template built in the home's store once without the
//! layer cache (every step runs; the apt and pip caches of earlier builds are warm, so this
//! is not a first download), then fully cached `--samples` times, through the same builder
//! as `sandcell template build --local`. No alternative runs here to compare with: Docker
//! cannot pull a base image on these machines.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sandcell_engine::{BackendKind, Engine, SandboxSpec};
use sandcell_protocol::ExecRequest;

use super::stats::quantile;

/// The image's name, its unpacked root, and how long unpacking took (`None`: it was
/// unpacked already).
fn image_root(
    image: Option<&str>,
    scratch: &Path,
) -> anyhow::Result<(String, PathBuf, Option<Duration>)> {
    let (store, name) = match image {
        Some(name) => {
            let dir = sandcell_service::config::default_home().join("images");
            (sandcell_image::Store::open(&dir)?, name.to_string())
        }
        None => {
            let busybox = Path::new("/bin/busybox");
            if !busybox.is_file() {
                bail!(
                    "no /bin/busybox to make an image of (install busybox-static, or pass --image NAME)"
                );
            }
            let root = scratch.join("rootfs");
            std::fs::create_dir_all(root.join("usr/bin"))?;
            std::fs::copy(busybox, root.join("usr/bin/busybox"))?;
            std::os::unix::fs::symlink("busybox", root.join("usr/bin/sh"))?;
            std::os::unix::fs::symlink("busybox", root.join("usr/bin/true"))?;
            std::os::unix::fs::symlink("usr/bin", root.join("bin"))?;
            let tarball = scratch.join("rootfs.tar");
            let ok = std::process::Command::new("tar")
                .arg("-C")
                .arg(&root)
                .arg("-cf")
                .arg(&tarball)
                .arg(".")
                .status()
                .context("run tar")?
                .success();
            if !ok {
                bail!("tar failed making the busybox image");
            }
            let store = sandcell_image::Store::open(scratch.join("images"))?;
            sandcell_image::import(&store, &tarball, "bench-busybox", None)?;
            (store, "bench-busybox".to_string())
        }
    };
    let already = store
        .image(&name)?
        .with_context(|| format!("no image named '{name}' (sandcell image ls)"))?
        .manifest_digest
        .strip_prefix("sha256:")
        .is_some_and(|hex| store.root().join("roots").join(hex).join("usr").is_dir());
    let start = Instant::now();
    let root = sandcell_image::unpacked_root(&store, &name)?;
    let took = (!already).then(|| start.elapsed());
    Ok((name, root, took))
}

async fn sample(engine: &Engine, spec: &SandboxSpec) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let sb = engine.create(spec.clone()).await?;
    let out = sb.exec(ExecRequest::shell("true")).await?;
    let took = start.elapsed();
    sb.destroy().await?;
    if !out.result.success() {
        bail!("`true` failed in the sandbox: {:?}", out.result);
    }
    Ok(took)
}

/// Both rows' samples: (image name, its first unpacking, host samples, image samples).
async fn measure(
    engine: &Engine,
    samples: usize,
    image: Option<&str>,
    backend: BackendKind,
    scratch: &Path,
) -> anyhow::Result<(String, Option<Duration>, Vec<Duration>, Vec<Duration>)> {
    let (name, root, unpacked) = image_root(image, scratch)?;
    let host = SandboxSpec {
        backend,
        ..SandboxSpec::default()
    };
    let from_image = SandboxSpec {
        template: Some(name.clone()),
        system_root: Some(root.display().to_string()),
        ..host.clone()
    };
    // Warm-up: page cache, skeletons of both kinds.
    sample(engine, &host).await?;
    sample(engine, &from_image).await?;
    let (mut h, mut i) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        h.push(sample(engine, &host).await?);
        i.push(sample(engine, &from_image).await?);
    }
    Ok((name, unpacked, h, i))
}

pub(super) async fn templates(
    engine: Engine,
    samples: usize,
    image: Option<String>,
    backend: BackendKind,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    if samples < 3 {
        bail!("--samples must be at least 3");
    }
    let scratch = super::daemon::server::temp_home()?;
    let measured = measure(&engine, samples, image.as_deref(), backend, &scratch).await;
    // The busybox image's root is bound in a skeleton: pruning detaches it before the
    // folder goes.
    if image.is_none()
        && let Ok(store) = sandcell_image::Store::open(scratch.join("images"))
    {
        let _ = store.untag("bench-busybox");
        let _ = store.collect_garbage(false);
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let (name, unpacked, h, i) = measured?;
    let (hm, im) = (quantile(&h, 0.5), quantile(&i, 0.5));
    if as_json {
        println!(
            "{}",
            serde_json::json!({
                "samples": samples,
                "backend": backend.as_str(),
                "image": name,
                "unpack_ms": unpacked.map(|d| d.as_secs_f64() * 1000.0),
                "host": {"p50_ms": hm, "p90_ms": quantile(&h, 0.9)},
                "image_root": {"p50_ms": im, "p90_ms": quantile(&i, 0.9)},
                "ratio": im / hm,
            })
        );
    } else {
        println!(
            "sandbox create + exec `true` + destroy on {}, {samples} samples each, interleaved",
            backend.as_str()
        );
        println!(
            "  host system          p50 {hm:7.2} ms   p90 {:7.2} ms",
            quantile(&h, 0.9)
        );
        println!(
            "  image '{name}'  p50 {im:7.2} ms   p90 {:7.2} ms   ({:.2}x the host's)",
            quantile(&i, 0.9),
            im / hm
        );
        match unpacked {
            Some(d) => println!(
                "  the image's first unpacking (once per image): {:.1} ms",
                d.as_secs_f64() * 1000.0
            ),
            None => println!("  the image was unpacked before this run"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One build of built-in `name` in the home's store; its wall time and the steps it ran.
async fn build_once(name: &str, no_cache: bool) -> anyhow::Result<(Duration, usize, usize)> {
    use sandcell_build::builder::{BuildRequest, Builder, BuilderConfig, Cancel};
    let home = sandcell_service::config::default_home();
    let helper = std::env::current_exe().context("find the sandcell binary")?;
    let builder = Builder::new(BuilderConfig::for_home(&home, helper));
    let context = home
        .join("builds")
        .join("contexts")
        .join(format!("bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&context);
    std::fs::create_dir_all(&context)?;
    let source = sandcell_build::source::from_builtin(name, &context, None)?;
    let request = BuildRequest {
        name: name.to_string(),
        dockerfile: source.dockerfile,
        context: context.clone(),
        build_args: source.build_args,
        no_cache,
        defaults: source.defaults,
        ..BuildRequest::default()
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let start = Instant::now();
    let build = tokio::spawn(async move { builder.build(request, tx, Cancel::default()).await });
    let (mut ran, mut cached) = (0, 0);
    while let Some(event) = rx.recv().await {
        if let sandcell_api::templates::BuildEvent::StepFinished { step } = event {
            if step.cached {
                cached += 1;
            } else {
                ran += 1;
            }
        }
    }
    let built = build.await.context("the build task")?;
    let took = start.elapsed();
    let _ = std::fs::remove_dir_all(&context);
    built?;
    Ok((took, ran, cached))
}

/// `sandcell bench templates --build NAME`.
pub(super) async fn builds(name: &str, samples: usize, as_json: bool) -> anyhow::Result<ExitCode> {
    if samples < 3 {
        bail!("--samples must be at least 3");
    }
    let (cold, ran, _) = build_once(name, true).await?;
    let mut cached = Vec::new();
    for _ in 0..samples {
        let (took, ran_again, _) = build_once(name, false).await?;
        if ran_again != 0 {
            bail!("a rebuild with nothing changed ran {ran_again} steps");
        }
        cached.push(took);
    }
    let cold_ms = cold.as_secs_f64() * 1000.0;
    let p50 = quantile(&cached, 0.5);
    if as_json {
        println!(
            "{}",
            serde_json::json!({
                "template": name,
                "cold_ms": cold_ms,
                "cold_steps": ran,
                "cached": {"samples": samples, "p50_ms": p50, "p90_ms": quantile(&cached, 0.9)},
            })
        );
    } else {
        println!("build of the built-in template '{name}' in the home's store");
        println!(
            "  without the layer cache ({ran} steps run; package caches warm)  {:8.1} ms",
            cold_ms
        );
        println!(
            "  fully cached, {samples} samples                 p50 {p50:8.1} ms   p90 {:8.1} ms",
            quantile(&cached, 0.9)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One create + first result, timed, then its delete; the template's pool is full before.
async fn timed(
    d: &super::daemon::server::Daemon,
    pool: &sandcell_engine::fleet::PoolSpec,
    req: &sandcell_api::sandboxes::CreateSandbox,
) -> anyhow::Result<Duration> {
    d.wait_named_pool_full(&pool.name, pool.size).await?;
    let t = Instant::now();
    let id = d.create(req).await?;
    d.first_result(&id).await?;
    let took = t.elapsed();
    d.delete(&id).await?;
    Ok(took)
}

/// `sandcell bench templates --pool NAME`: through a daemon on a fresh home holding image
/// `NAME` of the home's store (its template file asks for a warm pool), create + first
/// result (`1+1`) three ways, interleaved sample by sample: a host-based `python` sandbox
/// cold, a sandbox of the template cold (its own environment makes it miss the pool), and one
/// from the template's pool (the pool full again before each).
pub(super) async fn pools(name: &str, samples: usize, as_json: bool) -> anyhow::Result<ExitCode> {
    use sandcell_api::sandboxes::CreateSandbox;
    if samples < 3 {
        bail!("--samples must be at least 3");
    }
    let home = super::daemon::server::temp_home()?;
    let source = sandcell_service::config::default_home().join("images");
    let store = sandcell_image::Store::open(home.join("images"))?;
    let reference = sandcell_service::images::reference_of(name);
    sandcell_image::import(&store, &source, &reference, Some(&reference))
        .with_context(|| format!("copy '{reference}' from {}", source.display()))?;
    let Some(pool) = sandcell_service::images::template_pool(&home, name)? else {
        let _ = std::fs::remove_dir_all(&home);
        bail!(
            "template '{name}' asks for no warm pool ([warm] strategy = \"pool\" or \"snapshot\")"
        );
    };
    let d = super::daemon::server::Daemon::start_in(home, 0, &[], &[]).await?;
    let with_env = |template: &str, env: bool| CreateSandbox {
        template: Some(template.to_string()),
        env: if env {
            [("A".to_string(), "1".to_string())].into()
        } else {
            Default::default()
        },
        ..CreateSandbox::default()
    };
    let (mut host_req, cold_req, pool_req) = (
        with_env("python", true),
        with_env(name, true),
        with_env(name, false),
    );
    // Side by side on the template's backend.
    host_req.backend = Some(pool.spec.backend.as_str().to_string());
    let hits = "sandcell_pool_requests_total{result=\"hit\"}";
    let (mut host, mut cold, mut pooled, mut hit) = (Vec::new(), Vec::new(), Vec::new(), 0);
    // The first round warms up and is not kept.
    for i in 0..=samples {
        let h = timed(&d, &pool, &host_req).await?;
        let c = timed(&d, &pool, &cold_req).await?;
        let before = d.metric(hits).await?;
        let p = timed(&d, &pool, &pool_req).await?;
        let after = d.metric(hits).await?;
        if i > 0 {
            host.push(h);
            cold.push(c);
            pooled.push(p);
            if after > before {
                hit += 1;
            }
        }
    }
    // What keeping the pool full costs, alone: the pool ready again after a take (a
    // `snapshot` pool restores its seed; a `pool` makes and warms one), beside a sandbox
    // made and warmed up by hand (what each refill of a `pool` does).
    let warmup =
        sandcell_service::images::template_defaults(d.home(), name)?.and_then(|t| match t.warm {
            sandcell_template::WarmStrategy::Pool { warmup, .. }
            | sandcell_template::WarmStrategy::Snapshot { warmup, .. } => warmup,
            _ => None,
        });
    let (mut refill, mut warmed) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        d.wait_named_pool_full(&pool.name, pool.size).await?;
        // From the take (the refill starts then) until the pool is full again.
        let t = Instant::now();
        let id = d.create(&pool_req).await?;
        d.wait_named_pool_full(&pool.name, pool.size).await?;
        refill.push(t.elapsed());
        d.delete(&id).await?;
        if let Some(code) = &warmup {
            let t = Instant::now();
            let id = d.create(&cold_req).await?;
            let input = sandcell_api::code::CodeInput {
                code: sandcell_api::Code::new(code.as_str())?,
                ..Default::default()
            };
            d.code_ok(&id, &input).await?;
            warmed.push(t.elapsed());
            d.delete(&id).await?;
        }
    }
    let mut rows = vec![
        ("host_python_cold", "host-based python, cold", &host),
        ("template_cold", "the template, cold", &cold),
        ("template_pool", "the template, from its pool", &pooled),
        ("pool_refill", "a take until the pool is full", &refill),
    ];
    if !warmed.is_empty() {
        rows.push(("made_and_warmed", "made + its warm-up, by hand", &warmed));
    }
    let host_p50 = quantile(&host, 0.5);
    if as_json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(key, _, s)| {
                serde_json::json!({
                    "row": key,
                    "p50_ms": quantile(s, 0.5),
                    "p90_ms": quantile(s, 0.9),
                    "vs_host": quantile(s, 0.5) / host_p50,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"template": name, "backend": pool.spec.backend.as_str(), "samples": samples, "pool_hits": hit, "rows": list})
        );
    } else {
        println!(
            "create + first result (1+1) through the daemon on {}, {samples} samples each, interleaved",
            pool.spec.backend.as_str()
        );
        for (_, label, s) in &rows {
            println!(
                "  {label:32} p50 {:8.2} ms   p90 {:8.2} ms   ({:.2}x host)",
                quantile(s, 0.5),
                quantile(s, 0.9),
                quantile(s, 0.5) / host_p50
            );
        }
        println!("  pool hits: {hit} of {samples}");
    }
    Ok(ExitCode::SUCCESS)
}
