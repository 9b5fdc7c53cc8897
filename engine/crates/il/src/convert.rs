//! The calls that need a placeholder's real file (see place.rs): the
//! placeholder is converted first, then the real function runs. Exec and
//! spawn convert every placeholder the new program could inherit.

use crate::place::{convert_all, to_kernel};
use crate::real::set_errno;
use crate::report::{enabled, Busy};
use crate::table::{guarded, NTRACKED};
use libc::{c_char, c_int, c_ulong, c_void, off_t, pid_t, size_t, ssize_t, FILE};
use std::sync::atomic::Ordering;

/// Convert `fd` if it is a placeholder: Err(errno) if it cannot be.
fn pre(fd: c_int) -> Result<(), c_int> {
    if NTRACKED.load(Ordering::Relaxed) == 0 || !enabled() {
        return Ok(());
    }
    let Some(_b) = Busy::enter() else {
        return Ok(());
    };
    guarded(Err(libc::EIO), || to_kernel(fd))
}

/// After a call that changed the bytes of `fd`'s file on the kernel path
/// (fallocate, splice into it): what this process keeps of them and of
/// its attributes is stale (data_cache.rs). An untracked descriptor's
/// file was dropped when it was opened (track.rs).
fn changed_on_kernel_path(fd: c_int) {
    if NTRACKED.load(Ordering::Relaxed) == 0 || !enabled() {
        return;
    }
    if let Some(s) = crate::table::lookup(fd) {
        crate::cache::drop_attr(s.h.oid);
    }
}

/// A call on a descriptor that needs a placeholder's real file;
/// `@changes`: one that changes the file's bytes when it returns 0.
macro_rules! converts {
    (@inner $changes:expr, $name:ident, $real:ident, $ret:ty, $fail:expr, $sym:literal,
     ($fd:ident : c_int $(, $a:ident : $t:ty)*)) => {
        real!($real, $sym, unsafe extern "C" fn(c_int $(, $t)*) -> $ret);
        #[no_mangle]
        pub unsafe extern "C" fn $name($fd: c_int $(, $a: $t)*) -> $ret {
            if let Err(e) = pre($fd) {
                set_errno(e);
                return $fail;
            }
            let r = $real()($fd $(, $a)*);
            if $changes && r == 0 {
                changed_on_kernel_path($fd);
            }
            r
        }
    };
    (@changes $($rest:tt)*) => { converts!(@inner true, $($rest)*); };
    ($($rest:tt)*) => { converts!(@inner false, $($rest)*); };
}

converts!(flock, r_flock, c_int, -1, "flock", (fd: c_int, op: c_int));
// ioctl is variadic; its third argument is passed as a pointer-sized
// integer in the same register (see "Variadic" in the crate docs).
converts!(ioctl, r_ioctl, c_int, -1, "ioctl", (fd: c_int, req: c_ulong, arg: *mut c_void));
converts!(fstatfs, r_fstatfs, c_int, -1, "fstatfs", (fd: c_int, b: *mut libc::statfs));
converts!(fstatfs64, r_fstatfs64, c_int, -1, "fstatfs64", (fd: c_int, b: *mut libc::statfs));
converts!(fstatvfs, r_fstatvfs, c_int, -1, "fstatvfs", (fd: c_int, b: *mut libc::statvfs));
converts!(fstatvfs64, r_fstatvfs64, c_int, -1, "fstatvfs64", (fd: c_int, b: *mut libc::statvfs));
converts!(@changes fallocate, r_fallocate, c_int, -1, "fallocate", (fd: c_int, m: c_int, o: off_t, l: off_t));
converts!(@changes fallocate64, r_fallocate64, c_int, -1, "fallocate64", (fd: c_int, m: c_int, o: off_t, l: off_t));
converts!(fgetxattr, r_fgetxattr, ssize_t, -1, "fgetxattr",
    (fd: c_int, n: *const c_char, v: *mut c_void, z: size_t));
converts!(fsetxattr, r_fsetxattr, c_int, -1, "fsetxattr",
    (fd: c_int, n: *const c_char, v: *const c_void, z: size_t, f: c_int));
converts!(flistxattr, r_flistxattr, ssize_t, -1, "flistxattr", (fd: c_int, l: *mut c_char, z: size_t));
converts!(fremovexattr, r_fremovexattr, c_int, -1, "fremovexattr", (fd: c_int, n: *const c_char));
converts!(syncfs, r_syncfs, c_int, -1, "syncfs", (fd: c_int));
converts!(fchdir, r_fchdir, c_int, -1, "fchdir", (fd: c_int));
converts!(readahead, r_readahead, ssize_t, -1, "readahead", (fd: c_int, o: off_t, z: size_t));

real!(
    r_posix_fallocate,
    "posix_fallocate",
    unsafe extern "C" fn(c_int, off_t, off_t) -> c_int
);
real!(
    r_posix_fallocate64,
    "posix_fallocate64",
    unsafe extern "C" fn(c_int, off_t, off_t) -> c_int
);

/// posix_fallocate returns the error number instead of setting errno.
#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, o: off_t, l: off_t) -> c_int {
    match pre(fd) {
        Err(e) => e,
        Ok(()) => changing(fd, r_posix_fallocate()(fd, o, l)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, o: off_t, l: off_t) -> c_int {
    match pre(fd) {
        Err(e) => e,
        Ok(()) => changing(fd, r_posix_fallocate64()(fd, o, l)),
    }
}

/// `r`, the result of a posix_fallocate of `fd` (0: done).
fn changing(fd: c_int, r: c_int) -> c_int {
    if r == 0 {
        changed_on_kernel_path(fd);
    }
    r
}

type SpliceFn = unsafe extern "C" fn(
    c_int,
    *mut libc::loff_t,
    c_int,
    *mut libc::loff_t,
    size_t,
    u32,
) -> ssize_t;
real!(r_splice, "splice", SpliceFn);
real!(
    r_tee,
    "tee",
    unsafe extern "C" fn(c_int, c_int, size_t, u32) -> ssize_t
);

#[no_mangle]
pub unsafe extern "C" fn splice(
    i: c_int,
    oi: *mut libc::loff_t,
    o: c_int,
    oo: *mut libc::loff_t,
    n: size_t,
    f: u32,
) -> ssize_t {
    if let Err(e) = pre(i).and_then(|_| pre(o)) {
        set_errno(e);
        return -1;
    }
    let r = r_splice()(i, oi, o, oo, n, f);
    if r > 0 {
        changed_on_kernel_path(o);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn tee(i: c_int, o: c_int, n: size_t, f: u32) -> ssize_t {
    if let Err(e) = pre(i).and_then(|_| pre(o)) {
        set_errno(e);
        return -1;
    }
    r_tee()(i, o, n, f)
}

// ------------------------------------------------------------ exec, spawn

type Argv = *const *const c_char;
real!(
    r_execve,
    "execve",
    unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int
);
real!(
    r_execv,
    "execv",
    unsafe extern "C" fn(*const c_char, Argv) -> c_int
);
real!(
    r_execvp,
    "execvp",
    unsafe extern "C" fn(*const c_char, Argv) -> c_int
);
real!(
    r_execvpe,
    "execvpe",
    unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int
);
real!(
    r_fexecve,
    "fexecve",
    unsafe extern "C" fn(c_int, Argv, Argv) -> c_int
);
type SpawnFn = unsafe extern "C" fn(
    *mut pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    Argv,
    Argv,
) -> c_int;
real!(r_posix_spawn, "posix_spawn", SpawnFn);
real!(r_posix_spawnp, "posix_spawnp", SpawnFn);
real!(
    r_system,
    "system",
    unsafe extern "C" fn(*const c_char) -> c_int
);
real!(
    r_popen,
    "popen",
    unsafe extern "C" fn(*const c_char, *const c_char) -> *mut FILE
);

/// Before fork, exec or a spawn: placeholders become the real files (all,
/// or those an exec keeps), and the directories this process changed are
/// made fresh in the kernel for the program that runs next. The bytes
/// this process wrote are no longer served from memory: the program it
/// starts may change them, and the process read them back once it ends
/// (a test harness, a build step). The data of files it removed is
/// punched (an exec would leave what waits in the queue unpunched).
pub(crate) fn hand_over(all: bool) {
    convert_all(all);
    crate::dirs_changed::flush();
    crate::data_cache::clear();
    crate::ns::settle_discards();
}

#[no_mangle]
pub unsafe extern "C" fn execve(p: *const c_char, a: Argv, e: Argv) -> c_int {
    hand_over(false);
    r_execve()(p, a, e)
}

#[no_mangle]
pub unsafe extern "C" fn execv(p: *const c_char, a: Argv) -> c_int {
    hand_over(false);
    r_execv()(p, a)
}

#[no_mangle]
pub unsafe extern "C" fn execvp(p: *const c_char, a: Argv) -> c_int {
    hand_over(false);
    r_execvp()(p, a)
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(p: *const c_char, a: Argv, e: Argv) -> c_int {
    hand_over(false);
    r_execvpe()(p, a, e)
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, a: Argv, e: Argv) -> c_int {
    hand_over(false);
    r_fexecve()(fd, a, e)
}

/// Spawns: the file actions may dup any descriptor into the child, so
/// every placeholder is converted.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    p: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    a: Argv,
    e: Argv,
) -> c_int {
    hand_over(true);
    r_posix_spawn()(pid, p, fa, at, a, e)
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    p: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    a: Argv,
    e: Argv,
) -> c_int {
    hand_over(true);
    r_posix_spawnp()(pid, p, fa, at, a, e)
}

#[no_mangle]
pub unsafe extern "C" fn system(c: *const c_char) -> c_int {
    hand_over(true);
    r_system()(c)
}

#[no_mangle]
pub unsafe extern "C" fn popen(c: *const c_char, m: *const c_char) -> *mut FILE {
    hand_over(true);
    r_popen()(c, m)
}

/// vfork is a fork here. The child of a real vfork shares the parent's
/// memory (the library's tables included) but not its descriptors, and
/// no fork handler runs: the library could not convert the parent's
/// placeholders for it (dash, for one, redirects in the parent, vforks and
/// execs in the child). And an interposer cannot call the real vfork and
/// return in both processes (the child would run on the frame the parent
/// still needs). POSIX lets a vfork child do little more than exec and
/// _exit, which a fork child does the same; the cost is the page-table
/// copy. fork's handlers convert the placeholders first.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> pid_t {
    libc::fork()
}
