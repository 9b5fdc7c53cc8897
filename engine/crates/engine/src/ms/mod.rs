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
mod join;
mod legacy;
mod persist;
mod pool_map;
mod props;
mod quota;

use crate::node::Node;
pub use join::{check_targets, validate_join, MAX_MEMBERS};
use peregrine_proto::mgmt::engine_client::EngineClient;
use peregrine_proto::mgmt::mgmt_server::Mgmt;
use peregrine_proto::mgmt::*;
use peregrine_proto::ms::EngineState;
use peregrine_proto::{epoch_now, ObjectClass};
pub use pool_map::{spawn_pool_watch, REINTEGRATION_MARGIN};
use pool_map::{RankOut, Reintegration};
use props::{cont_record, props_map, sync_mode, validate_label, validate_pool_props, CONT_PROPS};
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
/// Epochs a snapshot creation tries before giving up (each refusal means an
/// engine aggregated past the epoch between its choice and its arrival).
const SNAP_ATTEMPTS: u32 = 5;

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

    /// What each rank of a pool reports of its shard (`None`: stopped or
    /// not answering), in the pool's rank order.
    async fn shard_spaces(
        &self,
        state: &MsState,
        pool: &PoolRec,
    ) -> Vec<(u32, Option<PoolShardSpace>)> {
        let mut out = Vec::with_capacity(pool.ranks.len());
        for &rank in &pool.ranks {
            let reply = match (self.alive(rank), Self::member_addr(state, rank)) {
                (true, Ok(addr)) => match engine_client(&addr).await {
                    Ok(mut c) => c
                        .pool_shard_query(PoolShardQueryReq {
                            pool_uuid: pool.uuid.to_string(),
                        })
                        .await
                        .ok()
                        .map(|r| r.into_inner()),
                    Err(_) => None,
                },
                _ => None,
            };
            out.push((rank, reply));
        }
        out
    }

    async fn pool_space(
        &self,
        state: &MsState,
        pool: &PoolRec,
    ) -> (Vec<Tier>, HashMap<Uuid, u64>, u32) {
        let (mut scm_t, mut scm_f, mut nv_t, mut nv_f) = (0, 0, 0, 0);
        let mut used: HashMap<Uuid, u64> = HashMap::new();
        let mut down = 0;
        for (i, (_, reply)) in self.shard_spaces(state, pool).await.into_iter().enumerate() {
            let targets = pool.targets.get(i).copied().unwrap_or(1);
            match reply {
                Some(r) => {
                    scm_t += r.scm_total;
                    scm_f += r.scm_free;
                    nv_t += r.nvme_total;
                    nv_f += r.nvme_free;
                    for (k, v) in r.cont_used {
                        if let Ok(u) = Uuid::parse_str(&k) {
                            *used.entry(u).or_default() += v;
                        }
                    }
                }
                None => {
                    // A stopped engine still holds its reservation; its free space is unknown.
                    down += targets;
                    scm_t += pool.scm_per_target * targets as u64;
                    nv_t += pool.nvme_per_target * targets as u64;
                }
            }
        }
        let tiers = vec![
            Tier {
                name: "scm".into(),
                total: scm_t,
                free: scm_f,
            },
            Tier {
                name: "nvme".into(),
                total: nv_t,
                free: nv_f,
            },
        ];
        (tiers, used, down)
    }

    async fn pool_info(&self, state: &MsState, pool: &PoolRec) -> PoolInfo {
        let (tiers, _, unreachable) = self.pool_space(state, pool).await;
        let out = pool_map::OutTargets::of(state, pool);
        PoolInfo {
            uuid: pool.uuid.to_string(),
            label: pool.label.clone(),
            state: if out.down > 0 || unreachable > 0 {
                PoolState::Degraded
            } else if out.reintegrating > 0 {
                PoolState::Reintegrating
            } else {
                PoolState::Ready
            }
            .into(),
            map_version: pool.map_version,
            ranks: pool.ranks.clone(),
            total_targets: pool.targets.iter().sum(),
            // Counted out by the map, or not answering (not yet excluded).
            disabled_targets: out.down.max(unreachable),
            tiers,
            props: props_map(&pool.props),
            containers: pool.conts.len() as u32,
            reintegrating_targets: out.reintegrating,
            rank_states: out.ranks,
        }
    }

    fn cont_info(&self, pool: &PoolRec, c: &ContRec, used: u64) -> ContInfo {
        let mut props = props_map(&c.props);
        props.remove(clone::STATE_PROP);
        ContInfo {
            uuid: c.uuid.to_string(),
            label: c.label.clone(),
            pool_uuid: pool.uuid.to_string(),
            r#type: c.kind.into(),
            oclass: c.oclass.clone(),
            dir_oclass: c.dir_oclass.clone(),
            chunk_size: c.chunk_size,
            redundancy_factor: c.rf,
            checksum: c.checksum.into(),
            props,
            used_bytes: used,
            snapshots: c.snapshots.len() as u32,
            create_epoch: c.create_epoch,
            quota_bytes: quota::limit(c).unwrap_or(0),
            quota_used_bytes: quota::data_bytes(c, used),
            state: self.cont_state(c).into(),
            ..Default::default()
        }
    }

    /// Destroy a container's shards on every rank (skipping stopped ones if
    /// `force`) and its record.
    async fn drop_cont(
        &self,
        s: &mut MsState,
        p: &PoolRec,
        c: &ContRec,
        force: bool,
    ) -> Result<(), Status> {
        let (pid, cid) = (p.uuid.to_string(), c.uuid.to_string());
        self.on_ranks(s, &p.ranks, force, |mut cl| {
            let req = ContShardDestroyReq {
                pool_uuid: pid.clone(),
                cont_uuid: cid.clone(),
            };
            async move { cl.cont_shard_destroy(req).await.map(|_| ()) }
        })
        .await?;
        if let Some(pool) = s.pools.get_mut(&p.uuid) {
            pool.conts.remove(&c.uuid);
        }
        self.persist(s)?;
        tracing::info!(
            "destroyed container {} ({}) in pool {}",
            c.label,
            c.uuid,
            p.label
        );
        Ok(())
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

    /// Send a container's snapshot list to its engines; `adding`: the epoch
    /// of the snapshot being created, refused (ABORTED) by a target that
    /// already aggregated past it.
    async fn push_snapshots(
        &self,
        state: &MsState,
        pool: &PoolRec,
        cont: &ContRec,
        adding: Option<u64>,
    ) -> Result<(), Status> {
        let epochs: Vec<u64> = cont.snapshots.iter().map(|s| s.epoch).collect();
        let (p, c) = (pool.uuid.to_string(), cont.uuid.to_string());
        // An engine counted as stopped is skipped: it does not aggregate
        // (AGGREGATION_LEASE) and gets the lists when it joins again. A
        // service just started has not heard from anyone yet: an engine it
        // has not heard from may still be up, and aggregating.
        let skip_down = self.started.elapsed() >= HEARTBEAT_TIMEOUT;
        self.on_ranks(state, &pool.ranks, skip_down, |mut cl| {
            let req = ContShardSnapshotsReq {
                pool_uuid: p.clone(),
                cont_uuid: c.clone(),
                epochs: epochs.clone(),
                adding: adding.unwrap_or(0),
            };
            async move { cl.cont_shard_snapshots(req).await.map(|_| ()) }
        })
        .await
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

    async fn pool_create(&self, req: Request<PoolCreateReq>) -> Result<Response<PoolInfo>, Status> {
        let r = req.into_inner();
        validate_label("pool", &r.label)?;
        validate_pool_props(&r.props)?;
        access::validate_props("pool", &r.props)?;
        let pool_access = access::new_access();
        let mut s = self.state.lock().await;
        if let Some(existing) = s.pools.values().find(|p| p.label == r.label) {
            return Err(Status::already_exists(format!(
                "pool {:?} already exists ({})",
                r.label, existing.uuid
            )));
        }
        let ranks: Vec<u32> = if r.ranks.is_empty() {
            s.members
                .values()
                .filter(|m| self.alive(m.rank) && m.state == EngineState::Ready)
                .map(|m| m.rank)
                .collect()
        } else {
            let mut v = r.ranks.clone();
            v.sort_unstable();
            v.dedup();
            v
        };
        if ranks.is_empty() {
            return Err(Status::failed_precondition(
                "no ready engines: format storage first (`peregrine storage format`)",
            ));
        }
        let mut targets = vec![];
        for &rank in &ranks {
            let m = s.members.get(&rank).ok_or_else(|| {
                Status::not_found(format!("rank {rank}: not a member of the system"))
            })?;
            if !self.alive(rank) || m.state != EngineState::Ready {
                return Err(Status::failed_precondition(format!(
                    "rank {rank} is not ready ({})",
                    props::member_state_word(self.member_state(m))
                )));
            }
            // Refused at join; a state written before may still hold one.
            targets.push(check_targets(rank, m.targets).map_err(|e| {
                Status::failed_precondition(format!(
                    "pool {:?}: {}: it cannot hold a pool",
                    r.label,
                    e.message()
                ))
            })?);
        }
        let (scm, nvme) = if r.total_size > 0 {
            if r.scm_size > 0 || r.nvme_size > 0 {
                return Err(Status::invalid_argument(
                    "give either total_size or scm_size/nvme_size, not both",
                ));
            }
            let ratio = if r.tier_ratio == 0.0 {
                DEFAULT_TIER_RATIO
            } else {
                r.tier_ratio
            };
            if !(ratio > 0.0 && ratio < 1.0) {
                return Err(Status::invalid_argument(format!(
                    "tier_ratio {ratio}: must be between 0 and 1"
                )));
            }
            let scm = (r.total_size as f64 * ratio) as u64;
            (scm, r.total_size - scm)
        } else {
            (r.scm_size, r.nvme_size)
        };
        let ntargets: u64 = targets.iter().map(|&t| t as u64).sum::<u64>().max(1);
        let (scm_pt, nvme_pt) = (scm / ntargets, nvme / ntargets);
        if scm_pt < (1 << 20) || nvme_pt < (1 << 20) {
            return Err(Status::invalid_argument(format!(
                "pool {:?}: size too small (scm {scm} B, nvme {nvme} B over {ntargets} targets; need at least 1 MiB per target per tier)",
                r.label
            )));
        }
        let uuid = Uuid::new_v4();
        let mut done = vec![];
        for &rank in &ranks {
            let addr = MgmtService::member_addr(&s, rank)?;
            let res = async {
                let mut c = engine_client(&addr).await?;
                c.pool_shard_create(PoolShardCreateReq {
                    pool_uuid: uuid.to_string(),
                    scm_per_target: scm_pt,
                    nvme_per_target: nvme_pt,
                    access: Some(pool_access.clone()),
                })
                .await
                .map(|_| ())
            }
            .await;
            if let Err(e) = res {
                for &d in &done {
                    if let Ok(addr) = MgmtService::member_addr(&s, d) {
                        if let Ok(mut c) = engine_client(&addr).await {
                            let _ = c
                                .pool_shard_destroy(PoolShardDestroyReq {
                                    pool_uuid: uuid.to_string(),
                                })
                                .await;
                        }
                    }
                }
                return Err(Status::new(
                    e.code(),
                    format!("rank {rank}: {}", e.message()),
                ));
            }
            done.push(rank);
        }
        let mut props = r.props.into_iter().collect();
        access::normalize_props(&mut props, r.cred.as_ref());
        let rec = PoolRec {
            uuid,
            label: r.label.clone(),
            ranks,
            targets,
            scm_per_target: scm_pt,
            nvme_per_target: nvme_pt,
            props,
            map_version: 1,
            conts: BTreeMap::new(),
            access: pool_access,
        };
        s.pools.insert(uuid, rec.clone());
        self.persist(&s)?;
        tracing::info!("created pool {} ({uuid})", rec.label);
        Ok(Response::new(self.pool_info(&s, &rec).await))
    }

    async fn pool_list(&self, _: Request<PoolListReq>) -> Result<Response<PoolListResp>, Status> {
        let s = self.state.lock().await;
        let mut pools = vec![];
        for p in s.pools.values() {
            pools.push(self.pool_info(&s, p).await);
        }
        Ok(Response::new(PoolListResp { pools }))
    }

    async fn pool_query(&self, req: Request<PoolQueryReq>) -> Result<Response<PoolInfo>, Status> {
        let s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &req.into_inner().id)?;
        Ok(Response::new(self.pool_info(&s, p).await))
    }

    async fn pool_destroy(&self, req: Request<PoolDestroyReq>) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        let mut s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &r.id)?.clone();
        if !p.conts.is_empty() && !r.force {
            let names: Vec<&str> = p.conts.values().map(|c| c.label.as_str()).collect();
            return Err(Status::failed_precondition(format!(
                "pool {:?} still has {} container(s) ({}); destroy them or use --force",
                p.label,
                names.len(),
                names.join(", ")
            )));
        }
        let id = p.uuid.to_string();
        self.on_ranks(&s, &p.ranks, r.force, |mut c| {
            let req = PoolShardDestroyReq {
                pool_uuid: id.clone(),
            };
            async move { c.pool_shard_destroy(req).await.map(|_| ()) }
        })
        .await?;
        s.pools.remove(&p.uuid);
        s.pool_out.remove(&p.uuid);
        self.persist(&s)?;
        tracing::info!("destroyed pool {} ({})", p.label, p.uuid);
        Ok(Response::new(Empty {}))
    }

    async fn pool_set_prop(
        &self,
        req: Request<PoolSetPropReq>,
    ) -> Result<Response<PoolInfo>, Status> {
        let r = req.into_inner();
        validate_pool_props(&r.props)?;
        access::validate_props("pool", &r.props)?;
        let mut s = self.state.lock().await;
        let uuid = MgmtService::find_pool(&s, &r.id)?.uuid;
        let p = s.pools.get_mut(&uuid).unwrap();
        p.props.extend(r.props);
        access::normalize_props(&mut p.props, None);
        let p = p.clone();
        self.persist(&s)?;
        Ok(Response::new(self.pool_info(&s, &p).await))
    }

    async fn pool_connect(
        &self,
        req: Request<PoolConnectReq>,
    ) -> Result<Response<PoolMap>, Status> {
        let who = access::Requester::of(req.extensions(), req.get_ref().cred.clone())?;
        let s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &req.into_inner().id)?;
        let handle = access::pool_handle(p, &who)?;
        let mut targets = vec![];
        for (i, &rank) in p.ranks.iter().enumerate() {
            let m = s.members.get(&rank);
            // A target that stopped answering stays in (writes wait for it)
            // until the pool watch excludes it: see `pool_map`.
            let state = pool_map::target_state(&s, &p.uuid, rank);
            for index in 0..p.targets.get(i).copied().unwrap_or(1) {
                targets.push(PoolTarget {
                    rank,
                    index,
                    data_addr: m.map(|m| m.data_addr.clone()).unwrap_or_default(),
                    fault_domain: m.map(|m| m.fault_domain.clone()).unwrap_or_default(),
                    up: matches!(state, TargetState::TargetUpIn | TargetState::TargetUp),
                    shm_path: m.map(|m| m.shm_path.clone()).unwrap_or_default(),
                    state: state.into(),
                });
            }
        }
        Ok(Response::new(PoolMap {
            uuid: p.uuid.to_string(),
            label: p.label.clone(),
            version: p.map_version,
            targets,
            handle,
        }))
    }

    async fn pool_evict(&self, req: Request<PoolEvictReq>) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        let mut s = self.state.lock().await;
        let uuid = MgmtService::find_pool(&s, &r.id)?.uuid;
        let p = s.pools.get_mut(&uuid).unwrap();
        let done = access::evict(&mut p.access, &r.handle)?;
        let p = p.clone();
        self.persist(&s)?;
        // Engines that miss the push learn it at their next heartbeat,
        // before they serve again if they were away.
        if let Err(e) = self.push_pool_map(&s, &p).await {
            tracing::warn!("pool {}: eviction not pushed everywhere yet: {e}", p.label);
        }
        tracing::info!("pool {} ({uuid}): {done}", p.label);
        Ok(Response::new(Empty {}))
    }

    async fn cont_create(&self, req: Request<ContCreateReq>) -> Result<Response<ContInfo>, Status> {
        let r = req.into_inner();
        if !r.clone_from.is_empty() {
            return self.cont_clone(r).await.map(Response::new);
        }
        validate_label("container", &r.label)?;
        let mut s = self.state.lock().await;
        let puuid = MgmtService::find_pool(&s, &r.pool)?.uuid;
        let pool = &s.pools[&puuid];
        if let Some(c) = pool.conts.values().find(|c| c.label == r.label) {
            return Err(Status::already_exists(format!(
                "container {:?} already exists in pool {:?} ({})",
                r.label, pool.label, c.uuid
            )));
        }
        let mut rec = cont_record(&r, pool, pool.ranks.len())?;
        access::normalize_props(&mut rec.props, r.cred.as_ref());
        let pool = s.pools.get_mut(&puuid).unwrap();
        pool.conts.insert(rec.uuid, rec.clone());
        let info = self.cont_info(pool, &rec, 0);
        self.persist(&s)?;
        if quota::limit(&rec).is_some() {
            let v = self.quota_changed();
            self.push_quotas(&s, &s.pools[&puuid], &[&rec], v).await;
        }
        tracing::info!(
            "created container {} ({}) in pool {puuid}",
            rec.label,
            rec.uuid
        );
        Ok(Response::new(info))
    }

    async fn cont_list(&self, req: Request<ContListReq>) -> Result<Response<ContListResp>, Status> {
        let s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &req.into_inner().pool)?;
        let (_, used, _) = self.pool_space(&s, p).await;
        let containers = p
            .conts
            .values()
            .map(|c| self.cont_info(p, c, used.get(&c.uuid).copied().unwrap_or(0)))
            .collect();
        Ok(Response::new(ContListResp { containers }))
    }

    async fn cont_query(&self, req: Request<ContQueryReq>) -> Result<Response<ContInfo>, Status> {
        let who = access::Requester::of(req.extensions(), req.get_ref().cred.clone())?;
        let r = req.into_inner();
        let s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &r.pool)?;
        let c = MgmtService::find_cont(p, &r.id)?;
        let handle = access::cont_handle(p, &c.uuid, &who, r.read_only)?;
        let (_, used, _) = self.pool_space(&s, p).await;
        Ok(Response::new(ContInfo {
            handle,
            ..self.cont_info(p, c, used.get(&c.uuid).copied().unwrap_or(0))
        }))
    }

    async fn cont_destroy(&self, req: Request<ContDestroyReq>) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        let mut s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &r.pool)?.clone();
        let c = MgmtService::find_cont(&p, &r.id)?.clone();
        if self.cloning.lock().contains(&c.uuid) {
            return Err(Status::unavailable(format!(
                "container {:?} is being filled as a clone; destroy it once the copy ends",
                c.label
            )));
        }
        self.drop_cont(&mut s, &p, &c, r.force).await?;
        Ok(Response::new(Empty {}))
    }

    async fn cont_set_prop(
        &self,
        req: Request<ContSetPropReq>,
    ) -> Result<Response<ContInfo>, Status> {
        let r = req.into_inner();
        access::validate_props("container", &r.props)?;
        let mut s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &r.pool)?.clone();
        let mut c = MgmtService::find_cont(&p, &r.id)?.clone();
        for (k, v) in &r.props {
            match k.as_str() {
                "checksum" => {
                    c.checksum = props::parse_checksum(v).ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "checksum {:?}: must be crc32c or off",
                            v.to_ascii_lowercase()
                        ))
                    })?;
                }
                "sync" => {
                    c.props.insert(k.clone(), sync_mode(v)?);
                }
                "quota" => match quota::parse(v)? {
                    Some(q) => {
                        c.props.insert(k.clone(), q);
                    }
                    None => {
                        c.props.remove(k);
                    }
                },
                "oclass" | "dir_oclass" => {
                    let class = v
                        .parse::<ObjectClass>()
                        .map_err(|e| Status::invalid_argument(format!("{k}: {e}")))?;
                    if class.group_size() as usize > p.ranks.len() {
                        return Err(Status::invalid_argument(format!(
                            "{k}: object class {class} needs {} engines, pool has {}",
                            class.group_size(),
                            p.ranks.len()
                        )));
                    }
                    if k == "oclass" {
                        c.oclass = class.name().into();
                    } else {
                        c.dir_oclass = class.name().into();
                    }
                }
                "label" => {
                    validate_label("container", v)?;
                    if p.conts.values().any(|o| o.label == *v && o.uuid != c.uuid) {
                        return Err(Status::already_exists(format!(
                            "container {v:?} already exists in pool {:?}",
                            p.label
                        )));
                    }
                    c.label = v.clone();
                }
                "rf" | "chunk_size" | "type" => {
                    return Err(Status::invalid_argument(format!(
                        "container property {k} cannot change after creation"
                    )));
                }
                _ if k.starts_with("user.") || ["acl", "owner", "group"].contains(&k.as_str()) => {
                    c.props.insert(k.clone(), v.clone());
                }
                _ => {
                    return Err(Status::invalid_argument(format!(
                        "container property {k:?}: unknown (settable: {}, or user.*)",
                        CONT_PROPS.join(", ")
                    )))
                }
            }
        }
        access::normalize_props(&mut c.props, None);
        s.pools
            .get_mut(&p.uuid)
            .unwrap()
            .conts
            .insert(c.uuid, c.clone());
        self.persist(&s)?;
        if r.props.contains_key("quota") {
            let v = self.quota_changed();
            self.push_quotas(&s, &p, &[&c], v).await;
        }
        let (_, used, _) = self.pool_space(&s, &p).await;
        let used = used.get(&c.uuid).copied().unwrap_or(0);
        Ok(Response::new(self.cont_info(&p, &c, used)))
    }

    async fn snap_create(&self, req: Request<SnapCreateReq>) -> Result<Response<Snapshot>, Status> {
        let r = req.into_inner();
        let mut s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &r.pool)?.clone();
        let mut c = MgmtService::find_cont(&p, &r.cont)?.clone();
        if !r.name.is_empty() && c.snapshots.iter().any(|x| x.name == r.name) {
            return Err(Status::already_exists(format!(
                "snapshot {:?} already exists in container {:?}",
                r.name, c.label
            )));
        }
        // Engines must keep the epoch before the snapshot is reported taken.
        // A target that aggregated past the epoch meanwhile (it only learns
        // of the snapshot now) refuses it: then a newer epoch is tried.
        let before = c.snapshots.clone();
        let mut attempt = 1;
        let snap = loop {
            let snap = SnapRec {
                epoch: epoch_now(),
                name: r.name.clone(),
                created_unix: now_unix(),
            };
            c.snapshots = before.clone();
            c.snapshots.push(snap.clone());
            match self.push_snapshots(&s, &p, &c, Some(snap.epoch)).await {
                Ok(()) => break snap,
                Err(e) if e.code() == tonic::Code::Aborted && attempt < SNAP_ATTEMPTS => {
                    tracing::info!(
                        "snapshot of container {}: {}; retrying",
                        c.label,
                        e.message()
                    );
                    attempt += 1;
                }
                Err(e) => {
                    // Targets that took the new list keep an epoch nobody reads: harmless, but put back.
                    c.snapshots = before;
                    let _ = self.push_snapshots(&s, &p, &c, None).await;
                    return Err(e);
                }
            }
        };
        s.pools.get_mut(&p.uuid).unwrap().conts.insert(c.uuid, c);
        self.persist(&s)?;
        Ok(Response::new((&snap).into()))
    }

    async fn snap_list(&self, req: Request<SnapListReq>) -> Result<Response<SnapListResp>, Status> {
        let r = req.into_inner();
        let s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &r.pool)?;
        let c = MgmtService::find_cont(p, &r.cont)?;
        Ok(Response::new(SnapListResp {
            snapshots: c.snapshots.iter().map(Snapshot::from).collect(),
        }))
    }

    async fn snap_destroy(&self, req: Request<SnapDestroyReq>) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        let mut s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &r.pool)?.clone();
        let mut c = MgmtService::find_cont(&p, &r.cont)?.clone();
        let before = c.snapshots.len();
        c.snapshots.retain(|x| {
            !((r.epoch != 0 && x.epoch == r.epoch) || (!r.name.is_empty() && x.name == r.name))
        });
        if c.snapshots.len() == before {
            return Err(Status::not_found(format!(
                "container {:?}: no snapshot {}",
                c.label,
                if r.name.is_empty() {
                    format!("at epoch {}", r.epoch)
                } else {
                    format!("named {:?}", r.name)
                }
            )));
        }
        s.pools
            .get_mut(&p.uuid)
            .unwrap()
            .conts
            .insert(c.uuid, c.clone());
        self.persist(&s)?;
        // Aggregation may now reclaim what only the snapshot kept; a stopped engine learns it later.
        if let Err(e) = self.push_snapshots(&s, &p, &c, None).await {
            tracing::warn!(
                "snapshot list of container {} not pushed everywhere: {}",
                c.label,
                e.message()
            );
        }
        Ok(Response::new(Empty {}))
    }
}
