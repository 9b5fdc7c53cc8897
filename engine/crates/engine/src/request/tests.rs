use super::*;

fn addr() -> Option<data::Address> {
    Some(data::Address {
        pool: vec![1; 16],
        cont: vec![2; 16],
        oid: Some(data::ObjectId { hi: 3, lo: 4 }),
        shard: 5,
        target: 1,
        map_version: 9,
        handle: vec![7; 8],
    })
}

fn array(len: u64) -> data::Iod {
    data::Iod {
        akey: b"a".to_vec(),
        kind: data::ValueKind::Array as i32,
        len,
        ..Default::default()
    }
}

fn update(u: data::UpdateReq) -> DataRequest {
    DataRequest::Update(u, Bulk::from(Vec::new()))
}

fn refused(r: DataRequest, words: &str) {
    let e = r.into_vos().unwrap_err();
    assert_eq!(e.code, -libc::EINVAL, "{}", e.msg);
    assert!(e.msg.contains(words), "{:?} lacks {words:?}", e.msg);
}

#[test]
fn what_the_storage_types_cannot_say_is_refused_by_name() {
    let fetch = |addr| {
        DataRequest::Fetch(data::FetchReq {
            addr,
            ..Default::default()
        })
    };
    refused(fetch(None), "fetch: missing address");
    let mut a = addr().unwrap();
    a.pool = vec![1, 2, 3];
    refused(
        fetch(Some(a)),
        "fetch: pool: expected a 16-byte UUID, got 3 bytes",
    );
    let mut a = addr().unwrap();
    a.cont.clear();
    refused(fetch(Some(a)), "fetch: cont");
    let mut a = addr().unwrap();
    a.oid = None;
    refused(fetch(Some(a)), "fetch: missing object id");
    refused(
        DataRequest::Flush(data::FlushReq { addr: None }),
        "flush: missing address",
    );
    let bad_kind = data::Iod {
        kind: 7,
        ..array(1)
    };
    refused(
        DataRequest::Fetch(data::FetchReq {
            addr: addr(),
            iods: vec![bad_kind.clone()],
            ..Default::default()
        }),
        "fetch: unknown value kind 7",
    );
    let u = data::UpdateReq {
        addr: addr(),
        dkey: b"d".to_vec(),
        ..Default::default()
    };
    refused(
        update(data::UpdateReq {
            iods: vec![bad_kind],
            ..u.clone()
        }),
        "update: unknown value kind 7",
    );
    let single_cas = data::Iod {
        kind: data::ValueKind::Single as i32,
        has_unchanged_since: true,
        ..array(1)
    };
    refused(
        update(data::UpdateReq {
            iods: vec![single_cas.clone()],
            ..u.clone()
        }),
        "unchanged_since applies to ARRAY values only",
    );
    // A fetch never read it.
    let f = DataRequest::Fetch(data::FetchReq {
        addr: addr(),
        iods: vec![single_cas],
        ..Default::default()
    });
    assert!(f.into_vos().is_ok());
    refused(
        update(data::UpdateReq {
            dtx: Some(data::Dtx {
                id: None,
                shards: vec![],
            }),
            ..u.clone()
        }),
        "update: transaction without an id",
    );
    refused(
        update(data::UpdateReq {
            conditions: vec![data::Condition {
                akey: b"x".to_vec(),
                expect: None,
            }],
            ..u
        }),
        "update on target 1 shard 5: condition on akey \"x\" expects nothing",
    );
    refused(
        DataRequest::DtxQuery(data::DtxQueryReq {
            addr: addr(),
            id: None,
            resolve: false,
        }),
        "dtx query: missing transaction id",
    );
    refused(
        DataRequest::ListChanged(data::ListChangedReq {
            addr: addr(),
            anchor: Some(data::ChangedKey {
                cont: vec![0; 16],
                oid: None,
                ..Default::default()
            }),
            ..Default::default()
        }),
        "list changed: anchor without object id",
    );
}

#[test]
fn an_update_converts_field_for_field() {
    let u = data::UpdateReq {
        addr: addr(),
        epoch: 12,
        dkey: b"d".to_vec(),
        iods: vec![
            data::Iod {
                offset: 4096,
                has_unchanged_since: true,
                unchanged_since: 8,
                has_crc: true,
                crc: 0xabcd,
                ..array(5)
            },
            data::Iod {
                kind: data::ValueKind::Single as i32,
                offset: 99,
                ..array(3)
            },
        ],
        insert_only: true,
        sync: true,
        dtx: Some(data::Dtx {
            id: Some(data::DtxId { hi: 1, lo: 2 }),
            shards: vec![data::DtxShard { rank: 3, target: 4 }],
        }),
        conditions: vec![data::Condition {
            akey: b"c".to_vec(),
            expect: Some(data::condition::Expect::UnchangedSince(6)),
        }],
    };
    let Ok(vos::Request::Update(v, _)) = update(u).into_vos() else {
        panic!("not an update");
    };
    assert_eq!(
        v.addr,
        vos::Address {
            pool: Uuid::from_bytes([1; 16]),
            cont: Uuid::from_bytes([2; 16]),
            oid: vos::ObjectId { hi: 3, lo: 4 },
            shard: 5,
            target: 1,
        }
    );
    assert_eq!((v.epoch, v.dkey.as_slice()), (12, &b"d"[..]));
    assert_eq!(
        v.iods[0].kind,
        vos::IodKind::Array {
            offset: 4096,
            unchanged_since: Some(8)
        }
    );
    assert_eq!((v.iods[0].len, v.iods[0].crc), (5, Some(0xabcd)));
    assert_eq!(v.iods[1].kind, vos::IodKind::Single);
    assert_eq!(v.iods[1].crc, None);
    assert!(v.insert_only && v.sync);
    let dtx = v.dtx.unwrap();
    assert_eq!(
        (dtx.id, dtx.shards),
        (vos::TxId { hi: 1, lo: 2 }, vec![(3, 4)])
    );
    assert_eq!(v.conditions[0].expect, vos::Expect::UnchangedSince(6));
}

/// The hot path's lists are converted where they lie: no allocation per
/// request for the iods, the fetched values or the conditions.
#[test]
fn lists_convert_in_their_own_allocations() {
    use std::mem::{align_of, size_of};
    assert_eq!(size_of::<vos::Iod>(), size_of::<data::Iod>());
    assert_eq!(align_of::<vos::Iod>(), align_of::<data::Iod>());
    assert_eq!(
        size_of::<vos::FetchedValue>(),
        size_of::<data::FetchedValue>()
    );
    assert_eq!(size_of::<vos::Condition>(), size_of::<data::Condition>());
    let iods: Vec<data::Iod> = (0..8).map(array).collect();
    let at = iods.as_ptr() as usize;
    let f = DataRequest::Fetch(data::FetchReq {
        addr: addr(),
        iods,
        ..Default::default()
    });
    let Ok(vos::Request::Fetch(v)) = f.into_vos() else {
        panic!("not a fetch");
    };
    assert_eq!(v.iods.as_ptr() as usize, at);
    let values = vec![vos::FetchedValue::default(); 8];
    let at = values.as_ptr() as usize;
    let Some(Body::Fetch(r)) = response(vos::Answer::Fetch(values)).body else {
        panic!("not a fetch response");
    };
    assert_eq!(r.values.as_ptr() as usize, at);
}

#[test]
fn answers_become_the_responses_they_were() {
    let r = response(vos::Answer::Done);
    assert_eq!(r.status.as_ref().map(|s| s.code), Some(0));
    assert!(r.body.is_none());
    let v = vos::FetchedValue {
        status: -libc::ENOENT,
        len: 0,
        size: 0,
        crc: None,
        absent: true,
        epoch: 0,
    };
    let w = vos::FetchedValue {
        status: 0,
        len: 4,
        size: 9,
        crc: Some(0x1234),
        absent: false,
        epoch: 7,
    };
    let Some(Body::Fetch(f)) = response(vos::Answer::Fetch(vec![v, w])).body else {
        panic!("not a fetch response");
    };
    assert_eq!(
        f.values,
        vec![
            data::FetchedValue {
                status: -libc::ENOENT,
                absent: true,
                ..Default::default()
            },
            data::FetchedValue {
                len: 4,
                size: 9,
                crc: 0x1234,
                has_crc: true,
                epoch: 7,
                ..Default::default()
            }
        ]
    );
    let rec = vos::Record {
        kind: vos::RecordKind::Value,
        epoch: 3,
        akey: b"a".to_vec(),
        value_kind: vos::ValueKind::Array,
        offset: 8,
        len: 2,
    };
    let Some(Body::Records(r)) = response(vos::Answer::Records(vec![rec])).body else {
        panic!("not records");
    };
    assert_eq!(r.records[0].kind, data::RecordKind::RecordValue as i32);
    assert_eq!(r.records[0].value_kind, data::ValueKind::Array as i32);
    let Some(Body::DtxState(s)) = response(vos::Answer::DtxState(vos::DtxState::Aborted)).body
    else {
        panic!("not a state");
    };
    assert_eq!(s.state, data::DtxState::DtxAborted as i32);
}
