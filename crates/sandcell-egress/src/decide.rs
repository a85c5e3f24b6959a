//! The one decision: may this sandbox reach `host:port`, and at which addresses.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use sandcell_api::network::{NetworkPolicy, normalize_host};

use crate::classify::{AddressClass, classify};
use crate::resolve::Resolver;

/// Why a connection was refused, in words for the sandbox's user and the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied(pub String);

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The addresses `host:port` may be reached at under `policy`: the host must match a rule
/// (any name under `full`), and of the addresses it resolves to only public ones are kept,
/// unless a rule names the address or the operator pinned the name.
pub async fn decide(
    policy: &NetworkPolicy,
    resolver: &dyn Resolver,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, Denied> {
    let host = normalize_host(host);
    if !policy.has_egress() {
        return Err(Denied(format!(
            "the sandbox's network policy is '{}': nothing outside it is reachable",
            policy.kind()
        )));
    }
    if host.is_empty() {
        return Err(Denied("no host was asked for".into()));
    }
    if port == 0 {
        return Err(Denied(format!("{host}: port 0 is not a port")));
    }
    if policy.rule_for(&host, port).is_none() {
        return Err(Denied(format!(
            "{host}:{port} is not allowed by the sandbox's network policy ({policy})"
        )));
    }
    let resolution = resolver
        .resolve(&host)
        .await
        .map_err(|e| Denied(format!("{host} cannot be resolved: {e}")))?;
    let mut refused: Vec<(IpAddr, AddressClass)> = Vec::new();
    let mut allowed = Vec::new();
    for ip in resolution.addrs {
        let class = classify(ip);
        if class.is_reachable_by_name() || resolution.pinned || policy.names_address(ip, port) {
            allowed.push(SocketAddr::new(ip, port));
        } else {
            refused.push((ip, class));
        }
    }
    if allowed.is_empty() {
        let what: Vec<String> = refused
            .iter()
            .map(|(ip, class)| format!("{ip} ({})", class.as_str()))
            .collect();
        return Err(Denied(format!(
            "{host} resolves to {}, which only a rule naming the address allows",
            if what.is_empty() {
                "no address".to_string()
            } else {
                what.join(", ")
            }
        )));
    }
    Ok(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::StaticResolver;

    fn resolver() -> StaticResolver {
        StaticResolver::new([])
    }

    async fn check(policy: &str, host: &str, port: u16) -> Result<Vec<SocketAddr>, Denied> {
        let policy: NetworkPolicy = policy.parse().expect("policy");
        decide(&policy, &resolver(), host, port).await
    }

    #[tokio::test]
    async fn a_name_outside_the_rules_is_refused_before_it_is_resolved() {
        let e = check("allow:pkg.example.org", "other.example.org", 443)
            .await
            .expect_err("refused");
        assert!(e.0.contains("not allowed"), "{e}");
        let e = check("loopback", "pkg.example.org", 443)
            .await
            .expect_err("refused");
        assert!(e.0.contains("'loopback'"), "{e}");
    }

    #[tokio::test]
    async fn non_public_addresses_need_a_rule_that_names_them() {
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "10.0.0.1",
            "[::1]",
            "0.0.0.0",
        ] {
            let e = check("full", ip, 80).await.expect_err(ip);
            assert!(e.0.contains("only a rule naming the address"), "{ip}: {e}");
        }
        let ok = check("allow:127.0.0.1:8080", "127.0.0.1", 8080)
            .await
            .expect("named");
        assert_eq!(ok, vec!["127.0.0.1:8080".parse().expect("addr")]);
        // The rule names the address on another port only.
        assert!(
            check("allow:127.0.0.1:8080", "127.0.0.1", 22)
                .await
                .is_err()
        );
        assert!(check("full", "8.8.8.8", 53).await.is_ok());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_and_a_pinned_one_is_not() {
        #[derive(Debug)]
        struct Rebinding;
        impl Resolver for Rebinding {
            fn resolve<'a>(&'a self, _: &'a str) -> crate::resolve::ResolveFuture<'a> {
                Box::pin(async {
                    Ok(crate::resolve::Resolution {
                        addrs: vec![
                            "127.0.0.1".parse().expect("ip"),
                            "169.254.169.254".parse().expect("ip"),
                        ],
                        pinned: false,
                    })
                })
            }
        }
        let policy: NetworkPolicy = "allow:evil.example".parse().expect("policy");
        let e = decide(&policy, &Rebinding, "evil.example", 80)
            .await
            .expect_err("rebinding");
        assert!(
            e.0.contains("127.0.0.1 (loopback)") && e.0.contains("169.254.169.254 (metadata)"),
            "{e}"
        );
        let pinned = StaticResolver::new([(
            "registry.test".to_string(),
            vec!["127.0.0.1".parse().expect("ip")],
        )]);
        let policy: NetworkPolicy = "allow:registry.test".parse().expect("policy");
        assert!(
            decide(&policy, &pinned, "Registry.Test.", 443)
                .await
                .is_ok()
        );
    }
}
