//! A connection as its target sees it: polling the request region and
//! admitting and dispatching what it finds.

use super::connection::{Live, PullSlot};
use super::frame::{decode_one, Decoded, ShmBulk};
use crate::dataplane;
use crate::metrics::IoMetrics;
use crate::poolmap::PoolMaps;
use crate::request::{self, DataRequest};
use peregrine_proto::data::Response as DataResponse;
use peregrine_proto::frame::Header;
use peregrine_proto::shm as wire;
use peregrine_vos::{Bulk, Gather, Polled, ReplyRef, Source};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A connection as its target sees it.
pub(super) struct Channel {
    pub(super) live: Arc<Live>,
    pub(super) target: u32,
    pub(super) pool_maps: Arc<PoolMaps>,
    pub(super) io: &'static IoMetrics,
}

impl Drop for Channel {
    /// The target let go (the client left, or the target stopped): the
    /// client sees the end of the socket rather than waiting for a reply.
    fn drop(&mut self) {
        self.live.closed.store(true, Ordering::Release);
        let _ = self.live.sock.shutdown(std::net::Shutdown::Both);
    }
}

impl Source for Channel {
    fn pending(&self) -> bool {
        self.live.closed.load(Ordering::Acquire)
            || self.live.pulled.load(Ordering::SeqCst)
            || self.live.conn.word(wire::REQ_STATE).load(Ordering::Acquire) == wire::REQ_PENDING
    }

    fn poll(&mut self) -> Polled {
        let live = &self.live;
        if live.closed.load(Ordering::Acquire) {
            return Polled::Closed;
        }
        if live.pulled.swap(false, Ordering::SeqCst) {
            let slot = std::mem::replace(
                &mut *live.pull.lock().unwrap_or_else(|e| e.into_inner()),
                PullSlot::Empty,
            );
            let PullSlot::Done(pull, r) = slot else {
                return Polled::Idle;
            };
            if let Err(e) = r {
                live.reply(
                    &pull.header,
                    owned(dataplane::error_reply(-libc::EINVAL, e)),
                );
                return Polled::Idle;
            }
            let DataRequest::Update(u, _) = pull.req else {
                return Polled::Idle;
            };
            let values = ShmBulk {
                live: live.clone(),
                off: pull.off,
                len: pull.len,
            };
            let req = DataRequest::Update(u, Bulk::Shared(Box::new(values)));
            return self.dispatch(pull.header, req);
        }
        let state = live.conn.word(wire::REQ_STATE);
        if state.load(Ordering::Acquire) != wire::REQ_PENDING {
            return Polled::Idle;
        }
        if live.busy.load(Ordering::Acquire) {
            live.stats.rejected.fetch_add(1, Ordering::Relaxed);
            live.close("a request arrived before the previous one was answered");
            return Polled::Closed;
        }
        state.store(wire::REQ_TAKEN, Ordering::Release);
        let len = live.conn.word(wire::REQ_LEN).load(Ordering::Acquire);
        let decoded = match decode_one(live, len) {
            Ok(d) => d,
            Err(e) => {
                live.stats.rejected.fetch_add(1, Ordering::Relaxed);
                live.close(&e);
                return Polled::Closed;
            }
        };
        live.busy.store(true, Ordering::Release);
        match decoded {
            Decoded::Pull(pull) => {
                // The client's memory is read off this thread: a fault
                // there may take for ever.
                if !live.pulled_once.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "shm pid {}: update values not in resident anonymous memory: read on the connection's thread",
                        live.pid
                    );
                }
                live.want(pull);
                Polled::Idle
            }
            Decoded::Now(header, None) => {
                live.reply(&header, owned(dataplane::error_reply(0, String::new())));
                Polled::Idle
            }
            Decoded::Now(header, Some(req)) => self.dispatch(header, req),
        }
    }
}

impl Channel {
    /// Admit a decoded request and give it to the target, converted.
    fn dispatch(&mut self, header: Header, req: DataRequest) -> Polled {
        let live = &self.live;
        // Polled on the target's own thread: admitted requests queue in order
        // with the drain that follows a pool map change (see `crate::poolmap`).
        // A request for another target breaks the protocol: the connection
        // ends, whatever its handle or pool map would have said.
        if let Some(t) = req.target().filter(|t| *t != self.target) {
            live.stats.rejected.fetch_add(1, Ordering::Relaxed);
            live.close(&format!(
                "request for target {t} on a connection to target {}",
                self.target
            ));
            return Polled::Closed;
        }
        let mut track = self.io.track(&req);
        if let Err((code, message)) = self.pool_maps.admit(&req).map(drop) {
            if let Some(t) = track {
                t.refused(code);
            }
            live.reply(&header, owned(dataplane::error_reply(code, message)));
            return Polled::Idle;
        }
        let req = match req.into_vos() {
            Ok(r) => r,
            Err(e) => {
                if let Some(t) = track {
                    t.refused(e.code);
                }
                live.reply(&header, owned(dataplane::error_reply(e.code, e.msg)));
                return Polled::Idle;
            }
        };
        // A fetch's bytes may be read straight into the response region,
        // page-aligned after the frame header (the region stays mapped: the
        // reply holds the connection).
        let area = match req {
            peregrine_vos::Request::Fetch(_) => live.conn.reply_area(),
            _ => None,
        };
        let l = live.clone();
        if let Some(t) = &mut track {
            t.queued();
        }
        Polled::Request(
            req,
            Box::new(move |r: ReplyRef<'_>| {
                if let Some(t) = track {
                    t.answered(&r);
                }
                let r = r.map(|(answer, bulk)| (request::response(answer), bulk));
                l.reply(
                    &header,
                    r.unwrap_or_else(|e| owned(dataplane::error_reply(e.code, e.msg))),
                )
            }),
            area,
        )
    }
}

fn owned((resp, bulk): dataplane::Reply) -> (DataResponse, Gather<'static>) {
    (resp, Gather::from(bulk))
}
