//! What Sandcell's tests share: [`skip`] (tests that cannot run here say so) and, with the
//! `local` feature, [`local::LocalBackend`] (the real guest agent without isolation, for
//! engine, fleet and service tests on any machine).
#![forbid(unsafe_code)]

#[cfg(feature = "llm")]
pub mod llm;
#[cfg(feature = "local")]
pub mod local;
#[cfg(feature = "registries")]
pub mod registries;
pub mod skip;
