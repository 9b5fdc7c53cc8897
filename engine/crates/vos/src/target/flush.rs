//! Flushes and what they allow: the stamps ([`WalOp::Flushed`]) that tell
//! replay which records were flushed, when a flush is wanted or a stamp
//! due, and when the blocks an applied record freed may go back to the
//! allocator (settled by a flushed stamp, and no fetch in flight reading them).

use super::*;

/// The stamp in one record's `ops` ([`WalOp::Flushed`]), if it has one.
pub(super) fn stamp_of(ops: &[WalOp]) -> Option<u64> {
    ops.iter()
        .filter_map(|op| match op {
            WalOp::Flushed { through } => Some(*through),
            _ => None,
        })
        .max()
}

impl Target {
    /// Every record up to `through`, and its data, is flushed: so are the
    /// stamps in them, and the blocks freed by the records those stamps
    /// cover may be rewritten.
    pub(super) fn flushed(&mut self, through: u64) {
        if through > self.durable {
            self.flushed_at = Instant::now();
        }
        self.durable = self.durable.max(through);
        self.dirty_since = None;
        while let Some(&(seq, stamp)) = self.stamps.front() {
            if seq > through {
                break;
            }
            self.stamps.pop_front();
            self.settled = self.settled.max(stamp);
        }
        self.settle();
    }

    /// Give the blocks freed by records up to `settled` to the allocator.
    pub(super) fn settle(&mut self) {
        let settled = self.settled;
        let mut runs = Vec::new();
        self.unsettled.retain(|(seq, r)| {
            if *seq > settled {
                return true;
            }
            runs.extend_from_slice(r);
            false
        });
        self.free_runs(runs);
    }

    /// Settle every freed block now, for an update the device is short of
    /// blocks for: finish everything in flight, then checkpoint (replay
    /// starts from the checkpoint, so it checks no older record's data).
    pub(super) fn settle_now(&mut self) {
        self.drain();
        if let Err(e) = self.checkpoint() {
            tracing::warn!(target = self.id, error = %e, "checkpoint to reuse freed blocks failed");
        }
    }

    /// Whether a flush covers records that no record stamps yet: replay
    /// learns what was flushed from the stamps only, and tells damage from
    /// a torn tail by them ([`super::replay`]). A stamp alone needs no stamp of
    /// its own (that would never end).
    pub(super) fn stamp_wanted(&self) -> bool {
        self.broken.is_none()
            && self.refused.is_none()
            && self.stamped < self.durable.min(self.last_real)
    }

    /// A stamp is wanted and the target was idle for a flush interval
    /// since the flush (a busy target stamps in its next batch anyway; the
    /// interval keeps a flush and the check of what it flushed apart).
    pub(super) fn stamp_due(&self) -> bool {
        self.stamp_wanted() && self.flushed_at.elapsed() >= self.flush_interval
    }

    /// Whether something acknowledged, or a freed block, waits for a flush.
    pub(super) fn flush_wanted(&self) -> bool {
        self.broken.is_none() && (self.durable < self.seq || !self.unsettled.is_empty())
    }

    /// Note the stamps ([`WalOp::Flushed`]) in record `seq`.
    pub(super) fn note_stamps(&mut self, seq: u64, ops: &[WalOp]) {
        if let Some(stamp) = stamp_of(ops) {
            self.stamped = self.stamped.max(stamp);
            self.stamps.push_back((seq, stamp));
        }
    }

    /// Return blocks to the allocator once no read in flight can still be
    /// reading them.
    fn free_runs(&mut self, runs: Vec<(u64, u64)>) {
        if self.fetch_jobs.is_empty() {
            for (b, n) in runs {
                self.alloc.free(b, n);
            }
        } else if !runs.is_empty() {
            self.deferred.push((self.next_tag, runs));
        }
    }

    /// Return the deferred blocks no fetch in flight can still read.
    pub(super) fn release_deferred(&mut self) {
        let oldest = self.fetch_jobs.keys().min().copied().unwrap_or(u64::MAX);
        let alloc = &mut self.alloc;
        self.deferred.retain(|(from, runs)| {
            if oldest < *from {
                return true;
            }
            for &(b, n) in runs {
                alloc.free(b, n);
            }
            false
        });
    }
}
