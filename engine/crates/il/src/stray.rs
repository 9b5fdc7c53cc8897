//! Bytes written to a placeholder's memfd by calls the library does not
//! see. glibc's stdio writes a stream's buffer with its own internal
//! `write`, which no interposer catches; so do `dprintf`, raw system
//! calls and a stream the program built on the descriptor. Those bytes
//! land in the memfd at the offsets they would have had in the file (the
//! kernel keeps the offset, see place.rs), and would be lost with it.
//! Before the library serves a placeholder again, when one of its
//! descriptors closes, when it becomes the real file and at exit (after
//! flushing every stream), they are moved into the file at those offsets
//! (at its end for O_APPEND) and the memfd is emptied: ordered with the
//! library's own writes as they were issued, up to calls racing on other
//! threads. What cannot be caught this way: reads through such calls,
//! which see the empty memfd; so placeholders never stay on descriptors
//! 0, 1 and 2, whose streams glibc made, nor under a stream of `fdopen`
//! (both become the real file first: `place::keep_off_std`, `fdopen`).

use crate::place::{live_placeholders, of, record};
use crate::report::{count, note_failure, Busy, C};
use crate::table::{lookup, Shared, FDS};
use libc::c_int;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most bytes moved per read of the memfd.
const CHUNK: usize = 1 << 20;

/// The memfd's size: 0 unless something the library did not see wrote it.
fn memfd_size(fd: c_int) -> i64 {
    // SAFETY: all-zero is a valid `stat`; the raw system call fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live local the kernel writes.
    let r = unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st as *mut libc::stat) };
    if r == 0 {
        st.st_size
    } else {
        0
    }
}

/// Move stray bytes of placeholder `fd` into its file (takes its I/O lock).
pub(crate) fn adopt(fd: c_int, s: &Shared) {
    // A read-only descriptor of a real file takes no writes: nothing to
    // move (and a read costs no fstat).
    if s.acc != libc::O_RDONLY && of(s).is_some() && memfd_size(fd) > 0 {
        let _g = s.io.lock();
        adopt_locked(fd, s);
    }
}

/// As [`adopt`], for a caller that holds `s.io`.
pub(crate) fn adopt_locked(fd: c_int, s: &Shared) {
    let size = memfd_size(fd);
    if size <= 0 {
        return;
    }
    let file = match s.file() {
        Ok(f) => f,
        Err(e) => {
            note_failure(format!(
                "{size} bytes written around the library to a placeholder: errno {e}"
            ));
            return;
        }
    };
    // Another open file description of the memfd: SEEK_DATA and SEEK_HOLE
    // move its offset, not the one the program shares. Without /proc the
    // whole range is scanned.
    let path = format!("/proc/self/fd/{fd}\0");
    // SAFETY: a NUL-terminated path; raw system calls (no interposer).
    let m = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        ) as c_int
    };
    let src = if m >= 0 { m } else { fd };
    let seek = |off: i64, whence: c_int| -> i64 {
        // SAFETY: lseek of our own descriptor.
        unsafe { libc::syscall(libc::SYS_lseek, m, off, whence) }
    };
    let append = s.append.load(Ordering::Relaxed);
    let mut buf = vec![0u8; CHUNK.min(size as usize)];
    let (mut at, mut moved) = (0i64, 0u64);
    let mut failed = None;
    'ranges: while at < size {
        let (start, end) = if m >= 0 {
            let d = seek(at, libc::SEEK_DATA);
            if d < 0 {
                break;
            }
            let h = seek(d, libc::SEEK_HOLE);
            (d, if h < 0 { size } else { h.min(size) })
        } else {
            (at, size)
        };
        let mut o = start;
        while o < end {
            let want = (end - o).min(CHUNK as i64) as usize;
            // SAFETY: `buf` holds `want` bytes.
            let n = unsafe { libc::syscall(libc::SYS_pread64, src, buf.as_mut_ptr(), want, o) };
            if n <= 0 {
                break 'ranges;
            }
            // The memfd knows its holes by the page: the part of a page
            // before a stray write reads as zeros, and must not overwrite
            // what the library wrote there. So only runs of non-zero bytes
            // move (zeros written around the library over bytes it wrote
            // are not seen); the size is set below.
            for run in nonzero_runs(&buf[..n as usize]) {
                let data = &buf[run.clone()];
                let r = if append {
                    file.size().and_then(|z| file.write_at(z, data))
                } else {
                    file.write_at(o as u64 + run.start as u64, data)
                };
                if let Err(e) = r {
                    failed = Some(e);
                    break 'ranges;
                }
                moved += data.len() as u64;
            }
            o += n;
        }
        at = end;
    }
    if failed.is_none() && !append {
        // Trailing zeros written around the library still make the file
        // that long.
        if let Err(e) = file.extend_to(size as u64) {
            failed = Some(e);
        }
    }
    if let Some(e) = failed {
        note_failure(format!(
            "bytes written around the library to a placeholder: {e}"
        ));
    }
    // SAFETY: raw system calls on descriptors of this process; ftruncate
    // leaves the offset alone.
    unsafe {
        if m >= 0 {
            libc::syscall(libc::SYS_close, m);
        }
        libc::syscall(libc::SYS_ftruncate, fd, 0);
    }
    // Something was written (if only zeros): size and mtime to record.
    s.dirty.store(true, Ordering::SeqCst);
    crate::cache::drop_attr(s.h.oid);
    count(C::StrayBytes, moved);
}

/// At exit, before glibc's own last flush: flush every stream, then move
/// what reached placeholders and record their size and mtime (a program
/// need not close what it wrote).
pub(crate) extern "C" fn at_exit() {
    if crate::table::NTRACKED.load(Ordering::Relaxed) == 0 {
        return;
    }
    // SAFETY: fflush(NULL) flushes every output stream; stdio is intact
    // until glibc's own cleanup, which runs after the atexit handlers.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    let Some(_b) = Busy::enter() else { return };
    // Another thread may hold the table while the process exits: skip then.
    let Some(t) = FDS.try_read() else { return };
    let live = live_placeholders(&t);
    drop(t);
    for (fd, s) in live {
        if lookup(fd).is_some_and(|x| Arc::ptr_eq(&x, &s)) {
            adopt(fd, &s);
            if let Some(p) = of(&s) {
                record(&s, p);
            }
        }
    }
}

/// The ranges of `b` holding non-zero bytes.
fn nonzero_runs(b: &[u8]) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        i += b[i..].iter().position(|&x| x != 0)?;
        let start = i;
        i += b[i..].iter().position(|&x| x == 0).unwrap_or(b.len() - i);
        Some(start..i)
    })
}

#[cfg(test)]
mod tests {
    use super::nonzero_runs;

    #[test]
    fn runs_of_nonzero_bytes() {
        let r: Vec<_> = nonzero_runs(b"\0\0ab\0c\0\0").collect();
        assert_eq!(r, vec![2..4, 5..6]);
        assert_eq!(nonzero_runs(b"xyz").collect::<Vec<_>>(), vec![0..3]);
        assert_eq!(nonzero_runs(b"\0\0").count(), 0);
        assert_eq!(nonzero_runs(b"").count(), 0);
    }
}
