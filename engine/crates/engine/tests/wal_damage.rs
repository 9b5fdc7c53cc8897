//! Loud, not silent, on damage, through a real engine (issue 20, point 5):
//! a WAL damaged before a flush makes its target refuse to serve, and the
//! client's requests to it fail with an error naming the target, the WAL
//! offset and what is wrong (never old data); `storage scan` says the same.
//! The scrubber's findings and a rewritten superblock copy show in
//! `storage scan` too.

mod common;
use common::*;
use peregrine_proto::mgmt::*;
use peregrine_proto::{ObjectClass, ObjectId};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

fn spec() -> ClusterSpec {
    ClusterSpec {
        engines: 1,
        targets: 2,
        device_mib: 256,
        scm_mib: 64,
    }
}

fn scan(c: &Cluster) -> RankStorage {
    let mut m = c.mgmt();
    c.rt.block_on(m.storage_scan(StorageScanReq {}))
        .unwrap()
        .into_inner()
        .ranks
        .remove(0)
}

/// Flip one byte of the first copy of `v` on rank 0's device.
fn flip(c: &Cluster, v: &[u8]) {
    let dev = &c.engines[0].device;
    let at = find_bytes(&read_file(dev), v).expect("the bytes are on the device") as u64;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at + 5).unwrap();
    f.write_all_at(&[b[0] ^ 0x04], at + 5).unwrap();
}

#[test]
fn a_damaged_wal_makes_its_target_refuse_clients_and_storage_scan_says_so() {
    let mut c = Cluster::with_pool(spec(), 64, "S1", "crc32c");
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 0, 7)).unwrap();
    // Small values live in the WAL records.
    let victim = pattern(71, 300);
    obj.update_single(b"d0", b"a", &victim).unwrap();
    obj.update_single(b"d1", b"a", &pattern(72, 300)).unwrap();
    obj.flush().unwrap();
    // Its record says d0's was flushed.
    obj.update_single(b"d2", b"a", &pattern(73, 300)).unwrap();
    c.engines[0].kill9();
    flip(&c, &victim);
    c.restart(0);

    let rs = scan(&c);
    assert_eq!(rs.state(), StorageState::Degraded, "{rs:?}");
    assert!(
        rs.message.contains("WAL damaged at offset")
            && rs.message.contains("Refusing to serve this target"),
        "{rs:?}"
    );
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 0, 7)).unwrap();
    for d in ["d0", "d1", "d2"] {
        let err = obj.fetch_single(d.as_bytes(), b"a").unwrap_err();
        assert!(err.msg.contains("WAL damaged"), "{d}: {err}");
    }
    let err = obj.update_single(b"d3", b"a", b"x").unwrap_err();
    assert!(err.msg.contains("WAL damaged"), "{err}");
}

#[test]
fn scrub_findings_and_a_rewritten_superblock_copy_show_in_storage_scan() {
    let mut c = Cluster::with_pool(spec(), 64, "S1", "crc32c");
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 0, 9)).unwrap();
    let val = pattern(91, 64 << 10);
    obj.update_single(b"big", b"a", &val).unwrap();
    c.engines[0].stop();
    // Media damage under the stored value, and in superblock copy A.
    let dev = c.engines[0].device.clone();
    let at = find_bytes(&read_file(&dev), &val).expect("stored") as u64;
    let f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    f.write_all_at(&[0u8; 4096], at).unwrap();
    f.write_all_at(&[0xFF; 8], 100).unwrap();
    c.restart(0);

    let rs = scan(&c);
    assert!(
        rs.repairs.len() == 1 && rs.repairs[0].contains("copy at offset 0"),
        "{rs:?}"
    );
    // The scrubber's first pass starts 10 s after open.
    let deadline = Instant::now() + Duration::from_secs(60);
    let rs = loop {
        let rs = scan(&c);
        if rs.scrub_passes >= 1 {
            break rs;
        }
        assert!(Instant::now() < deadline, "no scrub pass: {rs:?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!((rs.scrub_extents, rs.scrub_damaged), (1, 1), "{rs:?}");
    assert!(
        rs.scrub_damage[0].contains("dkey \"big\"")
            && rs.scrub_damage[0].contains("1 of 16 chunks fail their checksum"),
        "{rs:?}"
    );
    assert_eq!(rs.state(), StorageState::Degraded, "{rs:?}");
    assert!(
        rs.message.contains("scrub found 1 damaged extent"),
        "{rs:?}"
    );
    // The read of it fails with a checksum error, not wrong data.
    assert!(obj.fetch_single(b"big", b"a").is_err());
}
