//! Shared-memory data plane on one node: the handshake, the control words,
//! and the bounds-checked mapping both sides use.
//!
//! A client creates a memfd holding a control block ([`CTL_LEN`] bytes), a
//! request region and a response region ([`REGION_LEN`] each by default,
//! sparse: only touched pages cost memory), seals it against shrinking, and
//! hands it to the engine over the engine's unix socket with `SCM_RIGHTS`,
//! together with a [`Hello`] naming the regions and the target the
//! connection is for. The engine checks the memfd (size and seals), gives
//! the connection to that target, and answers with an ack and two
//! descriptors: the target's wake-up eventfd and its page (a memfd the
//! client can only map read-only, sealed with `F_SEAL_FUTURE_WRITE`), whose
//! first word is non-zero while the target sleeps.
//!
//! Then, one request at a time, with no thread between the client and the
//! target (the target polls its connections between its other work):
//! - the client writes an ordinary data-plane frame ([`crate::frame`]:
//!   header, message, bulk) at the start of the request region, its length
//!   in [`REQ_LEN`], sets [`RESP_STATE`] to [`RESP_WAITING`] and
//!   [`REQ_STATE`] to [`REQ_PENDING`], and writes the eventfd only if the
//!   target's page says it sleeps (a polling target needs no wake-up);
//! - the target takes it ([`REQ_TAKEN`]), answers with the response frame at
//!   the start of the response region, its length in [`RESP_LEN`] (a fetch's
//!   bytes may have been read from the device straight into the region:
//!   then the frame has [`FLAG_BULK_AT_PAGE`], its bulk starts
//!   [`BULK_PAGE_OFF`] bytes into the region, page-aligned as O_DIRECT
//!   needs, and its message follows the bulk), and swaps
//!   [`RESP_STATE`] to [`RESP_DONE`]; if the client had gone to sleep
//!   ([`RESP_SLEEPING`]) it also sends it an 8-byte doorbell on the socket;
//! - the client polls [`RESP_STATE`] for a short while, then swaps it from
//!   waiting to sleeping and blocks on the socket (whose end of stream also
//!   tells it that the engine died).
//!
//! Large update values need not pass through the request region: when the
//! engine could read the client's memory at the handshake (the hello names
//! an 8-byte nonce in the client's memory, [`Hello::probe`]; the engine reads
//! it with `process_vm_readv` and says so in the ack, [`ACK_CMA`]), a client
//! may send an update whose bulk section lists where its values are in its
//! own memory ([`FLAG_BULK_REMOTE`], [`RemotePart`]s), and the target reads
//! them straight into its device buffers: one copy, by the kernel
//! (cross-memory attach, as MPI libraries move large messages on a node).
//! The probe word must hold its nonce for as long as the connection lives:
//! the engine reads it again with every direct read, in the same system
//! call, and closes the connection of a process that no longer holds it
//! (one that exec'd since its hello: same pid, other program). Version 4
//! made that a rule.
//!
//! Both "sleeps" checks pair a store, a full fence and a load on each side
//! (as a Dekker lock): either the sleeper sees the work, or the worker sees
//! the sleeper and wakes it. Each side treats the other's memory as
//! untrusted: every access goes through [`Mapping`], which checks offsets
//! against the mapping, lengths are validated, and the frame header is
//! copied out before it is validated. The shrink seal is what makes a
//! mapping safe to touch at all: without it a peer could truncate the memfd
//! under the engine and turn its next access into SIGBUS.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

pub const MAGIC: [u8; 4] = *b"PRGS";
pub const VERSION: u16 = 4;
/// Response frame flag (shared memory only): the bulk sits at
/// [`BULK_PAGE_OFF`] from the frame's start, the message right after it.
pub const FLAG_BULK_AT_PAGE: u32 = 1 << 8;
/// Where such a bulk starts, from the start of the response region.
pub const BULK_PAGE_OFF: u64 = 4096;
/// Request frame flag (shared memory only): the bulk section is a list of
/// [`RemotePart`]s, where the values are in the client's memory.
pub const FLAG_BULK_REMOTE: u32 = 1 << 9;
/// Most parts one remote bulk may list.
pub const MAX_REMOTE_PARTS: usize = 64;
/// Ack flag: the engine reads the client's memory directly.
pub const ACK_CMA: u64 = 1;

/// A piece of a remote bulk: `len` bytes at `addr` in the client's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemotePart {
    pub addr: u64,
    pub len: u64,
}

impl RemotePart {
    pub const LEN: usize = 16;

    /// The bulk section listing `parts`.
    pub fn encode_all(parts: &[RemotePart]) -> Vec<u8> {
        let mut b = Vec::with_capacity(parts.len() * Self::LEN);
        for p in parts {
            b.extend_from_slice(&p.addr.to_le_bytes());
            b.extend_from_slice(&p.len.to_le_bytes());
        }
        b
    }

    /// Parse a bulk section of parts, checking its shape.
    pub fn decode_all(b: &[u8]) -> Result<Vec<RemotePart>, String> {
        if !b.len().is_multiple_of(Self::LEN) || b.len() / Self::LEN > MAX_REMOTE_PARTS {
            return Err(format!(
                "remote bulk of {} bytes is not a list of at most {MAX_REMOTE_PARTS} parts",
                b.len()
            ));
        }
        let u = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
        let parts: Vec<RemotePart> = b
            .chunks(Self::LEN)
            .map(|c| RemotePart {
                addr: u(&c[..8]),
                len: u(&c[8..]),
            })
            .collect();
        let total = parts.iter().try_fold(0u64, |t, p| t.checked_add(p.len));
        if total.is_none_or(|t| t > crate::frame::MAX_BULK as u64) {
            return Err("remote bulk longer than a frame's bulk may be".into());
        }
        Ok(parts)
    }
}
/// One region: a frame header, the largest message and the largest bulk, rounded up.
pub const REGION_LEN: u64 = 72 << 20;
/// Largest region an engine accepts.
pub const MAX_REGION_LEN: u64 = 128 << 20;
pub const HELLO_LEN: usize = 80;
/// The control block: the request words and the response words below, on
/// separate cache-line pairs.
pub const CTL_LEN: u64 = 4096;
/// Offsets of the control words (u64, native byte order) in the control block.
pub const REQ_STATE: u64 = 0;
pub const REQ_LEN: u64 = 8;
pub const RESP_STATE: u64 = 128;
pub const RESP_LEN: u64 = 136;
/// [`REQ_STATE`]: no request, a request written and not yet taken, taken by the target.
pub const REQ_IDLE: u64 = 0;
pub const REQ_PENDING: u64 = 1;
pub const REQ_TAKEN: u64 = 2;
/// [`RESP_STATE`]: the client waits (polling), sleeps on the socket, the response is there.
pub const RESP_WAITING: u64 = 0;
pub const RESP_SLEEPING: u64 = 1;
pub const RESP_DONE: u64 = 2;
/// A target's page: word 0 is non-zero while the target sleeps.
pub const TARGET_PAGE_LEN: u64 = 4096;
/// The ack: magic, version, the length of the engine's data address, flags
/// ([`ACK_CMA`]), and the address itself (zero padded), so a client can tell
/// that the socket belongs to the engine it meant (two systems on one node
/// may both have a rank 0).
pub const ACK_LEN: usize = 16 + MAX_ACK_ADDR;
pub const MAX_ACK_ADDR: usize = 120;
pub const DOORBELL_LEN: usize = 8;
/// Socket file of rank `rank` inside the engine's `shm_dir`.
pub fn socket_name(rank: u32) -> String {
    format!("peregrine-rank{rank}.sock")
}

/// The client's hello: where the control block and the two regions are in
/// the memfd it passes, and which target the connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub ctl_off: u64,
    pub req_off: u64,
    pub req_len: u64,
    pub resp_off: u64,
    pub resp_len: u64,
    /// Size of the memfd the client announces (at least the end of both regions).
    pub total: u64,
    pub target: u32,
    /// Address in the client's memory of 8 bytes holding `nonce`, for the
    /// engine to try reading (0: the client offers no direct reads).
    pub probe: u64,
    pub nonce: u64,
}

impl Hello {
    /// The standard layout: control block, request region, response region.
    pub fn standard(region: u64, target: u32) -> Hello {
        Hello {
            ctl_off: 0,
            req_off: CTL_LEN,
            req_len: region,
            resp_off: CTL_LEN + region,
            resp_len: region,
            total: CTL_LEN + 2 * region,
            target,
            probe: 0,
            nonce: 0,
        }
    }

    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        for (i, v) in [
            self.req_off,
            self.req_len,
            self.resp_off,
            self.resp_len,
            self.total,
            self.ctl_off,
            self.target as u64,
            self.probe,
            self.nonce,
        ]
        .iter()
        .enumerate()
        {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parse and validate a hello: magic, version, region bounds.
    pub fn decode(b: &[u8]) -> Result<Hello, String> {
        if b.len() != HELLO_LEN {
            return Err(format!("hello of {} bytes, expected {HELLO_LEN}", b.len()));
        }
        if b[0..4] != MAGIC {
            return Err(format!("hello: bad magic {:02x?}", &b[0..4]));
        }
        let v = u16::from_le_bytes([b[4], b[5]]);
        if v != VERSION {
            return Err(format!(
                "hello: unsupported version {v} (this side speaks {VERSION})"
            ));
        }
        let u = |i: usize| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        let h = Hello {
            req_off: u(0),
            req_len: u(1),
            resp_off: u(2),
            resp_len: u(3),
            total: u(4),
            ctl_off: u(5),
            target: u32::try_from(u(6))
                .map_err(|_| format!("hello: target {} out of range", u(6)))?,
            probe: u(7),
            nonce: u(8),
        };
        if h.total > 4 * MAX_REGION_LEN {
            return Err(format!(
                "hello: announced memfd of {} bytes is larger than {}",
                h.total,
                4 * MAX_REGION_LEN
            ));
        }
        let min = crate::frame::HEADER_LEN as u64;
        for (what, off, len) in [
            ("request", h.req_off, h.req_len),
            ("response", h.resp_off, h.resp_len),
        ] {
            if !(min..=MAX_REGION_LEN).contains(&len) {
                return Err(format!(
                    "hello: {what} region of {len} bytes is outside {min}..={MAX_REGION_LEN}"
                ));
            }
            match off.checked_add(len) {
                Some(end) if end <= h.total => {}
                _ => {
                    return Err(format!(
                        "hello: {what} region {off}+{len} ends beyond the announced {} bytes",
                        h.total
                    ))
                }
            }
        }
        if !h.ctl_off.is_multiple_of(64)
            || h.ctl_off.checked_add(CTL_LEN).is_none_or(|e| e > h.total)
        {
            return Err(format!(
                "hello: control block at {} is unaligned or ends beyond the announced {} bytes",
                h.ctl_off, h.total
            ));
        }
        let overlap = |a: u64, al: u64, b: u64, bl: u64| a < b + bl && b < a + al;
        if overlap(h.req_off, h.req_len, h.resp_off, h.resp_len) {
            return Err("hello: request and response regions overlap".into());
        }
        if overlap(h.ctl_off, CTL_LEN, h.req_off, h.req_len)
            || overlap(h.ctl_off, CTL_LEN, h.resp_off, h.resp_len)
        {
            return Err("hello: the control block overlaps a region".into());
        }
        Ok(h)
    }
}

/// The engine's answer to a good hello, naming its data address.
pub fn ack(data_addr: &str, flags: u64) -> [u8; ACK_LEN] {
    let mut b = [0u8; ACK_LEN];
    b[0..4].copy_from_slice(&MAGIC);
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    let a = &data_addr.as_bytes()[..data_addr.len().min(MAX_ACK_ADDR)];
    b[6..8].copy_from_slice(&(a.len() as u16).to_le_bytes());
    b[8..16].copy_from_slice(&flags.to_le_bytes());
    b[16..16 + a.len()].copy_from_slice(a);
    b
}

/// Check an ack; returns the engine's data address and the ack's flags.
pub fn check_ack(b: &[u8; ACK_LEN]) -> Result<(String, u64), String> {
    let n = u16::from_le_bytes([b[6], b[7]]) as usize;
    if b[0..4] != MAGIC || u16::from_le_bytes([b[4], b[5]]) != VERSION || n > MAX_ACK_ADDR {
        return Err(format!("bad shm handshake ack {:02x?}", &b[..8]));
    }
    let flags = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    Ok((String::from_utf8_lossy(&b[16..16 + n]).into_owned(), flags))
}

/// Read `out.len()` bytes of process `pid`'s memory, gathered from `remote`
/// (`(address, length)` pairs), with `process_vm_readv`: one copy, by the
/// kernel. Fails with the errno (EFAULT for memory the process does not
/// have, EPERM without the right to read it, ESRCH once it is gone).
pub fn read_remote(pid: i32, remote: &[(u64, usize)], out: &mut [u8]) -> io::Result<()> {
    read_remote_into(pid, remote, &mut [out]).1
}

/// The iovecs of `parts` (address, length) from byte `skip` of their
/// concatenation on.
fn iovecs_from(parts: impl Iterator<Item = (usize, usize)>, mut skip: usize) -> Vec<libc::iovec> {
    let mut v = Vec::new();
    for (a, l) in parts {
        if skip >= l {
            skip -= l;
            continue;
        }
        v.push(libc::iovec {
            iov_base: (a + skip) as *mut libc::c_void,
            iov_len: l - skip,
        });
        skip = 0;
    }
    v
}

/// Read process `pid`'s memory at `remote` into the `local` buffers, in
/// order, with as few `process_vm_readv` calls as the kernel allows (one,
/// unless it stops at a page fault). Returns how many bytes arrived, and
/// whether all did: a caller that put a probe word first can tell whether
/// the probe itself was unreadable (fewer bytes than the probe's).
pub fn read_remote_into(
    pid: i32,
    remote: &[(u64, usize)],
    local: &mut [&mut [u8]],
) -> (usize, io::Result<()>) {
    let total: usize = local.iter().map(|l| l.len()).sum();
    if remote.iter().map(|r| r.1).sum::<usize>() != total {
        return (
            0,
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "remote pieces and local buffers differ in length",
            )),
        );
    }
    if remote.len() > 1000 || local.len() > 16 {
        return (0, Err(io::ErrorKind::InvalidInput.into()));
    }
    let locals: Vec<(usize, usize)> = local
        .iter_mut()
        .map(|l| (l.as_mut_ptr() as usize, l.len()))
        .collect();
    let mut done = 0usize;
    while done < total {
        // What is not read yet (the kernel may stop at a page fault).
        let r = iovecs_from(remote.iter().map(|&(a, l)| (a as usize, l)), done);
        let l = iovecs_from(locals.iter().copied(), done);
        // SAFETY: the local iovecs cover the caller's own buffers (borrowed
        // mutably for the call); the remote side is only read.
        let n = unsafe {
            libc::process_vm_readv(pid, l.as_ptr(), l.len() as _, r.as_ptr(), r.len() as _, 0)
        };
        if n < 0 {
            return (done, Err(io::Error::last_os_error()));
        }
        if n == 0 {
            return (done, Err(io::Error::from_raw_os_error(libc::EFAULT)));
        }
        done += n as usize;
    }
    (done, Ok(()))
}

fn last_os(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A memfd of `len` bytes (sparse), close-on-exec, sealed against shrinking.
pub fn memfd_sealed(name: &str, len: u64) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: plain syscalls on a fd we own.
    unsafe {
        let fd = libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        if fd < 0 {
            return Err(last_os("memfd_create"));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
            return Err(last_os("ftruncate memfd"));
        }
        if libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        ) != 0
        {
            return Err(last_os("seal memfd"));
        }
        Ok(fd)
    }
}

/// A memfd of `len` bytes mapped read-write here and sealed so that nobody
/// else can ever write it (`F_SEAL_FUTURE_WRITE`) or resize it: a page the
/// engine publishes to its clients.
pub fn memfd_published(name: &str, len: u64) -> io::Result<(OwnedFd, Mapping)> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: plain syscalls on a fd we own.
    unsafe {
        let fd = libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        if fd < 0 {
            return Err(last_os("memfd_create"));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
            return Err(last_os("ftruncate memfd"));
        }
        let map = Mapping::map(fd.as_raw_fd(), len)?;
        let seals =
            libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
            return Err(last_os("seal memfd"));
        }
        Ok((fd, map))
    }
}

/// Check a memfd handed over by a peer: a regular file of at least `need`
/// bytes that can never shrink.
pub fn check_memfd(fd: RawFd, need: u64) -> Result<(), String> {
    // SAFETY: fstat/fcntl on a fd we hold; `st` is plain data.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(format!("fstat: {}", io::Error::last_os_error()));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err("the passed descriptor is not a memfd".into());
        }
        if (st.st_size as u64) < need {
            return Err(format!(
                "memfd has {} bytes, smaller than the announced {need}",
                st.st_size
            ));
        }
        let seals = libc::fcntl(fd, libc::F_GET_SEALS);
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err("memfd is not sealed against shrinking (F_SEAL_SHRINK)".into());
        }
    }
    Ok(())
}

/// A shared mapping of a memfd. Every access is bounds-checked; the bytes
/// may change under us (the peer maps them too), so they are only ever
/// copied in or out, never lent as a slice.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is plain shared memory; all access is by copy.
unsafe impl Send for Mapping {}
// SAFETY: as for Send: shared access is by copy or through atomics.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn map(fd: RawFd, len: u64) -> io::Result<Mapping> {
        Self::map_with(fd, len, true)
    }

    /// A mapping that can only be read (of a page the peer publishes).
    pub fn map_read_only(fd: RawFd, len: u64) -> io::Result<Mapping> {
        Self::map_with(fd, len, false)
    }

    fn map_with(fd: RawFd, len: u64, writable: bool) -> io::Result<Mapping> {
        let len = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh shared mapping of `len` bytes; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                if writable {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                },
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_os("mmap memfd"));
        }
        Ok(Mapping {
            ptr: p as *mut u8,
            len,
            writable,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of byte `off` of the mapping, if `off + n` is inside it:
    /// for the device to read into (the mapping lives as long as `self`).
    pub fn addr(&self, off: u64, n: usize) -> Option<usize> {
        self.check(off, n).ok().map(|o| self.ptr as usize + o)
    }

    fn check(&self, off: u64, n: usize) -> io::Result<usize> {
        match off.checked_add(n as u64) {
            Some(end) if end <= self.len as u64 => Ok(off as usize),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shm access {off}+{n} beyond the {}-byte mapping", self.len),
            )),
        }
    }

    /// Copy `out.len()` bytes at `off` out of the mapping.
    pub fn read(&self, off: u64, out: &mut [u8]) -> io::Result<()> {
        let o = self.check(off, out.len())?;
        // SAFETY: in bounds (checked); the destination is ours.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(o), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copy `n` bytes at `off` into a new vector.
    pub fn read_vec(&self, off: u64, n: usize) -> io::Result<Vec<u8>> {
        self.check(off, n)?;
        let mut v = Vec::with_capacity(n);
        // SAFETY: in bounds (checked); `v` has capacity `n` and is fully written.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.add(off as usize), v.as_mut_ptr(), n);
            v.set_len(n);
        }
        Ok(v)
    }

    /// The control word at `off` (8-byte aligned), for atomic access.
    pub fn word(&self, off: u64) -> io::Result<&AtomicU64> {
        let o = self.check(off, 8)?;
        if !off.is_multiple_of(8) || !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shm word at {off}: unaligned or read-only"),
            ));
        }
        // SAFETY: in bounds, aligned, writable shared memory that lives as
        // long as `self`; AtomicU64 has the layout of u64.
        Ok(unsafe { &*(self.ptr.add(o) as *const AtomicU64) })
    }

    /// Load the word at `off` (8-byte aligned); works on read-only mappings.
    pub fn load(&self, off: u64) -> io::Result<u64> {
        let o = self.check(off, 8)?;
        if !off.is_multiple_of(8) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: in bounds and aligned; an atomic load only reads.
        Ok(unsafe { (*(self.ptr.add(o) as *const AtomicU64)).load(Ordering::Acquire) })
    }

    /// Copy `data` into the mapping at `off`.
    pub fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        let o = self.check(off, data.len())?;
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "read-only shm mapping",
            ));
        }
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(o), data.len()) };
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Send `data` (and `fds`, if any, as SCM_RIGHTS) on a unix socket, without SIGPIPE.
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // Room for MAX_FDS fds, aligned for cmsghdr.
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr points at live buffers for the duration of the call.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let bytes = std::mem::size_of_val(fds) as u32;
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = libc::CMSG_SPACE(bytes) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned((libc::CMSG_DATA(c) as *mut RawFd).add(i), *fd);
            }
        }
        let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != data.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short send on unix socket",
            ));
        }
    }
    Ok(())
}

/// Most descriptors passed with one message.
pub const MAX_FDS: usize = 4;

/// Receive up to `buf.len()` bytes and the fds passed with them. Returns
/// the byte count (0 at end of stream) and the fds.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 32];
    // SAFETY: msghdr points at live buffers; received fds are taken into OwnedFds.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        let n = loop {
            let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break n;
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut got = Vec::new();
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned((data as *const RawFd).add(i));
                    got.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "control data truncated (too many descriptors passed)",
            ));
        }
        Ok((n as usize, got))
    }
}

/// Send an 8-byte doorbell (a frame length), without SIGPIPE and without
/// blocking: a peer that lets doorbells pile up gets an error, not a stuck sender.
pub fn send_doorbell(sock: RawFd, len: u64) -> io::Result<()> {
    let b = len.to_le_bytes();
    // SAFETY: sending 8 bytes from a live buffer.
    let n = unsafe {
        libc::send(
            sock,
            b.as_ptr().cast(),
            b.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != b.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short doorbell"));
    }
    Ok(())
}

/// Receive exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream
/// before the first byte.
pub fn recv_exact(sock: RawFd, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the unfilled tail of `buf`.
        let n = unsafe {
            libc::recv(
                sock,
                buf[got..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - got,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n as usize;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_bounds() {
        let h = Hello::standard(REGION_LEN, 3);
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let mut bad = h;
        bad.ctl_off = CTL_LEN + 8;
        assert!(Hello::decode(&bad.encode())
            .unwrap_err()
            .contains("control block"));
        let mut bad = h;
        bad.ctl_off = 4;
        assert!(Hello::decode(&bad.encode())
            .unwrap_err()
            .contains("unaligned"));
        let mut bad = h;
        bad.total = REGION_LEN;
        assert!(Hello::decode(&bad.encode()).unwrap_err().contains("beyond"));
        let mut bad = h;
        bad.resp_off = 10;
        assert!(Hello::decode(&bad.encode())
            .unwrap_err()
            .contains("overlap"));
        let mut bad = h;
        bad.req_len = u64::MAX;
        assert!(Hello::decode(&bad.encode()).is_err());
        let mut bad = h;
        bad.resp_off = u64::MAX - 4;
        assert!(Hello::decode(&bad.encode()).is_err());
    }

    #[test]
    fn memfd_and_mapping() {
        let fd = memfd_sealed("t", 1 << 20).unwrap();
        check_memfd(fd.as_raw_fd(), 1 << 20).unwrap();
        assert!(check_memfd(fd.as_raw_fd(), 2 << 20).is_err());
        // SAFETY: test of the seal.
        assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        let m = Mapping::map(fd.as_raw_fd(), 1 << 20).unwrap();
        m.write(100, b"hello").unwrap();
        assert_eq!(m.read_vec(100, 5).unwrap(), b"hello");
        assert!(m.write((1 << 20) - 2, b"abc").is_err());
        assert!(m.read_vec(u64::MAX, 2).is_err());
        m.word(64).unwrap().store(7, Ordering::Release);
        assert_eq!(m.load(64).unwrap(), 7);
        assert!(m.word(65).is_err() && m.word(1 << 20).is_err());
    }

    #[test]
    fn a_published_page_cannot_be_written_by_others() {
        let (fd, mine) = memfd_published("p", TARGET_PAGE_LEN).unwrap();
        mine.word(0).unwrap().store(1, Ordering::Release);
        let theirs = Mapping::map_read_only(fd.as_raw_fd(), TARGET_PAGE_LEN).unwrap();
        assert_eq!(theirs.load(0).unwrap(), 1);
        assert!(theirs.word(0).is_err() && theirs.write(0, b"x").is_err());
        // Nobody can map it writable any more, nor change its size.
        assert!(Mapping::map(fd.as_raw_fd(), TARGET_PAGE_LEN).is_err());
        // SAFETY: test of the seals.
        assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) }, 0);
        // SAFETY: as above.
        let w = unsafe { libc::write(fd.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        assert!(w < 0);
    }
}
