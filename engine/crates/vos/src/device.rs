//! Device I/O of one target: its own file descriptor (O_DIRECT), its own
//! io_uring ring and its own registered buffer pool.
//!
//! All offsets and lengths handed to the device are multiples of 4 KiB, as
//! O_DIRECT requires; callers pad values to whole blocks.

use crate::bufpool::{BufPool, BUF_BYTES};
use crate::superblock::BLOCK;
use io_uring::{opcode, types, IoUring};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Buffers per target: enough to keep several 2 MiB writes in flight.
const BUFS_PER_TARGET: usize = 4;

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

    /// Run `n` prepared operations on buffers 0..n; `ops[i] = (write, offset, len)`.
    fn run(&mut self, ops: &[(bool, u64, usize)]) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        match &mut self.ring {
            Some(ring) => {
                for (i, &(write, off, len)) in ops.iter().enumerate() {
                    let buf = self.bufs.ptr(i);
                    let sqe = match (write, self.fixed) {
                        (true, true) => {
                            opcode::WriteFixed::new(types::Fd(fd), buf, len as u32, i as u16)
                                .offset(off)
                                .build()
                        }
                        (true, false) => opcode::Write::new(types::Fd(fd), buf, len as u32)
                            .offset(off)
                            .build(),
                        (false, true) => {
                            opcode::ReadFixed::new(types::Fd(fd), buf, len as u32, i as u16)
                                .offset(off)
                                .build()
                        }
                        (false, false) => opcode::Read::new(types::Fd(fd), buf, len as u32)
                            .offset(off)
                            .build(),
                    };
                    // Safety: the buffer stays valid until the completion is reaped below.
                    unsafe { ring.submission().push(&sqe.user_data(i as u64)) }
                        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
                }
                ring.submit_and_wait(ops.len())?;
                let mut first_err = None;
                let mut reaped = 0;
                while reaped < ops.len() {
                    let cqes: Vec<_> = ring.completion().collect();
                    if cqes.is_empty() {
                        ring.submit_and_wait(1)?;
                        continue;
                    }
                    for cqe in cqes {
                        reaped += 1;
                        let i = cqe.user_data() as usize;
                        let (write, off, len) = ops[i];
                        let res = cqe.result();
                        if res < 0 {
                            first_err.get_or_insert(io::Error::from_raw_os_error(-res));
                        } else if res as usize != len {
                            first_err.get_or_insert(io::Error::other(format!(
                                "short {} at offset {off}: {res} of {len} bytes",
                                if write { "write" } else { "read" }
                            )));
                        }
                    }
                }
                first_err.map_or(Ok(()), Err)
            }
            None => {
                for (i, &(write, off, len)) in ops.iter().enumerate() {
                    if write {
                        self.file.write_all_at(&self.bufs.slice(i)[..len], off)?;
                    } else {
                        self.file
                            .read_exact_at(&mut self.bufs.slice_mut(i)[..len], off)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Write each `(offset, bytes)`; offsets are block-aligned, bytes are
    /// zero-padded to whole blocks. Pieces share the buffer pool, so up to
    /// `BUFS_PER_TARGET` 2 MiB writes are in flight at once.
    pub(crate) fn write(&mut self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        let mut pieces: Vec<(u64, &[u8])> = Vec::new();
        for &(off, data) in writes {
            debug_assert_eq!(off % BLOCK, 0);
            for (k, piece) in data.chunks(BUF_BYTES).enumerate() {
                pieces.push((off + (k * BUF_BYTES) as u64, piece));
            }
        }
        for group in pieces.chunks(self.bufs.count()) {
            let mut ops = Vec::with_capacity(group.len());
            for (i, &(off, piece)) in group.iter().enumerate() {
                let padded = piece.len().div_ceil(BLOCK as usize) * BLOCK as usize;
                let buf = self.bufs.slice_mut(i);
                buf[..piece.len()].copy_from_slice(piece);
                buf[piece.len()..padded].fill(0);
                ops.push((true, off, padded));
            }
            self.run(&ops)?;
        }
        Ok(())
    }

    /// Read `len` bytes at block-aligned `offset`.
    pub(crate) fn read(&mut self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        debug_assert_eq!(offset % BLOCK, 0);
        let mut out = vec![0u8; len];
        let pieces: Vec<(u64, usize)> = (0..len)
            .step_by(BUF_BYTES)
            .map(|s| (s as u64, (len - s).min(BUF_BYTES)))
            .collect();
        for group in pieces.chunks(self.bufs.count()) {
            let ops: Vec<_> = group
                .iter()
                .map(|&(s, l)| {
                    (
                        false,
                        offset + s,
                        l.div_ceil(BLOCK as usize) * BLOCK as usize,
                    )
                })
                .collect();
            self.run(&ops)?;
            for (i, &(s, l)) in group.iter().enumerate() {
                out[s as usize..s as usize + l].copy_from_slice(&self.bufs.slice(i)[..l]);
            }
        }
        Ok(out)
    }

    /// Make every completed write durable (fdatasync through the ring).
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        match &mut self.ring {
            Some(ring) => {
                let sqe = opcode::Fsync::new(types::Fd(self.file.as_raw_fd()))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(u64::MAX);
                unsafe { ring.submission().push(&sqe) }
                    .map_err(|_| io::Error::other("io_uring submission queue full"))?;
                ring.submit_and_wait(1)?;
                let cqe = ring
                    .completion()
                    .next()
                    .ok_or_else(|| io::Error::other("io_uring: fsync completion missing"))?;
                if cqe.result() < 0 {
                    return Err(io::Error::from_raw_os_error(-cqe.result()));
                }
                Ok(())
            }
            None => self.file.sync_data(),
        }
    }
}
