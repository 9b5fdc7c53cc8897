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

use crate::compact::{ExactVec, Key, Packed, ShortKey, SmallMap, ThinVec};
use crate::dtx::{DtxTable, TxId};
use crate::error::Errno;
use crate::superblock::BLOCK;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use uuid::Uuid;

mod aggregate;
mod apply;
mod list;
mod read;
#[cfg(test)]
mod tests;
mod version;

pub(crate) use apply::{value_scm, NewValue, Released, WalOp};
use read::{dkey_exists, level_floor, Covered};
pub(crate) use read::{Seg, Src};
pub(crate) use version::{DevRun, Payload, Singles, Version};

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

pub(crate) use crate::request::ValueKind as Kind;

impl Version {
    fn nvme(&self) -> u64 {
        match &self.payload {
            Payload::Device(d) => d.nblocks() * BLOCK,
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
    pub singles: Singles,
    /// Sorted by epoch; equal epochs in write order.
    pub extents: ExactVec<Version>,
    pub punches: ThinVec<Tomb>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DkeyTree {
    pub akeys: SmallMap<ShortKey, AkeyTree>,
    pub punches: ThinVec<Tomb>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ObjTree {
    pub dkeys: SmallMap<Key, DkeyTree>,
    pub punches: ThinVec<Tomb>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct ObjKey {
    pub hi: u64,
    pub lo: u64,
    pub shard: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ContTree {
    pub objs: Packed<ObjKey, ObjTree>,
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

    /// Rebuild the object maps and the trees of dkeys with full nodes
    /// ([`Packed::repack`]): at each checkpoint, which walks the whole
    /// index anyway (decoding one builds them full already).
    pub(crate) fn repack(&mut self) {
        for c in self.pools.values_mut().flat_map(|p| p.conts.values_mut()) {
            c.objs.repack();
            c.objs.values_mut().for_each(|o| o.dkeys.repack());
        }
    }
}

impl TargetIndex {
    pub(crate) fn cont(&self, pool: &Uuid, cont: &Uuid) -> Option<&ContTree> {
        self.pools.get(pool)?.conts.get(cont)
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
