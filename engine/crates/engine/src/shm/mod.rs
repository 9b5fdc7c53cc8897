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

mod channel;
mod cma;
mod connection;
mod frame;
mod handshake;
mod peer;

use crate::node::Node;
use connection::connection;
use peer::Peer;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
