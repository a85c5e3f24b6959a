//! The sandbox's processes as `/proc` shows them: listing, process-tree discovery, signals.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{Pid, Signal};
use sandcell_protocol::ProcessInfo;

/// Environment variable naming the exec request that started a process tree.
pub(crate) const EXEC_ID_VAR: &str = "SANDCELL_EXEC_ID";
/// Environment variable naming the agent session, so exec ids of other sessions (or of other
/// agents sharing a pid namespace, as in tests) are never mistaken for ours.
pub(crate) const SESSION_VAR: &str = "SANDCELL_SESSION";
/// Environment variable tagging the process tree of one exec with a number the agent never
/// gives twice. Request ids would not do: a background exec's request is over (and its id
/// free for reuse by the host) while its tree still runs.
pub(crate) const TREE_VAR: &str = "SANDCELL_TREE";

/// Most kill rounds against one tree; each catches children forked during the previous one.
const KILL_ROUNDS: usize = 50;

/// The fields of `/proc/PID/stat` the agent uses.
#[derive(Debug, Clone)]
pub(crate) struct ProcStat {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    pub state: char,
    pub comm: String,
    pub rss_pages: u64,
}

impl ProcStat {
    fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses `/proc/PID/stat`; `None` when the process is gone.
pub(crate) fn read_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // comm may hold spaces and parentheses: it ends at the last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let field = |i: usize| rest.get(i).and_then(|s| s.parse::<i64>().ok());
    Some(ProcStat {
        pid,
        state: rest.first()?.chars().next()?,
        ppid: i32::try_from(field(1)?).ok()?,
        pgid: i32::try_from(field(2)?).ok()?,
        sid: i32::try_from(field(3)?).ok()?,
        // Field 24 of stat (rss) is index 21 after the state field.
        rss_pages: u64::try_from(field(21)?).unwrap_or(0),
        comm,
    })
}

/// Every pid in `/proc`.
pub(crate) fn all_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

fn all_stats() -> Vec<ProcStat> {
    all_pids().into_iter().filter_map(read_stat).collect()
}

/// The tags an exec's processes carry in their environment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tags {
    /// The request that started the tree.
    pub exec_id: Option<u32>,
    /// The tree's number.
    pub tree: Option<u64>,
}

/// The tags a process carries in its environment, when it belongs to `session`.
pub(crate) fn environ_tags(pid: i32, session: &str) -> Option<Tags> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let mut tags = Tags::default();
    let mut ours = false;
    let number = |v: &[u8]| std::str::from_utf8(v).ok().and_then(|t| t.parse().ok());
    for var in env.split(|b| *b == 0) {
        if let Some(v) = var.strip_prefix(format!("{EXEC_ID_VAR}=").as_bytes()) {
            tags.exec_id = number(v).and_then(|n: u64| u32::try_from(n).ok());
        } else if let Some(v) = var.strip_prefix(format!("{TREE_VAR}=").as_bytes()) {
            tags.tree = number(v);
        } else if let Some(v) = var.strip_prefix(format!("{SESSION_VAR}=").as_bytes()) {
            ours = v == session.as_bytes();
        }
    }
    ours.then_some(tags)
}

/// The exec id a process carries in its environment, when it belongs to `session`.
pub(crate) fn environ_exec_id(pid: i32, session: &str) -> Option<u32> {
    environ_tags(pid, session).and_then(|t| t.exec_id)
}

/// The tree tag a process carries in its environment, when it belongs to `session`.
fn environ_tree(pid: i32, session: &str) -> Option<u64> {
    environ_tags(pid, session).and_then(|t| t.tree)
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(4096)
}

/// Every process but `exclude`, with the exec id from `tracked` (main pids) or from the
/// process's environment.
pub(crate) fn list(exclude: i32, tracked: &HashMap<i32, u32>, session: &str) -> Vec<ProcessInfo> {
    let page = page_size();
    let mut out: Vec<ProcessInfo> = all_stats()
        .into_iter()
        .filter(|p| p.pid != exclude)
        .map(|p| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid))
                .map(|raw| {
                    raw.split(|b| *b == 0)
                        .filter(|a| !a.is_empty())
                        .map(String::from_utf8_lossy)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            let cmdline = if cmdline.is_empty() {
                format!("[{}]", p.comm)
            } else {
                cmdline
            };
            let exec_id = tracked
                .get(&p.pid)
                .copied()
                .or_else(|| environ_exec_id(p.pid, session));
            ProcessInfo {
                pid: p.pid,
                ppid: p.ppid,
                pgid: p.pgid,
                state: p.state.to_string(),
                cmdline,
                rss_bytes: p.rss_pages * page,
                exec_id,
                ..ProcessInfo::default()
            }
        })
        .collect();
    out.sort_by_key(|p| p.pid);
    out
}

/// Which processes make up a tree to signal.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tree {
    /// Processes that belong to it themselves (with all their descendants).
    pub roots: Vec<i32>,
    /// Process groups (and sessions) whose members belong to it.
    pub groups: Vec<i32>,
    /// The agent session, for matching `SANDCELL_SESSION`.
    pub session: String,
    /// Processes whose environment carries this tree tag (and our session) belong to it.
    pub tag: Option<u64>,
    /// Every process carrying our session belongs to it, whatever its exec id.
    pub any_exec: bool,
    /// The agent's own pid and process group: never part of a tree.
    pub me: i32,
    /// The agent's own process group.
    pub my_pgid: i32,
}

impl Tree {
    /// The live members of the tree, found by one scan of `/proc`.
    pub fn members(&self) -> Vec<i32> {
        let procs = all_stats();
        let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
        let mut led: HashMap<i32, Vec<i32>> = HashMap::new();
        for p in &procs {
            children.entry(p.ppid).or_default().push(p.pid);
            led.entry(p.pgid).or_default().push(p.pid);
            if p.sid != p.pgid {
                led.entry(p.sid).or_default().push(p.pid);
            }
        }
        let forbidden = |pid: i32| pid <= 1 || pid == self.me;
        let mut set: HashSet<i32> = HashSet::new();
        let mut queue: VecDeque<i32> = VecDeque::new();
        let add = |pid: i32, set: &mut HashSet<i32>, queue: &mut VecDeque<i32>| {
            if !forbidden(pid) && set.insert(pid) {
                queue.push_back(pid);
            }
        };
        let live: HashSet<i32> = procs.iter().map(|p| p.pid).collect();
        for &r in &self.roots {
            if live.contains(&r) {
                add(r, &mut set, &mut queue);
            }
        }
        for &g in &self.groups {
            if g > 1 && g != self.my_pgid {
                for &m in led.get(&g).into_iter().flatten() {
                    add(m, &mut set, &mut queue);
                }
            }
        }
        if self.tag.is_some() || self.any_exec {
            for p in &procs {
                if set.contains(&p.pid) || forbidden(p.pid) {
                    continue;
                }
                if let Some(tag) = environ_tree(p.pid, &self.session)
                    && (self.any_exec || self.tag == Some(tag))
                {
                    add(p.pid, &mut set, &mut queue);
                }
            }
        }
        // Descendants, and members of groups and sessions led by a member.
        while let Some(pid) = queue.pop_front() {
            let mut next: Vec<i32> = children.get(&pid).cloned().unwrap_or_default();
            if pid != self.my_pgid {
                next.extend(led.get(&pid).into_iter().flatten());
            }
            for n in next {
                add(n, &mut set, &mut queue);
            }
        }
        procs
            .iter()
            .filter(|p| set.contains(&p.pid) && !p.is_dead())
            .map(|p| p.pid)
            .collect()
    }

    /// Sends `signal` to every member. SIGKILL repeats scan-and-kill until nothing is left
    /// (bounded), to catch processes forked while the previous round ran. Returns how many
    /// processes were signalled.
    pub fn signal(&self, signal: i32) -> usize {
        if signal != libc::SIGKILL {
            let members = self.members();
            send_many(&members, signal);
            return members.len();
        }
        let mut total = 0;
        for _ in 0..KILL_ROUNDS {
            for &g in &self.groups {
                if g > 1 && g != self.my_pgid {
                    let _ = kill_group(g, libc::SIGKILL);
                }
            }
            let members = self.members();
            if members.is_empty() {
                break;
            }
            total += members.len();
            send_many(&members, signal);
            // Give the killed processes a moment to die before the next scan.
            std::thread::sleep(Duration::from_millis(1));
        }
        total
    }
}

/// Kills (SIGKILL, repeated until none is left, bounded) every process of the exec tree
/// `tag` (by its environment tag of `session`, or by its process group `pgid`) that holds
/// open one of the files whose `/proc/PID/fd` links read `names` (`pipe:[INODE]` for a
/// pipe, `/dev/pts/N` for a terminal). Returns how many were killed.
///
/// Requiring membership as well keeps a process that merely inherited the pipe for an
/// instant (a fork of the agent's process on its way to exec) out of it.
pub(crate) fn kill_pipe_holders(names: &[String], tag: u64, pgid: i32, session: &str) -> usize {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let holds = |pid: i32| -> bool {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        fds.filter_map(Result::ok).any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| names.iter().any(|n| target.as_os_str() == n.as_str()))
        })
    };
    let mut total = 0;
    for _ in 0..KILL_ROUNDS {
        let holders: Vec<i32> = all_stats()
            .into_iter()
            .filter(|p| p.pid > 1 && p.pid != me && !p.is_dead())
            .filter(|p| p.pgid == pgid || environ_tree(p.pid, session) == Some(tag))
            .filter(|p| holds(p.pid))
            .map(|p| p.pid)
            .collect();
        if holders.is_empty() {
            break;
        }
        total += holders.len();
        send_many(&holders, libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(1));
    }
    total
}

/// Sends `signal` to one process.
pub(crate) fn send(pid: i32, signal: i32) -> Result<(), Errno> {
    let target = Pid::from_raw(pid).ok_or(Errno::SRCH)?;
    match Signal::from_named_raw(signal) {
        Some(sig) => rustix::process::kill_process(target, sig),
        None => shell_kill(&[pid], signal),
    }
}

fn kill_group(pgid: i32, signal: i32) -> Result<(), Errno> {
    let target = Pid::from_raw(pgid).ok_or(Errno::SRCH)?;
    match Signal::from_named_raw(signal) {
        Some(sig) => rustix::process::kill_process_group(target, sig),
        None => shell_kill(&[-pgid], signal),
    }
}

fn send_many(pids: &[i32], signal: i32) {
    if Signal::from_named_raw(signal).is_some() {
        for &pid in pids {
            let _ = send(pid, signal);
        }
    } else if !pids.is_empty() {
        let _ = shell_kill(pids, signal);
    }
}

/// Sends a signal that has no safe constructor (real-time signals) through the shell's
/// `kill`, since this crate may not use `unsafe`.
fn shell_kill(pids: &[i32], signal: i32) -> Result<(), Errno> {
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("exec kill \"$@\"")
        .arg("sh")
        .arg(format!("-{signal}"))
        .arg("--");
    for pid in pids {
        cmd.arg(pid.to_string());
    }
    cmd.env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // As PID 1 the reaper may collect this child first; the kill has happened either way.
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(_) => Err(Errno::SRCH),
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => Ok(()),
        Err(_) => Err(Errno::INVAL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_comm_parses() {
        let line = "42 (a) b (c)) S 7 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 5 1000 33 18446744073709551615";
        let p = parse_stat(line).unwrap();
        assert_eq!(p.pid, 42);
        assert_eq!(p.comm, "a) b (c)");
        assert_eq!((p.state, p.ppid, p.pgid, p.sid), ('S', 7, 42, 42));
        assert_eq!(p.rss_pages, 33);
    }

    #[test]
    fn own_stat_is_readable() {
        let me = std::process::id() as i32;
        let p = read_stat(me).unwrap();
        assert_eq!(p.pid, me);
        assert!(p.rss_pages > 0);
    }
}
