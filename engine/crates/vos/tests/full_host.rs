//! A file-backed device on a host file system that runs out of space: the
//! device write fails under a commit. The update gets a clear error, the
//! target refuses further updates (the device's state is unknown), reads
//! of acknowledged data keep working, and after a restart every
//! acknowledged update is there. The WAL's blocks are reserved when the
//! device opens, so it is a data write that fails, never the WAL's; a host
//! without room for the WAL fails the opening, naming it.

mod common;

use common::*;
use peregrine_vos::*;

const LATEST: u64 = u64::MAX;

#[test]
fn opening_reserves_the_wal_or_fails_naming_it() {
    let Some(dir) = tmpfs_host(24) else {
        return;
    };
    // A 256 MiB device with one target has a WAL of 31 MiB: format writes
    // headers only and fits, but 24 MiB of host space cannot hold the WAL.
    let opts = options(&dir.path().join("nvme0.img"), 256, 1);
    let sb = format(&opts, "test", 0, false).unwrap();
    assert!(sb.wal_bytes > 24 * MIB, "{}", sb.wal_bytes);
    let e = Storage::open(&opts).err().expect("no room for the WAL");
    let msg = e.to_string();
    assert!(
        msg.contains("target 0's WAL") && msg.contains("os error 28"),
        "the error names the WAL and ENOSPC: {msg}"
    );

    // With room, the WAL's blocks are the host's from the opening on.
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&dir.path().join("nvme0.img"), 256, 2);
    let sb = format(&opts, "test", 0, false).unwrap();
    let allocated = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().blocks() * 512
    };
    assert!(
        allocated(&opts.bdev.path) < sb.wal_bytes,
        "sparse after format"
    );
    let st = Storage::open(&opts).unwrap();
    assert!(allocated(&opts.bdev.path) >= 2 * sb.wal_bytes);
    st.close();
    // A second opening finds them reserved.
    Storage::open(&opts).unwrap().close();
}

#[test]
fn a_failed_device_write_stops_updates_and_loses_nothing_acknowledged() {
    let Some(dir) = tmpfs_host(64) else {
        return;
    };
    // A sparse 256 MiB device on 64 MiB of host space, of which its WAL
    // takes 31.
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
