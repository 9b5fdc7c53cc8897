//! Who may call what on the control plane: the role in the caller's
//! certificate (docs/tls.md keeps the same table). `admin` may call
//! everything; `engine` what the management service and the ranks call on
//! each other, plus what the client library inside an engine calls (DTX
//! resolution, container clones, reintegration); `client` what mounting
//! and I/O need (the client library, the FUSE daemon, the CSI node
//! plugin's probe). Anything not in the table is `admin` only.
//!
//! [`Authorized`] wraps each gRPC service: it reads the identity of the
//! connection's verified certificate, refuses a call the role may not
//! make (PermissionDenied naming the call and the role) and hands the
//! identity to the handler ([`Caller`]), which the Join handler checks
//! against the rank and system it claims ([`check_join`]).

use peregrine::tls::{Identity, Role};
use peregrine_proto::mgmt::JoinReq;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

const MGMT: &str = "/peregrine.mgmt.v1.Mgmt/";
const ENGINE: &str = "/peregrine.mgmt.v1.Engine/";

/// The calls each role other than `admin` may make: (service path prefix,
/// method, roles).
pub const TABLE: &[(&str, &str, &[Role])] = &[
    // What any caller that mounts or does I/O asks.
    (MGMT, "SystemQuery", &[Role::Engine, Role::Client]),
    (MGMT, "PoolConnect", &[Role::Engine, Role::Client]),
    (MGMT, "PoolQuery", &[Role::Engine, Role::Client]),
    (MGMT, "ContQuery", &[Role::Engine, Role::Client]),
    // An engine registering and heartbeating (its own rank only).
    (MGMT, "Join", &[Role::Engine]),
    // The management service driving the ranks.
    (ENGINE, "LocalScan", &[Role::Engine]),
    (ENGINE, "LocalFormat", &[Role::Engine]),
    (ENGINE, "PoolShardCreate", &[Role::Engine]),
    (ENGINE, "PoolShardDestroy", &[Role::Engine]),
    (ENGINE, "PoolShardQuery", &[Role::Engine]),
    (ENGINE, "ContShardDestroy", &[Role::Engine]),
    (ENGINE, "ContShardSnapshots", &[Role::Engine]),
    (ENGINE, "ContShardQuota", &[Role::Engine]),
    (ENGINE, "Aggregate", &[Role::Engine]),
    (ENGINE, "PoolMapUpdate", &[Role::Engine]),
];

/// Whether `role` may call the gRPC method at `path`.
pub fn allowed(role: Role, path: &str) -> bool {
    role == Role::Admin
        || TABLE.iter().any(|(svc, method, roles)| {
            path.strip_prefix(svc) == Some(*method) && roles.contains(&role)
        })
}

/// The method name of a gRPC path, for messages.
fn method(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The caller of a request, in its extensions. `None` on an insecure engine.
#[derive(Clone, Debug)]
pub struct Caller(pub Option<Identity>);

/// What [`Authorized`] checks against.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Whether the control plane runs TLS (else everyone may do anything).
    pub tls: bool,
    /// This engine's system: an engine certificate of another is refused.
    pub system: String,
}

/// The identity of the verified client certificate of a request, or the
/// refusal (also used by tests that build a request by hand).
pub fn caller_of<B>(req: &http::Request<B>, policy: &Policy) -> Result<Caller, Status> {
    if !policy.tls {
        return Ok(Caller(None));
    }
    let path = req.uri().path();
    let certs = req
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.peer_certs());
    let Some(leaf) = certs.as_deref().and_then(|c| c.first()) else {
        return Err(Status::unauthenticated(format!(
            "{}: no client certificate",
            method(path)
        )));
    };
    let id = Identity::from_cert(leaf)
        .map_err(|e| Status::permission_denied(format!("{}: {e}", method(path))))?;
    if id.role == Role::Engine && id.system != policy.system {
        return Err(Status::permission_denied(format!(
            "{}: {id} is an engine of system {:?}, this is system {:?}",
            method(path),
            id.system,
            policy.system
        )));
    }
    if !allowed(id.role, path) {
        return Err(Status::permission_denied(format!(
            "{}: not allowed to role {} ({id})",
            method(path),
            id.role
        )));
    }
    Ok(Caller(Some(id)))
}

/// A Join is for the rank and system of the caller's certificate: an engine
/// may register and heartbeat only as itself (an admin may speak for any).
pub fn check_join(caller: Option<&Caller>, j: &JoinReq) -> Result<(), Status> {
    let Some(Caller(Some(id))) = caller else {
        return Ok(());
    };
    match id.role {
        Role::Admin => Ok(()),
        Role::Engine if id.system != j.system => Err(Status::permission_denied(format!(
            "join as rank {} of system {:?}: the certificate {id} is for system {:?}",
            j.rank, j.system, id.system
        ))),
        Role::Engine if id.rank() != Some(j.rank) => Err(Status::permission_denied(format!(
            "join as rank {} of system {:?}: the certificate {id} is for rank {}",
            j.rank, j.system, id.name
        ))),
        Role::Engine => Ok(()),
        Role::Client => Err(Status::permission_denied(format!(
            "Join: not allowed to role client ({id})"
        ))),
    }
}

/// A gRPC service whose calls are authorized by [`caller_of`] first.
#[derive(Clone)]
pub struct Authorized<S> {
    inner: S,
    policy: Arc<Policy>,
}

impl<S> Authorized<S> {
    pub fn new(inner: S, policy: &Arc<Policy>) -> Self {
        Authorized {
            inner,
            policy: policy.clone(),
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Authorized<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<http::Request<B>> for Authorized<S>
where
    S: tonic::codegen::Service<
        http::Request<B>,
        Response = http::Response<tonic::body::BoxBody>,
        Error = std::convert::Infallible,
    >,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        match caller_of(&req, &self.policy) {
            Ok(c) => {
                req.extensions_mut().insert(c);
                Box::pin(self.inner.call(req))
            }
            Err(st) => {
                if st.code() == tonic::Code::PermissionDenied {
                    tracing::warn!("control call refused: {}", st.message());
                }
                Box::pin(std::future::ready(Ok(st.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_reach_what_the_table_says() {
        let p = |m: &str| format!("{MGMT}{m}");
        let e = |m: &str| format!("{ENGINE}{m}");
        for m in [
            "PoolCreate",
            "PoolDestroy",
            "StorageFormat",
            "ContCreate",
            "Join",
        ] {
            assert!(!allowed(Role::Client, &p(m)), "client may {m}");
            assert!(allowed(Role::Admin, &p(m)), "admin may not {m}");
        }
        for m in ["PoolConnect", "ContQuery", "PoolQuery", "SystemQuery"] {
            assert!(allowed(Role::Client, &p(m)), "client may not {m}");
        }
        assert!(allowed(Role::Engine, &p("Join")));
        assert!(allowed(Role::Engine, &e("LocalFormat")));
        assert!(!allowed(Role::Client, &e("LocalFormat")));
        assert!(!allowed(Role::Engine, &p("PoolDestroy")));
        assert!(!allowed(Role::Engine, &p("StorageFormat")));
        // A prefix of a method is not the method.
        assert!(!allowed(Role::Client, &p("PoolConnectX")));
        assert!(!allowed(Role::Client, "/other.Svc/PoolConnect"));
    }

    #[test]
    fn an_engine_joins_only_as_itself() {
        let me = Caller(Some(Identity::new("tank", Role::Engine, "1")));
        let j = |rank, system: &str| JoinReq {
            rank,
            system: system.into(),
            ..Default::default()
        };
        assert!(check_join(Some(&me), &j(1, "tank")).is_ok());
        let e = check_join(Some(&me), &j(0, "tank")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("rank 0") && e.message().contains("rank 1"),
            "{e}"
        );
        let e = check_join(Some(&me), &j(1, "other")).unwrap_err();
        assert!(
            e.message().contains("\"other\"") && e.message().contains("\"tank\""),
            "{e}"
        );
        let admin = Caller(Some(Identity::new("tank", Role::Admin, "admin")));
        assert!(check_join(Some(&admin), &j(5, "tank")).is_ok());
        assert!(check_join(Some(&Caller(None)), &j(5, "tank")).is_ok());
    }
}
