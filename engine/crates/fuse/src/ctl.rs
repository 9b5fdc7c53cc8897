//! `PEREGRINE_IOC_GET_CONT` (include/peregrine_fuse.h): the pool map and
//! the container's description, for the interception library, which runs
//! in workload processes without a certificate and so never uses the
//! control port (docs/tls.md). The map is fetched afresh from the
//! management service with the daemon's certificate, so the library's
//! pool-map refreshes are as fresh as the daemon's own.

use peregrine::handoff;
use peregrine_dfs::Dfs;
use peregrine_proto::mgmt::PoolConnectReq;

/// The reply to one `PEREGRINE_IOC_GET_CONT`, or an errno.
pub(crate) fn get_cont(dfs: &Dfs, in_data: &[u8], out_size: u32) -> Result<Vec<u8>, i32> {
    if (out_size as usize) < handoff::CONT_SIZE {
        return Err(libc::EINVAL);
    }
    let cont = dfs.container();
    let pool = cont.pool();
    let map = pool
        .client()
        .mgmt()
        .pool_connect(PoolConnectReq {
            id: pool.uuid().to_string(),
            ..Default::default()
        })
        .map_err(|e| {
            eprintln!("peregrine-fuse: PEREGRINE_IOC_GET_CONT: pool map: {e}");
            if e.code < 0 {
                -e.code
            } else {
                libc::EIO
            }
        })?;
    let description = handoff::encode(&map, cont.info());
    handoff::reply(in_data, &description).ok_or(libc::EINVAL)
}
