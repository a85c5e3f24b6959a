//! The cgroup layer against the real hierarchy (skipped without root or a writable
//! cgroupfs) and against fake cgroup trees in temporary directories.

use std::fs;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandcell_jail::Limits;
use sandcell_jail::cgroup::{CgroupVersion, Counters, SandboxCgroup, detect, parse_flat_keyed};
use sandcell_protocol::{Feature, FeatureState};
use sandcell_testkit::{require, skip};

const ROOT: &str = "/sys/fs/cgroup";
const PARENT: &str = "sandcell-test";
const MIB: u64 = 1024 * 1024;
const PYTHON: &str = "/usr/bin/python3";

/// A fresh id per test and run: tests run in parallel and runs may overlap.
fn unique_id(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_nanos();
    format!("test-{name}-{}-{nanos}", std::process::id())
}

fn limits(memory_bytes: Option<u64>, pids: Option<u64>, cpu_millis: Option<u64>) -> Limits {
    Limits {
        memory_bytes,
        pids,
        cpu_millis,
        ..Limits::default()
    }
}

/// Whether the real hierarchy can be used here; reports the test skipped when it cannot.
fn real_cgroups() -> bool {
    if !nix::unistd::geteuid().is_root() {
        skip::skip("needs root");
        return false;
    }
    let support = detect(Path::new(ROOT));
    if support.version.is_none() || !support.writable {
        skip::skip(support.reason.unwrap_or_default());
        return false;
    }
    true
}

/// Kills and removes the cgroup however the test ends.
struct Cleanup(SandboxCgroup);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.0.kill_all();
        let _ = self.0.remove();
    }
}

fn create_real(name: &str, limits: &Limits) -> (Cleanup, Vec<Feature>) {
    let (cg, features) = SandboxCgroup::create(Path::new(ROOT), PARENT, &unique_id(name), limits)
        .expect("create a cgroup");
    (Cleanup(cg), features)
}

fn state_of(features: &[Feature], name: &str) -> FeatureState {
    features
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .state
}

fn read(path: impl AsRef<Path>) -> String {
    fs::read_to_string(path.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
        .trim()
        .to_string()
}

/// The directory of `cg` holding `file` (v1: the right hierarchy).
fn file_of(cg: &SandboxCgroup, file: &str) -> PathBuf {
    cg.paths()
        .iter()
        .map(|p| p.join(file))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no {file} in {:?}", cg.paths()))
}

/// Spawns `sh -c 'read x; <script>'`, moves it into `cg`, then lets it go on: everything
/// the script starts is inside the cgroup from its first instruction.
fn spawn_in(cg: &SandboxCgroup, script: &str) -> Child {
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("read x; {script}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sh");
    cg.join(child.id()).expect("join the child");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(b"go\n").expect("release the child");
    child
}

fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        sleep(Duration::from_millis(20));
    }
    done()
}

#[test]
fn flat_keyed_files() {
    let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
    assert_eq!(parse_flat_keyed(events, "oom_kill"), Some(2));
    assert_eq!(parse_flat_keyed(events, "oom"), Some(3));
    assert_eq!(parse_flat_keyed(events, "max"), Some(12));
    assert_eq!(parse_flat_keyed(events, "absent"), None);
    assert_eq!(
        parse_flat_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", "oom_kill"),
        Some(1)
    );
    assert_eq!(
        parse_flat_keyed("usage_usec  42 \n", "usage_usec"),
        Some(42)
    );
    assert_eq!(parse_flat_keyed("max max\n", "max"), None);
    assert_eq!(parse_flat_keyed("", "max"), None);
}

#[test]
fn detects_the_real_root() {
    let support = detect(Path::new(ROOT));
    eprintln!("{support:?}");
    if Path::new(ROOT).join("cgroup.controllers").exists() {
        assert_eq!(support.version, Some(CgroupVersion::V2));
    } else if Path::new(ROOT).join("memory").is_dir() {
        assert_eq!(support.version, Some(CgroupVersion::V1));
        for c in ["memory", "pids", "cpu"] {
            assert!(
                support.controllers.iter().any(|x| x == c),
                "{c} in {support:?}"
            );
        }
    } else {
        skip!("no cgroup hierarchy at {ROOT}");
    }
    assert_eq!(support.writable, support.reason.is_none(), "{support:?}");
}

#[test]
fn detect_without_cgroups_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let support = detect(tmp.path());
    assert_eq!(support.version, None);
    assert!(!support.writable);
    let reason = support.reason.unwrap();
    assert!(reason.contains("no cgroup hierarchy"), "{reason}");
    let err = SandboxCgroup::create(tmp.path(), "sandcell", "x", &Limits::default()).unwrap_err();
    assert!(err.to_string().contains("no cgroup hierarchy"), "{err}");
}

#[test]
fn rejects_bad_names_and_paths() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("cgroup.controllers"), "memory pids\n").unwrap();
    for (parent, id) in [
        ("sandcell", "../x"),
        ("sandcell", ""),
        ("../up", "x"),
        ("a", "b/c"),
    ] {
        assert!(SandboxCgroup::create(tmp.path(), parent, id, &Limits::default()).is_err());
    }
    assert!(SandboxCgroup::open(&[]).is_err());
    assert!(SandboxCgroup::open(&[PathBuf::from("relative/path")]).is_err());
    assert!(SandboxCgroup::open(&[tmp.path().join("missing")]).is_err());
    // A hierarchy root is never a sandbox cgroup: kill_all() there would hit everything.
    if Path::new(ROOT).join("memory/tasks").exists() {
        assert!(SandboxCgroup::open(&[PathBuf::from("/sys/fs/cgroup/memory")]).is_err());
    }
    if Path::new(ROOT).join("cgroup.controllers").exists() {
        assert!(SandboxCgroup::open(&[PathBuf::from(ROOT)]).is_err());
    }
}

#[test]
fn fake_v2_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    fs::write(
        root.join("cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    )
    .unwrap();
    fs::write(root.join("cgroup.subtree_control"), "").unwrap();

    let support = detect(root);
    assert_eq!(support.version, Some(CgroupVersion::V2));
    assert!(support.writable, "{support:?}");
    assert!(support.controllers.iter().any(|c| c == "memory"));

    let (cg, features) = SandboxCgroup::create(
        root,
        "sandcell",
        "sb1",
        &limits(Some(64 * MIB), Some(8), Some(1500)),
    )
    .unwrap();
    let dir = root.join("sandcell/sb1");
    assert_eq!(cg.version(), CgroupVersion::V2);
    assert_eq!(cg.paths(), std::slice::from_ref(&dir));
    assert_eq!(
        read(root.join("cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    assert_eq!(
        read(root.join("sandcell/cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    assert_eq!(read(dir.join("memory.max")), (64 * MIB).to_string());
    assert_eq!(read(dir.join("memory.swap.max")), "0");
    assert_eq!(read(dir.join("pids.max")), "8");
    assert_eq!(read(dir.join("cpu.max")), "150000 100000");
    // Only the process that blew the limit should die, not the whole sandbox.
    assert!(!dir.join("memory.oom.group").exists());
    for name in ["cgroups", "memory_limit", "pids_limit", "cpu_limit"] {
        assert_eq!(
            state_of(&features, name),
            FeatureState::Active,
            "{features:?}"
        );
    }
    let detail = &features[0].detail;
    assert!(
        detail.starts_with("v2 at ") && detail.contains("sandcell/sb1"),
        "{detail}"
    );

    fs::write(
        dir.join("memory.events"),
        "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n",
    )
    .unwrap();
    fs::write(dir.join("pids.events"), "max 5\n").unwrap();
    fs::write(
        dir.join("cpu.stat"),
        "usage_usec 12345\nuser_usec 10000\nsystem_usec 2345\n",
    )
    .unwrap();
    fs::write(dir.join("memory.current"), "1048576\n").unwrap();
    fs::write(dir.join("memory.peak"), "2097152\n").unwrap();
    fs::write(dir.join("pids.current"), "3\n").unwrap();
    let expected = Counters {
        oom_kills: 2,
        pids_limit_hits: 5,
        memory_bytes: Some(MIB),
        memory_peak_bytes: Some(2 * MIB),
        cpu_usage_us: Some(12345),
        pids_current: Some(3),
    };
    assert_eq!(cg.counters(), expected);

    let again = SandboxCgroup::open(cg.paths()).unwrap();
    assert_eq!(again.version(), CgroupVersion::V2);
    assert_eq!(again.paths(), cg.paths());
    assert_eq!(again.counters(), expected);

    // The same id twice would share a cgroup: refused.
    let err = SandboxCgroup::create(root, "sandcell", "sb1", &Limits::default()).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
}

#[test]
fn fake_v2_without_cpu_or_swap_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    fs::write(root.join("cgroup.controllers"), "memory pids\n").unwrap();
    // Already enabled: nothing needs writing at the root.
    fs::write(root.join("cgroup.subtree_control"), "memory pids\n").unwrap();
    let (cg, features) =
        SandboxCgroup::create(root, "a/b", "sb2", &limits(None, Some(4), Some(500))).unwrap();
    assert_eq!(read(root.join("cgroup.subtree_control")), "memory pids");
    assert_eq!(read(root.join("a/cgroup.subtree_control")), "+memory +pids");
    assert_eq!(
        read(root.join("a/b/cgroup.subtree_control")),
        "+memory +pids"
    );
    assert_eq!(state_of(&features, "memory_limit"), FeatureState::Disabled);
    assert_eq!(state_of(&features, "pids_limit"), FeatureState::Active);
    assert_eq!(state_of(&features, "cpu_limit"), FeatureState::Unavailable);
    assert_eq!(cg.counters(), Counters::default());
    assert!(!cg.paths()[0].join("memory.max").exists());

    let (_, features) =
        SandboxCgroup::create(root, "a/b", "sb3", &limits(None, None, None)).unwrap();
    let cpu = features.iter().find(|f| f.name == "cpu_limit").unwrap();
    assert_eq!(cpu.state, FeatureState::Disabled);
    assert_eq!(cpu.detail, "no cpu quota requested");
}

#[test]
fn fake_v1_tree_without_swap_accounting() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for c in ["memory", "pids", "cpu", "cpuacct"] {
        fs::create_dir(root.join(c)).unwrap();
    }
    let support = detect(root);
    assert_eq!(support.version, Some(CgroupVersion::V1));
    assert_eq!(support.controllers, ["memory", "pids", "cpu", "cpuacct"]);
    assert!(support.writable);

    let (cg, features) = SandboxCgroup::create(
        root,
        "sandcell",
        "sb",
        &limits(Some(32 * MIB), Some(16), Some(5)),
    )
    .unwrap();
    assert_eq!(cg.version(), CgroupVersion::V1);
    // The hierarchies a limit needs (memory, pids and, a quota is asked, cpu) and cpuacct,
    // which tells the sandbox's CPU use.
    assert_eq!(cg.paths().len(), 4);
    assert!(root.join("cpuacct/sandcell/sb").exists());
    let memory = root.join("memory/sandcell/sb");
    assert_eq!(
        read(memory.join("memory.limit_in_bytes")),
        (32 * MIB).to_string()
    );
    // No memory.memsw.* (swap accounting off): no swapping instead, reported as weaker.
    assert_eq!(read(memory.join("memory.swappiness")), "0");
    assert_eq!(state_of(&features, "memory_limit"), FeatureState::Degraded);
    assert_eq!(read(root.join("pids/sandcell/sb/pids.max")), "16");
    // 5 thousandths of a cpu is below the kernel's 1 ms quota minimum.
    assert_eq!(read(root.join("cpu/sandcell/sb/cpu.cfs_quota_us")), "1000");
    assert_eq!(
        read(root.join("cpu/sandcell/sb/cpu.cfs_period_us")),
        "100000"
    );
    assert_eq!(state_of(&features, "cpu_limit"), FeatureState::Degraded);
    let detail = &features[0].detail;
    assert!(
        detail.contains("/{memory,pids,cpu,cpuacct}/sandcell/sb"),
        "{detail}"
    );

    fs::write(
        memory.join("memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
    )
    .unwrap();
    let c = cg.counters();
    assert_eq!(c.oom_kills, 4);
    // CPU use comes from the cpuacct group.
    fs::write(root.join("cpuacct/sandcell/sb/cpuacct.usage"), "2500000\n").unwrap();
    assert_eq!(cg.counters().cpu_usage_us, Some(2500));
    assert_eq!(c.pids_limit_hits, 0);
}

#[test]
fn real_create_join_kill_remove() {
    if !real_cgroups() {
        return;
    }
    let (cg, features) = create_real("basic", &limits(Some(64 * MIB), Some(32), Some(1500)));
    let cg = &cg.0;
    eprintln!("{features:#?}");
    for name in ["cgroups", "memory_limit", "pids_limit", "cpu_limit"] {
        assert_ne!(
            state_of(&features, name),
            FeatureState::Unavailable,
            "{features:?}"
        );
    }
    match cg.version() {
        CgroupVersion::V1 => {
            assert_eq!(
                read(file_of(cg, "memory.limit_in_bytes")),
                (64 * MIB).to_string()
            );
            if let Some(memsw) = cg
                .paths()
                .iter()
                .map(|p| p.join("memory.memsw.limit_in_bytes"))
                .find(|p| p.exists())
            {
                assert_eq!(read(memsw), (64 * MIB).to_string());
            }
            assert_eq!(read(file_of(cg, "cpu.cfs_quota_us")), "150000");
            assert_eq!(read(file_of(cg, "cpu.cfs_period_us")), "100000");
        }
        CgroupVersion::V2 => {
            assert_eq!(read(file_of(cg, "memory.max")), (64 * MIB).to_string());
            assert_eq!(read(file_of(cg, "cpu.max")), "150000 100000");
        }
    }
    assert_eq!(read(file_of(cg, "pids.max")), "32");

    let mut child = spawn_in(cg, "exec sleep 30");
    let pid = child.id();
    assert!(cg.pids().contains(&pid), "{:?}", cg.pids());
    assert!(cg.counters().pids_current.unwrap_or(0) >= 1);

    // The host side re-opens the same cgroup from the reported paths.
    let host = SandboxCgroup::open(cg.paths()).unwrap();
    assert_eq!(host.version(), cg.version());
    assert_eq!(host.paths(), cg.paths());
    assert_eq!(host.pids(), cg.pids());

    let started = Instant::now();
    host.kill_all().unwrap();
    eprintln!("kill_all took {:?}", started.elapsed());
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert!(cg.pids().is_empty());
    cg.remove().unwrap();
    for p in cg.paths() {
        assert!(!p.exists(), "{} still there", p.display());
    }
}

#[test]
fn real_oom_kill_is_counted() {
    if !real_cgroups() {
        return;
    }
    require!(Path::new(PYTHON).exists(), "no {PYTHON}");
    let (cg, features) = create_real("oom", &limits(Some(64 * MIB), None, None));
    let cg = &cg.0;
    require!(
        state_of(&features, "memory_limit") == FeatureState::Active,
        "no memory limit: {features:?}"
    );
    assert_eq!(cg.counters().oom_kills, 0);
    let mut child = spawn_in(
        cg,
        &format!("exec {PYTHON} -c 'a = bytearray(400 * 2**20)'"),
    );
    let status = child.wait().unwrap();
    let counters = cg.counters();
    eprintln!("status {status:?}, counters {counters:?}");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(counters.oom_kills >= 1, "{counters:?}");
    assert!(
        counters.memory_peak_bytes.unwrap_or(0) <= 64 * MIB,
        "{counters:?}"
    );
}

#[test]
fn real_pids_limit_is_counted() {
    if !real_cgroups() {
        return;
    }
    let (cg, features) = create_real("pids", &limits(None, Some(8), None));
    let cg = &cg.0;
    assert_eq!(state_of(&features, "pids_limit"), FeatureState::Active);
    let mut child = spawn_in(cg, "for i in $(seq 20); do sleep 5 & done; wait");
    let hit = wait_until(Duration::from_secs(3), || {
        cg.counters().pids_limit_hits >= 1
    });
    let counters = cg.counters();
    eprintln!("counters {counters:?}, pids {:?}", cg.pids());
    assert!(hit, "{counters:?}");
    assert!(counters.pids_current.unwrap_or(0) <= 8, "{counters:?}");
    cg.kill_all().unwrap();
    let _ = child.wait().unwrap();
    assert!(cg.pids().is_empty());
    cg.remove().unwrap();
}

/// The launcher's pattern, in a child process of this test binary so that moving the
/// calling process cannot catch other tests' children: create, join yourself, start the
/// sandbox (it inherits the cgroup), then kill_all() and remove() from inside.
#[test]
fn real_launcher_joins_itself() {
    if !real_cgroups() {
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "launcher_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SANDCELL_CGROUP_LAUNCHER_CHILD", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("launcher child ok"), "{text}");
}

#[test]
fn launcher_child() {
    if std::env::var_os("SANDCELL_CGROUP_LAUNCHER_CHILD").is_none() {
        return;
    }
    let before = fs::read_to_string("/proc/self/cgroup").unwrap();
    let (cg, _) = create_real("launcher", &limits(Some(64 * MIB), Some(16), None));
    let cg = &cg.0;
    let me = std::process::id();
    cg.join(me).unwrap();
    assert!(cg.pids().contains(&me));
    let mut sandbox = Command::new("sleep").arg("30").spawn().unwrap();
    assert!(cg.pids().contains(&sandbox.id()));
    cg.kill_all().unwrap();
    assert_eq!(sandbox.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert!(!cg.pids().contains(&me));
    // Back where it came from, not merely at the hierarchy root.
    assert_eq!(fs::read_to_string("/proc/self/cgroup").unwrap(), before);
    cg.remove().unwrap();
    assert!(cg.paths().iter().all(|p| !p.exists()));
    eprintln!("launcher child ok");
}

#[test]
fn a_child_moves_itself_through_files_its_parent_opened() {
    if !real_cgroups() {
        return;
    }
    let id = unique_id("selfjoin");
    let (cg, _) = SandboxCgroup::create(
        Path::new(ROOT),
        PARENT,
        &id,
        &limits(Some(64 * MIB), Some(16), None),
    )
    .unwrap();
    let cg = Cleanup(cg);
    let Some(files) = cg.0.self_join_files() else {
        skip!("self-join is for cgroup v1");
    };
    let (ready_r, ready_w) = nix::unistd::pipe().unwrap();
    // SAFETY: the child only writes to already-open files and a pipe, then waits to be killed.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let code = match sandcell_jail::cgroup::join_self(files) {
                Ok(()) => 0,
                Err(_) => 1,
            };
            let _ = nix::unistd::write(&ready_w, &[code]);
            loop {
                nix::unistd::pause();
            }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(files);
            let mut byte = [9u8];
            nix::unistd::read(&ready_r, &mut byte).unwrap();
            let membership = fs::read_to_string(format!("/proc/{child}/cgroup")).unwrap();
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(child, None);
            assert_eq!(byte[0], 0, "join_self failed");
            let lines: Vec<&str> = membership.lines().filter(|l| l.contains(&id)).collect();
            assert_eq!(lines.len(), cg.0.paths().len(), "{membership}");
        }
    }
}

#[test]
fn real_pause_stops_a_cpu_loop_and_resume_continues_it() {
    if !real_cgroups() {
        return;
    }
    let (cg, _) = create_real("pause", &limits(None, Some(32), None));
    let cg = &cg.0;
    let mut child = spawn_in(cg, "while :; do :; done");
    let cpu = || cg.counters().cpu_usage_us.expect("cpu usage of the cgroup");
    assert!(wait_until(Duration::from_secs(5), || cpu() > 20_000));
    assert_eq!(cg.paused(), Some(false));

    let started = Instant::now();
    cg.pause(Duration::from_secs(1)).unwrap();
    eprintln!("pause took {:?}", started.elapsed());
    assert_eq!(cg.paused(), Some(true));
    let frozen_at = cpu();
    sleep(Duration::from_millis(300));
    // At most a tick of accounting in flight when it froze.
    assert!(
        cpu() - frozen_at < 5_000,
        "{} µs while paused",
        cpu() - frozen_at
    );
    assert!(
        cg.pids().contains(&child.id()),
        "a paused process must stay"
    );

    let started = Instant::now();
    cg.resume();
    eprintln!("resume took {:?}", started.elapsed());
    assert_eq!(cg.paused(), Some(false));
    let resumed_at = cpu();
    assert!(wait_until(Duration::from_secs(5), || cpu() > resumed_at + 20_000));

    // A paused cgroup can still be killed outright.
    cg.pause(Duration::from_secs(1)).unwrap();
    cg.kill_all().unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
}

/// A shell that forks `sleep` every millisecond (dash forks with vfork): on cgroup v1 a
/// freeze that catches a vforked child before its exec never completed on its own, and
/// one pause in ~60 failed after a whole second. Every pause must succeed, quickly.
#[test]
fn real_pause_succeeds_every_time_on_a_forking_shell_loop() {
    if !real_cgroups() {
        return;
    }
    let (cg, _) = create_real("pause-forks", &limits(None, Some(64), None));
    let cg = &cg.0;
    let mut child = spawn_in(cg, "while :; do sleep 0.001; done");
    assert!(wait_until(Duration::from_secs(5), || cg.pids().len() > 1));
    let mut slowest = Duration::ZERO;
    for i in 0..400 {
        let started = Instant::now();
        cg.pause(Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("pause {i}: {e}"));
        slowest = slowest.max(started.elapsed());
        assert_eq!(cg.paused(), Some(true));
        cg.resume();
        sleep(Duration::from_millis(2));
    }
    eprintln!("400 pauses of a forking loop, the slowest {slowest:?}");
    cg.kill_all().unwrap();
    let _ = child.wait();
}
