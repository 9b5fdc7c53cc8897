//! Several array reads at once from one thread ([`Container::fetch_arrays`]),
//! as a DAOS event queue keeps many reads in flight without a thread each:
//! the first copy of every read's shard is asked for all of them together
//! ([`crate::Transport::call_each`]: over shared memory every request goes
//! out before any reply is awaited). A read the batch does not cover
//! (erasure-coded objects, reads above [`MAX_IO`]) or that fails in it is
//! made alone afterwards, as [`crate::ObjectAt::fetch_array_into`] makes
//! it, with its retries and other copies.

use crate::container::Container;
use crate::error::Result;
use crate::object::{call_to, check_keys, check_range, Object, MAX_IO};
use crate::placement::ShardLoc;
use crate::read::array_iod;
use crate::transport::Call;
use peregrine_proto::frame::Opcode;
use peregrine_proto::EPOCH_LATEST;
use prost::Message;

/// One read of [`Container::fetch_arrays`]: `buf.len()` bytes of ARRAY
/// `akey` of `dkey` at `offset`, holes as zeros.
pub struct ArrayRead<'a> {
    pub obj: &'a Object,
    pub dkey: &'a [u8],
    pub akey: &'a [u8],
    pub offset: u64,
    pub buf: &'a mut [u8],
}

impl Container {
    /// Every read of `reads` at the latest epoch, side by side from this
    /// thread; one result per read, in order.
    pub fn fetch_arrays(&self, reads: &mut [ArrayRead<'_>]) -> Vec<Result<()>> {
        let map = self.pool().map();
        let mut batch: Vec<(usize, ShardLoc, Vec<u8>)> = Vec::with_capacity(reads.len());
        for (i, r) in reads.iter().enumerate() {
            let plain = r.obj.rs.is_none()
                && r.buf.len() <= MAX_IO
                && check_keys(r.dkey, Some(r.akey)).is_ok()
                && check_range(r.offset, r.buf.len()).is_ok();
            let Some(loc) = plain
                .then(|| r.obj.group(&map, r.dkey).ok())
                .flatten()
                .and_then(|g| r.obj.read_order(&map, &g, r.dkey).first().copied())
                .filter(|loc| r.obj.check_callable(&map, loc, Opcode::Fetch).is_ok())
            else {
                continue;
            };
            let iod = array_iod(r.akey, r.offset, r.buf.len() as u64);
            let req = r.obj.fetch_req(&map, &loc, EPOCH_LATEST, r.dkey, vec![iod]);
            batch.push((i, loc, req.encode_to_vec()));
        }
        let calls: Vec<Call<'_>> = batch
            .iter()
            .map(|(_, loc, msg)| call_to(&map, loc, Opcode::Fetch, msg))
            .collect();
        let replies = self.pool().client().transport().call_each(&calls);
        let mut done = vec![false; reads.len()];
        for ((i, loc, _), reply) in batch.iter().zip(replies) {
            let r = &mut reads[*i];
            let o = r.obj;
            done[*i] = o
                .decoded(&map, loc, reply)
                .and_then(|(body, reply)| o.fetched(&map, loc, 1, body, reply, None))
                .and_then(|mut v| {
                    let v = v.pop().expect("one value per iod, checked");
                    o.extent_into(&map, loc, r.akey, v, r.buf)
                })
                .is_ok();
        }
        reads
            .iter_mut()
            .zip(done)
            .map(|(r, ok)| match ok {
                true => Ok(()),
                false => r
                    .obj
                    .at(EPOCH_LATEST)
                    .fetch_array_into(r.dkey, r.akey, r.offset, r.buf),
            })
            .collect()
    }
}
