//! Signed download URLs: an export's content may be fetched without an API key by whoever
//! holds a URL the service signed (HMAC-SHA256 over the export id and an expiry), until that
//! expiry. The key lives in `<home>/url-signing.key` (0600), so URLs survive a restart;
//! deleting the file (and restarting) invalidates every URL given out.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the signing key.
const KEY_BYTES: usize = 32;

/// Why a signed URL was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The URL's time is up.
    #[error("the link expired at {expires} (unix seconds)")]
    Expired { expires: i64 },
    /// Not what the service signed (changed, truncated, or for another export).
    #[error("the link's signature does not match")]
    Mismatch,
}

/// Signs and checks download URLs with the service's key.
pub struct UrlSigner {
    key: [u8; KEY_BYTES],
}

impl std::fmt::Debug for UrlSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UrlSigner(..)")
    }
}

/// `<home>/url-signing.key`.
pub fn key_path(home: &Path) -> PathBuf {
    home.join("url-signing.key")
}

impl UrlSigner {
    /// A signer with this key (tests).
    pub fn with_key(key: [u8; KEY_BYTES]) -> Self {
        Self { key }
    }

    /// The key in `home`, made (from /dev/urandom, mode 0600) when there is none.
    pub fn load_or_create(home: &Path) -> std::io::Result<Self> {
        let path = key_path(home);
        let mut key = [0u8; KEY_BYTES];
        match std::fs::File::open(&path) {
            Ok(mut f) => {
                f.read_exact(&mut key)?;
                return Ok(Self { key });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
        // create_new: two services starting at once on one home keep the first one's key.
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(&key)?;
                f.sync_all()?;
                Ok(Self { key })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::File::open(&path)?.read_exact(&mut key)?;
                Ok(Self { key })
            }
            Err(e) => Err(e),
        }
    }

    fn mac(&self, export_id: &str, expires: i64) -> Hmac<Sha256> {
        // A fresh HMAC takes a key of any length: this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(format!("export-content\n{export_id}\n{expires}").as_bytes());
        mac
    }

    /// The signature (hex) of `subject` in `scope` (e.g. `preview`) until `expires`: a MAC
    /// of its own domain, never valid as another scope's.
    pub fn sign_scoped(&self, scope: &str, subject: &str, expires: i64) -> String {
        let mut mac = <Hmac<Sha256> as hmac::Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        hmac::Mac::update(
            &mut mac,
            format!("{scope}\n{subject}\n{expires}").as_bytes(),
        );
        hmac::Mac::finalize(mac)
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Checks a [`Self::sign_scoped`] signature (constant time) and its expiry.
    pub fn verify_scoped(
        &self,
        scope: &str,
        subject: &str,
        expires: i64,
        signature: &str,
        now: i64,
    ) -> Result<(), SignatureError> {
        let bytes = decode_hex(signature).ok_or(SignatureError::Mismatch)?;
        let mut mac = <Hmac<Sha256> as hmac::Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        hmac::Mac::update(
            &mut mac,
            format!("{scope}\n{subject}\n{expires}").as_bytes(),
        );
        hmac::Mac::verify_slice(mac, &bytes).map_err(|_| SignatureError::Mismatch)?;
        if now >= expires {
            return Err(SignatureError::Expired { expires });
        }
        Ok(())
    }

    /// The signature (hex) of `export_id`'s content until `expires` (unix seconds).
    pub fn sign(&self, export_id: &str, expires: i64) -> String {
        self.mac(export_id, expires)
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Checks a signature (constant time) and the expiry against `now` (unix seconds).
    pub fn verify(
        &self,
        export_id: &str,
        expires: i64,
        signature: &str,
        now: i64,
    ) -> Result<(), SignatureError> {
        let bytes = decode_hex(signature).ok_or(SignatureError::Mismatch)?;
        self.mac(export_id, expires)
            .verify_slice(&bytes)
            .map_err(|_| SignatureError::Mismatch)?;
        if now >= expires {
            return Err(SignatureError::Expired { expires });
        }
        Ok(())
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_holds_for_its_export_until_it_expires() {
        let s = UrlSigner::with_key([7; KEY_BYTES]);
        let sig = s.sign("ex-0123456789abcdef", 1_000);
        assert_eq!(sig.len(), 64);
        assert_eq!(s.verify("ex-0123456789abcdef", 1_000, &sig, 999), Ok(()));
        assert_eq!(
            s.verify("ex-0123456789abcdef", 1_000, &sig, 1_000),
            Err(SignatureError::Expired { expires: 1_000 })
        );
        // Another export, another expiry, another key, a changed or malformed signature.
        let mismatch = Err(SignatureError::Mismatch);
        assert_eq!(s.verify("ex-0123456789abcdee", 1_000, &sig, 0), mismatch);
        assert_eq!(s.verify("ex-0123456789abcdef", 9_999, &sig, 0), mismatch);
        let other = UrlSigner::with_key([8; KEY_BYTES]);
        assert_eq!(
            other.verify("ex-0123456789abcdef", 1_000, &sig, 0),
            mismatch
        );
        let mut changed = sig.clone();
        changed.replace_range(0..1, if sig.starts_with('0') { "1" } else { "0" });
        assert_eq!(
            s.verify("ex-0123456789abcdef", 1_000, &changed, 0),
            mismatch
        );
        for bad in ["", "zz", &sig[..63], "é"] {
            assert_eq!(s.verify("ex-0123456789abcdef", 1_000, bad, 0), mismatch);
        }
    }

    #[test]
    fn the_key_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let home = tempfile::tempdir().unwrap();
        let a = UrlSigner::load_or_create(home.path()).unwrap();
        let b = UrlSigner::load_or_create(home.path()).unwrap();
        assert_eq!(a.sign("ex-1", 5), b.sign("ex-1", 5));
        let mode = std::fs::metadata(key_path(home.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_file(key_path(home.path())).unwrap();
        let c = UrlSigner::load_or_create(home.path()).unwrap();
        assert_ne!(a.sign("ex-1", 5), c.sign("ex-1", 5));
    }
}
