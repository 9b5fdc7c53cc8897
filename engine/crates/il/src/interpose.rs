//! The interposers of the open, read, write, seek, sync, truncate and stat
//! calls.

use crate::io::{
    do_fstat, do_lseek, do_read, do_readv, do_sync, do_truncate, do_write, do_writev, fail, flush,
    slice, slice_mut,
};
use crate::real::{
    r_creat, r_creat64, r_fdatasync, r_fdopen, r_fopen, r_fopen64, r_fsync, r_ftruncate,
    r_ftruncate64, r_lseek, r_lseek64, r_open, r_open64, r_open64_2, r_open_2, r_openat,
    r_openat64, r_openat64_2, r_openat_2, r_pread, r_pread64, r_pread64_chk, r_pread_chk, r_preadv,
    r_preadv2, r_preadv64, r_preadv64v2, r_pwrite, r_pwrite64, r_pwritev, r_pwritev2, r_pwritev64,
    r_pwritev64v2, r_read, r_read_chk, r_readv, r_write, r_writev, sys_fstat,
};
use crate::report::enabled;
use crate::table::{guarded, tracked};
use crate::track::maybe_track;
use libc::{c_char, c_int, c_uint, c_void, iovec, off_t, size_t, ssize_t, FILE};

macro_rules! open_like {
    ($name:ident, $real:ident, ($($a:ident : $t:ty),*), ($($call:expr),*), $served:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            let (d, p, f, m): (c_int, *const c_char, c_int, libc::mode_t) = $served;
            if let Some(r) = crate::place::open_at(d, p, f, m) {
                return r;
            }
            let fd = $real()($($call),*);
            if fd >= 0 && enabled() {
                if f & (libc::O_CREAT | libc::O_TRUNC) != 0 {
                    kernel_made_or_emptied(fd);
                }
                maybe_track(fd);
            }
            fd
        }
    };
}

// SAFETY (all interposers): they have the C prototypes of the glibc
// functions they replace, forward untouched arguments to the real ones and
// only dereference caller pointers the way the real function would.
// The last argument: (dirfd, path, flags, mode) for the library's own
// open (`__open_2` & co. are the fortified forms without O_CREAT).
const CWD: c_int = libc::AT_FDCWD;
const CREAT: c_int = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
open_like!(open, r_open, (p: *const c_char, f: c_int, m: c_uint), (p, f, m), (CWD, p, f, m));
open_like!(open64, r_open64, (p: *const c_char, f: c_int, m: c_uint), (p, f, m), (CWD, p, f, m));
open_like!(openat, r_openat, (d: c_int, p: *const c_char, f: c_int, m: c_uint), (d, p, f, m), (d, p, f, m));
open_like!(openat64, r_openat64, (d: c_int, p: *const c_char, f: c_int, m: c_uint), (d, p, f, m), (d, p, f, m));
open_like!(__open_2, r_open_2, (p: *const c_char, f: c_int), (p, f), (CWD, p, f, 0));
open_like!(__open64_2, r_open64_2, (p: *const c_char, f: c_int), (p, f), (CWD, p, f, 0));
open_like!(__openat_2, r_openat_2, (d: c_int, p: *const c_char, f: c_int), (d, p, f), (d, p, f, 0));
open_like!(__openat64_2, r_openat64_2, (d: c_int, p: *const c_char, f: c_int), (d, p, f), (d, p, f, 0));
open_like!(creat, r_creat, (p: *const c_char, m: libc::mode_t), (p, m), (CWD, p, CREAT, m));
open_like!(creat64, r_creat64, (p: *const c_char, m: libc::mode_t), (p, m), (CWD, p, CREAT, m));

/// After a kernel open that may have made or emptied a file: if it is in
/// a Peregrine mount, what the path-call cache holds of it and of its
/// directory may be stale (size, entries, directory times).
fn kernel_made_or_emptied(fd: c_int) {
    if crate::report::meta_enabled() && crate::track::peregrine_file(fd).is_some() {
        crate::cache::clear();
    }
}

unsafe fn after_fopen(f: *mut FILE, mode: *const c_char) -> *mut FILE {
    if !f.is_null() && enabled() {
        let fd = libc::fileno(f);
        // "w" empties or makes, "a" makes.
        if std::ffi::CStr::from_ptr(mode)
            .to_bytes()
            .first()
            .is_some_and(|&c| c == b'w' || c == b'a')
        {
            kernel_made_or_emptied(fd);
        }
        maybe_track(fd);
    }
    f
}

#[no_mangle]
pub unsafe extern "C" fn fopen(p: *const c_char, m: *const c_char) -> *mut FILE {
    after_fopen(r_fopen()(p, m), m)
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(p: *const c_char, m: *const c_char) -> *mut FILE {
    after_fopen(r_fopen64()(p, m), m)
}

/// A stream on a placeholder would read and write the memfd with glibc's
/// internal calls (stray.rs): the placeholder becomes the real file first.
#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, m: *const c_char) -> *mut FILE {
    if let Some((_b, s)) = tracked(fd) {
        if crate::place::of(&s).is_some() {
            if let Err(e) = guarded(Err(libc::EIO), || crate::place::to_kernel(fd)) {
                crate::real::set_errno(e);
                return std::ptr::null_mut();
            }
        }
    }
    r_fdopen()(fd, m)
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
    crate::nsops::after_kernel_change_on(fd, r_ftruncate()(fd, len))
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    if let Some((_b, s)) = tracked(fd) {
        return guarded(-1, || do_truncate(fd, &s, len));
    }
    crate::nsops::after_kernel_change_on(fd, r_ftruncate64()(fd, len))
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
