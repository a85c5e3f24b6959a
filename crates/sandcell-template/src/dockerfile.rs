//! The Dockerfile subset Sandcell builds.
//!
//! Built: `FROM` (one stage), `RUN` (shell and exec form, `--mount=type=cache`), `COPY` and
//! `ADD` from the build context, `ENV`, `ARG`, `WORKDIR`, `USER`, `LABEL`, `SHELL`, and `CMD`
//! / `ENTRYPOINT` (recorded in the image's config). Warned about and ignored: `EXPOSE`,
//! `VOLUME`, `STOPSIGNAL`, `HEALTHCHECK`, `MAINTAINER`. Refused with their line: everything
//! else (a second `FROM`, `COPY --from`, `ADD` of a URL, `ONBUILD`, heredocs, other `RUN`
//! mounts), so that a template never builds into something other than what its file says.
//!
//! Lines follow Docker's rules: parser directives (`# escape=`) at the top, comments,
//! continuation lines ending with the escape character (comment lines inside them dropped),
//! instructions in any case, JSON arrays for the exec form.

use std::fmt;

/// A parsed Dockerfile: its instructions in order, and what was ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Each instruction, with the line it starts on.
    pub instructions: Vec<Instruction>,
    /// Instructions that do not matter to a sandbox, ignored.
    pub warnings: Vec<Warning>,
}

/// One instruction and the line (1-based) it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// Where it starts.
    pub line: usize,
    /// What it says.
    pub step: Step,
}

/// A command: a string for the shell, or an argument vector (JSON array form).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Run by the current `SHELL` (default `/bin/sh -c`).
    Shell(String),
    /// Run as it is.
    Exec(Vec<String>),
}

/// A package manager's cache mounted into a `RUN` step, outside its layer
/// (`--mount=type=cache,target=…[,id=…]`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheMount {
    /// Where it appears in the step.
    pub target: String,
    /// Which cache (default: the target).
    pub id: String,
}

/// What an instruction does (variables not yet substituted: see [`crate::plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The base (`FROM image [AS name]`).
    From {
        /// `debian:bookworm`, `host`, an imported image's name, …
        image: String,
    },
    /// A build argument and its default.
    Arg {
        /// Its name.
        name: String,
        /// Its default, if given.
        default: Option<String>,
    },
    /// Environment variables of later steps and of the sandboxes.
    Env(Vec<(String, String)>),
    /// Labels of the image.
    Label(Vec<(String, String)>),
    /// A command run in a build sandbox; its changes become a layer.
    Run {
        /// What to run.
        command: Command,
        /// Caches mounted outside the layer.
        cache: Vec<CacheMount>,
    },
    /// Files from the build context (`ADD` also unpacks a local archive).
    Copy {
        /// Paths (or globs) in the context.
        sources: Vec<String>,
        /// Where they go in the image.
        dest: String,
        /// `--chown=user[:group]`.
        chown: Option<String>,
        /// `--chmod=0755`.
        chmod: Option<String>,
        /// `ADD` rather than `COPY`.
        add: bool,
    },
    /// The working directory of later steps and of the sandboxes (made if missing).
    Workdir(String),
    /// The user of later steps.
    User(String),
    /// The shell of later shell-form commands.
    Shell(Vec<String>),
    /// The default command (recorded).
    Cmd(Command),
    /// The entry point (recorded).
    Entrypoint(Command),
}

/// An instruction ignored, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Its line.
    pub line: usize,
    /// What was ignored and why.
    pub message: String,
}

/// Why a Dockerfile cannot be built as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// The line (1-based) of the instruction.
    pub line: usize,
    /// What is wrong, and what to do instead where there is a way.
    pub message: String,
}

/// The longest Dockerfile read (a template's file, not a data file).
pub const MAX_BYTES: usize = 1 << 20;

/// Parses `text`.
pub fn parse(text: &str) -> Result<Parsed, ParseError> {
    if text.len() > MAX_BYTES {
        return Err(err(
            1,
            format!(
                "the Dockerfile is {} bytes, more than {MAX_BYTES}",
                text.len()
            ),
        ));
    }
    let mut instructions = Vec::new();
    let mut warnings = Vec::new();
    let mut seen_from = false;
    for (line, logical) in logical_lines(text)? {
        let (keyword, rest) = match logical.find(char::is_whitespace) {
            Some(i) => (&logical[..i], logical[i..].trim()),
            None => (logical.as_str(), ""),
        };
        let upper = keyword.to_ascii_uppercase();
        if !seen_from && upper != "FROM" && upper != "ARG" {
            return Err(err(
                line,
                format!(
                    "'{keyword}' before FROM: a Dockerfile starts with FROM (only ARG may come before it)"
                ),
            ));
        }
        let step = match upper.as_str() {
            "FROM" => {
                if seen_from {
                    return Err(err(
                        line,
                        "a second FROM: multi-stage builds are not supported (one stage per template)",
                    ));
                }
                seen_from = true;
                parse_from(line, rest, &mut warnings)?
            }
            "ARG" => {
                // Several in one instruction become one each.
                for step in parse_args(line, rest)? {
                    instructions.push(Instruction { line, step });
                }
                continue;
            }
            "ENV" => Step::Env(parse_pairs(line, "ENV", rest)?),
            "LABEL" => Step::Label(parse_pairs(line, "LABEL", rest)?),
            "RUN" => parse_run(line, rest)?,
            "COPY" => parse_copy(line, rest, false, &mut warnings)?,
            "ADD" => parse_copy(line, rest, true, &mut warnings)?,
            "WORKDIR" => Step::Workdir(one_word(line, "WORKDIR", rest)?),
            "USER" => Step::User(one_word(line, "USER", rest)?),
            "SHELL" => match exec_form(rest) {
                Some(argv) if !argv.is_empty() => Step::Shell(argv),
                _ => {
                    return Err(err(
                        line,
                        "SHELL takes a JSON array, e.g. SHELL [\"/bin/bash\", \"-c\"]",
                    ));
                }
            },
            "CMD" => Step::Cmd(command(line, "CMD", rest)?),
            "ENTRYPOINT" => Step::Entrypoint(command(line, "ENTRYPOINT", rest)?),
            "EXPOSE" => {
                warnings.push(Warning {
                    line,
                    message: "EXPOSE ignored: any port of a sandbox is reached through its preview routes".into(),
                });
                continue;
            }
            "VOLUME" => {
                warnings.push(Warning {
                    line,
                    message: "VOLUME ignored: attach named volumes when a sandbox is made".into(),
                });
                continue;
            }
            "STOPSIGNAL" | "HEALTHCHECK" => {
                warnings.push(Warning {
                    line,
                    message: format!(
                        "{upper} ignored: sandboxes are stopped and watched by Sandcell"
                    ),
                });
                continue;
            }
            "MAINTAINER" => {
                warnings.push(Warning {
                    line,
                    message: "MAINTAINER ignored (deprecated): use LABEL".into(),
                });
                continue;
            }
            "ONBUILD" => {
                return Err(err(
                    line,
                    "ONBUILD is not supported: a template is built from its own file only",
                ));
            }
            _ => {
                return Err(err(line, format!("unknown instruction '{keyword}'")));
            }
        };
        instructions.push(Instruction { line, step });
    }
    if !seen_from {
        return Err(err(
            instructions.last().map_or(1, |i| i.line),
            "no FROM: say which base to build on (FROM debian:bookworm, FROM host, or an imported image)",
        ));
    }
    Ok(Parsed {
        instructions,
        warnings,
    })
}

fn err(line: usize, message: impl Into<String>) -> ParseError {
    ParseError {
        line,
        message: message.into(),
    }
}

/// The instructions of `text` as (first line, text with continuations joined).
fn logical_lines(text: &str) -> Result<Vec<(usize, String)>, ParseError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut escape = '\\';
    let mut i = 0;
    // Parser directives: `# name=value` lines at the very top.
    while let Some(line) = lines.get(i) {
        let Some(body) = line.trim().strip_prefix('#') else {
            break;
        };
        let Some((name, value)) = body.split_once('=') else {
            break;
        };
        let name = name.trim().to_ascii_lowercase();
        if name.is_empty() || name.contains(char::is_whitespace) {
            break;
        }
        if name == "escape" {
            escape = match value.trim() {
                "\\" => '\\',
                "`" => '`',
                other => {
                    return Err(err(
                        i + 1,
                        format!(
                            "escape directive '{other}': only \\ or ` can be the escape character"
                        ),
                    ));
                }
            };
        }
        i += 1;
    }
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, raw) in lines.iter().enumerate().skip(i) {
        let trimmed = raw.trim();
        if current.is_none() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        // Inside an instruction, comment lines are dropped and empty lines skipped.
        if current.is_some() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        let body = raw.trim_end();
        let (text, continues) = match body.strip_suffix(escape) {
            Some(head) => (head, true),
            None => (body, false),
        };
        match &mut current {
            Some((_, acc)) => acc.push_str(text),
            None => current = Some((n + 1, text.trim_start().to_string())),
        }
        if !continues && let Some(done) = current.take() {
            out.push(done);
        }
    }
    if let Some(done) = current.take() {
        out.push(done);
    }
    for (line, text) in &out {
        if has_heredoc(text) {
            return Err(err(
                *line,
                "heredocs (<<EOF) are not supported: put the script in the context and COPY it, or join the lines with &&",
            ));
        }
    }
    Ok(out)
}

/// Whether a `RUN`/`COPY`/`ADD` line uses a heredoc (`<<EOF`, `<<-"EOF"`), which would
/// otherwise be taken as more instructions.
fn has_heredoc(text: &str) -> bool {
    let keyword = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase();
    if !matches!(keyword.as_str(), "RUN" | "COPY" | "ADD") {
        return false;
    }
    text.split_whitespace().any(|word| {
        let Some(rest) = word.strip_prefix("<<") else {
            return false;
        };
        let rest = rest.strip_prefix('-').unwrap_or(rest);
        let rest = rest.trim_start_matches(['"', '\'']);
        rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
    })
}

/// Leading `--name=value` flags of an instruction, and what follows them.
fn flags(rest: &str) -> (Vec<(String, String)>, &str) {
    let mut out = Vec::new();
    let mut rest = rest.trim_start();
    while let Some(after) = rest.strip_prefix("--") {
        let end = after.find(char::is_whitespace).unwrap_or(after.len());
        let flag = &after[..end];
        let (name, value) = flag.split_once('=').unwrap_or((flag, ""));
        out.push((name.to_ascii_lowercase(), value.to_string()));
        rest = after[end..].trim_start();
    }
    (out, rest)
}

fn parse_from(line: usize, rest: &str, warnings: &mut Vec<Warning>) -> Result<Step, ParseError> {
    let (flags, rest) = flags(rest);
    for (name, _) in flags {
        if name == "platform" {
            warnings.push(Warning {
                line,
                message: "FROM --platform ignored: templates are built for this machine".into(),
            });
        } else {
            return Err(err(line, format!("FROM --{name} is not supported")));
        }
    }
    let words: Vec<&str> = rest.split_whitespace().collect();
    match words.as_slice() {
        [image] => Ok(Step::From {
            image: (*image).to_string(),
        }),
        [image, kw, _alias] if kw.eq_ignore_ascii_case("as") => {
            // A stage name matters only to multi-stage builds, which are refused.
            Ok(Step::From {
                image: (*image).to_string(),
            })
        }
        [] => Err(err(line, "FROM needs an image")),
        _ => Err(err(
            line,
            format!("FROM '{rest}': expected 'FROM image [AS name]'"),
        )),
    }
}

fn parse_args(line: usize, rest: &str) -> Result<Vec<Step>, ParseError> {
    let words = words(line, rest)?;
    if words.is_empty() {
        return Err(err(line, "ARG needs a name"));
    }
    words
        .into_iter()
        .map(|w| {
            let (name, default) = match w.split_once('=') {
                Some((n, d)) => (n.to_string(), Some(d.to_string())),
                None => (w, None),
            };
            check_name(line, "ARG", &name)?;
            Ok(Step::Arg { name, default })
        })
        .collect()
}

/// `key=value …` pairs, or the legacy `key value with spaces`.
fn parse_pairs(line: usize, what: &str, rest: &str) -> Result<Vec<(String, String)>, ParseError> {
    let first = rest.split_whitespace().next().unwrap_or_default();
    if first.is_empty() {
        return Err(err(line, format!("{what} needs key=value")));
    }
    if !first.contains('=') {
        let (key, value) = rest
            .split_once(char::is_whitespace)
            .map(|(k, v)| (k, v.trim()))
            .unwrap_or((rest, ""));
        if value.is_empty() {
            return Err(err(
                line,
                format!("{what} {key}: no value (write {key}=value)"),
            ));
        }
        check_name(line, what, key)?;
        return Ok(vec![(key.to_string(), unquote_all(line, value)?)]);
    }
    let mut pairs = Vec::new();
    for w in words(line, rest)? {
        let Some((k, v)) = w.split_once('=') else {
            return Err(err(line, format!("{what}: '{w}' is not key=value")));
        };
        if what == "ENV" {
            check_name(line, what, k)?;
        } else if k.is_empty() {
            return Err(err(line, format!("{what}: an empty key")));
        }
        pairs.push((k.to_string(), v.to_string()));
    }
    Ok(pairs)
}

fn check_name(line: usize, what: &str, name: &str) -> Result<(), ParseError> {
    let ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(err(
            line,
            format!("{what}: '{name}' is not a variable name (letters, digits, _)"),
        ))
    }
}

/// Whitespace-separated words, with double and single quotes grouping and `\` escaping (as
/// in `ENV a="b c"`); the quotes are removed. Variables stay as written.
fn words(line: usize, text: &str) -> Result<Vec<String>, ParseError> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (Some(q), c) if c == q => quote = None,
            (Some('\''), c) => word.push(c),
            (_, '\\') => {
                in_word = true;
                match chars.next() {
                    // `\$` stays escaped, so that substitution leaves a literal `$`.
                    Some('$') => word.push_str("\\$"),
                    Some(next) => word.push(next),
                    None => word.push('\\'),
                }
            }
            (_, c) => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if quote.is_some() {
        return Err(err(line, "a quote is not closed"));
    }
    if in_word {
        out.push(word);
    }
    Ok(out)
}

/// A legacy-form value with its quotes removed.
fn unquote_all(line: usize, value: &str) -> Result<String, ParseError> {
    if value.contains(['"', '\'']) {
        Ok(words(line, value)?.join(" "))
    } else {
        Ok(value.to_string())
    }
}

fn one_word(line: usize, what: &str, rest: &str) -> Result<String, ParseError> {
    let words = words(line, rest)?;
    match words.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(err(line, format!("{what} needs a value"))),
        _ => Err(err(line, format!("{what} takes one value, got '{rest}'"))),
    }
}

/// The JSON array form (`["a", "b"]`), when `rest` is one.
fn exec_form(rest: &str) -> Option<Vec<String>> {
    if !rest.starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(rest).ok()
}

fn command(line: usize, what: &str, rest: &str) -> Result<Command, ParseError> {
    if rest.is_empty() {
        return Err(err(line, format!("{what} needs a command")));
    }
    Ok(match exec_form(rest) {
        Some(argv) if argv.is_empty() => {
            return Err(err(line, format!("{what} []: an empty command")));
        }
        Some(argv) => Command::Exec(argv),
        None => Command::Shell(rest.to_string()),
    })
}

fn parse_run(line: usize, rest: &str) -> Result<Step, ParseError> {
    let (flags, rest) = flags(rest);
    let mut cache = Vec::new();
    for (name, value) in flags {
        match name.as_str() {
            "mount" => cache.push(cache_mount(line, &value)?),
            "network" => {
                return Err(err(
                    line,
                    "RUN --network is not supported: a build's network is its template's policy (through the egress proxy)",
                ));
            }
            other => return Err(err(line, format!("RUN --{other} is not supported"))),
        }
    }
    Ok(Step::Run {
        command: command(line, "RUN", rest)?,
        cache,
    })
}

/// `type=cache,target=/root/.cache/pip[,id=pip][,sharing=…]`.
fn cache_mount(line: usize, spec: &str) -> Result<CacheMount, ParseError> {
    let mut kind = None;
    let mut target = None;
    let mut id = None;
    for part in spec.split(',') {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        match k.trim().to_ascii_lowercase().as_str() {
            "type" => kind = Some(v.to_string()),
            "target" | "dst" | "destination" => target = Some(v.to_string()),
            "id" => id = Some(v.to_string()),
            // Every step here runs alone: shared, private and locked mean the same.
            "sharing" | "mode" | "uid" | "gid" => {}
            other => {
                return Err(err(
                    line,
                    format!("RUN --mount: '{other}' is not supported for a cache mount"),
                ));
            }
        }
    }
    match kind.as_deref() {
        Some("cache") => {}
        Some(other) => {
            return Err(err(
                line,
                format!("RUN --mount=type={other} is not supported: only type=cache"),
            ));
        }
        None => return Err(err(line, "RUN --mount needs type=cache")),
    }
    let Some(target) = target.filter(|t| t.starts_with('/')) else {
        return Err(err(
            line,
            "RUN --mount=type=cache needs an absolute target=",
        ));
    };
    Ok(CacheMount {
        id: id
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| target.clone()),
        target,
    })
}

fn parse_copy(
    line: usize,
    rest: &str,
    add: bool,
    warnings: &mut Vec<Warning>,
) -> Result<Step, ParseError> {
    let what = if add { "ADD" } else { "COPY" };
    let (flags, rest) = flags(rest);
    let mut chown = None;
    let mut chmod = None;
    for (name, value) in flags {
        match name.as_str() {
            "chown" => chown = Some(value),
            "chmod" => chmod = Some(value),
            "from" => {
                return Err(err(
                    line,
                    format!(
                        "{what} --from: multi-stage builds are not supported (copy from the build context)"
                    ),
                ));
            }
            "link" => warnings.push(Warning {
                line,
                message: format!("{what} --link ignored: every layer here is made apart anyway"),
            }),
            other => return Err(err(line, format!("{what} --{other} is not supported"))),
        }
    }
    let mut paths = match exec_form(rest) {
        Some(list) => list,
        None => words(line, rest)?,
    };
    if paths.len() < 2 {
        return Err(err(
            line,
            format!("{what} needs a source and a destination"),
        ));
    }
    let dest = paths.pop().unwrap_or_default();
    for source in &paths {
        if source.contains("://") || source.starts_with("git@") {
            return Err(err(
                line,
                format!(
                    "{what} {source}: only files of the build context can be copied (download in a RUN step, through the egress proxy)"
                ),
            ));
        }
    }
    Ok(Step::Copy {
        sources: paths,
        dest,
        chown,
        chmod,
        add,
    })
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Shell(s) => f.write_str(s),
            Command::Exec(argv) => write!(
                f,
                "{}",
                serde_json::to_string(argv).unwrap_or_else(|_| argv.join(" "))
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(text: &str) -> Vec<(usize, Step)> {
        parse(text)
            .expect("parses")
            .instructions
            .into_iter()
            .map(|i| (i.line, i.step))
            .collect()
    }

    fn error(text: &str) -> ParseError {
        parse(text).expect_err("refused")
    }

    #[test]
    fn every_supported_instruction_is_read_with_its_line() {
        let text = r#"# a comment
ARG BASE=debian:bookworm
FROM ${BASE} AS build
arg VERSION
ENV A=1 B="two words" C=three\ words
ENV LEGACY value with spaces
LABEL org.opencontainers.image.title="demo" team=ml
WORKDIR /app
USER root:root
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN --mount=type=cache,target=/root/.cache/pip pip install \
    # a comment inside is dropped
    numpy && \

    echo done
RUN ["/bin/echo", "exec form"]
COPY --chown=65532 --chmod=0644 src/ lib.py /app/
ADD data.tar.gz /data
CMD ["python3", "main.py"]
ENTRYPOINT /bin/sh -c main
"#;
        let got = steps(text);
        let expect = vec![
            (
                2,
                Step::Arg {
                    name: "BASE".into(),
                    default: Some("debian:bookworm".into()),
                },
            ),
            (
                3,
                Step::From {
                    image: "${BASE}".into(),
                },
            ),
            (
                4,
                Step::Arg {
                    name: "VERSION".into(),
                    default: None,
                },
            ),
            (
                5,
                Step::Env(vec![
                    ("A".into(), "1".into()),
                    ("B".into(), "two words".into()),
                    ("C".into(), "three words".into()),
                ]),
            ),
            (
                6,
                Step::Env(vec![("LEGACY".into(), "value with spaces".into())]),
            ),
            (
                7,
                Step::Label(vec![
                    ("org.opencontainers.image.title".into(), "demo".into()),
                    ("team".into(), "ml".into()),
                ]),
            ),
            (8, Step::Workdir("/app".into())),
            (9, Step::User("root:root".into())),
            (
                10,
                Step::Shell(vec![
                    "/bin/bash".into(),
                    "-o".into(),
                    "pipefail".into(),
                    "-c".into(),
                ]),
            ),
            (
                11,
                Step::Run {
                    command: Command::Shell("pip install     numpy &&     echo done".into()),
                    cache: vec![CacheMount {
                        target: "/root/.cache/pip".into(),
                        id: "/root/.cache/pip".into(),
                    }],
                },
            ),
            (
                16,
                Step::Run {
                    command: Command::Exec(vec!["/bin/echo".into(), "exec form".into()]),
                    cache: vec![],
                },
            ),
            (
                17,
                Step::Copy {
                    sources: vec!["src/".into(), "lib.py".into()],
                    dest: "/app/".into(),
                    chown: Some("65532".into()),
                    chmod: Some("0644".into()),
                    add: false,
                },
            ),
            (
                18,
                Step::Copy {
                    sources: vec!["data.tar.gz".into()],
                    dest: "/data".into(),
                    chown: None,
                    chmod: None,
                    add: true,
                },
            ),
            (
                19,
                Step::Cmd(Command::Exec(vec!["python3".into(), "main.py".into()])),
            ),
            (
                20,
                Step::Entrypoint(Command::Shell("/bin/sh -c main".into())),
            ),
        ];
        assert_eq!(got, expect);
    }

    #[test]
    fn ignorable_instructions_are_warned_about_with_their_line() {
        let parsed = parse(
            "FROM host\nEXPOSE 8080\nVOLUME /data\nHEALTHCHECK CMD true\nMAINTAINER me\nCOPY --link a /b\n",
        )
        .expect("parses");
        let lines: Vec<usize> = parsed.warnings.iter().map(|w| w.line).collect();
        assert_eq!(lines, vec![2, 3, 4, 5, 6]);
        assert!(
            parsed.warnings[0].message.contains("preview"),
            "{:?}",
            parsed.warnings
        );
        assert_eq!(parsed.instructions.len(), 2);
    }

    #[test]
    fn what_cannot_be_built_is_refused_with_its_line() {
        let cases: &[(&str, usize, &str)] = &[
            ("FROM host\nRUN true\nFROM host\n", 3, "multi-stage"),
            ("FROM host\n\nCOPY --from=build /a /b\n", 3, "multi-stage"),
            (
                "FROM host\nADD https://example.org/x.tgz /x\n",
                2,
                "build context",
            ),
            ("FROM host\nONBUILD RUN true\n", 2, "ONBUILD"),
            (
                "FROM host\nFROBNICATE x\n",
                2,
                "unknown instruction 'FROBNICATE'",
            ),
            ("RUN true\n", 1, "before FROM"),
            ("# only a comment\nARG A=1\n", 2, "no FROM"),
            (
                "FROM host\nRUN --mount=type=secret,id=x true\n",
                2,
                "only type=cache",
            ),
            (
                "FROM host\nRUN --mount=type=cache true\n",
                2,
                "absolute target",
            ),
            ("FROM host\nRUN --network=none true\n", 2, "egress proxy"),
            ("FROM host\nRUN cat <<EOF > /x\nhello\nEOF\n", 2, "heredocs"),
            ("FROM host\nRUN\n", 2, "needs a command"),
            ("FROM host\nSHELL /bin/bash -c\n", 2, "JSON array"),
            ("FROM host\nCOPY onlyone\n", 2, "a source and a destination"),
            ("FROM host\nENV 1BAD=x\n", 2, "not a variable name"),
            ("FROM host\nENV A=\"open\n", 2, "not closed"),
            ("FROM host\nWORKDIR a b\n", 2, "one value"),
            ("FROM host\n\n\nENV KEY\n", 4, "no value"),
            ("# escape=x\nFROM host\n", 1, "escape"),
        ];
        for (text, line, needle) in cases {
            let e = error(text);
            assert_eq!(e.line, *line, "{text:?}: {e}");
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
            assert!(e.to_string().starts_with(&format!("line {line}: ")), "{e}");
        }
    }

    #[test]
    fn the_escape_directive_and_herestrings_and_shifts_are_not_heredocs() {
        let got =
            steps("# escape=`\nFROM host\nRUN echo a `\n  b\nRUN cat <<< \"x\"; echo $((1<<2))\n");
        assert_eq!(
            got[1],
            (
                3,
                Step::Run {
                    command: Command::Shell("echo a   b".into()),
                    cache: vec![]
                }
            )
        );
        assert!(matches!(&got[2].1, Step::Run { .. }));
    }

    #[test]
    fn several_args_in_one_instruction_are_one_each() {
        let got = steps("ARG A=1 B\nFROM host\n");
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[1],
            (
                1,
                Step::Arg {
                    name: "B".into(),
                    default: None
                }
            )
        );
    }

    #[test]
    fn a_huge_file_is_refused_before_it_is_read() {
        let text = "#".repeat(MAX_BYTES + 1);
        assert!(error(&text).message.contains("more than"));
    }
}
