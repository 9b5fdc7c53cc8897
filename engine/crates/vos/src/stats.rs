//! What a [`Storage`] reports of itself: space, per-target counters and
//! stats, faults and scrub reports.

use crate::target::{Ctl, CtlOut};
use crate::{ScrubReport, Storage, StorageError, TargetCounters};
use std::collections::HashMap;
use uuid::Uuid;

/// Space of a pool, summed over the engine's targets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSpace {
    pub scm_total: u64,
    pub scm_free: u64,
    pub nvme_total: u64,
    pub nvme_free: u64,
    /// Bytes used per container (scm records + nvme blocks).
    pub cont_used: HashMap<Uuid, u64>,
}

/// Counters of one target, for tests and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetStats {
    /// Sequence number of the last applied (written) WAL record.
    pub seq: u64,
    /// Every WAL record up to this one, and its data, is flushed from the
    /// device's volatile cache.
    pub durable: u64,
    /// Device flushes (fdatasync) of the batches since open.
    pub flushes: u64,
    /// Bytes of WAL in use since the last checkpoint.
    pub wal_tail: u64,
    /// Checkpoints written since open.
    pub checkpoints: u64,
    /// Free blocks of the target's data region.
    pub free_blocks: u64,
}

impl Storage {
    pub fn pool_space(&self, pool: Uuid) -> Result<PoolSpace, StorageError> {
        let mut sum = PoolSpace::default();
        for out in self.ctl_all(|| Ctl::PoolSpace { pool })? {
            if let CtlOut::Space(s) = out {
                sum.scm_total += s.scm_total;
                sum.scm_free += s.scm_free;
                sum.nvme_total += s.nvme_total;
                sum.nvme_free += s.nvme_free;
                for (c, u) in s.cont_used {
                    *sum.cont_used.entry(c).or_default() += u;
                }
            }
        }
        Ok(sum)
    }

    /// (nvme total, nvme unreserved, scm total, scm unreserved) over all targets.
    pub fn device_space(&self) -> (u64, u64, u64, u64) {
        let mut s = [0u64; 4];
        for t in 0..self.senders.len() {
            if let Ok(CtlOut::Device(d)) = self.ctl(t, Ctl::DeviceSpace) {
                for i in 0..4 {
                    s[i] += d[i];
                }
            }
        }
        (s[0], s[1], s[2], s[3])
    }

    /// Why targets refuse updates, one line per such target (empty: none
    /// does). A target stops taking updates after a device write failed:
    /// what the device holds is unknown until the engine restarts and
    /// replays it.
    pub fn faults(&self) -> Vec<String> {
        self.faults
            .iter()
            .filter_map(|f| f.lock().clone())
            .collect()
    }

    /// What each target's scrubber verified and found damaged, by target
    /// index (a target that does not answer reports nothing).
    pub fn scrub_reports(&self) -> Vec<ScrubReport> {
        (0..self.senders.len())
            .map(|t| match self.ctl(t, Ctl::Scrub(None)) {
                Ok(CtlOut::Scrub(r)) => r,
                _ => ScrubReport::default(),
            })
            .collect()
    }

    /// What each target publishes for metrics, by target index: read
    /// without a message to the target (see [`TargetCounters`]).
    pub fn counters(&self) -> &[std::sync::Arc<TargetCounters>] {
        &self.counters
    }

    /// Why target `t` refuses updates, if it does (see [`Storage::faults`]).
    pub fn fault(&self, t: u32) -> Option<String> {
        self.faults.get(t as usize).and_then(|f| f.lock().clone())
    }

    /// Per-target counters (diagnostics).
    pub fn target_stats(&self) -> Vec<TargetStats> {
        (0..self.senders.len())
            .map(|t| match self.ctl(t, Ctl::Stats) {
                Ok(CtlOut::Stats(s)) => s,
                _ => TargetStats::default(),
            })
            .collect()
    }
}
