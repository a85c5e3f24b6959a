//! Durable runs: a snapshot of the sandbox at the end of a step (by policy), the
//! conversation kept in the trajectory (each step's new messages, images as files), and the
//! state a resume or a fork starts from, rebuilt from the stored events alone.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use base64::Engine as _;
use sandcell_api::SandboxId;
use sandcell_api::runs::{Budgets, RunMode, RunUsage, SnapshotPolicy, Validate};
use sandcell_llm::{ChatResponse, Image, Message, Part, Usage};
use sandcell_service::{Service, ServiceError};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::event::{ArtifactRef, Event, EventKind, StepSnapshot};
use crate::run::SandboxPlan;

/// Tools whose call changes the sandbox: a step that made one is snapshotted under
/// [`SnapshotPolicy::OnMutation`].
pub const MUTATING_TOOLS: [&str; 6] = [
    "execute_code",
    "execute_terminal",
    "import_files",
    "set_repl_context",
    "clear_repl_context",
    // Repl mode's code blocks.
    crate::repl::REPL_TOOL,
];

/// Where an image's bytes went: `file:<path>` in place of its base64.
const FILE_PREFIX: &str = "file:";

/// Whether a step is snapshotted under `policy`; `mutated`: it called a [`MUTATING_TOOLS`].
pub fn wants_snapshot(policy: SnapshotPolicy, mutated: bool) -> bool {
    match policy {
        SnapshotPolicy::Off => false,
        SnapshotPolicy::EveryStep => true,
        SnapshotPolicy::OnMutation => mutated,
    }
}

/// Takes step `step`'s snapshot of `owner`'s sandbox for run `run_id`.
pub async fn snapshot_step(
    service: &Service,
    owner: &str,
    sandbox: &SandboxId,
    run_id: &str,
    step: u32,
) -> Result<StepSnapshot, ServiceError> {
    let started = Instant::now();
    let tags = BTreeMap::from([
        ("run".to_string(), run_id.to_string()),
        ("step".to_string(), step.to_string()),
    ]);
    let rec = service
        .take_snapshot(
            owner,
            sandbox.as_str(),
            format!("{run_id} step {step}"),
            "the sandbox at the end of an agent run's step".into(),
            tags,
            sandcell_api::snapshots::VolumeCarry::Mount,
        )
        .await?;
    Ok(StepSnapshot {
        snapshot_id: rec.id,
        fidelity: rec.fidelity,
        not_carried: not_carried(&rec.manifest),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

/// What a snapshot's manifest says it does not carry: the fidelity's gaps and each
/// variable left out.
fn not_carried(kept: &Value) -> Vec<String> {
    let manifest = &kept["manifest"];
    let mut out: Vec<String> = manifest["not_carried"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for kernel in manifest["kernels"].as_array().into_iter().flatten() {
        let context = kernel["context"].as_str().unwrap_or("?");
        for skipped in kernel["skipped"].as_array().into_iter().flatten() {
            out.push(format!(
                "variable {} of context {context}: {}",
                skipped["name"].as_str().unwrap_or("?"),
                skipped["reason"].as_str().unwrap_or("not saved")
            ));
        }
    }
    out
}

/// `messages` as the trajectory keeps them: each image written once into `dir` (named by
/// its content) and replaced by a reference to that file.
pub fn externalize(messages: &[Message], dir: &Path) -> Vec<Message> {
    let store = |image: &Image| -> Part {
        let digest = Sha256::digest(image.data.as_bytes());
        let name: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
        let ext = image.media_type.rsplit('/').next().unwrap_or("bin");
        let path = dir.join(format!("img-{name}.{ext}"));
        let written = path.exists()
            || crate::tools::image_bytes(image).is_some_and(|bytes| {
                std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(&path, bytes))
                    .is_ok()
            });
        if written {
            Part::Image(Image {
                media_type: image.media_type.clone(),
                data: format!("{FILE_PREFIX}{}", path.display()),
            })
        } else {
            Part::Text(IMAGE_LOST.into())
        }
    };
    map_images(messages.to_vec(), &store)
}

/// What stands for an image whose file is gone.
const IMAGE_LOST: &str = "[an image was here; its file is gone]";

/// `messages` from the trajectory, images read back from their files.
pub fn internalize(messages: Vec<Message>) -> Vec<Message> {
    let load = |image: &Image| -> Part {
        let Some(path) = image.data.strip_prefix(FILE_PREFIX) else {
            return Part::Image(image.clone());
        };
        match std::fs::read(path) {
            Ok(bytes) => Part::Image(Image {
                media_type: image.media_type.clone(),
                data: base64::engine::general_purpose::STANDARD.encode(bytes),
            }),
            Err(_) => Part::Text(IMAGE_LOST.into()),
        }
    };
    map_images(messages, &load)
}

fn map_images(mut messages: Vec<Message>, f: &dyn Fn(&Image) -> Part) -> Vec<Message> {
    for m in &mut messages {
        for p in &mut m.content {
            match p {
                Part::Image(image) => *p = f(image),
                Part::ToolResult(r) => {
                    for q in &mut r.content {
                        if let Part::Image(image) = q {
                            *q = f(image);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    messages
}

/// The model's answer for a step, as recorded.
#[derive(Debug, Clone)]
pub struct RecordedResponse {
    /// Its call number.
    pub call: u32,
    /// The answer.
    pub response: ChatResponse,
}

/// A run as its stored events leave it: what it was started with, its conversation as of
/// its last committed step, and how far the next step got.
#[derive(Debug, Clone)]
pub struct Rebuilt {
    /// Its task.
    pub task: String,
    /// Its mode.
    pub mode: RunMode,
    /// Its budgets.
    pub budgets: Budgets,
    /// Its validation.
    pub validate: Option<Validate>,
    /// Its sandbox, last recorded.
    pub sandbox_id: Option<String>,
    /// The conversation as of the last committed step (images read back).
    pub messages: Vec<Message>,
    /// The last committed step (0: none).
    pub step: u32,
    /// The newest step snapshot, with its step, at or before [`Self::step`].
    pub snapshot: Option<(u32, StepSnapshot)>,
    /// The run tree's usage at the last commit.
    pub usage: RunUsage,
    /// Model calls answered after the last commit (their usage is spent, not yet in
    /// [`Self::usage`]), with their cost.
    pub spent_after: Vec<(Usage, Option<f64>)>,
    /// The next step's answer, when it was recorded (tools mode: reused, not asked again).
    pub next_response: Option<RecordedResponse>,
    /// Tool calls of the next step that had started.
    pub started_tools: u32,
    /// The highest model call number used.
    pub calls: u32,
    /// Answers checked by validation so far.
    pub attempts: u32,
    /// The last event's number.
    pub seq: u64,
    /// Repl mode: its input kept as a file (none: the task is the input).
    pub input: Option<ArtifactRef>,
    /// Repl mode: the kernel context its code runs in.
    pub kernel: Option<String>,
    /// Repl mode: sub-runs started (`rlm_query` calls).
    pub sub_runs: u32,
}

/// Rebuilds a run from its events (in order, as stored).
pub fn rebuild(events: &[Value]) -> Result<Rebuilt, String> {
    let mut r: Option<Rebuilt> = None;
    let mut side_calls = std::collections::HashSet::new();
    for value in events {
        let event: Event = serde_json::from_value(value.clone())
            .map_err(|e| format!("event {} cannot be read: {e}", value["seq"]))?;
        if let EventKind::RunStarted {
            task,
            mode,
            budgets,
            validate,
            input,
            ..
        } = &event.kind
        {
            if r.is_some() {
                return Err(format!("a second run_started at event {}", event.seq));
            }
            r = Some(Rebuilt {
                task: task.clone(),
                mode: *mode,
                budgets: budgets.clone(),
                validate: validate.clone(),
                sandbox_id: None,
                // A repl run's first message (a description of its input) is in its first
                // step's messages.
                messages: match mode {
                    RunMode::Tools => vec![Message {
                        role: sandcell_llm::Role::User,
                        content: vec![Part::Text(task.clone())],
                    }],
                    RunMode::Repl => Vec::new(),
                },
                step: 0,
                snapshot: None,
                usage: RunUsage::default(),
                spent_after: Vec::new(),
                next_response: None,
                started_tools: 0,
                calls: 0,
                attempts: 0,
                seq: event.seq,
                input: input.clone(),
                kernel: None,
                sub_runs: 0,
            });
            continue;
        }
        let r = r
            .as_mut()
            .ok_or_else(|| format!("event {} comes before run_started", event.seq))?;
        r.seq = event.seq;
        match event.kind {
            EventKind::SandboxReady { sandbox_id, .. } => r.sandbox_id = Some(sandbox_id),
            EventKind::Resumed { sandbox_id, .. } => {
                r.sandbox_id = Some(sandbox_id);
                // What the stop left half done was done again after it.
                r.next_response = None;
                r.started_tools = 0;
            }
            EventKind::LlmRequest {
                call,
                sub_call,
                condense,
                ..
            } => {
                r.calls = r.calls.max(call);
                if sub_call || condense {
                    side_calls.insert(call);
                }
            }
            EventKind::KernelReady { context_id, .. } => r.kernel = Some(context_id),
            EventKind::LlmResponse {
                call,
                text,
                tool_calls,
                finish,
                usage,
                cost_usd,
                latency_ms,
                attempts,
                request_id,
            } => {
                r.spent_after.push((usage, cost_usd));
                // Only the step's own answer is reused; a sub-call's or a summary's is not it.
                if event.step == r.step + 1 && !side_calls.contains(&call) {
                    r.next_response = Some(RecordedResponse {
                        call,
                        response: ChatResponse {
                            text,
                            tool_calls,
                            finish,
                            usage,
                            model: String::new(),
                            request_id,
                            attempts,
                            latency_ms,
                        },
                    });
                }
            }
            EventKind::ToolCall { name, .. } => {
                r.started_tools += 1;
                if name == crate::repl::RLM_QUERY {
                    r.sub_runs += 1;
                }
            }
            EventKind::Condensed {
                summary,
                messages_replaced,
                ..
            } => {
                // The same splice the run made (`run::condense`).
                let end = (1 + messages_replaced).min(r.messages.len());
                r.messages
                    .splice(1..end, [crate::run::summary_message(&summary)]);
            }
            EventKind::Validation { .. } => r.attempts += 1,
            EventKind::Forked { messages, .. } | EventKind::ThreadHistory { messages, .. } => {
                r.messages = internalize(messages);
            }
            EventKind::StepCommitted {
                usage,
                snapshot,
                messages,
            } => {
                r.step = event.step;
                r.usage = usage;
                r.messages.extend(internalize(messages));
                if let Some(s) = snapshot {
                    r.snapshot = Some((event.step, s));
                }
                r.spent_after.clear();
                r.next_response = None;
                r.started_tools = 0;
            }
            _ => {}
        }
    }
    r.ok_or_else(|| "the run has no run_started event".to_string())
}

/// What a tool call that a stop interrupted, with no snapshot to go back to, answers.
pub const UNKNOWN_AFTER_RESTART: &str = "unknown after restart: the process running this run \
stopped while this call was running, and no snapshot of the sandbox from before it exists, so \
it may or may not have taken effect. Check the sandbox before you repeat it.";

/// The sandbox a resumed run goes on in.
#[derive(Debug)]
pub struct Reopened {
    /// The sandbox.
    pub id: SandboxId,
    /// Tool calls of the next step had started and nothing could undo them.
    pub tools_unknown: bool,
    /// It was restored from a step snapshot (a new sandbox).
    pub restored: bool,
}

/// The caller's sandbox `id` when it can still be worked in (running or paused); a resume
/// or a thread falls back on a snapshot otherwise.
pub fn usable_sandbox(
    service: &Service,
    caller: &sandcell_service::Caller,
    id: Option<&str>,
) -> Option<SandboxId> {
    let id = SandboxId::parse(id?).ok()?;
    let info = service.get_sandbox(caller, &id).ok()?;
    (info.state == "running" || info.state == "paused").then_some(id)
}

/// Finds the sandbox a resumed run goes on in and records the `resumed` event: the run's
/// own when it is still there and nothing of the next step had touched it; else a new one
/// restored from the last step snapshot (tool calls that had started then run again, once);
/// else, without a snapshot, the one still there (the started calls' effects unknown) or a
/// new one from the run's template (earlier effects lost, said so).
pub async fn reopen(
    service: &Service,
    caller: &sandcell_service::Caller,
    plan: &SandboxPlan,
    r: &Rebuilt,
) -> Result<(Reopened, EventKind), ServiceError> {
    let current = usable_sandbox(service, caller, r.sandbox_id.as_deref());
    let mut notes = Vec::new();
    let mut restored_from = None;
    let mut tools_unknown = false;
    let started = r.started_tools > 0;
    let id = match (&current, &r.snapshot, started) {
        (Some(id), _, false) => id.clone(),
        (_, Some((step, snap)), _) => {
            let opts = sandcell_engine::fleet::CreateOptions::default();
            let made = service
                .restore_snapshot(caller, &snap.snapshot_id, &opts, &[])
                .await?;
            let id = SandboxId::parse(made.sandbox.id)?;
            notes.push(format!(
                "the sandbox was restored from step {step}'s snapshot ({} fidelity)",
                snap.fidelity
            ));
            notes.extend(snap.not_carried.iter().map(|n| format!("not carried: {n}")));
            // The one the stop left behind goes when the run made it; a sandbox the caller
            // gave is theirs and stays.
            if let (Some(old), SandboxPlan::Create { .. }) = (&current, plan) {
                let _ = service.delete_sandbox(caller, old).await;
            }
            restored_from = Some(snap.snapshot_id.clone());
            id
        }
        (Some(id), None, true) => {
            tools_unknown = true;
            notes.push(
                "tool calls of the next step had started and no snapshot exists to go back to: \
                 their effect is unknown"
                    .into(),
            );
            id.clone()
        }
        (None, None, _) => {
            let (id, _) = crate::run::open_sandbox(service, caller, plan).await?;
            if r.step > 0 {
                notes.push(
                    "the run's sandbox was gone and no step snapshot exists: a new sandbox was \
                     made; what earlier steps did to the old one is lost"
                        .into(),
                );
            }
            id
        }
    };
    let restored = restored_from.is_some();
    let event = EventKind::Resumed {
        after_step: r.step,
        reused_response: r.next_response.is_some(),
        rerun_tool_calls: if restored_from.is_some() {
            r.started_tools
        } else {
            0
        },
        restored_from,
        sandbox_id: id.to_string(),
        notes,
    };
    Ok((
        Reopened {
            id,
            tools_unknown,
            restored,
        },
        event,
    ))
}

/// Records a resumed run's sandbox and its `resumed` event.
pub fn record_reopened(
    journal: &mut crate::journal::Journal,
    reopened: &Reopened,
    event: EventKind,
) -> Result<(), ServiceError> {
    journal.record.sandbox_id = Some(reopened.id.to_string());
    journal.emit(event, true)?;
    Ok(())
}

/// All of a run's stored events, in order.
pub fn all_events(store: &sandcell_store::Store, run: &str) -> Result<Vec<Value>, ServiceError> {
    Ok(all_event_records(store, run)?
        .into_iter()
        .map(|e| e.event)
        .collect())
}

/// All of a run's stored event records (with their times), in order.
pub fn all_event_records(
    store: &sandcell_store::Store,
    run: &str,
) -> Result<Vec<sandcell_store::RunEventRecord>, ServiceError> {
    let mut out: Vec<sandcell_store::RunEventRecord> = Vec::new();
    loop {
        let after = out.last().map_or(0, |e| e.seq);
        let page = store.run_events(run, after, 1000)?;
        if page.is_empty() {
            return Ok(out);
        }
        out.extend(page);
    }
}

/// How long a run has run, as its events show: from its start, and from each resume, to the
/// last event before the next stop (the time it was stopped does not count against its
/// wall-time budget).
pub fn time_run(events: &[sandcell_store::RunEventRecord]) -> std::time::Duration {
    let mut total = 0i64;
    let mut segment: Option<(i64, i64)> = None;
    for e in events {
        match segment {
            Some((start, last)) if e.kind == "resumed" => {
                total += last - start;
                segment = Some((e.at, e.at));
            }
            Some((start, _)) => segment = Some((start, e.at)),
            None => segment = Some((e.at, e.at)),
        }
    }
    if let Some((start, last)) = segment {
        total += last - start;
    }
    std::time::Duration::from_millis(u64::try_from(total).unwrap_or(0))
}

/// Deletes an ended run's step snapshots but the last one and those in use (a sandbox or a
/// snapshot was made from it). Failures are logged: a snapshot left behind costs disk, not
/// correctness.
pub async fn prune(service: &Service, caller: &sandcell_service::Caller, run: &str) {
    let events = match all_events(&service.store, run) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(run, error = %e, "a run's step snapshots were not pruned");
            return;
        }
    };
    let mut ids: Vec<String> = events
        .iter()
        .filter(|e| e["type"] == "step_committed")
        .filter_map(|e| e["snapshot"]["snapshot_id"].as_str().map(str::to_string))
        .collect();
    // The last is kept: the run's end state, for a fork or a thread to go on from.
    ids.pop();
    for id in ids {
        let in_use = service
            .store
            .sandboxes_from_snapshot(&id)
            .map_or(true, |s| !s.is_empty());
        if in_use {
            continue;
        }
        if let Err(e) = service.delete_snapshot(caller, &id) {
            tracing::debug!(run, snapshot = %id, error = %e, "a step snapshot was kept");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_says_which_steps_are_snapshotted() {
        assert!(wants_snapshot(SnapshotPolicy::OnMutation, true));
        assert!(!wants_snapshot(SnapshotPolicy::OnMutation, false));
        assert!(wants_snapshot(SnapshotPolicy::EveryStep, false));
        assert!(!wants_snapshot(SnapshotPolicy::Off, true));
        assert!(MUTATING_TOOLS.contains(&"execute_code"));
        assert!(!MUTATING_TOOLS.contains(&"get_repl_context"));
    }

    #[test]
    fn images_go_to_files_once_and_come_back_whole() {
        let dir = tempfile::tempdir().expect("dir");
        let image = Image {
            media_type: "image/png".into(),
            data: base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake"),
        };
        let messages = vec![Message {
            role: sandcell_llm::Role::User,
            content: vec![
                Part::Text("see".into()),
                Part::Image(image.clone()),
                Part::Image(image.clone()),
            ],
        }];
        let stored = externalize(&messages, dir.path());
        let files: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert_eq!(files.len(), 1, "one file for the same image");
        let json = serde_json::to_string(&stored).expect("json");
        assert!(!json.contains(&image.data), "{json}");
        let back = internalize(serde_json::from_str(&json).expect("parse"));
        assert_eq!(back, messages);
    }

    #[test]
    fn what_a_snapshot_does_not_carry_is_named() {
        let kept = serde_json::json!({"manifest": {
            "not_carried": ["running processes"],
            "kernels": [{"context": "python", "skipped": [{"name": "sock", "reason": "a socket"}]}],
        }});
        assert_eq!(
            not_carried(&kept),
            vec![
                "running processes".to_string(),
                "variable sock of context python: a socket".to_string()
            ]
        );
    }

    /// An event as stored, numbered in order.
    fn stored(events: Vec<(u32, EventKind)>) -> Vec<Value> {
        events
            .into_iter()
            .enumerate()
            .map(|(i, (step, kind))| {
                serde_json::to_value(Event {
                    v: 1,
                    run_id: "run-1".into(),
                    root_run_id: "run-1".into(),
                    seq: i as u64 + 1,
                    ts: String::new(),
                    step,
                    depth: 0,
                    kind,
                })
                .expect("event")
            })
            .collect()
    }

    fn request(call: u32, sub_call: bool, condense: bool) -> EventKind {
        EventKind::LlmRequest {
            call,
            model: "openai/m".into(),
            messages: 1,
            tools: Vec::new(),
            max_tokens: 10,
            prompt_estimate: 1,
            sub_call,
            condense,
        }
    }

    fn response(call: u32, text: &str) -> EventKind {
        EventKind::LlmResponse {
            call,
            text: text.into(),
            tool_calls: Vec::new(),
            finish: sandcell_llm::FinishReason::Stop,
            usage: Usage::default(),
            cost_usd: None,
            latency_ms: 1,
            attempts: 1,
            request_id: None,
        }
    }

    #[test]
    fn a_repl_run_is_rebuilt_with_its_input_kernel_and_the_steps_own_answer() {
        let budgets: Budgets = serde_json::from_value(serde_json::json!({
            "max_iterations": 5, "max_depth": 1, "max_sub_calls": 5, "token_budget": null,
            "cost_limit_usd": 1.0, "timeout_secs": 60.0, "cell_timeout_secs": 10.0,
            "max_output_tokens": 100
        }))
        .expect("budgets");
        let input = ArtifactRef {
            media_type: "text/plain".into(),
            path: "/tmp/input.txt".into(),
            bytes: 3,
        };
        let events = stored(vec![
            (
                0,
                EventKind::RunStarted {
                    task: "t".into(),
                    mode: RunMode::Repl,
                    model: "openai/m".into(),
                    budgets,
                    parent_run_id: None,
                    validate: None,
                    forked_from: None,
                    input: Some(input.clone()),
                },
            ),
            (
                0,
                EventKind::KernelReady {
                    context_id: "ctx-1".into(),
                    fresh: true,
                },
            ),
            (1, request(1, false, false)),
            (1, response(1, "step one")),
            (
                1,
                EventKind::StepCommitted {
                    usage: RunUsage::default(),
                    snapshot: None,
                    messages: vec![Message::user("the input is …"), Message::user("out")],
                },
            ),
            // Step 2: a summary first, then the step's answer, then its code's sub-call.
            (2, request(2, false, true)),
            (2, response(2, "a summary")),
            (2, request(3, false, false)),
            (2, response(3, "```python\nllm_query('q')\n```")),
            (
                2,
                EventKind::ToolCall {
                    call_id: "step2-block1".into(),
                    name: crate::repl::REPL_TOOL.into(),
                    arguments: Value::Null,
                },
            ),
            (2, request(4, true, false)),
            (2, response(4, "a sub-call's answer")),
        ]);
        let r = rebuild(&events).expect("rebuilt");
        assert_eq!(r.mode, RunMode::Repl);
        assert_eq!(r.input, Some(input));
        assert_eq!(r.kernel.as_deref(), Some("ctx-1"));
        // The first message comes from step 1's messages, not from the task.
        assert_eq!(r.messages.len(), 2);
        assert_eq!(r.step, 1);
        assert_eq!(r.calls, 4);
        assert_eq!(r.started_tools, 1);
        let next = r.next_response.expect("step 2's answer");
        assert_eq!(
            (next.call, next.response.text.as_str()),
            (3, "```python\nllm_query('q')\n```")
        );
        // All three answers after the commit were paid for.
        assert_eq!(r.spent_after.len(), 3);
        // Stopped after the summary: the step's own answer is not recorded yet.
        let r = rebuild(&events[..7]).expect("rebuilt");
        assert!(r.next_response.is_none(), "{:?}", r.next_response);
        assert_eq!(r.spent_after.len(), 1);
    }

    #[test]
    fn the_time_a_run_ran_leaves_out_the_time_it_was_stopped() {
        let at = |seq: u64, at: i64, kind: &str| sandcell_store::RunEventRecord {
            run_id: "run-1".into(),
            seq,
            at,
            kind: kind.into(),
            event: Value::Null,
        };
        let events = [
            at(1, 1_000, "run_started"),
            at(2, 4_000, "llm_request"),
            // Stopped for 100 s.
            at(3, 104_000, "resumed"),
            at(4, 106_000, "step_committed"),
        ];
        assert_eq!(time_run(&events), std::time::Duration::from_millis(5_000));
        assert_eq!(time_run(&[]), std::time::Duration::ZERO);
    }
}
