//! Compiles the preload library that makes coreutils work under this gVisor build
//! (shim/gvisor_compat.c); the backend embeds it and installs it next to the agent.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "shim/gvisor_compat.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("libsandcell-gvisor-compat.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| {
            panic!("run {cc} (a C compiler, which Rust's linker needs anyway): {e}")
        });
    assert!(status.success(), "{cc} could not compile {src}");
}
