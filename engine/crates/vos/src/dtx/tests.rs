//! Unit tests of the transaction table and of the decisions on it.

use super::decisions::state_with;
use super::*;
use crate::index::{Kind, NewValue, TargetIndex};
use crate::request::DtxState;

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

fn prepare(pool: Uuid, cont: Uuid, obj: ObjKey, id: TxId, epoch: u64, block: u64) -> WalOp {
    WalOp::Prepare {
        id,
        shards: vec![(0, 0)],
        at_ms: 1000,
        op: Box::new(WalOp::Update {
            pool,
            cont,
            obj,
            dkey: b"d".to_vec(),
            epoch,
            values: vec![NewValue {
                akey: b"a".to_vec(),
                kind: Kind::Array,
                offset: 0,
                len: BLOCK,
                crc: None,
                payload: Payload::Device(crate::index::DevRun::new(block, 1, vec![0]).unwrap()),
            }],
        }),
    }
}

#[test]
fn prepare_is_held_then_committed_or_aborted() {
    let (mut ix, pool, cont, obj) = setup();
    let (a, b) = (TxId { hi: 1, lo: 1 }, TxId { hi: 1, lo: 2 });
    let mut rel = Released::default();
    ix.apply(prepare(pool, cont, obj, a, 10, 5), &mut rel);
    ix.apply(prepare(pool, cont, obj, b, 20, 6), &mut rel);
    // A retry of the same change gives its blocks back.
    ix.apply(prepare(pool, cont, obj, a, 10, 7), &mut rel);
    assert_eq!(rel.runs, vec![(7, 1)]);
    assert_eq!(ix.device_runs(), vec![(5, 1), (6, 1)]);
    assert_eq!(ix.dtx.held_space(&pool).1, 2 * BLOCK);
    assert!(ix.cont(&pool, &cont).is_none(), "nothing applied yet");
    let e = ix
        .dtx
        .check_read("fetch", &pool, &cont, &obj, Some(b"d"), 15)
        .unwrap_err();
    assert_eq!(e.code, -libc::EINPROGRESS);
    assert!(e.msg.contains(&a.to_string()), "{}", e.msg);
    assert!(ix
        .dtx
        .check_read("fetch", &pool, &cont, &obj, Some(b"d"), 9)
        .is_ok());
    assert!(ix
        .dtx
        .check_read("fetch", &pool, &cont, &obj, Some(b"x"), 30)
        .is_ok());

    let mut rel = Released::default();
    ix.apply(
        WalOp::Decide {
            pool,
            id: a,
            commit: true,
            at_ms: 2000,
        },
        &mut rel,
    );
    assert!(rel.runs.is_empty());
    assert_eq!(ix.cont(&pool, &cont).unwrap().nvme_used, BLOCK);
    ix.apply(
        WalOp::Decide {
            pool,
            id: b,
            commit: false,
            at_ms: 2000,
        },
        &mut rel,
    );
    assert_eq!(rel.runs, vec![(6, 1)]);
    assert_eq!(ix.dtx.state(a), DtxState::Committed);
    assert_eq!(ix.dtx.state(b), DtxState::Aborted);
    assert_eq!(ix.dtx.held_space(&pool), (0, 0));
    // A late prepare of a decided transaction is not held.
    let mut rel = Released::default();
    ix.apply(prepare(pool, cont, obj, b, 20, 8), &mut rel);
    assert_eq!(rel.runs, vec![(8, 1)]);
    assert!(ix.dtx.pending.is_empty());

    // Decisions are forgotten an hour after a later one.
    ix.apply(
        WalOp::Decide {
            pool,
            id: TxId { hi: 9, lo: 9 },
            commit: false,
            at_ms: 2000 + DECIDED_KEEP_MS + 1,
        },
        &mut Released::default(),
    );
    assert_eq!(ix.dtx.decided.len(), 1);
    assert_eq!(ix.dtx.state(a), DtxState::Unknown);
}

#[test]
fn state_counts_changes_in_flight() {
    let (ix, pool, cont, obj) = setup();
    let id = TxId { hi: 3, lo: 4 };
    let p = prepare(pool, cont, obj, id, 10, 1);
    let d = WalOp::Decide {
        pool,
        id,
        commit: false,
        at_ms: 1,
    };
    assert_eq!(state_with(&ix, [], id), DtxState::Unknown);
    assert_eq!(state_with(&ix, [&p], id), DtxState::Prepared);
    assert_eq!(state_with(&ix, [&p, &d], id), DtxState::Aborted);
    assert_eq!(state_with(&ix, [&d, &p], id), DtxState::Aborted);
    let key = op_key(match &p {
        WalOp::Prepare { op, .. } => op,
        _ => unreachable!(),
    })
    .unwrap();
    assert_eq!(
        admit(&ix, [&p].into_iter(), id, &key, "update").unwrap(),
        Admit::Known { durable: false }
    );
    let e = admit(&ix, [&p, &d].into_iter(), id, &key, "update").unwrap_err();
    assert_eq!(e.code, -libc::ECANCELED);
}
