//! Proves that seccomp, Landlock, rlimits and the privilege drop really deny what they claim.
//!
//! Each mechanism is irreversible, so it is applied in a forked child. The harness is
//! multithreaded, so inputs are prepared in the parent and children mostly make raw libc calls;
//! a child reports the first failing step (name and errno) through a pipe and its exit code.

use std::ffi::{CString, c_void};
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork};
use sandcell_jail::config::{Limits, NetworkMode};
use sandcell_jail::{caps, landlock_policy, rlimits, seccomp};
use sandcell_protocol::isolation::FeatureState;

/// The first check that failed in a child, with the errno seen (0 when the call succeeded).
struct Failure {
    step: &'static str,
    errno: i32,
}

type Check = Result<(), Failure>;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Fails `step` unless `ret` is -1 with `want` as errno.
fn expect_errno(step: &'static str, ret: i64, want: i32) -> Check {
    let seen = if ret == -1 { errno() } else { 0 };
    if ret == -1 && seen == want {
        Ok(())
    } else {
        Err(Failure { step, errno: seen })
    }
}

/// Fails `step` if `ret` is negative.
fn expect_ok(step: &'static str, ret: i64) -> Check {
    if ret >= 0 {
        Ok(())
    } else {
        Err(Failure {
            step,
            errno: errno(),
        })
    }
}

fn check(step: &'static str, ok: bool) -> Check {
    if ok {
        Ok(())
    } else {
        Err(Failure { step, errno: 0 })
    }
}

/// Runs `body` in a forked child; `Err` describes the first failed step.
fn in_child(body: impl FnOnce() -> Check) -> Result<(), String> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the child only runs `body` (raw syscalls and the code under test, which glibc's
    // fork handling keeps usable) and leaves through _exit, never returning into the harness.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
            let code = match outcome {
                Ok(Ok(())) => 0,
                Ok(Err(f)) => {
                    let errno = f.errno.to_le_bytes();
                    // SAFETY: both buffers are valid for their lengths; fds[1] is our pipe.
                    unsafe {
                        libc::write(fds[1], errno.as_ptr().cast(), errno.len());
                        libc::write(fds[1], f.step.as_ptr().cast(), f.step.len());
                    }
                    1
                }
                Err(_) => 2,
            };
            // SAFETY: _exit ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            // SAFETY: both descriptors came from pipe2 above and are owned by nothing else.
            let (read_end, write_end) =
                unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            drop(write_end);
            let status = waitpid(child, None).map_err(|e| format!("waitpid: {e}"))?;
            let mut report = Vec::new();
            std::fs::File::from(read_end)
                .read_to_end(&mut report)
                .map_err(|e| format!("read report: {e}"))?;
            match status {
                WaitStatus::Exited(_, 0) => Ok(()),
                WaitStatus::Exited(_, 1) if report.len() >= 4 => {
                    let (errno, step) = report.split_at(4);
                    let errno = i32::from_le_bytes([errno[0], errno[1], errno[2], errno[3]]);
                    Err(format!(
                        "step {:?} failed (errno {errno}: {})",
                        String::from_utf8_lossy(step),
                        std::io::Error::from_raw_os_error(errno)
                    ))
                }
                WaitStatus::Exited(_, 2) => Err("the child panicked".into()),
                other => Err(format!("child ended with {other:?}")),
            }
        }
    }
}

fn cstring(s: impl AsRef<[u8]>) -> CString {
    CString::new(s.as_ref()).expect("no NUL in test strings")
}

/// Forks, execs `argv` and waits; true when it exited 0. Async-signal-safe.
fn run_exec(argv: &[*const libc::c_char]) -> bool {
    // SAFETY: the grandchild only execs or _exits; argv is NULL-terminated by the caller.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            libc::execv(argv[0], argv.as_ptr());
            libc::_exit(127);
        }
        wait_ok(pid)
    }
}

/// Waits for `pid` and tells whether it exited 0.
fn wait_ok(pid: libc::pid_t) -> bool {
    if pid <= 0 {
        return false;
    }
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer for waitpid.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    waited == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

extern "C" fn thread_body(_: *mut c_void) -> *mut c_void {
    ptr::null_mut()
}

// ---------------------------------------------------------------------------------------------
// seccomp

#[test]
fn denied_syscalls_cover_the_required_list() {
    let names = seccomp::denied_syscalls();
    for required in [
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "bpf",
        "perf_event_open",
        "keyctl",
        "add_key",
        "request_key",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "reboot",
        "swapon",
        "swapoff",
        "open_by_handle_at",
        "name_to_handle_at",
        "setns",
        "acct",
        "quotactl",
        "syslog",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
        "vhangup",
    ] {
        assert!(names.contains(&required), "{required} is not denied");
    }
    for needed in [
        "clone",
        "clone3",
        "unshare",
        "socket",
        "socketpair",
        "prctl",
        "personality",
    ] {
        assert!(
            !names.contains(&needed),
            "{needed} must not be denied outright"
        );
    }
}

#[test]
fn seccomp_off_mode_denies_and_keeps_normal_work_possible() {
    let filter = seccomp::build_filter(NetworkMode::Off).expect("build the filter");
    let true_path = cstring("/bin/true");
    let argv = [true_path.as_ptr(), ptr::null()];
    let missing = cstring("/nonexistent-sandcell-mount-target");
    let tmpfs = cstring("tmpfs");

    let result = in_child(|| {
        // SAFETY: raw syscalls with valid pointers or deliberately invalid arguments that
        // the filter must refuse before the kernel looks at them (the whole block).
        unsafe {
            expect_ok(
                "no_new_privs",
                i64::from(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)),
            )?;
            seccomp::apply_filter(&filter).map_err(|_| Failure {
                step: "apply",
                errno: 0,
            })?;

            let af = |domain, ty, proto| i64::from(libc::socket(domain, ty, proto));
            expect_errno(
                "socket inet",
                af(libc::AF_INET, libc::SOCK_STREAM, 0),
                libc::EAFNOSUPPORT,
            )?;
            expect_errno(
                "socket inet6",
                af(libc::AF_INET6, libc::SOCK_DGRAM, 0),
                libc::EAFNOSUPPORT,
            )?;
            let netlink = af(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE);
            expect_errno("socket netlink", netlink, libc::EAFNOSUPPORT)?;
            expect_errno(
                "socket packet",
                af(libc::AF_PACKET, libc::SOCK_RAW, 0),
                libc::EAFNOSUPPORT,
            )?;
            expect_ok("socket unix", af(libc::AF_UNIX, libc::SOCK_STREAM, 0))?;
            let mut pair = [0; 2];
            let sp = libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr());
            expect_ok("socketpair unix", i64::from(sp))?;

            expect_errno(
                "unshare newuser",
                i64::from(libc::unshare(libc::CLONE_NEWUSER)),
                libc::EPERM,
            )?;
            let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
            let cloned = libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0);
            if cloned == 0 {
                // The filter let the clone through: this is the new process.
                libc::_exit(0);
            }
            if cloned > 0 {
                wait_ok(cloned as libc::pid_t);
            }
            expect_errno("clone newuser", cloned, libc::EPERM)?;
            // Unfiltered, clone3 with a NULL struct fails with EINVAL, not ENOSYS.
            expect_errno(
                "clone3",
                libc::syscall(libc::SYS_clone3, 0, 0),
                libc::ENOSYS,
            )?;
            // Unfiltered (we are root), this fails with ENOENT.
            let m = libc::mount(
                ptr::null(),
                missing.as_ptr(),
                tmpfs.as_ptr(),
                0,
                ptr::null(),
            );
            expect_errno("mount", i64::from(m), libc::EPERM)?;
            let p = libc::ptrace(
                libc::PTRACE_TRACEME,
                0,
                ptr::null_mut::<c_void>(),
                ptr::null_mut::<c_void>(),
            );
            expect_errno("ptrace traceme", p, libc::EPERM)?;
            expect_errno("bpf", libc::syscall(libc::SYS_bpf, 0, 0, 0), libc::EPERM)?;
            expect_errno(
                "io_uring_setup",
                libc::syscall(libc::SYS_io_uring_setup, 1, 0),
                libc::EPERM,
            )?;
            let setns = libc::syscall(libc::SYS_setns, -1, 0);
            expect_errno("setns", setns, libc::EPERM)?;
            // ADDR_NO_RANDOMIZE would switch ASLR off for what the sandbox runs next.
            expect_errno(
                "personality no-aslr",
                i64::from(libc::personality(0x0040000)),
                libc::EPERM,
            )?;
            expect_ok(
                "personality query",
                i64::from(libc::personality(0xffff_ffff)),
            )?;
            // Unfiltered on a socket this fails with ENOTTY.
            let ch: libc::c_char = b'x' as libc::c_char;
            let sti = libc::ioctl(pair[0], libc::TIOCSTI, &ch);
            expect_errno("ioctl TIOCSTI", i64::from(sti), libc::EPERM)?;
            #[cfg(target_arch = "x86_64")]
            {
                // x32 getpid; unfiltered the kernel answers ENOSYS (x32 off) or the pid.
                let x32 = libc::syscall(0x4000_0000 | libc::SYS_getpid);
                expect_errno("x32 syscall", x32, libc::EPERM)?;
            }

            // Ordinary process and thread creation still work (glibc falls back to clone).
            check("fork and exec /bin/true", run_exec(&argv))?;
            let mut pid = 0;
            let envp: [*const libc::c_char; 1] = [ptr::null()];
            let spawned = libc::posix_spawn(
                &mut pid,
                true_path.as_ptr(),
                ptr::null(),
                ptr::null(),
                argv.as_ptr().cast(),
                envp.as_ptr().cast(),
            );
            check("posix_spawn /bin/true", spawned == 0 && wait_ok(pid))?;
            let mut thread: libc::pthread_t = 0;
            let created =
                libc::pthread_create(&mut thread, ptr::null(), thread_body, ptr::null_mut());
            check("pthread_create", created == 0)?;
            check(
                "pthread_join",
                libc::pthread_join(thread, ptr::null_mut()) == 0,
            )?;
        }
        Ok(())
    });
    result.unwrap();
}

#[test]
fn seccomp_loopback_mode_allows_inet_and_netlink_but_not_packet() {
    let filter = seccomp::build_filter(NetworkMode::Loopback).expect("build the filter");
    let result = in_child(|| {
        seccomp::apply_filter(&filter).map_err(|_| Failure {
            step: "apply",
            errno: 0,
        })?;
        // SAFETY: plain socket calls; descriptors are left to the child's exit.
        unsafe {
            let af = |domain, ty, proto| i64::from(libc::socket(domain, ty, proto));
            expect_ok("socket inet", af(libc::AF_INET, libc::SOCK_STREAM, 0))?;
            expect_ok("socket inet6", af(libc::AF_INET6, libc::SOCK_DGRAM, 0))?;
            expect_ok(
                "socket netlink",
                af(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
            )?;
            expect_ok(
                "socket netlink sock_diag",
                af(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_SOCK_DIAG),
            )?;
            // Other netlink protocols (netfilter, audit, uevents) are refused.
            for proto in [
                libc::NETLINK_NETFILTER,
                libc::NETLINK_AUDIT,
                libc::NETLINK_KOBJECT_UEVENT,
            ] {
                expect_errno(
                    "socket netlink other",
                    af(libc::AF_NETLINK, libc::SOCK_RAW, proto),
                    libc::EAFNOSUPPORT,
                )?;
            }
            expect_ok("socket unix", af(libc::AF_UNIX, libc::SOCK_DGRAM, 0))?;
            expect_errno(
                "socket packet",
                af(libc::AF_PACKET, libc::SOCK_RAW, 0),
                libc::EAFNOSUPPORT,
            )?;
            expect_errno(
                "socket vsock",
                af(libc::AF_VSOCK, libc::SOCK_STREAM, 0),
                libc::EAFNOSUPPORT,
            )?;
            expect_errno(
                "unshare newuser",
                i64::from(libc::unshare(libc::CLONE_NEWUSER)),
                libc::EPERM,
            )?;
        }
        Ok(())
    });
    result.unwrap();
}

#[test]
fn seccomp_install_reports_and_enforces() {
    let result = in_child(|| {
        let feature = seccomp::install(NetworkMode::Off).map_err(|_| Failure {
            step: "install",
            errno: 0,
        })?;
        check("state active", feature.state == FeatureState::Active)?;
        check(
            "detail names clone3",
            feature.detail.contains("clone3 -> ENOSYS"),
        )?;
        check(
            "detail names unix only",
            feature.detail.contains("sockets: unix only"),
        )?;
        let count = format!("deny-list: {} syscalls", seccomp::denied_syscalls().len());
        check(
            "detail counts the deny-list",
            feature.detail.contains(&count),
        )?;
        // SAFETY: a plain socket call.
        let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        expect_errno("socket inet", i64::from(s), libc::EAFNOSUPPORT)?;
        let mode = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        check(
            "seccomp mode 2 in /proc",
            mode.lines().any(|l| l == "Seccomp:\t2"),
        )
    });
    result.unwrap();
}

/// Runs `argv` (an interpreter one-liner) under the Off-mode filter; true when it exits 0.
fn runs_under_filter(argv: &[&str]) -> Result<(), String> {
    let filter = seccomp::build_filter(NetworkMode::Off).map_err(|e| e.to_string())?;
    let args: Vec<CString> = argv.iter().map(cstring).collect();
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(ptr::null());
    let devnull = cstring("/dev/null");
    in_child(|| {
        seccomp::apply_filter(&filter).map_err(|_| Failure {
            step: "apply",
            errno: 0,
        })?;
        // SAFETY: the descriptor and pointers are valid; the program's output is not wanted.
        unsafe {
            let null = libc::open(devnull.as_ptr(), libc::O_WRONLY);
            libc::dup2(null, 1);
        }
        check("program exits 0", run_exec(&ptrs))
    })
}

#[test]
fn python_bash_and_node_run_under_the_filter() {
    let python = r#"
import asyncio, os, socket, subprocess, threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
subprocess.run(["/bin/true"], check=True)
a, b = socket.socketpair(); a.send(b"x"); assert b.recv(1) == b"x"
asyncio.run(asyncio.sleep(0))
assert os.listdir("/proc/self/fd")
try:
    socket.socket(socket.AF_INET)
    raise SystemExit(3)
except OSError as e:
    assert e.errno == 97, e
"#;
    runs_under_filter(&["/usr/bin/python3", "-c", python]).unwrap();
    let bash =
        r#"x=$(echo hi | cat); [ "$x" = hi ] && ls / >/dev/null && sort </dev/null && sleep 0"#;
    runs_under_filter(&["/bin/bash", "-c", bash]).unwrap();
    if Path::new("/usr/bin/node").exists() {
        let node = r#"
const cp = require('child_process'); cp.execFileSync('/bin/true');
require('fs').readdirSync('/proc/self/fd');
const { Worker } = require('worker_threads');
new Worker('1', { eval: true }).on('exit', (c) => process.exit(c));
"#;
        runs_under_filter(&["/usr/bin/node", "-e", node]).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Landlock

#[test]
fn landlock_abi_is_probed() {
    // This project's machines run kernels with Landlock enabled (ABI v7 when written).
    let v = landlock_policy::abi_version().expect("landlock available on this machine");
    assert!(v >= 1);
}

#[test]
fn landlock_confines_writes_reads_and_signals() {
    let allowed = tempfile::tempdir().expect("tempdir");
    let other = tempfile::tempdir().expect("tempdir");
    let allowed_dir = allowed.path().to_str().expect("utf-8 path").to_string();
    let inside = cstring(allowed.path().join("ok").as_os_str().as_bytes());
    let outside = cstring(other.path().join("no").as_os_str().as_bytes());
    let etc = cstring("/etc/hostname");
    let usr = cstring("/usr/bin/env");
    let devnull = cstring("/dev/null");
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };

    let result = in_child(|| {
        let read_exec = ["/usr", "/bin", "/lib", "/lib64", "/nonexistent-sandcell"];
        let read_write = [allowed_dir.as_str(), "/dev/null"];
        let f = landlock_policy::restrict(&read_exec, &read_write).map_err(|_| Failure {
            step: "restrict",
            errno: 0,
        })?;
        check("fully enforced", f.state == FeatureState::Active)?;
        check(
            "detail lists skipped",
            f.detail
                .contains("skipped (missing): /nonexistent-sandcell"),
        )?;
        check("detail lists writable", f.detail.contains(&allowed_dir))?;
        // SAFETY: open/write/close/kill with valid C strings and buffers.
        unsafe {
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC;
            expect_errno(
                "write outside",
                i64::from(libc::open(outside.as_ptr(), flags, 0o600)),
                libc::EACCES,
            )?;
            let fd = libc::open(inside.as_ptr(), flags, 0o600);
            expect_ok("create inside", i64::from(fd))?;
            check(
                "write inside",
                libc::write(fd, b"x".as_ptr().cast(), 1) == 1,
            )?;
            expect_errno(
                "read /etc",
                i64::from(libc::open(etc.as_ptr(), libc::O_RDONLY)),
                libc::EACCES,
            )?;
            expect_ok(
                "read /usr",
                i64::from(libc::open(usr.as_ptr(), libc::O_RDONLY)),
            )?;
            let usr_write = libc::open(usr.as_ptr(), libc::O_WRONLY);
            expect_errno("write /usr", i64::from(usr_write), libc::EACCES)?;
            expect_ok(
                "write /dev/null",
                i64::from(libc::open(devnull.as_ptr(), libc::O_WRONLY)),
            )?;
            // Signal scoping: the parent is outside our Landlock domain.
            expect_errno(
                "signal the parent",
                i64::from(libc::kill(parent, 0)),
                libc::EPERM,
            )?;
        }
        Ok(())
    });
    result.unwrap();
    assert_eq!(
        std::fs::read(allowed.path().join("ok")).expect("file written by child"),
        b"x"
    );
    assert!(!other.path().join("no").exists());
}

// ---------------------------------------------------------------------------------------------
// rlimits

fn limit(resource: libc::__rlimit_resource_t) -> (u64, u64) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid out-pointer.
    unsafe { libc::getrlimit(resource, &mut rl) };
    (rl.rlim_cur, rl.rlim_max)
}

#[test]
fn rlimits_apply_and_report_fallbacks() {
    let limits = Limits {
        memory_bytes: Some(256 << 20),
        pids: Some(64),
        cpu_millis: None,
        nofile: 16,
        fsize_bytes: Some(1 << 20),
    };
    let devnull = cstring("/dev/null");
    let result = in_child(|| {
        let features = rlimits::apply(&limits, false, false).map_err(|_| Failure {
            step: "apply",
            errno: 0,
        })?;
        check("nofile", limit(libc::RLIMIT_NOFILE) == (16, 16))?;
        check("core", limit(libc::RLIMIT_CORE) == (0, 0))?;
        check("fsize", limit(libc::RLIMIT_FSIZE) == (1 << 20, 1 << 20))?;
        check("nproc", limit(libc::RLIMIT_NPROC) == (64, 64))?;
        check("data", limit(libc::RLIMIT_DATA) == (256 << 20, 256 << 20))?;
        let names: Vec<_> = features
            .iter()
            .map(|f| (f.name.as_str(), f.state))
            .collect();
        check(
            "features",
            names
                == [
                    ("rlimits", FeatureState::Active),
                    ("pids_limit", FeatureState::Degraded),
                    ("memory_limit", FeatureState::Degraded),
                ],
        )?;
        check("detail", features[0].detail.contains("RLIMIT_NOFILE=16"))?;
        check(
            "memory detail",
            features[2].detail.contains("RLIMIT_DATA=268435456"),
        )?;
        // The descriptor limit bites: 16 opens cannot all succeed with stdio already open.
        let mut emfile = false;
        for _ in 0..16 {
            // SAFETY: a valid C string.
            if unsafe { libc::open(devnull.as_ptr(), libc::O_RDONLY) } == -1 {
                emfile = errno() == libc::EMFILE;
                break;
            }
        }
        check("EMFILE past the limit", emfile)
    });
    result.unwrap();
}

#[test]
fn rlimits_never_raise_a_hard_limit_and_skip_cgroup_covered_ones() {
    let limits = Limits {
        nofile: 1000,
        ..Limits::default()
    };
    let result = in_child(|| {
        let rl = libc::rlimit {
            rlim_cur: 64,
            rlim_max: 64,
        };
        // SAFETY: `rl` is a valid rlimit.
        let lowered = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) };
        expect_ok("lower nofile", i64::from(lowered))?;
        let data_before = limit(libc::RLIMIT_DATA);
        let nproc_before = limit(libc::RLIMIT_NPROC);
        let features = rlimits::apply(&limits, true, true).map_err(|_| Failure {
            step: "apply",
            errno: 0,
        })?;
        check("nofile clamped", limit(libc::RLIMIT_NOFILE) == (64, 64))?;
        check(
            "only rlimits",
            features.len() == 1 && features[0].name == "rlimits",
        )?;
        check(
            "clamp reported",
            features[0].detail.contains("RLIMIT_NOFILE=64 (asked 1000"),
        )?;
        check("data untouched", limit(libc::RLIMIT_DATA) == data_before)?;
        check("nproc untouched", limit(libc::RLIMIT_NPROC) == nproc_before)
    });
    result.unwrap();
}

// ---------------------------------------------------------------------------------------------
// capabilities

fn write_file(path: &str, contents: &str) -> Result<(), String> {
    std::fs::write(path, contents).map_err(|e| format!("write {path}: {e}"))
}

#[test]
fn no_new_privs_is_set_and_reported() {
    let result = in_child(|| {
        check(
            "not set before",
            caps::no_new_privs_feature().state != FeatureState::Active,
        )?;
        caps::set_no_new_privs().map_err(|_| Failure {
            step: "set",
            errno: 0,
        })?;
        check(
            "reported",
            caps::no_new_privs_feature().state == FeatureState::Active,
        )?;
        // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointers.
        check(
            "kernel agrees",
            unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1,
        )
    });
    result.unwrap();
}

#[test]
fn drop_privileges_in_a_user_namespace_leaves_nothing() {
    // Child -> parent: "unshared"; parent -> child: "maps written".
    let mut up = [0; 2];
    let mut down = [0; 2];
    // SAFETY: valid two-element arrays for pipe2 to fill.
    unsafe {
        assert_eq!(libc::pipe2(up.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert_eq!(libc::pipe2(down.as_mut_ptr(), libc::O_CLOEXEC), 0);
    }
    let mut byte = [0u8; 1];
    // SAFETY: see in_child; the child only makes raw calls and the code under test.
    let child = match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            // SAFETY: raw calls with valid buffers; the child ends with _exit.
            unsafe {
                let code = (|| {
                    if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                        return 10;
                    }
                    if libc::write(up[1], b"u".as_ptr().cast(), 1) != 1
                        || libc::read(down[0], byte.as_mut_ptr().cast(), 1) != 1
                    {
                        return 11;
                    }
                    // The scenario that matters: we hold capabilities and are not uid 0, so
                    // setresuid alone would not clear them.
                    let before = rustix::thread::capabilities(None);
                    if !before.is_ok_and(|c| !c.effective.is_empty()) || libc::geteuid() == 0 {
                        return 12;
                    }
                    let Ok(f) = caps::drop_privileges(65532, 65532) else {
                        return 13;
                    };
                    if f.state != FeatureState::Active || !f.detail.contains("uid 65532 gid 65532")
                    {
                        return 14;
                    }
                    if libc::geteuid() != 65532
                        || libc::getuid() != 65532
                        || libc::getegid() != 65532
                    {
                        return 15;
                    }
                    let after = rustix::thread::capabilities(None);
                    if !after.is_ok_and(|c| {
                        c.effective.is_empty() && c.permitted.is_empty() && c.inheritable.is_empty()
                    }) {
                        return 16;
                    }
                    // 21 is CAP_SYS_ADMIN.
                    if libc::prctl(libc::PR_CAPBSET_READ, 21, 0, 0, 0) != 0 {
                        return 17;
                    }
                    // Without CAP_SETUID there is no way back, even to another mapped id.
                    if libc::setresuid(65532, 65532, 65532) != 0
                        || libc::unshare(libc::CLONE_NEWNS) != -1
                    {
                        return 18;
                    }
                    0
                })();
                libc::_exit(code)
            }
        }
        ForkResult::Parent { child } => child,
    };
    // SAFETY: valid buffer and our own pipe end.
    let got = unsafe { libc::read(up[0], byte.as_mut_ptr().cast(), 1) };
    assert_eq!(got, 1, "child did not report its user namespace");
    let pid = child.as_raw();
    write_file(&format!("/proc/{pid}/setgroups"), "deny").unwrap();
    write_file(&format!("/proc/{pid}/uid_map"), "65532 100000 1\n").unwrap();
    write_file(&format!("/proc/{pid}/gid_map"), "65532 100000 1\n").unwrap();
    // SAFETY: valid buffer and our own pipe end.
    assert_eq!(unsafe { libc::write(down[1], b"g".as_ptr().cast(), 1) }, 1);
    let status = waitpid(child, None).expect("waitpid");
    assert_eq!(
        status,
        WaitStatus::Exited(child, 0),
        "exit codes: see the child's returns"
    );
    for fd in up.into_iter().chain(down) {
        // SAFETY: our own pipe descriptors, closed once.
        unsafe { libc::close(fd) };
    }
}

#[test]
fn drop_privileges_refuses_a_multithreaded_process() {
    let result = in_child(|| {
        let mut thread: libc::pthread_t = 0;
        let mut hold = [0; 2];
        // SAFETY: valid out-pointers; the thread blocks reading a pipe nobody writes.
        unsafe {
            expect_ok("pipe", i64::from(libc::pipe(hold.as_mut_ptr())))?;
            extern "C" fn block(fd: *mut c_void) -> *mut c_void {
                let mut b = [0u8; 1];
                // SAFETY: a valid one-byte buffer.
                unsafe { libc::read(fd as usize as libc::c_int, b.as_mut_ptr().cast(), 1) };
                ptr::null_mut()
            }
            let arg = hold[0] as usize as *mut c_void;
            check(
                "thread",
                libc::pthread_create(&mut thread, ptr::null(), block, arg) == 0,
            )?;
        }
        check("refused", caps::drop_privileges(65532, 65532).is_err())?;
        // SAFETY: geteuid has no preconditions.
        check("still root", unsafe { libc::geteuid() } == 0)
    });
    result.unwrap();
}

// ---------------------------------------------------------------------------------------------
// everything together, in the launcher's order

#[test]
fn full_stack_in_launcher_order_still_runs_python() {
    let work = tempfile::tempdir().expect("tempdir");
    // The sandbox user (host uid 100000) must be able to write its workspace.
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    let work_dir = work.path().to_str().expect("utf-8 path").to_string();
    let script = format!(
        r#"
import os, subprocess, threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
out = subprocess.run(["/bin/sh", "-c", "id -u; cat /proc/self/status"], capture_output=True, text=True, check=True).stdout
assert out.splitlines()[0] == "65532", out
assert "CapEff:\t0000000000000000" in out and "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out, out
with open("{work_dir}/made-inside", "w") as f:
    f.write("ok")
try:
    open("/var/tmp/sandcell-should-not-exist", "w")
    raise SystemExit(4)
except PermissionError:
    pass
"#
    );
    let argv: Vec<CString> = ["/usr/bin/python3", "-c", &script]
        .iter()
        .map(cstring)
        .collect();
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(ptr::null());
    let limits = Limits::default();

    let mut up = [0; 2];
    let mut down = [0; 2];
    // SAFETY: valid two-element arrays for pipe2 to fill.
    unsafe {
        assert_eq!(libc::pipe2(up.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert_eq!(libc::pipe2(down.as_mut_ptr(), libc::O_CLOEXEC), 0);
    }
    let mut byte = [0u8; 1];
    // SAFETY: the child runs the code under test and raw calls, and ends with exec or _exit.
    let child = match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = (|| {
                // SAFETY: raw calls with valid buffers.
                unsafe {
                    if libc::unshare(libc::CLONE_NEWUSER) != 0
                        || libc::write(up[1], b"u".as_ptr().cast(), 1) != 1
                        || libc::read(down[0], byte.as_mut_ptr().cast(), 1) != 1
                    {
                        return 10;
                    }
                }
                if caps::set_no_new_privs().is_err() {
                    return 11;
                }
                if rlimits::apply(&limits, false, false).is_err() {
                    return 12;
                }
                let read_exec = ["/usr", "/bin", "/lib", "/lib64", "/etc", "/proc", "/dev"];
                let read_write = [work_dir.as_str(), "/dev/null"];
                if !landlock_policy::restrict(&read_exec, &read_write)
                    .is_ok_and(|f| f.state == FeatureState::Active)
                {
                    return 13;
                }
                if caps::drop_privileges(65532, 65532).is_err() {
                    return 14;
                }
                if seccomp::install(NetworkMode::Off).is_err() {
                    return 15;
                }
                // SAFETY: argv is NULL-terminated and outlives the call.
                unsafe { libc::execv(ptrs[0], ptrs.as_ptr()) };
                16
            })();
            // SAFETY: ends the child without unwinding into the harness.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => child,
    };
    // SAFETY: valid buffer and our own pipe end.
    let got = unsafe { libc::read(up[0], byte.as_mut_ptr().cast(), 1) };
    assert_eq!(got, 1, "child did not report its user namespace");
    let pid = child.as_raw();
    write_file(&format!("/proc/{pid}/setgroups"), "deny").unwrap();
    write_file(&format!("/proc/{pid}/uid_map"), "65532 100000 1\n").unwrap();
    write_file(&format!("/proc/{pid}/gid_map"), "65532 100000 1\n").unwrap();
    // SAFETY: valid buffer and our own pipe end.
    assert_eq!(unsafe { libc::write(down[1], b"g".as_ptr().cast(), 1) }, 1);
    let status = waitpid(child, None).expect("waitpid");
    for fd in up.into_iter().chain(down) {
        // SAFETY: our own pipe descriptors, closed once.
        unsafe { libc::close(fd) };
    }
    assert_eq!(
        status,
        WaitStatus::Exited(child, 0),
        "10-16: setup step failed; else python's"
    );
    assert_eq!(
        std::fs::read(work.path().join("made-inside")).expect("written inside"),
        b"ok"
    );
    assert!(!Path::new("/var/tmp/sandcell-should-not-exist").exists());
}
