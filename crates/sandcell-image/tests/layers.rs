//! Layers against a real overlayfs: the changes made through an overlay, captured from its
//! upper folder and applied onto a copy of its lower one, give what the overlay showed; the
//! same image read back by umoci gives it too. Needs root (mounting overlayfs); says
//! "skipped" otherwise.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use sandcell_image::store::{LAYER_TAR, oci_architecture};
use sandcell_image::{ImageError, Store, apply, layer, write_diff};

/// Each path under `root`: `d <mode>`, `f <mode> <content>` or `l <target>`.
fn tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in fs::read_dir(dir).expect("list") {
            let p = e.expect("entry").path();
            let rel = p.strip_prefix(root).expect("rel").display().to_string();
            let m = fs::symlink_metadata(&p).expect("stat");
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                out.insert(
                    rel,
                    format!("l {}", fs::read_link(&p).expect("link").display()),
                );
            } else if m.is_dir() {
                out.insert(rel, format!("d {mode:o} {}", m.uid()));
                walk(root, &p, out);
            } else {
                let content = fs::read_to_string(&p).expect("read");
                out.insert(rel, format!("f {mode:o} {} {content}", m.uid()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, text).expect("write");
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn changes_through_an_overlay_become_a_layer_that_applies_and_umoci_reads() {
    if !is_root() {
        sandcell_testkit::skip::skip("mounting overlayfs needs root");
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let [lower, upper, work, merged] = ["lower", "upper", "work", "merged"].map(|n| {
        let p = tmp.path().join(n);
        fs::create_dir_all(&p).expect("mkdir");
        p
    });
    write(&lower.join("keep.txt"), "old");
    write(&lower.join("gone.txt"), "bye");
    write(&lower.join("dir/old.txt"), "stays");
    write(&lower.join("opaque/a.txt"), "hidden");
    write(&lower.join("opaque/sub/b.txt"), "hidden too");
    write(&lower.join("replaced/x"), "a folder before");
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let status = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(&merged)
        .status()
        .expect("mount");
    assert!(status.success(), "mount overlay");
    let changed = (|| {
        write(&merged.join("new/deep/file.txt"), "new");
        write(&merged.join("keep.txt"), "changed");
        fs::set_permissions(merged.join("keep.txt"), fs::Permissions::from_mode(0o600))?;
        fs::remove_file(merged.join("gone.txt"))?;
        fs::remove_dir_all(merged.join("opaque"))?;
        write(&merged.join("opaque/c.txt"), "only this");
        fs::remove_dir_all(merged.join("replaced"))?;
        write(&merged.join("replaced"), "a file now");
        symlink("keep.txt", merged.join("link"))?;
        write(&merged.join("hl1"), "linked");
        fs::hard_link(merged.join("hl1"), merged.join("hl2"))?;
        Ok::<_, std::io::Error>(tree(&merged))
    })();
    let unmounted = Command::new("umount")
        .arg(&merged)
        .status()
        .expect("umount");
    let want = changed.expect("changes through the overlay");
    assert!(unmounted.success());

    let store = Store::open(tmp.path().join("store")).expect("store");
    let (base, _) = store
        .put_with(LAYER_TAR, |w| write_diff(&lower, w, None))
        .expect("base layer");
    let (diff, stats) = store
        .put_with(LAYER_TAR, |w| write_diff(&upper, w, None))
        .expect("diff layer");
    // A folder replaced by a file needs no whiteout: the file covers it.
    assert_eq!(
        stats.whiteouts, 2,
        "gone.txt and the opaque folder: {stats:?}"
    );
    let names = layer::entries(
        &mut fs::File::open(store.blob_path(&diff.digest).expect("p")).expect("open"),
    )
    .expect("entries");
    for needle in [".wh.gone.txt", "opaque/.wh..wh..opq", "new/deep/file.txt"] {
        assert!(names.iter().any(|n| n == needle), "{needle} in {names:?}");
    }
    // Applied onto a copy of the lower folder: what the overlay showed.
    let root = tmp.path().join("root");
    fs::create_dir_all(&root).expect("root");
    apply(&store.blob_path(&base.digest).expect("p"), &root).expect("apply base");
    assert_eq!(tree(&root), tree(&lower));
    apply(&store.blob_path(&diff.digest).expect("p"), &root).expect("apply diff");
    assert_eq!(tree(&root), want);
    let hl = fs::metadata(root.join("hl1")).expect("hl1").ino();
    assert_eq!(
        fs::metadata(root.join("hl2")).expect("hl2").ino(),
        hl,
        "hard link kept"
    );

    // The same image read back by a standard tool.
    let config = serde_json::json!({
        "architecture": oci_architecture(),
        "os": "linux",
        "config": {"Env": ["A=1"]},
        "rootfs": {"type": "layers", "diff_ids": [base.digest, diff.digest]},
    });
    store.tag("test", &[base, diff], &config).expect("tag");
    let umoci = Command::new("umoci").arg("--version").output();
    if umoci.is_err() {
        sandcell_testkit::skip::skip("umoci is not installed (scripts/setup.sh installs it)");
        return;
    }
    let bundle = tmp.path().join("bundle");
    let out = Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:test", store.root().display()))
        .arg(&bundle)
        .output()
        .expect("umoci");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut read_back = tree(&bundle.join("rootfs"));
    let mut want = want;
    // umoci makes the root folder's mode its own way; compare what is inside.
    read_back.retain(|k, _| !k.is_empty());
    want.retain(|k, _| !k.is_empty());
    assert_eq!(read_back, want);
}

#[test]
fn a_layer_cannot_write_outside_its_root() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(&root).expect("root");
    fs::create_dir_all(&outside).expect("outside");
    let layer_with = |entries: &[(&str, Option<&str>)]| {
        let path = tmp.path().join("layer.tar");
        let mut b = tar::Builder::new(fs::File::create(&path).expect("create"));
        for (name, link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(0);
            match link {
                Some(target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    b.append_link(&mut h, name, target).expect("link");
                }
                None => {
                    h.set_entry_type(tar::EntryType::Regular);
                    // Raw names: the builder itself refuses `..`.
                    let bytes = name.as_bytes();
                    h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
                    h.set_cksum();
                    b.append(&h, std::io::empty()).expect("append");
                }
            }
        }
        b.finish().expect("finish");
        path
    };
    let climbing = layer_with(&[("../outside/evil", None)]);
    assert!(matches!(
        apply(&climbing, &root),
        Err(ImageError::Invalid(_))
    ));
    let through_link = layer_with(&[
        ("esc", Some(outside.to_str().expect("utf8"))),
        ("esc/evil", None),
    ]);
    assert!(apply(&through_link, &root).is_err());
    let whiteout_through_link = layer_with(&[
        ("esc2", Some(outside.to_str().expect("utf8"))),
        ("esc2/.wh.victim", None),
    ]);
    write(&outside.join("victim"), "must stay");
    // The link does not exist yet in pass one; after a first apply it does.
    let _ = apply(&through_link, &root);
    let _ = apply(&whiteout_through_link, &root);
    let _ = apply(&whiteout_through_link, &root);
    assert_eq!(
        fs::read_dir(&outside).expect("list").count(),
        1,
        "nothing written or removed outside"
    );
    assert!(outside.join("victim").exists());
}
