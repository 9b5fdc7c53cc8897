//! Requests with conditions and transactions, and what the tests check of
//! their answers.

use super::*;

pub(crate) fn id(lo: u64) -> TxId {
    TxId { hi: 0xc0, lo }
}

/// Transaction `lo`, this target its second shard (as in tests/dtx.rs).
pub(crate) fn tx(lo: u64) -> Dtx {
    Dtx {
        id: id(lo),
        shards: vec![(3, 1), (0, 0)],
    }
}

pub(crate) fn absent(akey: &str) -> Condition {
    Condition {
        akey: akey.as_bytes().to_vec(),
        expect: Expect::Absent,
    }
}

pub(crate) fn since(akey: &str, epoch: u64) -> Condition {
    Condition {
        akey: akey.as_bytes().to_vec(),
        expect: Expect::UnchangedSince(epoch),
    }
}

/// An update request: `dtx` some transaction (or none), `conds` its conditions.
pub(crate) fn update_req(
    o: &Obj,
    epoch: u64,
    dkey: &str,
    vals: Vec<(Iod, Vec<u8>)>,
    dtx: Option<u64>,
    conds: Vec<Condition>,
    insert_only: bool,
) -> Request {
    let (iods, bulk): (Vec<Iod>, Vec<Vec<u8>>) = vals.into_iter().unzip();
    let req = UpdateReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        iods,
        insert_only,
        sync: false,
        dtx: dtx.map(tx),
        conditions: conds,
    };
    Request::Update(req, bulk.concat().into())
}

/// A conditional update (no transaction).
pub(crate) fn cupdate(
    st: &Storage,
    o: &Obj,
    epoch: u64,
    dkey: &str,
    vals: Vec<(Iod, Vec<u8>)>,
    conds: Vec<Condition>,
) -> Result<(), Errno> {
    wait(st, update_req(o, epoch, dkey, vals, None, conds, false)).map(|_| ())
}

/// A conditional update as part of transaction `lo`.
pub(crate) fn cprepare(
    st: &Storage,
    o: &Obj,
    lo: u64,
    epoch: u64,
    dkey: &str,
    vals: Vec<(Iod, Vec<u8>)>,
    conds: Vec<Condition>,
) -> Result<(), Errno> {
    wait(st, update_req(o, epoch, dkey, vals, Some(lo), conds, false)).map(|_| ())
}

pub(crate) fn punch_req(
    o: &Obj,
    epoch: u64,
    dkey: &str,
    akeys: &[&str],
    dtx: Option<u64>,
    conds: Vec<Condition>,
) -> Request {
    Request::Punch(PunchReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        akeys: akeys.iter().map(|a| a.as_bytes().to_vec()).collect(),
        sync: false,
        dtx: dtx.map(tx),
        conditions: conds,
        more: Vec::new(),
    })
}

/// A conditional punch (`akeys` empty: the dkey; `dkey` empty: the object).
pub(crate) fn cpunch(
    st: &Storage,
    o: &Obj,
    epoch: u64,
    dkey: &str,
    akeys: &[&str],
    dtx: Option<u64>,
    conds: Vec<Condition>,
) -> Result<(), Errno> {
    wait(st, punch_req(o, epoch, dkey, akeys, dtx, conds)).map(|_| ())
}

pub(crate) fn decide(st: &Storage, pool: Uuid, lo: u64, commit: bool) -> Result<(), Errno> {
    let req = DtxDecideReq {
        addr: PoolAddress { pool, target: 0 },
        ids: vec![id(lo)],
        commit,
        leader: true,
    };
    wait(st, Request::DtxDecide(req)).map(|_| ())
}

#[track_caller]
pub(crate) fn assert_code(r: Result<(), Errno>, code: i32, what: &str) -> Errno {
    let e = r.expect_err(what);
    assert_eq!(e.code, code, "{what}: {e}");
    assert!(e.msg.contains("nothing stored"), "{what}: {}", e.msg);
    e
}

#[track_caller]
pub(crate) fn assert_value(st: &Storage, o: &Obj, dkey: &str, akey: &str, want: Option<&[u8]>) {
    let got = get_single(st, o, LATEST, dkey, akey);
    match want {
        Some(w) => assert_eq!(got.as_deref(), Ok(w), "{dkey}/{akey}"),
        None => assert_eq!(got, Err(-libc::ENOENT), "{dkey}/{akey}"),
    }
}

pub(crate) struct T {
    pub(crate) _e: Env,
    pub(crate) st: Storage,
    pub(crate) pool: Uuid,
    pub(crate) o: Obj,
}

pub(crate) fn target() -> T {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    T { _e: e, st, pool, o }
}
