//! The in-RAM index of one target (the "VOS trees"):
//! pool -> container -> (oid, shard) -> dkey -> akey -> versions.
//!
//! Every change reaches the index only through [`TargetIndex::apply`] of a
//! [`WalOp`] that is already durable in the WAL; replay calls the same
//! function, so the live index and the replayed one cannot diverge.
//!
//! Visibility: a version at epoch `e` is visible to a read at epoch `r` when
//! `e <= r` and no punch `p` on the object, dkey or akey has `e <= p <= r`
//! (a punch hides versions at its own epoch too). For arrays, later epochs win
//! per byte; between extents of equal epoch the later write wins.

use crate::compact::{bytes, Key, SmallMap};
use crate::dtx::{DtxTable, TxId};
use crate::error::Errno;
use crate::superblock::BLOCK;
use peregrine_proto::data;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use uuid::Uuid;

/// SCM charged per stored record (version or punch) on top of its key and inline bytes.
pub(crate) const REC_OVERHEAD: u64 = 64;

/// [`TargetIndex::list_changed`] with `max` 0 lists this many keys.
pub(crate) const LIST_CHANGED_DEFAULT: usize = 1024;
/// [`TargetIndex::list_changed`] lists at most this many keys per call.
pub(crate) const LIST_CHANGED_MAX: usize = 4096;
/// [`TargetIndex::list_records`] refuses a dkey with more records than this.
pub(crate) const MAX_RECORDS: usize = 65536;

/// A key [`TargetIndex::list_changed`] returns: container, object shard, dkey.
pub(crate) type ChangedKey = (Uuid, ObjKey, Vec<u8>);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Kind {
    Single,
    Array,
}

/// A run of blocks in the target's data region holding one value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DevExtent {
    pub block: u64,
    pub nblocks: u64,
    /// CRC32C of each chunk of the value (the last chunk may be short); the
    /// chunk size is the device's (`Superblock::csum_chunk`, 4 KiB).
    pub csums: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Payload {
    /// Serialized as a `Vec<u8>` always was (read whole, see [`bytes`]).
    Inline(#[serde(with = "bytes")] Vec<u8>),
    Device(DevExtent),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Version {
    pub epoch: u64,
    /// ARRAY: byte offset of the extent; SINGLE: 0.
    pub offset: u64,
    pub len: u64,
    /// The client's CRC32C of the value, when it sent one.
    pub crc: Option<u32>,
    pub payload: Payload,
    /// SCM charged for this record (kept so removal refunds exactly).
    pub scm: u64,
}

impl Version {
    fn nvme(&self) -> u64 {
        match &self.payload {
            Payload::Device(d) => d.nblocks * BLOCK,
            Payload::Inline(_) => 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tomb {
    pub epoch: u64,
    pub scm: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AkeyTree {
    pub singles: SmallMap<u64, Version>,
    /// Sorted by epoch; equal epochs in write order.
    pub extents: Vec<Version>,
    pub punches: Vec<Tomb>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DkeyTree {
    pub akeys: SmallMap<Key, AkeyTree>,
    pub punches: Vec<Tomb>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ObjTree {
    pub dkeys: SmallMap<Key, DkeyTree>,
    pub punches: Vec<Tomb>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct ObjKey {
    pub hi: u64,
    pub lo: u64,
    pub shard: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ContTree {
    pub objs: BTreeMap<ObjKey, ObjTree>,
    /// Snapshot epochs aggregation keeps readable (sorted).
    pub snapshots: Vec<u64>,
    pub scm_used: u64,
    pub nvme_used: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PoolTree {
    pub scm_total: u64,
    pub nvme_total: u64,
    pub conts: BTreeMap<Uuid, ContTree>,
}

impl PoolTree {
    pub(crate) fn scm_used(&self) -> u64 {
        self.conts.values().map(|c| c.scm_used).sum()
    }
    pub(crate) fn nvme_used(&self) -> u64 {
        self.conts.values().map(|c| c.nvme_used).sum()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TargetIndex {
    pub pools: BTreeMap<Uuid, PoolTree>,
    /// The highest epoch an aggregation ran up to ([`WalOp::AggregateTo`]):
    /// a snapshot at or below it may have lost versions only it would see.
    pub aggregated_to: u64,
    /// The transactions held prepared here, and those decided (see [`crate::dtx`]).
    pub dtx: DtxTable,
}

/// A checkpoint written before transactions existed.
#[derive(Deserialize)]
struct IndexBeforeDtx {
    pools: BTreeMap<Uuid, PoolTree>,
    aggregated_to: u64,
}

impl TargetIndex {
    /// Decode a checkpoint. Those written before transactions existed hold
    /// no transaction table (none was pending); those written before
    /// `aggregated_to` existed hold the pools only (their aggregations ran
    /// up to the latest epoch, which no epoch test can express, so they
    /// count as none).
    pub(crate) fn decode(b: &[u8]) -> Option<TargetIndex> {
        let mut ix = bincode::deserialize::<TargetIndex>(b)
            .ok()
            .or_else(|| {
                bincode::deserialize::<IndexBeforeDtx>(b)
                    .ok()
                    .map(|o| TargetIndex {
                        pools: o.pools,
                        aggregated_to: o.aggregated_to,
                        dtx: DtxTable::default(),
                    })
            })
            .or_else(|| {
                bincode::deserialize(b).ok().map(|pools| TargetIndex {
                    pools,
                    ..TargetIndex::default()
                })
            })?;
        ix.dtx.rebuild();
        Some(ix)
    }
}

/// One value of an update as logged: where its bytes are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NewValue {
    pub akey: Vec<u8>,
    pub kind: Kind,
    pub offset: u64,
    pub len: u64,
    pub crc: Option<u32>,
    pub payload: Payload,
}

/// A logged change of a target's state. Replay re-applies these in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum WalOp {
    PoolCreate {
        pool: Uuid,
        scm: u64,
        nvme: u64,
    },
    PoolDestroy {
        pool: Uuid,
    },
    ContDestroy {
        pool: Uuid,
        cont: Uuid,
    },
    SetSnapshots {
        pool: Uuid,
        cont: Uuid,
        epochs: Vec<u64>,
    },
    Update {
        pool: Uuid,
        cont: Uuid,
        obj: ObjKey,
        dkey: Vec<u8>,
        epoch: u64,
        values: Vec<NewValue>,
    },
    Punch {
        pool: Uuid,
        cont: Uuid,
        obj: ObjKey,
        dkey: Vec<u8>,
        akeys: Vec<Vec<u8>>,
        epoch: u64,
    },
    /// Deterministic given the state, so replay recomputes the same removals.
    /// Up to the latest epoch; logged by engines before `AggregateTo` only.
    Aggregate {
        pool: Uuid,
    },
    /// Aggregation up to epoch `upto`: versions above it are all kept, so a
    /// snapshot the target learns of later, at an epoch above `upto`, reads
    /// what it would have read without the aggregation.
    AggregateTo {
        pool: Uuid,
        upto: u64,
    },
    /// Every record up to `through`, and its data, had been flushed from
    /// the device's volatile cache when this record was written: replay
    /// checks the data of the later records only. Changes nothing.
    Flushed {
        through: u64,
    },
    /// An update or punch (`op`) of transaction `id`, held until the
    /// transaction is decided ([`crate::dtx`]). `shards`: (rank, target) of
    /// each shard of it, leader first; `at_ms`: when it was logged
    /// (milliseconds since the Unix epoch).
    Prepare {
        id: TxId,
        shards: Vec<(u32, u32)>,
        at_ms: u64,
        op: Box<WalOp>,
    },
    /// Transaction `id` is committed (its held ops are applied) or aborted
    /// (dropped); either way the decision is remembered for a while.
    Decide {
        pool: Uuid,
        id: TxId,
        commit: bool,
        at_ms: u64,
    },
}

impl WalOp {
    /// The pool whose visible state the op changes, if any (for aggregation).
    pub(crate) fn changed_pool(&self) -> Option<Uuid> {
        match self {
            WalOp::Update { pool, .. }
            | WalOp::Punch { pool, .. }
            | WalOp::Decide {
                pool, commit: true, ..
            } => Some(*pool),
            _ => None,
        }
    }

    /// The values of an update, prepared or not, as logged.
    pub(crate) fn update_values(&self) -> &[NewValue] {
        match self {
            WalOp::Update { values, .. } => values,
            WalOp::Prepare { op, .. } => op.update_values(),
            _ => &[],
        }
    }
}

/// SCM charged for one stored value.
pub(crate) fn value_scm(dkey: &[u8], akey: &[u8], inline_len: u64) -> u64 {
    REC_OVERHEAD + dkey.len() as u64 + akey.len() as u64 + inline_len
}

/// Space given back by a removal; device runs to return to the allocator.
#[derive(Default)]
pub(crate) struct Released {
    pub scm: u64,
    pub nvme: u64,
    pub runs: Vec<(u64, u64)>,
}

impl Released {
    fn version(&mut self, v: &Version) {
        self.scm += v.scm;
        self.nvme += v.nvme();
        if let Payload::Device(d) = &v.payload {
            self.runs.push((d.block, d.nblocks));
        }
    }
    fn tomb(&mut self, t: &Tomb) {
        self.scm += t.scm;
    }
    fn akey(&mut self, a: &AkeyTree) {
        a.singles.values().for_each(|v| self.version(v));
        a.extents.iter().for_each(|v| self.version(v));
        a.punches.iter().for_each(|t| self.tomb(t));
    }
    fn cont(&mut self, c: &ContTree) {
        for o in c.objs.values() {
            o.punches.iter().for_each(|t| self.tomb(t));
            for d in o.dkeys.values() {
                d.punches.iter().for_each(|t| self.tomb(t));
                d.akeys.values().for_each(|a| self.akey(a));
            }
        }
    }
}

/// Newest punch at or below `r`.
fn level_floor(p: &[Tomb], r: u64) -> Option<u64> {
    p.iter().map(|t| t.epoch).filter(|&e| e <= r).max()
}

/// Sorted, disjoint half-open intervals already covered by newer extents.
#[derive(Default)]
struct Covered(Vec<(u64, u64)>);

impl Covered {
    /// Parts of `[s, e)` not yet covered.
    fn gaps(&self, s: u64, e: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cur = s;
        for &(cs, ce) in &self.0 {
            if ce <= cur {
                continue;
            }
            if cs >= e {
                break;
            }
            if cs > cur {
                out.push((cur, cs.min(e)));
            }
            cur = cur.max(ce);
            if cur >= e {
                break;
            }
        }
        if cur < e {
            out.push((cur, e));
        }
        out
    }
    fn add(&mut self, s: u64, e: u64) {
        if s >= e {
            return;
        }
        let mut ns = s;
        let mut ne = e;
        self.0.retain(|&(cs, ce)| {
            if ce < ns || cs > ne {
                true
            } else {
                ns = ns.min(cs);
                ne = ne.max(ce);
                false
            }
        });
        let pos = self.0.partition_point(|&(cs, _)| cs < ns);
        self.0.insert(pos, (ns, ne));
    }
}

/// Where fetched bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Src {
    Inline(Vec<u8>),
    Dev {
        ext: DevExtent,
        value_len: u64,
        value_off: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seg {
    pub out_off: u64,
    pub len: u64,
    pub src: Src,
}

/// What a fetch of one iod returns, before the device reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub status: i32,
    pub len: u64,
    pub size: u64,
    pub has_crc: bool,
    /// The bytes returned are exactly one value as written, whose client
    /// checksum (verified when it was stored) this is: no need to compute it.
    pub stored_crc: Option<u32>,
    pub segs: Vec<Seg>,
    /// Nothing of the iod's kind is visible at the epoch read (never
    /// written, or punched): an ARRAY's zeros are then not written zeros.
    pub absent: bool,
    /// The newest epoch of the versions the bytes come from, or of the
    /// punch hiding older ones, if later (0: none).
    pub epoch: u64,
}

impl AkeyTree {
    fn visible_single(&self, floor: Option<u64>, r: u64) -> Option<&Version> {
        let (&e, v) = self.singles.range(..=r).next_back()?;
        (Some(e) > floor).then_some(v)
    }
    /// Extents visible at `r` (oldest first): epochs in `(floor, r]`.
    fn visible_extents(&self, floor: Option<u64>, r: u64) -> &[Version] {
        let lo = self.extents.partition_point(|x| Some(x.epoch) <= floor);
        let hi = self.extents.partition_point(|x| x.epoch <= r);
        &self.extents[lo..hi.max(lo)]
    }
    fn array_size(&self, floor: Option<u64>, r: u64) -> u64 {
        self.visible_extents(floor, r)
            .iter()
            .filter(|x| x.len > 0)
            .map(|x| x.offset + x.len)
            .max()
            .unwrap_or(0)
    }
    fn exists(&self, floor: Option<u64>, r: u64) -> bool {
        self.visible_single(floor, r).is_some() || !self.visible_extents(floor, r).is_empty()
    }
    /// Newest epoch of any of its versions or punches.
    fn newest(&self) -> Option<u64> {
        let s = self.singles.keys().next_back().copied();
        // Extents are sorted by epoch.
        let x = self.extents.last().map(|x| x.epoch);
        s.max(x).max(self.punches.iter().map(|t| t.epoch).max())
    }
    fn min_epoch(&self) -> Option<u64> {
        let s = self.singles.keys().next().copied();
        let x = self.extents.first().map(|x| x.epoch);
        s.into_iter().chain(x).min()
    }
}

fn dkey_exists(d: &DkeyTree, obj_floor: Option<u64>, r: u64) -> bool {
    let df = obj_floor.max(level_floor(&d.punches, r));
    d.akeys
        .values()
        .any(|a| a.exists(df.max(level_floor(&a.punches, r)), r))
}

/// Whether a dkey holds a version or a punch (dkey or akey level) above `since`.
fn dkey_changed(d: &DkeyTree, since: u64) -> bool {
    d.punches.iter().any(|t| t.epoch > since) || d.akeys.values().any(|a| a.newest() > Some(since))
}

/// Epochs of `tombs` above `since`, ascending, each once.
fn tomb_epochs(tombs: &[Tomb], since: u64) -> Vec<u64> {
    let mut e: Vec<u64> = tombs
        .iter()
        .map(|t| t.epoch)
        .filter(|&e| e > since)
        .collect();
    e.sort_unstable();
    e.dedup();
    e
}

fn punch_record(kind: data::RecordKind, epoch: u64, akey: &[u8]) -> data::Record {
    data::Record {
        kind: kind as i32,
        epoch,
        akey: akey.to_vec(),
        ..Default::default()
    }
}

/// A page of [`TargetIndex::list_changed`]: the keys found in the trees,
/// merged in order with the keys of held changes.
struct Page {
    keys: Vec<ChangedKey>,
    max: usize,
    /// Keys with held changes not listed yet, ascending.
    held: std::iter::Peekable<std::vec::IntoIter<ChangedKey>>,
}

impl Page {
    /// List `k` after the held keys before it. Ok(()) while more may come;
    /// Err(()) once a key beyond `max` turned up.
    fn push(&mut self, k: ChangedKey) -> Result<(), ()> {
        while let Some(h) = self.held.next_if(|h| *h <= k) {
            if h != k {
                self.add(h)?;
            }
        }
        self.add(k)
    }
    fn add(&mut self, k: ChangedKey) -> Result<(), ()> {
        if self.keys.len() == self.max {
            return Err(());
        }
        self.keys.push(k);
        Ok(())
    }
    /// The held keys after the last key of the trees; whether all fit.
    fn finish(mut self) -> (Vec<ChangedKey>, bool) {
        while let Some(h) = self.held.next() {
            if self.add(h).is_err() {
                return (self.keys, false);
            }
        }
        (self.keys, true)
    }
}

/// Keys of `map` strictly after `anchor` for which `visible` holds: up to
/// `max`, and whether the listing is complete.
fn list_keys<'a, V: 'a>(
    map: &'a SmallMap<Key, V>,
    anchor: &[u8],
    max: usize,
    visible: impl Fn(&V) -> bool,
) -> (Vec<Vec<u8>>, bool) {
    let start = if anchor.is_empty() {
        Bound::Unbounded
    } else {
        Bound::Excluded(anchor)
    };
    let mut keys = Vec::new();
    for (k, v) in map.range::<[u8], _>((start, Bound::Unbounded)) {
        if visible(v) {
            if keys.len() == max {
                return (keys, false);
            }
            keys.push(k.to_vec());
        }
    }
    (keys, true)
}

impl TargetIndex {
    pub(crate) fn cont(&self, pool: &Uuid, cont: &Uuid) -> Option<&ContTree> {
        self.pools.get(pool)?.conts.get(cont)
    }

    /// The akey at `r` with its effective punch floor.
    fn akey_at(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
        r: u64,
    ) -> Option<(&AkeyTree, Option<u64>)> {
        let o = self.cont(pool, cont)?.objs.get(obj)?;
        let d = o.dkeys.get(dkey)?;
        let a = d.akeys.get(akey)?;
        let floor = level_floor(&o.punches, r)
            .max(level_floor(&d.punches, r))
            .max(level_floor(&a.punches, r));
        Some((a, floor))
    }

    /// What decides whether an akey has a visible value at the latest
    /// epoch: the newest epoch of any of its versions and the newest punch
    /// covering it (object, dkey or akey level). It is visible at the latest
    /// epoch exactly when the first is above the second (a punch hides its
    /// own epoch). Both only grow as changes apply, so the state after
    /// further changes is the maximum of each.
    pub(crate) fn akey_latest(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
    ) -> (Option<u64>, Option<u64>) {
        let Some(o) = self.cont(pool, cont).and_then(|c| c.objs.get(obj)) else {
            return (None, None);
        };
        let r = u64::MAX;
        let of = level_floor(&o.punches, r);
        let Some(d) = o.dkeys.get(dkey) else {
            return (None, of);
        };
        let df = of.max(level_floor(&d.punches, r));
        let Some(a) = d.akeys.get(akey) else {
            return (None, df);
        };
        let newest = a
            .singles
            .keys()
            .next_back()
            .copied()
            .max(a.extents.iter().map(|x| x.epoch).max());
        (newest, df.max(level_floor(&a.punches, r)))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan_fetch(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
        kind: Kind,
        offset: u64,
        len: u64,
        r: u64,
    ) -> Plan {
        let found = self.akey_at(pool, cont, obj, dkey, akey, r);
        match kind {
            Kind::Single => match found.and_then(|(a, f)| a.visible_single(f, r)) {
                None => Plan {
                    status: -libc::ENOENT,
                    len: 0,
                    size: 0,
                    has_crc: false,
                    stored_crc: None,
                    segs: vec![],
                    absent: true,
                    epoch: 0,
                },
                Some(v) => Plan {
                    status: 0,
                    len: v.len,
                    size: v.len,
                    has_crc: v.crc.is_some(),
                    stored_crc: v.crc,
                    segs: vec![Seg {
                        out_off: 0,
                        len: v.len,
                        src: src_of(v, 0, v.len),
                    }],
                    absent: false,
                    epoch: v.epoch,
                },
            },
            Kind::Array => {
                let mut plan = Plan {
                    status: 0,
                    len,
                    size: 0,
                    has_crc: false,
                    stored_crc: None,
                    segs: vec![],
                    absent: true,
                    epoch: 0,
                };
                let Some((a, f)) = found else { return plan };
                // A punch is a change too (see `newest_extent`).
                plan.epoch = f.unwrap_or(0);
                if len == 0 {
                    // No bytes: the newest change of the whole akey.
                    let newest = a
                        .extents
                        .iter()
                        .filter(|x| x.epoch <= r)
                        .map(|x| x.epoch)
                        .max();
                    plan.epoch = plan.epoch.max(newest.unwrap_or(0));
                }
                plan.absent = a.visible_extents(f, r).is_empty();
                plan.size = a.array_size(f, r);
                let end = offset.saturating_add(len);
                let mut cov = Covered::default();
                let mut all_crc = true;
                let mut exact: Option<Option<u32>> = None;
                for x in a.visible_extents(f, r).iter().rev() {
                    let (s, e) = (x.offset.max(offset), (x.offset + x.len).min(end));
                    if s >= e {
                        continue;
                    }
                    for (gs, ge) in cov.gaps(s, e) {
                        all_crc &= x.crc.is_some();
                        plan.epoch = plan.epoch.max(x.epoch);
                        // The newest piece is the whole request as written (and
                        // then the only piece), or the crc must be computed.
                        if exact.is_none() {
                            exact = Some(
                                (x.offset == offset && x.len == len)
                                    .then_some(x.crc)
                                    .flatten(),
                            );
                        }
                        plan.segs.push(Seg {
                            out_off: gs - offset,
                            len: ge - gs,
                            src: src_of(x, gs - x.offset, ge - gs),
                        });
                        cov.add(gs, ge);
                    }
                }
                plan.has_crc = all_crc && !plan.segs.is_empty();
                plan.stored_crc = exact.flatten();
                plan
            }
        }
    }

    /// Array size (or single value size) of an akey at `r`, and whether
    /// nothing of it is visible there (then the size is 0).
    pub(crate) fn query_size(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
        r: u64,
    ) -> (u64, bool) {
        match self.akey_at(pool, cont, obj, dkey, akey, r) {
            None => (0, true),
            Some((a, f)) => {
                let arr = a.array_size(f, r);
                let size = if arr > 0 {
                    arr
                } else {
                    a.visible_single(f, r).map_or(0, |v| v.len)
                };
                (size, !a.exists(f, r))
            }
        }
    }

    /// The newest change of bytes `[start, end)` of an array akey: the
    /// newest epoch of its extents overlapping them, visible or not, or of
    /// a punch covering it, if later. At the latest epoch this is what a
    /// fetch of the range reports as its epoch ([`Plan::epoch`]): the newest
    /// overlapping extent is visible there unless a later punch hides it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn newest_extent(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
        start: u64,
        end: u64,
    ) -> Option<u64> {
        let (a, floor) =
            self.akey_at(pool, cont, obj, dkey, akey, peregrine_proto::EPOCH_LATEST)?;
        a.extents
            .iter()
            .filter(|x| x.offset < end && start < x.offset + x.len)
            .map(|x| x.epoch)
            .max()
            .max(floor)
    }

    /// List dkeys (`dkey` empty) or the akeys of `dkey` visible at `r`, strictly after `anchor`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn list(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        anchor: &[u8],
        max: usize,
        r: u64,
    ) -> (Vec<Vec<u8>>, bool) {
        let Some(o) = self.cont(pool, cont).and_then(|c| c.objs.get(obj)) else {
            return (vec![], true);
        };
        let of = level_floor(&o.punches, r);
        if dkey.is_empty() {
            return list_keys(&o.dkeys, anchor, max, |d| dkey_exists(d, of, r));
        }
        let Some(d) = o.dkeys.get(dkey) else {
            return (vec![], true);
        };
        let df = of.max(level_floor(&d.punches, r));
        list_keys(&d.akeys, anchor, max, |a| {
            a.exists(df.max(level_floor(&a.punches, r)), r)
        })
    }

    /// Reintegration: the keys of `pool` strictly after `anchor`, in
    /// (container, object shard, dkey) order, whose dkey holds a version or
    /// a punch (dkey or akey level) above `since`, or whose object holds a
    /// punch above `since` (then every dkey of it counts; an object left
    /// with no dkeys is listed once, with an empty dkey). At most `max` keys
    /// (0: [`LIST_CHANGED_DEFAULT`], capped at [`LIST_CHANGED_MAX`]), and
    /// whether the listing is complete. An unknown pool lists nothing.
    /// Every key with a change held by a transaction is listed too, whatever
    /// its epoch (a held punch of an object: its empty dkey), so that
    /// reintegration comes back to it.
    ///
    /// It scans every dkey after the anchor until `max` keys are found
    /// (one comparison of epochs per version and punch): nothing is kept
    /// for it in the index.
    pub(crate) fn list_changed(
        &self,
        pool: &Uuid,
        since: u64,
        anchor: Option<&ChangedKey>,
        max: usize,
    ) -> (Vec<ChangedKey>, bool) {
        let max = match max {
            0 => LIST_CHANGED_DEFAULT,
            m => m.min(LIST_CHANGED_MAX),
        };
        let Some(p) = self.pools.get(pool) else {
            return (vec![], true);
        };
        let mut page = Page {
            keys: Vec::new(),
            max,
            held: self.dtx.held_keys(pool, anchor).into_iter().peekable(),
        };
        let from = anchor.map_or(Bound::Unbounded, |(c, _, _)| Bound::Included(*c));
        for (cid, c) in p.conts.range((from, Bound::Unbounded)) {
            let at = anchor.filter(|(ac, _, _)| ac == cid);
            let from = at.map_or(Bound::Unbounded, |(_, o, _)| Bound::Included(*o));
            for (ok, o) in c.objs.range((from, Bound::Unbounded)) {
                // The anchor's dkey, when the anchor is in this object.
                let after = at.filter(|(_, ao, _)| ao == ok).map(|(_, _, d)| d);
                let punched = o.punches.iter().any(|t| t.epoch > since);
                if o.dkeys.is_empty() {
                    // Its empty dkey sorts before any other: it is after
                    // the anchor only when the anchor is in another object.
                    if punched && after.is_none() && page.push((*cid, *ok, Vec::new())).is_err() {
                        return (page.keys, false);
                    }
                    continue;
                }
                let from = after.map_or(Bound::Unbounded, |d| Bound::Excluded(d.as_slice()));
                for (dk, d) in o.dkeys.range::<[u8], _>((from, Bound::Unbounded)) {
                    if (punched || dkey_changed(d, since))
                        && page.push((*cid, *ok, dk.to_vec())).is_err()
                    {
                        return (page.keys, false);
                    }
                }
            }
        }
        page.finish()
    }

    /// Reintegration: what one dkey holds above `since`. The object's
    /// punches (only these for an empty `dkey`), then the dkey's, then per
    /// akey (in key order) its punches and the versions still showing at
    /// least one byte at the latest epoch: the visible single value, and
    /// each array extent not wholly covered by newer ones (equal epochs:
    /// the later write covers). Each in ascending epoch order, extents of
    /// equal epoch in write order. More than [`MAX_RECORDS`] is `-E2BIG`.
    pub(crate) fn list_records(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        since: u64,
    ) -> Result<Vec<data::Record>, Errno> {
        use data::RecordKind as K;
        let Some(o) = self.cont(pool, cont).and_then(|c| c.objs.get(obj)) else {
            return Ok(vec![]);
        };
        let too_many = || {
            Errno::new(
                -libc::E2BIG,
                format!(
                    "list records: dkey {:?} holds more than {MAX_RECORDS} records above epoch {since}",
                    String::from_utf8_lossy(dkey)
                ),
            )
        };
        let mut out = Vec::new();
        let add = |out: &mut Vec<data::Record>, r: data::Record| {
            if out.len() == MAX_RECORDS {
                return Err(too_many());
            }
            out.push(r);
            Ok(())
        };
        for e in tomb_epochs(&o.punches, since) {
            add(&mut out, punch_record(K::RecordPunchObject, e, b""))?;
        }
        let Some(d) = (!dkey.is_empty()).then(|| o.dkeys.get(dkey)).flatten() else {
            return Ok(out);
        };
        for e in tomb_epochs(&d.punches, since) {
            add(&mut out, punch_record(K::RecordPunchDkey, e, b""))?;
        }
        let r = u64::MAX;
        let df = level_floor(&o.punches, r).max(level_floor(&d.punches, r));
        for (ak, a) in &d.akeys {
            if a.newest() <= Some(since) {
                continue;
            }
            for e in tomb_epochs(&a.punches, since) {
                add(&mut out, punch_record(K::RecordPunchAkey, e, ak))?;
            }
            let f = df.max(level_floor(&a.punches, r));
            if let Some(v) = a.visible_single(f, r).filter(|v| v.epoch > since) {
                let rec = data::Record {
                    kind: K::RecordValue as i32,
                    epoch: v.epoch,
                    akey: ak.to_vec(),
                    value_kind: data::ValueKind::Single as i32,
                    offset: 0,
                    len: v.len,
                };
                add(&mut out, rec)?;
            }
            // Newest first: what newer extents (and later writes of the
            // same epoch) cover is not visible.
            let mut cov = Covered::default();
            let mut shown = Vec::new();
            for x in a.visible_extents(f, r).iter().rev() {
                if x.epoch <= since {
                    break;
                }
                let (s, e) = (x.offset, x.offset + x.len);
                if cov.gaps(s, e).is_empty() {
                    continue;
                }
                cov.add(s, e);
                shown.push(x);
            }
            for x in shown.into_iter().rev() {
                let rec = data::Record {
                    kind: K::RecordValue as i32,
                    epoch: x.epoch,
                    akey: ak.to_vec(),
                    value_kind: data::ValueKind::Array as i32,
                    offset: x.offset,
                    len: x.len,
                };
                add(&mut out, rec)?;
            }
        }
        Ok(out)
    }

    /// Apply one durable change. Device runs it frees go to `rel.runs`; the
    /// caller returns them to the allocator only now, after durability.
    pub(crate) fn apply(&mut self, op: WalOp, rel: &mut Released) {
        match op {
            WalOp::PoolCreate { pool, scm, nvme } => {
                self.pools.entry(pool).or_insert(PoolTree {
                    scm_total: scm,
                    nvme_total: nvme,
                    conts: BTreeMap::new(),
                });
            }
            WalOp::PoolDestroy { pool } => {
                if let Some(p) = self.pools.remove(&pool) {
                    p.conts.values().for_each(|c| rel.cont(c));
                }
                self.dtx.drop_pool(pool, rel);
            }
            WalOp::ContDestroy { pool, cont } => {
                if let Some(c) = self
                    .pools
                    .get_mut(&pool)
                    .and_then(|p| p.conts.remove(&cont))
                {
                    rel.cont(&c);
                }
                self.dtx.drop_cont(pool, cont, rel);
            }
            WalOp::SetSnapshots {
                pool,
                cont,
                mut epochs,
            } => {
                if let Some(p) = self.pools.get_mut(&pool) {
                    epochs.sort_unstable();
                    epochs.dedup();
                    p.conts.entry(cont).or_default().snapshots = epochs;
                }
            }
            WalOp::Update {
                pool,
                cont,
                obj,
                dkey,
                epoch,
                values,
            } => {
                let Some(p) = self.pools.get_mut(&pool) else {
                    return;
                };
                let c = p.conts.entry(cont).or_default();
                let d = c
                    .objs
                    .entry(obj)
                    .or_default()
                    .dkeys
                    .entry_or_default(Key::new(&dkey));
                let mut add = Released::default();
                let mut old = Released::default();
                for nv in values {
                    let inline = match &nv.payload {
                        Payload::Inline(b) => b.len() as u64,
                        Payload::Device(_) => 0,
                    };
                    let v = Version {
                        epoch,
                        offset: nv.offset,
                        len: nv.len,
                        crc: nv.crc,
                        scm: value_scm(&dkey, &nv.akey, inline),
                        payload: nv.payload,
                    };
                    add.version(&v);
                    let a = d.akeys.entry_or_default(Key::from(nv.akey));
                    match nv.kind {
                        Kind::Single => {
                            // Same epoch: the new value replaces the old one in place.
                            if let Some(prev) = a.singles.insert(epoch, v) {
                                old.version(&prev);
                            }
                        }
                        Kind::Array => {
                            let pos = a.extents.partition_point(|x| x.epoch <= epoch);
                            // Room for exactly one more (a first push makes room for 4).
                            a.extents.reserve_exact(1);
                            a.extents.insert(pos, v);
                        }
                    }
                }
                c.scm_used = c.scm_used + add.scm - old.scm;
                c.nvme_used = c.nvme_used + add.nvme - old.nvme;
                rel.scm += old.scm;
                rel.nvme += old.nvme;
                rel.runs.extend(old.runs);
            }
            WalOp::Punch {
                pool,
                cont,
                obj,
                dkey,
                akeys,
                epoch,
            } => {
                let Some(p) = self.pools.get_mut(&pool) else {
                    return;
                };
                // A punch of what this target does not hold (yet) is kept
                // all the same: a version below it may still come (the
                // whole copy to a returning target writes the punch before
                // the versions it hides; a client's retry; a late commit).
                let c = p.conts.entry(cont).or_default();
                let o = c.objs.entry(obj).or_default();
                let mut charged = 0;
                if dkey.is_empty() {
                    o.punches.reserve_exact(1);
                    o.punches.push(Tomb {
                        epoch,
                        scm: REC_OVERHEAD,
                    });
                    charged += REC_OVERHEAD;
                } else {
                    let d = o.dkeys.entry_or_default(Key::new(&dkey));
                    if akeys.is_empty() {
                        let scm = REC_OVERHEAD + dkey.len() as u64;
                        d.punches.reserve_exact(1);
                        d.punches.push(Tomb { epoch, scm });
                        charged += scm;
                    } else {
                        for ak in akeys {
                            let scm = value_scm(&dkey, &ak, 0);
                            let a = d.akeys.entry_or_default(Key::from(ak));
                            a.punches.reserve_exact(1);
                            a.punches.push(Tomb { epoch, scm });
                            charged += scm;
                        }
                    }
                }
                c.scm_used += charged;
            }
            WalOp::Aggregate { pool } => self.aggregate(pool, u64::MAX, rel),
            WalOp::AggregateTo { pool, upto } => {
                self.aggregate(pool, upto, rel);
                self.aggregated_to = self.aggregated_to.max(upto);
            }
            WalOp::Flushed { .. } => {}
            WalOp::Prepare {
                id,
                shards,
                at_ms,
                op,
            } => {
                let live = match &*op {
                    WalOp::Update { pool, .. } | WalOp::Punch { pool, .. } => {
                        self.pools.contains_key(pool)
                    }
                    _ => false,
                };
                self.dtx.hold(id, shards, at_ms, *op, live, rel);
            }
            WalOp::Decide {
                pool,
                id,
                commit,
                at_ms,
            } => {
                for op in self.dtx.decide(pool, id, commit, at_ms, rel) {
                    self.apply(op, rel);
                }
            }
        }
    }

    fn aggregate(&mut self, pool: Uuid, upto: u64, rel: &mut Released) {
        if let Some(p) = self.pools.get_mut(&pool) {
            for c in p.conts.values_mut() {
                aggregate_cont(c, rel, upto);
            }
        }
    }

    /// Every device run the index references (to rebuild the allocator).
    pub(crate) fn device_runs(&self) -> Vec<(u64, u64)> {
        let mut rel = Released::default();
        for p in self.pools.values() {
            p.conts.values().for_each(|c| rel.cont(c));
        }
        self.dtx.device_runs(&mut rel);
        rel.runs
    }

    /// Recompute every container's usage from its records (after replay).
    pub(crate) fn recount(&mut self) {
        for p in self.pools.values_mut() {
            for c in p.conts.values_mut() {
                let mut rel = Released::default();
                rel.cont(c);
                c.scm_used = rel.scm;
                c.nvme_used = rel.nvme;
            }
        }
    }
}

fn src_of(v: &Version, value_off: u64, len: u64) -> Src {
    match &v.payload {
        Payload::Inline(b) => {
            Src::Inline(b[value_off as usize..(value_off + len) as usize].to_vec())
        }
        Payload::Device(ext) => Src::Dev {
            ext: ext.clone(),
            value_len: v.len,
            value_off,
        },
    }
}

/// Drop what no read at a snapshot or at any epoch from `upto` on can see:
/// every version above `upto` stays, and so does what a read at `upto` sees
/// (a version hidden at `upto` is hidden at every later epoch too).
fn aggregate_cont(c: &mut ContTree, rel: &mut Released, upto: u64) {
    let mut reads = c.snapshots.clone();
    reads.push(upto);
    let mut gone = Released::default();
    c.objs.retain(|_, o| {
        let ObjTree {
            dkeys,
            punches: opunch,
        } = o;
        dkeys.retain(|_, d| {
            let DkeyTree {
                akeys,
                punches: dpunch,
            } = d;
            akeys.retain(|_, a| {
                let floors: Vec<Option<u64>> = reads
                    .iter()
                    .map(|&r| {
                        level_floor(opunch, r)
                            .max(level_floor(dpunch, r))
                            .max(level_floor(&a.punches, r))
                    })
                    .collect();
                let mut keep_single: BTreeSet<u64> =
                    a.singles.keys().copied().filter(|&e| e > upto).collect();
                let mut keep_ext: Vec<bool> = a.extents.iter().map(|x| x.epoch > upto).collect();
                for (&r, &f) in reads.iter().zip(&floors) {
                    if let Some(v) = a.visible_single(f, r) {
                        keep_single.insert(v.epoch);
                    }
                    let lo = a.extents.partition_point(|x| Some(x.epoch) <= f);
                    let hi = a.extents.partition_point(|x| x.epoch <= r).max(lo);
                    let mut cov = Covered::default();
                    for j in (lo..hi).rev() {
                        let x = &a.extents[j];
                        let gaps = cov.gaps(x.offset, x.offset + x.len);
                        if !gaps.is_empty() {
                            keep_ext[j] = true;
                            gaps.into_iter().for_each(|(s, e)| cov.add(s, e));
                        }
                    }
                }
                // Above `upto` everything stays but an extent covered whole by
                // extents of its own epoch applied after it: no read at any
                // epoch or snapshot sees it (of one epoch the later write wins)
                // and no record listing shows it. Reintegration wrote such
                // twins when it copied what a target held already, and with
                // aggregation capped for that copy they stayed until the
                // target was full.
                let mut j = a.extents.len();
                while j > 0 && a.extents[j - 1].epoch > upto {
                    let epoch = a.extents[j - 1].epoch;
                    let mut cov = Covered::default();
                    while j > 0 && a.extents[j - 1].epoch == epoch {
                        j -= 1;
                        let x = &a.extents[j];
                        if cov.gaps(x.offset, x.offset + x.len).is_empty() {
                            keep_ext[j] = false;
                        } else {
                            cov.add(x.offset, x.offset + x.len);
                        }
                    }
                }
                a.singles.retain(|e, v| {
                    let keep = keep_single.contains(e);
                    if !keep {
                        gone.version(v);
                    }
                    keep
                });
                let mut keep_it = keep_ext.into_iter();
                a.extents.retain(|v| {
                    let keep = keep_it.next().unwrap_or(true);
                    if !keep {
                        gone.version(v);
                    }
                    keep
                });
                // A punch with nothing left at or below it hides nothing
                // now; above `upto` it stays all the same, for a version
                // below it may still come (a reintegration's copy, a
                // client's retry, a late commit).
                let min = a.min_epoch();
                a.punches.retain(|t| {
                    let keep = t.epoch > upto || min.is_some_and(|m| m <= t.epoch);
                    if !keep {
                        gone.tomb(t);
                    }
                    keep
                });
                !(a.singles.is_empty() && a.extents.is_empty() && a.punches.is_empty())
            });
            let min = akeys.values().filter_map(|a| a.min_epoch()).min();
            dpunch.retain(|t| {
                let keep = t.epoch > upto || min.is_some_and(|m| m <= t.epoch);
                if !keep {
                    gone.tomb(t);
                }
                keep
            });
            !(akeys.is_empty() && dpunch.is_empty())
        });
        let min = dkeys
            .values()
            .flat_map(|d| d.akeys.values())
            .filter_map(|a| a.min_epoch())
            .min();
        opunch.retain(|t| {
            let keep = t.epoch > upto || min.is_some_and(|m| m <= t.epoch);
            if !keep {
                gone.tomb(t);
            }
            keep
        });
        !(dkeys.is_empty() && opunch.is_empty())
    });
    c.scm_used -= gone.scm;
    c.nvme_used -= gone.nvme;
    rel.scm += gone.scm;
    rel.nvme += gone.nvme;
    rel.runs.extend(gone.runs);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(b: &[u8]) -> Payload {
        Payload::Inline(b.to_vec())
    }

    fn setup() -> (TargetIndex, Uuid, Uuid, ObjKey) {
        let mut ix = TargetIndex::default();
        let pool = Uuid::new_v4();
        ix.apply(
            WalOp::PoolCreate {
                pool,
                scm: 1 << 20,
                nvme: 1 << 20,
            },
            &mut Released::default(),
        );
        (
            ix,
            pool,
            Uuid::new_v4(),
            ObjKey {
                hi: 1,
                lo: 2,
                shard: 0,
            },
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn put(
        ix: &mut TargetIndex,
        pool: Uuid,
        cont: Uuid,
        obj: ObjKey,
        epoch: u64,
        kind: Kind,
        off: u64,
        b: &[u8],
    ) {
        ix.apply(
            WalOp::Update {
                pool,
                cont,
                obj,
                dkey: b"d".to_vec(),
                epoch,
                values: vec![NewValue {
                    akey: b"a".to_vec(),
                    kind,
                    offset: off,
                    len: b.len() as u64,
                    crc: None,
                    payload: inline(b),
                }],
            },
            &mut Released::default(),
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        ix: &TargetIndex,
        pool: Uuid,
        cont: Uuid,
        obj: ObjKey,
        kind: Kind,
        off: u64,
        len: u64,
        r: u64,
    ) -> (i32, Vec<u8>, u64) {
        let p = ix.plan_fetch(&pool, &cont, &obj, b"d", b"a", kind, off, len, r);
        let mut out = vec![0u8; p.len as usize];
        for s in p.segs {
            let Src::Inline(b) = s.src else { panic!() };
            out[s.out_off as usize..(s.out_off + s.len) as usize].copy_from_slice(&b);
        }
        (p.status, out, p.size)
    }

    #[test]
    fn array_overlaps_epochs_and_aggregation() {
        let (mut ix, pool, cont, obj) = setup();
        put(&mut ix, pool, cont, obj, 10, Kind::Array, 0, b"aaaaaaaa");
        put(&mut ix, pool, cont, obj, 20, Kind::Array, 2, b"bb");
        put(&mut ix, pool, cont, obj, 30, Kind::Array, 12, b"cc");
        assert_eq!(
            read(&ix, pool, cont, obj, Kind::Array, 0, 14, u64::MAX),
            (0, b"aabbaaaa\0\0\0\0cc".to_vec(), 14)
        );
        assert_eq!(
            read(&ix, pool, cont, obj, Kind::Array, 1, 4, 15),
            (0, b"aaaa".to_vec(), 8)
        );
        // Fully cover the first extent; with a snapshot at 15 it must stay.
        put(&mut ix, pool, cont, obj, 40, Kind::Array, 0, b"dddddddd");
        ix.apply(
            WalOp::SetSnapshots {
                pool,
                cont,
                epochs: vec![15],
            },
            &mut Released::default(),
        );
        let mut rel = Released::default();
        ix.apply(WalOp::Aggregate { pool }, &mut rel);
        let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
        assert_eq!(
            a.extents.iter().map(|x| x.epoch).collect::<Vec<_>>(),
            vec![10, 30, 40]
        );
        assert!(rel.scm > 0);
        assert_eq!(
            read(&ix, pool, cont, obj, Kind::Array, 0, 8, 15).1,
            b"aaaaaaaa"
        );
        ix.apply(
            WalOp::SetSnapshots {
                pool,
                cont,
                epochs: vec![],
            },
            &mut Released::default(),
        );
        ix.apply(WalOp::Aggregate { pool }, &mut Released::default());
        let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
        assert_eq!(
            a.extents.iter().map(|x| x.epoch).collect::<Vec<_>>(),
            vec![30, 40]
        );
    }

    /// Extents of one epoch written again over themselves (a reintegration
    /// copying what the target held) go at the next aggregation even above
    /// the epoch it runs up to, and reads do not change.
    #[test]
    fn aggregation_drops_extents_covered_by_later_ones_of_their_epoch() {
        let (mut ix, pool, cont, obj) = setup();
        put(&mut ix, pool, cont, obj, 10, Kind::Array, 0, b"aaaaaaaa");
        put(&mut ix, pool, cont, obj, 20, Kind::Array, 0, b"bbbbbbbb");
        // The same update again, in two halves, twice; then a part of epoch
        // 20 that covers nothing whole.
        for _ in 0..2 {
            put(&mut ix, pool, cont, obj, 20, Kind::Array, 0, b"bbbb");
            put(&mut ix, pool, cont, obj, 20, Kind::Array, 4, b"bbbb");
        }
        put(&mut ix, pool, cont, obj, 20, Kind::Array, 6, b"bb");
        let before = |ix: &TargetIndex| {
            [5, 10, 19, 20, 25].map(|r| read(ix, pool, cont, obj, Kind::Array, 0, 8, r))
        };
        let seen = before(&ix);
        let used = ix.cont(&pool, &cont).unwrap().scm_used;
        let mut rel = Released::default();
        ix.apply(WalOp::AggregateTo { pool, upto: 15 }, &mut rel);
        let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
        assert_eq!(
            a.extents
                .iter()
                .map(|x| (x.epoch, x.offset, x.len))
                .collect::<Vec<_>>(),
            vec![(10, 0, 8), (20, 0, 4), (20, 4, 4), (20, 6, 2)],
            "below `upto` nothing is hidden yet at 10; of epoch 20 the last copy stays"
        );
        assert_eq!(rel.scm, 3 * (REC_OVERHEAD + 1 + 1) + 16);
        assert!(ix.cont(&pool, &cont).unwrap().scm_used < used);
        assert_eq!(before(&ix), seen, "reads at every epoch unchanged");
    }

    #[test]
    fn punch_hides_and_aggregation_drops_everything() {
        let (mut ix, pool, cont, obj) = setup();
        put(&mut ix, pool, cont, obj, 10, Kind::Single, 0, b"v1");
        put(&mut ix, pool, cont, obj, 20, Kind::Single, 0, b"v2");
        ix.apply(
            WalOp::Punch {
                pool,
                cont,
                obj,
                dkey: b"d".to_vec(),
                akeys: vec![],
                epoch: 30,
            },
            &mut Released::default(),
        );
        assert_eq!(read(&ix, pool, cont, obj, Kind::Single, 0, 0, 25).1, b"v2");
        assert_eq!(
            read(&ix, pool, cont, obj, Kind::Single, 0, 0, 30).0,
            -libc::ENOENT
        );
        assert_eq!(
            ix.list(&pool, &cont, &obj, b"", b"", 10, 25).0,
            vec![b"d".to_vec()]
        );
        assert!(ix.list(&pool, &cont, &obj, b"", b"", 10, 30).0.is_empty());
        put(&mut ix, pool, cont, obj, 40, Kind::Single, 0, b"v3");
        assert_eq!(
            read(&ix, pool, cont, obj, Kind::Single, 0, 0, u64::MAX).1,
            b"v3"
        );
        ix.apply(WalOp::Aggregate { pool }, &mut Released::default());
        let c = ix.cont(&pool, &cont).unwrap();
        let d = &c.objs[&obj].dkeys[&b"d"[..]];
        assert!(d.punches.is_empty(), "punch with nothing below is dropped");
        assert_eq!(d.akeys[&b"a"[..]].singles.len(), 1);
        let used = c.scm_used;
        ix.recount();
        assert_eq!(
            ix.cont(&pool, &cont).unwrap().scm_used,
            used,
            "incremental usage equals recount"
        );
    }

    /// A whole copy meets a punch before the version below it: the
    /// returning target took the punch (it was writable), aggregation ran
    /// with its horizon below both, and then the copy wrote the older
    /// version. The punch still hides it. (Aggregation dropped a punch
    /// above its horizon that had nothing below it yet, and the copied
    /// version showed through: the outage test read an EC cell of a
    /// punched array back as its version before the punch.)
    #[test]
    fn a_punch_above_the_horizon_stays_for_older_versions_yet_to_come() {
        let (mut ix, pool, cont, obj) = setup();
        let punch = |ix: &mut TargetIndex, akeys: Vec<Vec<u8>>, dkey: &[u8], epoch| {
            ix.apply(
                WalOp::Punch {
                    pool,
                    cont,
                    obj,
                    dkey: dkey.to_vec(),
                    akeys,
                    epoch,
                },
                &mut Released::default(),
            )
        };
        punch(&mut ix, vec![b"a".to_vec()], b"d", 30);
        ix.apply(
            WalOp::AggregateTo { pool, upto: 1 },
            &mut Released::default(),
        );
        put(&mut ix, pool, cont, obj, 20, Kind::Array, 0, b"stale!");
        let (status, _, size) = read(&ix, pool, cont, obj, Kind::Array, 0, 6, u64::MAX);
        assert!(
            status == -libc::ENOENT || size == 0,
            "the punch at 30 hides the version at 20 (status {status}, size {size})"
        );
        // The same for a punch of the dkey, and of the object.
        punch(&mut ix, vec![], b"d", 50);
        punch(&mut ix, vec![], b"", 70);
        ix.apply(
            WalOp::AggregateTo { pool, upto: 1 },
            &mut Released::default(),
        );
        let o = &ix.cont(&pool, &cont).unwrap().objs[&obj];
        assert_eq!(o.punches.len(), 1, "object punch kept");
        assert_eq!(o.dkeys[&b"d"[..]].punches.len(), 1, "dkey punch kept");
        // At or below the horizon a punch with nothing below it still goes.
        ix.apply(WalOp::Aggregate { pool }, &mut Released::default());
        assert!(ix.cont(&pool, &cont).unwrap().objs.is_empty());
    }

    #[test]
    fn aggregation_up_to_an_epoch_keeps_what_later_snapshots_read() {
        let (mut ix, pool, cont, obj) = setup();
        for (e, v) in [(10, b"v1"), (20, b"v2"), (30, b"v3"), (40, b"v4")] {
            put(&mut ix, pool, cont, obj, e, Kind::Single, 0, v);
            put(&mut ix, pool, cont, obj, e, Kind::Array, 0, &[v[1]; 8]);
        }
        let mut rel = Released::default();
        ix.apply(WalOp::AggregateTo { pool, upto: 25 }, &mut rel);
        assert_eq!(ix.aggregated_to, 25);
        let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
        // Hidden at 25 (and so at every later epoch): only v1 goes.
        assert_eq!(
            a.singles.keys().copied().collect::<Vec<_>>(),
            vec![20, 30, 40]
        );
        assert_eq!(
            a.extents.iter().map(|x| x.epoch).collect::<Vec<_>>(),
            vec![20, 30, 40]
        );
        assert!(rel.scm > 0);
        // A snapshot at 35, above the horizon, learnt only now, reads v3.
        ix.apply(
            WalOp::SetSnapshots {
                pool,
                cont,
                epochs: vec![35],
            },
            &mut Released::default(),
        );
        assert_eq!(read(&ix, pool, cont, obj, Kind::Single, 0, 0, 35).1, b"v3");
        assert_eq!(
            read(&ix, pool, cont, obj, Kind::Array, 0, 8, 35).1,
            vec![b'3'; 8]
        );
        ix.apply(
            WalOp::AggregateTo { pool, upto: 50 },
            &mut Released::default(),
        );
        let a = &ix.cont(&pool, &cont).unwrap().objs[&obj].dkeys[&b"d"[..]].akeys[&b"a"[..]];
        assert_eq!(a.singles.keys().copied().collect::<Vec<_>>(), vec![30, 40]);
        assert_eq!(read(&ix, pool, cont, obj, Kind::Single, 0, 0, 35).1, b"v3");
        // The horizon only grows (an older one replayed later does not lower it).
        ix.apply(
            WalOp::AggregateTo { pool, upto: 45 },
            &mut Released::default(),
        );
        assert_eq!(ix.aggregated_to, 50);
    }

    #[test]
    fn checkpoints_from_before_the_aggregation_horizon_decode() {
        let (ix, pool, _, _) = setup();
        let legacy = bincode::serialize(&ix.pools).unwrap();
        let back = TargetIndex::decode(&legacy).expect("legacy checkpoint");
        assert_eq!(back.aggregated_to, 0);
        assert!(back.pools.contains_key(&pool));
        let ix = TargetIndex {
            aggregated_to: 77,
            ..ix
        };
        assert_eq!(
            TargetIndex::decode(&bincode::serialize(&ix).unwrap()),
            Some(ix)
        );
        assert_eq!(TargetIndex::decode(b"\xff\xff"), None);
    }

    /// The compact trees (crate::compact) serialize exactly as the
    /// `BTreeMap<Vec<u8>, _>` trees and `Vec<u8>` values before them: a
    /// checkpoint of either kind loads in the other.
    #[test]
    fn checkpoints_keep_their_shape_across_the_compact_trees() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        enum OldPayload {
            Inline(Vec<u8>),
            Device(DevExtent),
        }
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct OldVersion {
            epoch: u64,
            offset: u64,
            len: u64,
            crc: Option<u32>,
            payload: OldPayload,
            scm: u64,
        }
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct OldAkey {
            singles: BTreeMap<u64, OldVersion>,
            extents: Vec<OldVersion>,
            punches: Vec<Tomb>,
        }
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct OldDkey {
            akeys: BTreeMap<Vec<u8>, OldAkey>,
            punches: Vec<Tomb>,
        }
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct OldObj {
            dkeys: BTreeMap<Vec<u8>, OldDkey>,
            punches: Vec<Tomb>,
        }
        let (mut ix, pool, cont, obj) = setup();
        // Names short and long (inline and boxed keys), one and many akeys
        // and dkeys (vector and tree maps), singles, extents and punches.
        for i in 0..20u64 {
            let dkey = if i % 3 == 0 {
                format!("a-long-dkey-name-past-the-inline-limit-{i}")
            } else {
                format!("d{i}")
            };
            let values: Vec<NewValue> = (0..1 + i % 12)
                .map(|j| NewValue {
                    akey: format!("akey{j}").into_bytes(),
                    kind: if j % 2 == 0 {
                        Kind::Single
                    } else {
                        Kind::Array
                    },
                    offset: j,
                    len: 3,
                    crc: Some(j as u32),
                    payload: if j == 3 {
                        Payload::Device(DevExtent {
                            block: 7,
                            nblocks: 1,
                            csums: vec![1, 2],
                        })
                    } else {
                        inline(b"xyz")
                    },
                })
                .collect();
            for epoch in [10 + i, 40 + i] {
                ix.apply(
                    WalOp::Update {
                        pool,
                        cont,
                        obj,
                        dkey: dkey.clone().into_bytes(),
                        epoch,
                        values: values.clone(),
                    },
                    &mut Released::default(),
                );
            }
            ix.apply(
                WalOp::Punch {
                    pool,
                    cont,
                    obj,
                    dkey: dkey.into_bytes(),
                    akeys: vec![b"akey0".to_vec()],
                    epoch: 30 + i,
                },
                &mut Released::default(),
            );
        }
        let o = &ix.cont(&pool, &cont).unwrap().objs[&obj];
        let enc = bincode::serialize(o).unwrap();
        let old: OldObj = bincode::deserialize(&enc).unwrap();
        assert_eq!(old.dkeys.len(), 20);
        assert_eq!(bincode::serialize(&old).unwrap(), enc, "same bytes");
        let back: ObjTree = bincode::deserialize(&enc).unwrap();
        assert_eq!(&back, o);
        let back = TargetIndex::decode(&bincode::serialize(&ix).unwrap()).unwrap();
        assert_eq!(back, ix);
    }

    #[test]
    fn checkpoints_from_before_transactions_decode() {
        #[derive(Serialize)]
        struct IndexBeforeDtx<'a> {
            pools: &'a BTreeMap<Uuid, PoolTree>,
            aggregated_to: u64,
        }
        let (mut ix, pool, cont, obj) = setup();
        put(&mut ix, pool, cont, obj, 10, Kind::Single, 0, b"v");
        let old = bincode::serialize(&IndexBeforeDtx {
            pools: &ix.pools,
            aggregated_to: 42,
        })
        .unwrap();
        let back = TargetIndex::decode(&old).expect("checkpoint before transactions");
        assert_eq!(back.aggregated_to, 42);
        assert_eq!(back.pools, ix.pools);
        assert_eq!(back.dtx, crate::dtx::DtxTable::default());

        // And the current format keeps the transactions, derived lookups rebuilt.
        let id = TxId { hi: 7, lo: 8 };
        ix.apply(
            WalOp::Prepare {
                id,
                shards: vec![(1, 2)],
                at_ms: 5,
                op: Box::new(WalOp::Punch {
                    pool,
                    cont,
                    obj,
                    dkey: b"d".to_vec(),
                    akeys: vec![],
                    epoch: 20,
                }),
            },
            &mut Released::default(),
        );
        let back = TargetIndex::decode(&bincode::serialize(&ix).unwrap()).unwrap();
        assert_eq!(back, ix);
        assert!(back
            .dtx
            .check_read("fetch", &pool, &cont, &obj, Some(b"d"), 20)
            .is_err());
    }

    #[test]
    fn list_changed_caps_pages_and_lists_punched_objects_without_dkeys() {
        let (mut ix, pool, cont, obj) = setup();
        let values = vec![NewValue {
            akey: b"a".to_vec(),
            kind: Kind::Single,
            offset: 0,
            len: 1,
            crc: None,
            payload: inline(b"v"),
        }];
        for i in 0..5000u32 {
            ix.apply(
                WalOp::Update {
                    pool,
                    cont,
                    obj,
                    dkey: format!("d{i:05}").into_bytes(),
                    epoch: 10,
                    values: values.clone(),
                },
                &mut Released::default(),
            );
        }
        let (keys, done) = ix.list_changed(&pool, 0, None, 0);
        assert_eq!((keys.len(), done), (LIST_CHANGED_DEFAULT, false));
        let (keys, done) = ix.list_changed(&pool, 0, None, 100_000);
        assert_eq!((keys.len(), done), (LIST_CHANGED_MAX, false));
        let (rest, done) = ix.list_changed(&pool, 0, keys.last(), 100_000);
        assert_eq!((rest.len(), done), (5000 - LIST_CHANGED_MAX, true));
        assert_eq!(rest[0].2, b"d04096");
        // Exactly `max` left: the page says it is the last.
        let (last, done) = ix.list_changed(&pool, 0, Some(&rest[3]), rest.len() - 4);
        assert_eq!((last.len(), done), (rest.len() - 4, true));
        assert!(ix.list_changed(&pool, 10, None, 0).0.is_empty());
        assert_eq!(ix.list_changed(&Uuid::new_v4(), 0, None, 0), (vec![], true));

        // An object punched with no dkeys left is listed once, empty dkey.
        let bare = ObjKey { lo: 1, ..obj };
        put(&mut ix, pool, cont, bare, 10, Kind::Single, 0, b"v");
        ix.apply(
            WalOp::Punch {
                pool,
                cont,
                obj: bare,
                dkey: vec![],
                akeys: vec![],
                epoch: 20,
            },
            &mut Released::default(),
        );
        let objs = &mut ix
            .pools
            .get_mut(&pool)
            .unwrap()
            .conts
            .get_mut(&cont)
            .unwrap()
            .objs;
        objs.get_mut(&bare).unwrap().dkeys.clear();
        let (keys, done) = ix.list_changed(&pool, 15, None, 0);
        assert_eq!((keys, done), (vec![(cont, bare, vec![])], true));
        let anchor = (cont, bare, vec![]);
        assert_eq!(ix.list_changed(&pool, 15, Some(&anchor), 0), (vec![], true));
        assert!(ix.list_changed(&pool, 20, None, 0).0.is_empty());
        assert_eq!(
            ix.list_records(&pool, &cont, &bare, b"", 15).unwrap(),
            vec![punch_record(data::RecordKind::RecordPunchObject, 20, b"")]
        );
    }

    #[test]
    fn list_records_refuses_more_than_the_cap() {
        let (mut ix, pool, cont, obj) = setup();
        let values = |n: usize| -> Vec<NewValue> {
            (0..n)
                .map(|i| NewValue {
                    akey: format!("a{i}").into_bytes(),
                    kind: Kind::Single,
                    offset: 0,
                    len: 1,
                    crc: None,
                    payload: inline(b"v"),
                })
                .collect()
        };
        ix.apply(
            WalOp::Update {
                pool,
                cont,
                obj,
                dkey: b"d".to_vec(),
                epoch: 10,
                values: values(MAX_RECORDS),
            },
            &mut Released::default(),
        );
        assert_eq!(
            ix.list_records(&pool, &cont, &obj, b"d", 0).unwrap().len(),
            MAX_RECORDS
        );
        ix.apply(
            WalOp::Punch {
                pool,
                cont,
                obj,
                dkey: b"d".to_vec(),
                akeys: vec![b"a7".to_vec()],
                epoch: 5,
            },
            &mut Released::default(),
        );
        let e = ix.list_records(&pool, &cont, &obj, b"d", 0).unwrap_err();
        assert_eq!(e.code, -libc::E2BIG);
        assert!(e.msg.contains("dkey \"d\""), "{}", e.msg);
        // Above the cap only when counted from `since`.
        assert_eq!(
            ix.list_records(&pool, &cont, &obj, b"d", 5).unwrap().len(),
            MAX_RECORDS
        );
    }

    #[test]
    fn covered_intervals() {
        let mut c = Covered::default();
        c.add(10, 20);
        c.add(30, 40);
        assert_eq!(c.gaps(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        c.add(15, 35);
        assert_eq!(c.0, vec![(10, 40)]);
        assert!(c.gaps(12, 38).is_empty());
    }
}
