//! The shared harness (crates/testcluster).
#![allow(unused_imports, dead_code)]
pub use peregrine_testcluster::*;

pub mod mount;

/// `sh -c script` in `dir`; its stdout (the script must succeed).
pub fn sh(dir: &std::path::Path, script: &str) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
