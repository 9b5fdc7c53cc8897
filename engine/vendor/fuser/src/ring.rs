//! FUSE over io_uring (Linux 6.14+, `Documentation/filesystems/fuse-io-uring.rst`): the
//! kernel hands requests to ring entries the daemon registered, one queue per possible CPU,
//! and a request goes to the queue of the CPU its caller runs on. The thread that serves a
//! queue is pinned to that CPU, so a request and its reply stay on one CPU (no cross-CPU
//! wake-up), and a reply and the wait for the next request are one system call
//! (`FUSE_IO_URING_CMD_COMMIT_AND_FETCH`).
//!
//! Only requests travel this way: FORGET and INTERRUPT still come through `/dev/fuse`, and
//! notifications go out through it, so the session keeps one classic reader thread.
//!
//! Each ring entry owns one buffer, laid out so that the request reads as the classic
//! contiguous message that `ll::AnyRequest` parses, with at most 168 bytes copied:
//!
//! ```text
//! [ fuse_uring_req_header: in_out 128 | op_in 128 | ent_in_out 32 ][ scratch 256 ][ payload ]
//!                                                       in_header + op_in copied ^ here,
//!                                                       ending where the payload begins
//! ```
//!
//! Invariant: the kernel writes an entry's buffer only after it took the entry's
//! COMMIT_AND_FETCH (or REGISTER), and the entry's COMMIT_AND_FETCH is queued only once its
//! request's dispatch has returned, so the request bytes the file system borrows stay put
//! while it runs. A reply sent during the dispatch is kept in the entry until then.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::thread;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode::UringCmd80;
use io_uring::squeue::Entry128;
use io_uring::types::Fd;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::ll::Operation;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: in_out, op_in, ring_ent_in_out.
const IN_OUT_SZ: usize = 128;
const OP_IN_SZ: usize = 128;
const HEADERS_SZ: usize = IN_OUT_SZ + OP_IN_SZ + 32;
/// Offset of `ring_ent_in_out.payload_sz` in the headers.
const PAYLOAD_SZ_AT: usize = IN_OUT_SZ + OP_IN_SZ + 16;
const IN_HEADER_SZ: usize = 40;
const OUT_HEADER_SZ: usize = 16;
const SCRATCH_SZ: usize = 256;
const PAYLOAD_AT: usize = HEADERS_SZ + SCRATCH_SZ;

/// What the session negotiated for the rings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingParams {
    /// The kernel's `max_payload_sz`: max(8 KiB, max_write, max_pages pages).
    pub(crate) payload: usize,
    /// Threads (each with its own io_uring and one entry) to spread over the queues.
    pub(crate) threads: usize,
}

/// The state of an entry, between the kernel and the file system.
#[derive(Debug)]
enum Held {
    /// Registered with the kernel, waiting for a request.
    Kernel,
    /// Its request is being dispatched; a reply sent meanwhile waits here.
    Dispatching(Option<Staged>),
    /// Dispatched, no reply yet: the reply, from any thread, goes out at once.
    AwaitingReply,
}

#[derive(Debug)]
enum Staged {
    /// Already in the entry's buffer (the request had no payload to overwrite).
    InBuffer(usize),
    /// The reply's bytes, out header first (the request's payload is still borrowed).
    Copy(Vec<u8>),
}

/// One ring entry: its buffer, the kernel's view of it, and the request it holds.
#[derive(Debug)]
struct Entry {
    buf: *mut u8,
    len: usize,
    iov: Box<[libc::iovec; 2]>,
    held: Mutex<Held>,
    /// The request's payload bytes (0: replies may go straight into the buffer).
    request_payload: std::sync::atomic::AtomicUsize,
    unique: std::sync::atomic::AtomicU64,
}

// SAFETY: the buffer is reached only through the protocol above: the kernel between a
// submitted command and its completion, the owning thread while dispatching, and a replying
// thread under `held` once the dispatch is over.
unsafe impl Send for Entry {}
// SAFETY: as for Send.
unsafe impl Sync for Entry {}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: allocated in `Entry::new` with this layout; the ring (and so the kernel's
        // use of the buffer) is gone before the entries drop (`Ring` field order).
        unsafe { std::alloc::dealloc(self.buf, layout(self.len)) }
    }
}

fn layout(len: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(len, 4096).expect("ring entry layout")
}

impl Entry {
    fn new(payload: usize) -> Entry {
        let len = PAYLOAD_AT + payload;
        // SAFETY: a non-zero size with a valid alignment.
        let buf = unsafe { std::alloc::alloc_zeroed(layout(len)) };
        if buf.is_null() {
            std::alloc::handle_alloc_error(layout(len));
        }
        let iov = Box::new([
            libc::iovec {
                iov_base: buf.cast(),
                iov_len: HEADERS_SZ,
            },
            libc::iovec {
                // SAFETY: within the allocation.
                iov_base: unsafe { buf.add(PAYLOAD_AT) }.cast(),
                iov_len: payload,
            },
        ]);
        Entry {
            buf,
            len,
            iov,
            held: Mutex::new(Held::Kernel),
            request_payload: 0.into(),
            unique: 0.into(),
        }
    }

    fn payload_cap(&self) -> usize {
        self.len - PAYLOAD_AT
    }

    /// Lays the request out as a classic message; returns its start and length.
    ///
    /// # Safety
    /// The kernel filled the entry (its command completed) and has not been given it back.
    unsafe fn request(&self) -> Result<(usize, usize), String> {
        let headers = self.buf;
        let mut word = [0u8; 4];
        // SAFETY: (all below) offsets within the headers and scratch area of the allocation;
        // the kernel is done writing them (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(headers, word.as_mut_ptr(), 4);
            let len = u32::from_ne_bytes(word) as usize;
            std::ptr::copy_nonoverlapping(headers.add(PAYLOAD_SZ_AT), word.as_mut_ptr(), 4);
            let payload = u32::from_ne_bytes(word) as usize;
            if payload > self.payload_cap() || len < IN_HEADER_SZ + payload {
                return Err(format!(
                    "ring request of {len} bytes with a payload of {payload} bytes"
                ));
            }
            let op = len - IN_HEADER_SZ - payload;
            if op > OP_IN_SZ {
                return Err(format!("ring request with a {op}-byte operation header"));
            }
            let start = PAYLOAD_AT - op - IN_HEADER_SZ;
            std::ptr::copy_nonoverlapping(headers, headers.add(start), IN_HEADER_SZ);
            std::ptr::copy_nonoverlapping(
                headers.add(IN_OUT_SZ),
                headers.add(start + IN_HEADER_SZ),
                op,
            );
            let mut unique = [0u8; 8];
            std::ptr::copy_nonoverlapping(headers.add(8), unique.as_mut_ptr(), 8);
            self.unique.store(
                u64::from_ne_bytes(unique),
                std::sync::atomic::Ordering::Relaxed,
            );
            self.request_payload
                .store(payload, std::sync::atomic::Ordering::Relaxed);
            Ok((start, len))
        }
    }

    /// Writes a reply (out header, then the rest) into the entry's buffer; returns the
    /// payload length.
    ///
    /// # Safety
    /// The entry holds a request whose bytes nobody borrows any more, or the reply goes only
    /// where the request's bytes are not (no request payload).
    unsafe fn write_reply(&self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total < OUT_HEADER_SZ || total - OUT_HEADER_SZ > self.payload_cap() {
            return Err(io::Error::other(format!(
                "reply of {total} bytes does not fit a ring entry"
            )));
        }
        let mut at = 0usize;
        for p in parts {
            let mut rest: &[u8] = &p[..];
            while !rest.is_empty() {
                let (dst, room) = if at < OUT_HEADER_SZ {
                    (at, OUT_HEADER_SZ - at)
                } else {
                    (PAYLOAD_AT + at - OUT_HEADER_SZ, usize::MAX)
                };
                let n = rest.len().min(room);
                // SAFETY: dst..dst+n is in the out header (in_out) or the payload area,
                // bounded by the checks above; the caller's contract rules out aliasing.
                unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), self.buf.add(dst), n) };
                rest = &rest[n..];
                at += n;
            }
        }
        let payload = total - OUT_HEADER_SZ;
        // SAFETY: within the headers.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (payload as u32).to_ne_bytes().as_ptr(),
                self.buf.add(PAYLOAD_SZ_AT),
                4,
            )
        };
        Ok(payload)
    }
}

/// One io_uring with its entries, for one queue (CPU).
pub(crate) struct Ring {
    uring: IoUring<Entry128, cqueue::Entry>,
    /// Serializes pushes to the submission queue (replies may come from any thread).
    sq: Mutex<()>,
    dev: RawFd,
    qid: u16,
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ring(queue {}, {} entries)", self.qid, self.entries.len())
    }
}

/// Where a reply to a ring request goes.
#[derive(Debug, Clone)]
pub(crate) struct RingReply {
    ring: Arc<Ring>,
    slot: usize,
}

impl RingReply {
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let e = &self.ring.entries[self.slot];
        let mut held = e.held.lock();
        match &mut *held {
            Held::Dispatching(staged @ None) => {
                if e.request_payload.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                    // SAFETY: the request has no payload, so the reply's payload does not
                    // overlap its bytes, nor does the out header (in_out, not the scratch).
                    let n = unsafe { e.write_reply(data)? };
                    *staged = Some(Staged::InBuffer(n));
                } else {
                    let mut bytes = Vec::with_capacity(data.iter().map(|p| p.len()).sum());
                    for p in data {
                        bytes.extend_from_slice(p);
                    }
                    *staged = Some(Staged::Copy(bytes));
                }
                Ok(())
            }
            Held::AwaitingReply => {
                // SAFETY: the dispatch is over: nobody borrows the request's bytes.
                unsafe { e.write_reply(data)? };
                *held = Held::Kernel;
                drop(held);
                self.ring.commit(self.slot, true)
            }
            other => Err(io::Error::other(format!(
                "second reply to a ring request ({other:?})"
            ))),
        }
    }
}

impl Ring {
    fn new(dev: RawFd, qid: u16, params: &RingParams) -> io::Result<Ring> {
        let uring = Ring::setup()?;
        Ok(Ring {
            uring,
            sq: Mutex::new(()),
            dev,
            qid,
            entries: vec![Entry::new(params.payload)],
        })
    }

    fn setup() -> io::Result<IoUring<Entry128, cqueue::Entry>> {
        IoUring::<Entry128, cqueue::Entry>::builder()
            .setup_coop_taskrun()
            .build(4)
    }

    fn command(&self, op: u32, slot: usize, commit_id: u64) -> Entry128 {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let mut c = UringCmd80::new(Fd(self.dev), op).cmd(cmd);
        if op == FUSE_IO_URING_CMD_REGISTER {
            c = c.addr(Some(self.entries[slot].iov.as_ptr() as u64));
        }
        let sqe = c.build().user_data(slot as u64);
        if op != FUSE_IO_URING_CMD_REGISTER {
            return sqe;
        }
        // The kernel wants sqe->len = 2 (header and payload iovecs); UringCmd80 has no
        // setter for it. `io_uring_sqe.len` is the u32 at byte 24.
        // SAFETY: Entry128 is #[repr(C)] over the 128 bytes of an SQE128.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: as above; the bytes came from an Entry128.
        unsafe { std::mem::transmute::<[u8; 128], Entry128>(raw) }
    }

    fn push(&self, sqe: &Entry128, submit: bool) -> io::Result<()> {
        let _g = self.sq.lock();
        // SAFETY: pushes are serialized by `sq`; the SQE points at nothing (commit) or at
        // the entry's iovecs, which live as long as the ring.
        unsafe {
            let mut sq = self.uring.submission_shared();
            if sq.push(sqe).is_err() {
                drop(sq);
                self.uring.submitter().submit()?;
                let mut sq = self.uring.submission_shared();
                sq.push(sqe)
                    .map_err(|_| io::Error::other("ring submission queue full"))?;
            }
        }
        if submit {
            self.uring.submitter().submit()?;
        }
        Ok(())
    }

    fn commit(&self, slot: usize, submit: bool) -> io::Result<()> {
        let unique = self.entries[slot]
            .unique
            .load(std::sync::atomic::Ordering::Relaxed);
        self.push(
            &self.command(FUSE_IO_URING_CMD_COMMIT_AND_FETCH, slot, unique),
            submit,
        )
    }

    /// After a dispatch: the reply it left goes out (without submitting: the wait does),
    /// or a later reply will.
    fn after_dispatch(&self, slot: usize) -> io::Result<()> {
        let e = &self.entries[slot];
        let mut held = e.held.lock();
        let staged = match std::mem::replace(&mut *held, Held::AwaitingReply) {
            Held::Dispatching(s) => s,
            other => {
                return Err(io::Error::other(format!(
                    "ring entry in {other:?} after dispatch"
                )));
            }
        };
        match staged {
            None => Ok(()),
            Some(s) => {
                if let Staged::Copy(bytes) = s {
                    // SAFETY: the dispatch returned: the request's bytes are borrowed no more.
                    unsafe { e.write_reply(&[IoSlice::new(&bytes)])? };
                }
                *held = Held::Kernel;
                drop(held);
                self.commit(slot, false)
            }
        }
    }
}

/// Possible CPUs (the kernel makes one queue each): "0-3", "0,2-5".
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut max = 0usize;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        let n: usize = last
            .parse()
            .map_err(|_| io::Error::other(format!("cpu list {s:?}")))?;
        max = max.max(n);
    }
    Ok(max + 1)
}

fn pin_to(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        // A CPU outside the daemon's cpuset (or offline) keeps the thread unpinned.
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// Whether this process may make the rings: a seccomp profile (containers' default ones) or
/// `kernel.io_uring_disabled` refuses `io_uring_setup`, and INIT must then not ask the kernel for
/// FUSE over io_uring.
pub(crate) fn usable() -> io::Result<()> {
    Ring::setup().map(drop)
}

/// Registers every queue's entries and starts their threads. An error (a refused
/// registration among them) leaves the ring never ready, and the kernel holds every request
/// until it is: the caller ends the session.
pub(crate) fn start<FS: Filesystem>(
    ch: &Channel,
    params: RingParams,
    make_loop: impl Fn(String, Channel) -> SessionEventLoop<FS>,
    threads: &mut Vec<JoinHandle<io::Result<()>>>,
) -> io::Result<()> {
    let queues = possible_cpus()?;
    let dev = std::os::fd::AsFd::as_fd(ch).as_raw_fd();
    // Every queue needs an entry before the kernel uses any.
    let per_queue = params.threads.div_ceil(queues).max(1);
    for qid in 0..queues {
        for i in 0..per_queue {
            let ring = Arc::new(Ring::new(dev, qid as u16, &params)?);
            let el = make_loop(format!("fuser-ring-{qid}-{i}"), ch.clone());
            let (tx, rx) = std::sync::mpsc::sync_channel::<io::Result<()>>(1);
            let t = thread::Builder::new()
                .name(el.thread_name.clone())
                .spawn(move || serve(ring, el, tx))?;
            match rx.recv() {
                Ok(Ok(())) => threads.push(t),
                Ok(Err(e)) => {
                    let _ = t.join();
                    return Err(io::Error::new(
                        e.kind(),
                        format!("queue {qid}: registration refused: {e}"),
                    ));
                }
                Err(_) => {
                    let _ = t.join();
                    return Err(io::Error::other("a ring thread died at start"));
                }
            }
        }
    }
    Ok(())
}

fn serve<FS: Filesystem>(
    ring: Arc<Ring>,
    el: SessionEventLoop<FS>,
    started: std::sync::mpsc::SyncSender<io::Result<()>>,
) -> io::Result<()> {
    pin_to(ring.qid as usize);
    let registered = (0..ring.entries.len())
        .try_for_each(|slot| ring.push(&ring.command(FUSE_IO_URING_CMD_REGISTER, slot, 0), true));
    if let Err(e) = registered {
        let _ = started.send(Err(clone_err(&e)));
        return Err(e);
    }
    // A refused registration completes at once, with the error; a request already
    // waiting may complete one too (res 0), and is served below.
    // Reused: a wake-up allocates nothing.
    let mut done = Vec::new();
    completions(&ring, &mut done);
    if let Some((_, res)) = done.iter().find(|(_, res)| *res < 0) {
        let _ = started.send(Err(io::Error::from_raw_os_error(-res)));
        return Ok(());
    }
    let _ = started.send(Ok(()));
    loop {
        for &(slot, res) in &done {
            if res < 0 {
                let e = io::Error::from_raw_os_error(-res);
                return match -res {
                    // The connection went away (unmount, abort): the session is over.
                    libc::ENOTCONN | libc::ENODEV | libc::ECANCELED => Ok(()),
                    _ => {
                        error!("FUSE over io_uring: queue {}: {e}", ring.qid);
                        Err(e)
                    }
                };
            }
            if slot >= ring.entries.len() {
                warn!("FUSE over io_uring: completion for unknown entry {slot}");
                continue;
            }
            if !dispatch(&ring, slot, &el)? {
                return Ok(());
            }
        }
        match ring.uring.submitter().submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
        completions(&ring, &mut done);
    }
}

/// The ring's completions, into `done` (emptied first).
fn completions(ring: &Ring, done: &mut Vec<(usize, i32)>) {
    done.clear();
    // SAFETY: only the ring's own thread takes its completions.
    let cq = unsafe { ring.uring.completion_shared() };
    done.extend(cq.map(|c| (c.user_data() as usize, c.result())));
}

fn clone_err(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// Dispatches the request in `slot`; false when it was DESTROY.
fn dispatch<FS: Filesystem>(
    ring: &Arc<Ring>,
    slot: usize,
    el: &SessionEventLoop<FS>,
) -> io::Result<bool> {
    let e = &ring.entries[slot];
    *e.held.lock() = Held::Dispatching(None);
    // SAFETY: the kernel completed this entry's command: the request is in the buffer, and
    // the kernel will not touch it until the commit after this dispatch.
    let laid = unsafe { e.request() };
    let mut go_on = true;
    match laid {
        Ok((start, len)) => {
            // SAFETY: start..start+len was just laid out inside the allocation, and stays
            // unchanged until after_dispatch (the module's invariant).
            let data = unsafe { std::slice::from_raw_parts(e.buf.add(start), len) };
            let reply = RingReply {
                ring: ring.clone(),
                slot,
            };
            match RequestWithSender::new_ring(el.ch.sender(), reply, data) {
                Some(req) => {
                    if let Ok(Operation::Destroy(_)) = req.request.operation() {
                        req.reply::<crate::ReplyEmpty>().ok();
                        go_on = false;
                    } else {
                        req.dispatch(el);
                    }
                }
                None => {
                    // Unparseable: answer EIO so that the caller is not left waiting.
                    let unique = e.unique.load(std::sync::atomic::Ordering::Relaxed);
                    reply_errno(ring, slot, unique, libc::EIO)?;
                }
            }
        }
        Err(msg) => {
            error!("FUSE over io_uring: {msg}");
            let unique = e.unique.load(std::sync::atomic::Ordering::Relaxed);
            reply_errno(ring, slot, unique, libc::EIO)?;
        }
    }
    ring.after_dispatch(slot)?;
    Ok(go_on)
}

fn reply_errno(ring: &Arc<Ring>, slot: usize, unique: u64, errno: i32) -> io::Result<()> {
    let mut h = [0u8; OUT_HEADER_SZ];
    h[0..4].copy_from_slice(&(OUT_HEADER_SZ as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    RingReply {
        ring: ring.clone(),
        slot,
    }
    .send(&[IoSlice::new(&h)])
}
