//! Pseudo-terminals for sandboxed processes: open a pair on the devpts that `/dev/ptmx`
//! belongs to (inside a sandbox: its private one), set the window size, and start a command
//! with the terminal as its stdin, stdout, stderr and controlling terminal.
//!
//! The guest agent calls these safe functions; the `unsafe` steps (a `pre_exec` hook, which
//! runs between fork and exec) live here.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use rustix::io::Errno;
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

/// Both ends of a new pseudo-terminal, close-on-exec.
#[derive(Debug)]
pub struct PtyPair {
    /// The controlling side the agent reads output from and writes input to.
    pub master: OwnedFd,
    /// The terminal the process gets.
    pub slave: OwnedFd,
    /// The terminal's path (`/dev/pts/N`).
    pub slave_path: String,
}

/// Opens a new pseudo-terminal of `rows` x `cols` cells.
pub fn open(rows: u16, cols: u16) -> io::Result<PtyPair> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let slave_path = rustix::pty::ptsname(&master, Vec::new())?
        .into_string()
        .map_err(|_| io::Error::other("the pty's name is not utf-8"))?;
    // TIOCGPTPEER opens the peer through the master's own devpts, never a path that another
    // mount could shadow; kernels before 4.13 lack it.
    let slave = match rustix::pty::ioctl_tiocgptpeer(&master, flags) {
        Ok(fd) => fd,
        Err(Errno::INVAL | Errno::NOTTY) => rustix::fs::open(
            slave_path.as_str(),
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?,
        Err(e) => return Err(e.into()),
    };
    set_size(&master, rows, cols)?;
    Ok(PtyPair {
        master,
        slave,
        slave_path,
    })
}

/// Sets the window size of the terminal `fd` belongs to (either end); the kernel sends
/// SIGWINCH to the terminal's foreground process group when it changes.
pub fn set_size(fd: impl AsFd, rows: u16, cols: u16) -> io::Result<()> {
    let size = Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(fd, size)?;
    Ok(())
}

/// The window size of the terminal `fd` belongs to, as (rows, cols).
pub fn size(fd: impl AsFd) -> io::Result<(u16, u16)> {
    let size = rustix::termios::tcgetwinsize(fd)?;
    Ok((size.ws_row, size.ws_col))
}

/// Spawns `cmd` with `slave` as its stdin, stdout and stderr, in a new session whose
/// controlling terminal it is (so the process leads its own session and process group, and
/// ^C on the terminal signals that group). `cmd` must not set a process group of its own:
/// `setsid` fails for a process group leader. `cmd` keeps copies of the terminal until it is
/// dropped (the master sees the end of output only once every copy is closed).
pub fn spawn(cmd: &mut Command, slave: &OwnedFd) -> io::Result<Child> {
    cmd.stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave.try_clone()?));
    // SAFETY: the hook runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes two raw system calls (setsid, ioctl) and
    // reads errno, allocating nothing and touching no lock. fd 0 is the terminal by then
    // (std sets up stdio before running the hooks).
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Reads the master until the child's side is closed (EIO) or `limit` bytes came.
    fn read_all(master: OwnedFd) -> String {
        let mut file = std::fs::File::from(master);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                // EIO: every copy of the terminal is closed.
                Err(_) => break,
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn a_child_gets_the_terminal_its_size_and_its_own_session() {
        let pair = open(33, 101).unwrap();
        assert!(
            pair.slave_path.starts_with("/dev/pts/"),
            "{}",
            pair.slave_path
        );
        assert_eq!(size(&pair.master).unwrap(), (33, 101));
        let mut cmd = Command::new("/bin/sh");
        cmd.args([
            "-c",
            "tty; stty size; ps -o sid= -o pgid= -p $$; echo pid $$",
        ]);
        let mut child = spawn(&mut cmd, &pair.slave).unwrap();
        // The command holds copies of the terminal until dropped; the read ends (EIO) only
        // when the child's are the last ones.
        drop(cmd);
        drop(pair.slave);
        let out = read_all(pair.master);
        child.wait().unwrap();
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        assert_eq!(lines[0], pair.slave_path, "{out}");
        assert_eq!(lines[1], "33 101", "{out}");
        let pid = child.id().to_string();
        let ids: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(ids, [pid.as_str(), pid.as_str()], "{out}");
    }

    #[test]
    fn resizing_changes_what_the_terminal_reports() {
        let pair = open(24, 80).unwrap();
        set_size(&pair.master, 50, 132).unwrap();
        assert_eq!(size(&pair.slave).unwrap(), (50, 132));
    }
}
