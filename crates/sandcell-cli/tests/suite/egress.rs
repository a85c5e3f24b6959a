//! Network egress by policy, through each sandbox's proxy: what an allow-list lets through,
//! what it refuses (other names, names resolving to loopback or metadata addresses, direct
//! connections), live changes, the events, and attacks on the proxy from inside. Runs on the
//! backend under test (scripts/test.sh runs it on both).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use sandcell_backend_gvisor::{GvisorBackend, GvisorBackendConfig};
use sandcell_backend_process::{ProcessBackend, ProcessBackendConfig, default_runtime_dir};
use sandcell_egress::{EgressEvent, Limits, Outcome, StaticResolver, SystemResolver};
use sandcell_engine::egress::EgressHub;
use sandcell_engine::{Engine, NetworkPolicy, Sandbox, SandboxSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::common::*;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A web server on the host's loopback answering every request with `hello <path>`.
async fn web_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&got);
                let path = head.split(' ').nth(1).unwrap_or("?").to_string();
                let body = format!("hello {path}");
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

type Events = Arc<Mutex<Vec<(String, EgressEvent)>>>;

/// An engine whose proxies map `web.test` to the host's loopback (pinned, as an operator's
/// registry mirror would be), answer `rebind.test` and `meta.test` with loopback and metadata
/// addresses as a hostile DNS server would, and record their events.
fn egress_engine() -> (Engine, Events) {
    let resolver = StaticResolver::new([("web.test".to_string(), vec![LOOPBACK])])
        .answer("rebind.test", vec![LOOPBACK])
        .answer(
            "meta.test",
            vec![IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254))],
        )
        .with_fallback(Arc::new(SystemResolver));
    let hub = EgressHub::new(Arc::new(resolver), Limits::default());
    let events: Events = Arc::default();
    let sink = events.clone();
    hub.set_sink(Arc::new(move |id, e| {
        sink.lock().unwrap().push((id.to_string(), e))
    }));
    let engine = Engine::builder()
        .backend(ProcessBackend::new(ProcessBackendConfig {
            loopback_egress: true,
            ..ProcessBackendConfig::new(BIN)
        }))
        .backend(GvisorBackend::new(GvisorBackendConfig::new(
            BIN,
            default_runtime_dir(),
        )))
        .egress(hub)
        .build();
    (engine, events)
}

async fn sandbox_on(engine: &Engine, network: NetworkPolicy) -> Sandbox {
    engine
        .create(SandboxSpec { network, ..spec() })
        .await
        .expect("create sandbox")
}

/// `curl` inside, as a program using the proxy variables would: stdout (the body, or the
/// proxy's refusal) and `code=<http code>` on its last line.
async fn curl(sb: &Sandbox, args: &str) -> String {
    let out = sh(
        sb,
        &format!("curl -sS --max-time 20 -w '\\ncode=%{{http_code}}' {args} 2>&1"),
    )
    .await;
    text(&out.stdout)
}

fn allow(rules: &[&str]) -> NetworkPolicy {
    NetworkPolicy::allow(rules).unwrap()
}

#[tokio::test]
async fn an_allow_list_lets_its_hosts_through_and_refuses_the_rest() {
    let port = web_server().await;
    let (engine, events) = egress_engine();
    let sb = sandbox_on(&engine, allow(&["web.test"])).await;
    // The proxy variables are set: plain programs use the proxy unchanged.
    let env = text(&sh(&sb, "env | grep -i _proxy= | sort").await.stdout);
    for var in [
        "HTTP_PROXY=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "ALL_PROXY=socks5h://127.0.0.1:1080",
        "no_proxy=localhost,127.0.0.1,::1",
    ] {
        assert!(env.contains(var), "{var} missing: {env}");
    }
    let out = curl(&sb, &format!("http://web.test:{port}/a")).await;
    assert!(out.ends_with("hello /a\ncode=200"), "{out}");
    // SOCKS5, the way raw TCP clients get out.
    let out = curl(
        &sb,
        &format!("--noproxy '' -x socks5h://127.0.0.1:1080 http://web.test:{port}/socks"),
    )
    .await;
    assert!(out.ends_with("hello /socks\ncode=200"), "{out}");
    // A CONNECT tunnel (what HTTPS clients use) to the same allowed host.
    let out = curl(&sb, &format!("-p http://web.test:{port}/tunnel")).await;
    assert!(out.ends_with("hello /tunnel\ncode=200"), "{out}");
    // Not on the list: refused with the reason, and nothing reached the host.
    let out = curl(&sb, &format!("http://other.test:{port}/")).await;
    assert!(out.contains("code=403"), "{out}");
    assert!(out.contains("not allowed"), "{out}");
    let out = curl(&sb, &format!("-p http://other.test:{port}/")).await;
    assert!(out.contains("403"), "{out}");

    let seen = events.lock().unwrap().clone();
    let mine: Vec<&EgressEvent> = seen
        .iter()
        .filter(|(id, _)| id == sb.id())
        .map(|(_, e)| e)
        .collect();
    let allowed: Vec<_> = mine
        .iter()
        .filter(|e| e.outcome == Outcome::Allowed && e.host == "web.test")
        .collect();
    assert_eq!(allowed.len(), 3, "{mine:?}");
    assert!(allowed.iter().all(|e| e.port == port && e.bytes_down > 0));
    let denied = mine
        .iter()
        .filter(|e| e.outcome == Outcome::Denied && e.host == "other.test")
        .count();
    assert_eq!(denied, 2, "{mine:?}");
    assert!(sb.egress_bytes() > 0);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn names_resolving_to_loopback_or_metadata_and_direct_connections_reach_nothing() {
    let port = web_server().await;
    let (engine, _) = egress_engine();
    let sb = sandbox_on(&engine, NetworkPolicy::Full).await;
    // DNS rebinding: a name allowed by `full` that resolves to the host's loopback or to the
    // metadata address is refused after resolution.
    for host in [
        "rebind.test",
        "meta.test",
        "localhost",
        "127.0.0.1",
        "[::ffff:127.0.0.1]",
        "2130706433",
    ] {
        let out = curl(
            &sb,
            &format!("--noproxy '' -x http://127.0.0.1:3128 http://{host}:{port}/"),
        )
        .await;
        assert!(out.contains("code=403"), "{host}: {out}");
        assert!(!out.contains("hello"), "{host} reached the host: {out}");
    }
    // Without the proxy: the sandbox's loopback is its own, and there is no route out.
    let out = curl(&sb, &format!("--noproxy '*' http://127.0.0.1:{port}/")).await;
    assert!(!out.contains("hello"), "{out}");
    let out = py(
        &sb,
        "import socket\ntry:\n socket.create_connection(('192.0.2.1', 80), timeout=3)\n print('connected')\nexcept OSError as e:\n print('refused', e)",
    )
    .await;
    assert!(
        text(&out.stdout).starts_with("refused"),
        "{}",
        text(&out.stdout)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn a_live_policy_change_applies_to_the_next_connection() {
    let port = web_server().await;
    let (engine, _) = egress_engine();
    let sb = sandbox_on(&engine, NetworkPolicy::Loopback).await;
    let url = format!("http://web.test:{port}/x");
    // `loopback` has the proxy too: it refuses everything, saying why.
    let out = curl(&sb, &url).await;
    assert!(out.contains("code=403"), "{out}");
    assert!(out.contains("'loopback'"), "{out}");
    sb.set_network(allow(&["web.test"])).unwrap();
    assert_eq!(sb.network(), allow(&["web.test"]));
    let out = curl(&sb, &url).await;
    assert!(out.ends_with("hello /x\ncode=200"), "{out}");
    sb.set_network(allow(&["web.test:1"])).unwrap();
    let out = curl(&sb, &url).await;
    assert!(out.contains("code=403"), "{out}");
    // `off` is fixed at create, both ways.
    let err = sb.set_network(NetworkPolicy::Off).unwrap_err();
    assert!(err.to_string().contains("'off'"), "{err}");
    sb.destroy().await.unwrap();

    let off = sandbox_on(&engine, NetworkPolicy::Off).await;
    let out = sh(&off, "ls -A /run/sandcell; env | grep -ci _proxy=").await;
    assert_eq!(text(&out.stdout).trim(), "0", "{}", text(&out.stdout));
    assert!(off.set_network(NetworkPolicy::Full).is_err());
    off.destroy().await.unwrap();
}

#[tokio::test]
async fn the_proxy_socket_is_the_sandboxs_own_and_nothing_else_is_reachable_through_it() {
    let (engine, _) = egress_engine();
    let a = sandbox_on(&engine, NetworkPolicy::Loopback).await;
    let b = sandbox_on(&engine, NetworkPolicy::Full).await;
    // Its folder holds only its own socket, read-only; other sandboxes' folders and the
    // host's runtime folder are not there.
    let out = sh(
        &a,
        &format!(
            "ls -A /run/sandcell; touch /run/sandcell/x 2>&1; ls /run/sandcell/egress 2>&1; \
             ls {}/egress/{} 2>&1",
            default_runtime_dir().display(),
            b.id()
        ),
    )
    .await;
    let s = text(&out.stdout);
    assert!(s.starts_with("egress.sock\n"), "{s}");
    assert!(
        s.contains("Read-only file system") || s.contains("Permission denied"),
        "{s}"
    );
    assert!(!s.contains(&format!("{}\n", b.id())), "{s}");
    // Speaking anything but the proxy protocols gets nothing from it; an absolute-form
    // request for the proxy itself is refused (it has no control interface to reach).
    let out = py(
        &a,
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/run/sandcell/egress.sock')\n\
         s.sendall(b'GET /status HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\ns.settimeout(10)\n\
         print(s.recv(200).split(b'\\r\\n')[0].decode())",
    )
    .await;
    assert!(
        text(&out.stdout).starts_with("HTTP/1.1 400"),
        "{}",
        text(&out.stdout)
    );
    let out = curl(&a, "http://127.0.0.1:3128/").await;
    assert!(
        out.contains("code=403") || out.contains("code=400"),
        "{out}"
    );
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
}

/// Attacks on the handover (a descriptor sent with the first byte, which the process
/// backend's bridge uses): a listening socket, a UDP socket, a file and a Unix socket each
/// get their connection closed without a word; then a connection this program makes and
/// hands over by itself, which the proxy serves as any client (under the same policy).
const FORGED_HANDOVERS: &str = r#"import array, socket, sys
def hand(fd, byte=b"\0"):
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/sandcell/egress.sock")
    try:
        s.sendmsg([byte], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    except OSError as e:
        print("refused-by-kernel", e.errno)
        return None
    return s
listening = socket.socket(); listening.bind(("127.0.0.1", 0)); listening.listen()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
f = open("/etc/passwd")
a, b = socket.socketpair()
for name, fd in [("listening", listening), ("udp", udp), ("file", f), ("unix", a)]:
    s = hand(fd.fileno())
    if s is None:
        continue
    s.settimeout(15)
    got = s.recv(100)
    print(name, "closed" if got == b"" else "answered %r" % got[:40])
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
client = socket.create_connection(server.getsockname())
accepted, _ = server.accept()
s = hand(accepted.fileno())
accepted.close()
if s is not None:
    s.close()
    client.sendall(b"GET http://%s/handed HTTP/1.1\r\nHost: x\r\n\r\n" % sys.argv[1].encode())
    client.settimeout(15)
    data = b""
    while True:
        d = client.recv(4096)
        if not d:
            break
        data += d
    print("served:", data.split(b"\r\n\r\n", 1)[-1].decode())
"#;

/// The inodes of the sockets this process holds.
fn sockets_held_here() -> std::collections::HashSet<u64> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy().into_owned();
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

#[tokio::test]
async fn the_bridge_hands_connections_to_the_proxy_and_a_forged_handover_gets_nothing() {
    let port = web_server().await;
    let (engine, _) = egress_engine();
    let sb = sandbox_on(&engine, allow(&["web.test"])).await;
    let target = format!("web.test:{port}");

    if on_gvisor() {
        sandcell_testkit::skip::skip(
            "gVisor's bridge relays (its sockets cannot be handed to the host): only the forged handovers are tried",
        );
    } else {
        // A tunnel held open: the sandbox's end of its connection to 3128 is a socket this
        // process (the engine, the proxy's home) holds, not the agent: the bridge handed it
        // over.
        hold_tunnel(&sb, &target).await;
        // /proc/net/tcp inside: local 127.0.0.1:3128 (0100007F:0C38), established (01).
        let table = text(&sh(&sb, "cat /proc/net/tcp").await.stdout);
        let inodes: Vec<u64> = table
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(1) == Some(&"0100007F:0C38") && f.get(3) == Some(&"01"))
                    .then(|| f.get(9)?.parse().ok())
                    .flatten()
            })
            .collect();
        assert_eq!(inodes.len(), 1, "{table}");
        assert!(
            sockets_held_here().contains(&inodes[0]),
            "the proxy does not hold the bridge's end of the tunnel: {table}"
        );
    }

    sb.write_file("/tmp/forge.py", FORGED_HANDOVERS.as_bytes(), None)
        .await
        .unwrap();
    let out = sh(&sb, &format!("python3 /tmp/forge.py {target} 2>&1")).await;
    let said = text(&out.stdout);
    if on_gvisor() {
        // Whatever gVisor does with the descriptors, nothing is served from them.
        assert!(!said.contains("served: hello"), "{said}");
    } else {
        for name in ["listening", "udp", "file", "unix"] {
            assert!(said.contains(&format!("{name} closed")), "{said}");
        }
        // Handed over by hand, a connection is a client like any other.
        assert!(said.contains("served: hello /handed"), "{said}");
    }
    // The proxy still serves and decides.
    let out = curl(&sb, &format!("http://web.test:{port}/after")).await;
    assert!(out.ends_with("hello /after\ncode=200"), "{out}");
    let out = curl(&sb, &format!("http://other.test:{port}/")).await;
    assert!(out.contains("code=403"), "{out}");
    sb.destroy().await.unwrap();
}

/// A program that opens a tunnel through the sandbox's proxy to its argument (`host:port`)
/// and holds it, appending `established` (or `refused`) to /tmp/held.out, then `ended` when
/// the tunnel ends.
pub(super) const HOLD_TUNNEL: &str = r#"import socket, sys
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n" % sys.argv[1].encode())
head = s.recv(200)
open("/tmp/held.out", "a").write("established\n" if b" 200 " in head else "refused\n")
while s.recv(4096):
    pass
open("/tmp/held.out", "a").write("ended\n")
"#;

/// Starts [`HOLD_TUNNEL`] to `target` in `sb` and waits until its tunnel is established.
async fn hold_tunnel(sb: &Sandbox, target: &str) {
    sb.write_file("/tmp/hold.py", HOLD_TUNNEL.as_bytes(), None)
        .await
        .unwrap();
    sb.spawn(sandcell_protocol::ExecRequest::argv([
        "/usr/bin/python3",
        "/tmp/hold.py",
        target,
    ]))
    .await
    .unwrap();
    held_says(sb, "established").await;
}

/// Waits (at most 20 s) until /tmp/held.out inside says `word`.
async fn held_says(sb: &Sandbox, word: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let out = text(&sh(sb, "cat /tmp/held.out 2>/dev/null").await.stdout);
        if out.lines().any(|l| l == word) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the tunnel's program never said {word}: {out:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_snapshot_with_a_tunnel_open_leaves_the_proxy_deciding_and_its_restore_too() {
    let port = web_server().await;
    let (engine, events) = egress_engine();
    let sb = sandbox_on(&engine, allow(&["web.test"])).await;
    hold_tunnel(&sb, &format!("web.test:{port}")).await;
    assert_eq!(sb.egress_connections(), 1);

    let dir = tempfile::tempdir().unwrap();
    let manifest = sb.snapshot_to(dir.path()).await.expect("snapshot");
    if on_gvisor() {
        // A process checkpoint: this runsc cannot save the bridge's connections, so the
        // agent closed them for it (the tunnel's program saw its end) and opened the bridge
        // again after.
        assert_eq!(manifest.fidelity, "process");
        held_says(&sb, "ended").await;
    }
    let out = curl(&sb, &format!("http://web.test:{port}/after")).await;
    assert!(out.ends_with("hello /after\ncode=200"), "{out}");
    let out = curl(&sb, &format!("http://other.test:{port}/")).await;
    assert!(out.contains("code=403"), "{out}");

    if manifest.fidelity == "process" {
        // The restored sandbox reaches the same hosts through its own proxy.
        let (restored, _) = engine
            .restore_checkpoint(
                sandcell_engine::new_sandbox_id(),
                sb.spec().clone(),
                dir.path(),
                &manifest,
            )
            .await
            .expect("restore");
        let out = curl(&restored, &format!("http://web.test:{port}/restored")).await;
        assert!(out.ends_with("hello /restored\ncode=200"), "{out}");
        let out = curl(&restored, &format!("-p http://other.test:{port}/")).await;
        assert!(out.contains("403"), "{out}");
        let seen = events.lock().unwrap().clone();
        let allowed = seen.iter().any(|(id, e)| {
            id == restored.id() && e.outcome == Outcome::Allowed && e.host == "web.test"
        });
        assert!(allowed, "{seen:?}");
        restored.destroy().await.unwrap();
    }
    sb.destroy().await.unwrap();
}

/// An engine whose proxies map the fake registries' names to the host's loopback (pinned, as
/// an operator's mirror would be).
fn registry_engine(names: &[&str]) -> Engine {
    let resolver = StaticResolver::new(names.iter().map(|n| (n.to_string(), vec![LOOPBACK])));
    let hub = EgressHub::new(Arc::new(resolver), Limits::default());
    Engine::builder()
        .backend(ProcessBackend::new(ProcessBackendConfig {
            loopback_egress: true,
            ..ProcessBackendConfig::new(BIN)
        }))
        .backend(GvisorBackend::new(GvisorBackendConfig::new(
            BIN,
            default_runtime_dir(),
        )))
        .egress(hub)
        .build()
}

/// Every variable a client reads its trusted CAs from, pointing at `ca`, and nothing of the
/// host's configuration.
fn trusting(ca: &str) -> Vec<(String, String)> {
    sandcell_service::packages::CA_FILE_VARIABLES
        .iter()
        .map(|k| (k.to_string(), ca.to_string()))
        .chain([("PIP_CONFIG_FILE".to_string(), "/dev/null".to_string())])
        .collect()
}

async fn sh_env(sb: &Sandbox, line: &str, env: &[(String, String)]) -> sandcell_engine::ExecOutput {
    let mut req = sandcell_protocol::ExecRequest::shell(line);
    req.env = env.iter().cloned().collect();
    req.timeout_ms = Some(120_000);
    sb.exec(req).await.expect("exec")
}

#[tokio::test]
async fn pip_npm_git_and_curl_reach_allowed_registries_over_https_and_nothing_else() {
    use sandcell_testkit::registries::FakeRegistries;
    let names = ["pypi.test", "npm.test", "git.test", "other.test"];
    let regs = FakeRegistries::start(&names).await.unwrap();
    let port = regs.https_addr().port();
    let engine = registry_engine(&names);
    let sb = sandbox_on(&engine, allow(&["pypi.test", "npm.test", "git.test"])).await;
    let ca = std::fs::read(regs.ca_pem_path()).unwrap();
    sb.write_file("/tmp/ca.pem", &ca, None).await.unwrap();
    let env = trusting("/tmp/ca.pem");

    let out = sh_env(
        &sb,
        &format!(
            "python3 -m pip install -q --no-cache-dir --disable-pip-version-check --target /tmp/py \
             --index-url https://pypi.test:{port}/simple/ sandcell-fake && \
             PYTHONPATH=/tmp/py python3 -c 'import sandcell_fake; print(sandcell_fake.VALUE)'"
        ),
        &env,
    )
    .await;
    assert_eq!(text(&out.stdout), "42\n", "pip: {}", text(&out.stderr));

    if which(&sb, "npm").await {
        let out = sh_env(
            &sb,
            &format!(
                "mkdir -p /tmp/js && cd /tmp/js && npm install --silent --no-audit --no-fund \
                 --registry https://npm.test:{port}/ sandcell-fake && \
                 node -e 'console.log(require(\"sandcell-fake\"))'"
            ),
            &env,
        )
        .await;
        assert_eq!(text(&out.stdout), "42\n", "npm: {}", text(&out.stderr));
    } else {
        eprintln!("skipped: npm is not installed here (the npm check)");
    }

    let out = sh_env(
        &sb,
        &format!(
            "git clone -q https://git.test:{port}/repo.git /tmp/repo && cat /tmp/repo/README.md"
        ),
        &env,
    )
    .await;
    assert_eq!(
        text(&out.stdout),
        "fake repository\n",
        "git: {}",
        text(&out.stderr)
    );

    let out = sh_env(
        &sb,
        &format!("curl -sS -w '\\ncode=%{{http_code}}' https://pypi.test:{port}/echo"),
        &env,
    )
    .await;
    assert!(
        text(&out.stdout).ends_with("code=200"),
        "{}",
        text(&out.stdout)
    );

    // Not on the list: refused by every client, and nothing arrived.
    regs.clear_requests();
    let out = sh_env(
        &sb,
        &format!(
            "curl -sS https://other.test:{port}/echo 2>&1; \
             git clone -q https://other.test:{port}/repo.git /tmp/other 2>&1; \
             python3 -m pip download -q --no-cache-dir --disable-pip-version-check --retries 0 \
             -d /tmp/dl --index-url https://other.test:{port}/simple/ sandcell-fake 2>&1 | tail -1"
        ),
        &env,
    )
    .await;
    let s = text(&out.stdout);
    assert!(s.contains("403"), "{s}");
    assert!(regs.requests().is_empty(), "{:?}", regs.requests());

    // A TLS ClientHello naming another host than the CONNECT did is cut before the server
    // sees a request.
    let script = format!(
        r#"import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT pypi.test:{port} HTTP/1.1\r\nHost: pypi.test:{port}\r\n\r\n")
print(s.recv(200).split(b"\r\n")[0].decode())
ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
try:
    t = ctx.wrap_socket(s, server_hostname="other.test")
    t.sendall(b"GET /echo HTTP/1.1\r\nHost: other.test\r\n\r\n")
    print("answered", t.recv(100))
except (OSError, ssl.SSLError) as e:
    print("cut", type(e).__name__)
"#
    );
    sb.write_file("/tmp/sni.py", script.as_bytes(), None)
        .await
        .unwrap();
    let out = sh_env(&sb, "python3 /tmp/sni.py", &env).await;
    let s = text(&out.stdout);
    assert!(s.starts_with("HTTP/1.1 200"), "{s} {}", text(&out.stderr));
    assert!(s.contains("cut"), "{s}");
    assert!(regs.requests().is_empty(), "{:?}", regs.requests());
    sb.destroy().await.unwrap();
}

async fn which(sb: &Sandbox, tool: &str) -> bool {
    sh(sb, &format!("command -v {tool}")).await.result.success()
}
