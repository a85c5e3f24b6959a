//! Names to addresses, done by the proxy (never by the sandbox), so the addresses it checks
//! are the ones it connects to.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

/// What a name resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// Its addresses, in the resolver's order.
    pub addrs: Vec<IpAddr>,
    /// Set by the operator (a [`StaticResolver`] entry): its addresses count as named by a
    /// rule, whatever their class.
    pub pinned: bool,
}

/// A future a resolver answers with.
pub type ResolveFuture<'a> = Pin<Box<dyn Future<Output = io::Result<Resolution>> + Send + 'a>>;

/// Resolves host names for the proxy.
pub trait Resolver: Send + Sync + std::fmt::Debug {
    /// The addresses of `host` (a name or an address literal).
    fn resolve<'a>(&'a self, host: &'a str) -> ResolveFuture<'a>;
}

/// The host's resolver (`getaddrinfo` on a blocking thread, through tokio).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> ResolveFuture<'a> {
        Box::pin(async move {
            if let Ok(ip) = literal(host) {
                return Ok(Resolution {
                    addrs: vec![ip],
                    pinned: false,
                });
            }
            let addrs: Vec<IpAddr> = tokio::net::lookup_host((host, 0))
                .await?
                .map(|a| a.ip())
                .collect();
            if addrs.is_empty() {
                return Err(io::Error::new(io::ErrorKind::NotFound, "no address"));
            }
            Ok(Resolution {
                addrs,
                pinned: false,
            })
        })
    }
}

/// An address literal, bracketed or not.
fn literal(host: &str) -> Result<IpAddr, std::net::AddrParseError> {
    host.trim_start_matches('[').trim_end_matches(']').parse()
}

/// Names the operator maps to addresses (as `/etc/hosts` would), then another resolver for
/// the rest (none: every other name fails).
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    /// Each name's addresses, and whether they are pinned (set by the operator) rather than
    /// answered as a DNS server would.
    names: HashMap<String, (Vec<IpAddr>, bool)>,
    fallback: Option<Arc<dyn Resolver>>,
}

impl StaticResolver {
    /// A resolver of these names only.
    pub fn new(names: impl IntoIterator<Item = (String, Vec<IpAddr>)>) -> Self {
        Self {
            names: names
                .into_iter()
                .map(|(n, a)| (sandcell_api::network::normalize_host(&n), (a, true)))
                .collect(),
            fallback: None,
        }
    }

    /// Answers `name` with `addrs` as a DNS server would: not pinned, so the addresses are
    /// checked like any resolved ones (what a test of DNS rebinding needs).
    pub fn answer(mut self, name: &str, addrs: Vec<IpAddr>) -> Self {
        self.names
            .insert(sandcell_api::network::normalize_host(name), (addrs, false));
        self
    }

    /// A resolver from `name=IP[|IP…]` (pinned) and `name~IP[|IP…]` (answered) entries
    /// separated by `;` or `,` (the test-only `SANDCELL_TEST_RESOLVE` setting).
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut r = Self::default();
        for entry in spec
            .split([';', ','])
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (name, addrs, pinned) = match (entry.split_once('='), entry.split_once('~')) {
                (Some((n, a)), _) => (n, a, true),
                (None, Some((n, a))) => (n, a, false),
                (None, None) => {
                    return Err(format!(
                        "'{entry}' is not NAME=IP (pinned) or NAME~IP (answered)"
                    ));
                }
            };
            let addrs = addrs
                .split('|')
                .map(|a| {
                    literal(a.trim()).map_err(|_| format!("'{entry}': '{a}' is not an address"))
                })
                .collect::<Result<Vec<IpAddr>, String>>()?;
            let name = name.trim();
            if name.is_empty() {
                return Err(format!("'{entry}' has no name"));
            }
            r.names
                .insert(sandcell_api::network::normalize_host(name), (addrs, pinned));
        }
        Ok(r)
    }

    /// And `fallback` for the names it does not hold.
    pub fn with_fallback(mut self, fallback: Arc<dyn Resolver>) -> Self {
        self.fallback = Some(fallback);
        self
    }
}

impl Resolver for StaticResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> ResolveFuture<'a> {
        Box::pin(async move {
            if let Some((addrs, pinned)) =
                self.names.get(&sandcell_api::network::normalize_host(host))
            {
                return Ok(Resolution {
                    addrs: addrs.clone(),
                    pinned: *pinned,
                });
            }
            if let Ok(ip) = literal(host) {
                return Ok(Resolution {
                    addrs: vec![ip],
                    pinned: false,
                });
            }
            match &self.fallback {
                Some(f) => f.resolve(host).await,
                None => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{host} is not a name this resolver holds"),
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_test_setting_pins_or_answers_names() {
        let r = StaticResolver::parse("registry.test=127.0.0.1; rebind.test~127.0.0.1|::1")
            .expect("parse");
        let pinned = r.resolve("Registry.Test.").await.expect("pinned");
        assert_eq!(pinned.addrs, vec![IpAddr::from([127, 0, 0, 1])]);
        assert!(pinned.pinned);
        let answered = r.resolve("rebind.test").await.expect("answered");
        assert_eq!(answered.addrs.len(), 2);
        assert!(!answered.pinned);
        assert!(r.resolve("other.test").await.is_err());
        for bad in ["registry.test", "=127.0.0.1", "a.test=not-an-ip"] {
            assert!(StaticResolver::parse(bad).is_err(), "{bad}");
        }
    }
}
