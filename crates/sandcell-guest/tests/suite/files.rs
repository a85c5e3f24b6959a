//! File operations and their confinement to the sandbox's file roots.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandcell_protocol::{
    Channel, ErrorCode, FileEntry, FileKind, Frame, GuestMessage, HostMessage,
};

use super::client::{Agent, expect_code};

const CHUNK: usize = 256 * 1024;

fn write(
    agent: &mut Agent,
    path: &str,
    bytes: &[u8],
    mode: Option<u32>,
    append: bool,
) -> GuestMessage {
    let id = agent.new_id();
    agent.send(
        id,
        &HostMessage::WriteFile {
            path: path.into(),
            mode,
            append,
        },
    );
    for (seq, chunk) in bytes.chunks(CHUNK).enumerate() {
        agent.send_data(id, Channel::File, seq as u64, chunk);
    }
    agent.send(id, &HostMessage::EndOfData);
    agent.reply(id)
}

fn write_ok(agent: &mut Agent, path: &str, bytes: &[u8]) -> FileEntry {
    match write(agent, path, bytes, None, false) {
        GuestMessage::Entry { entry } => entry,
        other => panic!("write failed: {other:?}"),
    }
}

/// Reads a file: (bytes, number of chunks, size from ReadDone), or the error reply.
fn read(agent: &mut Agent, path: &str) -> Result<(Vec<u8>, usize, u64), GuestMessage> {
    let id = agent.new_id();
    agent.send(
        id,
        &HostMessage::ReadFile {
            path: path.into(),
            window: None,
        },
    );
    let mut bytes = Vec::new();
    let mut chunks = 0;
    loop {
        match agent.next_for(id) {
            Frame::Data { chunk, .. } => {
                assert_eq!(chunk.channel, Channel::File);
                assert_eq!(chunk.seq, chunks as u64, "chunks out of order");
                assert!(chunk.bytes.len() <= CHUNK);
                bytes.extend_from_slice(&chunk.bytes);
                chunks += 1;
            }
            Frame::Message {
                msg: GuestMessage::ReadDone { size },
                ..
            } => return Ok((bytes, chunks, size)),
            Frame::Message { msg, .. } => return Err(msg),
        }
    }
}

fn entry(msg: GuestMessage) -> FileEntry {
    match msg {
        GuestMessage::Entry { entry } => entry,
        other => panic!("expected an entry, got {other:?}"),
    }
}

fn listing(msg: GuestMessage) -> Vec<FileEntry> {
    match msg {
        GuestMessage::Listing { entries } => entries,
        other => panic!("expected a listing, got {other:?}"),
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[test]
fn binary_files_round_trip_across_chunks() {
    let mut agent = Agent::start();
    let data: Vec<u8> = (0..1_500_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let e = write_ok(&mut agent, "data.bin", &data);
    assert_eq!(e.size, data.len() as u64);
    assert_eq!(e.kind, FileKind::File);
    assert_eq!(e.path, agent.ws_path("data.bin"));
    assert_eq!(e.mode, 0o644);
    assert_eq!(
        std::fs::read(agent.workspace().join("data.bin")).unwrap(),
        data
    );
    let (back, chunks, size) = read(&mut agent, "data.bin").unwrap();
    assert_eq!(back, data);
    assert_eq!(size, data.len() as u64);
    assert!(chunks >= 6, "expected several chunks, got {chunks}");
    // An absolute path inside a root works the same, and an empty file has no chunks.
    write_ok(&mut agent, "empty", b"");
    let empty = agent.ws_path("empty");
    let (back, chunks, size) = read(&mut agent, &empty).unwrap();
    assert!(back.is_empty());
    assert_eq!((chunks, size), (0, 0));
}

#[test]
fn writes_replace_atomically_honour_mode_and_append() {
    let mut agent = Agent::start();
    write_ok(&mut agent, "f.txt", b"first version");
    let e = entry(write(&mut agent, "f.txt", b"second", Some(0o600), false));
    assert_eq!(e.mode, 0o600);
    assert_eq!(e.size, 6);
    assert_eq!(
        std::fs::read(agent.workspace().join("f.txt")).unwrap(),
        b"second"
    );
    let e = entry(write(&mut agent, "f.txt", b"+more", None, true));
    assert_eq!(e.size, 11);
    assert_eq!(
        std::fs::read(agent.workspace().join("f.txt")).unwrap(),
        b"second+more"
    );
    // No temporary file is left behind.
    let names: Vec<String> = std::fs::read_dir(agent.workspace())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, vec!["f.txt"]);
}

#[test]
fn writing_into_missing_directories_creates_them() {
    let mut agent = Agent::start();
    let e = write_ok(&mut agent, "a/b/c/d/file.txt", b"deep");
    assert_eq!(e.path, agent.ws_path("a/b/c/d/file.txt"));
    assert!(agent.workspace().join("a/b/c/d").is_dir());
    let (back, _, _) = read(&mut agent, "a/b/c/d/file.txt").unwrap();
    assert_eq!(back, b"deep");
    // Other roots are reachable by absolute path.
    let home = format!("{}/home/x/notes", agent.dir.path().display());
    write_ok(&mut agent, &home, b"n");
    assert!(agent.dir.path().join("home/x/notes").is_file());
}

#[test]
fn list_and_stat_describe_entries() {
    let mut agent = Agent::start();
    let ws = agent.workspace();
    std::fs::write(ws.join("b.txt"), b"12345").unwrap();
    std::fs::create_dir(ws.join("a-dir")).unwrap();
    std::fs::set_permissions(ws.join("a-dir"), std::fs::Permissions::from_mode(0o750)).unwrap();
    symlink("b.txt", ws.join("c-link")).unwrap();
    let entries = listing(agent.call(HostMessage::ListDir { path: ".".into() }));
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, vec!["a-dir", "b.txt", "c-link"]);
    let (dir, file, link) = (&entries[0], &entries[1], &entries[2]);
    assert!(dir.is_dir && dir.kind == FileKind::Dir);
    assert_eq!(dir.mode, 0o750);
    assert_eq!(file.size, 5);
    assert!(!file.is_dir);
    assert_eq!(file.path, agent.ws_path("b.txt"));
    assert!((file.mtime - now()).abs() < 60, "mtime {}", file.mtime);
    assert_eq!(link.kind, FileKind::Symlink);
    assert_eq!(link.link_target.as_deref(), Some("b.txt"));
    // Stat describes a symlink itself, not its target.
    let st = entry(agent.call(HostMessage::Stat {
        path: "c-link".into(),
    }));
    assert_eq!(st.kind, FileKind::Symlink);
    let st = entry(agent.call(HostMessage::Stat {
        path: "b.txt".into(),
    }));
    assert_eq!((st.kind, st.size), (FileKind::File, 5));
    let root = entry(agent.call(HostMessage::Stat { path: "".into() }));
    assert!(root.is_dir);
    assert_eq!(root.name, "workspace");
    expect_code(
        agent.call(HostMessage::Stat {
            path: "nope".into(),
        }),
        ErrorCode::NotFound,
    );
    expect_code(
        agent.call(HostMessage::ListDir {
            path: "b.txt".into(),
        }),
        ErrorCode::NotADirectory,
    );
}

#[test]
fn mkdir_rename_and_remove() {
    let mut agent = Agent::start();
    let e = entry(agent.call(HostMessage::MakeDir {
        path: "x/y/z".into(),
    }));
    assert!(e.is_dir);
    assert_eq!(e.path, agent.ws_path("x/y/z"));
    // mkdir -p of an existing directory succeeds; of a file it does not.
    assert!(entry(agent.call(HostMessage::MakeDir { path: "x/y".into() })).is_dir);
    write_ok(&mut agent, "x/y/z/f", b"data");
    expect_code(
        agent.call(HostMessage::MakeDir {
            path: "x/y/z/f".into(),
        }),
        ErrorCode::AlreadyExists,
    );
    let e = entry(agent.call(HostMessage::Rename {
        from: "x/y/z/f".into(),
        to: "x/g".into(),
    }));
    assert_eq!((e.name.as_str(), e.size), ("g", 4));
    expect_code(
        agent.call(HostMessage::Stat {
            path: "x/y/z/f".into(),
        }),
        ErrorCode::NotFound,
    );
    let msg = expect_code(
        agent.call(HostMessage::Remove {
            path: "x".into(),
            recursive: false,
        }),
        ErrorCode::DirectoryNotEmpty,
    );
    assert!(msg.contains(&agent.ws_path("x")), "{msg}");
    assert_eq!(
        agent.call(HostMessage::Remove {
            path: "x".into(),
            recursive: true,
        }),
        GuestMessage::Ok
    );
    assert!(!agent.workspace().join("x").exists());
    expect_code(
        agent.call(HostMessage::Remove {
            path: "".into(),
            recursive: true,
        }),
        ErrorCode::InvalidArgument,
    );
    assert!(agent.workspace().is_dir());
}

#[test]
fn recursive_remove_never_follows_symlinks() {
    let mut agent = Agent::start();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"keep").unwrap();
    std::fs::create_dir(agent.workspace().join("d")).unwrap();
    symlink(outside.path(), agent.workspace().join("d/link")).unwrap();
    assert_eq!(
        agent.call(HostMessage::Remove {
            path: "d".into(),
            recursive: true,
        }),
        GuestMessage::Ok
    );
    assert!(!agent.workspace().join("d").exists());
    assert!(outside.path().join("precious").exists());
}

#[test]
fn dotdot_and_paths_outside_the_roots_are_refused() {
    let mut agent = Agent::start();
    let msg = expect_code(
        agent.call(HostMessage::ReadFile {
            path: "../../etc/passwd".into(),
            window: None,
        }),
        ErrorCode::PathOutsideSandbox,
    );
    assert_eq!(msg, "path '../../etc/passwd' contains '..'");
    let msg = expect_code(
        agent.call(HostMessage::ReadFile {
            path: "/etc/passwd".into(),
            window: None,
        }),
        ErrorCode::PathOutsideSandbox,
    );
    assert!(
        msg.starts_with("'/etc/passwd' is outside the sandbox's file roots ("),
        "{msg}"
    );
    expect_code(
        agent.call(HostMessage::Stat {
            path: "a/../../x".into(),
        }),
        ErrorCode::PathOutsideSandbox,
    );
    // A write outside fails once; its data and EndOfData are swallowed.
    let reply = write(&mut agent, "/etc/sandcell-test", b"nope", None, false);
    expect_code(reply, ErrorCode::PathOutsideSandbox);
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
    assert!(!std::path::Path::new("/etc/sandcell-test").exists());
    expect_code(
        agent.call(HostMessage::ReadFile {
            path: "a\0b".into(),
            window: None,
        }),
        ErrorCode::InvalidArgument,
    );
}

#[test]
fn symlinks_cannot_lead_out_of_the_sandbox() {
    let mut agent = Agent::start();
    let ws = agent.workspace();
    symlink("/", ws.join("escape")).unwrap();
    symlink("../..", ws.join("up")).unwrap();
    std::fs::create_dir(ws.join("inner")).unwrap();
    std::fs::write(ws.join("inner/ok.txt"), b"fine").unwrap();
    symlink("inner/ok.txt", ws.join("good")).unwrap();
    let msg = expect_code(
        agent.call(HostMessage::ReadFile {
            path: "escape/etc/passwd".into(),
            window: None,
        }),
        ErrorCode::PathOutsideSandbox,
    );
    assert_eq!(
        msg,
        format!(
            "'{}' resolves through a symlink that leaves the sandbox",
            agent.ws_path("escape/etc/passwd")
        )
    );
    expect_code(
        agent.call(HostMessage::ListDir {
            path: "escape".into(),
        }),
        ErrorCode::PathOutsideSandbox,
    );
    expect_code(
        agent.call(HostMessage::ReadFile {
            path: "up/etc/passwd".into(),
            window: None,
        }),
        ErrorCode::PathOutsideSandbox,
    );
    let reply = write(&mut agent, "escape/tmp/sandcell-escape", b"x", None, false);
    expect_code(reply, ErrorCode::PathOutsideSandbox);
    assert!(!std::path::Path::new("/tmp/sandcell-escape").exists());
    expect_code(
        agent.call(HostMessage::MakeDir {
            path: "escape/tmp/sandcell-escape-dir".into(),
        }),
        ErrorCode::PathOutsideSandbox,
    );
    assert!(!std::path::Path::new("/tmp/sandcell-escape-dir").exists());
    // A symlink that stays beneath the root is followed.
    let (back, _, _) = read(&mut agent, "good").unwrap();
    assert_eq!(back, b"fine");
    // Stat and remove act on the link itself.
    let st = entry(agent.call(HostMessage::Stat {
        path: "escape".into(),
    }));
    assert_eq!(st.kind, FileKind::Symlink);
    assert_eq!(st.link_target.as_deref(), Some("/"));
    assert_eq!(
        agent.call(HostMessage::Remove {
            path: "escape".into(),
            recursive: true,
        }),
        GuestMessage::Ok
    );
    assert!(std::fs::symlink_metadata(ws.join("escape")).is_err());
    assert!(std::path::Path::new("/etc/passwd").exists());
}

#[test]
fn reading_a_directory_or_a_missing_file_fails_precisely() {
    let mut agent = Agent::start();
    std::fs::create_dir(agent.workspace().join("d")).unwrap();
    let msg = expect_code(read(&mut agent, "d").unwrap_err(), ErrorCode::IsADirectory);
    assert_eq!(msg, format!("'{}' is a directory", agent.ws_path("d")));
    let msg = expect_code(
        read(&mut agent, "missing").unwrap_err(),
        ErrorCode::NotFound,
    );
    assert!(msg.contains(&agent.ws_path("missing")), "{msg}");
    expect_code(
        write(&mut agent, "d", b"x", None, false),
        ErrorCode::IsADirectory,
    );
}

#[test]
fn a_write_that_fails_midway_replies_once_and_cleans_up() {
    let mut agent = Agent::start();
    let ws = agent.workspace();
    // A character device like /dev/full inside the workspace: every write gets ENOSPC.
    let dev = rustix::fs::makedev(1, 7);
    let made = rustix::fs::mknodat(
        rustix::fs::CWD,
        ws.join("full").as_path(),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_bits_truncate(0o666),
        dev,
    );
    sandcell_testkit::require!(made.is_ok(), "cannot create a device node here ({made:?})");
    let msg = expect_code(
        write(&mut agent, "full", &[1u8; 1000], None, true),
        ErrorCode::NoSpace,
    );
    assert_eq!(
        msg,
        format!(
            "no space left on device writing '{}'",
            agent.ws_path("full")
        )
    );
    // Nothing else arrives for that request: the next frame is the Pong.
    let id = agent.new_id();
    agent.send(id, &HostMessage::Ping);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(agent.reply(id), GuestMessage::Pong);
    assert_eq!(
        agent.stray(),
        0,
        "unexpected extra frame after the failed write"
    );
    agent
        .sock
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 64];
    let extra = loop {
        match std::io::Read::read(&mut agent.sock, &mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other,
        }
    };
    assert!(
        matches!(&extra, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "unexpected extra frame after the failed write: {extra:?}"
    );
}

#[test]
fn rename_moves_across_file_systems() {
    use std::os::unix::fs::MetadataExt;
    // A root on tmpfs, unlike the other roots: renames between them get EXDEV.
    let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
        sandcell_testkit::skip!("no /dev/shm");
    };
    let shm_path = shm.path().to_path_buf();
    let mut agent = Agent::raw_with(|c| c.file_roots[2] = shm_path.clone());
    agent.hello();
    let ws = agent.workspace();
    sandcell_testkit::require!(
        std::fs::metadata(&ws).unwrap().dev() != std::fs::metadata(&shm_path).unwrap().dev(),
        "/dev/shm is on the same file system"
    );
    std::fs::create_dir_all(ws.join("tree/sub")).unwrap();
    std::fs::write(ws.join("tree/sub/f.bin"), vec![7u8; 300_000]).unwrap();
    std::fs::set_permissions(
        ws.join("tree/sub/f.bin"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    symlink("sub/f.bin", ws.join("tree/link")).unwrap();
    let old = std::fs::metadata(ws.join("tree/sub/f.bin"))
        .unwrap()
        .mtime()
        - 1000;
    let st = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: old,
            tv_nsec: 0,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: old,
            tv_nsec: 0,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        ws.join("tree/sub/f.bin").as_path(),
        &st,
        rustix::fs::AtFlags::empty(),
    )
    .unwrap();
    let to = format!("{}/moved", shm_path.display());
    let e = entry(agent.call(HostMessage::Rename {
        from: "tree".into(),
        to: to.clone(),
    }));
    assert!(e.is_dir);
    assert_eq!(e.path, to);
    assert!(!ws.join("tree").exists(), "the source must be gone");
    let moved = shm_path.join("moved");
    assert_eq!(
        std::fs::read(moved.join("sub/f.bin")).unwrap(),
        vec![7u8; 300_000]
    );
    let meta = std::fs::metadata(moved.join("sub/f.bin")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert_eq!(meta.mtime(), old);
    assert_eq!(
        std::fs::read_link(moved.join("link")).unwrap(),
        std::path::Path::new("sub/f.bin")
    );
    // And a single file back again.
    let e = entry(agent.call(HostMessage::Rename {
        from: format!("{to}/sub/f.bin"),
        to: "back.bin".into(),
    }));
    assert_eq!((e.size, e.mode), (300_000, 0o640));
    assert!(!moved.join("sub/f.bin").exists());
}

/// The chunks of read `id` that have arrived, after `wait`.
fn arrived(agent: &mut Agent, id: u32, wait: Duration) -> usize {
    agent.pending_for(id, wait)
}

#[test]
fn a_windowed_read_sends_no_more_than_it_was_granted() {
    let mut agent = Agent::start();
    let big: Vec<u8> = (0..10 * CHUNK).map(|i| (i % 251) as u8).collect();
    write_ok(&mut agent, "big.bin", &big);

    let id = agent.new_id();
    agent.send(
        id,
        &HostMessage::ReadFile {
            path: "big.bin".into(),
            window: Some(3),
        },
    );
    assert_eq!(arrived(&mut agent, id, Duration::from_millis(200)), 3);
    // While it waits, other file operations go on (it holds no shared worker).
    for i in 0..4 {
        let dir = format!("d{i}");
        entry(agent.call(HostMessage::MakeDir { path: dir }));
    }
    agent.send(id, &HostMessage::ReadCredit { chunks: 2 });
    assert_eq!(arrived(&mut agent, id, Duration::from_millis(200)), 5);
    // Enough credit for the rest: every byte, in order, then ReadDone.
    agent.send(id, &HostMessage::ReadCredit { chunks: 100 });
    let mut bytes = Vec::new();
    loop {
        match agent.next_for(id) {
            Frame::Data { chunk, .. } => bytes.extend_from_slice(&chunk.bytes),
            Frame::Message {
                msg: GuestMessage::ReadDone { size },
                ..
            } => {
                assert_eq!(size, big.len() as u64);
                break;
            }
            Frame::Message { msg, .. } => panic!("{msg:?}"),
        }
    }
    assert!(bytes == big, "the windowed read's bytes differ");
}

#[test]
fn an_aborted_windowed_read_stops_and_says_how_far_it_got() {
    let mut agent = Agent::start();
    write_ok(&mut agent, "big.bin", &vec![7u8; 8 * CHUNK]);
    let id = agent.new_id();
    agent.send(
        id,
        &HostMessage::ReadFile {
            path: "big.bin".into(),
            window: Some(2),
        },
    );
    assert_eq!(arrived(&mut agent, id, Duration::from_millis(200)), 2);
    agent.send(id, &HostMessage::AbortData);
    let mut chunks = 0;
    loop {
        match agent.next_for(id) {
            Frame::Data { .. } => chunks += 1,
            Frame::Message {
                msg: GuestMessage::ReadDone { size },
                ..
            } => {
                assert_eq!(size, 2 * CHUNK as u64);
                break;
            }
            Frame::Message { msg, .. } => panic!("{msg:?}"),
        }
    }
    assert_eq!(chunks, 2);
    // The agent goes on serving.
    assert_eq!(read(&mut agent, "big.bin").unwrap().0.len(), 8 * CHUNK);
}
