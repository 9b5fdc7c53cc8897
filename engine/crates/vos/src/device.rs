//! Device I/O of one target: its own file descriptor (O_DIRECT), its own
//! io_uring ring and its own registered buffer pool; with
//! [`crate::WalIo::PageCache`] also a buffered descriptor for its WAL,
//! whose writes are plain system calls (see [`DeviceIo::start`]).
//!
//! All offsets and lengths handed to the device are multiples of 4 KiB, as
//! O_DIRECT requires; callers pad values to whole blocks.
//!
//! Every call submits all its operations at once and waits for all of them:
//! reads are packed into the registered buffers ([`DeviceIo::read_many`]),
//! writes may be chained with a trailing fdatasync ([`DeviceIo::write`]).
//! A lone read (a QD1 fetch) polls for its completion for up to
//! [`crate::StorageOptions::read_spin`] (default 150 µs; 0 disables) before
//! sleeping in the kernel: one wake-up less on the latency path, for at most
//! that much CPU time per read.

use crate::bufpool::{BufPool, BUF_BYTES};
use crate::superblock::BLOCK;
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::Path;

/// Buffers per target (32 MiB): enough to keep a batch of 1 MiB updates, or
/// hundreds of small reads, in flight at once.
const BUFS_PER_TARGET: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum OpKind {
    Read,
    Write,
    Sync,
}

/// One device operation on `len` bytes at `buf_off` inside registered buffer
/// `buf`, or (a read with `into` set) at address `into`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) off: u64,
    pub(crate) len: usize,
    pub(crate) buf: usize,
    pub(crate) buf_off: usize,
    /// IOSQE_IO_LINK: the next op starts only after this one succeeded.
    pub(crate) link: bool,
    /// A read into memory outside the registered buffers (a client's reply
    /// area), 4 KiB-aligned, that stays mapped until the read completes.
    pub(crate) into: Option<usize>,
}

impl Op {
    pub(crate) fn read(off: u64, (buf, buf_off, len): (usize, usize, usize)) -> Op {
        Op {
            kind: OpKind::Read,
            off,
            len,
            buf,
            buf_off,
            link: false,
            into: None,
        }
    }

    /// A read of `len` bytes into the memory at `addr` (see [`Op::into`]).
    pub(crate) fn read_into(off: u64, addr: usize, len: usize) -> Op {
        Op {
            into: Some(addr),
            ..Op::read(off, (0, 0, len))
        }
    }

    /// The memory a read lands in, when it is not a registered buffer.
    fn target_slice(&self) -> Option<&'static mut [u8]> {
        // SAFETY: `into` is set only by `read_into`, whose caller keeps the
        // memory mapped and untouched by itself until the read completes.
        self.into
            .map(|a| unsafe { std::slice::from_raw_parts_mut(a as *mut u8, self.len) })
    }

    pub(crate) fn write(off: u64, (buf, buf_off, len): (usize, usize, usize)) -> Op {
        Op {
            kind: OpKind::Write,
            ..Op::read(off, (buf, buf_off, len))
        }
    }

    pub(crate) fn sync() -> Op {
        Op {
            kind: OpKind::Sync,
            off: 0,
            len: 0,
            buf: 0,
            buf_off: 0,
            link: false,
            into: None,
        }
    }
}

pub(crate) struct DeviceIo {
    file: File,
    /// The WAL's byte range on the device and a descriptor of the device
    /// without O_DIRECT, when the WAL goes through the page cache
    /// ([`crate::WalIo::PageCache`]): reads and writes inside the range use
    /// it (so replay reads what the kernel holds); an fdatasync on either
    /// descriptor flushes the file's dirty pages too.
    cached: Option<(File, Range<u64>)>,
    ring: Option<IoUring>,
    bufs: BufPool,
    /// Buffers registered with the ring (ReadFixed/WriteFixed usable).
    fixed: bool,
    arena: Arena,
    /// Operations started with [`DeviceIo::start`] and not reaped yet, by user_data.
    inflight: HashMap<u64, Op>,
    /// Completions of started operations not handed out yet (the no-ring
    /// fallback runs them at once and parks their outcome here).
    ready: Vec<Done>,
    /// The eventfd whose read, kept in the ring, ends [`DeviceIo::wait`]
    /// when a request arrives, and the 8 bytes that read lands in.
    wake: Option<(RawFd, Box<[u8; 8]>)>,
    wake_armed: bool,
    /// How long a lone read polls for its completion before sleeping
    /// ([`crate::StorageOptions::read_spin`]; zero: never polls).
    pub(crate) spin: std::time::Duration,
}

/// The outcome of one operation started with [`DeviceIo::start`].
pub(crate) struct Done {
    pub(crate) tag: u64,
    pub(crate) idx: usize,
    pub(crate) res: io::Result<()>,
}

/// user_data of the wake-up read (job tags stay below it).
const WAKE: u64 = u64::MAX;
/// Bits of user_data that hold an op's index inside its job.
const IDX_BITS: u32 = 20;

/// The registered buffers handed out as regions to operations in flight:
/// a bump allocator per buffer, a buffer reused once every region in it is
/// released. Regions never cross buffers (ReadFixed/WriteFixed address one).
struct Arena {
    fill: Vec<usize>,
    users: Vec<u32>,
    cur: usize,
}

impl Arena {
    fn new(count: usize) -> Arena {
        Arena {
            fill: vec![0; count],
            users: vec![0; count],
            cur: 0,
        }
    }

    fn alloc(&mut self, len: usize) -> Option<(usize, usize)> {
        let padded = len.div_ceil(BLOCK as usize) * BLOCK as usize;
        if padded > BUF_BYTES {
            return None;
        }
        if self.fill[self.cur] + padded > BUF_BYTES {
            self.cur = self.users.iter().position(|&u| u == 0)?;
            self.fill[self.cur] = 0;
        }
        let off = self.fill[self.cur];
        self.fill[self.cur] += padded;
        self.users[self.cur] += 1;
        Some((self.cur, off))
    }

    fn share(&mut self, buf: usize) {
        self.users[buf] += 1;
    }

    fn release(&mut self, buf: usize) {
        self.users[buf] -= 1;
        if self.users[buf] == 0 {
            self.fill[buf] = 0;
        }
    }

    fn idle(&self) -> bool {
        self.users.iter().all(|&u| u == 0)
    }
}

/// The descriptor `op` goes through: the cached one inside the cached
/// range, else the O_DIRECT one (also for an fdatasync).
fn file_for<'a>(direct: &'a File, cached: &'a Option<(File, Range<u64>)>, op: &Op) -> &'a File {
    match cached {
        Some((f, r)) if op.kind != OpKind::Sync && r.contains(&op.off) => f,
        _ => direct,
    }
}

/// Open a device for a target with O_DIRECT, falling back (with a warning)
/// only when the filesystem refuses O_DIRECT (tmpfs).
pub(crate) fn open_direct(path: &Path, target: u32) -> io::Result<File> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok(f),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(target, device = %path.display(), "filesystem refuses O_DIRECT; using buffered I/O (durability still by fdatasync)");
            OpenOptions::new().read(true).write(true).open(path)
        }
        Err(e) => Err(e),
    }
}

impl DeviceIo {
    /// Open the device for target `target`; with `cached_range`, I/O in
    /// that byte range (the target's WAL) goes through the page cache.
    pub(crate) fn open(
        path: &Path,
        hugepages: bool,
        target: u32,
        cached_range: Option<Range<u64>>,
    ) -> io::Result<DeviceIo> {
        let file = open_direct(path, target)?;
        let cached = match cached_range {
            Some(r) => Some((OpenOptions::new().read(true).write(true).open(path)?, r)),
            None => None,
        };
        let bufs = BufPool::new(BUFS_PER_TARGET, hugepages, target)?;
        let ring = match IoUring::new(256) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(target, error = %e, "io_uring unavailable; using pread/pwrite");
                None
            }
        };
        let mut fixed = false;
        if let Some(r) = &ring {
            // Safety: the buffers live as long as `self` and the ring is dropped first (field order).
            match unsafe { r.submitter().register_buffers(&bufs.iovecs()) } {
                Ok(()) => fixed = true,
                Err(e) => {
                    tracing::warn!(target, error = %e, "register_buffers failed; using unregistered buffers")
                }
            }
        }
        Ok(DeviceIo {
            file,
            cached,
            ring,
            arena: Arena::new(bufs.count()),
            bufs,
            fixed,
            inflight: HashMap::new(),
            ready: Vec::new(),
            wake: None,
            wake_armed: false,
            spin: crate::DEFAULT_READ_SPIN,
        })
    }

    fn sqe(&self, op: &Op) -> squeue::Entry {
        let fd = types::Fd(file_for(&self.file, &self.cached, op).as_raw_fd());
        let sqe = match op.kind {
            OpKind::Sync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            OpKind::Read if op.into.is_some() => {
                let at = op.into.expect("checked") as *mut u8;
                opcode::Read::new(fd, at, op.len as u32)
                    .offset(op.off)
                    .build()
            }
            OpKind::Write | OpKind::Read => {
                debug_assert!(op.buf_off + op.len <= BUF_BYTES);
                // SAFETY: `op.buf_off + op.len <= BUF_BYTES`: still inside buffer `op.buf`.
                let buf = unsafe { self.bufs.ptr(op.buf).add(op.buf_off) };
                let (len, idx) = (op.len as u32, op.buf as u16);
                match (op.kind == OpKind::Write, self.fixed) {
                    (true, true) => opcode::WriteFixed::new(fd, buf, len, idx)
                        .offset(op.off)
                        .build(),
                    (true, false) => opcode::Write::new(fd, buf, len).offset(op.off).build(),
                    (false, true) => opcode::ReadFixed::new(fd, buf, len, idx)
                        .offset(op.off)
                        .build(),
                    (false, false) => opcode::Read::new(fd, buf, len).offset(op.off).build(),
                }
            }
        };
        if op.link {
            sqe.flags(squeue::Flags::IO_LINK)
        } else {
            sqe
        }
    }

    /// The outcome of `op` from its completion's result. A short transfer
    /// is finished with plain system calls: it either completes or yields
    /// the real error (e.g. ENOSPC from a full host file system).
    fn outcome(&mut self, op: &Op, res: i32) -> io::Result<()> {
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        let done = res as usize;
        if op.kind == OpKind::Sync || done == op.len {
            return Ok(());
        }
        let (b, from, to) = (op.buf, op.buf_off + done, op.buf_off + op.len);
        let at = op.off + done as u64;
        let file = file_for(&self.file, &self.cached, op);
        let r = match (op.kind, op.target_slice()) {
            (OpKind::Write, _) => file.write_all_at(&self.bufs.slice(b)[from..to], at),
            (_, Some(t)) => file.read_exact_at(&mut t[done..], at),
            _ => file.read_exact_at(&mut self.bufs.slice_mut(b)[from..to], at),
        };
        r.map_err(|e| {
            let what = if op.kind == OpKind::Write {
                "write"
            } else {
                "read"
            };
            io::Error::new(
                e.kind(),
                format!(
                    "{what} at offset {}: {e} after {done} of {} bytes",
                    op.off, op.len
                ),
            )
        })
    }

    /// Run ops one after the other with plain system calls (no io_uring):
    /// as with io_uring, the rest of a failed link chain is cancelled.
    fn run_plain(&mut self, ops: &[Op]) -> Vec<io::Result<()>> {
        let mut failed = false;
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            if failed {
                out.push(Err(io::Error::from_raw_os_error(libc::ECANCELED)));
                failed = op.link;
                continue;
            }
            let (b, o, l) = (op.buf, op.buf_off, op.len);
            let file = file_for(&self.file, &self.cached, op);
            let r = match (op.kind, op.target_slice()) {
                (OpKind::Sync, _) => file.sync_data(),
                (OpKind::Write, _) => file.write_all_at(&self.bufs.slice(b)[o..o + l], op.off),
                (OpKind::Read, Some(t)) => file.read_exact_at(t, op.off),
                (OpKind::Read, None) => {
                    file.read_exact_at(&mut self.bufs.slice_mut(b)[o..o + l], op.off)
                }
            };
            failed = r.is_err() && op.link;
            out.push(r);
        }
        out
    }

    /// Run prepared operations, all submitted at once, and wait for them;
    /// returns each op's outcome. An `Err` of the outer result means the
    /// ring itself failed. Only while nothing started with
    /// [`DeviceIo::start`] is in flight (their buffers are the same).
    fn run(&mut self, ops: &[Op]) -> io::Result<Vec<io::Result<()>>> {
        assert!(
            self.inflight.is_empty(),
            "blocking device I/O while started operations are in flight"
        );
        if self.ring.is_none() {
            return Ok(self.run_plain(ops));
        }
        let sqes: Vec<squeue::Entry> = ops
            .iter()
            .enumerate()
            .map(|(i, op)| self.sqe(op).user_data(i as u64))
            .collect();
        let mut res = vec![0i32; ops.len()];
        let mut woken = false;
        let ring = self.ring.as_mut().expect("ring");
        for sqe in &sqes {
            // Safety: the buffers stay valid until the completions are reaped below.
            unsafe { ring.submission().push(sqe) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        let spin = self.spin;
        if !spin.is_zero() && ops.len() == 1 && ops[0].kind == OpKind::Read {
            // A lone read (QD1): poll its completion for a short while
            // rather than sleep, saving a wake-up on the way back.
            ring.submit()?;
            let t = std::time::Instant::now();
            while ring.completion().is_empty() && t.elapsed() < spin {
                std::hint::spin_loop();
            }
        } else {
            ring.submit()?;
        }
        let mut reaped = 0;
        while reaped < ops.len() {
            let mut any = false;
            for cqe in ring.completion() {
                if cqe.user_data() == WAKE {
                    woken = true;
                    continue;
                }
                any = true;
                reaped += 1;
                res[cqe.user_data() as usize] = cqe.result();
            }
            if !any && reaped < ops.len() {
                ring.submit_and_wait(1)?;
            }
        }
        if woken {
            self.wake_armed = false;
            self.arm_wake()?;
        }
        Ok(ops
            .iter()
            .zip(res)
            .map(|(op, r)| self.outcome(op, r))
            .collect())
    }

    /// Take a region of `len` bytes (rounded up to whole blocks) of the
    /// registered buffers for an operation to start; None when the buffers
    /// are taken (try again after completions) or `len` exceeds a buffer.
    pub(crate) fn region(&mut self, len: usize) -> Option<(usize, usize, usize)> {
        let padded = len.div_ceil(BLOCK as usize) * BLOCK as usize;
        self.arena.alloc(len).map(|(buf, off)| (buf, off, padded))
    }

    /// A region of `bytes.len()` bytes holding `bytes`, zero-padded to whole blocks.
    pub(crate) fn region_with(&mut self, bytes: &[u8]) -> Option<(usize, usize, usize)> {
        let (buf, off, padded) = self.region(bytes.len())?;
        let b = &mut self.bufs.slice_mut(buf)[off..off + padded];
        b[..bytes.len()].copy_from_slice(bytes);
        b[bytes.len()..].fill(0);
        Some((buf, off, padded))
    }

    /// Give back a region taken with [`DeviceIo::region`] (or shared with [`DeviceIo::share`]).
    pub(crate) fn release(&mut self, buf: usize) {
        self.arena.release(buf)
    }

    /// Take one more hold on the buffer of a region already taken: the
    /// region stays until each hold is released (several writes from it).
    pub(crate) fn share(&mut self, buf: usize) {
        self.arena.share(buf);
    }

    /// `len` bytes of a region (what a completed read brought in).
    pub(crate) fn bytes(&self, buf: usize, off: usize, len: usize) -> &[u8] {
        &self.bufs.slice(buf)[off..off + len]
    }

    /// `len` bytes of a region, to fill before a write starts from it.
    pub(crate) fn bytes_mut(&mut self, buf: usize, off: usize, len: usize) -> &mut [u8] {
        &mut self.bufs.slice_mut(buf)[off..off + len]
    }

    /// Whether no region is taken (then everything may go through the blocking calls).
    pub(crate) fn regions_idle(&self) -> bool {
        self.arena.idle()
    }

    /// Queue `ops` (their regions taken by the caller) for the next
    /// submission, without waiting; their outcomes come back from [`DeviceIo::reap`] as `Done { tag, idx }`,
    /// `idx` the op's position in `ops`.
    pub(crate) fn start(&mut self, tag: u64, ops: &[Op]) -> io::Result<()> {
        assert!(tag < WAKE >> IDX_BITS && ops.len() < 1 << IDX_BITS);
        if self.ring.is_none() {
            for (idx, res) in self.run_plain(ops).into_iter().enumerate() {
                self.ready.push(Done { tag, idx, res });
            }
            return Ok(());
        }
        // A write into the page cache takes a few microseconds as a system
        // call; through the ring the kernel hands it to a worker thread
        // (ext4 cannot take it without blocking), which costs ~45 µs.
        let mut queued = Vec::with_capacity(ops.len());
        let mut in_chain = false;
        for (i, op) in ops.iter().enumerate() {
            if !in_chain && !op.link && self.page_cache_write(op) {
                let (b, o, l) = (op.buf, op.buf_off, op.len);
                let res = file_for(&self.file, &self.cached, op)
                    .write_all_at(&self.bufs.slice(b)[o..o + l], op.off);
                self.ready.push(Done { tag, idx: i, res });
            } else {
                queued.push((i, self.sqe(op).user_data(tag << IDX_BITS | i as u64)));
            }
            in_chain = op.link;
        }
        let ring = self.ring.as_mut().expect("ring");
        let room = {
            let sq = ring.submission();
            sq.capacity() - sq.len()
        };
        if room < queued.len() {
            ring.submit()?;
        }
        for (i, sqe) in &queued {
            // Safety: the regions stay taken until the completion is reaped.
            unsafe { ring.submission().push(sqe) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            self.inflight.insert(tag << IDX_BITS | *i as u64, ops[*i]);
        }
        Ok(())
    }

    /// Whether I/O at device offset `off` goes through the page cache.
    fn buffered(&self, off: u64) -> bool {
        self.cached.as_ref().is_some_and(|(_, r)| r.contains(&off))
    }

    /// Whether `op` is a write that goes through the page cache.
    fn page_cache_write(&self, op: &Op) -> bool {
        op.kind == OpKind::Write && self.buffered(op.off)
    }

    /// Hand the operations started since the last submission to the kernel
    /// ([`DeviceIo::wait`] does too, in the same system call).
    pub(crate) fn submit(&mut self) -> io::Result<()> {
        match self.ring.as_mut() {
            Some(ring) => {
                if !ring.submission().is_empty() {
                    ring.submit()?;
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Operations started and not reaped yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.inflight.len() + self.ready.len()
    }

    /// Whether a completion is waiting to be reaped.
    pub(crate) fn completed(&mut self) -> bool {
        !self.ready.is_empty()
            || self
                .ring
                .as_mut()
                .is_some_and(|r| !r.completion().is_empty())
    }

    /// Hand out the completions that arrived (never blocks).
    pub(crate) fn reap(&mut self, out: &mut Vec<Done>) -> io::Result<()> {
        out.append(&mut self.ready);
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        let mut woken = false;
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        for (ud, res) in done {
            if ud == WAKE {
                woken = true;
                continue;
            }
            let Some(op) = self.inflight.remove(&ud) else {
                continue;
            };
            out.push(Done {
                tag: ud >> IDX_BITS,
                idx: (ud & ((1 << IDX_BITS) - 1)) as usize,
                res: self.outcome(&op, res),
            });
        }
        if woken {
            self.wake_armed = false;
        }
        self.arm_wake()
    }

    /// Keep a read of `fd` (an eventfd) in the ring, so that [`DeviceIo::wait`]
    /// also returns when someone writes to it.
    pub(crate) fn set_wake(&mut self, fd: RawFd) -> io::Result<()> {
        self.wake = Some((fd, Box::new([0; 8])));
        self.arm_wake()
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let (Some(ring), Some((fd, buf)), false) =
            (self.ring.as_mut(), self.wake.as_mut(), self.wake_armed)
        else {
            return Ok(());
        };
        let sqe = opcode::Read::new(types::Fd(*fd), buf.as_mut_ptr(), 8)
            .build()
            .user_data(WAKE);
        // Safety: the 8-byte buffer lives (boxed) as long as `self`.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        self.wake_armed = true;
        Ok(())
    }

    /// Submit what is queued, then sleep until a completion arrives (a
    /// started op, or the wake-up read), or `spin` has passed polling when
    /// given. Returns at once without a ring.
    pub(crate) fn wait(&mut self, spin: Option<std::time::Duration>) -> io::Result<()> {
        if !self.ready.is_empty() {
            return Ok(());
        }
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        if let Some(spin) = spin {
            if !ring.submission().is_empty() {
                ring.submit()?;
            }
            let t = std::time::Instant::now();
            while ring.completion().is_empty() && t.elapsed() < spin {
                std::hint::spin_loop();
            }
            return Ok(());
        }
        match ring.submit_and_wait(1) {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sleep until the wake-up eventfd `wake` is written (or a completion
    /// arrives), at most `timeout`.
    pub(crate) fn wait_idle(
        &mut self,
        wake: RawFd,
        timeout: std::time::Duration,
    ) -> io::Result<()> {
        if !self.ready.is_empty() {
            return Ok(());
        }
        let Some(ring) = self.ring.as_mut() else {
            let mut p = libc::pollfd {
                fd: wake,
                events: libc::POLLIN,
                revents: 0,
            };
            // Safety: one pollfd that lives across the call.
            let n =
                unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
            if n < 0 {
                let e = io::Error::last_os_error();
                return if e.kind() == io::ErrorKind::Interrupted {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            if n > 0 {
                let mut b = [0u8; 8];
                // Safety: reading 8 bytes into our buffer; poll said it won't block.
                unsafe { libc::read(wake, b.as_mut_ptr().cast(), 8) };
            }
            return Ok(());
        };
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        match ring.submitter().submit_with_args(1, &args) {
            Err(e)
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Most operations submitted at once (the submission queue's size).
    fn max_ops(&self) -> usize {
        self.ring
            .as_ref()
            .map_or(usize::MAX, |r| r.params().sq_entries() as usize)
    }

    /// Write each `(offset, bytes)`; offsets are block-aligned, bytes are
    /// zero-padded to whole blocks, except in the range that goes through
    /// the page cache, where they are written as they are (a packed WAL
    /// record starts and ends inside blocks). Pieces share the buffer pool, so up to
    /// `BUFS_PER_TARGET` 2 MiB writes are in flight at once. With `sync`, an
    /// fdatasync follows the writes; when everything fits the buffers at once
    /// the writes and the fdatasync go down in ONE submission, linked
    /// (IOSQE_IO_LINK) so that the fdatasync runs only after every write
    /// succeeded (and not at all if one failed).
    pub(crate) fn write(&mut self, writes: &[(u64, &[u8])], sync: bool) -> io::Result<()> {
        debug_assert!(self.arena.idle(), "blocking write while regions are taken");
        let mut pieces: Vec<(u64, &[u8])> = Vec::new();
        for &(off, data) in writes {
            debug_assert!(off % BLOCK == 0 || self.buffered(off));
            for (k, piece) in data.chunks(BUF_BYTES).enumerate() {
                pieces.push((off + (k * BUF_BYTES) as u64, piece));
            }
        }
        let per_group = self.bufs.count().min(self.max_ops() - 1);
        let groups = pieces.len().div_ceil(per_group);
        for (g, group) in pieces.chunks(per_group).enumerate() {
            let mut ops = Vec::with_capacity(group.len() + 1);
            let last = g + 1 == groups;
            for (i, &(off, piece)) in group.iter().enumerate() {
                let padded = if self.buffered(off) {
                    piece.len()
                } else {
                    piece.len().div_ceil(BLOCK as usize) * BLOCK as usize
                };
                let buf = self.bufs.slice_mut(i);
                buf[..piece.len()].copy_from_slice(piece);
                buf[piece.len()..padded].fill(0);
                ops.push(Op {
                    kind: OpKind::Write,
                    off,
                    len: padded,
                    buf: i,
                    buf_off: 0,
                    // Serial writes, then the sync, in one chain: one round trip.
                    link: sync && last,
                    into: None,
                });
            }
            if sync && last {
                ops.push(Op::sync());
            }
            for r in self.run(&ops)? {
                r?;
            }
        }
        if sync && pieces.is_empty() {
            return self.sync();
        }
        Ok(())
    }

    /// Read many block-aligned pieces (`(offset, len)`, `len <= BUF_BYTES`,
    /// rounded up to whole blocks on the device) with as many reads in flight
    /// as the registered buffers hold: pieces are packed into the buffers at
    /// 4 KiB-aligned positions (ReadFixed accepts any address inside a
    /// registered buffer) and submitted together; when the buffers are full
    /// the batch is split into groups. `done(i, bytes)` sees piece `i`'s bytes
    /// in the buffer (exactly `len` of them), or its error.
    pub(crate) fn read_many(
        &mut self,
        pieces: &[(u64, usize)],
        mut done: impl FnMut(usize, io::Result<&[u8]>),
    ) -> io::Result<()> {
        debug_assert!(self.arena.idle(), "blocking read while regions are taken");
        let max_ops = self.max_ops();
        let mut ops: Vec<Op> = Vec::new();
        let mut idx: Vec<usize> = Vec::new();
        let (mut buf, mut fill) = (0usize, 0usize);
        let mut i = 0;
        while i < pieces.len() {
            let (off, len) = pieces[i];
            debug_assert_eq!(off % BLOCK, 0);
            assert!(len <= BUF_BYTES, "read piece larger than a buffer");
            let padded = len.div_ceil(BLOCK as usize) * BLOCK as usize;
            if fill + padded > BUF_BYTES {
                buf += 1;
                fill = 0;
            }
            if buf < self.bufs.count() && ops.len() < max_ops {
                ops.push(Op {
                    kind: OpKind::Read,
                    off,
                    len: padded,
                    buf,
                    buf_off: fill,
                    link: false,
                    into: None,
                });
                idx.push(i);
                fill += padded;
                i += 1;
                if i < pieces.len() {
                    continue;
                }
            }
            // Buffers (or the queue) full, or the last piece: run the group.
            let res = self.run(&ops)?;
            for ((op, r), &pi) in ops.iter().zip(res).zip(&idx) {
                let want = pieces[pi].1;
                match r {
                    Ok(()) => done(
                        pi,
                        Ok(&self.bufs.slice(op.buf)[op.buf_off..op.buf_off + want]),
                    ),
                    Err(e) => done(pi, Err(e)),
                }
            }
            ops.clear();
            idx.clear();
            buf = 0;
            fill = 0;
        }
        Ok(())
    }

    /// Read `len` bytes at block-aligned `offset`.
    pub(crate) fn read(&mut self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        let pieces: Vec<(u64, usize)> = (0..len)
            .step_by(BUF_BYTES)
            .map(|s| (offset + s as u64, (len - s).min(BUF_BYTES)))
            .collect();
        let mut first_err = None;
        self.read_many(&pieces, |i, r| match r {
            Ok(b) => {
                let s = i * BUF_BYTES;
                out[s..s + b.len()].copy_from_slice(b);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        })?;
        first_err.map_or(Ok(out), Err)
    }

    /// Make every completed write durable (fdatasync through the ring).
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.run(&[Op::sync()])?.pop().unwrap_or(Ok(()))
    }
}
