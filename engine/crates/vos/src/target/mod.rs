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
    value_scm, DevRun, NewValue, ObjKey, Payload, Released, Seg, Src, TargetIndex, WalOp,
};
use crate::request::{Address, Answer, PoolAddress};
use crate::superblock::{Superblock, BLOCK};
use crate::wal::{self, CKPT_MAGIC, WAL_MAGIC};
use crate::{Bulk, Gather, Polled, PoolSpace, Reply, ReplyArea, Request, Responder, Source};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use peregrine_isal::Crc32cShift;
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

mod aggregate;
mod checkpoint;
mod commit;
mod control;
mod event_loop;
mod fetch;
mod flush;
mod list;
mod replay;
mod request;
mod scrub;
#[cfg(test)]
mod tests;
mod update;

use aggregate::Fruitless;
use commit::{release_staged, staged_bytes, AheadWrite, Commits, Staged, Wal};
use control::Quotas;
use fetch::{absorb_piece, area_bytes, release_reads, Fetches, Piece, ReadInto};
use flush::{stamp_of, Flush};
use update::blocks_wanted;

pub use control::{ContQuota, QuotaShare};
pub(crate) use control::{Ctl, CtlOut};
use event_loop::Polling;
pub(crate) use event_loop::{mailbox, Mailbox, Msg};
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

pub(crate) struct Target {
    id: u32,
    sb: Superblock,
    dev: DeviceIo,
    index: TargetIndex,
    alloc: BlockAlloc,
    scm_budget: u64,
    /// Pools changed since their last aggregation.
    dirty: BTreeSet<Uuid>,
    /// Pools with values removed since their last aggregation.
    removed: BTreeSet<Uuid>,
    /// Bytes of value per data checksum (the device's format).
    chunk: u64,
    /// Values at least this large go to data blocks ([`crate::StorageOptions::scm_value_max`]).
    scm_value_max: usize,
    prof: Prof,
    /// What the engine's metrics read without asking ([`crate::counters`]).
    pub(crate) counters: Arc<crate::TargetCounters>,
    published: crate::counters::Published,
    /// Tag of the next job started on the device (increasing).
    next_tag: u64,
    /// Set by a failed device write: updates are refused from then on.
    broken: Option<Errno>,
    /// Set by replay finding acknowledged state damaged: every request is
    /// refused (see [`replay`]).
    refused: Option<Errno>,
    /// Verifies stored extents while the target is idle ([`scrub`]).
    scrub: scrub::Scrubber,
    /// Why updates are refused, for whoever asks the storage (no queue hop).
    fault: Arc<parking_lot::Mutex<Option<String>>>,
    /// Whether it may aggregate on its own ([`crate::AggregationLease`]).
    lease: Arc<crate::AggregationLease>,
    /// The WAL and the checkpoints ([`commit`], [`checkpoint`]).
    wal: Wal,
    /// Flushes, and the blocks freed that wait for one ([`flush`]).
    flush: Flush,
    /// The open batch and the commits in flight ([`commit`]).
    commit: Commits,
    /// Fetches queued and in flight ([`fetch`]).
    fetch: Fetches,
    /// Containers' quotas ([`control`], [`update`]).
    quota: Quotas,
    /// Pools whose last aggregation to make room gave nothing back
    /// ([`Target::aggregate_for_room`]).
    fruitless: HashMap<Uuid, Fruitless>,
    /// Sources polled besides the queue ([`event_loop`]).
    polling: Polling,
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
        let wal = sb.wal_offset(id)..sb.wal_offset(id) + sb.wal_bytes;
        let cached = (opts.wal_io == crate::WalIo::PageCache).then_some(wal);
        let mut dev = DeviceIo::open(path, opts.hugepages, id, cached).map_err(|e| {
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
            scm_budget,
            dirty: BTreeSet::new(),
            removed: BTreeSet::new(),
            chunk: 0,
            scm_value_max: opts.scm_value_max.clamp(1, crate::SCM_VALUE_MAX),
            prof: Prof::default(),
            counters: Default::default(),
            published: Default::default(),
            next_tag: 0,
            broken: None,
            refused: None,
            scrub: scrub::Scrubber::new(opts.scrub_rate),
            fault,
            lease,
            wal: Wal::new(match opts.wal_io {
                crate::WalIo::PageCache => wal::Layout::Packed,
                crate::WalIo::Direct => wal::Layout::Blocks,
            }),
            flush: Flush::new(opts.flush_interval),
            commit: Commits::default(),
            fetch: Fetches::default(),
            quota: Quotas::default(),
            fruitless: HashMap::new(),
            polling: Polling {
                sources: Vec::new(),
                poll: opts.poll,
                until: None,
                last_request: Instant::now(),
            },
        };
        t.chunk = t.sb.csum_chunk();
        match t.replay() {
            Ok(()) => t.flush.last_real = t.flush.stamped,
            Err(replay::ReplayError::Storage(e)) => return Err(e),
            Err(replay::ReplayError::Damaged(msg)) => t.refuse(msg),
        }
        if !t.wal.tail.is_multiple_of(BLOCK)
            && t.wal.layout == wal::Layout::Blocks
            && t.refused.is_none()
        {
            // The WAL was packed (it went through the page cache) and now
            // goes O_DIRECT, whose records start on a block: the next one
            // cannot follow the last where replay would look for it, so
            // the WAL restarts after a checkpoint first.
            t.checkpoint()?;
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
        (
            self.wal.seq,
            self.wal.seq_started,
            self.flush.durable,
            self.wal.tail,
        ) = (0, 0, 0, 0);
        *self.fault.lock() = Some(msg.clone());
        self.refused = Some(Errno::new(-libc::EIO, msg));
    }

    fn io_err(&self, what: &str, e: std::io::Error) -> StorageError {
        StorageError::io(format!("target {}: {what}", self.id), e)
    }

    fn data_off(&self, block: u64) -> u64 {
        self.sb.data_offset(self.id) + block * BLOCK
    }
}
