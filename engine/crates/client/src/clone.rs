//! Container clones: a new container holding what another held at one of
//! its snapshots (what a volume made from a snapshot needs).
//!
//! Every target of the pool lists the dkeys it holds of the source (any
//! epoch); each dkey is read at the snapshot's epoch through the object
//! layer (so replicas, EC cells and checksums are handled as for any
//! read) and written to the object of the same ID in the clone, which
//! places it on the same targets. Array akeys are copied in pieces;
//! pieces that read as zeros are holes and stay holes (the last byte of
//! the array is written whatever it holds: it carries the size).

use crate::error::{Error, Result};
use crate::reintegrate::{changed_key_ids, list_changed};
use crate::Client;
use peregrine_proto::ObjectId;
use std::collections::HashSet;

/// Bytes of an array read and written at a time.
const PIECE: u64 = 4 << 20;

/// What a clone copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CloneStats {
    pub dkeys: u64,
    pub values: u64,
    pub bytes: u64,
}

/// Copy into container `dst` everything container `src` of `pool` held at
/// epoch `epoch` (a snapshot's: aggregation keeps it). `dst` should be
/// empty; what it holds under the same keys is overwritten.
pub fn clone_container(
    client: &Client,
    pool: &str,
    src: &str,
    epoch: u64,
    dst: &str,
) -> Result<CloneStats> {
    let pool = client.pool_connect(pool)?;
    let (src, dst) = (pool.cont_open(src)?, pool.cont_open(dst)?);
    let map = pool.map();
    let mut seen: HashSet<(ObjectId, Vec<u8>)> = HashSet::new();
    let mut stats = CloneStats::default();
    for t in 0..map.targets.len() {
        if !map.targets[t].readable {
            continue;
        }
        let mut anchor = None;
        loop {
            let (keys, finished) = list_changed(client, &map, t, 0, anchor.take())?;
            for key in &keys {
                let (cont, oid) = changed_key_ids(&map, key)?;
                // An empty dkey is a punch of the whole object: nothing of
                // it to copy (its dkeys written since are listed apart).
                if cont != src.uuid()
                    || key.dkey.is_empty()
                    || !seen.insert((oid, key.dkey.clone()))
                {
                    continue;
                }
                let from = src.object(oid)?;
                let to = dst.object(oid)?;
                let at = from.at(epoch);
                let akeys = at.list_akeys(&key.dkey)?;
                if !akeys.is_empty() {
                    stats.dkeys += 1;
                }
                for akey in akeys {
                    let ctx =
                        |e: Error| e.context(format!("clone of object {oid} dkey {:?}", key.dkey));
                    if let Some(v) = at.fetch_single(&key.dkey, &akey).map_err(ctx)? {
                        to.update_single(&key.dkey, &akey, &v).map_err(ctx)?;
                        stats.values += 1;
                        stats.bytes += v.len() as u64;
                        continue;
                    }
                    let size = at.array_size(&key.dkey, &akey).map_err(ctx)?;
                    let mut off = 0;
                    while off < size {
                        let len = PIECE.min(size - off);
                        let buf = at
                            .fetch_array(&key.dkey, &akey, off, len as usize)
                            .map_err(ctx)?;
                        if buf.iter().any(|&b| b != 0) {
                            to.update_array(&key.dkey, &akey, off, &buf).map_err(ctx)?;
                            stats.bytes += len;
                        } else if off + len == size {
                            // A hole at the end: its last byte carries the size.
                            to.update_array(&key.dkey, &akey, size - 1, &[0])
                                .map_err(ctx)?;
                        }
                        off += len;
                    }
                    stats.values += 1;
                }
            }
            match keys.last() {
                Some(k) if !finished => anchor = Some(k.clone()),
                _ => break,
            }
        }
    }
    Ok(stats)
}
