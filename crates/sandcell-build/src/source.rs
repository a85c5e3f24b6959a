//! What a build is asked to build, in any of its forms, made into one: a Dockerfile; a
//! template file (TOML: its Dockerfile inline or a path in the context, build arguments, the
//! defaults of its sandboxes, its warm strategy); or a built-in template (a template file and
//! the files of its context, written into the context folder).

use std::collections::BTreeMap;
use std::path::Path;

use sandcell_template::TemplateFile;

use crate::BuildError;
use crate::builder::TemplateDefaults;

/// A build's Dockerfile and what comes with it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Source {
    /// The Dockerfile's text.
    pub dockerfile: String,
    /// The name the template file gives, if any.
    pub name: Option<String>,
    /// Its build arguments (a request's own are put over them).
    pub build_args: BTreeMap<String, String>,
    /// The defaults of the template's sandboxes.
    pub defaults: Option<TemplateDefaults>,
}

/// A template file's build: its Dockerfile read from the context when it is not inline.
/// `sandbox_network` (a network policy as JSON) replaces the file's `[sandbox] network`.
pub fn from_template_file(
    text: &str,
    context: &Path,
    sandbox_network: Option<serde_json::Value>,
) -> Result<Source, BuildError> {
    let file = TemplateFile::parse(text).map_err(|e| BuildError::Invalid(e.to_string()))?;
    from_file(file, context, sandbox_network)
}

/// A built-in template's build: its context files written into `context` (an empty folder).
pub fn from_builtin(
    name: &str,
    context: &Path,
    sandbox_network: Option<serde_json::Value>,
) -> Result<Source, BuildError> {
    let builtin = sandcell_template::builtin::builtin(name)
        .map_err(|e| BuildError::Invalid(e.to_string()))?;
    if builtin.needs_network && sandbox_network.is_none() {
        return Err(BuildError::Invalid(format!(
            "the built-in template '{name}' reaches only the hosts you allow: give its sandboxes' network (--sandbox-network allow:HOST,… or sandbox_network)"
        )));
    }
    for (path, contents, mode) in builtin.context {
        let target = context.join(path);
        std::fs::write(&target, contents)
            .map_err(BuildError::io(format!("write {}", target.display())))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(*mode))
            .map_err(BuildError::io(format!("chmod {}", target.display())))?;
    }
    from_file(builtin.template(), context, sandbox_network)
}

fn from_file(
    file: TemplateFile,
    context: &Path,
    sandbox_network: Option<serde_json::Value>,
) -> Result<Source, BuildError> {
    let dockerfile = match (&file.dockerfile_inline, &file.dockerfile) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => {
            let full = context.join(path);
            std::fs::read_to_string(&full).map_err(|e| {
                BuildError::Invalid(format!(
                    "the template file's dockerfile {path} cannot be read from the context: {e}"
                ))
            })?
        }
        (None, None) => {
            let full = context.join("Dockerfile");
            std::fs::read_to_string(&full).map_err(|_| {
                BuildError::Invalid(
                    "the template file names no dockerfile, and the context has no Dockerfile"
                        .into(),
                )
            })?
        }
    };
    let mut sandbox = file.sandbox;
    if let Some(network) = sandbox_network {
        sandbox.network = Some(network);
    }
    Ok(Source {
        dockerfile,
        name: file.name,
        build_args: file.build_args,
        defaults: Some(TemplateDefaults {
            sandbox,
            warm: file.warm,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_builtin_writes_its_context_and_one_needing_a_network_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let s = from_builtin("cpp-algorithm", dir.path(), None).unwrap();
        assert!(s.dockerfile.contains("g++"));
        assert!(dir.path().join("cpp-run").is_file());
        let d = s.defaults.unwrap();
        assert_eq!(d.sandbox.kernels, ["bash"]);
        let e = from_builtin("web-tools", dir.path(), None).unwrap_err();
        assert!(e.to_string().contains("--sandbox-network"), "{e}");
        let s = from_builtin(
            "web-tools",
            dir.path(),
            Some(serde_json::json!({"allow": ["example.org"]})),
        )
        .unwrap();
        assert_eq!(
            s.defaults.unwrap().sandbox.network,
            Some(serde_json::json!({"allow": ["example.org"]}))
        );
    }

    #[test]
    fn a_template_file_reads_its_dockerfile_from_the_context() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile.x"), "FROM debian:bookworm\n").unwrap();
        let s = from_template_file(
            "name = \"t\"\ndockerfile = \"Dockerfile.x\"\n[sandbox]\nkernels = [\"bash\"]\n",
            dir.path(),
            None,
        )
        .unwrap();
        assert_eq!(s.dockerfile, "FROM debian:bookworm\n");
        assert_eq!(s.name.as_deref(), Some("t"));
        let e = from_template_file("nonsense = 1\n", dir.path(), None).unwrap_err();
        assert!(e.to_string().contains("nonsense"), "{e}");
    }
}
