//! The shared-memory data plane for clients on this node (see
//! [`peregrine_proto::shm`] for the protocol).
//!
//! The engine listens on a unix socket in `shm_dir`. A connection is for one
//! target: after the handshake it becomes a [`peregrine_vos::Source`] of
//! that target, which polls it between its other work. The target copies
//! the frame's header and message out of the (untrusted) request region,
//! validates and decodes them exactly as a TCP frame
//! ([`crate::dataplane::decode_request`]); an update's values stay in the
//! region until the target copies each once, to where it stores it
//! ([`peregrine_vos::Bulk::Shared`]). It serves the request, writes the
//! response frame into the response region (fetched bytes copied once,
//! from its device buffers) and tells the client, waking it only if it went
//! to sleep. No
//! thread stands between a client and its target: the connection's own
//! thread only watches the socket for the client going away. One request
//! per connection is in flight; a request that arrives before the previous
//! one was answered is a protocol violation and closes the connection, as
//! does anything malformed (handshake, memfd, lengths, frame, a request for
//! another target), with a logged reason.
//!
//! Who may connect: the socket file has the mode and group of the `shm`
//! section of the configuration (default 0660, the engine's group), and a
//! peer whose uid (SO_PEERCRED, taken by the kernel at connect) is not in
//! `shm.allowed_uids` (when given) is closed at once, with a logged reason.
//! Right after accept, before reading anything, the engine takes the
//! peer's credentials and a pidfd of the process that connected
//! (SO_PEERPIDFD, else `pidfd_open` of its pid). At most
//! `shm.max_connections` are served (one thread each); the hello must come
//! within `shm.hello_timeout_ms`.
//!
//! Direct reads of the client's memory (`process_vm_readv`, see
//! [`peregrine_proto::shm`]) are allowed only if the process behind that
//! pidfd still has the credentials it connected with when the hello is
//! probed (its `/proc/PID/status` Uid and Gid lines, read while the pidfd
//! shows it alive: the pid was not reused), and every direct read re-reads
//! the hello's probe word in the same system call: a process that has
//! changed since (an exec, of a setuid binary or anything else, keeps the
//! pid and the pidfd but not the nonce) has its request refused and its
//! connection closed. Otherwise the connection works without direct reads:
//! the client copies its values through the request region.
//!
//! A direct read that could wait never runs on the target's thread. The
//! target reads values itself (straight into its buffers, one copy) only
//! when `/proc/PID/pagemap` shows every page of them resident private
//! anonymous memory, whose reading waits on nothing; anything else (an
//! mmap of a file, on a hung FUSE mount or on Peregrine's own, shared
//! memory, pages swapped out or never touched, a userfaultfd range) goes to
//! the connection's own thread, which reads the values into the request
//! region (past the request's message) and gives the request back to the
//! target, which then copies them as any in-region update. Memory whose
//! faults do not resolve stalls that thread, so that connection only, never
//! the target or its other clients. (A client remapping its buffer between
//! the check and the read could still make the target wait; see
//! `docs/engine-limits.md`.)

use crate::dataplane;
use crate::metrics::IoMetrics;
use crate::node::Node;
use crate::poolmap::PoolMaps;
use peregrine_proto::data::Response as DataResponse;
use peregrine_proto::frame::{Frame, Header, FLAG_RESPONSE, HEADER_LEN, MAX_BULK, MAX_MSG};
use peregrine_proto::shm::{self as wire, Hello, Mapping, RemotePart};
use peregrine_vos::{Bulk, Gather, Polled, ReplyArea, ReplyRef, Request, SharedBytes, Source};
use prost::Message;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected.
const SO_PEERPIDFD: libc::c_int = 77;
/// Remote bulks up to this size are checked for residency (a pagemap read
/// of 2 KiB per MiB) and, when resident, read by the target itself; larger
/// ones go to the connection's thread.
const RESIDENT_CHECK_MAX: u64 = 16 << 20;

#[derive(Default, Debug)]
pub struct ShmStats {
    pub connections: AtomicU64,
    pub requests: AtomicU64,
    pub rejected: AtomicU64,
}

/// The listening socket; dropping it removes the socket file (if still ours).
pub struct ShmServer {
    path: PathBuf,
    ino: u64,
    pub stats: Arc<ShmStats>,
}

impl ShmServer {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ShmServer {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Bind `path` (replacing a stale socket left by a dead engine) and serve it.
pub fn serve(node: Arc<Node>, path: &Path) -> Result<ShmServer, String> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    if path.as_os_str().len() > crate::config::MAX_UNIX_PATH {
        return Err(format!("socket path {shown} is too long for a unix socket"));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(format!("{shown} exists and is not a socket"));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(format!("{shown} is served by another live process"));
        }
        std::fs::remove_file(path).map_err(|e| format!("remove stale {shown}: {e}"))?;
        tracing::info!("removed stale shm socket {shown}");
    }
    // Bound under a private name, given its mode and group, then renamed
    // into place: nobody can connect before the permissions hold.
    let cfg = node.cfg.shm.clone();
    let gid = cfg.socket_group.as_deref().map(group_id).transpose()?;
    let tmp = path.with_extension(format!("sock.{}.new", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(|e| format!("bind {}: {e}", tmp.display()))?;
    let placed = (|| {
        use std::os::unix::fs::PermissionsExt;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(&tmp, None, Some(gid)).map_err(|e| {
                format!(
                    "shm.socket_group: chown {} to gid {gid}: {e}",
                    tmp.display()
                )
            })?;
        }
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(cfg.socket_mode.0))
            .map_err(|e| format!("shm.socket_mode: chmod {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("rename {} to {shown}: {e}", tmp.display()))
    })();
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let ino = std::fs::symlink_metadata(path)
        .map(|m| m.ino())
        .map_err(|e| format!("stat {shown}: {e}"))?;
    let stats = Arc::new(ShmStats::default());
    let st = stats.clone();
    std::thread::Builder::new()
        .name("shm-accept".into())
        .spawn(move || accept_loop(node, listener, st))
        .map_err(|e| format!("spawn shm accept thread: {e}"))?;
    tracing::info!(
        "shared-memory data plane on {shown} (mode {:04o}{}{})",
        cfg.socket_mode.0,
        gid.map(|g| format!(", group {g}")).unwrap_or_default(),
        if cfg.allowed_uids.is_empty() {
            String::new()
        } else {
            format!(", uids {:?}", cfg.allowed_uids)
        }
    );
    Ok(ShmServer {
        path: path.to_path_buf(),
        ino,
        stats,
    })
}

/// The gid of `shm.socket_group`: a number, or a group name.
fn group_id(g: &str) -> Result<u32, String> {
    if let Ok(n) = g.parse::<u32>() {
        return Ok(n);
    }
    let name = std::ffi::CString::new(g).map_err(|_| format!("shm.socket_group: {g:?}"))?;
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: getgrnam_r into our own group struct and buffer.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        let r = libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        );
        if r != 0 || out.is_null() {
            return Err(format!("shm.socket_group: no group {g:?} on this node"));
        }
        Ok(grp.gr_gid)
    }
}

fn accept_loop(node: Arc<Node>, listener: UnixListener, stats: Arc<ShmStats>) {
    let active = Arc::new(AtomicUsize::new(0));
    let cfg = node.cfg.shm.clone();
    for sock in listener.incoming() {
        let sock = match sock {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("shm accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        // Who connected, before anything is read from them.
        let peer = match Peer::of(&sock) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("shm connection refused: peer credentials: {e}");
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let pid = peer.pid;
        if !cfg.allowed_uids.is_empty() && !cfg.allowed_uids.contains(&peer.uid) {
            tracing::warn!(
                "shm connection from pid {pid} refused: uid {} is not in shm.allowed_uids {:?}",
                peer.uid,
                cfg.allowed_uids
            );
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if active.load(Ordering::Relaxed) >= cfg.max_connections {
            tracing::warn!(
                "shm connection from pid {pid} refused: {} connections already open (shm.max_connections)",
                cfg.max_connections
            );
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        active.fetch_add(1, Ordering::Relaxed);
        let (node, stats, act) = (node.clone(), stats.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("shm-pid{pid}"))
            .spawn(move || {
                connection(&node, sock, peer, stats);
                act.fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            tracing::warn!("shm connection from pid {pid}: cannot spawn a thread: {e}");
            active.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The process at the other end of a connection, as the kernel recorded it
/// when it connected, and a pidfd of that process, both taken at accept.
struct Peer {
    pid: i32,
    uid: u32,
    gid: u32,
    /// The process that connected, or why there is none to read from.
    pidfd: Result<OwnedFd, String>,
}

impl Peer {
    fn of(sock: &UnixStream) -> std::io::Result<Peer> {
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
fn exited(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll of one pollfd we own, without waiting.
    unsafe { libc::poll(&mut p, 1, 0) != 0 }
}

/// The four ids (real, effective, saved, filesystem) of a `/proc/PID/status` line.
fn status_ids(status: &str, key: &str) -> Option<[u32; 4]> {
    let line = status.lines().find_map(|l| l.strip_prefix(key))?;
    let v: Vec<u32> = line
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    v.try_into().ok()
}

/// One mapped connection.
struct Conn {
    hello: Hello,
    map: Mapping,
    /// The client's process, when the engine may read its memory directly.
    cma: Option<Cma>,
}

/// A client process whose memory the engine reads with `process_vm_readv`.
/// Its pidfd (taken at connect) tells whether it is still the process that
/// connected: a pid is only reused once its process is gone, so a read
/// followed by a look at the pidfd that finds the process alive read that
/// process and no other. The probe word, read again with every read, tells
/// whether that process still runs the program that sent the hello.
struct Cma {
    pid: i32,
    pidfd: OwnedFd,
    probe: u64,
    nonce: u64,
    /// `/proc/PID/pagemap`, to tell whether values are resident anonymous memory.
    pagemap: std::fs::File,
}

/// Why a direct read failed: the client's memory (its fault), or a client
/// process that is no longer the one that sent the hello.
enum CmaError {
    Read(std::io::Error),
    Changed(String),
}

impl Cma {
    /// Read `out.len()` bytes from `remote` in the client's memory, and the
    /// probe word in the same system call.
    fn read(&self, remote: &[(u64, usize)], out: &mut [u8]) -> Result<(), CmaError> {
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
    fn resident(&self, parts: &[RemotePart]) -> bool {
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
    fn probe(peer: &Peer, hello: &Hello) -> Result<Cma, String> {
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

impl Conn {
    /// Where a fetch's bytes may go: the response region from
    /// [`wire::BULK_PAGE_OFF`] on, if that is page-aligned in this mapping.
    fn reply_area(&self) -> Option<ReplyArea> {
        let h = &self.hello;
        let len = h.resp_len.checked_sub(wire::BULK_PAGE_OFF)? as usize;
        let addr = self.map.addr(h.resp_off + wire::BULK_PAGE_OFF, len)?;
        addr.is_multiple_of(4096).then_some(ReplyArea { addr, len })
    }

    fn word(&self, at: u64) -> &std::sync::atomic::AtomicU64 {
        // In bounds and aligned: Hello::decode checked the control block.
        self.map
            .word(self.hello.ctl_off + at)
            .expect("control word inside the checked control block")
    }
}

fn handshake(sock: &UnixStream, peer: &Peer, hello_timeout: Duration) -> Result<Conn, String> {
    let pid = peer.pid;
    sock.set_read_timeout(Some(hello_timeout))
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; wire::HELLO_LEN];
    let (n, fds) = wire::recv_with_fds(sock.as_raw_fd(), &mut buf)
        .map_err(|e| format!("receive hello: {e}"))?;
    if n == 0 {
        return Err("closed before the hello".into());
    }
    if n != wire::HELLO_LEN {
        return Err(format!("short hello ({n} of {} bytes)", wire::HELLO_LEN));
    }
    let [fd]: [std::os::fd::OwnedFd; 1] = fds.try_into().map_err(|v: Vec<_>| {
        format!(
            "hello came with {} descriptors, expected one memfd",
            v.len()
        )
    })?;
    let hello = Hello::decode(&buf)?;
    wire::check_memfd(fd.as_raw_fd(), hello.total)?;
    let map = Mapping::map(fd.as_raw_fd(), hello.total).map_err(|e| e.to_string())?;
    drop(fd); // the mapping keeps the memory
    sock.set_read_timeout(None).map_err(|e| e.to_string())?;
    let cma = Cma::probe(peer, &hello)
        .map_err(|e| {
            if hello.probe == 0 {
                tracing::debug!("shm pid {pid}: no direct reads of its memory: {e}");
            } else {
                tracing::info!("shm pid {pid}: no direct reads of its memory: {e}");
            }
        })
        .ok();
    Ok(Conn { hello, map, cma })
}

/// One mapped connection and its socket, shared by its [`Channel`], its
/// reply callbacks and the thread watching its socket.
struct Live {
    conn: Conn,
    sock: UnixStream,
    pid: i32,
    stats: Arc<ShmStats>,
    /// A request is with the target: its reply has not been written yet.
    busy: AtomicBool,
    /// The client hung up, or broke the protocol: the target drops the channel.
    closed: AtomicBool,
    /// A direct read the target handed to the connection's thread.
    pull: Mutex<PullSlot>,
    /// Wakes the connection's thread for a pull.
    pull_wanted: OwnedFd,
    /// The pull is done: the target takes the request back.
    pulled: AtomicBool,
    /// The target's wake-up eventfd (a duplicate), rung when a pull is done.
    target_wake: OnceLock<OwnedFd>,
    /// A pull was logged for this connection.
    pulled_once: AtomicBool,
}

/// An update whose values are in the client's memory ([`wire::FLAG_BULK_REMOTE`]).
struct Pull {
    header: Header,
    /// The update, its values not there yet.
    req: Request,
    parts: Vec<RemotePart>,
    len: usize,
    /// Where in the mapping the values go: past the request's message.
    off: u64,
}

enum PullSlot {
    Empty,
    Wanted(Pull),
    Done(Pull, Result<(), String>),
}

impl Live {
    fn close(&self, why: &str) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            tracing::warn!("shm pid {}: closing connection: {why}", self.pid);
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Write the response frame and tell the client; on failure close.
    fn reply(&self, header: &Header, reply: (DataResponse, Gather<'_>)) {
        match write_response(&self.conn, header, reply) {
            Ok(n) => {
                self.stats.requests.fetch_add(1, Ordering::Relaxed);
                self.busy.store(false, Ordering::Release);
                self.conn.word(wire::RESP_LEN).store(n, Ordering::Relaxed);
                // Pairs with the client's swap to sleeping: either it sees
                // DONE, or this sees it asleep and rings its socket.
                let was = self
                    .conn
                    .word(wire::RESP_STATE)
                    .swap(wire::RESP_DONE, Ordering::SeqCst);
                if was == wire::RESP_SLEEPING {
                    if let Err(e) = wire::send_doorbell(self.sock.as_raw_fd(), n) {
                        self.close(&format!("reply doorbell: {e}"));
                    }
                }
            }
            Err(e) => {
                self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                self.close(&e);
            }
        }
    }

    /// Hand `pull` to the connection's thread (from the target's thread:
    /// never blocks, the slot's lock is only held to move a value in or out).
    fn want(&self, pull: Pull) {
        *self.pull.lock().unwrap_or_else(|e| e.into_inner()) = PullSlot::Wanted(pull);
        ring(&self.pull_wanted);
    }

    /// On the connection's thread: read the values of the pull wanted, if
    /// any, into the request region, and give it back to the target.
    fn do_pull(&self) {
        let slot = std::mem::replace(
            &mut *self.pull.lock().unwrap_or_else(|e| e.into_inner()),
            PullSlot::Empty,
        );
        let PullSlot::Wanted(pull) = slot else {
            return;
        };
        let Some(cma) = &self.conn.cma else {
            return self.close("a pull on a connection without direct reads");
        };
        let r = match self.conn.map.addr(pull.off, pull.len) {
            None => Err(format!(
                "a remote bulk of {} bytes does not fit the request region past its message",
                pull.len
            )),
            Some(dst) => {
                let remote: Vec<(u64, usize)> = pull
                    .parts
                    .iter()
                    .map(|p| (p.addr, p.len as usize))
                    .collect();
                // SAFETY: `dst` is `len` bytes inside the mapping, which
                // lives as long as `self`; the target does not look at the
                // region while the request is with this thread (busy), and
                // the engine only ever writes these bytes through this slice.
                let out = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, pull.len) };
                match cma.read(&remote, out) {
                    Ok(()) => Ok(()),
                    Err(CmaError::Changed(why)) => {
                        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        return self.close(&format!("direct read refused: {why}"));
                    }
                    Err(CmaError::Read(e)) => Err(format!(
                        "reading the client's memory (pid {}): {e}",
                        cma.pid
                    )),
                }
            }
        };
        *self.pull.lock().unwrap_or_else(|e| e.into_inner()) = PullSlot::Done(pull, r);
        self.pulled.store(true, Ordering::SeqCst);
        if let Some(w) = self.target_wake.get() {
            ring(w);
        }
    }
}

/// Add one to an eventfd.
fn ring(efd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: 8 bytes to an eventfd we hold.
    unsafe { libc::write(efd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// A connection as its target sees it.
struct Channel {
    live: Arc<Live>,
    target: u32,
    pool_maps: Arc<PoolMaps>,
    io: &'static IoMetrics,
}

impl Drop for Channel {
    /// The target let go (the client left, or the target stopped): the
    /// client sees the end of the socket rather than waiting for a reply.
    fn drop(&mut self) {
        self.live.closed.store(true, Ordering::Release);
        let _ = self.live.sock.shutdown(std::net::Shutdown::Both);
    }
}

impl Source for Channel {
    fn pending(&self) -> bool {
        self.live.closed.load(Ordering::Acquire)
            || self.live.pulled.load(Ordering::SeqCst)
            || self.live.conn.word(wire::REQ_STATE).load(Ordering::Acquire) == wire::REQ_PENDING
    }

    fn poll(&mut self) -> Polled {
        let live = &self.live;
        if live.closed.load(Ordering::Acquire) {
            return Polled::Closed;
        }
        if live.pulled.swap(false, Ordering::SeqCst) {
            let slot = std::mem::replace(
                &mut *live.pull.lock().unwrap_or_else(|e| e.into_inner()),
                PullSlot::Empty,
            );
            let PullSlot::Done(pull, r) = slot else {
                return Polled::Idle;
            };
            if let Err(e) = r {
                live.reply(
                    &pull.header,
                    owned(dataplane::error_reply(-libc::EINVAL, e)),
                );
                return Polled::Idle;
            }
            let Request::Update(u, _) = pull.req else {
                return Polled::Idle;
            };
            let values = ShmBulk {
                live: live.clone(),
                off: pull.off,
                len: pull.len,
            };
            let req = Request::Update(u, Bulk::Shared(Box::new(values)));
            return self.dispatch(pull.header, req);
        }
        let state = live.conn.word(wire::REQ_STATE);
        if state.load(Ordering::Acquire) != wire::REQ_PENDING {
            return Polled::Idle;
        }
        if live.busy.load(Ordering::Acquire) {
            live.stats.rejected.fetch_add(1, Ordering::Relaxed);
            live.close("a request arrived before the previous one was answered");
            return Polled::Closed;
        }
        state.store(wire::REQ_TAKEN, Ordering::Release);
        let len = live.conn.word(wire::REQ_LEN).load(Ordering::Acquire);
        let decoded = match decode_one(live, len) {
            Ok(d) => d,
            Err(e) => {
                live.stats.rejected.fetch_add(1, Ordering::Relaxed);
                live.close(&e);
                return Polled::Closed;
            }
        };
        live.busy.store(true, Ordering::Release);
        match decoded {
            Decoded::Pull(pull) => {
                // The client's memory is read off this thread: a fault
                // there may take for ever.
                if !live.pulled_once.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "shm pid {}: update values not in resident anonymous memory: read on the connection's thread",
                        live.pid
                    );
                }
                live.want(pull);
                Polled::Idle
            }
            Decoded::Now(header, None) => {
                live.reply(&header, owned(dataplane::error_reply(0, String::new())));
                Polled::Idle
            }
            Decoded::Now(header, Some(req)) => self.dispatch(header, req),
        }
    }
}

impl Channel {
    /// Admit a decoded request and give it to the target.
    fn dispatch(&mut self, header: Header, req: Request) -> Polled {
        let live = &self.live;
        // Polled on the target's own thread: admitted requests queue in order
        // with the drain that follows a pool map change (see `crate::poolmap`).
        // A request for another target breaks the protocol: the connection
        // ends, whatever its handle or pool map would have said.
        if let Some(t) = peregrine_vos::request_target(&req).filter(|t| *t != self.target) {
            live.stats.rejected.fetch_add(1, Ordering::Relaxed);
            live.close(&format!(
                "request for target {t} on a connection to target {}",
                self.target
            ));
            return Polled::Closed;
        }
        let mut track = self.io.track(&req);
        if let Err((code, message)) = self.pool_maps.admit(&req).map(drop) {
            if let Some(t) = track {
                t.refused(code);
            }
            live.reply(&header, owned(dataplane::error_reply(code, message)));
            return Polled::Idle;
        }
        // A fetch's bytes may be read straight into the response region,
        // page-aligned after the frame header (the region stays mapped: the
        // reply holds the connection).
        let area = match req {
            Request::Fetch(_) => live.conn.reply_area(),
            _ => None,
        };
        let l = live.clone();
        if let Some(t) = &mut track {
            t.queued();
        }
        Polled::Request(
            req,
            Box::new(move |r: ReplyRef<'_>| {
                if let Some(t) = track {
                    t.answered(&r);
                }
                l.reply(
                    &header,
                    r.unwrap_or_else(|e| owned(dataplane::error_reply(e.code, e.msg))),
                )
            }),
            area,
        )
    }
}

/// An update's values in the client's own memory, resident (see
/// [`Cma::resident`]): read by the target straight into its buffers, with
/// the probe word in the same system call.
struct RemoteBulk {
    live: Arc<Live>,
    parts: Vec<RemotePart>,
    len: usize,
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

fn owned((resp, bulk): dataplane::Reply) -> (DataResponse, Gather<'static>) {
    (resp, Gather::from(bulk))
}

/// An update's values in the request region of a connection, copied out by
/// the target (bounds-checked: the region is the client's to change).
struct ShmBulk {
    live: Arc<Live>,
    off: u64,
    len: usize,
}

impl SharedBytes for ShmBulk {
    fn len(&self) -> usize {
        self.len
    }

    fn copy_out(&self, off: usize, out: &mut [u8]) -> std::io::Result<()> {
        // Inside the bulk (Bulk checks), and the mapping checks its own bounds.
        self.live.conn.map.read(self.off + off as u64, out)
    }
}

fn connection(node: &Node, sock: UnixStream, peer: Peer, stats: Arc<ShmStats>) {
    let pid = peer.pid;
    let refuse = |why: String| {
        stats.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("shm pid {pid}: closing connection: handshake: {why}");
    };
    let hello_timeout = Duration::from_millis(node.cfg.shm.hello_timeout_ms);
    let conn = match handshake(&sock, &peer, hello_timeout) {
        Ok(c) => c,
        Err(e) => return refuse(e),
    };
    drop(peer);
    let storage = match node.storage() {
        Ok(s) => s,
        Err(st) => return refuse(st.message().to_string()),
    };
    // SAFETY: a new eventfd; -1 on failure.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if efd < 0 {
        return refuse(format!("eventfd: {}", std::io::Error::last_os_error()));
    }
    let target = conn.hello.target;
    let (hello_req, hello_resp) = (conn.hello.req_len, conn.hello.resp_len);
    let live = Arc::new(Live {
        conn,
        sock,
        pid,
        stats: stats.clone(),
        busy: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        pull: Mutex::new(PullSlot::Empty),
        // SAFETY: the fresh eventfd, ours.
        pull_wanted: unsafe { OwnedFd::from_raw_fd(efd) },
        pulled: AtomicBool::new(false),
        target_wake: OnceLock::new(),
        pulled_once: AtomicBool::new(false),
    });
    let channel = Box::new(Channel {
        live: live.clone(),
        target,
        pool_maps: node.pool_maps.clone(),
        io: node.io,
    });
    let (wake_fd, page_fd) = match storage.attach(target, channel) {
        Ok(fds) => fds,
        Err(e) => return refuse(e.to_string()),
    };
    // SAFETY: a duplicate of the target's eventfd (open while `storage` is held).
    let dup = unsafe { libc::fcntl(wake_fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        live.close(&format!("dup eventfd: {}", std::io::Error::last_os_error()));
        return;
    }
    // SAFETY: the fresh duplicate, ours.
    let _ = live.target_wake.set(unsafe { OwnedFd::from_raw_fd(dup) });
    let flags = if live.conn.cma.is_some() {
        wire::ACK_CMA
    } else {
        0
    };
    let ack = wire::ack(&node.cfg.data_addr(), flags);
    // The target keeps the descriptors open while `storage` is held.
    if let Err(e) = wire::send_with_fds(live.sock.as_raw_fd(), &ack, &[wake_fd, page_fd]) {
        live.close(&format!("send ack: {e}"));
        return;
    }
    drop(storage);
    stats.connections.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        "shm connection from pid {pid} to target {target} (regions {hello_req} + {hello_resp} bytes)"
    );
    watch(&live);
    tracing::debug!("shm pid {pid}: connection closed");
}

/// Wait for the client to hang up (it sends nothing on the socket after the
/// hello), then mark the connection closed for its target; meanwhile do the
/// direct reads the target hands over.
fn watch(live: &Live) {
    let fd = live.sock.as_raw_fd();
    while !live.closed.load(Ordering::Acquire) {
        let mut p = [
            libc::pollfd {
                fd,
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            },
            libc::pollfd {
                fd: live.pull_wanted.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two pollfds that live across the call. poll's wake-ups are
        // filtered by event, unlike a blocked recv's: the client consuming a
        // reply doorbell does not wake this thread.
        let n = unsafe { libc::poll(p.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if p[1].revents & libc::POLLIN != 0 {
            let mut b = [0u8; 8];
            // SAFETY: reading the eventfd's counter into 8 bytes of ours.
            unsafe { libc::read(live.pull_wanted.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
            live.do_pull();
        }
        let r = p[0].revents;
        if r & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            break;
        }
        if r & libc::POLLIN != 0 {
            live.stats.rejected.fetch_add(1, Ordering::Relaxed);
            live.close("the client wrote to the socket after its hello");
            return;
        }
    }
    live.closed.store(true, Ordering::Release);
    let _ = live.sock.shutdown(std::net::Shutdown::Both);
}

/// A request taken from the request region.
enum Decoded {
    /// Ready for the target (None: a ping).
    Now(Header, Option<Request>),
    /// An update whose values the connection's thread must read first.
    Pull(Pull),
}

/// Copy out, check and decode the request of `len` bytes in the request
/// region; an update's bulk stays there ([`ShmBulk`]).
fn decode_one(live: &Arc<Live>, len: u64) -> Result<Decoded, String> {
    let c = &live.conn;
    let h = &c.hello;
    if len < HEADER_LEN as u64 || len > h.req_len {
        return Err(format!(
            "request length {len} is outside the {}-byte request region (min {HEADER_LEN})",
            h.req_len
        ));
    }
    // Copy the header out first: the client can rewrite the region at any time.
    let mut hb = [0u8; HEADER_LEN];
    c.map.read(h.req_off, &mut hb).map_err(|e| e.to_string())?;
    let header = Header::decode(&hb).map_err(|e| format!("request frame: {e}"))?;
    let need = HEADER_LEN as u64 + header.msg_len as u64 + header.bulk_len as u64;
    if need != len {
        return Err(format!(
            "request length {len} does not match the frame's {need} bytes"
        ));
    }
    let msg_off = h.req_off + HEADER_LEN as u64;
    let msg = c
        .map
        .read_vec(msg_off, header.msg_len as usize)
        .map_err(|e| e.to_string())?;
    let bulk_off = msg_off + header.msg_len as u64;
    let bulk_len = header.bulk_len as usize;
    let read_bulk = || {
        c.map
            .read_vec(bulk_off, bulk_len)
            .map_err(|e| e.to_string())
    };
    let update = header.op() == peregrine_proto::frame::Opcode::Update;
    let remote = header.flags & wire::FLAG_BULK_REMOTE != 0;
    // An update's values stay where they are until its target copies them.
    let (bulk, values, parts) = match (update, remote) {
        (true, true) if c.cma.is_some() => {
            let parts = RemotePart::decode_all(&read_bulk()?)?;
            (Vec::new(), None, Some(parts))
        }
        (true, false) => {
            let (live, off) = (live.clone(), bulk_off);
            let values: Box<dyn SharedBytes> = Box::new(ShmBulk { live, off, len: bulk_len });
            (Vec::new(), Some(values), None)
        }
        (false, false) => (read_bulk()?, None, None),
        _ => {
            return Err(
                "a remote bulk on a request other than an update, or on a connection without direct reads"
                    .into(),
            )
        }
    };
    let req = dataplane::decode_request(Frame { header, msg, bulk })
        .map_err(|e| format!("request frame: {e}"))?;
    Ok(match (req, values, parts) {
        // Resident anonymous memory: the target reads it straight into its
        // buffers (one copy).
        (Some(Request::Update(u, _)), _, Some(parts))
            if c.cma.as_ref().is_some_and(|cma| cma.resident(&parts)) =>
        {
            let len = parts.iter().map(|p| p.len as usize).sum();
            let live = live.clone();
            let values = RemoteBulk { live, parts, len };
            Decoded::Now(
                header,
                Some(Request::Update(u, Bulk::Shared(Box::new(values)))),
            )
        }
        (Some(Request::Update(u, b)), _, Some(parts)) => Decoded::Pull(Pull {
            header,
            req: Request::Update(u, b),
            len: parts.iter().map(|p| p.len as usize).sum(),
            parts,
            off: bulk_off,
        }),
        (Some(Request::Update(u, _)), Some(v), _) => {
            Decoded::Now(header, Some(Request::Update(u, Bulk::Shared(v))))
        }
        (r, _, _) => Decoded::Now(header, r),
    })
}

fn write_response(
    c: &Conn,
    req: &Header,
    (resp, bulk): (DataResponse, Gather<'_>),
) -> Result<u64, String> {
    let mut msg = resp.encode_to_vec();
    let mut bulk = bulk;
    // A bulk in place starts at BULK_PAGE_OFF rather than after the header.
    let start = if bulk.is_in_place() {
        wire::BULK_PAGE_OFF as usize
    } else {
        HEADER_LEN
    };
    let fits = |m: usize, b: usize| {
        m <= MAX_MSG as usize
            && b <= MAX_BULK as usize
            && (start + m + b) as u64 <= c.hello.resp_len
    };
    if !fits(msg.len(), bulk.len()) {
        let (r, b) = dataplane::error_reply(
            -libc::EOVERFLOW,
            format!(
                "response of {} + {} bytes does not fit the {}-byte shm response region",
                msg.len(),
                bulk.len(),
                c.hello.resp_len
            ),
        );
        msg = r.encode_to_vec();
        bulk = Gather::from(b);
        if !fits(msg.len(), bulk.len()) {
            return Err(format!(
                "response region of {} bytes is too small for any reply",
                c.hello.resp_len
            ));
        }
    }
    let in_place = bulk.is_in_place();
    let header = Header {
        opcode: req.opcode,
        flags: FLAG_RESPONSE | if in_place { wire::FLAG_BULK_AT_PAGE } else { 0 },
        request_id: req.request_id,
        msg_len: msg.len() as u32,
        bulk_len: bulk.len() as u32,
    };
    let off = c.hello.resp_off;
    let w = |o: u64, d: &[u8]| c.map.write(o, d).map_err(|e| e.to_string());
    if in_place {
        // The bulk is already at BULK_PAGE_OFF; the message follows it.
        w(off, &header.encode())?;
        w(off + wire::BULK_PAGE_OFF + bulk.len() as u64, &msg)?;
        return Ok(wire::BULK_PAGE_OFF + (bulk.len() + msg.len()) as u64);
    }
    w(off, &header.encode())?;
    w(off + HEADER_LEN as u64, &msg)?;
    let mut at = off + (HEADER_LEN + msg.len()) as u64;
    for part in bulk.parts() {
        w(at, part)?;
        at += part.len() as u64;
    }
    Ok((HEADER_LEN + msg.len() + bulk.len()) as u64)
}
