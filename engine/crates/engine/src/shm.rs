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

use crate::dataplane;
use crate::metrics::IoMetrics;
use crate::node::Node;
use crate::poolmap::PoolMaps;
use peregrine_proto::data::Response as DataResponse;
use peregrine_proto::frame::{Frame, Header, FLAG_RESPONSE, HEADER_LEN, MAX_BULK, MAX_MSG};
use peregrine_proto::shm::{self as wire, Hello, Mapping, RemotePart};
use peregrine_vos::{Bulk, Gather, Polled, ReplyArea, ReplyRef, Request, SharedBytes, Source};
use prost::Message;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most shared-memory connections served at once (one thread each).
pub const MAX_CONNECTIONS: usize = 256;
/// How long a new connection gets to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

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
    let listener = UnixListener::bind(path).map_err(|e| format!("bind {shown}: {e}"))?;
    let ino = std::fs::symlink_metadata(path)
        .map(|m| m.ino())
        .map_err(|e| format!("stat {shown}: {e}"))?;
    let stats = Arc::new(ShmStats::default());
    let st = stats.clone();
    std::thread::Builder::new()
        .name("shm-accept".into())
        .spawn(move || accept_loop(node, listener, st))
        .map_err(|e| format!("spawn shm accept thread: {e}"))?;
    tracing::info!("shared-memory data plane on {shown}");
    Ok(ShmServer {
        path: path.to_path_buf(),
        ino,
        stats,
    })
}

fn accept_loop(node: Arc<Node>, listener: UnixListener, stats: Arc<ShmStats>) {
    let active = Arc::new(AtomicUsize::new(0));
    for sock in listener.incoming() {
        let sock = match sock {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("shm accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let pid = peer_pid(&sock);
        if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            tracing::warn!(
                "shm connection from pid {pid} refused: {MAX_CONNECTIONS} connections already open"
            );
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        active.fetch_add(1, Ordering::Relaxed);
        let (node, stats, act) = (node.clone(), stats.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("shm-pid{pid}"))
            .spawn(move || {
                connection(&node, sock, pid, stats);
                act.fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            tracing::warn!("shm connection from pid {pid}: cannot spawn a thread: {e}");
            active.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn peer_pid(sock: &UnixStream) -> i32 {
    // SAFETY: getsockopt into a properly sized ucred.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        if libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        ) == 0
        {
            cred.pid
        } else {
            -1
        }
    }
}

/// One mapped connection.
struct Conn {
    hello: Hello,
    map: Mapping,
    /// The client's process, when the engine may read its memory directly.
    cma: Option<Cma>,
}

/// A client process whose memory the engine reads with `process_vm_readv`.
/// Its pidfd tells whether it is still the same process: a pid is only
/// reused once its process is gone, so a read followed by a look at the
/// pidfd that finds the process alive read that process and no other.
struct Cma {
    pid: i32,
    pidfd: std::os::fd::OwnedFd,
}

impl Cma {
    /// Read `out.len()` bytes from `remote` in the client's memory.
    fn read(&self, remote: &[(u64, usize)], out: &mut [u8]) -> std::io::Result<()> {
        wire::read_remote(self.pid, remote, out)?;
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll of one pollfd we own, without waiting.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("client process {} exited during the read", self.pid),
            ));
        }
        Ok(())
    }

    /// The client's process, if the hello's probe reads back its nonce.
    fn probe(pid: i32, hello: &Hello) -> Result<Cma, String> {
        if hello.probe == 0 || pid <= 0 {
            return Err("no probe, or the client's pid is not visible here".into());
        }
        // SAFETY: pidfd_open of a pid; the result is a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(format!("pidfd_open: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a fresh fd we own.
        let pidfd =
            unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        let cma = Cma { pid, pidfd };
        let mut got = [0u8; 8];
        cma.read(&[(hello.probe, 8)], &mut got)
            .map_err(|e| format!("reading the probe: {e}"))?;
        if u64::from_ne_bytes(got) != hello.nonce {
            return Err("the probe does not hold the hello's nonce".into());
        }
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

fn handshake(sock: &UnixStream, pid: i32) -> Result<Conn, String> {
    sock.set_read_timeout(Some(HELLO_TIMEOUT))
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
    let cma = Cma::probe(pid, &hello)
        .map_err(|e| tracing::debug!("shm pid {pid}: no direct reads of its memory: {e}"))
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
            || self.live.conn.word(wire::REQ_STATE).load(Ordering::Acquire) == wire::REQ_PENDING
    }

    fn poll(&mut self) -> Polled {
        let live = &self.live;
        if live.closed.load(Ordering::Acquire) {
            return Polled::Closed;
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
        let (header, req) = match decode_one(live, len) {
            Ok(d) => d,
            Err(e) => {
                live.stats.rejected.fetch_add(1, Ordering::Relaxed);
                live.close(&e);
                return Polled::Closed;
            }
        };
        live.busy.store(true, Ordering::Release);
        let Some(req) = req else {
            live.reply(&header, owned(dataplane::error_reply(0, String::new())));
            return Polled::Idle;
        };
        // Polled on the target's own thread: admitted requests queue in order
        // with the drain that follows a pool map change (see `crate::poolmap`).
        let mut track = self.io.track(&req);
        if let Err((code, message)) = self.pool_maps.admit(&req).map(drop) {
            if let Some(t) = track {
                t.refused(code);
            }
            live.reply(&header, owned(dataplane::error_reply(code, message)));
            return Polled::Idle;
        }
        if let Some(t) = peregrine_vos::request_target(&req).filter(|t| *t != self.target) {
            live.stats.rejected.fetch_add(1, Ordering::Relaxed);
            live.close(&format!(
                "request for target {t} on a connection to target {}",
                self.target
            ));
            return Polled::Closed;
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

/// An update's values in the client's own memory ([`wire::FLAG_BULK_REMOTE`]),
/// read by the target straight into its buffers.
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
        cma.read(&remote, out).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("reading the client's memory (pid {}): {e}", cma.pid),
            )
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

fn connection(node: &Node, sock: UnixStream, pid: i32, stats: Arc<ShmStats>) {
    let refuse = |why: String| {
        stats.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("shm pid {pid}: closing connection: handshake: {why}");
    };
    let conn = match handshake(&sock, pid) {
        Ok(c) => c,
        Err(e) => return refuse(e),
    };
    let storage = match node.storage() {
        Ok(s) => s,
        Err(st) => return refuse(st.message().to_string()),
    };
    let target = conn.hello.target;
    let (hello_req, hello_resp) = (conn.hello.req_len, conn.hello.resp_len);
    let live = Arc::new(Live {
        conn,
        sock,
        pid,
        stats: stats.clone(),
        busy: AtomicBool::new(false),
        closed: AtomicBool::new(false),
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
/// hello), then mark the connection closed for its target.
fn watch(live: &Live) {
    let fd = live.sock.as_raw_fd();
    while !live.closed.load(Ordering::Acquire) {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd that lives across the call. poll's wake-ups are
        // filtered by event, unlike a blocked recv's: the client consuming a
        // reply doorbell does not wake this thread.
        let n = unsafe { libc::poll(&mut p, 1, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            break;
        }
        if p.revents & libc::POLLIN != 0 {
            live.stats.rejected.fetch_add(1, Ordering::Relaxed);
            live.close("the client wrote to the socket after its hello");
            return;
        }
    }
    live.closed.store(true, Ordering::Release);
    let _ = live.sock.shutdown(std::net::Shutdown::Both);
}

/// Copy out, check and decode the request of `len` bytes in the request
/// region; an update's bulk stays there ([`ShmBulk`]).
fn decode_one(live: &Arc<Live>, len: u64) -> Result<(Header, Option<Request>), String> {
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
    let (bulk, values): (Vec<u8>, Option<Box<dyn SharedBytes>>) = match (update, remote) {
        (true, true) if c.cma.is_some() => {
            let parts = RemotePart::decode_all(&read_bulk()?)?;
            let len = parts.iter().map(|p| p.len as usize).sum();
            let live = live.clone();
            (Vec::new(), Some(Box::new(RemoteBulk { live, parts, len })))
        }
        (true, false) => {
            let (live, off) = (live.clone(), bulk_off);
            let values = ShmBulk { live, off, len: bulk_len };
            (Vec::new(), Some(Box::new(values)))
        }
        (false, false) => (read_bulk()?, None),
        _ => {
            return Err(
                "a remote bulk on a request other than an update, or on a connection without direct reads"
                    .into(),
            )
        }
    };
    let req = dataplane::decode_request(Frame { header, msg, bulk })
        .map_err(|e| format!("request frame: {e}"))?;
    let req = match (req, values) {
        (Some(Request::Update(u, _)), Some(v)) => Some(Request::Update(u, Bulk::Shared(v))),
        (r, _) => r,
    };
    Ok((header, req))
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
