//! Container snapshots pin an epoch: reads at the snapshot see the old data
//! even after overwrites and aggregation; destroying the snapshot lets
//! aggregation reclaim it.

mod common;
use common::*;
use peregrine_proto::mgmt::engine_client::EngineClient;
use peregrine_proto::mgmt::*;
use peregrine_proto::{ObjectClass, ObjectId};

#[test]
fn snapshot_reads_survive_overwrite_and_aggregation() {
    let c = Cluster::with_pool(ClusterSpec::default(), 96, "S1", "crc32c");
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 3, 3)).unwrap();
    let v1 = pattern(1, 256 * 1024);
    let v2 = pattern(2, 256 * 1024);
    obj.update_array(b"d", b"a", 0, &v1).unwrap();
    obj.update_single(b"d", b"s", b"first").unwrap();

    let mut m = c.mgmt();
    let snap =
        c.rt.block_on(m.snap_create(SnapCreateReq {
            pool: "pool".into(),
            cont: "cont".into(),
            name: "s1".into(),
        }))
        .unwrap()
        .into_inner();
    obj.update_array(b"d", b"a", 0, &v2).unwrap();
    obj.update_single(b"d", b"s", b"second").unwrap();

    let pool =
        c.rt.block_on(m.pool_query(PoolQueryReq { id: "pool".into() }))
            .unwrap()
            .into_inner();
    let ch =
        c.rt.block_on(
            tonic::transport::Endpoint::from_shared(format!(
                "http://127.0.0.1:{}",
                c.engines[0].control_port
            ))
            .unwrap()
            .connect(),
        )
        .unwrap();
    let mut engine = EngineClient::new(ch);
    c.rt.block_on(engine.aggregate(AggregateReq {
        pool_uuid: pool.uuid.clone(),
    }))
    .unwrap();

    let old = obj.at(snap.epoch);
    assert!(
        old.fetch_array(b"d", b"a", 0, v1.len()).unwrap() == v1,
        "snapshot data lost to aggregation"
    );
    assert_eq!(old.fetch_single(b"d", b"s").unwrap().unwrap(), b"first");
    assert!(obj.fetch_array(b"d", b"a", 0, v2.len()).unwrap() == v2);
    assert_eq!(obj.fetch_single(b"d", b"s").unwrap().unwrap(), b"second");

    // Without the snapshot, aggregation reclaims the overwritten extent.
    c.rt.block_on(m.snap_destroy(SnapDestroyReq {
        pool: "pool".into(),
        cont: "cont".into(),
        name: "s1".into(),
        epoch: 0,
    }))
    .unwrap();
    let reclaimed =
        c.rt.block_on(engine.aggregate(AggregateReq {
            pool_uuid: pool.uuid,
        }))
        .unwrap()
        .into_inner()
        .reclaimed_bytes;
    assert!(
        reclaimed >= v1.len() as u64,
        "aggregation reclaimed only {reclaimed} bytes"
    );
    assert!(obj.fetch_array(b"d", b"a", 0, v2.len()).unwrap() == v2);
}
