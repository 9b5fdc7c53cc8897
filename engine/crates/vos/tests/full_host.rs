//! A file-backed device on a host file system that runs out of space: the
//! device write fails under a commit. The update gets a clear error, the
//! target refuses further updates (the device's state is unknown), reads
//! of acknowledged data keep working, and after a restart every
//! acknowledged update is there.

mod common;

use common::*;
use peregrine_vos::*;
use std::process::Command;

const LATEST: u64 = u64::MAX;

struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_failed_device_write_stops_updates_and_loses_nothing_acknowledged() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=40m", "tmpfs"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(ok.success(), "mount tmpfs");
    let _m = Tmpfs(dir.path().to_path_buf());
    // A sparse 256 MiB device on 40 MiB of host space.
    let opts = options(&dir.path().join("nvme0.img"), 256, 1);
    format(&opts, "test", 0, false).unwrap();
    let e = Env {
        dir: tempfile::tempdir().unwrap(),
        opts,
    };
    let (st, pool, cont) = open_with_pool(&e, 128 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let mut acked = Vec::new();
    let mut failure = None;
    for i in 0..100u64 {
        let v = pattern(i, 1 << 20);
        match update(&st, &o, 10 + i, &format!("k{i}"), vec![single("v", &v)]) {
            Ok(()) => acked.push((i, v)),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let failure = failure.expect("40 MiB of host space cannot take 100 MiB of values");
    assert_eq!(failure.code, -libc::EIO, "{failure}");
    assert!(
        failure.msg.contains("device write failed") && failure.msg.contains("os error 28"),
        "the error names the failed device write and ENOSPC: {failure}"
    );
    assert!(acked.len() > 10, "only {} updates fit", acked.len());
    let faults = st.faults();
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert!(faults[0].contains("device write failed"), "{faults:?}");
    // From now on updates are refused with the same reason, small ones too.
    let again = update(&st, &o, 500, "small", vec![single("v", b"x")]).unwrap_err();
    assert!(again.msg.contains("refuses updates"), "{again}");
    // What was acknowledged reads back.
    for (i, v) in &acked {
        assert_eq!(
            &get_single(&st, &o, LATEST, &format!("k{i}"), "v").unwrap(),
            v
        );
    }
    st.close();
    // Restart on the still-full host file system (the closing checkpoint
    // may fail; replay does not need it): every acknowledged update is there.
    let st = Storage::open(&e.opts).unwrap();
    assert!(st.faults().is_empty(), "a restart starts afresh");
    for (i, v) in &acked {
        assert_eq!(
            &get_single(&st, &o, LATEST, &format!("k{i}"), "v").unwrap(),
            v,
            "k{i} after restart"
        );
    }
}
