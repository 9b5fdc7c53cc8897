//! What goes through the regions: a request copied out, checked and
//! decoded, and a response frame written.

use super::cma::RemoteBulk;
use super::connection::{Live, Pull};
use super::handshake::Conn;
use crate::dataplane;
use crate::request::DataRequest as Request;
use peregrine_proto::data::Response as DataResponse;
use peregrine_proto::frame::{Frame, Header, FLAG_RESPONSE, HEADER_LEN, MAX_BULK, MAX_MSG};
use peregrine_proto::shm::{self as wire, RemotePart};
use peregrine_vos::{Bulk, Gather, SharedBytes};
use prost::Message;
use std::sync::Arc;

/// An update's values in the request region of a connection, copied out by
/// the target (bounds-checked: the region is the client's to change).
pub(super) struct ShmBulk {
    pub(super) live: Arc<Live>,
    pub(super) off: u64,
    pub(super) len: usize,
}

impl SharedBytes for ShmBulk {
    fn len(&self) -> usize {
        self.len
    }

    fn copy_out(&self, off: usize, out: &mut [u8]) -> std::io::Result<()> {
        // Inside the bulk (Bulk checks), and the mapping checks its own bounds.
        self.live.conn.map.read(self.off + off as u64, out)
    }
}

/// A request taken from the request region.
pub(super) enum Decoded {
    /// Ready for the target (None: a ping).
    Now(Header, Option<Request>),
    /// An update whose values the connection's thread must read first.
    Pull(Pull),
}

/// Copy out, check and decode the request of `len` bytes in the request
/// region; an update's bulk stays there ([`ShmBulk`]).
pub(super) fn decode_one(live: &Arc<Live>, len: u64) -> Result<Decoded, String> {
    let c = &live.conn;
    let h = &c.hello;
    if len < HEADER_LEN as u64 || len > h.req_len {
        return Err(format!(
            "request length {len} is outside the {}-byte request region (min {HEADER_LEN})",
            h.req_len
        ));
    }
    // Copy the header out first: the client can rewrite the region at any time.
    let mut hb = [0u8; HEADER_LEN];
    c.map.read(h.req_off, &mut hb).map_err(|e| e.to_string())?;
    let header = Header::decode(&hb).map_err(|e| format!("request frame: {e}"))?;
    let need = HEADER_LEN as u64 + header.msg_len as u64 + header.bulk_len as u64;
    if need != len {
        return Err(format!(
            "request length {len} does not match the frame's {need} bytes"
        ));
    }
    let msg_off = h.req_off + HEADER_LEN as u64;
    let msg = c
        .map
        .read_vec(msg_off, header.msg_len as usize)
        .map_err(|e| e.to_string())?;
    let bulk_off = msg_off + header.msg_len as u64;
    let bulk_len = header.bulk_len as usize;
    let read_bulk = || {
        c.map
            .read_vec(bulk_off, bulk_len)
            .map_err(|e| e.to_string())
    };
    let update = header.op() == peregrine_proto::frame::Opcode::Update;
    let remote = header.flags & wire::FLAG_BULK_REMOTE != 0;
    // An update's values stay where they are until its target copies them.
    let (bulk, values, parts) = match (update, remote) {
        (true, true) if c.cma.is_some() => {
            let parts = RemotePart::decode_all(&read_bulk()?)?;
            (Vec::new(), None, Some(parts))
        }
        (true, false) => {
            let (live, off) = (live.clone(), bulk_off);
            let values: Box<dyn SharedBytes> = Box::new(ShmBulk { live, off, len: bulk_len });
            (Vec::new(), Some(values), None)
        }
        (false, false) => (read_bulk()?, None, None),
        _ => {
            return Err(
                "a remote bulk on a request other than an update, or on a connection without direct reads"
                    .into(),
            )
        }
    };
    let req = dataplane::decode_request(Frame { header, msg, bulk })
        .map_err(|e| format!("request frame: {e}"))?;
    Ok(match (req, values, parts) {
        // Resident anonymous memory: the target reads it straight into its
        // buffers (one copy).
        (Some(Request::Update(u, _)), _, Some(parts))
            if c.cma.as_ref().is_some_and(|cma| cma.resident(&parts)) =>
        {
            let len = parts.iter().map(|p| p.len as usize).sum();
            let live = live.clone();
            let values = RemoteBulk { live, parts, len };
            Decoded::Now(
                header,
                Some(Request::Update(u, Bulk::Shared(Box::new(values)))),
            )
        }
        (Some(Request::Update(u, b)), _, Some(parts)) => Decoded::Pull(Pull {
            header,
            req: Request::Update(u, b),
            len: parts.iter().map(|p| p.len as usize).sum(),
            parts,
            off: bulk_off,
        }),
        (Some(Request::Update(u, _)), Some(v), _) => {
            Decoded::Now(header, Some(Request::Update(u, Bulk::Shared(v))))
        }
        (r, _, _) => Decoded::Now(header, r),
    })
}

pub(super) fn write_response(
    c: &Conn,
    req: &Header,
    (resp, bulk): (DataResponse, Gather<'_>),
) -> Result<u64, String> {
    let mut msg = resp.encode_to_vec();
    let mut bulk = bulk;
    // A bulk in place starts at BULK_PAGE_OFF rather than after the header.
    let start = if bulk.is_in_place() {
        wire::BULK_PAGE_OFF as usize
    } else {
        HEADER_LEN
    };
    let fits = |m: usize, b: usize| {
        m <= MAX_MSG as usize
            && b <= MAX_BULK as usize
            && (start + m + b) as u64 <= c.hello.resp_len
    };
    if !fits(msg.len(), bulk.len()) {
        let (r, b) = dataplane::error_reply(
            -libc::EOVERFLOW,
            format!(
                "response of {} + {} bytes does not fit the {}-byte shm response region",
                msg.len(),
                bulk.len(),
                c.hello.resp_len
            ),
        );
        msg = r.encode_to_vec();
        bulk = Gather::from(b);
        if !fits(msg.len(), bulk.len()) {
            return Err(format!(
                "response region of {} bytes is too small for any reply",
                c.hello.resp_len
            ));
        }
    }
    let in_place = bulk.is_in_place();
    let header = Header {
        opcode: req.opcode,
        flags: FLAG_RESPONSE | if in_place { wire::FLAG_BULK_AT_PAGE } else { 0 },
        request_id: req.request_id,
        msg_len: msg.len() as u32,
        bulk_len: bulk.len() as u32,
    };
    let off = c.hello.resp_off;
    let w = |o: u64, d: &[u8]| c.map.write(o, d).map_err(|e| e.to_string());
    if in_place {
        // The bulk is already at BULK_PAGE_OFF; the message follows it.
        w(off, &header.encode())?;
        w(off + wire::BULK_PAGE_OFF + bulk.len() as u64, &msg)?;
        return Ok(wire::BULK_PAGE_OFF + (bulk.len() + msg.len()) as u64);
    }
    w(off, &header.encode())?;
    w(off + HEADER_LEN as u64, &msg)?;
    let mut at = off + (HEADER_LEN + msg.len()) as u64;
    for part in bulk.parts() {
        w(at, part)?;
        at += part.len() as u64;
    }
    Ok((HEADER_LEN + msg.len() + bulk.len()) as u64)
}
