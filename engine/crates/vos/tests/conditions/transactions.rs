//! Conditions next to transactions: changes in flight and held by others
//! count, a transaction's own do not, and a prepared one still blocks after
//! a restart.

use super::*;

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
