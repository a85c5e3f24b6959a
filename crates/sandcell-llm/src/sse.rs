//! The one parser of server-sent events both protocols stream in: bytes in, in chunks cut
//! anywhere (inside a line, a CRLF pair or a UTF-8 sequence), events out.
//!
//! It follows the format's rules: lines end with LF, CRLF or CR; a blank line ends an event;
//! a line starting with `:` is a comment; `data` lines join with `\n`; one space after the
//! colon is dropped; an event without data is not dispatched. One leniency: at the end of
//! the stream an event whose blank line never came is still delivered (some servers end
//! with `data: [DONE]\n` alone).

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its `event` field (Anthropic names every event; OpenAI names none).
    pub event: Option<String>,
    /// Its data, `data` lines joined with `\n`.
    pub data: String,
}

/// An incremental parser: [`SseParser::push`] each chunk, then [`SseParser::finish`].
#[derive(Debug, Default)]
pub struct SseParser {
    /// The current line's bytes so far, decoded only once whole.
    line: Vec<u8>,
    /// The last chunk ended with CR: a LF starting the next belongs to it.
    after_cr: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
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
        // An empty chunk must not forget a pending CR.
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
            if let Some(ev) = self.line_done(&line) {
                events.push(ev);
            }
        }
        self.line.extend_from_slice(rest);
        events
    }

    /// Ends the stream: a last line without its end, and an event without its blank line,
    /// are still delivered.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            if let Some(ev) = self.line_done(&line) {
                events.push(ev);
            }
        }
        if let Some(ev) = self.dispatch() {
            events.push(ev);
        }
        events
    }

    fn line_done(&mut self, line: &[u8]) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
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
            // id and retry matter only to reconnecting browsers; a model call is never
            // resumed mid-stream.
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        if !self.has_data {
            return None;
        }
        self.has_data = false;
        Some(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        let mut start = 0;
        for &c in cuts {
            out.extend(p.push(&input[start..c]));
            start = c;
        }
        out.extend(p.push(&input[start..]));
        out.extend(p.finish());
        out
    }

    const STREAM: &str = ": a comment\r\n\
        event: message_start\r\n\
        data: {\"a\":1}\r\n\
        \r\n\
        data: line one\n\
        data:line two é\n\
        \n\
        event: ping\n\
        \n\
        event: x\rdata: cr only\r\r\
        data: [DONE]\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent {
                event: Some("message_start".into()),
                data: "{\"a\":1}".into(),
            },
            SseEvent {
                event: None,
                data: "line one\nline two é".into(),
            },
            SseEvent {
                event: Some("x".into()),
                data: "cr only".into(),
            },
            SseEvent {
                event: None,
                data: "[DONE]".into(),
            },
        ]
    }

    #[test]
    fn parses_whole() {
        assert_eq!(parse_in_pieces(STREAM.as_bytes(), &[]), expected());
    }

    #[test]
    fn same_events_for_every_split_point() {
        let bytes = STREAM.as_bytes();
        for i in 0..=bytes.len() {
            assert_eq!(parse_in_pieces(bytes, &[i]), expected(), "cut at {i}");
        }
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                assert_eq!(parse_in_pieces(bytes, &[i, j]), expected(), "cuts {i},{j}");
            }
        }
    }

    #[test]
    fn one_byte_at_a_time() {
        let bytes = STREAM.as_bytes();
        let cuts: Vec<usize> = (1..bytes.len()).collect();
        assert_eq!(parse_in_pieces(bytes, &cuts), expected());
    }

    #[test]
    fn unterminated_last_event_is_delivered_at_the_end() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: [DONE]").is_empty());
        assert_eq!(
            p.finish(),
            vec![SseEvent {
                event: None,
                data: "[DONE]".into()
            }]
        );
    }

    #[test]
    fn events_without_data_are_not_dispatched() {
        let mut p = SseParser::new();
        let evs = p.push(b"event: ping\n\nretry: 10\n\n: keepalive\n\n");
        assert!(evs.is_empty(), "{evs:?}");
        // The name of a data-less event does not leak into the next one.
        let evs = p.push(b"data: x\n\n");
        assert_eq!(evs[0].event, None);
    }
}
