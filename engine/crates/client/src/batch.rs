//! Array reads kept in flight from one thread, as a DAOS event queue keeps
//! them without a thread each: [`Container::fetch_arrays`] sends a batch
//! and waits for all of it, [`ReadQueue`] takes each read's reply as it
//! comes and lets the caller send the next at once (a steady queue depth,
//! as fio's io_uring jobs keep). The first copy of every read's shard is
//! asked ([`crate::Transport::start`]: over shared memory the request is
//! written and nothing waits). A read neither covers (erasure-coded
//! objects, reads above [`MAX_IO`]) or that fails in them is made alone
//! afterwards, as [`crate::ObjectAt::fetch_array_into`] makes it, with its
//! retries and other copies.

use crate::container::Container;
use crate::error::Result;
use crate::object::{call_to, check_keys, check_range, Object, MAX_IO};
use crate::placement::{PoolMap, ShardLoc};
use crate::read::array_iod;
use crate::transport::{Call, Reply, Started};
use peregrine_proto::frame::Opcode;
use peregrine_proto::EPOCH_LATEST;
use prost::Message;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// One read of [`Container::fetch_arrays`] and [`ReadQueue`]: `buf.len()`
/// bytes of ARRAY `akey` of `dkey` at `offset`, holes as zeros.
pub struct ArrayRead<'a> {
    pub obj: &'a Object,
    pub dkey: &'a [u8],
    pub akey: &'a [u8],
    pub offset: u64,
    pub buf: &'a mut [u8],
}

impl ArrayRead<'_> {
    /// The shard to ask and the encoded fetch, if the read is a plain one
    /// (one shard, one request) whose first copy may be asked now.
    fn request(&self, map: &PoolMap) -> Option<(ShardLoc, Vec<u8>)> {
        let plain = self.obj.rs.is_none()
            && self.buf.len() <= MAX_IO
            && check_keys(self.dkey, Some(self.akey)).is_ok()
            && check_range(self.offset, self.buf.len()).is_ok();
        let o = self.obj;
        let loc = plain
            .then(|| o.group(map, self.dkey).ok())
            .flatten()
            .and_then(|g| o.read_order(map, &g, self.dkey).first().copied())
            .filter(|loc| o.check_callable(map, loc, Opcode::Fetch).is_ok())?;
        let iod = array_iod(self.akey, self.offset, self.buf.len() as u64);
        let req = o.fetch_req(map, &loc, EPOCH_LATEST, self.dkey, vec![iod]);
        Some((loc, req.encode_to_vec()))
    }

    /// Take `reply`, from `loc`, into the buffer; false if the read is to
    /// be made again alone.
    fn take(&mut self, map: &PoolMap, loc: &ShardLoc, reply: Result<Reply>) -> bool {
        let o = self.obj;
        o.decoded(map, loc, reply)
            .and_then(|(body, reply)| o.fetched(map, loc, 1, body, reply, Some(&mut *self.buf)))
            .and_then(|mut v| {
                let v = v.pop().expect("one value per iod, checked");
                o.extent_into(map, loc, self.akey, v, self.buf)
            })
            .is_ok()
    }

    /// The read made alone, with retries and the other copies.
    fn alone(&mut self) -> Result<()> {
        self.obj
            .at(EPOCH_LATEST)
            .fetch_array_into(self.dkey, self.akey, self.offset, self.buf)
    }
}

impl Container {
    /// Every read of `reads` at the latest epoch, side by side from this
    /// thread; one result per read, in order.
    pub fn fetch_arrays(&self, reads: &mut [ArrayRead<'_>]) -> Vec<Result<()>> {
        let map = self.pool().map();
        let batch: Vec<(usize, ShardLoc, Vec<u8>)> = reads
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.request(&map).map(|(loc, msg)| (i, loc, msg)))
            .collect();
        let calls: Vec<Call<'_>> = batch
            .iter()
            .map(|(_, loc, msg)| call_to(&map, loc, Opcode::Fetch, msg))
            .collect();
        let replies = self.pool().client().transport().call_each(&calls);
        let mut done = vec![false; reads.len()];
        for ((i, loc, _), reply) in batch.iter().zip(replies) {
            done[*i] = reads[*i].take(&map, loc, reply);
        }
        reads
            .iter_mut()
            .zip(done)
            .map(|(r, ok)| if ok { Ok(()) } else { r.alone() })
            .collect()
    }
}

/// Reads in flight from one thread, their replies taken as they come:
/// [`ReadQueue::submit`] sends a read, [`ReadQueue::reap`] waits until at
/// least one is done and hands back every one that is, with its buffer.
pub struct ReadQueue<'a> {
    cont: &'a Container,
    /// In the order they were sent.
    sent: VecDeque<Sent<'a>>,
    /// Reads made whole at their submit (not plain, or no shard to ask).
    made: Vec<Completed<'a>>,
}

struct Sent<'a> {
    tag: u64,
    read: ArrayRead<'a>,
    map: Arc<PoolMap>,
    loc: ShardLoc,
    msg: Vec<u8>,
    started: Started,
}

/// A read [`ReadQueue::reap`] hands back: the `tag` it was submitted with,
/// the read (its buffer filled if `result` is `Ok`) and its result.
pub struct Completed<'a> {
    pub tag: u64,
    pub read: ArrayRead<'a>,
    pub result: Result<()>,
}

impl<'a> ReadQueue<'a> {
    pub fn new(cont: &'a Container) -> ReadQueue<'a> {
        ReadQueue {
            cont,
            sent: VecDeque::new(),
            made: Vec::new(),
        }
    }

    /// Reads submitted and not yet handed back.
    pub fn len(&self) -> usize {
        self.sent.len() + self.made.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Send `read` (at the latest epoch); `tag` names it in its [`Completed`].
    pub fn submit(&mut self, tag: u64, mut read: ArrayRead<'a>) {
        let map = self.cont.pool().map();
        let Some((loc, msg)) = read.request(&map) else {
            let result = read.alone();
            return self.made.push(Completed { tag, read, result });
        };
        let started =
            self.cont
                .pool()
                .client()
                .transport()
                .start(&call_to(&map, &loc, Opcode::Fetch, &msg));
        self.sent.push_back(Sent {
            tag,
            read,
            map,
            loc,
            msg,
            started,
        });
    }

    /// Wait until at least one read is done (none if the queue is empty)
    /// and append every one that is to `done`, in any order. While none
    /// is, every read is polled for the transport's polling budget; then
    /// the oldest is waited for (asleep, over shared memory).
    pub fn reap(&mut self, done: &mut Vec<Completed<'a>>) {
        let before = done.len();
        done.append(&mut self.made);
        // Poll every read, not just the oldest: the first reply to come is
        // taken, and its slot refilled, at once.
        let t = Instant::now();
        while let Some(oldest) = self.sent.front() {
            let spin = oldest.started.spin();
            let mut i = 0;
            while i < self.sent.len() {
                if self.sent[i].started.ready() {
                    let f = self.sent.remove(i).expect("index in range");
                    done.push(self.finish(f));
                } else {
                    i += 1;
                }
            }
            if done.len() > before {
                return;
            }
            if t.elapsed() >= spin {
                // The transport's polling budget is spent: sleep on the oldest.
                let f = self.sent.pop_front().expect("not empty");
                return done.push(self.finish(f));
            }
            std::thread::yield_now();
        }
    }

    fn finish(&self, f: Sent<'a>) -> Completed<'a> {
        let Sent {
            tag,
            mut read,
            map,
            loc,
            msg,
            started,
        } = f;
        let call = call_to(&map, &loc, Opcode::Fetch, &msg);
        let reply =
            self.cont
                .pool()
                .client()
                .transport()
                .finish(started, &call, Some(&mut *read.buf));
        let result = match read.take(&map, &loc, reply) {
            true => Ok(()),
            false => read.alone(),
        };
        Completed { tag, read, result }
    }
}

impl Drop for ReadQueue<'_> {
    /// Reads still in flight are waited for, so that their connections go
    /// back to the transport's pool rather than closed.
    fn drop(&mut self) {
        let tr = self.cont.pool().client().transport();
        for f in self.sent.drain(..) {
            let _ = tr.finish(
                f.started,
                &call_to(&f.map, &f.loc, Opcode::Fetch, &f.msg),
                None,
            );
        }
    }
}
