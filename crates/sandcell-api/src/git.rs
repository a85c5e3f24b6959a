//! `POST /v1/sandboxes/{id}/git/clone`: a repository cloned on the host, through the egress
//! proxy with only its host allowed, and copied into the sandbox (credentials never enter it).

use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// Longest repository URL.
pub const MAX_URL_CHARS: usize = 2048;
/// Longest branch or tag name.
pub const MAX_BRANCH_CHARS: usize = 255;

/// `POST /v1/sandboxes/{id}/git/clone`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GitClone {
    /// The repository: an `https://` (or `http://`) URL. Credentials in it
    /// (`https://user:token@host/…`) are taken out and used as `username` and `password`.
    pub url: String,
    /// Where in the sandbox (default `/workspace/<repository name>`); it must not exist or
    /// be an empty folder.
    pub path: Option<String>,
    /// The branch or tag to check out (default: the remote's default branch).
    pub branch: Option<String>,
    /// Only this many commits of history (a shallow clone).
    pub depth: Option<u32>,
    /// The user name for HTTP authentication (with `password`).
    pub username: Option<String>,
    /// The password or token for HTTP authentication; used on the host only, never written
    /// into the sandbox (its `.git/config` holds the URL without it).
    pub password: Option<String>,
}

/// What a clone brought into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GitCloneResult {
    /// Where it is in the sandbox (absolute).
    pub path: String,
    /// The checked-out commit.
    pub commit: String,
    /// The checked-out branch (absent for a detached tag).
    pub branch: Option<String>,
    /// Files copied in (the `.git` folder's included).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// How long the clone and the copy took.
    pub duration_ms: u64,
}

/// A clone request's URL, checked: scheme, host and port, the URL without credentials, and
/// the credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneUrl {
    /// `https` or `http`.
    pub scheme: String,
    /// The host (lower case; an IPv6 address without brackets).
    pub host: String,
    /// The port (the scheme's default when the URL names none).
    pub port: u16,
    /// The URL as git is given it and the sandbox sees it: without credentials.
    pub url: String,
    /// The repository's name (the last path segment without `.git`), for the default path.
    pub name: String,
    /// `username:password` taken out of the URL, if it had them.
    pub credentials: Option<(String, String)>,
}

fn bad(msg: String) -> ValidationError {
    ValidationError(msg)
}

/// Checks a repository URL: `https://` or `http://`, a host, an optional port, a path with a
/// repository name; nothing git would read as an option or another transport.
pub fn check_clone_url(url: &str) -> Result<CloneUrl, ValidationError> {
    if url.is_empty() || url.chars().count() > MAX_URL_CHARS {
        return Err(bad(format!(
            "a repository URL must be 1 to {MAX_URL_CHARS} characters"
        )));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(
            "a repository URL must not hold spaces or control characters".into(),
        ));
    }
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        bad(format!(
            "'{url}' is not an https:// or http:// URL (ssh, git:// and local paths are not cloned)"
        ))
    })?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" => 443,
        "http" => 80,
        _ => {
            return Err(bad(format!(
                "'{scheme}://' is not cloned: use an https:// or http:// URL"
            )));
        }
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (credentials, hostport) = match authority.rsplit_once('@') {
        Some((userinfo, hp)) => {
            let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            (Some((percent_decode(user)?, percent_decode(pass)?)), hp)
        }
        None => (None, authority),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| bad(format!("'{url}': an IPv6 host in [ ] has no ']'")))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| bad(format!("'{url}': bad port")))?,
            ),
        };
        (addr.to_string(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad(format!("'{url}': the port must be 1 to 65535")))?,
    };
    let host = crate::network::normalize_host(&host);
    let rule = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    rule.parse::<crate::network::HostRule>()
        .map_err(|e| bad(format!("'{url}': {e}")))?;
    let name = path
        .split(['?', '#'])
        .next()
        .unwrap_or("")
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("")
        .trim_end_matches(".git")
        .to_string();
    if name.is_empty() || name == "." || name == ".." || name.starts_with('-') {
        return Err(bad(format!(
            "'{url}' names no repository (its path must end in the repository's name)"
        )));
    }
    let port_part = if port == default_port {
        String::new()
    } else {
        format!(":{port}")
    };
    Ok(CloneUrl {
        url: format!("{scheme}://{rule}{port_part}{path}"),
        scheme,
        host,
        port,
        name,
        credentials,
    })
}

fn percent_decode(s: &str) -> Result<String, ValidationError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad("a repository URL's credentials have a bad %-escape".into()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad("a repository URL's credentials are not UTF-8".into()))
}

/// Checks a registry's URL (`https://` or `http://`, a host): its host and port, as a
/// network rule allowing them.
pub fn check_registry_url(url: &str) -> Result<crate::network::HostRule, ValidationError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad(format!("'{url}' is not an https:// or http:// URL")))?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" => 80,
        _ => return Err(bad(format!("'{url}' is not an https:// or http:// URL"))),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') || authority.is_empty() {
        return Err(bad(format!("'{url}' needs a host and no credentials")));
    }
    let rule = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:{default_port}")
    } else {
        authority.to_string()
    };
    rule.parse()
        .map_err(|e: String| bad(format!("'{url}': {e}")))
}

/// Checks a branch or tag name as git would accept it, and never as an option.
pub fn check_branch(name: &str) -> Result<(), ValidationError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_BRANCH_CHARS
        && !name.starts_with('-')
        && !name.starts_with('/')
        && !name.ends_with('/')
        && !name.ends_with(".lock")
        && !name.ends_with('.')
        && !name.contains("..")
        && !name.contains("//")
        && !name.contains("@{")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/-+".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "'{name}' is not a branch or tag name (letters, digits, '.', '_', '/', '-', '+'; \
             1 to {MAX_BRANCH_CHARS} characters, not starting with '-')"
        )))
    }
}

impl GitClone {
    /// Checks every field; returns the checked URL with the request's credentials (the URL's
    /// own, or `username`/`password`; both at once is an error).
    pub fn checked(&self) -> Result<CloneUrl, ValidationError> {
        let mut url = check_clone_url(&self.url)?;
        if let Some(b) = &self.branch {
            check_branch(b)?;
        }
        if let Some(d) = self.depth
            && !(1..=1_000_000).contains(&d)
        {
            return Err(bad(format!("depth {d} must be 1 to 1000000")));
        }
        if let Some(p) = &self.path {
            crate::files::check_path(p)?;
        }
        let given = match (&self.username, &self.password) {
            (None, None) => None,
            (Some(u), Some(p)) => Some((u.clone(), p.clone())),
            (Some(u), None) => Some((u.clone(), String::new())),
            (None, Some(p)) => Some(("git".to_string(), p.clone())),
        };
        if let Some((u, p)) = &given {
            if url.credentials.is_some() {
                return Err(bad(
                    "give credentials in the URL or as username/password, not both".into(),
                ));
            }
            if u.len() > 256
                || p.len() > 4096
                || u.contains(':')
                || u.contains('\n')
                || p.contains('\n')
            {
                return Err(bad(
                    "username (no ':', at most 256 bytes) or password (at most 4096 bytes) is bad"
                        .into(),
                ));
            }
            url.credentials = given;
        }
        Ok(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_lose_their_credentials() {
        let u = check_clone_url("https://User:s%40cret@Git.Example.org/team/repo.git").unwrap();
        assert_eq!(u.url, "https://git.example.org/team/repo.git");
        assert_eq!((u.host.as_str(), u.port), ("git.example.org", 443));
        assert_eq!(u.name, "repo");
        assert_eq!(
            u.credentials,
            Some(("User".to_string(), "s@cret".to_string()))
        );
        let u = check_clone_url("http://127.0.0.1:8080/repo").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.name.as_str()),
            ("127.0.0.1", 8080, "repo")
        );
        let u = check_clone_url("https://[::1]:9/x/y/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.url.as_str()),
            ("::1", "https://[::1]:9/x/y/")
        );
        for bad in [
            "",
            "git@github.example:a/b.git",
            "ssh://host/repo",
            "file:///etc",
            "ext::sh -c touch% /tmp/pwned",
            "https://host/",
            "https://host",
            "https://host:0/r",
            "https://-oProxyCommand=x/r",
            "https://host/r x",
        ] {
            assert!(check_clone_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn branches_depths_and_credentials_are_checked() {
        for ok in ["main", "release/1.2", "v1.0.0", "feature-x+y"] {
            assert!(check_branch(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-b", "a..b", "a b", "x.lock", "/x", "a@{1}", "x/"] {
            assert!(check_branch(bad).is_err(), "{bad}");
        }
        let req = |depth, user: Option<&str>, url: &str| GitClone {
            url: url.into(),
            depth,
            username: user.map(str::to_string),
            password: user.map(|_| "t".to_string()),
            ..GitClone::default()
        };
        assert!(req(Some(0), None, "https://h/r").checked().is_err());
        assert!(req(Some(1), None, "https://h/r").checked().is_ok());
        assert!(req(None, Some("a"), "https://u:p@h/r").checked().is_err());
        assert_eq!(
            req(None, Some("a"), "https://h/r")
                .checked()
                .unwrap()
                .credentials,
            Some(("a".to_string(), "t".to_string()))
        );
    }
}
