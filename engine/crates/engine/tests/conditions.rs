//! Conditions of transactions (`Transaction::expect`) on real engines: three
//! engines, an RP_3G1 object (a replica of every dkey on each). A condition
//! that holds lets the transaction commit; one that does not fails it with
//! its error and leaves nothing of it on any replica; two clients moving
//! one key at once never both succeed; a condition on a dkey the
//! transaction does not change is refused by the client.

mod common;
use common::*;
use peregrine::placement::{self, ShardLoc};
use peregrine::{Container, Expect, Object};
use peregrine_proto::data::{self, ValueKind};
use peregrine_proto::frame::Opcode;
use peregrine_proto::{ObjectClass, ObjectId, EPOCH_LATEST};
use prost::Message;
use std::time::{Duration, Instant};

const CLASS: ObjectClass = ObjectClass::Rp3G1;
const AKEY: &[u8] = b"v";

fn cluster() -> Cluster {
    Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        },
        384,
        "RP_3G1",
        "crc32c",
    )
}

fn object(cont: &Container, lo: u64) -> Object {
    cont.object(ObjectId::new(CLASS, 7, lo)).unwrap()
}

/// The replicas of `dkey` of `obj`.
fn replicas(obj: &Object, dkey: &[u8]) -> Vec<ShardLoc> {
    let map = obj.container().pool().map();
    let shards = placement::place(&map, obj.id(), CLASS, dkey)
        .unwrap()
        .shards;
    let ranks: std::collections::BTreeSet<u32> =
        shards.iter().map(|l| map.targets[l.target].rank).collect();
    assert_eq!(ranks.len(), 3, "a replica on each engine: {shards:?}");
    shards
}

/// What one replica serves for `akey` of `dkey` (asked directly, not
/// through the client's choice of replica): Some(value) or None (no value);
/// a transaction still being decided there is waited for (a few seconds).
fn read_replica(obj: &Object, loc: &ShardLoc, dkey: &[u8], akey: &[u8]) -> Option<Vec<u8>> {
    let pool = obj.container().pool();
    let map = pool.map();
    let t = &map.targets[loc.target];
    let req = data::FetchReq {
        addr: Some(data::Address {
            pool: map.uuid.as_bytes().to_vec(),
            cont: obj.container().uuid().as_bytes().to_vec(),
            oid: Some(data::ObjectId {
                hi: obj.id().hi,
                lo: obj.id().lo,
            }),
            shard: loc.shard,
            target: t.index,
            map_version: map.version,
            handle: obj.container().handle().to_vec(),
        }),
        epoch: EPOCH_LATEST,
        dkey: dkey.to_vec(),
        iods: vec![data::Iod {
            akey: akey.to_vec(),
            kind: ValueKind::Single as i32,
            ..Default::default()
        }],
    };
    let t0 = Instant::now();
    loop {
        let r = pool
            .client()
            .transport()
            .call(&t.addr, t.index, Opcode::Fetch, &req.encode_to_vec(), &[])
            .unwrap_or_else(|e| panic!("fetch from rank {}: {e}", t.rank));
        let resp = data::Response::decode(r.msg.as_slice()).unwrap();
        let code = resp.status.as_ref().map_or(0, |s| s.code);
        if code == -libc::EINPROGRESS && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        assert_eq!(code, 0, "fetch from rank {}: {resp:?}", t.rank);
        let Some(data::response::Body::Fetch(f)) = resp.body else {
            panic!("fetch reply without body: {resp:?}")
        };
        return match f.values[0].status {
            0 => Some(r.bulk),
            s if s == -libc::ENOENT => None,
            s => panic!("fetch from rank {}: value status {s}", t.rank),
        };
    }
}

/// Every replica of `dkey` serves `want` for `akey`.
#[track_caller]
fn assert_everywhere(obj: &Object, dkey: &[u8], akey: &[u8], want: Option<&[u8]>) {
    for l in replicas(obj, dkey) {
        assert_eq!(
            read_replica(obj, &l, dkey, akey).as_deref(),
            want,
            "replica on target {} of {}/{}",
            l.target,
            String::from_utf8_lossy(dkey),
            String::from_utf8_lossy(akey)
        );
    }
}

/// (a) UnchangedSince the epoch read commits; after another client's update
/// it fails with -EBUSY and nothing of the transaction is anywhere. (b)
/// Absent fails with -EEXIST while the key has a value, and commits once it
/// has none. (d) A condition on a dkey the transaction does not change is
/// the client's -EINVAL.
#[test]
fn conditions_decide_whether_a_transaction_commits() {
    let c = cluster();
    let (cont, other) = (c.container(), c.container());
    let obj = object(&cont, 1);
    let theirs = object(&other, 1);
    obj.update_single(b"d", AKEY, b"v1").unwrap();
    // (See a_transaction_right_after_its_clients_own_update_commits.)
    cont.pool().client().flush_commits();

    // (a) Unchanged since the version read: committed, on every replica.
    let (v, e1) = obj.fetch_single_versioned(b"d", AKEY).unwrap().unwrap();
    assert_eq!(v, b"v1");
    let mut tx = cont.transaction();
    tx.update_single(&obj, b"d", AKEY, b"v2")
        .update_single(&obj, b"side", AKEY, b"s2")
        .expect(&obj, b"d", AKEY, Expect::UnchangedSince(e1));
    tx.commit().unwrap();
    let (v, e2) = obj.fetch_single_versioned(b"d", AKEY).unwrap().unwrap();
    assert_eq!(v, b"v2");
    assert!(e2 > e1, "the new version's epoch {e2} after {e1}");
    // Read by the other client, as it will change it.
    let (v, e_theirs) = theirs.fetch_single_versioned(b"d", AKEY).unwrap().unwrap();
    assert_eq!((v.as_slice(), e_theirs), (&b"v2"[..], e2));
    cont.pool().client().flush_commits();
    assert_everywhere(&obj, b"d", AKEY, Some(b"v2"));
    assert_everywhere(&obj, b"side", AKEY, Some(b"s2"));

    // Another client updates the key (its commits all sent); a transaction
    // decided on the version read before fails, and none of it stays.
    theirs.update_single(b"d", AKEY, b"theirs").unwrap();
    other.pool().client().flush_commits();
    let mut tx = cont.transaction();
    tx.update_single(&obj, b"d", AKEY, b"stale")
        .update_single(&obj, b"side", AKEY, b"s3")
        .update_single(&obj, b"new", AKEY, b"n3")
        .expect(&obj, b"d", AKEY, Expect::UnchangedSince(e2));
    let err = tx.commit().unwrap_err();
    assert_eq!(err.code, -libc::EBUSY, "{err}");
    assert!(err.msg.contains("changed at epoch"), "{err}");
    assert_everywhere(&obj, b"d", AKEY, Some(b"theirs"));
    assert_everywhere(&obj, b"side", AKEY, Some(b"s2"));
    assert_everywhere(&obj, b"new", AKEY, None);
    let fresh = object(&c.container(), 1);
    assert_eq!(
        fresh.fetch_single(b"d", AKEY).unwrap().as_deref(),
        Some(&b"theirs"[..])
    );
    assert_eq!(fresh.fetch_single(b"new", AKEY).unwrap(), None);
    // The same with a punch of the key: refused, nothing punched.
    let mut tx = cont.transaction();
    tx.punch_dkey(&obj, b"d")
        .expect(&obj, b"d", AKEY, Expect::UnchangedSince(e2));
    assert_eq!(tx.commit().unwrap_err().code, -libc::EBUSY);
    assert_everywhere(&obj, b"d", AKEY, Some(b"theirs"));
    // And punched by the other client (punch_akeys): the version read
    // before the punch no longer is the latest either.
    let (_, e3) = obj.fetch_single_versioned(b"d", AKEY).unwrap().unwrap();
    let mut tx = other.transaction();
    tx.punch_akeys(&theirs, b"d", &[AKEY])
        .expect(&theirs, b"d", AKEY, Expect::UnchangedSince(e3));
    tx.commit().unwrap();
    other.pool().client().flush_commits();
    assert_everywhere(&obj, b"d", AKEY, None);
    let mut tx = cont.transaction();
    tx.update_single(&obj, b"d", AKEY, b"stale").expect(
        &obj,
        b"d",
        AKEY,
        Expect::UnchangedSince(e3),
    );
    assert_eq!(tx.commit().unwrap_err().code, -libc::EBUSY);
    assert_everywhere(&obj, b"d", AKEY, None);

    // (b) Absent: refused while there is a value, nothing stored.
    obj.update_single(b"b", AKEY, b"here").unwrap();
    cont.pool().client().flush_commits();
    let mut tx = cont.transaction();
    tx.update_single(&obj, b"b", AKEY, b"over")
        .update_single(&obj, b"b2", AKEY, b"x")
        .expect(&obj, b"b", AKEY, Expect::Absent);
    let err = tx.commit().unwrap_err();
    assert_eq!(err.code, -libc::EEXIST, "{err}");
    assert_everywhere(&obj, b"b", AKEY, Some(b"here"));
    assert_everywhere(&obj, b"b2", AKEY, None);
    // Absent where there is none: committed.
    let mut tx = cont.transaction();
    tx.update_single(&obj, b"b3", AKEY, b"created")
        .expect(&obj, b"b3", AKEY, Expect::Absent);
    tx.commit().unwrap();
    cont.pool().client().flush_commits();
    assert_everywhere(&obj, b"b3", AKEY, Some(b"created"));
    // Now it has one.
    let mut tx = other.transaction();
    tx.update_single(&theirs, b"b3", AKEY, b"again")
        .expect(&theirs, b"b3", AKEY, Expect::Absent);
    assert_eq!(tx.commit().unwrap_err().code, -libc::EEXIST);
    assert_everywhere(&obj, b"b3", AKEY, Some(b"created"));

    // A move between two akeys of one dkey (a rename within a directory):
    // two changes of the dkey on each replica, each carrying both
    // conditions; the transaction's own change does not count against
    // the other's.
    obj.update_single(b"dir", b"old", b"entry").unwrap();
    cont.pool().client().flush_commits();
    let (_, e) = obj.fetch_single_versioned(b"dir", b"old").unwrap().unwrap();
    let mut tx = cont.transaction();
    tx.punch_akeys(&obj, b"dir", &[b"old"])
        .update_single(&obj, b"dir", b"new", b"entry")
        .expect(&obj, b"dir", b"old", Expect::UnchangedSince(e))
        .expect(&obj, b"dir", b"new", Expect::Absent);
    tx.commit().unwrap();
    cont.pool().client().flush_commits();
    assert_everywhere(&obj, b"dir", b"old", None);
    assert_everywhere(&obj, b"dir", b"new", Some(b"entry"));
    // Moved on with the epoch read before the first move: refused.
    let mut tx = other.transaction();
    tx.punch_akeys(&theirs, b"dir", &[b"new"])
        .update_single(&theirs, b"dir", b"third", b"entry")
        .expect(&theirs, b"dir", b"new", Expect::UnchangedSince(e))
        .expect(&theirs, b"dir", b"third", Expect::Absent);
    assert_eq!(tx.commit().unwrap_err().code, -libc::EBUSY);
    assert_everywhere(&obj, b"dir", b"new", Some(b"entry"));
    assert_everywhere(&obj, b"dir", b"third", None);

    // (d) A condition on a dkey the transaction does not change: refused by
    // the client, nothing sent.
    let other_obj = object(&cont, 2);
    for (o, dkey) in [(&obj, &b"elsewhere"[..]), (&other_obj, &b"c"[..])] {
        let mut tx = cont.transaction();
        tx.update_single(&obj, b"c", AKEY, b"c1")
            .expect(o, dkey, AKEY, Expect::Absent);
        let err = tx.commit().unwrap_err();
        assert_eq!(err.code, -libc::EINVAL, "{err}");
        assert!(err.msg.contains("no change of that dkey"), "{err}");
    }
    assert_everywhere(&obj, b"c", AKEY, None);
}

/// (c) Two clients move one key at once (punch of dkey A expecting it
/// unchanged since the epoch each read, plus an update of a new name
/// expecting it absent), round after round: exactly one move commits per
/// round and the value is under exactly one name afterwards. A mover
/// refused (-EBUSY, or -EEXIST when both chose one name) reads again and
/// retries while the key is still there.
#[test]
fn two_clients_moving_one_key_never_both_succeed() {
    const ROUNDS: u64 = 100;
    let c = cluster();
    let conts = [c.container(), c.container()];
    let setup = object(&conts[0], 3);
    let fresh = object(&c.container(), 3);
    let t0 = Instant::now();
    let mut contended = 0;
    for round in 0..ROUNDS {
        let src = format!("A{round}").into_bytes();
        let value = format!("value of round {round}").into_bytes();
        setup.update_single(&src, AKEY, &value).unwrap();
        conts[0].pool().client().flush_commits();
        // Odd rounds: both move it to one name (decided by either condition).
        let dst = |who: usize| {
            let who = if round % 2 == 1 { 0 } else { who };
            format!("B{round}-{who}").into_bytes()
        };
        let barrier = std::sync::Barrier::new(2);
        let won: Vec<(bool, u32)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|who| {
                    let (cont, barrier, src, dst) = (&conts[who], &barrier, &src, dst(who));
                    s.spawn(move || {
                        let obj = object(cont, 3);
                        let mut seed = (round * 2 + who as u64 + 1) * 0x9E37_79B9;
                        barrier.wait();
                        let mut tries = 0u32;
                        loop {
                            tries += 1;
                            let Some((v, epoch)) = obj.fetch_single_versioned(src, AKEY).unwrap()
                            else {
                                return (false, tries);
                            };
                            let mut tx = cont.transaction();
                            tx.punch_dkey(&obj, src)
                                .expect(&obj, src, AKEY, Expect::UnchangedSince(epoch))
                                .update_single(&obj, &dst, AKEY, &v)
                                .expect(&obj, &dst, AKEY, Expect::Absent);
                            match tx.commit() {
                                Ok(()) => return (true, tries),
                                Err(e) if e.code == -libc::EBUSY || e.code == -libc::EEXIST => {
                                    assert!(tries < 500, "round {round}: {tries} tries: {e}");
                                    seed ^= seed << 13;
                                    seed ^= seed >> 7;
                                    seed ^= seed << 17;
                                    std::thread::sleep(Duration::from_micros(200 + seed % 5000));
                                }
                                Err(e) => panic!("round {round} client {who}: {e}"),
                            }
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<usize> = (0..2).filter(|&w| won[w].0).collect();
        // The loser tried a commit too (refused), not only read.
        contended += u32::from(won.iter().any(|&(w, tries)| !w && tries > 1));
        assert_eq!(winners.len(), 1, "round {round}: {won:?}");
        for cont in &conts {
            cont.pool().client().flush_commits();
        }
        // Through a third client, and on every replica.
        let mut names = vec![src.clone(), dst(0), dst(1)];
        names.dedup();
        let holding: Vec<&Vec<u8>> = names
            .iter()
            .filter(|n| {
                let v = fresh.fetch_single(n, AKEY).unwrap();
                assert!(v.is_none() || v.as_deref() == Some(&value[..]), "{v:?}");
                v.is_some()
            })
            .collect();
        assert_eq!(
            holding,
            vec![&dst(winners[0])],
            "round {round}: the value under exactly the winner's name ({won:?})"
        );
        for n in &names {
            let want = (*n == dst(winners[0])).then_some(&value[..]);
            assert_everywhere(&setup, n, AKEY, want);
        }
    }
    eprintln!(
        "{ROUNDS} rounds in {:?}, {contended} with the loser's commit refused",
        t0.elapsed()
    );
}

/// A transaction right after this client's own update of its key, decided
/// on the version read back: the condition holds, and no other client
/// touches the key, so it must commit. The update's commits go to the
/// replicas in the background; a replica that has not heard its commit yet
/// still holds the update prepared and refuses the condition with -EBUSY,
/// so `Transaction::commit` sends this client's own commits and tries once
/// more on -EBUSY, as reads and `insert_single` do.
#[test]
fn a_transaction_right_after_its_clients_own_update_commits() {
    let c = cluster();
    let cont = c.container();
    let obj = object(&cont, 9);
    let mut busy = Vec::new();
    for i in 0..100u32 {
        let k = format!("k{i}").into_bytes();
        obj.update_single(&k, AKEY, b"v1").unwrap();
        // The version read back, or simply now (after the update).
        let e = if i % 2 == 0 {
            obj.fetch_single_versioned(&k, AKEY).unwrap().unwrap().1
        } else {
            peregrine::hlc::now()
        };
        let mut tx = cont.transaction();
        tx.update_single(&obj, &k, AKEY, b"v2")
            .expect(&obj, &k, AKEY, Expect::UnchangedSince(e));
        match tx.commit() {
            Ok(()) => {}
            Err(e) if e.code == -libc::EBUSY => busy.push(e.msg),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        busy.is_empty(),
        "{} of 100 refused, e.g.: {}",
        busy.len(),
        busy[0]
    );
}

/// WrittenAt (an unlink of a file this client created, without reading
/// its entry first) commits only while the version written at that epoch
/// is the live one: not after another client's update, not after a punch,
/// and not once aggregation has dropped the punch and what it hid, where
/// UnchangedSince can no longer tell and would let a stale remover punch.
#[test]
fn written_at_holds_only_for_the_live_version_written_then() {
    let c = cluster();
    let (cont, other) = (c.container(), c.container());
    let obj = object(&cont, 3);
    let theirs = object(&other, 3);
    let punch_if = |dkey: &[u8], expect: Expect| {
        let mut tx = cont.transaction();
        tx.punch_dkey(&obj, dkey).expect(&obj, dkey, AKEY, expect);
        tx.commit()
    };

    // The version written: removed, on every replica.
    let e1 = obj.insert_single(b"mine", AKEY, b"entry").unwrap();
    let (_, read) = obj.fetch_single_versioned(b"mine", AKEY).unwrap().unwrap();
    assert_eq!(read, e1, "the epoch the insert returned is the version's");
    let err = punch_if(b"mine", Expect::WrittenAt(e1 - 1)).unwrap_err();
    assert_eq!(err.code, -libc::EBUSY, "{err}");
    assert!(
        err.msg.contains(&format!("not at epoch {}", e1 - 1)),
        "{err}"
    );
    punch_if(b"mine", Expect::WrittenAt(e1)).unwrap();
    cont.pool().client().flush_commits();
    assert_everywhere(&obj, b"mine", AKEY, None);
    // Once removed, the same expectation fails: nothing punched again.
    let err = punch_if(b"mine", Expect::WrittenAt(e1)).unwrap_err();
    assert_eq!(err.code, -libc::EBUSY, "{err}");
    assert!(err.msg.contains("punched at epoch"), "{err}");

    // Replaced by another client: refused, theirs stays.
    let e2 = obj.insert_single(b"replaced", AKEY, b"entry").unwrap();
    theirs.update_single(b"replaced", AKEY, b"theirs").unwrap();
    other.pool().client().flush_commits();
    let err = punch_if(b"replaced", Expect::WrittenAt(e2)).unwrap_err();
    assert_eq!(err.code, -libc::EBUSY, "{err}");
    assert_everywhere(&obj, b"replaced", AKEY, Some(b"theirs"));

    // Removed by another client, then aggregated on every engine: no
    // version and no punch are left. UnchangedSince holds on nothing;
    // WrittenAt does not.
    let e3 = obj.insert_single(b"gone", AKEY, b"entry").unwrap();
    theirs.punch_akeys(b"gone", &[AKEY]).unwrap();
    other.pool().client().flush_commits();
    c.aggregate("pool");
    let err = punch_if(b"gone", Expect::WrittenAt(e3)).unwrap_err();
    assert_eq!(err.code, -libc::EBUSY, "{err}");
    assert!(err.msg.contains("no value"), "{err}");
    punch_if(b"gone", Expect::UnchangedSince(e3)).unwrap();
}
