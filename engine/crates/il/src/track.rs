//! Tracking: after an open, take a file of a Peregrine mount onto the
//! library's path; invalidate the kernel's view after writes behind its back.

use crate::handle::{Handle, HANDLE_SIZE, IOC_GET_HANDLE, IOC_INVALIDATE};
use crate::mounts::is_peregrine_dev;
use crate::real::{ioctl_raw, r_fcntl};
use crate::report::{count, enabled, note_failure, Busy, C};
use crate::table::{insert, remove, Key, Shared, MAPPED};
use libc::{c_int, c_void};
use peregrine::sync::Mutex;
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// After a successful real open of `fd`: track it if it is a regular file
/// of a Peregrine mount whose handle the daemon hands out.
pub(crate) fn maybe_track(fd: c_int) {
    if fd < 0 || !enabled() {
        return;
    }
    // A stale entry (fd closed behind our back, e.g. by close_range).
    remove(fd);
    let Some(_b) = Busy::enter() else { return };
    let _ = catch_unwind(|| track(fd));
}

/// statx of `fd` itself, from the kernel's cache (no round trip to the
/// daemon); the device is always filled in, the rest as `mask` asks.
fn statx_fd(fd: c_int, mask: u32) -> Option<libc::statx> {
    // SAFETY: statx is plain integers, for which all zeroes is valid.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is the caller's descriptor, the empty path with AT_EMPTY_PATH
    // names it, and `sx` is a live local statx the kernel fills.
    let r = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            mask,
            &mut sx,
        )
    };
    (r == 0).then_some(sx)
}

/// Is `fd` open on anything in a Peregrine mount (a file, a directory)?
pub(crate) fn in_peregrine_mount(fd: c_int) -> bool {
    statx_fd(fd, 0).is_some_and(|sx| is_peregrine_dev((sx.stx_dev_major, sx.stx_dev_minor)))
}

/// `fd`'s file if it is a regular file of a Peregrine mount.
pub(crate) fn peregrine_file(fd: c_int) -> Option<Key> {
    let sx = statx_fd(fd, libc::STATX_TYPE | libc::STATX_INO)?;
    if (sx.stx_mode as u32 & libc::S_IFMT) != libc::S_IFREG {
        return None;
    }
    let dev = (sx.stx_dev_major, sx.stx_dev_minor);
    is_peregrine_dev(dev).then_some((dev.0, dev.1, sx.stx_ino))
}

fn track(fd: c_int) {
    let Some(key) = peregrine_file(fd) else {
        return;
    };
    // SAFETY: real fcntl on the fd just opened.
    let fl = unsafe { r_fcntl()(fd, libc::F_GETFL, 0) };
    if fl < 0 || fl & libc::O_PATH != 0 {
        return;
    }
    if !track_file(fd, key, fl) && fl & libc::O_ACCMODE != libc::O_RDONLY {
        // Its writes stay on the kernel path, unseen by the bytes this
        // process keeps of the files it wrote (data_cache.rs).
        crate::data_cache::clear();
    }
}

/// Track `fd`, open on file `key` with flags `fl`: false if it stays on
/// the kernel path.
fn track_file(fd: c_int, key: Key, fl: c_int) -> bool {
    if MAPPED.lock().contains(&key) {
        // Mapped in this process: the kernel path, which the mapping
        // shares pages with.
        return false;
    }
    let mut b = [0u8; HANDLE_SIZE];
    // SAFETY: the ioctl writes HANDLE_SIZE bytes into b.
    if unsafe { ioctl_raw(fd, IOC_GET_HANDLE, b.as_mut_ptr() as *mut c_void) } != 0 {
        note_failure(format!("handle ioctl: {}", std::io::Error::last_os_error()));
        count(C::Fallbacks, 1);
        return false;
    }
    let Some(h) = Handle::parse(&b) else {
        note_failure("handle ioctl: a handle of an unknown version".into());
        count(C::Fallbacks, 1);
        return false;
    };
    crate::table::daemon::prime(fd, &h, crate::table::is_open(&h));
    crate::ns::learn((key.0, key.1), &h);
    crate::nsops::kernel_knows(h.oid);
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
        ph: None,
    };
    // Connect now: a failure leaves the fd on the kernel path.
    if s.file().is_err() {
        count(C::Fallbacks, 1);
        return false;
    }
    let tracked = insert(fd, Arc::new(s));
    if tracked {
        count(C::Opens, 1);
    }
    tracked
}

/// Before the kernel changes the attributes of `fd`'s file (fchmod,
/// fchown, futimens): a placeholder becomes the real file, and writes
/// through the library are reported to the daemon now. Reported at close
/// instead, they would make the daemon record the close's time as the
/// mtime over one set here (tar sets it after writing, then closes).
pub(crate) fn before_kernel_change_on(fd: c_int) -> Result<(), c_int> {
    crate::place::to_kernel(fd)?;
    if let Some(s) = crate::table::lookup(fd) {
        invalidate(fd, &s);
    }
    Ok(())
}

/// Make the kernel's view right after writes behind its back.
pub(crate) fn invalidate(fd: c_int, s: &Shared) {
    if let Some(p) = crate::place::of(s) {
        // No kernel file behind it: record size and mtime in the entry.
        crate::stray::adopt(fd, s);
        return crate::place::record(s, p);
    }
    if s.dirty.swap(false, Ordering::AcqRel) {
        count(C::Invalidates, 1);
        // The daemon records size and mtime in the entry at close.
        crate::cache::entry_changed(s.h.oid);
        // SAFETY: argument-less ioctl.
        if unsafe { ioctl_raw(fd, IOC_INVALIDATE, std::ptr::null_mut()) } != 0 {
            // An older daemon: at least refresh the attributes on expiry.
            s.dirty.store(false, Ordering::Release);
        }
    }
}
