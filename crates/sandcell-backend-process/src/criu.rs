//! Process checkpoints on the `process` backend through CRIU, for sandboxes made
//! checkpointable (see [`sandcell_jail::JailConfig::guest_dir`]): `criu dump` of the running
//! sandbox into a snapshot's image folder, and `criu restore` of it as a new sandbox, in a
//! new cgroup, talking on a new connection.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sandcell_engine::EngineError;

/// Where the Sandcell binary is bound in a checkpointable sandbox.
pub const GUEST_MOUNT: &str = "/.sandcell";
/// The descriptor the restored agent's connection is given to CRIU on.
const INHERITED_FD: i32 = 3;
/// In a checkpoint's folder: the inode of the agent's end of its connection at the dump
/// (CRIU names the socket by it), and where its root skeleton was.
const AGENT_SOCKET_FILE: &str = "sandcell-agent-socket";
const ROOT_FILE: &str = "sandcell-root";

/// A `criu` binary that passed `criu check`.
#[derive(Debug, Clone)]
pub struct Criu {
    path: PathBuf,
}

impl Criu {
    /// `$SANDCELL_CRIU`, else `criu` on the PATH, if `criu check` passes; else why not.
    pub fn find() -> Result<Self, String> {
        let path = std::env::var_os("SANDCELL_CRIU")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("criu"));
        let out = Command::new(&path)
            .arg("check")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => format!(
                    "{} is not installed (scripts/tools.sh builds CRIU 4 from Debian's source; point $SANDCELL_CRIU at it)",
                    path.display()
                ),
                _ => format!("{} check: {e}", path.display()),
            })?;
        if out.status.success() {
            return Ok(Self { path });
        }
        let text = String::from_utf8_lossy(&out.stderr);
        let last = text
            .lines()
            .rev()
            .find(|l| l.contains("Error"))
            .or_else(|| text.lines().last())
            .unwrap_or("no output")
            .trim()
            .to_string();
        Err(format!("{} check fails here: {last}", path.display()))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Dumps the sandbox whose PID 1 is `pid` into `image`, leaving it running. `agent_ino`
    /// is the inode of the agent's end of its host connection; `root` its root skeleton.
    pub fn dump(
        &self,
        pid: i32,
        agent_ino: u64,
        root: &str,
        image: &Path,
    ) -> Result<(), EngineError> {
        std::fs::write(image.join(AGENT_SOCKET_FILE), agent_ino.to_string())
            .and_then(|()| std::fs::write(image.join(ROOT_FILE), root))
            .map_err(|e| EngineError::io("write the checkpoint's notes", e))?;
        let mut cmd = Command::new(&self.path);
        cmd.arg("dump")
            .args(["-t", &pid.to_string(), "-D"])
            .arg(image)
            .args([
                "--leave-running",
                "--network-lock",
                "skip",
                // A connection open inside (a preview being served, a program's own client
                // and server) is saved in repair mode instead of failing the dump.
                "--tcp-established",
                "--external",
                "mnt[]",
            ])
            .args(["--external", &format!("unix[{agent_ino}]")])
            .args(["-o", "dump.log", "-v2"]);
        run(cmd, image, "dump.log", "criu dump")
    }

    /// Restores the checkpoint in `image` as a new sandbox named `hostname` whose processes
    /// go into the cgroup named by `cgroup_roots` (see `SandboxCgroup::criu_roots`) and whose
    /// agent talks on `connection`. Returns the host pid of its PID 1 and its root skeleton.
    pub fn restore(
        &self,
        image: &Path,
        hostname: &str,
        cgroup_roots: &[String],
        connection: std::os::fd::OwnedFd,
    ) -> Result<(i32, String), EngineError> {
        set_hostname(image, hostname)?;
        let read = |name: &str| {
            std::fs::read_to_string(image.join(name))
                .map(|s| s.trim().to_string())
                .map_err(|e| EngineError::io(format!("read {name} of the checkpoint"), e))
        };
        let agent_ino = read(AGENT_SOCKET_FILE)?;
        let root = read(ROOT_FILE)?;
        if !Path::new(&root).is_dir() {
            return Err(EngineError::Launch {
                stage: "criu restore".into(),
                message: format!(
                    "the sandbox root {root} of this checkpoint is gone from this host"
                ),
            });
        }
        let pidfile = image.join("restored.pid");
        let _ = std::fs::remove_file(&pidfile);
        let mut cmd = Command::new(&self.path);
        cmd.arg("restore")
            .arg("-D")
            .arg(image)
            .args(["--restore-detached", "--external", "mnt[]", "--root", &root])
            .args(["--manage-cgroups=soft", "--tcp-established"])
            .args([
                "--inherit-fd",
                &format!("fd[{INHERITED_FD}]:socket:[{agent_ino}]"),
            ])
            .arg("--pidfile")
            .arg(&pidfile)
            .args(["-o", "restore.log", "-v2"]);
        for root in cgroup_roots {
            cmd.args(["--cgroup-root", root]);
        }
        sandcell_jail::fdpass::pass_fd(&mut cmd, connection, INHERITED_FD);
        run(cmd, image, "restore.log", "criu restore")?;
        let pid = read("restored.pid")?;
        let pid = pid.parse().map_err(|_| EngineError::Launch {
            stage: "criu restore".into(),
            message: format!("criu wrote a bad pid {pid:?}"),
        })?;
        Ok((pid, root))
    }
}

/// The request id of the `Rehome` after a restore (the engine's client, reaching a restored
/// agent, never uses ids this high).
const REHOME_ID: u32 = u32::MAX - 16;

/// Asks the restored agent on `host` to move to a connection made inside its sandbox;
/// returns the host's end of it and the inode of the agent's end.
pub fn rehome(
    host: std::os::unix::net::UnixStream,
) -> Result<(std::os::unix::net::UnixStream, u64), EngineError> {
    use sandcell_protocol::{Frame, FrameDecoder, GuestMessage, HostMessage, encode_message};
    use std::io::Write;
    use std::os::fd::AsFd;
    let fail = |m: String| EngineError::Launch {
        stage: "rehome the restored agent".into(),
        message: m,
    };
    host.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .map_err(|e| fail(e.to_string()))?;
    (&host)
        .write_all(&encode_message(REHOME_ID, &HostMessage::Rehome))
        .map_err(|e| fail(format!("send: {e}")))?;
    let mut decoder = FrameDecoder::default();
    let mut fds = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let (n, got) = sandcell_jail::fdpass::recv_with_fds(host.as_fd(), &mut buf)
            .map_err(|e| fail(format!("no answer: {e}")))?;
        if n == 0 {
            return Err(fail("the restored agent closed its connection".into()));
        }
        fds.extend(got);
        decoder.feed(&buf[..n]);
        while let Some(frame) = decoder.next_frame::<GuestMessage>() {
            match frame {
                Ok(Frame::Message { id, msg }) if id == REHOME_ID => {
                    return match (msg, fds.pop()) {
                        (GuestMessage::Rehomed { inode }, Some(fd)) => {
                            Ok((std::os::unix::net::UnixStream::from(fd), inode))
                        }
                        (other, _) => Err(fail(format!("unexpected answer {other:?}"))),
                    };
                }
                // Nothing else is in flight on a freshly restored connection.
                Ok(_) => {}
                Err(e) => return Err(fail(e.to_string())),
            }
        }
    }
}

/// Runs a criu command; on failure the error carries the last errors of its log.
fn run(mut cmd: Command, image: &Path, log: &str, what: &str) -> Result<(), EngineError> {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| EngineError::io(format!("run {what}"), e))?;
    if out.status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(image.join(log)).unwrap_or_default();
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error") && !l.contains("RLIMIT_NOFILE"))
        .collect();
    let tail = errors[errors.len().saturating_sub(3)..].join("; ");
    Err(EngineError::Launch {
        stage: what.into(),
        message: format!("{what} failed ({}): {tail}", out.status),
    })
}

/// Renames the sandbox in the image: CRIU restores the UTS namespace as dumped, and a
/// restored sandbox gets a new identity (its own hostname, as at creation).
fn set_hostname(image: &Path, hostname: &str) -> Result<(), EngineError> {
    let entries =
        std::fs::read_dir(image).map_err(|e| EngineError::io("read the checkpoint image", e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("utsns-") && name.ends_with(".img")) {
            continue;
        }
        let path = entry.path();
        let bytes =
            std::fs::read(&path).map_err(|e| EngineError::io("read the image's utsns", e))?;
        let renamed = rename_utsns(&bytes, hostname).ok_or_else(|| EngineError::Launch {
            stage: "criu restore".into(),
            message: format!("{name} of the checkpoint is not a UTS namespace image"),
        })?;
        std::fs::write(&path, renamed).map_err(|e| EngineError::io("rename the sandbox", e))?;
    }
    Ok(())
}

/// A CRIU `utsns` image (two magic words, then one length-prefixed `utsns_entry { string
/// nodename = 1; string domainname = 2; }`) with `nodename` replaced; `None` if it is not one.
fn rename_utsns(image: &[u8], nodename: &str) -> Option<Vec<u8>> {
    let (magic, rest) = image.split_at_checked(8)?;
    let (len, rest) = rest.split_at_checked(4)?;
    let len = usize::try_from(u32::from_le_bytes(len.try_into().ok()?)).ok()?;
    let mut entry = rest.get(..len)?;
    let mut domainname: &[u8] = b"";
    let mut saw_nodename = false;
    while !entry.is_empty() {
        let (&tag, rest) = entry.split_first()?;
        let (field_len, rest) = read_varint(rest)?;
        let field_len = usize::try_from(field_len).ok()?;
        let value = rest.get(..field_len)?;
        match tag {
            0x0a => saw_nodename = true,
            0x12 => domainname = value,
            _ => return None,
        }
        entry = &rest[field_len..];
    }
    if !saw_nodename {
        return None;
    }
    let mut body = Vec::new();
    for (tag, value) in [(0x0a, nodename.as_bytes()), (0x12, domainname)] {
        body.push(tag);
        write_varint(&mut body, value.len() as u64);
        body.extend_from_slice(value);
    }
    let mut out = magic.to_vec();
    out.extend_from_slice(&u32::try_from(body.len()).ok()?.to_le_bytes());
    out.extend_from_slice(&body);
    // Anything after the one entry is kept as it was.
    out.extend_from_slice(&rest[len..]);
    Some(out)
}

/// A protobuf varint at the start of `bytes`, and what follows it.
fn read_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

/// Appends `value` as a protobuf varint.
fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The inode of the socket on `fd` of process `pid` (`/proc/PID/fd/N` -> `socket:[INO]`).
pub fn socket_inode(pid: i32, fd: i32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let s = link.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The folder bound at [`GUEST_MOUNT`] in checkpointable sandboxes: a copy of `binary` (the
/// Sandcell binary) in `runtime_dir`.
pub fn guest_dir(binary: &Path, runtime_dir: &Path) -> Result<PathBuf, EngineError> {
    // One folder per build: a copy replaced under a running sandbox is a "ghost file" its
    // checkpoint cannot carry (seen when sandboxes of two builds, or two first installs,
    // met).
    let dir =
        sandcell_jail::rootfs::skeleton::binary_dir(&runtime_dir.join("criu").join("bin"), binary)
            .map_err(|e| {
                EngineError::io("find the agent binary for checkpointable sandboxes", e)
            })?;
    sandcell_jail::rootfs::skeleton::install_binary(binary, &dir)
        .map_err(|e| EngineError::io("install the agent binary for checkpointable sandboxes", e))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image as CRIU writes it: magic words, length, `utsns_entry`.
    fn image(nodename: &str, domainname: &str) -> Vec<u8> {
        let mut body = vec![0x0a, nodename.len() as u8];
        body.extend_from_slice(nodename.as_bytes());
        body.extend_from_slice(&[0x12, domainname.len() as u8]);
        body.extend_from_slice(domainname.as_bytes());
        let mut out = 0x5456_4319u32.to_le_bytes().to_vec();
        out.extend_from_slice(&0x5447_3203u32.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn the_nodename_is_replaced_and_the_domainname_kept() {
        let renamed = rename_utsns(&image("sb-aaaaaaaaaaaa", "(none)"), "sb-bbbbbbbbbbbb-long");
        assert_eq!(renamed, Some(image("sb-bbbbbbbbbbbb-long", "(none)")));
        let long = "h".repeat(200);
        let renamed = rename_utsns(&image("x", ""), &long).unwrap();
        assert_eq!(read_varint(&renamed[13..]).unwrap().0, 200);
        assert!(renamed.ends_with(b"\x12\x00"));
    }

    #[test]
    fn what_is_not_a_utsns_image_is_refused() {
        assert_eq!(rename_utsns(b"short", "x"), None);
        let mut wrong = image("a", "b");
        wrong[12] = 0x1a;
        assert_eq!(rename_utsns(&wrong, "x"), None);
        let mut truncated = image("abc", "d");
        truncated.truncate(14);
        assert_eq!(rename_utsns(&truncated, "x"), None);
    }
}
