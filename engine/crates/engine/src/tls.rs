//! The control plane's mutual TLS on the engine (docs/tls.md): the control
//! service's TLS configuration, and the connector of the engine's own gRPC
//! clients (joins and heartbeats to the management service, the service's
//! calls to the ranks), which present the engine's certificate.

use crate::config::Config;
use peregrine::tls::{Connector, Identity, Role, TlsFiles};
use std::sync::OnceLock;
use tonic::transport::{Certificate, ServerTlsConfig};
use tonic::Status;

/// What the control service serves with.
pub struct ControlTls {
    /// None: insecure (`allow_insecure: true`).
    pub server: Option<ServerTlsConfig>,
    /// This engine's identity (TLS only).
    pub identity: Option<Identity>,
}

/// The identity an engine's certificate must carry.
pub fn engine_identity(cfg: &Config) -> Identity {
    Identity::new(&cfg.name, Role::Engine, &cfg.rank.to_string())
}

/// Read `tls_dir` (or note the insecure choice), check that the certificate
/// is this engine's (its system and rank), and make the connector of the
/// engine's own clients. Every error names `tls_dir` and the file.
pub fn load(cfg: &Config) -> Result<ControlTls, String> {
    let connector = cfg
        .security()
        .connector()
        .map_err(|e| format!("tls_dir: {e}"))?;
    let _ = CONNECTOR.set(connector);
    let _ = SECURITY.set(cfg.security());
    let Some(dir) = &cfg.tls_dir else {
        return Ok(ControlTls {
            server: None,
            identity: None,
        });
    };
    let files = TlsFiles::load(dir).map_err(|e| format!("tls_dir: {e}"))?;
    let want = engine_identity(cfg);
    if files.identity != want {
        return Err(format!(
            "tls_dir: {} is the certificate of {}, this engine is {want} (name {:?}, rank {})",
            dir.join(peregrine::tls::CERT_FILE).display(),
            files.identity,
            cfg.name,
            cfg.rank
        ));
    }
    // tonic's server side builds its rustls configuration with the
    // process's default provider: make it ring, as the clients use.
    peregrine::tls::provider();
    let server = ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            &files.cert_pem,
            &files.key_pem,
        ))
        .client_ca_root(Certificate::from_pem(&files.ca_pem));
    Ok(ControlTls {
        server: Some(server),
        identity: Some(want),
    })
}

/// The connector [`load`] made, for the engine's own gRPC clients.
static CONNECTOR: OnceLock<Connector> = OnceLock::new();

/// The engine's connector; an error if [`load`] has not run (a service
/// wired without it must not fall back to plain connections).
pub fn connector() -> Result<&'static Connector, Status> {
    CONNECTOR
        .get()
        .ok_or_else(|| Status::internal("control-plane security not loaded (tls::load)"))
}

/// The engine's [`peregrine::Security`], for its client-library users that
/// are not handed the configuration (DTX resolution).
static SECURITY: OnceLock<peregrine::Security> = OnceLock::new();

pub fn security() -> Result<peregrine::Security, String> {
    SECURITY
        .get()
        .cloned()
        .ok_or_else(|| "control-plane security not loaded (tls::load)".to_string())
}

/// The loud warning of an insecure control plane, logged at start.
pub fn insecure_warning(cfg: &Config) -> String {
    format!(
        "insecure: control plane without TLS (allow_insecure: true): anyone who reaches {} \
         can format storage, destroy pools and join as any rank, and claim any user; \
         data-plane access checks are {}; set tls_dir for production",
        cfg.control_addr(),
        if cfg.access_checks() {
            "on"
        } else {
            "off (access_checks: true turns them on)"
        }
    )
}

/// A client of the engine's own (reintegration, clones, transaction
/// recovery): it acts for no user, so its engine certificate (or, on an
/// insecure system, its naming none) gets it pool-wide handles.
pub fn own_client(
    mgmt: &str,
    security: &peregrine::Security,
) -> peregrine::Result<peregrine::Client> {
    let c =
        peregrine::Client::connect_with_transport(mgmt, security, peregrine::TransportKind::Tcp)?;
    c.mgmt().set_credential(None);
    Ok(c)
}
