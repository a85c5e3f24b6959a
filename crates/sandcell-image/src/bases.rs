//! What a `FROM` names, found without an image registry (none is reachable here):
//!
//! - `host`: the host's own system, as host-based sandboxes have it;
//! - an image in the store (imported, or built before), by its name (`name` means
//!   `name:latest` too);
//! - `debian:<suite>` (`bookworm`, `trixie`, `12`, …): made with `mmdebstrap --variant=minbase`
//!   from the machine's configured Debian mirror, once, then kept in the store under that
//!   name;
//! - anything else is refused at once, saying how to import it.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::import::import;
use crate::{Image, ImageError, Store};

/// A resolved base.
#[derive(Debug, Clone, PartialEq)]
pub enum Base {
    /// The host's system.
    Host,
    /// An image of the store.
    Image(Box<Image>),
}

/// How Debian bases are made.
#[derive(Debug, Clone, Default)]
pub struct DebianOptions {
    /// The mirror (default: the first Debian archive in the machine's apt sources, else
    /// mmdebstrap's own default).
    pub mirror: Option<String>,
    /// The `mmdebstrap` program (default: found on `PATH`).
    pub mmdebstrap: Option<PathBuf>,
}

/// What resolving a base did.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The base.
    pub base: Base,
    /// It was made now (a Debian base's first use), and how long that took.
    pub made: Option<Duration>,
}

/// Resolves `name` (what `FROM` says) against `store`, making a Debian base when needed.
pub fn resolve(store: &Store, name: &str, debian: &DebianOptions) -> Result<Resolved, ImageError> {
    if name == "host" {
        return Ok(Resolved {
            base: Base::Host,
            made: None,
        });
    }
    if let Some(image) = store.lookup(name)? {
        return Ok(Resolved {
            base: Base::Image(Box::new(image)),
            made: None,
        });
    }
    if let Some(suite) = name.strip_prefix("debian:") {
        let suite = debian_suite(suite).ok_or_else(|| {
            ImageError::Invalid(format!(
                "FROM {name}: '{suite}' is not a Debian suite (bookworm, trixie, bullseye, sid, stable, testing, 11, 12, 13)"
            ))
        })?;
        // Two builds from the same new base make it once: the second waits, then finds it.
        let _making = store.job_lock(&format!("debian-{suite}"))?;
        if let Some(image) = store.lookup(name)? {
            return Ok(Resolved {
                base: Base::Image(Box::new(image)),
                made: None,
            });
        }
        let start = Instant::now();
        make_debian(store, name, suite, debian)?;
        let image = store.image(name)?.ok_or_else(|| {
            ImageError::Corrupt(format!("{name} was made but is not in the store"))
        })?;
        return Ok(Resolved {
            base: Base::Image(Box::new(image)),
            made: Some(start.elapsed()),
        });
    }
    Err(ImageError::Invalid(format!(
        "FROM {name}: no image of that name is in the store, and no image registry can be reached from here; import it first: \
         `sandcell image import FILE --as {name}` (a `docker save` archive, an OCI layout or archive, or a root filesystem tarball), \
         or start from `debian:<suite>`"
    )))
}

/// The suite mmdebstrap takes for what `debian:` names.
fn debian_suite(s: &str) -> Option<&str> {
    Some(match s {
        "11" => "bullseye",
        "12" => "bookworm",
        "13" => "trixie",
        "latest" => "stable",
        s if !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') => s,
        _ => return None,
    })
}

/// The first Debian archive (not the security one) in the machine's apt sources.
pub fn host_debian_mirror() -> Option<String> {
    let mut texts = Vec::new();
    for dir in ["/etc/apt/sources.list.d"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            for p in paths {
                if let Ok(t) = std::fs::read_to_string(&p) {
                    texts.push(t);
                }
            }
        }
    }
    if let Ok(t) = std::fs::read_to_string("/etc/apt/sources.list") {
        texts.push(t);
    }
    texts.iter().find_map(|t| mirror_in(t))
}

/// A Debian archive URL in an apt sources text (one-line or deb822 form).
fn mirror_in(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.trim();
        let urls: Vec<&str> = if let Some(rest) = line.strip_prefix("URIs:") {
            rest.split_whitespace().collect()
        } else if let Some(rest) = line.strip_prefix("deb ") {
            // Options in brackets may span several words.
            let rest = match rest.trim_start().strip_prefix('[') {
                Some(opts) => opts.split_once(']').map_or("", |(_, after)| after),
                None => rest,
            };
            rest.split_whitespace().take(1).collect()
        } else {
            Vec::new()
        };
        urls.into_iter()
            .find(|u| {
                (u.starts_with("http://") || u.starts_with("https://"))
                    && u.trim_end_matches('/').ends_with("/debian")
            })
            .map(ToString::to_string)
    })
}

fn make_debian(
    store: &Store,
    name: &str,
    suite: &str,
    opts: &DebianOptions,
) -> Result<(), ImageError> {
    let program = opts
        .mmdebstrap
        .clone()
        .unwrap_or_else(|| PathBuf::from("mmdebstrap"));
    let (placeholder, file) = store.temp_file()?;
    drop(file);
    let _ = std::fs::remove_file(&placeholder);
    let tar = placeholder.with_extension("tar");
    // mmdebstrap unpacks the whole system into its TMPDIR before packing the tarball.
    let scratch = store.temp_dir()?;
    let mut cmd = Command::new(&program);
    cmd.args(["--variant=minbase", "--format=tar", "--quiet", suite])
        .arg(&tar)
        .env("TMPDIR", &scratch);
    if let Some(m) = opts.mirror.clone().or_else(host_debian_mirror) {
        cmd.arg(m);
    }
    let out = cmd.output().map_err(|e| {
        ImageError::Invalid(format!(
            "FROM {name}: cannot run {} ({e}); install mmdebstrap (scripts/setup.sh does)",
            program.display()
        ))
    })?;
    let result = if out.status.success() {
        import(store, &tar, name, None).map(|_| ())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(ImageError::Invalid(format!(
            "FROM {name}: mmdebstrap failed ({}): {}",
            out.status,
            tail.join(" | ")
        )))
    };
    let _ = std::fs::remove_file(&tar);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suites_and_mirrors_are_read_as_apt_writes_them() {
        assert_eq!(debian_suite("12"), Some("bookworm"));
        assert_eq!(debian_suite("trixie"), Some("trixie"));
        assert_eq!(debian_suite("Bookworm"), None);
        assert_eq!(debian_suite("../x"), None);
        let deb822 = "Types: deb\nURIs: http://mirror.test/debian\nSuites: bookworm\n\nTypes: deb\nURIs: http://mirror.test/debian-security\n";
        assert_eq!(
            mirror_in(deb822).as_deref(),
            Some("http://mirror.test/debian")
        );
        let one_line = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] https://mirror.test/debian/ bookworm main\n";
        assert_eq!(
            mirror_in(one_line).as_deref(),
            Some("https://mirror.test/debian/")
        );
        assert_eq!(
            mirror_in("deb http://mirror.test/ubuntu jammy main\n"),
            None
        );
    }

    #[test]
    fn a_base_that_cannot_be_had_here_says_how_to_import_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path()).expect("store");
        let e = resolve(&store, "ubuntu:22.04", &DebianOptions::default()).expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("sandcell image import FILE --as ubuntu:22.04"),
            "{text}"
        );
        assert_eq!(
            resolve(&store, "host", &DebianOptions::default())
                .expect("host")
                .base,
            Base::Host
        );
        let e = resolve(&store, "debian:Nope!", &DebianOptions::default()).expect_err("suite");
        assert!(e.to_string().contains("not a Debian suite"), "{e}");
        let missing = DebianOptions {
            mirror: None,
            mmdebstrap: Some("/nonexistent/mmdebstrap".into()),
        };
        let e = resolve(&store, "debian:bookworm", &missing).expect_err("no mmdebstrap");
        assert!(e.to_string().contains("install mmdebstrap"), "{e}");
        // `name` finds `name:latest`.
        let layer = store
            .put_bytes(b"", crate::store::LAYER_TAR)
            .expect("layer");
        store
            .tag("mine:latest", &[layer], &serde_json::json!({}))
            .expect("tag");
        assert!(matches!(
            resolve(&store, "mine", &DebianOptions::default())
                .expect("found")
                .base,
            Base::Image(_)
        ));
    }
}
