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
    names: HashMap<String, Vec<IpAddr>>,
    fallback: Option<Arc<dyn Resolver>>,
}

impl StaticResolver {
    /// A resolver of these names only.
    pub fn new(names: impl IntoIterator<Item = (String, Vec<IpAddr>)>) -> Self {
        Self {
            names: names
                .into_iter()
                .map(|(n, a)| (sandcell_api::network::normalize_host(&n), a))
                .collect(),
            fallback: None,
        }
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
            if let Some(addrs) = self.names.get(&sandcell_api::network::normalize_host(host)) {
                return Ok(Resolution {
                    addrs: addrs.clone(),
                    pinned: true,
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
