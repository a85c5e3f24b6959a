//! Reading what a kernel writes on its event pipe, without I/O: the pipe's bytes into lines,
//! lines into JSON events, events into messages for the host. The kernel runs the user's code,
//! which can write anything on that pipe, so every input gives an event (a `garbled` one when
//! it is not a protocol line) and nothing is buffered beyond [`MAX_EVENT_LINE`].

use sandcell_protocol::{CodeError, CodeStatus, GuestMessage, MAX_FRAME_LEN, MimeBundle};
use serde_json::{Value, json};

/// Longest event line kept. A longer one could not reach the host anyway (a frame holds at
/// most `MAX_FRAME_LEN`), and holding it whole would let code in the kernel make the agent
/// allocate without bound.
pub(super) const MAX_EVENT_LINE: usize = MAX_FRAME_LEN as usize;

/// Text of a garbled line quoted back to the user, at most.
const QUOTED: usize = 200;

/// Splits the event pipe's bytes into lines and parses each.
#[derive(Debug)]
pub(super) struct EventLines {
    /// The unfinished line so far.
    buf: Vec<u8>,
    max: usize,
    /// Bytes of an overlong line being dropped up to its newline.
    dropping: Option<usize>,
}

impl EventLines {
    /// Lines of more than `max` bytes are dropped and reported.
    pub(super) fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            max,
            dropping: None,
        }
    }

    /// Takes bytes read from the pipe; returns the events of the lines they complete.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Vec<Value> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let line = &rest[..nl];
            rest = &rest[nl + 1..];
            if let Some(dropped) = self.dropping.take() {
                out.push(overlong(dropped + line.len(), self.max));
            } else if self.buf.len() + line.len() > self.max {
                out.push(overlong(self.buf.len() + line.len(), self.max));
                self.buf = Vec::new();
            } else if self.buf.is_empty() {
                out.push(parse_event(line));
            } else {
                self.buf.extend_from_slice(line);
                out.push(parse_event(&self.buf));
                self.buf.clear();
            }
        }
        if let Some(dropped) = self.dropping.as_mut() {
            *dropped += rest.len();
        } else if self.buf.len() + rest.len() > self.max {
            self.dropping = Some(self.buf.len() + rest.len());
            self.buf = Vec::new();
        } else {
            self.buf.extend_from_slice(rest);
        }
        out
    }

    /// At the end of the pipe: the event of a last line that had no newline.
    pub(super) fn finish(&mut self) -> Option<Value> {
        if let Some(dropped) = self.dropping.take() {
            return Some(overlong(dropped, self.max));
        }
        if self.buf.is_empty() {
            return None;
        }
        let event = parse_event(&self.buf);
        self.buf = Vec::new();
        Some(event)
    }

    /// Bytes held for the unfinished line.
    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// One line as an event: a JSON object, else a `garbled` event quoting the line's start.
pub(super) fn parse_event(line: &[u8]) -> Value {
    let error = match serde_json::from_slice::<Value>(line) {
        Ok(v) if v.is_object() => return v,
        Ok(_) => "not a JSON object".to_string(),
        Err(e) => e.to_string(),
    };
    let cut = line.len().min(QUOTED);
    json!({
        "type": "garbled",
        "line": String::from_utf8_lossy(&line[..cut]),
        "error": error,
    })
}

fn overlong(len: usize, max: usize) -> Value {
    json!({
        "type": "garbled",
        "line": "",
        "error": format!("an event line of {len} bytes is over the {max}-byte limit; dropped"),
    })
}

/// Whether an event is part of execution `request`: its own, or a line the kernel garbled
/// (which carries no id, and is shown rather than lost).
pub(super) fn belongs_to(v: &Value, request: u64) -> bool {
    v["id"] == json!(request) || v["type"] == "garbled"
}

/// What a `done` event says.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Done {
    pub(super) status: CodeStatus,
    pub(super) execution_count: u64,
    /// Bytes of stdout and stderr the kernel dropped over the stream limit.
    pub(super) dropped: [u64; 2],
    pub(super) exit_code: Option<i32>,
}

/// Reads a `done` event; `previous` is the kernel's execution count before it, `timed_out`
/// whether the execution was interrupted for its timeout.
pub(super) fn read_done(v: &Value, previous: u64, timed_out: bool) -> Done {
    let status = match (timed_out, v["status"].as_str()) {
        (true, Some("interrupted")) => CodeStatus::Timeout,
        (_, Some("ok")) => CodeStatus::Ok,
        (_, Some("interrupted")) => CodeStatus::Interrupted,
        _ => CodeStatus::Error,
    };
    let dropped = ["stdout", "stderr"].map(|name| v["dropped"][name].as_u64().unwrap_or(0));
    Done {
        status,
        execution_count: v["execution_count"]
            .as_u64()
            .unwrap_or(previous.saturating_add(1)),
        dropped,
        exit_code: v["exit_code"].as_i64().and_then(|c| i32::try_from(c).ok()),
    }
}

/// The message for the host of an event other than `done`.
pub(super) fn event_message(v: &Value) -> GuestMessage {
    match v["type"].as_str() {
        Some("stream") => GuestMessage::CodeStream {
            name: stream_name(&v["name"]),
            text: v["text"].as_str().unwrap_or_default().to_string(),
        },
        Some("display") => GuestMessage::CodeDisplay {
            data: bundle(&v["data"]),
            metadata: object(&v["metadata"]),
        },
        Some("result") => GuestMessage::CodeResult {
            data: bundle(&v["data"]),
            metadata: object(&v["metadata"]),
        },
        Some("error") => GuestMessage::CodeError(CodeError {
            ename: v["ename"].as_str().unwrap_or("Error").to_string(),
            evalue: v["evalue"].as_str().unwrap_or_default().to_string(),
            traceback: v["traceback"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|l| l.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        }),
        // A line the kernel garbled is shown rather than lost.
        _ => GuestMessage::CodeStream {
            name: "stderr".into(),
            text: format!("[sandcell: unexpected kernel message: {v}]\n"),
        },
    }
}

fn stream_name(v: &Value) -> String {
    match v.as_str() {
        Some("stderr") => "stderr".into(),
        _ => "stdout".into(),
    }
}

fn bundle(v: &Value) -> MimeBundle {
    v.as_object()
        .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

fn object(v: &Value) -> serde_json::Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    //! Bounded fuzzing (proptest) inside `cargo test`: arbitrary bytes in arbitrary pieces,
    //! overlong lines, garbage and hostile JSON. `PROPTEST_CASES` runs more.

    use proptest::prelude::*;

    use super::*;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|c| c.parse().ok())
                .unwrap_or(512),
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Feeds `bytes` in pieces of the given sizes (cycled), then ends the stream.
    fn lines_of(max: usize, bytes: &[u8], pieces: &[usize]) -> (Vec<Value>, usize) {
        let mut lines = EventLines::new(max);
        let mut out = Vec::new();
        let mut most = 0;
        let mut rest = bytes;
        let mut sizes = pieces.iter().copied().cycle();
        while !rest.is_empty() {
            let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
            out.extend(lines.feed(&rest[..n]));
            most = most.max(lines.buffered());
            rest = &rest[n..];
        }
        out.extend(lines.finish());
        (out, most)
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            ".{0,16}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// An event as a kernel (or code writing on its pipe) might send: the protocol's fields
    /// with values of any type.
    fn event() -> impl Strategy<Value = Value> {
        let ty = prop_oneof![
            Just(json!("stream")),
            Just(json!("display")),
            Just(json!("result")),
            Just(json!("error")),
            Just(json!("done")),
            Just(json!("reply")),
            json_value(),
        ];
        let fields = prop::collection::btree_map(
            prop_oneof![
                Just("id".to_string()),
                Just("name".to_string()),
                Just("text".to_string()),
                Just("data".to_string()),
                Just("metadata".to_string()),
                Just("ename".to_string()),
                Just("evalue".to_string()),
                Just("traceback".to_string()),
                Just("status".to_string()),
                Just("execution_count".to_string()),
                Just("dropped".to_string()),
                Just("exit_code".to_string()),
            ],
            json_value(),
            0..8,
        );
        (ty, fields).prop_map(|(ty, fields)| {
            let mut m: serde_json::Map<String, Value> = fields.into_iter().collect();
            m.insert("type".into(), ty);
            Value::Object(m)
        })
    }

    fn pieces() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(1usize..64, 1..8)
    }

    proptest! {
        #![proptest_config(config())]

        /// Any bytes: one event per line (the last may lack its newline), objects or
        /// `garbled`, and never more than `max` bytes held.
        #[test]
        fn arbitrary_bytes_give_one_event_per_line(
            bytes in prop::collection::vec(
                prop_oneof![8 => any::<u8>(), 1 => Just(b'\n'), 1 => Just(b'{'), 1 => Just(b'"')],
                0..600,
            ),
            max in 1usize..300,
            pieces in pieces(),
        ) {
            let (events, most) = lines_of(max, &bytes, &pieces);
            let newlines = bytes.iter().filter(|&&b| b == b'\n').count();
            let unterminated = usize::from(!bytes.is_empty() && !bytes.ends_with(b"\n"));
            prop_assert_eq!(events.len(), newlines + unterminated);
            prop_assert!(most <= max);
            for v in &events {
                prop_assert!(v.is_object());
                if v["type"] == "garbled" {
                    prop_assert!(v["line"].as_str().is_some_and(|l| l.chars().count() <= QUOTED));
                }
                // Whatever came in, the host gets a message (and encoding it cannot fail).
                let msg = event_message(v);
                prop_assert!(serde_json::to_vec(&msg).is_ok());
            }
        }

        /// Valid events, one per line, come back exactly however the bytes are cut; a line over
        /// the limit is dropped (reported once) and the next line is read.
        #[test]
        fn events_round_trip_and_overlong_lines_are_dropped(
            events in prop::collection::vec(event(), 1..8),
            long in prop::collection::vec(any::<u8>().prop_filter("no newline", |b| *b != b'\n'), 0..600),
            at in any::<prop::sample::Index>(),
            pieces in pieces(),
        ) {
            let max = 256;
            let at = at.index(events.len() + 1);
            let mut bytes = Vec::new();
            let mut want = Vec::new();
            for (i, e) in events.iter().enumerate() {
                if i == at {
                    bytes.extend_from_slice(&long);
                    bytes.push(b'\n');
                    want.push(None);
                }
                let line = serde_json::to_vec(e).unwrap_or_default();
                let fits = line.len() <= max;
                bytes.extend_from_slice(&line);
                bytes.push(b'\n');
                // The oracle is serde's own reading of the line (floats may read back a bit off).
                let parsed: Value = serde_json::from_slice(&line).unwrap_or_default();
                want.push(Some((parsed, fits)));
            }
            let (got, most) = lines_of(max, &bytes, &pieces);
            prop_assert!(most <= max);
            prop_assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                match w {
                    Some((e, true)) => prop_assert_eq!(g, e),
                    Some((_, false)) => prop_assert_eq!(&g["type"], "garbled"),
                    None if long.len() > max => prop_assert_eq!(&g["type"], "garbled"),
                    None => prop_assert!(g["type"] == "garbled" || g.is_object()),
                }
            }
        }

        /// Events with fields of any type, `done` included: no panic, no overflow.
        #[test]
        fn hostile_events_are_read_without_panic(
            v in event(),
            previous in prop_oneof![Just(u64::MAX), any::<u64>()],
            timed_out in any::<bool>(),
            request in any::<u64>(),
        ) {
            let done = read_done(&v, previous, timed_out);
            if v["execution_count"].as_u64().is_none() {
                prop_assert_eq!(done.execution_count, previous.saturating_add(1));
            }
            let _ = belongs_to(&v, request);
            prop_assert!(serde_json::to_vec(&event_message(&v)).is_ok());
        }
    }

    #[test]
    fn a_huge_line_is_never_held_whole() {
        let mut lines = EventLines::new(MAX_EVENT_LINE);
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..20 {
            assert!(lines.feed(&chunk).is_empty());
            assert!(lines.buffered() <= MAX_EVENT_LINE);
        }
        assert_eq!(lines.buffered(), 0, "dropped once over the limit");
        let got = lines.feed(b"\n{\"type\":\"done\",\"id\":1}\n");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0]["type"], "garbled");
        assert_eq!(got[1], json!({"type": "done", "id": 1}));
    }

    #[test]
    fn invalid_utf8_is_garbled_and_the_stream_goes_on() {
        let mut lines = EventLines::new(MAX_EVENT_LINE);
        let got =
            lines.feed(b"{\"type\":\"stream\",\"text\":\"\xff\"}\n{\"type\":\"done\",\"id\":2}\n");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0]["type"], "garbled");
        assert_eq!(got[1]["id"], 2);
        assert!(belongs_to(&got[0], 2));
    }

    #[test]
    fn done_counts_saturate() {
        let v = json!({"type": "done", "status": "ok", "dropped": {"stdout": u64::MAX}});
        let done = read_done(&v, u64::MAX, false);
        assert_eq!(done.execution_count, u64::MAX);
        assert_eq!(done.dropped, [u64::MAX, 0]);
        assert_eq!(done.status, CodeStatus::Ok);
    }
}
