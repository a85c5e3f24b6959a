//! The one parser of `text/event-stream` (server-sent events): bytes in, in chunks cut
//! anywhere, events out.
//!
//! It follows the format's rules: lines end with LF, CRLF or CR; a blank line ends an event;
//! a line starting with `:` is a comment; `data` lines join with `\n`; one space after the
//! colon is dropped; an event without data is not dispatched. One leniency: at the end of
//! the stream, an event whose blank line never came is still delivered (a stream cut right
//! after its last `data` line loses nothing the server sent whole).

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its name (`message` when it has no `event` field).
    pub event: String,
    /// Its data, `data` lines joined with `\n`.
    pub data: String,
    /// Its `id` field, if it had one.
    pub id: Option<String>,
}

/// An incremental parser: feed it chunks with [`SseParser::push`], then
/// [`SseParser::finish`] at the end of the stream.
#[derive(Debug, Default)]
pub struct SseParser {
    /// The current line's bytes so far (a UTF-8 sequence may be cut between chunks, so
    /// lines are decoded only once whole).
    line: Vec<u8>,
    /// The previous chunk ended with CR: a LF starting this one belongs to it.
    after_cr: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
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
        if self.after_cr {
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
            if let Some(event) = self.line_done(&String::from_utf8_lossy(&line)) {
                events.push(event);
            }
        }
        self.line.extend_from_slice(rest);
        events
    }

    /// Ends the stream: the last line and event, even without their final newlines.
    pub fn finish(mut self) -> Option<SseEvent> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.line_done(&String::from_utf8_lossy(&line)) {
                return Some(event);
            }
        }
        self.dispatch()
    }

    fn line_done(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
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
            // An id with NUL is ignored, as the format says.
            "id" if !value.contains('\0') => self.id = Some(value.to_string()),
            // `retry` and unknown fields mean nothing to a client that does not reconnect.
            _ => {}
        }
        None
    }

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

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
            id: None,
        }
    }

    /// Parses `input` cut into chunks at `cuts`.
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

    const STREAM: &str = ": keep-alive\n\
        event: stdout\ndata: {\"text\":\"h\u{e9}\"}\n\n\
        event: error\r\ndata: {\"name\":\"KernelDied\",\r\ndata:\"value\":\"x\"}\r\n\r\n\
        event:done\rdata:{}\r\r\
        data: plain\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            ev("stdout", "{\"text\":\"h\u{e9}\"}"),
            ev("error", "{\"name\":\"KernelDied\",\n\"value\":\"x\"}"),
            ev("done", "{}"),
            ev("message", "plain"),
        ]
    }

    #[test]
    fn whole_stream() {
        assert_eq!(parse_cut(STREAM.as_bytes(), &[]), expected());
    }

    #[test]
    fn chunk_boundaries_anywhere() {
        let bytes = STREAM.as_bytes();
        // Every single cut, CR|LF pairs and the two bytes of `é` included.
        for cut in 0..=bytes.len() {
            assert_eq!(parse_cut(bytes, &[cut]), expected(), "cut at {cut}");
        }
        // And one byte at a time.
        let every: Vec<usize> = (1..bytes.len()).collect();
        assert_eq!(parse_cut(bytes, &every), expected());
    }

    #[test]
    fn multi_line_data_and_comments() {
        let input = b": first comment\ndata: a\n: between\ndata:  b\ndata\n\n";
        // One space after the colon goes; a bare `data` adds an empty line.
        assert_eq!(parse_cut(input, &[]), vec![ev("message", "a\n b\n")]);
    }

    #[test]
    fn missing_final_newline() {
        assert_eq!(
            parse_cut(b"event: done\ndata: {\"status\":\"ok\"}", &[]),
            vec![ev("done", "{\"status\":\"ok\"}")]
        );
        assert_eq!(
            parse_cut(b"event: done\ndata: {}\n", &[]),
            vec![ev("done", "{}")]
        );
        assert_eq!(
            parse_cut(b"event: done\ndata: {}\r", &[19]),
            vec![ev("done", "{}")]
        );
    }

    #[test]
    fn events_without_data_are_not_dispatched_and_ids_are_kept() {
        let input = b"event: nothing\n\nid: 7\nevent: x\ndata: 1\n\n";
        assert_eq!(
            parse_cut(input, &[]),
            vec![SseEvent {
                event: "x".into(),
                data: "1".into(),
                id: Some("7".into()),
            }]
        );
    }
}
