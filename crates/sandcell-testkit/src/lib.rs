//! What Sandcell's tests share.
#![forbid(unsafe_code)]

pub mod skip;
