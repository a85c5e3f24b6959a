//! `FROM debian:bookworm` with the machine's Debian mirror: made once with mmdebstrap, then
//! found in the store. The store lives under the build's scratch folder, so later runs find
//! the base there (one download per machine). Needs root and mmdebstrap (installed by
//! scripts/setup.sh); says "skipped" otherwise.

use std::process::Command;

use sandcell_image::{Base, DebianOptions, Store, layer, resolve};

#[test]
fn a_debian_base_is_made_once_from_the_mirror_and_then_found() {
    if !rustix::process::geteuid().is_root() {
        sandcell_testkit::skip::skip("mmdebstrap as used here needs root");
        return;
    }
    if Command::new("mmdebstrap")
        .arg("--version")
        .output()
        .is_err()
    {
        sandcell_testkit::skip::skip("mmdebstrap is not installed (scripts/setup.sh installs it)");
        return;
    }
    let root = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("debian-bases");
    let store = Store::open(&root).expect("store");
    let first = resolve(&store, "debian:bookworm", &DebianOptions::default()).expect("made");
    if let Some(took) = first.made {
        eprintln!("debian:bookworm made in {took:?}");
    }
    let Base::Image(image) = first.base else {
        panic!("not an image: {first:?}");
    };
    assert_eq!(image.manifest.layers.len(), 1);
    let blob = store
        .blob_path(&image.manifest.layers[0].digest)
        .expect("blob");
    let names = layer::entries(&mut std::fs::File::open(&blob).expect("open")).expect("entries");
    for needed in [
        "./etc/debian_version",
        "./usr/bin/apt-get",
        "./usr/bin/dpkg",
    ] {
        assert!(
            names
                .iter()
                .any(|n| n == needed
                    || n.trim_start_matches("./") == needed.trim_start_matches("./")),
            "{needed} missing from the base ({} entries)",
            names.len()
        );
    }
    // Found, not made, the second time (and `debian:12` is another name: not conflated).
    let again = resolve(&store, "debian:bookworm", &DebianOptions::default()).expect("found");
    assert_eq!(again.made, None);
    assert!(matches!(again.base, Base::Image(i) if i.manifest_digest == image.manifest_digest));
}
