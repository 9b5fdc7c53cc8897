//! The container and snapshot calls of the management service: create,
//! list, query, destroy, set-prop; snapshots create, list, destroy.

use super::props::{self, cont_record, props_map, sync_mode, validate_label, CONT_PROPS};
use super::HEARTBEAT_TIMEOUT;
use super::{access, clone, now_unix, quota, ContRec, MgmtService, MsState, PoolRec, SnapRec};
use peregrine_proto::mgmt::*;
use peregrine_proto::{epoch_now, ObjectClass};
use tonic::{Request, Response, Status};

/// Epochs a snapshot creation tries before giving up (each refusal means an
/// engine aggregated past the epoch between its choice and its arrival).
const SNAP_ATTEMPTS: u32 = 5;

impl MgmtService {
    pub(super) fn cont_info(&self, pool: &PoolRec, c: &ContRec, used: u64) -> ContInfo {
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
    pub(super) async fn drop_cont(
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

    pub(super) async fn cont_create(
        &self,
        req: Request<ContCreateReq>,
    ) -> Result<Response<ContInfo>, Status> {
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

    pub(super) async fn cont_list(
        &self,
        req: Request<ContListReq>,
    ) -> Result<Response<ContListResp>, Status> {
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

    pub(super) async fn cont_query(
        &self,
        req: Request<ContQueryReq>,
    ) -> Result<Response<ContInfo>, Status> {
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

    pub(super) async fn cont_destroy(
        &self,
        req: Request<ContDestroyReq>,
    ) -> Result<Response<Empty>, Status> {
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

    pub(super) async fn cont_set_prop(
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

    pub(super) async fn snap_create(
        &self,
        req: Request<SnapCreateReq>,
    ) -> Result<Response<Snapshot>, Status> {
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

    pub(super) async fn snap_list(
        &self,
        req: Request<SnapListReq>,
    ) -> Result<Response<SnapListResp>, Status> {
        let r = req.into_inner();
        let s = self.state.lock().await;
        let p = MgmtService::find_pool(&s, &r.pool)?;
        let c = MgmtService::find_cont(p, &r.cont)?;
        Ok(Response::new(SnapListResp {
            snapshots: c.snapshots.iter().map(Snapshot::from).collect(),
        }))
    }

    pub(super) async fn snap_destroy(
        &self,
        req: Request<SnapDestroyReq>,
    ) -> Result<Response<Empty>, Status> {
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
