//! The C ABI as C sees it: `include/peregrine.h` matches the symbols of
//! `libperegrine.so`, and a C program compiled against them links and runs.
//!
//! The C program runs against the system at `PEREGRINE_TEST_MGMT`
//! (pool `PEREGRINE_TEST_POOL`, default "tank"; container
//! `PEREGRINE_TEST_CONT`, default "c1") when set, and always against the
//! in-process fake system.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn header() -> PathBuf {
    crate_dir().join("../../include/peregrine.h")
}

/// The directory of the freshest libperegrine.so: `cargo test` rebuilds
/// target/<profile>/deps/libperegrine.so but only `cargo build` refreshes
/// the copy in target/<profile>/, so take whichever is newer.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    let profile = deps.parent().unwrap().to_path_buf();
    let mtime = |d: &Path| {
        std::fs::metadata(d.join("libperegrine.so"))
            .and_then(|m| m.modified())
            .ok()
    };
    match (mtime(&deps), mtime(&profile)) {
        (Some(a), Some(b)) if b > a => profile,
        (Some(_), _) => deps,
        (None, Some(_)) => profile,
        (None, None) => panic!(
            "libperegrine.so not found in {} or {}",
            deps.display(),
            profile.display()
        ),
    }
}

/// Names of the functions the header declares.
fn declared_functions() -> Vec<String> {
    let text = std::fs::read_to_string(header()).unwrap();
    // Drop comments so prose mentioning prg_foo() does not count.
    let mut code = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("/*") {
        code.push_str(&rest[..i]);
        rest = &rest[i + 2..];
        rest = &rest[rest.find("*/").map(|j| j + 2).unwrap_or(rest.len())..];
    }
    code.push_str(rest);
    let mut names = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    while let Some(off) = code[i..].find("prg_") {
        let start = i + off;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        // Not part of a longer identifier, not a function-pointer typedef `(*prg_x)`.
        let before_ok = start == 0
            || !(b[start - 1].is_ascii_alphanumeric()
                || b[start - 1] == b'_'
                || code[..start].ends_with("(*"));
        if before_ok && end < b.len() && b[end] == b'(' {
            names.push(code[start..end].to_string());
        }
        i = end;
    }
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_header_function_is_exported() {
    let names = declared_functions();
    assert!(names.len() > 25, "parsed only {names:?}");
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib_dir().join("libperegrine.so"))
        .output()
        .expect("run nm");
    assert!(out.status.success());
    let syms = String::from_utf8_lossy(&out.stdout);
    let exported: Vec<&str> = syms
        .lines()
        .filter(|l| l.contains(" T "))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !exported.contains(&n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "declared in peregrine.h but not exported: {missing:?}"
    );
    // And the reverse: no prg_ symbol the header forgot.
    let undeclared: Vec<&&str> = exported
        .iter()
        .filter(|s| s.starts_with("prg_") && !names.iter().any(|n| n == *s))
        .collect();
    assert!(
        undeclared.is_empty(),
        "exported but not declared: {undeclared:?}"
    );
}

fn compile(out_dir: &Path) -> PathBuf {
    let lib = lib_dir();
    let exe = out_dir.join("peregrine_test");
    let st = Command::new("cc")
        .args([
            "-std=c11",
            "-D_POSIX_C_SOURCE=200809L",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-O1",
            "-g",
        ])
        .arg("-I")
        .arg(crate_dir().join("../../include"))
        .arg(crate_dir().join("tests/c/peregrine_test.c"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lperegrine", "-o"])
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling the C test failed");
    exe
}

fn run(exe: &Path, mgmt: &str, pool: &str, cont: &str) {
    // Cargo's LD_LIBRARY_PATH may list target/<profile> (with a stale
    // uplifted copy of the library) first; point the loader at ours.
    let out = Command::new(exe)
        .args([mgmt, pool, cont])
        .env("LD_LIBRARY_PATH", lib_dir())
        // The fake engines speak plain gRPC.
        .env("PEREGRINE_INSECURE", "1")
        .env_remove("PEREGRINE_TLS_DIR")
        .output()
        .expect("run C test");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "C test against {mgmt} failed: {:?}",
        out.status
    );
}

#[test]
fn c_program_compiles_links_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path());
    match std::env::var("PEREGRINE_TEST_MGMT") {
        Ok(mgmt) => {
            let pool = std::env::var("PEREGRINE_TEST_POOL").unwrap_or_else(|_| "tank".into());
            let cont = std::env::var("PEREGRINE_TEST_CONT").unwrap_or_else(|_| "c1".into());
            run(&exe, &mgmt, &pool, &cont);
        }
        Err(_) => {
            println!("PEREGRINE_TEST_MGMT not set: skipping the C test against a real engine")
        }
    }
    // The in-process fake system speaks the real protocols, so the C
    // program exercises the whole library even without engines.
    let fc = peregrine::testkit::FakeCluster::start(3, 2);
    run(&exe, &fc.mgmt_addr, "tank", "c1");
    run(&exe, &fc.mgmt_addr, "tank", "nocsum");
}
