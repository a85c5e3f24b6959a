//! Server-sent events, as both protocols stream them: the workspace's one parser, from
//! `sandcell-sse` (shared with the REST client), re-exported under its old path.

pub use sandcell_sse::{SseEvent, SseParser};
