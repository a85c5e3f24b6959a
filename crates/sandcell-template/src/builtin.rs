//! The built-in templates, buildable with one command (`sandcell template build --builtin
//! NAME`): each a template file (its Dockerfile inline) and the files its context holds.

use crate::spec::{SpecError, TemplateFile};

/// A built-in template.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    /// Its name.
    pub name: &'static str,
    /// Its template file.
    pub file: &'static str,
    /// Its build context: (path, contents, mode).
    pub context: &'static [(&'static str, &'static str, u32)],
    /// Its sandboxes' network must be given when it is built (the hosts the operator allows).
    pub needs_network: bool,
}

/// Every built-in template.
pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "python-data-analysis",
        file: include_str!("../builtin/python-data-analysis.toml"),
        context: &[],
        needs_network: false,
    },
    Builtin {
        name: "cpp-algorithm",
        file: include_str!("../builtin/cpp-algorithm.toml"),
        context: &[("cpp-run", include_str!("../builtin/cpp-run"), 0o755)],
        needs_network: false,
    },
    Builtin {
        name: "go-algorithm",
        file: include_str!("../builtin/go-algorithm.toml"),
        context: &[("go-run", include_str!("../builtin/go-run"), 0o755)],
        needs_network: false,
    },
    Builtin {
        name: "node",
        file: include_str!("../builtin/node.toml"),
        context: &[],
        needs_network: false,
    },
    Builtin {
        name: "web-tools",
        file: include_str!("../builtin/web-tools.toml"),
        context: &[],
        needs_network: true,
    },
];

/// The built-in template `name`, or an error listing them.
pub fn builtin(name: &str) -> Result<&'static Builtin, SpecError> {
    BUILTINS.iter().find(|b| b.name == name).ok_or_else(|| {
        let names: Vec<&str> = BUILTINS.iter().map(|b| b.name).collect();
        SpecError::Invalid(format!(
            "no built-in template '{name}' (there are: {})",
            names.join(", ")
        ))
    })
}

impl Builtin {
    /// Its template file, read.
    pub fn template(&self) -> TemplateFile {
        // Proven by the test below: every built-in file parses.
        TemplateFile::parse(self.file).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_parses_and_plans() {
        for b in BUILTINS {
            let file = TemplateFile::parse(b.file).unwrap_or_else(|e| panic!("{}: {e}", b.name));
            assert_eq!(file.name.as_deref(), Some(b.name));
            let text = file
                .dockerfile_inline
                .as_deref()
                .expect("inline Dockerfile");
            let parsed = crate::parse(text).unwrap_or_else(|e| panic!("{}: {e}", b.name));
            let plan = crate::plan(&parsed, &Default::default())
                .unwrap_or_else(|e| panic!("{}: {e}", b.name));
            assert_eq!(plan.base, "debian:bookworm");
            assert_eq!(
                b.needs_network,
                file.sandbox.network.is_none(),
                "{}",
                b.name
            );
        }
        assert!(
            builtin("nope")
                .unwrap_err()
                .to_string()
                .contains("python-data-analysis")
        );
    }
}
