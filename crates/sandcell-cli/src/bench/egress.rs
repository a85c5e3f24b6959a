//! `sandcell bench egress`: what the egress proxy costs a sandbox's traffic, against the
//! same requests made directly, in one run. An origin HTTP server on loopback serves
//! `GET /bytes/N`; a client fetches it
//! - directly (a new TCP connection to the origin);
//! - through the egress path a sandbox uses: a TCP connection to the guest agent's bridge
//!   (`127.0.0.1:3128` in a sandbox; any loopback port here), handed over to the proxy
//!   through its Unix socket (the process backend's bridge), then the proxy's own connection
//!   to the origin, as a `CONNECT` tunnel (what HTTPS clients such as pip and npm open) and
//!   as a plain-HTTP proxy request;
//! - as a `CONNECT` tunnel through a bridge that relays the bytes over the Unix socket
//!   instead (gVisor's, whose sockets cannot be handed to the host);
//! - as a `CONNECT` tunnel through tinyproxy (what an operator might run as an allow-list
//!   proxy instead: Debian's, installed by scripts/setup.sh; skipped, saying so, when it is
//!   missing), with a filter allowing only the origin. It runs as a process of its own, so
//!   on the one-thread layout it does not share the thread;
//! - through a bare relay (the floor of any proxy that ends the client's TCP connection and
//!   opens its own): it connects every connection to the origin at once and moves the bytes
//!   with blocking `splice(2)`, one thread each way, deciding and recording nothing. Its
//!   threads are its own on both layouts.
//!
//! The proxy decides each connection under an `allow` policy naming the origin (a name
//! pinned to 127.0.0.1, as a test resolver maps it), meters its bytes and records an event,
//! as it does for a sandbox. No network namespace is crossed: this measures the proxy and
//! the bridge, not a sandbox.
//!
//! Two layouts, one after the other:
//! - **one thread**: origin, proxy, bridges and client share one thread, so the ratio is the
//!   CPU each byte costs the whole path, against direct's;
//! - **as deployed**: the origin, the proxy (with the bridges) and the client each on a
//!   thread of their own, as a remote server, the daemon and a program in the sandbox run
//!   side by side; the ratio is what the program sees.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sandcell_egress::{EgressProxy, Limits, StaticResolver};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::stats::quantile;

/// The name the policy allows, pinned to the origin's address.
const ORIGIN: &str = "origin.bench";

/// Serves `GET /bytes/N` (N bytes, then the connection closes) on loopback.
async fn origin() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let block = vec![b'x'; 256 * 1024];
        while let Ok((mut s, _)) = listener.accept().await {
            let block = block.clone();
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let n: usize = text
                    .split_whitespace()
                    .nth(1)
                    .and_then(|p| p.rsplit('/').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                let reply =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n");
                if s.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                let mut left = n;
                while left > 0 {
                    let take = left.min(block.len());
                    if s.write_all(&block[..take]).await.is_err() {
                        return;
                    }
                    left -= take;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    Ok(addr)
}

/// The proxy on a Unix socket, and a bridge's loopback port in front of it (one that hands
/// connections over with `hand_over`, else one that relays them).
async fn proxy(
    dir: &std::path::Path,
    origin: SocketAddr,
    hand_over: bool,
) -> anyhow::Result<SocketAddr> {
    let socket = dir.join(if hand_over {
        "egress-handover.sock"
    } else {
        "egress-relay.sock"
    });
    let resolver = StaticResolver::new([(ORIGIN.to_string(), vec![origin.ip()])]);
    let policy = format!("allow:{ORIGIN}")
        .parse()
        .map_err(anyhow::Error::msg)?;
    let proxy = EgressProxy::new(
        policy,
        Arc::new(resolver),
        Limits::default(),
        // Events are made as for a sandbox, and dropped here.
        Arc::new(|_| {}),
    );
    let listener = tokio::net::UnixListener::bind(&socket).context("bind the proxy's socket")?;
    tokio::spawn(proxy.serve_unix(listener));
    let bridge = TcpListener::bind("127.0.0.1:0").await?;
    let addr = bridge.local_addr()?;
    tokio::spawn(sandcell_guest::egress_relay(bridge, socket, hand_over));
    Ok(addr)
}

/// How a request goes out.
#[derive(Debug, Clone, Copy)]
enum Way {
    Direct,
    /// Through the bridge that hands connections over.
    Connect,
    PlainProxy,
    /// Through the bridge that relays.
    ConnectRelayed,
    /// Through tinyproxy.
    Tinyproxy,
    /// Through the bare splice relay (no request: the connection is the origin's).
    Bare,
}

/// The two bridges' ports, and tinyproxy's.
#[derive(Debug, Clone, Copy)]
struct Bridges {
    handing_over: SocketAddr,
    relaying: SocketAddr,
    tinyproxy: Option<SocketAddr>,
    bare: SocketAddr,
}

/// The bare relay: every connection to its port is connected to `origin` and spliced both
/// ways on two threads of its own, until both ends are done.
fn bare_relay(origin: SocketAddr) -> anyhow::Result<SocketAddr> {
    use std::net::{Shutdown, TcpListener as StdListener, TcpStream as StdStream};
    fn one_way(from: &StdStream, to: &StdStream) -> std::io::Result<()> {
        use rustix::pipe::{PipeFlags, SpliceFlags, pipe_with, splice};
        let (r, w) = pipe_with(PipeFlags::CLOEXEC)?;
        let _ = rustix::pipe::fcntl_setpipe_size(&w, 1 << 20);
        loop {
            let n = splice(from, None, &w, None, 1 << 20, SpliceFlags::MOVE)?;
            if n == 0 {
                return to.shutdown(Shutdown::Write);
            }
            let mut left = n;
            while left > 0 {
                left -= splice(&r, None, to, None, left, SpliceFlags::MOVE)?;
            }
        }
    }
    let listener = StdListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("bench-bare-relay".into())
        .spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = StdStream::connect(origin) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
                let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
                    continue;
                };
                std::thread::spawn(move || one_way(&client, &upstream));
                std::thread::spawn(move || one_way(&u2, &c2));
            }
        })?;
    Ok(addr)
}

/// tinyproxy on a free loopback port, allowing `CONNECT` to the origin only (by address: it
/// resolves names itself); killed when dropped.
struct Tinyproxy {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Tinyproxy {
    /// Started, and answering; `None` when it is not installed.
    async fn start(dir: &std::path::Path, origin: SocketAddr) -> anyhow::Result<Option<Self>> {
        let Some(bin) = ["/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"]
            .into_iter()
            .map(std::path::Path::new)
            .find(|p| p.exists())
        else {
            return Ok(None);
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let filter = dir.join("tinyproxy.filter");
        std::fs::write(&filter, format!("^{}$\n", origin.ip()))?;
        let config = dir.join("tinyproxy.conf");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 100\nLogLevel Warning\n\
                 ConnectPort {}\nFilter \"{}\"\nFilterDefaultDeny Yes\nFilterType ere\n",
                origin.port(),
                filter.display()
            ),
        )?;
        let child = std::process::Command::new(bin)
            .arg("-d")
            .arg("-c")
            .arg(&config)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("start tinyproxy")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let proxy = Self { child, addr };
        for _ in 0..100 {
            if TcpStream::connect(addr).await.is_ok() {
                return Ok(Some(proxy));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("tinyproxy did not listen on {addr}")
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `GET /bytes/n` on `s` and reads the answer to its end; its size.
async fn fetch<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    target: &str,
) -> anyhow::Result<usize> {
    s.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: {ORIGIN}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut total = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(total);
        }
        total += n;
    }
}

/// One request of `n` bytes the `way` asks; how long it took, from connecting to the last
/// byte.
async fn once(
    way: Way,
    origin: SocketAddr,
    bridges: Bridges,
    n: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let (bridge, host) = match way {
        Way::ConnectRelayed => (bridges.relaying, ORIGIN.to_string()),
        Way::Tinyproxy => (
            bridges.tinyproxy.context("tinyproxy is not running")?,
            origin.ip().to_string(),
        ),
        Way::Bare => (bridges.bare, ORIGIN.to_string()),
        _ => (bridges.handing_over, ORIGIN.to_string()),
    };
    let got = match way {
        Way::Direct | Way::Bare => {
            let mut s = TcpStream::connect(if matches!(way, Way::Bare) {
                bridge
            } else {
                origin
            })
            .await?;
            s.set_nodelay(true)?;
            fetch(&mut s, &format!("/bytes/{n}")).await?
        }
        Way::Connect | Way::ConnectRelayed | Way::Tinyproxy => {
            let mut s = TcpStream::connect(bridge).await?;
            s.set_nodelay(true)?;
            let port = origin.port();
            s.write_all(
                format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes(),
            )
            .await?;
            // The tunnel's answer, to its blank line.
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if s.read(&mut byte).await? == 0 {
                    bail!(
                        "the proxy closed the tunnel: {}",
                        String::from_utf8_lossy(&head)
                    );
                }
                head.push(byte[0]);
            }
            if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
                bail!(
                    "the proxy refused the tunnel: {}",
                    String::from_utf8_lossy(&head)
                );
            }
            fetch(&mut s, &format!("/bytes/{n}")).await?
        }
        Way::PlainProxy => {
            let mut s = TcpStream::connect(bridge).await?;
            s.set_nodelay(true)?;
            fetch(
                &mut s,
                &format!("http://{ORIGIN}:{}/bytes/{n}", origin.port()),
            )
            .await?
        }
    };
    if got < n {
        bail!("{way:?}: {got} bytes came for {n} asked");
    }
    Ok(started.elapsed())
}

/// Runs `sandcell bench egress`.
pub async fn egress(
    samples: usize,
    big_samples: usize,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let dir = std::env::temp_dir().join(format!("sandcell-bench-egress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("a scratch folder")?;
    let mut report = serde_json::Map::new();
    let mut result = Ok(());
    for layout in [Layout::OneThread, Layout::AsDeployed] {
        let folder = dir.join(layout.name());
        result = match std::fs::create_dir(&folder) {
            Ok(()) => measure(&folder, layout, samples, big_samples, json_out, &mut report).await,
            Err(e) => Err(anyhow::Error::new(e).context("a scratch folder")),
        };
        if result.is_err() {
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    if json_out {
        println!("{}", serde_json::Value::Object(report));
    }
    Ok(ExitCode::SUCCESS)
}

/// Where the parts run.
#[derive(Debug, Clone, Copy)]
enum Layout {
    OneThread,
    AsDeployed,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Self::OneThread => "one-thread",
            Self::AsDeployed => "as-deployed",
        }
    }
}

/// A single-threaded runtime on a thread of its own, stopped when dropped.
struct SideRuntime {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SideRuntime {
    fn start(name: &str) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let _ = rt.block_on(stopped);
            })?;
        Ok(Self {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for SideRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn measure(
    dir: &std::path::Path,
    layout: Layout,
    samples: usize,
    big_samples: usize,
    json_out: bool,
    report: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<()> {
    let sides = match layout {
        Layout::OneThread => None,
        Layout::AsDeployed => Some((
            SideRuntime::start("bench-origin")?,
            SideRuntime::start("bench-proxy")?,
        )),
    };
    let here = tokio::runtime::Handle::current();
    let (origin_rt, proxy_rt) = match &sides {
        Some((o, p)) => (o.handle.clone(), p.handle.clone()),
        None => (here.clone(), here),
    };
    let origin = origin_rt.spawn(origin()).await??;
    let folder = dir.to_path_buf();
    let (handing_over, relaying) = proxy_rt
        .spawn(async move {
            anyhow::Ok((
                proxy(&folder, origin, true).await?,
                proxy(&folder, origin, false).await?,
            ))
        })
        .await??;
    let tinyproxy = Tinyproxy::start(dir, origin).await?;
    let bridge = Bridges {
        handing_over,
        relaying,
        tinyproxy: tinyproxy.as_ref().map(|t| t.addr),
        bare: bare_relay(origin)?,
    };
    let mut ways = vec![
        Way::Direct,
        Way::Connect,
        Way::PlainProxy,
        Way::ConnectRelayed,
    ];
    if tinyproxy.is_some() {
        ways.push(Way::Tinyproxy);
    }
    ways.push(Way::Bare);
    let mut layout_report = serde_json::Map::new();
    let mut lines = Vec::new();
    // (label, bytes, samples)
    let cases: [(&str, usize, usize); 3] = [
        ("small request (100 bytes)", 100, samples.max(100)),
        ("1 MB download", 1 << 20, samples),
        ("100 MB download", 100 << 20, big_samples),
    ];
    for (label, bytes, n) in cases {
        // One of each first, so every path is warm.
        for way in &ways {
            once(*way, origin, bridge, bytes).await?;
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); ways.len()];
        // Interleaved, so all see the same machine.
        for _ in 0..n {
            for (i, way) in ways.iter().enumerate() {
                times[i].push(once(*way, origin, bridge, bytes).await?);
            }
        }
        let direct = quantile(&times[0], 0.5);
        let mut case = serde_json::Map::new();
        for (i, way) in ways.iter().enumerate() {
            let median = quantile(&times[i], 0.5);
            let p99 = quantile(&times[i], 0.99);
            let mb_s = bytes as f64 / (1 << 20) as f64 / (median / 1000.0);
            case.insert(
                format!("{way:?}").to_lowercase(),
                json!({"median_ms": median, "p99_ms": p99, "mib_per_s": mb_s, "samples": times[i].len()}),
            );
            let versus = match way {
                Way::Direct => String::new(),
                _ => format!(
                    "  +{:.3} ms, {:.0}% of direct throughput",
                    median - direct,
                    100.0 * direct / median
                ),
            };
            lines.push(format!(
                "  {label:<26} {:<14} {:>4}  median {median:>9.3} ms  p99 {p99:>9.3} ms  {mb_s:>8.0} MiB/s{versus}",
                format!("{way:?}").to_lowercase(),
                times[i].len()
            ));
        }
        layout_report.insert(label.to_string(), serde_json::Value::Object(case));
    }
    report.insert(
        layout.name().to_string(),
        serde_json::Value::Object(layout_report),
    );
    if !json_out {
        println!(
            "egress, {}: direct to the origin, against the bridge + proxy (connect tunnel, plain proxy: the bridge hands connections over; connectrelayed: it relays them, as on gVisor)",
            match layout {
                Layout::OneThread => "all on one thread (CPU per byte)",
                Layout::AsDeployed => "origin, proxy and client on threads of their own",
            }
        );
        for l in lines {
            println!("{l}");
        }
        if tinyproxy.is_none() {
            println!("  tinyproxy: skipped, not installed (scripts/setup.sh installs it)");
        }
        println!(
            "  targets: >= 80% of direct throughput on downloads; <= 1 ms added per small request"
        );
    }
    Ok(())
}
