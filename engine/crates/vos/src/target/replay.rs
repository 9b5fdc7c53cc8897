//! Replay: a target's index at open, from its newest checkpoint and the WAL
//! records after it; and the rule that tells a torn tail (dropped quietly)
//! from damage (refused loudly).
//!
//! Reading: the checkpoint headers first (one block each), then the newest
//! checkpoint whole; the WAL in reads of [`READ_CHUNK`] bytes (several
//! device reads in flight, through the ring), its records parsed from that
//! buffer; a record larger than the buffer is read whole.
//!
//! # Where the log ends, and when that end is damage
//!
//! The WAL holds the records after the checkpoint, batch `base + 1` on, one
//! after the other from offset 0 (each starting on a block, or, packed, on
//! a multiple of 64 bytes: see [`crate::wal`]). The chain of records
//! replayed ends at the first place that is not the next record: not a
//! record of this format, a bad header or payload CRC, a payload that does
//! not decode, the record of another batch, a record left over from an
//! earlier opening, or one running past the WAL. Call `h` the batch
//! expected there.
//!
//! Nothing before `h` is lost; whether `h` and what follows may be lost
//! quietly depends on whether they were flushed. Up to [`MAX_COMMITS`]
//! commits are in flight at once and their writes complete in any order,
//! and a power cut may lose any write since the last device flush, so
//! after a crash any record after the last flush may be missing while a
//! later one survived (holes in the tail). A flushed record may not be
//! missing. Replay knows what was flushed from the [`WalOp::Flushed`]
//! stamps: a record carrying `Flushed { through: d }` was written after
//! every record up to `d` had been flushed (the stamp is the `durable` of
//! the target when the record started; an idle target writes a stamp of
//! its own after a flush, so a stamp follows every flush soon).
//!
//! The rule: the end at `h` is **damage** when an intact record (header and
//! payload CRCs good, payload decodes) of batch `h` or later lies anywhere
//! in the rest of the WAL and carries a stamp `d >= h`: batch `h` was
//! flushed, so it was acknowledged and may not be gone. The target then
//! refuses to serve (every request fails with an error naming the target,
//! the WAL offset and what is wrong, and `storage scan` shows it) rather
//! than serve a state that silently lost acknowledged batches. Otherwise
//! `h` and everything after it were never flushed: a **torn tail**, dropped
//! quietly (a warning in the log), as the durability contract allows.
//!
//! The rest of the WAL is searched only when the end is not plainly the
//! end of the log: zeros (never written; a packed record is followed by
//! zeros to the end of its block) or an intact record
//! of an earlier cycle of the WAL (batch below `h`, before the last
//! checkpoint) or of an earlier format of the device is; anything else (a
//! damaged record, a record with a batch number above `h`, a leftover of
//! an earlier opening) makes replay look at every place after it, up to
//! the first intact record of an earlier cycle or format: the records of
//! this cycle lie one after the other from offset 0, so a place this
//! cycle wrote and flushed never reads as such a record, and a place it
//! did not write durably means nothing after it was flushed (a flush
//! covers every write before it). Records left over from an earlier opening never carry
//! a stamp at or past a hole of the current chain: their opening flushed
//! through their stamp, so every later opening replayed at least that far
//! (or refused).
//!
//! Checkpoints: the WAL restarts at offset 0 only after a new checkpoint
//! is written and flushed, so a torn newest checkpoint (a crash while it
//! was written) leaves the older one with its whole WAL, and replay falls
//! back to it. A WAL whose first record is a batch above `base + 1` was
//! restarted after a checkpoint that is now damaged or gone: the older
//! checkpoint's records were overwritten, and the target refuses to serve
//! rather than load the older state.
//!
//! Not detected: damage that makes a block read as zeros or as an intact
//! older record (only CRCs are checked, and an unwritten WAL block looks
//! like that); damage to records after the last stamp (they may be lost
//! by a power cut anyway).

use super::*;

/// Bytes of WAL read at a time.
const READ_CHUNK: usize = 4 << 20;

/// Why replay did not give an index.
pub(crate) enum ReplayError {
    /// The device could not be read (or flushed).
    Storage(StorageError),
    /// Acknowledged state is damaged: the target refuses to serve.
    Damaged(String),
}

impl From<StorageError> for ReplayError {
    fn from(e: StorageError) -> Self {
        ReplayError::Storage(e)
    }
}

/// A window over the WAL region, refilled in [`READ_CHUNK`] reads.
struct WalReader {
    /// Device offset of the WAL.
    base: u64,
    /// WAL bytes.
    end: u64,
    /// WAL offset of `buf[0]`.
    at: u64,
    buf: Vec<u8>,
}

impl WalReader {
    /// `len` bytes at WAL offset `off` (packed records start inside blocks;
    /// the device is read in whole blocks); the caller checked that
    /// `off + len <= end` (so a length read from the device is bounded
    /// before anything is allocated for it).
    fn get(&mut self, dev: &mut DeviceIo, off: u64, len: usize) -> std::io::Result<&[u8]> {
        let have = off >= self.at && off + len as u64 <= self.at + self.buf.len() as u64;
        if !have {
            let start = off / BLOCK * BLOCK;
            let want = (off + len as u64 - start)
                .max(READ_CHUNK as u64)
                .min(self.end - start);
            self.buf = dev.read(self.base + start, wal::round_up(want) as usize)?;
            self.at = start;
        }
        let s = (off - self.at) as usize;
        Ok(&self.buf[s..s + len])
    }
}

/// What stopped the chain of records.
enum End {
    /// Zeros, or a record of an earlier cycle of the WAL: the log ends here.
    Plain,
    /// Anything else: what is wrong with the block there.
    Bad(String),
}

/// A checkpoint slot that did not load.
struct BadSlot {
    slot: usize,
    seq: Option<u64>,
    why: String,
}

/// What replay applied to the index so far.
#[derive(Default)]
struct Replayed {
    /// Records applied (batches `base + 1 ..= base + applied`).
    applied: u64,
    /// The highest stamp of the records read.
    stamp: u64,
    /// The highest stamp of the records applied (all of them kept).
    kept_stamp: u64,
    /// The blocks each applied record after `kept_stamp` freed, by batch.
    freed: Vec<(u64, Vec<(u64, u64)>)>,
}

impl Replayed {
    /// Apply the next record, batch `base + applied + 1`.
    fn apply(&mut self, index: &mut TargetIndex, base: u64, ops: Vec<WalOp>) {
        self.applied += 1;
        self.kept_stamp = self.kept_stamp.max(stamp_of(&ops).unwrap_or(base));
        let mut rel = Released::default();
        for op in ops {
            index.apply(op, &mut rel);
        }
        if !rel.runs.is_empty() {
            self.freed.push((base + self.applied, rel.runs));
        }
        // A kept stamp covers the blocks its batches freed for good.
        if self.freed.first().is_some_and(|f| f.0 <= self.kept_stamp) {
            self.freed.retain(|f| f.0 > self.kept_stamp);
        }
    }
}

/// Whether `b` is the intact header of a WAL record of an earlier format
/// of the device (another device uuid): stale bytes, never written by
/// this format.
fn earlier_format(b: &[u8], dev: Uuid) -> bool {
    b.len() >= wal::HDR
        && &b[0..4] == WAL_MAGIC
        && Uuid::from_slice(&b[4..20])
            .is_ok_and(|u| u != dev && wal::decode_header(WAL_MAGIC, u, b).is_some())
}

/// A record's ops, if its payload holds and decodes.
fn ops_of(h: &wal::Header, rec: &[u8]) -> Result<Vec<WalOp>, String> {
    let p = wal::payload(h, rec).ok_or_else(|| {
        format!(
            "bad payload CRC in the record of batch {} ({} bytes)",
            h.seq, h.len
        )
    })?;
    bincode::deserialize::<Vec<WalOp>>(p)
        .map_err(|e| format!("undecodable record of batch {}: {e}", h.seq))
}

impl Target {
    /// Newest valid checkpoint, then every WAL record after it, in order;
    /// see the module's comment for where the log ends.
    pub(super) fn replay(&mut self) -> Result<(), ReplayError> {
        let t0 = Instant::now();
        let (base, bad_slots) = self.load_checkpoint()?;
        let ckpt_ms = t0.elapsed().as_millis() as u64;
        let wal_off = self.sb.wal_offset(self.id);
        let wal_bytes = self.sb.wal_bytes;
        let dev_uuid = self.sb.device_uuid;
        let mut rd = WalReader {
            base: wal_off,
            end: wal_bytes,
            at: 0,
            buf: Vec::new(),
        };
        let mut tail = 0u64;
        // The records read and not applied yet, with their WAL offsets. A
        // record the stamps read so far say was flushed is kept whatever
        // follows, so it is applied at once: replay holds decoded only the
        // records after the last flush, however many the WAL holds.
        let mut records: VecDeque<(u64, Vec<WalOp>)> = VecDeque::new();
        let mut replayed = Replayed {
            stamp: base,
            kept_stamp: base,
            ..Replayed::default()
        };
        let mut seq = base;
        // Generations of the records taken so far, in order. A record of an
        // earlier generation after a later one is a leftover of a crash: it
        // was in flight past the end a restart replayed to (never
        // acknowledged), and the restart's own records have since reached it.
        let mut gens: Vec<u64> = Vec::new();
        let end = loop {
            if tail + wal::HDR as u64 > wal_bytes {
                break End::Plain;
            }
            let blk = rd
                .get(&mut self.dev, tail, wal::HDR)
                .map_err(|e| self.io_err("read WAL", e))?;
            let Some(h) = wal::decode_header(WAL_MAGIC, dev_uuid, blk) else {
                break if blk.iter().all(|&b| b == 0) || earlier_format(blk, dev_uuid) {
                    End::Plain
                } else {
                    End::Bad(
                        "not a WAL record of this device (bad magic, device or header CRC)".into(),
                    )
                };
            };
            if h.seq != seq + 1 {
                break if h.seq <= seq {
                    End::Plain
                } else {
                    End::Bad(format!(
                        "the record of batch {} where batch {} was expected",
                        h.seq,
                        seq + 1
                    ))
                };
            }
            // No record longer than half the WAL is ever written
            // (`Target::wal_record`): a longer one is damage, and reading
            // it would allocate what the device says.
            if tail + h.record_bytes() > wal_bytes || h.record_bytes() > wal_bytes / 2 {
                break End::Bad(format!(
                    "the record of batch {} claims {} bytes: past the end of the WAL or longer than any record written",
                    h.seq, h.len
                ));
            }
            if gens.last() != Some(&h.gen) {
                if gens.contains(&h.gen) {
                    break End::Bad(format!(
                        "the record of batch {} is left over from an earlier opening",
                        h.seq
                    ));
                }
                gens.push(h.gen);
            }
            let rec = rd
                .get(&mut self.dev, tail, h.record_bytes() as usize)
                .map_err(|e| self.io_err("read WAL", e))?;
            match ops_of(&h, rec) {
                Ok(ops) => {
                    if let Some(d) = stamp_of(&ops) {
                        replayed.stamp = replayed.stamp.max(d);
                    }
                    records.push_back((tail, ops));
                }
                Err(why) => break End::Bad(why),
            }
            while base + replayed.applied < replayed.stamp {
                let Some((_, ops)) = records.pop_front() else {
                    break;
                };
                replayed.apply(&mut self.index, base, ops);
            }
            seq += 1;
            tail += h.record_bytes();
        };
        if let End::Bad(why) = &end {
            self.check_end(&mut rd, tail, seq + 1, why, base, &bad_slots)?;
        }
        let wal_ms = t0.elapsed().as_millis() as u64 - ckpt_ms;
        // A record after the last one a replayed record says was flushed
        // (or the checkpoint) may have outlived its data: a crash while its
        // writes were in flight, a power cut before the flush. Such records
        // (those not applied yet) were not flushed, nor was any after them:
        // drop from the first whose data is not all there on.
        for i in 0..records.len() {
            if !self.data_intact(&records[i].1)? {
                let dropped = records.len() - i;
                tracing::warn!(target = self.id, seq, dropped, "a WAL batch references data that never reached the device; dropping it and the later batches (none of them was flushed)");
                tail = records[i].0;
                seq -= dropped as u64;
                records.truncate(i);
                break;
            }
        }
        let n = replayed.applied as usize + records.len();
        for (_, ops) in records {
            replayed.apply(&mut self.index, base, ops);
        }
        // Only the stamps of the records kept survive to the next replay:
        // the blocks freed by every later record keep their bytes until a
        // flushed stamp covers it, as they would have had the engine run on
        // (that replay may check the data of those records again).
        let settled = replayed.kept_stamp;
        let mut unsettled = replayed.freed;
        unsettled.retain(|(rec_seq, _)| *rec_seq > settled);
        // What replay read may still be in the device's cache only (the
        // engine was killed, not the power cut): flush it before building on it.
        self.dev
            .sync()
            .map_err(|e| self.io_err("flush the replayed WAL", e))?;
        self.wal.seq = seq;
        self.wal.seq_started = seq;
        self.flush.durable = seq;
        self.flush.stamped = settled;
        self.flush.settled = settled;
        self.wal.tail = tail;
        let t_rebuild = Instant::now();
        self.index.recount();
        let freed = unsettled.iter().flat_map(|(_, runs)| runs);
        for &(b, n) in self.index.device_runs().iter().chain(freed) {
            if !self.alloc.reserve(b, n) {
                return Err(ReplayError::Storage(StorageError::Corrupt(format!(
                    "target {}: index references blocks {b}..{} twice or beyond the data region",
                    self.id,
                    b + n
                ))));
            }
        }
        self.flush.unsettled = unsettled;
        if let End::Bad(why) = end {
            tracing::warn!(target = self.id, wal_offset = tail, batch = seq + 1, why, "WAL ends at a torn record; nothing after it was flushed, dropping it (a torn tail)");
        }
        tracing::info!(
            target = self.id,
            records = n,
            seq = self.wal.seq,
            pools = self.index.pools.len(),
            checkpoint_ms = ckpt_ms,
            wal_ms,
            rebuild_ms = t_rebuild.elapsed().as_millis() as u64,
            total_ms = t0.elapsed().as_millis() as u64,
            "replayed"
        );
        Ok(())
    }

    /// Load the newest checkpoint that holds; its batch number (0: none)
    /// and the slots that did not load. Only headers are read for the
    /// choice: the older checkpoint is read only if the newer is damaged.
    fn load_checkpoint(&mut self) -> Result<(u64, Vec<BadSlot>), ReplayError> {
        let dev_uuid = self.sb.device_uuid;
        let mut bad = Vec::new();
        let mut cands: Vec<(usize, wal::Header)> = Vec::new();
        for slot in 0..2 {
            let off = self.sb.ckpt_offset(self.id, slot);
            let blk = self
                .dev
                .read(off, BLOCK as usize)
                .map_err(|e| self.io_err("read checkpoint", e))?;
            match wal::decode_header(CKPT_MAGIC, dev_uuid, &blk) {
                Some(h) if h.record_bytes() > self.sb.ckpt_bytes => bad.push(BadSlot {
                    slot,
                    seq: Some(h.seq),
                    why: format!(
                        "its length {} exceeds the slot ({} bytes)",
                        h.len, self.sb.ckpt_bytes
                    ),
                }),
                Some(h) => cands.push((slot, h)),
                None if &blk[0..4] == CKPT_MAGIC => bad.push(BadSlot {
                    slot,
                    seq: None,
                    why: "bad header (CRC or device)".into(),
                }),
                None => {}
            }
        }
        cands.sort_by_key(|c| std::cmp::Reverse(c.1.seq));
        for (slot, h) in cands {
            let off = self.sb.ckpt_offset(self.id, slot);
            let t = Instant::now();
            let rec = self
                .dev
                .read(off, h.record_bytes() as usize)
                .map_err(|e| self.io_err("read checkpoint", e))?;
            let read_ms = t.elapsed().as_millis() as u64;
            let ix = match wal::payload(&h, &rec) {
                None => Err("bad payload CRC"),
                Some(p) => TargetIndex::decode(p).ok_or("undecodable index"),
            };
            tracing::info!(
                target = self.id,
                slot,
                bytes = h.len,
                read_ms,
                decode_ms = t.elapsed().as_millis() as u64 - read_ms,
                "checkpoint read"
            );
            match ix {
                Ok(ix) => {
                    self.wal.seq = h.seq;
                    self.wal.ckpt_bytes = h.record_bytes();
                    self.index = ix;
                    self.wal.next_ckpt = slot ^ 1;
                    for b in &bad {
                        tracing::warn!(target = self.id, slot = b.slot, seq = b.seq, why = %b.why, loaded = h.seq, "checkpoint slot damaged; loaded the other (the next checkpoint rewrites the damaged slot)");
                    }
                    return Ok((h.seq, bad));
                }
                Err(why) => bad.push(BadSlot {
                    slot,
                    seq: Some(h.seq),
                    why: why.into(),
                }),
            }
        }
        for b in &bad {
            tracing::warn!(target = self.id, slot = b.slot, seq = b.seq, why = %b.why, "checkpoint slot damaged; none loaded");
        }
        Ok((0, bad))
    }

    /// The chain ended at WAL offset `at`, where batch `h` was expected,
    /// on a bad block (`why`): damage, or a torn tail? See the module's
    /// comment.
    fn check_end(
        &mut self,
        rd: &mut WalReader,
        at: u64,
        h: u64,
        why: &str,
        base: u64,
        bad_slots: &[BadSlot],
    ) -> Result<(), ReplayError> {
        let (dev_uuid, wal_bytes, id) = (self.sb.device_uuid, self.sb.wal_bytes, self.id);
        let slots = || {
            bad_slots
                .iter()
                .map(|b| match b.seq {
                    Some(s) => format!("slot {} (batch {s}): {}", b.slot, b.why),
                    None => format!("slot {}: {}", b.slot, b.why),
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        // Records start at multiples of `wal::PACK` (blocks are too).
        let mut off = at;
        while off + wal::HDR as u64 <= wal_bytes {
            let blk = rd
                .get(&mut self.dev, off, wal::HDR)
                .map_err(|e| self.io_err("read WAL", e))?;
            let hdr = wal::decode_header(WAL_MAGIC, dev_uuid, blk);
            if hdr.is_some_and(|x| x.seq < h) || earlier_format(blk, dev_uuid) {
                // See the module's comment: nothing after this was flushed.
                return Ok(());
            }
            let h2 = hdr.filter(|x| {
                x.seq >= h
                    && off + x.record_bytes() <= wal_bytes
                    && x.record_bytes() <= wal_bytes / 2
            });
            let Some(h2) = h2 else {
                off += wal::PACK;
                continue;
            };
            let rec = rd
                .get(&mut self.dev, off, h2.record_bytes() as usize)
                .map_err(|e| self.io_err("read WAL", e))?;
            let Ok(ops) = ops_of(&h2, rec) else {
                off += wal::PACK;
                continue;
            };
            if off == 0 && h2.seq > h {
                // The WAL restarted after a checkpoint past `base`.
                let lost = if bad_slots.is_empty() {
                    "no checkpoint slot holds it".to_string()
                } else {
                    slots()
                };
                return Err(ReplayError::Damaged(format!(
                    "target {id}: checkpoint damaged: the WAL starts at batch {} (offset 0 of the WAL, device offset {}), so a checkpoint of batch {} or later was written, but {lost}; the checkpoint left holds batch {base} only, and the batches after it were overwritten. Refusing to serve this target",
                    h2.seq,
                    rd.base,
                    h2.seq - 1
                )));
            }
            if let Some(d) = stamp_of(&ops).filter(|&d| d >= h) {
                return Err(ReplayError::Damaged(format!(
                    "target {id}: WAL damaged at offset {at} (device offset {}): {why}; batch {h} is missing there, but the intact record of batch {} at WAL offset {off} says every batch through {d} was flushed (acknowledged). Refusing to serve this target rather than lose them",
                    rd.base + at,
                    h2.seq
                )));
            }
            off += h2.record_bytes();
        }
        Ok(())
    }

    /// Whether the data blocks of every value `ops` write hold what the
    /// record says (their checksums).
    fn data_intact(&mut self, ops: &[WalOp]) -> Result<bool, StorageError> {
        for op in ops {
            for v in op.update_values() {
                if let Payload::Device(ext) = &v.payload {
                    // A length from the device: bounded by the data region
                    // before anything is allocated for it.
                    let fits = ext
                        .block
                        .checked_mul(BLOCK)
                        .and_then(|o| o.checked_add(v.len))
                        .is_some_and(|e| e <= self.sb.data_bytes);
                    if !fits {
                        return Ok(false);
                    }
                    let bytes = self
                        .dev
                        .read(self.data_off(ext.block), v.len as usize)
                        .map_err(|e| self.io_err("verify last WAL batch", e))?;
                    let ok = bytes
                        .chunks(self.chunk as usize)
                        .zip(ext.csums())
                        .all(|(c, &crc)| peregrine_isal::crc32c(c) == crc);
                    if !ok {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }
}
