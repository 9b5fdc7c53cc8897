//! Descriptors the client keeps stay above 0, 1 and 2. A program that
//! closed stdin, stdout or stderr expects its next open to get that
//! number back, and its streams read and write those numbers; a
//! connection left there (the interception library connects from inside
//! the program's own calls) would get the program's output as frames.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `fd`, or a duplicate of it numbered 3 or more (close-on-exec) if it
/// landed on 0-2.
pub(crate) fn above_stdio(fd: OwnedFd) -> OwnedFd {
    if fd.as_raw_fd() > 2 {
        return fd;
    }
    // SAFETY: F_DUPFD_CLOEXEC of a descriptor we own; the new one is ours.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return fd;
    }
    // SAFETY: `n` was just made by fcntl and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(n) }
}

/// [`above_stdio`] for a socket type.
pub(crate) fn socket_above_stdio<T: From<OwnedFd> + Into<OwnedFd>>(s: T) -> T {
    T::from(above_stdio(s.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_on_0_to_2_moves_up_and_others_stay() {
        // A descriptor above 2 stays; in a child with 0 closed, one that
        // lands on 0 moves up and leaves 0 free.
        let mut p = [0; 2];
        // SAFETY: pipe fills two descriptors.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: both ends are ours.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        let raw = r.as_raw_fd();
        assert!(raw > 2);
        assert_eq!(above_stdio(r).as_raw_fd(), raw);
        // SAFETY: fork; the child only makes system calls and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: in the child: close 0, duplicate onto it, check.
            unsafe {
                libc::close(0);
                let low = libc::dup(w.as_raw_fd());
                let moved = above_stdio(OwnedFd::from_raw_fd(low)).as_raw_fd();
                let free = libc::fcntl(0, libc::F_GETFD) < 0;
                libc::_exit(if low == 0 && moved > 2 && free { 0 } else { 1 });
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
