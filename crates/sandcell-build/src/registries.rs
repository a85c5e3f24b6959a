//! The package registries a build may reach by default: the ones this machine is configured
//! to use (its apt sources, pip's index, npm's registry), read from the machine's own
//! configuration, so a build reaches what the host's package managers reach and nothing
//! else. A request adds hosts of its own.

use std::fs;
use std::process::Command;

/// Hosts of the machine's package sources, sorted, without duplicates.
pub fn configured_hosts() -> Vec<String> {
    let mut hosts = Vec::new();
    hosts.extend(apt_hosts());
    hosts.extend(pip_hosts());
    hosts.extend(npm_hosts());
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Hosts of the enabled apt sources (`*.list` one-line and `*.sources` deb822 files).
pub fn apt_hosts() -> Vec<String> {
    let mut files = vec!["/etc/apt/sources.list".to_string()];
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".list") || name.ends_with(".sources") {
                files.push(e.path().to_string_lossy().into_owned());
            }
        }
    }
    let mut hosts = Vec::new();
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().collect()
            } else if line.starts_with("deb ") || line.starts_with("deb-src ") {
                line.split_whitespace().collect()
            } else {
                continue;
            };
            hosts.extend(words.into_iter().filter_map(url_host));
        }
    }
    hosts
}

/// pip's index (its configuration, else pip's built-in default) and file host.
fn pip_hosts() -> Vec<String> {
    let configured = Command::new("python3")
        .args(["-m", "pip", "config", "get", "global.index-url"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(host) = configured.as_deref().and_then(url_host) {
        return vec![host];
    }
    let defaults = Command::new("python3")
        .args([
            "-c",
            "from pip._internal.models.index import PyPI; print(PyPI.simple_url); print(PyPI.file_storage_domain)",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    defaults
        .lines()
        .filter_map(|l| {
            url_host(l).or_else(|| (!l.trim().is_empty()).then(|| l.trim().to_string()))
        })
        .collect()
}

/// npm's registry.
fn npm_hosts() -> Vec<String> {
    Command::new("npm")
        .args(["config", "get", "registry"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| url_host(String::from_utf8_lossy(&o.stdout).trim()))
        .into_iter()
        .collect()
}

/// The host of an `http(s)://host[:port]/…` URL.
fn url_host(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let authority = rest.split('/').next()?;
    let host = authority.rsplit('@').next()?;
    let host = host.split(':').next()?;
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_gives_its_host() {
        assert_eq!(
            url_host("http://mirror.example/debian").as_deref(),
            Some("mirror.example")
        );
        assert_eq!(
            url_host("https://u:p@h.example:8443/x").as_deref(),
            Some("h.example")
        );
        assert_eq!(url_host("ftp://x"), None);
    }
}
