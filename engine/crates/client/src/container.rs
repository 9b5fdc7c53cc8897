//! [`Container`]: an open container, its properties and snapshots.

use crate::error::{Error, Result};
use crate::hlc;
use crate::object::{rs_codec, Object};
use crate::placement;
use crate::pool::Pool;
use peregrine_proto::mgmt::{ContInfo, SnapCreateReq};
use peregrine_proto::{ObjectId, Redundancy};
use std::sync::Arc;
use uuid::Uuid;

struct ContInner {
    pool: Pool,
    info: ContInfo,
    uuid: Uuid,
    csum: bool,
    sync_always: bool,
}

/// An open container. Cheap to clone.
#[derive(Clone)]
pub struct Container {
    inner: Arc<ContInner>,
}

impl Container {
    pub(crate) fn new(
        pool: Pool,
        info: ContInfo,
        uuid: Uuid,
        csum: bool,
        sync_always: bool,
    ) -> Container {
        Container {
            inner: Arc::new(ContInner {
                pool,
                info,
                uuid,
                csum,
                sync_always,
            }),
        }
    }

    pub fn uuid(&self) -> Uuid {
        self.inner.uuid
    }
    pub fn label(&self) -> &str {
        &self.inner.info.label
    }
    /// Properties as returned by ContQuery when the container was opened.
    pub fn info(&self) -> &ContInfo {
        &self.inner.info
    }
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }
    /// The handle the container was opened with, which every request on it
    /// carries (see `peregrine_proto::handle`).
    pub fn handle(&self) -> &[u8] {
        &self.inner.info.handle
    }
    /// Whether end-to-end CRC32C checksums are on.
    pub fn checksum(&self) -> bool {
        self.inner.csum
    }
    /// Whether every update is acknowledged only once it survives a power
    /// cut (property `sync=always`). Otherwise (`sync=standard`) an update
    /// is acknowledged once written (it survives the crash of any process)
    /// and [`Object::flush`] makes it survive a power cut, as fsync does.
    pub fn sync_always(&self) -> bool {
        self.inner.sync_always
    }

    /// Open object `oid`; its class comes from the id's top byte.
    pub fn object(&self, oid: ObjectId) -> Result<Object> {
        let class = oid
            .class()
            .map_err(|e| Error::inval(format!("object {oid}: {e}")))?;
        placement::check_class(class, &self.pool().map())?;
        let rs = match class.redundancy() {
            Redundancy::ErasureCode { data, parity } => {
                Some(rs_codec(data as usize, parity as usize))
            }
            _ => None,
        };
        Ok(Object {
            cont: self.clone(),
            oid,
            class,
            rs,
            layout: Arc::default(),
        })
    }

    /// Create a snapshot; returns its epoch (readable through [`Object::at`]).
    pub fn snapshot(&self, name: &str) -> Result<u64> {
        let s = self.pool().client().mgmt().snap_create(SnapCreateReq {
            pool: self.pool().uuid().to_string(),
            cont: self.uuid().to_string(),
            name: name.into(),
        })?;
        hlc::observe(s.epoch);
        Ok(s.epoch)
    }
}

impl std::fmt::Debug for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Container")
            .field("label", &self.label())
            .field("uuid", &self.uuid())
            .field("checksum", &self.checksum())
            .finish()
    }
}
