//! Linux isolation primitives for Sandcell's `process` backend.
//!
//! This crate is the one place in the workspace with `unsafe` and raw syscalls; every
//! `unsafe` block carries a `// SAFETY:` note. The launcher ([`launch`]) runs in a
//! single-threaded helper process (`sandcell __jail`), never inside the multithreaded host.

pub mod build;
pub mod caps;
pub mod cgroup;
pub mod config;
pub mod error;
pub mod fdpass;
pub mod landlock_policy;
pub mod launch;
mod mount_attr;
pub mod net;
pub mod netns_pool;
pub mod probe;
pub mod pty;
pub mod reactor;
pub mod rlimits;
pub mod rootfs;
pub mod seccomp;
pub mod spares;
pub mod stdin;

pub use config::{JailConfig, Limits, NetworkMode, TmpfsMount};
pub use error::JailError;
