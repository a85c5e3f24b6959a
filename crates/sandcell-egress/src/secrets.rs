//! Secrets that never enter the sandbox: the sandbox holds a placeholder
//! (`SANDCELL_SECRET_` and 32 hex digits), and the proxy puts the real value in its place in
//! the header values and the query string of requests to the hosts the secret is registered
//! for. A placeholder on its way anywhere else is refused (the request is not sent), so the
//! value leaves the host only for those hosts, and only through the proxy.
//!
//! This module is the pure part: the secrets, how a placeholder is found in a request head,
//! replaced or refused. The proxy's paths (plain HTTP, CONNECT tunnels it reads) call
//! [`Secrets::apply`] on every request head.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use sandcell_api::network::{HostRule, normalize_host};

/// What every placeholder starts with: a sandbox's program (or its user) can tell one apart,
/// and the proxy finds it without knowing which secrets exist.
pub const PLACEHOLDER_PREFIX: &str = "SANDCELL_SECRET_";
/// The hex digits after [`PLACEHOLDER_PREFIX`] (128 random bits).
pub const PLACEHOLDER_HEX: usize = 32;
/// The longest secret name.
const MAX_NAME: usize = 128;
/// The longest secret value (a header value the proxy writes).
const MAX_VALUE: usize = 16 * 1024;

/// Why a secret or a set of secrets could not be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    /// The name is empty, too long or has characters other than letters, digits, `_`, `-`
    /// and `.`.
    #[error("'{0}' is not a secret name: 1 to {MAX_NAME} letters, digits, '_', '-' or '.'")]
    BadName(String),
    /// The value cannot go into a header as it is (never quoted in the message).
    #[error("secret '{name}': its value {why}")]
    BadValue {
        /// The secret's name.
        name: String,
        /// What is wrong with it, without the value.
        why: &'static str,
    },
    /// A given placeholder is not `SANDCELL_SECRET_` and 32 lower-case hex digits.
    #[error(
        "secret '{name}': '{placeholder}' is not a placeholder ({PLACEHOLDER_PREFIX} and {PLACEHOLDER_HEX} lower-case hex digits)"
    )]
    BadPlaceholder {
        /// The secret's name.
        name: String,
        /// The placeholder given.
        placeholder: String,
    },
    /// A secret was given no host to go to.
    #[error("secret '{0}' names no host it may be sent to")]
    NoHosts(String),
    /// Two secrets have the same name.
    #[error("two secrets are named '{0}'")]
    DuplicateName(String),
    /// Two secrets have the same placeholder.
    #[error("secrets '{0}' and '{1}' have the same placeholder")]
    DuplicatePlaceholder(String, String),
    /// The system's random source failed (no placeholder could be made).
    #[error("cannot make a random placeholder: {0}")]
    Random(String),
}

/// One secret: its name (what events and refusals say), its value (what only the registered
/// hosts receive), the placeholder the sandbox holds instead, and the hosts it may go to.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    name: String,
    /// `None`: a secret whose value this process never had (a sandbox reattached or restored
    /// by a restarted daemon); its placeholder is refused everywhere until it is given.
    value: Option<String>,
    placeholder: String,
    hosts: Vec<HostRule>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The value stays out of every log.
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("placeholder", &self.placeholder)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl Secret {
    /// A secret with a new random placeholder, to be sent only to `hosts` (the same rules as
    /// a network policy's: `api.example.com`, `*.example.com`, either with `:port`).
    pub fn new(
        name: impl Into<String>,
        value: impl Into<String>,
        hosts: Vec<HostRule>,
    ) -> Result<Self, SecretError> {
        let placeholder = new_placeholder()?;
        Self::with_placeholder(name, value, placeholder, hosts)
    }

    /// A secret with a placeholder made before (one a sandbox already holds, kept across a
    /// daemon's restart).
    pub fn with_placeholder(
        name: impl Into<String>,
        value: impl Into<String>,
        placeholder: impl Into<String>,
        hosts: Vec<HostRule>,
    ) -> Result<Self, SecretError> {
        let name = name.into();
        let value = value.into();
        check_name(&name)?;
        if let Some(why) = value_problem(&value) {
            return Err(SecretError::BadValue { name, why });
        }
        let mut secret = Self::unheld(name, placeholder, hosts)?;
        secret.value = Some(value);
        Ok(secret)
    }

    /// A secret whose placeholder the sandbox holds but whose value is not known here: a
    /// request carrying it is refused (to any host), saying the value must be given again.
    pub fn unheld(
        name: impl Into<String>,
        placeholder: impl Into<String>,
        hosts: Vec<HostRule>,
    ) -> Result<Self, SecretError> {
        let name = name.into();
        let placeholder = placeholder.into();
        check_name(&name)?;
        if !is_placeholder(placeholder.as_bytes()) || placeholder.len() != placeholder_len() {
            return Err(SecretError::BadPlaceholder { name, placeholder });
        }
        if hosts.is_empty() {
            return Err(SecretError::NoHosts(name));
        }
        Ok(Self {
            name,
            value: None,
            placeholder,
            hosts,
        })
    }

    /// Its value, when this process holds it.
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the sandbox holds instead of the value (e.g. in an environment variable).
    pub fn placeholder(&self) -> &str {
        &self.placeholder
    }

    /// The hosts it may be sent to.
    pub fn hosts(&self) -> &[HostRule] {
        &self.hosts
    }

    /// Whether it may be sent to `host` (normalized or not) on `port`.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = normalize_host(host);
        self.hosts.iter().any(|r| r.matches(&host, port))
    }

    /// The hosts, as the refusal names them.
    fn hosts_text(&self) -> String {
        let list: Vec<String> = self.hosts.iter().map(ToString::to_string).collect();
        list.join(", ")
    }
}

/// The secrets of one sandbox. Cheap to clone (shared); the proxy holds one and reads it at
/// every request, so [`crate::EgressProxy::set_secrets`] applies to the next request.
#[derive(Clone, Default)]
pub struct Secrets {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    list: Vec<Secret>,
    by_placeholder: HashMap<String, usize>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.inner.list.iter()).finish()
    }
}

impl Secrets {
    /// A set of secrets; names and placeholders must be unique.
    pub fn new(list: Vec<Secret>) -> Result<Self, SecretError> {
        let mut by_placeholder = HashMap::with_capacity(list.len());
        let mut names = BTreeSet::new();
        for (i, s) in list.iter().enumerate() {
            if !names.insert(s.name.as_str()) {
                return Err(SecretError::DuplicateName(s.name.clone()));
            }
            if let Some(j) = by_placeholder.insert(s.placeholder.clone(), i) {
                return Err(SecretError::DuplicatePlaceholder(
                    list[j].name.clone(),
                    s.name.clone(),
                ));
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                list,
                by_placeholder,
            }),
        })
    }

    /// No secrets: the proxy reads no request.
    pub fn is_empty(&self) -> bool {
        self.inner.list.is_empty()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.inner.list.len()
    }

    /// Each secret.
    pub fn iter(&self) -> impl Iterator<Item = &Secret> {
        self.inner.list.iter()
    }

    /// The secret named `name`.
    pub fn get(&self, name: &str) -> Option<&Secret> {
        self.inner.list.iter().find(|s| s.name == name)
    }

    /// Whether any secret may be sent to `host` on `port`.
    pub fn any_for(&self, host: &str, port: u16) -> bool {
        self.inner.list.iter().any(|s| s.allows(host, port))
    }

    /// The secret whose placeholder is `text`.
    fn by_placeholder(&self, text: &[u8]) -> Option<&Secret> {
        let text = std::str::from_utf8(text).ok()?;
        self.inner
            .by_placeholder
            .get(text)
            .map(|&i| &self.inner.list[i])
    }

    /// Puts the values of the secrets in place of their placeholders in `head` (header values,
    /// the query string, the password of `Authorization: Basic`), for a request to
    /// `host:port`. Refused: a placeholder of a secret that may not go to `host:port`, one in
    /// the path or a header name (never replaced there), and a request that would carry a
    /// value but names another host in its `Host` header or target (a shared front end would
    /// route it elsewhere). The refusal names the secret, never its value. Answers the names
    /// of the secrets used (sorted, each once).
    pub fn apply(
        &self,
        head: &mut RequestHead,
        host: &str,
        port: u16,
    ) -> Result<Vec<String>, Refusal> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        let host = normalize_host(host);
        // Judged on the head as the sandbox sent it (what a refusal may quote holds no value)
        // and changed on a copy, so a refused head never holds one either.
        let other = head.other_host(&host, port);
        let mut out = head.clone();
        let mut used = BTreeSet::new();
        let (path, query) = match head.target.find('?') {
            Some(i) => head.target.split_at(i),
            None => (head.target.as_str(), ""),
        };
        if let Some(s) = self.first_known(path.as_bytes()) {
            return Err(Refusal::new(
                s,
                format!(
                    "the request's path holds the placeholder of secret '{}': secrets are put only in header values and the query string",
                    s.name
                ),
            ));
        }
        if let Some(query) =
            self.replace(query.as_bytes(), &host, port, Encoding::Query, &mut used)?
        {
            // Percent-encoding leaves only ASCII where a placeholder was.
            let query = String::from_utf8(query).map_err(|_| {
                Refusal::plain("the request's query string is not UTF-8 after replacement")
            })?;
            out.target = format!("{path}{query}");
        }
        for (name, value) in &mut out.headers {
            if let Some(s) = self.first_known(name.as_bytes()) {
                return Err(Refusal::new(
                    s,
                    format!(
                        "a header name holds the placeholder of secret '{}': secrets are put only in header values and the query string",
                        s.name
                    ),
                ));
            }
            if let Some(new) = self.replace(value, &host, port, Encoding::Raw, &mut used)? {
                *value = new;
            }
            if name.eq_ignore_ascii_case("authorization")
                && let Some(new) = self.replace_basic(value, &host, port, &mut used)?
            {
                *value = new;
            }
        }
        if let (Some(first), Some(other)) = (used.iter().next(), other) {
            return Err(Refusal {
                secret: Some(first.clone()),
                reason: format!(
                    "the request names host '{other}', not '{host}' it is sent to: secret '{first}' goes only where the connection goes"
                ),
            });
        }
        *head = out;
        Ok(used.into_iter().collect())
    }

    /// The first registered secret whose placeholder is in `text`.
    fn first_known(&self, text: &[u8]) -> Option<&Secret> {
        find_placeholders(text)
            .into_iter()
            .find_map(|at| self.by_placeholder(&text[at..at + placeholder_len()]))
    }

    /// `text` with each known placeholder replaced (`None`: none was there); refused when one
    /// may not go to `host:port`.
    fn replace(
        &self,
        text: &[u8],
        host: &str,
        port: u16,
        encoding: Encoding,
        used: &mut BTreeSet<String>,
    ) -> Result<Option<Vec<u8>>, Refusal> {
        let found = find_placeholders(text);
        if found.is_empty() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(text.len());
        let mut from = 0;
        let mut changed = false;
        for at in found {
            let end = at + placeholder_len();
            let Some(secret) = self.by_placeholder(&text[at..end]) else {
                // A placeholder of no secret now (one removed): it is not a value.
                continue;
            };
            if !secret.allows(host, port) {
                return Err(Refusal::new(
                    secret,
                    format!(
                        "the request carries the placeholder of secret '{}', which is sent only to {} (not to {host}:{port})",
                        secret.name,
                        secret.hosts_text()
                    ),
                ));
            }
            let Some(value) = &secret.value else {
                return Err(Refusal::new(
                    secret,
                    format!(
                        "the value of secret '{}' is not held here (the daemon restarted since it was given): give it again",
                        secret.name
                    ),
                ));
            };
            out.extend_from_slice(&text[from..at]);
            match encoding {
                Encoding::Raw => out.extend_from_slice(value.as_bytes()),
                Encoding::Query => percent_encode(value.as_bytes(), &mut out),
            }
            from = end;
            changed = true;
            used.insert(secret.name.clone());
        }
        if !changed {
            return Ok(None);
        }
        out.extend_from_slice(&text[from..]);
        Ok(Some(out))
    }

    /// An `Authorization: Basic` value whose decoded `user:password` holds placeholders,
    /// with them replaced and encoded again (`None`: not Basic, or none there).
    fn replace_basic(
        &self,
        value: &[u8],
        host: &str,
        port: u16,
        used: &mut BTreeSet<String>,
    ) -> Result<Option<Vec<u8>>, Refusal> {
        let Some(scheme) = value.get(..6) else {
            return Ok(None);
        };
        if !scheme.eq_ignore_ascii_case(b"basic ") {
            return Ok(None);
        }
        let encoded = value[6..].trim_ascii();
        let engine = base64::engine::general_purpose::STANDARD;
        let Ok(decoded) = engine.decode(encoded) else {
            return Ok(None);
        };
        match self.replace(&decoded, host, port, Encoding::Raw, used)? {
            Some(new) => {
                let mut out = value[..6].to_vec();
                out.extend_from_slice(engine.encode(new).as_bytes());
                Ok(Some(out))
            }
            None => Ok(None),
        }
    }
}

/// How a value is written where a placeholder was.
#[derive(Clone, Copy)]
enum Encoding {
    /// As it is (a header value: checked to hold no control character).
    Raw,
    /// Percent-encoded, all but the unreserved characters (a query string).
    Query,
}

/// Why a request was refused, for the sandbox's answer and the event: names a secret, never
/// holds a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The secret the refusal is about, if one.
    pub secret: Option<String>,
    /// The reason, in words.
    pub reason: String,
}

impl Refusal {
    fn new(secret: &Secret, reason: String) -> Self {
        Self {
            secret: Some(secret.name.clone()),
            reason,
        }
    }

    fn plain(reason: &str) -> Self {
        Self {
            secret: None,
            reason: reason.to_string(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// A request head the proxy read, as it writes it on: method, target, version and headers
/// in their order and spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The method.
    pub method: String,
    /// The request target (origin form `/path?query`, or absolute form).
    pub target: String,
    /// The minor version: 0 (HTTP/1.0) or 1 (HTTP/1.1).
    pub version: u8,
    /// The headers, names as sent, values as bytes.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl RequestHead {
    /// The head at the start of `bytes` and its length; `Ok(None)`: incomplete.
    pub fn parse(bytes: &[u8], max_headers: usize) -> Result<Option<(Self, usize)>, String> {
        let mut headers = vec![httparse::EMPTY_HEADER; max_headers];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(bytes) {
            Ok(httparse::Status::Complete(len)) => Ok(Some((
                Self {
                    method: req.method.unwrap_or_default().to_string(),
                    target: req.path.unwrap_or_default().to_string(),
                    version: req.version.unwrap_or(1),
                    headers: req
                        .headers
                        .iter()
                        .map(|h| (h.name.to_string(), h.value.to_vec()))
                        .collect(),
                },
                len,
            ))),
            Ok(httparse::Status::Partial) => Ok(None),
            Err(e) => Err(format!("the request is not HTTP/1.x: {e}")),
        }
    }

    /// The head as bytes, to the empty line.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target.as_bytes());
        out.extend_from_slice(if self.version == 0 {
            b" HTTP/1.0\r\n"
        } else {
            b" HTTP/1.1\r\n"
        });
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out
    }

    /// The values of the headers named `name` (any case).
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// A host the request names (its `Host` header, the authority of an absolute-form
    /// target) other than `host:port`, if any.
    fn other_host(&self, host: &str, port: u16) -> Option<String> {
        let mut named: Vec<String> = self
            .header_values("host")
            .map(|v| String::from_utf8_lossy(v).trim().to_string())
            .collect();
        let lower = self.target.to_ascii_lowercase();
        for scheme in ["http://", "https://"] {
            if lower.starts_with(scheme) {
                let rest = &self.target[scheme.len()..];
                let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
                named.push(rest[..end].to_string());
            }
        }
        named
            .into_iter()
            .find(|authority| !authority_is(authority, host, port))
    }
}

/// Whether `authority` (`name`, `name:port`, `[v6]`, `[v6]:port`, with any user info cut)
/// names `host` (normalized) and, when it has a port, `port`.
fn authority_is(authority: &str, host: &str, port: u16) -> bool {
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (name, given_port) = if let Some(rest) = authority.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, after)) => (h, after.strip_prefix(':')),
            None => return false,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port_ok = match given_port {
        None => true,
        Some(p) => p.parse::<u16>().is_ok_and(|p| p == port),
    };
    port_ok && normalize_host(name) == host
}

/// A new placeholder: [`PLACEHOLDER_PREFIX`] and 32 random lower-case hex digits.
pub fn new_placeholder() -> Result<String, SecretError> {
    let mut bytes = [0u8; PLACEHOLDER_HEX / 2];
    getrandom::fill(&mut bytes).map_err(|e| SecretError::Random(e.to_string()))?;
    let mut out = String::with_capacity(placeholder_len());
    out.push_str(PLACEHOLDER_PREFIX);
    for b in bytes {
        out.push(hex_digit(b >> 4));
        out.push(hex_digit(b & 0x0f));
    }
    Ok(out)
}

fn hex_digit(n: u8) -> char {
    char::from(b"0123456789abcdef"[usize::from(n & 0x0f)])
}

fn placeholder_len() -> usize {
    PLACEHOLDER_PREFIX.len() + PLACEHOLDER_HEX
}

/// Whether `text` starts with a placeholder.
fn is_placeholder(text: &[u8]) -> bool {
    text.len() >= placeholder_len()
        && text.starts_with(PLACEHOLDER_PREFIX.as_bytes())
        && text[PLACEHOLDER_PREFIX.len()..placeholder_len()]
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Where placeholders start in `text`.
pub(crate) fn find_placeholders(text: &[u8]) -> Vec<usize> {
    let prefix = PLACEHOLDER_PREFIX.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i + placeholder_len() <= text.len() {
        match text[i..].windows(prefix.len()).position(|w| w == prefix) {
            Some(p) => {
                let at = i + p;
                if is_placeholder(&text[at..]) {
                    found.push(at);
                    i = at + placeholder_len();
                } else {
                    i = at + 1;
                }
            }
            None => break,
        }
    }
    found
}

fn check_name(name: &str) -> Result<(), SecretError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(SecretError::BadName(name.to_string()))
    }
}

/// What keeps `value` out of a header, if anything: control characters would let it end the
/// header (a second request smuggled in), a placeholder inside would be replaced again.
fn value_problem(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        return Some("is empty");
    }
    if value.len() > MAX_VALUE {
        return Some("is over 16 KiB");
    }
    if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Some("holds a control character (a line break, NUL, …)");
    }
    if value.contains(PLACEHOLDER_PREFIX) {
        return Some("holds a placeholder");
    }
    None
}

/// Appends `bytes` percent-encoded: everything but `A-Z a-z 0-9 - . _ ~`.
fn percent_encode(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.push(b'%');
            out.push(b"0123456789ABCDEF"[usize::from(b >> 4)]);
            out.push(b"0123456789ABCDEF"[usize::from(b & 0x0f)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(list: &[&str]) -> Vec<HostRule> {
        list.iter().map(|r| r.parse().expect("rule")).collect()
    }

    fn head(text: &str) -> RequestHead {
        RequestHead::parse(text.as_bytes(), 64)
            .expect("parse")
            .expect("complete")
            .0
    }

    fn two() -> (Secrets, String, String) {
        let a = Secret::new("TOKEN", "v@lue 1", rules(&["api.test"])).expect("a");
        let b = Secret::new("OTHER", "second", rules(&["*.other.test:8443"])).expect("b");
        let (pa, pb) = (a.placeholder().to_string(), b.placeholder().to_string());
        (Secrets::new(vec![a, b]).expect("secrets"), pa, pb)
    }

    #[test]
    fn placeholders_are_random_and_well_formed() {
        let a = new_placeholder().expect("a");
        let b = new_placeholder().expect("b");
        assert_ne!(a, b);
        assert_eq!(a.len(), PLACEHOLDER_PREFIX.len() + 32);
        assert!(is_placeholder(a.as_bytes()));
        assert!(!is_placeholder(b"SANDCELL_SECRET_0123"));
        assert!(!is_placeholder(
            b"SANDCELL_SECRET_0123456789ABCDEF0123456789abcdef"
        ));
    }

    #[test]
    fn bad_secrets_are_refused_without_quoting_the_value() {
        let hosts = rules(&["api.test"]);
        let e = Secret::new("TOKEN", "line\r\nX-Evil: 1", hosts.clone()).expect_err("crlf");
        assert!(!e.to_string().contains("X-Evil"), "{e}");
        assert!(Secret::new("", "v", hosts.clone()).is_err());
        assert!(Secret::new("a b", "v", hosts.clone()).is_err());
        assert!(Secret::new("T", "", hosts.clone()).is_err());
        assert_eq!(
            Secret::new("T", "v", vec![]).expect_err("no hosts"),
            SecretError::NoHosts("T".into())
        );
        assert!(Secret::with_placeholder("T", "v", "SANDCELL_SECRET_xyz", hosts.clone()).is_err());
        let a = Secret::new("T", "v", hosts.clone()).expect("a");
        let b = Secret::with_placeholder("U", "w", a.placeholder(), hosts.clone()).expect("b");
        assert!(matches!(
            Secrets::new(vec![a.clone(), b]),
            Err(SecretError::DuplicatePlaceholder(..))
        ));
        assert!(matches!(
            Secrets::new(vec![a.clone(), a.clone()]),
            Err(SecretError::DuplicateName(..))
        ));
        assert!(!format!("{a:?}").contains("\"v\""), "{a:?}");
    }

    #[test]
    fn values_replace_placeholders_in_headers_and_the_query_for_their_hosts() {
        let (secrets, pa, _) = two();
        let mut h = head(&format!(
            "GET /echo?key={pa}&x=1 HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {pa}\r\nX-Two: {pa}{pa}\r\n\r\n"
        ));
        let used = secrets.apply(&mut h, "API.test.", 443).expect("allowed");
        assert_eq!(used, vec!["TOKEN".to_string()]);
        assert_eq!(h.target, "/echo?key=v%40lue%201&x=1");
        assert_eq!(h.headers[1].1, b"Bearer v@lue 1");
        assert_eq!(h.headers[2].1, b"v@lue 1v@lue 1");
        let text = String::from_utf8(h.to_bytes()).expect("utf8");
        assert!(text.starts_with("GET /echo?key=v%40lue%201&x=1 HTTP/1.1\r\n"));
        assert!(!text.contains(PLACEHOLDER_PREFIX));
    }

    #[test]
    fn a_basic_password_is_replaced_inside_its_encoding() {
        let (secrets, pa, _) = two();
        let engine = base64::engine::general_purpose::STANDARD;
        let creds = engine.encode(format!("me:{pa}"));
        let mut h = head(&format!(
            "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic {creds}\r\n\r\n"
        ));
        assert_eq!(
            secrets.apply(&mut h, "api.test", 443).expect("ok"),
            vec!["TOKEN"]
        );
        let value = String::from_utf8(h.headers[1].1.clone()).expect("utf8");
        let decoded = engine
            .decode(value.strip_prefix("Basic ").expect("basic"))
            .expect("b64");
        assert_eq!(decoded, b"me:v@lue 1");
        let mut h = head(&format!(
            "GET / HTTP/1.1\r\nHost: x.other.test\r\nAuthorization: basic {creds}\r\n\r\n"
        ));
        let r = secrets
            .apply(&mut h, "x.other.test", 8443)
            .expect_err("refused");
        assert_eq!(r.secret.as_deref(), Some("TOKEN"));
    }

    #[test]
    fn a_placeholder_for_another_host_or_in_the_path_is_refused() {
        let (secrets, pa, pb) = two();
        let mut h = head(&format!(
            "GET /?k={pa} HTTP/1.1\r\nHost: other.test\r\n\r\n"
        ));
        let r = secrets
            .apply(&mut h, "other.test", 443)
            .expect_err("refused");
        assert_eq!(r.secret.as_deref(), Some("TOKEN"));
        assert!(
            r.reason.contains("'TOKEN'") && r.reason.contains("api.test"),
            "{r}"
        );
        assert!(!r.reason.contains("v@lue"), "{r}");
        // The port is part of the rule.
        let mut h = head(&format!("GET / HTTP/1.1\r\nX-K: {pb}\r\n\r\n"));
        assert!(secrets.apply(&mut h, "a.other.test", 443).is_err());
        let mut h = head(&format!("GET / HTTP/1.1\r\nX-K: {pb}\r\n\r\n"));
        assert_eq!(
            secrets.apply(&mut h, "a.other.test", 8443).expect("ok"),
            vec!["OTHER"]
        );
        let mut h = head(&format!("GET /{pa}/x HTTP/1.1\r\nHost: api.test\r\n\r\n"));
        let r = secrets.apply(&mut h, "api.test", 443).expect_err("path");
        assert!(r.reason.contains("path"), "{r}");
    }

    #[test]
    fn an_unheld_secret_is_refused_even_for_its_host_and_named() {
        let (held, pa, _) = two();
        let unheld = Secret::unheld("TOKEN", pa.clone(), rules(&["api.test"])).expect("unheld");
        assert_eq!(unheld.value(), None);
        assert_eq!(held.get("TOKEN").and_then(Secret::value), Some("v@lue 1"));
        let secrets = Secrets::new(vec![unheld]).expect("secrets");
        assert!(secrets.any_for("api.test", 443), "its host is still read");
        let mut h = head(&format!(
            "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {pa}\r\n\r\n"
        ));
        let before = h.clone();
        let r = secrets.apply(&mut h, "api.test", 443).expect_err("unheld");
        assert_eq!(r.secret.as_deref(), Some("TOKEN"));
        assert!(r.reason.contains("not held here"), "{r}");
        assert_eq!(
            h.to_bytes(),
            before.to_bytes(),
            "a refused head is unchanged"
        );
        let mut h = head(&format!("GET /?k={pa} HTTP/1.1\r\nHost: x.test\r\n\r\n"));
        let r = secrets.apply(&mut h, "x.test", 443).expect_err("elsewhere");
        assert!(r.reason.contains("only to api.test"), "{r}");
        assert!(Secret::unheld("T", "SANDCELL_SECRET_xyz", rules(&["a.test"])).is_err());
        assert!(Secret::unheld("T", pa, vec![]).is_err());
    }

    #[test]
    fn a_value_goes_only_where_the_connection_goes() {
        let (secrets, pa, _) = two();
        let mut h = head(&format!(
            "GET / HTTP/1.1\r\nHost: other.test\r\nX-K: {pa}\r\n\r\n"
        ));
        let r = secrets
            .apply(&mut h, "api.test", 443)
            .expect_err("fronting");
        assert!(r.reason.contains("'other.test'"), "{r}");
        let mut h = head(&format!(
            "GET https://other.test/ HTTP/1.1\r\nX-K: {pa}\r\n\r\n"
        ));
        assert!(secrets.apply(&mut h, "api.test", 443).is_err());
        for ok in ["api.test", "API.test:443", "api.test."] {
            let mut h = head(&format!(
                "GET / HTTP/1.1\r\nHost: {ok}\r\nX-K: {pa}\r\n\r\n"
            ));
            assert!(secrets.apply(&mut h, "api.test", 443).is_ok(), "{ok}");
        }
        let mut h = head(&format!(
            "GET / HTTP/1.1\r\nHost: api.test:444\r\nX-K: {pa}\r\n\r\n"
        ));
        assert!(secrets.apply(&mut h, "api.test", 443).is_err());
        // A placeholder as the Host: refused, and the refusal quotes the head as sent.
        let mut h = head(&format!("GET / HTTP/1.1\r\nHost: {pa}\r\n\r\n"));
        let before = h.clone();
        let r = secrets.apply(&mut h, "api.test", 443).expect_err("host");
        assert!(!r.reason.contains("v@lue") && r.reason.contains(&pa), "{r}");
        assert_eq!(h, before, "a refused head is left as it was");
        // Without a value to protect, the Host header is the policy's business.
        let mut h = head("GET / HTTP/1.1\r\nHost: other.test\r\n\r\n");
        assert_eq!(
            secrets.apply(&mut h, "api.test", 443).expect("ok"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn unknown_placeholders_and_clean_requests_pass_unchanged() {
        let (secrets, _, _) = two();
        let stranger = new_placeholder().expect("p");
        let text =
            format!("GET /?a={stranger} HTTP/1.1\r\nHost: api.test\r\nX-A: {stranger}\r\n\r\n");
        let mut h = head(&text);
        let before = h.clone();
        assert!(
            secrets
                .apply(&mut h, "api.test", 443)
                .expect("ok")
                .is_empty()
        );
        assert_eq!(h, before);
        assert_eq!(h.to_bytes(), text.as_bytes());
    }

    #[test]
    fn placeholders_are_found_next_to_each_other_and_at_the_ends() {
        let p = new_placeholder().expect("p");
        let text = format!("{p}{p}x{p}");
        assert_eq!(find_placeholders(text.as_bytes()), vec![0, 48, 97]);
        assert!(find_placeholders(b"SANDCELL_SECRET_").is_empty());
        assert!(find_placeholders(&text.as_bytes()[1..47]).is_empty());
    }
}
