//! In-process fake Peregrine system for tests: a management gRPC service
//! and engines speaking the real data-plane frames over real TCP sockets.
//!
//! It implements the engine semantics the client relies on (per-shard
//! dkey -> akey -> SINGLE/ARRAY values, versions by epoch, punches, CRC
//! checks on update and fetch, listing, sizes) in the simplest way: each
//! shard keeps a log of operations replayed on every read. Faults can be
//! injected per engine: down (connections closed), hang (no reply),
//! corrupt stored data (`-EILSEQ` per value), corruption in flight (wrong
//! bytes under a good CRC). Not part of the public API.

// tonic's generated trait fixes `Status` as the error type.
#![allow(clippy::result_large_err)]

use crate::hlc;
use crate::sync::Mutex;
use peregrine_isal::crc32c;
use peregrine_proto::data::{
    self, response::Body, FetchResp, FetchedValue, ListResp, QuerySizeResp, ValueKind,
};
use peregrine_proto::frame::{self, Opcode, FLAG_RESPONSE};
use peregrine_proto::mgmt::{self, mgmt_server};
use prost::Message;
use std::collections::{BTreeSet, HashMap};
use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tonic::{Request, Response, Status};

#[derive(Clone, Debug)]
enum Op {
    Update {
        akey: Vec<u8>,
        kind: i32,
        offset: u64,
        data: Vec<u8>,
        has_crc: bool,
    },
    PunchAkey(Vec<u8>),
    PunchDkey,
    PunchObj,
}

#[derive(Clone, Debug)]
struct Entry {
    epoch: u64,
    dkey: Vec<u8>,
    op: Op,
}

type ShardKey = (Vec<u8>, Vec<u8>, u64, u64, u32);

/// Fault switches and counters of one fake engine.
#[derive(Default)]
pub struct EngineState {
    shards: Mutex<HashMap<ShardKey, Vec<Entry>>>,
    /// Close every connection without replying.
    pub down: AtomicBool,
    /// Read requests but never reply.
    pub hang: AtomicBool,
    /// Values stored with a checksum fail the engine's verification.
    pub corrupt_stored: AtomicBool,
    /// Fetched bytes are altered after the CRC was computed.
    pub corrupt_wire: AtomicBool,
    /// Requests whose map version is below this get -ESTALE.
    pub min_map_version: AtomicU64,
    /// Requests handled (any opcode).
    pub requests: AtomicU64,
}

pub struct FakeEngine {
    pub addr: String,
    pub state: Arc<EngineState>,
}

enum Val {
    Single(Vec<u8>, bool),
    Array(Vec<u8>, bool),
}

impl EngineState {
    fn replay(&self, key: &ShardKey, epoch: u64, dkey: &[u8], akey: &[u8]) -> Option<Val> {
        let shards = self.shards.lock();
        let mut log: Vec<&Entry> = shards
            .get(key)?
            .iter()
            .filter(|e| e.epoch <= epoch)
            .collect();
        log.sort_by_key(|e| e.epoch);
        let mut v: Option<Val> = None;
        for e in log {
            match &e.op {
                Op::PunchObj => v = None,
                Op::PunchDkey if e.dkey == dkey => v = None,
                Op::PunchAkey(a) if e.dkey == dkey && a == akey => v = None,
                Op::Update {
                    akey: a,
                    kind,
                    offset,
                    data,
                    has_crc,
                } if e.dkey == dkey && a == akey => {
                    if *kind == ValueKind::Single as i32 {
                        v = Some(Val::Single(data.clone(), *has_crc));
                    } else {
                        let (mut arr, mut crc) = match v.take() {
                            Some(Val::Array(a, c)) => (a, c),
                            _ => (Vec::new(), true),
                        };
                        let end = (*offset as usize) + data.len();
                        if arr.len() < end {
                            arr.resize(end, 0);
                        }
                        arr[*offset as usize..end].copy_from_slice(data);
                        crc &= *has_crc;
                        v = Some(Val::Array(arr, crc));
                    }
                }
                _ => {}
            }
        }
        v
    }

    fn keys(&self, key: &ShardKey, epoch: u64, dkey: Option<&[u8]>) -> Vec<Vec<u8>> {
        let candidates: BTreeSet<(Vec<u8>, Vec<u8>)> = {
            let shards = self.shards.lock();
            let Some(log) = shards.get(key) else {
                return Vec::new();
            };
            log.iter()
                .filter(|e| e.epoch <= epoch)
                .filter_map(|e| match &e.op {
                    Op::Update { akey, .. } if dkey.is_none_or(|d| d == e.dkey) => {
                        Some((e.dkey.clone(), akey.clone()))
                    }
                    _ => None,
                })
                .collect()
        };
        let mut out: Vec<Vec<u8>> = candidates
            .into_iter()
            .filter(|(d, a)| self.replay(key, epoch, d, a).is_some())
            .map(|(d, a)| if dkey.is_some() { a } else { d })
            .collect();
        out.dedup();
        out
    }

    fn handle(&self, op: Opcode, msg: &[u8], bulk: &[u8]) -> (data::Response, Vec<u8>) {
        let err = |code: i32, m: &str| {
            (
                data::Response {
                    status: Some(data::Status {
                        code,
                        message: m.into(),
                    }),
                    body: None,
                },
                Vec::new(),
            )
        };
        let ok = |body: Option<Body>, bulk: Vec<u8>| {
            (
                data::Response {
                    status: Some(data::Status::default()),
                    body,
                },
                bulk,
            )
        };
        macro_rules! decode {
            ($t:ty) => {
                match <$t>::decode(msg) {
                    Ok(m) => m,
                    Err(e) => return err(-libc::EPROTO, &e.to_string()),
                }
            };
        }
        let shard_key = |a: &Option<data::Address>| -> Result<ShardKey, (data::Response, Vec<u8>)> {
            let a = a.as_ref().ok_or_else(|| err(-libc::EINVAL, "no address"))?;
            if a.map_version < self.min_map_version.load(Ordering::Relaxed) {
                return Err(err(-libc::ESTALE, "stale pool map"));
            }
            let oid = a.oid.unwrap_or_default();
            Ok((a.pool.clone(), a.cont.clone(), oid.hi, oid.lo, a.shard))
        };
        match op {
            // Updates apply at once here: there is nothing to decide.
            Opcode::Ping | Opcode::Flush | Opcode::DtxDecide => ok(None, Vec::new()),
            Opcode::DtxQuery => err(-libc::ENOTSUP, "the test double keeps no transactions"),
            // As an engine before it: the client punches each object alone.
            Opcode::Discard => err(
                -libc::ENOTSUP,
                "the test double punches one object at a time",
            ),
            Opcode::ListChanged | Opcode::ListRecords => {
                err(-libc::ENOTSUP, "the test double does not reintegrate")
            }
            Opcode::Update => {
                let r = decode!(data::UpdateReq);
                let key = match shard_key(&r.addr) {
                    Ok(k) => k,
                    Err(e) => return e,
                };
                let mut off = 0usize;
                let mut entries = Vec::new();
                for iod in &r.iods {
                    let end = off + iod.len as usize;
                    if end > bulk.len() {
                        return err(-libc::EINVAL, "bulk shorter than iods");
                    }
                    let d = &bulk[off..end];
                    off = end;
                    if iod.has_crc && crc32c(d) != iod.crc {
                        return err(-libc::EILSEQ, "checksum mismatch on update");
                    }
                    entries.push(Entry {
                        epoch: r.epoch,
                        dkey: r.dkey.clone(),
                        op: Op::Update {
                            akey: iod.akey.clone(),
                            kind: iod.kind,
                            offset: iod.offset,
                            data: d.to_vec(),
                            has_crc: iod.has_crc,
                        },
                    });
                }
                self.shards.lock().entry(key).or_default().extend(entries);
                ok(None, Vec::new())
            }
            Opcode::Punch => {
                let r = decode!(data::PunchReq);
                let key = match shard_key(&r.addr) {
                    Ok(k) => k,
                    Err(e) => return e,
                };
                let mk = |op| Entry {
                    epoch: r.epoch,
                    dkey: r.dkey.clone(),
                    op,
                };
                let entries: Vec<Entry> = if r.dkey.is_empty() {
                    vec![mk(Op::PunchObj)]
                } else if r.akeys.is_empty() {
                    vec![mk(Op::PunchDkey)]
                } else {
                    r.akeys
                        .iter()
                        .map(|a| mk(Op::PunchAkey(a.clone())))
                        .collect()
                };
                self.shards.lock().entry(key).or_default().extend(entries);
                ok(None, Vec::new())
            }
            Opcode::Fetch => {
                let r = decode!(data::FetchReq);
                let key = match shard_key(&r.addr) {
                    Ok(k) => k,
                    Err(e) => return e,
                };
                let mut values = Vec::new();
                let mut out = Vec::new();
                for iod in &r.iods {
                    let (status, mut bytes, size, has_crc) =
                        match self.replay(&key, r.epoch, &r.dkey, &iod.akey) {
                            Some(Val::Single(d, c)) if iod.kind == ValueKind::Single as i32 => {
                                let n = d.len() as u64;
                                (0, d, n, c)
                            }
                            Some(Val::Array(a, c)) if iod.kind == ValueKind::Array as i32 => {
                                let mut b = vec![0u8; iod.len as usize];
                                let (s, e) = (
                                    (iod.offset as usize).min(a.len()),
                                    ((iod.offset + iod.len) as usize).min(a.len()),
                                );
                                b[..e - s].copy_from_slice(&a[s..e]);
                                (0, b, a.len() as u64, c)
                            }
                            _ if iod.kind == ValueKind::Array as i32 => {
                                (0, vec![0u8; iod.len as usize], 0, false)
                            }
                            _ => (-libc::ENOENT, Vec::new(), 0, false),
                        };
                    if status == 0 && has_crc && self.corrupt_stored.load(Ordering::Relaxed) {
                        values.push(FetchedValue {
                            status: -libc::EILSEQ,
                            ..Default::default()
                        });
                        continue;
                    }
                    let crc = if has_crc { crc32c(&bytes) } else { 0 };
                    if self.corrupt_wire.load(Ordering::Relaxed) && !bytes.is_empty() {
                        bytes[0] ^= 0xff;
                    }
                    values.push(FetchedValue {
                        status,
                        len: bytes.len() as u64,
                        size,
                        crc,
                        has_crc,
                        absent: status != 0,
                        epoch: 0,
                    });
                    out.extend_from_slice(&bytes);
                }
                ok(Some(Body::Fetch(FetchResp { values })), out)
            }
            Opcode::List => {
                let r = decode!(data::ListReq);
                let key = match shard_key(&r.addr) {
                    Ok(k) => k,
                    Err(e) => return e,
                };
                let all = self.keys(
                    &key,
                    r.epoch,
                    if r.dkey.is_empty() {
                        None
                    } else {
                        Some(&r.dkey)
                    },
                );
                let rest: Vec<Vec<u8>> = all
                    .into_iter()
                    .filter(|k| r.anchor.is_empty() || *k > r.anchor)
                    .collect();
                let max = if r.max == 0 {
                    usize::MAX
                } else {
                    r.max as usize
                };
                let done = rest.len() <= max;
                let keys: Vec<Vec<u8>> = rest.into_iter().take(max).collect();
                let anchor = keys.last().cloned().unwrap_or_default();
                ok(
                    Some(Body::List(ListResp { keys, anchor, done })),
                    Vec::new(),
                )
            }
            Opcode::QuerySize => {
                let r = decode!(data::QuerySizeReq);
                let key = match shard_key(&r.addr) {
                    Ok(k) => k,
                    Err(e) => return e,
                };
                if r.last.is_some() {
                    // Answered as an engine that predates the query (the
                    // client then lists the dkeys).
                    return ok(
                        Some(Body::Size(QuerySizeResp {
                            size: 0,
                            absent: true,
                            last: None,
                        })),
                        Vec::new(),
                    );
                }
                match self.replay(&key, r.epoch, &r.dkey, &r.akey) {
                    Some(Val::Array(a, _)) => ok(
                        Some(Body::Size(QuerySizeResp {
                            size: a.len() as u64,
                            absent: false,
                            last: None,
                        })),
                        Vec::new(),
                    ),
                    Some(Val::Single(d, _)) => ok(
                        Some(Body::Size(QuerySizeResp {
                            size: d.len() as u64,
                            absent: false,
                            last: None,
                        })),
                        Vec::new(),
                    ),
                    None => err(-libc::ENOENT, "no such akey"),
                }
            }
        }
    }
}

impl FakeEngine {
    pub fn start() -> FakeEngine {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind fake engine");
        let addr = l.local_addr().unwrap().to_string();
        let state = Arc::new(EngineState::default());
        let st = state.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || serve_conn(st, conn));
            }
        });
        FakeEngine { addr, state }
    }
}

fn serve_conn(st: Arc<EngineState>, conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let Ok(rd) = conn.try_clone() else { return };
    let mut rd = BufReader::new(rd);
    loop {
        if st.down.load(Ordering::Relaxed) {
            return;
        }
        let Ok(f) = frame::read_frame(&mut rd) else {
            return;
        };
        if st.down.load(Ordering::Relaxed) {
            return;
        }
        while st.hang.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        st.requests.fetch_add(1, Ordering::Relaxed);
        let op = f.header.op();
        let (resp, bulk) = st.handle(op, &f.msg, &f.bulk);
        let mut w = BufWriter::new(&conn);
        if frame::write_frame(
            &mut w,
            op,
            FLAG_RESPONSE,
            f.header.request_id,
            &resp.encode_to_vec(),
            &[&bulk],
        )
        .is_err()
        {
            return;
        }
    }
}

#[derive(Default)]
struct MgmtState {
    pools: Vec<mgmt::PoolMap>,
    conts: Vec<mgmt::ContInfo>,
}

#[derive(Clone, Default)]
struct FakeMgmt {
    st: Arc<Mutex<MgmtState>>,
}

fn unimpl<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not in the fake management service"))
}

impl FakeMgmt {
    fn pool(&self, id: &str) -> Result<mgmt::PoolMap, Status> {
        self.st
            .lock()
            .pools
            .iter()
            .find(|p| p.label == id || p.uuid == id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("pool {id:?} not found")))
    }
}

#[tonic::async_trait]
impl mgmt_server::Mgmt for FakeMgmt {
    async fn system_query(
        &self,
        _: Request<mgmt::SystemQueryReq>,
    ) -> Result<Response<mgmt::SystemQueryResp>, Status> {
        unimpl()
    }
    async fn storage_scan(
        &self,
        _: Request<mgmt::StorageScanReq>,
    ) -> Result<Response<mgmt::StorageScanResp>, Status> {
        unimpl()
    }
    async fn storage_format(
        &self,
        _: Request<mgmt::StorageFormatReq>,
    ) -> Result<Response<mgmt::StorageFormatResp>, Status> {
        unimpl()
    }
    async fn join(&self, _: Request<mgmt::JoinReq>) -> Result<Response<mgmt::JoinResp>, Status> {
        unimpl()
    }
    async fn pool_create(
        &self,
        _: Request<mgmt::PoolCreateReq>,
    ) -> Result<Response<mgmt::PoolInfo>, Status> {
        unimpl()
    }
    async fn pool_list(
        &self,
        _: Request<mgmt::PoolListReq>,
    ) -> Result<Response<mgmt::PoolListResp>, Status> {
        unimpl()
    }
    async fn pool_query(
        &self,
        r: Request<mgmt::PoolQueryReq>,
    ) -> Result<Response<mgmt::PoolInfo>, Status> {
        let p = self.pool(&r.into_inner().id)?;
        Ok(Response::new(mgmt::PoolInfo {
            uuid: p.uuid,
            label: p.label,
            state: mgmt::PoolState::Ready.into(),
            map_version: p.version,
            total_targets: p.targets.len() as u32,
            ..Default::default()
        }))
    }
    async fn pool_destroy(
        &self,
        _: Request<mgmt::PoolDestroyReq>,
    ) -> Result<Response<mgmt::Empty>, Status> {
        unimpl()
    }
    async fn pool_set_prop(
        &self,
        _: Request<mgmt::PoolSetPropReq>,
    ) -> Result<Response<mgmt::PoolInfo>, Status> {
        unimpl()
    }
    async fn pool_evict(
        &self,
        _: Request<mgmt::PoolEvictReq>,
    ) -> Result<Response<mgmt::Empty>, Status> {
        unimpl()
    }
    async fn pool_connect(
        &self,
        r: Request<mgmt::PoolConnectReq>,
    ) -> Result<Response<mgmt::PoolMap>, Status> {
        Ok(Response::new(self.pool(&r.into_inner().id)?))
    }
    async fn cont_create(
        &self,
        _: Request<mgmt::ContCreateReq>,
    ) -> Result<Response<mgmt::ContInfo>, Status> {
        unimpl()
    }
    async fn cont_list(
        &self,
        _: Request<mgmt::ContListReq>,
    ) -> Result<Response<mgmt::ContListResp>, Status> {
        unimpl()
    }
    async fn cont_query(
        &self,
        r: Request<mgmt::ContQueryReq>,
    ) -> Result<Response<mgmt::ContInfo>, Status> {
        let r = r.into_inner();
        let p = self.pool(&r.pool)?;
        self.st
            .lock()
            .conts
            .iter()
            .find(|c| c.pool_uuid == p.uuid && (c.label == r.id || c.uuid == r.id))
            .cloned()
            .map(Response::new)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "container {:?} not found in pool {:?}",
                    r.id, p.label
                ))
            })
    }
    async fn cont_destroy(
        &self,
        _: Request<mgmt::ContDestroyReq>,
    ) -> Result<Response<mgmt::Empty>, Status> {
        unimpl()
    }
    async fn cont_set_prop(
        &self,
        _: Request<mgmt::ContSetPropReq>,
    ) -> Result<Response<mgmt::ContInfo>, Status> {
        unimpl()
    }
    async fn snap_create(
        &self,
        r: Request<mgmt::SnapCreateReq>,
    ) -> Result<Response<mgmt::Snapshot>, Status> {
        Ok(Response::new(mgmt::Snapshot {
            epoch: hlc::now(),
            name: r.into_inner().name,
            created_unix: 0,
        }))
    }
    async fn snap_list(
        &self,
        _: Request<mgmt::SnapListReq>,
    ) -> Result<Response<mgmt::SnapListResp>, Status> {
        unimpl()
    }
    async fn snap_destroy(
        &self,
        _: Request<mgmt::SnapDestroyReq>,
    ) -> Result<Response<mgmt::Empty>, Status> {
        unimpl()
    }
}

/// A fake system: `engines` engines with `targets` targets each, a pool
/// "tank" over all of them, containers "c1" (crc32c) and "nocsum" (off).
pub struct FakeCluster {
    pub mgmt_addr: String,
    pub engines: Vec<FakeEngine>,
    mgmt: FakeMgmt,
    _rt: tokio::runtime::Runtime,
}

impl FakeCluster {
    pub fn start(engines: usize, targets: u32) -> FakeCluster {
        let engines: Vec<FakeEngine> = (0..engines).map(|_| FakeEngine::start()).collect();
        let mut tl = Vec::new();
        for (r, e) in engines.iter().enumerate() {
            for i in 0..targets {
                tl.push(mgmt::PoolTarget {
                    rank: r as u32,
                    index: i,
                    data_addr: e.addr.clone(),
                    fault_domain: format!("/n{r}"),
                    up: true,
                    shm_path: String::new(),
                    state: mgmt::TargetState::TargetUpIn as i32,
                });
            }
        }
        let pool_uuid = uuid::Uuid::new_v4().to_string();
        let st = MgmtState {
            pools: vec![mgmt::PoolMap {
                uuid: pool_uuid.clone(),
                label: "tank".into(),
                version: 1,
                targets: tl,
                ..Default::default()
            }],
            conts: ["c1", "nocsum"]
                .iter()
                .map(|l| mgmt::ContInfo {
                    uuid: uuid::Uuid::new_v4().to_string(),
                    label: l.to_string(),
                    pool_uuid: pool_uuid.clone(),
                    r#type: mgmt::ContType::Posix.into(),
                    oclass: "SX".into(),
                    chunk_size: 1 << 20,
                    checksum: if *l == "c1" {
                        mgmt::Checksum::Crc32c
                    } else {
                        mgmt::Checksum::Off
                    }
                    .into(),
                    ..Default::default()
                })
                .collect(),
        };
        let mgmt = FakeMgmt {
            st: Arc::new(Mutex::new(st)),
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let svc = mgmt.clone();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let mgmt_addr = listener.local_addr().unwrap().to_string();
        rt.spawn(async move {
            let incoming =
                tonic::transport::server::TcpIncoming::from_listener(listener, true, None).unwrap();
            let _ = tonic::transport::Server::builder()
                .add_service(mgmt_server::MgmtServer::new(svc))
                .serve_with_incoming(incoming)
                .await;
        });
        FakeCluster {
            mgmt_addr,
            engines,
            mgmt,
            _rt: rt,
        }
    }

    pub fn engine(&self, rank: usize) -> &EngineState {
        &self.engines[rank].state
    }

    /// Mark an engine's targets up or down in the pool map (bumps its version).
    pub fn set_rank_up(&self, rank: u32, up: bool) {
        let mut st = self.mgmt.st.lock();
        let p = &mut st.pools[0];
        p.version += 1;
        for t in p.targets.iter_mut().filter(|t| t.rank == rank) {
            t.up = up;
        }
    }

    /// The pool map's current version.
    pub fn map_version(&self) -> u64 {
        self.mgmt.st.lock().pools[0].version
    }

    /// Make every engine refuse requests made with an older map.
    pub fn require_map_version(&self, v: u64) {
        for e in &self.engines {
            e.state.min_map_version.store(v, Ordering::Relaxed);
        }
    }
}
