//! The control plane's mutual TLS (docs/tls.md): the certificate directory
//! (`ca.crt`, `tls.crt`, `tls.key`, as a Kubernetes `kubernetes.io/tls`
//! Secret plus `ca.crt`), the identity a certificate carries in its URI SAN
//! (`peregrine://<system>/<role>/<name>`), and the client side of the
//! connection: the engine's chain is checked against `ca.crt` for the name
//! [`SERVER_NAME`], and its URI SAN must be an `engine` of our own system.
//!
//! The library never looks at the environment for this: callers pass a
//! [`Security`]. Only the edges (the CLI, the FUSE daemon, the C ABI) turn
//! flags or `PEREGRINE_TLS_DIR` / `PEREGRINE_INSECURE` into one, through
//! [`Security::from_flags`] and [`Security::from_env`].

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::transport::{Channel, Endpoint, Uri};

/// The TLS server name every engine certificate carries (DNS SAN) and every
/// client asks for, whatever address it dialled: engines are reached by IP,
/// pod DNS names and service names alike, and one name keeps all of them valid.
pub const SERVER_NAME: &str = "peregrine-engine";
/// The scheme of the identity URI SAN.
pub const URI_SCHEME: &str = "peregrine://";
/// The CA certificates (PEM; several during a rotation, any is trusted).
pub const CA_FILE: &str = "ca.crt";
/// This side's certificate (PEM leaf, optionally followed by intermediates).
pub const CERT_FILE: &str = "tls.crt";
/// This side's private key (PEM: PKCS#8, SEC1 or PKCS#1).
pub const KEY_FILE: &str = "tls.key";
/// The environment variables the edges read (never the library itself).
pub const ENV_TLS_DIR: &str = "PEREGRINE_TLS_DIR";
pub const ENV_INSECURE: &str = "PEREGRINE_INSECURE";

/// How a client reaches the control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Security {
    /// Mutual TLS with the certificate directory `dir`.
    Tls { dir: PathBuf },
    /// Plain HTTP/2: only against engines started with `allow_insecure: true`.
    Insecure,
}

impl Security {
    pub fn tls(dir: impl Into<PathBuf>) -> Security {
        Security::Tls { dir: dir.into() }
    }

    /// From an edge's flags (`--tls-dir DIR`, `--insecure`): exactly one of
    /// them, else an error naming both.
    pub fn from_flags(tls_dir: Option<PathBuf>, insecure: bool) -> Result<Security, String> {
        match (tls_dir, insecure) {
            (Some(d), false) => Ok(Security::Tls { dir: d }),
            (None, true) => Ok(Security::Insecure),
            (Some(d), true) => Err(format!(
                "--tls-dir {} and --insecure: give one, not both",
                d.display()
            )),
            (None, false) => Err(format!(
                "the control plane needs --tls-dir DIR (or {ENV_TLS_DIR}: a directory with \
                 {CA_FILE}, {CERT_FILE} and {KEY_FILE}; `peregrine certs` makes them) or \
                 --insecure (or {ENV_INSECURE}=1) for engines started with allow_insecure"
            )),
        }
    }

    /// From `PEREGRINE_TLS_DIR` and `PEREGRINE_INSECURE=1`, for the edges
    /// that take no flags (the C ABI), read once by the caller.
    pub fn from_env() -> Result<Security, String> {
        let dir = std::env::var_os(ENV_TLS_DIR)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        Self::from_flags(dir, env_insecure())
    }

    /// Load the certificates (once per connection set-up; cheap).
    pub fn connector(&self) -> Result<Connector, String> {
        match self {
            Security::Insecure => Ok(Connector { tls: None }),
            Security::Tls { dir } => {
                let files = TlsFiles::load(dir)?;
                Ok(Connector {
                    tls: Some(Arc::new(client_config(&files)?)),
                })
            }
        }
    }
}

/// Whether `PEREGRINE_INSECURE` is set to a true value.
pub fn env_insecure() -> bool {
    std::env::var(ENV_INSECURE)
        .map(|v| matches!(v.trim(), "1" | "true" | "yes"))
        .unwrap_or(false)
}

/// Who a certificate says its holder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// An engine; its name is its rank.
    Engine,
    /// The operator, the CLI, the CSI controller: everything.
    Admin,
    /// The FUSE daemon, the CSI node plugin, library users: mount and I/O.
    Client,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Engine => "engine",
            Role::Admin => "admin",
            Role::Client => "client",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identity of a certificate: `peregrine://<system>/<role>/<name>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub system: String,
    pub role: Role,
    pub name: String,
}

/// A system name as engines accept it (`config::Config::validate`).
pub fn valid_system_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Identity {
    pub fn new(system: &str, role: Role, name: &str) -> Identity {
        Identity {
            system: system.into(),
            role,
            name: name.into(),
        }
    }

    pub fn uri(&self) -> String {
        format!("{URI_SCHEME}{}/{}/{}", self.system, self.role, self.name)
    }

    /// The rank of an engine identity.
    pub fn rank(&self) -> Option<u32> {
        if self.role != Role::Engine {
            return None;
        }
        self.name.parse().ok()
    }

    /// Parse a URI SAN; an error says what is wrong with it.
    pub fn parse(uri: &str) -> Result<Identity, String> {
        let rest = uri
            .strip_prefix(URI_SCHEME)
            .ok_or_else(|| format!("{uri:?} does not start with {URI_SCHEME}"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [system, role, name] = parts[..] else {
            return Err(format!("{uri:?} is not {URI_SCHEME}<system>/<role>/<name>"));
        };
        if !valid_system_name(system) {
            return Err(format!(
                "{uri:?}: system {system:?} must be 1-64 characters of [A-Za-z0-9_-]"
            ));
        }
        let role = match role {
            "engine" => Role::Engine,
            "admin" => Role::Admin,
            "client" => Role::Client,
            r => {
                return Err(format!(
                    "{uri:?}: role {r:?} is not engine, admin or client"
                ))
            }
        };
        if name.is_empty() || name.len() > 128 || name.chars().any(|c| c.is_control()) {
            return Err(format!(
                "{uri:?}: name {name:?} is empty, long or not printable"
            ));
        }
        // The rank in canonical decimal: "01" would be another name of rank 1.
        if role == Role::Engine && name.parse::<u32>().map(|r| r.to_string()) != Ok(name.into()) {
            return Err(format!(
                "{uri:?}: an engine's name must be its rank in decimal"
            ));
        }
        Ok(Identity::new(system, role, name))
    }

    /// The identity of a certificate (DER): its one `peregrine://` URI SAN.
    pub fn from_cert(der: &[u8]) -> Result<Identity, String> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("not an X.509 certificate: {e}"))?;
        let subject = cert.subject().to_string();
        let san = cert
            .subject_alternative_name()
            .map_err(|e| format!("certificate {subject:?}: bad subject alternative names: {e}"))?;
        let uris: Vec<&str> = san
            .iter()
            .flat_map(|s| s.value.general_names.iter())
            .filter_map(|n| match n {
                GeneralName::URI(u) if u.starts_with(URI_SCHEME) => Some(*u),
                _ => None,
            })
            .collect();
        match uris[..] {
            [one] => Identity::parse(one).map_err(|e| format!("certificate {subject:?}: {e}")),
            [] => Err(format!(
                "certificate {subject:?} has no URI SAN {URI_SCHEME}<system>/<role>/<name>"
            )),
            _ => Err(format!(
                "certificate {subject:?} has {} {URI_SCHEME} URI SANs, one expected",
                uris.len()
            )),
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.uri())
    }
}

/// A certificate directory, read and checked.
pub struct TlsFiles {
    pub dir: PathBuf,
    /// `ca.crt` as read (PEM), and its certificates.
    pub ca_pem: Vec<u8>,
    pub ca: Vec<CertificateDer<'static>>,
    /// `tls.crt` as read (PEM), and its chain (leaf first).
    pub cert_pem: Vec<u8>,
    pub chain: Vec<CertificateDer<'static>>,
    /// `tls.key` as read (PEM), and the key.
    pub key_pem: Vec<u8>,
    pub key: PrivateKeyDer<'static>,
    /// The identity of the leaf.
    pub identity: Identity,
}

impl TlsFiles {
    /// Read `dir`/{ca.crt,tls.crt,tls.key}; every error names the file.
    pub fn load(dir: &Path) -> Result<TlsFiles, String> {
        let read = |name: &str| {
            let p = dir.join(name);
            std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))
        };
        let certs = |name: &str, pem: &[u8]| {
            let p = dir.join(name);
            let v = rustls_pemfile::certs(&mut &pem[..])
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{}: {e}", p.display()))?;
            if v.is_empty() {
                return Err(format!("{}: no PEM certificate in it", p.display()));
            }
            Ok(v)
        };
        let ca_pem = read(CA_FILE)?;
        let ca = certs(CA_FILE, &ca_pem)?;
        let cert_pem = read(CERT_FILE)?;
        let chain = certs(CERT_FILE, &cert_pem)?;
        let key_pem = read(KEY_FILE)?;
        let key_path = dir.join(KEY_FILE);
        let key = rustls_pemfile::private_key(&mut &key_pem[..])
            .map_err(|e| format!("{}: {e}", key_path.display()))?
            .ok_or_else(|| {
                format!(
                    "{}: no PEM private key (PKCS#8, SEC1 or PKCS#1) in it",
                    key_path.display()
                )
            })?;
        let identity = Identity::from_cert(&chain[0])
            .map_err(|e| format!("{}: {e}", dir.join(CERT_FILE).display()))?;
        // The key must be the leaf's: otherwise every handshake fails later
        // with a message that names neither file.
        let provider = rustls::crypto::ring::default_provider();
        let signing = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| format!("{}: {e}", key_path.display()))?;
        if let Some(spki) = signing.public_key() {
            let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0])
                .map_err(|e| format!("{}: {e}", dir.join(CERT_FILE).display()))?;
            if leaf.public_key().raw != &spki[..] {
                return Err(format!(
                    "{} is not the key of {} ({identity})",
                    key_path.display(),
                    dir.join(CERT_FILE).display()
                ));
            }
        }
        Ok(TlsFiles {
            dir: dir.to_path_buf(),
            ca_pem,
            ca,
            cert_pem,
            chain,
            key_pem,
            key,
            identity,
        })
    }

    /// The trust anchors of `ca.crt`.
    pub fn roots(&self) -> Result<rustls::RootCertStore, String> {
        let mut roots = rustls::RootCertStore::empty();
        for c in &self.ca {
            roots
                .add(c.clone())
                .map_err(|e| format!("{}: {e}", self.dir.join(CA_FILE).display()))?;
        }
        Ok(roots)
    }
}

/// The ring provider, also made the process default, which tonic's server
/// side uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let p = rustls::crypto::ring::default_provider();
    let _ = p.clone().install_default();
    Arc::new(p)
}

/// The rustls client configuration of a certificate directory.
pub fn client_config(files: &TlsFiles) -> Result<rustls::ClientConfig, String> {
    let provider = provider();
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(files.roots()?),
        provider.clone(),
    )
    .build()
    .map_err(|e| format!("{}: {e}", files.dir.join(CA_FILE).display()))?;
    let verifier = EngineVerifier {
        inner,
        system: files.identity.system.clone(),
    };
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(files.chain.clone(), files.key.clone_key())
        .map_err(|e| format!("{}: {e}", files.dir.join(KEY_FILE).display()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// The usual chain check, then: the leaf is an engine of our system. Any CA
/// cert in `ca.crt` may have issued it.
#[derive(Debug)]
struct EngineVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    system: String,
}

impl ServerCertVerifier for EngineVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)?;
        let id = Identity::from_cert(end_entity)
            .map_err(|e| rustls::Error::General(format!("engine certificate: {e}")))?;
        if id.role != Role::Engine || id.system != self.system {
            return Err(rustls::Error::General(format!(
                "the server's certificate is {id}, not an engine of system {:?}",
                self.system
            )));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A loaded [`Security`]: connects gRPC channels to engines.
#[derive(Clone)]
pub struct Connector {
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Connector {
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Connect `ep` (an `http://host:port` endpoint): over TLS, the
    /// endpoint's URI only says where; the handshake is ours.
    pub async fn connect(&self, ep: Endpoint) -> Result<Channel, tonic::transport::Error> {
        match &self.tls {
            None => ep.connect().await,
            Some(cfg) => ep.connect_with_connector(TlsConnect(cfg.clone())).await,
        }
    }

    /// As [`Connector::connect`], connecting at the first call.
    pub fn connect_lazy(&self, ep: Endpoint) -> Channel {
        match &self.tls {
            None => ep.connect_lazy(),
            Some(cfg) => ep.connect_with_connector_lazy(TlsConnect(cfg.clone())),
        }
    }
}

/// TCP then the TLS handshake to [`SERVER_NAME`].
#[derive(Clone)]
struct TlsConnect(Arc<rustls::ClientConfig>);

type TlsIo = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

impl tonic::codegen::Service<Uri> for TlsConnect {
    type Response = TlsIo;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<TlsIo>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let cfg = self.0.clone();
        Box::pin(async move {
            let bad =
                |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, m.to_string());
            let host = uri.host().ok_or_else(|| bad("no host in the address"))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri
                .port_u16()
                .unwrap_or(peregrine_proto::DEFAULT_CONTROL_PORT);
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let name = ServerName::try_from(SERVER_NAME)
                .map_err(|e| bad(&e.to_string()))?
                .to_owned();
            let tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_parse_and_print() {
        let id = Identity::parse("peregrine://tank/engine/3").unwrap();
        assert_eq!(id, Identity::new("tank", Role::Engine, "3"));
        assert_eq!(id.rank(), Some(3));
        assert_eq!(id.uri(), "peregrine://tank/engine/3");
        assert_eq!(
            Identity::parse("peregrine://t/client/fuse-a").unwrap().role,
            Role::Client
        );
        for bad in [
            "https://tank/engine/3",
            "peregrine://tank/engine",
            "peregrine://tank/engine/03",
            "peregrine://tank/engine/x",
            "peregrine:///admin/x",
            "peregrine://tank/root/x",
            "peregrine://tank/admin/",
            "peregrine://tank/admin/a/b",
        ] {
            assert!(Identity::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn flags_need_exactly_one_choice() {
        assert_eq!(
            Security::from_flags(Some("/d".into()), false).unwrap(),
            Security::tls("/d")
        );
        assert_eq!(
            Security::from_flags(None, true).unwrap(),
            Security::Insecure
        );
        let e = Security::from_flags(None, false).unwrap_err();
        assert!(e.contains("--tls-dir") && e.contains("--insecure"), "{e}");
        let e = Security::from_flags(Some("/d".into()), true).unwrap_err();
        assert!(e.contains("--tls-dir") && e.contains("--insecure"), "{e}");
    }

    #[test]
    fn missing_files_are_named() {
        let d = tempfile::tempdir().unwrap();
        let e = TlsFiles::load(d.path()).err().unwrap();
        assert!(e.contains("ca.crt"), "{e}");
        std::fs::write(d.path().join(CA_FILE), "nothing").unwrap();
        let e = TlsFiles::load(d.path()).err().unwrap();
        assert!(e.contains("ca.crt") && e.contains("no PEM"), "{e}");
    }
}
