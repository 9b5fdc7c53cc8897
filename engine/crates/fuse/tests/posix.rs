//! The POSIX suite (`peregrine-posix-suite`, src/bin/posix_suite/) through
//! a real peregrine-fuse mount over real engines, twice: on the kernel path,
//! then with `LD_PRELOAD=libperegrine_il.so PEREGRINE_IL_REPORT=1`. Both runs
//! must pass, print the same transcript (every check's observation), and
//! leave identical trees; the library's report must show that the data
//! calls of the second run were intercepted. And twice more on the kernel
//! path, the daemon taking its requests over FUSE over io_uring and over
//! /dev/fuse: the same transcript and trees again.

mod common;

use common::mount::{fuse_available, fuse_io_uring_available, FuseMount};
use common::*;
use peregrine_proto::mgmt::{ContCreateReq, PoolCreateReq};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const SUITE: &str = env!("CARGO_BIN_EXE_peregrine-posix-suite");

/// target/<profile>, from this test's own path (target/<profile>/deps/x).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// libperegrine_il.so, brought up to date with `cargo build -p
/// peregrine-il` (`cargo test -p peregrine-fuse` does not build it; cargo
/// makes this a no-op when it is current).
fn il_so() -> PathBuf {
    let t = Instant::now();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "peregrine-il", "--lib"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    if target_dir().file_name().unwrap() == "release" {
        cmd.arg("--release");
    }
    let out = cmd.output().expect("cargo");
    assert!(
        out.status.success(),
        "cargo build -p peregrine-il: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let so = target_dir().join("libperegrine_il.so");
    assert!(so.exists(), "{} missing after the build", so.display());
    eprintln!("{} ready in {:?}", so.display(), t.elapsed());
    so
}

/// Pool `label` of `mib` MiB (NVMe; 4 MiB SCM) with a POSIX container `cont`.
fn add_pool(c: &Cluster, label: &str, mib: u64) {
    let mut m = c.mgmt();
    c.rt.block_on(m.pool_create(PoolCreateReq {
        label: label.into(),
        scm_size: 4 << 20,
        nvme_size: mib << 20,
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("pool create {label}: {e}\n{}", c.logs()));
    c.rt.block_on(m.cont_create(ContCreateReq {
        pool: label.into(),
        label: "cont".into(),
        oclass: "SX".into(),
        checksum: "crc32c".into(),
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("cont create in {label}: {e}"));
}

/// Summed `peregrine-il[pid]: intercepted k=v ...` lines.
fn report(stderr: &str) -> (usize, BTreeMap<String, u64>) {
    let mut lines = 0;
    let mut m = BTreeMap::new();
    for l in stderr.lines().filter(|l| l.starts_with("peregrine-il[")) {
        lines += 1;
        for (k, v) in l.split_whitespace().filter_map(|kv| kv.split_once('=')) {
            *m.entry(k.to_string()).or_insert(0) += v.parse::<u64>().unwrap_or(0);
        }
    }
    (lines, m)
}

struct Run {
    stdout: String,
    stderr: String,
}

fn run_suite(dir: &Path, ro: &Path, full: &Path, preload: Option<&Path>) -> Run {
    let mut cmd = Command::new(SUITE);
    cmd.arg(dir).arg("--ro").arg(ro).arg("--full").arg(full);
    match preload {
        Some(so) => cmd.env("LD_PRELOAD", so).env("PEREGRINE_IL_REPORT", "1"),
        None => cmd
            .env_remove("LD_PRELOAD")
            .env_remove("PEREGRINE_IL_REPORT"),
    };
    cmd.env_remove("PEREGRINE_IL_DISABLE");
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let r = Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!(
        "suite {} ({}): {:?}, {}",
        dir.display(),
        if preload.is_some() {
            "LD_PRELOAD"
        } else {
            "kernel path"
        },
        t.elapsed(),
        r.stderr
            .lines()
            .find(|l| l.contains("checks"))
            .unwrap_or("")
    );
    assert!(
        out.status.success(),
        "suite in {} failed ({}):\n{}\n--- stderr ---\n{}",
        dir.display(),
        out.status,
        r.stdout,
        r.stderr
    );
    r
}

/// Everything but times about a tree, by relative path (through the
/// kernel: this process has no preloaded library).
fn describe(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let md = fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let what = if ft.is_symlink() {
                format!("link -> {}", fs::read_link(&p).unwrap().display())
            } else if ft.is_dir() {
                stack.push(p.clone());
                format!("dir nlink {}", md.nlink())
            } else if !ft.is_file() {
                // FIFOs, sockets, device nodes: never opened here.
                format!(
                    "special {:o} rdev {:x} nlink {}",
                    md.mode() & libc::S_IFMT,
                    md.rdev(),
                    md.nlink()
                )
            } else {
                let b = fs::read(&p).unwrap();
                format!("file {} bytes sum {:x}", b.len(), fnv(&b))
            };
            let xattrs = if ft.is_symlink() || !(ft.is_file() || ft.is_dir()) {
                String::new()
            } else {
                xattrs(&p)
            };
            out.insert(
                rel,
                format!(
                    "{what} mode {:o} owner {}:{}{xattrs}",
                    md.mode(),
                    md.uid(),
                    md.gid()
                ),
            );
        }
    }
    out
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn xattrs(p: &Path) -> String {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: `c` is a NUL-terminated path and `names` a live buffer of the length passed.
    let n = unsafe { libc::listxattr(c.as_ptr(), names.as_mut_ptr() as *mut _, names.len()) };
    assert!(n >= 0, "listxattr {}", p.display());
    let mut s = String::new();
    let mut list: Vec<&[u8]> = names[..n as usize]
        .split(|&b| b == 0)
        .filter(|x| !x.is_empty())
        .collect();
    list.sort();
    for name in list {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        let k =
            // SAFETY: `c` and `cn` are NUL-terminated CStrings, `v` a live buffer of the
            // length passed, all alive for the call.
            unsafe { libc::getxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr() as *mut _, v.len()) };
        assert!(k >= 0, "getxattr {}", p.display());
        s += &format!(
            " {}={:x}",
            String::from_utf8_lossy(name),
            fnv(&v[..k as usize])
        );
    }
    s
}

/// One engine with the suite's container, and a small pool per run named in
/// `full` (for ENOSPC).
fn suite_cluster(full: [&str; 2]) -> Cluster {
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 1,
            targets: 2,
            device_mib: 1024,
            scm_mib: 256,
        },
        256,
        "SX",
        "crc32c",
    );
    for label in full {
        add_pool(&c, label, 32);
    }
    c
}

#[test]
fn posix_suite_with_and_without_the_interception_library() {
    if !fuse_available() {
        return;
    }
    let so = il_so();
    let t0 = Instant::now();
    let c = suite_cluster(["full-plain", "full-il"]);
    let tmp = tempfile::tempdir().unwrap();
    let mut rw = FuseMount::start(&c, "cont", &tmp.path().join("rw"), &[]);
    let mut ro = FuseMount::start(&c, "cont", &tmp.path().join("ro"), &["--read-only"]);
    let mut full_plain = FuseMount::start_on(&c, "full-plain", "cont", &tmp.path().join("fp"), &[]);
    let mut full_il = FuseMount::start_on(&c, "full-il", "cont", &tmp.path().join("fi"), &[]);
    eprintln!("cluster and 4 mounts up in {:?}", t0.elapsed());

    fs::create_dir(rw.p("plain")).unwrap();
    fs::create_dir(rw.p("il")).unwrap();
    let plain = run_suite(&rw.p("plain"), &ro.p("plain"), &full_plain.dir, None);
    assert_eq!(
        report(&plain.stderr).0,
        0,
        "a report without the library:\n{}",
        plain.stderr
    );
    let il = run_suite(&rw.p("il"), &ro.p("il"), &full_il.dir, Some(&so));

    // The library was there and took the data calls.
    let (lines, r) = report(&il.stderr);
    eprintln!("interception report: {r:?}");
    assert_eq!(lines, 1, "one report line expected:\n{}", il.stderr);
    for k in [
        "opens",
        "reads",
        "writes",
        "seeks",
        "stats",
        "syncs",
        "truncates",
        "dups",
        "closes",
        "stdio",
        "mmaps",
        // Path calls, served by default (PEREGRINE_IL_METADATA unset).
        "path_stats",
        "path_access",
        "path_opens",
        "path_creates",
        "mkdirs",
        "unlinks",
        "rmdirs",
        "renames",
    ] {
        assert!(r[k] > 0, "nothing intercepted for {k}: {r:?}");
    }
    assert!(
        r["bytes_written"] >= 16 << 20 && r["bytes_read"] >= 8 << 20,
        "{r:?}"
    );
    assert_eq!(r["fallbacks"], 0, "{r:?}");

    assert_same_runs(&plain, &il, &rw.p("plain"), &rw.p("il"));

    for m in [&mut rw, &mut ro, &mut full_plain, &mut full_il] {
        m.stop();
        assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
    }
    eprintln!("total {:?}", t0.elapsed());
}

/// Two runs of the suite saw the same: their observations line for line, and
/// the trees they left, read back through the kernel by this process.
fn assert_same_runs(a: &Run, b: &Run, tree_a: &Path, tree_b: &Path) {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.stdout.lines().collect(), b.stdout.lines().collect());
    assert!(
        la.len() > 300,
        "only {} checks ran:\n{}",
        la.len(),
        a.stdout
    );
    for (i, (x, y)) in la.iter().zip(&lb).enumerate() {
        assert_eq!(x, y, "transcripts differ at line {}", i + 1);
    }
    assert_eq!(la.len(), lb.len(), "transcripts differ in length");
    let (ta, tb) = (describe(tree_a), describe(tree_b));
    assert!(ta.len() > 900, "{} entries", ta.len());
    for (k, v) in &ta {
        assert_eq!(Some(v), tb.get(k), "{k} differs between the runs");
    }
    assert_eq!(ta.len(), tb.len(), "the trees differ: {:?}", {
        let mut extra: Vec<&String> = tb.keys().filter(|k| !ta.contains_key(*k)).collect();
        extra.truncate(10);
        extra
    });
}

#[test]
fn posix_suite_over_fuse_io_uring_and_over_dev_fuse() {
    if !fuse_io_uring_available() {
        return;
    }
    let c = suite_cluster(["full-ring", "full-dev"]);
    let tmp = tempfile::tempdir().unwrap();
    let t = |n: &str| tmp.path().join(n);
    // rw, ro and a full pool's mount for each transport: io_uring, then /dev/fuse.
    let mut mounts: Vec<FuseMount> = [("ring", "on"), ("dev", "off")]
        .into_iter()
        .flat_map(|(name, io)| {
            let flag = ["--io-uring", io];
            [
                FuseMount::start(&c, "cont", &t(name), &flag),
                FuseMount::start(
                    &c,
                    "cont",
                    &t(&format!("{name}-ro")),
                    &[&flag[..], &["--read-only"]].concat(),
                ),
                FuseMount::start_on(
                    &c,
                    &format!("full-{name}"),
                    "cont",
                    &t(&format!("{name}-full")),
                    &flag,
                ),
            ]
        })
        .collect();
    for (i, m) in mounts.iter().enumerate() {
        let want = if i < 3 {
            "FUSE over io_uring)"
        } else {
            "/dev/fuse)"
        };
        assert!(
            m.log().contains(want),
            "transport of mount {i}: {}",
            m.log()
        );
    }
    let [ring, ring_ro, ring_full, dev, dev_ro, dev_full] = &mounts[..] else {
        unreachable!("six mounts")
    };
    fs::create_dir(ring.p("ring")).unwrap();
    fs::create_dir(ring.p("dev")).unwrap();
    let a = run_suite(&ring.p("ring"), &ring_ro.p("ring"), &ring_full.dir, None);
    let b = run_suite(&dev.p("dev"), &dev_ro.p("dev"), &dev_full.dir, None);
    assert_same_runs(&a, &b, &ring.p("ring"), &ring.p("dev"));
    for m in &mut mounts {
        m.stop();
        let log = m.log();
        assert!(
            !log.contains("panicked") && !log.contains("refused"),
            "daemon log: {log}"
        );
    }
}
