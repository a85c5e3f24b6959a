//! Sandcell's agent runtime: a model that writes code, runs it in a sandbox's live kernels
//! through the service's typed operations (never HTTP), reads the result and goes on until
//! it answers — within budgets shared by the whole run tree, every step an event committed
//! to the store before the next one.
//!
//! [`Runner`] is the resource every front end calls; [`run`] is one run's loop; [`tools`]
//! the tools of `tools` mode; [`budget`] the pool; [`event`] the trajectory's schema;
//! [`journal`] its writer.

#![forbid(unsafe_code)]

pub mod budget;
pub mod durable;
pub mod event;
pub mod journal;
pub mod repl;
pub mod run;
pub mod runner;
pub mod settings;
pub mod threads;
pub mod tools;
pub mod validate;

pub use runner::{LiveEntry, LiveRuns, Runner, run_info};
