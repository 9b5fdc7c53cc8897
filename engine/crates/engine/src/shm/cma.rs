//! Direct reads of a client's memory (`process_vm_readv`): the probe that
//! allows them, the residency check, and an update's values read that way.

use super::connection::Live;
use super::peer::{exited, status_ids, Peer};
use peregrine_proto::shm::{self as wire, Hello, RemotePart};
use peregrine_vos::SharedBytes;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Remote bulks up to this size are checked for residency (a pagemap read
/// of 2 KiB per MiB) and, when resident, read by the target itself; larger
/// ones go to the connection's thread.
const RESIDENT_CHECK_MAX: u64 = 16 << 20;

/// A client process whose memory the engine reads with `process_vm_readv`.
/// Its pidfd (taken at connect) tells whether it is still the process that
/// connected: a pid is only reused once its process is gone, so a read
/// followed by a look at the pidfd that finds the process alive read that
/// process and no other. The probe word, read again with every read, tells
/// whether that process still runs the program that sent the hello.
pub(super) struct Cma {
    pub(super) pid: i32,
    pub(super) pidfd: OwnedFd,
    pub(super) probe: u64,
    nonce: u64,
    /// `/proc/PID/pagemap`, to tell whether values are resident anonymous memory.
    pagemap: std::fs::File,
}

/// Why a direct read failed: the client's memory (its fault), or a client
/// process that is no longer the one that sent the hello.
pub(super) enum CmaError {
    Read(std::io::Error),
    Changed(String),
}

impl Cma {
    /// Read `out.len()` bytes from `remote` in the client's memory, and the
    /// probe word in the same system call.
    pub(super) fn read(&self, remote: &[(u64, usize)], out: &mut [u8]) -> Result<(), CmaError> {
        let mut word = [0u8; 8];
        let mut all = Vec::with_capacity(remote.len() + 1);
        all.push((self.probe, 8));
        all.extend_from_slice(remote);
        let (done, r) = wire::read_remote_into(self.pid, &all, &mut [&mut word, out]);
        if exited(&self.pidfd) {
            return Err(CmaError::Changed(format!(
                "client process {} exited during the read",
                self.pid
            )));
        }
        if done < 8 {
            let e = r.err().map(|e| e.to_string()).unwrap_or_default();
            return Err(CmaError::Changed(format!(
                "the hello's probe word is no longer readable ({e}): the process has changed (exec?)"
            )));
        }
        if u64::from_ne_bytes(word) != self.nonce {
            return Err(CmaError::Changed(
                "the hello's probe word no longer holds its nonce: the process has changed (exec?)"
                    .into(),
            ));
        }
        r.map_err(CmaError::Read)
    }

    /// Whether every page of `parts` is resident private anonymous memory
    /// of the client (`/proc/PID/pagemap`: present, neither a file page nor
    /// shared): a read of it cannot wait on a file system or a fault
    /// handler, so the target may do it on its own thread. Anything else
    /// (not yet touched, swapped out, an mmap of a file, shared memory, a
    /// userfaultfd range) is read on the connection's thread.
    pub(super) fn resident(&self, parts: &[RemotePart]) -> bool {
        use std::os::unix::fs::FileExt;
        const PRESENT: u64 = 1 << 63;
        const FILE_OR_SHARED: u64 = 1 << 61;
        let page = 4096u64;
        let mut total = 0u64;
        let mut buf = [0u8; 8 * 512];
        for p in parts.iter().filter(|p| p.len > 0) {
            let Some(end) = p.addr.checked_add(p.len) else {
                return false;
            };
            total += p.len;
            if total > RESIDENT_CHECK_MAX {
                return false;
            }
            let (mut at, last) = (p.addr / page, (end - 1) / page);
            while at <= last {
                let n = ((last - at + 1) as usize).min(512);
                let b = &mut buf[..8 * n];
                if self.pagemap.read_exact_at(b, at * 8).is_err() {
                    return false;
                }
                let bad = b.chunks_exact(8).any(|e| {
                    let e = u64::from_ne_bytes(e.try_into().expect("8 bytes"));
                    e & PRESENT == 0 || e & FILE_OR_SHARED != 0
                });
                if bad {
                    return false;
                }
                at += n as u64;
            }
        }
        true
    }

    /// The client's process, if it still has the credentials it connected
    /// with and the hello's probe reads back its nonce.
    pub(super) fn probe(peer: &Peer, hello: &Hello) -> Result<Cma, String> {
        if hello.probe == 0 {
            return Err("the hello offers no probe".into());
        }
        let pidfd = peer.pidfd.as_ref().map_err(|e| e.clone())?;
        let pid = peer.pid;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
        let (uids, gids) = (status_ids(&status, "Uid:"), status_ids(&status, "Gid:"));
        // Read while the pidfd shows the process alive: the status read was
        // of the process that connected, not of a later one with its pid.
        if exited(pidfd) {
            return Err("the process that connected has exited".into());
        }
        if uids != Some([peer.uid; 4]) || gids != Some([peer.gid; 4]) {
            return Err(format!(
                "its credentials changed since it connected as uid {} gid {} (now uids {uids:?}, gids {gids:?})",
                peer.uid, peer.gid
            ));
        }
        // SAFETY: a duplicate of a pidfd we own, for the connection to keep.
        let dup = unsafe { libc::fcntl(pidfd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(format!("dup pidfd: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a fresh fd we own.
        let pidfd = unsafe { OwnedFd::from_raw_fd(dup) };
        let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap"))
            .map_err(|e| format!("/proc/{pid}/pagemap: {e}"))?;
        let cma = Cma {
            pid,
            pidfd,
            probe: hello.probe,
            nonce: hello.nonce,
            pagemap,
        };
        cma.read(&[], &mut []).map_err(|e| match e {
            CmaError::Read(e) => format!("reading the probe: {e}"),
            CmaError::Changed(m) => m,
        })?;
        Ok(cma)
    }
}

/// An update's values in the client's own memory, resident (see
/// [`Cma::resident`]): read by the target straight into its buffers, with
/// the probe word in the same system call.
pub(super) struct RemoteBulk {
    pub(super) live: Arc<Live>,
    pub(super) parts: Vec<RemotePart>,
    pub(super) len: usize,
}

impl SharedBytes for RemoteBulk {
    fn len(&self) -> usize {
        self.len
    }

    fn copy_out(&self, off: usize, out: &mut [u8]) -> std::io::Result<()> {
        let Some(cma) = &self.live.conn.cma else {
            return Err(std::io::ErrorKind::Unsupported.into());
        };
        // The pieces of the parts that hold [off, off + out.len()).
        let (mut at, mut want, mut remote) = (0usize, out.len(), Vec::new());
        for p in &self.parts {
            let (start, len) = (at, p.len as usize);
            at += len;
            if want == 0 || at <= off {
                continue;
            }
            let skip = off.saturating_sub(start);
            let n = (len - skip).min(want);
            remote.push((p.addr + skip as u64, n));
            want -= n;
        }
        cma.read(&remote, out).map_err(|e| match e {
            CmaError::Changed(why) => {
                self.live.stats.rejected.fetch_add(1, Ordering::Relaxed);
                self.live.close(&format!("direct read refused: {why}"));
                std::io::Error::new(std::io::ErrorKind::PermissionDenied, why)
            }
            CmaError::Read(e) => std::io::Error::new(
                e.kind(),
                format!("reading the client's memory (pid {}): {e}", cma.pid),
            ),
        })
    }
}
