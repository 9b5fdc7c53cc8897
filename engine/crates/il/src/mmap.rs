//! mmap: a file about to be mapped goes back to the kernel path for the
//! rest of the process (see "mmap" in the crate docs).

use crate::handle::IOC_INVALIDATE;
use crate::real::{ioctl_raw, r_mmap, r_mmap64, set_errno, MmapFn};
use crate::report::{count, enabled, note_failure, Busy, C};
use crate::table::{guarded, lookup, Shared, FDS, MAPPED, NTRACKED};
use crate::track::peregrine_file;
use libc::{c_int, c_void, off_t, size_t};
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
    // Written through the mapping from now on, behind the library.
    crate::data_cache::clear();
    // Its placeholders become the real file first: retired below, they
    // must still be descriptors of the file.
    crate::place::convert_key(key);
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
pub(crate) fn refresh_size(fd: c_int) {
    // SAFETY: statx is plain integers, for which all zeroes is valid.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is the caller's descriptor, the empty path with AT_EMPTY_PATH
    // names it, and `sx` is a live local statx the kernel fills.
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
            // A placeholder maps the real file.
            if let Err(x) = guarded(Err(libc::EIO), || crate::place::to_kernel(fd)) {
                set_errno(x);
                return libc::MAP_FAILED;
            }
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
