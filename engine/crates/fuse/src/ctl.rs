//! `PEREGRINE_IOC_GET_CONT` (include/peregrine_fuse.h): the pool map and
//! the container's description, for the interception library, which runs
//! in workload processes without a certificate and so never uses the
//! control port (docs/tls.md). The map comes from the management service
//! with the daemon's certificate.
//!
//! Every process the library serves asks once as it starts, so a shell
//! script's short commands would each cost a management round trip: the
//! last description is kept for [`KEEP`] and handed out again, unless the
//! caller names it as the one it found stale (a refresh after a map change
//! then always reaches the management service).

use parking_lot::Mutex;
use peregrine::handoff;
use peregrine_dfs::Dfs;
use peregrine_proto::mgmt::PoolConnectReq;
use std::time::{Duration, Instant};

/// How long a description is handed out again.
const KEEP: Duration = Duration::from_secs(1);

/// The last description fetched, and when.
#[derive(Default)]
pub(crate) struct Descriptions {
    last: Mutex<Option<Kept>>,
}

struct Kept {
    at: Instant,
    generation: u64,
    description: Vec<u8>,
}

impl Descriptions {
    /// The reply to one `PEREGRINE_IOC_GET_CONT`, or an errno.
    pub(crate) fn get_cont(
        &self,
        dfs: &Dfs,
        in_data: &[u8],
        out_size: u32,
    ) -> Result<Vec<u8>, i32> {
        self.answer(in_data, out_size, || fetch(dfs))
    }

    /// [`Descriptions::get_cont`], with `fetch` for the management call.
    fn answer(
        &self,
        in_data: &[u8],
        out_size: u32,
        fetch: impl FnOnce() -> Result<Vec<u8>, i32>,
    ) -> Result<Vec<u8>, i32> {
        if (out_size as usize) < handoff::CONT_SIZE {
            return Err(libc::EINVAL);
        }
        let asked = handoff::asked(in_data).ok_or(libc::EINVAL)?;
        {
            let last = self.last.lock();
            if let Some(k) = last.as_ref() {
                // Later pieces come from the description the first came
                // from (a caller seeing the generation move starts again).
                let reuse =
                    asked.offset > 0 || (k.at.elapsed() < KEEP && k.generation != asked.stale);
                if reuse {
                    return handoff::reply(in_data, &k.description).ok_or(libc::EINVAL);
                }
            }
        }
        let description = fetch()?;
        let reply = handoff::reply(in_data, &description).ok_or(libc::EINVAL);
        *self.last.lock() = Some(Kept {
            at: Instant::now(),
            generation: handoff::generation(&description),
            description,
        });
        reply
    }
}

/// The description afresh from the management service.
fn fetch(dfs: &Dfs) -> Result<Vec<u8>, i32> {
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
    Ok(handoff::encode(&map, cont.info()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_description_is_handed_out_again_unless_named_stale() {
        let d = Descriptions::default();
        let fetches = Cell::new(0u32);
        let fetch = || {
            fetches.set(fetches.get() + 1);
            Ok(format!("description {}", fetches.get()).into_bytes())
        };
        let generation_of = |reply: &[u8]| u64::from_ne_bytes(reply[16..24].try_into().unwrap());
        let size = handoff::CONT_SIZE as u32;

        let first = d.answer(&handoff::request(0, 0), size, fetch).unwrap();
        assert_eq!(fetches.get(), 1);
        let kept = generation_of(&first);
        // Another process starting: the kept one, no management call.
        let again = d.answer(&handoff::request(0, 0), size, fetch).unwrap();
        assert_eq!((fetches.get(), generation_of(&again)), (1, kept));
        // A later piece comes from it too.
        d.answer(&handoff::request(3, kept), size, fetch).unwrap();
        assert_eq!(fetches.get(), 1);
        // A refresh naming the kept one as stale: afresh.
        let fresh = d.answer(&handoff::request(0, kept), size, fetch).unwrap();
        assert_eq!(fetches.get(), 2);
        assert_ne!(generation_of(&fresh), kept);
        // Past KEEP: afresh.
        std::thread::sleep(KEEP);
        d.answer(&handoff::request(0, 0), size, fetch).unwrap();
        assert_eq!(fetches.get(), 3);
        // A failed fetch is the caller's errno; a short buffer is EINVAL.
        std::thread::sleep(KEEP);
        assert_eq!(
            d.answer(&handoff::request(0, 0), size, || Err(libc::EHOSTUNREACH)),
            Err(libc::EHOSTUNREACH)
        );
        assert_eq!(
            d.answer(&handoff::request(0, 0), size - 1, fetch),
            Err(libc::EINVAL)
        );
    }
}
