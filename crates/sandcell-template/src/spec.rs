//! The template file (`sandcell.toml` beside a Dockerfile, or on its own): how a template is
//! built and what the sandboxes made from it start with.
//!
//! ```toml
//! name = "python-data-analysis"
//! dockerfile = "Dockerfile"          # relative to the file; or `dockerfile_inline = "..."`
//! build_args = { PY = "3.11" }
//! build_network = { allow = ["deb.example.org"] }   # what RUN steps reach (default: the
//!                                                   # operator's package registries)
//!
//! [sandbox]                           # defaults of each sandbox made from it
//! kernels = ["python"]
//! network = "off"
//! env = { MPLBACKEND = "Agg" }
//! workdir = "/workspace"
//! limits = { memory_mb = 1024, cpus = 1.0 }
//! backend = "gvisor"                 # default: the daemon's (process)
//!
//! [warm]
//! strategy = "pool"                   # cold | pool | snapshot | singleton
//! size = 2
//! warmup = "import pandas"            # run in the kernel of each pool sandbox
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A template file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateFile {
    /// The template's name (`[a-z0-9][a-z0-9._-]*`, at most 64), optionally `name:tag`.
    pub name: Option<String>,
    /// The Dockerfile, relative to the template file.
    pub dockerfile: Option<String>,
    /// The Dockerfile itself.
    pub dockerfile_inline: Option<String>,
    /// Build arguments (`ARG`).
    #[serde(default)]
    pub build_args: BTreeMap<String, String>,
    /// What the build's `RUN` steps reach, as a network policy (default: the package
    /// registries the operator configured).
    pub build_network: Option<serde_json::Value>,
    /// Defaults of the sandboxes made from it.
    #[serde(default)]
    pub sandbox: SandboxDefaults,
    /// How its sandboxes are kept ready.
    #[serde(default)]
    pub warm: WarmStrategy,
}

/// What a sandbox made from a template starts with, unless its create request says otherwise.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxDefaults {
    /// Kernels it claims (checked by the build's smoke test) and starts warm.
    #[serde(default)]
    pub kernels: Vec<String>,
    /// Its network policy (the create request's shape: `"off"`, `{"allow": [...]}`, …).
    pub network: Option<serde_json::Value>,
    /// Environment variables (over the image's `ENV`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (over the image's `WORKDIR`).
    pub workdir: Option<String>,
    /// Limits (the create request's `limits` shape).
    pub limits: Option<serde_json::Value>,
    /// The isolation backend (`process`, `gvisor`; a create naming another still may).
    pub backend: Option<String>,
}

/// How a template's sandboxes are kept ready.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "strategy", rename_all = "snake_case", deny_unknown_fields)]
pub enum WarmStrategy {
    /// Each sandbox is made when asked for.
    #[default]
    Cold,
    /// `size` sandboxes wait ready, each having run `warmup` in its kernel.
    Pool {
        /// How many wait.
        size: u32,
        /// Code run in the first kernel of each before it waits (imports, a model load).
        #[serde(default)]
        warmup: Option<String>,
    },
    /// A snapshot of a warmed sandbox is kept, and `size` are restored from it ahead (on a
    /// backend that checkpoints whole sandboxes, gVisor; elsewhere a `pool`).
    Snapshot {
        /// How many wait restored.
        size: u32,
        /// Code run before the snapshot is taken.
        #[serde(default)]
        warmup: Option<String>,
    },
    /// One sandbox, shared by every caller that asks for the template.
    Singleton,
}

/// Why a template file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Not TOML, or not this shape (the parser's message names the line and key).
    #[error("the template file: {0}")]
    Toml(String),
    /// A field's value is wrong.
    #[error("the template file: {0}")]
    Invalid(String),
}

/// Most sandboxes a pool may keep.
pub const MAX_POOL: u32 = 64;

impl TemplateFile {
    /// Reads and checks a template file.
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let file: Self = toml::from_str(text).map_err(|e| SpecError::Toml(e.to_string()))?;
        file.check()?;
        Ok(file)
    }

    /// Checks every field.
    pub fn check(&self) -> Result<(), SpecError> {
        let bad = |m: String| Err(SpecError::Invalid(m));
        if let Some(name) = &self.name {
            check_reference(name).map_err(SpecError::Invalid)?;
        }
        if self.dockerfile.is_some() && self.dockerfile_inline.is_some() {
            return bad("give 'dockerfile' or 'dockerfile_inline', not both".into());
        }
        if let Some(path) = &self.dockerfile
            && (path.starts_with('/') || path.split('/').any(|p| p == ".."))
        {
            return bad(format!(
                "dockerfile '{path}' must be inside the build context (relative, no '..')"
            ));
        }
        match &self.warm {
            WarmStrategy::Pool { size, .. } | WarmStrategy::Snapshot { size, .. }
                if *size == 0 || *size > MAX_POOL =>
            {
                return bad(format!("warm.size must be 1 to {MAX_POOL}, got {size}"));
            }
            _ => {}
        }
        if let Some(w) = &self.sandbox.workdir
            && !w.starts_with('/')
        {
            return bad(format!("sandbox.workdir '{w}' must be absolute"));
        }
        // Which backends exist is the service's to say (a create of the template names an
        // unknown one with the list); here only the shape of a name.
        if let Some(b) = &self.sandbox.backend
            && (b.is_empty() || !b.bytes().all(|c| c.is_ascii_lowercase()))
        {
            return bad(format!("sandbox.backend '{b}' is not a backend name"));
        }
        Ok(())
    }
}

/// Checks a template reference: `name` or `name:tag`, each `[a-z0-9][a-z0-9._-]*`, the name
/// at most 64 bytes and the tag at most 32.
pub fn check_reference(reference: &str) -> Result<(), String> {
    let (name, tag) = match reference.split_once(':') {
        Some((n, t)) => (n, Some(t)),
        None => (reference, None),
    };
    let part_ok = |p: &str, max: usize| {
        !p.is_empty()
            && p.len() <= max
            && p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    if !part_ok(name, 64) || tag.is_some_and(|t| !part_ok(t, 32)) {
        return Err(format!(
            "'{reference}' is not a template or image name: name[:tag], lower-case letters, digits, '.', '_', '-' (name at most 64, tag at most 32)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_reads_back() {
        let file = TemplateFile::parse(
            r#"
name = "python-data-analysis:v1"
dockerfile = "docker/Dockerfile"
build_args = { PY = "3.11" }
build_network = { allow = ["deb.test"] }

[sandbox]
kernels = ["python"]
network = "off"
env = { MPLBACKEND = "Agg" }
workdir = "/workspace"
limits = { memory_mb = 1024 }

[warm]
strategy = "pool"
size = 2
warmup = "import pandas"
"#,
        )
        .expect("reads");
        assert_eq!(file.name.as_deref(), Some("python-data-analysis:v1"));
        assert_eq!(
            file.warm,
            WarmStrategy::Pool {
                size: 2,
                warmup: Some("import pandas".into())
            }
        );
        assert_eq!(file.sandbox.kernels, vec!["python"]);
        assert_eq!(file.sandbox.network, Some(serde_json::json!("off")));
        assert_eq!(file.build_args.get("PY").map(String::as_str), Some("3.11"));
        assert_eq!(
            TemplateFile::parse("").expect("empty").warm,
            WarmStrategy::Cold
        );
        assert_eq!(
            TemplateFile::parse("[warm]\nstrategy = \"singleton\"\n")
                .expect("singleton")
                .warm,
            WarmStrategy::Singleton
        );
    }

    #[test]
    fn bad_files_are_refused_saying_what_is_wrong() {
        let cases = [
            ("nme = \"x\"", "nme"),
            ("name = \"Bad Name\"", "not a template or image name"),
            ("dockerfile = \"../x\"", "inside the build context"),
            (
                "dockerfile = \"a\"\ndockerfile_inline = \"FROM host\"",
                "not both",
            ),
            ("[warm]\nstrategy = \"pool\"\nsize = 0", "warm.size"),
            ("[warm]\nstrategy = \"lukewarm\"", "lukewarm"),
            ("[sandbox]\nworkdir = \"rel\"", "absolute"),
            ("[sandbox]\nbackend = \"G Visor\"", "not a backend name"),
        ];
        for (text, needle) in cases {
            let e = TemplateFile::parse(text).expect_err(text);
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn references_are_name_and_optional_tag() {
        for ok in ["python", "cpp-algorithm", "web.tools_2:v1.0", "a:latest"] {
            assert!(check_reference(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Upper", "-x", "a:", ":t", "a:b:c", &"x".repeat(65)] {
            assert!(check_reference(bad).is_err(), "{bad}");
        }
    }
}
