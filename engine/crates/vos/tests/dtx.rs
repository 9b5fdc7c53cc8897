//! Distributed transactions on a target: prepared updates and punches held
//! invisible until decided, decisions and their refusals, resolution of
//! transactions in doubt, what survives a restart, and the conditional
//! updates of EC stripes (`Iod.unchanged_since`).

mod common;

use common::*;
use peregrine_vos::*;
use uuid::Uuid;

const LATEST: u64 = u64::MAX;

fn id(lo: u64) -> TxId {
    TxId { hi: 0xd7, lo }
}

/// Transaction `lo`, this target its second shard.
fn tx(lo: u64) -> Dtx {
    Dtx {
        id: id(lo),
        shards: vec![(3, 1), (0, 0)],
    }
}

fn pool_addr(pool: Uuid) -> PoolAddress {
    PoolAddress { pool, target: 0 }
}

fn update_req(
    o: &Obj,
    epoch: u64,
    dkey: &str,
    vals: Vec<(Iod, Vec<u8>)>,
    dtx: Option<Dtx>,
) -> Request {
    let (iods, bulk): (Vec<Iod>, Vec<Vec<u8>>) = vals.into_iter().unzip();
    let req = UpdateReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        iods,
        insert_only: false,
        sync: false,
        dtx,
        conditions: Vec::new(),
    };
    Request::Update(req, bulk.concat().into())
}

/// An update as part of transaction `lo`.
fn prepare(
    st: &Storage,
    o: &Obj,
    lo: u64,
    epoch: u64,
    dkey: &str,
    vals: Vec<(Iod, Vec<u8>)>,
) -> Result<(), Errno> {
    wait(st, update_req(o, epoch, dkey, vals, Some(tx(lo)))).map(|_| ())
}

/// A punch as part of transaction `lo`.
fn prepare_punch(st: &Storage, o: &Obj, lo: u64, epoch: u64, dkey: &str) -> Result<(), Errno> {
    let req = PunchReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        akeys: vec![],
        sync: false,
        dtx: Some(tx(lo)),
        conditions: Vec::new(),
        more: Vec::new(),
    };
    wait(st, Request::Punch(req)).map(|_| ())
}

fn decide(st: &Storage, pool: Uuid, ids: &[u64], commit: bool, leader: bool) -> Result<(), Errno> {
    let req = DtxDecideReq {
        addr: pool_addr(pool),
        ids: ids.iter().map(|&lo| id(lo)).collect(),
        commit,
        leader,
    };
    wait(st, Request::DtxDecide(req)).map(|_| ())
}

fn query(st: &Storage, pool: Uuid, lo: u64, resolve: bool) -> DtxState {
    let req = DtxQueryReq {
        addr: pool_addr(pool),
        id: id(lo),
        resolve,
    };
    let (resp, _) = wait(st, Request::DtxQuery(req)).unwrap();
    let Answer::DtxState(s) = resp else {
        panic!("dtx query reply without state: {resp:?}")
    };
    s
}

fn pending(st: &Storage, pool: Uuid, older_than_ms: u64, max: u32) -> Vec<DtxPending> {
    let req = DtxPendingReq {
        addr: pool_addr(pool),
        older_than_ms,
        max,
    };
    let (resp, _) = wait(st, Request::DtxPending(req)).unwrap();
    let Answer::DtxPending(p) = resp else {
        panic!("dtx pending reply without body: {resp:?}")
    };
    p
}

fn pending_ids(st: &Storage, pool: Uuid, older_than_ms: u64, max: u32) -> Vec<u64> {
    pending(st, pool, older_than_ms, max)
        .into_iter()
        .map(|p| p.dtx.id.lo)
        .collect()
}

fn fetch_err(st: &Storage, o: &Obj, epoch: u64, dkey: &str) -> Errno {
    let iod = Iod {
        akey: b"s".to_vec(),
        kind: IodKind::Single,
        ..Default::default()
    };
    fetch_iods(st, o, epoch, dkey, vec![iod]).unwrap_err()
}

fn array(akey: &str, offset: u64, len: u64) -> Iod {
    Iod {
        akey: akey.as_bytes().to_vec(),
        kind: common::array(offset),
        len,
        ..Default::default()
    }
}

/// An extent written only if its range is unchanged since `since`.
fn extent_if(akey: &str, offset: u64, v: &[u8], since: u64) -> (Iod, Vec<u8>) {
    let (mut iod, v) = extent(akey, offset, v);
    iod.kind = IodKind::Array {
        offset,
        unchanged_since: Some(since),
    };
    (iod, v)
}

/// (newest epoch of the bytes, bytes) of an array range.
fn array_epoch(st: &Storage, o: &Obj, epoch: u64, dkey: &str, iod: Iod) -> (u64, Vec<u8>) {
    let (v, b) = fetch_iods(st, o, epoch, dkey, vec![iod]).unwrap().remove(0);
    assert_eq!(v.status, 0);
    (v.epoch, b)
}

#[test]
fn prepared_update_is_invisible_until_committed() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "d", vec![single("s", b"v1")]).unwrap();
    update(&st, &o, 10, "other", vec![single("s", b"x")]).unwrap();
    prepare(&st, &o, 1, 20, "d", vec![single("s", b"v2")]).unwrap();

    let err = fetch_err(&st, &o, LATEST, "d");
    assert_eq!(err.code, -libc::EINPROGRESS, "{err}");
    assert!(err.msg.contains("dkey \"d\""), "{}", err.msg);
    assert!(
        err.msg.contains("00000000000000d70000000000000001"),
        "{}",
        err.msg
    );
    // Below the held epoch, and other dkeys, read as before.
    assert_eq!(get_single(&st, &o, 15, "d", "s").unwrap(), b"v1");
    assert_eq!(get_single(&st, &o, LATEST, "other", "s").unwrap(), b"x");
    let size = QuerySizeReq {
        addr: o.addr(),
        epoch: LATEST,
        dkey: b"d".to_vec(),
        akey: b"s".to_vec(),
        last: None,
    };
    let err = wait(&st, Request::QuerySize(size)).unwrap_err();
    assert_eq!(err.code, -libc::EINPROGRESS, "{err}");
    let dkeys = ListReq {
        addr: o.addr(),
        epoch: LATEST,
        ..Default::default()
    };
    let err = wait(&st, Request::List(dkeys)).unwrap_err();
    assert_eq!(err.code, -libc::EINPROGRESS, "{err}");
    assert_eq!(
        list_all(&st, &o, 15, "", 10),
        vec![b"d".to_vec(), b"other".to_vec()]
    );
    assert_eq!(query(&st, pool, 1, false), DtxState::Prepared);

    decide(&st, pool, &[1], true, true).unwrap();
    assert_eq!(query(&st, pool, 1, false), DtxState::Committed);
    assert_eq!(get_single(&st, &o, LATEST, "d", "s").unwrap(), b"v2");
    assert_eq!(
        get_single(&st, &o, 15, "d", "s").unwrap(),
        b"v1",
        "at its own epoch"
    );
    // Committed twice, or prepared again (a client's retry): nothing changes.
    decide(&st, pool, &[1], true, false).unwrap();
    prepare(&st, &o, 1, 20, "d", vec![single("s", b"v3")]).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "d", "s").unwrap(), b"v2");
    let err = decide(&st, pool, &[1], false, true).unwrap_err();
    assert_eq!(err.code, -libc::EEXIST, "{err}");
    st.close();
}

#[test]
fn prepared_punch_holds_every_dkey_of_its_object() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "a", vec![single("s", b"1")]).unwrap();
    update(&st, &o, 10, "b", vec![single("s", b"2")]).unwrap();
    prepare_punch(&st, &o, 7, 20, "").unwrap();
    for dkey in ["a", "b", "never"] {
        assert_eq!(fetch_err(&st, &o, LATEST, dkey).code, -libc::EINPROGRESS);
    }
    assert_eq!(get_single(&st, &o, 19, "a", "s").unwrap(), b"1");
    decide(&st, pool, &[7], true, true).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "a", "s"), Err(-libc::ENOENT));
    assert_eq!(get_single(&st, &o, 19, "b", "s").unwrap(), b"2");
}

#[test]
fn aborted_transaction_frees_its_space_and_refuses_a_late_prepare() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let before = st.pool_space(pool).unwrap();
    let free_blocks = st.target_stats()[0].free_blocks;
    let big = pattern(1, MIB as usize);
    prepare(&st, &o, 2, 20, "d", vec![extent("arr", 0, &big)]).unwrap();
    let held = st.pool_space(pool).unwrap();
    assert_eq!(
        held.nvme_free,
        before.nvme_free - MIB,
        "held data takes its space"
    );
    assert!(held.scm_free < before.scm_free);

    decide(&st, pool, &[2], false, true).unwrap();
    assert_eq!(query(&st, pool, 2, false), DtxState::Aborted);
    assert_eq!(
        st.pool_space(pool).unwrap(),
        before,
        "space back after the abort"
    );
    let (bytes, size) = get_array(&st, &o, LATEST, "d", "arr", 0, 10).unwrap();
    assert_eq!((bytes, size), (vec![0; 10], 0), "nothing stored");

    // Aborted is final: a late prepare, or a commit, is refused.
    let err = prepare(&st, &o, 2, 20, "e", vec![single("s", b"late")]).unwrap_err();
    assert_eq!(err.code, -libc::ECANCELED, "{err}");
    assert!(err.msg.contains("aborted"), "{}", err.msg);
    let err = decide(&st, pool, &[2], true, false).unwrap_err();
    assert_eq!(err.code, -libc::ECANCELED, "{err}");
    decide(&st, pool, &[2], false, false).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "e", "s"), Err(-libc::ENOENT));
    // No block stays taken for it (the allocator is rebuilt from the index).
    st.close();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(st.target_stats()[0].free_blocks, free_blocks);
    assert_eq!(query(&st, pool, 2, false), DtxState::Aborted);
}

#[test]
fn retried_prepare_is_idempotent() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let before = st.pool_space(pool).unwrap();
    let (v1, v2) = (pattern(1, 256 << 10), pattern(2, 256 << 10));
    // The retry may arrive while the first is still being written.
    let first = st.submit(update_req(
        &o,
        20,
        "d",
        vec![extent("arr", 0, &v1)],
        Some(tx(3)),
    ));
    let retry = st.submit(update_req(
        &o,
        20,
        "d",
        vec![extent("arr", 0, &v2)],
        Some(tx(3)),
    ));
    first.recv().unwrap().unwrap();
    retry.recv().unwrap().unwrap();
    // And once it is held.
    prepare(&st, &o, 3, 20, "d", vec![extent("arr", 0, &v2)]).unwrap();
    assert_eq!(
        st.pool_space(pool).unwrap().nvme_free,
        before.nvme_free - (256 << 10),
        "held once"
    );
    assert_eq!(pending(&st, pool, 0, 0).len(), 1);
    decide(&st, pool, &[3], true, true).unwrap();
    let (bytes, _) = get_array(&st, &o, LATEST, "d", "arr", 0, 256 << 10).unwrap();
    assert!(bytes == v1, "the first prepare's bytes");
    assert_eq!(
        st.pool_space(pool).unwrap().cont_used[&cont],
        (256 << 10) + st_scm(&st, pool)
    );
}

/// SCM the pool uses (all of it in one container here).
fn st_scm(st: &Storage, pool: Uuid) -> u64 {
    let s = st.pool_space(pool).unwrap();
    s.scm_total - s.scm_free
}

#[test]
fn decisions_on_unknown_transactions() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    // The leader cannot commit what it never prepared.
    let err = decide(&st, pool, &[4], true, true).unwrap_err();
    assert_eq!(err.code, -libc::ENOENT, "{err}");
    assert!(err.msg.contains("unknown on this shard"), "{}", err.msg);
    assert_eq!(query(&st, pool, 4, false), DtxState::Unknown);
    // One unknown among several: nothing is decided.
    prepare(&st, &o, 5, 20, "d", vec![single("s", b"5")]).unwrap();
    assert!(decide(&st, pool, &[5, 4], true, true).is_err());
    assert_eq!(query(&st, pool, 5, false), DtxState::Prepared);
    // Another shard records the leader's commit, even before its prepare.
    decide(&st, pool, &[4], true, false).unwrap();
    assert_eq!(query(&st, pool, 4, false), DtxState::Committed);
    prepare(&st, &o, 4, 30, "e", vec![single("s", b"4")]).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "e", "s"), Err(-libc::ENOENT));
    // An abort of an unknown transaction is recorded too.
    decide(&st, pool, &[6], false, true).unwrap();
    assert_eq!(query(&st, pool, 6, false), DtxState::Aborted);
    // Limits and addresses.
    let ids: Vec<u64> = (0..1025).collect();
    assert_eq!(
        decide(&st, pool, &ids, false, true).unwrap_err().code,
        -libc::EINVAL
    );
    let err = decide(&st, Uuid::new_v4(), &[5], true, true).unwrap_err();
    assert_eq!(err.code, -libc::ENOENT, "{err}");
    let mut bad = tx(8);
    bad.shards.clear();
    let err = wait(
        &st,
        update_req(&o, 20, "d", vec![single("s", b"x")], Some(bad)),
    )
    .unwrap_err();
    assert_eq!(err.code, -libc::EINVAL, "{err}");
    let mut bad = tx(8);
    bad.shards = vec![(0, 0); 65];
    let err = wait(
        &st,
        update_req(&o, 20, "d", vec![single("s", b"x")], Some(bad)),
    )
    .unwrap_err();
    assert_eq!(err.code, -libc::EINVAL, "{err}");
}

#[test]
fn resolve_aborts_unknown_transactions_only() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    assert_eq!(query(&st, pool, 9, true), DtxState::Aborted);
    let err = prepare(&st, &o, 9, 20, "d", vec![single("s", b"late")]).unwrap_err();
    assert_eq!(err.code, -libc::ECANCELED, "{err}");

    // Prepared: maybe committed (every shard prepared), never aborted alone.
    prepare(&st, &o, 10, 20, "d", vec![single("s", b"v")]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(DTX_STALE_MS + 200));
    assert_eq!(query(&st, pool, 10, true), DtxState::Prepared);
}

#[test]
fn pending_lists_held_transactions_with_their_age() {
    let e = env(64, 1);
    let st = Storage::open(&e.opts).unwrap();
    let (pool, other, cont) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let scm = st.device_space().3 / 2;
    st.pool_create(pool, scm, 8 * MIB).unwrap();
    st.pool_create(other, scm, 8 * MIB).unwrap();
    let o = Obj::new(pool, cont, 1, 0);
    prepare(&st, &o, 12, 20, "a", vec![single("s", b"a")]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    prepare(&st, &o, 11, 20, "b", vec![single("s", b"b")]).unwrap();
    prepare(&st, &o, 11, 21, "c", vec![single("s", b"c")]).unwrap();
    let all = pending(&st, pool, 0, 0);
    assert_eq!(all.len(), 2, "one entry per transaction");
    assert_eq!(all[0].dtx, tx(12), "oldest first, with its shards");
    assert!(all[0].age_ms >= 300, "{all:?}");
    assert!(all[1].age_ms < all[0].age_ms);
    assert_eq!(pending_ids(&st, pool, 200, 0), vec![12]);
    assert_eq!(pending_ids(&st, pool, 0, 1), vec![12]);
    assert!(pending(&st, other, 0, 0).is_empty());
    decide(&st, pool, &[12], true, true).unwrap();
    assert_eq!(pending_ids(&st, pool, 0, 0), vec![11]);
}

#[test]
fn pending_and_decided_survive_replay_and_checkpoint() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let big = pattern(7, 300 << 10);
    prepare(
        &st,
        &o,
        20,
        30,
        "a",
        vec![extent("arr", 0, &big), single("s", b"small")],
    )
    .unwrap();
    prepare_punch(&st, &o, 21, 30, "b").unwrap();
    prepare(&st, &o, 23, 30, "c", vec![single("s", b"c")]).unwrap();
    decide(&st, pool, &[22], false, true).unwrap();
    decide(&st, pool, &[23], true, true).unwrap();
    let space = st.pool_space(pool).unwrap();
    let check = |st: &Storage, how: &str| {
        assert_eq!(query(st, pool, 20, false), DtxState::Prepared, "{how}");
        assert_eq!(query(st, pool, 21, false), DtxState::Prepared, "{how}");
        assert_eq!(query(st, pool, 22, false), DtxState::Aborted, "{how}");
        assert_eq!(query(st, pool, 23, false), DtxState::Committed, "{how}");
        assert_eq!(pending_ids(st, pool, 0, 0), vec![20, 21], "{how}");
        assert_eq!(
            fetch_err(st, &o, LATEST, "a").code,
            -libc::EINPROGRESS,
            "{how}"
        );
        assert_eq!(get_single(st, &o, LATEST, "c", "s").unwrap(), b"c", "{how}");
        assert_eq!(st.pool_space(pool).unwrap(), space, "{how}");
    };
    st.abandon(); // no closing checkpoint: the WAL is replayed
    let st = Storage::open(&e.opts).unwrap();
    check(&st, "after replay");
    st.close(); // a checkpoint at close
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(
        st.target_stats()[0].wal_tail,
        0,
        "opened from the checkpoint"
    );
    check(&st, "after a checkpoint");
    // The held data blocks were kept: the commit reads them back.
    decide(&st, pool, &[20, 21], true, true).unwrap();
    let (bytes, _) = get_array(&st, &o, LATEST, "a", "arr", 0, big.len() as u64).unwrap();
    assert!(bytes == big);
    assert_eq!(get_single(&st, &o, LATEST, "a", "s").unwrap(), b"small");
    // New writes take other blocks.
    update(
        &st,
        &o,
        40,
        "z",
        vec![extent("arr", 0, &pattern(8, 300 << 10))],
    )
    .unwrap();
    let (bytes, _) = get_array(&st, &o, 35, "a", "arr", 0, big.len() as u64).unwrap();
    assert!(bytes == big);
    st.close();
}

#[test]
fn destroying_a_container_or_pool_drops_its_held_changes() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let before = st.pool_space(pool).unwrap();
    let free_blocks = st.target_stats()[0].free_blocks;
    prepare(
        &st,
        &o,
        30,
        20,
        "d",
        vec![extent("arr", 0, &pattern(1, MIB as usize))],
    )
    .unwrap();
    st.cont_destroy(pool, cont).unwrap();
    assert_eq!(st.pool_space(pool).unwrap().nvme_free, before.nvme_free);
    assert_eq!(
        query(&st, pool, 30, false),
        DtxState::Prepared,
        "still to be decided"
    );
    decide(&st, pool, &[30], true, true).unwrap();
    assert_eq!(get_array(&st, &o, LATEST, "d", "arr", 0, 4).unwrap().1, 0);

    prepare(
        &st,
        &o,
        31,
        20,
        "d",
        vec![extent("arr", 0, &pattern(1, MIB as usize))],
    )
    .unwrap();
    st.pool_destroy(pool).unwrap();
    st.close();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(
        st.target_stats()[0].free_blocks,
        free_blocks,
        "every block back"
    );
    st.pool_create(pool, st.device_space().3, 16 * MIB).unwrap();
    assert_eq!(query(&st, pool, 31, false), DtxState::Unknown);
    assert_eq!(query(&st, pool, 30, false), DtxState::Unknown);
}

#[test]
fn unchanged_since_refuses_an_update_of_a_changed_range() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "d", vec![extent("arr", 0, &[1; 100])]).unwrap();
    update(&st, &o, 20, "d", vec![extent_if("arr", 0, &[2; 50], 10)]).unwrap();
    let err = update(&st, &o, 30, "d", vec![extent_if("arr", 40, &[3; 20], 10)]).unwrap_err();
    assert_eq!(err.code, -libc::EBUSY, "{err}");
    assert!(
        err.msg
            .contains("akey \"arr\" range [40, 60) changed since epoch 10"),
        "{}",
        err.msg
    );
    assert_eq!(
        array_epoch(&st, &o, LATEST, "d", array("arr", 40, 20)).1,
        [[2; 10], [1; 10]].concat(),
        "nothing stored"
    );
    // Unchanged where it writes: stored.
    update(&st, &o, 30, "d", vec![extent_if("arr", 60, &[3; 40], 10)]).unwrap();
    update(&st, &o, 31, "d", vec![extent_if("arr", 0, &[4; 10], 30)]).unwrap();

    // A change held by another transaction counts where it overlaps; one's
    // own does not.
    prepare(&st, &o, 40, 50, "d", vec![extent("arr", 500, &[5; 10])]).unwrap();
    update(&st, &o, 55, "d", vec![extent_if("arr", 200, &[6; 10], 31)]).unwrap();
    let err = update(&st, &o, 60, "d", vec![extent_if("arr", 505, &[6; 10], 40)]).unwrap_err();
    assert_eq!(err.code, -libc::EBUSY, "{err}");
    assert!(err.msg.contains("transaction"), "{}", err.msg);
    prepare(
        &st,
        &o,
        40,
        51,
        "d",
        vec![extent_if("arr", 0, &[6; 10], 40)],
    )
    .unwrap();
    let err = prepare(
        &st,
        &o,
        41,
        52,
        "d",
        vec![extent_if("arr", 0, &[7; 10], 40)],
    )
    .unwrap_err();
    assert_eq!(err.code, -libc::EBUSY, "{err}");
    // Other akeys and dkeys are not held.
    update(&st, &o, 60, "d", vec![extent_if("other", 0, &[6; 10], 0)]).unwrap();
    update(&st, &o, 60, "e", vec![extent_if("arr", 0, &[6; 10], 0)]).unwrap();
    decide(&st, pool, &[40], true, true).unwrap();
    assert_eq!(
        array_epoch(&st, &o, LATEST, "d", array("arr", 0, 10)),
        (51, vec![6; 10])
    );
    // SINGLE values have no ranges: the storage's types cannot say so,
    // the engine's conversion refuses it (engine/src/request/tests.rs).
}

#[test]
fn fetched_value_says_the_epoch_of_its_bytes() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(
        &st,
        &o,
        10,
        "d",
        vec![extent("arr", 0, &[1; 100]), single("s", b"v")],
    )
    .unwrap();
    update(&st, &o, 20, "d", vec![extent("arr", 50, &[2; 10])]).unwrap();
    assert_eq!(array_epoch(&st, &o, LATEST, "d", array("arr", 0, 40)).0, 10);
    assert_eq!(
        array_epoch(&st, &o, LATEST, "d", array("arr", 0, 100)).0,
        20
    );
    assert_eq!(array_epoch(&st, &o, 15, "d", array("arr", 0, 100)).0, 10);
    assert_eq!(
        array_epoch(&st, &o, LATEST, "d", array("arr", 200, 10)).0,
        0,
        "a hole"
    );
    assert_eq!(array_epoch(&st, &o, LATEST, "d", array("none", 0, 10)).0, 0);
    // No bytes asked: the newest change of the whole akey, punches too.
    assert_eq!(array_epoch(&st, &o, LATEST, "d", array("arr", 0, 0)).0, 20);
    assert_eq!(array_epoch(&st, &o, 15, "d", array("arr", 0, 0)).0, 10);
    punch(&st, &o, 30, "d", &["arr"]).unwrap();
    assert_eq!(array_epoch(&st, &o, LATEST, "d", array("arr", 0, 0)).0, 30);
    update(&st, &o, 40, "d", vec![extent("arr", 500, &[3; 10])]).unwrap();
    assert_eq!(array_epoch(&st, &o, LATEST, "d", array("arr", 0, 0)).0, 40);
    let single_iod = Iod {
        akey: b"s".to_vec(),
        kind: IodKind::Single,
        ..Default::default()
    };
    assert_eq!(array_epoch(&st, &o, LATEST, "d", single_iod.clone()).0, 10);
    let (v, _) = fetch_iods(&st, &o, 5, "d", vec![single_iod])
        .unwrap()
        .remove(0);
    assert_eq!((v.status, v.epoch), (-libc::ENOENT, 0));
}

#[test]
fn list_changed_lists_a_dkey_with_only_a_held_change() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let o2 = Obj::new(pool, cont, 2, 0);
    update(&st, &o, 10, "a", vec![single("s", b"a")]).unwrap();
    update(&st, &o, 10, "c", vec![single("s", b"c")]).unwrap();
    // Held at an epoch below `since`, and a held punch of another object.
    prepare(&st, &o, 50, 5, "b", vec![single("s", b"b")]).unwrap();
    prepare(&st, &o, 50, 5, "c", vec![single("s", b"c2")]).unwrap();
    prepare_punch(&st, &o2, 51, 5, "").unwrap();
    let keys = |anchor: Option<ChangedKey>, max: u32| {
        let req = ListChangedReq {
            addr: pool_addr(pool),
            since: 8,
            anchor,
            max,
        };
        let (resp, _) = wait(&st, Request::ListChanged(req)).unwrap();
        let Answer::Changed { keys, done } = resp else {
            panic!("list changed reply without body")
        };
        (keys, done)
    };
    let (all, done) = keys(None, 0);
    let names: Vec<(u64, Vec<u8>)> = all.iter().map(|k| (k.oid.lo, k.dkey.clone())).collect();
    assert_eq!(
        names,
        vec![
            (1, b"a".to_vec()),
            (1, b"b".to_vec()),
            (1, b"c".to_vec()),
            (2, vec![])
        ]
    );
    assert!(done);
    // One at a time, following anchors: the same keys, each once.
    let mut paged = Vec::new();
    let mut anchor = None;
    loop {
        let (page, done) = keys(anchor.clone(), 1);
        assert!(page.len() <= 1);
        paged.extend(page.clone());
        if done {
            break;
        }
        anchor = page.last().cloned();
    }
    assert_eq!(paged, all);
    // Its records wait for the decision.
    let req = ListRecordsReq {
        addr: o.addr(),
        dkey: b"b".to_vec(),
        since: 0,
    };
    let err = wait(&st, Request::ListRecords(req)).unwrap_err();
    assert_eq!(err.code, -libc::EINPROGRESS, "{err}");
    decide(&st, pool, &[50, 51], false, true).unwrap();
    let (all, _) = keys(None, 0);
    assert_eq!(all.len(), 2, "a and c");
}

/// A transaction that lists this target twice (it sends it two changes) is
/// prepared here only with both: with one, it reports itself incomplete to
/// the resolver, and a resolving query aborts it (the other change, still
/// on its way, is then refused), so it is never committed with a change
/// missing (a client killed between its two requests).
#[test]
fn a_shard_holding_part_of_its_changes_is_incomplete_and_aborted() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let twice = |lo: u64| Dtx {
        id: id(lo),
        shards: vec![(0, 0), (0, 0), (3, 1)],
    };
    let send = |lo: u64, dkey: &str, v: &[u8]| {
        wait(
            &st,
            update_req(&o, 20, dkey, vec![single("s", v)], Some(twice(lo))),
        )
        .map(|_| ())
    };
    // Both changes: complete, prepared, committed whole.
    send(1, "a", b"a1").unwrap();
    send(1, "b", b"b1").unwrap();
    let held = pending(&st, pool, 0, 0);
    assert_eq!((held.len(), held[0].incomplete), (1, false));
    assert_eq!(query(&st, pool, 1, true), DtxState::Prepared);
    decide(&st, pool, &[1], true, true).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "b", "s").unwrap(), b"b1");

    // One of two: incomplete; resolving aborts it; the late one is refused.
    send(2, "a", b"a2").unwrap();
    let held = pending(&st, pool, 0, 0);
    assert_eq!((held.len(), held[0].incomplete), (1, true));
    assert_eq!(query(&st, pool, 2, false), DtxState::Prepared);
    assert_eq!(query(&st, pool, 2, true), DtxState::Aborted);
    let err = send(2, "b", b"b2").unwrap_err();
    assert_eq!(err.code, -libc::ECANCELED, "{err}");
    assert_eq!(get_single(&st, &o, LATEST, "a", "s").unwrap(), b"a1");
    assert_eq!(get_single(&st, &o, LATEST, "b", "s").unwrap(), b"b1");
    assert!(pending(&st, pool, 0, 0).is_empty());
    st.close();
}
