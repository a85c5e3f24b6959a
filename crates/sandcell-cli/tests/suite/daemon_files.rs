//! The daemon's file and process routes over HTTP: directories, contents both ways (200 MB
//! streamed with matching SHA-256), the upload cap, paths that try to leave the sandbox, and
//! background processes.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use super::daemon::{Daemon, Resp, send, wait_for};

/// The query string `?path=<p>` (percent-encoded), plus `extra`.
fn q(path: &str, extra: &str) -> String {
    let mut s = String::from("?path=");
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-_./~".contains(&b) {
            s.push(char::from(b));
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s.push_str(extra);
    s
}

fn put_bytes(d: &Daemon, id: &str, path: &str, extra: &str, bytes: Vec<u8>) -> Resp {
    send(
        d.req(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files/content{}", q(path, extra)),
        )
        .header("content-type", "application/octet-stream")
        .body(bytes),
    )
}

fn get_bytes(d: &Daemon, id: &str, path: &str) -> (u16, Vec<u8>) {
    let resp = d
        .req(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/content{}", q(path, "")),
        )
        .send()
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().unwrap().to_vec())
}

#[test]
fn daemon_files_mkdir_list_stat_rename_remove_and_contents() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    let files = format!("/v1/sandboxes/{id}/files");

    // mkdir makes the parents too.
    let r = d.post(&format!("{files}/mkdir"), json!({"path": "/workspace/d/e"}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        (r.body["path"].clone(), r.body["is_dir"].clone()),
        (json!("/workspace/d/e"), json!(true))
    );
    // Relative paths are under /workspace.
    let r = d.post(&format!("{files}/mkdir"), json!({"path": "rel"}));
    assert_eq!(r.body["path"], "/workspace/rel", "{}", r.body);

    // Every byte value survives the round trip.
    let all: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let r = put_bytes(&d, &id, "/workspace/d/e/f.bin", "", all.clone());
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["size"], 70_000);
    assert_eq!(r.body["kind"], "file");
    let (status, got) = get_bytes(&d, &id, "/workspace/d/e/f.bin");
    assert_eq!(status, 200);
    assert!(got == all, "the downloaded bytes differ");
    // What the API wrote is what a command in the sandbox reads.
    let out = d.exec(
        &id,
        "od -An -tu1 -N4 -j256 /workspace/d/e/f.bin; wc -c < /workspace/d/e/f.bin",
    );
    assert_eq!(
        out.stdout.as_str().split_whitespace().collect::<Vec<_>>(),
        ["0", "1", "2", "3", "70000"],
        "{out:?}"
    );
    // And the other way round, with a name that needs encoding.
    d.exec(&id, "printf 'from exec' > '/workspace/d/a b&c?.txt'");
    let (status, got) = get_bytes(&d, &id, "/workspace/d/a b&c?.txt");
    assert_eq!((status, got.as_slice()), (200, b"from exec".as_slice()));

    // Upload creates parents, takes a mode, appends.
    let r = put_bytes(
        &d,
        &id,
        "/tmp/x/y/run.sh",
        "&mode=755",
        b"#!/bin/sh\necho ran\n".to_vec(),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        r.body["mode"].as_u64().unwrap() & 0o777,
        0o755,
        "{}",
        r.body
    );
    assert_eq!(d.exec(&id, "/tmp/x/y/run.sh").stdout, "ran\n");
    put_bytes(&d, &id, "/home/sandbox/log.txt", "", b"one\n".to_vec());
    let r = put_bytes(
        &d,
        &id,
        "/home/sandbox/log.txt",
        "&append=true",
        b"two\n".to_vec(),
    );
    assert_eq!(r.body["size"], 8, "{}", r.body);
    assert_eq!(get_bytes(&d, &id, "/home/sandbox/log.txt").1, b"one\ntwo\n");
    // Replacing leaves only the new content.
    put_bytes(&d, &id, "/home/sandbox/log.txt", "", b"3".to_vec());
    assert_eq!(get_bytes(&d, &id, "/home/sandbox/log.txt").1, b"3");

    // List and stat.
    let r = d.get(&format!("{files}{}", q("/workspace/d", "")));
    assert_eq!(r.status, 200, "{}", r.body);
    let entries = r.body["entries"].as_array().unwrap();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a b&c?.txt", "e"], "{}", r.body);
    assert_eq!(entries[1]["is_dir"], true);
    assert_eq!(entries[1]["kind"], "dir");
    assert_eq!(entries[0]["size"], 9);
    // The default directory is /workspace.
    let r = d.get(&files);
    let names: Vec<&str> = r.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["d", "rel"], "{}", r.body);
    let r = d.get(&format!("{files}/stat{}", q("/workspace/d/e/f.bin", "")));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (
            r.body["name"].clone(),
            r.body["size"].clone(),
            r.body["is_dir"].clone()
        ),
        (json!("f.bin"), json!(70_000), json!(false))
    );
    assert!(r.body["mtime"].as_i64().unwrap() > 1_600_000_000);
    d.get(&format!("{files}/stat{}", q("/workspace/nope", "")))
        .expect_error(404, "not_found");
    let (status, _) = get_bytes(&d, &id, "/workspace/nope");
    assert_eq!(status, 404);
    // A directory is not downloadable.
    let r = send(d.req(
        Method::GET,
        &format!("{files}/content{}", q("/workspace/d", "")),
    ));
    assert_eq!(r.status, 400, "{}", r.body);
    r.error_code();

    // Rename: the old path is gone, the new one holds the bytes.
    let r = d.post(
        &format!("{files}/rename"),
        json!({"from": "/workspace/d/e/f.bin", "to": "/workspace/d/g.bin"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["path"], "/workspace/d/g.bin");
    d.get(&format!("{files}/stat{}", q("/workspace/d/e/f.bin", "")))
        .expect_error(404, "not_found");
    assert!(get_bytes(&d, &id, "/workspace/d/g.bin").1 == all);

    // Remove: a file; a non-empty directory only with recursive=true.
    let r = d.delete(&format!("{files}{}", q("/workspace/d/g.bin", "")));
    assert_eq!(r.status, 204, "{}", r.body);
    d.delete(&format!("{files}{}", q("/workspace/d", "")))
        .expect_error(409, "directory_not_empty");
    let r = d.delete(&format!("{files}{}", q("/workspace/d", "&recursive=true")));
    assert_eq!(r.status, 204, "{}", r.body);
    d.get(&format!("{files}/stat{}", q("/workspace/d", "")))
        .expect_error(404, "not_found");
    assert_eq!(d.exec(&id, "ls /workspace").stdout, "rel\n");
    d.delete(&format!("{files}{}", q("/workspace/d", "")))
        .expect_error(404, "not_found");
}

#[test]
fn daemon_files_rename_does_not_replace_an_existing_target() {
    // The API says the target "must not exist" (`Rename.to`): a rename onto an existing file
    // must fail and leave both files as they were.
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    put_bytes(&d, &id, "/workspace/a.txt", "", b"a".to_vec());
    put_bytes(&d, &id, "/workspace/b.txt", "", b"b".to_vec());
    let r = d.post(
        &format!("/v1/sandboxes/{id}/files/rename"),
        json!({"from": "/workspace/a.txt", "to": "/workspace/b.txt"}),
    );
    assert_eq!(
        get_bytes(&d, &id, "/workspace/b.txt").1,
        b"b",
        "b.txt was replaced"
    );
    assert_eq!(
        get_bytes(&d, &id, "/workspace/a.txt").1,
        b"a",
        "a.txt is gone"
    );
    r.expect_error(409, "already_exists");
}

/// SHA-256 by the host's `sha256sum` (the test profile's own hashing would be the slowest
/// part of a 200 MB round trip).
struct HostSha256 {
    child: Child,
}

impl HostSha256 {
    fn new() -> Self {
        Self {
            child: Command::new("sha256sum")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        }
    }

    /// Where to write the bytes (close it to finish).
    fn input(&mut self) -> ChildStdin {
        self.child.stdin.take().unwrap()
    }

    /// The hex digest, once the input is closed.
    fn finish(self) -> String {
        let out = self.child.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()[..64].to_string()
    }
}

/// Size of the pseudo-random block the pattern repeats.
const BLOCK: u64 = 1 << 20;

/// `len` bytes made as they are read: a pseudo-random block, each copy stamped with its
/// index (so a lost, doubled or reordered chunk changes the hash); nothing is kept. What is
/// read is also written to `tee`, closed at the end.
struct Pattern {
    block: Vec<u8>,
    pos: u64,
    len: u64,
    tee: Option<ChildStdin>,
}

impl Pattern {
    fn new(len: u64, seed: u64, tee: Option<ChildStdin>) -> Self {
        let mut state = seed | 1;
        let mut block = Vec::with_capacity(BLOCK as usize);
        while (block.len() as u64) < BLOCK {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            block.extend_from_slice(&state.to_le_bytes());
        }
        Self {
            block,
            pos: 0,
            len,
            tee,
        }
    }
}

impl Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let off = self.pos % BLOCK;
        let n = (buf.len() as u64).min(self.len - self.pos).min(BLOCK - off) as usize;
        let off = off as usize;
        buf[..n].copy_from_slice(&self.block[off..off + n]);
        let stamp = (self.pos / BLOCK).to_le_bytes();
        if off < 8 {
            let end = (off + n).min(8);
            buf[..end - off].copy_from_slice(&stamp[off..end]);
        }
        self.pos += n as u64;
        if let Some(tee) = &mut self.tee {
            tee.write_all(&buf[..n])?;
        }
        if self.pos == self.len {
            self.tee = None;
        }
        Ok(n)
    }
}

#[test]
fn daemon_files_200_mb_up_and_down_with_matching_sha256() {
    const SIZE: u64 = 200 * 1024 * 1024;
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({"size": "medium"}));
    let path = "/workspace/big.bin";

    const SEED: u64 = 0x9E37_79B9_7F4A_7C15;
    // The digest of what is sent, worked out on the side.
    let expected = std::thread::spawn(|| {
        let mut sha = HostSha256::new();
        let mut input = sha.input();
        std::io::copy(&mut Pattern::new(SIZE, SEED, None), &mut input).unwrap();
        drop(input);
        sha.finish()
    });
    let start = Instant::now();
    let r = send(
        d.req(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files/content{}", q(path, "")),
        )
        .header("content-type", "application/octet-stream")
        .body(reqwest::blocking::Body::sized(
            Pattern::new(SIZE, SEED, None),
            SIZE,
        )),
    );
    let up = start.elapsed();
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["size"], SIZE);
    let sent = expected.join().unwrap();

    // The sandbox's own sha256sum sees the same bytes.
    let out = d.exec(&id, &format!("sha256sum {path}"));
    assert_eq!(
        out.stdout.as_str().split_whitespace().next(),
        Some(sent.as_str()),
        "{out:?}"
    );

    // Streamed back down, hashed as it comes.
    let start = Instant::now();
    let mut resp = d
        .req(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/content{}", q(path, "")),
        )
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-length"].to_str().unwrap(),
        SIZE.to_string()
    );
    assert!(
        resp.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains("big.bin")
    );
    // Compared byte for byte with the same pattern made again (so: the same SHA-256).
    let mut want = Pattern::new(SIZE, SEED, None);
    let (mut buf, mut expect) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut total = 0u64;
    loop {
        let n = resp.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        want.read_exact(&mut expect[..n]).unwrap();
        assert!(
            buf[..n] == expect[..n],
            "the download differs near byte {total}"
        );
        total += n as u64;
    }
    let down = start.elapsed();
    assert_eq!(total, SIZE);
    eprintln!("200 MB: upload {up:?}, download {down:?}");

    // A reader that stalls: the daemon holds a few chunks for it, not the file.
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let before = rss(d.pid());
    let mut slow = d
        .req(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/content{}", q(path, "")),
        )
        .send()
        .unwrap();
    slow.read_exact(&mut buf).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let grew = rss(d.pid()).saturating_sub(before);
    assert!(
        grew < 48 << 20,
        "the daemon grew by {} MB for one stalled download",
        grew >> 20
    );
    // Abandoned: the daemon and the sandbox go on serving.
    drop(slow);
    let out = d.exec(&id, &format!("wc -c < {path}"));
    assert_eq!(out.stdout, format!("{SIZE}\n"), "{out:?}");
}

#[test]
fn daemon_files_over_the_upload_cap_is_413_and_leaves_nothing() {
    const CAP: u64 = 1 << 20;
    let d = Daemon::start(&[&format!("limits.max_upload_bytes={CAP}")]);
    let id = d.create_id(json!({}));

    // Exactly the cap is fine.
    let r = put_bytes(
        &d,
        &id,
        "/workspace/at-cap.bin",
        "",
        vec![7u8; CAP as usize],
    );
    assert_eq!(r.status, 201, "{}", r.body);
    // One byte more is not, and nothing of it stays: no file, no temporary file.
    let r = put_bytes(
        &d,
        &id,
        "/workspace/over.bin",
        "",
        vec![1u8; CAP as usize + 1],
    );
    r.expect_error(413, "body_too_large");
    // Much more, streamed: the same.
    let big = Pattern::new(8 * CAP, 1, None);
    let resp = d
        .req(
            Method::PUT,
            &format!(
                "/v1/sandboxes/{id}/files/content{}",
                q("/workspace/sub/over2.bin", "")
            ),
        )
        .header("content-type", "application/octet-stream")
        .body(reqwest::blocking::Body::new(big))
        .send();
    // The daemon may answer before it has read the whole body; a client that is still
    // writing then sees the connection end instead. Either way nothing is written.
    if let Ok(resp) = resp {
        assert_eq!(resp.status(), 413);
    }
    // An upload over the cap leaves an existing file as it was.
    put_bytes(&d, &id, "/workspace/keep.txt", "", b"old".to_vec());
    put_bytes(
        &d,
        &id,
        "/workspace/keep.txt",
        "",
        vec![2u8; CAP as usize + 10],
    )
    .expect_error(413, "body_too_large");
    assert_eq!(get_bytes(&d, &id, "/workspace/keep.txt").1, b"old");
    let out = d.exec(
        &id,
        "find /workspace /tmp /home/sandbox -mindepth 1 -type f | sort",
    );
    assert_eq!(
        out.stdout, "/workspace/at-cap.bin\n/workspace/keep.txt\n",
        "{out:?}"
    );
    // A download over the cap is refused the same way.
    d.exec(&id, "head -c 2000000 /dev/zero > /workspace/big");
    let r = send(d.req(
        Method::GET,
        &format!(
            "/v1/sandboxes/{id}/files/content{}",
            q("/workspace/big", "")
        ),
    ));
    r.expect_error(413, "body_too_large");
    // And the daemon is fine.
    assert_eq!(d.exec(&id, "echo ok").stdout, "ok\n");
}

#[test]
fn daemon_files_paths_outside_the_sandbox_are_refused() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    let files = format!("/v1/sandboxes/{id}/files");
    // A link inside that points out.
    d.exec(
        &id,
        "ln -s /etc /workspace/etc-link; ln -s / /tmp/root-link",
    );
    let marker = format!("sandcell-escape-{id}");
    let outside = [
        "../../etc/passwd".to_string(),
        "/etc/passwd".into(),
        "/workspace/../etc/passwd".into(),
        "/tmp/../../etc/shadow".into(),
        "/home/sandbox/../../../etc/passwd".into(),
        "/proc/self/environ".into(),
        "/proc/1/root/etc/passwd".into(),
        "/usr/bin/python3".into(),
        "/run/sandcell".into(),
        "/workspace/etc-link/passwd".into(),
        "/tmp/root-link/etc/passwd".into(),
        format!("/workspace/etc-link/{marker}"),
        format!("/tmp/root-link/tmp/{marker}"),
    ];
    let check = |what: &str, r: Resp| {
        assert!(
            (400..500).contains(&r.status) && r.status != 404,
            "{what}: {} {}",
            r.status,
            r.body
        );
        let code = r.error_code().to_string();
        assert!(
            [
                "path_outside_sandbox",
                "invalid_argument",
                "permission_denied"
            ]
            .contains(&code.as_str()),
            "{what}: {}",
            r.body
        );
        let text = r.body.to_string();
        assert!(!text.contains("root:x:0:0"), "{what} leaked: {text}");
    };
    for p in &outside {
        let r = send(d.req(Method::GET, &format!("{files}/content{}", q(p, ""))));
        check(&format!("GET content {p}"), r);
        check(
            &format!("PUT content {p}"),
            put_bytes(&d, &id, p, "", b"pwned".to_vec()),
        );
        check(
            &format!("stat {p}"),
            d.get(&format!("{files}/stat{}", q(p, ""))),
        );
        check(&format!("list {p}"), d.get(&format!("{files}{}", q(p, ""))));
        check(
            &format!("delete {p}"),
            d.delete(&format!("{files}{}", q(p, "&recursive=true"))),
        );
        check(
            &format!("mkdir {p}"),
            d.post(&format!("{files}/mkdir"), json!({"path": format!("{p}/x")})),
        );
    }
    // Renames out of, and into, the sandbox's folders.
    put_bytes(&d, &id, "/workspace/mine.txt", "", b"mine".to_vec());
    for (from, to) in [
        ("/workspace/mine.txt", format!("/etc/{marker}")),
        (
            "/workspace/mine.txt",
            format!("/workspace/etc-link/{marker}"),
        ),
        ("/workspace/mine.txt", format!("../../tmp/{marker}")),
        ("/etc/hostname", "/workspace/hostname".to_string()),
    ] {
        check(
            &format!("rename {from} {to}"),
            d.post(&format!("{files}/rename"), json!({"from": from, "to": to})),
        );
    }
    // Nothing reached the host.
    for dir in ["/etc", "/tmp", "/"] {
        assert!(
            !std::path::Path::new(dir).join(&marker).exists(),
            "{dir}/{marker} was created on the host"
        );
    }
    // A NUL in a path is refused too.
    let r = d.get(&format!("{files}/stat?path=/workspace/a%00b"));
    assert_eq!(r.status, 400, "{}", r.body);
    r.error_code();
    // Inside is fine, and the daemon still serves.
    assert_eq!(get_bytes(&d, &id, "/workspace/mine.txt").1, b"mine");
}

fn processes(d: &Daemon, id: &str) -> Vec<Value> {
    let r = d.get(&format!("/v1/sandboxes/{id}/processes"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["processes"].as_array().unwrap().clone()
}

fn find_proc(d: &Daemon, id: &str, cmdline: &str) -> Option<Value> {
    processes(d, id)
        .into_iter()
        .find(|p| p["cmdline"].as_str() == Some(cmdline))
}

#[test]
fn daemon_processes_list_and_kill() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    // Background processes that let go of the exec's output outlive it.
    let out = d.exec(
        &id,
        "sleep 100 > /dev/null 2>&1 & sleep 200 > /dev/null 2>&1 &",
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let sleep = find_proc(&d, &id, "sleep 100").unwrap_or_else(|| {
        panic!("no sleep 100 in {:?}", processes(&d, &id));
    });
    let pid = sleep["pid"].as_i64().unwrap();
    assert!(pid > 1, "{sleep}");
    assert!(sleep["rss_bytes"].as_u64().is_some(), "{sleep}");
    assert_eq!(sleep["state"], "S", "{sleep}");
    // The agent is not listed; the pids are the sandbox's own.
    assert!(processes(&d, &id).iter().all(|p| p["pid"] != 1));
    let ps = d.exec(&id, &format!("ps -o pid= -p {pid}"));
    assert_eq!(ps.stdout.as_str().trim(), pid.to_string(), "{ps:?}");

    // Killed (SIGKILL by default): gone from the list and from the sandbox.
    let r = d.delete(&format!("/v1/sandboxes/{id}/processes/{pid}"));
    assert_eq!(r.status, 204, "{}", r.body);
    let gone = wait_for(Duration::from_secs(10), || {
        find_proc(&d, &id, "sleep 100").is_none().then_some(())
    });
    assert!(gone.is_some(), "{:?}", processes(&d, &id));
    // The other one is untouched; TERM by name ends it.
    let other = find_proc(&d, &id, "sleep 200").expect("sleep 200 was killed too");
    let r = d.delete(&format!(
        "/v1/sandboxes/{id}/processes/{}?signal=TERM",
        other["pid"]
    ));
    assert_eq!(r.status, 204, "{}", r.body);
    assert!(
        wait_for(Duration::from_secs(10), || {
            find_proc(&d, &id, "sleep 200").is_none().then_some(())
        })
        .is_some()
    );

    // A process that is not there, pid 1, a bad signal.
    d.delete(&format!("/v1/sandboxes/{id}/processes/99999"))
        .expect_error(404, "no_such_process");
    d.delete(&format!("/v1/sandboxes/{id}/processes/1"))
        .expect_error(400, "invalid_argument");
    d.delete(&format!("/v1/sandboxes/{id}/processes/5?signal=NOPE"))
        .expect_error(400, "invalid_argument");
}

#[test]
fn daemon_import_only_from_allowed_host_paths() {
    let host = tempfile::tempdir().unwrap();
    let allowed = host.path().join("allowed");
    std::fs::create_dir_all(allowed.join("sub")).unwrap();
    std::fs::write(allowed.join("a.txt"), "from the host").unwrap();
    std::fs::write(allowed.join("sub/b.txt"), "deeper").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", allowed.join("link")).unwrap();
    // A sibling whose name starts like the allowed folder's.
    let evil = host.path().join("allowed-evil");
    std::fs::create_dir_all(&evil).unwrap();
    std::fs::write(evil.join("secret.txt"), "secret").unwrap();
    let d = Daemon::start(&[&format!("import.allowed_paths={}", allowed.display())]);
    let id = d.create_id(json!({}));
    let import = format!("/v1/sandboxes/{id}/import");
    let a = allowed.display().to_string();

    // A file and a folder inside the allowed one.
    let r = d.post(
        &import,
        json!({"path": "/workspace/a.txt", "host_path": format!("{a}/a.txt")}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        (r.body["files"].clone(), r.body["bytes"].clone()),
        (json!(1), json!(13))
    );
    assert_eq!(d.exec(&id, "cat /workspace/a.txt").stdout, "from the host");
    let r = d.post(&import, json!({"path": "tree", "host_path": a}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["files"], 2, "{}", r.body);
    // A relative path is answered resolved, as every file route answers it.
    assert_eq!(r.body["path"], "/workspace/tree", "{}", r.body);
    let out = d.exec(&id, "cd /workspace/tree && find . | sort && cat sub/b.txt");
    // The link is not followed out of the allowed folder.
    assert_eq!(
        out.stdout, ".\n./a.txt\n./sub\n./sub/b.txt\ndeeper",
        "{out:?}"
    );

    // Outside it: refused, and nothing is written.
    for p in [
        "/etc/passwd".to_string(),
        format!("{a}/link"),
        format!("{a}/../allowed-evil/secret.txt"),
        evil.join("secret.txt").display().to_string(),
        host.path().display().to_string(),
        "allowed/a.txt".into(),
    ] {
        let r = d.post(
            &import,
            json!({"path": "/workspace/stolen", "host_path": p}),
        );
        r.expect_error(403, "permission_denied");
        assert!(!r.body.to_string().contains("root:x:0:0"), "{}", r.body);
    }
    d.post(
        &import,
        json!({"path": "/workspace/stolen", "host_path": format!("{a}/nope")}),
    )
    .expect_error(404, "not_found");
    assert_eq!(d.exec(&id, "ls /workspace").stdout, "a.txt\ntree\n");

    // Inline text and base64; exactly one source; the sandbox's own paths are checked too.
    let r = d.post(
        &import,
        json!({"path": "/tmp/t.txt", "text": "inline", "mode": 0o600}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let r = d.post(&import, json!({"path": "/tmp/b.bin", "base64": "AAEC/w=="}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        d.exec(
            &id,
            "cat /tmp/t.txt; echo; stat -c %a /tmp/t.txt; od -An -tu1 /tmp/b.bin"
        )
        .stdout
        .as_str()
        .split_whitespace()
        .collect::<Vec<_>>(),
        ["inline", "600", "0", "1", "2", "255"]
    );
    d.post(&import, json!({"path": "/tmp/x", "base64": "%%%"}))
        .expect_error(400, "invalid_argument");
    d.post(
        &import,
        json!({"path": "/tmp/x", "text": "a", "base64": "YQ=="}),
    )
    .expect_error(400, "invalid_argument");
    d.post(&import, json!({"path": "/tmp/x"}))
        .expect_error(400, "invalid_argument");
    let r = d.post(&import, json!({"path": "/etc/evil", "text": "x"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error_code(), "path_outside_sandbox");
    // Another owner cannot import into this sandbox.
    let (bob, _) = d.key_for("bob");
    d.call_as(
        Some(&bob),
        Method::POST,
        &import,
        Some(json!({"path": "/tmp/x", "text": "bob"})),
    )
    .expect_error(404, "not_found");
}

/// Downloads `url` with `key` (None: the daemon's admin key); (status, bytes, content type).
fn download(d: &Daemon, key: Option<&str>, url: &str) -> (u16, Vec<u8>, String) {
    let req = match key {
        Some(k) => d.req_as(Some(k), Method::GET, url),
        None => d.req(Method::GET, url),
    };
    let resp = req.send().unwrap();
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, resp.bytes().unwrap().to_vec(), ctype)
}

/// Downloads `url` without an API key.
fn download_anon(d: &Daemon, url: &str) -> (u16, Vec<u8>, String) {
    let resp = d.req_as(None, Method::GET, url).send().unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().unwrap().to_vec(), String::new())
}

/// The sorted member names of a tar archive, read by the host's `tar`.
fn tar_members(bytes: &[u8]) -> Vec<String> {
    let mut child = Command::new("tar")
        .arg("-tf")
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "not a tar archive");
    let mut names: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim_end_matches('/').to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn daemon_exports_download_import_elsewhere_and_artifacts() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    d.exec(
        &id,
        "mkdir -p /workspace/out/sub /workspace/outputs && printf report > /workspace/r.txt \
         && printf one > /workspace/out/a && printf two > /workspace/out/sub/b \
         && printf png > /workspace/outputs/plot.png",
    );

    // A file: its size and SHA-256 recorded, its bytes downloadable by the URL it names.
    let r = d.post(
        &format!("/v1/sandboxes/{id}/exports"),
        json!({"path": "/workspace/r.txt"}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let file_export = r.body["id"].as_str().unwrap().to_string();
    assert_eq!(
        (r.body["kind"].clone(), r.body["size"].clone()),
        (json!("file"), json!(6))
    );
    assert_eq!(
        r.body["sha256"], "845e91831319e89c4d656bdb80c278ac09a7230d61e5dfd2e1b1fbb436ac8917",
        "sha256 of 'report'"
    );
    let url = r.body["download_url"].as_str().unwrap().to_string();
    let (status, bytes, _) = download(&d, None, &url);
    assert_eq!((status, bytes.as_slice()), (200, b"report".as_slice()));

    // A folder comes as a tar archive; concurrent first downloads all get a whole one.
    let r = d.post(
        &format!("/v1/sandboxes/{id}/exports"),
        json!({"path": "/workspace/out"}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["kind"], "dir");
    let dir_export = r.body["id"].as_str().unwrap().to_string();
    let url = r.body["download_url"].as_str().unwrap().to_string();
    let archives: Vec<(u16, Vec<u8>, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| download(&d, None, &url)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (status, bytes, ctype) in &archives {
        assert_eq!((*status, ctype.as_str()), (200, "application/x-tar"));
        assert_eq!(tar_members(bytes), ["out", "out/a", "out/sub", "out/sub/b"]);
    }

    // Listed and shown to their owner; another owner sees neither, nor can download.
    let list = d.get("/v1/exports");
    assert_eq!(list.status, 200);
    let ids: Vec<&str> = list.body["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&file_export.as_str()) && ids.contains(&dir_export.as_str()));
    let (bob, _) = d.key_for("bob");
    let r = d.call_as(Some(&bob), Method::GET, "/v1/exports", None);
    assert_eq!(r.body["exports"], json!([]), "{}", r.body);
    d.call_as(
        Some(&bob),
        Method::GET,
        &format!("/v1/exports/{file_export}"),
        None,
    )
    .expect_error(404, "not_found");
    let (status, bytes, _) = download(&d, Some(&bob), &url);
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&bytes));

    // An export outlives its sandbox and imports into another one, file or folder.
    assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).status, 204);
    let other = d.create_id(json!({}));
    let import = format!("/v1/sandboxes/{other}/import");
    let r = d.post(
        &import,
        json!({"path": "/workspace/copy.txt", "export_id": file_export}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let r = d.post(
        &import,
        json!({"path": "/workspace/tree", "export_id": dir_export}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["files"], 2, "{}", r.body);
    let out = d.exec(
        &other,
        "cat /workspace/copy.txt; echo; cd /workspace/tree && find . -type f | sort && cat sub/b",
    );
    assert_eq!(out.stdout, "report\n./a\n./sub/b\ntwo", "{out:?}");
    // Bob cannot import Alice's export into his own sandbox.
    let bobs = d.create_as(&bob, json!({})).id;
    d.call_as(
        Some(&bob),
        Method::POST,
        &format!("/v1/sandboxes/{bobs}/import"),
        Some(json!({"path": "/workspace/x", "export_id": file_export})),
    )
    .expect_error(404, "not_found");

    // Deleted: gone from the list, the download and imports.
    assert_eq!(d.delete(&format!("/v1/exports/{file_export}")).status, 204);
    d.get(&format!("/v1/exports/{file_export}"))
        .expect_error(404, "not_found");
    let (status, _, _) = download(&d, None, &format!("/v1/exports/{file_export}/content"));
    assert_eq!(status, 404);
    d.post(
        &import,
        json!({"path": "/workspace/again", "export_id": file_export}),
    )
    .expect_error(404, "not_found");
    // Exporting what is not there, or outside the sandbox's folders.
    d.post(
        &format!("/v1/sandboxes/{other}/exports"),
        json!({"path": "/workspace/nope"}),
    )
    .expect_error(404, "not_found");
    let r = d.post(
        &format!("/v1/sandboxes/{other}/exports"),
        json!({"path": "/etc/passwd"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);

    // Artifacts: the files of /workspace/outputs with their MIME types.
    d.exec(
        &other,
        "mkdir -p /workspace/outputs/p && printf png > /workspace/outputs/p/plot.png \
         && printf '{}' > /workspace/outputs/data.json",
    );
    let r = d.get(&format!("/v1/sandboxes/{other}/artifacts"));
    assert_eq!(r.status, 200, "{}", r.body);
    let got: Vec<(String, String, u64)> = r.body["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["path"].as_str().unwrap().to_string(),
                a["mime"].as_str().unwrap().to_string(),
                a["size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "/workspace/outputs/data.json".to_string(),
                "application/json".to_string(),
                2
            ),
            (
                "/workspace/outputs/p/plot.png".to_string(),
                "image/png".to_string(),
                3
            ),
        ]
    );
}

#[test]
fn daemon_signed_export_links_work_without_a_key_until_they_expire() {
    let d = Daemon::start(&["exports.url_ttl_secs=3"]);
    let id = d.create_id(json!({}));
    d.exec(
        &id,
        "printf secret > /workspace/s.txt && printf other > /workspace/o.txt",
    );
    let export = |path: &str| {
        let r = d.post(
            &format!("/v1/sandboxes/{id}/exports"),
            json!({ "path": path }),
        );
        assert_eq!(r.status, 201, "{}", r.body);
        r.body
    };
    let first = export("/workspace/s.txt");
    let other = export("/workspace/o.txt");
    let link = first["signed_url"].as_str().unwrap().to_string();
    assert!(first["signed_url_expires_at"].is_string(), "{first}");

    // No key needed with the link; the link is for this export only, and whole.
    let (status, bytes, _) = download_anon(&d, &link);
    assert_eq!((status, bytes.as_slice()), (200, b"secret".as_slice()));
    let (status, _, _) = download_anon(&d, first["download_url"].as_str().unwrap());
    assert_eq!(status, 401, "the plain URL needs a key");
    let query = link.split_once('?').unwrap().1;
    let other_id = other["id"].as_str().unwrap();
    let (status, _, _) = download_anon(&d, &format!("/v1/exports/{other_id}/content?{query}"));
    assert_eq!(status, 403, "one export's signature opened another");
    let expires: i64 = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("expires="))
        .unwrap()
        .parse()
        .unwrap();
    let sig = query.split_once("&signature=").unwrap().1;
    let base = first["download_url"].as_str().unwrap();
    let later = format!("{base}?expires={}&signature={sig}", expires + 3600);
    assert_eq!(
        download_anon(&d, &later).0,
        403,
        "a longer expiry was accepted"
    );
    let flipped: String = sig
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i == 0 {
                if c == '0' { '1' } else { '0' }
            } else {
                c
            }
        })
        .collect();
    let forged = format!("{base}?expires={expires}&signature={flipped}");
    assert_eq!(download_anon(&d, &forged).0, 403);
    let half = format!("{base}?expires={expires}");
    assert_eq!(download_anon(&d, &half).0, 400);

    // Expired: refused with the reason; a fresh answer about the export gives a new link.
    std::thread::sleep(Duration::from_millis(
        u64::try_from(expires * 1000 - now_ms() + 100).unwrap_or(0),
    ));
    let r = send(d.req_as(None, Method::GET, &link));
    r.expect_error(403, "permission_denied");
    assert!(
        r.body["message"].as_str().unwrap().contains("expired"),
        "{}",
        r.body
    );
    let fresh = d.get(&format!("/v1/exports/{}", first["id"].as_str().unwrap()));
    let link = fresh.body["signed_url"].as_str().unwrap();
    assert_eq!(download_anon(&d, link).0, 200);

    // A deleted export's links are dead.
    assert_eq!(
        d.delete(&format!("/v1/exports/{}", first["id"].as_str().unwrap()))
            .status,
        204
    );
    assert_eq!(download_anon(&d, link).0, 404);
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A client that goes away in the middle of an upload (its connection closed after half the
/// declared body, with and without chunked encoding, as a new file and over an old one):
/// the agent is told to abandon the write, so no file and no temporary file is left, and an
/// existing file keeps its content.
#[test]
fn daemon_files_an_upload_cut_off_mid_stream_leaves_no_file() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    d.exec(
        &id,
        "mkdir -p /workspace/up && echo old > /workspace/up/kept.txt",
    );
    let addr = d.url.trim_start_matches("http://").to_string();
    let cut_off = |path: &str, chunked: bool| {
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        let length = if chunked {
            "Transfer-Encoding: chunked".to_string()
        } else {
            format!("Content-Length: {}", 8 << 20)
        };
        let head = format!(
            "PUT /v1/sandboxes/{id}/files/content{} HTTP/1.1\r\nHost: {addr}\r\n\
             X-API-Key: {}\r\nContent-Type: application/octet-stream\r\n{length}\r\n\r\n",
            q(path, ""),
            d.key
        );
        conn.write_all(head.as_bytes()).unwrap();
        let half = vec![b'x'; 4 << 20];
        if chunked {
            conn.write_all(format!("{:x}\r\n", half.len()).as_bytes())
                .unwrap();
        }
        conn.write_all(&half).unwrap();
        // Some of it reached the sandbox before the client went away.
        let temp_seen = wait_for(Duration::from_secs(10), || {
            let out = d.exec(&id, "ls -A /workspace/up");
            out.stdout
                .as_str()
                .contains(".sandcell-write-")
                .then_some(())
        });
        assert!(temp_seen.is_some(), "the upload never started writing");
        drop(conn);
    };
    cut_off("/workspace/up/new.bin", false);
    cut_off("/workspace/up/kept.txt", true);
    let left = wait_for(Duration::from_secs(10), || {
        let out = d.exec(&id, "ls -A /workspace/up");
        let names = out.stdout.as_str().to_string();
        (names == "kept.txt\n").then_some(names)
    });
    let now = d.exec(&id, "ls -A /workspace/up");
    assert!(left.is_some(), "left behind: {now:?}");
    let kept = d.exec(&id, "cat /workspace/up/kept.txt");
    assert_eq!(kept.stdout, "old\n", "{kept:?}");
}
