//! Fuzzing the frame decoder with proptest, bounded so it runs inside `cargo test` in seconds:
//! arbitrary bytes in arbitrary pieces, truncated, short and overlong length prefixes, huge
//! declared lengths, garbage JSON, unknown kinds and channels, valid streams mutated. The
//! decoder must never panic, must refuse a length over its limit before buffering the frame
//! (checked with a counting allocator), must answer every malformed frame with an error and
//! stay in sync after every non-fatal one, and must give back every valid frame unchanged.
//!
//! `PROPTEST_CASES=100000 cargo test -p sandcell-protocol --test fuzz` runs longer.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use sandcell_protocol::{
    Channel, DataChunk, ErrorCode, Frame, FrameDecoder, FrameError, GuestMessage, HEADER_LEN,
    HostMessage, MAX_FRAME_LEN, WireError, encode_data, encode_message,
};
use serde_json::Value;

// ------------------------------------------------------------------------------------------
// The largest single allocation of the current thread, so a test can assert that a declared
// length never turns into an allocation of that size (tests run on several threads at once).

struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the slot may be gone while the thread is being torn down.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is forwarded to the system allocator unchanged; only sizes are noted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc`/`realloc` above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as for `dealloc`; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns the largest single allocation it made on this thread.
fn largest_allocation(f: impl FnOnce()) -> usize {
    LARGEST.with(|l| l.set(0));
    f();
    LARGEST.with(Cell::get)
}

// ------------------------------------------------------------------------------------------
// Helpers

type Decoded<M> = Vec<Result<Frame<M>, FrameError>>;

/// Feeds `bytes` in pieces of the given sizes (cycled), pulling every frame after each piece.
fn decode_in_pieces<M: serde::de::DeserializeOwned>(
    dec: &mut FrameDecoder,
    bytes: &[u8],
    pieces: &[usize],
) -> Decoded<M> {
    let mut out = Vec::new();
    let mut rest = bytes;
    let mut sizes = pieces.iter().copied().cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        dec.feed(&rest[..n]);
        rest = &rest[n..];
        // Each frame consumes at least 4 bytes, so a well-behaved decoder stops within this.
        for _ in 0..=bytes.len() {
            match dec.next_frame::<M>() {
                Some(r) => out.push(r),
                None => break,
            }
        }
        assert!(
            dec.next_frame::<M>().is_none(),
            "the decoder never stops returning frames"
        );
    }
    out
}

/// A header: `len` as given (not necessarily true), then kind and id.
fn header(len: u32, kind: u8, id: u32) -> Vec<u8> {
    let mut h = len.to_be_bytes().to_vec();
    h.push(kind);
    h.extend_from_slice(&id.to_be_bytes());
    h
}

/// A frame with a true length around any payload.
fn raw_frame(kind: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len() + 5).unwrap_or(u32::MAX);
    let mut f = header(len, kind, id);
    f.extend_from_slice(payload);
    f
}

fn ping(id: u32) -> Vec<u8> {
    encode_message(id, &HostMessage::Ping)
}

fn is_ping(r: &Result<Frame<HostMessage>, FrameError>, want: u32) -> bool {
    matches!(r, Ok(Frame::Message { id, msg: HostMessage::Ping }) if *id == want)
}

// ------------------------------------------------------------------------------------------
// Strategies

/// JSON without floats (their text form need not read back bit for bit).
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        ".{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn host_message() -> impl Strategy<Value = HostMessage> {
    prop_oneof![
        Just(HostMessage::Ping),
        Just(HostMessage::ListProcesses),
        (any::<u32>(), ".{0,16}")
            .prop_map(|(protocol, client)| HostMessage::Hello { protocol, client }),
        ".{0,32}".prop_map(|name| HostMessage::SetHostname { name }),
        (any::<i32>(), any::<u16>(), any::<u16>())
            .prop_map(|(pid, rows, cols)| HostMessage::Resize { pid, rows, cols }),
        any::<u32>().prop_map(|chunks| HostMessage::ReadCredit { chunks }),
        (".{0,32}", any::<bool>())
            .prop_map(|(path, recursive)| HostMessage::Remove { path, recursive }),
        (".{0,16}", ".{0,16}").prop_map(|(from, to)| HostMessage::Rename { from, to }),
    ]
}

fn guest_message() -> impl Strategy<Value = GuestMessage> {
    prop_oneof![
        Just(GuestMessage::Pong),
        Just(GuestMessage::Ok),
        any::<u64>().prop_map(|inode| GuestMessage::Rehomed { inode }),
        any::<i32>().prop_map(|pid| GuestMessage::ExecStarted { pid }),
        any::<u64>().prop_map(|size| GuestMessage::ReadDone { size }),
        (".{0,8}", ".{0,64}").prop_map(|(name, text)| GuestMessage::CodeStream { name, text }),
        prop::collection::vec(".{0,8}", 0..5)
            .prop_map(|names| GuestMessage::VariableNames { names }),
        ".{0,40}".prop_map(|m| GuestMessage::Error(WireError::new(ErrorCode::NotFound, m))),
    ]
}

fn channel() -> impl Strategy<Value = Channel> {
    prop_oneof![
        Just(Channel::Stdin),
        Just(Channel::Stdout),
        Just(Channel::Stderr),
        Just(Channel::File),
    ]
}

/// A valid frame carrying a JSON value or a data chunk, as (what it decodes to, its bytes).
fn value_frame() -> impl Strategy<Value = (Frame<Value>, Vec<u8>)> {
    prop_oneof![
        (any::<u32>(), json_value()).prop_map(|(id, msg)| {
            let bytes = encode_message(id, &msg);
            (Frame::Message { id, msg }, bytes)
        }),
        (
            any::<u32>(),
            channel(),
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(id, channel, seq, data)| {
                let bytes = encode_data(id, channel, seq, &data);
                let chunk = DataChunk {
                    channel,
                    seq,
                    bytes: data,
                };
                (Frame::Data { id, chunk }, bytes)
            }),
    ]
}

fn pieces() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..64, 1..8)
}

fn config() -> ProptestConfig {
    // Bounded: the whole file runs in a few seconds; PROPTEST_CASES overrides it.
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(512),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(config())]

    /// Any bytes in any pieces: no panic, nothing but bounded buffering, and every frame the
    /// decoder still waits for is one its limit allows.
    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
        max in prop_oneof![Just(MAX_FRAME_LEN), 5u32..512],
        pieces in pieces(),
    ) {
        let mut dec = FrameDecoder::new(max);
        let _host: Decoded<HostMessage> = decode_in_pieces(&mut dec, &bytes, &pieces);
        prop_assert!(dec.buffered() <= bytes.len());
        if dec.buffered() >= HEADER_LEN {
            // Waiting for the rest of a frame it accepted the length of.
            let tail = &bytes[bytes.len() - dec.buffered()..];
            let len = u32::from_be_bytes([tail[0], tail[1], tail[2], tail[3]]);
            prop_assert!((5..=max).contains(&len));
            prop_assert!(tail.len() < 4 + len as usize);
        }
        let mut dec = FrameDecoder::new(max);
        let _guest: Decoded<GuestMessage> = decode_in_pieces(&mut dec, &bytes, &pieces);
    }

    /// Valid frames, concatenated and cut anywhere, come back exactly, in order.
    #[test]
    fn valid_frames_round_trip(
        frames in prop::collection::vec(value_frame(), 1..8),
        pieces in pieces(),
    ) {
        let bytes: Vec<u8> = frames.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let mut dec = FrameDecoder::default();
        let got: Decoded<Value> = decode_in_pieces(&mut dec, &bytes, &pieces);
        let want: Decoded<Value> = frames.into_iter().map(|(f, _)| Ok(f)).collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(dec.buffered(), 0);
    }

    /// Typed messages of both directions round trip.
    #[test]
    fn typed_messages_round_trip(
        host in host_message(),
        guest in guest_message(),
        id in any::<u32>(),
    ) {
        let mut dec = FrameDecoder::default();
        dec.feed(&encode_message(id, &host));
        prop_assert_eq!(dec.next_frame::<HostMessage>(), Some(Ok(Frame::Message { id, msg: host })));
        dec.feed(&encode_message(id, &guest));
        prop_assert_eq!(dec.next_frame::<GuestMessage>(), Some(Ok(Frame::Message { id, msg: guest })));
        prop_assert_eq!(dec.buffered(), 0);
    }

    /// A frame cut short yields nothing (the decoder waits), and its rest completes it.
    #[test]
    fn truncated_frame_waits_for_the_rest(
        (frame, bytes) in value_frame(),
        cut in any::<prop::sample::Index>(),
    ) {
        let at = cut.index(bytes.len());
        let mut dec = FrameDecoder::default();
        dec.feed(&bytes[..at]);
        prop_assert_eq!(dec.next_frame::<Value>(), None);
        prop_assert_eq!(dec.buffered(), at);
        dec.feed(&bytes[at..]);
        prop_assert_eq!(dec.next_frame::<Value>(), Some(Ok(frame)));
    }

    /// A declared length over the limit is refused as soon as the header is in, before its
    /// body is buffered: the bytes of the body are skipped as they arrive, no allocation grows
    /// with the declared length, and the next frame decodes.
    #[test]
    fn huge_declared_length_is_refused_before_allocating(
        len in prop_oneof![Just(u32::MAX), (MAX_FRAME_LEN + 1)..=u32::MAX],
        kind in any::<u8>(),
        id in any::<u32>(),
        body in 0usize..20_000,
        piece in 1usize..4096,
    ) {
        let mut dec = FrameDecoder::default();
        let largest = largest_allocation(|| {
            dec.feed(&header(len, kind, id));
            assert_eq!(
                dec.next_frame::<HostMessage>(),
                Some(Err(FrameError::TooLarge { id, len, max: MAX_FRAME_LEN }))
            );
            assert_eq!(dec.buffered(), 0);
            let chunk = vec![0xA5u8; piece];
            let mut sent = 0;
            while sent < body {
                let n = piece.min(body - sent);
                dec.feed(&chunk[..n]);
                sent += n;
                assert_eq!(dec.buffered(), 0, "the skipped body is not kept");
                assert_eq!(dec.next_frame::<HostMessage>(), None);
            }
        });
        // Only the test's own chunk and the 9-byte header, whatever the declared length.
        prop_assert!(largest <= piece.max(64) * 2, "largest allocation {} bytes", largest);
    }

    /// Over a small limit a whole oversized frame can be delivered: it is skipped exactly and
    /// the frame after it decodes, however the bytes are cut.
    #[test]
    fn oversized_frame_is_skipped_exactly(
        max in 50u32..200,
        extra in 1u32..500,
        id in any::<u32>(),
        pieces in pieces(),
    ) {
        let len = max + extra;
        let mut bytes = raw_frame(1, id, &vec![7u8; len as usize - 5]);
        bytes.extend_from_slice(&ping(id.wrapping_add(1)));
        let mut dec = FrameDecoder::new(max);
        let got: Decoded<HostMessage> = decode_in_pieces(&mut dec, &bytes, &pieces);
        prop_assert_eq!(got.len(), 2);
        prop_assert_eq!(&got[0], &Err(FrameError::TooLarge { id, len, max }));
        prop_assert!(is_ping(&got[1], id.wrapping_add(1)));
        prop_assert_eq!(dec.buffered(), 0);
    }

    /// A length too small to hold kind and id is a fatal error (the stream is out of sync).
    #[test]
    fn short_length_is_fatal(len in 0u32..5, rest in prop::collection::vec(any::<u8>(), 5..32)) {
        let mut bytes = len.to_be_bytes().to_vec();
        bytes.extend_from_slice(&rest);
        let mut dec = FrameDecoder::default();
        dec.feed(&bytes);
        let got = dec.next_frame::<HostMessage>();
        prop_assert_eq!(&got, &Some(Err(FrameError::TooShort { len })));
        prop_assert!(matches!(got, Some(Err(ref e)) if e.is_fatal() && e.request_id().is_none()));
    }

    /// Unknown kinds, garbage JSON, short data prefixes and unknown channels are errors that
    /// name the frame's request, and the next frame still decodes.
    #[test]
    fn malformed_frames_are_errors_and_keep_sync(
        kind in any::<u8>(),
        id in any::<u32>(),
        payload in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
            "[{}\\[\\]\":,a-z0-9 ]{0,40}".prop_map(String::into_bytes),
        ],
    ) {
        let mut bytes = raw_frame(kind, id, &payload);
        bytes.extend_from_slice(&ping(7));
        let mut dec = FrameDecoder::default();
        dec.feed(&bytes);
        let first = dec.next_frame::<HostMessage>();
        // The oracle for the payload: serde itself, and the wire layout of data chunks.
        match kind {
            1 => match serde_json::from_slice::<HostMessage>(&payload) {
                Ok(msg) => prop_assert_eq!(first, Some(Ok(Frame::Message { id, msg }))),
                Err(_) => prop_assert!(matches!(
                    first,
                    Some(Err(FrameError::BadMessage { id: got, .. })) if got == id
                ), "{:?}", first),
            },
            2 if payload.len() >= 9 && payload[0] <= 3 => {
                prop_assert!(
                    matches!(first, Some(Ok(Frame::Data { id: got, .. })) if got == id),
                    "{:?}", first
                );
            }
            2 => prop_assert!(matches!(
                first,
                Some(Err(FrameError::BadData { id: got, .. })) if got == id
            ), "{:?}", first),
            _ => prop_assert_eq!(first, Some(Err(FrameError::UnknownKind { id, kind }))),
        }
        let second = dec.next_frame::<HostMessage>();
        prop_assert!(matches!(second, Some(ref r) if is_ping(r, 7)));
    }

    /// A valid stream with bytes flipped, dropped or inserted: no panic, the decoder keeps
    /// going, and whatever it returns it returns in bounded buffering.
    #[test]
    fn mutated_streams_never_panic(
        frames in prop::collection::vec(value_frame(), 1..6),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
        pieces in pieces(),
    ) {
        let mut bytes: Vec<u8> = frames.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        for (at, byte, op) in edits {
            let i = at.index(bytes.len().max(1));
            match op {
                0 if i < bytes.len() => bytes[i] ^= byte | 1,
                1 if i < bytes.len() => { bytes.remove(i); }
                _ => bytes.insert(i.min(bytes.len()), byte),
            }
        }
        let mut dec = FrameDecoder::default();
        let got: Decoded<Value> = decode_in_pieces(&mut dec, &bytes, &pieces);
        prop_assert!(got.len() <= bytes.len() / 4 + 1);
        let mut dec = FrameDecoder::default();
        let _g: Decoded<GuestMessage> = decode_in_pieces(&mut dec, &bytes, &pieces);
        prop_assert!(dec.buffered() <= bytes.len());
    }
}
