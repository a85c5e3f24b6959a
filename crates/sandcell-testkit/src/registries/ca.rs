//! A throwaway certificate authority: made fresh for each run so that nothing a test trusts
//! outlives it, and able to issue more server certificates (for names a later test invents,
//! such as a proxy that terminates TLS for any host).

use std::fmt;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why a certificate could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// rcgen refused the parameters or could not sign (`what` says which certificate).
    #[error("cannot make the {what}: {source}")]
    Generate {
        /// Which certificate: "test CA" or "certificate for <names>".
        what: String,
        /// rcgen's reason.
        source: rcgen::Error,
    },
    /// A certificate was asked for no name at all.
    #[error("a certificate needs at least one name")]
    NoNames,
    /// rustls refused the certificate and key as a server identity.
    #[error("rustls refuses the certificate for {names}: {source}")]
    Rustls {
        /// The names the certificate covers, comma-separated.
        names: String,
        /// rustls's reason.
        source: rustls::Error,
    },
}

/// A self-signed CA (ECDSA P-256) made at start. Clients trust it through its PEM
/// ([`TestCa::cert_pem`], written to a file by the fake registries); [`TestCa::issue`] signs
/// server certificates with it.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
}

impl fmt::Debug for TestCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key stays out of logs even though it is a test key.
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new CA named `Sandcell test CA` with a fresh key.
    pub fn generate() -> Result<Self, CaError> {
        let fail = |source| CaError::Generate {
            what: "test CA".to_string(),
            source,
        };
        let key = KeyPair::generate().map_err(fail)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "Sandcell test CA");
        dn.push(DnType::OrganizationName, "Sandcell tests");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key_pem = key.serialize_pem();
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(fail)?;
        let cert_pem = issuer.pem();
        Ok(TestCa {
            issuer,
            cert_pem,
            key_pem,
        })
    }

    /// The CA certificate, PEM: what `SSL_CERT_FILE`, `PIP_CERT`, `NODE_EXTRA_CA_CERTS`,
    /// `GIT_SSL_CAINFO` or `CURL_CA_BUNDLE` should name (as a file).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER (for a rustls root store).
    pub fn cert_der(&self) -> &[u8] {
        self.issuer.der().as_ref()
    }

    /// The CA's private key, PKCS#8 PEM: for code in another process that issues its own
    /// certificates from this CA (with rcgen's `Issuer::from_ca_cert_pem`, say, which needs
    /// its `x509-parser` feature); in this process, [`TestCa::issue`] does it.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A server certificate signed by this CA for `names`: each a DNS name or an IP address
    /// (`127.0.0.1`), all as subject alternative names; the first is also the common name.
    pub fn issue(&self, names: &[&str]) -> Result<IssuedCert, CaError> {
        let Some(first) = names.first() else {
            return Err(CaError::NoNames);
        };
        let list = names.join(", ");
        let fail = |source| CaError::Generate {
            what: format!("certificate for {list}"),
            source,
        };
        let owned: Vec<String> = names.iter().map(|n| (*n).to_string()).collect();
        // `new` reads each name as an IP address when it parses as one, else as a DNS name.
        let mut params = CertificateParams::new(owned.clone()).map_err(fail)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, *first);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        // Strict verifiers (Python 3.13's default) want the authority key identifier.
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(fail)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(fail)?;
        Ok(IssuedCert {
            names: owned,
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key_pem: key.serialize_pem(),
            key_der: key.serialize_der(),
        })
    }
}

/// Issues a server certificate for the one `name` (a DNS name or an IP address) from `ca`.
pub fn issue_leaf(ca: &TestCa, name: &str) -> Result<IssuedCert, CaError> {
    ca.issue(&[name])
}

/// A server certificate and its key, as [`TestCa::issue`] made them.
#[derive(Clone)]
pub struct IssuedCert {
    names: Vec<String>,
    cert_pem: String,
    cert_der: Vec<u8>,
    key_pem: String,
    key_der: Vec<u8>,
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl IssuedCert {
    /// The names it covers, as given.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// Its private key, PKCS#8 PEM.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Its private key, PKCS#8 DER.
    pub fn key_der(&self) -> &[u8] {
        &self.key_der
    }

    /// A rustls server configuration presenting this certificate (ring provider, TLS 1.2
    /// and 1.3, no client certificates, HTTP/1.1 only).
    pub fn rustls_server_config(&self) -> Result<Arc<rustls::ServerConfig>, CaError> {
        let fail = |source| CaError::Rustls {
            names: self.names.join(", "),
            source,
        };
        // An explicit provider: the process-wide default is ambiguous when another crate in
        // the build enables a second one.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(fail)?
            .with_no_client_auth()
            .with_single_cert(vec![CertificateDer::from(self.cert_der.clone())], key)
            .map_err(fail)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_and_its_certificates_are_pem() {
        let ca = TestCa::generate().expect("a CA");
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem().contains("PRIVATE KEY-----"));
        let leaf = ca.issue(&["pypi.test", "127.0.0.1"]).expect("a leaf");
        assert!(leaf.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert_ne!(leaf.cert_der(), ca.cert_der());
        assert_eq!(leaf.names(), ["pypi.test", "127.0.0.1"]);
        leaf.rustls_server_config().expect("rustls takes it");
    }

    #[test]
    fn a_certificate_needs_a_name() {
        let ca = TestCa::generate().expect("a CA");
        assert!(matches!(ca.issue(&[]), Err(CaError::NoNames)));
    }

    #[test]
    fn an_invalid_dns_name_is_refused() {
        let ca = TestCa::generate().expect("a CA");
        let err = issue_leaf(&ca, "not a name\u{e9}").expect_err("refused");
        assert!(err.to_string().contains("certificate for"), "{err}");
    }
}
