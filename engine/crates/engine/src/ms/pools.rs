//! The pool calls of the management service: create, list, query, destroy,
//! set-prop, connect, evict, and what a pool's ranks report of its space.

use super::props::{self, props_map, validate_label, validate_pool_props};
use super::{access, engine_client, pool_map, MgmtService, MsState, PoolRec};
use super::{check_targets, DEFAULT_TIER_RATIO};
use peregrine_proto::mgmt::*;
use peregrine_proto::ms::EngineState;
use std::collections::{BTreeMap, HashMap};
use tonic::{Request, Response, Status};
use uuid::Uuid;

impl MgmtService {
    /// What each rank of a pool reports of its shard (`None`: stopped or
    /// not answering), in the pool's rank order.
    pub(super) async fn shard_spaces(
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

    pub(super) async fn pool_space(
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

    pub(super) async fn pool_create(
        &self,
        req: Request<PoolCreateReq>,
    ) -> Result<Response<PoolInfo>, Status> {
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

    pub(super) async fn pool_list(
        &self,
        _: Request<PoolListReq>,
    ) -> Result<Response<PoolListResp>, Status> {
        let s = self.state.lock().await;
        let mut pools = vec![];
        for p in s.pools.values() {
            pools.push(self.pool_info(&s, p).await);
        }
        Ok(Response::new(PoolListResp { pools }))
    }

    pub(super) async fn pool_query(
        &self,
        req: Request<PoolQueryReq>,
    ) -> Result<Response<PoolInfo>, Status> {
        let s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &req.into_inner().id)?;
        Ok(Response::new(self.pool_info(&s, p).await))
    }

    pub(super) async fn pool_destroy(
        &self,
        req: Request<PoolDestroyReq>,
    ) -> Result<Response<Empty>, Status> {
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

    pub(super) async fn pool_set_prop(
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

    pub(super) async fn pool_connect(
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

    pub(super) async fn pool_evict(
        &self,
        req: Request<PoolEvictReq>,
    ) -> Result<Response<Empty>, Status> {
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
}
