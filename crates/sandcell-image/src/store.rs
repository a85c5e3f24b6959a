//! The image store: an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`) that
//! standard tools (umoci, skopeo) read, plus a cache of built layers by step key
//! (`cache/<key>`, outside the layout proper).
//!
//! Blobs are written to a temporary file, hashed as they are written, and renamed into place:
//! a crash leaves no half blob under its digest. `index.json` is replaced the same way, under
//! an exclusive lock of `.lock` (the daemon and a CLI command may share a store).

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ImageError;

/// Media type of an uncompressed layer.
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// Media type of an image configuration.
pub const CONFIG_JSON: &str = "application/vnd.oci.image.config.v1+json";
/// Media type of a manifest.
pub const MANIFEST_JSON: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of the index.
const INDEX_JSON: &str = "application/vnd.oci.image.index.v1+json";
/// The annotation that names an image in the index.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A blob, as manifests and the index point at it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    /// What it is.
    #[serde(rename = "mediaType")]
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Annotations (the index's carry the image's name).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Index {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

/// An image's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always 2.
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    /// [`MANIFEST_JSON`].
    #[serde(rename = "mediaType", default)]
    pub media_type: Option<String>,
    /// Its configuration blob.
    pub config: Descriptor,
    /// Its layers, lowest first.
    pub layers: Vec<Descriptor>,
}

/// An image found by name.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    /// Its name in the index.
    pub reference: String,
    /// Its manifest's descriptor.
    pub manifest_digest: String,
    /// The manifest.
    pub manifest: Manifest,
    /// The configuration (OCI image config JSON).
    pub config: serde_json::Value,
}

/// What a garbage collection removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collected {
    /// Blobs removed.
    pub blobs: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Cache entries dropped (their layer was gone, or the cache was not kept).
    pub cache_entries: u64,
    /// Unpacked roots removed (their image is gone and no sandbox uses them).
    pub roots: u64,
    /// Unpacked roots of removed images kept because a sandbox still has them mounted.
    pub roots_in_use: u64,
}

/// An OCI image layout on disk.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

fn io_err(op: impl Into<String>, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
    let op = op.into();
    let path = path.to_path_buf();
    move |source| ImageError::Io {
        op: format!("{op} {}", path.display()),
        source,
    }
}

impl Store {
    /// Opens (making it when missing) the layout at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ImageError> {
        let root = root.into();
        let blobs = root.join("blobs").join("sha256");
        fs::create_dir_all(&blobs).map_err(io_err("create", &blobs))?;
        fs::create_dir_all(root.join("cache")).map_err(io_err("create", &root))?;
        fs::create_dir_all(root.join("tmp")).map_err(io_err("create", &root))?;
        let layout = root.join("oci-layout");
        if !layout.exists() {
            write_atomically(&layout, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        }
        let store = Self { root };
        if !store.index_path().exists() {
            store.write_index(&Index {
                schema_version: 2,
                media_type: Some(INDEX_JSON.into()),
                manifests: Vec::new(),
            })?;
        }
        Ok(store)
    }

    /// Where the layout is.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// An exclusive lock on the store's index and cache, held until the file is dropped.
    fn lock(&self) -> Result<File, ImageError> {
        self.lock_file(".lock")
    }

    /// An exclusive lock for one long job on the store (making a base, say) that the index's
    /// lock must not be held for; `purpose` names it (letters, digits, `-`).
    pub fn job_lock(&self, purpose: &str) -> Result<File, ImageError> {
        if purpose.is_empty()
            || !purpose
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(ImageError::Invalid(format!(
                "'{purpose}' cannot name a lock"
            )));
        }
        self.lock_file(&format!(".lock-{purpose}"))
    }

    fn lock_file(&self, name: &str) -> Result<File, ImageError> {
        let path = self.root.join(name);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err("open", &path))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io_err("lock", &path)(e.into()))?;
        Ok(file)
    }

    fn index_path(&self) -> PathBuf {
        self.root.join("index.json")
    }

    /// The file of blob `digest` (`sha256:<hex>`).
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| ImageError::Invalid(format!("'{digest}' is not a sha256 digest")))?;
        Ok(self.root.join("blobs").join("sha256").join(hex))
    }

    /// A new temporary folder inside the store, for a program's own scratch files (its
    /// `TMPDIR`): on the store's file system, not in a `/tmp` that may be small.
    pub fn temp_dir(&self) -> Result<PathBuf, ImageError> {
        let dir = self.root.join("tmp");
        for n in 0u32.. {
            let path = dir.join(format!("{}-d{n}", std::process::id()));
            match fs::create_dir(&path) {
                Ok(()) => return Ok(path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create", &path)(e)),
            }
        }
        Err(ImageError::Invalid("no temporary folder name left".into()))
    }

    /// A new temporary file inside the store (same file system as the blobs).
    pub fn temp_file(&self) -> Result<(PathBuf, File), ImageError> {
        let dir = self.root.join("tmp");
        for n in 0u32.. {
            let path = dir.join(format!("{}-{n}", std::process::id()));
            match fs::OpenOptions::new()
                .write(true)
                .read(true)
                .create_new(true)
                .open(&path)
            {
                Ok(f) => return Ok((path, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create", &path)(e)),
            }
        }
        Err(ImageError::Invalid("no temporary file name left".into()))
    }

    /// Stores `bytes` as a blob.
    pub fn put_bytes(&self, bytes: &[u8], media_type: &str) -> Result<Descriptor, ImageError> {
        let (tmp, mut file) = self.temp_file()?;
        file.write_all(bytes).map_err(io_err("write", &tmp))?;
        drop(file);
        self.adopt(&tmp, media_type)
    }

    /// Writes a blob through `write` (given a writer that hashes), then stores it.
    pub fn put_with<T>(
        &self,
        media_type: &str,
        write: impl FnOnce(&mut dyn Write) -> Result<T, ImageError>,
    ) -> Result<(Descriptor, T), ImageError> {
        let (tmp, file) = self.temp_file()?;
        let mut hashing = Hashing::new(io::BufWriter::with_capacity(1 << 20, file));
        let made = write(&mut hashing).and_then(|t| {
            hashing.flush().map_err(io_err("write", &tmp))?;
            Ok(t)
        });
        let made = match made {
            Ok(t) => t,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let (sha256, size) = hashing.sum();
        let desc = Descriptor {
            media_type: media_type.to_string(),
            digest: format!("sha256:{sha256}"),
            size,
            annotations: Default::default(),
        };
        self.place(&tmp, &desc)?;
        Ok((desc, made))
    }

    /// Moves the file `tmp` (inside the store) in as a blob, hashing it.
    fn adopt(&self, tmp: &Path, media_type: &str) -> Result<Descriptor, ImageError> {
        let mut file = File::open(tmp).map_err(io_err("open", tmp))?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut size = 0u64;
        loop {
            let n = file.read(&mut buf).map_err(io_err("read", tmp))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            size += n as u64;
        }
        let desc = Descriptor {
            media_type: media_type.to_string(),
            digest: format!("sha256:{}", hex(&hash.finalize())),
            size,
            annotations: Default::default(),
        };
        self.place(tmp, &desc)?;
        Ok(desc)
    }

    fn place(&self, tmp: &Path, desc: &Descriptor) -> Result<(), ImageError> {
        let path = self.blob_path(&desc.digest)?;
        if path.exists() {
            // The same bytes are there already.
            let _ = fs::remove_file(tmp);
            return Ok(());
        }
        fs::rename(tmp, &path).map_err(io_err("rename into", &path))
    }

    /// Reads a blob, checking its digest.
    pub fn read_blob(&self, digest: &str) -> Result<Vec<u8>, ImageError> {
        let path = self.blob_path(digest)?;
        let bytes = fs::read(&path).map_err(io_err("read", &path))?;
        let got = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
        if got != digest {
            return Err(ImageError::Corrupt(format!(
                "blob {digest} holds {got}: the store was changed outside Sandcell"
            )));
        }
        Ok(bytes)
    }

    /// Names an image made of `layers` (lowest first) and `config` (an OCI image config):
    /// writes the config and the manifest, and points `reference` at them (replacing what it
    /// named before).
    pub fn tag(
        &self,
        reference: &str,
        layers: &[Descriptor],
        config: &serde_json::Value,
    ) -> Result<Descriptor, ImageError> {
        for layer in layers {
            if !self.blob_path(&layer.digest)?.exists() {
                return Err(ImageError::Invalid(format!(
                    "layer {} is not in the store",
                    layer.digest
                )));
            }
        }
        let config_bytes = serde_json::to_vec(config)
            .map_err(|e| ImageError::Invalid(format!("the image's config: {e}")))?;
        let config = self.put_bytes(&config_bytes, CONFIG_JSON)?;
        let manifest = Manifest {
            schema_version: 2,
            media_type: Some(MANIFEST_JSON.into()),
            config,
            layers: layers.to_vec(),
        };
        let manifest_bytes = serde_json::to_vec(&manifest)
            .map_err(|e| ImageError::Invalid(format!("the manifest: {e}")))?;
        let mut desc = self.put_bytes(&manifest_bytes, MANIFEST_JSON)?;
        desc.annotations
            .insert(REF_NAME.to_string(), reference.to_string());
        let _guard = self.lock()?;
        let mut index = self.read_index()?;
        index
            .manifests
            .retain(|m| m.annotations.get(REF_NAME).map(String::as_str) != Some(reference));
        index.manifests.push(desc.clone());
        self.write_index(&index)?;
        Ok(desc)
    }

    /// The image a user means by `name`: `name` itself, or `name:latest` when `name` has no
    /// tag.
    pub fn lookup(&self, name: &str) -> Result<Option<Image>, ImageError> {
        if let Some(image) = self.image(name)? {
            return Ok(Some(image));
        }
        if name.contains(':') {
            return Ok(None);
        }
        self.image(&format!("{name}:latest"))
    }

    /// The image named `reference`, if there is one.
    pub fn image(&self, reference: &str) -> Result<Option<Image>, ImageError> {
        let index = self.read_index()?;
        let Some(desc) = index
            .manifests
            .iter()
            .find(|m| m.annotations.get(REF_NAME).map(String::as_str) == Some(reference))
        else {
            return Ok(None);
        };
        let manifest: Manifest = serde_json::from_slice(&self.read_blob(&desc.digest)?)
            .map_err(|e| ImageError::Corrupt(format!("manifest {}: {e}", desc.digest)))?;
        let config = serde_json::from_slice(&self.read_blob(&manifest.config.digest)?)
            .map_err(|e| ImageError::Corrupt(format!("config {}: {e}", manifest.config.digest)))?;
        Ok(Some(Image {
            reference: reference.to_string(),
            manifest_digest: desc.digest.clone(),
            manifest,
            config,
        }))
    }

    /// Every image's name, in the order they were named.
    pub fn references(&self) -> Result<Vec<String>, ImageError> {
        Ok(self
            .read_index()?
            .manifests
            .iter()
            .filter_map(|m| m.annotations.get(REF_NAME).cloned())
            .collect())
    }

    /// Removes the name `reference` (its blobs stay until [`Self::collect_garbage`]); whether
    /// there was one.
    pub fn untag(&self, reference: &str) -> Result<bool, ImageError> {
        let _guard = self.lock()?;
        let mut index = self.read_index()?;
        let before = index.manifests.len();
        index
            .manifests
            .retain(|m| m.annotations.get(REF_NAME).map(String::as_str) != Some(reference));
        if index.manifests.len() == before {
            return Ok(false);
        }
        self.write_index(&index)?;
        Ok(true)
    }

    /// The layer a build step with cache key `key` made before, if its blob is still here.
    pub fn cached_layer(&self, key: &str) -> Result<Option<Descriptor>, ImageError> {
        let path = self.cache_path(key)?;
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        let Ok(desc) = serde_json::from_slice::<Descriptor>(&text) else {
            return Ok(None);
        };
        Ok(self.blob_path(&desc.digest)?.exists().then_some(desc))
    }

    /// Remembers that the step with cache key `key` made `layer`.
    pub fn remember_layer(&self, key: &str, layer: &Descriptor) -> Result<(), ImageError> {
        let path = self.cache_path(key)?;
        let bytes = serde_json::to_vec(layer)
            .map_err(|e| ImageError::Invalid(format!("a cache entry: {e}")))?;
        write_atomically(&path, &bytes)
    }

    fn cache_path(&self, key: &str) -> Result<PathBuf, ImageError> {
        if key.is_empty() || key.len() > 128 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ImageError::Invalid(format!("'{key}' is not a cache key")));
        }
        Ok(self.root.join("cache").join(key))
    }

    /// Removes every blob no named image uses (and, unless `keep_cache`, the layer cache
    /// with it; cache entries whose layer is gone always go), and leftover temporary files.
    pub fn collect_garbage(&self, keep_cache: bool) -> Result<Collected, ImageError> {
        let _guard = self.lock()?;
        let mut live = BTreeSet::new();
        for desc in self.read_index()?.manifests {
            live.insert(desc.digest.clone());
            let manifest: Manifest = serde_json::from_slice(&self.read_blob(&desc.digest)?)
                .map_err(|e| ImageError::Corrupt(format!("manifest {}: {e}", desc.digest)))?;
            live.insert(manifest.config.digest);
            // Its unpacked root, by chain id.
            live.insert(format!(
                "sha256:{}",
                crate::roots::chain_id(&manifest.layers)
            ));
            live.extend(manifest.layers.into_iter().map(|l| l.digest));
        }
        let mut out = Collected::default();
        let cache_dir = self.root.join("cache");
        for entry in fs::read_dir(&cache_dir).map_err(io_err("list", &cache_dir))? {
            let entry = entry.map_err(io_err("list", &cache_dir))?;
            let desc = fs::read(entry.path())
                .ok()
                .and_then(|b| serde_json::from_slice::<Descriptor>(&b).ok());
            let keep = keep_cache
                && desc.as_ref().is_some_and(|d| {
                    self.blob_path(&d.digest)
                        .map(|p| p.exists())
                        .unwrap_or(false)
                });
            match (keep, desc) {
                (true, Some(d)) => {
                    live.insert(d.digest);
                }
                _ => {
                    fs::remove_file(entry.path()).map_err(io_err("remove", &entry.path()))?;
                    out.cache_entries += 1;
                }
            }
        }
        let blobs = self.root.join("blobs").join("sha256");
        for entry in fs::read_dir(&blobs).map_err(io_err("list", &blobs))? {
            let entry = entry.map_err(io_err("list", &blobs))?;
            let digest = format!("sha256:{}", entry.file_name().to_string_lossy());
            if !live.contains(&digest) {
                let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                fs::remove_file(entry.path()).map_err(io_err("remove", &entry.path()))?;
                out.blobs += 1;
                out.bytes += size;
            }
        }
        // Unpacked roots of images no name points at, unless a sandbox still has one mounted
        // (deleting its files would pull them from under it).
        let roots = self.root.join("roots");
        let dead: Vec<(String, PathBuf)> = fs::read_dir(&roots)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                    .filter(|(name, _)| {
                        !name.starts_with('.') && !live.contains(&format!("sha256:{name}"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        if !dead.is_empty() {
            // A mount's root is given within its own file system, whose mount point may be
            // anywhere: the digest in the path is what identifies an unpacked root.
            let uses = |name: &str, m: &Mount| {
                m.root.contains(&format!("/roots/{name}/"))
                    || m.root.ends_with(&format!("/roots/{name}"))
            };
            // This namespace's binds of them are root skeletons', mounted ahead for later
            // sandboxes: detached (sandboxes hold copies of their own). The other mount
            // tables are read after: a process whose namespace link cannot be read (pid 1,
            // as some hosts run it) may share this one.
            for m in own_mounts() {
                if dead.iter().any(|(name, _)| uses(name, &m)) {
                    let _ = rustix::mount::unmount(
                        m.point.as_str(),
                        rustix::mount::UnmountFlags::DETACH,
                    );
                }
            }
            let others = other_mounts();
            for (name, path) in &dead {
                if others.iter().any(|m| uses(name, m)) {
                    out.roots_in_use += 1;
                    continue;
                }
                fs::remove_dir_all(path).map_err(io_err("remove", path))?;
                out.roots += 1;
            }
        }
        // Temporary files and folders are in use, under no lock, while the process that made
        // them (their name's prefix) lives: leave those; a dead process's are leftovers.
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(io_err("list", &tmp))?.flatten() {
            let name = entry.file_name();
            let owner = name.to_string_lossy();
            let pid = owner.split('-').next().unwrap_or_default();
            if !pid.is_empty() && Path::new("/proc").join(pid).exists() {
                continue;
            }
            let path = entry.path();
            let _ = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
        }
        Ok(out)
    }

    fn read_index(&self) -> Result<Index, ImageError> {
        let path = self.index_path();
        let bytes = fs::read(&path).map_err(io_err("read", &path))?;
        serde_json::from_slice(&bytes).map_err(|e| ImageError::Corrupt(format!("index.json: {e}")))
    }

    fn write_index(&self, index: &Index) -> Result<(), ImageError> {
        let bytes = serde_json::to_vec(index)
            .map_err(|e| ImageError::Invalid(format!("index.json: {e}")))?;
        write_atomically(&self.index_path(), &bytes)
    }
}

/// One mount, as `mountinfo` gives it.
struct Mount {
    /// Its root within its file system.
    root: String,
    /// Where it is mounted.
    point: String,
}

/// Mount table lines as `mountinfo` gives them.
fn parse_mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let root = fields.nth(3)?.to_string();
            let point = fields.next()?.to_string();
            Some(Mount { root, point })
        })
        .collect()
}

/// The mounts of this process's namespace.
fn own_mounts() -> Vec<Mount> {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mounts(&t))
        .unwrap_or_default()
}

/// The mounts of every other mount namespace, each read once through one of its processes.
fn other_mounts() -> Vec<Mount> {
    let mut seen = std::collections::BTreeSet::new();
    if let Ok(ns) = fs::read_link("/proc/self/ns/mnt") {
        seen.insert(ns);
    }
    let mut others = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return others;
    };
    for p in procs.flatten() {
        if !p
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        // A namespace read already is skipped; one whose link cannot be read is read.
        if let Ok(ns) = fs::read_link(p.path().join("ns/mnt"))
            && !seen.insert(ns)
        {
            continue;
        }
        if let Ok(text) = fs::read_to_string(p.path().join("mountinfo")) {
            others.extend(parse_mounts(&text));
        }
    }
    others
}

/// Writes `path` through a temporary file beside it and a rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, path).map_err(io_err("rename into", path))
}

/// A writer that hashes (SHA-256) and counts what goes through it.
pub struct Hashing<W> {
    inner: W,
    hash: Sha256,
    size: u64,
}

impl<W> Hashing<W> {
    /// Hashes what is written to `inner`.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hash: Sha256::new(),
            size: 0,
        }
    }

    /// The hex SHA-256 and the byte count of what went through (flush first).
    pub fn sum(&self) -> (String, u64) {
        (hex(&self.hash.clone().finalize()), self.size)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The architecture name OCI uses for this machine.
pub fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_content_addressed_and_checked_when_read() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path()).expect("open");
        let a = store.put_bytes(b"hello", LAYER_TAR).expect("put");
        assert_eq!(
            a.digest,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(a.size, 5);
        let b = store.put_bytes(b"hello", LAYER_TAR).expect("again");
        assert_eq!(a, b);
        assert_eq!(store.read_blob(&a.digest).expect("read"), b"hello");
        fs::write(store.blob_path(&a.digest).expect("path"), b"changed").expect("tamper");
        assert!(matches!(
            store.read_blob(&a.digest),
            Err(ImageError::Corrupt(_))
        ));
        assert!(store.blob_path("sha256:../../etc").is_err());
        let (streamed, n) = store
            .put_with(LAYER_TAR, |w| {
                w.write_all(b"streamed").map_err(|e| ImageError::Io {
                    op: "test".into(),
                    source: e,
                })?;
                Ok(8)
            })
            .expect("streamed");
        assert_eq!((streamed.size, n), (8, 8));
        assert!(
            fs::read_dir(dir.path().join("tmp"))
                .expect("tmp")
                .next()
                .is_none()
        );
    }

    #[test]
    fn tags_caches_and_garbage_collection() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path()).expect("open");
        let l1 = store.put_bytes(b"layer one", LAYER_TAR).expect("l1");
        let l2 = store.put_bytes(b"layer two", LAYER_TAR).expect("l2");
        let orphan = store.put_bytes(b"nobody's", LAYER_TAR).expect("orphan");
        let config = serde_json::json!({"architecture": oci_architecture(), "os": "linux"});
        store
            .tag("base", std::slice::from_ref(&l1), &config)
            .expect("tag base");
        store
            .tag("app:v1", &[l1.clone(), l2.clone()], &config)
            .expect("tag app");
        let app = store.image("app:v1").expect("read").expect("found");
        assert_eq!(app.manifest.layers, vec![l1.clone(), l2.clone()]);
        assert_eq!(app.config["os"], "linux");
        assert_eq!(store.references().expect("refs"), vec!["base", "app:v1"]);
        // Tagging again replaces.
        store
            .tag("base", std::slice::from_ref(&l2), &config)
            .expect("retag");
        assert_eq!(store.references().expect("refs"), vec!["app:v1", "base"]);
        store.remember_layer("ab12", &orphan).expect("cache");
        assert_eq!(
            store.cached_layer("ab12").expect("hit"),
            Some(orphan.clone())
        );
        assert_eq!(store.cached_layer("cd34").expect("miss"), None);
        assert!(store.remember_layer("../x", &orphan).is_err());
        // Kept by the cache, then not.
        let kept = store.collect_garbage(true).expect("gc");
        assert_eq!(kept.blobs, 1, "the old manifest of 'base' only: {kept:?}");
        assert!(store.blob_path(&orphan.digest).expect("p").exists());
        assert!(store.untag("app:v1").expect("untag"));
        assert!(!store.untag("app:v1").expect("again"));
        let dropped = store.collect_garbage(false).expect("gc");
        assert_eq!(dropped.cache_entries, 1);
        assert!(!store.blob_path(&orphan.digest).expect("p").exists());
        assert!(!store.blob_path(&l1.digest).expect("p").exists());
        assert!(
            store.blob_path(&l2.digest).expect("p").exists(),
            "base still uses it"
        );
        assert!(store.image("base").expect("read").is_some());
        assert!(
            store.tag("x", &[orphan], &config).is_err(),
            "a layer not stored"
        );
    }

    #[test]
    fn garbage_collection_leaves_a_live_process_scratch_and_drops_a_dead_ones() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path()).expect("open");
        let (live_file, _f) = store.temp_file().expect("file");
        let live_dir = store.temp_dir().expect("dir");
        std::fs::write(live_dir.join("inside"), b"x").expect("write");
        // No process has a pid this high (the kernel's limit is 2^22).
        let dead_file = dir.path().join("tmp").join("999999999-0");
        let dead_dir = dir.path().join("tmp").join("999999999-d0");
        std::fs::write(&dead_file, b"x").expect("write");
        std::fs::create_dir_all(dead_dir.join("sub")).expect("mkdir");
        store.collect_garbage(true).expect("gc");
        assert!(live_file.exists() && live_dir.join("inside").exists());
        assert!(!dead_file.exists() && !dead_dir.exists());
        let _one = store.job_lock("debian-bookworm").expect("lock");
        assert!(store.job_lock("../x").is_err());
        assert!(store.job_lock("").is_err());
    }
}
