//! Server-sent events (`text/event-stream`): the workspace's one parser, from `sandcell-sse`
//! (shared with the model providers' streams), re-exported where callers find it.

pub use sandcell_sse::{SseEvent, SseParser};
