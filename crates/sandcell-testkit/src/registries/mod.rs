//! Fake package registries on loopback, for tests of network egress through a proxy: real
//! `pip`, `npm`, `git` and `curl` fetch from them over HTTPS (trusting a test CA made at
//! start) or plain HTTP, and the test reads which requests arrived.
//!
//! Both listeners (one HTTPS, one HTTP, on 127.0.0.1 at free ports) serve the same paths
//! whatever the Host header names:
//!
//! | path | what |
//! | --- | --- |
//! | `GET /simple/`, `GET /simple/sandcell-fake/` | a PEP 503 index with one wheel (`VALUE = 42`) |
//! | `GET /files/sandcell_fake-1.0-py3-none-any.whl` | the wheel |
//! | `GET /sandcell-fake` | an npm packument; its tarball URL uses the request's scheme and Host |
//! | `GET /sandcell-fake/-/sandcell-fake-1.0.0.tgz` | the npm tarball (`module.exports = 42;`) |
//! | `GET /repo.git/…` | a bare git repository as static files (dumb HTTP): `main`, `dev` |
//! | any method on `/echo` | JSON `{"method", "path" (with query), "headers": {name: value}, "body_len"}` |
//! | `GET /bytes/<n>` | `n` bytes with Content-Length; byte `i` is `i % 251` |
//!
//! Everything else is a 404. Every request (404s included) is recorded: [`FakeRegistries::requests`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), sandcell_testkit::registries::RegistriesError> {
//! use sandcell_testkit::registries::FakeRegistries;
//!
//! let fake = FakeRegistries::start(&["pypi.test", "npm.test"]).await?;
//! let index = format!("https://127.0.0.1:{}/simple/", fake.https_addr().port());
//! // pip install --index-url $index with PIP_CERT=fake.ca_pem_path() …
//! assert!(fake.requests().iter().any(|r| r.path == "/simple/sandcell-fake/"));
//! # Ok(()) }
//! ```

mod archive;
pub mod ca;
mod git;
mod packages;
mod server;

use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use ca::{CaError, IssuedCert, TestCa, issue_leaf};
pub use git::{DEV_FILE, GitError, README_TEXT};
pub use packages::{PACKAGE, TARBALL_FILE, WHEEL_FILE};

use server::{Content, Log, Site};

/// The name the server certificate always covers besides the caller's names, so clients
/// can name the server by address without any name mapping.
pub const LOOPBACK: &str = "127.0.0.1";

/// How long [`FakeRegistries::shutdown`] lets open connections finish before cutting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// One request as it arrived.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SeenRequest {
    /// Whether it came to the HTTPS listener.
    pub tls: bool,
    /// The method (`GET`, …).
    pub method: String,
    /// The Host header (or the URI's authority when there was none), port included when the
    /// client sent one.
    pub host: Option<String>,
    /// The path, without the query.
    pub path: String,
    /// The query, without the `?`.
    pub query: Option<String>,
}

/// Why the fake registries could not start.
#[derive(Debug, thiserror::Error)]
pub enum RegistriesError {
    /// The test CA or the server certificate could not be made.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// The fake git repository could not be made (git is installed but failed).
    #[error(transparent)]
    Git(#[from] GitError),
    /// The fake git repository could not be read back.
    #[error("cannot read the git repository: {0}")]
    GitRead(std::io::Error),
    /// The temporary directory could not be made.
    #[error("cannot make a temporary directory: {0}")]
    TempDir(std::io::Error),
    /// A file could not be written (the CA PEM) or opened (the request log).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The reason.
        source: std::io::Error,
    },
    /// The npm tarball could not be built.
    #[error("cannot build the npm tarball: {0}")]
    Tarball(std::io::Error),
    /// A listener could not be bound on 127.0.0.1.
    #[error("cannot listen on 127.0.0.1 for {which}: {source}")]
    Bind {
        /// "https" or "http".
        which: &'static str,
        /// The reason.
        source: std::io::Error,
    },
    /// The blocking start-up work (keys, archives, git) panicked or was cancelled.
    #[error("the start-up task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// The running fake registries. Dropping it (or [`FakeRegistries::shutdown`]) stops both
/// listeners and removes its temporary files (the CA PEM, the git repository, which is
/// served from memory).
pub struct FakeRegistries {
    names: Vec<String>,
    https_addr: SocketAddr,
    http_addr: SocketAddr,
    ca: Arc<TestCa>,
    ca_pem_path: PathBuf,
    has_git_repo: bool,
    log: Arc<Log>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    // Last, so the files go only after the servers were told to stop.
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for FakeRegistries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRegistries")
            .field("names", &self.names)
            .field("https_addr", &self.https_addr)
            .field("http_addr", &self.http_addr)
            .field("ca_pem_path", &self.ca_pem_path)
            .finish_non_exhaustive()
    }
}

/// What the blocking part of start-up makes.
struct Made {
    ca: TestCa,
    leaf: IssuedCert,
    ca_pem_path: PathBuf,
    content: Content,
}

impl FakeRegistries {
    /// Starts both listeners, with a server certificate for `names` and `127.0.0.1`.
    /// Needs a tokio runtime with IO and time enabled. Without `git` on PATH everything but
    /// `/repo.git/` is served ([`FakeRegistries::has_git_repo`] says which).
    pub async fn start(names: &[&str]) -> Result<Self, RegistriesError> {
        Self::start_with_log(names, None).await
    }

    /// [`FakeRegistries::start`], also appending each request to `log` as a JSON line
    /// ([`SeenRequest`]'s fields), for a test in another process.
    pub async fn start_with_log(
        names: &[&str],
        log: Option<&Path>,
    ) -> Result<Self, RegistriesError> {
        let mut unique: Vec<String> = Vec::with_capacity(names.len());
        for name in names {
            if !unique.iter().any(|n| n == name) {
                unique.push((*name).to_string());
            }
        }
        let names = unique;
        let log_file = match log {
            Some(path) => Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| RegistriesError::Write {
                        path: path.to_path_buf(),
                        source,
                    })?,
            ),
            None => None,
        };
        let dir = tempfile::Builder::new()
            .prefix("sandcell-fake-registries-")
            .tempdir()
            .map_err(RegistriesError::TempDir)?;
        let dir_path = dir.path().to_path_buf();
        let cert_names = names.clone();
        // Key generation and git are blocking work: off the runtime's threads.
        let made = tokio::task::spawn_blocking(move || make(&dir_path, &cert_names)).await??;

        // Bound before anything is reported: a client may connect as soon as it has a port.
        let bind = |which| move |source| RegistriesError::Bind { which, source };
        let https = TcpListener::bind((LOOPBACK, 0))
            .await
            .map_err(bind("https"))?;
        let http = TcpListener::bind((LOOPBACK, 0))
            .await
            .map_err(bind("http"))?;
        let https_addr = https.local_addr().map_err(bind("https"))?;
        let http_addr = http.local_addr().map_err(bind("http"))?;

        let tls_config = made.leaf.rustls_server_config()?;
        let content = Arc::new(made.content);
        let log = Arc::new(Log::new(log_file));
        let (stop, stopped) = watch::channel(false);
        let site = |tls, addr| Site {
            tls,
            addr,
            content: content.clone(),
            log: log.clone(),
        };
        let (incoming, accept_task) = server::tls_incoming(
            https,
            tokio_rustls::TlsAcceptor::from(tls_config),
            stopped.clone(),
        )
        .map_err(bind("https"))?;
        let tasks = vec![
            accept_task,
            tokio::spawn(server::serve(
                incoming,
                server::router(site(true, https_addr)),
                stopped.clone(),
            )),
            tokio::spawn(server::serve(
                http,
                server::router(site(false, http_addr)),
                stopped,
            )),
        ];
        Ok(FakeRegistries {
            names,
            https_addr,
            http_addr,
            ca: Arc::new(made.ca),
            ca_pem_path: made.ca_pem_path,
            has_git_repo: content.git_files.is_some(),
            log,
            stop,
            tasks,
            _dir: dir,
        })
    }

    /// The HTTPS listener (127.0.0.1, a free port).
    pub fn https_addr(&self) -> SocketAddr {
        self.https_addr
    }

    /// The plain-HTTP listener (127.0.0.1, another free port).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The CA certificate as a PEM file, for `SSL_CERT_FILE`, `PIP_CERT`,
    /// `NODE_EXTRA_CA_CERTS`, `GIT_SSL_CAINFO`, `CURL_CA_BUNDLE`; removed with `self`.
    pub fn ca_pem_path(&self) -> &Path {
        &self.ca_pem_path
    }

    /// The CA itself: its PEMs, and [`TestCa::issue`] for more certificates.
    pub fn ca(&self) -> &Arc<TestCa> {
        &self.ca
    }

    /// The names the server certificate covers besides `127.0.0.1`, as given to `start`.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether `/repo.git/` is served (`git` was installed at start).
    pub fn has_git_repo(&self) -> bool {
        self.has_git_repo
    }

    /// Every request so far, oldest first, from both listeners.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.log.snapshot()
    }

    /// Forgets the requests seen so far (the log file, if any, keeps them).
    pub fn clear_requests(&self) {
        self.log.clear();
    }

    /// Stops both listeners, waits (a few seconds at most) for open connections to finish,
    /// and removes the temporary files.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for mut task in std::mem::take(&mut self.tasks) {
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }
}

impl Drop for FakeRegistries {
    fn drop(&mut self) {
        // The accept loop and both servers see it at their next poll: the listeners close
        // and idle connections end; a request in flight finishes on its own.
        let _ = self.stop.send(true);
    }
}

/// The CA, the server certificate, the CA PEM file, the packages and the git repository.
fn make(dir: &Path, names: &[String]) -> Result<Made, RegistriesError> {
    let ca = TestCa::generate()?;
    let mut cert_names: Vec<&str> = names.iter().map(String::as_str).collect();
    if !cert_names.contains(&LOOPBACK) {
        cert_names.push(LOOPBACK);
    }
    let leaf = ca.issue(&cert_names)?;
    let ca_pem_path = dir.join("ca.pem");
    std::fs::write(&ca_pem_path, ca.cert_pem()).map_err(|source| RegistriesError::Write {
        path: ca_pem_path.clone(),
        source,
    })?;
    let packages = packages::Packages::build().map_err(RegistriesError::Tarball)?;
    let git_files = match git::make_repository(dir)? {
        Some(repo) => Some(git::read_files(&repo).map_err(RegistriesError::GitRead)?),
        None => None,
    };
    Ok(Made {
        ca,
        leaf,
        ca_pem_path,
        content: Content {
            packages,
            git_files,
        },
    })
}
