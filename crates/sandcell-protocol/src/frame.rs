//! Length-prefixed frames.
//!
//! Wire layout (all integers big-endian):
//! ```text
//! len: u32 | kind: u8 | id: u32 | payload
//! ```
//! `len` counts every byte after itself. `kind` 1 is a JSON message, 2 is a data chunk whose
//! payload is `channel: u8 | seq: u64 | bytes`. Request id 0 is the connection itself.
//!
//! [`FrameDecoder`] is sans-IO: feed it bytes, pull frames. A frame whose length is over the
//! limit is skipped (its bytes are consumed as they arrive) and reported once as
//! [`FrameError::TooLarge`] carrying its request id, so the peer can answer that request and
//! keep serving the rest of the stream.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Bytes before the payload: `len` (4) + `kind` (1) + `id` (4).
pub const HEADER_LEN: usize = 9;

/// Largest accepted value of the `len` field (kind + id + payload), 16 MiB.
pub const MAX_FRAME_LEN: u32 = 16 * 1024 * 1024;

/// Largest data payload a sender puts in one chunk; larger data is split.
pub const MAX_CHUNK: usize = 256 * 1024;

const KIND_MESSAGE: u8 = 1;
const KIND_DATA: u8 = 2;
const DATA_PREFIX: usize = 9; // channel u8 + seq u64

/// Which byte stream a [`DataChunk`] belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// Bytes for a process's standard input (host→guest).
    Stdin = 0,
    /// A process's standard output (guest→host).
    Stdout = 1,
    /// A process's standard error (guest→host).
    Stderr = 2,
    /// File contents, either direction.
    File = 3,
}

impl Channel {
    fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(Self::Stdin),
            1 => Some(Self::Stdout),
            2 => Some(Self::Stderr),
            3 => Some(Self::File),
            _ => None,
        }
    }
}

/// A piece of a byte stream. `seq` orders chunks of one request across channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataChunk {
    /// The stream this chunk belongs to.
    pub channel: Channel,
    /// Position of this chunk among all chunks of its request, starting at 0.
    pub seq: u64,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// One decoded frame, with `M` the message type expected from the peer.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame<M> {
    /// A control message for request `id`.
    Message { id: u32, msg: M },
    /// A data chunk for request `id`.
    Data { id: u32, chunk: DataChunk },
}

/// Why a frame could not be decoded. Every variant but [`FrameError::TooShort`] leaves the
/// decoder in sync, so the stream can go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length field is over [`MAX_FRAME_LEN`]; the frame was skipped.
    #[error("frame of {len} bytes is over the {max}-byte limit")]
    TooLarge { id: u32, len: u32, max: u32 },
    /// The length field is too small to hold a header.
    #[error("frame length {len} is shorter than its header")]
    TooShort { len: u32 },
    /// The kind byte is not one this version knows.
    #[error("unknown frame kind {kind}")]
    UnknownKind { id: u32, kind: u8 },
    /// The data chunk names an unknown channel or is shorter than its prefix.
    #[error("malformed data chunk: {reason}")]
    BadData { id: u32, reason: String },
    /// The JSON message did not parse as the expected type.
    #[error("malformed message: {reason}")]
    BadMessage { id: u32, reason: String },
}

impl FrameError {
    /// The request id the broken frame carried, when it could be read.
    pub fn request_id(&self) -> Option<u32> {
        match self {
            Self::TooLarge { id, .. }
            | Self::UnknownKind { id, .. }
            | Self::BadData { id, .. }
            | Self::BadMessage { id, .. } => Some(*id),
            Self::TooShort { .. } => None,
        }
    }

    /// Whether the stream can no longer be trusted to be in sync (the peer should close).
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::TooShort { .. })
    }
}

/// Encodes a control message as one frame.
pub fn encode_message<M: Serialize>(id: u32, msg: &M) -> Vec<u8> {
    // Serializing our own message types cannot fail: they hold no maps with non-string keys.
    let body = serde_json::to_vec(msg).unwrap_or_else(|e| {
        format!("{{\"type\":\"encode_error\",\"message\":\"{e}\"}}").into_bytes()
    });
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    push_header(&mut out, KIND_MESSAGE, id, body.len());
    out.extend_from_slice(&body);
    out
}

/// Encodes one data chunk as one frame. Callers split data larger than [`MAX_CHUNK`].
pub fn encode_data(id: u32, channel: Channel, seq: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + DATA_PREFIX + bytes.len());
    push_header(&mut out, KIND_DATA, id, DATA_PREFIX + bytes.len());
    out.push(channel as u8);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(bytes);
    out
}

fn push_header(out: &mut Vec<u8>, kind: u8, id: u32, payload_len: usize) {
    let len = u32::try_from(payload_len + 5).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(&id.to_be_bytes());
}

/// Incremental, sans-IO frame decoder.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
    skip: u64,
    max_len: u32,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(MAX_FRAME_LEN)
    }
}

impl FrameDecoder {
    /// A decoder that rejects frames whose `len` field exceeds `max_len`.
    pub fn new(max_len: u32) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            skip: 0,
            max_len,
        }
    }

    /// Appends bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut bytes = bytes;
        if self.skip > 0 {
            let n = usize::try_from(self.skip)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            self.skip -= n as u64;
            bytes = &bytes[n..];
        }
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Returns the next complete frame, `None` when more bytes are needed.
    pub fn next_frame<M: DeserializeOwned>(&mut self) -> Option<Result<Frame<M>, FrameError>> {
        let avail = &self.buf[self.start..];
        if avail.len() < HEADER_LEN {
            return None;
        }
        let len = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]);
        let kind = avail[4];
        let id = u32::from_be_bytes([avail[5], avail[6], avail[7], avail[8]]);
        if len < 5 {
            self.start += 4;
            return Some(Err(FrameError::TooShort { len }));
        }
        if len > self.max_len {
            // Drop what we have of the frame and skip the rest as it arrives.
            let total = 4 + u64::from(len);
            let have = avail.len() as u64;
            if have >= total {
                self.start += total as usize;
            } else {
                self.skip = total - have;
                self.start = self.buf.len();
            }
            self.compact();
            return Some(Err(FrameError::TooLarge {
                id,
                len,
                max: self.max_len,
            }));
        }
        let total = 4 + len as usize;
        if avail.len() < total {
            return None;
        }
        let payload = &avail[HEADER_LEN..total];
        let result = match kind {
            KIND_MESSAGE => serde_json::from_slice::<M>(payload)
                .map(|msg| Frame::Message { id, msg })
                .map_err(|e| FrameError::BadMessage {
                    id,
                    reason: e.to_string(),
                }),
            KIND_DATA => decode_data(id, payload),
            other => Err(FrameError::UnknownKind { id, kind: other }),
        };
        self.start += total;
        self.compact();
        Some(result)
    }

    fn compact(&mut self) {
        if self.start > 64 * 1024 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

fn decode_data<M>(id: u32, payload: &[u8]) -> Result<Frame<M>, FrameError> {
    if payload.len() < DATA_PREFIX {
        return Err(FrameError::BadData {
            id,
            reason: "shorter than its 9-byte prefix".into(),
        });
    }
    let channel = Channel::from_u8(payload[0]).ok_or_else(|| FrameError::BadData {
        id,
        reason: format!("unknown channel {}", payload[0]),
    })?;
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&payload[1..9]);
    Ok(Frame::Data {
        id,
        chunk: DataChunk {
            channel,
            seq: u64::from_be_bytes(seq),
            bytes: payload[9..].to_vec(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::HostMessage;

    fn decode_all(dec: &mut FrameDecoder) -> Vec<Result<Frame<HostMessage>, FrameError>> {
        std::iter::from_fn(|| dec.next_frame::<HostMessage>()).collect()
    }

    #[test]
    fn message_round_trips_byte_by_byte() {
        let bytes = encode_message(7, &HostMessage::Ping);
        let mut dec = FrameDecoder::default();
        for (i, b) in bytes.iter().enumerate() {
            dec.feed(&[*b]);
            let got = dec.next_frame::<HostMessage>();
            if i + 1 < bytes.len() {
                assert!(got.is_none());
            } else {
                assert_eq!(
                    got,
                    Some(Ok(Frame::Message {
                        id: 7,
                        msg: HostMessage::Ping
                    }))
                );
            }
        }
    }

    #[test]
    fn data_round_trips() {
        let mut dec = FrameDecoder::default();
        dec.feed(&encode_data(3, Channel::Stderr, 42, b"oops"));
        let frame = dec.next_frame::<HostMessage>();
        assert_eq!(
            frame,
            Some(Ok(Frame::Data {
                id: 3,
                chunk: DataChunk {
                    channel: Channel::Stderr,
                    seq: 42,
                    bytes: b"oops".to_vec()
                }
            }))
        );
    }

    #[test]
    fn oversized_frame_is_skipped_and_stream_resyncs() {
        let mut dec = FrameDecoder::new(64);
        let big = encode_data(9, Channel::File, 0, &[0u8; 1000]);
        // Deliver the big frame in two halves, then a good frame.
        dec.feed(&big[..500]);
        let err = dec.next_frame::<HostMessage>();
        assert_eq!(
            err,
            Some(Err(FrameError::TooLarge {
                id: 9,
                len: 1014,
                max: 64
            }))
        );
        dec.feed(&big[500..]);
        assert!(dec.next_frame::<HostMessage>().is_none());
        dec.feed(&encode_message(10, &HostMessage::Ping));
        assert_eq!(
            decode_all(&mut dec),
            vec![Ok(Frame::Message {
                id: 10,
                msg: HostMessage::Ping
            })]
        );
    }

    #[test]
    fn bad_json_and_unknown_kind_keep_the_stream_in_sync() {
        let mut dec = FrameDecoder::default();
        let mut junk = encode_message(4, &HostMessage::Ping);
        let n = junk.len();
        junk[n - 2] = b'#';
        dec.feed(&junk);
        let mut unknown = encode_message(5, &HostMessage::Ping);
        unknown[4] = 77;
        dec.feed(&unknown);
        dec.feed(&encode_message(6, &HostMessage::Ping));
        let got = decode_all(&mut dec);
        assert!(matches!(got[0], Err(FrameError::BadMessage { id: 4, .. })));
        assert_eq!(got[1], Err(FrameError::UnknownKind { id: 5, kind: 77 }));
        assert_eq!(
            got[2],
            Ok(Frame::Message {
                id: 6,
                msg: HostMessage::Ping
            })
        );
    }

    #[test]
    fn bad_channel_is_reported() {
        let mut bytes = encode_data(2, Channel::Stdout, 0, b"x");
        bytes[HEADER_LEN] = 9;
        let mut dec = FrameDecoder::default();
        dec.feed(&bytes);
        assert!(matches!(
            dec.next_frame::<HostMessage>(),
            Some(Err(FrameError::BadData { id: 2, .. }))
        ));
    }

    #[test]
    fn too_short_length_is_fatal() {
        let mut dec = FrameDecoder::default();
        dec.feed(&[0, 0, 0, 1, 0, 0, 0, 0, 0]);
        let err = dec.next_frame::<HostMessage>();
        assert!(matches!(err, Some(Err(ref e)) if e.is_fatal()));
    }
}
