//! Drives a kernel process directly (outside any sandbox) over the protocol in PROTOCOL.md.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandcell_kernels::{CTL_FD_VAR, EVENT_FD_VAR, PROTOCOL_VAR, command, extra_env};
use sandcell_protocol::Language;
use serde_json::{Value, json};

/// Spawns never overlap: a pipe end made inheritable for one kernel must not leak into another.
static SPAWN: Mutex<()> = Mutex::new(());

/// How long a test waits for one event before failing.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Kernel {
    pub child: Child,
    ctl: Option<std::fs::File>,
    events: Receiver<Value>,
    /// Bytes the kernel wrote to its fd 1 / fd 2 (not language-level output).
    pub fd_stdout: Arc<Mutex<Vec<u8>>>,
    pub fd_stderr: Arc<Mutex<Vec<u8>>>,
    next_id: u64,
    pub ready: Value,
}

fn inheritable_pipe() -> (OwnedFd, OwnedFd) {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe")
}

fn make_inheritable(fd: &OwnedFd) {
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).expect("clear cloexec");
}

fn drain_into<R: Read + Send + 'static>(mut r: R, sink: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
}

impl Kernel {
    /// Starts a kernel with extra environment variables.
    pub fn start_with(lang: Language, env: &[(&str, &str)]) -> Kernel {
        let argv = command(lang);
        let guard = SPAWN.lock().unwrap_or_else(|e| e.into_inner());
        let (ctl_read, ctl_write) = inheritable_pipe();
        let (ev_read, ev_write) = inheritable_pipe();
        make_inheritable(&ctl_read);
        make_inheritable(&ev_write);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env(CTL_FD_VAR, ctl_read.as_raw_fd().to_string())
            .env(EVENT_FD_VAR, ev_write.as_raw_fd().to_string())
            .env(PROTOCOL_VAR, "1")
            .env(
                "SANDCELL_OUTPUTS_DIR",
                std::env::temp_dir().join("sandcell-kernel-test-outputs"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in extra_env(lang) {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn kernel");
        drop(ctl_read);
        drop(ev_write);
        drop(guard);
        let fd_stdout = Arc::new(Mutex::new(Vec::new()));
        let fd_stderr = Arc::new(Mutex::new(Vec::new()));
        drain_into(child.stdout.take().unwrap(), fd_stdout.clone());
        drain_into(child.stderr.take().unwrap(), fd_stderr.clone());
        let (tx, rx) = channel();
        let ev = std::fs::File::from(ev_read);
        std::thread::spawn(move || {
            for line in BufReader::new(ev).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).unwrap_or_else(
                    |e| json!({"type": "unparsable", "line": line, "error": e.to_string()}),
                );
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let mut k = Kernel {
            child,
            ctl: Some(std::fs::File::from(ctl_write)),
            events: rx,
            fd_stdout,
            fd_stderr,
            next_id: 1,
            ready: Value::Null,
        };
        let ready = k.next_event();
        assert_eq!(
            ready["type"],
            "ready",
            "first event: {ready}; stderr: {}",
            k.stderr_text()
        );
        k.ready = ready;
        k
    }

    pub fn start(lang: Language) -> Kernel {
        Self::start_with(lang, &[])
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.fd_stderr.lock().unwrap()).into_owned()
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.fd_stdout.lock().unwrap()).into_owned()
    }

    pub fn next_event(&mut self) -> Value {
        match self.events.recv_timeout(EVENT_TIMEOUT) {
            Ok(v) => v,
            Err(e) => panic!(
                "no event within {EVENT_TIMEOUT:?} ({e}); kernel stderr: {}",
                self.stderr_text()
            ),
        }
    }

    /// Sends a request (adds `id`) and returns the id.
    pub fn send(&mut self, mut req: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        req["id"] = json!(id);
        let ctl = self.ctl.as_mut().expect("control pipe open");
        writeln!(ctl, "{req}").expect("write request");
        ctl.flush().expect("flush");
        id
    }

    /// Writes bytes to the control pipe as they are (for malformed requests).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let ctl = self.ctl.as_mut().expect("control pipe open");
        ctl.write_all(bytes).expect("write request");
        ctl.flush().expect("flush");
    }

    /// Runs code and returns every event up to and including `done`.
    pub fn execute(&mut self, code: &str) -> Vec<Value> {
        let id = self.send(json!({"op": "execute", "code": code}));
        self.collect(id)
    }

    /// Events of request `id` up to and including `done`.
    pub fn collect(&mut self, id: u64) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let ev = self.next_event();
            assert_eq!(ev["id"], json!(id), "event for another request: {ev}");
            let done = ev["type"] == "done";
            out.push(ev);
            if done {
                return out;
            }
        }
    }

    /// Sends a non-execute request and returns its reply.
    pub fn call(&mut self, req: Value) -> Value {
        let id = self.send(req);
        let ev = self.next_event();
        assert_eq!(ev["id"], json!(id), "reply for another request: {ev}");
        assert_eq!(ev["type"], "reply", "{ev}");
        ev
    }

    /// SIGINT to the kernel process.
    pub fn interrupt(&self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("sigint");
    }

    /// Closes the control pipe and waits for the kernel to exit.
    pub fn close(mut self) -> std::process::ExitStatus {
        self.ctl = None;
        self.child.wait().expect("wait")
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Concatenated stream text of one name from a list of events.
pub fn stream(events: &[Value], name: &str) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "stream" && e["name"] == name)
        .map(|e| e["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The events of one type.
pub fn of_type<'a>(events: &'a [Value], ty: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == ty).collect()
}

/// The `done` event.
pub fn done(events: &[Value]) -> &Value {
    events
        .last()
        .filter(|e| e["type"] == "done")
        .expect("ends with done")
}

/// The result's text/plain, if any.
pub fn result_text(events: &[Value]) -> Option<String> {
    of_type(events, "result")
        .first()
        .and_then(|r| r["data"]["text/plain"].as_str().map(str::to_string))
}

/// Decodes a base64 image and checks the PNG signature.
pub fn assert_png(b64: &str) {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .expect("image/png is base64");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}
