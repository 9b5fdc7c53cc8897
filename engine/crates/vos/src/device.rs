//! Device I/O of one target: its own file descriptor (O_DIRECT), its own
//! io_uring ring and its own registered buffer pool.
//!
//! All offsets and lengths handed to the device are multiples of 4 KiB, as
//! O_DIRECT requires; callers pad values to whole blocks.
//!
//! Every call submits all its operations at once and waits for all of them:
//! reads are packed into the registered buffers ([`DeviceIo::read_many`]),
//! writes may be chained with a trailing fdatasync ([`DeviceIo::write`]).
//! A lone read (a QD1 fetch) polls for its completion for up to
//! `PEREGRINE_VOS_SPIN_US` microseconds (default 150; 0 disables) before
//! sleeping in the kernel: one wake-up less on the latency path, for at most
//! that much CPU time per read.

use crate::bufpool::{BufPool, BUF_BYTES};
use crate::superblock::BLOCK;
use io_uring::{opcode, squeue, types, IoUring};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Buffers per target (32 MiB): enough to keep a batch of 1 MiB updates, or
/// hundreds of small reads, in flight at once.
const BUFS_PER_TARGET: usize = 16;

/// Default of `PEREGRINE_VOS_SPIN_US`: how long a target polls for the
/// completion of a lone read before it sleeps (0: never polls).
const SPIN_US: u64 = 150;

fn spin_us() -> u64 {
    static C: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *C.get_or_init(|| {
        std::env::var("PEREGRINE_VOS_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(SPIN_US)
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Read,
    Write,
    Sync,
}

/// One device operation on `len` bytes at `buf_off` inside registered buffer `buf`.
struct Op {
    kind: OpKind,
    off: u64,
    len: usize,
    buf: usize,
    buf_off: usize,
    /// IOSQE_IO_LINK: the next op starts only after this one succeeded.
    link: bool,
}

impl Op {
    fn sync() -> Op {
        Op {
            kind: OpKind::Sync,
            off: 0,
            len: 0,
            buf: 0,
            buf_off: 0,
            link: false,
        }
    }
}

pub(crate) struct DeviceIo {
    file: File,
    ring: Option<IoUring>,
    bufs: BufPool,
    /// Buffers registered with the ring (ReadFixed/WriteFixed usable).
    fixed: bool,
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
    pub(crate) fn open(path: &Path, hugepages: bool, target: u32) -> io::Result<DeviceIo> {
        let file = open_direct(path, target)?;
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
            ring,
            bufs,
            fixed,
        })
    }

    /// Run prepared operations, all submitted at once; returns each op's outcome.
    /// An `Err` of the outer result means the ring itself failed.
    fn run(&mut self, ops: &[Op]) -> io::Result<Vec<io::Result<()>>> {
        let fd = self.file.as_raw_fd();
        let mut out: Vec<io::Result<()>> = (0..ops.len()).map(|_| Ok(())).collect();
        match &mut self.ring {
            Some(ring) => {
                for (i, op) in ops.iter().enumerate() {
                    let sqe = match op.kind {
                        OpKind::Sync => opcode::Fsync::new(types::Fd(fd))
                            .flags(types::FsyncFlags::DATASYNC)
                            .build(),
                        OpKind::Write | OpKind::Read => {
                            let buf = unsafe { self.bufs.ptr(op.buf).add(op.buf_off) };
                            debug_assert!(op.buf_off + op.len <= BUF_BYTES);
                            let write = op.kind == OpKind::Write;
                            match (write, self.fixed) {
                                (true, true) => opcode::WriteFixed::new(
                                    types::Fd(fd),
                                    buf,
                                    op.len as u32,
                                    op.buf as u16,
                                )
                                .offset(op.off)
                                .build(),
                                (true, false) => {
                                    opcode::Write::new(types::Fd(fd), buf, op.len as u32)
                                        .offset(op.off)
                                        .build()
                                }
                                (false, true) => opcode::ReadFixed::new(
                                    types::Fd(fd),
                                    buf,
                                    op.len as u32,
                                    op.buf as u16,
                                )
                                .offset(op.off)
                                .build(),
                                (false, false) => {
                                    opcode::Read::new(types::Fd(fd), buf, op.len as u32)
                                        .offset(op.off)
                                        .build()
                                }
                            }
                        }
                    };
                    let sqe = if op.link {
                        sqe.flags(squeue::Flags::IO_LINK)
                    } else {
                        sqe
                    };
                    // Safety: the buffer stays valid until the completion is reaped below.
                    unsafe { ring.submission().push(&sqe.user_data(i as u64)) }
                        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
                }
                let mut reaped = 0;
                let spin = spin_us();
                if spin > 0 && ops.len() == 1 && ops[0].kind == OpKind::Read {
                    // A lone read (QD1): poll its completion for a short while
                    // rather than sleep, saving a wake-up on the way back.
                    ring.submit()?;
                    let t = std::time::Instant::now();
                    while ring.completion().is_empty()
                        && t.elapsed() < std::time::Duration::from_micros(spin)
                    {
                        std::hint::spin_loop();
                    }
                } else {
                    ring.submit_and_wait(ops.len())?;
                }
                while reaped < ops.len() {
                    let mut any = false;
                    for cqe in ring.completion() {
                        any = true;
                        reaped += 1;
                        let i = cqe.user_data() as usize;
                        let op = &ops[i];
                        let res = cqe.result();
                        if res < 0 {
                            out[i] = Err(io::Error::from_raw_os_error(-res));
                        } else if op.kind != OpKind::Sync && res as usize != op.len {
                            out[i] = Err(io::Error::other(format!(
                                "short {} at offset {}: {res} of {} bytes",
                                if op.kind == OpKind::Write {
                                    "write"
                                } else {
                                    "read"
                                },
                                op.off,
                                op.len
                            )));
                        }
                    }
                    if !any {
                        ring.submit_and_wait(1)?;
                    }
                }
                Ok(out)
            }
            None => {
                let mut failed = false;
                for (i, op) in ops.iter().enumerate() {
                    if failed {
                        // Mirror io_uring: the rest of a failed link chain is cancelled.
                        out[i] = Err(io::Error::from_raw_os_error(libc::ECANCELED));
                        failed = op.link;
                        continue;
                    }
                    let r = match op.kind {
                        OpKind::Sync => self.file.sync_data(),
                        OpKind::Write => self.file.write_all_at(
                            &self.bufs.slice(op.buf)[op.buf_off..op.buf_off + op.len],
                            op.off,
                        ),
                        OpKind::Read => {
                            let (b, o, l) = (op.buf, op.buf_off, op.len);
                            self.file
                                .read_exact_at(&mut self.bufs.slice_mut(b)[o..o + l], op.off)
                        }
                    };
                    failed = r.is_err() && op.link;
                    out[i] = r;
                }
                Ok(out)
            }
        }
    }

    /// Most operations submitted at once (the submission queue's size).
    fn max_ops(&self) -> usize {
        self.ring
            .as_ref()
            .map_or(usize::MAX, |r| r.params().sq_entries() as usize)
    }

    /// Write each `(offset, bytes)`; offsets are block-aligned, bytes are
    /// zero-padded to whole blocks. Pieces share the buffer pool, so up to
    /// `BUFS_PER_TARGET` 2 MiB writes are in flight at once. With `sync`, an
    /// fdatasync follows the writes; when everything fits the buffers at once
    /// the writes and the fdatasync go down in ONE submission, linked
    /// (IOSQE_IO_LINK) so that the fdatasync runs only after every write
    /// succeeded (and not at all if one failed).
    pub(crate) fn write(&mut self, writes: &[(u64, &[u8])], sync: bool) -> io::Result<()> {
        let mut pieces: Vec<(u64, &[u8])> = Vec::new();
        for &(off, data) in writes {
            debug_assert_eq!(off % BLOCK, 0);
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
                let padded = piece.len().div_ceil(BLOCK as usize) * BLOCK as usize;
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
