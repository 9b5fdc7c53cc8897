//! The answer to the webhook's check (`peregrine-il-check`, csi/ilcheck): whether a pod image's
//! loader binds this library.

/// `PEREGRINE_IL_PROBE=PATH`: the webhook's check (peregrine-il-check) asks whether the image's
/// loader binds this library. Reaching this constructor means it did, so the answer goes into PATH
/// and the process ends before the program's main runs; raw system calls, because this library's
/// own open and write are the intercepted ones.
pub(crate) fn answer() {
    // SAFETY: getenv with a NUL-terminated name; the path is NUL-terminated by the environment
    // block; the buffer outlives the write; _exit does not return.
    unsafe {
        let path = libc::getenv(c"PEREGRINE_IL_PROBE".as_ptr());
        if path.is_null() {
            return;
        }
        let fd = libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644,
        );
        if fd >= 0 {
            let msg = b"peregrine-il bound\n";
            libc::syscall(libc::SYS_write, fd, msg.as_ptr(), msg.len());
            libc::syscall(libc::SYS_close, fd);
        }
        libc::_exit(0);
    }
}
