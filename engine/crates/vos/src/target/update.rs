//! Update and punch preparation: validation, conditions, transactions'
//! admission, space and quota checks, and large values given fresh blocks
//! and copied (checksummed on the copy) into the regions their writes
//! start from, each piece written ahead of the batch's commit.

use super::*;
use crate::request::{Condition, Expect, Iod, IodKind, PunchReq, UpdateReq};

/// Data blocks an update's values take at most (were they all large).
pub(super) fn blocks_wanted(u: &UpdateReq) -> u64 {
    u.iods.iter().map(|i| wal::round_up(i.len) / BLOCK).sum()
}

/// What an update being prepared has taken so far (given back if it fails).
#[derive(Default)]
pub(super) struct Staging {
    pub(super) writes: Vec<(u64, Staged)>,
    pub(super) runs: Vec<(u64, u64)>,
    pub(super) bytes: usize,
}

/// Copy `dst.len()` bytes at `off` of `bulk` into `dst` and checksum them
/// on the copy, a cache-sized step at a time (the sums read what the copy
/// just wrote): one CRC32C per `chunk` appended to `csums`, and, if asked
/// for, the running CRC32C of the value in `crc` (combined from the
/// chunks' CRCs, not a second pass).
pub(super) fn copy_and_sum(
    bulk: &Bulk,
    off: usize,
    dst: &mut [u8],
    chunk: usize,
    csums: &mut Vec<u32>,
    mut crc: Option<&mut u32>,
) -> std::io::Result<()> {
    let step = (64usize << 10).div_ceil(chunk) * chunk;
    let whole = Crc32cShift::new(chunk);
    for (k, d) in dst.chunks_mut(step).enumerate() {
        bulk.copy_out(off + k * step, d)?;
        for c in d.chunks(chunk) {
            let sum = peregrine_isal::crc32c(c);
            csums.push(sum);
            if let Some(crc) = crc.as_deref_mut() {
                let shift = if c.len() == chunk {
                    whole
                } else {
                    Crc32cShift::new(c.len())
                };
                *crc = shift.combine(*crc, sum);
            }
        }
    }
    Ok(())
}

impl Target {
    /// What a container with a quota holds by this engine's count: this
    /// target's own figure, the other targets' shares and what the service
    /// last measured on the other engines; `None` without a quota.
    fn quota_used(&self, pool: &Uuid, cont: &Uuid) -> Option<(&ContQuota, u64, u64)> {
        let q = self.quota.limits.get(&(*pool, *cont))?;
        let here = self
            .index
            .cont(pool, cont)
            .map_or(0, |c| c.scm_used + c.nvme_used);
        let me = self.id as usize;
        let local: u64 = q
            .share
            .held
            .iter()
            .enumerate()
            .map(|(t, h)| {
                if t == me {
                    here
                } else {
                    h.load(Ordering::Relaxed)
                }
            })
            .sum();
        Some((q, here, q.elsewhere.saturating_add(local)))
    }

    /// Whether `need` more stored bytes would take the container past its quota.
    pub(super) fn over_quota(&self, pool: &Uuid, cont: &Uuid, need: u64) -> bool {
        self.quota_used(pool, cont)
            .is_some_and(|(q, _, used)| used.saturating_add(need) > q.limit)
    }

    /// Refuse an update of `need` bytes that would take the container past
    /// its quota ([`ContQuota`]).
    pub(super) fn check_quota(&self, pool: &Uuid, cont: &Uuid, need: u64) -> Result<(), Errno> {
        let Some((q, here, used)) = self.quota_used(pool, cont) else {
            return Ok(());
        };
        if used.saturating_add(need) > q.limit {
            return Err(Errno::new(
                -libc::EDQUOT,
                format!(
                    "update: container {cont}: quota of {} stored bytes reached ({used} used, {need} more asked on target {}); nothing stored",
                    q.limit, self.id
                ),
            ));
        }
        if let Some(slot) = q.share.held.get(self.id as usize) {
            slot.store(here + need, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The tier of `pool` an update needing `scm_need` and `nvme_need`
    /// bytes does not fit in, as the error to answer.
    fn no_room(&self, pool: &Uuid, scm_need: u64, nvme_need: u64) -> Option<StorageError> {
        let p = &self.index.pools[pool];
        let (os, on) = self
            .commit
            .open
            .space
            .get(pool)
            .copied()
            .unwrap_or_default();
        let (cs, cn) = self.commit.claimed.get(pool).copied().unwrap_or_default();
        // Changes held by transactions take their space until decided.
        let (hs, hn) = self.index.dtx.held_space(pool);
        let (bs, bn) = (os + cs + hs, on + cn + hn);
        [
            ("scm", scm_need, p.scm_total, p.scm_used() + bs),
            ("nvme", nvme_need, p.nvme_total, p.nvme_used() + bn),
        ]
        .into_iter()
        .find_map(|(tier, need, total, used)| {
            let free = total.saturating_sub(used);
            (need > free).then(|| StorageError::NoSpace {
                pool: pool.to_string(),
                tier,
                target: self.id,
                need,
                free,
            })
        })
    }

    /// Validate and stage an update into the open batch; a transaction's
    /// update as a [`WalOp::Prepare`], unless there is nothing to store.
    pub(super) fn prepare_update(&mut self, mut u: UpdateReq, bulk: Bulk) -> Result<Admit, Errno> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let (pool, cont, obj) = self.addr(&u.addr, "update")?;
        if u.dkey.is_empty() {
            return Err(Errno::inval("update: empty dkey"));
        }
        if u.epoch == peregrine_proto::EPOCH_LATEST {
            return Err(Errno::inval(
                "update: epoch u64::MAX is reserved for reads of the latest version",
            ));
        }
        let tx = dtx::parse(u.dtx.take(), "update")?;
        if let Some((id, _)) = &tx {
            let key = OpKey {
                pool: &pool,
                cont: &cont,
                obj: &obj,
                dkey: &u.dkey,
                epoch: u.epoch,
                punch: false,
            };
            let admit = dtx::admit(&self.index, self.in_flight(), *id, &key, "update")?;
            if admit != Admit::Stage {
                return Ok(admit);
            }
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
            let kind = iod.kind.value_kind();
            let range = pos..pos + iod.len as usize;
            pos = range.end;
            if iod.kind.offset().checked_add(iod.len).is_none() {
                return Err(Errno::inval(format!(
                    "update: akey {:?}: extent overflows",
                    show(&iod.akey)
                )));
            }
            let large = range.len() >= self.scm_value_max;
            scm_need += value_scm(
                &u.dkey,
                &iod.akey,
                if large { 0 } else { range.len() as u64 },
            );
            if large {
                nvme_need += wal::round_up(range.len() as u64);
            }
            parsed.push((iod, kind, range, large));
        }
        // Only conditional updates pay for this (not a name per update).
        if u.insert_only || !u.conditions.is_empty() {
            let own = tx.as_ref().map(|t| t.0);
            let at = (&pool, &cont, &obj, u.dkey.as_slice());
            let absent: Vec<Condition> = if u.insert_only {
                u.iods
                    .iter()
                    .map(|iod| Condition {
                        akey: iod.akey.clone(),
                        expect: Expect::Absent,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let req = format!("update on target {} shard {}", self.id, obj.shard);
            for conds in [&absent, &u.conditions] {
                condition::check(&self.index, self.in_flight(), own, at, conds, &req)?;
            }
        }
        let checked_unchanged = |i: &&Iod| {
            matches!(
                i.kind,
                IodKind::Array {
                    unchanged_since: Some(_),
                    ..
                }
            )
        };
        for iod in u.iods.iter().filter(checked_unchanged) {
            let at = (&pool, &cont, &obj, u.dkey.as_slice());
            let own = tx.as_ref().map(|t| t.0);
            dtx::check_unchanged(&self.index, self.in_flight(), own, at, iod)?;
        }
        if self.no_room(&pool, scm_need, nvme_need).is_some() {
            // Removed files' space comes back now, not when the target is
            // next idle. Nothing of this update is staged yet, and
            // aggregation changes no value a read sees.
            self.aggregate_for_room(pool, "tier full");
            if let Some(e) = self.no_room(&pool, scm_need, nvme_need) {
                return Err(e.into());
            }
        }
        if let Err(e) = self.check_quota(&pool, &cont, scm_need + nvme_need) {
            // As for a full tier (above).
            if !self.aggregate_for_room(pool, "quota reached") {
                return Err(e);
            }
            self.check_quota(&pool, &cont, scm_need + nvme_need)?;
        }
        // Copy each value once, to where it is stored, and check the
        // client's checksum on that copy: the bytes stored are the bytes checked.
        let mut staging = Staging::default();
        let mut values = Vec::with_capacity(parsed.len());
        for (iod, kind, range, large) in parsed {
            let what = || format!("update: dkey {dk:?} akey {:?}", show(&iod.akey));
            let stored = if large {
                self.stage_value(&pool, &bulk, range, iod.crc.is_some(), &mut staging)
                    .and_then(|(block, nblocks, csums, crc)| {
                        // A run of 1 to 16 Ki blocks (values are 1 byte to MAX_IO_BYTES).
                        let run = DevRun::new(block, nblocks, csums).ok_or_else(|| {
                            Errno::inval(format!("{}: a value of {nblocks} blocks", what()))
                        })?;
                        Ok((Payload::Device(run), crc))
                    })
            } else {
                bulk.to_vec(range.start, range.len())
                    .map_err(|e| Errno::inval(format!("{}: bulk: {e}", what())))
                    .map(|v| {
                        let crc = if iod.crc.is_some() {
                            peregrine_isal::crc32c(&v)
                        } else {
                            0
                        };
                        (Payload::Inline(v.into_boxed_slice()), crc)
                    })
            };
            let checked = stored.and_then(|(payload, got)| {
                match iod.crc {
                    Some(sent) if sent != got => return Err(Errno::new(
                        -peregrine_proto::CSUM_ERRNO,
                        format!(
                            "{}: checksum mismatch (client sent {sent:#010x}, received data has {got:#010x}); nothing stored",
                            what(),
                        ),
                    )),
                    _ => {}
                }
                Ok(payload)
            });
            let payload = match checked {
                Ok(p) => p,
                Err(e) => {
                    self.undo(staging);
                    return Err(e);
                }
            };
            values.push(NewValue {
                akey: iod.akey.clone(),
                kind,
                offset: iod.kind.offset(),
                len: iod.len,
                crc: iod.crc,
                payload,
            });
        }
        let batch = &mut self.commit.open;
        batch.data += staging.bytes;
        batch.writes.extend(staging.writes);
        batch.runs.extend(staging.runs);
        let s = batch.space.entry(pool).or_default();
        s.0 += scm_need;
        s.1 += nvme_need;
        let op = WalOp::Update {
            pool,
            cont,
            obj,
            dkey: u.dkey,
            epoch: u.epoch,
            values,
        };
        batch.ops.push(match tx {
            None => op,
            Some((id, shards)) => WalOp::Prepare {
                id,
                shards,
                at_ms: dtx::now_ms(),
                op: Box::new(op),
            },
        });
        Ok(Admit::Stage)
    }

    /// Give a large value fresh data blocks and copy its bytes (`range` of
    /// `bulk`) into the registered buffers its writes start from, a buffer
    /// at a time (into memory of their own when no region is free),
    /// checksumming each chunk on the copy. Returns the blocks, the chunk
    /// checksums and (`with_crc`) the CRC32C of the whole value.
    fn stage_value(
        &mut self,
        pool: &Uuid,
        bulk: &Bulk,
        range: std::ops::Range<usize>,
        with_crc: bool,
        staging: &mut Staging,
    ) -> Result<(u64, u64, Vec<u32>, u32), Errno> {
        let n = wal::round_up(range.len() as u64) / BLOCK;
        let Some(block) = self.alloc.alloc(n) else {
            return Err(Errno::new(
                -libc::ENOSPC,
                format!(
                    "update: pool {pool}: target {} data region has no free run of {n} blocks ({} blocks free)",
                    self.id,
                    self.alloc.free_blocks()
                ),
            ));
        };
        staging.runs.push((block, n));
        staging.bytes += range.len();
        let chunk = self.chunk as usize;
        let mut csums = Vec::with_capacity(range.len().div_ceil(chunk));
        let mut crc = 0u32;
        let dev_off = self.sb.data_offset(self.id) + block * BLOCK;
        for (k, start) in range.clone().step_by(BUF_BYTES).enumerate() {
            let len = BUF_BYTES.min(range.end - start);
            // A batch stages at most BATCH_DATA: the rest of the buffers
            // stays for the commit in flight and for reads.
            let room = staged_bytes(&self.commit.open.writes)
                + staged_bytes(&staging.writes)
                + self.commit.ahead.values().map(|w| w.len).sum::<usize>()
                < BATCH_DATA;
            let at = dev_off + (k * BUF_BYTES) as u64;
            let bulk_err = |e| Errno::inval(format!("update: bulk {start}+{len}: {e}"));
            let Some((buf, off, padded)) = room.then(|| self.dev.region(len)).flatten() else {
                let mut v = vec![0u8; len];
                let r = copy_and_sum(
                    bulk,
                    start,
                    &mut v,
                    chunk,
                    &mut csums,
                    with_crc.then_some(&mut crc),
                );
                staging.writes.push((at, Staged::Bytes(v)));
                r.map_err(bulk_err)?;
                continue;
            };
            self.dev.bytes_mut(buf, off, padded)[len..].fill(0);
            // Piece by piece: the device writes one piece while the next is
            // copied. Once one cannot start, the rest goes with the commit.
            let (mut copied, mut sent) = (0, 0);
            let mut res = Ok(());
            let whole_chunks = WRITE_PIECE.div_ceil(chunk) * chunk;
            while copied < padded && res.is_ok() {
                let piece = whole_chunks.min(padded - copied);
                let d =
                    self.dev
                        .bytes_mut(buf, off + copied, piece.min(len.saturating_sub(copied)));
                res = copy_and_sum(
                    bulk,
                    start + copied,
                    d,
                    chunk,
                    &mut csums,
                    with_crc.then_some(&mut crc),
                );
                copied += piece;
                if res.is_ok()
                    && sent + piece == copied
                    && self.write_ahead(at + sent as u64, (buf, off + sent, piece))
                {
                    sent = copied;
                }
            }
            if sent == padded {
                // The writes started ahead hold the region now.
                self.dev.release(buf);
            } else {
                staging.writes.push((
                    at + sent as u64,
                    Staged::Region(buf, off + sent, padded - sent),
                ));
            }
            res.map_err(bulk_err)?;
        }
        Ok((block, n, csums, crc))
    }

    /// Give back what a failed update took: its blocks once no write of it
    /// started ahead can still land on them (once the open batch has none).
    fn undo(&mut self, staging: Staging) {
        self.free_after_writes(self.commit.open.id, staging.runs);
        release_staged(&mut self.dev, staging.writes);
    }

    /// Start writing a region (a piece of a value being staged) to its
    /// fresh blocks now, ahead of the open batch's commit, which then only
    /// has to log the batch and fdatasync once these writes are done: the
    /// device writes while the target copies the next piece in. False if it
    /// cannot start now (a checkpoint is due, the ring refused it): then the
    /// commit writes it. The write holds the region's buffer until it is done.
    fn write_ahead(&mut self, off: u64, (buf, boff, len): (usize, usize, usize)) -> bool {
        let tag = self.next_tag;
        if self.wal.ckpt_due
            || self
                .dev
                .start(tag, &[Op::write(off, (buf, boff, len))])
                .is_err()
        {
            return false;
        }
        self.dev.share(buf);
        self.next_tag += 1;
        self.commit.ahead.insert(
            tag,
            AheadWrite {
                batch: self.commit.open.id,
                buf,
                len,
            },
        );
        // Under way while the next piece is copied in.
        self.submit();
        true
    }

    /// Validate a punch and gather it into the open batch; a transaction's
    /// punch as a [`WalOp::Prepare`], unless there is nothing to store.
    pub(super) fn prepare_punch(&mut self, mut p: PunchReq) -> Result<Admit, Errno> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let (pool, cont, obj) = self.addr(&p.addr, "punch")?;
        if p.dkey.is_empty() && !p.akeys.is_empty() {
            return Err(Errno::inval("punch: akeys given without a dkey"));
        }
        if !p.more.is_empty() {
            return self.prepare_discard(pool, cont, obj, p);
        }
        let tx = dtx::parse(p.dtx.take(), "punch")?;
        if let Some((id, _)) = &tx {
            let key = OpKey {
                pool: &pool,
                cont: &cont,
                obj: &obj,
                dkey: &p.dkey,
                epoch: p.epoch,
                punch: true,
            };
            let admit = dtx::admit(&self.index, self.in_flight(), *id, &key, "punch")?;
            if admit != Admit::Stage {
                return Ok(admit);
            }
        }
        if !p.conditions.is_empty() {
            if p.dkey.is_empty() {
                return Err(Errno::inval("punch: conditions given without a dkey"));
            }
            let own = tx.as_ref().map(|t| t.0);
            let at = (&pool, &cont, &obj, p.dkey.as_slice());
            let req = format!("punch on target {} shard {}", self.id, obj.shard);
            condition::check(&self.index, self.in_flight(), own, at, &p.conditions, &req)?;
        }
        let op = WalOp::Punch {
            pool,
            cont,
            obj,
            dkey: p.dkey,
            akeys: p.akeys,
            epoch: p.epoch,
        };
        self.commit.open.ops.push(match tx {
            None => op,
            Some((id, shards)) => WalOp::Prepare {
                id,
                shards,
                at_ms: dtx::now_ms(),
                op: Box::new(op),
            },
        });
        Ok(Admit::Stage)
    }

    /// A discard: the whole-object punches of `obj` and of `p.more`, all in
    /// the open batch (the engine checked their shape and number).
    fn prepare_discard(
        &mut self,
        pool: Uuid,
        cont: Uuid,
        obj: ObjKey,
        p: PunchReq,
    ) -> Result<Admit, Errno> {
        if !p.dkey.is_empty() || p.dtx.is_some() || !p.conditions.is_empty() {
            return Err(Errno::inval(
                "discard: more objects only in a whole-object punch without a transaction or conditions",
            ));
        }
        let more = p.more.iter().map(|s| ObjKey {
            hi: s.oid.hi,
            lo: s.oid.lo,
            shard: s.shard,
        });
        for obj in std::iter::once(obj).chain(more) {
            self.commit.open.ops.push(WalOp::Punch {
                pool,
                cont,
                obj,
                dkey: Vec::new(),
                akeys: Vec::new(),
                epoch: p.epoch,
            });
        }
        Ok(Admit::Stage)
    }
}
