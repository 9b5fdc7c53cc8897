//! The C program of the client crate (every call of peregrine.h), linked
//! against libperegrine.so, run against three real engines.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn c_program_against_real_engines() {
    let engine_dir = PathBuf::from(ENGINE_BIN).parent().unwrap().to_path_buf();
    let lib = engine_dir.join("libperegrine.so");
    assert!(
        lib.exists(),
        "{} missing: run `cargo build --workspace` first (make test does)",
        lib.display()
    );
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = root.join("crates/client/tests/c/peregrine_test.c");
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        },
        256,
        "SX",
        "crc32c",
    );
    let exe = c.dir.path().join("peregrine_test");
    let cc = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(root.join("include"))
        .arg("-L")
        .arg(&engine_dir)
        .arg("-lperegrine")
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe)
        .args([&c.mgmt_addr(), "pool", "cont"])
        // Admin: the program also takes a snapshot (SnapCreate, admin only).
        .envs(c.admin_env())
        .env("LD_LIBRARY_PATH", &engine_dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "C test failed:\n{text}\nlogs:\n{}",
        c.logs()
    );
}
