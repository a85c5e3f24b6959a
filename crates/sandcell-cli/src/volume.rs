//! `sandcell volume`: named volumes, folders that outlive the sandboxes mounting them
//! (`--volume NAME:PATH`). Through the daemon when one runs on the home (or `--url` names
//! one), else on the home's folders: the admin's volumes either way.

use std::process::ExitCode;

use clap::Subcommand;
use sandcell_api::volumes::VolumeInfo;
use sandcell_service::volumes::VolumeShelf;

use crate::agent::{DaemonArgs, daemon_client};
use crate::image::{ImageArgs, human};
use crate::template::runtime;

/// `sandcell volume`.
#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Make a volume (a mount also makes one on first use).
    Create {
        /// Its name (a-z, 0-9, '-', '_', '.').
        name: String,
        #[command(flatten)]
        daemon: DaemonArgs,
        #[command(flatten)]
        args: ImageArgs,
    },
    /// List the volumes, with their sizes and the sandboxes mounting them.
    Ls {
        #[command(flatten)]
        daemon: DaemonArgs,
        #[command(flatten)]
        args: ImageArgs,
    },
    /// Show a volume.
    Inspect {
        /// Its name.
        name: String,
        #[command(flatten)]
        daemon: DaemonArgs,
        #[command(flatten)]
        args: ImageArgs,
    },
    /// Delete a volume and its files (refused while a sandbox mounts it).
    Rm {
        /// Its name.
        name: String,
        #[command(flatten)]
        daemon: DaemonArgs,
        #[command(flatten)]
        args: ImageArgs,
    },
}

/// Runs a `volume` command.
pub fn volume(command: VolumeCommand) -> anyhow::Result<ExitCode> {
    let (daemon, args) = match &command {
        VolumeCommand::Create { daemon, args, .. }
        | VolumeCommand::Ls { daemon, args }
        | VolumeCommand::Inspect { daemon, args, .. }
        | VolumeCommand::Rm { daemon, args, .. } => (daemon, args),
    };
    let client = daemon_client(daemon, &args.config)?;
    let home = args.config.home();
    let local = VolumeShelf::local(&home, sandcell_server::ADMIN_OWNER);
    match &command {
        VolumeCommand::Create { name, .. } => {
            let info = match client {
                Some(c) => runtime()?.block_on(c.create_volume(name))?,
                None => local.create(name)?,
            };
            show(&[info], args.json)?;
        }
        VolumeCommand::Ls { .. } => {
            let list = match client {
                Some(c) => runtime()?.block_on(c.volumes())?,
                None => local.list()?,
            };
            show(&list.volumes, args.json)?;
        }
        VolumeCommand::Inspect { name, .. } => {
            let info = match client {
                Some(c) => runtime()?.block_on(c.volume(name))?,
                None => local.get(name)?,
            };
            println!("{}", serde_json::to_string_pretty(&info)?);
        }
        VolumeCommand::Rm { name, .. } => {
            match client {
                Some(c) => runtime()?.block_on(c.delete_volume(name))?,
                None => local.delete(name)?,
            }
            println!("{name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn show(list: &[VolumeInfo], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(list)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|v| {
            vec![
                v.name.clone(),
                human(v.size_bytes),
                v.created_at.clone(),
                if v.sandboxes.is_empty() {
                    "-".into()
                } else {
                    v.sandboxes.join(",")
                },
            ]
        })
        .collect();
    print!(
        "{}",
        crate::render::table(&["NAME", "SIZE", "CREATED", "MOUNTED BY"], &rows)
    );
    Ok(())
}
