//! Containers made as clones of another's snapshot (`ContCreateReq.clone_from`).
//!
//! The new container's record is made first, marked as being filled
//! ([`STATE_PROP`]), then the client library copies the snapshot's
//! content into it (`peregrine::clone`) and the mark goes. A clone whose
//! copy fails is destroyed; one whose copy was cut short by a restart of
//! the service keeps its mark and reports [`ContState::ContCopyFailed`]:
//! whoever asked destroys it and asks again.

use super::props::{self, cont_record, validate_label};
use super::{ContRec, MgmtService, PoolRec};
use peregrine_proto::mgmt::{ContCreateReq, ContInfo, ContState};
use tonic::Status;

/// The record's property marking a clone being filled (hidden from ContInfo.props).
pub(super) const STATE_PROP: &str = "clone_state";

impl MgmtService {
    pub(super) fn cont_state(&self, c: &ContRec) -> ContState {
        if !c.props.contains_key(STATE_PROP) {
            ContState::ContReady
        } else if self.cloning.lock().contains(&c.uuid) {
            ContState::ContCopying
        } else {
            ContState::ContCopyFailed
        }
    }

    pub(super) async fn cont_clone(&self, mut r: ContCreateReq) -> Result<ContInfo, Status> {
        validate_label("container", &r.label)?;
        let (pool, rec) = {
            let mut s = self.state.lock().await;
            let pool = MgmtService::find_pool(&s, &r.pool)?.clone();
            if let Some(c) = pool.conts.values().find(|c| c.label == r.label) {
                return Err(Status::already_exists(format!(
                    "container {:?} already exists in pool {:?} ({})",
                    r.label, pool.label, c.uuid
                )));
            }
            let src = MgmtService::find_cont(&pool, &r.clone_from)?;
            if !src.snapshots.iter().any(|x| x.epoch == r.clone_epoch) {
                return Err(Status::not_found(format!(
                    "container {:?} has no snapshot of epoch {}",
                    src.label, r.clone_epoch
                )));
            }
            if self.cont_state(src) != ContState::ContReady {
                return Err(Status::failed_precondition(format!(
                    "container {:?} is itself an unfinished clone",
                    src.label
                )));
            }
            // What the request leaves out is the source's.
            let or = |v: &mut String, d: &str| {
                if v.is_empty() {
                    *v = d.to_string();
                }
            };
            or(&mut r.oclass, &src.oclass);
            or(&mut r.dir_oclass, &src.dir_oclass);
            or(&mut r.checksum, props::checksum_name(src.checksum));
            if r.chunk_size == 0 {
                r.chunk_size = src.chunk_size;
            }
            if r.redundancy_factor == 0 {
                r.redundancy_factor = src.rf;
            }
            for (k, v) in &src.props {
                if k != STATE_PROP && k != "quota" {
                    r.props.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            let mut rec = cont_record(&r, &pool, pool.ranks.len())?;
            rec.props.insert(STATE_PROP.into(), "copying".into());
            self.cloning.lock().insert(rec.uuid);
            let p = s.pools.get_mut(&pool.uuid).unwrap();
            p.conts.insert(rec.uuid, rec.clone());
            if let Err(e) = self.persist(&s) {
                self.cloning.lock().remove(&rec.uuid);
                return Err(e);
            }
            (pool, rec)
        };
        // The copy goes on if the caller gives up waiting (a CSI provisioner's
        // call times out and asks again: it then finds the clone copying).
        let me = self
            .this
            .upgrade()
            .ok_or_else(|| Status::unavailable("the management service is stopping"))?;
        tokio::spawn(async move { me.fill_clone(pool, r, rec).await })
            .await
            .map_err(|e| Status::internal(format!("clone task: {e}")))?
    }

    async fn fill_clone(
        &self,
        pool: PoolRec,
        r: ContCreateReq,
        rec: ContRec,
    ) -> Result<ContInfo, Status> {
        tracing::info!(
            "container {} ({}): cloning {} at epoch {}",
            rec.label,
            rec.uuid,
            r.clone_from,
            r.clone_epoch
        );
        let copied = self.copy_snapshot(&pool.uuid.to_string(), &r, &rec).await;
        let mut s = self.state.lock().await;
        // Readers of the state see the record and this set change together.
        self.cloning.lock().remove(&rec.uuid);
        let p = MgmtService::find_pool(&s, &pool.uuid.to_string())?.clone();
        let mut rec = MgmtService::find_cont(&p, &rec.uuid.to_string())?.clone();
        if let Err(e) = copied {
            tracing::warn!("container {}: clone failed: {e}", rec.label);
            self.drop_cont(&mut s, &p, &rec, true).await?;
            return Err(Status::internal(format!(
                "clone of container {:?} into {:?}: {e}",
                r.clone_from, rec.label
            )));
        }
        rec.props.remove(STATE_PROP);
        s.pools
            .get_mut(&p.uuid)
            .unwrap()
            .conts
            .insert(rec.uuid, rec.clone());
        self.persist(&s)?;
        if super::quota::limit(&rec).is_some() {
            let v = self.quota_changed();
            self.push_quotas(&s, &p, &[&rec], v).await;
        }
        let (_, used, _) = self.pool_space(&s, &p).await;
        Ok(self.cont_info(&p, &rec, used.get(&rec.uuid).copied().unwrap_or(0)))
    }

    /// Run the copy on a plain thread (the client library blocks and calls
    /// this service).
    async fn copy_snapshot(
        &self,
        pool: &str,
        r: &ContCreateReq,
        rec: &ContRec,
    ) -> Result<(), String> {
        let addr = self.node.cfg.control_addr();
        let security = self.node.cfg.security();
        let (pool, src, epoch, dst) = (
            pool.to_string(),
            r.clone_from.clone(),
            r.clone_epoch,
            rec.uuid.to_string(),
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("clone-{}", rec.label))
            .spawn(move || {
                let r = crate::tls::own_client(&addr, &security)
                    .and_then(|c| peregrine::clone::clone_container(&c, &pool, &src, epoch, &dst));
                let _ = tx.send(r);
            })
            .map_err(|e| format!("cannot start the copy: {e}"))?;
        let stats = rx
            .await
            .map_err(|_| "the copy thread died".to_string())?
            .map_err(|e| e.to_string())?;
        tracing::info!("container {}: clone copied {stats:?}", rec.label);
        Ok(())
    }
}
