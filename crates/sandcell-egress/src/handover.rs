//! A connection on the sandbox's Unix socket either carries a client's bytes (a bridge that
//! relays: gVisor) or hands the client's TCP socket itself to the proxy (the process
//! backend's bridge, which shares this kernel): its first byte is then
//! [`sandcell_protocol::EGRESS_HANDOVER`] with the socket attached as `SCM_RIGHTS`.
//!
//! Why: the proxy then splices the sandbox's own connection to the origin, and no byte is
//! copied through user space on the way (docs/network.md, "How it is enforced").
//!
//! A socket from the sandbox is untrusted: it is served only when it is a connected
//! (not listening) TCP stream socket. Whatever it reaches is in the sandbox's own network
//! namespace, which the proxy never connects from: it only reads and writes it.

use std::io::{self, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;

use rustix::fs::FileType;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SocketType, sockopt,
};
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// What a connection on the sandbox's socket opened with.
#[derive(Debug)]
pub(crate) enum Opening {
    /// The client's first byte: the bridge relays the rest on this connection.
    Byte(u8),
    /// The client's socket, handed over.
    Socket(OwnedFd),
    /// Nothing: the connection ended.
    End,
}

/// Reads the first byte of `stream` and the socket attached to it, if any (close-on-exec;
/// any more descriptors than one are closed by the kernel, which truncates the message).
pub(crate) async fn opening(stream: &UnixStream) -> io::Result<Opening> {
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || receive(stream)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

fn receive(stream: &UnixStream) -> io::Result<Opening> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut passed = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for fd in fds {
                // A second one (none is sent) is closed as it is dropped.
                passed.get_or_insert(fd);
            }
        }
    }
    Ok(match (got.bytes, passed) {
        (0, _) => Opening::End,
        (_, Some(fd)) if byte[0] == sandcell_protocol::EGRESS_HANDOVER => Opening::Socket(fd),
        // A descriptor on the client's own bytes (or a handover without one) is nothing the
        // bridge sends: the descriptor is closed, the byte served as the client's.
        _ => Opening::Byte(byte[0]),
    })
}

/// `fd` as a TCP stream the proxy can serve, when it is a connected TCP socket; why not
/// otherwise.
pub(crate) fn client_socket(fd: OwnedFd) -> Result<TcpStream, String> {
    let stat = rustix::fs::fstat(&fd).map_err(|e| format!("fstat: {e}"))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Socket {
        return Err("it is not a socket".into());
    }
    let domain = sockopt::socket_domain(&fd).map_err(|e| format!("SO_DOMAIN: {e}"))?;
    if domain != AddressFamily::INET && domain != AddressFamily::INET6 {
        return Err(format!("it is not an IP socket (family {domain:?})"));
    }
    if sockopt::socket_type(&fd).map_err(|e| format!("SO_TYPE: {e}"))? != SocketType::STREAM {
        return Err("it is not a stream socket".into());
    }
    if sockopt::socket_acceptconn(&fd).map_err(|e| format!("SO_ACCEPTCONN: {e}"))? {
        return Err("it is a listening socket".into());
    }
    let stream = std::net::TcpStream::from(fd);
    stream
        .set_nonblocking(true)
        .map_err(|e| format!("O_NONBLOCK: {e}"))?;
    // Not connected: nothing to serve (reading it would fail at once anyway).
    stream
        .peer_addr()
        .map_err(|e| format!("it is not connected: {e}"))?;
    TcpStream::from_std(stream).map_err(|e| format!("register: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    async fn pair() -> (UnixStream, std::os::unix::net::UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        a.set_nonblocking(true).expect("nonblocking");
        (UnixStream::from_std(a).expect("register"), b)
    }

    #[tokio::test]
    async fn a_relayed_connection_opens_with_the_clients_first_byte() {
        let (proxy, bridge) = pair().await;
        std::io::Write::write_all(&mut &bridge, b"CONNECT").expect("write");
        assert!(matches!(
            opening(&proxy).await.expect("read"),
            Opening::Byte(b'C')
        ));
        drop(bridge);
        let (proxy, bridge) = pair().await;
        drop(bridge);
        assert!(matches!(opening(&proxy).await.expect("read"), Opening::End));
    }

    #[tokio::test]
    async fn a_handed_over_tcp_socket_is_served_and_anything_else_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");

        let (proxy, bridge) = pair().await;
        send_with(&bridge, sandcell_protocol::EGRESS_HANDOVER, &accepted);
        let Opening::Socket(fd) = opening(&proxy).await.expect("read") else {
            panic!("no socket came");
        };
        let mut served = client_socket(fd).expect("a connected TCP socket is served");
        tokio::io::AsyncWriteExt::write_all(&mut served, b"hi")
            .await
            .expect("write");
        let mut got = [0u8; 2];
        std::io::Read::read_exact(&mut &client, &mut got).expect("read");
        assert_eq!(&got, b"hi");

        // A listening socket, a Unix socket and a file are refused.
        let refused: Vec<OwnedFd> = vec![
            listener.into(),
            bridge.try_clone().expect("clone").into(),
            std::fs::File::open("/dev/null").expect("open").into(),
        ];
        for fd in refused {
            let why = client_socket(fd).expect_err("refused");
            assert!(
                why.contains("listening")
                    || why.contains("not an IP")
                    || why.contains("not a socket"),
                "{why}"
            );
        }

        // A socket attached to a client's byte is closed, the byte served as the client's.
        let (proxy, bridge) = pair().await;
        send_with(&bridge, b'G', &accepted);
        assert!(matches!(
            opening(&proxy).await.expect("read"),
            Opening::Byte(b'G')
        ));
    }

    /// Sends `byte` with `fd` attached, as the guest's bridge does.
    fn send_with(socket: &std::os::unix::net::UnixStream, byte: u8, fd: &impl AsFd) {
        let fds = [fd.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
        let sent = rustix::net::sendmsg(
            socket,
            &[io::IoSlice::new(&[byte])],
            &mut control,
            rustix::net::SendFlags::empty(),
        )
        .expect("send");
        assert_eq!(sent, 1);
    }
}
