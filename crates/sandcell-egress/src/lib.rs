//! The egress proxy of one sandbox: what its network policy lets it reach, enforced by name
//! and by resolved address, on the host.
//!
//! A sandbox's network namespace has only `lo`. Its guest agent bridges `127.0.0.1:3128`
//! (HTTP: `CONNECT` and absolute-form plain requests) and `127.0.0.1:1080` (SOCKS5) to a
//! Unix socket bound into the sandbox, which this proxy serves. For every connection, and
//! for every plain-HTTP request, it:
//! - checks the host and port against the policy's rules ([`sandcell_api::network`]);
//! - resolves the name itself and refuses loopback, private, link-local, metadata and other
//!   non-public addresses unless a rule names the address (DNS rebinding reaches nothing);
//! - for a tunnel carrying TLS, checks that the ClientHello's SNI names the host it asked
//!   for;
//! - counts connections and bytes against the sandbox's limits;
//! - records the decision as an [`EgressEvent`].
//!
//! The policy is read at each decision, so a change applies to the next connection.

#![forbid(unsafe_code)]

pub mod classify;
mod decide;
mod http;
mod meter;
mod proxy;
pub mod resolve;
mod socks;
pub mod tls;

pub use classify::{AddressClass, classify};
pub use decide::{Denied, decide};
pub use proxy::{EgressEvent, EgressProxy, Limits, Outcome, Protocol};
pub use resolve::{Resolution, Resolver, StaticResolver, SystemResolver};
