//! Each kernel driven over its protocol, outside any sandbox.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used)]

mod common;
mod suite;
