//! The `Engine` gRPC service: engine-local storage operations, called by the
//! management service.

use crate::node::Node;
use peregrine_proto::mgmt::engine_server::Engine;
use peregrine_proto::mgmt::*;
use std::sync::Arc;
use tonic::{Request, Response, Status};
use uuid::Uuid;

pub struct EngineService {
    pub node: Arc<Node>,
}

pub fn parse_uuid(field: &str, s: &str) -> Result<Uuid, Status> {
    Uuid::parse_str(s)
        .map_err(|_| Status::invalid_argument(format!("{field}: {s:?} is not a UUID")))
}

/// Map a storage error to a gRPC status by its errno.
pub fn storage_status(e: peregrine_vos::StorageError) -> Status {
    let msg = e.to_string();
    match -e.errno() {
        libc::ENOSPC => Status::resource_exhausted(msg),
        libc::ENOENT => Status::not_found(msg),
        libc::EEXIST => Status::already_exists(msg),
        libc::EINVAL => Status::invalid_argument(msg),
        libc::EBUSY => Status::failed_precondition(msg),
        libc::EAGAIN => Status::aborted(msg),
        _ => Status::internal(msg),
    }
}

/// Run blocking storage work off the async reactor.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("storage task failed: {e}")))?
}

#[tonic::async_trait]
impl Engine for EngineService {
    async fn local_scan(&self, _: Request<Empty>) -> Result<Response<RankStorage>, Status> {
        let node = self.node.clone();
        Ok(Response::new(blocking(move || Ok(node.scan())).await?))
    }

    async fn local_format(
        &self,
        req: Request<StorageFormatReq>,
    ) -> Result<Response<RankStorage>, Status> {
        let node = self.node.clone();
        let force = req.into_inner().force;
        Ok(Response::new(blocking(move || node.format(force)).await?))
    }

    async fn pool_shard_create(
        &self,
        req: Request<PoolShardCreateReq>,
    ) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        let pool = parse_uuid("pool_uuid", &r.pool_uuid)?;
        if let Some(a) = &r.access {
            self.node
                .pool_maps
                .access
                .install(pool, a)
                .map_err(Status::invalid_argument)?;
        }
        let st = self.node.storage()?;
        blocking(move || {
            st.pool_create(pool, r.scm_per_target, r.nvme_per_target)
                .map_err(storage_status)
        })
        .await?;
        Ok(Response::new(Empty {}))
    }

    async fn pool_shard_destroy(
        &self,
        req: Request<PoolShardDestroyReq>,
    ) -> Result<Response<Empty>, Status> {
        let pool = parse_uuid("pool_uuid", &req.into_inner().pool_uuid)?;
        let st = self.node.storage()?;
        blocking(move || st.pool_destroy(pool).map_err(storage_status)).await?;
        self.node.pool_maps.access.remove(&pool);
        Ok(Response::new(Empty {}))
    }

    async fn pool_shard_query(
        &self,
        req: Request<PoolShardQueryReq>,
    ) -> Result<Response<PoolShardSpace>, Status> {
        let pool = parse_uuid("pool_uuid", &req.into_inner().pool_uuid)?;
        let st = self.node.storage()?;
        let sp = blocking(move || st.pool_space(pool).map_err(storage_status)).await?;
        Ok(Response::new(PoolShardSpace {
            scm_total: sp.scm_total,
            scm_free: sp.scm_free,
            nvme_total: sp.nvme_total,
            nvme_free: sp.nvme_free,
            cont_used: sp
                .cont_used
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }))
    }

    async fn cont_shard_destroy(
        &self,
        req: Request<ContShardDestroyReq>,
    ) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        let pool = parse_uuid("pool_uuid", &r.pool_uuid)?;
        let cont = parse_uuid("cont_uuid", &r.cont_uuid)?;
        let st = self.node.storage()?;
        blocking(move || st.cont_destroy(pool, cont).map_err(storage_status)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn cont_shard_snapshots(
        &self,
        req: Request<ContShardSnapshotsReq>,
    ) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        let pool = parse_uuid("pool_uuid", &r.pool_uuid)?;
        let cont = parse_uuid("cont_uuid", &r.cont_uuid)?;
        let st = self.node.storage()?;
        blocking(move || {
            st.set_snapshots(pool, cont, r.epochs, (r.adding != 0).then_some(r.adding))
                .map_err(storage_status)
        })
        .await?;
        Ok(Response::new(Empty {}))
    }

    async fn cont_shard_quota(
        &self,
        req: Request<ContShardQuotaReq>,
    ) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        let pool = parse_uuid("pool_uuid", &r.pool_uuid)?;
        let quotas = r
            .quotas
            .into_iter()
            .map(|q| {
                let cont = parse_uuid("cont_uuid", &q.cont_uuid)?;
                Ok(peregrine_vos::QuotaPush {
                    cont,
                    limit: (q.limit != 0).then_some(q.limit),
                    elsewhere: q.used_elsewhere,
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let st = self.node.storage()?;
        let version = r.version;
        blocking(move || {
            st.set_quotas(pool, version, &quotas)
                .map_err(storage_status)
        })
        .await?;
        Ok(Response::new(Empty {}))
    }

    async fn aggregate(
        &self,
        req: Request<AggregateReq>,
    ) -> Result<Response<AggregateResp>, Status> {
        let pool = parse_uuid("pool_uuid", &req.into_inner().pool_uuid)?;
        let st = self.node.storage()?;
        let reclaimed = blocking(move || st.aggregate(pool).map_err(storage_status)).await?;
        Ok(Response::new(AggregateResp {
            reclaimed_bytes: reclaimed,
        }))
    }

    async fn pool_map_update(
        &self,
        req: Request<PoolMapVersion>,
    ) -> Result<Response<Empty>, Status> {
        let m = req.into_inner();
        let changed = self
            .node
            .pool_maps
            .install(&m)
            .map_err(Status::invalid_argument)?;
        if changed {
            tracing::info!(
                "pool {}: map version {}, this engine's targets {:?}",
                m.pool_uuid,
                m.version,
                TargetState::try_from(m.state).unwrap_or(TargetState::TargetUpIn)
            );
        }
        // Answer once what was admitted under the older version is applied.
        let node = self.node.clone();
        blocking(move || {
            node.drain_targets();
            Ok(())
        })
        .await?;
        Ok(Response::new(Empty {}))
    }
}
