//! Objects discarded without waiting: the punches of removed files' data
//! go out while their remover goes on. The removal of a name is the step a
//! caller must see done (durable, all or nothing); the data's punch only
//! reclaims what no name reaches any more, so a remover of many files need
//! not wait for each in turn, and the punches of many files go out together.
//!
//! [`Discarding::start`] sends the punches of several objects' live shards,
//! one request per target: the first shard in the request's address, the
//! others in its `more` (a DISCARD frame; an engine that does not know it
//! refuses it, and those objects are then punched alone, as
//! [`Object::discard`] does). A remover of many small files costs the
//! engines one request per target for every [`DISCARD_BATCH`] files instead
//! of one per file and target: half the requests of an `rm -r`, whose
//! other half is the names' removals (bench/posix-il.md).
//!
//! [`DiscardQueue`] gathers the objects a mount removes and sends them,
//! from a thread of its own, once [`DISCARD_BATCH`] are waiting or the
//! oldest has waited [`DISCARD_DELAY`]. Space stays taken that long after a
//! removal; a process killed in between leaves what it had queued (at most
//! [`DISCARD_QUEUE_MAX`] objects) unpunched: space no name reaches, never
//! data a name shows.

use crate::error::{Error, Result};
use crate::object::{call_to, Object};
use crate::placement::{PoolMap, ShardLoc};
use crate::sync::{Condvar, Mutex, MutexGuard};
use crate::transport::Started;
use peregrine_proto::data::{self, PunchReq};
use peregrine_proto::frame::Opcode;
use peregrine_proto::MAX_DISCARD_MORE;
use prost::Message;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Objects a [`DiscardQueue`] sends together.
pub const DISCARD_BATCH: usize = 64;
/// Longest an object waits in a [`DiscardQueue`] for others to go with.
pub const DISCARD_DELAY: Duration = Duration::from_millis(2);
/// Objects a [`DiscardQueue`] holds at most; a remover that finds it full
/// waits until its thread has sent a batch.
pub const DISCARD_QUEUE_MAX: usize = 4 * DISCARD_BATCH;
/// How long a queue's thread waits for work before it ends.
const FLUSHER_IDLE: Duration = Duration::from_secs(1);

/// The punches of [`Discarding::start`], sent and not yet answered.
/// [`Discarding::finish`] reads their replies; dropping it does too.
pub struct Discarding {
    objs: Vec<Object>,
    /// The pool map the punches were made under (`None`: no objects).
    map: Option<Arc<PoolMap>>,
    sent: Vec<Sent>,
    /// Objects whose punches could not be made (their layout): discarded
    /// alone at the finish.
    unsent: Vec<usize>,
}

/// One request of a [`Discarding`]: to one target, for the shards there of
/// the objects at `objs` (indices into [`Discarding::objs`]).
struct Sent {
    loc: ShardLoc,
    op: Opcode,
    msg: Vec<u8>,
    started: Started,
    objs: Vec<usize>,
}

/// Punches of shards on one target, gathered into one request.
struct Gathered {
    loc: ShardLoc,
    req: PunchReq,
    objs: Vec<usize>,
}

impl Discarding {
    /// [`Object::discard`] of each of `objs` (objects nothing names any
    /// more), started: the punches of their live shards are sent, one
    /// request per target and container (over shared memory, written to
    /// the engine's region; over TCP, made whole here), and the replies are
    /// left to [`Discarding::finish`].
    pub fn start(objs: Vec<Object>) -> Discarding {
        let Some(first) = objs.first() else {
            return Discarding {
                objs,
                map: None,
                sent: Vec::new(),
                unsent: Vec::new(),
            };
        };
        let map = first.cont.pool().map();
        let mut groups: Vec<Gathered> = Vec::new();
        let mut unsent = Vec::new();
        for (i, o) in objs.iter().enumerate() {
            match o.discard_punches(&map) {
                Ok(punches) => {
                    for (loc, req) in punches {
                        gather(&mut groups, i, loc, req);
                    }
                }
                Err(_) => unsent.push(i),
            }
        }
        let transport = first.cont.pool().client().transport();
        let sent = groups
            .into_iter()
            .map(|g| {
                let op = match g.req.more.is_empty() {
                    true => Opcode::Punch,
                    false => Opcode::Discard,
                };
                let msg = g.req.encode_to_vec();
                let started = transport.start(&call_to(&map, &g.loc, op, &msg));
                Sent {
                    loc: g.loc,
                    op,
                    msg,
                    started,
                    objs: g.objs,
                }
            })
            .collect();
        Discarding {
            objs,
            map: Some(map),
            sent,
            unsent,
        }
    }

    /// Wait for the punches' replies. The objects of a request that failed
    /// (a pool map changed since, an engine restarting, one that does not
    /// know DISCARD) are discarded again each alone, with the retries of
    /// [`Object::discard`]; the first error if that fails too.
    pub fn finish(mut self) -> Result<()> {
        self.finish_sent()
    }

    fn finish_sent(&mut self) -> Result<()> {
        let (Some(first), Some(map)) = (self.objs.first(), &self.map) else {
            return Ok(());
        };
        let transport = first.cont.pool().client().transport().clone();
        let mut again = std::mem::take(&mut self.unsent);
        for s in self.sent.drain(..) {
            let r = transport.finish(s.started, &call_to(map, &s.loc, s.op, &s.msg), None);
            let obj = &self.objs[s.objs[0]];
            if obj.decoded(map, &s.loc, r).is_err() {
                again.extend(s.objs);
            }
        }
        again.sort_unstable();
        again.dedup();
        let mut first_err = Ok(());
        for i in again {
            if let Err(e) = self.objs[i].discard() {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        first_err
    }
}

/// Add the punch of object `i`'s shard at `loc` to the request for its
/// target and container, or start one (a full one is left as it is).
fn gather(groups: &mut Vec<Gathered>, i: usize, loc: ShardLoc, req: PunchReq) {
    let same = |a: &Option<data::Address>, b: &Option<data::Address>| match (a, b) {
        (Some(a), Some(b)) => {
            a.pool == b.pool
                && a.cont == b.cont
                && a.target == b.target
                && a.map_version == b.map_version
                && a.handle == b.handle
        }
        _ => false,
    };
    let open = groups.iter_mut().find(|g| {
        g.loc.target == loc.target
            && g.req.more.len() < MAX_DISCARD_MORE
            && same(&g.req.addr, &req.addr)
    });
    match open {
        Some(g) => {
            let a = req.addr.as_ref().expect("compared above");
            g.req.more.push(data::ShardId {
                oid: a.oid,
                shard: a.shard,
            });
            // Above every write the objects had: the latest of their punches.
            g.req.epoch = g.req.epoch.max(req.epoch);
            if g.objs.last() != Some(&i) {
                g.objs.push(i);
            }
        }
        None => groups.push(Gathered {
            loc,
            req,
            objs: vec![i],
        }),
    }
}

impl Drop for Discarding {
    fn drop(&mut self) {
        if let Err(e) = self.finish_sent() {
            tracing::warn!(error = %e, "discard of a removed object failed: its space is not reclaimed");
        }
    }
}

/// Removed objects waiting to be discarded together (see the module docs).
/// Dropping it sends what waits and waits for it.
pub struct DiscardQueue {
    shared: Arc<Shared>,
}

struct Shared {
    st: Mutex<QueueState>,
    /// Signalled when objects are queued, a batch is sent or someone
    /// waits for the queue to empty.
    changed: Condvar,
}

#[derive(Default)]
struct QueueState {
    /// The process the counts below are of: a forked child (which has
    /// none of its parent's threads) starts them again.
    pid: u32,
    queued: Vec<Object>,
    /// When the oldest of `queued` was queued.
    oldest: Option<Instant>,
    /// A thread serves the queue.
    flusher: bool,
    /// Batches taken from the queue and not yet answered.
    sending: usize,
    /// Someone waits for everything queued to be sent: no delay.
    urgent: usize,
    /// The first failure since the last [`DiscardQueue::settle`].
    failed: Option<Error>,
}

impl QueueState {
    /// The oldest `n` objects queued (at most), counted in `sending` until
    /// [`send`] has sent them.
    fn take(&mut self, n: usize) -> Vec<Object> {
        let n = self.queued.len().min(n);
        let batch: Vec<Object> = self.queued.drain(..n).collect();
        self.oldest = (!self.queued.is_empty()).then(Instant::now);
        self.sending += 1;
        batch
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        let mut st = self.st.lock();
        let pid = std::process::id();
        if st.pid != pid {
            // Forked (or new): the parent's thread and batches are not
            // this process's. What it had queued is sent here too (a
            // second punch of an object changes nothing).
            st.pid = pid;
            st.flusher = false;
            st.sending = 0;
            st.urgent = 0;
        }
        st
    }
}

impl Default for DiscardQueue {
    fn default() -> Self {
        DiscardQueue {
            shared: Arc::new(Shared {
                st: Mutex::new(QueueState::default()),
                changed: Condvar::new(),
            }),
        }
    }
}

impl DiscardQueue {
    /// Queue `obj`, which nothing names any more, for discarding; waits
    /// only if [`DISCARD_QUEUE_MAX`] objects wait already.
    pub fn push(&self, obj: Object) {
        let sh = &self.shared;
        let mut st = sh.lock();
        while st.queued.len() >= DISCARD_QUEUE_MAX {
            sh.changed.wait(&mut st);
        }
        st.queued.push(obj);
        st.oldest.get_or_insert_with(Instant::now);
        if !st.flusher {
            st.flusher = true;
            let shared = sh.clone();
            let spawned = crate::signals::spawn_quiet(
                std::thread::Builder::new().name("peregrine-discard".into()),
                move || flusher(&shared),
            );
            if spawned.is_err() {
                // No thread: send it here, and try again next time.
                st.flusher = false;
                let batch = st.take(usize::MAX);
                drop(st);
                send(sh, batch);
                return;
            }
        }
        if st.queued.len() >= DISCARD_BATCH {
            sh.changed.notify_all();
        }
    }

    /// Send everything queued now and wait for all of it; the first
    /// failure since the last settle (each failure is also logged).
    pub fn settle(&self) -> Result<()> {
        let sh = &self.shared;
        let mut st = sh.lock();
        st.urgent += 1;
        sh.changed.notify_all();
        while !st.queued.is_empty() || st.sending > 0 {
            if !st.flusher && !st.queued.is_empty() {
                // Nobody serves it (no thread could be started): send here.
                let batch = st.take(usize::MAX);
                drop(st);
                send(sh, batch);
                st = sh.lock();
                continue;
            }
            sh.changed.wait(&mut st);
        }
        st.urgent -= 1;
        match st.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for DiscardQueue {
    fn drop(&mut self) {
        if let Err(e) = self.settle() {
            tracing::warn!(error = %e, "discard of a removed object failed: its space is not reclaimed");
        }
    }
}

/// The queue's thread: sends a batch once one is full, the oldest object
/// has waited [`DISCARD_DELAY`] or someone settles; ends after
/// [`FLUSHER_IDLE`] without work.
fn flusher(sh: &Shared) {
    let mut st = sh.lock();
    loop {
        let Some(oldest) = st.oldest else {
            let idle_since = Instant::now();
            while st.oldest.is_none() && idle_since.elapsed() < FLUSHER_IDLE {
                sh.changed.wait_for(&mut st, FLUSHER_IDLE);
            }
            if st.oldest.is_none() {
                st.flusher = false;
                return;
            }
            continue;
        };
        let due = oldest + DISCARD_DELAY;
        if st.queued.len() < DISCARD_BATCH && st.urgent == 0 && Instant::now() < due {
            sh.changed
                .wait_for(&mut st, due.saturating_duration_since(Instant::now()));
            continue;
        }
        let batch = st.take(DISCARD_BATCH);
        drop(st);
        send(sh, batch);
        st = sh.lock();
    }
}

/// Discard `batch` (counted in `sending`) and wait for it; a failure is
/// logged and kept for [`DiscardQueue::settle`].
fn send(sh: &Shared, batch: Vec<Object>) {
    let r = Discarding::start(batch).finish();
    let mut st = sh.lock();
    st.sending -= 1;
    if let Err(e) = r {
        tracing::warn!(error = %e, "discard of a removed object failed: its space is not reclaimed");
        st.failed.get_or_insert(e);
    }
    sh.changed.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn punch(target: u32, lo: u64, epoch: u64) -> PunchReq {
        PunchReq {
            addr: Some(data::Address {
                pool: vec![1; 16],
                cont: vec![2; 16],
                oid: Some(data::ObjectId { hi: 0, lo }),
                shard: lo as u32,
                target,
                map_version: 3,
                handle: vec![4],
            }),
            epoch,
            ..Default::default()
        }
    }

    fn loc(target: usize) -> ShardLoc {
        ShardLoc { shard: 0, target }
    }

    #[test]
    fn punches_are_gathered_per_target_and_bounded() {
        let mut groups = Vec::new();
        // Objects 0..600, each with a shard on targets 0 and 1.
        for i in 0..600u64 {
            for t in 0..2 {
                gather(&mut groups, i as usize, loc(t), punch(t as u32, i, 10 + i));
            }
        }
        // At most 1 + MAX_DISCARD_MORE objects a request: 3 per target.
        assert_eq!(groups.len(), 6);
        for t in 0..2 {
            let mine: Vec<&Gathered> = groups.iter().filter(|g| g.loc.target == t).collect();
            let sizes: Vec<usize> = mine.iter().map(|g| 1 + g.req.more.len()).collect();
            assert_eq!(sizes, vec![256, 256, 88]);
            let named: Vec<u64> = mine
                .iter()
                .flat_map(|g| {
                    let first = g.req.addr.as_ref().unwrap().oid.unwrap().lo;
                    std::iter::once(first).chain(g.req.more.iter().map(|s| s.oid.unwrap().lo))
                })
                .collect();
            assert_eq!(named, (0..600).collect::<Vec<_>>());
            for g in &mine {
                // The latest punch epoch of the objects it names; their indices.
                let last = *g.objs.last().unwrap() as u64;
                assert_eq!(g.req.epoch, 10 + last);
                assert_eq!(g.objs.len(), 1 + g.req.more.len());
                for s in &g.req.more {
                    assert_eq!(s.shard as u64, s.oid.unwrap().lo);
                }
            }
        }
        // Another container or map version never shares a request.
        let mut other = punch(0, 900, 1);
        other.addr.as_mut().unwrap().cont = vec![9; 16];
        gather(&mut groups, 600, loc(0), other);
        let mut stale = punch(0, 901, 1);
        stale.addr.as_mut().unwrap().map_version = 2;
        gather(&mut groups, 601, loc(0), stale);
        assert_eq!(groups.len(), 8);
    }
}
