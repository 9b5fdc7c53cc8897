//! Reintegration of a returning target: `ListChanged` (the dkeys changed
//! since an epoch), `ListRecords` (the versions and punches of one dkey
//! above it), and fetches and size queries that tell absence from zeros.

mod common;

use common::*;
use peregrine_vos::*;
use uuid::Uuid;

/// One `ListChanged` call: (keys as (cont, lo, shard, dkey), done).
fn changed(
    st: &Storage,
    pool: Uuid,
    target: u32,
    since: u64,
    anchor: Option<ChangedKey>,
    max: u32,
) -> Result<(Vec<ChangedKey>, bool), Errno> {
    let req = ListChangedReq {
        // Only the pool and the target are read.
        addr: PoolAddress { pool, target },
        since,
        anchor,
        max,
    };
    let (resp, _) = wait(st, Request::ListChanged(req))?;
    let Answer::Changed { keys, done } = resp else {
        panic!("list changed reply without body")
    };
    Ok((keys, done))
}

type Key = (Uuid, u64, u32, Vec<u8>);

fn key(k: &ChangedKey) -> Key {
    let oid = k.oid;
    assert_eq!(oid.hi, 1 << 56);
    (k.cont, oid.lo, k.shard, k.dkey.clone())
}

/// Every changed key, following anchors, `max` per call.
fn changed_all(st: &Storage, pool: Uuid, since: u64, max: u32) -> Vec<Key> {
    let mut all = Vec::new();
    let mut anchor = None;
    loop {
        let (keys, done) = changed(st, pool, 0, since, anchor.clone(), max).unwrap();
        assert!(
            keys.len() <= max as usize,
            "{} keys > max {max}",
            keys.len()
        );
        if !done {
            assert_eq!(keys.len(), max as usize, "a page not done is full");
        }
        for k in keys.iter().map(key) {
            // Strictly ascending, and strictly after the anchor.
            assert!(all.last() < Some(&k), "{k:?} listed after {:?}", all.last());
            all.push(k);
        }
        if done {
            return all;
        }
        anchor = keys.last().cloned();
    }
}

fn records(st: &Storage, o: &Obj, dkey: &str, since: u64) -> Result<Vec<Record>, Errno> {
    let req = ListRecordsReq {
        addr: o.addr(),
        dkey: dkey.as_bytes().to_vec(),
        since,
    };
    let (resp, _) = wait(st, Request::ListRecords(req))?;
    let Answer::Records(r) = resp else {
        panic!("list records reply without body")
    };
    Ok(r)
}

fn value(epoch: u64, akey: &str, kind: ValueKind, offset: u64, len: u64) -> Record {
    Record {
        kind: RecordKind::Value,
        epoch,
        akey: akey.as_bytes().to_vec(),
        value_kind: kind,
        offset,
        len,
    }
}

fn punched(kind: RecordKind, epoch: u64, akey: &str) -> Record {
    Record {
        kind,
        epoch,
        akey: akey.as_bytes().to_vec(),
        value_kind: ValueKind::Single,
        offset: 0,
        len: 0,
    }
}

fn array_iod(akey: &str, offset: u64, len: u64) -> Iod {
    Iod {
        akey: akey.as_bytes().to_vec(),
        kind: array(offset),
        len,
        ..Default::default()
    }
}

#[test]
fn list_changed_pages_in_order_across_containers_and_objects() {
    let e = env(64, 2);
    let (st, pool, c1) = open_with_pool(&e, 16 * MIB);
    let c2 = Uuid::new_v4();
    let mut want = Vec::new();
    for cont in [c2, c1] {
        for lo in [7u64, 3] {
            let o = Obj::new(pool, cont, lo, 0);
            for d in ["k", "b", "x"] {
                update(&st, &o, 10, d, vec![single("a", b"v")]).unwrap();
                want.push((cont, lo, 0u32, d.as_bytes().to_vec()));
            }
        }
    }
    // Another target's keys are not this target's.
    update(
        &st,
        &Obj::new(pool, c1, 5, 1),
        10,
        "t1",
        vec![single("a", b"v")],
    )
    .unwrap();
    want.sort();

    for max in [1, 2, 5, 12, 13] {
        assert_eq!(changed_all(&st, pool, 0, max), want, "max {max}");
    }
    let (keys, done) = changed(&st, pool, 0, 0, None, 0).unwrap();
    assert_eq!(
        (keys.iter().map(key).collect::<Vec<_>>(), done),
        (want.clone(), true)
    );
    // Exactly as many as asked: the listing says it is complete.
    let (keys, done) = changed(&st, pool, 0, 0, None, 12).unwrap();
    assert_eq!((keys.len(), done), (12, true));
    let (keys, done) = changed(&st, pool, 0, 0, None, 11).unwrap();
    assert_eq!((keys.len(), done), (11, false));

    // An anchor in the middle of an object resumes right after it.
    let anchor = ChangedKey {
        cont: want[4].0,
        oid: ObjectId {
            hi: 1 << 56,
            lo: want[4].1,
        },
        shard: 0,
        dkey: want[4].3.clone(),
    };
    let (keys, _) = changed(&st, pool, 0, 0, Some(anchor.clone()), 3).unwrap();
    assert_eq!(keys.iter().map(key).collect::<Vec<_>>(), want[5..8]);
    // A dkey that is not there (e.g. aggregated away since) anchors too.
    let between = ChangedKey {
        dkey: b"c".to_vec(),
        ..anchor.clone()
    };
    let (keys, _) = changed(&st, pool, 0, 0, Some(between), 1).unwrap();
    assert_eq!(key(&keys[0]), (want[4].0, want[4].1, 0, b"k".to_vec()));
    // A higher shard of the same object sorts after all of shard 0's dkeys.
    let shard1 = ChangedKey {
        shard: 1,
        dkey: Vec::new(),
        ..anchor
    };
    let (keys, _) = changed(&st, pool, 0, 0, Some(shard1), 1).unwrap();
    assert_eq!(key(&keys[0]), want[6]);

    // Target 1 lists its own.
    let (keys, done) = changed(&st, pool, 1, 0, None, 0).unwrap();
    assert_eq!(
        (keys.iter().map(key).collect::<Vec<_>>(), done),
        (vec![(c1, 5, 0, b"t1".to_vec())], true)
    );
}

#[test]
fn list_changed_filters_by_epoch_and_lists_punches() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let p = Obj::new(pool, cont, 2, 0);
    for d in ["a", "b", "c", "d"] {
        update(
            &st,
            &o,
            10,
            d,
            vec![single("s", b"old"), extent("x", 0, b"old")],
        )
        .unwrap();
    }
    for d in ["p", "q"] {
        update(&st, &p, 10, d, vec![single("s", b"old")]).unwrap();
    }
    let keys = |since| {
        changed_all(&st, pool, since, 2)
            .into_iter()
            .map(|(_, lo, _, d)| (lo, String::from_utf8(d).unwrap()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        keys(10),
        vec![],
        "nothing above 10 yet (since is exclusive)"
    );
    update(&st, &o, 20, "b", vec![extent("x", 2, b"new")]).unwrap();
    update(&st, &o, 21, "c", vec![single("s", b"new")]).unwrap();
    assert_eq!(keys(15), vec![(1, "b".into()), (1, "c".into())]);
    assert_eq!(keys(20), vec![(1, "c".into())]);
    assert_eq!(keys(21), vec![]);
    assert_eq!(keys(9).len(), 6, "all of them above 9");

    // An akey punch and a dkey punch count as changes of their dkey.
    punch(&st, &o, 30, "a", &["x"]).unwrap();
    punch(&st, &o, 31, "d", &[]).unwrap();
    assert_eq!(keys(25), vec![(1, "a".into()), (1, "d".into())]);
    // A punched dkey is still listed (its punch is the change to copy).
    assert_eq!(keys(30), vec![(1, "d".into())]);

    // An object punch lists every dkey of the object.
    punch(&st, &p, 40, "", &[]).unwrap();
    assert_eq!(keys(35), vec![(2, "p".into()), (2, "q".into())]);
    assert_eq!(keys(40), vec![]);
}

#[test]
fn list_changed_checks_its_address() {
    let e = env(64, 2);
    let (st, pool, _) = open_with_pool(&e, 16 * MIB);
    let err = changed(&st, Uuid::new_v4(), 0, 0, None, 0).unwrap_err();
    assert_eq!(err.code, -libc::ENOENT, "{}", err.msg);
    assert!(err.msg.contains("not found"), "{}", err.msg);
    // An empty pool lists nothing, and is done.
    assert_eq!(changed(&st, pool, 1, 0, None, 0).unwrap(), (vec![], true));
    // The address names the target that gets the request.
    let req = ListChangedReq {
        addr: PoolAddress { pool, target: 1 },
        ..Default::default()
    };
    assert!(wait(&st, Request::ListChanged(req)).is_ok());
    // A malformed pool, an anchor without an object, no address: the
    // engine's conversion refuses them (engine/src/request/tests.rs).
    // ListRecords: an unknown pool is ENOENT, an unknown object has no records.
    let o = Obj::new(Uuid::new_v4(), Uuid::new_v4(), 1, 0);
    assert_eq!(records(&st, &o, "d", 0).unwrap_err().code, -libc::ENOENT);
    let o = Obj::new(pool, Uuid::new_v4(), 1, 0);
    assert_eq!(records(&st, &o, "d", 0).unwrap(), vec![]);
}

#[test]
fn list_records_lists_visible_values_with_their_epochs() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "d", vec![single("s", b"v1")]).unwrap();
    update(&st, &o, 20, "d", vec![single("s", b"v22")]).unwrap();
    // Array "x": [0,8)@10 wholly covered by [0,8)@30; [8,16)@20 partly
    // covered by [2,10)@40; of the two writes at 40, the later covers the
    // earlier [4,8) wholly.
    update(&st, &o, 10, "d", vec![extent("x", 0, &[1; 8])]).unwrap();
    update(&st, &o, 20, "d", vec![extent("x", 8, &[2; 8])]).unwrap();
    update(&st, &o, 30, "d", vec![extent("x", 0, &[3; 8])]).unwrap();
    update(&st, &o, 40, "d", vec![extent("x", 4, &[4; 4])]).unwrap();
    update(&st, &o, 40, "d", vec![extent("x", 2, &[5; 8])]).unwrap();
    // A large value (on the device) is listed as any other.
    let big = pattern(1, 64 << 10);
    update(&st, &o, 15, "d", vec![extent("y", 4096, &big)]).unwrap();

    let all = records(&st, &o, "d", 0).unwrap();
    assert_eq!(
        all,
        vec![
            value(20, "s", ValueKind::Single, 0, 3),
            value(20, "x", ValueKind::Array, 8, 8),
            value(30, "x", ValueKind::Array, 0, 8),
            value(40, "x", ValueKind::Array, 2, 8),
            value(15, "y", ValueKind::Array, 4096, 64 << 10),
        ]
    );
    assert_eq!(
        records(&st, &o, "d", 20).unwrap(),
        vec![
            value(30, "x", ValueKind::Array, 0, 8),
            value(40, "x", ValueKind::Array, 2, 8),
        ]
    );
    assert_eq!(records(&st, &o, "d", 40).unwrap(), vec![]);
    assert_eq!(records(&st, &o, "nope", 0).unwrap(), vec![]);
    assert_eq!(records(&st, &o, "", 0).unwrap(), vec![], "no object punch");

    // What a copier does: fetch each value at its own epoch, over its
    // extent, and write it at that epoch on the copy. The copy then reads
    // as the source at the latest epoch.
    let copy = Obj::new(pool, Uuid::new_v4(), 1, 0);
    for r in &all {
        let akey = String::from_utf8(r.akey.clone()).unwrap();
        if r.value_kind == ValueKind::Single {
            let v = get_single(&st, &o, r.epoch, "d", &akey).unwrap();
            update(&st, &copy, r.epoch, "d", vec![single(&akey, &v)]).unwrap();
        } else {
            let (v, _) = get_array(&st, &o, r.epoch, "d", &akey, r.offset, r.len).unwrap();
            update(&st, &copy, r.epoch, "d", vec![extent(&akey, r.offset, &v)]).unwrap();
        }
    }
    let latest = u64::MAX;
    assert_eq!(get_single(&st, &copy, latest, "d", "s").unwrap(), b"v22");
    for (akey, len) in [("x", 16), ("y", 4096 + (64 << 10))] {
        assert_eq!(
            get_array(&st, &copy, latest, "d", akey, 0, len).unwrap(),
            get_array(&st, &o, latest, "d", akey, 0, len).unwrap(),
            "akey {akey}"
        );
    }
    assert_eq!(
        get_array(&st, &copy, latest, "d", "x", 0, 16).unwrap().0,
        [3, 3, 5, 5, 5, 5, 5, 5, 5, 5, 2, 2, 2, 2, 2, 2]
    );
}

#[test]
fn list_records_lists_punches_at_each_level() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "d", vec![single("a", b"1"), single("b", b"1")]).unwrap();
    update(&st, &o, 10, "e", vec![single("a", b"1")]).unwrap();
    punch(&st, &o, 20, "d", &["a"]).unwrap();
    // Values older than a punch hide; newer ones show.
    update(&st, &o, 25, "d", vec![single("a", b"2")]).unwrap();
    punch(&st, &o, 30, "d", &[]).unwrap();
    update(&st, &o, 35, "d", vec![single("b", b"3")]).unwrap();
    assert_eq!(
        records(&st, &o, "d", 0).unwrap(),
        vec![
            punched(RecordKind::PunchDkey, 30, ""),
            punched(RecordKind::PunchAkey, 20, "a"),
            value(35, "b", ValueKind::Single, 0, 1),
        ],
        "a@25 is hidden by the dkey punch at 30"
    );
    assert_eq!(
        records(&st, &o, "d", 20).unwrap(),
        vec![
            punched(RecordKind::PunchDkey, 30, ""),
            value(35, "b", ValueKind::Single, 0, 1),
        ]
    );
    assert_eq!(
        records(&st, &o, "d", 30).unwrap(),
        vec![value(35, "b", ValueKind::Single, 0, 1)]
    );

    punch(&st, &o, 40, "", &[]).unwrap();
    update(&st, &o, 45, "e", vec![single("a", b"4")]).unwrap();
    assert_eq!(
        records(&st, &o, "d", 0).unwrap(),
        vec![
            punched(RecordKind::PunchObject, 40, ""),
            punched(RecordKind::PunchDkey, 30, ""),
            punched(RecordKind::PunchAkey, 20, "a"),
        ],
        "everything of d is hidden by the object punch"
    );
    assert_eq!(
        records(&st, &o, "e", 35).unwrap(),
        vec![
            punched(RecordKind::PunchObject, 40, ""),
            value(45, "a", ValueKind::Single, 0, 1),
        ]
    );
    assert_eq!(
        records(&st, &o, "", 0).unwrap(),
        vec![punched(RecordKind::PunchObject, 40, "")],
        "an empty dkey lists the object punches only"
    );
    assert_eq!(records(&st, &o, "", 40).unwrap(), vec![]);
}

#[test]
fn fetch_tells_absence_from_written_zeros() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "d", vec![extent("zeros", 0, &[0; 8])]).unwrap();
    update(&st, &o, 10, "d", vec![extent("far", 100, b"x")]).unwrap();
    update(&st, &o, 10, "d", vec![single("s", b"")]).unwrap();
    let got = fetch_iods(
        &st,
        &o,
        u64::MAX,
        "d",
        vec![
            array_iod("zeros", 0, 8),
            array_iod("never", 0, 8),
            array_iod("far", 0, 8),
            Iod {
                akey: b"s".to_vec(),
                ..Default::default()
            },
            Iod {
                akey: b"nos".to_vec(),
                ..Default::default()
            },
        ],
    )
    .unwrap();
    let show: Vec<(i32, bool, u64, Vec<u8>)> = got
        .into_iter()
        .map(|(v, b)| (v.status, v.absent, v.size, b))
        .collect();
    assert_eq!(
        show,
        vec![
            (0, false, 8, vec![0; 8]),
            (0, true, 0, vec![0; 8]),
            (0, false, 101, vec![0; 8]),
            (0, false, 0, vec![]),
            (-libc::ENOENT, true, 0, vec![]),
        ],
        "written zeros, nothing, a hole, an empty single value, no single value"
    );
    // Before it was written, and after a punch, the akey is absent.
    punch(&st, &o, 20, "d", &["zeros"]).unwrap();
    for (epoch, absent) in [(5, true), (10, false), (19, false), (20, true)] {
        let (v, b) = fetch_iods(&st, &o, epoch, "d", vec![array_iod("zeros", 0, 8)])
            .unwrap()
            .remove(0);
        assert_eq!(
            (v.status, v.absent, b),
            (0, absent, vec![0; 8]),
            "epoch {epoch}"
        );
    }
    // In a dkey or an object that is not there.
    let (v, _) = fetch_iods(&st, &o, 30, "nope", vec![array_iod("zeros", 0, 8)])
        .unwrap()
        .remove(0);
    assert!(v.absent);
    let other = Obj::new(pool, cont, 2, 0);
    let (v, _) = fetch_iods(&st, &other, 30, "d", vec![array_iod("zeros", 0, 8)])
        .unwrap()
        .remove(0);
    assert!(v.absent);
}

#[test]
fn query_size_says_absent() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    update(&st, &o, 10, "d", vec![extent("x", 0, &[0; 4])]).unwrap();
    update(&st, &o, 10, "d", vec![single("s", b"")]).unwrap();
    let s = |epoch, akey| {
        let r = query_size_resp(&st, &o, epoch, "d", akey);
        (r.size, r.absent)
    };
    assert_eq!(s(u64::MAX, "x"), (4, false));
    assert_eq!(s(u64::MAX, "s"), (0, false), "an empty value is a value");
    assert_eq!(s(u64::MAX, "never"), (0, true));
    assert_eq!(s(9, "x"), (0, true));
    punch(&st, &o, 20, "d", &["x"]).unwrap();
    assert_eq!(s(19, "x"), (4, false));
    assert_eq!(s(20, "x"), (0, true));
    assert_eq!(query_size(&st, &o, 20, "d", "x"), 0);
}
