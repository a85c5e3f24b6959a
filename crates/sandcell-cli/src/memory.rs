//! `sandcell memory add|search|list|show|delete|infer-status`: memories of a sandbox
//! (`--sandbox ID`) or of the caller; `add --infer` has the configured model extract facts
//! from the text (a background job; without a daemon the command waits for it, since it
//! runs in the command's process). Through the daemon when one runs on the home (or `--url` /
//! `$SANDCELL_API_URL` names one), with its key; without one, the same service operations
//! in this process on the home's store, as the admin owner (whom the home's admin key acts
//! as). The embedded path starts no sandbox and recovers none: memories need only the
//! store (and a sandbox's record, to check it is there).

use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use std::time::Duration;

use sandcell_api::memories::{
    AddMemory, Category, InferJob, InferMemories, ListInferJobs, ListMemories, Memory, MemoryList,
    MemoryQuery, MemoryText, SearchMemories,
};
use sandcell_api::{SandboxId, Tags};
use sandcell_client::{Client, Discover};
use sandcell_server::ADMIN_OWNER;
use sandcell_service::memory::Scope;
use sandcell_service::{Caller, Service};

use crate::agent::DaemonArgs;
use crate::daemon::ConfigArgs;
use crate::render::table;

/// What every `memory` command takes: the scope, the output, where the daemon or home is.
#[derive(Debug, Args, Clone, Default)]
pub struct MemoryArgs {
    /// The sandbox whose memories (default: your own, of no sandbox).
    #[arg(long = "sandbox", value_name = "ID")]
    pub sandbox: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

/// `sandcell memory`.
#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Remember a text (`-` reads it from stdin); prints the memory's id.
    Add {
        /// What to remember.
        text: String,
        /// Its category (lowercase letters, digits, '-', '_', '.'; default general).
        #[arg(long, value_name = "C")]
        category: Option<String>,
        /// Metadata KEY=VALUE (repeatable).
        #[arg(long = "meta", value_name = "KEY=VALUE")]
        meta: Vec<String>,
        /// Have the configured model (memory.infer_model, else agent.model) extract the facts
        /// in the text, each kept as a memory: prints the job's id (follow it with
        /// `infer-status`).
        #[arg(long)]
        infer: bool,
        /// With --infer: wait for the job to end and print it (without a daemon it always
        /// waits: the job runs in this process).
        #[arg(long, requires = "infer")]
        wait: bool,
        #[command(flatten)]
        args: MemoryArgs,
    },
    /// An infer job (`add --infer`): queued, running, succeeded (with the memories it
    /// added) or failed (with why); without JOB, the scope's jobs, newest first.
    InferStatus {
        /// The job's id (`inf-…`).
        job: Option<String>,
        /// Wait for the job to end.
        #[arg(long, requires = "job")]
        wait: bool,
        #[command(flatten)]
        args: MemoryArgs,
    },
    /// The memories matching the query (its words; also its meaning when the daemon has an
    /// embedding model), most relevant first.
    Search {
        /// What to look for.
        query: String,
        /// Only this category.
        #[arg(long, value_name = "C")]
        category: Option<String>,
        /// At most this many (1 to 100; default 10).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        #[command(flatten)]
        args: MemoryArgs,
    },
    /// The memories, newest first.
    List {
        /// Only this category.
        #[arg(long, value_name = "C")]
        category: Option<String>,
        /// At most this many (1 to 1000; default 100).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// Continue after a previous page (its next_cursor, shown with --json).
        #[arg(long, value_name = "CURSOR")]
        cursor: Option<String>,
        #[command(flatten)]
        args: MemoryArgs,
    },
    /// One memory, whole.
    Show {
        /// The memory's id.
        id: String,
        #[command(flatten)]
        args: MemoryArgs,
    },
    /// Forget memories.
    Delete {
        /// The memories' ids.
        #[arg(required = true)]
        ids: Vec<String>,
        #[command(flatten)]
        args: MemoryArgs,
    },
}

/// Where the operations go.
enum Memories {
    /// The daemon's API.
    Daemon(Client),
    /// The service in this process, over the home's store.
    Local {
        service: Arc<Service>,
        caller: Caller,
    },
}

impl Memories {
    /// The daemon named or running on the home, else the home's store in this process.
    fn open(args: &MemoryArgs) -> anyhow::Result<Self> {
        let home = args.config.home();
        let named = args.daemon.url.clone().or_else(|| {
            std::env::var("SANDCELL_API_URL")
                .ok()
                .filter(|v| !v.is_empty())
        });
        let url = match named {
            Some(url) => Some(url),
            None => sandcell_client::running_daemon(&home).ok().map(|i| i.url),
        };
        if let Some(url) = url {
            let found = Discover {
                url: Some(url),
                api_key: args.daemon.api_key.clone(),
                home: Some(home),
            };
            return Ok(Self::Daemon(found.client()?));
        }
        let (config, _) = args.config.load(Vec::new())?;
        let store = Arc::new(
            sandcell_store::Store::open(&config.database)
                .with_context(|| format!("open the store {}", config.database.display()))?,
        );
        let fleet = Arc::new(sandcell_engine::fleet::Fleet::new(
            // No backend: nothing here starts or reaches a sandbox.
            sandcell_engine::Engine::builder().build(),
            Arc::new(sandcell_service::ledger::StoreLedger::new(store.clone())),
            config.fleet_limits(),
        ));
        let signer = sandcell_service::signed_url::UrlSigner::load_or_create(&config.home)
            .with_context(|| format!("the signing key in {}", config.home.display()))?;
        let service = Service::new(fleet, store, config, signer);
        let caller = admin_caller(&service, &args.config)?;
        Ok(Self::Local {
            service: Arc::new(service),
            caller,
        })
    }
}

/// Who acts in this process: the home's admin key when it is there and valid, else the
/// admin owner by name (a home no daemon has started yet has no key).
fn admin_caller(service: &Service, config: &ConfigArgs) -> anyhow::Result<Caller> {
    let path = sandcell_server::admin_key_path(&config.home());
    if let Ok(secret) = std::fs::read_to_string(&path) {
        return service
            .keys
            .authenticate(&service.store, secret.trim())?
            .with_context(|| format!("the admin key in {} is unknown or revoked", path.display()));
    }
    Ok(Caller {
        owner: ADMIN_OWNER.to_string(),
        key_id: "local".to_string(),
        admin: true,
        request_id: None,
    })
}

/// `KEY=VALUE` pairs as metadata.
fn metadata(pairs: &[String]) -> anyhow::Result<Tags> {
    let mut map = std::collections::BTreeMap::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .with_context(|| format!("--meta {p}: expected KEY=VALUE"))?;
        map.insert(k.to_string(), v.to_string());
    }
    Ok(Tags::new(map)?)
}

fn category(c: Option<String>) -> anyhow::Result<Option<Category>> {
    Ok(c.map(Category::new).transpose()?)
}

/// The first line of `text`, cut to `n` characters.
fn gist(text: &str, n: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > n || text.lines().nth(1).is_some() {
        format!("{}…", line.chars().take(n).collect::<String>())
    } else {
        line.to_string()
    }
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// How long `--wait` waits for an infer job.
const INFER_WAIT: Duration = Duration::from_secs(600);

fn print_job(job: &InferJob) {
    println!(
        "{} · {} · {} · {}",
        job.id,
        job.status.as_str(),
        job.sandbox_id.as_deref().unwrap_or("(owner)"),
        job.model
    );
    for id in &job.memories {
        println!("added {id}");
    }
    if let Some(e) = &job.error {
        println!("error: {e}");
    }
}

fn print_list(list: &MemoryList, scores: bool) {
    if let Some(r) = list.ranking {
        let name = serde_json::to_value(r).ok();
        eprintln!(
            "ranking: {}",
            name.as_ref().and_then(|v| v.as_str()).unwrap_or("?")
        );
    }
    if let Some(w) = &list.warning {
        eprintln!("warning: {w}");
    }
    let rows: Vec<Vec<String>> = list
        .memories
        .iter()
        .map(|m| {
            let mut row = vec![m.id.clone()];
            if scores {
                row.push(format!("{:.3}", m.score.unwrap_or_default()));
                let by = m
                    .matched_by
                    .and_then(|b| serde_json::to_value(b).ok())
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                row.push(by);
            }
            row.extend([m.category.clone(), m.created_at.clone(), gist(&m.text, 80)]);
            row
        })
        .collect();
    let headers: &[&str] = if scores {
        &["ID", "SCORE", "MATCHED", "CATEGORY", "CREATED", "TEXT"]
    } else {
        &["ID", "CATEGORY", "CREATED", "TEXT"]
    };
    print!("{}", table(headers, &rows));
}

/// `sandcell memory …`.
pub fn memory(cmd: MemoryCommand) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    rt.block_on(run(cmd))
}

async fn run(cmd: MemoryCommand) -> anyhow::Result<ExitCode> {
    let args = match &cmd {
        MemoryCommand::Add { args, .. }
        | MemoryCommand::InferStatus { args, .. }
        | MemoryCommand::Search { args, .. }
        | MemoryCommand::List { args, .. }
        | MemoryCommand::Show { args, .. }
        | MemoryCommand::Delete { args, .. } => args.clone(),
    };
    let sandbox = args.sandbox.as_deref().map(SandboxId::parse).transpose()?;
    let at = Memories::open(&args)?;
    let scope = match &sandbox {
        Some(id) => Scope::Sandbox(id),
        None => Scope::Owner,
    };
    let sb = sandbox.as_ref().map(|s| s.as_str());
    match cmd {
        MemoryCommand::Add {
            text,
            category: c,
            meta,
            infer,
            wait,
            ..
        } => {
            let text = if text == "-" {
                let mut all = String::new();
                std::io::stdin()
                    .read_to_string(&mut all)
                    .context("read the text from stdin")?;
                all
            } else {
                text
            };
            let req = AddMemory {
                text: MemoryText::new(text)?,
                category: category(c)?,
                metadata: metadata(&meta)?,
            };
            if infer {
                let req = InferMemories::from(req);
                let job = match &at {
                    Memories::Daemon(client) => {
                        let job = client.infer_memories(sb, &req).await?;
                        if wait {
                            client.wait_infer_job(sb, &job.id, INFER_WAIT).await?
                        } else {
                            job
                        }
                    }
                    Memories::Local { service, caller } => {
                        let job = service.infer_memories(caller, scope, req).await?;
                        // The job runs in this process: it ends with it.
                        service
                            .wait_infer_job(caller, scope, &job.id, INFER_WAIT)
                            .await?
                    }
                };
                if args.json {
                    print_json(&job)?;
                } else if job.status.is_done() {
                    print_job(&job);
                } else {
                    println!("{}", job.id);
                }
                if job.status == sandcell_api::memories::InferStatus::Failed {
                    return Ok(ExitCode::FAILURE);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let made: Memory = match &at {
                Memories::Daemon(client) => client.add_memory(sb, &req).await?,
                Memories::Local { service, caller } => {
                    service.add_memory(caller, scope, req).await?
                }
            };
            if let Some(w) = &made.warning {
                eprintln!("warning: {w}");
            }
            if args.json {
                print_json(&made)?;
            } else {
                println!("{}", made.id);
            }
        }
        MemoryCommand::InferStatus { job, wait, .. } => {
            let Some(job) = job else {
                let jobs = match &at {
                    Memories::Daemon(client) => {
                        client.infer_jobs(sb, &ListInferJobs::default()).await?
                    }
                    Memories::Local { service, caller } => {
                        service.list_infer_jobs(caller, scope, ListInferJobs::default())?
                    }
                };
                if args.json {
                    print_json(&jobs)?;
                } else {
                    let rows: Vec<Vec<String>> = jobs
                        .jobs
                        .iter()
                        .map(|j| {
                            vec![
                                j.id.clone(),
                                j.status.as_str().to_string(),
                                j.memories.len().to_string(),
                                j.created_at.clone(),
                                j.error.clone().unwrap_or_default(),
                            ]
                        })
                        .collect();
                    print!(
                        "{}",
                        table(&["JOB", "STATUS", "ADDED", "CREATED", "ERROR"], &rows)
                    );
                }
                return Ok(ExitCode::SUCCESS);
            };
            let timeout = if wait { INFER_WAIT } else { Duration::ZERO };
            let job = match &at {
                Memories::Daemon(client) => client.wait_infer_job(sb, &job, timeout).await?,
                Memories::Local { service, caller } => {
                    service.wait_infer_job(caller, scope, &job, timeout).await?
                }
            };
            if args.json {
                print_json(&job)?;
            } else {
                print_job(&job);
            }
        }
        MemoryCommand::Search {
            query,
            category: c,
            limit,
            ..
        } => {
            let req = SearchMemories {
                query: MemoryQuery::new(query)?,
                limit,
                category: category(c)?,
            };
            let found = match &at {
                Memories::Daemon(client) => client.search_memories(sb, &req).await?,
                Memories::Local { service, caller } => {
                    service.search_memories(caller, scope, req).await?
                }
            };
            if args.json {
                print_json(&found)?;
            } else {
                print_list(&found, true);
            }
        }
        MemoryCommand::List {
            category: c,
            limit,
            cursor,
            ..
        } => {
            let req = ListMemories {
                limit,
                cursor,
                category: category(c)?,
            };
            let page = match &at {
                Memories::Daemon(client) => client.memories(sb, &req).await?,
                Memories::Local { service, caller } => service.list_memories(caller, scope, req)?,
            };
            if args.json {
                print_json(&page)?;
            } else {
                print_list(&page, false);
                if let Some(next) = &page.next_cursor {
                    eprintln!("more: --cursor {next}");
                }
            }
        }
        MemoryCommand::Show { id, .. } => {
            let m = match &at {
                Memories::Daemon(client) => client.memory(sb, &id).await?,
                Memories::Local { service, caller } => service.get_memory(caller, scope, &id)?,
            };
            if args.json {
                print_json(&m)?;
            } else {
                println!(
                    "{} · {} · {} · {}",
                    m.id,
                    m.sandbox_id.as_deref().unwrap_or("(owner)"),
                    m.category,
                    m.created_at
                );
                for (k, v) in &m.metadata {
                    println!("{k}={v}");
                }
                println!("\n{}", m.text);
            }
        }
        MemoryCommand::Delete { ids, .. } => {
            let mut failed = Vec::new();
            for id in &ids {
                let done = match &at {
                    Memories::Daemon(client) => client
                        .delete_memory(sb, id)
                        .await
                        .map_err(anyhow::Error::from),
                    Memories::Local { service, caller } => service
                        .delete_memory(caller, scope, id)
                        .map_err(anyhow::Error::from),
                };
                if let Err(e) = done {
                    eprintln!("sandcell: {id}: {e:#}");
                    failed.push(id.clone());
                }
            }
            if args.json {
                let deleted: Vec<&String> = ids.iter().filter(|i| !failed.contains(i)).collect();
                print_json(&serde_json::json!({ "deleted": deleted, "failed": failed }))?;
            }
            if !failed.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
