//! Directories this process changed through the library, made fresh in
//! the kernel before another program can look at them.
//!
//! The library creates, removes and renames entries behind the kernel's
//! back, so the kernel (and the daemon, which keeps directory attributes
//! too) can still hold a changed directory's old link count and times for
//! up to the attribute timeout. Within one process that is the documented
//! bound. Across programs it broke real use: `mkdir -p d/x` opens `d` on the
//! kernel path before it makes `x` through the library, and a `tar czf
//! t.tgz d` right after it saw `d` change under it (the kernel's link
//! count, then the store's) and exited 1, "file changed as we read it".
//!
//! So the directories each change touched are remembered, and before fork,
//! exec, a spawn and exit (`exit` and `_exit`: dash leaves with `_exit`)
//! they are named to the daemon in one `PEREGRINE_IOC_INVALIDATE_DIRS` on
//! the mount's root (`opendir`, the ioctl, `releasedir`: three FUSE
//! requests per mount per flush, none on the path of the change itself).
//! A program the process starts, or one that runs after it ends (a shell's
//! next command), sees the changes at once. A mount with more changed
//! directories than one call takes is flushed as it fills.

use crate::real::{errno, ioctl_raw, set_errno};
use crate::walk::Loc;
use libc::c_int;
use peregrine::dirs_changed::{encode, DIRS_MAX, DIRS_SIZE, IOC_INVALIDATE_DIRS};
use peregrine::sync::Mutex;
use peregrine::ObjectId;

/// Changed directories of one mount.
struct Changed {
    dev: (u32, u32),
    /// The mount point, NUL-terminated.
    mount_point: Vec<u8>,
    dirs: Vec<ObjectId>,
}

static CHANGED: Mutex<Vec<Changed>> = Mutex::new(Vec::new());

/// A change through the library (that succeeded or may have) touched
/// `dirs` of `loc`'s mount.
pub(crate) fn changed(loc: &Loc, dirs: &[ObjectId]) {
    let full = {
        let mut all = CHANGED.lock();
        let dev = loc.ns.mnt.dev;
        let i = match all.iter().position(|c| c.dev == dev) {
            Some(i) => i,
            None => {
                let mut mount_point = loc.mount_point();
                mount_point.push(0);
                all.push(Changed {
                    dev,
                    mount_point,
                    dirs: Vec::new(),
                });
                all.len() - 1
            }
        };
        let c = &mut all[i];
        for d in dirs {
            if !c.dirs.contains(d) {
                c.dirs.push(*d);
            }
        }
        (c.dirs.len() >= DIRS_MAX).then(|| all.swap_remove(i))
    };
    if let Some(c) = full {
        tell(&c);
    }
}

/// Before fork, exec and a spawn: name every changed directory to its
/// mount's daemon.
pub(crate) fn flush() {
    let all = std::mem::take(&mut *CHANGED.lock());
    if all.is_empty() {
        return;
    }
    // The caller's errno is its own (fork and exec report theirs after).
    let e = errno();
    for c in &all {
        tell(c);
    }
    set_errno(e);
}

/// On the way out (exit's handlers, `_exit`), maybe from a signal handler:
/// no waiting for the lock (this thread may hold it), no allocation and
/// no free (malloc may be what was interrupted).
fn flush_on_exit() {
    let Some(mut g) = CHANGED.try_lock() else {
        return;
    };
    let all = std::mem::take(&mut *g);
    drop(g);
    for c in &all {
        tell(c);
    }
    std::mem::forget(all);
}

pub(crate) extern "C" fn at_exit() {
    flush_on_exit();
}

/// fork: hold the list across it.
pub(crate) fn hold_across_fork() {
    CHANGED.hold_across_fork();
}

fn tell(c: &Changed) {
    // SAFETY: a NUL-terminated path; the system call, no interposer.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c.mount_point.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    } as c_int;
    if fd < 0 {
        return; // unmounted or over-mounted: the attribute timeout bounds it
    }
    let mut b = [0u8; DIRS_SIZE];
    for part in c.dirs.chunks(DIRS_MAX) {
        encode(part, &mut b);
        // SAFETY: the ioctl reads DIRS_SIZE bytes from b. An older daemon
        // answers ENOTTY: the attribute timeout bounds it.
        unsafe {
            ioctl_raw(
                fd,
                IOC_INVALIDATE_DIRS as libc::c_ulong,
                b.as_mut_ptr().cast(),
            )
        };
    }
    // SAFETY: our own descriptor.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// `_exit` and `_Exit` skip exit's handlers; shells (dash) leave with them.
/// glibc's own `_exit` is this system call.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    flush_on_exit();
    loop {
        libc::syscall(libc::SYS_exit_group, status);
    }
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    _exit(status)
}
