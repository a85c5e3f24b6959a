//! The two archive formats the fake packages need, written by hand: a zip of stored
//! entries (a wheel) and gzip of stored deflate blocks (an npm tarball). Both formats are
//! small when nothing is compressed, and the packages are a few hundred bytes, so no
//! compression library is worth its build time.

/// CRC-32 (IEEE 802.3, reflected, as zip and gzip use it).
pub(crate) fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFF_u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// 1980-01-01 00:00 in MS-DOS date form: the earliest a zip can say, so the archive is the
/// same bytes every run.
const DOS_DATE: u16 = (1 << 5) | 1;
const DOS_TIME: u16 = 0;

/// A zip archive holding `files` (name, contents) uncompressed, in order.
///
/// No zip64: entries and archives stay below 4 GiB and 65536 entries, which the fake packages
/// (a few hundred bytes) are far from.
pub(crate) fn zip_stored(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in files {
        let offset = u32_of(out.len());
        let crc = crc32(data);
        let size = u32_of(data.len());
        let name_len = u16_of(name.len());
        // Local file header.
        out.extend_from_slice(&0x0403_4b50_u32.to_le_bytes());
        out.extend_from_slice(&20_u16.to_le_bytes()); // version needed: 2.0
        out.extend_from_slice(&0_u16.to_le_bytes()); // flags
        out.extend_from_slice(&0_u16.to_le_bytes()); // method: stored
        out.extend_from_slice(&DOS_TIME.to_le_bytes());
        out.extend_from_slice(&DOS_DATE.to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes()); // compressed size
        out.extend_from_slice(&size.to_le_bytes()); // uncompressed size
        out.extend_from_slice(&name_len.to_le_bytes());
        out.extend_from_slice(&0_u16.to_le_bytes()); // extra length
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        // Its central directory entry.
        central.extend_from_slice(&0x0201_4b50_u32.to_le_bytes());
        central.extend_from_slice(&((3_u16 << 8) | 20).to_le_bytes()); // made by: Unix, 2.0
        central.extend_from_slice(&20_u16.to_le_bytes());
        central.extend_from_slice(&0_u16.to_le_bytes());
        central.extend_from_slice(&0_u16.to_le_bytes());
        central.extend_from_slice(&DOS_TIME.to_le_bytes());
        central.extend_from_slice(&DOS_DATE.to_le_bytes());
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&name_len.to_le_bytes());
        central.extend_from_slice(&0_u16.to_le_bytes()); // extra length
        central.extend_from_slice(&0_u16.to_le_bytes()); // comment length
        central.extend_from_slice(&0_u16.to_le_bytes()); // disk number
        central.extend_from_slice(&0_u16.to_le_bytes()); // internal attributes
        // External attributes: a regular file, rw-r--r--, in the Unix high half.
        central.extend_from_slice(&(0o100_644_u32 << 16).to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let central_offset = u32_of(out.len());
    let central_size = u32_of(central.len());
    let count = u16_of(files.len());
    out.extend_from_slice(&central);
    // End of central directory.
    out.extend_from_slice(&0x0605_4b50_u32.to_le_bytes());
    out.extend_from_slice(&0_u16.to_le_bytes()); // this disk
    out.extend_from_slice(&0_u16.to_le_bytes()); // disk with the directory
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&central_size.to_le_bytes());
    out.extend_from_slice(&central_offset.to_le_bytes());
    out.extend_from_slice(&0_u16.to_le_bytes()); // comment length
    out
}

/// `data` as a gzip member whose deflate stream is stored (uncompressed) blocks.
pub(crate) fn gzip_stored(data: &[u8]) -> Vec<u8> {
    // Magic, deflate, no flags, no mtime, no extra flags, OS unknown.
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
    let mut chunks = data.chunks(usize::from(u16::MAX)).peekable();
    if chunks.peek().is_none() {
        // An empty input is still one (final, empty) block.
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        // BFINAL in bit 0, BTYPE 00 (stored); the rest of the byte pads to the boundary.
        out.push(u8::from(last));
        let len = u16_of(chunk.len());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    // ISIZE is the length modulo 2^32 by definition.
    out.extend_from_slice(&((data.len() as u64 & 0xFFFF_FFFF) as u32).to_le_bytes());
    out
}

/// A length that the fake packages keep far below the format's 32-bit fields.
fn u32_of(n: usize) -> u32 {
    u32::try_from(n).expect("the fake packages are far smaller than 4 GiB")
}

/// A name length or entry count that the fake packages keep far below 65536.
fn u16_of(n: usize) -> u16 {
    u16::try_from(n).expect("the fake packages' names and chunks fit 16 bits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        // The check value of CRC-32/ISO-HDLC for "123456789".
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn zip_entries_are_found_through_the_central_directory() {
        let zip = zip_stored(&[("a.txt", b"hello"), ("dir/b.txt", b"")]);
        // The end record points at the directory, which points at each local header.
        let end = zip.len() - 22;
        assert_eq!(&zip[end..end + 4], &0x0605_4b50_u32.to_le_bytes());
        let count = u16::from_le_bytes([zip[end + 10], zip[end + 11]]);
        assert_eq!(count, 2);
        let dir = u32::from_le_bytes([zip[end + 16], zip[end + 17], zip[end + 18], zip[end + 19]])
            as usize;
        assert_eq!(&zip[dir..dir + 4], &0x0201_4b50_u32.to_le_bytes());
        let local = u32::from_le_bytes([zip[dir + 42], zip[dir + 43], zip[dir + 44], zip[dir + 45]])
            as usize;
        assert_eq!(local, 0);
        assert_eq!(&zip[30..35], b"a.txt");
        assert_eq!(&zip[35..40], b"hello");
    }

    #[test]
    fn gzip_splits_long_input_into_stored_blocks() {
        let data: Vec<u8> = (0..70_000_u32).map(|i| (i % 251) as u8).collect();
        let gz = gzip_stored(&data);
        // Header, two block headers, the data, the trailer.
        assert_eq!(gz.len(), 10 + 5 + 5 + data.len() + 8);
        assert_eq!(gz[10], 0, "the first block is not the last");
        let second = 10 + 5 + usize::from(u16::MAX);
        assert_eq!(gz[second], 1, "the second block is the last");
        let len = u16::from_le_bytes([gz[second + 1], gz[second + 2]]);
        assert_eq!(usize::from(len), data.len() - usize::from(u16::MAX));
        let tail = &gz[gz.len() - 8..];
        assert_eq!(&tail[..4], &crc32(&data).to_le_bytes());
        assert_eq!(&tail[4..], &70_000_u32.to_le_bytes());
    }

    #[test]
    fn gzip_decodes_with_the_system_gzip_when_present() {
        let data = b"module.exports = 42;\n".repeat(5000);
        let gz = gzip_stored(&data);
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("x.gz");
        std::fs::write(&path, &gz).expect("write");
        match std::process::Command::new("gzip")
            .arg("-dc")
            .arg(&path)
            .output()
        {
            Ok(out) => {
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(out.stdout, data);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::skip::skip("gzip not installed");
            }
            Err(e) => panic!("cannot run gzip: {e}"),
        }
    }
}
