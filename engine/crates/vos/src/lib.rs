//! Peregrine VOS: the versioned object store of one engine.
//!
//! # Layout
//! One device (a file or a kernel block device) holds, at fixed 1 MiB-aligned
//! offsets recorded in the superblock ([`Superblock`]):
//! the superblock at offset 0, two slots for the management-service blob, and
//! one region per target. A target region is `WAL | checkpoint 0 | checkpoint 1 | data`.
//! Each target is a thread that owns its region, its RAM index
//! (pool -> container -> object shard -> dkey -> akey -> versions), its block
//! allocator, its own O_DIRECT file descriptor, io_uring ring and registered
//! 2 MiB buffers (hugepages when available). Values of at least
//! [`StorageOptions::scm_value_max`] bytes (4 KiB unless configured) go to data blocks, always to
//! freshly allocated ones (copy-on-write), with one CRC32C per 4 KiB block
//! (per 32 KiB on devices formatted with superblock version 1), verified on
//! every read of it: a 4 KiB read reads and checks 4 KiB, and a corrupt
//! block fails only the reads that touch it (`-EILSEQ`);
//! smaller values and all metadata live in the index.
//!
//! # Crash consistency
//! The index changes only by applying a logged operation, and an operation is
//! applied only after its WAL record and data are written. A target gathers
//! queued updates into a batch, writes their data to blocks no live state
//! references (as it is copied in), writes ONE WAL record for the batch
//! (header and payload CRC, device uuid, sequence number) alongside, and
//! once all those writes are done applies the batch to the index and
//! acknowledges it; several batches may be in flight, applied and
//! acknowledged in sequence order.
//!
//! Acknowledged means written, as a POSIX file system's write(2): the device
//! (the kernel, for a file) holds it, so it survives the crash or `kill -9`
//! of any process. The WAL record goes with O_DIRECT or, on a device file
//! by default, through the page cache ([`WalIo`]): a write the kernel holds
//! in either case. A flush (fdatasync) of the device's volatile write cache
//! makes it survive a power cut too: a [`Request::Flush`] (what fsync turns
//! into), an update or punch with `sync` set (containers with property
//! `sync=always`), and the target on its own at most
//! [`StorageOptions::flush_interval`] after an acknowledged update. A flush
//! covers every record written before it, and each record carries the
//! highest sequence number known flushed when it was written (a stamp).
//!
//! After a crash or a power cut, replay reads the records in order. A batch
//! torn by a crash fails its CRC or sequence check and is dropped whole with
//! everything after it. A record may have reached the device without its data
//! (they are written side by side, and a power cut loses any write not
//! flushed): replay verifies the data checksums of every record after the
//! last stamp it read, and drops from the first that fails, with everything
//! after it (none of that was flushed, so what survives a power cut is a
//! prefix of what was acknowledged, and all that was flushed). Blocks a
//! record frees keep their bytes until a flushed record's stamp covers that
//! record, so replay never checks a record against blocks that were
//! rewritten since. Records in flight past the end that replay reached stay
//! on the device until overwritten; each record carries the generation of
//! the target's opening that wrote it, and replay stops at a record whose
//! generation it already passed, so such a leftover is never taken for a
//! later batch once the restart's own records lead up to it.
//!
//! When the WAL has grown past twice the last checkpoint (at least 64 MiB,
//! at most half the WAL), the target serializes its index to the
//! inactive checkpoint slot (stamped with the last applied sequence), fsyncs,
//! and restarts the WAL at its beginning with the next sequence number. Replay
//! takes the newest valid checkpoint and then the WAL records numbered exactly
//! after it: records of an older generation or another format (device uuid)
//! stop the scan. Block allocation is never logged: it is rebuilt from the
//! index, so blocks of an update that never became durable are simply free
//! again, and blocks freed by an overwrite, punch, container destroy or
//! aggregation return to the allocator only when a flushed stamp covers the
//! operation freeing them (or a checkpoint follows it), so neither a live
//! value nor one replay may still check is overwritten.
//!
//! # Semantics chosen where the protocol leaves room
//! - A punch at epoch `p` hides versions at epochs `<= p` for reads at `>= p`.
//! - Fetch of a SINGLE akey with no visible value: that iod's `status` is
//!   `-ENOENT`, `len` 0, nothing in the bulk, and `absent` is set.
//! - Fetch of an ARRAY iod always returns exactly `len` bytes (zeros in holes),
//!   even when the akey does not exist: then `status` 0 and `size` 0.
//!   `absent` is set when no extent of the akey is visible at the epoch
//!   read (never written, or punched), so written zeros are told from
//!   nothing; an akey with extents elsewhere (a hole at the range read) is
//!   not absent.
//! - `QuerySize` returns the array size, or the single value's size for a
//!   single-value akey, or 0 when nothing is visible; `absent` is set
//!   exactly when nothing (no single value, no extent) is visible. With
//!   `last` set it reads no dkey: it answers the last dkey in key order
//!   (before `last.before`, if set) whose akey has a non-zero such size,
//!   scanning at most [`LAST_SCAN_MAX`] dkeys and else saying where to go on.
//! - `ListChanged` (reintegration) reads `addr.pool` and `addr.target`
//!   only; a pool the target does not have is `-ENOENT`, as for `List`.
//!   It lists (cont, oid, shard, dkey) in that order (uuid bytes, then
//!   `oid.hi`, `oid.lo`, shard, dkey bytes), strictly after the anchor:
//!   every dkey holding a version or a dkey/akey punch above `since`, and
//!   every dkey of an object with an object punch above `since` (such an
//!   object with no dkeys left is listed once, with an empty dkey). `max`
//!   0 means 1024, capped at 4096; `done` is false only when another key
//!   follows. What aggregation removed is not listed: overwritten
//!   versions need no copy, but neither is a punch whose tomb it dropped
//!   (nothing left below it here), though the returning target may still
//!   hold what it hid: aggregation is to be held while a target is out.
//! - `ListRecords` of a pool, container or object the target does not have:
//!   `-ENOENT` for the pool (as `List`), no records for the others; an
//!   empty dkey lists the object's punches only. Records come in order:
//!   object punches, dkey punches, then per akey (byte order) its punches
//!   and values, each ascending by epoch (extents of one epoch in write
//!   order). A value is listed only when it shows at least one byte at the
//!   latest epoch. More than 65536 records for one dkey is `-E2BIG`.
//! - `FetchedValue.crc` is always the CRC32C of the bytes returned; `has_crc` is
//!   true when every extent contributing bytes was stored with a client CRC.
//! - Listing: keys strictly after `anchor`, ascending byte order, at most `max`
//!   (0 means 1000); the reply's anchor is the last key returned.
//! - Punches are not charged against the pool quota (so a full pool can always be
//!   punched and aggregated), though their records count in the used bytes.
//! - `UpdateReq.insert_only`: the update fails whole with `-EEXIST` (nothing
//!   stored) if any of its akeys has a value visible at the latest epoch
//!   (any epoch, not punched), judged on the index plus the updates and
//!   punches prepared before it in the same batch (so of two conditional
//!   inserts of one akey in one batch the second fails).
//! - Updates at epoch `u64::MAX` are rejected (that epoch means "latest" for reads).
//! - `pool_destroy` of an absent pool succeeds (idempotent, for retries);
//!   `pool_create` of an existing pool succeeds for the same sizes and fails
//!   with EEXIST for other sizes; `pool_space` of an absent pool is ENOENT.
//! - Containers need no creation: the first update creates them on a target;
//!   `cont_destroy` of an absent container succeeds.
//! - Aggregation runs up to the current epoch and keeps every version above
//!   it; a target records the highest such epoch and refuses a snapshot
//!   being added at or below it (`StorageError::Retry`: take it at a newer
//!   epoch), since versions only that snapshot would read may be gone.
//!   Targets aggregate on their own (a pool's data region 80% full, an
//!   update that does not fit in a tier or its container's quota, a
//!   container near its quota, no client request for 30 s) only under the
//!   aggregation lease ([`Storage::lease_aggregation`]; endless unless an
//!   engine sets it).
//! - `FetchedValue.epoch` is the newest epoch of the versions the returned
//!   bytes come from (ARRAY: those showing in the range read; SINGLE: the
//!   value's), 0 when nothing is.
//! - `Iod.has_unchanged_since` (ARRAY values only; on a SINGLE one the
//!   update is `-EINVAL`): the update fails whole with `-EBUSY`, nothing
//!   stored, if a stored extent of the akey overlapping the iod's range has
//!   an epoch above `unchanged_since`, or if a change of the akey is in
//!   flight on the target or held by another transaction.
//!
//! # Transactions (DTX)
//! An update or punch with `dtx` set is *prepared*: validated, staged and
//! logged as usual, answered once written, but held (invisible to reads and
//! aggregation, its space counted as used by its pool) until its
//! transaction is decided by [`Request::DtxDecide`]: a commit applies what
//! is held at its own epochs, an abort frees it. The state of a transaction
//! on a target counts the changes in flight as applied.
//! - A prepare of an aborted transaction is `-ECANCELED`; of a committed
//!   one, or a repeat of a change already held (same container, object,
//!   dkey, epoch and kind: a retry), succeeds and stores nothing.
//! - Commit: prepared or committed succeeds; aborted is `-ECANCELED`;
//!   unknown is `-ENOENT` for the leader and recorded as committed by the
//!   other shards. Abort: committed is `-EEXIST`; anything else is, or is
//!   recorded as, aborted (a later prepare is refused). At most 1024 ids; if
//!   one fails, none is decided. Decisions are kept an hour after later ones.
//! - `DtxQuery` with `resolve` records an unknown transaction as aborted (a
//!   prepare of it still on its way is refused); `DtxPending` lists the
//!   transactions of a pool held at least `older_than_ms`, oldest first.
//! - A fetch, size query, list or list-records of a dkey with a held change
//!   at or below the epoch read (list records: any epoch; a held punch of
//!   the object holds every dkey; a list of dkeys: any held change of the
//!   object) fails whole with `-EINPROGRESS`. `ListChanged` lists every key
//!   with a held change, whatever its epoch.
//! - Destroying a pool or container drops the changes held in it; a pool's
//!   decisions go with it.
//!
//! # Threads and replies
//! [`Storage::submit`] returns a `std::sync::mpsc::Receiver` that receives
//! exactly one [`Reply`]; call `recv()` from a blocking context.
//! [`Storage::submit_with`] instead calls a callback with the reply on the
//! target's thread (no thread is parked waiting: e.g. complete a tokio
//! oneshot, or write a small reply straight back to the client); that reply
//! ([`ReplyRef`]) may borrow the target's device buffers ([`Gather`]) for
//! the duration of the call, and an update's values may stay in the
//! client's shared memory until the target copies them ([`Bulk`]).
//! Fetches are answered from applied (acknowledged) state only, before the updates queued
//! in the same batch commit (see the `target` module). Control calls (`pool_create`, ...) block
//! until every target has answered.
//!
//! # Source files
//! - `target/`: one target's thread. `mod.rs` (its state), `event_loop.rs`
//!   (queue, sources, ring, completions), `request.rs` (data-plane requests
//!   other than fetches), `fetch.rs` (fetches), `list.rs` (listings, size
//!   queries), `update.rs` (update and punch preparation), `commit.rs`
//!   (group commit, WAL records), `flush.rs` (flushes, stamps, freed
//!   blocks), `checkpoint.rs`, `replay.rs`, `control.rs` (pools,
//!   containers, snapshots, quotas), `aggregate.rs` (when aggregation
//!   runs), `scrub.rs`.
//! - `index/`: the in-RAM trees of a target. `mod.rs` (the trees),
//!   `apply.rs` (logged changes and their application), `read.rs`
//!   (visibility, fetch plans), `list.rs` (listings), `aggregate.rs`.
//! - `dtx/`: transactions. `mod.rs` (their types), `table.rs` (the table
//!   of those held and decided), `decisions.rs` (what a target decides on
//!   them), `tests.rs`.
//! - `condition.rs` (conditional updates and punches), `wal.rs` (record
//!   format), `superblock.rs` (device layout), `device.rs` and
//!   `bufpool.rs` (io_uring, registered buffers), `alloc.rs` (data blocks),
//!   `compact.rs` (compact keys and maps of the index), `bulk.rs` (request
//!   and reply bytes), `counters.rs` (metrics), `mgmt.rs` (the
//!   management-service blob), `error.rs`.
//! - `request/`: what a target is asked and answers, in the store's own
//!   types (no protobuf: the engine converts and checks the wire's
//!   messages at its edge, `peregrine_engine::request`). `types.rs` (the
//!   requests: typed addresses, kinds, conditions, transactions),
//!   `answer.rs` (the replies), `mod.rs` (the [`Request`] enum, sources,
//!   the checks that bound a request before it is queued).
//!   `open.rs` (storage options, [`Storage::open`]), `stats.rs` (space,
//!   counters, faults and scrub reports of a [`Storage`]); `lib.rs` keeps
//!   [`Storage`] itself (submission, pools and containers, aggregation).

mod alloc;
mod bufpool;
mod bulk;
mod compact;
mod condition;
mod counters;
mod device;
mod dtx;
mod error;
mod index;
mod mgmt;
mod open;
mod request;
mod stats;
mod superblock;
mod target;
mod wal;

pub use bulk::{Bulk, Gather, SharedBytes};
pub use counters::{TargetCounters, TargetSpace, TierSpace};
pub use dtx::TxId;
pub use dtx::{DTX_STALE_MS, MAX_DECIDE, MAX_SHARDS};
pub use error::{Errno, StorageError};
pub use open::{
    BdevClass, BdevSpec, StorageOptions, WalIo, DEFAULT_FLUSH_INTERVAL, DEFAULT_POLL,
    DEFAULT_READ_SPIN, SCM_VALUE_MAX,
};
pub(crate) use request::Responder;
pub use request::{
    check_request, Address, Answer, ChangedKey, Condition, Dtx, DtxDecideReq, DtxPending,
    DtxPendingReq, DtxQueryReq, DtxState, Expect, FetchReq, FetchedValue, FlushReq, Iod, IodKind,
    LastSized, ListChangedReq, ListRecordsReq, ListReq, ObjectId, Polled, PoolAddress, PunchReq,
    QuerySizeReq, Record, RecordKind, Reply, ReplyArea, ReplyFn, ReplyRef, Request, ShardId,
    Source, UpdateReq, ValueKind,
};
pub use stats::{PoolSpace, TargetStats};
pub use superblock::{format, scan, ScanState, Superblock};
pub use target::{ContQuota, QuotaShare, ScrubReport, DEFAULT_SCRUB_RATE};

/// Most dkeys one `QuerySize` of the last sized dkey scans on the target's
/// thread before it answers where to go on ([`Answer::Last`]): a file whose
/// last chunks are all punched cannot hold the target for long.
pub const LAST_SCAN_MAX: usize = 4096;

/// One container's quota as the management service pushes it: `limit` in
/// stored bytes (`None` lifts it), of which the other engines hold `elsewhere`.
#[derive(Clone, Copy, Debug)]
pub struct QuotaPush {
    pub cont: Uuid,
    pub limit: Option<u64>,
    pub elsewhere: u64,
}

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;
use target::{Ctl, CtlOut, Mailbox, Msg};
use uuid::Uuid;

/// An open device with its running target threads.
pub struct Storage {
    sb: Superblock,
    senders: Vec<Mailbox>,
    /// Per target: why it refuses updates (a failed device write), if it does.
    faults: Vec<std::sync::Arc<Mutex<Option<String>>>>,
    /// Per target: what it publishes for metrics.
    counters: Vec<std::sync::Arc<TargetCounters>>,
    threads: Vec<JoinHandle<()>>,
    mgmt: Mutex<mgmt::MgmtSlots>,
    lease: std::sync::Arc<AggregationLease>,
    /// What opening repaired (a superblock copy rewritten), one line each.
    repairs: Vec<String>,
    /// How the targets write their WAL: what the options asked for, unless
    /// the host file system could not reserve its blocks.
    wal_io: WalIo,
}

/// Until when the targets may aggregate on their own (a pool filling, an
/// update that does not fit, or idle). An engine in a system holds it only while the management service
/// counts it as up and it knows the snapshot lists: a snapshot taken while
/// the service counts the engine as down skips it, and the engine learns of
/// it only when it is back; aggregating meanwhile could drop what the
/// snapshot reads. Standalone, the lease never ends.
pub(crate) struct AggregationLease {
    base: Instant,
    /// Nanoseconds after `base`.
    until: AtomicU64,
    /// Per pool, the highest epoch aggregation may run up to
    /// ([`Storage::cap_aggregation`]).
    caps: Mutex<HashMap<Uuid, u64>>,
}

impl Default for AggregationLease {
    fn default() -> Self {
        AggregationLease {
            base: Instant::now(),
            until: AtomicU64::new(u64::MAX),
            caps: Mutex::default(),
        }
    }
}

impl AggregationLease {
    pub(crate) fn valid(&self) -> bool {
        (self.base.elapsed().as_nanos() as u64) < self.until.load(Ordering::Relaxed)
    }

    /// The epoch an aggregation of `pool` starting now runs up to.
    pub(crate) fn upto(&self, pool: &Uuid) -> u64 {
        let now = peregrine_proto::epoch_now();
        self.caps.lock().get(pool).map_or(now, |&c| c.min(now))
    }
}

impl Storage {
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    pub fn targets(&self) -> u32 {
        self.sb.targets
    }

    /// How the targets write their WAL (see [`StorageOptions::wal_io`]).
    pub fn wal_io(&self) -> WalIo {
        self.wal_io
    }

    /// Queue one data-plane request on its target. The receiver gets exactly
    /// one reply, once the request is done (an update: once written).
    pub fn submit(&self, req: Request) -> mpsc::Receiver<Reply> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.submit_with(req, move |r: ReplyRef<'_>| {
            let _ = tx.send(r.map(|(resp, bulk)| (resp, bulk.into_vec())));
        });
        rx
    }

    /// Let target `target` poll `src` for requests from now on. Returns the
    /// two descriptors that the source's client needs to wake the target
    /// when it sleeps: its eventfd and its page (read-only for anyone but
    /// the target; word 0 non-zero while the target sleeps).
    pub fn attach(
        &self,
        target: u32,
        src: Box<dyn Source>,
    ) -> Result<(std::os::fd::RawFd, std::os::fd::RawFd), StorageError> {
        use std::os::fd::AsRawFd;
        let n = self.senders.len();
        let mb = self.senders.get(target as usize).ok_or_else(|| {
            StorageError::Invalid(format!(
                "target {target} out of range (this engine has {n} targets)"
            ))
        })?;
        mb.send(Msg::Attach(src))
            .map_err(|_| StorageError::Shutdown(format!("target {target}: stopped")))?;
        let w = mb.wake();
        Ok((w.fd.as_raw_fd(), w.page_fd.as_raw_fd()))
    }

    /// Queue one data-plane request on its target; `reply` is called exactly
    /// once with its reply, once the request is done (an update: once
    /// written), on the target's thread (or on the caller's, for a request
    /// rejected before it is queued). It must be quick and must not block:
    /// e.g. send on a tokio oneshot or a channel, or copy a small reply out.
    pub fn submit_with(
        &self,
        req: Request,
        reply: impl for<'a> FnOnce(ReplyRef<'a>) + Send + 'static,
    ) {
        let tx = Responder(Some(Box::new(reply)));
        let n = self.senders.len() as u32;
        let target = match req.target() {
            t if t >= n => Err(Errno::inval(format!(
                "request: target {t} out of range (this engine has {n} targets)"
            ))),
            t => Ok(t as usize),
        };
        match target {
            Err(e) => tx.send(Err(e)),
            Ok(t) => {
                if let Err(crossbeam_channel::SendError(Msg::Data(_, tx))) =
                    self.senders[t].send(Msg::Data(req, tx))
                {
                    tx.send(Err(Errno::new(
                        -libc::ESHUTDOWN,
                        format!("target {t}: stopped"),
                    )));
                }
            }
        }
    }

    fn ctl(&self, t: usize, c: Ctl) -> Result<CtlOut, StorageError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let gone = || StorageError::Shutdown(format!("target {t}: stopped"));
        self.senders[t].send(Msg::Ctl(c, tx)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }

    fn ctl_all(&self, mk: impl Fn() -> Ctl) -> Result<Vec<CtlOut>, StorageError> {
        (0..self.senders.len()).map(|t| self.ctl(t, mk())).collect()
    }

    /// Reserve `scm_per_target` / `nvme_per_target` bytes on every target,
    /// durably. Idempotent for the same uuid and sizes; all or nothing.
    pub fn pool_create(
        &self,
        pool: Uuid,
        scm_per_target: u64,
        nvme_per_target: u64,
    ) -> Result<(), StorageError> {
        let mut created = Vec::new();
        for t in 0..self.senders.len() {
            let c = Ctl::PoolCreate {
                pool,
                scm: scm_per_target,
                nvme: nvme_per_target,
            };
            match self.ctl(t, c) {
                Ok(CtlOut::Created(true)) => created.push(t),
                Ok(_) => {}
                Err(e) => {
                    for t in created {
                        let _ = self.ctl(t, Ctl::PoolDestroy { pool });
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Drop the pool and everything in it on every target. Idempotent: a pool
    /// that is not (or no longer) here is not an error, so the management
    /// service can retry a destroy that failed half-way.
    pub fn pool_destroy(&self, pool: Uuid) -> Result<(), StorageError> {
        self.ctl_all(|| Ctl::PoolDestroy { pool }).map(|_| ())
    }

    pub fn pools(&self) -> Vec<Uuid> {
        match self.ctl(0, Ctl::Pools) {
            Ok(CtlOut::Pools(p)) => p,
            _ => Vec::new(),
        }
    }

    /// Drop all data of a container on every target; its space returns to the pool.
    pub fn cont_destroy(&self, pool: Uuid, cont: Uuid) -> Result<(), StorageError> {
        self.ctl_all(|| Ctl::ContDestroy { pool, cont }).map(|_| ())
    }

    /// Epochs of the container's snapshots: aggregation keeps them readable.
    /// `adding` names the snapshot being created, if any: a target that
    /// already aggregated past its epoch refuses the list
    /// ([`StorageError::Retry`]); the snapshot needs a newer epoch.
    pub fn set_snapshots(
        &self,
        pool: Uuid,
        cont: Uuid,
        epochs: Vec<u64>,
        adding: Option<u64>,
    ) -> Result<(), StorageError> {
        self.ctl_all(|| Ctl::SetSnapshots {
            pool,
            cont,
            epochs: epochs.clone(),
            adding,
        })
        .map(|_| ())
    }

    /// Enforce containers' quotas ([`QuotaPush`]); this engine's targets
    /// share their own counts (see [`ContQuota`]). A push of a lower
    /// `version` than one applied is ignored (it was measured before the
    /// change that the applied one carries).
    pub fn set_quotas(
        &self,
        pool: Uuid,
        version: u64,
        quotas: &[QuotaPush],
    ) -> Result<(), StorageError> {
        // What each target holds of each container: one question per target for all of them.
        let spaces: Vec<HashMap<Uuid, u64>> = self
            .ctl_all(|| Ctl::PoolSpace { pool })?
            .into_iter()
            .map(|o| match o {
                CtlOut::Space(s) => s.cont_used,
                _ => HashMap::new(),
            })
            .collect();
        for q in quotas {
            let cont = q.cont;
            let share = q.limit.map(|_| {
                let here: Vec<u64> = spaces
                    .iter()
                    .map(|s| s.get(&cont).copied().unwrap_or(0))
                    .collect();
                std::sync::Arc::new(QuotaShare::new(&here))
            });
            for t in 0..spaces.len() {
                let quota = q.limit.zip(share.clone()).map(|(limit, share)| ContQuota {
                    limit,
                    elsewhere: q.elsewhere,
                    share,
                });
                self.ctl(
                    t,
                    Ctl::SetQuota {
                        pool,
                        cont,
                        version,
                        quota,
                    },
                )?;
            }
        }
        Ok(())
    }

    /// Let the targets aggregate on their own until `until` (see
    /// [`AggregationLease`]); a time already past holds them from now on.
    /// An explicit [`Storage::aggregate`] is not held.
    pub fn lease_aggregation(&self, until: Instant) {
        let ns = until
            .checked_duration_since(self.lease.base)
            .map_or(0, |d| d.as_nanos() as u64);
        self.lease.until.store(ns, Ordering::Relaxed);
    }

    /// Let aggregations of `pool` (on their own or asked for) run up to
    /// `cap` at most, or again up to the present (`None`). Aggregation keeps
    /// every version and punch above the epoch it runs up to; an engine
    /// caps it while a target of the pool is out, so that reintegration
    /// finds every record the returning target may have missed (a punch
    /// goes once nothing is left below it). Aggregations that start after
    /// the call obey it.
    pub fn cap_aggregation(&self, pool: Uuid, cap: Option<u64>) {
        let mut caps = self.lease.caps.lock();
        match cap {
            Some(c) => caps.insert(pool, c),
            None => caps.remove(&pool),
        };
    }

    /// Reclaim versions that no read at a snapshot or at any epoch from now
    /// on can see; bytes reclaimed.
    pub fn aggregate(&self, pool: Uuid) -> Result<u64, StorageError> {
        Ok(self
            .ctl_all(|| Ctl::Aggregate { pool })?
            .into_iter()
            .map(|o| if let CtlOut::Reclaimed(n) = o { n } else { 0 })
            .sum())
    }

    /// The newest durable management blob, if any was stored.
    pub fn mgmt_load(&self) -> Result<Option<Vec<u8>>, StorageError> {
        self.mgmt.lock().load()
    }

    /// Store the management blob atomically and durably.
    pub fn mgmt_store(&self, blob: &[u8]) -> Result<(), StorageError> {
        self.mgmt.lock().store(blob)
    }

    /// Set every target's scrubbing rate, bytes per second (0: off; until
    /// then it is [`StorageOptions::scrub_rate`]); a target between passes
    /// starts its next pass now.
    pub fn set_scrub_rate(&self, bytes_per_sec: u64) {
        for t in 0..self.senders.len() {
            let _ = self.ctl(t, Ctl::Scrub(Some(bytes_per_sec)));
        }
    }

    /// What opening the device repaired, one line each (a damaged or
    /// missing superblock copy rewritten from the other).
    pub fn repairs(&self) -> &[String] {
        &self.repairs
    }

    /// Stop the target threads WITHOUT their closing checkpoint, leaving the
    /// device as a crash after the last acknowledged update would (tests).
    #[doc(hidden)]
    pub fn abandon(mut self) {
        for s in &self.senders {
            let _ = s.send(Msg::Halt);
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }

    fn stop(&mut self) {
        for s in &self.senders {
            let _ = s.send(Msg::Stop);
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }

    /// Stop the target threads (each writes a checkpoint first).
    pub fn close(mut self) {
        self.stop();
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.stop();
    }
}
