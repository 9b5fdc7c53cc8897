//! An engine whose device write fails (here: its emulated NVMe file sits on
//! a host file system that fills up) answers the write with a clear error,
//! refuses further updates, and says so in `storage scan` (state
//! "degraded", the reason in the message) for the operator to report.

mod common;
use common::*;
use peregrine_proto::mgmt::*;
use peregrine_proto::{ObjectClass, ObjectId};
use std::process::Command;

struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_failed_device_write_shows_in_storage_scan() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let c = Cluster::start(ClusterSpec {
        engines: 1,
        targets: 1,
        device_mib: 256,
        scm_mib: 64,
    });
    // Before the format creates it, point the 256 MiB device file at 40 MiB of host space.
    let host = tempfile::tempdir().unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=40m", "tmpfs"])
        .arg(host.path())
        .status()
        .unwrap();
    assert!(ok.success(), "mount tmpfs");
    let _m = Tmpfs(host.path().to_path_buf());
    let dev = &c.engines[0].device;
    let _ = std::fs::remove_file(dev);
    std::os::unix::fs::symlink(host.path().join("nvme0.img"), dev).unwrap();
    c.format();
    let mut m = c.mgmt();
    c.rt.block_on(m.pool_create(PoolCreateReq {
        label: "pool".into(),
        scm_size: 8 << 20,
        nvme_size: 128 << 20,
        ..Default::default()
    }))
    .unwrap();
    c.rt.block_on(m.cont_create(ContCreateReq {
        pool: "pool".into(),
        label: "cont".into(),
        oclass: "S1".into(),
        ..Default::default()
    }))
    .unwrap();
    let scan = |m: &mut mgmt_client::MgmtClient<_>| {
        c.rt.block_on(m.storage_scan(StorageScanReq {}))
            .unwrap()
            .into_inner()
            .ranks
            .remove(0)
    };
    assert_eq!(scan(&mut m).state(), StorageState::Ready);

    let obj = c
        .container()
        .object(ObjectId::new(ObjectClass::S1, 1, 1))
        .unwrap();
    let val = pattern(1, 1 << 20);
    let mut written = 0;
    let err = loop {
        match obj.update_array(format!("d{written}").as_bytes(), b"a", 0, &val) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 100, "40 MiB of host space took {written} MiB");
    };
    assert_eq!(err.code, -libc::EIO, "{err}");
    assert!(err.msg.contains("device write failed"), "{err}");
    let rs = scan(&mut m);
    assert_eq!(rs.state(), StorageState::Degraded, "{rs:?}");
    assert!(
        rs.message.contains("device write failed") && rs.message.contains("os error 28"),
        "{rs:?}"
    );
    // Acknowledged data still reads.
    for i in 0..written {
        assert_eq!(
            obj.fetch_array(format!("d{i}").as_bytes(), b"a", 0, val.len())
                .unwrap(),
            val
        );
    }
}
