//! Conditions of updates and punches ([`Condition`], as DAOS's
//! conditional operations): what a change needs of its shard's state, so
//! that a client can change keys it read only if nobody changed them since
//! (a rename moves an entry only if it still names what was read) and
//! create keys only if nobody else did.
//!
//! A condition is judged on what the shard will hold once the changes in
//! flight (logged or gathered, not yet applied) are applied, as the
//! transactions' states are ([`crate::dtx::decisions::state_with`]). A change of the
//! akey that another transaction holds prepared fails it with `-EBUSY`
//! whatever it expects: that transaction may still commit or abort, and
//! answering either way could be wrong. Two transactions with conditions
//! on one akey therefore never both prepare it: the second is refused until
//! the first is decided, which makes the conditions serializable.

use crate::dtx::{touches_range, TxId};
use crate::error::Errno;
use crate::index::{ObjKey, TargetIndex, WalOp};
use crate::request::{Condition, Expect};
use uuid::Uuid;

/// Most conditions one request may carry.
pub(crate) const MAX_CONDITIONS: usize = 64;

/// Check `conds` of a change of dkey `at` (pool, container, object shard,
/// dkey) by transaction `own` (if any); `req` names the request in errors.
pub(crate) fn check<'a>(
    ix: &TargetIndex,
    in_flight: impl Iterator<Item = &'a WalOp> + Clone,
    own: Option<TxId>,
    at: (&Uuid, &Uuid, &ObjKey, &[u8]),
    conds: &[Condition],
    req: &str,
) -> Result<(), Errno> {
    if conds.len() > MAX_CONDITIONS {
        return Err(Errno::inval(format!(
            "{req}: {} conditions (at most {MAX_CONDITIONS})",
            conds.len()
        )));
    }
    for c in conds {
        if c.akey.is_empty() {
            return Err(Errno::inval(format!("{req}: condition on an empty akey")));
        }
        check_one(ix, in_flight.clone(), own, at, &c.akey, c.expect, req)?;
    }
    Ok(())
}

fn check_one<'a>(
    ix: &TargetIndex,
    in_flight: impl Iterator<Item = &'a WalOp>,
    own: Option<TxId>,
    at: (&Uuid, &Uuid, &ObjKey, &[u8]),
    akey: &[u8],
    expect: Expect,
    req: &str,
) -> Result<(), Errno> {
    let what = || format!("{req}: dkey {:?} akey {:?}", show(at.3), show(akey));
    let busy = |why: String| Errno::new(-libc::EBUSY, format!("{}: {why}; nothing stored", what()));
    let (pool, cont, obj, dkey) = at;
    // Newest version and newest punch hiding it, as they will be once the
    // changes in flight are applied.
    let (mut newest, mut floor) = ix.akey_latest(pool, cont, obj, dkey, akey);
    for f in in_flight {
        let (change, by) = match f {
            WalOp::Prepare { id, op, .. } => (&**op, Some(*id)),
            op => (op, None),
        };
        if !touches_range(change, at, akey, 0, u64::MAX) {
            continue;
        }
        match (by, change) {
            (Some(id), _) if Some(id) == own => {}
            (Some(id), _) => {
                return Err(busy(format!(
                    "transaction {id} is preparing a change of the akey"
                )))
            }
            (None, WalOp::Update { epoch, .. }) => newest = newest.max(Some(*epoch)),
            (None, WalOp::Punch { epoch, .. }) => floor = floor.max(Some(*epoch)),
            _ => {}
        }
    }
    if let Some(id) = ix.dtx.touched_by_other(own, at, akey, 0, u64::MAX) {
        return Err(busy(format!(
            "transaction {id} holds a prepared change of the akey"
        )));
    }
    match expect {
        Expect::Absent if newest > floor => Err(Errno::new(
            -libc::EEXIST,
            format!(
                "{}: expected absent, but it has a value (epoch {}); nothing stored",
                what(),
                newest.unwrap_or(0)
            ),
        )),
        Expect::UnchangedSince(since) => match newest.max(floor) {
            Some(e) if e > since => Err(busy(format!(
                "changed at epoch {e}, after epoch {since} that the client read"
            ))),
            _ => Ok(()),
        },
        Expect::WrittenAt(at) if newest == Some(at) && newest > floor => Ok(()),
        Expect::WrittenAt(at) => Err(busy(match (newest, floor) {
            (Some(e), _) if e != at => format!("written at epoch {e}, not at epoch {at}"),
            (Some(_), Some(p)) => format!("punched at epoch {p} after its write at epoch {at}"),
            _ => format!("no value (expected the one written at epoch {at})"),
        })),
        Expect::Absent => Ok(()),
    }
}

fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}
