//! The `sandcell` binary. Hidden entry points (`__jail`, `__gvisor-guest`, `__build-step`) are dispatched before anything
//! else runs, because the launcher must still be single-threaded when it clones.

#![forbid(unsafe_code)]

use std::process::ExitCode;

mod agent;
mod bench;
mod cli;
mod client;
mod daemon;
mod doctor;
mod image;
mod mcp;
mod memory;
mod options;
mod render;
mod repl;
mod run;
mod template;
mod volume;
mod workspace;

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "__jail") {
        return jail();
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__gvisor-guest")
    {
        return gvisor_guest();
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "__guest") {
        return exec_guest();
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__build-step")
    {
        let code = sandcell_jail::build::main_from_stdin();
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    cli::main()
}

/// `sandcell __guest`: the agent executed by a checkpointable sandbox's PID 1, its host
/// socket on fd 3 and its isolation report in `SANDCELL_ISOLATION`.
fn exec_guest() -> ExitCode {
    match sandcell_jail::launch::executed_agent() {
        Ok((socket, isolation)) => {
            ExitCode::from(u8::try_from(serve_guest(socket, isolation)).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("sandcell __guest: {e}");
            ExitCode::from(1)
        }
    }
}

/// `sandcell __jail`: the per-sandbox launcher, which becomes the guest agent inside.
fn jail() -> ExitCode {
    use sandcell_jail::launch::Outcome;
    let code = match sandcell_jail::launch::run() {
        Outcome::Exit(code) => code,
        Outcome::Sandbox {
            socket,
            isolation,
            listener,
            ..
        } => serve_guest_with(socket, isolation, listener),
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// `sandcell __gvisor-guest`: the guest agent as PID 1 of a gVisor sandbox, its host
/// connection on stdin (see `sandcell-backend-gvisor`).
fn gvisor_guest() -> ExitCode {
    match sandcell_backend_gvisor::guest::enter() {
        Ok(socket) => {
            let config = sandcell_guest::GuestConfig {
                isolation: sandcell_protocol::IsolationReport::default(),
                pid1: true,
                ..Default::default()
            };
            let config = if sandcell_backend_gvisor::guest::egress_bound() {
                config.with_egress()
            } else {
                config
            };
            ExitCode::from(u8::try_from(run_guest(socket, config)).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("sandcell __gvisor-guest: {e}");
            ExitCode::from(1)
        }
    }
}

/// Serves the guest agent as the sandbox's PID 1; returns the exit code.
pub fn serve_guest(
    socket: std::os::unix::net::UnixStream,
    isolation: sandcell_protocol::IsolationReport,
) -> i32 {
    serve_guest_with(socket, isolation, None)
}

/// As [`serve_guest`], listening on `listener` for the host to come back when it was given.
fn serve_guest_with(
    socket: std::os::unix::net::UnixStream,
    isolation: sandcell_protocol::IsolationReport,
    listener: Option<std::os::unix::net::UnixListener>,
) -> i32 {
    let config = sandcell_guest::GuestConfig {
        isolation,
        pid1: true,
        listener: listener.map(std::sync::Arc::new),
        ..Default::default()
    }
    .with_egress_if_bound();
    run_guest(socket, config)
}

fn run_guest(socket: std::os::unix::net::UnixStream, config: sandcell_guest::GuestConfig) -> i32 {
    match sandcell_guest::serve(socket, config) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}
