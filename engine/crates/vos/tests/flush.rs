//! Acknowledgement and flushes: an update is answered once written (the
//! crash test shows that it survives a SIGKILL); a flush makes what was
//! answered survive a power cut, and replay trusts what a record says was
//! flushed. A power cut is played by damaging on the device what was not
//! flushed, as the device's volatile cache losing it would.

mod common;

use common::*;
use peregrine_vos::*;
use uuid::Uuid;

const LATEST: u64 = u64::MAX;

fn flush(st: &Storage, o: &Obj) -> Reply {
    wait(
        st,
        Request::Flush(FlushReq {
            addr: o.addr().into(),
        }),
    )
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
    // were k0 not flushed (replay.rs:
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
    let req = UpdateReq {
        addr: o.addr(),
        epoch: 10,
        dkey: b"k".to_vec(),
        iods: vec![v.0],
        insert_only: false,
        sync: true,
        dtx: None,
        conditions: Vec::new(),
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

/// xorshift64*: a seeded, repeatable sequence for the randomized test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const KEYS: u64 = 6;

/// What reads at the latest epoch see: the value of each dkey's akey "a".
type State = Vec<Option<Vec<u8>>>;

fn observe(st: &Storage, o: &Obj) -> State {
    (0..KEYS)
        .map(|k| match get_single(st, o, LATEST, &format!("d{k}"), "a") {
            Ok(v) => Some(v),
            Err(e) if e == -libc::ENOENT => None,
            Err(e) => panic!("d{k}: read failed with errno {e} after the power cut"),
        })
        .collect()
}

/// Power cuts at random points of random updates (inline and device
/// values, overwrites at the same epoch that free blocks, punches) and
/// flushes, three in a row on one device: every 4 KiB block written since
/// the last flush is either on the device or not, independently. Each replay
/// must give the state after some prefix of the acknowledged operations that
/// includes every flushed one (and all it replayed the time before), with
/// every value intact.
#[test]
fn random_power_cuts_keep_all_that_was_flushed_and_a_prefix_of_the_rest() {
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        // Percent of operations that flush, and that replace a value at its
        // epoch (freeing its blocks): two mixes, for cuts after many records
        // and for blocks freed and rewritten.
        let (flushes, replaces) = if seed % 2 == 0 { (10, 30) } else { (5, 45) };
        let e = env(32, 1);
        let (mut s, pool, cont) = open_with_pool(&e, 8 * MIB);
        let o = Obj::new(pool, cont, 1, 0);
        let mut state: State = vec![None; KEYS as usize];
        let mut epoch = 10;
        for cut_no in 0..3u64 {
            // Epoch of each dkey's latest update in this run: an update at
            // the same epoch replaces it (and frees its blocks).
            let mut epochs = vec![0u64; KEYS as usize];
            let mut states = vec![state.clone()];
            let mut flushed = (0, std::fs::read(&e.opts.bdev.path).unwrap());
            for op in 0..30u64 {
                let k = rng.below(KEYS) as usize;
                let dkey = format!("d{k}");
                let roll = rng.below(100);
                if roll < flushes {
                    flush(&s, &o).unwrap();
                    flushed = (states.len() - 1, std::fs::read(&e.opts.bdev.path).unwrap());
                    continue;
                } else if roll < flushes + 10 {
                    epoch += 1;
                    punch(&s, &o, epoch, &dkey, &["a"]).unwrap();
                    state[k] = None;
                    epochs[k] = 0;
                } else {
                    let len = [100, 8 << 10, 64 << 10][rng.below(3) as usize];
                    let v = pattern((seed * 10 + cut_no) * 1000 + op, len);
                    let at = if roll < flushes + 10 + replaces && epochs[k] > 0 {
                        epochs[k]
                    } else {
                        epoch += 1;
                        epoch
                    };
                    update(&s, &o, at, &dkey, vec![single("a", &v)]).unwrap();
                    state[k] = Some(v);
                    epochs[k] = at;
                }
                states.push(state.clone());
            }
            s.abandon();

            // The cut: each block changed since the last flush keeps its
            // new bytes or goes back to what it held then.
            let mut cut = std::fs::read(&e.opts.bdev.path).unwrap();
            let (kept_from, then) = flushed;
            let mut lost = 0;
            for (b, old) in cut.chunks_mut(4096).zip(then.chunks(4096)) {
                if b != old && rng.below(2) == 0 {
                    b.copy_from_slice(old);
                    lost += 1;
                }
            }
            std::fs::write(&e.opts.bdev.path, &cut).unwrap();
            s = Storage::open(&e.opts).unwrap();
            let seen = observe(&s, &o);
            assert!(
                (kept_from..states.len()).any(|j| states[j] == seen),
                "seed {seed}, cut {cut_no}: {lost} blocks lost since the flush after op \
                 {kept_from}; the state read back is no prefix of the acknowledged operations \
                 from there on"
            );
            // Replay flushed what it replayed: the next cut must keep it.
            state = seen;
        }
        s.close();
    }
}
