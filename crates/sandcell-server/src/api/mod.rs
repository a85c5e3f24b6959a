//! The `/v1` routes, one module per resource, and the wire types they share.

pub mod background;
pub mod code;
pub mod exec;
pub mod extract;
pub mod files;
pub mod keys;
pub mod processes;
pub mod sandboxes;
pub mod snapshots;
pub mod system;
pub mod transfer;
pub mod types;
pub mod usage;
