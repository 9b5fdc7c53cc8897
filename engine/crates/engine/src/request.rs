//! Data-plane requests as both transports (TCP and shared memory) take
//! them, protobuf messages, and their conversion to the storage's own
//! types ([`peregrine_vos::Request`]) once admitted; the storage's answers
//! back to protobuf responses.
//!
//! What a message cannot say in the storage's types is refused here with
//! `-EINVAL`, naming the request and what is wrong: a missing address,
//! object id or transaction id, a UUID of the wrong length, an unknown
//! value kind, a condition that expects nothing, an `unchanged_since` on a
//! single value. What needs a target's state (its pools, its space, the
//! conditions, the transactions) is the target's to check.
//!
//! Fields move from the message to the storage's request: no value or key
//! is copied, and the lists of iods, conditions and transaction ids are
//! converted in their own allocations (each storage item is the size of
//! its protobuf item; see the tests).

use peregrine_proto::data::{self, response::Body};
use peregrine_vos::{self as vos, Bulk, Errno};
use uuid::Uuid;

/// A data-plane request as decoded from its frame.
#[derive(Debug)]
pub enum DataRequest {
    /// The update and its bulk (values concatenated in iod order).
    Update(data::UpdateReq, Bulk),
    Fetch(data::FetchReq),
    Punch(data::PunchReq),
    List(data::ListReq),
    QuerySize(data::QuerySizeReq),
    Flush(data::FlushReq),
    ListChanged(data::ListChangedReq),
    ListRecords(data::ListRecordsReq),
    DtxDecide(data::DtxDecideReq),
    DtxQuery(data::DtxQueryReq),
}

impl DataRequest {
    /// The address the request names, if it has one.
    pub fn addr(&self) -> Option<&data::Address> {
        match self {
            DataRequest::Update(r, _) => r.addr.as_ref(),
            DataRequest::Fetch(r) => r.addr.as_ref(),
            DataRequest::Punch(r) => r.addr.as_ref(),
            DataRequest::List(r) => r.addr.as_ref(),
            DataRequest::QuerySize(r) => r.addr.as_ref(),
            DataRequest::Flush(r) => r.addr.as_ref(),
            DataRequest::ListChanged(r) => r.addr.as_ref(),
            DataRequest::ListRecords(r) => r.addr.as_ref(),
            DataRequest::DtxDecide(r) => r.addr.as_ref(),
            DataRequest::DtxQuery(r) => r.addr.as_ref(),
        }
    }

    /// The target the request names, if it has an address.
    pub fn target(&self) -> Option<u32> {
        self.addr().map(|a| a.target)
    }

    /// The request in the storage's terms, or why it cannot be.
    pub fn into_vos(self) -> Result<vos::Request, Errno> {
        Ok(match self {
            DataRequest::Update(u, bulk) => vos::Request::Update(update(u)?, bulk),
            DataRequest::Fetch(f) => vos::Request::Fetch(fetch(f)?),
            DataRequest::Punch(p) => vos::Request::Punch(punch(p)?),
            DataRequest::List(l) => vos::Request::List(vos::ListReq {
                addr: address(l.addr, "list")?,
                epoch: l.epoch,
                dkey: l.dkey,
                anchor: l.anchor,
                max: l.max,
            }),
            DataRequest::QuerySize(q) => vos::Request::QuerySize(vos::QuerySizeReq {
                addr: address(q.addr, "query size")?,
                epoch: q.epoch,
                dkey: q.dkey,
                akey: q.akey,
                last: q.last.map(|l| l.before),
            }),
            DataRequest::Flush(f) => vos::Request::Flush(vos::FlushReq {
                addr: pool_address(f.addr, "flush")?,
            }),
            DataRequest::ListChanged(l) => vos::Request::ListChanged(list_changed(l)?),
            DataRequest::ListRecords(l) => vos::Request::ListRecords(vos::ListRecordsReq {
                addr: address(l.addr, "list records")?,
                dkey: l.dkey,
                since: l.since,
            }),
            DataRequest::DtxDecide(d) => vos::Request::DtxDecide(vos::DtxDecideReq {
                addr: pool_address(d.addr, "dtx decide")?,
                ids: d.ids.into_iter().map(tx_id).collect(),
                commit: d.commit,
                leader: d.leader,
            }),
            DataRequest::DtxQuery(q) => vos::Request::DtxQuery(vos::DtxQueryReq {
                addr: pool_address(q.addr, "dtx query")?,
                id: q
                    .id
                    .map(tx_id)
                    .ok_or_else(|| Errno::inval("dtx query: missing transaction id"))?,
                resolve: q.resolve,
            }),
        })
    }
}

fn uuid(op: &str, field: &str, b: &[u8]) -> Result<Uuid, Errno> {
    peregrine_proto::uuid_from_bytes(field, b).map_err(|e| Errno::inval(format!("{op}: {e}")))
}

fn missing_address(op: &str) -> Errno {
    Errno::inval(format!("{op}: missing address"))
}

fn address(a: Option<data::Address>, op: &str) -> Result<vos::Address, Errno> {
    let a = a.ok_or_else(|| missing_address(op))?;
    let pool = uuid(op, "pool", &a.pool)?;
    let cont = uuid(op, "cont", &a.cont)?;
    let oid = a
        .oid
        .ok_or_else(|| Errno::inval(format!("{op}: missing object id")))?;
    Ok(vos::Address {
        pool,
        cont,
        oid: vos::ObjectId {
            hi: oid.hi,
            lo: oid.lo,
        },
        shard: a.shard,
        target: a.target,
    })
}

/// The address of a request that names a pool only (its container and
/// object, if any, are not read).
fn pool_address(a: Option<data::Address>, op: &str) -> Result<vos::PoolAddress, Errno> {
    let a = a.ok_or_else(|| missing_address(op))?;
    Ok(vos::PoolAddress {
        pool: uuid(op, "pool", &a.pool)?,
        target: a.target,
    })
}

fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

/// `update`: an update's iod, where `unchanged_since` is read (of an
/// ARRAY value only); a fetch's ignores it.
fn iod(i: data::Iod, op: &str, update: bool) -> Result<vos::Iod, Errno> {
    let kind = match data::ValueKind::try_from(i.kind) {
        Ok(data::ValueKind::Single) if update && i.has_unchanged_since => {
            return Err(Errno::inval(format!(
                "{op}: akey {:?}: unchanged_since applies to ARRAY values only",
                show(&i.akey)
            )))
        }
        Ok(data::ValueKind::Single) => vos::IodKind::Single,
        Ok(data::ValueKind::Array) => vos::IodKind::Array {
            offset: i.offset,
            unchanged_since: (update && i.has_unchanged_since).then_some(i.unchanged_since),
        },
        Err(_) => return Err(Errno::inval(format!("{op}: unknown value kind {}", i.kind))),
    };
    Ok(vos::Iod {
        akey: i.akey,
        kind,
        len: i.len,
        crc: i.has_crc.then_some(i.crc),
    })
}

fn iods(iods: Vec<data::Iod>, op: &str, update: bool) -> Result<Vec<vos::Iod>, Errno> {
    iods.into_iter().map(|i| iod(i, op, update)).collect()
}

fn tx_id(d: data::DtxId) -> vos::TxId {
    vos::TxId { hi: d.hi, lo: d.lo }
}

fn dtx(d: Option<data::Dtx>, op: &str) -> Result<Option<vos::Dtx>, Errno> {
    let Some(d) = d else {
        return Ok(None);
    };
    let id =
        d.id.ok_or_else(|| Errno::inval(format!("{op}: transaction without an id")))?;
    Ok(Some(vos::Dtx {
        id: tx_id(id),
        shards: d.shards.into_iter().map(|s| (s.rank, s.target)).collect(),
    }))
}

/// `req` names the request in errors as the target names it in the
/// conditions it checks.
fn conditions(
    conds: Vec<data::Condition>,
    req: impl Fn() -> String,
) -> Result<Vec<vos::Condition>, Errno> {
    use data::condition::Expect;
    conds
        .into_iter()
        .map(|c| {
            let expect = match c.expect {
                Some(Expect::Absent(_)) => vos::Expect::Absent,
                Some(Expect::UnchangedSince(e)) => vos::Expect::UnchangedSince(e),
                Some(Expect::WrittenAt(e)) => vos::Expect::WrittenAt(e),
                None => {
                    return Err(Errno::inval(format!(
                        "{}: condition on akey {:?} expects nothing",
                        req(),
                        show(&c.akey)
                    )))
                }
            };
            Ok(vos::Condition {
                akey: c.akey,
                expect,
            })
        })
        .collect()
}

fn update(u: data::UpdateReq) -> Result<vos::UpdateReq, Errno> {
    const OP: &str = "update";
    let addr = address(u.addr, OP)?;
    let on = || format!("update on target {} shard {}", addr.target, addr.shard);
    Ok(vos::UpdateReq {
        epoch: u.epoch,
        dkey: u.dkey,
        iods: iods(u.iods, OP, true)?,
        insert_only: u.insert_only,
        sync: u.sync,
        dtx: dtx(u.dtx, OP)?,
        conditions: conditions(u.conditions, on)?,
        addr,
    })
}

fn fetch(f: data::FetchReq) -> Result<vos::FetchReq, Errno> {
    Ok(vos::FetchReq {
        addr: address(f.addr, "fetch")?,
        epoch: f.epoch,
        dkey: f.dkey,
        iods: iods(f.iods, "fetch", false)?,
    })
}

fn punch(p: data::PunchReq) -> Result<vos::PunchReq, Errno> {
    const OP: &str = "punch";
    let addr = address(p.addr, OP)?;
    let on = || format!("punch on target {} shard {}", addr.target, addr.shard);
    Ok(vos::PunchReq {
        more: more(p.more, &p.dkey, p.dtx.is_some() || !p.conditions.is_empty())?,
        epoch: p.epoch,
        dkey: p.dkey,
        akeys: p.akeys,
        sync: p.sync,
        dtx: dtx(p.dtx, OP)?,
        conditions: conditions(p.conditions, on)?,
        addr,
    })
}

/// A discard's further objects (`PunchReq.more`), bounded before any is converted.
fn more(
    more: Vec<data::ShardId>,
    dkey: &[u8],
    in_tx_or_conditional: bool,
) -> Result<Vec<vos::ShardId>, Errno> {
    if more.is_empty() {
        return Ok(Vec::new());
    }
    if more.len() > peregrine_proto::MAX_DISCARD_MORE {
        return Err(Errno::inval(format!(
            "discard: {} more objects, at most {} in one request",
            more.len(),
            peregrine_proto::MAX_DISCARD_MORE
        )));
    }
    if !dkey.is_empty() || in_tx_or_conditional {
        return Err(Errno::inval(
            "discard: more objects only in a whole-object punch without a transaction or conditions",
        ));
    }
    more.into_iter()
        .map(|s| {
            let oid = s
                .oid
                .ok_or_else(|| Errno::inval("discard: more object without an object id"))?;
            Ok(vos::ShardId {
                oid: vos::ObjectId {
                    hi: oid.hi,
                    lo: oid.lo,
                },
                shard: s.shard,
            })
        })
        .collect()
}

fn list_changed(l: data::ListChangedReq) -> Result<vos::ListChangedReq, Errno> {
    const OP: &str = "list changed";
    let anchor = match l.anchor {
        None => None,
        Some(k) => Some(vos::ChangedKey {
            cont: uuid(OP, "anchor cont", &k.cont)?,
            oid: k
                .oid
                .map(|o| vos::ObjectId { hi: o.hi, lo: o.lo })
                .ok_or_else(|| Errno::inval(format!("{OP}: anchor without object id")))?,
            shard: k.shard,
            dkey: k.dkey,
        }),
    };
    Ok(vos::ListChangedReq {
        addr: pool_address(l.addr, OP)?,
        since: l.since,
        anchor,
        max: l.max,
    })
}

/// The protobuf response of a successful answer.
pub fn response(a: vos::Answer) -> data::Response {
    let body = match a {
        vos::Answer::Done => None,
        vos::Answer::Fetch(values) => Some(Body::Fetch(data::FetchResp {
            values: values.into_iter().map(fetched_value).collect(),
        })),
        vos::Answer::List { keys, anchor, done } => {
            Some(Body::List(data::ListResp { keys, anchor, done }))
        }
        vos::Answer::Size { size, absent } => Some(Body::Size(data::QuerySizeResp {
            size,
            absent,
            last: None,
        })),
        vos::Answer::Last(last) => {
            // On the wire: a dkey found, or the one to resume below (or neither).
            let (dkey, size, resume) = match last {
                vos::LastSized::Found { dkey, size } => (dkey, size, Vec::new()),
                vos::LastSized::Nothing => (Vec::new(), 0, Vec::new()),
                vos::LastSized::Below(k) => (Vec::new(), 0, k),
            };
            Some(Body::Size(data::QuerySizeResp {
                size,
                absent: size == 0,
                last: Some(data::LastDkey { dkey, size, resume }),
            }))
        }
        vos::Answer::Changed { keys, done } => Some(Body::Changed(data::ListChangedResp {
            keys: keys.into_iter().map(changed_key).collect(),
            done,
        })),
        vos::Answer::Records(records) => Some(Body::Records(data::ListRecordsResp {
            records: records.into_iter().map(record).collect(),
        })),
        vos::Answer::DtxState(s) => Some(Body::DtxState(data::DtxQueryResp {
            state: dtx_state(s) as i32,
        })),
        vos::Answer::DtxPending(p) => Some(Body::DtxPending(data::DtxPendingResp {
            pending: p.into_iter().map(dtx_pending).collect(),
        })),
    };
    data::Response {
        status: Some(data::Status {
            code: 0,
            message: String::new(),
        }),
        body,
    }
}

fn fetched_value(v: vos::FetchedValue) -> data::FetchedValue {
    data::FetchedValue {
        status: v.status,
        len: v.len,
        size: v.size,
        crc: v.crc.unwrap_or(0),
        has_crc: v.crc.is_some(),
        absent: v.absent,
        epoch: v.epoch,
    }
}

fn changed_key(k: vos::ChangedKey) -> data::ChangedKey {
    data::ChangedKey {
        cont: k.cont.as_bytes().to_vec(),
        oid: Some(data::ObjectId {
            hi: k.oid.hi,
            lo: k.oid.lo,
        }),
        shard: k.shard,
        dkey: k.dkey,
    }
}

fn value_kind(k: vos::ValueKind) -> data::ValueKind {
    match k {
        vos::ValueKind::Single => data::ValueKind::Single,
        vos::ValueKind::Array => data::ValueKind::Array,
    }
}

fn record(r: vos::Record) -> data::Record {
    use data::RecordKind as K;
    data::Record {
        kind: match r.kind {
            vos::RecordKind::Value => K::RecordValue,
            vos::RecordKind::PunchObject => K::RecordPunchObject,
            vos::RecordKind::PunchDkey => K::RecordPunchDkey,
            vos::RecordKind::PunchAkey => K::RecordPunchAkey,
        } as i32,
        epoch: r.epoch,
        akey: r.akey,
        value_kind: value_kind(r.value_kind) as i32,
        offset: r.offset,
        len: r.len,
    }
}

/// The protobuf form of a transaction's state (the resolver asks other
/// engines in it too).
pub fn dtx_state(s: vos::DtxState) -> data::DtxState {
    match s {
        vos::DtxState::Unknown => data::DtxState::DtxUnknown,
        vos::DtxState::Prepared => data::DtxState::DtxPrepared,
        vos::DtxState::Committed => data::DtxState::DtxCommitted,
        vos::DtxState::Aborted => data::DtxState::DtxAborted,
    }
}

/// The protobuf form of a transaction's id.
pub fn dtx_id(id: vos::TxId) -> data::DtxId {
    data::DtxId {
        hi: id.hi,
        lo: id.lo,
    }
}

pub(crate) fn dtx_pending(p: vos::DtxPending) -> data::DtxPending {
    data::DtxPending {
        dtx: Some(data::Dtx {
            id: Some(dtx_id(p.dtx.id)),
            shards: p
                .dtx
                .shards
                .into_iter()
                .map(|(rank, target)| data::DtxShard { rank, target })
                .collect(),
        }),
        age_ms: p.age_ms,
        incomplete: p.incomplete,
    }
}

#[cfg(test)]
mod tests;
