//! Images unpacked for sandboxes: `<store>/roots/<manifest digest>`, each written once (into
//! a folder beside it, renamed into place, so a root that exists is whole) and then bound
//! read-only as the system of every sandbox made from that image.

use std::fs;
use std::path::PathBuf;

use crate::{ImageError, Store};

/// The unpacked root of image `name`, unpacked now when it is not yet.
pub fn unpacked_root(store: &Store, name: &str) -> Result<PathBuf, ImageError> {
    let image = store
        .image(name)?
        .ok_or_else(|| ImageError::Missing(name.to_string()))?;
    let hex = image
        .manifest_digest
        .strip_prefix("sha256:")
        .unwrap_or(&image.manifest_digest)
        .to_string();
    let roots = store.root().join("roots");
    let root = roots.join(&hex);
    if root.join("usr").is_dir() {
        return Ok(root);
    }
    fs::create_dir_all(&roots).map_err(|source| ImageError::Io {
        op: format!("create {}", roots.display()),
        source,
    })?;
    let tmp = roots.join(format!(".{hex}.{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let unpacked = crate::import::flatten(store, name, &tmp).and_then(|_| {
        if tmp.join("usr").is_dir() {
            Ok(())
        } else {
            Err(ImageError::Invalid(format!(
                "image '{name}' has no /usr: it is not a system a sandbox can run on"
            )))
        }
    });
    if let Err(e) = unpacked {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    match fs::rename(&tmp, &root) {
        Ok(()) => Ok(root),
        // Another process unpacked it first.
        Err(_) if root.join("usr").is_dir() => {
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
