//! Previews: reaching a server running inside a sandbox through the daemon, at
//! `/v1/sandboxes/{id}/ports/{port}/…` or at the host `{port}-{id}.localhost`, with the API
//! key, a signed expiring token for that port, or nothing when its owner made it public.

use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// Longest a preview token may live.
pub const MAX_PREVIEW_TTL_SECS: u64 = 7 * 24 * 3600;
/// A preview token's life when the request names none.
pub const DEFAULT_PREVIEW_TTL_SECS: u64 = 3600;

/// `POST /v1/sandboxes/{id}/previews/{port}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreatePreview {
    /// How long the token is valid, in seconds (default 3600, at most 7 days).
    pub ttl_secs: Option<u64>,
    /// Anyone with the URL may reach the port, without a key or token, until the sandbox
    /// ends or it is made private again (`false`).
    pub public: Option<bool>,
}

impl CreatePreview {
    /// The token's life, checked.
    pub fn ttl(&self) -> Result<u64, ValidationError> {
        match self.ttl_secs {
            None => Ok(DEFAULT_PREVIEW_TTL_SECS),
            Some(t) if (1..=MAX_PREVIEW_TTL_SECS).contains(&t) => Ok(t),
            Some(t) => Err(ValidationError(format!(
                "ttl_secs {t} must be 1 to {MAX_PREVIEW_TTL_SECS}"
            ))),
        }
    }
}

/// How to reach a port of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PreviewInfo {
    /// The port inside the sandbox.
    pub port: u16,
    /// The path route on the daemon (`/v1/sandboxes/{id}/ports/{port}/`).
    pub path: String,
    /// The host route's name, `{port}-{id}.localhost` (browsers resolve `*.localhost` to
    /// loopback): `http://{host}:<the daemon's port>/`.
    pub host: String,
    /// A token for this port: `?sandcell_token=…` on a URL (the host route then keeps it in
    /// a cookie), or the `X-Sandcell-Token` header.
    pub token: String,
    /// When the token expires (RFC 3339).
    pub expires_at: String,
    /// Reachable without a key or token.
    pub public: bool,
}

/// Checks a port number for a preview (1 to 65535).
pub fn check_port(port: u32) -> Result<u16, ValidationError> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ValidationError(format!("port {port} must be 1 to 65535")))
}

/// The sandbox and port a host route names (`{port}-{id}.localhost`, any port after it).
pub fn parse_preview_host(host: &str) -> Option<(String, u16)> {
    let name = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let label = name.strip_suffix(".localhost")?;
    let (port, id) = label.split_once('-')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    crate::rules::check_sandbox_id(id).ok()?;
    Some((id.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_routes_name_a_port_and_a_sandbox() {
        assert_eq!(
            parse_preview_host("3000-sb-0123abcd.localhost:7070"),
            Some(("sb-0123abcd".to_string(), 3000))
        );
        assert_eq!(
            parse_preview_host("8080-sb-x1.localhost"),
            Some(("sb-x1".to_string(), 8080))
        );
        for bad in [
            "localhost:7070",
            "3000-sb-x.example.org",
            "0-sb-x.localhost",
            "x-sb-x.localhost",
            "3000-nope.localhost",
            "70000-sb-x.localhost",
        ] {
            assert_eq!(parse_preview_host(bad), None, "{bad}");
        }
    }

    #[test]
    fn ttls_and_ports_are_checked() {
        assert_eq!(CreatePreview::default().ttl().unwrap(), 3600);
        assert!(
            CreatePreview {
                ttl_secs: Some(0),
                public: None
            }
            .ttl()
            .is_err()
        );
        assert!(check_port(0).is_err());
        assert_eq!(check_port(3000).unwrap(), 3000);
        assert!(check_port(65536).is_err());
    }
}
