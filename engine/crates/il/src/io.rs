//! I/O on a tracked descriptor through the store: read, write, vectors,
//! seek, stat, truncate, sync.

use crate::mmap::refresh_size;
use crate::real::{r_lseek, set_errno, sys_fstat};
use crate::report::{count, C};
use crate::table::{err_of, remove, Shared};
use crate::track::invalidate;
use libc::{c_int, c_void, iovec, off_t, ssize_t};
use std::sync::atomic::Ordering;

const IOV_MAX: c_int = 1024;

pub(crate) fn fail(e: c_int) -> ssize_t {
    set_errno(e);
    -1
}

pub(crate) fn klseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    // SAFETY: real lseek on a tracked fd (local in FUSE for SET/CUR).
    unsafe { r_lseek()(fd, off, whence) }
}

/// The file offset of tracked `fd`: the kernel's, or a read-only
/// placeholder's own (place.rs). The caller holds `s.io`.
fn offset(fd: c_int, s: &Shared) -> off_t {
    match crate::place::own_offset(s) {
        Some(o) => o.load(Ordering::Relaxed),
        None => klseek(fd, 0, libc::SEEK_CUR),
    }
}

/// Move [`offset`] to `to` (>= 0). The caller holds `s.io`.
fn set_offset(fd: c_int, s: &Shared, to: off_t) -> off_t {
    match crate::place::own_offset(s) {
        Some(o) => {
            o.store(to, Ordering::Relaxed);
            to
        }
        None => klseek(fd, to, libc::SEEK_SET),
    }
}

/// The kernel offset of `fd` for a write of `len` bytes there, and
/// whether it was moved past them already: one `lseek` (moving it on
/// answers where it was) where asking and then setting took two. A write
/// does all it was asked or fails: the caller moves the offset back if it
/// failed, or on if it was not moved (past the largest offset). None, with
/// errno, if the offset cannot be read. The caller holds the description's
/// `io` lock.
fn offset_for_write(fd: c_int, len: usize) -> Option<(i64, bool)> {
    match klseek(fd, len as off_t, libc::SEEK_CUR) {
        e if e >= 0 => Some((e - len as i64, true)),
        _ => match klseek(fd, 0, libc::SEEK_CUR) {
            o if o >= 0 => Some((o, false)),
            _ => None,
        },
    }
}

/// Read into `buf` at `pos` (or at and advancing the kernel offset).
pub(crate) fn do_read(fd: c_int, s: &Shared, buf: &mut [u8], pos: Option<i64>) -> ssize_t {
    if s.acc == libc::O_WRONLY {
        return fail(libc::EBADF);
    }
    if let Some(b) = crate::place::of(s).and_then(|p| p.cached_bytes()) {
        return read_cached(fd, s, &b, buf, pos);
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
            let off = offset(fd, s);
            if off < 0 {
                return -1;
            }
            let n = match file.read_at(off as u64, buf) {
                Ok(n) => n,
                Err(e) => return fail(err_of(&e)),
            };
            if n > 0 {
                set_offset(fd, s, off + n as i64);
            }
            n
        }
    };
    count(C::BytesRead, n as u64);
    n as ssize_t
}

/// [`do_read`] of a file whose bytes are `b` (data_cache.rs).
fn read_cached(fd: c_int, s: &Shared, b: &[u8], buf: &mut [u8], pos: Option<i64>) -> ssize_t {
    count(C::Reads, 1);
    count(C::CachedReads, 1);
    let mut copy = |off: i64| {
        let from = (off as usize).min(b.len());
        let n = (b.len() - from).min(buf.len());
        buf[..n].copy_from_slice(&b[from..from + n]);
        n
    };
    let n = match pos {
        Some(p) if p < 0 => return fail(libc::EINVAL),
        Some(p) => copy(p),
        None => {
            let _g = s.io.lock();
            let off = offset(fd, s);
            if off < 0 {
                return -1;
            }
            let n = copy(off);
            if n > 0 {
                set_offset(fd, s, off + n as i64);
            }
            n
        }
    };
    count(C::BytesRead, n as u64);
    n as ssize_t
}

/// Write `data` at `pos` (or at and advancing the kernel offset; O_APPEND:
/// at the store's end of file).
pub(crate) fn do_write(fd: c_int, s: &Shared, data: &[u8], pos: Option<i64>) -> ssize_t {
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
    let before = crate::cache::drop_attr(s.h.oid);
    let append = s.append.load(Ordering::Relaxed);
    let (off, r) = match pos {
        // pwrite on O_APPEND appends on Linux.
        Some(p) if !append => {
            if p < 0 {
                return fail(libc::EINVAL);
            }
            (p, file.write_at(p as u64, data))
        }
        None if !append => {
            let _g = s.io.lock();
            let Some((off, moved)) = offset_for_write(fd, data.len()) else {
                return -1;
            };
            let r = file.write_at(off as u64, data);
            match (&r, moved) {
                (Ok(n), false) => {
                    klseek(fd, off + *n as i64, libc::SEEK_SET);
                }
                (Err(_), true) => {
                    klseek(fd, off, libc::SEEK_SET);
                }
                _ => {}
            }
            (off, r)
        }
        _ => {
            let _g = s.io.lock();
            let off = match file.size() {
                Ok(sz) => sz as i64,
                Err(e) => return fail(err_of(&e)),
            };
            let r = file.write_at(off as u64, data);
            if let Ok(n) = r {
                if pos.is_none() {
                    klseek(fd, off + n as i64, libc::SEEK_SET);
                }
            }
            (off, r)
        }
    };
    // Stamped again now that the store holds it (data_cache.rs).
    let after = crate::data_cache::changed(s.h.oid);
    if let Some(p) = crate::place::of(s) {
        let written = r.as_ref().ok().map(|&n| &data[..n]);
        p.wrote(before, after, off as u64, written);
    }
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

pub(crate) unsafe fn do_readv(
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

pub(crate) unsafe fn do_writev(
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

pub(crate) unsafe fn slice<'a>(p: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 || p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p as *const u8, n)
    }
}

pub(crate) unsafe fn slice_mut<'a>(p: *mut c_void, n: usize) -> &'a mut [u8] {
    if n == 0 || p.is_null() {
        &mut []
    } else {
        std::slice::from_raw_parts_mut(p as *mut u8, n)
    }
}

pub(crate) fn do_lseek(fd: c_int, s: &Shared, off: i64, whence: c_int) -> off_t {
    count(C::Seeks, 1);
    if crate::place::own_offset(s).is_some() {
        let _g = s.io.lock();
        // Converted meanwhile (another thread): the kernel's offset then.
        if let Some(o) = crate::place::own_offset(s) {
            let to = match whence {
                libc::SEEK_SET => off,
                libc::SEEK_CUR => match o.load(Ordering::Relaxed).checked_add(off) {
                    Some(to) => to,
                    None => return fail(libc::EOVERFLOW) as off_t,
                },
                _ => -1,
            };
            if to >= 0 {
                o.store(to, Ordering::Relaxed);
                return to;
            }
            if matches!(whence, libc::SEEK_SET | libc::SEEK_CUR) {
                return fail(libc::EINVAL) as off_t;
            }
        }
    }
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
            set_offset(fd, s, to)
        }
        _ if crate::place::own_offset(s).is_some() => fail(libc::EINVAL) as off_t,
        _ => klseek(fd, off, whence),
    }
}

pub(crate) unsafe fn do_fstat(fd: c_int, s: &Shared, st: *mut libc::stat) -> c_int {
    if let Some(p) = crate::place::of(s) {
        crate::place::record(s, p);
        return crate::place::fstat_into(s, p, crate::stat::Out::Stat(st));
    }
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

pub(crate) fn do_truncate(fd: c_int, s: &Shared, len: i64) -> c_int {
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
            crate::cache::drop_attr(s.h.oid);
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
pub(crate) fn do_sync(fd: c_int, s: &Shared, meta: bool) -> c_int {
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
pub(crate) fn flush(s: &Shared) -> c_int {
    count(C::Syncs, 1);
    match s.file().and_then(|f| f.sync().map_err(|e| err_of(&e))) {
        Ok(()) => 0,
        Err(e) => e,
    }
}

/// Before `fd` goes away (close, dup2 over it, fclose).
pub(crate) fn forget_fd(fd: c_int) {
    if let Some(s) = remove(fd) {
        count(C::Closes, 1);
        invalidate(fd, &s);
    }
}
