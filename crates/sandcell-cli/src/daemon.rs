//! `sandcell serve`, `init`, `config show` and `key …`: running the service and managing its
//! settings and API keys (keys are managed in the store directly, daemon running or not).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use sandcell_server::config::{self, Config, Shown};
use sandcell_store::Store;

use crate::render::table;

/// Where the settings come from, shared by the daemon commands.
#[derive(Debug, Args, Clone, Default)]
pub struct ConfigArgs {
    /// The settings file (default: <home>/config.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Sandcell's data directory (default: $SANDCELL_HOME, /var/lib/sandcell as root, else
    /// ~/.local/share/sandcell).
    #[arg(long, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Override one setting, e.g. --set limits.max_sandboxes=10 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ConfigArgs {
    /// The data directory.
    pub fn home(&self) -> PathBuf {
        self.home.clone().unwrap_or_else(config::default_home)
    }

    /// The effective settings, with where each came from; `flags` are extra command-line
    /// settings (dotted key, value).
    pub fn load(&self, mut flags: Vec<(String, String)>) -> anyhow::Result<(Config, Vec<Shown>)> {
        for pair in &self.set {
            let (k, v) = pair
                .split_once('=')
                .with_context(|| format!("--set {pair}: expected KEY=VALUE"))?;
            flags.push((k.trim().to_string(), v.to_string()));
        }
        let env: Vec<(String, String)> = std::env::vars().collect();
        Ok(config::load(
            &self.home(),
            self.config.as_deref(),
            &env,
            &flags,
        )?)
    }
}

/// `sandcell serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// TCP address to listen on (setting `listen`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Also serve on this UNIX socket (setting `unix_socket`).
    #[arg(long, value_name = "PATH")]
    pub unix_socket: Option<PathBuf>,
}

/// Runs the service until SIGTERM/SIGINT.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut flags = Vec::new();
    if let Some(l) = &args.listen {
        flags.push(("listen".to_string(), l.clone()));
    }
    if let Some(p) = &args.unix_socket {
        flags.push(("unix_socket".to_string(), p.display().to_string()));
    }
    let (config, _) = args.config.load(flags)?;
    init_logging(&config.log_format);
    let mut backend_config = crate::cli::backend_config()?;
    // Sandboxes outlive a crash of the daemon: the next start reattaches to them.
    backend_config.agent_sockets = true;
    if crate::cli::test_resolver_set() {
        let loopback = config
            .listen
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
        anyhow::ensure!(
            loopback,
            "SANDCELL_TEST_RESOLVE is for tests only: the daemon refuses it while listening on \
             {} (not loopback)",
            config.listen
        );
    }
    let engine = crate::cli::service_engine(backend_config, &config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    rt.block_on(sandcell_server::serve(sandcell_server::ServeOptions {
        config,
        engine,
        on_ready: None,
    }))?;
    Ok(())
}

fn init_logging(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SANDCELL_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

/// `sandcell init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Replace an existing config file.
    #[arg(long)]
    pub force: bool,
}

/// Writes a commented config file with every default.
pub fn init(args: InitArgs) -> anyhow::Result<()> {
    let home = args.config.home();
    let path = args
        .config
        .config
        .clone()
        .unwrap_or_else(|| home.join("config.toml"));
    if path.exists() && !args.force {
        bail!("{} exists already (--force replaces it)", path.display());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::write(&path, config::commented_defaults(&home))
        .with_context(|| format!("write {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// `sandcell config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the settings in force and where each came from.
    Show {
        #[command(flatten)]
        config: ConfigArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `config` command.
pub fn config_command(cmd: ConfigCommand) -> anyhow::Result<()> {
    match cmd {
        ConfigCommand::Show { config, json } => {
            let (_, shown) = config.load(Vec::new())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                let rows: Vec<Vec<String>> = shown
                    .iter()
                    .map(|s| {
                        vec![
                            s.key.clone(),
                            s.value.clone(),
                            serde_json::to_value(s.source)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default(),
                        ]
                    })
                    .collect();
                print!("{}", table(&["SETTING", "VALUE", "FROM"], &rows));
            }
            Ok(())
        }
    }
}

/// `sandcell key …`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create a key and print its secret (shown only this once).
    Create {
        #[command(flatten)]
        config: ConfigArgs,
        /// A name to recognise it by.
        #[arg(long, default_value = "cli")]
        name: String,
        /// Whose sandboxes it acts on.
        #[arg(long, default_value = sandcell_server::ADMIN_OWNER)]
        owner: String,
        /// May manage other owners' keys.
        #[arg(long)]
        admin: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List keys (never their secrets).
    #[command(alias = "ls")]
    List {
        #[command(flatten)]
        config: ConfigArgs,
        /// Only this owner's.
        #[arg(long)]
        owner: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key at once.
    Revoke {
        #[command(flatten)]
        config: ConfigArgs,
        /// The key id.
        id: String,
    },
}

fn open_store(config: &ConfigArgs) -> anyhow::Result<Store> {
    let (c, _) = config.load(Vec::new())?;
    open_store_at(&c.database)
}

fn open_store_at(path: &Path) -> anyhow::Result<Store> {
    Store::open(path).with_context(|| format!("open the store {}", path.display()))
}

/// Runs a `key` command.
pub fn key_command(cmd: KeyCommand) -> anyhow::Result<()> {
    match cmd {
        KeyCommand::Create {
            config,
            name,
            owner,
            admin,
            json,
        } => {
            sandcell_api::rules::check_owner(&owner)?;
            let store = open_store(&config)?;
            let (record, secret) = sandcell_service::caller::new_key(&owner, &name, admin)?;
            store.insert_key(&record)?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"id": record.id, "owner": record.owner, "name": record.name, "admin": record.admin, "key": secret})
                );
            } else {
                println!("{secret}");
                eprintln!(
                    "key {} for owner '{}' created; the secret above is not stored and will not be shown again",
                    record.id, record.owner
                );
            }
            Ok(())
        }
        KeyCommand::List {
            config,
            owner,
            json,
        } => {
            let store = open_store(&config)?;
            let keys = store.list_keys(owner.as_deref())?;
            if json {
                let items: Vec<_> = keys
                    .iter()
                    .map(|k| {
                        serde_json::json!({"id": k.id, "owner": k.owner, "name": k.name, "prefix": k.prefix,
                            "admin": k.admin, "created_at": k.created_at, "last_used_at": k.last_used_at,
                            "revoked_at": k.revoked_at})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&items)?);
            } else {
                let rows: Vec<Vec<String>> = keys
                    .iter()
                    .map(|k| {
                        vec![
                            k.id.clone(),
                            k.owner.clone(),
                            k.name.clone(),
                            if k.admin { "admin" } else { "" }.into(),
                            if k.revoked_at.is_some() {
                                "revoked"
                            } else {
                                "active"
                            }
                            .into(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(&["ID", "OWNER", "NAME", "ROLE", "STATE"], &rows)
                );
            }
            Ok(())
        }
        KeyCommand::Revoke { config, id } => {
            let store = open_store(&config)?;
            if !store.revoke_key(&id, sandcell_engine::fleet::now_ms())? {
                bail!("no key '{id}'");
            }
            println!("revoked {id} (a running daemon stops accepting it within 2 s)");
            Ok(())
        }
    }
}
