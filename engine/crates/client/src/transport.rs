//! Data-plane transport: send one request frame to an engine, get its reply.
//!
//! [`Transport`] is the seam where transports slot in: [`TcpTransport`] is
//! plain TCP, [`crate::shm::ShmTransport`] shared memory with an engine on
//! this node, and [`MultiTransport`] (what [`crate::Client::connect`] uses)
//! picks one of the two per engine by [`TransportKind`].
//!
//! [`TcpTransport`] keeps a small pool of idle connections per engine address (so threads do not serialize on one
//! socket), TCP_NODELAY, and connect / I/O timeouts so a dead engine costs
//! a bounded wait and an error, never a hang. A connection that fails is
//! dropped; the next call connects afresh.

use crate::error::{Error, Result};
use crate::shm::{ShmError, ShmStarted, ShmTransport};
use crate::sync::{Mutex, RwLock};
use peregrine_proto::frame::{self, FrameError, Opcode, FLAG_RESPONSE};
use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A decoded reply: the frame's message bytes and bulk bytes.
#[derive(Debug)]
pub struct Reply {
    pub msg: Vec<u8>,
    pub bulk: Vec<u8>,
    /// The bulk went straight into the caller's buffer ([`Transport::call_into`])
    /// and `bulk` is empty.
    pub placed: bool,
    /// CRC32C of the bytes placed, computed as they were copied (while they
    /// were in cache), when the transport did so.
    pub placed_crc: Option<u32>,
}

pub trait Transport: Send + Sync {
    /// Send one request for target `target` of the engine at `endpoint`
    /// ("host:port") and wait for its reply. Errors carry an errno and a
    /// short message (the caller adds which pool/rank it was).
    fn call(
        &self,
        endpoint: &str,
        target: u32,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
    ) -> Result<Reply>;

    /// Like [`Transport::call`], but a reply bulk of exactly `out.len()`
    /// bytes may be copied straight into `out` (then [`Reply::placed`]): over
    /// shared memory that is one copy of fetched data less.
    fn call_into(
        &self,
        endpoint: &str,
        target: u32,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
        out: &mut [u8],
    ) -> Result<Reply> {
        let _ = out;
        self.call(endpoint, target, op, msg, bulk)
    }

    /// Several calls side by side; the replies in their order. By default
    /// each runs on a worker thread (the client's worker pool); over shared memory
    /// every request is written before any reply is waited for, so a
    /// fan-out to a few targets costs no thread hand-off (on a busy node
    /// the hand-off cost more than the requests: a striped file's size,
    /// asked of each target, took twice as long as a single target's).
    fn call_each(&self, calls: &[Call<'_>]) -> Vec<Result<Reply>> {
        call_each_threaded(self, calls)
    }

    /// Send `call` and return before its reply, which [`Transport::finish`]
    /// reads: a thread keeps several calls in flight this way and takes
    /// their replies as they come ([`Started::ready`]), as a DAOS event
    /// queue does. Over shared memory the request is written and nothing
    /// waits; a transport that cannot split a call makes it here whole.
    fn start(&self, call: &Call<'_>) -> Started {
        Started::Done(self.call(call.endpoint, call.target, call.op, call.msg, call.bulk))
    }

    /// The reply of `started`, which [`Transport::start`] of this
    /// transport returned for `call`; a reply bulk of exactly `out.len()`
    /// bytes may land in `out` ([`Reply::placed`]).
    fn finish(&self, started: Started, call: &Call<'_>, out: Option<&mut [u8]>) -> Result<Reply> {
        let _ = (call, out);
        match started {
            Started::Done(r) => r,
            Started::Shm(_) => Err(Error::new(
                -libc::EINVAL,
                "a shared-memory call finished by a transport that did not start it",
            )),
        }
    }

    /// Learn from a pool map that the engine at `endpoint` also serves
    /// shared memory on `shm_path` ("" when it does not). Transports that
    /// cannot use it ignore it.
    fn add_route(&self, _endpoint: &str, _shm_path: &str) {}

    /// Calls made so far, by the path they took.
    fn stats(&self) -> TransportStats {
        TransportStats::default()
    }
}

/// [`Transport::call_each`] on worker threads, each call on its own.
fn call_each_threaded<T: Transport + ?Sized>(t: &T, calls: &[Call<'_>]) -> Vec<Result<Reply>> {
    crate::workers::par_map(calls, calls.len(), |c| {
        t.call(c.endpoint, c.target, c.op, c.msg, c.bulk)
    })
}

/// A call [`Transport::start`] sent, whose reply [`Transport::finish`] reads.
pub enum Started {
    /// Made whole already.
    Done(Result<Reply>),
    /// Written to an engine's shared-memory region.
    Shm(ShmStarted),
}

impl Started {
    /// Whether [`Transport::finish`] would return without waiting.
    pub fn ready(&self) -> bool {
        match self {
            Started::Done(_) => true,
            Started::Shm(s) => s.ready(),
        }
    }

    /// How long it is worth polling [`Started::ready`] before sleeping in
    /// [`Transport::finish`] (the transport's polling budget).
    pub fn spin(&self) -> Duration {
        match self {
            Started::Done(_) => Duration::ZERO,
            Started::Shm(s) => s.spin(),
        }
    }
}

/// One call of [`Transport::call_each`].
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub endpoint: &'a str,
    pub target: u32,
    pub op: Opcode,
    pub msg: &'a [u8],
    pub bulk: &'a [&'a [u8]],
}

/// Counters of a [`MultiTransport`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    pub tcp_calls: u64,
    pub shm_calls: u64,
    /// Engines found unreachable over shared memory and served over TCP instead.
    pub shm_fallbacks: u64,
}

/// Which data-plane transport a [`crate::Client`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// TCP to every engine.
    Tcp,
    /// Shared memory to every engine; an engine without it is an error.
    Shm,
    /// Shared memory to engines on this node that offer it, TCP otherwise
    /// (and TCP for an engine whose shared memory fails to connect).
    Auto,
}

/// Environment variable the edges (CLI, FUSE daemon, C ABI, interception
/// library, benchmarks) read to choose the transport ([`TransportKind::from_env`]).
pub const TRANSPORT_ENV: &str = "PEREGRINE_TRANSPORT";

impl std::str::FromStr for TransportKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<TransportKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(TransportKind::Tcp),
            "shm" => Ok(TransportKind::Shm),
            "auto" | "" => Ok(TransportKind::Auto),
            _ => Err(Error::inval(format!(
                "transport {s:?} is not one of tcp, shm, auto"
            ))),
        }
    }
}

impl TransportKind {
    /// From `PEREGRINE_TRANSPORT` (default auto), for the edges that read
    /// the environment, once.
    pub fn from_env() -> Result<TransportKind> {
        match std::env::var(TRANSPORT_ENV) {
            Ok(v) => v.parse().map_err(|e: Error| e.context(TRANSPORT_ENV)),
            Err(_) => Ok(TransportKind::Auto),
        }
    }
}

/// After shared memory to an engine fails to connect, TCP is used for it this long.
pub const SHM_RETRY_AFTER: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Route {
    shm_path: String,
    /// Shared memory failed to connect: TCP until then.
    tcp_until: Option<Instant>,
}

/// Routes each call by engine: shared memory where the pool map offers it
/// and [`TransportKind`] allows, else TCP.
pub struct MultiTransport {
    kind: TransportKind,
    tcp: TcpTransport,
    shm: ShmTransport,
    routes: RwLock<HashMap<String, Route>>,
    tcp_calls: AtomicU64,
    shm_calls: AtomicU64,
    shm_fallbacks: AtomicU64,
}

impl MultiTransport {
    pub fn new(kind: TransportKind) -> MultiTransport {
        Self::with(kind, TcpTransport::default(), ShmTransport::default())
    }

    pub fn with(kind: TransportKind, tcp: TcpTransport, shm: ShmTransport) -> MultiTransport {
        MultiTransport {
            kind,
            tcp,
            shm,
            routes: RwLock::new(HashMap::new()),
            tcp_calls: AtomicU64::new(0),
            shm_calls: AtomicU64::new(0),
            shm_fallbacks: AtomicU64::new(0),
        }
    }

    pub fn kind(&self) -> TransportKind {
        self.kind
    }

    fn tcp_call(&self, endpoint: &str, op: Opcode, msg: &[u8], bulk: &[&[u8]]) -> Result<Reply> {
        self.tcp_calls.fetch_add(1, Ordering::Relaxed);
        self.tcp.call(endpoint, 0, op, msg, bulk)
    }
}

impl MultiTransport {
    /// The socket to reach the engine at `endpoint` by, if shared memory
    /// is to be used for it now.
    fn shm_path(&self, endpoint: &str) -> Option<String> {
        if self.kind == TransportKind::Tcp {
            return None;
        }
        self.routes.read().get(endpoint).and_then(|r| {
            let usable = !r.shm_path.is_empty()
                && (self.kind == TransportKind::Shm
                    || r.tcp_until.is_none_or(|t| Instant::now() >= t));
            usable.then(|| r.shm_path.clone())
        })
    }

    fn call_with(
        &self,
        endpoint: &str,
        target: u32,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
        out: Option<&mut [u8]>,
    ) -> Result<Reply> {
        if self.kind == TransportKind::Tcp {
            return self.tcp_call(endpoint, op, msg, bulk);
        }
        let Some(path) = self.shm_path(endpoint) else {
            if self.kind == TransportKind::Shm {
                return Err(Error::new(
                    -libc::EHOSTUNREACH,
                    format!(
                        "the engine at {endpoint} offers no shared memory ({TRANSPORT_ENV}=shm)"
                    ),
                ));
            }
            return self.tcp_call(endpoint, op, msg, bulk);
        };
        match self
            .shm
            .try_call(&path, Some(endpoint), target, op, msg, bulk, out)
        {
            Ok(r) => {
                self.shm_calls.fetch_add(1, Ordering::Relaxed);
                Ok(r)
            }
            Err(ShmError::Connect(e)) if self.kind == TransportKind::Auto => {
                tracing::debug!(
                    "shared memory to the engine at {endpoint} ({path}): {e}; using TCP"
                );
                self.shm_fallbacks.fetch_add(1, Ordering::Relaxed);
                if let Some(r) = self.routes.write().get_mut(endpoint) {
                    r.tcp_until = Some(Instant::now() + SHM_RETRY_AFTER);
                }
                self.tcp_call(endpoint, op, msg, bulk)
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Transport for MultiTransport {
    fn call(
        &self,
        endpoint: &str,
        target: u32,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
    ) -> Result<Reply> {
        self.call_with(endpoint, target, op, msg, bulk, None)
    }

    fn call_into(
        &self,
        endpoint: &str,
        target: u32,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
        out: &mut [u8],
    ) -> Result<Reply> {
        self.call_with(endpoint, target, op, msg, bulk, Some(out))
    }

    /// Over shared memory when every engine called is reached that way;
    /// a call that could not connect is made alone ([`MultiTransport`]'s
    /// fallback to TCP).
    fn call_each(&self, calls: &[Call<'_>]) -> Vec<Result<Reply>> {
        let paths: Option<Vec<String>> = calls.iter().map(|c| self.shm_path(c.endpoint)).collect();
        let Some(paths) = paths.filter(|_| calls.len() > 1) else {
            return call_each_threaded(self, calls);
        };
        let started: Vec<Started> = paths
            .into_iter()
            .zip(calls)
            .map(|(path, c)| Started::Shm(self.shm.start_at(path, Some(c.endpoint), c)))
            .collect();
        started
            .into_iter()
            .zip(calls)
            .map(|(s, c)| self.finish(s, c, None))
            .collect()
    }

    fn start(&self, c: &Call<'_>) -> Started {
        match self.shm_path(c.endpoint) {
            Some(path) => Started::Shm(self.shm.start_at(path, Some(c.endpoint), c)),
            None => Started::Done(self.call(c.endpoint, c.target, c.op, c.msg, c.bulk)),
        }
    }

    fn finish(&self, started: Started, c: &Call<'_>, out: Option<&mut [u8]>) -> Result<Reply> {
        let s = match started {
            Started::Done(r) => return r,
            Started::Shm(s) => s,
        };
        match self.shm.finish_at(s, Some(c.endpoint), c, out) {
            Ok(r) => {
                self.shm_calls.fetch_add(1, Ordering::Relaxed);
                Ok(r)
            }
            Err(ShmError::Connect(_)) => self.call(c.endpoint, c.target, c.op, c.msg, c.bulk),
            Err(ShmError::Call(e)) => Err(e),
        }
    }

    fn add_route(&self, endpoint: &str, shm_path: &str) {
        if self.kind == TransportKind::Tcp
            || self
                .routes
                .read()
                .get(endpoint)
                .is_some_and(|r| r.shm_path == shm_path)
        {
            return;
        }
        let mut routes = self.routes.write();
        let r = routes.entry(endpoint.to_string()).or_default();
        r.shm_path = shm_path.to_string();
        r.tcp_until = None;
    }

    fn stats(&self) -> TransportStats {
        TransportStats {
            tcp_calls: self.tcp_calls.load(Ordering::Relaxed),
            shm_calls: self.shm_calls.load(Ordering::Relaxed),
            shm_fallbacks: self.shm_fallbacks.load(Ordering::Relaxed),
        }
    }
}

#[derive(Clone, Debug)]
pub struct TcpConfig {
    pub connect_timeout: Duration,
    pub io_timeout: Duration,
    /// Idle connections kept per engine address: as many as requests run
    /// at once, or they are opened and closed per call.
    pub max_idle: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(30),
            max_idle: 32,
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
                    let stream = crate::fds::socket_above_stdio(stream);
                    let setup = || -> std::io::Result<Conn> {
                        stream.set_nodelay(true)?;
                        stream.set_read_timeout(Some(self.cfg.io_timeout))?;
                        stream.set_write_timeout(Some(self.cfg.io_timeout))?;
                        let clone = crate::fds::socket_above_stdio(stream.try_clone()?);
                        let reader = BufReader::with_capacity(64 << 10, clone);
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
            placed: false,
            placed_crc: None,
        })
    }
}

impl Transport for TcpTransport {
    /// The engine routes by the address inside the message; `target` is not needed.
    fn call(
        &self,
        endpoint: &str,
        _target: u32,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
    ) -> Result<Reply> {
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
