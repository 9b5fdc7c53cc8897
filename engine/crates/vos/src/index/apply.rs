//! The logged changes of a target ([`WalOp`]) and how the index applies
//! them ([`TargetIndex::apply`]): the only way the index changes, live or
//! in replay. A transaction's change is held in the [`crate::dtx`] table
//! until decided, then applied here.

use super::*;

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

    /// The pool of a change that may remove values (a punch, or a
    /// transaction's decision to commit, which may hold one): space that
    /// aggregation gives back.
    pub(crate) fn removing_pool(&self) -> Option<Uuid> {
        match self {
            WalOp::Punch { pool, .. }
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
    pub(super) fn version(&mut self, v: &Version) {
        self.scm += v.scm();
        self.nvme += v.nvme();
        if let Payload::Device(d) = &v.payload {
            self.runs.push((d.block, d.nblocks()));
        }
    }
    pub(super) fn tomb(&mut self, t: &Tomb) {
        self.scm += t.scm;
    }
    fn akey(&mut self, a: &AkeyTree) {
        a.singles.iter().for_each(|v| self.version(v));
        a.extents.iter().for_each(|v| self.version(v));
        a.punches.iter().for_each(|t| self.tomb(t));
    }
    pub(super) fn cont(&mut self, c: &ContTree) {
        for o in c.objs.values() {
            o.punches.iter().for_each(|t| self.tomb(t));
            for d in o.dkeys.values() {
                d.punches.iter().for_each(|t| self.tomb(t));
                d.akeys.values().for_each(|a| self.akey(a));
            }
        }
    }
}

impl TargetIndex {
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
                    .entry_or_default(obj)
                    .dkeys
                    .entry_or_default(Key::new(&dkey));
                let mut add = Released::default();
                let mut old = Released::default();
                for nv in values {
                    let inline = match &nv.payload {
                        Payload::Inline(b) => b.len() as u64,
                        Payload::Device(_) => 0,
                    };
                    let scm = value_scm(&dkey, &nv.akey, inline);
                    let v = Version::new(epoch, nv.offset, nv.len, nv.crc, nv.payload, scm);
                    add.version(&v);
                    let a = d.akeys.entry_or_default(ShortKey::from(nv.akey));
                    match nv.kind {
                        Kind::Single => {
                            // Same epoch: the new value replaces the old one in place.
                            if let Some(prev) = a.singles.insert(v) {
                                old.version(&prev);
                            }
                        }
                        Kind::Array => {
                            let pos = a.extents.partition_point(|x| x.epoch <= epoch);
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
                let o = c.objs.entry_or_default(obj);
                let mut charged = 0;
                if dkey.is_empty() {
                    o.punches.push(Tomb {
                        epoch,
                        scm: REC_OVERHEAD,
                    });
                    charged += REC_OVERHEAD;
                } else {
                    let d = o.dkeys.entry_or_default(Key::new(&dkey));
                    if akeys.is_empty() {
                        let scm = REC_OVERHEAD + dkey.len() as u64;
                        d.punches.push(Tomb { epoch, scm });
                        charged += scm;
                    } else {
                        for ak in akeys {
                            let scm = value_scm(&dkey, &ak, 0);
                            let a = d.akeys.entry_or_default(ShortKey::from(ak));
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
}
