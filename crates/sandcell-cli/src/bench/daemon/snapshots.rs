//! Snapshot, restore and fork of a Python sandbox holding state, over HTTP.

use std::time::{Duration, Instant};

use sandcell_api::sandboxes::CreateSandbox;
use sandcell_api::snapshots::{CreateSnapshot, ForkSnapshot};

use super::requests::{python, python_sandbox};
use super::row::Row;
use super::server::Daemon;

/// Snapshot and restore (`POST /v1/sandboxes` with `snapshot_id`, until the restored
/// kernel answers) of a Python sandbox on `backend` holding ~5 MB and ~100 MB of state, and
/// one fork of 10 sandboxes (its wall time is one sample); the sizes the API gives for the
/// snapshots (`size`: what they take on disk) go in the row names.
pub(super) async fn snapshots(
    d: &Daemon,
    backend: &str,
    checkpointable: bool,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    // Rows of checkpointable sandboxes are told apart by their backend label.
    let label_backend = if checkpointable {
        format!("{backend}-criu")
    } else {
        backend.to_string()
    };
    let backend_label = label_backend.as_str();
    for (label, mb) in [("5 MB", 5), ("100 MB", 100)] {
        let body = python_sandbox(
            &[("SANDCELL_BENCH", "snapshot")],
            Some(backend),
            checkpointable,
        );
        let id = d.create(&body).await?;
        let code = format!(
            "state = bytearray({mb} * 2**20)\nfor i in range(0, len(state), 4096): state[i] = i % 251"
        );
        d.code_ok(&id, &python(&code)).await?;
        let mut snap_samples = Vec::new();
        let mut restore_samples = Vec::new();
        let mut size = 0;
        let mut last = String::new();
        for _ in 0..runs {
            let t = Instant::now();
            let v = d
                .api
                .create_snapshot(&id, &CreateSnapshot::default())
                .await?;
            snap_samples.push(t.elapsed());
            size = v.size;
            let snap = v.id;
            let t = Instant::now();
            let restored = d
                .create(&CreateSandbox {
                    snapshot_id: Some(snap.clone()),
                    ..CreateSandbox::default()
                })
                .await?;
            d.code_ok(&restored, &python("len(state)")).await?;
            restore_samples.push(t.elapsed());
            d.delete(&restored).await?;
            if !last.is_empty() {
                d.api.delete_snapshot(&last).await?;
            }
            last = snap;
        }
        let row = |key: &str, what: &str, samples: Vec<Duration>| Row {
            samples,
            ..Row::on(
                backend_label,
                &format!("{key}_{mb}mb"),
                &format!("{what}, python {label}, {} MB on disk", size >> 20),
            )
        };
        let snap_row = row("snapshot", "snapshot", snap_samples);
        let restore_row = row("restore", "restore to first result", restore_samples);
        if mb == 5 {
            // Ten sandboxes from one snapshot in one request.
            let mut fork_row = Row::on(
                backend_label,
                "fork_10",
                "fork of 10 from the 5 MB snapshot, wall time",
            );
            let t = Instant::now();
            let forked = d
                .api
                .fork_snapshot(
                    &last,
                    &ForkSnapshot {
                        count: Some(10),
                        ..ForkSnapshot::default()
                    },
                )
                .await?;
            fork_row.samples.push(t.elapsed());
            for f in &forked.sandboxes {
                d.delete(&f.sandbox.id).await?;
            }
            rows.extend([snap_row, restore_row, fork_row]);
        } else {
            rows.extend([snap_row, restore_row]);
        }
        d.api.delete_snapshot(&last).await?;
        d.delete(&id).await?;
    }
    Ok(rows)
}
