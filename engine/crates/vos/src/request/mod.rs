//! What a target is asked and answers: the data-plane request and reply types,
//! the sources a target polls, and the checks on a request before it is queued.

use crate::{Bulk, Errno, Gather};

mod answer;
mod types;

pub use answer::{Answer, DtxPending, DtxState, FetchedValue, LastSized, Record, RecordKind};
pub use types::{
    Address, ChangedKey, Condition, Dtx, DtxDecideReq, DtxPendingReq, DtxQueryReq, Expect,
    FetchReq, FlushReq, Iod, IodKind, ListChangedReq, ListRecordsReq, ListReq, ObjectId,
    PoolAddress, PunchReq, QuerySizeReq, ShardId, UpdateReq, ValueKind,
};

/// One data-plane request; the target comes from its address.
#[derive(Debug)]
pub enum Request {
    /// The update and its bulk (values concatenated in iod order).
    Update(UpdateReq, Bulk),
    Fetch(FetchReq),
    Punch(PunchReq),
    List(ListReq),
    QuerySize(QuerySizeReq),
    Flush(FlushReq),
    /// Reintegration: the dkeys of a pool changed since an epoch.
    ListChanged(ListChangedReq),
    /// Reintegration: the versions and punches of one dkey above an epoch.
    ListRecords(ListRecordsReq),
    /// Decide transactions (leader) or apply their decision (the others).
    DtxDecide(DtxDecideReq),
    /// What this target knows of a transaction (see `DtxQueryReq.resolve`).
    DtxQuery(DtxQueryReq),
    /// Engine-internal: transactions held prepared here for a while.
    DtxPending(DtxPendingReq),
}

/// An answer and its bulk (fetched values concatenated in iod order), or an errno.
pub type Reply = Result<(Answer, Vec<u8>), Errno>;

/// A [`Reply`] as the target hands it to a callback: the bulk may borrow
/// the target's device buffers until the callback returns.
pub type ReplyRef<'a> = Result<(Answer, Gather<'a>), Errno>;

/// Takes the one reply of a request, on the target's thread.
pub type ReplyFn = Box<dyn for<'a> FnOnce(ReplyRef<'a>) + Send>;

/// A source of requests that a target polls itself, between its other work
/// ([`Storage::attach`]): the engine's shared-memory connections of local
/// clients. No thread stands between such a client and its target, and
/// while the target polls (it is busy, or answered the source less than
/// [`StorageOptions::poll`] ago) the client needs no wake-up either.
pub trait Source: Send {
    /// Take the request waiting, if any. Called on the target's thread; must not block.
    fn poll(&mut self) -> Polled;
    /// Whether a request is waiting (without taking it), or the source closed.
    fn pending(&self) -> bool;
}

/// Memory a source offers for a fetch's bytes: the client's response
/// region, shared with the engine. When a fetch's bytes are whole checksum
/// chunks of one extent, the target reads them from the device straight
/// into it (the reply's [`Gather`] is then [`Gather::in_place`]), instead of
/// into its own buffers and copying them over.
#[derive(Clone, Copy, Debug)]
pub struct ReplyArea {
    /// Address of the first byte: 4 KiB-aligned (O_DIRECT), mapped until the
    /// reply has been sent.
    pub addr: usize,
    pub len: usize,
}

/// What a [`Source`] had.
// Returned by value once per poll and taken apart at once: boxing the
// request would cost an allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Polled {
    Idle,
    /// A request, the function that takes its one reply (on the target's
    /// thread), and where a fetch's bytes may go.
    Request(Request, ReplyFn, Option<ReplyArea>),
    /// The source is gone: the target drops it.
    Closed,
}

/// Delivers the one reply of a request submitted with [`Storage::submit_with`]
/// (on the target's thread). Dropped unanswered (a target stopping with the
/// request still queued), it answers `-ESHUTDOWN`, so no caller waits forever.
pub(crate) struct Responder(pub(crate) Option<ReplyFn>);

impl Responder {
    pub(crate) fn send(mut self, r: ReplyRef<'_>) {
        if let Some(f) = self.0.take() {
            f(r)
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(Err(Errno::new(
                -libc::ESHUTDOWN,
                "target stopped before answering",
            )))
        }
    }
}

impl Request {
    /// The target the request is for.
    pub fn target(&self) -> u32 {
        match self {
            Request::Update(r, _) => r.addr.target,
            Request::Fetch(r) => r.addr.target,
            Request::Punch(r) => r.addr.target,
            Request::List(r) => r.addr.target,
            Request::QuerySize(r) => r.addr.target,
            Request::ListRecords(r) => r.addr.target,
            Request::Flush(r) => r.addr.target,
            Request::ListChanged(r) => r.addr.target,
            Request::DtxDecide(r) => r.addr.target,
            Request::DtxQuery(r) => r.addr.target,
            Request::DtxPending(r) => r.addr.target,
        }
    }

    /// The pool the request is for.
    pub fn pool(&self) -> uuid::Uuid {
        match self {
            Request::Update(r, _) => r.addr.pool,
            Request::Fetch(r) => r.addr.pool,
            Request::Punch(r) => r.addr.pool,
            Request::List(r) => r.addr.pool,
            Request::QuerySize(r) => r.addr.pool,
            Request::ListRecords(r) => r.addr.pool,
            Request::Flush(r) => r.addr.pool,
            Request::ListChanged(r) => r.addr.pool,
            Request::DtxDecide(r) => r.addr.pool,
            Request::DtxQuery(r) => r.addr.pool,
            Request::DtxPending(r) => r.addr.pool,
        }
    }
}

/// Check what a request asks for against the hard limits, before anything
/// is allocated or queued for it: the bytes an update carries and the bytes
/// an ARRAY fetch asks for, in total over its iods, are at most
/// [`peregrine_proto::MAX_IO_BYTES`] (one frame's bulk, which is also the
/// most a reply can carry). Stateless and cheap: every target runs it on
/// every request it takes, from any transport.
pub fn check_request(req: &Request) -> Result<(), Errno> {
    use peregrine_proto::MAX_IO_BYTES;
    let (op, iods, only_arrays) = match req {
        Request::Update(u, _) => ("update", &u.iods, false),
        Request::Fetch(f) => ("fetch", &f.iods, true),
        _ => return Ok(()),
    };
    let asked = iods
        .iter()
        .filter(|i| !only_arrays || i.kind.value_kind() == ValueKind::Array)
        .try_fold(0u64, |t, i| t.checked_add(i.len));
    match asked {
        Some(t) if t <= MAX_IO_BYTES => Ok(()),
        _ => Err(Errno::new(
            -libc::EINVAL,
            format!(
                "{op}: {} bytes in {} iods, more than the limit of {MAX_IO_BYTES} bytes per request (MAX_IO_BYTES); split it",
                asked.map_or_else(
                    || format!("more than {}", u64::MAX),
                    |t| t.to_string()
                ),
                iods.len()
            ),
        )),
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;
    use peregrine_proto::MAX_IO_BYTES;

    #[derive(Clone, Copy)]
    enum K {
        Single,
        Array,
    }
    use K::{Array, Single};

    fn iod(kind: K, len: u64) -> Iod {
        Iod {
            akey: b"a".to_vec(),
            kind: match kind {
                Single => IodKind::Single,
                Array => IodKind::Array {
                    offset: 0,
                    unchanged_since: None,
                },
            },
            len,
            ..Default::default()
        }
    }

    fn fetch(iods: Vec<Iod>) -> Request {
        Request::Fetch(FetchReq {
            iods,
            ..Default::default()
        })
    }

    #[test]
    fn a_fetch_may_ask_for_the_limit_in_total_and_no_more() {
        let split = |n: u64, extra: u64| {
            let mut v: Vec<_> = (0..n).map(|_| iod(Array, MAX_IO_BYTES / n)).collect();
            v[0].len += extra;
            fetch(v)
        };
        assert!(check_request(&split(64, 0)).is_ok());
        assert!(check_request(&split(1, 0)).is_ok());
        let e = check_request(&split(64, 1)).unwrap_err();
        assert_eq!(e.code, -libc::EINVAL);
        assert!(e.msg.contains(&MAX_IO_BYTES.to_string()), "{e}");
        assert!(e.msg.contains(&(MAX_IO_BYTES + 1).to_string()), "{e}");
        // The reported crash: 100 iods of 1 GiB.
        let e = check_request(&fetch((0..100).map(|_| iod(Array, 1 << 30)).collect())).unwrap_err();
        assert!(e.msg.contains("107374182400"), "{e}");
        // Lengths that overflow a u64 in total.
        let e = check_request(&fetch(vec![iod(Array, u64::MAX), iod(Array, 2)])).unwrap_err();
        assert_eq!(e.code, -libc::EINVAL);
        // A SINGLE iod's length is not what it returns: planned, then checked.
        assert!(check_request(&fetch(vec![iod(Single, u64::MAX)])).is_ok());
    }

    #[test]
    fn an_update_may_carry_the_limit_in_total_and_no_more() {
        let update = |iods| {
            Request::Update(
                UpdateReq {
                    iods,
                    ..Default::default()
                },
                Bulk::from(Vec::new()),
            )
        };
        let ok = update(vec![
            iod(Single, MAX_IO_BYTES / 2),
            iod(Array, MAX_IO_BYTES / 2),
        ]);
        assert!(check_request(&ok).is_ok());
        let e = check_request(&update(vec![iod(Single, MAX_IO_BYTES), iod(Array, 1)])).unwrap_err();
        assert_eq!(e.code, -libc::EINVAL);
        assert!(
            e.msg.starts_with("update:") && e.msg.contains("MAX_IO_BYTES"),
            "{e}"
        );
        assert!(check_request(&update(vec![iod(Array, u64::MAX), iod(Array, u64::MAX)])).is_err());
    }
}
