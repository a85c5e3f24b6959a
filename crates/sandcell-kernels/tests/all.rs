//! Each kernel driven over its protocol, outside any sandbox.
#![allow(clippy::unwrap_used)]

mod common;
mod suite;
