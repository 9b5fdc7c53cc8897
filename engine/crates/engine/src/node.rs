//! One engine's runtime state: its storage (absent in maintenance mode) and
//! the engine-local operations the management service drives.

use crate::config::{BdevConfig, Config};
use crate::metrics::IoMetrics;
use crate::poolmap::PoolMaps;
use parking_lot::{Mutex, RwLock};
use peregrine_proto::mgmt::{RankStorage, StorageState};
use peregrine_vos::{BdevClass, BdevSpec, ScanState, Storage, StorageOptions, WalIo};
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;
use uuid::Uuid;

pub struct Node {
    pub cfg: Config,
    storage: RwLock<Option<Arc<Storage>>>,
    /// Engine identity: from the superblock once formatted.
    uuid: Mutex<Uuid>,
    /// Why the engine is in maintenance mode, when it is.
    maintenance_reason: Mutex<String>,
    /// Serializes format against open/close.
    format_lock: Mutex<()>,
    /// Wakes the heartbeat loop: storage just opened waits for an answered
    /// heartbeat before its targets aggregate on their own.
    pub heartbeat_now: tokio::sync::Notify,
    /// Pool map versions and this engine's target states: what it admits.
    pub pool_maps: Arc<PoolMaps>,
    /// Shutting down: no more heartbeats (the service was told it stops).
    pub stopping: std::sync::atomic::AtomicBool,
    /// The data path's counters (see [`crate::metrics`]).
    pub io: &'static IoMetrics,
}

impl Node {
    pub fn storage_options(cfg: &Config) -> StorageOptions {
        let bdev = match &cfg.bdev {
            BdevConfig::File { path, size } => BdevSpec {
                class: BdevClass::File,
                path: path.clone(),
                size: size.0,
            },
            BdevConfig::Kdev { device } => BdevSpec {
                class: BdevClass::Kdev,
                path: device.clone(),
                size: 0,
            },
        };
        StorageOptions {
            wal_io: cfg.wal_io.unwrap_or(WalIo::default_for(bdev.class)),
            bdev,
            scm_bytes: cfg.scm.size.0,
            targets: cfg.targets,
            hugepages: cfg.hugepages,
            flush_interval: Duration::from_millis(cfg.flush_interval_ms),
            poll: cfg.vos_poll(),
            read_spin: cfg.vos_read_spin(),
            scrub_rate: cfg.scrub_rate(),
            scm_value_max: cfg.scm_value_max(),
        }
    }

    /// Open the device if it is formatted for this system and rank;
    /// otherwise come up in maintenance mode with the reason recorded.
    pub fn start(cfg: Config) -> Result<Arc<Node>, String> {
        let node = Arc::new(Node {
            storage: RwLock::new(None),
            uuid: Mutex::new(Uuid::new_v4()),
            maintenance_reason: Mutex::new(String::new()),
            format_lock: Mutex::new(()),
            heartbeat_now: tokio::sync::Notify::new(),
            pool_maps: Arc::new(PoolMaps::new(crate::access::Access::new(
                cfg.access_checks(),
            ))),
            stopping: Default::default(),
            io: IoMetrics::leak(cfg.targets),
            cfg,
        });
        let opts = Self::storage_options(&node.cfg);
        match peregrine_vos::scan(&opts.bdev)
            .map_err(|e| format!("bdev {}: {e}", opts.bdev.path.display()))?
        {
            ScanState::Unformatted => node.enter_maintenance(
                "device is not formatted; run `peregrine storage format`".into(),
            ),
            ScanState::Foreign(what) => node.enter_maintenance(format!(
                "device {} carries another signature ({what}); format it with --force to overwrite",
                opts.bdev.path.display()
            )),
            ScanState::Formatted(sb) => {
                if sb.system != node.cfg.name || sb.rank != node.cfg.rank {
                    node.enter_maintenance(format!(
                        "device was formatted for system {:?} rank {}, this engine is system {:?} rank {}; format with --force to reuse it",
                        sb.system, sb.rank, node.cfg.name, node.cfg.rank
                    ));
                } else {
                    let storage = Storage::open(&opts).map_err(|e| format!("open storage: {e}"))?;
                    *node.uuid.lock() = storage.superblock().engine_uuid;
                    *node.storage.write() = Some(held(storage));
                }
            }
        }
        Ok(node)
    }

    fn enter_maintenance(&self, reason: String) {
        tracing::warn!("rank {} in maintenance mode: {reason}", self.cfg.rank);
        *self.maintenance_reason.lock() = reason;
    }

    pub fn uuid(&self) -> Uuid {
        *self.uuid.lock()
    }

    pub fn is_ready(&self) -> bool {
        self.storage.read().is_some()
    }

    /// What this engine says of itself when it joins (`JoinReq.state`).
    pub fn state(&self) -> &'static str {
        if self.is_ready() {
            "ready"
        } else {
            "maintenance"
        }
    }

    /// The open storage, or an error saying why I/O is refused.
    pub fn storage(&self) -> Result<Arc<Storage>, Status> {
        self.storage.read().clone().ok_or_else(|| {
            Status::unavailable(format!(
                "rank {} is in maintenance mode: {}",
                self.cfg.rank,
                self.maintenance_reason.lock()
            ))
        })
    }

    pub fn scan(&self) -> RankStorage {
        let opts = Self::storage_options(&self.cfg);
        let mut rs = RankStorage {
            rank: self.cfg.rank,
            bdev_class: match opts.bdev.class {
                BdevClass::File => "file".into(),
                BdevClass::Kdev => "kdev".into(),
            },
            bdev_path: opts.bdev.path.display().to_string(),
            bdev_bytes: opts.bdev.size,
            scm_bytes: opts.scm_bytes,
            engine_uuid: self.uuid().to_string(),
            state: if self.is_ready() {
                StorageState::Ready
            } else {
                StorageState::Maintenance
            }
            .into(),
            ..Default::default()
        };
        if let Some(st) = self.storage.read().clone() {
            let sb = st.superblock();
            let (nvme_total, nvme_free, _scm_total, scm_free) = st.device_space();
            rs.formatted = true;
            rs.system = sb.system.clone();
            rs.bdev_bytes = nvme_total;
            rs.nvme_free = nvme_free;
            rs.scm_free = scm_free;
            for t in st.target_stats() {
                rs.unflushed_records += t.seq - t.durable;
                rs.flushes += t.flushes;
            }
            let mut faults = st.faults();
            let scrubs = st.scrub_reports();
            rs.scrub_passes = scrubs.iter().map(|r| r.passes).min().unwrap_or(0);
            for r in scrubs {
                rs.scrub_bytes += r.bytes;
                rs.scrub_extents += r.extents;
                rs.scrub_damaged += r.damaged;
                rs.scrub_damage.extend(r.places);
            }
            if rs.scrub_damaged > 0 {
                faults.push(format!(
                    "scrub found {} damaged extent(s) (reads of them fail with a checksum error): {}",
                    rs.scrub_damaged,
                    rs.scrub_damage.first().map_or("", String::as_str)
                ));
            }
            rs.repairs = st.repairs().to_vec();
            if !faults.is_empty() {
                rs.state = StorageState::Degraded.into();
                rs.message = faults.join("; ");
            } else if !rs.repairs.is_empty() {
                rs.message = format!("repaired at open: {}", rs.repairs.join("; "));
            }
        } else {
            rs.message = self.maintenance_reason.lock().clone();
            if let Ok(ScanState::Formatted(sb)) = peregrine_vos::scan(&opts.bdev) {
                rs.formatted = true;
                rs.system = sb.system;
                rs.bdev_bytes = sb.device_bytes;
            }
        }
        rs
    }

    /// Format the device (refusing foreign or already formatted devices
    /// unless forced) and open it.
    pub fn format(&self, force: bool) -> Result<RankStorage, Status> {
        let _g = self.format_lock.lock();
        if self.is_ready() && !force {
            // Idempotent: a second `storage format` on a running system is not an error.
            return Ok(self.scan());
        }
        let opts = Self::storage_options(&self.cfg);
        if let Some(old) = self.storage.write().take() {
            match Arc::try_unwrap(old) {
                Ok(st) => st.close(),
                Err(still_used) => {
                    *self.storage.write() = Some(still_used);
                    return Err(Status::failed_precondition(format!(
                        "rank {}: storage is busy with I/O; stop clients before a forced format",
                        self.cfg.rank
                    )));
                }
            }
        }
        peregrine_vos::format(&opts, &self.cfg.name, self.cfg.rank, force).map_err(|e| {
            Status::failed_precondition(format!(
                "rank {}: format {}: {e}",
                self.cfg.rank,
                opts.bdev.path.display()
            ))
        })?;
        let storage = Storage::open(&opts).map_err(|e| {
            Status::internal(format!("rank {}: open after format: {e}", self.cfg.rank))
        })?;
        *self.uuid.lock() = storage.superblock().engine_uuid;
        *self.storage.write() = Some(held(storage));
        self.heartbeat_now.notify_one();
        self.maintenance_reason.lock().clear();
        tracing::info!(
            "rank {} formatted {} and ready",
            self.cfg.rank,
            opts.bdev.path.display()
        );
        println!("peregrine-engine: rank {} ready", self.cfg.rank);
        Ok(self.scan())
    }

    /// Wait until every request a target took before now is applied (a
    /// control call queues behind them on every target).
    /// Pool maps' aggregation caps go to the storage first: the drain
    /// orders them after any aggregation running.
    pub fn drain_targets(&self) {
        if let Some(st) = self.storage.read().clone() {
            for (pool, cap) in self.pool_maps.aggregation_caps() {
                st.cap_aggregation(pool, cap);
            }
            let _ = st.target_stats();
        }
    }

    pub fn shutdown(&self) {
        if let Some(st) = self.storage.write().take() {
            if let Ok(st) = Arc::try_unwrap(st) {
                st.close();
            }
        }
    }
}

/// Storage whose targets do not aggregate on their own until the management
/// service answers a heartbeat (see `peregrine_engine::ms::AGGREGATION_LEASE`).
fn held(storage: Storage) -> Arc<Storage> {
    storage.lease_aggregation(std::time::Instant::now());
    Arc::new(storage)
}
