//! A connection's own thread: the live connection shared with its target,
//! its replies and doorbells, and the direct reads handed to it.

use super::channel::Channel;
use super::cma::CmaError;
use super::frame::write_response;
use super::handshake::{handshake, Conn};
use super::peer::Peer;
use super::ShmStats;
use crate::node::Node;
use crate::request::DataRequest;
use peregrine_proto::data::Response as DataResponse;
use peregrine_proto::frame::Header;
use peregrine_proto::shm::{self as wire, RemotePart};
use peregrine_vos::Gather;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// One mapped connection and its socket, shared by its [`Channel`], its
/// reply callbacks and the thread watching its socket.
pub(super) struct Live {
    pub(super) conn: Conn,
    pub(super) sock: UnixStream,
    pub(super) pid: i32,
    pub(super) stats: Arc<ShmStats>,
    /// A request is with the target: its reply has not been written yet.
    pub(super) busy: AtomicBool,
    /// The client hung up, or broke the protocol: the target drops the channel.
    pub(super) closed: AtomicBool,
    /// A direct read the target handed to the connection's thread.
    pub(super) pull: Mutex<PullSlot>,
    /// Wakes the connection's thread for a pull.
    pull_wanted: OwnedFd,
    /// The pull is done: the target takes the request back.
    pub(super) pulled: AtomicBool,
    /// The target's wake-up eventfd (a duplicate), rung when a pull is done.
    target_wake: OnceLock<OwnedFd>,
    /// A pull was logged for this connection.
    pub(super) pulled_once: AtomicBool,
}

/// An update whose values are in the client's memory ([`wire::FLAG_BULK_REMOTE`]).
pub(super) struct Pull {
    pub(super) header: Header,
    /// The update, its values not there yet.
    pub(super) req: DataRequest,
    pub(super) parts: Vec<RemotePart>,
    pub(super) len: usize,
    /// Where in the mapping the values go: past the request's message.
    pub(super) off: u64,
}

pub(super) enum PullSlot {
    Empty,
    Wanted(Pull),
    Done(Pull, Result<(), String>),
}

impl Live {
    pub(super) fn close(&self, why: &str) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            tracing::warn!("shm pid {}: closing connection: {why}", self.pid);
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Write the response frame and tell the client; on failure close.
    pub(super) fn reply(&self, header: &Header, reply: (DataResponse, Gather<'_>)) {
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
    pub(super) fn want(&self, pull: Pull) {
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

pub(super) fn connection(node: &Node, sock: UnixStream, peer: Peer, stats: Arc<ShmStats>) {
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
