//! `.dockerignore`: the build context's files that `COPY`/`ADD` never see and that the CLI
//! does not send to the daemon, with Docker's rules:
//!
//! - one pattern per line; `#` starts a comment line; blank lines and surrounding spaces go;
//! - patterns are paths relative to the context (a leading `/` is dropped, `.` and `..`
//!   cleaned), matched segment by segment with `*`, `?`, `[…]` inside a segment and `**`
//!   for any number of segments;
//! - a pattern matching a folder excludes everything in it;
//! - `!pattern` takes back what earlier patterns excluded; the last matching line wins.

use std::path::Path;

use crate::BuildError;
use crate::stage::glob_match;

/// The name of the file in the context's root.
pub const FILE_NAME: &str = ".dockerignore";

/// The patterns of one `.dockerignore`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextIgnore {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    /// `!pattern`: takes back.
    keep: bool,
    segments: Vec<String>,
}

impl ContextIgnore {
    /// Reads `context/.dockerignore` (none: nothing is ignored).
    pub fn read(context: &Path) -> Result<Self, BuildError> {
        let path = context.join(FILE_NAME);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Self::parse(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(BuildError::io(format!("read {}", path.display()))(e)),
        }
    }

    /// The patterns of a `.dockerignore` text.
    pub fn parse(text: &str) -> Self {
        let rules = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|line| {
                let (keep, pattern) = match line.strip_prefix('!') {
                    Some(rest) => (true, rest.trim()),
                    None => (false, line),
                };
                let segments = clean(pattern);
                (!segments.is_empty()).then_some(Rule { keep, segments })
            })
            .collect();
        Self { rules }
    }

    /// Whether nothing is ignored.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether `rel` (a path relative to the context, `/`-separated) is left out: by the last
    /// pattern that matches it or one of its parent folders.
    pub fn excludes(&self, rel: &str) -> bool {
        let path = clean(rel);
        if path.is_empty() {
            return false;
        }
        let mut excluded = false;
        for rule in &self.rules {
            let hit = (1..=path.len()).any(|n| matches(&rule.segments, &path[..n]));
            if hit {
                excluded = !rule.keep;
            }
        }
        excluded
    }

    /// Whether a copy (or the context sent to the daemon) takes `rel`: not left out, or a
    /// folder left out that may hold something taken back (its contents then picked one by
    /// one).
    pub fn keeps(&self, rel: &str, is_folder: bool) -> bool {
        !self.excludes(rel) || (is_folder && self.may_take_back_inside(rel))
    }

    /// Whether a folder left out may still hold something a `!` pattern takes back (then its
    /// contents must be looked at one by one).
    pub fn may_take_back_inside(&self, rel: &str) -> bool {
        let prefix = clean(rel);
        self.rules.iter().any(|r| {
            r.keep
                && (r.segments.iter().any(|s| s == "**")
                    || r.segments.len() > prefix.len()
                        && matches(&r.segments[..prefix.len()], &prefix))
        })
    }
}

/// A pattern or path as segments: no leading `/`, no `.`, `..` applied (never above the root).
fn clean(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            p => out.push(p.to_string()),
        }
    }
    out
}

/// Whether pattern segments match path segments (`**` matches any number, none included).
fn matches(pattern: &[String], path: &[String]) -> bool {
    match pattern.first() {
        None => path.is_empty(),
        Some(p) if p == "**" => (0..=path.len()).any(|i| matches(&pattern[1..], &path[i..])),
        Some(p) => {
            !path.is_empty() && glob_match(p, &path[0]) && matches(&pattern[1..], &path[1..])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_follow_dockers_rules() {
        let ignore = ContextIgnore::parse(
            "# comment\n\n node_modules \n/build\n*.log\n**/__pycache__\ndocs/**/*.md\n!docs/keep.md\n.git\n",
        );
        for out in [
            "node_modules",
            "node_modules/x/index.js",
            "build/a.o",
            "app.log",
            "src/__pycache__/m.pyc",
            "__pycache__",
            "docs/a/b/c.md",
            "docs/c.md",
            ".git/HEAD",
        ] {
            assert!(ignore.excludes(out), "{out}");
        }
        for kept in [
            "src/node_modules",
            "src/app.log",
            "docs/keep.md",
            "docs/a.txt",
            "app.py",
            ".gitignore",
        ] {
            assert!(!ignore.excludes(kept), "{kept}");
        }
        // The last matching line wins.
        let again = ContextIgnore::parse("*.md\n!README.md\nREADME.md\n");
        assert!(again.excludes("README.md"));
        assert!(ContextIgnore::parse("").is_empty());
        // `..` never climbs above the context.
        assert!(ContextIgnore::parse("../x").excludes("x"));
    }

    #[test]
    fn a_folder_left_out_is_looked_into_only_when_a_take_back_may_reach_inside() {
        let ignore = ContextIgnore::parse("data\n!data/keep.csv\nlogs\n");
        assert!(ignore.excludes("data") && !ignore.excludes("data/keep.csv"));
        assert!(ignore.may_take_back_inside("data"));
        assert!(!ignore.may_take_back_inside("logs"));
    }
}
