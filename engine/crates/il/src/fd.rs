//! The interposers of the descriptor calls: close, dup, dup2, dup3, fcntl,
//! and the copies between descriptors (copy_file_range, sendfile).

use crate::io::{do_read, do_write, forget_fd};
use crate::real::{
    r_close, r_copy_file_range, r_dup, r_dup2, r_dup3, r_fcntl, r_fcntl64, r_pread64, r_pwrite64,
    r_read, r_sendfile, r_sendfile64, r_write, FcntlFn, SendfileFn,
};
use crate::report::{count, enabled, Busy, C};
use crate::table::{guarded, insert, lookup, remove, tracked, NTRACKED};
use libc::{c_int, c_uint, c_ulong, c_void, off64_t, off_t, size_t, ssize_t};
use std::sync::atomic::Ordering;

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    crate::place::fd_taken(fd);
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
            crate::place::keep_off_std(new);
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
    crate::place::fd_taken(new);
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
    // A placeholder: the flags it was opened with; locks, leases, seals...
    // are the real file's (converted first).
    let before = match tracked(fd) {
        Some((_b, s)) => match crate::place::of(&s) {
            Some(p) => match cmd {
                libc::F_GETFL => Some(Ok(crate::place::f_getfl(p, &s))),
                // The shared memfd's flags are every read-only
                // placeholder's (place.rs): only O_APPEND means anything
                // to the library, which keeps it.
                libc::F_SETFL if crate::place::own_offset(&s).is_some() => {
                    s.append
                        .store(arg as c_int & libc::O_APPEND != 0, Ordering::Relaxed);
                    Some(Ok(0))
                }
                libc::F_DUPFD
                | libc::F_DUPFD_CLOEXEC
                | libc::F_GETFD
                | libc::F_SETFD
                | libc::F_SETFL => None,
                _ => guarded(Some(Err(libc::EIO)), || {
                    crate::place::to_kernel(fd).err().map(Err)
                }),
            },
            None => None,
        },
        None => None,
    };
    match before {
        Some(Ok(v)) => return v,
        Some(Err(e)) => {
            crate::real::set_errno(e);
            return -1;
        }
        None => {}
    }
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
