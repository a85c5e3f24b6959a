//! The sandbox's end of its egress: `127.0.0.1:3128` (HTTP proxy) and `127.0.0.1:1080`
//! (SOCKS5) inside the sandbox's network namespace, each connection relayed to the host's
//! egress proxy through a Unix socket bound into the sandbox. The namespace keeps only `lo`:
//! nothing leaves but through the proxy, which decides (the `sandcell-egress` crate).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::net::{TcpListener, UnixStream};

/// Where the bridge listens and where it relays to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressBridge {
    /// The host proxy's socket, as the sandbox sees it.
    pub socket: PathBuf,
    /// The loopback addresses to listen on (the HTTP and SOCKS5 proxy ports; the host
    /// proxy tells the two apart by the first byte).
    pub listen: Vec<SocketAddr>,
}

impl EgressBridge {
    /// The usual ports, `127.0.0.1:3128` and `127.0.0.1:1080`, to `socket`.
    pub fn standard(socket: PathBuf) -> Self {
        Self {
            socket,
            listen: vec![
                SocketAddr::from(([127, 0, 0, 1], 3128)),
                SocketAddr::from(([127, 0, 0, 1], 1080)),
            ],
        }
    }
}

/// The variables that send programs to the bridge, in both cases (curl reads only the
/// lower-case `http_proxy`, most others either). Raw TCP clients that speak SOCKS5 use
/// `ALL_PROXY`; Node's built-in `fetch` reads them only from Node 24, with
/// `NODE_USE_ENV_PROXY`.
pub(crate) fn proxy_env() -> Vec<(&'static str, &'static str)> {
    const HTTP: &str = sandcell_protocol::EGRESS_HTTP_PROXY;
    const SOCKS: &str = sandcell_protocol::EGRESS_SOCKS_PROXY;
    const LOCAL: &str = "localhost,127.0.0.1,::1";
    vec![
        ("HTTP_PROXY", HTTP),
        ("HTTPS_PROXY", HTTP),
        ("ALL_PROXY", SOCKS),
        ("NO_PROXY", LOCAL),
        ("http_proxy", HTTP),
        ("https_proxy", HTTP),
        ("all_proxy", SOCKS),
        ("no_proxy", LOCAL),
        ("NODE_USE_ENV_PROXY", "1"),
    ]
}

/// Binds every address of `bridge` and relays their connections until the agent ends. A
/// port that cannot be bound is logged: egress then fails for the programs using it, and
/// the rest of the sandbox works.
pub(crate) async fn start(bridge: &EgressBridge) {
    for addr in &bridge.listen {
        match TcpListener::bind(addr).await {
            Ok(listener) => {
                tokio::spawn(relay(listener, bridge.socket.clone()));
            }
            Err(e) => {
                eprintln!("sandcell-guest: the egress bridge cannot listen on {addr}: {e}");
            }
        }
    }
}

/// Relays every connection of `listener` to `socket` (the agent runs this for each port of
/// its [`EgressBridge`]; public for the benchmark).
pub async fn relay(listener: TcpListener, socket: PathBuf) -> io::Result<()> {
    loop {
        let (mut client, _) = listener.accept().await?;
        let socket = socket.clone();
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            // The proxy gone (the sandbox's egress turned off) ends the connection at once.
            if let Ok(mut upstream) = UnixStream::connect(&socket).await {
                // 256 KiB at a time: tokio's default 8 KiB costs a download several times
                // the system calls.
                let _ = tokio::io::copy_bidirectional_with_sizes(
                    &mut client,
                    &mut upstream,
                    256 * 1024,
                    256 * 1024,
                )
                .await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_connection_to_the_port_reaches_the_socket_and_back() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("egress.sock");
        let proxy = tokio::net::UnixListener::bind(&socket).expect("bind");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = proxy.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    let n = s.read(&mut buf).await.expect("read");
                    s.write_all(b"proxy saw: ").await.expect("write");
                    s.write_all(&buf[..n]).await.expect("write");
                });
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(relay(listener, socket));
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"CONNECT a:443").await.expect("write");
        let mut back = Vec::new();
        c.read_to_end(&mut back).await.expect("read");
        assert_eq!(back, b"proxy saw: CONNECT a:443");
    }

    #[tokio::test]
    async fn without_the_proxy_a_connection_ends_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(relay(listener, PathBuf::from("/nonexistent/egress.sock")));
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut back = Vec::new();
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(5), c.read_to_end(&mut back))
                .await
                .expect("ended in time");
        assert!(read.is_ok() && back.is_empty());
    }
}
