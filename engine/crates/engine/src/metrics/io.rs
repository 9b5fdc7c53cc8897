//! The data path's counters: per pool and target, what was asked, moved,
//! how long it took, and what failed; per target, what is queued.
//!
//! Every request passes here twice, on the way to its target and with its
//! reply (on the target's thread), so this is kept to atomics: a pool's
//! counters are found by a scan of a few slots that are only ever filled,
//! never freed or locked (see [`IoMetrics::track`]), and each target's
//! counters sit on their own cache lines, as the target threads write them.
//! A request holds `&'static IoMetrics` (one per engine process, see
//! [`IoMetrics::leak`]), not an `Arc`: a reference count shared by every
//! thread would be one more cache line bouncing between them per request.

use crate::request::DataRequest as Request;
use peregrine_vos::{Answer, ReplyRef};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Pools whose requests are counted apart. A pool past them (an engine
/// that saw this many pools since it started: slots are not reused, as a
/// request may still hold one) is counted under the nil pool.
pub const MAX_POOLS: usize = 256;

/// The kinds of request, as the `op` label names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Update,
    Fetch,
    Punch,
    List,
    QuerySize,
    Flush,
    ListChanged,
    ListRecords,
    DtxDecide,
    DtxQuery,
    DtxPending,
}

impl Op {
    pub const ALL: [Op; 11] = [
        Op::Update,
        Op::Fetch,
        Op::Punch,
        Op::List,
        Op::QuerySize,
        Op::Flush,
        Op::ListChanged,
        Op::ListRecords,
        Op::DtxDecide,
        Op::DtxQuery,
        Op::DtxPending,
    ];

    pub fn of(req: &Request) -> Op {
        match req {
            Request::Update(..) => Op::Update,
            Request::Fetch(_) => Op::Fetch,
            Request::Punch(_) => Op::Punch,
            Request::List(_) => Op::List,
            Request::QuerySize(_) => Op::QuerySize,
            Request::Flush(_) => Op::Flush,
            Request::ListChanged(_) => Op::ListChanged,
            Request::ListRecords(_) => Op::ListRecords,
            Request::DtxDecide(_) => Op::DtxDecide,
            Request::DtxQuery(_) => Op::DtxQuery,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Update => "update",
            Op::Fetch => "fetch",
            Op::Punch => "punch",
            Op::List => "list",
            Op::QuerySize => "query_size",
            Op::Flush => "flush",
            Op::ListChanged => "list_changed",
            Op::ListRecords => "list_records",
            Op::DtxDecide => "dtx_decide",
            Op::DtxQuery => "dtx_query",
            Op::DtxPending => "dtx_pending",
        }
    }
}

/// Upper bounds of the latency buckets, in seconds: from a small value
/// answered from RAM (tens of microseconds) to a large one behind a device
/// that stalls (seconds).
pub const LATENCY_BUCKETS: [f64; 18] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3,
    500e-3, 1.0, 2.5, 5.0, 10.0,
];

/// A latency histogram of atomics (the client crate's takes a lock per
/// observation). Buckets are kept apart (not cumulative), the last one for
/// what is above every bound; the count is their sum.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

/// A histogram as read for a scrape: sum (seconds), count, and each
/// bucket's own count by upper bound (the last is +Inf), as the client
/// crate's encoder takes them (it writes them cumulative).
pub type HistogramSnapshot = (f64, u64, Vec<(f64, u64)>);

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BUCKETS.partition_point(|b| *b < s);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut count = 0;
        let mut out = Vec::with_capacity(self.buckets.len());
        for (i, b) in self.buckets.iter().enumerate() {
            let n = b.load(Ordering::Relaxed);
            count += n;
            out.push((LATENCY_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY), n));
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        (sum, count, out)
    }
}

/// The counters of one target in one pool. Aligned so that two targets'
/// counters never share a cache line (each target thread writes its own).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct TargetIo {
    /// Requests answered, by [`Op`].
    pub ops: [AtomicU64; Op::ALL.len()],
    /// Of those, answered with an error (or refused before the target).
    pub failed: [AtomicU64; Op::ALL.len()],
    /// Value bytes of updates stored.
    pub update_bytes: AtomicU64,
    /// Value bytes returned by fetches.
    pub fetch_bytes: AtomicU64,
    /// Requests (updates: data damaged on the way) and fetched values
    /// (stored data damaged) that failed their checksum.
    pub checksum_errors: AtomicU64,
    /// Requests and fetched values that failed with `-EIO`: a device read
    /// or write failed (or failed before, for a target that then refuses updates).
    pub io_errors: AtomicU64,
    /// Of successful updates and fetches.
    pub update_latency: Histogram,
    pub fetch_latency: Histogram,
}

/// The counters of one pool on this engine's targets.
#[derive(Debug)]
pub struct PoolIo {
    pub pool: Uuid,
    pub targets: Box<[TargetIo]>,
}

impl PoolIo {
    fn new(pool: Uuid, targets: u32) -> PoolIo {
        PoolIo {
            pool,
            targets: (0..targets).map(|_| TargetIo::default()).collect(),
        }
    }
}

/// A count on its own cache line (see [`TargetIo`]).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Line(AtomicU64);

/// The data path's counters of one engine (see the module).
#[derive(Debug)]
pub struct IoMetrics {
    targets: u32,
    /// Filled in order, never emptied: a scan stops at the first empty slot.
    slots: Box<[OnceLock<PoolIo>]>,
    /// Pools past [`MAX_POOLS`].
    overflow: PoolIo,
    /// Per target: requests handed to it, and of those answered. Two
    /// counts rather than one depth, so that the threads handing requests
    /// over and the target answering them do not write the same line.
    entered: Box<[Line]>,
    left: Box<[Line]>,
}

/// Where a request is counted: a slot (or the overflow) and a target.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Pool(usize),
    Overflow,
}

impl IoMetrics {
    pub fn new(targets: u32) -> IoMetrics {
        IoMetrics {
            targets,
            slots: (0..MAX_POOLS).map(|_| OnceLock::new()).collect(),
            overflow: PoolIo::new(Uuid::nil(), targets),
            entered: (0..targets).map(|_| Line::default()).collect(),
            left: (0..targets).map(|_| Line::default()).collect(),
        }
    }

    /// Counters for an engine process's life: leaked, so that requests
    /// reference them without counting references.
    pub fn leak(targets: u32) -> &'static IoMetrics {
        Box::leak(Box::new(IoMetrics::new(targets)))
    }

    pub fn targets(&self) -> u32 {
        self.targets
    }

    /// The slot of `pool`, taking the first free one for a pool not seen yet.
    /// Two requests of a new pool racing for one slot both end up in it:
    /// `OnceLock` lets one fill it and the other wait and find it filled.
    fn slot(&self, pool: Uuid) -> Slot {
        for (i, s) in self.slots.iter().enumerate() {
            let p = s.get_or_init(|| PoolIo::new(pool, self.targets));
            if p.pool == pool {
                return Slot::Pool(i);
            }
        }
        Slot::Overflow
    }

    fn pool_io(&self, s: Slot) -> &PoolIo {
        match s {
            Slot::Pool(i) => self.slots[i].get().expect("a slot handed out is filled"),
            Slot::Overflow => &self.overflow,
        }
    }

    /// Start counting a request: `None` for one without a valid pool and
    /// target (the target refuses it, and it is not counted).
    pub fn track(&'static self, req: &Request) -> Option<Track> {
        let addr = req.addr()?;
        if addr.target >= self.targets {
            return None;
        }
        let pool = Uuid::from_slice(&addr.pool).ok()?;
        let bytes = match req {
            Request::Update(_, bulk) => bulk.len() as u64,
            _ => 0,
        };
        Some(Track {
            io: self,
            slot: self.slot(pool),
            target: addr.target as usize,
            op: Op::of(req),
            bytes,
            t0: Instant::now(),
            queued: false,
        })
    }

    /// Every pool counted so far (the overflow last, if it was used).
    pub fn pools(&self) -> impl Iterator<Item = &PoolIo> {
        let overflow = self.overflow.targets.iter().any(|t| {
            t.ops
                .iter()
                .chain(&t.failed)
                .any(|n| n.load(Ordering::Relaxed) > 0)
        });
        self.slots
            .iter()
            .map_while(OnceLock::get)
            .chain(overflow.then_some(&self.overflow))
    }

    /// Requests handed to target `t` and not answered yet.
    pub fn queue_depth(&self, t: u32) -> i64 {
        // Two loads a moment apart: a request answered in between must not make it negative.
        let left = self.left[t as usize].0.load(Ordering::Relaxed);
        let entered = self.entered[t as usize].0.load(Ordering::Relaxed);
        entered.saturating_sub(left) as i64
    }
}

/// One request being counted, from its decoding to its reply.
pub struct Track {
    io: &'static IoMetrics,
    slot: Slot,
    target: usize,
    op: Op,
    /// An update's value bytes.
    bytes: u64,
    t0: Instant,
    queued: bool,
}

impl Track {
    fn counters(&self) -> &TargetIo {
        &self.io.pool_io(self.slot).targets[self.target]
    }

    /// The request is handed to its target: it counts in the queue depth
    /// until answered.
    pub fn queued(&mut self) {
        self.queued = true;
        self.io.entered[self.target]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Refused before reaching the target, with `code`.
    pub fn refused(self, code: i32) {
        self.finish(Err(code), 0);
    }

    /// Answered by the target.
    pub fn answered(self, r: &ReplyRef<'_>) {
        match r {
            Err(e) => self.finish(Err(e.code), 0),
            Ok((resp, bulk)) => {
                if let Answer::Fetch(values) = resp {
                    let c = self.counters();
                    for v in values {
                        c.count_error(v.status);
                    }
                }
                self.finish(Ok(()), bulk.len() as u64)
            }
        }
    }

    /// Count the outcome (`fetched`: bytes a fetch returned).
    fn finish(self, outcome: Result<(), i32>, fetched: u64) {
        let c = self.counters();
        let op = self.op as usize;
        c.ops[op].fetch_add(1, Ordering::Relaxed);
        match outcome {
            Err(code) => {
                c.failed[op].fetch_add(1, Ordering::Relaxed);
                c.count_error(code);
            }
            Ok(()) => match self.op {
                Op::Update => {
                    c.update_bytes.fetch_add(self.bytes, Ordering::Relaxed);
                    c.update_latency.observe(self.t0.elapsed());
                }
                Op::Fetch => {
                    c.fetch_bytes.fetch_add(fetched, Ordering::Relaxed);
                    c.fetch_latency.observe(self.t0.elapsed());
                }
                _ => {}
            },
        }
        if self.queued {
            self.io.left[self.target].0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl TargetIo {
    /// Count a failure worth telling apart (see the fields).
    fn count_error(&self, code: i32) {
        if code == -libc::EIO {
            self.io_errors.fetch_add(1, Ordering::Relaxed);
        } else if code == -peregrine_proto::CSUM_ERRNO {
            self.checksum_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_proto::data;

    fn update(pool: Uuid, target: u32, len: usize) -> Request {
        Request::Update(
            data::UpdateReq {
                addr: Some(data::Address {
                    pool: pool.as_bytes().to_vec(),
                    target,
                    ..Default::default()
                }),
                ..Default::default()
            },
            vec![0u8; len].into(),
        )
    }

    #[test]
    fn histogram_buckets_count_their_own() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(30));
        h.observe(Duration::from_secs(60));
        let (sum, count, b) = h.snapshot();
        assert_eq!(count, 3);
        assert!((sum - 60.00004).abs() < 1e-6, "{sum}");
        assert_eq!(b[0], (25e-6, 1));
        assert_eq!(b[1], (50e-6, 1));
        assert_eq!(b[b.len() - 2].1, 0, "60 s is above every bound");
        assert_eq!(*b.last().unwrap(), (f64::INFINITY, 1));
    }

    #[test]
    fn counts_per_pool_and_target() {
        let io = IoMetrics::leak(2);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut t = io.track(&update(a, 1, 4096)).unwrap();
        t.queued();
        assert_eq!(io.queue_depth(1), 1);
        t.answered(&Ok((Answer::Done, Default::default())));
        assert_eq!(io.queue_depth(1), 0);
        io.track(&update(b, 0, 10)).unwrap().refused(-libc::ESTALE);
        io.track(&update(a, 1, 1)).unwrap().refused(-libc::EIO);
        assert!(io.track(&update(a, 2, 1)).is_none(), "no target 2");
        let pools: Vec<&PoolIo> = io.pools().collect();
        assert_eq!(pools.len(), 2);
        let t = &pools[0].targets[1];
        assert_eq!(pools[0].pool, a);
        assert_eq!(t.ops[Op::Update as usize].load(Ordering::Relaxed), 2);
        assert_eq!(t.failed[Op::Update as usize].load(Ordering::Relaxed), 1);
        assert_eq!(t.update_bytes.load(Ordering::Relaxed), 4096);
        assert_eq!(t.io_errors.load(Ordering::Relaxed), 1);
        assert_eq!(t.update_latency.snapshot().1, 1);
        assert_eq!(pools[1].targets[0].failed[0].load(Ordering::Relaxed), 1);
    }

    #[test]
    fn pools_past_the_slots_share_the_overflow() {
        let io = IoMetrics::leak(1);
        for _ in 0..MAX_POOLS + 2 {
            let mut t = io.track(&update(Uuid::new_v4(), 0, 1)).unwrap();
            t.queued();
            t.answered(&Ok((Answer::Done, Default::default())));
        }
        let pools: Vec<&PoolIo> = io.pools().collect();
        assert_eq!(pools.len(), MAX_POOLS + 1);
        let last = pools.last().unwrap();
        assert!(last.pool.is_nil());
        assert_eq!(last.targets[0].update_bytes.load(Ordering::Relaxed), 2);
    }
}
