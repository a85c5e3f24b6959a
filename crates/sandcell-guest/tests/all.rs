//! Integration tests: a real agent served on one end of a socketpair, driven by a small
//! blocking client on the other.

// Test helpers outside #[test] functions fail by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]
#![forbid(unsafe_code)]

mod suite;
