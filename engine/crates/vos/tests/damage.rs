//! Loud, not silent, on damage (issue 20, point 5): replay that meets a bad
//! WAL record with intact records after it that say it was flushed refuses
//! to serve the target (an error naming the target, the WAL offset and what
//! is wrong, for every request and in `Storage::fault`), while a torn tail
//! (records after the last flush) is still dropped quietly; a damaged
//! newest checkpoint whose WAL was already reused is refused, not replaced
//! by the older one.

mod common;

use common::*;
use peregrine_vos::*;
use std::os::unix::fs::FileExt;
use std::time::Duration;
use uuid::Uuid;

const LATEST: u64 = u64::MAX;

fn flush(st: &Storage, o: &Obj) {
    wait(
        st,
        Request::Flush(FlushReq {
            addr: o.addr().into(),
        }),
    )
    .unwrap();
}

/// Flip one byte of the first copy of `v` on the device (an inline value
/// inside a WAL record); returns its device offset.
fn flip(e: &Env, v: &[u8]) -> u64 {
    let dev = std::fs::read(&e.opts.bdev.path).unwrap();
    let at = dev
        .windows(v.len())
        .position(|w| w == v)
        .expect("the bytes are on the device") as u64;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&e.opts.bdev.path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at + 3).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at + 3).unwrap();
    at
}

/// Inline values (they live in the WAL records), distinct per key.
fn val(i: u64) -> Vec<u8> {
    pattern(1000 + i, 200)
}

fn iod_a() -> Iod {
    Iod {
        akey: b"a".to_vec(),
        kind: IodKind::Single,
        ..Default::default()
    }
}

fn write(st: &Storage, o: &Obj, keys: std::ops::Range<u64>) {
    for i in keys {
        update(st, o, 10 + i, &format!("k{i}"), vec![single("a", &val(i))]).unwrap();
    }
}

fn wal_region(sb: &Superblock, t: u32) -> std::ops::Range<u64> {
    let start = sb.target_offset + t as u64 * sb.target_bytes;
    start..start + sb.wal_bytes
}

#[test]
fn a_flipped_byte_before_a_flush_makes_the_target_refuse_loudly() {
    let e = env(64, 2);
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let (o0, o1) = (Obj::new(pool, cont, 1, 0), Obj::new(pool, cont, 2, 1));
    write(&st, &o0, 0..6);
    update(&st, &o1, 10, "other", vec![single("a", b"target 1")]).unwrap();
    flush(&st, &o0);
    // Written after the flush: its record stamps the flush of k0..k5.
    write(&st, &o0, 6..7);
    let sb = st.superblock().clone();
    st.abandon();

    let at = flip(&e, &val(2));
    assert!(wal_region(&sb, 0).contains(&at), "k2 is in target 0's WAL");
    let st = Storage::open(&e.opts).expect("the other targets still open");
    let why = st.fault(0).expect("target 0 refuses to serve");
    eprintln!("{why}");
    assert!(
        why.contains("target 0")
            && why.contains("WAL damaged at offset")
            && why.contains("bad payload CRC")
            && why.contains("flushed"),
        "{why}"
    );
    assert!(st.faults().len() == 1 && st.fault(1).is_none());
    // Every request to target 0 fails with that error, none reads old state.
    for k in ["k0", "k1", "k6"] {
        let err = fetch_iods(&st, &o0, LATEST, k, vec![iod_a()]).expect_err("refused");
        assert_eq!(err.code, -libc::EIO);
        assert!(err.msg.contains("WAL damaged"), "{err}");
    }
    let err = update(&st, &o0, 99, "new", vec![single("a", b"x")]).unwrap_err();
    assert!(err.msg.contains("Refusing to serve"), "{err}");
    assert!(
        st.pool_space(pool).is_err(),
        "control operations refused too"
    );
    // Target 1 serves as before.
    assert_eq!(
        get_single(&st, &o1, LATEST, "other", "a").unwrap(),
        b"target 1"
    );
    st.close();
    // Refusing wrote nothing: the next open refuses the same way.
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(st.fault(0).as_deref(), Some(why.as_str()));
}

#[test]
fn damage_after_the_last_flush_is_a_torn_tail_dropped_quietly() {
    let e = env(32, 1);
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    write(&st, &o, 0..4);
    flush(&st, &o);
    write(&st, &o, 4..7);
    st.abandon();
    // k5 was never flushed: a power cut could have lost its record.
    flip(&e, &val(5));
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(st.fault(0), None);
    for i in 0..5 {
        assert_eq!(
            get_single(&st, &o, LATEST, &format!("k{i}"), "a").unwrap(),
            val(i)
        );
    }
    for i in 5..7 {
        assert_eq!(
            get_single(&st, &o, LATEST, &format!("k{i}"), "a"),
            Err(-libc::ENOENT),
            "k{i}: the tail from the torn record on is dropped"
        );
    }
}

#[test]
fn an_idle_target_stamps_its_flush_so_later_damage_is_loud() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&dir.path().join("nvme0.img"), 32, 1);
    opts.flush_interval = Duration::from_millis(50);
    format(&opts, "test", 0, false).unwrap();
    let e = Env { dir, opts };
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    write(&st, &o, 0..5);
    let before = st.target_stats()[0].seq;
    // A flush with nothing to log writes no record; the idle target then
    // stamps it on its own.
    flush(&st, &o);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while st.target_stats()[0].seq == before {
        assert!(std::time::Instant::now() < deadline, "no stamp written");
        std::thread::sleep(Duration::from_millis(20));
    }
    st.abandon();
    flip(&e, &val(4));
    let st = Storage::open(&e.opts).unwrap();
    let why = st.fault(0).expect("k4 was flushed: refused");
    assert!(why.contains("batch"), "{why}");
}

/// Checkpoint slot headers: (slot, device offset, batch) of each valid one.
fn checkpoints(e: &Env, sb: &Superblock) -> Vec<(u64, u64)> {
    let f = std::fs::File::open(&e.opts.bdev.path).unwrap();
    (0..2u64)
        .filter_map(|slot| {
            let off = sb.target_offset + sb.wal_bytes + slot * sb.ckpt_bytes;
            let mut h = [0u8; 64];
            f.read_exact_at(&mut h, off).unwrap();
            (&h[0..4] == b"PCKP").then(|| (off, u64::from_le_bytes(h[20..28].try_into().unwrap())))
        })
        .collect()
}

fn damage_newest_checkpoint(e: &Env, sb: &Superblock) {
    let newest = checkpoints(e, sb).into_iter().max_by_key(|c| c.1).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&e.opts.bdev.path)
        .unwrap();
    f.write_all_at(&[0x55; 16], newest.0 + 100).unwrap();
}

/// Two checkpoints (each close writes one, to the other slot).
fn two_checkpoints(e: &Env) -> (Uuid, Uuid) {
    let (st, pool, cont) = open_with_pool(e, 4 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    write(&st, &o, 0..3);
    st.close();
    let st = Storage::open(&e.opts).unwrap();
    write(&st, &o, 3..6);
    st.close();
    (pool, cont)
}

#[test]
fn a_damaged_newest_checkpoint_whose_wal_was_reused_is_refused() {
    let e = env(32, 1);
    let (pool, cont) = two_checkpoints(&e);
    let o = Obj::new(pool, cont, 1, 0);
    let st = Storage::open(&e.opts).unwrap();
    let sb = st.superblock().clone();
    assert_eq!(checkpoints(&e, &sb).len(), 2);
    // The WAL restarted after the newest checkpoint and holds k6 now.
    write(&st, &o, 6..7);
    st.abandon();
    damage_newest_checkpoint(&e, &sb);
    let st = Storage::open(&e.opts).unwrap();
    let why = st.fault(0).expect("refused, not the older checkpoint");
    eprintln!("{why}");
    assert!(
        why.contains("target 0") && why.contains("checkpoint damaged"),
        "{why}"
    );
    let err = fetch_iods(&st, &o, LATEST, "k0", vec![iod_a()]).unwrap_err();
    assert!(err.msg.contains("checkpoint damaged"), "{err}");
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_while_the_wal_still_holds_its_batches() {
    let e = env(32, 1);
    let (pool, cont) = two_checkpoints(&e);
    let o = Obj::new(pool, cont, 1, 0);
    let sb = Storage::open(&e.opts).unwrap().superblock().clone();
    // As a crash while the newest checkpoint was written would leave it:
    // the WAL was not restarted yet and holds every batch since the older.
    damage_newest_checkpoint(&e, &sb);
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(st.fault(0), None);
    for i in 0..6 {
        assert_eq!(
            get_single(&st, &o, LATEST, &format!("k{i}"), "a").unwrap(),
            val(i)
        );
    }
}

#[test]
fn replay_reads_records_across_its_4_mib_reads() {
    // Records of one and two blocks, 7 MiB of WAL: some straddle the 4 MiB
    // boundary of replay's reads.
    let e = env(256, 1);
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let n = 1200u64;
    for i in 0..n {
        let mut iods = vec![single("a", &pattern(i, 3000))];
        if i % 2 == 1 {
            iods.push(single("b", &pattern(i + 1_000_000, 3000)));
        }
        update(&st, &o, 10, &format!("k{i}"), iods).unwrap();
    }
    let tail = st.target_stats()[0].wal_tail;
    assert!(tail > 5 << 20, "WAL of {tail} bytes");
    st.abandon();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(st.fault(0), None);
    assert_eq!(st.target_stats()[0].wal_tail, tail);
    for i in (0..n).step_by(7).chain([n - 1]) {
        let k = format!("k{i}");
        assert_eq!(
            get_single(&st, &o, LATEST, &k, "a").unwrap(),
            pattern(i, 3000)
        );
        if i % 2 == 1 {
            assert_eq!(
                get_single(&st, &o, LATEST, &k, "b").unwrap(),
                pattern(i + 1_000_000, 3000)
            );
        }
    }
}

#[test]
fn damage_in_a_wal_restarted_over_older_records_is_still_loud() {
    let e = env(32, 1);
    let (pool, cont) = two_checkpoints(&e);
    let o = Obj::new(pool, cont, 1, 0);
    let st = Storage::open(&e.opts).unwrap();
    // This cycle writes over the older cycle's records from offset 0; the
    // search past the damage stops at the first older record after this
    // cycle's end, having seen the stamp before it.
    write(&st, &o, 6..9);
    flush(&st, &o);
    write(&st, &o, 9..10);
    st.abandon();
    flip(&e, &val(7));
    let st = Storage::open(&e.opts).unwrap();
    let why = st.fault(0).expect("k7 was flushed: refused");
    assert!(why.contains("WAL damaged at offset"), "{why}");
}
