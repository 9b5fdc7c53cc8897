//! An object discarded without waiting ([`Object::start_discard`]): the
//! punches of a removed file's data go out while its remover goes on. The
//! removal of the name is the step a caller must see done (durable, all or
//! nothing); the data's punch only reclaims what no name reaches any more,
//! so a remover of many files need not wait for each in turn.

use crate::error::{Error, Result};
use crate::object::{call_to, Object};
use crate::placement::{PoolMap, ShardLoc};
use crate::transport::Started;
use peregrine_proto::frame::Opcode;
use prost::Message;
use std::sync::Arc;

/// The punches of an [`Object::start_discard`], sent and not yet answered.
/// [`Discarding::finish`] reads their replies; dropping it does too.
pub struct Discarding {
    obj: Object,
    map: Arc<PoolMap>,
    sent: Vec<(ShardLoc, Vec<u8>, Started)>,
}

impl Object {
    /// [`Object::discard`], started: each live shard's punch is sent (over
    /// shared memory, written to the engine's region; over TCP, made whole
    /// here) and the replies are left to [`Discarding::finish`].
    pub fn start_discard(&self) -> Result<Discarding> {
        let map = self.cont.pool().map();
        let punches = self
            .discard_punches(&map)
            .map_err(|e| e.context(format!("object {}", self.oid)))?;
        let transport = self.cont.pool().client().transport();
        let mut sent = Vec::new();
        for (loc, req) in punches {
            let msg = req.encode_to_vec();
            let started = transport.start(&call_to(&map, &loc, Opcode::Punch, &msg));
            sent.push((loc, msg, started));
        }
        Ok(Discarding {
            obj: self.clone(),
            map,
            sent,
        })
    }
}

impl Discarding {
    /// Whether every punch is answered: [`Discarding::finish`] would not wait.
    pub fn ready(&self) -> bool {
        self.sent.iter().all(|(_, _, s)| s.ready())
    }

    /// Wait for the punches' replies. If one failed (a pool map changed
    /// since, an engine restarting), the whole discard is made again, with
    /// the retries of [`Object::discard`]; its error if that fails too.
    pub fn finish(mut self) -> Result<()> {
        self.finish_sent()
    }

    fn finish_sent(&mut self) -> Result<()> {
        if self.sent.is_empty() {
            return Ok(());
        }
        let transport = self.obj.cont.pool().client().transport().clone();
        let mut failed: Option<Error> = None;
        for (loc, msg, started) in self.sent.drain(..) {
            let r = transport.finish(
                started,
                &call_to(&self.map, &loc, Opcode::Punch, &msg),
                None,
            );
            if let Err(e) = self.obj.decoded(&self.map, &loc, r) {
                failed.get_or_insert(e);
            }
        }
        match failed {
            None => Ok(()),
            Some(_) => self.obj.discard(),
        }
    }
}

impl Drop for Discarding {
    fn drop(&mut self) {
        if let Err(e) = self.finish_sent() {
            tracing::warn!(error = %e, "discard of a removed object failed: its space is not reclaimed");
        }
    }
}
