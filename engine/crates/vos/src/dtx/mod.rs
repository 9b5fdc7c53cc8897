//! Distributed transactions (as DAOS DTX) on one target: the table of the
//! transactions it holds prepared and of those decided, and the decisions
//! the target takes on them (pure functions of the index and of the changes
//! in flight; the target logs what they return).
//!
//! Contract:
//! - A transaction is `(hi, lo)`, the same on every shard it touches. An
//!   update or punch naming one is *prepared*: logged and applied like any
//!   change ([`WalOp::Prepare`]), but held in [`DtxTable::pending`], invisible
//!   to reads, aggregation and the containers' usage, until a
//!   [`WalOp::Decide`] commits it (its ops are then applied as plain updates
//!   and punches, at their own epochs) or aborts it (their data blocks are
//!   freed). A decision is remembered in [`DtxTable::decided`] for
//!   [`DECIDED_KEEP_MS`] after the next decision, so that a late prepare of
//!   an aborted transaction is refused and a retried one of a committed
//!   transaction stores nothing twice.
//! - The state of a transaction counts the changes in flight (logged or
//!   gathered, not yet applied) after the index, in their order
//!   ([`state_with`](decisions::state_with)): a target answers from what
//!   it will hold once they are applied, as the conditional inserts do.
//! - A read (fetch, size query, list, list records) of a dkey with a held
//!   change at or below its epoch fails whole with `-EINPROGRESS`: the
//!   reader retries, or asks the transaction's leader to resolve it. A held
//!   punch of the whole object holds every dkey of it.
//! - Held ops keep their data blocks ([`DtxTable::device_runs`]) and count
//!   as used in their pool's space ([`DtxTable::held_space`]); a container
//!   is charged for them when they commit.
//! - Everything derived (the lookup by object, the space, the ages) is
//!   rebuilt from the serialized tables after a checkpoint is decoded
//!   ([`DtxTable::rebuild`]), and kept up to date by
//!   [`TargetIndex::apply`](crate::index::TargetIndex::apply).

mod decisions;
mod table;
#[cfg(test)]
mod tests;

use crate::index::{value_scm, Kind, ObjKey, Payload, Released, WalOp};
use crate::superblock::BLOCK;
pub(crate) use decisions::{admit, check_unchanged, decide, now_ms, parse, pending, query, Admit};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use uuid::Uuid;

/// A transaction held prepared this long (milliseconds) without its commit
/// is in doubt: the engine's resolver settles it (its client normally sends
/// the commit within a round trip of the last prepare).
pub const DTX_STALE_MS: u64 = 2000;
/// Most shards a transaction may list.
pub const MAX_SHARDS: usize = 64;
/// Most transactions one `DtxDecide` may name.
pub const MAX_DECIDE: usize = 1024;
/// How long (milliseconds, by the decisions' own clock) a decision is
/// remembered after it was taken.
pub(crate) const DECIDED_KEEP_MS: u64 = 3_600_000;
/// `DtxPendingReq.max` 0 lists this many.
pub(crate) const PENDING_DEFAULT: usize = 256;
/// `DtxPending` lists at most this many.
pub(crate) const PENDING_MAX: usize = 4096;

/// A transaction's id.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct TxId {
    pub hi: u64,
    pub lo: u64,
}

impl fmt::Display for TxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.hi, self.lo)
    }
}

/// The shards of a transaction as (rank, target), leader first, one entry
/// per change sent to the shard (see `Dtx.shards`).
pub(crate) type Shards = Vec<(u32, u32)>;

/// How many changes of a transaction over `shards` shard `me` must hold
/// to be prepared (transactions of before the count: each shard once).
fn expected_ops(shards: &Shards, me: (u32, u32)) -> usize {
    shards.iter().filter(|s| **s == me).count().max(1)
}

/// A transaction prepared here and not decided yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PendingDtx {
    pub pool: Uuid,
    pub shards: Shards,
    /// When its first op was logged (milliseconds since the Unix epoch).
    pub at_ms: u64,
    /// The updates and punches held, in the order they were prepared.
    pub ops: Vec<WalOp>,
}

/// What became of a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Decision {
    pub pool: Uuid,
    pub commit: bool,
    /// When it was logged (milliseconds since the Unix epoch).
    pub at_ms: u64,
}

/// A held change of one object: its dkey (empty: a punch of the object),
/// epoch and transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    dkey: Vec<u8>,
    epoch: u64,
    id: TxId,
}

/// The transactions of one target. Serialized in checkpoints; the fields
/// marked `serde(skip)` are derived ([`DtxTable::rebuild`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DtxTable {
    pub pending: BTreeMap<TxId, PendingDtx>,
    pub decided: BTreeMap<TxId, Decision>,
    /// Per pool, per (container, object): the held changes, for reads.
    #[serde(skip)]
    held: BTreeMap<Uuid, BTreeMap<(Uuid, ObjKey), Vec<Held>>>,
    /// Per pool: (scm, nvme) the held changes take.
    #[serde(skip)]
    space: HashMap<Uuid, (u64, u64)>,
    /// The decisions by age, for pruning.
    #[serde(skip)]
    by_age: BTreeSet<(u64, TxId)>,
}

/// Where an update or punch goes: pool, container, object, dkey, epoch.
type Loc<'a> = (&'a Uuid, &'a Uuid, &'a ObjKey, &'a [u8], u64);

fn loc(op: &WalOp) -> Option<Loc<'_>> {
    match op {
        WalOp::Update {
            pool,
            cont,
            obj,
            dkey,
            epoch,
            ..
        }
        | WalOp::Punch {
            pool,
            cont,
            obj,
            dkey,
            epoch,
            ..
        } => Some((pool, cont, obj, dkey, *epoch)),
        _ => None,
    }
}

/// What tells two prepared changes apart: a client retrying a prepare sends
/// the same location, epoch and kind again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpKey<'a> {
    pub pool: &'a Uuid,
    pub cont: &'a Uuid,
    pub obj: &'a ObjKey,
    pub dkey: &'a [u8],
    pub epoch: u64,
    pub punch: bool,
}

fn op_key(op: &WalOp) -> Option<OpKey<'_>> {
    let (pool, cont, obj, dkey, epoch) = loc(op)?;
    Some(OpKey {
        pool,
        cont,
        obj,
        dkey,
        epoch,
        punch: matches!(op, WalOp::Punch { .. }),
    })
}

/// (scm, nvme) a held change takes: what applying it would charge.
fn op_space(op: &WalOp) -> (u64, u64) {
    let WalOp::Update { dkey, values, .. } = op else {
        return (0, 0);
    };
    values.iter().fold((0, 0), |(s, n), v| match &v.payload {
        Payload::Inline(b) => (s + value_scm(dkey, &v.akey, b.len() as u64), n),
        Payload::Device(d) => (s + value_scm(dkey, &v.akey, 0), n + d.nblocks() * BLOCK),
    })
}

/// Give back the data blocks of a change that will never be applied.
fn release(op: &WalOp, rel: &mut Released) {
    if let WalOp::Update { values, .. } = op {
        for v in values {
            if let Payload::Device(d) = &v.payload {
                rel.runs.push((d.block, d.nblocks()));
            }
        }
    }
}

/// Whether an update or punch changes `akey` of the dkey.
/// Whether `op` changes `akey` of the dkey at `at` within bytes
/// `[start, end)` (an ARRAY extent overlapping them, any SINGLE value, any punch).
pub(crate) fn touches_range(
    op: &WalOp,
    at: (&Uuid, &Uuid, &ObjKey, &[u8]),
    akey: &[u8],
    start: u64,
    end: u64,
) -> bool {
    match op {
        WalOp::Update {
            pool,
            cont,
            obj,
            dkey,
            values,
            ..
        } => {
            (pool, cont, obj, dkey.as_slice()) == at
                && values.iter().any(|v| {
                    v.akey == akey
                        && (v.kind != Kind::Array
                            || (v.offset < end && v.offset.saturating_add(v.len) > start))
                })
        }
        WalOp::Punch {
            pool,
            cont,
            obj,
            dkey,
            akeys,
            ..
        } => {
            (pool, cont, obj) == (at.0, at.1, at.2)
                && (dkey.is_empty()
                    || (dkey.as_slice() == at.3
                        && (akeys.is_empty() || akeys.iter().any(|a| a == akey))))
        }
        _ => false,
    }
}

fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}
