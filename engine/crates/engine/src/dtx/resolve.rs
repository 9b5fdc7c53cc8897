//! Transactions in doubt: what settles a transaction whose client stopped
//! driving it (it died before its commits went out, or a shard missed them).
//!
//! The rule (as DAOS's): a transaction is committed once every shard has
//! prepared it; the client acknowledges it then. So once a second this
//! engine lists the transactions its targets have held prepared for
//! [`peregrine_vos::DTX_STALE_MS`] and settles each:
//! - held by its leader here: the leader asks every other shard, with
//!   `resolve` (a shard that never saw it records it aborted, so a prepare
//!   still on its way is refused and the client cannot count it committed).
//!   Committed or aborted anywhere decides; all prepared means committed.
//!   A shard the pool map counts down does not count (reintegration brings
//!   it up to date); one that does not answer yet, does: wait.
//! - held with a change missing (a shard listed k times holds fewer than
//!   k): aborted at once, by whichever shard finds it so.
//! - otherwise the leader is asked: its decision is followed; while it holds
//!   the transaction undecided, it is the one settling it.
//! - a leader that does not answer and that the pool map counts down is
//!   replaced by the first up-and-in shard, which settles it the leader's
//!   way; the others follow that shard's answer.

use super::{addr, local, Maps};
use crate::node::Node;
use crate::request::dtx_pending;
use peregrine::placement::PoolMap;
use peregrine_proto::data::{DtxShard, DtxState};
use peregrine_vos::{Answer, DtxDecideReq, DtxPendingReq, Request, Storage, TxId};
use std::sync::Arc;
use std::time::Duration;

/// How often the transactions held prepared are looked at.
const ROUND: Duration = Duration::from_secs(1);

/// Start the resolver thread.
pub(super) fn spawn(node: Arc<Node>) {
    let r = std::thread::Builder::new()
        .name("dtx-resolver".into())
        .spawn(move || {
            let mut maps = Maps::default();
            loop {
                std::thread::sleep(ROUND);
                if let Ok(st) = node.storage() {
                    round(&node, &st, &mut maps);
                }
            }
        });
    if let Err(e) = r {
        tracing::error!("transaction resolver not started: {e}");
    }
}

fn round(node: &Node, st: &Storage, maps: &mut Maps) {
    for pool in st.pools() {
        for target in 0..st.targets() {
            let req = Request::DtxPending(DtxPendingReq {
                addr: addr(pool, target),
                older_than_ms: peregrine_vos::DTX_STALE_MS,
                max: 0,
            });
            let pending = match local(st, req) {
                Ok(Answer::DtxPending(p)) => p,
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!("pool {pool} target {target}: pending transactions: {e}");
                    continue;
                }
            };
            if pending.is_empty() {
                continue;
            }
            let (map, client) = match maps.map(&node.cfg.mgmt_leader(), pool, Duration::ZERO) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(
                        "pool {pool}: {} transactions in doubt, no pool map to settle them: {e}",
                        pending.len()
                    );
                    continue;
                }
            };
            let me = DtxShard {
                rank: node.cfg.rank,
                target,
            };
            // In the wire's terms: the other shards are asked over it.
            for p in pending.into_iter().map(dtx_pending) {
                let Some(dtx) = p.dtx else { continue };
                let (Some(id), Some(leader)) = (dtx.id, dtx.shards.first()) else {
                    continue;
                };
                let ask = |s: &DtxShard, resolve: bool| {
                    peregrine::dtx::query(client.transport().as_ref(), &map, s, &id, resolve)
                };
                let outcome = if p.incomplete {
                    // A change never arrived: the client cannot have seen
                    // every prepare succeed, nor can the leader find every
                    // shard prepared here.
                    Some(false)
                } else if *leader == me {
                    settle(&map, &dtx.shards, &me, &ask)
                } else {
                    match ask(leader, true) {
                        Ok(s) => decided(s),
                        Err(e) if leader_down(&map, leader) => {
                            tracing::debug!("transaction leader unreachable and down: {e}");
                            substitute(&map, &dtx.shards, &me, &ask)
                        }
                        Err(e) => {
                            tracing::debug!("transaction leader unreachable: {e}");
                            None
                        }
                    }
                };
                if let Some(commit) = outcome {
                    tracing::info!(
                        "pool {pool} target {target}: transaction {:016x}{:016x} in doubt for {} ms: {}",
                        id.hi,
                        id.lo,
                        p.age_ms,
                        if commit { "committed" } else { "aborted" }
                    );
                    let req = Request::DtxDecide(DtxDecideReq {
                        addr: addr(pool, target),
                        ids: vec![TxId {
                            hi: id.hi,
                            lo: id.lo,
                        }],
                        commit,
                        leader: false,
                    });
                    if let Err(e) = local(st, req) {
                        tracing::warn!(
                            "pool {pool} target {target}: applying a transaction's outcome: {e}"
                        );
                    }
                }
            }
        }
    }
}

/// Commit (true) or abort (false), if the state is final.
fn decided(s: DtxState) -> Option<bool> {
    match s {
        DtxState::DtxCommitted => Some(true),
        DtxState::DtxAborted => Some(false),
        DtxState::DtxPrepared | DtxState::DtxUnknown => None,
    }
}

fn leader_down(map: &PoolMap, leader: &DtxShard) -> bool {
    peregrine::dtx::target_of(map, leader).is_none_or(|t| !t.up)
}

/// The outcome under a leader that is down: settled by the first up-and-in
/// shard of the transaction, which the others ask.
fn substitute(
    map: &PoolMap,
    shards: &[DtxShard],
    me: &DtxShard,
    ask: &dyn Fn(&DtxShard, bool) -> peregrine::Result<DtxState>,
) -> Option<bool> {
    let readable = |s: &&DtxShard| peregrine::dtx::target_of(map, s).is_some_and(|t| t.readable);
    let sub = shards[1..].iter().find(readable)?;
    if sub != me {
        return ask(sub, false).ok().and_then(decided);
    }
    settle(map, shards, me, ask)
}

/// Settle a transaction this shard decides (see the module comment).
fn settle(
    map: &PoolMap,
    shards: &[DtxShard],
    me: &DtxShard,
    ask: &dyn Fn(&DtxShard, bool) -> peregrine::Result<DtxState>,
) -> Option<bool> {
    let counted =
        |s: &&DtxShard| *s != me && peregrine::dtx::target_of(map, s).is_some_and(|t| t.up);
    for s in shards.iter().filter(counted) {
        match ask(s, true).ok()? {
            DtxState::DtxCommitted => return Some(true),
            DtxState::DtxAborted | DtxState::DtxUnknown => return Some(false),
            DtxState::DtxPrepared => {}
        }
    }
    Some(true)
}
