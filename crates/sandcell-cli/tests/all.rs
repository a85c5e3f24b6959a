//! End-to-end tests: real sandboxes through the engine, and the real `sandcell` binary.
mod suite;
