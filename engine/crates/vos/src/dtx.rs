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
//!   ([`state_with`]): a target answers from what it will hold once they are
//!   applied, as the conditional inserts do.
//! - A read (fetch, size query, list, list records) of a dkey with a held
//!   change at or below its epoch fails whole with `-EINPROGRESS`: the
//!   reader retries, or asks the transaction's leader to resolve it. A held
//!   punch of the whole object holds every dkey of it.
//! - Held ops keep their data blocks ([`DtxTable::device_runs`]) and count
//!   as used in their pool's space ([`DtxTable::held_space`]); a container
//!   is charged for them when they commit.
//! - Everything derived (the lookup by object, the space, the ages) is
//!   rebuilt from the serialized tables after a checkpoint is decoded
//!   ([`DtxTable::rebuild`]), and kept up to date by [`TargetIndex::apply`].

use crate::error::Errno;
use crate::index::{value_scm, ChangedKey, Kind, ObjKey, Payload, Released, TargetIndex, WalOp};
use crate::superblock::BLOCK;
use peregrine_proto::data::{self, DtxState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use uuid::Uuid;

/// A transaction held prepared this long (milliseconds) without its commit
/// is in doubt: the engine's resolver settles it (its client normally sends
/// the commit within a round trip of the last prepare).
pub const DTX_STALE_MS: u64 = 2000;
/// Most shards a transaction may list.
pub(crate) const MAX_SHARDS: usize = 64;
/// Most transactions one `DtxDecide` may name.
pub(crate) const MAX_DECIDE: usize = 1024;
/// How long (milliseconds, by the decisions' own clock) a decision is
/// remembered after it was taken.
pub(crate) const DECIDED_KEEP_MS: u64 = 3_600_000;
/// `DtxPendingReq.max` 0 lists this many.
pub(crate) const PENDING_DEFAULT: usize = 256;
/// `DtxPending` lists at most this many.
pub(crate) const PENDING_MAX: usize = 4096;

/// A transaction's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct TxId {
    pub hi: u64,
    pub lo: u64,
}

impl fmt::Display for TxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.hi, self.lo)
    }
}

impl From<&data::DtxId> for TxId {
    fn from(d: &data::DtxId) -> TxId {
        TxId { hi: d.hi, lo: d.lo }
    }
}

impl From<TxId> for data::DtxId {
    fn from(t: TxId) -> data::DtxId {
        data::DtxId { hi: t.hi, lo: t.lo }
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
        Payload::Device(d) => (s + value_scm(dkey, &v.akey, 0), n + d.nblocks * BLOCK),
    })
}

/// Give back the data blocks of a change that will never be applied.
fn release(op: &WalOp, rel: &mut Released) {
    if let WalOp::Update { values, .. } = op {
        for v in values {
            if let Payload::Device(d) = &v.payload {
                rel.runs.push((d.block, d.nblocks));
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

impl DtxTable {
    /// What this target durably knows of `id`.
    pub(crate) fn state(&self, id: TxId) -> DtxState {
        match self.decided.get(&id) {
            Some(d) if d.commit => DtxState::DtxCommitted,
            Some(_) => DtxState::DtxAborted,
            None if self.pending.contains_key(&id) => DtxState::DtxPrepared,
            None => DtxState::DtxUnknown,
        }
    }

    /// Rebuild what is derived from `pending` and `decided` (after decoding).
    pub(crate) fn rebuild(&mut self) {
        self.held.clear();
        self.space.clear();
        self.by_age = self.decided.iter().map(|(id, d)| (d.at_ms, *id)).collect();
        let pending = std::mem::take(&mut self.pending);
        for (id, p) in &pending {
            p.ops.iter().for_each(|op| self.note(*id, op));
        }
        self.pending = pending;
    }

    /// Add a held change to the derived lookups.
    fn note(&mut self, id: TxId, op: &WalOp) {
        let Some((pool, cont, obj, dkey, epoch)) = loc(op) else {
            return;
        };
        self.held
            .entry(*pool)
            .or_default()
            .entry((*cont, *obj))
            .or_default()
            .push(Held {
                dkey: dkey.to_vec(),
                epoch,
                id,
            });
        let (s, n) = op_space(op);
        let e = self.space.entry(*pool).or_default();
        e.0 += s;
        e.1 += n;
    }

    /// Remove a held change from the derived lookups.
    fn forget(&mut self, id: TxId, op: &WalOp) {
        let Some((pool, cont, obj, dkey, epoch)) = loc(op) else {
            return;
        };
        if let Some(objs) = self.held.get_mut(pool) {
            if let Some(hs) = objs.get_mut(&(*cont, *obj)) {
                if let Some(i) = hs
                    .iter()
                    .position(|h| h.id == id && h.epoch == epoch && h.dkey == dkey)
                {
                    hs.swap_remove(i);
                }
                if hs.is_empty() {
                    objs.remove(&(*cont, *obj));
                }
            }
            if objs.is_empty() {
                self.held.remove(pool);
            }
        }
        let (s, n) = op_space(op);
        if let Some(e) = self.space.get_mut(pool) {
            e.0 -= s;
            e.1 -= n;
        }
    }

    /// Apply of [`WalOp::Prepare`]: hold `op` (an update or a punch of a
    /// pool that exists: `live`), unless the transaction is decided already
    /// or holds an equal change (a retry): then its blocks go back.
    pub(crate) fn hold(
        &mut self,
        id: TxId,
        shards: Shards,
        at_ms: u64,
        op: WalOp,
        live: bool,
        rel: &mut Released,
    ) {
        let Some(key) = op_key(&op).filter(|_| live) else {
            release(&op, rel);
            return;
        };
        let pool = *key.pool;
        let held_equal = self
            .pending
            .get(&id)
            .is_some_and(|p| p.ops.iter().any(|o| op_key(o) == Some(key)));
        if self.decided.contains_key(&id) || held_equal {
            release(&op, rel);
            return;
        }
        self.note(id, &op);
        self.pending
            .entry(id)
            .or_insert_with(|| PendingDtx {
                pool,
                shards,
                at_ms,
                ops: Vec::new(),
            })
            .ops
            .push(op);
    }

    /// Apply of [`WalOp::Decide`]: record the decision (a transaction
    /// decided already keeps its first one) and forget decisions older than
    /// [`DECIDED_KEEP_MS`] before this one. Returns the held changes to
    /// apply (a commit); those of an abort give their blocks back.
    pub(crate) fn decide(
        &mut self,
        pool: Uuid,
        id: TxId,
        commit: bool,
        at_ms: u64,
        rel: &mut Released,
    ) -> Vec<WalOp> {
        if self.decided.contains_key(&id) {
            return Vec::new();
        }
        let ops = self.pending.remove(&id).map_or_else(Vec::new, |p| p.ops);
        ops.iter().for_each(|op| self.forget(id, op));
        self.decided.insert(
            id,
            Decision {
                pool,
                commit,
                at_ms,
            },
        );
        self.by_age.insert((at_ms, id));
        let horizon = at_ms.saturating_sub(DECIDED_KEEP_MS);
        while let Some(&(at, old)) = self.by_age.first() {
            if at >= horizon {
                break;
            }
            self.by_age.pop_first();
            self.decided.remove(&old);
        }
        if commit {
            ops
        } else {
            ops.iter().for_each(|op| release(op, rel));
            Vec::new()
        }
    }

    /// A pool is destroyed: its held changes go (their blocks back), and so
    /// do its decisions.
    pub(crate) fn drop_pool(&mut self, pool: Uuid, rel: &mut Released) {
        self.pending.retain(|_, p| {
            if p.pool != pool {
                return true;
            }
            p.ops.iter().for_each(|op| release(op, rel));
            false
        });
        self.decided.retain(|_, d| d.pool != pool);
        self.rebuild();
    }

    /// A container is destroyed: the held changes of it go (their blocks
    /// back); their transactions stay prepared, to be decided as usual.
    pub(crate) fn drop_cont(&mut self, pool: Uuid, cont: Uuid, rel: &mut Released) {
        let mut gone = false;
        for p in self.pending.values_mut().filter(|p| p.pool == pool) {
            p.ops.retain(|op| {
                let keep = loc(op).is_none_or(|(_, c, ..)| *c != cont);
                if !keep {
                    release(op, rel);
                    gone = true;
                }
                keep
            });
        }
        if gone {
            self.rebuild();
        }
    }

    /// Whether a change of the container is held.
    pub(crate) fn holds_cont(&self, pool: &Uuid, cont: &Uuid) -> bool {
        self.held
            .get(pool)
            .is_some_and(|m| m.keys().any(|(c, _)| c == cont))
    }

    /// The data blocks the held changes keep.
    pub(crate) fn device_runs(&self, rel: &mut Released) {
        for p in self.pending.values() {
            p.ops.iter().for_each(|op| release(op, rel));
        }
    }

    /// (scm, nvme) the held changes of `pool` take.
    /// The oldest epoch of a change held in `pool`: aggregation stays below
    /// it, so that change, once committed, is ordered against every version
    /// and punch as it would have been (a punch above it must still be there).
    pub(crate) fn oldest_held_epoch(&self, pool: &Uuid) -> Option<u64> {
        self.pending
            .values()
            .filter(|p| p.pool == *pool)
            .flat_map(|p| &p.ops)
            .filter_map(|op| match op {
                WalOp::Update { epoch, .. } | WalOp::Punch { epoch, .. } => Some(*epoch),
                _ => None,
            })
            .min()
    }

    pub(crate) fn held_space(&self, pool: &Uuid) -> (u64, u64) {
        self.space.get(pool).copied().unwrap_or_default()
    }

    /// Refuse a read at epoch `epoch` of `dkey` of the object (`None`: of
    /// any dkey, a list of the dkeys) while a change to it at or below that
    /// epoch is held: `-EINPROGRESS`, naming the dkey and the transaction.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_read(
        &self,
        op: &str,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: Option<&[u8]>,
        epoch: u64,
    ) -> Result<(), Errno> {
        let Some(held) = self.held.get(pool).and_then(|m| m.get(&(*cont, *obj))) else {
            return Ok(());
        };
        let hit = held
            .iter()
            .find(|h| h.epoch <= epoch && dkey.is_none_or(|d| h.dkey.is_empty() || h.dkey == d));
        match hit {
            None => Ok(()),
            Some(h) => {
                let what = if h.dkey.is_empty() {
                    "the object".to_string()
                } else {
                    format!("dkey {:?}", show(&h.dkey))
                };
                Err(Errno::new(
                    -libc::EINPROGRESS,
                    format!(
                        "{op}: dkey {:?}: transaction {} holds a change of {what} at epoch {} prepared and not decided yet; retry, or resolve the transaction",
                        show(dkey.unwrap_or(&h.dkey)),
                        h.id,
                        h.epoch
                    ),
                ))
            }
        }
    }

    /// The keys of `pool` with held changes, strictly after `anchor`, in
    /// (container, object, dkey) order, each once (a held punch of an
    /// object: its empty dkey).
    pub(crate) fn held_keys(&self, pool: &Uuid, anchor: Option<&ChangedKey>) -> Vec<ChangedKey> {
        let Some(objs) = self.held.get(pool) else {
            return Vec::new();
        };
        let keys: BTreeSet<ChangedKey> = objs
            .iter()
            .flat_map(|((c, o), hs)| hs.iter().map(move |h| (*c, *o, h.dkey.clone())))
            .filter(|k| anchor.is_none_or(|a| k > a))
            .collect();
        keys.into_iter().collect()
    }

    /// A transaction other than `own` holding a change of `akey` of the dkey.
    pub(crate) fn touched_by_other(
        &self,
        own: Option<TxId>,
        at: (&Uuid, &Uuid, &ObjKey, &[u8]),
        akey: &[u8],
        start: u64,
        end: u64,
    ) -> Option<TxId> {
        let held = self.held.get(at.0)?.get(&(*at.1, *at.2))?;
        held.iter()
            .filter(|h| Some(h.id) != own && (h.dkey.is_empty() || h.dkey == at.3))
            .map(|h| h.id)
            .find(|id| {
                self.pending.get(id).is_some_and(|p| {
                    p.ops
                        .iter()
                        .any(|op| touches_range(op, at, akey, start, end))
                })
            })
    }
}

/// Milliseconds since the Unix epoch, as logged in [`WalOp::Prepare`] and
/// [`WalOp::Decide`].
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The transaction of an update or punch, if it names one: its id and its
/// shards as (rank, target), checked (an id, 1 to [`MAX_SHARDS`] shards).
pub(crate) fn parse(dtx: Option<&data::Dtx>, op: &str) -> Result<Option<(TxId, Shards)>, Errno> {
    let Some(d) = dtx else {
        return Ok(None);
    };
    let id =
        d.id.as_ref()
            .ok_or_else(|| Errno::inval(format!("{op}: transaction without an id")))?;
    let id = TxId::from(id);
    if d.shards.is_empty() || d.shards.len() > MAX_SHARDS {
        return Err(Errno::inval(format!(
            "{op}: transaction {id} lists {} shards; it must list 1 to {MAX_SHARDS}",
            d.shards.len()
        )));
    }
    let shards = d.shards.iter().map(|s| (s.rank, s.target)).collect();
    Ok(Some((id, shards)))
}

/// The state `op`, applied after a change that left `id` in `st`, leaves it in.
fn next_state(st: DtxState, op: &WalOp, id: TxId) -> DtxState {
    match op {
        WalOp::Prepare { id: i, .. } if *i == id && st == DtxState::DtxUnknown => {
            DtxState::DtxPrepared
        }
        WalOp::Decide { id: i, commit, .. }
            if *i == id && matches!(st, DtxState::DtxUnknown | DtxState::DtxPrepared) =>
        {
            if *commit {
                DtxState::DtxCommitted
            } else {
                DtxState::DtxAborted
            }
        }
        _ => st,
    }
}

/// The state of `id` once the changes in flight (in their order) are
/// applied after the index.
pub(crate) fn state_with<'a>(
    ix: &TargetIndex,
    in_flight: impl IntoIterator<Item = &'a WalOp>,
    id: TxId,
) -> DtxState {
    in_flight
        .into_iter()
        .fold(ix.dtx.state(id), |st, op| next_state(st, op, id))
}

/// What to do with a prepared update or punch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Stage and log it as a [`WalOp::Prepare`].
    Stage,
    /// Nothing to store: its transaction is committed, or holds it already
    /// (a retry). `durable`: the index says so, not only changes in flight
    /// (then the reply waits for them).
    Known { durable: bool },
}

/// Whether to prepare a change (`key`) of transaction `id`: refused
/// (`-ECANCELED`) if the transaction was aborted.
pub(crate) fn admit<'a>(
    ix: &TargetIndex,
    in_flight: impl Iterator<Item = &'a WalOp> + Clone,
    id: TxId,
    key: &OpKey<'_>,
    op: &str,
) -> Result<Admit, Errno> {
    let durable = ix.dtx.state(id);
    match state_with(ix, in_flight.clone(), id) {
        DtxState::DtxAborted => Err(Errno::new(
            -libc::ECANCELED,
            format!("{op}: transaction {id} was aborted; nothing stored"),
        )),
        DtxState::DtxCommitted => Ok(Admit::Known {
            durable: durable == DtxState::DtxCommitted,
        }),
        _ => {
            let equal = |o: &WalOp| op_key(o) == Some(*key);
            if ix
                .dtx
                .pending
                .get(&id)
                .is_some_and(|p| p.ops.iter().any(equal))
            {
                return Ok(Admit::Known { durable: true });
            }
            let in_flight_equal = in_flight
                .into_iter()
                .any(|o| matches!(o, WalOp::Prepare { id: i, op, .. } if *i == id && equal(op)));
            Ok(if in_flight_equal {
                Admit::Known { durable: false }
            } else {
                Admit::Stage
            })
        }
    }
}

/// The decisions to log for a `DtxDecide` of `pool` (empty: nothing to
/// log), or the first error of its transactions (then nothing is logged).
pub(crate) fn decide<'a>(
    ix: &TargetIndex,
    in_flight: impl Iterator<Item = &'a WalOp> + Clone,
    pool: Uuid,
    target: u32,
    req: &data::DtxDecideReq,
    now: u64,
) -> Result<Vec<WalOp>, Errno> {
    use DtxState::*;
    const OP: &str = "dtx decide";
    if req.ids.len() > MAX_DECIDE {
        return Err(Errno::inval(format!(
            "{OP}: {} transactions named, at most {MAX_DECIDE} per request",
            req.ids.len()
        )));
    }
    let mut ops = Vec::new();
    for d in &req.ids {
        let id = TxId::from(d);
        // A transaction named twice is decided once.
        let st = ops
            .iter()
            .fold(state_with(ix, in_flight.clone(), id), |st, op| {
                next_state(st, op, id)
            });
        let log = match (req.commit, st) {
            (true, DtxPrepared) | (false, DtxPrepared | DtxUnknown) => true,
            (true, DtxCommitted) | (false, DtxAborted) => false,
            (true, DtxUnknown) if !req.leader => true,
            (true, DtxUnknown) => {
                return Err(Errno::new(
                    -libc::ENOENT,
                    format!("{OP}: transaction {id} unknown on this shard (target {target}); it cannot commit"),
                ))
            }
            (true, DtxAborted) => {
                return Err(Errno::new(
                    -libc::ECANCELED,
                    format!("{OP}: transaction {id} was aborted; it cannot commit"),
                ))
            }
            (false, DtxCommitted) => {
                return Err(Errno::new(
                    -libc::EEXIST,
                    format!("{OP}: transaction {id} already committed; it cannot abort"),
                ))
            }
        };
        if log {
            ops.push(WalOp::Decide {
                pool,
                id,
                commit: req.commit,
                at_ms: now,
            });
        }
    }
    Ok(ops)
}

/// The answer to a `DtxQuery` of `pool`, and the abort to log first, if
/// `resolve` decides one (the transaction is unknown here: a prepare still
/// on its way must be refused).
pub(crate) fn query<'a>(
    ix: &TargetIndex,
    in_flight: impl Iterator<Item = &'a WalOp> + Clone,
    pool: Uuid,
    me: (u32, u32),
    req: &data::DtxQueryReq,
    now: u64,
) -> Result<(DtxState, Option<WalOp>), Errno> {
    let id = req
        .id
        .as_ref()
        .map(TxId::from)
        .ok_or_else(|| Errno::inval("dtx query: missing transaction id"))?;
    let st = state_with(ix, in_flight.clone(), id);
    // Prepared with a change still missing: a prepare on its way is
    // refused once this is aborted, so the client cannot count it committed.
    let partial = st == DtxState::DtxPrepared && incomplete(ix, in_flight, id, me);
    let abort = req.resolve && (st == DtxState::DtxUnknown || partial);
    if !abort {
        return Ok((st, None));
    }
    let op = WalOp::Decide {
        pool,
        id,
        commit: false,
        at_ms: now,
    };
    Ok((DtxState::DtxAborted, Some(op)))
}

/// Whether shard `me` holds fewer changes of `id` (logged or in flight)
/// than the transaction's shards list names for it.
fn incomplete<'a>(
    ix: &TargetIndex,
    in_flight: impl Iterator<Item = &'a WalOp>,
    id: TxId,
    me: (u32, u32),
) -> bool {
    let Some(p) = ix.dtx.pending.get(&id) else {
        return false;
    };
    let arriving = in_flight
        .filter(|op| matches!(op, WalOp::Prepare { id: i, .. } if *i == id))
        .count();
    p.ops.len() + arriving < expected_ops(&p.shards, me)
}

/// The transactions of `pool` held prepared here for at least
/// `older_than_ms`, oldest first, at most `max` (0: [`PENDING_DEFAULT`],
/// capped at [`PENDING_MAX`]).
pub(crate) fn pending(
    ix: &TargetIndex,
    pool: &Uuid,
    me: (u32, u32),
    req: &data::DtxPendingReq,
    now: u64,
) -> data::DtxPendingResp {
    let max = match req.max {
        0 => PENDING_DEFAULT,
        m => (m as usize).min(PENDING_MAX),
    };
    let mut held: Vec<(&TxId, &PendingDtx)> = ix
        .dtx
        .pending
        .iter()
        .filter(|(_, p)| &p.pool == pool && now.saturating_sub(p.at_ms) >= req.older_than_ms)
        .collect();
    held.sort_by_key(|(id, p)| (p.at_ms, **id));
    held.truncate(max);
    let pending = held
        .into_iter()
        .map(|(id, p)| data::DtxPending {
            dtx: Some(data::Dtx {
                id: Some((*id).into()),
                shards: p
                    .shards
                    .iter()
                    .map(|&(rank, target)| data::DtxShard { rank, target })
                    .collect(),
            }),
            age_ms: now.saturating_sub(p.at_ms),
            incomplete: p.ops.len() < expected_ops(&p.shards, me),
        })
        .collect();
    data::DtxPendingResp { pending }
}

/// `Iod.unchanged_since` of an ARRAY value of an update to the dkey `at`
/// (of transaction `own`, if any): `-EBUSY` if a stored extent of the akey
/// overlapping the iod's range is newer than that epoch, or if a change of
/// the akey is in flight (logged or gathered, not applied yet) or held by
/// another transaction.
pub(crate) fn check_unchanged<'a>(
    ix: &TargetIndex,
    in_flight: impl Iterator<Item = &'a WalOp>,
    own: Option<TxId>,
    at: (&Uuid, &Uuid, &ObjKey, &[u8]),
    iod: &data::Iod,
) -> Result<(), Errno> {
    let since = iod.unchanged_since;
    let end = iod.offset.saturating_add(iod.len);
    let busy = |why: String| {
        Errno::new(
            -libc::EBUSY,
            format!(
                "update: dkey {:?} akey {:?} range [{}, {end}) changed since epoch {since}: {why}; nothing stored",
                show(at.3),
                show(&iod.akey),
                iod.offset
            ),
        )
    };
    let (pool, cont, obj, dkey) = at;
    if let Some(e) = ix
        .newest_extent(pool, cont, obj, dkey, &iod.akey, iod.offset, end)
        .filter(|&e| e > since)
    {
        return Err(busy(format!("an extent written at epoch {e} overlaps it")));
    }
    for op in in_flight {
        let (change, by) = match op {
            WalOp::Prepare { id, op, .. } => (&**op, Some(*id)),
            op => (op, None),
        };
        if by.is_some() && by == own {
            continue;
        }
        if touches_range(change, at, &iod.akey, iod.offset, end) {
            return Err(busy(match by {
                Some(id) => format!("transaction {id} is preparing a change of the akey"),
                None => "a change of the akey is being written".to_string(),
            }));
        }
    }
    if let Some(id) = ix.dtx.touched_by_other(own, at, &iod.akey, iod.offset, end) {
        return Err(busy(format!(
            "transaction {id} holds a prepared change of the akey"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{Kind, NewValue};

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

    fn prepare(pool: Uuid, cont: Uuid, obj: ObjKey, id: TxId, epoch: u64, block: u64) -> WalOp {
        WalOp::Prepare {
            id,
            shards: vec![(0, 0)],
            at_ms: 1000,
            op: Box::new(WalOp::Update {
                pool,
                cont,
                obj,
                dkey: b"d".to_vec(),
                epoch,
                values: vec![NewValue {
                    akey: b"a".to_vec(),
                    kind: Kind::Array,
                    offset: 0,
                    len: BLOCK,
                    crc: None,
                    payload: Payload::Device(crate::index::DevExtent {
                        block,
                        nblocks: 1,
                        csums: vec![0],
                    }),
                }],
            }),
        }
    }

    #[test]
    fn prepare_is_held_then_committed_or_aborted() {
        let (mut ix, pool, cont, obj) = setup();
        let (a, b) = (TxId { hi: 1, lo: 1 }, TxId { hi: 1, lo: 2 });
        let mut rel = Released::default();
        ix.apply(prepare(pool, cont, obj, a, 10, 5), &mut rel);
        ix.apply(prepare(pool, cont, obj, b, 20, 6), &mut rel);
        // A retry of the same change gives its blocks back.
        ix.apply(prepare(pool, cont, obj, a, 10, 7), &mut rel);
        assert_eq!(rel.runs, vec![(7, 1)]);
        assert_eq!(ix.device_runs(), vec![(5, 1), (6, 1)]);
        assert_eq!(ix.dtx.held_space(&pool).1, 2 * BLOCK);
        assert!(ix.cont(&pool, &cont).is_none(), "nothing applied yet");
        let e = ix
            .dtx
            .check_read("fetch", &pool, &cont, &obj, Some(b"d"), 15)
            .unwrap_err();
        assert_eq!(e.code, -libc::EINPROGRESS);
        assert!(e.msg.contains(&a.to_string()), "{}", e.msg);
        assert!(ix
            .dtx
            .check_read("fetch", &pool, &cont, &obj, Some(b"d"), 9)
            .is_ok());
        assert!(ix
            .dtx
            .check_read("fetch", &pool, &cont, &obj, Some(b"x"), 30)
            .is_ok());

        let mut rel = Released::default();
        ix.apply(
            WalOp::Decide {
                pool,
                id: a,
                commit: true,
                at_ms: 2000,
            },
            &mut rel,
        );
        assert!(rel.runs.is_empty());
        assert_eq!(ix.cont(&pool, &cont).unwrap().nvme_used, BLOCK);
        ix.apply(
            WalOp::Decide {
                pool,
                id: b,
                commit: false,
                at_ms: 2000,
            },
            &mut rel,
        );
        assert_eq!(rel.runs, vec![(6, 1)]);
        assert_eq!(ix.dtx.state(a), DtxState::DtxCommitted);
        assert_eq!(ix.dtx.state(b), DtxState::DtxAborted);
        assert_eq!(ix.dtx.held_space(&pool), (0, 0));
        // A late prepare of a decided transaction is not held.
        let mut rel = Released::default();
        ix.apply(prepare(pool, cont, obj, b, 20, 8), &mut rel);
        assert_eq!(rel.runs, vec![(8, 1)]);
        assert!(ix.dtx.pending.is_empty());

        // Decisions are forgotten an hour after a later one.
        ix.apply(
            WalOp::Decide {
                pool,
                id: TxId { hi: 9, lo: 9 },
                commit: false,
                at_ms: 2000 + DECIDED_KEEP_MS + 1,
            },
            &mut Released::default(),
        );
        assert_eq!(ix.dtx.decided.len(), 1);
        assert_eq!(ix.dtx.state(a), DtxState::DtxUnknown);
    }

    #[test]
    fn state_counts_changes_in_flight() {
        let (ix, pool, cont, obj) = setup();
        let id = TxId { hi: 3, lo: 4 };
        let p = prepare(pool, cont, obj, id, 10, 1);
        let d = WalOp::Decide {
            pool,
            id,
            commit: false,
            at_ms: 1,
        };
        assert_eq!(state_with(&ix, [], id), DtxState::DtxUnknown);
        assert_eq!(state_with(&ix, [&p], id), DtxState::DtxPrepared);
        assert_eq!(state_with(&ix, [&p, &d], id), DtxState::DtxAborted);
        assert_eq!(state_with(&ix, [&d, &p], id), DtxState::DtxAborted);
        let key = op_key(match &p {
            WalOp::Prepare { op, .. } => op,
            _ => unreachable!(),
        })
        .unwrap();
        assert_eq!(
            admit(&ix, [&p].into_iter(), id, &key, "update").unwrap(),
            Admit::Known { durable: false }
        );
        let e = admit(&ix, [&p, &d].into_iter(), id, &key, "update").unwrap_err();
        assert_eq!(e.code, -libc::ECANCELED);
    }
}
