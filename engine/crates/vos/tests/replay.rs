//! Integration tests of the store on real device files: what a restart
//! finds (WAL replay after wraps, torn and stale records, the management
//! blob) and what format refuses.

mod common;

use common::*;
use peregrine_vos::*;
use std::os::unix::fs::FileExt;
use uuid::Uuid;

const LATEST: u64 = u64::MAX;

#[test]
fn replay_and_checkpoints_after_wal_wraps() {
    // ~3000 one-block WAL records (12 MiB of WAL) force several checkpoints.
    wraps(WalIo::Direct, 3000, None);
}

#[test]
fn replay_and_checkpoints_after_a_packed_wal_wraps() {
    // Packed records of ~200-900 bytes: 16,000 of them fill ~8 MiB, and
    // their versions, without aggregation, more than the pool's metadata.
    wraps(WalIo::PageCache, 16_000, Some(2000));
}

/// Write `records` updates (aggregating every `aggregate` of them), then
/// replay them after `kill -9`.
fn wraps(wal: WalIo, records: u64, aggregate: Option<u64>) {
    let mut e = env(40, 1); // 32 MiB target region: 4 MiB WAL
    e.opts.wal_io = wal;
    let (st, pool, cont) = open_with_pool(&e, 8 * MIB);
    let o = Obj::new(pool, cont, 3, 0);
    for i in 0..records {
        let v = pattern(i, 50 + (i as usize % 700));
        let mut vals = vec![single("s", &v)];
        if i % 50 == 0 {
            vals.push(extent("big", i * 10, &pattern(i, 5000)));
        }
        update(&st, &o, 100 + i, &format!("k{}", i % 400), vals).unwrap();
        if aggregate.is_some_and(|n| i % n == n - 1) {
            st.aggregate(pool).unwrap();
        }
    }
    punch(&st, &o, 100 + records + 1000, "k7", &[]).unwrap();
    let stats = st.target_stats();
    assert!(stats[0].checkpoints >= 3, "{stats:?}");
    assert!(
        stats[0].wal_tail > 0,
        "records after the last checkpoint: {stats:?}"
    );
    let snapshot = |st: &Storage| -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        for k in list_all(st, &o, LATEST, "", 1000) {
            let k = String::from_utf8(k).unwrap();
            out.push((
                k.clone().into_bytes(),
                get_single(st, &o, LATEST, &k, "s").unwrap(),
            ));
        }
        out.push((
            b"big".to_vec(),
            get_array(st, &o, LATEST, "k0", "big", 0, 200_000)
                .unwrap()
                .0,
        ));
        out
    };
    let before = snapshot(&st);
    let space = st.pool_space(pool).unwrap();
    assert_eq!(before.len(), 400, "399 dkeys (one punched) + the array");
    st.abandon(); // no closing checkpoint: replay has to use checkpoint + WAL
    let st = Storage::open(&e.opts).unwrap();
    assert!(
        snapshot(&st) == before,
        "replayed state equals the state before"
    );
    assert_eq!(st.target_stats()[0].seq, stats[0].seq);
    assert_eq!(st.pool_space(pool).unwrap(), space);
    if aggregate.is_none() {
        assert_eq!(
            get_single(&st, &o, 150, "k10", "s").unwrap(),
            pattern(10, 60),
            "old versions replayed too"
        );
    }
    // And it keeps working after replay (allocator rebuilt from the index).
    update(
        &st,
        &o,
        100 + records + 2000,
        "k1",
        vec![single("s", &pattern(9, 9000))],
    )
    .unwrap();
    assert_eq!(
        get_single(&st, &o, LATEST, "k1", "s").unwrap(),
        pattern(9, 9000)
    );
    assert_eq!(
        get_array(&st, &o, LATEST, "k0", "big", 0, 200_000)
            .unwrap()
            .0,
        before[399].1
    );
}

#[test]
fn a_small_index_checkpoints_every_64_mib_of_wal_not_at_half_a_large_wal() {
    let mut e = env(2048, 1); // a 255 MiB WAL
    e.opts.wal_io = WalIo::Direct; // a record per block: 64 MiB in 16,384
    let (st, pool, cont) = open_with_pool(&e, 8 * MIB);
    let o = Obj::new(pool, cont, 3, 0);
    for i in 0..17_000u64 {
        update(&st, &o, 10 + i, "k", vec![single("s", &pattern(i, 100))]).unwrap();
    }
    let stats = st.target_stats()[0];
    assert_eq!(stats.checkpoints, 1, "{stats:?}");
    assert!(stats.wal_tail < 4 * MIB, "{stats:?}");
    st.abandon();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(
        get_single(&st, &o, LATEST, "k", "s").unwrap(),
        pattern(16_999, 100)
    );
    assert_eq!(st.target_stats()[0].seq, stats.seq);
    st.close();
}

#[test]
fn a_wal_switched_between_page_cache_and_direct_keeps_every_record() {
    let mut e = env(40, 1);
    e.opts.wal_io = WalIo::PageCache;
    let (st, pool, cont) = open_with_pool(&e, 8 * MIB);
    let o = Obj::new(pool, cont, 3, 0);
    let put = |st: &Storage, keys: std::ops::Range<u64>| {
        for i in keys {
            let v = pattern(i, 100 + i as usize % 300);
            update(st, &o, 10 + i, &format!("k{i}"), vec![single("s", &v)]).unwrap();
        }
    };
    let check = |st: &Storage, n: u64| {
        for i in 0..n {
            assert_eq!(
                get_single(st, &o, LATEST, &format!("k{i}"), "s").unwrap(),
                pattern(i, 100 + i as usize % 300),
                "k{i} of {n}"
            );
        }
    };
    put(&st, 0..50);
    let tail = st.target_stats()[0].wal_tail;
    assert!(
        tail % 4096 != 0 && tail < 50 * 4096,
        "packed records: {tail}"
    );
    st.abandon();
    // O_DIRECT records start on a block: the opening checkpoints first,
    // so the next record is not where replay would not look for it.
    e.opts.wal_io = WalIo::Direct;
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(st.target_stats()[0].wal_tail, 0);
    check(&st, 50);
    put(&st, 50..100);
    assert_eq!(st.target_stats()[0].wal_tail, 50 * 4096);
    st.abandon();
    e.opts.wal_io = WalIo::PageCache;
    let st = Storage::open(&e.opts).unwrap();
    check(&st, 100);
    put(&st, 100..150);
    st.abandon();
    e.opts.wal_io = WalIo::Direct;
    let st = Storage::open(&e.opts).unwrap();
    check(&st, 150);
    st.close();
}

#[test]
fn torn_last_wal_batch_is_dropped_whole() {
    let e = env(32, 1);
    let (st, pool, cont) = open_with_pool(&e, MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "kept", vec![single("a", b"durable")]).unwrap();
    // One batch whose WAL record spans two blocks.
    update(
        &st,
        &o,
        20,
        "torn",
        vec![
            single("a", &pattern(1, 3000)),
            single("b", &pattern(2, 3000)),
        ],
    )
    .unwrap();
    let stats = st.target_stats()[0];
    let sb = st.superblock().clone();
    st.abandon();
    // Damage the second block of the last record, as a torn write would.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&e.opts.bdev.path)
        .unwrap();
    f.write_all_at(&[0xAA; 100], sb.target_offset + stats.wal_tail - 4096 + 10)
        .unwrap();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(
        get_single(&st, &o, LATEST, "kept", "a").unwrap(),
        b"durable"
    );
    assert_eq!(get_single(&st, &o, LATEST, "torn", "a"), Err(-libc::ENOENT));
    assert_eq!(get_single(&st, &o, LATEST, "torn", "b"), Err(-libc::ENOENT));
    assert_eq!(st.target_stats()[0].seq, stats.seq - 1);
    // The log continues where the valid prefix ended.
    update(&st, &o, 30, "after", vec![single("a", b"x")]).unwrap();
    st.abandon();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "after", "a").unwrap(), b"x");
    assert_eq!(
        get_single(&st, &o, LATEST, "kept", "a").unwrap(),
        b"durable"
    );
}

/// After a crash, records that were in flight past the end replay reaches
/// stay on the device. Once the restarted engine has written its own record
/// where the first missing one was, such a leftover follows it with the
/// very sequence number replay expects next: it must not be taken for the
/// next batch at the following restart (it was never acknowledged, and the
/// restart already reported it lost).
#[test]
fn records_left_over_from_before_a_restart_are_not_replayed() {
    let e = env(32, 1);
    let (st, pool, cont) = open_with_pool(&e, MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "k0", vec![single("a", b"zero")]).unwrap();
    let at_k1 = st.target_stats()[0].wal_tail;
    update(&st, &o, 20, "k1", vec![single("a", b"one!")]).unwrap();
    let at_k2 = st.target_stats()[0].wal_tail;
    update(&st, &o, 30, "k2", vec![single("a", b"two!")]).unwrap();
    let wal = st.superblock().target_offset;
    st.abandon();
    // A crash where k2's record reached the device and k1's did not.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&e.opts.bdev.path)
        .unwrap();
    f.write_all_at(&[0xAA; 64], wal + at_k1).unwrap();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "k0", "a").unwrap(), b"zero");
    assert_eq!(get_single(&st, &o, LATEST, "k1", "a"), Err(-libc::ENOENT));
    assert_eq!(get_single(&st, &o, LATEST, "k2", "a"), Err(-libc::ENOENT));
    // The restart's first record takes k1's place, and k2's old one follows it.
    update(&st, &o, 40, "k1", vec![single("a", b"ONE!")]).unwrap();
    assert_eq!(
        st.target_stats()[0].wal_tail,
        at_k2,
        "a record of the same length"
    );
    st.abandon();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "k1", "a").unwrap(), b"ONE!");
    assert_eq!(
        get_single(&st, &o, LATEST, "k2", "a"),
        Err(-libc::ENOENT),
        "k2's record is a leftover of the first crash"
    );
    // The log goes on from the restart's records.
    update(&st, &o, 50, "k3", vec![single("a", b"3")]).unwrap();
    st.abandon();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "k3", "a").unwrap(), b"3");
    assert_eq!(get_single(&st, &o, LATEST, "k1", "a").unwrap(), b"ONE!");
    assert_eq!(get_single(&st, &o, LATEST, "k2", "a"), Err(-libc::ENOENT));
}

/// Several batches can be in flight at once, and their data and records are
/// written together, so after a power cut a record may be on the device
/// while its data is not: replay drops that batch and every later one
/// (none of them was flushed), and keeps the ones before.
#[test]
fn a_record_whose_data_never_arrived_is_dropped_with_the_later_ones() {
    let e = env(32, 1);
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let vals: Vec<Vec<u8>> = (0..3).map(|i| pattern(100 + i, 64 << 10)).collect();
    for (i, v) in vals.iter().enumerate() {
        update(
            &st,
            &o,
            10 + i as u64,
            &format!("k{i}"),
            vec![single("a", v)],
        )
        .unwrap();
    }
    let seq = st.target_stats()[0].seq;
    st.abandon();
    // "Lose" the data of the middle batch.
    damage(&e, &vals[1]);
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "k0", "a").unwrap(), vals[0]);
    assert_eq!(get_single(&st, &o, LATEST, "k1", "a"), Err(-libc::ENOENT));
    assert_eq!(get_single(&st, &o, LATEST, "k2", "a"), Err(-libc::ENOENT));
    assert_eq!(st.target_stats()[0].seq, seq - 2);
}

#[test]
fn mgmt_blob_is_atomic_and_durable() {
    let e = env(32, 1);
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(st.mgmt_load().unwrap(), None);
    st.mgmt_store(b"first").unwrap();
    let big = pattern(7, 900_000);
    st.mgmt_store(&big).unwrap();
    assert_eq!(st.mgmt_load().unwrap().unwrap(), big);
    assert!(st.mgmt_store(&vec![0u8; 3 << 20]).is_err(), "too large");
    st.close();
    // Tear the newest slot: the previous blob must come back.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&e.opts.bdev.path)
        .unwrap();
    let st = Storage::open(&e.opts).unwrap();
    let sb = st.superblock().clone();
    st.close();
    f.write_all_at(b"garbage", sb.mgmt_offset + sb.mgmt_slot_bytes + 4096 + 10)
        .unwrap();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(st.mgmt_load().unwrap().unwrap(), b"first");
    st.mgmt_store(b"third").unwrap();
    st.close();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(st.mgmt_load().unwrap().unwrap(), b"third");
}

#[test]
fn format_refuses_foreign_and_formatted_devices() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev.img");
    let opts = options(&path, 32, 1);
    assert_eq!(scan(&opts.bdev).unwrap(), ScanState::Unformatted);
    let err = Storage::open(&opts).err().unwrap();
    assert!(err.to_string().contains("not formatted"), "{err}");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(32 * MIB).unwrap();
    f.write_all_at(&[0x53, 0xEF], 1080).unwrap();
    let err = format(&opts, "s", 0, false).unwrap_err();
    assert!(err.to_string().contains("ext4"), "{err}");
    f.write_all_at(&[0, 0], 1080).unwrap();
    f.write_all_at(b"XFSB", 0).unwrap();
    assert!(matches!(scan(&opts.bdev).unwrap(), ScanState::Foreign(w) if w.contains("xfs")));
    f.write_all_at(&[0; 4], 0).unwrap();
    f.write_all_at(&[1], 30_000).unwrap();
    let err = format(&opts, "s", 0, false).unwrap_err();
    assert!(
        err.to_string().contains("non-zero data at offset 30000"),
        "{err}"
    );
    let sb = format(&opts, "sys", 4, true).unwrap();
    assert_eq!(
        (sb.system.as_str(), sb.rank, sb.targets, sb.device_bytes),
        ("sys", 4, 1, 32 * MIB)
    );
    assert_eq!(scan(&opts.bdev).unwrap(), ScanState::Formatted(sb.clone()));
    let err = format(&opts, "sys", 4, false).unwrap_err();
    assert!(err.to_string().contains("already formatted"), "{err}");
    let mut two = opts.clone();
    two.targets = 2;
    let err = Storage::open(&two).err().unwrap();
    assert!(err.to_string().contains("targets"), "{err}");

    // A forced reformat forgets the old store entirely.
    let st = Storage::open(&opts).unwrap();
    let pool = Uuid::new_v4();
    st.pool_create(pool, MIB, MIB).unwrap();
    st.mgmt_store(b"old").unwrap();
    st.close();
    let sb2 = format(&opts, "sys", 4, true).unwrap();
    assert_ne!(sb2.device_uuid, sb.device_uuid);
    let st = Storage::open(&opts).unwrap();
    assert!(st.pools().is_empty());
    assert_eq!(st.mgmt_load().unwrap(), None);
}
