//! `sandcell repl`: an interactive session with a language kernel in a fresh sandbox.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use sandcell_engine::{CodeEvent, Engine, Sandbox};
use sandcell_protocol::{Completeness, Language, RunCodeRequest};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{mpsc, oneshot};

use crate::options::{Lang, SandboxArgs};
use crate::render::Renderer;

/// Arguments of `sandcell repl`.
#[derive(Debug, Args)]
#[command(
    after_help = "State persists between inputs; a cell runs once it is complete (Python needs a blank line\nafter a block). Ctrl-C interrupts a running cell and keeps the state; Ctrl-D ends the session\nand the sandbox. Images are saved to files and their paths printed.\n\nExample:\n  printf 'x = 41\\nx + 1\\n' | sandcell repl --lang python"
)]
pub struct ReplArgs {
    /// Language of the session.
    #[arg(long, value_enum, default_value = "python")]
    lang: Lang,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Where images are saved (default: a new folder under the temp dir).
    #[arg(long, value_name = "DIR")]
    image_dir: Option<PathBuf>,
}

/// One line of input, or why there is none.
enum Input {
    Line(String),
    /// Ctrl-C at the prompt: drop what was typed.
    Cancel,
    /// Ctrl-D or the end of piped input.
    Eof,
}

/// A request for the next line.
struct Ask {
    prompt: String,
    reply: oneshot::Sender<Input>,
}

/// Reads lines on a thread of its own (reading a terminal or a pipe blocks): with line editing
/// and history on a terminal, plain lines otherwise.
fn start_reader(language: Language) -> mpsc::UnboundedSender<Ask> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Ask>();
    std::thread::spawn(move || {
        if std::io::stdin().is_terminal()
            && let Ok(mut editor) = rustyline::DefaultEditor::new()
        {
            let history = history_file(language);
            if let Some(h) = &history {
                let _ = editor.load_history(h);
                if let Some(dir) = h.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
            }
            while let Some(ask) = rx.blocking_recv() {
                let input = match editor.readline(&ask.prompt) {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            let _ = editor.add_history_entry(line.as_str());
                            // Saved as it grows: the session may end (the process exit)
                            // before this thread gets another turn.
                            if let Some(h) = &history {
                                let _ = editor.save_history(h);
                            }
                        }
                        Input::Line(line)
                    }
                    Err(rustyline::error::ReadlineError::Interrupted) => Input::Cancel,
                    Err(_) => Input::Eof,
                };
                let _ = ask.reply.send(input);
            }
            return;
        }
        let mut lines = std::io::stdin().lock().lines();
        while let Some(ask) = rx.blocking_recv() {
            let input = match lines.next() {
                Some(Ok(line)) => Input::Line(line),
                _ => Input::Eof,
            };
            let _ = ask.reply.send(input);
        }
    });
    tx
}

/// `$SANDCELL_HOME/repl-history-<lang>` (default home: `~/.sandcell`).
fn history_file(language: Language) -> Option<PathBuf> {
    let home = std::env::var_os("SANDCELL_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".sandcell")))?;
    Some(home.join(format!("repl-history-{}", language.as_str())))
}

fn prompts(language: Language) -> (&'static str, &'static str) {
    match language {
        Language::Python => (">>> ", "... "),
        Language::Node => ("> ", "... "),
        Language::Bash => ("$ ", "> "),
        Language::R => ("> ", "+ "),
    }
}

async fn ask(reader: &mpsc::UnboundedSender<Ask>, prompt: String) -> Input {
    let (tx, rx) = oneshot::channel();
    if reader.send(Ask { prompt, reply: tx }).is_err() {
        return Input::Eof;
    }
    rx.await.unwrap_or(Input::Eof)
}

/// Runs `sandcell repl`.
pub async fn repl(args: ReplArgs, engine: Engine) -> anyhow::Result<ExitCode> {
    let language = args.lang.language();
    let mut spec = args.sandbox.spec()?;
    if args.sandbox.cwd.is_none() {
        // The session's kernel starts while the sandbox is being created.
        spec.warm_kernels = vec![language];
    }
    spec.validate()?;
    let timeout_ms = args.sandbox.timeout_ms()?;
    let sandbox = engine.create(spec).await.context("create the sandbox")?;
    let outcome = session(&sandbox, &args, language, timeout_ms).await;
    let _ = sandbox.destroy().await;
    outcome
}

async fn session(
    sandbox: &Sandbox,
    args: &ReplArgs,
    language: Language,
    timeout_ms: Option<u64>,
) -> anyhow::Result<ExitCode> {
    let context = match &args.sandbox.cwd {
        None => language.as_str().to_string(),
        Some(cwd) => {
            sandbox
                .create_context(language, Some(cwd.clone()), Default::default())
                .await
                .context("start the kernel")?
                .id
        }
    };
    let tty = std::io::stdin().is_terminal();
    if tty {
        eprintln!(
            "sandcell repl · {language} in sandbox {} · Ctrl-C interrupts a cell, Ctrl-D ends",
            sandbox.id()
        );
    }
    let dir = args
        .image_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("sandcell-repl-{}", sandbox.id())));
    let mut renderer = Renderer::new(dir);
    let reader = start_reader(language);
    // One listener for the session: registering one per cell costs more than a cell.
    let mut ctrl_c = signal(SignalKind::interrupt()).context("listen for Ctrl-C")?;
    let (primary, continuation) = prompts(language);
    let mut last_failed = false;
    'cells: loop {
        let mut cell = String::new();
        loop {
            let prompt = if !tty {
                String::new()
            } else if cell.is_empty() {
                primary.to_string()
            } else {
                continuation.to_string()
            };
            match ask(&reader, prompt).await {
                Input::Eof if cell.trim().is_empty() => break 'cells,
                // The input ended inside a block: run what there is.
                Input::Eof => break,
                Input::Cancel => continue 'cells,
                Input::Line(line) => {
                    if cell.is_empty() && line.trim().is_empty() {
                        continue;
                    }
                    cell.push_str(&line);
                    cell.push('\n');
                }
            }
            let (status, _indent) = sandbox
                .is_complete(Some(&context), None, &cell)
                .await
                .context("check the input")?;
            if status != Completeness::Incomplete {
                break;
            }
        }
        last_failed = !run_cell(
            sandbox,
            &context,
            &cell,
            timeout_ms,
            &mut renderer,
            &mut ctrl_c,
        )
        .await?;
    }
    Ok(if last_failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs one cell, printing as it goes; Ctrl-C interrupts it. Returns whether it succeeded.
async fn run_cell(
    sandbox: &Sandbox,
    context: &str,
    code: &str,
    timeout_ms: Option<u64>,
    renderer: &mut Renderer,
    ctrl_c: &mut Signal,
) -> anyhow::Result<bool> {
    let req = RunCodeRequest {
        context: Some(context.to_string()),
        language: None,
        code: code.to_string(),
        timeout_ms,
    };
    let mut stream = sandbox.run_code_stream(req).await.context("run the cell")?;
    let mut ok = false;
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            Some(()) = ctrl_c.recv() => {
                sandbox.interrupt(context).await.context("interrupt the cell")?;
                continue;
            }
        };
        let Some(event) = event else { break };
        let event = event.context("run the cell")?;
        renderer.event(&event)?;
        if let CodeEvent::Done(done) = &event {
            ok = done.status == sandcell_protocol::CodeStatus::Ok;
        }
    }
    Ok(ok)
}
