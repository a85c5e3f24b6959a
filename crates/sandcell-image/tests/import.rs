//! Imports of every supported kind, built in the test: a root filesystem tarball (plain and
//! gzip), a `docker save` archive whose second layer deletes a file, an OCI layout (a folder
//! and an archive of it); each written out again and compared. Bad files get clear errors.

use std::fs;
use std::io::Write;
use std::path::Path;

use sandcell_image::store::{LAYER_TAR, oci_architecture};
use sandcell_image::{ImageError, Store, flatten, import};

/// A tar of `files` (path, contents; a trailing `/` makes a folder, `-> target` a link).
fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, contents) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        if let Some(dir) = path.strip_suffix('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, dir, std::io::empty()).expect("dir");
        } else if let Some(target) = contents.strip_prefix("-> ") {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            b.append_link(&mut h, path, target).expect("link");
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(contents.len() as u64);
            b.append_data(&mut h, path, contents.as_bytes())
                .expect("file");
        }
    }
    b.into_inner().expect("tar")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

fn read(root: &Path, rel: &str) -> Option<String> {
    fs::read_to_string(root.join(rel)).ok()
}

const ROOTFS: &[(&str, &str)] = &[
    ("usr/", ""),
    ("usr/bin/", ""),
    ("usr/bin/tool", "#!/bin/sh\necho tool\n"),
    ("bin", "-> usr/bin"),
    ("etc/", ""),
    ("etc/os-release", "ID=test\n"),
];

#[test]
fn a_root_filesystem_tarball_plain_or_gzip() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::open(tmp.path().join("store")).expect("store");
    for (name, bytes) in [("plain", tar_of(ROOTFS)), ("gz", gzip(&tar_of(ROOTFS)))] {
        let file = tmp.path().join(format!("rootfs-{name}.tar"));
        fs::write(&file, &bytes).expect("write");
        let got = import(&store, &file, &format!("base-{name}"), None).expect("import");
        assert_eq!((got.format, got.layers), ("rootfs", 1));
        let out = tmp.path().join(format!("out-{name}"));
        flatten(&store, &format!("base-{name}"), &out).expect("flatten");
        assert_eq!(
            read(&out, "usr/bin/tool").as_deref(),
            Some("#!/bin/sh\necho tool\n")
        );
        assert_eq!(
            fs::read_link(out.join("bin")).expect("link"),
            Path::new("usr/bin")
        );
    }
    // Stored uncompressed: the same layer either way.
    let plain = store.image("base-plain").expect("i").expect("plain");
    let gz = store.image("base-gz").expect("i").expect("gz");
    assert_eq!(plain.manifest.layers, gz.manifest.layers);
    assert_eq!(plain.manifest.layers[0].media_type, LAYER_TAR);
}

#[test]
fn a_docker_save_archive_with_a_deleting_layer() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::open(tmp.path().join("store")).expect("store");
    let layer2 = tar_of(&[
        ("etc/.wh.os-release", ""),
        ("app/", ""),
        ("app/main.py", "print(1)\n"),
    ]);
    let config = serde_json::json!({"architecture": oci_architecture(), "os": "linux",
        "config": {"Env": ["PATH=/usr/bin"], "Cmd": ["python3"]},
        "rootfs": {"type": "layers", "diff_ids": []}});
    let manifest = serde_json::json!([{
        "Config": "cfg.json",
        "RepoTags": ["ubuntu:22.04"],
        "Layers": ["l1/layer.tar", "l2/layer.tar"],
    }]);
    let layer1 = tar_of(ROOTFS);
    let layer2_gz = gzip(&layer2);
    let archive = {
        let mut b = tar::Builder::new(Vec::new());
        for (path, bytes) in [
            (
                "manifest.json",
                serde_json::to_vec(&manifest).expect("json"),
            ),
            ("cfg.json", serde_json::to_vec(&config).expect("json")),
            ("l1/layer.tar", layer1),
            ("l2/layer.tar", layer2_gz),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(bytes.len() as u64);
            b.append_data(&mut h, path, bytes.as_slice())
                .expect("append");
        }
        b.into_inner().expect("tar")
    };
    let file = tmp.path().join("ubuntu.tar");
    fs::write(&file, archive).expect("write");
    let got = import(&store, &file, "ubuntu:22.04", None).expect("import");
    assert_eq!((got.format, got.layers), ("docker-save", 2));
    let image = store.image("ubuntu:22.04").expect("i").expect("found");
    assert_eq!(image.config["config"]["Cmd"][0], "python3");
    let out = tmp.path().join("out");
    flatten(&store, "ubuntu:22.04", &out).expect("flatten");
    assert_eq!(read(&out, "app/main.py").as_deref(), Some("print(1)\n"));
    assert_eq!(
        read(&out, "etc/os-release"),
        None,
        "deleted by the second layer"
    );
    assert!(out.join("usr/bin/tool").is_file());
    // A tag the archive lacks: the error lists what it has.
    let e = import(&store, &file, "x", Some("debian:12")).expect_err("no such tag");
    assert!(e.to_string().contains("ubuntu:22.04"), "{e}");
}

#[test]
fn an_oci_layout_as_a_folder_and_as_an_archive() {
    let tmp = tempfile::tempdir().expect("tmp");
    // The source: a layout with two images, made by a store of its own.
    let src = Store::open(tmp.path().join("src")).expect("src");
    let base = src.put_bytes(&tar_of(ROOTFS), LAYER_TAR).expect("layer");
    let extra = src
        .put_bytes(&tar_of(&[("srv/", ""), ("srv/data", "42")]), LAYER_TAR)
        .expect("layer");
    let config = serde_json::json!({"architecture": oci_architecture(), "os": "linux"});
    src.tag("one", std::slice::from_ref(&base), &config)
        .expect("tag");
    src.tag("two", &[base, extra], &config).expect("tag");

    let store = Store::open(tmp.path().join("store")).expect("store");
    let e = import(&store, src.root(), "mine", None).expect_err("which one");
    assert!(e.to_string().contains("one, two"), "{e}");
    let got = import(&store, src.root(), "mine", Some("two")).expect("import folder");
    assert_eq!((got.format, got.layers), ("oci-layout", 2));
    let out = tmp.path().join("out");
    flatten(&store, "mine", &out).expect("flatten");
    assert_eq!(read(&out, "srv/data").as_deref(), Some("42"));

    // The same layout as an archive (what `skopeo copy … oci-archive:` writes).
    let archive = tmp.path().join("layout.tar");
    let mut b = tar::Builder::new(fs::File::create(&archive).expect("create"));
    b.append_dir_all(".", src.root()).expect("append");
    b.finish().expect("finish");
    drop(b);
    let got = import(&store, &archive, "from-archive", Some("one")).expect("import archive");
    assert_eq!((got.format, got.layers), ("oci-archive", 1));

    // A blob changed in the source: refused, naming it.
    let image = src.image("one").expect("i").expect("one");
    let blob = src.blob_path(&image.manifest.layers[0].digest).expect("p");
    fs::write(&blob, b"tampered").expect("tamper");
    let e = import(&store, src.root(), "bad", Some("one")).expect_err("corrupt");
    assert!(matches!(e, ImageError::Corrupt(_)), "{e}");
}

#[test]
fn what_is_not_an_image_is_refused_clearly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::open(tmp.path().join("store")).expect("store");
    let junk = tmp.path().join("junk.bin");
    fs::write(&junk, vec![7u8; 4096]).expect("write");
    let e = import(&store, &junk, "x", None).expect_err("junk");
    assert!(
        e.to_string().contains("not a tar archive") || e.to_string().contains("holds no files"),
        "{e}"
    );
    let folder = tmp.path().join("folder");
    fs::create_dir_all(&folder).expect("mkdir");
    let e = import(&store, &folder, "x", None).expect_err("folder");
    assert!(e.to_string().contains("not an OCI image layout"), "{e}");
    let e = flatten(&store, "missing", &tmp.path().join("o")).expect_err("missing");
    assert!(e.to_string().contains("no image named 'missing'"), "{e}");
    let e = import(&store, &tmp.path().join("nope.tar"), "x", None).expect_err("missing file");
    assert!(matches!(e, ImageError::Io { .. }), "{e}");
}
