//! Updates of several shards as one distributed transaction (as DAOS DTX):
//! all of them take effect, or none.
//!
//! 1. **Prepare**: every shard gets its update (or punch) with the
//!    transaction ([`data::Dtx`]: a random id and the shards, leader
//!    first). Engines log it and hold it: a read of its dkey answers
//!    `-EINPROGRESS` (retried) until it is decided, so no reader sees part of it.
//! 2. **Decide**: once every shard prepared, the leader is told to commit.
//!    Its durable record is the one decision; the update is acknowledged
//!    only after it. The leader's commit is checked against the pool map
//!    version like an update (`-ESTALE` aborts the try and the update is
//!    retried under the newer map), so no transaction prepared under an
//!    old map commits after a reintegration started copying.
//! 3. **Apply**: the leader's engine tells the other shards once its
//!    decision is durable (the client does not wait for that); until they
//!    hear, their reads of the dkey answer `-EINPROGRESS`. If that message
//!    is lost (the leader's engine dies, a shard is away), the shard's
//!    engine asks the leader after `peregrine_vos::DTX_STALE_MS` (the
//!    engine's resolver); a leader that holds a transaction undecided for
//!    `peregrine_vos::DTX_ABANDON_MS` aborts it, and one asked about a
//!    transaction it never saw records it as aborted, so a late
//!    prepare cannot commit it afterwards.
//!
//! A failed prepare aborts the transaction at the leader first (it is the
//! one that could commit it), then at the others. Retries of an operation
//! keep its epoch and bytes, so a transaction whose outcome was unknown
//! (the leader did not answer the commit) and a retry of it write the same
//! thing.

use crate::error::{Error, Result};
use crate::object::Object;
use crate::placement::{PoolMap, ShardLoc};
use peregrine_proto::data::{self, response::Body, Dtx, DtxDecideReq, DtxId, DtxShard};
use peregrine_proto::frame::Opcode;
use prost::Message;

/// Most shards one transaction spans (engines refuse more).
pub const MAX_SHARDS: usize = 64;

/// A fresh transaction over `shards` (the first is the leader).
fn new_dtx(map: &PoolMap, shards: &[ShardLoc]) -> Dtx {
    let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
    Dtx {
        id: Some(DtxId { hi, lo }),
        shards: shards
            .iter()
            .map(|l| {
                let t = &map.targets[l.target];
                DtxShard {
                    rank: t.rank,
                    target: t.index,
                }
            })
            .collect(),
    }
}

impl Object {
    /// Run `prepare` on every shard of `live` (in parallel) as one
    /// transaction, then decide it. One shard needs no transaction:
    /// `prepare` gets `None` and its update is applied at once.
    pub(crate) fn transact(
        &self,
        map: &PoolMap,
        live: &[ShardLoc],
        prepare: impl Fn(&ShardLoc, Option<&Dtx>) -> Result<()> + Sync,
    ) -> Result<()> {
        // Atomic per chunk only: an object punched over very many shards.
        live.chunks(MAX_SHARDS)
            .try_for_each(|c| self.transact_one(map, c, &prepare))
    }

    fn transact_one(
        &self,
        map: &PoolMap,
        live: &[ShardLoc],
        prepare: &(dyn Fn(&ShardLoc, Option<&Dtx>) -> Result<()> + Sync),
    ) -> Result<()> {
        if let [one] = live {
            return prepare(one, None);
        }
        let dtx = new_dtx(map, live);
        let id = dtx.id.expect("set by new_dtx");
        let prepared = crate::object::par_map(live, |l| prepare(l, Some(&dtx)));
        if let Some(e) = prepared.into_iter().find_map(|r| r.err()) {
            self.abort(map, live, &id);
            return Err(e);
        }
        let (leader, rest) = live.split_first().expect("two shards or more");
        if let Err(e) = self.commit_at_leader(map, leader, rest, &id) {
            return Err(match e.code {
                // Decided before the leader heard from this client (the
                // leader aborted it, or the map changed): nothing was applied
                // anywhere, and the caller's retry prepares afresh.
                c if c == -libc::ECANCELED || c == -libc::ESTALE => {
                    self.abort(map, live, &id);
                    Error::new(if c == -libc::ESTALE { c } else { -libc::EAGAIN }, e.msg)
                }
                // The leader may or may not have committed: leave the
                // outcome to it (the shards ask it); the retry writes the
                // same epoch and bytes under a new transaction.
                _ => e,
            });
        }
        Ok(())
    }

    /// Commit at the leader, whose engine then tells `rest` itself.
    fn commit_at_leader(
        &self,
        map: &PoolMap,
        leader: &ShardLoc,
        rest: &[ShardLoc],
        id: &DtxId,
    ) -> Result<()> {
        let req = DtxDecideReq {
            addr: Some(self.address(map, leader)),
            ids: vec![*id],
            commit: true,
            leader: true,
            notify: new_dtx(map, rest).shards,
        };
        self.call(map, leader, Opcode::DtxDecide, &req, &[])
            .map(|_| ())
            .map_err(|e| e.context(format!("commit transaction {:016x}{:016x}", id.hi, id.lo)))
    }

    /// Abort at the leader (the one that could commit it), then at the
    /// others; best effort (an engine that misses it asks the leader).
    fn abort(&self, map: &PoolMap, shards: &[ShardLoc], id: &DtxId) {
        let Some((leader, rest)) = shards.split_first() else {
            return;
        };
        let abort = |loc: &ShardLoc, leader: bool| {
            let req = DtxDecideReq {
                addr: Some(self.address(map, loc)),
                ids: vec![*id],
                commit: false,
                leader,
                notify: Vec::new(),
            };
            if let Err(e) = self.call(map, loc, Opcode::DtxDecide, &req, &[]) {
                tracing::debug!("aborting transaction {:016x}{:016x}: {e}", id.hi, id.lo);
            }
        };
        abort(leader, true);
        crate::object::par_map(rest, |l| abort(l, false));
    }
}

/// The state a shard reports for a transaction.
fn query_state(body: Option<Body>) -> Result<data::DtxState> {
    match body {
        Some(Body::DtxState(s)) => data::DtxState::try_from(s.state)
            .map_err(|_| Error::new(-libc::EPROTO, format!("unknown DTX state {}", s.state))),
        _ => Err(Error::new(
            -libc::EPROTO,
            "DTX query: reply without a state".to_string(),
        )),
    }
}

/// The target of `shard` in `map`, if the map has it.
pub fn target_of<'m>(map: &'m PoolMap, shard: &DtxShard) -> Option<&'m crate::placement::Target> {
    map.targets
        .iter()
        .find(|t| t.rank == shard.rank && t.index == shard.target)
}

/// Ask `shard` what it knows of transaction `id` of `map`'s pool (see
/// `DtxQueryReq.resolve`).
pub fn query(
    tr: &dyn crate::Transport,
    map: &PoolMap,
    shard: &DtxShard,
    id: &DtxId,
    resolve: bool,
) -> Result<data::DtxState> {
    let at = || {
        format!(
            "pool {:?} rank {} target {}",
            map.name(),
            shard.rank,
            shard.target
        )
    };
    let t = target_of(map, shard).ok_or_else(|| {
        Error::new(
            -libc::ENOENT,
            format!("{}: not in pool map version {}", at(), map.version),
        )
    })?;
    let req = data::DtxQueryReq {
        addr: Some(data::Address {
            pool: map.uuid.as_bytes().to_vec(),
            target: shard.target,
            map_version: map.version,
            ..Default::default()
        }),
        id: Some(*id),
        resolve,
    };
    let reply = tr
        .call(
            &t.addr,
            t.index,
            Opcode::DtxQuery,
            &req.encode_to_vec(),
            &[],
        )
        .map_err(|e| e.context(at()))?;
    query_state(crate::object::reply_body(&reply.msg, at)?)
}
