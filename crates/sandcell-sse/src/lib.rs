//! The one parser of `text/event-stream` (server-sent events) in Sandcell: bytes in, in chunks
//! cut anywhere (inside a line, a CRLF pair or a UTF-8 sequence), events out.
//!
//! Two readers share it: `sandcell-llm` (the model providers' streamed answers: OpenAI names
//! no event, Anthropic names every one) and `sandcell-client` (the daemon's exec, code,
//! process and run event streams, whose `id` is what a reader resumes from).
//!
//! It follows the format's rules: lines end with LF, CRLF or CR; a blank line ends an event;
//! a line starting with `:` is a comment; `data` lines join with `\n`; one space after the
//! colon is dropped; a line without a colon is a field with an empty value; an event without
//! data is not dispatched; an event without a name is a `message`; the last `id` carries on to
//! later events; `retry` and unknown fields are ignored (neither reader reconnects by
//! itself). One leniency: at the end of the stream an event whose blank line never came is
//! still delivered (some providers end with `data: [DONE]\n` alone, and a stream cut right
//! after its last `data` line loses nothing the server sent whole).
//!
//! ```
//! use sandcell_sse::{SseEvent, SseParser};
//!
//! let mut parser = SseParser::new();
//! let mut events = parser.push(b"event: stdout\r\ndata: h\xC3");
//! events.extend(parser.push(b"\xA9\r\n\r\ndata: [DONE]"));
//! events.extend(parser.finish());
//! assert_eq!(events[0].event, "stdout");
//! assert_eq!(events[0].data, "h\u{e9}");
//! assert_eq!(events[1].event, "message");
//! assert_eq!(events[1].data, "[DONE]");
//! ```

#![forbid(unsafe_code)]

/// One event, as the format defines it once its blank line came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its name: the `event` field, or `message` when it had none (or an empty one), as the
    /// format says, so a reader matches on one string.
    pub event: String,
    /// Its data, `data` lines joined with `\n`.
    pub data: String,
    /// The last `id` the stream gave, at this event or before (the format's "last event ID":
    /// what a reader sends back as `Last-Event-ID` to resume); `None` before any, or after an
    /// empty `id` reset it.
    pub id: Option<String>,
}

/// An incremental parser: feed it chunks with [`SseParser::push`], then
/// [`SseParser::finish`] at the end of the stream.
#[derive(Debug, Default)]
pub struct SseParser {
    /// The current line's bytes so far (a UTF-8 sequence may be cut between chunks, so a
    /// line is decoded only once whole).
    line: Vec<u8>,
    /// The previous chunk ended with CR: a LF starting the next one belongs to it.
    after_cr: bool,
    /// The current event's `event` field.
    event: Option<String>,
    /// The current event's `data` lines, joined.
    data: String,
    /// Whether the current event had a `data` line (an empty one counts).
    has_data: bool,
    /// The last event ID: kept across events, as the format says.
    id: Option<String>,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next chunk; returns the events it completed, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        let mut rest = chunk;
        // Only a byte can settle a pending CR: an empty chunk must not forget it.
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if let Some(tail) = rest.strip_prefix(b"\n") {
                rest = tail;
            }
        }
        while let Some(end) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            self.line.extend_from_slice(&rest[..end]);
            let terminator = rest[end];
            rest = &rest[end + 1..];
            if terminator == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.line_done(&line) {
                events.push(event);
            }
        }
        self.line.extend_from_slice(rest);
        events
    }

    /// Ends the stream: the last line and event are delivered even without their final
    /// line end and blank line. At most one event can be pending, hence `Option`.
    pub fn finish(mut self) -> Option<SseEvent> {
        let line = std::mem::take(&mut self.line);
        // A non-blank line never completes an event by itself; the event comes below.
        if !line.is_empty() {
            let _ = self.line_done(&line);
        }
        self.dispatch()
    }

    /// Takes one whole line (without its end); a blank one completes the current event.
    fn line_done(&mut self, line: &[u8]) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        // Invalid UTF-8 becomes U+FFFD rather than failing the stream, as the format says.
        let line = String::from_utf8_lossy(line);
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            // An id with NUL is ignored, as the format says; an empty one resets.
            "id" if !value.contains('\0') => {
                self.id = (!value.is_empty()).then(|| value.to_string());
            }
            _ => {}
        }
        None
    }

    /// Ends the current event: it is delivered when it had data; its name goes either way.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        Some(SseEvent {
            event: event
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "message".to_string()),
            data: std::mem::take(&mut self.data),
            id: self.id.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event: &str, data: &str, id: Option<&str>) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
            id: id.map(str::to_string),
        }
    }

    /// Parses `input` cut into chunks at `cuts` (equal cuts make empty chunks), then finishes.
    fn parse_cut(input: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            out.extend(p.push(&input[start..cut]));
            start = cut;
        }
        out.extend(p.finish());
        out
    }

    /// Every rule at once: comments, the three line ends (CR alone, at the end of an event
    /// too), a data-less event whose name must not leak, multi-line data split by CRLF, no
    /// space after the colon, characters of two, three and four bytes, an id carried on.
    const STREAM: &str = ": a comment\r\n\
        event: message_start\r\n\
        data: {\"a\":1}\r\n\
        \r\n\
        event: ping\n\
        \n\
        data: line one\n\
        data:line two h\u{e9} \u{20ac} \u{1f980}\n\
        \n\
        event: error\r\ndata: {\"name\":\"KernelDied\",\r\ndata:\"value\":\"x\"}\r\n\r\n\
        id: 7\n\
        event:done\rdata:{}\r\r\
        : keep-alive\n\
        data: [DONE]\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            ev("message_start", "{\"a\":1}", None),
            ev(
                "message",
                "line one\nline two h\u{e9} \u{20ac} \u{1f980}",
                None,
            ),
            ev("error", "{\"name\":\"KernelDied\",\n\"value\":\"x\"}", None),
            ev("done", "{}", Some("7")),
            ev("message", "[DONE]", Some("7")),
        ]
    }

    #[test]
    fn whole_stream() {
        assert_eq!(parse_cut(STREAM.as_bytes(), &[]), expected());
    }

    #[test]
    fn same_events_for_every_cut() {
        let bytes = STREAM.as_bytes();
        // Every single cut: CR|LF pairs and every byte of the multi-byte characters included.
        for i in 0..=bytes.len() {
            assert_eq!(parse_cut(bytes, &[i]), expected(), "cut at {i}");
        }
        // Every pair of cuts (an empty chunk between them when equal).
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                assert_eq!(parse_cut(bytes, &[i, j]), expected(), "cuts {i},{j}");
            }
        }
    }

    #[test]
    fn one_byte_at_a_time() {
        let bytes = STREAM.as_bytes();
        let every: Vec<usize> = (1..bytes.len()).collect();
        assert_eq!(parse_cut(bytes, &every), expected());
    }

    #[test]
    fn an_empty_chunk_keeps_a_pending_cr() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: a\r").is_empty());
        assert!(p.push(b"").is_empty());
        // This LF ends the CR's line; were the CR forgotten it would be a blank line.
        assert!(p.push(b"\ndata: b").is_empty());
        assert_eq!(p.push(b"\n\n"), vec![ev("message", "a\nb", None)]);
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn unterminated_last_event_is_delivered_at_the_end() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: [DONE]").is_empty());
        assert_eq!(p.finish(), Some(ev("message", "[DONE]", None)));

        let done = vec![ev("done", "{\"status\":\"ok\"}", None)];
        assert_eq!(
            parse_cut(b"event: done\ndata: {\"status\":\"ok\"}", &[]),
            done
        );
        assert_eq!(
            parse_cut(b"event: done\ndata: {\"status\":\"ok\"}\n", &[]),
            done
        );
        // The CR alone in the last chunk: the stream ends with a LF still possible.
        let cr = b"event: done\ndata: {\"status\":\"ok\"}\r";
        assert_eq!(parse_cut(cr, &[cr.len() - 1]), done);
        // Nothing pending: nothing delivered, not even a name without data.
        assert_eq!(
            parse_cut(b"data: x\n\nevent: y", &[]),
            vec![ev("message", "x", None)]
        );
        assert_eq!(SseParser::new().finish(), None);
    }

    #[test]
    fn events_without_data_are_not_dispatched() {
        let mut p = SseParser::new();
        let evs = p.push(b"event: ping\n\nretry: 10\n\n: keepalive\n\n");
        assert!(evs.is_empty(), "{evs:?}");
        // The name of a data-less event does not leak into the next one.
        assert_eq!(p.push(b"data: x\n\n"), vec![ev("message", "x", None)]);
    }

    #[test]
    fn multi_line_data_and_comments() {
        let input = b": first comment\ndata: a\n: between\ndata:  b\ndata\n\n";
        // One space after the colon goes; a bare `data` adds an empty line.
        assert_eq!(parse_cut(input, &[]), vec![ev("message", "a\n b\n", None)]);
        // A lone empty `data` is still an event, with empty data.
        assert_eq!(parse_cut(b"data:\n\n", &[]), vec![ev("message", "", None)]);
    }

    #[test]
    fn names_default_to_message_and_unknown_fields_are_ignored() {
        let input = b"event:\ndata: 1\n\nevent\nfoo: bar\nretry: 3000\ndata: 2\n\n";
        assert_eq!(
            parse_cut(input, &[]),
            vec![ev("message", "1", None), ev("message", "2", None)]
        );
    }

    #[test]
    fn ids_are_kept_across_events_reset_by_an_empty_one_and_ignored_with_nul() {
        // An id on a data-less event still counts; it carries on until the next id.
        let input = b"event: nothing\nid: 7\n\nevent: x\ndata: 1\n\ndata: 2\n\n\
            id: 8\0\ndata: 3\n\nid\ndata: 4\n\nid: 9\ndata: 5\n\n";
        assert_eq!(
            parse_cut(input, &[]),
            vec![
                ev("x", "1", Some("7")),
                ev("message", "2", Some("7")),
                ev("message", "3", Some("7")),
                ev("message", "4", None),
                ev("message", "5", Some("9")),
            ]
        );
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        assert_eq!(
            parse_cut(b"data: a\xFFb\n\n", &[]),
            vec![ev("message", "a\u{FFFD}b", None)]
        );
        // A sequence cut short by the line's end is invalid too, but the next line is fine.
        assert_eq!(
            parse_cut(b"data: \xC3\ndata: \xC3\xA9\n\n", &[7]),
            vec![ev("message", "\u{FFFD}\n\u{e9}", None)]
        );
    }
}
