//! Which host paths an import may read: only what lies inside one of the service's
//! `import.allowed_paths`, with every symlink resolved first (a link inside a root cannot
//! lead outside it) and `..` refused outright.

use std::path::{Component, Path, PathBuf};

use crate::{ServiceError, ServiceResult};

/// The host folders imports may read from, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPathPolicy {
    roots: Vec<PathBuf>,
    /// The setting that lists them, named in refusals.
    setting: &'static str,
    /// What the service does with them (`imports from`, `mounts from`).
    verb: &'static str,
}

impl HostPathPolicy {
    /// The policy of these allowed folders, resolved now (symlinks followed); a folder that
    /// does not exist allows nothing.
    pub fn new<P: AsRef<Path>>(allowed: &[P]) -> Self {
        Self::named(allowed, "import.allowed_paths", "imports from")
    }

    /// The policy of the folders setting `setting` lists, for a use its refusals call
    /// `verb` ("mounts from").
    pub fn named<P: AsRef<Path>>(allowed: &[P], setting: &'static str, verb: &'static str) -> Self {
        Self {
            roots: allowed
                .iter()
                .filter_map(|p| std::fs::canonicalize(p).ok())
                .collect(),
            setting,
            verb,
        }
    }

    /// Resolves `raw` and checks it lies inside an allowed folder: the resolved path, or
    /// permission denied (outside, relative, with `..`, or no folder allowed at all), or not
    /// found (inside an allowed folder, but missing).
    pub fn resolve(&self, raw: &str) -> ServiceResult<PathBuf> {
        let denied = || {
            ServiceError::forbidden(format!(
                "'{raw}' is not inside a host folder this service {} ({})",
                self.verb, self.setting
            ))
            .with_details(serde_json::json!({"host_path": raw}))
        };
        let path = Path::new(raw);
        if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
            return Err(denied());
        }
        if self.roots.is_empty() {
            return Err(ServiceError::forbidden(format!(
                "this service {} no host folder (set {})",
                self.verb, self.setting
            )));
        }
        let resolved = std::fs::canonicalize(path).map_err(|_| {
            if self.roots.iter().any(|r| path.starts_with(r)) {
                ServiceError::not_found("host path", raw)
            } else {
                denied()
            }
        })?;
        if self.roots.iter().any(|r| resolved.starts_with(r)) {
            Ok(resolved)
        } else {
            Err(denied())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn kind(r: ServiceResult<PathBuf>) -> Option<ErrorKind> {
        r.err().map(|e| e.kind)
    }

    #[test]
    fn only_paths_inside_an_allowed_folder_resolve() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("allowed");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("data/a.txt"), "a").unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
        std::os::unix::fs::symlink(root.join("data"), root.join("inner")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let policy = HostPathPolicy::new(&[&root]);
        let at = |p: &str| format!("{}/{p}", root.display());

        assert_eq!(
            policy.resolve(&at("data/a.txt")).unwrap(),
            root.join("data/a.txt")
        );
        assert_eq!(policy.resolve(&at("inner")).unwrap(), root.join("data"));
        // A link inside the root that leads out of it.
        assert_eq!(
            kind(policy.resolve(&at("escape/secret"))),
            Some(ErrorKind::PermissionDenied)
        );
        // `..`, relative paths and paths elsewhere.
        assert_eq!(
            kind(policy.resolve(&at("data/../data/a.txt"))),
            Some(ErrorKind::PermissionDenied)
        );
        assert_eq!(
            kind(policy.resolve("data/a.txt")),
            Some(ErrorKind::PermissionDenied)
        );
        let e = policy
            .resolve(&format!("{}/secret", outside.display()))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        assert_eq!(
            e.details["host_path"],
            format!("{}/secret", outside.display())
        );
        // Missing inside the root: not found; missing outside: still denied.
        assert_eq!(kind(policy.resolve(&at("nope"))), Some(ErrorKind::NotFound));
        assert_eq!(
            kind(policy.resolve("/nonexistent/x")),
            Some(ErrorKind::PermissionDenied)
        );
    }

    #[test]
    fn no_allowed_folder_allows_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let none: [&Path; 0] = [];
        let e = HostPathPolicy::new(&none)
            .resolve(&tmp.path().display().to_string())
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        assert!(e.message.contains("import.allowed_paths"), "{}", e.message);
        // A configured folder that does not exist is no root.
        let missing = HostPathPolicy::new(&[tmp.path().join("missing")]);
        assert_eq!(
            kind(missing.resolve(&tmp.path().display().to_string())),
            Some(ErrorKind::PermissionDenied)
        );
    }
}
