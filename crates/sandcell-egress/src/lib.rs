//! The egress proxy of one sandbox: what its network policy lets it reach, enforced by name
//! and by resolved address, on the host.
//!
//! A sandbox's network namespace has only `lo`. Its guest agent bridges `127.0.0.1:3128`
//! (HTTP: `CONNECT` and absolute-form plain requests) and `127.0.0.1:1080` (SOCKS5) to a
//! Unix socket bound into the sandbox, which this proxy serves (on the process backend the
//! bridge hands each client's socket over instead: `handover.rs`). For every connection, and
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
//!
//! **Secrets** ([`Secrets`], set live with [`EgressProxy::set_secrets`]) never enter the
//! sandbox: it holds placeholders, and the proxy puts the values in the header values and
//! query strings of requests to each secret's hosts only, refusing (`403`, a denied event) a
//! placeholder on its way anywhere else. Plain-HTTP requests are read as they pass; `CONNECT`
//! tunnels are read by terminating their TLS with the proxy's own CA ([`InterceptCa`], which
//! the sandbox trusts; given with [`EgressProxy::set_interception`]) and verifying the
//! upstream against [`UpstreamTrust`]. Responses are relayed as they are: a host that echoes
//! a value back shows it to the sandbox (its own doing); the proxy's own answers never
//! hold one.

#![forbid(unsafe_code)]

pub mod ca;
pub mod classify;
mod decide;
mod handover;
mod http;
mod intercept;
mod meter;
mod proxy;
pub mod resolve;
pub mod secrets;
mod socks;
mod splice;
pub mod tls;

pub use ca::{CaError, InterceptCa, Interception, UpstreamTrust};
pub use classify::{AddressClass, classify};
pub use decide::{Denied, decide};
pub use proxy::{EgressEvent, EgressProxy, Limits, Outcome, Protocol};
pub use resolve::{Resolution, Resolver, StaticResolver, SystemResolver};
pub use secrets::{PLACEHOLDER_PREFIX, Refusal, RequestHead, Secret, SecretError, Secrets};
