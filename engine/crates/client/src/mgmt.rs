//! Blocking wrapper over the management gRPC client.
//!
//! The C ABI, the FUSE daemon and the CLI are synchronous, so the wrapper
//! owns a one-worker tokio runtime and blocks on each call. One worker (not
//! a current-thread runtime) keeps tonic's background connection task
//! running between calls and lets several threads call at once.

use crate::error::{Error, Result};
use crate::tls::Security;
use peregrine_proto::mgmt::mgmt_client::MgmtClient;
use peregrine_proto::mgmt::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Timeout for establishing the management connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of one management call (pool create formats shards, so generous).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Mgmt {
    via: Via,
    addr: String,
    /// The user pool connects, container opens and creations act for
    /// (filled into requests that name none); `None`: the certificate
    /// speaks for the caller (engines' own clients).
    credential: crate::sync::RwLock<Option<Credential>>,
}

/// A request that may name the user it acts for.
trait Credentialed {
    fn fill(&mut self, _cred: &Option<Credential>) {}
}

macro_rules! credentialed {
    (none: $($t:ty),*; cred: $($c:ty),*) => {
        $(impl Credentialed for $t {})*
        $(impl Credentialed for $c {
            fn fill(&mut self, cred: &Option<Credential>) {
                if self.cred.is_none() {
                    self.cred = cred.clone();
                }
            }
        })*
    };
}

credentialed! {
    none: SystemQueryReq, StorageScanReq, StorageFormatReq, PoolListReq, PoolQueryReq,
        PoolDestroyReq, PoolSetPropReq, PoolEvictReq, ContListReq, ContDestroyReq,
        ContSetPropReq, SnapCreateReq, SnapListReq, SnapDestroyReq;
    cred: PoolCreateReq, PoolConnectReq, ContCreateReq, ContQueryReq
}

enum Via {
    /// The management service's gRPC.
    Grpc(Box<Grpc>),
    /// Someone who holds the answers: the interception library asks the
    /// FUSE daemon (which has a certificate) instead of the control port.
    Source(Arc<dyn ControlSource>),
}

struct Grpc {
    rt: tokio::runtime::Runtime,
    client: MgmtClient<Channel>,
}

/// Answers management calls without the control port. `rpc` is the
/// method's name (`pool_connect`, `cont_query`, ...), `req` its request
/// (protobuf); the reply is the response (protobuf). A source answers the
/// calls it can and refuses the others (ENOTSUP naming the call).
pub trait ControlSource: Send + Sync {
    fn call(&self, rpc: &str, req: Vec<u8>) -> Result<Vec<u8>>;
}

/// gRPC status -> negative errno, keeping the server's message.
pub fn status_to_error(addr: &str, what: &str, s: tonic::Status) -> Error {
    use tonic::Code::*;
    let code = match s.code() {
        NotFound => libc::ENOENT,
        AlreadyExists => libc::EEXIST,
        InvalidArgument | OutOfRange => libc::EINVAL,
        FailedPrecondition => libc::EBUSY,
        ResourceExhausted => libc::ENOSPC,
        PermissionDenied | Unauthenticated => libc::EACCES,
        Unimplemented => libc::ENOSYS,
        DeadlineExceeded => libc::ETIMEDOUT,
        Unavailable => libc::EHOSTUNREACH,
        Cancelled | Aborted => libc::ECANCELED,
        _ => libc::EIO,
    };
    let msg = if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        s.message().to_string()
    };
    Error::new(-code, format!("management service {addr}: {what}: {msg}"))
}

macro_rules! rpcs {
    ($($(#[$m:meta])* $name:ident($req:ty) -> $resp:ty;)*) => {
        $(
            $(#[$m])*
            pub fn $name(&self, mut req: $req) -> Result<$resp> {
                req.fill(&self.credential.read());
                let (rt, mut c) = match &self.via {
                    Via::Grpc(g) => (&g.rt, g.client.clone()),
                    Via::Source(src) => {
                        let what = stringify!($name);
                        let b = src.call(what, prost::Message::encode_to_vec(&req))?;
                        return <$resp as prost::Message>::decode(&b[..]).map_err(|e| {
                            Error::new(-libc::EPROTO, format!("{}: {what}: bad reply: {e}", self.addr))
                        });
                    }
                };
                let fut = async move {
                    let mut r = tonic::Request::new(req);
                    r.set_timeout(CALL_TIMEOUT);
                    c.$name(r).await
                };
                rt
                    .block_on(fut)
                    .map(|r| r.into_inner())
                    .map_err(|s| status_to_error(&self.addr, stringify!($name), s))
            }
        )*
    };
}

impl Mgmt {
    /// Connect to the management service at `addr` ("host:port" or a URL)
    /// with `security` (mutual TLS with a certificate directory, or plain).
    pub fn connect(addr: &str, security: &Security) -> Result<Mgmt> {
        let connector = security.connector().map_err(|e| {
            Error::inval(format!("management service {addr}: control-plane TLS: {e}"))
        })?;
        // Its threads take no signals (signals.rs): those made now inherit
        // the mask; those made later (blocking tasks) set it first thing.
        let old = crate::signals::block_all();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("prg-mgmt")
            .on_thread_start(|| {
                crate::signals::block_all();
            })
            .enable_all()
            .build();
        crate::signals::restore(&old);
        let rt = rt.map_err(|e| Error::io(format!("cannot start the management runtime: {e}")))?;
        let url = if addr.contains("://") {
            addr.to_string()
        } else {
            format!("http://{addr}")
        };
        let ep = Endpoint::from_shared(url.clone())
            .map_err(|e| Error::inval(format!("management address {addr:?}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let chan = rt.block_on(async {
            match tokio::time::timeout(
                CONNECT_TIMEOUT + Duration::from_secs(1),
                connector.connect(ep),
            )
            .await
            {
                Ok(r) => r.map_err(|e| {
                    let mut src: &dyn std::error::Error = &e;
                    let mut msg = e.to_string();
                    while let Some(s) = src.source() {
                        msg = format!("{msg}: {s}");
                        src = s;
                    }
                    Error::new(
                        -libc::EHOSTUNREACH,
                        format!("management service {addr}: {msg}"),
                    )
                }),
                Err(_) => Err(Error::new(
                    -libc::ETIMEDOUT,
                    format!(
                        "management service {addr}: connect timed out after {CONNECT_TIMEOUT:?}"
                    ),
                )),
            }
        })?;
        Ok(Mgmt {
            via: Via::Grpc(Box::new(Grpc {
                rt,
                client: MgmtClient::new(chan),
            })),
            addr: addr.to_string(),
            credential: crate::sync::RwLock::new(Some(crate::credential::of_process())),
        })
    }

    /// Management calls answered by `source` (`name` says who, in messages).
    pub fn via(name: &str, source: Arc<dyn ControlSource>) -> Mgmt {
        Mgmt {
            via: Via::Source(source),
            addr: name.to_string(),
            // The source answers with its own handles: no user to name (and
            // no user database to read inside the interception library's
            // host program, whose open(2) the lookup would re-enter).
            credential: crate::sync::RwLock::new(None),
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Act for `cred` from now on (`None`: for no user, as an engine's or
    /// admin's own client, which its certificate authorizes).
    pub fn set_credential(&self, cred: Option<Credential>) {
        *self.credential.write() = cred;
    }

    rpcs! {
        system_query(SystemQueryReq) -> SystemQueryResp;
        storage_scan(StorageScanReq) -> StorageScanResp;
        storage_format(StorageFormatReq) -> StorageFormatResp;
        pool_create(PoolCreateReq) -> PoolInfo;
        pool_list(PoolListReq) -> PoolListResp;
        pool_query(PoolQueryReq) -> PoolInfo;
        pool_destroy(PoolDestroyReq) -> Empty;
        pool_set_prop(PoolSetPropReq) -> PoolInfo;
        /// The pool map (targets in placement order) of a pool.
        pool_connect(PoolConnectReq) -> PoolMap;
        /// End one handle of a pool, or all of them.
        pool_evict(PoolEvictReq) -> Empty;
        cont_create(ContCreateReq) -> ContInfo;
        cont_list(ContListReq) -> ContListResp;
        cont_query(ContQueryReq) -> ContInfo;
        cont_destroy(ContDestroyReq) -> Empty;
        cont_set_prop(ContSetPropReq) -> ContInfo;
        snap_create(SnapCreateReq) -> Snapshot;
        snap_list(SnapListReq) -> SnapListResp;
        snap_destroy(SnapDestroyReq) -> Empty;
    }

    /// Convenience: query a pool by label or UUID.
    pub fn pool(&self, id: &str) -> Result<PoolInfo> {
        self.pool_query(PoolQueryReq { id: id.into() })
    }

    /// Convenience: create a container with default properties.
    pub fn cont_create_simple(
        &self,
        pool: &str,
        label: &str,
        oclass: &str,
        checksum: &str,
    ) -> Result<ContInfo> {
        self.cont_create(ContCreateReq {
            pool: pool.into(),
            label: label.into(),
            r#type: "POSIX".into(),
            oclass: oclass.into(),
            checksum: checksum.into(),
            props: HashMap::new(),
            ..Default::default()
        })
    }
}
