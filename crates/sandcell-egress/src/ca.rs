//! The TLS the proxy terminates to put secrets in requests: its own CA (which the sandbox
//! trusts, and which signs a certificate per host on first use) and the roots it verifies
//! upstream servers with (the host's, never skipped).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Host certificates kept at once; past this the cache starts over (each is made again on
/// its next use, a millisecond's work).
const MAX_LEAVES: usize = 4096;

/// Where the host's CA bundle is, by distribution (Debian and Ubuntu, Fedora and RHEL,
/// openSUSE, Alpine), the first that exists is read.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The ALPN protocol spoken on both sides of a terminated tunnel: requests are read one at
/// a time as HTTP/1.1.
pub(crate) const HTTP11: &[u8] = b"http/1.1";

/// Why the interception CA, a host certificate or the upstream roots could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// rcgen refused the parameters or could not sign (`what` says which certificate).
    #[error("cannot make the {what}: {source}")]
    Generate {
        /// Which certificate: "interception CA" or "certificate for <host>".
        what: String,
        /// rcgen's reason.
        source: rcgen::Error,
    },
    /// rustls refused a certificate, a key or a root store.
    #[error("rustls refuses {what}: {source}")]
    Rustls {
        /// What it refused.
        what: String,
        /// rustls's reason.
        source: rustls::Error,
    },
    /// A CA bundle could not be read.
    #[error("cannot read the CA bundle {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The reason.
        source: std::io::Error,
    },
    /// PEM text held something that is not a certificate, or none at all.
    #[error("{what}: {why}")]
    Pem {
        /// Which text (a file, "the given PEM").
        what: String,
        /// What is wrong with it.
        why: String,
    },
    /// None of the usual CA bundles exists on this host.
    #[error("no CA bundle on this host (looked for {0})")]
    NoSystemBundle(String),
}

/// A CA made when the proxy's owner starts, kept in memory only (its key is never written):
/// the sandbox trusts its certificate ([`InterceptCa::cert_pem`]), and it signs a
/// certificate for each host whose tunnel the proxy terminates, kept for the next tunnel.
pub struct InterceptCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    cert_pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl fmt::Debug for InterceptCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InterceptCa").finish_non_exhaustive()
    }
}

impl InterceptCa {
    /// A new CA (ECDSA P-256) named `Sandcell egress CA`, with a fresh key.
    pub fn generate() -> Result<Self, CaError> {
        let fail = |source| CaError::Generate {
            what: "interception CA".to_string(),
            source,
        };
        let key = KeyPair::generate().map_err(fail)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "Sandcell egress CA");
        dn.push(DnType::OrganizationName, "Sandcell");
        params.distinguished_name = dn;
        // It signs host certificates only, never another CA.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(fail)?;
        let cert_pem = issuer.pem();
        Ok(Self {
            issuer,
            cert_pem,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM: what the sandbox must trust (a file named by
    /// `SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`, `REQUESTS_CA_BUNDLE`, `CURL_CA_BUNDLE`,
    /// `GIT_SSL_CAINFO`, or added to its system bundle).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER (for a rustls root store).
    pub fn cert_der(&self) -> &[u8] {
        self.issuer.der().as_ref()
    }

    /// Host certificates in the cache now.
    pub fn cached_leaves(&self) -> usize {
        self.leaves
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// A server configuration presenting a certificate for `host` (a DNS name or an IP
    /// address) signed by this CA: made on first use, then kept. HTTP/1.1 is the one ALPN
    /// protocol it offers.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        if let Some(config) = self
            .leaves
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(host)
        {
            return Ok(config.clone());
        }
        let config = self.issue(host)?;
        let mut leaves = self.leaves.lock().unwrap_or_else(PoisonError::into_inner);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_string(), config.clone());
        Ok(config)
    }

    /// Signs a certificate for `host` and builds its server configuration.
    fn issue(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        let fail = |source| CaError::Generate {
            what: format!("certificate for {host}"),
            source,
        };
        // `new` reads the name as an IP address when it parses as one, else as a DNS name.
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(fail)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        // Strict verifiers (Python 3.13's default) want the authority key identifier.
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(fail)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(fail)?;
        let chain = vec![cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|source| CaError::Rustls {
                what: format!("the certificate for {host}"),
                source,
            })?;
        config.alpn_protocols = vec![HTTP11.to_vec()];
        Ok(Arc::new(config))
    }
}

/// The roots the proxy verifies upstream servers with when it terminates a tunnel: the
/// host's CA bundle, and any more a caller adds (a test's CA, an operator's private one).
#[derive(Clone)]
pub struct UpstreamTrust {
    roots: RootCertStore,
}

impl fmt::Debug for UpstreamTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTrust")
            .field("roots", &self.roots.len())
            .finish()
    }
}

impl UpstreamTrust {
    /// No roots: every upstream fails verification until some are added.
    pub fn empty() -> Self {
        Self {
            roots: RootCertStore::empty(),
        }
    }

    /// The host's roots: the file `SSL_CERT_FILE` names when set, else the first of the
    /// distributions' bundles that exists.
    pub fn system() -> Result<Self, CaError> {
        if let Some(path) = std::env::var_os("SSL_CERT_FILE") {
            return Self::empty().with_pem_file(Path::new(&path));
        }
        match SYSTEM_BUNDLES.iter().map(Path::new).find(|p| p.is_file()) {
            Some(path) => Self::empty().with_pem_file(path),
            None => Err(CaError::NoSystemBundle(SYSTEM_BUNDLES.join(", "))),
        }
    }

    /// And the certificates of the PEM file `path`.
    pub fn with_pem_file(self, path: &Path) -> Result<Self, CaError> {
        let text = std::fs::read(path).map_err(|source| CaError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.add(&text, &path.display().to_string())
    }

    /// And the certificates of `pem` (one or more `CERTIFICATE` blocks).
    pub fn with_pem(self, pem: &str) -> Result<Self, CaError> {
        self.add(pem.as_bytes(), "the given PEM")
    }

    /// Roots held.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    /// No roots held.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    fn add(mut self, pem: &[u8], what: &str) -> Result<Self, CaError> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CaError::Pem {
                what: what.to_string(),
                why: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(CaError::Pem {
                what: what.to_string(),
                why: "no certificate in it".to_string(),
            });
        }
        // A bundle may hold a certificate webpki cannot read (an old or odd one): the rest
        // still count, as for the host's own clients.
        let (added, _ignored) = self.roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(CaError::Pem {
                what: what.to_string(),
                why: "no certificate in it can be a root".to_string(),
            });
        }
        Ok(self)
    }

    /// A client configuration verifying servers against these roots, offering HTTP/1.1.
    fn client_config(&self) -> Result<Arc<ClientConfig>, CaError> {
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| CaError::Rustls {
                what: "the upstream TLS configuration".to_string(),
                source,
            })?
            .with_root_certificates(self.roots.clone())
            .with_no_client_auth();
        config.alpn_protocols = vec![HTTP11.to_vec()];
        Ok(Arc::new(config))
    }
}

/// What the proxy needs to terminate tunnels: the CA the sandbox trusts and the roots it
/// verifies upstreams with. Cheap to clone; one may serve every sandbox's proxy (the CA's
/// certificate cache is shared).
#[derive(Clone)]
pub struct Interception {
    ca: Arc<InterceptCa>,
    upstream: Arc<ClientConfig>,
}

impl fmt::Debug for Interception {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interception").finish_non_exhaustive()
    }
}

impl Interception {
    /// Terminates with `ca`'s certificates and verifies upstreams against `trust`.
    pub fn new(ca: Arc<InterceptCa>, trust: &UpstreamTrust) -> Result<Self, CaError> {
        Ok(Self {
            ca,
            upstream: trust.client_config()?,
        })
    }

    /// The CA.
    pub fn ca(&self) -> &Arc<InterceptCa> {
        &self.ca
    }

    /// The client configuration for upstream connections.
    pub(crate) fn upstream(&self) -> &Arc<ClientConfig> {
        &self.upstream
    }
}

/// An explicit provider: the process-wide default is ambiguous when another crate in the
/// build enables a second one.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_certificates_are_made_once_and_kept() {
        let ca = InterceptCa::generate().expect("ca");
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let a = ca.server_config("api.test").expect("a");
        let again = ca.server_config("api.test").expect("again");
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!(a.alpn_protocols, vec![HTTP11.to_vec()]);
        ca.server_config("127.0.0.1").expect("an address");
        ca.server_config("::1").expect("a v6 address");
        assert_eq!(ca.cached_leaves(), 3);
        assert!(ca.server_config("not a name\u{e9}").is_err());
    }

    #[test]
    fn upstream_roots_come_from_pem_and_bad_pem_is_refused() {
        let ca = InterceptCa::generate().expect("ca");
        let trust = UpstreamTrust::empty().with_pem(ca.cert_pem()).expect("pem");
        assert_eq!(trust.len(), 1);
        assert!(UpstreamTrust::empty().with_pem("nothing here").is_err());
        let e = UpstreamTrust::empty()
            .with_pem_file(Path::new("/nonexistent/bundle.pem"))
            .expect_err("missing");
        assert!(e.to_string().contains("/nonexistent/bundle.pem"), "{e}");
        Interception::new(Arc::new(ca), &trust).expect("interception");
    }

    #[test]
    fn the_system_bundle_is_read_where_there_is_one() {
        sandcell_testkit::require!(
            SYSTEM_BUNDLES.iter().any(|p| Path::new(p).is_file())
                && std::env::var_os("SSL_CERT_FILE").is_none(),
            "no system CA bundle here (or SSL_CERT_FILE names another)"
        );
        let trust = UpstreamTrust::system().expect("system roots");
        assert!(trust.len() > 10, "{trust:?}");
    }
}
