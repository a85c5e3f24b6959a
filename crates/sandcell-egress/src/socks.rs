//! The SOCKS5 side (RFC 1928): no authentication, `CONNECT` only, to a name (`socks5h`,
//! resolved by the proxy) or an address.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::proxy::{Asked, EgressProxy, Inbound, Protocol};

/// Reply codes.
const SUCCEEDED: u8 = 0;
const GENERAL_FAILURE: u8 = 1;
const NOT_ALLOWED: u8 = 2;
const HOST_UNREACHABLE: u8 = 4;
const REFUSED: u8 = 5;
const COMMAND_NOT_SUPPORTED: u8 = 7;
const ADDRESS_NOT_SUPPORTED: u8 = 8;

async fn reply<W: AsyncWrite + Unpin>(w: &mut W, code: u8) -> io::Result<()> {
    w.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// Refuses a connection before its request was read (the connection limit): the greeting
/// is answered, then the request refused.
pub(crate) async fn refuse_early<S: AsyncRead + AsyncWrite + Unpin>(
    mut inbound: Inbound<S>,
    _message: &str,
) {
    let _ = inbound.stream.write_all(&[5, 0xff]).await;
    let _ = inbound.stream.shutdown().await;
}

/// Serves a SOCKS5 connection.
pub(crate) async fn serve<S>(proxy: &EgressProxy, mut inbound: Inbound<S>) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let timeout = proxy.limits().head_timeout;
    let read = async {
        // Greeting: version, methods.
        if !inbound.fill(2).await? {
            return Ok(None);
        }
        let methods = usize::from(inbound.buf[1]);
        if !inbound.fill(2 + methods).await? {
            return Ok(None);
        }
        if !inbound.buf[2..2 + methods].contains(&0) {
            inbound.stream.write_all(&[5, 0xff]).await?;
            return Ok(None);
        }
        inbound.buf.drain(..2 + methods);
        inbound.stream.write_all(&[5, 0]).await?;
        // Request: version, command, reserved, address type, address, port.
        if !inbound.fill(4).await? {
            return Ok(None);
        }
        let (version, command, kind) = (inbound.buf[0], inbound.buf[1], inbound.buf[3]);
        if version != 5 {
            return Ok(None);
        }
        let (host, used) = match kind {
            1 => {
                if !inbound.fill(4 + 4 + 2).await? {
                    return Ok(None);
                }
                let o = &inbound.buf[4..8];
                (Ipv4Addr::new(o[0], o[1], o[2], o[3]).to_string(), 8)
            }
            3 => {
                if !inbound.fill(5).await? {
                    return Ok(None);
                }
                let n = usize::from(inbound.buf[4]);
                if !inbound.fill(5 + n + 2).await? {
                    return Ok(None);
                }
                match std::str::from_utf8(&inbound.buf[5..5 + n]) {
                    Ok(name) => (sandcell_api::network::normalize_host(name), 5 + n),
                    Err(_) => {
                        reply(&mut inbound.stream, ADDRESS_NOT_SUPPORTED).await?;
                        return Ok(None);
                    }
                }
            }
            4 => {
                if !inbound.fill(4 + 16 + 2).await? {
                    return Ok(None);
                }
                let mut o = [0u8; 16];
                o.copy_from_slice(&inbound.buf[4..20]);
                (Ipv6Addr::from(o).to_string(), 20)
            }
            _ => {
                reply(&mut inbound.stream, ADDRESS_NOT_SUPPORTED).await?;
                return Ok(None);
            }
        };
        let port = u16::from_be_bytes([inbound.buf[used], inbound.buf[used + 1]]);
        inbound.buf.drain(..used + 2);
        if command != 1 {
            reply(&mut inbound.stream, COMMAND_NOT_SUPPORTED).await?;
            return Ok(None);
        }
        Ok::<_, io::Error>(Some((host, port)))
    };
    let (host, port) = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(Some(target))) => target,
        Ok(Ok(None)) | Err(_) => return Ok(()),
        Ok(Err(e)) => return Err(e),
    };
    let asked = Asked {
        protocol: Protocol::Socks5,
        host,
        port,
        started,
    };
    let addrs = match proxy.decide(&asked).await {
        Ok(a) => a,
        Err(_) => {
            reply(&mut inbound.stream, NOT_ALLOWED).await?;
            return Ok(());
        }
    };
    let upstream = match proxy.connect(&addrs).await {
        Ok(s) => s,
        Err(e) => {
            proxy.denied(
                &asked,
                format!("{}:{} could not be reached: {e}", asked.host, asked.port),
                addrs.first().copied(),
            );
            let code = match e.kind() {
                io::ErrorKind::ConnectionRefused => REFUSED,
                io::ErrorKind::TimedOut => HOST_UNREACHABLE,
                _ => GENERAL_FAILURE,
            };
            reply(&mut inbound.stream, code).await?;
            return Ok(());
        }
    };
    reply(&mut inbound.stream, SUCCEEDED).await?;
    proxy.tunnel(asked, inbound, upstream, true).await
}
