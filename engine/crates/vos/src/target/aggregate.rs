//! Aggregation as the target starts it: on demand ([`Ctl::Aggregate`]), when
//! a pool's data region fills, when idle, or when a container reaches its
//! quota; up to the lease's horizon and below every transaction still held.
//! What aggregation does to the index is in [`crate::index`].

use super::*;

impl Target {
    /// The pools changed since their last aggregation whose data region is
    /// more than 80% used.
    pub(super) fn filling(&self) -> Vec<Uuid> {
        self.dirty
            .iter()
            .filter(|p| {
                self.index
                    .pools
                    .get(p)
                    .is_some_and(|pt| pt.nvme_total > 0 && pt.nvme_used() * 10 > pt.nvme_total * 8)
            })
            .copied()
            .collect()
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

    pub(super) fn auto_aggregate(&mut self, pool: Uuid, why: &str) {
        match self.aggregate(pool) {
            Ok(rel) => {
                tracing::debug!(target = self.id, %pool, why, reclaimed = rel.scm + rel.nvme, "aggregated")
            }
            Err(e) => {
                tracing::warn!(target = self.id, %pool, why, error = %e, "aggregation failed")
            }
        }
        self.dirty.remove(&pool);
    }
}
