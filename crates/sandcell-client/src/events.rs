//! Typed streams of server-sent events: [`EventStream`] reads a response through the one
//! [`SseParser`] and hands out each event as the route's type ([`FromEvent`]).

use std::collections::VecDeque;
use std::marker::PhantomData;

use sandcell_api::code::CodeStreamEvent;
use sandcell_api::exec::ExecStreamEvent;
use sandcell_api::processes::ProcessStreamEvent;

use crate::ClientError;
use crate::sse::{SseEvent, SseParser};

/// An event type of a streaming route.
pub trait FromEvent: Sized {
    /// The event, or `None` for a name the type does not know (a newer server's, skipped).
    fn from_event(event: &SseEvent) -> Option<Result<Self, serde_json::Error>>;
}

impl FromEvent for SseEvent {
    fn from_event(event: &SseEvent) -> Option<Result<Self, serde_json::Error>> {
        Some(Ok(event.clone()))
    }
}

/// Events whose data is any JSON (an agent run's trajectory: each event carries its `type`
/// and `seq` inside).
impl FromEvent for serde_json::Value {
    fn from_event(event: &SseEvent) -> Option<Result<Self, serde_json::Error>> {
        Some(serde_json::from_str(&event.data))
    }
}

impl FromEvent for ExecStreamEvent {
    fn from_event(event: &SseEvent) -> Option<Result<Self, serde_json::Error>> {
        Self::parse(&event.event, &event.data)
    }
}

impl FromEvent for CodeStreamEvent {
    fn from_event(event: &SseEvent) -> Option<Result<Self, serde_json::Error>> {
        Self::parse(&event.event, &event.data)
    }
}

impl FromEvent for ProcessStreamEvent {
    fn from_event(event: &SseEvent) -> Option<Result<Self, serde_json::Error>> {
        Self::parse(&event.event, &event.data)
    }
}

/// The events of one streamed answer, in order.
#[derive(Debug)]
pub struct EventStream<T> {
    resp: reqwest::Response,
    parser: Option<SseParser>,
    ready: VecDeque<SseEvent>,
    // `fn() -> T`: the stream holds no `T`, so it is `Send` whatever `T` is.
    _events: PhantomData<fn() -> T>,
}

impl<T: FromEvent> EventStream<T> {
    pub(crate) fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            parser: Some(SseParser::new()),
            ready: VecDeque::new(),
            _events: PhantomData,
        }
    }

    /// The next event; `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<Result<T, ClientError>> {
        loop {
            while let Some(raw) = self.ready.pop_front() {
                match T::from_event(&raw) {
                    None => continue,
                    Some(Ok(event)) => return Some(Ok(event)),
                    Some(Err(e)) => {
                        return Some(Err(ClientError::Decode {
                            route: format!("the '{}' event", raw.event),
                            message: e.to_string(),
                        }));
                    }
                }
            }
            let parser = self.parser.as_mut()?;
            match self.resp.chunk().await {
                Ok(Some(chunk)) => self.ready.extend(parser.push(&chunk)),
                Ok(None) => {
                    let last = self.parser.take().and_then(SseParser::finish);
                    self.ready.extend(last);
                }
                Err(source) => {
                    self.parser = None;
                    return Some(Err(ClientError::Transport {
                        what: "read the event stream",
                        source,
                    }));
                }
            }
        }
    }
}
