//! A parsed Dockerfile made ready to build: build arguments and variables substituted (Docker's
//! rules: `$NAME`, `${NAME}`, `${NAME:-default}`, `${NAME:+alternative}`, `\$` for a dollar;
//! `ENV` wins over `ARG`; an `ARG` before `FROM` is seen only by `FROM` unless declared again),
//! each layer-making step with the state it runs in, the image's final configuration, and
//! the cache key of every step.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::dockerfile::{CacheMount, Command, Parsed, Step, Warning};

/// What a build does, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The base, substituted (`debian:bookworm`, `host`, an imported image).
    pub base: String,
    /// The line of `FROM`.
    pub base_line: usize,
    /// The steps that make layers, in order.
    pub steps: Vec<PlannedStep>,
    /// The configuration the image ends with.
    pub config: ImageConfig,
    /// Ignored instructions and unused build arguments.
    pub warnings: Vec<Warning>,
}

/// An image's configuration: what its sandboxes start with.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageConfig {
    /// `ENV`, in the order first set.
    pub env: Vec<(String, String)>,
    /// The last `WORKDIR` (none: the sandbox's default).
    pub workdir: Option<String>,
    /// The last `USER` (recorded; sandboxes run as their own user).
    pub user: Option<String>,
    /// `CMD`, as an argument vector.
    pub cmd: Option<Vec<String>>,
    /// `ENTRYPOINT`, as an argument vector.
    pub entrypoint: Option<Vec<String>>,
    /// `LABEL`s.
    pub labels: BTreeMap<String, String>,
}

/// One step that makes a layer, with everything it runs with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlannedStep {
    /// Its line in the Dockerfile.
    pub line: usize,
    /// The instruction as written (for logs and progress).
    pub text: String,
    /// What it does.
    pub op: Op,
    /// The environment it runs in: `ENV` and the build arguments in scope.
    pub env: BTreeMap<String, String>,
    /// Its working directory.
    pub workdir: String,
    /// Its user (`root` unless `USER` said otherwise).
    pub user: String,
}

/// What a layer-making step does.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Runs `argv` in a build sandbox.
    Run {
        /// The command, with the shell already put in front of a shell-form one.
        argv: Vec<String>,
        /// Caches mounted outside the layer.
        cache: Vec<CacheMount>,
    },
    /// Copies files of the context.
    Copy {
        /// Paths (or globs) in the context, substituted.
        sources: Vec<String>,
        /// The absolute destination (a trailing `/` kept: it names a folder).
        dest: String,
        /// `--chown`.
        chown: Option<String>,
        /// `--chmod`.
        chmod: Option<String>,
        /// `ADD`: a local archive is unpacked.
        unpack: bool,
    },
    /// Makes the working directory if it is missing.
    Workdir {
        /// The absolute path.
        path: String,
    },
}

impl PlannedStep {
    /// The cache key of this step alone: a hash of what it does and the state it runs in
    /// (the builder adds the parent layer and the hashes of copied files, see
    /// [`layer_key`]).
    pub fn key(&self) -> String {
        let canonical = serde_json::to_string(&(&self.op, &self.env, &self.workdir, &self.user))
            .unwrap_or_default();
        hex(&Sha256::digest(canonical.as_bytes()))
    }
}

/// The cache key of a layer: its parent (a layer digest, or the base's id), the step's own
/// key, and a digest of its inputs from the context (empty for `RUN`).
pub fn layer_key(parent: &str, step_key: &str, inputs: &str) -> String {
    let mut h = Sha256::new();
    for part in [parent, step_key, inputs] {
        h.update(part.len().to_le_bytes());
        h.update(part.as_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a Dockerfile cannot be planned (a bad variable reference).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct PlanError {
    /// The instruction's line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// The default `SHELL`.
const DEFAULT_SHELL: [&str; 2] = ["/bin/sh", "-c"];

/// Plans `parsed` with `build_args` (`--build-arg NAME=VALUE`).
pub fn plan(parsed: &Parsed, build_args: &BTreeMap<String, String>) -> Result<Plan, PlanError> {
    let mut warnings = parsed.warnings.clone();
    let mut global: BTreeMap<String, String> = BTreeMap::new();
    let mut declared: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    let mut env: Vec<(String, String)> = Vec::new();
    let mut base = None;
    let mut workdir = "/".to_string();
    let mut workdir_set = None;
    let mut user = None;
    let mut shell: Vec<String> = DEFAULT_SHELL.iter().map(ToString::to_string).collect();
    let mut config = ImageConfig::default();
    let mut steps = Vec::new();
    for ins in &parsed.instructions {
        let line = ins.line;
        let fail = |message: String| PlanError { line, message };
        // What a substitution sees now: ENV over ARG (before FROM: the global ARGs).
        let scope: BTreeMap<String, String> = if base.is_none() {
            global.clone()
        } else {
            let mut s = args.clone();
            s.extend(env.iter().cloned());
            s
        };
        let sub = |text: &str| expand(text, &scope).map_err(fail);
        match &ins.step {
            Step::From { image } => {
                let image = sub(image)?;
                if image.is_empty() {
                    return Err(PlanError {
                        line,
                        message: "FROM names no image once its variables are substituted".into(),
                    });
                }
                base = Some((image, line));
            }
            Step::Arg { name, default } => {
                declared.insert(name);
                let value = match (build_args.get(name), default) {
                    (Some(given), _) => Some(given.clone()),
                    (None, Some(d)) => Some(sub(d)?),
                    // Declared again after FROM: the global value.
                    (None, None) if base.is_some() => global.get(name).cloned(),
                    (None, None) => None,
                };
                let target = if base.is_none() {
                    &mut global
                } else {
                    &mut args
                };
                if let Some(v) = value {
                    target.insert(name.clone(), v);
                }
            }
            Step::Env(pairs) => {
                // Every value of one ENV sees the variables as they were before it.
                let mut values = Vec::with_capacity(pairs.len());
                for (k, v) in pairs {
                    values.push((k.clone(), sub(v)?));
                }
                for (k, v) in values {
                    set(&mut env, &k, v.clone());
                    set(&mut config.env, &k, v);
                }
            }
            Step::Label(pairs) => {
                for (k, v) in pairs {
                    config.labels.insert(sub(k)?, sub(v)?);
                }
            }
            Step::Workdir(path) => {
                let path = absolute(&workdir, &sub(path)?);
                workdir = path.clone();
                workdir_set = Some(path.clone());
                steps.push(step(
                    ins,
                    Op::Workdir { path },
                    &args,
                    &env,
                    &workdir,
                    &user,
                ));
            }
            Step::User(u) => user = Some(sub(u)?),
            Step::Shell(argv) => shell = argv.clone(),
            Step::Run { command, cache } => {
                let argv = argv_of(command, &shell);
                let op = Op::Run {
                    argv,
                    cache: cache.clone(),
                };
                steps.push(step(ins, op, &args, &env, &workdir, &user));
            }
            Step::Copy {
                sources,
                dest,
                chown,
                chmod,
                add,
            } => {
                let sources = sources
                    .iter()
                    .map(|s| sub(s))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut dest_abs = absolute(&workdir, &sub(dest)?);
                if dest.ends_with('/') && !dest_abs.ends_with('/') {
                    dest_abs.push('/');
                }
                let op = Op::Copy {
                    sources,
                    dest: dest_abs,
                    chown: chown.as_deref().map(sub).transpose()?,
                    chmod: chmod.clone(),
                    unpack: *add,
                };
                steps.push(step(ins, op, &args, &env, &workdir, &user));
            }
            Step::Cmd(c) => config.cmd = Some(argv_of(c, &shell)),
            Step::Entrypoint(c) => config.entrypoint = Some(argv_of(c, &shell)),
        }
    }
    let Some((base, base_line)) = base else {
        return Err(PlanError {
            line: 1,
            message: "no FROM".into(),
        });
    };
    for name in build_args.keys() {
        if !declared.contains(name.as_str()) {
            warnings.push(Warning {
                line: base_line,
                message: format!("build argument '{name}' is not declared by any ARG: unused"),
            });
        }
    }
    config.workdir = workdir_set;
    config.user = user;
    Ok(Plan {
        base,
        base_line,
        steps,
        config,
        warnings,
    })
}

fn step(
    ins: &crate::dockerfile::Instruction,
    op: Op,
    args: &BTreeMap<String, String>,
    env: &[(String, String)],
    workdir: &str,
    user: &Option<String>,
) -> PlannedStep {
    let mut all = args.clone();
    all.extend(env.iter().cloned());
    PlannedStep {
        line: ins.line,
        text: describe(&ins.step),
        op,
        env: all,
        workdir: workdir.to_string(),
        user: user.clone().unwrap_or_else(|| "root".into()),
    }
}

/// One line saying what a step is, for progress and logs.
fn describe(step: &Step) -> String {
    match step {
        Step::Run { command, .. } => format!("RUN {command}"),
        Step::Copy {
            sources, dest, add, ..
        } => format!(
            "{} {} {dest}",
            if *add { "ADD" } else { "COPY" },
            sources.join(" ")
        ),
        Step::Workdir(p) => format!("WORKDIR {p}"),
        other => format!("{other:?}"),
    }
}

fn set(list: &mut Vec<(String, String)>, key: &str, value: String) {
    match list.iter_mut().find(|(k, _)| k == key) {
        Some(entry) => entry.1 = value,
        None => list.push((key.to_string(), value)),
    }
}

fn argv_of(command: &Command, shell: &[String]) -> Vec<String> {
    match command {
        Command::Exec(argv) => argv.clone(),
        Command::Shell(text) => {
            let mut argv = shell.to_vec();
            argv.push(text.clone());
            argv
        }
    }
}

/// `path` made absolute against `cwd`, with `.` and `..` resolved.
fn absolute(cwd: &str, path: &str) -> String {
    sandcell_api::rules::absolute_path(cwd, path)
}

/// `text` with `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME:+word}` (and `-`, `+` without the
/// colon) replaced from `vars`; `\$` is a literal dollar; an unset name is empty.
pub fn expand(text: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        match c {
            '\\' if chars.peek().map(|&(_, n)| n) == Some('$') => {
                out.push('$');
                chars.next();
            }
            '$' => match chars.peek().map(|&(_, n)| n) {
                Some('{') => {
                    chars.next();
                    // Up to the matching brace: a default may hold `${…}` itself.
                    let mut inner = String::new();
                    let mut depth = 0usize;
                    let mut closed = false;
                    for (_, n) in chars.by_ref() {
                        match n {
                            '{' => depth += 1,
                            '}' if depth == 0 => {
                                closed = true;
                                break;
                            }
                            '}' => depth -= 1,
                            _ => {}
                        }
                        inner.push(n);
                    }
                    if !closed {
                        return Err(format!("'${{{inner}' is not closed with }}"));
                    }
                    out.push_str(&braced(&inner, vars)?);
                }
                Some(n) if n.is_ascii_alphabetic() || n == '_' => {
                    let mut name = String::new();
                    while let Some(&(_, n)) = chars.peek() {
                        if n.is_ascii_alphanumeric() || n == '_' {
                            name.push(n);
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    out.push_str(vars.get(&name).map_or("", String::as_str));
                }
                _ => out.push('$'),
            },
            c => out.push(c),
        }
    }
    Ok(out)
}

fn braced(inner: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let end = inner
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(inner.len());
    let (name, rest) = inner.split_at(end);
    if name.is_empty() {
        return Err(format!("'${{{inner}}}' names no variable"));
    }
    let value = vars.get(name);
    let word = |w: &str| expand(w, vars);
    Ok(match rest {
        "" => value.cloned().unwrap_or_default(),
        r if r.starts_with(":-") => match value.filter(|v| !v.is_empty()) {
            Some(v) => v.clone(),
            None => word(&r[2..])?,
        },
        r if r.starts_with(":+") => match value.filter(|v| !v.is_empty()) {
            Some(_) => word(&r[2..])?,
            None => String::new(),
        },
        r if r.starts_with('-') => match value {
            Some(v) => v.clone(),
            None => word(&r[1..])?,
        },
        r if r.starts_with('+') => match value {
            Some(_) => word(&r[1..])?,
            None => String::new(),
        },
        r => {
            return Err(format!(
                "'${{{inner}}}': '{r}' is not supported (only :-, :+, - and +)"
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dockerfile::parse;

    fn planned(text: &str, args: &[(&str, &str)]) -> Plan {
        let args = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        plan(&parse(text).expect("parses"), &args).expect("plans")
    }

    #[test]
    fn variables_follow_dockers_rules() {
        let vars: BTreeMap<String, String> = [("A", "1"), ("E", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cases = [
            ("$A ${A} x${A}y", "1 1 x1y"),
            ("${B:-def} ${A:-def} ${E:-def} ${E-def}", "def 1 def "),
            ("${A:+alt} ${B:+alt} ${E:+alt} ${E+alt}", "alt   alt"),
            ("\\$A $ $1 ${B:-${A}}", "$A $ $1 1"),
        ];
        for (text, want) in cases {
            assert_eq!(expand(text, &vars).expect(text), want, "{text}");
        }
        assert!(expand("${A", &vars).is_err());
        assert!(
            expand("${A:?x}", &vars)
                .expect_err("?")
                .contains("not supported")
        );
    }

    #[test]
    fn a_plan_substitutes_and_carries_state_into_each_step() {
        let text = r#"ARG SUITE=bookworm
FROM debian:${SUITE}
ARG SUITE
ARG PKG=jq
ENV HOME_DIR=/opt/app PATH_EXTRA=${HOME_DIR}/bin
ENV PATH_EXTRA=${HOME_DIR}/bin
WORKDIR $HOME_DIR
WORKDIR src/../lib
USER builder
RUN apt-get install -y $PKG
SHELL ["/bin/bash", "-c"]
COPY --chown=${PKG} a.py ./
ADD b.tar.gz /srv/
CMD python3 main.py
LABEL version=${SUITE}
"#;
        let p = planned(text, &[("PKG", "curl"), ("UNUSED", "x")]);
        assert_eq!(p.base, "debian:bookworm");
        assert_eq!(p.base_line, 2);
        let ops: Vec<&Op> = p.steps.iter().map(|s| &s.op).collect();
        assert_eq!(
            ops,
            vec![
                &Op::Workdir {
                    path: "/opt/app".into()
                },
                &Op::Workdir {
                    path: "/opt/app/lib".into()
                },
                &Op::Run {
                    argv: vec![
                        "/bin/sh".into(),
                        "-c".into(),
                        "apt-get install -y $PKG".into()
                    ],
                    cache: vec![]
                },
                &Op::Copy {
                    sources: vec!["a.py".into()],
                    dest: "/opt/app/lib/".into(),
                    chown: Some("curl".into()),
                    chmod: None,
                    unpack: false
                },
                &Op::Copy {
                    sources: vec!["b.tar.gz".into()],
                    dest: "/srv/".into(),
                    chown: None,
                    chmod: None,
                    unpack: true
                },
            ]
        );
        let run = &p.steps[2];
        assert_eq!(run.user, "builder");
        assert_eq!(run.workdir, "/opt/app/lib");
        // The RUN sees build arguments and ENV (the shell substitutes $PKG itself).
        assert_eq!(run.env.get("PKG").map(String::as_str), Some("curl"));
        assert_eq!(run.env.get("SUITE").map(String::as_str), Some("bookworm"));
        // ENV values see the variables before their own instruction.
        assert_eq!(
            p.config.env,
            vec![
                ("HOME_DIR".to_string(), "/opt/app".to_string()),
                ("PATH_EXTRA".to_string(), "/opt/app/bin".to_string())
            ]
        );
        assert_eq!(
            p.steps[0].env.get("PATH_EXTRA").map(String::as_str),
            Some("/opt/app/bin")
        );
        assert_eq!(
            p.config.cmd,
            Some(vec![
                "/bin/bash".into(),
                "-c".into(),
                "python3 main.py".into()
            ])
        );
        assert_eq!(p.config.workdir.as_deref(), Some("/opt/app/lib"));
        assert_eq!(p.config.user.as_deref(), Some("builder"));
        assert_eq!(
            p.config.labels.get("version").map(String::as_str),
            Some("bookworm")
        );
        assert!(
            p.warnings.iter().any(|w| w.message.contains("'UNUSED'")),
            "{:?}",
            p.warnings
        );
    }

    #[test]
    fn a_global_arg_is_seen_only_by_from_unless_declared_again() {
        let p = planned("ARG V=1\nFROM host\nRUN echo $V\n", &[]);
        assert_eq!(p.steps[0].env.get("V"), None);
        let p = planned("ARG V=1\nFROM host\nARG V\nRUN echo $V\n", &[]);
        assert_eq!(p.steps[0].env.get("V").map(String::as_str), Some("1"));
    }

    #[test]
    fn a_step_key_changes_with_what_the_step_depends_on_and_nothing_else() {
        let base = "FROM host\nARG N=1\nENV A=1\nRUN make\n";
        let key = |text: &str, args: &[(&str, &str)]| planned(text, args).steps[0].key();
        let k = key(base, &[]);
        assert_eq!(k, key(base, &[]), "stable");
        assert_eq!(
            k,
            key(&format!("# comment\n{base}LABEL x=y\n"), &[]),
            "comments, later lines"
        );
        assert_ne!(k, key(base, &[("N", "2")]), "a build argument in scope");
        assert_ne!(k, key(&base.replace("A=1", "A=2"), &[]), "an ENV value");
        assert_ne!(
            k,
            key(&base.replace("make", "make all"), &[]),
            "the command"
        );
        assert_ne!(
            k,
            key(&base.replace("ENV A=1\n", "ENV A=1\nUSER u\n"), &[]),
            "the user"
        );
        let l = layer_key("sha256:parent", &k, "");
        assert_ne!(l, layer_key("sha256:other", &k, ""), "the parent");
        assert_ne!(l, layer_key("sha256:parent", &k, "files"), "the inputs");
        // Parts cannot run into each other.
        assert_ne!(layer_key("ab", "c", ""), layer_key("a", "bc", ""));
    }

    #[test]
    fn a_bad_reference_names_its_line() {
        let e = plan(
            &parse("FROM host\n\nENV A=${B\n").expect("parses"),
            &BTreeMap::new(),
        )
        .expect_err("bad");
        assert_eq!(e.line, 3);
        let e = plan(
            &parse("ARG B\nFROM ${B}\n").expect("parses"),
            &BTreeMap::new(),
        )
        .expect_err("empty");
        assert!(e.message.contains("names no image"), "{e}");
    }
}
