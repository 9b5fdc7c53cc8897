//! Transactions in doubt: what settles a transaction its client stopped
//! driving (it died, or a shard missed the outcome).
//!
//! Once a second this engine lists the transactions its targets have held
//! prepared for [`peregrine_vos::DTX_STALE_MS`] and settles each:
//! - held by its leader here: asked with `resolve`, the target aborts it
//!   once it is abandoned ([`peregrine_vos::DTX_ABANDON_MS`]: no commit came);
//! - otherwise the leader is asked (`resolve`): it answers its decision,
//!   or, never having seen the transaction, records it aborted;
//! - a leader that does not answer and that the pool map counts down is
//!   replaced by the first up-and-in shard of the transaction. That shard
//!   asks the other live ones: committed or aborted anywhere decides; if
//!   every one holds it prepared, the leader may have committed (it could
//!   only after all prepared) and nobody can have seen an abort, so it
//!   commits. The others follow that shard's answer.
//!
//! An engine coming back whose leader decided differently meanwhile is
//! reintegrated from the shards that stayed, so the outcome they applied wins.

use super::{addr, local, Maps};
use crate::node::Node;
use peregrine::placement::PoolMap;
use peregrine_proto::data::{self, response::Body, DtxShard, DtxState};
use peregrine_vos::{Request, Storage};
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
            let req = Request::DtxPending(data::DtxPendingReq {
                addr: addr(pool, target),
                older_than_ms: peregrine_vos::DTX_STALE_MS,
                max: 0,
            });
            let pending = match local(st, req) {
                Ok(Some(Body::DtxPending(p))) => p.pending,
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
            for p in pending {
                let Some(dtx) = p.dtx else { continue };
                let (Some(id), Some(leader)) = (dtx.id, dtx.shards.first()) else {
                    continue;
                };
                let ask = |s: &DtxShard, resolve: bool| {
                    peregrine::dtx::query(client.transport().as_ref(), &map, s, &id, resolve)
                };
                let outcome = if *leader == me {
                    // Aborts it here if it is abandoned; nothing to apply.
                    let q = Request::DtxQuery(data::DtxQueryReq {
                        addr: addr(pool, target),
                        id: Some(id),
                        resolve: true,
                    });
                    if let Err(e) = local(st, q) {
                        tracing::warn!(
                            "pool {pool} target {target}: settling a transaction it leads: {e}"
                        );
                    }
                    None
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
                    let req = Request::DtxDecide(data::DtxDecideReq {
                        addr: addr(pool, target),
                        ids: vec![id],
                        commit,
                        leader: false,
                        notify: Vec::new(),
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

/// The outcome under a leader that is down: decided by the first
/// up-and-in shard of the transaction (see the module comment).
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
    // Up-and-in only: a shard being reintegrated may have lost what it held.
    for s in shards[1..].iter().filter(readable).filter(|s| *s != me) {
        match ask(s, false).ok()? {
            DtxState::DtxCommitted => return Some(true),
            DtxState::DtxAborted | DtxState::DtxUnknown => return Some(false),
            DtxState::DtxPrepared => {}
        }
    }
    Some(true)
}
