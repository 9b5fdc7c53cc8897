//! Hybrid logical clock for epochs.
//!
//! An epoch is `physical nanoseconds with the low 16 bits replaced by a
//! logical counter`. Every call to [`Hlc::now`] returns a value strictly
//! greater than the previous one from the same clock, even if the wall
//! clock stalls or steps back: when the physical part does not advance the
//! logical part does (and carries into the physical bits, which keeps the
//! order total). Engines order versions by epoch, so a process's own
//! updates are always seen in issue order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Bits of the logical counter.
pub const LOGICAL_BITS: u32 = 16;
const LOGICAL_MASK: u64 = (1 << LOGICAL_BITS) - 1;

pub struct Hlc {
    last: AtomicU64,
}

impl Default for Hlc {
    fn default() -> Self {
        Self::new()
    }
}

impl Hlc {
    pub const fn new() -> Hlc {
        Hlc {
            last: AtomicU64::new(0),
        }
    }

    fn physical() -> u64 {
        let ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        ns & !LOGICAL_MASK
    }

    /// A fresh epoch, greater than every epoch this clock returned or saw.
    pub fn now(&self) -> u64 {
        let pt = Self::physical();
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let next = pt.max(last + 1);
            match self
                .last
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(cur) => last = cur,
            }
        }
    }

    /// Merge an epoch seen from elsewhere (e.g. a snapshot), so later
    /// `now()` values are above it.
    pub fn observe(&self, remote: u64) {
        if remote != u64::MAX {
            self.last.fetch_max(remote, Ordering::AcqRel);
        }
    }
}

static GLOBAL: Hlc = Hlc::new();

/// The process-wide clock every update takes its epoch from.
pub fn now() -> u64 {
    GLOBAL.now()
}

/// See [`Hlc::observe`].
pub fn observe(remote: u64) {
    GLOBAL.observe(remote)
}

/// The physical part of an epoch, in nanoseconds since the Unix epoch.
pub fn physical_ns(epoch: u64) -> u64 {
    epoch & !LOGICAL_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictly_monotonic_across_threads() {
        let clock = Hlc::new();
        let all = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let mut prev = 0;
                    let mut mine = Vec::with_capacity(20000);
                    for _ in 0..20000 {
                        let e = clock.now();
                        assert!(e > prev, "{e} <= {prev}");
                        prev = e;
                        mine.push(e);
                    }
                    all.lock().unwrap().extend(mine);
                });
            }
        });
        let mut v = all.into_inner().unwrap();
        let n = v.len();
        v.sort_unstable();
        v.dedup();
        assert_eq!(v.len(), n, "two callers got the same epoch");
    }

    #[test]
    fn tracks_wall_clock_and_observed_epochs() {
        let clock = Hlc::new();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let e = clock.now();
        assert!(physical_ns(e) + (1 << LOGICAL_BITS) >= wall & !LOGICAL_MASK);
        let future = e + (10 << LOGICAL_BITS) * 1_000_000;
        clock.observe(future);
        assert!(clock.now() > future);
        clock.observe(u64::MAX); // EPOCH_LATEST is not a time
        assert!(clock.now() < u64::MAX - 1);
        assert!(now() < now());
    }
}
