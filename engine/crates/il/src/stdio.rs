//! stdio on a `FILE*` whose descriptor is tracked.

use crate::io::{do_lseek, do_read, do_write, forget_fd, klseek, slice, slice_mut};
use crate::real::{
    r_fclose, r_fflush, r_fread, r_fread_chk, r_fread_unlocked, r_fseek, r_fseeko, r_fseeko64,
    r_ftell, r_ftello, r_ftello64, r_fwrite, r_fwrite_unlocked,
};
use crate::report::{count, enabled, Busy, C};
use crate::table::{guarded, lookup, Shared, NTRACKED};
use libc::{c_int, c_void, off_t, size_t, FILE};
use std::sync::atomic::Ordering;
use std::sync::Arc;

extern "C" {
    fn flockfile(f: *mut FILE);
    fn funlockfile(f: *mut FILE);
}

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
    if s.append.load(Ordering::Relaxed) {
        // An append stream stays on the kernel path: glibc writes what
        // it buffers (fputs, putc, fprintf...) with its internal write,
        // and the kernel appends that at the size it knows, which writes
        // through the library would leave behind (mawk's `print >>`
        // overwrote its own first bytes).
        crate::cache::drop_attr(s.h.oid);
        return None;
    }
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
