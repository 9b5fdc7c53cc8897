//! A full pool answers ENOSPC, stays consistent, and reuses freed space.

mod common;
use common::*;
use peregrine_proto::mgmt::*;
use peregrine_proto::{ObjectClass, ObjectId};

#[test]
fn full_pool_enospc_then_space_reused() {
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
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 1, 1)).unwrap();
    let val = pattern(1, 1 << 20);
    let mut written = 0u64;
    let err = loop {
        match obj.update_array(format!("d{written}").as_bytes(), b"a", 0, &val) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 64, "a 32 MiB pool took {written} MiB");
    };
    assert_eq!(err.code, -libc::ENOSPC, "{err}");
    assert!(written >= 20, "only {written} MiB fit in a 32 MiB pool");
    // Everything acknowledged is intact.
    for i in 0..written {
        assert!(
            obj.fetch_array(format!("d{i}").as_bytes(), b"a", 0, val.len())
                .unwrap()
                == val
        );
    }
    // Punch half, aggregate, and the space comes back.
    for i in 0..written / 2 {
        obj.punch_dkey(format!("d{i}").as_bytes()).unwrap();
    }
    let mut m = c.mgmt();
    let pool =
        c.rt.block_on(m.pool_query(PoolQueryReq { id: "pool".into() }))
            .unwrap()
            .into_inner();
    let puuid = pool.uuid.clone();
    let mut e = c.engine(0);
    c.rt.block_on(e.aggregate(AggregateReq { pool_uuid: puuid }))
        .unwrap();
    for i in 0..written / 2 {
        obj.update_array(format!("n{i}").as_bytes(), b"a", 0, &val)
            .unwrap_or_else(|e| panic!("space not reused after punch: {e}"));
    }
    for i in written / 2..written {
        assert!(
            obj.fetch_array(format!("d{i}").as_bytes(), b"a", 0, val.len())
                .unwrap()
                == val
        );
    }
}
