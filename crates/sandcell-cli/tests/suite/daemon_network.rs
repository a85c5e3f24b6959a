//! A sandbox's network through the daemon: the policy at create and in its record, changed
//! live with `PUT …/network`, its egress events over the API (and in the audit log), kept
//! across a daemon crash; bad policies are structured errors; the test-only name mapping is
//! refused outside tests; both backends.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};

use reqwest::Method;
use serde_json::{Value, json};

use super::common::BIN;
use super::daemon::{Daemon, send};

/// A web server on the host's loopback answering `hello <path>` (one thread, until the test
/// process ends).
pub(super) fn web_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&got).to_string();
                let path = head.split(' ').nth(1).unwrap_or("?").to_string();
                let body = format!("hello {path}");
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// A daemon whose proxies map `web.test` to the host's loopback (the test-only setting).
pub(super) fn daemon() -> Daemon {
    Daemon::start_with_env(
        &[],
        &[
            ("SANDCELL_TEST", "1"),
            ("SANDCELL_TEST_RESOLVE", "web.test=127.0.0.1"),
        ],
    )
}

fn curl(d: &Daemon, id: &str, url: &str) -> String {
    let out = d.exec(
        id,
        &format!("curl -sS --max-time 20 -w '\\ncode=%{{http_code}}' {url} 2>&1"),
    );
    out.stdout
}

fn events(d: &Daemon, id: &str) -> Vec<Value> {
    let r = d.get(&format!("/v1/sandboxes/{id}/network/events"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["events"].as_array().unwrap().clone()
}

#[test]
fn the_policy_is_set_at_create_changed_live_and_its_events_are_listed() {
    let port = web_server();
    let mut d = daemon();
    let sb = d.create(json!({"network": {"allow": ["web.test"]}}));
    assert_eq!(
        serde_json::to_value(&sb.network).unwrap(),
        json!({"allow": ["web.test"]})
    );
    let id = sb.id;
    let out = curl(&d, &id, &format!("http://web.test:{port}/one"));
    assert!(out.ends_with("hello /one\ncode=200"), "{out}");
    let out = curl(&d, &id, &format!("http://elsewhere.test:{port}/"));
    assert!(out.contains("code=403"), "{out}");

    let info = d.get(&format!("/v1/sandboxes/{id}/network"));
    assert_eq!(info.status, 200, "{}", info.body);
    assert_eq!(info.body["network"], json!({"allow": ["web.test"]}));
    assert_eq!(info.body["http_proxy"], "http://127.0.0.1:3128");
    assert_eq!(info.body["socks_proxy"], "socks5h://127.0.0.1:1080");
    assert!(info.body["bytes"].as_u64().unwrap() > 0, "{}", info.body);

    let evs = events(&d, &id);
    assert_eq!(evs.len(), 2, "{evs:?}");
    // Newest first.
    assert_eq!(evs[0]["decision"], "denied");
    assert_eq!(evs[0]["host"], "elsewhere.test");
    assert!(evs[0]["reason"].as_str().unwrap().contains("not allowed"));
    assert_eq!(evs[1]["decision"], "allowed");
    assert_eq!(evs[1]["host"], "web.test");
    assert_eq!(evs[1]["port"], port);
    assert_eq!(evs[1]["address"], format!("127.0.0.1:{port}"));
    assert!(evs[1]["bytes_down"].as_u64().unwrap() > 0);
    let page = d.get(&format!("/v1/sandboxes/{id}/network/events?limit=1"));
    assert_eq!(page.body["events"].as_array().unwrap().len(), 1);
    let before = page.body["next_before"].as_i64().unwrap();
    let older = d.get(&format!(
        "/v1/sandboxes/{id}/network/events?limit=1&before={before}"
    ));
    assert_eq!(older.body["events"][0]["decision"], "allowed");

    // Live: the next connection is decided under the new policy, and the record keeps it.
    let r = d.call(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/network"),
        Some(json!({"network": "loopback"})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["network"], "loopback");
    let out = curl(&d, &id, &format!("http://web.test:{port}/two"));
    assert!(out.contains("code=403"), "{out}");
    assert_eq!(
        serde_json::to_value(d.sandbox(&id).network).unwrap(),
        json!("loopback")
    );
    let r = d.call(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/network"),
        Some(json!({"network": {"allow": ["web.test"]}})),
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // Bad input: structured errors, nothing changed.
    d.call(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/network"),
        Some(json!({"network": "off"})),
    )
    .expect_error(400, "invalid_argument");
    for bad in [
        json!({"network": {"allow": ["http://web.test/"]}}),
        json!({"network": {"allow": []}}),
        json!({"network": "wide"}),
        json!({"policy": "full"}),
    ] {
        let r = d.call(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/network"),
            Some(bad.clone()),
        );
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        r.error_code();
    }
    let r = d.post("/v1/sandboxes", json!({"network": {"allow": ["*.*"]}}));
    assert_eq!(r.status, 400, "{}", r.body);
    d.get("/v1/sandboxes/sb-nosuch/network")
        .expect_error(404, "not_found");

    // A crash of the daemon: the sandbox is reattached, its proxy listens again in the same
    // folder, under the policy its record kept.
    d.kill9();
    d.restart(&[]);
    let out = curl(&d, &id, &format!("http://web.test:{port}/three"));
    assert!(out.ends_with("hello /three\ncode=200"), "{out}");
    let out = curl(&d, &id, &format!("http://elsewhere.test:{port}/"));
    assert!(out.contains("code=403"), "{out}");
    assert!(events(&d, &id).len() >= 5);
    d.delete(&format!("/v1/sandboxes/{id}"));
    // The events outlive the sandbox (they are the audit log's).
    assert!(events(&d, &id).len() >= 5);
}

#[test]
fn a_sandbox_with_the_network_off_has_no_proxy_and_cannot_get_one() {
    let d = daemon();
    let id = d.create_id(json!({"network": "off"}));
    let out = d.exec(&id, "ls -A /run/sandcell; env | grep -ci _proxy=");
    assert_eq!(out.stdout.trim(), "0");
    let info = d.get(&format!("/v1/sandboxes/{id}/network")).body;
    assert_eq!(info["network"], "off");
    assert!(info["http_proxy"].is_null(), "{info}");
    d.call(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/network"),
        Some(json!({"network": "full"})),
    )
    .expect_error(400, "invalid_argument");
}

#[test]
fn gvisor_sandboxes_get_out_through_the_same_proxy() {
    let port = web_server();
    let d = daemon();
    let id = d.create_id(json!({"backend": "gvisor", "network": {"allow": ["web.test"]}}));
    let out = curl(&d, &id, &format!("http://web.test:{port}/gv"));
    assert!(out.ends_with("hello /gv\ncode=200"), "{out}");
    let out = curl(&d, &id, &format!("-p http://elsewhere.test:{port}/"));
    assert!(out.contains("403"), "{out}");
    let evs = events(&d, &id);
    assert_eq!(evs.len(), 2, "{evs:?}");
}

#[test]
fn the_test_only_name_mapping_is_refused_outside_tests() {
    let home = tempfile::tempdir().unwrap();
    for (env, listen, why) in [
        (vec![], "127.0.0.1:0", "SANDCELL_TEST=1"),
        (vec![("SANDCELL_TEST", "1")], "0.0.0.0:0", "not loopback"),
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--home"])
            .arg(home.path())
            .args(["--listen", listen])
            .env("SANDCELL_TEST_RESOLVE", "web.test=127.0.0.1")
            .env_remove("SANDCELL_TEST")
            .envs(env)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{listen}: it started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{listen}: {err}");
    }
}

/// A static file server on the host's loopback for `root` (a dumb-HTTP git server when it
/// holds a bare repository), recording each request's head.
fn static_server(root: std::path::PathBuf) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let (root, seen) = (root.clone(), seen.clone());
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&got).to_string();
                seen.lock().unwrap().push(head.clone());
                let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                let path = path
                    .split('?')
                    .next()
                    .unwrap_or("/")
                    .trim_start_matches('/');
                let file = root.join(path);
                match std::fs::read(&file) {
                    Ok(body) if !path.contains("..") && file.is_file() => {
                        let _ = write!(
                            conn,
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = conn.write_all(&body);
                    }
                    _ => {
                        let _ = write!(
                            conn,
                            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                    }
                }
            });
        }
    });
    (port, heads)
}

fn git(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bare repository with `main` (README.md) and `dev` (one more commit), served over dumb
/// HTTP.
fn repository() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("README.md"), "fake repository\n").unwrap();
    git(&src, &["add", "README.md"]);
    git(&src, &["commit", "-q", "-m", "first"]);
    git(&src, &["checkout", "-q", "-b", "dev"]);
    std::fs::write(src.join("dev.txt"), "on dev\n").unwrap();
    git(&src, &["add", "dev.txt"]);
    git(&src, &["commit", "-q", "-m", "second"]);
    git(&src, &["checkout", "-q", "main"]);
    let bare = tmp.path().join("repo.git");
    git(tmp.path(), &["clone", "-q", "--bare", "src", "repo.git"]);
    git(&bare, &["update-server-info"]);
    let root = tmp.path().to_path_buf();
    (tmp, root)
}

#[test]
fn git_clone_runs_on_the_host_and_its_credentials_never_enter_the_sandbox() {
    let (_repo, root) = repository();
    let (port, heads) = static_server(root);
    let d = Daemon::start_with_env(
        &[],
        &[
            ("SANDCELL_TEST", "1"),
            ("SANDCELL_TEST_RESOLVE", "git.test=127.0.0.1"),
        ],
    );
    // The sandbox's own network stays off: the clone is the host's.
    let id = d.create_id(json!({"network": "off"}));
    let url = format!("http://me:s3cret-token@git.test:{port}/repo.git");
    let r = d.post(
        &format!("/v1/sandboxes/{id}/git/clone"),
        json!({"url": url}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["path"], "/workspace/repo");
    assert_eq!(r.body["branch"], "main");
    assert_eq!(r.body["commit"].as_str().unwrap().len(), 40, "{}", r.body);
    assert!(r.body["files"].as_u64().unwrap() > 3);
    let out = d.exec(
        &id,
        "cat /workspace/repo/README.md; git -C /workspace/repo log --oneline | wc -l; \
         stat -c %u /workspace/repo/README.md; git -C /workspace/repo remote get-url origin",
    );
    assert_eq!(
        out.stdout,
        format!("fake repository\n1\n65532\nhttp://git.test:{port}/repo.git\n"),
        "{}",
        out.stderr
    );
    // The credentials went to the server, and nowhere into the sandbox.
    let auth = heads
        .lock()
        .unwrap()
        .iter()
        .any(|h| h.contains("Authorization: Basic bWU6czNjcmV0LXRva2Vu"));
    assert!(auth, "the server never saw the credentials");
    let out = d.exec(
        &id,
        "grep -rl s3cret-token /workspace /tmp /home/sandbox 2>/dev/null; env | grep -c s3cret",
    );
    assert_eq!(out.stdout.trim(), "0", "found: {}", out.stdout);
    // A second clone there is refused; a branch elsewhere works (dumb HTTP cannot be
    // shallow: `depth` is for smart servers).
    d.post(
        &format!("/v1/sandboxes/{id}/git/clone"),
        json!({"url": url}),
    )
    .expect_error(409, "already_exists");
    let r = d.post(
        &format!("/v1/sandboxes/{id}/git/clone"),
        json!({"url": format!("http://git.test:{port}/repo.git"), "path": "dev", "branch": "dev"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["path"], "/workspace/dev");
    let out = d.exec(&id, "cat /workspace/dev/dev.txt");
    assert_eq!(out.stdout, "on dev\n");
    // The clone's connections are the sandbox's egress events.
    let evs = events(&d, &id);
    assert!(
        evs.iter()
            .any(|e| e["host"] == "git.test" && e["decision"] == "allowed"),
        "{evs:?}"
    );
    // The host's loopback by address, other transports, bad branches: refused, nothing made.
    let r = d.post(
        &format!("/v1/sandboxes/{id}/git/clone"),
        json!({"url": format!("http://127.0.0.1:{port}/repo.git"), "path": "lo"}),
    );
    r.expect_error(400, "invalid_argument");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("could not be cloned"),
        "{}",
        r.body
    );
    for bad in [
        json!({"url": "ssh://git.test/repo.git"}),
        json!({"url": "file:///etc/repo"}),
        json!({"url": format!("http://git.test:{port}/repo.git"), "branch": "--upload-pack=x"}),
        json!({"url": format!("http://git.test:{port}/repo.git"), "depth": 0}),
        json!({"url": format!("http://git.test:{port}/repo.git"), "extra": 1}),
    ] {
        let r = d.post(&format!("/v1/sandboxes/{id}/git/clone"), bad.clone());
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }
    let out = d.exec(&id, "ls /workspace");
    assert_eq!(out.stdout, "dev\nrepo\n");
}

#[test]
fn packages_install_at_create_through_the_registries_only_and_come_from_the_cache_next() {
    use sandcell_testkit::registries::FakeRegistries;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let regs = rt
        .block_on(FakeRegistries::start(&["pypi.test", "npm.test"]))
        .unwrap();
    let port = regs.https_addr().port();
    let ca = regs.ca_pem_path().display().to_string();
    let d = Daemon::start_with_env(
        &[
            &format!("packages.pip_index_url=https://pypi.test:{port}/simple/"),
            &format!("packages.npm_registry=https://npm.test:{port}/"),
            &format!("packages.ca_file={ca}"),
        ],
        &[
            ("SANDCELL_TEST", "1"),
            (
                "SANDCELL_TEST_RESOLVE",
                "pypi.test=127.0.0.1;npm.test=127.0.0.1",
            ),
        ],
    );
    let npm = Command::new("npm")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let packages = if npm {
        json!({"pip": ["sandcell-fake"], "npm": ["sandcell-fake"]})
    } else {
        eprintln!("skipped: npm is not installed here (the npm half)");
        json!({"pip": ["sandcell-fake"]})
    };
    let r = d.post("/v1/sandboxes", json!({"packages": packages}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["packages"]["cached"], false, "{}", r.body);
    assert!(
        r.body["packages"]["files"].as_u64().unwrap() > 0,
        "{}",
        r.body
    );
    let first = r.body["id"].as_str().unwrap().to_string();
    let first_files = r.body["packages"]["files"].clone();
    let check = |id: &str| {
        let out = d.exec(
            id,
            "python3 -c 'import sandcell_fake; print(sandcell_fake.VALUE)'",
        );
        assert_eq!(out.stdout, "42\n", "{}", out.stderr);
        if npm {
            let out = d.exec(
                id,
                "cd /workspace && node -e 'console.log(require(\"sandcell-fake\"))'",
            );
            assert_eq!(out.stdout, "42\n", "{}", out.stderr);
        }
    };
    check(&first);
    // The install's access is gone: the sandbox's own policy (loopback) is back.
    let out = d.exec(
        &first,
        &format!("curl -sS -o /dev/null -w '%{{http_code}}' https://pypi.test:{port}/simple/ 2>&1"),
    );
    assert!(out.stdout.contains("403"), "{}", out.stdout);
    assert_eq!(
        d.sandbox(&first).network,
        sandcell_api::network::NetworkPolicy::Loopback
    );

    // The same list again: from the cache, no registry reached.
    regs.clear_requests();
    let r = d.post("/v1/sandboxes", json!({"packages": packages}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["packages"]["cached"], true, "{}", r.body);
    // The counts kept with the archive: the same files as the install's.
    assert_eq!(r.body["packages"]["files"], first_files, "{}", r.body);
    check(r.body["id"].as_str().unwrap());
    assert!(regs.requests().is_empty(), "{:?}", regs.requests());

    // A package the index lacks: the error names it and quotes pip; no sandbox is left.
    let before = d.get("/v1/sandboxes").body["items"]
        .as_array()
        .unwrap()
        .len();
    let r = d.post(
        "/v1/sandboxes",
        json!({"packages": {"pip": ["no-such-package"]}}),
    );
    r.expect_error(400, "invalid_argument");
    let msg = r.body["message"].as_str().unwrap();
    assert!(msg.contains("packages.pip (no-such-package)"), "{msg}");
    assert!(msg.contains("No matching distribution"), "{msg}");
    assert_eq!(
        d.get("/v1/sandboxes").body["items"]
            .as_array()
            .unwrap()
            .len(),
        before
    );
    for bad in [
        json!({"packages": {"pip": ["-e ."]}}),
        json!({"packages": {"pip": ["six"]}, "network": "off"}),
        json!({"packages": {"apt": ["jq"]}}),
        json!({"packages": {"r": ["ggplot2>=3"]}}),
    ] {
        let r = d.post("/v1/sandboxes", bad.clone());
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }
    drop(regs);
}

#[test]
fn a_warm_pool_installs_its_packages_ahead_and_serves_creates_naming_them() {
    use sandcell_testkit::registries::FakeRegistries;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let regs = rt.block_on(FakeRegistries::start(&["pypi.test"])).unwrap();
    let port = regs.https_addr().port();
    let ca = regs.ca_pem_path().display().to_string();
    let d = Daemon::start_with_env(
        &[
            &format!("packages.pip_index_url=https://pypi.test:{port}/simple/"),
            &format!("packages.ca_file={ca}"),
            "pools.warm=python/small=1 pip:sandcell-fake",
        ],
        &[
            ("SANDCELL_TEST", "1"),
            ("SANDCELL_TEST_RESOLVE", "pypi.test=127.0.0.1"),
        ],
    );
    let metrics = || {
        let r = send(d.req_as(Some(&d.key), Method::GET, "/metrics"));
        r.body.as_str().unwrap_or_default().to_string()
    };
    let ready = "sandcell_pool_ready{pool=\"python/small+pip:sandcell-fake\"} 1";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !metrics().contains(ready) {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool never filled: {}\n{}",
            metrics(),
            d.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The pool's install reached the index; the create that takes it reaches nothing.
    assert!(!regs.requests().is_empty());
    regs.clear_requests();
    let r = d.post(
        "/v1/sandboxes",
        json!({"template": "python", "packages": {"pip": ["sandcell-fake"]}}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["packages"]["from_pool"], true, "{}", r.body);
    assert!(
        r.body["packages"]["files"].as_u64().unwrap() > 0,
        "{}",
        r.body
    );
    let id = r.body["id"].as_str().unwrap().to_string();
    let out = d.exec(
        &id,
        "python3 -c 'import sandcell_fake; print(sandcell_fake.VALUE)'",
    );
    assert_eq!(out.stdout, "42\n", "{}", out.stderr);
    assert!(regs.requests().is_empty(), "{:?}", regs.requests());
    // Its policy is the sandbox's own again (loopback), not the install's.
    let out = d.exec(
        &id,
        &format!("curl -sS -o /dev/null -w '%{{http_code}}' https://pypi.test:{port}/simple/ 2>&1"),
    );
    assert!(out.stdout.contains("403"), "{}", out.stdout);
    assert!(
        metrics().contains("sandcell_pool_requests_total{result=\"hit\"} 1"),
        "{}",
        metrics()
    );

    // The same template without packages is not served from the packages' pool.
    let r = d.post("/v1/sandboxes", json!({"template": "python"}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(r.body["packages"].is_null(), "{}", r.body);
    let out = d.exec(
        r.body["id"].as_str().unwrap(),
        "python3 -c 'import sandcell_fake' 2>&1 || echo missing",
    );
    assert!(out.stdout.contains("missing"), "{}", out.stdout);
    assert!(
        metrics().contains("sandcell_pool_requests_total{result=\"hit\"} 1"),
        "{}",
        metrics()
    );
    drop(regs);
}

/// Runs `sandcell sandbox ARGS --home HOME` against the daemon; (exit code, stdout, stderr).
fn sandbox_cli(d: &Daemon, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("sandbox")
        .arg("--home")
        .arg(d.home())
        .args(args)
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .env_remove("SANDCELL_HOME")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_cli_sets_shows_and_lists_a_sandboxs_network_and_clones() {
    let port = web_server();
    let (_repo, root) = repository();
    let (git_port, _) = static_server(root);
    let d = Daemon::start_with_env(
        &[],
        &[
            ("SANDCELL_TEST", "1"),
            (
                "SANDCELL_TEST_RESOLVE",
                "web.test=127.0.0.1;git.test=127.0.0.1",
            ),
        ],
    );
    let (code, out, err) = sandbox_cli(&d, &["create", "--network", "allow:web.test"], &[]);
    assert_eq!(code, 0, "{err}");
    let id = out.trim().to_string();
    let (code, out, _) = sandbox_cli(&d, &["network", &id], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("network: allow:web.test"), "{out}");
    assert!(
        out.contains("http proxy inside: http://127.0.0.1:3128"),
        "{out}"
    );
    let got = curl(&d, &id, &format!("http://web.test:{port}/cli"));
    assert!(got.ends_with("hello /cli\ncode=200"), "{got}");
    let (code, out, err) = sandbox_cli(&d, &["network", &id, "loopback"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("network: loopback"), "{out}");
    let (code, out, _) = sandbox_cli(&d, &["network", &id, "--events"], &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("allowed") && out.contains(&format!("web.test:{port}")),
        "{out}"
    );
    // Bad input: a clear error and a failing status, nothing changed.
    let (code, _, err) = sandbox_cli(&d, &["network", &id, "allow:http://x/"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("is a URL"), "{err}");
    let (code, _, err) = sandbox_cli(&d, &["network", &id, "off"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("'off'"), "{err}");
    // git-clone with the password from the environment, never on the command line.
    let (code, out, err) = sandbox_cli(
        &d,
        &[
            "git-clone",
            &id,
            &format!("http://git.test:{git_port}/repo.git"),
            "src",
            "--username",
            "me",
            "--password-env",
            "REPO_TOKEN",
        ],
        &[("REPO_TOKEN", "t0ken")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("cloned /workspace/src at "), "{out}");
    let (code, _, err) = sandbox_cli(&d, &["git-clone", &id, "ssh://git.test/repo.git"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("https:// or http://"), "{err}");
}

#[test]
fn a_secret_is_replaced_only_for_its_host_and_never_enters_the_sandbox() {
    use sandcell_testkit::registries::FakeRegistries;
    const VALUE: &str = "s3cr3t-v4lue-9f2c";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let regs = rt
        .block_on(FakeRegistries::start(&["api.test", "other.test"]))
        .unwrap();
    let port = regs.https_addr().port();
    let d = Daemon::start_with_env(
        &[&format!(
            "network.upstream_ca_file={}",
            regs.ca_pem_path().display()
        )],
        &[
            ("SANDCELL_TEST", "1"),
            (
                "SANDCELL_TEST_RESOLVE",
                "api.test=127.0.0.1;other.test=127.0.0.1",
            ),
        ],
    );
    let r = d.post(
        "/v1/sandboxes",
        json!({
            "network": {"allow": ["api.test", "other.test"]},
            "secrets": [{"name": "API_TOKEN", "value": VALUE, "hosts": ["api.test"]}],
        }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(!r.body.to_string().contains(VALUE), "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let out = d.exec(&id, "echo $API_TOKEN");
    assert!(out.stdout.starts_with("SANDCELL_SECRET_"), "{}", out.stdout);
    // To its host: the placeholder arrives as the value (the query the server saw), over
    // TLS the proxy terminated with a CA the sandbox trusts.
    let out = d.exec(
        &id,
        &format!(
            "curl -sS -o /dev/null -w '%{{http_code}}' \"https://api.test:{port}/bytes/1?key=$API_TOKEN\" \
             -H \"Authorization: Bearer $API_TOKEN\""
        ),
    );
    assert_eq!(out.stdout, "200", "{}", out.stderr);
    let seen = regs.requests();
    assert!(
        seen.iter()
            .any(|q| q.query.as_deref() == Some(&format!("key={VALUE}"))),
        "{seen:?}"
    );
    // To another host: refused, naming the secret, and nothing arrived there.
    regs.clear_requests();
    let out = d.exec(
        &id,
        &format!("curl -sS \"https://other.test:{port}/echo?key=$API_TOKEN\" 2>&1"),
    );
    assert!(out.stdout.contains("API_TOKEN"), "{}", out.stdout);
    assert!(
        out.stdout.contains("403") || out.stdout.contains("only to api.test"),
        "{}",
        out.stdout
    );
    assert!(regs.requests().is_empty(), "{:?}", regs.requests());
    // Without a placeholder, another allowed host works (its certificate verified upstream).
    let out = d.exec(
        &id,
        &format!("curl -sS -o /dev/null -w '%{{http_code}}' https://other.test:{port}/bytes/3"),
    );
    assert_eq!(out.stdout, "200", "{}", out.stderr);
    // The value is nowhere inside: files, environments, process memory.
    // The needle travels reversed and hex-encoded, so that the scan's own file and the
    // agent's copy of the command hold no copy of it; the scanner skips its own memory.
    let needle: String = VALUE.bytes().rev().map(|b| format!("{b:02x}")).collect();
    let scan = format!(
        r#"import glob, os, re
NEEDLE = bytes.fromhex("{needle}")[::-1]
hits = []
for root in ("/workspace", "/tmp", "/home/sandbox", "/run/sandcell"):
    for d, _, files in os.walk(root):
        for f in files:
            try:
                if NEEDLE in open(os.path.join(d, f), "rb").read():
                    hits.append(os.path.join(d, f))
            except OSError:
                pass
read = 0
for maps in glob.glob("/proc/[0-9]*/maps"):
    pid = maps.split("/")[2]
    if pid == str(os.getpid()):
        continue
    try:
        if NEEDLE in open(f"/proc/{{pid}}/environ", "rb").read():
            hits.append(f"environ {{pid}}")
        mem = open(f"/proc/{{pid}}/mem", "rb", 0)
        for line in open(maps):
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
            if not m:
                continue
            start, end = int(m[1], 16), int(m[2], 16)
            if end - start > 256 << 20:
                continue
            try:
                mem.seek(start)
                if NEEDLE in mem.read(end - start):
                    hits.append(f"memory {{pid}}")
                read += 1
            except OSError:
                pass
    except OSError:
        pass
print(len(hits), read, hits)
"#
    );
    d.exec(&id, &format!("cat > /tmp/scan.py <<'PY'\n{scan}\nPY"));
    let out = d.exec(&id, "python3 /tmp/scan.py; rm /tmp/scan.py");
    let fields: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"0"), "found: {}", out.stdout);
    assert!(
        fields
            .get(1)
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
            > 0,
        "no memory could be read: {} {}",
        out.stdout,
        out.stderr
    );
    // Secrets need the proxy: not with the network off; bad ones are refused.
    for bad in [
        json!({"network": "off", "secrets": [{"name": "A", "value": "v", "hosts": ["api.test"]}]}),
        json!({"secrets": [{"name": "lower", "value": "v", "hosts": ["api.test"]}]}),
        json!({"secrets": [{"name": "A", "value": "v", "hosts": []}]}),
        json!({"secrets": [{"name": "A", "value": "v", "hosts": ["http://x/"]}]}),
        json!({"secrets": [{"name": "A", "value": "a\nb", "hosts": ["api.test"]}]}),
    ] {
        let r = d.post("/v1/sandboxes", bad.clone());
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert!(!r.body.to_string().contains("a\\nb"), "{}", r.body);
    }
    drop(regs);
}

/// Secrets follow a sandbox into its snapshots' forks and restores; a restarted daemon, which
/// no longer has the values, refuses the placeholders (never passing them on) until they are
/// given again, live or with the fork.
#[test]
fn secrets_follow_forks_and_a_restarted_daemon_refuses_them_until_given_again() {
    use sandcell_testkit::registries::FakeRegistries;
    const VALUE: &str = "s3cr3t-f0rk-7d1e";
    const ROTATED: &str = "r0tated-aa51";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let regs = rt.block_on(FakeRegistries::start(&["api.test"])).unwrap();
    let port = regs.https_addr().port();
    let ca = format!("network.upstream_ca_file={}", regs.ca_pem_path().display());
    let mut d = Daemon::start_with_env(
        &[&ca],
        &[
            ("SANDCELL_TEST", "1"),
            ("SANDCELL_TEST_RESOLVE", "api.test=127.0.0.1"),
        ],
    );
    let secret =
        |value: &str| json!([{"name": "API_TOKEN", "value": value, "hosts": ["api.test"]}]);
    let id = d.create_id(json!({"network": {"allow": ["api.test"]}, "secrets": secret(VALUE)}));
    // What reached the fake server for a request from `sb` with the placeholder in the query
    // (`None`: refused, with the proxy's answer).
    let send_token = |d: &Daemon, sb: &str| -> Result<String, String> {
        regs.clear_requests();
        let out = d.exec(
            sb,
            &format!(
                "curl -sS -w '\\ncode=%{{http_code}}' \"https://api.test:{port}/bytes/1?key=$API_TOKEN\" 2>&1"
            ),
        );
        let seen: Vec<String> = regs
            .requests()
            .iter()
            .filter_map(|q| q.query.clone())
            .collect();
        match seen.first() {
            Some(q) if out.stdout.ends_with("code=200") => Ok(q.clone()),
            _ => Err(format!("{} (server saw {seen:?})", out.stdout)),
        }
    };
    assert_eq!(send_token(&d, &id), Ok(format!("key={VALUE}")));
    let r = d.get(&format!("/v1/sandboxes/{id}/secrets"));
    assert_eq!(r.status, 200, "{}", r.body);
    let placeholder = r.body["secrets"][0]["placeholder"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(r.body["secrets"][0]["held"], true, "{}", r.body);
    assert!(!r.body.to_string().contains(VALUE), "{}", r.body);

    // A fork in the same daemon holds the same placeholder and gets the value.
    let r = d.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    let snap = r.body["id"].as_str().unwrap().to_string();
    assert!(
        !std::fs::read_to_string(d.home().join("snapshots").join(&snap).join("manifest.json"))
            .unwrap_or_default()
            .contains(VALUE)
    );
    let r = d.post(&format!("/v1/snapshots/{snap}/fork"), json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    let fork = r.body["sandboxes"][0]["sandbox"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(d.exec(&fork, "echo -n $API_TOKEN").stdout, placeholder);
    assert_eq!(send_token(&d, &fork), Ok(format!("key={VALUE}")));

    // A daemon that crashed and came back reattaches the sandboxes without the values:
    // refused, never sent. (A clean stop ends them.)
    d.kill9();
    d.restart(&[&ca]);
    let r = d.get(&format!("/v1/sandboxes/{id}/secrets"));
    assert_eq!(r.body["secrets"][0]["held"], false, "{}", r.body);
    let refused = send_token(&d, &id).expect_err("an unheld secret is refused");
    assert!(
        refused.contains("API_TOKEN") && refused.contains("not held"),
        "{refused}"
    );
    // So is a fork made without them; one given them works.
    let r = d.post(&format!("/v1/snapshots/{snap}/fork"), json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    let bare = r.body["sandboxes"][0]["sandbox"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(send_token(&d, &bare).is_err());
    let r = d.post(
        &format!("/v1/snapshots/{snap}/fork"),
        json!({"secrets": secret(ROTATED)}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let given = r.body["sandboxes"][0]["sandbox"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(send_token(&d, &given), Ok(format!("key={ROTATED}")));
    // A restore takes them the same way.
    let r = d.post(
        "/v1/sandboxes",
        json!({"snapshot_id": snap, "secrets": secret(VALUE)}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let restored = r.body["id"].as_str().unwrap().to_string();
    assert_eq!(send_token(&d, &restored), Ok(format!("key={VALUE}")));
    // Given again live: the original works again, with its placeholder.
    let r = d.call(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/secrets"),
        Some(json!({"secrets": secret(VALUE)})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["secrets"][0]["placeholder"], placeholder.as_str());
    assert_eq!(r.body["secrets"][0]["held"], true);
    assert_eq!(send_token(&d, &id), Ok(format!("key={VALUE}")));

    // Bad input: a clear error, nothing changed.
    let r = d.post(
        &format!("/v1/snapshots/{snap}/fork"),
        json!({"secrets": [{"name": "NOPE", "value": "v", "hosts": ["api.test"]}]}),
    );
    r.expect_error(400, "invalid_argument");
    assert!(r.body.to_string().contains("API_TOKEN"), "{}", r.body);
    let r = d.call(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/secrets"),
        Some(json!({"secrets": [{"name": "API_TOKEN", "value": "a\nb", "hosts": ["api.test"]}]})),
    );
    r.expect_error(400, "invalid_argument");
    assert_eq!(send_token(&d, &id), Ok(format!("key={VALUE}")));
    // Forgotten: the placeholder is just text again (sent as it is, to an allowed host).
    let r = d.call(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/secrets"),
        Some(json!({"secrets": []})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["secrets"], json!([]));
    let r = d.get(&format!("/v1/sandboxes/{id}/secrets"));
    assert_eq!(r.body["secrets"], json!([]));
    drop(regs);
}
