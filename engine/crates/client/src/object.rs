//! [`Object`]: the I/O path of the client library (updates, punches, the
//! retry and pool-map rules, shard requests); pools, containers and the
//! client are in their own modules, reads in `read`, EC reads in `ec_read`.
//!
//! Layout rules (the contract between every client of a container):
//! - **Striping** (`S1`, `S2`, `S4`, `SX`): a dkey's group has one shard,
//!   which holds every value of the dkey.
//! - **Replication** (`RP_*`): every shard of the dkey's group holds a full
//!   copy. Updates go to all shards in parallel and are acknowledged when
//!   all succeed; reads use one replica (spread by hash of oid and dkey) and
//!   fall back to the next on any error (degraded read).
//! - **Erasure coding** (`EC_kPp`, cell [`EC_CELL_SIZE`]): array byte `o` is
//!   in cell `c = o / cell`, stripe `s = c / k`, stored on data shard
//!   `c % k` at shard offset `s * cell + o % cell`; parity shard `j` holds
//!   stripe `s`'s parity cell `j` at `s * cell`. A write takes stripes in
//!   batches, each one transaction over all live cells (see the `ec_write`
//!   module): whole stripes are encoded from the caller's bytes; partial
//!   ones are read (reconstructed if a data shard cannot be read), merged,
//!   encoded, and written only where they changed (the caller's bytes, and
//!   parity), as a compare-and-swap on the stripe's version so that
//!   concurrent writers in other processes never lose each other's bytes.
//!   The logical array size is kept in a companion ARRAY akey
//!   `"\0prg.size\0" + akey` ([`EC_SIZE_PREFIX`]) replicated on all `k + p`
//!   shards: each write also stores one zero byte at `end - 1`, so the
//!   engine's own "highest byte + 1" *is* the logical size; it only grows,
//!   needs no read-modify-write and cannot race. Listing hides these akeys.
//!   SINGLE values of EC objects are replicated to all `k + p` shards.
//! - **Conditional insert** ([`Object::insert_single`]): the group's first
//!   shard (index order) on an up-and-in target arbitrates; it takes the
//!   update with `insert_only` first, the other shards get it only after it
//!   succeeded. So an insert goes on while a replica is out: the next one
//!   arbitrates (a target being reintegrated does not, it may not hold
//!   every entry yet). Limit: when a target comes back in, an insert that
//!   was arbitrated by its replica under the previous map and one
//!   arbitrated by it under the new map can both win if they race within
//!   the first's second step (its writes to the other shards).
//! - **Checksums** (container property `checksum = crc32c`): every value
//!   goes out with its CRC32C (`has_crc`) and every fetched value carrying a
//!   CRC is verified; a mismatch counts as a failed shard, so the read moves
//!   on to another replica or reconstructs from parity, and fails with
//!   `-EILSEQ` naming the object and dkey only when nothing good is left.
//! - **Epochs**: each update (each piece of a large one) takes a fresh epoch
//!   from the process's hybrid logical clock; reads are at
//!   [`EPOCH_LATEST`] unless made through [`Object::at`].
//! - **Pool map**: targets are up-and-in (reads and writes), up (being
//!   reintegrated: writes only) or down (neither). Writes skip down shards
//!   while a group keeps its redundancy (at most `fault_tolerance` down);
//!   reads use up-and-in shards only. A shard that does not answer is never
//!   skipped on the client's own judgement: the operation retries with a
//!   refreshed map until the engine answers again or the management service
//!   has excluded it ([`RETRY_WINDOW`]); an engine answering `-ESTALE` (the
//!   client's map is older than its own) makes the client refresh the map
//!   and retry. So an update is acknowledged degraded only under a map that
//!   marks the skipped shard down, and reintegration copies it there before
//!   the shard serves reads again (see the `reintegrate` module).
//! - **Transactions**: an update or punch of more than one shard (the
//!   replicas of an RP object, the cells of an EC stripe batch) is one
//!   distributed transaction (see the `dtx` module): it takes effect on all
//!   of them or on none, and a read of a dkey with one in progress waits
//!   for its outcome (`-EINPROGRESS`, retried).

use crate::container::Container;
use crate::error::{fmt_key, Error, Result};
use crate::hlc;
use crate::placement::{self, Group, PoolMap, ShardLoc};
use crate::sync::Mutex;
use peregrine_isal::{crc32c_append, ReedSolomon};
use peregrine_proto::data::{self, response::Body, FlushReq, Iod, PunchReq, UpdateReq, ValueKind};
use peregrine_proto::frame::Opcode;
use peregrine_proto::oclass::EC_CELL_SIZE;
use peregrine_proto::{ObjectClass, ObjectId, CSUM_ERRNO, EPOCH_LATEST};
use prost::Message;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// Prefix of the companion akey holding an EC array's logical size.
pub const EC_SIZE_PREFIX: &[u8] = b"\0prg.size\0";
/// Largest bulk of one request to one shard for striped/replicated arrays.
pub const MAX_IO: usize = 8 << 20;
// What this library sends or asks for in one request stays within what
// engines accept ([`peregrine_proto::MAX_IO_BYTES`]): array I/O is split
// into pieces of `MAX_IO` (EC: `EC_BATCH_STRIPES` cells per shard), a
// single value is at most the limit itself (`check_single`).
const _: () = assert!(MAX_IO as u64 <= peregrine_proto::MAX_IO_BYTES);
const _: () =
    assert!(crate::ec_write::EC_BATCH_STRIPES * EC_CELL_SIZE <= peregrine_proto::MAX_IO_BYTES);
pub use crate::ec_write::{EC_BATCH_STRIPES, EC_CAS_ROUNDS};
/// Keys per list request.
pub const LIST_BATCH: u32 = 1024;
/// Locks serializing this process's EC writes per stripe.
pub(crate) const STRIPE_LOCKS: usize = 256;
/// Most shard requests run at once by one operation.
const MAX_PARALLEL: usize = 32;
/// How long an operation keeps retrying a shard that does not answer (or an
/// engine that says the client's pool map is stale): longer than the
/// management service takes to exclude a dead engine
/// (`HEARTBEAT_TIMEOUT`, 6 s), so a write waits for the exclusion rather
/// than failing half-applied.
pub const RETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a read keeps retrying engines that call its pool map stale, are
/// starting, or hold a transaction on its dkey undecided: time for the
/// engines to settle one whose client died (`peregrine_vos::DTX_STALE_MS`,
/// then a round of questions), or whose leader died (failure detection, 6 s).
pub(crate) const READ_RETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(20);
/// How long an update refused for its container's quota is retried: the
/// engines reclaim what removals and overwrites freed as the container
/// nears its quota, and learn what the others hold once a second (the
/// management service's `QUOTA_EVERY`), so room made by removing files
/// shows within two rounds.
const QUOTA_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
const QUOTA_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);
const RETRY_PAUSE_MIN: std::time::Duration = std::time::Duration::from_millis(20);
const RETRY_PAUSE_MAX: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a conditional insert waits for a transaction that holds its
/// key prepared: past the engines' own settling of a transaction whose
/// client died (the engines' `DTX_STALE_MS`, 2 s), with margin.
const HELD_KEY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Failures a retry with a fresh pool map can get past: a stale map, an
/// engine starting or restarting, a connection lost or refused.
fn retryable(code: i32) -> bool {
    [
        libc::ESTALE,
        libc::EAGAIN,
        libc::EHOSTUNREACH,
        libc::ECONNRESET,
        libc::ECONNREFUSED,
        libc::ETIMEDOUT,
        libc::ESHUTDOWN,
        libc::EPIPE,
    ]
    .contains(&-code)
}

/// Failures that a newer pool map could route around: a target down or
/// being reintegrated in this client's map, or an engine that cannot be
/// reached (a newer map may show it excluded, and another copy back).
fn map_may_be_stale(code: i32) -> bool {
    code == -libc::EHOSTDOWN || retryable(code)
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object")
            .field("oid", &self.oid.to_string())
            .field("class", &self.class)
            .finish()
    }
}

/// Reed-Solomon codecs are shared per (k, p): building one inverts matrices.
pub(crate) fn rs_codec(k: usize, p: usize) -> Arc<ReedSolomon> {
    type Codecs = Mutex<HashMap<(usize, usize), Arc<ReedSolomon>>>;
    static CODECS: OnceLock<Codecs> = OnceLock::new();
    CODECS
        .get_or_init(Default::default)
        .lock()
        .entry((k, p))
        .or_insert_with(|| Arc::new(ReedSolomon::new(k, p)))
        .clone()
}

/// Run `f` over `items` in parallel on the client's worker threads (at
/// most [`MAX_PARALLEL`] at once; the first item runs on the calling thread).
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    crate::workers::par_map(items, MAX_PARALLEL, f)
}

/// Several failed attempts at one read, as one error: `-EILSEQ` if any
/// attempt found corrupt data (the caller cares that data is bad, not that
/// another replica was also down), else the last attempt's code.
pub(crate) fn combine(what: &str, mut errs: Vec<Error>) -> Error {
    if errs.len() == 1 {
        return errs.pop().unwrap().context(what);
    }
    let code = if errs.iter().any(|e| e.code == -libc::ESTALE) {
        // A newer pool map may show where to read: retried with it.
        -libc::ESTALE
    } else if errs.iter().any(|e| e.code == -CSUM_ERRNO) {
        -CSUM_ERRNO
    } else if errs.iter().any(|e| e.code == -libc::EAGAIN) {
        // A replica is only starting: worth another try.
        -libc::EAGAIN
    } else if errs.iter().any(|e| e.code == -libc::EINPROGRESS) {
        // An update is being decided: read again once it is.
        -libc::EINPROGRESS
    } else {
        errs.last().map(|e| e.code).unwrap_or(-libc::EIO)
    };
    let list: Vec<String> = errs.into_iter().map(|e| e.msg).collect();
    Error::new(
        code,
        format!("{what}: no readable copy: {}", list.join("; ")),
    )
}

/// One value as fetched from one shard, its checksum already verified.
pub(crate) struct Fetched {
    /// 0, or a negative errno (`-EILSEQ` also when the CRC did not match).
    pub(crate) status: i32,
    pub(crate) data: Vec<u8>,
    /// The data went into the caller's buffer instead ([`Object::fetch_shard_with`]).
    pub(crate) placed: bool,
    /// The newest epoch of the versions it was read from (0: none).
    pub(crate) epoch: u64,
    /// ARRAY: the highest byte written + 1 as this fetch saw it; SINGLE:
    /// the value's size.
    pub(crate) size: u64,
}

/// An open object. Cheap to clone.
#[derive(Clone)]
pub struct Object {
    pub(crate) cont: Container,
    pub(crate) oid: ObjectId,
    pub(crate) class: ObjectClass,
    pub(crate) rs: Option<Arc<ReedSolomon>>,
    pub(crate) layout: Arc<Mutex<Option<CachedLayout>>>,
}

/// An object's groups under the pool map of the given version.
type CachedLayout = (u64, Arc<Vec<Group>>);

/// A read-only view of an object at one epoch (a snapshot's, or latest).
pub struct ObjectAt<'a> {
    pub(crate) obj: &'a Object,
    pub(crate) epoch: u64,
}

impl Object {
    pub fn id(&self) -> ObjectId {
        self.oid
    }
    pub fn class(&self) -> ObjectClass {
        self.class
    }
    pub fn container(&self) -> &Container {
        &self.cont
    }

    /// Keys valid and the value small enough for one frame.
    pub(crate) fn check_single(&self, dkey: &[u8], akey: &[u8], value: &[u8]) -> Result<()> {
        check_keys(dkey, Some(akey))?;
        if value.len() as u64 > peregrine_proto::MAX_IO_BYTES {
            return Err(Error::inval(format!(
                "{}: single value of {} bytes is too large (at most {} bytes, MAX_IO_BYTES)",
                self.what(dkey),
                value.len(),
                peregrine_proto::MAX_IO_BYTES
            )));
        }
        Ok(())
    }

    /// Reads at `epoch` (e.g. a snapshot's); [`EPOCH_LATEST`] is the latest.
    pub fn at(&self, epoch: u64) -> ObjectAt<'_> {
        ObjectAt { obj: self, epoch }
    }

    // ---- public API: updates ----

    /// Replace SINGLE value `akey` of `dkey`.
    pub fn update_single(&self, dkey: &[u8], akey: &[u8], value: &[u8]) -> Result<()> {
        self.check_single(dkey, akey, value)?;
        self.with_map(|map| {
            let g = self.group(map, dkey)?;
            let epoch = hlc::now();
            let iod = self.iod(akey, ValueKind::Single, 0, &[value]);
            self.write_shards(map, &[g], |loc, tx| {
                self.update_shard(map, loc, tx, epoch, dkey, vec![iod.clone()], &[value])
            })
        })
        .map_err(|e| e.context(self.what(dkey)))
    }

    /// Create SINGLE value `akey` of `dkey` only if it does not exist:
    /// fails with `-EEXIST` (and writes nothing) if it has a value, so of
    /// several clients inserting the same key at once exactly one succeeds.
    ///
    /// The group's first shard (shard index order) is the arbiter: the
    /// conditional update goes to it alone first, and only once it succeeds
    /// are the other shards of the group (the other replicas; for EC
    /// objects, whose single values are replicated to all `k + p` shards,
    /// the other cells) written, unconditionally, at the same epoch. If the
    /// first shard's target is down, the insert fails with `-EHOSTDOWN`
    /// instead of choosing another arbiter: two clients with different pool
    /// maps could otherwise both "win" on different shards. Down shards
    /// other than the first are skipped as for [`Object::update_single`]
    /// (within the class's fault tolerance). Should a later replica write
    /// fail, the error is returned but the arbiter keeps the value: a retry
    /// then sees `-EEXIST` (as DAOS, a failed conditional create may have
    /// happened). Returns the epoch the value was written at.
    pub fn insert_single(&self, dkey: &[u8], akey: &[u8], value: &[u8]) -> Result<u64> {
        self.check_single(dkey, akey, value)?;
        let epoch = hlc::now();
        let iod = self.iod(akey, ValueKind::Single, 0, &[value]);
        // The arbiter: a stale map (-ESTALE) is refreshed and retried, as
        // the engine rejects it before storing anything.
        let mut arbiter = 0;
        self.with_map(|map| {
            let g = self.group(map, dkey)?;
            let Some(&first) = g.shards.iter().find(|s| map.targets[s.target].readable) else {
                return Err(Error::new(
                    -libc::EHOSTDOWN,
                    format!(
                        "{}: conditional insert: no shard of the group is up and in to arbitrate",
                        self.what(dkey)
                    ),
                ));
            };
            self.check_redundancy(map, &g)?;
            let req = self.update_req(map, &first, None, epoch, dkey, vec![iod.clone()]);
            let req = UpdateReq {
                insert_only: true,
                ..req
            };
            arbiter = first.shard;
            // -EBUSY: a transaction holds a change of the key prepared (a
            // rename into or out of this name, maybe this process's own
            // with its commit not sent yet); asked again once decided.
            let deadline = std::time::Instant::now() + HELD_KEY_WAIT;
            let mut pause = std::time::Duration::from_micros(200);
            loop {
                match self.call(map, &first, Opcode::Update, &req, &[value]) {
                    Err(e) if e.code == -libc::EBUSY && std::time::Instant::now() < deadline => {
                        self.cont.pool().client().committer().flush();
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(RETRY_PAUSE_MAX);
                    }
                    r => return r.map(|_| ()),
                }
            }
        })
        .map_err(|e| e.context(format!("{} akey {}", self.what(dkey), fmt_key(akey))))?;
        // The other shards, unconditionally (retried separately: the
        // arbiter must not be asked again).
        self.with_map(|map| {
            let g = self.group(map, dkey)?;
            let rest = Group {
                group: g.group,
                shards: g
                    .shards
                    .iter()
                    .copied()
                    .filter(|s| s.shard != arbiter)
                    .collect(),
            };
            self.check_redundancy(map, &g)?;
            self.write_shards(map, &[rest], |loc, tx| {
                self.update_shard(map, loc, tx, epoch, dkey, vec![iod.clone()], &[value])
            })
        })
        .map_err(|e| e.context(self.what(dkey)))?;
        Ok(epoch)
    }

    /// Write `data` at byte `offset` of ARRAY value `akey` of `dkey`.
    pub fn update_array(&self, dkey: &[u8], akey: &[u8], offset: u64, data: &[u8]) -> Result<()> {
        check_keys(dkey, Some(akey))?;
        check_range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let r = if self.rs.is_some() {
            self.ec_update(dkey, akey, offset, data)
        } else {
            let mut done = 0usize;
            for piece in data.chunks(MAX_IO) {
                let off = offset + done as u64;
                self.with_map(|map| {
                    let g = self.group(map, dkey)?;
                    let epoch = hlc::now();
                    let iod = self.iod(akey, ValueKind::Array, off, &[piece]);
                    self.write_shards(map, &[g], |loc, tx| {
                        self.update_shard(map, loc, tx, epoch, dkey, vec![iod.clone()], &[piece])
                    })
                })?;
                done += piece.len();
            }
            Ok(())
        };
        r.map_err(|e| e.context(self.what(dkey)))
    }

    /// Punch the whole object (every shard of every group).
    pub fn punch(&self) -> Result<()> {
        self.with_map(|map| {
            let groups = self.layout(map)?;
            let epoch = hlc::now();
            self.write_shards(map, &groups, |loc, tx| {
                self.punch_shard(map, loc, tx, epoch, b"", &[])
            })
        })
        .map_err(|e| e.context(format!("object {}", self.oid)))
    }

    /// Punch an object that nothing names any more (its last name is
    /// gone): every live shard on its own, in parallel, not as one
    /// transaction. No reader can see it half punched, and a shard that a
    /// failure leaves unpunched is only space not reclaimed yet, while a
    /// transaction would cost every shard a second durable write (the
    /// commit after the prepare) and hold its reads until then.
    pub fn discard(&self) -> Result<()> {
        self.with_map(|map| {
            let punches = self.discard_punches(map)?;
            self.call_each(map, Opcode::Punch, &punches)
                .into_iter()
                .try_for_each(|r| r.map(|_| ()))
        })
        .map_err(|e| e.context(format!("object {}", self.oid)))
    }

    /// The punch of each live shard that discards the object.
    pub(crate) fn discard_punches(&self, map: &PoolMap) -> Result<Vec<(ShardLoc, PunchReq)>> {
        let groups = self.layout(map)?;
        let epoch = hlc::now();
        Ok(groups
            .iter()
            .flat_map(|g| g.shards.iter())
            .filter(|l| map.targets[l.target].up)
            .map(|loc| (*loc, self.punch_req(map, loc, None, epoch, b"", &[])))
            .collect())
    }

    /// Punch `dkey` and everything under it.
    pub fn punch_dkey(&self, dkey: &[u8]) -> Result<()> {
        check_keys(dkey, None)?;
        self.with_map(|map| {
            let g = self.group(map, dkey)?;
            let epoch = hlc::now();
            self.write_shards(map, &[g], |loc, tx| {
                self.punch_shard(map, loc, tx, epoch, dkey, &[])
            })
        })
        .map_err(|e| e.context(self.what(dkey)))
    }

    /// Punch some akeys of `dkey`.
    pub fn punch_akeys(&self, dkey: &[u8], akeys: &[&[u8]]) -> Result<()> {
        check_keys(dkey, None)?;
        if akeys.is_empty() {
            return Ok(());
        }
        for a in akeys {
            check_keys(dkey, Some(a))?;
        }
        let mut all: Vec<Vec<u8>> = akeys.iter().map(|a| a.to_vec()).collect();
        if self.rs.is_some() {
            all.extend(akeys.iter().map(|a| size_akey(a)));
        }
        self.with_map(|map| {
            let g = self.group(map, dkey)?;
            let epoch = hlc::now();
            self.write_shards(map, &[g], |loc, tx| {
                self.punch_shard(map, loc, tx, epoch, dkey, &all)
            })
        })
        .map_err(|e| e.context(self.what(dkey)))
    }

    // ---- public API: reads at the latest epoch ----

    /// The SINGLE value `akey` of `dkey`, `None` if it does not exist.
    pub fn fetch_single(&self, dkey: &[u8], akey: &[u8]) -> Result<Option<Vec<u8>>> {
        self.at(EPOCH_LATEST).fetch_single(dkey, akey)
    }
    /// The SINGLE value `akey` of `dkey` and the epoch of its version.
    pub fn fetch_single_versioned(
        &self,
        dkey: &[u8],
        akey: &[u8],
    ) -> Result<Option<(Vec<u8>, u64)>> {
        self.at(EPOCH_LATEST).fetch_single_versioned(dkey, akey)
    }
    /// Exactly `len` bytes at `offset` of ARRAY `akey` (holes read as zeros).
    pub fn fetch_array(
        &self,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        self.at(EPOCH_LATEST).fetch_array(dkey, akey, offset, len)
    }
    /// Like [`Object::fetch_array`] into a caller's buffer.
    pub fn fetch_array_into(
        &self,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        self.at(EPOCH_LATEST)
            .fetch_array_into(dkey, akey, offset, buf)
    }
    /// Size of ARRAY `akey`: highest byte written + 1 (0 if absent).
    pub fn array_size(&self, dkey: &[u8], akey: &[u8]) -> Result<u64> {
        self.at(EPOCH_LATEST).array_size(dkey, akey)
    }
    /// [`ObjectAt::fetch_array_with_end`] at the latest epoch.
    pub fn fetch_array_with_end(
        &self,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        buf: &mut [u8],
    ) -> Result<Option<crate::FetchedWithEnd>> {
        self.at(EPOCH_LATEST)
            .fetch_array_with_end(dkey, akey, offset, buf)
    }
    /// The last dkey whose `akey` has a non-zero size, and that size.
    pub fn last_sized(&self, akey: &[u8]) -> Result<Option<(Vec<u8>, u64)>> {
        self.at(EPOCH_LATEST).last_sized(akey)
    }
    /// All dkeys, sorted.
    pub fn list_dkeys(&self) -> Result<Vec<Vec<u8>>> {
        self.at(EPOCH_LATEST).list_dkeys()
    }
    /// The akeys of `dkey`, sorted.
    pub fn list_akeys(&self, dkey: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.at(EPOCH_LATEST).list_akeys(dkey)
    }

    // ---- internals ----

    pub(crate) fn what(&self, dkey: &[u8]) -> String {
        format!("object {} dkey {}", self.oid, fmt_key(dkey))
    }

    pub(crate) fn gs(&self) -> u32 {
        self.class.group_size()
    }

    pub(crate) fn kp(&self) -> (usize, usize) {
        let rs = self.rs.as_ref().expect("EC object");
        (rs.data_cells(), rs.parity_cells())
    }

    /// Run `f` with the current pool map until it succeeds, fails for a
    /// reason a retry cannot change, or [`RETRY_WINDOW`] has passed.
    ///
    /// `f` must be idempotent (updates reuse their epoch: a shard that
    /// applied the first try applies the same version again). A shard that
    /// does not answer is never skipped on the client's own judgement: the
    /// update waits, refreshing the pool map, until the engine is back or
    /// the management service has excluded its targets (the map version
    /// rises, every engine refuses the older one), and only then goes on
    /// without it. So a degraded update is acknowledged only once the
    /// system knows the target missed it and will bring it up to date
    /// before it serves reads again.
    pub(crate) fn with_map<T>(&self, f: impl FnMut(&PoolMap) -> Result<T>) -> Result<T> {
        let window = self.cont.pool().client().retry_window();
        self.retry_with_map(f, retryable, window)
    }

    /// For reads, which go to another replica or reconstruct on their own
    /// when a shard does not answer: retried for a few seconds only when an
    /// engine says the client's pool map is stale, or that it is starting.
    /// A dkey with a transaction in progress (`-EINPROGRESS`) is read again
    /// once it is decided.
    pub(crate) fn with_map_for_read<T>(&self, f: impl FnMut(&PoolMap) -> Result<T>) -> Result<T> {
        self.retry_with_map(
            f,
            |c| c == -libc::ESTALE || c == -libc::EAGAIN || c == -libc::EINPROGRESS,
            READ_RETRY_WINDOW,
        )
    }

    fn retry_with_map<T>(
        &self,
        mut f: impl FnMut(&PoolMap) -> Result<T>,
        retryable: fn(i32) -> bool,
        window: std::time::Duration,
    ) -> Result<T> {
        let pool = self.cont.pool();
        let deadline = std::time::Instant::now() + window;
        let quota_deadline = std::time::Instant::now() + QUOTA_WAIT;
        let mut map = pool.map();
        let mut pause = RETRY_PAUSE_MIN;
        let mut in_progress_pause = std::time::Duration::from_micros(200);
        loop {
            match f(&map) {
                // Decided within a round trip or two, normally: no new map needed.
                Err(e)
                    if e.code == -libc::EINPROGRESS
                        && retryable(e.code)
                        && std::time::Instant::now() < deadline =>
                {
                    // Maybe this process's own commit, not sent yet.
                    pool.client().committer().flush();
                    std::thread::sleep(in_progress_pause);
                    in_progress_pause = (in_progress_pause * 2).min(RETRY_PAUSE_MAX);
                }
                Err(e) if e.code == -libc::EDQUOT && std::time::Instant::now() < quota_deadline => {
                    tracing::debug!("retrying after: {e}");
                    std::thread::sleep(QUOTA_PAUSE);
                }
                Err(e) if retryable(e.code) && std::time::Instant::now() < deadline => {
                    tracing::debug!("retrying after: {e}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                    // The management service may be the one away: keep the old map then.
                    map = match pool.refresh() {
                        Ok(m) => m,
                        Err(r) if e.code == -libc::ESTALE && r.code != -libc::EHOSTUNREACH => {
                            return Err(r.context(format!("refreshing the pool map after: {e}")))
                        }
                        Err(_) => pool.map(),
                    };
                }
                // Every copy either unreachable or down by this client's
                // map: the map may be older than the system's. Nothing
                // else would tell: an engine refuses an old map only when
                // asked, and none was. Retried only while the map moves on.
                Err(e) if map_may_be_stale(e.code) => match pool.refresh() {
                    Ok(newer) if newer.version > map.version => {
                        tracing::debug!("pool map {} -> {} after: {e}", map.version, newer.version);
                        map = newer;
                    }
                    _ => return Err(e),
                },
                r => return r,
            }
        }
    }

    pub(crate) fn group(&self, map: &PoolMap, dkey: &[u8]) -> Result<Group> {
        let layout = self.layout(map)?;
        let g = placement::dkey_group(self.oid, dkey, layout.len() as u32);
        Ok(layout[g as usize].clone())
    }

    /// Every group of the object under `map` (computed once per map version).
    pub(crate) fn layout(&self, map: &PoolMap) -> Result<Arc<Vec<Group>>> {
        let mut cached = self.layout.lock();
        if let Some((version, l)) = &*cached {
            if *version == map.version {
                return Ok(l.clone());
            }
        }
        let l = Arc::new(placement::layout(map, self.oid, self.class)?);
        *cached = Some((map.version, l.clone()));
        Ok(l)
    }

    pub(crate) fn iod(&self, akey: &[u8], kind: ValueKind, offset: u64, parts: &[&[u8]]) -> Iod {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let csum = self.cont.checksum();
        let crc = if csum {
            parts.iter().fold(0, |c, p| crc32c_append(c, p))
        } else {
            0
        };
        Iod {
            akey: akey.to_vec(),
            kind: kind as i32,
            offset,
            len: len as u64,
            crc,
            has_crc: csum,
            ..Default::default()
        }
    }

    pub(crate) fn address(&self, map: &PoolMap, loc: &ShardLoc) -> data::Address {
        let t = &map.targets[loc.target];
        data::Address {
            pool: map.uuid.as_bytes().to_vec(),
            cont: self.cont.uuid().as_bytes().to_vec(),
            oid: Some(data::ObjectId {
                hi: self.oid.hi,
                lo: self.oid.lo,
            }),
            shard: loc.shard,
            target: t.index,
            map_version: map.version,
            handle: self.cont.handle().to_vec(),
        }
    }

    pub(crate) fn where_(&self, map: &PoolMap, loc: &ShardLoc) -> String {
        let t = &map.targets[loc.target];
        format!("pool {:?} rank {} ({})", map.name(), t.rank, t.addr)
    }

    /// One request to one shard; a non-zero status becomes an error.
    pub(crate) fn call(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        op: Opcode,
        msg: &impl Message,
        bulk: &[&[u8]],
    ) -> Result<(Option<Body>, Vec<u8>)> {
        self.call_with(map, loc, op, msg, bulk, None)
            .map(|(b, r)| (b, r.bulk))
    }

    /// Like [`Object::call`]; a reply bulk of exactly `out.len()` bytes may
    /// land in `out` directly ([`crate::Reply::placed`]).
    pub(crate) fn call_with(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        op: Opcode,
        msg: &impl Message,
        bulk: &[&[u8]],
        out: Option<&mut [u8]>,
    ) -> Result<(Option<Body>, crate::transport::Reply)> {
        self.check_callable(map, loc, op)?;
        let t = &map.targets[loc.target];
        let tr = self.cont.pool().client().transport();
        let m = msg.encode_to_vec();
        let reply = match out {
            Some(out) => tr.call_into(&t.addr, t.index, op, &m, bulk, out),
            None => tr.call(&t.addr, t.index, op, &m, bulk),
        };
        self.decoded(map, loc, reply)
    }

    /// [`Object::call`] to several shards side by side, without bulk
    /// ([`crate::Transport::call_each`]); the answers in their order.
    pub(crate) fn call_each<M: Message>(
        &self,
        map: &PoolMap,
        op: Opcode,
        calls: &[(ShardLoc, M)],
    ) -> Vec<Result<Option<Body>>> {
        let msgs: Vec<Vec<u8>> = calls.iter().map(|(_, m)| m.encode_to_vec()).collect();
        let mut out: Vec<Option<Result<Option<Body>>>> = Vec::with_capacity(calls.len());
        let mut sent = Vec::new();
        for ((loc, _), m) in calls.iter().zip(&msgs) {
            match self.check_callable(map, loc, op) {
                Ok(()) => {
                    sent.push((out.len(), call_to(map, loc, op, m)));
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let only: Vec<_> = sent.iter().map(|(_, c)| *c).collect();
        let replies = self.cont.pool().client().transport().call_each(&only);
        for ((i, _), r) in sent.iter().zip(replies) {
            out[*i] = Some(self.decoded(map, &calls[*i].0, r).map(|(b, _)| b));
        }
        out.into_iter()
            .map(|r| r.expect("every call answered"))
            .collect()
    }

    /// `-EHOSTDOWN` unless the pool map lets `op` go to `loc`'s target.
    pub(crate) fn check_callable(&self, map: &PoolMap, loc: &ShardLoc, op: Opcode) -> Result<()> {
        let t = &map.targets[loc.target];
        // Record listings are reintegration's, which asks the returning
        // targets too what they hold already.
        let reads = matches!(op, Opcode::Fetch | Opcode::List | Opcode::QuerySize);
        if !t.up || (reads && !t.readable) {
            return Err(Error::new(
                -libc::EHOSTDOWN,
                format!(
                    "{}: target {} is {} in pool map version {}",
                    self.where_(map, loc),
                    t.index,
                    if t.up { "being reintegrated" } else { "down" },
                    map.version
                ),
            ));
        }
        Ok(())
    }

    /// A transport's reply to a call to `loc`, its body decoded.
    pub(crate) fn decoded(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        reply: Result<crate::transport::Reply>,
    ) -> Result<(Option<Body>, crate::transport::Reply)> {
        let at = || self.where_(map, loc);
        let reply = reply.map_err(|e| e.context(at()))?;
        let body = reply_body(&reply.msg, || format!("{}: shard {}", at(), loc.shard))?;
        Ok((body, reply))
    }

    /// Update one shard (prepare it, as part of `tx`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn update_shard(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        tx: Option<&data::Dtx>,
        epoch: u64,
        dkey: &[u8],
        iods: Vec<Iod>,
        bulk: &[&[u8]],
    ) -> Result<()> {
        let req = self.update_req(map, loc, tx, epoch, dkey, iods);
        self.call(map, loc, Opcode::Update, &req, bulk).map(|_| ())
    }

    pub(crate) fn update_req(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        tx: Option<&data::Dtx>,
        epoch: u64,
        dkey: &[u8],
        iods: Vec<Iod>,
    ) -> UpdateReq {
        UpdateReq {
            addr: Some(self.address(map, loc)),
            epoch,
            dkey: dkey.to_vec(),
            iods,
            insert_only: false,
            sync: self.cont.sync_always(),
            dtx: tx.cloned(),
            conditions: Vec::new(),
        }
    }

    pub(crate) fn punch_shard(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        tx: Option<&data::Dtx>,
        epoch: u64,
        dkey: &[u8],
        akeys: &[Vec<u8>],
    ) -> Result<()> {
        let req = self.punch_req(map, loc, tx, epoch, dkey, akeys);
        self.call(map, loc, Opcode::Punch, &req, &[]).map(|_| ())
    }

    pub(crate) fn punch_req(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        tx: Option<&data::Dtx>,
        epoch: u64,
        dkey: &[u8],
        akeys: &[Vec<u8>],
    ) -> PunchReq {
        PunchReq {
            addr: Some(self.address(map, loc)),
            epoch,
            dkey: dkey.to_vec(),
            akeys: akeys.to_vec(),
            sync: self.cont.sync_always(),
            dtx: tx.cloned(),
            conditions: Vec::new(),
            more: Vec::new(),
        }
    }

    /// Make every update and punch of this object acknowledged so far
    /// survive a power cut (fsync): each target holding one of its shards
    /// flushes its device. Shards on down targets are skipped, as writes skip
    /// them.
    pub fn flush(&self) -> Result<()> {
        if self.cont.sync_always() {
            return Ok(());
        }
        self.with_map(|map| {
            let mut live: Vec<ShardLoc> = Vec::new();
            for g in self.layout(map)?.iter() {
                for l in &g.shards {
                    if map.targets[l.target].up && !live.iter().any(|o| o.target == l.target) {
                        live.push(*l);
                    }
                }
            }
            par_map(&live, |loc| {
                let req = FlushReq {
                    addr: Some(self.address(map, loc)),
                };
                self.call(map, loc, Opcode::Flush, &req, &[]).map(|_| ())
            })
            .into_iter()
            .collect::<Result<Vec<()>>>()
            .map(|_| ())
        })
        .map_err(|e| e.context(format!("flush {}", self.oid)))
    }

    /// Apply `f` to every shard of `groups` in parallel. Shards on down
    /// targets are skipped while their group keeps redundancy; any failure
    /// of a reachable shard fails the whole write.
    /// Write the live shards of `groups` as one transaction
    /// ([`crate::dtx`]): `f` prepares one shard (or, alone, writes it).
    pub(crate) fn write_shards(
        &self,
        map: &PoolMap,
        groups: &[Group],
        f: impl Fn(&ShardLoc, Option<&data::Dtx>) -> Result<()> + Sync,
    ) -> Result<()> {
        let mut live = Vec::new();
        for g in groups {
            self.check_redundancy(map, g)?;
            live.extend(
                g.shards
                    .iter()
                    .filter(|l| map.targets[l.target].up)
                    .copied(),
            );
        }
        self.transact(map, &live, f)
    }

    /// `-EHOSTDOWN` if more of the group's shards are on down targets than
    /// the class tolerates.
    pub(crate) fn check_redundancy(&self, map: &PoolMap, g: &Group) -> Result<()> {
        let ft = self.class.fault_tolerance() as usize;
        let down: Vec<&ShardLoc> = g
            .shards
            .iter()
            .filter(|l| !map.targets[l.target].up)
            .collect();
        if down.len() > ft {
            let which: Vec<String> = down
                .iter()
                .map(|l| format!("rank {}", map.targets[l.target].rank))
                .collect();
            return Err(Error::new(
                -libc::EHOSTDOWN,
                format!("pool {:?}: group {} has {} shards on down targets ({}), class {} tolerates {ft}", map.name(), g.group, down.len(), which.join(", "), self.class),
            ));
        }
        Ok(())
    }
}

/// The transport's call of `op` with `msg` (no bulk) to `loc`'s target.
pub(crate) fn call_to<'a>(
    map: &'a PoolMap,
    loc: &ShardLoc,
    op: Opcode,
    msg: &'a [u8],
) -> crate::transport::Call<'a> {
    let t = &map.targets[loc.target];
    crate::transport::Call {
        endpoint: &t.addr,
        target: t.index,
        op,
        msg,
        bulk: &[],
    }
}

/// The body of an engine's reply; a non-zero status becomes an error that
/// says where (`at`) and what the engine said.
pub(crate) fn reply_body(msg: &[u8], at: impl Fn() -> String) -> Result<Option<Body>> {
    let resp = data::Response::decode(msg).map_err(|e| {
        Error::new(
            -libc::EPROTO,
            format!("{}: undecodable response: {e}", at()),
        )
    })?;
    let st = resp.status.unwrap_or_default();
    if st.code != 0 {
        let code = if st.code < 0 { st.code } else { -libc::EIO };
        let m = if st.message.is_empty() {
            peregrine_proto::strerror(code)
        } else {
            st.message
        };
        return Err(Error::new(code, format!("{}: {m}", at())));
    }
    Ok(resp.body)
}

/// The companion akey holding an EC array's logical size.
pub fn size_akey(akey: &[u8]) -> Vec<u8> {
    [EC_SIZE_PREFIX, akey].concat()
}

pub(crate) fn check_keys(dkey: &[u8], akey: Option<&[u8]>) -> Result<()> {
    if dkey.is_empty() {
        return Err(Error::inval(
            "empty dkey (an empty dkey means \"whole object\" on the wire)",
        ));
    }
    if akey.is_some_and(|a| a.is_empty()) {
        return Err(Error::inval(format!("dkey {}: empty akey", fmt_key(dkey))));
    }
    Ok(())
}

pub(crate) fn check_range(offset: u64, len: usize) -> Result<()> {
    if offset.checked_add(len as u64).is_none() {
        return Err(Error::inval(format!(
            "extent at {offset} of {len} bytes overflows"
        )));
    }
    Ok(())
}
