//! Images brought in from elsewhere (no registry is reachable here): an OCI image layout (a
//! folder, or an archive of one as `skopeo copy … oci-archive:` writes), a `docker save`
//! archive, or a root filesystem tarball. Every blob is checked against its digest as it is
//! copied in; the image is named in the store under the name given.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::store::{Descriptor, LAYER_TAR, Manifest, REF_NAME, oci_architecture};
use crate::{ImageError, Store};

/// Media type of a gzip-compressed layer.
pub const LAYER_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// What was imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The name it has in the store.
    pub reference: String,
    /// Its manifest's digest.
    pub manifest_digest: String,
    /// How many layers it has.
    pub layers: usize,
    /// What the file was: `oci-layout`, `oci-archive`, `docker-save` or `rootfs`.
    pub format: &'static str,
}

fn io_err(op: &str, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
    let op = format!("{op} {}", path.display());
    move |source| ImageError::Io { op, source }
}

/// Imports the image at `path` as `reference`. A layout or archive holding several images
/// needs `pick`: the name one has there (its `ref.name`, or a `docker save` tag).
pub fn import(
    store: &Store,
    path: &Path,
    reference: &str,
    pick: Option<&str>,
) -> Result<Imported, ImageError> {
    let meta = fs::metadata(path).map_err(io_err("read", path))?;
    if meta.is_dir() {
        if !path.join("oci-layout").is_file() {
            return Err(ImageError::Invalid(format!(
                "{} is a folder but not an OCI image layout (no oci-layout file)",
                path.display()
            )));
        }
        return from_layout(store, path, reference, pick, "oci-layout");
    }
    let top = top_level_names(path)?;
    let has = |n: &str| top.iter().any(|t| t == n);
    if has("oci-layout") || has("manifest.json") {
        // An archive of a layout, or of `docker save`: unpacked into the store's scratch.
        let scratch = store
            .root()
            .join("tmp")
            .join(format!("import-{}", std::process::id()));
        let _ = fs::remove_dir_all(&scratch);
        fs::create_dir_all(&scratch).map_err(io_err("create", &scratch))?;
        let result = (|| {
            let mut archive = tar::Archive::new(reader(path)?);
            archive.unpack(&scratch).map_err(io_err("unpack", path))?;
            if scratch.join("oci-layout").is_file() && scratch.join("index.json").is_file() {
                from_layout(store, &scratch, reference, pick, "oci-archive")
            } else {
                from_docker_save(store, &scratch, reference, pick)
            }
        })();
        let _ = fs::remove_dir_all(&scratch);
        return result;
    }
    if top.is_empty() {
        return Err(ImageError::Invalid(format!(
            "{} holds no files: not an image or a root filesystem",
            path.display()
        )));
    }
    from_rootfs(store, path, reference)
}

/// The file or decompressed stream of a tar that may be gzip-compressed.
pub fn reader(path: &Path) -> Result<Box<dyn Read>, ImageError> {
    let mut file = File::open(path).map_err(io_err("open", path))?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(io_err("read", path))?;
    let file = File::open(path).map_err(io_err("open", path))?;
    let buffered = BufReader::with_capacity(1 << 20, file);
    Ok(if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    })
}

/// The names at the top of a tar (first path component of each entry), or an error saying it
/// is not a tar.
fn top_level_names(path: &Path) -> Result<Vec<String>, ImageError> {
    let not_tar = |e: io::Error| {
        ImageError::Invalid(format!(
            "{} is not a tar archive (plain or gzip): {e}",
            path.display()
        ))
    };
    let mut archive = tar::Archive::new(reader(path)?);
    let mut names = Vec::new();
    for entry in archive.entries().map_err(not_tar)? {
        let entry = entry.map_err(not_tar)?;
        let p = entry.path().map_err(not_tar)?;
        let first = p.components().find_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        });
        if let Some(first) = first
            && !names.contains(&first)
        {
            names.push(first);
        }
    }
    Ok(names)
}

/// Copies blob `desc` of the layout at `src` in, checking its digest and size.
fn copy_blob(store: &Store, src: &Path, desc: &Descriptor) -> Result<Descriptor, ImageError> {
    let from = src.join("blobs").join(
        desc.digest
            .strip_prefix("sha256:")
            .map(|h| format!("sha256/{h}"))
            .ok_or_else(|| ImageError::Invalid(format!("blob '{}' is not sha256", desc.digest)))?,
    );
    copy_file(store, &from, &desc.media_type, Some(desc))
}

/// Copies the file `from` in as a blob of `media_type`; with `expect`, it must have that
/// digest and size.
fn copy_file(
    store: &Store,
    from: &Path,
    media_type: &str,
    expect: Option<&Descriptor>,
) -> Result<Descriptor, ImageError> {
    let mut file = File::open(from).map_err(io_err("open", from))?;
    let (desc, _) = store.put_with(media_type, |w| {
        io::copy(&mut file, w)
            .map(|_| ())
            .map_err(io_err("copy", from))
    })?;
    if let Some(e) = expect
        && (e.digest != desc.digest || e.size != desc.size)
    {
        return Err(ImageError::Corrupt(format!(
            "{} should be {} ({} bytes) but is {} ({} bytes)",
            from.display(),
            e.digest,
            e.size,
            desc.digest,
            desc.size
        )));
    }
    Ok(desc)
}

#[derive(Deserialize)]
struct LayoutIndex {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize)]
struct PlatformDescriptor {
    #[serde(flatten)]
    desc: Descriptor,
    platform: Option<Platform>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ImageError> {
    let bytes = fs::read(path).map_err(io_err("read", path))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ImageError::Invalid(format!("{}: {e}", path.display())))
}

fn blob_file(src: &Path, digest: &str) -> PathBuf {
    src.join("blobs")
        .join("sha256")
        .join(digest.strip_prefix("sha256:").unwrap_or(digest))
}

fn from_layout(
    store: &Store,
    src: &Path,
    reference: &str,
    pick: Option<&str>,
    format: &'static str,
) -> Result<Imported, ImageError> {
    let index: LayoutIndex = read_json(&src.join("index.json"))?;
    let names: Vec<&str> = index
        .manifests
        .iter()
        .filter_map(|m| m.annotations.get(REF_NAME).map(String::as_str))
        .collect();
    let chosen = match (pick, index.manifests.as_slice()) {
        (Some(name), list) => list
            .iter()
            .find(|m| m.annotations.get(REF_NAME).map(String::as_str) == Some(name))
            .ok_or_else(|| {
                ImageError::Invalid(format!(
                    "the layout has no image named '{name}' (it has: {})",
                    names.join(", ")
                ))
            })?,
        (None, [one]) => one,
        (None, []) => return Err(ImageError::Invalid("the layout holds no image".into())),
        (None, _) => {
            return Err(ImageError::Invalid(format!(
                "the layout holds {} images: say which (it has: {})",
                index.manifests.len(),
                names.join(", ")
            )));
        }
    };
    let mut desc = chosen.clone();
    // A multi-platform index: this machine's entry.
    if INDEX_TYPES.contains(&desc.media_type.as_str()) {
        let nested: Vec<PlatformDescriptor> = {
            #[derive(Deserialize)]
            struct Nested {
                manifests: Vec<PlatformDescriptor>,
            }
            read_json::<Nested>(&blob_file(src, &desc.digest))?.manifests
        };
        desc = nested
            .into_iter()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == oci_architecture())
            })
            .map(|m| m.desc)
            .ok_or_else(|| {
                ImageError::Invalid(format!(
                    "the image has no linux/{} variant",
                    oci_architecture()
                ))
            })?;
    }
    let manifest: Manifest = read_json(&blob_file(src, &desc.digest))?;
    let config = copy_blob(store, src, &manifest.config)?;
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for layer in &manifest.layers {
        layers.push(copy_blob(store, src, layer)?);
    }
    let config_json: serde_json::Value = serde_json::from_slice(&store.read_blob(&config.digest)?)
        .map_err(|e| ImageError::Invalid(format!("the image's config: {e}")))?;
    let tagged = store.tag(reference, &layers, &config_json)?;
    Ok(Imported {
        reference: reference.to_string(),
        manifest_digest: tagged.digest,
        layers: layers.len(),
        format,
    })
}

#[derive(Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

fn from_docker_save(
    store: &Store,
    src: &Path,
    reference: &str,
    pick: Option<&str>,
) -> Result<Imported, ImageError> {
    let entries: Vec<DockerEntry> = read_json(&src.join("manifest.json"))?;
    let tags = |e: &DockerEntry| e.repo_tags.clone().unwrap_or_default();
    let all: Vec<String> = entries.iter().flat_map(tags).collect();
    let entry = match (pick, entries.as_slice()) {
        (Some(name), list) => list
            .iter()
            .find(|e| tags(e).iter().any(|t| t == name))
            .ok_or_else(|| {
                ImageError::Invalid(format!(
                    "the archive has no image tagged '{name}' (it has: {})",
                    all.join(", ")
                ))
            })?,
        (None, [one]) => one,
        (None, []) => return Err(ImageError::Invalid("the archive holds no image".into())),
        (None, _) => {
            return Err(ImageError::Invalid(format!(
                "the archive holds {} images: say which (it has: {})",
                entries.len(),
                all.join(", ")
            )));
        }
    };
    let inside = |rel: &str| -> Result<PathBuf, ImageError> {
        if rel.starts_with('/') || rel.split('/').any(|p| p == "..") {
            return Err(ImageError::Invalid(format!(
                "manifest.json names '{rel}', outside the archive"
            )));
        }
        Ok(src.join(rel))
    };
    let mut layers = Vec::with_capacity(entry.layers.len());
    for rel in &entry.layers {
        let path = inside(rel)?;
        let media = if is_gzip(&path)? {
            LAYER_TAR_GZIP
        } else {
            LAYER_TAR
        };
        layers.push(copy_file(store, &path, media, None)?);
    }
    let mut config: serde_json::Value = read_json(&inside(&entry.config)?)?;
    // Docker's config is OCI's with more fields; the layers' ids follow what was stored.
    if let Some(obj) = config.as_object_mut() {
        obj.entry("os").or_insert_with(|| "linux".into());
        obj.entry("architecture")
            .or_insert_with(|| oci_architecture().into());
    }
    let tagged = store.tag(reference, &layers, &config)?;
    Ok(Imported {
        reference: reference.to_string(),
        manifest_digest: tagged.digest,
        layers: layers.len(),
        format: "docker-save",
    })
}

fn is_gzip(path: &Path) -> Result<bool, ImageError> {
    let mut magic = [0u8; 2];
    let mut f = File::open(path).map_err(io_err("open", path))?;
    let n = f.read(&mut magic).map_err(io_err("read", path))?;
    Ok(n == 2 && magic == [0x1f, 0x8b])
}

fn from_rootfs(store: &Store, path: &Path, reference: &str) -> Result<Imported, ImageError> {
    // Stored uncompressed: a layer is read at every unpacking, written once.
    let (layer, _) = store.put_with(LAYER_TAR, |w| {
        io::copy(&mut reader(path)?, w)
            .map(|_| ())
            .map_err(io_err("copy", path))
    })?;
    let config = serde_json::json!({
        "architecture": oci_architecture(),
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
    });
    let tagged = store.tag(reference, std::slice::from_ref(&layer), &config)?;
    Ok(Imported {
        reference: reference.to_string(),
        manifest_digest: tagged.digest,
        layers: 1,
        format: "rootfs",
    })
}

/// Writes image `reference`'s root filesystem into `dest` (its layers applied in order).
pub fn flatten(
    store: &Store,
    reference: &str,
    dest: &Path,
) -> Result<crate::LayerStats, ImageError> {
    let image = store
        .image(reference)?
        .ok_or_else(|| ImageError::Missing(reference.to_string()))?;
    flatten_layers(store, &image.manifest.layers, dest)
}

/// Writes the root filesystem that `layers` (lowest first) make into `dest`.
pub fn flatten_layers(
    store: &Store,
    layers: &[Descriptor],
    dest: &Path,
) -> Result<crate::LayerStats, ImageError> {
    fs::create_dir_all(dest).map_err(io_err("create", dest))?;
    let mut total = crate::LayerStats::default();
    for layer in layers {
        let known = [
            LAYER_TAR,
            LAYER_TAR_GZIP,
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
            "application/vnd.docker.image.rootfs.diff.tar",
        ];
        if !known.contains(&layer.media_type.as_str()) {
            return Err(ImageError::Invalid(format!(
                "layer {} is {}, which Sandcell cannot unpack (plain or gzip tar only)",
                layer.digest, layer.media_type
            )));
        }
        let stats = crate::layer::apply(&store.blob_path(&layer.digest)?, dest)?;
        total.entries += stats.entries;
        total.bytes += stats.bytes;
        total.whiteouts += stats.whiteouts;
    }
    Ok(total)
}
