//! `sandcell image`: the images in the home's store (`<home>/images`, an OCI image layout)
//! that templates are built on: imported from files (no registry is reachable here), or
//! made as bases ahead of a build.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use sandcell_image::{Base, DebianOptions, Store};

use crate::daemon::ConfigArgs;
use crate::render::table;

/// Where the store is and how to print.
#[derive(Debug, Args, Clone, Default)]
pub struct ImageArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// `sandcell image`.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Import an image from a file: a `docker save` archive, an OCI image layout (a folder)
    /// or an archive of one, or a root filesystem tarball (plain or gzip).
    Import {
        /// The file or folder.
        file: PathBuf,
        /// Its name here (`name[:tag]`), what `FROM` will say.
        #[arg(long = "as", value_name = "NAME")]
        name: String,
        /// Which image of a file that holds several (its name or tag there).
        #[arg(long, value_name = "REF")]
        pick: Option<String>,
        #[command(flatten)]
        args: ImageArgs,
    },
    /// List the images.
    Ls {
        #[command(flatten)]
        args: ImageArgs,
    },
    /// Show an image: its layers, sizes and configuration.
    Inspect {
        /// Its name.
        name: String,
        #[command(flatten)]
        args: ImageArgs,
    },
    /// Remove an image's name (its layers go at the next `prune`).
    Rm {
        /// Its name.
        name: String,
        #[command(flatten)]
        args: ImageArgs,
    },
    /// Make a base ahead of a build: `debian:<suite>` (from the machine's Debian mirror,
    /// with mmdebstrap), or check that another name is in the store.
    Base {
        /// What `FROM` will say.
        name: String,
        #[command(flatten)]
        args: ImageArgs,
    },
    /// Remove the layers no image uses (with --all, the build cache's too).
    Prune {
        /// Drop the build cache as well.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        args: ImageArgs,
    },
}

fn open(args: &ImageArgs) -> anyhow::Result<Store> {
    let dir = args.config.home().join("images");
    Store::open(&dir).with_context(|| format!("the image store {}", dir.display()))
}

fn check_name(name: &str) -> anyhow::Result<()> {
    sandcell_template::check_reference(name).map_err(anyhow::Error::msg)
}

/// Runs an `image` command.
pub fn image(command: ImageCommand) -> anyhow::Result<ExitCode> {
    match command {
        ImageCommand::Import {
            file,
            name,
            pick,
            args,
        } => {
            check_name(&name)?;
            let store = open(&args)?;
            let got = sandcell_image::import(&store, &file, &name, pick.as_deref())?;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "name": got.reference,
                        "digest": got.manifest_digest,
                        "layers": got.layers,
                        "format": got.format,
                    })
                );
            } else {
                println!(
                    "imported {} ({}, {} layer{}) as {}",
                    file.display(),
                    got.format,
                    got.layers,
                    if got.layers == 1 { "" } else { "s" },
                    got.reference
                );
            }
        }
        ImageCommand::Ls { args } => {
            let store = open(&args)?;
            let mut rows = Vec::new();
            let mut list = Vec::new();
            for name in store.references()? {
                let Some(image) = store.image(&name)? else {
                    continue;
                };
                let size: u64 = image.manifest.layers.iter().map(|l| l.size).sum();
                rows.push(vec![
                    name.clone(),
                    short(&image.manifest_digest),
                    image.manifest.layers.len().to_string(),
                    human(size),
                ]);
                list.push(serde_json::json!({
                    "name": name,
                    "digest": image.manifest_digest,
                    "layers": image.manifest.layers.len(),
                    "size": size,
                }));
            }
            if args.json {
                println!("{}", serde_json::Value::Array(list));
            } else if rows.is_empty() {
                println!(
                    "no images (sandcell image import FILE --as NAME, or sandcell image base debian:bookworm)"
                );
            } else {
                print!("{}", table(&["NAME", "DIGEST", "LAYERS", "SIZE"], &rows));
            }
        }
        ImageCommand::Inspect { name, args } => {
            let store = open(&args)?;
            let image = store
                .lookup(&name)?
                .with_context(|| format!("no image named '{name}' (sandcell image ls)"))?;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "name": image.reference,
                        "digest": image.manifest_digest,
                        "layers": image.manifest.layers,
                        "config": image.config,
                        "path": store.root(),
                    })
                );
            } else {
                println!("name:    {}", image.reference);
                println!("digest:  {}", image.manifest_digest);
                let c = &image.config["config"];
                for (label, key) in [("env", "Env"), ("workdir", "WorkingDir"), ("cmd", "Cmd")] {
                    if !c[key].is_null() {
                        println!("{label:<8} {}", c[key]);
                    }
                }
                let rows: Vec<Vec<String>> = image
                    .manifest
                    .layers
                    .iter()
                    .map(|l| vec![short(&l.digest), human(l.size), l.media_type.clone()])
                    .collect();
                print!("{}", table(&["LAYER", "SIZE", "TYPE"], &rows));
            }
        }
        ImageCommand::Rm { name, args } => {
            let store = open(&args)?;
            let reference = store
                .lookup(&name)?
                .map_or(name.clone(), |image| image.reference);
            if !store.untag(&reference)? {
                anyhow::bail!("no image named '{name}' (sandcell image ls)");
            }
            if !args.json {
                println!("removed {reference} (its layers go at the next `sandcell image prune`)");
            }
        }
        ImageCommand::Base { name, args } => {
            let store = open(&args)?;
            let resolved = sandcell_image::resolve(&store, &name, &DebianOptions::default())?;
            let what = match &resolved.base {
                Base::Host => "the host's system".to_string(),
                Base::Image(i) => i.manifest_digest.clone(),
            };
            match resolved.made {
                Some(took) => println!("{name}: made in {:.1} s ({what})", took.as_secs_f64()),
                None => println!("{name}: in the store ({what})"),
            }
        }
        ImageCommand::Prune { all, args } => {
            let store = open(&args)?;
            let got = store.collect_garbage(!all)?;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"blobs": got.blobs, "bytes": got.bytes, "cache_entries": got.cache_entries,
                        "roots": got.roots, "roots_in_use": got.roots_in_use})
                );
            } else {
                println!(
                    "removed {} blob{} ({}), {} cache entr{}, {} unpacked root{}{}",
                    got.blobs,
                    if got.blobs == 1 { "" } else { "s" },
                    human(got.bytes),
                    got.cache_entries,
                    if got.cache_entries == 1 { "y" } else { "ies" },
                    got.roots,
                    if got.roots == 1 { "" } else { "s" },
                    if got.roots_in_use > 0 {
                        format!(" ({} kept: sandboxes still use them)", got.roots_in_use)
                    } else {
                        String::new()
                    }
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn short(digest: &str) -> String {
    digest
        .strip_prefix("sha256:")
        .unwrap_or(digest)
        .chars()
        .take(12)
        .collect()
}

/// A size for people: `12 B`, `3.4 MiB`.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
