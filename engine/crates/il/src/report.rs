//! Switches (`PEREGRINE_IL_DISABLE`, the re-entrancy flag) and counters
//! (`PEREGRINE_IL_REPORT`: the line printed at exit).

use libc::c_char;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

// --------------------------------------------------------------- switches

/// 0 unknown, 1 on, 2 off (PEREGRINE_IL_DISABLE).
static MODE: AtomicU8 = AtomicU8::new(0);

pub(crate) fn env_on(name: &[u8]) -> bool {
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

/// A number in the environment (getenv: no allocation, safe before the
/// program's own init), if set and valid.
pub(crate) fn env_u64(name: &std::ffi::CStr) -> Option<u64> {
    // SAFETY: getenv with a NUL-terminated name; the result is read at once.
    unsafe {
        let p = libc::getenv(name.as_ptr());
        if p.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(p)
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    }
}

#[inline]
pub(crate) fn enabled() -> bool {
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

/// 0 unknown, 1 on, 2 off (`PEREGRINE_IL_METADATA=0`).
static META: AtomicU8 = AtomicU8::new(0);

/// Path calls (stat, access, mkdir, unlink, rmdir, rename, open) served
/// through the library: on unless `PEREGRINE_IL_METADATA` is `0`, `false`,
/// `no` or `off` (see "Path calls" in the crate docs). Data interception
/// does not depend on it.
#[inline]
pub(crate) fn meta_enabled() -> bool {
    match META.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            // SAFETY: getenv with a NUL-terminated name; read at once.
            let refused = unsafe {
                let p = libc::getenv(c"PEREGRINE_IL_METADATA".as_ptr());
                !p.is_null() && {
                    let v = std::ffi::CStr::from_ptr(p).to_bytes();
                    v == b"0"
                        || v.eq_ignore_ascii_case(b"false")
                        || v.eq_ignore_ascii_case(b"no")
                        || v.eq_ignore_ascii_case(b"off")
                }
            };
            let on = enabled() && !refused;
            META.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
    }
}

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// The library is at work on this thread (nested calls pass through).
pub(crate) struct Busy;

impl Busy {
    pub(crate) fn enter() -> Option<Busy> {
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
pub(crate) enum C {
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
    /// Path calls served by the library.
    PathStats,
    PathAccess,
    Mkdirs,
    Unlinks,
    Rmdirs,
    Renames,
    PathOpens,
    PathCreates,
    /// Directory entries listed by the library.
    Readdirs,
    /// Path calls into a Peregrine mount handed to the kernel.
    PathFallbacks,
    /// Bytes written to placeholders around the library (stray.rs).
    StrayBytes,
    /// Reads answered from this process's own writes (data_cache.rs).
    CachedReads,
    N,
}

pub(crate) static COUNTS: [AtomicU64; C::N as usize] = [const { AtomicU64::new(0) }; C::N as usize];

#[inline]
pub(crate) fn count(c: C, n: u64) {
    COUNTS[c as usize].fetch_add(n, Ordering::Relaxed);
}

/// Why the library first fell back to the kernel path (or failed to reach
/// the store), for the report: a silent fallback only looks slow.
static FIRST_FAILURE: OnceLock<String> = OnceLock::new();

pub(crate) fn note_failure(why: String) {
    let _ = FIRST_FAILURE.set(why);
}

fn counts() -> [u64; C::N as usize] {
    std::array::from_fn(|i| COUNTS[i].load(Ordering::Relaxed))
}

pub(crate) extern "C" fn report() {
    let _b = Busy::enter();
    let c = counts();
    let first_failure = FIRST_FAILURE
        .get()
        .map(|w| format!(" first_failure={w:?}"))
        .unwrap_or_default();
    let line = format!(
        "peregrine-il[{}]: intercepted opens={} reads={} writes={} bytes_read={} bytes_written={} \
         seeks={} stats={} syncs={} truncates={} dups={} closes={} stdio={} invalidates={} \
         fallbacks={} mmaps={} path_stats={} path_access={} mkdirs={} unlinks={} rmdirs={} \
         renames={} path_opens={} path_creates={} readdirs={} path_fallbacks={} stray_bytes={} cached_reads={}{first_failure}\n",
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
        c[C::PathStats as usize],
        c[C::PathAccess as usize],
        c[C::Mkdirs as usize],
        c[C::Unlinks as usize],
        c[C::Rmdirs as usize],
        c[C::Renames as usize],
        c[C::PathOpens as usize],
        c[C::PathCreates as usize],
        c[C::Readdirs as usize],
        c[C::PathFallbacks as usize],
        c[C::StrayBytes as usize],
        c[C::CachedReads as usize],
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
pub(crate) static REPORT_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
