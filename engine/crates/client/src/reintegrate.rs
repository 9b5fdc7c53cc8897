//! Reintegration: bring the shards of targets that come back after an
//! outage up to date from the shards that stayed up, before those targets
//! serve reads again. The management service runs it (see its `pool_map`
//! module) while the returning targets already take every new update.
//!
//! For every dkey that an up-and-in target holds a change of above `since`
//! (an epoch below everything the returning targets may have missed), in a
//! redundancy group with a shard on a returning target:
//! - **replicated** data (`RP_*` objects; an EC object's single values,
//!   size companions and punches, which every shard holds alike): each
//!   record above `since` of one up-to-date replica (a value still visible,
//!   a punch of the object, dkey or akey) is repeated on the returning
//!   shard at its own epoch, the value fetched at that epoch. Records are
//!   versions, so the copy converges with the source whatever order it
//!   meets the updates that go on meanwhile: the same epochs win.
//! - **erasure-coded** arrays: each stripe with a cell changed above
//!   `since` on any surviving shard is read at the newest such epoch from
//!   the surviving cells, the returning cells are reconstructed, and
//!   written at that epoch: an update of the stripe after it (at a newer
//!   epoch) still wins on the returning shard, as on the others.
//!
//! Striped objects (no redundancy) have nothing to copy: writes to a down
//! target of theirs fail instead of skipping it.
//!
//! What a returning shard already holds is not written again: `since` lies
//! well below the outage (the management service's margin), so the copy
//! meets every update the shard took before it went away, and after it came
//! back. Writing one again at its epoch would not replace it (array extents
//! of one epoch stay side by side until aggregation, which waits for the
//! copy) but take its space a second time, and each retry of a copy that
//! failed half-way once more, until the target was full: writes failing
//! with ENOSPC and a copy that never ends. A value is skipped when the
//! shard lists the same record (kind, akey, extent, epoch: the same
//! update); an EC cell when the shard's extents of the stripe's newest epoch
//! cover it whole.

use crate::error::{fmt_key, Error, Result};
use crate::object::{reply_body, Object, EC_SIZE_PREFIX};
use crate::placement::{self, Group, PoolMap, ShardLoc};
use crate::{Client, Container};
use peregrine_proto::data::{
    self, response::Body, ChangedKey, Iod, ListChangedReq, ListRecordsReq, Record, RecordKind,
    ValueKind,
};
use peregrine_proto::frame::Opcode;
use peregrine_proto::oclass::EC_CELL_SIZE;
use peregrine_proto::ObjectId;
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use uuid::Uuid;

/// Changed keys asked for per request.
const CHANGED_BATCH: u32 = 1024;

/// What a reintegration copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReintegrationStats {
    /// Dkeys of groups with a returning shard that were brought up to date.
    pub dkeys: u64,
    /// Values copied (one per record, per returning shard).
    pub values: u64,
    /// Punches repeated.
    pub punches: u64,
    /// EC stripes whose returning cells were reconstructed.
    pub stripes: u64,
    /// Bytes written to returning shards.
    pub bytes: u64,
    /// Values, punches and EC cells a returning shard already held, not
    /// written again.
    pub held: u64,
}

impl fmt::Display for ReintegrationStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} dkeys: {} values, {} punches, {} EC stripes, {} bytes; {} already held",
            self.dkeys, self.values, self.punches, self.stripes, self.bytes, self.held
        )
    }
}

/// Bring the targets of `ranks` in pool `pool` up to date with what their
/// groups' up-and-in shards hold above epoch `since`. The pool map must
/// show those targets being reintegrated (writable, not readable).
pub fn reintegrate_pool(
    client: &Client,
    pool: &str,
    ranks: &[u32],
    since: u64,
) -> Result<ReintegrationStats> {
    let pool = client.pool_connect(pool)?;
    let map = pool.map();
    let back: HashSet<usize> = (0..map.targets.len())
        .filter(|&i| ranks.contains(&map.targets[i].rank))
        .collect();
    if back.is_empty() {
        return Err(Error::inval(format!(
            "pool {:?}: ranks {ranks:?} hold none of its targets",
            map.name()
        )));
    }
    if let Some(&i) = back.iter().find(|&&i| !map.targets[i].up) {
        return Err(Error::new(
            -libc::ESTALE,
            format!(
                "pool {:?}: rank {} is not being reintegrated in map version {}",
                map.name(),
                map.targets[i].rank,
                map.version
            ),
        ));
    }
    let mut conts: HashMap<Uuid, Option<Container>> = HashMap::new();
    let mut done: HashSet<(Uuid, ObjectId, u32, Vec<u8>)> = HashSet::new();
    let mut stats = ReintegrationStats::default();
    for t in 0..map.targets.len() {
        if !map.targets[t].readable {
            continue;
        }
        let mut anchor: Option<ChangedKey> = None;
        loop {
            let (keys, finished) = list_changed(client, &map, t, since, anchor.take())?;
            for key in &keys {
                let (cont, oid) = changed_key_ids(&map, key)?;
                let class = oid
                    .class()
                    .map_err(|e| Error::new(-libc::EPROTO, format!("object {oid}: {e}")))?;
                let g = placement::group_layout(&map, oid, class, key.shard / class.group_size())?;
                if !g.shards.iter().any(|l| back.contains(&l.target))
                    || !done.insert((cont, oid, g.group, key.dkey.clone()))
                {
                    continue;
                }
                let c = match conts.get(&cont) {
                    Some(c) => c.clone(),
                    None => {
                        let c = match pool.cont_open(&cont.to_string()) {
                            Ok(c) => Some(c),
                            // Destroyed meanwhile: nothing to bring back.
                            Err(e) if e.code == -libc::ENOENT => None,
                            Err(e) => return Err(e),
                        };
                        conts.insert(cont, c.clone());
                        c
                    }
                };
                let Some(c) = c else { continue };
                let obj = c.object(oid)?;
                // A transaction in flight on the dkey: copy it once decided.
                let deadline = std::time::Instant::now() + crate::object::READ_RETRY_WINDOW;
                loop {
                    match obj.reintegrate_dkey(&map, &g, &key.dkey, since, &back, &mut stats) {
                        Err(e)
                            if e.code == -libc::EINPROGRESS
                                && std::time::Instant::now() < deadline =>
                        {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                        r => break r.map_err(|e| e.context(obj.what(&key.dkey)))?,
                    }
                }
                stats.dkeys += 1;
            }
            if finished {
                break;
            }
            anchor = Some(keys.last().cloned().ok_or_else(|| {
                Error::new(-libc::EPROTO, "changed-key listing made no progress")
            })?);
        }
    }
    Ok(stats)
}

pub(crate) fn changed_key_ids(map: &PoolMap, key: &ChangedKey) -> Result<(Uuid, ObjectId)> {
    let bad = |m: String| Error::new(-libc::EPROTO, format!("pool {:?}: {m}", map.name()));
    let cont = Uuid::from_slice(&key.cont).map_err(|_| {
        bad(format!(
            "changed key with a bad container id {:?}",
            key.cont
        ))
    })?;
    let oid = key
        .oid
        .map(|o| ObjectId { hi: o.hi, lo: o.lo })
        .ok_or_else(|| bad("changed key without an object id".into()))?;
    Ok((cont, oid))
}

/// One page of the dkeys target `t` holds changes of above `since`.
pub(crate) fn list_changed(
    client: &Client,
    map: &PoolMap,
    t: usize,
    since: u64,
    anchor: Option<ChangedKey>,
) -> Result<(Vec<ChangedKey>, bool)> {
    let target = &map.targets[t];
    let req = ListChangedReq {
        addr: Some(data::Address {
            pool: map.uuid.as_bytes().to_vec(),
            target: target.index,
            map_version: map.version,
            handle: map.handle.clone(),
            ..Default::default()
        }),
        since,
        anchor,
        max: CHANGED_BATCH,
    };
    let at = || {
        format!(
            "pool {:?} rank {} target {}: changed keys",
            map.name(),
            target.rank,
            target.index
        )
    };
    let reply = client
        .transport()
        .call(
            &target.addr,
            target.index,
            Opcode::ListChanged,
            &req.encode_to_vec(),
            &[],
        )
        .map_err(|e| e.context(at()))?;
    match reply_body(&reply.msg, at)? {
        Some(Body::Changed(c)) => Ok((c.keys, c.done)),
        _ => Err(Error::new(
            -libc::EPROTO,
            format!("{}: reply without keys", at()),
        )),
    }
}

/// Whether `held` (a shard's records) has array extents of `akey` at exactly
/// `epoch` that cover `[start, end)` together.
fn covers(held: &[Record], akey: &[u8], epoch: u64, start: u64, end: u64) -> bool {
    let mut xs: Vec<(u64, u64)> = held
        .iter()
        .filter(|r| {
            r.kind == RecordKind::RecordValue as i32
                && r.value_kind == ValueKind::Array as i32
                && r.epoch == epoch
                && r.akey == akey
        })
        .map(|r| (r.offset, r.offset + r.len))
        .collect();
    xs.sort_unstable();
    let mut at = start;
    for (s, e) in xs {
        if s > at {
            break;
        }
        at = at.max(e);
    }
    at >= end
}

/// Whether a record is held alike by every shard of an EC group.
fn replicated_in_ec(r: &Record) -> bool {
    r.kind != RecordKind::RecordValue as i32
        || r.value_kind == ValueKind::Single as i32
        || r.akey.starts_with(EC_SIZE_PREFIX)
}

impl Object {
    /// Bring the returning shards (`back`: pool map target indexes) of group
    /// `g` up to date for `dkey`.
    fn reintegrate_dkey(
        &self,
        map: &PoolMap,
        g: &Group,
        dkey: &[u8],
        since: u64,
        back: &HashSet<usize>,
        stats: &mut ReintegrationStats,
    ) -> Result<()> {
        let dst: Vec<ShardLoc> = g
            .shards
            .iter()
            .filter(|l| back.contains(&l.target))
            .copied()
            .collect();
        let src: Vec<ShardLoc> = g
            .shards
            .iter()
            .filter(|l| map.targets[l.target].readable)
            .copied()
            .collect();
        let Some(&first) = src.first() else {
            return Err(Error::new(
                -libc::EHOSTDOWN,
                format!("group {}: no up-to-date shard left to copy from", g.group),
            ));
        };
        // What each returning shard holds already (see the module docs).
        let held: Vec<Vec<Record>> = dst
            .iter()
            .map(|d| match self.list_records(map, d, dkey, since) {
                // An engine older than this check answers no listing while it
                // is reintegrated (a rolling upgrade): copy it all, as before.
                Err(e) if e.code == -libc::ESTALE => Ok(Vec::new()),
                r => r,
            })
            .collect::<Result<_>>()?;
        let missing = |records: &[Record], held: &[Record], stats: &mut ReintegrationStats| {
            let (has, lacks): (Vec<Record>, Vec<Record>) =
                records.iter().cloned().partition(|r| held.contains(r));
            stats.held += has.len() as u64;
            lacks
        };
        let Some(rs) = self.rs.clone() else {
            let records = self.list_records(map, &first, dkey, since)?;
            for (d, h) in dst.iter().zip(&held) {
                let lacks = missing(&records, h, stats);
                self.copy_records(map, &first, d, dkey, &lacks, stats)?;
            }
            return Ok(());
        };
        let (k, p) = self.kp();
        let cell = EC_CELL_SIZE;
        let gs = self.gs();
        // Newest change of each (akey, stripe), over every surviving shard.
        let mut stripes: BTreeMap<(Vec<u8>, u64), u64> = BTreeMap::new();
        for (i, s) in src.iter().enumerate() {
            let records = self.list_records(map, s, dkey, since)?;
            if i == 0 {
                let same: Vec<Record> = records
                    .iter()
                    .filter(|r| replicated_in_ec(r))
                    .cloned()
                    .collect();
                for (d, h) in dst.iter().zip(&held) {
                    let lacks = missing(&same, h, stats);
                    self.copy_records(map, s, d, dkey, &lacks, stats)?;
                }
            }
            for r in records.iter().filter(|r| !replicated_in_ec(r) && r.len > 0) {
                for st in r.offset / cell..=(r.offset + r.len - 1) / cell {
                    let e = stripes.entry((r.akey.clone(), st)).or_default();
                    *e = (*e).max(r.epoch);
                }
            }
        }
        for ((akey, st), epoch) in stripes {
            let (start, end) = (st * cell, (st + 1) * cell);
            let lack: Vec<&ShardLoc> = dst
                .iter()
                .zip(&held)
                .filter(|(_, h)| !covers(h, &akey, epoch, start, end))
                .map(|(d, _)| d)
                .collect();
            stats.held += (dst.len() - lack.len()) as u64;
            if lack.is_empty() {
                continue;
            }
            let mut cells: Vec<Option<Vec<u8>>> = vec![None; k + p];
            let mut errs = Vec::new();
            for s in &src {
                let j = (s.shard - g.group * gs) as usize;
                match self.fetch_extent(map, s, epoch, dkey, &akey, st * cell, cell as usize) {
                    Ok(c) => cells[j] = Some(c),
                    Err(e) if e.code == -libc::ESTALE => return Err(e),
                    Err(e) => errs.push(e.to_string()),
                }
            }
            rs.reconstruct(&mut cells).map_err(|e| {
                Error::io(format!(
                    "akey {} stripe {st}: cannot reconstruct: {e} ({})",
                    fmt_key(&akey),
                    errs.join("; ")
                ))
            })?;
            for d in lack {
                let j = (d.shard - g.group * gs) as usize;
                let c = cells[j].as_deref().expect("reconstructed");
                let iod = self.iod(&akey, ValueKind::Array, st * cell, &[c]);
                self.update_shard(map, d, None, epoch, dkey, vec![iod], &[c])?;
                stats.bytes += c.len() as u64;
            }
            stats.stripes += 1;
        }
        Ok(())
    }

    fn list_records(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        dkey: &[u8],
        since: u64,
    ) -> Result<Vec<Record>> {
        let req = ListRecordsReq {
            addr: Some(self.address(map, loc)),
            dkey: dkey.to_vec(),
            since,
        };
        match self.call(map, loc, Opcode::ListRecords, &req, &[])? {
            (Some(Body::Records(r)), _) => Ok(r.records),
            _ => Err(Error::new(
                -libc::EPROTO,
                format!("{}: records reply without records", self.where_(map, loc)),
            )),
        }
    }

    /// Repeat `records` of shard `from` on shard `to`, each at its epoch.
    fn copy_records(
        &self,
        map: &PoolMap,
        from: &ShardLoc,
        to: &ShardLoc,
        dkey: &[u8],
        records: &[Record],
        stats: &mut ReintegrationStats,
    ) -> Result<()> {
        for r in records {
            let kind = RecordKind::try_from(r.kind).map_err(|_| {
                Error::new(-libc::EPROTO, format!("unknown record kind {}", r.kind))
            })?;
            let mut punch = |d: &[u8], akeys: &[Vec<u8>]| {
                self.punch_shard(map, to, None, r.epoch, d, akeys)
                    .map(|_| stats.punches += 1)
            };
            match kind {
                RecordKind::RecordPunchObject => punch(b"", &[])?,
                RecordKind::RecordPunchDkey => punch(dkey, &[])?,
                RecordKind::RecordPunchAkey => punch(dkey, std::slice::from_ref(&r.akey))?,
                RecordKind::RecordValue => {
                    let single = r.value_kind == ValueKind::Single as i32;
                    let iod = Iod {
                        akey: r.akey.clone(),
                        kind: r.value_kind,
                        offset: r.offset,
                        len: if single { 0 } else { r.len },
                        crc: 0,
                        has_crc: false,
                        ..Default::default()
                    };
                    let v = self
                        .fetch_shard(map, from, r.epoch, dkey, vec![iod])?
                        .pop()
                        .expect("one value");
                    match v.status {
                        0 => {}
                        // Gone since it was listed (punched or aggregated): its
                        // successor is a record of its own.
                        e if e == -libc::ENOENT => continue,
                        e => {
                            return Err(Error::new(
                                e,
                                format!(
                                    "{}: akey {} at epoch {}: {}",
                                    self.where_(map, from),
                                    fmt_key(&r.akey),
                                    r.epoch,
                                    peregrine_proto::strerror(e)
                                ),
                            ))
                        }
                    }
                    let kind = if single {
                        ValueKind::Single
                    } else {
                        ValueKind::Array
                    };
                    let iod = self.iod(&r.akey, kind, r.offset, &[&v.data]);
                    self.update_shard(map, to, None, r.epoch, dkey, vec![iod], &[&v.data])?;
                    stats.values += 1;
                    stats.bytes += v.data.len() as u64;
                }
            }
        }
        Ok(())
    }
}
