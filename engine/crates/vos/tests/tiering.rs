//! Where a target keeps a value (`StorageOptions::scm_value_max`): below
//! the bound in RAM (the SCM tier, made durable by the WAL), from it up in
//! device blocks; either way it reads back as written.

mod common;

use common::*;
use peregrine_vos::*;

const LATEST: u64 = u64::MAX;

/// With `scm_value_max` lowered, a small file's data goes to a device block
/// instead of RAM, and reads back as written: single and array values,
/// after a new version, after a crash and replay, and in the pool's space accounting
/// (the SCM tier is charged the record only, the NVMe tier a block).
#[test]
fn values_from_scm_value_max_up_go_to_the_device() {
    let mut e = env(64, 1);
    e.opts.scm_value_max = 1024;
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 7, 0);
    let space = |st: &Storage| {
        let s = st.pool_space(pool).unwrap();
        (s.scm_total - s.scm_free, s.nvme_total - s.nvme_free)
    };
    let (scm0, nvme0) = space(&st);
    let entry = pattern(1, 200);
    update(&st, &o, 10, "d", vec![single("inode", &entry)]).unwrap();
    let (scm1, nvme1) = space(&st);
    assert_eq!(nvme1, nvme0, "a 200-byte value stays in RAM");
    assert!(scm1 >= scm0 + 200, "{scm0} -> {scm1}");

    let data = pattern(2, 3901);
    update(&st, &o, 11, "c", vec![extent("d", 0, &data)]).unwrap();
    let (scm2, nvme2) = space(&st);
    assert_eq!(nvme2, nvme1 + 4096, "a 3901-byte value takes a block");
    assert!(
        scm2 - scm1 < 1024,
        "and not its size in RAM: {scm1} -> {scm2}"
    );
    let small = pattern(3, 1024);
    update(&st, &o, 12, "d", vec![single("x", &small)]).unwrap();
    assert_eq!(
        space(&st).1,
        nvme2 + 4096,
        "1024 bytes: at the bound, to the device"
    );

    let check = |st: &Storage, data: &[u8]| {
        assert_eq!(get_single(st, &o, LATEST, "d", "inode").unwrap(), entry);
        assert_eq!(get_single(st, &o, LATEST, "d", "x").unwrap(), small);
        let (got, size) = get_array(st, &o, LATEST, "c", "d", 0, 3901).unwrap();
        assert_eq!((got.as_slice(), size), (data, 3901));
        assert_eq!(
            get_array(st, &o, LATEST, "c", "d", 100, 50).unwrap().0,
            data[100..150]
        );
    };
    check(&st, &data);
    let data2 = pattern(4, 3901);
    update(&st, &o, 13, "c", vec![extent("d", 0, &data2)]).unwrap();
    check(&st, &data2);
    assert_eq!(get_array(&st, &o, 11, "c", "d", 0, 3901).unwrap().0, data);

    // As a crash leaves it: no closing checkpoint, so replay reads the WAL.
    st.abandon();
    let st = Storage::open(&e.opts).unwrap();
    check(&st, &data2);
    assert_eq!(get_array(&st, &o, 11, "c", "d", 0, 3901).unwrap().0, data);
}
