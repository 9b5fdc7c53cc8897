//! The management service (MS): system map, pools and containers.
//!
//! It runs in the engine named first in `mgmt_svc_replicas`. Its state is
//! one small record (protobuf, `proto/ms_state.proto`: it grows fields, see
//! `persist`), stored durably through that engine's storage (A/B slots with
//! sequence numbers, see `peregrine_vos`) after every change and before the
//! change is acknowledged. Before that engine is
//! formatted the state lives in memory only (it holds nothing but the
//! members that joined). Raft replication will later replace the single
//! host without changing the API.

mod access;
mod clone;
mod containers;
mod join;
mod legacy;
mod persist;
mod pool_map;
mod pools;
mod props;
mod quota;

use crate::node::Node;
pub use join::{check_targets, validate_join, MAX_MEMBERS};
use peregrine_proto::mgmt::engine_client::EngineClient;
use peregrine_proto::mgmt::mgmt_server::Mgmt;
use peregrine_proto::mgmt::*;
use peregrine_proto::ms::EngineState;
pub use pool_map::{spawn_pool_watch, REINTEGRATION_MARGIN};
use pool_map::{RankOut, Reintegration};
pub use quota::spawn_quota_watch;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Mutex;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use uuid::Uuid;

/// An engine that has not sent a heartbeat for this long is reported stopped.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(6);
/// An engine aggregates on its own only this long after sending a heartbeat
/// that was answered (and once it knows the snapshot lists): before the
/// service counts it as stopped, and so before a snapshot may skip it.
pub const AGGREGATION_LEASE: Duration = Duration::from_secs(3);
/// `JoinReq.state` of an engine shutting down.
pub const STATE_STOPPING: &str = "stopping";
/// Share of a pool's total size given to the SCM tier when none is given.
pub const DEFAULT_TIER_RATIO: f64 = 0.06;

#[derive(Clone, Debug, PartialEq)]
struct MemberRec {
    rank: u32,
    uuid: String,
    control_addr: String,
    data_addr: String,
    fault_domain: String,
    targets: u32,
    /// Ready or Maintenance, as it said when it joined.
    state: EngineState,
    /// Shared-memory socket. Not persisted: engines re-announce it with
    /// every heartbeat.
    shm_path: String,
}

#[derive(Clone, Debug, PartialEq)]
struct ContRec {
    uuid: Uuid,
    label: String,
    kind: ContType,
    oclass: String,
    dir_oclass: String,
    chunk_size: u64,
    rf: u32,
    checksum: Checksum,
    props: BTreeMap<String, String>,
    snapshots: Vec<SnapRec>,
    create_epoch: u64,
}

#[derive(Clone, Debug, PartialEq)]
struct SnapRec {
    epoch: u64,
    name: String,
    created_unix: u64,
}

impl From<&SnapRec> for Snapshot {
    fn from(s: &SnapRec) -> Snapshot {
        Snapshot {
            epoch: s.epoch,
            name: s.name.clone(),
            created_unix: s.created_unix,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct PoolRec {
    uuid: Uuid,
    label: String,
    ranks: Vec<u32>,
    /// Targets per rank at creation, in rank order.
    targets: Vec<u32>,
    scm_per_target: u64,
    nvme_per_target: u64,
    props: BTreeMap<String, String>,
    map_version: u64,
    conts: BTreeMap<Uuid, ContRec>,
    /// The key the pool's handles are MAC'd with, and those revoked.
    access: PoolAccess,
}

/// The service's state, persisted whole after every change (`persist`:
/// [`MsState::encode`], [`MsState::decode`]).
#[derive(Clone, Debug, Default, PartialEq)]
struct MsState {
    system: String,
    map_version: u64,
    members: BTreeMap<u32, MemberRec>,
    pools: BTreeMap<Uuid, PoolRec>,
    /// Per pool, the ranks whose targets are not up-and-in (see `pool_map`).
    pool_out: BTreeMap<Uuid, BTreeMap<u32, RankOut>>,
}

pub struct MgmtService {
    node: Arc<Node>,
    state: Mutex<MsState>,
    /// Last heartbeat per rank (not persisted: liveness is re-learned).
    heartbeats: parking_lot::Mutex<HashMap<u32, Instant>>,
    /// When each rank was last heard from, its word that it stops included:
    /// what its exclusion's horizon counts back from. Unlike `heartbeats`
    /// it is kept when the rank stops.
    last_heard: parking_lot::Mutex<HashMap<u32, Instant>>,
    /// When this service started counting heartbeats.
    started: Instant,
    /// Pools being reintegrated now, or whose last try failed (and when).
    reintegrations: parking_lot::Mutex<HashMap<Uuid, Reintegration>>,
    /// Ranks that said they stop and have not joined since.
    stopping: parking_lot::Mutex<std::collections::HashSet<u32>>,
    /// Clones being filled by this service now.
    cloning: parking_lot::Mutex<std::collections::HashSet<Uuid>>,
    /// This service, for work that must outlive the call that started it.
    this: std::sync::Weak<MgmtService>,
    /// Quota changes so far (see `quota`): orders the pushes to engines.
    quota_version: std::sync::atomic::AtomicU64,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// A client of the Engine service at `addr`, presenting this engine's
/// certificate (or plain on an insecure system).
async fn engine_client(addr: &str) -> Result<EngineClient<Channel>, Status> {
    let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| Status::internal(format!("engine address {addr:?}: {e}")))?
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(120));
    let ch = crate::tls::connector()?.connect(ep).await.map_err(|e| {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg = format!("{msg}: {s}");
            src = s.source();
        }
        Status::unavailable(format!("engine at {addr}: {msg}"))
    })?;
    Ok(EngineClient::new(ch))
}

impl MgmtService {
    pub fn new(node: Arc<Node>) -> Result<Arc<Self>, String> {
        let mut state = MsState {
            system: node.cfg.name.clone(),
            ..Default::default()
        };
        if let Ok(st) = node.storage() {
            if let Some(blob) = st
                .mgmt_load()
                .map_err(|e| format!("load management state: {e}"))?
            {
                state = MsState::decode(&blob)
                    .map_err(|e| format!("management state is undecodable: {e}"))?;
                if !persist::is_current(&blob) {
                    // Migrated once: from now on the state is in the current encoding.
                    st.mgmt_store(&state.encode())
                        .map_err(|e| format!("rewrite management state: {e}"))?;
                    tracing::info!(
                        "management service: state of an earlier encoding rewritten in the current one"
                    );
                }
                tracing::info!(
                    "management service: loaded {} members, {} pools",
                    state.members.len(),
                    state.pools.len()
                );
            }
        }
        Ok(Arc::new_cyclic(|this| MgmtService {
            this: this.clone(),
            node,
            state: Mutex::new(state),
            heartbeats: Default::default(),
            last_heard: Default::default(),
            started: Instant::now(),
            reintegrations: Default::default(),
            stopping: Default::default(),
            cloning: Default::default(),
            quota_version: Default::default(),
        }))
    }

    /// Make the state durable. Called with the state lock held, before replying.
    fn persist(&self, state: &MsState) -> Result<(), Status> {
        match self.node.storage() {
            Ok(st) => {
                let blob = state.encode();
                st.mgmt_store(&blob)
                    .map_err(|e| Status::internal(format!("persist management state: {e}")))
            }
            // Before format there is nowhere durable; only membership exists then.
            Err(_) if state.pools.is_empty() => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn alive(&self, rank: u32) -> bool {
        self.heartbeats
            .lock()
            .get(&rank)
            .is_some_and(|t| t.elapsed() < HEARTBEAT_TIMEOUT)
    }

    fn member_state(&self, m: &MemberRec) -> MemberState {
        if !self.alive(m.rank) {
            MemberState::Stopped
        } else if m.state == EngineState::Ready {
            MemberState::Joined
        } else {
            MemberState::Maintenance
        }
    }

    fn find_pool<'a>(state: &'a MsState, id: &str) -> Result<&'a PoolRec, Status> {
        if let Ok(u) = Uuid::parse_str(id) {
            if let Some(p) = state.pools.get(&u) {
                return Ok(p);
            }
        }
        state
            .pools
            .values()
            .find(|p| p.label == id)
            .ok_or_else(|| Status::not_found(format!("pool {id:?}: no such pool")))
    }

    fn find_cont<'a>(pool: &'a PoolRec, id: &str) -> Result<&'a ContRec, Status> {
        if let Ok(u) = Uuid::parse_str(id) {
            if let Some(c) = pool.conts.get(&u) {
                return Ok(c);
            }
        }
        pool.conts.values().find(|c| c.label == id).ok_or_else(|| {
            Status::not_found(format!(
                "container {id:?} in pool {:?}: no such container",
                pool.label
            ))
        })
    }

    fn member_addr(state: &MsState, rank: u32) -> Result<String, Status> {
        state
            .members
            .get(&rank)
            .map(|m| m.control_addr.clone())
            .ok_or_else(|| Status::not_found(format!("rank {rank}: not a member of the system")))
    }

    /// Call `f` on the Engine service of every rank of a pool; fails on the first error.
    async fn on_ranks<F, Fut>(
        &self,
        state: &MsState,
        ranks: &[u32],
        skip_down: bool,
        f: F,
    ) -> Result<(), Status>
    where
        F: Fn(EngineClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<(), Status>>,
    {
        for &rank in ranks {
            if skip_down && !self.alive(rank) {
                tracing::warn!("rank {rank} is stopped; skipping it");
                continue;
            }
            let addr = Self::member_addr(state, rank)?;
            let c = engine_client(&addr)
                .await
                .map_err(|e| Status::unavailable(format!("rank {rank}: {}", e.message())))?;
            f(c).await
                .map_err(|e| Status::new(e.code(), format!("rank {rank}: {}", e.message())))?;
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl Mgmt for MgmtService {
    async fn system_query(
        &self,
        _: Request<SystemQueryReq>,
    ) -> Result<Response<SystemQueryResp>, Status> {
        let s = self.state.lock().await;
        Ok(Response::new(SystemQueryResp {
            system: s.system.clone(),
            leader_rank: self.node.cfg.rank,
            map_version: s.map_version,
            members: s
                .members
                .values()
                .map(|m| Member {
                    rank: m.rank,
                    uuid: m.uuid.clone(),
                    control_addr: m.control_addr.clone(),
                    data_addr: m.data_addr.clone(),
                    state: self.member_state(m).into(),
                    fault_domain: m.fault_domain.clone(),
                    targets: m.targets,
                    shm_path: m.shm_path.clone(),
                    targets_out: pool_map::targets_out(&s, m.rank),
                })
                .collect(),
        }))
    }

    async fn storage_scan(
        &self,
        _: Request<StorageScanReq>,
    ) -> Result<Response<StorageScanResp>, Status> {
        let members: Vec<MemberRec> = self.state.lock().await.members.values().cloned().collect();
        let mut ranks = vec![];
        for m in members {
            let mut rs = match engine_client(&m.control_addr).await {
                Ok(mut c) => match c.local_scan(Empty {}).await {
                    Ok(r) => r.into_inner(),
                    Err(e) => RankStorage {
                        rank: m.rank,
                        state: StorageState::Unreachable.into(),
                        message: e.message().into(),
                        ..Default::default()
                    },
                },
                Err(e) => RankStorage {
                    rank: m.rank,
                    state: StorageState::Unreachable.into(),
                    message: e.message().into(),
                    ..Default::default()
                },
            };
            rs.rank = m.rank;
            ranks.push(rs);
        }
        Ok(Response::new(StorageScanResp { ranks }))
    }

    async fn storage_format(
        &self,
        req: Request<StorageFormatReq>,
    ) -> Result<Response<StorageFormatResp>, Status> {
        let force = req.into_inner().force;
        let members: Vec<MemberRec> = self.state.lock().await.members.values().cloned().collect();
        if members.is_empty() {
            return Err(Status::failed_precondition(
                "no engines have joined the system yet",
            ));
        }
        let mut ranks = vec![];
        let mut failures = vec![];
        for m in members {
            if !self.alive(m.rank) {
                failures.push(format!("rank {}: engine is stopped", m.rank));
                continue;
            }
            let res = async {
                let mut c = engine_client(&m.control_addr).await?;
                c.local_format(StorageFormatReq { force })
                    .await
                    .map(|r| r.into_inner())
            }
            .await;
            match res {
                Ok(rs) => {
                    ranks.push(rs);
                    if let Some(mm) = self.state.lock().await.members.get_mut(&m.rank) {
                        mm.state = EngineState::Ready;
                    }
                }
                Err(e) => failures.push(e.message().to_string()),
            }
        }
        // The MS host may just have become durable: write what it holds.
        {
            let s = self.state.lock().await;
            self.persist(&s)?;
        }
        if !failures.is_empty() {
            return Err(Status::failed_precondition(format!(
                "storage format: {}",
                failures.join("; ")
            )));
        }
        Ok(Response::new(StorageFormatResp { ranks }))
    }

    async fn join(&self, req: Request<JoinReq>) -> Result<Response<JoinResp>, Status> {
        // An engine's certificate names its rank and system: it joins as
        // that one only (a forged rank would take over another's addresses).
        let caller = req.extensions().get::<crate::auth::Caller>().cloned();
        let j = req.into_inner();
        crate::auth::check_join(caller.as_ref(), &j)?;
        let mut s = self.state.lock().await;
        validate_join(&j, &s.system)?;
        let state = join::engine_state(&j.state);
        if j.state == STATE_STOPPING {
            // Counted as stopped from now: the pool watch excludes its
            // targets on its next round. Only the member itself may say so.
            if s.members.get(&j.rank).is_some_and(|m| m.uuid == j.uuid) {
                self.heartbeats.lock().remove(&j.rank);
                self.last_heard.lock().insert(j.rank, Instant::now());
                self.stopping.lock().insert(j.rank);
                tracing::info!("rank {} is stopping", j.rank);
            }
            return Ok(Response::new(JoinResp {
                map_version: s.map_version,
                ..Default::default()
            }));
        }
        let changed = match s.members.get(&j.rank) {
            Some(m) => {
                m.control_addr != j.control_addr
                    || m.data_addr != j.data_addr
                    || m.uuid != j.uuid
                    || m.state != state
                    || m.targets != j.targets
            }
            None => true,
        };
        if changed && !s.members.contains_key(&j.rank) && s.members.len() >= MAX_MEMBERS {
            return Err(Status::resource_exhausted(format!(
                "join: rank {}: the system has {MAX_MEMBERS} members already, the most it holds",
                j.rank
            )));
        }
        if changed {
            let before = s.members.get(&j.rank).cloned();
            s.members.insert(
                j.rank,
                MemberRec {
                    rank: j.rank,
                    uuid: j.uuid,
                    control_addr: j.control_addr,
                    data_addr: j.data_addr,
                    fault_domain: j.fault_domain,
                    targets: j.targets,
                    state,
                    shm_path: j.shm_path,
                },
            );
            s.map_version += 1;
            if let Err(e) = self.persist(&s) {
                // Not kept: what is not durable must not make every later save fail.
                s.map_version -= 1;
                match before {
                    Some(m) => s.members.insert(j.rank, m),
                    None => s.members.remove(&j.rank),
                };
                return Err(e);
            }
        } else if let Some(m) = s.members.get_mut(&j.rank) {
            // Neither versioned nor persisted: see MemberRec::shm_path.
            m.shm_path = j.shm_path;
        }
        let returning = !self.alive(j.rank);
        self.heartbeats.lock().insert(j.rank, Instant::now());
        self.last_heard.lock().insert(j.rank, Instant::now());
        self.stopping.lock().remove(&j.rank);
        // A returning engine may have missed snapshot changes while it was away.
        let snapshots = if returning || j.want_snapshots {
            let rank = j.rank;
            s.pools
                .values()
                .filter(|p| p.ranks.contains(&rank))
                .flat_map(|p| {
                    p.conts.values().map(|c| ContShardSnapshotsReq {
                        pool_uuid: p.uuid.to_string(),
                        cont_uuid: c.uuid.to_string(),
                        epochs: c.snapshots.iter().map(|x| x.epoch).collect(),
                        adding: 0,
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Response::new(JoinResp {
            map_version: s.map_version,
            snapshots,
            pool_maps: pool_map::views_of_rank(&s, j.rank),
            pool_maps_known: true,
        }))
    }

    // The pool calls are served by the inherent methods of the same names
    // in `pools`, the container and snapshot calls by those in `containers`
    // (an inherent method is found before the trait's).
    async fn pool_create(&self, req: Request<PoolCreateReq>) -> Result<Response<PoolInfo>, Status> {
        self.pool_create(req).await
    }

    async fn pool_list(&self, req: Request<PoolListReq>) -> Result<Response<PoolListResp>, Status> {
        self.pool_list(req).await
    }

    async fn pool_query(&self, req: Request<PoolQueryReq>) -> Result<Response<PoolInfo>, Status> {
        self.pool_query(req).await
    }

    async fn pool_destroy(&self, req: Request<PoolDestroyReq>) -> Result<Response<Empty>, Status> {
        self.pool_destroy(req).await
    }

    async fn pool_set_prop(
        &self,
        req: Request<PoolSetPropReq>,
    ) -> Result<Response<PoolInfo>, Status> {
        self.pool_set_prop(req).await
    }

    async fn pool_connect(
        &self,
        req: Request<PoolConnectReq>,
    ) -> Result<Response<PoolMap>, Status> {
        self.pool_connect(req).await
    }

    async fn pool_evict(&self, req: Request<PoolEvictReq>) -> Result<Response<Empty>, Status> {
        self.pool_evict(req).await
    }

    async fn cont_create(&self, req: Request<ContCreateReq>) -> Result<Response<ContInfo>, Status> {
        self.cont_create(req).await
    }

    async fn cont_list(&self, req: Request<ContListReq>) -> Result<Response<ContListResp>, Status> {
        self.cont_list(req).await
    }

    async fn cont_query(&self, req: Request<ContQueryReq>) -> Result<Response<ContInfo>, Status> {
        self.cont_query(req).await
    }

    async fn cont_destroy(&self, req: Request<ContDestroyReq>) -> Result<Response<Empty>, Status> {
        self.cont_destroy(req).await
    }

    async fn cont_set_prop(
        &self,
        req: Request<ContSetPropReq>,
    ) -> Result<Response<ContInfo>, Status> {
        self.cont_set_prop(req).await
    }

    async fn snap_create(&self, req: Request<SnapCreateReq>) -> Result<Response<Snapshot>, Status> {
        self.snap_create(req).await
    }

    async fn snap_list(&self, req: Request<SnapListReq>) -> Result<Response<SnapListResp>, Status> {
        self.snap_list(req).await
    }

    async fn snap_destroy(&self, req: Request<SnapDestroyReq>) -> Result<Response<Empty>, Status> {
        self.snap_destroy(req).await
    }
}
