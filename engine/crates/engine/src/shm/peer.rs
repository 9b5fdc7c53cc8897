//! Who connected: the peer's credentials and pidfd, taken at accept, and
//! what /proc tells of that process since.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected.
const SO_PEERPIDFD: libc::c_int = 77;

/// The process at the other end of a connection, as the kernel recorded it
/// when it connected, and a pidfd of that process, both taken at accept.
pub(super) struct Peer {
    pub(super) pid: i32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    /// The process that connected, or why there is none to read from.
    pub(super) pidfd: Result<OwnedFd, String>,
}

impl Peer {
    pub(super) fn of(sock: &UnixStream) -> std::io::Result<Peer> {
        let fd = sock.as_raw_fd();
        // SAFETY: getsockopt into a properly sized ucred / int.
        let cred = unsafe {
            let mut cred: libc::ucred = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
            if libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                &mut cred as *mut _ as *mut libc::c_void,
                &mut len,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            cred
        };
        let pidfd = if cred.pid <= 0 {
            Err("the client's pid is not visible in this pid namespace".to_string())
        } else {
            // SAFETY: as above; a pidfd received is a new fd we own.
            unsafe {
                let mut pfd: libc::c_int = -1;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                if libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    SO_PEERPIDFD,
                    &mut pfd as *mut _ as *mut libc::c_void,
                    &mut len,
                ) == 0
                    && pfd >= 0
                {
                    Ok(OwnedFd::from_raw_fd(pfd))
                } else {
                    // Older kernels: the pid as it is now, right after accept.
                    let pfd = libc::syscall(libc::SYS_pidfd_open, cred.pid, 0);
                    if pfd < 0 {
                        Err(format!("pidfd_open: {}", std::io::Error::last_os_error()))
                    } else {
                        Ok(OwnedFd::from_raw_fd(pfd as i32))
                    }
                }
            }
        };
        Ok(Peer {
            pid: cred.pid,
            uid: cred.uid,
            gid: cred.gid,
            pidfd,
        })
    }
}

/// Whether the process behind `pidfd` has exited (pid possibly reused).
pub(super) fn exited(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll of one pollfd we own, without waiting.
    unsafe { libc::poll(&mut p, 1, 0) != 0 }
}

/// The four ids (real, effective, saved, filesystem) of a `/proc/PID/status` line.
pub(super) fn status_ids(status: &str, key: &str) -> Option<[u32; 4]> {
    let line = status.lines().find_map(|l| l.strip_prefix(key))?;
    let v: Vec<u32> = line
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    v.try_into().ok()
}
