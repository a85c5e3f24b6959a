//! The step snapshot: `sandcell_agent::durable::snapshot_step` (the call a run makes at the
//! end of a step, i.e. `Service::take_snapshot`) of a Python sandbox whose kernel holds
//! ~5 MB, on an embedded service in this process (a daemon runs the same code). The
//! snapshots are checked by restoring the last into a new sandbox and reading the state
//! back. Interleaved with them, the engine's own snapshot of the same sandbox
//! (`Sandbox::snapshot_to_timed`), part by part: where the time goes. Beside it, for scale,
//! what an agent would do itself in the same sandbox: one cell
//! that pickles the variables and tars the working folders, each file `fsync`ed (a step
//! snapshot is durable before it is recorded).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sandcell_api::SandboxId;
use sandcell_api::code::{CodeInput, CodeResult};
use sandcell_api::sandboxes::CreateSandbox;
use sandcell_engine::Engine;
use sandcell_service::{Caller, Service};
use serde_json::json;

use super::super::stats::quantile;
use super::fork::BIG_STATE;
use super::{Row, Section, median_ms};

/// The kernel's state: ~5 MB pickled (a list of 96,000 strings), a few small variables, a
/// function, a module, and a file of the list's first rows in the workspace.
fn state_code() -> String {
    format!(
        "{BIG_STATE}\n\
         import json, os\n\
         meta = {{'rows': len(data), 'source': 'bench', 'tags': ['a', 'b']}}\n\
         n = 42\n\
         def total(k):\n    return n * k\n\
         os.makedirs('/workspace/out', exist_ok=True)\n\
         with open('/workspace/out/rows.csv', 'w') as fh:\n    fh.write('\\n'.join(data[:2000]))\n\
         del fh\n"
    )
}

/// What the restored kernel must print: the state read back.
const CHECK: &str = "print(len(data), data[-1], meta['rows'], n, total(2))";

/// What an agent would do itself to keep a step: pickle the variables, tar the working
/// folders, `fsync` both; prints the files' sizes and each part's time.
const BY_HAND: &str = r#"
import os, pickle, tarfile, time
t0 = time.perf_counter()
with open('/tmp/bench-state.pkl', 'wb') as f:
    pickle.dump({'data': data, 'meta': meta, 'n': n}, f, protocol=pickle.HIGHEST_PROTOCOL)
    f.flush()
    os.fsync(f.fileno())
t1 = time.perf_counter()
with open('/tmp/bench-files.tar', 'wb') as f:
    with tarfile.open(fileobj=f, mode='w') as t:
        for d in ('/workspace', '/home/sandbox'):
            if os.path.exists(d):
                t.add(d)
    f.flush()
    os.fsync(f.fileno())
t2 = time.perf_counter()
print(os.path.getsize('/tmp/bench-state.pkl'), os.path.getsize('/tmp/bench-files.tar'), (t1 - t0) * 1e3, (t2 - t1) * 1e3)
os.remove('/tmp/bench-state.pkl')
os.remove('/tmp/bench-files.tar')
"#;

/// Runs the scenario on an embedded service over `engine`, its home under `dir`.
pub(super) async fn step_snapshot(
    engine: Engine,
    samples: usize,
    dir: &Path,
) -> anyhow::Result<Section> {
    let home = dir.join("embedded");
    std::fs::create_dir_all(&home).with_context(|| format!("create {}", home.display()))?;
    let (config, _) = sandcell_server::config::load(&home, None, &[], &[])?;
    let embedded = sandcell_server::embedded(config, engine)
        .await
        .context("start the embedded service")?;
    let out = async {
        let caller = embedded
            .admin_caller()?
            .context("the embedded service's admin key")?;
        measure(&embedded.service(), &caller, samples, &home).await
    }
    .await;
    embedded.shutdown().await;
    out
}

fn code(text: &str) -> anyhow::Result<CodeInput> {
    Ok(CodeInput {
        code: sandcell_api::Code::new(text)?,
        ..CodeInput::default()
    })
}

/// Runs `text` in `sandbox`, which must end `ok`.
async fn run_ok(
    service: &Service,
    caller: &Caller,
    sandbox: &SandboxId,
    text: &str,
) -> anyhow::Result<CodeResult> {
    let out = service.run_code(caller, sandbox, code(text)?).await?;
    if out.done.status != "ok" {
        bail!(
            "the bench's code failed: {}\n{}",
            json!(out.done),
            out.stderr
        );
    }
    Ok(out)
}

/// A python sandbox with `code` run in it.
async fn python_with(service: &Service, caller: &Caller, code: &str) -> anyhow::Result<SandboxId> {
    let info = service
        .create_sandbox(
            caller,
            CreateSandbox {
                template: Some("python".into()),
                ..CreateSandbox::default()
            },
        )
        .await?;
    let sandbox = SandboxId::parse(info.id)?;
    run_ok(service, caller, &sandbox, code).await?;
    Ok(sandbox)
}

/// The step snapshots of one sandbox, as a run takes them; each snapshot is deleted after
/// the next is taken, as a run's are pruned at its end.
#[derive(Default)]
struct Series {
    taken: Vec<Duration>,
    /// What `step_committed.snapshot.duration_ms` would say.
    reported: Vec<Duration>,
    sizes: Vec<u64>,
    last: Option<sandcell_agent::event::StepSnapshot>,
}

impl Series {
    /// Takes one; `counted`: its figures are kept (not a warm-up).
    async fn take(
        &mut self,
        service: &Service,
        caller: &Caller,
        sandbox: &SandboxId,
        step: usize,
        counted: bool,
    ) -> anyhow::Result<()> {
        let t = Instant::now();
        let snap = sandcell_agent::durable::snapshot_step(
            service,
            &caller.owner,
            sandbox,
            "bench",
            u32::try_from(step + 1).unwrap_or(u32::MAX),
        )
        .await?;
        let elapsed = t.elapsed();
        let size = service.get_snapshot(caller, &snap.snapshot_id)?.size;
        if let Some(old) = self.last.replace(snap.clone()) {
            service.delete_snapshot(caller, &old.snapshot_id)?;
        }
        if counted {
            self.taken.push(elapsed);
            self.reported.push(Duration::from_millis(snap.duration_ms));
            self.sizes.push(size);
        }
        Ok(())
    }

    fn median_ms(&self) -> f64 {
        quantile(&self.taken, 0.5)
    }

    fn median_size(&self) -> u64 {
        let mut v = self.sizes.clone();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }
}

/// Where a snapshot's time goes: the engine's own snapshot of the same sandbox
/// (`Sandbox::snapshot_to_timed`, what `Service::take_snapshot` calls before it writes the
/// manifest and inserts the record), part by part.
#[derive(Default)]
struct Phases {
    total: Vec<Duration>,
    dump: Vec<Duration>,
    pause: Vec<Duration>,
    archive: Vec<Duration>,
    resume: Vec<Duration>,
    cleanup: Vec<Duration>,
    sync: Vec<Duration>,
    sync_wait: Vec<Duration>,
}

impl Phases {
    /// Takes one into a folder under `dir`, removed after; `counted`: its figures are kept.
    async fn take(
        &mut self,
        service: &Service,
        caller: &Caller,
        sandbox: &SandboxId,
        dir: &Path,
        counted: bool,
    ) -> anyhow::Result<()> {
        let engine_sandbox = service
            .fleet
            .sandbox_as_is(&caller.owner, sandbox.as_str())?;
        let into = dir.join("phases");
        std::fs::create_dir_all(&into).with_context(|| format!("create {}", into.display()))?;
        let taken = engine_sandbox.snapshot_to_timed(&into).await;
        let _ = std::fs::remove_dir_all(&into);
        let (_, t) = taken?;
        if counted {
            self.total.push(t.total);
            self.dump.push(t.dump);
            self.pause.push(t.pause);
            self.archive.push(t.archive);
            self.resume.push(t.resume);
            self.cleanup.push(t.cleanup);
            self.sync.push(t.sync);
            self.sync_wait.push(t.sync_wait);
        }
        Ok(())
    }

    fn rows(self, s: &mut Section) {
        let rows: [(&'static str, &str, Vec<Duration>); 8] = [
            (
                "phase_engine_total",
                "  of which the engine's part (Sandbox::snapshot_to)",
                self.total,
            ),
            (
                "phase_dump",
                "    the kernel writes its state (DumpKernelState)",
                self.dump,
            ),
            ("phase_pause", "    pause (freeze)", self.pause),
            (
                "phase_archive",
                "    folders archived and hashed (written, not durable)",
                self.archive,
            ),
            ("phase_resume", "    resume (thaw)", self.resume),
            (
                "phase_cleanup",
                "    the state files removed in the sandbox",
                self.cleanup,
            ),
            (
                "phase_sync",
                "    made durable (overlaps resume and removal)",
                self.sync,
            ),
            (
                "phase_sync_wait",
                "    of which waited for after them",
                self.sync_wait,
            ),
        ];
        for (key, name, samples) in rows {
            s.row(Row::new(key, name, samples));
        }
    }
}

async fn measure(
    service: &Service,
    caller: &Caller,
    samples: usize,
    dir: &Path,
) -> anyhow::Result<Section> {
    let sandbox = python_with(service, caller, &state_code()).await?;
    let expected = run_ok(service, caller, &sandbox, CHECK).await?.stdout;
    // Where the time goes: the same snapshot of a kernel holding nothing, and of one
    // holding 5 MB in one bytes object (which pickles at memory speed).
    let empty = python_with(service, caller, "pass").await?;
    let bytes = python_with(service, caller, "blob = bytes(range(256)) * (5 * 4096)").await?;

    // Interleaved, so that the three see the same machine; one round first, to warm up.
    let (mut main, mut of_empty, mut of_bytes) =
        (Series::default(), Series::default(), Series::default());
    let mut phases = Phases::default();
    for step in 0..=samples {
        main.take(service, caller, &sandbox, step, step > 0).await?;
        phases
            .take(service, caller, &sandbox, dir, step > 0)
            .await?;
        of_empty
            .take(service, caller, &empty, step, step > 0)
            .await?;
        of_bytes
            .take(service, caller, &bytes, step, step > 0)
            .await?;
    }
    for (series, id) in [(&mut of_empty, &empty), (&mut of_bytes, &bytes)] {
        if let Some(last) = series.last.take() {
            service.delete_snapshot(caller, &last.snapshot_id)?;
        }
        service.delete_sandbox(caller, id).await?;
    }
    let median_size = main.median_size();
    let (empty_size, bytes_size) = (of_empty.median_size(), of_bytes.median_size());
    let last = main.last.take().context("no snapshot was taken")?;

    // Fidelity: the last snapshot restored into a new sandbox holds the same state.
    let t = Instant::now();
    let restored = service
        .create_sandbox(
            caller,
            CreateSandbox {
                snapshot_id: Some(last.snapshot_id.clone()),
                ..CreateSandbox::default()
            },
        )
        .await?;
    let restored = SandboxId::parse(restored.id)?;
    let read_back = run_ok(service, caller, &restored, CHECK).await?.stdout;
    let restore_time = t.elapsed();
    if read_back != expected {
        bail!(
            "the restored kernel's state differs: {:.80} instead of {:.80}",
            read_back,
            expected
        );
    }
    service.delete_sandbox(caller, &restored).await?;
    service.delete_snapshot(caller, &last.snapshot_id)?;

    // By hand, in the same kernel, for scale.
    let mut by_hand = Vec::new();
    let mut parts: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut hand_sizes = (0, 0);
    for i in 0..=samples {
        let t = Instant::now();
        let out = run_ok(service, caller, &sandbox, BY_HAND).await?;
        let elapsed = t.elapsed();
        let fields: Vec<f64> = out
            .stdout
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        let [pickle_bytes, tar_bytes, pickle_ms, tar_ms] = fields[..] else {
            bail!("the pickle + tar cell printed {:?}", out.stdout);
        };
        if i > 0 {
            by_hand.push(elapsed);
            parts.entry("pickle_ms").or_default().push(pickle_ms);
            parts.entry("tar_ms").or_default().push(tar_ms);
            hand_sizes = (pickle_bytes as u64, tar_bytes as u64);
        }
    }
    service.delete_sandbox(caller, &sandbox).await?;

    let service_part = main.median_ms() - quantile(&phases.total, 0.5);
    let mut s = Section::new(
        "step_snapshot",
        "step snapshot of a python sandbox holding ~5 MB (snapshot_step, in process)",
    );
    s.row(
        Row::new(
            "step_snapshot_5mb",
            "step snapshot (durable::snapshot_step)",
            main.taken,
        )
        .target(40.0),
    );
    s.row(Row::new(
        "step_snapshot_5mb_recorded",
        "  the same, as recorded in step_committed (duration_ms)",
        main.reported,
    ));
    phases.rows(&mut s);
    s.row(Row::new(
        "step_snapshot_empty",
        format!(
            "  for scale: a kernel holding nothing ({} KB)",
            empty_size >> 10
        ),
        of_empty.taken,
    ));
    s.row(Row::new(
        "step_snapshot_bytes_5mb",
        format!(
            "  for scale: 5 MB in one bytes object ({} KB)",
            bytes_size >> 10
        ),
        of_bytes.taken,
    ));
    s.row(Row::new(
        "pickle_and_tar",
        "by hand in the kernel: pickle vars + tar folders, fsynced",
        by_hand,
    ));
    s.fact(
        "snapshot",
        json!({
            "bytes_median": median_size,
            "fidelity": last.fidelity,
            "not_carried": last.not_carried,
            "restored_state_matches": true,
            "manifest_and_record_ms": service_part,
            "restore_to_first_result_ms": restore_time.as_secs_f64() * 1e3,
        }),
    );
    s.fact(
        "by_hand",
        json!({
            "pickle_bytes": hand_sizes.0,
            "tar_bytes": hand_sizes.1,
            "pickle_median_ms": median_ms(parts.get("pickle_ms").map_or(&[][..], Vec::as_slice)),
            "tar_median_ms": median_ms(parts.get("tar_ms").map_or(&[][..], Vec::as_slice)),
        }),
    );
    Ok(s)
}
