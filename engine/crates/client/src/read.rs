//! [`ObjectAt`]: reads of an object at one epoch (the latest, or a
//! snapshot's): single values, arrays, sizes and listings, from one
//! replica with fallback, or reconstructed for erasure-coded objects.

use crate::error::{fmt_key, Error, Result};
use crate::object::{
    call_to, check_keys, check_range, combine, par_map, size_akey, Fetched, Object, ObjectAt,
    EC_BATCH_STRIPES, EC_SIZE_PREFIX, LIST_BATCH, MAX_IO,
};
use crate::placement::{self, Group, PoolMap, ShardLoc};
use crate::transport::Call;
use peregrine_isal::crc32c;
use peregrine_proto::data::{
    response::Body, FetchReq, Iod, LastQuery, ListReq, QuerySizeReq, QuerySizeResp, ValueKind,
};
use peregrine_proto::frame::Opcode;
use peregrine_proto::oclass::EC_CELL_SIZE;
use peregrine_proto::CSUM_ERRNO;
use prost::Message;
use std::collections::BTreeSet;

/// The iod of `len` bytes of ARRAY `akey` at `offset`.
pub(crate) fn array_iod(akey: &[u8], offset: u64, len: u64) -> Iod {
    Iod {
        akey: akey.to_vec(),
        kind: ValueKind::Array as i32,
        offset,
        len,
        ..Default::default()
    }
}

/// The largest extent [`ObjectAt::fetch_array_with_end`] fetches. Its
/// reply carries every byte asked for, zeros past the end of the array:
/// a larger read is better asked after the end is known.
pub const FETCH_WITH_END_MAX: usize = 64 << 10;

/// What [`ObjectAt::fetch_array_with_end`] found besides the extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedWithEnd {
    /// [`ObjectAt::last_sized`]: the last dkey whose akey has a non-zero
    /// size, and that size.
    pub last: Option<(Vec<u8>, u64)>,
    /// The fetched dkey's array size as the fetch saw it (0: nothing
    /// there). The two requests are answered apart: a write between them
    /// can be in `last` and not in the extent, which only bytes below
    /// `seen` surely hold.
    pub seen: u64,
}

/// Keep in `best` the later dkey (in key order) of it and `d`, with its size.
fn keep_later(best: &mut Option<(Vec<u8>, u64)>, d: Vec<u8>, s: u64) {
    if best.as_ref().is_none_or(|(b, _)| d > *b) {
        *best = Some((d, s));
    }
}

/// One shard's answer to a query of its last sized dkey.
enum LastStep {
    Found(Vec<u8>, u64),
    Nothing,
    /// Its scan stopped at its bound: ask again below this dkey.
    Below(Vec<u8>),
}

impl ObjectAt<'_> {
    /// The SINGLE value `akey` of `dkey`, `None` if it does not exist.
    pub fn fetch_single(&self, dkey: &[u8], akey: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.fetch_single_versioned(dkey, akey)?.map(|(v, _)| v))
    }

    /// Like [`ObjectAt::fetch_single`], with the epoch of the version read:
    /// what [`crate::Expect::UnchangedSince`] takes to change the value only
    /// if nobody changed it since.
    pub fn fetch_single_versioned(
        &self,
        dkey: &[u8],
        akey: &[u8],
    ) -> Result<Option<(Vec<u8>, u64)>> {
        check_keys(dkey, Some(akey))?;
        let o = self.obj;
        let what = o.what(dkey);
        o.with_map_for_read(|map| {
            let g = o.group(map, dkey)?;
            o.try_each(&o.read_order(map, &g, dkey), &what, |loc| {
                let iod = Iod {
                    akey: akey.to_vec(),
                    kind: ValueKind::Single as i32,
                    offset: 0,
                    len: 0,
                    crc: 0,
                    has_crc: false,
                    ..Default::default()
                };
                let v = o
                    .fetch_shard(map, loc, self.epoch, dkey, vec![iod])?
                    .pop()
                    .expect("one value");
                match v.status {
                    0 => Ok(Some((v.data, v.epoch))),
                    e if e == -libc::ENOENT => Ok(None),
                    e => Err(o.value_error(map, loc, akey, e)),
                }
            })
        })
    }

    /// Exactly `len` bytes at `offset` of ARRAY `akey` (holes read as zeros).
    pub fn fetch_array(
        &self,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.fetch_array_into(dkey, akey, offset, &mut buf)?;
        Ok(buf)
    }

    /// Like [`ObjectAt::fetch_array`] into a caller's buffer.
    pub fn fetch_array_into(
        &self,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        check_keys(dkey, Some(akey))?;
        check_range(offset, buf.len())?;
        let o = self.obj;
        let what = o.what(dkey);
        if o.rs.is_some() {
            let (k, _) = o.kp();
            let stripe = k as u64 * EC_CELL_SIZE;
            let batch = stripe * EC_BATCH_STRIPES;
            let mut done = 0usize;
            while done < buf.len() {
                let pos = offset + done as u64;
                let piece_end = ((pos / batch + 1) * batch).min(offset + buf.len() as u64);
                let n = (piece_end - pos) as usize;
                o.with_map_for_read(|map| {
                    o.ec_fetch_piece(map, self.epoch, dkey, akey, pos, &mut buf[done..done + n])
                })
                .map_err(|e| {
                    if e.msg.starts_with(&what) {
                        e
                    } else {
                        e.context(&what)
                    }
                })?;
                done += n;
            }
            return Ok(());
        }
        for (i, piece) in buf.chunks_mut(MAX_IO).enumerate() {
            let off = offset + (i * MAX_IO) as u64;
            o.with_map_for_read(|map| {
                let g = o.group(map, dkey)?;
                o.try_each(&o.read_order(map, &g, dkey), &what, |loc| {
                    o.fetch_extent_into(map, loc, self.epoch, dkey, akey, off, piece)
                })
            })?;
        }
        Ok(())
    }

    /// Size of ARRAY `akey`: highest byte written + 1 (0 if absent).
    pub fn array_size(&self, dkey: &[u8], akey: &[u8]) -> Result<u64> {
        check_keys(dkey, Some(akey))?;
        let o = self.obj;
        let what = o.what(dkey);
        let key = if o.rs.is_some() {
            size_akey(akey)
        } else {
            akey.to_vec()
        };
        o.with_map_for_read(|map| {
            let g = o.group(map, dkey)?;
            o.try_each(&o.read_order(map, &g, dkey), &what, |loc| {
                o.size_shard(map, loc, self.epoch, dkey, &key)
            })
        })
    }

    /// The last dkey of the object (in key order) whose `akey` has a
    /// non-zero size (its array's size, or its single value's), with that
    /// size: one request per group, sent together from this thread, where
    /// a listing of every dkey and a size query per dkey from the last
    /// down took two round trips at least (a file's end). `Ok(None)` if no
    /// dkey has; `-EOPNOTSUPP` from engines that predate the query.
    pub fn last_sized(&self, akey: &[u8]) -> Result<Option<(Vec<u8>, u64)>> {
        check_keys(b"-", Some(akey))?;
        let o = self.obj;
        let what = format!("object {}", o.oid);
        let key = match o.rs.is_some() {
            true => size_akey(akey),
            false => akey.to_vec(),
        };
        o.with_map_for_read(|map| {
            let orders = self.group_orders(map)?;
            let firsts: Vec<(ShardLoc, QuerySizeReq)> = orders
                .iter()
                .filter_map(|order| order.first())
                .map(|loc| (*loc, self.last_req(map, loc, &key, Vec::new())))
                .collect();
            let mut answers = o.call_each(map, Opcode::QuerySize, &firsts).into_iter();
            let mut best: Option<(Vec<u8>, u64)> = None;
            for order in &orders {
                let Some(&first) = order.first() else {
                    continue;
                };
                let answer = answers.next().expect("one answer per first shard");
                let found = match self.last_answer(map, &first, answer) {
                    Ok(LastStep::Found(d, s)) => Some((d, s)),
                    Ok(LastStep::Nothing) => None,
                    Ok(LastStep::Below(k)) => self.last_sized_shard(map, &first, &key, k)?,
                    Err(e) if e.code == -libc::EOPNOTSUPP || e.code == -libc::ESTALE => {
                        return Err(e)
                    }
                    // Another copy, one at a time.
                    Err(_) => o.try_each(order, &what, |loc| {
                        self.last_sized_shard(map, loc, &key, Vec::new())
                    })?,
                };
                if let Some((d, s)) = found {
                    keep_later(&mut best, d, s);
                }
            }
            Ok(best)
        })
    }

    /// Each group's shards in the order a query of the group's last sized
    /// dkey tries them.
    fn group_orders(&self, map: &PoolMap) -> Result<Vec<Vec<ShardLoc>>> {
        let o = self.obj;
        Ok(o.layout(map)?
            .iter()
            .map(|g| o.read_order(map, g, &g.group.to_le_bytes()))
            .collect())
    }

    fn last_req(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        akey: &[u8],
        before: Vec<u8>,
    ) -> QuerySizeReq {
        QuerySizeReq {
            addr: Some(self.obj.address(map, loc)),
            epoch: self.epoch,
            akey: akey.to_vec(),
            last: Some(LastQuery { before }),
            ..Default::default()
        }
    }

    /// What one shard answered to a query of its last sized dkey.
    fn last_answer(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        answer: Result<Option<Body>>,
    ) -> Result<LastStep> {
        let last = match answer {
            Ok(Some(Body::Size(QuerySizeResp { last: Some(l), .. }))) => l,
            Ok(Some(Body::Size(_))) => {
                return Err(Error::new(
                    -libc::EOPNOTSUPP,
                    format!(
                        "{}: the engine predates queries of the last sized dkey",
                        self.obj.where_(map, loc)
                    ),
                ))
            }
            Ok(_) => {
                return Err(Error::new(
                    -libc::EPROTO,
                    format!("{}: size reply without a size", self.obj.where_(map, loc)),
                ))
            }
            Err(e) if e.code == -libc::ENOENT => return Ok(LastStep::Nothing),
            Err(e) => return Err(e),
        };
        Ok(match (last.dkey.is_empty(), last.resume.is_empty()) {
            (false, _) => LastStep::Found(last.dkey, last.size),
            (true, true) => LastStep::Nothing,
            (true, false) => LastStep::Below(last.resume),
        })
    }

    /// The last sized dkey of one shard before `before` (empty: of all),
    /// asking again below where each bounded scan stopped.
    fn last_sized_shard(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        akey: &[u8],
        mut before: Vec<u8>,
    ) -> Result<Option<(Vec<u8>, u64)>> {
        loop {
            let req = self.last_req(map, loc, akey, before);
            let answer = self
                .obj
                .call(map, loc, Opcode::QuerySize, &req, &[])
                .map(|(b, _)| b);
            match self.last_answer(map, loc, answer)? {
                LastStep::Found(d, s) => return Ok(Some((d, s))),
                LastStep::Nothing => return Ok(None),
                LastStep::Below(k) => before = k,
            }
        }
    }

    /// [`ObjectAt::fetch_array_into`] of one extent of `dkey` (at most
    /// [`FETCH_WITH_END_MAX`] bytes) and [`ObjectAt::last_sized`] of
    /// `akey`, their requests sent together: a file's first read, which
    /// must learn where the file ends, waits for one round trip instead of
    /// two. `Ok(None)` when they could not be answered together (an
    /// erasure-coded object, a larger extent, a shard the map refuses, any
    /// failure, a shard whose scan stopped at its bound): the caller asks
    /// one after the other, which handles all of these.
    pub fn fetch_array_with_end(
        &self,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        buf: &mut [u8],
    ) -> Result<Option<FetchedWithEnd>> {
        check_keys(dkey, Some(akey))?;
        check_range(offset, buf.len())?;
        let o = self.obj;
        if o.rs.is_some() || buf.len() > FETCH_WITH_END_MAX {
            return Ok(None);
        }
        o.with_map_for_read(|map| {
            let g = o.group(map, dkey)?;
            let firsts: Vec<ShardLoc> = self
                .group_orders(map)?
                .iter()
                .filter_map(|order| order.first().copied())
                .collect();
            let Some(&at) = o.read_order(map, &g, dkey).first() else {
                return Ok(None);
            };
            let callable = |loc: &ShardLoc, op| o.check_callable(map, loc, op).is_ok();
            if !callable(&at, Opcode::Fetch)
                || !firsts.iter().all(|l| callable(l, Opcode::QuerySize))
            {
                return Ok(None);
            }
            let iod = array_iod(akey, offset, buf.len() as u64);
            let fetch = o.fetch_req(map, &at, self.epoch, dkey, vec![iod]);
            let fetch = fetch.encode_to_vec();
            let queries: Vec<Vec<u8>> = firsts
                .iter()
                .map(|loc| self.last_req(map, loc, akey, Vec::new()).encode_to_vec())
                .collect();
            let fetch_call = call_to(map, &at, Opcode::Fetch, &fetch);
            let query_calls: Vec<Call> = firsts
                .iter()
                .zip(&queries)
                .map(|(loc, m)| call_to(map, loc, Opcode::QuerySize, m))
                .collect();
            let tr = o.cont.pool().client().transport();
            let fetch_started = tr.start(&fetch_call);
            let queries_started: Vec<_> = query_calls.iter().map(|c| tr.start(c)).collect();
            let fetched = tr.finish(fetch_started, &fetch_call, Some(&mut *buf));
            let answers: Vec<_> = queries_started
                .into_iter()
                .zip(&query_calls)
                .map(|(s, c)| tr.finish(s, c, None))
                .collect();
            let fetched = o
                .decoded(map, &at, fetched)
                .and_then(|(body, reply)| o.fetched(map, &at, 1, body, reply, Some(&mut *buf)));
            let Ok(Some(v)) = fetched.map(|mut v| v.pop()) else {
                return Ok(None);
            };
            let seen = if v.status == 0 { v.size } else { 0 };
            if o.extent_into(map, &at, akey, v, buf).is_err() {
                return Ok(None);
            }
            let mut last: Option<(Vec<u8>, u64)> = None;
            for (loc, answer) in firsts.iter().zip(answers) {
                let answer = o.decoded(map, loc, answer).map(|(b, _)| b);
                match self.last_answer(map, loc, answer) {
                    Ok(LastStep::Found(d, s)) => keep_later(&mut last, d, s),
                    Ok(LastStep::Nothing) => {}
                    Ok(LastStep::Below(_)) | Err(_) => return Ok(None),
                }
            }
            Ok(Some(FetchedWithEnd { last, seen }))
        })
    }

    /// All dkeys, sorted and de-duplicated over the object's groups.
    pub fn list_dkeys(&self) -> Result<Vec<Vec<u8>>> {
        let o = self.obj;
        let what = format!("object {}", o.oid);
        o.with_map_for_read(|map| {
            let groups = o.layout(map)?;
            let lists = par_map(&groups, |g| {
                // Any shard of the group has every dkey of the group.
                let order = o.read_order(map, g, &g.group.to_le_bytes());
                o.try_each(&order, &what, |loc| o.list_shard(map, loc, self.epoch, b""))
            });
            let mut all = BTreeSet::new();
            for l in lists {
                all.extend(l?);
            }
            Ok(all.into_iter().collect())
        })
    }

    /// The akeys of `dkey`, sorted. An EC shard holds only the arrays with
    /// bytes in its cells, but every array's size companion: the companions
    /// name the arrays (and are not listed themselves).
    pub fn list_akeys(&self, dkey: &[u8]) -> Result<Vec<Vec<u8>>> {
        check_keys(dkey, None)?;
        let o = self.obj;
        let what = o.what(dkey);
        let keys = o.with_map_for_read(|map| {
            let g = o.group(map, dkey)?;
            o.try_each(&o.read_order(map, &g, dkey), &what, |loc| {
                o.list_shard(map, loc, self.epoch, dkey)
            })
        })?;
        let mut keys: Vec<Vec<u8>> = keys
            .into_iter()
            .map(|k| match k.strip_prefix(EC_SIZE_PREFIX) {
                Some(array) if o.rs.is_some() => array.to_vec(),
                _ => k,
            })
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// Requests to one shard for the reads, and the replica choice.
impl Object {
    /// The group's shards in read order: rotation by hash so reads spread
    /// over replicas, up-and-in targets first (the others are refused).
    pub(crate) fn read_order(&self, map: &PoolMap, g: &Group, dkey: &[u8]) -> Vec<ShardLoc> {
        let n = g.shards.len();
        let start = (placement::mix64(placement::hash_dkey(self.oid, dkey)) % n as u64) as usize;
        let mut order: Vec<ShardLoc> = (0..n).map(|i| g.shards[(start + i) % n]).collect();
        order.sort_by_key(|l| !map.targets[l.target].readable); // stable: keeps rotation
        order
    }

    /// Try `f` on each shard in turn until one succeeds.
    pub(crate) fn try_each<T>(
        &self,
        order: &[ShardLoc],
        what: &str,
        mut f: impl FnMut(&ShardLoc) -> Result<T>,
    ) -> Result<T> {
        let mut errs = Vec::new();
        for loc in order {
            match f(loc) {
                Ok(v) => return Ok(v),
                Err(e) if e.code == -libc::ESTALE => return Err(e),
                Err(e) => errs.push(e),
            }
        }
        Err(combine(what, errs))
    }

    pub(crate) fn fetch_shard(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        iods: Vec<Iod>,
    ) -> Result<Vec<Fetched>> {
        self.fetch_shard_with(map, loc, epoch, dkey, iods, None)
    }

    /// Like [`Object::fetch_shard`]; with `out` (one iod), data of exactly
    /// `out.len()` bytes may land there directly ([`Fetched::placed`]).
    pub(crate) fn fetch_shard_with(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        iods: Vec<Iod>,
        mut out: Option<&mut [u8]>,
    ) -> Result<Vec<Fetched>> {
        let n = iods.len();
        let req = self.fetch_req(map, loc, epoch, dkey, iods);
        let (body, reply) =
            self.call_with(map, loc, Opcode::Fetch, &req, &[], out.as_deref_mut())?;
        self.fetched(map, loc, n, body, reply, out)
    }

    /// The fetch of `iods` of `dkey` from `loc` at `epoch`.
    pub(crate) fn fetch_req(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        iods: Vec<Iod>,
    ) -> FetchReq {
        FetchReq {
            addr: Some(self.address(map, loc)),
            epoch,
            dkey: dkey.to_vec(),
            iods,
        }
    }

    /// The values of a fetch reply of `n` iods from `loc`, each checked
    /// against its CRC (its bulk placed in `out`, or not).
    pub(crate) fn fetched(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        n: usize,
        body: Option<Body>,
        reply: crate::transport::Reply,
        out: Option<&mut [u8]>,
    ) -> Result<Vec<Fetched>> {
        let (mut bulk, placed, placed_crc) = (reply.bulk, reply.placed, reply.placed_crc);
        let bad = |m: String| Error::new(-libc::EPROTO, format!("{}: {m}", self.where_(map, loc)));
        let values = match body {
            Some(Body::Fetch(f)) => f.values,
            _ => return Err(bad("fetch reply without values".into())),
        };
        if values.len() != n {
            return Err(bad(format!(
                "fetch reply has {} values for {n} iods",
                values.len()
            )));
        }
        let total: u64 = values.iter().map(|v| v.len).sum();
        let arrived = match (&out, placed) {
            (Some(o), true) if n == 1 => o.len(),
            _ => bulk.len(),
        };
        if total != arrived as u64 {
            return Err(bad(format!(
                "fetch reply announces {total} bytes, bulk has {arrived}"
            )));
        }
        let csum = self.cont.checksum();
        let mut fetched = Vec::with_capacity(n);
        let mut off = 0usize;
        for v in &values {
            let data = if n == 1 {
                std::mem::take(&mut bulk)
            } else {
                let d = bulk[off..off + v.len as usize].to_vec();
                off += v.len as usize;
                d
            };
            let got: &[u8] = match (&out, placed) {
                (Some(o), true) => o,
                _ => &data,
            };
            let mut status = v.status;
            // Verify what arrived: catches corruption on the wire or in
            // buffers, which the engine's own check of stored data cannot.
            let crc = || match (placed_crc, n) {
                (Some(c), 1) if placed => c,
                _ => crc32c(got),
            };
            if status == 0 && csum && v.has_crc && crc() != v.crc {
                status = -CSUM_ERRNO;
            }
            fetched.push(Fetched {
                status,
                data,
                placed,
                epoch: v.epoch,
                size: v.size,
            });
        }
        Ok(fetched)
    }

    /// `len` bytes of ARRAY `akey` at `offset` of one shard, holes as zeros.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fetch_extent(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        let iod = array_iod(akey, offset, len as u64);
        let v = self
            .fetch_shard(map, loc, epoch, dkey, vec![iod])?
            .pop()
            .expect("one value");
        match v.status {
            0 => {
                let mut d = v.data;
                d.resize(len, 0);
                Ok(d)
            }
            e if e == -libc::ENOENT => Ok(vec![0; len]),
            e => Err(self.value_error(map, loc, akey, e)),
        }
    }

    /// Like [`Object::fetch_extent`], into `out`: over shared memory the
    /// data is copied once, from the engine's reply into `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fetch_extent_into(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let iod = array_iod(akey, offset, out.len() as u64);
        let v = self
            .fetch_shard_with(map, loc, epoch, dkey, vec![iod], Some(&mut *out))?
            .pop()
            .expect("one value");
        self.extent_into(map, loc, akey, v, out)
    }

    /// An array extent's fetched value into `out`, holes as zeros.
    pub(crate) fn extent_into(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        akey: &[u8],
        v: Fetched,
        out: &mut [u8],
    ) -> Result<()> {
        match v.status {
            0 if v.placed => Ok(()),
            0 => {
                let n = v.data.len().min(out.len());
                out[..n].copy_from_slice(&v.data[..n]);
                out[n..].fill(0);
                Ok(())
            }
            e if e == -libc::ENOENT => {
                out.fill(0);
                Ok(())
            }
            e => Err(self.value_error(map, loc, akey, e)),
        }
    }

    pub(crate) fn value_error(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        akey: &[u8],
        code: i32,
    ) -> Error {
        Error::new(
            code,
            format!(
                "{}: shard {} akey {}: {}",
                self.where_(map, loc),
                loc.shard,
                fmt_key(akey),
                peregrine_proto::strerror(code)
            ),
        )
    }

    pub(crate) fn size_shard(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
    ) -> Result<u64> {
        let req = QuerySizeReq {
            addr: Some(self.address(map, loc)),
            epoch,
            dkey: dkey.to_vec(),
            akey: akey.to_vec(),
            last: None,
        };
        match self.call(map, loc, Opcode::QuerySize, &req, &[]) {
            Ok((Some(Body::Size(s)), _)) => Ok(s.size),
            Ok(_) => Err(Error::new(
                -libc::EPROTO,
                format!("{}: size reply without a size", self.where_(map, loc)),
            )),
            Err(e) if e.code == -libc::ENOENT => Ok(0),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn list_shard(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
    ) -> Result<Vec<Vec<u8>>> {
        let mut keys = Vec::new();
        let mut anchor = Vec::new();
        loop {
            let req = ListReq {
                addr: Some(self.address(map, loc)),
                epoch,
                dkey: dkey.to_vec(),
                anchor: anchor.clone(),
                max: LIST_BATCH,
            };
            let l = match self.call(map, loc, Opcode::List, &req, &[]) {
                Ok((Some(Body::List(l)), _)) => l,
                Ok(_) => {
                    return Err(Error::new(
                        -libc::EPROTO,
                        format!("{}: list reply without keys", self.where_(map, loc)),
                    ))
                }
                Err(e) if e.code == -libc::ENOENT => return Ok(keys),
                Err(e) => return Err(e),
            };
            let progress = !l.keys.is_empty() || l.anchor != anchor;
            keys.extend(l.keys);
            if l.done {
                return Ok(keys);
            }
            if !progress {
                return Err(Error::new(
                    -libc::EPROTO,
                    format!("{}: listing made no progress", self.where_(map, loc)),
                ));
            }
            anchor = l.anchor;
        }
    }
}
