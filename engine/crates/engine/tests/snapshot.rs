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
    let mut engine: EngineClient<_> = c.engine(0);
    c.rt.block_on(engine.aggregate(AggregateReq {
        pool_uuid: pool.uuid.clone(),
    }))
    .unwrap();

    // A snapshot at an epoch this aggregation passed is refused, ABORTED (the
    // management service then takes it again at a newer epoch).
    let info =
        c.rt.block_on(m.cont_query(ContQueryReq {
            pool: "pool".into(),
            id: "cont".into(),
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    let late = snap.epoch + 1;
    let err =
        c.rt.block_on(engine.cont_shard_snapshots(ContShardSnapshotsReq {
            pool_uuid: pool.uuid.clone(),
            cont_uuid: info.uuid.clone(),
            epochs: vec![snap.epoch, late],
            adding: late,
        }))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted, "{err}");
    assert!(
        err.message().contains(&format!("epoch {late}")) && err.message().contains("aggregated"),
        "{err}"
    );

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

/// Snapshots taken while a writer overwrites one value in a pool too small
/// to hold the versions: the engine aggregates on its own (it holds the
/// aggregation lease while it heartbeats), and every snapshot still reads a
/// whole version, the one that was latest when it was taken or an earlier.
#[test]
fn snapshots_under_overwrites_and_automatic_aggregation() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 1,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        },
        32,
        "S1",
        "crc32c",
    );
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 5, 5)).unwrap();
    const LEN: usize = 1 << 20;
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let mut m = c.mgmt();
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                obj.update_array(b"d", b"a", 0, &pattern(k, LEN))
                    .unwrap_or_else(|e| {
                        stop.store(true, Ordering::Relaxed);
                        panic!("overwrite {k}: {e}; logs:\n{}", c.logs())
                    });
                done.store(k, Ordering::Relaxed);
            }
            k
        });
        while done.load(Ordering::Relaxed) < 40 && !writer.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for i in 0..12 {
            if writer.is_finished() {
                break;
            }
            let before = done.load(Ordering::Relaxed);
            let snap =
                c.rt.block_on(m.snap_create(SnapCreateReq {
                    pool: "pool".into(),
                    cont: "cont".into(),
                    name: format!("s{i}"),
                }))
                .unwrap_or_else(|e| panic!("snapshot {i}: {e}"))
                .into_inner();
            let after = done.load(Ordering::Relaxed) + 1;
            std::thread::sleep(std::time::Duration::from_millis(100));
            let got = obj.at(snap.epoch).fetch_array(b"d", b"a", 0, LEN).unwrap();
            assert!(
                (before..=after).any(|k| got == pattern(k, LEN)),
                "snapshot {i} at epoch {} reads no version written between {before} and {after}",
                snap.epoch
            );
            // Keep the pool small: only the latest snapshot holds space.
            if i > 0 {
                c.rt.block_on(m.snap_destroy(SnapDestroyReq {
                    pool: "pool".into(),
                    cont: "cont".into(),
                    name: format!("s{}", i - 1),
                    epoch: 0,
                }))
                .unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
        let k = writer.join().unwrap();
        // 32 MiB holds at most 32 versions: the others were aggregated away
        // (the writer fails on ENOSPC otherwise).
        assert!(k >= 40, "{k} overwrites");
    });
}
