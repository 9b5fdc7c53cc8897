//! Unit tests of the index: visibility, aggregation, checkpoint formats, listings.

use super::list::punch_record;
use super::*;
use crate::request::LastSized;

fn inline(b: &[u8]) -> Payload {
    Payload::Inline(b.into())
}

fn setup() -> (TargetIndex, Uuid, Uuid, ObjKey) {
    let mut ix = TargetIndex::default();
    let pool = Uuid::new_v4();
    ix.apply(
        WalOp::PoolCreate {
            pool,
            scm: 1 << 20,
            nvme: 1 << 20,
        },
        &mut Released::default(),
    );
    (
        ix,
        pool,
        Uuid::new_v4(),
        ObjKey {
            hi: 1,
            lo: 2,
            shard: 0,
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn put(
    ix: &mut TargetIndex,
    pool: Uuid,
    cont: Uuid,
    obj: ObjKey,
    epoch: u64,
    kind: Kind,
    off: u64,
    b: &[u8],
) {
    ix.apply(
        WalOp::Update {
            pool,
            cont,
            obj,
            dkey: b"d".to_vec(),
            epoch,
            values: vec![NewValue {
                akey: b"a".to_vec(),
                kind,
                offset: off,
                len: b.len() as u64,
                crc: None,
                payload: inline(b),
            }],
        },
        &mut Released::default(),
    );
}

#[allow(clippy::too_many_arguments)]
fn read(
    ix: &TargetIndex,
    pool: Uuid,
    cont: Uuid,
    obj: ObjKey,
    kind: Kind,
    off: u64,
    len: u64,
    r: u64,
) -> (i32, Vec<u8>, u64) {
    let p = ix.plan_fetch(&pool, &cont, &obj, b"d", b"a", kind, off, len, r);
    let mut out = vec![0u8; p.len as usize];
    for s in p.segs {
        let Src::Inline(b) = s.src else { panic!() };
        out[s.out_off as usize..(s.out_off + s.len) as usize].copy_from_slice(&b);
    }
    (p.status, out, p.size)
}

#[test]
fn array_overlaps_epochs_and_aggregation() {
    let (mut ix, pool, cont, obj) = setup();
    put(&mut ix, pool, cont, obj, 10, Kind::Array, 0, b"aaaaaaaa");
    put(&mut ix, pool, cont, obj, 20, Kind::Array, 2, b"bb");
    put(&mut ix, pool, cont, obj, 30, Kind::Array, 12, b"cc");
    assert_eq!(
        read(&ix, pool, cont, obj, Kind::Array, 0, 14, u64::MAX),
        (0, b"aabbaaaa\0\0\0\0cc".to_vec(), 14)
    );
    assert_eq!(
        read(&ix, pool, cont, obj, Kind::Array, 1, 4, 15),
        (0, b"aaaa".to_vec(), 8)
    );
    // Fully cover the first extent; with a snapshot at 15 it must stay.
    put(&mut ix, pool, cont, obj, 40, Kind::Array, 0, b"dddddddd");
    ix.apply(
        WalOp::SetSnapshots {
            pool,
            cont,
            epochs: vec![15],
        },
        &mut Released::default(),
    );
    let mut rel = Released::default();
    ix.apply(WalOp::Aggregate { pool }, &mut rel);
    let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
    assert_eq!(
        a.extents.iter().map(|x| x.epoch).collect::<Vec<_>>(),
        vec![10, 30, 40]
    );
    assert!(rel.scm > 0);
    assert_eq!(
        read(&ix, pool, cont, obj, Kind::Array, 0, 8, 15).1,
        b"aaaaaaaa"
    );
    ix.apply(
        WalOp::SetSnapshots {
            pool,
            cont,
            epochs: vec![],
        },
        &mut Released::default(),
    );
    ix.apply(WalOp::Aggregate { pool }, &mut Released::default());
    let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
    assert_eq!(
        a.extents.iter().map(|x| x.epoch).collect::<Vec<_>>(),
        vec![30, 40]
    );
}

/// Extents of one epoch written again over themselves (a reintegration
/// copying what the target held) go at the next aggregation even above
/// the epoch it runs up to, and reads do not change.
#[test]
fn aggregation_drops_extents_covered_by_later_ones_of_their_epoch() {
    let (mut ix, pool, cont, obj) = setup();
    put(&mut ix, pool, cont, obj, 10, Kind::Array, 0, b"aaaaaaaa");
    put(&mut ix, pool, cont, obj, 20, Kind::Array, 0, b"bbbbbbbb");
    // The same update again, in two halves, twice; then a part of epoch
    // 20 that covers nothing whole.
    for _ in 0..2 {
        put(&mut ix, pool, cont, obj, 20, Kind::Array, 0, b"bbbb");
        put(&mut ix, pool, cont, obj, 20, Kind::Array, 4, b"bbbb");
    }
    put(&mut ix, pool, cont, obj, 20, Kind::Array, 6, b"bb");
    let before = |ix: &TargetIndex| {
        [5, 10, 19, 20, 25].map(|r| read(ix, pool, cont, obj, Kind::Array, 0, 8, r))
    };
    let seen = before(&ix);
    let used = ix.cont(&pool, &cont).unwrap().scm_used;
    let mut rel = Released::default();
    ix.apply(WalOp::AggregateTo { pool, upto: 15 }, &mut rel);
    let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
    assert_eq!(
        a.extents
            .iter()
            .map(|x| (x.epoch, x.offset, x.len))
            .collect::<Vec<_>>(),
        vec![(10, 0, 8), (20, 0, 4), (20, 4, 4), (20, 6, 2)],
        "below `upto` nothing is hidden yet at 10; of epoch 20 the last copy stays"
    );
    assert_eq!(rel.scm, 3 * (REC_OVERHEAD + 1 + 1) + 16);
    assert!(ix.cont(&pool, &cont).unwrap().scm_used < used);
    assert_eq!(before(&ix), seen, "reads at every epoch unchanged");
}

#[test]
fn punch_hides_and_aggregation_drops_everything() {
    let (mut ix, pool, cont, obj) = setup();
    put(&mut ix, pool, cont, obj, 10, Kind::Single, 0, b"v1");
    put(&mut ix, pool, cont, obj, 20, Kind::Single, 0, b"v2");
    ix.apply(
        WalOp::Punch {
            pool,
            cont,
            obj,
            dkey: b"d".to_vec(),
            akeys: vec![],
            epoch: 30,
        },
        &mut Released::default(),
    );
    assert_eq!(read(&ix, pool, cont, obj, Kind::Single, 0, 0, 25).1, b"v2");
    assert_eq!(
        read(&ix, pool, cont, obj, Kind::Single, 0, 0, 30).0,
        -libc::ENOENT
    );
    assert_eq!(
        ix.list(&pool, &cont, &obj, b"", b"", 10, 25).0,
        vec![b"d".to_vec()]
    );
    assert!(ix.list(&pool, &cont, &obj, b"", b"", 10, 30).0.is_empty());
    put(&mut ix, pool, cont, obj, 40, Kind::Single, 0, b"v3");
    assert_eq!(
        read(&ix, pool, cont, obj, Kind::Single, 0, 0, u64::MAX).1,
        b"v3"
    );
    ix.apply(WalOp::Aggregate { pool }, &mut Released::default());
    let c = ix.cont(&pool, &cont).unwrap();
    let d = &c.objs[&obj].dkeys[&b"d"[..]];
    assert!(d.punches.is_empty(), "punch with nothing below is dropped");
    assert_eq!(d.akeys[&b"a"[..]].singles.len(), 1);
    let used = c.scm_used;
    ix.recount();
    assert_eq!(
        ix.cont(&pool, &cont).unwrap().scm_used,
        used,
        "incremental usage equals recount"
    );
}

/// A whole copy meets a punch before the version below it: the
/// returning target took the punch (it was writable), aggregation ran
/// with its horizon below both, and then the copy wrote the older
/// version. The punch still hides it. (Aggregation dropped a punch
/// above its horizon that had nothing below it yet, and the copied
/// version showed through: the outage test read an EC cell of a
/// punched array back as its version before the punch.)
#[test]
fn a_punch_above_the_horizon_stays_for_older_versions_yet_to_come() {
    let (mut ix, pool, cont, obj) = setup();
    let punch = |ix: &mut TargetIndex, akeys: Vec<Vec<u8>>, dkey: &[u8], epoch| {
        ix.apply(
            WalOp::Punch {
                pool,
                cont,
                obj,
                dkey: dkey.to_vec(),
                akeys,
                epoch,
            },
            &mut Released::default(),
        )
    };
    punch(&mut ix, vec![b"a".to_vec()], b"d", 30);
    ix.apply(
        WalOp::AggregateTo { pool, upto: 1 },
        &mut Released::default(),
    );
    put(&mut ix, pool, cont, obj, 20, Kind::Array, 0, b"stale!");
    let (status, _, size) = read(&ix, pool, cont, obj, Kind::Array, 0, 6, u64::MAX);
    assert!(
        status == -libc::ENOENT || size == 0,
        "the punch at 30 hides the version at 20 (status {status}, size {size})"
    );
    // The same for a punch of the dkey, and of the object.
    punch(&mut ix, vec![], b"d", 50);
    punch(&mut ix, vec![], b"", 70);
    ix.apply(
        WalOp::AggregateTo { pool, upto: 1 },
        &mut Released::default(),
    );
    let o = &ix.cont(&pool, &cont).unwrap().objs[&obj];
    assert_eq!(o.punches.len(), 1, "object punch kept");
    assert_eq!(o.dkeys[&b"d"[..]].punches.len(), 1, "dkey punch kept");
    // At or below the horizon a punch with nothing below it still goes.
    ix.apply(WalOp::Aggregate { pool }, &mut Released::default());
    assert!(ix.cont(&pool, &cont).unwrap().objs.is_empty());
}

#[test]
fn aggregation_up_to_an_epoch_keeps_what_later_snapshots_read() {
    let (mut ix, pool, cont, obj) = setup();
    for (e, v) in [(10, b"v1"), (20, b"v2"), (30, b"v3"), (40, b"v4")] {
        put(&mut ix, pool, cont, obj, e, Kind::Single, 0, v);
        put(&mut ix, pool, cont, obj, e, Kind::Array, 0, &[v[1]; 8]);
    }
    let mut rel = Released::default();
    ix.apply(WalOp::AggregateTo { pool, upto: 25 }, &mut rel);
    assert_eq!(ix.aggregated_to, 25);
    let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
    // Hidden at 25 (and so at every later epoch): only v1 goes.
    assert_eq!(a.singles.epochs().collect::<Vec<_>>(), vec![20, 30, 40]);
    assert_eq!(
        a.extents.iter().map(|x| x.epoch).collect::<Vec<_>>(),
        vec![20, 30, 40]
    );
    assert!(rel.scm > 0);
    // A snapshot at 35, above the horizon, learnt only now, reads v3.
    ix.apply(
        WalOp::SetSnapshots {
            pool,
            cont,
            epochs: vec![35],
        },
        &mut Released::default(),
    );
    assert_eq!(read(&ix, pool, cont, obj, Kind::Single, 0, 0, 35).1, b"v3");
    assert_eq!(
        read(&ix, pool, cont, obj, Kind::Array, 0, 8, 35).1,
        vec![b'3'; 8]
    );
    ix.apply(
        WalOp::AggregateTo { pool, upto: 50 },
        &mut Released::default(),
    );
    let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
    assert_eq!(a.singles.epochs().collect::<Vec<_>>(), vec![30, 40]);
    assert_eq!(read(&ix, pool, cont, obj, Kind::Single, 0, 0, 35).1, b"v3");
    // The horizon only grows (an older one replayed later does not lower it).
    ix.apply(
        WalOp::AggregateTo { pool, upto: 45 },
        &mut Released::default(),
    );
    assert_eq!(ix.aggregated_to, 50);
}

#[test]
fn checkpoints_from_before_the_aggregation_horizon_decode() {
    let (ix, pool, _, _) = setup();
    let legacy = bincode::serialize(&ix.pools).unwrap();
    let back = TargetIndex::decode(&legacy).expect("legacy checkpoint");
    assert_eq!(back.aggregated_to, 0);
    assert!(back.pools.contains_key(&pool));
    let ix = TargetIndex {
        aggregated_to: 77,
        ..ix
    };
    assert_eq!(
        TargetIndex::decode(&bincode::serialize(&ix).unwrap()),
        Some(ix)
    );
    assert_eq!(TargetIndex::decode(b"\xff\xff"), None);
}

/// The compact trees (crate::compact, index::version) serialize exactly
/// as the `BTreeMap<Vec<u8>, _>` trees, `Vec` lists and 80-byte versions
/// before them: a checkpoint or WAL record of either kind loads in the other.
#[test]
fn checkpoints_keep_their_shape_across_the_compact_trees() {
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct OldDevExtent {
        block: u64,
        nblocks: u64,
        csums: Vec<u32>,
    }
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    enum OldPayload {
        Inline(Vec<u8>),
        Device(OldDevExtent),
    }
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct OldVersion {
        epoch: u64,
        offset: u64,
        len: u64,
        crc: Option<u32>,
        payload: OldPayload,
        scm: u64,
    }
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct OldAkey {
        singles: BTreeMap<u64, OldVersion>,
        extents: Vec<OldVersion>,
        punches: Vec<Tomb>,
    }
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct OldDkey {
        akeys: BTreeMap<Vec<u8>, OldAkey>,
        punches: Vec<Tomb>,
    }
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct OldObj {
        dkeys: BTreeMap<Vec<u8>, OldDkey>,
        punches: Vec<Tomb>,
    }
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct OldNewValue {
        akey: Vec<u8>,
        kind: Kind,
        offset: u64,
        len: u64,
        crc: Option<u32>,
        payload: OldPayload,
    }
    // Versions of each payload form, pinned against the old shape.
    let payloads = [
        inline(b""),
        inline(b"xyz"),
        Payload::Device(DevRun::new(7, 1, vec![0xdead_beef]).unwrap()),
        Payload::Device(DevRun::new(7, 2, vec![1, 2]).unwrap()),
        Payload::Device(DevRun::new(7, 1, vec![]).unwrap()),
    ];
    for (i, p) in payloads.iter().enumerate() {
        let crc = (i % 2 == 0).then_some(i as u32 * 3);
        let v = Version::new(5, 6, 3, crc, p.clone(), 70 + i as u64);
        let old = OldVersion {
            epoch: 5,
            offset: 6,
            len: 3,
            crc,
            payload: match p {
                Payload::Inline(b) => OldPayload::Inline(b.to_vec()),
                Payload::Device(d) => OldPayload::Device(OldDevExtent {
                    block: d.block,
                    nblocks: d.nblocks(),
                    csums: d.csums().to_vec(),
                }),
            },
            scm: 70 + i as u64,
        };
        let enc = bincode::serialize(&v).unwrap();
        assert_eq!(enc, bincode::serialize(&old).unwrap(), "version {i}");
        assert_eq!(bincode::deserialize::<Version>(&enc).unwrap(), v);
        let nv = NewValue {
            akey: b"ak".to_vec(),
            kind: Kind::Array,
            offset: 6,
            len: 3,
            crc,
            payload: p.clone(),
        };
        let old_nv = OldNewValue {
            akey: b"ak".to_vec(),
            kind: Kind::Array,
            offset: 6,
            len: 3,
            crc,
            payload: old.payload,
        };
        let enc = bincode::serialize(&nv).unwrap();
        assert_eq!(enc, bincode::serialize(&old_nv).unwrap(), "WAL value {i}");
        assert_eq!(bincode::deserialize::<NewValue>(&enc).unwrap(), nv);
    }
    // A run of no block is no run: refused, not stored.
    let zero = OldPayload::Device(OldDevExtent {
        block: 1,
        nblocks: 0,
        csums: vec![1],
    });
    assert!(bincode::deserialize::<Payload>(&bincode::serialize(&zero).unwrap()).is_err());
    let (mut ix, pool, cont, obj) = setup();
    // Names short and long (inline and boxed keys), one and many akeys
    // and dkeys (vector and tree maps), singles, extents and punches.
    for i in 0..20u64 {
        let dkey = if i % 3 == 0 {
            format!("a-long-dkey-name-past-the-inline-limit-{i}")
        } else {
            format!("d{i}")
        };
        let values: Vec<NewValue> = (0..1 + i % 12)
            .map(|j| NewValue {
                akey: format!("akey{j}").into_bytes(),
                kind: if j % 2 == 0 {
                    Kind::Single
                } else {
                    Kind::Array
                },
                offset: j,
                len: 3,
                payload: match j {
                    3 => Payload::Device(DevRun::new(7, 1, vec![1, 2]).unwrap()),
                    5 => Payload::Device(DevRun::new(8, 1, vec![9]).unwrap()),
                    _ => inline(b"xyz"),
                },
                crc: (j != 4).then_some(j as u32),
            })
            .collect();
        for epoch in [10 + i, 40 + i] {
            ix.apply(
                WalOp::Update {
                    pool,
                    cont,
                    obj,
                    dkey: dkey.clone().into_bytes(),
                    epoch,
                    values: values.clone(),
                },
                &mut Released::default(),
            );
        }
        ix.apply(
            WalOp::Punch {
                pool,
                cont,
                obj,
                dkey: dkey.into_bytes(),
                akeys: vec![b"akey0".to_vec()],
                epoch: 30 + i,
            },
            &mut Released::default(),
        );
    }
    let o = &ix.cont(&pool, &cont).unwrap().objs[&obj];
    let enc = bincode::serialize(o).unwrap();
    let old: OldObj = bincode::deserialize(&enc).unwrap();
    assert_eq!(old.dkeys.len(), 20);
    assert_eq!(bincode::serialize(&old).unwrap(), enc, "same bytes");
    let back: ObjTree = bincode::deserialize(&enc).unwrap();
    assert_eq!(&back, o);
    let back = TargetIndex::decode(&bincode::serialize(&ix).unwrap()).unwrap();
    assert_eq!(back, ix);
}

#[test]
fn checkpoints_from_before_transactions_decode() {
    #[derive(Serialize)]
    struct IndexBeforeDtx<'a> {
        pools: &'a BTreeMap<Uuid, PoolTree>,
        aggregated_to: u64,
    }
    let (mut ix, pool, cont, obj) = setup();
    put(&mut ix, pool, cont, obj, 10, Kind::Single, 0, b"v");
    let old = bincode::serialize(&IndexBeforeDtx {
        pools: &ix.pools,
        aggregated_to: 42,
    })
    .unwrap();
    let back = TargetIndex::decode(&old).expect("checkpoint before transactions");
    assert_eq!(back.aggregated_to, 42);
    assert_eq!(back.pools, ix.pools);
    assert_eq!(back.dtx, crate::dtx::DtxTable::default());

    // And the current format keeps the transactions, derived lookups rebuilt.
    let id = TxId { hi: 7, lo: 8 };
    ix.apply(
        WalOp::Prepare {
            id,
            shards: vec![(1, 2)],
            at_ms: 5,
            op: Box::new(WalOp::Punch {
                pool,
                cont,
                obj,
                dkey: b"d".to_vec(),
                akeys: vec![],
                epoch: 20,
            }),
        },
        &mut Released::default(),
    );
    let back = TargetIndex::decode(&bincode::serialize(&ix).unwrap()).unwrap();
    assert_eq!(back, ix);
    assert!(back
        .dtx
        .check_read("fetch", &pool, &cont, &obj, Some(b"d"), 20)
        .is_err());
}

#[test]
fn list_changed_caps_pages_and_lists_punched_objects_without_dkeys() {
    let (mut ix, pool, cont, obj) = setup();
    let values = vec![NewValue {
        akey: b"a".to_vec(),
        kind: Kind::Single,
        offset: 0,
        len: 1,
        crc: None,
        payload: inline(b"v"),
    }];
    for i in 0..5000u32 {
        ix.apply(
            WalOp::Update {
                pool,
                cont,
                obj,
                dkey: format!("d{i:05}").into_bytes(),
                epoch: 10,
                values: values.clone(),
            },
            &mut Released::default(),
        );
    }
    let (keys, done) = ix.list_changed(&pool, 0, None, 0);
    assert_eq!((keys.len(), done), (LIST_CHANGED_DEFAULT, false));
    let (keys, done) = ix.list_changed(&pool, 0, None, 100_000);
    assert_eq!((keys.len(), done), (LIST_CHANGED_MAX, false));
    let (rest, done) = ix.list_changed(&pool, 0, keys.last(), 100_000);
    assert_eq!((rest.len(), done), (5000 - LIST_CHANGED_MAX, true));
    assert_eq!(rest[0].2, b"d04096");
    // Exactly `max` left: the page says it is the last.
    let (last, done) = ix.list_changed(&pool, 0, Some(&rest[3]), rest.len() - 4);
    assert_eq!((last.len(), done), (rest.len() - 4, true));
    assert!(ix.list_changed(&pool, 10, None, 0).0.is_empty());
    assert_eq!(ix.list_changed(&Uuid::new_v4(), 0, None, 0), (vec![], true));

    // An object punched with no dkeys left is listed once, empty dkey.
    let bare = ObjKey { lo: 1, ..obj };
    put(&mut ix, pool, cont, bare, 10, Kind::Single, 0, b"v");
    ix.apply(
        WalOp::Punch {
            pool,
            cont,
            obj: bare,
            dkey: vec![],
            akeys: vec![],
            epoch: 20,
        },
        &mut Released::default(),
    );
    let objs = &mut ix
        .pools
        .get_mut(&pool)
        .unwrap()
        .conts
        .get_mut(&cont)
        .unwrap()
        .objs;
    objs.get_mut(&bare).unwrap().dkeys.clear();
    let (keys, done) = ix.list_changed(&pool, 15, None, 0);
    assert_eq!((keys, done), (vec![(cont, bare, vec![])], true));
    let anchor = (cont, bare, vec![]);
    assert_eq!(ix.list_changed(&pool, 15, Some(&anchor), 0), (vec![], true));
    assert!(ix.list_changed(&pool, 20, None, 0).0.is_empty());
    assert_eq!(
        ix.list_records(&pool, &cont, &bare, b"", 15).unwrap(),
        vec![punch_record(crate::RecordKind::PunchObject, 20, b"")]
    );
}

#[test]
fn list_records_refuses_more_than_the_cap() {
    let (mut ix, pool, cont, obj) = setup();
    let values = |n: usize| -> Vec<NewValue> {
        (0..n)
            .map(|i| NewValue {
                akey: format!("a{i}").into_bytes(),
                kind: Kind::Single,
                offset: 0,
                len: 1,
                crc: None,
                payload: inline(b"v"),
            })
            .collect()
    };
    ix.apply(
        WalOp::Update {
            pool,
            cont,
            obj,
            dkey: b"d".to_vec(),
            epoch: 10,
            values: values(MAX_RECORDS),
        },
        &mut Released::default(),
    );
    assert_eq!(
        ix.list_records(&pool, &cont, &obj, b"d", 0).unwrap().len(),
        MAX_RECORDS
    );
    ix.apply(
        WalOp::Punch {
            pool,
            cont,
            obj,
            dkey: b"d".to_vec(),
            akeys: vec![b"a7".to_vec()],
            epoch: 5,
        },
        &mut Released::default(),
    );
    let e = ix.list_records(&pool, &cont, &obj, b"d", 0).unwrap_err();
    assert_eq!(e.code, -libc::E2BIG);
    assert!(e.msg.contains("dkey \"d\""), "{}", e.msg);
    // Above the cap only when counted from `since`.
    assert_eq!(
        ix.list_records(&pool, &cont, &obj, b"d", 5).unwrap().len(),
        MAX_RECORDS
    );
}

#[test]
fn covered_intervals() {
    let mut c = Covered::default();
    c.add(10, 20);
    c.add(30, 40);
    assert_eq!(c.gaps(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
    c.add(15, 35);
    assert_eq!(c.0, vec![(10, 40)]);
    assert!(c.gaps(12, 38).is_empty());
}

/// The last dkey whose akey has a size: punches at every level hide, a
/// read below them still sees, other akeys and empty values do not count,
/// and a bounded scan says where to go on, until nothing is left.
#[test]
fn the_last_sized_dkey_is_found_from_the_end_within_the_scan_bound() {
    use crate::request::Answer;
    let (mut ix, pool, cont, obj) = setup();
    let at = |ix: &mut TargetIndex, dkey: &[u8], akey: &[u8], epoch: u64, b: &[u8]| {
        ix.apply(
            WalOp::Update {
                pool,
                cont,
                obj,
                dkey: dkey.to_vec(),
                epoch,
                values: vec![NewValue {
                    akey: akey.to_vec(),
                    kind: Kind::Array,
                    offset: 0,
                    len: b.len() as u64,
                    crc: None,
                    payload: inline(b),
                }],
            },
            &mut Released::default(),
        )
    };
    let punch = |ix: &mut TargetIndex, dkey: &[u8], akeys: Vec<Vec<u8>>, epoch: u64| {
        ix.apply(
            WalOp::Punch {
                pool,
                cont,
                obj,
                dkey: dkey.to_vec(),
                akeys,
                epoch,
            },
            &mut Released::default(),
        )
    };
    let last = |ix: &TargetIndex, before: &[u8], r: u64, scan: usize| {
        ix.last_sized(&pool, &cont, &obj, b"a", before, r, scan)
    };
    let found = |d: &[u8], s: u64| {
        Answer::Last(LastSized::Found {
            dkey: d.to_vec(),
            size: s,
        })
    };
    let nothing = Answer::Last(LastSized::Nothing);
    assert_eq!(last(&ix, b"", u64::MAX, 10), nothing, "no object");
    at(&mut ix, b"k1", b"a", 10, b"one");
    at(&mut ix, b"k2", b"a", 11, b"second");
    at(&mut ix, b"k3", b"other", 12, b"not a");
    at(&mut ix, b"k4", b"a", 13, b"");
    assert_eq!(last(&ix, b"", u64::MAX, 10), found(b"k2", 6));
    assert_eq!(last(&ix, b"k2", u64::MAX, 10), found(b"k1", 3));
    assert_eq!(last(&ix, b"", 10, 10), found(b"k1", 3), "at an epoch");
    punch(&mut ix, b"k2", vec![], 20);
    assert_eq!(last(&ix, b"", u64::MAX, 10), found(b"k1", 3), "dkey punch");
    assert_eq!(last(&ix, b"", 19, 10), found(b"k2", 6), "below the punch");
    at(&mut ix, b"k2", b"a", 21, b"back");
    assert_eq!(last(&ix, b"", u64::MAX, 10), found(b"k2", 4));
    punch(&mut ix, b"k2", vec![b"a".to_vec()], 22);
    assert_eq!(last(&ix, b"", u64::MAX, 10), found(b"k1", 3), "akey punch");
    // A scan of 2 dkeys from the end (k4, k3) finds nothing there and
    // says to go on below k3; there it finds k1 past the punched k2.
    assert_eq!(
        last(&ix, b"", u64::MAX, 2),
        Answer::Last(LastSized::Below(b"k3".to_vec()))
    );
    assert_eq!(last(&ix, b"k3", u64::MAX, 2), found(b"k1", 3));
    punch(&mut ix, b"", vec![], 30);
    assert_eq!(last(&ix, b"", u64::MAX, 10), nothing, "object punch");
    assert_eq!(
        last(&ix, b"", u64::MAX, 4),
        nothing,
        "the bound is not hit at the very end"
    );
}
/// A level holds its one child in place (a dkey its one akey, an object
/// its one dkey): a file of one chunk is one object entry and its versions.
#[test]
fn levels_hold_one_child_in_place() {
    use std::mem::size_of;
    assert_eq!(size_of::<AkeyTree>(), 40);
    // The one akey (16 + 40) and the punches (8).
    assert_eq!(size_of::<DkeyTree>(), 64);
    // The one dkey (24 + 64) and the punches (8).
    assert_eq!(size_of::<ObjTree>(), 96);
}
