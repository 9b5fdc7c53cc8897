//! The shared-memory data plane for clients on this node (see
//! [`peregrine_proto::shm`] for the protocol).
//!
//! The engine listens on a unix socket in `shm_dir`; each connection is
//! served by its own thread, one request at a time: wait for the client's
//! doorbell, copy the frame out of the (untrusted) request region, validate
//! and decode it exactly as a TCP frame ([`crate::dataplane::decode_request`]),
//! dispatch it to its target, and go back to waiting on the socket. The
//! target's thread writes the response frame (fetched bulk copied once) into
//! the response region and rings back itself, from the reply callback
//! ([`peregrine_vos::Storage::submit_with`]): no thread waits for the target,
//! and the client is woken one thread hop sooner. One request per connection
//! is in flight; a doorbell that arrives before the previous reply was rung
//! back is a protocol violation and closes the connection. Anything malformed (handshake, memfd,
//! doorbell length, frame) closes that one connection with a logged reason.

use crate::dataplane::{self, Reply};
use crate::node::Node;
use peregrine_proto::frame::{Frame, Header, FLAG_RESPONSE, HEADER_LEN, MAX_BULK, MAX_MSG};
use peregrine_proto::shm::{self as wire, Hello, Mapping};
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
}

fn handshake(sock: &UnixStream, data_addr: &str) -> Result<Conn, String> {
    sock.set_read_timeout(Some(HELLO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; wire::HELLO_LEN];
    let (n, fd) = wire::recv_with_fd(sock.as_raw_fd(), &mut buf)
        .map_err(|e| format!("receive hello: {e}"))?;
    if n == 0 {
        return Err("closed before the hello".into());
    }
    if n != wire::HELLO_LEN {
        return Err(format!("short hello ({n} of {} bytes)", wire::HELLO_LEN));
    }
    let fd = fd.ok_or("hello came without a memfd")?;
    let hello = Hello::decode(&buf)?;
    wire::check_memfd(fd.as_raw_fd(), hello.total)?;
    let map = Mapping::map(fd.as_raw_fd(), hello.total).map_err(|e| e.to_string())?;
    drop(fd); // the mapping keeps the memory
    wire::send_with_fd(sock.as_raw_fd(), &wire::ack(data_addr), None)
        .map_err(|e| format!("send ack: {e}"))?;
    sock.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok(Conn { hello, map })
}

/// One mapped connection and its socket, shared with the reply callbacks.
struct Live {
    conn: Conn,
    sock: UnixStream,
    pid: i32,
    stats: Arc<ShmStats>,
    /// A request is with its target: its reply has not been rung back yet.
    busy: AtomicBool,
}

impl Live {
    /// Write the response frame and ring the client's doorbell; on failure
    /// shut the socket down, which ends the connection thread.
    fn reply(&self, header: &Header, reply: Reply) {
        match write_response(&self.conn, header, reply) {
            Ok(n) => {
                self.stats.requests.fetch_add(1, Ordering::Relaxed);
                // Not busy before the doorbell: the client may answer it at once.
                self.busy.store(false, Ordering::Release);
                if let Err(e) = wire::send_doorbell(self.sock.as_raw_fd(), n) {
                    tracing::debug!("shm pid {}: reply doorbell: {e}", self.pid);
                    let _ = self.sock.shutdown(std::net::Shutdown::Both);
                }
            }
            Err(e) => {
                self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("shm pid {}: closing connection: {e}", self.pid);
                let _ = self.sock.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

fn connection(node: &Node, sock: UnixStream, pid: i32, stats: Arc<ShmStats>) {
    let conn = match handshake(&sock, &node.cfg.data_addr()) {
        Ok(c) => c,
        Err(e) => {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("shm pid {pid}: closing connection: handshake: {e}");
            return;
        }
    };
    stats.connections.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        "shm connection from pid {pid} (regions {} + {} bytes)",
        conn.hello.req_len,
        conn.hello.resp_len
    );
    let live = Arc::new(Live {
        conn,
        sock,
        pid,
        stats,
        busy: AtomicBool::new(false),
    });
    loop {
        let mut db = [0u8; wire::DOORBELL_LEN];
        match wire::recv_exact(live.sock.as_raw_fd(), &mut db) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                tracing::warn!("shm pid {pid}: closing connection: doorbell: {e}");
                break;
            }
        }
        if live.busy.load(Ordering::Acquire) {
            live.stats.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "shm pid {pid}: closing connection: a request arrived before the previous one was answered"
            );
            break;
        }
        let len = u64::from_le_bytes(db);
        let (header, req) = match decode_one(&live.conn, len) {
            Ok(d) => d,
            Err(e) => {
                live.stats.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("shm pid {pid}: closing connection: {e}");
                break;
            }
        };
        // The target's thread writes the reply and rings the client itself
        // (see the module docs); this thread goes straight back to the socket.
        live.busy.store(true, Ordering::Release);
        let l = live.clone();
        dataplane::dispatch(node, req, move |reply| l.reply(&header, reply));
    }
    let _ = live.sock.shutdown(std::net::Shutdown::Both);
    tracing::debug!("shm pid {pid}: connection closed");
}

/// Copy out, check and decode the request of `len` bytes in the request region.
fn decode_one(c: &Conn, len: u64) -> Result<(Header, Option<peregrine_vos::Request>), String> {
    let h = &c.hello;
    if len < HEADER_LEN as u64 || len > h.req_len {
        return Err(format!(
            "doorbell length {len} is outside the {}-byte request region (min {HEADER_LEN})",
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
            "doorbell length {len} does not match the frame's {need} bytes"
        ));
    }
    let msg_off = h.req_off + HEADER_LEN as u64;
    let msg = c
        .map
        .read_vec(msg_off, header.msg_len as usize)
        .map_err(|e| e.to_string())?;
    let bulk = c
        .map
        .read_vec(msg_off + header.msg_len as u64, header.bulk_len as usize)
        .map_err(|e| e.to_string())?;
    let req = dataplane::decode_request(Frame { header, msg, bulk })
        .map_err(|e| format!("request frame: {e}"))?;
    Ok((header, req))
}

fn write_response(c: &Conn, req: &Header, reply: Reply) -> Result<u64, String> {
    let (resp, bulk) = reply;
    let mut msg = resp.encode_to_vec();
    let mut bulk = bulk;
    let fits = |m: usize, b: usize| {
        m <= MAX_MSG as usize
            && b <= MAX_BULK as usize
            && (HEADER_LEN + m + b) as u64 <= c.hello.resp_len
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
        bulk = b;
        if !fits(msg.len(), bulk.len()) {
            return Err(format!(
                "response region of {} bytes is too small for any reply",
                c.hello.resp_len
            ));
        }
    }
    let header = Header {
        opcode: req.opcode,
        flags: FLAG_RESPONSE,
        request_id: req.request_id,
        msg_len: msg.len() as u32,
        bulk_len: bulk.len() as u32,
    };
    let off = c.hello.resp_off;
    let w = |o: u64, d: &[u8]| c.map.write(o, d).map_err(|e| e.to_string());
    w(off, &header.encode())?;
    w(off + HEADER_LEN as u64, &msg)?;
    w(off + (HEADER_LEN + msg.len()) as u64, &bulk)?;
    Ok((HEADER_LEN + msg.len() + bulk.len()) as u64)
}
