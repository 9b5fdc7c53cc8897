//! The scrubber: each target verifies the checksums of its stored extents
//! in the background, at a bounded rate, and reports what it verified and
//! what it found damaged (with where) for `storage scan`.
//!
//! As DAOS's VOS scrubber does for its checksums (a pass over the objects
//! of a container, paced so that it stays out of the way of I/O), but
//! shaped by this target's design: the target thread owns the index and
//! the device, so scrubbing is a step of its own loop, taken only when the
//! target is idle (nothing gathered, queued or in flight): a step walks
//! the index from a cursor (pool, container, object, dkey, akey) to the
//! next akeys, reads their device extents with blocking reads and checks
//! each chunk's CRC32C; requests that arrive meanwhile wait for at most
//! one step ([`STEP_READS`] reads or [`STEP_BYTES`], plus the rest of an
//! akey's extents). A token bucket holds the
//! average to the rate: every byte read costs a token, and so does every
//! akey walked ([`WALK_COST`]: an index of inline values only is still a
//! bounded amount of work). A busy target does not scrub (the rate is a
//! ceiling, not a promise): a step starts only once the target has had no
//! data-plane request for [`QUIET`], or [`BUSY_STEP_EVERY`] after the last
//! step when the target goes idle at all (a load whose requests come
//! closer than the polling window never lets it). Between the requests of
//! a steady load a target is idle for a few hundred microseconds at a
//! time; steps taken there delayed the next request by a step's reads
//! each time: at 10^6 small files on the device creates ran 15-30% slower
//! than with scrubbing off (bench/mdscale.md).
//!
//! A damaged extent is only reported: its reads fail with a checksum error
//! already (the client reads another replica), and rebuild, not the
//! scrubber, restores redundancy.

use super::*;
use crate::compact::{Key, ShortKey};
use std::ops::Bound;

/// Default of a target's scrubbing rate, [`crate::StorageOptions::scrub_rate`]:
/// bytes of stored extents verified per second (0 turns it off;
/// [`crate::Storage::set_scrub_rate`] sets it at run time).
pub const DEFAULT_SCRUB_RATE: u64 = 8 << 20;
/// Bytes a step verifies at most (plus one extent).
const STEP_BYTES: u64 = 1 << 20;
/// Extents a step reads at most. Each is a blocking read on the target's
/// thread, and a request that arrives meanwhile waits for the whole step:
/// a step of 1 MiB in 4 KiB extents (small files' data) was 256 reads, 15
/// to 25 ms on a virtual disk, which stat and read latencies paid whenever
/// a pass ran. 16 reads are about 1 ms there (0.1 ms on NVMe).
pub(super) const STEP_READS: usize = 16;
/// Tokens a step within a pass waits for: steps of small extents are
/// small, so they come more often to keep the rate.
const STEP_START: f64 = (64 << 10) as f64;
/// Akeys a step walks at most.
const STEP_AKEYS: usize = 1024;
/// Tokens an akey walked costs.
const WALK_COST: u64 = 64;
/// Pause between the end of a pass and the start of the next (and before
/// the first: a target just opened has clients coming back to serve).
const PASS_PAUSE: Duration = Duration::from_secs(10);
/// How long a target must have had no data-plane request before a step.
pub(super) const QUIET: Duration = Duration::from_millis(20);
/// Under a load without a [`QUIET`] gap, one step this long after the last.
pub(super) const BUSY_STEP_EVERY: Duration = Duration::from_secs(1);
/// Damaged extents named per target (the count goes on).
const MAX_PLACES: usize = 16;

/// What a target's scrubber did since the storage was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Bytes per second it may read (0: off).
    pub rate: u64,
    /// Passes over the whole index completed.
    pub passes: u64,
    /// Bytes and extents verified.
    pub bytes: u64,
    pub extents: u64,
    /// Extents whose stored bytes fail their checksums.
    pub damaged: u64,
    /// Where, one line per damaged extent (the first [`MAX_PLACES`]).
    pub places: Vec<String>,
}

/// Where the walk is: the last akey verified.
#[derive(Clone)]
pub(super) struct Pos {
    pool: Uuid,
    cont: Uuid,
    obj: ObjKey,
    dkey: Key,
    akey: ShortKey,
}

/// One extent to verify.
pub(super) struct Item {
    at: usize,
    epoch: u64,
    pub(super) block: u64,
    len: u64,
    csums: Vec<u32>,
}

pub(crate) struct Scrubber {
    pub(crate) report: ScrubReport,
    tokens: f64,
    last: Instant,
    /// `None`: between passes.
    cursor: Option<Option<Pos>>,
    next_pass: Instant,
    /// When the last step ended.
    last_step: Instant,
    /// Extents already reported (by first block), so a pass does not
    /// report the same one again.
    known: BTreeSet<u64>,
}

impl Scrubber {
    /// A scrubber verifying `rate` bytes per second (0: off), its first
    /// pass [`PASS_PAUSE`] from now.
    pub(crate) fn new(rate: u64) -> Self {
        Scrubber {
            report: ScrubReport {
                rate,
                ..Default::default()
            },
            tokens: 0.0,
            last: Instant::now(),
            cursor: None,
            next_pass: Instant::now() + PASS_PAUSE,
            last_step: Instant::now(),
            known: BTreeSet::new(),
        }
    }
}

impl Scrubber {
    /// Set the rate; a rate set between passes starts the next one now.
    pub(crate) fn set_rate(&mut self, rate: u64) {
        self.refill();
        self.report.rate = rate;
        if rate > 0 && self.cursor.is_none() {
            self.next_pass = Instant::now();
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        let burst = STEP_BYTES as f64;
        self.tokens = (self.tokens + dt * self.report.rate as f64).min(burst);
    }

    /// How long until a step may run (`None`: scrubbing is off).
    pub(crate) fn wait(&mut self) -> Option<Duration> {
        if self.report.rate == 0 {
            return None;
        }
        self.refill();
        // A pass starts once its pause is over and the last one's debt is
        // paid; a step within a pass once a whole step's tokens are there.
        let (need, pause) = match self.cursor {
            None => (
                0.0,
                self.next_pass.saturating_duration_since(Instant::now()),
            ),
            Some(_) => (STEP_START, Duration::ZERO),
        };
        let short = (need - self.tokens).max(0.0);
        let by_rate = Duration::from_secs_f64((short / self.report.rate as f64).min(3600.0));
        Some(by_rate.max(pause))
    }
}

/// What one step walked: the extents to verify, the akeys they are in,
/// where the walk stopped (`None`: at the end of the index), akeys walked.
#[derive(Default)]
pub(super) struct Walk {
    pub(super) items: Vec<Item>,
    places: Vec<Pos>,
    pub(super) stop: Option<Pos>,
    walked: usize,
}

/// The device extents of the akeys after `after`: whole akeys, until
/// `budget` bytes, [`STEP_READS`] extents or [`STEP_AKEYS`] akeys.
pub(super) fn gather(ix: &TargetIndex, after: Option<&Pos>, budget: u64) -> Walk {
    let mut w = Walk::default();
    let mut bytes = 0u64;
    let pools = match after {
        Some(a) => ix.pools.range(a.pool..),
        None => ix.pools.range(..),
    };
    for (pid, p) in pools {
        let on_p = after.filter(|a| a.pool == *pid);
        let conts = match on_p {
            Some(a) => p.conts.range(a.cont..),
            None => p.conts.range(..),
        };
        for (cid, c) in conts {
            let on_c = on_p.filter(|a| a.cont == *cid);
            let objs = match on_c {
                Some(a) => c.objs.range(a.obj..),
                None => c.objs.range(..),
            };
            for (oid, o) in objs {
                let on_o = on_c.filter(|a| a.obj == *oid);
                let dkeys = match on_o {
                    Some(a) => o
                        .dkeys
                        .range::<[u8], _>((Bound::Included(a.dkey.as_bytes()), Bound::Unbounded)),
                    None => o.dkeys.range::<[u8], _>(..),
                };
                for (dk, d) in dkeys {
                    let on_d = on_o.filter(|a| a.dkey.as_bytes() == dk.as_bytes());
                    let akeys = match on_d {
                        Some(a) => d.akeys.range::<[u8], _>((
                            Bound::Excluded(a.akey.as_bytes()),
                            Bound::Unbounded,
                        )),
                        None => d.akeys.range::<[u8], _>(..),
                    };
                    for (ak, at) in akeys {
                        w.walked += 1;
                        let pos = || Pos {
                            pool: *pid,
                            cont: *cid,
                            obj: *oid,
                            dkey: dk.clone(),
                            akey: ak.clone(),
                        };
                        let mut any = false;
                        for v in at.singles.iter().chain(at.extents.iter()) {
                            if let Payload::Device(ext) = &v.payload {
                                w.items.push(Item {
                                    at: w.places.len(),
                                    epoch: v.epoch,
                                    block: ext.block,
                                    len: v.len,
                                    csums: ext.csums().to_vec(),
                                });
                                bytes += ext.nblocks() * BLOCK;
                                any = true;
                            }
                        }
                        if any {
                            w.places.push(pos());
                        }
                        if bytes >= budget || w.items.len() >= STEP_READS || w.walked >= STEP_AKEYS
                        {
                            w.stop = Some(pos());
                            return w;
                        }
                    }
                }
            }
        }
    }
    w
}

impl Target {
    /// Whether a scrubbing step may run now: the target is idle, its
    /// regions are free for blocking reads, and the rate allows it.
    pub(super) fn scrub_due(&mut self) -> bool {
        if self.refused.is_some() || self.dev.in_flight() > 0 || !self.dev.regions_idle() {
            return false;
        }
        self.scrub_wait().is_some_and(|d| d.is_zero())
    }

    /// How long until the next step is due: its tokens (see
    /// [`Scrubber::wait`]) and a quiet target (see the module's comment);
    /// `None` with scrubbing off.
    pub(super) fn scrub_wait(&mut self) -> Option<Duration> {
        let quiet = QUIET.saturating_sub(self.polling.last_request.elapsed());
        let busy = BUSY_STEP_EVERY.saturating_sub(self.scrub.last_step.elapsed());
        self.scrub.wait().map(|d| d.max(quiet.min(busy)))
    }

    /// One step: the next akeys' extents, read and checked.
    pub(super) fn scrub_step(&mut self) {
        let sc = &mut self.scrub;
        let after = match &sc.cursor {
            Some(c) => c.clone(),
            None => {
                sc.cursor = Some(None);
                None
            }
        };
        sc.refill();
        let budget = (sc.tokens.max(0.0) as u64).clamp(BLOCK, STEP_BYTES);
        let w = gather(&self.index, after.as_ref(), budget);
        let mut cost = w.walked as u64 * WALK_COST;
        for it in &w.items {
            cost += it.len;
            match self.verify(it) {
                Ok(None) => {}
                Ok(Some(why)) => {
                    let p = &w.places[it.at];
                    let line = format!(
                        "target {}: pool {} container {} object {:x}.{:x}.{} dkey {:?} akey {:?} epoch {}: {why}",
                        self.id,
                        p.pool,
                        p.cont,
                        p.obj.hi,
                        p.obj.lo,
                        p.obj.shard,
                        show(p.dkey.as_bytes()),
                        show(p.akey.as_bytes()),
                        it.epoch
                    );
                    let r = &mut self.scrub.report;
                    if self.scrub.known.insert(it.block) {
                        tracing::error!("scrub: {line}");
                        r.damaged += 1;
                        if r.places.len() < MAX_PLACES {
                            r.places.push(line);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(target = self.id, error = %e, "scrub: read failed; trying again next pass");
                }
            }
            self.scrub.report.extents += 1;
            self.scrub.report.bytes += it.len;
        }
        let sc = &mut self.scrub;
        sc.tokens -= cost as f64;
        sc.last_step = Instant::now();
        match w.stop {
            Some(pos) => sc.cursor = Some(Some(pos)),
            None => {
                sc.cursor = None;
                sc.report.passes += 1;
                sc.next_pass = Instant::now() + PASS_PAUSE;
            }
        }
    }

    /// What is wrong with one extent's stored bytes, if anything.
    fn verify(&mut self, it: &Item) -> std::io::Result<Option<String>> {
        let fits = it
            .block
            .checked_mul(BLOCK)
            .and_then(|o| o.checked_add(it.len))
            .is_some_and(|e| e <= self.sb.data_bytes);
        let off = self.data_off(it.block);
        if !fits {
            return Ok(Some(format!(
                "block {} + {} bytes lies beyond the data region",
                it.block, it.len
            )));
        }
        let bytes = self.dev.read(off, wal::round_up(it.len) as usize)?;
        let n = it.len.div_ceil(self.chunk) as usize;
        let bad: Vec<usize> = bytes[..it.len as usize]
            .chunks(self.chunk as usize)
            .zip(&it.csums)
            .enumerate()
            .filter(|(_, (c, &crc))| peregrine_isal::crc32c(c) != crc)
            .map(|(i, _)| i)
            .collect();
        Ok(match bad.first() {
            None if it.csums.len() == n => None,
            None => Some(format!(
                "block {} (device offset {off}): {} checksums for {n} chunks",
                it.block,
                it.csums.len()
            )),
            Some(&k) => Some(format!(
                "block {} (device offset {off}): {} of {n} chunks fail their checksum (first: chunk {k}, device offset {})",
                it.block,
                bad.len(),
                off + k as u64 * self.chunk
            )),
        })
    }
}
