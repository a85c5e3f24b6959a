//! The server name a TLS ClientHello asks for (SNI), read from the first record of a
//! tunnel, so the proxy can check it against the host the tunnel was opened to.

/// A TLS record's header: type, version, length.
pub const RECORD_HEADER: usize = 5;
/// The largest TLS record body.
pub const MAX_RECORD: usize = 16 * 1024 + 2048;

/// What the first bytes of a tunnel say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not TLS (no handshake record).
    NotTls,
    /// More bytes are needed: the whole first record is this long.
    Incomplete(usize),
    /// A ClientHello, and the name it asks for (none: no SNI).
    ClientHello(Option<String>),
    /// A handshake record that is not a ClientHello one can read.
    Unreadable,
}

/// Reads `buf` (the tunnel's first bytes from the client).
pub fn client_hello(buf: &[u8]) -> Hello {
    if buf.first().is_some_and(|&b| b != 0x16) {
        return Hello::NotTls;
    }
    if buf.len() < RECORD_HEADER {
        return Hello::Incomplete(RECORD_HEADER);
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len > MAX_RECORD {
        return Hello::Unreadable;
    }
    let total = RECORD_HEADER + len;
    if buf.len() < total {
        return Hello::Incomplete(total);
    }
    match sni(&buf[RECORD_HEADER..total]) {
        Some(name) => Hello::ClientHello(name),
        None => Hello::Unreadable,
    }
}

/// A cursor over a handshake message; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The SNI of a ClientHello handshake message (`Some(None)`: it has none); `None` when it
/// cannot be read (cut short in this record, or not a ClientHello).
fn sni(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    if r.u8()? != 1 {
        return None;
    }
    let len = r.take(3)?;
    let len = (usize::from(len[0]) << 16) | (usize::from(len[1]) << 8) | usize::from(len[2]);
    let mut r = Reader(r.take(len)?);
    r.take(2)?; // client version
    r.take(32)?; // random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    if r.0.is_empty() {
        return Some(None);
    }
    let mut ext = Reader(r.vec16()?);
    while !ext.0.is_empty() {
        let kind = ext.u16()?;
        let data = ext.vec16()?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(data);
        let mut names = Reader(list.vec16()?);
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let name = names.vec16()?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Some(name.to_string()));
            }
        }
        return Some(None);
    }
    Some(None)
}

/// A minimal ClientHello record naming `name` (none: without SNI): what tests and the
/// benchmark send through a tunnel in place of a real TLS client.
#[allow(clippy::cast_possible_truncation)]
pub fn minimal_client_hello(name: Option<&str>) -> Vec<u8> {
    let mut exts = Vec::new();
    // An extension before SNI, as browsers send (GREASE-like).
    exts.extend_from_slice(&[0x0a, 0x0a, 0x00, 0x01, 0x00]);
    if let Some(name) = name {
        let n = name.len();
        let mut sni = Vec::new();
        sni.extend_from_slice(&((n + 3) as u16).to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(n as u16).to_be_bytes());
        sni.extend_from_slice(name.as_bytes());
        exts.extend_from_slice(&[0, 0]);
        exts.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        exts.extend_from_slice(&sni);
    }
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[7; 32]);
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
    body.extend_from_slice(&[1, 0]); // null compression
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    record.extend_from_slice(&hs);
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(name: Option<&str>) -> Vec<u8> {
        minimal_client_hello(name)
    }

    #[test]
    fn the_name_is_read_from_a_client_hello() {
        let rec = hello(Some("pkg.example.org"));
        assert_eq!(
            client_hello(&rec),
            Hello::ClientHello(Some("pkg.example.org".into()))
        );
        assert_eq!(client_hello(&hello(None)), Hello::ClientHello(None));
    }

    #[test]
    fn partial_and_foreign_bytes_are_told_apart() {
        let rec = hello(Some("a.org"));
        assert_eq!(client_hello(&rec[..3]), Hello::Incomplete(RECORD_HEADER));
        assert_eq!(client_hello(&rec[..10]), Hello::Incomplete(rec.len()));
        assert_eq!(client_hello(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        // A handshake record that is not a ClientHello.
        let mut other = rec.clone();
        other[5] = 2;
        assert_eq!(client_hello(&other), Hello::Unreadable);
        // Lengths that point past the record never panic.
        for cut in 0..rec.len() {
            let mut bad = rec.clone();
            bad[cut] = 0xff;
            let _ = client_hello(&bad);
        }
    }
}
