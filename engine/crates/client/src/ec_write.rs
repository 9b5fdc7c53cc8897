//! Writes of erasure-coded arrays: each batch of stripes is one
//! transaction ([`crate::dtx`]) over every live cell, data and parity, so a
//! stripe is either wholly old or wholly new, whatever fails.
//!
//! A stripe the write covers whole is encoded from the caller's bytes. A
//! stripe it covers in part is read (reconstructed if a data shard cannot be
//! read), merged and encoded; the data shards get only the caller's bytes,
//! the parity shards the new parity. Parity depends on bytes this writer did
//! not write, so the write is a compare-and-swap on the stripe's version: the
//! epoch of its newest parity cell on the first readable parity shard (every
//! write of a stripe rewrites its parity cells whole), read before the data.
//! That shard refuses the prepare (`-EBUSY`) if the stripe changed since,
//! and the batch is read and encoded again. Whole stripes are checked the
//! same way against their own epoch, so a writer whose clock lags cannot
//! hide its parity under an older one.

use crate::error::{fmt_key, Error, Result};
use crate::hlc;
use crate::object::{size_akey, Object, READ_RETRY_WINDOW};
use crate::placement::{PoolMap, ShardLoc};
use peregrine_proto::data::{Iod, ValueKind};
use peregrine_proto::oclass::EC_CELL_SIZE;
use peregrine_proto::EPOCH_LATEST;
use std::time::{Duration, Instant};

/// Stripes per transaction of an EC array write.
pub const EC_BATCH_STRIPES: u64 = 32;
/// Most times one batch is read and encoded again because other writers
/// changed its stripes meanwhile, before it fails with `-EBUSY`.
pub const EC_CAS_ROUNDS: usize = 32;

impl Object {
    pub(crate) fn ec_update(
        &self,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let (k, _) = self.kp();
        let stripe = k as u64 * EC_CELL_SIZE;
        let end = offset + data.len() as u64;
        let (first, last) = (offset / stripe, (end - 1) / stripe);
        let mut s = first;
        while s <= last {
            let s_end = (s + EC_BATCH_STRIPES).min(last + 1);
            let deadline = Instant::now() + READ_RETRY_WINDOW;
            let mut busy = 0usize;
            loop {
                let r = self.with_map(|map| {
                    self.ec_update_batch(map, dkey, akey, offset, data, s, s_end, busy > 0)
                });
                match r {
                    Err(e) if e.code == -libc::EBUSY && busy < EC_CAS_ROUNDS => busy += 1,
                    Err(e) if e.code == -libc::EINPROGRESS && Instant::now() < deadline => {}
                    r => break r?,
                }
                // Maybe held by this process's own commit, not sent yet.
                self.container().pool().client().committer().flush();
                // Spread writers racing for the same stripes apart.
                let cap = 1u64 << busy.min(7);
                std::thread::sleep(Duration::from_micros(
                    200 + uuid::Uuid::new_v4().as_u64_pair().0 % (cap * 500),
                ));
            }
            s = s_end;
        }
        Ok(())
    }

    /// Write stripes `s0..s1` of a write of `data` at `offset`, as one
    /// transaction. `learn`: read the version of whole stripes as well
    /// (after a refusal: another writer's clock may be ahead of this one's).
    #[allow(clippy::too_many_arguments)]
    fn ec_update_batch(
        &self,
        map: &PoolMap,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        data: &[u8],
        s0: u64,
        s1: u64,
        learn: bool,
    ) -> Result<()> {
        let _locks = self.lock_stripes(dkey, akey, s0, s1);
        let (k, p) = self.kp();
        let cell = EC_CELL_SIZE as usize;
        let stripe = (k * cell) as u64;
        let end = offset + data.len() as u64;
        let g = self.group(map, dkey)?;
        self.check_redundancy(map, &g)?;
        let full = |s: u64| offset <= s * stripe && end >= (s + 1) * stripe;
        // The shard whose parity cells version the stripes.
        let cas = g.shards[k..k + p]
            .iter()
            .copied()
            .find(|l| map.targets[l.target].readable);
        let versioned: Vec<u64> = (s0..s1).filter(|&s| learn || !full(s)).collect();
        if !versioned.is_empty() {
            // A stripe this process wrote just before reads as in progress
            // until its commit is sent.
            self.container().pool().client().committer().flush();
        }
        let versions = match cas {
            Some(loc) if !versioned.is_empty() => {
                self.stripe_versions(map, &loc, dkey, akey, &versioned)?
            }
            _ => Vec::new(),
        };
        if let Some(&v) = versions.iter().max() {
            hlc::observe(v);
        }
        // Whole stripes straight from `data`; partial ones read and merged.
        let mut stripes: Vec<std::borrow::Cow<[u8]>> = Vec::with_capacity((s1 - s0) as usize);
        for s in s0..s1 {
            let (lo, hi) = (s * stripe, (s + 1) * stripe);
            if full(s) {
                stripes.push(data[(lo - offset) as usize..(hi - offset) as usize].into());
                continue;
            }
            let mut buf = self
                .ec_read_stripe(map, &g, EPOCH_LATEST, dkey, akey, s, &[])?
                .concat();
            let (a, b) = (offset.max(lo), end.min(hi));
            buf[(a - lo) as usize..(b - lo) as usize]
                .copy_from_slice(&data[(a - offset) as usize..(b - offset) as usize]);
            stripes.push(buf.into());
        }
        let rs = self.rs.as_ref().expect("EC object");
        let parity: Vec<Vec<Vec<u8>>> = stripes
            .iter()
            .map(|st| {
                let cells: Vec<&[u8]> = st.chunks(cell).collect();
                rs.encode(&cells).map_err(|e| Error::io(e.to_string()))
            })
            .collect::<Result<_>>()?;
        let epoch = hlc::now();
        let logical_end = end.min(s1 * stripe);
        let zero = [0u8; 1];
        let size_iod = self.iod(
            &size_akey(akey),
            ValueKind::Array,
            logical_end - 1,
            &[&zero],
        );
        let gs = self.gs();
        let prepare = |loc: &ShardLoc, tx: Option<&peregrine_proto::data::Dtx>| {
            let j = (loc.shard - g.group * gs) as usize;
            let mut iods: Vec<Iod> = Vec::new();
            let mut parts: Vec<&[u8]> = Vec::new();
            for (i, s) in (s0..s1).enumerate() {
                let at = s * cell as u64;
                if j >= k {
                    let pc = &parity[i][j - k][..];
                    let mut iod = self.iod(akey, ValueKind::Array, at, &[pc]);
                    if Some(*loc) == cas {
                        // Unchanged since read, or (not read) since just
                        // below this write's epoch.
                        iod.has_unchanged_since = true;
                        iod.unchanged_since = versioned
                            .iter()
                            .position(|&v| v == s)
                            .map_or(epoch - 1, |x| versions[x]);
                    }
                    iods.push(iod);
                    parts.push(pc);
                    continue;
                }
                // Data shard: its cell whole, or only the caller's bytes in it.
                let lo = s * stripe + (j * cell) as u64;
                let (a, b) = (offset.max(lo), end.min(lo + cell as u64));
                if a >= b {
                    continue;
                }
                let bytes = if full(s) {
                    &stripes[i][j * cell..(j + 1) * cell]
                } else {
                    &data[(a - offset) as usize..(b - offset) as usize]
                };
                iods.push(self.iod(akey, ValueKind::Array, at + (a - lo), &[bytes]));
                parts.push(bytes);
            }
            iods.push(size_iod.clone());
            parts.push(&zero);
            self.update_shard(map, loc, tx, epoch, dkey, iods, &parts)
        };
        self.write_shards(map, std::slice::from_ref(&g), prepare)
    }

    /// The version (epoch of the newest parity cell) of each of `stripes`
    /// on parity shard `loc`: 0 for a stripe never written.
    pub(crate) fn stripe_versions(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        dkey: &[u8],
        akey: &[u8],
        stripes: &[u64],
    ) -> Result<Vec<u64>> {
        // One byte per cell: parity cells are always written whole, so the
        // newest version over its first byte is the cell's.
        let iods = stripes
            .iter()
            .map(|&s| Iod {
                akey: akey.to_vec(),
                kind: ValueKind::Array as i32,
                offset: s * EC_CELL_SIZE,
                len: 1,
                ..Default::default()
            })
            .collect();
        let fetched = self.fetch_shard(map, loc, EPOCH_LATEST, dkey, iods)?;
        fetched
            .into_iter()
            .zip(stripes)
            .map(|(f, s)| match f.status {
                0 => Ok(f.epoch),
                c => Err(Error::new(
                    c,
                    format!(
                        "{}: version of stripe {s} of akey {}",
                        self.where_(map, loc),
                        fmt_key(akey)
                    ),
                )),
            })
            .collect()
    }
}
