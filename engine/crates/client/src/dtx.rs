//! Updates of several shards as one distributed transaction (as DAOS DTX):
//! all of them take effect, or none.
//!
//! 1. **Prepare**: every shard gets its update (or punch) with the
//!    transaction ([`data::Dtx`]: a random id and the shards, leader
//!    first). Engines log it and hold it: a read of its dkey answers
//!    `-EINPROGRESS` (retried) until it is decided, so no reader sees part
//!    of it.
//! 2. **Committed once every shard prepared** (DAOS's "committable"): the
//!    update is acknowledged then, after one round trip. A prepare that
//!    fails aborts the transaction on every shard (one abort anywhere is
//!    enough: that shard refuses the prepare, so it is never prepared
//!    everywhere).
//! 3. **Apply**: this process tells every shard, in the background, in
//!    batches (one request per target for all the transactions waiting);
//!    until a shard hears, its reads of the dkey answer `-EINPROGRESS`, and
//!    a reader here sends what is waiting at once. If the process dies
//!    first, the engines settle it (their resolver, after
//!    `peregrine_vos::DTX_STALE_MS`): the leader asks every other shard,
//!    and commits if all hold it prepared; a shard that never saw it
//!    records it aborted, so a prepare still on its way is refused and the
//!    client that sent it cannot count it as committed.
//!
//! Retries of an operation keep its epoch and bytes, so a transaction whose
//! outcome the client could not learn and a retry of it write the same thing.

use crate::error::{Error, Result};
use crate::object::Object;
use crate::placement::{PoolMap, ShardLoc};
use crate::sync::{Condvar, Mutex};
use crate::Transport;
use peregrine_proto::data::{self, response::Body, Dtx, DtxDecideReq, DtxId, DtxShard};
use peregrine_proto::frame::Opcode;
use prost::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use uuid::Uuid;

/// Most shards one transaction spans (engines refuse more).
pub const MAX_SHARDS: usize = 64;
/// Most transactions one commit request names (engines refuse more).
const MAX_DECIDE: usize = 1024;

/// A fresh transaction over `shards` (the first is the leader), each
/// listed once per request it gets (`per_shard[i]` for `shards[i]`: a
/// shard prepared only in part is never committed).
fn new_dtx(map: &PoolMap, shards: &[ShardLoc], per_shard: &[usize]) -> Dtx {
    let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
    Dtx {
        id: Some(DtxId { hi, lo }),
        shards: shards
            .iter()
            .zip(per_shard)
            .flat_map(|(l, &n)| {
                let t = &map.targets[l.target];
                let s = DtxShard {
                    rank: t.rank,
                    target: t.index,
                };
                std::iter::repeat_n(s, n)
            })
            .collect(),
    }
}

impl Object {
    /// Run `prepare` on every shard of `live` (in parallel) as one
    /// transaction: committed if they all succeed, else aborted. One shard
    /// needs no transaction: `prepare` gets `None` and its update is
    /// applied at once.
    pub(crate) fn transact(
        &self,
        map: &PoolMap,
        live: &[ShardLoc],
        prepare: impl Fn(&ShardLoc, Option<&Dtx>) -> Result<()> + Sync,
    ) -> Result<()> {
        // Atomic per chunk only: an object punched over very many shards.
        live.chunks(MAX_SHARDS)
            .try_for_each(|c| self.transact_one(map, c, &prepare))
    }

    fn transact_one(
        &self,
        map: &PoolMap,
        live: &[ShardLoc],
        prepare: &(dyn Fn(&ShardLoc, Option<&Dtx>) -> Result<()> + Sync),
    ) -> Result<()> {
        self.run_dtx(map, live, live, |l| l.target, |l, tx| prepare(l, tx))
    }

    /// The protocol: `prepare` each of `jobs` (a request to the shard on
    /// target `target_of(job)`, one of `shards`, the transaction's shards,
    /// leader first) in parallel;
    /// committed if they all succeed, else aborted. One job alone needs no
    /// transaction (`None`); several on one shard do (applied one by one,
    /// a failure of the last would leave the first, and a condition of a
    /// later one would see the earlier ones' changes).
    pub(crate) fn run_dtx<J: Sync>(
        &self,
        map: &PoolMap,
        shards: &[ShardLoc],
        jobs: &[J],
        target_of: impl Fn(&J) -> usize,
        prepare: impl Fn(&J, Option<&Dtx>) -> Result<()> + Sync,
    ) -> Result<()> {
        if let [job] = jobs {
            return prepare(job, None);
        }
        if jobs.len() > MAX_SHARDS {
            return Err(Error::inval(format!(
                "a transaction of {} requests (at most {MAX_SHARDS})",
                jobs.len()
            )));
        }
        let per_shard: Vec<usize> = shards
            .iter()
            .map(|s| jobs.iter().filter(|j| target_of(j) == s.target).count())
            .collect();
        let dtx = new_dtx(map, shards, &per_shard);
        let id = dtx.id.expect("set by new_dtx");
        let prepared = crate::object::par_map(jobs, |j| prepare(j, Some(&dtx)));
        if let Some(e) = prepared.into_iter().find_map(|r| r.err()) {
            self.abort(map, shards, &id);
            return Err(match e.code {
                // A shard had already given up on this transaction (the
                // engines settled it while this prepare was slow): nothing
                // was applied; the caller's retry prepares afresh.
                c if c == -libc::ECANCELED => Error::new(-libc::EAGAIN, e.msg),
                _ => e,
            });
        }
        let client = self.container().pool().client();
        client.committer().push(shards.iter().map(|l| {
            let t = &map.targets[l.target];
            Commit {
                addr: t.addr.clone(),
                pool: map.uuid,
                target: t.index,
                map_version: map.version,
                handle: map.handle.clone(),
                id,
            }
        }));
        Ok(())
    }

    /// Abort on every shard at once, best effort. An abort recorded on any
    /// shard is enough: that shard refuses the prepare from then on, so the
    /// transaction can never be prepared everywhere, and whoever settles it
    /// finds the abort. (Not waiting on a dead leader first keeps the other
    /// shards' reads from waiting on it.)
    fn abort(&self, map: &PoolMap, shards: &[ShardLoc], id: &DtxId) {
        crate::object::par_map(shards, |loc| {
            let req = DtxDecideReq {
                addr: Some(self.address(map, loc)),
                ids: vec![*id],
                commit: false,
                leader: false,
            };
            if let Err(e) = self.call(map, loc, Opcode::DtxDecide, &req, &[]) {
                tracing::debug!("aborting transaction {:016x}{:016x}: {e}", id.hi, id.lo);
            }
        });
    }
}

/// A commit to tell one shard.
struct Commit {
    addr: String,
    pool: Uuid,
    target: u32,
    map_version: u64,
    /// The pool handle the decision is sent with.
    handle: Vec<u8>,
    id: DtxId,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Commit>,
    /// Commits pushed and sent so far (a flush waits for `sent` to reach
    /// what was pushed when it began).
    pushed: u64,
    sent: u64,
    stop: bool,
}

/// Sends the commits of this process's transactions to their shards, in
/// the background and in batches.
pub(crate) struct Committer {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Committer {
    pub(crate) fn start(transport: Arc<dyn Transport>) -> Committer {
        let queue: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let q = queue.clone();
        let thread = crate::signals::spawn_quiet(
            std::thread::Builder::new().name("peregrine-commit".into()),
            move || send_loop(&q, transport.as_ref()),
        )
            .map_err(|e| tracing::warn!("no commit thread ({e}): engines settle transactions themselves, reads wait seconds"))
            .ok();
        Committer { queue, thread }
    }

    fn push(&self, commits: impl Iterator<Item = Commit>) {
        let (m, cv) = &*self.queue;
        let mut q = m.lock();
        let before = q.waiting.len();
        q.waiting.extend(commits);
        q.pushed += (q.waiting.len() - before) as u64;
        cv.notify_all();
    }

    /// Wait until every commit pushed so far was sent.
    pub(crate) fn flush(&self) {
        if self.thread.is_none() {
            return;
        }
        let (m, cv) = &*self.queue;
        let mut q = m.lock();
        let upto = q.pushed;
        while q.sent < upto {
            cv.wait(&mut q);
        }
    }
}

impl Drop for Committer {
    /// What was acknowledged is sent before the process goes on without it.
    fn drop(&mut self) {
        self.flush();
        self.queue.0.lock().stop = true;
        self.queue.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn send_loop(queue: &(Mutex<Queue>, Condvar), tr: &dyn Transport) {
    let (m, cv) = queue;
    loop {
        let (batch, upto) = {
            let mut q = m.lock();
            while q.waiting.is_empty() && !q.stop {
                cv.wait(&mut q);
            }
            if q.waiting.is_empty() {
                return;
            }
            (std::mem::take(&mut q.waiting), q.pushed)
        };
        // Per shard (endpoint, pool, target): the newest map version and
        // its pool handle, and the transactions to decide.
        type Decisions = (u64, Vec<u8>, Vec<DtxId>);
        let mut to: BTreeMap<(String, Uuid, u32), Decisions> = BTreeMap::new();
        for c in batch {
            let e = to.entry((c.addr, c.pool, c.target)).or_default();
            if c.map_version >= e.0 {
                (e.0, e.1) = (c.map_version, c.handle);
            }
            e.2.push(c.id);
        }
        let groups: Vec<_> = to.into_iter().collect();
        crate::object::par_map(&groups, |((addr, pool, target), (version, handle, ids))| {
            for chunk in ids.chunks(MAX_DECIDE) {
                let req = DtxDecideReq {
                    addr: Some(data::Address {
                        pool: pool.as_bytes().to_vec(),
                        target: *target,
                        map_version: *version,
                        handle: handle.clone(),
                        ..Default::default()
                    }),
                    ids: chunk.to_vec(),
                    commit: true,
                    leader: false,
                };
                let r = tr
                    .call(addr, *target, Opcode::DtxDecide, &req.encode_to_vec(), &[])
                    .and_then(|reply| crate::object::reply_body(&reply.msg, || addr.clone()));
                if let Err(e) = r {
                    tracing::debug!("{addr} target {target}: {} commits not delivered ({e}); the engine will ask their leaders", chunk.len());
                }
            }
        });
        let mut q = m.lock();
        q.sent = upto;
        cv.notify_all();
    }
}

/// The state a shard reports for a transaction.
fn query_state(body: Option<Body>) -> Result<data::DtxState> {
    match body {
        Some(Body::DtxState(s)) => data::DtxState::try_from(s.state)
            .map_err(|_| Error::new(-libc::EPROTO, format!("unknown DTX state {}", s.state))),
        _ => Err(Error::new(
            -libc::EPROTO,
            "DTX query: reply without a state".to_string(),
        )),
    }
}

/// The target of `shard` in `map`, if the map has it.
pub fn target_of<'m>(map: &'m PoolMap, shard: &DtxShard) -> Option<&'m crate::placement::Target> {
    map.targets
        .iter()
        .find(|t| t.rank == shard.rank && t.index == shard.target)
}

/// Ask `shard` what it knows of transaction `id` of `map`'s pool (see
/// `DtxQueryReq.resolve`).
pub fn query(
    tr: &dyn Transport,
    map: &PoolMap,
    shard: &DtxShard,
    id: &DtxId,
    resolve: bool,
) -> Result<data::DtxState> {
    let at = || {
        format!(
            "pool {:?} rank {} target {}",
            map.name(),
            shard.rank,
            shard.target
        )
    };
    let t = target_of(map, shard).ok_or_else(|| {
        Error::new(
            -libc::ENOENT,
            format!("{}: not in pool map version {}", at(), map.version),
        )
    })?;
    let req = data::DtxQueryReq {
        addr: Some(data::Address {
            pool: map.uuid.as_bytes().to_vec(),
            target: shard.target,
            map_version: map.version,
            handle: map.handle.clone(),
            ..Default::default()
        }),
        id: Some(*id),
        resolve,
    };
    let reply = tr
        .call(
            &t.addr,
            t.index,
            Opcode::DtxQuery,
            &req.encode_to_vec(),
            &[],
        )
        .map_err(|e| e.context(at()))?;
    query_state(crate::object::reply_body(&reply.msg, at)?)
}
