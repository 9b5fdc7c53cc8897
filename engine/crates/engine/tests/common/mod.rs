//! The shared harness (crates/testcluster).
#![allow(unused_imports, dead_code)]
pub use peregrine_testcluster::*;

/// The engine binary cargo built for these tests.
pub const ENGINE_BIN: &str = env!("CARGO_BIN_EXE_peregrine-engine");

/// A field of /proc/PID/status (VmRSS, VmData...), in bytes.
pub fn proc_status(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("engine is running");
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    kb << 10
}

/// Rank 0's engine process still runs.
pub fn rank0_alive(c: &mut Cluster) -> bool {
    matches!(
        c.engines[0].child.as_mut().map(|ch| ch.try_wait()),
        Some(Ok(None))
    )
}

/// A pool-wide handle of pool "pool" (the harness speaks as admin), for
/// requests a test sends raw to engines that check handles.
pub fn admin_handle(c: &Cluster) -> Vec<u8> {
    use peregrine_proto::mgmt::PoolConnectReq;
    let mut m = c.mgmt();
    c.rt.block_on(m.pool_connect(PoolConnectReq {
        id: "pool".into(),
        ..Default::default()
    }))
    .unwrap()
    .into_inner()
    .handle
}

/// The uuids of pool "pool" and container "cont".
pub fn pool_cont(c: &Cluster) -> (uuid::Uuid, uuid::Uuid) {
    use peregrine_proto::mgmt::{ContQueryReq, PoolQueryReq};
    let mut m = c.mgmt();
    let p =
        c.rt.block_on(m.pool_query(PoolQueryReq { id: "pool".into() }))
            .unwrap()
            .into_inner();
    let k =
        c.rt.block_on(m.cont_query(ContQueryReq {
            pool: "pool".into(),
            id: "cont".into(),
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    (p.uuid.parse().unwrap(), k.uuid.parse().unwrap())
}
