//! [`Client`]: a connection to a Peregrine system (the management
//! service and the data-plane transport).

use crate::error::Result;
use crate::mgmt::Mgmt;
use crate::object::RETRY_WINDOW;
use crate::placement::PoolMap;
use crate::pool::Pool;
use crate::shm::{ShmConfig, ShmTransport};
use crate::tls::Security;
use crate::transport::{MultiTransport, TcpTransport, Transport, TransportKind};
use peregrine_proto::mgmt::PoolConnectReq;
use std::sync::Arc;

/// The data-plane transport of a [`Client`] made with `kind` and `shm`.
fn multi(kind: TransportKind, shm: ShmConfig) -> MultiTransport {
    MultiTransport::with(kind, TcpTransport::default(), ShmTransport::new(shm))
}

struct ClientInner {
    mgmt: Mgmt,
    transport: Arc<dyn Transport>,
    /// [`Client::set_retry_window`], in milliseconds.
    retry_window_ms: std::sync::atomic::AtomicU64,
    /// Tells shards of this process's committed transactions.
    committer: crate::dtx::Committer,
}

/// A connection to a Peregrine system: the management service plus the
/// data-plane transport. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl Client {
    /// Connect to the management service at `mgmt_addr` ("host:port") with
    /// `security` (the control plane's mutual TLS, docs/tls.md; the data
    /// plane is not affected). The data plane uses shared memory with
    /// engines on this node that offer it and TCP otherwise
    /// ([`TransportKind::Auto`]); the library reads no environment: a
    /// program that lets `PEREGRINE_TRANSPORT` choose passes
    /// [`TransportKind::from_env`] to [`Client::connect_with_transport`].
    pub fn connect(mgmt_addr: &str, security: &Security) -> Result<Client> {
        Self::connect_with_transport(mgmt_addr, security, TransportKind::Auto)
    }

    /// Like [`Client::connect`] with the transport chosen explicitly.
    pub fn connect_with_transport(
        mgmt_addr: &str,
        security: &Security,
        kind: TransportKind,
    ) -> Result<Client> {
        Self::connect_with_shm(mgmt_addr, security, kind, ShmConfig::default())
    }

    /// Like [`Client::connect_with_transport`] with the shared-memory
    /// transport's settings given: programs fill them from their
    /// environment ([`ShmConfig::with_vars`]); the library reads none.
    pub fn connect_with_shm(
        mgmt_addr: &str,
        security: &Security,
        kind: TransportKind,
        shm: ShmConfig,
    ) -> Result<Client> {
        Self::connect_with(mgmt_addr, security, Arc::new(multi(kind, shm)))
    }

    /// Like [`Client::connect`] with a chosen data-plane transport.
    pub fn connect_with(
        mgmt_addr: &str,
        security: &Security,
        transport: Arc<dyn Transport>,
    ) -> Result<Client> {
        Ok(Self::with_mgmt(
            Mgmt::connect(mgmt_addr, security)?,
            transport,
        ))
    }

    /// A client whose management calls `source` answers (see
    /// [`crate::mgmt::ControlSource`]): for processes without a certificate
    /// that are handed what they need by one that has one.
    pub fn connect_via(
        name: &str,
        source: Arc<dyn crate::mgmt::ControlSource>,
        kind: TransportKind,
    ) -> Client {
        Self::connect_via_with_shm(name, source, kind, ShmConfig::default())
    }

    /// Like [`Client::connect_via`] with the shared-memory transport's
    /// settings given (see [`Client::connect_with_shm`]).
    pub fn connect_via_with_shm(
        name: &str,
        source: Arc<dyn crate::mgmt::ControlSource>,
        kind: TransportKind,
        shm: ShmConfig,
    ) -> Client {
        Self::with_mgmt(Mgmt::via(name, source), Arc::new(multi(kind, shm)))
    }

    fn with_mgmt(mgmt: Mgmt, transport: Arc<dyn Transport>) -> Client {
        Client {
            inner: Arc::new(ClientInner {
                mgmt,
                committer: crate::dtx::Committer::start(transport.clone()),
                transport,
                retry_window_ms: (RETRY_WINDOW.as_millis() as u64).into(),
            }),
        }
    }

    /// How long an update waits for a shard that does not answer before it
    /// fails (default [`RETRY_WINDOW`]). Below the management service's
    /// failure detection (6 s) an update whose engine died fails (maybe
    /// applied on some shards) instead of going on degraded.
    pub fn set_retry_window(&self, window: std::time::Duration) {
        self.inner.retry_window_ms.store(
            window.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub(crate) fn retry_window(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.inner
                .retry_window_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The blocking management API, for admin calls.
    pub fn mgmt(&self) -> &Mgmt {
        &self.inner.mgmt
    }

    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.inner.transport
    }

    pub(crate) fn committer(&self) -> &crate::dtx::Committer {
        &self.inner.committer
    }

    /// Send the commits of the transactions acknowledged so far to their
    /// shards now and wait for them (done on drop too). A process that
    /// exits without dropping its client should call this first, or other
    /// readers of what it wrote last wait for the engines to settle it.
    pub fn flush_commits(&self) {
        self.inner.committer.flush();
    }

    /// Tell the transport which engines of a pool map offer shared memory.
    pub(crate) fn learn_routes(&self, map: &PoolMap) {
        for t in &map.targets {
            self.inner.transport.add_route(&t.addr, &t.shm_path);
        }
    }

    /// Connect to a pool by label or UUID: fetch its map.
    pub fn pool_connect(&self, id: &str) -> Result<Pool> {
        let m = self
            .mgmt()
            .pool_connect(PoolConnectReq {
                id: id.into(),
                ..Default::default()
            })
            .map_err(|e| e.context(format!("pool {id:?}")))?;
        let map = PoolMap::from_proto(m)?;
        self.learn_routes(&map);
        Ok(Pool::new(self.clone(), id, map))
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("mgmt", &self.mgmt().addr())
            .finish()
    }
}
