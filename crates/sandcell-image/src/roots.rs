//! Root filesystems unpacked from layers: `<store>/roots/<chain id>`, where the chain id is a
//! digest of the layers' digests in order. Each is written once (into a folder beside it,
//! renamed into place, so a root that exists is whole) and then bound read-only as the system
//! of every sandbox made from an image with those layers, or used as the lowest layer of a
//! build.

use std::fs;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::{Descriptor, ImageError, Store};

/// The chain id of `layers` (lowest first): what names their unpacked root.
pub fn chain_id(layers: &[Descriptor]) -> String {
    let mut h = Sha256::new();
    for layer in layers {
        h.update(layer.digest.as_bytes());
        h.update(b"\n");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The unpacked root of image `name`, unpacked now when it is not yet.
pub fn unpacked_root(store: &Store, name: &str) -> Result<PathBuf, ImageError> {
    let image = store
        .lookup(name)?
        .ok_or_else(|| ImageError::Missing(name.to_string()))?;
    let root = unpacked_layers(store, &image.manifest.layers)?;
    if !root.join("usr").is_dir() {
        return Err(ImageError::Invalid(format!(
            "image '{name}' has no /usr: it is not a system a sandbox can run on"
        )));
    }
    Ok(root)
}

/// The root that `layers` (lowest first) make, unpacked now when it is not yet.
pub fn unpacked_layers(store: &Store, layers: &[Descriptor]) -> Result<PathBuf, ImageError> {
    let hex = chain_id(layers);
    let roots = store.root().join("roots");
    let root = roots.join(&hex);
    if root.is_dir() {
        return Ok(root);
    }
    fs::create_dir_all(&roots).map_err(|source| ImageError::Io {
        op: format!("create {}", roots.display()),
        source,
    })?;
    let tmp = roots.join(format!(".{hex}.{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    if let Err(e) = crate::import::flatten_layers(store, layers, &tmp) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    match fs::rename(&tmp, &root) {
        Ok(()) => Ok(root),
        // Another process unpacked it first.
        Err(_) if root.is_dir() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(root)
        }
        Err(source) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(ImageError::Io {
                op: format!("rename {} into place", tmp.display()),
                source,
            })
        }
    }
}
