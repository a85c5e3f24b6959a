//! Workspace mode (`sandcell run --workspace DIR`): the template a repository's tests run in,
//! planned from its dependency files, so that the tests then run with the network off and
//! the folder mounted read-only.
//!
//! - `tests-only`: the test runner (pytest) and the dependencies the project declares for its
//!   tests (requirement files, `pyproject.toml`'s dependencies and its test or dev extras and
//!   groups); only those files go into the build, so the template is rebuilt only when they
//!   change.
//! - `dev`: the project's own install command (`pip install -e '.[extras]'`) over a copy of
//!   the whole folder.
//! - any other text: that command, run in a copy of the whole folder.

use std::collections::BTreeMap;

use crate::spec::SpecError;

/// The base workspace templates are built on.
pub const BASE: &str = "debian:bookworm";

/// Where the dependency files go in the image (`tests-only`).
pub const DEPS_DIR: &str = "/opt/sandcell-workspace";

/// The requirements file the plan writes (`tests-only`): every declared requirement, one a
/// line.
pub const REQUIREMENTS: &str = "sandcell-requirements.txt";

/// Extras and dependency groups that hold what tests need.
const TEST_EXTRAS: [&str; 4] = ["test", "tests", "testing", "dev"];

/// How a workspace's template is prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setup {
    /// The test runner and the declared test dependencies.
    TestsOnly,
    /// The project's own install command.
    Dev,
    /// This command, in a copy of the folder.
    Command(String),
}

impl std::str::FromStr for Setup {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        match text.trim() {
            "tests-only" => Ok(Self::TestsOnly),
            "dev" => Ok(Self::Dev),
            "" => Err(SpecError::Invalid(
                "--setup takes tests-only, dev or a command".into(),
            )),
            command => Ok(Self::Command(command.to_string())),
        }
    }
}

/// Whether a file of the folder (its path relative to it) is a dependency file the plan
/// reads.
pub fn is_dependency_file(relative: &str) -> bool {
    let name = relative.rsplit('/').next().unwrap_or(relative);
    match relative.matches('/').count() {
        0 => {
            name == "pyproject.toml"
                || (name.ends_with(".txt")
                    && (name.starts_with("requirements")
                        || name.ends_with("-requirements.txt")
                        || name.ends_with("_requirements.txt")))
        }
        1 => relative.starts_with("requirements/") && name.ends_with(".txt"),
        _ => false,
    }
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspacePlan {
    /// The Dockerfile.
    pub dockerfile: String,
    /// The context's files when it is made of the dependency files (relative path →
    /// contents); `None`: the context is a copy of the whole folder.
    pub context: Option<BTreeMap<String, Vec<u8>>>,
    /// What the plan found, for the user (`pyproject.toml: 3 dependencies, extras test`).
    pub found: Vec<String>,
}

/// Plans the template of a folder whose dependency files ([`is_dependency_file`]) are
/// `files`, prepared per `setup`.
pub fn plan(files: &BTreeMap<String, Vec<u8>>, setup: &Setup) -> Result<WorkspacePlan, SpecError> {
    let mut found = Vec::new();
    let pyproject = match files.get("pyproject.toml") {
        Some(bytes) => Some(Pyproject::read(bytes)?),
        None => None,
    };
    let system = format!(
        "FROM {BASE}\n\
         RUN --mount=type=cache,target=/var/cache/apt,id=apt-archives \\\n    \
         --mount=type=cache,target=/var/lib/apt/lists,id=apt-lists \\\n    \
         rm -f /etc/apt/apt.conf.d/docker-clean && apt-get update && \\\n    \
         apt-get install -y --no-install-recommends python3 python3-pip python3-venv git\n\
         ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1\n"
    );
    let pip = "RUN --mount=type=cache,target=/root/.cache/pip,id=pip";
    match setup {
        Setup::TestsOnly => {
            let mut requirements: Vec<String> = Vec::new();
            let mut context = BTreeMap::new();
            let mut req_files = Vec::new();
            for (path, bytes) in files.iter().filter(|(p, _)| p.ends_with(".txt")) {
                let text = String::from_utf8_lossy(bytes);
                // Local paths (`-e .`, `./pkg`) name the project itself: not a dependency.
                let kept: Vec<&str> = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .filter(|l| !(l.starts_with("-e") || l.starts_with('.') || l.starts_with('/')))
                    .collect();
                found.push(format!("{path}: {} lines", kept.len()));
                context.insert(path.clone(), (kept.join("\n") + "\n").into_bytes());
                req_files.push(path.clone());
            }
            if let Some(p) = &pyproject {
                requirements.extend(p.dependencies.iter().cloned());
                let mut extras = Vec::new();
                for (name, deps) in &p.test_dependencies {
                    extras.push(name.as_str());
                    requirements.extend(deps.iter().cloned());
                }
                found.push(format!(
                    "pyproject.toml: {} dependencies{}",
                    p.dependencies.len(),
                    if extras.is_empty() {
                        String::new()
                    } else {
                        format!(", test dependencies from {}", extras.join(", "))
                    }
                ));
            }
            let in_files = context.values().any(|b| {
                String::from_utf8_lossy(b)
                    .lines()
                    .any(|l| requirement_name(l) == "pytest")
            });
            let mentions_pytest =
                in_files || requirements.iter().any(|r| requirement_name(r) == "pytest");
            if !mentions_pytest {
                requirements.push("pytest".into());
            }
            requirements.sort();
            requirements.dedup();
            context.insert(
                REQUIREMENTS.to_string(),
                (requirements.join("\n") + "\n").into_bytes(),
            );
            let mut flags = format!("-r {DEPS_DIR}/{REQUIREMENTS}");
            for f in &req_files {
                flags.push_str(&format!(" -r {DEPS_DIR}/{f}"));
            }
            let dockerfile = format!(
                "{system}COPY . {DEPS_DIR}/\n{pip} \\\n    \
                 pip install --break-system-packages --no-warn-script-location {flags}\n\
                 WORKDIR /workspace\n"
            );
            Ok(WorkspacePlan {
                dockerfile,
                context: Some(context),
                found,
            })
        }
        Setup::Dev => {
            let extras: Vec<&str> = pyproject
                .as_ref()
                .map(|p| p.test_dependencies.keys().map(String::as_str).collect())
                .unwrap_or_default();
            let target = if extras.is_empty() {
                ".".to_string()
            } else {
                format!(".[{}]", extras.join(","))
            };
            let mut command = if pyproject.is_some() || files.is_empty() {
                format!(
                    "pip install --break-system-packages --no-warn-script-location -e '{target}'"
                )
            } else {
                String::from("true")
            };
            for f in files.keys().filter(|p| p.ends_with(".txt")) {
                command.push_str(&format!(
                    " && pip install --break-system-packages --no-warn-script-location -r '{f}'"
                ));
            }
            command.push_str(
                " && pip install --break-system-packages --no-warn-script-location pytest",
            );
            found.push(format!("the project's install: pip install -e '{target}'"));
            Ok(WorkspacePlan {
                dockerfile: format!(
                    "{system}COPY . /workspace\nWORKDIR /workspace\n{pip} \\\n    {command}\n"
                ),
                context: None,
                found,
            })
        }
        Setup::Command(command) => {
            if command.contains('\n') {
                return Err(SpecError::Invalid(
                    "--setup takes a one-line command".into(),
                ));
            }
            found.push(format!("the command: {command}"));
            Ok(WorkspacePlan {
                dockerfile: format!(
                    "{system}COPY . /workspace\nWORKDIR /workspace\n{pip} \\\n    {command}\n"
                ),
                context: None,
                found,
            })
        }
    }
}

/// The template name of a workspace build: `workspace-<digest>`, the digest of its
/// Dockerfile and every file of its context, so that a folder whose inputs did not change
/// finds its template already built.
#[derive(Debug, Clone, Default)]
pub struct TemplateName(sha2::Sha256);

impl TemplateName {
    /// Adds a context file.
    pub fn add(&mut self, relative: &str, contents: &[u8]) {
        use sha2::Digest;
        for part in [relative.as_bytes(), contents] {
            self.0.update((part.len() as u64).to_le_bytes());
            self.0.update(part);
        }
    }

    /// The name, for this Dockerfile.
    pub fn finish(mut self, dockerfile: &str) -> String {
        use sha2::Digest;
        self.0.update(dockerfile.as_bytes());
        let digest = self.0.finalize();
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("workspace-{hex}")
    }
}

/// The name a requirement installs (`pytest>=8; python_version>"3"` → `pytest`), lowercase.
fn requirement_name(requirement: &str) -> String {
    requirement
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .collect::<String>()
        .to_ascii_lowercase()
        .replace('_', "-")
}

/// What `pyproject.toml` declares.
#[derive(Debug, Default)]
struct Pyproject {
    /// `[project] dependencies`.
    dependencies: Vec<String>,
    /// The extras (`[project.optional-dependencies]`) and groups (`[dependency-groups]`)
    /// named like test dependencies, by name.
    test_dependencies: BTreeMap<String, Vec<String>>,
}

impl Pyproject {
    fn read(bytes: &[u8]) -> Result<Self, SpecError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| SpecError::Invalid("pyproject.toml is not UTF-8".into()))?;
        let doc: toml::Table = text
            .parse()
            .map_err(|e| SpecError::Invalid(format!("pyproject.toml: {e}")))?;
        let strings = |v: Option<&toml::Value>| -> Vec<String> {
            v.and_then(toml::Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|d| d.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let project = doc.get("project");
        let mut out = Self {
            dependencies: strings(project.and_then(|p| p.get("dependencies"))),
            ..Self::default()
        };
        let extras = project.and_then(|p| p.get("optional-dependencies"));
        let groups = doc.get("dependency-groups");
        for name in TEST_EXTRAS {
            for table in [extras, groups].into_iter().flatten() {
                let deps = strings(table.get(name));
                if !deps.is_empty() {
                    out.test_dependencies
                        .entry(name.to_string())
                        .or_default()
                        .extend(deps);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        list.iter()
            .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn dependency_files_are_the_requirement_files_and_pyproject() {
        for yes in [
            "pyproject.toml",
            "requirements.txt",
            "requirements-dev.txt",
            "test-requirements.txt",
            "requirements/test.txt",
        ] {
            assert!(is_dependency_file(yes), "{yes}");
        }
        for no in [
            "src/pyproject.toml",
            "notes.txt",
            "requirements/a/b.txt",
            "setup.py",
        ] {
            assert!(!is_dependency_file(no), "{no}");
        }
    }

    #[test]
    fn tests_only_installs_pytest_and_the_declared_test_dependencies_from_those_files_alone() {
        let p = plan(
            &files(&[
                (
                    "pyproject.toml",
                    "[project]\nname = \"x\"\ndependencies = [\"attrs>=22\"]\n\
                     [project.optional-dependencies]\ntest = [\"hypothesis\"]\ndocs = [\"sphinx\"]\n",
                ),
                ("requirements.txt", "# pinned\nrequests==2.31\n-e .\n"),
            ]),
            &Setup::TestsOnly,
        )
        .unwrap();
        let context = p.context.expect("a context of the dependency files");
        let reqs = String::from_utf8(context[REQUIREMENTS].clone()).unwrap();
        assert_eq!(reqs, "attrs>=22\nhypothesis\npytest\n");
        assert_eq!(
            String::from_utf8(context["requirements.txt"].clone()).unwrap(),
            "requests==2.31\n"
        );
        assert!(
            p.dockerfile.starts_with("FROM debian:bookworm\n"),
            "{}",
            p.dockerfile
        );
        assert!(
            p.dockerfile.contains(&format!(
                "-r {DEPS_DIR}/{REQUIREMENTS} -r {DEPS_DIR}/requirements.txt"
            )),
            "{}",
            p.dockerfile
        );
        assert!(!p.dockerfile.contains("sphinx"));
    }

    #[test]
    fn pytest_already_declared_is_not_added_twice() {
        let p = plan(
            &files(&[("requirements-test.txt", "pytest==8.0\n")]),
            &Setup::TestsOnly,
        )
        .unwrap();
        let reqs = String::from_utf8(p.context.unwrap()[REQUIREMENTS].clone()).unwrap();
        assert_eq!(reqs, "\n");
    }

    #[test]
    fn dev_runs_the_projects_install_with_its_test_extras_over_the_whole_folder() {
        let p = plan(
            &files(&[(
                "pyproject.toml",
                "[project]\nname = \"x\"\n[project.optional-dependencies]\ndev = [\"ruff\"]\n",
            )]),
            &Setup::Dev,
        )
        .unwrap();
        assert!(p.context.is_none());
        assert!(
            p.dockerfile.contains("COPY . /workspace\n"),
            "{}",
            p.dockerfile
        );
        assert!(
            p.dockerfile.contains(
                "pip install --break-system-packages --no-warn-script-location -e '.[dev]'"
            ),
            "{}",
            p.dockerfile
        );
    }

    #[test]
    fn a_command_runs_as_given_and_a_bad_pyproject_is_an_error() {
        let setup: Setup = "make deps".parse().unwrap();
        let p = plan(&BTreeMap::new(), &setup).unwrap();
        assert!(p.dockerfile.ends_with("make deps\n"), "{}", p.dockerfile);
        assert_eq!("tests-only".parse::<Setup>().unwrap(), Setup::TestsOnly);
        assert!(plan(&files(&[("pyproject.toml", "[project")]), &Setup::TestsOnly).is_err());
    }
}
