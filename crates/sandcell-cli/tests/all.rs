//! End-to-end tests: real sandboxes through the engine, and the real `sandcell` binary.
#![allow(clippy::unwrap_used)]
mod suite;
