//! Data-plane transport: send one request frame to an engine, get its reply.
//!
//! [`Transport`] is the seam where a shared-memory or libfabric transport
//! slots in later; [`TcpTransport`] is plain TCP with a small pool of idle
//! connections per engine address (so threads do not serialize on one
//! socket), TCP_NODELAY, and connect / I/O timeouts so a dead engine costs
//! a bounded wait and an error, never a hang. A connection that fails is
//! dropped; the next call connects afresh.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use peregrine_proto::frame::{self, FrameError, Opcode, FLAG_RESPONSE};
use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A decoded reply: the frame's message bytes and bulk bytes.
#[derive(Debug)]
pub struct Reply {
    pub msg: Vec<u8>,
    pub bulk: Vec<u8>,
}

pub trait Transport: Send + Sync {
    /// Send one request to the engine at `endpoint` ("host:port") and wait
    /// for its reply. Errors carry an errno and a short message (the caller
    /// adds which pool/rank it was).
    fn call(&self, endpoint: &str, op: Opcode, msg: &[u8], bulk: &[&[u8]]) -> Result<Reply>;
}

#[derive(Clone, Debug)]
pub struct TcpConfig {
    pub connect_timeout: Duration,
    pub io_timeout: Duration,
    /// Idle connections kept per engine address.
    pub max_idle: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(30),
            max_idle: 8,
        }
    }
}

struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

#[derive(Default)]
struct Endpoint {
    idle: Mutex<Vec<Conn>>,
}

pub struct TcpTransport {
    cfg: TcpConfig,
    endpoints: Mutex<HashMap<String, Arc<Endpoint>>>,
    next_id: AtomicU64,
}

impl Default for TcpTransport {
    fn default() -> Self {
        Self::new(TcpConfig::default())
    }
}

fn frame_err(e: FrameError) -> Error {
    match e {
        FrameError::Io(e) => Error::from_io(&e),
        FrameError::Closed => Error::new(-libc::ECONNRESET, "connection closed by the engine"),
        FrameError::Truncated { .. } => {
            Error::new(-libc::ECONNRESET, "connection closed mid-frame")
        }
        e => Error::new(-libc::EPROTO, format!("protocol error: {e}")),
    }
}

impl TcpTransport {
    pub fn new(cfg: TcpConfig) -> TcpTransport {
        TcpTransport {
            cfg,
            endpoints: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    fn endpoint(&self, addr: &str) -> Arc<Endpoint> {
        self.endpoints
            .lock()
            .entry(addr.to_string())
            .or_default()
            .clone()
    }

    fn connect(&self, addr: &str) -> Result<Conn> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Error::new(-libc::EHOSTUNREACH, format!("cannot resolve {addr:?}: {e}")))?
            .collect();
        let mut last = Error::new(
            -libc::EHOSTUNREACH,
            format!("{addr:?} resolves to no address"),
        );
        for sa in addrs {
            match TcpStream::connect_timeout(&sa, self.cfg.connect_timeout) {
                Ok(stream) => {
                    let setup = || -> std::io::Result<Conn> {
                        stream.set_nodelay(true)?;
                        stream.set_read_timeout(Some(self.cfg.io_timeout))?;
                        stream.set_write_timeout(Some(self.cfg.io_timeout))?;
                        let reader = BufReader::with_capacity(64 << 10, stream.try_clone()?);
                        Ok(Conn { stream, reader })
                    };
                    return setup().map_err(|e| Error::from_io(&e));
                }
                Err(e) => {
                    let mut err = Error::from_io(&e);
                    if err.code == -libc::ETIMEDOUT {
                        err.msg = format!("connect timed out after {:?}", self.cfg.connect_timeout);
                    }
                    last = err;
                }
            }
        }
        Err(last)
    }

    fn round_trip(&self, c: &mut Conn, op: Opcode, msg: &[u8], bulk: &[&[u8]]) -> Result<Reply> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut w = BufWriter::with_capacity(64 << 10, &c.stream);
            frame::write_frame(&mut w, op, 0, id, msg, bulk).map_err(frame_err)?;
        }
        let f = frame::read_frame(&mut c.reader).map_err(frame_err)?;
        let h = f.header;
        if h.flags & FLAG_RESPONSE == 0 || h.request_id != id || h.opcode != op as u16 {
            return Err(Error::new(
                -libc::EPROTO,
                format!("protocol error: expected reply to request {id} ({op:?}), got request id {} opcode {} flags {:#x}", h.request_id, h.opcode, h.flags),
            ));
        }
        Ok(Reply {
            msg: f.msg,
            bulk: f.bulk,
        })
    }
}

impl Transport for TcpTransport {
    fn call(&self, endpoint: &str, op: Opcode, msg: &[u8], bulk: &[&[u8]]) -> Result<Reply> {
        let ep = self.endpoint(endpoint);
        let idle = ep.idle.lock().pop();
        let reused = idle.is_some();
        let mut conn = match idle {
            Some(c) => c,
            None => self.connect(endpoint)?,
        };
        let res = match self.round_trip(&mut conn, op, msg, bulk) {
            // An idle connection may have been closed by an engine restart
            // while it sat in the pool: retry once on a fresh one. Requests
            // are idempotent (updates carry their epoch), so a resend is safe.
            Err(e) if reused && e.code != -libc::ETIMEDOUT && e.code != -libc::EPROTO => {
                conn = self.connect(endpoint)?;
                self.round_trip(&mut conn, op, msg, bulk)
            }
            r => r,
        };
        if res.is_ok() {
            let mut idle = ep.idle.lock();
            if idle.len() < self.cfg.max_idle {
                idle.push(conn);
            }
        }
        res
    }
}
