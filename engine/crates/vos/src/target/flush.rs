//! Flushes and what they allow: the stamps ([`WalOp::Flushed`]) that tell
//! replay which records were flushed, when a flush is wanted or a stamp
//! due, and when the blocks an applied record freed may go back to the
//! allocator (settled by a flushed stamp, and no fetch in flight reading them).

use super::*;

/// What the target knows of its flushes and stamps, and the blocks freed
/// that wait for a flush (or for the fetches in flight) to be reused.
pub(super) struct Flush {
    /// Every record up to this one, and its data, is flushed.
    pub(super) durable: u64,
    /// The highest `durable` written into a record ([`WalOp::Flushed`]).
    pub(super) stamped: u64,
    /// The last record holding more than a stamp: an idle target stamps
    /// the flush that covers it ([`Target::stamp_due`]).
    pub(super) last_real: u64,
    /// When `durable` last rose.
    pub(super) flushed_at: Instant,
    /// Records carrying a stamp that are not flushed yet: (seq, stamp).
    pub(super) stamps: VecDeque<(u64, u64)>,
    /// The highest stamp in a flushed record: replay checks the data of no
    /// record up to it, so the blocks such records freed may be rewritten.
    pub(super) settled: u64,
    /// Blocks freed by applying the record `seq`, kept until `settled`
    /// reaches it: (seq, runs).
    pub(super) unsettled: Vec<(u64, Vec<(u64, u64)>)>,
    /// Since when something waits for a flush ([`Target::flush_wanted`]).
    pub(super) dirty_since: Option<Instant>,
    /// How long it may wait before the target flushes on its own.
    pub(super) interval: Duration,
    /// Blocks freed while reads were in flight, with the tag from which on
    /// fetches no longer see them: they return to the allocator once every
    /// fetch started before that tag is done (a read in flight never reads
    /// a block rewritten under it).
    pub(super) deferred: Vec<(u64, Vec<(u64, u64)>)>,
}

impl Flush {
    pub(super) fn new(interval: Duration) -> Self {
        Flush {
            durable: 0,
            stamped: 0,
            last_real: 0,
            flushed_at: Instant::now(),
            stamps: VecDeque::new(),
            settled: 0,
            unsettled: Vec::new(),
            dirty_since: None,
            interval,
            deferred: Vec::new(),
        }
    }
}

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
        if through > self.flush.durable {
            self.flush.flushed_at = Instant::now();
        }
        self.flush.durable = self.flush.durable.max(through);
        self.flush.dirty_since = None;
        while let Some(&(seq, stamp)) = self.flush.stamps.front() {
            if seq > through {
                break;
            }
            self.flush.stamps.pop_front();
            self.flush.settled = self.flush.settled.max(stamp);
        }
        self.settle();
    }

    /// Give the blocks freed by records up to `settled` to the allocator.
    pub(super) fn settle(&mut self) {
        let settled = self.flush.settled;
        let mut runs = Vec::new();
        self.flush.unsettled.retain(|(seq, r)| {
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
            && self.flush.stamped < self.flush.durable.min(self.flush.last_real)
    }

    /// A stamp is wanted and the target was idle for a flush interval
    /// since the flush (a busy target stamps in its next batch anyway; the
    /// interval keeps a flush and the check of what it flushed apart).
    pub(super) fn stamp_due(&self) -> bool {
        self.stamp_wanted() && self.flush.flushed_at.elapsed() >= self.flush.interval
    }

    /// Whether something acknowledged, or a freed block, waits for a flush.
    pub(super) fn flush_wanted(&self) -> bool {
        self.broken.is_none()
            && (self.flush.durable < self.wal.seq || !self.flush.unsettled.is_empty())
    }

    /// Note the stamps ([`WalOp::Flushed`]) in record `seq`.
    pub(super) fn note_stamps(&mut self, seq: u64, ops: &[WalOp]) {
        if let Some(stamp) = stamp_of(ops) {
            self.flush.stamped = self.flush.stamped.max(stamp);
            self.flush.stamps.push_back((seq, stamp));
        }
    }

    /// Return blocks to the allocator once no read in flight can still be
    /// reading them.
    fn free_runs(&mut self, runs: Vec<(u64, u64)>) {
        if self.fetch.jobs.is_empty() {
            for (b, n) in runs {
                self.alloc.free(b, n);
            }
        } else if !runs.is_empty() {
            self.flush.deferred.push((self.next_tag, runs));
        }
    }

    /// Return the deferred blocks no fetch in flight can still read.
    pub(super) fn release_deferred(&mut self) {
        let oldest = self.fetch.jobs.keys().min().copied().unwrap_or(u64::MAX);
        let alloc = &mut self.alloc;
        self.flush.deferred.retain(|(from, runs)| {
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
