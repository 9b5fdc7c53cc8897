//! Control operations of a target ([`Ctl`], sent by the engine through
//! [`crate::Storage`]): pools, containers, snapshots, quotas, aggregation
//! on demand, space and statistics. Each runs alone, after everything
//! queued before it ([`Target::drain`]), logged and applied at once.

use super::*;

pub(crate) enum Ctl {
    PoolCreate {
        pool: Uuid,
        scm: u64,
        nvme: u64,
    },
    PoolDestroy {
        pool: Uuid,
    },
    PoolSpace {
        pool: Uuid,
    },
    Pools,
    ContDestroy {
        pool: Uuid,
        cont: Uuid,
    },
    SetSnapshots {
        pool: Uuid,
        cont: Uuid,
        epochs: Vec<u64>,
        /// The epoch of a snapshot being created: refused if aggregation already passed it.
        adding: Option<u64>,
    },
    Aggregate {
        pool: Uuid,
    },
    DeviceSpace,
    Stats,
    /// The scrubber's report, after setting its rate (bytes/s) if given.
    Scrub(Option<u64>),
    /// A container's quota as this target enforces it (`None`: no quota).
    SetQuota {
        pool: Uuid,
        cont: Uuid,
        /// Orders the service's pushes: an older one arriving late is ignored.
        version: u64,
        quota: Option<ContQuota>,
    },
}

/// A container's space quota as one target sees it, in stored bytes
/// (replicas and parity included). The targets of one engine share what
/// each holds of the container ([`QuotaShare`]); what the other engines
/// hold comes from the management service, which measures every engine
/// once a second. An update that would take the container past `limit` is
/// refused with `EDQUOT`; between two measurements, writes on several
/// engines at once can pass the limit by what the other engines store in
/// that time, as a distributed quota without a per-write grant does.
#[derive(Clone, Debug)]
pub struct ContQuota {
    pub limit: u64,
    /// What the container holds on the other engines.
    pub elsewhere: u64,
    pub share: Arc<QuotaShare>,
}

/// What each target of an engine holds of one container (its slot is
/// raised before an update is admitted, so it is never below the truth
/// for long).
#[derive(Debug)]
pub struct QuotaShare {
    pub(crate) held: Vec<AtomicU64>,
}

impl QuotaShare {
    pub(crate) fn new(held: &[u64]) -> Self {
        QuotaShare {
            held: held.iter().map(|&b| AtomicU64::new(b)).collect(),
        }
    }
}

/// The quotas of containers this target enforces ([`Ctl::SetQuota`]).
#[derive(Default)]
pub(super) struct Quotas {
    /// Containers with a space quota: (pool, container).
    pub(super) limits: HashMap<(Uuid, Uuid), ContQuota>,
    /// The newest quota push applied per container (see [`Ctl::SetQuota`]).
    pub(super) versions: HashMap<(Uuid, Uuid), u64>,
}

pub(crate) enum CtlOut {
    Done,
    /// Pool created (true) or already there with the same sizes (false).
    Created(bool),
    Space(PoolSpace),
    Pools(Vec<Uuid>),
    Reclaimed(u64),
    /// nvme total, nvme unreserved, scm total, scm unreserved.
    Device([u64; 4]),
    Stats(crate::TargetStats),
    Scrub(ScrubReport),
}

impl Target {
    fn unreserved(&self) -> (u64, u64) {
        let nvme: u64 = self.index.pools.values().map(|p| p.nvme_total).sum();
        let scm: u64 = self.index.pools.values().map(|p| p.scm_total).sum();
        (
            self.sb.data_bytes.saturating_sub(nvme),
            self.scm_budget.saturating_sub(scm),
        )
    }

    fn pool_missing(&self, pool: &Uuid) -> StorageError {
        StorageError::NotFound(format!("pool {pool} not found on target {}", self.id))
    }

    pub(super) fn control(&mut self, c: Ctl) -> Result<CtlOut, StorageError> {
        if let Some(e) = &self.refused {
            if !matches!(c, Ctl::Stats | Ctl::Scrub(_)) {
                return Err(StorageError::Corrupt(e.msg.clone()));
            }
        }
        match c {
            Ctl::PoolCreate { pool, scm, nvme } => {
                if let Some(p) = self.index.pools.get(&pool) {
                    if p.scm_total == scm && p.nvme_total == nvme {
                        return Ok(CtlOut::Created(false));
                    }
                    return Err(StorageError::Exists(format!(
                        "pool {pool} already exists on target {} with scm {} / nvme {} bytes per target (asked {scm} / {nvme})",
                        self.id, p.scm_total, p.nvme_total
                    )));
                }
                let (nvme_free, scm_free) = self.unreserved();
                for (tier, need, free) in [("scm", scm, scm_free), ("nvme", nvme, nvme_free)] {
                    if need > free {
                        return Err(StorageError::NoSpace {
                            pool: pool.to_string(),
                            tier,
                            target: self.id,
                            need,
                            free,
                        });
                    }
                }
                self.commit_ctl(WalOp::PoolCreate { pool, scm, nvme })?;
                Ok(CtlOut::Created(true))
            }
            Ctl::PoolDestroy { pool } => {
                if self.index.pools.contains_key(&pool) {
                    self.commit_ctl(WalOp::PoolDestroy { pool })?;
                    self.dirty.remove(&pool);
                    self.removed.remove(&pool);
                    self.fruitless.remove(&pool);
                }
                Ok(CtlOut::Done)
            }
            Ctl::PoolSpace { pool } => {
                let p = self
                    .index
                    .pools
                    .get(&pool)
                    .ok_or_else(|| self.pool_missing(&pool))?;
                // Changes held by transactions take their space until decided.
                let (hs, hn) = self.index.dtx.held_space(&pool);
                Ok(CtlOut::Space(PoolSpace {
                    scm_total: p.scm_total,
                    scm_free: p.scm_total.saturating_sub(p.scm_used() + hs),
                    nvme_total: p.nvme_total,
                    nvme_free: p.nvme_total.saturating_sub(p.nvme_used() + hn),
                    cont_used: p
                        .conts
                        .iter()
                        .map(|(k, c)| (*k, c.scm_used + c.nvme_used))
                        .collect(),
                }))
            }
            Ctl::Pools => Ok(CtlOut::Pools(self.index.pools.keys().copied().collect())),
            Ctl::ContDestroy { pool, cont } => {
                let p = self
                    .index
                    .pools
                    .get(&pool)
                    .ok_or_else(|| self.pool_missing(&pool))?;
                if p.conts.contains_key(&cont) || self.index.dtx.holds_cont(&pool, &cont) {
                    self.commit_ctl(WalOp::ContDestroy { pool, cont })?;
                }
                Ok(CtlOut::Done)
            }
            Ctl::SetSnapshots {
                pool,
                cont,
                epochs,
                adding,
            } => {
                let Some(p) = self.index.pools.get(&pool) else {
                    return Err(self.pool_missing(&pool));
                };
                let known = p.conts.get(&cont).map_or(&[][..], |c| &c.snapshots[..]);
                let to = self.index.aggregated_to;
                if let Some(e) = adding.filter(|e| *e <= to && !known.contains(e)) {
                    return Err(StorageError::Retry(format!(
                        "snapshot of container {cont} at epoch {e}: target {} already aggregated pool {pool} up to epoch {to}, past it; take the snapshot at a newer epoch",
                        self.id
                    )));
                }
                if let Some(e) = epochs.iter().find(|e| **e <= to && !known.contains(e)) {
                    // A list re-sent (to an engine that was away): keep what is left.
                    tracing::warn!(target = self.id, %pool, %cont, epoch = e, aggregated_to = to, "snapshot learnt after an aggregation past its epoch; versions only it would read may be gone");
                }
                self.commit_ctl(WalOp::SetSnapshots { pool, cont, epochs })?;
                self.dirty.insert(pool);
                Ok(CtlOut::Done)
            }
            Ctl::Aggregate { pool } => {
                if !self.index.pools.contains_key(&pool) {
                    return Err(self.pool_missing(&pool));
                }
                let rel = self.aggregate(pool)?;
                self.dirty.remove(&pool);
                self.removed.remove(&pool);
                Ok(CtlOut::Reclaimed(rel.scm + rel.nvme))
            }
            Ctl::DeviceSpace => {
                let (nvme_free, scm_free) = self.unreserved();
                Ok(CtlOut::Device([
                    self.sb.data_bytes,
                    nvme_free,
                    self.scm_budget,
                    scm_free,
                ]))
            }
            Ctl::SetQuota {
                pool,
                cont,
                version,
                quota,
            } => {
                let newest = self.quota.versions.entry((pool, cont)).or_insert(0);
                if version < *newest {
                    return Ok(CtlOut::Done);
                }
                *newest = version;
                match quota {
                    Some(q) => self.quota.limits.insert((pool, cont), q),
                    None => self.quota.limits.remove(&(pool, cont)),
                };
                // A container near its quota gets back what its overwrites
                // and removals freed now, on every engine: what one engine
                // has yet to reclaim counts against writers on the others
                // until the service measures again.
                let near = |q: &ContQuota| q.limit / 8;
                let near = self.quota.limits.get(&(pool, cont)).map_or(0, near);
                if self.over_quota(&pool, &cont, near.max(1)) {
                    self.aggregate_for_room(pool, "quota reached");
                }
                Ok(CtlOut::Done)
            }
            Ctl::Scrub(rate) => {
                if let Some(r) = rate {
                    self.scrub.set_rate(r);
                }
                Ok(CtlOut::Scrub(self.scrub.report.clone()))
            }
            Ctl::Stats => Ok(CtlOut::Stats(crate::TargetStats {
                seq: self.wal.seq,
                durable: self.flush.durable,
                flushes: self.prof.flushes,
                wal_tail: self.wal.tail,
                checkpoints: self.wal.checkpoints,
                free_blocks: self.alloc.free_blocks(),
            })),
        }
    }
}
