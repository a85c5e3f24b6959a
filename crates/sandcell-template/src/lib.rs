//! Templates as data, before anything is built.
//!
//! - [`dockerfile`]: the Dockerfile subset Sandcell builds, parsed into instructions that keep
//!   their line numbers; what it cannot build is refused with the line, what does not matter
//!   to a sandbox is warned about.
//! - [`plan`]: the instructions with build arguments and variables resolved, in the order a
//!   build runs them, each with the state it runs in (env, working directory, user, shell) and
//!   the cache key material of its layer.
//! - [`spec`]: the template file (TOML): the Dockerfile, build arguments, and the defaults of
//!   the sandboxes made from it (limits, network, env, kernels, warm strategy).
//! - [`workspace`]: the template a repository's tests run in, planned from its dependency
//!   files (`sandcell run --workspace`).
//!
//! Nothing here touches the file system or runs a step.
#![forbid(unsafe_code)]

pub mod builtin;
pub mod dockerfile;
pub mod plan;
pub mod spec;
pub mod workspace;

pub use dockerfile::{Command, Instruction, ParseError, Parsed, Step, Warning, parse};
pub use plan::{ImageConfig, Op, Plan, PlanError, PlannedStep, layer_key, plan};
pub use spec::{SandboxDefaults, SpecError, TemplateFile, WarmStrategy, check_reference};
