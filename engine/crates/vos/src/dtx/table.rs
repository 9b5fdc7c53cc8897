//! The table of a target's transactions: what it holds prepared and has
//! decided, kept up to date change by change, and what reads see of it.

use super::{
    loc, op_key, op_space, release, show, touches_range, Decision, DtxTable, Held, PendingDtx,
    Shards, TxId, DECIDED_KEEP_MS,
};
use crate::error::Errno;
use crate::index::{ChangedKey, ObjKey, Released, WalOp};
use crate::request::DtxState;
use std::collections::BTreeSet;
use uuid::Uuid;

impl DtxTable {
    /// What this target durably knows of `id`.
    pub(crate) fn state(&self, id: TxId) -> DtxState {
        match self.decided.get(&id) {
            Some(d) if d.commit => DtxState::Committed,
            Some(_) => DtxState::Aborted,
            None if self.pending.contains_key(&id) => DtxState::Prepared,
            None => DtxState::Unknown,
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
