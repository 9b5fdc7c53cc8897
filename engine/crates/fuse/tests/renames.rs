//! Renames through a real mount while the processes under them are killed:
//! each rename is one engine transaction, so whatever dies in the middle
//! (the FUSE daemon, any engine), every file stays there exactly once, under
//! its old or its new name, with its data: never under two names, never lost.

mod common;

use common::mount::{fuse_available, FuseMount as Mount};
use common::*;
use peregrine_proto::mgmt::ContCreateReq;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

const FILES: usize = 16;
/// No kernel caching of names or attributes: every check asks the daemon.
const OPTS: [&str; 4] = ["--attr-timeout", "0", "--dentry-timeout", "0"];

fn body(i: usize) -> Vec<u8> {
    format!("file {i} ").repeat(100 + i).into_bytes()
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> bool {
    let (f, t) = (
        CString::new(from.as_os_str().as_bytes()).unwrap(),
        CString::new(to.as_os_str().as_bytes()).unwrap(),
    );
    // SAFETY: two NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    r == 0
}

/// Files f0.. in `a`, and an empty `b`.
fn populate(m: &Mount) {
    fs::create_dir(m.p("a")).unwrap();
    fs::create_dir(m.p("b")).unwrap();
    for i in 0..FILES {
        fs::write(m.p(&format!("a/f{i}")), body(i)).unwrap();
    }
}

/// Worker `w` of two: moves files between `a` and `b` under `root`, and
/// every third time exchanges a pair, until `stop`; counts the renames that
/// succeeded in `done`.
fn churn(root: &Path, w: usize, stop: &AtomicBool, done: &AtomicUsize) {
    let mut k = w;
    while !stop.load(Ordering::Relaxed) {
        let i = k % FILES;
        k += 2;
        let (a, b) = (root.join(format!("a/f{i}")), root.join(format!("b/f{i}")));
        let ok = if k.is_multiple_of(3) {
            let j = (i + 1) % FILES;
            renameat2(&a, &root.join(format!("b/f{j}")), libc::RENAME_EXCHANGE)
        } else {
            renameat2(&a, &b, 0) || renameat2(&b, &a, 0)
        };
        if ok {
            done.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Run two churning workers over `root` while `during` runs (it kills and
/// restarts what the test is about); the renames that got through.
fn churn_while(root: &Path, during: impl FnOnce()) -> usize {
    let (stop, done) = (AtomicBool::new(false), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for w in 0..2 {
            let (stop, done) = (&stop, &done);
            s.spawn(move || churn(root, w, stop, done));
        }
        during();
        stop.store(true, Ordering::Relaxed);
    });
    done.into_inner()
}

/// Every file is in `a` or `b` exactly once, with its data; the names of the
/// files found in `b`.
fn each_file_once(root: &Path, what: &str) -> usize {
    let mut seen: Vec<Vec<String>> = vec![Vec::new(); FILES];
    let list = |d: &str| -> Vec<String> {
        fs::read_dir(root.join(d))
            .unwrap_or_else(|e| panic!("{what}: {d}: {e}"))
            .map(|x| x.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    for d in ["a", "b"] {
        for name in list(d) {
            let p: PathBuf = root.join(d).join(&name);
            let data = fs::read(&p).unwrap_or_else(|e| {
                panic!(
                    "{what}: {p:?} listed but unreadable: {e}; a: {:?} b: {:?}",
                    list("a"),
                    list("b")
                )
            });
            let id: usize = std::str::from_utf8(&data[5..])
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(data, body(id), "{what}: {p:?} holds damaged data");
            seen[id].push(format!("{d}/{name}"));
        }
    }
    for (id, names) in seen.iter().enumerate() {
        assert_eq!(names.len(), 1, "{what}: file {id} under {names:?}");
    }
    seen.iter().filter(|n| n[0].starts_with('b')).count()
}

/// The daemon SIGKILLed while renames run through it, again and again: after
/// each restart every file is there exactly once with its data.
#[test]
fn renames_survive_a_killed_daemon() {
    if !fuse_available() {
        return;
    }
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 1,
            ..Default::default()
        },
        128,
        "SX",
        "crc32c",
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    let mut m = Mount::start(&c, "cont", &dir, &OPTS);
    populate(&m);
    let mut moved = 0;
    for round in 0..24u64 {
        let root = m.dir.clone();
        moved += churn_while(&root, || {
            // Kill the daemon somewhere in the middle of the renames.
            std::thread::sleep(Duration::from_millis(20 + 13 * round));
            let mut child = m.child.take().unwrap();
            child.kill().unwrap();
            child.wait().unwrap();
        });
        // A new daemon sees each file once (the old mount, stale, detached first).
        drop(m);
        m = Mount::start(&c, "cont", &dir, &OPTS);
        each_file_once(&m.dir, &format!("round {round}"));
    }
    assert!(moved > 0, "no rename ever got through");
    m.stop();
}

/// Each engine in turn SIGKILLed while renames and exchanges run through a
/// mount of a container whose directories and files are replicated on all
/// three engines, the renames going on during the outage, then the engine
/// restarted: every file is there exactly once with its data, through the
/// mount that lived through it and through a new one.
#[test]
fn renames_survive_killed_engines() {
    if !fuse_available() {
        return;
    }
    let mut c = Cluster::replicated(ContCreateReq {
        label: "rp".into(),
        checksum: "crc32c".into(),
        ..Default::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let m = Mount::start(&c, "rp", &tmp.path().join("m"), &OPTS);
    populate(&m);
    let root = m.dir.clone();
    for rank in 0..3 {
        let what = format!("engine {rank} killed");
        let moved = churn_while(&root, || {
            std::thread::sleep(Duration::from_millis(300));
            c.engines[rank].kill9();
            // Renames go on while it is away (they wait for the management
            // service to exclude it, or for rank 0, which runs that service).
            std::thread::sleep(Duration::from_secs(3));
            c.restart(rank);
            std::thread::sleep(Duration::from_secs(1));
        });
        assert!(moved > 0, "{what}: no rename got through");
        each_file_once(&root, &what);
        let fresh = Mount::start(&c, "rp", &tmp.path().join(format!("fresh{rank}")), &OPTS);
        each_file_once(&fresh.dir, &format!("{what}, new mount"));
    }
}
