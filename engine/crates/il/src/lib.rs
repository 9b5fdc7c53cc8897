//! `libperegrine_il.so`: the Peregrine interception library (as DAOS libioil).
//!
//! `LD_PRELOAD=libperegrine_il.so prog ...`: when `prog` opens a regular
//! file in a Peregrine FUSE mount (`fuse.peregrine` in
//! /proc/self/mountinfo), the library asks the daemon for the file's object
//! handle (`ioctl(PEREGRINE_IOC_GET_HANDLE)`, include/peregrine_fuse.h) and
//! from then on moves the file's *data* straight between the program and the
//! engines through the client library ([`peregrine_dfs::File`]); metadata
//! (open, create, rename, chmod, stat by path, directories...) stays on
//! FUSE. Anything it does not handle falls back to the kernel path.
//!
//! # What is intercepted
//! * open, open64, openat, openat64, creat, creat64, `__open_2` & co.,
//!   fopen, fopen64: after the real call, a regular file whose device is a
//!   Peregrine mount is *tracked* if the ioctl answers and the container can
//!   be opened (else: kernel path, unchanged).
//! * On tracked descriptors: read, write, pread(64), pwrite(64), readv,
//!   writev, preadv(64), pwritev(64), preadv2, pwritev2, preadv64v2,
//!   pwritev64v2, `__read_chk`, `__pread(64)_chk`, lseek(64)
//!   (SEEK_END/DATA/HOLE from the store), fsync, fdatasync, ftruncate(64),
//!   fstat(64) (+ `__fxstat(64)`; size from the store), close, dup, dup2,
//!   dup3, fcntl(64) F_DUPFD/F_DUPFD_CLOEXEC (and F_SETFL for O_APPEND),
//!   copy_file_range and sendfile (emulated with reads and writes when
//!   either side is tracked).
//! * mmap, mmap64 of a file in a Peregrine mount (tracked or not): the file
//!   is handed to the kernel path first, see "mmap" below.
//! * stdio on a `FILE*` whose descriptor is tracked (whatever opened it:
//!   fopen, fdopen, freopen, stdout after dup2): fread, fwrite,
//!   `fread_unlocked`, `fwrite_unlocked`, `__fread_chk`, fseek, fseeko(64),
//!   ftell, ftello(64), fclose. glibc owns the `FILE`; each intercepted call
//!   first flushes glibc's buffer (`fflush`, which for input streams also
//!   moves the kernel offset back to the logical position), then does
//!   unbuffered I/O through the store. Other stdio calls (fgets, fprintf,
//!   getc, ...) keep using glibc's buffer and the kernel path; that stays
//!   consistent because of the offset rule below.
//!
//! # Design
//! * A global `RwLock<Vec<Option<Arc<Shared>>>>` indexed by fd; dup'ed fds
//!   point at one [`Shared`] (the object handle, the [`peregrine_dfs::File`],
//!   access mode, O_APPEND, a dirty flag and a mutex serializing
//!   offset-moving calls). An atomic count of tracked fds keeps untracked
//!   programs at one atomic load per call.
//! * **The kernel's file offset is the offset.** read/write/readv/writev
//!   read it with `lseek(fd, 0, SEEK_CUR)` and move it with
//!   `lseek(fd, off + n, SEEK_SET)` (local in FUSE: no daemon round trip).
//!   So dup'ed fds share it, a forked child and its parent share it (as
//!   POSIX wants), a program exec'ed with an inherited fd continues where
//!   the library left off, and glibc's stdio (`ftell`, buffered `fgets`)
//!   agrees with intercepted calls.
//! * Coherence: writes mark the file dirty; on close, fsync, fstat and
//!   ftruncate of a dirty file the library sends
//!   `ioctl(PEREGRINE_IOC_INVALIDATE)` (added to peregrine-fuse for this):
//!   the daemon records size and mtime and drops the kernel's attributes
//!   and page cache for the inode (`notify_inval_inode`). Other processes
//!   then stat the new size and read the new data.
//! * mmap: a mapping's pages are the kernel's page cache, which the
//!   library's writes bypass, and its page faults check the kernel's idea
//!   of the size (beyond it: SIGBUS). So before a file of a Peregrine mount
//!   is mapped, every descriptor of that file (same st_dev and st_ino) in
//!   this process leaves the table, dirty ones are invalidated
//!   (`IOC_INVALIDATE`: the kernel drops pages and attributes) and a forced
//!   statx makes the kernel fetch the size; the mmap then goes ahead. The
//!   file is then on the kernel path *for the rest of the process*:
//!   descriptors opened later (and dups) are not tracked, and munmap does
//!   not bring it back (a mapping outlives its descriptor and can be split,
//!   moved by mremap and inherited by fork; the set is kept across fork,
//!   dropped at exec). Reads, writes, ftruncate and fallocate of the file
//!   then go through the page cache the mapping shares, as on ext4. A call
//!   through the library already under way when the file is mapped (another
//!   thread) finishes on the store and invalidates again. Counted as
//!   `mmaps` in the report (mappings of Peregrine files).
//! * Connections: one [`peregrine::Container`] per (mgmt, pool, container),
//!   made on the first tracked open. They are not fork-safe: the
//!   `pthread_atfork` child handler forgets (leaks, never drops: their
//!   locks and threads belong to the parent) every container and every
//!   `File`, and gives each tracked fd fresh locks; the child reconnects
//!   lazily on its first I/O.
//! * exec: LD_PRELOAD is inherited, the library starts afresh in the new
//!   image; inherited fds are plain kernel-path fds there until the program
//!   opens files itself (correct, only not accelerated: offsets are right
//!   because the kernel offset is the offset, data is right because
//!   dirty files were invalidated... on their close; an fd written by the
//!   library and then inherited without close is invalidated when the
//!   parent closes it).
//! * Re-entrancy: a thread-local flag is set while the library works; its
//!   own calls (sockets of the client library, mountinfo reads, stderr)
//!   that land in these interposers go straight to the real functions.
//!   Helper threads spawned by the client library see untracked fds and
//!   pass through too. No lock of the library is held across I/O.
//! * Panics never cross the C boundary: `catch_unwind` -> errno EIO, -1.
//! * `PEREGRINE_IL_DISABLE=1`: every interposer calls the real function.
//!   `PEREGRINE_IL_REPORT=1`: counts printed to stderr at exit (atexit), one
//!   line per process (`peregrine-il[pid]: ...`); a forked child starts at 0.
//!   When a file fell back to the kernel path (`fallbacks`) or the store
//!   could not be reached, the line ends with the first reason
//!   (`first_failure="..."`).
//!   Processes leaving with `_exit` (fio's job processes without
//!   `--thread`) print nothing.
//! * Variadic `open`/`openat`/`fcntl`: stable Rust cannot define C-variadic
//!   functions; they are defined with a fixed trailing `mode: c_uint` (or
//!   `arg: c_ulong`). On x86-64 (System V) variadic and fixed arguments are
//!   passed in the same registers, so the callee reads the third/fourth
//!   integer register, which holds the mode when the caller passed one and
//!   junk the real function ignores when it did not. Not portable to ABIs
//!   that pass variadics differently (aarch64 Apple); fine on x86-64 and
//!   aarch64 Linux.
//!
//! # Not handled (kernel path, documented)
//! splice, io_uring/libaio, statx/fstatat(AT_EMPTY_PATH) (FUSE answers,
//! after the invalidation points above), fds closed by
//! `close_range`/`closefrom` (the stale entry is dropped when that fd
//! number is opened again). Static and Go binaries do not load LD_PRELOAD
//! libraries: they simply use FUSE.
//!
//! mmap across processes follows the same rules as read: a mapping in
//! process B sees process A's library writes after A's invalidation points
//! (close, fsync, fstat, ftruncate); stores into B's MAP_SHARED mapping
//! reach the engines when the kernel writes the pages back (msync, munmap,
//! writeback), and A reads them through the library after that. A process
//! without the library that maps a file another process has just grown
//! through the library faults beyond the old size until its kernel
//! refetches the attributes (any stat of the file does; attribute timeout).
//! mmap calls the C library makes internally (the dynamic loader's, for
//! instance) do not pass through the interposer; they are of files the
//! library does not write.

#![allow(clippy::missing_safety_doc)]

mod probe;

use libc::{c_char, c_int, c_uint, c_ulong, c_void, iovec, off64_t, off_t, size_t, ssize_t, FILE};
use parking_lot::{Mutex, RwLock};
use peregrine_dfs::File;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

// ---------------------------------------------------------------- ioctls

/// `struct peregrine_fuse_handle` (include/peregrine_fuse.h).
const HANDLE_SIZE: usize = 208;
const HANDLE_FLAG_RDONLY: u32 = 1;
/// `_IOR('P', 1, struct peregrine_fuse_handle)`.
const IOC_GET_HANDLE: c_ulong =
    (2 << 30) | ((HANDLE_SIZE as c_ulong) << 16) | ((b'P' as c_ulong) << 8) | 1;
/// `_IO('P', 2)`.
const IOC_INVALIDATE: c_ulong = ((b'P' as c_ulong) << 8) | 2;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Handle {
    pool: [u8; 16],
    cont: [u8; 16],
    oid: peregrine::ObjectId,
    chunk: u64,
    read_only: bool,
    mgmt: String,
}

impl Handle {
    fn parse(b: &[u8; HANDLE_SIZE]) -> Option<Handle> {
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        if u32_at(0) != 1 {
            return None;
        }
        let m = &b[80..];
        let mgmt = String::from_utf8(m[..m.iter().position(|&c| c == 0)?].to_vec()).ok()?;
        Some(Handle {
            read_only: u32_at(4) & HANDLE_FLAG_RDONLY != 0,
            pool: b[8..24].try_into().unwrap(),
            cont: b[24..40].try_into().unwrap(),
            oid: peregrine::ObjectId {
                hi: u64_at(40),
                lo: u64_at(48),
            },
            chunk: u64_at(56),
            mgmt,
        })
    }
}

// ------------------------------------------------------- real functions

/// `fn $acc() -> $ty`: the next definition of `$sym` (dlsym RTLD_NEXT),
/// resolved once.
macro_rules! real {
    ($acc:ident, $sym:literal, $ty:ty) => {
        #[inline]
        fn $acc() -> $ty {
            static P: AtomicUsize = AtomicUsize::new(0);
            let mut p = P.load(Ordering::Relaxed);
            if p == 0 {
                // SAFETY: dlsym with a NUL-terminated name.
                p = unsafe {
                    libc::dlsym(
                        libc::RTLD_NEXT,
                        concat!($sym, "\0").as_ptr() as *const c_char,
                    )
                } as usize;
                if p == 0 {
                    die(concat!("peregrine-il: no real ", $sym, "\n"));
                }
                P.store(p, Ordering::Relaxed);
            }
            // SAFETY: p is the address of the C function `$sym`, whose
            // prototype is `$ty` (glibc, x86-64).
            unsafe { std::mem::transmute::<usize, $ty>(p) }
        }
    };
}

fn die(msg: &str) -> ! {
    // SAFETY: raw syscalls on a static buffer.
    unsafe {
        libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
        libc::abort()
    }
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint) -> c_int;
type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type Openat2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;
type CreatFn = unsafe extern "C" fn(*const c_char, libc::mode_t) -> c_int;
type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut FILE;
type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t) -> ssize_t;
type PwriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t;
type ReadChkFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, size_t) -> ssize_t;
type PreadChkFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t, size_t) -> ssize_t;
type VFn = unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;
type PVFn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t) -> ssize_t;
type PV2Fn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t, c_int) -> ssize_t;
type LseekFn = unsafe extern "C" fn(c_int, off_t, c_int) -> off_t;
type FdFn = unsafe extern "C" fn(c_int) -> c_int;
type FtruncFn = unsafe extern "C" fn(c_int, off_t) -> c_int;
type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type FcntlFn = unsafe extern "C" fn(c_int, c_int, c_ulong) -> c_int;
type CfrFn =
    unsafe extern "C" fn(c_int, *mut off64_t, c_int, *mut off64_t, size_t, c_uint) -> ssize_t;
type SendfileFn = unsafe extern "C" fn(c_int, c_int, *mut off_t, size_t) -> ssize_t;
type FreadFn = unsafe extern "C" fn(*mut c_void, size_t, size_t, *mut FILE) -> size_t;
type FwriteFn = unsafe extern "C" fn(*const c_void, size_t, size_t, *mut FILE) -> size_t;
type FreadChkFn = unsafe extern "C" fn(*mut c_void, size_t, size_t, size_t, *mut FILE) -> size_t;
type FseekFn = unsafe extern "C" fn(*mut FILE, off_t, c_int) -> c_int;
type FtellFn = unsafe extern "C" fn(*mut FILE) -> off_t;
type FileFn = unsafe extern "C" fn(*mut FILE) -> c_int;
type FtellLongFn = unsafe extern "C" fn(*mut FILE) -> libc::c_long;
type FseekLongFn = unsafe extern "C" fn(*mut FILE, libc::c_long, c_int) -> c_int;
type MmapFn = unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;

real!(r_open, "open", OpenFn);
real!(r_open64, "open64", OpenFn);
real!(r_openat, "openat", OpenatFn);
real!(r_openat64, "openat64", OpenatFn);
real!(r_open_2, "__open_2", Open2Fn);
real!(r_open64_2, "__open64_2", Open2Fn);
real!(r_openat_2, "__openat_2", Openat2Fn);
real!(r_openat64_2, "__openat64_2", Openat2Fn);
real!(r_creat, "creat", CreatFn);
real!(r_creat64, "creat64", CreatFn);
real!(r_fopen, "fopen", FopenFn);
real!(r_fopen64, "fopen64", FopenFn);
real!(r_read, "read", ReadFn);
real!(r_write, "write", WriteFn);
real!(r_pread, "pread", PreadFn);
real!(r_pread64, "pread64", PreadFn);
real!(r_pwrite, "pwrite", PwriteFn);
real!(r_pwrite64, "pwrite64", PwriteFn);
real!(r_read_chk, "__read_chk", ReadChkFn);
real!(r_pread_chk, "__pread_chk", PreadChkFn);
real!(r_pread64_chk, "__pread64_chk", PreadChkFn);
real!(r_readv, "readv", VFn);
real!(r_writev, "writev", VFn);
real!(r_preadv, "preadv", PVFn);
real!(r_preadv64, "preadv64", PVFn);
real!(r_pwritev, "pwritev", PVFn);
real!(r_pwritev64, "pwritev64", PVFn);
real!(r_preadv2, "preadv2", PV2Fn);
real!(r_pwritev2, "pwritev2", PV2Fn);
real!(r_preadv64v2, "preadv64v2", PV2Fn);
real!(r_pwritev64v2, "pwritev64v2", PV2Fn);
real!(r_lseek, "lseek", LseekFn);
real!(r_lseek64, "lseek64", LseekFn);
real!(r_fsync, "fsync", FdFn);
real!(r_fdatasync, "fdatasync", FdFn);
real!(r_ftruncate, "ftruncate", FtruncFn);
real!(r_ftruncate64, "ftruncate64", FtruncFn);
real!(r_close, "close", FdFn);
real!(r_dup, "dup", FdFn);
real!(r_dup2, "dup2", Dup2Fn);
real!(r_dup3, "dup3", Dup3Fn);
real!(r_fcntl, "fcntl", FcntlFn);
real!(r_fcntl64, "fcntl64", FcntlFn);
real!(r_copy_file_range, "copy_file_range", CfrFn);
real!(r_sendfile, "sendfile", SendfileFn);
real!(r_sendfile64, "sendfile64", SendfileFn);
real!(r_fread, "fread", FreadFn);
real!(r_fwrite, "fwrite", FwriteFn);
real!(r_fread_unlocked, "fread_unlocked", FreadFn);
real!(r_fwrite_unlocked, "fwrite_unlocked", FwriteFn);
real!(r_fread_chk, "__fread_chk", FreadChkFn);
real!(r_fseek, "fseek", FseekLongFn);
real!(r_fseeko, "fseeko", FseekFn);
real!(r_fseeko64, "fseeko64", FseekFn);
real!(r_ftell, "ftell", FtellLongFn);
real!(r_ftello, "ftello", FtellFn);
real!(r_ftello64, "ftello64", FtellFn);
real!(r_fclose, "fclose", FileFn);
real!(r_fflush, "fflush", FileFn);
real!(r_mmap, "mmap", MmapFn);
real!(r_mmap64, "mmap64", MmapFn);

/// The kernel's fstat (same `struct stat` as glibc's on x86-64), without
/// depending on which stat symbols this glibc exports.
unsafe fn sys_fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    libc::syscall(libc::SYS_fstat, fd, st) as c_int
}

unsafe fn ioctl_raw(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    libc::syscall(libc::SYS_ioctl, fd, req, arg) as c_int
}

fn set_errno(e: c_int) {
    // SAFETY: the thread's errno.
    unsafe { *libc::__errno_location() = e };
}

// --------------------------------------------------------------- switches

/// 0 unknown, 1 on, 2 off (PEREGRINE_IL_DISABLE).
static MODE: AtomicU8 = AtomicU8::new(0);

fn env_on(name: &[u8]) -> bool {
    // SAFETY: getenv with a NUL-terminated name; the result is read at once.
    unsafe {
        let p = libc::getenv(name.as_ptr() as *const c_char);
        if p.is_null() {
            return false;
        }
        let v = std::ffi::CStr::from_ptr(p).to_bytes();
        !(v.is_empty() || v == b"0" || v.eq_ignore_ascii_case(b"false") || v == b"no")
    }
}

#[inline]
fn enabled() -> bool {
    match MODE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = !env_on(b"PEREGRINE_IL_DISABLE\0");
            MODE.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
    }
}

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// The library is at work on this thread (nested calls pass through).
struct Busy;

impl Busy {
    fn enter() -> Option<Busy> {
        BUSY.try_with(|b| {
            if b.get() {
                None
            } else {
                b.set(true);
                Some(Busy)
            }
        })
        .ok()
        .flatten()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = BUSY.try_with(|b| b.set(false));
    }
}

// -------------------------------------------------------------- counters

#[derive(Clone, Copy)]
#[repr(usize)]
enum C {
    Opens,
    Reads,
    Writes,
    BytesRead,
    BytesWritten,
    Seeks,
    Stats,
    Syncs,
    Truncates,
    Dups,
    Closes,
    Stdio,
    Invalidates,
    Fallbacks,
    Mmaps,
    N,
}

static COUNTS: [AtomicU64; C::N as usize] = [const { AtomicU64::new(0) }; C::N as usize];

#[inline]
fn count(c: C, n: u64) {
    COUNTS[c as usize].fetch_add(n, Ordering::Relaxed);
}

/// Why the library first fell back to the kernel path (or failed to reach
/// the store), for the report: a silent fallback only looks slow.
static FIRST_FAILURE: OnceLock<String> = OnceLock::new();

fn note_failure(why: String) {
    let _ = FIRST_FAILURE.set(why);
}

fn counts() -> [u64; C::N as usize] {
    std::array::from_fn(|i| COUNTS[i].load(Ordering::Relaxed))
}

extern "C" fn report() {
    let _b = Busy::enter();
    let c = counts();
    let first_failure = FIRST_FAILURE
        .get()
        .map(|w| format!(" first_failure={w:?}"))
        .unwrap_or_default();
    let line = format!(
        "peregrine-il[{}]: intercepted opens={} reads={} writes={} bytes_read={} bytes_written={} \
         seeks={} stats={} syncs={} truncates={} dups={} closes={} stdio={} invalidates={} \
         fallbacks={} mmaps={}{first_failure}\n",
        std::process::id(),
        c[C::Opens as usize],
        c[C::Reads as usize],
        c[C::Writes as usize],
        c[C::BytesRead as usize],
        c[C::BytesWritten as usize],
        c[C::Seeks as usize],
        c[C::Stats as usize],
        c[C::Syncs as usize],
        c[C::Truncates as usize],
        c[C::Dups as usize],
        c[C::Closes as usize],
        c[C::Stdio as usize],
        c[C::Invalidates as usize],
        c[C::Fallbacks as usize],
        c[C::Mmaps as usize],
    );
    let fd = match REPORT_FD.load(Ordering::Relaxed) {
        -1 => 2,
        fd => fd,
    };
    // SAFETY: raw write of an owned buffer.
    unsafe { libc::syscall(libc::SYS_write, fd, line.as_ptr(), line.len()) };
}

/// A copy of stderr made at load time: programs such as coreutils close
/// stderr in their own exit handlers, which run before ours.
static REPORT_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

// ------------------------------------------------------------ the tables

/// State shared by all fds of one open file description.
struct Shared {
    h: Handle,
    /// The file (st_dev, st_ino): finds every descriptor of a file that
    /// gets mapped.
    key: Key,
    /// O_RDONLY / O_WRONLY / O_RDWR.
    acc: c_int,
    append: AtomicBool,
    /// Written through the library since the last invalidation.
    dirty: AtomicBool,
    /// Handed back to the kernel path because the file was mapped (no
    /// longer in the table; a call already under way finishes on the
    /// store, then invalidates again).
    retired: AtomicBool,
    /// Opened O_SYNC or O_DSYNC: every write is flushed before it returns.
    sync: bool,
    /// Serializes offset-moving calls (read of the kernel offset, I/O,
    /// update of the kernel offset).
    io: Mutex<()>,
    file: Mutex<Option<Arc<File>>>,
}

impl Shared {
    fn fresh_copy(&self) -> Shared {
        Shared {
            h: self.h.clone(),
            key: self.key,
            acc: self.acc,
            append: AtomicBool::new(self.append.load(Ordering::Relaxed)),
            dirty: AtomicBool::new(self.dirty.load(Ordering::Relaxed)),
            retired: AtomicBool::new(self.retired.load(Ordering::Relaxed)),
            sync: self.sync,
            io: Mutex::new(()),
            file: Mutex::new(None),
        }
    }

    /// The file's I/O object (reconnecting after a fork).
    fn file(&self) -> Result<Arc<File>, c_int> {
        if let Some(f) = self.file.lock().as_ref() {
            return Ok(f.clone());
        }
        let cont = container(&self.h)?;
        let f = Arc::new(
            File::new(&cont, self.h.oid, self.h.chunk, self.h.read_only).map_err(|e| err_of(&e))?,
        );
        let mut g = self.file.lock();
        Ok(g.get_or_insert(f).clone())
    }
}

static FDS: RwLock<Vec<Option<Arc<Shared>>>> = RwLock::new(Vec::new());
static NTRACKED: AtomicUsize = AtomicUsize::new(0);

/// A file: (major, minor) of its st_dev, and its st_ino.
type Key = (u32, u32, u64);

/// Files of Peregrine mounts this process has mapped: left to the kernel
/// path for the rest of the process (see `before_map`). Locked after
/// [`FDS`] when both are.
static MAPPED: Mutex<BTreeSet<Key>> = Mutex::new(BTreeSet::new());

type ContKey = (String, [u8; 16], [u8; 16]);
static CONTS: Mutex<Vec<(ContKey, peregrine::Container)>> = Mutex::new(Vec::new());

fn err_of(e: &peregrine::Error) -> c_int {
    if e.code < 0 {
        -e.code
    } else {
        libc::EIO
    }
}

fn uuid_str(b: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*b).to_string()
}

fn container(h: &Handle) -> Result<peregrine::Container, c_int> {
    let key = (h.mgmt.clone(), h.pool, h.cont);
    let mut t = CONTS.lock();
    if let Some((_, c)) = t.iter().find(|(k, _)| *k == key) {
        return Ok(c.clone());
    }
    let c = (|| {
        let client = peregrine::Client::connect(&h.mgmt)?;
        let pool = client.pool_connect(&uuid_str(&h.pool))?;
        pool.cont_open(&uuid_str(&h.cont))
    })()
    .map_err(|e| {
        let m = format!("container via {}: {e}", h.mgmt);
        if env_on(b"PEREGRINE_IL_DEBUG\0") {
            let line = format!("peregrine-il: {m}\n");
            // SAFETY: raw write of an owned buffer.
            unsafe { libc::syscall(libc::SYS_write, 2, line.as_ptr(), line.len()) };
        }
        note_failure(m);
        err_of(&e)
    })?;
    t.push((key, c.clone()));
    Ok(c)
}

fn lookup(fd: c_int) -> Option<Arc<Shared>> {
    if fd < 0 || NTRACKED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    FDS.read().get(fd as usize).and_then(|s| s.clone())
}

/// Track `fd` as `s`, unless its file has been mapped (checked under the
/// table's lock, so that a concurrent mmap retires it or it is not
/// inserted).
fn insert(fd: c_int, s: Arc<Shared>) -> bool {
    if fd < 0 {
        return false;
    }
    let mut t = FDS.write();
    if MAPPED.lock().contains(&s.key) {
        return false;
    }
    let i = fd as usize;
    if t.len() <= i {
        t.resize(i + 1, None);
    }
    if t[i].replace(s).is_none() {
        NTRACKED.fetch_add(1, Ordering::Relaxed);
    }
    true
}

fn remove(fd: c_int) -> Option<Arc<Shared>> {
    if fd < 0 || NTRACKED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let mut t = FDS.write();
    let r = t.get_mut(fd as usize).and_then(|s| s.take());
    if r.is_some() {
        NTRACKED.fetch_sub(1, Ordering::Relaxed);
    }
    r
}

/// A tracked fd, with the re-entrancy flag held.
fn tracked(fd: c_int) -> Option<(Busy, Arc<Shared>)> {
    if NTRACKED.load(Ordering::Relaxed) == 0 || !enabled() {
        return None;
    }
    let b = Busy::enter()?;
    let s = lookup(fd)?;
    Some((b, s))
}

/// Run `f`; a panic becomes errno EIO and `fail`.
fn guarded<R>(fail: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

// ------------------------------------------------------------- mountinfo

struct Mounts {
    /// st_dev (major, minor) of `fuse.peregrine` mounts.
    peregrine: Vec<(u32, u32)>,
    /// Anonymous devices known not to be Peregrine mounts.
    other: Vec<(u32, u32)>,
    loaded: bool,
}

static MOUNTS: Mutex<Mounts> = Mutex::new(Mounts {
    peregrine: Vec::new(),
    other: Vec::new(),
    loaded: false,
});

/// /proc/self/mountinfo through the real open/read/close.
fn read_mountinfo() -> Vec<u8> {
    let mut out = Vec::new();
    // SAFETY: real calls on our own fd and buffer.
    unsafe {
        let fd = r_open()(
            c"/proc/self/mountinfo".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
            0,
        );
        if fd < 0 {
            return out;
        }
        let mut buf = [0u8; 16384];
        loop {
            let n = r_read()(fd, buf.as_mut_ptr() as *mut c_void, buf.len());
            if n <= 0 {
                break;
            }
            out.extend_from_slice(&buf[..n as usize]);
        }
        r_close()(fd);
    }
    out
}

/// Devices of the `fuse.peregrine` mounts in a mountinfo text.
fn peregrine_devs(text: &[u8]) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    for line in text.split(|&c| c == b'\n') {
        let f: Vec<&[u8]> = line.split(|&c| c == b' ').collect();
        let Some(sep) = f.iter().position(|x| *x == b"-") else {
            continue;
        };
        if f.get(sep + 1) != Some(&&b"fuse.peregrine"[..]) || f.len() < 3 {
            continue;
        }
        let dev = std::str::from_utf8(f[2]).ok().and_then(|d| {
            let (a, b) = d.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        });
        if let Some(d) = dev {
            v.push(d);
        }
    }
    v
}

/// Is `dev` a Peregrine mount? Reread mountinfo on a miss (once per
/// unknown anonymous device).
fn is_peregrine_dev(dev: (u32, u32)) -> bool {
    if dev.0 != 0 {
        // FUSE mounts use anonymous (major 0) devices.
        return false;
    }
    let mut m = MOUNTS.lock();
    if m.peregrine.contains(&dev) {
        return true;
    }
    if m.loaded && m.other.contains(&dev) {
        return false;
    }
    m.peregrine = peregrine_devs(&read_mountinfo());
    m.loaded = true;
    if m.peregrine.contains(&dev) {
        m.other.retain(|d| *d != dev);
        return true;
    }
    if m.other.len() < 4096 {
        m.other.push(dev);
    }
    false
}

// -------------------------------------------------------------- tracking

/// After a successful real open of `fd`: track it if it is a regular file
/// of a Peregrine mount whose handle the daemon hands out.
fn maybe_track(fd: c_int) {
    if fd < 0 || !enabled() {
        return;
    }
    // A stale entry (fd closed behind our back, e.g. by close_range).
    remove(fd);
    let Some(_b) = Busy::enter() else { return };
    let _ = catch_unwind(|| track(fd));
}

/// `fd`'s file if it is a regular file of a Peregrine mount (statx from
/// the kernel's cache: no round trip to the daemon).
fn peregrine_file(fd: c_int) -> Option<Key> {
    // SAFETY: statx into a local struct.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE | libc::STATX_INO,
            &mut sx,
        )
    };
    if r != 0 || (sx.stx_mode as u32 & libc::S_IFMT) != libc::S_IFREG {
        return None;
    }
    let dev = (sx.stx_dev_major, sx.stx_dev_minor);
    is_peregrine_dev(dev).then_some((dev.0, dev.1, sx.stx_ino))
}

fn track(fd: c_int) {
    let Some(key) = peregrine_file(fd) else {
        return;
    };
    if MAPPED.lock().contains(&key) {
        // Mapped in this process: the kernel path, which the mapping
        // shares pages with.
        return;
    }
    // SAFETY: real fcntl on the fd just opened.
    let fl = unsafe { r_fcntl()(fd, libc::F_GETFL, 0) };
    if fl < 0 || fl & libc::O_PATH != 0 {
        return;
    }
    let mut b = [0u8; HANDLE_SIZE];
    // SAFETY: the ioctl writes HANDLE_SIZE bytes into b.
    if unsafe { ioctl_raw(fd, IOC_GET_HANDLE, b.as_mut_ptr() as *mut c_void) } != 0 {
        note_failure(format!("handle ioctl: {}", std::io::Error::last_os_error()));
        count(C::Fallbacks, 1);
        return;
    }
    let Some(h) = Handle::parse(&b) else {
        note_failure("handle ioctl: a handle of an unknown version".into());
        count(C::Fallbacks, 1);
        return;
    };
    let s = Shared {
        h,
        key,
        acc: fl & libc::O_ACCMODE,
        append: AtomicBool::new(fl & libc::O_APPEND != 0),
        dirty: AtomicBool::new(false),
        retired: AtomicBool::new(false),
        // O_SYNC includes O_DSYNC's bit; F_SETFL cannot change either.
        sync: fl & libc::O_DSYNC != 0,
        io: Mutex::new(()),
        file: Mutex::new(None),
    };
    // Connect now: a failure leaves the fd on the kernel path.
    if s.file().is_err() {
        count(C::Fallbacks, 1);
        return;
    }
    if insert(fd, Arc::new(s)) {
        count(C::Opens, 1);
    }
}

/// Make the kernel's view right after writes behind its back.
fn invalidate(fd: c_int, s: &Shared) {
    if s.dirty.swap(false, Ordering::AcqRel) {
        count(C::Invalidates, 1);
        // SAFETY: argument-less ioctl.
        if unsafe { ioctl_raw(fd, IOC_INVALIDATE, std::ptr::null_mut()) } != 0 {
            // An older daemon: at least refresh the attributes on expiry.
            s.dirty.store(false, Ordering::Release);
        }
    }
}

/// Before `fd` is mapped (mmap, mmap64): a file of a Peregrine mount
/// goes to the kernel path for the rest of the process, so that the
/// mapping, read(), write() and ftruncate() all go through the kernel's
/// page cache, as on a local file system:
/// * it is added to [`MAPPED`]: later opens of it are not tracked;
/// * every tracked descriptor of it in this process (whichever was
///   mapped) leaves the table (`retired`);
/// * if any of them wrote behind the kernel, the daemon drops the kernel's
///   pages and attributes of the file (`IOC_INVALIDATE`);
/// * a forced statx makes the kernel fetch the size now: the mapping's
///   page faults check the kernel's size, not the store's, and fault
///   (SIGBUS) beyond it; nothing else refreshes it before they come.
///
/// It is not undone at munmap: a mapping outlives its descriptors and can
/// be split, moved or inherited, so "still mapped" is not worth tracking.
fn before_map(fd: c_int) {
    let key = match lookup(fd) {
        Some(s) => s.key,
        None => match peregrine_file(fd) {
            Some(k) => k,
            None => return,
        },
    };
    count(C::Mmaps, 1);
    let retired: Vec<(c_int, Arc<Shared>)> = {
        let mut t = FDS.write();
        MAPPED.lock().insert(key);
        let out: Vec<(c_int, Arc<Shared>)> = t
            .iter_mut()
            .enumerate()
            .filter(|(_, e)| e.as_ref().is_some_and(|s| s.key == key))
            .filter_map(|(i, e)| Some((i as c_int, e.take()?)))
            .collect();
        NTRACKED.fetch_sub(out.len(), Ordering::Relaxed);
        out
    };
    let mut dirty = false;
    for (_, s) in &retired {
        s.retired.store(true, Ordering::SeqCst);
        dirty |= s.dirty.swap(false, Ordering::SeqCst);
    }
    if dirty {
        count(C::Invalidates, 1);
        // Through the descriptor being mapped, else any of the file's.
        let mut fds = std::iter::once(fd).chain(retired.iter().map(|(f, _)| *f));
        // SAFETY: argument-less ioctl.
        let done = fds.any(|f| unsafe { ioctl_raw(f, IOC_INVALIDATE, std::ptr::null_mut()) } == 0);
        if !done {
            note_failure(format!(
                "invalidate before mmap: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    refresh_size(fd);
}

/// Make the kernel fetch `fd`'s attributes (size) from the daemon now.
fn refresh_size(fd: c_int) {
    // SAFETY: statx into a local struct.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_SIZE,
            &mut sx,
        )
    };
}

// ------------------------------------------------------------------ I/O

fn fail(e: c_int) -> ssize_t {
    set_errno(e);
    -1
}

fn klseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    // SAFETY: real lseek on a tracked fd (local in FUSE for SET/CUR).
    unsafe { r_lseek()(fd, off, whence) }
}

/// Read into `buf` at `pos` (or at and advancing the kernel offset).
fn do_read(fd: c_int, s: &Shared, buf: &mut [u8], pos: Option<i64>) -> ssize_t {
    if s.acc == libc::O_WRONLY {
        return fail(libc::EBADF);
    }
    let file = match s.file() {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    count(C::Reads, 1);
    let n = match pos {
        Some(p) if p < 0 => return fail(libc::EINVAL),
        Some(p) => match file.read_at(p as u64, buf) {
            Ok(n) => n,
            Err(e) => return fail(err_of(&e)),
        },
        None => {
            let _g = s.io.lock();
            let off = klseek(fd, 0, libc::SEEK_CUR);
            if off < 0 {
                return -1;
            }
            let n = match file.read_at(off as u64, buf) {
                Ok(n) => n,
                Err(e) => return fail(err_of(&e)),
            };
            if n > 0 {
                klseek(fd, off + n as i64, libc::SEEK_SET);
            }
            n
        }
    };
    count(C::BytesRead, n as u64);
    n as ssize_t
}

/// Write `data` at `pos` (or at and advancing the kernel offset; O_APPEND:
/// at the store's end of file).
fn do_write(fd: c_int, s: &Shared, data: &[u8], pos: Option<i64>) -> ssize_t {
    if s.acc == libc::O_RDONLY {
        return fail(libc::EBADF);
    }
    let file = match s.file() {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    count(C::Writes, 1);
    if data.is_empty() {
        return 0;
    }
    s.dirty.store(true, Ordering::SeqCst);
    let append = s.append.load(Ordering::Relaxed);
    let r = match pos {
        // pwrite on O_APPEND appends on Linux.
        Some(p) if !append => {
            if p < 0 {
                return fail(libc::EINVAL);
            }
            file.write_at(p as u64, data)
        }
        _ => {
            let _g = s.io.lock();
            let off = if append {
                match file.size() {
                    Ok(sz) => sz as i64,
                    Err(e) => return fail(err_of(&e)),
                }
            } else {
                let o = klseek(fd, 0, libc::SEEK_CUR);
                if o < 0 {
                    return -1;
                }
                o
            };
            let r = file.write_at(off as u64, data);
            if let Ok(n) = r {
                if pos.is_none() {
                    klseek(fd, off + n as i64, libc::SEEK_SET);
                }
            }
            r
        }
    };
    match r {
        Ok(n) => {
            count(C::BytesWritten, n as u64);
            if s.retired.load(Ordering::SeqCst) {
                // The file was mapped while this write was on its way:
                // what the mapping shows must include it.
                s.dirty.store(true, Ordering::SeqCst);
                invalidate(fd, s);
                refresh_size(fd);
            }
            match if s.sync { flush(s) } else { 0 } {
                0 => n as ssize_t,
                e => fail(e),
            }
        }
        Err(e) => fail(err_of(&e)),
    }
}

unsafe fn iovs<'a>(iov: *const iovec, cnt: c_int) -> Option<&'a [iovec]> {
    if !(0..=IOV_MAX).contains(&cnt) || (cnt > 0 && iov.is_null()) {
        return None;
    }
    if cnt == 0 {
        return Some(&[]);
    }
    Some(std::slice::from_raw_parts(iov, cnt as usize))
}

unsafe fn do_readv(
    fd: c_int,
    s: &Shared,
    iov: *const iovec,
    cnt: c_int,
    pos: Option<i64>,
) -> ssize_t {
    let Some(v) = iovs(iov, cnt) else {
        return fail(libc::EINVAL);
    };
    if v.len() == 1 {
        let b = slice_mut(v[0].iov_base, v[0].iov_len);
        return do_read(fd, s, b, pos);
    }
    let total: usize = v.iter().map(|x| x.iov_len).sum();
    let mut tmp = vec![0u8; total];
    let n = do_read(fd, s, &mut tmp, pos);
    if n > 0 {
        let mut at = 0usize;
        for x in v {
            if at >= n as usize {
                break;
            }
            let k = x.iov_len.min(n as usize - at);
            std::ptr::copy_nonoverlapping(tmp.as_ptr().add(at), x.iov_base as *mut u8, k);
            at += k;
        }
    }
    n
}

unsafe fn do_writev(
    fd: c_int,
    s: &Shared,
    iov: *const iovec,
    cnt: c_int,
    pos: Option<i64>,
) -> ssize_t {
    let Some(v) = iovs(iov, cnt) else {
        return fail(libc::EINVAL);
    };
    if v.len() == 1 {
        return do_write(fd, s, slice(v[0].iov_base, v[0].iov_len), pos);
    }
    let mut tmp = Vec::with_capacity(v.iter().map(|x| x.iov_len).sum());
    for x in v {
        tmp.extend_from_slice(slice(x.iov_base, x.iov_len));
    }
    do_write(fd, s, &tmp, pos)
}

unsafe fn slice<'a>(p: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 || p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p as *const u8, n)
    }
}

unsafe fn slice_mut<'a>(p: *mut c_void, n: usize) -> &'a mut [u8] {
    if n == 0 || p.is_null() {
        &mut []
    } else {
        std::slice::from_raw_parts_mut(p as *mut u8, n)
    }
}

fn do_lseek(fd: c_int, s: &Shared, off: i64, whence: c_int) -> off_t {
    count(C::Seeks, 1);
    match whence {
        libc::SEEK_SET | libc::SEEK_CUR => klseek(fd, off, whence),
        libc::SEEK_END | libc::SEEK_DATA | libc::SEEK_HOLE => {
            let size = match s.file().and_then(|f| f.size().map_err(|e| err_of(&e))) {
                Ok(z) => z as i64,
                Err(e) => return fail(e) as off_t,
            };
            let _g = s.io.lock();
            let to = match whence {
                libc::SEEK_END => size.checked_add(off).unwrap_or(-1),
                // No holes are reported: all of [0, size) is data.
                _ if off < 0 => return fail(libc::EINVAL) as off_t,
                _ if off >= size => return fail(libc::ENXIO) as off_t,
                libc::SEEK_DATA => off,
                _ => size,
            };
            if to < 0 {
                return fail(libc::EINVAL) as off_t;
            }
            klseek(fd, to, libc::SEEK_SET)
        }
        _ => klseek(fd, off, whence),
    }
}

unsafe fn do_fstat(fd: c_int, s: &Shared, st: *mut libc::stat) -> c_int {
    count(C::Stats, 1);
    invalidate(fd, s);
    if sys_fstat(fd, st) != 0 {
        return -1; // errno set by syscall(2)
    }
    if let Ok(size) = s.file().and_then(|f| f.size().map_err(|e| err_of(&e))) {
        (*st).st_size = size as i64;
        (*st).st_blocks = size.div_ceil(512) as i64;
    }
    0
}

fn do_truncate(fd: c_int, s: &Shared, len: i64) -> c_int {
    count(C::Truncates, 1);
    if len < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    if s.acc == libc::O_RDONLY {
        set_errno(libc::EINVAL);
        return -1;
    }
    match s
        .file()
        .and_then(|f| f.truncate(len as u64).map_err(|e| err_of(&e)))
    {
        Ok(()) => {
            s.dirty.store(true, Ordering::Release);
            invalidate(fd, s);
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// fsync (`meta`) and fdatasync. Engines acknowledge a write once written
/// (it survives the crash of any process); the flush makes it survive a
/// power cut. fsync also records the size and mtime and refreshes the
/// kernel's view; fdatasync leaves that to close, fstat or fsync (the size
/// lives with the data; the entry's update would wait behind the bulk
/// writes in flight, and halved the throughput of a write+fdatasync loop).
fn do_sync(fd: c_int, s: &Shared, meta: bool) -> c_int {
    if meta {
        invalidate(fd, s);
    }
    match flush(s) {
        0 => 0,
        e => fail(e) as c_int,
    }
}

/// Flush the file's acknowledged writes from the engines' device caches:
/// 0, or an errno.
fn flush(s: &Shared) -> c_int {
    count(C::Syncs, 1);
    match s.file().and_then(|f| f.sync().map_err(|e| err_of(&e))) {
        Ok(()) => 0,
        Err(e) => e,
    }
}

/// Before `fd` goes away (close, dup2 over it, fclose).
fn forget_fd(fd: c_int) {
    if let Some(s) = remove(fd) {
        count(C::Closes, 1);
        invalidate(fd, &s);
    }
}

// ------------------------------------------------------------ interposers

macro_rules! open_like {
    ($name:ident, $real:ident, ($($a:ident : $t:ty),*), ($($call:expr),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            let fd = $real()($($call),*);
            if fd >= 0 && enabled() {
                maybe_track(fd);
            }
            fd
        }
    };
}

// SAFETY (all interposers): they have the C prototypes of the glibc
// functions they replace, forward untouched arguments to the real ones and
// only dereference caller pointers the way the real function would.
open_like!(open, r_open, (p: *const c_char, f: c_int, m: c_uint), (p, f, m));
open_like!(open64, r_open64, (p: *const c_char, f: c_int, m: c_uint), (p, f, m));
open_like!(openat, r_openat, (d: c_int, p: *const c_char, f: c_int, m: c_uint), (d, p, f, m));
open_like!(openat64, r_openat64, (d: c_int, p: *const c_char, f: c_int, m: c_uint), (d, p, f, m));
open_like!(__open_2, r_open_2, (p: *const c_char, f: c_int), (p, f));
open_like!(__open64_2, r_open64_2, (p: *const c_char, f: c_int), (p, f));
open_like!(__openat_2, r_openat_2, (d: c_int, p: *const c_char, f: c_int), (d, p, f));
open_like!(__openat64_2, r_openat64_2, (d: c_int, p: *const c_char, f: c_int), (d, p, f));
open_like!(creat, r_creat, (p: *const c_char, m: libc::mode_t), (p, m));
open_like!(creat64, r_creat64, (p: *const c_char, m: libc::mode_t), (p, m));

unsafe fn after_fopen(f: *mut FILE) -> *mut FILE {
    if !f.is_null() && enabled() {
        maybe_track(libc::fileno(f));
    }
    f
}

#[no_mangle]
pub unsafe extern "C" fn fopen(p: *const c_char, m: *const c_char) -> *mut FILE {
    after_fopen(r_fopen()(p, m))
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(p: *const c_char, m: *const c_char) -> *mut FILE {
    after_fopen(r_fopen64()(p, m))
}

unsafe fn mmap_any(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
    real: MmapFn,
) -> *mut c_void {
    if fd >= 0 && flags & libc::MAP_ANONYMOUS == 0 && enabled() {
        if let Some(_b) = Busy::enter() {
            let e = *libc::__errno_location();
            guarded((), || before_map(fd));
            set_errno(e);
        }
    }
    real(addr, len, prot, flags, fd, off)
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    mmap_any(addr, len, prot, flags, fd, off, r_mmap())
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    mmap_any(addr, len, prot, flags, fd, off, r_mmap64())
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_read(fd, &s, slice_mut(buf, n), None));
    }
    r_read()(fd, buf, n)
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    len: size_t,
) -> ssize_t {
    if n > len {
        return r_read_chk()(fd, buf, n, len); // aborts: buffer overflow
    }
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_read(fd, &s, slice_mut(buf, n), None));
    }
    r_read_chk()(fd, buf, n, len)
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_write(fd, &s, slice(buf, n), None));
    }
    r_write()(fd, buf, n)
}

macro_rules! pread_like {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            buf: *mut c_void,
            n: size_t,
            off: off_t,
        ) -> ssize_t {
            if let Some((_b, s)) = tracked(fd) {
                return guarded(-1, || do_read(fd, &s, slice_mut(buf, n), Some(off)));
            }
            $real()(fd, buf, n, off)
        }
    };
}
pread_like!(pread, r_pread);
pread_like!(pread64, r_pread64);

macro_rules! pread_chk_like {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            buf: *mut c_void,
            n: size_t,
            off: off_t,
            len: size_t,
        ) -> ssize_t {
            if n <= len {
                if let Some((_b, s)) = tracked(fd) {
                    return guarded(-1, || do_read(fd, &s, slice_mut(buf, n), Some(off)));
                }
            }
            $real()(fd, buf, n, off, len)
        }
    };
}
pread_chk_like!(__pread_chk, r_pread_chk);
pread_chk_like!(__pread64_chk, r_pread64_chk);

macro_rules! pwrite_like {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            buf: *const c_void,
            n: size_t,
            off: off_t,
        ) -> ssize_t {
            if let Some((_b, s)) = tracked(fd) {
                return guarded(-1, || do_write(fd, &s, slice(buf, n), Some(off)));
            }
            $real()(fd, buf, n, off)
        }
    };
}
pwrite_like!(pwrite, r_pwrite);
pwrite_like!(pwrite64, r_pwrite64);

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_readv(fd, &s, iov, cnt, None));
    }
    r_readv()(fd, iov, cnt)
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_writev(fd, &s, iov, cnt, None));
    }
    r_writev()(fd, iov, cnt)
}

macro_rules! pv_like {
    ($name:ident, $real:ident, $do:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const iovec,
            cnt: c_int,
            off: off_t,
        ) -> ssize_t {
            if let Some((_b, s)) = tracked(fd) {
                return guarded(-1, || $do(fd, &s, iov, cnt, Some(off)));
            }
            $real()(fd, iov, cnt, off)
        }
    };
}
pv_like!(preadv, r_preadv, do_readv);
pv_like!(preadv64, r_preadv64, do_readv);
pv_like!(pwritev, r_pwritev, do_writev);
pv_like!(pwritev64, r_pwritev64, do_writev);

macro_rules! pv2_like {
    ($name:ident, $real:ident, $do:ident, $writes:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const iovec,
            cnt: c_int,
            off: off_t,
            flags: c_int,
        ) -> ssize_t {
            // RWF_HIPRI is a hint; RWF_DSYNC and RWF_SYNC flush a write
            // as O_DSYNC would; RWF_APPEND and the rest: kernel path.
            let sync = libc::RWF_DSYNC | libc::RWF_SYNC;
            if flags & !(libc::RWF_HIPRI | sync) == 0 {
                if let Some((_b, s)) = tracked(fd) {
                    let pos = if off == -1 { None } else { Some(off) };
                    return guarded(-1, || {
                        let n = $do(fd, &s, iov, cnt, pos);
                        if n < 0 || !$writes || flags & sync == 0 || s.sync {
                            return n;
                        }
                        match flush(&s) {
                            0 => n,
                            e => fail(e),
                        }
                    });
                }
            }
            $real()(fd, iov, cnt, off, flags)
        }
    };
}
pv2_like!(preadv2, r_preadv2, do_readv, false);
pv2_like!(pwritev2, r_pwritev2, do_writev, true);
pv2_like!(preadv64v2, r_preadv64v2, do_readv, false);
pv2_like!(pwritev64v2, r_pwritev64v2, do_writev, true);

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_lseek(fd, &s, off, whence));
    }
    r_lseek()(fd, off, whence)
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_lseek(fd, &s, off, whence));
    }
    r_lseek64()(fd, off, whence)
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_sync(fd, &s, true));
    }
    r_fsync()(fd)
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_sync(fd, &s, false));
    }
    r_fdatasync()(fd)
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_truncate(fd, &s, len));
    }
    r_ftruncate()(fd, len)
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_truncate(fd, &s, len));
    }
    r_ftruncate64()(fd, len)
}

unsafe fn fstat_any(fd: c_int, st: *mut libc::stat) -> c_int {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_fstat(fd, &s, st));
    }
    // -1 and errno from syscall(2), or 0.
    sys_fstat(fd, st)
}

#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    fstat_any(fd, st)
}

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat) -> c_int {
    fstat_any(fd, st)
}

/// Binaries built against glibc < 2.33 call these (`ver` is 1 on x86-64).
#[no_mangle]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, st: *mut libc::stat) -> c_int {
    fstat_any(fd, st)
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, st: *mut libc::stat) -> c_int {
    fstat_any(fd, st)
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if NTRACKED.load(Ordering::Relaxed) != 0 && enabled() {
        if let Some(_b) = Busy::enter() {
            guarded((), || forget_fd(fd));
        }
    }
    r_close()(fd)
}

/// `new` now refers to what `old` refers to (a successful dup).
fn dup_to(old: c_int, new: c_int) {
    if new < 0 || new == old {
        return;
    }
    if let Some(s) = lookup(old) {
        if insert(new, s) {
            count(C::Dups, 1);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let r = r_dup()(fd);
    if r >= 0 && NTRACKED.load(Ordering::Relaxed) != 0 && enabled() {
        if let Some(_b) = Busy::enter() {
            remove(r);
            dup_to(fd, r);
        }
    }
    r
}

unsafe fn dup2_any(old: c_int, new: c_int, real: impl FnOnce() -> c_int) -> c_int {
    let active = NTRACKED.load(Ordering::Relaxed) != 0 && enabled() && old != new;
    let b = if active { Busy::enter() } else { None };
    if b.is_some() && lookup(new).is_some() && (lookup(old).is_some() || sys_fcntl_ok(old)) {
        // `new` is closed by the dup2: as close.
        guarded((), || forget_fd(new));
    }
    let r = real();
    if r >= 0 && b.is_some() {
        remove(r);
        dup_to(old, r);
    }
    r
}

/// Is `fd` open (dup2 fails without closing `new` if not)?
fn sys_fcntl_ok(fd: c_int) -> bool {
    // SAFETY: F_GETFD has no argument.
    unsafe { r_fcntl()(fd, libc::F_GETFD, 0) >= 0 }
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    dup2_any(old, new, || r_dup2()(old, new))
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    dup2_any(old, new, || r_dup3()(old, new, flags))
}

unsafe fn fcntl_any(fd: c_int, cmd: c_int, arg: c_ulong, real: FcntlFn) -> c_int {
    let r = real(fd, cmd, arg);
    if r < 0 || NTRACKED.load(Ordering::Relaxed) == 0 || !enabled() {
        return r;
    }
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            if let Some(_b) = Busy::enter() {
                remove(r);
                dup_to(fd, r);
            }
        }
        libc::F_SETFL => {
            if let Some((_b, s)) = tracked(fd) {
                s.append
                    .store(arg as c_int & libc::O_APPEND != 0, Ordering::Relaxed);
            }
        }
        _ => {}
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    fcntl_any(fd, cmd, arg, r_fcntl())
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    fcntl_any(fd, cmd, arg, r_fcntl64())
}

/// Read from any fd (tracked or not) for the copy emulations.
unsafe fn any_read(fd: c_int, buf: &mut [u8], pos: Option<i64>) -> ssize_t {
    match lookup(fd) {
        Some(s) => do_read(fd, &s, buf, pos),
        None => match pos {
            Some(p) => r_pread64()(fd, buf.as_mut_ptr() as *mut c_void, buf.len(), p),
            None => r_read()(fd, buf.as_mut_ptr() as *mut c_void, buf.len()),
        },
    }
}

unsafe fn any_write(fd: c_int, buf: &[u8], pos: Option<i64>) -> ssize_t {
    match lookup(fd) {
        Some(s) => do_write(fd, &s, buf, pos),
        None => match pos {
            Some(p) => r_pwrite64()(fd, buf.as_ptr() as *const c_void, buf.len(), p),
            None => r_write()(fd, buf.as_ptr() as *const c_void, buf.len()),
        },
    }
}

/// copy_file_range/sendfile with a tracked side: read then write, up to
/// 1 MiB per call (callers loop).
unsafe fn copy_emulated(
    fd_in: c_int,
    off_in: *mut i64,
    fd_out: c_int,
    off_out: *mut i64,
    len: usize,
) -> ssize_t {
    let mut buf = vec![0u8; len.min(1 << 20)];
    let pin = (!off_in.is_null()).then(|| *off_in);
    let n = any_read(fd_in, &mut buf, pin);
    if n <= 0 {
        return n;
    }
    let mut done = 0usize;
    while done < n as usize {
        let pout = (!off_out.is_null()).then(|| *off_out + done as i64);
        let w = any_write(fd_out, &buf[done..n as usize], pout);
        if w <= 0 {
            if done == 0 {
                return w;
            }
            break;
        }
        done += w as usize;
    }
    if !off_in.is_null() {
        *off_in += done as i64;
    }
    if !off_out.is_null() {
        *off_out += done as i64;
    }
    done as ssize_t
}

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if NTRACKED.load(Ordering::Relaxed) != 0 && enabled() && flags == 0 {
        if let Some(_b) = Busy::enter() {
            if lookup(fd_in).is_some() || lookup(fd_out).is_some() {
                return guarded(-1, || copy_emulated(fd_in, off_in, fd_out, off_out, len));
            }
        }
    }
    r_copy_file_range()(fd_in, off_in, fd_out, off_out, len, flags)
}

unsafe fn sendfile_any(
    out: c_int,
    inp: c_int,
    off: *mut off_t,
    n: size_t,
    real: SendfileFn,
) -> ssize_t {
    if NTRACKED.load(Ordering::Relaxed) != 0 && enabled() {
        if let Some(_b) = Busy::enter() {
            if lookup(inp).is_some() || lookup(out).is_some() {
                return guarded(-1, || copy_emulated(inp, off, out, std::ptr::null_mut(), n));
            }
        }
    }
    real(out, inp, off, n)
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    sendfile_any(out, inp, off, n, r_sendfile())
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    sendfile_any(out, inp, off, n, r_sendfile64())
}

// ------------------------------------------------------------------ stdio

extern "C" {
    fn flockfile(f: *mut FILE);
    fn funlockfile(f: *mut FILE);
}

const IOV_MAX: c_int = 1024;

/// `FILE._flags` bits (public glibc ABI, <bits/types/struct_FILE.h>).
const IO_EOF_SEEN: c_int = 0x10;
const IO_ERR_SEEN: c_int = 0x20;

/// The tracked state behind a stream, with the re-entrancy flag held.
unsafe fn stream(f: *mut FILE) -> Option<(Busy, c_int, Arc<Shared>)> {
    if f.is_null() || NTRACKED.load(Ordering::Relaxed) == 0 || !enabled() {
        return None;
    }
    let b = Busy::enter()?;
    let fd = libc::fileno(f);
    let s = lookup(fd)?;
    Some((b, fd, s))
}

unsafe fn flags_of(f: *mut FILE) -> *mut c_int {
    // `int _flags` is the first member of glibc's `struct _IO_FILE`.
    f as *mut c_int
}

/// fread on a tracked stream: flush glibc's buffer (input: the kernel
/// offset moves back to the logical position), then read unbuffered.
unsafe fn st_read(
    f: *mut FILE,
    fd: c_int,
    s: &Shared,
    p: *mut c_void,
    size: usize,
    n: usize,
) -> usize {
    let Some(total) = size.checked_mul(n) else {
        return 0;
    };
    if total == 0 {
        return 0;
    }
    count(C::Stdio, 1);
    flockfile(f);
    r_fflush()(f);
    let buf = slice_mut(p, total);
    let mut done = 0usize;
    while done < total {
        let r = do_read(fd, s, &mut buf[done..], None);
        if r < 0 {
            *flags_of(f) |= IO_ERR_SEEN;
            break;
        }
        if r == 0 {
            *flags_of(f) |= IO_EOF_SEEN;
            break;
        }
        done += r as usize;
    }
    funlockfile(f);
    done / size
}

unsafe fn st_write(
    f: *mut FILE,
    fd: c_int,
    s: &Shared,
    p: *const c_void,
    size: usize,
    n: usize,
) -> usize {
    let Some(total) = size.checked_mul(n) else {
        return 0;
    };
    if total == 0 {
        return 0;
    }
    count(C::Stdio, 1);
    flockfile(f);
    r_fflush()(f);
    let buf = slice(p, total);
    let mut done = 0usize;
    while done < total {
        let r = do_write(fd, s, &buf[done..], None);
        if r <= 0 {
            *flags_of(f) |= IO_ERR_SEEN;
            break;
        }
        done += r as usize;
    }
    funlockfile(f);
    done / size
}

#[no_mangle]
pub unsafe extern "C" fn fread(p: *mut c_void, size: size_t, n: size_t, f: *mut FILE) -> size_t {
    if let Some((_b, fd, s)) = stream(f) {
        return guarded(0, || st_read(f, fd, &s, p, size, n));
    }
    r_fread()(p, size, n, f)
}

#[no_mangle]
pub unsafe extern "C" fn fread_unlocked(
    p: *mut c_void,
    size: size_t,
    n: size_t,
    f: *mut FILE,
) -> size_t {
    if let Some((_b, fd, s)) = stream(f) {
        return guarded(0, || st_read(f, fd, &s, p, size, n));
    }
    r_fread_unlocked()(p, size, n, f)
}

#[no_mangle]
pub unsafe extern "C" fn __fread_chk(
    p: *mut c_void,
    plen: size_t,
    size: size_t,
    n: size_t,
    f: *mut FILE,
) -> size_t {
    if size.checked_mul(n).is_some_and(|t| t <= plen) {
        if let Some((_b, fd, s)) = stream(f) {
            return guarded(0, || st_read(f, fd, &s, p, size, n));
        }
    }
    r_fread_chk()(p, plen, size, n, f)
}

#[no_mangle]
pub unsafe extern "C" fn fwrite(p: *const c_void, size: size_t, n: size_t, f: *mut FILE) -> size_t {
    if let Some((_b, fd, s)) = stream(f) {
        return guarded(0, || st_write(f, fd, &s, p, size, n));
    }
    r_fwrite()(p, size, n, f)
}

#[no_mangle]
pub unsafe extern "C" fn fwrite_unlocked(
    p: *const c_void,
    size: size_t,
    n: size_t,
    f: *mut FILE,
) -> size_t {
    if let Some((_b, fd, s)) = stream(f) {
        return guarded(0, || st_write(f, fd, &s, p, size, n));
    }
    r_fwrite_unlocked()(p, size, n, f)
}

unsafe fn st_seek(f: *mut FILE, fd: c_int, s: &Shared, off: i64, whence: c_int) -> c_int {
    count(C::Stdio, 1);
    flockfile(f);
    let r = if r_fflush()(f) != 0 || do_lseek(fd, s, off, whence) < 0 {
        -1
    } else {
        *flags_of(f) &= !IO_EOF_SEEN;
        0
    };
    funlockfile(f);
    r
}

unsafe fn st_tell(f: *mut FILE, fd: c_int) -> i64 {
    count(C::Stdio, 1);
    flockfile(f);
    let r = if r_fflush()(f) != 0 {
        -1
    } else {
        klseek(fd, 0, libc::SEEK_CUR)
    };
    funlockfile(f);
    r
}

#[no_mangle]
pub unsafe extern "C" fn fseek(f: *mut FILE, off: libc::c_long, whence: c_int) -> c_int {
    if let Some((_b, fd, s)) = stream(f) {
        return guarded(-1, || st_seek(f, fd, &s, off, whence));
    }
    r_fseek()(f, off, whence)
}

#[no_mangle]
pub unsafe extern "C" fn fseeko(f: *mut FILE, off: off_t, whence: c_int) -> c_int {
    if let Some((_b, fd, s)) = stream(f) {
        return guarded(-1, || st_seek(f, fd, &s, off, whence));
    }
    r_fseeko()(f, off, whence)
}

#[no_mangle]
pub unsafe extern "C" fn fseeko64(f: *mut FILE, off: off_t, whence: c_int) -> c_int {
    if let Some((_b, fd, s)) = stream(f) {
        return guarded(-1, || st_seek(f, fd, &s, off, whence));
    }
    r_fseeko64()(f, off, whence)
}

#[no_mangle]
pub unsafe extern "C" fn ftell(f: *mut FILE) -> libc::c_long {
    if let Some((_b, fd, _s)) = stream(f) {
        return guarded(-1, || st_tell(f, fd));
    }
    r_ftell()(f)
}

#[no_mangle]
pub unsafe extern "C" fn ftello(f: *mut FILE) -> off_t {
    if let Some((_b, fd, _s)) = stream(f) {
        return guarded(-1, || st_tell(f, fd));
    }
    r_ftello()(f)
}

#[no_mangle]
pub unsafe extern "C" fn ftello64(f: *mut FILE) -> off_t {
    if let Some((_b, fd, _s)) = stream(f) {
        return guarded(-1, || st_tell(f, fd));
    }
    r_ftello64()(f)
}

#[no_mangle]
pub unsafe extern "C" fn fclose(f: *mut FILE) -> c_int {
    if let Some((_b, fd, _s)) = stream(f) {
        count(C::Stdio, 1);
        // glibc's buffer (fprintf & co.) goes out through the kernel first.
        r_fflush()(f);
        guarded((), || forget_fd(fd));
    }
    r_fclose()(f)
}

// ---------------------------------------------------- init, fork, report

/// At exit: the connections are never dropped (they live in a static), so
/// send the commits of this process's last writes before it goes, or other
/// readers of them wait for the engines to settle them (seconds).
extern "C" fn flush_commits() {
    // Another thread may hold the table while the process exits: skip then.
    if let Some(conts) = CONTS.try_lock() {
        for (_, c) in conts.iter() {
            c.pool().client().flush_commits();
        }
    }
}

extern "C" fn fork_prepare() {
    // Hold the tables across fork so the child gets them consistent.
    std::mem::forget(FDS.write());
    std::mem::forget(CONTS.lock());
    std::mem::forget(MOUNTS.lock());
    std::mem::forget(MAPPED.lock());
}

extern "C" fn fork_parent() {
    // SAFETY: locked by fork_prepare in this thread.
    unsafe {
        MAPPED.force_unlock();
        MOUNTS.force_unlock();
        CONTS.force_unlock();
        FDS.force_unlock_write();
    }
}

extern "C" fn fork_child() {
    // SAFETY: locked by fork_prepare in the thread that forked (this one).
    // MAPPED is kept: the child inherits the parent's mappings.
    unsafe {
        MAPPED.force_unlock();
        MOUNTS.force_unlock();
        CONTS.force_unlock();
        FDS.force_unlock_write();
    }
    // Connections belong to the parent: leak them (dropping could touch
    // locks held by the parent's other threads, or their sockets).
    std::mem::forget(std::mem::take(&mut *CONTS.lock()));
    // Fresh locks and no File per tracked description (dup'ed fds keep
    // sharing one state); the child reconnects on first use.
    let mut t = FDS.write();
    let old = std::mem::take(&mut *t);
    let mut new: Vec<Option<Arc<Shared>>> = Vec::with_capacity(old.len());
    let mut map: Vec<(*const Shared, Arc<Shared>)> = Vec::new();
    for e in &old {
        new.push(e.as_ref().map(|s| {
            let p = Arc::as_ptr(s);
            if let Some((_, n)) = map.iter().find(|(q, _)| *q == p) {
                return n.clone();
            }
            let n = Arc::new(s.fresh_copy());
            map.push((p, n.clone()));
            n
        }));
    }
    std::mem::forget(old);
    *t = new;
    for c in &COUNTS {
        c.store(0, Ordering::Relaxed);
    }
}

extern "C" fn il_init() {
    probe::answer();
    if !enabled() {
        return;
    }
    // SAFETY: registering static handlers.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        libc::atexit(flush_commits);
        if env_on(b"PEREGRINE_IL_REPORT\0") {
            let fd = r_fcntl()(2, libc::F_DUPFD_CLOEXEC, 900);
            REPORT_FD.store(fd, Ordering::Relaxed);
            libc::atexit(report);
        }
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = il_init;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_devices() {
        let t = b"22 1 0:21 / /proc rw - proc proc rw\n\
                  99 30 0:77 / /mnt/a\\040b rw,nosuid - fuse.peregrine peregrine rw,user_id=0\n\
                  100 30 0:78 / /mnt/c rw - fuse.sshfs x rw\n";
        assert_eq!(peregrine_devs(t), vec![(0, 77)]);
    }

    #[test]
    fn handle_layout() {
        let mut b = [0u8; HANDLE_SIZE];
        b[0] = 1;
        b[4] = 1;
        b[8] = 0xaa;
        b[24] = 0xbb;
        b[40..48].copy_from_slice(&7u64.to_ne_bytes());
        b[48..56].copy_from_slice(&9u64.to_ne_bytes());
        b[56..64].copy_from_slice(&(1u64 << 20).to_ne_bytes());
        b[80..94].copy_from_slice(b"127.0.0.1:1000");
        let h = Handle::parse(&b).unwrap();
        assert!(h.read_only);
        assert_eq!(h.pool[0], 0xaa);
        assert_eq!(h.cont[0], 0xbb);
        assert_eq!((h.oid.hi, h.oid.lo, h.chunk), (7, 9, 1 << 20));
        assert_eq!(h.mgmt, "127.0.0.1:1000");
        b[0] = 2;
        assert!(Handle::parse(&b).is_none());
        assert_eq!(IOC_GET_HANDLE, 0x80d0_5001);
        assert_eq!(IOC_INVALIDATE, 0x5002);
    }
}
