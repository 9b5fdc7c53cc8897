//! One target: a thread that owns its index, WAL, allocator, device fd,
//! io_uring ring and buffers (shared-nothing).
//!
//! The thread is an event loop over two sources: its queue and its ring.
//! Each turn it reaps the device completions, drains up to [`MAX_BATCH`]
//! queued messages, and starts what it can. Lists and size queries are
//! answered at once from the index. Fetches are queued and started together:
//! all of them are planned against the index and ALL their device reads go
//! to the ring in one submission (packed into regions of the registered
//! buffers, or, for a fetch of whole chunks of one extent whose source
//! offers its reply area, straight into that area: a local client's
//! response region); each is verified, assembled and answered when its
//! reads complete, the reply borrowing the regions until it is sent.
//! Updates and punches are validated, their large values assigned freshly
//! allocated blocks and copied once, from the client's memory straight into
//! the regions their writes start from (checksummed on that copy), and
//! gathered into the open batch. Each [`WRITE_PIECE`] of a large value
//! starts for the device as soon as it is copied ("ahead" of its batch's
//! commit: the device writes while the next piece is copied in). A batch's
//! commit writes its WAL record (and any value bytes not written ahead)
//! alongside those data writes. Up to [`MAX_COMMITS`] commits are in flight
//! at once; while they are, new updates gather into the next batch (group
//! commit that grows as the device slows). A batch is applied to the index
//! and answered once its writes are done, after every batch before it.
//!
//! Acknowledgement, as POSIX file systems do it: a written update survives
//! the crash of any process (the kernel holds what the device took), and a
//! flush from the device's volatile write cache makes it survive a power
//! cut. A synchronous commit (an update or punch asking for it, a
//! [`Request::Flush`], and [`crate::StorageOptions::flush_interval`] after an
//! acknowledged update was not flushed) adds ONE fdatasync after its writes
//! and those of every commit before it, and is answered after it; a flush
//! with nothing to log writes no record. Each record carries the last
//! flushed sequence number ([`WalOp::Flushed`]), so replay knows from where
//! on a record may have outlived its data, and which records may not be
//! missing (a target idle for a flush interval after a flush writes a
//! record holding that stamp alone: [`Target::stamp_due`]; [`replay`] says
//! how it tells a torn tail from damage). Besides its queue, the thread
//! polls its sources (the shared-memory connections of local clients,
//! [`crate::Source`]) each turn, and for a while after taking a request from
//! one it keeps polling rather than sleep. It sleeps in its ring, where a
//! read of an eventfd stands for the queue and the sources: a sender writes
//! it only when the target's published page says that it sleeps.
//!
//! What the pipeline must not change, and how it does not:
//! - A fetch sees applied (written) state only: the index changes only when
//!   a batch is applied, and the batches in flight are not acknowledged yet.
//! - A conditional insert and the space checks count the batches in flight
//!   as if applied (they will be, in order, or the target stops accepting
//!   updates, below).
//! - Blocks freed while reads are in flight return to the allocator only
//!   after every fetch started before they were freed is done.
//! - Batch N+1's record follows batch N's in the WAL; replay stops at the
//!   first missing record, so N+1 never outlives N. If a batch's device
//!   writes fail, it and every later batch in flight fail, and the target
//!   refuses updates from then on (a failed write or fdatasync leaves the
//!   device's state unknown; the engine must restart to re-read it).
//! - A record may reach the device before its data (they are written side
//!   by side), and after a power cut any write since the last flush may be
//!   missing. Replay checks the data of every record after the last one a
//!   replayed record says was flushed, and drops a record whose data is not
//!   all there, and every record after it (none of them was flushed, so
//!   what survives is a prefix of what was acknowledged).
//! - Blocks a record frees keep their old bytes until a record saying that
//!   record was flushed is flushed itself ([`Target::settle`]): replay never
//!   checks the data of a record older than that, and may check any younger
//!   one, whose blocks must still hold what it wrote.
//! - Blocks written ahead for an update that then fails (a bad checksum, a
//!   broken connection) return to the allocator only once those writes are
//!   done: nothing else is written to a block with a write in flight.
//! - Checkpoints and control operations run with nothing in flight.

use crate::alloc::BlockAlloc;
use crate::bufpool::BUF_BYTES;
use crate::condition;
use crate::device::{DeviceIo, Op};
use crate::dtx::{self, Admit, OpKey};
use crate::error::{Errno, StorageError};
use crate::index::{
    value_scm, DevExtent, Kind, NewValue, ObjKey, Payload, Released, Seg, Src, TargetIndex, WalOp,
};
use crate::superblock::{Superblock, BLOCK};
use crate::wal::{self, CKPT_MAGIC, WAL_MAGIC};
use crate::{Bulk, Gather, Polled, PoolSpace, Reply, ReplyArea, Request, Responder, Source};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use peregrine_isal::Crc32cShift;
use peregrine_proto::data;
use peregrine_proto::shm::{self, Mapping};
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use uuid::Uuid;

mod fetch;
mod replay;
mod scrub;

pub use scrub::{ScrubReport, DEFAULT_SCRUB_RATE};

/// Most messages drained into one group commit.
const MAX_BATCH: usize = 128;
/// Most commits in flight at once: while they are, new updates gather into
/// the next batch, so the batches grow as the device slows.
pub(crate) const MAX_COMMITS: usize = 4;
/// A batch closes once its values to data blocks reach this many bytes.
const BATCH_DATA: usize = 8 << 20;
/// Large values go to the device in writes of this size, each started as
/// soon as it is copied in (the next piece is copied meanwhile).
const WRITE_PIECE: usize = 256 << 10;
/// Idle time after which a target aggregates the pools it changed.
const IDLE_AGGREGATE: Duration = Duration::from_secs(30);
/// `ListReq.max == 0` means this many.
const DEFAULT_LIST_MAX: usize = 1000;

pub(crate) enum Ctl {
    PoolCreate {
        pool: Uuid,
        scm: u64,
        nvme: u64,
    },
    PoolDestroy {
        pool: Uuid,
    },
    PoolSpace {
        pool: Uuid,
    },
    Pools,
    ContDestroy {
        pool: Uuid,
        cont: Uuid,
    },
    SetSnapshots {
        pool: Uuid,
        cont: Uuid,
        epochs: Vec<u64>,
        /// The epoch of a snapshot being created: refused if aggregation already passed it.
        adding: Option<u64>,
    },
    Aggregate {
        pool: Uuid,
    },
    DeviceSpace,
    Stats,
    /// The scrubber's report, after setting its rate (bytes/s) if given.
    Scrub(Option<u64>),
    /// A container's quota as this target enforces it (`None`: no quota).
    SetQuota {
        pool: Uuid,
        cont: Uuid,
        /// Orders the service's pushes: an older one arriving late is ignored.
        version: u64,
        quota: Option<ContQuota>,
    },
}

/// A container's space quota as one target sees it, in stored bytes
/// (replicas and parity included). The targets of one engine share what
/// each holds of the container ([`QuotaShare`]); what the other engines
/// hold comes from the management service, which measures every engine
/// once a second. An update that would take the container past `limit` is
/// refused with `EDQUOT`; between two measurements, writes on several
/// engines at once can pass the limit by what the other engines store in
/// that time, as a distributed quota without a per-write grant does.
#[derive(Clone, Debug)]
pub struct ContQuota {
    pub limit: u64,
    /// What the container holds on the other engines.
    pub elsewhere: u64,
    pub share: Arc<QuotaShare>,
}

/// What each target of an engine holds of one container (its slot is
/// raised before an update is admitted, so it is never below the truth
/// for long).
#[derive(Debug)]
pub struct QuotaShare {
    pub(crate) held: Vec<AtomicU64>,
}

impl QuotaShare {
    pub(crate) fn new(held: &[u64]) -> Self {
        QuotaShare {
            held: held.iter().map(|&b| AtomicU64::new(b)).collect(),
        }
    }
}

pub(crate) enum CtlOut {
    Done,
    /// Pool created (true) or already there with the same sizes (false).
    Created(bool),
    Space(PoolSpace),
    Pools(Vec<Uuid>),
    Reclaimed(u64),
    /// nvme total, nvme unreserved, scm total, scm unreserved.
    Device([u64; 4]),
    Stats(crate::TargetStats),
    Scrub(ScrubReport),
}

pub(crate) enum Msg {
    Data(Request, Responder),
    /// A source of requests the target polls from now on.
    Attach(Box<dyn Source>),
    Ctl(Ctl, SyncSender<Result<CtlOut, StorageError>>),
    Stop,
    /// Stop without the closing checkpoint (tests: leaves the WAL to replay).
    Halt,
}

/// Changes waiting for the next group commit.
#[derive(Default)]
struct Batch {
    /// Tells its data writes in flight apart from those of other batches.
    id: u64,
    ops: Vec<WalOp>,
    replies: Vec<Responder>,
    /// The data blocks to write: (device offset, at most a buffer of bytes).
    writes: Vec<(u64, Staged)>,
    /// Blocks allocated for this batch (returned if it fails).
    runs: Vec<(u64, u64)>,
    /// Space the batch already claims per pool: (scm, nvme).
    space: HashMap<Uuid, (u64, u64)>,
    /// Bytes of values going to data blocks.
    data: usize,
    /// The first of its writes started ahead ([`Target::ahead`]) that failed.
    err: Option<std::io::Error>,
    /// Flushed before it is answered (see "Acknowledgement" above).
    sync: bool,
}

/// A data write started ahead of its batch's commit (see [`Target::write_ahead`]).
struct AheadWrite {
    batch: u64,
    buf: usize,
    len: usize,
}

/// Bytes on their way to data blocks: in a region of the registered
/// buffers (buffer, offset, length padded to whole blocks with zeros) that
/// the write starts from, or in memory of their own when no region was
/// free (copied into one when the batch starts).
enum Staged {
    Region(usize, usize, usize),
    Bytes(Vec<u8>),
}

impl Batch {
    /// Move the staged bytes out of the registered buffers, for the blocking
    /// paths, which use every buffer.
    fn unstage(&mut self, dev: &mut DeviceIo) {
        for (_, w) in &mut self.writes {
            if let Staged::Region(buf, off, len) = *w {
                *w = Staged::Bytes(dev.bytes(buf, off, len).to_vec());
                dev.release(buf);
            }
        }
    }
}

/// Data blocks an update's values take at most (were they all large).
fn blocks_wanted(u: &data::UpdateReq) -> u64 {
    u.iods.iter().map(|i| wal::round_up(i.len) / BLOCK).sum()
}

/// Bytes of `writes` staged in regions of the registered buffers.
fn staged_bytes(writes: &[(u64, Staged)]) -> usize {
    writes
        .iter()
        .map(|(_, w)| match w {
            Staged::Region(_, _, len) => *len,
            Staged::Bytes(_) => 0,
        })
        .sum()
}

/// Give back the regions `writes` were staged in.
fn release_staged(dev: &mut DeviceIo, writes: impl IntoIterator<Item = (u64, Staged)>) {
    for (_, w) in writes {
        if let Staged::Region(buf, ..) = w {
            dev.release(buf);
        }
    }
}

/// What an update being prepared has taken so far (given back if it fails).
#[derive(Default)]
struct Staging {
    writes: Vec<(u64, Staged)>,
    runs: Vec<(u64, u64)>,
    bytes: usize,
}

/// Copy `dst.len()` bytes at `off` of `bulk` into `dst` and checksum them
/// on the copy, a cache-sized step at a time (the sums read what the copy
/// just wrote): one CRC32C per `chunk` appended to `csums`, and, if asked
/// for, the running CRC32C of the value in `crc` (combined from the
/// chunks' CRCs, not a second pass).
fn copy_and_sum(
    bulk: &Bulk,
    off: usize,
    dst: &mut [u8],
    chunk: usize,
    csums: &mut Vec<u32>,
    mut crc: Option<&mut u32>,
) -> std::io::Result<()> {
    let step = (64usize << 10).div_ceil(chunk) * chunk;
    let whole = Crc32cShift::new(chunk);
    for (k, d) in dst.chunks_mut(step).enumerate() {
        bulk.copy_out(off + k * step, d)?;
        for c in d.chunks(chunk) {
            let sum = peregrine_isal::crc32c(c);
            csums.push(sum);
            if let Some(crc) = crc.as_deref_mut() {
                let shift = if c.len() == chunk {
                    whole
                } else {
                    Crc32cShift::new(c.len())
                };
                *crc = shift.combine(*crc, sum);
            }
        }
    }
    Ok(())
}

/// A batch being committed: its data and its WAL record are written side
/// by side (with the batch's writes started ahead), then, if synchronous,
/// ONE fdatasync.
struct InCommit {
    /// Tag of its own writes (the op index tells them apart); `tag + 1`: its fdatasync.
    tag: u64,
    batch: u64,
    seq: u64,
    ops: Vec<WalOp>,
    replies: Vec<Responder>,
    runs: Vec<(u64, u64)>,
    space: HashMap<Uuid, (u64, u64)>,
    /// Per write of its own: the buffer its region is in.
    regions: Vec<usize>,
    /// Its writes in flight, those started ahead included.
    writing: usize,
    /// Answered only after an fdatasync ([`Target::start_syncs`]).
    sync: bool,
    /// Its fdatasync has started.
    syncing: bool,
    /// Ready to be applied and answered: written (and flushed if `sync`),
    /// or failed.
    done: bool,
    err: Option<std::io::Error>,
    t0: Instant,
    /// When its last write was done.
    written: Option<Instant>,
}

/// A fetch waiting to start, and where its source would take its bytes.
type Queued = (data::FetchReq, Responder, Option<ReplyArea>);

/// Fetches whose device reads are in flight.
struct InFetch {
    fetches: Vec<Queued>,
    plans: Vec<Result<Vec<IodRead>, Errno>>,
    /// Per device op: where its bytes go, and where it reads them into.
    reads: Vec<(PieceDst, ReadInto)>,
    pending: usize,
}

/// Where a fetch's device read lands.
#[derive(Clone, Copy)]
enum ReadInto {
    /// A region of the registered buffers: (buffer, offset).
    Region(usize, usize),
    /// The source's reply area, at this address.
    Area(usize),
}

/// The stamp in one record's `ops` ([`WalOp::Flushed`]), if it has one.
fn stamp_of(ops: &[WalOp]) -> Option<u64> {
    ops.iter()
        .filter_map(|op| match op {
            WalOp::Flushed { through } => Some(*through),
            _ => None,
        })
        .max()
}

/// Give back the regions fetch reads landed in.
fn release_reads(dev: &mut DeviceIo, reads: &[(PieceDst, ReadInto)]) {
    for (_, into) in reads {
        if let ReadInto::Region(buf, _) = *into {
            dev.release(buf);
        }
    }
}

/// `len` bytes the device read into a source's reply area at `addr`.
fn area_bytes<'a>(addr: usize, len: usize) -> &'a [u8] {
    // SAFETY: the read completed, and the area stays mapped and untouched by
    // the engine until the fetch's reply has been sent (see ReplyArea).
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// Where the bytes of one device read of a fetch go: (fetch, iod, seg,
/// start of the piece in the value, bytes wanted).
#[derive(Clone, Copy)]
struct PieceDst {
    fetch: usize,
    iod: usize,
    seg: usize,
    start: u64,
    len: usize,
}

/// The receiving end of a target's queue, with its wake-up eventfd.
pub(crate) struct Inbox {
    rx: Receiver<Msg>,
    wake: Arc<Wake>,
}

/// The sending end of a target's queue: a send wakes the target if it
/// sleeps in its ring (waiting for device completions) rather than on the queue.
#[derive(Clone)]
pub(crate) struct Mailbox {
    tx: Sender<Msg>,
    wake: Arc<Wake>,
}

pub(crate) struct Wake {
    /// The eventfd a read of which the target keeps in its ring.
    pub(crate) fd: OwnedFd,
    /// The page whose first word is non-zero while the target is about to
    /// sleep, or sleeps, in its ring: local clients that poke the target
    /// directly ([`crate::Source`]) map it read-only and write `fd` only then.
    pub(crate) page_fd: OwnedFd,
    page: Mapping,
}

impl Wake {
    fn asleep(&self) -> &AtomicU64 {
        self.page.word(0).expect("word 0 of the target page")
    }
}

pub(crate) fn mailbox(id: u32) -> std::io::Result<(Mailbox, Inbox)> {
    // SAFETY: eventfd takes no pointers; the result is checked below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Safety: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let (page_fd, page) =
        shm::memfd_published(&format!("peregrine-target-{id}"), shm::TARGET_PAGE_LEN)?;
    let wake = Arc::new(Wake { fd, page_fd, page });
    let (tx, rx) = crossbeam_channel::unbounded();
    Ok((
        Mailbox {
            tx,
            wake: wake.clone(),
        },
        Inbox { rx, wake },
    ))
}

impl Mailbox {
    pub(crate) fn wake(&self) -> &Wake {
        &self.wake
    }

    /// A refused message comes back whole, so that its sender can answer it.
    #[allow(clippy::result_large_err)]
    pub(crate) fn send(&self, m: Msg) -> Result<(), crossbeam_channel::SendError<Msg>> {
        self.tx.send(m)?;
        // Pairs with the fence in Target::going_to_sleep: either the target sees the
        // message before it sleeps, or this sees it asleep and wakes it.
        fence(Ordering::SeqCst);
        if self.wake.asleep().swap(0, Ordering::SeqCst) != 0 {
            let one = 1u64.to_ne_bytes();
            // SAFETY: 8 bytes from the live `one` to the eventfd `self.wake` owns.
            unsafe { libc::write(self.wake.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
        Ok(())
    }
}

pub(crate) struct Target {
    id: u32,
    sb: Superblock,
    dev: DeviceIo,
    index: TargetIndex,
    alloc: BlockAlloc,
    /// Sequence number of the last applied (written) WAL record.
    seq: u64,
    /// Every record up to this one, and its data, is flushed.
    durable: u64,
    /// The highest `durable` written into a record ([`WalOp::Flushed`]).
    stamped: u64,
    /// The last record holding more than a stamp: an idle target stamps
    /// the flush that covers it ([`Target::stamp_due`]).
    last_real: u64,
    /// When `durable` last rose.
    flushed_at: Instant,
    /// Records carrying a stamp that are not flushed yet: (seq, stamp).
    stamps: VecDeque<(u64, u64)>,
    /// The highest stamp in a flushed record: replay checks the data of no
    /// record up to it, so the blocks such records freed may be rewritten.
    settled: u64,
    /// Blocks freed by applying the record `seq`, kept until `settled`
    /// reaches it: (seq, runs).
    unsettled: Vec<(u64, Vec<(u64, u64)>)>,
    /// Since when something waits for a flush ([`Target::flush_wanted`]).
    dirty_since: Option<Instant>,
    /// How long it may wait before the target flushes on its own.
    pub(crate) flush_interval: Duration,
    /// How long it keeps polling its sources after taking a request
    /// ([`crate::StorageOptions::poll`]).
    poll: Duration,
    /// Sequence number of the last WAL record written or being written.
    seq_started: u64,
    /// Byte offset inside the WAL where the next record goes.
    wal_tail: u64,
    /// Stamped on the WAL records of this opening (nonzero, random): see [`wal`].
    generation: u64,
    /// Checkpoint slot the next checkpoint goes to (the other holds the newest).
    next_ckpt: usize,
    scm_budget: u64,
    /// Pools changed since their last aggregation.
    dirty: BTreeSet<Uuid>,
    checkpoints: u64,
    /// Bytes of value per data checksum (the device's format).
    chunk: u64,
    prof: Prof,
    /// What the engine's metrics read without asking ([`crate::counters`]).
    pub(crate) counters: Arc<crate::TargetCounters>,
    published: crate::counters::Published,
    /// The batch being gathered.
    open: Batch,
    /// Data writes started ahead of their batch's commit, by tag.
    ahead: HashMap<u64, AheadWrite>,
    /// Blocks of failed batches whose writes were still in flight: they
    /// return to the allocator when the last of them is done.
    orphans: Vec<(u64, Vec<(u64, u64)>)>,
    /// Commits in flight, oldest first (applied and answered in this order).
    commits: VecDeque<InCommit>,
    /// Space claimed by the commits in flight per pool: (scm, nvme).
    claimed: HashMap<Uuid, (u64, u64)>,
    /// Fetches waiting to start (for buffers, or for a checkpoint).
    queued: Vec<Queued>,
    fetch_jobs: HashMap<u64, InFetch>,
    /// Tag of the next job started on the device (increasing).
    next_tag: u64,
    /// Blocks freed while reads were in flight, with the tag from which on
    /// fetches no longer see them: they return to the allocator once every
    /// fetch started before that tag is done (a read in flight never reads
    /// a block rewritten under it).
    deferred: Vec<(u64, Vec<(u64, u64)>)>,
    /// A checkpoint is due: no new device work starts until it is written.
    ckpt_due: bool,
    /// Set by a failed device write: updates are refused from then on.
    broken: Option<Errno>,
    /// Set by replay finding acknowledged state damaged: every request is
    /// refused (see [`replay`]).
    refused: Option<Errno>,
    /// Verifies stored extents while the target is idle ([`scrub`]).
    scrub: scrub::Scrubber,
    /// Why updates are refused, for whoever asks the storage (no queue hop).
    fault: Arc<parking_lot::Mutex<Option<String>>>,
    /// Sources polled between the other work (local clients).
    sources: Vec<Box<dyn Source>>,
    /// Keep polling, rather than sleep, until then: a source's next request
    /// usually follows its reply closely.
    poll_until: Option<Instant>,
    /// Whether it may aggregate on its own ([`crate::AggregationLease`]).
    lease: Arc<crate::AggregationLease>,
    /// Containers with a space quota: (pool, container).
    quotas: HashMap<(Uuid, Uuid), ContQuota>,
    /// The newest quota push applied per container (see [`Ctl::SetQuota`]).
    quota_versions: HashMap<(Uuid, Uuid), u64>,
}

/// Counters for the log line at close (how well group commit and read batching work).
#[derive(Default)]
struct Prof {
    commits: u64,
    committed_ops: u64,
    commit_ns: u64,
    fetch_rounds: u64,
    fetches: u64,
    read_pieces: u64,
    /// Of `commit_ns`: until the commits' writes were done (then any fdatasync).
    write_ns: u64,
    flushes: u64,
}

/// Where some of a fetch's bytes are.
enum Piece {
    Bytes(Vec<u8>),
    /// In a region of the registered buffers: (buffer, offset, length).
    Region(usize, usize, usize),
    /// In the source's reply area: (address, length).
    InArea(usize, usize),
}

/// One iod of a fetch being served.
struct IodRead {
    fv: data::FetchedValue,
    has_crc: bool,
    /// The bytes returned (`fv.len` of them): pieces at their offsets, zeros
    /// between them.
    out: Vec<(u64, Piece)>,
    /// Device segments still to read into `out`.
    segs: Vec<Seg>,
    /// The client's checksum of exactly the bytes returned, if stored.
    stored_crc: Option<u32>,
    /// A checksum failure of one of its chunks: the iod fails with it.
    bad: Option<Errno>,
}

fn ok_response(body: Option<data::response::Body>) -> data::Response {
    data::Response {
        status: Some(data::Status {
            code: 0,
            message: String::new(),
        }),
        body,
    }
}

fn dtx_state_response(state: data::DtxState) -> data::Response {
    ok_response(Some(data::response::Body::DtxState(data::DtxQueryResp {
        state: state as i32,
    })))
}

fn kind_of(k: i32, op: &str) -> Result<Kind, Errno> {
    match data::ValueKind::try_from(k) {
        Ok(data::ValueKind::Single) => Ok(Kind::Single),
        Ok(data::ValueKind::Array) => Ok(Kind::Array),
        Err(_) => Err(Errno::inval(format!("{op}: unknown value kind {k}"))),
    }
}

fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

impl Target {
    /// Open target `id` of the device `opts.bdev` and replay it, with the
    /// tuning of `opts` (flush interval, polling, scrubbing rate).
    pub(crate) fn open(
        sb: Superblock,
        opts: &crate::StorageOptions,
        id: u32,
        scm_budget: u64,
        fault: Arc<parking_lot::Mutex<Option<String>>>,
        lease: Arc<crate::AggregationLease>,
    ) -> Result<Target, StorageError> {
        let path = &opts.bdev.path;
        let mut dev = DeviceIo::open(path, opts.hugepages, id).map_err(|e| {
            StorageError::io(format!("target {id}: open device {}", path.display()), e)
        })?;
        dev.spin = opts.read_spin;
        let alloc = BlockAlloc::new(sb.data_blocks());
        let mut t = Target {
            id,
            sb,
            dev,
            index: TargetIndex::default(),
            alloc,
            seq: 0,
            durable: 0,
            stamped: 0,
            last_real: 0,
            flushed_at: Instant::now(),
            stamps: VecDeque::new(),
            settled: 0,
            unsettled: Vec::new(),
            dirty_since: None,
            flush_interval: opts.flush_interval,
            poll: opts.poll,
            seq_started: 0,
            wal_tail: 0,
            generation: Uuid::new_v4().as_u64_pair().0.max(1),
            next_ckpt: 0,
            scm_budget,
            dirty: BTreeSet::new(),
            checkpoints: 0,
            chunk: 0,
            prof: Prof::default(),
            counters: Default::default(),
            published: Default::default(),
            open: Batch::default(),
            ahead: HashMap::new(),
            orphans: Vec::new(),
            commits: VecDeque::new(),
            claimed: HashMap::new(),
            quotas: HashMap::new(),
            quota_versions: HashMap::new(),
            queued: Vec::new(),
            fetch_jobs: HashMap::new(),
            next_tag: 0,
            deferred: Vec::new(),
            ckpt_due: false,
            broken: None,
            refused: None,
            scrub: scrub::Scrubber::new(opts.scrub_rate),
            fault,
            sources: Vec::new(),
            poll_until: None,
            lease,
        };
        t.chunk = t.sb.csum_chunk();
        match t.replay() {
            Ok(()) => t.last_real = t.stamped,
            Err(replay::ReplayError::Storage(e)) => return Err(e),
            Err(replay::ReplayError::Damaged(msg)) => t.refuse(msg),
        }
        Ok(t)
    }

    /// Serve nothing from now on: replay found acknowledged state damaged.
    /// The index stays empty (no partial state is ever read), nothing is
    /// written to the device, and every request and control operation
    /// fails with `msg` (which names the target, where and what).
    fn refuse(&mut self, msg: String) {
        tracing::error!(target = self.id, "{msg}");
        self.index = TargetIndex::default();
        (self.seq, self.seq_started, self.durable, self.wal_tail) = (0, 0, 0, 0);
        *self.fault.lock() = Some(msg.clone());
        self.refused = Some(Errno::new(-libc::EIO, msg));
    }

    fn io_err(&self, what: &str, e: std::io::Error) -> StorageError {
        StorageError::io(format!("target {}: {what}", self.id), e)
    }

    fn data_off(&self, block: u64) -> u64 {
        self.sb.data_offset(self.id) + block * BLOCK
    }

    pub(crate) fn run(mut self, inbox: Inbox) {
        if let Err(e) = self.dev.set_wake(inbox.wake.fd.as_raw_fd()) {
            tracing::warn!(target = self.id, error = %e, "wake-up read not armed; requests wait for device completions");
        }
        let mut halt = false;
        let mut stopping = false;
        let mut spun = false;
        let mut idle_since = Instant::now();
        loop {
            self.complete();
            self.publish(false);
            if !stopping {
                let mut n = 0;
                while n < MAX_BATCH && self.open.data < BATCH_DATA {
                    let m = match inbox.rx.try_recv() {
                        Ok(m) => m,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            stopping = true;
                            break;
                        }
                    };
                    match m {
                        Msg::Data(req, tx) => self.take(req, tx, None),
                        Msg::Attach(src) => self.sources.push(src),
                        Msg::Ctl(c, tx) => {
                            // Control ops see (and log after) everything queued before them.
                            self.drain();
                            let _ = tx.send(self.control(c));
                        }
                        Msg::Stop => stopping = true,
                        Msg::Halt => (stopping, halt) = (true, true),
                    }
                    n += 1;
                    if stopping {
                        break;
                    }
                }
                if !stopping {
                    self.poll_sources();
                }
            }
            self.pump();
            if !self.filling().is_empty() && self.lease.valid() {
                // Aggregation needs the device to itself; it gives the space back.
                self.drain();
                for pool in self.filling() {
                    self.auto_aggregate(pool, "nvme usage above 80%");
                }
            }
            if !self.busy() {
                if stopping {
                    break;
                }
                if self.poll_until.is_some_and(|t| Instant::now() < t) {
                    // Polling for a source's next request: let others have the core meanwhile.
                    std::thread::yield_now();
                    continue;
                }
                self.poll_until = None;
                if self.stamp_due() {
                    self.open.ops.push(WalOp::Flushed {
                        through: self.durable,
                    });
                    continue;
                }
                if self.scrub_due() {
                    self.scrub_step();
                    continue;
                }
                self.publish(true);
                if self.sleep_idle(&inbox) {
                    idle_since = Instant::now();
                } else if idle_since.elapsed() >= IDLE_AGGREGATE && self.lease.valid() {
                    let dirty: Vec<Uuid> = self.dirty.iter().copied().collect();
                    for pool in dirty {
                        self.auto_aggregate(pool, "idle");
                    }
                    idle_since = Instant::now();
                }
                continue;
            }
            idle_since = Instant::now();
            if self.dev.in_flight() == 0 || self.dev.completed() {
                self.submit();
                continue;
            }
            // A lone read in flight (QD1): poll for a short while rather
            // than sleep, a wake-up less on the way back.
            let spin = self.dev.spin;
            let lone = self.dev.in_flight() == 1 && self.fetch_jobs.len() == 1;
            if !spin.is_zero() && !spun && lone && inbox.rx.is_empty() {
                spun = true;
                self.wait(&inbox, Some(spin));
            } else {
                spun = false;
                self.wait(&inbox, None);
            }
        }
        if halt {
            return;
        }
        let p = &self.prof;
        tracing::info!(
            target = self.id,
            commits = p.commits,
            ops_per_commit = p.committed_ops as f64 / p.commits.max(1) as f64,
            us_per_commit = p.commit_ns / 1000 / p.commits.max(1),
            us_writing = p.write_ns / 1000 / p.commits.max(1),
            flushes = p.flushes,
            fetch_rounds = p.fetch_rounds,
            fetches_per_round = p.fetches as f64 / p.fetch_rounds.max(1) as f64,
            reads_per_round = p.read_pieces as f64 / p.fetch_rounds.max(1) as f64,
            "target closing"
        );
        // A checkpoint at close makes the next open fast; failure is harmless.
        if self.wal_tail > 0 && self.refused.is_none() {
            if let Err(e) = self.checkpoint() {
                tracing::warn!(target = self.id, error = %e, "checkpoint at close failed");
            }
        }
    }

    /// Refresh the space the metrics read, if due ([`crate::counters`]).
    fn publish(&mut self, idle: bool) {
        if self.published.due(self.seq, idle) {
            let (scm, data) = (self.scm_budget, self.sb.data_bytes);
            self.published
                .publish(&self.counters, self.seq, &self.index, scm, data);
        }
    }

    /// Start (fetches: queue) one data-plane request.
    fn take(&mut self, req: Request, tx: Responder, area: Option<ReplyArea>) {
        if let Some(e) = &self.refused {
            return tx.send(Err(e.clone()));
        }
        if let Err(e) = crate::check_request(&req) {
            return tx.send(Err(e));
        }
        match req {
            Request::Fetch(f) => self.queued.push((f, tx, area)),
            req => self.handle(req, tx),
        }
    }

    /// Take the request each source has waiting; forget closed sources.
    fn poll_sources(&mut self) {
        let mut i = 0;
        while i < self.sources.len() {
            match self.sources[i].poll() {
                Polled::Idle => i += 1,
                Polled::Request(req, reply, area) => {
                    self.poll_until = Some(Instant::now() + self.poll);
                    self.take(req, Responder(Some(reply)), area);
                    i += 1;
                }
                Polled::Closed => {
                    self.sources.swap_remove(i);
                }
            }
        }
    }

    /// Mark the target asleep and sleep in the ring until a message, a
    /// source's request, a flush is due or [`IDLE_AGGREGATE`]; false if it
    /// slept that long.
    fn sleep_idle(&mut self, inbox: &Inbox) -> bool {
        if !self.going_to_sleep(inbox) {
            return true;
        }
        let timeout = match self.dirty_since {
            Some(t) if self.flush_wanted() => self
                .flush_interval
                .saturating_sub(t.elapsed())
                .clamp(Duration::from_millis(1), IDLE_AGGREGATE),
            _ => IDLE_AGGREGATE,
        };
        let timeout = match self.stamp_wanted() {
            true => timeout.min(
                self.flush_interval
                    .saturating_sub(self.flushed_at.elapsed())
                    .max(Duration::from_millis(1)),
            ),
            false => timeout,
        };
        let timeout = match self.scrub.wait() {
            Some(d) if self.refused.is_none() => timeout.min(d.max(Duration::from_millis(1))),
            _ => timeout,
        };
        let r = self.dev.wait_idle(inbox.wake.fd.as_raw_fd(), timeout);
        inbox.wake.asleep().store(0, Ordering::SeqCst);
        match r {
            Ok(woken) => woken,
            Err(e) => {
                tracing::error!(target = self.id, error = %e, "waiting for requests failed");
                std::thread::sleep(Duration::from_millis(1));
                true
            }
        }
    }

    /// Publish that the target sleeps; false (and awake again) if a message
    /// or a source's request arrived meanwhile.
    fn going_to_sleep(&self, inbox: &Inbox) -> bool {
        inbox.wake.asleep().store(1, Ordering::SeqCst);
        // Pairs with the fence of a sender (Mailbox::send, a source's client):
        // either the target sees its work now, or the sender sees it asleep.
        fence(Ordering::SeqCst);
        if !inbox.rx.is_empty() || self.sources.iter().any(|s| s.pending()) {
            inbox.wake.asleep().store(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Sleep in the ring until a device completion or a new message (or
    /// poll for `spin`).
    fn wait(&mut self, inbox: &Inbox, spin: Option<Duration>) {
        if spin.is_none() && !self.going_to_sleep(inbox) {
            return;
        }
        let r = self.dev.wait(spin);
        inbox.wake.asleep().store(0, Ordering::SeqCst);
        if let Err(e) = r {
            tracing::error!(target = self.id, error = %e, "waiting for device completions failed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether anything is gathered, queued or in flight.
    fn busy(&self) -> bool {
        !self.open.ops.is_empty()
            || self.open.sync
            || !self.ahead.is_empty()
            || !self.queued.is_empty()
            || !self.commits.is_empty()
            || !self.fetch_jobs.is_empty()
    }

    /// Start what can start: a due checkpoint once nothing is in flight,
    /// the queued fetches, the gathered batch.
    fn pump(&mut self) {
        if self.ckpt_due && self.dev.in_flight() == 0 {
            self.ckpt_due = false;
            self.open.unstage(&mut self.dev);
            if let Err(e) = self.checkpoint() {
                tracing::warn!(target = self.id, error = %e, "checkpoint failed; WAL keeps growing");
            }
        }
        if self.flush_wanted() {
            let since = *self.dirty_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= self.flush_interval {
                self.open.sync = true;
            }
        }
        if !self.ckpt_due {
            self.start_fetches();
            self.start_commit();
        }
    }

    /// Finish everything gathered, queued and in flight (before a control
    /// operation, which runs alone).
    fn drain(&mut self) {
        loop {
            self.pump();
            if !self.busy() && !self.ckpt_due {
                return;
            }
            if self.dev.in_flight() > 0 && !self.dev.completed() {
                if let Err(e) = self.dev.wait(None) {
                    tracing::error!(target = self.id, error = %e, "waiting for device completions failed");
                }
            } else {
                self.submit();
            }
            self.complete();
        }
    }

    fn submit(&mut self) {
        if let Err(e) = self.dev.submit() {
            tracing::error!(target = self.id, error = %e, "submitting device operations failed");
        }
    }

    /// The pools changed since their last aggregation whose data region is
    /// more than 80% used.
    fn filling(&self) -> Vec<Uuid> {
        self.dirty
            .iter()
            .filter(|p| {
                self.index
                    .pools
                    .get(p)
                    .is_some_and(|pt| pt.nvme_total > 0 && pt.nvme_used() * 10 > pt.nvme_total * 8)
            })
            .copied()
            .collect()
    }

    /// Take the device's completions and finish what they complete.
    fn complete(&mut self) {
        let mut done = Vec::new();
        if let Err(e) = self.dev.reap(&mut done) {
            tracing::error!(target = self.id, error = %e, "reaping device completions failed");
        }
        for d in done {
            if let Some(job) = self.fetch_jobs.get_mut(&d.tag) {
                let (dst, into) = job.reads[d.idx];
                let res = d.res.map(|()| match into {
                    ReadInto::Region(buf, off) => self.dev.bytes(buf, off, dst.len),
                    ReadInto::Area(a) => area_bytes(a, dst.len),
                });
                if let Some((iod, at, from, len)) =
                    absorb_piece(self.id, self.chunk, &mut job.plans, dst, res)
                {
                    let piece = match into {
                        ReadInto::Region(buf, off) => Piece::Region(buf, off + from, len),
                        ReadInto::Area(a) => Piece::InArea(a + from, len),
                    };
                    if let Ok(iods) = &mut job.plans[dst.fetch] {
                        iods[iod].out.push((at, piece));
                    }
                }
                job.pending -= 1;
                if job.pending == 0 {
                    // The replies borrow the regions: released once they are sent.
                    let job = self.fetch_jobs.remove(&d.tag).expect("job");
                    for ((f, tx, _), p) in job.fetches.into_iter().zip(job.plans) {
                        tx.send(p.map(|iods| self.assemble(&f, iods)));
                    }
                    release_reads(&mut self.dev, &job.reads);
                    self.release_deferred();
                }
            } else if let Some(w) = self.ahead.remove(&d.tag) {
                self.dev.release(w.buf);
                self.written(w.batch, d.res);
            } else if let Some(i) = self
                .commits
                .iter()
                .position(|c| (c.tag..c.tag + 2).contains(&d.tag))
            {
                let c = &mut self.commits[i];
                let ok = d.res.is_ok();
                if let Err(e) = d.res {
                    c.err.get_or_insert(e);
                }
                if d.tag == c.tag {
                    self.dev.release(c.regions[d.idx]);
                    self.write_done(i);
                } else {
                    c.done = true;
                    let seq = c.seq;
                    if ok {
                        self.flushed(seq);
                    }
                }
            }
        }
        self.start_syncs();
        self.retire_commits();
    }

    /// A data write of batch `batch` started ahead of its commit is done: it
    /// counts for the open batch, or for the batch's commit once sealed
    /// ([`Target::write_done`]); a failed update's blocks are given back
    /// after its last such write.
    fn written(&mut self, batch: u64, res: std::io::Result<()>) {
        if self.open.id == batch {
            if let Err(e) = res {
                self.open.err.get_or_insert(e);
            }
        } else if let Some(i) = self.commits.iter().position(|c| c.batch == batch) {
            if let Err(e) = res {
                self.commits[i].err.get_or_insert(e);
            }
            self.write_done(i);
        }
        if self.writes_ahead(batch) == 0 {
            // Nothing lands on a failed update's blocks any more.
            while let Some(i) = self.orphans.iter().position(|(b, _)| *b == batch) {
                for (b, n) in self.orphans.swap_remove(i).1 {
                    self.alloc.free(b, n);
                }
            }
        }
    }

    /// Writes started ahead for batch `batch` that are still in flight.
    fn writes_ahead(&self, batch: u64) -> usize {
        self.ahead.values().filter(|w| w.batch == batch).count()
    }

    /// Give back the blocks of a failed update or batch of `batch`: now, or
    /// once no write started ahead for that batch can still land on them.
    fn free_after_writes(&mut self, batch: u64, runs: Vec<(u64, u64)>) {
        if self.writes_ahead(batch) > 0 {
            self.orphans.push((batch, runs));
        } else {
            for (b, n) in runs {
                self.alloc.free(b, n);
            }
        }
    }

    /// One write of commit `i` is done: after its last one the commit is
    /// done, unless it is synchronous and all went well: then it waits for
    /// its fdatasync ([`Target::start_syncs`]).
    fn write_done(&mut self, i: usize) {
        let c = &mut self.commits[i];
        c.writing -= 1;
        if c.writing > 0 {
            return;
        }
        c.written = Some(Instant::now());
        c.done = !c.sync || c.err.is_some();
    }

    /// Start the fdatasync of each synchronous commit whose writes are done,
    /// and those of every commit before it: it covers its own record and
    /// all before it, so replay reaches it.
    fn start_syncs(&mut self) {
        for c in self.commits.iter_mut() {
            if c.writing > 0 {
                return;
            }
            if c.done || c.syncing {
                continue;
            }
            c.syncing = true;
            self.prof.flushes += 1;
            self.counters.flush();
            if let Err(e) = self.dev.start(c.tag + 1, &[Op::sync()]) {
                c.err = Some(e);
                c.done = true;
            }
        }
    }

    /// Every record up to `through`, and its data, is flushed: so are the
    /// stamps in them, and the blocks freed by the records those stamps
    /// cover may be rewritten.
    fn flushed(&mut self, through: u64) {
        if through > self.durable {
            self.flushed_at = Instant::now();
        }
        self.durable = self.durable.max(through);
        self.dirty_since = None;
        while let Some(&(seq, stamp)) = self.stamps.front() {
            if seq > through {
                break;
            }
            self.stamps.pop_front();
            self.settled = self.settled.max(stamp);
        }
        self.settle();
    }

    /// Give the blocks freed by records up to `settled` to the allocator.
    fn settle(&mut self) {
        let settled = self.settled;
        let mut runs = Vec::new();
        self.unsettled.retain(|(seq, r)| {
            if *seq > settled {
                return true;
            }
            runs.extend_from_slice(r);
            false
        });
        self.free_runs(runs);
    }

    /// Settle every freed block now, for an update the device is short of
    /// blocks for: finish everything in flight, then checkpoint (replay
    /// starts from the checkpoint, so it checks no older record's data).
    fn settle_now(&mut self) {
        self.drain();
        if let Err(e) = self.checkpoint() {
            tracing::warn!(target = self.id, error = %e, "checkpoint to reuse freed blocks failed");
        }
    }

    /// Whether a flush covers records that no record stamps yet: replay
    /// learns what was flushed from the stamps only, and tells damage from
    /// a torn tail by them ([`replay`]). A stamp alone needs no stamp of
    /// its own (that would never end).
    fn stamp_wanted(&self) -> bool {
        self.broken.is_none()
            && self.refused.is_none()
            && self.stamped < self.durable.min(self.last_real)
    }

    /// A stamp is wanted and the target was idle for a flush interval
    /// since the flush (a busy target stamps in its next batch anyway; the
    /// interval keeps a flush and the check of what it flushed apart).
    fn stamp_due(&self) -> bool {
        self.stamp_wanted() && self.flushed_at.elapsed() >= self.flush_interval
    }

    /// Whether something acknowledged, or a freed block, waits for a flush.
    fn flush_wanted(&self) -> bool {
        self.broken.is_none() && (self.durable < self.seq || !self.unsettled.is_empty())
    }

    /// Apply and answer the commits done, oldest first: a commit whose
    /// device writes failed fails, and so does every later one (its record
    /// follows a record that may be missing, so replay would not reach it).
    fn retire_commits(&mut self) {
        while self.commits.front().is_some_and(|c| c.done) {
            let c = self.commits.pop_front().expect("front");
            for (pool, (scm, nvme)) in &c.space {
                let e = self.claimed.entry(*pool).or_default();
                e.0 -= scm;
                e.1 -= nvme;
            }
            self.prof.commits += 1;
            self.prof.committed_ops += c.ops.len() as u64;
            self.prof.commit_ns += c.t0.elapsed().as_nanos() as u64;
            if let Some(w) = c.written {
                self.prof.write_ns += (w - c.t0).as_nanos() as u64;
            }
            if let Some(e) = c.err {
                self.device_failed(e);
            }
            if let Some(e) = &self.broken {
                for (b, n) in c.runs {
                    self.alloc.free(b, n);
                }
                for tx in c.replies {
                    tx.send(Err(e.clone()));
                }
                continue;
            }
            self.seq = c.seq;
            for op in c.ops {
                if let Some(pool) = op.changed_pool() {
                    self.dirty.insert(pool);
                }
                self.apply(op, c.seq);
            }
            for tx in c.replies {
                tx.send(Ok((ok_response(None), Gather::default())));
            }
        }
        if self.wal_tail > self.sb.wal_bytes / 2 {
            self.ckpt_due = true;
        }
    }

    /// Aggregate up to now: a snapshot this target learns of later at an
    /// older epoch is refused ([`Ctl::SetSnapshots`]), not silently short.
    fn aggregate(&mut self, pool: Uuid) -> Result<Released, StorageError> {
        let mut upto = self.lease.upto(&pool);
        if let Some(held) = self.index.dtx.oldest_held_epoch(&pool) {
            upto = upto.min(held.saturating_sub(1));
        }
        self.commit_ctl(WalOp::AggregateTo { pool, upto })
    }

    fn auto_aggregate(&mut self, pool: Uuid, why: &str) {
        match self.aggregate(pool) {
            Ok(rel) => {
                tracing::debug!(target = self.id, %pool, why, reclaimed = rel.scm + rel.nvme, "aggregated")
            }
            Err(e) => {
                tracing::warn!(target = self.id, %pool, why, error = %e, "aggregation failed")
            }
        }
        self.dirty.remove(&pool);
    }

    fn handle(&mut self, req: Request, tx: Responder) {
        let r = match req {
            Request::Update(u, bulk) => {
                if !self.unsettled.is_empty() && self.alloc.free_blocks() < blocks_wanted(&u) {
                    self.settle_now();
                }
                let sync = u.sync;
                match self.prepare_update(u, bulk) {
                    Ok(admit) => return self.answer_staged(admit, sync, tx),
                    Err(e) => Err(e),
                }
            }
            Request::Punch(p) => {
                let sync = p.sync;
                match self.prepare_punch(p) {
                    Ok(admit) => return self.answer_staged(admit, sync, tx),
                    Err(e) => Err(e),
                }
            }
            Request::Flush(f) => match self.check_flush(&f) {
                Ok(()) if self.durable >= self.seq => Ok((ok_response(None), Vec::new())),
                Ok(()) => {
                    // Answered after the next synchronous commit, whose
                    // fdatasync starts once everything acknowledged is written.
                    self.open.sync = true;
                    self.open.replies.push(tx);
                    return;
                }
                Err(e) => Err(e),
            },
            Request::Fetch(f) => {
                self.queued.push((f, tx, None));
                return;
            }
            Request::List(l) => self.list(l),
            Request::QuerySize(q) => self.query_size(q),
            Request::ListChanged(l) => self.list_changed(l),
            Request::ListRecords(l) => self.list_records(l),
            Request::DtxDecide(d) => {
                let decided = self
                    .pool_addr(d.addr.as_ref(), "dtx decide")
                    .and_then(|pool| {
                        dtx::decide(
                            &self.index,
                            self.in_flight(),
                            pool,
                            self.id,
                            &d,
                            dtx::now_ms(),
                        )
                    });
                match decided {
                    Ok(ops) if ops.is_empty() => Ok((ok_response(None), Vec::new())),
                    Ok(ops) => return self.log_then_answer(ops, None, tx),
                    Err(e) => Err(e),
                }
            }
            Request::DtxQuery(q) => {
                let known = self
                    .pool_addr(q.addr.as_ref(), "dtx query")
                    .and_then(|pool| {
                        let me = (self.sb.rank, self.id);
                        dtx::query(&self.index, self.in_flight(), pool, me, &q, dtx::now_ms())
                    });
                match known {
                    Ok((state, None)) => Ok((dtx_state_response(state), Vec::new())),
                    Ok((state, Some(op))) => {
                        return self.log_then_answer(vec![op], Some(dtx_state_response(state)), tx)
                    }
                    Err(e) => Err(e),
                }
            }
            Request::DtxPending(p) => self.pool_addr(p.addr.as_ref(), "dtx pending").map(|pool| {
                let me = (self.sb.rank, self.id);
                let pending = dtx::pending(&self.index, &pool, me, &p, dtx::now_ms());
                let body = data::response::Body::DtxPending(pending);
                (ok_response(Some(body)), Vec::new())
            }),
        };
        tx.send(r.map(|(resp, bulk)| (resp, Gather::from(bulk))));
    }

    /// The changes logged or gathered and not applied yet, in the order
    /// they will be applied.
    fn in_flight(&self) -> impl Iterator<Item = &WalOp> + Clone {
        self.commits
            .iter()
            .flat_map(|c| c.ops.iter())
            .chain(self.open.ops.iter())
    }

    /// Answer an update or punch [`Self::prepare_update`] or
    /// [`Self::prepare_punch`] took: once its batch is written if it was
    /// staged; if there was nothing to store (a transaction's retry), at
    /// once if the index already holds what it asked for (and, with
    /// `sync`, that is flushed), else after the changes in flight.
    fn answer_staged(&mut self, admit: Admit, sync: bool, tx: Responder) {
        match admit {
            Admit::Known { durable: true } if !sync || self.durable >= self.seq => {
                tx.send(Ok((ok_response(None), Gather::default())));
            }
            Admit::Known { .. } => {
                // A batch with nothing to log commits only when synchronous.
                self.open.sync |= sync || self.open.ops.is_empty();
                self.open.replies.push(tx);
            }
            Admit::Stage => {
                self.open.sync |= sync;
                self.open.replies.push(tx);
            }
        }
    }

    /// Gather `ops` (transaction decisions) into the open batch and answer
    /// once they are written: with `resp` if given, else a plain success.
    fn log_then_answer(&mut self, ops: Vec<WalOp>, resp: Option<data::Response>, tx: Responder) {
        if let Some(e) = &self.broken {
            tx.send(Err(e.clone()));
            return;
        }
        self.open.ops.extend(ops);
        let tx = match resp {
            None => tx,
            Some(resp) => Responder(Some(Box::new(move |r: crate::ReplyRef<'_>| {
                tx.send(r.map(|(_, bulk)| (resp, bulk)))
            }))),
        };
        self.open.replies.push(tx);
    }

    /// The address's pool, checked: present, for this target, a uuid.
    fn addr_pool<'a>(
        &self,
        a: Option<&'a data::Address>,
        op: &str,
    ) -> Result<(&'a data::Address, Uuid), Errno> {
        let a = a.ok_or_else(|| Errno::inval(format!("{op}: missing address")))?;
        if a.target != self.id {
            return Err(Errno::inval(format!(
                "{op}: request for target {} reached target {}",
                a.target, self.id
            )));
        }
        let pool = peregrine_proto::uuid_from_bytes("pool", &a.pool)
            .map_err(|e| Errno::inval(format!("{op}: {e}")))?;
        Ok((a, pool))
    }

    fn pool_here(&self, pool: &Uuid, op: &str) -> Result<(), Errno> {
        if !self.index.pools.contains_key(pool) {
            return Err(Errno::new(
                -libc::ENOENT,
                format!("{op}: pool {pool} not found on target {}", self.id),
            ));
        }
        Ok(())
    }

    fn addr(&self, a: Option<&data::Address>, op: &str) -> Result<(Uuid, Uuid, ObjKey), Errno> {
        let (a, pool) = self.addr_pool(a, op)?;
        let cont = peregrine_proto::uuid_from_bytes("cont", &a.cont)
            .map_err(|e| Errno::inval(format!("{op}: {e}")))?;
        let oid = a
            .oid
            .as_ref()
            .ok_or_else(|| Errno::inval(format!("{op}: missing object id")))?;
        self.pool_here(&pool, op)?;
        Ok((
            pool,
            cont,
            ObjKey {
                hi: oid.hi,
                lo: oid.lo,
                shard: a.shard,
            },
        ))
    }

    /// [`Self::addr`] of a request that names a pool only (its container
    /// and object, if any, are not read).
    fn pool_addr(&self, a: Option<&data::Address>, op: &str) -> Result<Uuid, Errno> {
        let (_, pool) = self.addr_pool(a, op)?;
        self.pool_here(&pool, op)?;
        Ok(pool)
    }

    fn check_flush(&self, f: &data::FlushReq) -> Result<(), Errno> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let a = f
            .addr
            .as_ref()
            .ok_or_else(|| Errno::inval("flush: missing address"))?;
        let pool = peregrine_proto::uuid_from_bytes("pool", &a.pool)
            .map_err(|e| Errno::inval(format!("flush: {e}")))?;
        if !self.index.pools.contains_key(&pool) {
            return Err(Errno::new(
                -libc::ENOENT,
                format!("flush: pool {pool} not found on target {}", self.id),
            ));
        }
        Ok(())
    }

    /// Refuse an update of `need` bytes that would take the container past
    /// its quota ([`ContQuota`]).
    fn check_quota(&self, pool: &Uuid, cont: &Uuid, need: u64) -> Result<(), Errno> {
        let Some(q) = self.quotas.get(&(*pool, *cont)) else {
            return Ok(());
        };
        let here = self
            .index
            .cont(pool, cont)
            .map_or(0, |c| c.scm_used + c.nvme_used);
        let me = self.id as usize;
        let local: u64 = q
            .share
            .held
            .iter()
            .enumerate()
            .map(|(t, h)| {
                if t == me {
                    here
                } else {
                    h.load(Ordering::Relaxed)
                }
            })
            .sum();
        let used = q.elsewhere.saturating_add(local);
        if used.saturating_add(need) > q.limit {
            return Err(Errno::new(
                -libc::EDQUOT,
                format!(
                    "update: container {cont}: quota of {} stored bytes reached ({used} used, {need} more asked on target {}); nothing stored",
                    q.limit, self.id
                ),
            ));
        }
        if let Some(slot) = q.share.held.get(me) {
            slot.store(here + need, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Validate and stage an update into the open batch; a transaction's
    /// update as a [`WalOp::Prepare`], unless there is nothing to store.
    fn prepare_update(&mut self, u: data::UpdateReq, bulk: Bulk) -> Result<Admit, Errno> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let (pool, cont, obj) = self.addr(u.addr.as_ref(), "update")?;
        if u.dkey.is_empty() {
            return Err(Errno::inval("update: empty dkey"));
        }
        if u.epoch == peregrine_proto::EPOCH_LATEST {
            return Err(Errno::inval(
                "update: epoch u64::MAX is reserved for reads of the latest version",
            ));
        }
        let tx = dtx::parse(u.dtx.as_ref(), "update")?;
        if let Some((id, _)) = &tx {
            let key = OpKey {
                pool: &pool,
                cont: &cont,
                obj: &obj,
                dkey: &u.dkey,
                epoch: u.epoch,
                punch: false,
            };
            let admit = dtx::admit(&self.index, self.in_flight(), *id, &key, "update")?;
            if admit != Admit::Stage {
                return Ok(admit);
            }
        }
        let dk = show(&u.dkey);
        let total = u.iods.iter().try_fold(0u64, |s, i| s.checked_add(i.len));
        match total {
            Some(t) if t <= bulk.len() as u64 => {}
            _ => {
                return Err(Errno::inval(format!(
                    "update: dkey {dk:?}: bulk of {} bytes is shorter than the iods' lengths ({})",
                    bulk.len(),
                    total.map_or("overflow".to_string(), |t| t.to_string())
                )))
            }
        }
        // Validate everything before touching any state.
        let mut parsed = Vec::with_capacity(u.iods.len());
        let (mut scm_need, mut nvme_need, mut pos) = (0u64, 0u64, 0usize);
        for iod in &u.iods {
            if iod.akey.is_empty() {
                return Err(Errno::inval(format!("update: dkey {dk:?}: empty akey")));
            }
            let kind = kind_of(iod.kind, "update")?;
            let range = pos..pos + iod.len as usize;
            pos = range.end;
            if kind == Kind::Array && iod.offset.checked_add(iod.len).is_none() {
                return Err(Errno::inval(format!(
                    "update: akey {:?}: extent overflows",
                    show(&iod.akey)
                )));
            }
            if kind == Kind::Single && iod.has_unchanged_since {
                return Err(Errno::inval(format!(
                    "update: akey {:?}: unchanged_since applies to ARRAY values only",
                    show(&iod.akey)
                )));
            }
            let large = range.len() >= peregrine_proto::DATA_THRESHOLD;
            scm_need += value_scm(
                &u.dkey,
                &iod.akey,
                if large { 0 } else { range.len() as u64 },
            );
            if large {
                nvme_need += wal::round_up(range.len() as u64);
            }
            parsed.push((iod, kind, range, large));
        }
        // Only conditional updates pay for this (not a name per update).
        if u.insert_only || !u.conditions.is_empty() {
            let own = tx.as_ref().map(|t| t.0);
            let at = (&pool, &cont, &obj, u.dkey.as_slice());
            let absent: Vec<data::Condition> = if u.insert_only {
                u.iods
                    .iter()
                    .map(|iod| data::Condition {
                        akey: iod.akey.clone(),
                        expect: Some(data::condition::Expect::Absent(true)),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let req = format!("update on target {} shard {}", self.id, obj.shard);
            for conds in [&absent, &u.conditions] {
                condition::check(&self.index, self.in_flight(), own, at, conds, &req)?;
            }
        }
        for iod in u.iods.iter().filter(|i| i.has_unchanged_since) {
            let at = (&pool, &cont, &obj, u.dkey.as_slice());
            let own = tx.as_ref().map(|t| t.0);
            dtx::check_unchanged(&self.index, self.in_flight(), own, at, iod)?;
        }
        let p = &self.index.pools[&pool];
        let (os, on) = self.open.space.get(&pool).copied().unwrap_or_default();
        let (cs, cn) = self.claimed.get(&pool).copied().unwrap_or_default();
        // Changes held by transactions take their space until decided.
        let (hs, hn) = self.index.dtx.held_space(&pool);
        let (bs, bn) = (os + cs + hs, on + cn + hn);
        for (tier, need, total, used) in [
            ("scm", scm_need, p.scm_total, p.scm_used() + bs),
            ("nvme", nvme_need, p.nvme_total, p.nvme_used() + bn),
        ] {
            let free = total.saturating_sub(used);
            if need > free {
                return Err(StorageError::NoSpace {
                    pool: pool.to_string(),
                    tier,
                    target: self.id,
                    need,
                    free,
                }
                .into());
            }
        }
        self.check_quota(&pool, &cont, scm_need + nvme_need)?;
        // Copy each value once, to where it is stored, and check the
        // client's checksum on that copy: the bytes stored are the bytes checked.
        let mut staging = Staging::default();
        let mut values = Vec::with_capacity(parsed.len());
        for (iod, kind, range, large) in parsed {
            let what = || format!("update: dkey {dk:?} akey {:?}", show(&iod.akey));
            let stored = if large {
                self.stage_value(&pool, &bulk, range, iod.has_crc, &mut staging)
                    .map(|(block, nblocks, csums, crc)| {
                        (
                            Payload::Device(DevExtent {
                                block,
                                nblocks,
                                csums,
                            }),
                            crc,
                        )
                    })
            } else {
                bulk.to_vec(range.start, range.len())
                    .map_err(|e| Errno::inval(format!("{}: bulk: {e}", what())))
                    .map(|v| {
                        let crc = if iod.has_crc {
                            peregrine_isal::crc32c(&v)
                        } else {
                            0
                        };
                        (Payload::Inline(v), crc)
                    })
            };
            let checked = stored.and_then(|(payload, got)| {
                if iod.has_crc && got != iod.crc {
                    return Err(Errno::new(
                        -peregrine_proto::CSUM_ERRNO,
                        format!(
                            "{}: checksum mismatch (client sent {:#010x}, received data has {got:#010x}); nothing stored",
                            what(),
                            iod.crc
                        ),
                    ));
                }
                Ok(payload)
            });
            let payload = match checked {
                Ok(p) => p,
                Err(e) => {
                    self.undo(staging);
                    return Err(e);
                }
            };
            values.push(NewValue {
                akey: iod.akey.clone(),
                kind,
                offset: if kind == Kind::Array { iod.offset } else { 0 },
                len: iod.len,
                crc: iod.has_crc.then_some(iod.crc),
                payload,
            });
        }
        let batch = &mut self.open;
        batch.data += staging.bytes;
        batch.writes.extend(staging.writes);
        batch.runs.extend(staging.runs);
        let s = batch.space.entry(pool).or_default();
        s.0 += scm_need;
        s.1 += nvme_need;
        let op = WalOp::Update {
            pool,
            cont,
            obj,
            dkey: u.dkey,
            epoch: u.epoch,
            values,
        };
        batch.ops.push(match tx {
            None => op,
            Some((id, shards)) => WalOp::Prepare {
                id,
                shards,
                at_ms: dtx::now_ms(),
                op: Box::new(op),
            },
        });
        Ok(Admit::Stage)
    }

    /// Give a large value fresh data blocks and copy its bytes (`range` of
    /// `bulk`) into the registered buffers its writes start from, a buffer
    /// at a time (into memory of their own when no region is free),
    /// checksumming each chunk on the copy. Returns the blocks, the chunk
    /// checksums and (`with_crc`) the CRC32C of the whole value.
    fn stage_value(
        &mut self,
        pool: &Uuid,
        bulk: &Bulk,
        range: std::ops::Range<usize>,
        with_crc: bool,
        staging: &mut Staging,
    ) -> Result<(u64, u64, Vec<u32>, u32), Errno> {
        let n = wal::round_up(range.len() as u64) / BLOCK;
        let Some(block) = self.alloc.alloc(n) else {
            return Err(Errno::new(
                -libc::ENOSPC,
                format!(
                    "update: pool {pool}: target {} data region has no free run of {n} blocks ({} blocks free)",
                    self.id,
                    self.alloc.free_blocks()
                ),
            ));
        };
        staging.runs.push((block, n));
        staging.bytes += range.len();
        let chunk = self.chunk as usize;
        let mut csums = Vec::with_capacity(range.len().div_ceil(chunk));
        let mut crc = 0u32;
        let dev_off = self.sb.data_offset(self.id) + block * BLOCK;
        for (k, start) in range.clone().step_by(BUF_BYTES).enumerate() {
            let len = BUF_BYTES.min(range.end - start);
            // A batch stages at most BATCH_DATA: the rest of the buffers
            // stays for the commit in flight and for reads.
            let room = staged_bytes(&self.open.writes)
                + staged_bytes(&staging.writes)
                + self.ahead.values().map(|w| w.len).sum::<usize>()
                < BATCH_DATA;
            let at = dev_off + (k * BUF_BYTES) as u64;
            let bulk_err = |e| Errno::inval(format!("update: bulk {start}+{len}: {e}"));
            let Some((buf, off, padded)) = room.then(|| self.dev.region(len)).flatten() else {
                let mut v = vec![0u8; len];
                let r = copy_and_sum(
                    bulk,
                    start,
                    &mut v,
                    chunk,
                    &mut csums,
                    with_crc.then_some(&mut crc),
                );
                staging.writes.push((at, Staged::Bytes(v)));
                r.map_err(bulk_err)?;
                continue;
            };
            self.dev.bytes_mut(buf, off, padded)[len..].fill(0);
            // Piece by piece: the device writes one piece while the next is
            // copied. Once one cannot start, the rest goes with the commit.
            let (mut copied, mut sent) = (0, 0);
            let mut res = Ok(());
            let whole_chunks = WRITE_PIECE.div_ceil(chunk) * chunk;
            while copied < padded && res.is_ok() {
                let piece = whole_chunks.min(padded - copied);
                let d =
                    self.dev
                        .bytes_mut(buf, off + copied, piece.min(len.saturating_sub(copied)));
                res = copy_and_sum(
                    bulk,
                    start + copied,
                    d,
                    chunk,
                    &mut csums,
                    with_crc.then_some(&mut crc),
                );
                copied += piece;
                if res.is_ok()
                    && sent + piece == copied
                    && self.write_ahead(at + sent as u64, (buf, off + sent, piece))
                {
                    sent = copied;
                }
            }
            if sent == padded {
                // The writes started ahead hold the region now.
                self.dev.release(buf);
            } else {
                staging.writes.push((
                    at + sent as u64,
                    Staged::Region(buf, off + sent, padded - sent),
                ));
            }
            res.map_err(bulk_err)?;
        }
        Ok((block, n, csums, crc))
    }

    /// Give back what a failed update took: its blocks once no write of it
    /// started ahead can still land on them (once the open batch has none).
    fn undo(&mut self, staging: Staging) {
        self.free_after_writes(self.open.id, staging.runs);
        release_staged(&mut self.dev, staging.writes);
    }

    /// Start writing a region (a piece of a value being staged) to its
    /// fresh blocks now, ahead of the open batch's commit, which then only
    /// has to log the batch and fdatasync once these writes are done: the
    /// device writes while the target copies the next piece in. False if it
    /// cannot start now (a checkpoint is due, the ring refused it): then the
    /// commit writes it. The write holds the region's buffer until it is done.
    fn write_ahead(&mut self, off: u64, (buf, boff, len): (usize, usize, usize)) -> bool {
        let tag = self.next_tag;
        if self.ckpt_due
            || self
                .dev
                .start(tag, &[Op::write(off, (buf, boff, len))])
                .is_err()
        {
            return false;
        }
        self.dev.share(buf);
        self.next_tag += 1;
        self.ahead.insert(
            tag,
            AheadWrite {
                batch: self.open.id,
                buf,
                len,
            },
        );
        // Under way while the next piece is copied in.
        self.submit();
        true
    }

    /// Validate a punch and gather it into the open batch; a transaction's
    /// punch as a [`WalOp::Prepare`], unless there is nothing to store.
    fn prepare_punch(&mut self, p: data::PunchReq) -> Result<Admit, Errno> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let (pool, cont, obj) = self.addr(p.addr.as_ref(), "punch")?;
        if p.dkey.is_empty() && !p.akeys.is_empty() {
            return Err(Errno::inval("punch: akeys given without a dkey"));
        }
        let tx = dtx::parse(p.dtx.as_ref(), "punch")?;
        if let Some((id, _)) = &tx {
            let key = OpKey {
                pool: &pool,
                cont: &cont,
                obj: &obj,
                dkey: &p.dkey,
                epoch: p.epoch,
                punch: true,
            };
            let admit = dtx::admit(&self.index, self.in_flight(), *id, &key, "punch")?;
            if admit != Admit::Stage {
                return Ok(admit);
            }
        }
        if !p.conditions.is_empty() {
            if p.dkey.is_empty() {
                return Err(Errno::inval("punch: conditions given without a dkey"));
            }
            let own = tx.as_ref().map(|t| t.0);
            let at = (&pool, &cont, &obj, p.dkey.as_slice());
            let req = format!("punch on target {} shard {}", self.id, obj.shard);
            condition::check(&self.index, self.in_flight(), own, at, &p.conditions, &req)?;
        }
        let op = WalOp::Punch {
            pool,
            cont,
            obj,
            dkey: p.dkey,
            akeys: p.akeys,
            epoch: p.epoch,
        };
        self.open.ops.push(match tx {
            None => op,
            Some((id, shards)) => WalOp::Prepare {
                id,
                shards,
                at_ms: dtx::now_ms(),
                op: Box::new(op),
            },
        });
        Ok(Admit::Stage)
    }

    /// Start committing the gathered batch: its WAL record and the value
    /// bytes not written ahead go to the device now, side by side with its
    /// writes started ahead. It is applied and answered when they are done
    /// (and, if synchronous, its fdatasync: [`Target::start_syncs`]), after
    /// the commits before it.
    fn start_commit(&mut self) {
        if (self.open.ops.is_empty() && !self.open.sync) || self.commits.len() >= MAX_COMMITS {
            return;
        }
        // Stamp the record with the last flush; a flush alone writes a
        // record only to stamp it, for freed blocks waiting to be settled.
        let stamped = self
            .open
            .ops
            .iter()
            .any(|op| matches!(op, WalOp::Flushed { through } if *through >= self.durable));
        if !stamped
            && self.durable > self.stamped
            && (!self.open.ops.is_empty() || !self.unsettled.is_empty())
        {
            self.open.ops.push(WalOp::Flushed {
                through: self.durable,
            });
        }
        if let Some(e) = self.open.err.take() {
            self.device_failed(e);
        }
        if let Some(e) = self.broken.clone() {
            let b = self.seal();
            self.fail_batch(b, e);
            return;
        }
        if self.open.ops.is_empty() {
            let b = self.seal();
            let tag = self.next_tag;
            self.next_tag += 2;
            self.commits.push_back(InCommit {
                tag,
                batch: b.id,
                seq: self.seq_started,
                ops: Vec::new(),
                replies: b.replies,
                runs: b.runs,
                space: b.space,
                regions: Vec::new(),
                writing: self.writes_ahead(b.id),
                sync: true,
                syncing: false,
                done: false,
                err: None,
                t0: Instant::now(),
                written: None,
            });
            self.start_syncs();
            return;
        }
        let rec = match self.wal_record(&self.open.ops) {
            Ok(r) => r,
            Err(e) => {
                let b = self.seal();
                self.fail_batch(b, e);
                return;
            }
        };
        if self.wal_tail + rec.len() as u64 > self.sb.wal_bytes {
            // The WAL restarts after a checkpoint, which waits for the device.
            self.ckpt_due = true;
            return;
        }
        let mut b = self.seal();
        let wal_off = self.sb.wal_offset(self.id) + self.wal_tail;
        let mut ops = Vec::new();
        let mut regions = Vec::new();
        // Regions taken here (the staged ones stay with the batch if it waits).
        let mut fresh = Vec::new();
        let recs = rec
            .chunks(BUF_BYTES)
            .enumerate()
            .map(|(k, p)| (wal_off + (k * BUF_BYTES) as u64, p));
        let mut short = false;
        let pieces = b.writes.iter().map(|(off, w)| (*off, Some(w), &[][..]));
        for (off, staged, bytes) in pieces.chain(recs.map(|(o, p)| (o, None, p))) {
            let r = match staged {
                Some(Staged::Region(buf, boff, len)) => Some((*buf, *boff, *len)),
                Some(Staged::Bytes(v)) => self.dev.region_with(v),
                None => self.dev.region_with(bytes),
            };
            let Some(r) = r else {
                short = true;
                break;
            };
            if !matches!(staged, Some(Staged::Region(..))) {
                fresh.push(r.0);
            }
            ops.push(Op::write(off, r));
            regions.push(r.0);
        }
        if short {
            for buf in fresh {
                self.dev.release(buf);
            }
            if self.dev.in_flight() == 0 {
                // Larger than the buffers: the blocking path writes it in groups.
                b.unstage(&mut self.dev);
                self.commit_sync(b);
            } else {
                self.open = b;
            }
            return;
        }
        let tag = self.next_tag;
        self.next_tag += 2;
        if let Err(e) = self.dev.start(tag, &ops) {
            for buf in regions {
                self.dev.release(buf);
            }
            // Their regions were among those just released.
            b.writes.clear();
            self.device_failed(e);
            let e = self.broken.clone().expect("set by device_failed");
            self.fail_batch(b, e);
            return;
        }
        self.seq_started += 1;
        self.counters.wal_record();
        self.wal_tail += rec.len() as u64;
        self.note_stamps(self.seq_started, &b.ops);
        if b.ops.iter().any(|op| !matches!(op, WalOp::Flushed { .. })) {
            self.last_real = self.seq_started;
        }
        for (pool, (scm, nvme)) in &b.space {
            let e = self.claimed.entry(*pool).or_default();
            e.0 += scm;
            e.1 += nvme;
        }
        self.commits.push_back(InCommit {
            tag,
            batch: b.id,
            seq: self.seq_started,
            ops: b.ops,
            replies: b.replies,
            runs: b.runs,
            space: b.space,
            regions,
            writing: self.writes_ahead(b.id) + ops.len(),
            sync: b.sync,
            syncing: false,
            done: false,
            err: None,
            t0: Instant::now(),
            written: None,
        });
    }

    /// Close the open batch (a new one gathers from now on).
    fn seal(&mut self) -> Batch {
        let id = self.open.id + 1;
        std::mem::replace(
            &mut self.open,
            Batch {
                id,
                ..Batch::default()
            },
        )
    }

    /// A device write failed: the device's state is unknown, so updates are
    /// refused from now on (the first failure is the one reported).
    fn device_failed(&mut self, e: std::io::Error) {
        if self.broken.is_none() {
            tracing::error!(target = self.id, seq = self.seq_started, error = %e, "device write failed; this target refuses updates until the engine restarts");
            self.stop_updates(Errno::new(
                -libc::EIO,
                format!("target {}: a device write failed ({e}); the target refuses updates until the engine restarts", self.id),
            ));
        }
    }

    /// Refuse updates from now on, and say why to [`crate::Storage::faults`].
    fn stop_updates(&mut self, e: Errno) {
        *self.fault.lock() = Some(e.msg.clone());
        self.broken = Some(e);
    }

    fn fail_batch(&mut self, b: Batch, e: Errno) {
        self.free_after_writes(b.id, b.runs);
        release_staged(&mut self.dev, b.writes);
        for tx in b.replies {
            tx.send(Err(e.clone()));
        }
    }

    /// Commit a batch with blocking I/O (nothing else in flight): for
    /// batches larger than the registered buffers.
    fn commit_sync(&mut self, b: Batch) {
        let t0 = Instant::now();
        let writes: Vec<(u64, &[u8])> = b
            .writes
            .iter()
            .map(|(off, w)| match w {
                Staged::Bytes(v) => (*off, &v[..]),
                Staged::Region(..) => unreachable!("commit_sync of a batch not unstaged"),
            })
            .collect();
        let res = self.log_with(&b.ops, &writes);
        self.prof.commits += 1;
        self.prof.committed_ops += b.ops.len() as u64;
        self.prof.commit_ns += t0.elapsed().as_nanos() as u64;
        match res {
            Ok(()) => {
                for op in b.ops {
                    if let Some(pool) = op.changed_pool() {
                        self.dirty.insert(pool);
                    }
                    self.apply(op, self.seq);
                }
                for tx in b.replies {
                    tx.send(Ok((ok_response(None), Gather::default())));
                }
                self.maybe_checkpoint();
            }
            Err(e) => self.fail_batch(b, e),
        }
    }

    /// Apply `op` of record `seq`; the blocks it frees wait to be settled.
    fn apply(&mut self, op: WalOp, seq: u64) -> Released {
        let mut rel = Released::default();
        self.index.apply(op, &mut rel);
        if !rel.runs.is_empty() {
            self.unsettled.push((seq, rel.runs.clone()));
        }
        rel
    }

    /// Note the stamps ([`WalOp::Flushed`]) in record `seq`.
    fn note_stamps(&mut self, seq: u64, ops: &[WalOp]) {
        if let Some(stamp) = stamp_of(ops) {
            self.stamped = self.stamped.max(stamp);
            self.stamps.push_back((seq, stamp));
        }
    }

    /// Return blocks to the allocator once no read in flight can still be
    /// reading them.
    fn free_runs(&mut self, runs: Vec<(u64, u64)>) {
        if self.fetch_jobs.is_empty() {
            for (b, n) in runs {
                self.alloc.free(b, n);
            }
        } else if !runs.is_empty() {
            self.deferred.push((self.next_tag, runs));
        }
    }

    /// Return the deferred blocks no fetch in flight can still read.
    fn release_deferred(&mut self) {
        let oldest = self.fetch_jobs.keys().min().copied().unwrap_or(u64::MAX);
        let alloc = &mut self.alloc;
        self.deferred.retain(|(from, runs)| {
            if oldest < *from {
                return true;
            }
            for &(b, n) in runs {
                alloc.free(b, n);
            }
            false
        });
    }

    /// Log and apply one control change.
    fn commit_ctl(&mut self, op: WalOp) -> Result<Released, StorageError> {
        self.log(std::slice::from_ref(&op))
            .map_err(|e| StorageError::io(e.msg, std::io::Error::from_raw_os_error(-e.code)))?;
        let rel = self.apply(op, self.seq);
        self.maybe_checkpoint();
        Ok(rel)
    }

    /// Append one WAL record holding `ops` and fdatasync (covering the data
    /// writes issued before it).
    fn log(&mut self, ops: &[WalOp]) -> Result<(), Errno> {
        self.log_with(ops, &[])
    }

    /// Write `data` (the batch's values) and one WAL record holding `ops`,
    /// then fdatasync: in ONE submission, linked (IOSQE_IO_LINK) so that
    /// the record is written only after all the data was, and the fdatasync
    /// runs only after the record was (a failure cancels the rest).
    fn log_with(&mut self, ops: &[WalOp], data: &[(u64, &[u8])]) -> Result<(), Errno> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let rec = self.wal_record(ops)?;
        if self.wal_tail + rec.len() as u64 > self.sb.wal_bytes {
            self.checkpoint().map_err(|e| {
                Errno::new(
                    -libc::ENOSPC,
                    format!("target {}: WAL full and checkpoint failed: {e}", self.id),
                )
            })?;
        }
        let off = self.sb.wal_offset(self.id) + self.wal_tail;
        let mut writes = data.to_vec();
        writes.push((off, &rec));
        self.dev.write(&writes, true).map_err(|e| {
            Errno::new(
                -libc::EIO,
                format!("target {}: write data and WAL: {e}", self.id),
            )
        })?;
        self.seq += 1;
        self.seq_started = self.seq;
        self.counters.wal_record();
        self.wal_tail += rec.len() as u64;
        self.note_stamps(self.seq, ops);
        if ops.iter().any(|op| !matches!(op, WalOp::Flushed { .. })) {
            self.last_real = self.seq;
        }
        self.flushed(self.seq);
        Ok(())
    }

    /// The WAL record holding `ops`, numbered after the last one started.
    fn wal_record(&self, ops: &[WalOp]) -> Result<Vec<u8>, Errno> {
        let payload = bincode::serialize(ops)
            .map_err(|e| Errno::new(-libc::EIO, format!("target {}: encode WAL: {e}", self.id)))?;
        let rec = wal::encode(
            WAL_MAGIC,
            self.sb.device_uuid,
            self.seq_started + 1,
            self.generation,
            &payload,
        );
        if rec.len() as u64 > self.sb.wal_bytes / 2 {
            return Err(Errno::new(
                -libc::ENOSPC,
                format!(
                    "target {}: batch of {} bytes exceeds half the WAL ({} bytes)",
                    self.id,
                    rec.len(),
                    self.sb.wal_bytes
                ),
            ));
        }
        Ok(rec)
    }

    fn maybe_checkpoint(&mut self) {
        if self.wal_tail > self.sb.wal_bytes / 2 {
            if let Err(e) = self.checkpoint() {
                tracing::warn!(target = self.id, error = %e, "checkpoint failed; WAL keeps growing");
            }
        }
    }

    /// Write the index to the inactive slot, fsync, then restart the WAL.
    /// The index holds exactly the durable state here (changes are applied
    /// only after their record is durable), stamped with the last record's seq.
    fn checkpoint(&mut self) -> Result<(), StorageError> {
        let payload = bincode::serialize(&self.index).map_err(|e| {
            StorageError::Corrupt(format!("target {}: encode checkpoint: {e}", self.id))
        })?;
        let rec = wal::encode(CKPT_MAGIC, self.sb.device_uuid, self.seq, 0, &payload);
        if rec.len() as u64 > self.sb.ckpt_bytes {
            return Err(StorageError::Invalid(format!(
                "target {}: checkpoint of {} bytes exceeds its slot of {} bytes (metadata budget too large for this device)",
                self.id,
                rec.len(),
                self.sb.ckpt_bytes
            )));
        }
        let off = self.sb.ckpt_offset(self.id, self.next_ckpt);
        self.dev
            .write(&[(off, &rec)], true)
            .map_err(|e| self.io_err("write checkpoint", e))?;
        tracing::debug!(
            target = self.id,
            slot = self.next_ckpt,
            seq = self.seq,
            bytes = rec.len(),
            "checkpoint"
        );
        self.next_ckpt ^= 1;
        self.wal_tail = 0;
        self.seq_started = self.seq;
        self.checkpoints += 1;
        self.counters.checkpoint();
        // Replay starts from here: every record so far counts as flushed and checked.
        self.durable = self.seq;
        self.dirty_since = None;
        self.stamps.clear();
        self.settled = self.seq;
        self.settle();
        Ok(())
    }

    fn unreserved(&self) -> (u64, u64) {
        let nvme: u64 = self.index.pools.values().map(|p| p.nvme_total).sum();
        let scm: u64 = self.index.pools.values().map(|p| p.scm_total).sum();
        (
            self.sb.data_bytes.saturating_sub(nvme),
            self.scm_budget.saturating_sub(scm),
        )
    }

    fn pool_missing(&self, pool: &Uuid) -> StorageError {
        StorageError::NotFound(format!("pool {pool} not found on target {}", self.id))
    }

    fn control(&mut self, c: Ctl) -> Result<CtlOut, StorageError> {
        if let Some(e) = &self.refused {
            if !matches!(c, Ctl::Stats | Ctl::Scrub(_)) {
                return Err(StorageError::Corrupt(e.msg.clone()));
            }
        }
        match c {
            Ctl::PoolCreate { pool, scm, nvme } => {
                if let Some(p) = self.index.pools.get(&pool) {
                    if p.scm_total == scm && p.nvme_total == nvme {
                        return Ok(CtlOut::Created(false));
                    }
                    return Err(StorageError::Exists(format!(
                        "pool {pool} already exists on target {} with scm {} / nvme {} bytes per target (asked {scm} / {nvme})",
                        self.id, p.scm_total, p.nvme_total
                    )));
                }
                let (nvme_free, scm_free) = self.unreserved();
                for (tier, need, free) in [("scm", scm, scm_free), ("nvme", nvme, nvme_free)] {
                    if need > free {
                        return Err(StorageError::NoSpace {
                            pool: pool.to_string(),
                            tier,
                            target: self.id,
                            need,
                            free,
                        });
                    }
                }
                self.commit_ctl(WalOp::PoolCreate { pool, scm, nvme })?;
                Ok(CtlOut::Created(true))
            }
            Ctl::PoolDestroy { pool } => {
                if self.index.pools.contains_key(&pool) {
                    self.commit_ctl(WalOp::PoolDestroy { pool })?;
                    self.dirty.remove(&pool);
                }
                Ok(CtlOut::Done)
            }
            Ctl::PoolSpace { pool } => {
                let p = self
                    .index
                    .pools
                    .get(&pool)
                    .ok_or_else(|| self.pool_missing(&pool))?;
                // Changes held by transactions take their space until decided.
                let (hs, hn) = self.index.dtx.held_space(&pool);
                Ok(CtlOut::Space(PoolSpace {
                    scm_total: p.scm_total,
                    scm_free: p.scm_total.saturating_sub(p.scm_used() + hs),
                    nvme_total: p.nvme_total,
                    nvme_free: p.nvme_total.saturating_sub(p.nvme_used() + hn),
                    cont_used: p
                        .conts
                        .iter()
                        .map(|(k, c)| (*k, c.scm_used + c.nvme_used))
                        .collect(),
                }))
            }
            Ctl::Pools => Ok(CtlOut::Pools(self.index.pools.keys().copied().collect())),
            Ctl::ContDestroy { pool, cont } => {
                let p = self
                    .index
                    .pools
                    .get(&pool)
                    .ok_or_else(|| self.pool_missing(&pool))?;
                if p.conts.contains_key(&cont) || self.index.dtx.holds_cont(&pool, &cont) {
                    self.commit_ctl(WalOp::ContDestroy { pool, cont })?;
                }
                Ok(CtlOut::Done)
            }
            Ctl::SetSnapshots {
                pool,
                cont,
                epochs,
                adding,
            } => {
                let Some(p) = self.index.pools.get(&pool) else {
                    return Err(self.pool_missing(&pool));
                };
                let known = p.conts.get(&cont).map_or(&[][..], |c| &c.snapshots[..]);
                let to = self.index.aggregated_to;
                if let Some(e) = adding.filter(|e| *e <= to && !known.contains(e)) {
                    return Err(StorageError::Retry(format!(
                        "snapshot of container {cont} at epoch {e}: target {} already aggregated pool {pool} up to epoch {to}, past it; take the snapshot at a newer epoch",
                        self.id
                    )));
                }
                if let Some(e) = epochs.iter().find(|e| **e <= to && !known.contains(e)) {
                    // A list re-sent (to an engine that was away): keep what is left.
                    tracing::warn!(target = self.id, %pool, %cont, epoch = e, aggregated_to = to, "snapshot learnt after an aggregation past its epoch; versions only it would read may be gone");
                }
                self.commit_ctl(WalOp::SetSnapshots { pool, cont, epochs })?;
                self.dirty.insert(pool);
                Ok(CtlOut::Done)
            }
            Ctl::Aggregate { pool } => {
                if !self.index.pools.contains_key(&pool) {
                    return Err(self.pool_missing(&pool));
                }
                let rel = self.aggregate(pool)?;
                self.dirty.remove(&pool);
                Ok(CtlOut::Reclaimed(rel.scm + rel.nvme))
            }
            Ctl::DeviceSpace => {
                let (nvme_free, scm_free) = self.unreserved();
                Ok(CtlOut::Device([
                    self.sb.data_bytes,
                    nvme_free,
                    self.scm_budget,
                    scm_free,
                ]))
            }
            Ctl::SetQuota {
                pool,
                cont,
                version,
                quota,
            } => {
                let newest = self.quota_versions.entry((pool, cont)).or_insert(0);
                if version < *newest {
                    return Ok(CtlOut::Done);
                }
                *newest = version;
                match quota {
                    Some(q) => self.quotas.insert((pool, cont), q),
                    None => self.quotas.remove(&(pool, cont)),
                };
                // A full container gets back what its overwrites and
                // removals freed now, not when the target is next idle.
                if self.check_quota(&pool, &cont, 1).is_err() && self.dirty.remove(&pool) {
                    self.auto_aggregate(pool, "quota reached");
                }
                Ok(CtlOut::Done)
            }
            Ctl::Scrub(rate) => {
                if let Some(r) = rate {
                    self.scrub.set_rate(r);
                }
                Ok(CtlOut::Scrub(self.scrub.report.clone()))
            }
            Ctl::Stats => Ok(CtlOut::Stats(crate::TargetStats {
                seq: self.seq,
                durable: self.durable,
                flushes: self.prof.flushes,
                wal_tail: self.wal_tail,
                checkpoints: self.checkpoints,
                free_blocks: self.alloc.free_blocks(),
            })),
        }
    }
}

/// Check a completed device read of a fetch against its chunk checksums;
/// returns the part the caller asked for: (iod, offset in the iod's bytes,
/// offset in the piece, length), or nothing if the iod or its fetch failed.
fn absorb_piece(
    id: u32,
    chunk: u64,
    plans: &mut [Result<Vec<IodRead>, Errno>],
    dst: PieceDst,
    res: std::io::Result<&[u8]>,
) -> Option<(usize, u64, usize, usize)> {
    let Ok(iods) = &mut plans[dst.fetch] else {
        return None;
    };
    let r = &mut iods[dst.iod];
    let s = &r.segs[dst.seg];
    let Src::Dev { ext, value_off, .. } = &s.src else {
        return None;
    };
    let bytes = match res {
        Ok(b) => b,
        Err(e) => {
            let e = Errno::new(
                -libc::EIO,
                format!("target {id}: read block {}: {e}", ext.block),
            );
            plans[dst.fetch] = Err(e);
            return None;
        }
    };
    let ps = dst.start;
    let c0 = (ps / chunk) as usize;
    for (i, b) in bytes.chunks(chunk as usize).enumerate() {
        let c = c0 + i;
        if ext.csums.get(c).copied() != Some(peregrine_isal::crc32c(b)) {
            r.bad.get_or_insert(Errno::new(
                -peregrine_proto::CSUM_ERRNO,
                format!(
                    "target {id}: checksum mismatch in chunk {c} ({chunk} bytes) of the extent at data block {} (device corruption)",
                    ext.block
                ),
            ));
            return None;
        }
    }
    // The part of the piece the caller asked for.
    let (from, to) = (
        ps.max(*value_off),
        (ps + bytes.len() as u64).min(value_off + s.len),
    );
    (from < to).then(|| {
        (
            dst.iod,
            s.out_off + from - value_off,
            (from - ps) as usize,
            (to - from) as usize,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BdevClass, BdevSpec, ScanState, StorageOptions};

    const MIB: u64 = 1 << 20;

    fn addr(pool: Uuid) -> Option<data::Address> {
        Some(data::Address {
            pool: pool.as_bytes().to_vec(),
            cont: Uuid::nil().as_bytes().to_vec(),
            oid: Some(data::ObjectId { hi: 1, lo: 2 }),
            shard: 0,
            target: 0,
            map_version: 1,
            ..Default::default()
        })
    }

    fn iod(len: u64) -> data::Iod {
        data::Iod {
            akey: b"v".to_vec(),
            kind: data::ValueKind::Single as i32,
            len,
            ..Default::default()
        }
    }

    fn update(pool: Uuid, byte: u8, len: usize) -> Request {
        let u = data::UpdateReq {
            addr: addr(pool),
            epoch: 1,
            dkey: b"d".to_vec(),
            iods: vec![iod(len as u64)],
            insert_only: false,
            sync: false,
            dtx: None,
            conditions: Vec::new(),
        };
        Request::Update(u, vec![byte; len].into())
    }

    fn open_target(dir: &std::path::Path) -> (Target, Uuid) {
        let opts = StorageOptions {
            bdev: BdevSpec {
                class: BdevClass::File,
                path: dir.join("nvme.img"),
                size: 64 * MIB,
            },
            scm_bytes: 16 * MIB,
            targets: 1,
            hugepages: false,
            flush_interval: crate::DEFAULT_FLUSH_INTERVAL,
            poll: crate::DEFAULT_POLL,
            read_spin: crate::DEFAULT_READ_SPIN,
            scrub_rate: crate::DEFAULT_SCRUB_RATE,
        };
        crate::format(&opts, "t", 0, false).unwrap();
        let ScanState::Formatted(sb) = crate::scan(&opts.bdev).unwrap() else {
            panic!("not formatted")
        };
        let mut t = Target::open(
            sb,
            &opts,
            0,
            8 * MIB,
            Default::default(),
            Default::default(),
        )
        .unwrap();
        let pool = Uuid::new_v4();
        t.control(Ctl::PoolCreate {
            pool,
            scm: 4 * MIB,
            nvme: 32 * MIB,
        })
        .unwrap();
        (t, pool)
    }

    /// A fetch whose bytes are whole chunks of one extent is read from the
    /// device straight into its source's area (the reply says so and
    /// carries no bytes); any other fetch that offers an area is served from
    /// the target's buffers as usual, with the same bytes.
    #[test]
    fn aligned_fetches_are_read_straight_into_the_reply_area() {
        let dir = tempfile::tempdir().unwrap();
        let (mut t, pool) = open_target(dir.path());
        let len = (3 * MIB + 5000) as usize; // pieces of 2 MiB and a short chunk at the end
        let value: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let u = data::UpdateReq {
            addr: addr(pool),
            epoch: 1,
            dkey: b"d".to_vec(),
            iods: vec![data::Iod {
                kind: data::ValueKind::Array as i32,
                len: len as u64,
                crc: peregrine_isal::crc32c(&value),
                has_crc: true,
                ..iod(0)
            }],
            insert_only: false,
            sync: false,
            dtx: None,
            conditions: Vec::new(),
        };
        let u = Request::Update(u, value.clone().into());
        t.handle(u, Responder(None));
        t.drain();

        let layout = std::alloc::Layout::from_size_align(8 * MIB as usize, 4096).unwrap();
        // SAFETY: a zeroed allocation, freed at the end of the test.
        let area = unsafe { std::alloc::alloc_zeroed(layout) };
        let fetch = |off: u64, n: u64| {
            let (tx, rx) = std::sync::mpsc::channel();
            let f = data::FetchReq {
                addr: addr(pool),
                epoch: u64::MAX,
                dkey: b"d".to_vec(),
                iods: vec![data::Iod {
                    kind: data::ValueKind::Array as i32,
                    offset: off,
                    len: n,
                    ..iod(0)
                }],
            };
            (f, tx, rx)
        };
        for (off, n, direct) in [
            (0, len as u64, true),
            (2 * MIB, MIB, true),
            (4096, 100, true),
            (100, 4096, false),
            (len as u64 - 10, 20, false), // past the end: zeros follow
        ] {
            let (f, tx, rx) = fetch(off, n);
            let reply = Responder(Some(Box::new(move |r: crate::ReplyRef<'_>| {
                let (resp, g) = r.unwrap();
                let bytes = (!g.is_in_place()).then(|| g.into_vec());
                tx.send((resp, bytes)).unwrap();
            })));
            let area_len = 8 * MIB as usize;
            t.queued.push((
                f,
                reply,
                Some(ReplyArea {
                    addr: area as usize,
                    len: area_len,
                }),
            ));
            t.drain();
            let (resp, bytes) = rx.recv().unwrap();
            assert_eq!(
                bytes.is_none(),
                direct,
                "fetch {off}+{n}: read into the area"
            );
            let Some(data::response::Body::Fetch(fr)) = resp.body else {
                panic!("{resp:?}")
            };
            let mut want = vec![0u8; n as usize];
            let have = value.len().saturating_sub(off as usize).min(n as usize);
            want[..have].copy_from_slice(&value[off as usize..off as usize + have]);
            let got = match bytes {
                None => {
                    // SAFETY: the area holds at least n bytes, written by the device.
                    unsafe { std::slice::from_raw_parts(area, n as usize) }.to_vec()
                }
                Some(b) => b,
            };
            assert_eq!(fr.values[0].status, 0);
            assert!(got == want, "bytes of fetch {off}+{n}");
            assert_eq!(
                fr.values[0].crc,
                peregrine_isal::crc32c(&want),
                "crc of {off}+{n}"
            );
            assert!(
                t.dev.regions_idle(),
                "fetch {off}+{n}: every region given back"
            );
        }
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(area, layout) };
    }

    /// Deterministic form of tests/pipeline.rs: an overwrite applied while a
    /// fetch's read of the old value is in flight (not reaped) does not give
    /// the old blocks back to the allocator until that fetch is done.
    #[test]
    fn blocks_freed_under_a_read_in_flight_wait_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut t, pool) = open_target(dir.path());
        let len = 64 << 10;
        let blocks = (len as u64) / BLOCK;
        t.handle(update(pool, 1, len), Responder(None));
        t.drain();
        let free = t.alloc.free_blocks();

        let (rtx, rrx) = std::sync::mpsc::channel();
        let fetch = data::FetchReq {
            addr: addr(pool),
            epoch: u64::MAX,
            dkey: b"d".to_vec(),
            iods: vec![iod(len as u64)],
        };
        let reply = Responder(Some(Box::new(move |r: crate::ReplyRef<'_>| {
            rtx.send(r.map(|(resp, bulk)| (resp, bulk.into_vec())))
                .unwrap()
        })));
        t.queued.push((fetch, reply, None));
        t.start_fetches();
        assert_eq!(t.fetch_jobs.len(), 1, "the fetch is in flight");

        // The same epoch: the new value replaces the old one and frees its blocks.
        t.handle(update(pool, 2, len), Responder(None));
        for op in std::mem::take(&mut t.open.ops) {
            t.apply(op, t.seq + 1);
        }
        // As if a flushed record said that one was flushed.
        t.settled = t.seq + 1;
        t.settle();
        assert_eq!(
            t.alloc.free_blocks(),
            free - blocks,
            "the old value's blocks must stay taken while the read is in flight"
        );
        t.drain();
        assert_eq!(
            t.alloc.free_blocks(),
            free,
            "released once the fetch is done"
        );
        let (_, bytes) = rrx.recv().unwrap().unwrap();
        assert_eq!(bytes, vec![1u8; len], "the fetch read the old value");
    }

    /// A large value goes to the device piece by piece while it is copied
    /// in, before its checksum has been checked. When the check then fails,
    /// the update is refused, and its blocks stay taken until those writes
    /// are done (no later value is written to a block with a write in flight).
    #[test]
    fn blocks_written_ahead_for_a_refused_update_wait_for_those_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (mut t, pool) = open_target(dir.path());
        let free = t.alloc.free_blocks();
        let len = MIB as usize;
        let Request::Update(mut u, bulk) = update(pool, 3, len) else {
            unreachable!()
        };
        u.iods[0].has_crc = true;
        u.iods[0].crc = peregrine_isal::crc32c(&vec![3u8; len]) ^ 1;
        let (tx, rx) = std::sync::mpsc::channel();
        let reply = Responder(Some(Box::new(move |r: crate::ReplyRef<'_>| {
            tx.send(r.map(|_| ())).unwrap()
        })));
        t.handle(Request::Update(u, bulk), reply);
        let e = rx.try_recv().expect("answered at once").unwrap_err();
        assert_eq!(e.code, -peregrine_proto::CSUM_ERRNO, "{e}");
        assert_eq!(
            t.ahead.len(),
            len / WRITE_PIECE,
            "every piece was started ahead"
        );
        assert_eq!(
            t.alloc.free_blocks(),
            free - MIB / BLOCK,
            "the blocks stay taken while writes to them are in flight"
        );
        t.drain();
        assert!(t.ahead.is_empty() && t.orphans.is_empty());
        assert_eq!(t.alloc.free_blocks(), free, "given back once they are done");
        // Nothing was committed, and the target carries on.
        assert!(t.commits.is_empty() && t.open.ops.is_empty());
        t.handle(update(pool, 4, len), Responder(None));
        t.drain();
        assert_eq!(t.alloc.free_blocks(), free - MIB / BLOCK);
    }
}
