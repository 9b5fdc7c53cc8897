//! Acknowledgement and flushes through a real engine: an update is
//! acknowledged once written; `Object::flush` (fsync), a `sync=always`
//! container, or the engine's flush interval flush it from the device's
//! volatile cache. `storage scan` shows what waits for a flush.

mod common;
use common::*;
use peregrine_proto::mgmt::{ContCreateReq, ContSetPropReq, PoolCreateReq};
use peregrine_proto::{ObjectClass, ObjectId};
use std::time::{Duration, Instant};

fn cluster(flush_interval_ms: u64) -> Cluster {
    let c = Cluster::start_configured(
        ClusterSpec {
            engines: 1,
            targets: 2,
            device_mib: 256,
            scm_mib: 64,
        },
        &format!("flush_interval_ms: {flush_interval_ms}\n"),
    );
    c.format();
    let mut m = c.mgmt();
    c.rt.block_on(m.pool_create(PoolCreateReq {
        label: "pool".into(),
        total_size: 128 << 20,
        ..Default::default()
    }))
    .unwrap();
    for (label, sync) in [("cont", "standard"), ("synced", "always")] {
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "pool".into(),
            label: label.into(),
            props: [("sync".to_string(), sync.to_string())].into(),
            ..Default::default()
        }))
        .unwrap();
    }
    c
}

#[test]
fn fsync_and_sync_always_containers_flush_acknowledged_updates() {
    let c = cluster(60_000);
    let pool = c.client().pool_connect("pool").unwrap();
    let cont = pool.cont_open("cont").unwrap();
    assert!(!cont.sync_always());
    // Every shard of SX: both targets.
    let obj = cont.object(ObjectId::new(ObjectClass::SX, 0, 1)).unwrap();
    let (before, flushes0) = c.unflushed(0);
    for i in 0..8u64 {
        let v = pattern(i, 64 << 10);
        obj.update_single(format!("d{i}").as_bytes(), b"a", &v)
            .unwrap();
    }
    let (after, flushes1) = c.unflushed(0);
    assert!(
        after > before,
        "acknowledged before a flush: {after} records"
    );
    assert_eq!(flushes1, flushes0, "no flush asked for yet");
    obj.flush().unwrap();
    let (left, flushes2) = c.unflushed(0);
    assert_eq!(left, 0, "the flush covers every acknowledged update");
    assert!(flushes2 > flushes1);
    for i in 0..8u64 {
        let got = obj.fetch_single(format!("d{i}").as_bytes(), b"a").unwrap();
        assert_eq!(got, Some(pattern(i, 64 << 10)));
    }

    let synced = pool.cont_open("synced").unwrap();
    assert!(synced.sync_always());
    let obj = synced.object(ObjectId::new(ObjectClass::S1, 0, 2)).unwrap();
    obj.update_single(b"d", b"a", &pattern(9, 64 << 10))
        .unwrap();
    let (left, flushes3) = c.unflushed(0);
    assert_eq!(left, 0, "sync=always: flushed before it was acknowledged");
    assert!(flushes3 > flushes2);
}

#[test]
fn the_engine_flushes_on_its_own_within_its_interval() {
    let c = cluster(200);
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 0, 1)).unwrap();
    let (_, flushes0) = c.unflushed(0);
    obj.update_single(b"d", b"a", &pattern(1, 64 << 10))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (left, flushes) = c.unflushed(0);
        if left == 0 && flushes > flushes0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {left} unflushed records 10 s after the update (interval 200 ms)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_sync_property_names_what_is_wrong() {
    let c = cluster(1000);
    let mut m = c.mgmt();
    let err =
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "pool".into(),
            label: "bad".into(),
            props: [("sync".to_string(), "sometimes".to_string())].into(),
            ..Default::default()
        }))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("sync"), "{}", err.message());
    let err =
        c.rt.block_on(m.cont_set_prop(ContSetPropReq {
            pool: "pool".into(),
            id: "cont".into(),
            props: [("sync".to_string(), "never".to_string())].into(),
        }))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("never"), "{}", err.message());
    c.rt.block_on(m.cont_set_prop(ContSetPropReq {
        pool: "pool".into(),
        id: "cont".into(),
        props: [("sync".to_string(), "ALWAYS".to_string())].into(),
    }))
    .unwrap();
    let cont = c
        .client()
        .pool_connect("pool")
        .unwrap()
        .cont_open("cont")
        .unwrap();
    assert!(cont.sync_always(), "set-prop applies to later opens");
}
