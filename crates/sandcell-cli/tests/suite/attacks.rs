//! Each isolation property, attacked from inside a sandbox.

use std::net::TcpListener;
use std::time::Duration;

use sandcell_engine::{NetworkPolicy, SandboxSpec};
use sandcell_protocol::{ErrorCode, ExecRequest};

use super::common::*;

#[tokio::test]
async fn runs_as_uid_65532() {
    let sb = sandbox().await;
    let out = sh(&sb, "id -u; id -g").await;
    assert_eq!(text(&out.stdout), "65532\n65532\n");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn host_files_outside_system_dirs_are_invisible() {
    let marker_root = format!("/root/.sandcell-test-marker-{}", std::process::id());
    let marker_tmp = format!("/tmp/sandcell-test-marker-{}", std::process::id());
    let _ = std::fs::write(&marker_root, "secret"); // may fail when not root: still checked below
    std::fs::write(&marker_tmp, "secret").unwrap();
    let sb = sandbox().await;
    for m in [&marker_root, &marker_tmp] {
        let out = sh(&sb, &format!("cat {m}")).await;
        assert!(
            !out.result.success(),
            "{m} readable inside: {}",
            text(&out.stdout)
        );
        assert!(!text(&out.stdout).contains("secret"));
    }
    let out = sh(
        &sb,
        "ls -a /root 2>&1; ls /home; cat /etc/shadow 2>&1; cat /etc/passwd",
    )
    .await;
    let s = text(&out.stdout);
    assert!(!s.contains(".sandcell-test-marker"), "{s}");
    assert!(
        s.contains("sandbox:x:65532"),
        "synthesized passwd missing: {s}"
    );
    assert!(!s.contains("root:$"), "shadow leaked: {s}");
    sb.destroy().await.unwrap();
    let _ = std::fs::remove_file(&marker_root);
    let _ = std::fs::remove_file(&marker_tmp);
}

#[tokio::test]
async fn system_dirs_are_read_only() {
    let sb = sandbox().await;
    for target in [
        "/usr/sandcell-probe",
        "/usr/bin/python3",
        "/etc/passwd",
        "/sandcell-probe",
    ] {
        let out = sh(&sb, &format!("echo x > {target}")).await;
        assert!(!out.result.success(), "writing {target} succeeded");
    }
    let out = sh(&sb, "echo ok > /workspace/a && echo ok > /tmp/a && echo ok > /home/sandbox/a && cat /workspace/a").await;
    assert_eq!(text(&out.stdout), "ok\n", "{}", text(&out.stderr));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn no_network_to_the_host() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sb = sandbox().await;
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)"
    );
    let out = py(&sb, &code).await;
    assert!(
        text(&out.stdout).starts_with("refused"),
        "{}",
        text(&out.stdout)
    );
    // Loopback inside the sandbox is its own and works.
    let out = py(&sb, "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); c=socket.create_connection(s.getsockname()); print('own loopback ok')").await;
    assert_eq!(
        text(&out.stdout),
        "own loopback ok\n",
        "{}",
        text(&out.stderr)
    );
    sb.destroy().await.unwrap();
    drop(listener);
}

#[tokio::test]
async fn network_off_refuses_inet_sockets() {
    // On gvisor too: the agent's seccomp filter refuses them (gVisor itself would not).
    let spec = SandboxSpec {
        network: NetworkPolicy::Off,
        ..Default::default()
    };
    let sb = sandbox_with(spec).await;
    let out = py(&sb, "import socket\nfor fam in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):\n    try:\n        socket.socket(fam, socket.SOCK_DGRAM); print('allowed', fam)\n    except OSError as e:\n        print('denied', fam)\nsocket.socketpair(); print('unix ok')").await;
    let s = text(&out.stdout);
    assert!(!s.contains("allowed"), "{s}");
    assert!(s.contains("unix ok"), "{s} {}", text(&out.stderr));
    sb.destroy().await.unwrap();
}

/// A Python snippet calling a libc function through ctypes and printing its errno.
fn ctypes(call: &str) -> String {
    format!(
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nr = {call}\nprint(r, os.strerror(ctypes.get_errno()) if r != 0 else 'ok')"
    )
}

#[tokio::test]
async fn ptrace_is_denied() {
    // On gvisor too: the agent's seccomp filter refuses it before gVisor's kernel would.
    let sb = sandbox().await;
    let bg = sb
        .exec_stream(ExecRequest::argv(["sleep", "30"]))
        .await
        .unwrap();
    let code = ctypes(&format!("libc.ptrace(16, {}, 0, 0)", bg.pid())); // PTRACE_ATTACH
    let out = py(&sb, &code).await;
    assert!(
        text(&out.stdout).starts_with("-1 Operation not permitted"),
        "{}",
        text(&out.stdout)
    );
    let out = py(&sb, &ctypes("libc.ptrace(0, 0, 0, 0)")).await;
    assert!(
        text(&out.stdout).starts_with("-1 Operation not permitted"),
        "{}",
        text(&out.stdout)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn mount_is_denied() {
    let sb = sandbox().await;
    let code = ctypes("libc.mount(b'tmpfs', b'/workspace', b'tmpfs', 0, None)");
    let out = py(&sb, &code).await;
    assert!(
        text(&out.stdout).starts_with("-1 Operation not permitted"),
        "{}",
        text(&out.stdout)
    );
    let out = sh(
        &sb,
        "mount -t tmpfs none /tmp 2>&1; umount /proc 2>&1; echo done",
    )
    .await;
    assert!(text(&out.stdout).ends_with("done\n"));
    let out = sh(&sb, "grep -c ' /tmp ' /proc/self/mounts").await;
    assert_eq!(text(&out.stdout), "1\n", "a second /tmp mount appeared");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn new_user_and_mount_namespaces_are_denied() {
    // A user namespace would give back every capability inside it, and with it a mount
    // namespace to mount in. Seccomp refuses CLONE_NEWUSER on both backends; the host kernel
    // refuses the other namespaces to a process without capabilities, gVisor's makes them
    // for anyone, so on gvisor seccomp refuses every namespace flag.
    let sb = sandbox().await;
    for (flags, what) in [
        ("0x10000000", "CLONE_NEWUSER"),
        ("0x10020000", "CLONE_NEWUSER|CLONE_NEWNS"),
        ("0x00020000", "CLONE_NEWNS"),
        ("0x04000000", "CLONE_NEWUTS"),
        ("0x08000000", "CLONE_NEWIPC"),
    ] {
        let out = py(&sb, &ctypes(&format!("libc.unshare({flags})"))).await;
        assert!(
            text(&out.stdout).starts_with("-1 Operation not permitted"),
            "unshare({what}): {} {}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let out = sh(
        &sb,
        "unshare -U true && echo escaped-user || echo denied; \
         unshare -Um true && echo escaped-mount || echo denied",
    )
    .await;
    assert_eq!(text(&out.stdout), "denied\ndenied\n");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn device_nodes_cannot_be_made() {
    // The host kernel refuses them without CAP_MKNOD; gVisor's makes them for anyone, so the
    // gvisor agent's filter refuses them. A FIFO is still fine.
    let sb = sandbox().await;
    let code = [
        "import os, stat",
        "for name, kind, dev in (('blk', stat.S_IFBLK, os.makedev(8, 0)), ('chr', stat.S_IFCHR, os.makedev(1, 3))):",
        "    try:",
        "        os.mknod('/tmp/' + name, 0o600 | kind, dev); print(name, 'made')",
        "    except OSError as e:",
        "        print(name, e.errno)",
        "os.mkfifo('/tmp/fifo'); print('fifo made')",
    ]
    .join("\n");
    let out = py(&sb, &code).await;
    assert_eq!(
        text(&out.stdout),
        format!("blk {0}\nchr {0}\nfifo made\n", libc::EPERM),
        "{}",
        text(&out.stderr)
    );
    let out = sh(&sb, "ls /tmp").await;
    assert_eq!(text(&out.stdout), "fifo\n");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn io_uring_cannot_be_set_up() {
    // io_uring_setup(8, &params): a whole second syscall interface, refused by seccomp.
    let sb = sandbox().await;
    let code = ctypes("libc.syscall(425, 8, ctypes.create_string_buffer(120))");
    let out = py(&sb, &code).await;
    assert!(
        text(&out.stdout).starts_with("-1 Operation not permitted"),
        "{} {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn netlink_is_routing_and_socket_diagnostics_only() {
    // Other families get EAFNOSUPPORT from seccomp: gVisor would open uevents and answer
    // EPROTONOSUPPORT for the rest, the host kernel would open most of them.
    let sb = sandbox().await;
    let code = [
        "import socket",
        "for proto in (15, 9, 12, 16):",
        "    try:",
        "        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto); print(proto, 'opened')",
        "    except OSError as e:",
        "        print(proto, e.errno)",
        "socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); print('route opened')",
    ]
    .join("\n");
    let out = py(&sb, &code).await;
    let no = libc::EAFNOSUPPORT;
    assert_eq!(
        text(&out.stdout),
        format!("15 {no}\n9 {no}\n12 {no}\n16 {no}\nroute opened\n"),
        "{}",
        text(&out.stderr)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn capabilities_are_all_dropped() {
    let sb = sandbox().await;
    let out = sh(
        &sb,
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
    )
    .await;
    let s = text(&out.stdout);
    for line in s.lines().filter(|l| l.starts_with("Cap")) {
        assert!(
            line.ends_with("0000000000000000"),
            "capability left: {line}"
        );
    }
    // A filter (mode 2) and no_new_privs, on gvisor too (the agent's, inside gVisor).
    assert!(s.contains("Seccomp:\t2"), "{s}");
    if on_gvisor() {
        // gVisor's /proc does not show it: asked directly (PR_GET_NO_NEW_PRIVS).
        assert!(!s.contains("NoNewPrivs:\t0"), "{s}");
    } else {
        assert!(s.contains("NoNewPrivs:\t1"), "{s}");
    }
    // The kernel's own answers: PR_GET_NO_NEW_PRIVS, PR_GET_SECCOMP.
    let out = py(
        &sb,
        "import ctypes; c = ctypes.CDLL(None); print(c.prctl(39, 0, 0, 0, 0), c.prctl(21, 0, 0, 0, 0))",
    )
    .await;
    assert_eq!(text(&out.stdout), "1 2\n", "{out:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn no_process_inherits_the_agents_connection() {
    // The agent's connection to the host (on gvisor a host socket gVisor imports) is the
    // agent's alone: a process holding it could talk to the host past the agent.
    let sb = sandbox().await;
    let out = sh(&sb, "for f in /proc/self/fd/*; do readlink $f; done").await;
    let fds = text(&out.stdout);
    assert!(!fds.contains("socket:") && !fds.contains("host:"), "{fds}");
    let out = py(
        &sb,
        "import os\nfor f in os.listdir('/proc/self/fd'):\n    try: print(os.readlink('/proc/self/fd/' + f))\n    except OSError: pass",
    )
    .await;
    let fds = text(&out.stdout);
    assert!(!fds.contains("socket:") && !fds.contains("host:"), "{fds}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn the_agent_cannot_be_read_or_the_sandbox_renamed() {
    // The agent (PID 1) holds the host connection; on gVisor it also keeps the one
    // capability it needs to rename a restored sandbox, which its children never get.
    let sb = sandbox().await;
    let out = sh(
        &sb,
        "for f in mem environ maps; do cat /proc/1/$f > /dev/null 2>&1 && echo read:$f; done; \
         hostname evil 2>/dev/null && echo renamed; hostname; \
         grep -E '^Cap(Prm|Eff)' /proc/self/status",
    )
    .await;
    let s = text(&out.stdout);
    assert!(
        !s.contains("read:mem"),
        "the agent's memory was readable: {s}"
    );
    // gVisor's /proc lets a process of the same user read another's environ and maps (the
    // agent's hold PATH and HOME, and its layout); the host kernel does not.
    if !on_gvisor() {
        assert!(!s.contains("read:"), "the agent was readable: {s}");
    }
    assert!(!s.contains("renamed"), "the sandbox was renamed: {s}");
    assert!(s.contains(&format!("{}\n", sb.id())), "{s}");
    for line in s.lines().filter(|l| l.starts_with("Cap")) {
        assert!(line.ends_with("0000000000000000"), "capability: {line}");
    }
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn signals_cannot_reach_host_processes() {
    let mut host = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = host.id();
    let sb = sandbox().await;
    let out = sh(
        &sb,
        &format!("kill -9 {pid} 2>&1; kill -9 -1 2>&1; echo tried"),
    )
    .await;
    assert!(text(&out.stdout).contains("tried"));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        host.try_wait().unwrap().is_none(),
        "host process was killed from inside a sandbox"
    );
    host.kill().unwrap();
    let _ = host.wait();
    let _ = sb.destroy().await;
}

#[tokio::test]
async fn two_sandboxes_cannot_see_each_other() {
    let a = sandbox().await;
    let b = sandbox().await;
    sh(
        &a,
        "echo mine > /workspace/secret-a; echo tmp > /tmp/secret-a",
    )
    .await;
    let _bg = a
        .exec_stream(ExecRequest::argv(["sleep", "4242"]))
        .await
        .unwrap();
    let out = sh(
        &b,
        "ls /workspace /tmp; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '",
    )
    .await;
    let s = text(&out.stdout);
    assert!(!s.contains("secret-a"), "{s}");
    assert!(!s.contains("4242"), "b sees a's process: {s}");
    assert!(b.read_file("/workspace/secret-a").await.is_err());
    let procs = b.processes().await.unwrap();
    assert!(
        procs.iter().all(|p| !p.cmdline.contains("4242")),
        "{procs:?}"
    );
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
}

#[tokio::test]
async fn every_sandbox_has_a_network_namespace_of_its_own_that_it_cannot_reconfigure() {
    sandcell_testkit::require!(
        !on_gvisor(),
        "the network stack is gVisor's (netstack), one per sandbox"
    );
    // Namespaces may come from the pool of ones made ahead: never shared, never reused.
    let a = sandbox().await;
    let b = sandbox().await;
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    let ns_a = text(&sh(&a, "readlink /proc/self/ns/net").await.stdout);
    let ns_b = text(&sh(&b, "readlink /proc/self/ns/net").await.stdout);
    assert!(ns_a.starts_with("net:["), "{ns_a}");
    assert_ne!(ns_a, ns_b, "two sandboxes share a network namespace");
    assert_ne!(
        ns_a.trim(),
        host.to_string_lossy(),
        "a sandbox is in the host's"
    );
    // A server in one sandbox is unreachable from the other.
    let _server = a
        .exec_stream(ExecRequest::argv([
            "/usr/bin/python3",
            "-c",
            "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',4711))\ns.listen()\ntime.sleep(30)",
        ]))
        .await
        .unwrap();
    let probe = "import socket,time\nfor i in range(50):\n    try:\n        socket.create_connection(('127.0.0.1',4711),timeout=1); print('connected'); break\n    except OSError as e:\n        err=e.errno; time.sleep(0.02)\nelse: print('refused', err)";
    // The server is up in a (it accepts its own connection) but not reachable from b.
    assert_eq!(text(&py(&a, probe).await.stdout), "connected\n");
    let out = text(&py(&b, probe).await.stdout);
    assert!(out.starts_with("refused"), "{out}");
    // lo stays up: taking it down, or adding an address, is refused.
    let out = sh(
        &a,
        "ip link set lo down; ip addr add 10.9.9.9/32 dev lo; ip -br link show lo",
    )
    .await;
    assert!(text(&out.stdout).contains("UP"), "{}", text(&out.stdout));
    assert!(
        !text(&out.stderr).is_empty(),
        "reconfiguring succeeded silently"
    );
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
}

#[tokio::test]
async fn the_root_is_read_only_and_listable() {
    let sb = sandbox().await;
    let out = sh(
        &sb,
        "ls /; touch /x /etc/x /dev/x 2>&1; mkdir /etc/ssl/x 2>&1; echo hi > /dev/null && echo null-ok",
    )
    .await;
    let s = text(&out.stdout);
    for entry in ["etc", "usr", "workspace", "tmp", "proc", "dev", "home"] {
        assert!(s.lines().any(|l| l == entry), "ls / lacks {entry}: {s}");
    }
    // gVisor checks the sandbox user's permission before the mount's read-only flag.
    let refused =
        s.matches("Read-only file system").count() + s.matches("Permission denied").count();
    assert_eq!(refused, 4, "{s}");
    assert!(s.contains("null-ok"), "{s}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn only_the_sandbox_processes_are_visible() {
    let sb = sandbox().await;
    let out = sh(&sb, "ls /proc | grep -E '^[0-9]+$' | wc -l").await;
    let n: u32 = text(&out.stdout).trim().parse().unwrap();
    // The agent, sh, ls, grep, wc.
    assert!(n <= 6, "{n} processes visible");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn file_api_refuses_escapes() {
    let sb = sandbox().await;
    for path in [
        "../../etc/passwd",
        "/workspace/../etc/passwd",
        "/etc/passwd",
        "/root",
    ] {
        let err = sb.read_file(path).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::PathOutsideSandbox, "{path}: {err}");
    }
    sh(
        &sb,
        "ln -s / /workspace/escape; ln -s ../../etc /workspace/up",
    )
    .await;
    for path in ["escape/etc/passwd", "/workspace/escape", "up/passwd"] {
        let err = sb.read_file(path).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::PathOutsideSandbox, "{path}: {err}");
    }
    let err = sb.write_file("escape/tmp/x", b"x", None).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::PathOutsideSandbox);
    // The link itself is listed, not followed.
    let entries = sb.list_dir("/workspace").await.unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e.name == "escape" && e.link_target.as_deref() == Some("/"))
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn isolation_report_names_every_layer() {
    sandcell_testkit::require!(
        !on_gvisor(),
        "the layers are the process backend's; gvisor_reports_its_boundary checks gVisor's"
    );
    let sb = sandbox().await;
    let iso = sb.isolation();
    for name in [
        "user_ns",
        "pid_ns",
        "mount_ns",
        "net_ns",
        "ipc_ns",
        "uts_ns",
        "uid_map",
        "rootfs",
        "network",
        "seccomp",
        "capabilities",
        "no_new_privs",
        "rlimits",
        "landlock",
        "memory_limit",
        "pids_limit",
    ] {
        assert!(
            iso.get(name).is_some(),
            "isolation report lacks {name}: {iso:?}"
        );
    }
    assert!(iso.is_active("seccomp") && iso.is_active("capabilities") && iso.is_active("user_ns"));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn gvisor_reports_its_boundary() {
    if !on_gvisor() {
        return;
    }
    let sb = sandbox().await;
    // Syscalls are answered by gVisor's kernel, not the host's.
    let out = sh(&sb, "uname -r; dmesg 2>&1 | head -3").await;
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(
        text(&out.stdout).lines().next(),
        Some(host.trim()),
        "{out:?}"
    );
    for layer in ["gvisor", "seccomp", "no_new_privs"] {
        assert!(
            sb.isolation().is_active(layer),
            "{layer}: {:?}",
            sb.isolation()
        );
    }
    sb.destroy().await.unwrap();
}
