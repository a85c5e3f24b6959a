//! `Attach` and `Detach`: replaying and following a tracked process's output (and then its
//! exit) on a request, from the offsets the host asks for.

use std::sync::Arc;

use sandcell_protocol::{Channel, GuestMessage, WireError, encode_data};

use crate::process::OUTPUT_CHUNK;
use crate::shared::Shared;
use crate::sync::lock;

/// Where an attachment is in each stream.
struct Cursor {
    next: [u64; 2],
    lost: [bool; 2],
}

/// Serves `Attach`: replays and follows `pid`'s output on request `id`, then its exit.
pub(crate) async fn attach(
    shared: &Arc<Shared>,
    id: u32,
    pid: i32,
    from: [Option<u64>; 2],
) -> Result<(), WireError> {
    let proc = shared.processes.find(pid)?;
    let mut rx = proc.subscribe();
    let next = {
        let st = proc.state();
        let at = |i: usize| {
            let ring = &st.rings[i];
            from[i].unwrap_or(ring.start()).min(ring.total())
        };
        [at(0), at(1)]
    };
    let attached = GuestMessage::Attached {
        pid,
        stdout_offset: next[0],
        stderr_offset: next[1],
        timeout_ms: proc.timeout_ms,
    };
    shared.out.msg(id, &attached).await;
    let sh = shared.clone();
    let task = tokio::spawn(async move {
        let mut cursor = Cursor {
            next,
            lost: [false; 2],
        };
        let mut seq = 0u64;
        loop {
            rx.borrow_and_update();
            let (slices, exit) = {
                let st = proc.state();
                let slices = [0, 1].map(|i| st.rings[i].read(cursor.next[i], OUTPUT_CHUNK));
                let idle = slices.iter().all(|s| s.lost == 0 && s.bytes.is_empty());
                (slices, if idle { st.exit.clone() } else { None })
            };
            let mut sent = false;
            for (i, slice) in slices.into_iter().enumerate() {
                let channel = if i == 0 {
                    Channel::Stdout
                } else {
                    Channel::Stderr
                };
                if slice.lost > 0 {
                    cursor.lost[i] = true;
                    let lost = GuestMessage::OutputLost {
                        channel,
                        offset: cursor.next[i],
                        bytes: slice.lost,
                    };
                    sh.out.msg(id, &lost).await;
                    sent = true;
                }
                cursor.next[i] = slice.at + slice.bytes.len() as u64;
                if !slice.bytes.is_empty() {
                    sh.out
                        .frame(encode_data(id, channel, seq, &slice.bytes))
                        .await;
                    seq += 1;
                    sent = true;
                }
            }
            if sent {
                continue;
            }
            if let Some(mut exit) = exit {
                // A `Detach` that got here first has taken the id over: send nothing more.
                if lock(&sh.tables).attachments.remove(&id).is_none() {
                    return;
                }
                exit.stdout_truncated = cursor.lost[0];
                exit.stderr_truncated = cursor.lost[1];
                sh.out.msg(id, &GuestMessage::ExecExited(exit)).await;
                return;
            }
            // The sender lives in `proc`, which this task holds: this only waits.
            let _ = rx.changed().await;
        }
    });
    // The task cannot run before this (one thread, no await in between): the entry is there
    // before it looks for it.
    lock(&shared.tables)
        .attachments
        .insert(id, task.abort_handle());
    Ok(())
}

/// Serves `Detach` on request `id`: ends its attachment. False when there is none.
pub(crate) fn detach(shared: &Shared, id: u32) -> bool {
    match lock(&shared.tables).attachments.remove(&id) {
        Some(task) => {
            // Single-threaded: the task is parked at an await and is never polled again, so
            // nothing of it follows the `Detached` reply.
            task.abort();
            true
        }
        None => false,
    }
}
