//! What a target is asked and answers: the data-plane request and reply types,
//! the sources a target polls, and the checks on a request before it is queued.

use crate::{Bulk, Errno, Gather};
use peregrine_proto::data;

/// One data-plane request; the target comes from its `Address.target`.
#[derive(Debug)]
pub enum Request {
    /// The update and its bulk (values concatenated in iod order).
    Update(data::UpdateReq, Bulk),
    Fetch(data::FetchReq),
    Punch(data::PunchReq),
    List(data::ListReq),
    QuerySize(data::QuerySizeReq),
    Flush(data::FlushReq),
    /// Reintegration: the dkeys of a pool changed since an epoch (only
    /// `addr.pool` and `addr.target` are read).
    ListChanged(data::ListChangedReq),
    /// Reintegration: the versions and punches of one dkey above an epoch.
    ListRecords(data::ListRecordsReq),
    /// Decide transactions (leader) or apply their decision (the others).
    DtxDecide(data::DtxDecideReq),
    /// What this target knows of a transaction (see `DtxQueryReq.resolve`).
    DtxQuery(data::DtxQueryReq),
    /// Engine-internal: transactions held prepared here for a while.
    DtxPending(data::DtxPendingReq),
}

/// A response and its bulk (fetched values concatenated in iod order), or an errno.
pub type Reply = Result<(data::Response, Vec<u8>), Errno>;

/// A [`Reply`] as the target hands it to a callback: the bulk may borrow
/// the target's device buffers until the callback returns.
pub type ReplyRef<'a> = Result<(data::Response, Gather<'a>), Errno>;

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

/// The target a request names, if it has an address.
pub fn request_target(req: &Request) -> Option<u32> {
    request_addr(req).map(|a| a.target)
}

/// The address a request names, if it has one.
pub fn request_addr(req: &Request) -> Option<&data::Address> {
    match req {
        Request::Update(r, _) => r.addr.as_ref(),
        Request::Fetch(r) => r.addr.as_ref(),
        Request::Punch(r) => r.addr.as_ref(),
        Request::List(r) => r.addr.as_ref(),
        Request::QuerySize(r) => r.addr.as_ref(),
        Request::Flush(r) => r.addr.as_ref(),
        Request::ListChanged(r) => r.addr.as_ref(),
        Request::ListRecords(r) => r.addr.as_ref(),
        Request::DtxDecide(r) => r.addr.as_ref(),
        Request::DtxQuery(r) => r.addr.as_ref(),
        Request::DtxPending(r) => r.addr.as_ref(),
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
    let array = data::ValueKind::Array as i32;
    let asked = iods
        .iter()
        .filter(|i| !only_arrays || i.kind == array)
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

    fn iod(kind: data::ValueKind, len: u64) -> data::Iod {
        data::Iod {
            akey: b"a".to_vec(),
            kind: kind as i32,
            len,
            ..Default::default()
        }
    }

    fn fetch(iods: Vec<data::Iod>) -> Request {
        Request::Fetch(data::FetchReq {
            iods,
            ..Default::default()
        })
    }

    #[test]
    fn a_fetch_may_ask_for_the_limit_in_total_and_no_more() {
        use data::ValueKind::{Array, Single};
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
        use data::ValueKind::{Array, Single};
        let update = |iods| {
            Request::Update(
                data::UpdateReq {
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
