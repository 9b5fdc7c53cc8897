//! `peregrine-posix-suite`: POSIX checks in a directory of a mounted file
//! system, through libc (open, read, write, pread(64), pwrite(64), readv,
//! writev, preadv(64), pwritev(64), preadv2, pwritev2, lseek(64), fsync,
//! fdatasync, ftruncate(64), fstat, dup, dup2, dup3, fcntl F_DUPFD, fopen,
//! fread, fwrite, ... and the metadata calls), with the error codes.
//!
//! ```text
//! peregrine-posix-suite DIR [--ro RO_DIR] [--full FULL_DIR] [--entries N]
//! ```
//! * `DIR`: an empty directory of the mount under test.
//! * `--ro RO_DIR`: `DIR` as seen through a read-only mount of the same
//!   container (EROFS checks; the suite writes `DIR/ro/*` first).
//! * `--full FULL_DIR`: a directory on a small pool; filled up to ENOSPC
//!   and emptied again.
//! * `--entries N`: files in the readdir directory (default 1000).
//!
//! Every check prints one line, `name: observed`, and the observations do
//! not depend on timing, descriptors or free space, so two runs (say
//! without and with `LD_PRELOAD=libperegrine_il.so`) can be compared line
//! by line. A check that does not see what POSIX (or Peregrine's documented
//! behaviour) wants prints `FAIL name: observed, want ...`; the exit status
//! is then 1. Data is checked against an in-memory model and shown as
//! length + FNV-1a hash.

use libc::{c_char, c_int, c_uint, c_void};
use std::ffi::{CStr, CString};
use std::fmt::Debug;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: usize = 1 << 20;

// ------------------------------------------------------------ errno & co.

/// An errno value, shown by name.
#[derive(Clone, Copy, PartialEq, Eq)]
struct E(i32);

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
            n => return write!(f, "errno {n}"),
        };
        f.write_str(n)
    }
}

type R<T> = Result<T, E>;

fn last() -> E {
    E(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

/// 0 (or any non-negative value) -> Ok(()), -1 -> the errno.
fn ok(r: c_int) -> R<()> {
    if r < 0 {
        Err(last())
    } else {
        Ok(())
    }
}

fn okv(r: c_int) -> R<c_int> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r)
    }
}

fn okn(r: isize) -> R<usize> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r as usize)
    }
}

fn okoff(r: i64) -> R<i64> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r)
    }
}

fn cs(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

// ------------------------------------------------------------- data model

/// Length and FNV-1a hash of some bytes.
#[derive(PartialEq, Eq)]
struct Fp(usize, u64);

impl Debug for Fp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes fnv {:016x}", self.0, self.1)
    }
}

fn fp(b: &[u8]) -> Fp {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    Fp(b.len(), h)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
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
fn put(model: &mut Vec<u8>, off: usize, data: &[u8]) {
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

// ---------------------------------------------------------- libc wrappers

fn open(p: &CStr, flags: c_int, mode: u32) -> R<c_int> {
    okv(unsafe { libc::open(p.as_ptr(), flags, mode as c_uint) })
}

fn close(fd: c_int) -> R<()> {
    ok(unsafe { libc::close(fd) })
}

fn write(fd: c_int, b: &[u8]) -> R<usize> {
    okn(unsafe { libc::write(fd, b.as_ptr() as *const c_void, b.len()) })
}

fn write_all(fd: c_int, mut b: &[u8]) -> R<usize> {
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

fn read(fd: c_int, n: usize) -> R<Vec<u8>> {
    let mut v = vec![0u8; n];
    let r = okn(unsafe { libc::read(fd, v.as_mut_ptr() as *mut c_void, n) })?;
    v.truncate(r);
    Ok(v)
}

/// read() until `n` bytes or end of file, in pieces of `piece`.
fn read_full(fd: c_int, n: usize, piece: usize) -> R<Vec<u8>> {
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

fn pread(fd: c_int, n: usize, off: i64) -> R<Vec<u8>> {
    let mut v = vec![0u8; n];
    let r = okn(unsafe { libc::pread(fd, v.as_mut_ptr() as *mut c_void, n, off) })?;
    v.truncate(r);
    Ok(v)
}

fn pread64(fd: c_int, n: usize, off: i64) -> R<Vec<u8>> {
    let mut v = vec![0u8; n];
    let r = okn(unsafe { libc::pread64(fd, v.as_mut_ptr() as *mut c_void, n, off) })?;
    v.truncate(r);
    Ok(v)
}

fn pwrite(fd: c_int, b: &[u8], off: i64) -> R<usize> {
    okn(unsafe { libc::pwrite(fd, b.as_ptr() as *const c_void, b.len(), off) })
}

fn pwrite64(fd: c_int, b: &[u8], off: i64) -> R<usize> {
    okn(unsafe { libc::pwrite64(fd, b.as_ptr() as *const c_void, b.len(), off) })
}

fn lseek(fd: c_int, off: i64, whence: c_int) -> R<i64> {
    okoff(unsafe { libc::lseek(fd, off, whence) })
}

fn lseek64(fd: c_int, off: i64, whence: c_int) -> R<i64> {
    okoff(unsafe { libc::lseek64(fd, off, whence) })
}

fn fstat(fd: c_int) -> R<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    ok(unsafe { libc::fstat(fd, &mut st) }).map(|_| st)
}

fn stat(p: &CStr) -> R<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    ok(unsafe { libc::stat(p.as_ptr(), &mut st) }).map(|_| st)
}

fn lstat(p: &CStr) -> R<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    ok(unsafe { libc::lstat(p.as_ptr(), &mut st) }).map(|_| st)
}

fn size(p: &CStr) -> R<i64> {
    stat(p).map(|s| s.st_size)
}

fn fsize(fd: c_int) -> R<i64> {
    fstat(fd).map(|s| s.st_size)
}

fn mode(p: &CStr) -> R<u32> {
    lstat(p).map(|s| s.st_mode)
}

fn mkdir(p: &CStr, m: u32) -> R<()> {
    ok(unsafe { libc::mkdir(p.as_ptr(), m) })
}

fn rmdir(p: &CStr) -> R<()> {
    ok(unsafe { libc::rmdir(p.as_ptr()) })
}

fn unlink(p: &CStr) -> R<()> {
    ok(unsafe { libc::unlink(p.as_ptr()) })
}

fn rename(a: &CStr, b: &CStr) -> R<()> {
    ok(unsafe { libc::rename(a.as_ptr(), b.as_ptr()) })
}

fn renameat2(a: &CStr, b: &CStr, flags: c_uint) -> R<()> {
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

fn symlink(target: &str, p: &CStr) -> R<()> {
    let t = cstr(target);
    ok(unsafe { libc::symlink(t.as_ptr(), p.as_ptr()) })
}

fn readlink(p: &CStr, cap: usize) -> R<String> {
    let mut b = vec![0u8; cap];
    let n = okn(unsafe { libc::readlink(p.as_ptr(), b.as_mut_ptr() as *mut c_char, cap) })?;
    b.truncate(n);
    Ok(String::from_utf8_lossy(&b).into_owned())
}

fn readv(fd: c_int, sizes: &[usize]) -> R<Vec<Vec<u8>>> {
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr() as *mut c_void,
            iov_len: b.len(),
        })
        .collect();
    let n = okn(unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as c_int) })?;
    trim(&mut bufs, n);
    Ok(bufs)
}

fn preadv_(fd: c_int, sizes: &[usize], off: i64, v64: bool) -> R<Vec<Vec<u8>>> {
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr() as *mut c_void,
            iov_len: b.len(),
        })
        .collect();
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
fn trim(bufs: &mut [Vec<u8>], mut n: usize) {
    for b in bufs.iter_mut() {
        let k = b.len().min(n);
        b.truncate(k);
        n -= k;
    }
}

fn iov_of(parts: &[&[u8]]) -> Vec<libc::iovec> {
    parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut c_void,
            iov_len: p.len(),
        })
        .collect()
}

fn writev(fd: c_int, parts: &[&[u8]]) -> R<usize> {
    let iov = iov_of(parts);
    okn(unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as c_int) })
}

fn pwritev_(fd: c_int, parts: &[&[u8]], off: i64, v64: bool) -> R<usize> {
    let iov = iov_of(parts);
    okn(unsafe {
        if v64 {
            libc::pwritev64(fd, iov.as_ptr(), iov.len() as c_int, off)
        } else {
            libc::pwritev(fd, iov.as_ptr(), iov.len() as c_int, off)
        }
    })
}

fn fcntl(fd: c_int, cmd: c_int, arg: c_int) -> R<c_int> {
    okv(unsafe { libc::fcntl(fd, cmd, arg) })
}

fn getxattr(p: &CStr, name: &str, cap: usize) -> R<Vec<u8>> {
    let n = cstr(name);
    let mut b = vec![0u8; cap];
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

fn setxattr(p: &CStr, name: &str, v: &[u8], flags: c_int) -> R<()> {
    let n = cstr(name);
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

fn removexattr(p: &CStr, name: &str) -> R<()> {
    let n = cstr(name);
    ok(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })
}

fn split_names(b: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = b
        .split(|&c| c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    v.sort();
    v
}

fn listxattr(p: &CStr) -> R<Vec<String>> {
    let mut b = vec![0u8; 65536];
    let n = okn(unsafe { libc::listxattr(p.as_ptr(), b.as_mut_ptr() as *mut c_char, b.len()) })?;
    Ok(split_names(&b[..n]))
}

fn utimens(p: &CStr, at: (i64, i64), mt: (i64, i64), flags: c_int) -> R<()> {
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
    ok(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), ts.as_ptr(), flags) })
}

fn mtime(st: &libc::stat) -> (i64, i64) {
    (st.st_mtime, st.st_mtime_nsec)
}

fn ctime(st: &libc::stat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

fn atime(st: &libc::stat) -> (i64, i64) {
    (st.st_atime, st.st_atime_nsec)
}

/// Names (with d_type) of a directory through opendir/readdir, without
/// "." and "..", in readdir order; plus whether "." and ".." came.
fn list_dir(p: &CStr) -> R<(Vec<(String, u8)>, bool)> {
    let d = unsafe { libc::opendir(p.as_ptr()) };
    if d.is_null() {
        return Err(last());
    }
    let mut out = Vec::new();
    let mut dots = 0;
    loop {
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        let (name, ty) = unsafe { dirent(e) };
        if name == "." || name == ".." {
            dots += 1;
            continue;
        }
        out.push((name, ty));
    }
    unsafe { libc::closedir(d) };
    Ok((out, dots == 2))
}

unsafe fn dirent(e: *const libc::dirent) -> (String, u8) {
    let name = CStr::from_ptr((*e).d_name.as_ptr())
        .to_string_lossy()
        .into_owned();
    (name, (*e).d_type)
}

fn names(p: &CStr) -> R<Vec<String>> {
    let (mut v, _) = list_dir(p)?;
    let mut n: Vec<String> = v.drain(..).map(|(n, _)| n).collect();
    n.sort();
    Ok(n)
}

fn write_file(p: &CStr, data: &[u8]) -> R<()> {
    let fd = open(p, libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY, 0o644)?;
    let r = write_all(fd, data);
    close(fd)?;
    r.map(|_| ())
}

fn read_file(p: &CStr) -> R<Vec<u8>> {
    let fd = open(p, libc::O_RDONLY, 0)?;
    let r = read_full(fd, usize::MAX, MIB);
    close(fd)?;
    r
}

fn pause() {
    // Make "later" visible at any timestamp granularity of the store.
    std::thread::sleep(Duration::from_millis(15));
}

// ------------------------------------------------------------------ suite

struct Suite {
    base: PathBuf,
    checks: usize,
    fails: Vec<String>,
}

impl Suite {
    fn p(&self, rel: &str) -> CString {
        cs(&self.base.join(rel))
    }

    /// Print `name: got`; a FAIL line if it is not `want`.
    fn check<T: Debug + PartialEq>(&mut self, name: &str, got: T, want: T) {
        self.checks += 1;
        if got == want {
            println!("{name}: {got:?}");
        } else {
            let line = format!("FAIL {name}: {got:?}, want {want:?}");
            println!("{line}");
            self.fails.push(line);
        }
    }

    /// `check(name, cond, true)`, with `detail` shown on failure only.
    fn truth(&mut self, name: &str, cond: bool, detail: impl Debug) {
        self.checks += 1;
        if cond {
            println!("{name}: true");
        } else {
            let line = format!("FAIL {name}: false ({detail:?})");
            println!("{line}");
            self.fails.push(line);
        }
    }

    /// A step the rest of a section needs: abort the section's caller on
    /// failure by returning None (the failure is recorded).
    fn must<T: Debug>(&mut self, name: &str, r: R<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let line = format!("FAIL {name}: {e:?} (setup step; section abandoned)");
                println!("{line}");
                self.fails.push(line);
                None
            }
        }
    }

    /// Whole-file check against the model (read through a new descriptor).
    fn file_is(&mut self, name: &str, rel: &str, model: &[u8]) {
        let p = self.p(rel);
        self.check(&format!("{name}: size"), size(&p), Ok(model.len() as i64));
        self.check(
            &format!("{name}: content"),
            read_file(&p).map(|b| fp(&b)),
            Ok(fp(model)),
        );
    }

    // ------------------------------------------------------------ data

    fn data_calls(&mut self) {
        let p = self.p("data");
        let Some(fd) = self.must(
            "data: open O_CREAT|O_EXCL|O_RDWR",
            open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        let a = pattern(1, 3 * MIB + 17);
        let mut model = Vec::new();
        // Two writes, the first ending just short of a chunk boundary.
        self.check(
            "data: write 1 MiB - 5",
            write_all(fd, &a[..MIB - 5]),
            Ok(MIB - 5),
        );
        self.check(
            "data: write the rest",
            write_all(fd, &a[MIB - 5..]),
            Ok(a.len() - (MIB - 5)),
        );
        put(&mut model, 0, &a);
        self.check(
            "data: offset after writes",
            lseek(fd, 0, libc::SEEK_CUR),
            Ok(a.len() as i64),
        );
        self.check("data: fstat size", fsize(fd), Ok(a.len() as i64));
        self.check("data: rewind", lseek(fd, 0, libc::SEEK_SET), Ok(0));
        self.check(
            "data: read back in odd pieces",
            read_full(fd, a.len(), 256 * 1024 + 3).map(|b| fp(&b)),
            Ok(fp(&a)),
        );
        self.check(
            "data: read at end of file",
            read(fd, 10).map(|b| b.len()),
            Ok(0),
        );
        self.check(
            "data: pread across a chunk boundary",
            pread(fd, 20, (MIB - 10) as i64).map(|b| fp(&b)),
            Ok(fp(&a[MIB - 10..MIB + 10])),
        );
        self.check(
            "data: pread64 across a chunk boundary",
            pread64(fd, 4096, (2 * MIB - 3) as i64).map(|b| fp(&b)),
            Ok(fp(&a[2 * MIB - 3..2 * MIB - 3 + 4096])),
        );
        self.check(
            "data: pread short at end of file",
            pread(fd, 100, (a.len() - 7) as i64).map(|b| fp(&b)),
            Ok(fp(&a[a.len() - 7..])),
        );
        self.check(
            "data: pread past end of file",
            pread(fd, 100, (a.len() + 1000) as i64).map(|b| b.len()),
            Ok(0),
        );
        self.check(
            "data: pread at a negative offset",
            pread(fd, 10, -1).map(|b| b.len()),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "data: pwrite past the end",
            pwrite(fd, b"tail", 5 * MIB as i64),
            Ok(4),
        );
        put(&mut model, 5 * MIB, b"tail");
        self.check(
            "data: offset unchanged by pread/pwrite",
            lseek(fd, 0, libc::SEEK_CUR),
            Ok(a.len() as i64),
        );
        self.check(
            "data: fstat size after pwrite",
            fsize(fd),
            Ok(model.len() as i64),
        );
        self.check(
            "data: the hole reads as zeros",
            pread(fd, 1000, (4 * MIB) as i64).map(|b| b.iter().all(|&x| x == 0) && b.len() == 1000),
            Ok(true),
        );
        self.check("data: pwrite64 at 0", pwrite64(fd, b"HEAD", 0), Ok(4));
        put(&mut model, 0, b"HEAD");
        self.check(
            "data: pread64 of it",
            pread64(fd, 8, 0).map(|b| fp(&b)),
            Ok(fp(&model[..8])),
        );
        self.check("data: fsync", ok(unsafe { libc::fsync(fd) }), Ok(()));
        self.check(
            "data: fdatasync",
            ok(unsafe { libc::fdatasync(fd) }),
            Ok(()),
        );
        // A second descriptor sees the data at once (before close).
        if let Some(fd2) = self.must("data: second open", open(&p, libc::O_RDONLY, 0)) {
            self.check(
                "data: read through a second descriptor before close",
                read_full(fd2, usize::MAX, MIB).map(|b| fp(&b)),
                Ok(fp(&model)),
            );
            self.check("data: close second", close(fd2), Ok(()));
        }
        self.check(
            "data: stat by path after fsync",
            size(&p),
            Ok(model.len() as i64),
        );
        self.check("data: close", close(fd), Ok(()));
        self.file_is("data: after close", "data", &model);
        self.check(
            "data: fstat type and mode",
            stat(&p).map(|s| (s.st_mode & libc::S_IFMT, s.st_mode & 0o7777)),
            Ok((libc::S_IFREG, 0o644)),
        );
        self.check(
            "data: owner is the caller",
            stat(&p).map(|s| (s.st_uid, s.st_gid)),
            Ok(unsafe { (libc::geteuid(), libc::getegid()) }),
        );
    }

    fn vectored(&mut self) {
        let p = self.p("vec");
        let Some(fd) = self.must(
            "vec: open",
            open(&p, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        let mid = pattern(2, 70000);
        let mut model = Vec::new();
        self.check(
            "vec: writev three buffers",
            writev(fd, &[b"alpha-", &mid, b"-omega"]),
            Ok(6 + mid.len() + 6),
        );
        put(&mut model, 0, b"alpha-");
        put(&mut model, 6, &mid);
        put(&mut model, 6 + mid.len(), b"-omega");
        self.check("vec: rewind", lseek(fd, 0, libc::SEEK_SET), Ok(0));
        self.check(
            "vec: readv into three buffers",
            readv(fd, &[3, 100000, 10]).map(|v| fp(&v.concat())),
            Ok(fp(&model)),
        );
        self.check(
            "vec: readv at end of file",
            readv(fd, &[10, 10]).map(|v| v.concat().len()),
            Ok(0),
        );
        self.check(
            "vec: pwritev",
            pwritev_(fd, &[b"XX", b"YY"], 2, false),
            Ok(4),
        );
        put(&mut model, 2, b"XXYY");
        self.check(
            "vec: preadv",
            preadv_(fd, &[3, 3], 0, false).map(|v| v.concat()),
            Ok(model[..6].to_vec()),
        );
        self.check(
            "vec: pwritev64 across a chunk boundary",
            pwritev_(fd, &[b"ab", b"cd"], (MIB - 2) as i64, true),
            Ok(4),
        );
        put(&mut model, MIB - 2, b"abcd");
        self.check(
            "vec: preadv64 across it",
            preadv_(fd, &[1, 5], (MIB - 3) as i64, true).map(|v| v.concat()),
            Ok(model[MIB - 3..MIB + 2].to_vec()),
        );
        // preadv2/pwritev2 with offset -1: at and moving the file offset.
        self.check("vec: seek to 10", lseek(fd, 10, libc::SEEK_SET), Ok(10));
        let iov = iov_of(&[b"v2"]);
        self.check(
            "vec: pwritev2 at the file offset",
            okn(unsafe { libc::pwritev2(fd, iov.as_ptr(), 1, -1, 0) }),
            Ok(2),
        );
        put(&mut model, 10, b"v2");
        self.check("vec: offset moved", lseek(fd, 0, libc::SEEK_CUR), Ok(12));
        let mut b = [0u8; 4];
        let iov = [libc::iovec {
            iov_base: b.as_mut_ptr() as *mut c_void,
            iov_len: 4,
        }];
        self.check(
            "vec: preadv2 at an offset",
            okn(unsafe { libc::preadv2(fd, iov.as_ptr(), 1, 9, 0) }),
            Ok(4),
        );
        self.check("vec: preadv2 data", b.to_vec(), model[9..13].to_vec());
        self.check("vec: close", close(fd), Ok(()));
        self.file_is("vec: after close", "vec", &model);
    }

    fn seeks(&mut self) {
        let p = self.p("seek");
        let data = pattern(3, 300_000);
        if self.must("seek: create", write_file(&p, &data)).is_none() {
            return;
        }
        let Some(fd) = self.must("seek: open", open(&p, libc::O_RDONLY, 0)) else {
            return;
        };
        let n = data.len() as i64;
        self.check("seek: SEEK_END", lseek(fd, 0, libc::SEEK_END), Ok(n));
        self.check(
            "seek: SEEK_END -4",
            lseek(fd, -4, libc::SEEK_END),
            Ok(n - 4),
        );
        self.check(
            "seek: read the last 4",
            read(fd, 100).map(|b| fp(&b)),
            Ok(fp(&data[data.len() - 4..])),
        );
        self.check(
            "seek: SEEK_CUR -2",
            lseek(fd, -2, libc::SEEK_CUR),
            Ok(n - 2),
        );
        self.check(
            "seek: negative SEEK_SET",
            lseek(fd, -1, libc::SEEK_SET),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "seek: SEEK_CUR before 0",
            lseek(fd, -(n + 1), libc::SEEK_CUR),
            Err(E(libc::EINVAL)),
        );
        self.check("seek: bad whence", lseek(fd, 0, 42), Err(E(libc::EINVAL)));
        self.check("seek: SEEK_DATA 0", lseek(fd, 0, libc::SEEK_DATA), Ok(0));
        self.check("seek: SEEK_HOLE 0", lseek(fd, 0, libc::SEEK_HOLE), Ok(n));
        self.check(
            "seek: SEEK_DATA at the end",
            lseek(fd, n, libc::SEEK_DATA),
            Err(E(libc::ENXIO)),
        );
        self.check(
            "seek: lseek64 past the end",
            lseek64(fd, 10 * MIB as i64, libc::SEEK_SET),
            Ok(10 * MIB as i64),
        );
        self.check(
            "seek: read past the end",
            read(fd, 10).map(|b| b.len()),
            Ok(0),
        );
        self.check(
            "seek: lseek64 SEEK_SET 1000",
            lseek64(fd, 1000, libc::SEEK_SET),
            Ok(1000),
        );
        self.check(
            "seek: read at 1000",
            read(fd, 16).map(|b| fp(&b)),
            Ok(fp(&data[1000..1016])),
        );
        self.check("seek: close", close(fd), Ok(()));
    }

    fn ftruncate(&mut self) {
        let p = self.p("trunc");
        let Some(fd) = self.must(
            "ftruncate: open",
            open(&p, libc::O_CREAT | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        let mut model = pattern(4, 2 * MIB + 100);
        self.check(
            "ftruncate: write 2 MiB + 100",
            write_all(fd, &model),
            Ok(model.len()),
        );
        self.check(
            "ftruncate: shrink to 1000",
            ok(unsafe { libc::ftruncate(fd, 1000) }),
            Ok(()),
        );
        model.truncate(1000);
        self.check("ftruncate: fstat size", fsize(fd), Ok(1000));
        self.check(
            "ftruncate: data kept",
            pread(fd, 5000, 0).map(|b| fp(&b)),
            Ok(fp(&model)),
        );
        self.check(
            "ftruncate: extend to 3 MiB",
            ok(unsafe { libc::ftruncate(fd, 3 * MIB as i64) }),
            Ok(()),
        );
        model.resize(3 * MIB, 0);
        self.check("ftruncate: size 3 MiB", fsize(fd), Ok(3 * MIB as i64));
        self.check(
            "ftruncate: old data past the cut is gone",
            pread(fd, 4096, (2 * MIB) as i64).map(|b| b.iter().all(|&x| x == 0)),
            Ok(true),
        );
        self.check(
            "ftruncate64 to 1 MiB + 1",
            ok(unsafe { libc::ftruncate64(fd, MIB as i64 + 1) }),
            Ok(()),
        );
        model.truncate(MIB + 1);
        self.check(
            "ftruncate: negative length",
            ok(unsafe { libc::ftruncate(fd, -1) }),
            Err(E(libc::EINVAL)),
        );
        self.check("ftruncate: close", close(fd), Ok(()));
        self.file_is("ftruncate: after close", "trunc", &model);
        if let Some(rd) = self.must("ftruncate: open read-only", open(&p, libc::O_RDONLY, 0)) {
            self.check(
                "ftruncate on a read-only descriptor",
                ok(unsafe { libc::ftruncate(rd, 0) }),
                Err(E(libc::EINVAL)),
            );
            let _ = close(rd);
        }
        self.check("ftruncate: size unchanged", size(&p), Ok(MIB as i64 + 1));
    }

    fn append(&mut self) {
        let p = self.p("app");
        let Some(fd) = self.must(
            "append: open O_APPEND",
            open(&p, libc::O_CREAT | libc::O_WRONLY | libc::O_APPEND, 0o644),
        ) else {
            return;
        };
        let mut model = Vec::new();
        self.check("append: write one", write(fd, b"one\n"), Ok(4));
        model.extend_from_slice(b"one\n");
        self.check("append: seek to 0", lseek(fd, 0, libc::SEEK_SET), Ok(0));
        self.check("append: write two", write(fd, b"two\n"), Ok(4));
        model.extend_from_slice(b"two\n");
        self.check(
            "append: offset at the end",
            lseek(fd, 0, libc::SEEK_CUR),
            Ok(8),
        );
        // Linux: pwrite on an O_APPEND descriptor appends.
        self.check(
            "append: pwrite at 0 appends",
            pwrite(fd, b"three\n", 0),
            Ok(6),
        );
        model.extend_from_slice(b"three\n");
        self.check("append: close", close(fd), Ok(()));
        self.file_is("append: after close", "app", &model);
        // O_APPEND switched on and off with fcntl(F_SETFL).
        let Some(fd) = self.must("append: open O_RDWR", open(&p, libc::O_RDWR, 0)) else {
            return;
        };
        self.check(
            "append: F_SETFL O_APPEND",
            fcntl(fd, libc::F_SETFL, libc::O_APPEND).map(|_| ()),
            Ok(()),
        );
        self.check(
            "append: F_GETFL shows it",
            fcntl(fd, libc::F_GETFL, 0).map(|f| f & libc::O_APPEND != 0),
            Ok(true),
        );
        self.check("append: write four", write(fd, b"four\n"), Ok(5));
        model.extend_from_slice(b"four\n");
        self.check(
            "append: F_SETFL 0",
            fcntl(fd, libc::F_SETFL, 0).map(|_| ()),
            Ok(()),
        );
        self.check("append: seek 0", lseek(fd, 0, libc::SEEK_SET), Ok(0));
        self.check("append: overwrite at 0", write(fd, b"O"), Ok(1));
        model[0] = b'O';
        self.check("append: close 2", close(fd), Ok(()));
        self.file_is("append: after F_SETFL", "app", &model);
    }

    fn dups(&mut self) {
        let p = self.p("dup");
        let po = self.p("dup-other");
        let Some(fd) = self.must(
            "dup: open",
            open(&p, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        let Some(other) = self.must(
            "dup: open other",
            open(&po, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        self.check("dup: write other", write(other, b"other-data"), Ok(10));
        self.check("dup: write aaa", write(fd, b"aaa"), Ok(3));
        let d1 = unsafe { libc::dup(fd) };
        self.truth("dup: dup", d1 >= 0, last());
        self.check("dup: write bbb through the dup", write(d1, b"bbb"), Ok(3));
        self.check(
            "dup: the offset is shared",
            lseek(fd, 0, libc::SEEK_CUR),
            Ok(6),
        );
        let d2 = fcntl(fd, libc::F_DUPFD, 100);
        self.check("dup: F_DUPFD >= 100", d2.map(|d| d >= 100), Ok(true));
        let d2 = d2.unwrap_or(-1);
        self.check("dup: write ccc through F_DUPFD", write(d2, b"ccc"), Ok(3));
        let d3 = fcntl(fd, libc::F_DUPFD_CLOEXEC, 0).unwrap_or(-1);
        self.check(
            "dup: F_DUPFD_CLOEXEC sets FD_CLOEXEC",
            fcntl(d3, libc::F_GETFD, 0),
            Ok(libc::FD_CLOEXEC),
        );
        self.check(
            "dup: dup2 over another open file",
            okv(unsafe { libc::dup2(fd, other) }).map(|r| r == other),
            Ok(true),
        );
        self.check("dup: write ddd through it", write(other, b"ddd"), Ok(3));
        self.check("dup: close the original", close(fd), Ok(()));
        self.check("dup: write eee through the dup", write(d1, b"eee"), Ok(3));
        self.check(
            "dup: dup3 O_CLOEXEC",
            okv(unsafe { libc::dup3(d1, d2, libc::O_CLOEXEC) }).map(|r| r == d2),
            Ok(true),
        );
        self.check(
            "dup: dup3 sets FD_CLOEXEC",
            fcntl(d2, libc::F_GETFD, 0),
            Ok(libc::FD_CLOEXEC),
        );
        self.check("dup: write fff through dup3", write(d2, b"fff"), Ok(3));
        self.check(
            "dup: dup3 onto itself",
            okv(unsafe { libc::dup3(d1, d1, 0) }).map(|_| ()),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "dup: dup2 onto itself",
            okv(unsafe { libc::dup2(d1, d1) }).map(|r| r == d1),
            Ok(true),
        );
        self.check(
            "dup: dup of a closed descriptor",
            okv(unsafe { libc::dup(fd) }).map(|_| ()),
            Err(E(libc::EBADF)),
        );
        self.check("dup: seek one", lseek(d1, 0, libc::SEEK_SET), Ok(0));
        self.check(
            "dup: read another",
            read(d3, 100),
            Ok(b"aaabbbcccdddeeefff".to_vec()),
        );
        for (n, d) in [("d1", d1), ("d2", d2), ("d3", d3), ("other", other)] {
            self.check(&format!("dup: close {n}"), close(d), Ok(()));
        }
        self.file_is("dup: file", "dup", b"aaabbbcccdddeeefff");
        self.file_is("dup: the file dup2 closed", "dup-other", b"other-data");
    }

    fn access_modes(&mut self) {
        let p = self.p("data");
        if let Some(rd) = self.must("modes: open O_RDONLY", open(&p, libc::O_RDONLY, 0)) {
            self.check(
                "modes: write on O_RDONLY",
                write(rd, b"x"),
                Err(E(libc::EBADF)),
            );
            self.check(
                "modes: pwrite on O_RDONLY",
                pwrite(rd, b"x", 0),
                Err(E(libc::EBADF)),
            );
            self.check(
                "modes: fallocate on O_RDONLY",
                ok(unsafe { libc::fallocate(rd, 0, 0, 10) }),
                Err(E(libc::EBADF)),
            );
            let _ = close(rd);
        }
        if let Some(wr) = self.must("modes: open O_WRONLY", open(&p, libc::O_WRONLY, 0)) {
            self.check(
                "modes: read on O_WRONLY",
                read(wr, 1).map(|b| b.len()),
                Err(E(libc::EBADF)),
            );
            self.check(
                "modes: pread on O_WRONLY",
                pread(wr, 1, 0).map(|b| b.len()),
                Err(E(libc::EBADF)),
            );
            let _ = close(wr);
        }
        self.check(
            "modes: read on a closed descriptor",
            read(9999, 1).map(|b| b.len()),
            Err(E(libc::EBADF)),
        );
    }

    fn stdio(&mut self) {
        let p = self.p("stdio.txt");
        let big = pattern(5, 100_000);
        let mut model = Vec::new();
        unsafe {
            let f = libc::fopen(p.as_ptr(), c"w".as_ptr());
            if f.is_null() {
                self.must::<()>("stdio: fopen w", Err(last()));
                return;
            }
            let mut ok_all = true;
            for part in big.chunks(4096 + 7) {
                ok_all &=
                    libc::fwrite(part.as_ptr() as *const c_void, 1, part.len(), f) == part.len();
            }
            model.extend_from_slice(&big);
            self.truth("stdio: fwrite in pieces", ok_all, "short fwrite");
            self.check(
                "stdio: fputs between fwrites",
                libc::fputs(c"-line\n".as_ptr(), f) >= 0,
                true,
            );
            model.extend_from_slice(b"-line\n");
            self.check(
                "stdio: fwrite end",
                libc::fwrite(b"end".as_ptr() as *const c_void, 1, 3, f),
                3,
            );
            model.extend_from_slice(b"end");
            self.check(
                "stdio: ftell after writes",
                libc::ftell(f),
                model.len() as i64,
            );
            self.check("stdio: fclose w", libc::fclose(f), 0);
        }
        self.file_is("stdio: written", "stdio.txt", &model);
        unsafe {
            let f = libc::fopen(p.as_ptr(), c"r".as_ptr());
            if f.is_null() {
                self.must::<()>("stdio: fopen r", Err(last()));
                return;
            }
            let mut b = vec![0u8; 50];
            self.check(
                "stdio: fread 50",
                libc::fread(b.as_mut_ptr() as *mut c_void, 1, 50, f),
                50,
            );
            self.check("stdio: fread data", fp(&b), fp(&model[..50]));
            self.check("stdio: ftell", libc::ftell(f), 50);
            self.check("stdio: fseek 1000", libc::fseek(f, 1000, libc::SEEK_SET), 0);
            let mut b = vec![0u8; 10];
            self.check(
                "stdio: fread 10 records of 1",
                libc::fread(b.as_mut_ptr() as *mut c_void, 1, 10, f),
                10,
            );
            self.check("stdio: fread after fseek", fp(&b), fp(&model[1000..1010]));
            self.check(
                "stdio: fseek SEEK_END -3",
                libc::fseek(f, -3, libc::SEEK_END),
                0,
            );
            let mut b = vec![0u8; 10];
            self.check(
                "stdio: short fread at the end",
                libc::fread(b.as_mut_ptr() as *mut c_void, 1, 10, f),
                3,
            );
            self.check("stdio: the last bytes", b[..3].to_vec(), b"end".to_vec());
            self.check("stdio: feof", libc::feof(f) != 0, true);
            self.check("stdio: ferror", libc::ferror(f), 0);
            self.check("stdio: fclose r", libc::fclose(f), 0);

            let f = libc::fopen(p.as_ptr(), c"a".as_ptr());
            if !f.is_null() {
                self.check(
                    "stdio: fwrite in mode a",
                    libc::fwrite(b"++".as_ptr() as *const c_void, 1, 2, f),
                    2,
                );
                model.extend_from_slice(b"++");
                self.check("stdio: fclose a", libc::fclose(f), 0);
            } else {
                self.must::<()>("stdio: fopen a", Err(last()));
            }
            let f = libc::fopen(p.as_ptr(), c"r+".as_ptr());
            if !f.is_null() {
                self.check("stdio: fseek 10", libc::fseek(f, 10, libc::SEEK_SET), 0);
                self.check(
                    "stdio: fwrite in mode r+",
                    libc::fwrite(b"MID".as_ptr() as *const c_void, 1, 3, f),
                    3,
                );
                put(&mut model, 10, b"MID");
                self.check("stdio: rewind", libc::fseek(f, 0, libc::SEEK_SET), 0);
                let mut b = vec![0u8; 4];
                self.check(
                    "stdio: fread 1 record of 4",
                    libc::fread(b.as_mut_ptr() as *mut c_void, 4, 1, f),
                    1,
                );
                self.check("stdio: fread r+", fp(&b), fp(&model[..4]));
                self.check("stdio: fclose r+", libc::fclose(f), 0);
            } else {
                self.must::<()>("stdio: fopen r+", Err(last()));
            }
            let f = libc::fopen64(p.as_ptr(), c"r".as_ptr());
            if !f.is_null() {
                let mut b = vec![0u8; model.len() + 100];
                self.check(
                    "stdio: fopen64 + fread of everything",
                    libc::fread(b.as_mut_ptr() as *mut c_void, 1, b.len(), f),
                    model.len(),
                );
                b.truncate(model.len());
                self.check("stdio: everything", fp(&b), fp(&model));
                self.check("stdio: fclose fopen64", libc::fclose(f), 0);
            } else {
                self.must::<()>("stdio: fopen64", Err(last()));
            }
            let missing = self.p("stdio-missing");
            let f = libc::fopen(missing.as_ptr(), c"r".as_ptr());
            self.check(
                "stdio: fopen of a missing file",
                if f.is_null() { Err(last()) } else { Ok(()) },
                Err(E(libc::ENOENT)),
            );
        }
        self.file_is("stdio: final", "stdio.txt", &model);
    }

    fn opens(&mut self) {
        let data = self.p("data");
        self.check(
            "open: missing file",
            open(&self.p("missing"), libc::O_RDONLY, 0).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "open: O_CREAT|O_EXCL of an existing file",
            open(&data, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644).map(|_| ()),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "open: below a file",
            open(&self.p("data/x"), libc::O_RDONLY, 0).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        self.check(
            "open: O_CREAT below a file",
            open(&self.p("data/x"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        let _ = mkdir(&self.p("odir"), 0o755);
        self.check(
            "open: a directory O_WRONLY",
            open(&self.p("odir"), libc::O_WRONLY, 0).map(|_| ()),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "open: a directory O_RDWR",
            open(&self.p("odir"), libc::O_RDWR, 0).map(|_| ()),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "open: a file O_DIRECTORY",
            open(&data, libc::O_RDONLY | libc::O_DIRECTORY, 0).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        self.check(
            "open: O_CREAT in a missing directory",
            open(&self.p("nodir/f"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        // O_CREAT without O_EXCL keeps an existing file; O_TRUNC empties it.
        let p = self.p("otrunc");
        let _ = write_file(&p, b"0123456789");
        if let Some(fd) = self.must(
            "open: O_CREAT existing",
            open(&p, libc::O_CREAT | libc::O_RDWR, 0o600),
        ) {
            self.check("open: O_CREAT keeps the data", fsize(fd), Ok(10));
            let _ = close(fd);
        }
        if let Some(fd) = self.must("open: O_TRUNC", open(&p, libc::O_TRUNC | libc::O_WRONLY, 0)) {
            self.check("open: O_TRUNC empties", fsize(fd), Ok(0));
            let _ = close(fd);
        }
        self.check("open: size after O_TRUNC", size(&p), Ok(0));
        self.check(
            "open: mode from the first create",
            mode(&p).map(|m| m & 0o7777),
            Ok(0o644),
        );
        // creat() and the umask.
        let c = self.p("creat");
        let fd = okv(unsafe { libc::creat(c.as_ptr(), 0o666) });
        self.check("creat: new", fd.map(|_| ()), Ok(()));
        if let Ok(fd) = fd {
            self.check("creat: write", write(fd, b"creat"), Ok(5));
            self.check(
                "creat: is O_WRONLY",
                fcntl(fd, libc::F_GETFL, 0).map(|f| f & libc::O_ACCMODE),
                Ok(libc::O_WRONLY),
            );
            let _ = close(fd);
        }
        self.check(
            "creat: mode under umask 022",
            mode(&c).map(|m| m & 0o7777),
            Ok(0o644),
        );
        if let Ok(fd) = okv(unsafe { libc::creat(c.as_ptr(), 0o600) }) {
            self.check("creat: of an existing file truncates", fsize(fd), Ok(0));
            let _ = close(fd);
        }
        // openat relative to a directory descriptor.
        if let Some(dfd) = self.must(
            "openat: open the directory",
            open(&self.p("odir"), libc::O_RDONLY | libc::O_DIRECTORY, 0),
        ) {
            let fd = okv(unsafe {
                libc::openat(
                    dfd,
                    c"rel".as_ptr(),
                    libc::O_CREAT | libc::O_RDWR,
                    0o640 as c_uint,
                )
            });
            self.check("openat: create", fd.map(|_| ()), Ok(()));
            if let Ok(fd) = fd {
                self.check("openat: write", write(fd, b"relative"), Ok(8));
                let _ = close(fd);
            }
            let _ = close(dfd);
            self.file_is("openat: the file", "odir/rel", b"relative");
            self.check(
                "openat: mode",
                mode(&self.p("odir/rel")).map(|m| m & 0o7777),
                Ok(0o640),
            );
        }
    }

    fn unlinked_open_file(&mut self) {
        let p = self.p("ghost");
        let Some(fd) = self.must(
            "unlinked: open",
            open(&p, libc::O_CREAT | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        let mut model = pattern(6, 300_000);
        self.check("unlinked: write", write_all(fd, &model), Ok(model.len()));
        self.check("unlinked: unlink while open", unlink(&p), Ok(()));
        self.check("unlinked: gone by name", size(&p), Err(E(libc::ENOENT)));
        self.check(
            "unlinked: still readable",
            pread(fd, model.len(), 0).map(|b| fp(&b)),
            Ok(fp(&model)),
        );
        self.check(
            "unlinked: still writable",
            pwrite(fd, b"more", 300_000),
            Ok(4),
        );
        model.extend_from_slice(b"more");
        self.check("unlinked: fstat size", fsize(fd), Ok(model.len() as i64));
        self.check(
            "unlinked: read it back",
            pread(fd, 10, 299_998).map(|b| fp(&b)),
            Ok(fp(&model[299_998..])),
        );
        self.check(
            "unlinked: ftruncate",
            ok(unsafe { libc::ftruncate(fd, 1000) }),
            Ok(()),
        );
        model.truncate(1000);
        self.check("unlinked: size after ftruncate", fsize(fd), Ok(1000));
        self.check(
            "unlinked: data after ftruncate",
            pread(fd, 2000, 0).map(|b| fp(&b)),
            Ok(fp(&model)),
        );
        self.check(
            "unlinked: fchmod",
            ok(unsafe { libc::fchmod(fd, 0o600) }),
            Ok(()),
        );
        self.check(
            "unlinked: fstat mode",
            fstat(fd).map(|s| s.st_mode & 0o7777),
            Ok(0o600),
        );
        self.check("unlinked: close", close(fd), Ok(()));
        self.check(
            "unlinked: names",
            names(&cs(&self.base)).map(|n| n.contains(&"ghost".to_string())),
            Ok(false),
        );
        // Rename while open: the descriptor follows the file.
        let a = self.p("moving");
        let b = self.p("moved");
        let Some(fd) = self.must(
            "renamed: open",
            open(&a, libc::O_CREAT | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        self.check("renamed: write before", write(fd, b"before-"), Ok(7));
        self.check("renamed: rename while open", rename(&a, &b), Ok(()));
        self.check("renamed: write after", write(fd, b"after"), Ok(5));
        self.check("renamed: close", close(fd), Ok(()));
        self.file_is("renamed: the file", "moved", b"before-after");
        self.check("renamed: the old name", size(&a), Err(E(libc::ENOENT)));
    }

    fn errors(&mut self) {
        // ENAMETOOLONG
        let n256 = "x".repeat(256);
        let n255 = "y".repeat(255);
        let long = self.p(&n256);
        self.check(
            "ENAMETOOLONG: create a 256-byte name",
            open(&long, libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
            Err(E(libc::ENAMETOOLONG)),
        );
        self.check(
            "ENAMETOOLONG: mkdir",
            mkdir(&long, 0o755),
            Err(E(libc::ENAMETOOLONG)),
        );
        self.check(
            "ENAMETOOLONG: stat",
            stat(&long).map(|_| ()),
            Err(E(libc::ENAMETOOLONG)),
        );
        self.check(
            "ENAMETOOLONG: symlink",
            symlink("data", &long),
            Err(E(libc::ENAMETOOLONG)),
        );
        self.check(
            "ENAMETOOLONG: rename to it",
            rename(&self.p("creat"), &long),
            Err(E(libc::ENAMETOOLONG)),
        );
        let ok255 = self.p(&n255);
        self.check(
            "NAME_MAX: a 255-byte name",
            write_file(&ok255, b"255"),
            Ok(()),
        );
        self.check("NAME_MAX: read it", read_file(&ok255), Ok(b"255".to_vec()));
        self.check("NAME_MAX: unlink it", unlink(&ok255), Ok(()));
        let deep = format!("{}/{}", self.base.display(), "a/".repeat(2100));
        self.check(
            "ENAMETOOLONG: a path over PATH_MAX",
            stat(&cstr(&deep)).map(|_| ()),
            Err(E(libc::ENAMETOOLONG)),
        );
        // ENOTDIR
        let data = self.p("data");
        self.check(
            "ENOTDIR: mkdir below a file",
            mkdir(&self.p("data/sub"), 0o755),
            Err(E(libc::ENOTDIR)),
        );
        self.check(
            "ENOTDIR: stat below a file",
            stat(&self.p("data/x")).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        self.check("ENOTDIR: rmdir a file", rmdir(&data), Err(E(libc::ENOTDIR)));
        self.check(
            "ENOTDIR: opendir a file",
            list_dir(&data).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        // EEXIST
        let _ = mkdir(&self.p("edir"), 0o755);
        self.check(
            "EEXIST: mkdir an existing directory",
            mkdir(&self.p("edir"), 0o755),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "EEXIST: mkdir over a file",
            mkdir(&data, 0o755),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "EEXIST: symlink over a file",
            symlink("x", &data),
            Err(E(libc::EEXIST)),
        );
        // ENOTEMPTY
        let _ = write_file(&self.p("edir/f"), b"f");
        self.check(
            "ENOTEMPTY: rmdir a non-empty directory",
            rmdir(&self.p("edir")),
            Err(E(libc::ENOTEMPTY)),
        );
        self.check(
            "ENOTEMPTY: its file is intact",
            read_file(&self.p("edir/f")),
            Ok(b"f".to_vec()),
        );
        // EISDIR, ENOENT, EINVAL
        self.check(
            "EISDIR: unlink a directory",
            unlink(&self.p("edir")),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "ENOENT: unlink a missing name",
            unlink(&self.p("missing")),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "ENOENT: rmdir a missing name",
            rmdir(&self.p("missing")),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "ENOENT: mkdir in a missing directory",
            mkdir(&self.p("missing/sub"), 0o755),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "ENOENT: stat a missing name",
            stat(&self.p("missing")).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "EINVAL: rmdir dir/.",
            rmdir(&self.p("edir/.")),
            Err(E(libc::EINVAL)),
        );
        let _ = mkdir(&self.p("empty"), 0o755);
        self.check("rmdir: an empty directory", rmdir(&self.p("empty")), Ok(()));
        self.check(
            "rmdir: it is gone",
            stat(&self.p("empty")).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check("unlink: a file", unlink(&self.p("edir/f")), Ok(()));
        self.check("rmdir: now empty", rmdir(&self.p("edir")), Ok(()));
        self.check(
            "mkdir: mode under umask 022",
            mkdir(&self.p("mdir"), 0o777).and_then(|_| mode(&self.p("mdir"))),
            Ok(libc::S_IFDIR | 0o755),
        );
    }

    fn renames(&mut self) {
        let p = |s: &Self, r: &str| s.p(r);
        let _ = mkdir(&p(self, "r1"), 0o755);
        let _ = mkdir(&p(self, "r2"), 0o755);
        let _ = write_file(&p(self, "r1/a"), b"A");
        self.check(
            "rename: within a directory",
            rename(&p(self, "r1/a"), &p(self, "r1/b")),
            Ok(()),
        );
        self.check(
            "rename: old name gone",
            stat(&p(self, "r1/a")).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "rename: new name",
            read_file(&p(self, "r1/b")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "rename: across directories",
            rename(&p(self, "r1/b"), &p(self, "r2/c")),
            Ok(()),
        );
        self.check(
            "rename: arrived",
            read_file(&p(self, "r2/c")),
            Ok(b"A".to_vec()),
        );
        self.check("rename: left", names(&p(self, "r1")), Ok(vec![]));
        let _ = write_file(&p(self, "r2/d"), b"DDDD");
        self.check(
            "rename: over an existing file",
            rename(&p(self, "r2/c"), &p(self, "r2/d")),
            Ok(()),
        );
        self.check(
            "rename: replaced content",
            read_file(&p(self, "r2/d")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "rename: one entry left",
            names(&p(self, "r2")),
            Ok(vec!["d".to_string()]),
        );
        self.check(
            "rename: onto itself",
            rename(&p(self, "r2/d"), &p(self, "r2/d")),
            Ok(()),
        );
        self.check(
            "rename: onto itself keeps it",
            read_file(&p(self, "r2/d")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "RENAME_NOREPLACE to a free name",
            renameat2(&p(self, "r2/d"), &p(self, "r1/e"), libc::RENAME_NOREPLACE),
            Ok(()),
        );
        let _ = write_file(&p(self, "r2/f"), b"F");
        self.check(
            "RENAME_NOREPLACE over a file",
            renameat2(&p(self, "r1/e"), &p(self, "r2/f"), libc::RENAME_NOREPLACE),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "RENAME_NOREPLACE: source kept",
            read_file(&p(self, "r1/e")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "RENAME_NOREPLACE: target kept",
            read_file(&p(self, "r2/f")),
            Ok(b"F".to_vec()),
        );
        self.check(
            "RENAME_EXCHANGE two files",
            renameat2(&p(self, "r1/e"), &p(self, "r2/f"), libc::RENAME_EXCHANGE),
            Ok(()),
        );
        self.check(
            "RENAME_EXCHANGE: one",
            read_file(&p(self, "r1/e")),
            Ok(b"F".to_vec()),
        );
        self.check(
            "RENAME_EXCHANGE: other",
            read_file(&p(self, "r2/f")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "RENAME_EXCHANGE with a missing target",
            renameat2(
                &p(self, "r1/e"),
                &p(self, "r2/missing"),
                libc::RENAME_EXCHANGE,
            ),
            Err(E(libc::ENOENT)),
        );
        let _ = mkdir(&p(self, "r2/sd"), 0o755);
        let _ = write_file(&p(self, "r2/sd/in"), b"in");
        self.check(
            "RENAME_EXCHANGE a file and a directory",
            renameat2(&p(self, "r1/e"), &p(self, "r2/sd"), libc::RENAME_EXCHANGE),
            Ok(()),
        );
        self.check(
            "RENAME_EXCHANGE: the directory moved",
            read_file(&p(self, "r1/e/in")),
            Ok(b"in".to_vec()),
        );
        self.check(
            "RENAME_EXCHANGE: the file moved",
            read_file(&p(self, "r2/sd")),
            Ok(b"F".to_vec()),
        );
        self.check(
            "rename flags NOREPLACE|EXCHANGE",
            renameat2(
                &p(self, "r2/sd"),
                &p(self, "r2/f"),
                libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE,
            ),
            Err(E(libc::EINVAL)),
        );
        let _ = mkdir(&p(self, "r1/empty"), 0o755);
        let _ = mkdir(&p(self, "r2/full"), 0o755);
        let _ = write_file(&p(self, "r2/full/x"), b"x");
        self.check(
            "rename: a directory over an empty one",
            rename(&p(self, "r2/full"), &p(self, "r1/empty")),
            Ok(()),
        );
        self.check(
            "rename: its content came",
            read_file(&p(self, "r1/empty/x")),
            Ok(b"x".to_vec()),
        );
        let _ = mkdir(&p(self, "r2/g"), 0o755);
        self.check(
            "rename: a directory over a non-empty one",
            rename(&p(self, "r2/g"), &p(self, "r1/empty")),
            Err(E(libc::ENOTEMPTY)),
        );
        self.check(
            "rename: a directory over a file",
            rename(&p(self, "r2/g"), &p(self, "r2/f")),
            Err(E(libc::ENOTDIR)),
        );
        self.check(
            "rename: a file over a directory",
            rename(&p(self, "r2/f"), &p(self, "r2/g")),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "rename: a directory into itself",
            rename(&p(self, "r1"), &p(self, "r1/empty/sub")),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "rename: a missing source",
            rename(&p(self, "r1/missing"), &p(self, "r1/z")),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "rename: a directory to another parent",
            rename(&p(self, "r1/empty"), &p(self, "r2/moved")),
            Ok(()),
        );
        self.check(
            "rename: children follow",
            read_file(&p(self, "r2/moved/x")),
            Ok(b"x".to_vec()),
        );
        self.check(
            "rename: new files in the moved directory",
            write_file(&p(self, "r2/moved/y"), b"y").and_then(|_| names(&p(self, "r2/moved"))),
            Ok(vec!["x".to_string(), "y".to_string()]),
        );
        let _ = setxattr(&p(self, "r2/f"), "user.t", b"1", 0);
        self.check(
            "rename: with an xattr",
            rename(&p(self, "r2/f"), &p(self, "r2/f2")),
            Ok(()),
        );
        self.check(
            "rename: the xattr follows",
            getxattr(&p(self, "r2/f2"), "user.t", 64),
            Ok(b"1".to_vec()),
        );
        self.check(
            "rename: final tree r1",
            names(&p(self, "r1")),
            Ok(vec!["e".to_string()]),
        );
        self.check(
            "rename: final tree r2",
            names(&p(self, "r2")),
            Ok(["f2", "g", "moved", "sd"]
                .iter()
                .map(|s| s.to_string())
                .collect()),
        );
    }

    fn symlinks(&mut self) {
        let ln = self.p("ln");
        self.check("symlink: create", symlink("data", &ln), Ok(()));
        self.check("readlink", readlink(&ln, 4096), Ok("data".to_string()));
        self.check(
            "symlink: lstat type and size",
            lstat(&ln).map(|s| (s.st_mode & libc::S_IFMT, s.st_size)),
            Ok((libc::S_IFLNK, 4)),
        );
        let target = size(&self.p("data"));
        self.check("symlink: stat follows it", size(&ln), target);
        let content = read_file(&self.p("data")).map(|b| fp(&b));
        self.check(
            "symlink: open follows it",
            read_file(&ln).map(|b| fp(&b)),
            content,
        );
        self.check(
            "readlink: short buffer",
            readlink(&ln, 2),
            Ok("da".to_string()),
        );
        self.check(
            "readlink: a regular file",
            readlink(&self.p("data"), 100),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "readlink: a missing name",
            readlink(&self.p("missing"), 100),
            Err(E(libc::ENOENT)),
        );
        let dl = self.p("dangling");
        self.check("symlink: dangling", symlink("no/such/target", &dl), Ok(()));
        self.check(
            "symlink: stat of a dangling link",
            stat(&dl).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "symlink: lstat of it",
            lstat(&dl).map(|s| s.st_size),
            Ok(14),
        );
        self.check(
            "symlink: empty target",
            symlink("", &self.p("empty-link")),
            Err(E(libc::ENOENT)),
        );
        let t1000 = "t".repeat(1000);
        self.check(
            "symlink: 1000-byte target",
            symlink(&t1000, &self.p("longlink")),
            Ok(()),
        );
        self.check(
            "readlink: 1000-byte target",
            readlink(&self.p("longlink"), 4096),
            Ok(t1000),
        );
        let _ = mkdir(&self.p("sdir"), 0o755);
        let _ = write_file(&self.p("sdir/in"), b"in");
        self.check(
            "symlink: to a directory",
            symlink("sdir", &self.p("dlink")),
            Ok(()),
        );
        self.check(
            "symlink: through it",
            read_file(&self.p("dlink/in")),
            Ok(b"in".to_vec()),
        );
        self.check(
            "symlink: list through it",
            names(&self.p("dlink")),
            Ok(vec!["in".to_string()]),
        );
        // symlinkat / readlinkat relative to a directory descriptor.
        if let Some(dfd) = self.must(
            "symlinkat: open the directory",
            open(&self.p("sdir"), libc::O_RDONLY | libc::O_DIRECTORY, 0),
        ) {
            self.check(
                "symlinkat",
                ok(unsafe { libc::symlinkat(c"in".as_ptr(), dfd, c"rel".as_ptr()) }),
                Ok(()),
            );
            let mut b = [0u8; 64];
            let n = okn(unsafe {
                libc::readlinkat(dfd, c"rel".as_ptr(), b.as_mut_ptr() as *mut c_char, 64)
            });
            self.check("readlinkat", n.map(|n| b[..n].to_vec()), Ok(b"in".to_vec()));
            let _ = close(dfd);
        }
        self.check("symlink: unlink the link", unlink(&self.p("dlink")), Ok(()));
        self.check(
            "symlink: the target stays",
            read_file(&self.p("sdir/in")),
            Ok(b"in".to_vec()),
        );
    }

    fn attrs(&mut self) {
        let p = self.p("attr");
        let _ = write_file(&p, b"attributes");
        let before = stat(&p);
        pause();
        self.check(
            "chmod 0600",
            ok(unsafe { libc::chmod(p.as_ptr(), 0o600) }),
            Ok(()),
        );
        let after = stat(&p);
        self.check("chmod: mode", after.map(|s| s.st_mode & 0o7777), Ok(0o600));
        if let (Ok(b), Ok(a)) = (before, after) {
            self.truth(
                "chmod: ctime advanced",
                ctime(&a) > ctime(&b),
                (ctime(&b), ctime(&a)),
            );
            self.truth(
                "chmod: mtime unchanged",
                mtime(&a) == mtime(&b),
                (mtime(&b), mtime(&a)),
            );
        }
        if let Some(fd) = self.must("fchmod: open", open(&p, libc::O_RDONLY, 0)) {
            self.check(
                "fchmod 0640",
                ok(unsafe { libc::fchmod(fd, 0o640) }),
                Ok(()),
            );
            self.check(
                "fchmod: fstat mode",
                fstat(fd).map(|s| s.st_mode & 0o7777),
                Ok(0o640),
            );
            let _ = close(fd);
        }
        let _ = mkdir(&self.p("sticky"), 0o755);
        self.check(
            "chmod a directory 01777",
            ok(unsafe { libc::chmod(self.p("sticky").as_ptr(), 0o1777) })
                .and_then(|_| mode(&self.p("sticky"))),
            Ok(libc::S_IFDIR | 0o1777),
        );
        self.check(
            "chmod a missing name",
            ok(unsafe { libc::chmod(self.p("missing").as_ptr(), 0o600) }),
            Err(E(libc::ENOENT)),
        );
        if unsafe { libc::geteuid() } == 0 {
            self.check(
                "chown",
                ok(unsafe { libc::chown(p.as_ptr(), 1234, 5678) }),
                Ok(()),
            );
            self.check(
                "chown: owner",
                stat(&p).map(|s| (s.st_uid, s.st_gid)),
                Ok((1234, 5678)),
            );
            if let Some(fd) = self.must("fchown: open", open(&p, libc::O_RDONLY, 0)) {
                self.check(
                    "fchown uid only",
                    ok(unsafe { libc::fchown(fd, 4321, u32::MAX) }),
                    Ok(()),
                );
                self.check(
                    "fchown: owner",
                    fstat(fd).map(|s| (s.st_uid, s.st_gid)),
                    Ok((4321, 5678)),
                );
                let _ = close(fd);
            }
            let l = self.p("attr-link");
            let _ = symlink("attr", &l);
            self.check(
                "lchown a symlink",
                ok(unsafe { libc::lchown(l.as_ptr(), 99, 98) }),
                Ok(()),
            );
            self.check(
                "lchown: the link",
                lstat(&l).map(|s| (s.st_uid, s.st_gid)),
                Ok((99, 98)),
            );
            self.check(
                "lchown: not the target",
                stat(&p).map(|s| (s.st_uid, s.st_gid)),
                Ok((4321, 5678)),
            );
            self.check(
                "chown -1 -1 changes nothing",
                ok(unsafe { libc::chown(p.as_ptr(), u32::MAX, u32::MAX) })
                    .and_then(|_| stat(&p).map(|s| (s.st_uid, s.st_gid))),
                Ok((4321, 5678)),
            );
        } else {
            println!("chown: skipped (not root)");
        }
        // utimensat with nanoseconds, UTIME_OMIT, UTIME_NOW; futimens.
        self.check(
            "utimensat",
            utimens(&p, (1_000_000_000, 123), (1_234_567_890, 456_789), 0),
            Ok(()),
        );
        let st = stat(&p);
        self.check(
            "utimensat: atime",
            st.map(|s| atime(&s)),
            Ok((1_000_000_000, 123)),
        );
        self.check(
            "utimensat: mtime",
            st.map(|s| mtime(&s)),
            Ok((1_234_567_890, 456_789)),
        );
        self.check(
            "utimensat: UTIME_OMIT atime",
            utimens(&p, (0, libc::UTIME_OMIT), (1_500_000_000, 0), 0),
            Ok(()),
        );
        let st = stat(&p);
        self.check(
            "utimensat: atime kept",
            st.map(|s| atime(&s)),
            Ok((1_000_000_000, 123)),
        );
        self.check(
            "utimensat: mtime set",
            st.map(|s| mtime(&s)),
            Ok((1_500_000_000, 0)),
        );
        self.check(
            "utimensat: UTIME_NOW",
            utimens(&p, (0, libc::UTIME_OMIT), (0, libc::UTIME_NOW), 0),
            Ok(()),
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        self.check(
            "utimensat: mtime is now",
            stat(&p).map(|s| (s.st_mtime - now).abs() <= 5),
            Ok(true),
        );
        if let Some(fd) = self.must("futimens: open", open(&p, libc::O_RDONLY, 0)) {
            let ts = [
                libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                libc::timespec {
                    tv_sec: 1_600_000_000,
                    tv_nsec: 7,
                },
            ];
            self.check(
                "futimens",
                ok(unsafe { libc::futimens(fd, ts.as_ptr()) }),
                Ok(()),
            );
            self.check(
                "futimens: mtime",
                fstat(fd).map(|s| mtime(&s)),
                Ok((1_600_000_000, 7)),
            );
            let _ = close(fd);
        }
        let l = self.p("time-link");
        let _ = symlink("attr", &l);
        self.check(
            "utimensat AT_SYMLINK_NOFOLLOW",
            utimens(&l, (5, 0), (6, 0), libc::AT_SYMLINK_NOFOLLOW),
            Ok(()),
        );
        self.check(
            "utimensat: the link's mtime",
            lstat(&l).map(|s| mtime(&s)),
            Ok((6, 0)),
        );
        self.check(
            "utimensat: not the target's",
            stat(&p).map(|s| mtime(&s)),
            Ok((1_600_000_000, 7)),
        );
    }

    fn truncate_fallocate(&mut self) {
        let p = self.p("tr");
        let mut model = pattern(7, 10_000);
        let _ = write_file(&p, &model);
        self.check(
            "truncate: shrink",
            ok(unsafe { libc::truncate(p.as_ptr(), 5000) }),
            Ok(()),
        );
        model.truncate(5000);
        self.file_is("truncate: shrunk", "tr", &model);
        self.check(
            "truncate: extend to 2 MiB",
            ok(unsafe { libc::truncate(p.as_ptr(), 2 * MIB as i64) }),
            Ok(()),
        );
        model.resize(2 * MIB, 0);
        self.file_is("truncate: extended", "tr", &model);
        self.check(
            "truncate: a directory",
            ok(unsafe { libc::truncate(self.p("r1").as_ptr(), 0) }),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "truncate: a missing name",
            ok(unsafe { libc::truncate(self.p("missing").as_ptr(), 0) }),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "truncate: negative",
            ok(unsafe { libc::truncate(p.as_ptr(), -1) }),
            Err(E(libc::EINVAL)),
        );
        let fa = self.p("fa");
        let Some(fd) = self.must(
            "fallocate: open",
            open(&fa, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        self.check(
            "fallocate mode 0 extends",
            ok(unsafe { libc::fallocate(fd, 0, 0, 3 * MIB as i64) }),
            Ok(()),
        );
        self.check("fallocate: size", fsize(fd), Ok(3 * MIB as i64));
        self.check(
            "fallocate inside the file",
            ok(unsafe { libc::fallocate(fd, 0, 10, 10) }).and_then(|_| fsize(fd)),
            Ok(3 * MIB as i64),
        );
        self.check(
            "fallocate: reads zeros",
            pread(fd, 4096, (3 * MIB - 4096) as i64)
                .map(|b| b.len() == 4096 && b.iter().all(|&x| x == 0)),
            Ok(true),
        );
        self.check(
            "fallocate KEEP_SIZE",
            ok(unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, 4 * MIB as i64) }),
            Err(E(libc::EOPNOTSUPP)),
        );
        self.check(
            "fallocate PUNCH_HOLE",
            ok(unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    0,
                    10,
                )
            }),
            Err(E(libc::EOPNOTSUPP)),
        );
        self.check(
            "posix_fallocate",
            unsafe { libc::posix_fallocate(fd, 0, 4 * MIB as i64) },
            0,
        );
        self.check("posix_fallocate: size", fsize(fd), Ok(4 * MIB as i64));
        self.check("fallocate: close", close(fd), Ok(()));
        self.check("fallocate: size by path", size(&fa), Ok(4 * MIB as i64));
    }

    fn statfs(&mut self) {
        let p = cs(&self.base);
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        self.check(
            "statvfs",
            ok(unsafe { libc::statvfs(p.as_ptr(), &mut sv) }),
            Ok(()),
        );
        self.check("statvfs: f_bsize", sv.f_bsize, 4096);
        self.check("statvfs: f_namemax", sv.f_namemax, 255);
        self.truth("statvfs: f_blocks > 0", sv.f_blocks > 0, sv.f_blocks);
        self.truth(
            "statvfs: f_bavail <= f_bfree <= f_blocks",
            sv.f_bavail <= sv.f_bfree && sv.f_bfree <= sv.f_blocks,
            (sv.f_bavail, sv.f_bfree, sv.f_blocks),
        );
        self.check("statvfs: not read-only", sv.f_flag & libc::ST_RDONLY, 0);
        let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
        self.check(
            "statfs",
            ok(unsafe { libc::statfs(p.as_ptr(), &mut sf) }),
            Ok(()),
        );
        self.check("statfs: FUSE magic", sf.f_type, 0x6573_5546);
        if let Some(fd) = self.must("fstatvfs: open", open(&self.p("data"), libc::O_RDONLY, 0)) {
            let mut sv2: libc::statvfs = unsafe { std::mem::zeroed() };
            self.check(
                "fstatvfs",
                ok(unsafe { libc::fstatvfs(fd, &mut sv2) }),
                Ok(()),
            );
            self.truth(
                "fstatvfs: same size",
                sv2.f_blocks == sv.f_blocks,
                (sv2.f_blocks, sv.f_blocks),
            );
            let _ = close(fd);
        }
    }

    fn xattrs(&mut self) {
        let p = self.p("xa");
        let _ = write_file(&p, b"xattrs");
        self.check("setxattr", setxattr(&p, "user.k", b"v1", 0), Ok(()));
        self.check("getxattr", getxattr(&p, "user.k", 64), Ok(b"v1".to_vec()));
        self.check(
            "getxattr: size query",
            getxattr(&p, "user.k", 0).map(|v| v.len()),
            Ok(2),
        );
        self.check(
            "getxattr: buffer too small",
            getxattr(&p, "user.k", 1),
            Err(E(libc::ERANGE)),
        );
        self.check(
            "setxattr XATTR_CREATE of an existing one",
            setxattr(&p, "user.k", b"x", libc::XATTR_CREATE),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "setxattr XATTR_REPLACE of a missing one",
            setxattr(&p, "user.none", b"x", libc::XATTR_REPLACE),
            Err(E(libc::ENODATA)),
        );
        self.check(
            "setxattr XATTR_REPLACE",
            setxattr(&p, "user.k", b"v2", libc::XATTR_REPLACE),
            Ok(()),
        );
        self.check(
            "getxattr: replaced",
            getxattr(&p, "user.k", 64),
            Ok(b"v2".to_vec()),
        );
        let big = pattern(8, 4000);
        self.check(
            "setxattr 4000 bytes",
            setxattr(&p, "user.big", &big, 0),
            Ok(()),
        );
        self.check(
            "getxattr 4000 bytes",
            getxattr(&p, "user.big", 8192).map(|v| fp(&v)),
            Ok(fp(&big)),
        );
        self.check(
            "setxattr empty value",
            setxattr(&p, "user.empty", b"", 0),
            Ok(()),
        );
        self.check(
            "getxattr empty value",
            getxattr(&p, "user.empty", 64),
            Ok(vec![]),
        );
        self.check(
            "listxattr",
            listxattr(&p),
            Ok(vec![
                "user.big".into(),
                "user.empty".into(),
                "user.k".into(),
            ]),
        );
        self.check(
            "listxattr: size query",
            okn(unsafe { libc::listxattr(p.as_ptr(), std::ptr::null_mut(), 0) }),
            Ok("user.big\0user.empty\0user.k\0".len()),
        );
        self.check(
            "getxattr of a missing one",
            getxattr(&p, "user.none", 64),
            Err(E(libc::ENODATA)),
        );
        self.check("removexattr", removexattr(&p, "user.k"), Ok(()));
        self.check(
            "getxattr: removed",
            getxattr(&p, "user.k", 64),
            Err(E(libc::ENODATA)),
        );
        self.check(
            "removexattr of a missing one",
            removexattr(&p, "user.k"),
            Err(E(libc::ENODATA)),
        );
        let long_name = format!("user.{}", "n".repeat(251));
        self.check(
            "setxattr: a 256-byte name",
            setxattr(&p, &long_name, b"x", 0),
            Err(E(libc::ERANGE)),
        );
        self.check(
            "getxattr on a missing file",
            getxattr(&self.p("missing"), "user.k", 64),
            Err(E(libc::ENOENT)),
        );
        // f*xattr on a descriptor.
        if let Some(fd) = self.must("fsetxattr: open", open(&p, libc::O_RDWR, 0)) {
            self.check(
                "fsetxattr",
                ok(unsafe {
                    libc::fsetxattr(
                        fd,
                        c"user.fd".as_ptr(),
                        b"fdv".as_ptr() as *const c_void,
                        3,
                        0,
                    )
                }),
                Ok(()),
            );
            let mut b = [0u8; 16];
            self.check(
                "fgetxattr",
                okn(unsafe {
                    libc::fgetxattr(fd, c"user.fd".as_ptr(), b.as_mut_ptr() as *mut c_void, 16)
                })
                .map(|n| b[..n].to_vec()),
                Ok(b"fdv".to_vec()),
            );
            let mut l = vec![0u8; 4096];
            self.check(
                "flistxattr",
                okn(unsafe { libc::flistxattr(fd, l.as_mut_ptr() as *mut c_char, 4096) })
                    .map(|n| split_names(&l[..n])),
                Ok(vec![
                    "user.big".into(),
                    "user.empty".into(),
                    "user.fd".into(),
                ]),
            );
            self.check(
                "fremovexattr",
                ok(unsafe { libc::fremovexattr(fd, c"user.fd".as_ptr()) }),
                Ok(()),
            );
            let _ = close(fd);
        }
        // Directories; symlinks (user.* is refused on them by the kernel).
        let d = self.p("xdir");
        let _ = mkdir(&d, 0o755);
        self.check(
            "setxattr on a directory",
            setxattr(&d, "user.d", b"dv", 0),
            Ok(()),
        );
        self.check(
            "getxattr on a directory",
            getxattr(&d, "user.d", 64),
            Ok(b"dv".to_vec()),
        );
        let l = self.p("xlink");
        let _ = symlink("xa", &l);
        let n = cstr("user.l");
        self.check(
            "lsetxattr user.* on a symlink",
            ok(unsafe {
                libc::lsetxattr(l.as_ptr(), n.as_ptr(), b"1".as_ptr() as *const c_void, 1, 0)
            }),
            Err(E(libc::EPERM)),
        );
        // The object class of new entries, by directory xattr.
        self.check(
            "oclass xattr: a bad class",
            setxattr(&d, "user.peregrine.oclass", b"BOGUS", 0),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "oclass xattr: S2",
            setxattr(&d, "user.peregrine.oclass", b"S2", 0),
            Ok(()),
        );
        self.check(
            "oclass xattr: read back",
            getxattr(&d, "user.peregrine.oclass", 64),
            Ok(b"S2".to_vec()),
        );
        let data = pattern(9, 3 * MIB);
        self.check(
            "oclass xattr: a file below it",
            write_file(&self.p("xdir/s2file"), &data)
                .and_then(|_| read_file(&self.p("xdir/s2file")).map(|b| fp(&b))),
            Ok(fp(&data)),
        );
        self.check(
            "oclass xattr: a subdirectory inherits it",
            mkdir(&self.p("xdir/sub"), 0o755)
                .and_then(|_| getxattr(&self.p("xdir/sub"), "user.peregrine.oclass", 64)),
            Ok(b"S2".to_vec()),
        );
    }

    fn hard_links(&mut self) {
        let a = self.p("data");
        let b = self.p("data.hl");
        self.check(
            "link: hard links are not supported",
            ok(unsafe { libc::link(a.as_ptr(), b.as_ptr()) }),
            Err(E(libc::EOPNOTSUPP)),
        );
        self.check(
            "linkat: hard links are not supported",
            ok(unsafe { libc::linkat(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), 0) }),
            Err(E(libc::EOPNOTSUPP)),
        );
        self.check(
            "link: nothing created",
            stat(&b).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
    }

    fn readdir(&mut self, n: usize) {
        let d = self.p("many");
        if self.must("readdir: mkdir", mkdir(&d, 0o755)).is_none() {
            return;
        }
        let mut want: Vec<(String, u8)> = Vec::new();
        for i in 0..n {
            let name = format!("e{i:05}");
            if let Err(e) = write_file(&self.p(&format!("many/{name}")), b"") {
                self.must::<()>(&format!("readdir: create {name}"), Err(e));
                return;
            }
            want.push((name, libc::DT_REG));
        }
        for i in 0..3 {
            let name = format!("sd{i}");
            let _ = mkdir(&self.p(&format!("many/{name}")), 0o755);
            want.push((name, libc::DT_DIR));
        }
        for i in 0..2 {
            let name = format!("ln{i}");
            let _ = symlink("e00000", &self.p(&format!("many/{name}")));
            want.push((name, libc::DT_LNK));
        }
        want.sort();
        let Some((got, dots)) = self.must("readdir: list", list_dir(&d)) else {
            return;
        };
        self.check("readdir: . and ..", dots, true);
        self.check("readdir: entry count", got.len(), want.len());
        let mut sorted = got.clone();
        sorted.sort();
        self.truth(
            "readdir: every name once, with its d_type",
            sorted == want,
            (sorted.len(), want.len()),
        );
        self.check("readdir: the order is sorted", got == sorted, true);
        let again = list_dir(&d).map(|(v, _)| v);
        self.truth(
            "readdir: same order twice",
            again.as_ref() == Ok(&got),
            "order changed",
        );
        // telldir / seekdir / rewinddir.
        unsafe {
            let dir = libc::opendir(d.as_ptr());
            if dir.is_null() {
                self.must::<()>("readdir: opendir", Err(last()));
                return;
            }
            let next = |dir: *mut libc::DIR| -> Option<String> {
                let e = libc::readdir(dir);
                (!e.is_null()).then(|| dirent(e).0)
            };
            let first = next(dir);
            for _ in 0..100 {
                next(dir);
            }
            let pos = libc::telldir(dir);
            let a: Vec<Option<String>> = (0..10).map(|_| next(dir)).collect();
            libc::seekdir(dir, pos);
            let b: Vec<Option<String>> = (0..10).map(|_| next(dir)).collect();
            self.truth(
                "readdir: seekdir to a telldir position",
                a == b && a.iter().all(|x| x.is_some()),
                (&a, &b),
            );
            libc::rewinddir(dir);
            self.check("readdir: rewinddir", next(dir), first);
            libc::closedir(dir);
        }
        // Entries removed during a listing: every remaining one exactly once.
        unsafe {
            let dir = libc::opendir(d.as_ptr());
            if dir.is_null() {
                self.must::<()>("readdir: opendir 2", Err(last()));
                return;
            }
            let mut seen = Vec::new();
            for _ in 0..10 {
                let e = libc::readdir(dir);
                if !e.is_null() {
                    seen.push(dirent(e).0);
                }
            }
            let mut removed = Vec::new();
            for i in (n / 2..n).step_by(7) {
                let name = format!("e{i:05}");
                if unlink(&self.p(&format!("many/{name}"))).is_ok() {
                    removed.push(name);
                }
            }
            loop {
                let e = libc::readdir(dir);
                if e.is_null() {
                    break;
                }
                seen.push(dirent(e).0);
            }
            libc::closedir(dir);
            let mut uniq = seen.clone();
            uniq.sort();
            uniq.dedup();
            self.check(
                "readdir: no duplicates while removing",
                uniq.len(),
                seen.len(),
            );
            let missing: Vec<&(String, u8)> = want
                .iter()
                .filter(|(w, _)| !removed.contains(w) && !seen.contains(w))
                .collect();
            self.check("readdir: no remaining entry skipped", missing.len(), 0);
            self.check(
                "readdir: removed",
                removed.len(),
                (n / 2..n).step_by(7).count(),
            );
        }
    }

    /// POSIX: creating, removing or renaming an entry updates the
    /// directory's mtime and ctime; writing into a file does not.
    fn dir_times(&mut self) {
        let t = self.p("times");
        let u = self.p("times2");
        if self
            .must(
                "dir times: mkdir",
                mkdir(&t, 0o755).and_then(|_| mkdir(&u, 0o755)),
            )
            .is_none()
        {
            return;
        }
        type Op<'a> = Box<dyn Fn() -> R<()> + 'a>;
        let f = self.p("times/f");
        let g = self.p("times/g");
        let sub = self.p("times/sub");
        let ln = self.p("times/ln");
        let far = self.p("times2/far");
        let steps: Vec<(&str, Op, Vec<&CStr>, bool)> = vec![
            ("create", Box::new(|| write_file(&f, b"f")), vec![&t], true),
            (
                "write into an existing file",
                Box::new(|| {
                    let fd = open(&f, libc::O_WRONLY | libc::O_APPEND, 0)?;
                    write(fd, b"more")?;
                    close(fd)
                }),
                vec![&t],
                false,
            ),
            (
                "chmod of an entry",
                Box::new(|| ok(unsafe { libc::chmod(f.as_ptr(), 0o600) })),
                vec![&t],
                false,
            ),
            ("mkdir", Box::new(|| mkdir(&sub, 0o755)), vec![&t], true),
            ("symlink", Box::new(|| symlink("f", &ln)), vec![&t], true),
            ("rename within", Box::new(|| rename(&f, &g)), vec![&t], true),
            (
                "rename out of it (source)",
                Box::new(|| rename(&g, &far)),
                vec![&t, &u],
                true,
            ),
            (
                "rename back (target)",
                Box::new(|| rename(&far, &g)),
                vec![&t, &u],
                true,
            ),
            (
                "create in the other directory",
                Box::new(|| write_file(&far, b"far")),
                vec![&u],
                true,
            ),
            (
                "RENAME_EXCHANGE across directories",
                Box::new(|| renameat2(&g, &far, libc::RENAME_EXCHANGE)),
                vec![&t, &u],
                true,
            ),
            ("unlink", Box::new(|| unlink(&ln)), vec![&t], true),
            ("rmdir", Box::new(|| rmdir(&sub)), vec![&t], true),
        ];
        for (what, op, dirs, changes) in steps {
            let before: Vec<R<libc::stat>> = dirs.iter().map(|d| stat(d)).collect();
            pause();
            if let Err(e) = op() {
                self.must::<()>(&format!("dir times: {what}"), Err(e));
                continue;
            }
            for (i, d) in dirs.iter().enumerate() {
                let name = if *d == t.as_c_str() {
                    "times"
                } else {
                    "times2"
                };
                let (Ok(b), Ok(a)) = (before[i], stat(d)) else {
                    self.must::<()>(&format!("dir times: stat {name}"), Err(E(libc::EIO)));
                    continue;
                };
                if changes {
                    self.truth(
                        &format!("dir times: {what}: {name} mtime advanced"),
                        mtime(&a) > mtime(&b),
                        (mtime(&b), mtime(&a)),
                    );
                    self.truth(
                        &format!("dir times: {what}: {name} ctime advanced"),
                        ctime(&a) > ctime(&b),
                        (ctime(&b), ctime(&a)),
                    );
                } else {
                    self.truth(
                        &format!("dir times: {what}: {name} mtime unchanged"),
                        mtime(&a) == mtime(&b),
                        (mtime(&b), mtime(&a)),
                    );
                }
            }
        }
    }

    /// `ro` is `self.base` seen through a read-only mount.
    fn read_only(&mut self, ro: &Path) {
        let data = pattern(10, 10_000);
        let setup = (|| {
            mkdir(&self.p("ro"), 0o755)?;
            write_file(&self.p("ro/file"), &data)?;
            mkdir(&self.p("ro/dir"), 0o755)?;
            symlink("file", &self.p("ro/ln"))?;
            setxattr(&self.p("ro/file"), "user.r", b"1", 0)
        })();
        if self
            .must("EROFS: setup through the read-write mount", setup)
            .is_none()
        {
            return;
        }
        let r = |rel: &str| cs(&ro.join("ro").join(rel));
        let (file, dir, ln) = (r("file"), r("dir"), r("ln"));
        let rofs = Err(E(libc::EROFS));
        self.check(
            "read-only: read",
            read_file(&file).map(|b| fp(&b)),
            Ok(fp(&data)),
        );
        self.check("read-only: readlink", readlink(&ln, 100), Ok("file".into()));
        self.check(
            "read-only: getxattr",
            getxattr(&file, "user.r", 64),
            Ok(b"1".to_vec()),
        );
        self.check(
            "read-only: readdir",
            names(&r("")),
            Ok(vec!["dir".into(), "file".into(), "ln".into()]),
        );
        for (what, flags) in [
            ("O_WRONLY", libc::O_WRONLY),
            ("O_RDWR", libc::O_RDWR),
            ("O_RDONLY|O_TRUNC", libc::O_RDONLY | libc::O_TRUNC),
        ] {
            self.check(
                &format!("EROFS: open {what}"),
                open(&file, flags, 0).map(|_| ()),
                rofs,
            );
        }
        self.check(
            "EROFS: create",
            open(&r("new"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
            rofs,
        );
        self.check("EROFS: mkdir", mkdir(&r("newdir"), 0o755), rofs);
        self.check("EROFS: rmdir", rmdir(&dir), rofs);
        self.check("EROFS: unlink", unlink(&file), rofs);
        self.check("EROFS: rename", rename(&file, &r("file2")), rofs);
        self.check("EROFS: symlink", symlink("x", &r("ln2")), rofs);
        self.check(
            "EROFS: link",
            ok(unsafe { libc::link(file.as_ptr(), r("hl").as_ptr()) }),
            rofs,
        );
        self.check(
            "EROFS: chmod",
            ok(unsafe { libc::chmod(file.as_ptr(), 0o600) }),
            rofs,
        );
        if unsafe { libc::geteuid() } == 0 {
            self.check(
                "EROFS: chown",
                ok(unsafe { libc::chown(file.as_ptr(), 1, 1) }),
                rofs,
            );
        }
        self.check("EROFS: utimensat", utimens(&file, (1, 0), (1, 0), 0), rofs);
        self.check(
            "EROFS: truncate",
            ok(unsafe { libc::truncate(file.as_ptr(), 0) }),
            rofs,
        );
        self.check("EROFS: setxattr", setxattr(&file, "user.w", b"1", 0), rofs);
        self.check("EROFS: removexattr", removexattr(&file, "user.r"), rofs);
        self.check(
            "EROFS: access W_OK",
            ok(unsafe { libc::access(file.as_ptr(), libc::W_OK) }),
            rofs,
        );
        self.check(
            "read-only: access R_OK",
            ok(unsafe { libc::access(file.as_ptr(), libc::R_OK) }),
            Ok(()),
        );
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        let _ = unsafe { libc::statvfs(file.as_ptr(), &mut sv) };
        self.check(
            "read-only: statvfs ST_RDONLY",
            sv.f_flag & libc::ST_RDONLY != 0,
            true,
        );
        if let Some(fd) = self.must("read-only: open O_RDONLY", open(&file, libc::O_RDONLY, 0)) {
            self.check(
                "read-only: pread",
                pread(fd, 100, 5000).map(|b| fp(&b)),
                Ok(fp(&data[5000..5100])),
            );
            self.check("read-only: write", write(fd, b"x"), Err(E(libc::EBADF)));
            self.check(
                "read-only: ftruncate",
                ok(unsafe { libc::ftruncate(fd, 0) }),
                Err(E(libc::EINVAL)),
            );
            let _ = close(fd);
        }
        self.check(
            "read-only: data unchanged",
            read_file(&self.p("ro/file")).map(|b| fp(&b)),
            Ok(fp(&data)),
        );
    }

    /// `full` is a directory on a small pool.
    fn enospc(&mut self, full: &Path) {
        let p = cs(&full.join("fill"));
        let Some(fd) = self.must(
            "ENOSPC: open",
            open(&p, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        let chunk = pattern(11, MIB);
        let mut written = 0usize;
        let mut err = Ok(());
        // Bounded: the pool is far smaller than 1 GiB.
        for _ in 0..1024 {
            match write(fd, &chunk) {
                Ok(n) if n > 0 => written += n,
                Ok(_) => {
                    err = Err(E(libc::EIO));
                    break;
                }
                Err(e) => {
                    err = Err(e);
                    break;
                }
            }
        }
        self.check("ENOSPC: write to a full pool", err, Err(E(libc::ENOSPC)));
        self.truth("ENOSPC: after at least 8 MiB", written >= 8 * MIB, written);
        self.check("ENOSPC: close", close(fd), Ok(()));
        self.check("ENOSPC: unlink on the full pool", unlink(&p), Ok(()));
        self.check("ENOSPC: gone", stat(&p).map(|_| ()), Err(E(libc::ENOENT)));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut ro = None;
    let mut full = None;
    let mut entries = 1000usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--ro" => ro = args.next().map(PathBuf::from),
            "--full" => full = args.next().map(PathBuf::from),
            "--entries" => {
                entries = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage("--entries N"))
            }
            "-h" | "--help" => usage(""),
            _ if dir.is_none() && !a.starts_with('-') => dir = Some(PathBuf::from(a)),
            _ => usage(&format!("unexpected argument {a:?}")),
        }
    }
    let Some(dir) = dir else {
        usage("no directory")
    };
    match std::fs::read_dir(&dir) {
        Ok(mut d) => {
            if d.next().is_some() {
                usage(&format!("{} is not empty", dir.display()));
            }
        }
        Err(e) => usage(&format!("{}: {e}", dir.display())),
    }
    unsafe { libc::umask(0o022) };
    let mut s = Suite {
        base: dir,
        checks: 0,
        fails: Vec::new(),
    };
    s.data_calls();
    s.vectored();
    s.seeks();
    s.ftruncate();
    s.append();
    s.dups();
    s.access_modes();
    s.stdio();
    s.opens();
    s.unlinked_open_file();
    s.errors();
    s.renames();
    s.symlinks();
    s.attrs();
    s.truncate_fallocate();
    s.statfs();
    s.xattrs();
    s.hard_links();
    s.readdir(entries);
    s.dir_times();
    match &ro {
        Some(r) => s.read_only(r),
        None => println!("read-only: skipped (no --ro)"),
    }
    match &full {
        Some(f) => s.enospc(f),
        None => println!("ENOSPC: skipped (no --full)"),
    }
    eprintln!(
        "peregrine-posix-suite: {} checks, {} failed",
        s.checks,
        s.fails.len()
    );
    for f in &s.fails {
        eprintln!("  {f}");
    }
    std::process::exit(if s.fails.is_empty() { 0 } else { 1 });
}

fn usage(msg: &str) -> ! {
    if !msg.is_empty() {
        eprintln!("peregrine-posix-suite: {msg}");
    }
    eprintln!(
        "usage: peregrine-posix-suite DIR [--ro RO_DIR] [--full FULL_DIR] [--entries N]\n\
         DIR: an empty directory in the mount under test; RO_DIR: DIR through a\n\
         read-only mount of the same container; FULL_DIR: a directory on a small pool"
    );
    std::process::exit(2);
}
