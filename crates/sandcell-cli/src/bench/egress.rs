//! `sandcell bench egress`: what the egress proxy costs a sandbox's traffic, against the
//! same requests made directly, in one run. An origin HTTP server on loopback serves
//! `GET /bytes/N`; a client fetches it
//! - directly (a new TCP connection to the origin);
//! - through the egress path a sandbox uses: a TCP connection to the guest agent's bridge
//!   (`127.0.0.1:3128` in a sandbox; any loopback port here), relayed to the proxy's Unix
//!   socket, then the proxy's own connection to the origin, as a `CONNECT` tunnel (what
//!   HTTPS clients such as pip and npm open) and as a plain-HTTP proxy request.
//!
//! The proxy decides each connection under an `allow` policy naming the origin (a name
//! pinned to 127.0.0.1, as a test resolver maps it), meters its bytes and records an event,
//! as it does for a sandbox. No network namespace is crossed: this measures the proxy and
//! the bridge, not a sandbox.

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

/// The proxy on a Unix socket, and the bridge's loopback port in front of it.
async fn proxy(dir: &std::path::Path, origin: SocketAddr) -> anyhow::Result<SocketAddr> {
    let socket = dir.join("egress.sock");
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
    tokio::spawn(sandcell_guest::egress_relay(bridge, socket));
    Ok(addr)
}

/// How a request goes out.
#[derive(Debug, Clone, Copy)]
enum Way {
    Direct,
    Connect,
    PlainProxy,
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
    bridge: SocketAddr,
    n: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let got = match way {
        Way::Direct => {
            let mut s = TcpStream::connect(origin).await?;
            s.set_nodelay(true)?;
            fetch(&mut s, &format!("/bytes/{n}")).await?
        }
        Way::Connect => {
            let mut s = TcpStream::connect(bridge).await?;
            s.set_nodelay(true)?;
            let port = origin.port();
            s.write_all(
                format!("CONNECT {ORIGIN}:{port} HTTP/1.1\r\nHost: {ORIGIN}:{port}\r\n\r\n")
                    .as_bytes(),
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
            if !head.starts_with(b"HTTP/1.1 200") {
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
    let result = measure(&dir, samples, big_samples, json_out).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn measure(
    dir: &std::path::Path,
    samples: usize,
    big_samples: usize,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let origin = origin().await?;
    let bridge = proxy(dir, origin).await?;
    let ways = [Way::Direct, Way::Connect, Way::PlainProxy];
    let mut report = serde_json::Map::new();
    let mut lines = Vec::new();
    // (label, bytes, samples)
    let cases: [(&str, usize, usize); 3] = [
        ("small request (100 bytes)", 100, samples.max(100)),
        ("1 MB download", 1 << 20, samples),
        ("100 MB download", 100 << 20, big_samples),
    ];
    for (label, bytes, n) in cases {
        // One of each first, so every path is warm.
        for way in ways {
            once(way, origin, bridge, bytes).await?;
        }
        let mut times: [Vec<Duration>; 3] = Default::default();
        // Interleaved, so the three see the same machine.
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
                "  {label:<26} {:<12} {:>4}  median {median:>9.3} ms  p99 {p99:>9.3} ms  {mb_s:>8.0} MiB/s{versus}",
                format!("{way:?}").to_lowercase(),
                times[i].len()
            ));
        }
        report.insert(label.to_string(), serde_json::Value::Object(case));
    }
    if json_out {
        println!("{}", serde_json::Value::Object(report));
    } else {
        println!(
            "egress: direct to the origin, against the bridge + proxy (connect tunnel, plain proxy)"
        );
        for l in lines {
            println!("{l}");
        }
        println!(
            "  targets: >= 80% of direct throughput on downloads; <= 1 ms added per small request"
        );
    }
    Ok(ExitCode::SUCCESS)
}
