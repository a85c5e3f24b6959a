//! The `sandcell` binary. Hidden entry points (`__jail`) are dispatched before anything
//! else runs, because the launcher must still be single-threaded when it clones.

use std::process::ExitCode;

mod bench;
mod cli;
mod doctor;
mod run;

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "__jail") {
        return jail();
    }
    cli::main()
}

/// `sandcell __jail`: the per-sandbox launcher, which becomes the guest agent inside.
fn jail() -> ExitCode {
    use sandcell_jail::launch::Outcome;
    match sandcell_jail::launch::run() {
        Outcome::Exit(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Outcome::Sandbox {
            socket,
            isolation,
            config: _,
        } => {
            let config = sandcell_guest::GuestConfig {
                isolation,
                pid1: true,
                ..Default::default()
            };
            match sandcell_guest::serve(socket, config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::FAILURE,
            }
        }
    }
}
