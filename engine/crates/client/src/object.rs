//! Pools, containers and objects: the I/O path of the client library.
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

use crate::error::{fmt_key, Error, Result};
use crate::hlc;
use crate::mgmt::Mgmt;
use crate::placement::{self, Group, PoolMap, ShardLoc};
use crate::transport::{MultiTransport, Transport, TransportKind};
use parking_lot::{Mutex, RwLock};
use peregrine_isal::{crc32c, crc32c_append, ReedSolomon};
use peregrine_proto::data::{
    self, response::Body, FetchReq, FlushReq, Iod, ListReq, PunchReq, QuerySizeReq, UpdateReq,
    ValueKind,
};
use peregrine_proto::frame::Opcode;
use peregrine_proto::mgmt::{ContInfo, ContQueryReq, PoolConnectReq, SnapCreateReq};
use peregrine_proto::oclass::EC_CELL_SIZE;
use peregrine_proto::{ObjectClass, ObjectId, Redundancy, CSUM_ERRNO, EPOCH_LATEST};
use prost::Message;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use uuid::Uuid;

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
const STRIPE_LOCKS: usize = 256;
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
const RETRY_PAUSE_MIN: std::time::Duration = std::time::Duration::from_millis(20);
const RETRY_PAUSE_MAX: std::time::Duration = std::time::Duration::from_millis(500);

/// Failures a retry with a fresh pool map can get past: a stale map, an
/// engine starting or restarting, a connection lost or refused.
/// How long a conditional insert waits for a transaction that holds its
/// key prepared: past the engines' own settling of a transaction whose
/// client died (the engines' `DTX_STALE_MS`, 2 s), with margin.
const HELD_KEY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

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

struct ClientInner {
    mgmt: Mgmt,
    transport: Arc<dyn Transport>,
    /// [`Client::set_retry_window`], in milliseconds.
    retry_window_ms: std::sync::atomic::AtomicU64,
    /// Tells shards of this process's committed transactions.
    committer: crate::dtx::Committer,
}

/// A connection to a Peregrine system: the management service plus the
/// data-plane transport. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl Client {
    /// Connect to the management service at `mgmt_addr` ("host:port"). The
    /// data plane uses shared memory with engines on this node that offer it
    /// and TCP otherwise, unless `PEREGRINE_TRANSPORT` (tcp, shm, auto) says
    /// otherwise.
    pub fn connect(mgmt_addr: &str) -> Result<Client> {
        Self::connect_with_transport(mgmt_addr, TransportKind::from_env()?)
    }

    /// Like [`Client::connect`] with the transport chosen explicitly.
    pub fn connect_with_transport(mgmt_addr: &str, kind: TransportKind) -> Result<Client> {
        Self::connect_with(mgmt_addr, Arc::new(MultiTransport::new(kind)))
    }

    /// Like [`Client::connect`] with a chosen data-plane transport.
    pub fn connect_with(mgmt_addr: &str, transport: Arc<dyn Transport>) -> Result<Client> {
        let mgmt = Mgmt::connect(mgmt_addr)?;
        Ok(Client {
            inner: Arc::new(ClientInner {
                mgmt,
                committer: crate::dtx::Committer::start(transport.clone()),
                transport,
                retry_window_ms: (RETRY_WINDOW.as_millis() as u64).into(),
            }),
        })
    }

    /// How long an update waits for a shard that does not answer before it
    /// fails (default [`RETRY_WINDOW`]). Below the management service's
    /// failure detection (6 s) an update whose engine died fails (maybe
    /// applied on some shards) instead of going on degraded.
    pub fn set_retry_window(&self, window: std::time::Duration) {
        self.inner.retry_window_ms.store(
            window.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    fn retry_window(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.inner
                .retry_window_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The blocking management API, for admin calls.
    pub fn mgmt(&self) -> &Mgmt {
        &self.inner.mgmt
    }

    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.inner.transport
    }

    pub(crate) fn committer(&self) -> &crate::dtx::Committer {
        &self.inner.committer
    }

    /// Send the commits of the transactions acknowledged so far to their
    /// shards now and wait for them (done on drop too). A process that
    /// exits without dropping its client should call this first, or other
    /// readers of what it wrote last wait for the engines to settle it.
    pub fn flush_commits(&self) {
        self.inner.committer.flush();
    }

    /// Tell the transport which engines of a pool map offer shared memory.
    fn learn_routes(&self, map: &PoolMap) {
        for t in &map.targets {
            self.inner.transport.add_route(&t.addr, &t.shm_path);
        }
    }

    /// Connect to a pool by label or UUID: fetch its map.
    pub fn pool_connect(&self, id: &str) -> Result<Pool> {
        let m = self
            .mgmt()
            .pool_connect(PoolConnectReq { id: id.into() })
            .map_err(|e| e.context(format!("pool {id:?}")))?;
        let map = PoolMap::from_proto(m)?;
        self.learn_routes(&map);
        Ok(Pool {
            inner: Arc::new(PoolInner {
                client: self.clone(),
                id: id.to_string(),
                map: RwLock::new(Arc::new(map)),
            }),
        })
    }
}

struct PoolInner {
    client: Client,
    id: String,
    map: RwLock<Arc<PoolMap>>,
}

/// A connected pool. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

impl Pool {
    pub fn uuid(&self) -> Uuid {
        self.map().uuid
    }
    pub fn label(&self) -> String {
        self.map().label.clone()
    }
    pub fn client(&self) -> &Client {
        &self.inner.client
    }
    /// The current pool map.
    pub fn map(&self) -> Arc<PoolMap> {
        self.inner.map.read().clone()
    }

    /// Fetch the pool map again; keeps the newer of the two versions.
    pub fn refresh(&self) -> Result<Arc<PoolMap>> {
        let m = self.client().mgmt().pool_connect(PoolConnectReq {
            id: self.inner.id.clone(),
        })?;
        let new = Arc::new(PoolMap::from_proto(m)?);
        self.client().learn_routes(&new);
        let mut cur = self.inner.map.write();
        if new.version >= cur.version {
            *cur = new;
        }
        Ok(cur.clone())
    }

    /// Open a container by label or UUID.
    pub fn cont_open(&self, id: &str) -> Result<Container> {
        let info = self
            .client()
            .mgmt()
            .cont_query(ContQueryReq {
                pool: self.uuid().to_string(),
                id: id.into(),
            })
            .map_err(|e| e.context(format!("container {id:?} of pool {:?}", self.map().name())))?;
        let uuid = Uuid::parse_str(&info.uuid).map_err(|e| {
            Error::new(
                -libc::EPROTO,
                format!("container {id:?}: bad uuid {:?}: {e}", info.uuid),
            )
        })?;
        let csum = match info.checksum.to_ascii_lowercase().as_str() {
            "crc32c" => true,
            "off" | "none" | "" => false,
            other => {
                return Err(Error::new(
                    -libc::ENOTSUP,
                    format!("container {id:?}: unsupported checksum type {other:?}"),
                ))
            }
        };
        let sync_always = match info.props.get("sync").map(|v| v.to_ascii_lowercase()) {
            None => false,
            Some(v) if v == "standard" => false,
            Some(v) if v == "always" => true,
            Some(other) => {
                return Err(Error::new(
                    -libc::ENOTSUP,
                    format!("container {id:?}: unsupported sync mode {other:?}"),
                ))
            }
        };
        Ok(Container {
            inner: Arc::new(ContInner {
                pool: self.clone(),
                info,
                uuid,
                csum,
                sync_always,
            }),
        })
    }
}

struct ContInner {
    pool: Pool,
    info: ContInfo,
    uuid: Uuid,
    csum: bool,
    sync_always: bool,
}

/// An open container. Cheap to clone.
#[derive(Clone)]
pub struct Container {
    inner: Arc<ContInner>,
}

impl Container {
    pub fn uuid(&self) -> Uuid {
        self.inner.uuid
    }
    pub fn label(&self) -> &str {
        &self.inner.info.label
    }
    /// Properties as returned by ContQuery when the container was opened.
    pub fn info(&self) -> &ContInfo {
        &self.inner.info
    }
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }
    /// Whether end-to-end CRC32C checksums are on.
    pub fn checksum(&self) -> bool {
        self.inner.csum
    }
    /// Whether every update is acknowledged only once it survives a power
    /// cut (property `sync=always`). Otherwise (`sync=standard`) an update
    /// is acknowledged once written (it survives the crash of any process)
    /// and [`Object::flush`] makes it survive a power cut, as fsync does.
    pub fn sync_always(&self) -> bool {
        self.inner.sync_always
    }

    /// Open object `oid`; its class comes from the id's top byte.
    pub fn object(&self, oid: ObjectId) -> Result<Object> {
        let class = oid
            .class()
            .map_err(|e| Error::inval(format!("object {oid}: {e}")))?;
        placement::check_class(class, &self.pool().map())?;
        let rs = match class.redundancy() {
            Redundancy::ErasureCode { data, parity } => {
                Some(rs_codec(data as usize, parity as usize))
            }
            _ => None,
        };
        Ok(Object {
            cont: self.clone(),
            oid,
            class,
            rs,
            layout: Arc::default(),
        })
    }

    /// Create a snapshot; returns its epoch (readable through [`Object::at`]).
    pub fn snapshot(&self, name: &str) -> Result<u64> {
        let s = self.pool().client().mgmt().snap_create(SnapCreateReq {
            pool: self.pool().uuid().to_string(),
            cont: self.uuid().to_string(),
            name: name.into(),
        })?;
        hlc::observe(s.epoch);
        Ok(s.epoch)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("mgmt", &self.mgmt().addr())
            .finish()
    }
}
impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.map();
        f.debug_struct("Pool")
            .field("label", &m.label)
            .field("uuid", &m.uuid)
            .field("map_version", &m.version)
            .finish()
    }
}
impl std::fmt::Debug for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Container")
            .field("label", &self.label())
            .field("uuid", &self.uuid())
            .field("checksum", &self.checksum())
            .finish()
    }
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
fn rs_codec(k: usize, p: usize) -> Arc<ReedSolomon> {
    type Codecs = Mutex<HashMap<(usize, usize), Arc<ReedSolomon>>>;
    static CODECS: OnceLock<Codecs> = OnceLock::new();
    CODECS
        .get_or_init(Default::default)
        .lock()
        .entry((k, p))
        .or_insert_with(|| Arc::new(ReedSolomon::new(k, p)))
        .clone()
}

/// Run `f` over `items` in parallel (scoped threads, at most
/// [`MAX_PARALLEL`] at once; the first item runs on the calling thread).
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(&f).collect();
    }
    let mut out = Vec::with_capacity(items.len());
    for wave in items.chunks(MAX_PARALLEL) {
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = wave[1..].iter().map(|it| s.spawn(move || f(it))).collect();
            out.push(f(&wave[0]));
            for h in handles {
                out.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            }
        });
    }
    out
}

/// Several failed attempts at one read, as one error: `-EILSEQ` if any
/// attempt found corrupt data (the caller cares that data is bad, not that
/// another replica was also down), else the last attempt's code.
fn combine(what: &str, mut errs: Vec<Error>) -> Error {
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
    placed: bool,
    /// The newest epoch of the versions it was read from (0: none).
    pub(crate) epoch: u64,
}

/// An open object. Cheap to clone.
#[derive(Clone)]
pub struct Object {
    cont: Container,
    oid: ObjectId,
    class: ObjectClass,
    pub(crate) rs: Option<Arc<ReedSolomon>>,
    layout: Arc<Mutex<Option<CachedLayout>>>,
}

/// An object's groups under the pool map of the given version.
type CachedLayout = (u64, Arc<Vec<Group>>);

/// A read-only view of an object at one epoch (a snapshot's, or latest).
pub struct ObjectAt<'a> {
    obj: &'a Object,
    epoch: u64,
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
    /// happened).
    pub fn insert_single(&self, dkey: &[u8], akey: &[u8], value: &[u8]) -> Result<()> {
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
        .map_err(|e| e.context(self.what(dkey)))
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
    fn with_map_for_read<T>(&self, f: impl FnMut(&PoolMap) -> Result<T>) -> Result<T> {
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
    fn layout(&self, map: &PoolMap) -> Result<Arc<Vec<Group>>> {
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
    fn call_with(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        op: Opcode,
        msg: &impl Message,
        bulk: &[&[u8]],
        out: Option<&mut [u8]>,
    ) -> Result<(Option<Body>, crate::transport::Reply)> {
        let t = &map.targets[loc.target];
        let at = || self.where_(map, loc);
        // Record listings are reintegration's, which asks the returning
        // targets too what they hold already.
        let reads = matches!(op, Opcode::Fetch | Opcode::List | Opcode::QuerySize);
        if !t.up || (reads && !t.readable) {
            return Err(Error::new(
                -libc::EHOSTDOWN,
                format!(
                    "{}: target {} is {} in pool map version {}",
                    at(),
                    t.index,
                    if t.up { "being reintegrated" } else { "down" },
                    map.version
                ),
            ));
        }
        let tr = self.cont.pool().client().transport();
        let m = msg.encode_to_vec();
        let reply = match out {
            Some(out) => tr.call_into(&t.addr, t.index, op, &m, bulk, out),
            None => tr.call(&t.addr, t.index, op, &m, bulk),
        }
        .map_err(|e| e.context(at()))?;
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

    pub(crate) fn fetch_shard(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        iods: Vec<Iod>,
    ) -> Result<Vec<Fetched>> {
        self.fetch_shard_with(map, loc, epoch, dkey, iods, None)
    }

    /// Like [`Object::fetch_shard`]; with `out` (one iod), data of exactly
    /// `out.len()` bytes may land there directly ([`Fetched::placed`]).
    fn fetch_shard_with(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        iods: Vec<Iod>,
        mut out: Option<&mut [u8]>,
    ) -> Result<Vec<Fetched>> {
        let n = iods.len();
        let req = FetchReq {
            addr: Some(self.address(map, loc)),
            epoch,
            dkey: dkey.to_vec(),
            iods,
        };
        let (body, reply) =
            self.call_with(map, loc, Opcode::Fetch, &req, &[], out.as_deref_mut())?;
        let (mut bulk, placed, placed_crc) = (reply.bulk, reply.placed, reply.placed_crc);
        let bad = |m: String| Error::new(-libc::EPROTO, format!("{}: {m}", self.where_(map, loc)));
        let values = match body {
            Some(Body::Fetch(f)) => f.values,
            _ => return Err(bad("fetch reply without values".into())),
        };
        if values.len() != n {
            return Err(bad(format!(
                "fetch reply has {} values for {n} iods",
                values.len()
            )));
        }
        let total: u64 = values.iter().map(|v| v.len).sum();
        let arrived = match (&out, placed) {
            (Some(o), true) if n == 1 => o.len(),
            _ => bulk.len(),
        };
        if total != arrived as u64 {
            return Err(bad(format!(
                "fetch reply announces {total} bytes, bulk has {arrived}"
            )));
        }
        let csum = self.cont.checksum();
        let mut fetched = Vec::with_capacity(n);
        let mut off = 0usize;
        for v in &values {
            let data = if n == 1 {
                std::mem::take(&mut bulk)
            } else {
                let d = bulk[off..off + v.len as usize].to_vec();
                off += v.len as usize;
                d
            };
            let got: &[u8] = match (&out, placed) {
                (Some(o), true) => o,
                _ => &data,
            };
            let mut status = v.status;
            // Verify what arrived: catches corruption on the wire or in
            // buffers, which the engine's own check of stored data cannot.
            let crc = || match (placed_crc, n) {
                (Some(c), 1) if placed => c,
                _ => crc32c(got),
            };
            if status == 0 && csum && v.has_crc && crc() != v.crc {
                status = -CSUM_ERRNO;
            }
            fetched.push(Fetched {
                status,
                data,
                placed,
                epoch: v.epoch,
            });
        }
        Ok(fetched)
    }

    /// `len` bytes of ARRAY `akey` at `offset` of one shard, holes as zeros.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fetch_extent(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        let iod = Iod {
            akey: akey.to_vec(),
            kind: ValueKind::Array as i32,
            offset,
            len: len as u64,
            crc: 0,
            has_crc: false,
            ..Default::default()
        };
        let v = self
            .fetch_shard(map, loc, epoch, dkey, vec![iod])?
            .pop()
            .expect("one value");
        match v.status {
            0 => {
                let mut d = v.data;
                d.resize(len, 0);
                Ok(d)
            }
            e if e == -libc::ENOENT => Ok(vec![0; len]),
            e => Err(self.value_error(map, loc, akey, e)),
        }
    }

    /// Like [`Object::fetch_extent`], into `out`: over shared memory the
    /// data is copied once, from the engine's reply into `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fetch_extent_into(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let iod = Iod {
            akey: akey.to_vec(),
            kind: ValueKind::Array as i32,
            offset,
            len: out.len() as u64,
            crc: 0,
            has_crc: false,
            ..Default::default()
        };
        let v = self
            .fetch_shard_with(map, loc, epoch, dkey, vec![iod], Some(&mut *out))?
            .pop()
            .expect("one value");
        match v.status {
            0 if v.placed => Ok(()),
            0 => {
                let n = v.data.len().min(out.len());
                out[..n].copy_from_slice(&v.data[..n]);
                out[n..].fill(0);
                Ok(())
            }
            e if e == -libc::ENOENT => {
                out.fill(0);
                Ok(())
            }
            e => Err(self.value_error(map, loc, akey, e)),
        }
    }

    fn value_error(&self, map: &PoolMap, loc: &ShardLoc, akey: &[u8], code: i32) -> Error {
        Error::new(
            code,
            format!(
                "{}: shard {} akey {}: {}",
                self.where_(map, loc),
                loc.shard,
                fmt_key(akey),
                peregrine_proto::strerror(code)
            ),
        )
    }

    fn size_shard(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
    ) -> Result<u64> {
        let req = QuerySizeReq {
            addr: Some(self.address(map, loc)),
            epoch,
            dkey: dkey.to_vec(),
            akey: akey.to_vec(),
        };
        match self.call(map, loc, Opcode::QuerySize, &req, &[]) {
            Ok((Some(Body::Size(s)), _)) => Ok(s.size),
            Ok(_) => Err(Error::new(
                -libc::EPROTO,
                format!("{}: size reply without a size", self.where_(map, loc)),
            )),
            Err(e) if e.code == -libc::ENOENT => Ok(0),
            Err(e) => Err(e),
        }
    }

    fn list_shard(
        &self,
        map: &PoolMap,
        loc: &ShardLoc,
        epoch: u64,
        dkey: &[u8],
    ) -> Result<Vec<Vec<u8>>> {
        let mut keys = Vec::new();
        let mut anchor = Vec::new();
        loop {
            let req = ListReq {
                addr: Some(self.address(map, loc)),
                epoch,
                dkey: dkey.to_vec(),
                anchor: anchor.clone(),
                max: LIST_BATCH,
            };
            let l = match self.call(map, loc, Opcode::List, &req, &[]) {
                Ok((Some(Body::List(l)), _)) => l,
                Ok(_) => {
                    return Err(Error::new(
                        -libc::EPROTO,
                        format!("{}: list reply without keys", self.where_(map, loc)),
                    ))
                }
                Err(e) if e.code == -libc::ENOENT => return Ok(keys),
                Err(e) => return Err(e),
            };
            let progress = !l.keys.is_empty() || l.anchor != anchor;
            keys.extend(l.keys);
            if l.done {
                return Ok(keys);
            }
            if !progress {
                return Err(Error::new(
                    -libc::EPROTO,
                    format!("{}: listing made no progress", self.where_(map, loc)),
                ));
            }
            anchor = l.anchor;
        }
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

    /// The group's shards in read order: rotation by hash so reads spread
    /// over replicas, up-and-in targets first (the others are refused).
    fn read_order(&self, map: &PoolMap, g: &Group, dkey: &[u8]) -> Vec<ShardLoc> {
        let n = g.shards.len();
        let start = (placement::mix64(placement::hash_dkey(self.oid, dkey)) % n as u64) as usize;
        let mut order: Vec<ShardLoc> = (0..n).map(|i| g.shards[(start + i) % n]).collect();
        order.sort_by_key(|l| !map.targets[l.target].readable); // stable: keeps rotation
        order
    }

    /// Try `f` on each shard in turn until one succeeds.
    fn try_each<T>(
        &self,
        order: &[ShardLoc],
        what: &str,
        mut f: impl FnMut(&ShardLoc) -> Result<T>,
    ) -> Result<T> {
        let mut errs = Vec::new();
        for loc in order {
            match f(loc) {
                Ok(v) => return Ok(v),
                Err(e) if e.code == -libc::ESTALE => return Err(e),
                Err(e) => errs.push(e),
            }
        }
        Err(combine(what, errs))
    }

    // ---- erasure coding ----

    /// Serialize this process's writes to the same stripes: a degraded
    /// partial-stripe write is read-merge-write, and two of them
    /// interleaving would lose one's bytes (also a full-stripe write racing
    /// a merge); a non-degraded partial write's parity (fresh read, then
    /// write) must not be overtaken by another's. Striped locks
    /// by hash of (container, object, dkey, akey, stripe), taken in index
    /// order so batches cannot deadlock. Writers in other processes are not
    /// covered (documented limitation, as the engine does not arbitrate).
    pub(crate) fn lock_stripes(
        &self,
        dkey: &[u8],
        akey: &[u8],
        s0: u64,
        s1: u64,
    ) -> Vec<parking_lot::MutexGuard<'static, ()>> {
        static LOCKS: OnceLock<Vec<Mutex<()>>> = OnceLock::new();
        let locks = LOCKS.get_or_init(|| (0..STRIPE_LOCKS).map(|_| Mutex::new(())).collect());
        let base = placement::mix64(
            placement::hash_dkey(self.oid, dkey)
                ^ placement::hash_dkey(
                    ObjectId {
                        hi: self.cont.uuid().as_u64_pair().0,
                        lo: self.cont.uuid().as_u64_pair().1,
                    },
                    akey,
                ),
        );
        let mut idx: Vec<usize> = (s0..s1)
            .map(|s| (placement::mix64(base ^ s) % STRIPE_LOCKS as u64) as usize)
            .collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| locks[i].lock()).collect()
    }

    /// The `k` data cells of stripe `s`, reconstructed from parity when data
    /// shards fail. Shards listed in `bad` (group indexes) are not asked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ec_read_stripe(
        &self,
        map: &PoolMap,
        g: &Group,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        s: u64,
        bad: &[usize],
    ) -> Result<Vec<Vec<u8>>> {
        let (k, p) = self.kp();
        let cell = EC_CELL_SIZE as usize;
        let mut cells: Vec<Option<Vec<u8>>> = vec![None; k + p];
        let mut errs = Vec::new();
        let mut fetch = |idx: Vec<usize>, cells: &mut Vec<Option<Vec<u8>>>| {
            let res = par_map(&idx, |&i| {
                self.fetch_extent(map, &g.shards[i], epoch, dkey, akey, s * cell as u64, cell)
            });
            for (i, r) in idx.into_iter().zip(res) {
                match r {
                    Ok(d) => cells[i] = Some(d),
                    Err(e) => errs.push(e),
                }
            }
        };
        fetch((0..k).filter(|i| !bad.contains(i)).collect(), &mut cells);
        if cells[..k].iter().all(|c| c.is_some()) {
            return Ok(cells.into_iter().take(k).map(|c| c.unwrap()).collect());
        }
        fetch(
            (k..k + p).filter(|i| !bad.contains(i)).collect(),
            &mut cells,
        );
        let present = cells.iter().filter(|c| c.is_some()).count();
        if present < k {
            let what = format!(
                "{}: stripe {s} of akey {}: {present} of {} cells readable, need {k}",
                self.what(dkey),
                fmt_key(akey),
                k + p
            );
            return Err(combine(&what, errs));
        }
        self.rs
            .as_ref()
            .unwrap()
            .reconstruct(&mut cells)
            .map_err(|e| Error::io(format!("{}: {e}", self.what(dkey))))?;
        Ok(cells.into_iter().take(k).map(|c| c.unwrap()).collect())
    }

    /// Read `buf.len()` bytes at `start` (at most [`EC_BATCH_STRIPES`] stripes).
    ///
    /// Several cells come from several requests; no transaction may land
    /// between them. Every EC write and punch of an akey reaches all its
    /// shards (its size akey at least), so the newest change of the size
    /// akey that each data shard reports with its cells names the last
    /// write it applied: all the same, the cells are of one state. Otherwise
    /// (a write landed, a shard failed, or aggregation dropped an old punch
    /// on one shard and not yet on another) the read goes the slower way,
    /// fenced by the stripes' parity version.
    fn ec_fetch_piece(
        &self,
        map: &PoolMap,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        start: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let (k, _) = self.kp();
        let g = self.group(map, dkey)?;
        let segs = cell_segs(k, start, buf.len());
        // One contiguous extent per data shard: its cells in consecutive
        // stripes are adjacent in shard space.
        let jobs: Vec<usize> = (0..k).filter(|&j| !segs[j].is_empty()).collect();
        if jobs.len() < 2 || epoch != EPOCH_LATEST {
            return self.ec_fetch_piece_fenced(map, &g, epoch, dkey, akey, &segs, buf);
        }
        let size = size_akey(akey);
        let res = par_map(&jobs, |&j| -> Result<(Vec<u8>, u64)> {
            let first = segs[j][0].shard_off;
            let len: u64 = segs[j].iter().map(|s| s.len as u64).sum();
            let array = |akey: &[u8], offset, len| Iod {
                akey: akey.to_vec(),
                kind: ValueKind::Array as i32,
                offset,
                len,
                ..Default::default()
            };
            // The size akey with no bytes: its newest change (see above).
            let iods = vec![array(akey, first, len), array(&size, 0, 0)];
            let mut v = self.fetch_shard(map, &g.shards[j], epoch, dkey, iods)?;
            let version = v[1].epoch;
            let mut d = match v.swap_remove(0) {
                f if f.status == 0 => f.data,
                f if f.status == -libc::ENOENT => Vec::new(),
                f => return Err(self.value_error(map, &g.shards[j], akey, f.status)),
            };
            d.resize(len as usize, 0);
            Ok((d, version))
        });
        let got: Option<Vec<(Vec<u8>, u64)>> = res.into_iter().map(|r| r.ok()).collect();
        match got {
            Some(cells) if cells.windows(2).all(|w| w[0].1 == w[1].1) => {
                for (&j, (d, _)) in jobs.iter().zip(&cells) {
                    let first = segs[j][0].shard_off;
                    for sg in &segs[j] {
                        let from = (sg.shard_off - first) as usize;
                        buf[sg.dst..sg.dst + sg.len].copy_from_slice(&d[from..from + sg.len]);
                    }
                }
                Ok(())
            }
            _ => self.ec_fetch_piece_fenced(map, &g, epoch, dkey, akey, &segs, buf),
        }
    }

    /// [`Object::ec_fetch_piece`] the slower way: fenced by the stripes'
    /// parity versions, reconstructing the cells of failed data shards.
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::too_many_arguments)]
    fn ec_fetch_piece_fenced(
        &self,
        map: &PoolMap,
        g: &Group,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        segs: &[Vec<CellSeg>],
        buf: &mut [u8],
    ) -> Result<()> {
        let (k, _) = self.kp();
        let cell = EC_CELL_SIZE;
        // One contiguous extent per data shard: its cells in consecutive
        // stripes are adjacent in shard space.
        let jobs: Vec<usize> = (0..k).filter(|&j| !segs[j].is_empty()).collect();
        let touched: BTreeSet<u64> = segs.iter().flatten().map(|s| s.stripe).collect();
        let touched: Vec<u64> = touched.into_iter().collect();
        // A read of several cells is made of several requests: fenced by
        // the stripes' versions (see `ec_write`), read before and after it,
        // it saw no transaction land between them.
        let fence_at = (epoch == EPOCH_LATEST).then(|| {
            g.shards[k..]
                .iter()
                .copied()
                .find(|l| map.targets[l.target].readable)
        });
        let fence = |parts: usize| -> Result<Option<(ShardLoc, Vec<u64>)>> {
            let Some(Some(loc)) = fence_at.filter(|_| parts > 1) else {
                return Ok(None);
            };
            match self.stripe_versions(map, &loc, dkey, akey, &touched) {
                Ok(v) => Ok(Some((loc, v))),
                Err(e) if e.code == -libc::EINPROGRESS || e.code == -libc::ESTALE => Err(e),
                // Parity out of reach: the read goes on unfenced.
                Err(_) => Ok(None),
            }
        };
        let mut before = fence(jobs.len())?;
        let res = par_map(&jobs, |&j| {
            let first = segs[j][0].shard_off;
            let len: usize = segs[j].iter().map(|s| s.len).sum();
            self.fetch_extent(map, &g.shards[j], epoch, dkey, akey, first, len)
        });
        let mut bad = Vec::new();
        let mut errs = Vec::new();
        for (j, r) in jobs.into_iter().zip(res) {
            match r {
                Ok(d) => {
                    let first = segs[j][0].shard_off;
                    for s in &segs[j] {
                        let from = (s.shard_off - first) as usize;
                        buf[s.dst..s.dst + s.len].copy_from_slice(&d[from..from + s.len]);
                    }
                }
                Err(e) if e.code == -libc::ESTALE => return Err(e),
                Err(e) => {
                    bad.push(j);
                    errs.push(e);
                }
            }
        }
        if !bad.is_empty() {
            if before.is_none() {
                before = fence(2)?;
            }
            self.ec_rebuild_piece(
                map,
                g,
                epoch,
                dkey,
                akey,
                &bad,
                errs,
                |j, s, cells| {
                    for sg in segs[j].iter().filter(|sg| sg.stripe == s) {
                        let from = (sg.shard_off - s * cell) as usize;
                        buf[sg.dst..sg.dst + sg.len].copy_from_slice(&cells[from..from + sg.len]);
                    }
                },
                |j| segs[j].iter().map(|s| s.stripe).collect(),
            )?;
        }
        if let Some((loc, v)) = before {
            let after = match self.stripe_versions(map, &loc, dkey, akey, &touched) {
                Err(e) if e.code == -libc::EINPROGRESS || e.code == -libc::ESTALE => return Err(e),
                // Parity gone since (its engine died): as unfenced.
                Err(_) => v.clone(),
                Ok(a) => a,
            };
            if after != v {
                return Err(Error::new(
                    -libc::EINPROGRESS,
                    format!(
                        "{}: akey {}: stripes {touched:?} changed during the read",
                        self.what(dkey),
                        fmt_key(akey)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Degraded read: rebuild the failed shards' (`bad`) part of each stripe
    /// they cover (`stripes_of`), handing each rebuilt cell to `put`.
    #[allow(clippy::too_many_arguments)]
    fn ec_rebuild_piece(
        &self,
        map: &PoolMap,
        g: &Group,
        epoch: u64,
        dkey: &[u8],
        akey: &[u8],
        bad: &[usize],
        mut errs: Vec<Error>,
        mut put: impl FnMut(usize, u64, &[u8]),
        stripes_of: impl Fn(usize) -> Vec<u64>,
    ) -> Result<()> {
        let stripes: BTreeSet<u64> = bad.iter().flat_map(|&j| stripes_of(j)).collect();
        for s in stripes {
            let cells = self
                .ec_read_stripe(map, g, epoch, dkey, akey, s, bad)
                .map_err(|e| {
                    errs.push(e);
                    combine(&self.what(dkey), std::mem::take(&mut errs))
                })?;
            for &j in bad {
                put(j, s, &cells[j]);
            }
        }
        Ok(())
    }
}

/// A piece of an EC read on one data shard.
struct CellSeg {
    shard_off: u64,
    len: usize,
    /// Where in the caller's buffer.
    dst: usize,
    stripe: u64,
}

/// The pieces of a read of `len` bytes at `start` on each of the `k` data
/// shards, in shard order.
fn cell_segs(k: usize, start: u64, len: usize) -> Vec<Vec<CellSeg>> {
    let cell = EC_CELL_SIZE;
    let end = start + len as u64;
    let mut segs: Vec<Vec<CellSeg>> = (0..k).map(|_| Vec::new()).collect();
    let mut o = start;
    while o < end {
        let (c, within) = (o / cell, o % cell);
        let l = (cell - within).min(end - o);
        segs[(c % k as u64) as usize].push(CellSeg {
            shard_off: (c / k as u64) * cell + within,
            len: l as usize,
            dst: (o - start) as usize,
            stripe: c / k as u64,
        });
        o += l;
    }
    segs
}

impl ObjectAt<'_> {
    /// The SINGLE value `akey` of `dkey`, `None` if it does not exist.
    pub fn fetch_single(&self, dkey: &[u8], akey: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.fetch_single_versioned(dkey, akey)?.map(|(v, _)| v))
    }

    /// Like [`ObjectAt::fetch_single`], with the epoch of the version read:
    /// what [`crate::Expect::UnchangedSince`] takes to change the value only
    /// if nobody changed it since.
    pub fn fetch_single_versioned(
        &self,
        dkey: &[u8],
        akey: &[u8],
    ) -> Result<Option<(Vec<u8>, u64)>> {
        check_keys(dkey, Some(akey))?;
        let o = self.obj;
        let what = o.what(dkey);
        o.with_map_for_read(|map| {
            let g = o.group(map, dkey)?;
            o.try_each(&o.read_order(map, &g, dkey), &what, |loc| {
                let iod = Iod {
                    akey: akey.to_vec(),
                    kind: ValueKind::Single as i32,
                    offset: 0,
                    len: 0,
                    crc: 0,
                    has_crc: false,
                    ..Default::default()
                };
                let v = o
                    .fetch_shard(map, loc, self.epoch, dkey, vec![iod])?
                    .pop()
                    .expect("one value");
                match v.status {
                    0 => Ok(Some((v.data, v.epoch))),
                    e if e == -libc::ENOENT => Ok(None),
                    e => Err(o.value_error(map, loc, akey, e)),
                }
            })
        })
    }

    /// Exactly `len` bytes at `offset` of ARRAY `akey` (holes read as zeros).
    pub fn fetch_array(
        &self,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.fetch_array_into(dkey, akey, offset, &mut buf)?;
        Ok(buf)
    }

    /// Like [`ObjectAt::fetch_array`] into a caller's buffer.
    pub fn fetch_array_into(
        &self,
        dkey: &[u8],
        akey: &[u8],
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        check_keys(dkey, Some(akey))?;
        check_range(offset, buf.len())?;
        let o = self.obj;
        let what = o.what(dkey);
        if o.rs.is_some() {
            let (k, _) = o.kp();
            let stripe = k as u64 * EC_CELL_SIZE;
            let batch = stripe * EC_BATCH_STRIPES;
            let mut done = 0usize;
            while done < buf.len() {
                let pos = offset + done as u64;
                let piece_end = ((pos / batch + 1) * batch).min(offset + buf.len() as u64);
                let n = (piece_end - pos) as usize;
                o.with_map_for_read(|map| {
                    o.ec_fetch_piece(map, self.epoch, dkey, akey, pos, &mut buf[done..done + n])
                })
                .map_err(|e| {
                    if e.msg.starts_with(&what) {
                        e
                    } else {
                        e.context(&what)
                    }
                })?;
                done += n;
            }
            return Ok(());
        }
        for (i, piece) in buf.chunks_mut(MAX_IO).enumerate() {
            let off = offset + (i * MAX_IO) as u64;
            o.with_map_for_read(|map| {
                let g = o.group(map, dkey)?;
                o.try_each(&o.read_order(map, &g, dkey), &what, |loc| {
                    o.fetch_extent_into(map, loc, self.epoch, dkey, akey, off, piece)
                })
            })?;
        }
        Ok(())
    }

    /// Size of ARRAY `akey`: highest byte written + 1 (0 if absent).
    pub fn array_size(&self, dkey: &[u8], akey: &[u8]) -> Result<u64> {
        check_keys(dkey, Some(akey))?;
        let o = self.obj;
        let what = o.what(dkey);
        let key = if o.rs.is_some() {
            size_akey(akey)
        } else {
            akey.to_vec()
        };
        o.with_map_for_read(|map| {
            let g = o.group(map, dkey)?;
            o.try_each(&o.read_order(map, &g, dkey), &what, |loc| {
                o.size_shard(map, loc, self.epoch, dkey, &key)
            })
        })
    }

    /// All dkeys, sorted and de-duplicated over the object's groups.
    pub fn list_dkeys(&self) -> Result<Vec<Vec<u8>>> {
        let o = self.obj;
        let what = format!("object {}", o.oid);
        o.with_map_for_read(|map| {
            let groups = o.layout(map)?;
            let lists = par_map(&groups, |g| {
                // Any shard of the group has every dkey of the group.
                let order = o.read_order(map, g, &g.group.to_le_bytes());
                o.try_each(&order, &what, |loc| o.list_shard(map, loc, self.epoch, b""))
            });
            let mut all = BTreeSet::new();
            for l in lists {
                all.extend(l?);
            }
            Ok(all.into_iter().collect())
        })
    }

    /// The akeys of `dkey`, sorted. An EC shard holds only the arrays with
    /// bytes in its cells, but every array's size companion: the companions
    /// name the arrays (and are not listed themselves).
    pub fn list_akeys(&self, dkey: &[u8]) -> Result<Vec<Vec<u8>>> {
        check_keys(dkey, None)?;
        let o = self.obj;
        let what = o.what(dkey);
        let keys = o.with_map_for_read(|map| {
            let g = o.group(map, dkey)?;
            o.try_each(&o.read_order(map, &g, dkey), &what, |loc| {
                o.list_shard(map, loc, self.epoch, dkey)
            })
        })?;
        let mut keys: Vec<Vec<u8>> = keys
            .into_iter()
            .map(|k| match k.strip_prefix(EC_SIZE_PREFIX) {
                Some(array) if o.rs.is_some() => array.to_vec(),
                _ => k,
            })
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
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

fn check_range(offset: u64, len: usize) -> Result<()> {
    if offset.checked_add(len as u64).is_none() {
        return Err(Error::inval(format!(
            "extent at {offset} of {len} bytes overflows"
        )));
    }
    Ok(())
}
