//! The commit pipeline: the open batch ([`Batch`]) gathered from updates
//! and punches, sealed and written (its WAL record beside its data, with
//! the writes started ahead) as one of up to [`MAX_COMMITS`] commits in
//! flight ([`InCommit`]), fdatasynced if synchronous, then applied and
//! answered in sequence order; a failed write fails it and every later
//! batch. Also the blocking path (nothing in flight) that logs a batch too
//! large for the buffers, or a control operation.

use super::*;

/// Where the target is in its WAL and checkpoint slots.
pub(super) struct Wal {
    /// Sequence number of the last applied (written) WAL record.
    pub(super) seq: u64,
    /// Sequence number of the last WAL record written or being written.
    pub(super) seq_started: u64,
    /// Byte offset inside the WAL where the next record goes.
    pub(super) tail: u64,
    /// Stamped on the WAL records of this opening (nonzero, random): see [`crate::wal`].
    pub(super) generation: u64,
    /// How this opening lays its records out: packed when the WAL goes
    /// through the page cache.
    pub(super) layout: wal::Layout,
    /// Checkpoint slot the next checkpoint goes to (the other holds the newest).
    pub(super) next_ckpt: usize,
    /// Bytes of the newest checkpoint (0: none yet).
    pub(super) ckpt_bytes: u64,
    pub(super) checkpoints: u64,
    /// A checkpoint is due: no new device work starts until it is written.
    pub(super) ckpt_due: bool,
}

impl Wal {
    pub(super) fn new(layout: wal::Layout) -> Self {
        Wal {
            seq: 0,
            seq_started: 0,
            tail: 0,
            generation: Uuid::new_v4().as_u64_pair().0.max(1),
            layout,
            next_ckpt: 0,
            ckpt_bytes: 0,
            checkpoints: 0,
            ckpt_due: false,
        }
    }
}

/// The commit pipeline: the batch being gathered, the commits in flight
/// and the writes started ahead of them.
#[derive(Default)]
pub(super) struct Commits {
    /// The batch being gathered.
    pub(super) open: Batch,
    /// Data writes started ahead of their batch's commit, by tag.
    pub(super) ahead: HashMap<u64, AheadWrite>,
    /// Blocks of failed batches whose writes were still in flight: they
    /// return to the allocator when the last of them is done.
    pub(super) orphans: Vec<(u64, Vec<(u64, u64)>)>,
    /// Commits in flight, oldest first (applied and answered in this order).
    pub(super) commits: VecDeque<InCommit>,
    /// Space claimed by the commits in flight per pool: (scm, nvme).
    pub(super) claimed: HashMap<Uuid, (u64, u64)>,
}

/// Changes waiting for the next group commit.
#[derive(Default)]
pub(super) struct Batch {
    /// Tells its data writes in flight apart from those of other batches.
    pub(super) id: u64,
    pub(super) ops: Vec<WalOp>,
    pub(super) replies: Vec<Responder>,
    /// The data blocks to write: (device offset, at most a buffer of bytes).
    pub(super) writes: Vec<(u64, Staged)>,
    /// Blocks allocated for this batch (returned if it fails).
    pub(super) runs: Vec<(u64, u64)>,
    /// Space the batch already claims per pool: (scm, nvme).
    pub(super) space: HashMap<Uuid, (u64, u64)>,
    /// Bytes of values going to data blocks.
    pub(super) data: usize,
    /// The first of its writes started ahead ([`Commits::ahead`]) that failed.
    pub(super) err: Option<std::io::Error>,
    /// Flushed before it is answered (see "Acknowledgement" in [`super`]).
    pub(super) sync: bool,
}

/// A data write started ahead of its batch's commit (see [`Target::write_ahead`]).
pub(super) struct AheadWrite {
    pub(super) batch: u64,
    pub(super) buf: usize,
    pub(super) len: usize,
}

/// Bytes on their way to data blocks: in a region of the registered
/// buffers (buffer, offset, length padded to whole blocks with zeros) that
/// the write starts from, or in memory of their own when no region was
/// free (copied into one when the batch starts).
pub(super) enum Staged {
    Region(usize, usize, usize),
    Bytes(Vec<u8>),
}

impl Batch {
    /// Move the staged bytes out of the registered buffers, for the blocking
    /// paths, which use every buffer.
    pub(super) fn unstage(&mut self, dev: &mut DeviceIo) {
        for (_, w) in &mut self.writes {
            if let Staged::Region(buf, off, len) = *w {
                *w = Staged::Bytes(dev.bytes(buf, off, len).to_vec());
                dev.release(buf);
            }
        }
    }
}

/// Bytes of `writes` staged in regions of the registered buffers.
pub(super) fn staged_bytes(writes: &[(u64, Staged)]) -> usize {
    writes
        .iter()
        .map(|(_, w)| match w {
            Staged::Region(_, _, len) => *len,
            Staged::Bytes(_) => 0,
        })
        .sum()
}

/// Give back the regions `writes` were staged in.
pub(super) fn release_staged(dev: &mut DeviceIo, writes: impl IntoIterator<Item = (u64, Staged)>) {
    for (_, w) in writes {
        if let Staged::Region(buf, ..) = w {
            dev.release(buf);
        }
    }
}

/// A batch being committed: its data and its WAL record are written side
/// by side (with the batch's writes started ahead), then, if synchronous,
/// ONE fdatasync.
pub(super) struct InCommit {
    /// Tag of its own writes (the op index tells them apart); `tag + 1`: its fdatasync.
    pub(super) tag: u64,
    pub(super) batch: u64,
    pub(super) seq: u64,
    pub(super) ops: Vec<WalOp>,
    pub(super) replies: Vec<Responder>,
    pub(super) runs: Vec<(u64, u64)>,
    pub(super) space: HashMap<Uuid, (u64, u64)>,
    /// Per write of its own: the buffer its region is in.
    pub(super) regions: Vec<usize>,
    /// Its writes in flight, those started ahead included.
    pub(super) writing: usize,
    /// Answered only after an fdatasync ([`Target::start_syncs`]).
    pub(super) sync: bool,
    /// Its fdatasync has started.
    pub(super) syncing: bool,
    /// Ready to be applied and answered: written (and flushed if `sync`),
    /// or failed.
    pub(super) done: bool,
    pub(super) err: Option<std::io::Error>,
    pub(super) t0: Instant,
    /// When its last write was done.
    pub(super) written: Option<Instant>,
}

impl Target {
    /// A data write of batch `batch` started ahead of its commit is done: it
    /// counts for the open batch, or for the batch's commit once sealed
    /// ([`Target::write_done`]); a failed update's blocks are given back
    /// after its last such write.
    pub(super) fn written(&mut self, batch: u64, res: std::io::Result<()>) {
        if self.commit.open.id == batch {
            if let Err(e) = res {
                self.commit.open.err.get_or_insert(e);
            }
        } else if let Some(i) = self.commit.commits.iter().position(|c| c.batch == batch) {
            if let Err(e) = res {
                self.commit.commits[i].err.get_or_insert(e);
            }
            self.write_done(i);
        }
        if self.writes_ahead(batch) == 0 {
            // Nothing lands on a failed update's blocks any more.
            while let Some(i) = self.commit.orphans.iter().position(|(b, _)| *b == batch) {
                for (b, n) in self.commit.orphans.swap_remove(i).1 {
                    self.alloc.free(b, n);
                }
            }
        }
    }

    /// Writes started ahead for batch `batch` that are still in flight.
    fn writes_ahead(&self, batch: u64) -> usize {
        self.commit
            .ahead
            .values()
            .filter(|w| w.batch == batch)
            .count()
    }

    /// Give back the blocks of a failed update or batch of `batch`: now, or
    /// once no write started ahead for that batch can still land on them.
    pub(super) fn free_after_writes(&mut self, batch: u64, runs: Vec<(u64, u64)>) {
        if self.writes_ahead(batch) > 0 {
            self.commit.orphans.push((batch, runs));
        } else {
            for (b, n) in runs {
                self.alloc.free(b, n);
            }
        }
    }

    /// One write of commit `i` is done: after its last one the commit is
    /// done, unless it is synchronous and all went well: then it waits for
    /// its fdatasync ([`Target::start_syncs`]).
    pub(super) fn write_done(&mut self, i: usize) {
        let c = &mut self.commit.commits[i];
        c.writing -= 1;
        if c.writing > 0 {
            return;
        }
        c.written = Some(Instant::now());
        c.done = !c.sync || c.err.is_some();
    }

    /// Start the fdatasync of each synchronous commit whose writes are done,
    /// and those of every commit before it: it covers its own record and
    /// all before it, so replay reaches it.
    pub(super) fn start_syncs(&mut self) {
        for c in self.commit.commits.iter_mut() {
            if c.writing > 0 {
                return;
            }
            if c.done || c.syncing {
                continue;
            }
            c.syncing = true;
            self.prof.flushes += 1;
            self.counters.flush();
            if let Err(e) = self.dev.start(c.tag + 1, &[Op::sync()]) {
                c.err = Some(e);
                c.done = true;
            }
        }
    }

    /// Apply and answer the commits done, oldest first: a commit whose
    /// device writes failed fails, and so does every later one (its record
    /// follows a record that may be missing, so replay would not reach it).
    pub(super) fn retire_commits(&mut self) {
        while self.commit.commits.front().is_some_and(|c| c.done) {
            let c = self.commit.commits.pop_front().expect("front");
            for (pool, (scm, nvme)) in &c.space {
                let e = self.commit.claimed.entry(*pool).or_default();
                e.0 -= scm;
                e.1 -= nvme;
            }
            self.prof.commits += 1;
            self.prof.committed_ops += c.ops.len() as u64;
            self.prof.commit_ns += c.t0.elapsed().as_nanos() as u64;
            if let Some(w) = c.written {
                self.prof.write_ns += (w - c.t0).as_nanos() as u64;
            }
            if let Some(e) = c.err {
                self.device_failed(e);
            }
            if let Some(e) = &self.broken {
                for (b, n) in c.runs {
                    self.alloc.free(b, n);
                }
                for tx in c.replies {
                    tx.send(Err(e.clone()));
                }
                continue;
            }
            self.wal.seq = c.seq;
            for op in c.ops {
                if let Some(pool) = op.changed_pool() {
                    self.dirty.insert(pool);
                }
                if let Some(pool) = op.removing_pool() {
                    self.removed.insert(pool);
                }
                self.apply(op, c.seq);
            }
            for tx in c.replies {
                tx.send(Ok((Answer::Done, Gather::default())));
            }
        }
        if self.checkpoint_due() {
            self.wal.ckpt_due = true;
        }
    }

    /// Start committing the gathered batch: its WAL record and the value
    /// bytes not written ahead go to the device now, side by side with its
    /// writes started ahead. It is applied and answered when they are done
    /// (and, if synchronous, its fdatasync: [`Target::start_syncs`]), after
    /// the commits before it.
    pub(super) fn start_commit(&mut self) {
        if (self.commit.open.ops.is_empty() && !self.commit.open.sync)
            || self.commit.commits.len() >= MAX_COMMITS
        {
            return;
        }
        // Stamp the record with the last flush; a flush alone writes a
        // record only to stamp it, for freed blocks waiting to be settled.
        let stamped =
            self.commit.open.ops.iter().any(
                |op| matches!(op, WalOp::Flushed { through } if *through >= self.flush.durable),
            );
        if !stamped
            && self.flush.durable > self.flush.stamped
            && (!self.commit.open.ops.is_empty() || !self.flush.unsettled.is_empty())
        {
            self.commit.open.ops.push(WalOp::Flushed {
                through: self.flush.durable,
            });
        }
        if let Some(e) = self.commit.open.err.take() {
            self.device_failed(e);
        }
        if let Some(e) = self.broken.clone() {
            let b = self.seal();
            self.fail_batch(b, e);
            return;
        }
        if self.commit.open.ops.is_empty() {
            let b = self.seal();
            let tag = self.next_tag;
            self.next_tag += 2;
            self.commit.commits.push_back(InCommit {
                tag,
                batch: b.id,
                seq: self.wal.seq_started,
                ops: Vec::new(),
                replies: b.replies,
                runs: b.runs,
                space: b.space,
                regions: Vec::new(),
                writing: self.writes_ahead(b.id),
                sync: true,
                syncing: false,
                done: false,
                err: None,
                t0: Instant::now(),
                written: None,
            });
            self.start_syncs();
            return;
        }
        let rec = match self.wal_record(&self.commit.open.ops) {
            Ok(r) => r,
            Err(e) => {
                let b = self.seal();
                self.fail_batch(b, e);
                return;
            }
        };
        if self.wal.tail + rec.len() as u64 > self.sb.wal_bytes {
            // The WAL restarts after a checkpoint, which waits for the device.
            self.wal.ckpt_due = true;
            return;
        }
        let rec_bytes = rec.len() as u64;
        let rec = self.zero_to_block(rec);
        let mut b = self.seal();
        let wal_off = self.sb.wal_offset(self.id) + self.wal.tail;
        let mut ops = Vec::new();
        let mut regions = Vec::new();
        // Regions taken here (the staged ones stay with the batch if it waits).
        let mut fresh = Vec::new();
        let recs = rec
            .chunks(BUF_BYTES)
            .enumerate()
            .map(|(k, p)| (wal_off + (k * BUF_BYTES) as u64, p));
        let mut short = false;
        let pieces = b.writes.iter().map(|(off, w)| (*off, Some(w), &[][..]));
        for (off, staged, bytes) in pieces.chain(recs.map(|(o, p)| (o, None, p))) {
            let r = match staged {
                Some(Staged::Region(buf, boff, len)) => Some((*buf, *boff, *len)),
                Some(Staged::Bytes(v)) => self.dev.region_with(v),
                // The record's own length: a packed one starts inside a
                // block, and its write (into the page cache) stops at the
                // end of the block it ends in.
                None => self
                    .dev
                    .region_with(bytes)
                    .map(|(b, o, _)| (b, o, bytes.len())),
            };
            let Some(r) = r else {
                short = true;
                break;
            };
            if !matches!(staged, Some(Staged::Region(..))) {
                fresh.push(r.0);
            }
            ops.push(Op::write(off, r));
            regions.push(r.0);
        }
        if short {
            for buf in fresh {
                self.dev.release(buf);
            }
            if self.dev.in_flight() == 0 {
                // Larger than the buffers: the blocking path writes it in groups.
                b.unstage(&mut self.dev);
                self.commit_sync(b);
            } else {
                self.commit.open = b;
            }
            return;
        }
        let tag = self.next_tag;
        self.next_tag += 2;
        if let Err(e) = self.dev.start(tag, &ops) {
            for buf in regions {
                self.dev.release(buf);
            }
            // Their regions were among those just released.
            b.writes.clear();
            self.device_failed(e);
            let e = self.broken.clone().expect("set by device_failed");
            self.fail_batch(b, e);
            return;
        }
        self.wal.seq_started += 1;
        self.counters.wal_record();
        self.wal.tail += rec_bytes;
        self.note_stamps(self.wal.seq_started, &b.ops);
        if b.ops.iter().any(|op| !matches!(op, WalOp::Flushed { .. })) {
            self.flush.last_real = self.wal.seq_started;
        }
        for (pool, (scm, nvme)) in &b.space {
            let e = self.commit.claimed.entry(*pool).or_default();
            e.0 += scm;
            e.1 += nvme;
        }
        self.commit.commits.push_back(InCommit {
            tag,
            batch: b.id,
            seq: self.wal.seq_started,
            ops: b.ops,
            replies: b.replies,
            runs: b.runs,
            space: b.space,
            regions,
            writing: self.writes_ahead(b.id) + ops.len(),
            sync: b.sync,
            syncing: false,
            done: false,
            err: None,
            t0: Instant::now(),
            written: None,
        });
    }

    /// Close the open batch (a new one gathers from now on).
    fn seal(&mut self) -> Batch {
        let id = self.commit.open.id + 1;
        std::mem::replace(
            &mut self.commit.open,
            Batch {
                id,
                ..Batch::default()
            },
        )
    }

    /// A device write failed: the device's state is unknown, so updates are
    /// refused from now on (the first failure is the one reported).
    fn device_failed(&mut self, e: std::io::Error) {
        if self.broken.is_none() {
            tracing::error!(target = self.id, seq = self.wal.seq_started, error = %e, "device write failed; this target refuses updates until the engine restarts");
            self.stop_updates(Errno::new(
                -libc::EIO,
                format!("target {}: a device write failed ({e}); the target refuses updates until the engine restarts", self.id),
            ));
        }
    }

    /// Refuse updates from now on, and say why to [`crate::Storage::faults`].
    fn stop_updates(&mut self, e: Errno) {
        *self.fault.lock() = Some(e.msg.clone());
        self.broken = Some(e);
    }

    fn fail_batch(&mut self, b: Batch, e: Errno) {
        self.free_after_writes(b.id, b.runs);
        release_staged(&mut self.dev, b.writes);
        for tx in b.replies {
            tx.send(Err(e.clone()));
        }
    }

    /// Commit a batch with blocking I/O (nothing else in flight): for
    /// batches larger than the registered buffers.
    fn commit_sync(&mut self, b: Batch) {
        let t0 = Instant::now();
        let writes: Vec<(u64, &[u8])> = b
            .writes
            .iter()
            .map(|(off, w)| match w {
                Staged::Bytes(v) => (*off, &v[..]),
                Staged::Region(..) => unreachable!("commit_sync of a batch not unstaged"),
            })
            .collect();
        let res = self.log_with(&b.ops, &writes);
        self.prof.commits += 1;
        self.prof.committed_ops += b.ops.len() as u64;
        self.prof.commit_ns += t0.elapsed().as_nanos() as u64;
        match res {
            Ok(()) => {
                for op in b.ops {
                    if let Some(pool) = op.changed_pool() {
                        self.dirty.insert(pool);
                    }
                    if let Some(pool) = op.removing_pool() {
                        self.removed.insert(pool);
                    }
                    self.apply(op, self.wal.seq);
                }
                for tx in b.replies {
                    tx.send(Ok((Answer::Done, Gather::default())));
                }
                self.maybe_checkpoint();
            }
            Err(e) => self.fail_batch(b, e),
        }
    }

    /// Apply `op` of record `seq`; the blocks it frees wait to be settled.
    pub(super) fn apply(&mut self, op: WalOp, seq: u64) -> Released {
        let mut rel = Released::default();
        self.index.apply(op, &mut rel);
        if !rel.runs.is_empty() {
            self.flush.unsettled.push((seq, rel.runs.clone()));
        }
        rel
    }

    /// Log and apply one control change.
    pub(super) fn commit_ctl(&mut self, op: WalOp) -> Result<Released, StorageError> {
        self.log(std::slice::from_ref(&op))
            .map_err(|e| StorageError::io(e.msg, std::io::Error::from_raw_os_error(-e.code)))?;
        let rel = self.apply(op, self.wal.seq);
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
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let rec = self.wal_record(ops)?;
        if self.wal.tail + rec.len() as u64 > self.sb.wal_bytes {
            self.checkpoint().map_err(|e| {
                Errno::new(
                    -libc::ENOSPC,
                    format!("target {}: WAL full and checkpoint failed: {e}", self.id),
                )
            })?;
        }
        let off = self.sb.wal_offset(self.id) + self.wal.tail;
        let rec_bytes = rec.len() as u64;
        let rec = self.zero_to_block(rec);
        let mut writes = data.to_vec();
        writes.push((off, &rec));
        self.dev.write(&writes, true).map_err(|e| {
            Errno::new(
                -libc::EIO,
                format!("target {}: write data and WAL: {e}", self.id),
            )
        })?;
        self.wal.seq += 1;
        self.wal.seq_started = self.wal.seq;
        self.counters.wal_record();
        self.wal.tail += rec_bytes;
        self.note_stamps(self.wal.seq, ops);
        if ops.iter().any(|op| !matches!(op, WalOp::Flushed { .. })) {
            self.flush.last_real = self.wal.seq;
        }
        self.flushed(self.wal.seq);
        Ok(())
    }

    /// The WAL record holding `ops`, numbered after the last one started.
    fn wal_record(&self, ops: &[WalOp]) -> Result<Vec<u8>, Errno> {
        let payload = bincode::serialize(ops)
            .map_err(|e| Errno::new(-libc::EIO, format!("target {}: encode WAL: {e}", self.id)))?;
        let rec = wal::encode(
            WAL_MAGIC,
            self.sb.device_uuid,
            self.wal.seq_started + 1,
            self.wal.generation,
            &payload,
            self.wal.layout,
        );
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
        Ok(rec)
    }

    /// `rec`, to be written at the WAL's tail, followed by zeros to the end
    /// of the block it ends in (packed records only: the others fill their
    /// blocks). The place of the next record then reads as zeros until it
    /// is written, which replay takes as the plain end of the log, not as
    /// the middle of a record an earlier cycle of the WAL left there.
    fn zero_to_block(&self, mut rec: Vec<u8>) -> Vec<u8> {
        let end = self.wal.tail + rec.len() as u64;
        rec.resize(rec.len() + (wal::round_up(end) - end) as usize, 0);
        rec
    }
}
