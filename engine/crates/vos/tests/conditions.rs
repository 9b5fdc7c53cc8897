//! Conditions of updates and punches (`Condition`) on a real target:
//! `absent` (-EEXIST while the akey has a visible value), `unchanged_since`
//! (-EBUSY once a version or punch of the akey, its dkey or its object is
//! newer), -EBUSY whatever the condition while another transaction holds
//! (or is preparing) a change of the akey, a transaction's own changes not
//! counting, `insert_only` as absent-conditions, nothing stored when a
//! condition fails, malformed conditions refused, and a prepared
//! transaction still blocking after the target is reopened.

mod common;

use common::*;
use peregrine_vos::*;
use uuid::Uuid;

const LATEST: u64 = u64::MAX;

fn id(lo: u64) -> TxId {
    TxId { hi: 0xc0, lo }
}

/// Transaction `lo`, this target its second shard (as in tests/dtx.rs).
fn tx(lo: u64) -> Dtx {
    Dtx {
        id: id(lo),
        shards: vec![(3, 1), (0, 0)],
    }
}

fn absent(akey: &str) -> Condition {
    Condition {
        akey: akey.as_bytes().to_vec(),
        expect: Expect::Absent,
    }
}

fn since(akey: &str, epoch: u64) -> Condition {
    Condition {
        akey: akey.as_bytes().to_vec(),
        expect: Expect::UnchangedSince(epoch),
    }
}

/// An update request: `dtx` some transaction (or none), `conds` its conditions.
fn update_req(
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
fn cupdate(
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
fn cprepare(
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

fn punch_req(
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
    })
}

/// A conditional punch (`akeys` empty: the dkey; `dkey` empty: the object).
fn cpunch(
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

fn decide(st: &Storage, pool: Uuid, lo: u64, commit: bool) -> Result<(), Errno> {
    let req = DtxDecideReq {
        addr: PoolAddress { pool, target: 0 },
        ids: vec![id(lo)],
        commit,
        leader: true,
    };
    wait(st, Request::DtxDecide(req)).map(|_| ())
}

#[track_caller]
fn assert_code(r: Result<(), Errno>, code: i32, what: &str) -> Errno {
    let e = r.expect_err(what);
    assert_eq!(e.code, code, "{what}: {e}");
    assert!(e.msg.contains("nothing stored"), "{what}: {}", e.msg);
    e
}

#[track_caller]
fn assert_value(st: &Storage, o: &Obj, dkey: &str, akey: &str, want: Option<&[u8]>) {
    let got = get_single(st, o, LATEST, dkey, akey);
    match want {
        Some(w) => assert_eq!(got.as_deref(), Ok(w), "{dkey}/{akey}"),
        None => assert_eq!(got, Err(-libc::ENOENT), "{dkey}/{akey}"),
    }
}

struct T {
    _e: Env,
    st: Storage,
    pool: Uuid,
    o: Obj,
}

fn target() -> T {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    T { _e: e, st, pool, o }
}

#[test]
fn absent_holds_until_a_value_is_stored_and_again_after_a_punch() {
    let T { _e, st, o, .. } = target();
    // Nothing there yet: stored.
    cupdate(
        &st,
        &o,
        10,
        "d",
        vec![single("a", b"v1")],
        vec![absent("a")],
    )
    .unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v1"));
    // Now there is.
    let e = assert_code(
        cupdate(
            &st,
            &o,
            20,
            "d",
            vec![single("a", b"v2")],
            vec![absent("a")],
        ),
        -libc::EEXIST,
        "absent on a stored akey",
    );
    assert!(e.msg.contains("akey \"a\""), "{}", e.msg);
    assert_value(&st, &o, "d", "a", Some(b"v1"));
    // A condition on another akey than the ones written; the whole update
    // is refused, its other values too.
    update(&st, &o, 11, "d", vec![single("marker", b"m")]).unwrap();
    assert_code(
        cupdate(
            &st,
            &o,
            21,
            "d",
            vec![single("b", b"new"), single("c", b"new")],
            vec![absent("b"), absent("marker")],
        ),
        -libc::EEXIST,
        "absent on an akey not written",
    );
    assert_value(&st, &o, "d", "b", None);
    assert_value(&st, &o, "d", "c", None);
    cupdate(
        &st,
        &o,
        22,
        "d",
        vec![single("b", b"new")],
        vec![absent("b"), absent("nothing-here")],
    )
    .unwrap();
    assert_value(&st, &o, "d", "b", Some(b"new"));
    // Another dkey's akey of the same name is another akey.
    cupdate(&st, &o, 23, "e", vec![single("a", b"e")], vec![absent("a")]).unwrap();

    // Punched (the akey): absent again; updated again: not.
    punch(&st, &o, 30, "d", &["a"]).unwrap();
    cupdate(
        &st,
        &o,
        31,
        "d",
        vec![single("a", b"v3")],
        vec![absent("a")],
    )
    .unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v3"));
    assert_code(
        cupdate(
            &st,
            &o,
            32,
            "d",
            vec![single("a", b"v4")],
            vec![absent("a")],
        ),
        -libc::EEXIST,
        "absent after the re-creation",
    );
    // Punched with its dkey, then with its object.
    punch(&st, &o, 40, "d", &[]).unwrap();
    cupdate(
        &st,
        &o,
        41,
        "d",
        vec![single("a", b"v5")],
        vec![absent("a")],
    )
    .unwrap();
    punch(&st, &o, 50, "", &[]).unwrap();
    cupdate(
        &st,
        &o,
        51,
        "d",
        vec![single("a", b"v6")],
        vec![absent("a")],
    )
    .unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v6"));
    // A punch of another akey of the dkey changes nothing for this one.
    punch(&st, &o, 60, "d", &["b"]).unwrap();
    assert_code(
        cupdate(
            &st,
            &o,
            61,
            "d",
            vec![single("a", b"v7")],
            vec![absent("a")],
        ),
        -libc::EEXIST,
        "absent after a punch of another akey",
    );
    // A punch expecting absent: refused while the value is there.
    assert_code(
        cpunch(&st, &o, 62, "d", &["a"], None, vec![absent("a")]),
        -libc::EEXIST,
        "punch expecting absent",
    );
    assert_value(&st, &o, "d", "a", Some(b"v6"));
    st.close();
}

#[test]
fn absent_counts_the_changes_in_flight() {
    let T { _e, st, o, .. } = target();
    // Submitted back to back: the second is judged on the first, applied
    // or not yet.
    let first = st.submit(update_req(
        &o,
        10,
        "d",
        vec![single("a", b"v1")],
        None,
        vec![],
        false,
    ));
    let second = st.submit(update_req(
        &o,
        11,
        "d",
        vec![single("a", b"v2")],
        None,
        vec![absent("a")],
        false,
    ));
    first.recv().unwrap().unwrap();
    assert_code(
        second.recv().unwrap().map(|_| ()),
        -libc::EEXIST,
        "absent behind an update in flight",
    );
    assert_value(&st, &o, "d", "a", Some(b"v1"));
    // A punch in flight: absent holds behind it.
    let first = st.submit(punch_req(&o, 20, "d", &["a"], None, vec![]));
    let second = st.submit(update_req(
        &o,
        21,
        "d",
        vec![single("a", b"v3")],
        None,
        vec![absent("a")],
        false,
    ));
    first.recv().unwrap().unwrap();
    second.recv().unwrap().unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v3"));
    // Two conditional inserts of one akey back to back: the second loses.
    let first = st.submit(update_req(
        &o,
        30,
        "d",
        vec![single("n", b"one")],
        None,
        vec![absent("n")],
        false,
    ));
    let second = st.submit(update_req(
        &o,
        31,
        "d",
        vec![single("n", b"two")],
        None,
        vec![absent("n")],
        false,
    ));
    first.recv().unwrap().unwrap();
    assert_code(
        second.recv().unwrap().map(|_| ()),
        -libc::EEXIST,
        "second insert",
    );
    assert_value(&st, &o, "d", "n", Some(b"one"));
    st.close();
}

#[test]
fn unchanged_since_refuses_a_newer_version_or_punch() {
    let T { _e, st, o, .. } = target();
    update(
        &st,
        &o,
        10,
        "d",
        vec![single("a", b"v1"), single("b", b"b1")],
    )
    .unwrap();
    // Never written: unchanged since anything.
    cupdate(
        &st,
        &o,
        11,
        "d",
        vec![single("x", b"x")],
        vec![since("y", 0)],
    )
    .unwrap();
    // Unchanged since the epoch read (or a later one): stored.
    cupdate(
        &st,
        &o,
        20,
        "d",
        vec![single("a", b"v2")],
        vec![since("a", 10)],
    )
    .unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v2"));
    cupdate(
        &st,
        &o,
        21,
        "d",
        vec![single("c", b"c")],
        vec![since("a", 25)],
    )
    .unwrap();
    // A newer version (20) than the epoch read (10).
    let e = assert_code(
        cupdate(
            &st,
            &o,
            30,
            "d",
            vec![single("a", b"v3")],
            vec![since("a", 10)],
        ),
        -libc::EBUSY,
        "a version newer than the epoch read",
    );
    assert!(e.msg.contains("changed at epoch 20"), "{}", e.msg);
    assert_value(&st, &o, "d", "a", Some(b"v2"));
    // Other akeys, and the same akey of another dkey, do not count.
    cupdate(
        &st,
        &o,
        31,
        "d",
        vec![single("b", b"b2")],
        vec![since("b", 10)],
    )
    .unwrap();
    update(&st, &o, 32, "e", vec![single("a", b"e")]).unwrap();
    cupdate(
        &st,
        &o,
        33,
        "d",
        vec![single("a", b"v3")],
        vec![since("a", 20)],
    )
    .unwrap();

    // A punch of the akey newer than the epoch read.
    punch(&st, &o, 40, "d", &["a"]).unwrap();
    assert_code(
        cupdate(
            &st,
            &o,
            41,
            "d",
            vec![single("a", b"v4")],
            vec![since("a", 33)],
        ),
        -libc::EBUSY,
        "a punch of the akey",
    );
    assert_value(&st, &o, "d", "a", None);
    cupdate(
        &st,
        &o,
        42,
        "d",
        vec![single("a", b"v4")],
        vec![since("a", 40)],
    )
    .unwrap();
    // Of another akey: no change of this one.
    punch(&st, &o, 43, "d", &["b"]).unwrap();
    cupdate(
        &st,
        &o,
        44,
        "d",
        vec![single("z", b"z")],
        vec![since("a", 42)],
    )
    .unwrap();
    // Of the dkey.
    punch(&st, &o, 50, "d", &[]).unwrap();
    assert_code(
        cupdate(
            &st,
            &o,
            51,
            "d",
            vec![single("a", b"v5")],
            vec![since("a", 42)],
        ),
        -libc::EBUSY,
        "a punch of the dkey",
    );
    assert_value(&st, &o, "d", "a", None);
    cupdate(
        &st,
        &o,
        52,
        "d",
        vec![single("a", b"v5")],
        vec![since("a", 50)],
    )
    .unwrap();
    // Of the object.
    punch(&st, &o, 60, "", &[]).unwrap();
    assert_code(
        cupdate(
            &st,
            &o,
            61,
            "d",
            vec![single("a", b"v6")],
            vec![since("a", 52)],
        ),
        -libc::EBUSY,
        "a punch of the object",
    );
    assert_value(&st, &o, "d", "a", None);
    cupdate(
        &st,
        &o,
        62,
        "d",
        vec![single("a", b"v6")],
        vec![since("a", 60)],
    )
    .unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v6"));
    // A punch of another object changes nothing here.
    let other = Obj::new(o.pool, o.cont, 2, 0);
    punch(&st, &other, 70, "", &[]).unwrap();
    cupdate(
        &st,
        &o,
        71,
        "d",
        vec![single("a", b"v7")],
        vec![since("a", 62)],
    )
    .unwrap();

    // A conditional punch: refused after a newer version, nothing punched.
    assert_code(
        cpunch(&st, &o, 80, "d", &["a"], None, vec![since("a", 62)]),
        -libc::EBUSY,
        "conditional punch",
    );
    assert_value(&st, &o, "d", "a", Some(b"v7"));
    cpunch(&st, &o, 81, "d", &[], None, vec![since("a", 71)]).unwrap();
    assert_value(&st, &o, "d", "a", None);
    st.close();
}

#[test]
fn unchanged_since_counts_the_changes_in_flight() {
    let T { _e, st, o, .. } = target();
    update(&st, &o, 10, "d", vec![single("a", b"v1")]).unwrap();
    for (i, first) in [
        update_req(&o, 20, "d", vec![single("a", b"v2")], None, vec![], false),
        punch_req(&o, 20, "d", &["a"], None, vec![]),
        punch_req(&o, 20, "d", &[], None, vec![]),
        punch_req(&o, 20, "", &[], None, vec![]),
    ]
    .into_iter()
    .enumerate()
    {
        let base = 100 * (i as u64 + 1);
        update(&st, &o, base, "d", vec![single("a", b"v1")]).unwrap();
        let mut first = first;
        match &mut first {
            Request::Update(u, _) => u.epoch = base + 10,
            Request::Punch(p) => p.epoch = base + 10,
            _ => unreachable!(),
        }
        let r1 = st.submit(first);
        let r2 = st.submit(update_req(
            &o,
            base + 20,
            "d",
            vec![single("a", b"late")],
            None,
            vec![since("a", base)],
            false,
        ));
        r1.recv().unwrap().unwrap();
        assert_code(
            r2.recv().unwrap().map(|_| ()),
            -libc::EBUSY,
            &format!("behind change {i} in flight"),
        );
        assert_ne!(
            get_single(&st, &o, LATEST, "d", "a").as_deref(),
            Ok(&b"late"[..]),
            "change {i}"
        );
    }
    st.close();
}

#[test]
fn a_change_held_by_another_transaction_refuses_any_condition() {
    let T { _e, st, pool, o } = target();
    update(&st, &o, 10, "d", vec![single("a", b"v1")]).unwrap();
    // Transaction 1 holds a change of "a" prepared.
    cprepare(&st, &o, 1, 20, "d", vec![single("a", b"tx1")], vec![]).unwrap();
    for (what, c) in [
        ("absent", absent("a")),
        ("unchanged since the version read", since("a", 10)),
        ("unchanged since later", since("a", 1000)),
    ] {
        let e = assert_code(
            cupdate(&st, &o, 30, "d", vec![single("a", b"x")], vec![c.clone()]),
            -libc::EBUSY,
            what,
        );
        assert!(e.msg.contains("transaction"), "{what}: {}", e.msg);
        // As another transaction's prepare, and as a punch.
        assert_code(
            cprepare(
                &st,
                &o,
                2,
                30,
                "d",
                vec![single("a", b"x")],
                vec![c.clone()],
            ),
            -libc::EBUSY,
            what,
        );
        assert_code(
            cpunch(&st, &o, 30, "d", &["a"], None, vec![c.clone()]),
            -libc::EBUSY,
            what,
        );
        // Written under a condition on another akey: refused too.
        assert_code(
            cupdate(&st, &o, 30, "d", vec![single("b", b"x")], vec![c]),
            -libc::EBUSY,
            what,
        );
    }
    // (Held: read below it.)
    assert_eq!(get_single(&st, &o, 15, "d", "a").unwrap(), b"v1");
    // Other akeys and dkeys are not held.
    cupdate(&st, &o, 31, "d", vec![single("b", b"b")], vec![absent("b")]).unwrap();
    cupdate(&st, &o, 32, "e", vec![single("a", b"e")], vec![absent("a")]).unwrap();
    // Aborted: the condition is judged on the old value again.
    decide(&st, pool, 1, false).unwrap();
    // None of the refused changes (epoch 30) was stored.
    assert_value(&st, &o, "d", "a", Some(b"v1"));
    assert_eq!(get_single(&st, &o, 30, "d", "b"), Err(-libc::ENOENT));
    assert_code(
        cupdate(&st, &o, 40, "d", vec![single("a", b"x")], vec![absent("a")]),
        -libc::EEXIST,
        "absent after the abort",
    );
    cupdate(
        &st,
        &o,
        41,
        "d",
        vec![single("a", b"v2")],
        vec![since("a", 10)],
    )
    .unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v2"));

    // Committed: its version counts.
    cprepare(&st, &o, 3, 50, "d", vec![single("a", b"tx3")], vec![]).unwrap();
    assert_code(
        cupdate(
            &st,
            &o,
            55,
            "d",
            vec![single("a", b"x")],
            vec![since("a", 41)],
        ),
        -libc::EBUSY,
        "held by 3",
    );
    decide(&st, pool, 3, true).unwrap();
    assert_value(&st, &o, "d", "a", Some(b"tx3"));
    let e = assert_code(
        cupdate(
            &st,
            &o,
            60,
            "d",
            vec![single("a", b"x")],
            vec![since("a", 41)],
        ),
        -libc::EBUSY,
        "unchanged since before the commit",
    );
    assert!(e.msg.contains("changed at epoch 50"), "{}", e.msg);
    assert_code(
        cupdate(&st, &o, 60, "d", vec![single("a", b"x")], vec![absent("a")]),
        -libc::EEXIST,
        "absent after the commit",
    );
    cupdate(
        &st,
        &o,
        61,
        "d",
        vec![single("a", b"v4")],
        vec![since("a", 50)],
    )
    .unwrap();

    // A committed punch: absent holds.
    cpunch(&st, &o, 70, "d", &["a"], Some(4), vec![]).unwrap();
    assert_code(
        cupdate(&st, &o, 75, "d", vec![single("a", b"x")], vec![absent("a")]),
        -libc::EBUSY,
        "a held punch",
    );
    decide(&st, pool, 4, true).unwrap();
    cupdate(
        &st,
        &o,
        80,
        "d",
        vec![single("a", b"v5")],
        vec![absent("a")],
    )
    .unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v5"));
    st.close();
}

#[test]
fn a_held_punch_of_the_dkey_or_object_refuses_conditions() {
    let T { _e, st, pool, o } = target();
    update(&st, &o, 10, "d", vec![single("a", b"v1")]).unwrap();
    update(&st, &o, 10, "e", vec![single("a", b"e1")]).unwrap();
    cpunch(&st, &o, 20, "d", &[], Some(1), vec![]).unwrap();
    assert_code(
        cupdate(
            &st,
            &o,
            30,
            "d",
            vec![single("a", b"x")],
            vec![since("a", 10)],
        ),
        -libc::EBUSY,
        "held dkey punch",
    );
    cupdate(
        &st,
        &o,
        30,
        "e",
        vec![single("a", b"e2")],
        vec![since("a", 10)],
    )
    .unwrap();
    decide(&st, pool, 1, false).unwrap();
    cpunch(&st, &o, 40, "", &[], Some(2), vec![]).unwrap();
    for dkey in ["d", "e", "never-written"] {
        assert_code(
            cupdate(
                &st,
                &o,
                50,
                dkey,
                vec![single("a", b"x")],
                vec![absent("a")],
            ),
            -libc::EBUSY,
            &format!("held object punch, dkey {dkey}"),
        );
    }
    // Another object is not held.
    let other = Obj::new(o.pool, o.cont, 2, 0);
    cupdate(
        &st,
        &other,
        50,
        "d",
        vec![single("a", b"o")],
        vec![absent("a")],
    )
    .unwrap();
    decide(&st, pool, 2, true).unwrap();
    cupdate(
        &st,
        &o,
        60,
        "d",
        vec![single("a", b"v2")],
        vec![absent("a")],
    )
    .unwrap();
    assert_code(
        cupdate(
            &st,
            &o,
            61,
            "e",
            vec![single("a", b"x")],
            vec![since("a", 30)],
        ),
        -libc::EBUSY,
        "after the object punch committed",
    );
    st.close();
}

#[test]
fn a_transaction_preparing_in_the_same_batch_refuses_conditions() {
    let T { _e, st, pool, o } = target();
    update(&st, &o, 10, "d", vec![single("a", b"v1")]).unwrap();
    let r1 = st.submit(update_req(
        &o,
        20,
        "d",
        vec![single("a", b"tx1")],
        Some(1),
        vec![],
        false,
    ));
    let r2 = st.submit(update_req(
        &o,
        21,
        "d",
        vec![single("a", b"x")],
        None,
        vec![since("a", 10)],
        false,
    ));
    let r3 = st.submit(update_req(
        &o,
        21,
        "d",
        vec![single("a", b"y")],
        Some(2),
        vec![since("a", 10)],
        false,
    ));
    r1.recv().unwrap().unwrap();
    assert_code(r2.recv().unwrap().map(|_| ()), -libc::EBUSY, "plain");
    assert_code(
        r3.recv().unwrap().map(|_| ()),
        -libc::EBUSY,
        "transaction 2",
    );
    decide(&st, pool, 1, true).unwrap();
    assert_value(&st, &o, "d", "a", Some(b"tx1"));
    st.close();
}

#[test]
fn a_transactions_own_changes_do_not_count() {
    let T { _e, st, pool, o } = target();
    update(&st, &o, 10, "d", vec![single("a", b"v1")]).unwrap();
    // Transaction 1: an update, then a punch, of one dkey, both expecting
    // the value read at 10 (as a client's transaction that updates some
    // akeys and punches others of one dkey).
    cprepare(
        &st,
        &o,
        1,
        20,
        "d",
        vec![single("a", b"tx1"), single("new", b"n")],
        vec![since("a", 10), absent("new")],
    )
    .unwrap();
    cpunch(
        &st,
        &o,
        20,
        "d",
        &["old"],
        Some(1),
        vec![since("a", 10), absent("new")],
    )
    .unwrap();
    // A third prepare of the dkey, at another epoch: not hindered either.
    cprepare(
        &st,
        &o,
        1,
        21,
        "d",
        vec![single("b", b"b")],
        vec![since("a", 10)],
    )
    .unwrap();
    // Someone else's are.
    assert_code(
        cprepare(
            &st,
            &o,
            2,
            22,
            "d",
            vec![single("c", b"c")],
            vec![since("a", 10)],
        ),
        -libc::EBUSY,
        "transaction 2",
    );
    assert_code(
        cprepare(
            &st,
            &o,
            2,
            22,
            "d",
            vec![single("c", b"c")],
            vec![absent("new")],
        ),
        -libc::EBUSY,
        "transaction 2 on new",
    );
    decide(&st, pool, 1, true).unwrap();
    assert_value(&st, &o, "d", "a", Some(b"tx1"));
    assert_value(&st, &o, "d", "new", Some(b"n"));
    assert_value(&st, &o, "d", "b", Some(b"b"));
    assert_value(&st, &o, "d", "c", None);
    // Same batch: a transaction's two prepares back to back.
    let r1 = st.submit(update_req(
        &o,
        30,
        "e",
        vec![single("a", b"e")],
        Some(5),
        vec![absent("a")],
        false,
    ));
    let r2 = st.submit(punch_req(&o, 30, "e", &["z"], Some(5), vec![absent("a")]));
    r1.recv().unwrap().unwrap();
    r2.recv().unwrap().unwrap();
    decide(&st, pool, 5, true).unwrap();
    assert_value(&st, &o, "e", "a", Some(b"e"));
    st.close();
}

#[test]
fn insert_only_is_refused_busy_while_a_transaction_holds_its_akey() {
    let T { _e, st, pool, o } = target();
    let insert = |epoch: u64, dkey: &str, akey: &str, v: &[u8]| {
        wait(
            &st,
            update_req(&o, epoch, dkey, vec![single(akey, v)], None, vec![], true),
        )
        .map(|_| ())
    };
    cprepare(&st, &o, 1, 10, "d", vec![single("a", b"tx1")], vec![]).unwrap();
    assert_code(insert(20, "d", "a", b"x"), -libc::EBUSY, "insert_only");
    insert(20, "d", "b", b"b").unwrap();
    // Aborted: free, the insert is stored.
    decide(&st, pool, 1, false).unwrap();
    assert_value(&st, &o, "d", "a", None);
    insert(30, "d", "a", b"mine").unwrap();
    assert_value(&st, &o, "d", "a", Some(b"mine"));
    // A held punch of the value: busy, then absent once committed.
    cpunch(&st, &o, 40, "d", &["a"], Some(2), vec![]).unwrap();
    assert_code(insert(50, "d", "a", b"x"), -libc::EBUSY, "held punch");
    decide(&st, pool, 2, true).unwrap();
    assert_value(&st, &o, "d", "a", None);
    insert(60, "d", "a", b"again").unwrap();
    assert_code(insert(61, "d", "a", b"x"), -libc::EEXIST, "stored");
    assert_value(&st, &o, "d", "a", Some(b"again"));
    st.close();
}

#[test]
fn malformed_conditions_are_refused() {
    let T { _e, st, o, .. } = target();
    update(&st, &o, 10, "d", vec![single("a", b"v1")]).unwrap();
    let inval = |r: Result<(), Errno>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.code, -libc::EINVAL, "{what}: {e}");
    };
    let many = |n: usize| -> Vec<Condition> { (0..n).map(|i| absent(&format!("k{i}"))).collect() };
    // At most 64.
    inval(
        cupdate(&st, &o, 20, "d", vec![single("x", b"x")], many(65)),
        "65 conditions",
    );
    inval(
        cpunch(&st, &o, 20, "d", &["a"], None, many(65)),
        "65 conditions on a punch",
    );
    inval(
        cprepare(&st, &o, 1, 20, "d", vec![single("x", b"x")], many(65)),
        "65 conditions in a transaction",
    );
    // An empty akey (one expecting nothing is the engine's conversion's
    // to refuse: engine/src/request/tests.rs).
    inval(
        cupdate(&st, &o, 20, "d", vec![single("x", b"x")], vec![absent("")]),
        "empty akey",
    );
    inval(
        cupdate(
            &st,
            &o,
            20,
            "d",
            vec![single("x", b"x")],
            vec![since("", 5)],
        ),
        "empty akey, unchanged since",
    );
    // A punch with conditions needs a dkey.
    inval(
        cpunch(&st, &o, 20, "", &[], None, vec![since("a", 10)]),
        "object punch with a condition",
    );
    inval(
        cpunch(&st, &o, 20, "", &[], Some(2), vec![since("a", 10)]),
        "object punch with a condition in a transaction",
    );
    // Nothing of them stored.
    assert_value(&st, &o, "d", "x", None);
    assert_value(&st, &o, "d", "a", Some(b"v1"));
    // Exactly 64 is fine.
    cupdate(&st, &o, 30, "d", vec![single("x", b"x")], many(64)).unwrap();
    assert_value(&st, &o, "d", "x", Some(b"x"));
    st.close();
}

#[test]
fn a_prepared_transaction_still_blocks_after_a_restart() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "d", vec![single("a", b"v1")]).unwrap();
    cprepare(&st, &o, 1, 20, "d", vec![single("a", b"tx1")], vec![]).unwrap();
    let check = |st: &Storage, how: &str| {
        for c in [absent("a"), since("a", 10)] {
            assert_code(
                cupdate(st, &o, 30, "d", vec![single("a", b"x")], vec![c]),
                -libc::EBUSY,
                how,
            );
        }
        assert_code(
            wait(
                st,
                update_req(&o, 30, "d", vec![single("a", b"x")], None, vec![], true),
            )
            .map(|_| ()),
            -libc::EBUSY,
            &format!("insert_only {how}"),
        );
    };
    check(&st, "before");
    st.abandon(); // no checkpoint: the WAL is replayed
    let st = Storage::open(&e.opts).unwrap();
    check(&st, "after a replay");
    st.close(); // a checkpoint
    let st = Storage::open(&e.opts).unwrap();
    check(&st, "after a checkpoint");
    decide(&st, pool, 1, false).unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v1"));
    cupdate(
        &st,
        &o,
        40,
        "d",
        vec![single("a", b"v2")],
        vec![since("a", 10)],
    )
    .unwrap();
    assert_value(&st, &o, "d", "a", Some(b"v2"));
    st.close();
}

#[test]
fn conditions_on_array_akeys() {
    let T { _e, st, o, .. } = target();
    let x = |v: &[u8]| vec![extent("arr", 0, v)];
    cupdate(&st, &o, 10, "d", x(&[1; 8]), vec![absent("arr")]).unwrap();
    assert_code(
        cupdate(&st, &o, 20, "d", x(&[2; 8]), vec![absent("arr")]),
        -libc::EEXIST,
        "absent on an array with extents",
    );
    // An extent anywhere in the akey is a change of it.
    update(&st, &o, 30, "d", vec![extent("arr", 4096, &[3; 8])]).unwrap();
    assert_code(
        cupdate(&st, &o, 40, "d", x(&[4; 8]), vec![since("arr", 10)]),
        -libc::EBUSY,
        "an extent elsewhere in the array",
    );
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "arr", 0, 8).unwrap().0,
        [1; 8]
    );
    cupdate(&st, &o, 41, "d", x(&[4; 8]), vec![since("arr", 30)]).unwrap();
    punch(&st, &o, 50, "d", &["arr"]).unwrap();
    cupdate(&st, &o, 51, "d", x(&[5; 8]), vec![absent("arr")]).unwrap();
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "arr", 0, 8).unwrap(),
        (vec![5; 8], 8)
    );
    st.close();
}
