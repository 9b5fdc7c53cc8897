//! One target: a thread that owns its index, WAL, allocator, device fd,
//! io_uring ring and buffers (shared-nothing).
//!
//! Each turn of the loop drains up to [`MAX_BATCH`] queued messages. Lists and
//! size queries are answered at once from the index. Fetches are collected;
//! updates and punches are validated, their large values assigned freshly
//! allocated blocks, and their index changes collected. At the end of the
//! drain the fetches run first, together: all of them are planned against
//! the index, ALL their device reads are submitted to the ring at once
//! (packed into the registered buffers; split into groups when those are
//! full), then each is verified, assembled and answered. So a fetch is
//! answered before the updates of its own batch commit; it sees exactly what
//! it would have seen had it run alone at its arrival: the index changes only
//! when a batch commits, and the batch's updates are not acknowledged yet.
//! Then the updates commit: data written to the new blocks, ONE WAL record for
//! the whole batch written and ONE fdatasync makes data and record durable
//! together (all in one io_uring submission, linked so that the record is
//! written only after all the data was and the fdatasync runs only after the
//! record was; a failure cancels the rest of the chain); only then are
//! the changes applied to the index (freeing replaced blocks) and the callers
//! answered (group commit).

use crate::alloc::BlockAlloc;
use crate::bufpool::BUF_BYTES;
use crate::device::DeviceIo;
use crate::error::{Errno, StorageError};
use crate::index::{
    value_scm, DevExtent, Kind, NewValue, ObjKey, Payload, Released, Seg, Src, TargetIndex, WalOp,
};
use crate::superblock::{Superblock, BLOCK};
use crate::wal::{self, CKPT_MAGIC, WAL_MAGIC};
use crate::{PoolSpace, Reply, Request, Responder};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use peregrine_proto::data;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::mpsc::SyncSender;
use std::time::Duration;
use std::time::Instant;
use uuid::Uuid;

/// Most messages drained into one group commit.
const MAX_BATCH: usize = 128;
/// Idle time after which a target aggregates the pools it changed.
const IDLE_AGGREGATE: Duration = Duration::from_secs(30);
/// Largest value a single fetch iod may ask for (guards against absurd array lengths).
const MAX_FETCH: u64 = 1 << 30;
/// `ListReq.max == 0` means this many.
const DEFAULT_LIST_MAX: usize = 1000;

pub(crate) enum Ctl {
    PoolCreate {
        pool: Uuid,
        scm: u64,
        nvme: u64,
    },
    PoolDestroy {
        pool: Uuid,
    },
    PoolSpace {
        pool: Uuid,
    },
    Pools,
    ContDestroy {
        pool: Uuid,
        cont: Uuid,
    },
    SetSnapshots {
        pool: Uuid,
        cont: Uuid,
        epochs: Vec<u64>,
    },
    Aggregate {
        pool: Uuid,
    },
    DeviceSpace,
    Stats,
}

pub(crate) enum CtlOut {
    Done,
    /// Pool created (true) or already there with the same sizes (false).
    Created(bool),
    Space(PoolSpace),
    Pools(Vec<Uuid>),
    Reclaimed(u64),
    /// nvme total, nvme unreserved, scm total, scm unreserved.
    Device([u64; 4]),
    Stats(crate::TargetStats),
}

pub(crate) enum Msg {
    Data(Request, Responder),
    Ctl(Ctl, SyncSender<Result<CtlOut, StorageError>>),
    Stop,
    /// Stop without the closing checkpoint (tests: leaves the WAL to replay).
    Halt,
}

/// Changes waiting for the next group commit.
#[derive(Default)]
struct Batch {
    ops: Vec<WalOp>,
    replies: Vec<Responder>,
    bulks: Vec<Vec<u8>>,
    /// (device offset, bulk index, start, len)
    writes: Vec<(u64, usize, usize, usize)>,
    /// Blocks allocated for this batch (returned if it fails).
    runs: Vec<(u64, u64)>,
    /// Space the batch already claims per pool: (scm, nvme).
    space: HashMap<Uuid, (u64, u64)>,
}

pub(crate) struct Target {
    id: u32,
    sb: Superblock,
    dev: DeviceIo,
    index: TargetIndex,
    alloc: BlockAlloc,
    /// Sequence number of the last durable WAL record.
    seq: u64,
    /// Byte offset inside the WAL where the next record goes.
    wal_tail: u64,
    /// Checkpoint slot the next checkpoint goes to (the other holds the newest).
    next_ckpt: usize,
    scm_budget: u64,
    /// Pools changed since their last aggregation.
    dirty: BTreeSet<Uuid>,
    checkpoints: u64,
    /// Bytes of value per data checksum (the device's format).
    chunk: u64,
    prof: Prof,
}

/// Counters for the log line at close (how well group commit and read batching work).
#[derive(Default)]
struct Prof {
    commits: u64,
    committed_ops: u64,
    commit_ns: u64,
    fetch_rounds: u64,
    fetches: u64,
    read_pieces: u64,
}

/// One iod of a fetch being served.
struct IodRead {
    fv: data::FetchedValue,
    has_crc: bool,
    /// The bytes returned (`fv.len` of them).
    out: Vec<u8>,
    /// Device segments still to read into `out`.
    segs: Vec<Seg>,
    /// A checksum failure of one of its chunks: the iod fails with it.
    bad: Option<Errno>,
}

fn ok_response(body: Option<data::response::Body>) -> data::Response {
    data::Response {
        status: Some(data::Status {
            code: 0,
            message: String::new(),
        }),
        body,
    }
}

fn kind_of(k: i32, op: &str) -> Result<Kind, Errno> {
    match data::ValueKind::try_from(k) {
        Ok(data::ValueKind::Single) => Ok(Kind::Single),
        Ok(data::ValueKind::Array) => Ok(Kind::Array),
        Err(_) => Err(Errno::inval(format!("{op}: unknown value kind {k}"))),
    }
}

fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

impl Target {
    pub(crate) fn open(
        sb: Superblock,
        path: &Path,
        hugepages: bool,
        id: u32,
        scm_budget: u64,
    ) -> Result<Target, StorageError> {
        let dev = DeviceIo::open(path, hugepages, id).map_err(|e| {
            StorageError::io(format!("target {id}: open device {}", path.display()), e)
        })?;
        let alloc = BlockAlloc::new(sb.data_blocks());
        let mut t = Target {
            id,
            sb,
            dev,
            index: TargetIndex::default(),
            alloc,
            seq: 0,
            wal_tail: 0,
            next_ckpt: 0,
            scm_budget,
            dirty: BTreeSet::new(),
            checkpoints: 0,
            chunk: 0,
            prof: Prof::default(),
        };
        t.chunk = t.sb.csum_chunk();
        t.replay()?;
        Ok(t)
    }

    fn io_err(&self, what: &str, e: std::io::Error) -> StorageError {
        StorageError::io(format!("target {}: {what}", self.id), e)
    }

    /// Newest valid checkpoint, then every WAL record after it, in order.
    fn replay(&mut self) -> Result<(), StorageError> {
        let dev_uuid = self.sb.device_uuid;
        let mut best: Option<(u64, TargetIndex, usize)> = None;
        for slot in 0..2 {
            let off = self.sb.ckpt_offset(self.id, slot);
            let blk = self
                .dev
                .read(off, BLOCK as usize)
                .map_err(|e| self.io_err("read checkpoint", e))?;
            let Some(h) = wal::decode_header(CKPT_MAGIC, dev_uuid, &blk) else {
                continue;
            };
            if h.record_bytes() > self.sb.ckpt_bytes || best.as_ref().is_some_and(|b| b.0 >= h.seq)
            {
                continue;
            }
            let rec = self
                .dev
                .read(off, h.record_bytes() as usize)
                .map_err(|e| self.io_err("read checkpoint", e))?;
            match wal::payload(&h, &rec).map(bincode::deserialize::<TargetIndex>) {
                Some(Ok(ix)) => best = Some((h.seq, ix, slot)),
                _ => tracing::warn!(
                    target = self.id,
                    slot,
                    "checkpoint slot damaged (torn write?); ignoring it"
                ),
            }
        }
        if let Some((seq, ix, slot)) = best {
            self.seq = seq;
            self.index = ix;
            self.next_ckpt = slot ^ 1;
        }
        let wal_off = self.sb.wal_offset(self.id);
        let mut tail = 0u64;
        let mut records: Vec<(u64, Vec<WalOp>)> = Vec::new();
        let mut seq = self.seq;
        while tail + BLOCK <= self.sb.wal_bytes {
            let blk = self
                .dev
                .read(wal_off + tail, BLOCK as usize)
                .map_err(|e| self.io_err("read WAL", e))?;
            let Some(h) = wal::decode_header(WAL_MAGIC, dev_uuid, &blk) else {
                break;
            };
            if h.seq != seq + 1 || tail + h.record_bytes() > self.sb.wal_bytes {
                break;
            }
            let rec = if h.record_bytes() > BLOCK {
                self.dev
                    .read(wal_off + tail, h.record_bytes() as usize)
                    .map_err(|e| self.io_err("read WAL", e))?
            } else {
                blk
            };
            let Some(ops) =
                wal::payload(&h, &rec).and_then(|p| bincode::deserialize::<Vec<WalOp>>(p).ok())
            else {
                break;
            };
            records.push((tail, ops));
            seq += 1;
            tail += h.record_bytes();
        }
        // Only the last record can be ahead of its data (a power cut between
        // the device writing the record and the data, before the batch's
        // fsync returned: the batch was never acknowledged). Drop it then.
        if let Some((off, ops)) = records.last() {
            if !self.data_intact(ops)? {
                tracing::warn!(target = self.id, seq, "last WAL batch references data that never reached the device; dropping the unacknowledged batch");
                tail = *off;
                seq -= 1;
                records.pop();
            }
        }
        let n = records.len();
        for (_, ops) in records {
            for op in ops {
                self.index.apply(op, &mut Released::default());
            }
        }
        self.seq = seq;
        self.wal_tail = tail;
        self.index.recount();
        for (b, n) in self.index.device_runs() {
            if !self.alloc.reserve(b, n) {
                return Err(StorageError::Corrupt(format!(
                    "target {}: index references blocks {b}..{} twice or beyond the data region",
                    self.id,
                    b + n
                )));
            }
        }
        tracing::info!(
            target = self.id,
            records = n,
            seq = self.seq,
            pools = self.index.pools.len(),
            "replayed"
        );
        Ok(())
    }

    fn data_intact(&mut self, ops: &[WalOp]) -> Result<bool, StorageError> {
        for op in ops {
            let WalOp::Update { values, .. } = op else {
                continue;
            };
            for v in values {
                if let Payload::Device(ext) = &v.payload {
                    let bytes = self
                        .dev
                        .read(self.data_off(ext.block), v.len as usize)
                        .map_err(|e| self.io_err("verify last WAL batch", e))?;
                    let ok = bytes
                        .chunks(self.chunk as usize)
                        .zip(&ext.csums)
                        .all(|(c, &crc)| peregrine_isal::crc32c(c) == crc);
                    if !ok {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    fn data_off(&self, block: u64) -> u64 {
        self.sb.data_offset(self.id) + block * BLOCK
    }

    pub(crate) fn run(mut self, rx: Receiver<Msg>) {
        loop {
            let first = match rx.recv_timeout(IDLE_AGGREGATE) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    let dirty: Vec<Uuid> = self.dirty.iter().copied().collect();
                    for pool in dirty {
                        self.auto_aggregate(pool, "idle");
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut batch = Batch::default();
            let mut stop = false;
            let mut halt = false;
            let mut fetches = Vec::new();
            let mut next = Some(first);
            let mut n = 0;
            while let Some(m) = next {
                match m {
                    Msg::Data(Request::Fetch(f), tx) => fetches.push((f, tx)),
                    Msg::Data(req, tx) => self.handle(req, tx, &mut batch),
                    Msg::Ctl(c, tx) => {
                        // Control ops see (and log after) everything queued before them.
                        self.fetch_all(&mut fetches);
                        self.commit(&mut batch);
                        let _ = tx.send(self.control(c));
                    }
                    Msg::Stop => {
                        stop = true;
                        break;
                    }
                    Msg::Halt => {
                        halt = true;
                        break;
                    }
                }
                n += 1;
                if n >= MAX_BATCH {
                    break;
                }
                next = rx.try_recv().ok();
            }
            self.fetch_all(&mut fetches);
            self.commit(&mut batch);
            if halt {
                return;
            }
            let full: Vec<Uuid> = self
                .dirty
                .iter()
                .filter(|p| {
                    self.index.pools.get(p).is_some_and(|pt| {
                        pt.nvme_total > 0 && pt.nvme_used() * 10 > pt.nvme_total * 8
                    })
                })
                .copied()
                .collect();
            for pool in full {
                self.auto_aggregate(pool, "nvme usage above 80%");
            }
            if stop {
                break;
            }
        }
        let p = &self.prof;
        tracing::info!(
            target = self.id,
            commits = p.commits,
            ops_per_commit = p.committed_ops as f64 / p.commits.max(1) as f64,
            us_per_commit = p.commit_ns / 1000 / p.commits.max(1),
            fetch_rounds = p.fetch_rounds,
            fetches_per_round = p.fetches as f64 / p.fetch_rounds.max(1) as f64,
            reads_per_round = p.read_pieces as f64 / p.fetch_rounds.max(1) as f64,
            "target closing"
        );
        // A checkpoint at close makes the next open fast; failure is harmless.
        if self.wal_tail > 0 {
            if let Err(e) = self.checkpoint() {
                tracing::warn!(target = self.id, error = %e, "checkpoint at close failed");
            }
        }
    }

    fn auto_aggregate(&mut self, pool: Uuid, why: &str) {
        match self.commit_ctl(WalOp::Aggregate { pool }) {
            Ok(rel) => {
                tracing::debug!(target = self.id, %pool, why, reclaimed = rel.scm + rel.nvme, "aggregated")
            }
            Err(e) => {
                tracing::warn!(target = self.id, %pool, why, error = %e, "aggregation failed")
            }
        }
        self.dirty.remove(&pool);
    }

    fn handle(&mut self, req: Request, tx: Responder, batch: &mut Batch) {
        let r = match req {
            Request::Update(u, bulk) => match self.prepare_update(u, bulk, batch) {
                Ok(()) => {
                    batch.replies.push(tx);
                    return;
                }
                Err(e) => Err(e),
            },
            Request::Punch(p) => match self.prepare_punch(p) {
                Ok(op) => {
                    batch.ops.push(op);
                    batch.replies.push(tx);
                    return;
                }
                Err(e) => Err(e),
            },
            Request::Fetch(f) => {
                let mut one = vec![(f, tx)];
                self.fetch_all(&mut one);
                return;
            }
            Request::List(l) => self.list(l),
            Request::QuerySize(q) => self.query_size(q),
        };
        tx.send(r);
    }

    fn addr(&self, a: Option<&data::Address>, op: &str) -> Result<(Uuid, Uuid, ObjKey), Errno> {
        let a = a.ok_or_else(|| Errno::inval(format!("{op}: missing address")))?;
        if a.target != self.id {
            return Err(Errno::inval(format!(
                "{op}: request for target {} reached target {}",
                a.target, self.id
            )));
        }
        let pool = peregrine_proto::uuid_from_bytes("pool", &a.pool)
            .map_err(|e| Errno::inval(format!("{op}: {e}")))?;
        let cont = peregrine_proto::uuid_from_bytes("cont", &a.cont)
            .map_err(|e| Errno::inval(format!("{op}: {e}")))?;
        let oid = a
            .oid
            .as_ref()
            .ok_or_else(|| Errno::inval(format!("{op}: missing object id")))?;
        if !self.index.pools.contains_key(&pool) {
            return Err(Errno::new(
                -libc::ENOENT,
                format!("{op}: pool {pool} not found on target {}", self.id),
            ));
        }
        Ok((
            pool,
            cont,
            ObjKey {
                hi: oid.hi,
                lo: oid.lo,
                shard: a.shard,
            },
        ))
    }

    fn prepare_update(
        &mut self,
        u: data::UpdateReq,
        bulk: Vec<u8>,
        batch: &mut Batch,
    ) -> Result<(), Errno> {
        let (pool, cont, obj) = self.addr(u.addr.as_ref(), "update")?;
        if u.dkey.is_empty() {
            return Err(Errno::inval("update: empty dkey"));
        }
        if u.epoch == peregrine_proto::EPOCH_LATEST {
            return Err(Errno::inval(
                "update: epoch u64::MAX is reserved for reads of the latest version",
            ));
        }
        let dk = show(&u.dkey);
        let total = u.iods.iter().try_fold(0u64, |s, i| s.checked_add(i.len));
        match total {
            Some(t) if t <= bulk.len() as u64 => {}
            _ => {
                return Err(Errno::inval(format!(
                    "update: dkey {dk:?}: bulk of {} bytes is shorter than the iods' lengths ({})",
                    bulk.len(),
                    total.map_or("overflow".to_string(), |t| t.to_string())
                )))
            }
        }
        // Validate everything before touching any state.
        let mut parsed = Vec::with_capacity(u.iods.len());
        let (mut scm_need, mut nvme_need, mut pos) = (0u64, 0u64, 0usize);
        for iod in &u.iods {
            if iod.akey.is_empty() {
                return Err(Errno::inval(format!("update: dkey {dk:?}: empty akey")));
            }
            let kind = kind_of(iod.kind, "update")?;
            let range = pos..pos + iod.len as usize;
            pos = range.end;
            let v = &bulk[range.clone()];
            if iod.has_crc {
                let got = peregrine_isal::crc32c(v);
                if got != iod.crc {
                    return Err(Errno::new(
                        -peregrine_proto::CSUM_ERRNO,
                        format!(
                            "update: dkey {dk:?} akey {:?}: checksum mismatch (client sent {:#010x}, received data has {got:#010x}); nothing stored",
                            show(&iod.akey),
                            iod.crc
                        ),
                    ));
                }
            }
            if kind == Kind::Array && iod.offset.checked_add(iod.len).is_none() {
                return Err(Errno::inval(format!(
                    "update: akey {:?}: extent overflows",
                    show(&iod.akey)
                )));
            }
            let large = v.len() >= peregrine_proto::DATA_THRESHOLD;
            scm_need += value_scm(&u.dkey, &iod.akey, if large { 0 } else { v.len() as u64 });
            if large {
                nvme_need += wal::round_up(v.len() as u64);
            }
            parsed.push((iod, kind, range, large));
        }
        if u.insert_only {
            for iod in &u.iods {
                if self.visible_latest(&pool, &cont, &obj, &u.dkey, &iod.akey, batch) {
                    return Err(Errno::new(
                        -libc::EEXIST,
                        format!(
                            "update: dkey {dk:?} akey {:?}: insert_only, but the akey already has a value on target {} shard {}; nothing stored",
                            show(&iod.akey),
                            self.id,
                            obj.shard
                        ),
                    ));
                }
            }
        }
        let p = &self.index.pools[&pool];
        let (bs, bn) = batch.space.get(&pool).copied().unwrap_or_default();
        for (tier, need, total, used) in [
            ("scm", scm_need, p.scm_total, p.scm_used() + bs),
            ("nvme", nvme_need, p.nvme_total, p.nvme_used() + bn),
        ] {
            let free = total.saturating_sub(used);
            if need > free {
                return Err(StorageError::NoSpace {
                    pool: pool.to_string(),
                    tier,
                    target: self.id,
                    need,
                    free,
                }
                .into());
            }
        }
        let mut values = Vec::with_capacity(parsed.len());
        let mut runs = Vec::new();
        let mut writes = Vec::new();
        let bi = batch.bulks.len();
        for (iod, kind, range, large) in parsed {
            let v = &bulk[range.clone()];
            let payload = if large {
                let n = wal::round_up(v.len() as u64) / BLOCK;
                let Some(block) = self.alloc.alloc(n) else {
                    let free = self.alloc.free_blocks();
                    for (b, n) in runs {
                        self.alloc.free(b, n);
                    }
                    return Err(Errno::new(
                        -libc::ENOSPC,
                        format!(
                            "update: pool {pool}: target {} data region has no free run of {n} blocks ({free} blocks free)",
                            self.id
                        ),
                    ));
                };
                runs.push((block, n));
                writes.push((self.data_off(block), bi, range.start, range.len()));
                Payload::Device(DevExtent {
                    block,
                    nblocks: n,
                    csums: v
                        .chunks(self.chunk as usize)
                        .map(peregrine_isal::crc32c)
                        .collect(),
                })
            } else {
                Payload::Inline(v.to_vec())
            };
            values.push(NewValue {
                akey: iod.akey.clone(),
                kind,
                offset: if kind == Kind::Array { iod.offset } else { 0 },
                len: iod.len,
                crc: iod.has_crc.then_some(iod.crc),
                payload,
            });
        }
        if !writes.is_empty() {
            batch.bulks.push(bulk);
        }
        batch.writes.extend(writes);
        batch.runs.extend(runs);
        let s = batch.space.entry(pool).or_default();
        s.0 += scm_need;
        s.1 += nvme_need;
        batch.ops.push(WalOp::Update {
            pool,
            cont,
            obj,
            dkey: u.dkey,
            epoch: u.epoch,
            values,
        });
        Ok(())
    }

    /// Whether `akey` has a visible value at the latest epoch once the
    /// changes already prepared in `batch` (applied before this request,
    /// in queue order) are applied too.
    fn visible_latest(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
        batch: &Batch,
    ) -> bool {
        let (mut newest, mut floor) = self.index.akey_latest(pool, cont, obj, dkey, akey);
        for op in &batch.ops {
            match op {
                WalOp::Update {
                    pool: p,
                    cont: c,
                    obj: o,
                    dkey: d,
                    epoch,
                    values,
                } if (p, c, o, d.as_slice()) == (pool, cont, obj, dkey)
                    && values.iter().any(|v| v.akey == akey) =>
                {
                    newest = newest.max(Some(*epoch));
                }
                WalOp::Punch {
                    pool: p,
                    cont: c,
                    obj: o,
                    dkey: d,
                    akeys,
                    epoch,
                } if (p, c, o) == (pool, cont, obj)
                    && (d.is_empty()
                        || (d.as_slice() == dkey
                            && (akeys.is_empty() || akeys.iter().any(|a| a == akey)))) =>
                {
                    floor = floor.max(Some(*epoch));
                }
                _ => {}
            }
        }
        newest > floor
    }

    fn prepare_punch(&mut self, p: data::PunchReq) -> Result<WalOp, Errno> {
        let (pool, cont, obj) = self.addr(p.addr.as_ref(), "punch")?;
        if p.dkey.is_empty() && !p.akeys.is_empty() {
            return Err(Errno::inval("punch: akeys given without a dkey"));
        }
        Ok(WalOp::Punch {
            pool,
            cont,
            obj,
            dkey: p.dkey,
            akeys: p.akeys,
            epoch: p.epoch,
        })
    }

    /// Make the batch durable (data, one WAL record, one fsync), apply it, answer.
    fn commit(&mut self, batch: &mut Batch) {
        if batch.ops.is_empty() {
            return;
        }
        let b = std::mem::take(batch);
        let t0 = Instant::now();
        let writes: Vec<(u64, &[u8])> = b
            .writes
            .iter()
            .map(|&(off, bi, s, l)| (off, &b.bulks[bi][s..s + l]))
            .collect();
        let res = self.log_with(&b.ops, &writes);
        self.prof.commits += 1;
        self.prof.committed_ops += b.ops.len() as u64;
        self.prof.commit_ns += t0.elapsed().as_nanos() as u64;
        match res {
            Ok(()) => {
                for op in b.ops {
                    if let WalOp::Update { pool, .. } | WalOp::Punch { pool, .. } = &op {
                        self.dirty.insert(*pool);
                    }
                    self.apply(op);
                }
                for tx in b.replies {
                    tx.send(Ok((ok_response(None), Vec::new())));
                }
                self.maybe_checkpoint();
            }
            Err(e) => {
                for (blk, n) in b.runs {
                    self.alloc.free(blk, n);
                }
                for tx in b.replies {
                    tx.send(Err(e.clone()));
                }
            }
        }
    }

    fn apply(&mut self, op: WalOp) -> Released {
        let mut rel = Released::default();
        self.index.apply(op, &mut rel);
        // Durable now: the freed blocks may be reused.
        for &(b, n) in &rel.runs {
            self.alloc.free(b, n);
        }
        rel
    }

    /// Log and apply one control change.
    fn commit_ctl(&mut self, op: WalOp) -> Result<Released, StorageError> {
        self.log(std::slice::from_ref(&op))
            .map_err(|e| StorageError::io(e.msg, std::io::Error::from_raw_os_error(-e.code)))?;
        let rel = self.apply(op);
        self.maybe_checkpoint();
        Ok(rel)
    }

    /// Append one WAL record holding `ops` and fdatasync (covering the data
    /// writes issued before it).
    fn log(&mut self, ops: &[WalOp]) -> Result<(), Errno> {
        self.log_with(ops, &[])
    }

    /// Write `data` (the batch's values) and one WAL record holding `ops`,
    /// then fdatasync: in ONE submission, linked (IOSQE_IO_LINK) so that
    /// the record is written only after all the data was, and the fdatasync
    /// runs only after the record was (a failure cancels the rest).
    fn log_with(&mut self, ops: &[WalOp], data: &[(u64, &[u8])]) -> Result<(), Errno> {
        let payload = bincode::serialize(ops)
            .map_err(|e| Errno::new(-libc::EIO, format!("target {}: encode WAL: {e}", self.id)))?;
        let rec = wal::encode(WAL_MAGIC, self.sb.device_uuid, self.seq + 1, &payload);
        if rec.len() as u64 > self.sb.wal_bytes / 2 {
            return Err(Errno::new(
                -libc::ENOSPC,
                format!(
                    "target {}: batch of {} bytes exceeds half the WAL ({} bytes)",
                    self.id,
                    rec.len(),
                    self.sb.wal_bytes
                ),
            ));
        }
        if self.wal_tail + rec.len() as u64 > self.sb.wal_bytes {
            self.checkpoint().map_err(|e| {
                Errno::new(
                    -libc::ENOSPC,
                    format!("target {}: WAL full and checkpoint failed: {e}", self.id),
                )
            })?;
        }
        let off = self.sb.wal_offset(self.id) + self.wal_tail;
        let mut writes = data.to_vec();
        writes.push((off, &rec));
        self.dev.write(&writes, true).map_err(|e| {
            Errno::new(
                -libc::EIO,
                format!("target {}: write data and WAL: {e}", self.id),
            )
        })?;
        self.seq += 1;
        self.wal_tail += rec.len() as u64;
        Ok(())
    }

    fn maybe_checkpoint(&mut self) {
        if self.wal_tail > self.sb.wal_bytes / 2 {
            if let Err(e) = self.checkpoint() {
                tracing::warn!(target = self.id, error = %e, "checkpoint failed; WAL keeps growing");
            }
        }
    }

    /// Write the index to the inactive slot, fsync, then restart the WAL.
    /// The index holds exactly the durable state here (changes are applied
    /// only after their record is durable), stamped with the last record's seq.
    fn checkpoint(&mut self) -> Result<(), StorageError> {
        let payload = bincode::serialize(&self.index).map_err(|e| {
            StorageError::Corrupt(format!("target {}: encode checkpoint: {e}", self.id))
        })?;
        let rec = wal::encode(CKPT_MAGIC, self.sb.device_uuid, self.seq, &payload);
        if rec.len() as u64 > self.sb.ckpt_bytes {
            return Err(StorageError::Invalid(format!(
                "target {}: checkpoint of {} bytes exceeds its slot of {} bytes (metadata budget too large for this device)",
                self.id,
                rec.len(),
                self.sb.ckpt_bytes
            )));
        }
        let off = self.sb.ckpt_offset(self.id, self.next_ckpt);
        self.dev
            .write(&[(off, &rec)], true)
            .map_err(|e| self.io_err("write checkpoint", e))?;
        tracing::debug!(
            target = self.id,
            slot = self.next_ckpt,
            seq = self.seq,
            bytes = rec.len(),
            "checkpoint"
        );
        self.next_ckpt ^= 1;
        self.wal_tail = 0;
        self.checkpoints += 1;
        Ok(())
    }

    /// Plan one fetch against the index: its iods, with inline bytes already
    /// in place; device segments still to read.
    fn plan(&self, f: &data::FetchReq) -> Result<Vec<IodRead>, Errno> {
        let (pool, cont, obj) = self.addr(f.addr.as_ref(), "fetch")?;
        let mut iods = Vec::with_capacity(f.iods.len());
        for iod in &f.iods {
            let kind = kind_of(iod.kind, "fetch")?;
            if kind == Kind::Array && iod.len > MAX_FETCH {
                return Err(Errno::inval(format!(
                    "fetch: akey {:?}: {} bytes asked, at most {MAX_FETCH} per iod",
                    show(&iod.akey),
                    iod.len
                )));
            }
            let plan = self.index.plan_fetch(
                &pool, &cont, &obj, &f.dkey, &iod.akey, kind, iod.offset, iod.len, f.epoch,
            );
            let mut r = IodRead {
                fv: data::FetchedValue {
                    status: plan.status,
                    size: plan.size,
                    ..Default::default()
                },
                has_crc: plan.has_crc,
                out: Vec::new(),
                segs: Vec::new(),
                bad: None,
            };
            if plan.status == 0 {
                r.fv.len = plan.len;
                r.out = vec![0u8; plan.len as usize];
                for s in plan.segs {
                    match &s.src {
                        Src::Inline(b) => r.out[s.out_off as usize..(s.out_off + s.len) as usize]
                            .copy_from_slice(b),
                        Src::Dev { .. } if s.len > 0 => r.segs.push(s),
                        Src::Dev { .. } => {}
                    }
                }
            }
            iods.push(r);
        }
        Ok(iods)
    }

    /// Run a batch of fetches: plan them all, submit all their device reads
    /// at once, verify the chunk checksums, assemble and answer each.
    fn fetch_all(&mut self, fetches: &mut Vec<(data::FetchReq, Responder)>) {
        if fetches.is_empty() {
            return;
        }
        let fetches = std::mem::take(fetches);
        let mut plans: Vec<Result<Vec<IodRead>, Errno>> =
            fetches.iter().map(|(f, _)| self.plan(f)).collect();
        // Device pieces: whole checksum chunks, at most one buffer each.
        let chunk = self.chunk;
        let mut pieces: Vec<(u64, usize)> = Vec::new();
        // (fetch, iod, seg, start of the piece in the value)
        let mut dst: Vec<(usize, usize, usize, u64)> = Vec::new();
        for (fi, p) in plans.iter().enumerate() {
            let Ok(iods) = p else { continue };
            for (ii, r) in iods.iter().enumerate() {
                for (si, s) in r.segs.iter().enumerate() {
                    let Src::Dev {
                        ext,
                        value_len,
                        value_off,
                    } = &s.src
                    else {
                        continue;
                    };
                    let start = value_off / chunk * chunk;
                    let end = (value_off + s.len).div_ceil(chunk) * chunk;
                    let end = end.min(*value_len);
                    let mut ps = start;
                    while ps < end {
                        let pe = (ps + BUF_BYTES as u64).min(end);
                        pieces.push((self.data_off(ext.block) + ps, (pe - ps) as usize));
                        dst.push((fi, ii, si, ps));
                        ps = pe;
                    }
                }
            }
        }
        self.prof.fetch_rounds += 1;
        self.prof.fetches += fetches.len() as u64;
        self.prof.read_pieces += pieces.len() as u64;
        let id = self.id;
        let ring = self.dev.read_many(&pieces, |k, res| {
            let (fi, ii, si, ps) = dst[k];
            let Ok(iods) = &mut plans[fi] else { return };
            let r = &mut iods[ii];
            let s = &r.segs[si];
            let Src::Dev {
                ext, value_off, ..
            } = &s.src
            else {
                return;
            };
            let bytes = match res {
                Ok(b) => b,
                Err(e) => {
                    plans[fi] = Err(Errno::new(
                        -libc::EIO,
                        format!("target {id}: read block {}: {e}", ext.block),
                    ));
                    return;
                }
            };
            let c0 = (ps / chunk) as usize;
            for (i, b) in bytes.chunks(chunk as usize).enumerate() {
                let c = c0 + i;
                if ext.csums.get(c).copied() != Some(peregrine_isal::crc32c(b)) {
                    r.bad.get_or_insert(Errno::new(
                        -peregrine_proto::CSUM_ERRNO,
                        format!(
                            "target {id}: checksum mismatch in chunk {c} ({chunk} bytes) of the extent at data block {} (device corruption)",
                            ext.block
                        ),
                    ));
                    return;
                }
            }
            // The part of the piece the caller asked for.
            let (from, to) = (ps.max(*value_off), (ps + bytes.len() as u64).min(value_off + s.len));
            if from < to {
                let o = (s.out_off + from - value_off) as usize;
                r.out[o..o + (to - from) as usize]
                    .copy_from_slice(&bytes[(from - ps) as usize..(to - ps) as usize]);
            }
        });
        if let Err(e) = ring {
            let e = Errno::new(-libc::EIO, format!("target {id}: read: {e}"));
            for p in plans.iter_mut() {
                *p = Err(e.clone());
            }
        }
        for ((f, tx), p) in fetches.into_iter().zip(plans) {
            tx.send(p.map(|iods| self.assemble(&f, iods)));
        }
    }

    fn assemble(&self, f: &data::FetchReq, iods: Vec<IodRead>) -> (data::Response, Vec<u8>) {
        let single = iods.len() == 1;
        let mut values = Vec::with_capacity(iods.len());
        let mut bulk = Vec::new();
        for (r, iod) in iods.into_iter().zip(&f.iods) {
            let mut fv = r.fv;
            if let Some(e) = r.bad {
                tracing::error!(target = self.id, dkey = %show(&f.dkey), akey = %show(&iod.akey), "{}", e.msg);
                fv.status = e.code;
                fv.len = 0;
            } else if fv.status == 0 {
                fv.crc = peregrine_isal::crc32c(&r.out);
                fv.has_crc = r.has_crc;
                if single {
                    bulk = r.out;
                } else {
                    bulk.extend_from_slice(&r.out);
                }
            }
            values.push(fv);
        }
        (
            ok_response(Some(data::response::Body::Fetch(data::FetchResp {
                values,
            }))),
            bulk,
        )
    }

    fn list(&mut self, l: data::ListReq) -> Reply {
        let (pool, cont, obj) = self.addr(l.addr.as_ref(), "list")?;
        let max = if l.max == 0 {
            DEFAULT_LIST_MAX
        } else {
            l.max as usize
        };
        let (keys, done) = self
            .index
            .list(&pool, &cont, &obj, &l.dkey, &l.anchor, max, l.epoch);
        let anchor = keys.last().cloned().unwrap_or(l.anchor);
        Ok((
            ok_response(Some(data::response::Body::List(data::ListResp {
                keys,
                anchor,
                done,
            }))),
            Vec::new(),
        ))
    }

    fn query_size(&mut self, q: data::QuerySizeReq) -> Reply {
        let (pool, cont, obj) = self.addr(q.addr.as_ref(), "query size")?;
        let size = self
            .index
            .query_size(&pool, &cont, &obj, &q.dkey, &q.akey, q.epoch);
        Ok((
            ok_response(Some(data::response::Body::Size(data::QuerySizeResp {
                size,
            }))),
            Vec::new(),
        ))
    }

    fn unreserved(&self) -> (u64, u64) {
        let nvme: u64 = self.index.pools.values().map(|p| p.nvme_total).sum();
        let scm: u64 = self.index.pools.values().map(|p| p.scm_total).sum();
        (
            self.sb.data_bytes.saturating_sub(nvme),
            self.scm_budget.saturating_sub(scm),
        )
    }

    fn pool_missing(&self, pool: &Uuid) -> StorageError {
        StorageError::NotFound(format!("pool {pool} not found on target {}", self.id))
    }

    fn control(&mut self, c: Ctl) -> Result<CtlOut, StorageError> {
        match c {
            Ctl::PoolCreate { pool, scm, nvme } => {
                if let Some(p) = self.index.pools.get(&pool) {
                    if p.scm_total == scm && p.nvme_total == nvme {
                        return Ok(CtlOut::Created(false));
                    }
                    return Err(StorageError::Exists(format!(
                        "pool {pool} already exists on target {} with scm {} / nvme {} bytes per target (asked {scm} / {nvme})",
                        self.id, p.scm_total, p.nvme_total
                    )));
                }
                let (nvme_free, scm_free) = self.unreserved();
                for (tier, need, free) in [("scm", scm, scm_free), ("nvme", nvme, nvme_free)] {
                    if need > free {
                        return Err(StorageError::NoSpace {
                            pool: pool.to_string(),
                            tier,
                            target: self.id,
                            need,
                            free,
                        });
                    }
                }
                self.commit_ctl(WalOp::PoolCreate { pool, scm, nvme })?;
                Ok(CtlOut::Created(true))
            }
            Ctl::PoolDestroy { pool } => {
                if self.index.pools.contains_key(&pool) {
                    self.commit_ctl(WalOp::PoolDestroy { pool })?;
                    self.dirty.remove(&pool);
                }
                Ok(CtlOut::Done)
            }
            Ctl::PoolSpace { pool } => {
                let p = self
                    .index
                    .pools
                    .get(&pool)
                    .ok_or_else(|| self.pool_missing(&pool))?;
                Ok(CtlOut::Space(PoolSpace {
                    scm_total: p.scm_total,
                    scm_free: p.scm_total.saturating_sub(p.scm_used()),
                    nvme_total: p.nvme_total,
                    nvme_free: p.nvme_total.saturating_sub(p.nvme_used()),
                    cont_used: p
                        .conts
                        .iter()
                        .map(|(k, c)| (*k, c.scm_used + c.nvme_used))
                        .collect(),
                }))
            }
            Ctl::Pools => Ok(CtlOut::Pools(self.index.pools.keys().copied().collect())),
            Ctl::ContDestroy { pool, cont } => {
                let p = self
                    .index
                    .pools
                    .get(&pool)
                    .ok_or_else(|| self.pool_missing(&pool))?;
                if p.conts.contains_key(&cont) {
                    self.commit_ctl(WalOp::ContDestroy { pool, cont })?;
                }
                Ok(CtlOut::Done)
            }
            Ctl::SetSnapshots { pool, cont, epochs } => {
                if !self.index.pools.contains_key(&pool) {
                    return Err(self.pool_missing(&pool));
                }
                self.commit_ctl(WalOp::SetSnapshots { pool, cont, epochs })?;
                self.dirty.insert(pool);
                Ok(CtlOut::Done)
            }
            Ctl::Aggregate { pool } => {
                if !self.index.pools.contains_key(&pool) {
                    return Err(self.pool_missing(&pool));
                }
                let rel = self.commit_ctl(WalOp::Aggregate { pool })?;
                self.dirty.remove(&pool);
                Ok(CtlOut::Reclaimed(rel.scm + rel.nvme))
            }
            Ctl::DeviceSpace => {
                let (nvme_free, scm_free) = self.unreserved();
                Ok(CtlOut::Device([
                    self.sb.data_bytes,
                    nvme_free,
                    self.scm_budget,
                    scm_free,
                ]))
            }
            Ctl::Stats => Ok(CtlOut::Stats(crate::TargetStats {
                seq: self.seq,
                wal_tail: self.wal_tail,
                checkpoints: self.checkpoints,
                free_blocks: self.alloc.free_blocks(),
            })),
        }
    }
}
