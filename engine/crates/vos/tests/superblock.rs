//! Two copies of the superblock: a damaged copy is reported and rewritten
//! from the other at open; a device formatted with one copy still opens
//! and gets its second.

mod common;

use common::*;
use peregrine_vos::*;
use std::os::unix::fs::FileExt;

const COPY_B: u64 = 512 * 1024;

fn block(e: &Env, off: u64) -> Vec<u8> {
    let f = std::fs::File::open(&e.opts.bdev.path).unwrap();
    let mut b = vec![0u8; 4096];
    f.read_exact_at(&mut b, off).unwrap();
    b
}

fn put(e: &Env, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&e.opts.bdev.path)
        .unwrap();
    f.write_all_at(bytes, off).unwrap();
}

#[test]
fn format_writes_two_identical_copies() {
    let e = env(32, 1);
    assert_eq!(block(&e, 0), block(&e, COPY_B));
    assert!(block(&e, 0).starts_with(b"PRGNVOS1"));
    let st = Storage::open(&e.opts).unwrap();
    assert!(st.repairs().is_empty(), "{:?}", st.repairs());
}

#[test]
fn a_damaged_copy_is_reported_and_rewritten() {
    for (damaged, other) in [(0, COPY_B), (COPY_B, 0)] {
        let e = env(32, 1);
        let good = block(&e, other);
        let (st, pool, cont) = open_with_pool(&e, MIB);
        let o = Obj::new(pool, cont, 1, 0);
        update(&st, &o, 10, "k", vec![single("a", b"kept")]).unwrap();
        st.close();
        // A flipped byte in the body of one copy.
        let mut b = block(&e, damaged);
        b[40] ^= 0x10;
        put(&e, damaged, &b);
        assert!(matches!(
            scan(&e.opts.bdev).unwrap(),
            ScanState::Formatted(_)
        ));
        let st = Storage::open(&e.opts).unwrap();
        let r = st.repairs().join("\n");
        assert!(
            r.contains(&format!("copy at offset {damaged} was"))
                && r.contains("bad CRC")
                && r.contains(&format!("from the copy at offset {other}")),
            "{r}"
        );
        assert_eq!(block(&e, damaged), good, "rewritten");
        assert_eq!(get_single(&st, &o, u64::MAX, "k", "a").unwrap(), b"kept");
        st.close();
        assert!(Storage::open(&e.opts).unwrap().repairs().is_empty());
    }
}

#[test]
fn a_single_copy_device_opens_and_gets_its_second_copy() {
    let e = env(32, 1);
    // As formatted before there were two copies: no generation, no copy B.
    let mut a = block(&e, 0);
    a[20..32].fill(0);
    put(&e, 0, &a);
    put(&e, COPY_B, &[0u8; 4096]);
    let st = Storage::open(&e.opts).unwrap();
    let r = st.repairs().join("\n");
    assert!(
        r.contains("before superblocks had two copies") && r.contains("missing"),
        "{r}"
    );
    drop(st);
    assert_eq!(block(&e, 0), block(&e, COPY_B));
    assert_ne!(block(&e, 0)[20..32], [0u8; 12], "a generation now");
}

#[test]
fn another_file_system_over_the_start_is_not_overridden_by_copy_b() {
    let e = env(32, 1);
    let mut start = vec![0u8; 4096];
    start[1080] = 0x53;
    start[1081] = 0xEF;
    put(&e, 0, &start);
    assert!(matches!(
        scan(&e.opts.bdev).unwrap(),
        ScanState::Foreign(s) if s.contains("ext4")
    ));
    assert!(Storage::open(&e.opts).is_err());
}
