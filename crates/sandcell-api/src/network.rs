//! A sandbox's network policy as data: what its egress proxy lets it reach.
//!
//! On the wire: `"off" | "loopback" | "full" | {"allow": ["host", "*.suffix", "host:port",
//! "127.0.0.1:8080", "[::1]:8080"]}`; on the command line `off`, `loopback`, `full` or
//! `allow:HOST[,HOST…]`. Every rule is checked here, once, when a policy is made or read.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Rules an `allow` policy may hold.
pub const MAX_RULES: usize = 256;
/// Characters of one rule.
pub const MAX_RULE_CHARS: usize = 260;

/// What a sandbox's network reaches.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkPolicy {
    /// No sockets but Unix sockets.
    Off,
    /// The sandbox's own loopback only (the default).
    #[default]
    Loopback,
    /// Any public host, through the egress proxy (never loopback, private, link-local or
    /// metadata addresses).
    Full,
    /// The hosts the rules name, through the egress proxy.
    Allow(Vec<HostRule>),
}

/// One `allow` rule: a host pattern and, optionally, the one port it allows (without one,
/// any port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRule {
    /// Which hosts.
    pub host: HostPattern,
    /// Which port (`None`: any).
    pub port: Option<u16>,
}

/// Which hosts a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This name exactly (lower case, no trailing dot).
    Exact(String),
    /// Any name under this suffix (`*.example.org`: `a.example.org`, `a.b.example.org`, not
    /// `example.org` itself).
    Suffix(String),
    /// This address: the one way to allow a loopback, private, link-local or metadata
    /// address.
    Ip(IpAddr),
}

/// A name as the proxy compares it: lower case, without a trailing dot.
pub fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// A DNS name's rule: 1 to 253 characters, labels of 1 to 63 letters, digits, `-` or `_`,
/// not starting or ending with `-`.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err(format!("'{name}' is not a host name (1 to 253 characters)"));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!(
                "'{name}' is not a host name (labels of 1 to 63 letters, digits, '-' or '_')"
            ));
        }
    }
    Ok(())
}

fn parse_port(text: &str, rule: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!(
            "'{rule}': the port must be 1 to 65535, got '{text}'"
        )),
    }
}

impl FromStr for HostRule {
    type Err = String;

    fn from_str(rule: &str) -> Result<Self, String> {
        let rule = rule.trim();
        if rule.is_empty() {
            return Err("an allow rule is empty".into());
        }
        if rule.chars().count() > MAX_RULE_CHARS {
            return Err(format!("an allow rule is over {MAX_RULE_CHARS} characters"));
        }
        if rule.contains("://") || rule.contains('/') {
            return Err(format!(
                "'{rule}' is a URL: a rule is a host, '*.suffix' or either with ':port'"
            ));
        }
        // `[v6]` or `[v6]:port`.
        if let Some(rest) = rule.strip_prefix('[') {
            let (addr, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("'{rule}': an IPv6 address in [ ] has no ']'"))?;
            let ip: IpAddr = addr
                .parse()
                .map_err(|_| format!("'{rule}': '{addr}' is not an IPv6 address"))?;
            let port = match after {
                "" => None,
                p => Some(parse_port(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("'{rule}': ':port' must follow ']'"))?,
                    rule,
                )?),
            };
            return Ok(Self {
                host: HostPattern::Ip(ip),
                port,
            });
        }
        // A bare IPv6 address has colons of its own.
        if let Ok(ip) = rule.parse::<IpAddr>() {
            return Ok(Self {
                host: HostPattern::Ip(ip),
                port: None,
            });
        }
        let (host, port) = match rule.rsplit_once(':') {
            Some((h, p)) => (h, Some(parse_port(p, rule)?)),
            None => (rule, None),
        };
        if let Ok(ip) = host.parse::<IpAddr>() {
            if ip.is_ipv6() {
                return Err(format!(
                    "'{rule}': write an IPv6 address with a port as [addr]:port"
                ));
            }
            return Ok(Self {
                host: HostPattern::Ip(ip),
                port,
            });
        }
        let host = normalize_host(host);
        if let Some(suffix) = host.strip_prefix("*.") {
            check_name(suffix)?;
            if !suffix.contains('.') {
                return Err(format!(
                    "'{rule}': a wildcard needs a suffix of two labels or more (not a whole top-level domain)"
                ));
            }
            return Ok(Self {
                host: HostPattern::Suffix(suffix.to_string()),
                port,
            });
        }
        if host.contains('*') {
            return Err(format!(
                "'{rule}': '*' is allowed only as a whole first label ('*.example.org')"
            ));
        }
        check_name(&host)?;
        Ok(Self {
            host: HostPattern::Exact(host),
            port,
        })
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, self.port) {
            (HostPattern::Exact(h), None) => write!(f, "{h}"),
            (HostPattern::Exact(h), Some(p)) => write!(f, "{h}:{p}"),
            (HostPattern::Suffix(s), None) => write!(f, "*.{s}"),
            (HostPattern::Suffix(s), Some(p)) => write!(f, "*.{s}:{p}"),
            (HostPattern::Ip(IpAddr::V6(ip)), Some(p)) => write!(f, "[{ip}]:{p}"),
            (HostPattern::Ip(ip), None) => write!(f, "{ip}"),
            (HostPattern::Ip(ip), Some(p)) => write!(f, "{ip}:{p}"),
        }
    }
}

impl HostRule {
    /// Whether this rule allows `host` (normalized: see [`normalize_host`]) on `port`.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match &self.host {
            HostPattern::Exact(h) => h == host,
            HostPattern::Suffix(s) => host
                .strip_suffix(s.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            HostPattern::Ip(ip) => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|h| h == *ip),
        }
    }
}

impl NetworkPolicy {
    /// An `allow` policy from its rules, each checked.
    pub fn allow<S: AsRef<str>>(rules: &[S]) -> Result<Self, String> {
        if rules.is_empty() {
            return Err(
                "an allow policy needs at least one rule (or use \"off\" or \"loopback\")".into(),
            );
        }
        if rules.len() > MAX_RULES {
            return Err(format!(
                "an allow policy holds at most {MAX_RULES} rules, got {}",
                rules.len()
            ));
        }
        let rules = rules
            .iter()
            .map(|r| r.as_ref().parse())
            .collect::<Result<Vec<HostRule>, String>>()?;
        Ok(Self::Allow(rules))
    }

    /// Its name on the wire: `off`, `loopback`, `full` or `allow`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Loopback => "loopback",
            Self::Full => "full",
            Self::Allow(_) => "allow",
        }
    }

    /// Traffic leaves the sandbox (through the egress proxy).
    pub fn has_egress(&self) -> bool {
        matches!(self, Self::Full | Self::Allow(_))
    }

    /// The rule that allows `host` on `port` (normalized), if any; `Full` allows every name
    /// (its addresses are checked after resolution).
    pub fn rule_for(&self, host: &str, port: u16) -> Option<Option<&HostRule>> {
        match self {
            Self::Off | Self::Loopback => None,
            Self::Full => Some(None),
            Self::Allow(rules) => rules.iter().find(|r| r.matches(host, port)).map(Some),
        }
    }

    /// Whether a rule names address `ip` on `port` explicitly (what lets a loopback,
    /// private, link-local or metadata address through).
    pub fn names_address(&self, ip: IpAddr, port: u16) -> bool {
        match self {
            Self::Allow(rules) => rules.iter().any(|r| {
                matches!(r.host, HostPattern::Ip(a) if a == ip) && r.port.is_none_or(|p| p == port)
            }),
            _ => false,
        }
    }
}

impl FromStr for NetworkPolicy {
    type Err = String;

    /// The command line's form: `off`, `loopback`, `full` or `allow:HOST[,HOST…]`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "off" => Ok(Self::Off),
            "loopback" => Ok(Self::Loopback),
            "full" => Ok(Self::Full),
            other => match other.strip_prefix("allow:") {
                Some(list) => {
                    let rules: Vec<&str> = list.split(',').map(str::trim).collect();
                    Self::allow(&rules)
                }
                None => Err(format!(
                    "'{other}' is not a network policy: off, loopback, full or allow:HOST[,HOST…]"
                )),
            },
        }
    }
}

impl fmt::Display for NetworkPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Allow(rules) => {
                f.write_str("allow:")?;
                for (i, r) in rules.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{r}")?;
                }
                Ok(())
            }
            other => f.write_str(other.kind()),
        }
    }
}

impl Serialize for NetworkPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Self::Allow(rules) => {
                let rules: Vec<String> = rules.iter().map(ToString::to_string).collect();
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("allow", &rules)?;
                m.end()
            }
            other => s.serialize_str(other.kind()),
        }
    }
}

impl<'de> Deserialize<'de> for NetworkPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PolicyVisitor;

        impl<'de> Visitor<'de> for PolicyVisitor {
            type Value = NetworkPolicy;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"off\", \"loopback\", \"full\" or {\"allow\": [hosts]}")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<NetworkPolicy, E> {
                match v {
                    "off" => Ok(NetworkPolicy::Off),
                    "loopback" => Ok(NetworkPolicy::Loopback),
                    "full" => Ok(NetworkPolicy::Full),
                    other => Err(E::custom(format!(
                        "'{other}' is not a network policy: \"off\", \"loopback\", \"full\" or {{\"allow\": [hosts]}}"
                    ))),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NetworkPolicy, A::Error> {
                let mut rules: Option<Vec<String>> = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "allow" {
                        return Err(de::Error::custom(format!(
                            "unknown field '{key}' in a network policy (only 'allow')"
                        )));
                    }
                    if rules.is_some() {
                        return Err(de::Error::custom("'allow' is given twice"));
                    }
                    rules = Some(map.next_value()?);
                }
                let rules = rules.ok_or_else(|| de::Error::custom("'allow' is missing"))?;
                NetworkPolicy::allow(&rules).map_err(de::Error::custom)
            }
        }

        d.deserialize_any(PolicyVisitor)
    }
}

/// `PUT /v1/sandboxes/{id}/network`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetNetwork {
    /// What the sandbox's network reaches from its next connection on (`off` cannot be set
    /// on, or left from, a running sandbox).
    pub network: NetworkPolicy,
}

/// A sandbox's network now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NetworkInfo {
    /// What it reaches.
    pub network: NetworkPolicy,
    /// The HTTP proxy inside the sandbox (`HTTP_PROXY`, `HTTPS_PROXY`); absent when its
    /// network is `off`.
    pub http_proxy: Option<String>,
    /// The SOCKS5 proxy inside the sandbox (`ALL_PROXY`); absent when its network is `off`.
    pub socks_proxy: Option<String>,
    /// Bytes its egress proxy carried, both directions.
    pub bytes: u64,
    /// Connections open through it now.
    pub open_connections: u32,
}

/// One connection (or plain-HTTP request) through a sandbox's egress proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EgressEventInfo {
    /// Its place in the audit log (pass as `before` for older ones).
    pub id: i64,
    /// When it ended or was refused (RFC 3339).
    pub at: String,
    /// `http` (a plain request), `connect` (an HTTP CONNECT tunnel) or `socks5`.
    pub protocol: String,
    /// The host it asked for.
    pub host: String,
    /// The port.
    pub port: u16,
    /// `allowed` or `denied`.
    pub decision: String,
    /// Why it was denied (or cut).
    pub reason: Option<String>,
    /// The address it connected to.
    pub address: Option<String>,
    /// The name its TLS ClientHello asked for.
    pub sni: Option<String>,
    /// Bytes from the sandbox.
    pub bytes_up: u64,
    /// Bytes to the sandbox.
    pub bytes_down: u64,
    /// How long it lasted.
    pub duration_ms: u64,
}

/// A page of egress events, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EgressEventList {
    /// The events.
    pub events: Vec<EgressEventInfo>,
    /// Pass as `before` for the next (older) page; absent at the end.
    pub next_before: Option<i64>,
}

/// On the wire: `"off" | "loopback" | "full"` or `{"allow": [rules]}`.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for NetworkPolicy {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
        let named = ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(["off", "loopback", "full"]))
            .description(Some(
                "off: no sockets but Unix; loopback: the sandbox's own lo only (the default); \
                 full: any public host through the egress proxy",
            ));
        let rules = ArrayBuilder::new()
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .max_length(Some(MAX_RULE_CHARS)),
            )
            .min_items(Some(1))
            .max_items(Some(MAX_RULES));
        let allow = ObjectBuilder::new()
            .property("allow", rules)
            .required("allow")
            .description(Some(
                "only these hosts through the egress proxy: \"host\", \"*.suffix\", \
                 \"host:port\", \"127.0.0.1:8080\", \"[::1]:8080\" (loopback, private, \
                 link-local and metadata addresses only when a rule names the address)",
            ));
        OneOfBuilder::new().item(named).item(allow).into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for NetworkPolicy {}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> HostRule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn rules_parse_and_print_back() {
        for s in [
            "example.org",
            "*.example.org",
            "example.org:443",
            "*.example.org:8443",
            "127.0.0.1:8080",
            "10.0.0.1",
            "[::1]:8080",
            "::1",
        ] {
            assert_eq!(rule(s).to_string(), s);
        }
        assert_eq!(rule("Example.ORG.").to_string(), "example.org");
    }

    #[test]
    fn bad_rules_are_refused_with_their_reason() {
        for (s, says) in [
            ("", "empty"),
            ("http://example.org", "URL"),
            ("example.org/path", "URL"),
            ("example.org:0", "port"),
            ("example.org:99999", "port"),
            ("*.org", "two labels"),
            ("a*.example.org", "'*'"),
            ("exa mple.org", "not a host name"),
            ("-bad.org", "not a host name"),
            ("[::1", "no ']'"),
            ("[nope]:80", "not an IPv6"),
        ] {
            let e = s.parse::<HostRule>().expect_err(s);
            assert!(e.contains(says), "{s}: {e}");
        }
    }

    #[test]
    fn a_wildcard_matches_names_below_its_suffix_only() {
        let r = rule("*.example.org");
        assert!(r.matches("a.example.org", 443));
        assert!(r.matches("a.b.example.org", 80));
        assert!(!r.matches("example.org", 443));
        assert!(!r.matches("badexample.org", 443));
        assert!(!r.matches("example.org.evil.net", 443));
        let r = rule("example.org:443");
        assert!(r.matches("example.org", 443));
        assert!(!r.matches("example.org", 80));
        assert!(!r.matches("a.example.org", 443));
    }

    #[test]
    fn the_wire_shape_round_trips_and_refuses_what_is_not_a_policy() {
        for (json, policy) in [
            (r#""off""#, NetworkPolicy::Off),
            (r#""loopback""#, NetworkPolicy::Loopback),
            (r#""full""#, NetworkPolicy::Full),
        ] {
            let p: NetworkPolicy = serde_json::from_str(json).expect(json);
            assert_eq!(p, policy);
            assert_eq!(serde_json::to_string(&p).expect("json"), json);
        }
        let p: NetworkPolicy =
            serde_json::from_str(r#"{"allow": ["a.org", "*.b.org:443"]}"#).expect("allow");
        assert_eq!(
            serde_json::to_string(&p).expect("json"),
            r#"{"allow":["a.org","*.b.org:443"]}"#
        );
        for (json, says) in [
            (r#""open""#, "not a network policy"),
            (r#"{"deny": ["a.org"]}"#, "unknown field 'deny'"),
            (r#"{"allow": []}"#, "at least one rule"),
            (r#"{"allow": ["http://a.org"]}"#, "URL"),
            (r#"{}"#, "'allow' is missing"),
            ("3", "expected"),
        ] {
            let e = serde_json::from_str::<NetworkPolicy>(json).expect_err(json);
            assert!(e.to_string().contains(says), "{json}: {e}");
        }
    }

    #[test]
    fn the_command_line_form_parses_and_prints_back() {
        let p: NetworkPolicy = "allow:a.org, *.b.org:443".parse().expect("allow");
        assert_eq!(p.to_string(), "allow:a.org,*.b.org:443");
        assert_eq!("full".parse::<NetworkPolicy>(), Ok(NetworkPolicy::Full));
        assert!("allow:".parse::<NetworkPolicy>().is_err());
        assert!("wide".parse::<NetworkPolicy>().is_err());
    }

    #[test]
    fn only_an_address_rule_names_an_address() {
        let p = NetworkPolicy::allow(&["127.0.0.1:8080", "localhost"]).expect("allow");
        let lo: IpAddr = "127.0.0.1".parse().expect("ip");
        assert!(p.names_address(lo, 8080));
        assert!(!p.names_address(lo, 8081));
        assert!(!NetworkPolicy::Full.names_address(lo, 80));
        assert_eq!(p.rule_for("localhost", 80).map(|r| r.is_some()), Some(true));
        assert_eq!(p.rule_for("other", 80), None);
        assert_eq!(NetworkPolicy::Full.rule_for("any.org", 80), Some(None));
        assert_eq!(NetworkPolicy::Loopback.rule_for("any.org", 80), None);
    }
}
