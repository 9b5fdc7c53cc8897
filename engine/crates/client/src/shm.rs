//! Shared-memory transport to an engine on this node (protocol in
//! [`peregrine_proto::shm`]).
//!
//! Each connection owns a sealed memfd with a request and a response region
//! ([`REGION_LEN`] each, sparse), handed to the engine over its unix socket.
//! A call writes the request frame (the same frame as over TCP) into the
//! request region, rings the engine with its length, and reads the response
//! frame the engine wrote into the response region: bulk data crosses once
//! each way through memory the two processes share, never through a socket.
//! One request is in flight per connection; [`ShmTransport`] keeps a pool of
//! idle connections per engine socket, like [`crate::TcpTransport`].

use crate::error::{Error, Result};
use crate::transport::{Reply, Transport};
use parking_lot::Mutex;
use peregrine_proto::frame::{Header, Opcode, FLAG_RESPONSE, HEADER_LEN, MAX_BULK, MAX_MSG};
pub use peregrine_proto::shm::REGION_LEN;
use peregrine_proto::shm::{self as wire, Hello, Mapping};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// How long the handshake may take.
    pub connect_timeout: Duration,
    /// How long one request may take.
    pub io_timeout: Duration,
    /// Idle connections kept per engine socket.
    pub max_idle: usize,
    /// Size of each of the two regions.
    pub region_len: u64,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(30),
            max_idle: 8,
            region_len: REGION_LEN,
        }
    }
}

/// One connection: the socket for doorbells and the shared regions.
pub struct ShmConn {
    sock: UnixStream,
    map: Mapping,
    hello: Hello,
    /// The data address the engine named in its ack.
    pub engine_addr: String,
}

/// Why a call failed: before anything was sent (the engine is not reachable
/// over shared memory: a caller may use another transport), or during it.
#[derive(Debug)]
pub enum ShmError {
    Connect(Error),
    Call(Error),
}

impl From<ShmError> for Error {
    fn from(e: ShmError) -> Error {
        match e {
            ShmError::Connect(e) | ShmError::Call(e) => e,
        }
    }
}

#[derive(Default)]
struct Endpoint {
    idle: Mutex<Vec<ShmConn>>,
}

pub struct ShmTransport {
    cfg: ShmConfig,
    endpoints: Mutex<HashMap<String, Arc<Endpoint>>>,
    next_id: AtomicU64,
}

impl Default for ShmTransport {
    fn default() -> Self {
        Self::new(ShmConfig::default())
    }
}

fn io_err(what: &str, e: &std::io::Error) -> Error {
    let err = Error::from_io(e);
    let msg = format!("{what}: {}", err.msg);
    Error { msg, ..err }
}

/// Open one shared-memory connection to the engine socket at `path`.
/// With `expect_addr`, the engine must name that data address in its ack.
pub fn connect(cfg: &ShmConfig, path: &str, expect_addr: Option<&str>) -> Result<ShmConn> {
    let sock = UnixStream::connect(path).map_err(|e| io_err(&format!("connect {path}"), &e))?;
    let hello = Hello::standard(cfg.region_len);
    let fd = wire::memfd_sealed("peregrine-shm", hello.total)
        .map_err(|e| io_err("shared memory", &e))?;
    let map = Mapping::map(fd.as_raw_fd(), hello.total).map_err(|e| io_err("shared memory", &e))?;
    let setup = || -> std::io::Result<[u8; wire::ACK_LEN]> {
        sock.set_read_timeout(Some(cfg.connect_timeout))?;
        sock.set_write_timeout(Some(cfg.io_timeout))?;
        wire::send_with_fd(sock.as_raw_fd(), &hello.encode(), Some(fd.as_raw_fd()))?;
        let mut ack = [0u8; wire::ACK_LEN];
        if !wire::recv_exact(sock.as_raw_fd(), &mut ack)? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "the engine closed the connection (handshake refused; see its log)",
            ));
        }
        sock.set_read_timeout(Some(cfg.io_timeout))?;
        Ok(ack)
    };
    let ack = setup().map_err(|e| io_err(&format!("shm handshake with {path}"), &e))?;
    let engine_addr = wire::check_ack(&ack).map_err(|m| Error::new(-libc::EPROTO, m))?;
    if let Some(want) = expect_addr {
        if want != engine_addr {
            return Err(Error::new(
                -libc::EHOSTUNREACH,
                format!("{path} belongs to the engine at {engine_addr}, not {want}"),
            ));
        }
    }
    Ok(ShmConn {
        sock,
        map,
        hello,
        engine_addr,
    })
}

fn proto_err(m: impl Into<String>) -> Error {
    Error::new(-libc::EPROTO, format!("protocol error: {}", m.into()))
}

impl ShmConn {
    /// Send one request frame and wait for its reply.
    pub fn round_trip(&mut self, id: u64, op: Opcode, msg: &[u8], bulk: &[&[u8]]) -> Result<Reply> {
        let bulk_len: usize = bulk.iter().map(|b| b.len()).sum();
        if msg.len() > MAX_MSG as usize || bulk_len > MAX_BULK as usize {
            return Err(Error::inval(format!(
                "request of {} + {bulk_len} bytes exceeds the frame limits",
                msg.len()
            )));
        }
        let total = (HEADER_LEN + msg.len() + bulk_len) as u64;
        if total > self.hello.req_len {
            return Err(Error::new(
                -libc::E2BIG,
                format!(
                    "request of {total} bytes does not fit the {}-byte shm region",
                    self.hello.req_len
                ),
            ));
        }
        let h = Header {
            opcode: op as u16,
            flags: 0,
            request_id: id,
            msg_len: msg.len() as u32,
            bulk_len: bulk_len as u32,
        };
        let w = |off: u64, d: &[u8]| self.map.write(off, d).map_err(|e| io_err("shm", &e));
        let mut off = self.hello.req_off;
        w(off, &h.encode())?;
        off += HEADER_LEN as u64;
        w(off, msg)?;
        off += msg.len() as u64;
        for b in bulk {
            w(off, b)?;
            off += b.len() as u64;
        }
        let fd = self.sock.as_raw_fd();
        wire::send_doorbell(fd, total).map_err(|e| io_err("shm doorbell", &e))?;
        let mut db = [0u8; wire::DOORBELL_LEN];
        match wire::recv_exact(fd, &mut db) {
            Ok(true) => {}
            Ok(false) => {
                return Err(Error::new(
                    -libc::ECONNRESET,
                    "connection closed by the engine",
                ))
            }
            Err(e) => return Err(io_err("shm reply", &e)),
        }
        // The engine's region is as untrusted as ours is to it.
        let len = u64::from_le_bytes(db);
        if len < HEADER_LEN as u64 || len > self.hello.resp_len {
            return Err(proto_err(format!(
                "reply length {len} outside the {}-byte response region",
                self.hello.resp_len
            )));
        }
        let r = |off: u64, n: usize| self.map.read_vec(off, n).map_err(|e| io_err("shm", &e));
        let off = self.hello.resp_off;
        let hb: [u8; HEADER_LEN] = r(off, HEADER_LEN)?.try_into().unwrap();
        let rh = Header::decode(&hb).map_err(|e| proto_err(e.to_string()))?;
        if HEADER_LEN as u64 + rh.msg_len as u64 + rh.bulk_len as u64 != len {
            return Err(proto_err(format!(
                "reply frame does not match its doorbell length {len}"
            )));
        }
        if rh.flags & FLAG_RESPONSE == 0 || rh.request_id != id || rh.opcode != op as u16 {
            return Err(proto_err(format!(
                "expected reply to request {id} ({op:?}), got request id {} opcode {} flags {:#x}",
                rh.request_id, rh.opcode, rh.flags
            )));
        }
        let m_off = off + HEADER_LEN as u64;
        let msg = r(m_off, rh.msg_len as usize)?;
        let bulk = r(m_off + rh.msg_len as u64, rh.bulk_len as usize)?;
        Ok(Reply { msg, bulk })
    }
}

impl ShmTransport {
    pub fn new(cfg: ShmConfig) -> ShmTransport {
        ShmTransport {
            cfg,
            endpoints: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    fn endpoint(&self, path: &str) -> Arc<Endpoint> {
        self.endpoints
            .lock()
            .entry(path.to_string())
            .or_default()
            .clone()
    }

    /// One call over the socket at `path`, telling a failure to reach the
    /// engine apart from a failure of the request.
    pub fn try_call(
        &self,
        path: &str,
        expect_addr: Option<&str>,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
    ) -> std::result::Result<Reply, ShmError> {
        let ep = self.endpoint(path);
        let idle = ep.idle.lock().pop();
        let reused = idle.is_some();
        let mut conn = match idle {
            Some(c) => c,
            None => connect(&self.cfg, path, expect_addr).map_err(ShmError::Connect)?,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let res = match conn.round_trip(id, op, msg, bulk) {
            // An idle connection may be to an engine that has since restarted:
            // retry once on a fresh one (requests are idempotent, as over TCP).
            Err(e) if reused && e.code != -libc::ETIMEDOUT && e.code != -libc::EPROTO => {
                conn = connect(&self.cfg, path, expect_addr).map_err(ShmError::Connect)?;
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                conn.round_trip(id, op, msg, bulk)
            }
            r => r,
        };
        match res {
            Ok(r) => {
                let mut idle = ep.idle.lock();
                if idle.len() < self.cfg.max_idle {
                    idle.push(conn);
                }
                Ok(r)
            }
            Err(e) => Err(ShmError::Call(e)),
        }
    }
}

impl Transport for ShmTransport {
    /// `endpoint` is the engine's socket path.
    fn call(&self, endpoint: &str, op: Opcode, msg: &[u8], bulk: &[&[u8]]) -> Result<Reply> {
        self.try_call(endpoint, None, op, msg, bulk)
            .map_err(Error::from)
    }
}
