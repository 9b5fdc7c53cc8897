//! Reads of erasure-coded objects: whole cells from the data shards,
//! stripes reconstructed from parity when a data shard cannot be read, and
//! the stripe locks of this process's partial-stripe writes (see the
//! layout rules in the `object` module).

use crate::error::{fmt_key, Error, Result};
use crate::object::{combine, par_map, size_akey, Object, STRIPE_LOCKS};
use crate::placement::{self, Group, PoolMap, ShardLoc};
use crate::sync::Mutex;
use peregrine_proto::data::{Iod, ValueKind};
use peregrine_proto::oclass::EC_CELL_SIZE;
use peregrine_proto::{ObjectId, EPOCH_LATEST};
use std::collections::BTreeSet;
use std::sync::OnceLock;

impl Object {
    // ---- erasure coding ----

    /// Serialize this process's writes to the same stripes: a degraded
    /// partial-stripe write is read-merge-write, and two of them
    /// interleaving would lose one's bytes (also a full-stripe write racing
    /// a merge); a non-degraded partial write's parity (fresh read, then
    /// write) must not be overtaken by another's. Striped locks
    /// by hash of (container, object, dkey, akey, stripe), taken in index
    /// order so batches cannot deadlock. Writers in other processes are not
    /// covered (documented limitation, as the engine does not arbitrate).
    pub(crate) fn lock_stripes(
        &self,
        dkey: &[u8],
        akey: &[u8],
        s0: u64,
        s1: u64,
    ) -> Vec<crate::sync::MutexGuard<'static, ()>> {
        static LOCKS: OnceLock<Vec<Mutex<()>>> = OnceLock::new();
        let locks = LOCKS.get_or_init(|| (0..STRIPE_LOCKS).map(|_| Mutex::new(())).collect());
        let base = placement::mix64(
            placement::hash_dkey(self.oid, dkey)
                ^ placement::hash_dkey(
                    ObjectId {
                        hi: self.cont.uuid().as_u64_pair().0,
                        lo: self.cont.uuid().as_u64_pair().1,
                    },
                    akey,
                ),
        );
        let mut idx: Vec<usize> = (s0..s1)
            .map(|s| (placement::mix64(base ^ s) % STRIPE_LOCKS as u64) as usize)
            .collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| locks[i].lock()).collect()
    }

    /// The `k` data cells of stripe `s`, reconstructed from parity when data
    /// shards fail. Shards listed in `bad` (group indexes) are not asked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ec_read_stripe(
        &self,
        map: &PoolMap,
        g: &Group,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        s: u64,
        bad: &[usize],
    ) -> Result<Vec<Vec<u8>>> {
        let (k, p) = self.kp();
        let cell = EC_CELL_SIZE as usize;
        let mut cells: Vec<Option<Vec<u8>>> = vec![None; k + p];
        let mut errs = Vec::new();
        let mut fetch = |idx: Vec<usize>, cells: &mut Vec<Option<Vec<u8>>>| {
            let res = par_map(&idx, |&i| {
                self.fetch_extent(map, &g.shards[i], epoch, dkey, akey, s * cell as u64, cell)
            });
            for (i, r) in idx.into_iter().zip(res) {
                match r {
                    Ok(d) => cells[i] = Some(d),
                    Err(e) => errs.push(e),
                }
            }
        };
        fetch((0..k).filter(|i| !bad.contains(i)).collect(), &mut cells);
        if cells[..k].iter().all(|c| c.is_some()) {
            return Ok(cells.into_iter().take(k).map(|c| c.unwrap()).collect());
        }
        fetch(
            (k..k + p).filter(|i| !bad.contains(i)).collect(),
            &mut cells,
        );
        let present = cells.iter().filter(|c| c.is_some()).count();
        if present < k {
            let what = format!(
                "{}: stripe {s} of akey {}: {present} of {} cells readable, need {k}",
                self.what(dkey),
                fmt_key(akey),
                k + p
            );
            return Err(combine(&what, errs));
        }
        self.rs
            .as_ref()
            .unwrap()
            .reconstruct(&mut cells)
            .map_err(|e| Error::io(format!("{}: {e}", self.what(dkey))))?;
        Ok(cells.into_iter().take(k).map(|c| c.unwrap()).collect())
    }

    /// Read `buf.len()` bytes at `start` (at most [`EC_BATCH_STRIPES`] stripes).
    ///
    /// Several cells come from several requests; no transaction may land
    /// between them. Every EC write and punch of an akey reaches all its
    /// shards (its size akey at least), so the newest change of the size
    /// akey that each data shard reports with its cells names the last
    /// write it applied: all the same, the cells are of one state. Otherwise
    /// (a write landed, a shard failed, or aggregation dropped an old punch
    /// on one shard and not yet on another) the read goes the slower way,
    /// fenced by the stripes' parity version.
    pub(crate) fn ec_fetch_piece(
        &self,
        map: &PoolMap,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        start: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let (k, _) = self.kp();
        let g = self.group(map, dkey)?;
        let segs = cell_segs(k, start, buf.len());
        // One contiguous extent per data shard: its cells in consecutive
        // stripes are adjacent in shard space.
        let jobs: Vec<usize> = (0..k).filter(|&j| !segs[j].is_empty()).collect();
        if jobs.len() < 2 || epoch != EPOCH_LATEST {
            return self.ec_fetch_piece_fenced(map, &g, epoch, dkey, akey, &segs, buf);
        }
        let size = size_akey(akey);
        let res = par_map(&jobs, |&j| -> Result<(Vec<u8>, u64)> {
            let first = segs[j][0].shard_off;
            let len: u64 = segs[j].iter().map(|s| s.len as u64).sum();
            let array = |akey: &[u8], offset, len| Iod {
                akey: akey.to_vec(),
                kind: ValueKind::Array as i32,
                offset,
                len,
                ..Default::default()
            };
            // The size akey with no bytes: its newest change (see above).
            let iods = vec![array(akey, first, len), array(&size, 0, 0)];
            let mut v = self.fetch_shard(map, &g.shards[j], epoch, dkey, iods)?;
            let version = v[1].epoch;
            let mut d = match v.swap_remove(0) {
                f if f.status == 0 => f.data,
                f if f.status == -libc::ENOENT => Vec::new(),
                f => return Err(self.value_error(map, &g.shards[j], akey, f.status)),
            };
            d.resize(len as usize, 0);
            Ok((d, version))
        });
        let got: Option<Vec<(Vec<u8>, u64)>> = res.into_iter().map(|r| r.ok()).collect();
        match got {
            Some(cells) if cells.windows(2).all(|w| w[0].1 == w[1].1) => {
                for (&j, (d, _)) in jobs.iter().zip(&cells) {
                    let first = segs[j][0].shard_off;
                    for sg in &segs[j] {
                        let from = (sg.shard_off - first) as usize;
                        buf[sg.dst..sg.dst + sg.len].copy_from_slice(&d[from..from + sg.len]);
                    }
                }
                Ok(())
            }
            _ => self.ec_fetch_piece_fenced(map, &g, epoch, dkey, akey, &segs, buf),
        }
    }

    /// [`Object::ec_fetch_piece`] the slower way: fenced by the stripes'
    /// parity versions, reconstructing the cells of failed data shards.
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::too_many_arguments)]
    fn ec_fetch_piece_fenced(
        &self,
        map: &PoolMap,
        g: &Group,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        segs: &[Vec<CellSeg>],
        buf: &mut [u8],
    ) -> Result<()> {
        let (k, _) = self.kp();
        let cell = EC_CELL_SIZE;
        // One contiguous extent per data shard: its cells in consecutive
        // stripes are adjacent in shard space.
        let jobs: Vec<usize> = (0..k).filter(|&j| !segs[j].is_empty()).collect();
        let touched: BTreeSet<u64> = segs.iter().flatten().map(|s| s.stripe).collect();
        let touched: Vec<u64> = touched.into_iter().collect();
        // A read of several cells is made of several requests: fenced by
        // the stripes' versions (see `ec_write`), read before and after it,
        // it saw no transaction land between them.
        let fence_at = (epoch == EPOCH_LATEST).then(|| {
            g.shards[k..]
                .iter()
                .copied()
                .find(|l| map.targets[l.target].readable)
        });
        let fence = |parts: usize| -> Result<Option<(ShardLoc, Vec<u64>)>> {
            let Some(Some(loc)) = fence_at.filter(|_| parts > 1) else {
                return Ok(None);
            };
            match self.stripe_versions(map, &loc, dkey, akey, &touched) {
                Ok(v) => Ok(Some((loc, v))),
                Err(e) if e.code == -libc::EINPROGRESS || e.code == -libc::ESTALE => Err(e),
                // Parity out of reach: the read goes on unfenced.
                Err(_) => Ok(None),
            }
        };
        let mut before = fence(jobs.len())?;
        let res = par_map(&jobs, |&j| {
            let first = segs[j][0].shard_off;
            let len: usize = segs[j].iter().map(|s| s.len).sum();
            self.fetch_extent(map, &g.shards[j], epoch, dkey, akey, first, len)
        });
        let mut bad = Vec::new();
        let mut errs = Vec::new();
        for (j, r) in jobs.into_iter().zip(res) {
            match r {
                Ok(d) => {
                    let first = segs[j][0].shard_off;
                    for s in &segs[j] {
                        let from = (s.shard_off - first) as usize;
                        buf[s.dst..s.dst + s.len].copy_from_slice(&d[from..from + s.len]);
                    }
                }
                Err(e) if e.code == -libc::ESTALE => return Err(e),
                Err(e) => {
                    bad.push(j);
                    errs.push(e);
                }
            }
        }
        if !bad.is_empty() {
            if before.is_none() {
                before = fence(2)?;
            }
            self.ec_rebuild_piece(
                map,
                g,
                epoch,
                dkey,
                akey,
                &bad,
                errs,
                |j, s, cells| {
                    for sg in segs[j].iter().filter(|sg| sg.stripe == s) {
                        let from = (sg.shard_off - s * cell) as usize;
                        buf[sg.dst..sg.dst + sg.len].copy_from_slice(&cells[from..from + sg.len]);
                    }
                },
                |j| segs[j].iter().map(|s| s.stripe).collect(),
            )?;
        }
        if let Some((loc, v)) = before {
            let after = match self.stripe_versions(map, &loc, dkey, akey, &touched) {
                Err(e) if e.code == -libc::EINPROGRESS || e.code == -libc::ESTALE => return Err(e),
                // Parity gone since (its engine died): as unfenced.
                Err(_) => v.clone(),
                Ok(a) => a,
            };
            if after != v {
                return Err(Error::new(
                    -libc::EINPROGRESS,
                    format!(
                        "{}: akey {}: stripes {touched:?} changed during the read",
                        self.what(dkey),
                        fmt_key(akey)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Degraded read: rebuild the failed shards' (`bad`) part of each stripe
    /// they cover (`stripes_of`), handing each rebuilt cell to `put`.
    #[allow(clippy::too_many_arguments)]
    fn ec_rebuild_piece(
        &self,
        map: &PoolMap,
        g: &Group,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        bad: &[usize],
        mut errs: Vec<Error>,
        mut put: impl FnMut(usize, u64, &[u8]),
        stripes_of: impl Fn(usize) -> Vec<u64>,
    ) -> Result<()> {
        let stripes: BTreeSet<u64> = bad.iter().flat_map(|&j| stripes_of(j)).collect();
        for s in stripes {
            let cells = self
                .ec_read_stripe(map, g, epoch, dkey, akey, s, bad)
                .map_err(|e| {
                    errs.push(e);
                    combine(&self.what(dkey), std::mem::take(&mut errs))
                })?;
            for &j in bad {
                put(j, s, &cells[j]);
            }
        }
        Ok(())
    }
}

/// A piece of an EC read on one data shard.
struct CellSeg {
    shard_off: u64,
    len: usize,
    /// Where in the caller's buffer.
    dst: usize,
    stripe: u64,
}

/// The pieces of a read of `len` bytes at `start` on each of the `k` data
/// shards, in shard order.
fn cell_segs(k: usize, start: u64, len: usize) -> Vec<Vec<CellSeg>> {
    let cell = EC_CELL_SIZE;
    let end = start + len as u64;
    let mut segs: Vec<Vec<CellSeg>> = (0..k).map(|_| Vec::new()).collect();
    let mut o = start;
    while o < end {
        let (c, within) = (o / cell, o % cell);
        let l = (cell - within).min(end - o);
        segs[(c % k as u64) as usize].push(CellSeg {
            shard_off: (c / k as u64) * cell + within,
            len: l as usize,
            dst: (o - start) as usize,
            stripe: c / k as u64,
        });
        o += l;
    }
    segs
}
