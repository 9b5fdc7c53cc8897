//! [`Pool`]: a connected pool and its pool map.

use crate::client::Client;
use crate::container::Container;
use crate::error::{Error, Result};
use crate::placement::PoolMap;
use crate::sync::RwLock;
use peregrine_proto::mgmt::{self, ContQueryReq, PoolConnectReq};
use std::sync::Arc;
use uuid::Uuid;

struct PoolInner {
    client: Client,
    id: String,
    map: RwLock<Arc<PoolMap>>,
}

/// A connected pool. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

impl Pool {
    pub(crate) fn new(client: Client, id: &str, map: PoolMap) -> Pool {
        Pool {
            inner: Arc::new(PoolInner {
                client,
                id: id.to_string(),
                map: RwLock::new(Arc::new(map)),
            }),
        }
    }

    pub fn uuid(&self) -> Uuid {
        self.map().uuid
    }
    pub fn label(&self) -> String {
        self.map().label.clone()
    }
    pub fn client(&self) -> &Client {
        &self.inner.client
    }
    /// The current pool map.
    pub fn map(&self) -> Arc<PoolMap> {
        self.inner.map.read().clone()
    }

    /// Fetch the pool map again; keeps the newer of the two versions.
    pub fn refresh(&self) -> Result<Arc<PoolMap>> {
        let m = self.client().mgmt().pool_connect(PoolConnectReq {
            id: self.inner.id.clone(),
            ..Default::default()
        })?;
        let new = Arc::new(PoolMap::from_proto(m)?);
        self.client().learn_routes(&new);
        let mut cur = self.inner.map.write();
        if new.version >= cur.version {
            *cur = new;
        }
        Ok(cur.clone())
    }

    /// Open a container by label or UUID, for reading and (if its ACL
    /// grants this client's user that) writing.
    pub fn cont_open(&self, id: &str) -> Result<Container> {
        self.open(id, false)
    }

    /// Open a container for reading only: its handle allows no writes,
    /// whatever the ACL grants.
    pub fn cont_open_read_only(&self, id: &str) -> Result<Container> {
        self.open(id, true)
    }

    fn open(&self, id: &str, read_only: bool) -> Result<Container> {
        let info = self
            .client()
            .mgmt()
            .cont_query(ContQueryReq {
                pool: self.uuid().to_string(),
                id: id.into(),
                read_only,
                ..Default::default()
            })
            .map_err(|e| e.context(format!("container {id:?} of pool {:?}", self.map().name())))?;
        let uuid = Uuid::parse_str(&info.uuid).map_err(|e| {
            Error::new(
                -libc::EPROTO,
                format!("container {id:?}: bad uuid {:?}: {e}", info.uuid),
            )
        })?;
        let csum = match mgmt::Checksum::try_from(info.checksum) {
            Ok(mgmt::Checksum::Crc32c) => true,
            Ok(mgmt::Checksum::Off | mgmt::Checksum::Unspecified) => false,
            Err(_) => {
                let other = info.checksum;
                return Err(Error::new(
                    -libc::ENOTSUP,
                    format!("container {id:?}: unsupported checksum type {other:?}"),
                ));
            }
        };
        let sync_always = match info.props.get("sync").map(|v| v.to_ascii_lowercase()) {
            None => false,
            Some(v) if v == "standard" => false,
            Some(v) if v == "always" => true,
            Some(other) => {
                return Err(Error::new(
                    -libc::ENOTSUP,
                    format!("container {id:?}: unsupported sync mode {other:?}"),
                ))
            }
        };
        Ok(Container::new(self.clone(), info, uuid, csum, sync_always))
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.map();
        f.debug_struct("Pool")
            .field("label", &m.label)
            .field("uuid", &m.uuid)
            .field("map_version", &m.version)
            .finish()
    }
}
