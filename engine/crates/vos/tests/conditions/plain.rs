//! Conditions on their own: absent, unchanged since an epoch, on arrays,
//! malformed ones.

use super::*;

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
