//! The `/v1` routes, one module per resource: each handler extracts, calls the service
//! (`sandcell-service`) and maps; the types are `sandcell-api`'s.

pub mod background;
pub mod code;
pub mod exec;
pub mod extract;
pub mod files;
pub mod keys;
pub mod memories;
pub mod network;
pub mod previews;
pub mod processes;
pub mod runs;
pub mod sandboxes;
pub mod snapshots;
pub mod system;
pub mod templates;
pub mod threads;
pub mod transfer;
pub mod usage;
pub mod volumes;
