//! The decisions a target takes on transactions: pure functions of the
//! index and of the changes in flight, whose results the target logs.

use super::{
    expected_ops, op_key, show, touches_range, OpKey, PendingDtx, Shards, TxId, MAX_DECIDE,
    MAX_SHARDS, PENDING_DEFAULT, PENDING_MAX,
};
use crate::error::Errno;
use crate::index::{ObjKey, TargetIndex, WalOp};
use crate::request::{
    Dtx, DtxDecideReq, DtxPending, DtxPendingReq, DtxQueryReq, DtxState, Iod, IodKind,
};
use uuid::Uuid;

/// Milliseconds since the Unix epoch, as logged in [`WalOp::Prepare`] and
/// [`WalOp::Decide`].
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The transaction of an update or punch, if it names one: its id and its
/// shards as (rank, target), checked (1 to [`MAX_SHARDS`] shards).
pub(crate) fn parse(dtx: Option<Dtx>, op: &str) -> Result<Option<(TxId, Shards)>, Errno> {
    let Some(Dtx { id, shards }) = dtx else {
        return Ok(None);
    };
    if shards.is_empty() || shards.len() > MAX_SHARDS {
        return Err(Errno::inval(format!(
            "{op}: transaction {id} lists {} shards; it must list 1 to {MAX_SHARDS}",
            shards.len()
        )));
    }
    Ok(Some((id, shards)))
}

/// The state `op`, applied after a change that left `id` in `st`, leaves it in.
fn next_state(st: DtxState, op: &WalOp, id: TxId) -> DtxState {
    match op {
        WalOp::Prepare { id: i, .. } if *i == id && st == DtxState::Unknown => DtxState::Prepared,
        WalOp::Decide { id: i, commit, .. }
            if *i == id && matches!(st, DtxState::Unknown | DtxState::Prepared) =>
        {
            if *commit {
                DtxState::Committed
            } else {
                DtxState::Aborted
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
        DtxState::Aborted => Err(Errno::new(
            -libc::ECANCELED,
            format!("{op}: transaction {id} was aborted; nothing stored"),
        )),
        DtxState::Committed => Ok(Admit::Known {
            durable: durable == DtxState::Committed,
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
    req: &DtxDecideReq,
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
    for &id in &req.ids {
        // A transaction named twice is decided once.
        let st = ops
            .iter()
            .fold(state_with(ix, in_flight.clone(), id), |st, op| {
                next_state(st, op, id)
            });
        let log = match (req.commit, st) {
            (true, Prepared) | (false, Prepared | Unknown) => true,
            (true, Committed) | (false, Aborted) => false,
            (true, Unknown) if !req.leader => true,
            (true, Unknown) => {
                return Err(Errno::new(
                    -libc::ENOENT,
                    format!("{OP}: transaction {id} unknown on this shard (target {target}); it cannot commit"),
                ))
            }
            (true, Aborted) => {
                return Err(Errno::new(
                    -libc::ECANCELED,
                    format!("{OP}: transaction {id} was aborted; it cannot commit"),
                ))
            }
            (false, Committed) => {
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
    req: &DtxQueryReq,
    now: u64,
) -> Result<(DtxState, Option<WalOp>), Errno> {
    let id = req.id;
    let st = state_with(ix, in_flight.clone(), id);
    // Prepared with a change still missing: a prepare on its way is
    // refused once this is aborted, so the client cannot count it committed.
    let partial = st == DtxState::Prepared && incomplete(ix, in_flight, id, me);
    let abort = req.resolve && (st == DtxState::Unknown || partial);
    if !abort {
        return Ok((st, None));
    }
    let op = WalOp::Decide {
        pool,
        id,
        commit: false,
        at_ms: now,
    };
    Ok((DtxState::Aborted, Some(op)))
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
    req: &DtxPendingReq,
    now: u64,
) -> Vec<DtxPending> {
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
    held.into_iter()
        .map(|(id, p)| DtxPending {
            dtx: Dtx {
                id: *id,
                shards: p.shards.clone(),
            },
            age_ms: now.saturating_sub(p.at_ms),
            incomplete: p.ops.len() < expected_ops(&p.shards, me),
        })
        .collect()
}

/// The `unchanged_since` of an ARRAY value (if it has one) of an update to the dkey `at`
/// (of transaction `own`, if any): `-EBUSY` if a stored extent of the akey
/// overlapping the iod's range is newer than that epoch, or if a change of
/// the akey is in flight (logged or gathered, not applied yet) or held by
/// another transaction.
pub(crate) fn check_unchanged<'a>(
    ix: &TargetIndex,
    in_flight: impl Iterator<Item = &'a WalOp>,
    own: Option<TxId>,
    at: (&Uuid, &Uuid, &ObjKey, &[u8]),
    iod: &Iod,
) -> Result<(), Errno> {
    let (offset, since) = match iod.kind {
        IodKind::Array {
            offset,
            unchanged_since: Some(since),
        } => (offset, since),
        _ => return Ok(()),
    };
    let end = offset.saturating_add(iod.len);
    let busy = |why: String| {
        Errno::new(
            -libc::EBUSY,
            format!(
                "update: dkey {:?} akey {:?} range [{}, {end}) changed since epoch {since}: {why}; nothing stored",
                show(at.3),
                show(&iod.akey),
                offset
            ),
        )
    };
    let (pool, cont, obj, dkey) = at;
    if let Some(e) = ix
        .newest_extent(pool, cont, obj, dkey, &iod.akey, offset, end)
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
        if touches_range(change, at, &iod.akey, offset, end) {
            return Err(busy(match by {
                Some(id) => format!("transaction {id} is preparing a change of the akey"),
                None => "a change of the akey is being written".to_string(),
            }));
        }
    }
    if let Some(id) = ix.dtx.touched_by_other(own, at, &iod.akey, offset, end) {
        return Err(busy(format!(
            "transaction {id} holds a prepared change of the akey"
        )));
    }
    Ok(())
}
