//! The wire types of `/v1` live in `sandcell-api`; re-exported here for the handlers.

pub use sandcell_api::sandboxes::*;
pub use sandcell_api::time::rfc3339;
