//! The HTTP side: `CONNECT host:port` opens a tunnel; a plain request in absolute form
//! (`GET http://host/path`) is sent on as one request with `Connection: close`, so the next
//! request comes on a new connection and is decided again.

use std::io;
use std::time::Instant;

use sandcell_api::network::normalize_host;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::proxy::{Asked, EgressProxy, Inbound, Protocol};

/// The most a request head may hold.
const MAX_HEAD: usize = 64 * 1024;
/// Headers a request may have.
const MAX_HEADERS: usize = 100;
/// Headers that belong to the hop between the sandbox and the proxy.
const HOP_HEADERS: [&str; 6] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
];

/// A request head, parsed.
struct Head {
    method: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    len: usize,
}

/// Reads and parses the head at the start of `inbound.buf`.
async fn read_head<S: AsyncRead + Unpin>(inbound: &mut Inbound<S>) -> Result<Head, String> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&inbound.buf) {
            Ok(httparse::Status::Complete(len)) => {
                return Ok(Head {
                    method: req.method.unwrap_or_default().to_string(),
                    target: req.path.unwrap_or_default().to_string(),
                    headers: req
                        .headers
                        .iter()
                        .map(|h| (h.name.to_string(), h.value.to_vec()))
                        .collect(),
                    len,
                });
            }
            Ok(httparse::Status::Partial) => {
                if inbound.buf.len() >= MAX_HEAD {
                    return Err(format!("the request head is over {} KiB", MAX_HEAD / 1024));
                }
                match inbound.more().await {
                    Ok(true) => {}
                    Ok(false) => return Err("the connection ended inside the request head".into()),
                    Err(e) => return Err(format!("the request head could not be read: {e}")),
                }
            }
            Err(e) => return Err(format!("the request is not HTTP: {e}")),
        }
    }
}

/// Writes a short answer with `status` and `message` and ends the connection.
async fn answer<W: AsyncWrite + Unpin>(w: &mut W, status: &str, message: &str) {
    let body = format!("sandcell egress: {message}\n");
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Sandcell-Egress: denied\r\n\r\n{body}",
        body.len()
    );
    let _ = w.write_all(text.as_bytes()).await;
    let _ = w.shutdown().await;
}

/// The decision on `target` (its parse, then the policy), or the answer that ends the
/// connection: `400` for a target that is not `host:port`, `403` for a refusal (`None`).
async fn decide_or_answer<W: AsyncWrite + Unpin>(
    proxy: &EgressProxy,
    protocol: Protocol,
    target: Result<(String, u16), String>,
    started: Instant,
    w: &mut W,
) -> Option<(Asked, Vec<std::net::SocketAddr>)> {
    let (host, port) = match target {
        Ok(t) => t,
        Err(message) => {
            answer(w, "400 Bad Request", &message).await;
            return None;
        }
    };
    let asked = Asked {
        protocol,
        host,
        port,
        started,
    };
    match proxy.decide(&asked).await {
        Ok(addrs) => Some((asked, addrs)),
        Err(denied) => {
            answer(w, "403 Forbidden", &denied.0).await;
            None
        }
    }
}

/// Connects to the first of `addrs` that answers; a failure is recorded and answered
/// `502 Bad Gateway` (`None`).
async fn connect_or_answer<W: AsyncWrite + Unpin>(
    proxy: &EgressProxy,
    asked: &Asked,
    addrs: &[std::net::SocketAddr],
    w: &mut W,
) -> Option<tokio::net::TcpStream> {
    match proxy.connect(addrs).await {
        Ok(s) => Some(s),
        Err(e) => {
            let message = format!("{}:{} could not be reached: {e}", asked.host, asked.port);
            proxy.denied(asked, message.clone(), addrs.first().copied());
            answer(w, "502 Bad Gateway", &message).await;
            None
        }
    }
}

/// Refuses a connection before its request was read (the connection limit).
pub(crate) async fn refuse_early<S: AsyncRead + AsyncWrite + Unpin>(
    mut inbound: Inbound<S>,
    message: &str,
) {
    answer(&mut inbound.stream, "429 Too Many Requests", message).await;
}

/// `host:port` (or `[v6]:port`) of a `CONNECT`.
fn authority(text: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("'{text}' is not host:port");
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(bad()),
        };
        (h.to_string(), port)
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (text.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?,
        None => default_port.ok_or_else(bad)?,
    };
    if host.is_empty() || host.contains('@') {
        return Err(bad());
    }
    Ok((normalize_host(&host), port))
}

/// Serves an HTTP proxy connection.
pub(crate) async fn serve<S>(proxy: &EgressProxy, mut inbound: Inbound<S>) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let head = match tokio::time::timeout(proxy_head_timeout(proxy), read_head(&mut inbound)).await
    {
        Ok(Ok(h)) => h,
        Ok(Err(message)) => {
            answer(&mut inbound.stream, "400 Bad Request", &message).await;
            return Ok(());
        }
        Err(_) => {
            answer(
                &mut inbound.stream,
                "408 Request Timeout",
                "the request head did not come in time",
            )
            .await;
            return Ok(());
        }
    };
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let target = authority(&head.target, None);
        let Some((asked, addrs)) = decide_or_answer(
            proxy,
            Protocol::Connect,
            target,
            started,
            &mut inbound.stream,
        )
        .await
        else {
            return Ok(());
        };
        let Some(upstream) = connect_or_answer(proxy, &asked, &addrs, &mut inbound.stream).await
        else {
            return Ok(());
        };
        inbound.buf.drain(..head.len);
        inbound
            .stream
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        return proxy.tunnel(asked, inbound, upstream, true).await;
    }
    plain(proxy, inbound, head, started).await
}

fn proxy_head_timeout(proxy: &EgressProxy) -> std::time::Duration {
    proxy.limits().head_timeout
}

/// A plain-HTTP request in absolute form, sent on with `Connection: close`.
async fn plain<S>(
    proxy: &EgressProxy,
    mut inbound: Inbound<S>,
    head: Head,
    started: Instant,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let target = head.target.as_str();
    let rest = match target.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &target[7..],
        _ => {
            let message = if target.to_ascii_lowercase().starts_with("https://") {
                "an https:// URL goes through CONNECT (set HTTPS_PROXY)".to_string()
            } else {
                format!("'{target}' is not an absolute http:// URL: this is a proxy")
            };
            answer(&mut inbound.stream, "400 Bad Request", &message).await;
            return Ok(());
        }
    };
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(split);
    let path = if path.is_empty() {
        "/".to_string()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let target = authority(auth, Some(80));
    let Some((asked, addrs)) =
        decide_or_answer(proxy, Protocol::Http, target, started, &mut inbound.stream).await
    else {
        return Ok(());
    };
    // The head as the origin server reads it.
    let mut out = format!("{} {path} HTTP/1.1\r\n", head.method).into_bytes();
    let mut length: Option<u64> = None;
    let mut encoding: Option<Vec<u8>> = None;
    let mut has_host = false;
    let mut bad = None;
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if HOP_HEADERS.contains(&lower.as_str()) {
            continue;
        }
        match lower.as_str() {
            "host" => has_host = true,
            "content-length" => {
                let n = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok());
                match (n, length) {
                    (Some(n), None) => length = Some(n),
                    (Some(n), Some(m)) if n == m => {}
                    _ => bad = Some("a bad or repeated Content-Length"),
                }
            }
            "transfer-encoding" => encoding = Some(value.to_ascii_lowercase()),
            _ => {}
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    // One reading of where the body ends, or none (a request that could be read two ways
    // could hide a second request from the check).
    let body = match (&encoding, length) {
        (Some(_), Some(_)) => {
            bad = Some("both Transfer-Encoding and Content-Length");
            Body::None
        }
        (Some(te), None) if te.ends_with(b"chunked") => Body::Chunked,
        (Some(_), None) => {
            bad = Some("a Transfer-Encoding that does not end with chunked");
            Body::None
        }
        (None, Some(n)) => Body::Length(n),
        (None, None) => Body::None,
    };
    if let Some(why) = bad {
        proxy.denied(&asked, why.to_string(), None);
        answer(&mut inbound.stream, "400 Bad Request", why).await;
        return Ok(());
    }
    let Some(upstream) = connect_or_answer(proxy, &asked, &addrs, &mut inbound.stream).await else {
        return Ok(());
    };
    if !has_host {
        out.extend_from_slice(format!("Host: {auth}\r\n").as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    inbound.buf.drain(..head.len);
    // The body, exactly as long as its head says, follows the new head; nothing after it
    // (another request on the same connection) is sent on.
    let request = out;
    let leftover = std::mem::take(&mut inbound.buf);
    let (client_read, client_write) = tokio::io::split(inbound.stream);
    let reader = BufReader::new(std::io::Cursor::new(leftover).chain(client_read));
    proxy
        .relay_one(asked, reader, client_write, upstream, &request, body)
        .await
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    None,
    Length(u64),
    Chunked,
}

/// Copies one chunked body from `r` to `w`, to its last chunk and trailers.
pub(crate) async fn copy_chunked<R, W>(r: &mut R, w: &mut W) -> io::Result<u64>
where
    R: AsyncBufReadExt + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut total = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut *r).take(4096).read_until(b'\n', &mut line).await?;
        if n == 0 || !line.ends_with(b"\n") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a chunk size line is cut or too long",
            ));
        }
        w.write_all(&line).await?;
        total += n as u64;
        let size_text = std::str::from_utf8(&line)
            .ok()
            .map(|l| l.split(';').next().unwrap_or("").trim().to_string())
            .unwrap_or_default();
        let size = u64::from_str_radix(&size_text, 16)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a bad chunk size"))?;
        if size == 0 {
            // Trailers, to the empty line.
            loop {
                line.clear();
                let n = (&mut *r).take(8192).read_until(b'\n', &mut line).await?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the trailers are cut",
                    ));
                }
                w.write_all(&line).await?;
                total += n as u64;
                if line == b"\r\n" || line == b"\n" {
                    return Ok(total);
                }
            }
        }
        // The chunk and its CRLF.
        let copied = tokio::io::copy(&mut (&mut *r).take(size + 2), w).await?;
        total += copied;
        if copied != size + 2 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a chunk is cut",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_parse_with_and_without_ports() {
        assert_eq!(
            authority("Pkg.Example.org:443", None),
            Ok(("pkg.example.org".into(), 443))
        );
        assert_eq!(authority("[::1]:8080", None), Ok(("::1".into(), 8080)));
        assert_eq!(
            authority("example.org", Some(80)),
            Ok(("example.org".into(), 80))
        );
        for bad in [
            "example.org",
            "example.org:0",
            "example.org:x",
            "user@host:80",
            ":80",
            "[::1",
        ] {
            assert!(authority(bad, None).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_chunked_body_is_copied_to_its_end_and_no_further() {
        let input =
            b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-T: 1\r\n\r\nGET /next HTTP/1.1\r\n\r\n";
        let mut r = BufReader::new(&input[..]);
        let mut out = Vec::new();
        let n = copy_chunked(&mut r, &mut out).await.expect("chunked");
        let body_end = input.len() - b"GET /next HTTP/1.1\r\n\r\n".len();
        assert_eq!(out, &input[..body_end]);
        assert_eq!(n as usize, body_end);
        let mut cut = BufReader::new(&b"4\r\nWi"[..]);
        assert!(copy_chunked(&mut cut, &mut Vec::new()).await.is_err());
    }
}
