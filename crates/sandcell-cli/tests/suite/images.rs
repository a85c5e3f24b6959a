//! `sandcell image` through the real binary, on a home of its own: a root filesystem tarball
//! imported, listed, inspected, removed and pruned; bad input refused with a clear message
//! and a failing status, the store unchanged.

use std::process::Command;

use super::common::BIN;

/// `sandcell image ARGS --home HOME`: exit code, stdout, stderr.
pub(super) fn sandcell(home: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("image")
        .args(args)
        .arg("--home")
        .arg(home)
        .output()
        .expect("run sandcell");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `tarball`: the folder `dir`'s contents as a tar (gzip when the name ends `.gz`).
pub(super) fn tar_folder(dir: &std::path::Path, tarball: &std::path::Path) {
    let flags = if tarball.extension().is_some_and(|e| e == "gz") {
        "-czf"
    } else {
        "-cf"
    };
    let status = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .arg(flags)
        .arg(tarball)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success(), "tar {}", dir.display());
}

#[test]
fn images_are_imported_listed_inspected_removed_and_pruned() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let rootfs = tmp.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("usr/bin")).unwrap();
    std::fs::write(rootfs.join("usr/bin/hello"), "#!/bin/sh\necho hello\n").unwrap();
    let tarball = tmp.path().join("rootfs.tar.gz");
    tar_folder(&rootfs, &tarball);
    let file = tarball.to_str().unwrap();

    let (code, out, err) = sandcell(&home, &["import", file, "--as", "mybase:v1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        format!("imported {file} (rootfs, 1 layer) as mybase:v1")
    );
    let (code, out, _) = sandcell(&home, &["ls", "--json"]);
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list[0]["name"], "mybase:v1");
    assert_eq!(list[0]["layers"], 1);
    let (code, out, _) = sandcell(&home, &["inspect", "mybase:v1", "--json"]);
    assert_eq!(code, 0);
    let image: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(image["config"]["os"], "linux");
    // The store is an OCI layout: the manifest named in index.json is the one shown.
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(home.join("images/index.json")).unwrap())
            .unwrap();
    assert_eq!(index["manifests"][0]["digest"], image["digest"]);

    // Bad input: clear errors, a failing status, nothing changed.
    for (args, needle) in [
        (
            vec!["import", "/etc/hostname", "--as", "x"],
            "not a tar archive",
        ),
        (
            vec!["import", file, "--as", "Bad Name"],
            "not a template or image name",
        ),
        (vec!["inspect", "nope"], "no image named 'nope'"),
        (vec!["rm", "nope"], "no image named 'nope'"),
        (
            vec!["base", "ubuntu:22.04"],
            "sandcell image import FILE --as ubuntu:22.04",
        ),
    ] {
        let (code, _, err) = sandcell(&home, &args);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let (_, out, _) = sandcell(&home, &["ls", "--json"]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        list
    );

    let (code, out, _) = sandcell(&home, &["rm", "mybase:v1"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("removed mybase:v1"), "{out}");
    let (code, out, _) = sandcell(&home, &["prune", "--json"]);
    assert_eq!(code, 0);
    let pruned: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(pruned["blobs"], 3, "layer, config, manifest: {pruned}");
    let (_, out, _) = sandcell(&home, &["ls", "--json"]);
    assert_eq!(out.trim(), "[]");
}
