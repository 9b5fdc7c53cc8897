//! The data-plane server: framed requests over TCP, executed by the targets.
//! (The shared-memory transport in [`crate::shm`] shares the decoding and
//! dispatch below.)
//!
//! Requests on one connection may be pipelined; they run concurrently on
//! their targets and the replies go back in request order. A frame that
//! fails to decode (bad magic, version, header checksum, oversized or
//! truncated lengths, undecodable message) closes that one connection with a
//! logged reason; the engine and its other connections carry on.
//!
//! Every resource a client can make the engine hold is bounded (the
//! `data_plane` section of the configuration, [`DataPlaneConfig`]):
//! - connections: at most `max_connections` at once; one more is closed as
//!   soon as it is accepted (logged at most every 10 s);
//! - a frame's buffers grow as its bytes arrive, never to the length its
//!   header claims up front, and a frame whose first byte has arrived must
//!   arrive whole within `read_timeout_ms`, or its connection is closed;
//! - a connection with nothing in flight is closed after `idle_timeout_s`
//!   (clients reconnect: the client library retries a request once on a
//!   fresh connection when a pooled one turns out closed), and one whose
//!   client reads no reply for that long is closed too;
//! - replies the client has not read yet, with what its fetches in flight
//!   ask for, are at most `max_unread_reply_bytes` per connection (give or
//!   take the replies bigger than their fetches asked): past that, the
//!   engine reads no more requests from it until it drains them, so TCP
//!   pushes back on the client;
//! - the targets' mailboxes: at most `target_queue_depth` requests from
//!   the data plane per target and `max_queued_request_bytes` of them over
//!   all targets; a reader waits for room (again, TCP pushes back). Those
//!   permits go back when the target answers, whatever the clients do, so
//!   the wait cannot deadlock: a target never waits for a reader.

use crate::config::DataPlaneConfig;
use crate::node::Node;
use crate::request::{self, DataRequest};
use peregrine_proto::data::{self, Response as DataResponse, Status as DataStatus};
use peregrine_proto::frame::{self, Frame, FrameError, Opcode, FLAG_RESPONSE, HEADER_LEN};
use peregrine_vos::ReplyRef;
use prost::Message;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, Semaphore};

/// Requests in flight per connection before the reader stops reading.
const PIPELINE_DEPTH: usize = 64;

pub(crate) type Reply = (DataResponse, Vec<u8>);

/// How often a kind of rate-limited warning is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The first buffer of a frame's message or bulk; it doubles as bytes arrive.
const FIRST_BUFFER: usize = 64 << 10;

/// What a reply is assumed to take before it is known, besides the bulk a
/// fetch asks for (its message: a status, an epoch, sizes).
const REPLY_OVERHEAD: i64 = 4 << 10;

/// A warning logged at most once per [`LOG_EVERY`], with how many were
/// left out since.
struct RateLog {
    last: parking_lot::Mutex<Option<Instant>>,
    skipped: AtomicU64,
}

impl RateLog {
    fn new() -> RateLog {
        RateLog {
            last: parking_lot::Mutex::new(None),
            skipped: AtomicU64::new(0),
        }
    }

    /// `Some(n)`: log now, `n` were left out since the last one.
    fn due(&self) -> Option<u64> {
        let mut last = self.last.lock();
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.skipped.swap(0, Ordering::Relaxed))
    }
}

fn left_out(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more like it in the last {}s)", LOG_EVERY.as_secs())
    }
}

/// The engine-wide limits of the data plane and what is held of them.
struct Limits {
    cfg: DataPlaneConfig,
    connections: Arc<Semaphore>,
    read_timeout: Duration,
    idle_timeout: Option<Duration>,
    /// Room in each target's mailbox, in requests.
    targets: Vec<Arc<Semaphore>>,
    /// Room in all targets' mailboxes, in request bytes.
    queued_bytes: Arc<Semaphore>,
    refused_log: RateLog,
    timeout_log: RateLog,
}

impl Limits {
    fn new(cfg: &DataPlaneConfig, targets: u32) -> Limits {
        Limits {
            cfg: cfg.clone(),
            connections: Arc::new(Semaphore::new(cfg.max_connections)),
            read_timeout: Duration::from_millis(cfg.read_timeout_ms),
            idle_timeout: (cfg.idle_timeout_s > 0).then(|| Duration::from_secs(cfg.idle_timeout_s)),
            targets: (0..targets)
                .map(|_| Arc::new(Semaphore::new(cfg.target_queue_depth)))
                .collect(),
            queued_bytes: Arc::new(Semaphore::new(cfg.max_queued_request_bytes.0 as usize)),
            refused_log: RateLog::new(),
            timeout_log: RateLog::new(),
        }
    }

    /// Room for a request (of `bytes` on the wire) in the mailbox of its
    /// target; waits for it.
    /// `target`: the request's, `None` for a ping.
    async fn room(&self, target: Option<usize>, bytes: usize) -> Vec<OwnedSemaphorePermit> {
        let Some(target) = target else {
            return Vec::new();
        };
        let mut held = Vec::with_capacity(2);
        if let Some(sem) = self.targets.get(target) {
            // Never closed: acquire cannot fail.
            if let Ok(p) = sem.clone().acquire_owned().await {
                held.push(p);
            }
        }
        let most = self.cfg.max_queued_request_bytes.0.min(u32::MAX as u64) as usize;
        let bytes = bytes.clamp(1, most) as u32;
        if let Ok(p) = self.queued_bytes.clone().acquire_many_owned(bytes).await {
            held.push(p);
        }
        held
    }
}

pub async fn serve(node: Arc<Node>, listener: TcpListener) {
    let limits = Arc::new(Limits::new(&node.cfg.data_plane, node.cfg.targets));
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => {
                let Ok(permit) = limits.connections.clone().try_acquire_owned() else {
                    drop(sock);
                    if let Some(n) = limits.refused_log.due() {
                        tracing::warn!(
                            "data plane {peer}: connection refused: {} connections already (data_plane.max_connections){}",
                            limits.cfg.max_connections,
                            left_out(n)
                        );
                    }
                    continue;
                };
                let _ = sock.set_nodelay(true);
                let (node, limits) = (node.clone(), limits.clone());
                tokio::spawn(async move {
                    connection(node, limits, sock, peer).await;
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!("data plane accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

pub(crate) fn error_reply(code: i32, message: String) -> Reply {
    (
        DataResponse {
            status: Some(DataStatus { code, message }),
            body: None,
        },
        Vec::new(),
    )
}

/// Decode a request frame into a storage request, naming what is malformed.
/// `None` is a ping. Shared by the TCP and the shared-memory transports.
pub(crate) fn decode_request(f: Frame) -> Result<Option<DataRequest>, FrameError> {
    use DataRequest as R;
    Ok(Some(match f.header.op() {
        Opcode::Ping => return Ok(None),
        Opcode::Update => R::Update(f.message::<data::UpdateReq>("update")?, f.bulk.into()),
        Opcode::Fetch => R::Fetch(f.message::<data::FetchReq>("fetch")?),
        Opcode::Punch => R::Punch(f.message::<data::PunchReq>("punch")?),
        Opcode::Discard => R::Punch(f.message::<data::PunchReq>("discard")?),
        Opcode::List => R::List(f.message::<data::ListReq>("list")?),
        Opcode::QuerySize => R::QuerySize(f.message::<data::QuerySizeReq>("query-size")?),
        Opcode::Flush => R::Flush(f.message::<data::FlushReq>("flush")?),
        Opcode::ListChanged => R::ListChanged(f.message::<data::ListChangedReq>("list-changed")?),
        Opcode::ListRecords => R::ListRecords(f.message::<data::ListRecordsReq>("list-records")?),
        Opcode::DtxDecide => R::DtxDecide(f.message::<data::DtxDecideReq>("dtx-decide")?),
        Opcode::DtxQuery => R::DtxQuery(f.message::<data::DtxQueryReq>("dtx-query")?),
    }))
}

/// Hand a decoded request to its target, converted once admitted (or answer
/// a ping, maintenance mode or a malformed request at once). `reply` gets
/// the one reply: on the target's thread for a queued request (so it must
/// be quick and must not block), else on the caller's.
pub(crate) fn dispatch(
    node: &Node,
    req: Option<DataRequest>,
    reply: impl FnOnce(Reply) + Send + 'static,
) {
    match (req, node.storage()) {
        (None, _) => reply(error_reply(0, String::new())),
        (Some(_), Err(st)) => reply(error_reply(-libc::EAGAIN, st.message().to_string())),
        (Some(req), Ok(storage)) => {
            let mut track = node.io.track(&req);
            match node.pool_maps.admit(&req) {
                Err((code, message)) => {
                    if let Some(t) = track {
                        t.refused(code);
                    }
                    reply(error_reply(code, message))
                }
                // Handed to the target while admitted: see `crate::poolmap`.
                Ok(_admitted) => {
                    let req = match req.into_vos() {
                        Ok(r) => r,
                        Err(e) => {
                            if let Some(t) = track {
                                t.refused(e.code);
                            }
                            return reply(error_reply(e.code, e.msg));
                        }
                    };
                    if let Some(t) = &mut track {
                        t.queued();
                    }
                    storage.submit_with(req, move |r: ReplyRef<'_>| {
                        if let Some(t) = track {
                            t.answered(&r);
                        }
                        reply(match r {
                            Ok((answer, bulk)) => (request::response(answer), bulk.into_vec()),
                            Err(e) => error_reply(e.code, e.msg),
                        })
                    })
                }
            }
        }
    }
}

/// A request read: its header, the reply bytes it was expected to take,
/// and its reply to come.
type Pending = (frame::Header, i64, oneshot::Receiver<Reply>);

/// What one connection's reader, writer and replies share.
struct ConnState {
    /// Reply bytes this connection holds: what its requests in flight are
    /// expected to take, then what their replies do until written.
    unread: AtomicI64,
    /// Requests read and not yet answered on the socket.
    in_flight: AtomicUsize,
    /// A reply was written (or the writer stopped).
    drained: Notify,
    /// The writer stopped: the reader stops too.
    closed: AtomicBool,
    /// When the connection was taken, and when its last reply was written
    /// (milliseconds after): the idle clock starts there.
    born: Instant,
    last_reply_ms: AtomicU64,
}

impl ConnState {
    fn idle_for(&self) -> Duration {
        let last = self.born + Duration::from_millis(self.last_reply_ms.load(Ordering::Acquire));
        Instant::now().saturating_duration_since(last)
    }
}

/// The reply bytes a request is expected to take: what a fetch asks for
/// (its ARRAY iods; single values are not known before they are read).
fn reply_estimate(req: &Option<DataRequest>) -> i64 {
    let asked = match req {
        Some(DataRequest::Fetch(f)) => f
            .iods
            .iter()
            .filter(|i| i.kind == data::ValueKind::Array as i32)
            .fold(0u64, |t, i| t.saturating_add(i.len))
            .min(peregrine_proto::MAX_IO_BYTES),
        _ => 0,
    };
    asked as i64 + REPLY_OVERHEAD
}

fn reply_len(resp: &DataResponse, bulk: &[u8]) -> i64 {
    (HEADER_LEN + resp.encoded_len() + bulk.len()) as i64
}

/// Why a connection's reader stopped.
enum Stop {
    Closed,
    Idle(Duration),
    ReadTimeout(Duration),
    Bad(FrameError),
}

/// Read `len` bytes, the buffer growing (doubling) as they arrive: a
/// header's claim reserves nothing the peer does not send.
async fn read_growing<R: AsyncRead + Unpin>(r: &mut R, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len.min(FIRST_BUFFER));
    while buf.len() < len {
        if buf.len() == buf.capacity() {
            let grow = buf.capacity().max(FIRST_BUFFER).min(len - buf.len());
            buf.reserve_exact(grow);
        }
        let want = (len - buf.len()) as u64;
        if (&mut *r).take(want).read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf)
}

/// Read one request frame: wait for its first byte (closing the connection
/// once idle for the idle timeout), then all of it within the read timeout.
async fn read_request(
    rd: &mut OwnedReadHalf,
    limits: &Limits,
    st: &ConnState,
) -> Result<Frame, Stop> {
    let mut hb = [0u8; HEADER_LEN];
    let mut wait = limits.idle_timeout;
    loop {
        let first = rd.read(&mut hb[..1]);
        let got = match (wait, limits.idle_timeout) {
            (Some(w), Some(idle)) => match tokio::time::timeout(w, first).await {
                Ok(r) => r,
                // Idle: nothing in flight, and no reply written for as long.
                Err(_) if st.in_flight.load(Ordering::Acquire) > 0 => {
                    wait = Some(idle);
                    continue;
                }
                Err(_) => match idle.checked_sub(st.idle_for()) {
                    Some(left) if !left.is_zero() => {
                        wait = Some(left);
                        continue;
                    }
                    _ => return Err(Stop::Idle(idle)),
                },
            },
            _ => first.await,
        };
        match got {
            Ok(0) => return Err(Stop::Closed),
            Ok(_) => break,
            Err(e) => return Err(Stop::Bad(e.into())),
        }
    }
    let rest = async {
        rd.read_exact(&mut hb[1..]).await.map_err(truncated)?;
        let header = frame::Header::decode(&hb)?;
        let msg = read_growing(rd, header.msg_len as usize)
            .await
            .map_err(truncated)?;
        let bulk = read_growing(rd, header.bulk_len as usize)
            .await
            .map_err(truncated)?;
        Ok::<_, FrameError>(Frame { header, msg, bulk })
    };
    match tokio::time::timeout(limits.read_timeout, rest).await {
        Ok(Ok(f)) => Ok(f),
        Ok(Err(e)) => Err(Stop::Bad(e)),
        Err(_) => Err(Stop::ReadTimeout(limits.read_timeout)),
    }
}

fn truncated(e: std::io::Error) -> FrameError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        FrameError::Truncated { need: 0, have: 0 }
    } else {
        e.into()
    }
}

async fn connection(node: Arc<Node>, limits: Arc<Limits>, sock: TcpStream, peer: SocketAddr) {
    let (mut rd, wr) = sock.into_split();
    let (tx, rx) = mpsc::channel::<Pending>(PIPELINE_DEPTH);
    let st = Arc::new(ConnState {
        unread: AtomicI64::new(0),
        in_flight: AtomicUsize::new(0),
        drained: Notify::new(),
        closed: AtomicBool::new(false),
        born: Instant::now(),
        last_reply_ms: AtomicU64::new(0),
    });
    let mut writer = tokio::spawn(write_replies(wr, rx, st.clone(), limits.clone(), peer));
    let reader = read_requests(&node, &limits, &st, &mut rd, tx);
    let stop = tokio::select! {
        stop = reader => stop,
        _ = &mut writer => return,
    };
    match stop {
        Stop::Closed => {}
        Stop::Idle(d) => tracing::debug!("data plane {peer}: closing connection idle for {d:?}"),
        Stop::ReadTimeout(d) => {
            if let Some(n) = limits.timeout_log.due() {
                tracing::warn!(
                    "data plane {peer}: closing connection: a frame did not arrive whole within {d:?} (data_plane.read_timeout_ms){}",
                    left_out(n)
                );
            }
        }
        Stop::Bad(e) => tracing::warn!("data plane {peer}: closing connection: {e}"),
    }
    // The replies to what was read still go out (the writer stops once they have).
    let _ = writer.await;
}

/// Read, decode and dispatch requests until the peer closes, breaks the
/// protocol, times out or idles out; the sender dropped at the end lets
/// the writer finish.
async fn read_requests(
    node: &Node,
    limits: &Limits,
    st: &Arc<ConnState>,
    rd: &mut OwnedReadHalf,
    tx: mpsc::Sender<Pending>,
) -> Stop {
    let most = limits.cfg.max_unread_reply_bytes.0 as i64;
    loop {
        let f = match read_request(rd, limits, st).await {
            Ok(f) => f,
            Err(stop) => return stop,
        };
        let header = f.header;
        let wire = HEADER_LEN + f.msg.len() + f.bulk.len();
        let req = match decode_request(f) {
            Ok(r) => r,
            Err(e) => return Stop::Bad(e),
        };
        // Backpressure: no more requests while the client has not read
        // enough of its replies (one request at a time always goes).
        let expect = reply_estimate(&req);
        loop {
            let drained = st.drained.notified();
            let unread = st.unread.load(Ordering::Acquire);
            if unread <= 0 || unread + expect <= most {
                break;
            }
            if st.closed.load(Ordering::Acquire) {
                return Stop::Closed;
            }
            drained.await;
        }
        // A request without an address is refused by dispatch: it is
        // counted on target "usize::MAX", i.e. on the bytes alone.
        let target = req
            .as_ref()
            .map(|r| r.target().map_or(usize::MAX, |t| t as usize));
        let room = limits.room(target, wire).await;
        st.unread.fetch_add(expect, Ordering::AcqRel);
        st.in_flight.fetch_add(1, Ordering::AcqRel);
        let (done, pending) = oneshot::channel();
        let charge = st.clone();
        // The target completes the oneshot itself: no thread parked per request.
        dispatch(node, req, move |reply: Reply| {
            // From now on the reply itself is what is held.
            charge
                .unread
                .fetch_add(reply_len(&reply.0, &reply.1) - expect, Ordering::AcqRel);
            drop(room);
            let _ = done.send(reply);
        });
        if tx.send((header, expect, pending)).await.is_err() {
            return Stop::Closed;
        }
    }
}

/// Write the replies in request order; stop at the first failed write, or
/// one that makes no progress for the idle timeout (a client that reads
/// nothing), telling the reader.
async fn write_replies(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Pending>,
    st: Arc<ConnState>,
    limits: Arc<Limits>,
    peer: SocketAddr,
) {
    while let Some((h, expect, pending)) = rx.recv().await {
        let (held, (resp, bulk)) = match pending.await {
            Ok(r) => (reply_len(&r.0, &r.1), r),
            Err(_) => (
                expect,
                error_reply(-libc::EIO, "request dropped by its target".into()),
            ),
        };
        let msg = resp.encode_to_vec();
        let parts = [bulk.as_slice()];
        let write =
            frame::write_frame_async(&mut wr, h.op(), FLAG_RESPONSE, h.request_id, &msg, &parts);
        let res = match limits.idle_timeout {
            None => write.await,
            Some(d) => tokio::time::timeout(d, write).await.unwrap_or_else(|_| {
                Err(FrameError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the client read none of it for {d:?} (data_plane.idle_timeout_s)"),
                )))
            }),
        };
        drop((msg, bulk));
        st.last_reply_ms
            .store(st.born.elapsed().as_millis() as u64, Ordering::Release);
        st.unread.fetch_sub(held, Ordering::AcqRel);
        st.in_flight.fetch_sub(1, Ordering::AcqRel);
        st.drained.notify_one();
        if let Err(e) = res {
            if let FrameError::Io(ref io) = e {
                if io.kind() == std::io::ErrorKind::TimedOut {
                    if let Some(n) = limits.timeout_log.due() {
                        tracing::warn!(
                            "data plane {peer}: closing connection: write reply: {e}{}",
                            left_out(n)
                        );
                    }
                }
            }
            tracing::debug!("data plane {peer}: write reply: {e}");
            st.closed.store(true, Ordering::Release);
            st.drained.notify_one();
            return;
        }
    }
}
