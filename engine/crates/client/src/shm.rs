//! Shared-memory transport to an engine on this node (protocol in
//! [`peregrine_proto::shm`]).
//!
//! Each connection is to one target of an engine and owns a sealed memfd
//! with a control block, a request and a response region ([`REGION_LEN`]
//! each, sparse), handed to the engine over its unix socket. A call writes
//! the request frame (the same frame as over TCP) into the request region
//! and marks it pending; the target polls for it (it is woken through its
//! eventfd only if it sleeps) and writes the response frame into the
//! response region: bulk data crosses once each way through memory the two
//! processes share, never through a socket. The caller polls for the reply
//! for up to [`ShmConfig::spin`] (one polling thread per process at a
//! time), then sleeps on the socket. One request is in flight per
//! connection; [`ShmTransport`] keeps a pool of idle connections per engine
//! socket and target, like [`crate::TcpTransport`].

use crate::error::{Error, Result};
use crate::sync::Mutex;
use crate::transport::{Call, Reply, Started, Transport};
use peregrine_isal::crc32c_append;
use peregrine_proto::frame::{Header, Opcode, FLAG_RESPONSE, HEADER_LEN, MAX_BULK, MAX_MSG};
pub use peregrine_proto::shm::REGION_LEN;
use peregrine_proto::shm::{self as wire, Hello, Mapping, RemotePart};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default of [`ShmConfig::spin`]: how long a call polls for its reply
/// before it sleeps (about a device read and the target's work around it).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);
/// Environment variable programs (not this library) read into
/// [`ShmConfig::spin`], in microseconds: see [`ShmConfig::with_vars`].
pub const SPIN_ENV: &str = "PEREGRINE_SHM_SPIN_US";
/// Environment variable programs read into [`ShmConfig::direct_reads`]
/// (`0`: off): see [`ShmConfig::with_vars`].
pub const DIRECT_ENV: &str = "PEREGRINE_SHM_DIRECT";
/// Calls moving at most this many bytes each way are small: their reply
/// comes within the polling budget, so every such call polls.
const SMALL_CALL: usize = 64 << 10;
/// Bytes copied out of a reply between two looks of its checksum (in cache).
const CRC_STEP: usize = 64 << 10;
/// Threads of a process that poll for the reply of a large call at once;
/// the others sleep at once (a large reply takes longer than the budget,
/// and polling threads would take the cores from the engine's copies).
const MAX_LARGE_SPINNERS: usize = 1;
static LARGE_SPINNERS: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// How long the handshake may take.
    pub connect_timeout: Duration,
    /// How long one request may take.
    pub io_timeout: Duration,
    /// Idle connections kept per engine socket and target: as many as
    /// requests run at once (a connection carries one), or they are
    /// opened and closed per call.
    pub max_idle: usize,
    /// Size of each of the two regions.
    pub region_len: u64,
    /// Let the engine read large update values straight from the caller's
    /// memory when it can (programs turn it off with `PEREGRINE_SHM_DIRECT=0`).
    pub direct_reads: bool,
    /// How long a call polls for its reply before it sleeps on the socket
    /// (zero: sleeps at once); a large call polls only if no other thread
    /// of the process does. Programs set it from `PEREGRINE_SHM_SPIN_US`.
    pub spin: Duration,
}

impl Default for ShmConfig {
    /// The defaults; reads no environment (programs add it with
    /// [`ShmConfig::with_vars`]).
    fn default() -> Self {
        ShmConfig {
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(30),
            max_idle: 32,
            region_len: REGION_LEN,
            direct_reads: true,
            spin: DEFAULT_SPIN,
        }
    }
}

impl ShmConfig {
    /// These settings with the ones a program's environment gives:
    /// [`SPIN_ENV`] (microseconds; a value that does not parse is ignored)
    /// and [`DIRECT_ENV`] (`0` turns direct reads off). `var` looks one
    /// up: the programs' start-ups (the C ABI, the interception library,
    /// the FUSE daemon, the CLI) pass the process environment, once.
    pub fn with_vars(mut self, var: impl Fn(&str) -> Option<String>) -> Self {
        if let Some(us) = var(SPIN_ENV).and_then(|v| v.parse().ok()) {
            self.spin = Duration::from_micros(us);
        }
        if var(DIRECT_ENV).is_some_and(|v| v == "0") {
            self.direct_reads = false;
        }
        self
    }
}

/// One connection to one target: the socket for reply doorbells, the
/// shared regions, and the target's wake-up eventfd and page.
pub struct ShmConn {
    sock: UnixStream,
    map: Mapping,
    hello: Hello,
    wake: OwnedFd,
    target_page: Mapping,
    /// The data address the engine named in its ack.
    pub engine_addr: String,
    /// The engine reads large update values straight from the memory of
    /// this process (the one that connected: not a forked child, whose
    /// addresses the engine would read in the parent).
    direct: Option<u32>,
    /// How long a call polls for its reply ([`ShmConfig::spin`]).
    spin: Duration,
    /// The hello's probe word: the engine reads it again with every direct
    /// read (a process that exec'd since would not hold it), so it lives as
    /// long as the connection.
    _nonce: Box<u64>,
}

/// Updates with at least this many bytes of values let the engine read
/// them from the caller's memory (when it can): below it, the copy into
/// the region costs less than the engine's system call.
const DIRECT_MIN: usize = 64 << 10;

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
    /// By engine socket path and target.
    endpoints: Mutex<HashMap<(String, u32), Arc<Endpoint>>>,
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

/// Open one shared-memory connection to target `target` of the engine
/// socket at `path`. With `expect_addr`, the engine must name that data
/// address in its ack.
pub fn connect(
    cfg: &ShmConfig,
    path: &str,
    expect_addr: Option<&str>,
    target: u32,
) -> Result<ShmConn> {
    let sock = UnixStream::connect(path).map_err(|e| io_err(&format!("connect {path}"), &e))?;
    let sock = crate::fds::socket_above_stdio(sock);
    let mut hello = Hello::standard(cfg.region_len, target);
    // The engine tries to read this nonce from our memory (see `ACK_CMA`).
    let nonce = Box::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ ((std::process::id() as u64) << 32)
            | 1,
    );
    if cfg.direct_reads {
        hello.probe = &*nonce as *const u64 as u64;
        hello.nonce = *nonce;
    }
    let fd = wire::memfd_sealed("peregrine-shm", hello.total)
        .map_err(|e| io_err("shared memory", &e))?;
    let map = Mapping::map(fd.as_raw_fd(), hello.total).map_err(|e| io_err("shared memory", &e))?;
    let setup = || -> std::io::Result<([u8; wire::ACK_LEN], Vec<OwnedFd>)> {
        sock.set_read_timeout(Some(cfg.connect_timeout))?;
        sock.set_write_timeout(Some(cfg.io_timeout))?;
        wire::send_with_fds(sock.as_raw_fd(), &hello.encode(), &[fd.as_raw_fd()])?;
        let mut ack = [0u8; wire::ACK_LEN];
        let (n, fds) = wire::recv_with_fds(sock.as_raw_fd(), &mut ack)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "the engine closed the connection (handshake refused; see its log)",
            ));
        }
        if n != wire::ACK_LEN {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("short ack ({n} of {} bytes)", wire::ACK_LEN),
            ));
        }
        sock.set_read_timeout(Some(cfg.io_timeout))?;
        Ok((ack, fds))
    };
    let (ack, fds) = setup().map_err(|e| io_err(&format!("shm handshake with {path}"), &e))?;
    let (engine_addr, flags) = wire::check_ack(&ack).map_err(|m| Error::new(-libc::EPROTO, m))?;
    let [wake, page]: [OwnedFd; 2] = fds.try_into().map_err(|v: Vec<OwnedFd>| {
        proto_err(format!(
            "the ack came with {} descriptors, expected the target's eventfd and page",
            v.len()
        ))
    })?;
    let wake = crate::fds::above_stdio(wake);
    wire::check_memfd(page.as_raw_fd(), wire::TARGET_PAGE_LEN).map_err(proto_err)?;
    let target_page = Mapping::map_read_only(page.as_raw_fd(), wire::TARGET_PAGE_LEN)
        .map_err(|e| io_err("map the target's page", &e))?;
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
        wake,
        target_page,
        engine_addr,
        direct: (cfg.direct_reads && flags & wire::ACK_CMA != 0).then(std::process::id),
        spin: cfg.spin,
        _nonce: nonce,
    })
}

fn proto_err(m: impl Into<String>) -> Error {
    Error::new(-libc::EPROTO, format!("protocol error: {}", m.into()))
}

impl ShmConn {
    fn word(&self, at: u64) -> Result<&AtomicU64> {
        self.map
            .word(self.hello.ctl_off + at)
            .map_err(|e| io_err("shm", &e))
    }

    /// Whether the target has written the reply (or the region cannot be
    /// read: the receive then says why).
    fn reply_ready(&self) -> bool {
        self.word(wire::RESP_STATE)
            .map_or(true, |s| s.load(Ordering::Acquire) == wire::RESP_DONE)
    }

    /// Poll for the reply for a while (a small call always, a large one if
    /// no other thread of this process polls for one), then sleep on the
    /// socket until the target rings it.
    fn wait_reply(&self, small: bool) -> Result<()> {
        let state = self.word(wire::RESP_STATE)?;
        let poll = small || LARGE_SPINNERS.fetch_add(1, Ordering::AcqRel) < MAX_LARGE_SPINNERS;
        if poll {
            let (t, budget) = (Instant::now(), self.spin);
            while state.load(Ordering::Acquire) != wire::RESP_DONE && t.elapsed() < budget {
                // Give the core away if anything else (the target itself) wants it.
                std::thread::yield_now();
            }
        }
        if !small {
            LARGE_SPINNERS.fetch_sub(1, Ordering::AcqRel);
        }
        match state.compare_exchange(
            wire::RESP_WAITING,
            wire::RESP_SLEEPING,
            Ordering::SeqCst,
            Ordering::Acquire,
        ) {
            Err(wire::RESP_DONE) => return Ok(()),
            Err(other) => return Err(proto_err(format!("response state {other} while waiting"))),
            Ok(_) => {}
        }
        let mut db = [0u8; wire::DOORBELL_LEN];
        match wire::recv_exact(self.sock.as_raw_fd(), &mut db) {
            Ok(true) if state.load(Ordering::Acquire) == wire::RESP_DONE => Ok(()),
            Ok(true) => Err(proto_err("reply doorbell before the reply")),
            Ok(false) => Err(Error::new(
                -libc::ECONNRESET,
                "connection closed by the engine",
            )),
            Err(e) => Err(io_err("shm reply", &e)),
        }
    }

    /// Send one request frame and wait for its reply; a reply bulk of
    /// exactly `out.len()` bytes is copied straight into `out`.
    pub fn round_trip(
        &mut self,
        id: u64,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
        out: Option<&mut [u8]>,
    ) -> Result<Reply> {
        let expect = out.as_ref().map_or(0, |o| o.len());
        let small = self.send(id, op, msg, bulk, expect)?;
        self.receive(id, op, out, small)
    }

    /// Write one request frame into the region and ring the target if it
    /// sleeps. Returns whether the call is small (its reply is polled for
    /// by every caller, not by a few at a time): see [`ShmConn::receive`].
    fn send(
        &mut self,
        id: u64,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
        expect: usize,
    ) -> Result<bool> {
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
        // Large update values stay where they are: the engine reads them
        // from our memory (the caller's buffers outlive the call).
        let direct = op == Opcode::Update
            && bulk_len >= DIRECT_MIN
            && self.direct.is_some_and(|pid| pid == std::process::id());
        let remote = direct
            .then(|| {
                let parts: Vec<RemotePart> = bulk
                    .iter()
                    .filter(|b| !b.is_empty())
                    .map(|b| RemotePart {
                        addr: b.as_ptr() as u64,
                        len: b.len() as u64,
                    })
                    .collect();
                (parts.len() <= wire::MAX_REMOTE_PARTS).then(|| RemotePart::encode_all(&parts))
            })
            .flatten();
        let (flags, sent_len) = match &remote {
            Some(list) => (wire::FLAG_BULK_REMOTE, list.len()),
            None => (0, bulk_len),
        };
        let total = (HEADER_LEN + msg.len() + sent_len) as u64;
        let h = Header {
            opcode: op as u16,
            flags,
            request_id: id,
            msg_len: msg.len() as u32,
            bulk_len: sent_len as u32,
        };
        let w = |off: u64, d: &[u8]| self.map.write(off, d).map_err(|e| io_err("shm", &e));
        let mut off = self.hello.req_off;
        w(off, &h.encode())?;
        off += HEADER_LEN as u64;
        w(off, msg)?;
        off += msg.len() as u64;
        match &remote {
            Some(list) => w(off, list)?,
            None => {
                for b in bulk {
                    w(off, b)?;
                    off += b.len() as u64;
                }
            }
        }
        self.word(wire::REQ_LEN)?.store(total, Ordering::Relaxed);
        self.word(wire::RESP_STATE)?
            .store(wire::RESP_WAITING, Ordering::Relaxed);
        self.word(wire::REQ_STATE)?
            .store(wire::REQ_PENDING, Ordering::SeqCst);
        // Pairs with the target's fence before it sleeps: either it sees the
        // request, or this sees it asleep and wakes it.
        fence(Ordering::SeqCst);
        if self.target_page.load(0).map_err(|e| io_err("shm", &e))? != 0 {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writing 8 bytes from a live buffer to our eventfd.
            if unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) } != 8 {
                return Err(io_err("wake the target", &std::io::Error::last_os_error()));
            }
        }
        Ok(bulk_len <= SMALL_CALL && expect <= SMALL_CALL)
    }

    /// Wait for the reply to request `id` (sent by [`ShmConn::send`]) and
    /// read it out of the region.
    fn receive(
        &mut self,
        id: u64,
        op: Opcode,
        out: Option<&mut [u8]>,
        small: bool,
    ) -> Result<Reply> {
        self.wait_reply(small)?;
        // The engine's memory is as untrusted as ours is to it.
        let len = self.word(wire::RESP_LEN)?.load(Ordering::Acquire);
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
        // The engine may have read a fetch's bytes from its device straight
        // into the region: then they start at BULK_PAGE_OFF, the message after them.
        let at_page = rh.flags & wire::FLAG_BULK_AT_PAGE != 0;
        let start = if at_page {
            wire::BULK_PAGE_OFF
        } else {
            HEADER_LEN as u64
        };
        if start + rh.msg_len as u64 + rh.bulk_len as u64 != len {
            return Err(proto_err(format!(
                "reply frame does not match its length {len}"
            )));
        }
        if rh.flags & FLAG_RESPONSE == 0 || rh.request_id != id || rh.opcode != op as u16 {
            return Err(proto_err(format!(
                "expected reply to request {id} ({op:?}), got request id {} opcode {} flags {:#x}",
                rh.request_id, rh.opcode, rh.flags
            )));
        }
        let (m_off, b_off) = if at_page {
            let b = off + wire::BULK_PAGE_OFF;
            (b + rh.bulk_len as u64, b)
        } else {
            let m = off + HEADER_LEN as u64;
            (m, m + rh.msg_len as u64)
        };
        let msg = r(m_off, rh.msg_len as usize)?;
        if let Some(out) = out.filter(|o| o.len() == rh.bulk_len as usize) {
            // The checksum reads each step while the copy has it in cache:
            // the reply's bytes leave memory once, not twice.
            let mut crc = 0;
            for (k, o) in out.chunks_mut(CRC_STEP).enumerate() {
                let at = b_off + (k * CRC_STEP) as u64;
                self.map.read(at, o).map_err(|e| io_err("shm", &e))?;
                crc = crc32c_append(crc, o);
            }
            return Ok(Reply {
                msg,
                bulk: Vec::new(),
                placed: true,
                placed_crc: Some(crc),
            });
        }
        let bulk = r(b_off, rh.bulk_len as usize)?;
        Ok(Reply {
            msg,
            bulk,
            placed: false,
            placed_crc: None,
        })
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

    fn endpoint(&self, path: &str, target: u32) -> Arc<Endpoint> {
        self.endpoints
            .lock()
            .entry((path.to_string(), target))
            .or_default()
            .clone()
    }

    /// One call to target `target` of the engine at socket `path`, telling a
    /// failure to reach the engine apart from a failure of the request. A
    /// reply bulk of exactly `out.len()` bytes goes straight into `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn try_call(
        &self,
        path: &str,
        expect_addr: Option<&str>,
        target: u32,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
        mut out: Option<&mut [u8]>,
    ) -> std::result::Result<Reply, ShmError> {
        let ep = self.endpoint(path, target);
        let idle = ep.idle.lock().pop();
        let reused = idle.is_some();
        let mut conn = match idle {
            Some(c) => c,
            None => connect(&self.cfg, path, expect_addr, target).map_err(ShmError::Connect)?,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let res = match conn.round_trip(id, op, msg, bulk, out.as_deref_mut()) {
            // An idle connection may be to an engine that has since restarted:
            // retry once on a fresh one (requests are idempotent, as over TCP).
            Err(e) if reused && e.code != -libc::ETIMEDOUT && e.code != -libc::EPROTO => {
                conn = connect(&self.cfg, path, expect_addr, target).map_err(ShmError::Connect)?;
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                conn.round_trip(id, op, msg, bulk, out)
            }
            r => r,
        };
        match res {
            Ok(r) => {
                self.keep_idle(&ep, conn);
                Ok(r)
            }
            Err(e) => Err(ShmError::Call(e)),
        }
    }

    /// Pool a connection whose call is done, if the pool has room.
    fn keep_idle(&self, ep: &Endpoint, conn: ShmConn) {
        let mut idle = ep.idle.lock();
        if idle.len() < self.cfg.max_idle {
            idle.push(conn);
        }
    }

    /// Write `c`'s request to target `c.target` of the engine at socket
    /// `path` on a connection of its own and return without waiting for
    /// the reply ([`ShmTransport::finish_at`] reads it).
    pub fn start_at(&self, path: String, expect_addr: Option<&str>, c: &Call<'_>) -> ShmStarted {
        let ep = self.endpoint(&path, c.target);
        let idle = ep.idle.lock().pop();
        let reused = idle.is_some();
        let state = match idle.map_or_else(|| connect(&self.cfg, &path, expect_addr, c.target), Ok)
        {
            Err(e) => StartState::Failed(ShmError::Connect(e)),
            Ok(mut conn) => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                match conn.send(id, c.op, c.msg, c.bulk, 0) {
                    Ok(small) => StartState::InFlight(Box::new(InFlight {
                        ep,
                        conn,
                        id,
                        small,
                        reused,
                    })),
                    // The idle connection may be to an engine that has restarted.
                    Err(_) if reused => StartState::Again,
                    Err(e) => StartState::Failed(ShmError::Call(e)),
                }
            }
        };
        ShmStarted { path, state }
    }

    /// Wait for the reply of `s`, started by [`ShmTransport::start_at`]
    /// for `c` with the same `expect_addr`; a reply bulk of exactly
    /// `out.len()` bytes goes straight into `out`. A call that failed on
    /// an idle connection is made again alone, as [`ShmTransport::try_call`]
    /// does (the engine may have restarted; requests are idempotent, as
    /// over TCP).
    pub fn finish_at(
        &self,
        s: ShmStarted,
        expect_addr: Option<&str>,
        c: &Call<'_>,
        mut out: Option<&mut [u8]>,
    ) -> std::result::Result<Reply, ShmError> {
        let again = |out| self.try_call(&s.path, expect_addr, c.target, c.op, c.msg, c.bulk, out);
        let f = match s.state {
            StartState::Again => return again(out),
            StartState::Failed(e) => return Err(e),
            StartState::InFlight(f) => f,
        };
        let InFlight {
            ep,
            mut conn,
            id,
            small,
            reused,
        } = *f;
        match conn.receive(id, c.op, out.as_deref_mut(), small) {
            Ok(r) => {
                self.keep_idle(&ep, conn);
                Ok(r)
            }
            Err(e) if !reused || e.code == -libc::ETIMEDOUT || e.code == -libc::EPROTO => {
                Err(ShmError::Call(e))
            }
            Err(_) => again(out),
        }
    }
}

/// A call [`ShmTransport::start_at`] sent and [`ShmTransport::finish_at`]
/// has yet to read the reply of.
pub struct ShmStarted {
    /// The engine's socket, to call again on a fresh connection.
    path: String,
    state: StartState,
}

enum StartState {
    InFlight(Box<InFlight>),
    Failed(ShmError),
    /// Sending failed on an idle connection: made again alone at the finish.
    Again,
}

struct InFlight {
    ep: Arc<Endpoint>,
    conn: ShmConn,
    id: u64,
    small: bool,
    reused: bool,
}

impl ShmStarted {
    /// Whether [`ShmTransport::finish_at`] would return without waiting.
    pub fn ready(&self) -> bool {
        match &self.state {
            StartState::InFlight(f) => f.conn.reply_ready(),
            StartState::Failed(_) | StartState::Again => true,
        }
    }

    /// How long its connection polls for a reply ([`ShmConfig::spin`]).
    pub fn spin(&self) -> Duration {
        match &self.state {
            StartState::InFlight(f) => f.conn.spin,
            StartState::Failed(_) | StartState::Again => Duration::ZERO,
        }
    }
}

impl Transport for ShmTransport {
    /// `endpoint` is the engine's socket path.
    fn call(
        &self,
        endpoint: &str,
        target: u32,
        op: Opcode,
        msg: &[u8],
        bulk: &[&[u8]],
    ) -> Result<Reply> {
        self.try_call(endpoint, None, target, op, msg, bulk, None)
            .map_err(Error::from)
    }

    /// Every request written before any reply is waited for, each on a
    /// connection of its own (a fan-out to several targets costs no
    /// thread hand-off).
    fn call_each(&self, calls: &[Call<'_>]) -> Vec<Result<Reply>> {
        let started: Vec<Started> = calls.iter().map(|c| self.start(c)).collect();
        started
            .into_iter()
            .zip(calls)
            .map(|(s, c)| self.finish(s, c, None))
            .collect()
    }

    fn start(&self, c: &Call<'_>) -> Started {
        Started::Shm(self.start_at(c.endpoint.to_string(), None, c))
    }

    fn finish(&self, started: Started, c: &Call<'_>, out: Option<&mut [u8]>) -> Result<Reply> {
        match started {
            Started::Done(r) => r,
            Started::Shm(s) => self.finish_at(s, None, c, out).map_err(Error::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_program_variables() {
        let d = ShmConfig::default();
        assert_eq!((d.spin, d.direct_reads), (DEFAULT_SPIN, true));
        assert_eq!(DEFAULT_SPIN, Duration::from_micros(200));
        let c = ShmConfig::default().with_vars(|_| None);
        assert_eq!((c.spin, c.direct_reads), (DEFAULT_SPIN, true));
        let c = ShmConfig::default().with_vars(|k| match k {
            SPIN_ENV => Some("0".into()),
            DIRECT_ENV => Some("0".into()),
            _ => None,
        });
        assert_eq!((c.spin, c.direct_reads), (Duration::ZERO, false));
        // As before: a spin that does not parse is ignored, and only `0`
        // turns direct reads off.
        let c = ShmConfig::default().with_vars(|k| match k {
            SPIN_ENV => Some("soon".into()),
            DIRECT_ENV => Some("no".into()),
            _ => None,
        });
        assert_eq!((c.spin, c.direct_reads), (DEFAULT_SPIN, true));
        let c = ShmConfig::default().with_vars(|k| (k == SPIN_ENV).then(|| "50".into()));
        assert_eq!(c.spin, Duration::from_micros(50));
    }
}
