//! Acknowledgement and flushes: an update is answered once written (the
//! crash test shows that it survives a SIGKILL); a flush makes what was
//! answered survive a power cut, and replay trusts what a record says was
//! flushed. A power cut is played by damaging on the device what was not
//! flushed, as the device's volatile cache losing it would.

mod common;

use common::*;
use peregrine_proto::data;
use peregrine_vos::*;
use uuid::Uuid;

const LATEST: u64 = u64::MAX;

fn flush(st: &Storage, o: &Obj) -> Reply {
    wait(st, Request::Flush(data::FlushReq { addr: o.addr() }))
}

#[test]
fn a_flush_makes_the_acknowledged_updates_durable_and_replay_trusts_it() {
    let e = env(32, 1);
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let (v0, v1) = (pattern(7, 64 << 10), pattern(8, 64 << 10));
    update(&st, &o, 10, "k0", vec![single("a", &v0)]).unwrap();
    let s = st.target_stats()[0];
    assert!(s.durable < s.seq, "answered before any flush: {s:?}");
    flush(&st, &o).unwrap();
    let s = st.target_stats()[0];
    assert_eq!(s.durable, s.seq, "the flush covers every answered update");
    assert_eq!(s.flushes, 1);
    // Nothing new since: answered at once, no second fdatasync.
    flush(&st, &o).unwrap();
    assert_eq!(st.target_stats()[0].flushes, 1);
    update(&st, &o, 11, "k1", vec![single("a", &v1)]).unwrap();
    st.abandon();

    // k0 was flushed: its bytes going bad now is media corruption, which
    // its read reports. Replay does not drop k0 and k1 for it, as it would
    // were k0 not flushed (store.rs:
    // a_record_whose_data_never_arrived_is_dropped_with_the_later_ones).
    damage(&e, &v0);
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(
        get_single(&st, &o, LATEST, "k0", "a"),
        Err(-peregrine_proto::CSUM_ERRNO)
    );
    assert_eq!(get_single(&st, &o, LATEST, "k1", "a").unwrap(), v1);
}

#[test]
fn a_power_cut_keeps_a_prefix_of_what_was_acknowledged() {
    let e = env(32, 1);
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let vals: Vec<Vec<u8>> = (0..4).map(|i| pattern(20 + i, 64 << 10)).collect();
    update(&st, &o, 10, "k0", vec![single("a", &vals[0])]).unwrap();
    flush(&st, &o).unwrap();
    for (i, v) in vals.iter().enumerate().skip(1) {
        update(
            &st,
            &o,
            10 + i as u64,
            &format!("k{i}"),
            vec![single("a", v)],
        )
        .unwrap();
    }
    st.abandon();
    // The cut lost k2's data; k1's and k3's reached the device.
    damage(&e, &vals[2]);
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "k0", "a").unwrap(), vals[0]);
    assert_eq!(get_single(&st, &o, LATEST, "k1", "a").unwrap(), vals[1]);
    assert_eq!(get_single(&st, &o, LATEST, "k2", "a"), Err(-libc::ENOENT));
    assert_eq!(
        get_single(&st, &o, LATEST, "k3", "a"),
        Err(-libc::ENOENT),
        "k3 follows a record that is gone"
    );
}

/// Replay flushes what it replayed, but the next replay may still check
/// those records (no flushed record says they were flushed): the blocks they
/// freed must keep their bytes after a restart too, or a power cut later
/// would drop records that were flushed.
#[test]
fn blocks_freed_by_replayed_records_wait_for_a_flushed_stamp() {
    let e = env(32, 1);
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let (v1, v2, w, v3) = (
        pattern(31, 64 << 10),
        pattern(32, 64 << 10),
        pattern(33, 64 << 10),
        pattern(34, 64 << 10),
    );
    update(&st, &o, 10, "k", vec![single("a", &v1)]).unwrap();
    // The same epoch: v2 replaces v1 and frees its blocks.
    update(&st, &o, 10, "k", vec![single("a", &v2)]).unwrap();
    update(&st, &o, 11, "k2", vec![single("a", &w)]).unwrap();
    st.abandon();

    let st = Storage::open(&e.opts).unwrap();
    // Its record would say that the replayed ones were flushed: the power
    // cut loses it, and v3, neither flushed.
    let lost = "k3: its record does not reach the disk";
    update(&st, &o, 12, lost, vec![single("a", &v3)]).unwrap();
    st.abandon();
    damage(&e, lost.as_bytes());
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "k", "a").unwrap(), v2);
    assert_eq!(get_single(&st, &o, LATEST, "k2", "a").unwrap(), w);
    assert_eq!(get_single(&st, &o, LATEST, lost, "a"), Err(-libc::ENOENT));
}

#[test]
fn a_sync_update_is_flushed_before_it_is_answered() {
    let e = env(32, 1);
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let v = single("a", b"kept");
    let req = data::UpdateReq {
        addr: o.addr(),
        epoch: 10,
        dkey: b"k".to_vec(),
        iods: vec![v.0],
        insert_only: false,
        sync: true,
    };
    wait(&st, Request::Update(req, v.1.into())).unwrap();
    let s = st.target_stats()[0];
    assert_eq!((s.durable, s.flushes), (s.seq, 1), "{s:?}");
    punch(&st, &o, 11, "k", &["a"]).unwrap();
    let s = st.target_stats()[0];
    assert!(s.durable < s.seq, "a plain punch is not flushed: {s:?}");
}

#[test]
fn a_flush_names_a_pool_it_does_not_know() {
    let e = env(32, 1);
    let (st, pool, cont) = open_with_pool(&e, 4 * MIB);
    let _ = pool;
    let o = Obj::new(Uuid::new_v4(), cont, 1, 0);
    let err = flush(&st, &o).unwrap_err();
    assert_eq!(err.code, -libc::ENOENT);
    assert!(err.msg.contains(&o.pool.to_string()), "{}", err.msg);
    let err = wait(&st, Request::Flush(data::FlushReq { addr: None })).unwrap_err();
    assert_eq!(err.code, -libc::EINVAL);
}

/// An overwrite frees the old value's blocks, but they keep its bytes until
/// a flushed record says the overwrite was flushed: replay may still check
/// the old record. When the device is short of blocks meanwhile, the target
/// checkpoints to settle them rather than refuse the update.
#[test]
fn freed_blocks_are_rewritten_only_once_settled() {
    let e = env(64, 1);
    let st = Storage::open(&e.opts).unwrap();
    let (data_bytes, nvme_free, _, scm_free) = st.device_space();
    let pool = Uuid::new_v4();
    st.pool_create(pool, scm_free.min(8 * MIB), nvme_free)
        .unwrap();
    let o = Obj::new(pool, Uuid::new_v4(), 1, 0);
    // Three copies of the value do not fit the data region at once.
    let len = (data_bytes * 4 / 10) as usize & !4095;
    let (v1, v2, v3) = (pattern(1, len), pattern(2, len), pattern(3, len));
    update(&st, &o, 10, "k", vec![single("a", &v1)]).unwrap();
    // The same epoch: v2 replaces v1 and frees its blocks, unsettled.
    update(&st, &o, 10, "k", vec![single("a", &v2)]).unwrap();
    let s = st.target_stats()[0];
    assert!(
        s.free_blocks * 4096 < len as u64,
        "v1's blocks wait to be settled: {s:?}"
    );
    update(&st, &o, 10, "k", vec![single("a", &v3)]).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "k", "a").unwrap(), v3);
    assert!(
        st.target_stats()[0].checkpoints > s.checkpoints,
        "v3 needed v1's blocks: settled by a checkpoint"
    );
    st.abandon();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "k", "a").unwrap(), v3);
}
