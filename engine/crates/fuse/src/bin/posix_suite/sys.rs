//! Thin libc wrappers returning the errno, and the data model (length + hash).

// Re-exported for the check modules, which glob-import this one.
pub(crate) use libc::{c_char, c_int, c_uint, c_void};
pub(crate) use std::ffi::{CStr, CString};
pub(crate) use std::fmt::Debug;
use std::os::unix::ffi::OsStrExt;
pub(crate) use std::path::{Path, PathBuf};
pub(crate) use std::time::Duration;

use crate::MIB;

/// An errno value, shown by name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct E(pub(crate) i32);

impl Debug for E {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = match self.0 {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::EIO => "EIO",
            libc::ENXIO => "ENXIO",
            libc::EBADF => "EBADF",
            libc::EACCES => "EACCES",
            libc::EBUSY => "EBUSY",
            libc::EEXIST => "EEXIST",
            libc::EXDEV => "EXDEV",
            libc::ENOTDIR => "ENOTDIR",
            libc::EISDIR => "EISDIR",
            libc::EINVAL => "EINVAL",
            libc::EFBIG => "EFBIG",
            libc::ENOSPC => "ENOSPC",
            libc::EROFS => "EROFS",
            libc::EMLINK => "EMLINK",
            libc::ERANGE => "ERANGE",
            libc::ENAMETOOLONG => "ENAMETOOLONG",
            libc::ENOTEMPTY => "ENOTEMPTY",
            libc::ELOOP => "ELOOP",
            libc::ENODATA => "ENODATA",
            libc::EOPNOTSUPP => "EOPNOTSUPP",
            libc::ENOTCONN => "ENOTCONN",
            libc::ENOSYS => "ENOSYS",
            libc::E2BIG => "E2BIG",
            libc::EAGAIN => "EAGAIN",
            libc::EADDRINUSE => "EADDRINUSE",
            libc::ECONNREFUSED => "ECONNREFUSED",
            n => return write!(f, "errno {n}"),
        };
        f.write_str(n)
    }
}

pub(crate) type R<T> = Result<T, E>;

pub(crate) fn last() -> E {
    E(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

/// 0 (or any non-negative value) -> Ok(()), -1 -> the errno.
pub(crate) fn ok(r: c_int) -> R<()> {
    if r < 0 {
        Err(last())
    } else {
        Ok(())
    }
}

pub(crate) fn okv(r: c_int) -> R<c_int> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r)
    }
}

pub(crate) fn okn(r: isize) -> R<usize> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r as usize)
    }
}

pub(crate) fn okoff(r: i64) -> R<i64> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r)
    }
}

pub(crate) fn cs(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

pub(crate) fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

// ------------------------------------------------------------- data model

/// Length and FNV-1a hash of some bytes.
#[derive(PartialEq, Eq)]
pub(crate) struct Fp(usize, u64);

impl Debug for Fp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes fnv {:016x}", self.0, self.1)
    }
}

pub(crate) fn fp(b: &[u8]) -> Fp {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    Fp(b.len(), h)
}

pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `model[off..off+data.len()] = data`, zero-filling a gap.
pub(crate) fn put(model: &mut Vec<u8>, off: usize, data: &[u8]) {
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

// ---------------------------------------------------------- libc wrappers

pub(crate) fn open(p: &CStr, flags: c_int, mode: u32) -> R<c_int> {
    // SAFETY: `p` is a NUL-terminated C string alive for the call.
    okv(unsafe { libc::open(p.as_ptr(), flags, mode as c_uint) })
}

pub(crate) fn close(fd: c_int) -> R<()> {
    // SAFETY: close takes only integers (a bad descriptor is an error, not UB).
    ok(unsafe { libc::close(fd) })
}

pub(crate) fn write(fd: c_int, b: &[u8]) -> R<usize> {
    // SAFETY: `b` is a live slice of `b.len()` bytes, borrowed for the call.
    okn(unsafe { libc::write(fd, b.as_ptr() as *const c_void, b.len()) })
}

pub(crate) fn write_all(fd: c_int, mut b: &[u8]) -> R<usize> {
    let total = b.len();
    while !b.is_empty() {
        let n = write(fd, b)?;
        if n == 0 {
            return Err(E(libc::EIO));
        }
        b = &b[n..];
    }
    Ok(total)
}

pub(crate) fn read(fd: c_int, n: usize) -> R<Vec<u8>> {
    let mut v = vec![0u8; n];
    // SAFETY: `v` has capacity `n`; read writes at most `n` bytes into it.
    let r = okn(unsafe { libc::read(fd, v.as_mut_ptr() as *mut c_void, n) })?;
    v.truncate(r);
    Ok(v)
}

/// read() until `n` bytes or end of file, in pieces of `piece`.
pub(crate) fn read_full(fd: c_int, n: usize, piece: usize) -> R<Vec<u8>> {
    let mut out = Vec::with_capacity(n.min(64 * MIB));
    while out.len() < n {
        let b = read(fd, piece.min(n - out.len()))?;
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    Ok(out)
}

pub(crate) fn pread(fd: c_int, n: usize, off: i64) -> R<Vec<u8>> {
    let mut v = vec![0u8; n];
    // SAFETY: `v` has capacity `n`; pread writes at most `n` bytes into it.
    let r = okn(unsafe { libc::pread(fd, v.as_mut_ptr() as *mut c_void, n, off) })?;
    v.truncate(r);
    Ok(v)
}

pub(crate) fn pread64(fd: c_int, n: usize, off: i64) -> R<Vec<u8>> {
    let mut v = vec![0u8; n];
    // SAFETY: `v` has capacity `n`; pread64 writes at most `n` bytes into it.
    let r = okn(unsafe { libc::pread64(fd, v.as_mut_ptr() as *mut c_void, n, off) })?;
    v.truncate(r);
    Ok(v)
}

pub(crate) fn pwrite(fd: c_int, b: &[u8], off: i64) -> R<usize> {
    // SAFETY: `b` is a live slice of `b.len()` bytes, borrowed for the call.
    okn(unsafe { libc::pwrite(fd, b.as_ptr() as *const c_void, b.len(), off) })
}

pub(crate) fn pwrite64(fd: c_int, b: &[u8], off: i64) -> R<usize> {
    // SAFETY: `b` is a live slice of `b.len()` bytes, borrowed for the call.
    okn(unsafe { libc::pwrite64(fd, b.as_ptr() as *const c_void, b.len(), off) })
}

pub(crate) fn lseek(fd: c_int, off: i64, whence: c_int) -> R<i64> {
    // SAFETY: lseek takes only integers (a bad descriptor is an error, not UB).
    okoff(unsafe { libc::lseek(fd, off, whence) })
}

pub(crate) fn lseek64(fd: c_int, off: i64, whence: c_int) -> R<i64> {
    // SAFETY: lseek64 takes only integers (a bad descriptor is an error, not UB).
    okoff(unsafe { libc::lseek64(fd, off, whence) })
}

pub(crate) fn fstat(fd: c_int) -> R<libc::stat> {
    // SAFETY: `libc::stat` is plain integers, for which all zeroes is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live local stat the kernel fills.
    ok(unsafe { libc::fstat(fd, &mut st) }).map(|_| st)
}

pub(crate) fn stat(p: &CStr) -> R<libc::stat> {
    // SAFETY: `libc::stat` is plain integers, for which all zeroes is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is a NUL-terminated C string and `st` a live local stat.
    ok(unsafe { libc::stat(p.as_ptr(), &mut st) }).map(|_| st)
}

pub(crate) fn lstat(p: &CStr) -> R<libc::stat> {
    // SAFETY: `libc::stat` is plain integers, for which all zeroes is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is a NUL-terminated C string and `st` a live local stat.
    ok(unsafe { libc::lstat(p.as_ptr(), &mut st) }).map(|_| st)
}

pub(crate) fn size(p: &CStr) -> R<i64> {
    stat(p).map(|s| s.st_size)
}

pub(crate) fn fsize(fd: c_int) -> R<i64> {
    fstat(fd).map(|s| s.st_size)
}

pub(crate) fn mode(p: &CStr) -> R<u32> {
    lstat(p).map(|s| s.st_mode)
}

pub(crate) fn mkdir(p: &CStr, m: u32) -> R<()> {
    // SAFETY: `p` is a NUL-terminated C string alive for the call.
    ok(unsafe { libc::mkdir(p.as_ptr(), m) })
}

pub(crate) fn rmdir(p: &CStr) -> R<()> {
    // SAFETY: `p` is a NUL-terminated C string alive for the call.
    ok(unsafe { libc::rmdir(p.as_ptr()) })
}

pub(crate) fn unlink(p: &CStr) -> R<()> {
    // SAFETY: `p` is a NUL-terminated C string alive for the call.
    ok(unsafe { libc::unlink(p.as_ptr()) })
}

pub(crate) fn rename(a: &CStr, b: &CStr) -> R<()> {
    // SAFETY: `a` and `b` are NUL-terminated C strings alive for the call.
    ok(unsafe { libc::rename(a.as_ptr(), b.as_ptr()) })
}

pub(crate) fn renameat2(a: &CStr, b: &CStr, flags: c_uint) -> R<()> {
    // SAFETY: `a` and `b` are NUL-terminated C strings borrowed for the call.
    ok(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

pub(crate) fn symlink(target: &str, p: &CStr) -> R<()> {
    let t = cstr(target);
    // SAFETY: `t` and `p` are NUL-terminated C strings alive for the call.
    ok(unsafe { libc::symlink(t.as_ptr(), p.as_ptr()) })
}

pub(crate) fn readlink(p: &CStr, cap: usize) -> R<String> {
    let mut b = vec![0u8; cap];
    // SAFETY: `p` is a NUL-terminated C string and `b` a live buffer of `cap` bytes.
    let n = okn(unsafe { libc::readlink(p.as_ptr(), b.as_mut_ptr() as *mut c_char, cap) })?;
    b.truncate(n);
    Ok(String::from_utf8_lossy(&b).into_owned())
}

pub(crate) fn readv(fd: c_int, sizes: &[usize]) -> R<Vec<Vec<u8>>> {
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr() as *mut c_void,
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: `iov` lists the buffers of `bufs`, each of its length, alive and
    // not otherwise borrowed during the call.
    let n = okn(unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as c_int) })?;
    trim(&mut bufs, n);
    Ok(bufs)
}

pub(crate) fn preadv_(fd: c_int, sizes: &[usize], off: i64, v64: bool) -> R<Vec<Vec<u8>>> {
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr() as *mut c_void,
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: `iov` lists the buffers of `bufs`, each of its length, alive and
    // not otherwise borrowed during the call.
    let n = okn(unsafe {
        if v64 {
            libc::preadv64(fd, iov.as_ptr(), iov.len() as c_int, off)
        } else {
            libc::preadv(fd, iov.as_ptr(), iov.len() as c_int, off)
        }
    })?;
    trim(&mut bufs, n);
    Ok(bufs)
}

/// Keep the first `n` bytes over the buffers.
pub(crate) fn trim(bufs: &mut [Vec<u8>], mut n: usize) {
    for b in bufs.iter_mut() {
        let k = b.len().min(n);
        b.truncate(k);
        n -= k;
    }
}

pub(crate) fn iov_of(parts: &[&[u8]]) -> Vec<libc::iovec> {
    parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut c_void,
            iov_len: p.len(),
        })
        .collect()
}

pub(crate) fn writev(fd: c_int, parts: &[&[u8]]) -> R<usize> {
    let iov = iov_of(parts);
    // SAFETY: `iov` (from `iov_of`) points into `parts`, borrowed for the call.
    okn(unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as c_int) })
}

pub(crate) fn pwritev_(fd: c_int, parts: &[&[u8]], off: i64, v64: bool) -> R<usize> {
    let iov = iov_of(parts);
    // SAFETY: `iov` (from `iov_of`) points into `parts`, borrowed for the call.
    okn(unsafe {
        if v64 {
            libc::pwritev64(fd, iov.as_ptr(), iov.len() as c_int, off)
        } else {
            libc::pwritev(fd, iov.as_ptr(), iov.len() as c_int, off)
        }
    })
}

pub(crate) fn fcntl(fd: c_int, cmd: c_int, arg: c_int) -> R<c_int> {
    // SAFETY: fcntl takes only integers (a bad descriptor is an error, not UB).
    okv(unsafe { libc::fcntl(fd, cmd, arg) })
}

pub(crate) fn getxattr(p: &CStr, name: &str, cap: usize) -> R<Vec<u8>> {
    let n = cstr(name);
    let mut b = vec![0u8; cap];
    // SAFETY: `p` and `n` are NUL-terminated C strings; the value buffer is `b`
    // (`cap` bytes, live) or NULL with size 0.
    let r = okn(unsafe {
        libc::getxattr(
            p.as_ptr(),
            n.as_ptr(),
            if cap == 0 {
                std::ptr::null_mut()
            } else {
                b.as_mut_ptr() as *mut c_void
            },
            cap,
        )
    })?;
    if cap == 0 {
        return Ok(vec![0; r]);
    }
    b.truncate(r);
    Ok(b)
}

pub(crate) fn setxattr(p: &CStr, name: &str, v: &[u8], flags: c_int) -> R<()> {
    let n = cstr(name);
    // SAFETY: `p` and `n` are NUL-terminated C strings; `v` is a live slice of the
    // length passed.
    ok(unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            v.as_ptr() as *const c_void,
            v.len(),
            flags,
        )
    })
}

pub(crate) fn removexattr(p: &CStr, name: &str) -> R<()> {
    let n = cstr(name);
    // SAFETY: `p` and `n` are NUL-terminated C strings alive for the call.
    ok(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })
}

pub(crate) fn split_names(b: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = b
        .split(|&c| c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    v.sort();
    v
}

pub(crate) fn listxattr(p: &CStr) -> R<Vec<String>> {
    let mut b = vec![0u8; 65536];
    // SAFETY: `p` is a NUL-terminated C string and `b` a live buffer of `b.len()` bytes.
    let n = okn(unsafe { libc::listxattr(p.as_ptr(), b.as_mut_ptr() as *mut c_char, b.len()) })?;
    Ok(split_names(&b[..n]))
}

pub(crate) fn utimens(p: &CStr, at: (i64, i64), mt: (i64, i64), flags: c_int) -> R<()> {
    let ts = [
        libc::timespec {
            tv_sec: at.0,
            tv_nsec: at.1,
        },
        libc::timespec {
            tv_sec: mt.0,
            tv_nsec: mt.1,
        },
    ];
    // SAFETY: `p` is a NUL-terminated C string, `ts` a live array of the two
    // timespecs utimensat reads.
    ok(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), ts.as_ptr(), flags) })
}

pub(crate) fn mtime(st: &libc::stat) -> (i64, i64) {
    (st.st_mtime, st.st_mtime_nsec)
}

pub(crate) fn ctime(st: &libc::stat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

pub(crate) fn atime(st: &libc::stat) -> (i64, i64) {
    (st.st_atime, st.st_atime_nsec)
}

/// Names (with d_type) of a directory through opendir/readdir, without
/// "." and "..", in readdir order; plus whether "." and ".." came.
pub(crate) fn list_dir(p: &CStr) -> R<(Vec<(String, u8)>, bool)> {
    // SAFETY: `p` is a NUL-terminated C string alive for the call.
    let d = unsafe { libc::opendir(p.as_ptr()) };
    if d.is_null() {
        return Err(last());
    }
    let mut out = Vec::new();
    let mut dots = 0;
    loop {
        // SAFETY: `d` is the open, non-NULL stream from opendir, closed only below.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        // SAFETY: `e` is non-NULL and from the last readdir on `d`, not called again yet.
        let (name, ty) = unsafe { dirent(e) };
        if name == "." || name == ".." {
            dots += 1;
            continue;
        }
        out.push((name, ty));
    }
    // SAFETY: `d` came from a successful opendir and is not used after this.
    unsafe { libc::closedir(d) };
    Ok((out, dots == 2))
}

/// Name and type of a directory entry.
///
/// # Safety
/// `e` is a non-NULL entry from `readdir` on a stream that is still open
/// and has not been read again since.
pub(crate) unsafe fn dirent(e: *const libc::dirent) -> (String, u8) {
    // SAFETY: by the caller, `e` points at readdir's live entry, whose
    // `d_name` is NUL-terminated.
    let (name, ty) = unsafe { (CStr::from_ptr((*e).d_name.as_ptr()), (*e).d_type) };
    (name.to_string_lossy().into_owned(), ty)
}

pub(crate) fn names(p: &CStr) -> R<Vec<String>> {
    let (mut v, _) = list_dir(p)?;
    let mut n: Vec<String> = v.drain(..).map(|(n, _)| n).collect();
    n.sort();
    Ok(n)
}

pub(crate) fn write_file(p: &CStr, data: &[u8]) -> R<()> {
    let fd = open(p, libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY, 0o644)?;
    let r = write_all(fd, data);
    close(fd)?;
    r.map(|_| ())
}

pub(crate) fn read_file(p: &CStr) -> R<Vec<u8>> {
    let fd = open(p, libc::O_RDONLY, 0)?;
    let r = read_full(fd, usize::MAX, MIB);
    close(fd)?;
    r
}

pub(crate) fn pause() {
    // Make "later" visible at any timestamp granularity of the store.
    std::thread::sleep(Duration::from_millis(15));
}
