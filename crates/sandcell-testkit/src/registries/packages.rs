//! The one fake package, built at start in both ecosystems' formats: a wheel for pip and
//! a tarball for npm, with the digests their indexes advertise.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

use super::archive;

/// The project's name on both indexes.
pub const PACKAGE: &str = "sandcell-fake";
/// The wheel's file name (served under `/files/`).
pub const WHEEL_FILE: &str = "sandcell_fake-1.0-py3-none-any.whl";
/// The npm tarball's file name (served under `/sandcell-fake/-/`).
pub const TARBALL_FILE: &str = "sandcell-fake-1.0.0.tgz";
/// The npm version.
const NPM_VERSION: &str = "1.0.0";

/// Both packages and their digests.
pub(crate) struct Packages {
    pub(crate) wheel: Vec<u8>,
    pub(crate) wheel_sha256_hex: String,
    pub(crate) tarball: Vec<u8>,
    pub(crate) tarball_sha1_hex: String,
    pub(crate) tarball_sha512_b64: String,
}

impl Packages {
    /// Builds the wheel and the tarball.
    pub(crate) fn build() -> std::io::Result<Self> {
        let wheel = wheel();
        let tarball = tarball()?;
        Ok(Packages {
            wheel_sha256_hex: hex(&Sha256::digest(&wheel)),
            tarball_sha1_hex: hex(&Sha1::digest(&tarball)),
            tarball_sha512_b64: STANDARD.encode(Sha512::digest(&tarball)),
            wheel,
            tarball,
        })
    }

    /// The PEP 503 root page: every project (one).
    pub(crate) fn simple_index(&self) -> String {
        format!(
            "<!DOCTYPE html>\n<html><body>\n<a href=\"/simple/{PACKAGE}/\">{PACKAGE}</a>\n\
             </body></html>\n"
        )
    }

    /// The PEP 503 project page: the wheel, its sha256 in the fragment as pip checks it.
    pub(crate) fn simple_project(&self) -> String {
        format!(
            "<!DOCTYPE html>\n<html><body>\n<a href=\"/files/{WHEEL_FILE}#sha256={}\">\
             {WHEEL_FILE}</a>\n</body></html>\n",
            self.wheel_sha256_hex
        )
    }

    /// The npm packument, the tarball under `base` (`https://host:port`, as the client
    /// named this server, so the tarball is fetched the same way).
    pub(crate) fn packument(&self, base: &str) -> serde_json::Value {
        serde_json::json!({
            "_id": PACKAGE,
            "name": PACKAGE,
            "description": "a package served by Sandcell's fake registry",
            "dist-tags": { "latest": NPM_VERSION },
            "versions": {
                NPM_VERSION: {
                    "_id": format!("{PACKAGE}@{NPM_VERSION}"),
                    "name": PACKAGE,
                    "version": NPM_VERSION,
                    "main": "index.js",
                    "license": "Apache-2.0",
                    "dist": {
                        "tarball": format!("{base}/{PACKAGE}/-/{TARBALL_FILE}"),
                        "shasum": self.tarball_sha1_hex,
                        "integrity": format!("sha512-{}", self.tarball_sha512_b64),
                    },
                },
            },
        })
    }
}

/// The wheel: `sandcell_fake.py` (`VALUE = 42`) and its dist-info, RECORD listing each
/// file's sha256 (base64url, unpadded) and size as pip verifies them.
fn wheel() -> Vec<u8> {
    let module: &[u8] = b"VALUE = 42\n";
    let metadata: &[u8] = b"Metadata-Version: 2.1\nName: sandcell-fake\nVersion: 1.0\n\
        Summary: A package served by Sandcell's fake registry\n";
    let wheel_meta: &[u8] = b"Wheel-Version: 1.0\nGenerator: sandcell-testkit\n\
        Root-Is-Purelib: true\nTag: py3-none-any\n";
    let dist_info = "sandcell_fake-1.0.dist-info";
    let metadata_name = format!("{dist_info}/METADATA");
    let wheel_name = format!("{dist_info}/WHEEL");
    let record_name = format!("{dist_info}/RECORD");
    let mut record = String::new();
    for (name, data) in [
        ("sandcell_fake.py", module),
        (metadata_name.as_str(), metadata),
        (wheel_name.as_str(), wheel_meta),
    ] {
        let digest = URL_SAFE_NO_PAD.encode(Sha256::digest(data));
        record.push_str(&format!("{name},sha256={digest},{}\n", data.len()));
    }
    // RECORD cannot hold its own digest.
    record.push_str(&format!("{record_name},,\n"));
    archive::zip_stored(&[
        ("sandcell_fake.py", module),
        (&metadata_name, metadata),
        (&wheel_name, wheel_meta),
        (&record_name, record.as_bytes()),
    ])
}

/// The npm tarball: `package/package.json` and `package/index.js` (`module.exports = 42;`).
fn tarball() -> std::io::Result<Vec<u8>> {
    let package_json = serde_json::json!({
        "name": PACKAGE,
        "version": NPM_VERSION,
        "main": "index.js",
        "license": "Apache-2.0",
    })
    .to_string();
    let mut tar = tar::Builder::new(Vec::new());
    for (path, data) in [
        ("package/package.json", package_json.as_bytes()),
        ("package/index.js", b"module.exports = 42;\n".as_slice()),
    ] {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        // A fixed time: the tarball, and so its digests, are the same every run.
        header.set_mtime(1_000_000_000);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, path, data)?;
    }
    let raw = tar.into_inner()?;
    Ok(archive::gzip_stored(&raw))
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A project name in PEP 503's normal form: lowercase, runs of `-`, `_`, `.` as one `-`.
pub(crate) fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_run {
                out.push('-');
            }
            in_run = true;
        } else {
            out.extend(c.to_lowercase());
            in_run = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalize_as_pep_503_says() {
        assert_eq!(normalize("Sandcell_Fake"), "sandcell-fake");
        assert_eq!(normalize("sandcell.-_fake"), "sandcell-fake");
        assert_eq!(normalize("sandcell-fake"), PACKAGE);
    }

    #[test]
    fn the_record_lists_every_file_with_its_digest() {
        let wheel = wheel();
        let text = String::from_utf8_lossy(&wheel);
        let module_digest = URL_SAFE_NO_PAD.encode(Sha256::digest(b"VALUE = 42\n"));
        assert!(
            text.contains(&format!("sandcell_fake.py,sha256={module_digest},11\n")),
            "{text}"
        );
        assert!(text.contains("sandcell_fake-1.0.dist-info/RECORD,,\n"));
    }

    #[test]
    fn the_packument_advertises_the_tarballs_digests() {
        let p = Packages::build().expect("packages");
        let doc = p.packument("https://npm.test:8443");
        let dist = &doc["versions"]["1.0.0"]["dist"];
        assert_eq!(
            dist["tarball"],
            "https://npm.test:8443/sandcell-fake/-/sandcell-fake-1.0.0.tgz"
        );
        assert_eq!(dist["shasum"], hex(&Sha1::digest(&p.tarball)));
        let integrity = format!("sha512-{}", STANDARD.encode(Sha512::digest(&p.tarball)));
        assert_eq!(dist["integrity"], integrity);
        assert_eq!(doc["dist-tags"]["latest"], "1.0.0");
        assert!(p.simple_project().contains(&p.wheel_sha256_hex));
    }

    #[test]
    fn the_tarball_unpacks_with_the_system_tar_when_present() {
        let p = Packages::build().expect("packages");
        let dir = tempfile::tempdir().expect("a temp dir");
        let tgz = dir.path().join("p.tgz");
        std::fs::write(&tgz, &p.tarball).expect("write");
        match std::process::Command::new("tar")
            .arg("-xzf")
            .arg(&tgz)
            .arg("-C")
            .arg(dir.path())
            .output()
        {
            Ok(out) => {
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let js = std::fs::read_to_string(dir.path().join("package/index.js"))
                    .expect("index.js unpacked");
                assert_eq!(js, "module.exports = 42;\n");
                let pj = std::fs::read_to_string(dir.path().join("package/package.json"))
                    .expect("package.json unpacked");
                assert!(pj.contains("\"name\":\"sandcell-fake\""), "{pj}");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::skip::skip("tar not installed");
            }
            Err(e) => panic!("cannot run tar: {e}"),
        }
    }

    #[test]
    fn the_wheel_reads_with_pythons_zipfile_when_present() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let whl = dir.path().join(WHEEL_FILE);
        std::fs::write(&whl, wheel()).expect("write");
        // testzip() checks every CRC; the module's text must come back exactly.
        let script = "import sys, zipfile\n\
            z = zipfile.ZipFile(sys.argv[1])\n\
            assert z.testzip() is None\n\
            print(z.read('sandcell_fake.py').decode(), end='')\n";
        match std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&whl)
            .output()
        {
            Ok(out) => {
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(out.stdout, b"VALUE = 42\n");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::skip::skip("python3 not installed");
            }
            Err(e) => panic!("cannot run python3: {e}"),
        }
    }
}
