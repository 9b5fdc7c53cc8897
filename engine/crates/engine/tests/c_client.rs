//! The C program of the client crate (every call of peregrine.h), linked
//! against libperegrine.so, run against three real engines.

mod common;
use common::*;
use std::process::Command;

#[test]
fn c_program_against_real_engines() {
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
    let (exe, engine_dir) = build_c_program("peregrine_test", c.dir.path());
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
