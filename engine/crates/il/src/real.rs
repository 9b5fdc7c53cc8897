//! The real functions: the next definition of each intercepted symbol
//! (dlsym RTLD_NEXT), and the raw system calls the library makes itself.

use libc::{c_char, c_int, c_uint, c_ulong, c_void, iovec, off64_t, off_t, size_t, ssize_t, FILE};

/// `fn $acc() -> $ty`: the next definition of `$sym` (dlsym RTLD_NEXT),
/// resolved once. Paths are absolute so that any module can use it.
macro_rules! real {
    ($acc:ident, $sym:literal, $ty:ty) => {
        #[inline]
        pub(crate) fn $acc() -> $ty {
            static P: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let mut p = P.load(std::sync::atomic::Ordering::Relaxed);
            if p == 0 {
                // SAFETY: dlsym with a NUL-terminated name.
                p = unsafe {
                    libc::dlsym(
                        libc::RTLD_NEXT,
                        concat!($sym, "\0").as_ptr() as *const libc::c_char,
                    )
                } as usize;
                if p == 0 {
                    $crate::real::die(concat!("peregrine-il: no real ", $sym, "\n"));
                }
                P.store(p, std::sync::atomic::Ordering::Relaxed);
            }
            // SAFETY: p is the address of the C function `$sym`, whose
            // prototype is `$ty` (glibc, x86-64).
            unsafe { std::mem::transmute::<usize, $ty>(p) }
        }
    };
}

pub(crate) fn die(msg: &str) -> ! {
    // SAFETY: raw syscalls on a static buffer.
    unsafe {
        libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
        libc::abort()
    }
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint) -> c_int;
type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type Openat2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;
type CreatFn = unsafe extern "C" fn(*const c_char, libc::mode_t) -> c_int;
type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut FILE;
type FdopenFn = unsafe extern "C" fn(c_int, *const c_char) -> *mut FILE;
type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t) -> ssize_t;
type PwriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t;
type ReadChkFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, size_t) -> ssize_t;
type PreadChkFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t, size_t) -> ssize_t;
type VFn = unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;
type PVFn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t) -> ssize_t;
type PV2Fn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t, c_int) -> ssize_t;
type LseekFn = unsafe extern "C" fn(c_int, off_t, c_int) -> off_t;
type FdFn = unsafe extern "C" fn(c_int) -> c_int;
type FtruncFn = unsafe extern "C" fn(c_int, off_t) -> c_int;
type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
pub(crate) type FcntlFn = unsafe extern "C" fn(c_int, c_int, c_ulong) -> c_int;
type CfrFn =
    unsafe extern "C" fn(c_int, *mut off64_t, c_int, *mut off64_t, size_t, c_uint) -> ssize_t;
pub(crate) type SendfileFn = unsafe extern "C" fn(c_int, c_int, *mut off_t, size_t) -> ssize_t;
type FreadFn = unsafe extern "C" fn(*mut c_void, size_t, size_t, *mut FILE) -> size_t;
type FwriteFn = unsafe extern "C" fn(*const c_void, size_t, size_t, *mut FILE) -> size_t;
type FreadChkFn = unsafe extern "C" fn(*mut c_void, size_t, size_t, size_t, *mut FILE) -> size_t;
type FseekFn = unsafe extern "C" fn(*mut FILE, off_t, c_int) -> c_int;
type FtellFn = unsafe extern "C" fn(*mut FILE) -> off_t;
type FileFn = unsafe extern "C" fn(*mut FILE) -> c_int;
type FtellLongFn = unsafe extern "C" fn(*mut FILE) -> libc::c_long;
type FseekLongFn = unsafe extern "C" fn(*mut FILE, libc::c_long, c_int) -> c_int;
type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
type XstatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat) -> c_int;
type FstatatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type FxstatatFn =
    unsafe extern "C" fn(c_int, c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type StatxFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int;
type AccessFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FaccessatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;
pub(crate) type MmapFn =
    unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;

real!(r_open, "open", OpenFn);
real!(r_open64, "open64", OpenFn);
real!(r_openat, "openat", OpenatFn);
real!(r_openat64, "openat64", OpenatFn);
real!(r_open_2, "__open_2", Open2Fn);
real!(r_open64_2, "__open64_2", Open2Fn);
real!(r_openat_2, "__openat_2", Openat2Fn);
real!(r_openat64_2, "__openat64_2", Openat2Fn);
real!(r_creat, "creat", CreatFn);
real!(r_creat64, "creat64", CreatFn);
real!(r_fopen, "fopen", FopenFn);
real!(r_fopen64, "fopen64", FopenFn);
real!(r_fdopen, "fdopen", FdopenFn);
real!(r_read, "read", ReadFn);
real!(r_write, "write", WriteFn);
real!(r_pread, "pread", PreadFn);
real!(r_pread64, "pread64", PreadFn);
real!(r_pwrite, "pwrite", PwriteFn);
real!(r_pwrite64, "pwrite64", PwriteFn);
real!(r_read_chk, "__read_chk", ReadChkFn);
real!(r_pread_chk, "__pread_chk", PreadChkFn);
real!(r_pread64_chk, "__pread64_chk", PreadChkFn);
real!(r_readv, "readv", VFn);
real!(r_writev, "writev", VFn);
real!(r_preadv, "preadv", PVFn);
real!(r_preadv64, "preadv64", PVFn);
real!(r_pwritev, "pwritev", PVFn);
real!(r_pwritev64, "pwritev64", PVFn);
real!(r_preadv2, "preadv2", PV2Fn);
real!(r_pwritev2, "pwritev2", PV2Fn);
real!(r_preadv64v2, "preadv64v2", PV2Fn);
real!(r_pwritev64v2, "pwritev64v2", PV2Fn);
real!(r_lseek, "lseek", LseekFn);
real!(r_lseek64, "lseek64", LseekFn);
real!(r_fsync, "fsync", FdFn);
real!(r_fdatasync, "fdatasync", FdFn);
real!(r_ftruncate, "ftruncate", FtruncFn);
real!(r_ftruncate64, "ftruncate64", FtruncFn);
real!(r_close, "close", FdFn);
real!(r_dup, "dup", FdFn);
real!(r_dup2, "dup2", Dup2Fn);
real!(r_dup3, "dup3", Dup3Fn);
real!(r_fcntl, "fcntl", FcntlFn);
real!(r_fcntl64, "fcntl64", FcntlFn);
real!(r_copy_file_range, "copy_file_range", CfrFn);
real!(r_sendfile, "sendfile", SendfileFn);
real!(r_sendfile64, "sendfile64", SendfileFn);
real!(r_fread, "fread", FreadFn);
real!(r_fwrite, "fwrite", FwriteFn);
real!(r_fread_unlocked, "fread_unlocked", FreadFn);
real!(r_fwrite_unlocked, "fwrite_unlocked", FwriteFn);
real!(r_fread_chk, "__fread_chk", FreadChkFn);
real!(r_fseek, "fseek", FseekLongFn);
real!(r_fseeko, "fseeko", FseekFn);
real!(r_fseeko64, "fseeko64", FseekFn);
real!(r_ftell, "ftell", FtellLongFn);
real!(r_ftello, "ftello", FtellFn);
real!(r_ftello64, "ftello64", FtellFn);
real!(r_fclose, "fclose", FileFn);
real!(r_fflush, "fflush", FileFn);
real!(r_mmap, "mmap", MmapFn);
real!(r_stat, "stat", StatFn);
real!(r_stat64, "stat64", StatFn);
real!(r_lstat, "lstat", StatFn);
real!(r_lstat64, "lstat64", StatFn);
real!(r_xstat, "__xstat", XstatFn);
real!(r_xstat64, "__xstat64", XstatFn);
real!(r_lxstat, "__lxstat", XstatFn);
real!(r_lxstat64, "__lxstat64", XstatFn);
real!(r_fstatat, "fstatat", FstatatFn);
real!(r_fstatat64, "fstatat64", FstatatFn);
real!(r_fxstatat, "__fxstatat", FxstatatFn);
real!(r_fxstatat64, "__fxstatat64", FxstatatFn);
real!(r_statx, "statx", StatxFn);
real!(r_access, "access", AccessFn);
real!(
    r_umask,
    "umask",
    unsafe extern "C" fn(libc::mode_t) -> libc::mode_t
);
type PathModeFn = unsafe extern "C" fn(*const c_char, libc::mode_t) -> c_int;
type PathFn = unsafe extern "C" fn(*const c_char) -> c_int;
type Path2Fn = unsafe extern "C" fn(*const c_char, *const c_char) -> c_int;
type OwnFn = unsafe extern "C" fn(*const c_char, libc::uid_t, libc::gid_t) -> c_int;
real!(r_mkdir, "mkdir", PathModeFn);
real!(
    r_mkdirat,
    "mkdirat",
    unsafe extern "C" fn(c_int, *const c_char, libc::mode_t) -> c_int
);
real!(r_unlink, "unlink", PathFn);
real!(r_rmdir, "rmdir", PathFn);

type OpendirFn = unsafe extern "C" fn(*const c_char) -> *mut libc::DIR;
type ReaddirFn = unsafe extern "C" fn(*mut libc::DIR) -> *mut libc::dirent64;
type ReaddirRFn =
    unsafe extern "C" fn(*mut libc::DIR, *mut libc::dirent64, *mut *mut libc::dirent64) -> c_int;
type DirFn = unsafe extern "C" fn(*mut libc::DIR) -> c_int;
type RewinddirFn = unsafe extern "C" fn(*mut libc::DIR);
type TelldirFn = unsafe extern "C" fn(*mut libc::DIR) -> libc::c_long;
type SeekdirFn = unsafe extern "C" fn(*mut libc::DIR, libc::c_long);
real!(r_opendir, "opendir", OpendirFn);
real!(r_readdir, "readdir", ReaddirFn);
real!(r_readdir64, "readdir64", ReaddirFn);
real!(r_readdir_r, "readdir_r", ReaddirRFn);
real!(r_readdir64_r, "readdir64_r", ReaddirRFn);
real!(r_closedir, "closedir", DirFn);
real!(r_rewinddir, "rewinddir", RewinddirFn);
real!(r_telldir, "telldir", TelldirFn);
real!(r_seekdir, "seekdir", SeekdirFn);
real!(
    r_unlinkat,
    "unlinkat",
    unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int
);
real!(r_rename, "rename", Path2Fn);
real!(
    r_renameat,
    "renameat",
    unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char) -> c_int
);
real!(
    r_renameat2,
    "renameat2",
    unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int
);
real!(r_chmod, "chmod", PathModeFn);
real!(
    r_fchmod,
    "fchmod",
    unsafe extern "C" fn(c_int, libc::mode_t) -> c_int
);
real!(
    r_fchmodat,
    "fchmodat",
    unsafe extern "C" fn(c_int, *const c_char, libc::mode_t, c_int) -> c_int
);
real!(r_chown, "chown", OwnFn);
real!(r_lchown, "lchown", OwnFn);
real!(
    r_fchown,
    "fchown",
    unsafe extern "C" fn(c_int, libc::uid_t, libc::gid_t) -> c_int
);
real!(
    r_fchownat,
    "fchownat",
    unsafe extern "C" fn(c_int, *const c_char, libc::uid_t, libc::gid_t, c_int) -> c_int
);
real!(
    r_truncate,
    "truncate",
    unsafe extern "C" fn(*const c_char, off_t) -> c_int
);
real!(
    r_truncate64,
    "truncate64",
    unsafe extern "C" fn(*const c_char, off_t) -> c_int
);
real!(
    r_utimensat,
    "utimensat",
    unsafe extern "C" fn(c_int, *const c_char, *const libc::timespec, c_int) -> c_int
);
real!(
    r_futimens,
    "futimens",
    unsafe extern "C" fn(c_int, *const libc::timespec) -> c_int
);
real!(
    r_utimes,
    "utimes",
    unsafe extern "C" fn(*const c_char, *const libc::timeval) -> c_int
);
real!(
    r_utime,
    "utime",
    unsafe extern "C" fn(*const c_char, *const libc::utimbuf) -> c_int
);
real!(r_symlink, "symlink", Path2Fn);
real!(
    r_symlinkat,
    "symlinkat",
    unsafe extern "C" fn(*const c_char, c_int, *const c_char) -> c_int
);
real!(r_link, "link", Path2Fn);
real!(
    r_linkat,
    "linkat",
    unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char, c_int) -> c_int
);
real!(
    r_mknod,
    "mknod",
    unsafe extern "C" fn(*const c_char, libc::mode_t, libc::dev_t) -> c_int
);
real!(
    r_mknodat,
    "mknodat",
    unsafe extern "C" fn(c_int, *const c_char, libc::mode_t, libc::dev_t) -> c_int
);
real!(r_faccessat, "faccessat", FaccessatFn);
real!(r_euidaccess, "euidaccess", AccessFn);
real!(r_eaccess, "eaccess", AccessFn);
real!(r_mmap64, "mmap64", MmapFn);

/// The kernel's fstat (same `struct stat` as glibc's on x86-64), without
/// depending on which stat symbols this glibc exports.
pub(crate) unsafe fn sys_fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    libc::syscall(libc::SYS_fstat, fd, st) as c_int
}

pub(crate) unsafe fn ioctl_raw(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    libc::syscall(libc::SYS_ioctl, fd, req, arg) as c_int
}

pub(crate) fn errno() -> c_int {
    // SAFETY: the thread's errno.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: the thread's errno.
    unsafe { *libc::__errno_location() = e };
}
