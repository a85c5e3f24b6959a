//! Kernel state capture through the agent: `DumpKernelState` in one agent, `LoadKernelState`
//! in a new agent (fresh kernels, as in a sandbox restored from a snapshot).

use std::path::Path;

use sandcell_protocol::{
    CodeStatus, ErrorCode, Frame, GuestMessage, HostMessage, Language, RunCodeRequest,
};

use super::client::{Agent, expect_code};

/// What one execution sent back.
#[derive(Debug, Default)]
struct Run {
    stdout: String,
    result: Option<String>,
    errors: Vec<String>,
    status: Option<CodeStatus>,
}

fn run(agent: &mut Agent, context: &str, code: &str) -> Run {
    let id = agent.new_id();
    agent.send(
        id,
        &HostMessage::RunCode(RunCodeRequest {
            context: Some(context.into()),
            language: None,
            code: code.into(),
            timeout_ms: Some(60_000),
        }),
    );
    let mut out = Run::default();
    loop {
        let Frame::Message { msg, .. } = agent.next_for(id) else {
            panic!("a data chunk for a run");
        };
        match msg {
            GuestMessage::CodeStream { text, .. } => out.stdout.push_str(&text),
            GuestMessage::CodeResult { data, .. } => {
                out.result = data
                    .get("text/plain")
                    .and_then(|v| v.as_str())
                    .map(str::to_string);
            }
            GuestMessage::CodeError(e) => out.errors.push(format!("{}: {}", e.ename, e.evalue)),
            GuestMessage::CodeDone(done) => {
                out.status = Some(done.status);
                return out;
            }
            GuestMessage::CodeDisplay { .. } => {}
            other => panic!("unexpected reply to a run: {other:?}"),
        }
    }
}

/// Runs a cell that must succeed and returns its result's text.
fn value(agent: &mut Agent, context: &str, code: &str) -> String {
    let r = run(agent, context, code);
    assert_eq!(r.status, Some(CodeStatus::Ok), "{code}: {r:?}");
    match r.result {
        Some(text) => text,
        None => panic!("{code}: no result ({:?})", r.errors),
    }
}

fn create(agent: &mut Agent, language: Language) -> String {
    let cwd = agent.workspace().display().to_string();
    match agent.call(HostMessage::CreateContext {
        language,
        cwd: Some(cwd),
        env: Default::default(),
    }) {
        GuestMessage::Context { context } => context.id,
        other => panic!("no context: {other:?}"),
    }
}

fn dump(
    agent: &mut Agent,
    context: &str,
    path: &Path,
) -> (Vec<String>, Vec<(String, String, String)>, u64) {
    match agent.call(HostMessage::DumpKernelState {
        context: context.into(),
        path: path.display().to_string(),
    }) {
        GuestMessage::KernelStateSaved {
            saved,
            skipped,
            bytes,
        } => (
            saved,
            skipped
                .into_iter()
                .map(|s| (s.name, s.type_name, s.reason))
                .collect(),
            bytes,
        ),
        other => panic!("dump failed: {other:?}"),
    }
}

fn load(agent: &mut Agent, context: &str, language: Language, path: &Path) -> Vec<String> {
    match agent.call(HostMessage::LoadKernelState {
        context: context.into(),
        language,
        path: path.display().to_string(),
    }) {
        GuestMessage::KernelStateLoaded { restored, failed } => {
            assert!(failed.is_empty(), "restore failures: {failed:?}");
            restored
        }
        other => panic!("load failed: {other:?}"),
    }
}

#[test]
fn python_state_moves_to_a_new_agent() {
    // Outlives both agents, as a snapshot does.
    let store = tempfile::tempdir().unwrap();
    let state = store.path().join(".sandcell-state/python.pkl");
    let mut a = Agent::start();
    let ctx = create(&mut a, Language::Python);
    let notes = a.ws_path("notes.txt");
    let setup = run(
        &mut a,
        &ctx,
        &format!(
            r#"
import json as j
big = list(range(5_000_000))
blob = bytearray(50 * 2**20)
blob[-1] = 7
def scale(v, k=3):
    return [x * k for x in v]
class Account:
    def __init__(self, owner, balance):
        self.owner, self.balance = owner, balance
    def deposit(self, n):
        self.balance += n
        return self.balance
acct = Account("ada", 10)
double = lambda x: 2 * x
log = open({notes:?}, "w")
"#
        ),
    );
    assert_eq!(setup.status, Some(CodeStatus::Ok), "{setup:?}");
    let (saved, skipped, bytes) = dump(&mut a, &ctx, &state);
    for name in ["j", "big", "blob", "scale", "Account", "acct", "double"] {
        assert!(saved.iter().any(|s| s == name), "{name} not in {saved:?}");
    }
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    let (name, type_name, reason) = &skipped[0];
    assert_eq!(
        (name.as_str(), type_name.as_str()),
        ("log", "TextIOWrapper")
    );
    assert!(reason.contains("open file"), "{reason}");
    // 50 MiB of bytearray plus five million ints, written by the kernel itself.
    assert!(bytes > 60 << 20, "{bytes}");
    assert_eq!(bytes, std::fs::metadata(&state).unwrap().len());
    drop(a);

    // A new agent: no context yet; the restore makes it, with the same id, and its kernel.
    let mut b = Agent::start();
    let restored = load(&mut b, &ctx, Language::Python, &state);
    assert_eq!(restored, saved);
    match b.call(HostMessage::ListContexts) {
        GuestMessage::Contexts { contexts } => {
            let c = contexts
                .iter()
                .find(|c| c.id == ctx)
                .expect("restored context");
            assert_eq!(c.language, Language::Python);
            assert!(c.pid.is_some(), "{c:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(value(&mut b, &ctx, "big == list(range(5_000_000))"), "True");
    assert_eq!(
        value(&mut b, &ctx, "(len(blob), blob[-1], sum(blob))"),
        "(52428800, 7, 7)"
    );
    assert_eq!(value(&mut b, &ctx, "scale([1, 2])"), "[3, 6]");
    assert_eq!(
        value(
            &mut b,
            &ctx,
            "(type(acct) is Account, acct.owner, acct.deposit(5), Account('bo', 1).deposit(1))"
        ),
        "(True, 'ada', 15, 2)"
    );
    assert_eq!(value(&mut b, &ctx, "double(21)"), "42");
    assert_eq!(value(&mut b, &ctx, "j.dumps({'a': 1})"), "'{\"a\": 1}'");
    assert_eq!(value(&mut b, &ctx, "'log' in globals()"), "False");
    // A context made later does not take the restored one's id.
    let next = create(&mut b, Language::Python);
    assert_ne!(next, ctx);
}

#[test]
fn node_state_moves_to_a_new_agent() {
    let store = tempfile::tempdir().unwrap();
    let state = store.path().join("node.state");
    let mut a = Agent::start();
    let ctx = create(&mut a, Language::Node);
    let setup = run(
        &mut a,
        &ctx,
        r#"
const count = 3, ratio = 0.25;
let cfg = {name: 'x', tags: ['a', 'b'], nested: {on: true}};
const seen = new Map([['a', 1], ['b', 2]]);
const started = new Date(Date.UTC(2024, 0, 2));
function greet(who) { return `hello ${who} x${count}`; }
class Counter {
  constructor(n) { this.n = n; }
  bump() { return ++this.n; }
}
const c = new Counter(41);
const handlers = {onClick() {}};
"#,
    );
    assert_eq!(setup.status, Some(CodeStatus::Ok), "{setup:?}");
    let (saved, skipped, bytes) = dump(&mut a, &ctx, &state);
    for name in [
        "count", "ratio", "cfg", "seen", "started", "greet", "Counter", "c",
    ] {
        assert!(saved.iter().any(|s| s == name), "{name} not in {saved:?}");
    }
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].0, "handlers");
    assert!(skipped[0].2.contains("could not be cloned"), "{skipped:?}");
    assert_eq!(bytes, std::fs::metadata(&state).unwrap().len());
    drop(a);

    let mut b = Agent::start();
    let mut restored = load(&mut b, &ctx, Language::Node, &state);
    let mut expected = saved.clone();
    restored.sort();
    expected.sort();
    assert_eq!(restored, expected);
    assert_eq!(value(&mut b, &ctx, "count + ratio"), "3.25");
    assert_eq!(
        value(&mut b, &ctx, "JSON.stringify(cfg)"),
        r#"'{"name":"x","tags":["a","b"],"nested":{"on":true}}'"#
    );
    assert_eq!(
        value(
            &mut b,
            &ctx,
            "seen instanceof Map && [...seen.entries()].join(';')"
        ),
        "'a,1;b,2'"
    );
    assert_eq!(
        value(
            &mut b,
            &ctx,
            "started instanceof Date && started.toISOString()"
        ),
        "'2024-01-02T00:00:00.000Z'"
    );
    assert_eq!(value(&mut b, &ctx, "greet('ada')"), "'hello ada x3'");
    assert_eq!(
        value(&mut b, &ctx, "c instanceof Counter && c.bump()"),
        "42"
    );
    assert_eq!(value(&mut b, &ctx, "new Counter(1).bump()"), "2");
}

#[test]
fn state_requests_fail_clearly() {
    let store = tempfile::tempdir().unwrap();
    let path = store.path().join("s.state");
    let mut a = Agent::start();
    // Unknown context: nothing is made for a dump, not even a language's default context.
    for context in ["nope", "python"] {
        let msg = expect_code(
            a.call(HostMessage::DumpKernelState {
                context: context.into(),
                path: path.display().to_string(),
            }),
            ErrorCode::NotFound,
        );
        assert!(msg.contains(context), "{msg}");
    }
    // Bash keeps no state a snapshot can carry.
    let bash = create(&mut a, Language::Bash);
    let msg = expect_code(
        a.call(HostMessage::DumpKernelState {
            context: bash.clone(),
            path: path.display().to_string(),
        }),
        ErrorCode::InvalidArgument,
    );
    assert!(msg.contains("not bash"), "{msg}");
    let msg = expect_code(
        a.call(HostMessage::LoadKernelState {
            context: "bash-9".into(),
            language: Language::Bash,
            path: path.display().to_string(),
        }),
        ErrorCode::InvalidArgument,
    );
    assert!(msg.contains("not bash"), "{msg}");
    // A missing file, a relative path: refused before any context is made.
    let msg = expect_code(
        a.call(HostMessage::LoadKernelState {
            context: "python-7".into(),
            language: Language::Python,
            path: path.display().to_string(),
        }),
        ErrorCode::NotFound,
    );
    assert!(msg.contains("s.state"), "{msg}");
    expect_code(
        a.call(HostMessage::LoadKernelState {
            context: "python-7".into(),
            language: Language::Python,
            path: "rel/s.state".into(),
        }),
        ErrorCode::InvalidArgument,
    );
    match a.call(HostMessage::ListContexts) {
        GuestMessage::Contexts { contexts } => {
            assert!(contexts.iter().all(|c| c.id != "python-7"), "{contexts:?}");
        }
        other => panic!("{other:?}"),
    }
    // A state file restored into a context of another language.
    let py = create(&mut a, Language::Python);
    let (saved, _, _) = dump(&mut a, &py, &path);
    assert!(saved.is_empty(), "{saved:?}");
    let msg = expect_code(
        a.call(HostMessage::LoadKernelState {
            context: py.clone(),
            language: Language::Node,
            path: path.display().to_string(),
        }),
        ErrorCode::InvalidArgument,
    );
    assert!(msg.contains("runs python"), "{msg}");
    // A Node kernel handed a Python state file says so.
    let msg = expect_code(
        a.call(HostMessage::LoadKernelState {
            context: "node-5".into(),
            language: Language::Node,
            path: path.display().to_string(),
        }),
        ErrorCode::InvalidArgument,
    );
    assert!(
        msg.contains("cannot read") || msg.contains("not a node state file"),
        "{msg}"
    );
    // ... and the context made for that restore is gone again.
    match a.call(HostMessage::ListContexts) {
        GuestMessage::Contexts { contexts } => {
            assert!(contexts.iter().all(|c| c.id != "node-5"), "{contexts:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_default_context_starts_in_the_configured_working_directory() {
    // The agent's file roots are temporary here: a default context must not assume
    // `/workspace` exists.
    let mut a = Agent::start();
    let cwd = value(&mut a, "python", "import os\nos.getcwd()");
    assert_eq!(cwd, format!("'{}'", a.workspace().display()));
}
