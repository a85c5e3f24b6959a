//! Finding a running daemon: its home, the `daemon.json` it leaves there, and the admin key
//! the first `serve` writes. Pure paths and types, so a client finds the daemon without
//! linking the server.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where a running service can be found (`<home>/daemon.json`, read by the CLI).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DaemonInfo {
    /// Its process id.
    pub pid: u32,
    /// Its base URL.
    pub url: String,
    /// Its UNIX socket, if any.
    pub unix_socket: Option<String>,
}

/// `<home>/daemon.json`.
pub fn daemon_info_path(home: &Path) -> PathBuf {
    home.join("daemon.json")
}

/// `<home>/admin.key`: the first admin key's secret, readable by its owner only.
pub fn admin_key_path(home: &Path) -> PathBuf {
    home.join("admin.key")
}

/// `$SANDCELL_HOME`, else `/var/lib/sandcell` as root, else `~/.local/share/sandcell`.
pub fn default_home() -> PathBuf {
    if let Some(h) = std::env::var_os("SANDCELL_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    if is_root() {
        return PathBuf::from("/var/lib/sandcell");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/share/sandcell"),
        None => PathBuf::from(".sandcell"),
    }
}

fn is_root() -> bool {
    // /proc/self is owned by the process's effective uid.
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_info_round_trip() {
        let home = Path::new("/srv/sc");
        assert_eq!(daemon_info_path(home), Path::new("/srv/sc/daemon.json"));
        assert_eq!(admin_key_path(home), Path::new("/srv/sc/admin.key"));
        let info: DaemonInfo =
            serde_json::from_str(r#"{"pid":7,"url":"http://127.0.0.1:1","unix_socket":null}"#)
                .expect("daemon.json parses");
        assert_eq!(info.pid, 7);
        assert_eq!(info.unix_socket, None);
    }
}
