//! What each target publishes for the engine's metrics: counters it bumps as
//! it works, and a copy of its space it refreshes after its state changed
//! (at most once a second while busy, and before it sleeps).
//!
//! A scrape reads these without a message to the target: a control message
//! waits for the target's device work in flight (see the `target` module),
//! and metrics must answer when a target is stuck, which is when someone
//! looks at them. The target is the only writer; relaxed atomics suffice,
//! as each value is read on its own.

use crate::index::TargetIndex;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How often a busy target refreshes its published space at most.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Bytes of one tier: what is reserved (a pool) or available (a target),
/// and what is used of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierSpace {
    pub total: u64,
    pub used: u64,
}

/// One target's space per tier, overall and per pool it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetSpace {
    /// The target's RAM budget for metadata and small values.
    pub scm: TierSpace,
    /// The target's data region on the device.
    pub nvme: TierSpace,
    /// (pool, scm, nvme): each pool's reservation on this target and what
    /// its containers use of it (changes held by transactions included).
    pub pools: Vec<(Uuid, TierSpace, TierSpace)>,
}

/// The counters and the space one target publishes (see the module).
#[derive(Debug, Default)]
pub struct TargetCounters {
    wal_records: AtomicU64,
    flushes: AtomicU64,
    checkpoints: AtomicU64,
    space: Mutex<TargetSpace>,
}

impl TargetCounters {
    /// WAL records written since the storage was opened.
    pub fn wal_records(&self) -> u64 {
        self.wal_records.load(Ordering::Relaxed)
    }

    /// Device flushes (fdatasync) of committed batches since open.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Checkpoints written since open.
    pub fn checkpoints(&self) -> u64 {
        self.checkpoints.load(Ordering::Relaxed)
    }

    /// The space as last published.
    pub fn space(&self) -> TargetSpace {
        self.space.lock().clone()
    }

    pub(crate) fn wal_record(&self) {
        self.wal_records.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn checkpoint(&self) {
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
    }
}

/// When a target last published its space: the sequence number it had then
/// (every change of space is a logged operation, so an unchanged sequence
/// means unchanged space) and the time.
#[derive(Debug)]
pub(crate) struct Published {
    seq: Option<u64>,
    at: Instant,
}

impl Default for Published {
    fn default() -> Self {
        Published {
            seq: None,
            at: Instant::now(),
        }
    }
}

impl Published {
    /// Whether the space of a target at `seq` is to be published now:
    /// changed since, and `idle` (about to sleep) or a while since last.
    pub(crate) fn due(&self, seq: u64, idle: bool) -> bool {
        self.seq != Some(seq) && (idle || self.at.elapsed() >= PUBLISH_EVERY)
    }

    /// Publish the space of `index` (a target at `seq` with `scm_budget`
    /// bytes of RAM and `data_bytes` of device) to `to`.
    pub(crate) fn publish(
        &mut self,
        to: &TargetCounters,
        seq: u64,
        index: &TargetIndex,
        scm_budget: u64,
        data_bytes: u64,
    ) {
        let mut s = TargetSpace {
            scm: TierSpace {
                total: scm_budget,
                used: 0,
            },
            nvme: TierSpace {
                total: data_bytes,
                used: 0,
            },
            pools: Vec::with_capacity(index.pools.len()),
        };
        for (uuid, p) in &index.pools {
            let (held_scm, held_nvme) = index.dtx.held_space(uuid);
            let scm = TierSpace {
                total: p.scm_total,
                used: p.scm_used() + held_scm,
            };
            let nvme = TierSpace {
                total: p.nvme_total,
                used: p.nvme_used() + held_nvme,
            };
            s.scm.used += scm.used;
            s.nvme.used += nvme.used;
            s.pools.push((*uuid, scm, nvme));
        }
        *to.space.lock() = s;
        *self = Published {
            seq: Some(seq),
            at: Instant::now(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_only_after_a_change() {
        let mut p = Published::default();
        assert!(p.due(0, true), "never published");
        let c = TargetCounters::default();
        p.publish(&c, 7, &TargetIndex::default(), 100, 200);
        assert!(!p.due(7, true), "nothing changed");
        assert!(p.due(8, true), "changed, and the target is idle");
        assert!(
            !p.due(8, false),
            "changed, but published less than a second ago"
        );
        let s = c.space();
        assert_eq!((s.scm.total, s.nvme.total, s.pools.len()), (100, 200, 0));
    }
}
