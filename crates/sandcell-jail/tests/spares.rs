//! Things made ahead of time for sandboxes, against the real system (skipped without root):
//! network namespaces, cgroups, and the mounted root skeleton.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sandcell_jail::Limits;
use sandcell_jail::cgroup::spares::CgroupSpares;
use sandcell_jail::cgroup::{SandboxCgroup, detect};
use sandcell_jail::netns_pool::NetnsPool;
use sandcell_jail::rootfs::skeleton::{self, RootLayout};
use sandcell_testkit::require;

fn root() -> bool {
    let ok = nix::unistd::geteuid().is_root();
    if !ok {
        sandcell_testkit::skip::skip("needs root");
    }
    ok
}

/// The inode of a namespace file (two namespaces are the same iff these are).
fn ns_inode(path: impl AsRef<Path>) -> u64 {
    fs::metadata(path).expect("a namespace file").ino()
}

#[test]
fn a_pooled_network_namespace_is_fresh_has_lo_up_and_goes_to_one_taker() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pool = NetnsPool::new(dir.path().join("netns"));
    // Runs in a thread of its own: refill moves the calling thread into new namespaces.
    let made = std::thread::spawn({
        let pool = pool.clone();
        move || pool.refill(2).unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(made, 2);
    let a = pool.take().expect("a spare");
    let b = pool.take().expect("a second spare");
    assert!(pool.take().is_none(), "only two were made");
    let host = ns_inode("/proc/thread-self/ns/net");
    let inode = |fd| rustix::fs::fstat(fd).unwrap().st_ino;
    let (ia, ib) = (inode(&a.fd), inode(&b.fd));
    assert!(ia != host && ib != host && ia != ib, "{ia} {ib} {host}");
    // lo is up inside: seen from a thread that enters it.
    let up = std::thread::spawn(move || {
        nix::sched::setns(&a.fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        // With lo down, connecting to a loopback listener fails (network unreachable).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let connected = std::net::TcpStream::connect(listener.local_addr().unwrap()).is_ok();
        a.remove_entry();
        connected
    })
    .join()
    .unwrap();
    assert!(
        up,
        "cannot connect over loopback in a pooled namespace: lo is down"
    );
    b.remove_entry();
    // Taken entries leave nothing behind: no files, no mounts.
    let left: Vec<_> = fs::read_dir(dir.path().join("netns"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let _ = nix::mount::umount2(&dir.path().join("netns"), nix::mount::MntFlags::MNT_DETACH);
    assert!(
        !mounts.contains(&format!("{}/ns-", dir.path().join("netns").display())),
        "{mounts}"
    );
}

#[test]
fn a_spare_cgroup_is_taken_once_limited_renamed_and_recorded() {
    if !root() {
        return;
    }
    let support = detect(Path::new("/sys/fs/cgroup"));
    require!(
        support.version.is_some() && support.writable,
        "{}",
        support.reason.unwrap_or_default()
    );
    let dir = tempfile::tempdir().unwrap();
    let spares = CgroupSpares::new(dir.path().join("cgroups"));
    let root = Path::new("/sys/fs/cgroup");
    assert_eq!(spares.refill(root, "sandcell-test", 2).unwrap(), 2);
    assert_eq!(
        spares.refill(root, "sandcell-test", 2).unwrap(),
        0,
        "already full"
    );
    let mut cg = spares.take().expect("a spare");
    let other = spares.take().expect("another spare");
    assert!(spares.take().is_none());
    let id = format!("test-spare-{}", std::process::id());
    cg.rename(&id);
    let limits = Limits {
        memory_bytes: Some(64 << 20),
        pids: Some(32),
        ..Limits::default()
    };
    let features = cg.limit(&limits).unwrap();
    assert!(
        features.iter().any(|f| f.name == "memory_limit"),
        "{features:?}"
    );
    let memory = cg
        .paths()
        .iter()
        .find_map(|p| {
            ["memory.limit_in_bytes", "memory.max"]
                .iter()
                .find_map(|f| fs::read_to_string(p.join(f)).ok())
        })
        .expect("a memory limit file");
    assert_eq!(memory.trim(), (64u64 << 20).to_string());
    if cg.version() == sandcell_jail::cgroup::CgroupVersion::V1 {
        assert!(
            cg.paths().iter().all(|p| p.ends_with(&id)),
            "{:?}",
            cg.paths()
        );
    }
    // The record another process gets describes the same cgroup; a forged one is refused.
    let copy = SandboxCgroup::from_record(cg.record()).unwrap();
    assert_eq!(copy.paths(), cg.paths());
    let mut forged = cg.record();
    forged["dirs"][0]["path"] = forged["dirs"][0]["hierarchy"].clone();
    forged["paths"][0] = forged["dirs"][0]["hierarchy"].clone();
    assert!(SandboxCgroup::from_record(forged).is_err());
    for c in [cg, other] {
        c.remove().unwrap();
        assert!(c.paths().iter().all(|p| !p.exists()));
    }
}

#[test]
fn a_mounted_skeleton_holds_its_binds_and_is_remounted_when_one_is_gone() {
    if !root() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().join("rootfs");
    let system = vec!["/usr".to_string(), "/etc/ssl".to_string()];
    let layout = RootLayout {
        system_root: std::path::Path::new("/"),
        system_paths: &system,
        etc_files: &[],
        tmpfs_paths: &["/workspace"],
    };
    let s = skeleton::prepare(&dir, &layout, true).unwrap();
    assert!(s.mounted);
    assert!(skeleton::missing_mounts(&s).is_empty());
    assert!(s.dir.join("usr/bin/env").exists(), "/usr is not bound in");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        s.dir
            .join("dev/null")
            .metadata()
            .unwrap()
            .file_type()
            .is_char_device()
    );
    // Read-only on the host side too.
    assert!(fs::write(s.dir.join("usr/sandcell-probe"), "x").is_err());
    // Someone unmounts a bind: the next prepare puts it back.
    nix::mount::umount2(&s.dir.join("etc/ssl"), nix::mount::MntFlags::MNT_DETACH).unwrap();
    assert_eq!(skeleton::missing_mounts(&s).len(), 1);
    let again = skeleton::prepare(&dir, &layout, true).unwrap();
    assert_eq!(again.dir, s.dir);
    // prepare checks only the first and the last mount (two calls on every start); a full
    // check and repair is `sandcell doctor`'s.
    skeleton::repair(&dir, &again).unwrap();
    assert!(skeleton::missing_mounts(&again).is_empty());
    // Clean up the host mounts the test made.
    let _ = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH);
}
