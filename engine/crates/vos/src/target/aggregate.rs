//! Aggregation as the target starts it: on demand ([`Ctl::Aggregate`]), when
//! a pool's data region fills, when idle, or when a container reaches its
//! quota; up to the lease's horizon and below every transaction still held.
//! What aggregation does to the index is in [`crate::index`].

use super::*;

/// A pool's last aggregation to make room that gave nothing back: when it
/// ended and how long it took.
pub(super) struct Fruitless {
    end: Instant,
    took: Duration,
}

/// After an aggregation to make room that gave nothing back (a pool full
/// of live data), the next waits this many times its length, unless values
/// were removed meanwhile: each walks the pool's whole index, so such a
/// pool spends at most about a tenth of its target's time on them.
const ROOM_PACE: u32 = 10;

impl Target {
    /// The pools changed since their last aggregation whose data region is
    /// more than 80% used, and that [`Target::aggregate_for_room`] would
    /// aggregate for it now. A full metadata tier is aggregated when an
    /// update does not fit.
    pub(super) fn filling(&self) -> Vec<Uuid> {
        self.dirty
            .iter()
            .filter(|p| {
                self.room_paced(**p)
                    && self.index.pools.get(p).is_some_and(|pt| {
                        pt.nvme_total > 0 && pt.nvme_used() * 10 > pt.nvme_total * 8
                    })
            })
            .copied()
            .collect()
    }

    /// Whether an aggregation of `pool` to make room may start now: its
    /// last one gave space back, or values were removed since, or
    /// [`ROOM_PACE`] times its length passed.
    fn room_paced(&self, pool: Uuid) -> bool {
        self.removed.contains(&pool)
            || self
                .fruitless
                .get(&pool)
                .is_none_or(|f| f.end.elapsed() >= f.took * ROOM_PACE)
    }

    /// Aggregate `pool` now so that what was removed or overwritten gives
    /// its space back: for an update that does not fit (a tier full, a
    /// container's quota reached) or a filling data region (`why`). Only
    /// if the pool changed since its last aggregation, under the lease,
    /// and paced ([`ROOM_PACE`]). False if it did not run.
    pub(super) fn aggregate_for_room(&mut self, pool: Uuid, why: &str) -> bool {
        if !self.dirty.contains(&pool) || !self.lease.valid() || !self.room_paced(pool) {
            return false;
        }
        let t = Instant::now();
        // Aggregation needs the device to itself.
        self.drain();
        if self.auto_aggregate(pool, why) > 0 {
            self.fruitless.remove(&pool);
        } else {
            let f = Fruitless {
                end: Instant::now(),
                took: t.elapsed(),
            };
            self.fruitless.insert(pool, f);
        }
        true
    }

    /// Aggregate up to now: a snapshot this target learns of later at an
    /// older epoch is refused ([`Ctl::SetSnapshots`]), not silently short.
    pub(super) fn aggregate(&mut self, pool: Uuid) -> Result<Released, StorageError> {
        let mut upto = self.lease.upto(&pool);
        if let Some(held) = self.index.dtx.oldest_held_epoch(&pool) {
            upto = upto.min(held.saturating_sub(1));
        }
        self.commit_ctl(WalOp::AggregateTo { pool, upto })
    }

    /// Returns the bytes given back.
    pub(super) fn auto_aggregate(&mut self, pool: Uuid, why: &str) -> u64 {
        let reclaimed = match self.aggregate(pool) {
            Ok(rel) => {
                let r = rel.scm + rel.nvme;
                tracing::debug!(target = self.id, %pool, why, reclaimed = r, "aggregated");
                r
            }
            Err(e) => {
                tracing::warn!(target = self.id, %pool, why, error = %e, "aggregation failed");
                0
            }
        };
        self.dirty.remove(&pool);
        self.removed.remove(&pool);
        reclaimed
    }
}
